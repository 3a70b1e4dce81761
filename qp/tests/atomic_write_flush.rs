//! ATOMIC WRITE and FLUSH (IBTA 1.5 annex A19, rxe since Linux 6.2) end to end in the
//! simulator: the requester's packets, the responder's execution and its empty RDMA READ
//! response, the completions (`IBV_WC_ATOMIC_WRITE`, `IBV_WC_FLUSH`), and every error path with
//! the NAK on the wire.

use roce_mr::Access;
use roce_qp::testing::{Pair, PairConfig, Region};
use roce_qp::verbs::{
    FlushLevel, FlushPlacement, QpState, QpType, SendData, SendOp, SendWr, WcOpcode, WcStatus,
};
use roce_qp::PostError;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{Opcode, RKey};

const FLUSH_ALL: Access = Access::FLUSH_GLOBAL.union(Access::FLUSH_PERSISTENT);

/// `a` without the rights of `b`.
fn without(a: Access, b: Access) -> Access {
    Access::from_bits(a.bits() & !b.bits()).expect("known bits")
}

fn rights() -> Access {
    Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | FLUSH_ALL
}

/// A connected RC pair whose QPs allow `qp_access`.
fn pair(seed: u64, qp_access: Access) -> Pair {
    let mut cfg = PairConfig::new(QpType::Rc, seed);
    cfg.access = qp_access;
    Pair::new(cfg)
}

/// What B sent to A: (opcode, syndrome) of each packet.
fn responses(pair: &Pair) -> Vec<(Opcode, Option<Syndrome>)> {
    pair.sent(1)
        .iter()
        .map(|t| (t.opcode, t.syndrome))
        .collect()
}

