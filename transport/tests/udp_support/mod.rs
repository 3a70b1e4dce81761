//! Helpers shared by the `udp_*` tests: a private network namespace per test, contiguous
//! transmit arenas like the engine's, and bounded send/receive loops.
//!
//! Every test runs in its own network namespace ([`private_net`], from the test kit:
//! `unshare(CLONE_NEWNET)` moves only the calling thread), so tests can all use
//! 127.0.0.1:4791 at once and do not collide with other programs on the host. Without the
//! privilege to do that, tests fall back to the host's namespace, serialised by a lock, and
//! say so loudly (in CI that is a failure).

#![allow(dead_code)]

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

pub(crate) use roce_testkit::netns::private_net;
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::datapath::{Datapath, RxMeta, TxDatagram};

/// How long any test loop may wait for packets.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// Binds a datapath or panics with the error's message.
pub(crate) fn bind(addr: &str, opts: UdpOptions) -> UdpDatapath {
    let addr: SocketAddr = addr.parse().unwrap();
    UdpDatapath::bind(addr, opts).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}

/// The byte at offset `off` of datagram `n` of a test pattern. Bytes 5..8 (where a BTH holds
/// the destination QP, at which the backend cuts GSO runs) are 0 in every datagram, as in
/// one QP's packets.
pub(crate) fn pattern_byte(n: usize, off: usize) -> u8 {
    if (5..8).contains(&off) {
        return 0;
    }
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

/// [`send_all`], planning each send as the engine does ([`Datapath::plan_ipv4_idents`]), so
/// that IPv4 runs may be coalesced (the payloads here carry no ICRC to rewrite).
#[allow(dead_code)]
pub(crate) fn send_all_planned(dp: &mut UdpDatapath, batch: &[TxDatagram<'_>]) {
    let end = Instant::now() + DEADLINE;
    let mut sent = 0;
    let mut idents = vec![0u16; batch.len()];
    while sent < batch.len() {
        dp.plan_ipv4_idents(&batch[sent..], &mut idents[sent..]);
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
