//! Whole RoCEv2 frames: Ethernet (optional 802.1Q tag) / IPv4 or IPv6 / UDP 4791 / transport
//! packet / ICRC, parsed and built with `etherparse` for layers 2-4.
//!
//! ```text
//! | Ethernet 14 | [802.1Q 4] | IPv4 20 / IPv6 40 | UDP 8 | BTH .. payload .. pad | ICRC 4 | [Eth pad]
//! ```
//!
//! The ICRC is located from the IP and UDP lengths, never from the frame length: Ethernet
//! padding follows short frames, and captures may carry a trailer. The UDP length must equal
//! the IP payload length (anything else would leave bytes the ICRC cannot account for).
//! IPv4 options, IPv6 extension headers, stacked VLAN tags and IP fragments are refused:
//! RoCEv2 senders never produce them, and their ICRC semantics are undefined.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, IpNumber, Ipv6FlowLabel, Ipv6Header, LinkExtSlice, NetSlice,
    SingleVlanHeader, SlicedPacket, TransportSlice, UdpHeader, VlanId, VlanPcp,
};

use crate::icrc::{self, ICRC_LEN};
use crate::{Caps, PacketRepr, ParseError, Result};

/// The RoCEv2 UDP destination port.
pub const ROCEV2_PORT: u16 = 4_791;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

/// An 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// The Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// Optional 802.1Q tag.
    pub vlan: Option<VlanTag>,
}

/// The IPv4 header fields a RoCEv2 sender chooses (no options; protocol UDP; lengths and
/// checksum are derived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// TOS byte: DSCP (6 bits) and ECN (2 bits).
    pub tos: u8,
    /// Identification (covered by the ICRC).
    pub ident: u16,
    /// DF flag (rxe sets it).
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
}

impl Ipv4Repr {
    /// Writes the 20-byte header (no options, protocol UDP, fragment offset 0) for a packet of
    /// `total_len` bytes, with its checksum. Written by hand rather than through etherparse: it
    /// runs for every packet sent and received (the receive side synthesises the header the
    /// ICRC covers), and the hand-written form is a few stores; `tests::ipv4_emit_matches_
    /// etherparse` holds it to etherparse's bytes.
    pub fn emit(&self, total_len: u16, h: &mut [u8; IPV4_LEN]) {
        let flags: u16 = if self.dont_fragment { 0x4000 } else { 0x0000 };
        let (src, dst) = (u32::from(self.src), u32::from(self.dst));
        // RFC 1071: the one's complement of the one's complement sum of the 16-bit words,
        // summed from the field values (not read back from `h`, which would stall on the
        // stores just made).
        let words = [
            0x4500 | u16::from(self.tos),
            total_len,
            self.ident,
            flags,
            u16::from(self.ttl) << 8 | 17,
            (src >> 16) as u16,
            src as u16,
            (dst >> 16) as u16,
            dst as u16,
        ];
        let mut sum: u32 = words.iter().map(|&w| u32::from(w)).sum();
        sum = (sum & 0xFFFF) + (sum >> 16);
        sum = (sum & 0xFFFF) + (sum >> 16);
        let checksum = !(sum as u16);
        let mut out = [0u8; IPV4_LEN];
        out[0..2].copy_from_slice(&words[0].to_be_bytes());
        out[2..4].copy_from_slice(&total_len.to_be_bytes());
        out[4..6].copy_from_slice(&self.ident.to_be_bytes());
        out[6..8].copy_from_slice(&flags.to_be_bytes());
        out[8..10].copy_from_slice(&words[4].to_be_bytes());
        out[10..12].copy_from_slice(&checksum.to_be_bytes());
        out[12..16].copy_from_slice(&src.to_be_bytes());
        out[16..20].copy_from_slice(&dst.to_be_bytes());
        *h = out;
    }
}

/// The IPv6 header fields a RoCEv2 sender chooses (no extension headers; next header UDP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class: DSCP and ECN.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

/// IPv4 or IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Header length.
    pub const fn header_len(&self) -> usize {
        match self {
            Self::V4(_) => IPV4_LEN,
            Self::V6(_) => IPV6_LEN,
        }
    }
    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            Self::V4(v) => IpAddr::V4(v.src),
            Self::V6(v) => IpAddr::V6(v.src),
        }
    }
    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            Self::V4(v) => IpAddr::V4(v.dst),
            Self::V6(v) => IpAddr::V6(v.dst),
        }
    }
    /// The two ECN bits.
    pub const fn ecn(&self) -> u8 {
        match self {
            Self::V4(v) => v.tos & 3,
            Self::V6(v) => v.traffic_class & 3,
        }
    }
}

