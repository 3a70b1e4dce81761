//! `rocectl coll launch -n N --link lo|veth [--mtu M] [--loss P] [--drill …] -- CMD ARGS…`:
//! N ranks of a command, each in its own network namespace on a bridge (`veth`), or all in one
//! namespace that has only loopback (`lo`), with the environment torchrun sets. For tests and
//! benchmarks only (it needs root).
//!
//! - **veth**: namespaces `rcl-<pid>-r<i>` hold `eth0` = 198.18.0.(i+1)/24, MTU 9000 by default;
//!   their peers are ports of `br0` in `rcl-<pid>-br`. `MASTER_ADDR` is rank 0's address.
//! - **lo**: one namespace `rcl-<pid>-lo`; rank i uses 127.0.0.(i+1) (a rocectl device binds
//!   `IP:4791`, so every rank needs its own address). `MASTER_ADDR` is 127.0.0.1.
//! - Every rank gets `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `LOCAL_WORLD_SIZE`, and `ROCECTL_COLL_ADDR` / `ROCECTL_COLL_IFACE` (its address and
//!   interface); the launchers' other variables (`OMPI_COMM_WORLD_*`, `PMI_*`, `SLURM_*`) are
//!   removed so that the ranks do not mistake an outer job for theirs.
//! - Output: every line a rank writes goes to the same stream of ours, prefixed `[rank<i>] `.
//! - Failure: when a rank exits non-zero, the others have `--grace` seconds to end by
//!   themselves, then their process groups are killed. The exit status is the first non-zero
//!   one (128 + the signal for a rank a signal ended). `--timeout` bounds the whole run
//!   (status 124). SIGINT, SIGTERM and SIGHUP kill the ranks and exit 128 + the signal.
//! - The namespaces are deleted on every way out; ones a killed launcher left behind (their
//!   pid is gone) are deleted by the next launch.
//! - Loss: the kernel has no `sch_netem` here, so `--loss P` is an nftables rule dropping P %
//!   of the packets each rank sends (netdev egress on `eth0` for veth, which also catches the
//!   `raw` backend's frames; the output hook on lo). Veth ranks get fixed MACs and permanent
//!   neighbour entries for each other, so no ARP runs (the rule would drop it too, and a lost
//!   ARP is retried only after a second). `--delay` needs `sch_netem` and says so
//!   when the kernel lacks it.
//! - Drills (`--drill kill:R@S`, `partition:R@S`, `abort:R@S`): S seconds after the start,
//!   SIGKILL rank R's process group; drop every frame to and from rank R on its bridge port
//!   (veth only); or send rank R SIGUSR1 (`rocectl coll-perf` aborts its communicator on
//!   it). The launcher then prints one line per rank with its exit status and the time from
//!   the drill to its exit.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Where the namespaces live.
const NETNS_DIR: &str = "/run/netns";
/// Prefix of every namespace a launch creates: `rcl-<pid>-…`.
const PREFIX: &str = "rcl";
/// The subnet of the veth ranks (198.18.0.0/15 is for benchmarking, RFC 2544).
const VETH_NET: &str = "198.18.0";
/// nftables table names.
const LOSS_TABLE: &str = "rcl_loss";
const PART_TABLE: &str = "rcl_part";
/// The largest rank count (addresses .1 to .250, one core can hold no more anyway).
const MAX_RANKS: u16 = 250;

/// How the ranks are connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Link {
    /// All ranks in one namespace that has only loopback, each on its own 127.0.0.x
    Lo,
    /// Each rank in its own namespace with a veth, all bridged (MTU 9000 by default)
    Veth,
}

/// What a drill does to its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DrillKind {
    /// SIGKILL of the rank's process group.
    Kill,
    /// Every frame to and from the rank dropped (veth only).
    Partition,
    /// SIGUSR1 to the rank (coll-perf aborts its communicator).
    Abort,
}

/// A fault injected into one rank at a time after the start: `kind:RANK@SECONDS`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Drill {
    kind: DrillKind,
    rank: u16,
    at: Duration,
}

