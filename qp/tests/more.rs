//! UC loss behaviour, unsignaled completions, LOCAL_INV, the READ/atomic depth limit and ACK
//! coalescing.

use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use roce_wire::Opcode;

#[test]
fn uc_drops_the_message_with_a_gap_and_reuses_its_receive() {
    let mut pair = Pair::new(PairConfig::new(QpType::Uc, 1));
    let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let src = pair.a.register(&data);
    let dst = pair.b.register(&[0u8; 4096]);
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sges: vec![dst.sge(0, 4096)],
        })
        .unwrap();
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id: 2,
            sges: vec![dst.sge(0, 4096)],
        })
        .unwrap();
    let mut dropped = false;
    pair.drop_matching(
        0,
        Box::new(move |p| {
            let hit = p.bth.opcode == Opcode::UcSendMiddle && !dropped;
            dropped |= hit;
            hit
        }),
    );
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(1, SendOp::Send, vec![src.sge(0, 3000)]),
        )
        .unwrap();
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(2, SendOp::Send, vec![src.sge(0, 2500)]),
        )
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    // The sender completes both (UC has no acknowledgements) ...
    assert_eq!(pair.a.send_completions().len(), 2);
    // ... the receiver drops the first message and delivers the second into the first WR.
    let rc = pair.b.recv_completions();
    assert_eq!(
        rc.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 2500)]
    );
    assert_eq!(&pair.b.read(&dst)[..2500], &data[..2500]);
    assert!(pair.b.qp.stats().drop_psn >= 1);
}

#[test]
fn unsignaled_successes_produce_no_completion() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 2));
    let src = pair.a.register(&[5u8; 64]);
    let dst = pair.b.register(&[0u8; 64]);
    for (id, signaled) in [(1, true), (2, false), (3, true)] {
        let mut wr = SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey(),
            },
            vec![src.sge(0, 64)],
        );
        wr.signaled = signaled;
        pair.a.qp.post_send(pair.now, wr).unwrap();
    }
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        pair.a
            .send_completions()
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
    assert_eq!(pair.a.qp.send_queue_len(), 0);
}

#[test]
fn local_invalidate_revokes_a_fast_registered_key() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 3));
    // B fast-registers a region, then invalidates it locally; A's WRITE through it must fail.
    let key = pair.b.table.alloc_mr(pair.b.pd, 4096).unwrap();
    let access = roce_mr::Access::LOCAL_WRITE | roce_mr::Access::REMOTE_WRITE;
    pair.b
        .table
        .fast_reg(
            key,
            pair.b.pd,
            roce_mr::FastReg {
                offset: 0,
                iova: 0x5000,
                len: 4096,
                access,
            },
        )
        .unwrap();
    let src = pair.a.register(b"ok");
    let rkey = roce_wire::RKey::new(key.0);
    let write = |id| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: 0x5000,
                rkey,
            },
            vec![src.sge(0, 2)],
        )
    };
    pair.a.qp.post_send(pair.now, write(1)).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::Success);
    pair.b
        .qp
        .post_send(
            pair.now,
            SendWr::new(9, SendOp::LocalInv { key: key.0 }, vec![]),
        )
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    let bc = pair.b.send_completions();
    assert_eq!(
        (bc[0].wr_id, bc[0].status, bc[0].opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    pair.a.qp.post_send(pair.now, write(2)).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::RemAccessErr);
}

#[test]
fn reads_beyond_max_rd_atomic_wait_for_responses() {
    let mut cfg = PairConfig::new(QpType::Rc, 4);
    cfg.rd_atomic = 1;
    let mut pair = Pair::new(cfg);
    let remote = pair.b.register(&[1u8; 4096]);
    let local = pair.a.register(&[0u8; 4096 * 3]);
    for i in 0..3u64 {
        let wr = SendWr::new(
            i,
            SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey(),
            },
            vec![local.sge(4096 * i, 4096)],
        );
        pair.a.qp.post_send(pair.now, wr).unwrap();
    }
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        pair.a
            .send_completions()
            .iter()
            .filter(|c| c.status == WcStatus::Success)
            .count(),
        3
    );
    // In the trace, a READ request never follows another before that one's last response.
    let mut outstanding = 0;
    for t in &pair.trace {
        match t.opcode {
            Opcode::RcRdmaReadRequest => {
                outstanding += 1;
                assert!(outstanding <= 1, "two READs in flight with max_rd_atomic 1");
            }
            Opcode::RcRdmaReadResponseLast | Opcode::RcRdmaReadResponseOnly => outstanding -= 1,
            _ => {}
        }
    }
}

#[test]
fn acks_are_coalesced_when_several_are_due_at_once() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 5));
    let src = pair.a.register(&[1u8; 8]);
    let dst = pair.b.register(&[0u8; 8]);
    for i in 0..4u64 {
        pair.b
            .qp
            .post_recv(RecvWr {
                wr_id: i,
                sges: vec![dst.sge(0, 8)],
            })
            .unwrap();
        pair.a
            .qp
            .post_send(pair.now, SendWr::new(i, SendOp::Send, vec![src.sge(0, 8)]))
            .unwrap();
    }
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions().len(), 4);
    // The four SEND_ONLYs (each AckReq) reach B in one step: B answers with one ACK for the
    // last PSN, which acknowledges all four.
    let acks: Vec<_> = pair
        .sent(1)
        .into_iter()
        .filter(|t| t.opcode == Opcode::RcAcknowledge)
        .collect();
    let sends: Vec<_> = pair.sent(0);
    assert_eq!(sends.len(), 4);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].psn, sends[3].psn);
    assert_eq!(acks[0].msn.map(|m| m.value()), Some(4));
}

#[test]
fn sends_consume_the_shared_receive_queue_and_fire_its_limit_event() {
    let mut cfg = PairConfig::new(QpType::Rc, 6);
    cfg.b_srq = Some(8);
    let mut pair = Pair::new(cfg);
    let srq = pair.b.srq.clone().expect("srq");
    let src = pair.a.register(b"hello srq");
    let dst = pair.b.register(&[0u8; 64]);
    for i in 0..4u64 {
        srq.post_recv(RecvWr {
            wr_id: 100 + i,
            sges: vec![dst.sge(16 * i, 16)],
        })
        .unwrap();
    }
    assert_eq!(
        pair.b.qp.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![]
        }),
        Err(roce_qp::PostError::HasSrq)
    );
    srq.arm_limit(2);
    for i in 0..3u64 {
        pair.a
            .qp
            .post_send(pair.now, SendWr::new(i, SendOp::Send, vec![src.sge(0, 9)]))
            .unwrap();
    }
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions().len(), 3);
    let rc = pair.b.recv_completions();
    assert_eq!(
        rc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    assert_eq!(srq.len(), 1);
    assert_eq!(
        pair.b.qp.poll_event(),
        Some(roce_qp::Event::SrqLimitReached)
    );
    assert_eq!(pair.b.qp.poll_event(), None);
    assert_eq!(&pair.b.read(&dst)[32..41], b"hello srq");
}
