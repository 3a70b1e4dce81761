//! Kernel demux off loopback with `UDP_GRO`: the datagrams GRO merged into another member's
//! buffer are handed on to their owner.
//!
//! # Why
//!
//! A demux member without `UDP_GRO` gets one datagram per receive, and every GSO message from
//! a sender on the same host (over a veth or a bridge) is cut by the kernel into datagrams and
//! wake-ups: `bench-daemon`-style pairs over a veth ran at ~0.68× an exclusive pair that way.
//! With `UDP_GRO` the kernel hands over whole messages, but NAPI GRO (a NIC's, or a veth's
//! when its GRO or XDP is on) merges datagrams by *ports* before the steering program runs
//! (see [`super::demux`]): every member of an address shares `IP:4791`, so a peer host whose
//! processes also share one address (kernel demux there too) sends all of its traffic as one
//! UDP flow, and a merged buffer goes whole to the owner of its **first** datagram. The rest of
//! the buffer may belong to other members.
//!
//! # How
//!
//! [`RelayDatapath`] wraps the member's [`UdpDatapath`] (opened with `UDP_GRO`). After each
//! receive it reads the BTH DestQP of every datagram of every buffer (three bytes; the engine
//! reads them anyway a moment later): a datagram of another slot is cut out of the buffer and
//! sent to that slot's member over a Unix `SOCK_SEQPACKET` connection, with the addresses and
//! TOS the engine needs; the datagrams handed on to us arrive the same way and are received
//! into the engine's buffers like any other. (Not Unix datagram sockets: their receive queue
//! holds `net.unix.max_dgram_qlen` messages, 10 by default, far too few behind a GRO burst;
//! a connection's queue is bounded in bytes by the sender's `SO_SNDBUF`.) A buffer's first datagram is always the receiver's own
//! (the steering program chose the receiver by it), so a relay costs only the merged
//! datagrams that crossed a QP boundary: a sender's GSO run never mixes destination QPs, and
//! runs merge only where two of them meet.
//!
//! - **Where the relay sockets live.** Each member listens on
//!   `/tmp/.rocectl-demux-<uid>/<map id>.<slot>` and connects to another's on first use: the
//!   directory is created mode 0700 and used only if it is a real directory owned by the
//!   process's effective uid with no group or other permissions, so only processes of that
//!   uid (kernel demux is one uid's: [`super::demux`]) can connect to or bind a member's
//!   socket.
//!   The map ID names the group (the kernel's ID of its steering map, unique while it
//!   exists), so members of different addresses, namespaces or daemon runs never meet.
//! - **Readiness.** [`Datapath::readiness_fd`] is an epoll descriptor holding the UDP socket,
//!   the listening socket and the accepted connections (level-triggered). A receive asks it
//!   first which have input (`epoll_wait` with timeout 0), so an empty receive costs one
//!   system call, as before.
//!   [`Datapath::member_socket_fd`] stays the UDP socket (what proves the slot to a
//!   restarted daemon).
//! - **Losses.** A datagram whose slot has no member (nobody listens), or whose member's
//!   connection is full (it does not keep up), is dropped and counted in [`RelayStats`] and in [`RxDrops::kernel`] (a
//!   datagram to a slot nobody holds is dropped by the steering program too). A relay message
//!   that is not one (wrong magic, truncated) is counted in [`RxDrops::malformed`].
//! - **Fallback.** When the directory or the socket cannot be set up, [`open`] says why and
//!   the member is opened as before: without `UDP_GRO`.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use socket2::{Domain, MaybeUninitSlice, SockAddr, Socket, Type};

use super::demux::{Demux, SlotLayout};
use super::udp::{UdpDatapath, UdpError, UdpOptions};
use super::{Datapath, DatapathCaps, Ipv4Info, RxDrops, RxMeta, TxDatagram};

