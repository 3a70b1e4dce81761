//! Two devices on the in-memory network: every RC operation and UD SEND from 0 bytes to
//! 1 MiB, on a perfect network and on lossy, duplicating, reordering, corrupting ones.

use std::sync::Arc;
use std::time::Duration;

use roce_transport::clock::VirtualClock;
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

/// No packet is ever resent on a perfect network. The network and both devices run on a
/// virtual clock that never moves, so no ACK timer can fire, however long the engine threads
/// wait for a CPU: any retransmission counted here was caused by a packet the network or the
/// stack lost or misordered, never by load. (On the system clock, with the 16 ms ACK timeout,
/// the test failed 4 times in 6 at load 11: starved engine threads let timers expire.) Time
/// does not pass, so a lost packet would hang the run until the selftest's per-completion
/// limit (measured in real time) fails it.
#[test]
fn every_operation_on_a_perfect_network() {
    let net = SimNetwork::with_clock(
        LinkConfig {
            delay_ns: 0,
            ..LinkConfig::perfect()
        },
        1,
        Arc::new(VirtualClock::new()),
    );
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

#[test]
fn a_bad_rkey_is_naked_counted_by_code_and_reported_as_remote_access_error() {
    use roce_transport::{
        Access, Completion, ConnectOptions, Psn, QpInit, QpType, RKey, RemoteQp, SendOp, SendWr,
        WcStatus,
    };
    let net = SimNetwork::perfect();
    let (a, b) = devices(&net, Progress::Thread);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap();
    let o = ConnectOptions::default();
    let remote = |q: &roce_transport::QueuePair, d: &Device| RemoteQp {
        qpn: q.qpn(),
        psn: Psn::new(0),
        gid: d.local_gid(),
    };
    qa.connect(&remote(&qb, &b), &o).unwrap();
    qb.connect(&remote(&qa, &a), &o).unwrap();
    let src = pa.register(vec![7u8; 32], Access::LOCAL_WRITE).unwrap();
    let dst = pb.register(vec![0u8; 32], Access::LOCAL_WRITE).unwrap(); // no remote write
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: RKey::new(dst.rkey().value()),
    };
    qa.post_send(SendWr::new(9, op, vec![src.sge(0, 32)]))
        .unwrap();
    let mut wc = [Completion::EMPTY];
    assert_eq!(ca.wait(&mut wc, Duration::from_secs(5)), 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    assert_eq!(dst.to_vec(), vec![0u8; 32]);
    let (sa, sb) = (a.counters(), b.counters());
    assert_eq!(sb.send_nak_rem_access, 1, "{sb:?}");
    assert_eq!(sa.rcvd_nak_rem_access, 1, "{sa:?}");
    let names: Vec<_> = sa.iter().map(|(n, _)| n).collect();
    for rxe_name in [
        "sent_pkts",
        "rcvd_pkts",
        "duplicate_request",
        "rcvd_rnr_err",
    ] {
        assert!(names.contains(&rxe_name), "{names:?}");
    }
}
