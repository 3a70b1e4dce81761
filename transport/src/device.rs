//! Devices: open a backend, run the engine, query attributes.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_mr::MrTable;
use roce_qp::verbs::Mtu;
use roce_wire::Gid;

use crate::capture::Capture;
use crate::counters::{Counters, DeviceCounters};
use crate::datapath::sim::SimNetwork;
use crate::datapath::Datapath;
use crate::engine::Engine;
use crate::error::OpenError;
use crate::ids::Ids;
use crate::netdev::{GidEntry, GidType, NetDevice};
use crate::verbs::{AsyncEvent, CompletionQueue, ProtectionDomain, SharedReceiveQueue};

/// Which datapath a device uses.
#[derive(Debug)]
#[non_exhaustive]
pub enum Backend {
    /// Kernel UDP sockets bound to `local`:`port` (4791 for interoperability). No privileges.
    Udp {
        /// Local IP address (IPv4 or IPv6) the socket binds to.
        local: IpAddr,
        /// UDP port (4791 unless testing).
        port: u16,
    },
    /// Whole Ethernet frames on an interface (`AF_PACKET`); needs `CAP_NET_RAW`.
    Raw {
        /// Interface name.
        ifname: String,
        /// Our IP address on it.
        local: IpAddr,
    },
    /// A port on an in-memory network.
    Sim {
        /// The network.
        net: SimNetwork,
        /// Our address on it.
        local: IpAddr,
    },
    /// Any other [`Datapath`].
    Custom(Box<dyn Datapath>),
}

/// Who drives the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// A thread per device receives, fires timers and sends; posts send at once from the
    /// caller's thread. CQ polls that find nothing also make progress themselves.
    #[default]
    Thread,
    /// The application drives: [`Device::progress`] and [`Device::progress_wait`], or CQ
    /// polls (a collective library polling its CQs needs nothing else).
    Manual,
}

/// How to open a device.
#[derive(Debug)]
pub struct DeviceConfig {
    /// The datapath.
    pub backend: Backend,
    /// Device name (`ibv_devinfo`'s `hca_id`).
    pub name: String,
    /// Active path MTU; default: the largest the interface MTU allows (as rxe), at most 4096.
    pub mtu: Option<Mtu>,
    /// Who drives the engine.
    pub progress: Progress,
    /// Write every frame sent and received to this pcap file. Without it the environment
    /// variable `ROCECTL_PCAP` is used; `{dev}` in either is replaced by the device name.
    pub pcap: Option<PathBuf>,
    /// A capture file shared with other devices (one pcap of several devices' traffic);
    /// takes precedence over `pcap`.
    pub capture: Option<CaptureFile>,
    /// Seed for memory keys, initial PSNs and QPNs. `None` (the default): drawn from the
    /// operating system's random source, different on every open; set it only where a test
    /// needs identical runs (see [`DeviceConfig::seed`]).
    pub seed: Option<u64>,
    /// Memory-region table capacity.
    pub max_mr: u32,
}

impl DeviceConfig {
    /// A device on `backend` with defaults.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            name: "rocectl0".into(),
            mtu: None,
            progress: Progress::Thread,
            pcap: None,
            capture: None,
            seed: None,
            max_mr: 1 << 16,
        }
    }

    /// A `udp` device on `local`:4791.
    pub fn udp(local: IpAddr) -> Self {
        Self::new(Backend::Udp {
            local,
            port: roce_wire::frame::ROCEV2_PORT,
        })
    }

    /// A `sim` device with address `local` on `net`.
    pub fn sim(net: &SimNetwork, local: IpAddr) -> Self {
        Self::new(Backend::Sim {
            net: net.clone(),
            local,
        })
    }

    /// Sets the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the active path MTU.
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Sets who drives the engine.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Captures to a pcap file.
    pub fn pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }

    /// Captures into a file shared with other devices.
    pub fn capture(mut self, capture: &CaptureFile) -> Self {
        self.capture = Some(capture.clone());
        self
    }

    /// Makes memory keys, initial PSNs ([`Device::random_psn`]) and QPNs deterministic: two
    /// devices opened with the same seed draw the same numbers in the same order. For tests
    /// only: predictable keys, PSNs and QPNs let an off-path attacker inject packets.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// A pcap file several devices can write into.
