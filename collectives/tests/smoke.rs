//! Smoke: two ranks, one allreduce.

mod common;

use roce_collectives::ReduceOp;

#[test]
fn two_ranks_allreduce_f32() {
    let b = common::block();
    let out = common::run(2, common::opts(b), |c| {
        let r = c.rank() as f32;
        let send: Vec<f32> = (0..1000).map(|i| i as f32 + r).collect();
        let mut recv = vec![0f32; 1000];
        c.allreduce(&send, &mut recv, ReduceOp::Sum).map(|()| recv)
    });
    for o in out {
        let v = o.unwrap().unwrap();
        for (i, x) in v.iter().enumerate() {
            assert_eq!(*x, (2 * i + 1) as f32);
        }
    }
}

#[test]
fn the_handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<roce_collectives::Communicator>();
    send_sync::<roce_collectives::Handle>();
    send_sync::<roce_collectives::AbortHandle>();
}

/// The default spin: ranks of one host are counted from the boot ID every rank reports at
/// set-up (these ranks are threads of one process: one host), and a wait polls only when
/// every one of them can have a CPU. Explicit choices are kept whatever the host.
#[test]
fn the_default_spin_counts_the_ranks_of_this_host() {
    use roce_collectives::{Spin, DEFAULT_SPIN};
    use std::time::Duration;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let spins = |n: usize, spin: Spin| -> Vec<Duration> {
        let b = common::block();
        let o = roce_collectives::CommOptions {
            spin,
            ..common::opts(b)
        };
        common::run(n, o, |c| {
            let s = c.spin();
            // The communicator works whatever it spins: a barrier and an allreduce.
            c.barrier().unwrap();
            let mut v = vec![c.rank() as u32 + 1; 33];
            c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            let n = c.size() as u32;
            assert!(v.iter().all(|&x| x == n * (n + 1) / 2));
            s
        })
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
    };
    let one = spins(1, Spin::Auto);
    assert_eq!(one, vec![DEFAULT_SPIN], "one rank always has a CPU");
    if cpus >= 2 {
        assert_eq!(spins(2, Spin::Auto), vec![DEFAULT_SPIN; 2]);
    }
    assert_eq!(spins(2, Spin::Never), vec![Duration::ZERO; 2]);
    // One rank more than this process has CPUs: nobody spins (up to 16 CPUs: more ranks
    // than that in one test process would be a load test of its own).
    if cpus <= 16 {
        let over = cpus + 1;
        assert_eq!(spins(over, Spin::Auto), vec![Duration::ZERO; over]);
        let d = Duration::from_micros(7);
        assert_eq!(spins(over, Spin::For(d)), vec![d; over]);
    } else {
        eprintln!("NOT RUN: the oversubscribed case needs at most 16 CPUs (this host: {cpus})");
    }
}
