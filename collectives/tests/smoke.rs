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
