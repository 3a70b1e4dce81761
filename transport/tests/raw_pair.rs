//! Two `raw` backends across a veth pair between two namespaces: batches of datagrams of
//! every size up to the MTU (4200 bytes on a 9000-byte MTU pair) in both directions, over
//! IPv4 and IPv6, byte-exact, with the metadata the sender chose. Peers are resolved by ARP /
//! neighbour discovery (no static entries).

mod raw_util;

use std::net::{IpAddr, SocketAddr};

use raw_util::{can_run, datagram, open, payload, transfer, Got};
use roce_testkit::netns::NetnsPair;
use roce_transport::datapath::raw::{RawDatapath, RawOptions};
use roce_transport::datapath::{Datapath, Ipv4Info, TxDatagram};

/// Sends `sizes` from `tx` to `rx` in batches of 64 and checks every byte and field.
fn exchange(tx: &mut RawDatapath, rx: &mut RawDatapath, sizes: &[usize]) {
    let dst = rx.local_addr();
    let src_ip = tx.local_addr().ip();
    for (chunk_no, chunk) in sizes.chunks(64).enumerate() {
        let base = chunk_no * 64;
        let payloads: Vec<Vec<u8>> = chunk
            .iter()
            .enumerate()
            .map(|(i, &len)| payload(base + i, len))
            .collect();
        let batch: Vec<TxDatagram<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| datagram(dst, base + i, p))
            .collect();
        let got = transfer(tx, rx, &batch);
        assert_eq!(
            got.len(),
            batch.len(),
            "{} of {} datagrams arrived ({} -> {}); sender {:?}, receiver {:?}",
            got.len(),
            batch.len(),
            src_ip,
            dst,
            tx.stats(),
            rx.stats()
        );
        for (d, Got { data, meta }) in batch.iter().zip(&got) {
            assert_eq!(data.len(), d.payload.len());
            assert!(data == d.payload, "payload of {} bytes differs", data.len());
            assert_eq!(meta.len, d.payload.len());
            assert_eq!(meta.stride, d.payload.len());
            assert_eq!(meta.src, SocketAddr::new(src_ip, d.src_port));
            assert_eq!(meta.dst, dst);
            assert_eq!(meta.tos, d.tos);
            match src_ip {
                IpAddr::V4(_) => assert_eq!(
                    meta.ipv4,
                    Some(Ipv4Info {
                        ident: 0,
                        dont_fragment: true
                    })
                ),
                IpAddr::V6(_) => assert_eq!(meta.ipv4, None),
            }
        }
    }
}

fn run(tag: &str, mtu: u32, v6: bool, sizes: &[usize]) {
    let pair = NetnsPair::create_with_mtu(tag, mtu).unwrap();
    let (ip_a, ip_b): (IpAddr, IpAddr) = if v6 {
        (pair.a().ipv6().into(), pair.b().ipv6().into())
    } else {
        (pair.a().ipv4().into(), pair.b().ipv4().into())
    };
    let no_kernel = RawOptions {
        kernel_neighbours: false,
        ..RawOptions::default()
    };
    let mut a = open(pair.a(), ip_a, no_kernel.clone());
    let mut b = open(pair.b(), ip_b, no_kernel);
    assert_eq!(a.caps().ip_mtu, mtu as usize);
    assert_eq!(a.mac(), pair.a().mac());
    exchange(&mut a, &mut b, sizes);
    exchange(&mut b, &mut a, sizes);
    // Resolution happened on the wire.
    assert_eq!(a.neighbour(ip_b), Some(pair.b().mac()));
    assert_eq!(b.neighbour(ip_a), Some(pair.a().mac()));
    let (sa, sb) = (a.stats(), b.stats());
    let solicited =
        |s: &roce_transport::datapath::raw::RawStats| s.arp_requests + s.neighbour_solicitations;
    assert!(solicited(&sa) >= 1, "{sa:?}");
    for s in [sa, sb] {
        assert_eq!(s.rx_datagrams, sizes.len() as u64, "{s:?}");
        assert_eq!(s.tx_frames, sizes.len() as u64, "{s:?}");
        assert_eq!(s.rx_kernel_drops, 0, "{s:?}");
        assert_eq!(
            s.tx_unresolved + s.tx_queue_overflow + s.tx_dropped,
            0,
            "{s:?}"
        );
    }
}

/// Every size from 0 to 64, then every 23rd, and the largest.
fn sizes(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..=64).collect();
    v.extend((65..max).step_by(23));
    v.push(max);
    v
}

#[test]
fn raw_pair_ipv4_mtu_1500() {
    if can_run("raw_pair_ipv4_mtu_1500") {
        run("rp4", 1500, false, &sizes(1472));
    }
}

#[test]
fn raw_pair_ipv4_mtu_9000() {
    if can_run("raw_pair_ipv4_mtu_9000") {
        run("rp4j", 9000, false, &sizes(4200));
    }
}

#[test]
fn raw_pair_ipv6_mtu_1500() {
    if can_run("raw_pair_ipv6_mtu_1500") {
        run("rp6", 1500, true, &sizes(1452));
    }
}

#[test]
fn raw_pair_ipv6_mtu_9000() {
    if can_run("raw_pair_ipv6_mtu_9000") {
        run("rp6j", 9000, true, &sizes(4200));
    }
}
