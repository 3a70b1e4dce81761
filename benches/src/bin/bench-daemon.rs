//! Issue 14's benchmark: what sharing one RoCE address through `rocectl daemon` costs, in one
//! run. `rocectl write-bw` (RC WRITE, 64 KiB messages) pairs over loopback, in fresh network
//! namespaces, as:
//!
//! - `excl-1`: one pair, each side an exclusive device (`ROCECTL_EXCLUSIVE=1`) on its own
//!   address (127.0.0.1, 127.0.0.2): the reference;
//! - `demux-1`: one pair through a kernel-demux daemon, both sides on 127.0.0.1: the pure
//!   cost of the kernel demultiplexer (`SO_REUSEPORT` + the BPF program, GSO runs cut per
//!   destination QPN; members keep `UDP_GRO`, see `benches/README.md`); issue 14's goal is
//!   ≤ 5% below `excl-1`;
//! - `fwd-1`: one pair through a forwarding daemon (the daemon copies each datagram into its
//!   owner's ring);
//! - `excl-4`: four pairs at once, exclusive, on eight addresses (127.0.0.1–8): the fair
//!   aggregate reference for four pairs on this machine;
//! - `demux-4`, `fwd-4`: four pairs at once through each daemon, all eight processes on
//!   127.0.0.1;
//! - `excl-veth-1`, `demux-veth-1`, `excl-veth-4`, `demux-veth-4`: the same over a veth pair
//!   (MTU 9000) between two namespaces, servers on one side and clients on the other, with a
//!   kernel-demux daemon on each side (one address per side) or exclusive devices (four
//!   addresses per side for four pairs). A member off loopback keeps `UDP_GRO` through the
//!   relay (`transport/src/datapath/relay.rs`); these rows show what that is worth.
//!
//! Bandwidth is each client's `--json` `bytes_per_s` (its timed window: first post to last
//! completion); an aggregate is the sum over the four concurrent clients (servers are all up
//! before the clients start, back to back, and each run lasts seconds, so their windows
//! overlap almost entirely). Every figure runs `--reps` times round-robin (each scenario once,
//! then again), reported as the median with min–max. The load average is recorded before and
//! after: on a shared machine the figures are only as good as it was quiet.
//!
//! Prints the table and writes `benches/results/daemon.{md,json}`. Needs root (namespaces) and
//! a release `rocectl` (`cargo build --release -p rocectl`; or `ROCECTL=path`):
//!
//! ```text
//! cargo run -p roce-benches --release --bin bench-daemon
//! cargo run -p roce-benches --release --bin bench-daemon -- --reps 1 --iters 5000 --out none
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use roce_testkit::netns::{NetnsPair, TempNetns};
use roce_testkit::proc::{wait_listening, Proc};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "write-bw pairs through rocectl daemon (kernel demux, forwarding) vs exclusive")]
struct Cli {
    /// Runs per scenario (the median and min–max are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// WRITEs per pair and run (`-n`).
    #[arg(long, default_value_t = 20_000)]
    iters: u64,
    /// Message size (`-s`).
    #[arg(long, default_value_t = 65_536)]
    size: u64,
    /// Output directory for daemon.json and daemon.md, or `none` (default: benches/results).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// How a scenario's devices reach the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Demux,
    Forwarding,
}

/// Where a scenario's pairs talk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Link {
    /// Servers and clients in one namespace, over loopback addresses.
    Lo,
    /// Servers in one namespace, clients in another, over a veth pair (MTU 9000).
    Veth,
}

