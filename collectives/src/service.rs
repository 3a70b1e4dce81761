//! Every rank's TCP service, and the monitor.
//!
//! Each rank listens on one TCP port (rank 0 of a [`crate::Bootstrap::Tcp`] on the store's
//! address; the others on their device's address, port chosen by the kernel) and answers:
//!
//! - **exchange** `{tag, size, rank, blob}`: kept until `size` ranks sent the same tag, then
//!   every one gets all blobs in rank order (the TCP store; also how `shrink` meets again);
//! - **query** `{tag}`: which ranks have sent that tag so far (to name the missing ranks
//!   when an exchange times out);
//! - **monitor** `{comm, size, rank}`: a connection every rank of a communicator keeps open
//!   to its rank 0's service for the communicator's life. A connection that ends without a
//!   goodbye (the process died: the kernel closes its sockets) makes the service tell every
//!   other member `failed(rank)` at once; an `abort(by)` from one member is relayed to all.
//!   This is how a killed rank and an abort reach every rank well within a second: a UDP
//!   datapath has no connection reset of its own.
//! - **heartbeats** (UDP, on the service's port when free): a process that is still there
//!   but unreachable (its host vanished, or its packets are all dropped) closes no socket.
//!   So every member pings rank 0's service every [`HB_INTERVAL`] (100 ms) over UDP and the
//!   service answers each ping; a member the service has not heard from for [`HB_SILENCE`]
//!   (700 ms) is announced failed to the others (`silent(rank)`) and its monitor connection
//!   closed, and a member that has had no answer for as long marks rank 0 failed. The first
//!   port number of the heartbeat socket is the first frame on a monitor connection.
//!
//!   Why UDP and these numbers: a heartbeat must not be held up by the retransmission of an
//!   earlier one. On TCP two losses of one segment in a row (1 % of the pings at 10 % loss,
//!   which the loss drills apply to every packet) already stall the stream 600 ms (RTO 200
//!   ms, then 400); over UDP 700 ms of silence at 100 ms pings takes 7 losses in a row
//!   (a round is lost with 1 − 0.9² = 0.19 at 10 % loss, seven in a row ≈ 10⁻⁵ per 100 ms:
//!   a false failure in about 3 h per member at 10 % loss, none at 1 %). Under CPU load a
//!   sleeping thread is woken within milliseconds by the scheduler (wakeup preemption), but
//!   a whole process can be descheduled for longer (load 10+ on 2 cores here): the watcher
//!   that finds a silence restarts every count instead when its own loop overslept
//!   ([`HB_OVERSLEEP`]), so a stall of the watcher never reads as the silence of others. A
//!   silence declared within 700–750 ms plus the notice on TCP keeps the issue's bound ("a
//!   killed rank is detected by the others within 1 s") for a host that vanishes too.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::codec::{read_frame, write_frame, Dec, Enc};
use crate::error::CollError;
use crate::status::Status;

const EXCHANGE: u8 = 1;
const MONITOR: u8 = 2;
const QUERY: u8 = 3;
const ABORT: u8 = 10;
const BYE: u8 = 11;
const FAILED: u8 = 12;
const CLOSING: u8 = 13;
const SILENT: u8 = 14;
const HB_PORT: u8 = 15;
/// How often a member pings rank 0's service (see the module docs).
pub(crate) const HB_INTERVAL: Duration = Duration::from_millis(100);
/// The silence after which a member (for the service) or rank 0 (for a member) has failed.
pub(crate) const HB_SILENCE: Duration = Duration::from_millis(700);
/// A watcher loop that took longer than this was descheduled: it restarts its counts.
const HB_OVERSLEEP: Duration = Duration::from_millis(300);
/// How long a heartbeat socket's receive waits (the watchers' tick).
const HB_TICK: Duration = Duration::from_millis(50);
const PING: u8 = 1;
/// The most ranks an exchange accepts.
const MAX_RANKS: u32 = 1 << 16;

type Group = HashMap<u32, (Vec<u8>, TcpStream)>;

