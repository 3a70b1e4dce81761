//! UCX 1.13 (Debian's `ucx-utils`) and Open MPI 4.1 (`pml ucx`) on rocectl's drop-in
//! `libibverbs.so.1` (issue 13, "Next"), over a veth pair between two network namespaces:
//!
//! - `ucx_perftest` server in namespace A, client in B, through
//!   `rocectl exec --dev-nodes` (UCX keeps an IB device only when
//!   `/dev/infiniband/<dev_name>` is a character device): UCT tests on `rc_verbs` and
//!   `ud_verbs` (`-d rocectl_ucx:1 -x TL`) and UCP tests with `UCX_TLS=ud_verbs,self` and
//!   `UCX_TLS=rc_v,self` (`rc_verbs` with `ud_verbs` for wire-up only: UCP cannot connect
//!   `rc_verbs` endpoints without an auxiliary transport), `tag_lat` also in sleep mode
//!   (`-E sleep`: completion channels and `ibv_req_notify_cq` as UCX uses them). A case passes
//!   when both sides exit 0 and the client prints its `Final:` row.
//! - `conformance/ucx/mpi_check.c` built with `mpicc`, run by `mpirun --mca pml ucx` with one
//!   rank per namespace (an rsh agent that does `ip netns exec` + `rocectl exec --dev-nodes`):
//!   allreduce of 1 Mi doubles, broadcast, ping-pong 1 B … 4 MiB, every payload checked.
//!
//! Both sides name their device `rocectl_ucx` (`ROCECTL_VERBS_DEVICES`): `ucx_perftest`'s
//! server opens the device the client names. Runs only with `ROCE_DROPIN=1` (root, the drop-in
//! built by `verbs/build-so.sh`, `rocectl` built, `ucx-utils`; `openmpi-bin` and
//! `libopenmpi-dev` for the MPI case). A missing prerequisite is SKIPPED locally and fails
//! under `CI`. `ROCE_UCX_CASES=rc_,tag` runs only the cases whose id contains one of the words.
//! Logs: `target/ucx/`.
//!
//! ```sh
//! sudo ROCE_DROPIN=1 cargo test --release -p roce-conformance --test ucx -- --nocapture
//! ```

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use roce_conformance::stock::{which, DropinPaths};
use roce_testkit::netns::{netns_or_skip, NetnsEnd, NetnsPair};
use roce_testkit::proc::{run_bounded, wait_listening, Output, Proc};

const TEST: &str = "ucx";
/// The device name both sides use.
const DEV: &str = "rocectl_ucx";
/// The first `ucx_perftest` TCP port; each case takes the next.
const FIRST_PORT: u16 = 13_400;
/// One `ucx_perftest` side's time limit.
const CASE_LIMIT: Duration = Duration::from_secs(90);

/// One `ucx_perftest` pair.
struct Case {
    /// Short id (`uct-rc_verbs-am_lat`).
    id: &'static str,
    /// `UCX_TLS` (UCP) or empty (UCT: `-x` names the transport).
    tls: &'static str,
    /// `ucx_perftest` arguments after the server address.
    args: &'static str,
}

