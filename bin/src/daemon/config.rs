//! The daemon's configuration file (TOML, `/etc/rocectl/rocectl.toml`): parsed strictly
//! (unknown keys are errors), checked, then resolved against the host (the interface's
//! address, the socket's group).
//!
//! ```toml
//! mode = "kernel-demux"            # or "forwarding" (several users)
//! interface = "eth0"               # or: address = "192.0.2.1" (one of the two)
//!
//! [socket]
//! path = "/run/rocectl/rocectl.sock"
//! mode = 0o660
//! group = "rdma"                   # name or number; default: the daemon's group
//!
//! [qpn]
//! range_size = 65536               # QPNs per client (power of two, 256 ..= 1048576)
//! quarantine_ms = 10000            # a dead client's range waits this long before reuse
//!
//! [demux]
//! pin_dir = "/sys/fs/bpf/rocectl"  # keep the demultiplexer across daemon restarts
//!
//! [limits]
//! max_clients = 64                 # device clients at once (default: as many as ranges)
//! [limits.per_uid]                 # every client of one uid together
//! clients = 16
//! qps = 4096
//! [limits.per_client]              # one process's device
//! qps = 1024
//! cqs = 1024
//! mrs = 4096
//! mr_bytes = 17179869184
//! ```
//!
//! A limit that is not set is not enforced.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use roce_transport::control::{Mode, DEFAULT_SOCKET};
use serde::Deserialize;

/// The default configuration file.
pub(crate) const DEFAULT_CONFIG: &str = "/etc/rocectl/rocectl.toml";

/// The file as written.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// The data-path mode.
    #[serde(default = "default_mode")]
    pub(crate) mode: Mode,
    /// The interface whose address the daemon serves.
    pub(crate) interface: Option<String>,
    /// The address the daemon serves.
    pub(crate) address: Option<IpAddr>,
    /// The control socket.
    #[serde(default)]
    pub(crate) socket: SocketConfig,
    /// QPN ranges.
    #[serde(default)]
    pub(crate) qpn: QpnConfig,
    /// Resource limits.
    #[serde(default)]
    pub(crate) limits: Limits,
    /// The kernel demultiplexer.
    #[serde(default)]
    pub(crate) demux: DemuxConfig,
}

/// `[demux]`.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct DemuxConfig {
    /// A directory in a BPF filesystem where the group's map and program are pinned: a
    /// restarted daemon takes the same group back, so established clients keep their data
    /// path and new ones join the same map. Without it a restart strands the old clients.
    pub(crate) pin_dir: Option<PathBuf>,
}

fn default_mode() -> Mode {
    Mode::KernelDemux
}

/// `[socket]`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SocketConfig {
    /// Path of the Unix socket.
    #[serde(default = "default_socket")]
    pub(crate) path: PathBuf,
    /// Permission bits (`0o660`).
    #[serde(default = "default_socket_mode")]
    pub(crate) mode: u32,
    /// Owning group, by name or number.
    pub(crate) group: Option<Group>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            path: default_socket(),
            mode: default_socket_mode(),
            group: None,
        }
    }
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}

fn default_socket_mode() -> u32 {
    0o660
}

/// A group name or number.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub(crate) enum Group {
    /// A gid.
    Id(u32),
    /// A name from `/etc/group`.
    Name(String),
}

/// `[qpn]`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct QpnConfig {
    /// QPNs per client.
    #[serde(default = "default_range_size")]
    pub(crate) range_size: u32,
    /// How long a dead client's range stays unused (ms).
    #[serde(default = "default_quarantine_ms")]
    pub(crate) quarantine_ms: u64,
}

impl Default for QpnConfig {
    fn default() -> Self {
        Self {
            range_size: default_range_size(),
            quarantine_ms: default_quarantine_ms(),
        }
    }
}

fn default_range_size() -> u32 {
    1 << 16
}

/// Longer than an RC retry window at the default timeout (14: 67 ms × 8 tries) many times
/// over, so late packets for a dead client's QPNs never reach the range's next owner.
fn default_quarantine_ms() -> u64 {
    10_000
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limits {
    /// Device clients at once, daemon-wide.
    pub(crate) max_clients: Option<u32>,
    /// Every client of one uid together.
    #[serde(default)]
    pub(crate) per_uid: ObjectLimits,
    /// One client.
    #[serde(default)]
    pub(crate) per_client: ObjectLimits,
}

/// Limits on objects (absent: not limited).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ObjectLimits {
    /// Device clients (meaningful per uid only).
    pub(crate) clients: Option<u32>,
    /// Queue pairs.
    pub(crate) qps: Option<u32>,
    /// Completion queues.
    pub(crate) cqs: Option<u32>,
    /// Memory regions.
    pub(crate) mrs: Option<u32>,
    /// Registered bytes.
    pub(crate) mr_bytes: Option<u64>,
}

