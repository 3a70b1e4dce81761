//! Where our responder used to answer differently from Linux rdma_rxe (issue 12, item 6), each
//! pinned by the NAK on the wire (the simulator's trace) and the completions on both sides.

use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{QpState, QpType, RecvWr, SendOp, SendWr, WcStatus};
use roce_qp::RecvMeta;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{bth, Ext, Opcode, PacketRepr, ParseError, Psn, RKey};

/// The NAKs B sent to A.
fn naks(pair: &Pair) -> Vec<(Psn, Syndrome)> {
    pair.sent(1)
        .into_iter()
        .filter_map(|t| match t.syndrome {
            Some(s) if !s.is_ack() => Some((t.psn, s)),
            _ => None,
        })
        .collect()
}

/// A fetch-and-add at `offset` into a fresh 16-byte region of B, with `rkey` (the region's
/// own if `None`); returns the pair after the exchange.
fn fetch_add(seed: u64, offset: u64, rkey: Option<RKey>) -> Pair {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, seed));
    let result = pair.a.register(&[0u8; 8]);
    let target = pair.b.register(&[0u8; 16]);
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: target.addr + offset,
            rkey: rkey.unwrap_or(target.rkey()),
            add: 1,
        },
        vec![result.sge(0, 8)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert!(
        pair.b.read(&target).iter().all(|&b| b == 0),
        "nothing executed"
    );
    pair
}

//= rxe_resp.c check_rkey before atomic_reply
//= type=test
#[test]
fn misaligned_atomic_with_a_bad_rkey_is_a_remote_access_error_like_rxe() {
    // rxe checks the rkey (`check_rkey`) before the alignment (`atomic_reply`): a misaligned
    // atomic with an unknown rkey is NAKed 0x62, not 0x61.
    let mut pair = fetch_add(11, 4, Some(RKey::new(0x00DE_AD00)));
    assert_eq!(
        naks(&pair),
        vec![(
            pair.a.qp.attr().sq_psn,
            Syndrome::Nak(NakCode::RemoteAccessError)
        )]
    );
    let done = pair.a.send_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, WcStatus::RemAccessErr);
    assert_eq!(pair.b.qp.state(), QpState::Err);
}

#[test]
fn misaligned_atomic_with_a_good_rkey_is_an_invalid_request() {
    let mut pair = fetch_add(12, 4, None);
    assert_eq!(
        naks(&pair),
        vec![(
            pair.a.qp.attr().sq_psn,
            Syndrome::Nak(NakCode::InvalidRequest)
        )]
    );
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn aligned_atomic_with_a_bad_rkey_is_a_remote_access_error() {
    let mut pair = fetch_add(13, 8, Some(RKey::new(0x00DE_AD00)));
    assert_eq!(
        naks(&pair),
        vec![(
            pair.a.qp.attr().sq_psn,
            Syndrome::Nak(NakCode::RemoteAccessError)
        )]
    );
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::RemAccessErr);
}

/// A's SEND ONLY at `psn` to B with no payload and PadCnt 3: the bytes a peer would send,
/// which the transport cannot parse; returns their BTH.
fn send_only_with_too_much_pad(pair: &Pair, opcode: Opcode, psn: Psn) -> bth::Repr {
    let b = bth::Repr::new(opcode, pair.b.qp.qpn(), psn);
    let repr = PacketRepr::new(b, Ext::default(), &[]);
    let mut bytes = vec![0u8; repr.buffer_len()];
    repr.emit(&mut bytes);
    bytes[1] |= 0x30; // PadCnt 3, no byte to pad
    assert_eq!(PacketRepr::parse(&bytes), Err(ParseError::BadPadCount));
    bth::Repr::parse(&bth::Packet::new_checked(&bytes[..bth::HEADER_LEN]).unwrap()).unwrap()
}

/// A posts a 5-byte SEND whose packet is lost; B receives instead a copy of it whose PadCnt
/// is larger than its payload.
fn bad_pad_send(seed: u64, qp_type: QpType, b_receive: bool) -> Pair {
    let mut pair = Pair::new(PairConfig::new(qp_type, seed));
    let src = pair.a.register(b"hello");
    let dst = pair.b.register(&[0u8; 16]);
    if b_receive {
        let wr = RecvWr {
            wr_id: 9,
            sges: vec![dst.sge(0, 16)],
        };
        pair.b.qp.post_recv(wr).unwrap();
    }
    let opcode = if qp_type == QpType::Rc {
        Opcode::RcSendOnly
    } else {
        Opcode::UcSendOnly
    };
    pair.drop_matching(0, Box::new(move |p| p.bth.opcode == opcode));
    let wr = SendWr::new(1, SendOp::Send, vec![src.sge(0, 5)]);
    pair.a.qp.post_send(pair.now, wr).unwrap();
    pair.step();
    let bth = send_only_with_too_much_pad(&pair, opcode, pair.a.qp.attr().sq_psn);
    let meta = RecvMeta::new(pair.a.gid, pair.b.gid);
    pair.b.qp.handle_bad_pad(pair.now, &bth, &meta);
    pair
}

//= rxe_resp.c rxe_resp_check_length (C9-92)
//= type=test
#[test]
fn a_send_whose_pad_exceeds_its_payload_is_naked_invalid_request_like_rxe() {
    let mut pair = bad_pad_send(21, QpType::Rc, true);
    pair.clear_filter(0);
    assert!(pair.drive_bounded(100_000));
    let psn = pair.a.qp.attr().sq_psn;
    assert_eq!(
        naks(&pair),
        vec![(psn, Syndrome::Nak(NakCode::InvalidRequest))]
    );
    let done = pair.a.send_completions();
    assert_eq!(done[0].status, WcStatus::RemInvReqErr);
    assert_eq!(
        (pair.a.qp.state(), pair.b.qp.state()),
        (QpState::Err, QpState::Err)
    );
    // B's receive was not filled: it is flushed with the QP.
    let recvs = pair.b.recv_completions();
    assert_eq!(recvs.len(), 1);
    assert_eq!(recvs[0].status, WcStatus::WrFlushErr);
    assert_eq!(pair.b.qp.stats().naks_sent_by_code[0], 1);
}

#[test]
fn a_send_whose_pad_exceeds_its_payload_without_a_receive_gets_an_rnr_nak_first() {
    // rxe looks for the receive WR (check_resource) before the length (check_length).
    let mut pair = bad_pad_send(22, QpType::Rc, false);
    for _ in 0..4 {
        pair.step();
    }
    let sent = pair.sent(1);
    assert!(
        matches!(
            sent.first().and_then(|t| t.syndrome),
            Some(Syndrome::RnrNak { .. })
        ),
        "{sent:?}"
    );
    assert_eq!(pair.b.qp.state(), QpState::Rts);
    assert_eq!(pair.b.qp.stats().rnr_naks_sent, 1);
}

#[test]
fn uc_drops_a_message_whose_pad_exceeds_its_payload() {
    let mut pair = bad_pad_send(23, QpType::Uc, true);
    assert!(pair.drive_bounded(100_000));
    assert!(pair.sent(1).is_empty(), "UC never answers");
    assert_eq!(pair.b.qp.stats().drop_length, 1);
    assert!(pair.b.recv_completions().is_empty());
    assert_eq!(pair.b.qp.state(), QpState::Rts);
}
