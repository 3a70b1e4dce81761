//! `rocectl demo`, the README's main command: every operation with the data verified, and the
//! capture (`--pcap`, or `ROCECTL_PCAP` with `{dev}` for one file per device) readable by
//! `rocectl pcap check` with every ICRC correct.

use std::path::Path;
use std::process::Command;

fn rocectl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rocectl"))
}

fn check(path: &Path) -> String {
    let out = rocectl()
        .args(["pcap", "check"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pcap check {}: {text}",
        path.display()
    );
    let last = text.lines().last().unwrap_or("").to_string();
    assert!(last.ends_with(" 0 failed"), "{last}");
    last
}

#[test]
fn demo_runs_every_operation_and_its_capture_verifies() {
    let dir = std::env::temp_dir().join(format!("rocectl-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("demo.pcap");
    let out = rocectl()
        .args([
            "demo",
            "--backend",
            "sim",
            "--sizes",
            "0,4096,1048576",
            "-n",
            "2",
            "--pcap",
        ])
        .arg(&pcap)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for op in [
        "RC SEND",
        "RC RDMA_WRITE_WITH_IMM",
        "RC RDMA_READ",
        "RC ATOMIC_FETCH_ADD",
        "RC ATOMIC_CMP_SWAP",
        "UD SEND",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(op) && l.ends_with("data verified")),
            "{op} missing:\n{text}"
        );
    }
    assert!(text.contains(" 0 ICRC errors"), "{text}");
    let summary = check(&pcap);
    assert!(!summary.starts_with("0 passed"), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rocectl_pcap_env_captures_each_device() {
    let dir = std::env::temp_dir().join(format!("rocectl-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("cap-{dev}.pcap");
    let out = rocectl()
        .args(["demo", "--backend", "sim", "--sizes", "64", "-n", "1"])
        .env("ROCECTL_PCAP", &pattern)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for dev in ["rocectl-a", "rocectl-b"] {
        let p = dir.join(format!("cap-{dev}.pcap"));
        assert!(p.exists(), "{} missing", p.display());
        check(&p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
