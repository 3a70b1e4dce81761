//! `rocectl send-bw`, `write-bw`, `read-bw`, `atomic-bw`, `send-lat`, `write-lat`,
//! `read-lat`: perftest's tools (`ib_send_bw` …) on the userspace stack, with perftest 6.06's
//! options, out-of-band exchange ([`crate::oob::perftest`]) and result tables, so each one
//! talks to the matching stock tool in either role. Server without a host, client with one.
//!
//! - [`session`]: device, buffer, queues, the exchange up to the last barrier, the QP
//!   connected;
//! - [`bw`]: bandwidth: the client keeps `-t` requests in flight (posted in batches with one
//!   doorbell), a SEND server keeps `-r` receives posted, a WRITE/READ/atomic server is
//!   passive;
//! - [`lat`]: latency, ping-pong: SEND/RECV, RDMA WRITE of the peer's buffer polled on its
//!   last byte (the server writes first), READ by the client;
//! - [`report`]: perftest's tables and the `--json` line for `benches/ours.cmds`;
//! - [`chk`]: `--chk` of `write-bw` and `send-bw`, a rocectl extension (perftest has no data
//!   check): the server verifies its whole buffer at the end (what it proves: see there).
//!
//! Waiting is busy polling of the completion queue by default ([`CompletionQueue::poll`] runs
//! the engine itself when it finds nothing); `-e` blocks in [`CompletionQueue::wait`].
//!
//! [`CompletionQueue::poll`]: roce_transport::CompletionQueue::poll
//! [`CompletionQueue::wait`]: roce_transport::CompletionQueue::wait

mod bw;
mod chk;
mod lat;
mod report;
mod session;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, ValueEnum};
use roce_transport::{Mtu, Progress, QpType};

use crate::device::{engines_setting, BackendKind, Engines};
use crate::limits;
use crate::oob::perftest::{Role, Tool};
use crate::oob::{Timeout, DEFAULT_PORT};

/// Most queue pairs of `-q`.
const MAX_QPS: u32 = 64;

/// Connection type (`-c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ConnType {
    /// Reliable connection.
    #[value(name = "RC")]
    Rc,
    /// Unreliable connection (SEND and WRITE tests).
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram (SEND tests).
    #[value(name = "UD")]
    Ud,
}

/// Atomic operation of `atomic-bw` (`-A`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum AtomicType {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add.
    #[default]
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    /// perftest's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::CmpAndSwap => "CMP_AND_SWAP",
            Self::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// Polling latency and atomic tests (busy: the default without `-e` or `--recv block`): how
/// long an engine thread polls on after a pass that received something (the passive side of
/// READ/WRITE/atomic latency: answered without a wake-up).
const ENGINE_SPIN: Duration = Duration::from_micros(50);

/// How a tool waits for completions (`--recv`; `block` is `-e`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum RecvMode {
    /// Poll in a loop (the engine runs in the polling thread).
    Busy,
    /// Sleep until something arrives.
    Block,
}

/// Who drives the device's engine (`--progress`, for experiments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProgressArg {
    /// An engine thread per engine of the device (`--engines`).
    Thread,
    /// The tool's own polling (nothing runs the engine while it waits on TCP).
    Manual,
}