const CASES: &[Case] = &[
    Case {
        id: "uct-rc_verbs-am_lat",
        tls: "",
        args: "-t am_lat -x rc_verbs",
    },
    Case {
        id: "uct-rc_verbs-am_bw",
        tls: "",
        args: "-t am_bw -x rc_verbs -s 4000 -D bcopy",
    },
    Case {
        id: "uct-rc_verbs-put_lat",
        tls: "",
        args: "-t put_lat -x rc_verbs",
    },
    Case {
        id: "uct-rc_verbs-put_bw-zcopy",
        tls: "",
        args: "-t put_bw -x rc_verbs -s 65536 -D zcopy",
    },
    Case {
        id: "uct-rc_verbs-get-zcopy",
        tls: "",
        args: "-t get -x rc_verbs -s 65536 -D zcopy",
    },
    Case {
        id: "uct-rc_verbs-add_lat",
        tls: "",
        args: "-t add_lat -x rc_verbs",
    },
    Case {
        id: "uct-rc_verbs-fadd",
        tls: "",
        args: "-t fadd -x rc_verbs",
    },
    Case {
        id: "uct-rc_verbs-cswap",
        tls: "",
        args: "-t cswap -x rc_verbs",
    },
    Case {
        id: "uct-ud_verbs-am_lat",
        tls: "",
        args: "-t am_lat -x ud_verbs",
    },
    Case {
        id: "uct-ud_verbs-am_bw",
        tls: "",
        args: "-t am_bw -x ud_verbs -s 1000 -D bcopy",
    },
    Case {
        id: "ucp-ud-tag_lat",
        tls: "ud_verbs,self",
        args: "-t tag_lat",
    },
    Case {
        id: "ucp-ud-tag_lat-sleep",
        tls: "ud_verbs,self",
        args: "-t tag_lat -E sleep",
    },
    Case {
        id: "ucp-ud-tag_bw-1M",
        tls: "ud_verbs,self",
        args: "-t tag_bw -s 1048576",
    },
    Case {
        id: "ucp-ud-put_bw",
        tls: "ud_verbs,self",
        args: "-t ucp_put_bw -s 65536",
    },
    Case {
        id: "ucp-ud-get",
        tls: "ud_verbs,self",
        args: "-t ucp_get -s 65536",
    },
    Case {
        id: "ucp-ud-stream_bw",
        tls: "ud_verbs,self",
        args: "-t stream_bw",
    },
    Case {
        id: "ucp-rc-tag_lat-sleep",
        tls: "rc_v,self",
        args: "-t tag_lat -E sleep",
    },
    Case {
        id: "ucp-rc-tag_lat",
        tls: "rc_v,self",
        args: "-t tag_lat",
    },
    Case {
        id: "ucp-rc-tag_bw-1M",
        tls: "rc_v,self",
        args: "-t tag_bw -s 1048576",
    },
    Case {
        id: "ucp-rc-put_bw",
        tls: "rc_v,self",
        args: "-t ucp_put_bw -s 65536",
    },
    Case {
        id: "ucp-rc-get",
        tls: "rc_v,self",
        args: "-t ucp_get -s 65536",
    },
    Case {
        id: "ucp-rc-fadd",
        tls: "rc_v,self",
        args: "-t ucp_fadd",
    },
    Case {
        id: "ucp-rc-am_bw",
        tls: "rc_v,self",
        args: "-t ucp_am_bw -s 100000",
    },
];

/// Iterations: few, the machine may be shared; big messages fewer.
fn iterations(args: &str) -> &'static str {
    if args.contains("1048576") {
        "-n 50 -w 5"
    } else {
        "-n 1000 -w 100"
    }
}

/// `env ROCECTL_VERBS_DEVICES=... [UCX_TLS=...] UCX_NET_DEVICES=... rocectl exec
/// --dev-nodes -- ...` in `end`'s namespace.
fn in_ns(paths: &DropinPaths, end: &NetnsEnd, env: &[(&str, String)], argv: &[String]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", end.ns_name(), "env"])
        .arg(format!("ROCECTL_VERBS_DEVICES={DEV}={}", end.ifname()))
        .arg(format!("UCX_NET_DEVICES={DEV}:1"));
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(&paths.rocectl)
        .args(["exec", "--lib-dir"])
        .arg(&paths.verbs_lib_dir)
        .args(["--dev-nodes", "--"])
        .args(argv);
    cmd
}

/// Runs one pair; `Ok(the client's Final row)` or why not.
fn run_pair(
    paths: &DropinPaths,
    pair: &NetnsPair,
    case: &Case,
    port: u16,
    logs: &Path,
) -> Result<String, String> {
    let mut args: Vec<String> = case.args.split_whitespace().map(str::to_owned).collect();
    args.extend(iterations(case.args).split_whitespace().map(str::to_owned));
    args.extend(["-p".to_owned(), port.to_string()]);
    if case.tls.is_empty() {
        args.extend(["-d".to_owned(), format!("{DEV}:1")]);
    }
    let env: Vec<(&str, String)> = if case.tls.is_empty() {
        Vec::new()
    } else {
        vec![("UCX_TLS", case.tls.to_owned())]
    };
    // Each side on its own CPU when there are two: two busy-polling processes on one CPU
    // wait a scheduler slice per message (8 ms instead of 22 us per am_lat round trip).
    let two_cpus = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let mut server_argv = vec!["ucx_perftest".to_owned()];
    server_argv.extend(args.iter().cloned());
    if two_cpus {
        server_argv.extend(["-c".to_owned(), "0".to_owned()]);
    }
    let server = Proc::spawn(
        in_ns(paths, pair.a(), &env, &server_argv),
        &format!("{} server", case.id),
        logs,
    )
    .map_err(|e| e.to_string())?;
    if !wait_listening(server.pid(), port, Duration::from_secs(30)) {
        let why = server.stderr_so_far();
        let out = server.wait(Duration::from_secs(1));
        return Err(format!(
            "the server never listened on {port}: {} {}",
            out.status_text(),
            last_line(&why)
        ));
    }
    let mut client_argv = vec!["ucx_perftest".to_owned(), pair.a().ipv4().to_string()];
    client_argv.extend(args);
    if two_cpus {
        client_argv.extend(["-c".to_owned(), "1".to_owned()]);
    }
    let client = run_bounded(
        in_ns(paths, pair.b(), &env, &client_argv),
        &format!("{} client", case.id),
        CASE_LIMIT,
        logs,
    )
    .map_err(|e| e.to_string())?;
    let server = server.wait(CASE_LIMIT);
    judge(&client, &server)
}

fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// Both sides exited 0 and the client printed `Final:`.
fn judge(client: &Output, server: &Output) -> Result<String, String> {
    let errors = |o: &Output| {
        o.combined()
            .lines()
            .find(|l| l.contains("ERROR") || l.contains("Fatal"))
            .map_or_else(|| last_line(&o.combined()), |l| l.trim().to_owned())
    };
    if !client.success() {
        return Err(format!(
            "client {}: {}",
            client.status_text(),
            errors(client)
        ));
    }
    if !server.success() {
        return Err(format!(
            "server {}: {}",
            server.status_text(),
            errors(server)
        ));
    }
    client
        .stdout
        .lines()
        .find(|l| l.starts_with("Final:"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .ok_or_else(|| format!("no Final: row: {}", last_line(&client.stdout)))
}

/// Builds `mpi_check` and runs it with one rank per namespace; `Ok(rank 0's output)`.
fn run_mpi(paths: &DropinPaths, pair: &NetnsPair, tls: &str, out: &Path) -> Result<String, String> {
    let src = paths.workspace.join("conformance/ucx/mpi_check.c");
    let exe = out.join("mpi_check");
    let logs = out.join("logs");
    let mut cc = Command::new("mpicc");
    cc.args(["-O2", "-o"]).arg(&exe).arg(&src);
    let built =
        run_bounded(cc, "mpicc", Duration::from_secs(120), &logs).map_err(|e| e.to_string())?;
    if !built.success() {
        return Err(format!(
            "mpicc {}: {}",
            built.status_text(),
            last_line(&built.stderr)
        ));
    }
    // The rsh agent: `agent HOST CMD...` runs CMD in namespace HOST on the drop-in, with the
    // host's own Open MPI session directory. The two "hosts" share one hostname and one /tmp,
    // so by default both orteds (and mpirun) use the same `/tmp/ompi.<host>.<uid>/jf.<n>/`, and
    // each writes its hwloc topology into the same `hwloc.sm` (rtc/hwloc, mapped at an address
    // each picks for itself): one orted then followed the other's pointers and crashed in
    // hwloc_shmem_topology_write (exit 139, 4 runs in 21; the faulting address was in the other
    // orted's stack, per `--mca rtc_base_verbose 100`). Separate hosts never share that file.
    let session_dirs = std::env::temp_dir().join(format!("rocectl-ompi-{}", std::process::id()));
    let agent = out.join("agent.sh");
    // Each namespace's rank on its own CPU when there are two (`--bind-to none` below: Open
    // MPI would bind both, each its host's only rank, to core 0).
    let two_cpus = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let mut script = String::from("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n");
    for (i, end) in [pair.a(), pair.b()].into_iter().enumerate() {
        let cpus = if two_cpus {
            i.to_string()
        } else {
            "0".to_owned()
        };
        let _ = writeln!(
            script,
            "  {}) ifc={} cpu={cpus} ;;",
            end.ns_name(),
            end.ifname()
        );
    }
    let _ = write!(
        script,
        "  *) echo \"agent.sh: unknown host $host\" >&2; exit 1 ;;\nesac\n\
         tmp={}/$host; mkdir -p \"$tmp\" || exit 1\n\
         exec taskset -c $cpu ip netns exec \"$host\" env ROCECTL_VERBS_DEVICES={DEV}=$ifc \
         OMPI_MCA_orte_tmpdir_base=\"$tmp\" \
         {} exec --lib-dir {} --dev-nodes -- sh -c \"$*\"\n",
        session_dirs.display(),
        paths.rocectl.display(),
        paths.verbs_lib_dir.display()
    );
    std::fs::write(&agent, script).map_err(|e| format!("{}: {e}", agent.display()))?;
    let chmod = Command::new("chmod").arg("755").arg(&agent).status();
    if !chmod.is_ok_and(|s| s.success()) {
        return Err(format!("cannot chmod {}", agent.display()));
    }
    let a = pair.a().ipv4().octets();
    let net = format!("{}.{}.{}.0/24", a[0], a[1], a[2]);
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        pair.a().ns_name(),
        "env",
        "PMIX_MCA_gds=hash",
        "mpirun",
    ])
    .args([
        "--allow-run-as-root",
        "-np",
        "2",
        "--bind-to",
        "none",
        "--host",
    ])
    .arg(format!("{}:1,{}:1", pair.a().ns_name(), pair.b().ns_name()))
    .args(["--mca", "plm_rsh_agent"])
    .arg(&agent)
    .args(["--mca", "oob_tcp_if_include", &net])
    .args([
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "btl",
        "^openib,vader",
        "--mca",
        "osc",
        "^ucx",
    ])
    .args([
        "-x",
        &format!("UCX_TLS={tls}"),
        "-x",
        &format!("UCX_NET_DEVICES={DEV}:1"),
    ])
    .arg(&exe);
    let o = run_bounded(
        cmd,
        &format!("mpirun {tls}"),
        Duration::from_secs(240),
        &logs,
    )
    .map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&session_dirs);
    let o = o?;
    let ok_ranks = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("rank ") && l.ends_with(": ok"))
        .count();
    if !o.success() || ok_ranks != 2 {
        // All of what mpirun printed that says something (Open MPI's banners are rows of
        // dashes): which rank or daemon died of which signal, and the backtrace Open MPI's and
        // UCX's signal handlers print, are the only evidence a crash on another machine leaves.
        let all = o.combined();
        let said: Vec<&str> = all
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.trim().is_empty() && !l.chars().all(|c| c == '-'))
            .collect();
        let said = &said[said.len().saturating_sub(80)..];
        return Err(format!(
            "mpirun {} ({ok_ranks} ranks ok):\n{}",
            o.status_text(),
            said.join("\n")
        ));
    }
    Ok(o.stdout
        .lines()
        .filter(|l| l.starts_with("pingpong") && (l.contains(" 1 B:") || l.contains(" 1048576 B:")))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("; "))
}

