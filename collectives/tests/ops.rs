//! Every collective and algorithm against a reference computed locally, on 1 to 5 ranks
//! (threads, each with its own `udp` device on loopback), at sizes 0, 1 element, 4 KiB + 1
//! element and 96 KiB (many chunks of the small test chunk, so the credit flow, the slot
//! reuse and the ring's pipeline are exercised); bit-identical results on every rank; the
//! deterministic mode's rank-order reduction independent of size, chunk and algorithm.

mod common;

use roce_collectives::{Algorithm, CommOptions, Communicator, ReduceOp};

const SIZES: [usize; 4] = [0, 1, 1025, 24 * 1024 + 3];

fn input(rank: usize, i: usize) -> i32 {
    ((i * 7919 + rank * 104_729) % 2003) as i32 - 1000
}

fn small_chunks(mut o: CommOptions) -> CommOptions {
    o.chunk_bytes = 4096;
    o.slots = 4;
    o
}

fn check_allreduce(c: &Communicator) -> Vec<Vec<u8>> {
    let (r, n) = (c.rank(), c.size());
    let mut bits = Vec::new();
    for &count in &SIZES {
        let send: Vec<i32> = (0..count).map(|i| input(r, i)).collect();
        let mut recv = vec![0i32; count];
        c.allreduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        for (i, x) in recv.iter().enumerate() {
            let want: i32 = (0..n).map(|q| input(q, i)).sum();
            assert_eq!(*x, want, "rank {r}/{n} count {count} element {i}");
        }
        // In place, min over f32 with fractions, and avg on i64.
        let mut f: Vec<f32> = (0..count).map(|i| input(r, i) as f32 / 3.0).collect();
        c.allreduce_in_place(&mut f, ReduceOp::Min).unwrap();
        for (i, x) in f.iter().enumerate() {
            let want = (0..n)
                .map(|q| input(q, i) as f32 / 3.0)
                .fold(f32::INFINITY, f32::min);
            assert_eq!(x.to_bits(), want.to_bits(), "min rank {r} element {i}");
        }
        let mut a: Vec<i64> = (0..count).map(|i| i64::from(input(r, i)) * 10).collect();
        c.allreduce_in_place(&mut a, ReduceOp::Avg).unwrap();
        for (i, x) in a.iter().enumerate() {
            let want = (0..n).map(|q| i64::from(input(q, i)) * 10).sum::<i64>() / n as i64;
            assert_eq!(*x, want, "avg rank {r} element {i}");
        }
        // Sums of fractions: not exact, but every rank must hold the same bits.
        let mut s: Vec<f32> = (0..count)
            .map(|i| (input(r, i) as f32).mul_add(0.1, 1e-3 * r as f32))
            .collect();
        c.allreduce_in_place(&mut s, ReduceOp::Sum).unwrap();
        bits.push(bytemuck::cast_slice(&s).to_vec());
    }
    bits
}

fn all_equal(per_rank: &[Vec<Vec<u8>>]) {
    for r in 1..per_rank.len() {
        assert!(
            per_rank[r] == per_rank[0],
            "rank {r}'s bits differ from rank 0's"
        );
    }
}

#[test]
fn allreduce_every_algorithm_and_rank_count_matches_the_reference() {
    for algo in [
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::RecursiveDoubling,
        Algorithm::Direct,
        Algorithm::Auto,
    ] {
        for n in 1..=5 {
            let mut o = small_chunks(common::opts(common::block()));
            o.algorithm = algo;
            let out = common::run(n, o, move |c| {
                let name = c.allreduce_algorithm(1 << 20);
                let want = match algo {
                    Algorithm::Auto | Algorithm::Ring => "ring",
                    Algorithm::HalvingDoubling => "hd",
                    Algorithm::RecursiveDoubling => "rd",
                    _ => "direct",
                };
                assert_eq!(name, want);
                check_allreduce(&c)
            });
            let per_rank: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            all_equal(&per_rank);
            eprintln!("allreduce {algo} n={n}: ok");
        }
    }
}

fn fold_in_rank_order(n: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let mut acc = (input(0, i) as f32).mul_add(0.1, 0.0);
            for q in 1..n {
                acc += (input(q, i) as f32).mul_add(0.1, 1e-3 * q as f32);
            }
            acc
        })
        .collect()
}

