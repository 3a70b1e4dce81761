//! IPv4 UDP GSO off loopback, over a veth pair between two network namespaces.
//!
//! The kernel cuts a GSO message from an unconnected socket with DF into datagrams numbered
//! Identification 0, 1, .., n-1 (`ip_select_ident_segs` gives the message 0, then
//! `inet_gso_segment` counts up); the engine computes each segment's ICRC for its own number
//! (`Datapath::plan_ipv4_idents`, `roce_wire::icrc::Ipv4IdentPatcher`). Here:
//!
//! - with segmentation offload switched off on the sending veth, the kernel segments before
//!   the veth: a tcpdump capture on the receiving end holds the segments as they crossed the
//!   link, and every one (Identifications above 0 included) must carry a valid ICRC (checked
//!   here with `roce_wire::icrc::verify` and by `shared/tools/check_pcap.sh`), with the data
//!   of every RC operation checked end to end by the selftest, and the receiver checking all
//!   32 bits of each ICRC through its raw receive socket;
//! - with the veth's default offloads the message crosses whole and the receiving kernel
//!   segments it (or hands it to a GRO socket whole): each receiver configuration must
//!   accept every datagram (no ICRC errors) and get the data right.
//!
//! Needs root (CI runs as root); skips loudly only where the kernel lacks network namespaces.

mod pcap_check;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsPair, Side};
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions, UdpStats};
use roce_transport::datapath::{Datapath, DatapathCaps, RxDrops, RxMeta, TxDatagram};
use roce_transport::selftest::{run_rc, SelftestOptions};
use roce_transport::{Backend, Device, DeviceConfig};
use roce_wire::icrc;
use roce_wire::pcap::{l3_offset, read_capture};

use pcap_check::check_pcap;

/// A `udp` datapath whose counters the test can read while a device owns it.
#[derive(Debug)]
struct Probe {
    inner: UdpDatapath,
    stats: Arc<Mutex<UdpStats>>,
}

impl Datapath for Probe {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn caps(&self) -> DatapathCaps {
        self.inner.caps()
    }
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn send(&mut self, batch: &[TxDatagram<'_>]) -> std::io::Result<usize> {
        let r = self.inner.send(batch);
        *self.stats.lock().unwrap() = self.inner.stats();
        r
    }
    fn plan_ipv4_idents(&mut self, batch: &[TxDatagram<'_>], idents: &mut [u16]) {
        self.inner.plan_ipv4_idents(batch, idents);
    }
    fn first_message_len(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        self.inner.first_message_len(batch)
    }
    fn recv(
        &mut self,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [RxMeta],
    ) -> std::io::Result<usize> {
        let r = self.inner.recv(bufs, meta);
        *self.stats.lock().unwrap() = self.inner.stats();
        r
    }
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.readiness_fd()
    }
    fn rx_drops(&mut self) -> RxDrops {
        self.inner.rx_drops()
    }
}

/// Opens a device on `side`'s IPv4 address with `opts`; returns it and its datapath counters.
fn open(pair: &NetnsPair, side: Side, opts: UdpOptions) -> (Device, Arc<Mutex<UdpStats>>) {
    let end = pair.end(side);
    let local = SocketAddr::new(IpAddr::V4(end.ipv4()), 4791);
    let stats = Arc::new(Mutex::new(UdpStats::default()));
    let shared = stats.clone();
    let dev = end
        .netns()
        .enter_scoped(move || {
            let dp = UdpDatapath::bind(local, opts).expect("bind");
            assert_eq!(dp.driver(), Some("veth"), "the interface's driver");
            if opts.gso {
                assert!(dp.ipv4_gso_off_loopback(), "IPv4 GSO on a veth");
            }
            let probe = Probe {
                inner: dp,
                stats: shared,
            };
            Device::open(
                DeviceConfig::new(Backend::Custom(Box::new(probe)))
                    .name(format!("gso-{side:?}").to_lowercase()),
            )
        })
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("open device on {local}: {e}"));
    (dev, stats)
}

