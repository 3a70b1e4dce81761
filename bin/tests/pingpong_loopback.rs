//! `rocectl rc/uc/ud/srq-pingpong` server and client as two processes on one host, over `lo`
//! with 127.0.0.1 (GID index 1, the server) and 127.0.0.2 (GID index 2, the client), each test
//! in a network namespace of its own. Both sides must exit 0, print the stock tools' lines,
//! agree on each other's QPN, PSN and GID, and (`--chk`) validate the data.

mod pingpong_support;

use pingpong_support::{run_pair, run_pair_with, Netns};

#[test]
fn rc_pingpong_chk() {
    let Some(ns) = Netns::new("rc") else { return };
    let (s, c) = run_pair(&ns, "rc-pingpong", &["-n", "50", "-s", "9000", "--chk"]);
    assert_eq!((s.iters, s.bytes), (50, 9000 * 50 * 2));
    assert_eq!((c.iters, c.bytes), (50, 9000 * 50 * 2));
    assert_eq!((s.local.len(), c.local.len()), (1, 1));
    // QPNs are random (issue 12): 24 bits, never the special ones, and each side saw the
    // other's.
    assert!(
        (0x10..=0xFF_FFFE).contains(&s.local[0].qpn),
        "{:#x}",
        s.local[0].qpn
    );
    assert_eq!(c.remote[0].qpn, s.local[0].qpn);
    assert_eq!(s.remote[0].qpn, c.local[0].qpn);
}

#[test]
fn uc_pingpong_chk() {
    let Some(ns) = Netns::new("uc") else { return };
    let (s, _) = run_pair(&ns, "uc-pingpong", &["-n", "50", "-s", "3000", "--chk"]);
    assert_eq!(s.bytes, 3000 * 50 * 2);
}

#[test]
fn ud_pingpong_chk() {
    let Some(ns) = Netns::new("ud") else { return };
    let (s, _) = run_pair(&ns, "ud-pingpong", &["-n", "50", "-s", "1024", "--chk"]);
    assert_eq!(s.bytes, 1024 * 50 * 2);
}

#[test]
fn srq_pingpong_chk() {
    let Some(ns) = Netns::new("srq") else { return };
    let (s, c) = run_pair(
        &ns,
        "srq-pingpong",
        &["-n", "40", "-s", "256", "-q", "4", "--chk"],
    );
    assert_eq!(s.bytes, 256 * 40 * 2);
    assert_eq!((s.local.len(), s.remote.len()), (4, 4));
    // Four distinct random QPNs (issue 12: not 0x11, 0x12, ... any more), as the server saw.
    let mut qpns: Vec<u32> = c.local.iter().map(|a| a.qpn).collect();
    assert_eq!(qpns, s.remote.iter().map(|a| a.qpn).collect::<Vec<_>>());
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 4, "{qpns:x?}");
    assert!(
        qpns.iter().all(|q| (0x10..=0xFF_FFFE).contains(q)),
        "{qpns:x?}"
    );
}

#[test]
fn srq_pingpong_defaults_16_qps() {
    let Some(ns) = Netns::new("srq16") else {
        return;
    };
    let (s, _) = run_pair(&ns, "srq-pingpong", &["-n", "100", "-s", "64"]);
    assert_eq!(s.local.len(), 16);
}

#[test]
fn rc_pingpong_events_and_small_rx_depth() {
    // -e: sleep on CQ events; -r 2: receives refilled at every completion.
    let Some(ns) = Netns::new("rce") else { return };
    let (s, _) = run_pair(
        &ns,
        "rc-pingpong",
        &["-n", "100", "-s", "64", "-e", "-r", "2"],
    );
    assert_eq!(s.iters, 100);
}

#[test]
fn rc_pingpong_one_side_in_event_mode() {
    let Some(ns) = Netns::new("rce1") else { return };
    run_pair_with(&ns, "rc-pingpong", &["-n", "20", "-e"], &["-n", "20"]);
}

#[test]
fn rc_pingpong_path_mtu_256_and_4096() {
    let Some(ns) = Netns::new("mtu") else { return };
    run_pair(
        &ns,
        "rc-pingpong",
        &["-n", "10", "-m", "256", "-s", "5000", "--chk"],
    );
    run_pair(
        &ns,
        "rc-pingpong",
        &["-n", "10", "-m", "4096", "-s", "20000", "--chk"],
    );
}
