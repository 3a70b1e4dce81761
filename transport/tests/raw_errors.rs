//! Opening the raw backend wrongly fails with an error that says what to do, and an
//! unreachable peer is reported instead of silently eating datagrams.

mod raw_util;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use raw_util::{can_run, datagram, drain, open, transfer};
use roce_testkit::netns::{NetnsEnd, NetnsPair};
use roce_transport::datapath::raw::{RawDatapath, RawError, RawOptions};
use roce_transport::datapath::Datapath;

fn try_open(end: &NetnsEnd, ifname: &str, ip: IpAddr) -> Result<RawDatapath, RawError> {
    end.netns()
        .enter_scoped(|| RawDatapath::open(ifname, ip, RawOptions::default()))
        .unwrap()
}

#[test]
fn raw_errors_on_open_say_what_is_wrong() {
    if !can_run("raw_errors_on_open_say_what_is_wrong") {
        return;
    }
    let pair = NetnsPair::create("rerr").unwrap();
    let a = pair.a();
    let ip_a: IpAddr = a.ipv4().into();

    let e = try_open(a, "nosuch0", ip_a).unwrap_err();
    let RawError::NoSuchInterface { available, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(available, "lo, veth-a", "{e}");
    assert!(e.to_string().contains("nosuch0"), "{e}");

    // B's address is not on A's interface; the message lists A's addresses.
    let e = try_open(a, a.ifname(), pair.b().ipv4().into()).unwrap_err();
    assert!(matches!(e, RawError::AddressNotOnInterface { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&a.ipv4().to_string()), "{text}");
    assert!(text.contains(&a.ipv6().to_string()), "{text}");

    let e = try_open(a, "lo", "127.0.0.1".parse().unwrap()).unwrap_err();
    assert!(matches!(e, RawError::NotEthernet { .. }), "{e:?}");

    // Two stacks on one address: the second fails clearly, whichever came first.
    let first = open(a, ip_a, RawOptions::default());
    let e = try_open(a, a.ifname(), ip_a).unwrap_err();
    assert!(matches!(e, RawError::AddrInUse { .. }), "{e:?}");
    assert!(e.to_string().contains("already in use"), "{e}");
    drop(first);
    let kernel = retry_in_use(|| {
        a.netns()
            .enter_scoped(|| UdpSocket::bind(SocketAddr::new(ip_a, 4791)))
            .unwrap()
    });
    let e = try_open(a, a.ifname(), ip_a).unwrap_err();
    assert!(matches!(e, RawError::AddrInUse { .. }), "{e:?}");
    drop(kernel);
    // And the address is free again once the other stack is gone.
    drop(retry_in_use(|| {
        try_open(a, a.ifname(), ip_a).map_err(io::Error::from)
    }));
}

/// Retries `f` while it fails with `AddrInUse`, for up to a second. A closed socket stays
/// bound while a child process forked meanwhile (the other tests run `ip` all the time)
/// has not reached `exec`, which closes its copy.
fn retry_in_use<T>(mut f: impl FnMut() -> io::Result<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn raw_errors_unreachable_peer_is_reported() {
    if !can_run("raw_errors_unreachable_peer_is_reported") {
        return;
    }
    let pair = NetnsPair::create("runr").unwrap();
    let a = pair.a();
    let opts = RawOptions {
        resolve_attempts: 3,
        resolve_interval: Duration::from_millis(40),
        unreachable_hold: Duration::from_secs(30),
        ..RawOptions::default()
    };
    let mut dp = open(a, a.ipv4().into(), opts);
    let o = a.ipv4().octets();
    let nobody: IpAddr = [o[0], o[1], o[2], 99].into();
    let dst = SocketAddr::new(nobody, 4791);
    let p = [1u8; 64];
    let batch: Vec<_> = (0..5).map(|i| datagram(dst, i, &p)).collect();
    // Queued while ARP runs.
    assert_eq!(dp.send(&batch).unwrap(), 5);
    let start = Instant::now();
    let mut ignored = Vec::new();
    while dp.last_error().is_none() && start.elapsed() < Duration::from_secs(5) {
        if let Some(d) = dp.next_wakeup() {
            std::thread::sleep(d);
        }
        drain(&mut dp, &mut ignored);
    }
    let waited = start.elapsed();
    assert!(
        matches!(dp.last_error(), Some(RawError::Unreachable(ip)) if *ip == nobody),
        "{:?}",
        dp.last_error()
    );
    assert!(
        waited >= Duration::from_millis(80),
        "gave up after {waited:?}"
    );
    let s = dp.stats();
    assert_eq!(
        (s.arp_requests, s.tx_queued, s.tx_unresolved),
        (3, 5, 5),
        "{s:?}"
    );
    // While the failure holds, sends to it fail at once, with a clear error.
    let e = dp.send(&batch).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::HostUnreachable);
    assert!(e.to_string().contains("is unreachable"), "{e}");
    assert_eq!(dp.stats().tx_unreachable, 1);
    assert_eq!(dp.next_wakeup(), None);
}

#[test]
fn raw_errors_refuses_oversize_and_other_family() {
    if !can_run("raw_errors_refuses_oversize_and_other_family") {
        return;
    }
    let pair = NetnsPair::create("rbad").unwrap();
    let a = pair.a();
    let mut dp = open(a, a.ipv4().into(), RawOptions::default());
    let big = vec![0u8; 1473];
    let dst = SocketAddr::new(pair.b().ipv4().into(), 4791);
    let e = dp.send(&[datagram(dst, 0, &big)]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("MTU 1500"), "{e}");
    let v6 = SocketAddr::new(pair.b().ipv6().into(), 4791);
    let e = dp.send(&[datagram(v6, 0, &big[..10])]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    // A bad datagram after good ones: the good prefix is taken, the bad one refused next.
    let ok = [0u8; 10];
    let batch = [datagram(dst, 0, &ok), datagram(dst, 1, &big)];
    assert_eq!(dp.send(&batch).unwrap(), 1);
}

#[test]
fn raw_errors_static_neighbour_needs_no_resolution() {
    if !can_run("raw_errors_static_neighbour_needs_no_resolution") {
        return;
    }
    let pair = NetnsPair::create("rstat").unwrap();
    let (a, b) = (pair.a(), pair.b());
    let opts = RawOptions {
        static_neighbours: vec![(b.ipv4().into(), b.mac())],
        ..RawOptions::default()
    };
    let mut tx = open(a, a.ipv4().into(), opts);
    let mut rx = open(b, b.ipv4().into(), RawOptions::default());
    let p = [5u8; 100];
    let dst = rx.local_addr();
    let got = transfer(&mut tx, &mut rx, &[datagram(dst, 0, &p)]);
    assert_eq!(got.len(), 1);
    let s = tx.stats();
    assert_eq!(
        (s.arp_requests, s.tx_queued, s.tx_frames),
        (0, 0, 1),
        "{s:?}"
    );
}
