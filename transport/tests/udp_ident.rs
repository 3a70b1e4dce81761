//! The IP header contract of the `udp` backend, checked on the wire: every IPv4 datagram it
//! sends carries Identification 0 and DF, so the ICRC the engine computed for that header is
//! right for the packet that really leaves (`roce_wire::icrc::verify` on the captured packet).
//!
//! - on loopback, captured with an `AF_PACKET` socket;
//! - off loopback, on a `tun` interface whose packets we read back: Linux segments GSO
//!   messages there in software, which is where IPv4 GSO would number the segments' IDs (shown
//!   by the last test, and why the backend uses IPv4 GSO on loopback only), while IPv6 GSO
//!   segments are all valid RoCE packets.
//!
//! These need root (`CAP_NET_RAW`, `CAP_NET_ADMIN`, a private network namespace); without it
//! they print a loud message and pass.

mod udp_support;

use std::fs::File;
use std::io::{IoSlice, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::UdpOptions;
use roce_transport::datapath::{Datapath, TxDatagram};
use roce_wire::frame::{FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{bth, icrc, samples, Opcode, PacketRepr, Psn, Qpn};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use udp_support::{bind, private_net, recv_datagrams, send_all, DEADLINE};

/// A RoCE RC SEND_ONLY packet (BTH .. ICRC) from `src` to `dst`, PSN `psn`, `len` bytes of
/// payload, with the ICRC computed for IPv4 Identification 0 + DF (or the IPv6 header).
fn roce_payload(src: IpAddr, dst: IpAddr, psn: u32, len: usize) -> Vec<u8> {
    let ip = match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
            src,
            dst,
            tos: 0,
            ident: 0,
            dont_fragment: true,
            ttl: 64,
        }),
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }),
        _ => unreachable!("one family"),
    };
    let frame = FrameRepr {
        eth: None,
        ip,
        udp: UdpRepr {
            src_port: ROCEV2_PORT,
            dst_port: ROCEV2_PORT,
            checksum: 0,
        },
    };
    let data = samples::pattern(len);
    let mut packet: PacketRepr<'_> = samples::packet_for(Opcode::RcSendOnly, &data);
    packet.bth = bth::Repr::new(Opcode::RcSendOnly, Qpn::new(0x11), Psn::new(psn));
    packet.payload = &data;
    let bytes = samples::emit(&frame, &packet);
    bytes[frame.header_len()..].to_vec()
}

/// The fields of a captured IPv4/UDP packet the tests look at.
#[derive(Debug)]
struct V4Packet<'a> {
    tos: u8,
    ident: u16,
    dont_fragment: bool,
    more_fragments: bool,
    fragment_offset: u16,
    ttl: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dst_port: u16,
    udp_payload: &'a [u8],
    /// IP header .. end of UDP payload.
    ip_packet: &'a [u8],
}

fn parse_v4(p: &[u8]) -> Option<V4Packet<'_>> {
    if p.len() < 28 || p[0] != 0x45 || p[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    let ip_packet = p.get(..total)?;
    let flags = u16::from_be_bytes([p[6], p[7]]);
    Some(V4Packet {
        tos: p[1],
        ident: u16::from_be_bytes([p[4], p[5]]),
        dont_fragment: flags & 0x4000 != 0,
        more_fragments: flags & 0x2000 != 0,
        fragment_offset: flags & 0x1FFF,
        ttl: p[8],
        src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
        dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]),
        dst_port: u16::from_be_bytes([p[22], p[23]]),
        udp_payload: &ip_packet[28..],
        ip_packet,
    })
}

/// Opens an `AF_PACKET` socket that receives IPv4 packets of every interface, or `None` (with
/// a loud message) without the privilege.
fn capture_ipv4() -> Option<Socket> {
    let proto = Protocol::from(i32::from((libc::ETH_P_IP as u16).to_be()));
    match Socket::new(Domain::PACKET, Type::DGRAM, Some(proto)) {
        Ok(s) => {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            Some(s)
        }
        Err(e) => {
            roce_testkit::skip(
                &roce_testkit::current_test(),
                format!("cannot open an AF_PACKET socket ({e}); run as root"),
            );
            None
        }
    }
}

