//! `rocectl coll-perf` under `rocectl coll launch` (issue 15): every rank in its own
//! namespace on a veth bridge, the roce-collectives communicator between them.
//!
//! - a small sweep at 2, 3 and 4 ranks, every value checked (`-c 1`): 0 wrong, nccl-tests'
//!   columns, in and out of place, the footer;
//! - bad flags: one line and exit status 2, before any rank is looked for;
//! - the launcher: torchrun's variables, the first non-zero status, the grace period, SIGINT,
//!   and no namespace left behind;
//! - the failure drills: `kill -9` of a rank, all of one rank's frames dropped, `abort()` on
//!   one rank. Every other rank must fail by itself within its bound (1 s after a death or an
//!   abort, plus scheduling slack on this 2-core box; the operation timeout after a
//!   partition), each with one line naming the rank, and no process may hang or panic.
//!
//! Needs root and network namespaces (testkit's skip policy: skipped with a reason locally,
//! a failure in CI). Every run is bounded by the launcher's `--timeout` and by
//! [`run_bounded`].

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use roce_testkit::netns::netns_or_skip;

const ROCECTL: &str = env!("CARGO_BIN_EXE_rocectl");

/// What a run left.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs rocectl with `args`, killed after `limit` (a failure of the test).
fn run_bounded(args: &[&str], limit: Duration) -> Run {
    let start = Instant::now();
    let mut child = Command::new(ROCECTL)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocectl");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "rocectl {args:?} still running after {limit:?}\n--- stdout\n{}\n--- stderr\n{}",
                o.join().unwrap(),
                e.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
        took: start.elapsed(),
    }
}

/// `rocectl coll launch -n N --link veth [extra…] -- rocectl coll-perf perf…`.
fn launch_perf(n: usize, extra: &[&str], perf: &str, limit: Duration) -> Run {
    let n = n.to_string();
    let mut args = vec![
        "coll",
        "launch",
        "-n",
        &n,
        "--link",
        "veth",
        "--timeout",
        "100",
    ];
    args.extend_from_slice(extra);
    args.extend(["--", ROCECTL, "coll-perf"]);
    args.extend(perf.split_whitespace());
    run_bounded(&args, limit)
}

/// The table lines rank 0 printed, split in columns.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[rank0] "))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

