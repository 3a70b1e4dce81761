//! The ABI surface of `libibverbs.so.1` as built by `verbs/build-so.sh`: the same default-version
//! exports, node by node, as Debian's rdma-core 44 library; `dlvsym` finds them at their
//! versions; every stub returns its error without aborting.
//!
//! The test runs `verbs/build-so.sh` itself (once per test process, bounded in time; a no-op
//! cargo build plus a one-second link when nothing changed), so the library it checks is the
//! one this tree builds. It needs `cc`, `objdump` and Debian's `libibverbs1` (the reference
//! library); without them it is skipped (testkit's policy: `SKIPPED` locally, a failure in CI).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use roce_testkit::proc::run_bounded;
use roce_testkit::skip;

/// rdma-core 44's library, as Debian 12 installs it (package `libibverbs1`).
const REAL_LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// The profile directory this test binary was built into (`target/release`): the binary is
/// `target/<profile>/deps/symbols-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Scratch directory for this test's compiled probes and logs.
fn scratch() -> PathBuf {
    let d = profile_dir().join("verbs-tests");
    std::fs::create_dir_all(&d).expect("the target directory is writable");
    d
}

/// Whether `prog` runs (`prog --version`).
fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The tools the tests need, or why they cannot run.
fn prerequisites() -> Result<(), String> {
    for tool in ["cc", "objdump"] {
        if !have(tool) {
            return Err(format!(
                "`{tool}` is not installed (apt install build-essential binutils)"
            ));
        }
    }
    if !Path::new(REAL_LIB).exists() {
        return Err(format!("{REAL_LIB} is missing (apt install libibverbs1)"));
    }
    Ok(())
}

/// Builds our `libibverbs.so.1` with `verbs/build-so.sh` (once per process) and returns its
/// path. Panics with the script's output if the build fails.
fn built_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let profile = profile_dir();
        let target = profile.parent().expect("target/<profile> has a parent");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build-so.sh");
        let mut cmd = Command::new(&script);
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
            "verbs/build-so.sh failed ({}):\n{}",
            out.status_text(),
            out.combined()
        );
        let lib = profile.join("rocectl-verbs/libibverbs.so.1");
        assert!(
            lib.exists(),
            "build-so.sh succeeded but {} is missing",
            lib.display()
        );
        lib
    })
}

/// One default-version export of `objdump -T`: its node, name and kind (`DF` function, `DO`
/// object).
type Exports = BTreeMap<String, BTreeSet<(String, String)>>;

/// The default-version (`@@`) `IBVERBS_*` exports of `lib`, by node. Hidden versions
/// (`(IBVERBS_1.0)`, rdma-core's old-ABI aliases) and the nodes' own symbols are left out.
fn exports(lib: &Path) -> Exports {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump runs");
    assert!(out.status.success(), "objdump -T {} failed", lib.display());
    let mut by_node = Exports::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // ADDR FLAGS.. KIND SECTION SIZE VERSION NAME
        if f.len() < 5 || f[f.len() - 3] == "*UND*" {
            continue;
        }
        let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
        if !ver.starts_with("IBVERBS_") || ver == name {
            continue;
        }
        let kind = f
            .iter()
            .find(|t| t.starts_with('D'))
            .copied()
            .unwrap_or("?");
        by_node
            .entry(ver.to_string())
            .or_default()
            .insert((name.to_string(), kind.to_string()));
    }
    by_node
}

