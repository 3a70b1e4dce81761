//! Helpers shared by the `udp_*` tests: a private network namespace per test, contiguous
//! transmit arenas like the engine's, and bounded send/receive loops.
//!
//! Every test runs in its own network namespace (`unshare(CLONE_NEWNET)` moves only the
//! calling thread), so tests can all use 127.0.0.1:4791 at once and do not collide with other
//! programs on the host. Without the privilege to do that, tests fall back to the host's
//! namespace, serialised by a lock, and say so loudly.

#![allow(dead_code)]

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::datapath::{Datapath, RxMeta, TxDatagram};

/// How long any test loop may wait for packets.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

static HOST_NAMESPACE: Mutex<()> = Mutex::new(());

/// Where the current test's sockets live.
#[derive(Debug)]
pub(crate) enum Net {
    /// A fresh namespace with only `lo` (up); nothing else is in it.
    Private,
    /// The host's namespace (no privilege for a private one); holds the lock.
    Host(MutexGuard<'static, ()>),
}

impl Net {
    /// Whether the namespace is private to this test.
    pub(crate) fn is_private(&self) -> bool {
        matches!(self, Self::Private)
    }
}

/// Moves this test's thread into a new network namespace with `lo` up.
pub(crate) fn private_net() -> Net {
    #[allow(unsafe_code)]
    // SAFETY: unshare takes no pointers; CLONE_NEWNET moves only the calling thread.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    let err = if r == 0 {
        match set_up("lo") {
            Ok(()) => return Net::Private,
            Err(e) => e,
        }
    } else {
        io::Error::last_os_error()
    };
    eprintln!(
        "!!! cannot use a private network namespace ({err}); running in the host's namespace, \
         where another program on 127.0.0.x:4791 will make this test fail"
    );
    Net::Host(HOST_NAMESPACE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Brings interface `name` up (`SIOCSIFFLAGS`) in this thread's namespace.
pub(crate) fn set_up(name: &str) -> io::Result<()> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    #[allow(unsafe_code)]
    // SAFETY: ifreq is plain C data; all zeroes is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = s as libc::c_char;
    }
    #[allow(unsafe_code)]
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read the NUL-terminated name and read/write the
    // `ifru_flags` member of the live `req`.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req as *mut libc::ifreq) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut req as *mut libc::ifreq) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Binds a datapath or panics with the error's message.
pub(crate) fn bind(addr: &str, opts: UdpOptions) -> UdpDatapath {
    let addr: SocketAddr = addr.parse().unwrap();
    UdpDatapath::bind(addr, opts).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}

/// The byte at offset `off` of datagram `n` of a test pattern.
pub(crate) fn pattern_byte(n: usize, off: usize) -> u8 {
    (n.wrapping_mul(131) ^ off.wrapping_mul(7) ^ (off >> 8)) as u8
}

/// A transmit arena like the engine's: datagrams of `sizes` back to back, each filled with
/// its own pattern. Returns the arena and each datagram's range.
pub(crate) fn arena(sizes: &[usize], first: usize) -> (Vec<u8>, Vec<Range<usize>>) {
    let mut buf = Vec::with_capacity(sizes.iter().sum());
    let mut ranges = Vec::with_capacity(sizes.len());
    for (n, &len) in sizes.iter().enumerate() {
        let start = buf.len();
        buf.extend((0..len).map(|off| pattern_byte(first + n, off)));
        ranges.push(start..buf.len());
    }
    (buf, ranges)
}

/// Datagrams to `dst` over the arena ranges.
pub(crate) fn datagrams<'a>(
    arena: &'a [u8],
    ranges: &[Range<usize>],
    dst: SocketAddr,
    tos: u8,
) -> Vec<TxDatagram<'a>> {
    ranges
        .iter()
        .map(|r| TxDatagram {
            dst,
            src_port: 0,
            tos,
            hop_limit: 64,
            flow_label: 0,
            payload: &arena[r.clone()],
        })
        .collect()
}

/// Sends the whole batch, retrying on `WouldBlock` until [`DEADLINE`].
pub(crate) fn send_all(dp: &mut UdpDatapath, batch: &[TxDatagram<'_>]) {
    let end = Instant::now() + DEADLINE;
    let mut sent = 0;
    while sent < batch.len() {
        match dp.send(&batch[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("send from {}: {e}", dp.local_addr()),
        }
        assert!(
            Instant::now() < end,
            "sent only {sent} of {} datagrams",
            batch.len()
        );
    }
}

/// One received datagram (a GRO buffer split by its stride).
#[derive(Debug)]
pub(crate) struct Received {
    /// The metadata of the buffer it came in.
    pub(crate) meta: RxMeta,
    /// Its bytes.
    pub(crate) data: Vec<u8>,
}

/// Receives until `want` datagrams arrived or [`DEADLINE`] passed, into `nbufs` buffers of
/// `buf_len` bytes per call; splits GRO buffers by stride.
pub(crate) fn recv_datagrams(
    dp: &mut UdpDatapath,
    want: usize,
    nbufs: usize,
    buf_len: usize,
) -> Vec<Received> {
    let mut storage = vec![0u8; nbufs * buf_len];
    let mut meta = vec![RxMeta::empty(); nbufs];
    let mut out = Vec::new();
    let end = Instant::now() + DEADLINE;
    while out.len() < want && Instant::now() < end {
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.chunks_mut(buf_len).map(IoSliceMut::new).collect();
        let n = match dp.recv(&mut bufs, &mut meta) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => panic!("recv on {}: {e}", dp.local_addr()),
        };
        for (m, buf) in meta[..n].iter().zip(&bufs) {
            let stride = if m.stride == 0 { m.len } else { m.stride };
            let mut off = 0;
            loop {
                let len = stride.min(m.len - off);
                out.push(Received {
                    meta: *m,
                    data: buf[off..off + len].to_vec(),
                });
                off += len;
                if off >= m.len {
                    break;
                }
            }
        }
    }
    out
}

/// Panics unless `got` is exactly the datagrams `sizes` (pattern numbers from `first`), in
/// order, from `src`.
pub(crate) fn check_datagrams(got: &[Received], sizes: &[usize], first: usize, src: SocketAddr) {
    assert_eq!(
        got.len(),
        sizes.len(),
        "received {} datagrams, expected {}",
        got.len(),
        sizes.len()
    );
    for (n, (g, &len)) in got.iter().zip(sizes).enumerate() {
        assert_eq!(g.data.len(), len, "datagram {n}: length");
        if let Some(off) = (0..len).find(|&off| g.data[off] != pattern_byte(first + n, off)) {
            panic!("datagram {n} ({len} bytes): first wrong byte at {off}");
        }
        assert_eq!(g.meta.src, src, "datagram {n}: source");
    }
}
