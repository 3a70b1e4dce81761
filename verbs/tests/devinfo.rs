//! The stock `ibv_devinfo -v` (Debian's ibverbs-utils 44) on the drop-in `libibverbs.so.1`,
//! in a network namespace with a veth: it finds `rocectl_veth-a`, the port is
//! `PORT_ACTIVE` on Ethernet, and its GID lines are the interface's GID table as rdma_rxe
//! builds it (`NetDevice::gid_table`), every entry "RoCE v2".
//!
//! The test runs `verbs/build-so.sh` (a no-op cargo build plus a link when nothing changed)
//! so it checks the library this tree builds. Without `cc` or `ibv_devinfo` it is skipped
//! (testkit's policy: `SKIPPED` locally, a failure in CI).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use roce_testkit::netns::{netns_or_skip, NetnsPair};
use roce_testkit::proc::run_bounded;
use roce_testkit::skip;
use roce_transport::netdev::{self, GidEntry};

/// `target/<profile>`: this test binary is `target/<profile>/deps/devinfo-<hash>`.
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

fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
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
    let dir = profile.join("rocectl-verbs");
    assert!(
        dir.join("libibverbs.so.1").exists(),
        "no library in {}",
        dir.display()
    );
    dir
}

/// `GID[  1]:<TAB><TAB>::ffff:10.1.2.1, RoCE v2`, as ibv_devinfo prints an entry.
fn gid_line(e: &GidEntry) -> String {
    let ip = std::net::Ipv6Addr::from(e.gid.0);
    format!("GID[{:3}]:\t\t{ip}, RoCE v2", e.index)
}

#[test]
fn stock_ibv_devinfo_shows_the_port_and_the_gid_table() {
    let test = "stock_ibv_devinfo_shows_the_port_and_the_gid_table";
    if !have("cc", "--version") {
        return skip(test, "`cc` is not installed (apt install build-essential)");
    }
    if !Path::new("/usr/bin/ibv_devinfo").exists() {
        return skip(
            test,
            "/usr/bin/ibv_devinfo is missing (apt install ibverbs-utils)",
        );
    }
    if !netns_or_skip(test) {
        return;
    }
    let lib = build_lib();
    let pair = NetnsPair::create("vdevinfo").unwrap();
    let a = pair.a().clone();
    let (out, table) = a
        .netns()
        .enter_scoped(|| {
            let table = netdev::interface(a.ifname()).unwrap().gid_table();
            let mut cmd = Command::new("/usr/bin/ibv_devinfo");
            cmd.arg("-v")
                .env("LD_LIBRARY_PATH", &lib)
                .env("ROCECTL_VERBS_CONF", "/nonexistent")
                .env(
                    "ROCECTL_VERBS_DEVICES",
                    format!("rocectl_{0}={0}", a.ifname()),
                );
            let out = run_bounded(cmd, "ibv_devinfo -v", Duration::from_secs(30), &scratch())
                .expect("ibv_devinfo starts");
            (out, table)
        })
        .unwrap();
    assert!(out.success(), "ibv_devinfo -v failed:\n{}", out.combined());
    let text = out.stdout;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines[0], "hca_id:\trocectl_veth-a", "{text}");
    assert!(lines.contains(&"state:\t\t\tPORT_ACTIVE (4)"), "{text}");
    assert!(lines.contains(&"link_layer:\t\tEthernet"), "{text}");
    assert!(lines.contains(&"phys_port_cnt:\t\t\t1"), "{text}");
    assert!(lines.contains(&"vendor_id:\t\t\t0xffffff"), "{text}");
    let gids: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("GID["))
        .collect();
    let want: Vec<String> = table.iter().map(gid_line).collect();
    assert_eq!(gids, want, "{text}");
    assert!(
        want.iter().any(|l| l.contains(&a.ipv4().to_string())),
        "{want:?}"
    );
}
