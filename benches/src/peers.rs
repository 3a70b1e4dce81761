//! The peers: what a user would pick today for userspace RDMA-like transfers without an RDMA
//! NIC, run on the same machine and the same links as our figures.
//!
//! - **libfabric, `udp;ofi_rxd`** (Debian `libfabric-bin`): `fi_pingpong -p "udp;ofi_rxd" -e rdm`
//!   is the only test Debian packages (there is no `fabtests` package in bookworm, so no
//!   `fi_rma_bw`/`fi_msg_bw`). It is a ping-pong of messages: one in flight. Its `usec/xfer` is
//!   the mean of half a round trip; its `MB/sec` is 10^6 bytes/s of one direction.
//! - **UCX over TCP** (Debian `ucx-utils`): `ucx_perftest` with `UCX_TLS=tcp`, the device pinned
//!   with `UCX_NET_DEVICES`. Its bandwidth is in MiB/s, its latencies are one-way (half a round
//!   trip) in microseconds; we read `-f -v` CSV output (`overall_*` columns, and the
//!   `50.0_percentile_lat` median for latency tests).
//!
//! Each run starts the server (in namespace `b` for veth), waits until its TCP control port
//! listens (read from `/proc/<pid>/net/tcp*`, which shows the server's namespace), then runs the
//! client (in namespace `a`) with a timeout, and parses the client's output.

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::netns::{Link, Side};

/// Longest a peer client may run.
pub const TIMEOUT: Duration = Duration::from_secs(30);

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A fresh TCP control port per run (no TIME_WAIT surprises), in 42000..43999.
fn next_port() -> u16 {
    let base = 42_000 + (std::process::id() % 1_000) as u16;
    base + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % 1_000
}

/// One peer measurement: figures parsed from the client's output, and the exact commands.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PeerResult {
    /// Payload bytes per second, one direction.
    pub bytes_per_s: Option<f64>,
    /// Messages (or operations) per second.
    pub ops_per_s: Option<f64>,
    /// Round-trip time in microseconds (twice the tool's one-way figure).
    pub rtt_us: Option<f64>,
    /// Server command line.
    pub server: String,
    /// Client command line.
    pub client: String,
}

/// A command line for one side: environment, `ip netns exec` when needed, program and args.
fn command(side: &Side, env: &[(&str, String)], prog: &str, args: &[String]) -> (Command, String) {
    let mut argv: Vec<String> = Vec::new();
    if let Some(ns) = &side.ns {
        argv.extend(["ip", "netns", "exec", ns].map(String::from));
    }
    argv.push(prog.into());
    argv.extend(args.iter().cloned());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().map(|(k, v)| (k, v)));
    let shown = env
        .iter()
        .map(|(k, v)| format!("{k}={v} "))
        .chain([shell_join(&argv)])
        .collect::<String>();
    (cmd, shown)
}

fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,".contains(c))
            {
                a.clone()
            } else {
                format!("'{a}'")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether process `pid` has a TCP socket listening on `port` (in its own namespace).
fn listening(pid: u32, port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
            })
        })
    })
}

/// Waits for `child` with a deadline, killing it when overdue; returns its stdout.
fn wait_output(mut child: Child, timeout: Duration) -> Result<(bool, String, String)> {
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let ereader = thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = reader.join().unwrap_or_default();
    let stderr = ereader.join().unwrap_or_default();
    Ok((status.is_some_and(|s| s.success()), stdout, stderr))
}

/// Runs a server/client pair; returns the client's stdout.
fn run_pair(
    link: &Link,
    prog: &str,
    env: impl Fn(&Side) -> Vec<(&'static str, String)>,
    server_args: &[String],
    client_args: &[String],
    port: u16,
) -> Result<(String, String, String)> {
    let (mut scmd, sshown) = command(&link.b, &env(&link.b), prog, server_args);
    let server = scmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {sshown}"))?;
    let pid = server.id();
    let ready = Instant::now() + Duration::from_secs(5);
    while !listening(pid, port) {
        if Instant::now() >= ready {
            let _ = wait_output(server, Duration::ZERO);
            bail!("{sshown}: did not listen on port {port}");
        }
        thread::sleep(Duration::from_millis(5));
    }
    let (mut ccmd, cshown) = command(&link.a, &env(&link.a), prog, client_args);
    let client = ccmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cshown}"))?;
    let (ok, out, err) = wait_output(client, TIMEOUT)?;
    // The server ends after the client disconnects; give it a moment, then kill it.
    let _ = wait_output(server, Duration::from_secs(2));
    if !ok {
        bail!("{cshown} failed: {}{}", out.trim(), err.trim());
    }
    Ok((out, sshown, cshown))
}

/// libfabric `fi_pingpong -p "udp;ofi_rxd" -e rdm` of `size`-byte messages, `iters` round trips.
///
/// # Errors
/// When the tool is missing, fails, times out, or prints nothing parsable.
pub fn fabric_pingpong(link: &Link, size: usize, iters: usize) -> Result<PeerResult> {
    let port = next_port();
    let common = |side: &Side| -> Vec<String> {
        [
            "-p",
            "udp;ofi_rxd",
            "-e",
            "rdm",
            "-d",
            &side.dev,
            "-S",
            &size.to_string(),
            "-I",
            &iters.to_string(),
        ]
        .map(String::from)
        .to_vec()
    };
    let mut sargs = common(&link.b);
    sargs.extend(["-B".into(), port.to_string()]);
    let mut cargs = common(&link.a);
    cargs.extend(["-P".into(), port.to_string(), link.b.addr.to_string()]);
    let (out, server, client) =
        run_pair(link, "fi_pingpong", |_| Vec::new(), &sargs, &cargs, port)?;
    let (mb_s, usec) =
        parse_fi_pingpong(&out).ok_or_else(|| anyhow!("unparsable fi_pingpong output: {out}"))?;
    Ok(PeerResult {
        bytes_per_s: Some(mb_s * 1e6),
        ops_per_s: Some(1e6 / (2.0 * usec)),
        rtt_us: Some(2.0 * usec),
        server,
        client,
    })
}

