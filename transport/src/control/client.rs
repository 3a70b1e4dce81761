//! The client side: a [`Connection`] to the daemon (used by the views too), and the device
//! client that [`crate::Device::open`] attaches when the daemon runs.
//!
//! # What a device does with the daemon
//!
//! [`attach`] is called by `Device::open` for a `udp` device on port 4791 unless
//! [`crate::DeviceConfig::exclusive`] or `ROCECTL_EXCLUSIVE=1` asks for the in-process
//! exclusive mode. When the daemon's socket (`ROCECTL_DAEMON_SOCKET`, else
//! `/run/rocectl/rocectl.sock`) exists, the device connects, says hello, and, if the daemon
//! serves the device's address, allocates its QPN range: every QPN the device hands out is
//! then inside that range ([`crate::ids`]), so the kernel (or the daemon) can steer each
//! datagram to its process by destination QPN. A socket that exists but does not answer is an
//! error naming the path, not a silent fallback: two processes believing they own the address
//! would lose each other's packets.
//!
//! The connection stays open for the device's life: the daemon learns that the process died
//! when the kernel closes it (EOF), and quarantines the range. Objects are reserved with the
//! daemon before they are created ([`Reservation`]), so the per-uid and per-client limits
//! refuse a creation with [`crate::VerbsError::DaemonRefused`]; a thread pushes a snapshot of
//! the QPs and counters every half second for `rocectl res show` and `rocectl stat`.
//!
//! The daemon is never on the per-work-request path: a control round trip (tens of µs) only
//! bounds how fast objects are created.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::proto::{
    ControlError, Hello, Lease, Objects, QpView, Reply, Report, Request, Role, Welcome,
};
use super::sys::{read_frame, write_frame};
use crate::counters::Counters;
use crate::datapath::demux::{Demux, DemuxGroup, SlotLayout};
use crate::datapath::fwdring::{RingDatapath, RingFds};
use crate::datapath::udp::UdpOptions;
use crate::device::{Backend, Device, DeviceShared};
use crate::error::{OpenError, VerbsError};
use crate::sys::lock;

/// The daemon's socket when `ROCECTL_DAEMON_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/run/rocectl/rocectl.sock";
/// The environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "ROCECTL_DAEMON_SOCKET";
/// The environment variable that forces the in-process exclusive mode (`1`, `true`, `yes`).
pub const EXCLUSIVE_ENV: &str = "ROCECTL_EXCLUSIVE";
/// How long a client waits for one reply before giving the daemon up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a device pushes its snapshot.
const REPORT_EVERY: Duration = Duration::from_millis(500);
/// How often a device tries to resume a lost connection (the daemon restarted).
const RESUME_EVERY: Duration = Duration::from_secs(1);

/// The daemon's socket path: `ROCECTL_DAEMON_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    match std::env::var_os(SOCKET_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_SOCKET),
    }
}