struct Scenario {
    id: &'static str,
    mode: Mode,
    link: Link,
    pairs: usize,
    what: &'static str,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "excl-1",
        mode: Mode::Exclusive,
        link: Link::Lo,
        pairs: 1,
        what: "1 pair, exclusive devices on 127.0.0.1 and .2",
    },
    Scenario {
        id: "demux-1",
        mode: Mode::Demux,
        link: Link::Lo,
        pairs: 1,
        what: "1 pair through the daemon, kernel demux, both on 127.0.0.1",
    },
    Scenario {
        id: "fwd-1",
        mode: Mode::Forwarding,
        link: Link::Lo,
        pairs: 1,
        what: "1 pair through the daemon, forwarding, both on 127.0.0.1",
    },
    Scenario {
        id: "excl-4",
        mode: Mode::Exclusive,
        link: Link::Lo,
        pairs: 4,
        what: "4 pairs at once, exclusive, on 127.0.0.1–8",
    },
    Scenario {
        id: "demux-4",
        mode: Mode::Demux,
        link: Link::Lo,
        pairs: 4,
        what: "4 pairs at once through the daemon, kernel demux, all on 127.0.0.1",
    },
    Scenario {
        id: "fwd-4",
        mode: Mode::Forwarding,
        link: Link::Lo,
        pairs: 4,
        what: "4 pairs at once through the daemon, forwarding, all on 127.0.0.1",
    },
    Scenario {
        id: "excl-veth-1",
        mode: Mode::Exclusive,
        link: Link::Veth,
        pairs: 1,
        what: "1 pair over a veth (MTU 9000), exclusive devices, one address on each side",
    },
    Scenario {
        id: "demux-veth-1",
        mode: Mode::Demux,
        link: Link::Veth,
        pairs: 1,
        what: "1 pair over the veth through a kernel-demux daemon on each side",
    },
    Scenario {
        id: "excl-veth-4",
        mode: Mode::Exclusive,
        link: Link::Veth,
        pairs: 4,
        what: "4 pairs at once over the veth, exclusive, on 4 addresses each side",
    },
    Scenario {
        id: "demux-veth-4",
        mode: Mode::Demux,
        link: Link::Veth,
        pairs: 4,
        what: "4 pairs at once over the veth through the daemons, one address each side",
    },
];

/// One side of a place: a namespace, and the daemon socket there (daemon modes).
struct End {
    ns: String,
    socket: Option<PathBuf>,
}

/// Where a scenario's pairs run: the namespaces, the daemons (daemon modes), the addresses.
struct Place {
    /// Dropped (killed) before the namespaces go.
    daemons: Vec<Proc>,
    server: End,
    client: End,
    /// Address of pair k's server and client.
    addrs: Vec<(String, String)>,
    _lo: Option<TempNetns>,
    _veth: Option<NetnsPair>,
}

impl Place {
    fn new(mode: Mode, link: Link, rocectl: &Path, dir: &Path) -> Result<Self> {
        let tag = match mode {
            Mode::Exclusive => "bd-excl",
            Mode::Demux => "bd-demux",
            Mode::Forwarding => "bd-fwd",
        };
        let pairs = 4;
        let (lo, veth, server_ns, client_ns, addrs, daemon_addrs) = match link {
            Link::Lo => {
                let ns = TempNetns::create(tag).context("creating a namespace")?;
                let name = ns.name().to_owned();
                let addrs = (0..pairs)
                    .map(|k| match mode {
                        Mode::Exclusive => (
                            format!("127.0.0.{}", 2 * k + 1),
                            format!("127.0.0.{}", 2 * k + 2),
                        ),
                        _ => ("127.0.0.1".to_owned(), "127.0.0.1".to_owned()),
                    })
                    .collect::<Vec<_>>();
                (
                    Some(ns),
                    None,
                    name.clone(),
                    name,
                    addrs,
                    vec!["127.0.0.1".to_owned()],
                )
            }
            Link::Veth => {
                let pair = NetnsPair::create_with_mtu(tag, 9000).context("creating a veth pair")?;
                let (a, b) = (pair.a().ipv4(), pair.b().ipv4());
                let addrs = (0..pairs)
                    .map(|k| {
                        if mode != Mode::Exclusive || k == 0 {
                            return (a.to_string(), b.to_string());
                        }
                        let o = a.octets();
                        let (sa, sb) = (
                            format!("{}.{}.{}.{}", o[0], o[1], o[2], 10 + k),
                            format!("{}.{}.{}.{}", o[0], o[1], o[2], 20 + k),
                        );
                        (sa, sb)
                    })
                    .collect::<Vec<_>>();
                for (k, (sa, sb)) in addrs.iter().enumerate().skip(1) {
                    if mode != Mode::Exclusive {
                        break;
                    }
                    for (end, addr) in [(pair.a(), sa), (pair.b(), sb)] {
                        let ok = Command::new("ip")
                            .args(["-n", end.ns_name(), "addr", "add", &format!("{addr}/24")])
                            .args(["dev", end.ifname()])
                            .status()
                            .is_ok_and(|s| s.success());
                        if !ok {
                            bail!("adding address {addr} (pair {k}) failed");
                        }
                    }
                }
                let (sn, cn) = (pair.a().ns_name().to_owned(), pair.b().ns_name().to_owned());
                (
                    None,
                    Some(pair),
                    sn,
                    cn,
                    addrs,
                    vec![a.to_string(), b.to_string()],
                )
            }
        };
        let mut place = Self {
            daemons: Vec::new(),
            server: End {
                ns: server_ns.clone(),
                socket: None,
            },
            client: End {
                ns: client_ns.clone(),
                socket: None,
            },
            addrs,
            _lo: lo,
            _veth: veth,
        };
        if mode == Mode::Exclusive {
            return Ok(place);
        }
        let m = if mode == Mode::Demux {
            "kernel-demux"
        } else {
            "forwarding"
        };
        let nss = if server_ns == client_ns {
            vec![server_ns]
        } else {
            vec![server_ns, client_ns]
        };
        let mut sockets = Vec::new();
        for (i, (ns, addr)) in nss.iter().zip(&daemon_addrs).enumerate() {
            let name = format!("{tag}-{link:?}-{i}");
            let socket = dir.join(format!("{name}.sock"));
            let cfg = dir.join(format!("{name}.toml"));
            let _ = std::fs::remove_file(&socket);
            std::fs::write(
                &cfg,
                format!(
                    "address = \"{addr}\"\nmode = \"{m}\"\n[socket]\npath = \"{}\"\n",
                    socket.display()
                ),
            )?;
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns]).arg(rocectl);
            cmd.args(["daemon", "--config"]).arg(&cfg);
            let daemon = Proc::spawn(cmd, &name, dir)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::os::unix::net::UnixStream::connect(&socket).is_err() {
                if Instant::now() > deadline {
                    bail!("the {m} daemon did not start: {}", daemon.stderr_so_far());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            place.daemons.push(daemon);
            sockets.push(socket);
        }
        place.server.socket = sockets.first().cloned();
        place.client.socket = sockets.last().cloned();
        Ok(place)
    }

