//! Requests whose bytes after the headers do not fit their opcode, answered as Linux rdma_rxe
//! answers them (issue 12; the hostile peer checks the same over veth against rxe's own
//! answers): a WRITE ONLY whose length is not a multiple of 4 is a length error (NAK 0x61),
//! while READ requests, atomics and FLUSH with payload bytes or a nonzero PadCnt execute as if
//! those bytes were absent. The transport parses the latter with
//! `PacketRepr::parse_payloadless_request` and hands the former to `handle_bad_pad`; these
//! tests feed the QP exactly what the transport does.

use std::sync::{Arc, Mutex};

use roce_mr::Access;
use roce_qp::testing::{Pair, PairConfig};
use roce_qp::verbs::{FlushLevel, FlushPlacement, QpState, QpType, SendOp, SendWr, WcStatus};
use roce_qp::RecvMeta;
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{bth, Opcode, PacketRepr, ParseError};

fn pair(seed: u64) -> Pair {
    let mut cfg = PairConfig::new(QpType::Rc, seed);
    cfg.access = Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::FLUSH_GLOBAL
        | Access::FLUSH_PERSISTENT;
    Pair::new(cfg)
}

/// Posts `wr` on A, keeps A's (only) request from reaching B, and returns its bytes (BTH ..
/// ICRC) for the test to deform.
fn posted_request(pair: &mut Pair, wr: SendWr) -> Vec<u8> {
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let keep = Arc::clone(&seen);
    pair.drop_matching(
        0,
        Box::new(move |p| {
            let mut bytes = vec![0u8; p.buffer_len()];
            p.emit(&mut bytes);
            *keep.lock().unwrap() = bytes;
            true
        }),
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    pair.step();
    pair.clear_filter(0);
    let bytes = seen.lock().unwrap().clone();
    assert!(!bytes.is_empty(), "A sent its request");
    bytes
}

/// Inserts `extra` bytes before the ICRC and sets PadCnt to `pad`.
fn deform(mut bytes: Vec<u8>, extra: &[u8], pad: u8) -> Vec<u8> {
    let at = bytes.len() - 4;
    bytes.splice(at..at, extra.iter().copied());
    bytes[1] = (bytes[1] & !0x30) | (pad << 4);
    bytes
}

/// Delivers deformed bytes to B as the transport does and runs the pair until quiet.
fn deliver(pair: &mut Pair, bytes: &[u8], expect_err: ParseError) {
    assert_eq!(PacketRepr::parse(bytes), Err(expect_err));
    let meta = RecvMeta::new(pair.a.gid, pair.b.gid);
    match PacketRepr::parse_payloadless_request(bytes) {
        Some(p) => pair.b.qp.handle_packet(pair.now, &p, &meta),
        None => {
            let bth = bth::Repr::parse(&bth::Packet::new_checked(bytes).unwrap()).unwrap();
            pair.b.qp.handle_bad_pad(pair.now, &bth, &meta);
        }
    }
    assert!(pair.drive_bounded(100_000));
}

/// What B answered: (opcode, syndrome).
fn answers(pair: &Pair) -> Vec<(Opcode, Option<Syndrome>)> {
    pair.sent(1)
        .iter()
        .map(|t| (t.opcode, t.syndrome))
        .collect()
}

//= rxe_resp.c check_rkey: `bth_pad(pkt) != (0x3 & (-resid))` -> RESPST_ERR_LENGTH
//= type=test
#[test]
fn a_write_only_of_unaligned_length_is_naked_invalid_request_like_rxe() {
    let mut pair = pair(31);
    let src = pair.a.register(&[0xEE; 8]);
    let dst = pair.b.register(&[0u8; 16]);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 4)],
    );
    let bytes = posted_request(&mut pair, wr);
    // The 4-byte payload plus one more byte, PadCnt 0: 5 bytes, the length unaligned.
    let bytes = deform(bytes, &[0xEE], 0);
    deliver(&mut pair, &bytes, ParseError::BadLength);
    assert_eq!(
        answers(&pair),
        vec![(
            Opcode::RcAcknowledge,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::RemInvReqErr);
    assert_eq!(
        (pair.a.qp.state(), pair.b.qp.state()),
        (QpState::Err, QpState::Err)
    );
    assert!(pair.b.read(&dst).iter().all(|&b| b == 0), "nothing written");
}

fn read_case(seed: u64, extra: &[u8], pad: u8, err: ParseError) {
    let mut pair = pair(seed);
    let local = pair.a.register(&[0u8; 8]);
    let remote = pair.b.register(b"readable");
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey(),
        },
        vec![local.sge(0, 8)],
    );
    let bytes = deform(posted_request(&mut pair, wr), extra, pad);
    deliver(&mut pair, &bytes, err);
    assert_eq!(
        answers(&pair),
        vec![(
            Opcode::RcRdmaReadResponseOnly,
            Some(Syndrome::ACK_UNLIMITED)
        )],
        "seed {seed}"
    );
    let done = pair.a.send_completions();
    assert_eq!(done[0].status, WcStatus::Success);
    assert_eq!(pair.a.read(&local), b"readable");
    assert_eq!(pair.b.qp.state(), QpState::Rts);
}

