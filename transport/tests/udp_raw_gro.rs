//! Raw receive (the `udp` backend as root, off loopback) when NAPI GRO merges our datagrams.
//!
//! The port-guarding UDP socket has `UDP_GRO` (so the kernel does not cut every same-host GSO
//! message into datagrams only for its drop-all filter), which also lets a NIC's NAPI GRO merge
//! our flows before the raw socket sees them. rocectl off loopback without GSO sends every
//! datagram with Identification 0 and DF, and GRO merges such datagrams although their
//! Identifications do not count up: the second datagram then does not check with `id + 1`, and
//! the backend passes the buffer on without its header fields so that the engine recovers each
//! Identification from its ICRC.
//!
//! The veth end the receiver sits on is made to receive as a NIC does: NAPI with GRO (turned on
//! with ethtool; veth takes the NAPI path only for a sender without TSO), polled by its own
//! thread so that datagrams queue up between polls and GRO has runs to merge (as in
//! `tests/demux.rs`). Needs root; skips loudly only where namespaces do not work, fails in CI.

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsEnd, NetnsPair};
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::datapath::{Datapath, RxMeta, TxDatagram};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{Backend, Device, DeviceConfig};
use roce_wire::frame::{FrameRepr, IpRepr, Ipv4Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{bth, samples, Opcode, PacketRepr, Psn, Qpn};

/// Turns on NAPI GRO for `rx` (threaded) and turns TSO off on `tx`, its peer.
fn nic_like_receive(rx: &NetnsEnd, tx: &NetnsEnd) {
    for (end, cmd) in [
        (tx, format!("ethtool -K {} tso off", tx.ifname())),
        (rx, format!("ethtool -K {} gro on", rx.ifname())),
        (
            rx,
            format!("echo 1 > /sys/class/net/{}/threaded", rx.ifname()),
        ),
    ] {
        let out = Command::new("ip")
            .args(["netns", "exec", end.ns_name(), "sh", "-c", &cmd])
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
}

/// Makes every burst the calling thread sends reach `rx`'s NAPI poll whole, whatever the
/// machine's load: `rx`'s NAPI thread and the calling thread are pinned to one CPU and the
/// caller runs SCHED_FIFO, so the NAPI thread (SCHED_OTHER) cannot run on it until the caller
/// sleeps after its burst; then its poll finds the whole burst queued and GRO merges it.
/// Without this the NAPI thread may poll after every datagram (seen under CPU load: two busy
/// loops on a 2-CPU machine made it merge nothing in 2 runs of 25). The settings die with the
/// thread (libtest runs each test on its own) and the namespace.
fn hold_napi_behind_sender(rx: &NetnsEnd) {
    let prefix = format!("napi/{}-", rx.ifname());
    let napi: Vec<String> = std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with(&prefix))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !napi.is_empty(),
        "no {prefix}* thread: threaded NAPI is not on"
    );
    // This thread's id (`/proc/thread-self` -> "PID/task/TID") and a CPU it may run on.
    let me = std::fs::read_link("/proc/thread-self").expect("read /proc/thread-self");
    let tid = me
        .file_name()
        .expect("a thread id")
        .to_string_lossy()
        .into_owned();
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("thread status");
    let cpu: String = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let mut cmds: Vec<Vec<String>> = napi
        .iter()
        .map(|pid| {
            vec![
                "taskset".into(),
                "-p".into(),
                "-c".into(),
                cpu.clone(),
                pid.clone(),
            ]
        })
        .collect();
    cmds.push(vec![
        "taskset".into(),
        "-p".into(),
        "-c".into(),
        cpu.clone(),
        tid.clone(),
    ]);
    cmds.push(vec![
        "chrt".into(),
        "-f".into(),
        "-p".into(),
        "1".into(),
        tid,
    ]);
    for cmd in cmds {
        let out = Command::new(&cmd[0])
            .args(&cmd[1..])
            .output()
            .expect("run taskset/chrt");
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    }
}

