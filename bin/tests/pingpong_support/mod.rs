//! Support for the pingpong integration tests: a throwaway network namespace with
//! 127.0.0.1 and 127.0.0.2 on `lo`, `rocectl` processes run inside it with a deadline, and a
//! parser for the lines the pingpong tools print.
//!
//! Each test gets its own namespace (the test kit's `TempNetns`), so the tests run in parallel
//! without sharing UDP port 4791 or TCP port 18515, and nothing touches the host's interfaces.
//! The namespace is deleted when the [`Netns`] guard drops. Without root the tests follow the
//! test kit's skip policy: a loud `SKIPPED` line locally, a failure in CI.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, TempNetns};

/// The binary under test.
pub(crate) const ROCECTL: &str = env!("CARGO_BIN_EXE_rocectl");

/// A network namespace of our own, deleted on drop.
pub(crate) struct Netns {
    ns: TempNetns,
}

impl Netns {
    /// Creates a namespace with `lo` up and 127.0.0.2/8 added (GID table of `lo`:
    /// `fe80::200:ff:fe00:0`, `::ffff:127.0.0.1` at 1, `::ffff:127.0.0.2` at 2, `::1`).
    /// `None` when namespaces cannot be used here, after the test kit's skip policy printed
    /// why (and panics in CI).
    #[track_caller]
    pub(crate) fn new(tag: &str) -> Option<Self> {
        let test = roce_testkit::current_test();
        if !netns_or_skip(&test) {
            return None;
        }
        let ns = TempNetns::create(&format!("pp_{tag}"))
            .unwrap_or_else(|e| panic!("{test}: cannot create its namespace: {e}"));
        Some(Self { ns })
    }

    /// Runs `ip ARGS` inside the namespace; panics if it fails.
    pub(crate) fn ip(&self, args: &[&str]) {
        if let Err(e) = self.ns.netns().exec("ip", args) {
            panic!("ip {args:?} failed in {}: {e}", self.ns.name());
        }
    }

    /// Starts `rocectl ARGS` inside the namespace, output captured.
    pub(crate) fn spawn(&self, args: &[&str]) -> Proc {
        self.spawn_program(ROCECTL, args)
    }

    /// Starts any program inside the namespace, output captured.
    pub(crate) fn spawn_program(&self, program: &str, args: &[&str]) -> Proc {
        let child = self
            .ns
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec starts");
        Proc {
            child,
            what: format!("{program} {}", args.join(" ")),
        }
    }

    /// Runs `rocectl ARGS` inside the namespace to the end (at most `limit`).
    pub(crate) fn run(&self, args: &[&str], limit: Duration) -> Output {
        self.spawn(args).finish(limit)
    }
}

/// A running process.
pub(crate) struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// Waits until the process listens on TCP `port` (at most `limit`); panics otherwise.
    /// `ip netns exec` runs the program in its own process, so the pid is the program's.
    pub(crate) fn wait_listening(&self, port: u16, limit: Duration) {
        assert!(
            roce_testkit::proc::wait_listening(self.child.id(), port, limit),
            "`{}` did not listen on TCP {port} within {limit:?}",
            self.what
        );
    }

    /// Waits for the exit, killing the process (by its own handle) after `limit`.
    pub(crate) fn finish(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let mut out = self.child.stdout.take().expect("piped");
        let mut err = self.child.stderr.take().expect("piped");
        let out_reader = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err_reader = thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let (status, killed) = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break (status, false);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break (self.child.wait().expect("wait"), true);
            }
            thread::sleep(Duration::from_millis(20));
        };
        Output {
            what: self.what,
            status,
            killed,
            stdout: out_reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        }
    }
}

/// A finished process.
#[derive(Debug)]
pub(crate) struct Output {
    /// The command line.
    pub(crate) what: String,
    /// Its exit status.
    pub(crate) status: ExitStatus,
    /// Whether it was killed at the deadline.
    pub(crate) killed: bool,
    /// Standard output.
    pub(crate) stdout: String,
    /// Standard error.
    pub(crate) stderr: String,
}

