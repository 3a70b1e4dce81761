//! The reference blaster: "the limit" every rocectl figure is divided by.
//!
//! Raw UDP between two sockets, one sender thread and one receiver thread, with the datagram
//! sizes our RoCE packets have on the wire, so that a figure of ours divided by the matching
//! figure here says how much of what the kernel's UDP path can carry we actually get.
//!
//! # Datagram sizes
//!
//! A full-size RoCE v2 data packet at path MTU `p` is one UDP datagram with payload
//! `12 (BTH) + p + 4 (ICRC)` bytes ([`datagram_len`]): 272, 528, 1040, 2064 and 4112 bytes for
//! PMTU 256…4096. The RETH (16 bytes) that only the first packet of an RDMA WRITE carries is
//! ignored. Two small sizes serve the message-rate figures: [`ATOMIC_LEN`] (44 bytes, an
//! atomic request: BTH + AtomicETH + ICRC) and [`UD64_LEN`] (88 bytes, a UD SEND of 64 bytes:
//! BTH + DETH + 64 + ICRC). On the wire add 8 (UDP) + 20 (IPv4) bytes; a PMTU-4096 packet is a
//! 4140-byte IP packet, so the veth link uses MTU 9000.
//!
//! # Modes
//!
//! - [`Mode::Plain`]: `send(2)` / `recv(2)`, one datagram per system call.
//! - [`Mode::Mmsg`]: `sendmmsg(2)` / `recvmmsg(2)`, [`StreamConfig::batch`] datagrams
//!   (default 64) per call.
//! - [`Mode::Gso`]: `UDP_SEGMENT` on the sender (one `send(2)` of up to 64 datagrams, at most
//!   65 507 bytes), `UDP_GRO` on the receiver (`recvmsg(2)`, the segment size read from the
//!   `UDP_GRO` control message). Loopback and veth hand the GSO super-packet to a GRO socket
//!   whole, so both ends pay one system call per batch.
//!
//! Both sockets get 4 MiB send and receive buffers (`SO_*BUFFORCE`; we run as root). The
//! receiver counts what it gets in a fixed window after a warm-up; what the sender sends beyond
//! that is dropped by the kernel and reported as `loss`.
//!
//! # How the receiver waits
//!
//! The `plain` receiver blocks in `recv(2)`. The `mmsg` and `gso` receivers are non-blocking
//! and sleep [`RX_NAP`] (50 µs) in user space whenever a call finds the queue empty
//! ([`StreamConfig::rx_nap`]). A receiver asleep in the kernel makes the *sender* pay a wake-up
//! per datagram or two (`sock_def_readable`, and on this VM an IPI to the other vCPU: 15% of
//! all samples of an 88-byte `mmsg` stream under `perf`); a napping one is never waited on, so
//! the sender only builds and queues datagrams, and the receiver takes ~40 per `recvmmsg`. On
//! the 2-vCPU VM (2026-11-24, load 2.4–2.7) this raised the `mmsg` reference at 88 B from
//! 0.275 to 0.32–0.40 Mdgram/s on loopback and 0.23 to 0.27 on veth, at 44 B 0.26 → 0.40 (lo)
//! and 0.18 → 0.35 (veth), and the `gso` one at 4112 B from 6.8 to 9.6 GB/s on loopback,
//! without loss. A spinning receiver (`rx_busy`) does as well but takes a whole core.
//!
//! # Ping-pong
//!
//! [`run_pingpong`] bounces a 64-byte datagram between a client and a server thread and
//! reports the round-trip time (median, p99, p99.9) with either blocking receives
//! ([`RecvMode::Block`]) or non-blocking receives in a spin loop ([`RecvMode::Busy`]) on both
//! sides.
//!
//! System calls use `std` where it has them and the safe wrappers of the `nix` crate for
//! `sendmmsg`/`recvmmsg`/`recvmsg` and the `UDP_SEGMENT`/`UDP_GRO`/`SO_*BUFFORCE` options
//! (this crate forbids `unsafe`).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use nix::sys::socket::{
    recvmmsg, recvmsg, sendmmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned,
    MsgFlags, MultiHeaders, SockaddrIn,
};
use serde::Serialize;

use crate::netns::{self, Link};
use crate::stats::percentile;