/// The UDP header fields (length is derived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy; constant per QP).
    pub src_port: u16,
    /// Destination port (4791).
    pub dst_port: u16,
    /// Checksum as sent (rxe sends 0; it is masked from the ICRC).
    pub checksum: u16,
}

/// Layers 2-4 of a RoCEv2 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// Ethernet header; `None` for a raw IP packet (link types without Ethernet).
    pub eth: Option<EthRepr>,
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
}

/// A parsed frame: its layer 2-4 headers and borrowed slices of the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The headers.
    pub repr: FrameRepr,
    /// The IP packet: IP header through ICRC (without any Ethernet trailer).
    pub ip_packet: &'a [u8],
    /// The UDP payload: BTH through ICRC.
    pub udp_payload: &'a [u8],
}

fn map_slice_err(e: &etherparse::err::packet::SliceError) -> ParseError {
    use etherparse::err::packet::SliceError;
    match e {
        SliceError::Len(_) => ParseError::Truncated,
        _ => ParseError::BadFrame,
    }
}

impl<'a> Frame<'a> {
    /// Parses an Ethernet frame; checks the ICRC when `caps` asks for it on receive.
    ///
    /// # Errors
    /// `Truncated`, `BadFrame`, `Fragmented`, `NotRoce`, `BadLength`, `BadIcrc`.
    pub fn parse_ethernet(data: &'a [u8], caps: &Caps) -> Result<Self> {
        let sliced = SlicedPacket::from_ethernet(data).map_err(|e| map_slice_err(&e))?;
        let Some(etherparse::LinkSlice::Ethernet2(eth)) = &sliced.link else {
            return Err(ParseError::BadFrame);
        };
        let mut vlan = None;
        let mut l2_len = ETH_LEN;
        match sliced.link_exts.as_slice() {
            [] => {}
            [LinkExtSlice::Vlan(tag)] => {
                let h = tag.to_header();
                vlan = Some(VlanTag {
                    pcp: h.pcp.value(),
                    dei: h.drop_eligible_indicator,
                    vid: h.vlan_id.value(),
                });
                l2_len += VLAN_LEN;
            }
            _ => return Err(ParseError::BadFrame),
        }
        let eth = EthRepr {
            dst: eth.destination(),
            src: eth.source(),
            vlan,
        };
        Self::from_sliced(&sliced, &data[l2_len..], Some(eth), caps)
    }

    /// Parses a raw IP packet (IPv4 or IPv6, no link header).
    ///
    /// # Errors
    /// As [`Self::parse_ethernet`].
    pub fn parse_ip(data: &'a [u8], caps: &Caps) -> Result<Self> {
        let sliced = SlicedPacket::from_ip(data).map_err(|e| map_slice_err(&e))?;
        Self::from_sliced(&sliced, data, None, caps)
    }

