//! Kernel demux by destination QPN (`datapath::demux`): several members share one `IP:4791`
//! and each receives exactly the datagrams of its own QPN range.
//!
//! - `loopback_members_get_only_their_slots`: three `udp` datapaths on 127.0.0.1:4791 in one
//!   group; datagrams to each slot reach only its member, a slot nobody holds is dropped, and a
//!   member's GSO batch that mixes destination QPNs is still steered datagram by datagram.
//! - `two_demux_devices_share_one_address_over_veth`: two devices on the same veth address,
//!   each running RC (SEND, WRITE, WRITE_WITH_IMM, READ, atomics, data checked) and UD against
//!   one device on the peer address, at once; neither ever sees the other's traffic
//!   (`rx_drop_no_qp` stays 0), QPNs stay in each slot's range, and datagrams to a QPN in no
//!   member's range are delivered to nobody.
//! - `closing_one_member_leaves_the_other_undisturbed`: one member closes (its peer keeps
//!   retrying into the empty slot) while the other is mid-transfer; the transfer completes with
//!   its data checked and sees none of the dead member's traffic.
//! - `another_users_group_is_refused_clearly`: the kernel refuses to let another uid's socket
//!   share the address; the error says so.
//! - `a_killed_member_process_leaves_the_other_undisturbed`: a member in another process (the
//!   `demux_member` example, given the group's descriptors as a daemon client would be)
//!   serves one-sided WRITE/READ, then is killed with SIGKILL mid-stream while the other
//!   member is mid-transfer: its slot empties (time printed), the other completes.
//! - `the_daemon_exiting_mid_stream_disturbs_no_member`: the group's creator drops its
//!   descriptors while both members are mid-transfer; both complete.
//! - `ipv6_members_get_only_their_slots`: the same steering on `[::1]:4791`.
//! - `a_pinned_group_outlives_its_creator`: the group pinned in a BPF filesystem comes back to
//!   a restarted daemon; old and new members share the same map and are both steered.
//!
//! Needs root (`CAP_BPF`, network namespaces); skips loudly otherwise (panics under `CI`).

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsPair, Side, TempNetns};
use roce_testkit::{require_root, skip};
use roce_transport::datapath::demux::{Demux, DemuxError, DemuxGroup, SlotLayout};
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::datapath::{Datapath, RxMeta, TxDatagram};
use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceConfig, OpenError, QpInit, QpType, RemoteQp,
    SendOp, SendWr, WcStatus,
};

/// Creates a group, or says why the test cannot run (no privilege): `None` then.
fn group_or_skip(test: &str) -> Option<DemuxGroup> {
    if !require_root(test, "loading the BPF steering program needs CAP_BPF") {
        return None;
    }
    match DemuxGroup::create(SlotLayout::DEFAULT) {
        Ok(g) => Some(g),
        Err(e @ DemuxError::NoPrivilege { .. }) => {
            skip(test, e);
            None
        }
        Err(e) => panic!("create the demux group: {e}"),
    }
}

/// Waits (at most 5 s) until `slot` of `group` holds no socket, and says whether it emptied.
///
/// The kernel empties a slot when the member socket's last reference goes, which is at the
/// `close` only if nothing else holds one: a child process that another test thread of this
/// binary is spawning at that moment (`ip`, `ethtool`) holds a copy of every descriptor of the
/// process until its `exec` closes the close-on-exec ones, so on a loaded machine the slot can
/// stay taken for a few milliseconds after the drop.
fn emptied(group: &DemuxGroup, slot: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if group.occupant(slot).unwrap().is_none() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A 16-byte datagram (BTH + 4 bytes in place of the ICRC) to `qpn`, tagged with `tag`.
fn datagram(qpn: u32, tag: u8) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0] = 0x04; // RC SEND_ONLY
    d[1] = 0x40;
    d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    d[12] = tag;
    d
}

