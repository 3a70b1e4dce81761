//! The `raw` backend: whole Ethernet frames through an `AF_PACKET` socket, with our own IPv4 /
//! IPv6 and UDP headers and our own neighbour resolution. Needs `CAP_NET_RAW`.
//!
//! # Why not a UDP socket
//!
//! The backend writes the IP header itself, so it honours every field the engine chose (each
//! QP's UDP source port, TOS/ECN, TTL, flow label, IPv4 Identification 0 + DF, which the ICRC
//! covers), and reads the IP header of every received packet, so the engine checks all 32
//! bits of the ICRC ([`DatapathCaps::sees_ip_header`]).
//!
//! # How it sits next to the kernel
//!
//! The local IP address stays configured on the interface, so the kernel keeps answering ARP
//! and neighbour solicitations for it. Two consequences are handled here:
//!
//! - The kernel also receives every RoCE packet. With no socket on UDP 4791 it would answer
//!   each with an ICMP port unreachable, so the backend holds a UDP socket bound to
//!   `local_ip:4791` for its lifetime, with a filter that discards everything at once (nothing
//!   to drain). It also makes a second stack on the same address (another `raw` or `udp`
//!   device, rdma_rxe) fail to open with a clear "address in use".
//! - Peers must still be *resolved*: the backend sends ARP requests (IPv4) and neighbour
//!   solicitations (IPv6) itself and learns from the replies it sees, starting from static
//!   entries ([`RawOptions::static_neighbours`]) and the kernel's IPv4 neighbour table at open.
//!   Datagrams to an unresolved peer wait in a small queue, requests are retried a bounded
//!   number of times, and then the queue is dropped and counted ([`RawStats::tx_unresolved`]),
//!   the failure kept in [`RawDatapath::last_error`], and sends to that address fail with
//!   `HostUnreachable` for a while. Peers must be on the link: there is no routing (a static
//!   neighbour with the gateway's MAC sends through a router).
//!
//! # The socket
//!
//! One `AF_PACKET`/`SOCK_RAW` socket opened with libc rather than through pnet's channel,
//! because we need its descriptor (for [`Datapath::readiness_fd`]), batching (`recvmmsg` /
//! `sendmmsg`), a socket filter, `PACKET_IGNORE_OUTGOING` and `PACKET_VNET_HDR`; pnet is used
//! to list interfaces. Details, and why a UDP GSO frame from a local sender is split here, are
//! in the `sock` submodule's docs.
//!
//! # Namespaces
//!
//! Everything about the interface (its index, MAC, addresses, MTU, the kernel's neighbour
//! table) is read in the network namespace of the thread that calls [`RawDatapath::open`],
//! and the sockets stay in it: open the backend on a thread inside the other namespace (the
//! tests use `roce_testkit::netns::Netns::enter_scoped`) to use an interface of that
//! namespace.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use super::{Datapath, DatapathCaps, Ipv4Info, RxMeta, TxDatagram};
use crate::error::OpenError;

mod codec;
mod neigh;
mod sock;

use codec::{DropReason, Local, Rx, Vnet, ARP_FRAME_LEN, MAX_HEADERS, NS_FRAME_LEN, VNET_LEN};
use neigh::{Lookup, Pending, Poll};
use sock::{PacketSocket, RxInfo, RX_SLOTS, SLOT_LEN, TX_BATCH};

/// The RoCEv2 UDP port.
const ROCEV2_PORT: u16 = roce_wire::frame::ROCEV2_PORT;
/// IPv4 header + UDP header.
const IPV4_UDP_OVERHEAD: usize = 20 + 8;
/// IPv6 header + UDP header.
const IPV6_UDP_OVERHEAD: usize = 40 + 8;