#[test]
fn deterministic_mode_reduces_in_rank_order_whatever_the_size_chunk_and_algorithm() {
    for n in [2, 3, 5] {
        for (chunk, algo) in [
            (4096, Algorithm::Ring),
            (64 << 10, Algorithm::RecursiveDoubling),
        ] {
            let mut o = common::opts(common::block());
            o.deterministic = true;
            o.chunk_bytes = chunk;
            o.algorithm = algo;
            let out = common::run(n, o, move |c| {
                let r = c.rank();
                let mut results = Vec::new();
                for count in [1usize, 1025, 24 * 1024 + 3] {
                    let mut s: Vec<f32> = (0..count)
                        .map(|i| (input(r, i) as f32).mul_add(0.1, 1e-3 * r as f32))
                        .collect();
                    c.allreduce_in_place(&mut s, ReduceOp::Sum).unwrap();
                    results.push(s);
                }
                results
            });
            for res in out {
                for s in res.unwrap() {
                    let want = fold_in_rank_order(n, s.len());
                    for (i, (a, b)) in s.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "n={n} chunk={chunk} element {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_allgather_broadcast_reduce_barrier_and_send_recv() {
    for n in 1..=5 {
        for small in [true, false] {
            let mut o = small_chunks(common::opts(common::block()));
            if !small {
                o.small_bytes = 0;
            }
            let out = common::run(n, o, move |c| {
                let (r, n) = (c.rank(), c.size());
                for &count in &SIZES {
                    // reduce_scatter: block q of rank r's send holds input(r, q*count + i).
                    let send: Vec<i32> = (0..n * count).map(|i| input(r, i)).collect();
                    let mut recv = vec![0i32; count];
                    c.reduce_scatter(&send, &mut recv, ReduceOp::Sum).unwrap();
                    for (i, x) in recv.iter().enumerate() {
                        let want: i32 = (0..n).map(|q| input(q, r * count + i)).sum();
                        assert_eq!(*x, want, "reduce_scatter n={n} count={count} i={i}");
                    }
                    // allgather.
                    let mine: Vec<i32> = (0..count).map(|i| input(r, i)).collect();
                    let mut all = vec![0i32; n * count];
                    c.allgather(&mine, &mut all).unwrap();
                    for q in 0..n {
                        for i in 0..count {
                            assert_eq!(all[q * count + i], input(q, i), "allgather n={n}");
                        }
                    }
                    for root in 0..n {
                        // broadcast.
                        let mut b: Vec<i32> = if r == root {
                            (0..count).map(|i| input(root, i)).collect()
                        } else {
                            vec![7; count]
                        };
                        c.broadcast(&mut b, root).unwrap();
                        assert!(
                            b.iter().enumerate().all(|(i, x)| *x == input(root, i)),
                            "broadcast"
                        );
                        // reduce.
                        let mut out = vec![0i32; count];
                        c.reduce(&mine, &mut out, ReduceOp::Sum, root).unwrap();
                        if r == root {
                            for (i, x) in out.iter().enumerate() {
                                let want: i32 = (0..n).map(|q| input(q, i)).sum();
                                assert_eq!(*x, want, "reduce n={n} root={root} i={i}");
                            }
                        } else {
                            assert!(out.iter().all(|x| *x == 0), "reduce wrote a non-root");
                        }
                        // In place: the root's buffer becomes the result, the others' stay.
                        let mut inplace = mine.clone();
                        c.reduce_in_place_raw(
                            roce_collectives::DataType::I32,
                            ReduceOp::Sum,
                            bytemuck::cast_slice_mut(&mut inplace),
                            root,
                        )
                        .unwrap();
                        if r == root {
                            assert_eq!(inplace, out, "in-place reduce n={n} root={root}");
                        } else {
                            assert_eq!(inplace, mine, "in-place reduce touched a non-root");
                        }
                    }
                    c.barrier().unwrap();
                    // send/recv round a ring.
                    if n > 1 {
                        let bytes: Vec<u8> = (0..count * 4).map(|i| (i + r) as u8).collect();
                        let mut got = vec![0u8; count * 4];
                        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                        if r % 2 == 0 {
                            c.send_raw(&bytes, right).unwrap();
                            c.recv_raw(&mut got, left).unwrap();
                        } else {
                            c.recv_raw(&mut got, left).unwrap();
                            c.send_raw(&bytes, right).unwrap();
                        }
                        assert!(got.iter().enumerate().all(|(i, x)| *x == (i + left) as u8));
                    }
                }
            });
            for o in out {
                o.unwrap();
            }
            eprintln!("n={n} small={small}: ok");
        }
    }
}