/// Everything `dp` has received within `wait`: the destination QPN of each datagram (a GRO
/// buffer, on loopback, cut at its stride as the engine cuts it).
fn drain(dp: &mut UdpDatapath, wait: Duration) -> Vec<u32> {
    std::thread::sleep(wait);
    let mut got = Vec::new();
    let mut bufs = vec![vec![0u8; 65_536]; 16];
    let mut meta = [RxMeta::empty(); 16];
    loop {
        let mut io: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        match dp.recv(&mut io, &mut meta) {
            Ok(0) => break,
            Ok(n) => {
                for (m, b) in meta[..n].iter().zip(&bufs) {
                    assert!(m.stride > 0 && m.stride <= m.len, "{m:?}");
                    for d in b[..m.len].chunks(m.stride) {
                        got.push(u32::from_be_bytes([0, d[5], d[6], d[7]]));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("recv: {e}"),
        }
    }
    got
}

#[test]
fn loopback_members_get_only_their_slots() {
    let test = "loopback_members_get_only_their_slots";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let layout = group.layout();
    let ns = TempNetns::create("demux-lo").expect("namespace");
    let addr: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    let member = |slot: u32| {
        let d = Demux::new(group.try_clone().unwrap(), slot).unwrap();
        UdpDatapath::bind_demux(addr, UdpOptions::default(), &d)
            .unwrap_or_else(|e| panic!("join slot {slot}: {e}"))
    };
    let (mut m1, mut m2, mut m5) = ns
        .netns()
        .enter_scoped(|| (member(1), member(2), member(5)))
        .unwrap();
    for m in [&m1, &m2, &m5] {
        assert!(
            m.caps().gro_segments > 1,
            "a member on a loopback address keeps UDP_GRO"
        );
        assert!(!m.raw_receive());
        assert_eq!(m.local_addr(), addr);
    }
    assert_eq!(m1.demux_slot(), Some(1));
    assert!(group.occupant(1).unwrap().is_some());
    assert!(group.occupant(3).unwrap().is_none());
    // A claim to a slot (a restarted daemon's resume) is proved by the socket in it only.
    {
        use std::os::fd::AsFd as _;
        assert!(group.holds(1, m1.socket().as_fd()).unwrap());
        assert!(!group.holds(1, m2.socket().as_fd()).unwrap());
        assert!(!group.holds(3, m1.socket().as_fd()).unwrap());
        let not_a_socket = std::fs::File::open("/dev/null").unwrap();
        assert!(group.holds(1, not_a_socket.as_fd()).is_err());
    }
    // A slot is held by one socket only.
    let again = ns
        .netns()
        .enter_scoped(|| {
            let d = Demux::new(group.try_clone().unwrap(), 2).unwrap();
            UdpDatapath::bind_demux(addr, UdpOptions::default(), &d)
        })
        .unwrap();
    let err = again.expect_err("a second member in slot 2");
    assert!(err.to_string().contains("slot 2 is already taken"), "{err}");

    let q = |slot: u32, low: u32| layout.range(slot).unwrap().start() + low;
    // From a plain socket: 3 slots held, one (3) not, and slot 0 (QP1) not held either.
    let tx = ns
        .netns()
        .enter_scoped(|| UdpSocket::bind("127.0.0.2:0").unwrap())
        .unwrap();
    let mut sent = [0usize; 4];
    for k in 0..40u32 {
        for (i, slot) in [1u32, 2, 5, 3].into_iter().enumerate() {
            tx.send_to(&datagram(q(slot, k), 0), addr).unwrap();
            sent[i] += 1;
        }
        tx.send_to(&datagram(1, 0), addr).unwrap();
    }
    let wait = Duration::from_millis(50);
    for (m, slot, n) in [
        (&mut m1, 1, sent[0]),
        (&mut m2, 2, sent[1]),
        (&mut m5, 5, sent[2]),
    ] {
        let got = drain(m, wait);
        assert_eq!(got.len(), n, "slot {slot} got {got:x?}");
        assert!(got.iter().all(|&x| layout.slot_of(x) == slot), "{got:x?}");
    }

    // A member's GSO batch over loopback mixing destination QPNs: runs are cut per QPN, so
    // every datagram reaches its owner (and one to the empty slot 3 reaches nobody).
    let order: [u32; 12] = [1, 1, 1, 2, 2, 1, 2, 2, 2, 3, 1, 1];
    let mut arena = Vec::new();
    for (k, &slot) in order.iter().enumerate() {
        arena.extend_from_slice(&datagram(q(slot, 7), k as u8));
    }
    let batch: Vec<TxDatagram<'_>> = arena
        .chunks(16)
        .map(|p| TxDatagram {
            dst: addr,
            src_port: 4791,
            tos: 0,
            hop_limit: 64,
            flow_label: 0,
            payload: p,
        })
        .collect();
    // Planned as the engine plans (IPv4 runs are coalesced only in a planned batch).
    let mut idents = [0u16; 12];
    m5.plan_ipv4_idents(&batch, &mut idents);
    assert_eq!(m5.send(&batch).unwrap(), order.len());
    let stats = m5.stats();
    assert!(
        stats.gso_messages >= 3,
        "runs of one QPN still coalesce: {stats:?}"
    );
    let c = |slot| order.iter().filter(|&&s| s == slot).count();
    let (g1, g2) = (drain(&mut m1, wait), drain(&mut m2, wait));
    assert_eq!(g1, vec![q(1, 7); c(1)], "slot 1");
    assert_eq!(g2, vec![q(2, 7); c(2)], "slot 2");
    assert!(drain(&mut m5, Duration::ZERO).is_empty());

    // A member that closes leaves its slot empty: its datagrams are dropped, not spread.
    drop(m2);
    assert!(emptied(&group, 2), "slot 2 emptied");
    for k in 0..20 {
        tx.send_to(&datagram(q(2, k), 0), addr).unwrap();
        tx.send_to(&datagram(q(1, k), 0), addr).unwrap();
    }
    assert_eq!(drain(&mut m1, wait).len(), 20);
    assert!(drain(&mut m5, Duration::ZERO).is_empty());
}

fn open_member(pair: &NetnsPair, group: &DemuxGroup, slot: u32) -> Device {
    let end = pair.end(Side::A);
    let ip: IpAddr = end.ipv4().into();
    let demux = Demux::new(group.try_clone().unwrap(), slot).unwrap();
    let cfg = DeviceConfig::udp(ip)
        .name(format!("member{slot}"))
        .demux(demux);
    end.netns()
        .enter_scoped(|| Device::open(cfg))
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("open member {slot} on {ip}: {e}"))
}

fn open_peer(pair: &NetnsPair) -> Device {
    let end = pair.end(Side::B);
    let cfg = DeviceConfig::udp(end.ipv4().into()).name("peer");
    end.netns()
        .enter_scoped(|| Device::open(cfg))
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("open peer: {e}"))
}

/// Waits until `dev`'s received-packet count stops moving; returns it.
fn settled_rx(devs: &[&Device]) -> Vec<u64> {
    let read = || -> Vec<u64> {
        devs.iter()
            .map(|d| d.device_counters().rx_packets)
            .collect()
    };
    let mut last = read();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = read();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[test]
fn two_demux_devices_share_one_address_over_veth() {
    let test = "two_demux_devices_share_one_address_over_veth";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let layout = group.layout();
    let pair = NetnsPair::create("demux-2").expect("namespaces");
    let (m1, m2) = (open_member(&pair, &group, 1), open_member(&pair, &group, 2));
    let peer = open_peer(&pair);
    assert_eq!(m1.local_addr(), m2.local_addr());
    // QPNs come from each member's range (random within it).
    for (dev, slot) in [(&m1, 1), (&m2, 2)] {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4).unwrap();
        let qps: Vec<_> = (0..8)
            .map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap())
            .collect();
        for qp in &qps {
            assert_eq!(
                layout.slot_of(qp.qpn().value()),
                slot,
                "{:#x}",
                qp.qpn().value()
            );
        }
    }

    let opts = SelftestOptions {
        sizes: vec![0, 1, 4097, 65_536, 1 << 20],
        iterations: 2,
        ud_sizes: vec![0, 64, 1024],
        timeout: Duration::from_secs(30),
        ack_timeout: 12, // ~16 ms: no loss here, only a loaded machine
    };
    std::thread::scope(|s| {
        let runs: Vec<_> = [&m1, &m2]
            .into_iter()
            .map(|m| {
                let (opts, peer) = (&opts, &peer);
                s.spawn(move || {
                    run_rc(m, peer, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} RC: {e}", m.name()));
                    run_rc(peer, m, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} RC (peer first): {e}", m.name()));
                    run_ud(m, peer, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} UD: {e}", m.name()));
                    run_ud(peer, m, opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("{} UD (peer first): {e}", m.name()));
                })
            })
            .collect();
        for r in runs {
            if r.join().is_err() {
                for d in [&m1, &m2, &peer] {
                    eprintln!("{}: {:?}", d.name(), d.device_counters());
                }
                panic!("a run failed (above)");
            }
        }
    });
    for m in [&m1, &m2] {
        let c = m.device_counters();
        assert_eq!(
            c.rx_drop_no_qp,
            0,
            "{}: the other's traffic: {c:?}",
            m.name()
        );
        assert_eq!(c.rx_icrc_errors, 0, "{}: {c:?}", m.name());
        assert!(c.rx_delivered > 100, "{}: {c:?}", m.name());
    }

    // Datagrams to a slot nobody holds reach nobody; to a member's slot, that member only.
    let before = settled_rx(&[&m1, &m2]);
    let dst = m1.local_addr();
    let tx = pair
        .b()
        .netns()
        .enter_scoped(|| UdpSocket::bind(SocketAddr::new(pair.b().ipv4().into(), 0)).unwrap())
        .unwrap();
    let q = |slot: u32, low: u32| layout.range(slot).unwrap().start() + low;
    for k in 0..50 {
        tx.send_to(&datagram(q(3, k), 0), dst).unwrap();
        tx.send_to(&datagram(q(200, k), 0), dst).unwrap();
        if k < 20 {
            tx.send_to(&datagram(q(1, 0xFFF0), 0), dst).unwrap();
        }
    }
    let after = settled_rx(&[&m1, &m2]);
    assert_eq!(after[0], before[0] + 20, "member 1 gets its 20 only");
    assert_eq!(after[1], before[1], "member 2 gets nothing");
    assert_eq!(m2.device_counters().rx_drop_no_qp, 0);
}

