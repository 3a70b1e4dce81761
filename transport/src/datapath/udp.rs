//! The `udp` backend: RoCEv2 datagrams through one kernel UDP socket bound to `IP:4791`.
//!
//! # Read first: what this backend relies on
//!
//! - **IPv4 Identification 0 and DF.** The ICRC covers the IPv4 Identification and flags, and
//!   the engine computes it for Identification 0 with DF set (see [`super`]). A UDP socket
//!   cannot write the IP header, so we make Linux write that one: with `IP_MTU_DISCOVER =
//!   IP_PMTUDISC_DO` every datagram carries DF, and for a DF datagram from an *unconnected*
//!   socket `ip_select_ident_segs()` writes Identification 0 (a connected socket would count
//!   per socket instead). So the socket is never `connect`ed. `tests/udp_ident.rs` checks the
//!   captured header and the ICRC on the wire.
//! - **IPv4 GSO: each segment's ICRC for its own Identification.** A UDP GSO message
//!   (`UDP_SEGMENT`) is cut into datagrams by the kernel (or a NIC), and the ICRC covers each
//!   one's Identification. What Linux 6.x does (read in the source; `tests/udp_ident.rs` and
//!   `tests/gso.rs` check it on this kernel):
//!   - `ip_select_ident_segs()` (include/net/ip.h) gives the message its Identification:
//!     from a *connected* socket the socket's counter (`atomic_add_return(segs, &inet_id)`,
//!     started at a random value by `connect`, advanced by 1 per `sendmsg` whatever the
//!     segment count); from an *unconnected* socket with DF (`IP_PMTUDISC_DO`) **0**;
//!     without DF a hashed per-destination counter with random jumps (`__ip_select_ident`),
//!     which nobody can predict.
//!   - `inet_gso_segment()` (net/ipv4/af_inet.c) then numbers the segments `id, id + 1, ..`
//!     for UDP (`SKB_GSO_UDP_L4`, cut by `__udp_gso_segment`; only TCP has a fixed-ID flag).
//!   - Who runs it: the sending stack when the device lacks USO (`validate_xmit_skb`), or
//!     the receiving stack for a UDP socket without `UDP_GRO` (`udp_rcv_segment`, also rxe's
//!     tunnel socket); veth, bridge and tun pass the message on whole, and a GRO socket or a
//!     raw socket on the same host gets it whole. Each way the segments carry `id + k`.
//!   - A NIC with hardware USO cuts the message itself and numbers the Identifications as
//!     its hardware does (drivers follow the TSO convention of counting up, but nothing in
//!     the kernel's USO contract says so, and this backend cannot see the wire).
//!
//!   So this socket is never `connect`ed and always sets DF: a single datagram carries
//!   Identification 0 and segment `k` of a GSO message carries `k`. The engine asks
//!   [`Datapath::plan_ipv4_idents`] which datagrams will share a message and rewrites each
//!   segment's ICRC for its number ([`roce_wire::icrc::Ipv4IdentPatcher`], at most 16 XORs);
//!   only a batch planned just before its send is coalesced (any other IPv4 datagram goes
//!   alone). IPv4 GSO is used to loopback destinations, and off loopback when the interface
//!   of the local address segments in software (driver `veth`, `tun`, `bridge` or `dummy`,
//!   from `ETHTOOL_GDRVINFO`) or [`UdpOptions::ipv4_gso_any_device`] says so; a physical NIC
//!   (whose USO we could not verify) gets one datagram per message. IPv6 has no
//!   Identification; its datagrams are coalesced to any destination. A run to coalesce is
//!   consecutive datagrams with the same destination, TOS and hop limit, equal lengths (the
//!   last may be shorter), payloads back to back in memory (the engine's transmit arena
//!   lays them out so), at most 64 of them and 64 KiB in all, each within the interface MTU.
//! - **GSO fallback** (as quinn-udp): if a GSO send fails with `EIO` (older kernels: a device
//!   without checksum offload; IPsec) or `EINVAL`, GSO is switched off for this socket, counted
//!   in [`UdpStats::gso_fallbacks`], and the same datagrams are sent again one per message
//!   (IPv4: by the caller, after planning again, since their ICRCs were rewritten).
//! - **GRO** (`UDP_GRO`): the kernel may hand over up to 64 datagrams of one flow in one
//!   buffer; [`RxMeta::stride`] is their size (the last may be shorter). Receive buffers must
//!   then hold 64 KiB. What the kernel merges (`inet_gro_receive`, `udp_gro_receive_segment`,
//!   6.x): only datagrams with the same source and destination address, protocol and UDP
//!   ports, arriving on the same device (`dev_gro_receive`), with a non-zero UDP checksum
//!   (rdma_rxe sends 0, so its datagrams are never merged), all of the buffer's size but the
//!   last, at most 64; since 6.9 (and stable backports) also the same TOS, TTL and DF, with
//!   Identifications counting up by one (or all equal, with DF). So one buffer never mixes
//!   peers (its one source address is every datagram's), and the engine cuts it at the
//!   stride and handles each datagram on its own (its own BTH, its own destination QP, its
//!   own ICRC): datagrams of different QPs of one peer may share a buffer and still reach
//!   their own QPs. Before 6.9 TOS was not compared, so an ECN CE mark could be reported for
//!   a whole buffer or lost.
//! - **TOS and hop limit**: the socket's defaults are [`UdpOptions::tos`] and
//!   [`UdpOptions::hop_limit`]; a datagram that asks for another value gets an `IP_TOS` /
//!   `IPV6_TCLASS` (`IP_TTL` / `IPV6_HOPLIMIT`) control message. Received TOS / traffic class
//!   (and so ECN CE) come from `IP_RECVTOS` / `IPV6_RECVTCLASS`. The IPv6 flow label is left
//!   to the kernel (the ICRC masks it).
//! - **The IPv4 receive check, and raw receive.** A UDP socket does not show the IP header,
//!   whose Identification the ICRC covers. So, for an IPv4 address that is not loopback and
//!   when the process may (`CAP_NET_RAW`; [`UdpOptions::raw_receive`], on by default),
//!   datagrams are received through a raw IPv4 socket bound to the address, with a classic BPF
//!   filter for our port; the UDP socket stays bound (it sends, and holds the port so that no
//!   ICMP port-unreachable goes out) with a drop-all filter, as the `raw` backend's guard
//!   socket. The engine then checks all 32 bits of the ICRC ([`DatapathCaps::sees_ip_header`],
//!   [`UdpDatapath::raw_receive`]). Costs: one copy of each payload down by its 28 header bytes,
//!   and the UDP socket's filter drops show in `nstat` as `UdpInErrors`. A whole GSO
//!   message from a sender on this host (over a veth or bridge) reaches the raw socket as one
//!   packet; it is recognised and cut at its segment size (`split_gso_message`, counted in
//!   [`UdpStats::raw_gso_messages`]), and its segments checked with Identifications `id + k`.
//!   The guarding UDP socket has `UDP_GRO`, so the kernel does not cut such a message into
//!   datagrams for it only to drop them; with it NAPI GRO (a NIC's) merges our flows too, and
//!   the raw socket sees those merged the same way, with Identifications counting up (a
//!   sender's USO) or all equal (DF; rocectl off loopback without GSO sends 0). The second
//!   datagram tells which: when it does not check with `id + 1`, the buffer is passed on
//!   without its header fields, so the engine recovers each Identification from its ICRC as
//!   for a UDP socket (below; `tests/udp_raw_gro.rs`). Loopback
//!   addresses keep the UDP socket: GSO messages reach a raw socket there as one large packet.
//!   Without raw receive, the engine recovers the Identification from the ICRC and holds each
//!   peer to the Identifications it has been sending ([`roce_wire::icrc::Ipv4IdentChecker`]):
//!   a corrupted packet then gets through with probability 2^-32 from a peer that sends
//!   Identification 0 (rocectl), about 2^-23.7 from rdma_rxe during a flow, and up to 2^-16
//!   for a peer's first packet; see [`super`] for the summary and the checker for the table.
//!   `tests/udp_raw_receive.rs` shows a packet with a wrong Identification caught with raw
//!   receive and accepted without.
//! - **IPv6 zero UDP checksums accepted** (`UDP_NO_CHECK6_RX`): rdma_rxe sends IPv6 UDP with
//!   checksum 0 (as it does IPv4), which plain IPv6 UDP forbids, so the kernel would drop
//!   every rxe packet before our socket. The ICRC covers the whole packet, so nothing is lost.
//!   We still *send* a real checksum (the kernel's default; offloaded, and every receiver
//!   accepts it, including rxe, whose tunnel socket takes both), so middleboxes that insist on
//!   IPv6 UDP checksums pass our traffic. `tests/udp_ipv6_checksum.rs` checks both directions.
//! - **Kernel demux** ([`UdpDatapath::bind_demux`], [`super::demux`]): the socket binds with
//!   `SO_REUSEPORT` into a group of processes sharing `IP:4791` and joins the steering map at
//!   its slot. Raw receive is not used then (a raw socket sees everybody's datagrams), nor
//!   `UDP_GRO` except on a loopback address or under [`super::relay`] (see [`super::demux`]:
//!   GRO merges by ports only; on loopback no NAPI GRO runs, so a multi-datagram packet there
//!   is one sender's GSO message, cut at DestQP changes as said next; elsewhere the relay
//!   hands on what GRO merged for other members). A group's steering program sees only the first
//!   datagram of a GSO message that reaches it whole (from a sender on the same host, over
//!   loopback, a veth or a bridge), so every socket, demux or not, cuts its GSO runs at every
//!   change of BTH DestQP: a message never carries two destination QPs (the engine sends one
//!   QP's packets back to back, so this costs at most one message per QP change).
//! - **No `IP_RECVERR`**: on an unconnected socket ICMP errors are then not reported at all
//!   (with it, they would come back as errors of later sends and receives); an unreachable
//!   peer shows up as RC retries running out, like on a NIC.
//!
//! Batches go out with one `sendmmsg` and come in with one `recvmmsg` (per
//! [`UdpOptions::batch`] messages). The message headers, iovecs, addresses and control buffers
//! live in the struct: a send or receive allocates nothing. Linux only.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::ptr;

use roce_wire::icrc;
use socket2::{Domain, Protocol, SockAddr, SockFilter, Socket, Type};

use super::demux::{Demux, DemuxError};
use super::{Datapath, DatapathCaps, RxDrops, RxMeta, TxDatagram};
use crate::error::OpenError;