#[test]
fn ucx_perftest_and_mpi_on_the_dropin() {
    if std::env::var("ROCE_DROPIN").as_deref() != Ok("1") {
        eprintln!(
            "{TEST}: skipped; set ROCE_DROPIN=1 (needs root, verbs/build-so.sh's library, \
             rocectl, ucx-utils; openmpi-bin and libopenmpi-dev for the MPI case)"
        );
        return;
    }
    if !netns_or_skip(TEST) {
        return;
    }
    let paths = DropinPaths::from_env();
    let missing = paths.missing(&["ucx_perftest"], true);
    if !missing.is_empty() {
        roce_testkit::skip(
            TEST,
            format!(
                "missing: {} (ucx_perftest: apt-get install ucx-utils)",
                missing.join("; ")
            ),
        );
        return;
    }
    let filter: Vec<String> = std::env::var("ROCE_UCX_CASES")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let wanted = |id: &str| filter.is_empty() || filter.iter().any(|f| id.contains(f.as_str()));
    let out = paths.workspace.join("target/ucx");
    let logs = out.join("logs");
    let pair = NetnsPair::create("ucx").expect("a veth pair between two namespaces");
    let mut report = Vec::new();
    for (i, case) in CASES.iter().enumerate().filter(|(_, c)| wanted(c.id)) {
        let port = FIRST_PORT + u16::try_from(i).unwrap_or(0);
        let r = run_pair(&paths, &pair, case, port, &logs);
        eprintln!(
            "{:<28} {}",
            case.id,
            r.as_ref()
                .map_or_else(|e| format!("FAIL {e}"), |s| format!("ok   {s}"))
        );
        report.push((case.id.to_owned(), r));
    }
    for tls in ["rc_v,self", "ud_verbs,self"] {
        let id = format!("mpi-{}", tls.split(',').next().unwrap_or(tls));
        if !wanted(&id) {
            continue;
        }
        if which("mpicc").is_none() || which("mpirun").is_none() {
            roce_testkit::skip(
                TEST,
                format!("{id}: no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)"),
            );
            continue;
        }
        let r = run_mpi(&paths, &pair, tls, &out);
        eprintln!(
            "{id:<28} {}",
            r.as_ref()
                .map_or_else(|e| format!("FAIL {e}"), |s| format!("ok   {s}"))
        );
        report.push((id, r));
    }
    let failed: Vec<String> = report
        .iter()
        .filter_map(|(id, r)| r.as_ref().err().map(|e| format!("{id}: {e}")))
        .collect();
    assert!(!report.is_empty(), "ROCE_UCX_CASES selected no case");
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        report.len(),
        failed.join("\n")
    );
}