#[test]
fn closing_one_member_leaves_the_other_undisturbed() {
    let test = "closing_one_member_leaves_the_other_undisturbed";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let pair = NetnsPair::create("demux-close").expect("namespaces");
    let m1 = open_member(&pair, &group, 1);
    let m2 = open_member(&pair, &group, 2);
    let peer = open_peer(&pair);

    // An RC connection peer <-> member 1 that works, then member 1 goes away.
    let (pd1, pdp) = (m1.alloc_pd(), peer.alloc_pd());
    let (cq1, cqp) = (m1.create_cq(16).unwrap(), peer.create_cq(16).unwrap());
    let q1 = pd1.create_qp(&QpInit::new(QpType::Rc, &cq1)).unwrap();
    let qp = pdp.create_qp(&QpInit::new(QpType::Rc, &cqp)).unwrap();
    let o = ConnectOptions {
        timeout: 8, // ~1 ms
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    let remote = |qpn, gid| RemoteQp {
        qpn,
        psn: o.local_psn,
        gid,
    };
    q1.connect(&remote(qp.qpn(), peer.local_gid()), &o).unwrap();
    qp.connect(&remote(q1.qpn(), m1.local_gid()), &o).unwrap();
    let dst = pd1
        .register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let src = pdp.register(vec![0x5A; 4096], Access::LOCAL_WRITE).unwrap();
    let (dst_addr, dst_rkey) = (dst.addr(), dst.rkey());
    let write = |id| {
        let op = SendOp::RdmaWrite {
            remote_addr: dst_addr,
            rkey: dst_rkey,
        };
        qp.post_send(SendWr::new(id, op, vec![src.sge(0, 4096)]))
            .unwrap();
    };
    write(1);
    let mut wc = [Completion::EMPTY; 1];
    assert_eq!(cqp.wait(&mut wc, Duration::from_secs(5)), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), vec![0x5A; 4096]);

    let opts = SelftestOptions {
        sizes: vec![1 << 20],
        iterations: 6,
        ud_sizes: vec![],
        timeout: Duration::from_secs(30),
        ack_timeout: 12, // ~16 ms: no loss here, only a loaded machine
    };
    let started = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let (m2, peer, opts, flag) = (&m2, &peer, &opts, started.clone());
        let run = s.spawn(move || {
            flag.store(true, Ordering::SeqCst);
            run_rc(m2, peer, opts, &mut |_| {})
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(100));
        // Member 1 closes mid-transfer; its slot empties.
        drop((q1, cq1, dst, pd1, m1));
        assert!(emptied(&group, 1), "slot 1 emptied");
        assert!(group.occupant(2).unwrap().is_some());
        // Its peer keeps sending into the empty slot until its retries run out.
        write(2);
        assert_eq!(cqp.wait(&mut wc, Duration::from_secs(10)), 1);
        assert_eq!(wc[0].status, WcStatus::RetryExcErr);
        run.join()
            .unwrap()
            .unwrap_or_else(|e| panic!("member 2's transfer: {e}"));
    });
    let c = m2.device_counters();
    assert_eq!(c.rx_drop_no_qp, 0, "member 2 saw member 1's traffic: {c:?}");
    assert_eq!(c.rx_icrc_errors, 0, "{c:?}");
}