impl Config {
    /// Parses and checks `text` (from `origin`, for messages).
    ///
    /// # Errors
    /// One line saying where and what: a TOML syntax error, an unknown key, a wrong type, a
    /// value out of range.
    pub(crate) fn parse(text: &str, origin: &Path) -> Result<Self, String> {
        let cfg: Self = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" line {line}:")
                })
                .unwrap_or_default();
            let msg = e.message().lines().next().unwrap_or("").trim().to_owned();
            format!("{}:{at} {msg}", origin.display())
        })?;
        cfg.check()
            .map_err(|m| format!("{}: {m}", origin.display()))?;
        Ok(cfg)
    }

    /// Reads and parses `path`.
    ///
    /// # Errors
    /// The file cannot be read, or [`Self::parse`] fails.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text, path)
    }

    fn check(&self) -> Result<(), String> {
        let size = self.qpn.range_size;
        if !size.is_power_of_two() || !(256..=1 << 23).contains(&size) {
            return Err(format!(
                "qpn.range_size = {size}: must be a power of two from 256 to 8388608"
            ));
        }
        if self.socket.mode > 0o777 {
            return Err(format!(
                "socket.mode = {:#o}: permission bits only (at most 0o777)",
                self.socket.mode
            ));
        }
        if !self.socket.path.is_absolute() {
            return Err(format!(
                "socket.path = {:?}: must be an absolute path",
                self.socket.path.display().to_string()
            ));
        }
        if size > 1 << 20 {
            return Err(format!(
                "qpn.range_size = {size}: at most 1048576 QPNs per range (16 ranges)"
            ));
        }
        if self.limits.max_clients == Some(0) {
            return Err("limits.max_clients = 0 would refuse every client".into());
        }
        Ok(())
    }

    /// The number of QPN ranges (slot 0 is the daemon's).
    pub(crate) fn slots(&self) -> u32 {
        (1u32 << 24) / self.qpn.range_size
    }

    /// The quarantine.
    pub(crate) fn quarantine(&self) -> Duration {
        Duration::from_millis(self.qpn.quarantine_ms)
    }

    /// The address to serve: `address`, else the first address of `interface` (IPv4 first).
    ///
    /// # Errors
    /// Neither is set, the interface does not exist or has no address, or the address is
    /// not on the interface (or on no interface of this host).
    pub(crate) fn resolve_address(&self) -> Result<IpAddr, String> {
        use roce_transport::netdev;
        match (&self.interface, self.address) {
            (None, None) => Err(
                "no address to serve: set `address` or `interface` in the config, or pass --address"
                    .into(),
            ),
            (Some(name), addr) => {
                let all = netdev::interfaces().map_err(|e| format!("listing interfaces: {e}"))?;
                let dev = all.iter().find(|d| &d.name == name).ok_or_else(|| {
                    let names: Vec<_> = all.iter().map(|d| d.name.as_str()).collect();
                    format!(
                        "interface = {name:?}: no such interface (interfaces: {})",
                        names.join(", ")
                    )
                })?;
                match addr {
                    Some(a) if dev.has_addr(a) => Ok(a),
                    Some(a) => Err(format!("address {a} is not on interface {name}")),
                    None => dev
                        .addrs()
                        .next()
                        .ok_or_else(|| format!("interface {name} has no IP address")),
                }
            }
            (None, Some(a)) => netdev::interface_for_addr(a)
                .map(|_| a)
                .map_err(|e| format!("address = {a}: {e}")),
        }
    }
}