/// Base Transport Header length.
pub const BTH_LEN: usize = roce_wire::bth::HEADER_LEN;
/// Invariant CRC length.
pub const ICRC_LEN: usize = roce_wire::icrc::ICRC_LEN;
/// The RoCE path MTUs.
pub const PMTUS: [usize; 5] = [256, 512, 1024, 2048, 4096];
/// UDP payload of an atomic request: BTH + AtomicETH (28) + ICRC = 44 bytes.
pub const ATOMIC_LEN: usize = BTH_LEN + roce_wire::atomic_eth::HEADER_LEN + ICRC_LEN;
/// UDP payload of a 64-byte UD SEND: BTH + DETH (8) + 64 + ICRC = 88 bytes.
pub const UD64_LEN: usize = BTH_LEN + roce_wire::deth::HEADER_LEN + 64 + ICRC_LEN;
/// Largest UDP payload one GSO send may carry: 65 535 − 20 (IPv4) − 8 (UDP).
pub const GSO_MAX_BYTES: usize = 65_507;
/// Most segments per GSO send we use (the kernel's `UDP_MAX_SEGMENTS` is at least 64).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Largest `sendmmsg`/`recvmmsg` batch.
pub const MAX_BATCH: usize = 64;
/// How long the `mmsg` and `gso` receivers sleep when they find their queue empty
/// ([`StreamConfig::rx_nap`]). 50 µs is 20 datagrams at the 88-byte rate of this machine's
/// loopback, a few kilobytes of the 4 MiB socket buffer.
pub const RX_NAP: Duration = Duration::from_micros(50);

/// UDP payload length of a full RoCE v2 packet at path MTU `pmtu`: BTH + `pmtu` + ICRC.
pub const fn datagram_len(pmtu: usize) -> usize {
    BTH_LEN + pmtu + ICRC_LEN
}

/// How datagrams cross the system-call boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `send`/`recv`, one datagram per call.
    Plain,
    /// `sendmmsg`/`recvmmsg`, a batch per call.
    Mmsg,
    /// UDP GSO on the sender, GRO on the receiver.
    Gso,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Self; 3] = [Self::Plain, Self::Mmsg, Self::Gso];

    /// Lower-case name, as used in measurement ids.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Mmsg => "mmsg",
            Self::Gso => "gso",
        }
    }
}

/// Parameters of one stream cell.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// System-call mode.
    pub mode: Mode,
    /// UDP payload bytes per datagram.
    pub size: usize,
    /// Time to run before counting.
    pub warmup: Duration,
    /// Counting window.
    pub duration: Duration,
    /// Datagrams per `sendmmsg`/`recvmmsg` (1..=64).
    pub batch: usize,
    /// Most datagrams per GSO send (further limited to 65 507 bytes).
    pub gso_segments: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of both sockets.
    pub sock_buf: usize,
    /// Receive with non-blocking calls in a spin loop instead of sleeping in the kernel (not
    /// part of the default sweep: on a shared machine the spinning receiver takes a core).
    pub rx_busy: bool,
    /// Receive with non-blocking calls and, when the queue is empty, sleep this long in user
    /// space (`nanosleep`) instead of in the kernel: the sender never has to wake the receiver
    /// (`sock_def_readable` finds no waiter), which is most of a small datagram's cost on a VM,
    /// where every wake-up of the other vCPU is an IPI. Software interrupt moderation; the
    /// socket buffer absorbs what arrives meanwhile. Takes precedence over `rx_busy`.
    pub rx_nap: Option<Duration>,
}

impl StreamConfig {
    /// Defaults: 0.3 s warm-up, 1 s window, batch 64, 64 GSO segments, 4 MiB buffers; the
    /// `mmsg` and `gso` receivers nap [`RX_NAP`] when their queue is empty (the `plain` one
    /// blocks in `recv`, the naive reference).
    pub fn new(mode: Mode, size: usize) -> Self {
        Self {
            mode,
            size,
            warmup: Duration::from_millis(300),
            duration: Duration::from_secs(1),
            batch: MAX_BATCH,
            gso_segments: GSO_MAX_SEGMENTS,
            sock_buf: 4 << 20,
            rx_busy: false,
            rx_nap: (mode != Mode::Plain).then_some(RX_NAP),
        }
    }

    /// Datagrams per GSO send for this size.
    pub fn gso_count(&self) -> usize {
        self.gso_segments.min(GSO_MAX_BYTES / self.size).max(1)
    }
}

