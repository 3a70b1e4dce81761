//! The control socket: one thread per connection, the [`Registry`] behind one mutex (held only
//! for bookkeeping, never across a socket call).
//!
//! A connection's first request must be a hello of our major version. Identity is the
//! kernel's: `SO_PEERCRED` at accept, `/proc/PID/comm`, and a pidfd (`SO_PEERPIDFD`) that
//! tells, when the connection ends, whether the process exited or only closed the socket.
//! When a device connection ends, for whatever reason, its range goes to quarantine and its
//! objects and report disappear from the views: that is the reaping, and it is logged.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roce_transport::control::sys::wait_readable;
use roce_transport::control::sys::{
    peer_cred, peer_pidfd, pidfd_exited, read_frame, write_frame, PeerCred,
};
use roce_transport::control::{
    ClientView, ControlError, Hello, Reply, Request, Welcome, PROTOCOL_MAJOR, PROTOCOL_MINOR,
};
use roce_transport::datapath::demux::DemuxGroup;
use roce_transport::datapath::fwdring::{Forwarder, RingFds, RingProducer};

/// Slots of each client's forwarding ring (4.2 KiB each).
const RING_SLOTS: u32 = 1_024;
use tracing::{debug, info, warn};

use super::registry::{ClientId, Registry};

/// What every connection thread shares.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) registry: Mutex<Registry>,
    pub(crate) welcome: Welcome,
    /// The kernel demultiplexer, whose map and program every lease carries (kernel-demux
    /// mode).
    pub(crate) demux: Option<DemuxGroup>,
    /// The forwarder: the daemon's socket on IP:4791 and every client's ring (forwarding
    /// mode).
    pub(crate) forward: Option<Mutex<Forwarder>>,
    next_id: AtomicU64,
}

/// Descriptors that go with a reply.
enum Extra {
    None,
    /// The demultiplexer's map and program.
    Demux,
    /// A new client's ring.
    Ring(RingFds),
}

impl Server {
    pub(crate) fn new(
        registry: Registry,
        welcome: Welcome,
        demux: Option<DemuxGroup>,
        forward: Option<Forwarder>,
    ) -> Self {
        Self {
            registry: Mutex::new(registry),
            welcome,
            demux,
            forward: forward.map(Mutex::new),
            next_id: AtomicU64::new(1),
        }
    }

