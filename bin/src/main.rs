//! # rocectl: the command-line front end of the userspace RoCEv2 stack
//!
//! One binary, one subcommand per command family, one module per family:
//!
//! - `rocectl demo` ([`demo`]): two devices on loopback, every operation, data verified;
//! - `rocectl devinfo` ([`devinfo`]): the devices (network interfaces) and their GID tables,
//!   like `ibv_devinfo -v`;
//! - `rocectl pcap …` ([`pcap`]): check, dump and generate RoCEv2 captures with the wire codec;
//! - `rocectl rc-pingpong`, `uc-pingpong`, `ud-pingpong`, `srq-pingpong` ([`pingpong`]):
//!   rdma-core's `ibv_*_pingpong`, interoperable with them;
//! - `rocectl send-bw`, `write-bw`, `read-bw`, `atomic-bw`, `send-lat`, `write-lat`, `read-lat`
//!   ([`perftest`]): perftest's tools, interoperable with the stock `ib_*` ones;
//! - `rocectl exec -- CMD…` ([`exec`]): runs an unmodified libibverbs program (`ibv_devinfo`,
//!   `ib_write_bw`, …) on rocectl's drop-in `libibverbs.so.1`;
//! - `rocectl daemon` ([`daemon`]): the per-host daemon that lets many processes share one
//!   RoCE address; `rocectl res show` and `rocectl stat` ask it what they hold;
//! - `rocectl coll-perf [COLLECTIVE] …`, `rocectl coll launch -n N -- CMD…` ([`coll`]): nccl-tests'
//!   benchmark on the collectives library, and a launcher of N ranks in network namespaces;
//! - `rocectl gen man DIR`, `rocectl gen completions SHELL`: man pages and completions from
//!   this very command-line definition.
//!
//! Errors are reported with `anyhow` at this level only: each command returns
//! `anyhow::Result<ExitCode>`, and [`main`] prints `rocectl: error: …` with its causes and exits
//! with status 1, or with status 2 for a [`device::UsageError`] (a value the user got wrong).
//! A closed stdout (`rocectl pcap dump … | head`) ends the program quietly.

use std::io;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use oob::perftest::Tool;

mod coll;
mod daemon;
mod demo;
mod device;
mod devinfo;
mod devns;
mod exec;
mod limits;
mod oob;
mod pcap;
mod perftest;
mod pingpong;
mod signals;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "rocectl",
    version,
    about = "Userspace RoCEv2 stack: tools and daemon"
)]
struct Cli {
    /// The command family.
    #[command(subcommand)]
    command: Command,
}

