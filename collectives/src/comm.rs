//! The communicator: setting up (device, service, QPs, exchange, monitor), the operations
//! (blocking on the caller's thread, non-blocking on a worker thread, in post order),
//! abort and shrink.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_transport::{Device, DeviceConfig, Gid};

use crate::algo::{self, Allreduce, Phase, Plan, ReduceAlgo};
use crate::bootstrap::{file_cleanup, file_exchange, Bootstrap};
use crate::codec::{Dec, Enc};
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::CollError;
use crate::net::{Net, NetConfig, PeerInfo};
use crate::options::{Algorithm, CommOptions, DeviceChoice};
use crate::service::{self, MonitorClient, Service};
use crate::status::Status;

const MAGIC: u32 = 0x524f_4332; // "ROC2": since the blob carries the host's boot ID
const TAG_INIT: u64 = 0;
const TAG_READY: u64 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    Instant::now().hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

/// A finished operation's result, shared by its [`Handle`] and the worker.
#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<Vec<u8>, CollError>>>,
    cv: Condvar,
}

/// A posted non-blocking operation. Operations complete in the order they were posted.
#[must_use = "a Handle is how the result (and any error) comes back"]
pub struct Handle {
    slot: Arc<Slot>,
    limit: Duration,
    rank: usize,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").finish_non_exhaustive()
    }
}

impl Handle {
    /// Whether the operation has finished: `Ok(true)` done, `Ok(false)` still running,
    /// `Err` it failed (the same error [`Self::wait`] returns).
    ///
    /// # Errors
    /// The operation's error.
    pub fn test(&self) -> Result<bool, CollError> {
        match &*lock(&self.slot.result) {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(e.clone()),
        }
    }

    /// Waits for the operation and returns its buffer (the result).
    ///
    /// # Errors
    /// The operation's error. Each operation fails at its timeout, so this returns within
    /// (operations posted ahead of it + 1) timeouts; past that (plus 5 s) it gives up with
    /// [`CollError::Timeout`] rather than wait for a worker that can no longer answer.
    pub fn wait(self) -> Result<Vec<u8>, CollError> {
        let deadline = Instant::now() + self.limit;
        let mut g = lock(&self.slot.result);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollError::Timeout {
                    rank: self.rank,
                    peer: None,
                    phase: "waiting for a handle".into(),
                    after: self.limit,
                });
            }
            g = self
                .slot
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// As [`Self::wait`], the buffer reinterpreted as elements of `T`.
    ///
    /// # Errors
    /// As [`Self::wait`]; [`CollError::InvalidArgument`] if the length is not whole
    /// elements.
    pub fn wait_typed<T: Element>(self) -> Result<Vec<T>, CollError> {
        let b = self.wait()?;
        from_bytes(&b)
    }
}

type Job = Box<dyn FnOnce(&Shared) -> Result<Vec<u8>, CollError> + Send>;

/// State shared by the communicator, its worker and its abort handles.
struct Shared {
    rank: usize,
    size: usize,
    opts: CommOptions,
    status: Arc<Status>,
    net: Mutex<Option<Net>>,
    monitor: Arc<MonitorClient>,
    /// Posted operations not finished yet.
    pending: Mutex<usize>,
    idle: Condvar,
    notify_tx: UnixStream,
}

/// Stops a communicator's operations: on this rank at once, on every other rank within a
/// second (through the monitor). `Clone + Send + Sync`: keep one on another thread.
#[derive(Clone)]
pub struct AbortHandle {
    status: Arc<Status>,
    monitor: Arc<MonitorClient>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("rank", &self.status.rank)
            .finish()
    }
}

impl AbortHandle {
    /// Aborts: every pending and future operation of this communicator, on every rank, fails
    /// with [`CollError::Aborted`]. Returns at once (at most a 200 ms socket write).
    pub fn abort(&self) {
        let r = self.status.rank;
        self.status.set_aborted(r);
        self.monitor.send_abort(r);
    }
}

/// A group of ranks that run collectives together (see the crate docs).
pub struct Communicator {
    shared: Arc<Shared>,
    jobs: Option<mpsc::Sender<(Job, Arc<Slot>)>>,
    worker: Option<JoinHandle<()>>,
    notify_rx: UnixStream,
    dev: Device,
    service: Arc<Service>,
    /// Every rank's service address (shrink meets at the lowest survivor's).
    services: Vec<SocketAddr>,
    comm_id: u64,
    files: Option<(PathBuf, Vec<u64>)>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .field("device", &self.dev.local_addr())
            .finish_non_exhaustive()
    }
}

/// The same operations as [`Communicator`] with another timeout for each call; see
/// [`Communicator::with_timeout`].
#[derive(Debug, Clone, Copy)]
pub struct CallScope<'a> {
    comm: &'a Communicator,
    timeout: Duration,
}