/// UDP payload of a UD SEND_ONLY from `from` to `to` (both port 4791) carrying `index`, its
/// ICRC computed for Identification 0 with DF: what a datagram from an unconnected UDP
/// socket carries on the wire.
fn ud_send(from: SocketAddr, to: SocketAddr, index: u32) -> Vec<u8> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.ip(), to.ip()) else {
        unreachable!("IPv4 test addresses")
    };
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
            src_port: ROCEV2_PORT,
            dst_port: ROCEV2_PORT,
            checksum: 0,
        },
    };
    let mut data = samples::pattern(1000);
    data[..4].copy_from_slice(&index.to_be_bytes());
    let mut packet: PacketRepr<'_> = samples::packet_for(Opcode::UdSendOnly, &data);
    packet.bth = bth::Repr::new(Opcode::UdSendOnly, Qpn::new(0x42), Psn::new(index));
    packet.payload = &data;
    samples::emit(&frame, &packet)[28..].to_vec()
}

/// The datapath: GRO merges a peer's same-size datagrams (all Identification 0) into buffers
/// the raw socket sees whole; the backend cuts them back into exactly the datagrams sent, and
/// passes merged buffers on without header fields (their Identifications do not count up).
#[test]
fn gro_merged_datagrams_with_one_identification_are_cut_and_left_to_the_engine() {
    let test = "gro_merged_datagrams_with_one_identification_are_cut_and_left_to_the_engine";
    if !netns_or_skip(test) {
        return;
    }
    let pair = NetnsPair::create("rawgro").expect("veth pair");
    nic_like_receive(pair.a(), pair.b());
    let local = SocketAddr::new(IpAddr::V4(pair.a().ipv4()), ROCEV2_PORT);
    let peer_addr = SocketAddr::new(IpAddr::V4(pair.b().ipv4()), ROCEV2_PORT);
    let mut dp = pair
        .a()
        .netns()
        .enter_scoped(|| UdpDatapath::bind(local, UdpOptions::default()))
        .unwrap()
        .expect("bind the receiver");
    assert!(dp.raw_receive(), "root, not loopback: raw receive is on");
    // The peer sends as rocectl does without GSO: one datagram per packet, DF, Identification
    // 0 (our datapath with `IP_PMTUDISC_DO`; with the default IP_PMTUDISC_WANT Linux would
    // pick a fresh Identification per datagram).
    let mut peer = pair
        .b()
        .netns()
        .enter_scoped(|| {
            let opts = UdpOptions {
                gso: false,
                ..UdpOptions::default()
            };
            UdpDatapath::bind(peer_addr, opts)
        })
        .unwrap()
        .expect("bind the peer");
    hold_napi_behind_sender(pair.a());
    const N: u32 = 2048;
    const BURST: u32 = 32;
    let sent: Vec<Vec<u8>> = (0..N).map(|i| ud_send(peer_addr, local, i)).collect();
    let mut got: Vec<Option<Vec<u8>>> = vec![None; N as usize];
    let mut received = 0;
    let mut merged_buffers = 0;
    let mut bufs = vec![vec![0u8; 65_536]; 16];
    let mut meta = [RxMeta::empty(); 16];
    for first in (0..N).step_by(BURST as usize) {
        // One datagram per call, as a sender without GSO; no sleep in between (the NAPI
        // thread waits for this thread to sleep: `hold_napi_behind_sender`).
        for d in &sent[first as usize..(first + BURST) as usize] {
            let dg = TxDatagram {
                dst: local,
                src_port: ROCEV2_PORT,
                payload: d,
                ..TxDatagram::EMPTY
            };
            assert_eq!(peer.send(&[dg]).expect("send"), 1);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while received < first + BURST {
            assert!(
                Instant::now() < deadline,
                "burst at {first}: {received} of {} received",
                first + BURST
            );
            let mut io: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let n = match dp.recv(&mut io, &mut meta) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(100));
                    continue;
                }
                Err(e) => panic!("recv: {e}"),
            };
            for (m, b) in meta[..n].iter().zip(&bufs) {
                assert_eq!(m.src, peer_addr);
                let stride = m.stride.max(1);
                if stride < m.len {
                    merged_buffers += 1;
                    assert_eq!(
                        m.ipv4, None,
                        "merged datagrams all carry Identification 0, not 0, 1, 2..: \
                         the engine must recover them"
                    );
                } else {
                    let v4 = m
                        .ipv4
                        .expect("a single datagram comes with its header fields");
                    assert_eq!((v4.ident, v4.dont_fragment), (0, true));
                }
                for d in b[..m.len].chunks(stride) {
                    let i = u32::from_be_bytes([d[20], d[21], d[22], d[23]]);
                    let slot = got.get_mut(i as usize).expect("an index we sent");
                    assert!(slot.is_none(), "datagram {i} twice");
                    *slot = Some(d.to_vec());
                    received += 1;
                }
            }
        }
    }
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(g.as_deref(), Some(&s[..]), "datagram {i} as sent");
    }
    let stats = dp.stats();
    eprintln!("{test}: {merged_buffers} merged buffers; {stats:?}");
    // Every burst reaches one NAPI poll whole (`hold_napi_behind_sender`), so GRO merges in
    // most of them, whatever the load.
    assert!(
        merged_buffers >= u64::from(N / BURST / 2) && stats.raw_gso_messages == merged_buffers,
        "NAPI GRO merged nothing ({merged_buffers} buffers): the guard socket has no UDP_GRO, \
         or the veth did not take the NAPI path"
    );
}