/// Captures IPv4 packets until `want` match `keep` or the deadline passes.
fn capture_until(sock: &Socket, want: usize, keep: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let end = Instant::now() + DEADLINE;
    for _ in 0..100_000 {
        if out.len() >= want || Instant::now() >= end {
            break;
        }
        match (&*sock).read(&mut buf) {
            Ok(n) if keep(&buf[..n]) => out.push(buf[..n].to_vec()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("capture: {e}"),
        }
    }
    out
}

#[test]
fn ipv4_datagrams_leave_with_ident_0_df_and_a_valid_icrc() {
    let _net = private_net();
    let Some(cap) = capture_ipv4() else {
        return;
    };
    let mut a = bind("127.0.0.1:4791", UdpOptions::default());
    let mut b = bind("127.0.0.2:4791", UdpOptions::default());
    let (src, dst) = (a.local_addr(), b.local_addr());

    // The socket's defaults (no control message), then TOS CE + TTL 9 by control message:
    // both are masked from the ICRC, the Identification is not.
    let cases = [(0x00u8, 64u8), (0x03, 9)];
    let payloads: Vec<Vec<u8>> = (0..cases.len())
        .map(|n| roce_payload(src.ip(), dst.ip(), 100 + n as u32, 256 + n))
        .collect();
    let batch: Vec<TxDatagram<'_>> = payloads
        .iter()
        .zip(cases)
        .map(|(p, (tos, hop_limit))| TxDatagram {
            dst,
            src_port: 0,
            tos,
            hop_limit,
            flow_label: 0,
            payload: p,
        })
        .collect();
    send_all(&mut a, &batch);

    // Incoming IPv4 on lo (an ETH_P_IP packet socket does not see the outgoing copy).
    let captured = capture_until(&cap, payloads.len(), |pkt| {
        parse_v4(pkt).is_some_and(|v| v.dst_port == ROCEV2_PORT)
    });
    for (p, (tos, ttl)) in payloads.iter().zip(cases) {
        let seen: Vec<&Vec<u8>> = captured
            .iter()
            .filter(|pkt| parse_v4(pkt).is_some_and(|v| v.udp_payload == &p[..]))
            .collect();
        assert!(
            !seen.is_empty(),
            "datagram of {} bytes not captured",
            p.len()
        );
        for pkt in seen {
            let v = parse_v4(pkt).unwrap();
            eprintln!(
                "captured {} -> {}: ident {} DF {} tos {:#04x} ttl {} len {}",
                v.src,
                v.dst,
                v.ident,
                v.dont_fragment,
                v.tos,
                v.ttl,
                v.ip_packet.len()
            );
            assert_eq!(
                (v.src, v.dst),
                (Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2))
            );
            assert_eq!(v.ident, 0, "IPv4 Identification");
            assert!(v.dont_fragment, "DF");
            assert!(
                !v.more_fragments && v.fragment_offset == 0,
                "not a fragment"
            );
            assert_eq!((v.tos, v.ttl), (tos, ttl));
            assert!(icrc::verify(v.ip_packet), "ICRC of the packet on the wire");
            // The check has teeth: another Identification breaks it.
            let mut other = v.ip_packet.to_vec();
            other[5] ^= 1;
            assert!(!icrc::verify(&other));
        }
    }
    let got = recv_datagrams(&mut b, payloads.len(), 4, 65_536);
    assert_eq!(got.len(), payloads.len());
    for (g, p) in got.iter().zip(&payloads) {
        assert_eq!(&g.data, p);
    }
    assert_eq!(got[1].meta.tos, 0x03);
}

/// A `tun` interface in this thread's namespace: the packets routed to it are read from the
/// returned file.
fn tun(name: &str, setup: &[&str]) -> Option<File> {
    let file = match File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
    {
        Ok(f) => f,
        Err(e) => {
            roce_testkit::skip(
                &roce_testkit::current_test(),
                format!("cannot open /dev/net/tun ({e})"),
            );
            return None;
        }
    };
    #[allow(unsafe_code)]
    // SAFETY: ifreq is plain C data; all zeroes is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    #[allow(unsafe_code)]
    // SAFETY: TUNSETIFF reads and writes the live `req`; TUNSETOFFLOAD takes an integer.
    let (r, _) = unsafe {
        (
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETIFF,
                &mut req as *mut libc::ifreq,
            ),
            // Checksum offload, but no UDP segmentation offload: GSO is done in software.
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::TUN_F_CSUM as libc::c_ulong,
            ),
        )
    };
    if r < 0 {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            format!("TUNSETIFF: {}", std::io::Error::last_os_error()),
        );
        return None;
    }
    for cmd in setup {
        let args: Vec<&str> = cmd.split_whitespace().collect();
        match Command::new("ip").args(&args).status() {
            Ok(s) if s.success() => {}
            other => {
                roce_testkit::skip(
                    &roce_testkit::current_test(),
                    format!("`ip {cmd}` failed ({other:?}); is iproute2 installed?"),
                );
                return None;
            }
        }
    }
    Some(file)
}

