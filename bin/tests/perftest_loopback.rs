//! Every perftest tool, our server against our client: two `rocectl` processes over loopback
//! (server on 127.0.N.2, client on 127.0.N.1, a TCP port per test, so tests run in parallel
//! and do not meet the 127.0.0.1/127.0.0.2 pair the demo and the benches use). Each test
//! checks that both exit 0, that the result table parses with perftest's columns, and that
//! the `--json` numbers are positive.

mod perftest_common;

use std::time::Duration;

use perftest_common::{args, json_num, run, spawn, spawn_env, table, wait};
use roce_testkit::netns::private_net;

const LIMIT: Duration = Duration::from_secs(60);

/// What a test expects of the tables.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bw,
    Lat,
}

/// Runs `tool` with `extra` options on both sides (network `n`); returns both outputs'
/// stdout after the checks common to every tool.
fn pair(n: u8, tool: &str, extra: &str, kind: Kind) -> (String, String) {
    // A private namespace per test (both `rocectl`s inherit it from this thread): the fixed
    // ports meet nothing of the host's.
    let _net = private_net();
    let port = 28_500 + u16::from(n);
    let server_args = args(&format!(
        "{tool} --local 127.0.{n}.2 -p {port} --accept-timeout 30 --timeout 20 --json {extra}"
    ));
    let client_args = args(&format!(
        "{tool} --local 127.0.{n}.1 -p {port} --timeout 20 --json {extra} 127.0.{n}.2"
    ));
    let server = spawn(&server_args);
    let client = run(&client_args, LIMIT);
    let server = wait(server, LIMIT);
    assert!(
        client.status.success() && server.status.success(),
        "{tool} {extra}: client {:?}, server {:?}\n--- client stdout\n{}\n--- client stderr\n{}\n\
         --- server stdout\n{}\n--- server stderr\n{}",
        client.status,
        server.status,
        client.stdout,
        client.stderr,
        server.stdout,
        server.stderr
    );
    let rows = table(&client.stdout);
    assert!(!rows.is_empty(), "no result row:\n{}", client.stdout);
    let columns = match kind {
        Kind::Bw => 5,
        Kind::Lat => 9,
    };
    for r in &rows {
        assert_eq!(r.len(), columns, "row {r:?} in\n{}", client.stdout);
        assert!(
            r.iter().all(|x| x.is_finite() && *x >= 0.0),
            "row {r:?} in\n{}",
            client.stdout
        );
    }
    match kind {
        Kind::Bw => {
            // Tiny messages round to 0.00 MB/sec; the message rate never does.
            assert!(
                rows.iter().all(|r| r[4] > 0.0),
                "message rate 0:\n{}",
                client.stdout
            );
            for key in ["bytes_per_s", "ops_per_s"] {
                let v = json_num(&client.stdout, key).unwrap_or(0.0);
                assert!(v > 0.0, "{key} = {v}:\n{}", client.stdout);
            }
        }
        Kind::Lat => {
            let med = json_num(&client.stdout, "median_us").unwrap_or(0.0);
            let p99 = json_num(&client.stdout, "p99_us").unwrap_or(0.0);
            let p999 = json_num(&client.stdout, "p999_us").unwrap_or(0.0);
            assert!(
                med > 0.0 && p99 >= med && p999 >= p99,
                "median {med}, p99 {p99}, p99.9 {p999}:\n{}",
                client.stdout
            );
        }
    }
    (client.stdout, server.stdout)
}

fn iters(rows: &[Vec<f64>]) -> Vec<f64> {
    rows.iter().map(|r| r[1]).collect()
}

#[test]
fn send_bw_rc() {
    let (c, s) = pair(51, "send-bw", "-n 300 -s 65536", Kind::Bw);
    assert_eq!(iters(&table(&c)), [300.0]);
    // The SEND server measures what it received.
    assert_eq!(table(&s)[0][..2], [65_536.0, 300.0]);
}