/// Settings of a [`RawDatapath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawOptions {
    /// Peers whose MAC address is fixed: never resolved, never expire. Also the way to reach
    /// a peer behind a router (give the router's MAC).
    pub static_neighbours: Vec<(IpAddr, [u8; 6])>,
    /// Start from the kernel's IPv4 neighbour table (`/proc/net/arp`) at open.
    pub kernel_neighbours: bool,
    /// UDP port to receive on and to guard (4791).
    pub port: u16,
    /// ARP requests / neighbour solicitations sent for one address before giving up.
    pub resolve_attempts: u32,
    /// Time between them.
    pub resolve_interval: Duration,
    /// How long a failed address fails sends at once, before it is tried again.
    pub unreachable_hold: Duration,
    /// How long a learned MAC address is used before it is re-confirmed (in the background;
    /// sending goes on meanwhile).
    pub neighbour_ttl: Duration,
    /// Datagrams held per address while it is being resolved (older ones are dropped first).
    pub pending_per_neighbour: usize,
    /// Kernel receive buffer of the packet socket, bytes.
    pub recv_buffer: usize,
    /// Kernel send buffer of the packet socket, bytes.
    pub send_buffer: usize,
}

impl Default for RawOptions {
    fn default() -> Self {
        Self {
            static_neighbours: Vec::new(),
            kernel_neighbours: true,
            port: ROCEV2_PORT,
            resolve_attempts: 4,
            resolve_interval: Duration::from_millis(250),
            unreachable_hold: Duration::from_secs(1),
            neighbour_ttl: Duration::from_secs(60),
            pending_per_neighbour: 64,
            recv_buffer: 8 << 20,
            send_buffer: 4 << 20,
        }
    }
}

/// Why the raw backend could not open, or could not reach a peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RawError {
    /// No interface of that name (in this network namespace).
    #[error("no network interface named {name:?} (interfaces: {available})")]
    NoSuchInterface {
        /// The name asked for.
        name: String,
        /// The interfaces that exist, comma-separated.
        available: String,
    },
    /// The interface has no Ethernet MAC address (loopback, tun, a point-to-point link).
    #[error("interface {ifname} has no Ethernet MAC address; the raw backend needs Ethernet")]
    NotEthernet {
        /// The interface.
        ifname: String,
    },
    /// Opening an `AF_PACKET` socket was refused.
    #[error("raw backend needs CAP_NET_RAW (run as root or setcap cap_net_raw+ep)")]
    NoPermission,
    /// The local IP address is not configured on the interface.
    #[error("{ip} is not an address of {ifname} (its addresses: {addresses})")]
    AddressNotOnInterface {
        /// The address asked for.
        ip: IpAddr,
        /// The interface.
        ifname: String,
        /// Its addresses, comma-separated.
        addresses: String,
    },
    /// Another program already uses the address and port (another RoCE stack or rocectl).
    #[error("{addr} is already in use (another RoCE stack or rocectl instance?)")]
    AddrInUse {
        /// The address and port.
        addr: SocketAddr,
    },
    /// Neighbour resolution of a peer failed: no ARP reply / neighbour advertisement.
    #[error("{0} is unreachable: no answer to ARP / neighbour solicitation (is it on this link?)")]
    Unreachable(IpAddr),
    /// Another system error while setting up.
    #[error("raw backend: {context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl RawError {
    /// Maps an error of creating or configuring the packet socket: `EPERM`/`EACCES` become
    /// [`RawError::NoPermission`], anything else [`RawError::Io`] with `context`.
    pub fn from_socket_error(context: &'static str, e: io::Error) -> Self {
        // EPERM and EACCES both map to PermissionDenied.
        if e.kind() == io::ErrorKind::PermissionDenied {
            return Self::NoPermission;
        }
        Self::Io { context, source: e }
    }

    /// The `io::ErrorKind` this error is reported as at the `io::Error` boundary.
    fn kind(&self) -> io::ErrorKind {
        match self {
            Self::NoSuchInterface { .. } => io::ErrorKind::NotFound,
            Self::NotEthernet { .. } => io::ErrorKind::Unsupported,
            Self::NoPermission => io::ErrorKind::PermissionDenied,
            Self::AddressNotOnInterface { .. } => io::ErrorKind::AddrNotAvailable,
            Self::AddrInUse { .. } => io::ErrorKind::AddrInUse,
            Self::Unreachable(_) => io::ErrorKind::HostUnreachable,
            Self::Io { source, .. } => source.kind(),
        }
    }
}