    fn forwarder(&self) -> Option<MutexGuard<'_, Forwarder>> {
        self.forward
            .as_ref()
            .map(|f| f.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The forwarding loop: wait for datagrams on the shared socket, copy each batch into the
    /// owners' rings (one wake-up per ring per batch).
    fn forward_loop(&self) {
        let Some(fd) = self.forwarder().and_then(|f| f.readiness_fd()) else {
            return;
        };
        loop {
            wait_readable(fd, Duration::from_millis(100));
            let r = self.forwarder().map(|mut f| f.poll());
            if let Some(Err(e)) = r {
                warn!(error = %e, "forwarding: receive failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts connections until the process ends (the signal thread exits it).
    pub(crate) fn run(self: &Arc<Self>, listener: &UnixListener) {
        if self.forward.is_some() {
            let fwd = self.clone();
            let _ = std::thread::Builder::new()
                .name("forward".into())
                .spawn(move || fwd.forward_loop());
        }
        let ticker = self.clone();
        let _ = std::thread::Builder::new()
            .name("quarantine".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                for slot in ticker.registry().expire(Instant::now()) {
                    info!(slot, "QPN range out of quarantine, free again");
                }
                ticker.check_orphans();
            });
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    let id = ClientId(self.next_id.fetch_add(1, Ordering::Relaxed));
                    let server = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("client-{}", id.0))
                        .spawn(move || server.serve(id, stream));
                    if let Err(e) = spawned {
                        warn!(error = %e, "cannot start a connection thread; connection dropped");
                    }
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Moves the orphaned slots whose member is gone to quarantine.
    fn check_orphans(&self) {
        let Some(g) = &self.demux else { return };
        let orphans = self.registry().orphans();
        for slot in orphans {
            if matches!(g.occupant(slot), Ok(None)) {
                self.registry().orphan_gone(slot, Instant::now());
                info!(
                    slot,
                    "the member of an earlier daemon run left its QPN range; quarantined"
                );
            }
        }
    }

    fn serve(&self, id: ClientId, mut stream: UnixStream) {
        let cred = match peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "SO_PEERCRED failed; connection dropped");
                return;
            }
        };
        let pidfd = peer_pidfd(&stream).ok();
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", cred.pid))
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_else(|_| "?".into());
        let Some(hello) = self.hello(&mut stream, cred, &comm) else {
            return;
        };
        let connected = Instant::now();
        self.registry()
            .connect(id, cred, comm.clone(), hello.role, connected);
        debug!(
            pid = cred.pid, uid = cred.uid, comm = %comm, role = ?hello.role,
            claimed_program = %hello.program, "client connected"
        );
        loop {
            let (req, fds) = match read_frame::<Request>(&mut stream) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    warn!(pid = cred.pid, comm = %comm, error = %e, "bad control message; closing");
                    let _ = write_frame(
                        &mut stream,
                        &Reply::Error(ControlError::BadRequest {
                            reason: e.to_string(),
                        }),
                        &[],
                    );
                    break;
                }
            };
            let (reply, extra) = self.handle(id, cred, &comm, req, fds);
            let fds: Vec<_> = match (&self.demux, &extra) {
                (Some(g), Extra::Demux) => vec![g.map_fd(), g.prog_fd()],
                (_, Extra::Ring(r)) => vec![r.memory.as_fd(), r.event.as_fd()],
                _ => Vec::new(),
            };
            if let Err(e) = write_frame(&mut stream, &reply, &fds) {
                debug!(pid = cred.pid, error = %e, "reply failed");
                break;
            }
        }
        let t = Instant::now();
        let reaped = self.registry().disconnect(id, t);
        if let Some(r) = reaped {
            // A closed socket leaves the map by itself; a live one (the process closed only
            // its control connection) is evicted: the range is no longer its.
            let evicted = self
                .demux
                .as_ref()
                .is_some_and(|g| g.vacate(r.slot).unwrap_or(false));
            if let Some(mut f) = self.forwarder() {
                f.remove(r.slot);
            }
            if evicted {
                warn!(
                    pid = r.pid,
                    slot = r.slot,
                    "evicted a socket that outlived its control connection"
                );
            }
            let exited = pidfd
                .as_ref()
                .map(|p| pidfd_exited(p.as_fd(), Duration::from_millis(200)));
            let why = match exited {
                Some(true) => "process exited",
                Some(false) => "connection closed, process alive",
                None => "connection closed",
            };
            info!(
                pid = r.pid, uid = r.uid, comm = %r.comm, slot = r.slot,
                qps = r.objects.qps, cqs = r.objects.cqs, mrs = r.objects.mrs,
                connected_ms = t.duration_since(connected).as_millis() as u64,
                reap_us = t.elapsed().as_micros() as u64,
                quarantine_ms = r.quarantined_until.duration_since(t).as_millis() as u64,
                "client reaped ({why}); its QPN range is quarantined"
            );
        }
    }

    /// Reads and answers the hello; `None` when the connection must end.
    fn hello(&self, stream: &mut UnixStream, cred: PeerCred, comm: &str) -> Option<Hello> {
        let refuse = |stream: &mut UnixStream, e: ControlError| {
            warn!(pid = cred.pid, uid = cred.uid, comm = %comm, "refused: {e}");
            let _ = write_frame(stream, &Reply::Error(e), &[]);
            None
        };
        match read_frame::<Request>(stream) {
            Ok(Some((Request::Hello(h), _))) if h.major != PROTOCOL_MAJOR => refuse(
                stream,
                ControlError::VersionMismatch {
                    client_major: h.major,
                    daemon_major: PROTOCOL_MAJOR,
                    daemon_minor: PROTOCOL_MINOR,
                },
            ),
            Ok(Some((Request::Hello(h), _))) => {
                let ok = write_frame(stream, &Reply::Welcome(self.welcome.clone()), &[]);
                ok.is_ok().then_some(h)
            }
            Ok(Some(_)) => refuse(stream, ControlError::NoHello),
            Ok(None) => None,
            Err(e) => refuse(
                stream,
                ControlError::BadRequest {
                    reason: e.to_string(),
                },
            ),
        }
    }

    /// Allocates `id`'s range; slots that come out of quarantine now are logged here too
    /// (else only the ticker logs them), and slots the data path still has a member in are
    /// skipped (orphans of an earlier daemon run).
    fn alloc(
        &self,
        reg: &mut Registry,
        id: ClientId,
        now: Instant,
    ) -> Result<roce_transport::control::Lease, ControlError> {
        for slot in reg.expire(now) {
            info!(slot, "QPN range out of quarantine, free again");
        }
        reg.alloc_range(id, now, &|slot| {
            self.demux
                .as_ref()
                .is_some_and(|g| g.occupant(slot).ok().flatten().is_some())
        })
    }

    /// Answers one request; the flag says whether the demultiplexer's fd goes with it.
    fn handle(
        &self,
        id: ClientId,
        cred: PeerCred,
        comm: &str,
        req: Request,
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> (Reply, Extra) {
        let now = Instant::now();
        let mut reg = self.registry();
        let result = match req {
            Request::Hello(_) => Err(ControlError::BadRequest {
                reason: "a second hello".into(),
            }),
            Request::AllocRange { device } => match self.alloc(&mut reg, id, now) {
                Ok(mut lease) => {
                    lease.demux_fds = self.demux.is_some();
                    let mut extra = if lease.demux_fds {
                        Extra::Demux
                    } else {
                        Extra::None
                    };
                    if let Some(mut f) = self.forwarder() {
                        match RingProducer::create(RING_SLOTS) {
                            Ok((producer, fds)) => {
                                f.add(lease.slot, producer);
                                lease.ring_fds = true;
                                extra = Extra::Ring(fds);
                            }
                            Err(e) => {
                                drop(f);
                                reg.disconnect(id, now);
                                return (
                                    Reply::Error(ControlError::BadRequest {
                                        reason: format!("cannot create the forwarding ring: {e}"),
                                    }),
                                    Extra::None,
                                );
                            }
                        }
                    }
                    info!(
                        pid = cred.pid, uid = cred.uid, comm = %comm, device = %device,
                        slot = lease.slot,
                        qpns = %format!("{:#x}..={:#x}", lease.qpn_base, lease.qpn_base + (lease.qpn_count - 1)),
                        "QPN range allocated"
                    );
                    return (Reply::Lease(lease), extra);
                }
                Err(e) => Err(e),
            },
            Request::Resume {
                device,
                slot,
                objects,
            } => {
                // The claim is proved by the socket itself, never by the client's word.
                let proved = match (&self.demux, fds.first()) {
                    (Some(g), Some(fd)) => g.holds(slot, fd.as_fd()).unwrap_or(false),
                    _ => false,
                };
                if proved {
                    reg.adopt(id, slot, objects).map(|lease| {
                        info!(
                            pid = cred.pid, uid = cred.uid, comm = %comm, device = %device,
                            slot, qps = objects.qps, cqs = objects.cqs, mrs = objects.mrs,
                            "QPN range resumed by its member from an earlier daemon run"
                        );
                        Reply::Lease(lease)
                    })
                } else {
                    Err(ControlError::Forbidden {
                        reason: format!(
                            "the socket passed does not hold QPN range slot {slot} in the kernel demultiplexer"
                        ),
                    })
                }
            }
            Request::Reserve(o) => reg.reserve(id, o).map(|()| Reply::Ok),
            Request::Release(o) => {
                reg.release(id, o);
                Ok(Reply::Ok)
            }
            Request::Report(r) => {
                reg.report(id, r, now);
                Ok(Reply::Ok)
            }
            Request::ResShow => Ok(Reply::Clients {
                clients: redact_for(cred, reg.views(now)),
            }),
            Request::Stat => Ok(Reply::Stats {
                daemon: {
                    let mut st = reg.stats(now);
                    if let Some(f) = self.forwarder() {
                        let fs = f.stats();
                        st.forwarded = fs.forwarded;
                        st.rx_drop_no_owner = fs.no_owner;
                        st.ring_full_drops = fs.ring_full;
                    }
                    st
                },
                clients: redact_for(cred, reg.views(now)),
            }),
            _ => Err(ControlError::NotImplemented {
                what: "this request".into(),
            }),
        };
        drop(reg);
        match result {
            Ok(r) => (r, Extra::None),
            Err(e) => {
                if matches!(
                    e,
                    ControlError::LimitExceeded { .. } | ControlError::Forbidden { .. }
                ) {
                    info!(pid = cred.pid, uid = cred.uid, comm = %comm, "refused: {e}");
                }
                (Reply::Error(e), Extra::None)
            }
        }
    }
}

/// The views as `viewer` may see them: root and each user see everything of their own
/// clients, but the PSNs of another user's QPs are shown as 0. A QPN and its live PSN are
/// what an off-path writer must otherwise guess (24 bits each, ReDMArk); in forwarding mode,
/// where users share the address and trust each other no more than on a NIC, handing them
/// out would let one user inject into another's QPs.
fn redact_for(viewer: PeerCred, mut views: Vec<ClientView>) -> Vec<ClientView> {
    if viewer.uid != 0 {
        for v in views.iter_mut().filter(|v| v.uid != viewer.uid) {
            for q in &mut v.report.qps {
                q.sq_psn = 0;
                q.rq_psn = 0;
            }
        }
    }
    views
}
