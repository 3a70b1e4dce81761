//! Answers to requests that executed before a fatal error still go out: rxe sends each answer
//! when its request executes, so when a later request in the same burst is NAKed and the QP
//! enters ERR, only the WQE the NAK names fails. Found over the transport (an ATOMIC WRITE
//! followed at once by a FLUSH the QP may not execute: the ATOMIC WRITE failed with the
//! FLUSH's REM_INV_REQ_ERR because its queued empty READ response was discarded).

use roce_mr::Access;
use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{FlushLevel, FlushPlacement, QpState, QpType, SendOp, SendWr, WcStatus};
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::Opcode;

#[test]
fn an_atomic_write_before_a_refused_flush_completes() {
    let mut cfg = PairConfig::new(QpType::Rc, 41);
    // The QP allows remote writes (ATOMIC WRITE) but not FLUSH: the FLUSH is NAKed 0x61.
    cfg.access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut pair = Pair::new(cfg);
    let value = 0x0123_4567_89AB_CDEFu64.to_ne_bytes();
    let src = pair.a.register(&value);
    let target = pair.b.register_with(
        &[0u8; 16],
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::FLUSH_GLOBAL,
    );
    let write = SendOp::AtomicWrite {
        remote_addr: target.addr,
        rkey: target.rkey(),
    };
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(1, write, vec![src.sge(0, 8)]))
        .unwrap();
    let flush = SendOp::Flush {
        remote_addr: target.addr,
        rkey: target.rkey(),
        len: 16,
        placement: FlushPlacement::GLOBAL,
        level: FlushLevel::Range,
    };
    pair.a
        .qp
        .post_send(pair.now, SendWr::new(2, flush, vec![]))
        .unwrap();
    assert!(pair.drive_bounded(100_000));
    let answers: Vec<_> = pair
        .sent(1)
        .iter()
        .map(|t| (t.opcode, t.syndrome))
        .collect();
    assert_eq!(
        answers,
        vec![
            (
                Opcode::RcRdmaReadResponseOnly,
                Some(Syndrome::ACK_UNLIMITED)
            ),
            (
                Opcode::RcAcknowledge,
                Some(Syndrome::Nak(NakCode::InvalidRequest))
            ),
        ]
    );
    let done: Vec<_> = pair
        .a
        .send_completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        done,
        vec![(1, WcStatus::Success), (2, WcStatus::RemInvReqErr)]
    );
    assert_eq!(&pair.b.read(&target)[..8], &value);
    assert_eq!(
        (pair.a.qp.state(), pair.b.qp.state()),
        (QpState::Err, QpState::Err)
    );
}