    fn from_sliced(
        sliced: &SlicedPacket<'a>,
        l3: &'a [u8],
        eth: Option<EthRepr>,
        caps: &Caps,
    ) -> Result<Self> {
        let mut options = false;
        let (ip, ip_total) = match &sliced.net {
            Some(NetSlice::Ipv4(v4)) => {
                let h = v4.header();
                if h.protocol() != IpNumber::UDP {
                    return Err(ParseError::NotRoce);
                }
                if v4.is_payload_fragmented() {
                    return Err(ParseError::Fragmented);
                }
                if h.ihl() != 5 {
                    // Options: refused, but only for RoCE traffic (checked below).
                    options = true;
                }
                let repr = Ipv4Repr {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    tos: (h.dcp().value() << 2) | h.ecn().value(),
                    ident: h.identification(),
                    dont_fragment: h.dont_fragment(),
                    ttl: h.ttl(),
                };
                (IpRepr::V4(repr), usize::from(h.total_len()))
            }
            Some(NetSlice::Ipv6(v6)) => {
                let h = v6.header();
                if h.next_header() != IpNumber::UDP {
                    // Extension headers (or not UDP at all).
                    return Err(if v6.payload().ip_number == IpNumber::UDP {
                        ParseError::BadFrame
                    } else {
                        ParseError::NotRoce
                    });
                }
                let repr = Ipv6Repr {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    traffic_class: h.traffic_class(),
                    flow_label: h.flow_label().value(),
                    hop_limit: h.hop_limit(),
                };
                (IpRepr::V6(repr), IPV6_LEN + usize::from(h.payload_length()))
            }
            _ => return Err(ParseError::NotRoce),
        };
        let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
            return Err(ParseError::NotRoce);
        };
        if udp.destination_port() != ROCEV2_PORT {
            return Err(ParseError::NotRoce);
        }
        if options {
            return Err(ParseError::BadFrame);
        }
        let ip_len = ip.header_len();
        // The IP length must hold the IP and UDP headers (an IPv6 payload length of 0 with a
        // UDP length of 0 once slipped through and sliced past the end: found by fuzzing).
        if ip_total < ip_len + UDP_LEN
            || usize::from(udp.length()) != ip_total - ip_len
            || l3.len() < ip_total
        {
            return Err(ParseError::BadFrame);
        }
        let ip_packet = &l3[..ip_total];
        let udp_payload = &ip_packet[ip_len + UDP_LEN..];
        if udp_payload.len() < crate::packet::MIN_LEN {
            return Err(ParseError::Truncated);
        }
        if udp_payload.len() % 4 != 0 {
            return Err(ParseError::BadLength);
        }
        if caps.icrc.rx() && !icrc::verify(ip_packet) {
            return Err(ParseError::BadIcrc);
        }
        let udp = UdpRepr {
            src_port: udp.source_port(),
            dst_port: udp.destination_port(),
            checksum: udp.checksum(),
        };
        Ok(Self {
            repr: FrameRepr { eth, ip, udp },
            ip_packet,
            udp_payload,
        })
    }

    /// Parses the transport packet.
    ///
    /// # Errors
    /// As [`PacketRepr::parse`].
    pub fn packet(&self) -> Result<PacketRepr<'a>> {
        PacketRepr::parse(self.udp_payload)
    }

    /// The four ICRC bytes as carried.
    pub fn icrc(&self) -> [u8; ICRC_LEN] {
        let n = self.ip_packet.len();
        let mut out = [0; ICRC_LEN];
        out.copy_from_slice(&self.ip_packet[n - ICRC_LEN..]);
        out
    }
}

impl FrameRepr {
    /// Length of the layer 2-4 headers.
    pub const fn header_len(&self) -> usize {
        let l2 = match &self.eth {
            Some(EthRepr { vlan: Some(_), .. }) => ETH_LEN + VLAN_LEN,
            Some(_) => ETH_LEN,
            None => 0,
        };
        l2 + self.ip.header_len() + UDP_LEN
    }

    /// The exact length of a frame carrying `packet`.
    pub const fn buffer_len(&self, packet: &PacketRepr<'_>) -> usize {
        self.header_len() + packet.buffer_len()
    }