#[derive(Default)]
struct MonGroup {
    members: HashMap<u32, TcpStream>,
    /// Messages every later member gets at once (an abort, failures).
    history: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Shared {
    exchanges: Mutex<HashMap<u64, (u32, Group)>>,
    monitors: Mutex<HashMap<u64, MonGroup>>,
    stop: AtomicBool,
    /// When each monitor member `(comm, rank)` was last heard (pinged, or joined).
    heard: Mutex<HashMap<(u64, u32), Instant>>,
    /// The heartbeat socket's port (0: none).
    hb_port: u16,
    /// Tests: the service stops answering pings (its host "vanished").
    hb_paused: AtomicBool,
}

/// A rank's listening service (see the module docs). Stops when dropped.
pub(crate) struct Service {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    heartbeat: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("addr", &self.addr).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Service {
    /// Listens on `addr` (port 0: any) and starts serving.
    pub(crate) fn start(addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let mut addr = listener.local_addr()?;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        // The heartbeat socket: the service's own port number when it is free for UDP.
        let hb = UdpSocket::bind(SocketAddr::new(addr.ip(), addr.port()))
            .or_else(|_| UdpSocket::bind(SocketAddr::new(addr.ip(), 0)))?;
        hb.set_read_timeout(Some(HB_TICK))?;
        let shared = Arc::new(Shared {
            hb_port: hb.local_addr()?.port(),
            ..Shared::default()
        });
        let s = shared.clone();
        let heartbeat = std::thread::Builder::new()
            .name("coll-heartbeat".into())
            .spawn(move || heartbeat_watch(&s, &hb))?;
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("coll-service".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else {
                        // Out of descriptors or the like: do not spin on it.
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("coll-service-conn".into())
                        .spawn(move || serve(&s, conn));
                }
            })?;
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
            heartbeat: Some(heartbeat),
        })
    }

    /// Where peers reach it.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Publishes `addr` instead of the bound one (a store bound to every interface is
    /// reached at the address the ranks were given).
    pub(crate) fn set_public_addr(&mut self, addr: SocketAddr) {
        self.addr = addr;
    }
}

impl Service {
    /// Stops answering heartbeats but keeps every connection open, as a host that vanished
    /// (tests of failure detection).
    pub(crate) fn pause_heartbeats(&self) {
        self.shared.hb_paused.store(true, Ordering::Release);
    }