#[test]
fn send_bw_uc_and_ud() {
    pair(52, "send-bw", "-c UC -n 300 -s 8192", Kind::Bw);
    let (c, s) = pair(52, "send-bw", "-c UD -n 300 -s 1024", Kind::Bw);
    assert_eq!(table(&c)[0][0], 1024.0);
    // UD may lose messages; the server reports what arrived.
    let got = table(&s)[0][1];
    assert!(got > 0.0 && got <= 300.0, "{s}");
    assert!(json_num(&s, "lost").is_some(), "{s}");
}

#[test]
fn write_bw_rc_and_uc() {
    for conn in ["RC", "UC"] {
        let (c, s) = pair(
            53,
            "write-bw",
            &format!("-c {conn} -n 300 -m 1024"),
            Kind::Bw,
        );
        // The server prints the client's report, as ib_write_bw's does.
        assert_eq!(table(&s), table(&c), "{conn}");
        assert!(c.contains("Mtu             : 1024[B]"), "{c}");
    }
}

#[test]
fn read_bw() {
    let (c, s) = pair(54, "read-bw", "-n 300 -s 16384 -o 16", Kind::Bw);
    assert!(c.contains("Outstand reads  : 16"), "{c}");
    assert!(c.contains(" OUT 0x10 RKey "), "{c}");
    assert_eq!(table(&s), table(&c));
}

#[test]
fn atomic_bw_both_operations() {
    for op in ["FETCH_AND_ADD", "CMP_AND_SWAP"] {
        let (c, _) = pair(55, "atomic-bw", &format!("-A {op} -n 500"), Kind::Bw);
        assert!(c.contains(&format!("Atomic {op} BW Test")), "{c}");
        assert_eq!(table(&c)[0][..2], [8.0, 500.0]);
    }
}

#[test]
fn send_lat_rc_ud_and_events() {
    let (c, s) = pair(56, "send-lat", "-n 300 -s 64", Kind::Lat);
    assert_eq!(table(&c)[0][..2], [64.0, 300.0]);
    assert_eq!(table(&s)[0][..2], [64.0, 300.0]);
    pair(56, "send-lat", "-c UD -n 300 -s 64", Kind::Lat);
    let (c, _) = pair(56, "send-lat", "-e -n 200 -s 64", Kind::Lat);
    assert!(c.contains("\"recv\":\"block\""), "{c}");
}

#[test]
fn write_lat() {
    let (c, s) = pair(57, "write-lat", "-n 300 -s 64", Kind::Lat);
    assert_eq!(table(&c)[0][..2], [64.0, 300.0]);
    // Both sides measure; the server writes first.
    assert_eq!(table(&s)[0][..2], [64.0, 300.0]);
    pair(57, "write-lat", "-c UC -n 200 -s 4096", Kind::Lat);
}

#[test]
fn read_lat() {
    let (c, s) = pair(58, "read-lat", "-n 300 -s 64", Kind::Lat);
    assert_eq!(table(&c)[0][..2], [64.0, 300.0]);
    // The read server only answers: no table, as ib_read_lat's.
    assert!(table(&s).is_empty(), "{s}");
    // READ latency is the round trip itself: the table's typical equals the JSON median.
    let typical = table(&c)[0][4];
    let median = json_num(&c, "median_us").unwrap();
    assert!((typical - median).abs() < 0.01, "{typical} vs {median}");
}

#[test]
fn all_sizes() {
    // -a: every size 2..2^23, with the per-size barriers of ib_send_bw (before and after
    // each size) and none for the others.
    let sizes: Vec<f64> = (1..24).map(|i| f64::from(1u32 << i)).collect();
    let (c, s) = pair(59, "send-bw", "-a -n 4", Kind::Bw);
    assert_eq!(table(&c).iter().map(|r| r[0]).collect::<Vec<_>>(), sizes);
    assert_eq!(table(&s).len(), 23);
    let (c, _) = pair(59, "write-lat", "-a -n 4", Kind::Lat);
    assert_eq!(table(&c).len(), 23);
    // UD: the sizes up to the path MTU.
    let (c, _) = pair(59, "send-lat", "-a -n 4 -c UD -m 1024", Kind::Lat);
    assert_eq!(table(&c).last().map(|r| r[0]), Some(1024.0));
}

