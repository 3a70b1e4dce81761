//! Devices with several engines ([`DeviceConfig::engines`]): one `udp` socket per engine in
//! one reuseport group steered by DestQP, every QP on the engine `QPN % n`, and what NAPI GRO
//! merged across engines handed on in process.
//!
//! Loopback tests run in a private network namespace each (`roce_testkit::netns::private_net`);
//! the veth test needs root (the test kit's skip policy).

use std::net::IpAddr;
use std::time::Duration;

use roce_testkit::netns::{netns_or_skip, private_net, NetnsPair};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceConfig, DeviceCounters, OpenError, Progress,
    Psn, QpInit, QpType, RemoteQp, SendOp, SendWr, SimNetwork, WcStatus,
};

fn open(ip: &str, engines: usize, progress: Progress) -> Device {
    let cfg = DeviceConfig::udp(ip.parse().unwrap())
        .name(format!("eng-{ip}"))
        .exclusive()
        .engines(engines)
        .progress(progress);
    Device::open(cfg).unwrap_or_else(|e| panic!("open {ip} with {engines} engines: {e}"))
}

/// Holds one QP on a device (for the least-loaded placement: the next QP goes elsewhere).
struct Holder {
    _pd: roce_transport::ProtectionDomain,
    _cq: roce_transport::CompletionQueue,
    qp: roce_transport::QueuePair,
}

fn hold(d: &Device) -> Holder {
    let pd = d.alloc_pd();
    let cq = d.create_cq(4).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    Holder {
        _pd: pd,
        _cq: cq,
        qp,
    }
}

fn opts() -> SelftestOptions {
    SelftestOptions {
        sizes: vec![0, 1, 4097, 65_536, 1 << 20],
        iterations: 2,
        ud_sizes: vec![0, 64, 4096],
        ..SelftestOptions::default()
    }
}

/// Every engine's counters of `d`, checked: nothing handed on or in (loopback runs no NAPI
/// GRO and our GSO messages keep to one DestQP, so the kernel's steering put every datagram
/// on its owner), no datagram for a QP its engine does not have, and every engine received.
fn check_steered(name: &str, d: &Device) -> Vec<DeviceCounters> {
    let per = d.engine_counters();
    eprintln!("{name}: {per:#?}");
    assert_eq!(per.len(), d.engines());
    for (i, c) in per.iter().enumerate() {
        assert_eq!(
            (c.rx_handed_on, c.rx_handed_in),
            (0, 0),
            "{name} engine {i}: the kernel steered every datagram to its owner"
        );
        assert_eq!(
            c.rx_drop_no_qp, 0,
            "{name} engine {i}: a datagram for another engine's QP"
        );
        assert_eq!(
            c.rx_icrc_errors + c.rx_drop_malformed,
            0,
            "{name} engine {i}"
        );
        assert!(
            c.rx_delivered > 0,
            "{name} engine {i} received nothing: {per:?}"
        );
        assert!(c.tx_packets > 0, "{name} engine {i} sent nothing: {per:?}");
    }
    let mut sum = DeviceCounters::default();
    for c in &per {
        sum.add(c);
    }
    assert_eq!(
        sum,
        d.device_counters(),
        "{name}: the device's counters are the engines' sum"
    );
    per
}