/// Tags a relay message ("RCRL").
const MAGIC: [u8; 4] = *b"RCRL";
/// Format of the relay header.
const VERSION: u8 = 1;
/// Bytes of the relay header in front of each handed-on datagram.
const HEADER: usize = 48;
/// The epoll tokens: the UDP socket, the listener, and accepted connection `i` at
/// `CONN_TOKEN + i`.
const UDP_TOKEN: u64 = 1;
const LISTEN_TOKEN: u64 = 2;
const CONN_TOKEN: u64 = 16;
/// Asked for each relay connection's send buffer (the kernel caps it at `wmem_max`): how
/// much may wait for a member that is busy.
const RELAY_BUFFER: usize = 4 << 20;
/// Connections the listener queues before they are accepted.
const BACKLOG: i32 = 64;
/// How long a slot nobody listened on is not tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(100);
/// Events one readiness check collects.
const MAX_EVENTS: usize = 64;

/// What the relay did since the member opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Datagrams of other members cut out of our buffers and handed on.
    pub handed_on: u64,
    /// Datagrams other members handed to us.
    pub taken_in: u64,
    /// Datagrams of other slots dropped: no member holds the slot (no relay socket).
    pub no_member: u64,
    /// Datagrams of other slots dropped: the member's relay queue was full.
    pub member_full: u64,
    /// Relay messages received that were not relay messages (bad magic, version, size).
    pub malformed: u64,
}

/// Why the relay could not be set up (the member then opens without `UDP_GRO`).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The UDP socket could not be opened.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// The relay directory is missing, unsafe, or the socket could not be made.
    #[error("kernel demux relay: {what} {}: {source}", path.display())]
    Setup {
        /// The step that failed.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// What the system said (or why the directory is not safe).
        source: io::Error,
    },
    /// The group's map ID could not be read.
    #[error("kernel demux relay: {0}")]
    Demux(#[from] super::demux::DemuxError),
}

/// A kernel-demux member's UDP datapath with `UDP_GRO`, and the relay that hands on the
/// datagrams GRO merged into its buffers for other members (module docs).
pub struct RelayDatapath {
    inner: UdpDatapath,
    listener: Socket,
    epoll: OwnedFd,
    dir: PathBuf,
    own: PathBuf,
    group: u32,
    layout: SlotLayout,
    slot: u32,
    stats: RelayStats,
    /// Connections other members opened to us (`None`: closed), by epoll token.
    incoming: Vec<Option<Socket>>,
    /// Our connection to each slot's member, made on first use.
    outgoing: Vec<Outgoing>,
}

/// What we know of one slot's member as a relay target.
#[derive(Debug, Default)]
enum Outgoing {
    /// Not tried yet, or its connection broke.
    #[default]
    Unknown,
    /// Connected.
    Up(Socket),
    /// Nobody listened when we last tried.
    Absent(std::time::Instant),
}

impl fmt::Debug for RelayDatapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayDatapath")
            .field("inner", &self.inner)
            .field("own", &self.own)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The directory of one uid's relay sockets.
pub fn relay_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/tmp/.rocectl-demux-{uid}"))
}

/// Creates (mode 0700) or checks the relay directory: a directory, not a link, owned by our
/// effective uid, with no permissions for group or others.
fn safe_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let md = std::fs::symlink_metadata(dir)?;
    // SAFETY: as in `relay_dir`.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    if !md.file_type().is_dir() {
        return Err(io::Error::other("not a directory"));
    }
    if md.uid() != uid {
        return Err(io::Error::other(format!(
            "owned by uid {}, not {uid}",
            md.uid()
        )));
    }
    if md.mode() & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "mode {:o} lets other users in",
            md.mode() & 0o777
        )));
    }
    Ok(())
}

