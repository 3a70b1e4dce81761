//! `rocectl daemon` end to end (issue 14): the configuration, the control socket's hello and
//! identity, QPN ranges, limits, reaping after `kill -9`, the views and shutdown.
//!
//! Each test starts its own daemon on its own socket (in a fresh directory under `/tmp`, which
//! a uid-65534 client can reach) and, where devices open UDP sockets, in its own network
//! namespace (`roce_testkit::netns::TempNetns`: only `lo`, 127.0.0.1 and 127.0.0.2), so the
//! tests run in parallel and touch nothing of the host's. Everything they start is killed when
//! they end. Tests that need namespaces follow the testkit skip policy.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use roce_testkit::daemon;
use roce_testkit::netns::{netns_or_skip, NetnsEnd, NetnsPair, TempNetns};
use roce_testkit::proc::Proc;
use roce_transport::control::sys::{read_frame, write_frame};
use roce_transport::control::{
    ClientError, Connection, ControlError, Hello, Reply, Request, Resource, Role, Scope,
    PROTOCOL_MAJOR, PROTOCOL_MINOR,
};
use roce_transport::{Device, DeviceConfig, OpenError, QpInit, QpType, VerbsError};
use serde_json::Value;

const ROCECTL: &str = env!("CARGO_BIN_EXE_rocectl");

/// A fresh directory under /tmp (mode 0755), removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "rocectl-daemon-{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(p)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A network namespace programs can run in: a [`TempNetns`] or one end of a [`NetnsPair`].
trait InNs {
    /// The namespace's name.
    fn ns_name(&self) -> &str;

    /// `program` run inside the namespace (`ip netns exec`, which execs it: same pid).
    fn cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns_name(), program]);
        cmd
    }
}

impl InNs for TempNetns {
    fn ns_name(&self) -> &str {
        self.name()
    }
}

impl InNs for roce_testkit::netns::Netns {
    fn ns_name(&self) -> &str {
        self.name()
    }
}

impl InNs for NetnsEnd {
    fn ns_name(&self) -> &str {
        Self::ns_name(self)
    }
}

/// A running daemon: its socket, its log, the process (killed on drop).
struct Daemon {
    proc: Option<Proc>,
    socket: PathBuf,
    dir: TmpDir,
    /// The namespace it runs in (by name, for a restart).
    ns: Option<String>,
}

impl Daemon {
    /// Starts `rocectl daemon` with `config` (TOML) appended to the socket's settings, in
    /// `ns` when given (else the host's namespace: only the Unix socket is used then).
    fn start(tag: &str, ns: Option<&TempNetns>, config: &str) -> Self {
        Self::start_at(tag, ns.map(|n| n as &dyn InNs), "127.0.0.1", config)
    }

    /// As [`Self::start`], serving `address`, in any namespace.
    fn start_at(tag: &str, ns: Option<&dyn InNs>, address: &str, config: &str) -> Self {
        let dir = TmpDir::new(tag);
        let cfg = daemon::write_config(
            &dir.0,
            &format!("address = \"{address}\"\n{config}"),
            Some(0o666),
        )
        .unwrap();
        let socket = cfg.socket;
        let mut cmd = match ns {
            Some(ns) => ns.cmd(ROCECTL),
            None => Command::new(ROCECTL),
        };
        cmd.args(["daemon", "--config"]).arg(&cfg.path);
        cmd.env("RUST_LOG", "info");
        let proc = Proc::spawn(cmd, "rocectl daemon", &dir.0).unwrap();
        let mut d = Self {
            proc: Some(proc),
            socket,
            dir,
            ns: ns.map(|n| n.ns_name().to_owned()),
        };
        d.wait_for_socket();
        d
    }

    /// Stops the daemon (SIGTERM, status 0) and starts it again on the same configuration,
    /// in the same namespace.
    fn restart(&mut self) {
        signal(self.pid(), "-TERM");
        let out = self.proc.take().unwrap().wait(Duration::from_secs(5));
        assert!(out.success(), "{}", out.combined());
        let cfg = self.dir.0.join("rocectl.toml");
        let mut cmd = match &self.ns {
            Some(ns) => roce_testkit::netns::Netns::named(ns.clone()).cmd(ROCECTL),
            None => Command::new(ROCECTL),
        };
        cmd.args(["daemon", "--config"]).arg(&cfg);
        cmd.env("RUST_LOG", "info");
        self.proc = Some(Proc::spawn(cmd, "rocectl daemon (restarted)", &self.dir.0).unwrap());
        self.wait_for_socket();
    }

    fn wait_for_socket(&mut self) {
        let proc = self.proc.as_mut().unwrap();
        if let Err(e) = daemon::wait_until_serving(proc, &self.socket, Duration::from_secs(10)) {
            panic!("{e}");
        }
    }

    fn pid(&self) -> u32 {
        self.proc.as_ref().unwrap().pid()
    }

    fn log(&self) -> String {
        self.proc
            .as_ref()
            .map(Proc::stderr_so_far)
            .unwrap_or_default()
    }

    /// `rocectl ARGS --socket S`; stdout, asserting success.
    fn rocectl(&self, args: &[&str]) -> String {
        let out = Command::new(ROCECTL)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rocectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Vec<Value> {
        let text = self.rocectl(args);
        match serde_json::from_str::<Value>(&text).unwrap() {
            Value::Array(a) => a,
            other => panic!("not an array: {other}"),
        }
    }

    /// The `res show -j` rows of `pid`.
    fn clients_with_pid(&self, pid: u32) -> Vec<Value> {
        self.json(&["res", "show", "-j"])
            .into_iter()
            .filter(|r| r["pid"] == pid)
            .collect()
    }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig} {pid}");
}

