//! `rocectl rc-pingpong`, `uc-pingpong`, `ud-pingpong`, `srq-pingpong`: rdma-core's
//! `ibv_*_pingpong` examples, interoperable with them in both roles.
//!
//! Same options (`-p -d -i -s -m -r -n -l -e -g -c`, srq `-q`), same out-of-band exchange over
//! TCP 18515 ([`crate::oob::pingpong`]: 52-byte `LID:QPN:PSN:GID` records, 256 for srq),
//! same QP setup (RC: `max_dest_rd_atomic` 1, `min_rnr_timer` 12, timeout 14, retry 7, RNR
//! retry 7; UD: Q_Key 0x11111111 and the 40-byte GRH area in front of each receive buffer),
//! same loop (`PINGPONG_RECV_WRID` 1 / `PINGPONG_SEND_WRID` 2 pending bits, receives refilled
//! when at most 1 — srq: `-q` — remain), and the same printed lines:
//!
//! ```text
//!   local address:  LID 0x0000, QPN 0x000011, PSN 0x7177b7, GID ::ffff:10.77.0.1
//!   remote address: LID 0x0000, QPN 0x000011, PSN 0x96d2ce, GID ::ffff:10.77.0.2
//! 60000 bytes in 0.05 seconds = 9.43 Mbit/sec
//! 10 iters in 0.05 seconds = 5090.60 usec/iter
//! ```
//!
//! (`ud-pingpong` prints `PSN 0x...: GID` in its local line, as `ibv_ud_pingpong` does.)
//!
//! The device is a network interface and `-g` an index into the GID table rxe would build
//! for it ([`crate::device`]). Without `-g` the stock tools send a zero GID, which cannot work
//! on RoCE; rocectl picks the GID of the address that routes to the peer (a server: the first
//! IPv4 GID) and sends it, and a zero GID from the peer is replaced by the peer's TCP address.
//!
//! Differences from the stock tools, all on failure paths: options the device cannot honour
//! (`-o` on-demand paging, `-O`, `-P`, `-t` timestamps, `-j` device memory) are refused with
//! the message the stock tools print on rxe; a path MTU above the device's active MTU is
//! refused up front; a failed completion is followed by `rocectl: hint:` lines naming the
//! likely cause (a silent peer; an MTU mismatch only when the message sizes make one possible);
//! `--chk` failures (`invalid data in page N`)
//! make the exit status 1, and `--chk` also checks the echoed data on the client;
//! `--timeout` bounds the waits the stock tools make for ever.

mod session;
pub(crate) mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use roce_transport::{Mtu, QpType};

use crate::device::BackendKind;
use crate::limits;

/// Which of the four tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tool {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_uc_pingpong`.
    Uc,
    /// `ibv_ud_pingpong`.
    Ud,
    /// `ibv_srq_pingpong`: `-q` RC QPs sharing one receive queue.
    Srq,
}

impl Tool {
    /// The QP type.
    const fn qp_type(self) -> QpType {
        match self {
            Self::Rc | Self::Srq => QpType::Rc,
            Self::Uc => QpType::Uc,
            Self::Ud => QpType::Ud,
        }
    }
}

