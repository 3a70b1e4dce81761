//! The `raw` backend against the kernel's own IP stack across a veth pair: raw → kernel UDP
//! socket and kernel UDP socket → raw, over IPv4 and IPv6, without static neighbours (so ARP
//! and neighbour discovery work both ways, and the kernel accepts our checksums); UDP GSO
//! from a local kernel sender; and a RoCE frame the raw backend emits, captured on the peer,
//! is byte-for-byte the frame `roce_wire` builds and passes the ICRC check.

mod raw_util;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use raw_util::{can_run, datagram, drain, open, payload, Got, WAIT};
use roce_testkit::netns::{NetnsEnd, NetnsPair};
use roce_transport::datapath::raw::{RawDatapath, RawOptions};
use roce_transport::datapath::{Datapath, Ipv4Info, TxDatagram};
use roce_wire::frame::{EthRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{icrc, samples, Caps, Frame, Opcode};

fn addrs(pair: &NetnsPair, v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        (pair.a().ipv6().into(), pair.b().ipv6().into())
    } else {
        (pair.a().ipv4().into(), pair.b().ipv4().into())
    }
}

/// A non-blocking kernel UDP socket bound to `addr` inside `end`'s namespace.
fn kernel_socket(end: &NetnsEnd, addr: SocketAddr) -> UdpSocket {
    let s = end
        .netns()
        .enter_scoped(|| UdpSocket::bind(addr))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    s.set_nonblocking(true).unwrap();
    s
}

fn sizes(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..=40).collect();
    v.extend((41..max).step_by(97));
    v.push(max);
    v
}

