//! `rocectl pcap …` run as a process, on the shared rxe captures and on files built here.
//!
//! The shared directory is `$ROCE_SHARED_DIR`, or `../shared` beside the repository. A missing
//! captures directory fails the tests: the captures are the ground truth.
//!
//! The Wireshark test needs `tshark` on `PATH` (`apt-get install tshark`); it fails without it
//! unless `ROCECTL_SKIP_TSHARK=1`, in which case it says loudly that it was skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use roce_wire::pcap::PcapWriter;
use roce_wire::samples;

fn shared_dir() -> PathBuf {
    std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

fn captures_dir() -> PathBuf {
    shared_dir().join("captures")
}

fn rc_pingpong() -> PathBuf {
    captures_dir().join("rc_pingpong.pcap")
}

/// A path for a file this test writes (per test name, so tests can run in parallel).
fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pcap_cli-{name}"))
}

fn rocectl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(args)
        .output()
        .expect("run rocectl")
}

fn rocectl_paths(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(args)
        .args(paths)
        .output()
        .expect("run rocectl")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 stdout")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("UTF-8 stderr")
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or_default()
}

/// Byte ranges of the frame data of each record of a classic little-endian pcap file.
fn pcap_records(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    assert!(
        matches!(
            &bytes[..4],
            [0xD4, 0xC3, 0xB2, 0xA1] | [0x4D, 0x3C, 0xB2, 0xA1]
        ),
        "expected a little-endian classic pcap"
    );
    let mut at = 24;
    let mut out = Vec::new();
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(at + 16..at + 16 + incl);
        at += 16 + incl;
    }
    out
}

/// Writes Ethernet frames as a pcap file.
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_frame(Duration::from_millis(i as u64), f).unwrap();
    }
    std::fs::write(path, w.into_inner()).unwrap();
}

fn checker_script() -> PathBuf {
    shared_dir().join("tools/check_pcap.sh")
}

#[test]
fn help_lists_every_command() {
    let out = rocectl(&["--help"]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("pcap"), "{text}");

    let out = rocectl(&["pcap", "--help"]);
    assert!(out.status.success());
    let text = stdout(&out);
    for cmd in ["check", "dump", "sample"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(cmd)),
            "{cmd} missing from\n{text}"
        );
    }
}

