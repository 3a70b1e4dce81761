//! `rocectl devinfo`: the devices rocectl can open, printed like `ibv_devinfo -v`.
//!
//! A rocectl device is a network interface ([`crate::device`]); this lists every interface
//! that has an IP address (or the one given with `-d`), with its port attributes and the GID
//! table rdma_rxe would build for it, in `ibv_devinfo`'s layout so that the stock habits
//! (`ibv_devinfo -v | grep GID`) carry over (tabs shown as spaces):
//!
//! ```text
//! hca_id:    eth0
//!     transport:            RoCE v2 (rocectl)
//!     ...
//!         port:    1
//!             state:            PORT_ACTIVE (4)
//!             max_mtu:        1024 (3)
//!             active_mtu:        1024 (3)
//!             ...
//!             link_layer:        Ethernet
//!             GID[  0]:        fe80::5054:ff:fe77:1, RoCE v2
//!             GID[  1]:        ::ffff:10.77.0.1, RoCE v2
//! ```
//!
//! Nothing is opened and nothing needs privileges: the values come from the interface
//! (`getifaddrs`, `SIOCGIFMTU`) and from the device limits of the transport, which `-v` reads
//! from a device opened on an ephemeral UDP port (so a running tool holding port 4791 is no
//! obstacle). `max_mtu` is the largest path MTU the interface MTU carries (rxe says 4096 and
//! then drops what does not fit); GID entries whose address is not configured (index 0 when
//! IPv6 is off) are marked, as rocectl cannot send from them.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use roce_transport::netdev::{self, NetDevice};
use roce_transport::{Backend, Device, DeviceAttr, DeviceConfig, Mtu};

use crate::device::ip_text;

/// `rocectl devinfo` options.
#[derive(Debug, Args)]
pub(crate) struct DevinfoArgs {
    /// Show only the device (network interface) IFNAME
    #[arg(short = 'd', long = "ib-dev", value_name = "IFNAME")]
    ib_dev: Option<String>,
    /// Print all the attributes of the device(s)
    #[arg(short = 'v', long)]
    verbose: bool,
}