#[test]
fn another_users_group_is_refused_clearly() {
    let test = "another_users_group_is_refused_clearly";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let ns = TempNetns::create("demux-uid").expect("namespace");
    let addr: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    let (other, result) = ns
        .netns()
        .enter_scoped(|| {
            // A socket owned by uid 65534 (the owner is the creating thread's fsuid) takes
            // the address with SO_REUSEPORT, as another user's member would.
            #[allow(unsafe_code)]
            // SAFETY: setfsuid changes only this thread's filesystem uid (no glibc broadcast);
            // it is set back before anything else runs on the thread.
            let old = unsafe { libc::setfsuid(65534) };
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None);
            #[allow(unsafe_code)]
            // SAFETY: as above.
            unsafe {
                libc::setfsuid(old as libc::uid_t);
            }
            let s = s.unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            let d = Demux::new(group.try_clone().unwrap(), 1).unwrap();
            let cfg = DeviceConfig::udp(addr.ip()).demux(d);
            (s, Device::open(cfg).map(|_| ()))
        })
        .unwrap();
    let err = result.expect_err("a group of uid 65534 must refuse us");
    let text = err.to_string();
    assert!(matches!(err, OpenError::Backend { .. }), "{err:?}");
    assert!(
        text.contains("belong to uid 65534") && text.contains("one user"),
        "{text}"
    );
    drop(other);
}

