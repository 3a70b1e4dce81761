//! `rocectl demo`: two devices in one process, every operation, data verified.
//!
//! The README's main command: no root, no second host. Two `udp` devices bind 127.0.0.1:4791
//! and 127.0.0.2:4791 (Linux routes all of 127/8 to `lo`), connect RC and UD queue pairs and
//! run SEND, RDMA WRITE, WRITE_WITH_IMM, READ, both atomics and UD SEND, checking every byte.
//! `--backend sim` runs the same over the in-memory network instead.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions, StepReport};
use roce_transport::{CaptureFile, Device, DeviceConfig, SimNetwork};

/// Which datapath the demo uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DemoBackend {
    /// Kernel UDP sockets on loopback.
    Udp,
    /// The in-memory network.
    Sim,
}

/// `rocectl demo` options.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Datapath.
    #[arg(long, value_enum, default_value = "udp")]
    backend: DemoBackend,
    /// Address of the first device.
    #[arg(long, default_value = "127.0.0.1")]
    a: IpAddr,
    /// Address of the second device.
    #[arg(long, default_value = "127.0.0.2")]
    b: IpAddr,
    /// Message sizes in bytes (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "64,65536,1048576")]
    sizes: Vec<usize>,
    /// Messages per operation and size.
    #[arg(long, short = 'n', default_value_t = 10)]
    iters: usize,
    /// Save every frame both devices send and receive to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
}

/// Runs the demo.
pub(crate) fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    // Sizes first: nothing is allocated or opened before they are known to fit.
    for &size in &args.sizes {
        crate::limits::check_size("--sizes", size as u64, 0)?;
    }
    let capture = match &args.pcap {
        Some(p) => {
            let c = CaptureFile::create(p).with_context(|| format!("creating {}", p.display()))?;
            crate::signals::register(&c);
            Some(c)
        }
        None => None,
    };
    let net = SimNetwork::perfect();
    let open = |ip: IpAddr, name: &str| -> anyhow::Result<Device> {
        let mut cfg = match args.backend {
            DemoBackend::Udp => DeviceConfig::udp(ip),
            DemoBackend::Sim => DeviceConfig::sim(&net, ip),
        }
        .name(name);
        // Without --pcap, ROCECTL_PCAP (one file per device), opened here to be registered.
        let own = match &capture {
            Some(c) => Some(c.clone()),
            None => crate::signals::open_capture(None, name)?,
        };
        if let Some(c) = &own {
            cfg = cfg.capture(c);
        }
        Device::open(cfg).with_context(|| format!("opening device {name} on {ip}"))
    };
    let a = open(args.a, "rocectl-a")?;
    let b = open(args.b, "rocectl-b")?;
    for d in [&a, &b] {
        let port = d.query_port();
        println!(
            "device {:<10} {:<4} {:<22} path MTU {} (interface MTU {}), GID {}",
            d.name(),
            d.query_device().backend,
            port.local.to_string(),
            port.active_mtu.bytes(),
            port.ip_mtu,
            d.local_gid().to_ip()
        );
    }
    let opts = SelftestOptions {
        sizes: args.sizes.clone(),
        iterations: args.iters.max(1),
        ud_sizes: vec![64, 1024],
        timeout: Duration::from_secs(30),
        ack_timeout: 14,
    };
    println!(
        "{:<24} {:>10}   {:<4} {:>15} {:>15}",
        "operation", "size", "msgs", "bandwidth", "latency"
    );
    let start = Instant::now();
    let mut print = |r: &StepReport| println!("{r}   data verified");
    run_rc(&a, &b, &opts, &mut print).context("RC")?;
    run_ud(&a, &b, &opts, &mut print).context("UD")?;
    let (ca, cb) = (a.counters(), b.counters());
    println!(
        "done in {:.2} s: {} packets sent, {} received, {} retransmitted, {} ICRC errors",
        start.elapsed().as_secs_f64(),
        ca.tx_packets + cb.tx_packets,
        ca.rx_packets + cb.rx_packets,
        ca.retransmitted_pkts + cb.retransmitted_pkts,
        ca.icrc_errors + cb.icrc_errors
    );
    if let Some(c) = &capture {
        drop((a, b));
        c.flush().context("writing the capture")?;
        println!(
            "capture: {} frames in {} (check it: rocectl pcap check {})",
            c.frames(),
            c.path().display(),
            c.path().display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
