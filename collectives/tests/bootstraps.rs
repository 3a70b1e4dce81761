//! The file store and the callback bootstraps, and several QPs per peer (chunks striped
//! round-robin, so they arrive out of order across QPs).

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use roce_collectives::{Bootstrap, CollError, Communicator, ExchangeFn, ReduceOp};

fn exercise(c: &Communicator) -> Result<(), CollError> {
    let n = c.size() as i64;
    for count in [0usize, 1, 3000, 40_000] {
        let mut v: Vec<i64> = (0..count as i64).map(|i| i + c.rank() as i64).collect();
        c.allreduce_in_place(&mut v, ReduceOp::Sum)?;
        for (i, x) in v.iter().enumerate() {
            assert_eq!(
                *x,
                n * i as i64 + n * (n - 1) / 2,
                "count {count} element {i}"
            );
        }
    }
    c.barrier()
}

#[test]
fn file_store_bootstrap() {
    let dir = std::env::temp_dir().join(format!(
        "coll-file-{}-{}",
        std::process::id(),
        common::block()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store");
    let b = common::block();
    let ths: Vec<_> = (0..3)
        .map(|rank| {
            let (path, o) = (path.clone(), common::opts(b));
            std::thread::spawn(move || {
                let c = Communicator::init(
                    Bootstrap::File {
                        path,
                        rank,
                        size: 3,
                    },
                    o,
                )?;
                exercise(&c)
            })
        })
        .collect();
    for t in ths {
        t.join().unwrap().unwrap();
    }
    // Each rank removed its files when its communicator went.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn callback_bootstrap_rejects_a_wrong_answer_and_works_with_a_right_one() {
    // A callback that answers with the wrong number of blobs is an error, not a hang.
    let bad: ExchangeFn = Arc::new(|b: Vec<u8>| Ok(vec![b]));
    let e = Communicator::init(
        Bootstrap::Callback {
            rank: 0,
            size: 2,
            exchange: bad,
        },
        common::opts(common::block()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("1 blobs for 2 ranks"), "{e}");

    // A rank-ordered allgather: rank r waits for its turn to push.
    let n = 3;
    let turn = Arc::new((
        Mutex::new((0usize, Vec::<Vec<u8>>::new(), 0usize)),
        Condvar::new(),
    ));
    let b = common::block();
    let ths: Vec<_> = (0..n)
        .map(|rank| {
            let turn = turn.clone();
            let exchange: ExchangeFn = Arc::new(move |blob: Vec<u8>| {
                let (m, cv) = &*turn;
                let mut g = m.lock().unwrap();
                let round = g.2;
                g = cv
                    .wait_timeout_while(g, Duration::from_secs(10), |g| g.0 != rank || g.2 != round)
                    .unwrap()
                    .0;
                g.1.push(blob);
                g.0 += 1;
                if g.0 == n {
                    g.0 = 0;
                    g.2 += 1;
                }
                cv.notify_all();
                g = cv
                    .wait_timeout_while(g, Duration::from_secs(10), |g| g.2 == round)
                    .unwrap()
                    .0;
                let all = g.1[round * n..(round + 1) * n].to_vec();
                Ok(all)
            });
            let o = common::opts(b);
            std::thread::spawn(move || {
                let c = Communicator::init(
                    Bootstrap::Callback {
                        rank,
                        size: n,
                        exchange,
                    },
                    o,
                )?;
                exercise(&c)
            })
        })
        .collect();
    for t in ths {
        t.join().unwrap().unwrap();
    }
}

#[test]
fn several_qps_per_peer_stripe_the_chunks() {
    for n in [2, 3] {
        let mut o = common::opts(common::block());
        o.qps_per_peer = 3;
        o.chunk_bytes = 4096;
        o.slots = 5;
        let out = common::run(n, o, |c| exercise(&c));
        for r in out {
            r.unwrap().unwrap();
        }
    }
}

/// Chunks of more than three packets whose last packet is full (PMTU 4096 on these loopback
/// devices) go as a plain WRITE plus a zero-length WRITE WITH IMMEDIATE (`net::split_pays`);
/// the receiver must still see each chunk whole, with its length and end-of-message flag
/// from the immediate, whether in place or out of place, on one or two QPs (so the pair can
/// follow other chunks on the other QP), at chunk sizes on both sides of the rule, and for
/// byte-sized elements whose last packet pads up to a full one.
#[test]
fn chunks_either_side_of_the_split_arrive_whole() {
    for (chunk, qps) in [
        (3 * 4096, 1),
        (3 * 4096 + 8, 1),
        (4 * 4096, 2),
        (17 * 4096, 2),
        (17 * 4096 + 8, 1),
    ] {
        let mut o = common::opts(common::block());
        o.chunk_bytes = chunk;
        o.qps_per_peer = qps;
        o.slots = 4;
        let out = common::run(2, o, move |c| -> Result<(), CollError> {
            let n = c.size() as i64;
            let r = c.rank() as i64;
            // Element counts giving a final chunk shorter, equal to and longer than 3 packets.
            for count in [1usize, 1535, 1536, 1537, 5 * chunk / 8 + 3] {
                let send: Vec<i64> = (0..count as i64).map(|i| i * 3 + r).collect();
                let mut out = vec![0i64; count];
                c.allreduce(&send, &mut out, ReduceOp::Sum)?;
                let mut inplace = send.clone();
                c.allreduce_in_place(&mut inplace, ReduceOp::Sum)?;
                for (i, (a, b)) in out.iter().zip(&inplace).enumerate() {
                    let want = n * 3 * i as i64 + n * (n - 1) / 2;
                    assert_eq!(
                        (*a, *b),
                        (want, want),
                        "chunk {chunk} count {count} elt {i}"
                    );
                }
            }
            // Bytes: a last packet of 4093-4095 bytes pads to a full one (a split), of 4091
            // it does not.
            for count in [4 * 4096 - 3, 4 * 4096 - 1, 4 * 4096 - 5, 4 * 4096] {
                let send: Vec<u8> = (0..count).map(|i| (i % 200) as u8 + r as u8).collect();
                let mut out = vec![0u8; count];
                c.allreduce(&send, &mut out, ReduceOp::Max)?;
                for (i, x) in out.iter().enumerate() {
                    assert_eq!(
                        *x,
                        (i % 200) as u8 + (n - 1) as u8,
                        "u8 count {count} elt {i}"
                    );
                }
            }
            c.barrier()
        });
        for r in out {
            r.unwrap().unwrap();
        }
    }
}
