//! Early retransmission (`Timer::Probe`): a lost retransmission, a lost sequence NAK or a lost
//! message tail is not reported again by the responder (one NAK per error episode, C9-112), so
//! without it every such loss waits out a whole ACK timeout: 67 ms at the `timeout` 14 that
//! verbs applications (and our collectives) use, for a round trip of microseconds. 1% loss
//! made a collective 15-23x slower over a veth (measured with `rocectl coll launch --loss 1`
//! before this change). The requester now goes back after several measured round trips (at
//! least `QpConfig::early_retransmit_min_ns`), spending no retry; the ACK timeout still
//! decides when a peer is dead.

use roce_qp::testing::{LinkConfig, Pair, PairConfig};
use roce_qp::verbs::{Mtu, QpType, SendOp, SendWr, WcStatus};
use roce_qp::QpStats;

/// The ACK timeout exponent of these tests: 4.096 us x 2^14 = 67 ms.
const TIMEOUT: u8 = 14;
const ACK_TIMEOUT_NS: u64 = 4096 << TIMEOUT;

struct Run {
    /// Virtual time from the first post until the pair settled.
    elapsed_ns: u64,
    statuses: Vec<WcStatus>,
    a: QpStats,
}

/// 16 RDMA WRITEs of 512 KiB (a collective's chunks) from A to B at PMTU 4096, both
/// directions losing `loss` of the packets, 10 us one way.
fn run(seed: u64, loss: f64, early: Option<u64>) -> Run {
    let link = LinkConfig {
        loss,
        delay_ns: 10_000,
        ..LinkConfig::perfect()
    };
    let mut cfg = PairConfig::new(QpType::Rc, seed).with_link(link);
    cfg.mtu = Mtu::Mtu4096;
    cfg.timeout = TIMEOUT;
    cfg.qp.early_retransmit_min_ns = early;
    let mut pair = Pair::new(cfg);
    let start = pair.now;
    pair.post_writes(16, 512 << 10);
    assert!(
        pair.drive_bounded(50_000_000),
        "seed {seed}: did not settle"
    );
    Run {
        elapsed_ns: pair.now.as_nanos() - start.as_nanos(),
        statuses: pair.a.send_completions().iter().map(|c| c.status).collect(),
        a: pair.a.qp.stats(),
    }
}

/// At 1% and 5% loss every WRITE completes without a single ACK timeout, more than 10x
/// sooner than without early retransmission, where the same seeds wait out ACK timeouts (at
/// 1%, each 8 MiB transfer takes less than one ACK timeout). Measured over seeds 1-5, with
/// two AckReqs per window (the requester's `ACK_REQS_PER_WINDOW`): 1% 97 ms -> 5.9 ms per
/// transfer, 5% 1.7 s -> 62 ms (with one AckReq per window, before both changes: 217 ms and
/// 2.6 s).
#[test]
fn losses_the_responder_cannot_report_cost_round_trips_not_ack_timeouts() {
    for loss in [0.01, 0.05] {
        let (mut with, mut without) = ((0, 0, 0), (0, 0));
        for seed in 1..=5 {
            let r = run(seed, loss, Some(roce_qp::DEFAULT_EARLY_RETRANSMIT_MIN_NS));
            assert!(
                r.statuses.len() == 16 && r.statuses.iter().all(|s| *s == WcStatus::Success),
                "loss {loss} seed {seed}: {:?}",
                r.statuses
            );
            with.0 += r.a.timeouts;
            with.1 += r.a.early_retransmits;
            with.2 += r.elapsed_ns;
            let r = run(seed, loss, None);
            assert_eq!(r.a.early_retransmits, 0, "disabled means disabled");
            without.0 += r.a.timeouts;
            without.1 += r.elapsed_ns;
        }
        eprintln!(
            "loss {loss}: early retransmission {} timeouts, {} probes, {} us per transfer; \
             without {} timeouts, {} us",
            with.0,
            with.1,
            with.2 / 5_000,
            without.0,
            without.1 / 5_000
        );
        assert_eq!(with.0, 0, "loss {loss}: ACK timeouts fired");
        assert!(with.1 > 0, "loss {loss}: no early retransmission happened");
        assert!(
            loss > 0.01 || with.2 / 5 < ACK_TIMEOUT_NS,
            "loss {loss}: {} ns per transfer",
            with.2 / 5
        );
        assert!(
            without.0 > 0,
            "loss {loss}: the seeds need no ACK timeout at all"
        );
        assert!(with.2 * 10 < without.1, "loss {loss}: not even 10x faster");
    }
}

/// A peer that answers nothing is still declared dead by the ACK timeout alone: RETRY_EXC_ERR
/// after `retry_cnt` + 1 timeouts, no sooner, although early retransmissions went out in
/// between.
#[test]
fn a_dead_peer_still_takes_retry_cnt_ack_timeouts() {
    let mut cfg = PairConfig::new(QpType::Rc, 7);
    cfg.mtu = Mtu::Mtu4096;
    cfg.timeout = TIMEOUT;
    cfg.retry_cnt = 3;
    cfg.b_to_a = LinkConfig {
        loss: 1.0,
        ..LinkConfig::perfect()
    };
    let mut pair = Pair::new(cfg);
    let src = pair.a.register(&[7u8; 8192]);
    let dst = pair.b.register(&[0u8; 8192]);
    let start = pair.now;
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr,
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, 8192)],
            ),
        )
        .unwrap();
    assert!(pair.drive_bounded(1_000_000));
    let sc = pair.a.send_completions();
    assert_eq!(sc.len(), 1);
    assert_eq!(sc[0].status, WcStatus::RetryExcErr);
    let st = pair.a.qp.stats();
    assert_eq!(st.timeouts, 4, "{st:?}");
    assert!(st.early_retransmits > 0, "{st:?}");
    let elapsed = pair.now.as_nanos() - start.as_nanos();
    assert!(
        elapsed >= 4 * ACK_TIMEOUT_NS,
        "declared dead after {elapsed} ns, before 4 ACK timeouts"
    );
}
