//! `rocectl exec`: the drop-in library's directory first on the command's `LD_LIBRARY_PATH`,
//! the command's own exit status, and one-line errors with `env(1)`'s statuses.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A directory for one test under cargo's per-target temp dir, holding (when `with_lib`) a
/// placeholder `libibverbs.so.1` (exec only checks that it exists; `sh` never loads it).
fn lib_dir(tag: &str, with_lib: bool) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("exec-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    if with_lib {
        std::fs::write(d.join("libibverbs.so.1"), b"").unwrap();
    }
    d
}

fn rocectl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rocectl"));
    cmd.args(args).env_remove("ROCECTL_VERBS_LIB_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("rocectl runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_library_directory_comes_first_and_the_old_path_follows() {
    let dir = lib_dir("first", true);
    let d = dir.to_str().unwrap();
    let out = rocectl(
        &[
            "exec",
            "--lib-dir",
            d,
            "--",
            "sh",
            "-c",
            "echo $LD_LIBRARY_PATH",
        ],
        &[("LD_LIBRARY_PATH", "/x/y")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{d}:/x/y\n"));

    // The variable, and no old path.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rocectl"));
    cmd.args(["exec", "--", "sh", "-c", "echo $LD_LIBRARY_PATH"])
        .env("ROCECTL_VERBS_LIB_DIR", d)
        .env_remove("LD_LIBRARY_PATH");
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{d}\n"));
}

#[test]
fn the_command_s_arguments_and_exit_status_pass_through() {
    let dir = lib_dir("status", true);
    let d = dir.to_str().unwrap();
    // `-v` and `--x` belong to the command, not to rocectl (with or without `--`).
    let out = rocectl(
        &[
            "exec",
            "--lib-dir",
            d,
            "--",
            "sh",
            "-c",
            "echo \"$@\"; exit 7",
            "sh",
            "-v",
            "--x",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "-v --x\n");
    let out = rocectl(&["exec", "--lib-dir", d, "sh", "-c", "exit 3"], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

#[test]
fn a_missing_library_is_one_line_and_status_2() {
    let dir = lib_dir("missing", false);
    let d = dir.to_str().unwrap();
    for out in [
        rocectl(&["exec", "--lib-dir", d, "--", "true"], &[]),
        rocectl(&["exec", "--", "true"], &[("ROCECTL_VERBS_LIB_DIR", d)]),
    ] {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("rocectl: error: no libibverbs.so.1 in "),
            "{err}"
        );
        assert!(err.contains("verbs/build-so.sh"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_missing_command_is_one_line_and_status_127() {
    let dir = lib_dir("nocmd", true);
    let out = rocectl(
        &[
            "exec",
            "--lib-dir",
            dir.to_str().unwrap(),
            "--",
            "rocectl-no-such-program",
        ],
        &[],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert_eq!(
        err,
        "rocectl: error: rocectl-no-such-program: command not found\n"
    );
}

#[test]
fn no_command_is_a_usage_error() {
    let out = rocectl(&["exec"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("CMD"), "{}", text(&out.stderr));
}

#[test]
fn dev_nodes_exist_inside_the_command_only() {
    const TEST: &str = "dev_nodes_exist_inside_the_command_only";
    if !roce_testkit::require_root(TEST, "unshare(CLONE_NEWNS) and mounts") {
        return;
    }
    let dir = lib_dir("devnodes", true);
    let d = dir.to_str().unwrap();
    let script = "stat -c '%F %t:%T %a' /dev/infiniband/uverbs0 /dev/infiniband/uverbs1; \
                  cat /sys/class/infiniband/rocectl_dn1/ports/1/gid_attrs/types/0 \
                      /sys/class/infiniband/rocectl_dn1/ports/1/link_layer; \
                  test -e /dev/null && test -d /proc/self && echo ok";
    let out = rocectl(
        &[
            "exec",
            "--lib-dir",
            d,
            "--dev-nodes",
            "--",
            "sh",
            "-c",
            script,
        ],
        &[("ROCECTL_VERBS_DEVICES", "rocectl_dn0=lo,rocectl_dn1=lo")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "character special file 1:3 666\ncharacter special file 1:3 666\nRoCE v2\nEthernet\nok\n"
    );
    // Nothing changed outside the command.
    for p in [
        "/sys/class/infiniband/rocectl_dn0",
        "/sys/class/infiniband/rocectl_dn1",
    ] {
        assert!(!std::path::Path::new(p).exists(), "{p} exists outside");
    }
    if !std::path::Path::new("/dev/infiniband").exists() {
        // (A host with real RDMA devices has its own /dev/infiniband.)
        let out = rocectl(
            &[
                "exec",
                "--lib-dir",
                d,
                "--",
                "test",
                "-e",
                "/dev/infiniband",
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    }
}