/// Opens a kernel-demux member on `local` with `UDP_GRO` and the relay (module docs).
///
/// # Errors
/// [`RelayError`]: the caller falls back to [`UdpDatapath::bind_demux`].
pub fn open(
    local: SocketAddr,
    opts: UdpOptions,
    demux: &Demux,
) -> Result<RelayDatapath, RelayError> {
    let dir = relay_dir();
    safe_dir(&dir).map_err(|source| RelayError::Setup {
        what: "use the directory",
        path: dir.clone(),
        source,
    })?;
    let group = demux.group().map_id()?;
    let layout = demux.group().layout();
    let slot = demux.slot();
    let own = dir.join(format!("{group}.{slot}"));
    let setup = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RelayError::Setup { what, path, source }
    };
    let listener = Socket::new(Domain::UNIX, Type::SEQPACKET.cloexec(), None)
        .map_err(setup("create a socket for", &own))?;
    listener
        .set_nonblocking(true)
        .map_err(setup("set O_NONBLOCK on", &own))?;
    // A file left by an earlier holder of the slot (the daemon gives a slot to one live member
    // at a time; the kernel emptied it when that member's socket closed).
    match std::fs::remove_file(&own) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(setup("remove the stale", &own)(e)),
    }
    let addr = SockAddr::unix(&own).map_err(setup("name", &own))?;
    listener.bind(&addr).map_err(setup("bind", &own))?;
    // From here on the file is ours: remove it if the rest fails.
    let cleanup = |e: RelayError| {
        let _ = std::fs::remove_file(&own);
        e
    };
    listener
        .listen(BACKLOG)
        .map_err(setup("listen on", &own))
        .map_err(cleanup)?;
    let inner = UdpDatapath::bind_demux_with_gro(local, opts, demux)
        .map_err(RelayError::from)
        .map_err(cleanup)?;
    let epoll = new_epoll()
        .and_then(|ep| {
            let udp = inner
                .readiness_fd()
                .ok_or_else(|| io::Error::other("the UDP datapath has no descriptor"))?;
            watch(&ep, udp, UDP_TOKEN)?;
            watch(&ep, listener.as_raw_fd(), LISTEN_TOKEN)?;
            Ok(ep)
        })
        .map_err(setup("make the readiness descriptor for", &own))
        .map_err(cleanup)?;
    Ok(RelayDatapath {
        inner,
        listener,
        epoll,
        dir,
        own,
        group,
        layout,
        slot,
        stats: RelayStats::default(),
        incoming: Vec::new(),
        outgoing: Vec::new(),
    })
}