    /// `rocectl ARGS` on one side: through its daemon, or exclusive; under `time` (its CPU
    /// time on the last line of standard error) when there is one.
    fn tool(&self, server: bool, rocectl: &Path, args: &[String]) -> Command {
        let end = if server { &self.server } else { &self.client };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &end.ns, "env"]);
        match &end.socket {
            Some(s) => cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", s.display())),
            None => cmd.arg("ROCECTL_EXCLUSIVE=1"),
        };
        if Path::new(TIME).exists() {
            cmd.args([TIME, "-f", "cpu %U %S"]);
        }
        cmd.arg(rocectl).args(args);
        cmd
    }

    /// The daemons' CPU time so far (user + system, seconds), if there are daemons.
    fn daemon_cpu(&self) -> Option<f64> {
        if self.daemons.is_empty() {
            return None;
        }
        let mut total = 0.0;
        for d in &self.daemons {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", d.pid())).ok()?;
            // The fields after the command name (which may hold spaces) start with the state
            // (field 3); utime and stime are fields 14 and 15, in USER_HZ (100) ticks.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            total += f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        }
        Some(total / 100.0)
    }
}

/// The key of a mode among the places.
fn mode_key(m: Mode) -> &'static str {
    match m {
        Mode::Exclusive => "excl",
        Mode::Demux => "demux",
        Mode::Forwarding => "fwd",
    }
}

/// GNU time, for the CPU time of each tool.
const TIME: &str = "/usr/bin/time";

/// The CPU seconds `time -f "cpu %U %S"` printed last on `stderr`.
fn cpu_of(stderr: &str) -> Option<f64> {
    let line = stderr.lines().rev().find(|l| l.starts_with("cpu "))?;
    let mut it = line.split_whitespace().skip(1);
    Some(it.next()?.parse::<f64>().ok()? + it.next()?.parse::<f64>().ok()?)
}

/// One run's figures.
struct RunResult {
    /// Each client's bytes/s.
    bw: Vec<f64>,
    /// CPU seconds of every process of the run (tools and daemon), if measured.
    cpu: Option<f64>,
    commands: Vec<String>,
}