impl Output {
    /// Panics (showing everything) unless the process exited with `code`.
    pub(crate) fn expect_code(&self, code: i32) -> &Self {
        assert!(
            !self.killed && self.status.code() == Some(code),
            "`{}` ended with {:?} (killed at the deadline: {}), expected exit {code}\n\
             --- stdout\n{}--- stderr\n{}",
            self.what,
            self.status,
            self.killed,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// One `local address:`/`remote address:` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) lid: u32,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: String,
}

/// What a successful run printed.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) local: Vec<Address>,
    pub(crate) remote: Vec<Address>,
    pub(crate) bytes: u64,
    pub(crate) iters: u64,
    pub(crate) mbit_per_sec: f64,
    pub(crate) usec_per_iter: f64,
}

/// Parses the stdout of a pingpong run, strictly: every line must be one the stock tools
/// print, in their order. `ud` expects `ibv_ud_pingpong`'s `PSN 0x...: GID` local lines.
pub(crate) fn parse_report(stdout: &str, ud: bool) -> Report {
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut bytes_line = None;
    let mut iters_line = None;
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("  local address:  ") {
            assert!(remote.is_empty() && bytes_line.is_none(), "order: {stdout}");
            local.push(parse_address(rest, if ud { ':' } else { ',' }, line));
        } else if let Some(rest) = line.strip_prefix("  remote address: ") {
            assert!(bytes_line.is_none(), "order: {stdout}");
            remote.push(parse_address(rest, ',', line));
        } else if line.contains(" bytes in ") {
            bytes_line = Some(line.to_owned());
        } else if line.contains(" iters in ") {
            iters_line = Some(line.to_owned());
        } else {
            panic!("unexpected line {line:?} in\n{stdout}");
        }
    }
    // "%lld bytes in %.2f seconds = %.2f Mbit/sec"
    let b = bytes_line.unwrap_or_else(|| panic!("no bytes line in\n{stdout}"));
    let w: Vec<&str> = b.split(' ').collect();
    assert_eq!(
        (w.len(), w[1], w[2], w[4], w[5], w[7]),
        (8, "bytes", "in", "seconds", "=", "Mbit/sec"),
        "{b}"
    );
    assert_two_decimals(w[3], &b);
    assert_two_decimals(w[6], &b);
    // "%d iters in %.2f seconds = %.2f usec/iter"
    let i = iters_line.unwrap_or_else(|| panic!("no iters line in\n{stdout}"));
    let v: Vec<&str> = i.split(' ').collect();
    assert_eq!(
        (v.len(), v[1], v[2], v[4], v[5], v[7]),
        (8, "iters", "in", "seconds", "=", "usec/iter"),
        "{i}"
    );
    assert_two_decimals(v[3], &i);
    assert_two_decimals(v[6], &i);
    Report {
        local,
        remote,
        bytes: w[0].parse().expect("bytes"),
        iters: v[0].parse().expect("iters"),
        mbit_per_sec: w[6].parse().expect("Mbit/sec"),
        usec_per_iter: v[6].parse().expect("usec/iter"),
    }
}

fn assert_two_decimals(x: &str, line: &str) {
    let (int, frac) = x.split_once('.').unwrap_or_else(|| panic!("{x} in {line}"));
    assert!(
        !int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()),
        "{x} in {line}"
    );
    assert!(
        frac.len() == 2 && frac.bytes().all(|b| b.is_ascii_digit()),
        "{x} in {line}"
    );
}

/// `LID 0x0000, QPN 0x000011, PSN 0x7177b7, GID ::ffff:10.77.0.1` (`sep` before `GID`).
fn parse_address(rest: &str, sep: char, line: &str) -> Address {
    let hex = |field: &str, prefix: &str, width: usize| -> u32 {
        let digits = field
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{prefix} in {line:?}"));
        assert_eq!(digits.len(), width, "{line:?}");
        u32::from_str_radix(digits, 16).unwrap_or_else(|_| panic!("hex in {line:?}"))
    };
    let (head, gid) = rest
        .split_once(&format!("{sep} GID "))
        .unwrap_or_else(|| panic!("`{sep} GID` in {line:?}"));
    let f: Vec<&str> = head.split(", ").collect();
    assert_eq!(f.len(), 3, "{line:?}");
    Address {
        lid: hex(f[0], "LID 0x", 4),
        qpn: hex(f[1], "QPN 0x", 6),
        psn: hex(f[2], "PSN 0x", 6),
        gid: gid.to_owned(),
    }
}

/// Runs a server and a client of `tool` in `ns` with the same extra `args` (server on
/// 127.0.0.1, GID index 1; client on 127.0.0.2, GID index 2), checks that both exit 0 and
/// that what each printed matches the other; returns (server, client) reports.
pub(crate) fn run_pair(ns: &Netns, tool: &str, args: &[&str]) -> (Report, Report) {
    run_pair_with(ns, tool, args, args)
}

/// As [`run_pair`] with different extra arguments for each side.
pub(crate) fn run_pair_with(
    ns: &Netns,
    tool: &str,
    server_args: &[&str],
    client_args: &[&str],
) -> (Report, Report) {
    let limit = Duration::from_secs(60);
    let mut s: Vec<&str> = vec![tool, "-d", "lo", "-g", "1", "--timeout", "30"];
    s.extend_from_slice(server_args);
    let server = ns.spawn(&s);
    let mut c: Vec<&str> = vec![tool, "-d", "lo", "-g", "2", "--timeout", "30"];
    c.extend_from_slice(client_args);
    c.push("127.0.0.1");
    let client = ns.spawn(&c).finish(limit);
    let server = server.finish(limit);
    client.expect_code(0);
    server.expect_code(0);
    let ud = tool == "ud-pingpong";
    let sr = parse_report(&server.stdout, ud);
    let cr = parse_report(&client.stdout, ud);
    assert_eq!(sr.local, cr.remote, "server's local = client's remote");
    assert_eq!(cr.local, sr.remote, "client's local = server's remote");
    for a in sr.local.iter().chain(&cr.remote) {
        assert_eq!((a.lid, a.gid.as_str()), (0, "::ffff:127.0.0.1"), "{a:?}");
    }
    for a in cr.local.iter().chain(&sr.remote) {
        assert_eq!((a.lid, a.gid.as_str()), (0, "::ffff:127.0.0.2"), "{a:?}");
    }
    assert!(
        server.stderr.is_empty() && client.stderr.is_empty(),
        "stderr:\n{}\n{}",
        server.stderr,
        client.stderr
    );
    (sr, cr)
}