/// What one stream cell measured (rates over the counting window).
#[derive(Clone, Debug, Serialize)]
pub struct StreamResult {
    /// `lo` or `veth`.
    pub link: &'static str,
    /// System-call mode.
    pub mode: Mode,
    /// UDP payload bytes per datagram.
    pub size: usize,
    /// Length of the counting window in seconds.
    pub seconds: f64,
    /// UDP payload bytes received per second.
    pub rx_bytes_per_s: f64,
    /// Datagrams received per second.
    pub rx_datagrams_per_s: f64,
    /// Datagrams sent per second.
    pub tx_datagrams_per_s: f64,
    /// Fraction of the datagrams sent in the window that were not received (dropped by the
    /// kernel when the receiver falls behind).
    pub loss: f64,
    /// Receive system calls per second.
    pub rx_calls_per_s: f64,
    /// Send system calls per second.
    pub tx_calls_per_s: f64,
    /// Datagrams per successful send call (1 in plain mode).
    pub tx_per_call: f64,
    /// Datagrams per successful receive call.
    pub rx_per_call: f64,
    /// Failed send calls (`ENOBUFS`, `ECONNREFUSED`...) in the window.
    pub tx_errors: u64,
    /// Whether the receiver spun on non-blocking calls.
    pub rx_busy: bool,
    /// The receiver's nap when its queue was empty, microseconds (0: it blocked or spun).
    pub rx_nap_us: f64,
}

#[derive(Default)]
struct Counts {
    datagrams: u64,
    bytes: u64,
    calls: u64,
    errors: u64,
}

/// A window of time: counting starts at `start` and stops at `end`.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn add(&self, c: &mut Counts, now: Instant, datagrams: u64, bytes: u64) {
        if now >= self.start && now < self.end {
            c.datagrams += datagrams;
            c.bytes += bytes;
            c.calls += 1;
        }
    }
}