impl From<RawError> for io::Error {
    fn from(e: RawError) -> Self {
        Self::new(e.kind(), e)
    }
}

impl From<RawError> for OpenError {
    fn from(e: RawError) -> Self {
        match e {
            RawError::NoSuchInterface { name, available } => {
                Self::NoSuchInterface { name, available }
            }
            RawError::NoPermission => Self::NoRawPermission,
            RawError::AddrInUse { addr } => Self::AddrInUse {
                addr,
                detail: "the raw backend holds a UDP socket on it".into(),
            },
            other => Self::Backend {
                backend: "raw",
                message: other.to_string(),
            },
        }
    }
}

/// Counters of a [`RawDatapath`]. Frames the socket filter drops (other protocols and
/// ports) are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RawStats {
    /// Frames read from the socket.
    pub rx_frames: u64,
    /// Datagrams delivered.
    pub rx_datagrams: u64,
    /// UDP GSO frames from a local sender, split into their datagrams.
    pub rx_gso_frames: u64,
    /// Frames neither IPv4, IPv6 nor ARP.
    pub rx_not_ip: u64,
    /// Frames for another MAC address, IP address or UDP port.
    pub rx_not_for_us: u64,
    /// Frames shorter than their headers say, or longer than a receive slot.
    pub rx_truncated: u64,
    /// Malformed IP headers, IPv4 options, IPv6 extension headers, wrong IPv4 checksums.
    pub rx_bad_ip: u64,
    /// IPv4 fragments.
    pub rx_fragments: u64,
    /// IP packets that are not UDP.
    pub rx_not_udp: u64,
    /// UDP lengths that disagree with the IP length.
    pub rx_bad_udp_len: u64,
    /// Wrong UDP checksums (or zero over IPv6).
    pub rx_bad_checksum: u64,
    /// GSO frames of a kind we cannot split.
    pub rx_bad_gso: u64,
    /// Datagrams larger than the receive buffer offered.
    pub rx_too_big: u64,
    /// Frames the kernel dropped because the socket's receive buffer was full.
    pub rx_kernel_drops: u64,
    /// ARP and neighbour discovery messages handled.
    pub neighbour_rx: u64,
    /// Malformed ARP or neighbour discovery messages.
    pub neighbour_bad: u64,
    /// ARP requests sent.
    pub arp_requests: u64,
    /// Neighbour solicitations sent.
    pub neighbour_solicitations: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Datagrams queued while their peer was being resolved.
    pub tx_queued: u64,
    /// Queued datagrams dropped because resolution failed.
    pub tx_unresolved: u64,
    /// Queued datagrams dropped because the queue was full.
    pub tx_queue_overflow: u64,
    /// Datagrams the kernel took and dropped (`ENOBUFS`: a full device queue, a tc or
    /// nftables egress drop), queued datagrams the socket refused when their peer resolved,
    /// and neighbour messages that could not be sent.
    pub tx_dropped: u64,
    /// Datagrams refused because their peer was unreachable.
    pub tx_unreachable: u64,
}

/// The `raw` backend (see the [module docs](self)).
pub struct RawDatapath {
    sock: PacketSocket,
    /// Bound to `local_ip:port` so the kernel neither answers our traffic with ICMP port
    /// unreachable nor lets another stack take the address.
    _guard: Socket,
    ifname: String,
    ifindex: u32,
    local: Local,
    mtu: usize,
    neighbours: neigh::Table,
    /// Receive slots and what is left of the last `recvmmsg`.
    rx_buf: Box<[u8]>,
    rx_info: [RxInfo; RX_SLOTS],
    rx_count: usize,
    rx_next: usize,
    /// Next segment of the current frame (GSO frames give several datagrams).
    rx_segment: usize,
    tx_headers: Box<[[u8; MAX_HEADERS]; TX_BATCH]>,
    /// Scratch for timer results.
    poll: Poll,
    stats: RawStats,
    last_error: Option<RawError>,
}

