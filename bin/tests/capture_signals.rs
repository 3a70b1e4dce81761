//! Captures that outlive their writer: a truncated last record, gzip, and tools killed with
//! SIGINT/SIGTERM in the middle of a run (issue 12, item 5).
//!
//! Only the `rocectl` binary and std; `gzip` and `tshark` come from `PATH` (the tshark check
//! fails without it unless `ROCECTL_SKIP_TSHARK=1`, and then says loudly that it was skipped).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A path for a file this test writes (per test name, so tests can run in parallel).
fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("capture_signals-{name}"))
}

fn rocectl(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(args)
        .args(paths)
        .output()
        .expect("run rocectl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Where each record of a classic little-endian pcap starts, and where the file ends.
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut at = 24;
    let mut starts = Vec::new();
    while at < bytes.len() {
        starts.push(at);
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + incl;
    }
    assert_eq!(at, bytes.len(), "the sample capture is whole");
    starts
}

/// `rocectl pcap sample` into `name`: one RoCEv2 frame per opcode.
fn sample(name: &str) -> (PathBuf, Vec<u8>) {
    let path = tmp(name);
    let out = rocectl(&["pcap", "sample"], &[&path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn check_and_dump_read_a_capture_cut_anywhere_in_its_last_record() {
    let (_, bytes) = sample("whole.pcap");
    let starts = record_starts(&bytes);
    let frames = starts.len();
    let last = *starts.last().unwrap();
    let path = tmp("cut.pcap");
    for cut in last + 1..bytes.len() {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let have = cut - last;
        let of = if have >= 16 {
            format!("{have} bytes of {}", bytes.len() - last)
        } else {
            format!("{have} bytes of its 16-byte header")
        };
        let note = format!("truncated last record at offset {last}, {of}");
        let out = rocectl(&["pcap", "check"], &[&path]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "cut at {cut}: {stdout}{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("{}: {note} (not checked)\n", path.display())),
            "cut at {cut}: {stdout}"
        );
        assert!(
            stdout.ends_with(&format!("{} passed, 0 failed\n", frames - 1)),
            "cut at {cut}: {stdout}"
        );
        let out = rocectl(&["pcap", "dump"], &[&path]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "cut at {cut}: {}", text(&out.stderr));
        assert_eq!(stdout.lines().count(), frames, "cut at {cut}: {stdout}");
        assert!(
            stdout.ends_with(&format!("{note}\n")),
            "cut at {cut}: {stdout}"
        );
    }
    // A file header cut short is still an error.
    std::fs::write(&path, &bytes[..20]).unwrap();
    let out = rocectl(&["pcap", "check"], &[&path]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("truncated capture"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn check_and_dump_read_gzip_captures() {
    let (path, bytes) = sample("gzip.pcap");
    let frames = record_starts(&bytes).len();
    let gz = tmp("gzip.pcap.gz");
    let out = Command::new("gzip")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("gzip on PATH");
    assert!(out.status.success());
    std::fs::write(&gz, &out.stdout).unwrap();
    // By magic, whatever the name.
    let renamed = tmp("gzip-in-disguise.pcap");
    std::fs::write(&renamed, &out.stdout).unwrap();
    for file in [&gz, &renamed] {
        let out = rocectl(&["pcap", "check"], &[file]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
        assert!(
            stdout.ends_with(&format!("{frames} passed, 0 failed\n")),
            "{stdout}"
        );
        let out = rocectl(&["pcap", "dump"], &[file]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            text(&rocectl(&["pcap", "dump"], &[&path]).stdout)
        );
    }
    // A .gz that is not gzip: one clear line.
    let fake = tmp("fake.pcap.gz");
    std::fs::write(&fake, b"plain text, not gzip").unwrap();
    let out = rocectl(&["pcap", "check"], &[&fake]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a pcap or pcapng capture, nor gzip-compressed"),
        "{}",
        text(&out.stderr)
    );
}

/// Whether tshark can be run; without it the caller fails unless `ROCECTL_SKIP_TSHARK=1`.
fn have_tshark(test: &str) -> bool {
    if Command::new("tshark").arg("--version").output().is_ok() {
        return true;
    }
    if std::env::var_os("ROCECTL_SKIP_TSHARK").is_some_and(|v| v == "1") {
        eprintln!(
            "\n\n!!!!!!!! SKIPPED the tshark part of {test}: tshark is not on PATH and \
             ROCECTL_SKIP_TSHARK=1 !!!!!!!!\n\n"
        );
        return false;
    }
    panic!(
        "tshark is not on PATH: install it (apt-get install tshark) or set ROCECTL_SKIP_TSHARK=1"
    );
}

/// Sends `signal` (`INT`, `TERM`) to `child`.
fn kill(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill on PATH");
    assert!(status.success());
}

/// Waits until `path` holds more than `bytes` (past the capture's 1 MiB buffer), failing if
/// `child` exits first or it takes more than 60 s.
fn wait_for_growth(child: &mut Child, path: &Path, bytes: u64) {
    let start = Instant::now();
    loop {
        if std::fs::metadata(path).is_ok_and(|m| m.len() > bytes) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("rocectl exited ({status}) before writing {bytes} bytes of capture");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no capture growth"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The capture a killed tool left: `pcap check` passes it whole (no truncation note) and
/// tshark reads it with nothing on stderr but its running-as-root notice.
fn assert_capture_whole(path: &Path, test: &str) {
    let out = rocectl(&["pcap", "check"], &[path]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("truncated"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.ends_with(" passed, 0 failed"), "{stdout}");
    let passed: u64 = last.split(' ').next().unwrap().parse().unwrap();
    assert!(passed > 100, "{stdout}");
    if have_tshark(test) {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(path)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        let complaints: Vec<_> = stderr
            .lines()
            .filter(|l| !l.starts_with("Running as user"))
            .collect();
        assert!(
            out.status.success() && complaints.is_empty(),
            "tshark: {stderr}"
        );
    }
}

/// `rocectl demo --pcap` on two loopback addresses of its own, killed with `signal` once the
/// capture has spilled its buffer at least twice: exits 128 + the signal number and leaves a
/// whole capture.
fn demo_killed(signal: &str, status: i32, a: &str, b: &str) {
    let test = format!("demo_killed_with_sig{}", signal.to_lowercase());
    let path = tmp(&format!("{test}.pcap"));
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args([
            "demo", "--a", a, "--b", b, "--sizes", "65536", "-n", "1000000",
        ])
        .arg("--pcap")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocectl demo");
    wait_for_growth(&mut child, &path, 3 << 20);
    kill(&child, signal);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "rocectl: SIG{signal}: capture {} closed (",
            path.display()
        )),
        "{stderr}"
    );
    assert_capture_whole(&path, &test);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn demo_killed_with_sigint_leaves_a_whole_capture() {
    demo_killed("INT", 130, "127.0.12.1", "127.0.12.2");
}

#[test]
fn demo_killed_with_sigterm_leaves_a_whole_capture() {
    demo_killed("TERM", 143, "127.0.12.3", "127.0.12.4");
}

#[test]
fn perftest_server_capturing_to_rocectl_pcap_killed_with_sigint_leaves_a_whole_capture() {
    let test = "perftest_server_killed_with_sigint";
    let template = tmp(&format!("{test}-{{dev}}.pcap"));
    // The device on 127.0.12.6 is `lo`.
    let path = tmp(&format!("{test}-lo.pcap"));
    let _ = std::fs::remove_file(&path);
    let port = "28601";
    let mut server = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args([
            "write-bw",
            "--local",
            "127.0.12.6",
            "-p",
            port,
            "-s",
            "65536",
        ])
        .args([
            "-n",
            "100000000",
            "--accept-timeout",
            "30",
            "--timeout",
            "20",
        ])
        .env("ROCECTL_PCAP", &template)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the server");
    // Give the server time to listen before the client connects (the client retries).
    std::thread::sleep(Duration::from_millis(200));
    let mut client = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args([
            "write-bw",
            "--local",
            "127.0.12.5",
            "-p",
            port,
            "-s",
            "65536",
        ])
        .args(["-n", "100000000", "--timeout", "20", "127.0.12.6"])
        .env_remove("ROCECTL_PCAP")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the client");
    wait_for_growth(&mut server, &path, 3 << 20);
    kill(&server, "INT");
    let out = server.wait_with_output().unwrap();
    let _ = client.kill();
    let _ = client.wait();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "rocectl: SIGINT: capture {} closed (",
            path.display()
        )),
        "{stderr}"
    );
    assert_capture_whole(&path, test);
    let _ = std::fs::remove_file(&path);
}

/// A classic pcap (Ethernet, little endian, microseconds) of `frames`, written by hand.
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65_535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for f in frames {
        b.extend_from_slice(&[0; 8]);
        let len = u32::try_from(f.len()).unwrap().to_le_bytes();
        b.extend_from_slice(&len);
        b.extend_from_slice(&len);
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap();
}

/// An Ethernet/IPv4/UDP frame to `port` with `payload` (checksums zero: not looked at).
fn udp_frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = u16::try_from(20 + 8 + payload.len()).unwrap();
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&5_000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

#[test]
fn check_fails_a_capture_without_a_rocev2_frame() {
    let dns = tmp("no-roce.pcap");
    write_pcap(&dns, &[udp_frame(53, b"query"), udp_frame(4_792, &[0; 40])]);
    let empty = tmp("empty.pcap");
    write_pcap(&empty, &[]);
    for path in [&dns, &empty] {
        let out = rocectl(&["pcap", "check"], &[path]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}{stderr}", text(&out.stdout));
        let frames = if path == &dns { 2 } else { 0 };
        assert_eq!(
            stderr,
            format!(
                "rocectl: error: {}: no RoCEv2 frame (UDP to port 4791) among its {frames} \
                 frames\n",
                path.display()
            )
        );
    }
    // With a good capture beside it, the run still fails, and the good one is still checked.
    let (good, _) = sample("beside-no-roce.pcap");
    let out = rocectl(&["pcap", "check"], &[&good, &dns]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains(&format!("{}: ", good.display())));
    // One RoCEv2 frame among others is enough.
    let (_, sample_bytes) = sample("one-roce.pcap");
    let first = record_starts(&sample_bytes)[0];
    let incl = u32::from_le_bytes(sample_bytes[first + 8..first + 12].try_into().unwrap());
    let roce = sample_bytes[first + 16..first + 16 + incl as usize].to_vec();
    let mixed = tmp("mixed.pcap");
    write_pcap(&mixed, &[udp_frame(53, b"query"), roce]);
    let out = rocectl(&["pcap", "check"], &[&mixed]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