/// Reads up to `want` packets of IP version `version` to UDP port 4791 from a tun device.
fn read_tun(file: &mut File, want: usize, version: u8) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let end = Instant::now() + DEADLINE;
    while out.len() < want && Instant::now() < end {
        match file.read(&mut buf) {
            Ok(n) => {
                let p = &buf[..n];
                let udp = if version == 4 { 20 } else { 40 };
                let is_udp = if version == 4 { p[9] == 17 } else { p[6] == 17 };
                if n > udp + 8
                    && p[0] >> 4 == version
                    && is_udp
                    && u16::from_be_bytes([p[udp + 2], p[udp + 3]]) == ROCEV2_PORT
                {
                    out.push(p.to_vec());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("read tun: {e}"),
        }
    }
    out
}

/// Eight packets of equal size, back to back in one arena (a GSO candidate run).
fn run_of_eight(src: IpAddr, dst: IpAddr) -> (Vec<u8>, usize) {
    let mut arena = Vec::new();
    let mut len = 0;
    for n in 0..8 {
        let p = roce_payload(src, dst, 1_000 + n, 512);
        len = p.len();
        arena.extend_from_slice(&p);
    }
    (arena, len)
}

fn tx_run(arena: &[u8], len: usize, dst: SocketAddr) -> Vec<TxDatagram<'_>> {
    arena
        .chunks(len)
        .map(|payload| TxDatagram {
            dst,
            src_port: 0,
            tos: 0,
            hop_limit: 64,
            flow_label: 0,
            payload,
        })
        .collect()
}

#[test]
fn ipv4_off_loopback_every_datagram_leaves_with_ident_0() {
    let net = private_net();
    if !net.is_private() {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            "needs a private network namespace for its tun device",
        );
        return;
    }
    let Some(mut tun) = tun(
        "rocetun4",
        &[
            "addr add 198.18.0.1/24 dev rocetun4",
            "link set rocetun4 mtu 1400 up",
        ],
    ) else {
        return;
    };
    let mut a = bind("198.18.0.1:4791", UdpOptions::default());
    let caps = a.caps();
    assert_eq!(a.interface(), Some("rocetun4"));
    assert_eq!(caps.ip_mtu, 1_400, "the interface's MTU");
    // A tun device segments GSO in software: IPv4 GSO is on, but only for batches the engine
    // planned (`plan_ipv4_idents`); this unplanned batch goes out one datagram per message.
    assert_eq!(a.driver(), Some("tun"));
    assert!(a.ipv4_gso_off_loopback());
    assert!(caps.max_gso_segments > 1);

    let dst: SocketAddr = "198.18.0.2:4791".parse().unwrap();
    let (arena, len) = run_of_eight(a.local_addr().ip(), dst.ip());
    send_all(&mut a, &tx_run(&arena, len, dst));
    assert_eq!(a.stats().gso_messages, 0);
    let got = read_tun(&mut tun, 8, 4);
    assert_eq!(got.len(), 8);
    for (pkt, expected) in got.iter().zip(arena.chunks(len)) {
        let v = parse_v4(pkt).unwrap();
        assert_eq!(v.udp_payload, expected);
        assert_eq!(v.ident, 0, "IPv4 Identification");
        assert!(v.dont_fragment, "DF");
        assert!(icrc::verify(v.ip_packet), "ICRC on the wire");
    }
}

