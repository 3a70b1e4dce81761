//! The runner behind `bench-all` / `benches/run.sh`: every measurement (the limit, the peers,
//! ours) repeated round-robin, each figure as the median with min–max, one table, JSON and
//! Markdown in `benches/results/`.
//!
//! # Structure
//!
//! - A **measurement** is one thing that runs: a blaster cell, a peer command, or one of our
//!   commands. Each run yields named numbers (`bytes_per_s`, `ops_per_s`, `median_us`,
//!   `p99_us`, `p999_us`, ...). Runs go round-robin (all measurements once, then again), so slow
//!   drifts of the shared machine spread over all of them, and a time budget cuts repetitions,
//!   never whole measurements.
//! - A **figure** is one row of the table: ours, the limit and each peer, each a reference to a
//!   measurement and the number to read from it ([`Metric`]), with ours divided by each.
//! - **Ours** comes from [`OURS_FILE`]: one command template per figure kind; an empty
//!   template leaves the cells "pending". See that file for the placeholders and the output
//!   contract (last stdout line: a flat JSON object with the numbers above).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nix::sys::resource::{getrusage, UsageWho};
use serde_json::{json, Value};

use crate::blaster::{
    datagram_len, run_pingpong, run_stream, Mode, PingPongConfig, RecvMode, StreamConfig,
    ATOMIC_LEN, PMTUS, UD64_LEN,
};
use crate::netns::{Link, PrivateLoopback, VethPair};
use crate::peers::{self, PeerResult};
use crate::stats::Summary;

/// The hook file for our commands, relative to the crate directory.
pub const OURS_FILE: &str = "ours.cmds";

/// Message sizes of the bandwidth figures.
pub const BW_SIZES: [usize; 3] = [4_096, 65_536, 1_048_576];
/// Path MTUs of the bandwidth figures.
pub const BW_PMTUS: [usize; 2] = [1_024, 4_096];

/// What the runner runs, and for how long.
#[derive(Clone, Debug)]
pub struct Options {
    /// Runs per measurement (at least 3 for a median with a range).
    pub reps: usize,
    /// Stop starting runs after this long (the rest is reported as skipped).
    pub budget: Duration,
    /// Counting window of a blaster stream cell.
    pub stream_duration: Duration,
    /// Warm-up of a blaster stream cell.
    pub stream_warmup: Duration,
    /// Round trips of a blaster ping-pong cell.
    pub pp_round_trips: usize,
    /// Also run over a veth pair (needs root).
    pub veth: bool,
    /// Run the peers.
    pub peers: bool,
    /// Only run measurements whose id contains this.
    pub filter: Option<String>,
    /// The hook file with our commands.
    pub ours_file: PathBuf,
    /// Where `latest.json` and `latest.md` go (`None`: nowhere).
    pub out_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        Self {
            reps: 3,
            budget: Duration::from_secs(540),
            stream_duration: Duration::from_secs(1),
            stream_warmup: Duration::from_millis(300),
            pp_round_trips: 10_000,
            veth: true,
            peers: true,
            filter: None,
            ours_file: dir.join(OURS_FILE),
            out_dir: Some(dir.join("results")),
        }
    }
}

/// What a figure compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Payload bytes/s (key `bytes_per_s`); higher is better.
    Bandwidth,
    /// Messages or operations per second (key `ops_per_s`); higher is better.
    Rate,
    /// Round-trip time, µs (keys `median_us`, `p99_us`, `p999_us`); lower is better.
    Latency,
}

impl Metric {
    fn key(self) -> &'static str {
        match self {
            Self::Bandwidth => "bytes_per_s",
            Self::Rate => "ops_per_s",
            Self::Latency => "median_us",
        }
    }
}

#[derive(Clone, Debug)]
enum Job {
    Stream(StreamConfig),
    PingPong(PingPongConfig),
    Fabric {
        size: usize,
        iters: usize,
    },
    Ucx {
        test: &'static str,
        size: usize,
        iters: usize,
    },
    Ours {
        template: String,
        params: BTreeMap<&'static str, String>,
    },
}

#[derive(Debug)]
struct Measurement {
    id: String,
    link: usize,
    job: Job,
    /// Exact command lines (peers, ours), filled by the first run.
    commands: Vec<String>,
    runs: Vec<BTreeMap<String, f64>>,
    errors: Vec<String>,
    skipped: usize,
}

impl Measurement {
    fn summary(&self, key: &str) -> Option<Summary> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.get(key).copied())
            .collect();
        Summary::of(&v)
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
struct Figure {
    id: String,
    title: String,
    metric: Metric,
    kind: &'static str,
    params: BTreeMap<&'static str, String>,
    /// The kernel's best at the same size: the GSO/GRO blaster for bandwidth and rates, the
    /// UDP ping-pong for latency (or, for the 2-QP row, one QP of ours).
    limit: String,
    /// The second reference: the sendmmsg/recvmmsg blaster at the same size.
    mmsg: Option<String>,
    /// libfabric, UCX.
    peers: [Option<String>; 2],
}

/// Peer column names.
pub const PEERS: [&str; 2] = ["libfabric udp;ofi_rxd", "UCX tcp"];