/// Most datagrams one GSO message carries (`UDP_MAX_SEGMENTS` in older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most datagrams the kernel coalesces into one GRO buffer (`UDP_GRO_CNT_MAX`).
const GRO_MAX_SEGMENTS: usize = 64;
/// Largest batch (messages per system call) [`UdpOptions::batch`] may ask for.
const MAX_BATCH: usize = 1_024;
/// Control-message room per message (we use at most three 4-byte messages: 3 x 24 bytes).
const CTRL_LEN: usize = 128;
/// IPv4 header without options.
const IPV4_HEADER: usize = 20;
/// IPv6 header.
const IPV6_HEADER: usize = 40;
/// UDP header.
const UDP_HEADER: usize = 8;
/// Largest UDP payload: the 16-bit UDP length (and for IPv4 the total length) limits it.
const MAX_UDP_PAYLOAD_V4: usize = 65_535 - IPV4_HEADER - UDP_HEADER;
/// Largest UDP payload over IPv6 (no jumbograms).
const MAX_UDP_PAYLOAD_V6: usize = 65_535 - UDP_HEADER;
/// `recvmmsg` calls one receive may make when every message was truncated.
const RECV_ROUNDS: usize = 4;
/// The MTU assumed when the interface of the local address cannot be found.
const FALLBACK_MTU: usize = 1_500;
/// `SO_RXQ_OVFL` (asm-generic/socket.h; libc exports it for few Linux targets): every received
/// message carries the socket's drop count (`sk_drops`) as a `u32` control message.
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_RXQ_OVFL: libc::c_int = 40;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_RXQ_OVFL: libc::c_int = 0x0024;
/// `SO_MEMINFO`: the socket's memory counters, `u32[SK_MEMINFO_VARS]`, `sk_drops` among them.
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_MEMINFO: libc::c_int = 55;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_MEMINFO: libc::c_int = 0x0039;