#[derive(Clone, Debug)]
pub struct CaptureFile(pub(crate) Arc<Mutex<Capture>>);

impl CaptureFile {
    /// Creates (truncates) the file.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        Ok(Self(Arc::new(Mutex::new(Capture::create(path.as_ref())?))))
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        lock(&self.0).frames
    }

    /// Flushes buffered frames to disk.
    ///
    /// # Errors
    /// The write error, including one that stopped the capture earlier.
    pub fn flush(&self) -> io::Result<()> {
        let mut c = lock(&self.0);
        if let Some(e) = &c.error {
            return Err(io::Error::other(e.clone()));
        }
        c.flush()
    }

    /// The file.
    pub fn path(&self) -> PathBuf {
        lock(&self.0).path().to_path_buf()
    }
}

/// Device attributes (`ibv_query_device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Device name.
    pub name: String,
    /// Backend (`udp`, `raw`, `sim`...).
    pub backend: &'static str,
    /// Node GUID (EUI-64 from the MAC, as rxe).
    pub node_guid: u64,
    /// Most QPs.
    pub max_qp: u32,
    /// Most WRs per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Outstanding READ/atomic requests per QP, as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic requests per QP, as requester.
    pub max_qp_init_rd_atom: u32,
    /// Atomics are atomic with respect to this device only (IBV_ATOMIC_HCA).
    pub atomic_cap: &'static str,
}

/// Port state (`ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Up.
    Active,
}

/// Port attributes (`ibv_query_port`, port 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// State.
    pub state: PortState,
    /// Largest path MTU the interface allows.
    pub max_mtu: Mtu,
    /// Path MTU in use.
    pub active_mtu: Mtu,
    /// The interface's IP MTU.
    pub ip_mtu: usize,
    /// GID table entries.
    pub gid_tbl_len: usize,
    /// Link layer.
    pub link_layer: &'static str,
    /// Local IP address and UDP port.
    pub local: SocketAddr,
    /// The network interface the device sends through (`None` on `sim`).
    pub netdev: Option<String>,
}

