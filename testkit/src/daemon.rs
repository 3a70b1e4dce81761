//! Starting a `rocectl daemon` for a test: its configuration file and the wait until it
//! serves. The daemon's integration tests, the drop-in suite through the daemon and the live
//! lab's daemon pass all start one the same way.
//!
//! ```no_run
//! use std::path::Path;
//! use std::process::Command;
//! use std::time::Duration;
//! use roce_testkit::daemon;
//! use roce_testkit::proc::Proc;
//!
//! let dir = Path::new("/tmp/logs");
//! let cfg = daemon::write_config(dir, "mode = \"kernel-demux\"\naddress = \"127.0.0.1\"", None)
//!     .unwrap();
//! let mut cmd = Command::new("rocectl");
//! cmd.args(["daemon", "--config"]).arg(&cfg.path);
//! let mut proc = Proc::spawn(cmd, "rocectl daemon", dir).unwrap();
//! daemon::wait_until_serving(&mut proc, &cfg.socket, Duration::from_secs(10)).unwrap();
//! ```

use std::fs;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::proc::Proc;

/// A daemon configuration written by [`write_config`].
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The TOML file (`rocectl daemon --config <path>`).
    pub path: PathBuf,
    /// The control socket it names.
    pub socket: PathBuf,
}

/// Writes `<dir>/rocectl.toml`: `settings` (TOML lines: `mode`, `address` or `interface`,
/// limits...) and a `[socket]` table with the control socket `<dir>/rocectl.sock` and, when
/// given, its permission bits. A stale socket file from an earlier run is removed.
///
/// # Errors
/// The directory or the file could not be written.
pub fn write_config(dir: &Path, settings: &str, mode: Option<u32>) -> io::Result<DaemonConfig> {
    fs::create_dir_all(dir)?;
    let socket = dir.join("rocectl.sock");
    match fs::remove_file(&socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let path = dir.join("rocectl.toml");
    let mode = mode
        .map(|m| format!("mode = 0o{m:o}\n"))
        .unwrap_or_default();
    fs::write(
        &path,
        format!(
            "{}\n\n[socket]\npath = \"{}\"\n{mode}",
            settings.trim_end(),
            socket.display()
        ),
    )?;
    Ok(DaemonConfig { path, socket })
}

/// Waits until the daemon `proc` accepts connections on `socket`.
///
/// # Errors
/// The daemon exited, or did not accept within `limit`: the reason and its standard error
/// so far.
pub fn wait_until_serving(proc: &mut Proc, socket: &Path, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        let why = if proc.exited() {
            "exited"
        } else if Instant::now() >= deadline {
            "did not accept connections in time"
        } else {
            sleep(Duration::from_millis(20));
            continue;
        };
        return Err(format!(
            "{} {why} (socket {}): {}",
            proc.what(),
            socket.display(),
            proc.stderr_so_far()
        ));
    }
}