/// Polls `f` every 20 ms until it returns `Some`, at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A device client in its own process: `rocectl rc-pingpong` waiting as a server (it has
/// opened its device and created its QP), in `ns`, optionally as another user.
fn pingpong_server(ns: &TempNetns, d: &Daemon, as_nobody: bool, tcp_port: u16) -> Proc {
    let mut cmd = ns.command("env");
    cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", d.socket.display()));
    if as_nobody {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    cmd.args([
        ROCECTL,
        "rc-pingpong",
        "-d",
        "lo",
        "-p",
        &tcp_port.to_string(),
    ]);
    Proc::spawn(cmd, "rc-pingpong server", &d.dir.0).unwrap()
}

#[test]
fn a_bad_config_is_one_line_and_exit_status_2() {
    let dir = TmpDir::new("badcfg");
    let cases = [
        ("modee = \"x\"\n", "line 1: unknown field `modee`"),
        ("[qpn]\nrange_size = 3\n", "qpn.range_size = 3"),
        ("mode = \"bpf\"\n", "unknown variant `bpf`"),
        (
            "address = \"127.0.0.1\"\n[socket]\ngroup = \"no-such-group-q\"\n",
            "no such group",
        ),
        ("interface = \"nonexistent9\"\n", "no such interface"),
    ];
    for (text, want) in cases {
        let cfg = dir.0.join("c.toml");
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(ROCECTL)
            .args(["daemon", "--check", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(err.contains(want), "{text:?}: {err:?} lacks {want:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "{text:?}: {err:?}");
    }
    let out = Command::new(ROCECTL)
        .args(["daemon", "--config", "/nonexistent/rocectl.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let ok = Command::new(ROCECTL)
        .args(["daemon", "--check", "--address", "127.0.0.1", "--config"])
        .arg(dir.0.join("missing-but-explicit.toml"))
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(2), "an explicit config must exist");
}

/// The hello is versioned: another major version is refused with a clear, typed error, and a
/// first request that is not a hello is refused too. Nothing is allocated for either.
#[test]
fn a_hello_of_another_major_version_is_refused() {
    let d = Daemon::start("hello", None, "");
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let mut hello = Hello::new(Role::Device);
    hello.major = 99;
    write_frame(&mut s, &Request::Hello(hello.clone()), &[]).unwrap();
    let (reply, _) = read_frame::<Reply>(&mut s).unwrap().unwrap();
    let Reply::Error(e) = reply else {
        panic!("{reply:?}")
    };
    assert!(matches!(
        e,
        ControlError::VersionMismatch {
            client_major: 99,
            daemon_major: 1,
            ..
        }
    ));
    assert!(
        e.to_string().contains(&format!(
            "client speaks 99.x, daemon speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"
        )),
        "{e}"
    );
    // The daemon closed the connection after refusing.
    assert!(read_frame::<Reply>(&mut s).unwrap().is_none());
    // Through the client API: a typed refusal.
    let err = Connection::connect(&d.socket, hello).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Refused(ControlError::VersionMismatch { .. })
        ),
        "{err}"
    );
    // No hello first.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    write_frame(&mut s, &Request::ResShow, &[]).unwrap();
    let (reply, _) = read_frame::<Reply>(&mut s).unwrap().unwrap();
    assert_eq!(reply, Reply::Error(ControlError::NoHello));
    // Garbage instead of JSON: refused, the daemon lives on.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    std::io::Write::write_all(&mut s, b"\0\0\0\x05hello").unwrap();
    let (reply, _) = read_frame::<Reply>(&mut s).unwrap().unwrap();
    assert!(
        matches!(reply, Reply::Error(ControlError::BadRequest { .. })),
        "{reply:?}"
    );
    let mut c = Connection::connect(&d.socket, Hello::new(Role::View)).unwrap();
    assert_eq!(c.welcome().address, "127.0.0.1".parse::<IpAddr>().unwrap());
    let Reply::Stats { daemon, clients } = c.call(&Request::Stat).unwrap() else {
        panic!()
    };
    assert_eq!((daemon.clients, clients.len()), (0, 0));
}

/// The identity the views show is the kernel's (SO_PEERCRED at accept, /proc/PID/comm): a
/// client running as uid 65534 is listed with that uid and its own pid, though nothing in the
/// protocol lets a client state either. Kernel-demux mode then refuses a client of another
/// uid (root) while that one holds a range.
#[test]
fn identity_comes_from_the_kernel_and_kernel_demux_keeps_one_uid() {
    if !netns_or_skip("identity_comes_from_the_kernel_and_kernel_demux_keeps_one_uid") {
        return;
    }
    let ns = TempNetns::create("dmn-id").unwrap();
    let d = Daemon::start("ident", Some(&ns), "");
    let client = pingpong_server(&ns, &d, true, 18_601);
    let pid = client.pid();
    let rows = wait_for(Duration::from_secs(10), "the uid-65534 client", || {
        let r = d.clients_with_pid(pid);
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(rows[0]["uid"], 65534, "{rows:?}");
    assert_eq!(rows[0]["comm"], "rocectl", "{rows:?}");
    // A root device on the same address: refused while uid 65534 holds a range.
    let err = roce_testkit::netns::run_in(ns.name(), || {
        Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap()).daemon_socket(&d.socket))
            .unwrap_err()
    })
    .unwrap();
    let OpenError::Daemon { path, detail } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(path, &d.socket);
    assert!(detail.contains("one trust domain"), "{detail}");
    assert!(detail.contains("uid 65534 holds QPN ranges"), "{detail}");
    drop(client);
}

/// Limits refuse creations with a typed error through the verbs API; a release makes room;
/// an exclusive device does not use the daemon at all; `res show -j` lists a live client's
/// QPs with QPNs inside its range.
#[test]
fn limits_refuse_with_a_typed_error_and_res_show_lists_the_qps() {
    if !netns_or_skip("limits_refuse_with_a_typed_error_and_res_show_lists_the_qps") {
        return;
    }
    let ns = TempNetns::create("dmn-lim").unwrap();
    let d = Daemon::start(
        "limits",
        Some(&ns),
        "[limits.per_client]\nqps = 2\nmr_bytes = 4096\n",
    );
    let socket = d.socket.clone();
    roce_testkit::netns::run_in(ns.name(), || {
        let dev =
            Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap()).daemon_socket(&socket))
                .unwrap();
        let lease = dev.daemon_lease().expect("the device uses the daemon");
        let range = lease.qpn_base..lease.qpn_base + lease.qpn_count;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(16).unwrap();
        let q1 = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let q2 = pd.create_qp(&QpInit::new(QpType::Ud, &cq)).unwrap();
        for q in [&q1, &q2] {
            assert!(
                range.contains(&q.qpn().value()),
                "{:#x} outside {range:#x?}",
                q.qpn().value()
            );
        }
        let e = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap_err();
        assert!(
            matches!(
                e,
                VerbsError::DaemonRefused(ControlError::LimitExceeded {
                    resource: Resource::Qps,
                    scope: Scope::Client,
                    limit: 2,
                    in_use: 2,
                    requested: 1
                })
            ),
            "{e:?}"
        );
        let mr = pd
            .register_zeroed(4096, roce_transport::Access::LOCAL_WRITE)
            .unwrap();
        let e = pd
            .register_zeroed(1, roce_transport::Access::LOCAL_WRITE)
            .unwrap_err();
        assert!(
            matches!(
                e,
                VerbsError::DaemonRefused(ControlError::LimitExceeded {
                    resource: Resource::MrBytes,
                    ..
                })
            ),
            "{e:?}"
        );
        drop(mr);
        let _mr = pd
            .register_zeroed(4096, roce_transport::Access::LOCAL_WRITE)
            .unwrap();
        // The views: this process, its two QPs, within its range.
        let me = std::process::id();
        let qps = wait_for(Duration::from_secs(5), "the QPs in res show qp", || {
            let rows: Vec<Value> = d
                .json(&["res", "show", "qp", "-j"])
                .into_iter()
                .filter(|r| r["pid"] == me)
                .collect();
            (rows.len() == 2).then_some(rows)
        });
        let mut lqpns: Vec<u64> = qps.iter().map(|r| r["lqpn"].as_u64().unwrap()).collect();
        lqpns.sort_unstable();
        let mut want = vec![u64::from(q1.qpn().value()), u64::from(q2.qpn().value())];
        want.sort_unstable();
        assert_eq!(lqpns, want);
        let types: Vec<&str> = qps.iter().map(|r| r["type"].as_str().unwrap()).collect();
        assert!(types.contains(&"RC") && types.contains(&"UD"), "{types:?}");
        assert!(
            qps.iter()
                .all(|r| r["state"] == "RESET" && r["ifname"] == "rocectl0"),
            "{qps:?}"
        );
        let summary = d.clients_with_pid(me);
        assert_eq!(summary[0]["qp"], 2);
        assert_eq!(summary[0]["cq"], 1);
        assert_eq!(summary[0]["mr-bytes"], 4096);
        // `res show mr`: one line per region, with its keys and length (`rdma`'s columns).
        let mrs = wait_for(Duration::from_secs(5), "the MR in res show mr", || {
            let rows: Vec<Value> = d
                .json(&["res", "show", "mr", "-j"])
                .into_iter()
                .filter(|r| r["pid"] == me)
                .collect();
            (rows.len() == 1).then_some(rows)
        });
        assert_eq!(mrs[0]["rkey"], format!("{:#x}", _mr.rkey().value()));
        assert_eq!(mrs[0]["lkey"], format!("{:#x}", _mr.lkey().value()));
        assert_eq!(mrs[0]["mrlen"], 4096);
        // Destroying a QP gives the reservation back.
        drop(q1);
        let _q3 = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        // An exclusive device never talks to the daemon.
        let before = d.json(&["res", "show", "-j"]).len();
        let ex = Device::open(
            DeviceConfig::udp("127.0.0.2".parse().unwrap())
                .daemon_socket(&socket)
                .exclusive(),
        )
        .unwrap();
        assert!(ex.daemon_lease().is_none());
        assert_eq!(d.json(&["res", "show", "-j"]).len(), before);
        // A device on an address the daemon does not serve does not use it either.
        let other =
            Device::open(DeviceConfig::udp("127.0.0.2".parse().unwrap()).daemon_socket(&socket));
        assert!(other.is_err() || other.unwrap().daemon_lease().is_none());
        let stat = d.rocectl(&["stat"]);
        assert!(stat.contains(&format!("pid {me}")), "{stat}");
        assert!(stat.contains("limit-refusals 2"), "{stat}");
    })
    .unwrap();
}

/// `kill -9` of a client: the daemon reaps it (logged, gone from the views), its QPN range is
/// quarantined (a new client cannot have it), and after the quarantine the next client gets it.
#[test]
fn a_killed_client_is_reaped_and_its_range_reused_only_after_quarantine() {
    if !netns_or_skip("a_killed_client_is_reaped_and_its_range_reused_only_after_quarantine") {
        return;
    }
    let ns = TempNetns::create("dmn-kill").unwrap();
    // 16 ranges of 2^20 QPNs (range 0 is the daemon's), 1.5 s of quarantine.
    let quarantine = Duration::from_millis(1500);
    let d = Daemon::start(
        "kill",
        Some(&ns),
        &format!(
            "[qpn]\nrange_size = 1048576\nquarantine_ms = {}\n",
            quarantine.as_millis()
        ),
    );
    let a = pingpong_server(&ns, &d, false, 18_611);
    let pid = a.pid();
    let qps = wait_for(Duration::from_secs(10), "client A's QP", || {
        let rows: Vec<Value> = d
            .json(&["res", "show", "qp", "-j"])
            .into_iter()
            .filter(|r| r["pid"] == pid)
            .collect();
        (!rows.is_empty()).then_some(rows)
    });
    let lqpn = qps[0]["lqpn"].as_u64().unwrap();
    assert!((0x10_0000..=0x1F_FFFF).contains(&lqpn), "{lqpn:#x}");
    // The 14 other ranges go to placeholder clients of this process, so that the only range
    // left to hand out after A dies is A's.
    let mut holders = Vec::new();
    for _ in 0..14 {
        let mut c = Connection::connect(&d.socket, Hello::new(Role::Device)).unwrap();
        let r = c
            .call(&Request::AllocRange {
                device: "placeholder".into(),
            })
            .unwrap();
        assert!(matches!(r, Reply::Lease(_)), "{r:?}");
        holders.push(c);
    }
    let killed = Instant::now();
    signal(pid, "-KILL");
    wait_for(
        Duration::from_secs(5),
        "client A gone from the views",
        || d.clients_with_pid(pid).is_empty().then_some(()),
    );
    let reaped = killed.elapsed();
    eprintln!(
        "reaping time after kill -9: {} ms (seen by res show)",
        reaped.as_millis()
    );
    // The log line follows the views' update by a few microseconds.
    wait_for(Duration::from_secs(2), "the reaping log line", || {
        d.log()
            .contains("client reaped (process exited)")
            .then_some(())
    });
    let stat = d.json(&["stat", "-j"]);
    let daemon = stat.last().unwrap();
    assert_eq!(daemon["clients-reaped"], 1, "{daemon}");
    assert_eq!(daemon["slots-quarantined"], 1, "{daemon}");
    assert_eq!(daemon["slots-free"], 0, "{daemon}");
    // During the quarantine: no range for a new client.
    let b = pingpong_server(&ns, &d, false, 18_612);
    let out = b.wait(Duration::from_secs(10));
    assert!(!out.success(), "client B got a range during the quarantine");
    assert!(
        out.combined()
            .contains("no free QPN range (1 in quarantine"),
        "{}",
        out.combined()
    );
    assert!(
        killed.elapsed() < quarantine,
        "too slow to check the quarantine"
    );
    // After it: the same range, to a new owner.
    std::thread::sleep(quarantine.saturating_sub(killed.elapsed()) + Duration::from_millis(200));
    let c = pingpong_server(&ns, &d, false, 18_613);
    let cpid = c.pid();
    let rows = wait_for(Duration::from_secs(10), "client C's range", || {
        let r = d.clients_with_pid(cpid);
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(rows[0]["slot"], 1);
    assert_eq!(rows[0]["qpn-range"], "0x100000-0x1fffff");
    assert!(
        d.log().contains("QPN range out of quarantine"),
        "{}",
        d.log()
    );
}

/// SIGTERM and SIGINT stop the daemon with status 0 and remove its socket; the socket had the
/// configured mode; a second daemon on a live socket refuses to start, and a stale socket
/// file (a daemon killed with -9) is replaced.
#[test]
fn shutdown_removes_the_socket_and_a_live_socket_is_not_stolen() {
    for sig in ["-TERM", "-INT"] {
        let mut d = Daemon::start("stop", None, "");
        let meta = std::fs::metadata(&d.socket).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o666);
        let second = Command::new(ROCECTL)
            .args(["daemon", "--address", "127.0.0.1", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap();
        assert_eq!(second.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&second.stderr).contains("another rocectl daemon is listening"),
            "{}",
            String::from_utf8_lossy(&second.stderr)
        );
        signal(d.pid(), sig);
        let out = d.proc.take().unwrap().wait(Duration::from_secs(5));
        assert!(out.success(), "{sig}: {}", out.combined());
        assert!(
            out.combined().contains("rocectl daemon stopped"),
            "{}",
            out.combined()
        );
        assert!(!d.socket.exists(), "{sig}: the socket is still there");
    }
    // kill -9 leaves the socket; the next daemon replaces it.
    let mut d = Daemon::start("stale", None, "");
    signal(d.pid(), "-KILL");
    let _ = d.proc.take().unwrap().wait(Duration::from_secs(5));
    assert!(d.socket.exists());
    // A device finds the stale socket: a clear error naming it, within the reply timeout,
    // before any UDP socket is opened.
    let t = Instant::now();
    let e = Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap()).daemon_socket(&d.socket))
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1));
    let text = e.to_string();
    assert!(text.contains(&d.socket.display().to_string()), "{text}");
    assert!(text.contains("ROCECTL_EXCLUSIVE=1"), "{text}");
    let cfg = d.dir.0.join("rocectl.toml");
    let mut cmd = Command::new(ROCECTL);
    cmd.args(["daemon", "--config"]).arg(&cfg);
    d.proc = Some(Proc::spawn(cmd, "rocectl daemon again", &d.dir.0).unwrap());
    d.wait_for_socket();
    let c = Connection::connect(&d.socket, Hello::new(Role::View)).unwrap();
    assert_eq!(c.welcome().major, 1);
}

