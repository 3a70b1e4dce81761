//! "Address in use" names the process that holds the port (issue 12, item 5): a second rocectl
//! on an address a first one holds used to blame "a kernel rdma_rxe device".
//!
//! Only std and the `rocectl` binary, on loopback addresses of its own, no root.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn a_second_rocectl_names_the_first() {
    // A long demo holds 127.0.16.1:4791 and 127.0.16.3:4791.
    let mut first = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args([
            "demo",
            "--a",
            "127.0.16.1",
            "--b",
            "127.0.16.3",
            "-n",
            "100000000",
        ])
        .args(["--sizes", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the first rocectl");
    let pid = first.id();
    // Both devices are open once it prints its table header.
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let opened = lines.any(|l| l.is_ok_and(|l| l.starts_with("operation")));
    assert!(opened, "the first rocectl did not open its devices");
    let out = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(["demo", "--a", "127.0.16.1", "--b", "127.0.16.2", "-n", "1"])
        .args(["--sizes", "64"])
        .output()
        .expect("run the second rocectl");
    let _ = first.kill();
    let _ = first.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "rocectl: error: opening device rocectl-a on 127.0.16.1: 127.0.16.1:4791 is already \
             in use (another RoCE stack or rocectl instance?): process {pid} (rocectl) holds \
             127.0.16.1:4791; see `ss -uapn 'sport = :4791'`\n"
        )
    );
}
