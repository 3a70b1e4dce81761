//! Closing a communicator: the closing handshake (`net.rs`, "Closing"). A rank that drops its
//! communicator right after its last operation must not cut a peer off from packets the
//! lossy link still has to recover; a dead peer must not hold a drop up; a rank still waiting
//! for a peer that has closed fails at once, not at its timeout.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_collectives::{
    Algorithm, Bootstrap, CollError, CommOptions, Communicator, DeviceChoice, ReduceOp,
};
use roce_transport::{DeviceConfig, LinkConfig, SimNetwork};

fn sim_opts(loss: f64, seed: u64, algorithm: Algorithm) -> CommOptions {
    let net = SimNetwork::new(
        LinkConfig {
            loss,
            delay_ns: 0,
            ..LinkConfig::perfect()
        },
        seed,
    );
    CommOptions {
        timeout: Duration::from_secs(30),
        algorithm,
        device: DeviceChoice::Config(Arc::new(move |r| {
            DeviceConfig::sim(&net, IpAddr::V4(Ipv4Addr::new(10, 8, 0, r as u8 + 1)))
        })),
        ..CommOptions::default()
    }
}

fn free_store() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address")
}

/// Was the ignored repro in `matrix.rs`: every rank runs one 1 MiB allreduce at 10 % loss
/// (halving-doubling, 3 ranks; then the ring) and drops its communicator at once. Before the
/// closing handshake a rank timed out in 'allreduce: unfold' waiting for the last messages
/// of a peer that had already closed its device (seed 0, first try).
#[test]
fn dropping_right_after_the_last_operation_at_ten_percent_loss() {
    for (seed, algorithm) in [
        (1000, Algorithm::HalvingDoubling),
        (1001, Algorithm::HalvingDoubling),
        (1002, Algorithm::HalvingDoubling),
        (1003, Algorithm::Ring),
    ] {
        let opts = sim_opts(0.10, seed, algorithm);
        let store = free_store();
        let threads: Vec<_> = (0..3)
            .map(|rank| {
                let opts = opts.clone();
                std::thread::spawn(move || -> Result<Duration, CollError> {
                    let c = Communicator::init(
                        Bootstrap::Tcp {
                            addr: store,
                            rank,
                            size: 3,
                        },
                        opts,
                    )?;
                    let mut buf: Vec<i8> = (0..1 << 20)
                        .map(|i: usize| ((i * 7 + rank * 3) % 9) as i8 - 4)
                        .collect();
                    c.allreduce_in_place(&mut buf, ReduceOp::Max)?;
                    for (i, v) in buf.iter().enumerate() {
                        let want = (0..3).map(|r| ((i * 7 + r * 3) % 9) as i8 - 4).max();
                        assert_eq!(Some(*v), want, "rank {rank} element {i}");
                    }
                    let t = Instant::now();
                    drop(c);
                    Ok(t.elapsed())
                })
            })
            .collect();
        for (rank, t) in threads.into_iter().enumerate() {
            let res = t.join().expect("the rank's thread panicked");
            let took = res.unwrap_or_else(|e| panic!("seed {seed} rank {rank}: {e}"));
            eprintln!("seed {seed} rank {rank}: drop took {took:?}");
            // The handshake waits for the peers' ACKs, not for the 30 s timeout.
            assert!(
                took < Duration::from_secs(5),
                "seed {seed} rank {rank}: drop took {took:?}"
            );
        }
    }
}

/// A peer that died (its QPs gone without a word) does not hold a drop up: once the monitor
/// has told the survivors there is no handshake; had it not yet, the FIN to the dead peer
/// fails with the QP's retries (about half a second). Either way far inside the
/// communicator's 20 s timeout.
#[test]
fn a_dead_peer_does_not_hold_a_drop_up() {
    let b = common::block();
    let mut o = common::opts(b);
    o.timeout = Duration::from_secs(20);
    // Rank 2 dies only once every rank is through the allreduce.
    let through = Arc::new(std::sync::Barrier::new(3));
    let out = common::run(3, o, move |c| {
        let mut buf = vec![c.rank() as u64; 4096];
        c.allreduce_in_place(&mut buf, ReduceOp::Sum)
            .expect("allreduce");
        assert!(buf.iter().all(|v| *v == 3));
        through.wait();
        if c.rank() == 2 {
            c.simulate_crash();
            return None;
        }
        let t = Instant::now();
        drop(c);
        Some(t.elapsed())
    });
    for (rank, r) in out.into_iter().enumerate().take(2) {
        let took = r.expect("init").expect("a survivor");
        eprintln!("rank {rank}: drop with a dead peer took {took:?}");
        assert!(took < Duration::from_secs(3), "rank {rank}: {took:?}");
    }
}

/// Ranks that run different operations: rank 1 closes while rank 0 waits to receive from
/// it. Rank 0 learns of the close from the FINs and fails naming rank 1 at once, not at its
/// 20 s timeout; a close is not a failure of the peer (rank 1 leaves cleanly).
#[test]
fn waiting_for_a_peer_that_closed_fails_at_once() {
    let out = common::run(2, common::opts(common::block()), |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
            drop(c);
            return None;
        }
        let t = Instant::now();
        let mut buf = vec![0u8; 1000];
        let e = c.recv_raw(&mut buf, 1).unwrap_err();
        Some((e, t.elapsed()))
    });
    let (e, took) = out[0].as_ref().expect("init").clone().expect("rank 0");
    eprintln!("{e} after {took:?}");
    assert!(
        matches!(&e, CollError::PeerFailed { rank: 0, peer: 1, reason, .. } if reason.contains("closed")),
        "{e}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}