/// Whether `ROCECTL_EXCLUSIVE` forces the in-process exclusive mode.
pub fn exclusive_forced() -> bool {
    std::env::var(EXCLUSIVE_ENV).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Why talking to the daemon failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot reach the rocectl daemon at {}: {source} (is `rocectl daemon` running? ROCECTL_EXCLUSIVE=1 opens the device without it)", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The connection failed after it was made (the daemon stopped, or did not answer within
    /// 5 s).
    #[error("rocectl daemon at {}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The daemon closed the connection.
    #[error("the rocectl daemon at {} closed the connection", path.display())]
    Closed {
        /// The socket path.
        path: PathBuf,
    },
    /// The daemon answered something this request does not expect.
    #[error("rocectl daemon at {}: unexpected reply {reply}", path.display())]
    Protocol {
        /// The socket path.
        path: PathBuf,
        /// The reply, in its wire form.
        reply: String,
    },
    /// The daemon refused the request.
    #[error("the rocectl daemon refused: {0}")]
    Refused(#[from] ControlError),
}

/// A connection to the daemon after a successful hello.
#[derive(Debug)]
pub struct Connection {
    sock: UnixStream,
    path: PathBuf,
    welcome: Welcome,
}

impl Connection {
    /// Connects to the socket at `path` and says `hello`.
    ///
    /// # Errors
    /// [`ClientError::Connect`]: nobody listens; [`ClientError::Refused`] with
    /// [`ControlError::VersionMismatch`]: the daemon speaks another major version.
    pub fn connect(path: &Path, hello: Hello) -> Result<Self, ClientError> {
        let sock = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let io = |source| ClientError::Io {
            path: path.to_path_buf(),
            source,
        };
        sock.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        sock.set_write_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        let mut conn = Self {
            sock,
            path: path.to_path_buf(),
            welcome: Welcome {
                major: 0,
                minor: 0,
                software: String::new(),
                address: IpAddr::from([0, 0, 0, 0]),
                mode: super::Mode::KernelDemux,
                qpn_range_size: 0,
            },
        };
        match conn.call(&Request::Hello(hello))? {
            Reply::Welcome(w) => {
                conn.welcome = w;
                Ok(conn)
            }
            other => Err(conn.unexpected(&other)),
        }
    }

    /// The daemon's answer to the hello.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `req` and waits for its reply; a [`Reply::Error`] becomes
    /// [`ClientError::Refused`].
    ///
    /// # Errors
    /// The connection failed, or the daemon refused.
    pub fn call(&mut self, req: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(req).map(|(r, _)| r)
    }

    /// As [`Self::call`], also returning the descriptors that came with the reply.
    ///
    /// # Errors
    /// As [`Self::call`].
    pub fn call_with_fds(&mut self, req: &Request) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        self.call_passing(req, &[])
    }

    /// As [`Self::call_with_fds`], passing `fds` with the request (`SCM_RIGHTS`).
    ///
    /// # Errors
    /// As [`Self::call`].
    pub fn call_passing(
        &mut self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        let io = |source| ClientError::Io {
            path: self.path.clone(),
            source,
        };
        write_frame(&mut self.sock, req, fds).map_err(io)?;
        match read_frame::<Reply>(&mut self.sock).map_err(io)? {
            None => Err(ClientError::Closed {
                path: self.path.clone(),
            }),
            Some((Reply::Error(e), _)) => Err(ClientError::Refused(e)),
            Some(r) => Ok(r),
        }
    }

    /// The error for a reply of the wrong kind.
    pub fn unexpected(&self, reply: &Reply) -> ClientError {
        ClientError::Protocol {
            path: self.path.clone(),
            reply: serde_json::to_string(reply).unwrap_or_else(|_| format!("{reply:?}")),
        }
    }
}

/// A device's link to the daemon: its connection (held for the device's life), its QPN range
/// and what it has reserved.
#[derive(Debug)]
pub(crate) struct DaemonClient {
    conn: Mutex<Option<Connection>>,
    path: PathBuf,
    lease: Lease,
    pds: AtomicU32,
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// The address the device serves (a restarted daemon must serve it too).
    local: IpAddr,
    /// The device name.
    device: String,
    /// Kernel demux: the device's member socket (a duplicate), which proves its slot to a
    /// restarted daemon ([`Request::Resume`]).
    member: std::sync::OnceLock<OwnedFd>,
    /// What the device holds (reserved and not released), claimed again on a resume.
    held: Mutex<Objects>,
    /// When a lost connection was last tried again.
    last_resume: Mutex<Option<Instant>>,
}

impl Drop for DaemonClient {
    fn drop(&mut self) {
        let (flag, cond) = &*self.stop;
        *lock(flag) = true;
        cond.notify_all();
        // Dropping the connection tells the daemon (EOF) to reap the range.
    }
}

impl DaemonClient {
    /// The QPN range.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Keeps (a duplicate of) the device's kernel-demux member socket, for [`Self::resume`].
    pub(crate) fn set_member(&self, fd: OwnedFd) {
        let _ = self.member.set(fd);
    }

