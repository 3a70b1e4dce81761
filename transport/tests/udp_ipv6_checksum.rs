//! Issue 12 item 2: rdma_rxe sends IPv6 UDP with checksum 0, which the kernel drops before a
//! plain IPv6 UDP socket (`Udp6InCsumErrors`). The `udp` backend sets `UDP_NO_CHECK6_RX`, so
//! it receives them (the ICRC protects the packet); what it sends still carries a real
//! checksum.
//!
//! The zero-checksum datagrams are forged with a raw IPv6 socket (the kernel fills in no UDP
//! checksum for `SOCK_RAW`/`IPPROTO_UDP` unless `IPV6_CHECKSUM` asks it to). Needs root
//! (`CAP_NET_RAW`, a private network namespace): without it the tests say so loudly, and fail
//! when `CI` is set.

mod udp_support;

use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::UdpOptions;
use roce_transport::datapath::TxDatagram;
use roce_transport::{Device, DeviceConfig, Progress};
use roce_wire::frame::{FrameRepr, IpRepr, Ipv6Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{bth, icrc, samples, Opcode, PacketRepr, Psn, Qpn};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use udp_support::{bind, private_net, recv_datagrams, send_all, DEADLINE};

/// Says why the test cannot run; fails under CI, where it must.
fn cannot_run(why: &str) {
    roce_testkit::skip(&roce_testkit::current_test(), why);
}

/// A RoCE UD SEND_ONLY packet (BTH .. ICRC) to QPN `qpn`, with the ICRC computed for
/// `src`:`sport` -> `dst`:`dport` over IPv6.
fn roce_payload(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, qpn: u32) -> Vec<u8> {
    let frame = FrameRepr {
        eth: None,
        ip: IpRepr::V6(Ipv6Repr {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }),
        udp: UdpRepr {
            src_port: sport,
            dst_port: dport,
            checksum: 0,
        },
    };
    let data = samples::pattern(100);
    let mut packet: PacketRepr<'_> = samples::packet_for(Opcode::UdSendOnly, &data);
    packet.bth = bth::Repr::new(Opcode::UdSendOnly, Qpn::new(qpn), Psn::new(7));
    packet.payload = &data;
    let bytes = samples::emit(&frame, &packet);
    let ip_packet = &bytes[frame.header_len() - 48..];
    assert!(icrc::verify(ip_packet), "the forged packet's own ICRC");
    bytes[frame.header_len()..].to_vec()
}

/// A raw IPv6 socket for UDP: what we write is the UDP header and payload, sent as is.
fn raw_udp6() -> Option<Socket> {
    match Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::UDP)) {
        Ok(s) => Some(s),
        Err(e) => {
            cannot_run(&format!("raw IPv6 socket: {e} (needs CAP_NET_RAW)"));
            None
        }
    }
}

/// Sends `payload` in a UDP datagram with checksum **0** from `sport` to `[::1]:dport`.
fn send_zero_checksum(raw: &Socket, sport: u16, dport: u16, payload: &[u8]) {
    let len = (8 + payload.len()) as u16;
    let mut d = Vec::with_capacity(len.into());
    d.extend_from_slice(&sport.to_be_bytes());
    d.extend_from_slice(&dport.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    let to = SockAddr::from(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 0));
    assert_eq!(raw.send_to(&d, &to).unwrap(), d.len());
}

#[test]
fn zero_checksum_ipv6_reaches_the_udp_backend_but_not_a_plain_socket() {
    let net = private_net();
    if !net.is_private() {
        return cannot_run("needs a private network namespace");
    }
    let Some(raw) = raw_udp6() else { return };
    let mut dp = bind("[::1]:4791", UdpOptions::default());
    let plain = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    plain
        .bind(&SockAddr::from("[::1]:4792".parse::<SocketAddr>().unwrap()))
        .unwrap();
    plain
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();

    let lo = Ipv6Addr::LOCALHOST;
    let payload = roce_payload(lo, 50_000, lo, ROCEV2_PORT, 0x12_3456);
    send_zero_checksum(&raw, 50_000, 4791, &payload);
    send_zero_checksum(&raw, 50_000, 4792, &payload);

    let got = recv_datagrams(&mut dp, 1, 4, 2048);
    assert_eq!(
        got.len(),
        1,
        "the zero-checksum datagram reached the udp backend"
    );
    assert_eq!(got[0].data, payload);
    assert_eq!(got[0].meta.src, "[::1]:50000".parse().unwrap());
    // The same datagram to a socket without UDP_NO_CHECK6_RX is dropped by the kernel: the
    // test really exercises what rxe's packets meet.
    let mut buf = [std::mem::MaybeUninit::new(0u8); 2048];
    let r = plain.recv(&mut buf);
    assert!(
        r.is_err(),
        "a plain IPv6 UDP socket got a zero checksum: {r:?}"
    );
}

