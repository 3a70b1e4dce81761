//! Size and count options out of range: every tool refuses them up front with one clear line
//! and exit status 1, before it allocates, opens a device or waits for a peer (issue 12, item
//! 5: `rc-pingpong -s 99999999999` and `demo --sizes 99999999999` aborted with status 134).
//!
//! Only std and the `rocectl` binary; nothing here needs root or a peer: each command must fail
//! before it would bind or listen (a server that starts waiting is a failure of the test).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `rocectl args`, killing it after 20 s; returns (exit code, stdout, stderr).
fn rocectl(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocectl");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "rocectl {args:?} did not exit within 20 s (it should refuse its options at \
                 once)\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `args` fails with exit status 1 and exactly one line, `rocectl: error: {want}`.
fn refused(args: &[&str], want: &str) {
    let (code, stdout, stderr) = rocectl(args);
    assert_eq!(
        (code, stderr.as_str()),
        (Some(1), format!("rocectl: error: {want}\n").as_str()),
        "rocectl {args:?}\n--- stdout\n{stdout}"
    );
}

const HUGE_SIZE: &str =
    "a message size is between 0 and 2147483648 bytes (2^31, the largest RDMA message)";

#[test]
fn pingpong_sizes_and_counts() {
    for tool in ["rc-pingpong", "uc-pingpong", "srq-pingpong"] {
        // Server and client: neither gets as far as listening or connecting.
        for peer in [None, Some("127.0.0.1")] {
            let with = |extra: &[&'static str]| -> Vec<&str> {
                let mut v = vec![tool, "-d", "lo", "-g", "1"];
                v.extend_from_slice(extra);
                v.extend(peer);
                v
            };
            refused(
                &with(&["-s", "99999999999"]),
                &format!("-s 99999999999: {HUGE_SIZE}"),
            );
            refused(
                &with(&["-s", "2147483649"]),
                &format!("-s 2147483649: {HUGE_SIZE}"),
            );
            refused(
                &with(&["-r", "99999999999"]),
                "-r 99999999999: a queue depth is between 1 and 16384 (the device's max_qp_wr)",
            );
            refused(
                &with(&["-n", "4294967296"]),
                "-n 4294967296: between 0 and 4294967295 (the stock tools' iteration count is \
                 32 bits)",
            );
            refused(
                &with(&["--timeout", "1e300"]),
                "--timeout 1e300: expected a positive number of seconds, at most 1000000000",
            );
            refused(
                &with(&["--oob-timeout", "0"]),
                "--oob-timeout 0.0: expected a positive number of seconds, at most 1000000000",
            );
        }
    }
    refused(
        &["rc-pingpong", "-r", "0"],
        "-r 0: at least one receive must be posted",
    );
    refused(
        &["srq-pingpong", "-s", "0"],
        "-s 0: srq-pingpong needs a message of at least one byte",
    );
    refused(
        &["srq-pingpong", "-q", "0"],
        "-q 0: at least one QP is needed",
    );
}

#[test]
fn perftest_sizes_and_counts() {
    for tool in [
        "send-bw",
        "write-bw",
        "read-bw",
        "send-lat",
        "write-lat",
        "read-lat",
    ] {
        for peer in [None, Some("127.0.14.2")] {
            let with = |extra: &[&'static str]| -> Vec<&str> {
                let mut v = vec![tool, "--local", "127.0.14.1", "-p", "28701"];
                v.extend_from_slice(extra);
                v.extend(peer);
                v
            };
            refused(
                &with(&["-s", "99999999999"]),
                &format!(
                    "-s 99999999999: {}",
                    HUGE_SIZE.replace("between 0", "between 1")
                ),
            );
            refused(
                &with(&["-s", "0"]),
                &format!("-s 0: {}", HUGE_SIZE.replace("between 0", "between 1")),
            );
            refused(
                &with(&["-n", "99999999999"]),
                "-n 99999999999: between 1 and 100000000 (one timestamp is kept per iteration)",
            );
            refused(
                &with(&["-t", "99999999999"]),
                "-t 99999999999: a queue depth is between 1 and 16384 (the device's max_qp_wr)",
            );
            refused(
                &with(&["-r", "16385"]),
                "-r 16385: a queue depth is between 1 and 16384 (the device's max_qp_wr)",
            );
            refused(
                &with(&["--timeout", "18446744073709551615"]),
                "--timeout 18446744073709551615: between 0 and 1000000000 (seconds)",
            );
            refused(
                &with(&["--accept-timeout", "18446744073709551615"]),
                "--accept-timeout 18446744073709551615: between 0 and 1000000000 (seconds)",
            );
            refused(&with(&["-t", "0"]), "-o, -t, -r and -Q must be at least 1");
            refused(&with(&["-Q", "0"]), "-o, -t, -r and -Q must be at least 1");
        }
    }
    refused(
        &["atomic-bw", "--local", "127.0.14.1", "-n", "99999999999"],
        "-n 99999999999: between 1 and 100000000 (one timestamp is kept per iteration)",
    );
    refused(
        &["send-lat", "--local", "127.0.14.1", "-n", "1"],
        "-n must be at least 2",
    );
}

#[test]
fn demo_sizes() {
    refused(
        &[
            "demo",
            "--a",
            "127.0.14.3",
            "--b",
            "127.0.14.4",
            "--sizes",
            "64,99999999999",
        ],
        &format!("--sizes 99999999999: {HUGE_SIZE}"),
    );
    // The largest message is accepted by the check (not run: it needs 2 GiB buffers).
    let (code, _, stderr) = rocectl(&["demo", "--backend", "sim", "--sizes", "0,1", "-n", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
}
