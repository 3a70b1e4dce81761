//! Devices: open a backend, run the engine, query attributes.
//!
//! - `config`: how to open a device ([`DeviceConfig`], [`Backend`], [`Progress`]);
//! - `attr`: what a device and its port report;
//! - `thread`: who drives the engine, the lock order and the doorbell's wake protocol (read
//!   its module doc before changing anything that takes a lock);
//! - `wait`: blocking waits that run the engine in the waiting thread.

mod attr;
mod config;
mod thread;
pub(crate) mod wait;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use roce_mr::MrTable;
use roce_qp::verbs::Mtu;
use roce_wire::Gid;

pub use attr::{DeviceAttr, DeviceCapFlagsEx, PortAttr, PortState};
pub use config::{Backend, DeviceConfig, Progress, MAX_ENGINES};

use crate::capture::CaptureFile;
use crate::clock;
use crate::counters::{Counters, DeviceCounters};
use crate::cq::AsyncEvent;
use crate::datapath::Datapath;
use crate::engine::{Engine, PassResult};
use crate::error::OpenError;
use crate::ids::Ids;
use crate::netdev::NetDevice;
use crate::sys::lock;
use thread::{run_thread, DATAPATH, WAKER};

/// One engine of a device ("shard", [`DeviceConfig::engines`]) and what drives it: every QP
/// with `QPN % n == index` lives in its engine.
pub(crate) struct Shard {
    /// The engine lock: see the lock order in `thread.rs`.
    pub(crate) engine: Mutex<Engine>,
    /// Wakes this shard's engine thread (`None` with manual progress).
    waker: Option<Arc<mio::Waker>>,
    /// When this shard's engine thread plans to wake (ns on the engine clock; 0: not
    /// sleeping).
    sleep_until: AtomicU64,
    /// When an application thread last polled an empty CQ and ran a pass of this shard itself
    /// (ns since [`thread::epoch`]; 0: never). While that is recent the engine thread steps
    /// back (see `run_thread`).
    app_polled: AtomicU64,
    /// This shard's engine thread, to unpark it from its step-back (see `run_thread`).
    engine_thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Shard {
    fn new(engine: Engine, waker: Option<Arc<mio::Waker>>) -> Self {
        Self {
            engine: Mutex::new(engine),
            waker,
            sleep_until: AtomicU64::new(0),
            app_polled: AtomicU64::new(0),
            engine_thread: std::sync::OnceLock::new(),
        }
    }
}

pub(crate) struct DeviceShared {
    pub(crate) name: String,
    pub(crate) table: Arc<MrTable>,
    /// The engines, by index; one unless [`DeviceConfig::engines`] asked for more and the
    /// backend can steer.
    pub(crate) shards: Box<[Shard]>,
    /// Why the device runs on one engine although more were asked for.
    engines_fallback: Option<&'static str>,
    stop: AtomicBool,
    pub(crate) progress: Progress,
    pub(crate) mtu: Mtu,
    pub(crate) max_mtu: Mtu,
    pub(crate) gids: Vec<Gid>,
    pub(crate) mac: [u8; 6],
    netdev: Option<String>,
    /// Random source for PSNs and the QPN allocator (see `ids.rs`).
    ids: Mutex<Ids>,
    next_iova: AtomicU64,
    backend: &'static str,
    local: SocketAddr,
    ip_mtu: usize,
    /// Application threads blocked in the datapath, and the engine thread's side of it
    /// (`wait.rs`; only on a device with one engine).
    pub(crate) wait: wait::WaitState,
    /// [`DeviceConfig::engine_spin`].
    pub(crate) engine_spin: Duration,
    /// The link to the rocectl daemon, when it serves this device's address.
    pub(crate) daemon: Option<Arc<crate::control::DaemonClient>>,
    /// With several engines: the name that keeps kernel-demux members off the address while
    /// the device is open (`crate::datapath::shard`).
    _shard_marker: Option<crate::datapath::shard::Marker>,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("local", &self.local)
            .field("mtu", &self.mtu)
            .field("engines", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl DeviceShared {
    /// The shard that owns QP `qpn`.
    pub(crate) fn shard_of(&self, qpn: u32) -> &Shard {
        &self.shards[qpn as usize % self.shards.len()]
    }
}

#[derive(Debug)]
struct DeviceHandle {
    shared: Arc<DeviceShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for sh in self.shared.shards.iter() {
            sh.wake();
        }
        for t in std::mem::take(&mut *lock(&self.threads)) {
            let _ = t.join();
        }
        for sh in self.shared.shards.iter() {
            // Send what application-driven progress deferred (a final ACK).
            let mut e = lock(&sh.engine);
            if e.tx_waiting() {
                e.kick();
            }
        }
        // Every shard writes the same capture file.
        if let Some(c) = &lock(&self.shared.shards[0].engine).capture {
            let _ = lock(&c.0).flush();
        }
    }
}

/// An open RDMA device (`ibv_context`). Cheap to clone; the device closes when the last
/// clone and the last object made from it are gone. `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Device {
    handle: Arc<DeviceHandle>,
}

impl Device {
    /// Opens a `udp` device on GID index `gid_index` of the interface `ifname`: the verbs
    /// habit of naming a device and a GID index. See [`DeviceConfig::interface`], which also
    /// lets you set other options before opening.
    ///
    /// # Errors
    /// As [`DeviceConfig::interface`] and [`Device::open`].
    pub fn open_interface(ifname: &str, gid_index: u8) -> Result<Self, OpenError> {
        Self::open(DeviceConfig::interface(ifname, gid_index)?)
    }