/// The command families; each doc line is the one-line summary `rocectl --help` prints.
#[derive(Debug, Subcommand)]
enum Command {
    /// Two devices on loopback (127.0.0.1, 127.0.0.2): every RDMA operation, data verified
    Demo(demo::DemoArgs),
    /// Show the devices (network interfaces), their ports and GID tables, like ibv_devinfo -v
    Devinfo(devinfo::DevinfoArgs),
    /// Check, dump and generate RoCEv2 packet captures (pcap/pcapng)
    #[command(subcommand)]
    Pcap(pcap::PcapCommand),
    /// RC SEND pingpong, interoperable with rdma-core's ibv_rc_pingpong
    RcPingpong(pingpong::RcArgs),
    /// UC SEND pingpong, interoperable with rdma-core's ibv_uc_pingpong
    UcPingpong(pingpong::UcArgs),
    /// UD SEND pingpong, interoperable with rdma-core's ibv_ud_pingpong
    UdPingpong(pingpong::UdArgs),
    /// RC SEND pingpong over several QPs sharing a receive queue (ibv_srq_pingpong)
    SrqPingpong(pingpong::SrqArgs),
    /// SEND bandwidth, like perftest's ib_send_bw (RC, UC, UD)
    SendBw(perftest::PerfArgs),
    /// RDMA WRITE bandwidth, like perftest's ib_write_bw (RC, UC)
    WriteBw(perftest::PerfArgs),
    /// RDMA READ bandwidth, like perftest's ib_read_bw
    ReadBw(perftest::PerfArgs),
    /// Atomic (fetch-and-add, compare-and-swap) rate, like perftest's ib_atomic_bw
    AtomicBw(perftest::PerfArgs),
    /// SEND ping-pong latency, like perftest's ib_send_lat (RC, UC, UD)
    SendLat(perftest::PerfArgs),
    /// RDMA WRITE ping-pong latency, like perftest's ib_write_lat (RC, UC)
    WriteLat(perftest::PerfArgs),
    /// RDMA READ latency, like perftest's ib_read_lat
    ReadLat(perftest::PerfArgs),
    /// Run an unmodified libibverbs program on rocectl's libibverbs.so.1 (verbs/build-so.sh)
    Exec(exec::ExecArgs),
    /// The per-host daemon: many processes share one RoCE address, like a NIC
    Daemon(daemon::DaemonArgs),
    /// Show what the processes using the daemon hold (like rdma resource)
    #[command(subcommand)]
    Res(daemon::views::ResCommand),
    /// Show the counters of every process using the daemon (like rdma statistic)
    Stat(daemon::views::StatArgs),
    /// nccl-tests' benchmark (all_reduce_perf…) on the rocectl collectives library
    CollPerf(coll::perf::PerfArgs),
    /// Collectives tools: launch N ranks in network namespaces (tests and benchmarks)
    #[command(subcommand)]
    Coll(coll::CollCommand),
    /// Generate man pages or shell completions from the command-line definition
    #[command(subcommand)]
    Gen(daemon::gen::GenCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return coll::perf::usage_error(&e),
    };
    // Commands that can capture close their captures on SIGINT/SIGTERM ([`signals`]).
    let captures = !matches!(
        cli.command,
        Command::Devinfo(_)
            | Command::Pcap(_)
            | Command::Exec(_)
            | Command::Daemon(_)
            | Command::Res(_)
            | Command::Stat(_)
            | Command::Gen(_)
            | Command::Coll(_)
    );
    if captures {
        if let Err(err) = signals::install() {
            eprintln!("rocectl: error: {err:#}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Devinfo(args) => devinfo::run(&args),
        Command::Pcap(cmd) => pcap::run(cmd),
        Command::RcPingpong(args) => pingpong::run_rc(args),
        Command::UcPingpong(args) => pingpong::run_uc(args),
        Command::UdPingpong(args) => pingpong::run_ud(args),
        Command::SrqPingpong(args) => pingpong::run_srq(args),
        Command::SendBw(a) => perftest::run(Tool::SendBw, &a),
        Command::WriteBw(a) => perftest::run(Tool::WriteBw, &a),
        Command::ReadBw(a) => perftest::run(Tool::ReadBw, &a),
        Command::AtomicBw(a) => perftest::run(Tool::AtomicBw, &a),
        Command::SendLat(a) => perftest::run(Tool::SendLat, &a),
        Command::WriteLat(a) => perftest::run(Tool::WriteLat, &a),
        Command::ReadLat(a) => perftest::run(Tool::ReadLat, &a),
        Command::Exec(args) => Ok(exec::run(&args)),
        Command::Daemon(args) => daemon::run(&args),
        Command::Res(cmd) => daemon::views::run_res(&cmd),
        Command::Stat(args) => daemon::views::run_stat(&args),
        Command::CollPerf(args) => coll::perf::run(&args),
        Command::Coll(cmd) => coll::run(&cmd),
        Command::Gen(gen) => daemon::gen::run(&gen, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        // A value the user got wrong: one line, the usage-error status.
        Err(err) if err.downcast_ref::<device::UsageError>().is_some() => {
            eprintln!("rocectl: error: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("rocectl: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `err` comes from writing to a closed pipe (the reader went away: not an error).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}