impl fmt::Debug for RawDatapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawDatapath")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("local", &self.local)
            .field("mtu", &self.mtu)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RawDatapath {
    /// Opens the backend on interface `ifname`, whose address `local_ip` must be.
    ///
    /// # Errors
    /// [`RawError::NoSuchInterface`] (listing the interfaces), [`RawError::NotEthernet`],
    /// [`RawError::AddressNotOnInterface`] (listing its addresses), [`RawError::NoPermission`]
    /// without `CAP_NET_RAW`, [`RawError::AddrInUse`] when another stack holds
    /// `local_ip:port`, [`RawError::Io`] otherwise.
    pub fn open(ifname: &str, local_ip: IpAddr, opts: RawOptions) -> Result<Self, RawError> {
        let interfaces = pnet_datalink::interfaces();
        let Some(iface) = interfaces.iter().find(|i| i.name == ifname) else {
            let mut names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
            names.sort_unstable();
            return Err(RawError::NoSuchInterface {
                name: ifname.to_owned(),
                available: names.join(", "),
            });
        };
        let mac = match iface.mac {
            Some(m) if m.octets() != [0; 6] => m.octets(),
            _ => {
                return Err(RawError::NotEthernet {
                    ifname: ifname.to_owned(),
                })
            }
        };
        if !iface.ips.iter().any(|n| n.ip() == local_ip) {
            let addresses: Vec<String> = iface.ips.iter().map(|n| n.to_string()).collect();
            return Err(RawError::AddressNotOnInterface {
                ip: local_ip,
                ifname: ifname.to_owned(),
                addresses: if addresses.is_empty() {
                    "none".into()
                } else {
                    addresses.join(", ")
                },
            });
        }
        let mut sock = PacketSocket::open(iface.index, opts.port)
            .map_err(|e| RawError::from_socket_error("open AF_PACKET socket", e))?;
        let mtu = sock
            .mtu(ifname)
            .map_err(|e| RawError::from_socket_error("read the interface MTU", e))?;
        sock.set_buffers(opts.recv_buffer, opts.send_buffer);
        let guard = guard_socket(local_ip, opts.port, iface.index)?;
        let mut neighbours = neigh::Table::new(neigh::Config {
            attempts: opts.resolve_attempts.max(1),
            interval: opts.resolve_interval,
            ttl: opts.neighbour_ttl,
            fail_hold: opts.unreachable_hold,
            queue_len: opts.pending_per_neighbour,
            max_unresolved: 64,
        });
        let now = Instant::now();
        if opts.kernel_neighbours && local_ip.is_ipv4() {
            for (ip, mac) in kernel_arp_table(ifname) {
                neighbours.learn(now, ip, mac, true);
            }
        }
        for &(ip, mac) in &opts.static_neighbours {
            neighbours.insert_static(ip, mac);
        }
        Ok(Self {
            sock,
            _guard: guard,
            ifname: ifname.to_owned(),
            ifindex: iface.index,
            local: Local {
                mac,
                ip: local_ip,
                port: opts.port,
            },
            mtu,
            neighbours,
            rx_buf: vec![0u8; RX_SLOTS * SLOT_LEN].into_boxed_slice(),
            rx_info: [RxInfo::default(); RX_SLOTS],
            rx_count: 0,
            rx_next: 0,
            rx_segment: 0,
            tx_headers: Box::new([[0u8; MAX_HEADERS]; TX_BATCH]),
            poll: Poll::default(),
            stats: RawStats::default(),
            last_error: None,
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The interface's MAC address (the source of every frame).
    pub fn mac(&self) -> [u8; 6] {
        self.local.mac
    }

    /// The interface MTU (largest IP packet).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The MAC address `ip` resolved to, if it has.
    pub fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.neighbours.mac(ip)
    }

    /// Counters so far (asks the kernel for its drop count).
    pub fn stats(&mut self) -> RawStats {
        self.stats.rx_kernel_drops += self.sock.kernel_drops();
        self.stats
    }

    /// The last failure to reach a peer ([`RawError::Unreachable`]), if any.
    pub fn last_error(&self) -> Option<&RawError> {
        self.last_error.as_ref()
    }

    /// Sends due ARP requests / solicitations and expires failed resolutions.
    fn run_timers(&mut self, now: Instant) {
        if self.neighbours.next_deadline().is_none_or(|t| t > now) {
            return;
        }
        let mut poll = std::mem::take(&mut self.poll);
        self.neighbours.poll(now, &mut poll);
        for ip in poll.solicit.drain(..) {
            self.solicit(ip);
        }
        for (ip, dropped) in poll.failed.drain(..) {
            self.stats.tx_unresolved += dropped as u64;
            self.last_error = Some(RawError::Unreachable(ip));
        }
        self.poll = poll;
    }

    /// Sends one ARP request or neighbour solicitation for `ip`.
    fn solicit(&mut self, ip: IpAddr) {
        let sent = match (self.local.ip, ip) {
            (IpAddr::V4(me), IpAddr::V4(target)) => {
                let mut f = [0u8; ARP_FRAME_LEN];
                codec::build_arp_request(&mut f, self.local.mac, me, target);
                self.stats.arp_requests += 1;
                self.sock.send_batch(&[(&f[..], &[][..])])
            }
            (IpAddr::V6(me), IpAddr::V6(target)) => {
                let mut f = [0u8; NS_FRAME_LEN];
                codec::build_neighbour_solicitation(&mut f, self.local.mac, me, target);
                self.stats.neighbour_solicitations += 1;
                self.sock.send_batch(&[(&f[..], &[][..])])
            }
            _ => return,
        };
        if !matches!(sent, Ok(s) if s.dropped == 0) {
            // The next attempt will go out with the timer.
            self.stats.tx_dropped += 1;
        }
    }

    /// Learns from an ARP message: replies to our requests, and requests for our address
    /// (the asker is about to talk to us).
    fn handle_arp(&mut self, now: Instant, arp: codec::Arp) {
        self.stats.neighbour_rx += 1;
        let for_us = IpAddr::V4(arp.target_ip) == self.local.ip;
        let waiting = self.neighbours.learn(
            now,
            IpAddr::V4(arp.sender_ip),
            arp.sender_mac,
            for_us && !arp.is_reply(),
        );
        self.flush_pending(arp.sender_mac, waiting);
    }

    /// Learns from neighbour discovery: advertisements (target and its address), and
    /// solicitations for our address (their source).
    fn handle_nd(&mut self, now: Instant, nd: codec::Nd) {
        self.stats.neighbour_rx += 1;
        let Some(mac) = nd.lladdr else {
            return;
        };
        let waiting = if nd.solicitation {
            let for_us = IpAddr::V6(nd.target) == self.local.ip;
            self.neighbours
                .learn(now, IpAddr::V6(nd.src_ip), mac, for_us)
        } else {
            self.neighbours
                .learn(now, IpAddr::V6(nd.target), mac, false)
        };
        self.flush_pending(mac, waiting);
    }

    /// Sends datagrams that were waiting for `mac`. Whatever the socket refuses now is
    /// dropped (and counted): the engine retransmits.
    fn flush_pending(&mut self, mac: [u8; 6], waiting: Vec<Pending>) {
        for chunk in waiting.chunks(TX_BATCH) {
            let mut lens = [0usize; TX_BATCH];
            let mut frames: [(&[u8], &[u8]); TX_BATCH] = [(&[], &[]); TX_BATCH];
            for (i, p) in chunk.iter().enumerate() {
                let d = TxDatagram {
                    dst: p.dst,
                    src_port: p.src_port,
                    tos: p.tos,
                    hop_limit: p.hop_limit,
                    flow_label: p.flow_label,
                    payload: &p.payload,
                };
                // Checked when queued: same family, so headers are always built.
                lens[i] = codec::build_headers(&mut self.tx_headers[i], &self.local, mac, &d)
                    .unwrap_or(0);
            }
            let mut k = 0;
            for (i, p) in chunk.iter().enumerate() {
                if lens[i] > 0 {
                    frames[k] = (&self.tx_headers[i][..lens[i]], &p.payload);
                    k += 1;
                }
            }
            let sent = self.sock.send_batch(&frames[..k]).unwrap_or_default();
            self.stats.tx_frames += (sent.taken - sent.dropped) as u64;
            self.stats.tx_dropped += (chunk.len() - sent.taken + sent.dropped) as u64;
        }
    }

    /// Checks a datagram before it is sent or queued.
    fn check(&self, d: &TxDatagram<'_>) -> io::Result<()> {
        let overhead = match (self.local.ip, d.dst.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => IPV4_UDP_OVERHEAD,
            (IpAddr::V6(_), IpAddr::V6(_)) => IPV6_UDP_OVERHEAD,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "raw backend on {} cannot send to {} (other address family)",
                        self.local.ip, d.dst
                    ),
                ))
            }
        };
        if d.payload.len() + overhead > self.mtu {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "datagram of {} bytes does not fit the MTU {} of {}",
                    d.payload.len(),
                    self.mtu,
                    self.ifname
                ),
            ));
        }
        Ok(())
    }

    /// Sends `batch[start..]` up to the first datagram that cannot go out at once; returns
    /// how many datagrams were consumed (sent, or queued for resolution), or the error of
    /// the first one when none was.
    fn send_run(&mut self, now: Instant, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        let mut lens = [0usize; TX_BATCH];
        let mut k = 0;
        let mut blocker = None;
        for d in batch.iter().take(TX_BATCH) {
            if let Err(e) = self.check(d) {
                blocker = Some(Err(e));
                break;
            }
            match self.neighbours.lookup(now, d.dst.ip()) {
                Lookup::Mac(mac) => {
                    // `check` made sure the family matches, so headers are always built.
                    let Some(len) =
                        codec::build_headers(&mut self.tx_headers[k], &self.local, mac, d)
                    else {
                        break;
                    };
                    lens[k] = len;
                    k += 1;
                }
                other => {
                    blocker = Some(Ok(other));
                    break;
                }
            }
        }
        if k > 0 {
            let mut frames: [(&[u8], &[u8]); TX_BATCH] = [(&[], &[]); TX_BATCH];
            for (i, d) in batch.iter().take(k).enumerate() {
                frames[i] = (&self.tx_headers[i][..lens[i]], d.payload);
            }
            let sent = self.sock.send_batch(&frames[..k])?;
            self.stats.tx_frames += (sent.taken - sent.dropped) as u64;
            self.stats.tx_dropped += sent.dropped as u64;
            // A partial send, or a full run: the caller continues (or stops) from here.
            return Ok(sent.taken);
        }
        let Some(d) = batch.first() else {
            return Ok(0);
        };
        match blocker {
            Some(Ok(Lookup::Queue)) => {
                let ip = d.dst.ip();
                self.stats.tx_queued += 1;
                let overflow = self.neighbours.enqueue(
                    ip,
                    Pending {
                        dst: d.dst,
                        src_port: d.src_port,
                        tos: d.tos,
                        hop_limit: d.hop_limit,
                        flow_label: d.flow_label,
                        payload: d.payload.to_vec(),
                    },
                );
                self.stats.tx_queue_overflow += overflow as u64;
                Ok(1)
            }
            Some(Ok(_)) => {
                self.stats.tx_unreachable += 1;
                Err(RawError::Unreachable(d.dst.ip()).into())
            }
            Some(Err(e)) => Err(e),
            None => Ok(0),
        }
    }

    /// Fills `bufs` from frames already read; returns how many were filled.
    fn deliver(
        &mut self,
        now: Instant,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RxMeta],
        mut n: usize,
    ) -> usize {
        let want = bufs.len().min(meta.len());
        while n < want && self.rx_next < self.rx_count {
            let i = self.rx_next;
            let info = self.rx_info[i];
            let slot = &self.rx_buf[i * SLOT_LEN..i * SLOT_LEN + info.len];
            let parsed = if info.pkttype == sock::PACKET_OUTGOING {
                // Only on kernels without PACKET_IGNORE_OUTGOING.
                Rx::Drop(DropReason::NotForUs)
            } else if info.truncated {
                Rx::Drop(DropReason::Truncated)
            } else {
                match Vnet::parse(slot) {
                    Some(vnet) => codec::parse(&slot[VNET_LEN..], vnet, &self.local),
                    None => Rx::Drop(DropReason::Truncated),
                }
            };
            match parsed {
                Rx::Datagram(d) => {
                    let total = d.payload.len();
                    let start = self.rx_segment * d.segment;
                    let end = (start + d.segment).min(total);
                    if start == 0 && d.segment < total {
                        self.stats.rx_gso_frames += 1;
                    }
                    let seg = &d.payload[start.min(end)..end];
                    if seg.len() <= bufs[n].len() {
                        bufs[n][..seg.len()].copy_from_slice(seg);
                        // Segment k gets Identification + k, as the kernel's segmentation
                        // gives it (inet_gso_segment): on its own receive path, and on the
                        // wire when the frame leaves through a real NIC.
                        let k = self.rx_segment as u16;
                        let ipv4 = d.ipv4.map(|i| Ipv4Info {
                            ident: i.ident.wrapping_add(k),
                            ..i
                        });
                        meta[n] = RxMeta {
                            len: seg.len(),
                            stride: seg.len(),
                            src: d.src,
                            dst: d.dst,
                            tos: d.tos,
                            ipv4,
                        };
                        n += 1;
                        self.stats.rx_datagrams += 1;
                    } else {
                        self.stats.rx_too_big += 1;
                    }
                    if end < total {
                        // More segments of this GSO frame.
                        self.rx_segment += 1;
                        continue;
                    }
                }
                Rx::Arp(arp) => self.handle_arp(now, arp),
                Rx::Nd(nd) => self.handle_nd(now, nd),
                Rx::Drop(reason) => self.count_drop(reason),
            }
            self.rx_next += 1;
            self.rx_segment = 0;
        }
        n
    }

    fn count_drop(&mut self, reason: DropReason) {
        let s = &mut self.stats;
        let counter = match reason {
            DropReason::Truncated => &mut s.rx_truncated,
            DropReason::NotIp => &mut s.rx_not_ip,
            DropReason::NotForUs => &mut s.rx_not_for_us,
            DropReason::BadIpHeader | DropReason::BadIpChecksum => &mut s.rx_bad_ip,
            DropReason::Fragment => &mut s.rx_fragments,
            DropReason::NotUdp => &mut s.rx_not_udp,
            DropReason::BadUdpLength => &mut s.rx_bad_udp_len,
            DropReason::BadUdpChecksum => &mut s.rx_bad_checksum,
            DropReason::BadGso => &mut s.rx_bad_gso,
            DropReason::BadNeighbourMessage => &mut s.neighbour_bad,
        };
        *counter += 1;
    }
}