    /// Opens a device.
    ///
    /// # Errors
    /// [`OpenError`]: the backend could not start (address in use, no such interface, no
    /// `CAP_NET_RAW`...), the MTU does not fit the interface, or the capture file cannot be
    /// created.
    pub fn open(config: DeviceConfig) -> Result<Self, OpenError> {
        let clock = match (&config.clock, &config.backend) {
            (Some(c), _) => c.clone(),
            // A device on a simulated network runs on the network's clock.
            (None, Backend::Sim { net, .. }) => net.clock().clone(),
            (None, _) => clock::system(),
        };
        // An explicit demux membership is the caller's own arrangement: no daemon then.
        let (daemon, leased) = crate::control::attach(
            &config.backend,
            &config.daemon_socket,
            config.exclusive || config.demux.is_some(),
            &config.name,
        )?;
        let (backend, demux) = match leased {
            crate::control::Leased::Alone => (config.backend, config.demux),
            crate::control::Leased::Demux(d) => (config.backend, Some(d)),
            crate::control::Leased::Ring(dp) => (Backend::Custom(dp), None),
        };
        let (engines, engines_fallback) = engines_for(config.engines, &backend, &demux, &daemon);
        let sharded = match &backend {
            Backend::Udp { local, port } if engines > 1 => Some((*local, *port)),
            _ => None,
        };
        let (mut dps, shard_marker) = match sharded {
            Some((local, port)) => {
                let (dps, marker) = crate::datapath::shard::open_udp(local, port, engines)?;
                (dps, Some(marker))
            }
            None => (vec![open_backend(backend, demux.as_ref())?], None),
        };
        let caps = dps[0].caps();
        let local = dps[0].local_addr();
        let max_mtu = Mtu::for_netdev_mtu(caps.ip_mtu.min(4096 + 80)).ok_or(
            OpenError::InterfaceMtuTooSmall {
                ip_mtu: caps.ip_mtu,
            },
        )?;
        let mtu = config.mtu.unwrap_or(max_mtu);
        if mtu > max_mtu {
            return Err(OpenError::MtuTooLarge {
                requested: mtu.bytes(),
                ip_mtu: caps.ip_mtu,
                max: max_mtu.bytes(),
            });
        }
        let backend = dps[0].name();
        // The GID table mirrors what rxe builds for the interface that owns our address.
        let netdev: Option<NetDevice> = match backend {
            "udp" | "raw" | "fwd" => crate::netdev::interface_for_addr(local.ip()).ok(),
            _ => None,
        };
        let mac = netdev
            .as_ref()
            .and_then(|n| n.mac)
            .unwrap_or_else(|| crate::endpoint::mac_for(local.ip()));
        let gids: Vec<Gid> = match &netdev {
            Some(n) => n.gid_table().into_iter().map(|e| e.gid).collect(),
            None => vec![Gid::link_local_from_mac(mac), Gid::from_ip(local.ip())],
        };
        let capture = match (
            config.capture,
            config.pcap,
            std::env::var_os("ROCECTL_PCAP"),
        ) {
            (Some(c), _, _) => Some(c),
            (None, Some(p), _) => Some(open_capture(&p, &config.name)?),
            (None, None, Some(p)) if !p.is_empty() => {
                Some(open_capture(&PathBuf::from(p), &config.name)?)
            }
            _ => None,
        };
        // Per shard: its poll and waker (engine thread), its datapath's descriptor.
        let mut polls = Vec::with_capacity(engines);
        let mut wakers = Vec::with_capacity(engines);
        for _ in 0..engines {
            let poll = match config.progress {
                Progress::Thread => Some(mio::Poll::new().map_err(OpenError::Io)?),
                Progress::Manual => None,
            };
            let waker = match &poll {
                Some(p) => Some(Arc::new(
                    mio::Waker::new(p.registry(), WAKER).map_err(OpenError::Io)?,
                )),
                None => None,
            };
            polls.push(poll);
            wakers.push(waker);
        }
        let inboxes: Option<Arc<[crate::inbox::Inbox]>> = (engines > 1).then(|| {
            wakers
                .iter()
                .cloned()
                .map(crate::inbox::Inbox::new)
                .collect()
        });
        let fds: Vec<_> = dps.iter().map(|d| d.readiness_fd()).collect();
        // Kernel demux (one engine): the member socket proves the device's slot to a
        // restarted daemon.
        let member = dps[0].member_socket_fd();
        if let (Some(d), Some(_), Some(raw)) = (&daemon, &demux, member) {
            if let Ok(member) = crate::sys::dup_fd(raw) {
                d.set_member(member);
            }
        }
        let mut ids = Ids::new(config.seed).map_err(OpenError::Io)?;
        let range = config
            .qpn_range
            .clone()
            .or_else(|| demux.as_ref().map(|d| d.qpn_range()))
            .or_else(|| daemon.as_ref().map(|d| d.lease().qpns()));
        if let Some(r) = range {
            ids.restrict(r);
        }
        ids.set_engines(engines);
        let table_seed = ids.next_u64();
        let shards: Box<[Shard]> = dps
            .drain(..)
            .zip(wakers)
            .enumerate()
            .map(|(i, (dp, waker))| {
                let mut engine = Engine::new(dp, max_mtu.bytes(), mac, clock.clone());
                engine.capture = capture.clone();
                engine.route = inboxes.as_ref().map(|all| crate::inbox::Route {
                    me: i,
                    all: all.clone(),
                });
                Shard::new(engine, waker)
            })
            .collect();
        let shared = Arc::new(DeviceShared {
            name: config.name,
            table: Arc::new(MrTable::new(config.max_mr, table_seed)),
            shards,
            engines_fallback,
            stop: AtomicBool::new(false),
            progress: config.progress,
            mtu,
            max_mtu,
            gids,
            mac,
            netdev: netdev.map(|n| n.name),
            ids: Mutex::new(ids),
            next_iova: AtomicU64::new(0x7F00_0000_0000),
            backend,
            local,
            ip_mtu: caps.ip_mtu,
            wait: wait::WaitState::default(),
            engine_spin: config.engine_spin,
            daemon,
            _shard_marker: shard_marker,
        });
        if let Some(d) = &shared.daemon {
            d.start_reporter(Arc::downgrade(&shared));
        }
        // The handle first: should a thread fail to start, dropping it stops the others.
        let dev = Self {
            handle: Arc::new(DeviceHandle {
                shared: shared.clone(),
                threads: Mutex::new(Vec::with_capacity(engines)),
            }),
        };
        for (i, (poll, fd)) in polls.into_iter().zip(fds).enumerate() {
            let Some(poll) = poll else {
                continue;
            };
            if let Some(fd) = fd {
                poll.registry()
                    .register(
                        &mut mio::unix::SourceFd(&fd),
                        DATAPATH,
                        mio::Interest::READABLE,
                    )
                    .map_err(OpenError::Io)?;
            }
            let s = shared.clone();
            let name = if engines == 1 {
                format!("{}-engine", s.name)
            } else {
                format!("{}-engine{i}", s.name)
            };
            let t = std::thread::Builder::new()
                .name(name)
                .spawn(move || run_thread(&s, i, poll, fd.is_some()))
                .map_err(OpenError::Io)?;
            lock(&dev.handle.threads).push(t);
        }
        Ok(dev)
    }