/// systemd socket activation: the daemon serves the socket it is given on fd 3 and leaves the
/// socket file to systemd on shutdown.
#[test]
fn socket_activation_uses_the_passed_socket() {
    let dir = TmpDir::new("activ");
    let socket = dir.0.join("act.sock");
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.arg("-l").arg(&socket).args([
        ROCECTL,
        "daemon",
        "--address",
        "127.0.0.1",
        "--socket",
        "/nonexistent/unused.sock",
    ]);
    let p = match Proc::spawn(cmd, "systemd-socket-activate", &dir.0) {
        Ok(p) => p,
        Err(e) => {
            roce_testkit::skip("socket_activation_uses_the_passed_socket", e);
            return;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let conn = loop {
        if socket.exists() {
            if let Ok(c) = Connection::connect(&socket, Hello::new(Role::View)) {
                break c;
            }
        }
        assert!(Instant::now() < deadline, "{}", p.stderr_so_far());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        conn.welcome().address,
        "127.0.0.1".parse::<IpAddr>().unwrap()
    );
    let log = wait_for(Duration::from_secs(5), "the activation log line", || {
        let l = p.stderr_so_far();
        l.contains("socket activation").then_some(l)
    });
    assert!(!Path::new("/nonexistent/unused.sock").exists(), "{log}");
}

/// `rocectl gen man DIR` writes a page per command from the CLI definition, and
/// `rocectl gen completions SHELL` a script that knows the commands.
#[test]
fn man_pages_and_completions_come_from_the_cli_definition() {
    let dir = TmpDir::new("man");
    let out = Command::new(ROCECTL)
        .args(["gen", "man"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "rocectl.1",
        "rocectl-daemon.1",
        "rocectl-res-show.1",
        "rocectl-stat.1",
        "rocectl-pcap-check.1",
        "rocectl-write-bw.1",
    ] {
        let text =
            std::fs::read_to_string(dir.0.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
    let daemon = std::fs::read_to_string(dir.0.join("rocectl-daemon.1")).unwrap();
    assert!(
        daemon.contains("\\-\\-config"),
        "the daemon page documents --config"
    );
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(ROCECTL)
            .args(["gen", "completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("daemon") && text.contains("res"), "{shell}");
    }
}

/// A rocectl tool in `ns` using the daemon at `d`.
fn tool(ns: &dyn InNs, d: &Daemon, args: &[&str], what: &str) -> Proc {
    tool_as(ns, d, false, args, what)
}

/// A rocectl tool in `ns` using the daemon at `d`, as uid 65534 when `nobody`.
fn tool_as(ns: &dyn InNs, d: &Daemon, nobody: bool, args: &[&str], what: &str) -> Proc {
    let mut cmd = ns.cmd("env");
    cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", d.socket.display()));
    if nobody {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    cmd.arg(ROCECTL).args(args);
    Proc::spawn(cmd, what, &d.dir.0).unwrap()
}

/// The counter `name` of client `pid` in the daemon's `stat -j` (its last report).
fn client_counter(d: &Daemon, pid: u32, name: &str) -> Option<u64> {
    d.json(&["stat", "-j"])
        .into_iter()
        .find(|r| r["pid"] == pid)
        .and_then(|r| r[name].as_u64())
}

/// Many processes on one address, like on a NIC, and `kill -9` mid-transfer: two
/// `write-bw --chk` pairs and two `rc-pingpong --chk` pairs (8 processes, each its own device
/// on 127.0.0.1:4791) run at once through the daemon's kernel demultiplexer, beside two victim
/// pairs: the client of a `write-bw` stream is killed with SIGKILL once its server has taken
/// megabytes, and the server of a pingpong too. The eight finish with every byte verified;
/// each victim is reaped (the time printed), and its surviving peer fails with a clear error
/// instead of hanging. No two clients listed at once share a QPN range.
#[test]
fn eight_processes_share_one_address_and_a_killed_one_disturbs_nobody() {
    if !netns_or_skip("eight_processes_share_one_address_and_a_killed_one_disturbs_nobody") {
        return;
    }
    let ns = TempNetns::create("dmn-many").unwrap();
    let d = Daemon::start("many", Some(&ns), "");
    let side = Side {
        ns: &ns,
        d: &d,
        dev: "lo",
    };
    // The victims first, with far more iterations than the others need.
    let victims = start_pairs(
        &side,
        &side,
        "127.0.0.1",
        &[
            PairSpec::new("write-bw -n 10000000 -s 65536 --chk", 18_700),
            PairSpec::new("rc-pingpong -n 100000000 --chk", 18_701),
        ],
    );
    let mut specs: Vec<PairSpec> = (0..2)
        .map(|i| PairSpec::new("write-bw -n 60000 -s 65536 --chk", 18_702 + i))
        .collect();
    specs.extend((0..2).map(|i| PairSpec::new("rc-pingpong -n 60000 --chk", 18_704 + i)));
    let mut pairs = start_pairs(&side, &side, "127.0.0.1", &specs);
    // No two clients listed at the same time share a QPN range.
    for _ in 0..3 {
        let rows = d.json(&["res", "show", "-j"]);
        let mut slots: Vec<u64> = rows.iter().map(|r| r["slot"].as_u64().unwrap()).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(
            slots.len(),
            rows.len(),
            "two clients share a range: {rows:?}"
        );
    }
    // Mid-transfer: the write-bw victim's server has taken 16 MB, then its client dies.
    let [wv, pv] = <[Pair; 2]>::try_from(victims).ok().unwrap();
    wait_for(
        Duration::from_secs(30),
        "the victim stream under way",
        || (client_counter(&d, wv.server.pid(), "rx_bytes")? > 16 << 20).then_some(()),
    );
    // The others are still running when the first victim dies (checked here, not after the
    // reaping: under CI load a killed process took 4.4 s to be reaped, and a survivor may
    // finish meanwhile, which is no disturbance).
    for p in &mut pairs {
        assert!(
            !p.server.exited() && !p.client.exited(),
            "{} ended before the kills: make it longer",
            p.server.what()
        );
    }
    for (victim, what) in [
        (&wv.client, "write-bw client"),
        (&pv.server, "pingpong server"),
    ] {
        let killed = Instant::now();
        signal(victim.pid(), "-KILL");
        wait_for(Duration::from_secs(10), "the victim reaped", || {
            d.clients_with_pid(victim.pid()).is_empty().then_some(())
        });
        eprintln!(
            "{what} reaped {} ms after kill -9 (seen by res show)",
            killed.elapsed().as_millis()
        );
    }
    let outs = finish_pairs(pairs, [&d, &d], Duration::from_secs(90));
    assert_eq!(outs.len(), 4);
    // The write stream's server lost its client: a clear error, not a hang.
    let out = wv.server.wait(Duration::from_secs(20));
    assert!(!out.success() && !out.timed_out, "{}", out.combined());
    assert!(out.combined().contains("--chk"), "{}", out.combined());
    drop(pv.client);
    let log = d.log();
    assert!(log.contains("client reaped (process exited)"), "{log}");
}

/// A BPF filesystem mounted on a fresh directory, unmounted on drop.
struct BpfFs(TmpDir);

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0 .0).status();
    }
}

/// Daemon restart in kernel-demux mode under a sustained stream: with the demultiplexer
/// pinned, a restarted daemon takes the same group back. Two `write-bw --chk` streams and a
/// pingpong, all under way, run across the restart and finish with 0 failed work requests
/// (every process exits 0, every request of every stream completed, no fatal NAK either
/// way) and every byte verified; a pair started after the restart runs too (the old pairs'
/// slots, which the new daemon never allocated, are skipped), and when the old pairs exit
/// their slots are quarantined.
#[test]
fn a_restarted_daemon_keeps_established_clients_running() {
    if !netns_or_skip("a_restarted_daemon_keeps_established_clients_running") {
        return;
    }
    let bpf = BpfFs(TmpDir::new("bpffs"));
    let mounted = Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&bpf.0 .0)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        roce_testkit::skip(
            "a_restarted_daemon_keeps_established_clients_running",
            "cannot mount a BPF filesystem (mount -t bpf)",
        );
        return;
    }
    const ITERS: u64 = 40_000;
    let ns = TempNetns::create("dmn-rst").unwrap();
    let pin = bpf.0 .0.join("group");
    let mut d = Daemon::start(
        "restart",
        Some(&ns),
        &format!("[demux]\npin_dir = \"{}\"\n", pin.display()),
    );
    let stream = format!("write-bw -n {ITERS} -s 65536 --chk --json");
    let specs = [
        PairSpec::new(&stream, 18_720),
        PairSpec::new(&stream, 18_721),
        PairSpec::new("rc-pingpong -n 60000 --chk", 18_722),
    ];
    let side = Side {
        ns: &ns,
        d: &d,
        dev: "lo",
    };
    let mut long = start_pairs(&side, &side, "127.0.0.1", &specs);
    let mut seen = vec![HashSet::new(); 2];
    // Both streams under way (16 MB each into their servers).
    wait_for(Duration::from_secs(30), "the streams under way", || {
        note_clients(&[&d, &d], &mut seen);
        long[..2]
            .iter()
            .all(|p| client_counter(&d, p.server.pid(), "rx_bytes").is_some_and(|b| b > 16 << 20))
            .then_some(())
    });
    d.restart();
    for p in &mut long {
        assert!(
            !p.server.exited() && !p.client.exited(),
            "{} ended before the restart",
            p.server.what()
        );
    }
    assert!(d.log().contains("taken back from its pin"), "{}", d.log());
    // The long pair resumes its ranges with the new daemon (its sockets prove its slots):
    // listed again, with its QPs.
    let long_pids: Vec<u32> = long
        .iter()
        .flat_map(|p| [p.server.pid(), p.client.pid()])
        .collect();
    wait_for(Duration::from_secs(10), "the long pairs resumed", || {
        let listed = long_pids
            .iter()
            .all(|&pid| !d.clients_with_pid(pid).is_empty());
        (listed && d.log().matches("QPN range resumed").count() >= long_pids.len()).then_some(())
    });
    // A new pair after the restart.
    let side = Side {
        ns: &ns,
        d: &d,
        dev: "lo",
    };
    let new = start_pairs(
        &side,
        &side,
        "127.0.0.1",
        &[PairSpec::new("rc-pingpong -n 300 --chk", 18_723)],
    );
    assert_eq!(
        finish_pairs(new, [&d, &d], Duration::from_secs(60)).len(),
        1
    );
    let outs = finish_pairs_seen(long, [&d, &d], Duration::from_secs(60), seen);
    let mut streams = 0;
    for (spec, so, co) in &outs {
        if spec.tool() != "write-bw" {
            continue;
        }
        streams += 1;
        let c = json_line(&co.stdout);
        let s = json_line(&so.stdout);
        assert_eq!(c["iters"], ITERS, "{c}");
        assert_eq!(s["iters"], ITERS, "{s}");
        for k in ["send_fatal_nak", "rcvd_fatal_nak"] {
            assert_eq!(c[k], 0, "{k}: {c}");
        }
        eprintln!(
            "stream :{} across the restart: {} requests, {} retransmitted packets, {} ACK timeouts",
            spec.port, c["iters"], c["retransmitted_pkts"], c["ack_timeouts"]
        );
    }
    assert_eq!(streams, 2);
    wait_for(
        Duration::from_secs(5),
        "the old pairs (resumed) reaped and their slots quarantined",
        || {
            let log = d.log();
            let reaped = long_pids
                .iter()
                .filter(|pid| {
                    log.lines()
                        .any(|l| l.contains("client reaped") && l.contains(&format!("pid={pid} ")))
                })
                .count();
            (reaped == long_pids.len()).then_some(())
        },
    );
}

/// `ROCECTL_EXCLUSIVE=1` keeps a tool off the daemon: it binds the address alone and the
/// daemon never hears of it.
#[test]
fn rocectl_exclusive_keeps_a_process_off_the_daemon() {
    if !netns_or_skip("rocectl_exclusive_keeps_a_process_off_the_daemon") {
        return;
    }
    let ns = TempNetns::create("dmn-excl").unwrap();
    let d = Daemon::start("excl", Some(&ns), "");
    let mut cmd = ns.command("env");
    cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", d.socket.display()));
    cmd.arg("ROCECTL_EXCLUSIVE=1");
    cmd.args([ROCECTL, "rc-pingpong", "-d", "lo", "-p", "18730"]);
    let p = Proc::spawn(cmd, "exclusive server", &d.dir.0).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the exclusive device bound to 4791",
        || {
            let out = ns
                .command("ss")
                .args(["-Hlunp", "sport = :4791"])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains(&format!("pid={}", p.pid())).then_some(())
        },
    );
    assert!(d.json(&["res", "show", "-j"]).is_empty());
    assert!(!d.log().contains("QPN range allocated"), "{}", d.log());
}

/// Forwarding mode, for hosts shared by several users: a uid-65534 process and a root process
/// share 127.0.0.1 (the daemon receives on 4791 and copies each datagram into its owner's
/// ring), and run a pingpong with every byte checked. A client cannot take the port for
/// itself: binding 4791 alone (`ROCECTL_EXCLUSIVE=1`) fails, the daemon holds it.
#[test]
fn forwarding_mode_serves_two_users_on_one_address() {
    if !netns_or_skip("forwarding_mode_serves_two_users_on_one_address") {
        return;
    }
    let ns = TempNetns::create("dmn-fwd").unwrap();
    let d = Daemon::start("fwd", Some(&ns), "mode = \"forwarding\"\n");
    let srv = pingpong_server(&ns, &d, true, 18_740);
    wait_for(Duration::from_secs(10), "the uid-65534 server", || {
        (!d.clients_with_pid(srv.pid()).is_empty()).then_some(())
    });
    // Both users hold ranges at once (kernel-demux would refuse the second uid). The server's
    // default is 1000 exchanges; the client's must match.
    let args = [
        "rc-pingpong",
        "-d",
        "lo",
        "-p",
        "18740",
        "--chk",
        "127.0.0.1",
    ];
    let cli = tool(&ns, &d, &args, "root client");
    for p in [srv, cli] {
        let what = p.what().to_owned();
        let out = p.wait(Duration::from_secs(120));
        assert!(out.success(), "{what}: {}", out.combined());
    }
    let stat = d.json(&["stat", "-j"]);
    let daemon = stat.last().unwrap();
    assert!(daemon["forwarded"].as_u64().unwrap() >= 2000, "{daemon}");
    assert_eq!(daemon["rx-drop-no-owner"], 0, "{daemon}");
    assert!(
        d.log().contains("uid=65534") && d.log().contains("uid=0"),
        "{}",
        d.log()
    );
    // A client trying to take the address for itself.
    let mut cmd = ns.command("env");
    cmd.args([
        "ROCECTL_EXCLUSIVE=1",
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ]);
    cmd.args([ROCECTL, "rc-pingpong", "-d", "lo", "-p", "18741"]);
    let out = Proc::spawn(cmd, "thief", &d.dir.0)
        .unwrap()
        .wait(Duration::from_secs(10));
    assert!(!out.success());
    assert!(
        out.combined().contains("already in use"),
        "{}",
        out.combined()
    );
}

/// One client-server pair of rocectl tools: what both run (`tool` and its options; the client
/// adds the server's address), the TCP port of their exchange, and who runs each side.
#[derive(Clone)]
struct PairSpec {
    args: Vec<String>,
    port: u16,
    nobody_server: bool,
    nobody_client: bool,
}

impl PairSpec {
    fn new(args: &str, port: u16) -> Self {
        Self {
            args: args.split_whitespace().map(str::to_owned).collect(),
            port,
            nobody_server: false,
            nobody_client: false,
        }
    }

    fn users(mut self, nobody_server: bool, nobody_client: bool) -> Self {
        self.nobody_server = nobody_server;
        self.nobody_client = nobody_client;
        self
    }

    fn tool(&self) -> &str {
        &self.args[0]
    }

    fn who(&self, nobody: bool) -> &'static str {
        if nobody {
            "uid 65534"
        } else {
            "root"
        }
    }
}

