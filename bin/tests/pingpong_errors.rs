//! The pingpong tools' failures name their cause: a GID index that does not exist (the
//! message prints the table), a path MTU the interface cannot carry, a path MTU mismatch
//! between the two sides (the completion error as the stock tools print it, plus a hint), a
//! server that is not there, a server that does not answer the exchange, and a peer that
//! never answers over RoCE — each with exit status 1 within a bounded time.

mod pingpong_support;

use std::process::Command;
use std::time::{Duration, Instant};

use pingpong_support::{Netns, ROCECTL};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn gid_index_that_does_not_exist() {
    // Fails before opening anything: needs no namespace and no privileges.
    let out = Command::new(ROCECTL)
        .args(["rc-pingpong", "-d", "lo", "-g", "9", "127.0.0.1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rocectl: error: GID index 9 does not exist on lo"),
        "{err}"
    );
    assert!(err.contains("GID[  1]: ::ffff:127.0.0.1, RoCE v2"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn gid_index_zero_without_link_local_address() {
    let Some(ns) = Netns::new("gid0") else { return };
    let out = ns.run(&["ud-pingpong", "-d", "lo", "-g", "0", "127.0.0.1"], LIMIT);
    out.expect_code(1);
    assert!(
        out.stderr
            .contains("GID index 0 of lo is the link-local GID fe80::200:ff:fe00:0"),
        "{}",
        out.stderr
    );
}

#[test]
fn path_mtu_larger_than_the_interface_allows() {
    let Some(ns) = Netns::new("ifmtu") else {
        return;
    };
    ns.ip(&["link", "set", "lo", "mtu", "1500"]);
    let out = ns.run(&["rc-pingpong", "-d", "lo", "-g", "1", "-m", "2048"], LIMIT);
    out.expect_code(1);
    assert!(
        out.stderr.contains(
            "path MTU 2048 (-m) is larger than the active MTU 1024 of lo (interface MTU 1500)"
        ),
        "{}",
        out.stderr
    );
    let out = ns.run(&["ud-pingpong", "-d", "lo", "-g", "1", "-s", "2048"], LIMIT);
    out.expect_code(1);
    assert!(
        out.stderr
            .contains("Requested size larger than port MTU (1024)"),
        "{}",
        out.stderr
    );
}

#[test]
fn invalid_mtu_value_is_a_usage_error() {
    let out = Command::new(ROCECTL)
        .args(["rc-pingpong", "-m", "1000"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use 256, 512, 1024, 2048 or 4096"), "{err}");
}

#[test]
fn path_mtu_mismatch_between_the_sides() {
    let Some(ns) = Netns::new("mismatch") else {
        return;
    };
    let server = ns.spawn(&[
        "rc-pingpong",
        "-d",
        "lo",
        "-g",
        "1",
        "-n",
        "5",
        "--timeout",
        "20",
    ]);
    let client = ns
        .spawn(&[
            "rc-pingpong",
            "-d",
            "lo",
            "-g",
            "2",
            "-n",
            "5",
            "-m",
            "2048",
            "--timeout",
            "20",
            "127.0.0.1",
        ])
        .finish(LIMIT);
    let server = server.finish(LIMIT);
    client.expect_code(1);
    server.expect_code(1);
    // Our responder refuses the 2048-byte packets (NAK invalid request), as the spec says.
    assert!(
        client
            .stderr
            .starts_with("Failed status remote invalid request error (9) for wr_id 2\n"),
        "{}",
        client.stderr
    );
    assert!(
        client.stderr.contains("path MTU mismatch"),
        "{}",
        client.stderr
    );
    assert!(
        server
            .stderr
            .starts_with("Failed status Work Request Flushed Error (5) for wr_id 1\n"),
        "{}",
        server.stderr
    );
    assert!(
        server
            .stderr
            .contains("path MTU mismatch: both sides must use the same -m (ours: 1024)"),
        "{}",
        server.stderr
    );
}

#[test]
fn server_not_listening() {
    let Some(ns) = Netns::new("nolisten") else {
        return;
    };
    let start = Instant::now();
    let out = ns.run(
        &[
            "rc-pingpong",
            "-d",
            "lo",
            "-g",
            "2",
            "--oob-timeout",
            "2",
            "127.0.0.1",
        ],
        LIMIT,
    );
    out.expect_code(1);
    assert!(start.elapsed() < Duration::from_secs(15));
    assert!(
        out.stderr
            .contains("rocectl: error: Couldn't connect to 127.0.0.1:18515"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("Connection refused"), "{}", out.stderr);
}

#[test]
fn server_without_client_gives_up_at_the_timeout() {
    let Some(ns) = Netns::new("noclient") else {
        return;
    };
    let out = ns.run(
        &["srq-pingpong", "-d", "lo", "-g", "1", "--timeout", "1"],
        LIMIT,
    );
    out.expect_code(1);
    assert!(
        out.stderr
            .contains("no client connected to TCP port 18515 within 1s (--timeout)"),
        "{}",
        out.stderr
    );
}

/// A fake peer in Python: accepts one connection on TCP 18515 and then follows `script`.
fn python_peer(ns: &Netns, script: &str) -> Option<pingpong_support::Proc> {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        roce_testkit::skip(
            &roce_testkit::current_test(),
            "python3 is needed for the fake peer (scripts/setup.sh installs it)",
        );
        return None;
    }
    let program = format!(
        "import socket, sys, time\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', 18515))\n\
         s.listen(1)\n\
         c, _ = s.accept()\n\
         def read(n):\n\
         \x20   b = b''\n\
         \x20   while len(b) < n:\n\
         \x20       x = c.recv(n - len(b))\n\
         \x20       if not x:\n\
         \x20           break\n\
         \x20       b += x\n\
         \x20   return b\n\
         {script}\n"
    );
    let peer = ns.spawn_program("python3", &["-c", &program]);
    // The client connects only once: order the steps on the listening socket, not on time.
    peer.wait_listening(18_515, LIMIT);
    Some(peer)
}

#[test]
fn server_that_never_answers_the_exchange() {
    let Some(ns) = Netns::new("silenttcp") else {
        return;
    };
    let Some(peer) = python_peer(&ns, "read(52)\ntime.sleep(10)") else {
        return;
    };
    let start = Instant::now();
    let out = ns.run(
        &[
            "rc-pingpong",
            "-d",
            "lo",
            "-g",
            "2",
            "--oob-timeout",
            "2",
            "127.0.0.1",
        ],
        LIMIT,
    );
    out.expect_code(1);
    assert!(start.elapsed() < Duration::from_secs(15));
    assert!(
        out.stderr.contains(
            "Couldn't read/write remote address: peer did not answer the exchange within 2s \
             (waiting for the server's address)"
        ),
        "{}",
        out.stderr
    );
    drop(peer.finish(LIMIT));
}

#[test]
fn peer_that_never_answers_over_roce() {
    // The exchange completes, but nothing listens on UDP 4791 at the GID the peer gave: the
    // client's SEND is retried 7 times (ACK timeout 14: 67 ms) and fails like the stock tool.
    let Some(ns) = Netns::new("silentroce") else {
        return;
    };
    let answer = "0000:000011:000001:00000000000000000000ffff7f000001";
    let script = format!("read(52)\nc.sendall(b'{answer}\\x00')\nread(5)\ntime.sleep(5)");
    let Some(peer) = python_peer(&ns, &script) else {
        return;
    };
    let start = Instant::now();
    let out = ns.run(&["rc-pingpong", "-d", "lo", "-g", "2", "127.0.0.1"], LIMIT);
    out.expect_code(1);
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(
        out.stdout.contains(
            "  remote address: LID 0x0000, QPN 0x000011, PSN 0x000001, GID ::ffff:127.0.0.1"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr
            .starts_with("Failed status transport retry counter exceeded (12) for wr_id 2\n"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("nothing ever came back from the peer at 127.0.0.1"),
        "{}",
        out.stderr
    );
    drop(peer.finish(LIMIT));
}

#[test]
fn srq_peer_with_fewer_qps() {
    let Some(ns) = Netns::new("srqq") else { return };
    let server = ns.spawn(&[
        "srq-pingpong",
        "-d",
        "lo",
        "-g",
        "1",
        "-q",
        "2",
        "-n",
        "4",
        "--timeout",
        "5",
    ]);
    let client = ns
        .spawn(&[
            "srq-pingpong",
            "-d",
            "lo",
            "-g",
            "2",
            "-q",
            "3",
            "-n",
            "4",
            "--timeout",
            "5",
            "127.0.0.1",
        ])
        .finish(LIMIT);
    let server = server.finish(LIMIT);
    client.expect_code(1);
    assert!(
        client.stderr.contains("both sides must use the same -q"),
        "{}",
        client.stderr
    );
    // The server had all it needed from the client's three records; it waits, then gives up.
    assert_eq!(server.status.code(), Some(1), "{server:?}");
}