impl Datapath for RawDatapath {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn caps(&self) -> DatapathCaps {
        DatapathCaps {
            ip_mtu: self.mtu,
            max_gso_segments: 1,
            gro_segments: 1,
            fixed_source_port: None,
            sees_ip_header: true,
        }
    }

    fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.local.ip, self.local.port)
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        let now = Instant::now();
        let mut done = 0;
        let mut result = Ok(());
        while done < batch.len() {
            match self.send_run(now, &batch[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // New entries solicit at once.
        self.run_timers(now);
        match result {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        let now = Instant::now();
        self.run_timers(now);
        let want = bufs.len().min(meta.len());
        let mut n = self.deliver(now, bufs, meta, 0);
        while n < want {
            debug_assert_eq!(self.rx_next, self.rx_count);
            let room = (want - n).min(RX_SLOTS);
            match self
                .sock
                .recv_batch(&mut self.rx_buf, &mut self.rx_info[..room])
            {
                Ok(got) => {
                    self.stats.rx_frames += got as u64;
                    self.rx_count = got;
                    self.rx_next = 0;
                    self.rx_segment = 0;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Deliver what we have; a lasting error shows again on the next call.
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
            n = self.deliver(now, bufs, meta, n);
        }
        if n == 0 && want > 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }

    fn next_wakeup(&self) -> Option<Duration> {
        if self.rx_next < self.rx_count {
            // Frames read but not delivered: the descriptor will not say so.
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        self.neighbours
            .next_deadline()
            .map(|t| t.saturating_duration_since(now))
    }
}

/// Binds the guard UDP socket: exists so the kernel has a socket for our port (no ICMP port
/// unreachable, no second stack on the address), and keeps nothing.
fn guard_socket(ip: IpAddr, port: u16, ifindex: u32) -> Result<Socket, RawError> {
    let addr = match ip {
        IpAddr::V6(v6) if v6.is_unicast_link_local() => {
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, ifindex))
        }
        _ => SocketAddr::new(ip, port),
    };
    let io_err = |context| move |e| RawError::Io { context, source: e };
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, None)
        .map_err(io_err("create the guard UDP socket"))?;
    sock.attach_filter(&sock::drop_all_filter())
        .map_err(io_err("filter the guard UDP socket"))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)
            .map_err(io_err("configure the guard UDP socket"))?;
    }
    sock.bind(&addr.into()).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => RawError::AddrInUse { addr },
        _ => RawError::Io {
            context: "bind the guard UDP socket",
            source: e,
        },
    })?;
    Ok(sock)
}