/// Where one side of the pairs runs: its namespace, its daemon and its device (`-d`).
struct Side<'a> {
    ns: &'a dyn InNs,
    d: &'a Daemon,
    dev: &'a str,
}

/// A pair's two processes.
struct Pair {
    spec: PairSpec,
    server: Proc,
    client: Proc,
}

/// Starts every pair's server on `srv`, waits until each is registered with its daemon, then
/// starts the clients on `cli`, connecting to `host`.
fn start_pairs(srv: &Side<'_>, cli: &Side<'_>, host: &str, specs: &[PairSpec]) -> Vec<Pair> {
    let argv = |spec: &PairSpec, side: &Side<'_>, host: Option<&str>| {
        let mut a = spec.args.clone();
        a.extend([
            "-d".into(),
            side.dev.into(),
            "-p".into(),
            spec.port.to_string(),
        ]);
        a.extend(host.map(str::to_owned));
        a
    };
    let servers: Vec<Proc> = specs
        .iter()
        .map(|spec| {
            let a = argv(spec, srv, None);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let what = format!(
                "{} server :{} ({})",
                spec.tool(),
                spec.port,
                spec.who(spec.nobody_server)
            );
            tool_as(srv.ns, srv.d, spec.nobody_server, &a, &what)
        })
        .collect();
    wait_for(Duration::from_secs(20), "every server registered", || {
        servers
            .iter()
            .all(|s| !srv.d.clients_with_pid(s.pid()).is_empty())
            .then_some(())
    });
    servers
        .into_iter()
        .zip(specs)
        .map(|(server, spec)| {
            let a = argv(spec, cli, Some(host));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let what = format!(
                "{} client :{} ({})",
                spec.tool(),
                spec.port,
                spec.who(spec.nobody_client)
            );
            let client = tool_as(cli.ns, cli.d, spec.nobody_client, &a, &what);
            Pair {
                spec: spec.clone(),
                server,
                client,
            }
        })
        .collect()
}