fn set_buffers(sock: &UdpSocket, bytes: usize) {
    // Root may exceed net.core.{r,w}mem_max; otherwise fall back to the capped options.
    if setsockopt(sock, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = setsockopt(sock, sockopt::RcvBuf, &bytes);
    }
    if setsockopt(sock, sockopt::SndBufForce, &bytes).is_err() {
        let _ = setsockopt(sock, sockopt::SndBuf, &bytes);
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Runs one stream cell over `link`: sender on side `a`, receiver on side `b`.
///
/// # Errors
/// When a namespace cannot be entered or a socket cannot be set up (e.g. `UDP_SEGMENT`
/// unsupported), or a thread fails.
pub fn run_stream(link: &Link, cfg: &StreamConfig) -> Result<StreamResult> {
    anyhow::ensure!(
        (1..=MAX_BATCH).contains(&cfg.batch),
        "batch must be 1..={MAX_BATCH}"
    );
    anyhow::ensure!(
        cfg.size >= 1 && cfg.size <= GSO_MAX_BYTES,
        "bad datagram size"
    );
    let t0 = Instant::now() + Duration::from_millis(50);
    let win = Window {
        start: t0 + cfg.warmup,
        end: t0 + cfg.warmup + cfg.duration,
    };
    let (port_tx, port_rx) = mpsc::sync_channel::<SocketAddr>(1);

    let rx = {
        let (side, cfg) = (link.b.clone(), cfg.clone());
        thread::Builder::new()
            .name("blaster-rx".into())
            .spawn(move || -> Result<Counts> {
                netns::enter(side.ns.as_deref())?;
                let sock = UdpSocket::bind((side.addr, 0)).context("bind receiver")?;
                set_buffers(&sock, cfg.sock_buf);
                if cfg.rx_busy || cfg.rx_nap.is_some() {
                    sock.set_nonblocking(true)?;
                } else {
                    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
                }
                if cfg.mode == Mode::Gso {
                    setsockopt(&sock, sockopt::UdpGroSegment, &true).context("UDP_GRO")?;
                }
                port_tx.send(sock.local_addr()?)?;
                receive(&sock, &cfg, win)
            })?
    };
    let tx = {
        let (side, cfg) = (link.a.clone(), cfg.clone());
        thread::Builder::new()
            .name("blaster-tx".into())
            .spawn(move || -> Result<Counts> {
                netns::enter(side.ns.as_deref())?;
                let sock = UdpSocket::bind((side.addr, 0)).context("bind sender")?;
                set_buffers(&sock, cfg.sock_buf);
                let dst = port_rx
                    .recv()
                    .map_err(|_| anyhow!("receiver failed to start"))?;
                sock.connect(dst)?;
                if cfg.mode == Mode::Gso {
                    let seg = i32::try_from(cfg.size)?;
                    setsockopt(&sock, sockopt::UdpGsoSegment, &seg).context("UDP_SEGMENT")?;
                }
                send(&sock, &cfg, win)
            })?
    };
    let tx = tx.join().map_err(|_| anyhow!("sender panicked"))?;
    let rx = rx.join().map_err(|_| anyhow!("receiver panicked"))?;
    let (tx, rx) = (tx?, rx?);
    let secs = cfg.duration.as_secs_f64();
    let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok(StreamResult {
        link: link.name,
        mode: cfg.mode,
        size: cfg.size,
        seconds: secs,
        rx_bytes_per_s: rx.bytes as f64 / secs,
        rx_datagrams_per_s: rx.datagrams as f64 / secs,
        tx_datagrams_per_s: tx.datagrams as f64 / secs,
        loss: if tx.datagrams == 0 {
            0.0
        } else {
            (1.0 - per(rx.datagrams, tx.datagrams)).max(0.0)
        },
        rx_calls_per_s: rx.calls as f64 / secs,
        tx_calls_per_s: tx.calls as f64 / secs,
        tx_per_call: per(tx.datagrams, tx.calls),
        rx_per_call: per(rx.datagrams, rx.calls),
        tx_errors: tx.errors,
        rx_busy: cfg.rx_busy && cfg.rx_nap.is_none(),
        rx_nap_us: cfg.rx_nap.map_or(0.0, |d| d.as_secs_f64() * 1e6),
    })
}

fn send(sock: &UdpSocket, cfg: &StreamConfig, win: Window) -> Result<Counts> {
    let mut c = Counts::default();
    let size = cfg.size;
    // Distinct source buffers per datagram of a batch, as a message in memory would be.
    let n = match cfg.mode {
        Mode::Plain => 1,
        Mode::Mmsg => cfg.batch,
        Mode::Gso => cfg.gso_count(),
    };
    let data: Vec<u8> = (0..n * size).map(|i| i as u8).collect();
    let mut hdrs = MultiHeaders::<SockaddrIn>::preallocate(MAX_BATCH, None);
    let addrs = [None::<SockaddrIn>; MAX_BATCH];
    let no_cmsgs: [ControlMessage<'_>; 0] = [];
    let fd = sock.as_raw_fd();
    loop {
        let res = match cfg.mode {
            // One datagram, or one GSO super-datagram of `n` segments.
            Mode::Plain | Mode::Gso => sock.send(&data).map(|_| n),
            Mode::Mmsg => {
                let mut chunks = data.chunks_exact(size);
                let iovs: [[IoSlice<'_>; 1]; MAX_BATCH] =
                    std::array::from_fn(|_| [IoSlice::new(chunks.next().unwrap_or(&[]))]);
                sendmmsg(
                    fd,
                    &mut hdrs,
                    iovs[..n].iter(),
                    addrs,
                    no_cmsgs,
                    MsgFlags::empty(),
                )
                .map(Iterator::count)
                .map_err(io::Error::from)
            }
        };
        let now = Instant::now();
        match res {
            Ok(sent) => win.add(&mut c, now, sent as u64, (sent * size) as u64),
            Err(_) if now >= win.start && now < win.end => c.errors += 1,
            Err(_) => {}
        }
        if now >= win.end {
            return Ok(c);
        }
    }
}

/// After a receive found the queue empty: sleep the nap if the receiver naps.
fn nap(cfg: &StreamConfig) {
    if let Some(d) = cfg.rx_nap {
        thread::sleep(d);
    }
}

fn receive(sock: &UdpSocket, cfg: &StreamConfig, win: Window) -> Result<Counts> {
    let mut c = Counts::default();
    let fd = sock.as_raw_fd();
    match cfg.mode {
        Mode::Plain => {
            let mut buf = vec![0u8; 65_536];
            loop {
                let r = sock.recv(&mut buf);
                let now = Instant::now();
                match r {
                    Ok(len) => win.add(&mut c, now, 1, len as u64),
                    Err(e) if would_block(&e) => nap(cfg),
                    Err(e) => return Err(e.into()),
                }
                if now >= win.end {
                    return Ok(c);
                }
            }
        }
        Mode::Mmsg => {
            let size = cfg.size;
            let mut bufs = vec![0u8; cfg.batch * size];
            let mut hdrs = MultiHeaders::<SockaddrIn>::preallocate(MAX_BATCH, None);
            loop {
                let mut chunks = bufs.chunks_exact_mut(size);
                let mut iovs: [[IoSliceMut<'_>; 1]; MAX_BATCH] =
                    std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or(&mut []))]);
                let r = recvmmsg(
                    fd,
                    &mut hdrs,
                    iovs[..cfg.batch].iter_mut(),
                    MsgFlags::MSG_WAITFORONE,
                    None,
                )
                .map(|msgs| msgs.fold((0u64, 0u64), |(n, b), m| (n + 1, b + m.bytes as u64)))
                .map_err(io::Error::from);
                let now = Instant::now();
                match r {
                    Ok((n, bytes)) => win.add(&mut c, now, n, bytes),
                    Err(e) if would_block(&e) => nap(cfg),
                    Err(e) => return Err(e.into()),
                }
                if now >= win.end {
                    return Ok(c);
                }
            }
        }
        Mode::Gso => {
            let mut buf = vec![0u8; 65_536];
            let mut cmsg = nix::cmsg_space!(i32);
            loop {
                let mut iov = [IoSliceMut::new(&mut buf)];
                let r = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty()).map(|m| {
                    let stride = m
                        .cmsgs()
                        .into_iter()
                        .flatten()
                        .find_map(|c| match c {
                            ControlMessageOwned::UdpGroSegments(s) => usize::try_from(s).ok(),
                            _ => None,
                        })
                        .filter(|&s| s > 0)
                        .unwrap_or(m.bytes.max(1));
                    (m.bytes.div_ceil(stride) as u64, m.bytes as u64)
                });
                let now = Instant::now();
                match r.map_err(io::Error::from) {
                    Ok((n, bytes)) => win.add(&mut c, now, n, bytes),
                    Err(e) if would_block(&e) => nap(cfg),
                    Err(e) => return Err(e.into()),
                }
                if now >= win.end {
                    return Ok(c);
                }
            }
        }
    }
}

/// How the ping-pong waits for a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RecvMode {
    /// Blocking `recv` (the thread sleeps until the datagram arrives).
    Block,
    /// Non-blocking `recv` in a spin loop.
    Busy,
}

impl RecvMode {
    /// Both modes.
    pub const ALL: [Self; 2] = [Self::Block, Self::Busy];

    /// Lower-case name, as used in measurement ids.
    pub fn name(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Busy => "busy",
        }
    }
}

/// Parameters of one ping-pong cell.
#[derive(Clone, Debug)]
pub struct PingPongConfig {
    /// UDP payload bytes (at least 8: the sequence number).
    pub size: usize,
    /// Round trips measured after the warm-up.
    pub round_trips: usize,
    /// Round trips run first and not measured.
    pub warmup: usize,
    /// Stop early after this long (fewer round trips then).
    pub max_time: Duration,
    /// Receive mode of both sides.
    pub recv: RecvMode,
}

impl PingPongConfig {
    /// Defaults: 20 000 round trips after 1 000 warm-up ones, at most 3 s.
    pub fn new(size: usize, recv: RecvMode) -> Self {
        Self {
            size,
            round_trips: 20_000,
            warmup: 1_000,
            max_time: Duration::from_secs(3),
            recv,
        }
    }
}

/// Round-trip times of one ping-pong cell, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct PingPongResult {
    /// `lo` or `veth`.
    pub link: &'static str,
    /// Receive mode.
    pub recv: RecvMode,
    /// UDP payload bytes.
    pub size: usize,
    /// Round trips measured.
    pub round_trips: usize,
    /// Requests or replies lost (no reply within 200 ms).
    pub lost: u64,
    /// Median RTT.
    pub median_us: f64,
    /// 99th percentile RTT.
    pub p99_us: f64,
    /// 99.9th percentile RTT.
    pub p999_us: f64,
    /// Smallest RTT.
    pub min_us: f64,
    /// Mean RTT.
    pub mean_us: f64,
}