pub(crate) struct DeviceShared {
    pub(crate) name: String,
    pub(crate) table: Arc<MrTable>,
    engine: Mutex<Engine>,
    waker: Option<mio::Waker>,
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
    /// When the progress thread plans to wake (ns since `epoch`; 0: not sleeping).
    sleep_until: AtomicU64,
    epoch: Instant,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("local", &self.local)
            .field("mtu", &self.mtu)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct DeviceHandle {
    shared: Arc<DeviceShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        {
            // Send what application-driven progress deferred (a final ACK).
            let mut e = lock(&self.shared.engine);
            if e.tx_waiting() {
                e.kick();
            }
        }
        if let Some(c) = &lock(&self.shared.engine).capture {
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
    /// Opens a device.
    ///
    /// # Errors
    /// [`OpenError`]: the backend could not start (address in use, no such interface, no
    /// `CAP_NET_RAW`...), the MTU does not fit the interface, or the capture file cannot be
    /// created.
    pub fn open(config: DeviceConfig) -> Result<Self, OpenError> {
        let dp = open_backend(config.backend)?;
        let caps = dp.caps();
        let local = dp.local_addr();
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
        let backend = dp.name();
        // The GID table mirrors what rxe builds for the interface that owns our address.
        let netdev: Option<NetDevice> = match backend {
            "udp" | "raw" => crate::netdev::interface_for_addr(local.ip()).ok(),
            _ => None,
        };
        let mac = netdev
            .as_ref()
            .and_then(|n| n.mac)
            .unwrap_or_else(|| crate::engine::mac_for(local.ip()));
        let gids: Vec<Gid> = match &netdev {
            Some(n) => n.gid_table().into_iter().map(|e| e.gid).collect(),
            None => vec![Gid::link_local_from_mac(mac), Gid::from_ip(local.ip())],
        };
        let mut engine = Engine::new(dp, max_mtu.bytes(), mac);
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
        engine.capture = capture;
        let poll = match config.progress {
            Progress::Thread => Some(mio::Poll::new().map_err(OpenError::Io)?),
            Progress::Manual => None,
        };
        let waker = match &poll {
            Some(p) => Some(mio::Waker::new(p.registry(), WAKER).map_err(OpenError::Io)?),
            None => None,
        };
        let fd = engine.datapath().readiness_fd();
        let mut ids = Ids::new(config.seed).map_err(OpenError::Io)?;
        let table_seed = ids.next_u64();
        let shared = Arc::new(DeviceShared {
            name: config.name,
            table: Arc::new(MrTable::new(config.max_mr, table_seed)),
            engine: Mutex::new(engine),
            waker,
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
            sleep_until: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let thread = match poll {
            Some(poll) => {
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
                Some(
                    std::thread::Builder::new()
                        .name(format!("{}-engine", s.name))
                        .spawn(move || run_thread(&s, poll, fd.is_some()))
                        .map_err(OpenError::Io)?,
                )
            }
            None => None,
        };
        Ok(Self {
            handle: Arc::new(DeviceHandle {
                shared,
                thread: Mutex::new(thread),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.handle.shared
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.shared().name
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let s = self.shared();
        let m = s.mac;
        let guid = u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]]);
        DeviceAttr {
            name: s.name.clone(),
            backend: s.backend,
            node_guid: guid,
            max_qp: 0x00FF_FFFF - 0x11,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cqe: 1 << 20,
            max_mr: s.table.capacity(),
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            atomic_cap: "ATOMIC_HCA",
        }
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        let s = self.shared();
        PortAttr {
            state: PortState::Active,
            max_mtu: s.max_mtu,
            active_mtu: s.mtu,
            ip_mtu: s.ip_mtu,
            gid_tbl_len: s.gids.len(),
            link_layer: "Ethernet",
            local: s.local,
            netdev: s.netdev.clone(),
        }
    }

    /// The GID table (every entry is RoCE v2).
    pub fn gid_table(&self) -> Vec<GidEntry> {
        self.shared()
            .gids
            .iter()
            .enumerate()
            .map(|(i, g)| GidEntry {
                index: i as u8,
                gid: *g,
                kind: GidType::RoceV2,
            })
            .collect()
    }

    /// `ibv_query_gid`.
    ///
    /// # Errors
    /// [`crate::VerbsError::NoSuchGid`] for an index past the table.
    pub fn gid(&self, index: u8) -> Result<Gid, crate::VerbsError> {
        self.shared()
            .gids
            .get(usize::from(index))
            .copied()
            .ok_or(crate::VerbsError::NoSuchGid {
                index,
                len: self.shared().gids.len(),
            })
    }

    /// The index of our IP address's GID in the table (what `-g`/`-x` should select).
    pub fn local_gid_index(&self) -> Option<u8> {
        let gid = self.local_gid();
        self.shared()
            .gids
            .iter()
            .position(|g| *g == gid)
            .map(|i| i as u8)
    }

    /// The GID of our IP address (what peers put in their address handles).
    pub fn local_gid(&self) -> Gid {
        Gid::from_ip(self.shared().local.ip())
    }

    /// Local IP address and UDP port.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared().local
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain::new(self.clone())
    }

    /// Creates a completion queue of `depth` entries.
    ///
    /// # Errors
    /// A depth of 0 or above the device limit; eventfd creation failure.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, crate::VerbsError> {
        CompletionQueue::new(self.clone(), depth)
    }

    /// Creates a shared receive queue of `max_wr` entries.
    pub fn create_srq(&self, max_wr: usize) -> SharedReceiveQueue {
        SharedReceiveQueue::new(self.clone(), max_wr)
    }

    /// Device and QP counters, summed.
    pub fn counters(&self) -> Counters {
        let mut e = self.lock_engine();
        e.refresh_rx_drops();
        let live: Vec<_> = e.qps.values().map(|s| s.qp.stats()).collect();
        Counters::collect(&e.counters, live.iter().chain(e.retired.iter()))
    }

    /// Device-level counters only.
    pub fn device_counters(&self) -> DeviceCounters {
        let mut e = self.lock_engine();
        e.refresh_rx_drops();
        e.counters
    }

    /// The last error the engine met that no call returned (a send to an unreachable
    /// network, a QP that entered the error state, a capture write failure), if any.
    pub fn last_error(&self) -> Option<String> {
        let e = self.lock_engine();
        e.last_error
            .clone()
            .or_else(|| e.capture.as_ref().and_then(|c| lock(&c.0).error.clone()))
    }

    /// The next asynchronous event (`ibv_get_async_event`), if any.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let mut e = self.lock_engine();
        if e.events.is_empty() {
            None
        } else {
            Some(e.events.remove(0))
        }
    }

    /// One non-blocking pass of the engine: receive what is waiting, fire due timers, send,
    /// move completions to their CQs. Returns whether anything was received or sent.
    pub fn progress(&self) -> bool {
        let defer = self.shared().progress == Progress::Manual;
        let r = self.lock_engine().progress(defer);
        r.received > 0 || r.sent > 0
    }

    /// Waits up to `timeout` for packets or a timer (whichever first), then makes progress.
    /// For [`Progress::Manual`] devices; harmless on others.
    pub fn progress_wait(&self, timeout: Duration) -> bool {
        let defer = self.shared().progress == Progress::Manual;
        let (fd, deadline) = {
            let mut e = self.lock_engine();
            let r = e.progress(defer);
            if r.received > 0 {
                return true;
            }
            // Nothing arrived: send what this or an earlier pass deferred before sleeping.
            if e.tx_waiting() {
                e.kick();
            }
            (e.datapath().readiness_fd(), e.next_deadline())
        };
        let now = Instant::now();
        let mut wait = timeout;
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(now));
        }
        match fd {
            Some(fd) => {
                crate::sys::wait_readable(fd, wait);
            }
            None => std::thread::sleep(wait.min(Duration::from_millis(1))),
        }
        self.progress()
    }

