//! Two ranks in two network namespaces joined by a veth pair (MTU 9000), as the issue's
//! goals are stated: 4 KiB allreduce latency (blocking and busy-poll) and 16 MiB busbw,
//! printed with the load average (not asserted); the results are checked. Also a dead rank
//! across namespaces is detected within a second.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_collectives::{
    Algorithm, Bootstrap, CollError, CommOptions, Communicator, DeviceChoice, ReduceOp,
};
use roce_testkit::netns::{netns_or_skip, run_in, NetnsPair};
use roce_transport::DeviceConfig;

/// The defaults over `ROCECTL_COLL_*` (chunk, slots, QPs... to compare).
fn env() -> CommOptions {
    CommOptions::from_env().expect("ROCECTL_COLL_* parse")
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs `f` as rank 0 in `a`'s namespace and rank 1 in `b`'s.
fn two<T: Send + 'static>(
    pair: &NetnsPair,
    o: CommOptions,
    f: impl Fn(Communicator) -> T + Send + Sync + 'static,
) -> Vec<Result<T, CollError>> {
    let ends = [pair.a(), pair.b()];
    let ips: Vec<IpAddr> = ends.iter().map(|e| IpAddr::V4(e.ipv4())).collect();
    let store = SocketAddr::new(ips[0], 29_400 + (std::process::id() % 500) as u16);
    let f = Arc::new(f);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let ns = ends[rank].ns_name().to_string();
            let ip = ips[rank];
            let mut o = o.clone();
            o.device = DeviceChoice::Config(Arc::new(move |_| DeviceConfig::udp(ip).exclusive()));
            let f = f.clone();
            std::thread::spawn(move || {
                run_in(&ns, move || {
                    let c = Communicator::init(
                        Bootstrap::Tcp {
                            addr: store,
                            rank,
                            size: 2,
                        },
                        o,
                    )?;
                    Ok(f(c))
                })
                .map_err(|e| CollError::Bootstrap(format!("netns: {e}")))?
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect()
}

fn median_us(n: usize, bytes: usize, iters: usize, pair: &NetnsPair, o: CommOptions) -> (f64, f64) {
    let out = two(pair, o, move |c| {
        let mut v = vec![1f32; bytes / 4];
        let mut times = Vec::new();
        for i in 0..iters + 3 {
            v.fill(1.0);
            let t = Instant::now();
            c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            if i >= 3 {
                times.push(t.elapsed());
            }
            assert!(v.iter().all(|x| *x == 2.0));
        }
        times.sort();
        times[times.len() / 2]
    });
    let med = out
        .into_iter()
        .map(|r| r.unwrap())
        .max()
        .unwrap_or_default();
    let busbw = bytes as f64 * 2.0 * (n as f64 - 1.0) / n as f64 / med.as_secs_f64() / 1e9;
    (med.as_secs_f64() * 1e6, busbw)
}

#[test]
fn veth_latency_and_bandwidth_are_printed_and_a_dead_rank_is_detected() {
    if !netns_or_skip("veth_latency_and_bandwidth") {
        return;
    }
    let pair = NetnsPair::create_with_mtu("coll", 9000).expect("a veth pair");
    let la = load();
    for busy in [false, true] {
        let o = CommOptions {
            busy_poll: busy,
            timeout: Duration::from_secs(30),
            ..env()
        };
        let (us, _) = median_us(2, 4096, 300, &pair, o);
        eprintln!("veth np=2 4 KiB allreduce median {us:.1} us (busy_poll={busy}; load {la})");
    }
    for algo in [Algorithm::Ring, Algorithm::HalvingDoubling] {
        let o = CommOptions {
            algorithm: algo,
            timeout: Duration::from_secs(30),
            ..env()
        };
        let (us, bw) = median_us(2, 16 << 20, 5, &pair, o);
        eprintln!(
            "veth np=2 16 MiB allreduce {algo}: median {:.1} ms, busbw {bw:.2} GB/s (load {la})",
            us / 1e3
        );
    }
    // Rank 1 dies mid-allreduce; rank 0, in the other namespace, knows within a second.
    let out = two(&pair, CommOptions::default(), |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(200));
            let at = Instant::now();
            c.simulate_crash();
            return (None, at);
        }
        let e = c
            .allreduce_in_place(&mut vec![1i64; 1 << 16], ReduceOp::Sum)
            .unwrap_err();
        (Some(e), Instant::now())
    });
    let died = out[1].as_ref().unwrap().1;
    let (e, at) = out[0].as_ref().unwrap().clone();
    let e = e.unwrap();
    assert!(matches!(e, CollError::PeerFailed { peer: 1, .. }), "{e}");
    let after = at.saturating_duration_since(died);
    assert!(after < Duration::from_secs(1), "{e} after {after:?}");
    eprintln!("veth: {e} ({after:?} after the death)");
}
