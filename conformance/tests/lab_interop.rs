//! Live interop against Linux rdma_rxe (`shared/lab/rxe/`), both directions per tool.
//!
//! Runs only with `ROCE_LAB=1` (it needs root, `/dev/net/tun` and about a minute; without
//! the variable it prints why it is skipped and passes):
//!
//! ```sh
//! sudo ROCE_LAB=1 cargo test --release -p roce-conformance --test lab_interop -- --nocapture
//! ```
//!
//! Each row of [`CASES`] is one tool in one direction. Until the rocectl tools exist the
//! table holds the lab's own userspace peer, `py_rc_pingpong.py`, as the stand-in for "ours";
//! rows for `rocectl rc-pingpong`, `send-bw`, ... replace and extend it (`@ROCECTL@` is
//! `target/release/rocectl`, or `$ROCECTL`).
//!
//! The run writes `target/lab/<case>.{pcap,txt}` and rewrites the generated section of
//! `conformance/README.md` (not with `ROCE_LAB_README=0`). `ROCE_LAB_CASES=a,b` runs only the
//! cases whose names contain one of the words. See `conformance/lab/README.md`.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use roce_conformance::lab::{
    render_results, update_readme, CaseResult, InteropCase, Lab, LabConfig, LabReport, Side,
};

/// The interop table.
const CASES: &[InteropCase] = &[
    InteropCase {
        name: "rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "rc_pingpong_ours_server",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "uc_pingpong_ours_client",
        guest_cmd: "ibv_uc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk",
        host_cmd: "@ROCECTL@ uc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "uc_pingpong_ours_server",
        guest_cmd: "ibv_uc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ uc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 512 --chk",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 512 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 512 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 512 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "srq_pingpong_ours_client",
        guest_cmd: "ibv_srq_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 256 -q 2 --chk",
        host_cmd: "@ROCECTL@ srq-pingpong -d rbr0 -g 1 -n 10 -s 256 -q 2 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "srq_pingpong_ours_server",
        guest_cmd: "ibv_srq_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 256 -q 2 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ srq-pingpong -d rbr0 -g 1 -n 10 -s 256 -q 2 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_bw_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_bw_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_bw_ud_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -c UD -s 512",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -c UD -s 512 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_bw_ud_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -c UD -s 512 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -c UD -s 512",
        server_side: Side::Host,
    },
    InteropCase {
        name: "write_bw_ours_client",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ write-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "write_bw_ours_server",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ write-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "read_bw_ours_client",
        guest_cmd: "ib_read_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ read-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "read_bw_ours_server",
        guest_cmd: "ib_read_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ read-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "atomic_bw_fadd_ours_client",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A FETCH_AND_ADD",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A FETCH_AND_ADD @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "atomic_bw_fadd_ours_server",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A FETCH_AND_ADD @HOST_IP@",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A FETCH_AND_ADD",
        server_side: Side::Host,
    },
    InteropCase {
        name: "atomic_bw_cas_ours_client",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A CMP_AND_SWAP",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A CMP_AND_SWAP @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "atomic_bw_cas_ours_server",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A CMP_AND_SWAP @HOST_IP@",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A CMP_AND_SWAP",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_lat_ours_client",
        guest_cmd: "ib_send_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ send-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_lat_ours_server",
        guest_cmd: "ib_send_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
    InteropCase {
        name: "write_lat_ours_client",
        guest_cmd: "ib_write_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ write-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "write_lat_ours_server",
        guest_cmd: "ib_write_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ write-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
    InteropCase {
        name: "read_lat_ours_client",
        guest_cmd: "ib_read_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ read-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "read_lat_ours_server",
        guest_cmd: "ib_read_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ read-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
];

/// Our GID index for the bridge's IPv6 address, looked up in our own GID table (the host
/// command runs under `sh -c` in the namespace).
macro_rules! host_gid6 {
    () => {
        "$(@ROCECTL@ devinfo -d rbr0 -v | sed -n 's/.*GID\\[ *\\([0-9]*\\)\\]:[[:space:]]*@HOST_IP6@,.*/\\1/p')"
    };
}

/// The second pass: the lab booted with `ROCE_LAB_IPV6=1` and `ROCE_LAB_MTU=9000` (RoCE active
/// MTU 4096). RoCE over IPv6 GIDs (rxe sends IPv6 UDP with checksum 0) and over jumbo frames
/// (path MTU 4096), RC and UD, both directions. The out-of-band TCP exchange stays on IPv4;
/// the GIDs it carries decide the RoCE path.
const CASES_V6_JUMBO: &[InteropCase] = &[
    InteropCase {
        name: "v6_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 3000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 3000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_rc_pingpong_ours_server",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 3000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 512 --chk",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 512 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 512 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 512 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "jumbo_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -m 4096 -n 10 -s 20000 --chk",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -m 4096 -n 10 -s 20000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "jumbo_rc_pingpong_ours_server",
        guest_cmd:
            "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -m 4096 -n 10 -s 20000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -m 4096 -n 10 -s 20000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "jumbo_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 4000 --chk",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 4000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "jumbo_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 4000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 4000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -m 4096 -n 10 -s 20000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -m 4096 -n 10 -s 20000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_rc_pingpong_ours_server",
        guest_cmd:
            "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -m 4096 -n 10 -s 20000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -m 4096 -n 10 -s 20000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 4000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 4000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 4000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 4000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_write_bw_ours_client",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid6) -m 4096 -F -n 20 -s 65536",
        host_cmd: concat!(
            "@ROCECTL@ write-bw -d rbr0 -x ",
            host_gid6!(),
            " -m 4096 -F -n 20 -s 65536 @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_write_bw_ours_server",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid6) -m 4096 -F -n 20 -s 65536 @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ write-bw -d rbr0 -x ",
            host_gid6!(),
            " -m 4096 -F -n 20 -s 65536"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_send_bw_ud_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid6) -F -n 20 -c UD -s 4000",
        host_cmd: concat!(
            "@ROCECTL@ send-bw -d rbr0 -x ",
            host_gid6!(),
            " -F -n 20 -c UD -s 4000 @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_send_bw_ud_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid6) -F -n 20 -c UD -s 4000 @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ send-bw -d rbr0 -x ",
            host_gid6!(),
            " -F -n 20 -c UD -s 4000"
        ),
        server_side: Side::Host,
    },
];

/// What one boot of the lab ran.
struct Pass {
    results: Vec<CaseResult>,
    environment: Vec<(String, String)>,
    timings: Vec<(String, Duration)>,
}

/// Boots the lab with `extra_env`, runs the selected `cases`, tears it down.
fn run_pass(
    title: &str,
    extra_env: &[(&str, &str)],
    cases: &[InteropCase],
    filter: &[String],
) -> Pass {
    let selected: Vec<InteropCase> = cases
        .iter()
        .filter(|c| filter.is_empty() || filter.iter().any(|f| c.name.contains(f.as_str())))
        .copied()
        .collect();
    if selected.is_empty() {
        return Pass {
            results: Vec::new(),
            environment: Vec::new(),
            timings: Vec::new(),
        };
    }
    let mut cfg = LabConfig::from_env();
    cfg.extra_env.extend(
        extra_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let lab = Lab::up(cfg).unwrap_or_else(|e| panic!("booting the lab ({title}): {e}"));
    eprintln!(
        "lab ({title}): guest {} up in {:.1}s, GID index {}",
        lab.info().guest_ip,
        lab.up_time().as_secs_f64(),
        lab.info().gid_index
    );
    let environment = lab
        .describe()
        .into_iter()
        .map(|(k, v)| (format!("{title}: {k}"), v))
        .collect();
    let up_time = lab.up_time();
    let cases_t0 = Instant::now();
    let results = lab.run_cases(&selected);
    for r in &results {
        eprintln!(
            "lab: {} {} in {:.1}s ({})",
            if r.passed() { "PASS" } else { "FAIL" },
            r.name,
            r.elapsed.as_secs_f64(),
            r.log.display()
        );
    }
    let cases_time = cases_t0.elapsed();
    let down = lab
        .down()
        .unwrap_or_else(|e| panic!("tearing the lab down ({title}): {e}"));
    Pass {
        results,
        environment,
        timings: vec![
            (format!("{title}: boot (host-peer.sh up)"), up_time),
            (format!("{title}: {} cases", selected.len()), cases_time),
            (format!("{title}: teardown"), down),
        ],
    }
}

#[test]
fn lab_interop() {
    if std::env::var("ROCE_LAB").as_deref() != Ok("1") {
        eprintln!(
            "lab_interop: skipped; set ROCE_LAB=1 (needs root and /dev/net/tun) to run the \
             live rdma_rxe suite"
        );
        return;
    }
    let started = SystemTime::now();
    let t0 = Instant::now();
    let cfg = LabConfig::from_env();
    if let Err(e) = Lab::prerequisites(&cfg) {
        panic!("{e}");
    }
    let prepare = Lab::prepare(&cfg).unwrap_or_else(|e| panic!("preparing the lab: {e}"));
    eprintln!("lab: prepared in {:.1}s", prepare.as_secs_f64());
    let filter: Vec<String> = std::env::var("ROCE_LAB_CASES")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let passes = [
        run_pass("IPv4, MTU 1500", &[], CASES, &filter),
        run_pass(
            "IPv6 + MTU 9000",
            &[("ROCE_LAB_IPV6", "1"), ("ROCE_LAB_MTU", "9000")],
            CASES_V6_JUMBO,
            &filter,
        ),
    ];
    let mut results = Vec::new();
    let mut environment = Vec::new();
    let mut timings = vec![("prepare (host-deps.sh + build.sh)".to_owned(), prepare)];
    for pass in passes {
        results.extend(pass.results);
        environment.extend(pass.environment);
        timings.extend(pass.timings);
    }
    timings.push(("total".to_owned(), t0.elapsed()));
    let report = LabReport {
        started,
        environment,
        timings,
        results: &results,
        command: "sudo ROCE_LAB=1 cargo test --release -p roce-conformance --test lab_interop"
            .to_owned(),
    };
    if std::env::var("ROCE_LAB_README").as_deref() != Ok("0") {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        update_readme(&readme, &render_results(&report))
            .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            format!(
                "{}: {} (see {})",
                r.name,
                r.failure.as_deref().unwrap_or(""),
                r.log.display()
            )
        })
        .collect();
    assert!(!results.is_empty(), "no case matched ROCE_LAB_CASES");
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}
