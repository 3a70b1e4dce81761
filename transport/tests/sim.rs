//! Two devices on the in-memory network: every RC operation and UD SEND from 0 bytes to
//! 1 MiB, on a perfect network and on lossy, duplicating, reordering, corrupting ones.

use std::time::Duration;

use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{Device, DeviceConfig, LinkConfig, Progress, SimNetwork};

fn devices(net: &SimNetwork, progress: Progress) -> (Device, Device) {
    let a = Device::open(
        DeviceConfig::sim(net, "10.9.0.1".parse().unwrap())
            .name("sim-a")
            .progress(progress),
    )
    .unwrap();
    let b = Device::open(
        DeviceConfig::sim(net, "10.9.0.2".parse().unwrap())
            .name("sim-b")
            .progress(progress),
    )
    .unwrap();
    (a, b)
}

fn run_all(net: &SimNetwork, progress: Progress, opts: &SelftestOptions) -> (Device, Device) {
    let (a, b) = devices(net, progress);
    let mut steps = 0;
    run_rc(&a, &b, opts, &mut |r| {
        eprintln!("{r}");
        steps += 1;
    })
    .unwrap_or_else(|e| panic!("{e}\nnet {:?}\na {:?}", net.stats(), a.counters()));
    run_ud(&a, &b, opts, &mut |r| {
        eprintln!("{r}");
        steps += 1;
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, opts.sizes.len() * 4 + 2 + opts.ud_sizes.len());
    (a, b)
}

#[test]
fn every_operation_on_a_perfect_network() {
    let net = SimNetwork::perfect();
    let (a, b) = run_all(&net, Progress::Thread, &SelftestOptions::default());
    let (ca, cb) = (a.counters(), b.counters());
    assert_eq!(ca.icrc_errors + cb.icrc_errors, 0);
    assert_eq!(ca.retransmitted_pkts + cb.retransmitted_pkts, 0);
    assert!(ca.sent_pkts > 256 * 3, "{ca:?}");
}

#[test]
fn every_operation_under_application_driven_progress() {
    let net = SimNetwork::perfect();
    let opts = SelftestOptions {
        sizes: vec![0, 3000, 65_536],
        ..SelftestOptions::default()
    };
    run_all(&net, Progress::Manual, &opts);
}

#[test]
fn every_operation_survives_loss_duplication_reordering_and_corruption() {
    let link = LinkConfig {
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.01,
        reorder_delay_ns: 200_000,
        corrupt: 0.01,
        delay_ns: 0,
        ..LinkConfig::perfect()
    };
    let net = SimNetwork::new(link, 42);
    let opts = SelftestOptions {
        sizes: vec![0, 1, 4096, 65_536, 1 << 20],
        ud_sizes: vec![],
        timeout: Duration::from_secs(60),
        ..SelftestOptions::default()
    };
    let (a, b) = run_all(&net, Progress::Thread, &opts);
    let s = net.stats();
    let (ca, cb) = (a.counters(), b.counters());
    assert!(s.lost > 0 && s.corrupted > 0, "{s:?}");
    // Every corrupted packet was caught by the ICRC check.
    assert!(ca.icrc_errors + cb.icrc_errors > 0, "{ca:?} {cb:?}");
    assert!(ca.retransmitted_pkts > 0, "{ca:?}");
}