    /// Stops as a killed process would: the members' connections close without the
    /// closing notice (tests of failure detection).
    pub(crate) fn crash(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, g) in lock(&self.shared.monitors).drain() {
            for (_, s) in g.members {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, g) in lock(&self.shared.monitors).drain() {
            for (_, mut s) in g.members {
                let _ = write_frame(&mut s, &[CLOSING]);
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for (_, (size, g)) in lock(&self.shared.exchanges).drain() {
            // Tell the ranks still waiting who never came, then close.
            let missing: Vec<u32> = (0..size).filter(|r| !g.contains_key(r)).collect();
            let mut e = Enc::default();
            e.u8(2).u32(missing.len() as u32);
            for r in missing {
                e.u32(r);
            }
            for (_, (_, mut s)) in g {
                let _ = write_frame(&mut s, &e.0);
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        if let Some(t) = self.heartbeat.take() {
            let _ = t.join();
        }
    }
}

fn serve(s: &Shared, mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(hello) = read_frame(&mut conn) else {
        return;
    };
    let _ = conn.set_read_timeout(None);
    let mut d = Dec(&hello);
    let Ok(kind) = d.u8() else { return };
    match kind {
        EXCHANGE => {
            let (Ok(tag), Ok(size), Ok(rank), Ok(blob)) = (d.u64(), d.u32(), d.u32(), d.bytes())
            else {
                return;
            };
            let blob = blob.to_vec();
            if rank >= size || size > MAX_RANKS {
                return;
            }
            let mut ex = lock(&s.exchanges);
            let entry = ex.entry(tag).or_insert_with(|| (size, Group::new()));
            if entry.0 != size {
                let mut e = Enc::default();
                e.u8(0).bytes(
                    format!(
                        "rank {rank} says {size} ranks, the first to arrive said {}",
                        entry.0
                    )
                    .as_bytes(),
                );
                let _ = write_frame(&mut conn, &e.0);
                return;
            }
            entry.1.insert(rank, (blob, conn));
            if entry.1.len() == size as usize {
                let (_, group) = ex.remove(&tag).unwrap_or_default();
                drop(ex);
                let mut all = Enc::default();
                all.u8(1).u32(size);
                for r in 0..size {
                    all.bytes(group.get(&r).map(|(b, _)| &b[..]).unwrap_or_default());
                }
                for (_, (_, mut c)) in group {
                    let _ = write_frame(&mut c, &all.0);
                }
            }
        }
        QUERY => {
            let Ok(tag) = d.u64() else { return };
            let mut present: Vec<u32> = lock(&s.exchanges)
                .get(&tag)
                .map(|(_, g)| g.keys().copied().collect())
                .unwrap_or_default();
            present.sort_unstable();
            let mut e = Enc::default();
            e.u32(present.len() as u32);
            for r in present {
                e.u32(r);
            }
            let _ = write_frame(&mut conn, &e.0);
        }
        MONITOR => {
            let (Ok(comm), Ok(_size), Ok(rank)) = (d.u64(), d.u32(), d.u32()) else {
                return;
            };
            let Ok(writer) = conn.try_clone() else { return };
            {
                let mut mons = lock(&s.monitors);
                let g = mons.entry(comm).or_default();
                let mut w = writer;
                let _ = w.set_write_timeout(Some(Duration::from_millis(200)));
                let mut e = Enc::default();
                e.u8(HB_PORT).u32(u32::from(s.hb_port));
                let _ = write_frame(&mut w, &e.0);
                lock(&s.heard).insert((comm, rank), Instant::now());
                for m in &g.history {
                    let _ = write_frame(&mut w, m);
                }
                g.members.insert(rank, w);
            }
            monitor_member(s, comm, rank, conn);
        }
        _ => {}
    }
}

/// Reads one member's monitor connection until it ends.
fn monitor_member(s: &Shared, comm: u64, rank: u32, mut conn: TcpStream) {
    let clean = loop {
        let Ok(msg) = read_frame(&mut conn) else {
            break false;
        };
        match msg.first() {
            Some(&ABORT) => broadcast(s, comm, &msg, None),
            Some(&BYE) => break true,
            _ => {}
        }
    };
    if s.stop.load(Ordering::Acquire) {
        return;
    }
    lock(&s.heard).remove(&(comm, rank));
    let was_member = lock(&s.monitors)
        .get_mut(&comm)
        .and_then(|g| g.members.remove(&rank))
        .is_some();
    // Not a member any more: the heartbeat watcher declared it silent already.
    if !clean && was_member {
        let mut e = Enc::default();
        e.u8(FAILED).u32(rank);
        broadcast(s, comm, &e.0, Some(rank));
    }
}

/// The service's heartbeat thread: answers members' pings and declares a member silent for
/// [`HB_SILENCE`] failed (see the module docs).
fn heartbeat_watch(s: &Shared, sock: &UdpSocket) {
    let mut buf = [0u8; 64];
    let mut last_tick = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            let mut d = Dec(&buf[..n]);
            if let (Ok(PING), Ok(comm), Ok(rank)) = (d.u8(), d.u64(), d.u32()) {
                if !s.hb_paused.load(Ordering::Acquire) {
                    if let Some(t) = lock(&s.heard).get_mut(&(comm, rank)) {
                        *t = Instant::now();
                    }
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        }
        let now = Instant::now();
        let overslept = now.duration_since(last_tick) > HB_OVERSLEEP;
        last_tick = now;
        let silent: Vec<(u64, u32)> = {
            let mut heard = lock(&s.heard);
            if overslept {
                // This thread was descheduled: what looks like silence may be its own.
                heard.values_mut().for_each(|t| *t = now);
                continue;
            }
            if s.hb_paused.load(Ordering::Acquire) {
                continue;
            }
            let silent: Vec<_> = heard
                .iter()
                .filter(|(_, t)| now.duration_since(**t) > HB_SILENCE)
                .map(|(k, _)| *k)
                .collect();
            for k in &silent {
                heard.remove(k);
            }
            silent
        };
        for (comm, rank) in silent {
            let gone = lock(&s.monitors)
                .get_mut(&comm)
                .and_then(|g| g.members.remove(&rank));
            if let Some(c) = gone {
                let _ = c.shutdown(Shutdown::Both);
                let mut e = Enc::default();
                e.u8(SILENT).u32(rank);
                broadcast(s, comm, &e.0, Some(rank));
            }
        }
    }
}

fn broadcast(s: &Shared, comm: u64, msg: &[u8], except: Option<u32>) {
    let mut mons = lock(&s.monitors);
    let Some(g) = mons.get_mut(&comm) else { return };
    g.history.push(msg.to_vec());
    for (r, w) in &mut g.members {
        if Some(*r) != except {
            let _ = write_frame(w, msg);
        }
    }
}

fn connect_until(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &addr,
            left.clamp(Duration::from_millis(1), Duration::from_secs(1)),
        ) {
            Ok(c) => {
                let _ = c.set_nodelay(true);
                return Ok(c);
            }
            Err(e) if Instant::now() + Duration::from_millis(50) >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The TCP store's client: sends `blob` under `tag` to the service at `addr` and returns all
/// ranks' blobs. Retries the connection until `deadline` (the store may not listen yet).
pub(crate) fn exchange(
    addr: SocketAddr,
    tag: u64,
    rank: usize,
    size: usize,
    blob: &[u8],
    deadline: Instant,
) -> Result<Vec<Vec<u8>>, CollError> {
    let fail = |what: String| CollError::Bootstrap(format!("rank {rank}: {what}"));
    let start = Instant::now();
    let mut c = connect_until(addr, deadline)
        .map_err(|e| fail(format!("cannot reach the store at {addr}: {e}")))?;
    let mut e = Enc::default();
    e.u8(EXCHANGE)
        .u64(tag)
        .u32(size as u32)
        .u32(rank as u32)
        .bytes(blob);
    write_frame(&mut c, &e.0).map_err(|e| fail(format!("store {addr}: {e}")))?;
    let left = deadline.saturating_duration_since(Instant::now());
    // The store's own rank (rank 0) gives up at its deadline and then tells the others who
    // never came; they wait a little longer for that.
    let grace = if rank == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(500)
    };
    let _ = c.set_read_timeout(Some(left.max(Duration::from_millis(1)) + grace));
    let reply = match read_frame(&mut c) {
        Ok(r) => r,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            let missing = query_missing(addr, tag, size)
                .map(|m| format!("; missing ranks: {m:?}"))
                .unwrap_or_default();
            return Err(CollError::Timeout {
                rank,
                peer: None,
                phase: format!("bootstrap exchange through the store at {addr}{missing}"),
                after: left,
            });
        }
        Err(e) => return Err(fail(format!("store {addr}: {e}"))),
    };
    let mut d = Dec(&reply);
    let bad = || fail(format!("store {addr}: malformed reply"));
    match d.u8().map_err(|_| bad())? {
        1 => {}
        2 => {
            let n = d.u32().map_err(|_| bad())?;
            let missing = (0..n)
                .map(|_| d.u32().map(|r| r as usize))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad())?;
            return Err(CollError::Timeout {
                rank,
                peer: missing.first().copied(),
                phase: format!(
                    "bootstrap exchange through the store at {addr} (the store gave up); \
                     missing ranks: {missing:?}"
                ),
                after: start.elapsed(),
            });
        }
        _ => {
            let why = d.bytes().map_err(|_| bad())?;
            return Err(fail(String::from_utf8_lossy(why).into_owned()));
        }
    }
    let n = d.u32().map_err(|_| bad())? as usize;
    if n != size {
        return Err(bad());
    }
    (0..n)
        .map(|_| d.bytes().map(<[u8]>::to_vec).map_err(|_| bad()))
        .collect()
}

fn query_missing(addr: SocketAddr, tag: u64, size: usize) -> Option<Vec<usize>> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    let mut e = Enc::default();
    e.u8(QUERY).u64(tag);
    write_frame(&mut c, &e.0).ok()?;
    let r = read_frame(&mut c).ok()?;
    let mut d = Dec(&r);
    let n = d.u32().ok()?;
    let mut present = Vec::new();
    for _ in 0..n {
        present.push(d.u32().ok()? as usize);
    }
    if present.is_empty() {
        return None;
    }
    Some((0..size).filter(|r| !present.contains(r)).collect())
}

/// A member's end of its communicator's monitor connection. Dropping it says goodbye.
pub(crate) struct MonitorClient {
    writer: Mutex<TcpStream>,
    stopping: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    /// Tests: no more pings, no goodbye, the connection stays open (a vanished host).
    vanished: Arc<AtomicBool>,
}

impl std::fmt::Debug for MonitorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MonitorClient")
    }
}

