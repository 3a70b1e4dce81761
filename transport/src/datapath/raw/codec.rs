//! The frames the raw backend reads and writes: the virtio-net header `AF_PACKET` puts in
//! front (`PACKET_VNET_HDR`), Ethernet, IPv4/IPv6, UDP, ARP and IPv6 neighbour discovery.
//!
//! Pure functions over byte slices. [`parse`] never panics, whatever the bytes (a property
//! test feeds it arbitrary input); it says why it refused a frame so the backend can count it.
//! Lengths always come from the IP and UDP headers, never from the frame length: a frame may
//! carry Ethernet padding or a trailer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use roce_wire::frame::{EthRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr};

use crate::datapath::{Ipv4Info, TxDatagram};

/// Length of the virtio-net header (`struct virtio_net_hdr`) before every frame.
pub(super) const VNET_LEN: usize = 10;
/// Ethernet header length (no 802.1Q tag: the socket filter drops tagged frames).
pub(super) const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
/// The longest header block [`build_headers`] writes: virtio-net, Ethernet, IPv6, UDP.
pub(super) const MAX_HEADERS: usize = VNET_LEN + ETH_LEN + IPV6_LEN + UDP_LEN;
/// Length of an ARP request frame as built (Ethernet minimum, 60 bytes, plus virtio-net).
pub(super) const ARP_FRAME_LEN: usize = VNET_LEN + 60;
/// Length of a neighbour solicitation frame as built.
pub(super) const NS_FRAME_LEN: usize = VNET_LEN + ETH_LEN + IPV6_LEN + NS_LEN;
/// ICMPv6 neighbour solicitation with one link-layer address option.
const NS_LEN: usize = 24 + 8;

/// EtherType IPv4.
pub(super) const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType ARP.
pub(super) const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType IPv6.
pub(super) const ETHERTYPE_IPV6: u16 = 0x86DD;
/// The Ethernet broadcast address.
pub(super) const BROADCAST: [u8; 6] = [0xFF; 6];

const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;
const ICMPV6_NS: u8 = 135;
const ICMPV6_NA: u8 = 136;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
const TTL_DEFAULT: u8 = 64;