/// Two devices with 2 engines each over loopback: RC (SEND, WRITE, WRITE_WITH_IMM, READ at
/// sizes up to 1 MiB, both atomics) and UD between QPs on every combination of engines, data
/// checked byte for byte by the selftest; each engine received only its own QPs' datagrams.
fn every_verb_across_engines(progress: Progress) {
    let _net = private_net();
    let a = open("127.0.0.1", 2, progress);
    let b = open("127.0.0.2", 2, progress);
    for d in [&a, &b] {
        assert_eq!(d.engines(), 2);
        assert_eq!(d.engines_fallback(), None);
    }
    let o = opts();
    let mut log = |r: &roce_transport::selftest::StepReport| eprintln!("{r}");
    // The selftest's QPs land on the least-loaded engine: holders steer them to every one of
    // (a's engine, b's engine) = (0, 0), (1, 0), (0, 1), (1, 1).
    for (hold_a, hold_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let ha = hold_a.then(|| hold(&a));
        let hb = hold_b.then(|| hold(&b));
        if let Some(h) = &ha {
            assert_eq!(a.engine_of(h.qp.qpn()), 0);
        }
        if let Some(h) = &hb {
            assert_eq!(b.engine_of(h.qp.qpn()), 0);
        }
        run_rc(&a, &b, &o, &mut log).unwrap_or_else(|e| panic!("RC {hold_a}/{hold_b}: {e}"));
        run_ud(&a, &b, &o, &mut log).unwrap_or_else(|e| panic!("UD {hold_a}/{hold_b}: {e}"));
    }
    // Two QPs at once, one per engine, WRITEs in flight on both.
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa: Vec<_> = (0..2)
        .map(|_| pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap())
        .collect();
    let qb: Vec<_> = (0..2)
        .map(|_| pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap())
        .collect();
    let engines: Vec<usize> = qa.iter().map(|q| a.engine_of(q.qpn())).collect();
    assert_eq!(engines, vec![0, 1], "least-loaded placement");
    for (x, y) in qa.iter().zip(&qb) {
        let c = ConnectOptions::default();
        let me = |q: &roce_transport::QueuePair, d: &Device| RemoteQp {
            qpn: q.qpn(),
            psn: Psn::new(0),
            gid: d.local_gid(),
        };
        x.connect(&me(y, &b), &c).unwrap();
        y.connect(&me(x, &a), &c).unwrap();
    }
    const LEN: usize = 1 << 20;
    let src: Vec<_> = (0..2u8)
        .map(|i| pa.register(vec![i + 1; LEN], Access::LOCAL_WRITE).unwrap())
        .collect();
    let dst: Vec<_> = (0..2)
        .map(|_| {
            pb.register(vec![0u8; LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap()
        })
        .collect();
    for i in 0..2 {
        let op = SendOp::RdmaWrite {
            remote_addr: dst[i].addr(),
            rkey: dst[i].rkey(),
        };
        qa[i]
            .post_send(SendWr::new(i as u64, op, vec![src[i].sge(0, LEN)]))
            .unwrap();
    }
    let mut done = 0;
    let mut wc = [Completion::EMPTY; 4];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while done < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the WRITEs did not complete"
        );
        // With manual progress nobody else drives b.
        b.progress();
        let n = ca.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
        done += n;
    }
    for (i, d) in dst.iter().enumerate() {
        let mut got = vec![0u8; LEN];
        d.read(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&x| x == i as u8 + 1),
            "QP {i}'s WRITE landed whole"
        );
    }
    for (name, d) in [("a", &a), ("b", &b)] {
        let per = check_steered(name, d);
        // What each engine's QPs processed came through that engine.
        assert!(per.iter().all(|c| c.rx_packets == c.rx_delivered));
    }
    assert_eq!(a.last_error(), None);
}

#[test]
fn every_verb_across_two_engines_with_engine_threads() {
    every_verb_across_engines(Progress::Thread);
}

#[test]
fn every_verb_across_two_engines_with_manual_progress() {
    every_verb_across_engines(Progress::Manual);
}

/// Where the datagrams cannot be steered, a device asked for several engines runs one and
/// says why; `engines(1)` is today's device.
#[test]
fn without_steering_a_device_runs_one_engine_and_says_why() {
    let net = SimNetwork::perfect();
    let d = Device::open(DeviceConfig::sim(&net, "10.7.0.1".parse().unwrap()).engines(4)).unwrap();
    assert_eq!(d.engines(), 1);
    assert!(d.engines_fallback().unwrap().contains("udp"));
    let _net = private_net();
    let one = open("127.0.0.1", 1, Progress::Thread);
    assert_eq!((one.engines(), one.engines_fallback()), (1, None));
    let zero = Device::open(
        DeviceConfig::udp("127.0.0.2".parse().unwrap())
            .exclusive()
            .engines(0),
    )
    .unwrap();
    assert_eq!(zero.engines(), 1, "engines(0) means one");
}

/// Port 0 (an ephemeral port, as `rocectl devinfo` opens to read the limits): the first
/// engine's socket gets the port and the others join it, so the device runs every engine it
/// asked for; two such devices on one address get a port each.
#[test]
fn an_ephemeral_port_is_shared_by_the_engines() {
    let _net = private_net();
    let eph = |n: usize| {
        Device::open(
            DeviceConfig::new(roce_transport::Backend::Udp {
                local: "127.0.0.1".parse().unwrap(),
                port: 0,
            })
            .exclusive()
            .engines(n),
        )
        .unwrap_or_else(|e| panic!("port 0 with {n} engines: {e}"))
    };
    let a = eph(3);
    let b = eph(2);
    assert_eq!((a.engines(), a.engines_fallback()), (3, None));
    assert_eq!(b.engines(), 2);
    let (pa, pb) = (a.local_addr().port(), b.local_addr().port());
    assert!(pa != 0 && pb != 0 && pa != pb, "ports {pa} and {pb}");
}

