//! Datapath backends: how RoCEv2 datagrams leave and enter the host.
//!
//! The engine hands a backend finished UDP payloads (BTH .. ICRC, ICRC already computed) with
//! their addresses, and gets back received UDP payloads with what the backend learned about
//! their IP header. Three backends implement [`Datapath`]:
//!
//! - [`udp`]: kernel UDP sockets (socket2 + mio), no privileges; batched with
//!   `sendmmsg`/`recvmmsg` and UDP GSO/GRO where the kernel has them;
//! - [`raw`]: whole Ethernet frames through `AF_PACKET` (pnet), with our own IP/UDP headers
//!   and ARP/neighbour resolution; needs `CAP_NET_RAW`;
//! - [`sim`]: in-memory links with seeded loss, duplication, reordering and corruption.
//!
//! [`demux`] lets several processes share one `udp` address: the kernel steers each datagram
//! to the process that owns its destination QPN; [`fwdring`] is the forwarding alternative
//! (a daemon copies each datagram into its owner's shared-memory ring).
//!
//! Middleware wraps any backend: [`fault::FaultInjector`] applies the stack's one fault model
//! (seeded loss, burst loss, duplication, reordering, corruption, delay) to what it sends.
//!
//! # The IP header contract (why the ICRC is right)
//!
//! The ICRC covers the IPv4 Identification and flags (only TOS, TTL and the checksum are
//! masked). The engine computes every ICRC for an IPv4 header with **Identification 0 and DF
//! set**, and every backend promises that is the header that goes on the wire: `raw` writes it
//! itself, and `udp` relies on Linux sending ID 0 from an unconnected socket with
//! `IP_PMTUDISC_DO` (tested in `tests/udp_ident.rs`). The one exception is planned: `udp`'s
//! IPv4 GSO messages, whose segments the kernel numbers `0, 1, .., n-1`; the backend says so
//! in [`Datapath::plan_ipv4_idents`] and the engine rewrites those segments' ICRCs
//! ([`roce_wire::icrc::Ipv4IdentPatcher`]) before it sends (`tests/gso.rs`). On receive, a backend that sees the IP
//! header reports its Identification and DF bit in [`RxMeta::ipv4`] and the engine checks all
//! 32 bits of the ICRC. One that cannot (a plain UDP socket) leaves it `None`, and the engine
//! recovers the Identification from the ICRC by linearity, taking DF as set
//! ([`roce_wire::icrc::Ipv4IdentChecker`]).
//!
//! # Residual risk without the IP header (`udp` over IPv4, unprivileged)
//!
//! That check is **weaker than a NIC's**: a corrupted IPv4 packet is accepted with probability
//! up to 2^-16 (the first packet from a peer), about 2^-23.7 for a packet of an active flow
//! from a peer whose Identifications change (rdma_rxe), and 2^-26 from a peer that sends
//! Identification 0 or GSO segment numbers below 64 (rocectl); the full 2^-32 through the
//! `udp` backend's own raw receive socket when it has `CAP_NET_RAW` (see [`udp`]). IPv6 has no hidden field: always 2^-32.
//! The exact table is in the checker's docs; `wire/tests/ident_check.rs` measures it.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;

pub mod demux;
pub mod fault;
pub mod fwdring;
pub(crate) mod open;
pub mod raw;
pub mod relay;
pub(crate) mod shard;
pub mod sim;
pub mod udp;

/// One datagram to send.
#[derive(Clone, Copy, Debug)]
pub struct TxDatagram<'a> {
    /// Destination IP address and UDP port (4791 for RoCEv2).
    pub dst: SocketAddr,
    /// UDP source port wanted (the QP's flow-entropy port). Backends whose source port is fixed
    /// (see [`DatapathCaps::fixed_source_port`]) ignore it; the engine computed the ICRC with
    /// the port the backend really uses.
    pub src_port: u16,
    /// IPv4 TOS / IPv6 traffic class: DSCP in the upper six bits, ECN in the lower two.
    pub tos: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (low 20 bits).
    pub flow_label: u32,
    /// UDP payload: BTH .. ICRC.
    pub payload: &'a [u8],
}

impl TxDatagram<'_> {
    /// A placeholder for filling arrays.
    pub const EMPTY: TxDatagram<'static> = TxDatagram {
        dst: SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::UNSPECIFIED,
            0,
        )),
        src_port: 0,
        tos: 0,
        hop_limit: 0,
        flow_label: 0,
        payload: &[],
    };
}

/// The IPv4 header fields the ICRC covers that a receiver may not otherwise see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Identification.
    pub ident: u16,
    /// Don't Fragment flag.
    pub dont_fragment: bool,
}

/// What a backend knows about one received buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxMeta {
    /// Bytes of the buffer used.
    pub len: usize,
    /// Size of each datagram in the buffer when the kernel coalesced several (GRO); equal to
    /// `len` for a single datagram. The last datagram may be shorter.
    pub stride: usize,
    /// Sender's IP address and UDP port.
    pub src: SocketAddr,
    /// Our IP address and UDP port it was sent to.
    pub dst: SocketAddr,
    /// IPv4 TOS / IPv6 traffic class (ECN in the low two bits); 0 when unknown.
    pub tos: u8,
    /// IPv4 Identification and DF when the backend saw the IP header (`raw`, `sim`, `udp` with
    /// raw receive); `None` from a plain UDP socket.
    pub ipv4: Option<Ipv4Info>,
}

