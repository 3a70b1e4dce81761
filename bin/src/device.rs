//! Device selection shared by every tool that opens an RDMA device (`rc-pingpong`, the
//! perftest tools, `devinfo`).
//!
//! A rocectl device is a network interface. The stock tools name an rdma device (`-d rxe0`)
//! and a GID index (`-g 1` / `-x 1`); rocectl takes the interface itself (`-d eth0`) and the
//! same GID index, into the table Linux rdma_rxe would build for that interface
//! ([`roce_transport::netdev::NetDevice::gid_table`]: 0 = `fe80::` + EUI-64 of the MAC, then
//! the IPv4-mapped GID of each IPv4 address, then the other IPv6 addresses), so an index means
//! what it means on Soft-RoCE. The device then sends from that GID's IP address: the `udp`
//! backend binds `IP:4791`, the `raw` backend uses the interface with that source address.
//!
//! Which interface, without `-d`:
//!
//! - a client (a peer address is known): the interface the kernel routes the peer through,
//!   and, without `-g`, the index of the source address that route picks;
//! - a server (no peer): the interface of the default route, and, without `-g`, its first
//!   IPv4 GID (index 1 on an interface with one IPv4 address, as `lab-info gid` on rxe). A
//!   host without a default route (a bare network namespace) must name the interface.
//!
//! Errors name what exists: an unknown interface lists the interfaces, a GID index past the
//! table prints the table, and index 0 explains when its link-local address is not configured
//! (rxe lists it even with IPv6 off, but nothing can be sent from an address the host does
//! not have).
//!
//! Engines ([`DeviceConfig::engines`]): every tool that opens its device here takes the count
//! from [`engines_setting`]: its `--engines` flag where it has one (the perftest tools), else
//! `ROCECTL_ENGINES`, else the tool's default (perftest: min(`-q`, CPUs); the pingpongs, one
//! QP each: 1). A bad value is a [`UsageError`] (one line, exit status 2). The transport runs
//! one engine where it cannot steer (a daemon serves the address, the raw backend) and the
//! tool then says so when the user asked for more ([`report_engines`]).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::ValueEnum;
use roce_transport::netdev::{self, NetDevice};
use roce_transport::{Backend, Device, DeviceConfig, Gid, GidEntry, Mtu, Progress};

/// The datapath a tool's device uses (`--backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// A kernel UDP socket bound to the GID's address, port 4791 (no privileges).
    #[default]
    Udp,
    /// Whole Ethernet frames on the interface (`AF_PACKET`, needs `CAP_NET_RAW`).
    Raw,
}

/// What a tool knows when it opens its device.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceArgs {
    /// The interface (`-d/--ib-dev`); `None`: chosen by route (see the module docs).
    pub(crate) ib_dev: Option<String>,
    /// The GID index (`-g/--gid-idx`, perftest `-x`); `None`: the index of the address the
    /// route (client) or the interface's first IPv4 address (server) gives.
    pub(crate) gid_idx: Option<u8>,
    /// The datapath.
    pub(crate) backend: BackendKind,
    /// The peer's address (a client's server), used to pick the interface and source address.
    pub(crate) peer: Option<IpAddr>,
    /// The device's active path MTU; `None`: the largest the interface MTU allows (as rxe).
    pub(crate) mtu: Option<Mtu>,
    /// Capture every frame to this pcap file (`{dev}` is replaced by the device name).
    pub(crate) pcap: Option<PathBuf>,
    /// Who drives the engine: its own thread (default), or the tool's polling (a tool that
    /// always polls while traffic may arrive saves the thread's wake-ups).
    pub(crate) progress: Progress,
    /// Engines ([`DeviceConfig::engines`]; 0 or 1: one), from [`engines_setting`].
    pub(crate) engines: Engines,
    /// [`DeviceConfig::engine_spin`] (zero: none).
    pub(crate) engine_spin: std::time::Duration,
}

/// The engines a tool asked its device for ([`DeviceConfig::engines`]), and whether the user
/// asked (`--engines`, `ROCECTL_ENGINES`) or the tool chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Engines {
    /// How many (1..=[`roce_transport::MAX_ENGINES`]).
    pub(crate) n: usize,
    /// The user asked for them: a device that runs fewer says why on stderr.
    pub(crate) asked: bool,
}

impl Default for Engines {
    fn default() -> Self {
        Self { n: 1, asked: false }
    }
}

