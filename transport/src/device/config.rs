//! How to open a device: the backend, who drives the engine, capture and seed.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use roce_qp::verbs::Mtu;

use crate::capture::CaptureFile;
use crate::clock::Clock;
use crate::datapath::demux::Demux;
use crate::datapath::sim::SimNetwork;
use crate::datapath::Datapath;
use crate::error::OpenError;
use crate::netdev::NetdevError;

/// Which datapath a device uses.
#[derive(Debug)]
#[non_exhaustive]
pub enum Backend {
    /// Kernel UDP sockets bound to `local`:`port` (4791 for interoperability). No privileges.
    Udp {
        /// Local IP address (IPv4 or IPv6) the socket binds to.
        local: IpAddr,
        /// UDP port (4791 unless testing).
        port: u16,
    },
    /// Whole Ethernet frames on an interface (`AF_PACKET`); needs `CAP_NET_RAW`.
    Raw {
        /// Interface name.
        ifname: String,
        /// Our IP address on it.
        local: IpAddr,
    },
    /// A port on an in-memory network.
    Sim {
        /// The network.
        net: SimNetwork,
        /// Our address on it.
        local: IpAddr,
    },
    /// Any other [`Datapath`].
    Custom(Box<dyn Datapath>),
}

/// Who drives the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// A thread per engine (one per device unless [`DeviceConfig::engines`] asks for more)
    /// receives, fires timers and sends; posts send at once from the caller's thread. CQ
    /// polls that find nothing also make progress themselves.
    #[default]
    Thread,
    /// The application drives: [`crate::Device::progress`] and [`crate::Device::progress_wait`], or CQ
    /// polls (a collective library polling its CQs needs nothing else).
    Manual,
}

/// How to open a device.
#[derive(Debug)]
pub struct DeviceConfig {
    /// The datapath.
    pub backend: Backend,
    /// Device name (`ibv_devinfo`'s `hca_id`).
    pub name: String,
    /// Active path MTU; default: the largest the interface MTU allows (as rxe), at most 4096.
    pub mtu: Option<Mtu>,
    /// Who drives the engine.
    pub progress: Progress,
    /// Write every frame sent and received to this pcap file. Without it the environment
    /// variable `ROCECTL_PCAP` is used; `{dev}` in either is replaced by the device name.
    pub pcap: Option<PathBuf>,
    /// A capture file shared with other devices (one pcap of several devices' traffic);
    /// takes precedence over `pcap`.
    pub capture: Option<CaptureFile>,
    /// Seed for memory keys, initial PSNs and QPNs. `None` (the default): drawn from the
    /// operating system's random source, different on every open; set it only where a test
    /// needs identical runs (see [`DeviceConfig::seed`]).
    pub seed: Option<u64>,
    /// Memory-region table capacity.
    pub max_mr: u32,
    /// The clock the engine reads. Default: the `sim` network's clock on a `sim` backend, the
    /// system clock otherwise. With a [`crate::clock::VirtualClock`] and
    /// [`Progress::Manual`], a scenario on the `sim` backend replays exactly from its seeds.
    pub clock: Option<Arc<dyn Clock>>,
    /// Kernel demux (`udp` backend only): share the address with other processes, each
    /// receiving the datagrams of its own QPN range (see [`crate::datapath::demux`]). `None`
    /// (the default): this device holds the address alone.
    pub demux: Option<Demux>,
    /// Hand out QPNs only from this range (a daemon client's slot: forwarding mode, where
    /// the daemon routes by QPN). Kernel demux sets it from [`DeviceConfig::demux`]. `None`:
    /// all QPNs.
    pub qpn_range: Option<RangeInclusive<u32>>,
    /// Never use the rocectl daemon: the device binds its address alone, as when no daemon
    /// runs (also forced by `ROCECTL_EXCLUSIVE=1`). See [`crate::control`].
    pub exclusive: bool,
    /// The rocectl daemon's socket; default: `ROCECTL_DAEMON_SOCKET`, else
    /// `/run/rocectl/rocectl.sock`.
    pub daemon_socket: Option<PathBuf>,
    /// How many engines ("shards") drive the device, each with its own lock, datapath socket
    /// and engine thread, every QP owned by exactly one of them (see [`DeviceConfig::engines`]).
    /// Default 1.
    pub engines: usize,
    /// How long an engine thread keeps polling its datapath after a pass that received
    /// something, before it sleeps (see [`DeviceConfig::engine_spin`]). Default zero.
    pub engine_spin: std::time::Duration,
}