    /// How many engines drive the device ([`DeviceConfig::engines`]).
    pub fn engines(&self) -> usize {
        self.shared().shards.len()
    }

    /// Why the device runs on one engine although [`DeviceConfig::engines`] asked for more
    /// (`None` when it got what it asked for).
    pub fn engines_fallback(&self) -> Option<&'static str> {
        self.shared().engines_fallback
    }

    /// Each engine's device-level counters, by engine index (their sum is
    /// [`Self::device_counters`]).
    pub fn engine_counters(&self) -> Vec<DeviceCounters> {
        self.shared()
            .shards
            .iter()
            .map(|sh| {
                let mut e = lock(&sh.engine);
                e.refresh_rx_drops();
                e.ep.counters
            })
            .collect()
    }

    /// The engine that owns QP `qpn` (`qpn % engines`).
    pub fn engine_of(&self, qpn: roce_wire::Qpn) -> usize {
        qpn.value() as usize % self.engines()
    }

    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.handle.shared
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.shared().name
    }

    /// Local IP address and UDP port.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared().local
    }

    /// Device and QP counters, summed.
    pub fn counters(&self) -> Counters {
        let mut dev = DeviceCounters::default();
        let mut stats = Vec::new();
        for sh in self.shared().shards.iter() {
            let mut e = lock(&sh.engine);
            e.refresh_rx_drops();
            dev.add(&e.ep.counters);
            stats.extend(e.ep.qps.values().map(|s| s.qp.stats()));
            stats.extend(e.ep.retired.iter().copied());
        }
        Counters::collect(&dev, stats.iter())
    }

    /// Device-level counters only (summed over the engines).
    pub fn device_counters(&self) -> DeviceCounters {
        let mut dev = DeviceCounters::default();
        for c in self.engine_counters() {
            dev.add(&c);
        }
        dev
    }

    /// The last error the engine met that no call returned (a send to an unreachable
    /// network, a QP that entered the error state, a capture write failure), if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared().shards.iter().find_map(|sh| {
            let e = lock(&sh.engine);
            e.ep.last_error
                .clone()
                .or_else(|| e.capture.as_ref().and_then(|c| lock(&c.0).error.clone()))
        })
    }

    /// The next asynchronous event (`ibv_get_async_event`), if any.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared().shards.iter().find_map(|sh| {
            let mut e = lock(&sh.engine);
            (!e.ep.events.is_empty()).then(|| e.ep.events.remove(0))
        })
    }

    /// Hands every asynchronous event to `hook` as the engine produces it, instead of keeping
    /// it for [`Self::poll_async_event`]; events already waiting go to `hook` first. A second
    /// call replaces the hook.
    ///
    /// The hook runs under the device's engine lock, on whichever thread made progress (the
    /// engine thread, a poster, a CQ poll): it must be quick and must not call into this
    /// device or drop the last handle of it. Waking a descriptor is its purpose
    /// (`libibverbs`' `async_fd`).
    pub fn set_async_event_hook(&self, hook: impl Fn(AsyncEvent) + Send + 'static) {
        let shards = &self.shared().shards;
        if shards.len() == 1 {
            let mut e = lock(&shards[0].engine);
            for ev in std::mem::take(&mut e.ep.events) {
                hook(ev);
            }
            e.ep.event_hook = Some(crate::endpoint::EventHook(Box::new(hook)));
            return;
        }
        // Several engines share the hook; its mutex is a leaf taken under one engine lock.
        type Hook = Box<dyn Fn(AsyncEvent) + Send>;
        let hook: Arc<Mutex<Hook>> = Arc::new(Mutex::new(Box::new(hook)));
        for sh in shards.iter() {
            let mut e = lock(&sh.engine);
            for ev in std::mem::take(&mut e.ep.events) {
                (lock(&hook))(ev);
            }
            let h = hook.clone();
            e.ep.event_hook = Some(crate::endpoint::EventHook(Box::new(move |ev| {
                (lock(&h))(ev);
            })));
        }
    }

    /// One non-blocking pass of the engine: receive what is waiting, fire due timers, send,
    /// move completions to their CQs. Returns whether anything was received or sent.
    pub fn progress(&self) -> bool {
        let defer = self.shared().progress == Progress::Manual;
        let mut any = false;
        for sh in self.shared().shards.iter() {
            let r = lock(&sh.engine).progress(defer);
            any |= r.received > 0 || r.sent > 0;
        }
        any
    }

    /// The next time the device needs a progress pass without new input (a QP timer, a
    /// delayed packet of a fault injector), on its [`crate::clock::Clock`]; `None` when
    /// nothing is pending. For [`Progress::Manual`] devices driven on a virtual clock.
    pub fn poll_timeout(&self) -> Option<clock::Instant> {
        self.shared()
            .shards
            .iter()
            .filter_map(|sh| lock(&sh.engine).next_deadline())
            .min()
    }

    /// Waits up to `timeout` for packets or a timer (whichever first), then makes progress.
    /// For [`Progress::Manual`] devices; harmless on others.
    pub fn progress_wait(&self, timeout: Duration) -> bool {
        let defer = self.shared().progress == Progress::Manual;
        let mut received = false;
        for sh in self.shared().shards.iter() {
            received |= lock(&sh.engine).progress(defer).received > 0;
        }
        if received {
            return true;
        }
        // Nothing arrived: send what this or an earlier pass deferred before sleeping.
        let mut sleep = Sleep::default();
        for sh in self.shared().shards.iter() {
            sleep.add(before_sleep(&mut lock(&sh.engine)));
        }
        sleep.sleep(timeout);
        self.progress()
    }

    /// [`Self::progress_wait`] for a caller that has just made a pass and found nothing (a
    /// blocking CQ wait whose poll came back empty): sends what that pass deferred, sleeps
    /// until the datapath is readable or the next timer (at most `timeout`), then makes
    /// progress. One receive system call per wait instead of two: the pass `progress_wait`
    /// starts with would find what the caller's pass found a moment ago. `ready` is checked
    /// under the engine lock first (lock order engine → CQ): when another thread's pass has
    /// meanwhile queued what the caller waits for, it returns at once.
    pub(crate) fn wait_after_pass(&self, timeout: Duration, ready: impl Fn() -> bool) {
        let mut sleep = Sleep::default();
        for sh in self.shared().shards.iter() {
            let mut e = lock(&sh.engine);
            if ready() {
                return;
            }
            sleep.add(before_sleep(&mut e));
        }
        sleep.sleep(timeout);
        self.progress();
    }

    /// Flushes the capture file, if any.
    ///
    /// # Errors
    /// The capture's write error.
    pub fn flush_capture(&self) -> io::Result<()> {
        // Every shard writes the same capture file.
        let e = lock(&self.shared().shards[0].engine);
        match &e.capture {
            Some(c) => CaptureFile(c.0.clone()).flush(),
            None => Ok(()),
        }
    }

    /// Locks the engine that owns QP `qpn`.
    pub(crate) fn lock_engine_of(&self, qpn: u32) -> MutexGuard<'_, Engine> {
        lock(&self.shared().shard_of(qpn).engine)
    }

    /// Progress if nobody else is making it right now (CQ polls that found nothing): a pass
    /// of every engine whose lock is free, one at a time.
    pub(crate) fn try_progress(&self, completed: impl Fn() -> bool) {
        let _ = self.try_progress_pass(true, completed);
    }

    /// [`Self::try_progress`], saying what the passes did, summed over the engines (`None`:
    /// another thread held every engine). With `stamp`, the pass counts as an application
    /// poll (`app_polled`: the engine thread steps back for a window).
    pub(crate) fn try_progress_pass(
        &self,
        stamp: bool,
        completed: impl Fn() -> bool,
    ) -> Option<PassResult> {
        let s = self.shared();
        let now = (stamp && s.progress == Progress::Thread).then(thread::since_epoch_ns);
        let mut all: Option<PassResult> = None;
        for sh in s.shards.iter() {
            if let Some(now) = now {
                sh.app_polled.store(now, Ordering::Relaxed);
            }
            if let Some(r) = sh.try_progress_pass(s.progress, &completed) {
                let a = all.get_or_insert_with(PassResult::default);
                a.received += r.received;
                a.sent += r.sent;
                a.more_rx |= r.more_rx;
                a.tx_blocked |= r.tx_blocked;
            }
        }
        all
    }
}