/// One run of a scenario: every client's bytes/s, and the commands.
fn run(
    sc: &Scenario,
    place: &Place,
    rocectl: &Path,
    cli: &Cli,
    port: &mut u16,
    dir: &Path,
) -> Result<RunResult> {
    let daemon_before = place.daemon_cpu();
    let common = |local: String, port: u16| {
        vec![
            "write-bw".to_owned(),
            "--local".into(),
            local,
            "-p".into(),
            port.to_string(),
            "-n".into(),
            cli.iters.to_string(),
            "-s".into(),
            cli.size.to_string(),
            "--json".into(),
        ]
    };
    let addr = |k: usize, server: bool| {
        let (s, c) = &place.addrs[k];
        if server {
            s.clone()
        } else {
            c.clone()
        }
    };
    let mut servers = Vec::new();
    let mut commands = Vec::new();
    let mut ports = Vec::new();
    for k in 0..sc.pairs {
        *port += 1;
        let args = common(addr(k, true), *port);
        commands.push(format!("rocectl {}", args.join(" ")));
        let p = Proc::spawn(
            place.tool(true, rocectl, &args),
            &format!("{} server {k}", sc.id),
            dir,
        )?;
        servers.push(p);
        ports.push(*port);
    }
    for (s, &p) in servers.iter().zip(&ports) {
        if !wait_listening(s.pid(), p, Duration::from_secs(20)) {
            bail!(
                "{} server on :{p} did not listen: {}",
                sc.id,
                s.stderr_so_far()
            );
        }
    }
    let mut clients = Vec::new();
    for (k, &p) in ports.iter().enumerate() {
        let mut args = common(addr(k, false), p);
        let server_addr = addr(k, true);
        args.push(server_addr);
        commands.push(format!("rocectl {}", args.join(" ")));
        clients.push(Proc::spawn(
            place.tool(false, rocectl, &args),
            &format!("{} client {k}", sc.id),
            dir,
        )?);
    }
    let limit = Duration::from_secs(180);
    let mut bw = Vec::new();
    let mut cpu = Some(0.0);
    for c in clients {
        let what = c.what().to_owned();
        let out = c.wait(limit);
        if !out.success() {
            bail!("{what}: {}: {}", out.status_text(), out.combined());
        }
        let line = out
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("{\"tool\""))
            .with_context(|| format!("{what}: no --json line"))?;
        let v: Value = serde_json::from_str(line)?;
        cpu = cpu.zip(cpu_of(&out.stderr)).map(|(a, b)| a + b);
        bw.push(
            v["bytes_per_s"]
                .as_f64()
                .with_context(|| format!("{what}: no bytes_per_s"))?,
        );
    }
    for s in servers {
        let what = s.what().to_owned();
        let out = s.wait(Duration::from_secs(20));
        if !out.success() {
            bail!("{what}: {}: {}", out.status_text(), out.combined());
        }
        cpu = cpu.zip(cpu_of(&out.stderr)).map(|(a, b)| a + b);
    }
    if let (Some(a), Some(b)) = (daemon_before, place.daemon_cpu()) {
        cpu = cpu.map(|c| c + (b - a));
    }
    Ok(RunResult { bw, cpu, commands })
}

