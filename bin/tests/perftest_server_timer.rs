//! A SEND bandwidth server's figure is the transfer's (issue 12, item 5): `send-bw -c UD`'s
//! server reported 222,552 MB/s while the client reported about 1,000, because its timer ran
//! from the first completion it polled, and a server that polls late finds the whole transfer
//! already queued and times the draining of its CQ. Its timer now starts at the barrier that
//! lets the client go, so its interval contains the client's: its rate cannot exceed the
//! client's by more than timer skew.
//!
//! Only std and the `rocectl` binary, on loopback addresses of its own, no root. (WRITE, READ
//! and atomic servers print the client's report; the latency tools time round trips.)

use std::process::{Command, Output, Stdio};

/// A number field of a `--json` line.
fn field(json: &str, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {json}"))
        + key.len();
    let rest = &json[at..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].parse().unwrap()
}

fn json_line(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in\n{stdout}"))
        .to_owned()
}

/// Runs `send-bw` with `extra` on network 127.0.18.`n`; returns (server, client) JSON lines.
fn pair(n: u8, port: u16, extra: &[&str]) -> (String, String) {
    let server = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args([
            "send-bw",
            "--json",
            "--accept-timeout",
            "30",
            "--timeout",
            "20",
        ])
        .args([
            "--local",
            &format!("127.0.18.{}", n + 1),
            "-p",
            &port.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the server");
    let client = Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(["send-bw", "--json", "--timeout", "20"])
        .args(["--local", &format!("127.0.18.{n}"), "-p", &port.to_string()])
        .args(extra)
        .arg(format!("127.0.18.{}", n + 1))
        .output()
        .expect("run the client");
    let server = server.wait_with_output().unwrap();
    assert!(
        client.status.success() && server.status.success(),
        "client: {}\nserver: {}",
        String::from_utf8_lossy(&client.stderr),
        String::from_utf8_lossy(&server.stderr)
    );
    (json_line(&server), json_line(&client))
}

/// The server's interval contains the client's (same host, same clock): its seconds are at
/// least the client's less timer skew, and its rate at most the client's plus that skew. With
/// `acked` (RC: the client's last completion is an ACK of the server's last receive) the two
/// intervals are nearly the same, so the server's rate is not far below either; a UD client's
/// completions only say its datagrams left, which under load can be long before they arrive.
fn assert_sane(server: &str, client: &str, what: &str, acked: bool) {
    let (s_secs, c_secs) = (field(server, "seconds"), field(client, "seconds"));
    let (s_bw, c_bw) = (field(server, "bytes_per_s"), field(client, "bytes_per_s"));
    assert!(c_secs > 0.0 && c_bw > 0.0, "{what}: client {client}");
    assert!(
        s_secs >= c_secs * 0.5 && s_bw <= c_bw * 2.0,
        "{what}: server {s_bw:.0} B/s over {s_secs} s, client {c_bw:.0} B/s over {c_secs} s"
    );
    // Nor absurdly low: what arrived, over the transfer.
    assert!(
        !acked || s_bw >= c_bw / 50.0,
        "{what}: server {s_bw:.0} B/s, client {c_bw:.0} B/s"
    );
}

#[test]
fn ud_server_rate_is_the_transfers() {
    // Few messages, all receives posted up front: the case where the server found them queued.
    for (i, iters) in ["200", "2000"].into_iter().enumerate() {
        let (server, client) = pair(1, 28_811 + i as u16, &["-c", "UD", "-n", iters]);
        assert_sane(&server, &client, &format!("UD -n {iters}"), false);
    }
}

#[test]
fn rc_server_rate_is_the_transfers() {
    for (i, iters) in ["200", "2000"].into_iter().enumerate() {
        let (server, client) = pair(
            3,
            28_821 + i as u16,
            &["-c", "RC", "-n", iters, "-s", "4096"],
        );
        assert_sane(&server, &client, &format!("RC -n {iters}"), true);
    }
}