/// tcpdump on `side`'s veth, writing UDP 4791 to `file`; ready when it returns.
fn tcpdump(pair: &NetnsPair, side: Side, file: &Path) -> Child {
    let end = pair.end(side);
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            end.ns_name(),
            "tcpdump",
            "-i",
            end.ifname(),
        ])
        .args(["-U", "-s", "0", "-n", "-B", "65536", "-w"])
        .arg(file)
        .args(["udp", "port", "4791"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tcpdump");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("listening on") => return child,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tcpdump did not start: {e}");
            }
        }
    }
}

/// Stops a tcpdump started by [`tcpdump`] (SIGTERM, so it writes its last records), bounded.
fn stop(mut child: Child) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().expect("wait tcpdump").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// What a capture held: RoCEv2 IPv4 frames, how many carried a non-zero Identification, the
/// largest IP packet, and the frames whose ICRC failed.
#[derive(Debug, Default)]
struct Seen {
    frames: usize,
    nonzero_ident: usize,
    largest: usize,
    bad: Vec<(usize, u16, usize)>,
}

fn inspect(file: &Path) -> Seen {
    let frames = read_capture(std::fs::File::open(file).expect("open capture")).expect("read");
    let mut seen = Seen::default();
    for (i, f) in frames.iter().enumerate() {
        let off = if f.linktype == 1 {
            // Ethernet (what tcpdump on a veth writes): IPv4 after 14 bytes.
            if f.data.get(12..14) != Some(&[0x08, 0x00][..]) {
                continue;
            }
            14
        } else {
            match l3_offset(f.linktype, &f.data) {
                Some(off) => off,
                None => continue,
            }
        };
        let ip = &f.data[off..];
        if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 17 {
            continue;
        }
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let ip = &ip[..total.min(ip.len())];
        let ident = u16::from_be_bytes([ip[4], ip[5]]);
        seen.frames += 1;
        seen.largest = seen.largest.max(ip.len());
        if ident != 0 {
            seen.nonzero_ident += 1;
        }
        assert_eq!(ip[6] & 0x40, 0x40, "frame {i}: DF");
        if !icrc::verify(ip) {
            seen.bad.push((i, ident, ip.len()));
        }
    }
    seen
}

fn selftest_opts() -> SelftestOptions {
    SelftestOptions {
        sizes: vec![4097, 65_536, 1 << 20],
        iterations: 2,
        ud_sizes: vec![],
        timeout: Duration::from_secs(30),
        ack_timeout: 10,
    }
}