/// How to open a [`UdpDatapath`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpOptions {
    /// Coalesce runs of datagrams into GSO messages where the kernel supports `UDP_SEGMENT`
    /// and it keeps IPv4 Identification 0 (see the module docs).
    pub gso: bool,
    /// IPv4 GSO off loopback also through interfaces whose segmentation this backend has not
    /// verified: a physical NIC (its hardware may cut the message and number the segments
    /// itself), a VLAN, bond or macvlan over one. Off by default: IPv4 GSO off loopback is
    /// then used only from `veth`, `tun`/`tap`, `bridge` and `dummy` interfaces, where the
    /// kernel segments in software (see the module docs).
    pub ipv4_gso_any_device: bool,
    /// Let the kernel coalesce received datagrams (`UDP_GRO`).
    pub gro: bool,
    /// The socket's TOS / traffic class; datagrams with another one get a control message.
    pub tos: u8,
    /// The socket's TTL / hop limit (0: the kernel's default); datagrams with another
    /// (non-zero) one get a control message.
    pub hop_limit: u8,
    /// Messages per `sendmmsg`/`recvmmsg` (1..=1024); larger batches go in several calls.
    pub batch: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` asked for, in bytes (the kernel caps them at
    /// `net.core.wmem_max`/`rmem_max`; failure is ignored).
    pub socket_buffer: usize,
    /// IPv4, not loopback: receive through a raw IP socket when the process may open one
    /// (`CAP_NET_RAW`), so that the IP header, and with it the Identification the ICRC covers,
    /// is seen and all 32 bits of the ICRC are checked (see the module docs). Falls back to
    /// the plain UDP socket without the privilege.
    pub raw_receive: bool,
}

impl Default for UdpOptions {
    fn default() -> Self {
        Self {
            gso: true,
            ipv4_gso_any_device: false,
            gro: true,
            tos: 0,
            hop_limit: 64,
            batch: 64,
            socket_buffer: 8 << 20,
            raw_receive: true,
        }
    }
}

/// Counters of a [`UdpDatapath`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// `sendmmsg` calls that sent something.
    pub send_calls: u64,
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// GSO messages sent (each carried two or more datagrams).
    pub gso_messages: u64,
    /// Datagrams that went out inside GSO messages.
    pub gso_datagrams: u64,
    /// Times GSO failed (`EIO`/`EINVAL`) and was switched off for this socket.
    pub gso_fallbacks: u64,
    /// Sends refused with `ENOBUFS` (reported as `WouldBlock`).
    pub no_buffer_space: u64,
    /// `recvmmsg` calls that returned something.
    pub recv_calls: u64,
    /// Messages received and passed on (a GRO message counts once).
    pub rx_messages: u64,
    /// Datagrams received and passed on (GRO messages counted by segment).
    pub rx_datagrams: u64,
    /// Received messages that carried more than one datagram (GRO).
    pub gro_messages: u64,
    /// Datagrams dropped because they did not fit the receive buffer (`MSG_TRUNC`).
    pub truncated: u64,
    /// Receives whose control messages were cut short (`MSG_CTRUNC`; TOS/stride may be lost).
    pub ctrl_truncated: u64,
    /// Datagrams the kernel dropped for this socket instead of queueing them (receive buffer
    /// full, bad UDP checksum): the socket's `sk_drops`, read from the `SO_RXQ_OVFL` control
    /// message of each receive and from `SO_MEMINFO` when [`Datapath::rx_drops`] asks. The
    /// control message carries the count as it was when that datagram was *queued*, so drops
    /// behind the last queued datagram show only with the next one or `rx_drops`. With raw
    /// receive, the raw socket's.
    pub kernel_drops: u64,
    /// Raw receive: datagrams whose IP/UDP headers were inconsistent (dropped; the kernel's
    /// UDP layer would have dropped them too).
    pub raw_malformed: u64,
    /// Raw receive: whole UDP GSO messages (from a sender on this host, over a veth or
    /// bridge) cut back into their datagrams (see `split_gso_message`).
    pub raw_gso_messages: u64,
}

/// Why a [`UdpDatapath`] could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpError {
    /// Another socket already holds the address and port.
    #[error(
        "another RoCE stack or rocectl instance already uses {addr} (a kernel rdma_rxe device \
         holds 0.0.0.0:4791; see `ss -uapn 'sport = :{port}'`)",
        port = addr.port()
    )]
    AddrInUse {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The IP address is not configured on any interface of this host (or namespace).
    #[error(
        "{ip} is not an address of this host: configure it on an interface (`ip addr add`) or \
         pick a local address (`ip -br addr`)",
        ip = addr.ip()
    )]
    AddrNotAvailable {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The wildcard address cannot be used: every datagram's ICRC covers the source IP.
    #[error(
        "bind to one of this host's addresses, not {addr}: the ICRC covers the source IP, so \
         the stack must know it"
    )]
    UnspecifiedAddr {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The system refused the bind.
    #[error(
        "permission denied binding {addr} (ports below 1024 need CAP_NET_BIND_SERVICE; a \
         security policy may forbid it): {source}"
    )]
    PermissionDenied {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// Kernel demux: the address's reuseport group belongs to another user, and the kernel
    /// lets only one user's sockets share an address.
    #[error(
        "kernel demux on {addr}: the sockets sharing it belong to uid {owner} and this process \
         runs as uid {uid}; the kernel lets only one user's sockets share an address, so kernel \
         demux serves one user (use the daemon's forwarding mode for several users)"
    )]
    DemuxOtherUser {
        /// The address asked for.
        addr: SocketAddr,
        /// The uid that owns the sockets on it.
        owner: u32,
        /// Ours.
        uid: u32,
    },
    /// Kernel demux: a rocectl device with several engines ([`crate::DeviceConfig::engines`])
    /// holds the address with its own reuseport group and steering program; joining would
    /// replace its program and strand its datagrams.
    #[error(
        "kernel demux on {addr}: a rocectl device with several engines holds it (its own \
         SO_REUSEPORT group and steering; the daemon cannot share the address until it closes)"
    )]
    DemuxShardedHolder {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Kernel demux: joining the group failed.
    #[error("udp backend on {addr}: {source}")]
    Demux {
        /// The address asked for.
        addr: SocketAddr,
        /// What went wrong.
        source: DemuxError,
    },
    /// Another OS error while creating or configuring the socket.
    #[error("udp backend on {addr}: {op}: {source}")]
    Io {
        /// The address asked for.
        addr: SocketAddr,
        /// The step that failed.
        op: &'static str,
        /// What the system said.
        source: io::Error,
    },
}

impl From<UdpError> for io::Error {
    fn from(e: UdpError) -> Self {
        let kind = match &e {
            UdpError::AddrInUse { .. } | UdpError::DemuxShardedHolder { .. } => {
                io::ErrorKind::AddrInUse
            }
            UdpError::AddrNotAvailable { .. } => io::ErrorKind::AddrNotAvailable,
            UdpError::UnspecifiedAddr { .. } => io::ErrorKind::InvalidInput,
            UdpError::PermissionDenied { .. } | UdpError::DemuxOtherUser { .. } => {
                io::ErrorKind::PermissionDenied
            }
            UdpError::Demux { .. } => io::ErrorKind::Other,
            UdpError::Io { source, .. } => source.kind(),
        };
        Self::new(kind, e)
    }
}

impl From<UdpError> for OpenError {
    fn from(e: UdpError) -> Self {
        match e {
            UdpError::AddrInUse { addr } => Self::AddrInUse {
                addr,
                detail: crate::portowner::in_use_detail(addr),
            },
            UdpError::AddrNotAvailable { addr } => Self::AddrNotAvailable { addr },
            UdpError::DemuxShardedHolder { addr } => Self::AddrInUse {
                addr,
                detail: "a rocectl device with several engines holds it (its own SO_REUSEPORT \
                         group and steering), so kernel demux cannot share it until that device \
                         closes"
                    .into(),
            },
            other => Self::Backend {
                backend: "udp",
                message: other.to_string(),
            },
        }
    }
}

/// RoCEv2 over a kernel UDP socket; see the module docs.
pub struct UdpDatapath {
    socket: Socket,
    /// The raw IPv4 socket datagrams are received through (raw receive), if open; the UDP
    /// socket then only sends and keeps the port (its drop-all filter queues nothing).
    raw: Option<Socket>,
    local: SocketAddr,
    opts: UdpOptions,
    /// Name of the interface that owns the local address, if found.
    interface: Option<String>,
    ip_mtu: usize,
    /// Datagrams per GSO message (1: GSO off), after policy and fallbacks.
    gso_segments: usize,
    /// IPv4 GSO to destinations off loopback (the interface segments in software, or
    /// [`UdpOptions::ipv4_gso_any_device`]).
    ipv4_gso_off_loopback: bool,
    /// The driver of the interface ([`UdpDatapath::interface`]), if the kernel said.
    driver: Option<String>,
    /// The batch [`Datapath::plan_ipv4_idents`] planned last: (first payload address, count).
    plan: Option<(usize, usize)>,
    /// The batch being sent (or planned) was planned: IPv4 runs may be coalesced.
    planned: bool,
    gro_segments: usize,
    stats: UdpStats,
    /// The kernel's last `sk_drops` (a wrapping `u32`) folded into `stats.kernel_drops`.
    sk_drops: u32,
    /// Kernel demux: our slot in the group.
    demux_slot: Option<u32>,
    msgs: Msgs,
}

impl UdpDatapath {
    /// Opens a non-blocking UDP socket bound to exactly `local` (an address of this host; port
    /// 4791 for RoCEv2), with DF, TOS/traffic-class reporting, GSO and GRO as available.
    ///
    /// # Errors
    /// [`UdpError::AddrInUse`] when another socket holds `local` (`SO_REUSEADDR` is off, so a
    /// second stack on the same address fails), [`UdpError::AddrNotAvailable`] when the IP is
    /// not configured here, [`UdpError::UnspecifiedAddr`] for `0.0.0.0`/`::`,
    /// [`UdpError::PermissionDenied`], or [`UdpError::Io`].
    pub fn bind(local: SocketAddr, opts: UdpOptions) -> Result<Self, UdpError> {
        Self::open(local, opts, None, false)
    }

    /// Opens a socket on `local` that shares it with other processes through kernel demux
    /// ([`super::demux`]): bound with `SO_REUSEPORT` into the address's reuseport group and
    /// put in `demux`'s slot, so that it receives exactly the datagrams whose destination QPN
    /// is in the slot's range. Raw receive is off whatever `opts` says, `UDP_GRO` too except on
    /// a loopback address, and GSO runs keep to one destination QPN (see the module docs).
    ///
    /// # Errors
    /// As [`UdpDatapath::bind`]; [`UdpError::DemuxOtherUser`] when the address's sockets
    /// belong to another user; [`UdpError::AddrInUse`] when a socket without `SO_REUSEPORT`
    /// (an exclusive rocectl, rdma_rxe) holds it; [`UdpError::DemuxShardedHolder`] when a
    /// rocectl device with several engines holds it; [`UdpError::Demux`] when joining the
    /// group fails (the slot is taken...).
    pub fn bind_demux(
        local: SocketAddr,
        opts: UdpOptions,
        demux: &Demux,
    ) -> Result<Self, UdpError> {
        // GRO only on a loopback address, where no NAPI GRO runs (see the module docs).
        let opts = UdpOptions {
            gro: opts.gro && local.ip().is_loopback(),
            raw_receive: false,
            ..opts
        };
        Self::open(local, opts, Some(demux), true)
    }

    /// As [`UdpDatapath::bind_demux`] but with `UDP_GRO` as `opts` asks, on any address: for
    /// [`super::relay`], which hands on the datagrams NAPI GRO merged into its buffers for
    /// other members.
    ///
    /// # Errors
    /// As [`UdpDatapath::bind_demux`].
    pub fn bind_demux_with_gro(
        local: SocketAddr,
        opts: UdpOptions,
        demux: &Demux,
    ) -> Result<Self, UdpError> {
        let opts = UdpOptions {
            raw_receive: false,
            ..opts
        };
        Self::open(local, opts, Some(demux), true)
    }

    /// Opens a socket on `local` bound with `SO_REUSEPORT` and no demux group: one of the
    /// sockets of a device with several engines ([`super::shard`], which steers the group).
    /// Raw receive is off (a raw socket would see every engine's datagrams).
    ///
    /// # Errors
    /// As [`UdpDatapath::bind`].
    pub(crate) fn bind_reuseport(local: SocketAddr, opts: UdpOptions) -> Result<Self, UdpError> {
        let opts = UdpOptions {
            raw_receive: false,
            ..opts
        };
        Self::open(local, opts, None, true)
    }

    fn open(
        local: SocketAddr,
        opts: UdpOptions,
        demux: Option<&Demux>,
        reuse_port: bool,
    ) -> Result<Self, UdpError> {
        if local.ip().is_unspecified() {
            return Err(UdpError::UnspecifiedAddr { addr: local });
        }
        let io_err = |op: &'static str| {
            move |source| UdpError::Io {
                addr: local,
                op,
                source,
            }
        };
        let v4 = local.is_ipv4();
        let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))
            .map_err(io_err("create socket"))?;
        socket
            .set_nonblocking(true)
            .map_err(io_err("set O_NONBLOCK"))?;
        socket
            .set_reuse_address(false)
            .map_err(io_err("clear SO_REUSEADDR"))?;
        if reuse_port {
            socket
                .set_reuse_port(true)
                .map_err(io_err("set SO_REUSEPORT"))?;
        }
        // Best effort: the kernel caps these at net.core.{w,r}mem_max without failing.
        let _ = socket.set_send_buffer_size(opts.socket_buffer);
        let _ = socket.set_recv_buffer_size(opts.socket_buffer);
        let fd = socket.as_raw_fd();
        if v4 {
            setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )
            .map_err(io_err("set IP_MTU_DISCOVER"))?;
            socket
                .set_recv_tos_v4(true)
                .map_err(io_err("set IP_RECVTOS"))?;
            socket
                .set_tos_v4(u32::from(opts.tos))
                .map_err(io_err("set IP_TOS"))?;
            if opts.hop_limit != 0 {
                socket
                    .set_ttl_v4(u32::from(opts.hop_limit))
                    .map_err(io_err("set IP_TTL"))?;
            }
        } else {
            socket
                .set_only_v6(true)
                .map_err(io_err("set IPV6_V6ONLY"))?;
            setsockopt_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )
            .map_err(io_err("set IPV6_MTU_DISCOVER"))?;
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)
                .map_err(io_err("set IPV6_DONTFRAG"))?;
            // rdma_rxe (and RoCE NICs) send IPv6 UDP with checksum 0; without this the kernel
            // drops those datagrams before the socket (Udp6InCsumErrors). The ICRC protects
            // the packet instead.
            setsockopt_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)
                .map_err(io_err("set UDP_NO_CHECK6_RX"))?;
            socket
                .set_recv_tclass_v6(true)
                .map_err(io_err("set IPV6_RECVTCLASS"))?;
            socket
                .set_tclass_v6(u32::from(opts.tos))
                .map_err(io_err("set IPV6_TCLASS"))?;
            if opts.hop_limit != 0 {
                socket
                    .set_unicast_hops_v6(u32::from(opts.hop_limit))
                    .map_err(io_err("set IPV6_UNICAST_HOPS"))?;
            }
        }
        socket
            .bind(&SockAddr::from(local))
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EADDRINUSE) if demux.is_some() => demux_in_use(local),
                Some(libc::EADDRINUSE) => UdpError::AddrInUse { addr: local },
                Some(libc::EADDRNOTAVAIL) => UdpError::AddrNotAvailable { addr: local },
                Some(libc::EACCES | libc::EPERM) => UdpError::PermissionDenied {
                    addr: local,
                    source,
                },
                _ => UdpError::Io {
                    addr: local,
                    op: "bind",
                    source,
                },
            })?;
        let bound = socket
            .local_addr()
            .map_err(io_err("read the bound address"))?
            .as_socket()
            .unwrap_or(local);
        if let Some(d) = demux {
            // Before attaching the demux program: a sharded device's group must keep its own
            // (`super::shard`, "A kernel-demux member joining later").
            if super::shard::sharded_device_holds(bound) {
                return Err(UdpError::DemuxShardedHolder { addr: bound });
            }
            d.group()
                .join(socket.as_fd(), d.slot())
                .map_err(|source| UdpError::Demux {
                    addr: local,
                    source,
                })?;
        }

        let interface = interface_of(bound.ip());
        let driver = interface
            .as_deref()
            .and_then(|name| interface_driver(fd, name));
        let ipv4_gso_off_loopback = v4
            && !bound.ip().is_loopback()
            && (opts.ipv4_gso_any_device
                || driver
                    .as_deref()
                    .is_some_and(|d| SOFTWARE_SEGMENTING_DRIVERS.contains(&d)));
        let gso_segments = if opts.gso
            && (!v4 || bound.ip().is_loopback() || ipv4_gso_off_loopback)
            && gso_supported(fd)
        {
            GSO_MAX_SEGMENTS
        } else {
            1
        };
        let raw = if v4 && opts.raw_receive && !bound.ip().is_loopback() {
            open_raw_receive(&socket, bound, opts.socket_buffer)
        } else {
            None
        };
        // With raw receive the UDP socket only guards the port; `UDP_GRO` on it keeps the
        // kernel from cutting every whole GSO message from a sender on this host into
        // datagrams just for its drop-all filter (12-22% of a veth run's CPU). It also lets
        // NAPI GRO merge our flows before the raw socket sees them: `strip_ipv4_udp` cuts
        // those. The UDP socket itself never receives, so its GRO segments stay 1.
        if raw.is_some() {
            let _ = setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1);
        }
        let gro_segments = if raw.is_none()
            && opts.gro
            && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
        {
            GRO_MAX_SEGMENTS
        } else {
            1
        };
        // The kernel's drop count with every receive (Linux 2.6.33+).
        setsockopt_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1).map_err(io_err("set SO_RXQ_OVFL"))?;
        let ip_mtu = interface
            .as_deref()
            .and_then(|name| interface_mtu(fd, name))
            .unwrap_or(FALLBACK_MTU);
        let batch = opts.batch.clamp(1, MAX_BATCH);
        Ok(Self {
            socket,
            raw,
            local: bound,
            opts: UdpOptions { batch, ..opts },
            interface,
            ip_mtu,
            gso_segments,
            ipv4_gso_off_loopback,
            driver,
            plan: None,
            planned: false,
            gro_segments,
            stats: UdpStats::default(),
            sk_drops: 0,
            demux_slot: demux.map(Demux::slot),
            msgs: Msgs::new(batch, v4),
        })
    }

    /// Counters since the socket was opened.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// The options in force (`batch` clamped).
    pub fn options(&self) -> &UdpOptions {
        &self.opts
    }

    /// Name of the interface that owns the local address (`lo` for 127.0.0.0/8), if found.
    pub fn interface(&self) -> Option<&str> {
        self.interface.as_deref()
    }

    /// The socket, for reading options (buffer sizes) or registering elsewhere.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// Whether datagrams come in through a raw IP socket that shows their IP header (see
    /// [`UdpOptions::raw_receive`]).
    pub fn raw_receive(&self) -> bool {
        self.raw.is_some()
    }

    /// Kernel demux: the slot this socket holds in its group ([`UdpDatapath::bind_demux`]).
    pub fn demux_slot(&self) -> Option<u32> {
        self.demux_slot
    }

    /// The descriptor datagrams are received from.
    fn rx_fd(&self) -> RawFd {
        self.raw.as_ref().unwrap_or(&self.socket).as_raw_fd()
    }

    /// Folds the kernel's cumulative drop count `now` into [`UdpStats::kernel_drops`].
    fn note_sk_drops(&mut self, now: u32) {
        self.stats.kernel_drops += u64::from(now.wrapping_sub(self.sk_drops));
        self.sk_drops = now;
    }

    /// The driver of the interface that owns the local address (`veth`, `tun`, `bridge`,
    /// `loopback`, a NIC driver), if the kernel reports one (`ETHTOOL_GDRVINFO`).
    pub fn driver(&self) -> Option<&str> {
        self.driver.as_deref()
    }

    /// Whether IPv4 datagrams to destinations off loopback are coalesced into GSO messages
    /// (see the module docs and [`UdpOptions::ipv4_gso_any_device`]).
    pub fn ipv4_gso_off_loopback(&self) -> bool {
        self.ipv4_gso_off_loopback && self.gso_segments > 1
    }

    /// Whether `d` may share a GSO message: IPv6; IPv4 only in a planned batch (the engine
    /// rewrote each segment's ICRC for its Identification), to loopback or, where the
    /// interface segments in software, anywhere.
    fn gso_allowed(&self, dst: &SocketAddr) -> bool {
        self.gso_segments > 1
            && match dst {
                SocketAddr::V4(a) => {
                    self.planned && (a.ip().is_loopback() || self.ipv4_gso_off_loopback)
                }
                SocketAddr::V6(_) => true,
            }
    }

    /// Largest UDP payload one message may carry.
    fn max_message_payload(&self) -> usize {
        if self.local.is_ipv4() {
            MAX_UDP_PAYLOAD_V4
        } else {
            MAX_UDP_PAYLOAD_V6
        }
    }

    /// Largest UDP payload of one datagram that fits the interface MTU (a GSO segment larger
    /// than this would fail with `EINVAL` and wrongly switch GSO off).
    fn max_segment(&self) -> usize {
        let ip_header = if self.local.is_ipv4() {
            IPV4_HEADER
        } else {
            IPV6_HEADER
        };
        self.ip_mtu.saturating_sub(ip_header + UDP_HEADER)
    }

    /// Fills the message arrays from the front of `batch`; returns how many messages. Stops
    /// before a datagram of the wrong address family (the next call reports it).
    fn prepare_tx(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        let gso_max = self.gso_segments;
        let max_payload = self.max_message_payload();
        let max_segment = self.max_segment();
        let mut i = 0;
        let mut m = 0;
        while i < batch.len() && m < self.msgs.capacity() {
            let d = &batch[i];
            if !self.msgs.set_name(m, &d.dst) {
                break;
            }
            let seg = d.payload.len();
            let mut run = 1;
            let mut total = seg;
            if seg > 0 && seg <= max_segment && self.gso_allowed(&d.dst) {
                let mut end = d.payload.as_ptr_range().end;
                while i + run < batch.len() && run < gso_max {
                    let n = &batch[i + run];
                    let len = n.payload.len();
                    if n.dst != d.dst
                        || n.tos != d.tos
                        || n.hop_limit != d.hop_limit
                        || len == 0
                        || len > seg
                        || n.payload.as_ptr() != end
                        || total + len > max_payload
                        || dest_qpn(n.payload) != dest_qpn(d.payload)
                    {
                        break;
                    }
                    total += len;
                    run += 1;
                    end = n.payload.as_ptr_range().end;
                    if len < seg {
                        break;
                    }
                }
            }
            let tos = (d.tos != self.opts.tos).then_some(d.tos);
            let hops =
                (d.hop_limit != 0 && d.hop_limit != self.opts.hop_limit).then_some(d.hop_limit);
            let segment = (run > 1).then_some(seg as u16);
            self.msgs
                .set_tx(m, d.payload.as_ptr(), total, run, tos, hops, segment);
            i += run;
            m += 1;
        }
        m
    }

    /// Sends what fits one system call from the front of `batch`. Returns the datagrams sent
    /// and whether every prepared message went out.
    fn send_chunk(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<(usize, bool)> {
        loop {
            let msgs = self.prepare_tx(batch);
            if msgs == 0 {
                let d = &batch[0];
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "cannot send to {} from {}: address families differ",
                        d.dst, self.local
                    ),
                ));
            }
            match self.msgs.sendmmsg(self.socket.as_raw_fd(), msgs) {
                Ok(sent) => {
                    let mut datagrams = 0;
                    for k in 0..sent {
                        let segs = self.msgs.segments[k];
                        datagrams += segs;
                        if segs > 1 {
                            self.stats.gso_messages += 1;
                            self.stats.gso_datagrams += segs as u64;
                        }
                    }
                    self.stats.send_calls += 1;
                    self.stats.tx_datagrams += datagrams as u64;
                    return Ok((datagrams, sent == msgs));
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::ENOBUFS) => {
                        self.stats.no_buffer_space += 1;
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    Some(libc::EIO | libc::EINVAL) if self.msgs.segments[0] > 1 => {
                        // quinn-udp's rule: the device or kernel cannot segment; stop using
                        // GSO on this socket and send the same datagrams one by one.
                        self.gso_segments = 1;
                        self.stats.gso_fallbacks += 1;
                        if self.local.is_ipv4() {
                            // Their ICRCs were rewritten for Identifications 1, 2, ..: the
                            // caller must plan again (all 0 now) before they go out.
                            return Ok((0, false));
                        }
                    }
                    _ => return Err(e),
                },
            }
        }
    }
}

impl fmt::Debug for UdpDatapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpDatapath")
            .field("local", &self.local)
            .field("fd", &self.socket.as_raw_fd())
            .field("interface", &self.interface)
            .field("driver", &self.driver)
            .field("ip_mtu", &self.ip_mtu)
            .field("gso_segments", &self.gso_segments)
            .field("gro_segments", &self.gro_segments)
            .field("opts", &self.opts)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AsRawFd for UdpDatapath {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl Datapath for UdpDatapath {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn caps(&self) -> DatapathCaps {
        DatapathCaps {
            ip_mtu: self.ip_mtu,
            max_gso_segments: self.gso_segments,
            gro_segments: self.gro_segments,
            fixed_source_port: Some(self.local.port()),
            sees_ip_header: self.raw.is_some(),
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Sends with `sendmmsg` (GSO runs as described in the module docs). A full socket buffer
    /// (`EAGAIN`, `ENOBUFS`) or any error after the first message ends the call with the count
    /// sent so far; the error comes back on the next call, which starts with that datagram.
    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.planned = self.plan.take() == Some(plan_key(batch));
        let mut sent = 0;
        let result = loop {
            if sent == batch.len() {
                break Ok(sent);
            }
            match self.send_chunk(&batch[sent..]) {
                Ok((n, complete)) => {
                    sent += n;
                    if !complete {
                        break Ok(sent);
                    }
                }
                Err(_) if sent > 0 => break Ok(sent),
                Err(e) => break Err(e),
            }
        };
        self.planned = false;
        result
    }

    /// Prepares the first message as [`Datapath::send`] will (planned, as the engine plans
    /// every batch before sending it) and reports its datagrams.
    fn first_message_len(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        let planned = mem::replace(&mut self.planned, true);
        let n = if self.prepare_tx(&batch[..batch.len().min(self.gso_segments.max(1))]) > 0 {
            self.msgs.segments[0]
        } else {
            0
        };
        self.planned = planned;
        n
    }

    /// Plans as [`Datapath::send`] will send, assuming every message goes out: the segments
    /// of an IPv4 GSO message get `0, 1, .., n-1` (`inet_gso_segment` numbers them from the
    /// message's Identification, which is 0 for an unconnected socket with DF), everything
    /// else 0.
    fn plan_ipv4_idents(&mut self, batch: &[TxDatagram<'_>], idents: &mut [u16]) {
        let n = batch.len().min(idents.len());
        idents[..n].fill(0);
        self.plan = None;
        if !self.local.is_ipv4() || self.gso_segments <= 1 || n == 0 {
            return;
        }
        self.planned = true;
        let mut at = 0;
        while at < n {
            let msgs = self.prepare_tx(&batch[at..n]);
            if msgs == 0 {
                break;
            }
            for k in 0..msgs {
                let segs = self.msgs.segments[k];
                for (j, id) in idents[at..at + segs].iter_mut().enumerate() {
                    // j < GSO_MAX_SEGMENTS (64): fits a u16.
                    *id = j as u16;
                }
                at += segs;
            }
        }
        self.planned = false;
        self.plan = Some(plan_key(&batch[..n]));
    }

    /// Receives with `recvmmsg`. Datagrams cut short by a small buffer (`MSG_TRUNC`) are
    /// dropped and counted in [`UdpStats::truncated`]; the rest are moved up so that
    /// `bufs[..n]` and `meta[..n]` are all good. `Ok(0)` if only truncated datagrams came in
    /// (the descriptor may still be readable).
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        let n = bufs.len().min(meta.len()).min(self.msgs.capacity());
        if n == 0 {
            return Ok(0);
        }
        // A few rounds at most: a flood of oversized datagrams must not keep us here.
        let fd = self.rx_fd();
        for _ in 0..RECV_ROUNDS {
            let got = self.msgs.recvmmsg(fd, &mut bufs[..n])?;
            self.stats.recv_calls += 1;
            let mut out = 0;
            for i in 0..got {
                let flags = self.msgs.hdrs[i].msg_hdr.msg_flags;
                let len = self.msgs.hdrs[i].msg_len as usize;
                if flags & libc::MSG_TRUNC != 0 {
                    self.stats.truncated += 1;
                    continue;
                }
                if flags & libc::MSG_CTRUNC != 0 {
                    self.stats.ctrl_truncated += 1;
                }
                if out != i {
                    // An earlier message was dropped: move this one into its slot.
                    let (front, back) = bufs.split_at_mut(i);
                    let Some(dst) = front[out].get_mut(..len) else {
                        self.stats.truncated += 1;
                        continue;
                    };
                    dst.copy_from_slice(&back[0][..len]);
                }
                let (tos, gro, drops) = self.msgs.rx_ctrl(i);
                if let Some(d) = drops {
                    self.note_sk_drops(d);
                }
                if self.raw.is_some() {
                    // An IPv4 packet: strip its headers, keep what they say.
                    match strip_ipv4_udp(&mut bufs[out][..len], self.local.port()) {
                        Some(m) => meta[out] = m,
                        None => {
                            self.stats.raw_malformed += 1;
                            continue;
                        }
                    }
                    let m = meta[out];
                    self.stats.rx_messages += 1;
                    self.stats.rx_datagrams += m.len.div_ceil(m.stride.max(1)).max(1) as u64;
                    if m.stride < m.len {
                        self.stats.raw_gso_messages += 1;
                    }
                    out += 1;
                    continue;
                }
                let stride = match gro {
                    Some(s) if s > 0 && s < len => s,
                    _ => len,
                };
                meta[out] = RxMeta {
                    len,
                    stride,
                    src: self.msgs.rx_name(i).unwrap_or(self.local),
                    dst: self.local,
                    tos,
                    ipv4: None,
                };
                self.stats.rx_messages += 1;
                self.stats.rx_datagrams += if stride > 0 {
                    len.div_ceil(stride) as u64
                } else {
                    1
                };
                if stride < len {
                    self.stats.gro_messages += 1;
                }
                out += 1;
            }
            // Everything was truncated: read on rather than report "nothing" while more waits.
            if out > 0 || got == 0 {
                return Ok(out);
            }
        }
        Ok(0)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.rx_fd())
    }

    /// `kernel`: the socket's `sk_drops` now (`SO_MEMINFO`; if that fails, as of the last
    /// receive's `SO_RXQ_OVFL`). `malformed`: [`UdpStats::truncated`] and
    /// [`UdpStats::raw_malformed`].
    fn rx_drops(&mut self) -> RxDrops {
        if let Some(now) = sk_drops(self.rx_fd()) {
            self.note_sk_drops(now);
        }
        RxDrops {
            kernel: self.stats.kernel_drops,
            malformed: self.stats.truncated + self.stats.raw_malformed,
        }
    }
}

// ------------------------------------------------------------------ message arrays --

/// A control-message buffer, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Ctrl([u8; CTRL_LEN]);

/// Socket addresses of one family (fixed when the socket is bound).
enum Names {
    V4(Box<[libc::sockaddr_in]>),
    V6(Box<[libc::sockaddr_in6]>),
}

/// The `sendmmsg`/`recvmmsg` arrays, allocated once. `hdrs[i]` points into `iovs[i]`,
/// `names[i]` and `ctrls[i]` (boxed, so the addresses stay put), and its iovec at the
/// caller's buffer during one call.
struct Msgs {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    names: Names,
    ctrls: Box<[Ctrl]>,
    /// Datagrams in each prepared transmit message.
    segments: Box<[usize]>,
    /// Messages `rx_dirty..rx_linked` are linked for receive and untouched since: a receive
    /// relinks only the others (a busy poll's empty `recvmmsg` then costs no relinking of
    /// the whole array). The kernel writes the lengths and flags of the messages it fills,
    /// and a transmit relinks the messages it prepares; both raise `rx_dirty`.
    rx_linked: usize,
    /// See `rx_linked`.
    rx_dirty: usize,
}

// SAFETY: the raw pointers in `hdrs` and `iovs` point into this struct's own boxed arrays or
// into the caller's buffers during a single `&mut self` call; they are rewritten before every
// system call and never read otherwise, so moving the struct to another thread is sound.
#[allow(unsafe_code)]
unsafe impl Send for Msgs {}

impl Msgs {
    fn new(n: usize, v4: bool) -> Self {
        let names = if v4 {
            Names::V4(vec![sockaddr_v4(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)); n].into())
        } else {
            Names::V6(
                vec![sockaddr_v6(&SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0)); n].into(),
            )
        };
        let iov = libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        };
        Self {
            hdrs: (0..n).map(|_| zeroed_mmsghdr()).collect(),
            iovs: vec![iov; n].into(),
            names,
            ctrls: vec![Ctrl([0; CTRL_LEN]); n].into(),
            segments: vec![0; n].into(),
            rx_linked: 0,
            rx_dirty: 0,
        }
    }

    fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Writes `dst` as message `i`'s address; false if its family is not the socket's.
    fn set_name(&mut self, i: usize, dst: &SocketAddr) -> bool {
        match (&mut self.names, dst) {
            (Names::V4(names), SocketAddr::V4(a)) => names[i] = sockaddr_v4(a),
            (Names::V6(names), SocketAddr::V6(a)) => names[i] = sockaddr_v6(a),
            _ => return false,
        }
        true
    }

    /// Points message `i` at its name, iovec and control buffer.
    fn link(&mut self, i: usize, ctrl_len: usize) {
        let (name, name_len): (*mut libc::c_void, usize) = match &mut self.names {
            Names::V4(n) => (
                (&mut n[i] as *mut libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>(),
            ),
            Names::V6(n) => (
                (&mut n[i] as *mut libc::sockaddr_in6).cast(),
                size_of::<libc::sockaddr_in6>(),
            ),
        };
        let h = &mut self.hdrs[i].msg_hdr;
        h.msg_name = name;
        h.msg_namelen = name_len as libc::socklen_t;
        h.msg_iov = &mut self.iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = if ctrl_len > 0 {
            self.ctrls[i].0.as_mut_ptr().cast()
        } else {
            ptr::null_mut()
        };
        h.msg_controllen = ctrl_len as _;
        h.msg_flags = 0;
        self.hdrs[i].msg_len = 0;
    }

    /// Prepares transmit message `i` (its name already set): `len` bytes at `data` carrying
    /// `segments` datagrams, with the control messages asked for.
    #[allow(clippy::too_many_arguments)]
    fn set_tx(
        &mut self,
        i: usize,
        data: *const u8,
        len: usize,
        segments: usize,
        tos: Option<u8>,
        hops: Option<u8>,
        segment: Option<u16>,
    ) {
        let v4 = matches!(self.names, Names::V4(_));
        let mut c = CmsgWriter::new(&mut self.ctrls[i].0);
        if let Some(tos) = tos {
            let (level, ty) = if v4 {
                (libc::IPPROTO_IP, libc::IP_TOS)
            } else {
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
            };
            c.push(level, ty, &libc::c_int::from(tos).to_ne_bytes());
        }
        if let Some(hops) = hops {
            let (level, ty) = if v4 {
                (libc::IPPROTO_IP, libc::IP_TTL)
            } else {
                (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT)
            };
            c.push(level, ty, &libc::c_int::from(hops).to_ne_bytes());
        }
        if let Some(size) = segment {
            c.push(libc::SOL_UDP, libc::UDP_SEGMENT, &size.to_ne_bytes());
        }
        let ctrl_len = c.len();
        // sendmsg never writes through iov_base; the type is shared with recvmsg.
        self.iovs[i] = libc::iovec {
            iov_base: data.cast_mut().cast(),
            iov_len: len,
        };
        self.segments[i] = segments;
        self.link(i, ctrl_len);
        self.rx_dirty = self.rx_dirty.max(i + 1);
    }

    /// `sendmmsg` of the first `n` prepared messages; returns how many went out.
    fn sendmmsg(&mut self, fd: RawFd, n: usize) -> io::Result<usize> {
        debug_assert!(n <= self.hdrs.len());
        #[allow(unsafe_code)]
        // SAFETY: `hdrs[..n]` were filled by `set_tx` during this call: each points at a live
        // name, iovec and control buffer of `self`, and its iovec at a payload slice the
        // caller borrows for the duration of `send`. The kernel only writes `msg_len`.
        let r = unsafe { libc::sendmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// `recvmmsg` into `bufs` (non-blocking, retried on `EINTR`); returns how many messages.
    fn recvmmsg(&mut self, fd: RawFd, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let n = bufs.len().min(self.hdrs.len());
        for (i, buf) in bufs.iter_mut().enumerate().take(n) {
            self.iovs[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            if i < self.rx_dirty || i >= self.rx_linked {
                self.link(i, CTRL_LEN);
            }
        }
        // Transmit-prepared messages past `n` stay to relink.
        let stale = if self.rx_dirty > n { self.rx_dirty } else { 0 };
        self.rx_linked = self.rx_linked.max(n);
        loop {
            #[allow(unsafe_code)]
            // SAFETY: `hdrs[..n]` point at live names, control buffers (CTRL_LEN bytes each)
            // and iovecs of `self`; each iovec covers one of the caller's `bufs`, mutably
            // borrowed for this call. The kernel writes at most the given lengths.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    ptr::null_mut(),
                )
            };
            if r >= 0 {
                let r = r as usize;
                self.rx_dirty = r.max(stale);
                return Ok(r);
            }
            // A failed call filled no message (one that filled some returns their count).
            self.rx_dirty = stale;
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// The sender of received message `i`.
    fn rx_name(&self, i: usize) -> Option<SocketAddr> {
        let len = self.hdrs[i].msg_hdr.msg_namelen as usize;
        match &self.names {
            Names::V4(n) if len >= size_of::<libc::sockaddr_in>() => {
                let a = &n[i];
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                    u16::from_be(a.sin_port),
                )))
            }
            Names::V6(n) if len >= size_of::<libc::sockaddr_in6>() => {
                let a = &n[i];
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }

    /// TOS / traffic class, GRO segment size and the kernel's drop count from received
    /// message `i`'s control data.
    fn rx_ctrl(&self, i: usize) -> (u8, Option<usize>, Option<u32>) {
        #[allow(clippy::unnecessary_cast)] // size_t with glibc, socklen_t with musl
        let len = (self.hdrs[i].msg_hdr.msg_controllen as usize).min(CTRL_LEN);
        let mut tos = 0;
        let mut gro = None;
        let mut drops = None;
        for (level, ty, data) in CmsgIter::new(&self.ctrls[i].0[..len]) {
            match (level, ty) {
                (libc::IPPROTO_IP, libc::IP_TOS) | (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    // IP_TOS arrives as one byte, IPV6_TCLASS as an int.
                    if let Some(v) = cmsg_int(data) {
                        tos = v as u8;
                    } else if let Some(&b) = data.first() {
                        tos = b;
                    }
                }
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    gro = cmsg_int(data).and_then(|v| usize::try_from(v).ok());
                }
                (libc::SOL_SOCKET, SO_RXQ_OVFL) => {
                    drops = cmsg_int(data).map(|v| v as u32);
                }
                _ => {}
            }
        }
        (tos, gro, drops)
    }
}

fn zeroed_mmsghdr() -> libc::mmsghdr {
    #[allow(unsafe_code)]
    // SAFETY: mmsghdr is plain C data (pointers, integers); all zeroes is a valid value
    // (null pointers, zero lengths).
    unsafe {
        mem::zeroed()
    }
}

fn sockaddr_v4(a: &SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

fn sockaddr_v6(a: &SocketAddrV6) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: a.port().to_be(),
        sin6_flowinfo: a.flowinfo(),
        sin6_addr: libc::in6_addr {
            s6_addr: a.ip().octets(),
        },
        sin6_scope_id: a.scope_id(),
    }
}

// ------------------------------------------------------------------ control messages --
//
// Written and read as bytes in the kernel's layout (`struct cmsghdr { size_t cmsg_len; int
// cmsg_level; int cmsg_type; }`, data aligned to `size_t`), which keeps this code safe; a test
// checks the sizes against libc's CMSG_LEN/CMSG_SPACE.

const fn cmsg_align(n: usize) -> usize {
    let a = size_of::<usize>();
    (n + a - 1) & !(a - 1)
}

/// Bytes of a control-message header, padded.
const CMSG_HDR: usize = cmsg_align(size_of::<usize>() + 2 * size_of::<libc::c_int>());

/// `CMSG_LEN`: header plus `data` bytes.
const fn cmsg_len(data: usize) -> usize {
    CMSG_HDR + data
}

/// `CMSG_SPACE`: header plus `data` bytes, padded.
const fn cmsg_space(data: usize) -> usize {
    CMSG_HDR + cmsg_align(data)
}

/// Appends control messages to a buffer.
struct CmsgWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> CmsgWriter<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    fn push(&mut self, level: libc::c_int, ty: libc::c_int, data: &[u8]) {
        let space = cmsg_space(data.len());
        // INVARIANT: CTRL_LEN holds the three 4-byte messages set_tx can write.
        let out = &mut self.buf[self.len..self.len + space];
        let word = size_of::<usize>();
        let int = size_of::<libc::c_int>();
        out.fill(0);
        out[..word].copy_from_slice(&cmsg_len(data.len()).to_ne_bytes());
        out[word..word + int].copy_from_slice(&level.to_ne_bytes());
        out[word + int..word + 2 * int].copy_from_slice(&ty.to_ne_bytes());
        out[CMSG_HDR..CMSG_HDR + data.len()].copy_from_slice(data);
        self.len += space;
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Iterates over `(level, type, data)` of the control messages in a buffer.
struct CmsgIter<'a> {
    buf: &'a [u8],
}

impl<'a> CmsgIter<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
}