/// Options every pingpong tool has.
#[derive(Debug, Args)]
pub(crate) struct CommonArgs {
    /// Listen on/connect to TCP port PORT
    #[arg(short = 'p', long, default_value_t = crate::oob::DEFAULT_PORT)]
    port: u16,
    /// Use the network interface IFNAME as the device (default: the interface that routes to
    /// the server; a server without -d uses the default route's interface)
    #[arg(short = 'd', long = "ib-dev", value_name = "IFNAME")]
    ib_dev: Option<String>,
    /// Use port PORT of the device (a rocectl device has one port, 1)
    #[arg(
        short = 'i',
        long = "ib-port",
        value_name = "PORT",
        default_value_t = 1
    )]
    ib_port: u8,
    /// Number of receives to post at a time
    #[arg(
        short = 'r',
        long = "rx-depth",
        value_name = "DEP",
        default_value_t = 500
    )]
    rx_depth: usize,
    /// Number of exchanges
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Service level (accepted; RoCE v2 carries no SL)
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (default poll)
    #[arg(short = 'e', long, action = clap::ArgAction::Count)]
    events: u8,
    /// Local port GID index (rxe order: 0 link-local, then IPv4-mapped, then IPv6; see
    /// `rocectl devinfo -v`); default: the GID of the address that reaches the peer
    #[arg(short = 'g', long = "gid-idx", value_name = "GID_INDEX")]
    gid_idx: Option<u8>,
    /// Validate the received buffer (the stock tools' pattern)
    #[arg(short = 'c', long)]
    chk: bool,
    /// Datapath: kernel UDP socket on the GID's address, or raw Ethernet frames
    #[arg(long, value_enum, default_value_t = BackendKind::Udp)]
    backend: BackendKind,
    /// Write every RoCE frame sent and received to this pcap file
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Seconds each step of the TCP exchange may take (and a client's connection attempts)
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    oob_timeout: f64,
    /// Give up when the peer stays silent this long: a server waiting for its client, or a run
    /// waiting for a completion (default: wait for ever, as the stock tools)
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Connect to the server at HOST; without it, start a server and wait for a client
    #[arg(value_name = "HOST")]
    host: Option<String>,
}

/// `rocectl rc-pingpong` options (`ibv_rc_pingpong`).
#[derive(Debug, Args)]
pub(crate) struct RcArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Size of message to exchange
    #[arg(short = 's', long, default_value_t = 4096)]
    size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096
    #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
    mtu: Mtu,
    /// Use on demand paging (refused: not supported)
    #[arg(short = 'o', long)]
    odp: bool,
    /// Use implicit on demand paging (refused: not supported)
    #[arg(short = 'O', long)]
    iodp: bool,
    /// Prefetch an ODP MR (refused: not supported)
    #[arg(short = 'P', long)]
    prefetch: bool,
    /// Get CQE with timestamp (refused: not supported)
    #[arg(short = 't', long)]
    ts: bool,
    /// Use device memory (refused: not supported)
    #[arg(short = 'j', long)]
    dm: bool,
    /// Use the new post send WR API (accepted: same packets)
    #[arg(short = 'N', long = "new_send")]
    new_send: bool,
}

/// `rocectl uc-pingpong` options (`ibv_uc_pingpong`).
#[derive(Debug, Args)]
pub(crate) struct UcArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Size of message to exchange
    #[arg(short = 's', long, default_value_t = 4096)]
    size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096
    #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
    mtu: Mtu,
}

/// `rocectl ud-pingpong` options (`ibv_ud_pingpong`: no -m, a UD message is one packet of at
/// most the port's active MTU).
#[derive(Debug, Args)]
pub(crate) struct UdArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Size of message to exchange (at most the port's active MTU). 1024 as rdma-core 44's
    /// `ibv_ud_pingpong` really uses (its usage text says 2048): a receive buffer sized for
    /// the stock tool's default must hold what this tool sends by default
    #[arg(short = 's', long, default_value_t = 1024)]
    size: usize,
}

/// `rocectl srq-pingpong` options (`ibv_srq_pingpong`).
#[derive(Debug, Args)]
pub(crate) struct SrqArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Size of message to exchange
    #[arg(short = 's', long, default_value_t = 4096)]
    size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096
    #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
    mtu: Mtu,
    /// Number of QPs to use
    #[arg(short = 'q', long = "num-qp", value_name = "NUM", default_value_t = 16)]
    num_qp: usize,
    /// Use on demand paging (refused: not supported)
    #[arg(short = 'o', long)]
    odp: bool,
}

/// Everything a run needs, whatever the tool.
#[derive(Debug)]
struct Options {
    tool: Tool,
    common: CommonArgs,
    size: usize,
    /// Path MTU (`None` for UD).
    mtu: Option<Mtu>,
    num_qp: usize,
}