/// A command-line value the user got wrong: `main` prints it as one line and exits with
/// status 2 (the usage-error status), where other errors exit with 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// The environment variable every tool that opens a device through this module reads for its
/// engines (`--engines`, where a tool has it, wins).
pub(crate) const ENGINES_ENV: &str = "ROCECTL_ENGINES";

/// The engines of a tool's device: `flag` (the tool's `--engines`, as typed), else
/// [`ENGINES_ENV`], else `default` (the tool's choice, clamped to the allowed range).
///
/// # Errors
/// [`UsageError`]: the flag or the variable is not a number from 1 to
/// [`roce_transport::MAX_ENGINES`].
pub(crate) fn engines_setting(flag: Option<&str>, default: usize) -> Result<Engines, UsageError> {
    let parse = |what: String, text: &str| match text.trim().parse::<usize>() {
        Ok(n) if (1..=roce_transport::MAX_ENGINES).contains(&n) => Ok(Engines { n, asked: true }),
        _ => Err(UsageError(format!(
            "{what}: the number of engines is a whole number from 1 to {}",
            roce_transport::MAX_ENGINES
        ))),
    };
    if let Some(text) = flag {
        return parse(format!("--engines {text}"), text);
    }
    if let Some(v) = std::env::var_os(ENGINES_ENV) {
        let text = v.to_string_lossy();
        return parse(format!("{ENGINES_ENV}={text}"), &text);
    }
    Ok(Engines {
        n: default.clamp(1, roce_transport::MAX_ENGINES),
        asked: false,
    })
}

/// Says on stderr why `dev` runs fewer engines than the user asked for (a daemon serves the
/// address, the raw backend...): the run is correct, only not parallel.
pub(crate) fn report_engines(dev: &Device, engines: Engines) {
    if engines.asked && dev.engines() < engines.n {
        eprintln!(
            "rocectl: note: {} engine(s) asked for, {} running: {}",
            engines.n,
            dev.engines(),
            dev.engines_fallback().unwrap_or("the device runs fewer")
        );
    }
}

/// Opens the device `args` describe. Returns it with the GID index in use and its GID (what
/// the tool puts in its out-of-band record and prints as `GID`).
///
/// # Errors
/// No such interface, no route to the peer, no default route (server without `-d`), a GID
/// index that does not exist (the message prints the table) or whose address is not
/// configured, an address already in use, an MTU the interface cannot carry.
pub(crate) fn open_device(args: DeviceArgs) -> anyhow::Result<(Device, u8, Gid)> {
    let (dev, routed_src) = select_interface(args.ib_dev.as_deref(), args.peer)?;
    let table = dev.gid_table();
    let index = match args.gid_idx {
        Some(i) => i,
        None => default_index(&dev, &table, routed_src)?,
    };
    let Some(entry) = table.iter().find(|e| e.index == index) else {
        bail!(
            "GID index {index} does not exist on {}: its GID table has {} entries (indexes \
             0..={}):\n{}",
            dev.name,
            table.len(),
            table.len().saturating_sub(1),
            describe_table(&dev, &table)
        );
    };
    let ip = entry.gid.to_ip();
    if !dev.has_addr(ip) {
        bail!("{}", unusable_gid(&dev, entry, &table));
    }
    if let IpAddr::V6(v6) = ip {
        if is_link_local(v6) {
            bail!(
                "GID index {index} of {} is the link-local address {v6}: rocectl cannot send \
                 from a link-local address yet (it needs the interface scope); use an IPv4 or \
                 global IPv6 GID index:\n{}",
                dev.name,
                describe_table(&dev, &table)
            );
        }
    }
    let backend = match args.backend {
        BackendKind::Udp => Backend::Udp {
            local: ip,
            port: roce_wire::frame::ROCEV2_PORT,
        },
        BackendKind::Raw => Backend::Raw {
            ifname: dev.name.clone(),
            local: ip,
        },
    };
    let mut config = DeviceConfig::new(backend).name(dev.name.clone());
    config.mtu = args.mtu;
    config.capture = crate::signals::open_capture(args.pcap.as_deref(), &dev.name)?;
    config.progress = args.progress;
    config = config.engines(args.engines.n).engine_spin(args.engine_spin);
    // Initial PSNs, memory keys and QPNs come from the OS random source (the device's
    // default): they differ from run to run and from the peer's.
    let device = Device::open(config).with_context(|| {
        format!(
            "opening device {} (GID index {index}, {ip}, {} backend)",
            dev.name,
            backend_name(args.backend)
        )
    })?;
    report_engines(&device, args.engines);
    Ok((device, index, entry.gid))
}