#[test]
fn ipv6_members_get_only_their_slots() {
    let test = "ipv6_members_get_only_their_slots";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let layout = group.layout();
    let ns = TempNetns::create("demux-v6").expect("namespace");
    let addr: SocketAddr = "[::1]:4791".parse().unwrap();
    let member = |slot: u32| {
        let d = Demux::new(group.try_clone().unwrap(), slot).unwrap();
        UdpDatapath::bind_demux(addr, UdpOptions::default(), &d)
            .unwrap_or_else(|e| panic!("join slot {slot} on {addr}: {e}"))
    };
    let (mut m7, mut m9, tx) = ns
        .netns()
        .enter_scoped(|| (member(7), member(9), UdpSocket::bind("[::1]:0").unwrap()))
        .unwrap();
    let q = |slot: u32, low: u32| layout.range(slot).unwrap().start() + low;
    for k in 0..30 {
        for slot in [7, 9, 8] {
            tx.send_to(&datagram(q(slot, k), 0), addr).unwrap();
        }
    }
    let wait = Duration::from_millis(50);
    for (m, slot) in [(&mut m7, 7), (&mut m9, 9)] {
        let got = drain(m, wait);
        assert_eq!(got.len(), 30, "slot {slot}: {got:x?}");
        assert!(got.iter().all(|&x| layout.slot_of(x) == slot), "{got:x?}");
    }
}

/// A BPF filesystem mounted on a temporary directory, unmounted on drop.
struct BpfFs(std::path::PathBuf);