#[test]
fn check_passes_every_shared_capture() {
    let dir = captures_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("captures directory {} unreadable: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    assert!(files.len() >= 16, "expected the 16 rxe captures");
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let out = rocectl_paths(&["pcap", "check"], &paths);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    // The RoCEv2 column of shared/captures/SUMMARY.md sums to 685 frames.
    assert_eq!(last_line(&text), "685 passed, 0 failed", "{text}");
    assert!(text.contains("rc_pingpong.pcap: 91 frames: 80 RoCEv2 (80 passed, 0 failed), 11 other"));
    assert!(text.contains("     167  RC_ACKNOWLEDGE\n"), "{text}");
}

#[test]
fn check_reports_corrupted_frames() {
    let mut bytes = std::fs::read(rc_pingpong()).unwrap();
    let records = pcap_records(&bytes);
    // Frame 11 is an RC_SEND_FIRST: a flipped payload byte breaks its ICRC.
    bytes[records[10].start + 60] ^= 0x01;
    // Frame 15 is an ACK: a wrong IPv4 header checksum is masked from the ICRC, but the frame
    // no longer re-emits to the same bytes.
    bytes[records[14].start + 24] ^= 0xFF;
    let path = tmp("corrupted.pcap");
    std::fs::write(&path, &bytes).unwrap();

    let out = rocectl_paths(&["pcap", "check"], &[&path]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert_eq!(last_line(&text), "78 passed, 2 failed", "{text}");
    let shown = path.display().to_string();
    assert!(
        text.contains(&format!(
            "{shown}: frame 11: bad ICRC: expected f46d80da, found "
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{shown}: frame 15: re-emit mismatch at offset 24 (0x18)"
        )),
        "{text}"
    );
    assert!(text.contains("  RC_SEND_FIRST (1 failed)"), "{text}");

    // Dump still prints every frame and flags the bad ICRC.
    let out = rocectl_paths(&["pcap", "dump"], &[&path]);
    let text = stdout(&out);
    assert!(out.status.success());
    assert_eq!(text.lines().count(), 91);
    assert!(text.contains("payload=1024 [bad ICRC: expected f46d80da, found "));
}

#[test]
fn check_fails_a_capture_whose_only_frame_is_bad() {
    let (_, mut frame) = samples::all().swap_remove(0);
    let last = frame.len() - 1;
    frame[last] ^= 0x80; // the ICRC itself
    let path = tmp("one-bad.pcap");
    write_pcap(&path, &[frame]);
    let out = rocectl_paths(&["pcap", "check"], &[&path]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("frame 1: bad ICRC"), "{text}");
    assert_eq!(last_line(&text), "0 passed, 1 failed", "{text}");
}

#[test]
fn truncated_and_garbage_frames_fail_without_panicking() {
    let samples = samples::all();
    let send = &samples[4].1; // RC_SEND_ONLY
    let frames = vec![
        send[..50].to_vec(), // snaplen-truncated RoCEv2 frame
        vec![0xFF; 10],      // not even an Ethernet header
        Vec::new(),          // empty record
        send.clone(),        // one good frame
    ];
    let path = tmp("truncated.pcap");
    write_pcap(&path, &frames);

    let out = rocectl_paths(&["pcap", "check"], &[&path]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("frame 1: parse error truncated"), "{text}");
    assert!(
        text.contains("4 frames: 2 RoCEv2 (1 passed, 1 failed), 2 other"),
        "{text}"
    );
    assert_eq!(last_line(&text), "1 passed, 1 failed", "{text}");

    let out = rocectl_paths(&["pcap", "dump"], &[&path]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].contains("RoCEv2 frame, error truncated"), "{text}");
    assert!(lines[1].contains("non-RoCE frame, 10 bytes"), "{text}");
    assert!(lines[3].contains("BTH RC_SEND_ONLY"), "{text}");
}

#[test]
fn check_reads_linux_cooked_captures() {
    // rc_pingpong.pcap with each Ethernet header replaced by a Linux cooked (SLL) header.
    let bytes = std::fs::read(rc_pingpong()).unwrap();
    let mut out = bytes[..24].to_vec();
    out[20..24].copy_from_slice(&113u32.to_le_bytes()); // LINKTYPE_LINUX_SLL
    for r in pcap_records(&bytes) {
        let eth = &bytes[r.clone()];
        let mut sll = vec![0, 0, 0, 1, 0, 6];
        sll.extend_from_slice(&eth[6..12]);
        sll.extend_from_slice(&[0, 0]);
        sll.extend_from_slice(&eth[12..]);
        let len = (sll.len() as u32).to_le_bytes();
        out.extend_from_slice(&bytes[r.start - 16..r.start - 8]); // timestamp
        out.extend_from_slice(&len);
        out.extend_from_slice(&len);
        out.extend_from_slice(&sll);
    }
    let path = tmp("sll.pcap");
    std::fs::write(&path, out).unwrap();
    let out = rocectl_paths(&["pcap", "check"], &[&path]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(last_line(&text), "80 passed, 0 failed", "{text}");
}

#[test]
fn dump_shows_rc_pingpong() {
    let out = rocectl_paths(&["pcap", "dump"], &[&rc_pingpong()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(text.lines().count(), 91);
    for expected in [
        "1 0.000000 TCP 10.77.0.2.38918 > 10.77.0.1.18515 len 0\n",
        "4 0.008901 TCP 10.77.0.2.38918 > 10.77.0.1.18515 len 52\n",
        "11 0.027818 10.77.0.2.49441 > 10.77.0.1.4791: \
         BTH RC_SEND_FIRST qpn=0x11 psn=9884366 payload=1024\n",
        "13 0.028036 10.77.0.2.49441 > 10.77.0.1.4791: \
         BTH RC_SEND_LAST qpn=0x11 psn=9884368 ack_req payload=952\n",
        "15 0.030850 10.77.0.1.49441 > 10.77.0.2.4791: \
         BTH RC_ACKNOWLEDGE qpn=0x11 psn=9884368 AETH ack msn=1\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

#[test]
fn dump_shows_extension_headers() {
    let cases = [
        (
            "rping.pcap",
            "RC_RDMA_READ_REQUEST qpn=0x21 psn=15288546 ack_req RETH va=0x55c90588fd50 \
             rkey=0x00001449 len=64",
        ),
        (
            "rping.pcap",
            "BTH UD_SEND_ONLY qpn=0x1 psn=6 ack_req DETH qkey=0x80010000 src_qp=0x1 payload=256",
        ),
        (
            "ib_atomic_bw_cas.pcap",
            "RC_ATOMIC_ACKNOWLEDGE qpn=0x1b psn=9284033 AETH ack msn=1 \
             AtomicAckETH orig=0x5bbf192078c44c1c",
        ),
    ];
    for (file, expected) in cases {
        let out = rocectl_paths(&["pcap", "dump"], &[&captures_dir().join(file)]);
        assert!(out.status.success());
        let text = stdout(&out);
        assert!(text.contains(expected), "{file}: missing {expected:?}");
    }
}

#[test]
fn sample_passes_check() {
    let path = tmp("sample-check.pcap");
    let out = rocectl_paths(&["pcap", "sample"], &[&path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n = samples::all().len();
    assert!(stdout(&out).contains(&format!("wrote {n} sample frames")));

    let out = rocectl_paths(&["pcap", "check"], &[&path]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(last_line(&text), format!("{n} passed, 0 failed"), "{text}");
    assert!(text.contains("  CNP\n"), "{text}");
}

#[test]
fn sample_passes_the_wireshark_checker() {
    if Command::new("tshark").arg("--version").output().is_err() {
        if std::env::var_os("ROCECTL_SKIP_TSHARK").is_some_and(|v| v == "1") {
            eprintln!(
                "\n\n!!!!!!!! SKIPPED sample_passes_the_wireshark_checker: tshark is not on PATH \
                 and ROCECTL_SKIP_TSHARK=1 !!!!!!!!\n\n"
            );
            return;
        }
        panic!(
            "tshark is not on PATH: install it (apt-get install tshark) or set \
             ROCECTL_SKIP_TSHARK=1 to skip this test"
        );
    }
    let path = tmp("sample-tshark.pcap");
    let out = rocectl_paths(&["pcap", "sample"], &[&path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = checker_script();
    let out = Command::new("bash")
        .arg(&script)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{} failed:\n{text}\n{}",
        script.display(),
        stderr(&out)
    );
    let n = samples::all().len();
    assert!(
        text.contains(&format!("{n} packets, {n} RoCEv2, {n} ICRC ok, 0 bad")),
        "{text}"
    );
}

#[test]
fn missing_file_is_a_clear_error() {
    let missing = tmp("does-not-exist.pcap");
    for cmd in ["check", "dump"] {
        let out = rocectl_paths(&["pcap", cmd], &[&missing]);
        assert!(!out.status.success(), "{cmd}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "rocectl: error: cannot open {}",
                missing.display()
            )) && err.contains("No such file"),
            "{cmd}: {err}"
        );
    }
    // One unreadable file among good ones still fails the run.
    let out = rocectl_paths(&["pcap", "check"], &[&rc_pingpong(), &missing]);
    assert!(!out.status.success());
    assert!(stdout(&out).contains("(1 unreadable)"));
}

#[test]
fn not_a_capture_is_a_clear_error() {
    let path = tmp("not-a-capture.txt");
    std::fs::write(&path, "hello, this is text\n").unwrap();
    for cmd in ["check", "dump"] {
        let out = rocectl_paths(&["pcap", cmd], &[&path]);
        assert!(!out.status.success(), "{cmd}");
        assert!(
            stderr(&out).contains("not a pcap or pcapng capture"),
            "{cmd}: {}",
            stderr(&out)
        );
    }
}