/// Nobody shares a sharded device's address silently: another sharded device on it fails
/// (the group check), and so does a one-engine device (no `SO_REUSEPORT`), both with
/// "address in use"; once the first is closed the address is free again.
#[test]
fn a_second_device_cannot_join_a_sharded_address() {
    let _net = private_net();
    let first = open("127.0.0.1", 2, Progress::Thread);
    for engines in [2, 3, 1] {
        let cfg = DeviceConfig::udp("127.0.0.1".parse().unwrap())
            .exclusive()
            .engines(engines);
        match Device::open(cfg) {
            Err(OpenError::AddrInUse { detail, .. }) => {
                eprintln!("{engines} engines: {detail}");
            }
            other => panic!("{engines} engines on a sharded address: {other:?}"),
        }
    }
    // The first device's steering survived the attempts: its engines still get their own.
    let second = open("127.0.0.2", 2, Progress::Thread);
    let o = SelftestOptions {
        sizes: vec![4096],
        ud_sizes: vec![64],
        ..SelftestOptions::default()
    };
    let _h = hold(&first);
    run_rc(&first, &second, &o, &mut |_| {}).unwrap();
    let per = first.engine_counters();
    assert!(
        per.iter()
            .all(|c| c.rx_handed_on == 0 && c.rx_drop_no_qp == 0),
        "{per:?}"
    );
    drop(first);
    drop(_h);
    let again = open("127.0.0.1", 2, Progress::Thread);
    assert_eq!(again.engines(), 2);
}

/// A kernel-demux member (a daemon that started serving the address after the sharded device
/// opened) cannot join the sharded device's reuseport group: it finds the device's marker
/// before attaching its program and backs out with "address in use", so the device's own
/// steering survives; once the device closes, the member joins.
#[test]
fn a_kernel_demux_member_cannot_join_a_sharded_address() {
    use roce_transport::datapath::demux::{Demux, DemuxError, DemuxGroup, SlotLayout};
    use roce_transport::datapath::udp::{UdpDatapath, UdpError, UdpOptions};
    let test = "a_kernel_demux_member_cannot_join_a_sharded_address";
    if !roce_testkit::require_root(test, "loading the BPF steering program needs CAP_BPF") {
        return;
    }
    let group = match DemuxGroup::create(SlotLayout::DEFAULT) {
        Ok(g) => g,
        Err(e @ DemuxError::NoPrivilege { .. }) => {
            roce_testkit::skip(test, e);
            return;
        }
        Err(e) => panic!("create the demux group: {e}"),
    };
    let _net = private_net();
    let addr: std::net::SocketAddr = "127.0.0.1:4791".parse().unwrap();
    let first = open("127.0.0.1", 2, Progress::Thread);
    let member = || {
        let d = Demux::new(group.try_clone().unwrap(), 1).unwrap();
        UdpDatapath::bind_demux(addr, UdpOptions::default(), &d)
    };
    match member() {
        Err(UdpError::DemuxShardedHolder { addr: a }) => assert_eq!(a, addr),
        other => panic!("a demux member on a sharded address: {other:?}"),
    }
    assert!(
        group.occupant(1).unwrap().is_none(),
        "the member never joined"
    );
    let leased = Device::open(
        DeviceConfig::udp(addr.ip()).demux(Demux::new(group.try_clone().unwrap(), 2).unwrap()),
    );
    match leased {
        Err(OpenError::AddrInUse { detail, .. }) => {
            assert!(detail.contains("several engines"), "{detail}");
        }
        other => panic!("a leased device on a sharded address: {other:?}"),
    }
    // The first device's steering is its own still: every datagram reached its engine.
    let second = open("127.0.0.2", 2, Progress::Thread);
    let o = SelftestOptions {
        sizes: vec![4096],
        ud_sizes: vec![64],
        ..SelftestOptions::default()
    };
    let h = hold(&first);
    run_rc(&first, &second, &o, &mut |_| {}).unwrap();
    let per = first.engine_counters();
    assert!(
        per.iter()
            .all(|c| c.rx_handed_on == 0 && c.rx_drop_no_qp == 0),
        "{per:?}"
    );
    assert!(first.device_counters().rx_delivered > 0, "{per:?}");
    drop(h);
    drop(first);
    let m = member().expect("the address is free once the sharded device closed");
    assert_eq!(m.demux_slot(), Some(1));
}