/// Complete entries of the kernel's IPv4 neighbour table for `ifname`, in the calling
/// thread's namespace (`/proc/thread-self/net/arp`). Empty if unreadable.
fn kernel_arp_table(ifname: &str) -> Vec<(IpAddr, [u8; 6])> {
    let text = std::fs::read_to_string("/proc/thread-self/net/arp").unwrap_or_default();
    parse_proc_arp(&text, ifname)
}

/// Parses `/proc/net/arp`: `IP address, HW type, Flags, HW address, Mask, Device`.
fn parse_proc_arp(text: &str, ifname: &str) -> Vec<(IpAddr, [u8; 6])> {
    const ATF_COM: u32 = 0x2;
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [ip, _hw, flags, mac, _mask, dev] = f.as_slice() else {
                return None;
            };
            let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
            if *dev != ifname || flags & ATF_COM == 0 {
                return None;
            }
            Some((ip.parse().ok()?, parse_mac(mac)?))
        })
        .collect()
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    if parts.next().is_some() || mac == [0; 6] {
        return None;
    }
    Some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_errors_map_to_permission() {
        for errno in [libc::EPERM, libc::EACCES] {
            let e = RawError::from_socket_error("open", io::Error::from_raw_os_error(errno));
            assert!(matches!(e, RawError::NoPermission), "{e:?}");
            assert_eq!(
                e.to_string(),
                "raw backend needs CAP_NET_RAW (run as root or setcap cap_net_raw+ep)"
            );
            assert_eq!(io::Error::from(e).kind(), io::ErrorKind::PermissionDenied);
        }
        let e = RawError::from_socket_error("open", io::Error::from_raw_os_error(libc::EMFILE));
        assert!(
            matches!(
                e,
                RawError::Io {
                    context: "open",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(matches!(
            OpenError::from(RawError::NoPermission),
            OpenError::NoRawPermission
        ));
    }

    #[test]
    fn error_messages_say_what_to_do() {
        let e = RawError::NoSuchInterface {
            name: "eth9".into(),
            available: "eth0, lo".into(),
        };
        assert_eq!(
            e.to_string(),
            "no network interface named \"eth9\" (interfaces: eth0, lo)"
        );
        let e = RawError::Unreachable("10.0.0.9".parse().unwrap());
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::HostUnreachable);
    }

    #[test]
    fn reads_the_kernel_arp_table() {
        let text = "IP address       HW type     Flags       HW address            Mask     Device\n\
                    10.1.2.2         0x1         0x2         02:52:aa:01:02:02     *        veth-a\n\
                    10.1.2.3         0x1         0x0         00:00:00:00:00:00     *        veth-a\n\
                    10.9.9.9         0x1         0x2         02:00:00:00:00:09     *        eth0\n";
        assert_eq!(
            parse_proc_arp(text, "veth-a"),
            vec![(
                "10.1.2.2".parse().unwrap(),
                [0x02, 0x52, 0xaa, 0x01, 0x02, 0x02]
            )]
        );
        assert_eq!(parse_mac("02:52:aa:01:02"), None);
        assert_eq!(parse_mac("02:52:aa:01:02:03:04"), None);
    }
}