    /// Flushes the capture file, if any.
    ///
    /// # Errors
    /// The capture's write error.
    pub fn flush_capture(&self) -> io::Result<()> {
        let e = self.lock_engine();
        match &e.capture {
            Some(c) => CaptureFile(c.0.clone()).flush(),
            None => Ok(()),
        }
    }

    pub(crate) fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        lock(&self.shared().engine)
    }

    /// Progress if nobody else is making it right now (CQ polls that found nothing).
    pub(crate) fn try_progress(&self) {
        let defer = self.shared().progress == Progress::Manual;
        if let Ok(mut e) = self.shared().engine.try_lock() {
            e.progress(defer);
        }
    }

    /// After a post: send at once, and wake the engine thread if a new timer is due before
    /// it planned to wake.
    pub(crate) fn doorbell(&self, mut e: MutexGuard<'_, Engine>, qpn: u32) {
        e.kick();
        let s = self.shared();
        if s.progress != Progress::Thread {
            return;
        }
        let due = e
            .qps
            .get(&qpn)
            .and_then(|q| q.qp.poll_timeout())
            .map(|t| e.to_std(t));
        drop(e);
        if let Some(due) = due {
            let planned = s.sleep_until.load(Ordering::Acquire);
            let due_ns = due.saturating_duration_since(s.epoch).as_nanos() as u64;
            if planned == 0 || due_ns < planned {
                s.wake();
            }
        }
    }

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

impl DeviceShared {
    fn wake(&self) {
        if let Some(w) = &self.waker {
            let _ = w.wake();
        }
    }
}

const DATAPATH: mio::Token = mio::Token(0);
const WAKER: mio::Token = mio::Token(1);

fn run_thread(s: &DeviceShared, mut poll: mio::Poll, has_fd: bool) {
    let mut events = mio::Events::with_capacity(16);
    while !s.stop.load(Ordering::SeqCst) {
        let (r, deadline) = {
            let mut e = lock(&s.engine);
            let r = e.progress(false);
            let d = e.next_deadline();
            let planned = d.map_or(u64::MAX, |d| {
                d.saturating_duration_since(s.epoch).as_nanos() as u64
            });
            s.sleep_until.store(planned.max(1), Ordering::Release);
            (r, d)
        };
        if r.more_rx {
            continue;
        }
        let now = Instant::now();
        let mut timeout =
            deadline.map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now));
        if r.tx_blocked || !has_fd {
            timeout = timeout.min(Duration::from_micros(200));
        }
        if poll.poll(&mut events, Some(timeout)).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        s.sleep_until.store(0, Ordering::Release);
    }
}

fn open_capture(path: &std::path::Path, dev: &str) -> Result<CaptureFile, OpenError> {
    let text = path.to_string_lossy().replace("{dev}", dev);
    CaptureFile::create(&text).map_err(|e| OpenError::Capture {
        path: text,
        source: e,
    })
}

fn open_backend(backend: Backend) -> Result<Box<dyn Datapath>, OpenError> {
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
