//! # rocectl: the command-line front end of the userspace RoCEv2 stack
//!
//! One binary, one subcommand per command family, one module per family:
//!
//! - `rocectl demo` ([`demo`]): two devices on loopback, every operation, data verified;
//! - `rocectl pcap …` ([`pcap`]): check, dump and generate RoCEv2 captures with the wire codec.
//!
//! Errors are reported with `anyhow` at this level only: each command returns
//! `anyhow::Result<ExitCode>`, and [`main`] prints `rocectl: error: …` with its causes and exits
//! with status 1. A closed stdout (`rocectl pcap dump … | head`) ends the program quietly.

use std::io;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod device;
mod oob;
mod pcap;

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
    /// Check, dump and generate RoCEv2 packet captures (pcap/pcapng)
    #[command(subcommand)]
    Pcap(pcap::PcapCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Pcap(cmd) => pcap::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
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
