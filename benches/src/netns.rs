//! The two links the benchmarks run over: loopback (`127.0.0.1` → `127.0.0.2`) and a veth pair
//! between two network namespaces that [`VethPair::create`] makes and always removes.
//!
//! The namespaces are the test kit's ([`roce_testkit::netns::NetnsPair`]): named
//! `roce-bench-<pid>-<n>-a` and `…-b` (veth ends `veth-a`, `veth-b`), so concurrent runs do
//! not collide and the next run removes what a killed one left behind. Cleanup happens on drop
//! (also when unwinding from a panic) and, after [`install_signal_cleanup`], on
//! SIGINT/SIGTERM/SIGHUP. Only SIGKILL leaves namespaces behind.
//!
//! A thread joins a namespace with [`enter`] (`setns(2)` affects the calling thread only), so a
//! sender thread in one namespace and a receiver thread in the other share one process.

use std::net::Ipv4Addr;
use std::sync::Once;

use anyhow::{Context as _, Result};
use roce_testkit::netns::{self as kit, NetnsEnd, NetnsPair};

static SIGNALS: Once = Once::new();

/// One side of a link: the namespace to join (none: the caller's) and the IPv4 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Side {
    /// Network namespace name (under `/run/netns`), or `None` for the current namespace.
    pub ns: Option<String>,
    /// Interface the address lives on (`lo` or the veth end).
    pub dev: String,
    /// The address to bind.
    pub addr: Ipv4Addr,
}

/// A link between two endpoints: `a` sends (client), `b` receives (server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Short name used in measurement ids: `lo` or `veth`.
    pub name: &'static str,
    /// Sender / client side.
    pub a: Side,
    /// Receiver / server side.
    pub b: Side,
}

impl Link {
    /// Loopback: `127.0.0.1` → `127.0.0.2` (two addresses, as `rocectl demo` uses).
    pub fn loopback() -> Self {
        let side = |addr| Side {
            ns: None,
            dev: "lo".into(),
            addr,
        };
        Self {
            name: "lo",
            a: side(Ipv4Addr::new(127, 0, 0, 1)),
            b: side(Ipv4Addr::new(127, 0, 0, 2)),
        }
    }
}

/// The loopback link inside a namespace of its own (only `lo`, up, 127.0.0.0/8 local):
/// other programs on the host binding 127.0.0.1:4791 or the bench's TCP ports (another
/// benchmark, a test) can neither collide with the runs nor share their sockets. Deleted on
/// drop (and by the signal cleanup).
#[derive(Debug)]
pub struct PrivateLoopback {
    link: Link,
    _ns: kit::TempNetns,
}

impl PrivateLoopback {
    /// Creates the namespace.
    ///
    /// # Errors
    /// When the namespace cannot be made (no root, no `ip`).
    pub fn create() -> Result<Self> {
        install_signal_cleanup();
        let ns = kit::TempNetns::create("bench-lo").context("creating the loopback namespace")?;
        let mut link = Link::loopback();
        link.a.ns = Some(ns.name().to_owned());
        link.b.ns = Some(ns.name().to_owned());
        Ok(Self { link, _ns: ns })
    }

    /// The link (named `lo`, both sides in the namespace).
    pub fn link(&self) -> &Link {
        &self.link
    }
}

impl Side {
    /// Prefix that runs a shell command on this side: `ip netns exec <ns> ` or nothing.
    pub fn exec_prefix(&self) -> String {
        self.ns
            .as_ref()
            .map_or_else(String::new, |ns| format!("ip netns exec {ns} "))
    }
}

/// A veth pair between two fresh namespaces; both are deleted on drop.
#[derive(Debug)]
pub struct VethPair {
    link: Link,
    pair: NetnsPair,
}

impl VethPair {
    /// Creates two namespaces joined by a veth pair with `mtu` (9000 carries a PMTU-4096 RoCE
    /// packet: 20 + 8 + 12 + 4096 + 4 = 4140 bytes of IP packet). The addresses are
    /// `10.X.Y.1/24` (side a) and `10.X.Y.2/24` (side b), with `X.Y` chosen per pair.
    ///
    /// # Errors
    /// When `ip` fails (not root, no netns support); what was created is removed again.
    pub fn create(mtu: u32) -> Result<Self> {
        install_signal_cleanup();
        let pair = NetnsPair::create_with_mtu("bench", mtu).context("creating the veth pair")?;
        let side = |e: &NetnsEnd| Side {
            ns: Some(e.ns_name().to_owned()),
            dev: e.ifname().to_owned(),
            addr: e.ipv4(),
        };
        let link = Link {
            name: "veth",
            a: side(pair.a()),
            b: side(pair.b()),
        };
        Ok(Self { link, pair })
    }

    /// The link over this pair.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The MTU of both veth ends.
    pub fn mtu(&self) -> u32 {
        self.pair.mtu()
    }
}

/// Moves the calling thread into network namespace `ns` (no-op for `None`). Sockets the thread
/// creates afterwards belong to that namespace, wherever they are used later.
///
/// # Errors
/// When the namespace does not exist or `setns` is not permitted.
pub fn enter(ns: Option<&str>) -> Result<()> {
    let Some(ns) = ns else { return Ok(()) };
    kit::enter_named(ns).with_context(|| format!("netns {ns}"))
}

/// On SIGINT, SIGTERM or SIGHUP: delete this process's namespaces, then exit with 130.
/// Idempotent.
pub fn install_signal_cleanup() {
    SIGNALS.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            let names = kit::delete_created();
            eprintln!("interrupted: removed namespaces {names:?}");
            std::process::exit(130);
        });
    });
}