impl MonitorClient {
    /// Joins communicator `comm`'s monitor at rank `root`'s service `addr`; failures and
    /// aborts it hears of go into `status`.
    pub(crate) fn join(
        addr: SocketAddr,
        comm: u64,
        root: usize,
        size: usize,
        status: Arc<Status>,
        deadline: Instant,
    ) -> Result<Self, CollError> {
        let rank = status.rank;
        let fail = |e: io::Error| {
            CollError::Bootstrap(format!("rank {rank}: joining the monitor at {addr}: {e}"))
        };
        let mut c = connect_until(addr, deadline).map_err(fail)?;
        let mut e = Enc::default();
        e.u8(MONITOR).u64(comm).u32(size as u32).u32(rank as u32);
        write_frame(&mut c, &e.0).map_err(fail)?;
        let mut r = c.try_clone().map_err(fail)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let vanished = Arc::new(AtomicBool::new(false));
        let hb_port = Arc::new(AtomicU32::new(0));
        let sock = UdpSocket::bind(SocketAddr::new(c.local_addr().map_err(fail)?.ip(), 0))
            .map_err(fail)?;
        sock.set_read_timeout(Some(HB_TICK)).map_err(fail)?;
        let heartbeat = {
            let (stop, vanished, port, status) = (
                stopping.clone(),
                vanished.clone(),
                hb_port.clone(),
                status.clone(),
            );
            let ping = {
                let mut e = Enc::default();
                e.u8(PING).u64(comm).u32(rank as u32);
                e.0
            };
            std::thread::Builder::new()
                .name("coll-heartbeat".into())
                .spawn(move || {
                    member_heartbeat(
                        &sock,
                        addr.ip(),
                        &ping,
                        root,
                        &port,
                        &stop,
                        &vanished,
                        &status,
                    );
                })
                .map_err(fail)?
        };
        let stop = stopping.clone();
        let reader = std::thread::Builder::new()
            .name("coll-monitor".into())
            .spawn(move || loop {
                let Ok(msg) = read_frame(&mut r) else {
                    // No monitor any more: no heartbeats either.
                    hb_port.store(u32::MAX, Ordering::Release);
                    if !stop.load(Ordering::Acquire) {
                        status.set_failed(
                            root,
                            "the monitor connection to it broke (its process died?)",
                        );
                    }
                    return;
                };
                let mut d = Dec(&msg);
                match (d.u8(), d.u32()) {
                    (Ok(ABORT), Ok(by)) => {
                        status.set_aborted(by as usize);
                    }
                    (Ok(FAILED), Ok(who)) => status.set_failed(
                        who as usize,
                        "its monitor connection closed without a goodbye (its process died?)",
                    ),
                    (Ok(SILENT), Ok(who)) => status.set_failed(
                        who as usize,
                        "no heartbeat from it for 700 ms (its host is gone or its packets are \
                         dropped?)",
                    ),
                    (Ok(HB_PORT), Ok(p)) => hb_port.store(p, Ordering::Release),
                    (Ok(CLOSING), _) => {
                        // Rank 0 left: the others go on without a monitor (crate docs).
                        hb_port.store(u32::MAX, Ordering::Release);
                        return;
                    }
                    _ => {}
                }
            })
            .map_err(fail)?;
        Ok(Self {
            writer: Mutex::new(c),
            stopping,
            reader: Mutex::new(Some(reader)),
            heartbeat: Mutex::new(Some(heartbeat)),
            vanished,
        })
    }

