//! Two devices in two network namespaces joined by a veth pair, over the `udp` and the `raw`
//! backends: every RC operation and UD SEND from 0 bytes to 1 MiB with the data checked; the
//! same with packet loss injected by the kernel (nftables `numgen random` drop rules on UDP
//! 4791 in each namespace) at 1% and 10%; every capture checked by
//! `shared/tools/check_pcap.sh`.
//!
//! Needs root (CI runs as root); skips loudly only where the kernel lacks network namespaces.

mod pcap_check;

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsPair, Side};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{Backend, Device, DeviceConfig, Mtu};

use pcap_check::check_pcap;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Udp,
    Raw,
}

fn open(pair: &NetnsPair, side: Side, kind: Kind, v6: bool, pcap: &Path) -> Device {
    let end = pair.end(side);
    let ip: IpAddr = if v6 {
        end.ipv6().into()
    } else {
        end.ipv4().into()
    };
    let backend = match kind {
        Kind::Udp => Backend::Udp {
            local: ip,
            port: 4791,
        },
        Kind::Raw => Backend::Raw {
            ifname: end.ifname().to_string(),
            local: ip,
        },
    };
    let cfg = DeviceConfig::new(backend)
        .name(format!("{kind:?}-{side:?}").to_lowercase())
        .pcap(pcap);
    end.netns()
        .enter_scoped(|| Device::open(cfg))
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("open {kind:?} device on {ip}: {e}"))
}

/// Runs the selftest between the two namespaces and checks both captures.
fn run(tag: &str, kind: Kind, v6: bool, loss: u8) {
    if !netns_or_skip(tag) {
        return;
    }
    let start = Instant::now();
    let pair = NetnsPair::create(tag).expect("create namespaces");
    if loss > 0 {
        pair.set_loss(Side::A, loss).expect("loss rule a");
        pair.set_loss(Side::B, loss).expect("loss rule b");
    }
    let dir = std::env::temp_dir().join(format!("roce-veth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pa, pb) = (dir.join("a.pcap"), dir.join("b.pcap"));
    {
        let a = open(&pair, Side::A, kind, v6, &pa);
        let b = open(&pair, Side::B, kind, v6, &pb);
        assert_eq!(a.query_device().backend, format!("{kind:?}").to_lowercase());
        // A 1500-byte veth gives path MTU 1024, as rxe.
        assert_eq!(a.query_port().active_mtu, Mtu::Mtu1024);
        let opts = SelftestOptions {
            sizes: vec![0, 1, 1024, 4097, 65_536, 1 << 20],
            iterations: if loss > 0 { 1 } else { 2 },
            // UD is unreliable by definition: a lost datagram is never completed at the
            // receiver, so UD runs only on the loss-free links.
            ud_sizes: if loss > 0 { vec![] } else { vec![0, 64, 1024] },
            timeout: Duration::from_secs(30),
            ack_timeout: 10, // ~4 ms: lost tails are retried quickly
        };
        run_rc(&a, &b, &opts, &mut |r| eprintln!("{tag}: {r}"))
            .unwrap_or_else(|e| panic!("{tag}: {e}\na {:?}\nb {:?}", a.counters(), b.counters()));
        run_ud(&a, &b, &opts, &mut |r| eprintln!("{tag}: {r}"))
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        let (ca, cb) = (a.counters(), b.counters());
        eprintln!("{tag}: a {ca:?}\n{tag}: b {cb:?}");
        assert_eq!(ca.icrc_errors + cb.icrc_errors, 0, "{tag}");
        if loss >= 10 {
            assert!(
                ca.retransmitted_pkts + cb.retransmitted_pkts > 0,
                "{tag}: loss was injected but nothing was retransmitted"
            );
        }
        a.flush_capture().unwrap();
        b.flush_capture().unwrap();
    }
    drop(pair);
    check_pcap(&pa);
    check_pcap(&pb);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{tag}: {:.1} s", start.elapsed().as_secs_f64());
}

#[test]
fn udp_ipv4_every_operation() {
    run("udp4", Kind::Udp, false, 0);
}

#[test]
fn udp_ipv6_every_operation() {
    run("udp6", Kind::Udp, true, 0);
}

#[test]
fn raw_ipv4_every_operation() {
    run("raw4", Kind::Raw, false, 0);
}

#[test]
fn raw_ipv6_every_operation() {
    run("raw6", Kind::Raw, true, 0);
}

#[test]
fn udp_with_1_percent_loss() {
    run("udp-l1", Kind::Udp, false, 1);
}

#[test]
fn udp_with_10_percent_loss() {
    run("udp-l10", Kind::Udp, false, 10);
}

#[test]
fn raw_with_1_percent_loss() {
    run("raw-l1", Kind::Raw, false, 1);
}

#[test]
fn raw_with_10_percent_loss() {
    run("raw-l10", Kind::Raw, false, 10);
}
