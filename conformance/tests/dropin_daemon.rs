//! Unmodified libibverbs binaries sharing ONE RoCE address through `rocectl daemon` (issues 13
//! and 14): Debian's `ibv_rc_pingpong`, `ibv_ud_pingpong` and perftest's `ib_write_bw`, on
//! rocectl's drop-in `libibverbs.so.1`, servers and clients all on 127.0.0.1 in one network
//! namespace, all at once. Without the daemon the second process on the address fails to
//! bind UDP 4791; with it every process gets its own QPN range and the kernel demultiplexer
//! (then, in a second run, the daemon's forwarding rings) steers each datagram to its owner.
//!
//! A run passes when every process exits 0 (the pingpongs with `--chk`, every byte checked),
//! the daemon allocated a QPN range to each of them, and it refused nothing. Runs only with
//! `ROCE_DROPIN=1` (root, `verbs/build-so.sh`'s library, `rocectl`, `ibverbs-utils`,
//! `perftest`; `conformance/stock/ci.sh` provides them); a missing prerequisite is SKIPPED
//! locally and fails under `CI`. Logs: `target/dropin-daemon/`.
//!
//! ```sh
//! sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test dropin_daemon -- --nocapture
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use roce_conformance::stock::DropinPaths;
use roce_testkit::daemon::{wait_until_serving, write_config};
use roce_testkit::netns::{netns_or_skip, TempNetns};
use roce_testkit::proc::{wait_listening, Proc};

const TEST: &str = "dropin_daemon";
/// The device name every process uses.
const DEV: &str = "rocectl_lo";
/// One process's time limit.
const LIMIT: Duration = Duration::from_secs(90);

/// One server/client pair of a stock tool.
struct Pair {
    /// The program.
    program: &'static str,
    /// Its arguments on both sides (the client adds the server's address).
    args: &'static str,
    /// Its TCP port (`-p`).
    port: u16,
}

const PAIRS: &[Pair] = &[
    Pair {
        program: "ibv_rc_pingpong",
        args: "-g 1 -n 300 -s 4096 --chk",
        port: 18_801,
    },
    Pair {
        program: "ibv_rc_pingpong",
        args: "-g 1 -n 300 -s 20000 --chk",
        port: 18_802,
    },
    Pair {
        program: "ibv_ud_pingpong",
        args: "-g 1 -n 300 -s 1024 --chk",
        port: 18_803,
    },
    Pair {
        program: "ib_write_bw",
        args: "-x 1 -F -n 2000 -s 65536",
        port: 18_804,
    },
];

fn log_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dropin-daemon")
}

/// Runs every pair at once through a daemon in `mode`; returns the failures.
fn run_mode(paths: &DropinPaths, mode: &str) -> Vec<String> {
    let logs = log_dir().join(mode);
    let ns = TempNetns::create("dropin-dmn").expect("a network namespace");
    let cfg = write_config(
        &logs,
        &format!("mode = \"{mode}\"\naddress = \"127.0.0.1\""),
        None,
    )
    .expect("the daemon's configuration");
    let socket = cfg.socket;
    let mut cmd = ns.command("env");
    cmd.arg("RUST_LOG=info")
        .arg(&paths.rocectl)
        .args(["daemon", "--config"])
        .arg(&cfg.path);
    let mut daemon = Proc::spawn(cmd, "rocectl daemon", &logs).expect("rocectl daemon starts");
    if let Err(e) = wait_until_serving(&mut daemon, &socket, Duration::from_secs(15)) {
        panic!("{mode}: {e}");
    }
    let lib = paths.verbs_lib_dir.display().to_string();
    let command = |program: &str, args: &str, port: u16, server: Option<&str>| {
        let mut c = ns.command("env");
        c.arg(format!("LD_LIBRARY_PATH={lib}"))
            .arg(format!("ROCECTL_VERBS_DEVICES={DEV}=lo@127.0.0.1"))
            .arg(format!("ROCECTL_DAEMON_SOCKET={}", socket.display()))
            .arg(program)
            .args(["-d", DEV, "-p", &port.to_string()])
            .args(args.split_whitespace());
        if let Some(host) = server {
            c.arg(host);
        }
        c
    };
    let mut servers = Vec::new();
    for p in PAIRS {
        let what = format!("{mode} {} server :{}", p.program, p.port);
        let s = Proc::spawn(command(p.program, p.args, p.port, None), &what, &logs)
            .expect("a server starts");
        servers.push((what, s));
    }
    for ((_, s), p) in servers.iter().zip(PAIRS) {
        assert!(
            wait_listening(s.pid(), p.port, Duration::from_secs(30)),
            "{mode}: {} server never listened on {}: {}",
            p.program,
            p.port,
            s.stderr_so_far()
        );
    }
    let clients: Vec<(String, Proc)> = PAIRS
        .iter()
        .map(|p| {
            let what = format!("{mode} {} client :{}", p.program, p.port);
            let c = Proc::spawn(
                command(p.program, p.args, p.port, Some("127.0.0.1")),
                &what,
                &logs,
            )
            .expect("a client starts");
            (what, c)
        })
        .collect();
    let mut failed = Vec::new();
    for (what, p) in servers.into_iter().chain(clients) {
        let out = p.wait(LIMIT);
        if !out.success() {
            failed.push(format!("{what}: {}\n{}", out.status_text(), out.combined()));
        }
    }
    let out = daemon.stop(Signal::SIGTERM, Duration::from_secs(5));
    let log = out.combined();
    let ranges = log
        .lines()
        .filter(|l| l.contains("QPN range allocated"))
        .count();
    eprintln!(
        "{TEST} ({mode}): {} processes, the daemon allocated {ranges} QPN ranges",
        2 * PAIRS.len()
    );
    if ranges < 2 * PAIRS.len() {
        failed.push(format!(
            "{mode}: the daemon allocated {ranges} QPN ranges for {} processes:\n{log}",
            2 * PAIRS.len()
        ));
    }
    if log.contains("refused:") || !out.success() {
        failed.push(format!(
            "{mode}: the daemon refused a request or did not exit 0:\n{log}"
        ));
    }
    failed
}

#[test]
fn stock_binaries_share_one_address_through_the_daemon() {
    if std::env::var("ROCE_DROPIN").as_deref() != Ok("1") {
        eprintln!(
            "{TEST}: skipped; set ROCE_DROPIN=1 (needs root, verbs/build-so.sh's library, \
             rocectl, ibverbs-utils, perftest)"
        );
        return;
    }
    if !netns_or_skip(TEST) {
        return;
    }
    let paths = DropinPaths::from_env();
    let missing = paths.missing(&["ibv_rc_pingpong", "ibv_ud_pingpong", "ib_write_bw"], true);
    if !missing.is_empty() {
        roce_testkit::skip(TEST, format!("missing: {}", missing.join("; ")));
        return;
    }
    let mut failed = run_mode(&paths, "kernel-demux");
    failed.extend(run_mode(&paths, "forwarding"));
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