impl fmt::Display for Drill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DrillKind::Kill => "kill",
            DrillKind::Partition => "partition",
            DrillKind::Abort => "abort",
        };
        write!(f, "{kind}:{}@{}", self.rank, self.at.as_secs_f64())
    }
}

/// Parses `kind:RANK@SECONDS`.
fn parse_drill(s: &str) -> Result<Drill, String> {
    let bad = || format!("'{s}': a drill is kill|partition|abort:RANK@SECONDS, e.g. kill:1@2.5");
    let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
    let (rank, at) = rest.split_once('@').ok_or_else(bad)?;
    let kind = match kind {
        "kill" => DrillKind::Kill,
        "partition" => DrillKind::Partition,
        "abort" => DrillKind::Abort,
        _ => return Err(bad()),
    };
    let rank = rank.parse::<u16>().map_err(|_| bad())?;
    let at = parse_seconds(at).map_err(|_| bad())?;
    Ok(Drill { kind, rank, at })
}

/// Parses a non-negative number of seconds (at most a day).
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&v) {
        return Err(format!("{s} s: between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Parses a loss percentage, 0 to 100 (hundredths of a percent are kept).
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s}: a loss is between 0 and 100 %"));
    }
    Ok(v)
}

/// `rocectl coll launch` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct LaunchArgs {
    /// Number of ranks
    #[arg(short = 'n', long = "np", value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_RANKS)))]
    np: u16,
    /// How the ranks are connected
    #[arg(long, value_enum, default_value = "veth")]
    link: Link,
    /// Interface MTU (veth: default 9000; lo: left as it is, 65536)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    mtu: Option<u32>,
    /// Drop this percentage of the packets every rank sends (nftables; 0-100, e.g. 1 or 0.5)
    #[arg(long, value_parser = parse_percent)]
    loss: Option<f64>,
    /// Delay every packet (tc netem syntax, e.g. 100us); needs the kernel's sch_netem
    #[arg(long)]
    delay: Option<String>,
    /// Seconds the other ranks have to end by themselves after one failed, before they are
    /// killed
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    grace: Duration,
    /// Seconds the whole run may take; then every rank is killed (exit status 124)
    #[arg(long, default_value = "600", value_parser = parse_seconds)]
    timeout: Duration,
    /// Inject a fault: kill:RANK@S (SIGKILL), partition:RANK@S (drop all its frames; veth),
    /// abort:RANK@S (SIGUSR1: coll-perf aborts its communicator); repeatable
    #[arg(long = "drill", value_parser = parse_drill)]
    drills: Vec<Drill>,
    /// MASTER_PORT, the rendezvous port on rank 0
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// The command each rank runs, and its arguments
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs `rocectl coll launch`.
pub(crate) fn run(args: &LaunchArgs) -> anyhow::Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!("coll launch needs root: it creates network namespaces (run it with sudo)");
    }
    for d in &args.drills {
        if d.rank >= args.np {
            bail!("drill {d}: there are only {} ranks", args.np);
        }
        if d.kind == DrillKind::Partition && args.link != Link::Veth {
            bail!("drill {d}: a partition needs --link veth (on lo all ranks share one interface)");
        }
    }
    if args.delay.is_some() && !netem_available() {
        bail!(
            "--delay needs tc netem, and this kernel has no sch_netem module (use --loss, \
             which does not need it)"
        );
    }
    // Signals first: a Ctrl-C while the namespaces are being made must still delete them.
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [
        libc_sig(Signal::SIGINT),
        libc_sig(Signal::SIGTERM),
        libc_sig(Signal::SIGHUP),
    ] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
            .context("installing the signal handlers")?;
    }
    remove_stale();
    let topo = Topology::create(args, &signal)?;
    let code = supervise(args, &topo, &signal);
    drop(topo);
    code
}

fn libc_sig(s: Signal) -> i32 {
    s as i32
}

/// The namespaces of one launch; deleted on drop.
struct Topology {
    link: Link,
    /// Namespace of each rank (the same one for every rank on lo).
    rank_ns: Vec<String>,
    /// The bridge's namespace (veth).
    bridge_ns: Option<String>,
    /// Every namespace made, to delete.
    made: Vec<String>,
}

