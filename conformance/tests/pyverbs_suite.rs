//! rdma-core's own test suite (its `tests/` at v44.0, vendored in
//! `conformance/pyverbs/rdma-core-v44-tests/`) with Debian's `python3-pyverbs` on rocectl's
//! drop-in `libibverbs.so.1` (issue 13).
//!
//! Each `test_*.py` runs alone (`conformance/pyverbs/run_file.py`, as rdma-core's
//! `run_tests.py`, with `--dev rocectl_veth-a --gid <IPv4 GID index>`), in namespace A of a veth
//! pair (so the device has an IP address), bounded per file (`ROCE_PYVERBS_FILE_TIMEOUT`,
//! default 300 s) and in total (`ROCE_PYVERBS_BUDGET`, default 1800 s: the files after it are
//! reported as not run). The results, passed/skipped/failed per file and every failure's
//! exception line, go to `conformance/README.md` (not with `ROCE_DROPIN_README=0`). A failure
//! listed in `conformance/pyverbs/explained.txt` with its one-line explanation does not fail
//! the test; any other does.
//!
//! Runs only with `ROCE_DROPIN=1` (root, the drop-in built, python3-pyverbs):
//!
//! ```sh
//! sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test pyverbs_suite -- --nocapture
//! ```
//!
//! `ROCE_PYVERBS_FILES=test_pd,test_qp` runs only the files whose name contains one of the
//! words. Logs: `target/dropin/pyverbs/<file>.txt`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use roce_conformance::lab::update_readme_marked;
use roce_conformance::pyverbs::{
    render_section, test_files, Explained, FileRun, Outcome, SuiteReport, PYVERBS_BEGIN,
    PYVERBS_END, RDMA_CORE_TAG,
};
use roce_conformance::stock::{deb_version, selected, DropinLink, DropinPaths, Impl};
use roce_testkit::netns::netns_or_skip;

const TEST: &str = "pyverbs_suite";
/// Debian's interpreter: python3-pyverbs installs into its dist-packages.
const PYTHON: &str = "/usr/bin/python3";