/// Both veths segment in software (tx-udp-segmentation off): the capture on the receiving
/// veth holds real segments in both directions, each with its own Identification and a valid ICRC; the
/// receiver checks all 32 bits of each ICRC (raw receive) and every byte of data.
#[test]
fn ipv4_gso_segments_on_the_wire_carry_valid_icrcs() {
    let tag = "gso-wire";
    if !netns_or_skip(tag) {
        return;
    }
    let start = Instant::now();
    let pair = NetnsPair::create_with_mtu(tag, 9000).expect("create namespaces");
    for side in [Side::A, Side::B] {
        let end = pair.end(side);
        end.netns()
            .exec(
                "ethtool",
                &["-K", end.ifname(), "tx-udp-segmentation", "off"],
            )
            .expect("ethtool -K tx-udp-segmentation off");
    }
    let dir = std::env::temp_dir().join(format!("roce-gso-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("b.pcap");
    let dump = tcpdump(&pair, Side::B, &cap);
    let result = {
        let (da, sa) = open(&pair, Side::A, UdpOptions::default());
        let (db, sb) = open(&pair, Side::B, UdpOptions::default());
        let r = run_rc(&da, &db, &selftest_opts(), &mut |r| eprintln!("{tag}: {r}"));
        let (ca, cb) = (da.counters(), db.counters());
        let (sa, sb) = (*sa.lock().unwrap(), *sb.lock().unwrap());
        eprintln!("{tag}: a {ca:?}\n{tag}: b {cb:?}\n{tag}: udp a {sa:?}\n{tag}: udp b {sb:?}");
        (r, ca, cb, sa, sb)
    };
    std::thread::sleep(Duration::from_millis(200));
    stop(dump);
    let (r, ca, cb, sa, sb) = result;
    r.unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert_eq!(
        ca.icrc_errors + cb.icrc_errors,
        0,
        "ICRC errors at the receivers"
    );
    assert!(
        sa.gso_messages > 0 && sa.gso_datagrams > 2 * sa.gso_messages,
        "A sent GSO messages: {sa:?}"
    );
    assert_eq!(sa.gso_fallbacks, 0);
    assert!(
        sb.rx_datagrams > 0 && sb.gro_messages == 0,
        "B: raw receive, {sb:?}"
    );
    let seen = inspect(&cap);
    eprintln!(
        "{tag}: {} frames captured, {} with Identification > 0, largest {} bytes",
        seen.frames, seen.nonzero_ident, seen.largest
    );
    assert!(
        seen.bad.is_empty(),
        "frames with a bad ICRC: {:?}",
        seen.bad
    );
    assert!(
        seen.largest <= 9000,
        "segments on the wire, not GSO messages"
    );
    assert!(
        seen.nonzero_ident as u64 >= sa.gso_datagrams - sa.gso_messages,
        "every segment after the first of a message has its own Identification: {seen:?}"
    );
    check_pcap(&cap);
    drop(pair);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{tag}: {:.1} s", start.elapsed().as_secs_f64());
}

/// Default veth offloads: the GSO message crosses the veth whole and the receiving side
/// segments it (or keeps it whole for a GRO socket). Every receiver configuration accepts
/// every datagram and gets the data right.
fn whole_messages(tag: &str, receiver: UdpOptions) {
    if !netns_or_skip(tag) {
        return;
    }
    let start = Instant::now();
    let pair = NetnsPair::create_with_mtu(tag, 9000).expect("create namespaces");
    let dir = std::env::temp_dir().join(format!("roce-gso-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("b.pcap");
    let dump = tcpdump(&pair, Side::B, &cap);
    let result = {
        let (da, sa) = open(&pair, Side::A, UdpOptions::default());
        let (db, sb) = open(&pair, Side::B, receiver);
        let r = run_rc(&da, &db, &selftest_opts(), &mut |r| eprintln!("{tag}: {r}"));
        let (ca, cb) = (da.counters(), db.counters());
        let (sa, sb) = (*sa.lock().unwrap(), *sb.lock().unwrap());
        eprintln!("{tag}: a {ca:?}\n{tag}: b {cb:?}\n{tag}: udp a {sa:?}\n{tag}: udp b {sb:?}");
        (r, ca, cb, sa, sb)
    };
    std::thread::sleep(Duration::from_millis(200));
    stop(dump);
    let (r, ca, cb, sa, _sb) = result;
    r.unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert_eq!(
        ca.icrc_errors + cb.icrc_errors,
        0,
        "ICRC errors at the receivers"
    );
    assert!(sa.gso_messages > 0, "A sent GSO messages: {sa:?}");
    let seen = inspect(&cap);
    eprintln!(
        "{tag}: {} frames captured, largest {} bytes, {} not checkable as one packet",
        seen.frames,
        seen.largest,
        seen.bad.len()
    );
    assert!(seen.largest > 9000, "GSO messages crossed the veth whole");
    drop(pair);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{tag}: {:.1} s", start.elapsed().as_secs_f64());
}

#[test]
fn ipv4_gso_whole_messages_to_a_gro_socket() {
    whole_messages(
        "gso-gro",
        UdpOptions {
            raw_receive: false,
            ..UdpOptions::default()
        },
    );
}

#[test]
fn ipv4_gso_whole_messages_to_a_plain_socket() {
    whole_messages(
        "gso-plain",
        UdpOptions {
            raw_receive: false,
            gro: false,
            ..UdpOptions::default()
        },
    );
}

#[test]
fn ipv4_gso_whole_messages_to_a_raw_receive_socket() {
    whole_messages("gso-raw", UdpOptions::default());
}