impl Topology {
    fn create(args: &LaunchArgs, signal: &AtomicUsize) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let mut t = Self {
            link: args.link,
            rank_ns: Vec::new(),
            bridge_ns: None,
            made: Vec::new(),
        };
        let interrupted = || -> anyhow::Result<()> {
            match signal.load(Ordering::Relaxed) {
                0 => Ok(()),
                s => bail!("interrupted by signal {s} while making the namespaces"),
            }
        };
        match args.link {
            Link::Lo => {
                let ns = format!("{PREFIX}-{pid}-lo");
                t.add_ns(&ns)?;
                if let Some(mtu) = args.mtu {
                    ip(&["-n", &ns, "link", "set", "lo", "mtu", &mtu.to_string()])?;
                }
                t.rank_ns = vec![ns; usize::from(args.np)];
            }
            Link::Veth => {
                let mtu = args.mtu.unwrap_or(9000).to_string();
                let br = format!("{PREFIX}-{pid}-br");
                t.add_ns(&br)?;
                t.bridge_ns = Some(br.clone());
                ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
                for i in 0..args.np {
                    interrupted()?;
                    let ns = format!("{PREFIX}-{pid}-r{i}");
                    t.add_ns(&ns)?;
                    let port = format!("v{i}");
                    ip(&[
                        "-n", &br, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer",
                        "name", "eth0", "mtu", &mtu, "netns", &ns,
                    ])?;
                    ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"])?;
                    let addr = format!("{VETH_NET}.{}/24", i + 1);
                    ip(&[
                        "-n",
                        &ns,
                        "link",
                        "set",
                        "eth0",
                        "address",
                        &rank_mac(usize::from(i)),
                    ])?;
                    ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
                    ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
                    t.rank_ns.push(ns);
                }
                ip(&["-n", &br, "link", "set", "br0", "mtu", &mtu, "up"])?;
                // Every rank knows every other's MAC from the start (permanent neighbour
                // entries): no ARP. With `--loss` the egress rule drops ARP frames too, and
                // a lost ARP request or reply is retried only after a second, longer than a
                // collective QP's whole retry budget (~0.5 s), so the first message between
                // two ranks failed with RETRY_EXC_ERR in ~6% of the pairs at 3% loss.
                for (i, ns) in t.rank_ns.iter().enumerate() {
                    let batch: String = (0..usize::from(args.np))
                        .filter(|j| *j != i)
                        .map(|j| {
                            format!(
                                "neigh replace {VETH_NET}.{} lladdr {} dev eth0 nud permanent\n",
                                j + 1,
                                rank_mac(j)
                            )
                        })
                        .collect();
                    run_tool("ip", &["-n", ns, "-batch", "-"], Some(&batch))?;
                }
            }
        }
        interrupted()?;
        if let Some(p) = args.loss.filter(|p| *p > 0.0) {
            t.set_loss(p)?;
        }
        if let Some(d) = &args.delay {
            t.set_delay(d)?;
        }
        Ok(t)
    }

    fn add_ns(&mut self, ns: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// Rank `i`'s address and interface.
    fn addr(&self, i: usize) -> (String, &'static str) {
        match self.link {
            Link::Lo => (format!("127.0.0.{}", i + 1), "lo"),
            Link::Veth => (format!("{VETH_NET}.{}", i + 1), "eth0"),
        }
    }

    fn unique_rank_ns(&self) -> Vec<&String> {
        let mut v: Vec<&String> = self.rank_ns.iter().collect();
        v.dedup();
        v
    }

    fn set_loss(&self, percent: f64) -> anyhow::Result<()> {
        // Hundredths of a percent: numgen over 10000.
        let n = (percent * 100.0).round() as u32;
        let rule = if n >= 10_000 {
            "drop".to_string()
        } else {
            format!("numgen random mod 10000 < {n} drop")
        };
        for ns in self.unique_rank_ns() {
            let script = match self.link {
                Link::Veth => format!(
                    "table netdev {LOSS_TABLE} {{\n\tchain egress {{\n\t\ttype filter hook egress \
                     device \"eth0\" priority 0; policy accept;\n\t\t{rule}\n\t}}\n}}\n"
                ),
                Link::Lo => format!(
                    "table inet {LOSS_TABLE} {{\n\tchain out {{\n\t\ttype filter hook output \
                     priority 0; policy accept;\n\t\t{rule}\n\t}}\n}}\n"
                ),
            };
            nft(ns, &script).with_context(|| format!("--loss {percent}"))?;
        }
        Ok(())
    }

    fn set_delay(&self, delay: &str) -> anyhow::Result<()> {
        let dev = if self.link == Link::Veth {
            "eth0"
        } else {
            "lo"
        };
        for ns in self.unique_rank_ns() {
            run_tool(
                "tc",
                &[
                    "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", delay,
                ],
                None,
            )
            .with_context(|| format!("--delay {delay}"))?;
        }
        Ok(())
    }

    /// Drops every frame to and from rank `i` on its bridge port, both ways.
    fn partition(&self, i: usize) -> anyhow::Result<()> {
        let br = self
            .bridge_ns
            .as_deref()
            .context("a partition needs the veth bridge")?;
        let script = format!(
            "table netdev {PART_TABLE}{i} {{\n\tchain in {{\n\t\ttype filter hook ingress device \
             \"v{i}\" priority 0; policy drop;\n\t}}\n\tchain out {{\n\t\ttype filter hook egress \
             device \"v{i}\" priority 0; policy drop;\n\t}}\n}}\n"
        );
        nft(br, &script)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "delete", ns]) {
                eprintln!("rocectl coll launch: cannot delete namespace {ns}: {e:#}");
            }
        }
    }
}

