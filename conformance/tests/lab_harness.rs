//! The lab harness's own machinery, without the lab (no root needed): bounded children whose
//! whole process group dies on timeout or drop, and the generated README section.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use roce_conformance::lab::{
    render_results, run_bounded, run_checked, splice_section, CaseResult, LabError, LabReport,
    Output, PcapVerdict, Proc, Side, README_BEGIN, README_END,
};

fn log_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lab-harness")
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", script]);
    c
}

/// Whether any process of the group `pgid` is alive (`kill -0 -PGID`).
fn group_alive(pgid: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_child_that_overruns_is_killed_with_its_whole_group() {
    let proc = Proc::spawn(
        sh("sleep 30 & sleep 30 & echo started; wait"),
        "sleepers",
        &log_dir(),
    )
    .unwrap();
    let pgid = proc.pid();
    sleep_until(|| group_alive(pgid));
    let t0 = Instant::now();
    let out = proc.wait(Duration::from_millis(300));
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(out.timed_out);
    assert!(!out.success());
    assert_eq!(out.stdout, "started\n");
    assert!(
        out.status_text().ends_with("(timed out)"),
        "{}",
        out.status_text()
    );
    sleep_until(|| !group_alive(pgid));
    assert!(
        !group_alive(pgid),
        "a background sleep of the group survived"
    );
}

#[test]
fn dropping_a_handle_kills_the_group() {
    let proc = Proc::spawn(sh("sleep 30 & sleep 30; wait"), "dropped", &log_dir()).unwrap();
    let pgid = proc.pid();
    sleep_until(|| group_alive(pgid));
    drop(proc);
    sleep_until(|| !group_alive(pgid));
    assert!(!group_alive(pgid));
}

#[test]
fn exit_codes_and_errors() {
    let out = run_bounded(
        sh("echo out; echo err >&2; exit 3"),
        "exit3",
        Duration::from_secs(10),
        &log_dir(),
    )
    .unwrap();
    assert_eq!(out.code, Some(3));
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("out\n", "err\n")
    );
    assert_eq!(out.status_text(), "exit 3");

    let err = run_checked(
        sh("echo nope; exit 1"),
        "failing step",
        Duration::from_secs(10),
        &log_dir(),
    )
    .unwrap_err();
    assert!(matches!(err, LabError::Failed { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "failing step failed (exit 1); output:\nnope"
    );

    let err = run_checked(
        sh("sleep 5"),
        "slow step",
        Duration::from_millis(100),
        &log_dir(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("slow step did not finish within 100ms"),
        "{err}"
    );

    let ok = run_checked(sh("true"), "ok", Duration::from_secs(10), &log_dir()).unwrap();
    assert!(ok.success());
}

#[test]
fn results_render_into_the_readme_section() {
    let ok = Output {
        code: Some(0),
        ..Output::default()
    };
    let results = [
        CaseResult {
            name: "rc_pingpong_guest_server".into(),
            server_side: Side::Guest,
            guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -s 3000 -n 10".into(),
            host_cmd: "python3 /lab/py_rc_pingpong.py --server 10.77.0.1".into(),
            guest: Some(ok.clone()),
            host: Some(ok.clone()),
            capture: None,
            check: Some(PcapVerdict {
                ok: true,
                roce_packets: 80,
                summary: "80 packets, 80 RoCEv2, 80 ICRC ok, 0 bad".into(),
                problems: String::new(),
            }),
            elapsed: Duration::from_millis(3_200),
            failure: None,
            log: PathBuf::from("x.txt"),
            steps: vec![("check_pcap.sh".into(), Duration::from_millis(1_500))],
        },
        CaseResult {
            name: "broken".into(),
            server_side: Side::Host,
            guest_cmd: "a | b".into(),
            host_cmd: "c".into(),
            guest: None,
            host: None,
            capture: None,
            check: None,
            elapsed: Duration::from_secs(1),
            failure: Some("guest client: exit 1".into()),
            log: PathBuf::from("y.txt"),
            steps: Vec::new(),
        },
    ];
    let report = LabReport {
        started: SystemTime::UNIX_EPOCH,
        environment: vec![("active MTU".into(), "1024 (3)".into())],
        timings: vec![("up".into(), Duration::from_millis(17_000))],
        results: &results,
        command: "ROCE_LAB=1 cargo test".into(),
    };
    let md = render_results(&report);
    assert!(md.starts_with(README_BEGIN), "{md}");
    assert!(md.trim_end().ends_with(README_END), "{md}");
    assert!(md.contains("**1 of 2 cases passed**"), "{md}");
    assert!(md.contains(
        "| rc_pingpong_guest_server | guest (stock) | host (ours) | PASS | 3.2 s | 80, all OK |"
    ), "{md}");
    assert!(
        md.contains(
            "| broken | host (ours) | guest (stock) | FAIL: guest client: exit 1 | 1.0 s | - |"
        ),
        "{md}"
    );
    assert!(md.contains("| active MTU | 1024 (3) |"), "{md}");
    assert!(md.contains("Timings: up 17.0 s."), "{md}");
    assert!(md.contains("  - guest: `a | b`"), "{md}");
    let readme = splice_section("# roce-conformance\n\nText.\n", &md);
    assert_eq!(splice_section(&readme, &md), readme, "idempotent");
    let err = results[1].report();
    assert!(
        err.contains("# result: guest client: exit 1 in 1.0s"),
        "{err}"
    );
}

fn sleep_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}
