//! Failure as a first-class path: timeouts name the rank, peer and phase; an abort on one
//! rank (or from another thread) fails every rank's pending operation within a second; a
//! rank that dies is detected by the others within a second; the survivors shrink and go
//! on; an init with a rank missing fails on every present rank naming it.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use roce_collectives::{Bootstrap, CollError, Communicator, ReduceOp};

const BOUND: Duration = Duration::from_secs(1);

#[test]
fn a_missing_peer_times_out_naming_rank_peer_and_phase() {
    let mut o = common::opts(common::block());
    o.timeout = Duration::from_secs(10);
    let out = common::run(2, o, |c| {
        if c.rank() == 1 {
            // Never joins the allreduce; stays alive past rank 0's timeout.
            std::thread::sleep(Duration::from_millis(1200));
            return None;
        }
        let t = Instant::now();
        let mut buf = vec![1f32; 1024];
        let e = c
            .with_timeout(Duration::from_millis(500))
            .allreduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        let took = t.elapsed();
        // The streams are out of step: the next call refuses at once instead of reading
        // the late chunks as its own.
        let next = c.barrier().unwrap_err();
        assert!(
            matches!(&next, CollError::PeerFailed { peer: 1, reason, .. } if reason.contains("out of step")),
            "{next}"
        );
        Some((e, took))
    });
    let (e, took) = out[0].as_ref().unwrap().clone().unwrap();
    match &e {
        CollError::Timeout {
            rank: 0,
            peer: Some(1),
            phase,
            ..
        } => {
            assert!(phase.contains("allreduce"), "{e}");
        }
        other => panic!("wrong error {other}"),
    }
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(900),
        "{took:?}"
    );
    eprintln!("{e} after {took:?}");
}

/// Ranks 0..n-1 except `odd` block in an allreduce; `odd` does `act` after 300 ms. Returns
/// each blocked rank's error and how long after the act it came.
fn drill(n: usize, odd: usize, act: fn(Communicator)) -> Vec<(CollError, Duration)> {
    let o = common::opts(common::block());
    let (tx, rx) = mpsc::channel::<Instant>();
    let tx = std::sync::Mutex::new(tx);
    let out = common::run(n, o, move |c| {
        if c.rank() == odd {
            std::thread::sleep(Duration::from_millis(300));
            let _ = tx.lock().unwrap().send(Instant::now());
            act(c);
            return None;
        }
        let mut buf = vec![1i32; 64 << 10];
        let e = c.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((e, Instant::now()))
    });
    let at = rx.recv().unwrap();
    out.into_iter()
        .filter_map(|r| r.unwrap())
        .map(|(e, t)| (e, t.saturating_duration_since(at)))
        .collect()
}

#[test]
fn abort_on_one_rank_fails_every_other_rank_within_a_second() {
    let errs = drill(3, 2, |c| c.abort());
    assert_eq!(errs.len(), 2);
    for (e, after) in errs {
        assert!(matches!(e, CollError::Aborted { by_rank: 2, .. }), "{e}");
        assert!(after < BOUND, "{e} came {after:?} after the abort");
        eprintln!("{e} ({after:?} after the abort)");
    }
}

#[test]
fn a_dead_rank_is_detected_within_a_second() {
    for dead in [2, 0] {
        let errs = drill(3, dead, Communicator::simulate_crash);
        assert_eq!(errs.len(), 2);
        for (e, after) in errs {
            assert!(
                matches!(&e, CollError::PeerFailed { peer, .. } if *peer == dead),
                "{e}"
            );
            assert!(after < BOUND, "{e} came {after:?} after the death");
            eprintln!("{e} ({after:?} after the death)");
        }
    }
}

#[test]
fn abort_from_another_thread_stops_this_ranks_wait_and_future_calls() {
    let out = common::run(2, common::opts(common::block()), |c| {
        let peer = 1 - c.rank();
        if c.rank() == 1 {
            // Waits for a message that never comes; fails from rank 0's abort.
            let t = Instant::now();
            let e = c.recv_raw(&mut [0u8; 8], peer).unwrap_err();
            return (e, t.elapsed());
        }
        let h = c.abort_handle();
        let t = Instant::now();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            h.abort();
        });
        let e = c.recv_raw(&mut [0u8; 8], peer).unwrap_err();
        aborter.join().unwrap();
        let future = c.barrier().unwrap_err();
        assert!(
            matches!(future, CollError::Aborted { by_rank: 0, .. }),
            "{future}"
        );
        (e, t.elapsed())
    });
    for r in out {
        let (e, took) = r.unwrap();
        assert!(matches!(e, CollError::Aborted { by_rank: 0, .. }), "{e}");
        assert!(took < Duration::from_millis(200) + BOUND, "{took:?}");
    }
}