    /// Writes the layer 2-4 headers for a UDP payload (BTH .. ICRC) of `udp_payload_len`
    /// bytes; `buf` must be exactly [`Self::header_len`] long. The IPv4 checksum is computed.
    ///
    /// Lengths that do not fit their 16-bit fields are written truncated; the caller keeps
    /// payloads within the path MTU.
    pub fn emit_headers(&self, udp_payload_len: usize, buf: &mut [u8]) {
        let mut at = 0;
        let ether_type = match self.ip {
            IpRepr::V4(_) => EtherType::IPV4,
            IpRepr::V6(_) => EtherType::IPV6,
        };
        if let Some(eth) = &self.eth {
            let outer = if eth.vlan.is_some() {
                EtherType::VLAN_TAGGED_FRAME
            } else {
                ether_type
            };
            let h = Ethernet2Header {
                source: eth.src,
                destination: eth.dst,
                ether_type: outer,
            };
            buf[..ETH_LEN].copy_from_slice(&h.to_bytes());
            at = ETH_LEN;
            if let Some(tag) = eth.vlan {
                let v = SingleVlanHeader {
                    pcp: VlanPcp::try_new(tag.pcp & 7).unwrap_or(VlanPcp::ZERO),
                    drop_eligible_indicator: tag.dei,
                    vlan_id: VlanId::try_new(tag.vid & 0x0FFF).unwrap_or(VlanId::ZERO),
                    ether_type,
                };
                buf[at..at + VLAN_LEN].copy_from_slice(&v.to_bytes());
                at += VLAN_LEN;
            }
        }
        let udp_len = (UDP_LEN + udp_payload_len) as u16;
        match &self.ip {
            IpRepr::V4(v4) => {
                let total_len = (IPV4_LEN as u16).wrapping_add(udp_len);
                if let Some(h) = buf[at..].first_chunk_mut::<IPV4_LEN>() {
                    v4.emit(total_len, h);
                }
                at += IPV4_LEN;
            }
            IpRepr::V6(v6) => {
                let h = Ipv6Header {
                    traffic_class: v6.traffic_class,
                    flow_label: Ipv6FlowLabel::try_new(v6.flow_label & 0xF_FFFF)
                        .unwrap_or(Ipv6FlowLabel::ZERO),
                    payload_length: udp_len,
                    next_header: IpNumber::UDP,
                    hop_limit: v6.hop_limit,
                    source: v6.src.octets(),
                    destination: v6.dst.octets(),
                };
                buf[at..at + IPV6_LEN].copy_from_slice(&h.to_bytes());
                at += IPV6_LEN;
            }
        }
        let u = UdpHeader {
            source_port: self.udp.src_port,
            destination_port: self.udp.dst_port,
            length: udp_len,
            checksum: self.udp.checksum,
        };
        buf[at..at + UDP_LEN].copy_from_slice(&u.to_bytes());
    }

    /// Writes the whole frame carrying `packet`, with its ICRC when `caps` asks for it on
    /// transmit (zero otherwise); `buf` must be exactly [`Self::buffer_len`] long.
    pub fn emit(&self, packet: &PacketRepr<'_>, buf: &mut [u8], caps: &Caps) {
        let header_len = self.header_len();
        let (headers, udp_payload) = buf.split_at_mut(header_len);
        self.emit_headers(udp_payload.len(), headers);
        packet.emit(udp_payload);
        if caps.icrc.tx() {
            let l2 = header_len - self.ip.header_len() - UDP_LEN;
            if let Some(crc) = icrc::compute(&buf[l2..]) {
                let n = buf.len();
                buf[n - ICRC_LEN..].copy_from_slice(&crc);
            }
        }
    }
}

