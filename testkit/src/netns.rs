//! Network namespaces and veth pairs for integration tests and benchmarks.
//!
//! - [`NetnsPair::create`] makes two fresh network namespaces joined by a veth pair, with IPv4
//!   and IPv6 addresses, links up and an MTU of your choice. Each side can lose a percentage of
//!   its RoCE datagrams ([`NetnsPair::set_loss`], nftables). Dropping the pair deletes both
//!   namespaces, which deletes the veth pair with them.
//! - [`TempNetns::create`] makes one namespace with only `lo` (up, with 127.0.0.1 and
//!   127.0.0.2), for tests that run whole programs on loopback without sharing the host's
//!   ports.
//! - [`private_net`] moves the calling thread (only) into a fresh namespace with `lo` up.
//!
//! # Putting a socket in a namespace
//!
//! A socket belongs to the namespace of the thread that created it, for its whole life, and
//! keeps working there when other threads use it. So to put a socket (or a whole device) in a
//! namespace, *open* it inside [`Netns::enter_scoped`] and use it from anywhere:
//!
//! ```no_run
//! use roce_testkit::netns::NetnsPair;
//!
//! let pair = NetnsPair::create("doc").unwrap();
//! let a = pair.a();
//! let sock = a
//!     .netns()
//!     .enter_scoped(|| std::net::UdpSocket::bind((a.ipv4(), 4_791)))
//!     .unwrap() // entering the namespace
//!     .unwrap(); // binding
//! # drop(sock);
//! ```
//!
//! Child processes inherit the namespace of the thread that spawns them, so a `Command`
//! spawned inside [`Netns::enter_scoped`] also runs there.
//!
//! Everything here needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and the `ip` command
//! (iproute2); loss needs `nft` (nftables). [`netns_available`] says whether the host can do
//! it, and why not; [`netns_or_skip`] applies the crate's [skip policy](crate#the-skip-policy).
//!
//! Every command runs with a time limit ([`COMMAND_TIMEOUT`]); a failure is an
//! [`io::Error`] whose message holds the command line and its standard error.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The longest any one external command (`ip`, `nft`) may run before it is killed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Name of the nftables table that implements loss.
const LOSS_TABLE: &str = "roce_loss";
/// The RoCEv2 UDP port loss applies to.
const ROCE_PORT: u16 = 4_791;

/// A named network namespace (`/run/netns/NAME`), as `ip netns` manages them. This handle
/// does not own the namespace: [`NetnsPair`] deletes its own when dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A handle on the existing namespace `name` (nothing is checked until it is used).
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    /// The namespace's name (`ip netns list`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its file, `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// Runs `f` on a fresh thread that has entered this namespace, and returns its result.
    /// Sockets `f` creates stay in the namespace afterwards, whichever thread uses them: this
    /// is how devices and backends are put in a namespace (see the [module docs](self)).
    ///
    /// # Errors
    /// The namespace does not exist or cannot be entered, or the thread cannot be spawned.
    ///
    /// # Panics
    /// Re-raises a panic of `f` on the calling thread.
    pub fn enter_scoped<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        run_in(&self.name, f)
    }

    /// Runs `program args..` inside the namespace (`ip netns exec`), bounded by
    /// [`COMMAND_TIMEOUT`]; returns its standard output.
    ///
    /// # Errors
    /// The program cannot start, times out, or exits unsuccessfully; the message holds the
    /// command line and its standard error.
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<String> {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        run_command("ip", &all, None)
    }
}

impl fmt::Display for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Runs `f` on a fresh thread inside the named namespace `name` (`/run/netns/NAME`); see
/// [`Netns::enter_scoped`].
///
/// # Errors
/// The namespace does not exist or cannot be entered, or the thread cannot be spawned.
///
/// # Panics
/// Re-raises a panic of `f` on the calling thread.
pub fn run_in<T, F>(name: &str, f: F) -> io::Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let path = Path::new(NETNS_DIR).join(name);
    let file = File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {name:?} ({}): {e}", path.display()),
        )
    })?;
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name(format!("netns {name}"))
            .spawn_scoped(s, move || -> io::Result<T> {
                enter(&file)
                    .map_err(|e| io::Error::new(e.kind(), format!("setns into {name:?}: {e}")))?;
                Ok(f())
            })?;
        match handle.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Moves the calling thread into the network namespace `file` refers to.