fn secs_var(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

#[test]
fn rdma_core_tests_on_the_dropin() {
    if std::env::var("ROCE_DROPIN").as_deref() != Ok("1") {
        eprintln!(
            "{TEST}: skipped; set ROCE_DROPIN=1 (needs root, verbs/build-so.sh's library and \
             python3-pyverbs) or run conformance/stock/ci.sh"
        );
        return;
    }
    if !netns_or_skip(TEST) {
        return;
    }
    let paths = DropinPaths::from_env();
    let mut missing = paths.missing(&["ibv_devinfo"], false);
    let has_pyverbs = std::process::Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pyverbs {
        missing.push(format!(
            "pyverbs for {PYTHON} (apt-get install python3-pyverbs)"
        ));
    }
    if !missing.is_empty() {
        roce_testkit::skip(TEST, format!("missing: {}", missing.join("; ")));
        return;
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("pyverbs");
    let runner = here.join("run_file.py");
    let tests_dir = here.join("rdma-core-v44-tests/tests");
    let files =
        test_files(&tests_dir).unwrap_or_else(|e| panic!("listing {}: {e}", tests_dir.display()));
    assert!(!files.is_empty(), "no test_*.py in {}", tests_dir.display());
    let filter: Vec<String> = std::env::var("ROCE_PYVERBS_FILES")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let per_file = secs_var("ROCE_PYVERBS_FILE_TIMEOUT", 300);
    let budget = secs_var("ROCE_PYVERBS_BUDGET", 1800);
    let explained = Explained::load(&here.join("explained.txt"));

    let started = SystemTime::now();
    let t0 = Instant::now();
    let out = std::env::var_os("ROCE_DROPIN_OUT")
        .map_or_else(|| paths.workspace.join("target/dropin"), PathBuf::from)
        .join("pyverbs");
    let link = DropinLink::create("pyverbs", 1500, &paths, false, &out)
        .unwrap_or_else(|e| panic!("creating the veth pair: {e}"));
    let node = &link.server;
    let mut base = vec!["--dev".to_owned(), node.device()];
    if let Some(g) = node.stock_gid {
        base.extend(["--gid".to_owned(), g.to_string()]);
    }
    let mut runs = Vec::new();
    for file in files.iter().filter(|f| selected(f, &filter)) {
        if t0.elapsed() >= budget {
            eprintln!("{TEST}: {file}: not run (budget of {budget:?} spent)");
            runs.push(FileRun::not_run(file));
            continue;
        }
        let mut args = vec![runner.display().to_string(), file.clone()];
        args.extend(base.iter().cloned());
        let argv = node.argv(&paths, Impl::Stock, PYTHON, "", &args);
        let limit = per_file.min(
            budget
                .saturating_sub(t0.elapsed())
                .max(Duration::from_secs(30)),
        );
        let run = match node.run(&argv, limit, &out.join("logs")) {
            Ok(o) => FileRun::from_output(file, o),
            Err(e) => panic!("starting {PYTHON} for {file}: {e}"),
        };
        if let Some(o) = &run.output {
            let _ = std::fs::write(
                out.join(format!("{file}.txt")),
                format!(
                    "# {}\n# {}\n\n## stdout\n{}\n## stderr\n{}",
                    argv.join(" "),
                    o.status_text(),
                    o.stdout,
                    o.stderr
                ),
            );
        }
        eprintln!(
            "{TEST}: {file}: {} passed, {} skipped, {} failed{}",
            run.passed(),
            run.count(Outcome::Skip),
            run.failed(),
            run.broken().map(|b| format!(" ({b})")).unwrap_or_default()
        );
        runs.push(run);
    }

    let mut environment = vec![
        (
            "drop-in".to_owned(),
            format!("{} (verbs/build-so.sh)", paths.show(&paths.library())),
        ),
        (
            "tests".to_owned(),
            format!(
                "rdma-core {RDMA_CORE_TAG} `tests/` (commit 91392a91eb41), vendored in \
                 conformance/pyverbs/rdma-core-v44-tests"
            ),
        ),
        (
            "device".to_owned(),
            format!(
                "{} ({} {} in namespace a of a veth pair), GID index {}",
                node.device(),
                node.ifname,
                node.ipv4,
                node.stock_gid
                    .map_or("not found: tests pick their own".to_owned(), |g| g
                        .to_string())
            ),
        ),
        ("interpreter".to_owned(), PYTHON.to_owned()),
    ];
    for pkg in ["python3-pyverbs", "libibverbs1"] {
        environment.push((
            format!("Debian {pkg}"),
            deb_version(pkg).unwrap_or_else(|| "not installed".to_owned()),
        ));
    }
    for c in &link.checks {
        environment.push((
            c.name.clone(),
            match &c.result {
                Ok(s) => s.clone(),
                Err(e) => format!("FAILED: {e}"),
            },
        ));
    }
    let report = SuiteReport {
        started,
        command: "sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test pyverbs_suite"
            .to_owned(),
        environment,
        files: runs,
        total: t0.elapsed(),
        filter: (!filter.is_empty()).then(|| filter.join(",")),
    };
    if std::env::var("ROCE_DROPIN_README").as_deref() != Ok("0") {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        update_readme_marked(
            &readme,
            PYVERBS_BEGIN,
            PYVERBS_END,
            &render_section(&report, &explained),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
    }
    assert!(
        !report.files.is_empty(),
        "no file matched ROCE_PYVERBS_FILES"
    );
    let unexplained = report.unexplained(&explained);
    assert!(
        unexplained.is_empty(),
        "{} failures without an explanation in conformance/pyverbs/explained.txt (logs in {}):\n{}",
        unexplained.len(),
        out.display(),
        unexplained
            .iter()
            .map(|(t, why)| format!("{t}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
