//! Forwarding mode, receive side: a daemon receives every datagram on the shared `IP:4791`
//! and copies each into its owner's shared-memory ring; the owner's engine reads the ring as
//! its datapath ([`RingDatapath`]) and sends directly from its own socket.
//!
//! This is the mode for hosts shared by several users (the daemon decides who gets what; a
//! client holds no socket on 4791), or where BPF is not available. It costs one copy and, when
//! the client sleeps, one wake-up per batch (design/daemon.md §3.3, §5.2).
//!
//! # The ring
//!
//! One single-producer single-consumer ring per client in a `memfd` (never a named shm file)
//! that the daemon creates ([`RingProducer::create`]) and passes to the client with an
//! `eventfd` ([`RingFds`], over `SCM_RIGHTS`). Layout (all little-endian host integers, the
//! two sides are on one host):
//!
//! ```text
//!   0: magic "ROCR" u32, version u32, slots u32, slot size u32      (written once)
//!  64: head u32    consumer position (the client advances it)
//! 128: tail u32    producer position (the daemon advances it)
//! 192: sleeping u32 (the client is about to wait on the eventfd), 200: drops u64 (ring full)
//! 256: slots x SLOT_SIZE: 64 bytes of metadata (RxMeta), then the UDP payload
//! ```
//!
//! Positions run freely (wrapping `u32`); slot = position % slots. The producer publishes its
//! tail once per batch ([`RingProducer::flush`]) and writes the eventfd only if the consumer
//! said it sleeps: the consumer stores `sleeping = 1` then re-reads the tail, the producer
//! stores the tail then reads `sleeping`, both sequentially consistent, so one of them sees
//! the other (the "sleeping flag" protocol of `design/daemon-study/ring.c`).
//!
//! # Trust
//!
//! The daemon never reads a slot back and indexes slots modulo its own count, so a client
//! that scribbles on its ring hurts only itself. The client checks every length it reads.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::demux::SlotLayout;
use super::udp::{UdpDatapath, UdpOptions};
use super::{Datapath, DatapathCaps, Ipv4Info, RxDrops, RxMeta, TxDatagram};

/// "ROCR".
const MAGIC: u32 = 0x524F_4352;
const VERSION: u32 = 1;
/// Bytes before the first slot.
const HEADER: usize = 256;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_SLOTS: usize = 8;
const OFF_SLOT_SIZE: usize = 12;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_SLEEPING: usize = 192;
const OFF_DROPS: usize = 200;
/// Metadata bytes at the start of each slot.
const META: usize = 64;
/// Largest UDP payload a slot holds: path MTU 4096 plus every RoCEv2 header and the ICRC fit.
pub const SLOT_PAYLOAD: usize = 4_224;
/// Bytes per slot.
const SLOT_SIZE: usize = META + SLOT_PAYLOAD;
/// Most slots a ring may have (64 Ki x 4.2 KiB = 275 MiB).
const MAX_SLOTS: u32 = 1 << 16;

/// The descriptors a client needs for its ring: pass both over the Unix socket.
#[derive(Debug)]
pub struct RingFds {
    /// The shared memory (`memfd`).
    pub memory: OwnedFd,
    /// The wake-up `eventfd`.
    pub event: OwnedFd,
}

/// A `MAP_SHARED` mapping of a ring's memory.
struct Shm {
    base: *mut u8,
    len: usize,
    slots: u32,
}

// SAFETY: the mapping is process-wide memory; every access goes through atomics (header) or
// raw copies into and out of slots that the SPSC protocol gives to one side at a time.
#[allow(unsafe_code)]
unsafe impl Send for Shm {}

