//! Loss injected by `NetnsPair::set_loss` (nftables, egress of the sender's veth) works for the
//! raw backend: an `AF_PACKET` receiver is not fooled by a late hook, and the sender counts
//! each drop (`ENOBUFS`) instead of sending the frame again. 10% loss drops about 10% of 2000
//! datagrams; after `clear_loss`, none are lost.

mod raw_util;

use std::time::Duration;

use raw_util::{can_run, collect, datagram, open, payload, send_all, WAIT};
use roce_testkit::netns::{NetnsPair, Side};
use roce_transport::datapath::raw::{RawDatapath, RawOptions};
use roce_transport::datapath::{Datapath, TxDatagram};

const COUNT: usize = 2000;

/// Sends `COUNT` datagrams from `a` to `b` in batches; returns how many arrived. The sender
/// learns of each egress drop (`ENOBUFS`, counted in `tx_dropped`), so we know how many to
/// wait for.
fn run(a: &mut RawDatapath, b: &mut RawDatapath, round: usize) -> usize {
    let payloads: Vec<Vec<u8>> = (0..COUNT)
        .map(|i| payload(round * COUNT + i, 200))
        .collect();
    let dst = b.local_addr();
    let mut arrived = 0;
    for (c, chunk) in payloads.chunks(50).enumerate() {
        let batch: Vec<TxDatagram<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| datagram(dst, c * 50 + i, p))
            .collect();
        let dropped_before = a.stats().tx_dropped;
        let got = send_all(a, b, &batch);
        let dropped = (a.stats().tx_dropped - dropped_before) as usize;
        let got = collect(a, b, got, batch.len() - dropped, WAIT);
        assert_eq!(got.len(), batch.len() - dropped, "sender {:?}", a.stats());
        for g in &got {
            assert!(
                payloads.contains(&g.data),
                "a datagram that was never sent arrived"
            );
        }
        arrived += got.len();
    }
    // Nothing else trickles in.
    let late = collect(a, b, Vec::new(), 1, Duration::from_millis(20));
    arrived + late.len()
}

#[test]
fn raw_loss_follows_set_loss_and_clear_loss() {
    if !can_run("raw_loss_follows_set_loss_and_clear_loss") {
        return;
    }
    let pair = NetnsPair::create("rloss").unwrap();
    let mut a = open(pair.a(), pair.a().ipv4().into(), RawOptions::default());
    let mut b = open(pair.b(), pair.b().ipv4().into(), RawOptions::default());
    // Resolve first, so loss only ever hits datagrams.
    let warm = [0u8; 8];
    let dst = b.local_addr();
    let got = raw_util::transfer(&mut a, &mut b, &[datagram(dst, 0, &warm)]);
    assert_eq!(got.len(), 1);

    pair.set_loss(Side::A, 10).unwrap();
    let arrived = run(&mut a, &mut b, 1);
    let lost = COUNT - arrived;
    eprintln!("10% loss: {lost} of {COUNT} lost");
    assert_eq!(a.stats().tx_dropped, lost as u64);
    assert!(
        (COUNT * 3 / 100..=COUNT * 20 / 100).contains(&lost),
        "{lost} of {COUNT} lost with 10% loss"
    );

    pair.clear_loss(Side::A).unwrap();
    let arrived = run(&mut a, &mut b, 2);
    assert_eq!(
        arrived,
        COUNT,
        "loss after clear_loss; receiver {:?}",
        b.stats()
    );
    assert_eq!(b.stats().rx_kernel_drops, 0);
}
