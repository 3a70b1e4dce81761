//! `rocectl exec [--lib-dir DIR] -- CMD ARGS…`: runs an unmodified libibverbs program on
//! rocectl by putting rocectl's drop-in `libibverbs.so.1` (built by `verbs/build-so.sh`) first
//! on its `LD_LIBRARY_PATH`, then replacing this process with it (`execvp`), so the program
//! keeps rocectl's pid, terminal and signals, and its exit status is the command's.
//!
//! The library's directory is, in order: `--lib-dir DIR`; `$ROCECTL_VERBS_LIB_DIR`;
//! `rocectl-verbs/` next to the rocectl executable (where `build-so.sh` puts it:
//! `target/release/rocectl` and `target/release/rocectl-verbs/libibverbs.so.1`). The first one
//! given is the one used: a `--lib-dir` or variable naming a directory without the library is
//! an error, never a silent fall-back.
//!
//! `--dev-nodes` runs the command in a private mount namespace where every device of the
//! library has a character device `/dev/infiniband/<dev_name>` and its sysfs files under
//! `/sys/class/infiniband/<name>/` (for UCX, which checks both); nothing changes outside it
//! (see [`crate::devns`]).
//!
//! Exit statuses of rocectl itself, as `env(1)`'s: 2 when the library is not found, 127 when
//! CMD is not found, 126 when it cannot be run. Setuid programs ignore `LD_LIBRARY_PATH`
//! (the loader's secure mode), so they keep the system library.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Args;

/// The library file `rocectl exec` looks for.
const LIB: &str = "libibverbs.so.1";

/// `rocectl exec` options.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// Directory holding rocectl's libibverbs.so.1 (default: $ROCECTL_VERBS_LIB_DIR, else
    /// rocectl-verbs/ next to the rocectl executable)
    #[arg(long, value_name = "DIR")]
    lib_dir: Option<PathBuf>,
    /// Run CMD in a private mount namespace with /dev/infiniband/uverbsN (an alias of
    /// /dev/null) and `/sys/class/infiniband/<name>/` files for each device: what UCX checks
    /// for. Nothing changes outside the command. Root, or unprivileged user namespaces.
    #[arg(long)]
    dev_nodes: bool,
    /// The program and its arguments (after `--`), e.g. `-- ibv_devinfo -v`
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// Where the library directory came from, for the error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Flag,
    Env,
    Default,
}