/// Every pid each daemon's `res show -j` lists now, added to `seen` (one set per daemon).
fn note_clients(daemons: &[&Daemon], seen: &mut [HashSet<u32>]) {
    for (d, set) in daemons.iter().zip(seen.iter_mut()) {
        for r in d.json(&["res", "show", "-j"]) {
            set.insert(r["pid"].as_u64().unwrap() as u32);
        }
    }
}

/// Every pid each daemon's log says it allocated a QPN range to, added to `seen` (one set per
/// daemon): a process that lived between two `res show` polls is only in the log.
fn note_logged_clients(daemons: &[&Daemon], seen: &mut [HashSet<u32>]) {
    for (d, set) in daemons.iter().zip(seen.iter_mut()) {
        for line in d
            .log()
            .lines()
            .filter(|l| l.contains("QPN range allocated"))
        {
            let pid: Option<u32> = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|p| p.parse().ok());
            set.extend(pid);
        }
    }
}

/// Waits for both processes of every pair, at most `limit` in all, watching the daemons'
/// `res show -j` meanwhile (and their logs after). Asserts that every process exited 0, that every `--chk` perftest
/// side reports its data verified, and that each daemon listed every process of its side
/// (servers: `daemons[0]`, clients: `daemons[1]`, which may be the same daemon).
fn finish_pairs(pairs: Vec<Pair>, daemons: [&Daemon; 2], limit: Duration) -> Vec<Finished> {
    finish_pairs_seen(pairs, daemons, limit, vec![HashSet::new(); 2])
}

/// A pair's spec and both outputs (server, client).
type Finished = (
    PairSpec,
    roce_testkit::proc::Output,
    roce_testkit::proc::Output,
);

