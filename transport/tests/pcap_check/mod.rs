//! Shared by the integration tests: `shared/tools/check_pcap.sh` on a capture.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `$ROCE_SHARED_DIR`, else `shared/` beside the repository.
fn shared_dir() -> PathBuf {
    std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// Runs `shared/tools/check_pcap.sh` on a capture; panics with its output unless it passes.
/// `ROCECTL_SKIP_TSHARK` skips the check, loudly.
pub(crate) fn check_pcap(path: &Path) {
    if std::env::var_os("ROCECTL_SKIP_TSHARK").is_some() {
        eprintln!(
            "!!! ROCECTL_SKIP_TSHARK set: NOT checking {}",
            path.display()
        );
        return;
    }
    let script = shared_dir().join("tools/check_pcap.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "check_pcap.sh {}:\n{text}",
        path.display()
    );
    eprintln!("{}: {}", path.display(), text.lines().last().unwrap_or(""));
}
