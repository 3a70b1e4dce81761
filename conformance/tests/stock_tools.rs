//! Unmodified Debian `ibv_*_pingpong` and perftest `ib_*` binaries on rocectl's drop-in
//! `libibverbs.so.1` (issue 13), over a veth pair between two network namespaces:
//!
//! - **pairing 1**: both ends are the stock binary on the drop-in;
//! - **pairing 3**: the stock binary on the drop-in against rocectl's own tool, both directions.
//!
//! (Pairing 2, against Linux rdma_rxe, is in `lab_interop.rs`.) Runs only with `ROCE_DROPIN=1`
//! (root, the drop-in built by `verbs/build-so.sh`, `rocectl` built, Debian's ibverbs-utils and
//! perftest; a few minutes). `conformance/stock/ci.sh` builds everything and runs it:
//!
//! ```sh
//! sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test stock_tools -- --nocapture
//! ```
//!
//! `ROCE_DROPIN_CASES=p1:,send_bw` runs only the cases whose id contains one of the words;
//! `ROCE_DROPIN_README=0` leaves `conformance/README.md` alone. Logs: `target/dropin/<case>.txt`.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use roce_conformance::lab::update_readme_marked;
use roce_conformance::stock::{
    deb_version, render_section, run_case, selected, CaseOutcome, CaseSpec, CaseTimeouts,
    DropinLink, DropinPaths, Impl, PairingReport, StockReport, Variant, FIRST_PORT, STOCK_BEGIN,
    STOCK_END, STOCK_PROGRAMS, VARIANTS,
};
use roce_testkit::netns::netns_or_skip;

const TEST: &str = "stock_tools";

fn out_dir(paths: &DropinPaths) -> PathBuf {
    std::env::var_os("ROCE_DROPIN_OUT")
        .map_or_else(|| paths.workspace.join("target/dropin"), PathBuf::from)
}

