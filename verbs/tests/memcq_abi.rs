//! Memory registration, CQs and completion channels as a stock C program reaches them: the
//! `ibv_reg_mr` macro (→ `ibv_reg_mr@IBVERBS_1.1` or `ibv_reg_mr_iova2@IBVERBS_1.8`), the
//! inline `ibv_create_cq_ex`, `ibv_start_poll`/`ibv_wc_read_*`, `ibv_poll_cq` and
//! `ibv_req_notify_cq`, and the exported channel verbs, compiled against Debian's
//! `<infiniband/verbs.h>` and run on `libibverbs.so.1` from `verbs/build-so.sh`
//! (`tests/c/memcq_probe.c`; it names the failed check). Two RC QPs of one context on `lo` of
//! a temporary network namespace exchange a SEND with immediate (one event per armed CQ on
//! the shared channel, a blocking `ibv_get_cq_event`, acknowledgements, then `EAGAIN` with
//! `O_NONBLOCK`), an RDMA WRITE into the registered array itself and one into a ZERO_BASED
//! region at an offset, solicited-only arming (no event for an unsolicited SEND, one for a
//! solicited SEND), and a WRITE refused after `ibv_dereg_mr`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use roce_testkit::netns::{netns_or_skip, TempNetns};
use roce_testkit::proc::run_bounded;
use roce_testkit::skip;

/// `target/<profile>`: this test binary is `target/<profile>/deps/memcq_abi-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps")
        .to_path_buf()
}

fn scratch() -> PathBuf {
    let d = profile_dir().join("verbs-tests");
    std::fs::create_dir_all(&d).expect("the target directory is writable");
    d
}

/// Builds the library with `verbs/build-so.sh`; returns its directory.
fn build_lib() -> PathBuf {
    let profile = profile_dir();
    let target = profile.parent().expect("target/<profile> has a parent");
    let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("build-so.sh"));
    match profile.file_name().and_then(|n| n.to_str()) {
        Some("release") => {}
        Some("debug") => {
            cmd.arg("--debug");
        }
        other => panic!("build-so.sh builds the release or debug profile, not {other:?}"),
    }
    cmd.env("CARGO_TARGET_DIR", target);
    let out = run_bounded(cmd, "build-so.sh", Duration::from_secs(1200), &scratch())
        .expect("verbs/build-so.sh starts");
    assert!(
        out.success(),
        "verbs/build-so.sh failed:\n{}",
        out.combined()
    );
    profile.join("rocectl-verbs")
}

#[test]
fn memory_regions_cqs_and_channels_through_the_c_header() {
    let test = "memory_regions_cqs_and_channels_through_the_c_header";
    let cc_ok = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !cc_ok {
        return skip(test, "`cc` is not installed (apt install build-essential)");
    }
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        return skip(
            test,
            "<infiniband/verbs.h> is missing (apt install libibverbs-dev)",
        );
    }
    if !netns_or_skip(test) {
        return;
    }
    let lib = build_lib();
    let probe = scratch().join("memcq_probe");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/memcq_probe.c");
    let mut cc = Command::new("cc");
    cc.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&probe)
        .arg(&src)
        .arg("-libverbs");
    let out = run_bounded(cc, "cc memcq_probe.c", Duration::from_secs(120), &scratch())
        .expect("cc starts");
    assert!(
        out.success(),
        "memcq_probe.c does not compile:\n{}",
        out.combined()
    );

    let ns = TempNetns::create("vmemcq").unwrap();
    let mut cmd = ns.command(probe.to_str().expect("a UTF-8 target path"));
    cmd.env("LD_LIBRARY_PATH", &lib)
        .env("ROCECTL_VERBS_CONF", "/nonexistent")
        .env("ROCECTL_VERBS_DEVICES", "rocectl_lo=lo@127.0.0.1");
    let out = run_bounded(cmd, "memcq_probe", Duration::from_secs(60), &scratch())
        .expect("memcq_probe starts");
    assert!(out.success(), "memcq_probe failed:\n{}", out.combined());
    assert!(out.stdout.contains("memcq probe ok"), "{}", out.combined());
}
