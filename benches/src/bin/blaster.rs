//! The reference UDP blaster ("the limit"), one cell or a sweep; JSON lines on stdout, a
//! human-readable line per cell on stderr. See `roce_benches::blaster` for what is measured.
//!
//! ```text
//! cargo run -p roce-benches --release --bin blaster -- stream --mode mmsg --pmtu 4096
//! cargo run -p roce-benches --release --bin blaster -- stream --link veth --mode all
//! cargo run -p roce-benches --release --bin blaster -- pingpong --recv busy
//! cargo run -p roce-benches --release --bin blaster -- sweep --link both
//! ```

use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use roce_benches::blaster::{
    datagram_len, run_pingpong, run_stream, Mode, PingPongConfig, RecvMode, StreamConfig, PMTUS,
};
use roce_benches::netns::{Link, VethPair};

#[derive(Parser)]
#[command(about = "Raw UDP reference blaster: the limit rocectl is measured against")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LinkArg {
    /// 127.0.0.1 -> 127.0.0.2
    Lo,
    /// veth pair between two namespaces created for the run (MTU 9000)
    Veth,
    /// both, loopback first
    Both,
}

#[derive(Subcommand)]
enum Cmd {
    /// Stream datagrams one way for a fixed time; receiver bytes/s and datagrams/s.
    Stream {
        #[arg(long, value_enum, default_value = "lo")]
        link: LinkArg,
        /// Syscall mode(s); repeatable. Default: all three.
        #[arg(long, value_enum)]
        mode: Vec<Mode>,
        /// Path MTU(s); the datagram is 12 + PMTU + 4 bytes. Default: 256..4096.
        #[arg(long)]
        pmtu: Vec<usize>,
        /// Explicit UDP payload size(s) instead of --pmtu.
        #[arg(long)]
        size: Vec<usize>,
        #[command(flatten)]
        opts: StreamOpts,
    },
    /// 64-byte UDP ping-pong; RTT median, p99, p99.9.
    Pingpong {
        #[arg(long, value_enum, default_value = "lo")]
        link: LinkArg,
        /// Receive mode(s); repeatable. Default: both.
        #[arg(long, value_enum)]
        recv: Vec<RecvMode>,
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Round trips measured.
        #[arg(short = 'n', long, default_value_t = 20_000)]
        round_trips: usize,
    },
    /// Every stream cell (3 modes x 5 PMTUs) and both ping-pongs, once.
    Sweep {
        #[arg(long, value_enum, default_value = "both")]
        link: LinkArg,
        #[command(flatten)]
        opts: StreamOpts,
    },
}

#[derive(clap::Args)]
struct StreamOpts {
    /// Counting window, seconds.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Warm-up before counting, seconds.
    #[arg(long, default_value_t = 0.3)]
    warmup: f64,
    /// Datagrams per sendmmsg/recvmmsg (1..=64).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Most datagrams per GSO send.
    #[arg(long, default_value_t = 64)]
    gso_segments: usize,
    /// Receiver spins on non-blocking calls instead of sleeping (not in the default sweep).
    #[arg(long)]
    rx_busy: bool,
    /// Receiver polls without blocking and naps this many microseconds when its queue is empty
    /// (no wake-ups for the sender to pay; 0: block in the kernel instead). Default: 50 for
    /// mmsg and gso, 0 for plain. A nap overrides --rx-busy.
    #[arg(long, value_name = "US")]
    rx_nap_us: Option<u64>,
}

impl StreamOpts {
    fn config(&self, mode: Mode, size: usize) -> StreamConfig {
        let mut c = StreamConfig::new(mode, size);
        c.duration = Duration::from_secs_f64(self.duration);
        c.warmup = Duration::from_secs_f64(self.warmup);
        c.batch = self.batch;
        c.gso_segments = self.gso_segments;
        c.rx_busy = self.rx_busy;
        if let Some(us) = self.rx_nap_us {
            c.rx_nap = (us > 0).then(|| Duration::from_micros(us));
        }
        if self.rx_busy && self.rx_nap_us.is_none() {
            c.rx_nap = None;
        }
        c
    }
}

/// Runs `f` over the requested links (creating the veth pair only when needed).
fn for_links(which: LinkArg, mut f: impl FnMut(&Link) -> Result<()>) -> Result<()> {
    if which != LinkArg::Veth {
        f(&Link::loopback())?;
    }
    if which != LinkArg::Lo {
        let pair = VethPair::create(9000)?;
        f(pair.link())?;
    }
    Ok(())
}

fn stream(link: &Link, cfg: &StreamConfig) -> Result<()> {
    let r = run_stream(link, cfg)?;
    eprintln!(
        "{:>4} {:<5} {:>5} B: {:>7.3} GB/s {:>7.3} Mdgram/s  (sent {:.3} M/s, loss {:.1} %, {:.1} dgram/rx call)",
        r.link,
        r.mode.name(),
        r.size,
        r.rx_bytes_per_s / 1e9,
        r.rx_datagrams_per_s / 1e6,
        r.tx_datagrams_per_s / 1e6,
        r.loss * 100.0,
        r.rx_per_call
    );
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

fn pingpong(link: &Link, cfg: &PingPongConfig) -> Result<()> {
    let r = run_pingpong(link, cfg)?;
    eprintln!(
        "{:>4} ping-pong {:<5} {} B: RTT median {:.1} us, p99 {:.1} us, p99.9 {:.1} us ({} round trips, {} lost)",
        r.link,
        r.recv.name(),
        r.size,
        r.median_us,
        r.p99_us,
        r.p999_us,
        r.round_trips,
        r.lost
    );
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Stream {
            link,
            mode,
            pmtu,
            size,
            opts,
        } => {
            let modes = if mode.is_empty() {
                Mode::ALL.to_vec()
            } else {
                mode
            };
            let sizes: Vec<usize> = if !size.is_empty() {
                size
            } else if !pmtu.is_empty() {
                pmtu.into_iter().map(datagram_len).collect()
            } else {
                PMTUS.into_iter().map(datagram_len).collect()
            };
            for_links(link, |l| {
                for &m in &modes {
                    for &s in &sizes {
                        stream(l, &opts.config(m, s))?;
                    }
                }
                Ok(())
            })
        }
        Cmd::Pingpong {
            link,
            recv,
            size,
            round_trips,
        } => {
            let recvs = if recv.is_empty() {
                RecvMode::ALL.to_vec()
            } else {
                recv
            };
            for_links(link, |l| {
                for &r in &recvs {
                    let mut cfg = PingPongConfig::new(size, r);
                    cfg.round_trips = round_trips;
                    pingpong(l, &cfg)?;
                }
                Ok(())
            })
        }
        Cmd::Sweep { link, opts } => for_links(link, |l| {
            for m in Mode::ALL {
                for p in PMTUS {
                    stream(l, &opts.config(m, datagram_len(p)))?;
                }
            }
            for r in RecvMode::ALL {
                pingpong(l, &PingPongConfig::new(64, r))?;
            }
            Ok(())
        }),
    }
}
