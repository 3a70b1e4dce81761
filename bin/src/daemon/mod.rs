//! `rocectl daemon`: the per-host (per network namespace) daemon that lets many processes
//! share one RoCE address the way they share a NIC, and the commands that ask it
//! (`rocectl res show`, `rocectl stat`).
//!
//! The daemon is the control plane only: it hands out disjoint QPN ranges over a Unix socket,
//! takes each client's identity from the kernel, enforces per-uid and per-client limits,
//! quarantines the range of a client that dies, and shows every client's objects. Each client
//! keeps its own engine and progress thread; the daemon never touches a client's memory and
//! is not on the data path (see `roce_transport::control` for the client side and the
//! protocol).
//!
//! - `config`: the TOML file; `registry`: the state, without I/O; `server`: the socket;
//! - `views`: `rocectl res show` and `rocectl stat`; `gen`: man pages and completions.
//!
//! Exit status: 0 after SIGINT/SIGTERM (the socket removed), 2 for a bad configuration (one
//! line on stderr), 1 for any other failure to start.

mod config;
pub(crate) mod gen;
mod registry;
mod server;
pub(crate) mod views;

use std::io::IsTerminal;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use roce_transport::control::sys::{sd_notify, systemd_listener};
use roce_transport::control::{Mode, Welcome, PROTOCOL_MAJOR, PROTOCOL_MINOR};
use roce_transport::datapath::demux::{DemuxGroup, SlotLayout};
use roce_transport::datapath::fwdring::Forwarder;
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info, warn};

use config::{Config, DEFAULT_CONFIG};
use registry::{Policy, Registry};
use server::Server;

/// `rocectl daemon` arguments.
#[derive(Debug, Args)]
pub(crate) struct DaemonArgs {
    /// Configuration file (TOML)
    #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Check the configuration, print the resolved settings, and exit
    #[arg(long)]
    check: bool,
    /// Serve this address (overrides `address`/`interface` of the file)
    #[arg(short, long, value_name = "IP")]
    address: Option<IpAddr>,
    /// Control socket path (overrides `socket.path` of the file)
    #[arg(short, long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

/// The exit status for a configuration error.
const EXIT_CONFIG: u8 = 2;

/// Runs the daemon until SIGINT or SIGTERM.
///
/// # Errors
/// The socket cannot be set up (after the configuration was accepted).
pub(crate) fn run(args: &DaemonArgs) -> anyhow::Result<ExitCode> {
    let (cfg, address, gid) = match settle(args) {
        Ok(x) => x,
        Err(msg) => {
            eprintln!("rocectl: config error: {msg}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    if args.check {
        println!(
            "config ok: mode {} address {address} socket {} (mode {:#o}{}) qpn ranges {} x {} quarantine {} ms",
            cfg.mode,
            cfg.socket.path.display(),
            cfg.socket.mode,
            gid.map(|g| format!(", gid {g}")).unwrap_or_default(),
            cfg.slots() - 1,
            cfg.qpn.range_size,
            cfg.qpn.quarantine_ms,
        );
        return Ok(ExitCode::SUCCESS);
    }
    init_logging();
    let (listener, owned_path) = open_socket(&cfg, gid)?;
    let demux = open_demux(cfg.mode, cfg.qpn.range_size, cfg.demux.pin_dir.as_deref())?;
    let welcome = Welcome {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        software: env!("CARGO_PKG_VERSION").into(),
        address,
        mode: cfg.mode,
        qpn_range_size: cfg.qpn.range_size,
    };
    let forward = open_forwarder(cfg.mode, address, cfg.qpn.range_size)?;
    let server = Arc::new(Server::new(
        Registry::new(Policy::from_config(&cfg)),
        welcome,
        demux,
        forward,
    ));
    install_signals(owned_path.clone())?;
    info!(
        address = %address, mode = %cfg.mode, socket = %cfg.socket.path.display(),
        ranges = cfg.slots() - 1, range_size = cfg.qpn.range_size,
        quarantine_ms = cfg.qpn.quarantine_ms,
        activated = owned_path.is_none(), "rocectl daemon ready"
    );
    if let Err(e) = sd_notify("READY=1\nSTATUS=serving") {
        warn!(error = %e, "sd_notify failed");
    }
    server.run(&listener);
    Ok(ExitCode::SUCCESS)
}

/// The configuration with the command line applied, the address and the socket's group
/// resolved: everything that makes exit status 2.
fn settle(args: &DaemonArgs) -> Result<(Config, IpAddr, Option<u32>), String> {
    let explicit = args.config.as_path() != Path::new(DEFAULT_CONFIG);
    let mut cfg = if args.config.exists() || explicit {
        Config::load(&args.config)?
    } else {
        // No file at the default place: the defaults, with the command line.
        Config::parse("", &args.config)?
    };
    if let Some(a) = args.address {
        cfg.address = Some(a);
        cfg.interface = None;
    }
    if let Some(s) = &args.socket {
        if !s.is_absolute() {
            return Err(format!(
                "--socket {}: must be an absolute path",
                s.display()
            ));
        }
        cfg.socket.path.clone_from(s);
    }
    let address = cfg.resolve_address()?;
    let gid = cfg
        .socket
        .group
        .as_ref()
        .map(config::resolve_group)
        .transpose()?;
    Ok((cfg, address, gid))
}

/// Structured logs on stderr (journald adds its own timestamps under systemd); the level
/// comes from `RUST_LOG` (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// The listening socket: systemd's (socket activation), else a new one at the configured
/// path with its mode and group. Returns the path to remove on shutdown (`None` when systemd
/// owns the socket).
fn open_socket(cfg: &Config, gid: Option<u32>) -> anyhow::Result<(UnixListener, Option<PathBuf>)> {
    if let Some(l) = systemd_listener().context("socket activation")? {
        info!("using the socket systemd passed (socket activation)");
        return Ok((l, None));
    }
    let path = &cfg.socket.path;
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
        }
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another rocectl daemon is listening on {} (stop it, or pick another socket)",
                path.display()
            );
        }
        // A socket left by a daemon that did not shut down cleanly.
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket.mode))
        .with_context(|| format!("chmod {:#o} {}", cfg.socket.mode, path.display()))?;
    if let Some(g) = gid {
        std::os::unix::fs::chown(path, None, Some(g))
            .with_context(|| format!("chgrp {g} {}", path.display()))?;
    }
    Ok((listener, Some(path.clone())))
}

