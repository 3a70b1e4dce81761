//! Data-path cost of the memory layer: lookup + check + translate per access, single-threaded
//! and with two threads (same region and distinct regions), plus checked copy throughput.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roce_mr::{Access, Key, MrTable, Origin, Pd};
use roce_wire::Qpn;

const IOVA: u64 = 0x7f00_0000_0000;
const RIGHTS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn setup(regions: usize) -> (MrTable, Pd, Vec<Key>) {
    let table = MrTable::new(4096, 1);
    let pd = table.alloc_pd();
    let keys = (0..regions)
        .map(|_| {
            table
                .register_zeroed(pd, 64 * 1024, IOVA, RIGHTS)
                .expect("register")
        })
        .collect();
    (table, pd, keys)
}

fn one_access(table: &MrTable, pd: Pd, key: Key, i: u64) {
    let iova = IOVA + (i & 0x3FF) * 8;
    let c = table
        .check(
            Origin::Remote { qpn: Qpn::new(1) },
            key,
            pd,
            black_box(iova),
            8,
            Access::REMOTE_WRITE,
        )
        .expect("check");
    black_box(&c);
}

/// Runs `iters` accesses on each of two threads; returns the slower thread's time per `iters`.
fn two_threads(table: &MrTable, pd: Pd, keys: [Key; 2], iters: u64) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let handles = keys.map(|key| {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for i in 0..iters {
                    one_access(table, pd, key, i);
                }
                start.elapsed()
            })
        });
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .max()
            .unwrap_or_default()
    })
}

fn lookup(c: &mut Criterion) {
    let (table, pd, keys) = setup(2);
    let mut g = c.benchmark_group("lookup_check_translate");
    g.bench_function("1_thread", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i = i.wrapping_add(1);
            one_access(&table, pd, keys[0], i);
        });
    });
    g.bench_function("2_threads_same_region", |b| {
        b.iter_custom(|iters| two_threads(&table, pd, [keys[0], keys[0]], iters));
    });
    g.bench_function("2_threads_distinct_regions", |b| {
        b.iter_custom(|iters| two_threads(&table, pd, [keys[0], keys[1]], iters));
    });
    g.bench_function("1_thread_stale_key_reject", |b| {
        let stale = keys[0].with_key8(keys[0].key8().wrapping_add(7));
        b.iter(|| {
            let r = table.check(
                Origin::Remote { qpn: Qpn::new(1) },
                black_box(stale),
                pd,
                IOVA,
                8,
                Access::REMOTE_WRITE,
            );
            black_box(r.is_err());
        });
    });
    g.finish();
}

fn copy(c: &mut Criterion) {
    let (table, pd, keys) = setup(1);
    let mut g = c.benchmark_group("checked_write");
    for size in [64usize, 256, 1024, 4096] {
        let payload = vec![0xA5u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, payload| {
            b.iter(|| {
                let c = table
                    .check(
                        Origin::Remote { qpn: Qpn::new(1) },
                        keys[0],
                        pd,
                        IOVA + 8,
                        size as u64,
                        Access::REMOTE_WRITE,
                    )
                    .expect("check");
                c.write(0, black_box(payload)).expect("write");
            });
        });
    }
    g.finish();
    let mut g = c.benchmark_group("checked_read");
    for size in [64usize, 256, 1024, 4096] {
        let mut out = vec![0u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                let c = table
                    .check(
                        Origin::Remote { qpn: Qpn::new(1) },
                        keys[0],
                        pd,
                        IOVA + 8,
                        size as u64,
                        Access::REMOTE_READ,
                    )
                    .expect("check");
                c.read(0, black_box(&mut out)).expect("read");
            });
        });
    }
    g.finish();
    let mut g = c.benchmark_group("atomic");
    g.bench_function("fetch_add", |b| {
        b.iter(|| {
            let c = table
                .check(
                    Origin::Remote { qpn: Qpn::new(1) },
                    keys[0],
                    pd,
                    IOVA,
                    8,
                    Access::REMOTE_ATOMIC,
                )
                .expect("check");
            black_box(c.fetch_add(1).expect("atomic"));
        });
    });
    g.finish();
}

#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, lookup, copy);
}
use group::benches;
criterion_main!(benches);