impl<'a> Iterator for CmsgIter<'a> {
    type Item = (libc::c_int, libc::c_int, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let word = size_of::<usize>();
        let int = size_of::<libc::c_int>();
        if self.buf.len() < CMSG_HDR {
            return None;
        }
        let len = usize::from_ne_bytes(self.buf[..word].try_into().ok()?);
        if len < CMSG_HDR || len > self.buf.len() {
            self.buf = &[];
            return None;
        }
        let level = libc::c_int::from_ne_bytes(self.buf[word..word + int].try_into().ok()?);
        let ty = libc::c_int::from_ne_bytes(self.buf[word + int..word + 2 * int].try_into().ok()?);
        let data = &self.buf[CMSG_HDR..len];
        self.buf = &self.buf[cmsg_align(len).min(self.buf.len())..];
        Some((level, ty, data))
    }
}

/// An `int` control-message payload.
fn cmsg_int(data: &[u8]) -> Option<libc::c_int> {
    Some(libc::c_int::from_ne_bytes(
        data.get(..size_of::<libc::c_int>())?.try_into().ok()?,
    ))
}

// ------------------------------------------------------------------ socket helpers --

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: passes a pointer to a live local c_int and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drivers of interfaces that hand a UDP GSO message on whole and leave its segmentation to
/// the kernel's software GSO (on the way out of a device without USO, or in the receiving
/// stack): `inet_gso_segment` then numbers the segments' Identification from the message's.
const SOFTWARE_SEGMENTING_DRIVERS: [&str; 4] = ["veth", "tun", "bridge", "dummy"];

