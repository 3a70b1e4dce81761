//! Each error path of the RC transport: the work-completion status on both sides, the QP
//! state afterwards, and the packet that was sent (from the simulator's trace).

use roce_mr::Access;
use roce_qp::state::{AttrMask, QpAttr};
use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{QpState, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use roce_qp::PostError;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{LKey, Opcode, Psn};

fn naks(pair: &Pair, dir: usize) -> Vec<(Psn, Syndrome)> {
    pair.sent(dir)
        .into_iter()
        .filter_map(|t| match t.syndrome {
            Some(s) if !s.is_ack() => Some((t.psn, s)),
            _ => None,
        })
        .collect()
}

fn statuses(c: &[roce_qp::verbs::Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn rnr_nak_then_retry_succeeds_when_a_receive_is_posted() {
    let mut cfg = PairConfig::new(QpType::Rc, 1);
    cfg.min_rnr_timer = 14; // 1.28 ms
    let mut pair = Pair::new(cfg);
    let src = pair.a.register(b"hello");
    let dst = pair.b.register(&[0u8; 8]);
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(1, SendOp::Send, vec![src.sge(0, 5)]))
        .unwrap();
    // Run until the first RNR NAK went out, then post the receive.
    for _ in 0..100 {
        pair.step();
        if pair.b.qp.stats().rnr_naks_sent > 0 {
            break;
        }
        if let Some(t) = pair.next_event() {
            pair.now = pair.now.max(t);
        }
    }
    assert_eq!(pair.b.qp.stats().rnr_naks_sent, 1);
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 9,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
    let t0 = pair.now;
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(pair.b.recv_completions()[0].byte_len, 5);
    let nak = naks(&pair, 1);
    assert_eq!(nak.len(), 1);
    assert_eq!(nak[0].1, Syndrome::RnrNak { timer: 14 });
    // The requester waited the RNR timer (1.28 ms) before resending.
    assert!((pair.now - t0).as_micros() >= 1_280, "{:?}", pair.now - t0);
}

#[test]
fn rnr_retries_exhausted() {
    let mut cfg = PairConfig::new(QpType::Rc, 2);
    cfg.rnr_retry = 2;
    let mut pair = Pair::new(cfg);
    let src = pair.a.register(b"x");
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(1, SendOp::Send, vec![src.sge(0, 1)]))
        .unwrap();
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(2, SendOp::Send, vec![src.sge(0, 1)]))
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.a.qp.state(), QpState::Err);
    // First try + 2 retries, each answered by an RNR NAK.
    assert_eq!(pair.b.qp.stats().rnr_naks_sent, 3);
    assert_eq!(
        pair.b.qp.state(),
        QpState::Rts,
        "RNR is not an error at the responder"
    );
}

#[test]
fn bad_rkey_is_a_remote_access_error_on_both_sides() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 3));
    let src = pair.a.register(b"data");
    let dst = pair.b.register(&[0u8; 4]);
    // Out of bounds, then a wrong key.
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr + 2,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 4)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(
        naks(&pair, 1)[0].1,
        Syndrome::Nak(NakCode::RemoteAccessError)
    );
    assert_eq!(
        (pair.a.qp.state(), pair.b.qp.state()),
        (QpState::Err, QpState::Err)
    );
    assert!(pair.b.read(&dst).iter().all(|&b| b == 0), "nothing written");

    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 4));
    let src = pair.a.register(b"data");
    let dst = pair.b.register(&[0u8; 4]);
    let bad = roce_wire::RKey::new(dst.rkey().value() ^ 0x01); // stale 8-bit key
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: dst.addr,
            rkey: bad,
        },
        vec![src.sge(0, 4)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RemAccessErr)]
    );
}

#[test]
fn operation_not_enabled_on_the_qp_is_an_invalid_request() {
    let mut cfg = PairConfig::new(QpType::Rc, 5);
    cfg.access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let mut pair = Pair::new(cfg);
    let src = pair.a.register(b"data");
    let dst = pair.b.register(&[0u8; 4]);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 4)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RemInvReqErr)]
    );
    assert_eq!(naks(&pair, 1)[0].1, Syndrome::Nak(NakCode::InvalidRequest));
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 6));
    let word = pair.b.register(&[0u8; 16]);
    let res = pair.a.register(&[0u8; 8]);
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: word.addr + 4,
            rkey: word.rkey(),
            add: 1,
        },
        vec![res.sge(0, 8)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RemInvReqErr)]
    );
    assert!(pair.b.read(&word).iter().all(|&b| b == 0));
}

#[test]
fn message_longer_than_the_receive_buffer() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 7));
    let src = pair.a.register(&[7u8; 100]);
    let dst = pair.b.register(&[0u8; 50]);
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 5,
            sges: vec![dst.sge(0, 50)],
        })
        .unwrap();
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(1, SendOp::Send, vec![src.sge(0, 100)]),
        )
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::RemInvReqErr)]
    );
    assert_eq!(
        statuses(&pair.b.recv_completions()),
        vec![(5, WcStatus::LocLenErr)]
    );
}

#[test]
fn bad_local_key_is_a_local_protection_error() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 8));
    let src = pair.a.register(b"data");
    let mut sge = src.sge(0, 4);
    sge.lkey = LKey::new(0xFFFF_FF00);
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(1, SendOp::Send, vec![sge]))
        .unwrap();
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(2, SendOp::Send, vec![src.sge(0, 4)]))
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.a.qp.state(), QpState::Err);
    assert!(pair.sent(0).is_empty(), "nothing went on the wire");
}