fn fabric_iters(size: usize) -> usize {
    match size {
        0..=1_024 => 5_000,
        1_025..=8_192 => 2_000,
        8_193..=131_072 => 300,
        _ => 40,
    }
}

/// Iterations of a UCX bandwidth test: ~32 MiB, at least 200 (fewer gave warm-up-dominated
/// results at 1 MiB); `ucp_get` over TCP costs ~1-4 ms per get at any size, so 400 at most.
fn ucx_bw_iters(test: &str, size: usize) -> usize {
    let n = ((32 << 20) / size).clamp(200, 20_000);
    if test == "ucp_get" {
        n.min(400)
    } else {
        n
    }
}

fn figures(link: &Link) -> Vec<Figure> {
    let l = link.name;
    let mut v = Vec::new();
    let p = |pairs: &[(&'static str, String)]| -> BTreeMap<&'static str, String> {
        let mut m: BTreeMap<&'static str, String> = pairs.iter().cloned().collect();
        m.insert("link", l.to_string());
        m
    };
    for (op, kind, ucx) in [
        ("write", "rc-write-bw", "ucp_put_bw"),
        ("read", "rc-read-bw", "ucp_get"),
        ("send", "rc-send-bw", "tag_bw"),
    ] {
        for pmtu in BW_PMTUS {
            for size in BW_SIZES {
                let fabric = (op == "send").then(|| format!("libfabric/{l}/pingpong/{size}"));
                v.push(Figure {
                    id: format!("rc-{op}-bw/{l}/pmtu{pmtu}/{size}"),
                    title: format!(
                        "RC {} BW {} PMTU {pmtu} {l}",
                        op.to_uppercase(),
                        human_size(size)
                    ),
                    metric: Metric::Bandwidth,
                    kind,
                    params: p(&[("pmtu", pmtu.to_string()), ("size", size.to_string())]),
                    limit: format!("limit/{l}/gso/{}", datagram_len(pmtu)),
                    mmsg: Some(format!("limit/{l}/mmsg/{}", datagram_len(pmtu))),
                    peers: [fabric, Some(format!("ucx/{l}/{ucx}/{size}"))],
                });
            }
        }
    }
    if l == "lo" {
        // Two QPs, each on its own pair of devices (own engine threads), at once: the "limit"
        // column is one QP's figure, so the ratio is the scaling.
        v.push(Figure {
            id: format!("rc-write-bw-2qp/{l}/pmtu4096/65536"),
            title: format!("RC WRITE BW 64 KiB PMTU 4096, 2 QPs / 1 QP {l}"),
            metric: Metric::Bandwidth,
            kind: "rc-write-bw-2qp",
            params: p(&[("pmtu", "4096".into()), ("size", "65536".into())]),
            limit: format!("ours/rc-write-bw/{l}/pmtu4096/65536"),
            mmsg: None,
            peers: [None, None],
        });
        // The same with 4 process pairs, and with N QPs in one process pair (perftest's -q:
        // one device per side, min(-q, CPUs) engines each since session 8).
        for (kind, what) in [
            ("rc-write-bw-4qp", "4 QPs (4 process pairs)"),
            ("rc-write-bw-q2", "2 QPs in one process (-q 2)"),
            ("rc-write-bw-q4", "4 QPs in one process (-q 4)"),
        ] {
            v.push(Figure {
                id: format!("{kind}/{l}/pmtu4096/65536"),
                title: format!("RC WRITE BW 64 KiB PMTU 4096, {what} / 1 QP {l}"),
                metric: Metric::Bandwidth,
                kind,
                params: p(&[("pmtu", "4096".into()), ("size", "65536".into())]),
                limit: format!("ours/rc-write-bw/{l}/pmtu4096/65536"),
                mmsg: None,
                peers: [None, None],
            });
        }
    }
    v.push(Figure {
        id: format!("ud-send-rate/{l}/64"),
        title: format!("UD SEND rate 64 B {l}"),
        metric: Metric::Rate,
        kind: "ud-send-rate",
        params: p(&[("size", "64".into())]),
        limit: format!("limit/{l}/gso/{UD64_LEN}"),
        mmsg: Some(format!("limit/{l}/mmsg/{UD64_LEN}")),
        peers: [None, Some(format!("ucx/{l}/tag_bw/64"))],
    });
    v.push(Figure {
        id: format!("atomic-rate/{l}"),
        title: format!("RC FETCH_ADD rate {l}"),
        metric: Metric::Rate,
        kind: "atomic-rate",
        params: p(&[("size", "8".into())]),
        limit: format!("limit/{l}/gso/{ATOMIC_LEN}"),
        mmsg: Some(format!("limit/{l}/mmsg/{ATOMIC_LEN}")),
        peers: [None, Some(format!("ucx/{l}/ucp_fadd/8"))],
    });
    for recv in RecvMode::ALL {
        for (op, kind, ucx) in [
            ("send", "rc-send-lat", Some("tag_lat")),
            ("write", "rc-write-lat", Some("ucp_put_lat")),
            ("read", "rc-read-lat", None),
        ] {
            let busy = recv == RecvMode::Busy;
            let fabric = (busy && op == "send").then(|| format!("libfabric/{l}/pingpong/64"));
            let ucx = ucx.filter(|_| busy).map(|t| format!("ucx/{l}/{t}/64"));
            v.push(Figure {
                id: format!("rc-{op}-lat/{l}/{}/64", recv.name()),
                title: format!("RC {} RTT 64 B {} {l}", op.to_uppercase(), recv.name()),
                metric: Metric::Latency,
                kind,
                params: p(&[("size", "64".into()), ("recv", recv.name().into())]),
                limit: format!("limit/{l}/pingpong/{}/64", recv.name()),
                mmsg: None,
                peers: [fabric, ucx],
            });
        }
    }
    v
}

fn human_size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

fn measurements(
    links: &[&Link],
    opts: &Options,
    ours: &BTreeMap<String, String>,
) -> (Vec<Measurement>, Vec<Figure>) {
    let mut ms = Vec::new();
    let mut figs = Vec::new();
    let add = |ms: &mut Vec<Measurement>, id: String, link: usize, job: Job| {
        ms.push(Measurement {
            id,
            link,
            job,
            commands: Vec::new(),
            runs: Vec::new(),
            errors: Vec::new(),
            skipped: 0,
        });
    };
    for (li, link) in links.iter().enumerate() {
        let l = link.name;
        let stream = |mode, size| {
            let mut c = StreamConfig::new(mode, size);
            c.duration = opts.stream_duration;
            c.warmup = opts.stream_warmup;
            Job::Stream(c)
        };
        for mode in Mode::ALL {
            for pmtu in PMTUS {
                let size = datagram_len(pmtu);
                add(
                    &mut ms,
                    format!("limit/{l}/{}/{size}", mode.name()),
                    li,
                    stream(mode, size),
                );
            }
        }
        for size in [ATOMIC_LEN, UD64_LEN] {
            for mode in [Mode::Mmsg, Mode::Gso] {
                add(
                    &mut ms,
                    format!("limit/{l}/{}/{size}", mode.name()),
                    li,
                    stream(mode, size),
                );
            }
        }
        for recv in RecvMode::ALL {
            let mut c = PingPongConfig::new(64, recv);
            c.round_trips = opts.pp_round_trips;
            add(
                &mut ms,
                format!("limit/{l}/pingpong/{}/64", recv.name()),
                li,
                Job::PingPong(c),
            );
        }
        if opts.peers {
            for size in [64, 4_096, 65_536, 1_048_576] {
                let job = Job::Fabric {
                    size,
                    iters: fabric_iters(size),
                };
                add(&mut ms, format!("libfabric/{l}/pingpong/{size}"), li, job);
            }
            for test in ["ucp_put_bw", "ucp_get", "tag_bw"] {
                for size in BW_SIZES {
                    let job = Job::Ucx {
                        test,
                        size,
                        iters: ucx_bw_iters(test, size),
                    };
                    add(&mut ms, format!("ucx/{l}/{test}/{size}"), li, job);
                }
            }
            for (test, size, iters) in [
                ("tag_bw", 64, 20_000),
                ("ucp_fadd", 8, 2_000),
                ("tag_lat", 64, 5_000),
                ("ucp_put_lat", 64, 5_000),
            ] {
                add(
                    &mut ms,
                    format!("ucx/{l}/{test}/{size}"),
                    li,
                    Job::Ucx { test, size, iters },
                );
            }
        }
        for f in figures(link) {
            if let Some(t) = ours.get(f.kind).filter(|t| !t.trim().is_empty()) {
                let job = Job::Ours {
                    template: t.clone(),
                    params: f.params.clone(),
                };
                add(&mut ms, format!("ours/{}", f.id), li, job);
            }
            figs.push(f);
        }
    }
    if let Some(filt) = &opts.filter {
        ms.retain(|m| filt.split(',').any(|f| m.id.contains(f)));
    }
    (ms, figs)
}

/// Reads the hook file: `kind<whitespace>command template` per line, `#` comments; a kind with
/// nothing after it is pending.
///
/// # Errors
/// When the file cannot be read.
pub fn read_ours(path: &Path) -> Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((k, t)) => (k.to_string(), t.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect())
}

/// Expands `{name}` placeholders of an ours template.
pub fn expand(template: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut s = template.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

fn link_vars(link: &Link) -> BTreeMap<&'static str, String> {
    let ns = |s: &crate::netns::Side| s.ns.clone().unwrap_or_default();
    BTreeMap::from([
        ("exec_a", link.a.exec_prefix()),
        ("exec_b", link.b.exec_prefix()),
        ("addr_a", link.a.addr.to_string()),
        ("addr_b", link.b.addr.to_string()),
        ("dev_a", link.a.dev.clone()),
        ("dev_b", link.b.dev.clone()),
        ("ns_a", ns(&link.a)),
        ("ns_b", ns(&link.b)),
    ])
}

/// CPU seconds (user + system) of this process's threads, or of its waited-for descendants.
fn cpu_seconds(who: UsageWho) -> f64 {
    getrusage(who).map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 * 1e-6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// Runs one of our commands (`sh -c`), returning the numbers of the last JSON object line,
/// with `cpu_s_per_gb`: the user + system time of every process it ran (both tools) per 10^9
/// bytes moved (`bytes` × `iters`), for bandwidth runs; and `cpu_s` and `wall_s`, the same CPU
/// time and the command's wall-clock time (start-up and exchange included), whose quotient is
/// how many cores the run kept busy.
fn run_ours(cmd: &str) -> Result<BTreeMap<String, f64>> {
    let cpu0 = cpu_seconds(UsageWho::RUSAGE_CHILDREN);
    let t0 = Instant::now();
    let out = Command::new("timeout")
        .args(["120", "sh", "-c", cmd])
        .stdin(Stdio::null())
        .output()
        .context("running sh")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "exit {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let obj = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Map<String, Value>>(l.trim()).ok())
        .context("no JSON object line on stdout")?;
    let cpu = cpu_seconds(UsageWho::RUSAGE_CHILDREN) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let mut nums: BTreeMap<String, f64> = obj
        .into_iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k, x)))
        .collect();
    nums.insert("cpu_s".into(), cpu);
    nums.insert("wall_s".into(), wall);
    if let (Some(b), Some(n)) = (nums.get("bytes"), nums.get("iters")) {
        let gb = b * n / 1e9;
        if gb > 0.0 && nums.contains_key("bytes_per_s") {
            nums.insert("cpu_s_per_gb".into(), cpu / gb);
        }
    }
    Ok(nums)
}