fn device_config(
    opts: &CommOptions,
    store: Option<IpAddr>,
    rank: usize,
) -> Result<DeviceConfig, CollError> {
    let own_loopback = || IpAddr::V4(Ipv4Addr::new(127, 0, 0, (rank % 254 + 1) as u8));
    Ok(match &opts.device {
        DeviceChoice::Config(f) => f(rank),
        DeviceChoice::Address(ip) => DeviceConfig::udp(*ip),
        DeviceChoice::Interface(name) => {
            let nd = roce_transport::netdev::interface(name)
                .map_err(|e| CollError::InvalidArgument(format!("interface {name:?}: {e}")))?;
            let ips: Vec<IpAddr> = nd.addrs().collect();
            let ip = ips
                .iter()
                .find(|a| a.is_ipv4())
                .or_else(|| ips.first())
                .copied()
                .ok_or_else(|| {
                    CollError::InvalidArgument(format!("interface {name:?} has no address"))
                })?;
            DeviceConfig::udp(ip)
        }
        DeviceChoice::Auto => {
            let ip = match store {
                Some(h) if !h.is_loopback() && !h.is_unspecified() => {
                    UdpSocket::bind(if h.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
                        .and_then(|s| {
                            s.connect(SocketAddr::new(h, 9))?;
                            s.local_addr()
                        })
                        .map(|a| a.ip())
                        .unwrap_or_else(|_| own_loopback())
                }
                _ => own_loopback(),
            };
            DeviceConfig::udp(ip)
        }
    })
}

struct Blob {
    comm_id: u64,
    size: usize,
    gid: Gid,
    service: SocketAddr,
    cfg: (usize, usize, usize),
    peers: Vec<Option<PeerInfo>>,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`): ranks that report the
    /// same one share a host's CPUs (network namespaces and containers do). Empty when it
    /// cannot be read (such a rank counts as alone on its host).
    host: Vec<u8>,
}

/// This host's boot ID, or nothing.
fn boot_id() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/random/boot_id")
        .map(|mut v| {
            v.truncate(64);
            v
        })
        .unwrap_or_default()
}

/// How many ranks of `blobs` run on the host of `me` (itself included).
fn local_ranks(blobs: &[Blob], me: &Blob) -> usize {
    if me.host.is_empty() {
        return 1;
    }
    blobs.iter().filter(|b| b.host == me.host).count().max(1)
}

fn encode_blob(b: &Blob) -> Vec<u8> {
    let mut e = Enc::default();
    e.u32(MAGIC)
        .u64(b.comm_id)
        .u32(b.size as u32)
        .bytes(&b.gid.0)
        .bytes(b.service.to_string().as_bytes())
        .u32(b.cfg.0 as u32)
        .u32(b.cfg.1 as u32)
        .u32(b.cfg.2 as u32);
    for p in &b.peers {
        match p {
            None => {
                e.u8(0);
            }
            Some(i) => {
                e.u8(1);
                i.encode(&mut e);
            }
        }
    }
    e.bytes(&b.host);
    e.0
}

fn decode_blob(v: &[u8], from: usize) -> Result<Blob, CollError> {
    let bad = || {
        CollError::Bootstrap(format!(
            "rank {from}'s bootstrap blob does not decode (another version or another program?)"
        ))
    };
    let mut d = Dec(v);
    if d.u32().map_err(|_| bad())? != MAGIC {
        return Err(bad());
    }
    let comm_id = d.u64().map_err(|_| bad())?;
    let size = d.u32().map_err(|_| bad())? as usize;
    let g = d.bytes().map_err(|_| bad())?;
    let gid = Gid(g.try_into().map_err(|_| bad())?);
    let service = std::str::from_utf8(d.bytes().map_err(|_| bad())?)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let cfg = (
        d.u32().map_err(|_| bad())? as usize,
        d.u32().map_err(|_| bad())? as usize,
        d.u32().map_err(|_| bad())? as usize,
    );
    if size > 1 << 16 {
        return Err(bad());
    }
    let mut peers = Vec::with_capacity(size);
    for _ in 0..size {
        peers.push(match d.u8().map_err(|_| bad())? {
            0 => None,
            _ => Some(PeerInfo::decode(&mut d).map_err(|_| bad())?),
        });
    }
    let host = d.bytes().map_err(|_| bad())?.to_vec();
    Ok(Blob {
        comm_id,
        size,
        gid,
        service,
        cfg,
        peers,
        host,
    })
}

/// How blobs are exchanged during init (and how shrink meets).
enum Exchanger<'a> {
    Tcp(SocketAddr),
    File(&'a std::path::Path),
    Callback(&'a crate::bootstrap::ExchangeFn),
}

impl Exchanger<'_> {
    fn run(
        &self,
        tag: u64,
        rank: usize,
        size: usize,
        blob: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>, CollError> {
        let got = match self {
            Self::Tcp(a) => service::exchange(*a, tag, rank, size, &blob, deadline)?,
            Self::File(p) => file_exchange(p, tag, rank, size, &blob, deadline)?,
            Self::Callback(f) => f(blob).map_err(|e| {
                CollError::Bootstrap(format!("rank {rank}: exchange callback: {e}"))
            })?,
        };
        if got.len() != size {
            return Err(CollError::Bootstrap(format!(
                "rank {rank}: the exchange returned {} blobs for {size} ranks",
                got.len()
            )));
        }
        Ok(got)
    }
}

struct Setup<'a> {
    rank: usize,
    size: usize,
    opts: CommOptions,
    dev: Device,
    service: Arc<Service>,
    ex: Exchanger<'a>,
    tags: (u64, u64),
    deadline: Instant,
}

impl Communicator {
    /// Sets up a communicator: opens the device, creates the QPs and receive slots to every
    /// peer, exchanges them through `bootstrap`, connects, joins the monitor and waits for
    /// every rank to get there.
    ///
    /// # Errors
    /// [`CollError::Bootstrap`] (environment, store, inconsistent options across ranks),
    /// [`CollError::Timeout`] naming the missing ranks when not every rank arrives within
    /// the timeout, [`CollError::Transport`] (the device does not open),
    /// [`CollError::InvalidArgument`] (options out of range).
    pub fn init(bootstrap: Bootstrap, opts: CommOptions) -> Result<Self, CollError> {
        opts.validate()?;
        let b = bootstrap.resolve()?;
        let Some((rank, size)) = b.rank_size() else {
            return Err(CollError::Bootstrap("unresolved environment".into()));
        };
        if size == 0 || rank >= size {
            return Err(CollError::InvalidArgument(format!(
                "rank {rank} of {size} ranks"
            )));
        }
        let deadline = Instant::now() + opts.timeout;
        let store = match &b {
            Bootstrap::Tcp { addr, .. } => Some(addr.ip()),
            _ => None,
        };
        let cfg = device_config(&opts, store, rank)?;
        let auto = matches!(opts.device, DeviceChoice::Auto);
        let dev = Device::open(cfg).map_err(|e| CollError::Transport {
            rank,
            what: format!(
                "opening the device: {e}{}",
                if auto {
                    " (several ranks on one host share its address only through the rocectl \
                     daemon; or give each rank its own with ROCECTL_COLL_ADDR)"
                } else {
                    ""
                }
            ),
        })?;
        let ip = dev.local_addr().ip();
        let service = match &b {
            Bootstrap::Tcp { addr, .. } if rank == 0 => {
                let mut s = Service::start(*addr)
                    .or_else(|_| {
                        Service::start(SocketAddr::new(
                            if addr.is_ipv4() {
                                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                            } else {
                                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                            },
                            addr.port(),
                        ))
                    })
                    .map_err(|e| {
                        CollError::Bootstrap(format!(
                            "rank 0: cannot serve the store at {addr}: {e}"
                        ))
                    })?;
                s.set_public_addr(*addr);
                s
            }
            _ => Service::start(SocketAddr::new(ip, 0))
                .or_else(|_| Service::start(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)))
                .map_err(|e| CollError::Bootstrap(format!("rank {rank}: cannot listen: {e}")))?,
        };
        let (ex, files) = match &b {
            Bootstrap::Tcp { addr, .. } => (Exchanger::Tcp(*addr), None),
            Bootstrap::File { path, .. } => (
                Exchanger::File(path),
                Some((path.clone(), vec![TAG_INIT, TAG_READY])),
            ),
            Bootstrap::Callback { exchange, .. } => (Exchanger::Callback(exchange), None),
            Bootstrap::Env => return Err(CollError::Bootstrap("unresolved environment".into())),
        };
        let setup = Setup {
            rank,
            size,
            opts,
            dev,
            service: Arc::new(service),
            ex,
            tags: (TAG_INIT, TAG_READY),
            deadline,
        };
        match setup.build() {
            Ok(mut c) => {
                c.files = files;
                Ok(c)
            }
            Err(e) => {
                // A failed init leaves no files for a later job to read.
                if let Some((path, tags)) = &files {
                    file_cleanup(path, tags, rank);
                }
                Err(e)
            }
        }
    }

    /// [`Self::init`] with [`Bootstrap::Env`] and [`CommOptions::from_env`].
    ///
    /// # Errors
    /// As [`Self::init`].
    pub fn from_env() -> Result<Self, CollError> {
        Self::init(Bootstrap::Env, CommOptions::from_env()?)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The options.
    pub fn options(&self) -> &CommOptions {
        &self.shared.opts
    }

    /// How long a blocking wait of this communicator polls before it sleeps
    /// ([`CommOptions::spin`] resolved for this host at set-up; zero after the
    /// communicator has closed; [`Duration::MAX`] with [`CommOptions::busy_poll`]: every
    /// wait polls).
    pub fn spin(&self) -> Duration {
        lock(&self.shared.net)
            .as_ref()
            .map_or(Duration::ZERO, Net::spin)
    }

    /// The device's local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.dev.local_addr()
    }

    /// The allreduce algorithm a call on `bytes` bytes runs with this communicator's options
    /// (what [`Algorithm::Auto`] picks): `ring`, `hd`, `rd`, `direct` or `deterministic`
    /// (a direct reduce-scatter in rank order, then a ring allgather). For benchmarks'
    /// reports.
    pub fn allreduce_algorithm(&self, bytes: usize) -> &'static str {
        match self.shared.allreduce_algo(bytes) {
            Allreduce::Ring => "ring",
            Allreduce::HalvingDoubling => "hd",
            Allreduce::RecursiveDoubling => "rd",
            Allreduce::Direct => "direct",
            Allreduce::Deterministic => "deterministic",
        }
    }

    /// The ranks known to have failed, with what was seen (for [`Self::shrink`]).
    pub fn failed_ranks(&self) -> Vec<(usize, String)> {
        self.shared.status.failed()
    }

    /// The operations of this communicator with `timeout` instead of
    /// [`CommOptions::timeout`]: `comm.with_timeout(Duration::from_secs(2)).barrier()`.
    pub fn with_timeout(&self, timeout: Duration) -> CallScope<'_> {
        CallScope {
            comm: self,
            timeout,
        }
    }

    fn scope(&self) -> CallScope<'_> {
        self.with_timeout(self.shared.opts.timeout)
    }

    /// A descriptor that becomes readable whenever a non-blocking operation finishes (for
    /// epoll/mio). Each finish writes one byte: read them, or call
    /// [`Self::clear_completion_fd`], then [`Handle::test`] the handles.
    pub fn completion_fd(&self) -> RawFd {
        self.notify_rx.as_raw_fd()
    }

    /// Consumes the completion descriptor's pending bytes; returns how many finishes they
    /// announced.
    pub fn clear_completion_fd(&self) -> usize {
        let mut n = 0;
        let mut buf = [0u8; 64];
        while let Ok(k) = (&self.notify_rx).read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }

    /// A handle that aborts this communicator from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            status: self.shared.status.clone(),
            monitor: self.shared.monitor.clone(),
        }
    }

    /// Aborts: this rank's pending and future operations fail at once, every other rank's
    /// within a second, all with [`CollError::Aborted`] naming this rank.
    pub fn abort(&self) {
        self.abort_handle().abort();
    }

    /// Leaves as a killed process would: no goodbye to the monitor, the QPs and device go
    /// at once. For tests of failure detection; the communicator is unusable after.
    #[doc(hidden)]
    pub fn simulate_crash(mut self) {
        self.shared.monitor.crash();
        if self.shared.rank == 0 {
            self.service.crash();
        }
        *lock(&self.shared.net) = None;
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }

    /// Vanishes as a host that is cut off would: no more heartbeats, no goodbye, its QPs
    /// gone (no more ACKs) but its TCP connections left open (the monitor's and, on rank 0,
    /// the service's), so only the heartbeats can tell. For tests of failure detection;
    /// leaks the monitor and service of this communicator.
    #[doc(hidden)]
    pub fn simulate_vanish(mut self) {
        self.shared.monitor.vanish();
        std::mem::forget(self.shared.monitor.clone());
        if self.shared.rank == 0 {
            self.service.pause_heartbeats();
            std::mem::forget(self.service.clone());
        }
        *lock(&self.shared.net) = None;
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }

    /// A new communicator of the ranks not in `exclude` (typically
    /// [`Self::failed_ranks`]), numbered in the old order; it meets at the lowest
    /// survivor's service and gets new QPs (the old communicator's streams may be cut
    /// mid-operation). Every survivor must call it with the same `exclude`.
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] if this rank is excluded or nobody is left; as
    /// [`Self::init`] otherwise.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Self, CollError> {
        let rank = self.rank();
        if exclude.contains(&rank) {
            return Err(CollError::InvalidArgument(format!(
                "rank {rank} cannot shrink a communicator it is excluded from"
            )));
        }
        let survivors: Vec<usize> = (0..self.size()).filter(|r| !exclude.contains(r)).collect();
        // INVARIANT: this rank is not excluded, so it is a survivor.
        let new_rank = survivors
            .iter()
            .position(|r| *r == rank)
            .expect("INVARIANT: survivor");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.comm_id, &survivors).hash(&mut h);
        let tag = h.finish() & !1;
        let root = self.services[survivors[0]];
        let setup = Setup {
            rank: new_rank,
            size: survivors.len(),
            opts: self.shared.opts.clone(),
            dev: self.dev.clone(),
            service: self.service.clone(),
            ex: Exchanger::Tcp(root),
            tags: (tag, tag | 1),
            deadline: Instant::now() + self.shared.opts.timeout,
        };
        setup.build()
    }

    // ----- operations (the default timeout); see `CallScope` for the docs -----

    /// Allreduce, out of place: `recv = op over ranks of send`.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allreduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        self.scope().allreduce_raw(dt, op, send, recv)
    }
    /// Allreduce in place.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allreduce_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.scope().allreduce_in_place_raw(dt, op, buf)
    }
    /// Reduce-scatter: `send` holds `size` blocks of `recv.len()` bytes.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce_scatter_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        self.scope().reduce_scatter_raw(dt, op, send, recv)
    }
    /// Reduce-scatter in place: the result is block `rank` of `buf`.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce_scatter_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.scope().reduce_scatter_in_place_raw(dt, op, buf)
    }
    /// Allgather: `recv` gets `size` blocks of `send.len()` bytes.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allgather_raw(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        self.scope().allgather_raw(send, recv)
    }
    /// Allgather in place: this rank's block is already at `rank · len / size`.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allgather_in_place_raw(&self, buf: &mut [u8]) -> Result<(), CollError> {
        self.scope().allgather_in_place_raw(buf)
    }
    /// Broadcast of `buf` from `root`.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn broadcast_raw(&self, buf: &mut [u8], root: usize) -> Result<(), CollError> {
        self.scope().broadcast_raw(buf, root)
    }
    /// Reduce to `root` (`recv` is written on the root only).
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        self.scope().reduce_raw(dt, op, send, recv, root)
    }
    /// Reduce in place to `root` (`buf` is the result there, untouched elsewhere).
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        self.scope().reduce_in_place_raw(dt, op, buf, root)
    }
    /// Sends `buf` to `peer` (matched by its [`Self::recv_raw`] of the same length).
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn send_raw(&self, buf: &[u8], peer: usize) -> Result<(), CollError> {
        self.scope().send_raw(buf, peer)
    }
    /// Receives `buf.len()` bytes from `peer`.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn recv_raw(&self, buf: &mut [u8], peer: usize) -> Result<(), CollError> {
        self.scope().recv_raw(buf, peer)
    }
    /// Waits until every rank has called it.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn barrier(&self) -> Result<(), CollError> {
        self.scope().barrier()
    }
    /// Typed allreduce, out of place.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allreduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.scope().allreduce(send, recv, op)
    }
    /// Typed allreduce in place.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allreduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.scope().allreduce_in_place(buf, op)
    }
    /// Typed reduce-scatter.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.scope().reduce_scatter(send, recv, op)
    }
    /// Typed allgather.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn allgather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError> {
        self.scope().allgather(send, recv)
    }
    /// Typed broadcast.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollError> {
        self.scope().broadcast(buf, root)
    }
    /// Typed reduce.
    ///
    /// # Errors
    /// As [`CallScope::allreduce_raw`].
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollError> {
        self.scope().reduce(send, recv, op, root)
    }

    // ----- non-blocking -----

    /// Non-blocking allreduce in place of `buf`; the handle gives it back reduced.
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] at once for bad arguments; the rest through the
    /// handle.
    pub fn iallreduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        mut buf: Vec<u8>,
    ) -> Result<Handle, CollError> {
        check_op(dt, op, buf.len())?;
        self.post(move |s, t| {
            s.allreduce_in_place(dt, op, &mut buf, t)?;
            Ok(buf)
        })
    }
    /// Typed non-blocking allreduce in place.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn iallreduce<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<Handle, CollError> {
        self.iallreduce_raw(T::DTYPE, op, bytemuck::cast_slice(&buf).to_vec())
    }
    /// Non-blocking reduce-scatter in place: the handle gives back this rank's block.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn ireduce_scatter_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        mut buf: Vec<u8>,
    ) -> Result<Handle, CollError> {
        check_op(dt, op, buf.len())?;
        let (n, r) = (self.size(), self.rank());
        check_blocks(buf.len(), n, dt.size())?;
        self.post(move |s, t| {
            s.reduce_scatter_in_place(dt, op, &mut buf, t)?;
            let l = buf.len() / n;
            Ok(buf[r * l..(r + 1) * l].to_vec())
        })
    }
    /// Non-blocking allgather: the handle gives back all ranks' blocks.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn iallgather_raw(&self, send: Vec<u8>) -> Result<Handle, CollError> {
        let (n, r) = (self.size(), self.rank());
        self.post(move |s, t| {
            let l = send.len();
            let mut buf = vec![0u8; l * n];
            buf[r * l..(r + 1) * l].copy_from_slice(&send);
            s.allgather_in_place(&mut buf, t)?;
            Ok(buf)
        })
    }
    /// Non-blocking broadcast of `buf` from `root`.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn ibroadcast_raw(&self, mut buf: Vec<u8>, root: usize) -> Result<Handle, CollError> {
        self.check_rank(root)?;
        self.post(move |s, t| {
            s.broadcast(&mut buf, root, t)?;
            Ok(buf)
        })
    }
    /// Non-blocking reduce to `root` (the result is meaningful on the root only).
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn ireduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        mut buf: Vec<u8>,
        root: usize,
    ) -> Result<Handle, CollError> {
        check_op(dt, op, buf.len())?;
        self.check_rank(root)?;
        self.post(move |s, t| {
            s.reduce_in_place(dt, op, &mut buf, root, t)?;
            Ok(buf)
        })
    }
    /// Non-blocking send (the handle gives back the buffer).
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn isend_raw(&self, buf: Vec<u8>, peer: usize) -> Result<Handle, CollError> {
        self.check_peer(peer)?;
        self.post(move |s, t| {
            s.p2p(&mut buf.clone(), peer, true, t)?;
            Ok(buf)
        })
    }
    /// Non-blocking receive of `len` bytes.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn irecv_raw(&self, len: usize, peer: usize) -> Result<Handle, CollError> {
        self.check_peer(peer)?;
        self.post(move |s, t| {
            let mut buf = vec![0u8; len];
            s.p2p(&mut buf, peer, false, t)?;
            Ok(buf)
        })
    }
    /// Non-blocking barrier.
    ///
    /// # Errors
    /// As [`Self::iallreduce_raw`].
    pub fn ibarrier(&self) -> Result<Handle, CollError> {
        self.post(move |s, t| {
            s.barrier(t)?;
            Ok(Vec::new())
        })
    }

    fn check_rank(&self, root: usize) -> Result<(), CollError> {
        if root >= self.size() {
            return Err(CollError::InvalidArgument(format!(
                "rank {root} out of range (communicator of {})",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<(), CollError> {
        self.check_rank(peer)?;
        if peer == self.rank() {
            return Err(CollError::InvalidArgument(format!(
                "rank {peer}: send/recv to itself"
            )));
        }
        Ok(())
    }

    fn post_with(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Shared, Duration) -> Result<Vec<u8>, CollError> + Send + 'static,
    ) -> Result<Handle, CollError> {
        let Some(jobs) = &self.jobs else {
            return Err(CollError::InvalidArgument("communicator closed".into()));
        };
        let slot = Arc::new(Slot::default());
        // The worker finishes each operation within its timeout: this one within
        // (operations ahead + 1) timeouts. A handle waits that long (and a little) at most.
        let ahead = {
            let mut p = lock(&self.shared.pending);
            *p += 1;
            *p
        };
        let limit = timeout
            .saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX))
            .saturating_add(Duration::from_secs(5));
        let job: Job = Box::new(move |s| f(s, timeout));
        if jobs.send((job, slot.clone())).is_err() {
            *lock(&self.shared.pending) -= 1;
            return Err(CollError::InvalidArgument("communicator closed".into()));
        }
        Ok(Handle {
            slot,
            limit,
            rank: self.shared.rank,
        })
    }

    fn post(
        &self,
        f: impl FnOnce(&Shared, Duration) -> Result<Vec<u8>, CollError> + Send + 'static,
    ) -> Result<Handle, CollError> {
        self.post_with(self.shared.opts.timeout, f)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Posted operations finish (or fail at their timeout) first.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        // The closing handshake: this rank's last packets reach every live peer before its
        // QPs go (bounded by the communicator's timeout; a dead peer's QP errs in ~0.5 s).
        if let Some(net) = lock(&self.shared.net).as_mut() {
            net.close(self.shared.opts.timeout);
        }
        self.shared.monitor.leave();
        *lock(&self.shared.net) = None;
        if let Some((path, tags)) = &self.files {
            file_cleanup(path, tags, self.shared.rank);
        }
    }
}

impl Setup<'_> {
    fn build(self) -> Result<Communicator, CollError> {
        let Self {
            rank,
            size,
            opts,
            dev,
            service,
            ex,
            tags,
            deadline,
        } = self;
        let status = Arc::new(Status::new(rank));
        let cfg = NetConfig {
            chunk: (opts.chunk_bytes & !7).max(8),
            slots: opts.slots,
            qps: opts.qps_per_peer,
            spin: Duration::ZERO,
        };
        let peers: Vec<bool> = (0..size).map(|p| p != rank).collect();
        let mut net = Net::new(&dev, rank, &peers, cfg, status.clone())?;
        let blob = Blob {
            comm_id: random_u64(),
            size,
            gid: dev.local_gid(),
            service: service.addr(),
            cfg: (cfg.chunk, cfg.slots, cfg.qps),
            peers: (0..size).map(|p| net.info_for(p)).collect(),
            host: boot_id(),
        };
        let all = ex.run(tags.0, rank, size, encode_blob(&blob), deadline)?;
        let blobs = all
            .iter()
            .enumerate()
            .map(|(r, b)| decode_blob(b, r))
            .collect::<Result<Vec<_>, _>>()?;
        for (r, b) in blobs.iter().enumerate() {
            if b.size != size || b.cfg != blob.cfg {
                return Err(CollError::Bootstrap(format!(
                    "rank {rank}: rank {r} has {} ranks, chunk/slots/qps {:?}; we have {size}, {:?} \
                     (every rank needs the same options)",
                    b.size, b.cfg, blob.cfg
                )));
            }
        }
        for (p, b) in blobs.iter().enumerate() {
            if p == rank {
                continue;
            }
            let Some(info) = &b.peers[rank] else {
                return Err(CollError::Bootstrap(format!(
                    "rank {rank}: rank {p} has no connection for us"
                )));
            };
            net.connect(p, b.gid, info)?;
        }
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        net.set_spin(if opts.busy_poll {
            Duration::MAX
        } else {
            opts.spin.resolve(local_ranks(&blobs, &blob), cpus)
        });
        let comm_id = blobs[0].comm_id;
        let services: Vec<SocketAddr> = blobs.iter().map(|b| b.service).collect();
        let monitor = Arc::new(MonitorClient::join(
            services[0],
            comm_id,
            0,
            size,
            status.clone(),
            deadline,
        )?);
        // Everyone connected and watched before the first data.
        ex.run(tags.1, rank, size, Vec::new(), deadline)?;
        let (notify_rx, notify_tx) = UnixStream::pair().map_err(|e| CollError::Transport {
            rank,
            what: format!("socketpair: {e}"),
        })?;
        let _ = notify_rx.set_nonblocking(true);
        let _ = notify_tx.set_nonblocking(true);
        let shared = Arc::new(Shared {
            rank,
            size,
            opts,
            status,
            net: Mutex::new(Some(net)),
            monitor,
            pending: Mutex::new(0),
            idle: Condvar::new(),
            notify_tx,
        });
        let (tx, rx) = mpsc::channel::<(Job, Arc<Slot>)>();
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("coll-worker-{rank}"))
            .spawn(move || {
                while let Ok((job, slot)) = rx.recv() {
                    // A panic in an operation (a bug) fails that operation, not the worker.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&s)))
                        .unwrap_or_else(|_| {
                            Err(CollError::InvalidArgument(format!(
                                "rank {}: internal error (a panic) in a non-blocking operation",
                                s.rank
                            )))
                        });
                    *lock(&slot.result) = Some(r);
                    slot.cv.notify_all();
                    let _ = (&s.notify_tx).write(&[1]);
                    let mut p = lock(&s.pending);
                    *p -= 1;
                    if *p == 0 {
                        s.idle.notify_all();
                    }
                }
            })
            .map_err(|e| CollError::Transport {
                rank,
                what: format!("spawning the worker: {e}"),
            })?;
        Ok(Communicator {
            shared,
            jobs: Some(tx),
            worker: Some(worker),
            notify_rx,
            dev,
            service,
            services,
            comm_id,
            files: None,
        })
    }
}

fn check_op(dt: DataType, op: ReduceOp, len: usize) -> Result<(), CollError> {
    if !dt.supports(op) {
        return Err(CollError::Unsupported { dtype: dt, op });
    }
    if len % dt.size() != 0 {
        return Err(CollError::InvalidArgument(format!(
            "{len} bytes is not a whole number of {dt} elements"
        )));
    }
    Ok(())
}

fn check_blocks(len: usize, n: usize, es: usize) -> Result<(), CollError> {
    if len % (n * es) != 0 {
        return Err(CollError::InvalidArgument(format!(
            "{len} bytes is not {n} equal blocks of whole elements"
        )));
    }
    Ok(())
}

fn from_bytes<T: Element>(b: &[u8]) -> Result<Vec<T>, CollError> {
    if b.len() % size_of::<T>() != 0 {
        return Err(CollError::InvalidArgument(format!(
            "{} bytes is not whole {} elements",
            b.len(),
            T::DTYPE
        )));
    }
    let mut v = vec![T::zeroed(); b.len() / size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
    Ok(v)
}

impl Shared {
    /// Runs `plan` over `buf` on the calling thread, after every posted operation.
    fn run(
        &self,
        what: &str,
        plan: Plan,
        buf: &mut [u8],
        red: Option<(DataType, ReduceOp)>,
        timeout: Duration,
    ) -> Result<(), CollError> {
        self.run_src(what, plan, &[], buf, red, timeout)
    }

    /// [`Self::run`] with a read-only source buffer (`net::SRC` in the plan's regions).
    fn run_src(
        &self,
        what: &str,
        plan: Plan,
        src: &[u8],
        buf: &mut [u8],
        red: Option<(DataType, ReduceOp)>,
        timeout: Duration,
    ) -> Result<(), CollError> {
        let deadline = Instant::now() + timeout;
        let rank = self.rank;
        let phase = || what.to_string();
        self.status.check(&phase)?;
        let mut guard = lock(&self.net);
        let Some(net) = guard.as_mut() else {
            return Err(CollError::InvalidArgument(format!(
                "rank {rank}: communicator closed"
            )));
        };
        let mut temps: Vec<Vec<u8>> = plan.temps.iter().map(|l| vec![0u8; *l]).collect();
        let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(1 + temps.len());
        bufs.push(buf);
        bufs.extend(temps.iter_mut().map(Vec::as_mut_slice));
        for ph in plan.phases {
            match ph {
                Phase::X(name, x) => {
                    let ph = || {
                        if name.starts_with(what) {
                            name.clone()
                        } else {
                            format!("{what}: {name}")
                        }
                    };
                    net.run(&x, &mut bufs, src, red, deadline, timeout, &ph)?;
                }
                Phase::Local(f) => f(&mut bufs)?,
            }
        }
        Ok(())
    }

    fn allreduce_algo(&self, bytes: usize) -> Allreduce {
        let n = self.size;
        // Direct folds in rank order: the deterministic order in one round. (Under Auto it
        // loses to recursive doubling with blocking waits: n−1 messages to wake for.)
        let direct_fits = n >= 3 && bytes.saturating_mul(n - 1) <= self.opts.small_bytes / 2;
        if self.opts.deterministic {
            return if direct_fits || self.opts.algorithm == Algorithm::Direct {
                Allreduce::Direct
            } else {
                Allreduce::Deterministic
            };
        }
        match self.opts.algorithm {
            Algorithm::Ring => Allreduce::Ring,
            Algorithm::HalvingDoubling => Allreduce::HalvingDoubling,
            Algorithm::RecursiveDoubling => Allreduce::RecursiveDoubling,
            Algorithm::Direct => Allreduce::Direct,
            Algorithm::Auto if bytes <= self.opts.small_bytes => Allreduce::RecursiveDoubling,
            Algorithm::Auto => Allreduce::Ring,
        }
    }

    fn allreduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        t: Duration,
    ) -> Result<(), CollError> {
        check_op(dt, op, buf.len())?;
        if buf.is_empty() {
            return self.status.check(&|| "allreduce".into());
        }
        let algo = self.allreduce_algo(buf.len());
        let count = buf.len() / dt.size();
        let plan = algo::allreduce(algo, dt, op, self.rank, self.size, count, false);
        self.run("allreduce", plan, buf, Some((dt, op)), t)
    }

    /// Out of place: the ring reads `send` where it is (no copy into `recv` first); the
    /// other algorithms copy it into `recv` and run in place.
    fn allreduce_out_of_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
        t: Duration,
    ) -> Result<(), CollError> {
        check_op(dt, op, send.len())?;
        let algo = self.allreduce_algo(send.len());
        if send.is_empty() || !algo::ring_from_source(algo, self.size) {
            recv.copy_from_slice(send);
            return self.allreduce_in_place(dt, op, recv, t);
        }
        let count = send.len() / dt.size();
        let plan = algo::allreduce(algo, dt, op, self.rank, self.size, count, true);
        self.run_src("allreduce", plan, send, recv, Some((dt, op)), t)
    }

    fn reduce_scatter_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        t: Duration,
    ) -> Result<(), CollError> {
        check_op(dt, op, buf.len())?;
        check_blocks(buf.len(), self.size, dt.size())?;
        if buf.is_empty() {
            return self.status.check(&|| "reduce_scatter".into());
        }
        let ring = !self.opts.deterministic
            && match self.opts.algorithm {
                Algorithm::Auto => buf.len() > self.opts.small_bytes,
                Algorithm::Ring
                | Algorithm::HalvingDoubling
                | Algorithm::RecursiveDoubling
                | Algorithm::Direct => true,
            };
        let count = buf.len() / self.size / dt.size();
        let plan = algo::reduce_scatter(ring, dt, op, self.rank, self.size, count);
        self.run("reduce_scatter", plan, buf, Some((dt, op)), t)
    }

    fn allgather_in_place(&self, buf: &mut [u8], t: Duration) -> Result<(), CollError> {
        if buf.len() % self.size != 0 {
            return Err(CollError::InvalidArgument(format!(
                "allgather: {} bytes is not {} equal blocks",
                buf.len(),
                self.size
            )));
        }
        if buf.is_empty() {
            return self.status.check(&|| "allgather".into());
        }
        let ring = match self.opts.algorithm {
            Algorithm::Auto => buf.len() > self.opts.small_bytes,
            _ => true,
        };
        let plan = algo::allgather(ring, self.rank, self.size, buf.len() / self.size);
        self.run("allgather", plan, buf, None, t)
    }

    fn broadcast(&self, buf: &mut [u8], root: usize, t: Duration) -> Result<(), CollError> {
        if root >= self.size {
            return Err(CollError::InvalidArgument(format!(
                "root {root} out of range"
            )));
        }
        if buf.is_empty() {
            return self.status.check(&|| "broadcast".into());
        }
        let tree = buf.len() <= self.opts.small_bytes || self.size <= 2;
        let plan = algo::broadcast(tree, self.rank, self.size, root, buf.len());
        self.run("broadcast", plan, buf, None, t)
    }

    fn reduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        root: usize,
        t: Duration,
    ) -> Result<(), CollError> {
        check_op(dt, op, buf.len())?;
        if root >= self.size {
            return Err(CollError::InvalidArgument(format!(
                "root {root} out of range"
            )));
        }
        if buf.is_empty() {
            return self.status.check(&|| "reduce".into());
        }
        let a = if self.opts.deterministic {
            ReduceAlgo::Deterministic
        } else if buf.len() <= self.opts.small_bytes && self.opts.algorithm == Algorithm::Auto {
            ReduceAlgo::Tree
        } else {
            ReduceAlgo::Ring
        };
        let plan = algo::reduce(a, dt, op, self.rank, self.size, root, buf.len() / dt.size());
        self.run("reduce", plan, buf, Some((dt, op)), t)
    }

    fn p2p(&self, buf: &mut [u8], peer: usize, send: bool, t: Duration) -> Result<(), CollError> {
        if peer >= self.size || peer == self.rank {
            return Err(CollError::InvalidArgument(format!(
                "peer {peer} out of range or this rank"
            )));
        }
        let plan = if send {
            algo::send(peer, buf.len())
        } else {
            algo::recv(peer, buf.len())
        };
        self.run(if send { "send" } else { "recv" }, plan, buf, None, t)
    }

    fn barrier(&self, t: Duration) -> Result<(), CollError> {
        self.run(
            "barrier",
            algo::barrier(self.rank, self.size),
            &mut [],
            None,
            t,
        )
    }

    /// Waits until no posted operation is pending (a blocking call runs after them).
    fn wait_idle(&self, timeout: Duration) -> Result<(), CollError> {
        let deadline = Instant::now() + timeout;
        let mut p = lock(&self.pending);
        while *p > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(CollError::Timeout {
                    rank: self.rank,
                    peer: None,
                    phase: "waiting for the operations posted before".into(),
                    after: timeout,
                });
            }
            p = self
                .idle
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }
}

impl CallScope<'_> {
    fn sh(&self) -> Result<&Shared, CollError> {
        let s = &*self.comm.shared;
        s.wait_idle(self.timeout)?;
        Ok(s)
    }

    /// Allreduce, out of place: `recv = op over ranks of send` (`send.len() ==
    /// recv.len()`, whole elements).
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] / [`CollError::Unsupported`] for bad arguments;
    /// [`CollError::Timeout`], [`CollError::Aborted`], [`CollError::PeerFailed`],
    /// [`CollError::Transport`] naming the rank and phase.
    pub fn allreduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        if send.len() != recv.len() {
            return Err(CollError::InvalidArgument(format!(
                "allreduce: send {} bytes, recv {} bytes",
                send.len(),
                recv.len()
            )));
        }
        self.sh()?
            .allreduce_out_of_place(dt, op, send, recv, self.timeout)
    }
    /// Allreduce in place.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allreduce_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.sh()?.allreduce_in_place(dt, op, buf, self.timeout)
    }
    /// Reduce-scatter: `send` holds `size` blocks of `recv.len()` bytes; `recv` gets block
    /// `rank` reduced over the ranks.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce_scatter_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        let n = self.comm.size();
        if send.len() != recv.len() * n {
            return Err(CollError::InvalidArgument(format!(
                "reduce_scatter: send {} bytes, recv {} bytes, {n} ranks (send = recv × ranks)",
                send.len(),
                recv.len()
            )));
        }
        let mut work = send.to_vec();
        self.reduce_scatter_in_place_raw(dt, op, &mut work)?;
        let r = self.comm.rank();
        recv.copy_from_slice(&work[r * recv.len()..(r + 1) * recv.len()]);
        Ok(())
    }
    /// Reduce-scatter in place (as NCCL with `recvbuff = sendbuff + rank · count`): the
    /// result is block `rank` of `buf`; the other blocks are clobbered.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce_scatter_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.sh()?
            .reduce_scatter_in_place(dt, op, buf, self.timeout)
    }
    /// Allgather: `recv` (`size · send.len()` bytes) gets every rank's `send` in rank order.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allgather_raw(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        let (n, r) = (self.comm.size(), self.comm.rank());
        if recv.len() != send.len() * n {
            return Err(CollError::InvalidArgument(format!(
                "allgather: send {} bytes, recv {} bytes, {n} ranks (recv = send × ranks)",
                send.len(),
                recv.len()
            )));
        }
        recv[r * send.len()..(r + 1) * send.len()].copy_from_slice(send);
        self.allgather_in_place_raw(recv)
    }
    /// Allgather in place: this rank's block is already at `rank · len / size` of `buf`.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allgather_in_place_raw(&self, buf: &mut [u8]) -> Result<(), CollError> {
        self.sh()?.allgather_in_place(buf, self.timeout)
    }
    /// Broadcast of `buf` from `root`.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn broadcast_raw(&self, buf: &mut [u8], root: usize) -> Result<(), CollError> {
        self.sh()?.broadcast(buf, root, self.timeout)
    }
    /// Reduce to `root`: on the root `recv` gets the reduction of every rank's `send`;
    /// elsewhere `recv` is untouched.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        if send.len() != recv.len() {
            return Err(CollError::InvalidArgument(format!(
                "reduce: send {} bytes, recv {} bytes",
                send.len(),
                recv.len()
            )));
        }
        let mut work = send.to_vec();
        self.sh()?
            .reduce_in_place(dt, op, &mut work, root, self.timeout)?;
        if self.comm.rank() == root {
            recv.copy_from_slice(&work);
        }
        Ok(())
    }
    /// Reduce in place: on the root `buf` becomes the reduction of every rank's `buf`;
    /// elsewhere `buf` is left as it was (the reduction runs on a copy there).
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce_in_place_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        if self.comm.rank() == root {
            self.sh()?.reduce_in_place(dt, op, buf, root, self.timeout)
        } else {
            let mut work = buf.to_vec();
            self.sh()?
                .reduce_in_place(dt, op, &mut work, root, self.timeout)
        }
    }
    /// Sends `buf` to `peer`.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn send_raw(&self, buf: &[u8], peer: usize) -> Result<(), CollError> {
        self.comm.check_peer(peer)?;
        let mut b = buf.to_vec();
        self.sh()?.p2p(&mut b, peer, true, self.timeout)
    }
    /// Receives exactly `buf.len()` bytes from `peer`.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn recv_raw(&self, buf: &mut [u8], peer: usize) -> Result<(), CollError> {
        self.comm.check_peer(peer)?;
        self.sh()?.p2p(buf, peer, false, self.timeout)
    }
    /// A barrier.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn barrier(&self) -> Result<(), CollError> {
        self.sh()?.barrier(self.timeout)
    }
    /// Typed allreduce, out of place.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allreduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.allreduce_raw(
            T::DTYPE,
            op,
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
        )
    }
    /// Typed allreduce in place.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allreduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.allreduce_in_place_raw(T::DTYPE, op, bytemuck::cast_slice_mut(buf))
    }
    /// Typed reduce-scatter.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollError> {
        self.reduce_scatter_raw(
            T::DTYPE,
            op,
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
        )
    }
    /// Typed allgather.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn allgather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollError> {
        self.allgather_raw(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }
    /// Typed broadcast.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollError> {
        self.broadcast_raw(bytemuck::cast_slice_mut(buf), root)
    }
    /// Typed reduce.
    ///
    /// # Errors
    /// As [`Self::allreduce_raw`].
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollError> {
        self.reduce_raw(
            T::DTYPE,
            op,
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
            root,
        )
    }
    /// Non-blocking allreduce in place with this scope's timeout.
    ///
    /// # Errors
    /// As [`Communicator::iallreduce_raw`].
    pub fn iallreduce_raw(
        &self,
        dt: DataType,
        op: ReduceOp,
        mut buf: Vec<u8>,
    ) -> Result<Handle, CollError> {
        check_op(dt, op, buf.len())?;
        self.comm.post_with(self.timeout, move |s, t| {
            s.allreduce_in_place(dt, op, &mut buf, t)?;
            Ok(buf)
        })
    }
}