/// What identifies a planned batch: its first payload's address and its length.
fn plan_key(batch: &[TxDatagram<'_>]) -> (usize, usize) {
    (
        batch.first().map_or(0, |d| d.payload.as_ptr() as usize),
        batch.len(),
    )
}

/// The driver name of interface `name` (`ETHTOOL_GDRVINFO`, asked through `fd` so that it is
/// answered in the socket's network namespace).
fn interface_driver(fd: RawFd, name: &str) -> Option<String> {
    const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
    /// `struct ethtool_drvinfo` (linux/ethtool.h).
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        n_priv_flags: u32,
        n_stats: u32,
        testinfo_len: u32,
        eedump_len: u32,
        regdump_len: u32,
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: ifreq is plain C data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    #[allow(unsafe_code)]
    // SAFETY: SIOCETHTOOL reads the NUL-terminated name and, for ETHTOOL_GDRVINFO, writes at
    // most one `struct ethtool_drvinfo` through `ifru_data`, which points at the live,
    // exclusively borrowed `info` of exactly that layout.
    let r = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut req as *mut libc::ifreq) };
    if r < 0 {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    std::str::from_utf8(&info.driver[..end])
        .ok()
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
}

/// The BTH DestQP bytes of a UDP payload (`None` if too short to hold them).
fn dest_qpn(payload: &[u8]) -> Option<&[u8]> {
    payload.get(5..8)
}