/// The directory holding `libibverbs.so.1`: `flag`, else `env` (`$ROCECTL_VERBS_LIB_DIR`,
/// ignored when empty), else `rocectl-verbs/` next to `exe`. Absolute (the command may change
/// its working directory). `Err` is the one-line message.
fn lib_dir(
    flag: Option<&Path>,
    env: Option<&OsStr>,
    exe: Option<&Path>,
) -> Result<PathBuf, String> {
    let (dir, source) = if let Some(d) = flag {
        (d.to_path_buf(), Source::Flag)
    } else if let Some(d) = env.filter(|v| !v.is_empty()) {
        (PathBuf::from(d), Source::Env)
    } else if let Some(exe_dir) = exe.and_then(Path::parent) {
        (exe_dir.join("rocectl-verbs"), Source::Default)
    } else {
        return Err(format!(
            "cannot find rocectl's {LIB} (the rocectl executable's location is unknown); \
             run verbs/build-so.sh and pass --lib-dir target/release/rocectl-verbs"
        ));
    };
    if !dir.join(LIB).is_file() {
        let whence = match source {
            Source::Flag => "--lib-dir",
            Source::Env => "ROCECTL_VERBS_LIB_DIR",
            Source::Default => "next to rocectl",
        };
        return Err(format!(
            "no {LIB} in {} ({whence}); build it with verbs/build-so.sh",
            dir.display()
        ));
    }
    std::path::absolute(&dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// `dir` in front of the `LD_LIBRARY_PATH` value `old` (unset or empty: `dir` alone).
fn library_path(dir: &Path, old: Option<&OsStr>) -> OsString {
    let mut v = dir.as_os_str().to_os_string();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Runs `rocectl exec`: returns only when the command could not be started.
pub(crate) fn run(args: &ExecArgs) -> ExitCode {
    let exe = std::env::current_exe().ok();
    let env = std::env::var_os("ROCECTL_VERBS_LIB_DIR");
    let dir = match lib_dir(args.lib_dir.as_deref(), env.as_deref(), exe.as_deref()) {
        Ok(d) => d,
        Err(msg) => {
            eprintln!("rocectl: error: {msg}");
            return ExitCode::from(2);
        }
    };
    // INVARIANT: clap rejects `rocectl exec` without CMD (`required = true`).
    let (program, rest) = args
        .command
        .split_first()
        .expect("clap requires at least one CMD word");
    if args.dev_nodes {
        if let Err(msg) = crate::devns::enter() {
            eprintln!("rocectl: error: --dev-nodes: {msg}");
            return ExitCode::from(2);
        }
    }
    let path = library_path(&dir, std::env::var_os("LD_LIBRARY_PATH").as_deref());
    let err = Command::new(program)
        .args(rest)
        .env("LD_LIBRARY_PATH", path)
        .exec();
    let name = Path::new(program).display();
    match err.kind() {
        io::ErrorKind::NotFound => {
            eprintln!("rocectl: error: {name}: command not found");
            ExitCode::from(127)
        }
        _ => {
            eprintln!("rocectl: error: cannot run {name}: {err}");
            ExitCode::from(126)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("rocectl-exec-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Self(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_flag_wins_then_the_variable_then_the_executable_s_directory() {
        let t = TempDir::new("order");
        let (a, b, bin) = (t.0.join("a"), t.0.join("b"), t.0.join("bin"));
        for d in [&a, &b, &bin.join("rocectl-verbs")] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join(LIB), b"").unwrap();
        }
        let exe = bin.join("rocectl");
        assert_eq!(
            lib_dir(Some(&a), Some(b.as_os_str()), Some(&exe)),
            Ok(a.clone())
        );
        assert_eq!(
            lib_dir(None, Some(b.as_os_str()), Some(&exe)),
            Ok(b.clone())
        );
        assert_eq!(
            lib_dir(None, Some(OsStr::new("")), Some(&exe)),
            Ok(bin.join("rocectl-verbs"))
        );
        assert_eq!(
            lib_dir(None, None, Some(&exe)),
            Ok(bin.join("rocectl-verbs"))
        );
    }

    #[test]
    fn a_named_directory_without_the_library_is_an_error_not_a_fall_back() {
        let t = TempDir::new("missing");
        let bin = t.0.join("bin");
        std::fs::create_dir_all(bin.join("rocectl-verbs")).unwrap();
        std::fs::write(bin.join("rocectl-verbs").join(LIB), b"").unwrap();
        let exe = bin.join("rocectl");
        let empty = t.0.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = lib_dir(Some(&empty), None, Some(&exe)).unwrap_err();
        assert!(
            e.contains("--lib-dir") && e.contains("verbs/build-so.sh"),
            "{e}"
        );
        let e = lib_dir(None, Some(empty.as_os_str()), Some(&exe)).unwrap_err();
        assert!(e.contains("ROCECTL_VERBS_LIB_DIR"), "{e}");
        let e = lib_dir(None, None, Some(&empty.join("rocectl"))).unwrap_err();
        assert!(e.contains("next to rocectl") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_relative_directory_becomes_absolute() {
        let t = TempDir::new("relative");
        std::fs::write(t.0.join(LIB), b"").unwrap();
        let cwd = std::env::current_dir().unwrap();
        let rel = pathdiff(&t.0, &cwd);
        let got = lib_dir(Some(&rel), None, None).unwrap();
        assert!(got.is_absolute(), "{}", got.display());
        assert!(got.join(LIB).is_file());
    }

    /// `path` relative to `base` (both absolute), through `..` steps.
    fn pathdiff(path: &Path, base: &Path) -> PathBuf {
        let mut rel = PathBuf::new();
        for _ in base.components().skip(1) {
            rel.push("..");
        }
        rel.join(path.strip_prefix("/").unwrap())
    }

    #[test]
    fn the_library_directory_goes_first_on_the_search_path() {
        let d = Path::new("/opt/rv");
        assert_eq!(library_path(d, None), OsString::from("/opt/rv"));
        assert_eq!(
            library_path(d, Some(OsStr::new(""))),
            OsString::from("/opt/rv")
        );
        assert_eq!(
            library_path(d, Some(OsStr::new("/a:/b"))),
            OsString::from("/opt/rv:/a:/b")
        );
    }
}