/// Off loopback NAPI GRO merges one flow's datagrams by ports before the steering program
/// runs: a peer's WRITEs to two QPs on two engines (one flow, source port 4791) arrive in
/// merged buffers whose first datagram's engine receives them all. Every datagram still
/// reaches its own QP: the receiving engine hands the others on through the owner's inbox,
/// and the data arrives whole. The veth end receives as a NIC does (GRO on, threaded NAPI,
/// the sender without TSO so that veth takes the NAPI path), as in `demux.rs`'s relay test.
#[test]
fn gro_merged_datagrams_reach_their_own_engine_through_the_inbox() {
    let test = "gro_merged_datagrams_reach_their_own_engine_through_the_inbox";
    if !netns_or_skip(test) {
        return;
    }
    let pair = NetnsPair::create("engines").expect("veth pair");
    for (end, cmd) in [
        // No TSO (veth's NAPI path) and no UDP segmentation offload: the kernel cuts our GSO
        // messages before the veth, so the datagrams cross it one by one, as on a wire.
        (
            pair.b(),
            format!(
                "ethtool -K {} tso off tx-udp-segmentation off",
                pair.b().ifname()
            ),
        ),
        (pair.a(), format!("ethtool -K {} gro on", pair.a().ifname())),
        (
            pair.a(),
            format!("echo 1 > /sys/class/net/{}/threaded", pair.a().ifname()),
        ),
    ] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", end.ns_name(), "sh", "-c", &cmd])
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    let open_in = |end: &roce_testkit::netns::NetnsEnd, engines: usize| {
        let ip = IpAddr::V4(end.ipv4());
        end.netns()
            .enter_scoped(|| {
                Device::open(
                    DeviceConfig::udp(ip)
                        .name(format!("veth-{engines}"))
                        .exclusive()
                        .engines(engines),
                )
            })
            .expect("enter the namespace")
            .unwrap_or_else(|e| panic!("open {ip}: {e}"))
    };
    let a = open_in(pair.a(), 2);
    let b = open_in(pair.b(), 1);
    assert_eq!(a.engines(), 2);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(256).unwrap());
    let qa: Vec<_> = (0..2)
        .map(|_| pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap())
        .collect();
    let qb: Vec<_> = (0..2)
        .map(|_| pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap())
        .collect();
    assert_eq!(
        qa.iter().map(|q| a.engine_of(q.qpn())).collect::<Vec<_>>(),
        vec![0, 1]
    );
    for (x, y) in qa.iter().zip(&qb) {
        let c = ConnectOptions::default();
        x.connect(
            &RemoteQp {
                qpn: y.qpn(),
                psn: Psn::new(0),
                gid: b.local_gid(),
            },
            &c,
        )
        .unwrap();
        y.connect(
            &RemoteQp {
                qpn: x.qpn(),
                psn: Psn::new(0),
                gid: a.local_gid(),
            },
            &c,
        )
        .unwrap();
    }
    // b WRITEs into a's two QPs' memory at once, rounds of 1 MiB each, until GRO merged some
    // of the two QPs' datagrams (bounded).
    const LEN: usize = 1 << 20;
    let src: Vec<_> = (0..2u8)
        .map(|i| {
            pb.register(vec![0x10 + i; LEN], Access::LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    let dst: Vec<_> = (0..2)
        .map(|_| {
            pa.register(vec![0u8; LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap()
        })
        .collect();
    let mut rounds = 0;
    let handed = |d: &Device| {
        d.engine_counters()
            .iter()
            .map(|c| c.rx_handed_on)
            .sum::<u64>()
    };
    while rounds < 40 && (rounds < 4 || handed(&a) == 0) {
        rounds += 1;
        for i in 0..2 {
            let op = SendOp::RdmaWrite {
                remote_addr: dst[i].addr(),
                rkey: dst[i].rkey(),
            };
            qb[i]
                .post_send(SendWr::new(i as u64, op, vec![src[i].sge(0, LEN)]))
                .unwrap();
        }
        let mut done = 0;
        let mut wc = [Completion::EMPTY; 4];
        while done < 2 {
            let n = cb.wait(&mut wc, Duration::from_secs(20));
            assert!(n > 0, "round {rounds}: the WRITEs did not complete");
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
            }
            done += n;
        }
    }
    for (i, d) in dst.iter().enumerate() {
        let mut got = vec![0u8; LEN];
        d.read(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 0x10 + i as u8), "QP {i}'s data");
    }
    let per = a.engine_counters();
    eprintln!("{test}: {rounds} rounds, engines {per:#?}");
    let on: u64 = per.iter().map(|c| c.rx_handed_on).sum();
    let inn: u64 = per.iter().map(|c| c.rx_handed_in).sum();
    assert!(
        on > 0,
        "NAPI GRO merged no datagrams of two engines' QPs: the case was not exercised"
    );
    assert_eq!(on, inn, "everything handed on was handed in");
    for (i, c) in per.iter().enumerate() {
        assert_eq!(c.rx_drop_no_qp + c.rx_drop_kernel, 0, "engine {i}: {c:?}");
    }
    // Retransmissions are not asserted: datagrams sent one by one overflow the veth's ring
    // now and then (a one-engine receiver sees ~2000 retransmitted of 80 MiB here too).
}
