//! Property tests of the wire contract: `emit` then `parse` is the identity for every opcode
//! and arbitrary field values, and no input makes a parser panic.

use proptest::prelude::*;
use roce_wire::aeth::Syndrome;
use roce_wire::frame::{EthRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, VlanTag, ROCEV2_PORT};
use roce_wire::opcode::ExtHeaders;
use roce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, Caps, Check, Ext, Frame,
    FrameRepr, Msn, Opcode, PKey, PacketRepr, Psn, QKey, Qpn, RKey,
};

fn any_opcode() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        4 => prop::sample::select(Opcode::ALL.to_vec()),
        1 => any::<u8>().prop_map(Opcode::from_u8),
    ]
}

fn any_bth(op: Opcode) -> impl Strategy<Value = bth::Repr> {
    (any::<[bool; 5]>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
        move |(f, pkey, qpn, psn)| bth::Repr {
            opcode: op,
            solicited: f[0],
            mig_req: f[1],
            pad_cnt: 0,
            pkey: PKey::new(pkey),
            fecn: f[2],
            becn: f[3],
            dest_qp: Qpn::new(qpn),
            ack_req: f[4],
            psn: Psn::new(psn),
        },
    )
}

fn any_ext(set: ExtHeaders) -> impl Strategy<Value = Ext> {
    (any::<[u64; 4]>(), any::<[u32; 6]>(), any::<[u8; 3]>()).prop_map(move |(w, d, b)| Ext {
        deth: set.contains(ExtHeaders::DETH).then_some(deth::Repr {
            qkey: QKey::new(d[0]),
            src_qp: Qpn::new(d[1]),
        }),
        feth: set.contains(ExtHeaders::FETH).then_some(feth::Repr {
            placement: b[0] & 0xF,
            selectivity: b[1] & 3,
        }),
        reth: set.contains(ExtHeaders::RETH).then_some(reth::Repr {
            va: w[0],
            rkey: RKey::new(d[2]),
            dma_len: d[3],
        }),
        atomic_eth: set
            .contains(ExtHeaders::ATOMIC_ETH)
            .then_some(atomic_eth::Repr {
                va: w[1],
                rkey: RKey::new(d[4]),
                swap_add: w[2],
                compare: w[3],
            }),
        aeth: set.contains(ExtHeaders::AETH).then_some(aeth::Repr {
            syndrome: Syndrome::from_u8(b[2]),
            msn: Msn::new(d[5]),
        }),
        atomic_ack_eth: set
            .contains(ExtHeaders::ATOMIC_ACK_ETH)
            .then_some(atomic_ack_eth::Repr { orig: w[3] }),
        immdt: set
            .contains(ExtHeaders::IMMDT)
            .then_some(immdt::Repr { data: d[0] ^ d[5] }),
        ieth: set.contains(ExtHeaders::IETH).then_some(ieth::Repr {
            rkey: RKey::new(d[1] ^ 7),
        }),
        cnp: set
            .contains(ExtHeaders::CNP)
            .then_some(roce_wire::cnp::Repr),
    })
}

fn any_packet() -> impl Strategy<Value = (bth::Repr, Ext, Vec<u8>)> {
    any_opcode().prop_flat_map(|op| {
        let info = op.info();
        let set = info.map(|i| i.ext).unwrap_or_default();
        let max_payload = if info.is_none_or(|i| i.payload) {
            300
        } else {
            0
        };
        (
            any_bth(op),
            any_ext(set),
            prop::collection::vec(any::<u8>(), 0..=max_payload),
        )
    })
}