#[test]
fn every_node_exports_the_same_names_as_rdma_core_44() {
    if let Err(why) = prerequisites() {
        return skip("every_node_exports_the_same_names_as_rdma_core_44", why);
    }
    let ours = exports(built_lib());
    let real = exports(Path::new(REAL_LIB));
    assert_eq!(
        real.len(),
        13,
        "rdma-core 44 has 13 version nodes: {:?}",
        real.keys()
    );
    assert_eq!(real.values().map(BTreeSet::len).sum::<usize>(), 146);
    let mut diffs = Vec::new();
    for node in real.keys().chain(ours.keys()).collect::<BTreeSet<_>>() {
        let (r, o) = (
            real.get(node).cloned().unwrap_or_default(),
            ours.get(node).cloned().unwrap_or_default(),
        );
        for missing in r.difference(&o) {
            diffs.push(format!("{node}: missing {missing:?}"));
        }
        for extra in o.difference(&r) {
            diffs.push(format!("{node}: extra {extra:?}"));
        }
        if r.len() != o.len() {
            diffs.push(format!(
                "{node}: {} exports, rdma-core has {}",
                o.len(),
                r.len()
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "our exports differ from rdma-core 44's:\n{}",
        diffs.join("\n")
    );

    // What the loader needs besides names: the soname, and every import bound at load time.
    let dynamic = Command::new("objdump")
        .arg("-p")
        .arg(built_lib())
        .output()
        .expect("objdump runs");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic
            .lines()
            .any(|l| l.split_whitespace().eq(["SONAME", "libibverbs.so.1"])),
        "soname is not libibverbs.so.1"
    );
    // DT_FLAGS has DF_BIND_NOW (0x8) under -z now.
    let flags = dynamic
        .lines()
        .find_map(|l| l.trim().strip_prefix("FLAGS "))
        .and_then(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok());
    assert!(
        flags.is_some_and(|f| f & 0x8 != 0),
        "not linked with -z now (FLAGS {flags:?})"
    );
}

/// Compiles `tests/c/<name>.c` into the scratch directory; returns the executable.
fn compile(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = scratch().join(name);
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs a compiled probe on `lib` with `args` (bounded); returns (exit code, stdout, stderr).
fn probe(
    exe: &Path,
    lib: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(exe);
    cmd.arg(lib).args(args).env_remove("ROCECTL_VERBS_TRACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out =
        run_bounded(cmd, "probe", Duration::from_secs(60), &scratch()).expect("the probe starts");
    assert!(!out.timed_out, "{} timed out", exe.display());
    (out.code, out.stdout, out.stderr)
}

#[test]
fn dlvsym_finds_each_name_at_its_version_only() {
    if let Err(why) = prerequisites() {
        return skip("dlvsym_finds_each_name_at_its_version_only", why);
    }
    let exe = compile("dlvsym_probe");
    let found = [
        "ibv_get_device_list@IBVERBS_1.1",
        "ibv_reg_mr_iova2@IBVERBS_1.8",
        "_ibv_query_gid_ex@IBVERBS_1.11",
        "ibv_query_gid_type@IBVERBS_PRIVATE_34",
        "ibv_query_qp_data_in_order@IBVERBS_1.14",
        "verbs_register_driver_34@IBVERBS_PRIVATE_34",
        "ibv_cmd_alloc_pd@IBVERBS_PRIVATE_34",
    ];
    let absent = [
        // defined, but in another node
        "!ibv_reg_mr_iova2@IBVERBS_1.1",
        "!ibv_query_gid_type@IBVERBS_1.14",
        // no such node
        "!ibv_get_device_list@IBVERBS_9.9",
        // a Rust-internal symbol of the archive: hidden by `local: *`
        "!rust_eh_personality@IBVERBS_PRIVATE_34",
    ];
    let args: Vec<&str> = found.iter().chain(&absent).copied().collect();
    // The same expectations hold for rdma-core's library: the probe measures the right thing.
    for lib in [Path::new(REAL_LIB), built_lib()] {
        let (code, stdout, stderr) = probe(&exe, lib, &args, &[]);
        assert_eq!(
            code,
            Some(0),
            "dlvsym on {}:\n{stdout}{stderr}",
            lib.display()
        );
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("ok ")).count(),
            args.len(),
            "{stdout}"
        );
    }
}

#[test]
fn every_stub_returns_its_error_without_aborting() {
    if let Err(why) = prerequisites() {
        return skip("every_stub_returns_its_error_without_aborting", why);
    }
    let calls: Vec<String> = ibverbs::stubs::STUBBED
        .iter()
        .filter(|(_, kind)| *kind != "data")
        .map(|(name, kind)| format!("{name}:{kind}"))
        .collect();
    // Whatever the other modules implement, the provider-private ABI stays stubbed: it is
    // rdma-core's kernel-command marshalling, which has no meaning without a kernel.
    assert!(
        calls.iter().any(|c| c.starts_with("ibv_cmd_")),
        "no ibv_cmd_* stub: {calls:?}"
    );
    assert!(
        calls.iter().any(|c| c == "verbs_register_driver_34:noop"),
        "{calls:?}"
    );
    let exe = compile("call_stubs");
    let args: Vec<&str> = calls.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = probe(&exe, built_lib(), &args, &[("ROCECTL_VERBS_TRACE", "1")]);
    assert_eq!(
        code,
        Some(0),
        "a stub misbehaved or the prober died:\n{stdout}{stderr}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        calls.len(),
        "{stdout}"
    );
    // Traced once per name although each was called twice.
    for (name, kind) in ibverbs::stubs::STUBBED.iter().filter(|(_, k)| *k != "data") {
        let line = format!("rocectl libibverbs: {name}() is not implemented (stub)");
        let n = stderr.lines().filter(|l| *l == line).count();
        assert_eq!(n, 1, "{name} ({kind}) traced {n} times:\n{stderr}");
    }
    // Untraced: silent.
    let (code, _, stderr) = probe(&exe, built_lib(), &args, &[]);
    assert_eq!(code, Some(0));
    assert!(!stderr.contains("rocectl libibverbs"), "{stderr}");
}