fn peer_numbers(r: &PeerResult) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for (k, v) in [
        ("bytes_per_s", r.bytes_per_s),
        ("ops_per_s", r.ops_per_s),
        ("median_us", r.rtt_us),
    ] {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    m
}

fn run_one(m: &Measurement, link: &Link) -> Result<(BTreeMap<String, f64>, Vec<String>)> {
    let nums = |pairs: &[(&str, f64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    match &m.job {
        Job::Stream(c) => {
            // The blaster's sender and receiver are threads of this process: its CPU time
            // over the run, per 10^9 bytes received (the warm-up moves bytes at the same rate).
            let cpu0 = cpu_seconds(UsageWho::RUSAGE_SELF);
            let t0 = Instant::now();
            let r = run_stream(link, c)?;
            let cpu = cpu_seconds(UsageWho::RUSAGE_SELF) - cpu0;
            let gb = r.rx_bytes_per_s * t0.elapsed().as_secs_f64() / 1e9;
            let mut out: BTreeMap<String, f64> = nums(&[
                ("bytes_per_s", r.rx_bytes_per_s),
                ("ops_per_s", r.rx_datagrams_per_s),
                ("loss", r.loss),
                ("rx_per_call", r.rx_per_call),
                ("size", r.size as f64),
            ]);
            if gb > 0.0 {
                out.insert("cpu_s_per_gb".into(), cpu / gb);
            }
            Ok((out, vec![]))
        }
        Job::PingPong(c) => {
            let r = run_pingpong(link, c)?;
            Ok((
                nums(&[
                    ("median_us", r.median_us),
                    ("p99_us", r.p99_us),
                    ("p999_us", r.p999_us),
                    ("lost", r.lost as f64),
                ]),
                vec![],
            ))
        }
        Job::Fabric { size, iters } => {
            let r = peers::fabric_pingpong(link, *size, *iters)?;
            Ok((peer_numbers(&r), vec![r.server, r.client]))
        }
        Job::Ucx { test, size, iters } => {
            let r = peers::ucx_perftest(link, test, *size, *iters)?;
            Ok((peer_numbers(&r), vec![r.server, r.client]))
        }
        Job::Ours { template, params } => {
            let mut vars = link_vars(link);
            vars.extend(params.iter().map(|(k, v)| (*k, v.clone())));
            let cmd = expand(template, &vars);
            Ok((run_ours(&cmd)?, vec![cmd]))
        }
    }
}

fn short(m: &BTreeMap<String, f64>) -> String {
    if let Some(b) = m.get("bytes_per_s") {
        format!("{:.3} GB/s", b / 1e9)
    } else if let Some(t) = m.get("median_us") {
        format!("{t:.1} us")
    } else if let Some(o) = m.get("ops_per_s") {
        format!("{:.3} M/s", o / 1e6)
    } else {
        format!("{m:?}")
    }
}

/// The machine and the run, for the record.
fn meta(
    opts: &Options,
    links: &[&Link],
    started: &str,
    load_start: &str,
    elapsed: Duration,
) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let git = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    json!({
        "date": started,
        "git": git,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "loadavg_start": load_start,
        "loadavg_end": read("/proc/loadavg"),
        "elapsed_s": elapsed.as_secs_f64(),
        "reps": opts.reps,
        "stream_window_s": opts.stream_duration.as_secs_f64(),
        "stream_warmup_s": opts.stream_warmup.as_secs_f64(),
        "pingpong_round_trips": opts.pp_round_trips,
        "links": links.iter().map(|l| json!({"name": l.name, "a": format!("{} {}", l.a.dev, l.a.addr), "b": format!("{} {}", l.b.dev, l.b.addr)})).collect::<Vec<_>>(),
        "peer_versions": peers::versions(),
    })
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Everything one run produced.
#[derive(Debug)]
pub struct Report {
    /// The main table (Markdown).
    pub table: String,
    /// The whole Markdown document.
    pub markdown: String,
    /// The JSON document.
    pub json: Value,
}

/// Runs everything `opts` asks for and builds the report (and writes it when `out_dir` is set).
///
/// # Errors
/// When the hook file cannot be read or the results cannot be written. Failing measurements
/// are reported in the tables, not as errors.
pub fn run(opts: &Options) -> Result<Report> {
    let started = date();
    let load_start = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let t0 = Instant::now();
    let ours = read_ours(&opts.ours_file)?;
    // Loopback in a namespace of its own where we may make one (root), so that nothing else
    // on the host (another benchmark on 127.0.0.1:4791, say) meets the runs.
    let private_lo = match PrivateLoopback::create() {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("loopback namespace: {e:#}; using the host's loopback");
            None
        }
    };
    let host_lo = Link::loopback();
    let lo = private_lo.as_ref().map_or(&host_lo, PrivateLoopback::link);
    let pair = if opts.veth {
        match VethPair::create(9000) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("veth: {e:#}; running over loopback only");
                None
            }
        }
    } else {
        None
    };
    let mut links = vec![lo];
    links.extend(pair.as_ref().map(VethPair::link));
    let (mut ms, figs) = measurements(&links, opts, &ours);
    let total = ms.len() * opts.reps;
    let mut done = 0;
    for rep in 0..opts.reps {
        for m in &mut ms {
            done += 1;
            if t0.elapsed() >= opts.budget {
                m.skipped += 1;
                continue;
            }
            let link = links[m.link];
            match run_one(m, link) {
                Ok((nums, cmds)) => {
                    eprintln!(
                        "[{done:>3}/{total} {:>4.0} s] {}: {}",
                        t0.elapsed().as_secs_f64(),
                        m.id,
                        short(&nums)
                    );
                    if m.commands.is_empty() {
                        m.commands = cmds;
                    }
                    m.runs.push(nums);
                }
                Err(e) => {
                    eprintln!(
                        "[{done:>3}/{total} {:>4.0} s] {}: FAILED (run {}): {e:#}",
                        t0.elapsed().as_secs_f64(),
                        m.id,
                        rep + 1
                    );
                    m.errors.push(format!("{e:#}"));
                }
            }
        }
    }
    let skipped: usize = ms.iter().map(|m| m.skipped).sum();
    if skipped > 0 {
        eprintln!(
            "time budget of {} s reached: {skipped} runs skipped",
            opts.budget.as_secs()
        );
    }
    let meta = meta(opts, &links, &started, &load_start, t0.elapsed());
    drop(pair);
    let report = render(&ms, &figs, &meta, opts);
    if let Some(dir) = &opts.out_dir {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("latest.json"),
            serde_json::to_string_pretty(&report.json)? + "\n",
        )?;
        std::fs::write(dir.join("latest.md"), &report.markdown)?;
        eprintln!("wrote {}/latest.{{json,md}}", dir.display());
    }
    Ok(report)
}