impl fmt::Display for FrameRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{} > {}.{}",
            self.ip.src(),
            self.udp.src_port,
            self.ip.dst(),
            self.udp.dst_port
        )?;
        if let Some(EthRepr {
            vlan: Some(tag), ..
        }) = &self.eth
        {
            write!(f, " vlan {}", tag.vid)?;
        }
        if self.ip.ecn() != 0 {
            write!(f, " ecn {}", self.ip.ecn())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use etherparse::{IpDscp, IpEcn, IpFragOffset, Ipv4Header};
    use proptest::prelude::*;

    use super::*;
    use crate::packet::Ext;
    use crate::{bth, Check, Opcode, Psn, Qpn};

    proptest! {
        /// The hand-written IPv4 header is byte for byte etherparse's.
        #[test]
        fn ipv4_emit_matches_etherparse(
            src: [u8; 4],
            dst: [u8; 4],
            tos: u8,
            ident: u16,
            dont_fragment: bool,
            ttl: u8,
            total_len in 20u16..,
        ) {
            let repr = Ipv4Repr {
                src: Ipv4Addr::from(src),
                dst: Ipv4Addr::from(dst),
                tos,
                ident,
                dont_fragment,
                ttl,
            };
            let mut ours = [0xA5u8; IPV4_LEN];
            repr.emit(total_len, &mut ours);
            let mut theirs = Ipv4Header {
                dscp: IpDscp::try_new(tos >> 2).unwrap(),
                ecn: IpEcn::try_new(tos & 3).unwrap(),
                total_len,
                identification: ident,
                dont_fragment,
                more_fragments: false,
                fragment_offset: IpFragOffset::ZERO,
                time_to_live: ttl,
                protocol: IpNumber::UDP,
                header_checksum: 0,
                source: src,
                destination: dst,
                options: Default::default(),
            };
            theirs.header_checksum = theirs.calc_header_checksum();
            prop_assert_eq!(&ours[..], &theirs.to_bytes()[..]);
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Spec digest 5.5, IPv4.
    const V4: &str = "02000000000202000000000108004502003000014000401126b80a0000010a000002\
c00012b7001c00000410ffff000000128000000068692100198f0b86";

    fn v4_repr() -> FrameRepr {
        FrameRepr {
            eth: Some(EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan: None,
            }),
            ip: IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                tos: 2,
                ident: 1,
                dont_fragment: true,
                ttl: 64,
            }),
            udp: UdpRepr {
                src_port: 0xC000,
                dst_port: ROCEV2_PORT,
                checksum: 0,
            },
        }
    }

    fn send_hi() -> PacketRepr<'static> {
        PacketRepr::new(
            bth::Repr {
                ack_req: true,
                ..bth::Repr::new(Opcode::RcSendOnly, Qpn::new(0x12), Psn::new(0))
            },
            Ext::default(),
            b"hi!",
        )
    }

    #[test]
    fn parse_worked_example() {
        let bytes = hex(V4);
        let frame = Frame::parse_ethernet(&bytes, &Caps::default()).unwrap();
        assert_eq!(frame.repr, v4_repr());
        assert_eq!(frame.packet().unwrap(), send_hi());
        assert_eq!(frame.icrc(), [0x19, 0x8f, 0x0b, 0x86]);
    }

    #[test]
    fn emit_worked_example() {
        let repr = v4_repr();
        let pkt = send_hi();
        let mut buf = vec![0xa5; repr.buffer_len(&pkt)];
        repr.emit(&pkt, &mut buf, &Caps::default());
        assert_eq!(buf, hex(V4));
    }

    #[test]
    fn ethernet_padding_is_ignored() {
        let mut bytes = hex(V4);
        bytes.extend_from_slice(&[0; 12]);
        let frame = Frame::parse_ethernet(&bytes, &Caps::default()).unwrap();
        assert_eq!(frame.icrc(), [0x19, 0x8f, 0x0b, 0x86]);
        assert_eq!(frame.packet().unwrap().payload, b"hi!");
    }

    #[test]
    fn bad_icrc_and_caps() {
        let mut bytes = hex(V4);
        let n = bytes.len();
        bytes[n - 1] ^= 0xFF;
        assert_eq!(
            Frame::parse_ethernet(&bytes, &Caps::default()),
            Err(ParseError::BadIcrc)
        );
        let lax = Caps { icrc: Check::Tx };
        assert!(Frame::parse_ethernet(&bytes, &lax).is_ok());
    }

    #[test]
    fn ipv6_and_vlan_roundtrip() {
        let mut repr = v4_repr();
        repr.ip = IpRepr::V6(Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 2,
            flow_label: 0x12345,
            hop_limit: 64,
        });
        for vlan in [
            None,
            Some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100,
            }),
        ] {
            repr.eth.as_mut().unwrap().vlan = vlan;
            let pkt = send_hi();
            let mut buf = vec![0; repr.buffer_len(&pkt)];
            repr.emit(&pkt, &mut buf, &Caps::default());
            let frame = Frame::parse_ethernet(&buf, &Caps::default()).unwrap();
            assert_eq!(frame.repr, repr);
            assert_eq!(frame.packet().unwrap(), pkt);
        }
    }

    #[test]
    fn rejects_non_roce() {
        let mut bytes = hex(V4);
        bytes[36] = 0x13; // UDP destination port 4791 -> 5047
        assert_eq!(
            Frame::parse_ethernet(&bytes, &Caps::default()),
            Err(ParseError::NotRoce)
        );
        assert!(Frame::parse_ethernet(&bytes[..30], &Caps::default()).is_err());
        assert!(Frame::parse_ethernet(&[], &Caps::default()).is_err());
        // Fragment: set MF.
        let mut frag = hex(V4);
        frag[20] |= 0x20;
        assert_eq!(
            Frame::parse_ethernet(&frag, &Caps::default()),
            Err(ParseError::Fragmented)
        );
    }

    #[test]
    fn raw_ip() {
        let bytes = hex(V4);
        let frame = Frame::parse_ip(&bytes[14..], &Caps::default()).unwrap();
        assert_eq!(frame.repr.eth, None);
        assert_eq!(frame.packet().unwrap(), send_hi());
    }
}