impl BpfFs {
    fn mount(tag: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("roce-bpffs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let target = c(dir.to_str().unwrap());
        let (src, fs) = (c("bpf"), c("bpf"));
        #[allow(unsafe_code)]
        // SAFETY: NUL-terminated strings that live through the call; no mount data.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(dir))
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a NUL-terminated path that lives through the call.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A restarted daemon gets the same group back from the BPF filesystem: the member admitted
/// before keeps its slot, the one admitted after joins the same map, and both are steered.
#[test]
fn a_pinned_group_outlives_its_creator() {
    let test = "a_pinned_group_outlives_its_creator";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let layout = group.layout();
    let fs = match BpfFs::mount("pin") {
        Ok(fs) => fs,
        Err(e) => return skip(test, format!("cannot mount a BPF filesystem: {e}")),
    };
    group.pin(&fs.0).expect("pin");
    let id = group.map_id().unwrap();
    let ns = TempNetns::create("demux-pin").expect("namespace");
    let addr: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    let join = |g: &DemuxGroup, slot: u32| {
        let d = Demux::new(g.try_clone().unwrap(), slot).unwrap();
        ns.netns()
            .enter_scoped(|| UdpDatapath::bind_demux(addr, UdpOptions::default(), &d))
            .unwrap()
            .unwrap_or_else(|e| panic!("join slot {slot}: {e}"))
    };
    let mut m1 = join(&group, 1);
    drop(group); // the daemon exits
    let again = DemuxGroup::open_pinned(&fs.0, layout).expect("open the pinned group");
    assert_eq!(again.map_id().unwrap(), id);
    assert!(
        again.occupant(1).unwrap().is_some(),
        "the old member's slot"
    );
    let mut m2 = join(&again, 2);
    let wrong = DemuxGroup::open_pinned(&fs.0, SlotLayout::new(12).unwrap());
    assert!(
        matches!(wrong, Err(DemuxError::BadDescriptor { what: "map", .. })),
        "{wrong:?}"
    );
    let tx = ns
        .netns()
        .enter_scoped(|| UdpSocket::bind("127.0.0.2:0").unwrap())
        .unwrap();
    let q = |slot: u32, low: u32| layout.range(slot).unwrap().start() + low;
    for k in 0..25 {
        tx.send_to(&datagram(q(1, k), 0), addr).unwrap();
        tx.send_to(&datagram(q(2, k), 0), addr).unwrap();
    }
    let wait = Duration::from_millis(50);
    let (g1, g2) = (drain(&mut m1, wait), drain(&mut m2, Duration::ZERO));
    assert!(
        g1.len() == 25 && g1.iter().all(|&x| layout.slot_of(x) == 1),
        "{g1:x?}"
    );
    assert!(
        g2.len() == 25 && g2.iter().all(|&x| layout.slot_of(x) == 2),
        "{g2:x?}"
    );
}

/// The example `demux_member` next to this test binary (`cargo test` builds examples).
fn member_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples/demux_member");
    path.exists().then_some(path)
}

/// A descriptor without close-on-exec, for a child to inherit; closed on drop.
struct Inherited(RawFd);

impl Inherited {
    fn dup(fd: std::os::fd::BorrowedFd<'_>) -> Self {
        #[allow(unsafe_code)]
        // SAFETY: dup of a live descriptor; the new one (no FD_CLOEXEC) is owned by Self.
        let n = unsafe { libc::dup(fd.as_raw_fd()) };
        assert!(n >= 0, "dup: {}", std::io::Error::last_os_error());
        Self(n)
    }
}

impl Drop for Inherited {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: closes the descriptor this value owns.
        unsafe {
            libc::close(self.0);
        }
    }
}

/// Kills the child if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A member in another process serves one-sided WRITE and READ (data checked), then is
/// killed with SIGKILL while the peer writes into it and an in-process member is
/// mid-transfer: the kernel empties its slot (time printed), the peer's writes into it fail
/// with retries exhausted, and the other member's transfer completes with its data checked,
/// having seen none of the dead member's traffic.
#[test]
fn a_killed_member_process_leaves_the_other_undisturbed() {
    let test = "a_killed_member_process_leaves_the_other_undisturbed";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let Some(bin) = member_binary() else {
        return skip(
            test,
            "the demux_member example is not built (`cargo test` builds it; with --test, run \
             `cargo build --release -p roce-transport --example demux_member` first)",
        );
    };
    let pair = NetnsPair::create("demux-kill").expect("namespaces");
    let m2 = open_member(&pair, &group, 2);
    let peer = open_peer(&pair);
    let (map, prog) = (
        Inherited::dup(group.map_fd()),
        Inherited::dup(group.prog_fd()),
    );
    let child = std::process::Command::new(bin)
        .args([
            pair.a().ns_name(),
            &pair.a().ipv4().to_string(),
            &pair.b().ipv4().to_string(),
            "1",
            &map.0.to_string(),
            &prog.0.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn demux_member");
    drop((map, prog));
    let mut child = KillOnDrop(child);
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let field = |name: &str| {
        let v = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=0x")))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"));
        u64::from_str_radix(v, 16).unwrap()
    };
    let (cqpn, caddr, crkey) = (field("qpn") as u32, field("addr"), field("rkey") as u32);
    assert_eq!(group.layout().slot_of(cqpn), 1, "{line}");
    assert!(group.occupant(1).unwrap().is_some());

    let pdp = peer.alloc_pd();
    let cqp = peer.create_cq(64).unwrap();
    let qp = pdp.create_qp(&QpInit::new(QpType::Rc, &cqp)).unwrap();
    let o = ConnectOptions {
        timeout: 10, // ~4 ms
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    qp.connect(
        &RemoteQp {
            qpn: roce_transport::Qpn::new(cqpn),
            psn: o.local_psn,
            gid: m2.local_gid(),
        },
        &o,
    )
    .unwrap();
    let stdin = child.0.stdin.as_mut().unwrap();
    std::io::Write::write_all(stdin, format!("{:#x}\n", qp.qpn().value()).as_bytes()).unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "connected");

    // One-sided service by the other process: WRITE a pattern, READ it back.
    let want = roce_transport::selftest::pattern(64 * 1024, 7);
    let src = pdp.register(want.clone(), Access::LOCAL_WRITE).unwrap();
    let back = pdp
        .register(vec![0u8; 64 * 1024], Access::LOCAL_WRITE)
        .unwrap();
    let rkey = roce_transport::RKey::new(crkey);
    let mut wc = [Completion::EMPTY; 1];
    let post = |id, op| {
        let sge = if id == 2 {
            back.sge(0, 64 * 1024)
        } else {
            src.sge(0, 64 * 1024)
        };
        qp.post_send(SendWr::new(id, op, vec![sge])).unwrap();
    };
    post(
        1,
        SendOp::RdmaWrite {
            remote_addr: caddr,
            rkey,
        },
    );
    assert_eq!(cqp.wait(&mut wc, Duration::from_secs(10)), 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    post(
        2,
        SendOp::RdmaRead {
            remote_addr: caddr,
            rkey,
        },
    );
    assert_eq!(cqp.wait(&mut wc, Duration::from_secs(10)), 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    assert!(back.to_vec() == want, "READ back what was written");

    let opts = SelftestOptions {
        sizes: vec![1 << 20],
        iterations: 6,
        ud_sizes: vec![],
        timeout: Duration::from_secs(30),
        ack_timeout: 12,
    };
    std::thread::scope(|s| {
        let (m2, peer, opts) = (&m2, &peer, &opts);
        let run = s.spawn(move || run_rc(m2, peer, opts, &mut |_| {}));
        std::thread::sleep(Duration::from_millis(100));
        // WRITEs stream into the child while it is killed.
        for id in 10..18 {
            post(
                id,
                SendOp::RdmaWrite {
                    remote_addr: caddr,
                    rkey,
                },
            );
        }
        let killed = Instant::now();
        #[allow(unsafe_code)]
        // SAFETY: signals our own child, which has not been reaped (KillOnDrop waits later).
        let r = unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(r, 0);
        while group.occupant(1).unwrap().is_some() {
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "slot 1 never emptied"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        eprintln!(
            "{test}: slot 1 emptied {:.1} ms after SIGKILL",
            killed.elapsed().as_secs_f64() * 1e3
        );
        // A WRITE posted now surely meets the empty slot.
        post(
            18,
            SendOp::RdmaWrite {
                remote_addr: caddr,
                rkey,
            },
        );
        // The peer's QP to the dead member ends in retries exhausted (the WRITEs before the
        // kill may have completed).
        let mut last = WcStatus::Success;
        let mut n = 0;
        while n < 9 {
            let got = cqp.wait(&mut wc, Duration::from_secs(10));
            assert_eq!(got, 1, "peer completions after the kill");
            n += 1;
            last = wc[0].status;
            if last != WcStatus::Success {
                break;
            }
        }
        assert_eq!(last, WcStatus::RetryExcErr, "{:?}", wc[0]);
        run.join()
            .unwrap()
            .unwrap_or_else(|e| panic!("member 2's transfer: {e}"));
    });
    let c = m2.device_counters();
    assert_eq!(
        c.rx_drop_no_qp, 0,
        "member 2 saw the dead member's traffic: {c:?}"
    );
    assert_eq!(c.rx_icrc_errors, 0, "{c:?}");
}

/// The daemon's handles on the group (map and program descriptors) go away mid-stream, as
/// when it exits or restarts: both members' transfers complete with their data checked and
/// no failed work request, and each still gets only its own traffic.
#[test]
fn the_daemon_exiting_mid_stream_disturbs_no_member() {
    let test = "the_daemon_exiting_mid_stream_disturbs_no_member";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let pair = NetnsPair::create("demux-restart").expect("namespaces");
    let (m1, m2) = (open_member(&pair, &group, 1), open_member(&pair, &group, 2));
    let peer = open_peer(&pair);
    let opts = SelftestOptions {
        sizes: vec![4097, 1 << 20],
        iterations: 4,
        ud_sizes: vec![],
        timeout: Duration::from_secs(30),
        ack_timeout: 12,
    };
    let started = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let runs: Vec<_> = [&m1, &m2]
            .into_iter()
            .map(|m| {
                let (opts, peer, flag) = (&opts, &peer, started.clone());
                s.spawn(move || {
                    flag.store(true, Ordering::SeqCst);
                    run_rc(m, peer, opts, &mut |_| {})
                })
            })
            .collect();
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(50));
        drop(group); // the daemon's last descriptors
        for (r, m) in runs.into_iter().zip([&m1, &m2]) {
            r.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{} after the daemon left: {e}", m.name()));
        }
    });
    // And afterwards, surely without the daemon: steering goes on.
    let small = SelftestOptions {
        sizes: vec![0, 64, 65_536],
        iterations: 2,
        ..opts
    };
    for m in [&m1, &m2] {
        run_rc(m, &peer, &small, &mut |_| {})
            .unwrap_or_else(|e| panic!("{} without the daemon: {e}", m.name()));
    }
    for m in [&m1, &m2] {
        let c = m.device_counters();
        assert_eq!(c.rx_drop_no_qp, 0, "{}: {c:?}", m.name());
        assert_eq!(c.rx_icrc_errors, 0, "{}: {c:?}", m.name());
    }
}

/// Off loopback a member leaves `UDP_GRO` off (NAPI GRO would merge by ports before the
/// program picks the owner; see `demux.rs`), whatever the options ask.
#[test]
fn a_member_off_loopback_keeps_gro_off() {
    let test = "a_member_off_loopback_keeps_gro_off";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let ns = TempNetns::create("demux-gro").expect("namespace");
    for args in [
        &["link", "add", "d0", "type", "veth", "peer", "name", "d1"][..],
        &["addr", "add", "10.77.9.1/24", "dev", "d0"],
        &["link", "set", "d0", "up"],
        &["link", "set", "d1", "up"],
    ] {
        let ok = std::process::Command::new("ip")
            .args(["-n", ns.name()])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?}");
    }
    let addr: SocketAddr = "10.77.9.1:4791".parse().unwrap();
    let opts = UdpOptions {
        gro: true,
        ..UdpOptions::default()
    };
    let m = ns
        .netns()
        .enter_scoped(|| {
            let d = Demux::new(group.try_clone().unwrap(), 1).unwrap();
            UdpDatapath::bind_demux(addr, opts, &d).unwrap()
        })
        .unwrap();
    assert_eq!(m.caps().gro_segments, 1, "GRO stays off off loopback");
}