/// The gid of `group`: a number as is, a name looked up in `/etc/group`.
///
/// # Errors
/// An unknown name.
pub(crate) fn resolve_group(group: &Group) -> Result<u32, String> {
    match group {
        Group::Id(id) => Ok(*id),
        Group::Name(name) => {
            let text = std::fs::read_to_string("/etc/group")
                .map_err(|e| format!("socket.group = {name:?}: reading /etc/group: {e}"))?;
            text.lines()
                .filter_map(|l| {
                    let mut f = l.split(':');
                    let n = f.next()?;
                    let gid = f.nth(1)?.parse::<u32>().ok()?;
                    (n == name).then_some(gid)
                })
                .next()
                .ok_or_else(|| format!("socket.group = {name:?}: no such group in /etc/group"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.mode, Mode::KernelDemux);
        assert_eq!(c.socket.path, Path::new("/run/rocectl/rocectl.sock"));
        assert_eq!(c.socket.mode, 0o660);
        assert_eq!(c.qpn.range_size, 65_536);
        assert_eq!(c.slots(), 256);
        assert_eq!(c.quarantine(), Duration::from_secs(10));
        assert_eq!(c.limits, Limits::default());
    }

    #[test]
    fn a_full_file_parses() {
        let c = parse(
            r#"
mode = "kernel-demux"
address = "127.0.0.1"
[socket]
path = "/tmp/x.sock"
mode = 0o600
group = "rdma"
[qpn]
range_size = 4096
quarantine_ms = 250
[limits]
max_clients = 8
[limits.per_uid]
clients = 2
qps = 10
[limits.per_client]
qps = 4
cqs = 4
mrs = 16
mr_bytes = 1048576
"#,
        )
        .unwrap();
        assert_eq!(c.address, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(c.socket.mode, 0o600);
        assert_eq!(c.socket.group, Some(Group::Name("rdma".into())));
        assert_eq!(c.slots(), 4096);
        assert_eq!(c.limits.per_uid.clients, Some(2));
        assert_eq!(c.limits.per_client.mr_bytes, Some(1 << 20));
        assert_eq!(
            parse("[socket]\ngroup = 5").unwrap().socket.group,
            Some(Group::Id(5))
        );
    }

    /// Every mistake is one line that names the file, the line and the key.
    #[test]
    fn mistakes_are_one_clear_line() {
        let cases: [(&str, &str); 9] = [
            ("modee = 1", "test.toml: line 1: unknown field `modee`"),
            ("[socket]\npaht = \"/x\"", "line 2: unknown field `paht`"),
            ("mode = \"bpf\"", "line 1: unknown variant `bpf`"),
            ("[qpn]\nrange_size = \"big\"", "line 2: invalid type"),
            (
                "[qpn]\nrange_size = 1000",
                "qpn.range_size = 1000: must be a power of two",
            ),
            ("[qpn]\nrange_size = 128", "power of two from 256"),
            ("[qpn]\nrange_size = 2097152", "at most 1048576 QPNs"),
            ("mode = \"forward\"", "unknown variant `forward`"),
            ("address = \"10.0.0.300\"", "line 1: invalid IP address"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
            assert!(!e.contains('\n'), "{text:?}: not one line: {e:?}");
        }
        let e = parse("x = [").unwrap_err();
        assert!(e.starts_with("test.toml: line 1:"), "{e}");
        let e = parse("[socket]\nmode = 0o1777").unwrap_err();
        assert!(e.contains("at most 0o777"), "{e}");
        let e = parse("[socket]\npath = \"relative.sock\"").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let e = parse("[limits]\nmax_clients = 0").unwrap_err();
        assert!(e.contains("refuse every client"), "{e}");
    }

    /// The example shipped in packaging/ is a valid file.
    #[test]
    fn the_packaged_example_parses() {
        let text = include_str!("../../../packaging/rocectl.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.interface.as_deref(), Some("eth0"));
        assert_eq!(c.socket.group, Some(Group::Name("rdma".into())));
        assert_eq!(c.quarantine(), Duration::from_secs(10));
    }

    #[test]
    fn groups_resolve_by_number_and_name() {
        assert_eq!(resolve_group(&Group::Id(7)).unwrap(), 7);
        assert_eq!(resolve_group(&Group::Name("root".into())).unwrap(), 0);
        let e = resolve_group(&Group::Name("no-such-group-xyz".into())).unwrap_err();
        assert!(e.contains("no such group"), "{e}");
    }

    #[test]
    fn the_address_comes_from_the_config_or_the_interface() {
        let c = parse("address = \"127.0.0.1\"").unwrap();
        assert_eq!(
            c.resolve_address().unwrap(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let c = parse("interface = \"lo\"").unwrap();
        assert!(c.resolve_address().unwrap().is_loopback());
        let e = parse("interface = \"nope0\"")
            .unwrap()
            .resolve_address()
            .unwrap_err();
        assert!(e.contains("no such interface"), "{e}");
        let e = parse("").unwrap().resolve_address().unwrap_err();
        assert!(e.contains("no address to serve"), "{e}");
        let e = parse("address = \"192.0.2.77\"")
            .unwrap()
            .resolve_address()
            .unwrap_err();
        assert!(e.contains("192.0.2.77"), "{e}");
    }
}