/// `(MB/sec, usec/xfer)` of the last result line of `fi_pingpong`'s output.
pub fn parse_fi_pingpong(out: &str) -> Option<(f64, f64)> {
    out.lines().rev().find_map(|l| {
        let c: Vec<&str> = l.split_whitespace().collect();
        if c.len() == 8 && c[0] != "bytes" {
            Some((c[5].parse().ok()?, c[6].parse().ok()?))
        } else {
            None
        }
    })
}

/// What an `ucx_perftest` test reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UcxKind {
    /// Bandwidth / message-rate test (`*_bw`, `ucp_get`, atomics).
    Bandwidth,
    /// Ping-pong latency test (`*_lat`).
    Latency,
}

/// `ucx_perftest -t <test> -s <size>` over TCP, `iters` iterations (a tenth more, at least 20,
/// as warm-up).
///
/// # Errors
/// When the tool is missing, fails, times out, or prints nothing parsable.
pub fn ucx_perftest(link: &Link, test: &str, size: usize, iters: usize) -> Result<PeerResult> {
    let port = next_port();
    let env = |side: &Side| {
        vec![
            ("UCX_TLS", "tcp".to_string()),
            ("UCX_NET_DEVICES", side.dev.clone()),
        ]
    };
    let sargs = vec!["-p".into(), port.to_string()];
    let cargs: Vec<String> = [
        &link.b.addr.to_string(),
        "-p",
        &port.to_string(),
        "-t",
        test,
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-w",
        &(iters / 10).max(20).to_string(),
        "-f",
        "-v",
    ]
    .map(String::from)
    .to_vec();
    let (out, server, client) = run_pair(link, "ucx_perftest", env, &sargs, &cargs, port)?;
    let row = parse_ucx(&out).ok_or_else(|| anyhow!("unparsable ucx_perftest output: {out}"))?;
    let kind = if test.ends_with("_lat") {
        UcxKind::Latency
    } else {
        UcxKind::Bandwidth
    };
    Ok(match kind {
        UcxKind::Latency => PeerResult {
            rtt_us: Some(2.0 * row.median_lat_us),
            ops_per_s: Some(row.overall_mr),
            server,
            client,
            ..PeerResult::default()
        },
        UcxKind::Bandwidth => PeerResult {
            bytes_per_s: Some(row.overall_bw_mib * 1_048_576.0),
            ops_per_s: Some(row.overall_mr),
            server,
            client,
            ..PeerResult::default()
        },
    })
}

/// The final CSV row of `ucx_perftest -f -v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UcxRow {
    /// `50.0_percentile_lat`, µs (one-way for latency tests).
    pub median_lat_us: f64,
    /// `overall_lat`, µs.
    pub overall_lat_us: f64,
    /// `overall_bw`, MiB/s.
    pub overall_bw_mib: f64,
    /// `overall_mr`, messages/s.
    pub overall_mr: f64,
}

/// Parses `ucx_perftest -f -v` output (header `iterations,50.0_percentile_lat,...`).
pub fn parse_ucx(out: &str) -> Option<UcxRow> {
    let mut lines = out.lines().map(str::trim);
    let header: Vec<&str> = lines
        .find(|l| l.starts_with("iterations,"))?
        .split(',')
        .collect();
    let row: Vec<f64> = lines
        .find(|l| l.starts_with(|c: char| c.is_ascii_digit()))?
        .split(',')
        .map(|v| v.trim().parse().unwrap_or(f64::NAN))
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .and_then(|i| row.get(i).copied())
    };
    let median = header
        .iter()
        .position(|h| h.ends_with("_percentile_lat"))
        .and_then(|i| row.get(i).copied())?;
    Some(UcxRow {
        median_lat_us: median,
        overall_lat_us: col("overall_lat")?,
        overall_bw_mib: col("overall_bw")?,
        overall_mr: col("overall_mr")?,
    })
}

/// Installed versions of the peer packages (`dpkg-query`), e.g. `libfabric1 1.17.0-3`.
pub fn versions() -> Vec<String> {
    let out = Command::new("dpkg-query")
        .args([
            "-W",
            "-f",
            "${Package} ${Version}\\n",
            "libfabric1",
            "libfabric-bin",
            "libucx0",
            "ucx-utils",
        ])
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(String::from)
            .collect()
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fi_pingpong_output() {
        let out =
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   4k      1k      =1k      7.8m        0.06s    126.40      32.40       0.03\n";
        assert_eq!(parse_fi_pingpong(out), Some((126.40, 32.40)));
        assert_eq!(parse_fi_pingpong("bytes #sent\n"), None);
    }

    #[test]
    fn ucx_output() {
        let out = "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n\
                   2000,0.050,87.274,87.274,716.13,716.13,11458,11458\n";
        let r = parse_ucx(out).unwrap();
        assert_eq!(r.median_lat_us, 0.050);
        assert_eq!(r.overall_lat_us, 87.274);
        assert_eq!(r.overall_bw_mib, 716.13);
        assert_eq!(r.overall_mr, 11458.0);
    }
}
