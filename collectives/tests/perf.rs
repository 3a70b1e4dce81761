//! Performance sanity on loopback (printed, not asserted: timings on a shared 2-core host are
//! noise; the load average is printed with them). The results are still checked.

mod common;

use std::time::{Duration, Instant};

use roce_collectives::{Algorithm, CommOptions, ReduceOp};

/// The test options over the `ROCECTL_COLL_*` environment (chunk, slots, QPs... to compare).
fn opts() -> CommOptions {
    let env = CommOptions::from_env().expect("ROCECTL_COLL_* parse");
    CommOptions {
        device: common::opts(common::block()).device,
        ..env
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// (median, p99, busbw at the median) of the slowest rank.
fn bench(n: usize, bytes: usize, iters: usize, o: CommOptions) -> (Duration, Duration, f64) {
    let out = common::run(n, o, move |c| {
        let count = bytes / 4;
        let mut v = vec![1f32; count];
        for _ in 0..3 {
            v.fill(1.0);
            c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        }
        c.barrier().unwrap();
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            v.fill(1.0);
            let t = Instant::now();
            c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            times.push(t.elapsed());
            assert!(v.iter().all(|x| *x == c.size() as f32));
        }
        times.sort();
        (times[times.len() / 2], times[times.len() * 99 / 100])
    });
    let (med, p99) = out
        .into_iter()
        .map(|r| r.unwrap())
        .max()
        .unwrap_or_default();
    let busbw = bytes as f64 * 2.0 * (n as f64 - 1.0) / n as f64 / med.as_secs_f64() / 1e9;
    (med, p99, busbw)
}

#[test]
fn loopback_latency_and_bandwidth_are_printed() {
    let la = load();
    for busy in [false, true] {
        let mut o = opts();
        o.busy_poll = busy;
        let (t, p99, _) = bench(2, 4096, 300, o);
        eprintln!("np=2 4 KiB allreduce median {t:?} p99 {p99:?} (busy_poll={busy}; load {la})");
    }
    for algo in [
        Algorithm::Auto,
        Algorithm::RecursiveDoubling,
        Algorithm::Direct,
    ] {
        let mut o = opts();
        o.busy_poll = false;
        o.algorithm = algo;
        let (t, p99, _) = bench(4, 4096, 200, o);
        eprintln!("np=4 4 KiB allreduce {algo} median {t:?} p99 {p99:?} (blocking; load {la})");
    }
    for algo in [Algorithm::Ring, Algorithm::HalvingDoubling] {
        let mut o = opts();
        o.algorithm = algo;
        let (t, _, bw) = bench(2, 16 << 20, 5, o);
        eprintln!("np=2 16 MiB allreduce {algo}: median {t:?}, busbw {bw:.2} GB/s (load {la})");
    }
}