fn fmt_value(metric: Metric, x: f64) -> String {
    match metric {
        Metric::Bandwidth => format!("{:.3} GB/s", x / 1e9),
        Metric::Rate => format!("{:.3} M/s", x / 1e6),
        Metric::Latency => format!("{x:.1} µs"),
    }
}

fn fmt_range(metric: Metric, s: &Summary) -> String {
    let k = match metric {
        Metric::Bandwidth => 1e9,
        Metric::Rate => 1e6,
        Metric::Latency => 1.0,
    };
    let p = if metric == Metric::Latency { 1 } else { 3 };
    format!("({:.p$}–{:.p$})", s.min / k, s.max / k)
}

/// A cell: median (min–max), and for latency the medians of p99 and p99.9 when present.
fn cell(m: Option<&Measurement>, metric: Metric, pending: &str) -> String {
    let Some(m) = m else {
        return pending.to_string();
    };
    let Some(s) = m.summary(metric.key()) else {
        return if m.errors.is_empty() {
            "skipped".into()
        } else {
            "failed".into()
        };
    };
    let mut c = format!("{} {}", fmt_value(metric, s.median), fmt_range(metric, &s));
    if metric == Metric::Latency {
        if let (Some(p99), Some(p999)) = (m.summary("p99_us"), m.summary("p999_us")) {
            let _ = write!(c, "; p99 {:.1}, p99.9 {:.1}", p99.median, p999.median);
        }
    }
    if s.n < 3 {
        let _ = write!(c, " n={}", s.n);
    }
    c
}