/// Why a demux bind found the address in use: the group belongs to another user, or a socket
/// that does not share (no `SO_REUSEPORT`) holds it.
fn demux_in_use(addr: SocketAddr) -> UdpError {
    #[allow(unsafe_code)]
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    match crate::portowner::udp_socket_uids(addr)
        .into_iter()
        .find(|&u| u != uid)
    {
        Some(owner) => UdpError::DemuxOtherUser { addr, owner, uid },
        None => UdpError::AddrInUse { addr },
    }
}

/// Opens the raw receive socket for `local` (IPv4, not loopback): a raw IPv4 socket for UDP,
/// bound to the address, with a filter that keeps datagrams to `local`'s port (first
/// fragments only; the kernel has reassembled before raw delivery), non-blocking, with the
/// receive buffer asked for and `SO_RXQ_OVFL`. Then gives the UDP socket a drop-all filter:
/// it stays bound (it sends, and holds the port, so no ICMP port-unreachable goes out) but
/// queues nothing. `None` when any step fails (no `CAP_NET_RAW`): the UDP socket is left as
/// it was.
fn open_raw_receive(udp: &Socket, local: SocketAddr, buffer: usize) -> Option<Socket> {
    let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).ok()?;
    raw.attach_filter(&raw_receive_filter(local.port())).ok()?;
    raw.bind(&SockAddr::from(SocketAddr::new(local.ip(), 0)))
        .ok()?;
    raw.set_nonblocking(true).ok()?;
    let _ = raw.set_recv_buffer_size(buffer);
    setsockopt_int(raw.as_raw_fd(), libc::SOL_SOCKET, SO_RXQ_OVFL, 1).ok()?;
    let drop_all = [SockFilter::new(
        (libc::BPF_RET | libc::BPF_K) as u16,
        0,
        0,
        0,
    )];
    udp.attach_filter(&drop_all).ok()?;
    Some(raw)
}

/// Classic BPF over an IPv4 packet (a raw socket's data starts at the IP header): keep it if
/// it is not a non-first fragment and its UDP destination port is `port`.
fn raw_receive_filter(port: u16) -> [SockFilter; 7] {
    let op = |code: u32| code as u16;
    // Jump offsets count from the next instruction.
    [
        /* 0 */ SockFilter::new(op(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS), 0, 0, 6),
        /* 1: non-first fragment -> 6 */
        SockFilter::new(
            op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K),
            4,
            0,
            0x1FFF,
        ),
        /* 2: X = IP header length */
        SockFilter::new(op(libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH), 0, 0, 0),
        /* 3: UDP destination port */
        SockFilter::new(op(libc::BPF_LD | libc::BPF_H | libc::BPF_IND), 0, 0, 2),
        /* 4: ours -> 5, else 6 */
        SockFilter::new(
            op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
            0,
            1,
            port.into(),
        ),
        /* 5: keep (up to 256 KiB) */
        SockFilter::new(op(libc::BPF_RET | libc::BPF_K), 0, 0, 0x0004_0000),
        /* 6: drop */
        SockFilter::new(op(libc::BPF_RET | libc::BPF_K), 0, 0, 0),
    ]
}