#[test]
fn lost_packet_gets_one_sequence_nak_and_go_back_n() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 9));
    let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let src = pair.a.register(&data);
    let dst = pair.b.register(&[0u8; 5000]);
    let mut dropped = false;
    pair.drop_matching(
        0,
        Box::new(move |p| {
            // Drop the first RDMA_WRITE_MIDDLE once.
            if p.bth.opcode == Opcode::RcRdmaWriteMiddle && !dropped {
                dropped = true;
                return true;
            }
            false
        }),
    );
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 5000)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(pair.b.read(&dst), data);
    // Exactly one NAK, carrying the PSN of the lost packet (the responder's expected PSN).
    let lost_psn = pair.trace.iter().find(|t| t.filtered).unwrap().psn;
    assert_eq!(
        naks(&pair, 1),
        vec![(lost_psn, Syndrome::Nak(NakCode::PsnSequenceError))]
    );
    // Go-back-N resent from the lost PSN on: 5 packets first, then the 4 from the lost one.
    let a_psns: Vec<u32> = pair
        .trace
        .iter()
        .filter(|t| t.dir == 0)
        .map(|t| t.psn.value())
        .collect();
    let first = a_psns[0];
    let rel: Vec<u32> = a_psns
        .iter()
        .map(|p| p.wrapping_sub(first) & 0xFF_FFFF)
        .collect();
    assert_eq!(rel, vec![0, 1, 2, 3, 4, 1, 2, 3, 4]);
    assert_eq!(pair.a.qp.stats().retransmitted_packets, 4);
}

#[test]
fn duplicate_request_is_reacked_not_reexecuted() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 10));
    let src = pair.a.register(b"abcd");
    let dst = pair.b.register(&[0u8; 8]);
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 2,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
    // Lose the ACK: the requester times out and resends; the responder must not consume a
    // second receive WR.
    let mut n = 0;
    pair.drop_matching(
        1,
        Box::new(move |p| {
            n += 1;
            p.bth.opcode == Opcode::RcAcknowledge && n == 1
        }),
    );
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(1, SendOp::Send, vec![src.sge(0, 4)]))
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&pair.b.recv_completions()),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(pair.b.qp.stats().duplicate_requests, 1);
    assert_eq!(pair.a.qp.stats().timeouts, 1);
}

#[test]
fn duplicate_atomic_replays_the_saved_result() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 11));
    let word = pair.b.register(&10u64.to_ne_bytes());
    let res = pair.a.register(&[0u8; 8]);
    let mut n = 0;
    pair.drop_matching(
        1,
        Box::new(move |p| {
            n += 1;
            p.bth.opcode == Opcode::RcAtomicAcknowledge && n == 1
        }),
    );
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: word.addr,
            rkey: word.rkey(),
            add: 5,
        },
        vec![res.sge(0, 8)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        statuses(&pair.a.send_completions()),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        u64::from_ne_bytes(pair.a.read(&res)[..].try_into().unwrap()),
        10,
        "the saved original"
    );
    assert_eq!(
        u64::from_ne_bytes(pair.b.read(&word)[..].try_into().unwrap()),
        15,
        "executed once"
    );
    assert_eq!(
        pair.sent(1)
            .iter()
            .filter(|t| t.opcode == Opcode::RcAtomicAcknowledge)
            .count(),
        1
    );
    assert_eq!(
        pair.trace
            .iter()
            .filter(|t| t.opcode == Opcode::RcAtomicAcknowledge)
            .count(),
        2
    );
}

#[test]
fn modify_to_error_flushes_everything() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 12));
    let buf = pair.b.register(&[0u8; 8]);
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sges: vec![buf.sge(0, 8)],
        })
        .unwrap();
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 2,
            sges: vec![buf.sge(0, 8)],
        })
        .unwrap();
    let err = QpAttr {
        state: QpState::Err,
        ..QpAttr::default()
    };
    pair.b.qp.modify(&err, AttrMask::STATE).unwrap();
    assert!(pair.drive_bounded(100));
    let rc = pair.b.recv_completions();
    assert_eq!(
        statuses(&rc),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(rc.iter().all(|c| c.opcode == WcOpcode::Recv));
    // Posting in ERR completes at once with a flush error.
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 3,
            sges: vec![],
        })
        .unwrap();
    assert!(pair.drive_bounded(100));
    assert_eq!(
        statuses(&pair.b.recv_completions()),
        vec![(3, WcStatus::WrFlushErr)]
    );
    // ERR -> RESET -> INIT works again.
    pair.b
        .qp
        .modify(
            &QpAttr {
                state: QpState::Reset,
                ..QpAttr::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
    assert_eq!(pair.b.qp.state(), QpState::Reset);
    assert_eq!(
        pair.b.qp.post_recv(RecvWr {
            wr_id: 4,
            sges: vec![]
        }),
        Err(PostError::InvalidState(QpState::Reset))
    );
}

#[test]
fn post_errors_are_typed() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 13));
    let src = pair.a.register(&[0u8; 16]);
    let mut wr = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: 0,
            rkey: src.rkey(),
            add: 1,
        },
        vec![src.sge(0, 4)],
    );
    assert_eq!(
        pair.a.qp.post_send(pair.now, wr.clone()),
        Err(PostError::InvalidSgl),
        "atomics take 8 bytes"
    );
    wr.ud = Some(roce_qp::verbs::UdDest {
        ah: roce_qp::verbs::AddressHandle::new(pair.b.gid),
        remote_qpn: roce_wire::Qpn::new(1),
        remote_qkey: roce_wire::QKey::new(0),
    });
    wr.data = roce_qp::verbs::SendData::Sges(vec![src.sge(0, 8)]);
    assert_eq!(
        pair.a.qp.post_send(pair.now, wr),
        Err(PostError::InvalidDest)
    );
}