    /// The daemon went away (restarted): connects again and proves the device's slot with
    /// its member socket, so the views list it again and new reservations work. Only in
    /// kernel-demux mode (in forwarding mode the receive ring died with the old daemon), and
    /// at most once a second.
    fn resume(&self, conn: &mut Option<Connection>) -> bool {
        let Some(member) = self.member.get() else {
            return false;
        };
        {
            let mut last = lock(&self.last_resume);
            if last.is_some_and(|t| t.elapsed() < RESUME_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        let Ok(mut c) = Connection::connect(&self.path, Hello::new(Role::Device)) else {
            return false;
        };
        if c.welcome().address != self.local || c.welcome().qpn_range_size != self.lease.qpn_count {
            return false;
        }
        let req = Request::Resume {
            device: self.device.clone(),
            slot: self.lease.slot,
            objects: *lock(&self.held),
        };
        match c.call_passing(&req, &[member.as_fd()]) {
            Ok((Reply::Lease(l), _)) if l.slot == self.lease.slot => {
                *conn = Some(c);
                true
            }
            _ => false,
        }
    }

    fn call(&self, req: &Request) -> Result<Reply, ClientError> {
        let mut conn = lock(&self.conn);
        if conn.is_none() {
            self.resume(&mut conn);
        }
        let Some(c) = conn.as_mut() else {
            return Err(ClientError::Closed {
                path: self.path.clone(),
            });
        };
        let r = c.call(req);
        if matches!(r, Err(ClientError::Io { .. } | ClientError::Closed { .. })) {
            // The daemon is gone: the data path keeps working, new reservations fail.
            *conn = None;
        }
        r
    }

    fn reserve(self: &Arc<Self>, objects: Objects) -> Result<Reservation, VerbsError> {
        match self.call(&Request::Reserve(objects)) {
            Ok(_) => {
                let mut held = lock(&self.held);
                *held = held.plus(objects);
                Ok(Reservation {
                    client: self.clone(),
                    objects,
                })
            }
            Err(ClientError::Refused(e)) => Err(VerbsError::DaemonRefused(e)),
            Err(e) => Err(VerbsError::Io(io::Error::other(e.to_string()))),
        }
    }

    /// Starts the thread that pushes the device's snapshot; it ends with the device.
    pub(crate) fn start_reporter(&self, shared: Weak<DeviceShared>) {
        let stop = self.stop.clone();
        let name = format!("{}-report", lock_name(&shared));
        let _ = std::thread::Builder::new()
            .name(name)
            .spawn(move || report_loop(&shared, &stop));
    }
}

fn lock_name(shared: &Weak<DeviceShared>) -> String {
    shared
        .upgrade()
        .map_or_else(|| "rocectl".into(), |s| s.name.clone())
}

fn report_loop(shared: &Weak<DeviceShared>, stop: &(Mutex<bool>, Condvar)) {
    let mut last: Option<(Report, Instant)> = None;
    loop {
        {
            let (flag, cond) = stop;
            let guard = lock(flag);
            let (guard, _) = cond
                .wait_timeout_while(guard, REPORT_EVERY, |s| !*s)
                .unwrap_or_else(|e| e.into_inner());
            if *guard {
                return;
            }
        }
        let Some(s) = shared.upgrade() else { return };
        let report = snapshot(&s);
        let Some(client) = s.daemon.clone() else {
            return;
        };
        drop(s);
        let stale = last
            .as_ref()
            .is_none_or(|(r, at)| *r != report || at.elapsed() >= Duration::from_secs(2));
        if stale {
            // A lost connection is tried again (resumed) by `call`, at most once a second.
            if client.call(&Request::Report(report.clone())).is_err() {
                continue;
            }
            last = Some((report, Instant::now()));
        }
    }
}

/// The device's QPs and counters, for the views.
fn snapshot(s: &DeviceShared) -> Report {
    // Every engine of the device in turn (a daemon client runs one; see `DeviceConfig::engines`).
    let mut qps: Vec<QpView> = Vec::new();
    let mut dev = crate::counters::DeviceCounters::default();
    let mut stats = Vec::new();
    for sh in s.shards.iter() {
        let mut e = lock(&sh.engine);
        e.refresh_rx_drops();
        qps.extend(e.ep.qps.iter().map(|(&qpn, slot)| {
            let attr = slot.qp.attr();
            QpView {
                lqpn: qpn,
                rqpn: attr.dest_qpn.value(),
                qp_type: format!("{:?}", slot.qp.qp_type()).to_uppercase(),
                state: format!("{:?}", slot.qp.state()).to_uppercase(),
                sq_psn: attr.sq_psn.value(),
                rq_psn: attr.rq_psn.value(),
            }
        }));
        dev.add(&e.ep.counters);
        stats.extend(e.ep.qps.values().map(|s| s.qp.stats()));
        stats.extend(e.ep.retired.iter().copied());
    }
    qps.sort_by_key(|q| q.lqpn);
    let counters = Counters::collect(&dev, stats.iter());
    let regions = s.table.regions();
    let mrs = regions
        .iter()
        .take(super::proto::MAX_REPORTED_MRS)
        .map(|r| super::proto::MrView {
            mrn: r.key.index(),
            rkey: r.key.0,
            lkey: r.key.0,
            mrlen: r.len,
            pdn: r.pd.number(),
            iova: r.iova,
        })
        .collect();
    Report {
        device: s.name.clone(),
        qps,
        mrs,
        mrs_total: u32::try_from(regions.len()).unwrap_or(u32::MAX),
        pds: s
            .daemon
            .as_ref()
            .map_or(0, |d| d.pds.load(Ordering::Relaxed)),
        counters: counters.iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    }
}

/// Objects reserved with the daemon, returned when dropped (the object's destruction).
#[derive(Debug)]
pub(crate) struct Reservation {
    client: Arc<DaemonClient>,
    objects: Objects,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        {
            let mut held = lock(&self.client.held);
            *held = held.minus(self.objects);
        }
        // A daemon that is gone has nothing to release: it reaped the client already.
        let _ = self.client.call(&Request::Release(self.objects));
    }
}

/// Connects a device to the daemon when one serves its address (see the module docs);
/// returns the client and the kernel-demux membership the daemon's lease gives
/// ([`datapath_for`]).
///
/// # Errors
/// [`OpenError::Daemon`]: the socket exists but the daemon does not answer, speaks another
/// major version, refuses the range, or passes a demultiplexer this device cannot join.
pub(crate) fn attach(
    backend: &Backend,
    socket: &Option<PathBuf>,
    exclusive: bool,
    device: &str,
) -> Result<(Option<Arc<DaemonClient>>, Leased), OpenError> {
    if exclusive || exclusive_forced() {
        return Ok((None, Leased::Alone));
    }
    let Backend::Udp { local, port } = backend else {
        return Ok((None, Leased::Alone));
    };
    if *port != roce_wire::frame::ROCEV2_PORT {
        return Ok((None, Leased::Alone));
    }
    let path = socket.clone().unwrap_or_else(socket_path);
    if !path.exists() {
        return Ok((None, Leased::Alone));
    }
    let fail = |detail: String| OpenError::Daemon {
        path: path.clone(),
        detail,
    };
    let mut conn =
        Connection::connect(&path, Hello::new(Role::Device)).map_err(|e| fail(e.to_string()))?;
    if conn.welcome().address != *local {
        // The daemon serves another address: this one is the device's alone.
        return Ok((None, Leased::Alone));
    }
    let (reply, fds) = conn
        .call_with_fds(&Request::AllocRange {
            device: device.to_owned(),
        })
        .map_err(|e| fail(e.to_string()))?;
    let Reply::Lease(lease) = reply else {
        return Err(fail(conn.unexpected(&reply).to_string()));
    };
    let leased = datapath_for(&lease, *local, fds).map_err(|e| {
        fail(format!(
            "rocectl daemon at {}: QPN range slot {}: {e}",
            path.display(),
            lease.slot
        ))
    })?;
    let client = DaemonClient {
        conn: Mutex::new(Some(conn)),
        path,
        lease,
        pds: AtomicU32::new(0),
        stop: Arc::new((Mutex::new(false), Condvar::new())),
        local: *local,
        device: device.to_owned(),
        member: std::sync::OnceLock::new(),
        held: Mutex::new(Objects::default()),
        last_resume: Mutex::new(None),
    };
    Ok((Some(Arc::new(client)), leased))
}

/// How a device's data path follows from its lease.
#[derive(Debug)]
pub(crate) enum Leased {
    /// No daemon data path: the device binds its address alone.
    Alone,
    /// Kernel demux: join the group at the lease's slot.
    Demux(Demux),
    /// Forwarding: receive from the daemon's ring, send from an own socket.
    Ring(Box<RingDatapath>),
}

/// The data-path hookup: what a device with `lease` receives from.
///
/// In forwarding mode the daemon passes the client's ring (memory and eventfd): the device
/// receives from it and sends from its own socket on the address.
///
/// In kernel-demux mode the daemon passes the group's map and program (`SCM_RIGHTS`); the
/// device's `udp` socket then binds IP:4791 with `SO_REUSEPORT`, attaches the program and
/// puts itself in the map at the lease's slot, and the kernel steers the lease's QPNs to it.
/// A daemon without a demultiplexer passes nothing, and the device binds the address alone.
///
/// # Errors
/// The descriptors are missing or are not a demux group of the lease's layout.
fn datapath_for(lease: &Lease, local: IpAddr, fds: Vec<OwnedFd>) -> Result<Leased, String> {
    let mut fds = fds.into_iter();
    if lease.ring_fds {
        let (Some(memory), Some(event)) = (fds.next(), fds.next()) else {
            return Err("the lease came without the forwarding ring's descriptors".into());
        };
        let addr = std::net::SocketAddr::new(local, roce_wire::frame::ROCEV2_PORT);
        let dp = RingDatapath::open(RingFds { memory, event }, addr, UdpOptions::default())
            .map_err(|e| format!("forwarding ring: {e}"))?;
        return Ok(Leased::Ring(Box::new(dp)));
    }
    if !lease.demux_fds {
        return Ok(Leased::Alone);
    }
    let (Some(map), Some(prog)) = (fds.next(), fds.next()) else {
        return Err("the lease came without the demultiplexer's descriptors".into());
    };
    let shift = lease.qpn_count.trailing_zeros() as u8;
    let layout = SlotLayout::new(shift).map_err(|e| e.to_string())?;
    let group = DemuxGroup::from_fds(map, prog, layout).map_err(|e| e.to_string())?;
    Demux::new(group, lease.slot)
        .map(Leased::Demux)
        .map_err(|e| e.to_string())
}

impl Device {
    /// Reserves `objects` with the daemon before creating them; `None` without a daemon.
    ///
    /// # Errors
    /// [`VerbsError::DaemonRefused`]: a limit; [`VerbsError::Io`]: the daemon is gone.
    pub(crate) fn reserve(&self, objects: Objects) -> Result<Option<Reservation>, VerbsError> {
        match &self.shared().daemon {
            Some(d) => d.reserve(objects).map(Some),
            None => Ok(None),
        }
    }

    /// Counts a protection domain created (`+1`) or destroyed (`-1`), for the views.
    pub(crate) fn count_pd(&self, created: bool) {
        if let Some(d) = &self.shared().daemon {
            if created {
                d.pds.fetch_add(1, Ordering::Relaxed);
            } else {
                d.pds.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether the device is attached to the daemon, and its QPN range if so.
    pub fn daemon_lease(&self) -> Option<Lease> {
        self.shared().daemon.as_ref().map(|d| d.lease().clone())
    }
}
