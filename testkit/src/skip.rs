//! The skip policy: loud locally, fatal in CI. See the [crate docs](crate#the-skip-policy).

use std::fmt::Display;

/// Whether the tests run in CI: the `CI` environment variable is set to anything but the
/// empty string, `0` or `false` (GitHub Actions, GitLab and most others set `CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| means_ci(&v))
}

fn means_ci(value: &str) -> bool {
    !matches!(value.trim(), "" | "0" | "false")
}

/// Whether the process runs with effective user id 0.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The name of the running test: libtest names each test's thread after the test. Outside
/// a test thread (`main`, or unnamed) it is `"this test"`.
pub fn current_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "this test".to_owned(),
    }
}

/// Reports that `test` cannot run here because of `reason`; the caller then returns.
///
/// Prints a banner holding `SKIPPED: <test>: <reason>` to standard error, past libtest's
/// output capture, so it shows in a plain `cargo test` run.
///
/// # Panics
/// When [`in_ci`]: a test that cannot run in CI is a failure there, never a pass.
#[track_caller]
pub fn skip(test: &str, reason: impl Display) {
    if in_ci() {
        panic!("{test} cannot run, and CI is set so it may not be skipped: {reason}");
    }
    let line = "*".repeat(72);
    loud(&format!("\n{line}\nSKIPPED: {test}: {reason}\n{line}\n"));
}

/// Writes `text` to the process's standard error directly, not through `eprint!`, which
/// libtest captures and shows only for failing tests: a skipped test passes, and its line
/// must be seen anyway.
pub(crate) fn loud(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `true` when the process is root; otherwise [`skip`]s `test` (so panics in CI) with a
/// reason saying what needs root (`why`, e.g. "ip netns add"), and returns `false`.
#[track_caller]
pub fn require_root(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(
        test,
        format!("needs root ({why}); run the tests as root, as CI does"),
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for v in ["true", "1", "yes", "True"] {
            assert!(means_ci(v), "{v}");
        }
        for v in ["", " ", "0", "false"] {
            assert!(!means_ci(v), "{v:?}");
        }
    }
}