/// Runs `rocectl devinfo`.
pub(crate) fn run(args: &DevinfoArgs) -> anyhow::Result<ExitCode> {
    let devs: Vec<NetDevice> = match &args.ib_dev {
        Some(name) => vec![netdev::interface(name).map_err(|e| anyhow::anyhow!("{e}"))?],
        None => netdev::interfaces()
            .context("listing the network interfaces")?
            .into_iter()
            .filter(|d| d.addrs().next().is_some())
            .collect(),
    };
    if devs.is_empty() {
        println!("No IB devices found");
        return Ok(ExitCode::FAILURE);
    }
    let mut out = String::new();
    for (i, dev) in devs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let limits = if args.verbose { limits(dev) } else { None };
        describe(&mut out, dev, args.verbose, limits.as_ref());
    }
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// Appends one device's description.
fn describe(out: &mut String, dev: &NetDevice, verbose: bool, limits: Option<&DeviceAttr>) {
    let guid = node_guid(dev.mac);
    let _ = writeln!(out, "hca_id:\t{}", dev.name);
    let _ = writeln!(out, "\ttransport:\t\t\tRoCE v2 (rocectl)");
    let _ = writeln!(out, "\tfw_ver:\t\t\t\t{}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(out, "\tnode_guid:\t\t\t{guid}");
    let _ = writeln!(out, "\tsys_image_guid:\t\t\t{guid}");
    let _ = writeln!(out, "\tvendor_id:\t\t\t0xffffff");
    let _ = writeln!(out, "\tvendor_part_id:\t\t\t0");
    let _ = writeln!(out, "\thw_ver:\t\t\t\t0x0");
    let _ = writeln!(out, "\tphys_port_cnt:\t\t\t1");
    if let Some(a) = limits {
        let _ = writeln!(out, "\tmax_qp:\t\t\t\t{}", a.max_qp);
        let _ = writeln!(out, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        let _ = writeln!(out, "\tmax_sge:\t\t\t{}", a.max_sge);
        let _ = writeln!(out, "\tmax_cqe:\t\t\t{}", a.max_cqe);
        let _ = writeln!(out, "\tmax_mr:\t\t\t\t{}", a.max_mr);
        let _ = writeln!(out, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        let _ = writeln!(out, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        let _ = writeln!(out, "\tatomic_cap:\t\t\t{} (1)", a.atomic_cap);
        // As ibv_devinfo -v: the hex value, then one flag name per line.
        let flags = a.device_cap_flags_ex;
        let _ = writeln!(out, "\tdevice_cap_flags_ex:\t\t0x{:X}", flags.bits());
        for name in flags.names() {
            let _ = writeln!(out, "\t\t\t\t\t{name}");
        }
    }
    let max = Mtu::for_netdev_mtu((dev.mtu as usize).min(4096 + 80));
    let (state, phys) = if dev.up && dev.running {
        ("PORT_ACTIVE (4)", "LINK_UP (5)")
    } else {
        ("PORT_DOWN (1)", "DISABLED (3)")
    };
    let _ = writeln!(out, "\t\tport:\t1");
    let _ = writeln!(out, "\t\t\tstate:\t\t\t{state}");
    let mtu_text = |m: Option<Mtu>| {
        m.map_or_else(
            || format!("none (interface MTU {} is below 336)", dev.mtu),
            |m| format!("{} ({})", m.bytes(), m as u8),
        )
    };
    let _ = writeln!(out, "\t\t\tmax_mtu:\t\t{}", mtu_text(max));
    let _ = writeln!(out, "\t\t\tactive_mtu:\t\t{}", mtu_text(max));
    let _ = writeln!(out, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(out, "\t\t\tport_lid:\t\t0");
    let _ = writeln!(out, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(out, "\t\t\tlink_layer:\t\tEthernet");
    let table = dev.gid_table();
    if verbose {
        let _ = writeln!(out, "\t\t\tnetdev_mtu:\t\t{}", dev.mtu);
        let _ = writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", table.len());
        let _ = writeln!(out, "\t\t\tphys_state:\t\t{phys}");
    }
    for e in &table {
        let ip = e.gid.to_ip();
        let note = if dev.has_addr(ip) {
            ""
        } else {
            "  (address not configured: unusable)"
        };
        let _ = writeln!(
            out,
            "\t\t\tGID[{:>3}]:\t\t{}, {}{note}",
            e.index,
            ip_text(e.gid),
            e.kind
        );
    }
}

/// The transport's device limits, read from a device opened on an ephemeral port of one of
/// the interface's addresses (`None` if none can be bound).
fn limits(dev: &NetDevice) -> Option<DeviceAttr> {
    dev.addrs()
        .filter(|ip| match ip {
            IpAddr::V6(v6) => v6.segments()[0] & 0xFFC0 != 0xFE80,
            IpAddr::V4(_) => true,
        })
        .find_map(|local| {
            let config = DeviceConfig::new(Backend::Udp { local, port: 0 }).name(dev.name.clone());
            Device::open(config).ok().map(|d| d.query_device())
        })
}

/// The node GUID rxe reports: the EUI-64 of the MAC, as four groups of four hex digits.
fn node_guid(mac: Option<[u8; 6]>) -> String {
    let b = match mac {
        Some(m) => [m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]],
        None => [0; 8],
    };
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use roce_transport::netdev::Ipv4Net;

    use super::*;

    #[test]
    fn node_guid_is_rxes() {
        // shared/captures/guest-A-info.txt: MAC 52:54:00:77:00:01.
        assert_eq!(
            node_guid(Some([0x52, 0x54, 0x00, 0x77, 0x00, 0x01])),
            "5054:00ff:fe77:0001"
        );
        assert_eq!(node_guid(Some([0; 6])), "0200:00ff:fe00:0000");
    }

    #[test]
    fn lab_guest_port_and_gids() {
        let dev = NetDevice {
            name: "eth0".into(),
            index: 2,
            mac: Some([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]),
            mtu: 1500,
            up: true,
            running: true,
            loopback: false,
            ipv4: vec![Ipv4Net {
                addr: Ipv4Addr::new(10, 77, 0, 1),
                prefix: 24,
            }],
            ipv6: vec![],
        };
        let mut out = String::new();
        describe(&mut out, &dev, true, None);
        assert!(out.starts_with("hca_id:\teth0\n"), "{out}");
        assert!(out.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"), "{out}");
        assert!(out.contains("\t\t\tactive_mtu:\t\t1024 (3)\n"), "{out}");
        assert!(out.contains("\t\t\tlink_layer:\t\tEthernet\n"), "{out}");
        // As guest-A-info.txt, plus the note: IPv6 is off there, so fe80:: is not configured.
        assert!(
            out.contains(
                "\t\t\tGID[  0]:\t\tfe80::5054:ff:fe77:1, RoCE v2  (address not configured: \
                 unusable)\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("\t\t\tGID[  1]:\t\t::ffff:10.77.0.1, RoCE v2\n"),
            "{out}"
        );
    }

    /// `-v` prints the extended capabilities as ibv_devinfo -v does: the value, then a name
    /// per line.
    #[test]
    fn verbose_shows_the_extended_capabilities() {
        let net = roce_transport::SimNetwork::perfect();
        let config = DeviceConfig::sim(&net, "10.9.4.1".parse().unwrap()).name("sim-v");
        let attr = Device::open(config).unwrap().query_device();
        let dev = NetDevice {
            name: "sim-v".into(),
            index: 2,
            mac: None,
            mtu: 1500,
            up: true,
            running: true,
            loopback: false,
            ipv4: vec![],
            ipv6: vec![],
        };
        let mut out = String::new();
        describe(&mut out, &dev, true, Some(&attr));
        assert!(
            out.contains(
                "\tdevice_cap_flags_ex:\t\t0x1C000000000\n\t\t\t\t\tFLUSH_GLOBAL\n\
                 \t\t\t\t\tFLUSH_PERSISTENT\n\t\t\t\t\tATOMIC_WRITE\n"
            ),
            "{out}"
        );
    }
}