fn atomic_write(pair: &mut Pair, wr_id: u64, target: &Region, offset: u64, rkey: RKey) {
    let value = 0x0123_4567_89AB_CDEFu64.to_ne_bytes();
    let src = pair.a.register(&value);
    let wr = SendWr::new(
        wr_id,
        SendOp::AtomicWrite {
            remote_addr: target.addr + offset,
            rkey,
        },
        vec![src.sge(0, 8)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
}

fn flush(pair: &mut Pair, target: &Region, offset: u64, len: u32, placement: FlushPlacement) {
    let wr = SendWr::new(
        1,
        SendOp::Flush {
            remote_addr: target.addr + offset,
            rkey: target.rkey(),
            len,
            placement,
            level: FlushLevel::Range,
        },
        vec![],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
}

/// The one NAK B sent, A's completion status, and both QPs in ERR.
fn assert_fatal(pair: &mut Pair, code: NakCode, status: WcStatus) {
    let naks: Vec<Syndrome> = responses(pair)
        .into_iter()
        .filter_map(|(_, s)| s.filter(|s| !s.is_ack()))
        .collect();
    assert_eq!(naks, vec![Syndrome::Nak(code)]);
    let done = pair.a.send_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, status);
    assert_eq!(
        (pair.a.qp.state(), pair.b.qp.state()),
        (QpState::Err, QpState::Err)
    );
}

//= ibta-v1.5#A19.4.2
//= type=test
#[test]
fn atomic_write_stores_eight_bytes_and_completes_on_an_empty_read_response() {
    let mut pair = pair(1, rights());
    let target = pair.b.register_with(&[0xEE; 24], rights());
    atomic_write(&mut pair, 7, &target, 8, target.rkey());
    let done = pair.a.send_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (
            done[0].wr_id,
            done[0].status,
            done[0].opcode,
            done[0].byte_len
        ),
        (7, WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    let mem = pair.b.read(&target);
    assert_eq!(&mem[8..16], &0x0123_4567_89AB_CDEFu64.to_ne_bytes());
    assert!(mem[..8].iter().chain(&mem[16..]).all(|&b| b == 0xEE));
    assert_eq!(pair.sent(0)[0].opcode, Opcode::RcAtomicWrite);
    assert_eq!(
        responses(&pair),
        vec![(
            Opcode::RcRdmaReadResponseOnly,
            Some(Syndrome::ACK_UNLIMITED)
        )]
    );
    assert!(pair.b.recv_completions().is_empty(), "no receive consumed");
}

#[test]
fn atomic_write_with_a_bad_rkey_is_a_remote_access_error() {
    let mut pair = pair(2, rights());
    let target = pair.b.register_with(&[0; 16], rights());
    atomic_write(&mut pair, 1, &target, 0, RKey::new(0x00BA_D000));
    assert_fatal(
        &mut pair,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn atomic_write_out_of_bounds_is_a_remote_access_error() {
    let mut pair = pair(3, rights());
    let target = pair.b.register_with(&[0; 16], rights());
    atomic_write(&mut pair, 1, &target, 16, target.rkey());
    assert_fatal(
        &mut pair,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn misaligned_atomic_write_is_an_invalid_request_and_writes_nothing() {
    let mut pair = pair(4, rights());
    let target = pair.b.register_with(&[0; 16], rights());
    atomic_write(&mut pair, 1, &target, 4, target.rkey());
    assert_fatal(&mut pair, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    assert!(pair.b.read(&target).iter().all(|&b| b == 0));
}

#[test]
fn atomic_write_needs_remote_write_on_the_qp_and_on_the_region() {
    // The QP does not allow REMOTE_WRITE (atomics alone are not enough): invalid request, as
    // rxe's check_op_valid.
    let qp_rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut p = pair(5, qp_rights);
    let target = p.b.register_with(&[0; 16], rights());
    atomic_write(&mut p, 1, &target, 0, target.rkey());
    assert_fatal(&mut p, NakCode::InvalidRequest, WcStatus::RemInvReqErr);

    // The region does not grant REMOTE_WRITE: remote access error.
    let mut p = pair(6, rights());
    let region_rights = Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ;
    let target = p.b.register_with(&[0; 16], region_rights);
    atomic_write(&mut p, 1, &target, 0, target.rkey());
    assert_fatal(&mut p, NakCode::RemoteAccessError, WcStatus::RemAccessErr);
    assert!(p.b.read(&target).iter().all(|&b| b == 0));
}

#[test]
fn a_duplicate_atomic_write_is_answered_again_but_not_executed_again() {
    let mut pair = pair(7, rights());
    let target = pair.b.register_with(&[0; 8], rights());
    // Lose the first response: A times out and sends the ATOMIC WRITE again.
    let mut dropped = false;
    pair.drop_matching(
        1,
        Box::new(move |p| {
            let first = !dropped && p.bth.opcode == Opcode::RcRdmaReadResponseOnly;
            dropped |= first;
            first
        }),
    );
    let value = 0x1111_2222_3333_4444u64.to_ne_bytes();
    let src = pair.a.register(&value);
    let wr = SendWr::new(
        1,
        SendOp::AtomicWrite {
            remote_addr: target.addr,
            rkey: target.rkey(),
        },
        vec![src.sge(0, 8)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    // Run until B executed it, then overwrite the word behind its back: the duplicate must
    // not store the value again.
    for _ in 0..1_000 {
        if !pair.step() {
            if let Some(t) = pair.next_event() {
                pair.now = pair.now.max(t);
            }
        }
        if pair.b.read(&target) == value {
            break;
        }
    }
    assert_eq!(pair.b.read(&target), value);
    pair.b
        .table
        .write(target.key, 0, &[0x55; 8])
        .expect("overwrite");
    assert!(pair.drive_bounded(100_000));
    let done = pair.a.send_completions();
    assert_eq!(
        (done[0].status, done[0].opcode),
        (WcStatus::Success, WcOpcode::AtomicWrite)
    );
    assert_eq!(pair.b.read(&target), [0x55; 8], "executed once");
    assert_eq!(pair.a.qp.stats().timeouts, 1);
    assert_eq!(pair.b.qp.stats().duplicate_requests, 1);
    let answers = pair
        .sent(1)
        .iter()
        .filter(|t| t.opcode == Opcode::RcRdmaReadResponseOnly)
        .count();
    assert_eq!(
        answers, 1,
        "the re-answer (the trace leaves the dropped one out)"
    );
}

//= ibta-v1.5#A19.4.1
//= type=test
#[test]
fn flush_completes_on_an_empty_read_response() {
    let mut pair = pair(8, rights());
    let target = pair.b.register_with(&[0; 64], rights());
    let both = FlushPlacement::GLOBAL.union(FlushPlacement::PERSISTENT);
    flush(&mut pair, &target, 0, 64, both);
    let done = pair.a.send_completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].status, done[0].opcode),
        (WcStatus::Success, WcOpcode::Flush)
    );
    assert_eq!(pair.sent(0)[0].opcode, Opcode::RcFlush);
    assert_eq!(
        responses(&pair),
        vec![(
            Opcode::RcRdmaReadResponseOnly,
            Some(Syndrome::ACK_UNLIMITED)
        )]
    );
}

#[test]
fn flush_after_writes_completes_after_them_in_order() {
    let mut pair = pair(9, rights());
    let target = pair.b.register_with(&[0; 16], rights());
    let src = pair.a.register(&[7; 16]);
    let write = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: target.addr,
            rkey: target.rkey(),
        },
        vec![src.sge(0, 16)],
    );
    pair.a.qp.post_send(pair.now, write).unwrap();
    flush(&mut pair, &target, 0, 16, FlushPlacement::GLOBAL);
    let done = pair.a.send_completions();
    let ops: Vec<(u64, WcOpcode, WcStatus)> =
        done.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    assert_eq!(
        ops,
        vec![
            (1, WcOpcode::RdmaWrite, WcStatus::Success),
            (1, WcOpcode::Flush, WcStatus::Success)
        ]
    );
    assert_eq!(pair.b.read(&target), [7; 16]);
}

#[test]
fn flush_needs_the_placement_rights_on_the_qp_and_on_the_region() {
    // The QP allows global flushes only: a persistent flush is an invalid request.
    let qp_rights = without(rights(), Access::FLUSH_PERSISTENT);
    let mut p = pair(10, qp_rights);
    let target = p.b.register_with(&[0; 16], rights());
    flush(&mut p, &target, 0, 16, FlushPlacement::PERSISTENT);
    assert_fatal(&mut p, NakCode::InvalidRequest, WcStatus::RemInvReqErr);

    // The region grants no FLUSH_GLOBAL: remote access error.
    let mut p = pair(11, rights());
    let target = p.b.register_with(&[0; 16], without(rights(), FLUSH_ALL));
    flush(&mut p, &target, 0, 16, FlushPlacement::GLOBAL);
    assert_fatal(&mut p, NakCode::RemoteAccessError, WcStatus::RemAccessErr);
}

#[test]
fn flush_out_of_the_region_is_a_remote_access_error() {
    let mut p = pair(12, rights());
    let target = p.b.register_with(&[0; 16], rights());
    flush(&mut p, &target, 8, 16, FlushPlacement::GLOBAL);
    assert_fatal(&mut p, NakCode::RemoteAccessError, WcStatus::RemAccessErr);
}

#[test]
fn post_checks_the_shape_of_atomic_write_and_flush() {
    let mut pair = pair(13, rights());
    let src = pair.a.register(&[0; 16]);
    let rkey = RKey::new(1);
    let aw = SendOp::AtomicWrite {
        remote_addr: 0,
        rkey,
    };
    let short = SendWr::new(1, aw, vec![src.sge(0, 4)]);
    assert_eq!(
        pair.a.qp.post_send(pair.now, short),
        Err(PostError::InvalidSgl)
    );
    let fl = SendOp::Flush {
        remote_addr: 0,
        rkey,
        len: 8,
        placement: FlushPlacement::GLOBAL,
        level: FlushLevel::Range,
    };
    let with_data = SendWr::new(2, fl, vec![src.sge(0, 8)]);
    assert_eq!(
        pair.a.qp.post_send(pair.now, with_data),
        Err(PostError::InvalidSgl)
    );
    // Inline data is fine for an ATOMIC WRITE (it is the value to store).
    let mut inline = SendWr::new(3, aw, vec![]);
    inline.data = SendData::Inline(vec![1; 8]);
    assert_eq!(pair.a.qp.post_send(pair.now, inline), Ok(()));

    let mut uc = Pair::new(PairConfig::new(QpType::Uc, 14));
    for op in [aw, fl] {
        let wr = SendWr::new(4, op, vec![]);
        assert_eq!(uc.a.qp.post_send(uc.now, wr), Err(PostError::UnsupportedOp));
    }
}