#[test]
fn survivors_shrink_and_complete_100_allreduces() {
    let out = common::run(4, common::opts(common::block()), |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(100));
            c.simulate_crash();
            return None;
        }
        let mut buf = vec![1i32; 256 << 10];
        let e = c.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap_err();
        let failed: Vec<usize> = c.failed_ranks().into_iter().map(|(r, _)| r).collect();
        assert_eq!(failed, vec![2], "{e}");
        let s = c.shrink(&failed).unwrap();
        assert_eq!(s.size(), 3);
        let old = c.rank();
        for it in 0..100 {
            let mut v: Vec<i32> = (0..1000).map(|i| i + old as i32 * it).collect();
            s.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            // Old ranks 0, 1 and 3 survive.
            for (i, x) in v.iter().enumerate() {
                assert_eq!(*x, 3 * i as i32 + 4 * it, "iteration {it}");
            }
        }
        Some(s.rank())
    });
    let ranks: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(ranks, vec![Some(0), Some(1), None, Some(2)]);
}

#[test]
fn init_with_a_rank_missing_fails_on_every_present_rank_naming_it() {
    let b = common::block();
    let mut o = common::opts(b);
    o.timeout = Duration::from_secs(1);
    let addr = common::store(b);
    let t = Instant::now();
    let ths: Vec<_> = (0..2)
        .map(|rank| {
            let o = o.clone();
            std::thread::spawn(move || {
                Communicator::init(
                    Bootstrap::Tcp {
                        addr,
                        rank,
                        size: 3,
                    },
                    o,
                )
            })
        })
        .collect();
    for th in ths {
        let e = th.join().unwrap().unwrap_err();
        assert!(matches!(e, CollError::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("missing ranks: [2]"), "{e}");
    }
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn mismatched_lengths_are_an_error_not_a_misaligned_stream() {
    let mut o = common::opts(common::block());
    o.chunk_bytes = 4096;
    o.timeout = Duration::from_secs(5);
    let out = common::run(2, o, |c| {
        if c.rank() == 0 {
            // Two chunks' worth; the receiver asks for one chunk.
            c.send_raw(&[1u8; 8192], 1).map(|()| None)
        } else {
            let e = c.recv_raw(&mut [0u8; 4096], 0).unwrap_err();
            Ok(Some(e))
        }
    });
    let e = out[1].as_ref().unwrap().as_ref().unwrap().clone().unwrap();
    assert!(
        matches!(&e, CollError::PeerFailed { peer: 0, reason, .. } if reason.contains("protocol")),
        "{e}"
    );
}

/// A rank whose host vanishes closes no socket: its QPs stop answering and its heartbeats
/// stop, its TCP connections stay open. The others wait to receive from it (nothing of
/// theirs goes to it, so no QP retries can tell): the heartbeats must, within a second,
/// for a vanished rank 2 (rank 0's service announces it) and a vanished rank 0 (the
/// members stop getting answers).
#[test]
fn a_vanished_rank_is_detected_within_a_second_by_heartbeats() {
    for gone in [2usize, 0] {
        let (tx, rx) = mpsc::channel::<Instant>();
        let tx = std::sync::Mutex::new(tx);
        let out = common::run(3, common::opts(common::block()), move |c| {
            if c.rank() == gone {
                std::thread::sleep(Duration::from_millis(300));
                let _ = tx.lock().unwrap().send(Instant::now());
                c.simulate_vanish();
                return None;
            }
            let e = c.recv_raw(&mut [0u8; 64], gone).unwrap_err();
            Some((e, Instant::now()))
        });
        let at = rx.recv().unwrap();
        let errs: Vec<_> = out.into_iter().filter_map(|r| r.unwrap()).collect();
        assert_eq!(errs.len(), 2);
        for (e, t) in errs {
            let after = t.saturating_duration_since(at);
            assert!(
                matches!(&e, CollError::PeerFailed { peer, reason, .. } if *peer == gone && reason.contains("heartbeat")),
                "{e}"
            );
            assert!(
                after < BOUND,
                "{e} came {after:?} after rank {gone} vanished"
            );
            eprintln!("{e} ({after:?} after the vanishing)");
        }
    }
}

/// Heartbeats do not fail an idle communicator: two seconds of nothing (several silence
/// windows), then an allreduce works on every rank.
#[test]
fn an_idle_communicator_stays_healthy() {
    let out = common::run(3, common::opts(common::block()), |c| {
        std::thread::sleep(Duration::from_secs(2));
        let mut buf = vec![1u32; 1000];
        c.allreduce_in_place(&mut buf, ReduceOp::Sum)
            .map(|()| buf.iter().all(|v| *v == 3))
    });
    for (rank, r) in out.into_iter().enumerate() {
        assert!(r.unwrap().unwrap(), "rank {rank}");
    }
}
