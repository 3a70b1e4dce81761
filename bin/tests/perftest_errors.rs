//! The perftest tools' errors: each ends the process with a message that says what went wrong,
//! within a bounded time: a GID index that does not exist, options a tool does not take, a
//! server nobody connects to, a server that is not there, one that accepts but never answers
//! the exchange, and one that answers the exchange but whose RoCE side never answers (the RC
//! retries run out and the completion status is printed as the stock tools print it).
//!
//! Each test that uses the network runs in a private network namespace (the test kit's
//! `private_net`; `rocectl` inherits it from the test's thread), so the fixed TCP ports and
//! 127.0.6x addresses cannot collide with anything else on the host.

#[path = "../src/oob/mod.rs"]
mod oob;
mod perftest_common;

use std::net::TcpListener;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use oob::perftest::{PerftestConn, PerftestDest, Tool};
use oob::Timeout;
use perftest_common::{args, rocectl, run, wait, Output};
use roce_testkit::netns::private_net;
use roce_wire::{Gid, Psn, Qpn, RKey};

const LIMIT: Duration = Duration::from_secs(30);

fn failed_with(out: &Output, needle: &str) {
    assert!(
        !out.status.success(),
        "expected a failure, got {:?}\n{}",
        out.status,
        out.stdout
    );
    assert!(
        out.stderr.contains(needle),
        "stderr does not mention {needle:?}:\n{}",
        out.stderr
    );
}