fn enter(file: &File) -> io::Result<()> {
    setns(file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Moves the calling thread (only; `setns(2)` affects one thread) into the named namespace
/// `name` for the rest of its life. Sockets the thread creates afterwards belong to that
/// namespace, wherever they are used later. Prefer [`run_in`], which confines the move to a
/// scoped thread; this is for threads that live in one namespace throughout.
///
/// # Errors
/// The namespace does not exist, or `setns` is not permitted.
pub fn enter_named(name: &str) -> io::Result<()> {
    let path = Path::new(NETNS_DIR).join(name);
    let file = File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {name:?} ({}): {e}", path.display()),
        )
    })?;
    enter(&file).map_err(|e| io::Error::new(e.kind(), format!("setns into {name:?}: {e}")))
}

/// One side of a [`NetnsPair`]: its namespace, veth interface and addresses.
#[derive(Clone, Debug)]
pub struct NetnsEnd {
    netns: Netns,
    ifname: String,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
    mac: [u8; 6],
}

impl NetnsEnd {
    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The namespace's name.
    pub fn ns_name(&self) -> &str {
        self.netns.name()
    }

    /// The veth interface's name inside the namespace (`veth-a` or `veth-b`).
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The IPv4 address (`/24`).
    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    /// The IPv6 address (`/64`, configured without duplicate address detection so it is
    /// usable at once).
    pub fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }

    /// The veth interface's MAC address (locally administered, chosen at creation).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }
}

/// Which side of a [`NetnsPair`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first namespace (`…-a`, interface `veth-a`, addresses `.1` / `::1`).
    A,
    /// The second namespace (`…-b`, interface `veth-b`, addresses `.2` / `::2`).
    B,
}

/// Two network namespaces joined by a veth pair; deleted on drop.
///
/// Names are `roce-<tag>-<pid>-<n>-a` and `…-b`, unique per process, tag and call.
/// Addresses are `10.X.Y.1/24` and `10.X.Y.2/24`, and `fd00:X:Y::1/64` and `fd00:X:Y::2/64`,
/// with `X`, `Y` derived from the same three values. Both interfaces and both loopbacks are
/// up when [`NetnsPair::create`] returns.
#[derive(Debug)]
pub struct NetnsPair {
    a: NetnsEnd,
    b: NetnsEnd,
    mtu: u32,
}

/// Distinguishes namespaces created by one process with the same tag.
static PAIR_COUNTER: AtomicU32 = AtomicU32::new(0);

impl NetnsPair {
    /// Creates a pair with MTU 1500.
    ///
    /// # Errors
    /// Any `ip` command failing (see [`netns_available`] for the usual reasons).
    pub fn create(tag: &str) -> io::Result<Self> {
        Self::create_with_mtu(tag, 1500)
    }

    /// Creates a pair whose veth interfaces have MTU `mtu` (9000 for jumbo frames).
    ///
    /// # Errors
    /// Any `ip` command failing; a half-made pair is deleted again.
    pub fn create_with_mtu(tag: &str, mtu: u32) -> io::Result<Self> {
        remove_stale();
        let (base, h) = unique_base(tag);
        let (x, y) = ((h >> 8) as u8, h as u8);
        let end = |side: u8, host: u8| NetnsEnd {
            netns: Netns::named(format!("{base}-{}", char::from(side))),
            ifname: format!("veth-{}", char::from(side)),
            ipv4: Ipv4Addr::new(10, x, y, host),
            ipv6: Ipv6Addr::new(0xfd00, u16::from(x), u16::from(y), 0, 0, 0, 0, host.into()),
            mac: [0x02, 0x52, (h >> 16) as u8, x, y, host],
        };
        let pair = Self {
            a: end(b'a', 1),
            b: end(b'b', 2),
            mtu,
        };
        // From here on, dropping `pair` deletes whatever was made.
        pair.setup()?;
        Ok(pair)
    }

    fn setup(&self) -> io::Result<()> {
        for e in [&self.a, &self.b] {
            add_ns(e.ns_name())?;
        }
        let mac = |e: &NetnsEnd| format_mac(&e.mac);
        let (mac_a, mac_b) = (mac(&self.a), mac(&self.b));
        let mtu = self.mtu.to_string();
        ip(&[
            "link",
            "add",
            &self.a.ifname,
            "netns",
            self.a.ns_name(),
            "address",
            &mac_a,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &self.b.ifname,
            "netns",
            self.b.ns_name(),
            "address",
            &mac_b,
            "mtu",
            &mtu,
        ])?;
        for e in [&self.a, &self.b] {
            let ns = e.ns_name();
            let v4 = format!("{}/24", e.ipv4);
            let v6 = format!("{}/64", e.ipv6);
            ip(&["-n", ns, "addr", "add", &v4, "dev", &e.ifname])?;
            ip(&["-n", ns, "addr", "add", &v6, "dev", &e.ifname, "nodad"])?;
            ip(&["-n", ns, "link", "set", "dev", &e.ifname, "up"])?;
            ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
        }
        self.wait_ready()
    }