impl Shard {
    /// [`Device::try_progress_pass`] for this shard.
    fn try_progress_pass(
        &self,
        progress: Progress,
        completed: &impl Fn() -> bool,
    ) -> Option<PassResult> {
        let Ok(mut e) = self.engine.try_lock() else {
            return None;
        };
        // A poller's pass defers what it would send (the ACK of a message just received)
        // when the poll is about to return a completion: the application's next post (a
        // ping-pong's reply) carries it in the same batch, one send instead of two, as manual
        // progress does. Otherwise (nothing for this poller: say the ACKs that opened a
        // window) it is sent at once. With manual progress every pass defers (the next pass
        // or post sends).
        let r = e.progress(true);
        if progress != Progress::Thread || !e.tx_waiting() {
            // Manual progress defers until the next pass, whatever the poll finds.
            return Some(r);
        }
        if !completed() {
            e.kick();
            return Some(r);
        }
        {
            // Should the application stop polling now, the engine thread's next pass sends
            // it: make sure that pass comes within one poll window.
            let back = e
                .now()
                .as_nanos()
                .saturating_add(thread::APP_POLL_WINDOW.as_nanos() as u64);
            drop(e);
            let planned = self.sleep_until.load(Ordering::Acquire);
            if planned > back {
                self.wake();
            }
        }
        Some(r)
    }
}