impl Shm {
    /// Maps `len` bytes of `fd`.
    fn map(fd: BorrowedFd<'_>, len: usize, slots: u32) -> io::Result<Self> {
        #[allow(unsafe_code)]
        // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            len,
            slots,
        })
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= HEADER);
        #[allow(unsafe_code)]
        // SAFETY: `off` is one of the header's aligned u32 fields inside the mapping (page
        // aligned), which lives as long as `self`; the other process only uses it atomically.
        unsafe {
            AtomicU32::from_ptr(self.base.add(off).cast())
        }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= HEADER);
        #[allow(unsafe_code)]
        // SAFETY: as `u32_at`, for the aligned u64 field.
        unsafe {
            AtomicU64::from_ptr(self.base.add(off).cast())
        }
    }

    /// The start of slot `pos % slots`.
    fn slot(&self, pos: u32) -> *mut u8 {
        let i = (pos % self.slots) as usize;
        #[allow(unsafe_code)]
        // SAFETY: HEADER + slots * SLOT_SIZE <= len was checked when mapping.
        unsafe {
            self.base.add(HEADER + i * SLOT_SIZE)
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives self.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

fn ring_len(slots: u32) -> usize {
    HEADER + slots as usize * SLOT_SIZE
}

/// The daemon's end of one client's ring.
pub struct RingProducer {
    shm: Shm,
    _memory: OwnedFd,
    event: OwnedFd,
    /// Our tail, ahead of the published one until `flush`.
    tail: u32,
    pending: bool,
}

impl RingProducer {
    /// Creates a ring of `slots` slots (1..=65536) in a new `memfd`, and the eventfd; returns
    /// the producer and duplicates of both descriptors for the client.
    ///
    /// # Errors
    /// An invalid slot count, or the system calls failing (out of memory or descriptors).
    pub fn create(slots: u32) -> io::Result<(Self, RingFds)> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a ring has 1..={MAX_SLOTS} slots, not {slots}"),
            ));
        }
        let len = ring_len(slots);
        #[allow(unsafe_code)]
        // SAFETY: a NUL-terminated name; the call returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"rocectl-rx-ring".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let memory = unsafe { OwnedFd::from_raw_fd(fd) };
        #[allow(unsafe_code)]
        // SAFETY: plain system call on our descriptor.
        if unsafe { libc::ftruncate(memory.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: returns a new descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let event = unsafe { OwnedFd::from_raw_fd(efd) };
        let shm = Shm::map(memory.as_fd(), len, slots)?;
        shm.u32_at(OFF_SLOTS).store(slots, Ordering::Relaxed);
        shm.u32_at(OFF_SLOT_SIZE)
            .store(SLOT_SIZE as u32, Ordering::Relaxed);
        shm.u32_at(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        shm.u32_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        let fds = RingFds {
            memory: memory.try_clone()?,
            event: event.try_clone()?,
        };
        Ok((
            Self {
                shm,
                _memory: memory,
                event,
                tail: 0,
                pending: false,
            },
            fds,
        ))
    }

    /// Copies one datagram into the next free slot (not yet visible to the client: see
    /// [`RingProducer::flush`]). `false` when the ring is full or the payload is larger than
    /// [`SLOT_PAYLOAD`]: the datagram is dropped and counted in the ring's drops.
    pub fn push(&mut self, payload: &[u8], meta: &RxMeta) -> bool {
        let head = self.shm.u32_at(OFF_HEAD).load(Ordering::Acquire);
        if self.tail.wrapping_sub(head) >= self.shm.slots || payload.len() > SLOT_PAYLOAD {
            self.shm.u64_at(OFF_DROPS).fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mut m = [0u8; META];
        encode_meta(&mut m, payload.len(), meta);
        let slot = self.shm.slot(self.tail);
        #[allow(unsafe_code)]
        // SAFETY: the slot lies inside the mapping (Shm::slot) and, being between the
        // published tail and head + slots, belongs to the producer until the next flush.
        unsafe {
            ptr::copy_nonoverlapping(m.as_ptr(), slot, META);
            ptr::copy_nonoverlapping(payload.as_ptr(), slot.add(META), payload.len());
        }
        self.tail = self.tail.wrapping_add(1);
        self.pending = true;
        true
    }

    /// Publishes what [`RingProducer::push`] queued and wakes the client if it sleeps (one
    /// wake-up per batch). Returns whether it woke it.
    ///
    /// # Errors
    /// Writing the eventfd failed (it cannot overflow in practice).
    pub fn flush(&mut self) -> io::Result<bool> {
        if !std::mem::take(&mut self.pending) {
            return Ok(false);
        }
        self.shm.u32_at(OFF_TAIL).store(self.tail, Ordering::SeqCst);
        if self.shm.u32_at(OFF_SLEEPING).load(Ordering::SeqCst) == 0 {
            return Ok(false);
        }
        let one = 1u64.to_ne_bytes();
        #[allow(unsafe_code)]
        // SAFETY: writes 8 bytes from a live local buffer to our eventfd.
        let r = unsafe { libc::write(self.event.as_raw_fd(), one.as_ptr().cast(), 8) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // A full counter (EAGAIN) means the client already has a wake-up pending.
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Free slots now (the client may free more meanwhile).
    pub fn room(&self) -> u32 {
        let head = self.shm.u32_at(OFF_HEAD).load(Ordering::Acquire);
        self.shm.slots.saturating_sub(self.tail.wrapping_sub(head))
    }

    /// Datagrams dropped because the ring was full (or too large for a slot).
    pub fn drops(&self) -> u64 {
        self.shm.u64_at(OFF_DROPS).load(Ordering::Relaxed)
    }
}

impl fmt::Debug for RingProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingProducer")
            .field("slots", &self.shm.slots)
            .field("tail", &self.tail)
            .field("drops", &self.drops())
            .finish_non_exhaustive()
    }
}

// ------------------------------------------------------------------ metadata --

/// Slot metadata: len u32 @0, families @4/@5 (4 or 6), tos @6, has-IPv4-info @7, ident u16
/// @8, DF @10, src port @12, dst port @14, src IP @16..32, dst IP @32..48.
fn encode_meta(m: &mut [u8; META], len: usize, meta: &RxMeta) {
    m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    let mut put = |at_family: usize, at_port: usize, at_ip: usize, a: &SocketAddr| {
        m[at_port..at_port + 2].copy_from_slice(&a.port().to_ne_bytes());
        match a.ip() {
            IpAddr::V4(ip) => {
                m[at_family] = 4;
                m[at_ip..at_ip + 4].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                m[at_family] = 6;
                m[at_ip..at_ip + 16].copy_from_slice(&ip.octets());
            }
        }
    };
    put(4, 12, 16, &meta.src);
    put(5, 14, 32, &meta.dst);
    m[6] = meta.tos;
    if let Some(i) = meta.ipv4 {
        m[7] = 1;
        m[8..10].copy_from_slice(&i.ident.to_ne_bytes());
        m[10] = u8::from(i.dont_fragment);
    }
}

/// The payload length and metadata of a slot; `None` if they make no sense.
fn decode_meta(m: &[u8; META]) -> Option<(usize, RxMeta)> {
    let len = u32::from_ne_bytes(m[0..4].try_into().ok()?) as usize;
    if len > SLOT_PAYLOAD {
        return None;
    }
    let get = |at_family: usize, at_port: usize, at_ip: usize| -> Option<SocketAddr> {
        let port = u16::from_ne_bytes(m[at_port..at_port + 2].try_into().ok()?);
        let ip = match m[at_family] {
            4 => IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(&m[at_ip..at_ip + 4]).ok()?,
            )),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&m[at_ip..at_ip + 16]).ok()?,
            )),
            _ => return None,
        };
        Some(SocketAddr::new(ip, port))
    };
    let ipv4 = (m[7] == 1).then(|| Ipv4Info {
        ident: u16::from_ne_bytes([m[8], m[9]]),
        dont_fragment: m[10] != 0,
    });
    Some((
        len,
        RxMeta {
            len,
            stride: len,
            src: get(4, 12, 16)?,
            dst: get(5, 14, 32)?,
            tos: m[6],
            ipv4,
        },
    ))
}