    /// Waits until both links have carrier and no IPv6 address is tentative. Even without
    /// duplicate address detection, an address becomes usable only when the kernel's
    /// address-configuration work has run, which can take a second or more while other
    /// namespaces are being torn down (that work and namespace cleanup share locks). Until
    /// then the kernel neither answers neighbour solicitations for it nor binds to it.
    fn wait_ready(&self) -> io::Result<()> {
        let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
        for e in [&self.a, &self.b] {
            let ns = e.ns_name();
            loop {
                let link = ip(&["-n", ns, "link", "show", "dev", &e.ifname])?;
                let tentative = ip(&[
                    "-n",
                    ns,
                    "-6",
                    "addr",
                    "show",
                    "dev",
                    &e.ifname,
                    "tentative",
                ])?;
                let ours = format!("{}/64", e.ipv6);
                if link.contains("LOWER_UP") && !tentative.contains(&ours) {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "{} in {ns} not ready after {COMMAND_TIMEOUT:?}: {} {}",
                            e.ifname,
                            link.trim(),
                            tentative.trim()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Side A.
    pub fn a(&self) -> &NetnsEnd {
        &self.a
    }

    /// Side B.
    pub fn b(&self) -> &NetnsEnd {
        &self.b
    }

    /// One side.
    pub fn end(&self, side: Side) -> &NetnsEnd {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// The veth MTU both sides use.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Makes `side` lose `percent`% of the RoCE datagrams it sends (UDP destination port
    /// 4791, and replies from source port 4791), each drawn independently. Call it for both
    /// sides to make both directions lossy; calling it again replaces the rate.
    ///
    /// The rule is an nftables `netdev` **egress** hook on `side`'s veth interface: it drops
    /// before the peer sees anything. An ingress or input hook would not do, because an
    /// `AF_PACKET` socket (the `raw` backend) receives frames before any ingress hook runs.
    /// Needs Linux 5.16 and nftables 1.0.1 or later.
    ///
    /// # Errors
    /// `percent` above 100; `nft` not installed (`NotFound`, saying which package to
    /// install); `nft` failing (the message holds its standard error).
    pub fn set_loss(&self, side: Side, percent: u8) -> io::Result<()> {
        if percent > 100 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("loss of {percent}% is more than 100%"),
            ));
        }
        let e = self.end(side);
        let script = format!(
            "add table netdev {LOSS_TABLE}\n\
             delete table netdev {LOSS_TABLE}\n\
             table netdev {LOSS_TABLE} {{\n\
             \tchain egress {{\n\
             \t\ttype filter hook egress device \"{dev}\" priority 0; policy accept;\n\
             \t\tudp dport {ROCE_PORT} numgen random mod 100 < {percent} drop\n\
             \t\tudp sport {ROCE_PORT} udp dport != {ROCE_PORT} numgen random mod 100 < {percent} drop\n\
             \t}}\n\
             }}\n",
            dev = e.ifname,
        );
        nft(e.netns(), &script)
    }

    /// Removes the loss rule of `side` (nothing happens if there was none).
    ///
    /// # Errors
    /// As [`Self::set_loss`].
    pub fn clear_loss(&self, side: Side) -> io::Result<()> {
        let script = format!("add table netdev {LOSS_TABLE}\ndelete table netdev {LOSS_TABLE}\n");
        nft(self.end(side).netns(), &script)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for e in [&self.a, &self.b] {
            delete_ns(e.ns_name());
        }
    }
}

/// One network namespace with only `lo`, up, holding 127.0.0.1/8 and 127.0.0.2/8 (two
/// endpoints on distinct loopback addresses); deleted on drop. Named `roce-<tag>-<pid>-<n>-s`.
///
/// Programs run in it with [`TempNetns::command`]; tests that each make one run in parallel
/// without sharing any port, and touch nothing of the host's.
#[derive(Debug)]
pub struct TempNetns {
    netns: Netns,
}

impl TempNetns {
    /// Creates the namespace and sets up `lo`.
    ///
    /// # Errors
    /// Any `ip` command failing (see [`netns_available`] for the usual reasons); a half-made
    /// namespace is deleted again.
    pub fn create(tag: &str) -> io::Result<Self> {
        remove_stale();
        let (base, _) = unique_base(tag);
        let ns = Self {
            netns: Netns::named(format!("{base}-s")),
        };
        add_ns(ns.netns.name())?;
        let name = ns.netns.name();
        ip(&["-n", name, "link", "set", "dev", "lo", "up"])?;
        ip(&["-n", name, "addr", "add", "127.0.0.2/8", "dev", "lo"])?;
        Ok(ns)
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Its name.
    pub fn name(&self) -> &str {
        self.netns.name()
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`,
    /// which enters the namespace and then executes `program` in the same process).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name(), program]);
        cmd
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        delete_ns(self.netns.name());
    }
}

/// Brings interface `name` up (`SIOCSIFFLAGS`) in the calling thread's namespace.
///
/// An ioctl in this thread rather than `ip link set lo up` in a child: with children spawned
/// from many test threads at once, the UDP loopback tests failed now and then with
/// `EADDRINUSE` on their first bind in a namespace that was provably fresh (a distinct
/// `/proc/thread-self/ns/net`); the in-thread ioctl, which they always used, never did.
fn set_up(name: &str) -> io::Result<()> {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    #[allow(unsafe_code)]
    // SAFETY: ifreq is plain C data; all zeroes is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = s as libc::c_char;
    }
    #[allow(unsafe_code)]
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read the NUL-terminated name (the zeroed array is
    // longer than `name`) and read/write the `ifru_flags` member of the live `req`.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req as *mut libc::ifreq) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut req as *mut libc::ifreq) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Namespaces this process created and has not deleted yet (for [`delete_created`]).
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<String>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `roce-<tag>-<pid>-<n>` (the tag reduced to at most 24 ASCII alphanumerics and `_`), unique
/// per process, tag and call, and a hash of it to derive addresses from.
fn unique_base(tag: &str) -> (String, u32) {
    let tag: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(24)
        .collect();
    let pid = std::process::id();
    let n = PAIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let h = fnv1a(format!("{tag}/{pid}/{n}").as_bytes());
    (format!("roce-{tag}-{pid}-{n}"), h)
}

/// `ip netns add name`, registered first so that [`delete_created`] also finds a namespace
/// whose creation was interrupted.
fn add_ns(name: &str) -> io::Result<()> {
    live().push(name.to_owned());
    ip(&["netns", "add", name]).map(drop)
}

/// Deletes the namespace if it exists (which deletes its veth end, and with it the peer);
/// reports a failure on standard error.
fn delete_ns(name: &str) {
    if Netns::named(name).path().exists() {
        if let Err(err) = ip(&["netns", "delete", name]) {
            eprintln!("netns: cannot delete {name}: {err}");
        }
    }
    live().retain(|n| n != name);
}

/// Deletes every namespace this process created and has not deleted yet, and returns their
/// names. For a handler of SIGINT/SIGTERM that is about to exit without unwinding (the
/// benchmarks'), so that an interrupted run leaves nothing behind; namespaces left by a
/// killed process are removed by the next process that creates one.
pub fn delete_created() -> Vec<String> {
    let names = live().clone();
    for n in &names {
        delete_ns(n);
    }
    names
}

/// Where the calling test thread's sockets live (see [`private_net`]).
#[derive(Debug)]
pub enum Net {
    /// A fresh namespace with only `lo` (up); nothing else is in it.
    Private,
    /// The host's namespace (no privilege for a private one); holds a lock that serialises
    /// all tests of this process that fell back to it.
    Host(MutexGuard<'static, ()>),
}

impl Net {
    /// Whether the namespace is private to this thread.
    pub fn is_private(&self) -> bool {
        matches!(self, Self::Private)
    }
}

/// Moves the calling thread (only: `unshare(CLONE_NEWNET)` affects one thread) into a new
/// network namespace with `lo` up, so tests can all use 127.0.0.1:4791 at once and do not
/// collide with other programs on the host. The thread stays there until it ends.
///
/// Without the privilege the test still runs, in the host's namespace, serialised with the
/// other tests that fell back ([`Net::Host`]), after a loud message saying that another
/// program on 127.0.0.x:4791 would make it fail.
///
/// # Panics
/// In CI (`CI` set), when a private namespace cannot be made: CI runs as root.
#[track_caller]
pub fn private_net() -> Net {
    static HOST_NAMESPACE: Mutex<()> = Mutex::new(());
    let err = match unshare(CloneFlags::CLONE_NEWNET) {
        // `ip` inherits the namespace of the thread that spawns it.
        Ok(()) => match set_up("lo") {
            Ok(()) => return Net::Private,
            Err(e) => e,
        },
        Err(e) => io::Error::from(e),
    };
    let test = crate::current_test();
    assert!(
        !crate::in_ci(),
        "{test}: cannot use a private network namespace ({err}), and CI is set"
    );
    crate::skip::loud(&format!(
        "!!! {test}: cannot use a private network namespace ({err}); running in the host's \
         namespace, where another program on 127.0.0.x:4791 will make this test fail\n"
    ));
    Net::Host(
        HOST_NAMESPACE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// Runs an nftables script inside `ns`.
fn nft(ns: &Netns, script: &str) -> io::Result<()> {
    if !command_exists("nft") {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "`nft` (nftables) is not installed; loss needs it: apt-get install -y nftables",
        ));
    }
    run_command(
        "ip",
        &["netns", "exec", ns.name(), "nft", "-f", "-"],
        Some(script),
    )
    .map(drop)
}

/// Deletes namespaces this module made in processes that no longer exist (a test killed
/// before its pairs were dropped). Best effort.
fn remove_stale() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // roce-<tag>-<pid>-<n>-<a|b|s>, with no '-' inside the tag.
            let parts: Vec<&str> = name.split('-').collect();
            let ["roce", _, pid, n, side] = parts.as_slice() else {
                continue;
            };
            let ours = n.parse::<u32>().is_ok() && matches!(*side, "a" | "b" | "s");
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if ours && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = ip(&["netns", "delete", &name]);
            }
        }
    });
}

/// Runs `ip args..`.
fn ip(args: &[&str]) -> io::Result<String> {
    run_command("ip", args, None)
}

/// Whether `program` is on `PATH` (or one of the sbin directories).
fn command_exists(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .any(|dir| dir.join(program).is_file())
}

/// Runs a command with a time limit, feeding it `stdin`; returns its standard output.
fn run_command(program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<String> {
    let line = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("`{line}`: cannot start {program}: {e}")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Small scripts: they fit the pipe, so this cannot block on a stuck child.
        pipe.write_all(text.as_bytes())?;
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        let status = child.wait();
        let _ = tx.send((status, out, err));
    });
    let Ok(result) = rx.recv_timeout(COMMAND_TIMEOUT) else {
        // The child has not been reaped (the waiter still waits for it), so `pid` is still
        // our child: killing it cannot hit another process.
        let _ = kill(
            Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
            Signal::SIGKILL,
        );
        let _ = waiter.join();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("`{line}` did not finish within {COMMAND_TIMEOUT:?}; killed"),
        ));
    };
    let _ = waiter.join();
    let (status, out, err) = result;
    let status = status?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "`{line}` failed ({status}): {}",
            err.trim()
        )));
    }
    Ok(out)
}

/// Why namespaces cannot be used here.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetnsUnavailable {
    /// Not running as root (namespaces and raw sockets need it).
    NotRoot,
    /// The `ip` command (iproute2) is missing or broken.
    NoIpCommand(String),
    /// The kernel was built without network namespaces (`CONFIG_NET_NS`).
    KernelLacksNetns(String),
    /// The kernel has no veth driver (`CONFIG_VETH`).
    KernelLacksVeth(String),
    /// Root, but not allowed to create namespaces (a container without `CAP_SYS_ADMIN`, a
    /// seccomp or LSM policy).
    NotPermitted(String),
}

impl NetnsUnavailable {
    /// Whether the *kernel* lacks the feature (so no configuration of this host would help,
    /// and a test may be skipped), as opposed to a fixable environment problem.
    pub fn kernel_lacks_support(&self) -> bool {
        matches!(self, Self::KernelLacksNetns(_) | Self::KernelLacksVeth(_))
    }

    /// Whether the process lacks the privilege (not root, or root in a container without
    /// `CAP_SYS_ADMIN`), as opposed to a missing tool.
    pub fn lacks_privilege(&self) -> bool {
        matches!(self, Self::NotRoot | Self::NotPermitted(_))
    }
}

impl fmt::Display for NetnsUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRoot => f.write_str(
                "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN): run the tests as root",
            ),
            Self::NoIpCommand(why) => {
                write!(f, "the `ip` command (iproute2) is not usable: {why}; apt-get install -y iproute2")
            }
            Self::KernelLacksNetns(why) => {
                write!(f, "this kernel has no network namespaces (CONFIG_NET_NS): {why}")
            }
            Self::KernelLacksVeth(why) => {
                write!(f, "this kernel has no veth driver (CONFIG_VETH): {why}")
            }
            Self::NotPermitted(why) => write!(
                f,
                "creating a network namespace is not permitted here (container without \
                 CAP_SYS_ADMIN, seccomp?): {why}"
            ),
        }
    }
}

impl std::error::Error for NetnsUnavailable {}

/// Whether this process can create namespaces and veth pairs, and if not, why. The probe
/// (a throw-away namespace with a veth pair in it) runs once per process.
///
/// # Errors
/// The reason, which also says whether only the kernel is to blame
/// ([`NetnsUnavailable::kernel_lacks_support`]).
pub fn netns_available() -> Result<(), NetnsUnavailable> {
    static PROBE: OnceLock<Result<(), NetnsUnavailable>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

fn probe() -> Result<(), NetnsUnavailable> {
    if !crate::is_root() {
        return Err(NetnsUnavailable::NotRoot);
    }
    run_command("ip", &["-V"], None).map_err(|e| NetnsUnavailable::NoIpCommand(e.to_string()))?;
    // A thread in a fresh, anonymous namespace; `ip` spawned from it runs there too, and the
    // namespace (with the probe's veth) disappears when both exit.
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Err(e) = unshare(CloneFlags::CLONE_NEWNET) {
                return Err(match e {
                    nix::errno::Errno::EINVAL => NetnsUnavailable::KernelLacksNetns(e.to_string()),
                    _ => NetnsUnavailable::NotPermitted(e.to_string()),
                });
            }
            let args = [
                "link", "add", "probe0", "type", "veth", "peer", "name", "probe1",
            ];
            match run_command("ip", &args, None) {
                Ok(_) => Ok(()),
                Err(e) if e.to_string().contains("Unknown device type") => {
                    Err(NetnsUnavailable::KernelLacksVeth(e.to_string()))
                }
                Err(e) => Err(NetnsUnavailable::NotPermitted(e.to_string())),
            }
        })
        .join()
        .unwrap_or_else(|_| Err(NetnsUnavailable::NotPermitted("probe panicked".into())))
    })
}

/// The [skip policy](crate#the-skip-policy) for tests that need namespaces: `true` when
/// namespaces work here; otherwise `false` after [`skip`](crate::skip) printed why, when the
/// reason is a missing privilege ([`NetnsUnavailable::lacks_privilege`]) or a kernel without
/// the feature ([`NetnsUnavailable::kernel_lacks_support`]).
///
/// # Panics
/// - In CI (`CI` set) whenever namespaces do not work: CI runs as root on a full kernel.
/// - Everywhere when the environment could run the test but is set up wrong (root, but no
///   `ip` command): that must fail the test, not skip it.
#[track_caller]
pub fn netns_or_skip(test: &str) -> bool {
    match netns_available() {
        Ok(()) => true,
        Err(why) if why.lacks_privilege() || why.kernel_lacks_support() => {
            crate::skip(test, why);
            false
        }
        Err(why) => panic!("{test} cannot run: {why}"),
    }
}

fn format_mac(mac: &[u8; 6]) -> String {
    let hex: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(":")
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_macs() {
        assert_eq!(format_mac(&[2, 0x52, 0, 0xab, 1, 2]), "02:52:00:ab:01:02");
    }

    #[test]
    fn only_the_kernel_excuses_a_skip() {
        assert!(NetnsUnavailable::KernelLacksNetns(String::new()).kernel_lacks_support());
        assert!(NetnsUnavailable::KernelLacksVeth(String::new()).kernel_lacks_support());
        assert!(!NetnsUnavailable::NotRoot.kernel_lacks_support());
        assert!(!NetnsUnavailable::NotPermitted(String::new()).kernel_lacks_support());
        assert!(NetnsUnavailable::NotRoot.lacks_privilege());
        assert!(NetnsUnavailable::NotPermitted(String::new()).lacks_privilege());
        assert!(!NetnsUnavailable::NoIpCommand(String::new()).lacks_privilege());
        assert!(!NetnsUnavailable::KernelLacksVeth(String::new()).lacks_privilege());
    }
}