/// A new epoll descriptor.
fn new_epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 has no memory preconditions; the result is checked.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor we own.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `fd` for input under `token`, level-triggered.
fn watch(ep: &OwnedFd, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: both descriptors are open; `ev` is a valid epoll_event for the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Stops watching `fd` (before it closes; closing would also do it, but only once every
/// duplicate is closed).
fn unwatch(ep: &OwnedFd, fd: RawFd) {
    // SAFETY: a null event is allowed for EPOLL_CTL_DEL since Linux 2.6.9.
    #[allow(unsafe_code)]
    unsafe {
        libc::epoll_ctl(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        );
    }
}

impl RelayDatapath {
    /// What the relay did so far.
    pub fn relay_stats(&self) -> RelayStats {
        self.stats
    }

    /// The path of this member's relay socket.
    pub fn relay_path(&self) -> &Path {
        &self.own
    }

    /// Accepts the connections waiting on the listener.
    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((conn, _)) => {
                    if conn.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let i = match self.incoming.iter().position(Option::is_none) {
                        Some(i) => i,
                        None => {
                            self.incoming.push(None);
                            self.incoming.len() - 1
                        }
                    };
                    if watch(&self.epoll, conn.as_raw_fd(), CONN_TOKEN + i as u64).is_ok() {
                        self.incoming[i] = Some(conn);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Receives one handed-on datagram from incoming connection `i` into `buf`: `Ok(None)`
    /// when none is waiting (or the connection closed).
    fn recv_relayed(&mut self, i: usize, buf: &mut IoSliceMut<'_>) -> Option<RxMeta> {
        loop {
            let conn = self.incoming.get(i)?.as_ref()?;
            let mut hdr = [0u8; HEADER];
            let mut parts = [
                MaybeUninitSlice::new(as_uninit(&mut hdr)),
                MaybeUninitSlice::new(as_uninit(&mut buf[..])),
            ];
            let n = match conn.recv_vectored(&mut parts) {
                Ok((0, _)) => {
                    // The other member closed.
                    unwatch(&self.epoll, conn.as_raw_fd());
                    self.incoming[i] = None;
                    return None;
                }
                Ok((_, flags)) if flags.is_truncated() => {
                    self.stats.malformed += 1;
                    continue;
                }
                Ok((n, _)) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(_) => {
                    unwatch(&self.epoll, conn.as_raw_fd());
                    self.incoming[i] = None;
                    return None;
                }
            };
            match decode_header(&hdr, n) {
                Some(meta) => {
                    self.stats.taken_in += 1;
                    return Some(meta);
                }
                None => self.stats.malformed += 1,
            }
        }
    }

    /// Our connection to the member of `slot`, connecting on first use.
    fn connection(&mut self, slot: u32) -> Option<&Socket> {
        let idx = slot as usize;
        if self.outgoing.len() <= idx {
            self.outgoing.resize_with(idx + 1, Outgoing::default);
        }
        if let Outgoing::Absent(at) = self.outgoing[idx] {
            if at.elapsed() < RETRY_AFTER {
                return None;
            }
        }
        if !matches!(self.outgoing[idx], Outgoing::Up(_)) {
            let path = self.dir.join(format!("{}.{slot}", self.group));
            let conn = SockAddr::unix(&path).ok().and_then(|addr| {
                let s = Socket::new(Domain::UNIX, Type::SEQPACKET.cloexec(), None).ok()?;
                s.set_nonblocking(true).ok()?;
                let _ = s.set_send_buffer_size(RELAY_BUFFER);
                s.connect(&addr).ok()?;
                Some(s)
            });
            self.outgoing[idx] = match conn {
                Some(s) => Outgoing::Up(s),
                None => Outgoing::Absent(std::time::Instant::now()),
            };
        }
        match &self.outgoing[idx] {
            Outgoing::Up(s) => Some(s),
            _ => None,
        }
    }

    /// Hands `datagram` (received with `meta`) on to the member of `slot`.
    fn hand_on(&mut self, slot: u32, meta: &RxMeta, datagram: &[u8]) {
        let hdr = encode_header(meta);
        let Some(conn) = self.connection(slot) else {
            self.stats.no_member += 1;
            return;
        };
        let parts = [IoSlice::new(&hdr), IoSlice::new(datagram)];
        match conn.send_vectored_with_flags(&parts, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) {
            Ok(_) => self.stats.handed_on += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.stats.member_full += 1,
            Err(_) => {
                // The member closed (EPIPE, ECONNRESET): try again on the next datagram.
                self.outgoing[slot as usize] = Outgoing::Unknown;
                self.stats.no_member += 1;
            }
        }
    }

    /// Cuts the datagrams of other slots out of one received buffer (handing them on) and
    /// fixes its meta; returns whether anything of ours is left.
    fn keep_own(&mut self, buf: &mut [u8], meta: &mut RxMeta) -> bool {
        let len = meta.len.min(buf.len());
        let stride = if meta.stride == 0 {
            len
        } else {
            meta.stride.min(len)
        };
        if stride == 0 {
            return true;
        }
        // Fast path: every datagram ours (the common case: one GSO run, one QP).
        let (layout, own) = (self.layout, self.slot);
        let foreign = move |d: &[u8]| -> Option<u32> {
            let qpn = u32::from_be_bytes([0, *d.get(5)?, *d.get(6)?, *d.get(7)?]);
            let slot = layout.slot_of(qpn);
            (slot != own).then_some(slot)
        };
        if buf[..len].chunks(stride).all(|d| foreign(d).is_none()) {
            return true;
        }
        let mut w = 0;
        let mut r = 0;
        while r < len {
            let end = (r + stride).min(len);
            match foreign(&buf[r..end]) {
                Some(slot) => {
                    let mut one = *meta;
                    one.len = end - r;
                    one.stride = end - r;
                    if let Some(ip) = one.ipv4.as_mut() {
                        // Segment k of a GRO buffer carried Identification id + k.
                        ip.ident = ip.ident.wrapping_add((r / stride) as u16);
                    }
                    self.hand_on(slot, &one, &buf[r..end]);
                }
                None => {
                    if w != r {
                        buf.copy_within(r..end, w);
                    }
                    w += end - r;
                }
            }
            r = end;
        }
        meta.len = w;
        meta.stride = stride.min(w);
        w > 0
    }
}

/// `bytes` as a slice of `MaybeUninit<u8>` (for socket2's vectored receive).
fn as_uninit(bytes: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and initialised bytes stay valid
    // whatever is written through the new slice (only bytes are written).
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len())
    }
}

/// The relay header: magic, version, family (4/6), TOS, flags (1: IPv4 info present, 2: DF),
/// Identification, source port, destination port, 2 bytes 0, source and destination
/// addresses (16 bytes each; IPv4 in the first 4).
fn encode_header(meta: &RxMeta) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = if meta.src.is_ipv4() { 4 } else { 6 };
    h[6] = meta.tos;
    if let Some(ip) = meta.ipv4 {
        h[7] = 1 | if ip.dont_fragment { 2 } else { 0 };
        h[8..10].copy_from_slice(&ip.ident.to_be_bytes());
    }
    h[10..12].copy_from_slice(&meta.src.port().to_be_bytes());
    h[12..14].copy_from_slice(&meta.dst.port().to_be_bytes());
    put_ip(&mut h[16..32], meta.src.ip());
    put_ip(&mut h[32..48], meta.dst.ip());
    h
}

fn put_ip(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(a) => out[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => out.copy_from_slice(&a.octets()),
    }
}

/// The meta of a relay message of `n` bytes with header `h`; `None` if it is not one.
fn decode_header(h: &[u8; HEADER], n: usize) -> Option<RxMeta> {
    if h[..4] != MAGIC || h[4] != VERSION || n <= HEADER {
        return None;
    }
    let ip = |b: &[u8]| -> Option<IpAddr> {
        match h[5] {
            4 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
            _ => None,
        }
    };
    let src = SocketAddr::new(ip(&h[16..32])?, u16::from_be_bytes([h[10], h[11]]));
    let dst = SocketAddr::new(ip(&h[32..48])?, u16::from_be_bytes([h[12], h[13]]));
    let ipv4 = (h[7] & 1 != 0).then(|| Ipv4Info {
        ident: u16::from_be_bytes([h[8], h[9]]),
        dont_fragment: h[7] & 2 != 0,
    });
    let len = n - HEADER;
    Some(RxMeta {
        len,
        stride: len,
        src,
        dst,
        tos: h[6],
        ipv4,
    })
}

impl Drop for RelayDatapath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.own);
    }
}