// ------------------------------------------------------------------ consumer --

/// A client's datapath in forwarding mode: receives from its ring, sends from its own UDP
/// socket bound to the shared IP with an ephemeral port (RoCEv2 needs only destination port
/// 4791; the engine computes each ICRC with the port really used, see
/// [`DatapathCaps::fixed_source_port`]).
pub struct RingDatapath {
    shm: Shm,
    _memory: OwnedFd,
    event: OwnedFd,
    tx: UdpDatapath,
    /// The shared address peers send to (`IP:4791`).
    local: SocketAddr,
    malformed: u64,
}

impl RingDatapath {
    /// Opens the client's end of a ring the daemon made, receiving for `local` (the shared
    /// `IP:4791`), and a send socket on `local`'s IP (`opts` as for the `udp` backend; its
    /// GRO and raw receive are not used).
    ///
    /// # Errors
    /// The memory is not a ring of this version (`InvalidData`), or the socket cannot be
    /// opened.
    pub fn open(fds: RingFds, local: SocketAddr, opts: UdpOptions) -> io::Result<Self> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        #[allow(unsafe_code)]
        // SAFETY: stat is plain C data; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        #[allow(unsafe_code)]
        // SAFETY: fstat writes the live, exclusively borrowed `st`.
        if unsafe { libc::fstat(fds.memory.as_raw_fd(), &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = usize::try_from(st.st_size).unwrap_or(0);
        if size < HEADER {
            return Err(bad(format!("ring memory of {size} bytes")));
        }
        let head = Shm::map(fds.memory.as_fd(), HEADER, 1)?;
        let (magic, version) = (
            head.u32_at(OFF_MAGIC).load(Ordering::Acquire),
            head.u32_at(OFF_VERSION).load(Ordering::Relaxed),
        );
        let slots = head.u32_at(OFF_SLOTS).load(Ordering::Relaxed);
        let slot_size = head.u32_at(OFF_SLOT_SIZE).load(Ordering::Relaxed) as usize;
        drop(head);
        if magic != MAGIC || version != VERSION {
            return Err(bad(format!(
                "not a rocectl ring of version {VERSION} (magic {magic:#x}, version {version})"
            )));
        }
        if slots == 0 || slots > MAX_SLOTS || slot_size != SLOT_SIZE || size < ring_len(slots) {
            return Err(bad(format!(
                "ring of {slots} slots of {slot_size} bytes in {size} bytes"
            )));
        }
        let shm = Shm::map(fds.memory.as_fd(), ring_len(slots), slots)?;
        let tx = UdpDatapath::bind(
            SocketAddr::new(local.ip(), 0),
            UdpOptions {
                gro: false,
                raw_receive: false,
                ..opts
            },
        )
        .map_err(io::Error::from)?;
        Ok(Self {
            shm,
            _memory: fds.memory,
            event: fds.event,
            tx,
            local,
            malformed: 0,
        })
    }

    /// Makes the eventfd readable.
    fn wake_self(&self) {
        let one = 1u64.to_ne_bytes();
        #[allow(unsafe_code)]
        // SAFETY: writes 8 bytes from a live local buffer to our eventfd.
        let _ = unsafe { libc::write(self.event.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Empties the eventfd (its readiness has been seen).
    fn drain_event(&self) {
        let mut v = [0u8; 8];
        #[allow(unsafe_code)]
        // SAFETY: reads at most 8 bytes into a live local buffer from our eventfd.
        let _ = unsafe { libc::read(self.event.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
    }
}

impl fmt::Debug for RingDatapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingDatapath")
            .field("local", &self.local)
            .field("slots", &self.shm.slots)
            .field("tx", &self.tx)
            .finish_non_exhaustive()
    }
}

impl Datapath for RingDatapath {
    fn name(&self) -> &'static str {
        "fwd"
    }

    fn caps(&self) -> DatapathCaps {
        let tx = self.tx.caps();
        DatapathCaps {
            gro_segments: 1,
            sees_ip_header: false,
            ..tx
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.tx.send(batch)
    }

    /// Takes up to `bufs.len()` datagrams from the ring. When it is empty, tells the daemon
    /// this side sleeps (so the next batch writes the eventfd) and returns `WouldBlock`.
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        self.drain_event();
        let sleeping = self.shm.u32_at(OFF_SLEEPING);
        sleeping.store(0, Ordering::SeqCst);
        let head = self.shm.u32_at(OFF_HEAD).load(Ordering::Relaxed);
        let mut tail = self.shm.u32_at(OFF_TAIL).load(Ordering::Acquire);
        if tail == head {
            sleeping.store(1, Ordering::SeqCst);
            tail = self.shm.u32_at(OFF_TAIL).load(Ordering::SeqCst);
            if tail == head {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            sleeping.store(0, Ordering::SeqCst);
        }
        // A daemon that wrote a tail beyond head + slots is broken: take what exists.
        let avail = tail.wrapping_sub(head).min(self.shm.slots) as usize;
        let n = avail.min(bufs.len()).min(meta.len());
        let mut out = 0;
        for k in 0..n {
            let slot = self.shm.slot(head.wrapping_add(k as u32));
            let mut m = [0u8; META];
            #[allow(unsafe_code)]
            // SAFETY: the slot lies inside the mapping; between head and the published tail it
            // belongs to the consumer.
            unsafe {
                ptr::copy_nonoverlapping(slot, m.as_mut_ptr(), META);
            }
            match decode_meta(&m) {
                Some((len, rx)) if len <= bufs[out].len() => {
                    #[allow(unsafe_code)]
                    // SAFETY: len <= SLOT_PAYLOAD (decode_meta), so the source stays in the
                    // slot; the destination is the caller's buffer of at least len bytes.
                    unsafe {
                        ptr::copy_nonoverlapping(slot.add(META), bufs[out].as_mut_ptr(), len);
                    }
                    meta[out] = rx;
                    out += 1;
                }
                _ => self.malformed += 1,
            }
        }
        let new_head = head.wrapping_add(n as u32);
        self.shm.u32_at(OFF_HEAD).store(new_head, Ordering::Release);
        // Fewer than asked for: the caller may stop reading and wait on the eventfd (the
        // engine does after a short batch), so say we sleep, and if the daemon published more
        // meanwhile, wake ourselves rather than wait for its next batch.
        if out < bufs.len().min(meta.len()) {
            sleeping.store(1, Ordering::SeqCst);
            if self.shm.u32_at(OFF_TAIL).load(Ordering::SeqCst) != new_head {
                self.wake_self();
            }
        }
        Ok(out)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.event.as_raw_fd())
    }

    /// `kernel`: what the daemon could not queue (ring full); `malformed`: slots whose
    /// metadata made no sense or did not fit the buffer.
    fn rx_drops(&mut self) -> RxDrops {
        RxDrops {
            kernel: self.shm.u64_at(OFF_DROPS).load(Ordering::Relaxed),
            malformed: self.malformed,
        }
    }
}

// ------------------------------------------------------------------ forwarder --

/// Datagrams (or GRO buffers) a [`Forwarder`] receives per call.
const BATCH: usize = 64;

/// Counters of a [`Forwarder`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwarderStats {
    /// Datagrams copied into a client's ring.
    pub forwarded: u64,
    /// Datagrams whose destination QPN is in no client's slot (or too short for a BTH):
    /// dropped.
    pub no_owner: u64,
    /// Datagrams dropped because the owner's ring was full.
    pub ring_full: u64,
    /// Wake-ups written (at most one per client per batch).
    pub wakeups: u64,
}

/// The daemon's forwarding loop core: receives on the shared socket and hands each datagram
/// to the ring of the client whose slot holds its destination QPN ([`SlotLayout`]).
pub struct Forwarder {
    dp: Box<dyn Datapath>,
    layout: SlotLayout,
    rings: HashMap<u32, RingProducer>,
    /// `BATCH` receive buffers of `buf_len` bytes, back to back.
    bufs: Vec<u8>,
    buf_len: usize,
    meta: [RxMeta; BATCH],
    stats: ForwarderStats,
}

impl Forwarder {
    /// A forwarder receiving on `dp` (the daemon's socket on `IP:4791`).
    pub fn new(dp: Box<dyn Datapath>, layout: SlotLayout) -> Self {
        let caps = dp.caps();
        let gro = caps.gro_segments.max(1);
        // A backend that shows the IP header may hand over a whole GSO message from a sender
        // on this host as one packet (up to 64 KiB; see `DatapathCaps::sees_ip_header`).
        let buf_len = if caps.sees_ip_header {
            65_536
        } else {
            (gro * 9_216).min(65_536)
        };
        Self {
            dp,
            layout,
            rings: HashMap::new(),
            bufs: vec![0u8; BATCH * buf_len],
            buf_len,
            meta: [RxMeta::empty(); BATCH],
            stats: ForwarderStats::default(),
        }
    }

    /// Routes `slot`'s datagrams to `ring` (replacing and returning any previous one).
    pub fn add(&mut self, slot: u32, ring: RingProducer) -> Option<RingProducer> {
        self.rings.insert(slot, ring)
    }

    /// Stops routing to `slot` (its datagrams are dropped from now on).
    pub fn remove(&mut self, slot: u32) -> Option<RingProducer> {
        self.rings.remove(&slot)
    }

    /// The receive descriptor to wait on.
    pub fn readiness_fd(&self) -> Option<RawFd> {
        self.dp.readiness_fd()
    }

    /// Counters.
    pub fn stats(&self) -> ForwarderStats {
        self.stats
    }

    /// One receive batch: routes every datagram, then flushes each ring once. Returns the
    /// datagrams received; `Ok(0)` when nothing was waiting.
    ///
    /// # Errors
    /// Receive errors other than `WouldBlock`, and eventfd write failures.
    pub fn poll(&mut self) -> io::Result<usize> {
        let n = {
            let mut chunks = self.bufs.chunks_exact_mut(self.buf_len);
            let mut io: [IoSliceMut<'_>; BATCH] = std::array::from_fn(|_| {
                // INVARIANT: `bufs` holds exactly BATCH chunks.
                IoSliceMut::new(chunks.next().expect("BATCH buffers"))
            });
            match self.dp.recv(&mut io, &mut self.meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(e),
            }
        };
        let mut count = 0;
        for (buf, m) in self.bufs.chunks_exact(self.buf_len).zip(&self.meta).take(n) {
            let stride = m.stride.clamp(1, m.len.max(1));
            // A GRO buffer may hold datagrams of several QPs: route each on its own.
            for (k, seg) in buf[..m.len].chunks(stride).enumerate() {
                count += 1;
                let owner = seg
                    .get(5..8)
                    .map(|q| u32::from_be_bytes([0, q[0], q[1], q[2]]))
                    .map(|q| self.layout.slot_of(q))
                    .and_then(|slot| self.rings.get_mut(&slot));
                let Some(ring) = owner else {
                    self.stats.no_owner += 1;
                    continue;
                };
                let meta = RxMeta {
                    len: seg.len(),
                    stride: seg.len(),
                    // A whole GSO message seen with its header: the kernel numbers its
                    // segments' Identifications on from the header's.
                    ipv4: m.ipv4.map(|v| Ipv4Info {
                        ident: v.ident.wrapping_add(k as u16),
                        ..v
                    }),
                    ..*m
                };
                if ring.push(seg, &meta) {
                    self.stats.forwarded += 1;
                } else {
                    self.stats.ring_full += 1;
                }
            }
        }
        for ring in self.rings.values_mut() {
            if ring.flush()? {
                self.stats.wakeups += 1;
            }
        }
        Ok(count)
    }
}

impl fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Forwarder")
            .field("dp", &self.dp)
            .field("layout", &self.layout)
            .field("slots", &self.rings.keys().collect::<Vec<_>>())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_roundtrips() {
        for (src, dst, ipv4) in [
            (
                "10.1.2.3:49152",
                "10.1.2.4:4791",
                Some(Ipv4Info {
                    ident: 0x1234,
                    dont_fragment: true,
                }),
            ),
            ("[fd00::1]:1", "[fd00::2]:4791", None),
        ] {
            let meta = RxMeta {
                len: 99,
                stride: 99,
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                tos: 0x03,
                ipv4,
            };
            let mut m = [0u8; META];
            encode_meta(&mut m, 99, &meta);
            assert_eq!(decode_meta(&m), Some((99, meta)));
        }
        let mut m = [0u8; META];
        assert_eq!(decode_meta(&m), None, "no address family");
        encode_meta(&mut m, SLOT_PAYLOAD + 1, &RxMeta::empty());
        assert_eq!(decode_meta(&m), None, "too long");
    }