//= rxe_resp.c check_length bounds only an ONLY packet's payload; the READ path ignores it
//= type=test
#[test]
fn a_read_request_with_a_payload_is_answered_like_rxe() {
    read_case(32, &[0xEE; 8], 0, ParseError::UnexpectedPayload);
}

#[test]
fn a_read_request_with_a_pad_count_is_answered_like_rxe() {
    read_case(33, &[], 3, ParseError::BadPadCount);
}

#[test]
fn a_read_request_of_unaligned_length_is_answered_like_rxe() {
    read_case(34, &[0xEE; 3], 1, ParseError::BadLength);
}

#[test]
fn an_atomic_with_a_pad_count_executes_like_rxe() {
    let mut pair = pair(35);
    let result = pair.a.register(&[0u8; 8]);
    let counter = pair.b.register(&5u64.to_ne_bytes());
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: counter.addr,
            rkey: counter.rkey(),
            add: 2,
        },
        vec![result.sge(0, 8)],
    );
    let bytes = deform(posted_request(&mut pair, wr), &[], 2);
    deliver(&mut pair, &bytes, ParseError::BadPadCount);
    assert_eq!(
        answers(&pair),
        vec![(Opcode::RcAtomicAcknowledge, Some(Syndrome::ACK_UNLIMITED))]
    );
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::Success);
    assert_eq!(pair.a.read(&result), 5u64.to_ne_bytes());
    assert_eq!(pair.b.read(&counter), 7u64.to_ne_bytes(), "executed once");
}

#[test]
fn a_flush_with_a_pad_count_executes_like_rxe() {
    let mut pair = pair(36);
    let target = pair.b.register_with(
        &[0u8; 64],
        Access::LOCAL_WRITE | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT,
    );
    let wr = SendWr::new(
        1,
        SendOp::Flush {
            remote_addr: target.addr,
            rkey: target.rkey(),
            len: 64,
            placement: FlushPlacement::GLOBAL,
            level: FlushLevel::Range,
        },
        vec![],
    );
    let bytes = deform(posted_request(&mut pair, wr), &[], 1);
    deliver(&mut pair, &bytes, ParseError::BadPadCount);
    assert_eq!(
        answers(&pair),
        vec![(
            Opcode::RcRdmaReadResponseOnly,
            Some(Syndrome::ACK_UNLIMITED)
        )]
    );
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::Success);
}

//= rxe_comp.c do_read -> copy_data: `length > resid` -> IB_WC_LOC_PROT_ERR
//= type=test
#[test]
fn an_over_long_read_response_completes_with_loc_prot_err_like_rxe() {
    let mut pair = pair(37);
    let local = pair.a.register(&[0x5A; 64]);
    let remote = pair.b.register(&[0xEE; 64]);
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey(),
        },
        vec![local.sge(0, 16)],
    );
    // B's answer is replaced by a READ RESPONSE ONLY of 48 bytes for the 16 asked.
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let keep = Arc::clone(&seen);
    pair.drop_matching(
        1,
        Box::new(move |p| {
            let mut bytes = vec![0u8; p.buffer_len()];
            p.emit(&mut bytes);
            *keep.lock().unwrap() = bytes;
            true
        }),
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    while seen.lock().unwrap().is_empty() {
        if !pair.step() {
            pair.now = pair.next_event().expect("B answers");
        }
    }
    let bytes = seen.lock().unwrap().clone();
    let resp = PacketRepr::parse(&bytes).unwrap();
    let long = PacketRepr::new(resp.bth, resp.ext, &[0xEE; 48]);
    let stats = pair.a.qp.stats();
    let meta = RecvMeta::new(pair.b.gid, pair.a.gid);
    pair.a.qp.handle_packet(pair.now, &long, &meta);
    let after = pair.a.qp.stats();
    pair.step();
    let done = pair.a.send_completions();
    assert_eq!(done[0].status, WcStatus::LocProtErr);
    assert_eq!(pair.a.qp.state(), QpState::Err);
    assert_eq!(pair.a.read(&local), vec![0x5A; 64], "nothing written");
    // Processed once, not dropped.
    assert_eq!(after.drops(), stats.drops());
    assert_eq!(after.rx_packets, stats.rx_packets + 1);
}
