//! A program that exits without closing its device (`exit(3)` with the device still open, as
//! perftest does on an error through the drop-in) keeps the frames its capture had buffered:
//! the capture's `atexit` flush ([`roce_transport::CaptureFile::flush_at_exit`]).
//!
//! The test runs itself as the child: with `CAPTURE_EXIT_CHILD` set, the child test makes a
//! few RC round trips over loopback with a capture (the capture's 1 MiB buffer holds them
//! all) and calls `std::process::exit(7)` with both devices alive. The parent checks the
//! status and that the file holds every frame the devices counted.

use std::path::PathBuf;
use std::process::Command;

use roce_transport::selftest::{run_rc, SelftestOptions};
use roce_transport::{Device, DeviceConfig};

const CHILD: &str = "CAPTURE_EXIT_CHILD";

#[test]
fn a_capture_keeps_its_frames_when_the_program_exits_without_closing_the_device() {
    let dir = std::env::temp_dir().join(format!("roce-capture-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("exit.pcap");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_exits_with_its_devices_open",
            "--nocapture",
        ])
        .env(CHILD, &pcap)
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "child: {stderr}");
    let counted: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("frames counted: "))
        .unwrap_or_else(|| panic!("the child did not report its frames: {stderr}"))
        .trim()
        .parse()
        .unwrap();
    let frames = roce_wire::pcap::read_capture(std::fs::File::open(&pcap).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    assert!(counted > 0);
    // At least those: the engine thread may still have sent or received one more.
    assert!(
        frames.len() >= counted,
        "{} frames in {}, {counted} counted",
        frames.len(),
        pcap.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child's half (does nothing unless the parent set [`CHILD`]).
#[test]
fn child_exits_with_its_devices_open() {
    let Some(pcap) = std::env::var_os(CHILD).map(PathBuf::from) else {
        return;
    };
    let open = |ip: &str| {
        Device::open(DeviceConfig::udp(ip.parse().unwrap()).name(ip).pcap(&pcap))
            .unwrap_or_else(|e| panic!("open {ip}: {e}"))
    };
    // Addresses of our own in 127/8; one capture file for both devices is not supported by
    // a path (each would truncate it), so only `a` captures.
    let a = open("127.62.0.1");
    let b = Device::open(DeviceConfig::udp("127.62.0.2".parse().unwrap()))
        .unwrap_or_else(|e| panic!("open b: {e}"));
    let opts = SelftestOptions {
        sizes: vec![0, 64, 4096],
        iterations: 3,
        ..SelftestOptions::default()
    };
    run_rc(&a, &b, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let c = a.counters();
    // Every frame sent or received by `a` is captured.
    eprintln!("frames counted: {}", c.sent_pkts + c.rcvd_pkts);
    std::process::exit(7);
}