    /// Tells every member that `by` aborted.
    pub(crate) fn send_abort(&self, by: usize) {
        let mut e = Enc::default();
        e.u8(ABORT).u32(by as u32);
        let mut w = lock(&self.writer);
        let _ = w.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = write_frame(&mut *w, &e.0);
    }

    /// Leaves without a goodbye, as a killed process does (tests of failure detection).
    pub(crate) fn crash(&self) {
        self.stopping.store(true, Ordering::Release);
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
        if let Some(t) = lock(&self.reader).take() {
            let _ = t.join();
        }
        if let Some(t) = lock(&self.heartbeat).take() {
            let _ = t.join();
        }
    }

    /// Goes silent as a host that vanished: no more pings, no goodbye on leaving, and the
    /// connection stays open while this client lives (tests of failure detection).
    pub(crate) fn vanish(&self) {
        self.vanished.store(true, Ordering::Release);
    }

    /// Says goodbye and closes (idempotent; nothing after [`Self::vanish`]).
    pub(crate) fn leave(&self) {
        if self.vanished.load(Ordering::Acquire) {
            return;
        }
        let Some(t) = lock(&self.reader).take() else {
            return;
        };
        self.stopping.store(true, Ordering::Release);
        if let Some(h) = lock(&self.heartbeat).take() {
            let _ = h.join();
        }
        {
            let mut w = lock(&self.writer);
            let _ = w.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = write_frame(&mut *w, &[BYE]);
            let _ = w.flush();
            let _ = w.shutdown(Shutdown::Both);
        }
        let _ = t.join();
    }
}