#[test]
fn several_qps() {
    // -q 3: three QPs on each side, -n messages on each; the table prints them per QP (as
    // perftest), the JSON counts them all, and every QP's packets went out.
    let (c, s) = pair(60, "write-bw", "-q 3 -n 300 -s 65536 -m 1024", Kind::Bw);
    assert!(c.contains("Number of qps   : 3"), "{c}");
    assert!(s.contains("Number of qps   : 3"), "{s}");
    // Address lines for each QP, ours and the peer's (perftest prints them per QP).
    assert_eq!(c.matches(" local address:").count(), 3, "{c}");
    assert_eq!(c.matches(" remote address:").count(), 3, "{c}");
    assert_eq!(table(&c)[0][..2], [65_536.0, 300.0]);
    assert_eq!(json_num(&c, "iters"), Some(900.0), "{c}");
    assert_eq!(json_num(&c, "qps"), Some(3.0), "{c}");
    // 64 packets of 1024 bytes per message: 900 messages are 57,600 packets (plus the
    // warm-up's); one QP alone would have sent a third.
    let tx = json_num(&c, "tx_packets").unwrap_or(0.0);
    assert!(tx >= 57_600.0, "tx_packets {tx}:\n{c}");
    let (c, _) = pair(60, "atomic-bw", "-q 2 -n 500", Kind::Bw);
    assert_eq!(json_num(&c, "iters"), Some(1000.0), "{c}");
    pair(60, "read-bw", "-q 2 -n 200 -s 4096", Kind::Bw);
}

/// `-q 2 --engines 2`: each side's device runs two engines (a socket and a thread each, the
/// kernel steering datagrams by destination QP), the two QPs land on different engines and
/// each engine both sent and received; every WRITE of both QPs completed. `-q 4 --engines 2`
/// puts two QPs on each engine. `ROCECTL_ENGINES` does the same without the flag, and the
/// flag wins over it.
#[test]
fn two_qps_on_two_engines() {
    for (q, n) in [(2, 400), (4, 200)] {
        let (c, s) = pair(
            61,
            "write-bw",
            &format!("-q {q} --engines 2 -n {n} -s 65536"),
            Kind::Bw,
        );
        for (side, out) in [("client", &c), ("server", &s)] {
            assert_eq!(json_num(out, "engines"), Some(2.0), "{side} -q {q}:\n{out}");
            assert_eq!(
                json_num(out, "engines_used"),
                Some(2.0),
                "{side} -q {q}: both engines moved packets:\n{out}"
            );
        }
        assert_eq!(json_num(&c, "iters"), Some(f64::from(q * n)), "{c}");
    }
    // The environment variable: the server takes it (3, where its default would be
    // min(-q, CPUs) ≤ 2); the client's flag (1) beats it.
    let _net = private_net();
    let env = [("ROCECTL_ENGINES", "3")];
    let server = spawn_env(
        &args(
            "write-bw --local 127.0.62.2 -p 28562 --accept-timeout 30 --timeout 20 --json \
             -q 2 -n 200",
        ),
        &env,
    );
    let client = spawn_env(
        &args(
            "write-bw --local 127.0.62.1 -p 28562 --timeout 20 --json -q 2 -n 200 \
             --engines 1 127.0.62.2",
        ),
        &env,
    );
    let (client, server) = (wait(client, LIMIT), wait(server, LIMIT));
    assert!(
        client.status.success() && server.status.success(),
        "client {:?}: {}\nserver {:?}: {}",
        client.status,
        client.stderr,
        server.status,
        server.stderr
    );
    assert_eq!(
        json_num(&server.stdout, "engines"),
        Some(3.0),
        "{}",
        server.stdout
    );
    assert_eq!(
        json_num(&client.stdout, "engines"),
        Some(1.0),
        "{}",
        client.stdout
    );
}
