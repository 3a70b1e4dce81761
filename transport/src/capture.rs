//! Packet capture: every frame a device sends and receives, as a pcap file.
//!
//! Frames carry real Ethernet, IP and UDP headers even on the `udp` backend: the engine writes
//! the headers the kernel put on the wire (IPv4 Identification 0 and DF on send; on receive
//! the Identification recovered from the ICRC), so Wireshark decodes them as RoCE and
//! `check_pcap.sh` verifies every ICRC. Ethernet addresses on the `udp` backend are derived
//! from the IP addresses (locally administered `02:00:a.b.c.d`).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use roce_wire::pcap::PcapWriter;

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
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}
