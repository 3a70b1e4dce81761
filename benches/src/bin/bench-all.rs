//! Every benchmark of issue 7 side by side: ours (from `benches/ours.cmds`), the limit (the raw
//! UDP blaster) and the peers (libfabric `udp;ofi_rxd`, UCX over TCP), over loopback and a veth
//! pair, each cell the median of 3 runs with min–max. Prints the table; writes
//! `benches/results/latest.{json,md}`. Use `benches/run.sh`, which installs the peers first.
//!
//! ```text
//! cargo run -p roce-benches --release --bin bench-all
//! cargo run -p roce-benches --release --bin bench-all -- --quick --no-veth --out none
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use roce_benches::runner::{run, Options};

#[derive(Parser)]
#[command(about = "rocectl vs the UDP limit vs the peers, in one run")]
struct Cli {
    /// Runs per cell (the median and min–max are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Stop starting new runs after this many seconds.
    #[arg(long, default_value_t = 540)]
    budget: u64,
    /// Counting window of each blaster stream cell, seconds.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Shorter cells (0.3 s windows, 2 000 ping-pong round trips), for trying the runner out.
    #[arg(long)]
    quick: bool,
    /// Loopback only (no namespaces; also what happens without root).
    #[arg(long)]
    no_veth: bool,
    /// Skip libfabric and UCX.
    #[arg(long)]
    no_peers: bool,
    /// Only measurements whose id contains this, or one of these comma-separated strings
    /// (e.g. `limit/lo/mmsg`, `ucx/`, `rate,mmsg/88,mmsg/44`).
    #[arg(long)]
    only: Option<String>,
    /// Hook file with our commands (default: benches/ours.cmds).
    #[arg(long)]
    ours: Option<PathBuf>,
    /// Output directory for latest.json and latest.md, or `none` (default: benches/results).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut o = Options {
        reps: cli.reps,
        budget: Duration::from_secs(cli.budget),
        stream_duration: Duration::from_secs_f64(cli.duration),
        veth: !cli.no_veth,
        peers: !cli.no_peers,
        filter: cli.only,
        ..Options::default()
    };
    if cli.quick {
        o.stream_duration = Duration::from_millis(300);
        o.stream_warmup = Duration::from_millis(100);
        o.pp_round_trips = 2_000;
    }
    if let Some(p) = cli.ours {
        o.ours_file = p;
    }
    match cli.out {
        Some(p) if p.as_os_str() == "none" => o.out_dir = None,
        Some(p) => o.out_dir = Some(p),
        None => {}
    }
    let report = run(&o)?;
    println!("{}", report.table);
    Ok(())
}