#[test]
fn gid_index_that_does_not_exist() {
    // A private namespace: the fixed ports and addresses below meet nothing of the host.
    let _net = private_net();
    let t = Instant::now();
    let out = run(&args("write-bw -d lo -x 9 -p 28601 127.0.0.1"), LIMIT);
    failed_with(&out, "GID index 9 does not exist on lo");
    // The message lists the table, as rxe would have it.
    assert!(out.stderr.contains("::ffff:127.0.0.1"), "{}", out.stderr);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn options_a_tool_does_not_take() {
    for (cmd, needle) in [
        (
            "write-bw -A CMP_AND_SWAP 127.0.0.1",
            "-A/--atomic_type is for atomic-bw only",
        ),
        (
            "write-bw -c UD 127.0.0.1",
            "write-bw does not support connection type",
        ),
        (
            "read-lat -c UC 127.0.0.1",
            "read-lat does not support connection type",
        ),
        (
            "send-bw -o 4 127.0.0.1",
            "-o/--outs is for the read and atomic tests only",
        ),
        (
            "send-bw -q 2 127.0.0.1",
            "-q above 1 is supported by write-bw, read-bw and atomic-bw",
        ),
        ("write-bw -q 0 127.0.0.1", "-q 0: between 1 and 64"),
        ("write-bw -q 65 127.0.0.1", "-q 65: between 1 and 64"),
        (
            "write-bw -q 2 --chk 127.0.0.1",
            "--chk checks one queue pair",
        ),
        ("atomic-bw -a 127.0.0.1", "-a does not apply"),
        ("send-lat -m 1000 127.0.0.1", "-m 1000"),
    ] {
        failed_with(&run(&args(cmd), LIMIT), needle);
    }
}

#[test]
fn server_nobody_connects_to() {
    // A private namespace: the fixed ports and addresses below meet nothing of the host.
    let _net = private_net();
    let t = Instant::now();
    let out = run(
        &args("write-bw --local 127.0.60.2 -p 28602 --accept-timeout 1"),
        LIMIT,
    );
    failed_with(&out, "waiting for a perftest client");
    assert!(
        out.stdout.contains("Waiting for client to connect"),
        "{}",
        out.stdout
    );
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn server_that_is_not_there() {
    // A private namespace: the fixed ports and addresses below meet nothing of the host.
    let _net = private_net();
    let t = Instant::now();
    let out = run(
        &args("send-lat --local 127.0.60.1 -p 28603 --timeout 1 127.0.60.3"),
        LIMIT,
    );
    failed_with(&out, "cannot connect to 127.0.60.3:28603");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn server_that_never_answers_the_exchange() {
    // A private namespace: the fixed ports and addresses below meet nothing of the host.
    let _net = private_net();
    let listener = TcpListener::bind("127.0.61.2:28604").unwrap();
    // Accept and keep the connection open without a word.
    let keeper = thread::spawn(move || {
        let conn = listener.accept();
        thread::sleep(Duration::from_secs(5));
        drop(conn);
    });
    let t = Instant::now();
    let out = run(
        &args("read-bw --local 127.0.61.1 -p 28604 --timeout 2 127.0.61.2"),
        LIMIT,
    );
    failed_with(&out, "peer did not answer the exchange within 2s");
    assert!(out.stderr.contains("perftest version"), "{}", out.stderr);
    assert!(t.elapsed() < Duration::from_secs(10));
    keeper.join().unwrap();
}

#[test]
fn roce_peer_that_never_answers() {
    // A private namespace: the fixed ports and addresses below meet nothing of the host.
    let _net = private_net();
    // A server that speaks perftest's exchange but has no queue pair behind its record: the
    // client's RDMA WRITEs go unacknowledged until the RC retries run out.
    let listener = TcpListener::bind("127.0.62.2:28605").unwrap();
    let fake = thread::spawn(move || {
        let t = Timeout::After(Duration::from_secs(20));
        let mut conn = PerftestConn::accept(&listener, t, t).unwrap();
        let mine = PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: Qpn::new(0x1234),
            psn: Psn::new(0x42),
            rkey: RKey::new(0x777),
            vaddr: 0x7F00_0000_0000,
            gid: Gid::from_ip("127.0.62.2".parse().unwrap()),
            srqn: 0,
        };
        conn.exchange_keys(Tool::WriteBw, &mine, 5).unwrap();
        conn.sync_before_traffic(Tool::WriteBw, &mine).unwrap();
        // The client gives up: its next message never comes, the connection closes.
        let end = conn.finish(Tool::WriteBw, &mine, &Default::default());
        assert!(end.is_err());
    });
    let t = Instant::now();
    let out = run(
        &args("write-bw --local 127.0.62.1 -p 28605 --timeout 20 -n 10 127.0.62.2"),
        LIMIT,
    );
    failed_with(&out, "transport retry counter exceeded");
    assert!(out.stderr.contains("status 12"), "{}", out.stderr);
    assert!(t.elapsed() < Duration::from_secs(20));
    fake.join().unwrap();
}

/// A bad engine count, from `--engines` or from `ROCECTL_ENGINES` (which every tool that opens
/// a device reads, the pingpongs too): one line that names the value and the range, exit
/// status 2, before anything is opened.
#[test]
fn bad_engine_counts_are_usage_errors() {
    let range = "the number of engines is a whole number from 1 to 64";
    let cases: [(&str, Option<&str>, String); 5] = [
        (
            "write-bw --engines 0 -q 2 127.0.0.1",
            None,
            format!("--engines 0: {range}"),
        ),
        (
            "send-bw --engines 65 127.0.0.1",
            None,
            format!("--engines 65: {range}"),
        ),
        (
            "read-bw --engines two 127.0.0.1",
            None,
            format!("--engines two: {range}"),
        ),
        (
            "write-bw 127.0.0.1",
            Some("0"),
            format!("ROCECTL_ENGINES=0: {range}"),
        ),
        (
            "rc-pingpong -d lo",
            Some("many"),
            format!("ROCECTL_ENGINES=many: {range}"),
        ),
    ];
    for (cmd, env, line) in cases {
        let t = Instant::now();
        let mut c = rocectl();
        c.args(args(cmd))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match env {
            Some(v) => c.env("ROCECTL_ENGINES", v),
            None => c.env_remove("ROCECTL_ENGINES"),
        };
        let out = wait(c.spawn().expect("start rocectl"), LIMIT);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{cmd} (env {env:?}): {}",
            out.stderr
        );
        assert_eq!(
            out.stderr,
            format!("rocectl: error: {line}\n"),
            "{cmd} (env {env:?})"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{cmd}");
    }
}
