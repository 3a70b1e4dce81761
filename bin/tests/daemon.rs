//! `rocectl daemon` end to end (issue 14): the configuration, the control socket's hello and
//! identity, QPN ranges, limits, reaping after `kill -9`, the views and shutdown.
//!
//! Each test starts its own daemon on its own socket (in a fresh directory under `/tmp`, which
//! a uid-65534 client can reach) and, where devices open UDP sockets, in its own network
//! namespace (`roce_testkit::netns::TempNetns`: only `lo`, 127.0.0.1 and 127.0.0.2), so the
//! tests run in parallel and touch nothing of the host's. Everything they start is killed when
//! they end. Tests that need namespaces follow the testkit skip policy.

use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, TempNetns};
use roce_testkit::proc::Proc;
use roce_transport::control::sys::{read_frame, write_frame};
use roce_transport::control::{
    ClientError, Connection, ControlError, Hello, Reply, Request, Resource, Role, Scope,
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

/// A running daemon: its socket, its log, the process (killed on drop).
struct Daemon {
    proc: Option<Proc>,
    socket: PathBuf,
    dir: TmpDir,
}

impl Daemon {
    /// Starts `rocectl daemon` with `config` (TOML) appended to the socket's settings, in
    /// `ns` when given (else the host's namespace: only the Unix socket is used then).
    fn start(tag: &str, ns: Option<&TempNetns>, config: &str) -> Self {
        let dir = TmpDir::new(tag);
        let socket = dir.0.join("rocectl.sock");
        let cfg = dir.0.join("rocectl.toml");
        std::fs::write(
            &cfg,
            format!(
                "address = \"127.0.0.1\"\n{config}\n[socket]\npath = \"{}\"\nmode = 0o666\n",
                socket.display()
            ),
        )
        .unwrap();
        let mut cmd = match ns {
            Some(ns) => ns.command(ROCECTL),
            None => Command::new(ROCECTL),
        };
        cmd.args(["daemon", "--config"]).arg(&cfg);
        cmd.env("RUST_LOG", "info");
        let proc = Proc::spawn(cmd, "rocectl daemon", &dir.0).unwrap();
        let d = Self {
            proc: Some(proc),
            socket,
            dir,
        };
        d.wait_for_socket();
        d
    }

    /// Stops the daemon (SIGTERM, status 0) and starts it again on the same configuration,
    /// in `ns` when given.
    fn restart(&mut self, ns: Option<&TempNetns>) {
        signal(self.pid(), "-TERM");
        let out = self.proc.take().unwrap().wait(Duration::from_secs(5));
        assert!(out.success(), "{}", out.combined());
        let cfg = self.dir.0.join("rocectl.toml");
        let mut cmd = match ns {
            Some(ns) => ns.command(ROCECTL),
            None => Command::new(ROCECTL),
        };
        cmd.args(["daemon", "--config"]).arg(&cfg);
        cmd.env("RUST_LOG", "info");
        self.proc = Some(Proc::spawn(cmd, "rocectl daemon (restarted)", &self.dir.0).unwrap());
        self.wait_for_socket();
    }

    fn wait_for_socket(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the daemon did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
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
        e.to_string()
            .contains("client speaks 99.x, daemon speaks 1.0"),
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
fn tool(ns: &TempNetns, d: &Daemon, args: &[&str], what: &str) -> Proc {
    let mut cmd = ns.command("env");
    cmd.arg(format!("ROCECTL_DAEMON_SOCKET={}", d.socket.display()));
    cmd.arg(ROCECTL).args(args);
    Proc::spawn(cmd, what, &d.dir.0).unwrap()
}

/// Many processes on one address, like on a NIC: three `rc-pingpong --chk` pairs and one
/// `write-bw` pair (8 processes, each its own device on 127.0.0.1:4791) run at once through
/// the daemon's kernel demultiplexer, every pingpong byte checked; a ninth and tenth process
/// (another pingpong pair) are started too and the server is killed with SIGKILL mid-run,
/// which must not disturb the others.
#[test]
fn eight_processes_share_one_address_and_a_killed_one_disturbs_nobody() {
    if !netns_or_skip("eight_processes_share_one_address_and_a_killed_one_disturbs_nobody") {
        return;
    }
    let ns = TempNetns::create("dmn-many").unwrap();
    let d = Daemon::start("many", Some(&ns), "");
    let limit = Duration::from_secs(120);
    // The victim pair first, with far more iterations than the others need.
    let victim = tool(
        &ns,
        &d,
        &[
            "rc-pingpong",
            "-d",
            "lo",
            "-p",
            "18700",
            "-n",
            "100000000",
            "--chk",
        ],
        "victim server",
    );
    wait_for(Duration::from_secs(10), "the victim's QP", || {
        (!d.clients_with_pid(victim.pid()).is_empty()).then_some(())
    });
    let victim_peer = tool(
        &ns,
        &d,
        &[
            "rc-pingpong",
            "-d",
            "lo",
            "-p",
            "18700",
            "-n",
            "100000000",
            "--chk",
            "127.0.0.1",
        ],
        "victim client",
    );
    let mut servers = Vec::new();
    for i in 0..3u16 {
        let port = (18_701 + i).to_string();
        servers.push(tool(
            &ns,
            &d,
            &[
                "rc-pingpong",
                "-d",
                "lo",
                "-p",
                &port,
                "-n",
                "3000",
                "--chk",
            ],
            "pingpong server",
        ));
    }
    servers.push(tool(
        &ns,
        &d,
        &[
            "write-bw", "-d", "lo", "-p", "18710", "-n", "2000", "-s", "65536",
        ],
        "write-bw server",
    ));
    // Clients after their servers listen (the servers register with the daemon first).
    wait_for(Duration::from_secs(20), "four servers registered", || {
        servers
            .iter()
            .all(|s| !d.clients_with_pid(s.pid()).is_empty())
            .then_some(())
    });
    let mut clients = Vec::new();
    for i in 0..3u16 {
        let port = (18_701 + i).to_string();
        clients.push(tool(
            &ns,
            &d,
            &[
                "rc-pingpong",
                "-d",
                "lo",
                "-p",
                &port,
                "-n",
                "3000",
                "--chk",
                "127.0.0.1",
            ],
            "pingpong client",
        ));
    }
    clients.push(tool(
        &ns,
        &d,
        &[
            "write-bw",
            "-d",
            "lo",
            "-p",
            "18710",
            "-n",
            "2000",
            "-s",
            "65536",
            "127.0.0.1",
        ],
        "write-bw client",
    ));
    // Every one of the ten is seen by the daemon, and no two clients listed at the same time
    // share a QPN range.
    let mut pids: Vec<u32> = servers.iter().chain(&clients).map(Proc::pid).collect();
    pids.extend([victim.pid(), victim_peer.pid()]);
    let mut seen = std::collections::HashSet::new();
    wait_for(
        Duration::from_secs(30),
        "all ten clients in res show",
        || {
            let rows = d.json(&["res", "show", "-j"]);
            let mut slots: Vec<u64> = rows.iter().map(|r| r["slot"].as_u64().unwrap()).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(
                slots.len(),
                rows.len(),
                "two clients share a range: {rows:?}"
            );
            for r in &rows {
                seen.insert(r["pid"].as_u64().unwrap() as u32);
            }
            pids.iter().all(|p| seen.contains(p)).then_some(())
        },
    );
    // Mid-run: kill the victim's server.
    let killed = Instant::now();
    signal(victim.pid(), "-KILL");
    wait_for(Duration::from_secs(10), "the victim reaped", || {
        d.clients_with_pid(victim.pid()).is_empty().then_some(())
    });
    eprintln!(
        "victim reaped {} ms after kill -9",
        killed.elapsed().as_millis()
    );
    for p in servers.into_iter().chain(clients) {
        let what = p.what().to_owned();
        let out = p.wait(limit);
        assert!(out.success(), "{what}: {}", out.combined());
    }
    drop(victim_peer);
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

/// Daemon restart in kernel-demux mode: with the demultiplexer pinned, a restarted daemon
/// takes the same group back; a pingpong pair running across the restart finishes with every
/// byte checked, a pair started after it runs too (the old pair's slots, which the new daemon
/// never allocated, are skipped), and when the old pair exits its slots are quarantined.
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
    let ns = TempNetns::create("dmn-rst").unwrap();
    let pin = bpf.0 .0.join("group");
    let mut d = Daemon::start(
        "restart",
        Some(&ns),
        &format!("[demux]\npin_dir = \"{}\"\n", pin.display()),
    );
    let long = [
        "rc-pingpong",
        "-d",
        "lo",
        "-p",
        "18720",
        "-n",
        "40000",
        "--chk",
    ];
    let mut srv = tool(&ns, &d, &long, "long server");
    wait_for(Duration::from_secs(10), "the long server", || {
        (!d.clients_with_pid(srv.pid()).is_empty()).then_some(())
    });
    let mut with_host = long.to_vec();
    with_host.push("127.0.0.1");
    let mut cli = tool(&ns, &d, &with_host, "long client");
    wait_for(Duration::from_secs(10), "the long pair running", || {
        d.json(&["res", "show", "qp", "-j"])
            .iter()
            .filter(|r| r["state"] == "RTS")
            .count()
            .ge(&2)
            .then_some(())
    });
    d.restart(Some(&ns));
    assert!(
        !srv.exited() && !cli.exited(),
        "the long pair ended before the restart"
    );
    assert!(d.log().contains("taken back from its pin"), "{}", d.log());
    // A new pair after the restart.
    let short = [
        "rc-pingpong",
        "-d",
        "lo",
        "-p",
        "18721",
        "-n",
        "300",
        "--chk",
    ];
    let s2 = tool(&ns, &d, &short, "new server");
    wait_for(Duration::from_secs(10), "the new server", || {
        (!d.clients_with_pid(s2.pid()).is_empty()).then_some(())
    });
    let mut short_c = short.to_vec();
    short_c.push("127.0.0.1");
    let c2 = tool(&ns, &d, &short_c, "new client");
    for p in [s2, c2, srv, cli] {
        let what = p.what().to_owned();
        let out = p.wait(Duration::from_secs(120));
        assert!(out.success(), "{what}: {}", out.combined());
    }
    wait_for(
        Duration::from_secs(5),
        "the old pair's slots quarantined",
        || {
            d.log()
                .contains("the member of an earlier daemon run left its QPN range")
                .then_some(())
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
