//! Whole devices over the `raw` backend across a veth pair: every RC operation and UD SEND
//! (the selftest), data verified, on a clean link, and every RC operation on a link losing
//! datagrams both ways. The
//! engine checks all 32 bits of every ICRC here (the raw backend reports the IPv4
//! Identification), so this also proves the IP header raw writes is the one the engine
//! computed the ICRC for.

mod raw_util;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use raw_util::{can_run, open};
use roce_testkit::netns::{NetnsPair, Side};
use roce_transport::datapath::raw::RawOptions;
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{Backend, Device, DeviceConfig};

fn devices(pair: &NetnsPair, v6: bool) -> (Device, Device) {
    let ip = |e: &roce_testkit::netns::NetnsEnd| -> IpAddr {
        if v6 {
            e.ipv6().into()
        } else {
            e.ipv4().into()
        }
    };
    let dev = |e, name: &str| {
        let raw = open(e, ip(e), RawOptions::default());
        Device::open(DeviceConfig::new(Backend::Custom(Box::new(raw))).name(name)).unwrap()
    };
    (dev(pair.a(), "raw-a"), dev(pair.b(), "raw-b"))
}

fn selftest(a: &Device, b: &Device, opts: &SelftestOptions, ud: bool) {
    let started = Instant::now();
    let mut report = |r: &roce_transport::selftest::StepReport| eprintln!("{r}");
    run_rc(a, b, opts, &mut report).unwrap_or_else(|e| {
        panic!(
            "RC: {e}\na: {:?} {:?}\nb: {:?} {:?}",
            a.last_error(),
            a.device_counters(),
            b.last_error(),
            b.device_counters()
        )
    });
    if ud {
        run_ud(a, b, opts, &mut report).unwrap_or_else(|e| panic!("UD: {e}"));
    }
    eprintln!("selftest took {:?}", started.elapsed());
    // Every received ICRC checked in full, none wrong.
    for d in [a, b] {
        let c = d.device_counters();
        assert_eq!((c.rx_icrc_errors, c.rx_drop_malformed), (0, 0), "{c:?}");
    }
}

#[test]
fn raw_device_selftest_ipv4() {
    if !can_run("raw_device_selftest_ipv4") {
        return;
    }
    let pair = NetnsPair::create("rdev4").unwrap();
    let (a, b) = devices(&pair, false);
    selftest(&a, &b, &SelftestOptions::default(), true);
}

#[test]
fn raw_device_selftest_ipv6_jumbo() {
    if !can_run("raw_device_selftest_ipv6_jumbo") {
        return;
    }
    let pair = NetnsPair::create_with_mtu("rdev6", 9000).unwrap();
    let (a, b) = devices(&pair, true);
    selftest(&a, &b, &SelftestOptions::default(), true);
}

#[test]
fn raw_device_selftest_with_loss() {
    if !can_run("raw_device_selftest_with_loss") {
        return;
    }
    let pair = NetnsPair::create("rdevl").unwrap();
    let (a, b) = devices(&pair, false);
    pair.set_loss(Side::A, 3).unwrap();
    pair.set_loss(Side::B, 3).unwrap();
    let opts = SelftestOptions {
        sizes: vec![0, 1, 4096, 65_536, 256 * 1024],
        timeout: Duration::from_secs(30),
        ..SelftestOptions::default()
    };
    // RC only: UD is unreliable, a lost UD SEND never completes.
    selftest(&a, &b, &opts, false);
    let (ca, cb) = (a.device_counters(), b.device_counters());
    eprintln!("with 3% loss each way: a {ca:?}\nb {cb:?}");
}