/// The data-path hookup on the daemon's side: in kernel-demux mode, the steering program and
/// its `REUSEPORT_SOCKARRAY` map (one entry per QPN range), whose descriptors every lease
/// carries; each client's socket joins the SO_REUSEPORT group on the address with them.
///
/// # Errors
/// The kernel refuses (no `CAP_BPF`/`CAP_NET_ADMIN`, or the program is rejected): clients
/// could not share the address, so the daemon does not start.
///
/// With `pin_dir`, a group pinned there by an earlier run is taken back (its members keep
/// their slots), else a new one is created and pinned.
fn open_demux(
    mode: Mode,
    range_size: u32,
    pin_dir: Option<&Path>,
) -> anyhow::Result<Option<DemuxGroup>> {
    match mode {
        Mode::KernelDemux => {
            let layout = SlotLayout::new(range_size.trailing_zeros() as u8)?;
            let pinned = pin_dir.and_then(|d| DemuxGroup::open_pinned(d, layout).ok());
            let group = match (pinned, pin_dir) {
                (Some(g), Some(dir)) => {
                    info!(dir = %dir.display(), "kernel demultiplexer taken back from its pin");
                    g
                }
                (_, dir) => {
                    let g = DemuxGroup::create(layout)?;
                    if let Some(dir) = dir {
                        std::fs::create_dir_all(dir)
                            .with_context(|| format!("creating {}", dir.display()))?;
                        g.pin(dir).with_context(|| {
                            format!("pinning the demultiplexer in {}", dir.display())
                        })?;
                    }
                    g
                }
            };
            info!(
                slots = layout.slots(),
                map_id = group.map_id().unwrap_or(0),
                "kernel demultiplexer ready (SK_REUSEPORT program + REUSEPORT_SOCKARRAY)"
            );
            Ok(Some(group))
        }
        Mode::Forwarding => Ok(None),
    }
}

/// Forwarding mode: the daemon's own socket on `address`:4791 and the forwarder that copies
/// each datagram into its owner's ring.
///
/// # Errors
/// The address is in use (another RoCE stack or rocectl) or not on this host.
fn open_forwarder(
    mode: Mode,
    address: IpAddr,
    range_size: u32,
) -> anyhow::Result<Option<Forwarder>> {
    if mode != Mode::Forwarding {
        return Ok(None);
    }
    let layout = SlotLayout::new(range_size.trailing_zeros() as u8)?;
    let addr = std::net::SocketAddr::new(address, 4_791);
    let dp = UdpDatapath::bind(addr, UdpOptions::default())
        .with_context(|| format!("forwarding: binding {addr}"))?;
    info!(%addr, slots = layout.slots(), "forwarding: receiving for every client");
    Ok(Some(Forwarder::new(Box::new(dp), layout)))
}

/// SIGINT/SIGTERM: log, remove the socket we created, tell systemd, exit 0. Clients see
/// their connection end; their data paths are theirs and go on.
fn install_signals(socket: Option<PathBuf>) -> anyhow::Result<()> {
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT/SIGTERM handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                let _ = sd_notify("STOPPING=1");
                if let Some(p) = &socket {
                    if let Err(e) = std::fs::remove_file(p) {
                        error!(socket = %p.display(), error = %e, "cannot remove the socket");
                    }
                }
                info!(signal = name, "rocectl daemon stopped");
                std::process::exit(0);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