/// The median and range of a set of runs.
fn summary(values: &[f64]) -> Option<Value> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(json!({
        "median": v[v.len() / 2],
        "min": v[0],
        "max": v[v.len() - 1],
        "n": v.len(),
        "runs": values,
    }))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-daemon needs root (network namespaces)");
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rocectl = std::env::var_os("ROCECTL")
        .map_or_else(|| workspace.join("target/release/rocectl"), PathBuf::from);
    if !rocectl.exists() {
        bail!(
            "no rocectl at {} (cargo build --release -p rocectl, or ROCECTL=path)",
            rocectl.display()
        );
    }
    roce_benches::netns::install_signal_cleanup();
    let dir = workspace.join("target/bench-daemon");
    std::fs::create_dir_all(&dir)?;
    let t0 = Instant::now();
    let started = date();
    let load_start = loadavg();
    let mut places: BTreeMap<(Link, &str), Place> = BTreeMap::new();
    for sc in SCENARIOS {
        let key = (sc.link, mode_key(sc.mode));
        if let std::collections::btree_map::Entry::Vacant(e) = places.entry(key) {
            e.insert(Place::new(sc.mode, sc.link, &rocectl, &dir)?);
        }
    }
    let place = |sc: &Scenario| &places[&(sc.link, mode_key(sc.mode))];
    // Per scenario: the aggregate of each run, and each run's per-pair figures.
    let mut agg: Vec<Vec<f64>> = SCENARIOS.iter().map(|_| Vec::new()).collect();
    let mut per_pair: Vec<Vec<Vec<f64>>> = SCENARIOS.iter().map(|_| Vec::new()).collect();
    // Per scenario: CPU seconds per GB moved, each run.
    let mut cpu_gb: Vec<Vec<f64>> = SCENARIOS.iter().map(|_| Vec::new()).collect();
    let mut commands: Vec<Vec<String>> = SCENARIOS.iter().map(|_| Vec::new()).collect();
    let mut errors = Vec::new();
    let mut port = 18_900;
    for rep in 0..cli.reps {
        for (i, sc) in SCENARIOS.iter().enumerate() {
            match run(sc, place(sc), &rocectl, &cli, &mut port, &dir) {
                Ok(RunResult {
                    bw,
                    cpu,
                    commands: cmds,
                }) => {
                    let total: f64 = bw.iter().sum();
                    let gb = (sc.pairs as u64 * cli.iters * cli.size) as f64 / 1e9;
                    if let Some(c) = cpu {
                        cpu_gb[i].push(c / gb);
                    }
                    eprintln!(
                        "{}/{rep}: {:.0} MB/s ({}), {}",
                        sc.id,
                        total / 1e6,
                        bw.iter()
                            .map(|b| format!("{:.0}", b / 1e6))
                            .collect::<Vec<_>>()
                            .join(" + "),
                        cpu.map_or("CPU not measured".to_owned(), |c| format!(
                            "{:.2} CPU s/GB",
                            c / gb
                        ))
                    );
                    agg[i].push(total);
                    per_pair[i].push(bw);
                    if commands[i].is_empty() {
                        commands[i] = cmds;
                    }
                }
                Err(e) => {
                    eprintln!("{}/{rep}: FAILED: {e:#}", sc.id);
                    errors.push(format!("{}/{rep}: {e:#}", sc.id));
                }
            }
        }
    }
    let load_end = loadavg();
    let med = |id: &str| {
        SCENARIOS
            .iter()
            .position(|s| s.id == id)
            .and_then(|i| summary(&agg[i]))
            .and_then(|s| s["median"].as_f64())
    };
    let ratio = |a: &str, b: &str| match (med(a), med(b)) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    };
    let cmp: &[(&str, &str, &str)] = &[
        (
            "demux-1",
            "excl-1",
            "kernel-demux overhead, 1 pair (goal: ≤ 5%)",
        ),
        ("fwd-1", "excl-1", "forwarding overhead, 1 pair"),
        (
            "demux-4",
            "excl-1",
            "4 pairs through the daemon vs 1 pair exclusive",
        ),
        (
            "demux-4",
            "excl-4",
            "kernel demux, 4 pairs vs 4 exclusive pairs on 8 addresses",
        ),
        (
            "fwd-4",
            "excl-4",
            "forwarding, 4 pairs vs 4 exclusive pairs",
        ),
        ("fwd-4", "demux-4", "forwarding vs kernel demux, 4 pairs"),
        (
            "demux-veth-1",
            "excl-veth-1",
            "kernel-demux overhead over a veth, 1 pair (goal: ≤ 5%)",
        ),
        (
            "demux-veth-4",
            "excl-veth-4",
            "kernel demux over a veth, 4 pairs vs 4 exclusive pairs",
        ),
    ];
    let mut md = String::new();
    md.push_str("# rocectl benchmarks: many processes on one address through `rocectl daemon`\n\n");
    md.push_str(&format!(
        "{started} · {} · {:.0} s · load average {load_start} at the start, {load_end} at the \
         end · {} runs per scenario round-robin, each cell the median (min–max)\n\nGenerated by \
         `cargo run -p roce-benches --release --bin bench-daemon` (see its docs). `rocectl \
         write-bw -s {} -n {}` pairs over loopback in a fresh network namespace, and over a \
         veth pair (MTU 9000) between two (`-veth-` rows; a daemon on each side); bandwidth is the \
         client's `bytes_per_s` (first post to last completion), summed over the pairs of a \
         scenario that run at once. MB/s = 10^6 B/s. CPU s per GB: user + system time of every \
         process of the run (servers, clients and the daemon's share) per 10^9 bytes written; \
         the tools busy-poll, so it counts their spinning too. 2 CPUs shared with other work: read the \
         load average before the figures.\n\n",
        git_describe(),
        t0.elapsed().as_secs_f64(),
        cli.reps,
        cli.size,
        cli.iters,
    ));
    md.push_str(
        "| scenario | what | aggregate MB/s | per pair MB/s (median run) | CPU s per GB |\n\
         |---|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    for (i, sc) in SCENARIOS.iter().enumerate() {
        let s = summary(&agg[i]);
        let cell = s.as_ref().map_or("failed".to_owned(), |v| {
            format!(
                "{:.0} ({:.0}–{:.0})",
                v["median"].as_f64().unwrap_or_default() / 1e6,
                v["min"].as_f64().unwrap_or_default() / 1e6,
                v["max"].as_f64().unwrap_or_default() / 1e6
            )
        });
        // The per-pair figures of the run whose aggregate is the median.
        let pairs = s
            .as_ref()
            .and_then(|v| v["median"].as_f64())
            .and_then(|m| agg[i].iter().position(|&a| a == m))
            .map(|k| {
                per_pair[i][k]
                    .iter()
                    .map(|b| format!("{:.0}", b / 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let c = summary(&cpu_gb[i]);
        let cpu_cell = c.as_ref().map_or("–".to_owned(), |v| {
            format!(
                "{:.2} ({:.2}–{:.2})",
                v["median"].as_f64().unwrap_or_default(),
                v["min"].as_f64().unwrap_or_default(),
                v["max"].as_f64().unwrap_or_default()
            )
        });
        md.push_str(&format!(
            "| {} | {} | {cell} | {pairs} | {cpu_cell} |\n",
            sc.id, sc.what
        ));
        rows.push(json!({
            "id": sc.id,
            "what": sc.what,
            "pairs": sc.pairs,
            "aggregate_bytes_per_s": s,
            "per_pair_runs": per_pair[i],
            "cpu_s_per_gb": c,
            "commands": commands[i],
        }));
    }
    md.push_str("\n| comparison | ratio (medians) |\n|---|---|\n");
    let mut ratios = Vec::new();
    for (a, b, what) in cmp {
        let r = ratio(a, b);
        md.push_str(&format!(
            "| {what}: {a} / {b} | {} |\n",
            r.map_or("–".to_owned(), |r| format!(
                "{r:.3}× ({:+.1}%)",
                (r - 1.0) * 100.0
            ))
        ));
        ratios.push(json!({"a": a, "b": b, "what": what, "ratio": r}));
    }
    md.push_str(
        "\nCommands of the first run (server first; the client adds the server's address):\n\n",
    );
    for (i, sc) in SCENARIOS.iter().enumerate() {
        md.push_str(&format!("- {}: `{}`\n", sc.id, commands[i].join("` · `")));
    }
    if !errors.is_empty() {
        md.push_str("\nFailed runs:\n\n");
        for e in &errors {
            md.push_str(&format!("- {}\n", e.replace('|', "\\|").replace('\n', " ")));
        }
    }
    let doc = json!({
        "date": started,
        "git": git_describe(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "elapsed_s": t0.elapsed().as_secs_f64(),
        "reps": cli.reps,
        "iters": cli.iters,
        "size": cli.size,
        "scenarios": rows,
        "ratios": ratios,
        "errors": errors,
    });
    println!("{md}");
    let out = match cli.out {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) => Some(p),
        None => Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")),
    };
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("daemon.md"), &md)?;
        std::fs::write(
            dir.join("daemon.json"),
            serde_json::to_string_pretty(&doc)? + "\n",
        )?;
        eprintln!("wrote {}/daemon.{{md,json}}", dir.display());
    }
    drop(places);
    if agg.iter().any(Vec::is_empty) {
        bail!("a scenario has no successful run");
    }
    Ok(())
}

fn git_describe() -> String {
    Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