#[test]
fn stock_tools_on_the_dropin() {
    if std::env::var("ROCE_DROPIN").as_deref() != Ok("1") {
        eprintln!(
            "{TEST}: skipped; set ROCE_DROPIN=1 (needs root, verbs/build-so.sh's library, \
             rocectl, ibverbs-utils and perftest) or run conformance/stock/ci.sh"
        );
        return;
    }
    if !netns_or_skip(TEST) {
        return;
    }
    let paths = DropinPaths::from_env();
    let missing = paths.missing(STOCK_PROGRAMS, true);
    if !missing.is_empty() {
        roce_testkit::skip(TEST, format!("missing: {}", missing.join("; ")));
        return;
    }
    let filter: Vec<String> = std::env::var("ROCE_DROPIN_CASES")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let started = SystemTime::now();
    let t0 = Instant::now();
    let out = out_dir(&paths);
    let normal = DropinLink::create("dropin", 1500, &paths, true, &out)
        .unwrap_or_else(|e| panic!("creating the veth pair (MTU 1500): {e}"));
    let jumbo = DropinLink::create("dropin9k", 9000, &paths, true, &out)
        .unwrap_or_else(|e| panic!("creating the veth pair (MTU 9000): {e}"));

    let mut port = FIRST_PORT;
    let mut run = |id: String, variant: Variant, server: Impl, client: Impl| -> CaseOutcome {
        let link = if variant.jumbo { &jumbo } else { &normal };
        let spec = CaseSpec {
            id,
            variant,
            server,
            client,
        };
        let r = run_case(
            &paths,
            &link.server,
            &link.client,
            &spec,
            port,
            CaseTimeouts::default(),
            &out,
        );
        port = if port >= 19_400 { FIRST_PORT } else { port + 1 };
        eprintln!(
            "{TEST}: {} {} in {:.1}s{}",
            if r.passed() { "PASS" } else { "FAIL" },
            r.id,
            r.elapsed.as_secs_f64(),
            r.failure
                .as_deref()
                .map(|f| format!(": {f}"))
                .unwrap_or_default()
        );
        r
    };

    let mut p1 = Vec::new();
    let mut p3 = Vec::new();
    for v in VARIANTS {
        let id = format!("p1:{}", v.name);
        if selected(&id, &filter) {
            p1.push(run(id, *v, Impl::Stock, Impl::Stock));
        }
    }
    for v in VARIANTS {
        for (suffix, server, client) in [
            ("stock_server", Impl::Stock, Impl::Ours),
            ("ours_server", Impl::Ours, Impl::Stock),
        ] {
            let id = format!("p3:{}/{suffix}", v.name);
            if selected(&id, &filter) {
                p3.push(run(id, *v, server, client));
            }
        }
    }
    let checks: Vec<_> = normal
        .checks
        .iter()
        .filter(|c| selected(&format!("p1:{}", c.name), &filter))
        .cloned()
        .collect();

    let gid = |g: Option<u32>| g.map_or("not found (1 used)".to_owned(), |g| g.to_string());
    let mut environment = vec![
        (
            "drop-in".to_owned(),
            format!("{} (verbs/build-so.sh)", paths.show(&paths.library())),
        ),
        (
            "device names".to_owned(),
            "rocectl_<ifname> (default discovery: one device per UP interface)".to_owned(),
        ),
    ];
    for pkg in ["ibverbs-utils", "perftest", "libibverbs1"] {
        environment.push((
            format!("Debian {pkg}"),
            deb_version(pkg).unwrap_or_else(|| "not installed".to_owned()),
        ));
    }
    for (what, link) in [("MTU 1500 veth", &normal), ("MTU 9000 veth", &jumbo)] {
        environment.push((
            format!("{what}: server side"),
            format!(
                "{} {} in ns a, GID index {} (drop-in), {} (rocectl)",
                link.server.ifname,
                link.server.ipv4,
                gid(link.server.stock_gid),
                gid(link.server.ours_gid)
            ),
        ));
        environment.push((
            format!("{what}: client side"),
            format!(
                "{} {} in ns b, GID index {} (drop-in), {} (rocectl)",
                link.client.ifname,
                link.client.ipv4,
                gid(link.client.stock_gid),
                gid(link.client.ours_gid)
            ),
        ));
    }
    let report = StockReport {
        started,
        command: "sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test stock_tools"
            .to_owned(),
        environment,
        pairings: vec![
            PairingReport {
                title: "Pairing 1: both ends on rocectl".to_owned(),
                description: "The stock binary on the drop-in on both sides: the server in \
                              namespace A, the client in namespace B. The `m4096`/`mtu4096` rows \
                              run over the MTU 9000 veth (RoCE active MTU 4096), the others over \
                              MTU 1500 (active MTU 1024)."
                    .to_owned(),
                checks,
                cases: p1,
            },
            PairingReport {
                title: "Pairing 3: stock binaries against rocectl's own tools".to_owned(),
                description: "Each row of pairing 1 in both directions: `stock_server` is the \
                              stock server on the drop-in with `rocectl <tool>` as the client, \
                              `ours_server` the other way round. Same options on both sides."
                    .to_owned(),
                checks: Vec::new(),
                cases: p3,
            },
        ],
        total: t0.elapsed(),
        filter: (!filter.is_empty()).then(|| filter.join(",")),
    };
    if std::env::var("ROCE_DROPIN_README").as_deref() != Ok("0") {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        update_readme_marked(&readme, STOCK_BEGIN, STOCK_END, &render_section(&report))
            .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
    }
    let mut failed: Vec<String> = Vec::new();
    for p in &report.pairings {
        for c in &p.checks {
            if let Err(e) = &c.result {
                failed.push(format!("{}: {e}", c.name));
            }
        }
        for c in p.cases.iter().filter(|c| !c.passed()) {
            failed.push(format!("{}: {}", c.id, c.failure.as_deref().unwrap_or("")));
        }
    }
    let ran: usize = report.pairings.iter().map(|p| p.cases.len()).sum();
    assert!(ran > 0, "no case matched ROCE_DROPIN_CASES");
    assert!(
        failed.is_empty(),
        "{} of {} failed (logs in {}):\n{}",
        failed.len(),
        ran + report
            .pairings
            .iter()
            .map(|p| p.checks.len())
            .sum::<usize>(),
        out.display(),
        failed.join("\n")
    );
}

/// The harness's own check: with rocectl's tools on both sides (no drop-in involved), the same
/// case runner passes RC pingpong and SEND bandwidth, so a failing stock case is the drop-in's,
/// not the runner's.
#[test]
fn the_runner_passes_rocectl_against_itself() {
    const TEST: &str = "the_runner_passes_rocectl_against_itself";
    if std::env::var("ROCE_DROPIN").as_deref() != Ok("1") {
        eprintln!("{TEST}: skipped; set ROCE_DROPIN=1");
        return;
    }
    if !netns_or_skip(TEST) {
        return;
    }
    let paths = DropinPaths::from_env();
    if !paths.rocectl.is_file() {
        roce_testkit::skip(
            TEST,
            format!(
                "{} is missing (cargo build --release -p rocectl)",
                paths.rocectl.display()
            ),
        );
        return;
    }
    let out = out_dir(&paths).join("self");
    let link = DropinLink::create("dropinself", 1500, &paths, true, &out)
        .unwrap_or_else(|e| panic!("creating the veth pair: {e}"));
    for (i, name) in ["rc_pingpong_chk", "send_bw"].into_iter().enumerate() {
        let variant = *VARIANTS
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no variant {name}"));
        let spec = CaseSpec {
            id: format!("self:{name}"),
            variant,
            server: Impl::Ours,
            client: Impl::Ours,
        };
        let port = 19_450 + u16::try_from(i).unwrap_or(0);
        let r = run_case(
            &paths,
            &link.server,
            &link.client,
            &spec,
            port,
            CaseTimeouts::default(),
            &out,
        );
        assert!(
            r.passed(),
            "{}: {}\n{}",
            r.id,
            r.failure.as_deref().unwrap_or(""),
            r.report()
        );
        assert!(r.figure.is_some(), "{}: no figure", r.id);
    }
}