#[test]
fn a_device_counts_a_zero_checksum_ipv6_packet_as_received() {
    let net = private_net();
    if !net.is_private() {
        return cannot_run("needs a private network namespace");
    }
    let Some(raw) = raw_udp6() else { return };
    let cfg = DeviceConfig::udp(IpAddr::V6(Ipv6Addr::LOCALHOST)).progress(Progress::Manual);
    let dev = Device::open(cfg).unwrap();
    let lo = Ipv6Addr::LOCALHOST;
    // A valid RoCE packet for a QPN nobody has: it passes the ICRC and lands in `no_qp`.
    send_zero_checksum(
        &raw,
        50_001,
        ROCEV2_PORT,
        &roce_payload(lo, 50_001, lo, ROCEV2_PORT, 0x00AB_CDEF),
    );
    let end = Instant::now() + DEADLINE;
    while dev.counters().rx_packets == 0 && Instant::now() < end {
        dev.progress_wait(Duration::from_millis(10));
    }
    let c = dev.counters();
    assert_eq!((c.rx_packets, c.icrc_errors, c.no_qp), (1, 0, 1), "{c:?}");
}

/// A `tun` interface without offloads (the kernel completes every checksum in software).
fn tun(name: &str, setup: &[&str]) -> Option<File> {
    let file = match File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
    {
        Ok(f) => f,
        Err(e) => {
            cannot_run(&format!("cannot open /dev/net/tun ({e})"));
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
    // SAFETY: TUNSETIFF reads and writes the live `req`.
    let r = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::TUNSETIFF,
            &mut req as *mut libc::ifreq,
        )
    };
    if r < 0 {
        cannot_run(&format!("TUNSETIFF: {}", std::io::Error::last_os_error()));
        return None;
    }
    for cmd in setup {
        let args: Vec<&str> = cmd.split_whitespace().collect();
        match Command::new("ip").args(&args).status() {
            Ok(s) if s.success() => {}
            other => {
                cannot_run(&format!("`ip {cmd}` failed ({other:?})"));
                return None;
            }
        }
    }
    Some(file)
}

/// The one's-complement sum of the IPv6 pseudo-header and the UDP datagram `udp` (checksum
/// field included): 0xFFFF when the checksum is right.
fn udp6_sum(src: &[u8], dst: &[u8], udp: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(src);
    add(dst);
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

#[test]
fn our_ipv6_datagrams_leave_with_a_valid_udp_checksum() {
    let net = private_net();
    if !net.is_private() {
        return cannot_run("needs a private network namespace for its tun device");
    }
    let Some(mut tun) = tun(
        "rocetun6c",
        &[
            "link set rocetun6c up",
            "addr add fd00:98::1/64 dev rocetun6c nodad",
        ],
    ) else {
        return;
    };
    let mut a = bind("[fd00:98::1]:4791", UdpOptions::default());
    let (src, dst): (Ipv6Addr, Ipv6Addr) =
        ("fd00:98::1".parse().unwrap(), "fd00:98::2".parse().unwrap());
    let payload = roce_payload(src, ROCEV2_PORT, dst, ROCEV2_PORT, 0x11);
    send_all(
        &mut a,
        &[TxDatagram {
            dst: SocketAddr::new(dst.into(), ROCEV2_PORT),
            src_port: 0,
            tos: 0,
            hop_limit: 64,
            flow_label: 0,
            payload: &payload,
        }],
    );
    let mut buf = vec![0u8; 4096];
    let end = Instant::now() + DEADLINE;
    let pkt = loop {
        assert!(
            Instant::now() < end,
            "nothing read back from the tun device"
        );
        match tun.read(&mut buf) {
            Ok(n) if n > 48 && buf[0] >> 4 == 6 && buf[6] == 17 => break buf[..n].to_vec(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("read tun: {e}"),
        }
    };
    let udp = &pkt[40..];
    assert_eq!(&udp[8..], &payload[..]);
    let checksum = u16::from_be_bytes([udp[6], udp[7]]);
    assert_ne!(checksum, 0, "we send a real IPv6 UDP checksum");
    assert_eq!(
        udp6_sum(&pkt[8..24], &pkt[24..40], udp),
        0xFFFF,
        "checksum {checksum:#06x}"
    );
    assert!(icrc::verify(&pkt), "ICRC on the wire");
}