const PP_TIMEOUT: Duration = Duration::from_millis(200);

/// Runs one ping-pong cell over `link`: client on side `a`, echo server on side `b`.
///
/// # Errors
/// When a namespace cannot be entered, a socket cannot be set up, or nothing came back.
pub fn run_pingpong(link: &Link, cfg: &PingPongConfig) -> Result<PingPongResult> {
    anyhow::ensure!(cfg.size >= 8, "ping-pong size must be at least 8");
    let stop = Arc::new(AtomicBool::new(false));
    let (port_tx, port_rx) = mpsc::sync_channel::<SocketAddr>(1);
    let server = {
        let (side, stop, mode) = (link.b.clone(), stop.clone(), cfg.recv);
        thread::Builder::new()
            .name("pingpong-srv".into())
            .spawn(move || -> Result<()> {
                netns::enter(side.ns.as_deref())?;
                let sock = UdpSocket::bind((side.addr, 0))?;
                match mode {
                    RecvMode::Block => sock.set_read_timeout(Some(Duration::from_millis(50)))?,
                    RecvMode::Busy => sock.set_nonblocking(true)?,
                }
                port_tx.send(sock.local_addr()?)?;
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    match sock.recv_from(&mut buf) {
                        Ok((len, from)) => {
                            let _ = sock.send_to(&buf[..len], from);
                        }
                        Err(e) if would_block(&e) => std::hint::spin_loop(),
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            })?
    };
    let client = {
        let (side, cfg) = (link.a.clone(), cfg.clone());
        thread::Builder::new().name("pingpong-cli".into()).spawn(
            move || -> Result<(Vec<u64>, u64)> {
                netns::enter(side.ns.as_deref())?;
                let sock = UdpSocket::bind((side.addr, 0))?;
                let dst = port_rx
                    .recv()
                    .map_err(|_| anyhow!("server failed to start"))?;
                sock.connect(dst)?;
                match cfg.recv {
                    RecvMode::Block => sock.set_read_timeout(Some(PP_TIMEOUT))?,
                    RecvMode::Busy => sock.set_nonblocking(true)?,
                }
                pingpong_client(&sock, &cfg)
            },
        )?
    };
    let res = client.join().map_err(|_| anyhow!("client panicked"));
    stop.store(true, Ordering::Relaxed);
    let srv = server.join().map_err(|_| anyhow!("server panicked"));
    let (mut rtts, lost) = res??;
    srv??;
    anyhow::ensure!(!rtts.is_empty(), "no reply came back");
    rtts.sort_unstable();
    let us = |ns: u64| ns as f64 / 1_000.0;
    Ok(PingPongResult {
        link: link.name,
        recv: cfg.recv,
        size: cfg.size,
        round_trips: rtts.len(),
        lost,
        median_us: us(percentile(&rtts, 50.0)),
        p99_us: us(percentile(&rtts, 99.0)),
        p999_us: us(percentile(&rtts, 99.9)),
        min_us: us(rtts[0]),
        mean_us: us(rtts.iter().sum::<u64>() / rtts.len() as u64),
    })
}

fn pingpong_client(sock: &UdpSocket, cfg: &PingPongConfig) -> Result<(Vec<u64>, u64)> {
    let mut rtts = Vec::with_capacity(cfg.round_trips);
    let mut lost = 0;
    let mut msg = vec![0x5Au8; cfg.size];
    let mut buf = vec![0u8; 65_536];
    let deadline = Instant::now() + cfg.max_time;
    for seq in 0..(cfg.warmup + cfg.round_trips) as u64 {
        msg[..8].copy_from_slice(&seq.to_le_bytes());
        let t = Instant::now();
        if t >= deadline {
            break;
        }
        sock.send(&msg)?;
        let rtt = loop {
            match sock.recv(&mut buf) {
                Ok(len) if len >= 8 && buf[..8] == seq.to_le_bytes() => break Some(t.elapsed()),
                Ok(_) => {} // a late reply to an earlier, timed-out request
                Err(e) if would_block(&e) => {
                    if cfg.recv == RecvMode::Block || t.elapsed() > PP_TIMEOUT {
                        break None;
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(e.into()),
            }
        };
        match rtt {
            Some(d) if seq >= cfg.warmup as u64 => rtts.push(d.as_nanos() as u64),
            Some(_) => {}
            None => lost += 1,
        }
    }
    Ok((rtts, lost))
}