fn no_namespaces_left_by(pid: Option<u32>) {
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| match pid {
                    Some(p) => n.starts_with(&format!("rcl-{p}-")),
                    None => false,
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

fn context(r: &Run) -> String {
    format!(
        "exit {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
        r.code, r.took, r.stdout, r.stderr
    )
}

#[test]
fn all_reduce_sweeps_at_2_3_and_4_ranks_have_0_wrong_and_nccl_tests_columns() {
    if !netns_or_skip("coll all_reduce sweep") {
        return;
    }
    for n in [2, 3, 4] {
        let r = launch_perf(
            n,
            &[],
            "all_reduce -b 8 -e 256K -f 8 -n 3 -w 1 -c 1 -T 20",
            Duration::from_secs(120),
        );
        assert_eq!(r.code, Some(0), "n={n}: {}", context(&r));
        let rows = rows(&r.stdout);
        // 8 64 512 4K 32K 256K
        assert_eq!(rows.len(), 6, "n={n}: {}", context(&r));
        for row in &rows {
            assert_eq!(row.len(), 13, "{row:?}");
            assert_eq!(&row[2..5], ["float", "sum", "-1"], "{row:?}");
            assert_eq!(
                (row[8].as_str(), row[12].as_str()),
                ("0", "0"),
                "n={n}: {row:?}"
            );
            let t: f64 = row[5].parse().unwrap();
            assert!(t > 0.0, "{row:?}");
        }
        // busbw = algbw × 2(n−1)/n at the largest size.
        let last = rows.last().unwrap();
        let (alg, bus): (f64, f64) = (last[6].parse().unwrap(), last[7].parse().unwrap());
        let factor = 2.0 * (n as f64 - 1.0) / n as f64;
        assert!(
            (bus - alg * factor).abs() <= 0.011 + alg * factor * 0.01,
            "{last:?}"
        );
        let out = &r.stdout;
        for want in [
            "[rank0] # Collective test starting: all_reduce_perf",
            "out-of-place                       in-place",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
            "[rank0] # Out of bounds values : 0 OK",
            "[rank0] # Avg bus bandwidth    : ",
        ] {
            assert!(out.contains(want), "n={n}: no {want:?}\n{}", context(&r));
        }
        assert_eq!(out.matches("#  Rank ").count(), n, "{}", context(&r));
        // Only rank 0 prints the table.
        assert!(!out.contains("[rank1] #"), "{}", context(&r));
    }
}

#[test]
fn every_collective_at_3_ranks_has_0_wrong() {
    if !netns_or_skip("coll every collective") {
        return;
    }
    for (coll, extra) in [
        ("reduce_scatter", "-d int32 -o max"),
        ("all_gather", "-d half"),
        ("broadcast", "-r 2 -d uint8"),
        ("reduce", "-r -1 -o prod -d double"),
        ("sendrecv", "-d bfloat16"),
        ("all_reduce", "-o avg -d int64"),
    ] {
        let r = launch_perf(
            3,
            &[],
            &format!("{coll} -b 1K -e 64K -f 8 -n 2 -c 1 -T 20 {extra}"),
            Duration::from_secs(120),
        );
        assert_eq!(r.code, Some(0), "{coll}: {}", context(&r));
        let rows = rows(&r.stdout);
        assert!(!rows.is_empty(), "{coll}: {}", context(&r));
        for row in &rows {
            assert_eq!(row[8], "0", "{coll}: {row:?}");
            let in_place = if coll == "sendrecv" { "N/A" } else { "0" };
            assert_eq!(row[12], in_place, "{coll}: {row:?}");
        }
    }
}

#[test]
fn bad_flags_get_one_line_and_status_2() {
    for (args, want) in [
        (&["coll-perf", "-d", "quad"][..], "'quad'"),
        (&["coll-perf", "--bogus"][..], "--bogus"),
        (&["coll-perf", "-b", "2M", "-e", "1M"][..], "minbytes"),
        (&["coll-perf", "-z", "7"][..], "7"),
        (&["coll-perf", "-b", "12Q"][..], "12Q"),
        (&["coll-perf", "gather"][..], "gather"),
        (&["coll-perf", "-t", "2"][..], "-t"),
        (&["coll", "launch", "-n", "0", "--", "true"][..], "0"),
        (
            &[
                "coll", "launch", "-n", "2", "--drill", "stab:1@2", "--", "true",
            ][..],
            "drill",
        ),
    ] {
        let r = run_bounded(args, Duration::from_secs(20));
        assert_eq!(r.code, Some(2), "{args:?}: {}", context(&r));
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", context(&r));
        assert!(
            r.stderr.starts_with("rocectl coll") && r.stderr.contains(want),
            "{args:?}: {}",
            context(&r)
        );
    }
}

#[test]
fn launch_sets_the_environment_returns_the_first_failure_and_cleans_up() {
    if !netns_or_skip("coll launch") {
        return;
    }
    let r = run_bounded(
        &[
            "coll", "launch", "-n", "3", "--link", "veth", "--", "sh", "-c",
            "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $ROCECTL_COLL_ADDR; cat /sys/class/net/eth0/mtu",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", context(&r));
    for i in 0..3 {
        let want = format!(
            "[rank{i}] env {i} 3 {i} 3 198.18.0.1 29500 198.18.0.{}",
            i + 1
        );
        assert!(r.stdout.contains(&want), "{want}\n{}", context(&r));
        assert!(
            r.stdout.contains(&format!("[rank{i}] 9000")),
            "{}",
            context(&r)
        );
    }
    // Rank 1 fails with 7; rank 0 would sleep 60 s: it is killed after the 1 s grace.
    let r = run_bounded(
        &[
            "coll",
            "launch",
            "-n",
            "2",
            "--link",
            "lo",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            "echo $ROCECTL_COLL_ADDR; if [ $RANK = 1 ]; then exit 7; fi; sleep 60",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(7), "{}", context(&r));
    assert!(r.took < Duration::from_secs(10), "{}", context(&r));
    assert!(r.stdout.contains("[rank1] 127.0.0.2"), "{}", context(&r));
    assert!(
        r.stderr
            .contains("rank 0: exit status 143 (killed by the launcher)"),
        "{}",
        context(&r)
    );
    // SIGINT: the ranks are killed, the namespaces deleted, status 130.
    let mut child = Command::new(ROCECTL)
        .args([
            "coll", "launch", "-n", "2", "--link", "veth", "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20)
        && !std::path::Path::new(&format!("/run/netns/rcl-{pid}-r1")).exists()
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "launcher ignored SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    no_namespaces_left_by(Some(pid));
}

/// One line per rank from the launcher: (status, killed by the launcher, seconds after the
/// drill).
fn rank_exits(stderr: &str, n: usize) -> Vec<(i32, bool, f64)> {
    (0..n)
        .map(|i| {
            let p = format!("rocectl coll launch: rank {i}: exit status ");
            let line = stderr
                .lines()
                .find(|l| l.starts_with(&p))
                .unwrap_or_else(|| panic!("no exit line for rank {i}\n{stderr}"));
            let rest = &line[p.len()..];
            let code: i32 = rest.split_whitespace().next().unwrap().parse().unwrap();
            let after: f64 = line
                .split(", ")
                .nth(1)
                .and_then(|s| s.split(" s after").next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no drill time in {line:?}"));
            (code, line.contains("killed by the launcher"), after)
        })
        .collect()
}

/// Runs a long all_reduce sweep with `drill` at 4 ranks, and checks that every rank but
/// `spared` failed by itself within `bound` of the drill, with one error line, no panic.
fn drill(drill: &str, perf_extra: &str, bound: f64, spared: Option<usize>) {
    let n = 4;
    // Sizes 4K to 1M, forever (-N 0): only a failure ends it. The grace period is long, so a
    // rank still running at the bound is seen as such, not killed early.
    let r = launch_perf(
        n,
        &["--grace", "30", "--drill", drill],
        &format!("all_reduce -b 4K -e 1M -f 16 -n 5 -c 1 -N 0 {perf_extra}"),
        Duration::from_secs(90),
    );
    assert_ne!(r.code, Some(0), "{drill}: {}", context(&r));
    assert!(!r.stderr.contains("panicked"), "{drill}: {}", context(&r));
    assert!(
        r.stderr.contains(&format!("drill {drill} at")),
        "{drill}: {}",
        context(&r)
    );
    let exits = rank_exits(&r.stderr, n);
    for (i, (code, killed, after)) in exits.iter().enumerate() {
        if spared == Some(i) {
            continue;
        }
        assert!(
            !killed,
            "{drill}: rank {i} had to be killed\n{}",
            context(&r)
        );
        assert_ne!(*code, 0, "{drill}: rank {i} exited 0\n{}", context(&r));
        assert!(
            *after <= bound,
            "{drill}: rank {i} failed {after} s after the drill (bound {bound} s)\n{}",
            context(&r)
        );
        let errors: Vec<&str> = r
            .stderr
            .lines()
            .filter(|l| l.starts_with(&format!("[rank{i}] ")))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{drill}: rank {i}: one error line\n{}",
            context(&r)
        );
        assert!(
            errors[0].starts_with(&format!("[rank{i}] rocectl coll-perf: error: rank {i}")),
            "{drill}: rank {i}: {}\n{}",
            errors[0],
            context(&r)
        );
    }
}

#[test]
fn drill_kill_9_of_a_rank_fails_every_other_rank_within_a_second() {
    if !netns_or_skip("coll drill kill") {
        return;
    }
    // 1 s of detection plus slack for 4 ranks on 2 cores.
    drill("kill:1@2", "-T 30", 2.5, Some(1));
}

#[test]
fn drill_abort_on_one_rank_fails_every_rank_within_a_second() {
    if !netns_or_skip("coll drill abort") {
        return;
    }
    drill("abort:2@2", "-T 30", 2.5, None);
}

#[test]
fn drill_partition_of_a_rank_fails_every_rank_within_the_timeout() {
    if !netns_or_skip("coll drill partition") {
        return;
    }
    // Every frame to and from rank 3 dropped: the others see it only through timeouts (or
    // the monitor), the isolated rank sees everyone gone. Timeout 4 s, plus slack.
    drill("partition:3@2", "-T 4", 4.0 + 2.5, None);
}

#[test]
fn coll_perf_finds_its_rank_from_open_mpi_and_slurm_variables_too() {
    if !netns_or_skip("coll bootstrap variables") {
        return;
    }
    // The launcher sets torchrun's variables; each rank re-exports its rank as Open MPI's or
    // Slurm's and drops torchrun's (MASTER_ADDR/MASTER_PORT stay: the store's address).
    for (rank_var, size_var) in [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ] {
        let script = format!(
            "export {rank_var}=$RANK {size_var}=$WORLD_SIZE; unset RANK WORLD_SIZE LOCAL_RANK \
             LOCAL_WORLD_SIZE; exec {ROCECTL} coll-perf -b 8 -e 4K -f 8 -n 2 -T 20"
        );
        let r = run_bounded(
            &[
                "coll",
                "launch",
                "-n",
                "3",
                "--link",
                "veth",
                "--timeout",
                "60",
                "--",
                "sh",
                "-c",
                &script,
            ],
            Duration::from_secs(90),
        );
        assert_eq!(r.code, Some(0), "{rank_var}: {}", context(&r));
        assert_eq!(rows(&r.stdout).len(), 4, "{rank_var}: {}", context(&r));
        assert_eq!(
            r.stdout.matches("#  Rank ").count(),
            3,
            "{rank_var}: {}",
            context(&r)
        );
    }
}

#[test]
fn launch_refuses_to_run_without_root_in_one_line() {
    if !roce_testkit::require_root("coll launch without root", "drops root with setpriv") {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            ROCECTL,
        ])
        .args(["coll", "launch", "-n", "2", "--", "true"])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "rocectl: error: coll launch needs root: it creates network namespaces (run it with sudo)\n"
    );
}

#[test]
fn coll_perf_is_exact_under_loss_from_the_launcher() {
    if !netns_or_skip("coll loss") {
        return;
    }
    // The rule is there: 2.5 % = 250 in 10000 of what each rank sends on eth0.
    let r = run_bounded(
        &[
            "coll", "launch", "-n", "2", "--link", "veth", "--loss", "2.5", "--", "nft", "list",
            "ruleset",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", context(&r));
    assert_eq!(
        r.stdout
            .matches("numgen random mod 10000 < 250 drop")
            .count(),
        2,
        "{}",
        context(&r)
    );
    // No ARP to lose: every rank has a permanent neighbour entry for each other one (a lost
    // ARP is retried after 1 s, past a collective QP's ~0.5 s retry budget; CI saw ranks 1
    // and 2 fail their first exchange with RETRY_EXC_ERR at 3 % loss before this).
    let r = run_bounded(
        &[
            "coll", "launch", "-n", "3", "--link", "veth", "--loss", "3", "--", "ip", "neigh",
            "show", "dev", "eth0",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", context(&r));
    for rank in 0..3 {
        let permanent = r
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("[rank{rank}]")) && l.contains("PERMANENT"))
            .count();
        assert_eq!(permanent, 2, "rank {rank}: {}", context(&r));
    }
    // And RC retransmission makes every value right through it.
    let r = launch_perf(
        3,
        &["--loss", "3"],
        "all_reduce -b 4K -e 256K -f 8 -n 3 -c 1 -T 30",
        Duration::from_secs(120),
    );
    assert_eq!(r.code, Some(0), "{}", context(&r));
    let rows = rows(&r.stdout);
    assert_eq!(rows.len(), 3, "{}", context(&r));
    assert!(
        rows.iter().all(|row| row[8] == "0" && row[12] == "0"),
        "{}",
        context(&r)
    );
}
