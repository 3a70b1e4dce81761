//! Sample frames: one well-formed RoCEv2 frame for every opcode of the table, over IPv4, plus
//! IPv6 and 802.1Q variants (`alloc` feature). For tests, benchmarks, fuzz corpora and
//! `rocectl pcap sample`; every frame has a correct ICRC and follows the layout rules
//! (FIRST/MIDDLE packets carry exactly one 256-byte path MTU, ATOMIC WRITE exactly 8 bytes).

use alloc::vec;
use alloc::vec::Vec;
use core::net::Ipv4Addr;

use crate::aeth::Syndrome;
use crate::frame::{EthRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, VlanTag, ROCEV2_PORT};
use crate::opcode::{ExtHeaders, Position};
use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, feth, ieth, immdt, reth, Caps, Ext,
    FrameRepr, Msn, Opcode, PacketRepr, Psn, QKey, Qpn, RKey,
};

/// Path MTU used for FIRST/MIDDLE samples.
pub const SAMPLE_PMTU: usize = 256;

/// Layers 2-4 of the samples: 10.0.0.1 -> 10.0.0.2, DF, TTL 64, UDP 0xC000 -> 4791.
pub fn ipv4_frame() -> FrameRepr {
    FrameRepr {
        eth: Some(EthRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
        }),
        ip: IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            tos: 0x02,
            ident: 0,
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

/// The same over IPv6 (fd00::1 -> fd00::2).
pub fn ipv6_frame() -> FrameRepr {
    let mut f = ipv4_frame();
    f.ip = IpRepr::V6(Ipv6Repr {
        src: core::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
        dst: core::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        traffic_class: 0x02,
        flow_label: 0,
        hop_limit: 64,
    });
    f
}

/// Extension headers with plausible values for a header set.
pub fn ext_for(set: ExtHeaders) -> Ext {
    Ext {
        deth: set.contains(ExtHeaders::DETH).then_some(deth::Repr {
            qkey: QKey::new(0x1111_1111),
            src_qp: Qpn::new(0x13),
        }),
        feth: set.contains(ExtHeaders::FETH).then_some(feth::Repr {
            placement: 1,
            selectivity: 0,
        }),
        reth: set.contains(ExtHeaders::RETH).then_some(reth::Repr {
            va: 0x5638_3b2a_0000,
            rkey: RKey::new(0x0b90),
            dma_len: 1000,
        }),
        atomic_eth: set
            .contains(ExtHeaders::ATOMIC_ETH)
            .then_some(atomic_eth::Repr {
                va: 0x5648_0ec1_f000,
                rkey: RKey::new(0x0b31),
                swap_add: 1,
                compare: 0,
            }),
        aeth: set.contains(ExtHeaders::AETH).then_some(aeth::Repr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: Msn::new(1),
        }),
        atomic_ack_eth: set
            .contains(ExtHeaders::ATOMIC_ACK_ETH)
            .then_some(atomic_ack_eth::Repr { orig: 0x2a }),
        immdt: set
            .contains(ExtHeaders::IMMDT)
            .then_some(immdt::Repr { data: 0x1234_5678 }),
        ieth: set.contains(ExtHeaders::IETH).then_some(ieth::Repr {
            rkey: RKey::new(0x0b90),
        }),
        cnp: set.contains(ExtHeaders::CNP).then_some(cnp::Repr),
    }
}

/// The payload a sample of `op` carries.
pub fn payload_for(op: Opcode, payload: &[u8]) -> &[u8] {
    match op.info() {
        Some(info) if !info.payload => &[],
        Some(info) if matches!(info.position, Position::First | Position::Middle) => {
            &payload[..SAMPLE_PMTU.min(payload.len())]
        }
        _ if op == Opcode::RcAtomicWrite => &payload[..8.min(payload.len())],
        _ => &payload[..payload.len().min(61)],
    }
}

/// The transport packet of the sample for `op`, borrowing `payload` (at least 256 bytes).
pub fn packet_for(op: Opcode, payload: &[u8]) -> PacketRepr<'_> {
    let info = op.info();
    let mut b = bth::Repr::new(op, Qpn::new(0x11), Psn::new(0x00AB_CDEF));
    b.ack_req = info.is_some_and(|i| i.is_end() && !i.is_response());
    if op == Opcode::Cnp {
        b.ack_req = false;
        b.becn = true;
        b.psn = Psn::new(0);
    }
    let ext = info.map(|i| ext_for(i.ext)).unwrap_or_default();
    PacketRepr::new(b, ext, payload_for(op, payload))
}

/// A payload of `len` bytes with a recognisable pattern.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// Emits `packet` inside `frame`, with its ICRC.
pub fn emit(frame: &FrameRepr, packet: &PacketRepr<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; frame.buffer_len(packet)];
    frame.emit(packet, &mut buf, &Caps::default());
    buf
}

/// One frame per opcode of the table over IPv4, then a SEND_ONLY over IPv6 and one with an
/// 802.1Q tag. Names are the opcode names (plus `_IPV6`/`_VLAN`).
pub fn all() -> Vec<(&'static str, Vec<u8>)> {
    let payload = pattern(SAMPLE_PMTU);
    let mut out: Vec<(&'static str, Vec<u8>)> = Opcode::ALL
        .iter()
        .map(|&op| (op.name(), emit(&ipv4_frame(), &packet_for(op, &payload))))
        .collect();
    let send = packet_for(Opcode::RcSendOnly, &payload);
    out.push(("RC_SEND_ONLY_IPV6", emit(&ipv6_frame(), &send)));
    let mut tagged = ipv4_frame();
    if let Some(eth) = tagged.eth.as_mut() {
        eth.vlan = Some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 100,
        });
    }
    out.push(("RC_SEND_ONLY_VLAN", emit(&tagged, &send)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Frame;

    #[test]
    fn every_sample_parses_back() {
        let samples = all();
        assert_eq!(samples.len(), Opcode::ALL.len() + 2);
        for (name, bytes) in samples {
            let frame = Frame::parse_ethernet(&bytes, &Caps::default()).unwrap();
            let packet = frame.packet().unwrap();
            packet.check().unwrap();
            assert!(name.starts_with(packet.opcode().name()), "{name}");
        }
    }
}