/// Turns a received IPv4 packet (IP header .. end) into its UDP payload in place, and says
/// what the headers held; `None` if they are inconsistent (not IPv4/UDP, lengths that do not
/// add up, another destination port).
fn strip_ipv4_udp(buf: &mut [u8], port: u16) -> Option<RxMeta> {
    let ihl = usize::from(*buf.first()? & 0x0F) * 4;
    if buf[0] >> 4 != 4 || ihl < IPV4_HEADER || buf.len() < ihl + UDP_HEADER || buf[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
    let udp_len = usize::from(u16::from_be_bytes([buf[ihl + 4], buf[ihl + 5]]));
    if total != buf.len() || udp_len != total - ihl || udp_len < UDP_HEADER {
        return None;
    }
    let sport = u16::from_be_bytes([buf[ihl], buf[ihl + 1]]);
    let dport = u16::from_be_bytes([buf[ihl + 2], buf[ihl + 3]]);
    if dport != port {
        return None;
    }
    let ip = |at: usize| Ipv4Addr::new(buf[at], buf[at + 1], buf[at + 2], buf[at + 3]);
    let (src, dst) = (ip(12), ip(16));
    let flags = u16::from_be_bytes([buf[6], buf[7]]);
    // IP options (IHL > 5) are covered by the ICRC; the engine rebuilds a 20-byte header, so
    // such a packet fails the check (rxe assumes no options either).
    let info = super::Ipv4Info {
        ident: u16::from_be_bytes([buf[4], buf[5]]),
        dont_fragment: flags & 0x4000 != 0,
    };
    let tos = buf[1];
    let payload = udp_len - UDP_HEADER;
    let stride = if ihl == IPV4_HEADER {
        split_gso_message(&buf[..total]).unwrap_or(payload)
    } else {
        payload
    };
    // Several datagrams: the engine numbers them on from the header's Identification, as
    // the kernel numbers a GSO message's segments. NAPI GRO also merges datagrams that all
    // carry one Identification (with DF: what rocectl sends off loopback without GSO); then
    // the second does not check with `ident + 1`, and the buffer goes without its header
    // fields, so that the engine recovers each datagram's Identification from its ICRC and
    // holds the peer to the ones it sends (`roce_wire::icrc::Ipv4IdentChecker`).
    let counting =
        stride >= payload || segment_icrc_ok(&buf[..total], stride, 1, info.ident.wrapping_add(1));
    buf.copy_within(ihl + UDP_HEADER..total, 0);
    Some(RxMeta {
        len: payload,
        stride,
        src: SocketAddr::V4(SocketAddrV4::new(src, sport)),
        dst: SocketAddr::V4(SocketAddrV4::new(dst, dport)),
        tos,
        ipv4: counting.then_some(info),
    })
}

/// Largest UDP payload of one RoCEv2 packet: BTH, RETH + ImmDt, the largest path MTU, ICRC.
const MAX_ROCE_PAYLOAD: usize = 12 + 20 + 4_096 + 4;
/// Path MTUs a FIRST or MIDDLE packet's payload is exactly one of.
const PMTUS: [usize; 5] = [256, 512, 1_024, 2_048, 4_096];
/// Most candidate segment sizes whose ICRC `split_gso_message` computes for one packet
/// (bounds the work a hostile packet can cause).
const MAX_SPLIT_TRIES: usize = 8;

/// Raw receive: whether an IPv4 packet (`ip`: a 20-byte header .. end) is a whole UDP GSO
/// message rather than one datagram, and if so the UDP payload size of its segments.
///
/// A GSO message from a sender on this host can cross a veth or bridge whole; the receiving
/// kernel cuts it only for the UDP socket, so the raw socket sees it as one large packet
/// whose segments' Identifications are the header's + 0, 1, 2, ... (`inet_gso_segment`).
/// Where the first packet's headers give its length (`length_from_headers`: WRITE ONLY's
/// RETH, the fixed-size ACKs, READ requests and atomics) that length is the only candidate:
/// a packet of exactly that length is one datagram (no ICRC computed here: the engine checks
/// it), and a longer one is cut there if its first segment's ICRC is valid at that length
/// and the whole packet's is not (a single packet with a wrong length stays one, for the
/// engine to count once). Otherwise the message is told apart
/// by what no single RoCEv2 packet can be: longer than [`MAX_ROCE_PAYLOAD`], a FIRST/MIDDLE
/// packet whose payload is not a path MTU, or, for other opcodes, an ICRC that is wrong for
/// the whole packet. The segment size is then the first candidate whose first segment
/// carries a valid ICRC (for FIRST/MIDDLE the five path MTUs; otherwise sizes at which a BTH
/// with the same P_Key and transport version starts, at most [`MAX_SPLIT_TRIES`] of them).
/// `None`: one datagram (or nothing that splits; the engine's ICRC check then drops it).
///
/// The header rule matters for cost: a sender's GSO run may end in a shorter datagram of
/// another kind (an RC WRITE ONLY of 4 KiB and the ACK the same pass built), and finding its
/// size by the BTH search walked the whole first packet as well (measured: 6.5% of a
/// busy-polling 4 KiB allreduce over a veth); a single WRITE ONLY or ACK no longer has its
/// ICRC computed here before the engine does.
fn split_gso_message(ip: &[u8]) -> Option<usize> {
    let payload = ip.get(IPV4_HEADER + UDP_HEADER..)?;
    if payload.len() < 12 + 4 {
        return None;
    }
    let opcode = payload[0];
    // Opcodes whose headers give the packet's length: a datagram of exactly that length is
    // one packet (its ICRC is the engine's check); otherwise that length is the only
    // candidate below (a single packet whose headers disagree with its length, e.g. a READ
    // request with a payload, still carries a valid ICRC as a whole and stays one packet,
    // the responder's to refuse).
    let header_len = length_from_headers(payload);
    if header_len == Some(payload.len()) {
        return None;
    }
    // FIRST and MIDDLE packets of RC and UC: the header length, their payload a path MTU.
    let first_middle = match opcode & 0x1F {
        0x00 | 0x01 | 0x07 => Some(12),
        0x06 => Some(12 + 16),
        0x0D if opcode & 0xE0 == 0 => Some(12 + 4),
        0x0E if opcode & 0xE0 == 0 => Some(12),
        _ => None,
    }
    .filter(|_| opcode & 0xE0 <= 0x20);
    let single = payload.len() <= MAX_ROCE_PAYLOAD
        && match first_middle {
            Some(h) => payload
                .len()
                .checked_sub(h + 4)
                .is_some_and(|p| PMTUS.contains(&p)),
            None => icrc::verify(ip),
        };
    if single {
        return None;
    }
    let fits =
        |s: usize| s >= 16 && s < payload.len() && s % 4 == 0 && first_segment_icrc_ok(ip, s);
    if let Some(len) = header_len {
        return Some(len).filter(|&s| fits(s));
    }
    if let Some(h) = first_middle {
        return PMTUS.iter().map(|p| h + p + 4).find(|&s| fits(s));
    }
    let (pkey, tver) = ([payload[2], payload[3]], payload[1] & 0x0F);
    (16..payload.len().min(MAX_ROCE_PAYLOAD + 1))
        .step_by(4)
        .filter(|&s| {
            payload.get(s + 1).is_some_and(|b| b & 0x0F == tver)
                && payload.get(s + 2..s + 4) == Some(&pkey[..])
        })
        .take(MAX_SPLIT_TRIES)
        .find(|&s| fits(s))
}

/// The length of the RoCEv2 packet at the start of `payload` (a UDP payload) where its
/// headers say it: RC/UC RDMA WRITE ONLY (with immediate), whose RETH DMA length is its
/// payload, and the RC packets of fixed size (ACK, atomic ACK, READ request, atomics).
/// `None` for every other opcode (SEND, LAST, READ responses, UD: no length in the headers)
/// and for a WRITE whose length does not fit one packet.
fn length_from_headers(payload: &[u8]) -> Option<usize> {
    const BTH: usize = 12;
    const ICRC: usize = 4;
    let opcode = *payload.first()?;
    let (class, op) = (opcode >> 5, opcode & 0x1F);
    let pad = usize::from(payload.get(1)? >> 4 & 0x3);
    let write = |imm: usize| {
        let b = payload.get(BTH + 12..BTH + 16)?;
        let dma = usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok()?;
        (dma <= 4_096).then_some(BTH + 16 + imm + dma + pad + ICRC)
    };
    match (class, op) {
        (0 | 1, 0x0A) => write(0),
        (0 | 1, 0x0B) => write(4),
        (0, 0x0C) => Some(BTH + 16 + ICRC),
        (0, 0x11) => Some(BTH + 4 + ICRC),
        (0, 0x12) => Some(BTH + 4 + 8 + ICRC),
        (0, 0x13 | 0x14) => Some(BTH + 28 + ICRC),
        _ => None,
    }
}

/// Whether the first `s` bytes of the UDP payload of `ip` (a whole GSO message) carry a valid
/// ICRC as a datagram of their own, with the message's IP header (lengths adjusted).
fn first_segment_icrc_ok(ip: &[u8], s: usize) -> bool {
    let ident = ip.get(4..6).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
    segment_icrc_ok(ip, s, 0, ident)
}

/// Whether datagram `k` of `ip` (an IPv4 packet with a 20-byte header whose UDP payload is
/// datagrams of `s` bytes, the last one maybe shorter) carries a valid ICRC as a datagram of
/// its own, with the packet's IP header, its lengths adjusted and Identification `ident`.
/// `false` when there is no such datagram or it is too short to hold a BTH and an ICRC.
fn segment_icrc_ok(ip: &[u8], s: usize, k: usize, ident: u16) -> bool {
    let Some(payload) = ip.get(IPV4_HEADER + UDP_HEADER..) else {
        return false;
    };
    let Some(seg) = k
        .checked_mul(s)
        .and_then(|at| payload.get(at..))
        .map(|rest| &rest[..rest.len().min(s)])
        .filter(|seg| seg.len() >= 12 + 4)
    else {
        return false;
    };
    let mut hdr = [0u8; IPV4_HEADER + UDP_HEADER];
    hdr.copy_from_slice(&ip[..IPV4_HEADER + UDP_HEADER]);
    let Ok(total) = u16::try_from(IPV4_HEADER + UDP_HEADER + seg.len()) else {
        return false;
    };
    hdr[2..4].copy_from_slice(&total.to_be_bytes());
    hdr[4..6].copy_from_slice(&ident.to_be_bytes());
    hdr[IPV4_HEADER + 4..IPV4_HEADER + 6].copy_from_slice(&(total - 20).to_be_bytes());
    let Some(mut c) = icrc::Icrc::start(&hdr[..IPV4_HEADER], &hdr[IPV4_HEADER..], &seg[..12])
    else {
        return false;
    };
    let end = seg.len() - 4;
    c.update(&seg[12..end]);
    c.finish()[..] == seg[end..]
}

/// The socket's drop count (`sk_drops`, from `SO_MEMINFO`), if the kernel reports it.
fn sk_drops(fd: RawFd) -> Option<u32> {
    let mut info = [0u32; libc::SK_MEMINFO_DROPS as usize + 1];
    let mut len = size_of_val(&info) as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: passes a live, exclusively borrowed u32 array and its exact size; the kernel
    // writes at most `len` bytes and stores the length it wrote.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let need = (libc::SK_MEMINFO_DROPS as usize + 1) * size_of::<u32>();
    (r == 0 && len as usize >= need).then_some(info[libc::SK_MEMINFO_DROPS as usize])
}

/// Whether the kernel takes `UDP_SEGMENT` (Linux 4.18+). Probes with the socket option and
/// clears it again, so that only messages with a segment-size control message use GSO.
fn gso_supported(fd: RawFd) -> bool {
    if setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 1_500).is_err() {
        return false;
    }
    setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok()
}

/// The interface that owns `ip`: the one with that exact address, else for a loopback
/// address the loopback interface, else the first whose subnet contains it.
fn interface_of(ip: IpAddr) -> Option<String> {
    let ifaces = pnet_datalink::interfaces();
    if let Some(i) = ifaces.iter().find(|i| i.ips.iter().any(|n| n.ip() == ip)) {
        return Some(i.name.clone());
    }
    if ip.is_loopback() {
        if let Some(i) = ifaces.iter().find(|i| i.is_loopback()) {
            return Some(i.name.clone());
        }
    }
    ifaces
        .iter()
        .find(|i| i.ips.iter().any(|n| n.contains(ip)))
        .map(|i| i.name.clone())
}