/// `rocectl rc-pingpong`.
pub(crate) fn run_rc(args: RcArgs) -> anyhow::Result<ExitCode> {
    if args.prefetch && !(args.odp || args.iodp) {
        bail!("prefetch is valid only with on-demand memory region (-P needs -o or -O)");
    }
    if args.odp && args.dm {
        bail!("DM memory region can't be on demand");
    }
    if args.odp || args.iodp {
        bail!(
            "The device isn't ODP capable or does not support RC send and receive with ODP \
             (rocectl registers memory up front; drop -o/-O)"
        );
    }
    if args.ts {
        bail!("The device isn't completion timestamp capable (drop -t)");
    }
    if args.dm {
        bail!("Device doesn't support dm allocation (drop -j)");
    }
    let _ = args.new_send;
    run(Options {
        tool: Tool::Rc,
        common: args.common,
        size: args.size,
        mtu: Some(args.mtu),
        num_qp: 1,
    })
}

/// `rocectl uc-pingpong`.
pub(crate) fn run_uc(args: UcArgs) -> anyhow::Result<ExitCode> {
    run(Options {
        tool: Tool::Uc,
        common: args.common,
        size: args.size,
        mtu: Some(args.mtu),
        num_qp: 1,
    })
}

/// `rocectl ud-pingpong`.
pub(crate) fn run_ud(args: UdArgs) -> anyhow::Result<ExitCode> {
    run(Options {
        tool: Tool::Ud,
        common: args.common,
        size: args.size,
        mtu: None,
        num_qp: 1,
    })
}

/// `rocectl srq-pingpong`.
pub(crate) fn run_srq(args: SrqArgs) -> anyhow::Result<ExitCode> {
    if args.odp {
        bail!(
            "The device isn't ODP capable or does not support RC send, receive and srq with ODP \
             (rocectl registers memory up front; drop -o)"
        );
    }
    if args.size < 1 {
        bail!("-s 0: srq-pingpong needs a message of at least one byte");
    }
    if args.num_qp == 0 {
        bail!("-q 0: at least one QP is needed");
    }
    if args.num_qp > args.common.rx_depth {
        bail!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            args.common.rx_depth,
            args.num_qp
        );
    }
    if args.num_qp >= crate::oob::pingpong::SRQ_RECORDS {
        bail!(
            "num_qp {} must be less than {}",
            args.num_qp,
            crate::oob::pingpong::SRQ_RECORDS - 1
        );
    }
    run(Options {
        tool: Tool::Srq,
        common: args.common,
        size: args.size,
        mtu: Some(args.mtu),
        num_qp: args.num_qp,
    })
}

fn run(opts: Options) -> anyhow::Result<ExitCode> {
    if opts.common.ib_port != 1 {
        bail!(
            "-i {}: a rocectl device has one port, 1",
            opts.common.ib_port
        );
    }
    if opts.common.rx_depth == 0 {
        bail!("-r 0: at least one receive must be posted");
    }
    // Sizes and counts first: nothing is allocated or opened before they are known to fit.
    limits::check_depth("-r", opts.common.rx_depth as u64)?;
    limits::check_size("-s", opts.size as u64, 0)?;
    limits::check_count(
        "-n",
        opts.common.iters,
        0,
        u64::from(u32::MAX),
        "the stock tools' iteration count is 32 bits",
    )?;
    for (name, secs) in [
        ("--oob-timeout", Some(opts.common.oob_timeout)),
        ("--timeout", opts.common.timeout),
    ] {
        if let Some(s) = secs {
            limits::check_secs(name, s)?;
        }
    }
    session::run(&opts)
}

/// Parses `-m` as `pp_mtu_to_enum` does (256..4096, powers of two).
fn parse_mtu(text: &str) -> Result<Mtu, String> {
    text.parse::<usize>()
        .ok()
        .and_then(Mtu::from_bytes)
        .ok_or_else(|| format!("{text} is not a path MTU: use 256, 512, 1024, 2048 or 4096"))
}