/// Deletes the namespaces of launches whose process is gone.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.splitn(3, '-');
        let (Some(PREFIX), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

/// Whether `tc` can make a netem qdisc (the module is built in or loadable).
fn netem_available() -> bool {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let module = std::path::Path::new("/lib/modules")
        .join(release)
        .join("kernel/net/sched");
    let loadable = std::fs::read_dir(module)
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("sch_netem"))
        })
        .unwrap_or(false);
    let loaded = std::fs::read_to_string("/proc/modules")
        .map(|m| m.lines().any(|l| l.starts_with("sch_netem ")))
        .unwrap_or(false);
    loadable || loaded
}

/// Rank `i`'s MAC address on the veth link (locally administered).
fn rank_mac(i: usize) -> String {
    format!("02:52:43:4c:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run_tool("ip", args, None)
}

fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
    run_tool("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(script))
}

/// Runs a short-lived tool (`ip`, `tc`, `nft`); its standard error becomes the error.
fn run_tool(program: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let line = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program} (is iproute2/nftables installed?)"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .with_context(|| format!("{line}: writing its input"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            bail!("{line}: {}", err.trim());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{line}: no answer within 20 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One rank's process and what became of it.
struct Rank {
    child: Child,
    /// Process group (= the child's pid).
    pgid: Pid,
    exit: Option<(ExitStatus, Instant)>,
    /// The launcher killed it (grace period over, timeout, signal).
    killed: bool,
    forwarders: Vec<JoinHandle<()>>,
}

/// The exit status of a rank as a shell reports it (128 + signal).
fn status_code(s: ExitStatus) -> i32 {
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

/// Environment variables of other launchers, removed from the ranks'.
fn foreign_launcher_var(name: &str) -> bool {
    name.starts_with("OMPI_COMM_WORLD_")
        || name.starts_with("PMI_")
        || name.starts_with("PMIX_RANK")
        || name.starts_with("SLURM_")
}

fn spawn_rank(args: &LaunchArgs, topo: &Topology, i: usize) -> anyhow::Result<Rank> {
    let (addr, ifname) = topo.addr(i);
    let (master, _) = topo.addr(0);
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &topo.rank_ns[i]])
        .args(&args.command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for (k, _) in std::env::vars_os() {
        if foreign_launcher_var(&k.to_string_lossy()) {
            cmd.env_remove(&k);
        }
    }
    cmd.env("MASTER_ADDR", &master)
        .env("MASTER_PORT", args.master_port.to_string())
        .env("RANK", i.to_string())
        .env("WORLD_SIZE", args.np.to_string())
        .env("LOCAL_RANK", i.to_string())
        .env("LOCAL_WORLD_SIZE", args.np.to_string())
        .env("ROCECTL_COLL_ADDR", &addr)
        .env("ROCECTL_COLL_IFACE", ifname);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting rank {i} ({})", args.command.join(" ")))?;
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut forwarders = Vec::new();
    if let Some(out) = child.stdout.take() {
        forwarders.push(forward(out, i, false));
    }
    if let Some(err) = child.stderr.take() {
        forwarders.push(forward(err, i, true));
    }
    Ok(Rank {
        child,
        pgid,
        exit: None,
        killed: false,
        forwarders,
    })
}

/// Copies a rank's stream line by line to ours, prefixed `[rank<i>] `.
fn forward(stream: impl Read + Send + 'static, rank: usize, stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    let prefix = format!("[rank{rank}] ");
                    // A closed stdout of ours (`| head`) ends the copy, not the ranks.
                    let ok = if stderr {
                        let mut e = std::io::stderr().lock();
                        e.write_all(prefix.as_bytes())
                            .and_then(|()| e.write_all(&line))
                    } else {
                        let mut o = std::io::stdout().lock();
                        o.write_all(prefix.as_bytes())
                            .and_then(|()| o.write_all(&line))
                            .and_then(|()| o.flush())
                    };
                    if ok.is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// Signals the process group of every rank still running; `SIGKILL` after `SIGTERM` had
/// a second.
fn kill_all(ranks: &mut [Rank]) {
    for r in ranks.iter_mut().filter(|r| r.exit.is_none()) {
        r.killed = true;
        let _ = killpg(r.pgid, Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline && reap(ranks) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for r in ranks.iter_mut().filter(|r| r.exit.is_none()) {
        let _ = killpg(r.pgid, Signal::SIGKILL);
        if let Ok(s) = r.child.wait() {
            r.exit = Some((s, Instant::now()));
        }
    }
}

/// Records the ranks that exited; whether some still run.
fn reap(ranks: &mut [Rank]) -> bool {
    let mut running = false;
    for r in ranks.iter_mut().filter(|r| r.exit.is_none()) {
        match r.child.try_wait() {
            Ok(Some(s)) => r.exit = Some((s, Instant::now())),
            Ok(None) => running = true,
            Err(_) => r.exit = Some((ExitStatus::from_raw(0x7f00), Instant::now())),
        }
    }
    running
}

fn supervise(args: &LaunchArgs, topo: &Topology, signal: &AtomicUsize) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut ranks: Vec<Rank> = Vec::new();
    for i in 0..usize::from(args.np) {
        match spawn_rank(args, topo, i) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                kill_all(&mut ranks);
                return Err(e);
            }
        }
    }
    let mut pending: Vec<Drill> = args.drills.clone();
    pending.sort_by_key(|d| d.at);
    let mut fired: Option<(Drill, Instant)> = None;
    let mut first_failure: Option<(usize, i32)> = None;
    let mut grace_until: Option<Instant> = None;
    let mut outcome: Option<i32> = None;
    loop {
        let running = reap(&mut ranks);
        for (i, r) in ranks.iter().enumerate() {
            if let Some((s, _)) = r.exit {
                if !s.success() && first_failure.is_none() {
                    first_failure = Some((i, status_code(s)));
                    grace_until = Some(Instant::now() + args.grace);
                }
            }
        }
        if !running {
            break;
        }
        let sig = signal.load(Ordering::Relaxed);
        if sig != 0 {
            eprintln!("rocectl coll launch: signal {sig}: killing the ranks");
            kill_all(&mut ranks);
            outcome = Some(128 + i32::try_from(sig).unwrap_or(0));
            break;
        }
        if start.elapsed() > args.timeout {
            eprintln!(
                "rocectl coll launch: the run took more than {} s (--timeout): killing the ranks",
                args.timeout.as_secs_f64()
            );
            kill_all(&mut ranks);
            outcome = Some(124);
            break;
        }
        if grace_until.is_some_and(|g| Instant::now() > g) {
            eprintln!(
                "rocectl coll launch: ranks still running {} s after rank {} failed: killing them",
                args.grace.as_secs_f64(),
                first_failure.map_or(0, |f| f.0)
            );
            kill_all(&mut ranks);
            break;
        }
        while pending.first().is_some_and(|d| start.elapsed() >= d.at) {
            let d = pending.remove(0);
            let r = &ranks[usize::from(d.rank)];
            let res = match d.kind {
                DrillKind::Kill => killpg(r.pgid, Signal::SIGKILL).map_err(anyhow::Error::from),
                DrillKind::Abort => nix::sys::signal::kill(
                    Pid::from_raw(i32::try_from(r.child.id()).unwrap_or(i32::MAX)),
                    Signal::SIGUSR1,
                )
                .map_err(anyhow::Error::from),
                DrillKind::Partition => topo.partition(usize::from(d.rank)),
            };
            let now = Instant::now();
            match res {
                Ok(()) => eprintln!(
                    "rocectl coll launch: drill {d} at {:.3} s",
                    now.duration_since(start).as_secs_f64()
                ),
                Err(e) => eprintln!("rocectl coll launch: drill {d} failed: {e:#}"),
            }
            fired.get_or_insert((d, now));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The ranks are gone; their pipes end (a leftover grandchild may hold one: do not wait
    // for it forever).
    let deadline = Instant::now() + Duration::from_secs(2);
    for r in &mut ranks {
        for f in r.forwarders.drain(..) {
            while !f.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if f.is_finished() {
                let _ = f.join();
            }
        }
    }
    for (i, r) in ranks.iter().enumerate() {
        let Some((s, at)) = r.exit else { continue };
        if s.success() && fired.is_none() {
            continue;
        }
        let how = if r.killed {
            " (killed by the launcher)".to_string()
        } else if let Some(sig) = s.signal() {
            format!(" (signal {sig})")
        } else {
            String::new()
        };
        let after = fired.map_or(String::new(), |(d, t)| {
            let dt = at.saturating_duration_since(t).as_secs_f64();
            format!(", {dt:.3} s after drill {d}")
        });
        eprintln!(
            "rocectl coll launch: rank {i}: exit status {}{how} at {:.3} s{after}",
            status_code(s),
            at.duration_since(start).as_secs_f64()
        );
    }
    let code = outcome.unwrap_or_else(|| first_failure.map_or(0, |f| f.1));
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drills_parse_and_bad_ones_say_what_a_drill_is() {
        let d = parse_drill("kill:1@2.5").unwrap();
        assert_eq!(
            (d.kind, d.rank, d.at),
            (DrillKind::Kill, 1, Duration::from_millis(2500))
        );
        assert_eq!(
            parse_drill("partition:0@0").unwrap().kind,
            DrillKind::Partition
        );
        assert_eq!(parse_drill("abort:3@1").unwrap().to_string(), "abort:3@1");
        for bad in [
            "kill",
            "kill:1",
            "stab:1@2",
            "kill:x@2",
            "kill:1@-1",
            "kill:1@nan",
        ] {
            let e = parse_drill(bad).unwrap_err();
            assert!(
                e.contains("kill|partition|abort:RANK@SECONDS"),
                "{bad}: {e}"
            );
        }
        assert_eq!(parse_percent("0.5%").unwrap(), 0.5);
        assert!(parse_percent("101").is_err());
        assert!(parse_seconds("1e9").is_err());
    }

    #[test]
    fn foreign_launchers_variables_are_recognised() {
        for v in [
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "SLURM_PROCID",
            "PMIX_RANK",
        ] {
            assert!(foreign_launcher_var(v), "{v}");
        }
        for v in ["RANK", "MASTER_ADDR", "PATH", "OMPI_MCA_btl"] {
            assert!(!foreign_launcher_var(v), "{v}");
        }
    }
}