#[test]
fn ipv6_gso_segments_off_loopback_are_valid_roce_packets() {
    let net = private_net();
    if !net.is_private() {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            "needs a private network namespace for its tun device",
        );
        return;
    }
    let Some(mut tun) = tun(
        "rocetun6",
        &[
            "link set rocetun6 mtu 1400 up",
            "addr add fd00:99::1/64 dev rocetun6 nodad",
        ],
    ) else {
        return;
    };
    let mut a = bind("[fd00:99::1]:4791", UdpOptions::default());
    assert_eq!(a.caps().ip_mtu, 1_400);
    let dst: SocketAddr = "[fd00:99::2]:4791".parse().unwrap();
    let (arena, len) = run_of_eight(a.local_addr().ip(), dst.ip());
    send_all(&mut a, &tx_run(&arena, len, dst));
    let s = a.stats();
    eprintln!("{s:?}");
    if a.caps().max_gso_segments > 1 {
        assert_eq!((s.gso_messages, s.gso_datagrams), (1, 8), "{s:?}");
    } else {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            "GSO not available: IPv6 segmentation not tested",
        );
    }
    let got = read_tun(&mut tun, 8, 6);
    assert_eq!(got.len(), 8, "segments read back");
    for (pkt, expected) in got.iter().zip(arena.chunks(len)) {
        let payload_len = usize::from(u16::from_be_bytes([pkt[4], pkt[5]]));
        let ip_packet = &pkt[..40 + payload_len];
        assert_eq!(&ip_packet[48..], expected);
        assert_eq!(
            ip_packet[8..24],
            Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1).octets()
        );
        assert!(icrc::verify(ip_packet), "ICRC of a GSO segment");
    }
}

/// What the backend's IPv4 GSO plan relies on: a GSO message from the same kind of socket
/// (unconnected, DF), segmented in software on its way out, numbers the segments'
/// Identification 0, 1, 2, ... (`inet_gso_segment`), so with every ICRC computed for 0 only
/// the first matches (the engine rewrites the others' ICRCs; `tests/gso.rs`).
#[test]
fn kernel_numbers_ipv4_gso_segments_off_loopback() {
    let net = private_net();
    if !net.is_private() {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            "needs a private network namespace for its tun device",
        );
        return;
    }
    let Some(mut tun) = tun(
        "rocetun9",
        &[
            "addr add 198.18.9.1/24 dev rocetun9",
            "link set rocetun9 up",
        ],
    ) else {
        return;
    };
    let local: SocketAddr = "198.18.9.1:4791".parse().unwrap();
    let dst: SocketAddr = "198.18.9.2:4791".parse().unwrap();
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    let pmtudisc_do: libc::c_int = libc::IP_PMTUDISC_DO;
    #[allow(unsafe_code)]
    // SAFETY: a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&pmtudisc_do as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    sock.bind(&SockAddr::from(local)).unwrap();
    let (arena, len) = run_of_eight(local.ip(), dst.ip());
    // One UDP_SEGMENT control message: cmsghdr { size_t len; int level; int type; } + u16.
    let word = size_of::<usize>();
    let mut ctrl = vec![0u8; word + 8 + 8];
    ctrl[..word].copy_from_slice(&(word + 8 + 2).to_ne_bytes());
    ctrl[word..word + 4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
    ctrl[word + 4..word + 8].copy_from_slice(&libc::UDP_SEGMENT.to_ne_bytes());
    ctrl[word + 8..word + 10].copy_from_slice(&(len as u16).to_ne_bytes());
    let bufs = [IoSlice::new(&arena)];
    let addr = SockAddr::from(dst);
    let msg = socket2::MsgHdr::new()
        .with_addr(&addr)
        .with_buffers(&bufs)
        .with_control(&ctrl);
    if let Err(e) = sock.sendmsg(&msg, 0) {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            format!("this kernel refuses UDP GSO here ({e})"),
        );
        return;
    }
    let got = read_tun(&mut tun, 8, 4);
    assert_eq!(got.len(), 8, "segments read back");
    let idents: Vec<u16> = got.iter().map(|p| parse_v4(p).unwrap().ident).collect();
    let valid = got
        .iter()
        .filter(|p| icrc::verify(parse_v4(p).unwrap().ip_packet))
        .count();
    eprintln!("IPv4 GSO segment Identifications: {idents:?}; {valid} of 8 pass the ICRC check");
    assert_eq!(
        idents,
        (0..8).collect::<Vec<u16>>(),
        "segments numbered from 0"
    );
    assert_eq!(valid, 1, "only the first segment matches the ICRC for 0");
}