    /// Producer and consumer in two threads: every datagram arrives once, in order, intact;
    /// a full ring drops and counts; the consumer sleeps on the eventfd between batches.
    #[test]
    fn ring_delivers_in_order_and_wakes_a_sleeping_consumer() {
        let (mut p, fds) = RingProducer::create(8).unwrap();
        let local: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let mut c = RingDatapath::open(fds, local, UdpOptions::default()).unwrap();
        let meta = |i: u32| RxMeta {
            len: 0,
            stride: 0,
            src: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), i as u16),
            dst: local,
            tos: 0,
            ipv4: None,
        };
        let payload = |i: u32| vec![i as u8; 20 + (i as usize % 40)];
        // Empty: WouldBlock, and the consumer is now "sleeping".
        let mut buf = vec![vec![0u8; 128]; 4];
        let mut m = [RxMeta::empty(); 4];
        let mut io: Vec<IoSliceMut<'_>> = buf.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        assert_eq!(
            c.recv(&mut io, &mut m).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // Full: 8 fit, the 9th is dropped and counted.
        for i in 0..9 {
            assert_eq!(p.push(&payload(i), &meta(i)), i < 8);
        }
        assert!(p.flush().unwrap(), "the sleeping consumer is woken");
        assert_eq!(c.rx_drops().kernel, 1);
        let efd = c.readiness_fd().unwrap();
        let mut pfd = libc::pollfd {
            fd: efd,
            events: libc::POLLIN,
            revents: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        assert_eq!(r, 1, "eventfd readable");

        let total = 5_000u32;
        let consumer = std::thread::spawn(move || {
            let mut next = 0u32;
            let mut buf = vec![vec![0u8; 128]; 4];
            let mut m = [RxMeta::empty(); 4];
            while next < total + 8 {
                let mut io: Vec<IoSliceMut<'_>> =
                    buf.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                match c.recv(&mut io, &mut m) {
                    Ok(n) => {
                        for k in 0..n {
                            // The first 8 from before, then 100, 101, ...
                            let want_i = if next < 8 { next } else { next - 8 + 100 };
                            let want = payload(want_i);
                            assert_eq!(&buf[k][..m[k].len], &want[..], "datagram {next}");
                            assert_eq!(m[k].src.port(), want_i as u16);
                            next += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let mut pfd = libc::pollfd {
                            fd: c.readiness_fd().unwrap(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        #[allow(unsafe_code)]
                        // SAFETY: one live pollfd.
                        unsafe {
                            libc::poll(&mut pfd, 1, 1_000);
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            c
        });
        let mut i = 0;
        while i < total {
            if p.room() > 0 {
                assert!(p.push(&payload(i + 100), &meta(i + 100)));
                i += 1;
                if i % 7 == 0 {
                    p.flush().unwrap();
                }
            } else {
                p.flush().unwrap();
                std::thread::yield_now();
            }
        }
        p.flush().unwrap();
        let mut c = consumer.join().unwrap();
        assert_eq!(
            c.rx_drops(),
            RxDrops {
                kernel: 1,
                malformed: 0
            }
        );
    }

    /// A short batch (fewer than asked for: the engine stops reading after one) leaves the
    /// consumer armed, so the next batch wakes it; data published while it arms makes it
    /// wake itself.
    #[test]
    fn a_short_batch_arms_the_wake_up() {
        let (mut p, fds) = RingProducer::create(16).unwrap();
        let local: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let mut c = RingDatapath::open(fds, local, UdpOptions::default()).unwrap();
        let meta = RxMeta {
            len: 0,
            stride: 0,
            src: local,
            dst: local,
            tos: 0,
            ipv4: None,
        };
        let readable = |c: &RingDatapath| {
            let mut pfd = libc::pollfd {
                fd: c.readiness_fd().unwrap(),
                events: libc::POLLIN,
                revents: 0,
            };
            #[allow(unsafe_code)]
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            r == 1
        };
        let mut buf = vec![vec![0u8; 64]; 4];
        let mut m = [RxMeta::empty(); 4];
        let mut io: Vec<IoSliceMut<'_>> = buf.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        for i in 0..3u8 {
            assert!(p.push(&[i; 20], &meta));
        }
        assert!(!p.flush().unwrap(), "the consumer never slept yet");
        assert_eq!(c.recv(&mut io, &mut m).unwrap(), 3);
        assert!(!readable(&c));
        assert!(p.push(&[3; 20], &meta));
        assert!(
            p.flush().unwrap(),
            "a short batch leaves the consumer armed"
        );
        assert!(readable(&c));
        assert_eq!(c.recv(&mut io, &mut m).unwrap(), 1);
        // A full batch does not arm (the caller reads on): no eventfd writes under load.
        for i in 0..5u8 {
            assert!(p.push(&[i; 20], &meta));
        }
        assert!(p.flush().unwrap(), "still armed from the short batch");
        assert_eq!(c.recv(&mut io, &mut m).unwrap(), 4);
        assert!(p.push(&[9; 20], &meta));
        assert!(
            !p.flush().unwrap(),
            "a full batch leaves the consumer awake"
        );
        // The next short read (the 6th datagram) arms again.
        assert_eq!(c.recv(&mut io, &mut m).unwrap(), 2);
        assert!(p.push(&[10; 20], &meta));
        assert!(p.flush().unwrap());
    }
}