/// The virtio-net header fields we use (`include/uapi/linux/virtio_net.h`; native byte order,
/// as `AF_PACKET` writes it on a little-endian host).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Vnet {
    /// `VIRTIO_NET_HDR_F_*`.
    pub(super) flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`, possibly with the ECN bit.
    pub(super) gso_type: u8,
    /// Segment payload size of a GSO frame.
    pub(super) gso_size: u16,
}

impl Vnet {
    /// The checksum is partial: the sender is local and the kernel never computed it.
    const NEEDS_CSUM: u8 = 1;
    /// The kernel (or the NIC) already verified the checksum.
    const DATA_VALID: u8 = 2;
    const GSO_NONE: u8 = 0;
    const GSO_UDP_L4: u8 = 5;
    const GSO_ECN: u8 = 0x80;

    /// Reads the header at the start of `b` (`None` if too short).
    pub(super) fn parse(b: &[u8]) -> Option<Self> {
        let b = b.get(..VNET_LEN)?;
        Some(Self {
            flags: b[0],
            gso_type: b[1],
            gso_size: u16::from_ne_bytes([b[4], b[5]]),
        })
    }

    /// Whether the transport checksum needs no check by us.
    fn checksum_trusted(self) -> bool {
        self.flags & (Self::NEEDS_CSUM | Self::DATA_VALID) != 0
    }
}

/// Who we are, for filtering received frames and building sent ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Local {
    /// The interface's MAC address.
    pub(super) mac: [u8; 6],
    /// Our IP address.
    pub(super) ip: IpAddr,
    /// Our UDP port (4791).
    pub(super) port: u16,
}

/// What a received frame is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Rx<'a> {
    /// A UDP datagram for us.
    Datagram(Datagram<'a>),
    /// An ARP message.
    Arp(Arp),
    /// An IPv6 neighbour solicitation or advertisement.
    Nd(Nd),
    /// Refused, and why.
    Drop(DropReason),
}

/// A UDP datagram for us; several when a local sender used UDP GSO.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Datagram<'a> {
    /// Sender's address and port.
    pub(super) src: SocketAddr,
    /// Our address and port.
    pub(super) dst: SocketAddr,
    /// IPv4 TOS / IPv6 traffic class.
    pub(super) tos: u8,
    /// IPv4 Identification and DF (of the first segment: segment k of a GSO frame has
    /// Identification + k).
    pub(super) ipv4: Option<Ipv4Info>,
    /// The UDP payload (all segments of a GSO frame).
    pub(super) payload: &'a [u8],
    /// Segment size: `payload` is one datagram per `segment` bytes (the last may be shorter).
    /// Equal to the payload length (at least 1) for an ordinary datagram.
    pub(super) segment: usize,
}

/// An ARP message for IPv4 over Ethernet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Arp {
    /// Request (1) or reply (2).
    pub(super) op: u16,
    /// Sender hardware address.
    pub(super) sender_mac: [u8; 6],
    /// Sender protocol address.
    pub(super) sender_ip: Ipv4Addr,
    /// Target protocol address.
    pub(super) target_ip: Ipv4Addr,
}

impl Arp {
    /// Whether this is a reply.
    pub(super) fn is_reply(&self) -> bool {
        self.op == ARP_REPLY
    }
}

/// A neighbour solicitation or advertisement (RFC 4861 sections 4.3 and 4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Nd {
    /// Solicitation (`true`) or advertisement.
    pub(super) solicitation: bool,
    /// IPv6 source address.
    pub(super) src_ip: Ipv6Addr,
    /// Target address.
    pub(super) target: Ipv6Addr,
    /// Source (solicitation) or target (advertisement) link-layer address option.
    pub(super) lladdr: Option<[u8; 6]>,
}

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DropReason {
    /// Shorter than its headers say.
    Truncated,
    /// Neither IPv4, IPv6 nor ARP.
    NotIp,
    /// Another MAC, IP address or UDP port.
    NotForUs,
    /// A malformed IP header, IPv4 options or IPv6 extension headers.
    BadIpHeader,
    /// Wrong IPv4 header checksum.
    BadIpChecksum,
    /// An IPv4 fragment (RoCEv2 never fragments).
    Fragment,
    /// Not UDP.
    NotUdp,
    /// UDP length shorter than its header or different from the IP payload length.
    BadUdpLength,
    /// Wrong (or, over IPv6, zero) UDP checksum.
    BadUdpChecksum,
    /// A GSO frame of a kind we cannot split.
    BadGso,
    /// A malformed ARP or neighbour discovery message.
    BadNeighbourMessage,
}

/// Classifies an Ethernet frame (after the virtio-net header).
pub(super) fn parse<'a>(frame: &'a [u8], vnet: Vnet, local: &Local) -> Rx<'a> {
    if frame.len() < ETH_LEN {
        return Rx::Drop(DropReason::Truncated);
    }
    let dst_mac = mac_at(frame, 0);
    let l3 = &frame[ETH_LEN..];
    match be16(frame, 12) {
        ETHERTYPE_ARP => parse_arp(l3),
        ETHERTYPE_IPV4 => {
            if dst_mac != local.mac && dst_mac != BROADCAST {
                return Rx::Drop(DropReason::NotForUs);
            }
            parse_ipv4(l3, vnet, local)
        }
        // Neighbour solicitations arrive on multicast addresses: the MAC is checked below,
        // for datagrams only.
        ETHERTYPE_IPV6 => parse_ipv6(l3, dst_mac, vnet, local),
        _ => Rx::Drop(DropReason::NotIp),
    }
}

fn parse_ipv4<'a>(p: &'a [u8], vnet: Vnet, local: &Local) -> Rx<'a> {
    if p.len() < IPV4_LEN {
        return Rx::Drop(DropReason::Truncated);
    }
    if p[0] >> 4 != 4 {
        return Rx::Drop(DropReason::BadIpHeader);
    }
    if p[0] & 0x0F != 5 {
        // Options (RoCEv2 never sends them; the ICRC would not cover them), or a bad IHL.
        return Rx::Drop(DropReason::BadIpHeader);
    }
    if fold(sum(&p[..IPV4_LEN], 0)) != 0xFFFF {
        return Rx::Drop(DropReason::BadIpChecksum);
    }
    let total = usize::from(be16(p, 2));
    if total < IPV4_LEN {
        return Rx::Drop(DropReason::BadIpHeader);
    }
    if p.len() < total {
        return Rx::Drop(DropReason::Truncated);
    }
    let flags_frag = be16(p, 6);
    if flags_frag & 0x3FFF != 0 {
        // MF set or a fragment offset.
        return Rx::Drop(DropReason::Fragment);
    }
    if p[9] != PROTO_UDP {
        return Rx::Drop(DropReason::NotUdp);
    }
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    if IpAddr::V4(dst) != local.ip {
        return Rx::Drop(DropReason::NotForUs);
    }
    let udp = &p[IPV4_LEN..total];
    let mut pseudo = [0u8; 12];
    pseudo[..8].copy_from_slice(&p[12..20]);
    pseudo[9] = PROTO_UDP;
    pseudo[10..].copy_from_slice(&(udp.len() as u16).to_be_bytes());
    let info = Ipv4Info {
        ident: be16(p, 4),
        dont_fragment: flags_frag & 0x4000 != 0,
    };
    parse_udp(
        udp,
        IpAddr::V4(src),
        IpAddr::V4(dst),
        p[1],
        Some(info),
        &pseudo,
        vnet,
        local,
    )
}

fn parse_ipv6<'a>(p: &'a [u8], dst_mac: [u8; 6], vnet: Vnet, local: &Local) -> Rx<'a> {
    if p.len() < IPV6_LEN {
        return Rx::Drop(DropReason::Truncated);
    }
    if p[0] >> 4 != 6 {
        return Rx::Drop(DropReason::BadIpHeader);
    }
    let total = IPV6_LEN + usize::from(be16(p, 4));
    if p.len() < total {
        return Rx::Drop(DropReason::Truncated);
    }
    let src = ipv6_at(p, 8);
    let dst = ipv6_at(p, 24);
    let upper = &p[IPV6_LEN..total];
    match p[6] {
        PROTO_UDP => {}
        PROTO_ICMPV6 => return parse_nd(p, upper, src, vnet),
        // Another protocol, or extension headers (RoCEv2 never sends them).
        _ => return Rx::Drop(DropReason::NotUdp),
    }
    if (dst_mac != local.mac && dst_mac != BROADCAST) || IpAddr::V6(dst) != local.ip {
        return Rx::Drop(DropReason::NotForUs);
    }
    let pseudo = ipv6_pseudo_header(&p[8..40], upper.len(), PROTO_UDP);
    let tos = (p[0] << 4) | (p[1] >> 4);
    parse_udp(
        upper,
        IpAddr::V6(src),
        IpAddr::V6(dst),
        tos,
        None,
        &pseudo,
        vnet,
        local,
    )
}

#[allow(clippy::too_many_arguments)]
fn parse_udp<'a>(
    udp: &'a [u8],
    src: IpAddr,
    dst: IpAddr,
    tos: u8,
    ipv4: Option<Ipv4Info>,
    pseudo: &[u8],
    vnet: Vnet,
    local: &Local,
) -> Rx<'a> {
    if udp.len() < UDP_LEN || usize::from(be16(udp, 4)) != udp.len() {
        return Rx::Drop(DropReason::BadUdpLength);
    }
    let (sport, dport, check) = (be16(udp, 0), be16(udp, 2), be16(udp, 6));
    if dport != local.port {
        return Rx::Drop(DropReason::NotForUs);
    }
    if !vnet.checksum_trusted() {
        let required = src.is_ipv6();
        if check == 0 {
            if required {
                return Rx::Drop(DropReason::BadUdpChecksum);
            }
        } else if fold(sum(udp, sum(pseudo, 0))) != 0xFFFF {
            return Rx::Drop(DropReason::BadUdpChecksum);
        }
    }
    let payload = &udp[UDP_LEN..];
    let segment = match vnet.gso_type & !Vnet::GSO_ECN {
        Vnet::GSO_NONE => payload.len().max(1),
        Vnet::GSO_UDP_L4 if vnet.gso_size > 0 => usize::from(vnet.gso_size),
        _ => return Rx::Drop(DropReason::BadGso),
    };
    Rx::Datagram(Datagram {
        src: SocketAddr::new(src, sport),
        dst: SocketAddr::new(dst, dport),
        tos,
        ipv4,
        payload,
        segment,
    })
}

fn parse_arp(p: &[u8]) -> Rx<'_> {
    if p.len() < 28 {
        return Rx::Drop(DropReason::Truncated);
    }
    // Ethernet (1), IPv4, 6-byte and 4-byte addresses.
    if be16(p, 0) != 1 || be16(p, 2) != ETHERTYPE_IPV4 || p[4] != 6 || p[5] != 4 {
        return Rx::Drop(DropReason::BadNeighbourMessage);
    }
    let op = be16(p, 6);
    if op != ARP_REQUEST && op != ARP_REPLY {
        return Rx::Drop(DropReason::BadNeighbourMessage);
    }
    Rx::Arp(Arp {
        op,
        sender_mac: mac_at(p, 8),
        sender_ip: Ipv4Addr::new(p[14], p[15], p[16], p[17]),
        target_ip: Ipv4Addr::new(p[24], p[25], p[26], p[27]),
    })
}

/// `ip` is the whole IPv6 packet, `icmp` its payload.
fn parse_nd(ip: &[u8], icmp: &[u8], src: Ipv6Addr, vnet: Vnet) -> Rx<'static> {
    // Only neighbour discovery gets through the socket filter; anything else is dropped.
    if icmp.len() < 24 {
        return Rx::Drop(DropReason::BadNeighbourMessage);
    }
    let solicitation = match icmp[0] {
        ICMPV6_NS => true,
        ICMPV6_NA => false,
        _ => return Rx::Drop(DropReason::NotUdp),
    };
    // RFC 4861 7.1.1 / 7.1.2: hop limit 255 (not forwarded), code 0, valid checksum.
    if ip[7] != 255 || icmp[1] != 0 {
        return Rx::Drop(DropReason::BadNeighbourMessage);
    }
    if !vnet.checksum_trusted() {
        let pseudo = ipv6_pseudo_header(&ip[8..40], icmp.len(), PROTO_ICMPV6);
        if fold(sum(icmp, sum(&pseudo, 0))) != 0xFFFF {
            return Rx::Drop(DropReason::BadNeighbourMessage);
        }
    }
    let target = ipv6_at(icmp, 8);
    let wanted = if solicitation { 1 } else { 2 };
    let mut lladdr = None;
    let mut opts = &icmp[24..];
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            return Rx::Drop(DropReason::BadNeighbourMessage);
        }
        if opts[0] == wanted && len == 8 {
            lladdr = Some(mac_at(opts, 2));
        }
        opts = &opts[len..];
    }
    Rx::Nd(Nd {
        solicitation,
        src_ip: src,
        target,
        lladdr,
    })
}

/// Writes the virtio-net (all zero: no offloads), Ethernet, IP and UDP headers for `d` into
/// `buf`; returns their length, or `None` if `d` is not of our address family.
///
/// IPv4 gets Identification 0 and DF (the header the engine computed the ICRC for), TTL
/// `hop_limit` and TOS `tos`, and UDP checksum 0. IPv6 gets traffic class, flow label and hop
/// limit from `d`, and a computed UDP checksum (IPv6 requires one). A `hop_limit` of 0 means
/// 64. The caller keeps the payload within the interface MTU.
pub(super) fn build_headers(
    buf: &mut [u8; MAX_HEADERS],
    local: &Local,
    dst_mac: [u8; 6],
    d: &TxDatagram<'_>,
) -> Option<usize> {
    let hop = if d.hop_limit == 0 {
        TTL_DEFAULT
    } else {
        d.hop_limit
    };
    let ip = match (local.ip, d.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
            src,
            dst,
            tos: d.tos,
            ident: 0,
            dont_fragment: true,
            ttl: hop,
        }),
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
            src,
            dst,
            traffic_class: d.tos,
            flow_label: d.flow_label & 0x000F_FFFF,
            hop_limit: hop,
        }),
        _ => return None,
    };
    let repr = FrameRepr {
        eth: Some(EthRepr {
            dst: dst_mac,
            src: local.mac,
            vlan: None,
        }),
        ip,
        udp: UdpRepr {
            src_port: d.src_port,
            dst_port: d.dst.port(),
            checksum: 0,
        },
    };
    let end = VNET_LEN + repr.header_len();
    buf[..VNET_LEN].fill(0);
    repr.emit_headers(d.payload.len(), &mut buf[VNET_LEN..end]);
    if let IpRepr::V6(_) = ip {
        let ip_hdr = VNET_LEN + ETH_LEN;
        let udp_hdr = ip_hdr + IPV6_LEN;
        let len = UDP_LEN + d.payload.len();
        let pseudo = ipv6_pseudo_header(&buf[ip_hdr + 8..ip_hdr + 40], len, PROTO_UDP);
        let s = sum(d.payload, sum(&buf[udp_hdr..end], sum(&pseudo, 0)));
        // RFC 8200 8.1: a computed checksum of zero is sent as 0xFFFF.
        let check = match !fold(s) {
            0 => 0xFFFF,
            c => c,
        };
        buf[udp_hdr + 6..udp_hdr + 8].copy_from_slice(&check.to_be_bytes());
    }
    Some(end)
}

/// Writes a broadcast ARP request "who has `target`? tell `local`" (padded to the Ethernet
/// minimum) after a zero virtio-net header.
pub(super) fn build_arp_request(
    buf: &mut [u8; ARP_FRAME_LEN],
    mac: [u8; 6],
    ip: Ipv4Addr,
    target: Ipv4Addr,
) {
    buf.fill(0);
    let f = &mut buf[VNET_LEN..];
    f[..6].copy_from_slice(&BROADCAST);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    let a = &mut f[ETH_LEN..];
    a[0..2].copy_from_slice(&1u16.to_be_bytes());
    a[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    a[4] = 6;
    a[5] = 4;
    a[6..8].copy_from_slice(&ARP_REQUEST.to_be_bytes());
    a[8..14].copy_from_slice(&mac);
    a[14..18].copy_from_slice(&ip.octets());
    // Target hardware address: zero (unknown).
    a[24..28].copy_from_slice(&target.octets());
}

/// Writes a neighbour solicitation for `target` to its solicited-node multicast group, from
/// `ip` with our link-layer address, after a zero virtio-net header.
pub(super) fn build_neighbour_solicitation(
    buf: &mut [u8; NS_FRAME_LEN],
    mac: [u8; 6],
    ip: Ipv6Addr,
    target: Ipv6Addr,
) {
    buf.fill(0);
    let t = target.octets();
    // ff02::1:ffXX:XXXX and its MAC 33:33:ff:XX:XX:XX (RFC 4291 2.7.1, RFC 2464 7).
    let group = Ipv6Addr::new(
        0xFF02,
        0,
        0,
        0,
        0,
        1,
        0xFF00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let f = &mut buf[VNET_LEN..];
    f[..6].copy_from_slice(&[0x33, 0x33, 0xFF, t[13], t[14], t[15]]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let p = &mut f[ETH_LEN..];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(NS_LEN as u16).to_be_bytes());
    p[6] = PROTO_ICMPV6;
    p[7] = 255;
    p[8..24].copy_from_slice(&ip.octets());
    p[24..40].copy_from_slice(&group.octets());
    let pseudo = ipv6_pseudo_header(&p[8..40], NS_LEN, PROTO_ICMPV6);
    let icmp = &mut p[IPV6_LEN..IPV6_LEN + NS_LEN];
    icmp[0] = ICMPV6_NS;
    icmp[8..24].copy_from_slice(&t);
    icmp[24] = 1; // source link-layer address
    icmp[25] = 1; // 8 bytes
    icmp[26..32].copy_from_slice(&mac);
    let check = !fold(sum(icmp, sum(&pseudo, 0)));
    icmp[2..4].copy_from_slice(&check.to_be_bytes());
}

/// The IPv6 pseudo-header (RFC 8200 8.1) for `addrs` (source and destination, 32 bytes).
fn ipv6_pseudo_header(addrs: &[u8], len: usize, next: u8) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[..32].copy_from_slice(&addrs[..32]);
    p[32..36].copy_from_slice(&(len as u32).to_be_bytes());
    p[39] = next;
    p
}

/// Adds `data` to a one's-complement accumulator (RFC 1071), four bytes at a time; an odd
/// last byte is padded with zero. Fold the result with [`fold`].
pub(super) fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let v = u64::from_be_bytes(b);
        acc += (v >> 32) + (v & 0xFFFF_FFFF);
    }
    let mut rest = words.remainder().chunks_exact(2);
    for w in &mut rest {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = rest.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a one's-complement accumulator to 16 bits (not complemented).
pub(super) fn fold(mut acc: u64) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn mac_at(b: &[u8], at: usize) -> [u8; 6] {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[at..at + 6]);
    m
}

fn ipv6_at(b: &[u8], at: usize) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(a)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];

    fn local(ip: &str) -> Local {
        Local {
            mac: MAC_B,
            ip: ip.parse().unwrap(),
            port: 4791,
        }
    }

    fn datagram<'a>(dst: &str, payload: &'a [u8]) -> TxDatagram<'a> {
        TxDatagram {
            dst: dst.parse().unwrap(),
            src_port: 0xC0DE,
            tos: 0x02,
            hop_limit: 17,
            flow_label: 0xABCDE,
            payload,
        }
    }

    /// Builds a frame from A to B carrying `payload`.
    fn frame(from: &str, to: &str, payload: &[u8]) -> Vec<u8> {
        let sender = Local {
            mac: MAC_A,
            ..local(from)
        };
        let mut hdr = [0u8; MAX_HEADERS];
        let d = datagram(to, payload);
        let n = build_headers(&mut hdr, &sender, MAC_B, &d).unwrap();
        let mut f = hdr[VNET_LEN..n].to_vec();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn ipv4_roundtrip_with_roce_header_contract() {
        let payload: Vec<u8> = (0..100u8).collect();
        let f = frame("10.0.0.1", "10.0.0.2:4791", &payload);
        // Identification 0, DF, TTL, TOS, UDP checksum 0.
        assert_eq!(&f[18..20], &[0, 0]);
        assert_eq!(f[20], 0x40);
        assert_eq!(f[22], 17);
        assert_eq!(f[15], 0x02);
        assert_eq!(&f[40..42], &[0, 0]);
        let Rx::Datagram(d) = parse(&f, Vnet::default(), &local("10.0.0.2")) else {
            panic!("not a datagram");
        };
        assert_eq!(d.payload, &payload[..]);
        assert_eq!(d.src, "10.0.0.1:49374".parse().unwrap());
        assert_eq!(d.tos, 0x02);
        assert_eq!(
            d.ipv4,
            Some(Ipv4Info {
                ident: 0,
                dont_fragment: true
            })
        );
        assert_eq!(d.segment, 100);
    }

    #[test]
    fn ipv6_checksum_is_computed_and_checked() {
        for len in [0usize, 1, 7, 8, 9, 1000, 1001] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut f = frame("fd00::1", "[fd00::2]:4791", &payload);
            let Rx::Datagram(d) = parse(&f, Vnet::default(), &local("fd00::2")) else {
                panic!("not a datagram ({len})");
            };
            assert_eq!(d.payload, &payload[..]);
            assert_eq!(d.tos, 0x02);
            assert_eq!(d.ipv4, None);
            assert_eq!(f[14 + 7], 17); // hop limit
            if len > 0 {
                let n = f.len();
                f[n - 1] ^= 0x10;
                assert_eq!(
                    parse(&f, Vnet::default(), &local("fd00::2")),
                    Rx::Drop(DropReason::BadUdpChecksum)
                );
                // Unless the kernel vouches for it.
                let trusted = Vnet {
                    flags: Vnet::DATA_VALID,
                    ..Vnet::default()
                };
                assert!(matches!(
                    parse(&f, trusted, &local("fd00::2")),
                    Rx::Datagram(_)
                ));
            }
        }
    }

    #[test]
    fn refuses_what_is_not_for_us() {
        let f = frame("10.0.0.1", "10.0.0.2:4791", b"abcd");
        let l = local("10.0.0.2");
        assert_eq!(
            parse(&f, Vnet::default(), &local("10.0.0.3")),
            Rx::Drop(DropReason::NotForUs)
        );
        let other_port = Local { port: 4792, ..l };
        assert_eq!(
            parse(&f, Vnet::default(), &other_port),
            Rx::Drop(DropReason::NotForUs)
        );
        let other_mac = Local { mac: MAC_A, ..l };
        assert_eq!(
            parse(&f, Vnet::default(), &other_mac),
            Rx::Drop(DropReason::NotForUs)
        );
        let mut g = f.clone();
        g[24] ^= 1; // IPv4 checksum
        assert_eq!(
            parse(&g, Vnet::default(), &l),
            Rx::Drop(DropReason::BadIpChecksum)
        );
        assert_eq!(
            parse(&f[..f.len() - 1], Vnet::default(), &l),
            Rx::Drop(DropReason::Truncated)
        );
        let mut g = f.clone();
        g[12] = 0x88; // EtherType
        assert_eq!(parse(&g, Vnet::default(), &l), Rx::Drop(DropReason::NotIp));
    }

    #[test]
    fn lengths_come_from_headers_not_the_frame() {
        let mut f = frame("10.0.0.1", "10.0.0.2:4791", b"abcd");
        f.extend_from_slice(&[0xEE; 20]); // Ethernet padding / trailer
        let Rx::Datagram(d) = parse(&f, Vnet::default(), &local("10.0.0.2")) else {
            panic!("not a datagram");
        };
        assert_eq!(d.payload, b"abcd");
    }

    #[test]
    fn gso_frames_are_split_by_segment_size() {
        let payload = vec![7u8; 3000];
        let f = frame("10.0.0.1", "10.0.0.2:4791", &payload);
        let vnet = Vnet {
            flags: Vnet::NEEDS_CSUM,
            gso_type: Vnet::GSO_UDP_L4,
            gso_size: 1200,
        };
        let Rx::Datagram(d) = parse(&f, vnet, &local("10.0.0.2")) else {
            panic!("not a datagram");
        };
        assert_eq!((d.payload.len(), d.segment), (3000, 1200));
        let tcp = Vnet {
            gso_type: 1,
            ..vnet
        };
        assert_eq!(
            parse(&f, tcp, &local("10.0.0.2")),
            Rx::Drop(DropReason::BadGso)
        );
    }

    #[test]
    fn arp_request_parses_back() {
        let mut buf = [0u8; ARP_FRAME_LEN];
        let (me, peer) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        build_arp_request(&mut buf, MAC_A, me, peer);
        let Rx::Arp(a) = parse(&buf[VNET_LEN..], Vnet::default(), &local("10.0.0.2")) else {
            panic!("not ARP");
        };
        assert_eq!(
            (a.op, a.sender_mac, a.sender_ip, a.target_ip),
            (1, MAC_A, me, peer)
        );
        assert!(!a.is_reply());
    }

    #[test]
    fn neighbour_solicitation_parses_back_with_valid_checksum() {
        let mut buf = [0u8; NS_FRAME_LEN];
        let me: Ipv6Addr = "fd00:1:2::1".parse().unwrap();
        let peer: Ipv6Addr = "fd00:1:2::2".parse().unwrap();
        build_neighbour_solicitation(&mut buf, MAC_A, me, peer);
        assert_eq!(&buf[VNET_LEN..VNET_LEN + 6], &[0x33, 0x33, 0xFF, 0, 0, 2]);
        let f = &buf[VNET_LEN..];
        let Rx::Nd(nd) = parse(f, Vnet::default(), &local("fd00:1:2::2")) else {
            panic!(
                "not ND: {:?}",
                parse(f, Vnet::default(), &local("fd00:1:2::2"))
            );
        };
        assert_eq!(
            nd,
            Nd {
                solicitation: true,
                src_ip: me,
                target: peer,
                lladdr: Some(MAC_A)
            }
        );
        let mut bad = f.to_vec();
        bad[14 + 40 + 20] ^= 1;
        assert_eq!(
            parse(&bad, Vnet::default(), &local("fd00:1:2::2")),
            Rx::Drop(DropReason::BadNeighbourMessage)
        );
    }

    #[test]
    fn checksum_matches_a_16_bit_reference() {
        let data: Vec<u8> = (0..1001u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in 0..data.len() {
            let d = &data[..len];
            let mut reference: u64 = 0;
            for pair in d.chunks(2) {
                let hi = u64::from(pair[0]) << 8;
                reference += hi | pair.get(1).map_or(0, |&b| u64::from(b));
            }
            assert_eq!(fold(sum(d, 0)), fold(reference), "len {len}");
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            flags in any::<u8>(),
            gso_type in any::<u8>(),
            gso_size in any::<u16>(),
            ethertype in prop::sample::select(vec![0x0800u16, 0x86DD, 0x0806, 0x1234]),
        ) {
            let mut f = bytes;
            if f.len() >= 14 {
                f[12..14].copy_from_slice(&ethertype.to_be_bytes());
                f[..6].copy_from_slice(&MAC_B);
            }
            let vnet = Vnet { flags, gso_type, gso_size };
            for l in [local("10.0.0.2"), local("fd00::2")] {
                let _ = parse(&f, vnet, &l);
            }
        }

        #[test]
        fn truncating_a_good_frame_never_panics(cut in 0usize..200, v6 in any::<bool>()) {
            let (from, to, me) = if v6 {
                ("fd00::1", "[fd00::2]:4791", "fd00::2")
            } else {
                ("10.0.0.1", "10.0.0.2:4791", "10.0.0.2")
            };
            let f = frame(from, to, &[1u8; 120]);
            let cut = cut.min(f.len());
            let r = parse(&f[..cut], Vnet::default(), &local(me));
            if cut < f.len() {
                prop_assert!(matches!(r, Rx::Drop(_)));
            }
        }
    }
}
