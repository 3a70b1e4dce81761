//! Child processes with a time limit: each runs in its own process group, writes its output
//! to files, and is killed, group and all, when its time runs out or its handle is dropped.
//!
//! ```no_run
//! use std::path::Path;
//! use std::process::Command;
//! use std::time::Duration;
//!
//! let mut cmd = Command::new("sh");
//! cmd.args(["-c", "echo hi; sleep 1 & wait"]);
//! let out = roce_testkit::proc::run_bounded(cmd, "greeting", Duration::from_secs(5), Path::new("/tmp/logs"))
//!     .unwrap();
//! assert!(out.success() && out.stdout == "hi\n");
//! ```

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A child could not be started (or its log files not created).
#[derive(Debug)]
pub struct SpawnError {
    /// The step that failed: `start <what>`, `create <dir>`, `create a log file`.
    pub what: String,
    /// The error.
    pub source: io::Error,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> SpawnError {
    let what = what.into();
    move |source| SpawnError { what, source }
}

/// How a child ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// It ran out of time (and was killed), or a guest job was killed at its timeout (124).
    pub timed_out: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall-clock time.
    pub elapsed: Duration,
}

impl Output {
    /// Exited 0 in time.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// `exit 0`, `exit 124 (timed out)`, `killed by signal 15 (timed out)`.
    pub fn status_text(&self) -> String {
        let base = match (self.code, self.signal) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "no exit status".to_owned(),
        };
        if self.timed_out {
            format!("{base} (timed out)")
        } else {
            base
        }
    }

    /// stdout, then stderr.
    pub fn combined(&self) -> String {
        match (self.stdout.is_empty(), self.stderr.is_empty()) {
            (_, true) => self.stdout.clone(),
            (true, false) => self.stderr.clone(),
            (false, false) => format!("{}{}", self.stdout, self.stderr),
        }
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A child process in its own process group, output to files, killed (group and all) when
/// its time runs out or the handle is dropped.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    what: String,
    out_path: PathBuf,
    err_path: PathBuf,
    started: Instant,
    done: bool,
}

impl Proc {
    /// Starts `cmd` (stdin from `/dev/null`, stdout and stderr to files in `log_dir`).
    ///
    /// # Errors
    /// The program could not be started.
    pub fn spawn(mut cmd: Command, what: &str, log_dir: &Path) -> Result<Self, SpawnError> {
        fs::create_dir_all(log_dir).map_err(io_err(format!("create {}", log_dir.display())))?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let slug: String = what
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let stem = format!("{}-{n:03}-{slug}", std::process::id());
        let out_path = log_dir.join(format!("{stem}.out"));
        let err_path = log_dir.join(format!("{stem}.err"));
        let out = fs::File::create(&out_path).map_err(io_err("create a log file"))?;
        let err = fs::File::create(&err_path).map_err(io_err("create a log file"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(io_err(format!("start {what}")))?;
        Ok(Self {
            child,
            what: what.to_owned(),
            out_path,
            err_path,
            started: Instant::now(),
            done: false,
        })
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it is.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// What it printed to stderr so far.
    pub fn stderr_so_far(&self) -> String {
        read_lossy(&self.err_path)
    }

    /// Waits at most `limit` (from now); on timeout kills the whole group (`SIGTERM`, then `SIGKILL`
    /// after 2 s).
    pub fn wait(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() >= deadline => break None,
                Ok(None) => sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        let timed_out = status.is_none();
        let status = status.or_else(|| self.kill_group(Signal::SIGTERM));
        self.finish(status, timed_out)
    }

    /// Sends `sig` to the group, waits up to `grace` for the process to exit, then kills the
    /// group. For programs that stop cleanly on a signal (tcpdump on `SIGINT`).
    pub fn stop(mut self, sig: Signal, grace: Duration) -> Output {
        let _ = killpg(self.pgid(), sig);
        let deadline = Instant::now() + grace;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() >= deadline => break None,
                Ok(None) => sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        let status = status.or_else(|| self.kill_group(Signal::SIGKILL));
        self.finish(status, false)
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    /// `sig` to the group, 2 s for the leader to exit, then `SIGKILL` to the group; reaps.
    fn kill_group(&mut self, sig: Signal) -> Option<ExitStatus> {
        let _ = killpg(self.pgid(), sig);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                let _ = killpg(self.pgid(), Signal::SIGKILL);
                return Some(st);
            }
            sleep(Duration::from_millis(20));
        }
        let _ = killpg(self.pgid(), Signal::SIGKILL);
        self.child.wait().ok()
    }

    fn finish(&mut self, status: Option<ExitStatus>, timed_out: bool) -> Output {
        self.done = true;
        Output {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            timed_out,
            stdout: read_lossy(&self.out_path),
            stderr: read_lossy(&self.err_path),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.done {
            self.kill_group(Signal::SIGTERM);
        }
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Runs `cmd` to completion within `limit` (see [`Proc`]).
///
/// # Errors
/// It could not be started.
pub fn run_bounded(
    cmd: Command,
    what: &str,
    limit: Duration,
    log_dir: &Path,
) -> Result<Output, SpawnError> {
    Ok(Proc::spawn(cmd, what, log_dir)?.wait(limit))
}

/// Whether process `pid` has a TCP socket listening on `port` in its network namespace
/// (`/proc/PID/net/tcp` and `tcp6` show the namespace of that process, so this also works
/// for a process inside another namespace, without entering it, and without connecting, which
/// would take the single connection a test peer may accept).
pub fn listening(pid: u32, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(|table| {
        fs::read_to_string(format!("/proc/{pid}/net/{table}"))
            .is_ok_and(|text| listens_in_table(&text, port))
    })
}

/// Waits (polling every 10 ms) until [`listening`]`(pid, port)`, at most `limit`; returns
/// whether it happened. Use it to order a test's steps instead of sleeping.
pub fn wait_listening(pid: u32, port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if listening(pid, port) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10));
    }
}

/// `/proc/net/tcp` lines: `sl local_address rem_address st ...`, with `local_address` as
/// `HEXIP:HEXPORT` and state `0A` for LISTEN.
fn listens_in_table(text: &str, port: u16) -> bool {
    text.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let (Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        let local_port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        state == "0A" && local_port == Some(port)
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn parses_the_kernel_table() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n   \
             1: 0100007F:9C40 0100007F:4853 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n";
        assert!(listens_in_table(text, 18_515));
        // 0x9C40 = 40000 is a connected socket, not a listener.
        assert!(!listens_in_table(text, 40_000));
        assert!(!listens_in_table(text, 1));
    }

    #[test]
    fn sees_our_own_listener() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(wait_listening(
            std::process::id(),
            port,
            Duration::from_secs(5)
        ));
        drop(l);
        assert!(!listening(std::process::id(), port));
    }
}