/// The interface named `ib_dev`, else the one routing to `peer`, else the default route's.
/// Also returns the source address the route chose, if a route was used.
fn select_interface(
    ib_dev: Option<&str>,
    peer: Option<IpAddr>,
) -> anyhow::Result<(NetDevice, Option<IpAddr>)> {
    if let Some(name) = ib_dev {
        let dev = netdev::interface(name).map_err(|e| anyhow::anyhow!("-d {name}: {e}"))?;
        // A route through this interface picks the source address when the peer is known.
        let src = peer
            .and_then(|p| netdev::route_to(p).ok())
            .filter(|(_, d)| d.name == dev.name)
            .map(|(ip, _)| ip);
        return Ok((dev, src));
    }
    if let Some(peer) = peer {
        let (src, dev) = netdev::route_to(peer)
            .with_context(|| format!("finding the interface that reaches {peer} (or use -d)"))?;
        return Ok((dev, Some(src)));
    }
    // A server: the interface of the default route (IPv4, else IPv6), from the kernel's
    // routing tables of this network namespace.
    if let Some(name) = default_route_interface() {
        if let Ok(dev) = netdev::interface(&name) {
            return Ok((dev, None));
        }
    }
    let listing = netdev::interfaces()
        .map(|all| {
            all.iter()
                .filter(|d| d.addrs().next().is_some())
                .map(|d| {
                    let addrs: Vec<String> = d.addrs().map(|a| a.to_string()).collect();
                    format!("{} ({})", d.name, addrs.join(", "))
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    bail!(
        "no default route to pick a device from: name one with -d IFNAME (interfaces with an \
         address: {listing})"
    )
}

/// The interface of the default route: the lowest-metric `0.0.0.0/0` entry of
/// `/proc/net/route`, else the `::/0` entry of `/proc/net/ipv6_route` that is up and not a
/// reject route. Both files show the routes of the reader's network namespace.
fn default_route_interface() -> Option<String> {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let best_v4 = v4
        .lines()
        .skip(1)
        .filter_map(|line| {
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let metric: u32 = f.get(6)?.parse().ok()?;
            let default = *f.get(1)? == "00000000" && *f.get(7)? == "00000000";
            (default && flags & RTF_UP != 0).then(|| (metric, f[0].to_owned()))
        })
        .min();
    if let Some((_, name)) = best_v4 {
        return Some(name);
    }
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    v6.lines()
        .filter_map(|line| {
            // dest plen src splen nexthop metric refcnt use flags iface
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            let metric = u32::from_str_radix(f.get(5)?, 16).ok()?;
            let default = f.first()?.bytes().all(|b| b == b'0') && *f.get(1)? == "00";
            let usable = flags & RTF_UP != 0 && flags & RTF_REJECT == 0;
            let name = f.get(9)?.to_string();
            (default && usable).then_some((metric, name))
        })
        .min()
        .map(|(_, name)| name)
}

/// `RTF_UP` in the kernel's route flags.
const RTF_UP: u32 = 0x0001;
/// `RTF_REJECT`: an unreachable route (the `::/0` entry on `lo` without IPv6 routing).
const RTF_REJECT: u32 = 0x0200;

/// The GID index to use without `-g`: the routed source address's, else the first IPv4 GID,
/// else the first non-link-local one.
fn default_index(
    dev: &NetDevice,
    table: &[GidEntry],
    routed_src: Option<IpAddr>,
) -> anyhow::Result<u8> {
    if let Some(i) = routed_src.and_then(|src| dev.gid_index_of(src)) {
        return Ok(i);
    }
    if let Some(i) = dev.ipv4_gid_index() {
        return Ok(i);
    }
    let usable = table.iter().find(|e| match e.gid.to_ip() {
        IpAddr::V6(v6) => !is_link_local(v6) && dev.has_addr(IpAddr::V6(v6)),
        IpAddr::V4(_) => true,
    });
    match usable {
        Some(e) => Ok(e.index),
        None => bail!(
            "{} has no IP address a RoCE device can send from; add one (`ip addr add ... dev \
             {}`) or pick another interface with -d:\n{}",
            dev.name,
            dev.name,
            describe_table(dev, table)
        ),
    }
}

/// Why `entry`'s address cannot be used, with the table.
fn unusable_gid(dev: &NetDevice, entry: &GidEntry, table: &[GidEntry]) -> String {
    let ip = entry.gid.to_ip();
    if entry.index == 0 {
        format!(
            "GID index 0 of {} is the link-local GID {ip} that rxe builds from the MAC (it lists \
             it even when IPv6 is off), but {} has no such address configured, so nothing can be \
             sent from it; use an IPv4 GID index instead (usually -g 1):\n{}",
            dev.name,
            dev.name,
            describe_table(dev, table)
        )
    } else {
        format!(
            "GID index {} of {} ({ip}) is not configured on the interface:\n{}",
            entry.index,
            dev.name,
            describe_table(dev, table)
        )
    }
}

/// The table as `ibv_devinfo -v` prints it, with a note on unusable entries.
pub(crate) fn describe_table(dev: &NetDevice, table: &[GidEntry]) -> String {
    let mut out = String::new();
    for e in table {
        let ip = e.gid.to_ip();
        let note = if !dev.has_addr(ip) {
            "  (address not configured: unusable)"
        } else if matches!(ip, IpAddr::V6(v6) if is_link_local(v6)) {
            "  (link-local: unusable by rocectl)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  GID[{:>3}]: {}, {}{note}",
            e.index,
            ip_text(e.gid),
            e.kind
        );
    }
    out.pop();
    out
}

/// A GID as `inet_ntop(AF_INET6)` prints it (what the stock tools print): `::ffff:10.77.0.1`,
/// `fe80::5054:ff:fe77:1`.
pub(crate) fn ip_text(gid: Gid) -> String {
    let v6 = Ipv6Addr::from(gid.0);
    match v6.to_ipv4_mapped() {
        // Rust prints mapped addresses the same way as glibc; keep it explicit.
        Some(v4) => format!("::ffff:{v4}"),
        None => v6.to_string(),
    }
}

fn is_link_local(v6: Ipv6Addr) -> bool {
    v6.segments()[0] & 0xFFC0 == 0xFE80
}

fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Udp => "udp",
        BackendKind::Raw => "raw",
    }
}

#[cfg(test)]
mod tests {
    /// `--engines` wins over `ROCECTL_ENGINES` and the default; a value out of 1..=64 or not a
    /// number is one line naming the flag and the range.
    #[test]
    fn engines_flag_values() {
        assert_eq!(
            engines_setting(Some("2"), 1).unwrap(),
            Engines { n: 2, asked: true }
        );
        assert_eq!(engines_setting(Some(" 64"), 1).unwrap().n, 64);
        for bad in ["0", "65", "two", "", "-1"] {
            let e = engines_setting(Some(bad), 1).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--engines {bad}: the number of engines is a whole number from 1 to 64")
            );
        }
    }

    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn ip_text_is_inet_ntop() {
        let v4 = Gid::from_ip(Ipv4Addr::new(10, 77, 0, 1).into());
        assert_eq!(ip_text(v4), "::ffff:10.77.0.1");
        let ll: Ipv6Addr = "fe80::5054:ff:fe77:1".parse().unwrap();
        assert_eq!(ip_text(Gid::from_ip(ll.into())), "fe80::5054:ff:fe77:1");
        assert_eq!(ip_text(Gid::ZERO), "::");
    }

    #[test]
    fn gid_index_past_the_table_prints_it() {
        let err = open_device(DeviceArgs {
            ib_dev: Some("lo".into()),
            gid_idx: Some(200),
            ..DeviceArgs::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("GID index 200 does not exist on lo"), "{err}");
        assert!(err.contains("GID[  1]: ::ffff:127.0.0.1, RoCE v2"), "{err}");
    }

    #[test]
    fn index_zero_on_lo_is_explained() {
        let err = open_device(DeviceArgs {
            ib_dev: Some("lo".into()),
            gid_idx: Some(0),
            ..DeviceArgs::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("GID index 0 of lo is the link-local GID"),
            "{err}"
        );
    }

    #[test]
    fn unknown_interface_lists_the_others() {
        let err = open_device(DeviceArgs {
            ib_dev: Some("nosuchif0".into()),
            ..DeviceArgs::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("nosuchif0"), "{err}");
        assert!(err.contains("lo"), "{err}");
    }
}
