//! Non-blocking operations complete in post order, their completion descriptor counts them,
//! a blocking call runs after them; and the collectives stay exact over a simulated network
//! with 1 % and 10 % loss and reordering (a slot written twice before its release is a
//! protocol error the receiver reports, so these runs also show the credits hold).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_collectives::{Algorithm, CommOptions, DeviceChoice, ReduceOp};
use roce_transport::{DeviceConfig, LinkConfig, SimNetwork};

#[test]
fn nonblocking_operations_complete_in_post_order() {
    let out = common::run(3, common::opts(common::block()), |c| {
        let (r, n) = (c.rank(), c.size());
        let hs = vec![
            c.iallreduce(vec![r as i32 + 1; 50_000], ReduceOp::Sum)
                .unwrap(),
            c.ibroadcast_raw(vec![r as u8; 3000], 1).unwrap(),
            c.iallgather_raw(vec![r as u8; 10]).unwrap(),
            c.ibarrier().unwrap(),
            c.iallreduce(vec![r as i32; 10], ReduceOp::Max).unwrap(),
        ];
        // Whenever one is done, all before it are.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let done: Vec<bool> = hs.iter().map(|h| h.test().unwrap()).collect();
            if let Some(k) = done.iter().rposition(|d| *d) {
                assert!(done[..k].iter().all(|d| *d), "{done:?}");
            }
            if done.iter().all(|d| *d) {
                break;
            }
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert_eq!(c.clear_completion_fd(), hs.len());
        // A blocking call after more posts runs after them.
        let h = c.iallreduce(vec![1u64; 1000], ReduceOp::Sum).unwrap();
        let mut v = vec![2u64; 7];
        c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert!(h.test().unwrap(), "the blocking call overtook a posted one");
        assert_eq!(v, vec![2 * n as u64; 7]);
        let mut it = hs.into_iter().rev();
        let last: Vec<i32> = it.next().unwrap().wait_typed().unwrap();
        assert_eq!(last, vec![n as i32 - 1; 10]);
        assert!(it.next().unwrap().wait().unwrap().is_empty());
        let ag = it.next().unwrap().wait().unwrap();
        assert_eq!(
            ag,
            (0..n).flat_map(|q| vec![q as u8; 10]).collect::<Vec<_>>()
        );
        assert_eq!(it.next().unwrap().wait().unwrap(), vec![1u8; 3000]);
        let sum: Vec<i32> = it.next().unwrap().wait_typed().unwrap();
        assert!(sum.iter().all(|x| *x == 6));
        assert_eq!(h.wait_typed::<u64>().unwrap(), vec![3; 1000]);
    });
    for o in out {
        o.unwrap();
    }
}

#[test]
fn results_stay_exact_under_loss_and_reordering() {
    for loss in [0.01, 0.10] {
        for algo in [Algorithm::Ring, Algorithm::RecursiveDoubling] {
            let net = SimNetwork::new(
                LinkConfig {
                    loss,
                    reorder: 0.05,
                    reorder_delay_ns: 100_000,
                    delay_ns: 20_000,
                    ..LinkConfig::perfect()
                },
                7,
            );
            let stats = net.clone();
            let o = CommOptions {
                timeout: Duration::from_secs(60),
                algorithm: algo,
                chunk_bytes: 4096,
                slots: 4,
                device: DeviceChoice::Config(Arc::new(move |r| {
                    DeviceConfig::sim(&net, IpAddr::V4(Ipv4Addr::new(10, 0, 0, r as u8 + 1)))
                })),
                ..CommOptions::default()
            };
            let t = Instant::now();
            let out = common::run(3, o, |c| {
                let r = c.rank() as i64;
                for count in [1usize, 1025, 8 * 1024 + 1] {
                    let mut v: Vec<i64> = (0..count as i64).map(|i| i * (r + 1)).collect();
                    c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert!(
                        v.iter().enumerate().all(|(i, x)| *x == 6 * i as i64),
                        "count {count}"
                    );
                }
            });
            for o in out {
                o.unwrap();
            }
            let st = stats.stats();
            assert!(st.lost > 0 && st.reordered > 0, "{st:?}");
            eprintln!(
                "loss {loss} {algo}: exact, {:?} ({} of {} datagrams lost)",
                t.elapsed(),
                st.lost,
                st.sent
            );
        }
    }
}

#[test]
fn every_nonblocking_variant_gives_the_blocking_result() {
    let out = common::run(3, common::opts(common::block()), |c| {
        let (r, n) = (c.rank(), c.size());
        let rs: Vec<i32> = (0..n * 100).map(|i| i as i32 * (r as i32 + 1)).collect();
        let h_rs = c
            .ireduce_scatter_raw(
                roce_collectives::DataType::I32,
                ReduceOp::Sum,
                bytemuck::cast_slice(&rs).to_vec(),
            )
            .unwrap();
        let h_red = c
            .ireduce_raw(
                roce_collectives::DataType::I32,
                ReduceOp::Max,
                bytemuck::cast_slice(&[r as i32; 5]).to_vec(),
                2,
            )
            .unwrap();
        let right = (r + 1) % n;
        let left = (r + n - 1) % n;
        let h_send = c.isend_raw(vec![r as u8; 77], right).unwrap();
        let h_recv = c.irecv_raw(77, left).unwrap();
        let block: Vec<i32> = h_rs.wait_typed().unwrap();
        let want: Vec<i32> = (0..100).map(|i| ((r * 100 + i) * 6) as i32).collect();
        assert_eq!(block, want);
        let red: Vec<i32> = h_red.wait_typed().unwrap();
        if r == 2 {
            assert_eq!(red, vec![2; 5]);
        }
        assert_eq!(h_send.wait().unwrap(), vec![r as u8; 77]);
        assert_eq!(h_recv.wait().unwrap(), vec![left as u8; 77]);
        // Misuse is refused at once, not through the handle.
        assert!(c.isend_raw(vec![], r).is_err());
        assert!(c.ibroadcast_raw(vec![], n).is_err());
        assert!(c
            .iallreduce_raw(roce_collectives::DataType::F32, ReduceOp::BXor, vec![])
            .is_err());
    });
    for o in out {
        o.unwrap();
    }
}