fn any_frame() -> impl Strategy<Value = FrameRepr> {
    (
        any::<bool>(),
        any::<Option<(u8, bool, u16)>>(),
        any::<([u8; 6], [u8; 6])>(),
        any::<(u32, u32, u8, u16, bool, u8)>(),
        any::<([u8; 16], [u8; 16], u32)>(),
        any::<(u16, u16)>(),
    )
        .prop_map(
            |(v6, vlan, (dst, src), (s4, d4, tos, ident, df, ttl), (s6, d6, fl), (sp, cs))| {
                FrameRepr {
                    eth: Some(EthRepr {
                        dst,
                        src,
                        vlan: vlan.map(|(pcp, dei, vid)| VlanTag {
                            pcp: pcp & 7,
                            dei,
                            vid: vid & 0xFFF,
                        }),
                    }),
                    ip: if v6 {
                        IpRepr::V6(Ipv6Repr {
                            src: s6.into(),
                            dst: d6.into(),
                            traffic_class: tos,
                            flow_label: fl & 0xF_FFFF,
                            hop_limit: ttl,
                        })
                    } else {
                        IpRepr::V4(Ipv4Repr {
                            src: s4.into(),
                            dst: d4.into(),
                            tos,
                            ident,
                            dont_fragment: df,
                            ttl,
                        })
                    },
                    udp: UdpRepr {
                        src_port: sp,
                        dst_port: ROCEV2_PORT,
                        checksum: cs,
                    },
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Repr -> emit -> parse == Repr, for every opcode (and unknown ones).
    #[test]
    fn packet_emit_then_parse_is_identity((b, ext, payload) in any_packet()) {
        let repr = PacketRepr::new(b, ext, &payload);
        prop_assert!(repr.check().is_ok());
        let mut buf = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut buf);
        prop_assert_eq!(PacketRepr::parse(&buf), Ok(repr));
        // emit_header writes exactly the header part of emit.
        let mut hdr = vec![0u8; repr.header_len()];
        repr.emit_header(&mut hdr);
        prop_assert_eq!(&hdr[..], &buf[..repr.header_len()]);
    }

    /// Whole frames: emit (with ICRC) -> parse (verifying it) == the same headers and packet.
    #[test]
    fn frame_emit_then_parse_is_identity(frame in any_frame(), (b, ext, payload) in any_packet()) {
        let packet = PacketRepr::new(b, ext, &payload);
        let mut buf = vec![0u8; frame.buffer_len(&packet)];
        frame.emit(&packet, &mut buf, &Caps::default());
        let parsed = Frame::parse_ethernet(&buf, &Caps::default()).unwrap();
        prop_assert_eq!(parsed.repr, frame);
        prop_assert_eq!(parsed.packet(), Ok(packet));
    }

    /// Arbitrary bytes never panic any parser, and a successful parse re-emits to the input.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(p) = PacketRepr::parse(&bytes) {
            let _ = p.to_string();
            let mut buf = vec![0u8; p.buffer_len()];
            p.emit(&mut buf);
            // Everything but reserved bits, pad content and the ICRC field is reproduced.
            prop_assert_eq!(buf.len(), bytes.len());
            prop_assert_eq!(PacketRepr::parse(&buf), Ok(p));
        }
        let none = Caps { icrc: Check::None };
        let _ = Frame::parse_ethernet(&bytes, &none).map(|f| f.packet().map(|p| p.to_string()));
        let _ = Frame::parse_ip(&bytes, &none).map(|f| f.packet().map(|p| p.to_string()));
        let _ = Frame::parse_ethernet(&bytes, &Caps::default());
        let _ = roce_wire::icrc::verify(&bytes);
    }

    /// Mutations of a valid frame never panic and are caught by the ICRC unless masked.
    #[test]
    fn mutated_frames_never_panic(
        (b, ext, payload) in any_packet(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..,
        cut in any::<prop::sample::Index>(),
    ) {
        let frame = roce_wire::samples::ipv4_frame();
        let packet = PacketRepr::new(b, ext, &payload);
        let mut buf = vec![0u8; frame.buffer_len(&packet)];
        frame.emit(&packet, &mut buf, &Caps::default());
        let i = at.index(buf.len());
        buf[i] ^= xor;
        let masked = [14 + 1, 14 + 8, 14 + 10, 14 + 11, 14 + 26, 14 + 27, 14 + 32];
        let result = Frame::parse_ethernet(&buf, &Caps::default());
        if i >= 14 && !masked.contains(&i) {
            prop_assert!(result.is_err(), "flip at {} undetected", i);
        }
        let n = cut.index(buf.len());
        let _ = Frame::parse_ethernet(&buf[..n], &Caps { icrc: Check::None });
    }
}
