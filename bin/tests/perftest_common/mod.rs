//! Helpers of the perftest tool tests: run `rocectl` processes with a deadline, read the
//! result table and the `--json` line.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The binary under test.
pub(crate) fn rocectl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rocectl"))
}

/// A finished process.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Starts `args` with piped output.
pub(crate) fn spawn(args: &[String]) -> Child {
    rocectl()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rocectl")
}

/// Starts `args` with piped output and the environment variables `env` set.
pub(crate) fn spawn_env(args: &[String], env: &[(&str, &str)]) -> Child {
    rocectl()
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rocectl")
}

/// Waits for `child` until `limit`, killing it then (the test fails on its output).
pub(crate) fn wait(mut child: Child, limit: Duration) -> Output {
    let mut out = child.stdout.take().expect("stdout piped");
    let mut err = child.stderr.take().expect("stderr piped");
    let t_out = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// Runs `args` to completion within `limit`.
pub(crate) fn run(args: &[String], limit: Duration) -> Output {
    wait(spawn(args), limit)
}

/// `s` split on whitespace into owned arguments.
pub(crate) fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// The result rows of a perftest table: the lines after the `#bytes` header up to the next
/// dashed line, each split into its numbers.
pub(crate) fn table(stdout: &str) -> Vec<Vec<f64>> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in stdout.lines() {
        if line.starts_with(" #bytes") {
            inside = true;
            continue;
        }
        if inside {
            if line.starts_with("---") {
                break;
            }
            let nums: Vec<f64> = line
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(f64::NAN))
                .collect();
            rows.push(nums);
        }
    }
    rows
}

/// The number `key` of the last JSON object line of `stdout` (a flat object).
pub(crate) fn json_num(stdout: &str, key: &str) -> Option<f64> {
    let line = stdout.lines().rev().find(|l| l.starts_with('{'))?;
    let pat = format!("\"{key}\":");
    let at = line.find(&pat)? + pat.len();
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}