/// A member's heartbeat thread: pings rank 0's service every [`HB_INTERVAL`] and marks rank
/// `root` failed after [`HB_SILENCE`] without an answer (see the module docs).
#[allow(clippy::too_many_arguments)]
fn member_heartbeat(
    sock: &UdpSocket,
    ip: IpAddr,
    ping: &[u8],
    root: usize,
    port: &AtomicU32,
    stop: &AtomicBool,
    vanished: &AtomicBool,
    status: &Status,
) {
    let mut buf = [0u8; 64];
    let mut last_ping: Option<Instant> = None;
    let mut answered = Instant::now();
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if vanished.load(Ordering::Acquire) {
            std::thread::sleep(HB_TICK);
            continue;
        }
        if now.duration_since(last_tick) > HB_OVERSLEEP {
            // Descheduled: what looks like silence may be this thread's own.
            answered = now;
        }
        last_tick = now;
        let p = port.load(Ordering::Acquire);
        let Ok(p) = u16::try_from(p) else { return };
        if p == 0 {
            // The port comes as the monitor's first frame.
            answered = now;
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        if last_ping.is_none_or(|t| now.duration_since(t) >= HB_INTERVAL) {
            let _ = sock.send_to(ping, SocketAddr::new(ip, p));
            last_ping = Some(now);
        }
        if let Ok(n) = sock.recv(&mut buf) {
            if buf[..n] == *ping {
                answered = Instant::now();
            }
        }
        if answered.elapsed() > HB_SILENCE && !stop.load(Ordering::Acquire) {
            status.set_failed(
                root,
                "no answer to its heartbeats for 700 ms (its host is gone or its packets are \
                 dropped?)",
            );
            return;
        }
    }
}

impl Drop for MonitorClient {
    fn drop(&mut self) {
        self.leave();
    }
}
