//! `NetnsPair`: two namespaces joined by veth, usable at once over IPv4 and IPv6, with the
//! MTU asked for, lossy on demand, and gone when dropped.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsEnd, NetnsPair, Side};

fn bind(end: &NetnsEnd, addr: SocketAddr) -> UdpSocket {
    let s = end
        .netns()
        .enter_scoped(|| UdpSocket::bind(addr))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

/// A ping-pong over UDP between the two namespaces.
fn ping(a: &NetnsEnd, b: &NetnsEnd, a_addr: SocketAddr, b_addr: SocketAddr) {
    let sa = bind(a, a_addr);
    let sb = bind(b, b_addr);
    sa.send_to(b"ping", sb.local_addr().unwrap()).unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = sb.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"ping"[..], sa.local_addr().unwrap()));
    sb.send_to(b"pong", from).unwrap();
    let (n, from) = sa.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"pong"[..], sb.local_addr().unwrap()));
}

#[test]
fn netns_pair_exchanges_udp_and_is_removed_on_drop() {
    if !netns_or_skip("netns_pair_exchanges_udp_and_is_removed_on_drop") {
        return;
    }
    let started = Instant::now();
    let pair = NetnsPair::create("np").unwrap();
    eprintln!("pair created in {:?}", started.elapsed());
    let (a, b) = (pair.a(), pair.b());
    assert_ne!(a.ns_name(), b.ns_name());
    assert!(a.ns_name().starts_with("roce-np-"), "{}", a.ns_name());
    assert_eq!((a.ifname(), b.ifname()), ("veth-a", "veth-b"));
    assert_eq!(a.ipv4().octets()[..3], b.ipv4().octets()[..3]);
    assert_eq!((a.ipv4().octets()[3], b.ipv4().octets()[3]), (1, 2));
    ping(
        a,
        b,
        SocketAddr::new(a.ipv4().into(), 0),
        SocketAddr::new(b.ipv4().into(), 0),
    );
    ping(
        a,
        b,
        SocketAddr::new(a.ipv6().into(), 0),
        SocketAddr::new(b.ipv6().into(), 0),
    );
    // The interfaces have the MACs and MTU we were told.
    let link = a
        .netns()
        .exec("ip", &["link", "show", "dev", "veth-a"])
        .unwrap();
    let mac = a.mac().map(|x| format!("{x:02x}")).join(":");
    assert!(link.contains(&mac) && link.contains("mtu 1500"), "{link}");
    // Each namespace sees only its own end.
    let names = b
        .netns()
        .enter_scoped(|| {
            let mut v: Vec<String> = pnet_datalink::interfaces()
                .into_iter()
                .map(|i| i.name)
                .collect();
            v.sort();
            v
        })
        .unwrap();
    assert_eq!(names, ["lo", "veth-b"]);

    let paths = [a.netns().path(), b.netns().path()];
    assert!(paths.iter().all(|p| p.exists()));
    drop(pair);
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?} left behind");
}

#[test]
fn netns_pair_jumbo_mtu() {
    if !netns_or_skip("netns_pair_jumbo_mtu") {
        return;
    }
    let pair = NetnsPair::create_with_mtu("npj", 9000).unwrap();
    assert_eq!(pair.mtu(), 9000);
    let (a, b) = (pair.a(), pair.b());
    let sa = bind(a, SocketAddr::new(a.ipv4().into(), 0));
    let sb = bind(b, SocketAddr::new(b.ipv4().into(), 0));
    // 8972 bytes of UDP payload: one 9000-byte IP packet.
    let big = vec![0x5Au8; 8972];
    sa.send_to(&big, sb.local_addr().unwrap()).unwrap();
    let mut buf = vec![0u8; 10_000];
    let (n, _) = sb.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], &big[..]);
    let link = b
        .netns()
        .exec("ip", &["link", "show", "dev", "veth-b"])
        .unwrap();
    assert!(link.contains("mtu 9000"), "{link}");
}

#[test]
fn netns_pair_loss_on_kernel_udp() {
    if !netns_or_skip("netns_pair_loss_on_kernel_udp") {
        return;
    }
    const COUNT: usize = 2000;
    let pair = NetnsPair::create("nploss").unwrap();
    let (a, b) = (pair.a(), pair.b());
    let sa = bind(a, SocketAddr::new(a.ipv4().into(), 0));
    let sb = bind(b, SocketAddr::new(b.ipv4().into(), 4791));
    sb.set_nonblocking(true).unwrap();
    let dst = sb.local_addr().unwrap();
    let run = || {
        let mut got = 0;
        let mut buf = [0u8; 64];
        let mut drain = |got: &mut usize| loop {
            match sb.recv_from(&mut buf) {
                Ok(_) => *got += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("{e}"),
            }
        };
        for i in 0..COUNT {
            sa.send_to(&(i as u32).to_be_bytes(), dst).unwrap();
            if i % 100 == 99 {
                drain(&mut got);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        drain(&mut got);
        COUNT - got
    };
    // Both directions can be made lossy; here A's sends are.
    pair.set_loss(Side::A, 10).unwrap();
    let rules = a.netns().exec("nft", &["list", "ruleset"]).unwrap();
    assert!(rules.contains("hook egress device \"veth-a\""), "{rules}");
    // Setting it again replaces the rule.
    pair.set_loss(Side::A, 10).unwrap();
    let lost = run();
    eprintln!("10% loss on kernel UDP: {lost} of {COUNT} lost");
    assert!(
        (COUNT * 3 / 100..=COUNT * 20 / 100).contains(&lost),
        "{lost}"
    );
    pair.clear_loss(Side::A).unwrap();
    assert_eq!(run(), 0);
    // Clearing twice is fine; more than 100% is refused.
    pair.clear_loss(Side::A).unwrap();
    let e = pair.set_loss(Side::B, 101).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn netns_run_in_reports_missing_namespace() {
    let e = roce_testkit::netns::run_in("roce-no-such-namespace", || ()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("roce-no-such-namespace"), "{e}");
    assert!(!Path::new("/run/netns/roce-no-such-namespace").exists());
}