impl Datapath for RelayDatapath {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn caps(&self) -> DatapathCaps {
        self.inner.caps()
    }

    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.inner.send(batch)
    }

    fn plan_ipv4_idents(&mut self, batch: &[TxDatagram<'_>], idents: &mut [u16]) {
        self.inner.plan_ipv4_idents(batch, idents);
    }

    fn first_message_len(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        self.inner.first_message_len(batch)
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        let cap = bufs.len().min(meta.len());
        if cap == 0 {
            return Ok(0);
        }
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        // SAFETY: `evs` has room for MAX_EVENTS events; timeout 0 never blocks.
        #[allow(unsafe_code)]
        let ready = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                evs.as_mut_ptr(),
                MAX_EVENTS as i32,
                0,
            )
        };
        if ready < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.kind() == io::ErrorKind::Interrupted {
                io::ErrorKind::WouldBlock.into()
            } else {
                e
            });
        }
        let mut n = 0;
        let mut udp_ready = false;
        for ev in &evs[..ready as usize] {
            match ev.u64 {
                UDP_TOKEN => udp_ready = true,
                LISTEN_TOKEN => self.accept_all(),
                t => {
                    let i = (t - CONN_TOKEN) as usize;
                    while n < cap {
                        match self.recv_relayed(i, &mut bufs[n]) {
                            Some(m) => {
                                meta[n] = m;
                                n += 1;
                            }
                            None => break,
                        }
                    }
                }
            }
        }
        if udp_ready && n < cap {
            let got = match self.inner.recv(&mut bufs[n..cap], &mut meta[n..cap]) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) if n == 0 => return Err(e),
                Err(_) => 0,
            };
            // Cut other members' datagrams out; close the gaps a buffer left empty.
            let mut w = n;
            for r in n..n + got {
                let mut m = meta[r];
                if !self.keep_own(&mut bufs[r], &mut m) {
                    continue;
                }
                if w != r {
                    let (front, back) = bufs.split_at_mut(r);
                    front[w][..m.len].copy_from_slice(&back[0][..m.len]);
                }
                meta[w] = m;
                w += 1;
            }
            n = w;
        }
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.epoll.as_raw_fd())
    }

    fn member_socket_fd(&self) -> Option<RawFd> {
        self.inner.readiness_fd()
    }

    fn rx_drops(&mut self) -> RxDrops {
        let mut d = self.inner.rx_drops();
        d.kernel += self.stats.no_member + self.stats.member_full;
        d.malformed += self.stats.malformed;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips_v4_and_v6() {
        for (src, dst, ipv4) in [
            (
                "10.0.0.1:4791",
                "10.0.0.2:4791",
                Some(Ipv4Info {
                    ident: 7,
                    dont_fragment: true,
                }),
            ),
            ("10.0.0.1:5000", "10.0.0.2:4791", None),
            ("[fe80::1]:4791", "[2001:db8::2]:4791", None),
        ] {
            let meta = RxMeta {
                len: 100,
                stride: 100,
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                tos: 0x62,
                ipv4,
            };
            let h = encode_header(&meta);
            assert_eq!(decode_header(&h, HEADER + 100), Some(meta));
        }
    }

    #[test]
    fn a_header_that_is_not_ours_is_refused() {
        let meta = RxMeta {
            len: 10,
            stride: 10,
            src: "10.0.0.1:4791".parse().unwrap(),
            dst: "10.0.0.2:4791".parse().unwrap(),
            tos: 0,
            ipv4: None,
        };
        let good = encode_header(&meta);
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(decode_header(&bad, HEADER + 10), None, "magic");
        let mut bad = good;
        bad[4] = 2;
        assert_eq!(decode_header(&bad, HEADER + 10), None, "version");
        let mut bad = good;
        bad[5] = 5;
        assert_eq!(decode_header(&bad, HEADER + 10), None, "family");
        assert_eq!(decode_header(&good, HEADER), None, "no datagram");
    }

    #[test]
    fn an_unsafe_directory_is_refused() {
        let base = std::env::temp_dir().join(format!("relay-dir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let d = base.join("d");
        safe_dir(&d).expect("a new directory is safe");
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        assert!(safe_dir(&d).is_err(), "0755 lets others list it");
        let f = base.join("f");
        std::fs::write(&f, b"").unwrap();
        assert!(safe_dir(&f).is_err(), "a file is not a directory");
        let l = base.join("l");
        std::os::unix::fs::symlink(&d, &l).unwrap();
        assert!(safe_dir(&l).is_err(), "a link is refused");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