fn raw_to_kernel(tag: &str, v6: bool) {
    let pair = NetnsPair::create(tag).unwrap();
    let (ip_a, ip_b) = addrs(&pair, v6);
    let mut a = open(pair.a(), ip_a, RawOptions::default());
    let sock = kernel_socket(pair.b(), SocketAddr::new(ip_b, ROCEV2_PORT));
    let max = if v6 { 1452 } else { 1472 };
    let sizes = sizes(max);
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| payload(i, n))
        .collect();
    let dst = sock.local_addr().unwrap();
    let batch: Vec<TxDatagram<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| datagram(dst, i, p))
        .collect();
    let deadline = Instant::now() + WAIT;
    let mut done = 0;
    let mut got: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let mut buf = vec![0u8; 65_536];
    let mut ignored = Vec::new();
    while got.len() < batch.len() && Instant::now() < deadline {
        if done < batch.len() {
            match a.send(&batch[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        drain(&mut a, &mut ignored);
        loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => got.push((buf[..n].to_vec(), from)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("recv: {e}"),
            }
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    assert_eq!(got.len(), batch.len(), "raw stats: {:?}", a.stats());
    for (d, (data, from)) in batch.iter().zip(&got) {
        assert!(
            data == d.payload,
            "payload of {} bytes differs",
            d.payload.len()
        );
        assert_eq!(*from, SocketAddr::new(ip_a, d.src_port));
    }
    // Resolved on the wire, not from the kernel's table (it was empty).
    let s = a.stats();
    assert!(s.arp_requests + s.neighbour_solicitations >= 1, "{s:?}");
    assert_eq!(a.neighbour(ip_b), Some(pair.b().mac()));
}

fn kernel_to_raw(tag: &str, v6: bool) {
    let pair = NetnsPair::create(tag).unwrap();
    let (ip_a, ip_b) = addrs(&pair, v6);
    let mut a = open(pair.a(), ip_a, RawOptions::default());
    let sock = kernel_socket(pair.b(), SocketAddr::new(ip_b, 0));
    if !v6 {
        set_pmtudisc_do(&sock);
    }
    let from = sock.local_addr().unwrap();
    let max = if v6 { 1452 } else { 1472 };
    let sizes = sizes(max);
    let mut got: Vec<Got> = Vec::new();
    // Other ports never reach the backend: the socket filter drops them in the kernel.
    for _ in 0..10 {
        sock.send_to(b"not roce", SocketAddr::new(ip_a, ROCEV2_PORT + 1))
            .unwrap();
    }
    for (i, &n) in sizes.iter().enumerate() {
        let p = payload(i, n);
        sock.send_to(&p, a.local_addr()).unwrap();
        // Keep the socket buffers small: read as we go.
        drain(&mut a, &mut got);
    }
    let deadline = Instant::now() + WAIT;
    while got.len() < sizes.len() && Instant::now() < deadline {
        drain(&mut a, &mut got);
        std::thread::sleep(Duration::from_micros(300));
    }
    assert_eq!(got.len(), sizes.len(), "raw stats: {:?}", a.stats());
    for (i, (&n, g)) in sizes.iter().zip(&got).enumerate() {
        assert_eq!(g.data, payload(i, n), "datagram {i} of {n} bytes");
        assert_eq!(g.meta.src, from);
        assert_eq!(g.meta.dst, a.local_addr());
        if v6 {
            assert_eq!(g.meta.ipv4, None);
        } else {
            // An unconnected kernel UDP socket with IP_PMTUDISC_DO sends DF with
            // Identification 0: the `udp` backend's contract, seen here on the wire.
            assert_eq!(
                g.meta.ipv4,
                Some(Ipv4Info {
                    ident: 0,
                    dont_fragment: true
                })
            );
        }
    }
    let s = a.stats();
    assert_eq!(
        s.rx_bad_checksum + s.rx_bad_ip + s.rx_bad_udp_len,
        0,
        "{s:?}"
    );
    assert_eq!(s.rx_not_for_us + s.rx_not_udp + s.rx_not_ip, 0, "{s:?}");
    assert_eq!(s.rx_frames, s.rx_datagrams + s.neighbour_rx, "{s:?}");
}

#[test]
fn raw_interop_raw_to_kernel_udp_ipv4() {
    if can_run("raw_interop_raw_to_kernel_udp_ipv4") {
        raw_to_kernel("ri4", false);
    }
}

#[test]
fn raw_interop_raw_to_kernel_udp_ipv6() {
    if can_run("raw_interop_raw_to_kernel_udp_ipv6") {
        raw_to_kernel("ri6", true);
    }
}

#[test]
fn raw_interop_kernel_udp_to_raw_ipv4() {
    if can_run("raw_interop_kernel_udp_to_raw_ipv4") {
        kernel_to_raw("ki4", false);
    }
}

#[test]
fn raw_interop_kernel_udp_to_raw_ipv6() {
    if can_run("raw_interop_kernel_udp_to_raw_ipv6") {
        kernel_to_raw("ki6", true);
    }
}

/// Sets `IP_MTU_DISCOVER` to `IP_PMTUDISC_DO`, as the `udp` backend does: DF on every
/// packet and, from an unconnected socket, Identification 0.
fn set_pmtudisc_do(sock: &UdpSocket) {
    let value: libc::c_int = libc::IP_PMTUDISC_DO;
    #[allow(unsafe_code)]
    // SAFETY: passes a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "IP_MTU_DISCOVER: {}", io::Error::last_os_error());
}

/// Sets `UDP_SEGMENT` (UDP GSO) on a socket.
fn set_udp_segment(sock: &UdpSocket, size: u16) -> io::Result<()> {
    const UDP_SEGMENT: libc::c_int = 103;
    let value = libc::c_int::from(size);
    #[allow(unsafe_code)]
    // SAFETY: passes a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// UDP GSO from a local kernel sender (with `IP_PMTUDISC_DO`, like the `udp` backend).
/// Over veth the GSO frame crosses unsegmented and the raw backend splits it into its
/// datagrams. With `segment_first`, the sender's veth takes one segment per frame
/// (`gso_max_segs 1`), so the kernel segments in software before the wire, as it does for a
/// NIC without UDP segmentation offload.
fn gso_to_raw(tag: &str, v6: bool, segment_first: bool) {
    let pair = NetnsPair::create(tag).unwrap();
    let (ip_a, ip_b) = addrs(&pair, v6);
    if segment_first {
        let b = pair.b();
        b.netns()
            .exec(
                "ip",
                &["link", "set", "dev", b.ifname(), "gso_max_segs", "1"],
            )
            .unwrap();
    }
    let mut a = open(pair.a(), ip_a, RawOptions::default());
    let sock = kernel_socket(pair.b(), SocketAddr::new(ip_b, 0));
    if !v6 {
        set_pmtudisc_do(&sock);
    }
    if let Err(e) = set_udp_segment(&sock, 1000) {
        roce_testkit::skip(tag, format!("this kernel has no UDP GSO: {e}"));
        return;
    }
    let p = payload(7, 3500);
    sock.send_to(&p, a.local_addr()).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < 4 && Instant::now() < deadline {
        drain(&mut a, &mut got);
        std::thread::sleep(Duration::from_micros(300));
    }
    let s = a.stats();
    let lens: Vec<usize> = got.iter().map(|g| g.data.len()).collect();
    assert_eq!(lens, [1000, 1000, 1000, 500], "{s:?}");
    let joined: Vec<u8> = got.iter().flat_map(|g| g.data.iter().copied()).collect();
    assert_eq!(joined, p);
    assert_eq!(s.rx_gso_frames, u64::from(!segment_first), "{s:?}");
    // Either way, segment k carries Identification k: the kernel numbers segments from the
    // Identification (0) of the GSO frame, and the raw backend does the same when it splits.
    let idents: Vec<Option<Ipv4Info>> = got.iter().map(|g| g.meta.ipv4).collect();
    let want: Vec<Option<Ipv4Info>> = (0..4)
        .map(|k| {
            (!v6).then_some(Ipv4Info {
                ident: k,
                dont_fragment: true,
            })
        })
        .collect();
    assert_eq!(idents, want);
}

#[test]
fn raw_interop_kernel_udp_gso_to_raw_ipv4() {
    if can_run("raw_interop_kernel_udp_gso_to_raw_ipv4") {
        gso_to_raw("gso4", false, false);
    }
}

#[test]
fn raw_interop_kernel_udp_gso_to_raw_ipv6() {
    if can_run("raw_interop_kernel_udp_gso_to_raw_ipv6") {
        gso_to_raw("gso6", true, false);
    }
}

#[test]
fn raw_interop_kernel_udp_gso_segmented_before_the_wire_ipv4() {
    if can_run("raw_interop_kernel_udp_gso_segmented_before_the_wire_ipv4") {
        gso_to_raw("gsos4", false, true);
    }
}

/// Opens a pnet capture on `end`'s interface (inside its namespace).
fn capture(end: &NetnsEnd) -> Box<dyn pnet_datalink::DataLinkReceiver> {
    end.netns()
        .enter_scoped(|| {
            let iface = pnet_datalink::interfaces()
                .into_iter()
                .find(|i| i.name == end.ifname())
                .expect("interface");
            let config = pnet_datalink::Config {
                read_timeout: Some(Duration::from_millis(50)),
                ..Default::default()
            };
            match pnet_datalink::channel(&iface, config) {
                Ok(pnet_datalink::Channel::Ethernet(_, rx)) => rx,
                Ok(_) => panic!("not an Ethernet channel"),
                Err(e) => panic!("capture: {e}"),
            }
        })
        .unwrap()
}

/// RoCE packets of several opcodes, with the ICRC the engine computes (Identification 0, DF),
/// sent by the raw backend: the frame captured on the peer is exactly what `roce_wire` emits
/// for the same headers (IPv4) or differs only in the UDP checksum (IPv6), passes
/// `icrc::verify`, and parses with a full ICRC check; the peer's raw backend reports the
/// Identification and DF the ICRC was computed for.
fn roce_frames_verify(tag: &str, v6: bool) {
    let pair = NetnsPair::create(tag).unwrap();
    let (ip_a, ip_b) = addrs(&pair, v6);
    let mut a = open(pair.a(), ip_a, RawOptions::default());
    let mut b: RawDatapath = open(pair.b(), ip_b, RawOptions::default());
    let mut cap = capture(pair.b());
    let data = samples::pattern(samples::SAMPLE_PMTU);
    let ops = [
        Opcode::RcSendOnly,
        Opcode::RcRdmaWriteFirst,
        Opcode::RcRdmaWriteOnlyWithImmediate,
        Opcode::RcAcknowledge,
        Opcode::RcCompareSwap,
        Opcode::UdSendOnlyWithImmediate,
    ];
    for (i, &op) in ops.iter().enumerate() {
        let packet = samples::packet_for(op, &data);
        let src_port = 0xC100 + i as u16;
        let tos = 0x6A;
        let ip = match (ip_a, ip_b) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                tos,
                ident: 0,
                dont_fragment: true,
                ttl: 64,
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
                src,
                dst,
                traffic_class: tos,
                flow_label: 0x1_2345,
                hop_limit: 64,
            }),
            _ => unreachable!(),
        };
        let repr = FrameRepr {
            eth: Some(EthRepr {
                dst: pair.b().mac(),
                src: pair.a().mac(),
                vlan: None,
            }),
            ip,
            udp: UdpRepr {
                src_port,
                dst_port: ROCEV2_PORT,
                checksum: 0,
            },
        };
        let expected = samples::emit(&repr, &packet);
        let udp_payload = &expected[repr.header_len()..];
        let d = TxDatagram {
            dst: b.local_addr(),
            src_port,
            tos,
            hop_limit: 64,
            flow_label: 0x1_2345,
            payload: udp_payload,
        };
        let got = raw_util::transfer(&mut a, &mut b, &[d]);
        assert_eq!(got.len(), 1, "{op:?}");
        assert_eq!(got[0].data, udp_payload);
        if !v6 {
            assert_eq!(
                got[0].meta.ipv4,
                Some(Ipv4Info {
                    ident: 0,
                    dont_fragment: true
                })
            );
        }
        // Find our frame among whatever else crossed the link.
        let deadline = Instant::now() + WAIT;
        let frame = loop {
            assert!(Instant::now() < deadline, "{op:?} not captured");
            let Ok(f) = cap.next() else { continue };
            match Frame::parse_ethernet(f, &Caps::default()) {
                Ok(parsed) if parsed.repr.udp.src_port == src_port => break f.to_vec(),
                _ => continue,
            }
        };
        let parsed = Frame::parse_ethernet(&frame, &Caps::default())
            .unwrap_or_else(|e| panic!("{op:?}: {e:?}"));
        assert!(icrc::verify(parsed.ip_packet), "{op:?}: ICRC");
        assert_eq!(parsed.packet().unwrap(), packet, "{op:?}");
        let mut want = expected.clone();
        if v6 {
            // Only the UDP checksum (masked from the ICRC) differs: we compute it.
            let at = 14 + 40 + 6;
            assert_ne!(&frame[at..at + 2], &[0, 0]);
            want[at..at + 2].copy_from_slice(&frame[at..at + 2]);
        }
        assert_eq!(frame, want, "{op:?}: frame differs from roce_wire's");
    }
}

#[test]
fn raw_interop_roce_frame_icrc_ipv4() {
    if can_run("raw_interop_roce_frame_icrc_ipv4") {
        roce_frames_verify("icrc4", false);
    }
}

#[test]
fn raw_interop_roce_frame_icrc_ipv6() {
    if can_run("raw_interop_roce_frame_icrc_ipv6") {
        roce_frames_verify("icrc6", true);
    }
}