/// End to end: a peer without GSO (one datagram per packet, Identification 0) sends every RC
/// operation and UD SENDs to a raw-receiving device behind NAPI GRO; every byte arrives and
/// no packet fails its ICRC check.
#[test]
fn a_peer_without_gso_reaches_a_raw_receiver_behind_gro() {
    let test = "a_peer_without_gso_reaches_a_raw_receiver_behind_gro";
    if !netns_or_skip(test) {
        return;
    }
    let pair = NetnsPair::create("rawgro2").expect("veth pair");
    nic_like_receive(pair.a(), pair.b());
    let a_ip = IpAddr::V4(pair.a().ipv4());
    let b_addr = SocketAddr::new(IpAddr::V4(pair.b().ipv4()), ROCEV2_PORT);
    let a = pair
        .a()
        .netns()
        .enter_scoped(|| Device::open(DeviceConfig::udp(a_ip).name("gro-a")))
        .unwrap()
        .expect("open the receiver");
    let b = pair
        .b()
        .netns()
        .enter_scoped(|| {
            let opts = UdpOptions {
                gso: false,
                ..UdpOptions::default()
            };
            let dp = UdpDatapath::bind(b_addr, opts).expect("bind the sender");
            Device::open(DeviceConfig::new(Backend::Custom(Box::new(dp))).name("gro-b"))
        })
        .unwrap()
        .expect("open the sender");
    let opts = SelftestOptions {
        sizes: vec![1024, 65_536, 1 << 20],
        iterations: 2,
        ud_sizes: vec![1024],
        timeout: Duration::from_secs(30),
        ack_timeout: 10,
    };
    run_rc(&b, &a, &opts, &mut |r| eprintln!("{test}: {r}"))
        .unwrap_or_else(|e| panic!("{test}: {e}\na {:?}\nb {:?}", a.counters(), b.counters()));
    run_ud(&b, &a, &opts, &mut |r| eprintln!("{test}: {r}"))
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let (ca, cb) = (a.counters(), b.counters());
    eprintln!("{test}: a {ca:?}\n{test}: b {cb:?}");
    // Without the fallback to recovered Identifications every merged datagram but the first
    // fails here (and is retransmitted until it arrives alone).
    assert_eq!(ca.icrc_errors + cb.icrc_errors, 0, "{test}");
}
