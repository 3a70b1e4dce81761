//! A READ split into several requests (the requester's window is shrunk after a loss) keeps no
//! more requests outstanding than `max_rd_atomic`: each split request takes one of the
//! responder's saved READ resources (`max_dest_rd_atomic`), so one more would evict the oldest,
//! and a lost response packet of that oldest request could then never be re-requested (the
//! responder drops a duplicate READ it has no resource for): ACK timeouts until
//! RETRY_EXC_ERR. That was the `udp_with_1_percent_loss` flake over veth.

use roce_qp::testing::{LinkConfig, Pair, PairConfig};
use roce_qp::verbs::{QpType, SendOp, SendWr, WcStatus};
use roce_wire::Opcode;

/// Runs a 64 KiB WRITE with one packet lost (the window halves, so READs are split), then a
/// 1 MiB READ with one response packet of its first request lost.
fn split_read_after_loss(rd_atomic: u8, seed: u64) {
    let mut cfg = PairConfig::new(QpType::Rc, seed);
    cfg.rd_atomic = rd_atomic;
    let link = LinkConfig {
        delay_ns: 20_000,
        ..LinkConfig::perfect()
    };
    let mut pair = Pair::new(cfg.with_link(link));
    let len = 1usize << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 1024) as u8).collect();
    let local = pair.a.register(&vec![0u8; len]);
    let remote = pair.b.register(&data);

    // 1. A WRITE with one MIDDLE lost: sequence NAK, go-back-N, the window halves.
    let mut dropped = false;
    pair.drop_matching(
        0,
        Box::new(move |p| {
            let hit = p.bth.opcode == Opcode::RcRdmaWriteMiddle && !dropped;
            dropped |= hit;
            hit
        }),
    );
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey(),
        },
        vec![local.sge(0, 65_536)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(100_000), "WRITE did not settle");
    let c = pair.a.send_completions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
    pair.clear_filter(0);
    // The WRITE overwrote the first 64 KiB of the remote region with zeros.
    let mut expect = data.clone();
    expect[..65_536].fill(0);

    // 2. A 1 MiB READ with the first response MIDDLE lost: the requester must re-request it.
    let mut dropped = false;
    pair.drop_matching(
        1,
        Box::new(move |p| {
            let hit = p.bth.opcode == Opcode::RcRdmaReadResponseMiddle && !dropped;
            dropped |= hit;
            hit
        }),
    );
    let trace_start = pair.trace.len();
    let wr = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey(),
        },
        vec![local.sge(0, len as u32)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(1_000_000), "READ did not settle");
    let c = pair.a.send_completions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
    assert!(pair.a.read(&local) == expect, "READ data differs");

    // The READ really was split into more requests than the responder keeps resources for,
    // and the lost response was re-requested.
    let requests: Vec<_> = pair.trace[trace_start..]
        .iter()
        .filter(|t| t.dir == 0 && t.opcode == Opcode::RcRdmaReadRequest)
        .map(|t| t.psn)
        .collect();
    let distinct: std::collections::HashSet<_> = requests.iter().copied().collect();
    assert!(
        distinct.len() > usize::from(rd_atomic),
        "READ not split beyond rd_atomic: {} requests",
        distinct.len()
    );
    assert!(
        pair.trace[trace_start..]
            .iter()
            .any(|t| t.dir == 1 && t.filtered),
        "no READ response was lost"
    );
}

#[test]
fn split_read_keeps_at_most_rd_atomic_requests_outstanding() {
    for seed in 1..=3 {
        split_read_after_loss(4, seed);
        split_read_after_loss(16, seed);
    }
}