/// Off loopback a member opened with the relay (`relay::open`, what a device in kernel demux
/// does) has `UDP_GRO`; when NAPI GRO on the veth (turned on with ethtool, as a NIC's is)
/// merges a peer's datagrams to two members' QPs into one buffer, every datagram still
/// reaches its own member and only it: the receiver hands the others on through the relay.
#[test]
fn gro_merged_datagrams_reach_their_own_member_through_the_relay() {
    use roce_transport::datapath::relay::{self, RelayDatapath};
    let test = "gro_merged_datagrams_reach_their_own_member_through_the_relay";
    if !netns_or_skip(test) {
        return;
    }
    let Some(group) = group_or_skip(test) else {
        return;
    };
    let pair = NetnsPair::create("relay").expect("veth pair");
    // Make the members' veth end receive as a NIC does: NAPI with GRO (veth takes the NAPI
    // path only for a sender without TSO), polled by its own thread so that datagrams queue
    // up between polls and GRO has runs to merge.
    for (end, cmd) in [
        (
            pair.b(),
            format!("ethtool -K {} tso off", pair.b().ifname()),
        ),
        (pair.a(), format!("ethtool -K {} gro on", pair.a().ifname())),
        (
            pair.a(),
            format!("echo 1 > /sys/class/net/{}/threaded", pair.a().ifname()),
        ),
    ] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", end.ns_name(), "sh", "-c", &cmd])
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    let addr = SocketAddr::new(IpAddr::V4(pair.a().ipv4()), 4791);
    let opts = UdpOptions {
        gro: true,
        ..UdpOptions::default()
    };
    let mut members: Vec<RelayDatapath> = [1u32, 2]
        .iter()
        .map(|&slot| {
            pair.a()
                .netns()
                .enter_scoped(|| {
                    let d = Demux::new(group.try_clone().unwrap(), slot).unwrap();
                    relay::open(addr, opts, &d).expect("open a relay member")
                })
                .unwrap()
        })
        .collect();
    for m in &members {
        assert_eq!(m.caps().gro_segments, 64, "a relay member has UDP_GRO");
        assert!(m.relay_path().exists(), "{}", m.relay_path().display());
    }
    let qpn = |slot: u32| (slot << 16) | 0x42;
    // The peer: one socket on port 4791 (as a peer whose processes share one address), runs
    // of 8 datagrams to each member in turn, each tagged with its index, in bursts of 32
    // that the members drain before the next (a burst fits the veth's ring of 256, so
    // nothing is lost before the sockets, whatever the load).
    const N: u32 = 4096;
    const BURST: u32 = 32;
    let peer = pair
        .b()
        .netns()
        .enter_scoped(|| UdpSocket::bind(SocketAddr::new(IpAddr::V4(pair.b().ipv4()), 4791)))
        .unwrap()
        .unwrap();
    let mut got: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    let mut bufs = vec![vec![0u8; 65_536]; 16];
    let mut meta = [RxMeta::empty(); 16];
    let mut d = [0u8; 1024];
    d[0] = 0x04;
    d[1] = 0x40;
    for first in (0..N).step_by(BURST as usize) {
        for i in first..first + BURST {
            let slot = 1 + (i / 8) % 2;
            d[5..8].copy_from_slice(&qpn(slot).to_be_bytes()[1..]);
            d[12..16].copy_from_slice(&i.to_be_bytes());
            peer.send_to(&d, addr).expect("send");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while got[0].len() + got[1].len() < (first + BURST) as usize {
            assert!(
                Instant::now() < deadline,
                "burst at {first}: {} of {} received",
                got[0].len() + got[1].len(),
                first + BURST
            );
            let mut idle = true;
            for (k, m) in members.iter_mut().enumerate() {
                let mut io: Vec<IoSliceMut<'_>> =
                    bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                match m.recv(&mut io, &mut meta) {
                    Ok(n) => {
                        idle = false;
                        for (mt, b) in meta[..n].iter().zip(&bufs) {
                            assert_eq!(mt.src, SocketAddr::new(IpAddr::V4(pair.b().ipv4()), 4791));
                            for d in b[..mt.len].chunks(mt.stride) {
                                let q = u32::from_be_bytes([0, d[5], d[6], d[7]]);
                                assert_eq!(q, qpn(k as u32 + 1), "member {} got another's", k + 1);
                                got[k].push(u32::from_be_bytes([d[12], d[13], d[14], d[15]]));
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("recv: {e}"),
                }
            }
            if idle {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    let stats: Vec<_> = members.iter().map(RelayDatapath::relay_stats).collect();
    eprintln!("{test}: relay stats {stats:?}");
    for (k, g) in got.iter_mut().enumerate() {
        g.sort_unstable();
        let want: Vec<u32> = (0..N).filter(|i| 1 + (i / 8) % 2 == k as u32 + 1).collect();
        assert_eq!(
            *g,
            want,
            "member {} got exactly its own datagrams, once",
            k + 1
        );
    }
    for s in &stats {
        assert_eq!(
            (s.no_member, s.member_full, s.malformed),
            (0, 0, 0),
            "{s:?}"
        );
    }
    let handed: u64 = stats.iter().map(|s| s.handed_on).sum();
    let taken: u64 = stats.iter().map(|s| s.taken_in).sum();
    assert!(
        handed > 0,
        "NAPI GRO merged no datagrams of two members: the case was not exercised ({stats:?})"
    );
    assert_eq!(handed, taken, "everything handed on was taken in");
    let paths: Vec<_> = members.iter().map(|m| m.relay_path().to_owned()).collect();
    drop(members);
    for p in paths {
        assert!(!p.exists(), "{} removed on close", p.display());
    }
}