/// The MTU of interface `name` (`SIOCGIFMTU`, asked through `fd` so that it is answered in the
/// socket's network namespace).
fn interface_mtu(fd: RawFd, name: &str) -> Option<usize> {
    #[allow(unsafe_code)]
    // SAFETY: ifreq is plain C data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, &s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    #[allow(unsafe_code)]
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name and writes the int `ifru_mtu` of the
    // live, exclusively borrowed `req`.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req as *mut libc::ifreq) };
    if r < 0 {
        return None;
    }
    #[allow(unsafe_code)]
    // SAFETY: after a successful SIOCGIFMTU the union holds `ifru_mtu`.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).ok().filter(|&m| m > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmsg_sizes_match_libc() {
        for data in [1usize, 2, 4, 8, 12] {
            #[allow(unsafe_code)]
            // SAFETY: CMSG_LEN/CMSG_SPACE are pure arithmetic.
            let (len, space) = unsafe {
                (
                    libc::CMSG_LEN(data as libc::c_uint) as usize,
                    libc::CMSG_SPACE(data as libc::c_uint) as usize,
                )
            };
            assert_eq!(cmsg_len(data), len, "CMSG_LEN({data})");
            assert_eq!(cmsg_space(data), space, "CMSG_SPACE({data})");
        }
    }

    #[test]
    fn cmsg_roundtrip_and_libc_view() {
        let mut ctrl = Ctrl([0xa5; CTRL_LEN]);
        let mut w = CmsgWriter::new(&mut ctrl.0);
        w.push(libc::IPPROTO_IP, libc::IP_TOS, &3i32.to_ne_bytes());
        w.push(libc::SOL_UDP, libc::UDP_SEGMENT, &1084u16.to_ne_bytes());
        let len = w.len();
        assert_eq!(len, cmsg_space(4) + cmsg_space(2));
        let got: Vec<_> = CmsgIter::new(&ctrl.0[..len])
            .map(|(l, t, d)| (l, t, d.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (libc::IPPROTO_IP, libc::IP_TOS, 3i32.to_ne_bytes().to_vec()),
                (
                    libc::SOL_UDP,
                    libc::UDP_SEGMENT,
                    1084u16.to_ne_bytes().to_vec()
                ),
            ]
        );
        // The same bytes through libc's own macros.
        let mut hdr = zeroed_mmsghdr().msg_hdr;
        hdr.msg_control = ctrl.0.as_mut_ptr().cast();
        hdr.msg_controllen = len as _;
        #[allow(unsafe_code)]
        // SAFETY: `hdr` describes `ctrl`, which lives through this block and holds two
        // well-formed control messages.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            assert!(!c.is_null());
            assert_eq!((*c).cmsg_level, libc::IPPROTO_IP);
            assert_eq!((*c).cmsg_type, libc::IP_TOS);
            assert_eq!(libc::CMSG_DATA(c).cast::<i32>().read_unaligned(), 3);
            let c = libc::CMSG_NXTHDR(&hdr, c);
            assert!(!c.is_null());
            assert_eq!((*c).cmsg_type, libc::UDP_SEGMENT);
            assert_eq!(libc::CMSG_DATA(c).cast::<u16>().read_unaligned(), 1084);
            assert!(libc::CMSG_NXTHDR(&hdr, c).is_null());
        }
    }

    #[test]
    fn cmsg_iter_stops_on_garbage() {
        let mut buf = [0u8; 64];
        buf[..8].copy_from_slice(&1000usize.to_ne_bytes());
        assert_eq!(CmsgIter::new(&buf).count(), 0);
        buf[..8].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(CmsgIter::new(&buf).count(), 0);
        assert_eq!(CmsgIter::new(&buf[..5]).count(), 0);
    }

    /// Reads our raw address back through socket2's decoder.
    fn decode_with_socket2<T: Copy>(raw: &T) -> Option<SocketAddr> {
        let mut storage = socket2::SockAddrStorage::zeroed();
        #[allow(unsafe_code)]
        // SAFETY: `T` is `sockaddr_in` or `sockaddr_in6`; the storage then holds a complete
        // address of that family, whose exact length is passed on.
        let addr = unsafe {
            *storage.view_as::<T>() = *raw;
            SockAddr::new(storage, size_of::<T>() as libc::socklen_t)
        };
        addr.as_socket()
    }

    #[test]
    fn sockaddrs_agree_with_socket2() {
        for text in ["127.0.0.2:4791", "10.1.2.3:1"] {
            let v4: SocketAddr = text.parse().unwrap();
            let SocketAddr::V4(a) = v4 else {
                unreachable!()
            };
            assert_eq!(decode_with_socket2(&sockaddr_v4(&a)), Some(v4));
            let mut msgs = Msgs::new(1, true);
            assert!(msgs.set_name(0, &v4));
            msgs.hdrs[0].msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as _;
            assert_eq!(msgs.rx_name(0), Some(v4));
            assert!(!msgs.set_name(0, &"[::1]:4791".parse().unwrap()));
        }
        for text in ["[fd00::2]:4791", "[fe80::1%3]:4792"] {
            let v6: SocketAddr = text.parse().unwrap();
            let SocketAddr::V6(a) = v6 else {
                unreachable!()
            };
            assert_eq!(decode_with_socket2(&sockaddr_v6(&a)), Some(v6));
            let mut msgs = Msgs::new(1, false);
            assert!(msgs.set_name(0, &v6));
            msgs.hdrs[0].msg_hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as _;
            assert_eq!(msgs.rx_name(0), Some(v6));
            assert!(!msgs.set_name(0, &"127.0.0.1:4791".parse().unwrap()));
        }
    }

    /// A GSO message never carries two destination QPNs (a receiver in kernel demux mode on
    /// the same host steers it by its first datagram), demux or not.
    #[test]
    fn gso_runs_are_cut_at_every_destination_qpn_change() {
        let mut dp = UdpDatapath::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default())
            .expect("a socket on loopback");
        assert!(dp.gso_segments > 1, "UDP_SEGMENT (Linux 4.18+) on loopback");
        let qpns = [1u8, 1, 1, 2, 2, 1, 3, 3, 3, 3];
        let mut arena = Vec::new();
        for &q in &qpns {
            let mut d = [0u8; 32];
            d[7] = q;
            arena.extend_from_slice(&d);
        }
        let dst: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let batch: Vec<TxDatagram<'_>> = arena
            .chunks(32)
            .map(|payload| TxDatagram {
                dst,
                payload,
                ..TxDatagram::EMPTY
            })
            .collect();
        let m = dp.prepare_tx(&batch);
        assert_eq!(
            (m, &dp.msgs.segments[..m]),
            (10, &[1; 10][..]),
            "IPv4, not planned"
        );
        dp.planned = true;
        let m = dp.prepare_tx(&batch);
        assert_eq!(&dp.msgs.segments[..m], &[3, 2, 1, 4], "exclusive");
        dp.demux_slot = Some(1);
        let m = dp.prepare_tx(&batch);
        assert_eq!(&dp.msgs.segments[..m], &[3, 2, 1, 4], "demux");
    }

    /// An IPv4 RoCEv2 datagram with `payload` after a BTH of `opcode`, Identification `id`,
    /// its ICRC computed.
    fn roce_v4(opcode: u8, id: u16, payload: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + 12 + payload.len() + 4;
        let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8];
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&[0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let udp = total - 20;
        p.extend_from_slice(&[0x12, 0xB7, 0x12, 0xB7, (udp >> 8) as u8, udp as u8, 0, 0]);
        p.extend_from_slice(&[opcode, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0, 0, 0, 7]);
        p.extend_from_slice(payload);
        p.extend_from_slice(&[0; 4]);
        let icrc = icrc::compute(&p).unwrap();
        let end = p.len() - 4;
        p[end..].copy_from_slice(&icrc);
        p
    }

    /// What a raw socket sees of a whole GSO message: the first segment's header with the
    /// total lengths, then every segment's UDP payload.
    fn whole_message(segments: &[Vec<u8>]) -> Vec<u8> {
        let mut m = segments[0][..28].to_vec();
        for s in segments {
            m.extend_from_slice(&s[28..]);
        }
        let total = m.len() as u16;
        m[2..4].copy_from_slice(&total.to_be_bytes());
        m[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        m
    }

    #[test]
    fn whole_gso_messages_are_cut_at_their_segment_size() {
        // RC WRITE MIDDLE x 3 at path MTU 1024, Identifications 0, 1, 2.
        let segs: Vec<Vec<u8>> = (0..3u16)
            .map(|k| roce_v4(0x07, k, &[k as u8; 1_024]))
            .collect();
        assert_eq!(split_gso_message(&segs[0]), None, "one datagram");
        assert_eq!(
            split_gso_message(&whole_message(&segs)),
            Some(12 + 1_024 + 4)
        );
        // SEND ONLY x 5 of 60 bytes and a shorter last one: found by the BTH search.
        let mut only: Vec<Vec<u8>> = (0..5u16).map(|k| roce_v4(0x04, k, &[0x5A; 60])).collect();
        only.push(roce_v4(0x04, 5, &[1; 8]));
        assert_eq!(split_gso_message(&only[0]), None);
        assert_eq!(split_gso_message(&whole_message(&only)), Some(12 + 60 + 4));
        // WRITE ONLY with immediate (4 KiB) and the ACK the same pass built: the RETH's
        // length gives the first segment's size; the packet alone is one datagram.
        let mut write = vec![0u8; 16 + 4 + 4_096];
        write[12..16].copy_from_slice(&4_096u32.to_be_bytes());
        let pair = vec![roce_v4(0x0B, 0, &write), roce_v4(0x11, 1, &[0x1F, 0, 0, 3])];
        assert_eq!(split_gso_message(&pair[0]), None);
        assert_eq!(
            split_gso_message(&whole_message(&pair)),
            Some(12 + 16 + 4 + 4_096 + 4)
        );
        // Two ACKs; an ACK alone.
        let acks: Vec<Vec<u8>> = (0..2u16)
            .map(|k| roce_v4(0x11, k, &[0x1F, 0, 0, k as u8]))
            .collect();
        assert_eq!(split_gso_message(&acks[0]), None);
        assert_eq!(split_gso_message(&whole_message(&acks)), Some(20));
        // A READ request with a payload (valid ICRC): one packet, for the responder to NAK.
        let read = roce_v4(0x0C, 0, &[0u8; 16 + 64]);
        assert_eq!(split_gso_message(&read), None);
        // An ACK with bytes after its AETH: one packet too.
        assert_eq!(split_gso_message(&roce_v4(0x11, 0, &[0x1F; 24])), None);
        // A WRITE ONLY whose RETH claims more than the message holds: not cut.
        let mut liar = vec![0u8; 16 + 100];
        liar[12..16].copy_from_slice(&4_096u32.to_be_bytes());
        let lie = vec![roce_v4(0x0A, 0, &liar), roce_v4(0x11, 1, &[0x1F, 0, 0, 3])];
        assert_eq!(split_gso_message(&whole_message(&lie)), None);
        // A corrupted single packet is no GSO message (the engine's check drops it).
        let mut bad = roce_v4(0x04, 0, &[0xFF; 200]);
        bad[100] ^= 1;
        assert_eq!(split_gso_message(&bad), None);
        // Garbage never panics.
        for len in 0..80 {
            let _ = split_gso_message(&vec![0x45; len]);
        }
    }

    #[test]
    fn errors_name_the_address() {
        let addr: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let msg = UdpError::AddrInUse { addr }.to_string();
        assert!(
            msg.starts_with("another RoCE stack or rocectl instance already uses 127.0.0.1:4791"),
            "{msg}"
        );
        let msg = UdpError::AddrNotAvailable { addr }.to_string();
        assert!(
            msg.starts_with("127.0.0.1 is not an address of this host"),
            "{msg}"
        );
        let io: io::Error = UdpError::AddrInUse { addr }.into();
        assert_eq!(io.kind(), io::ErrorKind::AddrInUse);
        assert!(io.to_string().contains("127.0.0.1:4791"));
        match OpenError::from(UdpError::AddrNotAvailable { addr }) {
            OpenError::AddrNotAvailable { addr: a } => assert_eq!(a, addr),
            other => panic!("{other:?}"),
        }
    }
}
