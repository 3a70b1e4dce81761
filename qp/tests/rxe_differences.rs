//! Where our responder used to answer differently from Linux rdma_rxe (issue 12, item 6), each
//! pinned by the NAK on the wire (the simulator's trace) and the completions on both sides.

use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{QpState, QpType, SendOp, SendWr, WcStatus};
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{Psn, RKey};

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
