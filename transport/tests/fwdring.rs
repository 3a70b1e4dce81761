//! Forwarding mode (`datapath::fwdring`): a forwarder receives on the shared `IP:4791` and
//! copies each datagram into its owner's shared-memory ring; each client's device reads its
//! ring and sends from its own socket.
//!
//! - `forwarding_two_clients_share_one_address_over_veth`: two client devices behind one
//!   forwarder on the same veth address run RC (every operation, data checked) and UD against
//!   a device on the peer address at once; neither sees the other's traffic (`rx_drop_no_qp`
//!   0), the IPv4 ICRC is fully checked through the ring (the forwarder's raw receive passes
//!   the Identification on), and datagrams to a slot with no ring are dropped and counted.
//!
//! Needs root (network namespaces); skips loudly otherwise (panics under `CI`).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roce_testkit::netns::{netns_or_skip, NetnsPair, Side};
use roce_transport::datapath::demux::SlotLayout;
use roce_transport::datapath::fwdring::{Forwarder, RingDatapath, RingProducer};
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{Backend, Device, DeviceConfig, QpInit, QpType};

#[test]
fn forwarding_two_clients_share_one_address_over_veth() {
    let test = "forwarding_two_clients_share_one_address_over_veth";
    if !netns_or_skip(test) {
        return;
    }
    let layout = SlotLayout::DEFAULT;
    let pair = NetnsPair::create("fwd-2").expect("namespaces");
    let a = pair.end(Side::A);
    let shared = SocketAddr::new(a.ipv4().into(), 4791);
    let (p1, f1) = RingProducer::create(1024).unwrap();
    let (p2, f2) = RingProducer::create(1024).unwrap();
    let (mut fwd, c1, c2) = a
        .netns()
        .enter_scoped(|| {
            let dp = UdpDatapath::bind(shared, UdpOptions::default()).expect("daemon socket");
            assert!(dp.raw_receive(), "root: the forwarder sees the IP header");
            let mut fwd = Forwarder::new(Box::new(dp), layout);
            assert!(fwd.add(1, p1).is_none());
            assert!(fwd.add(2, p2).is_none());
            let client = |fds, slot: u32| {
                let dp = RingDatapath::open(fds, shared, UdpOptions::default()).unwrap();
                let cfg = DeviceConfig::new(Backend::Custom(Box::new(dp)))
                    .name(format!("fwd{slot}"))
                    .qpn_range(layout.range(slot).unwrap());
                Device::open(cfg).unwrap_or_else(|e| panic!("client {slot}: {e}"))
            };
            let (c1, c2) = (client(f1, 1), client(f2, 2));
            (fwd, c1, c2)
        })
        .unwrap();
    let peer = pair
        .b()
        .netns()
        .enter_scoped(|| Device::open(DeviceConfig::udp(pair.b().ipv4().into()).name("peer")))
        .unwrap()
        .unwrap();
    assert_eq!(c1.local_addr(), shared);
    assert_eq!(c1.query_device().backend, "fwd");
    for (dev, slot) in [(&c1, 1), (&c2, 2)] {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4).unwrap();
        for _ in 0..8 {
            let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
            assert_eq!(layout.slot_of(qp.qpn().value()), slot);
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let opts = SelftestOptions {
        sizes: vec![0, 1, 4097, 65_536, 1 << 20],
        iterations: 2,
        ud_sizes: vec![0, 64, 1024],
        timeout: Duration::from_secs(30),
        ack_timeout: 12, // ~16 ms: no loss here, only a loaded machine
    };
    let fwd = std::thread::scope(|s| {
        let flag = stop.clone();
        let forwarder = s.spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match fwd.poll() {
                    Ok(0) => {
                        let mut pfd = libc::pollfd {
                            fd: fwd.readiness_fd().unwrap(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        #[allow(unsafe_code)]
                        // SAFETY: one live pollfd.
                        unsafe {
                            libc::poll(&mut pfd, 1, 10);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => panic!("forwarder: {e}"),
                }
            }
            fwd
        });
        let runs: Vec<_> = [&c1, &c2]
            .into_iter()
            .map(|c| {
                let (opts, peer) = (&opts, &peer);
                s.spawn(move || {
                    run_rc(c, peer, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} RC: {e}", c.name()));
                    run_rc(peer, c, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} RC (peer first): {e}", c.name()));
                    run_ud(c, peer, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} UD: {e}", c.name()));
                    run_ud(peer, c, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} UD (peer first): {e}", c.name()));
                })
            })
            .collect();
        for r in runs {
            if r.join().is_err() {
                for d in [&c1, &c2, &peer] {
                    eprintln!("{}: {:?}", d.name(), d.device_counters());
                }
                panic!("a run failed (above)");
            }
        }
        // 30 datagrams to slot 3, which has no ring: dropped by the forwarder.
        let tx = pair
            .b()
            .netns()
            .enter_scoped(|| UdpSocket::bind(SocketAddr::new(IpAddr::from(pair.b().ipv4()), 0)))
            .unwrap()
            .unwrap();
        let q3 = layout.range(3).unwrap().start() + 5;
        let mut d = [0u8; 16];
        d[0] = 0x04;
        d[5..8].copy_from_slice(&q3.to_be_bytes()[1..]);
        for _ in 0..30 {
            tx.send_to(&d, shared).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        forwarder.join().unwrap()
    });
    let st = fwd.stats();
    assert_eq!(st.no_owner, 30, "{st:?}");
    assert!(st.forwarded > 200, "{st:?}");
    for c in [&c1, &c2] {
        let k = c.device_counters();
        assert_eq!(k.rx_drop_no_qp, 0, "{}: {k:?}", c.name());
        assert_eq!(k.rx_icrc_errors, 0, "{}: {k:?}", c.name());
        assert!(k.rx_delivered > 100, "{}: {k:?}", c.name());
    }
}
