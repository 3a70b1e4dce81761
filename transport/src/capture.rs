//! Packet capture: every frame a device sends and receives, as a pcap file.
//!
//! Frames carry real Ethernet, IP and UDP headers even on the `udp` backend: the engine writes
//! the headers the kernel put on the wire (IPv4 Identification 0 and DF on send; on receive
//! the Identification recovered from the ICRC), so Wireshark decodes them as RoCE and
//! `check_pcap.sh` verifies every ICRC. Ethernet addresses on the `udp` backend are derived
//! from the IP addresses (locally administered `02:00:a.b.c.d`).
//!
//! Capture is done by the engine, not by a tap below it (smoltcp's `phy` middleware pattern,
//! which the fault injector follows): only the engine knows the IPv4
//! Identification it recovered from the ICRC, so a tap under a UDP socket would write wrong
//! headers.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use roce_wire::pcap::PcapWriter;

use crate::sys::lock;

/// A pcap file several devices can write into.
#[derive(Clone, Debug)]
pub struct CaptureFile(pub(crate) Arc<Mutex<Capture>>);

impl CaptureFile {
    /// Creates (truncates) the file.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self(Arc::new(Mutex::new(Capture::create(path.as_ref())?))))
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        lock(&self.0).frames
    }

    /// Flushes buffered frames to disk.
    ///
    /// # Errors
    /// The write error, including one that stopped the capture earlier.
    pub fn flush(&self) -> io::Result<()> {
        let mut c = lock(&self.0);
        if let Some(e) = &c.error {
            return Err(io::Error::other(e.clone()));
        }
        c.flush()
    }

    /// Flushes buffered frames and stops the capture: frames sent or received later are not
    /// written, so the file ends on a whole record even if the process exits at once (what a
    /// SIGINT/SIGTERM handler calls before exiting).
    ///
    /// # Errors
    /// The write error, including one that stopped the capture earlier.
    pub fn close(&self) -> io::Result<()> {
        let mut c = lock(&self.0);
        if let Some(e) = &c.error {
            return Err(io::Error::other(e.clone()));
        }
        c.close()
    }

    /// The file.
    pub fn path(&self) -> PathBuf {
        lock(&self.0).path().to_path_buf()
    }

    /// Flushes this capture when the process calls `exit` (an `atexit` handler), for as long
    /// as it is open: a program that exits without closing its device (perftest on an
    /// error, through the drop-in) would otherwise lose up to 1 MiB of buffered frames, the
    /// last ones and the interesting ones. A capture another thread is writing at that
    /// moment is skipped rather than waited for. A crash (a signal) still loses the buffer.
    pub fn flush_at_exit(&self) {
        static HOOK: Once = Once::new();
        let mut list = lock(&AT_EXIT);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&self.0));
        drop(list);
        HOOK.call_once(|| {
            // A failed registration only means no flush at exit.
            let _ = crate::sys::at_exit(flush_all_at_exit);
        });
    }
}

/// The captures [`CaptureFile::flush_at_exit`] flushes (dropped ones fail to upgrade).
static AT_EXIT: Mutex<Vec<Weak<Mutex<Capture>>>> = Mutex::new(Vec::new());

/// The `atexit` handler: flushes every registered capture nobody is writing.
extern "C" fn flush_all_at_exit() {
    // No unwinding into libc's exit.
    let _ = std::panic::catch_unwind(|| {
        let Ok(list) = AT_EXIT.try_lock() else {
            return;
        };
        for c in list.iter().filter_map(Weak::upgrade) {
            if let Ok(mut c) = c.try_lock() {
                let _ = c.flush();
            }
        }
    });
}

/// An open capture file.
#[derive(Debug)]
pub(crate) struct Capture {
    writer: Option<PcapWriter<SharedFile>>,
    file: SharedFile,
    path: PathBuf,
    /// Frames written.
    pub(crate) frames: u64,
    /// The first write error (capture stops then).
    pub(crate) error: Option<String>,
}

impl Capture {
    /// Creates (truncates) `path` and writes the pcap header.
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path).map_err(|e| {
            io::Error::new(e.kind(), format!("capture file {}: {e}", path.display()))
        })?;
        let file = SharedFile(Arc::new(Mutex::new(BufWriter::with_capacity(
            1 << 20,
            file,
        ))));
        let writer = PcapWriter::new(file.clone())?;
        Ok(Self {
            writer: Some(writer),
            file,
            path: path.to_path_buf(),
            frames: 0,
            error: None,
        })
    }

    /// Writes one Ethernet frame stamped now.
    pub(crate) fn write(&mut self, frame: &[u8]) {
        let Some(w) = &mut self.writer else { return };
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if let Err(e) = w.write_frame(ts, frame) {
            self.error = Some(format!("capture {}: {e}", self.path.display()));
            self.writer = None;
            return;
        }
        self.frames += 1;
    }

    /// Flushes buffered frames to the file.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    /// Flushes and stops: frames after this are not written, so the file ends on a whole
    /// record even if the process exits right after.
    pub(crate) fn close(&mut self) -> io::Result<()> {
        self.writer = None;
        self.flush()
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// The capture file behind the pcap writer, reachable for flushing.
#[derive(Clone, Debug)]
struct SharedFile(Arc<Mutex<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.0).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        lock(&self.0).flush()
    }
}