impl RxMeta {
    /// An empty meta to fill (buffers for [`Datapath::recv`]).
    pub const fn empty() -> Self {
        let any = SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::UNSPECIFIED,
            0,
        ));
        Self {
            len: 0,
            stride: 0,
            src: any,
            dst: any,
            tos: 0,
            ipv4: None,
        }
    }
}

/// Datagrams a backend lost on receive before handing them over, counted since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxDrops {
    /// Dropped by the kernel for our socket instead of being queued (receive buffer full; for
    /// `udp` also a bad UDP checksum): `udp` reads the socket's `sk_drops`.
    pub kernel: u64,
    /// Received but discarded by the backend as malformed: larger than the receive buffer
    /// (`MSG_TRUNC`; no valid RoCEv2 packet is that large), or IP/UDP headers the backend
    /// parsed and rejected (bad lengths, checksums, GSO it cannot split).
    pub malformed: u64,
}

/// What a backend can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatapathCaps {
    /// Largest IP packet (the interface MTU) this backend can send.
    pub ip_mtu: usize,
    /// Most datagrams one GSO send may carry (1: no GSO).
    pub max_gso_segments: usize,
    /// Most datagrams one GRO receive may carry (1: no GRO). Receive buffers should hold this
    /// many full-size datagrams.
    pub gro_segments: usize,
    /// The UDP source port every datagram leaves with, when the backend cannot choose it per
    /// datagram (`udp`: the bound port 4791).
    pub fixed_source_port: Option<u16>,
    /// The backend reports the IPv4 Identification of received packets (full ICRC check).
    /// Its receive buffers should hold 64 KiB: a whole GSO message from a sender on the same
    /// host can come in as one packet (the `udp` backend cuts it, see [`udp`]).
    pub sees_ip_header: bool,
}

/// A way to send and receive RoCEv2 datagrams. All methods are non-blocking.
pub trait Datapath: Send + fmt::Debug {
    /// Short backend name for messages and counters (`udp`, `raw`, `sim`).
    fn name(&self) -> &'static str;

    /// Capabilities.
    fn caps(&self) -> DatapathCaps;

    /// The local IP address and UDP port.
    fn local_addr(&self) -> SocketAddr;

    /// Sends a batch, in order. Returns how many datagrams went out (a prefix of `batch`);
    /// `Err(WouldBlock)` when none could be queued right now.
    ///
    /// # Errors
    /// I/O errors other than a full queue.
    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize>;

    /// The IPv4 Identification each datagram of `batch` will carry on the wire if the next
    /// [`Datapath::send`] gets exactly this batch (same slices), written to `idents[i]`. The
    /// engine computes every ICRC for Identification 0 and rewrites the ICRC of each datagram
    /// planned otherwise before it sends. The `udp` backend plans the segments of an IPv4 GSO
    /// message `0, 1, .., n-1` (the kernel numbers them so, see [`udp`]).
    ///
    /// Contract: a backend sends Identification 0 (with DF) for every IPv4 datagram of a batch
    /// that was not planned just before (a changed batch, a retry after a partial send: plan
    /// again). Default: 0 for all (backends that write the header themselves, or never
    /// coalesce).
    fn plan_ipv4_idents(&mut self, batch: &[TxDatagram<'_>], idents: &mut [u16]) {
        let _ = batch;
        idents.fill(0);
    }

    /// How many datagrams from the front of `batch` the next [`Datapath::send`] of exactly
    /// this batch would carry in its first message (one UDP GSO message, or one datagram); 0
    /// for an empty batch. Default: 1 (no coalescing).
    fn first_message_len(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        batch.len().min(1)
    }

    /// Receives up to `bufs.len()` buffers; fills `meta[i]` for each. Returns how many were
    /// filled; `Err(WouldBlock)` when nothing is waiting.
    ///
    /// # Errors
    /// I/O errors other than an empty queue.
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize>;

    /// A descriptor that becomes readable when [`Datapath::recv`] may return data (register it
    /// with mio/epoll). `None`: the caller must poll.
    fn readiness_fd(&self) -> Option<RawFd>;

    /// The kernel-demux member socket (the UDP socket in the group's steering map), which
    /// proves the member's slot to a restarted daemon. Default: the readiness descriptor
    /// (the `udp` backend's socket); [`relay::RelayDatapath`], whose readiness descriptor is
    /// an epoll set, returns its UDP socket.
    fn member_socket_fd(&self) -> Option<RawFd> {
        self.readiness_fd()
    }

    /// Receive-side losses the engine never saw, for the device counters (a backend that
    /// loses nothing unseen keeps the default: none). May make a system call: call it when
    /// counters are read, not per packet.
    fn rx_drops(&mut self) -> RxDrops {
        RxDrops::default()
    }

    /// How long from now until the backend will have work without the descriptor becoming
    /// readable (a delayed packet of a fault injector, a neighbour-resolution timer); zero if
    /// that is already the case. Relative, so each backend measures it on its own clock (the
    /// system clock, or an injected virtual one). Default: never.
    fn next_wakeup(&self) -> Option<std::time::Duration> {
        None
    }
}
