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
//! Middleware wraps any backend: [`fault::FaultInjector`] applies the stack's one fault model
//! (seeded loss, burst loss, duplication, reordering, corruption, delay) to what it sends.
//!
//! # The IP header contract (why the ICRC is right)
//!
//! The ICRC covers the IPv4 Identification and flags (only TOS, TTL and the checksum are
//! masked). The engine computes every ICRC for an IPv4 header with **Identification 0 and DF
//! set**, and every backend promises that is the header that goes on the wire: `raw` writes it
//! itself, and `udp` relies on Linux sending ID 0 from an unconnected socket with
//! `IP_PMTUDISC_DO` (tested in `tests/udp_ident.rs`). On receive, a backend that sees the IP
//! header reports its Identification and DF bit in [`RxMeta::ipv4`]; one that cannot (a UDP
//! socket) leaves it `None` and the engine recovers them from the ICRC by linearity
//! ([`roce_wire::icrc::Ipv4IdentSolver`]).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;

pub mod fault;
pub(crate) mod open;
pub mod raw;
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
    /// IPv4 Identification and DF when the backend saw the IP header (`raw`, `sim`); `None`
    /// from a UDP socket.
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

    /// Receives up to `bufs.len()` buffers; fills `meta[i]` for each. Returns how many were
    /// filled; `Err(WouldBlock)` when nothing is waiting.
    ///
    /// # Errors
    /// I/O errors other than an empty queue.
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize>;

    /// A descriptor that becomes readable when [`Datapath::recv`] may return data (register it
    /// with mio/epoll). `None`: the caller must poll.
    fn readiness_fd(&self) -> Option<RawFd>;

    /// How long from now until the backend will have work without the descriptor becoming
    /// readable (a delayed packet of a fault injector, a neighbour-resolution timer); zero if
    /// that is already the case. Relative, so each backend measures it on its own clock (the
    /// system clock, or an injected virtual one). Default: never.
    fn next_wakeup(&self) -> Option<std::time::Duration> {
        None
    }
}