fn ratio(ours: Option<&Measurement>, other: Option<&Measurement>, metric: Metric) -> Option<f64> {
    let o = ours?.summary(metric.key())?.median;
    let r = other?.summary(metric.key())?.median;
    (r > 0.0).then_some(o / r)
}

fn fmt_ratio(r: Option<f64>, have_ours: bool, have_other: bool) -> String {
    match (r, have_ours, have_other) {
        (Some(r), ..) => format!("{r:.2}×"),
        (None, _, false) => "–".into(),
        (None, false, _) => "pending".into(),
        (None, true, _) => "–".into(),
    }
}

fn render(ms: &[Measurement], figs: &[Figure], meta: &Value, opts: &Options) -> Report {
    let by_id: BTreeMap<&str, &Measurement> = ms.iter().map(|m| (m.id.as_str(), m)).collect();
    let get = |id: &str| by_id.get(id).copied();
    let mut table = format!(
        "| figure | ours | limit | ours/limit | sendmmsg | ours/sendmmsg | {} | ours/peer | {} | ours/peer | CPU s/GB (rates: per message) ours / limit |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        PEERS[0], PEERS[1]
    );
    let mut jfigs = Vec::new();
    for f in figs {
        let ours_id = format!("ours/{}", f.id);
        let ours = get(&ours_id);
        let limit = get(&f.limit);
        let mmsg = f.mmsg.as_deref().and_then(get);
        let peers: Vec<Option<&Measurement>> =
            f.peers.iter().map(|p| p.as_deref().and_then(get)).collect();
        let has_ours = ours.is_some();
        let _ = write!(
            table,
            "| {} | {} | {} | {} |",
            f.title,
            cell(ours, f.metric, "pending"),
            cell(limit, f.metric, "n/a"),
            fmt_ratio(ratio(ours, limit, f.metric), has_ours, limit.is_some())
        );
        let _ = write!(
            table,
            " {} | {} |",
            cell(mmsg, f.metric, if f.mmsg.is_some() { "n/a" } else { "–" }),
            fmt_ratio(ratio(ours, mmsg, f.metric), has_ours, mmsg.is_some())
        );
        for p in &peers {
            let _ = write!(
                table,
                " {} | {} |",
                cell(*p, f.metric, "n/a"),
                fmt_ratio(ratio(ours, *p, f.metric), has_ours, p.is_some())
            );
        }
        // Rates: CPU per message (ours: both tools per message counted; the limit: its two
        // threads per datagram received), from the s/GB and the message's bytes.
        let cpu = |m: Option<&Measurement>| {
            let m = m?;
            let s = m.summary("cpu_s_per_gb")?.median;
            if f.metric == Metric::Rate {
                let bytes = m.summary("bytes").or_else(|| m.summary("size"))?.median;
                Some(format!("{:.2} µs", s * bytes / 1e3))
            } else {
                Some(format!("{s:.2}"))
            }
        };
        let _ = write!(
            table,
            " {} |",
            match (cpu(ours), cpu(limit)) {
                (None, None) => "–".to_owned(),
                (o, l) => format!(
                    "{} / {}",
                    o.as_deref().unwrap_or("–"),
                    l.as_deref().unwrap_or("–")
                ),
            }
        );
        table.push('\n');
        let jcell = |m: Option<&Measurement>, id: Option<&str>| {
            json!({
                "measurement": id,
                "value": m.and_then(|m| m.summary(f.metric.key())),
                "ratio_ours": ratio(ours, m, f.metric),
            })
        };
        jfigs.push(json!({
            "id": f.id,
            "title": f.title,
            "metric": format!("{:?}", f.metric).to_lowercase(),
            "key": f.metric.key(),
            "kind": f.kind,
            "params": f.params,
            "ours": ours.map_or(json!("pending"), |m| json!({"measurement": m.id, "value": m.summary(f.metric.key()), "p99_us": m.summary("p99_us"), "p999_us": m.summary("p999_us")})),
            "limit": jcell(limit, Some(&f.limit)),
            "cpu_s_per_gb": {"ours": ours.and_then(|m| m.summary("cpu_s_per_gb")), "limit": limit.and_then(|m| m.summary("cpu_s_per_gb"))},
            "limit_sendmmsg": jcell(mmsg, f.mmsg.as_deref()),
            "peers": PEERS.iter().zip(&f.peers).zip(&peers).map(|((name, id), m)| json!({"peer": name, "cell": jcell(*m, id.as_deref())})).collect::<Vec<_>>(),
        }));
    }
    let jms: Vec<Value> = ms
        .iter()
        .map(|m| {
            let keys: std::collections::BTreeSet<&String> = m.runs.iter().flat_map(|r| r.keys()).collect();
            json!({
                "id": m.id,
                "commands": m.commands,
                "runs": m.runs,
                "summary": keys.iter().map(|k| (k.to_string(), json!(m.summary(k)))).collect::<serde_json::Map<_, _>>(),
                "errors": m.errors,
                "skipped": m.skipped,
            })
        })
        .collect();
    let json = json!({ "meta": meta, "figures": jfigs, "measurements": jms });
    let markdown = markdown(ms, &table, meta, opts);
    Report {
        table,
        markdown,
        json,
    }
}