impl DeviceConfig {
    /// A device on `backend` with defaults.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            name: "rocectl0".into(),
            mtu: None,
            progress: Progress::Thread,
            pcap: None,
            capture: None,
            seed: None,
            max_mr: 1 << 16,
            clock: None,
            demux: None,
            qpn_range: None,
            exclusive: false,
            daemon_socket: None,
            engines: 1,
            engine_spin: std::time::Duration::ZERO,
        }
    }

    /// A `udp` device on `local`:4791.
    pub fn udp(local: IpAddr) -> Self {
        Self::new(Backend::Udp {
            local,
            port: roce_wire::frame::ROCEV2_PORT,
        })
    }

    /// A `udp` device on the address of GID index `gid_index` of the network interface
    /// `ifname`, named after the interface: what `ibv_open_device` on the rxe device of that
    /// interface plus GID index `gid_index` give a verbs program (`ibv_rc_pingpong -d rxe0 -g 1`).
    ///
    /// The GID table is the one Linux rdma_rxe builds for the interface
    /// ([`crate::netdev::NetDevice::gid_table`]): 0 is the link-local `fe80::` GID (not
    /// usable: rocectl cannot send from a link-local address), then one IPv4-mapped GID per
    /// IPv4 address, then the other IPv6 addresses; on an interface with one IPv4 address
    /// index 1 is that address. `rocectl devinfo -d IFNAME -v` prints the table.
    ///
    /// For the `raw` backend on the same address, take the IP from the table yourself and use
    /// [`Backend::Raw`].
    ///
    /// ```no_run
    /// use roce_transport::{Device, DeviceConfig, Progress};
    /// let config = DeviceConfig::interface("eth0", 1)?.progress(Progress::Manual);
    /// let dev = Device::open(config)?;
    /// # Ok::<(), roce_transport::OpenError>(())
    /// ```
    ///
    /// # Errors
    /// [`OpenError::NoSuchInterface`] (listing the interfaces), [`OpenError::NoSuchGid`]
    /// (with the table), [`OpenError::UnusableGid`] for the link-local GID or an address the
    /// interface no longer has, [`OpenError::Io`] if the interfaces cannot be listed.
    pub fn interface(ifname: &str, gid_index: u8) -> Result<Self, OpenError> {
        let dev = crate::netdev::interface(ifname).map_err(|e| match e {
            NetdevError::NoSuchInterface { name, available } => OpenError::NoSuchInterface {
                name,
                available: available.join(", "),
            },
            other => OpenError::Io(other.into()),
        })?;
        let table = dev.gid_table();
        let Some(entry) = table.iter().find(|e| e.index == gid_index) else {
            let listing: Vec<String> = table
                .iter()
                .map(|e| format!("[{}] {}", e.index, e.gid))
                .collect();
            return Err(OpenError::NoSuchGid {
                ifname: ifname.to_owned(),
                index: gid_index,
                len: table.len(),
                table: listing.join(", "),
            });
        };
        let ip = entry.gid.to_ip();
        let unusable = |reason| OpenError::UnusableGid {
            ifname: ifname.to_owned(),
            index: gid_index,
            gid: entry.gid,
            reason,
        };
        if let IpAddr::V6(v6) = ip {
            if v6.segments()[0] & 0xFFC0 == 0xFE80 {
                return Err(unusable(
                    "it is link-local, and rocectl cannot send from a link-local address; use \
                     an IPv4 or global IPv6 GID",
                ));
            }
        }
        if !dev.has_addr(ip) {
            return Err(unusable(
                "the interface does not have this address (not configured)",
            ));
        }
        Ok(Self::udp(ip).name(ifname))
    }

    /// A `sim` device with address `local` on `net`.
    pub fn sim(net: &SimNetwork, local: IpAddr) -> Self {
        Self::new(Backend::Sim {
            net: net.clone(),
            local,
        })
    }

    /// Sets the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the active path MTU.
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Sets who drives the engine.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Captures to a pcap file.
    pub fn pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }

    /// Captures into a file shared with other devices.
    pub fn capture(mut self, capture: &CaptureFile) -> Self {
        self.capture = Some(capture.clone());
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Shares the address through kernel demux: the `udp` backend joins `demux`'s group at
    /// its slot and QPNs are drawn from the slot's range only.
    pub fn demux(mut self, demux: Demux) -> Self {
        self.demux = Some(demux);
        self
    }

    /// Draws QPNs only from `range` (random within it; the reserved QPNs stay out).
    pub fn qpn_range(mut self, range: RangeInclusive<u32>) -> Self {
        self.qpn_range = Some(range);
        self
    }

    /// Opens the device in the in-process exclusive mode even when the rocectl daemon runs.
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Uses the rocectl daemon listening at `path` (instead of `ROCECTL_DAEMON_SOCKET` or
    /// `/run/rocectl/rocectl.sock`).
    pub fn daemon_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.daemon_socket = Some(path.into());
        self
    }

    /// Makes memory keys, initial PSNs (`Device::random_psn`) and QPNs deterministic: two
    /// devices opened with the same seed draw the same numbers in the same order. For tests
    /// only: predictable keys, PSNs and QPNs let an off-path attacker inject packets.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Runs the device on `n` engines (clamped to `1..=`[`MAX_ENGINES`]): `n` engine threads,
    /// `n` UDP sockets on the same `IP:4791` in one `SO_REUSEPORT` group, and the kernel steers
    /// each datagram to the engine that owns its destination QP (`DestQP % n`; QPNs are
    /// handed out so that QPN `% n` is the owning engine, QPs spread over the engines,
    /// least-loaded first). What NAPI GRO merged across engines is handed on in process.
    ///
    /// Only where the steering is ours: the `udp` backend of a device that holds its address
    /// alone (no daemon lease, no kernel demux membership, no forwarding ring). Anywhere else
    /// the device runs on one engine and says why ([`crate::Device::engines_fallback`]); that
    /// is not an error, since the result is correct, only not parallel. The library never
    /// reads the environment for this: the `rocectl` CLI tools read `ROCECTL_ENGINES`; the
    /// drop-in `libibverbs` keeps one engine.
    pub fn engines(mut self, n: usize) -> Self {
        self.engines = n.clamp(1, MAX_ENGINES);
        self
    }

    /// Lets each engine thread poll its datapath for up to `spin` after a pass that received
    /// something, instead of going to sleep on it at once: what a NIC's own processor does
    /// for the requests of a peer whose application is not polling here (RDMA READ,
    /// atomics, WRITE into an idle process), at the price of a core while requests keep
    /// coming. A request that arrives while the thread sleeps costs a wake-up (~10 µs
    /// here, ~35 µs on some virtual machines) before anything answers it. Zero (the default)
    /// sleeps at once. The spin polls the datapath's readiness descriptor without the engine
    /// lock and runs a pass when something is readable. Only on a datapath with such a
    /// descriptor, and not while an application thread polls or waits in the datapath itself
    /// (the engine thread then steps back: `device/thread.rs`). The `rocectl` latency tools
    /// and `atomic-bw` set 50 µs when they poll (the default, without `-e` or `--recv
    /// block`).
    pub fn engine_spin(mut self, spin: std::time::Duration) -> Self {
        self.engine_spin = spin;
        self
    }
}

/// The most engines a device runs ([`DeviceConfig::engines`]).
pub const MAX_ENGINES: usize = 64;