/// As [`finish_pairs`], counting the pids in `seen` (one set per daemon) as listed already.
fn finish_pairs_seen(
    pairs: Vec<Pair>,
    daemons: [&Daemon; 2],
    limit: Duration,
    mut seen: Vec<HashSet<u32>>,
) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    let mut pairs = pairs;
    let pids: Vec<(u32, u32)> = pairs
        .iter()
        .map(|p| (p.server.pid(), p.client.pid()))
        .collect();
    loop {
        note_clients(&daemons, &mut seen);
        let done = pairs
            .iter_mut()
            .all(|p| p.server.exited() && p.client.exited());
        if done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    note_logged_clients(&daemons, &mut seen);
    let mut outs = Vec::new();
    for p in pairs {
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let (sw, cw) = (p.server.what().to_owned(), p.client.what().to_owned());
        let so = p.server.wait(left);
        let co = p.client.wait(Duration::from_secs(1));
        assert!(
            so.success(),
            "{sw}: {}: {}",
            so.status_text(),
            so.combined()
        );
        assert!(
            co.success(),
            "{cw}: {}: {}",
            co.status_text(),
            co.combined()
        );
        if p.spec.args.iter().any(|a| a == "--chk") && p.spec.tool().ends_with("-bw") {
            assert!(
                so.stdout.contains("--chk: data verified: all"),
                "{sw}: {}",
                so.combined()
            );
            assert!(
                co.stdout
                    .contains("--chk: data verified by the server: all"),
                "{cw}: {}",
                co.combined()
            );
        }
        outs.push((p.spec, so, co));
    }
    for (s, c) in pids {
        assert!(
            seen[0].contains(&s),
            "server pid {s} never listed by its daemon"
        );
        assert!(
            seen[1].contains(&c),
            "client pid {c} never listed by its daemon"
        );
    }
    outs
}

/// The perftest `--json` line of a tool's output.
fn json_line(out: &str) -> Value {
    let line = out
        .lines()
        .find(|l| l.starts_with("{\"tool\""))
        .unwrap_or_else(|| panic!("no --json line in {out}"));
    serde_json::from_str(line).unwrap()
}

/// The issue's first proof: many processes on one address, across two namespaces joined by a
/// veth pair, a daemon (kernel demux) in each. Four `write-bw --chk` pairs and two
/// `rc-pingpong --chk` pairs (12 processes: the servers share namespace A's address, the
/// clients namespace B's) run at once; every process exits 0, every write-bw server finds
/// its whole buffer as the last request of its own client left it (and the client hears so),
/// every pingpong byte is checked, and each daemon listed every process on its side.
#[test]
fn twelve_processes_on_one_address_per_namespace_all_data_verified() {
    if !netns_or_skip("twelve_processes_on_one_address_per_namespace_all_data_verified") {
        return;
    }
    let pair = NetnsPair::create("dmn-2ns").unwrap();
    let (a, b) = (pair.a(), pair.b());
    let da = Daemon::start_at("2ns-a", Some(a), &a.ipv4().to_string(), "");
    let db = Daemon::start_at("2ns-b", Some(b), &b.ipv4().to_string(), "");
    let mut specs: Vec<PairSpec> = (0..4)
        .map(|i| PairSpec::new("write-bw -n 2000 -s 65536 --chk", 18_800 + i))
        .collect();
    specs.extend((0..2).map(|i| PairSpec::new("rc-pingpong -n 2000 --chk", 18_810 + i)));
    let t = Instant::now();
    let pairs = start_pairs(
        &Side {
            ns: a,
            d: &da,
            dev: "veth-a",
        },
        &Side {
            ns: b,
            d: &db,
            dev: "veth-b",
        },
        &a.ipv4().to_string(),
        &specs,
    );
    let outs = finish_pairs(pairs, [&da, &db], Duration::from_secs(60));
    eprintln!(
        "{} processes on two addresses, all data verified, in {} ms",
        2 * outs.len(),
        t.elapsed().as_millis()
    );
    // Each daemon allocated a range to each of its six processes, and no other.
    for (d, n) in [(&da, 6), (&db, 6)] {
        let log = d.log();
        assert_eq!(log.matches("QPN range allocated").count(), n, "{log}");
    }
}

/// The attacker of [`forwarding_keeps_each_users_traffic_and_memory_its_own`]: a Python
/// program (run as uid 65534) that reads its orders from the JSON file named by its argument
/// and prints what happened as one JSON line.
const ATTACKER: &str = r#"
import errno, json, os, socket, struct, sys
cfg = json.load(open(sys.argv[1]))
out = {"open": {}, "bind": {}, "sent": 0, "control": []}
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
for p in cfg["paths"]:
    try:
        os.close(os.open(p, os.O_RDONLY))
        out["open"][p] = "ok"
    except OSError as e:
        out["open"][p] = err(e)
for name, host, reuseaddr, reuseport in cfg["binds"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if reuseaddr:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, 4791))
        out["bind"][name] = "ok"
    except OSError as e:
        out["bind"][name] = err(e)
    s.close()
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        chunk = c.recv(n - len(b))
        if not chunk:
            raise EOFError("daemon closed")
        b += chunk
    return b
for session in cfg["sessions"]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(cfg["socket"])
    for req, with_fd in session:
        body = req.encode()
        frame = struct.pack(">I", len(body)) + body
        if with_fd:
            # A socket of our own, passed as if it were the slot's member.
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socket.send_fds(c, [frame], [u.fileno()])
            u.close()
        else:
            c.sendall(frame)
        (n,) = struct.unpack(">I", recv_exact(c, 4))
        out["control"].append(json.loads(recv_exact(c, n)))
    c.close()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF, so IP ID 0
s.bind((cfg["src"], cfg["sport"]))
for h in cfg["packets"]:
    out["sent"] += s.sendto(bytes.fromhex(h), (cfg["dst"], 4791)) > 0
print(json.dumps(out))
"#;