fn markdown(ms: &[Measurement], table: &str, meta: &Value, opts: &Options) -> String {
    let mut md = String::new();
    let m = |k: &str| meta[k].to_string().trim_matches('"').to_string();
    let _ = writeln!(md, "# rocectl benchmarks: latest run\n");
    let _ = writeln!(
        md,
        "{} · git {} · {} × {} · kernel {} · load {} → {} · {:.0} s · {} runs per cell, each cell the median (min–max)\n",
        m("date"),
        m("git"),
        m("cpus"),
        m("cpu"),
        m("kernel"),
        m("loadavg_start"),
        m("loadavg_end"),
        meta["elapsed_s"].as_f64().unwrap_or(0.0),
        opts.reps
    );
    let _ = writeln!(md, "Generated by `benches/run.sh` (`cargo run -p roce-benches --release --bin bench-all`); see `benches/README.md`.\n");
    let _ = writeln!(md, "Bandwidth in 10^9 bytes/s of payload, rates in 10^6/s, latency = round-trip time in µs (median; p99, p99.9 where measured). The ratio is ours divided by the reference: higher is better for bandwidth and rates, lower for latency. The limit is the kernel's best UDP path at the same size: of a bandwidth row the GSO→GRO blaster (UDP_SEGMENT sends of up to 64 datagrams, UDP_GRO receives) at the row's datagram size (12 + PMTU + 4 bytes), of a rate row the same at 88 B (UD SEND 64 B) or 44 B (atomic request), of a latency row the 64-byte UDP ping-pong in the same receive mode. The sendmmsg column is the second reference: the sendmmsg/recvmmsg blaster (64 datagrams per call) at the same size.\n");
    md.push_str(table);
    let _ = writeln!(md, "\n## The limit: raw UDP blaster\n");
    let _ = writeln!(md, "| link | size (PMTU) | plain GB/s | plain Mdgram/s | mmsg GB/s | mmsg Mdgram/s | GSO/GRO GB/s | GSO/GRO Mdgram/s |\n|---|---|---|---|---|---|---|---|");
    let by_id: BTreeMap<&str, &Measurement> = ms.iter().map(|m| (m.id.as_str(), m)).collect();
    // The links the limit was measured on, in order (not every id's second field: `ours/`
    // ids carry a figure kind there).
    let links: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for l in ms
            .iter()
            .filter(|m| m.id.starts_with("limit/"))
            .filter_map(|m| m.id.split('/').nth(1))
        {
            if !v.contains(&l) {
                v.push(l);
            }
        }
        v
    };
    let val = |id: &str, key: &str, k: f64| {
        by_id
            .get(id)
            .and_then(|m| m.summary(key))
            .map_or("–".to_string(), |s| {
                format!("{:.3} ({:.3}–{:.3})", s.median / k, s.min / k, s.max / k)
            })
    };
    for l in &links {
        let sizes: Vec<(usize, String)> = PMTUS
            .iter()
            .map(|&p| (datagram_len(p), format!("{} B ({p})", datagram_len(p))))
            .chain([
                (ATOMIC_LEN, format!("{ATOMIC_LEN} B (atomic)")),
                (UD64_LEN, format!("{UD64_LEN} B (UD 64)")),
            ])
            .collect();
        for (size, label) in sizes {
            // A row only where something at this size was measured (not with --only).
            let measured = Mode::ALL.iter().any(|mode| {
                by_id
                    .get(format!("limit/{l}/{}/{size}", mode.name()).as_str())
                    .is_some_and(|m| !m.runs.is_empty())
            });
            if !measured {
                continue;
            }
            let _ = write!(md, "| {l} | {label} |");
            for mode in Mode::ALL {
                let id = format!("limit/{l}/{}/{size}", mode.name());
                let _ = write!(
                    md,
                    " {} | {} |",
                    val(&id, "bytes_per_s", 1e9),
                    val(&id, "ops_per_s", 1e6)
                );
            }
            md.push('\n');
        }
    }
    let _ = writeln!(
        md,
        "\n| link | 64-B UDP ping-pong | RTT median µs | p99 | p99.9 |\n|---|---|---|---|---|"
    );
    for l in &links {
        for r in RecvMode::ALL {
            let id = format!("limit/{l}/pingpong/{}/64", r.name());
            if by_id.get(id.as_str()).is_none_or(|m| m.runs.is_empty()) {
                continue;
            }
            let _ = writeln!(
                md,
                "| {l} | {} | {} | {} | {} |",
                r.name(),
                val(&id, "median_us", 1.0),
                val(&id, "p99_us", 1.0),
                val(&id, "p999_us", 1.0)
            );
        }
    }
    let _ = writeln!(md, "\n## Peers, raw\n");
    let _ = writeln!(md, "| measurement | GB/s | M/s | RTT µs | command (client; server in the same form without the address) |\n|---|---|---|---|---|");
    for m in ms
        .iter()
        .filter(|m| !m.id.starts_with("limit/") && !m.id.starts_with("ours/"))
    {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | `{}` |",
            m.id,
            val(&m.id, "bytes_per_s", 1e9),
            val(&m.id, "ops_per_s", 1e6),
            val(&m.id, "median_us", 1.0),
            m.commands.last().map_or("", String::as_str)
        );
    }
    let _ = writeln!(
        md,
        "\nPeer packages: {}.",
        meta["peer_versions"]
            .as_array()
            .map(|v| v
                .iter()
                .map(|x| x.as_str().unwrap_or(""))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let failed: Vec<&Measurement> = ms
        .iter()
        .filter(|m| !m.errors.is_empty() || m.skipped > 0)
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "\n## Failures and skips\n");
        for m in failed {
            let _ = writeln!(
                md,
                "- `{}`: {} failed, {} skipped{}",
                m.id,
                m.errors.len(),
                m.skipped,
                m.errors.first().map_or(String::new(), |e| format!(
                    ": {}",
                    e.lines().next().unwrap_or("")
                ))
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_file_parses() {
        let dir = std::env::temp_dir().join(format!("rb-ours-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ours.cmds");
        std::fs::write(
            &p,
            "# comment\nrc-write-bw   {exec_a}rocectl write-bw --size {size}\nrc-read-bw\n",
        )
        .unwrap();
        let o = read_ours(&p).unwrap();
        assert_eq!(o["rc-write-bw"], "{exec_a}rocectl write-bw --size {size}");
        assert_eq!(o["rc-read-bw"], "");
        let vars = BTreeMap::from([
            ("exec_a", "ip netns exec x ".to_string()),
            ("size", "4096".to_string()),
        ]);
        assert_eq!(
            expand(&o["rc-write-bw"], &vars),
            "ip netns exec x rocectl write-bw --size 4096"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_shipped_hook_file_names_every_kind() {
        let o = read_ours(&Path::new(env!("CARGO_MANIFEST_DIR")).join(OURS_FILE)).unwrap();
        for f in figures(&Link::loopback()) {
            assert!(
                o.contains_key(f.kind),
                "{} missing from {OURS_FILE}",
                f.kind
            );
        }
    }

    #[test]
    fn every_figure_points_at_a_measurement() {
        let lo = Link::loopback();
        let opts = Options::default();
        let (ms, figs) = measurements(&[&lo], &opts, &BTreeMap::new());
        let ids: std::collections::BTreeSet<&str> = ms.iter().map(|m| m.id.as_str()).collect();
        for f in &figs {
            // A figure may be relative to another of ours (the 2-QP scaling figure).
            assert!(
                ids.contains(f.limit.as_str()) || f.limit.starts_with("ours/"),
                "{}: {}",
                f.id,
                f.limit
            );
            for p in f.peers.iter().flatten().chain(&f.mmsg) {
                assert!(ids.contains(p.as_str()), "{}: {p}", f.id);
            }
            if f.metric != Metric::Latency && !f.limit.starts_with("ours/") {
                assert!(f.limit.contains("/gso/"), "{}: the limit is GSO/GRO", f.id);
                assert!(f.mmsg.is_some(), "{}: sendmmsg kept as a reference", f.id);
            }
        }
        // Bandwidth, the four QP-scaling rows, the two rates, the latencies.
        assert_eq!(figs.len(), 3 * 2 * 3 + 4 + 2 + 3 * 2);
    }

    /// `--only` keeps the measurements whose id contains any of its comma-separated parts.
    #[test]
    fn only_takes_a_list() {
        let lo = Link::loopback();
        let opts = Options {
            filter: Some("mmsg/88,pingpong/busy".into()),
            ..Options::default()
        };
        let (ms, _) = measurements(&[&lo], &opts, &BTreeMap::new());
        let ids: Vec<&str> = ms.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["limit/lo/mmsg/88", "limit/lo/pingpong/busy/64"]);
    }

    /// The limit tables list only links the limit was measured on, and only sizes with a
    /// result; the main table shows the GSO/GRO limit and the sendmmsg reference.
    #[test]
    fn the_report_shows_gso_limits_and_no_empty_rows() {
        let lo = Link::loopback();
        let opts = Options::default();
        let ours = BTreeMap::from([("rc-write-bw".to_string(), "true".to_string())]);
        let (mut ms, figs) = measurements(&[&lo], &opts, &ours);
        let put = |ms: &mut Vec<Measurement>, id: &str, key: &str, v: f64| {
            let m = ms
                .iter_mut()
                .find(|m| m.id == id)
                .unwrap_or_else(|| panic!("{id}"));
            m.runs.push(BTreeMap::from([(key.to_string(), v)]));
        };
        put(&mut ms, "limit/lo/gso/4112", "bytes_per_s", 4.0e9);
        put(&mut ms, "limit/lo/mmsg/4112", "bytes_per_s", 1.0e9);
        put(
            &mut ms,
            "ours/rc-write-bw/lo/pmtu4096/65536",
            "bytes_per_s",
            2.0e9,
        );
        put(&mut ms, "limit/lo/pingpong/busy/64", "median_us", 7.0);
        let r = render(&ms, &figs, &json!({}), &opts);
        let row = r
            .table
            .lines()
            .find(|l| l.starts_with("| RC WRITE BW 64 KiB PMTU 4096 lo |"))
            .expect("the row");
        assert!(row.contains("| 4.000 GB/s"), "{row}");
        assert!(row.contains("| 0.50× |"), "ours / GSO limit: {row}");
        assert!(row.contains("| 2.00× |"), "ours / sendmmsg: {row}");
        let limit_rows: Vec<&str> = r
            .markdown
            .lines()
            .filter(|l| l.starts_with("| lo |") || l.starts_with("| rc-"))
            .collect();
        assert_eq!(limit_rows.len(), 2, "{limit_rows:#?}");
        assert!(limit_rows[0].starts_with("| lo | 4112 B (4096) |"));
        assert!(limit_rows[1].starts_with("| lo | busy |"));
    }
}