impl Device {
    /// A fresh random QPN, unique among live QPs and not recently used (`None`: every QPN
    /// is live).
    pub(crate) fn alloc_qpn(&self) -> Option<u32> {
        lock(&self.shared().ids).alloc_qpn()
    }

    /// Returns the QPN of a destroyed QP.
    pub(crate) fn free_qpn(&self, qpn: u32) {
        lock(&self.shared().ids).free_qpn(qpn);
    }

    /// A fresh, 4 KiB-aligned IOVA range for `len` bytes.
    pub(crate) fn alloc_iova(&self, len: usize) -> u64 {
        let span = ((len as u64).max(1) + 0xFFF) & !0xFFF;
        self.shared()
            .next_iova
            .fetch_add(span + 0x1000, Ordering::Relaxed)
    }

    /// A random initial PSN (24 bits): from the OS-seeded generator, or from
    /// [`DeviceConfig::seed`] when one was given.
    pub fn random_psn(&self) -> u32 {
        lock(&self.shared().ids).psn()
    }
}

/// How many engines a device opened with `asked` runs, and why fewer when so (see
/// [`DeviceConfig::engines`]).
fn engines_for(
    asked: usize,
    backend: &Backend,
    demux: &Option<crate::datapath::demux::Demux>,
    daemon: &Option<Arc<crate::control::DaemonClient>>,
) -> (usize, Option<&'static str>) {
    let asked = asked.clamp(1, MAX_ENGINES);
    if asked == 1 {
        return (1, None);
    }
    let why = if daemon.is_some() {
        "the rocectl daemon serves this address (open it exclusive to run several engines)"
    } else if demux.is_some() {
        "a kernel-demux member cannot steer its group"
    } else if !matches!(backend, Backend::Udp { .. }) {
        "only the udp backend can steer datagrams to several engines"
    } else {
        return (asked, None);
    };
    (1, Some(why))
}

