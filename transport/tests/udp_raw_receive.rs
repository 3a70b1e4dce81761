//! Issue 12 item 1: with `CAP_NET_RAW`, the `udp` backend receives IPv4 through a raw socket
//! that shows the IP header, so the ICRC is checked over the real Identification (all 32 bits)
//! instead of one solved from the ICRC.
//!
//! Packets are forged with an `IPPROTO_RAW` socket (our own IPv4 header, any Identification)
//! to 10.55.0.1 (on `lo`, but not a loopback address) in a private network namespace. Needs
//! root: without it the tests say so loudly, and fail when `CI` is set.

mod udp_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::datapath::{Datapath, Ipv4Info};
use roce_transport::{Backend, Device, DeviceConfig, Progress};
use roce_wire::frame::{FrameRepr, IpRepr, Ipv4Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{bth, icrc, samples, Opcode, PacketRepr, Psn, Qpn};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use udp_support::{private_net, recv_datagrams, DEADLINE};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 55, 0, 1);

fn cannot_run(why: &str) {
    roce_testkit::skip(&roce_testkit::current_test(), why);
}

/// A private namespace with 10.55.0.1/32 on `lo`, and a socket that sends IPv4
/// packets with our own header; `None` (loudly) without the privilege.
fn setup() -> Option<(roce_testkit::netns::Net, Socket)> {
    let net = private_net();
    if !net.is_private() {
        cannot_run("needs a private network namespace");
        return None;
    }
    let added = Command::new("ip")
        .args(["addr", "add", "10.55.0.1/32", "dev", "lo"])
        .status();
    if !added.as_ref().is_ok_and(|s| s.success()) {
        cannot_run(&format!(
            "`ip addr add 10.55.0.1/32 dev lo` failed: {added:?}"
        ));
        return None;
    }
    match Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    ) {
        Ok(s) => Some((net, s)),
        Err(e) => {
            cannot_run(&format!("IPPROTO_RAW socket: {e}"));
            None
        }
    }
}

/// A whole IPv4 packet: a UD SEND_ONLY to `qpn` from 10.55.0.1:`sport` to 10.55.0.1:4791,
/// Identification `ident` with DF, its ICRC computed for Identification `icrc_ident`.
fn ipv4_packet(ident: u16, icrc_ident: u16, sport: u16, qpn: u32) -> Vec<u8> {
    let frame = FrameRepr {
        eth: None,
        ip: IpRepr::V4(Ipv4Repr {
            src: LOCAL,
            dst: LOCAL,
            tos: 0,
            ident: icrc_ident,
            dont_fragment: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: sport,
            dst_port: ROCEV2_PORT,
            checksum: 0,
        },
    };
    let data = samples::pattern(80);
    let mut packet: PacketRepr<'_> = samples::packet_for(Opcode::UdSendOnly, &data);
    packet.bth = bth::Repr::new(Opcode::UdSendOnly, Qpn::new(qpn), Psn::new(3));
    packet.payload = &data;
    let mut ip = samples::emit(&frame, &packet);
    assert!(icrc::verify(&ip));
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip
}

fn send(raw: &Socket, ip: &[u8]) {
    let to = SockAddr::from(SocketAddr::new(LOCAL.into(), 0));
    assert_eq!(raw.send_to(ip, &to).unwrap(), ip.len());
}

#[test]
fn the_datapath_reports_the_real_identification() {
    let Some((_net, raw)) = setup() else { return };
    let mut dp = UdpDatapath::bind(
        SocketAddr::new(LOCAL.into(), ROCEV2_PORT),
        UdpOptions::default(),
    )
    .unwrap();
    assert!(dp.raw_receive(), "root, not loopback: raw receive is on");
    assert!(dp.caps().sees_ip_header);
    assert_eq!(dp.caps().gro_segments, 1);
    let ip = ipv4_packet(0x1234, 0x1234, 40_000, 0x42);
    send(&raw, &ip);
    // Not for our port: the filter keeps it out.
    let mut other = ip.clone();
    other[22..24].copy_from_slice(&4792u16.to_be_bytes());
    send(&raw, &other);
    let got = recv_datagrams(&mut dp, 2, 4, 2048);
    assert_eq!(got.len(), 1, "exactly the one datagram to our port");
    assert_eq!(got[0].data, &ip[28..]);
    let m = got[0].meta;
    assert_eq!(
        m.ipv4,
        Some(Ipv4Info {
            ident: 0x1234,
            dont_fragment: true
        })
    );
    assert_eq!(m.src, "10.55.0.1:40000".parse::<SocketAddr>().unwrap());
    assert_eq!(m.dst, SocketAddr::new(LOCAL.into(), ROCEV2_PORT));
    assert_eq!(dp.stats().rx_datagrams, 1);
}

/// The packet a UDP-only receiver cannot tell from a good one: its ICRC is right for another
/// Identification than the one it carries (an Identification bit flipped on the way).
/// Returns `(rx_packets, icrc_errors, no_qp)`; `None` when the test cannot run here.
fn wrong_ident_is_caught(raw_receive: bool) -> Option<(u64, u64, u64)> {
    let (_net, raw) = setup()?;
    let opts = UdpOptions {
        raw_receive,
        ..UdpOptions::default()
    };
    let dp = UdpDatapath::bind(SocketAddr::new(LOCAL.into(), ROCEV2_PORT), opts).unwrap();
    assert_eq!(dp.raw_receive(), raw_receive);
    let dev =
        Device::open(DeviceConfig::new(Backend::Custom(Box::new(dp))).progress(Progress::Manual))
            .unwrap();
    // Both for a QPN nobody has: a good one ends in no_qp, a bad one in icrc_errors.
    send(&raw, &ipv4_packet(0x2222, 0x1111, 40_001, 0x00AB_CDEF));
    send(&raw, &ipv4_packet(0x1112, 0x1112, 40_001, 0x00AB_CDEF));
    let end = Instant::now() + DEADLINE;
    while dev.counters().rx_packets < 2 && Instant::now() < end {
        dev.progress_wait(Duration::from_millis(10));
    }
    let c = dev.counters();
    assert_eq!(dev.local_addr().ip(), IpAddr::V4(LOCAL));
    Some((c.rx_packets, c.icrc_errors, c.no_qp))
}

#[test]
fn with_raw_receive_all_32_bits_are_checked() {
    if let Some(got) = wrong_ident_is_caught(true) {
        assert_eq!(got, (2, 1, 1), "(rx_packets, icrc_errors, no_qp)");
    }
}

/// The residual risk without it, shown: the solver finds the Identification the ICRC was
/// computed for, and a first packet from a peer is accepted (the 2^-16 case).
#[test]
fn without_raw_receive_the_wrong_identification_passes() {
    if let Some(got) = wrong_ident_is_caught(false) {
        assert_eq!(got, (2, 0, 2), "(rx_packets, icrc_errors, no_qp)");
    }
}
