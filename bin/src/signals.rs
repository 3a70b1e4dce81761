//! SIGINT and SIGTERM: close the captures, then exit with the conventional status.
//!
//! A tool killed with Ctrl-C used to leave its pcap cut in the middle of a record (the capture
//! is buffered), which tshark reads but a strict reader refuses. Every command that can capture
//! (`demo`, the pingpong and perftest tools) calls [`install`] first and opens its captures with
//! [`open_capture`] (or hands one to [`register`]); on the first SIGINT or SIGTERM a thread
//! closes each capture ([`CaptureFile::close`]: flush, then no more frames, so the file ends on
//! a whole record) and exits with 128 + the signal number (130, 143), as a shell reports a
//! process the signal killed.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::Context;
use roce_transport::CaptureFile;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The captures to close on a signal.
static CAPTURES: Mutex<Vec<CaptureFile>> = Mutex::new(Vec::new());

fn captures() -> MutexGuard<'static, Vec<CaptureFile>> {
    CAPTURES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the SIGINT/SIGTERM handler: a thread that waits for either, closes the registered
/// captures and exits with status 128 + the signal.
///
/// # Errors
/// The handler or its thread cannot be set up.
pub(crate) fn install() -> anyhow::Result<()> {
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT/SIGTERM handler")?;
    std::thread::Builder::new()
        .name("rocectl-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let name = if signal == SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
                for capture in captures().iter() {
                    // Holding the list: nothing registers a capture after this point.
                    match capture.close() {
                        Ok(()) => eprintln!(
                            "rocectl: {name}: capture {} closed ({} frames)",
                            capture.path().display(),
                            capture.frames()
                        ),
                        Err(e) => {
                            eprintln!("rocectl: {name}: capture {}: {e}", capture.path().display())
                        }
                    }
                }
                std::process::exit(128 + signal);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Adds a capture to those closed on a signal.
pub(crate) fn register(capture: &CaptureFile) {
    captures().push(capture.clone());
}

/// Creates the capture a device named `device` writes, if any: `pcap` (`--pcap`), else the
/// environment variable `ROCECTL_PCAP`, `{dev}` in either replaced by the device name (what
/// [`roce_transport::DeviceConfig::pcap`] does, done here so that the capture is registered).
///
/// # Errors
/// The file cannot be created.
pub(crate) fn open_capture(
    pcap: Option<&Path>,
    device: &str,
) -> anyhow::Result<Option<CaptureFile>> {
    let path = match pcap {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("ROCECTL_PCAP") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => return Ok(None),
        },
    };
    let path = path.to_string_lossy().replace("{dev}", device);
    let capture =
        CaptureFile::create(&path).with_context(|| format!("cannot create capture file {path}"))?;
    register(&capture);
    Ok(Some(capture))
}