fn open_capture(path: &std::path::Path, dev: &str) -> Result<CaptureFile, OpenError> {
    let text = path.to_string_lossy().replace("{dev}", dev);
    let capture = CaptureFile::create(&text).map_err(|e| OpenError::Capture {
        path: text,
        source: e,
    })?;
    capture.flush_at_exit();
    Ok(capture)
}

/// Before an application thread sleeps on the engine's behalf: sends what a pass deferred,
/// and says what to sleep on: the datapath's descriptor, and the time to the next QP timer.
fn before_sleep(e: &mut Engine) -> (Option<std::os::fd::RawFd>, Option<Duration>) {
    if e.tx_waiting() {
        e.kick();
    }
    let deadline = e.next_deadline().map(|d| clock::until(e.now(), d));
    (e.datapath().readiness_fd(), deadline)
}

/// What an application thread sleeps on for every engine: their descriptors, the earliest
/// timer.
#[derive(Default)]
struct Sleep {
    fds: Vec<std::os::fd::RawFd>,
    no_fd: bool,
    deadline: Option<Duration>,
}

impl Sleep {
    fn add(&mut self, (fd, deadline): (Option<std::os::fd::RawFd>, Option<Duration>)) {
        match fd {
            Some(fd) => self.fds.push(fd),
            None => self.no_fd = true,
        }
        self.deadline = match (self.deadline, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Sleeps until a descriptor is readable, the deadline or `timeout` (whichever comes
    /// first); when an engine has no descriptor, at most 1 ms.
    fn sleep(&self, timeout: Duration) {
        let mut wait = self.deadline.map_or(timeout, |d| timeout.min(d));
        if self.no_fd || self.fds.is_empty() {
            wait = wait.min(Duration::from_millis(1));
            if self.fds.is_empty() {
                std::thread::sleep(wait);
                return;
            }
        }
        match self.fds[..] {
            [fd] => {
                crate::sys::wait_readable(fd, wait);
            }
            _ => wait_any_readable(&self.fds, wait),
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout`.
fn wait_any_readable(fds: &[std::os::fd::RawFd], timeout: Duration) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    #[allow(unsafe_code)]
    // SAFETY: `pfds` holds `pfds.len()` live, initialised pollfds for the call.
    let _ = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
}

fn open_backend(
    backend: Backend,
    demux: Option<&crate::datapath::demux::Demux>,
) -> Result<Box<dyn Datapath>, OpenError> {
    if let Some(d) = demux {
        return match backend {
            Backend::Udp { local, port } => crate::datapath::open::udp_demux(local, port, d),
            _ => Err(OpenError::Unsupported("kernel demux needs the udp backend")),
        };
    }
    match backend {
        Backend::Sim { net, local } => Ok(Box::new(net.open(local).map_err(|e| {
            OpenError::AddrInUse {
                addr: SocketAddr::new(local, roce_wire::frame::ROCEV2_PORT),
                detail: e.to_string(),
            }
        })?)),
        Backend::Custom(dp) => Ok(dp),
        Backend::Udp { local, port } => crate::datapath::open::udp(local, port),
        Backend::Raw { ifname, local } => crate::datapath::open::raw(&ifname, local),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use roce_qp::Event;

    use super::*;
    use crate::{
        Access, ConnectOptions, Psn, QpInit, QpType, RemoteQp, SendOp, SendWr, SimNetwork, WcStatus,
    };

    /// A WRITE with a bad R_Key fails the requester (IBV_EVENT_QP_FATAL): with a hook set the
    /// event reaches the hook, once, and is no longer queued for `poll_async_event`.
    #[test]
    fn the_async_event_hook_takes_the_events() {
        let net = SimNetwork::perfect();
        let a = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
        let b = Device::open(DeviceConfig::sim(&net, "10.9.0.2".parse().unwrap())).unwrap();
        let (tx, rx) = mpsc::channel();
        a.set_async_event_hook(move |ev| {
            let _ = tx.send(ev);
        });
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
        let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap();
        let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap();
        let o = ConnectOptions::default();
        let remote = |qpn, gid| RemoteQp {
            qpn,
            psn: Psn::new(0),
            gid,
        };
        qa.connect(&remote(qb.qpn(), b.local_gid()), &o).unwrap();
        qb.connect(&remote(qa.qpn(), a.local_gid()), &o).unwrap();
        let src = pa.register(vec![7u8; 8], Access::LOCAL_WRITE).unwrap();
        let dst = pb.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        };
        qa.post_send(SendWr::new(1, op, vec![src.sge(0, 8)]))
            .unwrap();
        let mut wc = [crate::Completion::EMPTY; 1];
        assert_eq!(ca.wait(&mut wc, Duration::from_secs(5)), 1);
        assert_eq!(wc[0].status, WcStatus::RemAccessErr);
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(ev.qpn.value(), qa.qpn().value());
        assert_eq!(ev.event, Event::QpFatal(WcStatus::RemAccessErr));
        assert!(a.poll_async_event().is_none());
        assert!(rx.try_recv().is_err());
    }

    /// Events queued before the hook is set are handed to it when it is set.
    #[test]
    fn a_new_hook_gets_the_queued_events_first() {
        let net = SimNetwork::perfect();
        let a = Device::open(DeviceConfig::sim(&net, "10.9.1.1".parse().unwrap())).unwrap();
        let ev = AsyncEvent {
            qpn: roce_wire::Qpn::new(0x12),
            event: Event::SqDrained,
        };
        lock(&a.shared().shards[0].engine).ep.events.push(ev);
        let (tx, rx) = mpsc::channel();
        a.set_async_event_hook(move |ev| {
            let _ = tx.send(ev);
        });
        assert_eq!(rx.try_recv().unwrap(), ev);
        assert!(a.poll_async_event().is_none());
    }
}