/// The UDP payload (BTH, RETH, 64 bytes of 0xEE, ICRC) of a forged RC RDMA WRITE ONLY to
/// `qpn` at `psn`, `rkey`, `va`, sent from `src:sport` to `dst:4791` with DF (IP ID 0, as the
/// kernel sends it from an unconnected socket), so that its ICRC verifies.
fn forged_write(
    src: std::net::Ipv4Addr,
    sport: u16,
    dst: std::net::Ipv4Addr,
    qpn: u32,
    psn: u32,
    rkey: u32,
    va: u64,
) -> Vec<u8> {
    use roce_wire::frame::{IpRepr, Ipv4Repr, UdpRepr};
    use roce_wire::{bth, reth, Caps, Ext, FrameRepr, Opcode, PacketRepr, Psn, Qpn, RKey};
    let frame = FrameRepr {
        eth: None,
        ip: IpRepr::V4(Ipv4Repr {
            src,
            dst,
            tos: 0,
            ident: 0,
            dont_fragment: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: sport,
            dst_port: 4791,
            checksum: 0,
        },
    };
    let payload = [0xEE_u8; 64];
    let ext = Ext {
        reth: Some(reth::Repr {
            va,
            rkey: RKey::new(rkey),
            dma_len: 64,
        }),
        ..Ext::default()
    };
    let packet = PacketRepr::new(
        bth::Repr::new(Opcode::RcRdmaWriteOnly, Qpn::new(qpn), Psn::new(psn)),
        ext,
        &payload,
    );
    let mut buf = vec![0u8; frame.buffer_len(&packet)];
    frame.emit(&packet, &mut buf, &Caps::default());
    assert!(roce_wire::icrc::verify(&buf), "the forged packet's ICRC");
    buf[frame.header_len()..].to_vec()
}

/// The ring memory (`memfd:rocectl-rx-ring`) descriptors of process `pid`, as
/// `/proc/PID/fd/N`, and its mappings of ring memory as `/proc/PID/map_files/RANGE`.
fn ring_paths(pid: u32) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        if target.to_string_lossy().contains("memfd:rocectl-rx-ring") {
            v.push(e.path().display().to_string());
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for l in maps.lines().filter(|l| l.contains("rocectl-rx-ring")) {
        let range = l.split_whitespace().next().unwrap();
        v.push(format!("/proc/{pid}/map_files/{range}"));
    }
    v
}

/// The issue's multi-user proof: forwarding mode, two users, two namespaces (a forwarding
/// daemon in each). Five pairs mixed across root and uid 65534 (`write-bw --chk` root/root,
/// nobody/nobody, root/nobody, nobody/root, and an `rc-pingpong --chk` nobody/root) run at
/// once and all finish with every byte verified, while a uid-65534 attacker next to the
/// root servers tries to cross, and fails each time for the right reason:
///
/// - **memory**: opening a root server's ring memory (its memfd descriptor, its mapping, its
///   `/proc/PID/mem`) or the daemon's mapping of it: EACCES/EPERM (ptrace access rules; root
///   can open the same paths, so they are the real rings);
/// - **traffic**: binding the daemon's `IP:4791` (plain, with `SO_REUSEPORT`, or the wildcard
///   with `SO_REUSEADDR` and `SO_REUSEPORT`) to receive in its place: EADDRINUSE (the daemon
///   holds the port alone and is another user);
/// - **control**: asking the daemon for a QPN range gives a fresh one, never a range another
///   client holds, and a second request is refused (already has a range); claiming the root
///   server's range as its "resumed" owner (`Request::Resume`, with a socket of its own passed
///   as the member, or none) is refused: only the member socket itself proves a range;
/// - **views**: `res show qp` shows the attacker the QPNs of root's QPs but not their PSNs;
/// - **forged packets**: RDMA WRITEs to the streaming root server's QP, with every rkey of
///   the first two key-table entries and guessed PSNs, are delivered to that server's ring
///   and dropped by its QP (sequence NAK, PSN drop or duplicate, counted; none fails the
///   ICRC), and its whole buffer is still exactly what its own client wrote; forged WRITEs to
///   a QPN nobody owns are dropped by the daemon (`rx-drop-no-owner`).
#[test]
fn forwarding_keeps_each_users_traffic_and_memory_its_own() {
    const TEST: &str = "forwarding_keeps_each_users_traffic_and_memory_its_own";
    if !netns_or_skip(TEST) {
        return;
    }
    let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        roce_testkit::skip(TEST, "no system python3 for the uid-65534 attacker");
        return;
    };
    let pair = NetnsPair::create("dmn-fwd2").unwrap();
    let (a, b) = (pair.a(), pair.b());
    let fwd = "mode = \"forwarding\"\n";
    let da = Daemon::start_at("fwd2-a", Some(a), &a.ipv4().to_string(), fwd);
    let db = Daemon::start_at("fwd2-b", Some(b), &b.ipv4().to_string(), fwd);
    let specs = [
        // The attack target: a root server with a long stream.
        PairSpec::new("write-bw -n 30000 -s 65536 --chk", 18_830).users(false, false),
        PairSpec::new("write-bw -n 3000 -s 65536 --chk", 18_831).users(true, true),
        PairSpec::new("write-bw -n 3000 -s 65536 --chk", 18_832).users(false, true),
        PairSpec::new("write-bw -n 3000 -s 65536 --chk", 18_833).users(true, false),
        PairSpec::new("rc-pingpong -n 2000 --chk", 18_834).users(true, false),
    ];
    let mut pairs = start_pairs(
        &Side {
            ns: a,
            d: &da,
            dev: "veth-a",
        },
        &Side {
            ns: b,
            d: &db,
            dev: "veth-b",
        },
        &a.ipv4().to_string(),
        &specs,
    );
    let target = pairs[0].server.pid();
    // The target's stream under way.
    wait_for(
        Duration::from_secs(30),
        "the target stream under way",
        || (client_counter(&da, target, "rx_bytes")? > 16 << 20).then_some(()),
    );
    let before = da
        .json(&["stat", "-j"])
        .into_iter()
        .find(|r| r["pid"] == target)
        .unwrap();
    let rows = da.json(&["res", "show", "qp", "-j"]);
    let tq = rows.iter().find(|r| r["pid"] == target).unwrap();
    let qpn = tq["lqpn"].as_u64().unwrap() as u32;
    let held: HashSet<u64> = da
        .json(&["res", "show", "-j"])
        .iter()
        .map(|r| r["slot"].as_u64().unwrap())
        .collect();
    // What the attacker is given: the root server's ring paths (and the daemon's), which
    // root itself can open.
    let mut paths = ring_paths(target);
    paths.push(format!("/proc/{target}/mem"));
    let daemon_paths = ring_paths(da.pid());
    assert!(
        paths.iter().any(|p| p.contains("/fd/")) && !daemon_paths.is_empty(),
        "no ring memory found: {paths:?} {daemon_paths:?}"
    );
    paths.extend(daemon_paths);
    for p in &paths {
        assert!(std::fs::File::open(p).is_ok(), "root cannot open {p}");
    }
    let (src, dst, sport) = (a.ipv4(), a.ipv4(), 40_791u16);
    let mut packets = Vec::new();
    let mut guess = 0x9E37_79B9u32;
    for rkey in 0..512u32 {
        guess = guess.wrapping_mul(0x0101_0101).wrapping_add(0x2545_F491);
        packets.push(forged_write(
            src,
            sport,
            dst,
            qpn,
            guess & 0xFF_FFFF,
            rkey,
            0x1000,
        ));
    }
    // A QPN in a slot nobody holds (the last of 255).
    let no_owner = 255 * 65_536 + 0x42;
    let orphan: Vec<Vec<u8>> = (0..16)
        .map(|k| forged_write(src, sport, dst, no_owner, k, 0, 0))
        .collect();
    packets.extend(orphan);
    let target_slot = da
        .clients_with_pid(target)
        .first()
        .and_then(|r| r["slot"].as_u64())
        .unwrap() as u32;
    let req = |r: &Request| serde_json::to_string(r).unwrap();
    let hello = req(&Request::Hello(Hello::new(Role::Device)));
    let alloc = req(&Request::AllocRange {
        device: "attacker".into(),
    });
    let resume = req(&Request::Resume {
        device: "attacker".into(),
        slot: target_slot,
        objects: roce_transport::control::Objects::default(),
    });
    let sessions = serde_json::json!([
        [[hello, false], [alloc, false], [alloc, false]],
        [[hello, false], [resume, true]],
        [[hello, false], [resume, false]],
    ]);
    let orders = serde_json::json!({
        "paths": paths,
        "binds": [
            ["specific", a.ipv4().to_string(), false, false],
            ["specific+reuseport", a.ipv4().to_string(), false, true],
            ["wildcard+reuseaddr+reuseport", "0.0.0.0", true, true],
        ],
        "socket": da.socket,
        "sessions": sessions,
        "src": src.to_string(),
        "dst": dst.to_string(),
        "sport": sport,
        "packets": packets.iter().map(|p| p.iter().map(|b| format!("{b:02x}")).collect::<String>()).collect::<Vec<_>>(),
    });
    let file = da.dir.0.join("orders.json");
    std::fs::write(&file, orders.to_string()).unwrap();
    let mut cmd = a.cmd("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        python,
        "-c",
        ATTACKER,
    ])
    .arg(&file);
    let out = Proc::spawn(cmd, "attacker", &da.dir.0)
        .unwrap()
        .wait(Duration::from_secs(30));
    assert!(out.success(), "attacker: {}", out.combined());
    let got: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    // Memory.
    for p in &paths {
        let e = got["open"][p].as_str().unwrap();
        assert!(e == "EACCES" || e == "EPERM", "uid 65534 opening {p}: {e}");
    }
    // Traffic.
    for (name, e) in got["bind"].as_object().unwrap() {
        assert_eq!(e, "EADDRINUSE", "uid 65534 binding 4791 ({name})");
    }
    assert_eq!(got["bind"].as_object().unwrap().len(), 3);
    // Control.
    let ctl = got["control"].as_array().unwrap();
    assert_eq!(ctl[0]["reply"], "welcome", "{ctl:?}");
    let slot = ctl[1]["slot"].as_u64().unwrap_or_else(|| panic!("{ctl:?}"));
    assert!(
        !held.contains(&slot),
        "the attacker got held slot {slot}: {held:?}"
    );
    assert!(
        ctl[2].to_string().contains("already"),
        "a second range: {ctl:?}"
    );
    // Claiming the root server's range as a resumed member of an earlier daemon run, with a
    // socket of its own or none: refused, the claim is proved by the member socket only.
    for k in [4, 6] {
        assert_eq!(ctl[k - 1]["reply"], "welcome", "{ctl:?}");
        let e = ctl[k].to_string();
        assert!(
            e.contains(&format!("does not hold QPN range slot {target_slot}")),
            "resume of slot {target_slot}: {e}"
        );
    }
    assert_eq!(ctl.len(), 7, "{ctl:?}");
    // Views: as uid 65534, root's QPs without their PSNs; root sees them.
    let mut view = a.cmd("setpriv");
    view.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        ROCECTL,
        "res",
        "show",
        "qp",
        "-j",
        "--socket",
    ])
    .arg(&da.socket);
    let v = view.output().unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    let theirs: Vec<Value> = serde_json::from_slice(&v.stdout).unwrap();
    let root_rows: Vec<&Value> = theirs.iter().filter(|r| r["uid"] == 0).collect();
    assert!(!root_rows.is_empty(), "{theirs:?}");
    for r in &root_rows {
        assert!(r["lqpn"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(
            (r["sq-psn"].as_u64(), r["rq-psn"].as_u64()),
            (Some(0), Some(0)),
            "uid 65534 sees a root QP's PSNs: {r}"
        );
    }
    let mine = theirs.iter().filter(|r| r["uid"] == 65534).count();
    assert!(mine > 0, "{theirs:?}");
    // Forged packets: delivered to the target's ring and dropped by its QP, counted.
    assert_eq!(got["sent"], packets.len());
    let drops = |r: &Value| {
        ["out_of_seq_request", "duplicate_request", "qp_drops"]
            .iter()
            .map(|k| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}")))
            .sum::<u64>()
    };
    let after = wait_for(
        Duration::from_secs(10),
        "the forged packets counted",
        || {
            let r = da
                .json(&["stat", "-j"])
                .into_iter()
                .find(|r| r["pid"] == target)?;
            (drops(&r) >= drops(&before) + 512).then_some(r)
        },
    );
    assert_eq!(after["icrc_errors"], before["icrc_errors"], "{after}");
    assert_eq!(
        after["send_fatal_nak"], 0,
        "a forged packet was executed: {after}"
    );
    let daemon = wait_for(Duration::from_secs(5), "the no-owner drops", || {
        let d = da.json(&["stat", "-j"]).pop()?;
        (d["rx-drop-no-owner"].as_u64()? >= 16).then_some(d)
    });
    eprintln!(
        "forged: 512 to root's QP {qpn:#x} dropped by it ({} -> {} PSN drops, NAKs and duplicates), 16 to no owner; daemon: {daemon}",
        drops(&before),
        drops(&after)
    );
    assert!(
        !pairs[0].server.exited(),
        "the target stream ended before the attack did: make it longer"
    );
    // Every pair, the target's too, finishes with its whole buffer verified.
    let outs = finish_pairs(pairs, [&da, &db], Duration::from_secs(90));
    assert_eq!(outs.len(), 5);
    for d in [&da, &db] {
        let log = d.log();
        assert!(log.contains("uid=65534") && log.contains("uid=0"), "{log}");
    }
}

/// `write-bw --chk` fails when the data is wrong: a server whose buffer has one byte flipped
/// before it checks (`--chk-corrupt`, the hook for this test) exits 1 naming the byte, and so
/// does its client, told by the server's verdict; a client without `--chk` facing a `--chk`
/// server makes both fail with a clear error rather than pass unchecked.
#[test]
fn write_bw_chk_fails_on_a_corrupted_buffer() {
    if !netns_or_skip("write_bw_chk_fails_on_a_corrupted_buffer") {
        return;
    }
    let ns = TempNetns::create("dmn-chk").unwrap();
    let d = Daemon::start("chk", Some(&ns), "");
    let run = |server: &str, client: &str, port: u16| {
        let srv = format!("{server} -d lo -p {port}");
        let srv = tool(
            &ns,
            &d,
            &srv.split_whitespace().collect::<Vec<_>>(),
            "chk server",
        );
        wait_for(Duration::from_secs(10), "the server registered", || {
            (!d.clients_with_pid(srv.pid()).is_empty()).then_some(())
        });
        let cli = format!("{client} -d lo -p {port} 127.0.0.1");
        let cli = tool(
            &ns,
            &d,
            &cli.split_whitespace().collect::<Vec<_>>(),
            "chk client",
        );
        (
            srv.wait(Duration::from_secs(30)),
            cli.wait(Duration::from_secs(30)),
        )
    };
    // 70000 is byte 4464 of the target half (64 KiB + 64 B of a 64 KiB test).
    let (s, c) = run(
        "write-bw -n 300 -s 65536 --chk --chk-corrupt 70000",
        "write-bw -n 300 -s 65536 --chk",
        18_850,
    );
    assert_eq!(s.code, Some(1), "{}", s.combined());
    assert_eq!(c.code, Some(1), "{}", c.combined());
    assert!(
        s.stderr.contains("data check failed: 1 of the 131072 bytes of the buffer differ; the first at offset 70000: target byte 4464"),
        "{}",
        s.combined()
    );
    assert!(
        c.stderr
            .contains("the server found 1 of the 131072 bytes of its buffer wrong"),
        "{}",
        c.combined()
    );
    // The same without the flip passes (so the failure above is the flip's).
    let (s, c) = run(
        "write-bw -n 300 -s 65536 --chk",
        "write-bw -n 300 -s 65536 --chk",
        18_851,
    );
    assert!(
        s.success() && c.success(),
        "{}\n{}",
        s.combined(),
        c.combined()
    );
    // One side without --chk: both fail.
    let (s, c) = run("write-bw -n 300 --chk", "write-bw -n 300", 18_852);
    assert_eq!(
        (s.code, c.code),
        (Some(1), Some(1)),
        "{}\n{}",
        s.combined(),
        c.combined()
    );
    assert!(
        s.stderr.contains("give --chk to both sides"),
        "{}",
        s.combined()
    );
}

/// Engines and the daemon (`--engines`, `DeviceConfig::engines`). A `write-bw -q 2 --engines 2`
/// pair through the daemon runs one engine on each side (a leased device cannot steer its
/// address's group), says so on stderr, and moves its data. A sharded device that holds the
/// address alone (`ROCECTL_EXCLUSIVE=1`, two engines) keeps the daemon's kernel-demux clients
/// off it: a tool that asks the daemon fails with "address in use … several engines" instead
/// of joining the group and taking over its steering; once the sharded device is gone, the
/// same tool runs through the daemon.
#[test]
fn engines_through_the_daemon_run_one_and_a_sharded_device_keeps_members_off() {
    let test = "engines_through_the_daemon_run_one_and_a_sharded_device_keeps_members_off";
    if !netns_or_skip(test) {
        return;
    }
    let ns = TempNetns::create("dmn-eng").unwrap();
    let d = Daemon::start("eng", Some(&ns), "");
    fn bw<'a>(port: &'a str, host: Option<&'a str>) -> Vec<&'a str> {
        let mut a = vec![
            "write-bw",
            "-d",
            "lo",
            "-p",
            port,
            "-q",
            "2",
            "--engines",
            "2",
            "-n",
            "200",
            "--timeout",
            "20",
            "--json",
        ];
        a.extend(host);
        a
    }
    let server = tool(&ns, &d, &bw("18741", None), "write-bw server (daemon)");
    wait_for(Duration::from_secs(20), "the server registered", || {
        (!d.clients_with_pid(server.pid()).is_empty()).then_some(())
    });
    let client = tool(
        &ns,
        &d,
        &bw("18741", Some("127.0.0.1")),
        "write-bw client (daemon)",
    );
    let (c, s) = (
        client.wait(Duration::from_secs(60)),
        server.wait(Duration::from_secs(60)),
    );
    for out in [&c, &s] {
        assert!(out.success(), "{}", out.combined());
        let j = json_line(&out.stdout);
        assert_eq!(j["engines"], 1, "{}", out.stdout);
        assert!(
            out.stderr.contains(
                "2 engine(s) asked for, 1 running: the rocectl daemon serves this address"
            ),
            "{}",
            out.stderr
        );
    }
    assert_eq!(json_line(&c.stdout)["iters"], 400, "{}", c.stdout);

    // A sharded device alone on the address, then a daemon client.
    let mut cmd = ns.command("env");
    cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", d.socket.display()));
    cmd.arg("ROCECTL_EXCLUSIVE=1");
    cmd.args([
        ROCECTL,
        "write-bw",
        "-d",
        "lo",
        "-p",
        "18742",
        "-q",
        "2",
        "--engines",
        "2",
        "--accept-timeout",
        "30",
    ]);
    let sharded = Proc::spawn(cmd, "sharded write-bw server", &d.dir.0).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the sharded device listening",
        || roce_testkit::proc::listening(sharded.pid(), 18_742).then_some(()),
    );
    let member = tool(
        &ns,
        &d,
        &["rc-pingpong", "-d", "lo", "-p", "18743"],
        "pingpong server beside the sharded device",
    )
    .wait(Duration::from_secs(20));
    assert!(
        !member.success() && !member.timed_out,
        "{}",
        member.combined()
    );
    assert!(
        member.stderr.contains("already in use") && member.stderr.contains("several engines"),
        "{}",
        member.stderr
    );
    signal(sharded.pid(), "-TERM");
    let out = sharded.wait(Duration::from_secs(10));
    assert!(!out.timed_out, "{}", out.combined());
    // The address is the daemon's again.
    let again = tool(
        &ns,
        &d,
        &["rc-pingpong", "-d", "lo", "-p", "18744"],
        "pingpong server after the sharded device",
    );
    wait_for(
        Duration::from_secs(20),
        "the pingpong server registered",
        || (!d.clients_with_pid(again.pid()).is_empty()).then_some(()),
    );
}
