//! The two links the benchmarks run over: loopback (`127.0.0.1` → `127.0.0.2`) and a veth pair
//! between two network namespaces that [`VethPair::create`] makes and always removes.
//!
//! Names carry the process id (`rb<pid>a`, `rb<pid>b`, both for the namespaces and for the veth
//! ends), so concurrent runs do not collide and [`cleanup_stale`] can remove what a killed run
//! left behind. Cleanup happens on drop (also when unwinding from a panic) and, after
//! [`install_signal_cleanup`], on SIGINT/SIGTERM/SIGHUP. Only SIGKILL leaves namespaces behind;
//! the next run removes them.
//!
//! A thread joins a namespace with [`enter`] (`setns(2)` affects the calling thread only), so a
//! sender thread in one namespace and a receiver thread in the other share one process.

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::{Mutex, Once};

use anyhow::{bail, Context as _, Result};
use nix::sched::{setns, CloneFlags};

/// Namespaces created by this process and not yet deleted (for the signal handler).
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());
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
    mtu: u32,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip(8)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn delete_ns(name: &str) {
    // Deleting a namespace destroys the veth end inside it, and with it the peer.
    let _ = Command::new("ip").args(["netns", "delete", name]).output();
}

impl VethPair {
    /// Subnet of the pair: `10.213.0.1/24` (side a) and `10.213.0.2/24` (side b).
    pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
    /// Address of side b.
    pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);

    /// Creates namespaces `rb<pid>a`/`rb<pid>b` joined by a veth pair with `mtu` (9000 carries
    /// a PMTU-4096 RoCE packet: 20 + 8 + 12 + 4096 + 4 = 4140 bytes of IP packet).
    ///
    /// # Errors
    /// When `ip` fails (not root, no netns support); what was created is removed again.
    pub fn create(mtu: u32) -> Result<Self> {
        install_signal_cleanup();
        cleanup_stale();
        let pid = std::process::id();
        let (na, nb) = (format!("rb{pid}a"), format!("rb{pid}b"));
        let pair = Self {
            link: Link {
                name: "veth",
                a: Side {
                    ns: Some(na.clone()),
                    dev: na.clone(),
                    addr: Self::ADDR_A,
                },
                b: Side {
                    ns: Some(nb.clone()),
                    dev: nb.clone(),
                    addr: Self::ADDR_B,
                },
            },
            mtu,
        };
        // Register before creating so that a signal in between still cleans up.
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([na.clone(), nb.clone()]);
        pair.setup().inspect_err(|_| drop_names(&[&na, &nb]))?;
        Ok(pair)
    }

    fn setup(&self) -> Result<()> {
        let (a, b) = (&self.link.a, &self.link.b);
        let (na, nb) = (a.ns.as_deref().unwrap_or(""), b.ns.as_deref().unwrap_or(""));
        let mtu = self.mtu.to_string();
        ip(&["netns", "add", na])?;
        ip(&["netns", "add", nb])?;
        ip(&[
            "link", "add", &a.dev, "type", "veth", "peer", "name", &b.dev,
        ])?;
        for (ns, side) in [(na, a), (nb, b)] {
            ip(&["link", "set", &side.dev, "netns", ns])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", side.addr),
                "dev",
                &side.dev,
            ])?;
            ip(&["-n", ns, "link", "set", &side.dev, "mtu", &mtu, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The link over this pair.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The MTU of both veth ends.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }
}

fn drop_names(names: &[&str]) {
    for n in names {
        delete_ns(n);
    }
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|l| !names.contains(&l.as_str()));
}

impl Drop for VethPair {
    fn drop(&mut self) {
        let names: Vec<String> = [&self.link.a.ns, &self.link.b.ns]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        drop_names(&names.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// Moves the calling thread into network namespace `ns` (no-op for `None`). Sockets the thread
/// creates afterwards belong to that namespace, wherever they are used later.
///
/// # Errors
/// When the namespace does not exist or `setns` is not permitted.
pub fn enter(ns: Option<&str>) -> Result<()> {
    let Some(ns) = ns else { return Ok(()) };
    let f = File::open(format!("/run/netns/{ns}")).with_context(|| format!("netns {ns}"))?;
    setns(f, CloneFlags::CLONE_NEWNET).with_context(|| format!("setns {ns}"))?;
    Ok(())
}

/// Deletes `rb<pid>a`/`rb<pid>b` namespaces whose process no longer exists.
pub fn cleanup_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix("rb")
            .and_then(|r| r.strip_suffix(['a', 'b']))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_ns(name);
        }
    }
}

/// On SIGINT, SIGTERM or SIGHUP: delete this process's namespaces, then exit with 130.
/// Idempotent.
pub fn install_signal_cleanup() {
    SIGNALS.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            let names = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
            for n in &names {
                delete_ns(n);
            }
            eprintln!("interrupted: removed namespaces {names:?}");
            std::process::exit(130);
        });
    });
}