/// Options of every perftest tool (each tool refuses the ones it has no use for).
#[derive(Debug, Args)]
pub(crate) struct PerfArgs {
    /// The server to connect to (client); without it, wait for a client (server)
    host: Option<String>,
    /// TCP port of the out-of-band exchange
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// The network interface that is the RDMA device (default: the one routing to the server)
    #[arg(short = 'd', long = "ib-dev", value_name = "IFNAME")]
    ib_dev: Option<String>,
    /// Port of the device (there is one: 1)
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index in the interface's rxe-style table (default: the address routing to the
    /// server, else the first IPv4 GID)
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u8>,
    /// Use this local address (udp backend on IP:4791) instead of -d/-x; e.g. two loopback
    /// addresses for a server and a client on one host
    #[arg(long, value_name = "IP", conflicts_with_all = ["ib_dev", "gid_index"])]
    local: Option<IpAddr>,
    /// Message size in bytes (bandwidth: 65536, latency: 2; atomics are 8)
    #[arg(short = 's', long)]
    size: Option<u64>,
    /// Iterations (bandwidth: 5000, latency: 1000)
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Every size from 2 to 2^23 bytes
    #[arg(short = 'a', long)]
    all: bool,
    /// Path MTU (256, 512, 1024, 2048, 4096; default: the device's active MTU)
    #[arg(short = 'm', long)]
    mtu: Option<usize>,
    /// Connection type: RC, UC (send, write) or UD (send)
    #[arg(short = 'c', long = "connection", ignore_case = true)]
    connection: Option<ConnType>,
    /// Requests in flight (bandwidth clients)
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: usize,
    /// Receives posted (SEND tests)
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: usize,
    /// Outstanding RDMA READs/atomics (read and atomic tests; default: the device's maximum)
    #[arg(short = 'o', long = "outs")]
    outs: Option<u8>,
    /// Atomic operation (atomic-bw)
    #[arg(short = 'A', long = "atomic_type", ignore_case = true)]
    atomic_type: Option<AtomicType>,
    /// RC ACK timeout: 4.096 us x 2^N before a retry (perftest's -u)
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// Signal one send in this many (bandwidth tests)
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    cq_mod: u64,
    /// Do not compute the peak bandwidth
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Sleep on completion events instead of busy polling
    #[arg(short = 'e', long)]
    events: bool,
    /// How to wait: busy (poll, the default) or block (as -e). Busy latency and atomic tests
    /// also keep an engine thread polling for 50 us after each request it answers (the
    /// passive side of READ, atomics)
    #[arg(long, value_enum)]
    recv: Option<RecvMode>,
    /// Ignored (perftest: do not fail on CPU frequency differences)
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Queue pairs (write-bw, read-bw, atomic-bw): each side opens N QPs on its device and
    /// the client runs -n messages on each, keeping -t in flight per QP; the bandwidth is
    /// the sum
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Engines of the device, 1 to 64 (each with its own thread and socket, the QPs spread
    /// over them; udp backend): default ROCECTL_ENGINES, else min(-q, CPUs)
    #[arg(long, value_name = "N")]
    engines: Option<String>,
    /// Report bandwidth in Gb/sec instead of MB/sec
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Also print one JSON line with the results (bytes_per_s, ops_per_s; round-trip
    /// median_us, p99_us, p999_us)
    #[arg(long)]
    json: bool,
    /// Seconds to wait for each out-of-band step and for any completion
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    timeout: u64,
    /// Seconds a server waits for a client (default: for ever, as perftest)
    #[arg(long = "accept-timeout", value_name = "SECS")]
    accept_timeout: Option<u64>,
    /// Save every frame sent and received to this pcap file
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Datapath: a UDP socket on port 4791, or whole Ethernet frames (raw, needs
    /// CAP_NET_RAW; not with --local)
    #[arg(long, value_enum, default_value = "udp")]
    backend: BackendKind,
    /// Who drives the engine (default: the tool's polling where it polls, else a thread)
    #[arg(long, value_enum, hide = true)]
    progress: Option<ProgressArg>,
    /// Check the data (a rocectl extension, perftest has none; write-bw and send-bw over RC,
    /// one size, both sides): the client sends data from a random seed, stamped anew for
    /// every batch; at the end the server compares its whole buffer byte for byte with what
    /// the last request at each place must have left (and zeros elsewhere), and both sides
    /// exit with status 1 on any difference
    #[arg(long)]
    chk: bool,
    /// Testing --chk: the server flips the byte at this offset of its buffer before checking
    #[arg(long, hide = true, value_name = "OFFSET")]
    chk_corrupt: Option<u64>,
    /// RC requester window: packets in flight without an ACK (QpConfig::max_inflight_packets)
    #[arg(long, hide = true)]
    inflight: Option<u32>,
    /// Ask for an ACK at least every this many packets (QpConfig::ack_req_every)
    #[arg(long, hide = true)]
    ack_every: Option<u32>,
}

/// The options resolved for one tool and role.
#[derive(Debug)]
pub(crate) struct Config {
    tool: Tool,
    role: Role,
    host: Option<String>,
    port: u16,
    ib_dev: Option<String>,
    gid_index: Option<u8>,
    local: Option<IpAddr>,
    qp_type: QpType,
    /// `-q`: queue pairs.
    qps: u32,
    /// `--engines`, else `ROCECTL_ENGINES`, else min(`-q`, CPUs).
    engines: Engines,
    sizes: Vec<u64>,
    /// `-a` (UD keeps the sizes that fit the path MTU).
    all: bool,
    /// `-s` given (UD without it uses the path MTU, as perftest).
    size_given: bool,
    iters: u64,
    mtu: Option<Mtu>,
    tx_depth: usize,
    rx_depth: usize,
    out_reads: Option<u8>,
    atomic: AtomicType,
    cq_mod: u64,
    no_peak: bool,
    events: bool,
    gbits: bool,
    json: bool,
    timeout: Duration,
    accept_timeout: Timeout,
    pcap: Option<PathBuf>,
    backend: BackendKind,
    progress: Progress,
    /// The device's engine spin ([`roce_transport::DeviceConfig::engine_spin`]).
    engine_spin: Duration,
    inflight: Option<u32>,
    ack_every: Option<u32>,
    qp_timeout: u8,
    /// `--chk`.
    chk: bool,
    /// `--chk-corrupt`.
    chk_corrupt: Option<u64>,
}

impl Tool {
    /// A bandwidth test.
    fn is_bw(self) -> bool {
        matches!(
            self,
            Self::SendBw | Self::WriteBw | Self::ReadBw | Self::AtomicBw
        )
    }

    /// A test of RDMA READ or atomics (`-o` applies; the record carries it).
    fn uses_out_reads(self) -> bool {
        matches!(self, Self::ReadBw | Self::ReadLat | Self::AtomicBw)
    }

    /// rocectl's name for it.
    fn command(self) -> &'static str {
        match self {
            Self::SendBw => "send-bw",
            Self::WriteBw => "write-bw",
            Self::ReadBw => "read-bw",
            Self::AtomicBw => "atomic-bw",
            Self::SendLat => "send-lat",
            Self::WriteLat => "write-lat",
            Self::ReadLat => "read-lat",
        }
    }
}

impl Config {
    /// Checks `args` against what `tool` supports and fills in perftest's defaults.
    ///
    /// # Errors
    /// An option the tool does not take, or a value out of range.
    pub(crate) fn resolve(tool: Tool, a: &PerfArgs) -> anyhow::Result<Self> {
        let name = tool.command();
        let bw = tool.is_bw();
        let role = if a.host.is_some() {
            Role::Client
        } else {
            Role::Server
        };
        let conn = a.connection.unwrap_or(ConnType::Rc);
        let allowed: &[ConnType] = match tool {
            Tool::SendBw | Tool::SendLat => &[ConnType::Rc, ConnType::Uc, ConnType::Ud],
            Tool::WriteBw | Tool::WriteLat => &[ConnType::Rc, ConnType::Uc],
            Tool::ReadBw | Tool::ReadLat | Tool::AtomicBw => &[ConnType::Rc],
        };
        if !allowed.contains(&conn) {
            bail!("{name} does not support connection type {conn:?} (-c)");
        }
        if a.qps == 0 || a.qps > MAX_QPS {
            bail!("-q {}: between 1 and {MAX_QPS} queue pairs", a.qps);
        }
        if a.qps > 1 && !matches!(tool, Tool::WriteBw | Tool::ReadBw | Tool::AtomicBw) {
            bail!("-q above 1 is supported by write-bw, read-bw and atomic-bw");
        }
        if a.qps > 1 && a.chk {
            bail!("--chk checks one queue pair: drop -q");
        }
        if a.ib_port != 1 {
            bail!("the device has one port: -i 1, got -i {}", a.ib_port);
        }
        if a.atomic_type.is_some() && tool != Tool::AtomicBw {
            bail!("-A/--atomic_type is for atomic-bw only");
        }
        if a.outs.is_some() && !tool.uses_out_reads() {
            bail!("-o/--outs is for the read and atomic tests only");
        }
        if a.local.is_some() && a.backend != BackendKind::Udp {
            bail!("--local opens a udp device: drop --backend or use -d/-x");
        }
        if a.all && tool == Tool::AtomicBw {
            bail!("atomic-bw has one size (8 bytes): -a does not apply");
        }
        if a.outs == Some(0) || a.tx_depth == 0 || a.rx_depth == 0 || a.cq_mod == 0 {
            bail!("-o, -t, -r and -Q must be at least 1");
        }
        if a.chk {
            if !matches!(tool, Tool::WriteBw | Tool::SendBw) {
                bail!("--chk is for write-bw and send-bw (the pingpongs have their own)");
            }
            if conn != ConnType::Rc {
                bail!(
                    "--chk needs -c RC (UC and UD may lose messages, so the last one is not known)"
                );
            }
            if a.all {
                bail!("--chk checks one message size: drop -a");
            }
        }
        if a.chk_corrupt.is_some() && (!a.chk || role != Role::Server) {
            bail!("--chk-corrupt is for a --chk server");
        }
        let iters = a.iters.unwrap_or(if bw { 5_000 } else { 1_000 });
        if iters == 0 || (!bw && iters < 2) {
            bail!("-n must be at least {}", if bw { 1 } else { 2 });
        }
        // Counts and depths first: nothing is allocated or opened before they are known to fit.
        limits::check_count(
            "-n",
            iters,
            1,
            limits::MAX_PERF_ITERS,
            "one timestamp is kept per iteration",
        )?;
        limits::check_depth("-t", a.tx_depth as u64)?;
        limits::check_depth("-r", a.rx_depth as u64)?;
        for (opt, secs) in [
            ("--timeout", Some(a.timeout)),
            ("--accept-timeout", a.accept_timeout),
        ] {
            if let Some(secs) = secs {
                limits::check_count(opt, secs, 0, limits::MAX_TIMEOUT_SECS, "seconds")?;
            }
        }
        let mtu = match a.mtu {
            Some(m) => Some(Mtu::from_bytes(m).ok_or_else(|| {
                anyhow::anyhow!("-m {m}: the MTU is one of 256, 512, 1024, 2048, 4096")
            })?),
            None => None,
        };
        let sizes = if a.all {
            if a.size.is_some() {
                bail!("-a runs every size: drop -s");
            }
            (1..24).map(|i| 1u64 << i).collect()
        } else if tool == Tool::AtomicBw {
            if a.size.is_some_and(|s| s != 8) {
                bail!("atomics are 8 bytes: -s does not apply");
            }
            vec![8]
        } else {
            let s = a.size.unwrap_or(if bw { 65_536 } else { 2 });
            limits::check_size("-s", s, 1)?;
            vec![s]
        };
        // perftest: no more in flight than iterations, and a completion at least once per
        // window.
        let tx_depth = if bw {
            a.tx_depth.min(usize::try_from(iters).unwrap_or(usize::MAX))
        } else {
            1
        };
        let cq_mod = a.cq_mod.min(tx_depth as u64).max(1);
        let rx_depth = a.rx_depth.min(usize::try_from(iters).unwrap_or(usize::MAX));
        let busy = match a.recv {
            Some(RecvMode::Block) => false,
            Some(RecvMode::Busy) => true,
            None => !a.events,
        };
        let progress = match a.progress {
            Some(ProgressArg::Thread) => Progress::Thread,
            Some(ProgressArg::Manual) => Progress::Manual,
            // A side that waits on TCP while the peer's requests arrive needs the engine
            // thread; a side that polls its queues drives the engine itself. A busy-polling
            // SEND server too: with an engine thread beside it, the two fight over the engine
            // on a small machine, and the thread, receiving a whole pass of datagrams while
            // the poller is descheduled, empties the receive queue; UD then drops what
            // follows (64 B UD on loopback, 2 cores: 0.09-0.55 M/s delivered with 43-90%
            // lost, against 0.93-0.97 M/s and no loss polled with -r 16384).
            None => match (tool, role) {
                (Tool::SendBw, Role::Server) if busy => Progress::Manual,
                // A READ/atomic client receives every response where it waits: its polls (or
                // with -e its waits, which then run the engine in this thread) do the work an
                // engine thread beside it would, without the contention for the engine's lock
                // and the hop between threads (FETCH_ADD, 2 shared cores, load 6-7: -e 0.42-0.60
                // M/s on lo and 0.30-0.37 on veth at 1.0-1.3 us of client CPU per atomic; with
                // an engine thread 0.43-0.46 on lo when the machine was quieter).
                (Tool::ReadBw | Tool::AtomicBw, Role::Client) => Progress::Manual,
                (Tool::WriteBw | Tool::ReadBw | Tool::AtomicBw | Tool::ReadLat, Role::Server) => {
                    Progress::Thread
                }
                (Tool::SendLat | Tool::WriteLat | Tool::ReadLat, _) => Progress::Manual,
                _ => Progress::Thread,
            },
        };
        let _ = a.cpu_freq;
        // One engine per QP while there are cores for them: each engine is a thread that
        // moves its QPs' packets.
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let engines = engines_setting(a.engines.as_deref(), (a.qps as usize).min(cpus))?;
        Ok(Self {
            tool,
            role,
            host: a.host.clone(),
            port: a.port,
            ib_dev: a.ib_dev.clone(),
            gid_index: a.gid_index,
            local: a.local,
            qp_type: match conn {
                ConnType::Rc => QpType::Rc,
                ConnType::Uc => QpType::Uc,
                ConnType::Ud => QpType::Ud,
            },
            qps: a.qps,
            engines,
            sizes,
            all: a.all,
            size_given: a.size.is_some(),
            iters,
            mtu,
            tx_depth,
            rx_depth,
            out_reads: a.outs,
            atomic: a.atomic_type.unwrap_or_default(),
            cq_mod,
            no_peak: a.no_peak,
            events: match a.recv {
                Some(RecvMode::Block) => true,
                Some(RecvMode::Busy) => {
                    if a.events {
                        bail!("--recv busy contradicts -e");
                    }
                    false
                }
                None => a.events,
            },
            gbits: a.report_gbits,
            json: a.json,
            timeout: Duration::from_secs(a.timeout.max(1)),
            accept_timeout: a.accept_timeout.map_or(Timeout::Never, |s| {
                Timeout::After(Duration::from_secs(s.max(1)))
            }),
            pcap: a.pcap.clone(),
            backend: a.backend,
            progress,
            // Polling latency and atomic tests: the engine thread (where there is one: the
            // passive side of READ, WRITE and atomics) polls on for a while after each
            // request too, as a NIC would. Not the bandwidth tools: there a spinning passive
            // side takes the core the sender needs (2 shared cores).
            engine_spin: if busy
                && matches!(
                    tool,
                    Tool::SendLat | Tool::WriteLat | Tool::ReadLat | Tool::AtomicBw
                ) {
                ENGINE_SPIN
            } else {
                Duration::ZERO
            },
            inflight: a.inflight,
            ack_every: a.ack_every,
            qp_timeout: a.qp_timeout,
            chk: a.chk,
            chk_corrupt: a.chk_corrupt,
        })
    }
}

/// Runs `tool` with `args`.
///
/// # Errors
/// Bad options, device or exchange failures, completion errors: each with its context.
pub(crate) fn run(tool: Tool, args: &PerfArgs) -> anyhow::Result<ExitCode> {
    let cfg = Config::resolve(tool, args)?;
    let mut s = session::Session::establish(&cfg)?;
    if tool.is_bw() {
        bw::run(&mut s, &cfg)?;
    } else {
        lat::run(&mut s, &cfg)?;
    }
    Ok(ExitCode::SUCCESS)
}
