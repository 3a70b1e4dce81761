//! `FaultInjector` over the real `udp` backend on loopback: seeded loss and reordering without
//! root or nftables, and RC still delivers every message exactly once, in order, with its
//! bytes.
//!
//! The devices live in a private network namespace of the test thread (so 127.0.0.x:4791 does
//! not collide with other programs); without the privilege for one, the test says so loudly
//! and uses the host's namespace.

use std::process::Command;
use std::time::{Duration, Instant};

use roce_transport::datapath::fault::{FaultInjector, SharedFaults};
use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
use roce_transport::{
    Access, Backend, Completion, ConnectOptions, Device, DeviceConfig, LinkConfig, QpInit, QpType,
    RecvWr, RemoteQp, SendOp, SendWr, WcOpcode, WcStatus,
};

/// Moves the calling thread into a new network namespace with `lo` up.
fn private_net() {
    #[allow(unsafe_code)]
    // SAFETY: unshare takes no pointers; CLONE_NEWNET moves only the calling thread (and the
    // threads and processes it creates afterwards).
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    if r != 0 {
        eprintln!(
            "!!! cannot unshare the network namespace ({}); using the host's 127.0.0.1/2:4791",
            std::io::Error::last_os_error()
        );
        return;
    }
    // A child forked from this thread runs in its namespace.
    let st = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("running ip");
    assert!(st.success(), "ip link set lo up: {st}");
}

fn lossy_udp(ip: &str, name: &str, link: LinkConfig, seed: u64) -> (Device, SharedFaults) {
    let udp = UdpDatapath::bind(format!("{ip}:4791").parse().unwrap(), UdpOptions::default())
        .unwrap_or_else(|e| panic!("bind {ip}: {e}"));
    let inj = FaultInjector::new(udp, link, seed);
    let faults = inj.faults().clone();
    let dev = Device::open(DeviceConfig::new(Backend::Custom(Box::new(inj))).name(name))
        .unwrap_or_else(|e| panic!("open {ip}: {e}"));
    assert_eq!(dev.query_device().backend, "udp");
    (dev, faults)
}

fn wait_one(cq: &roce_transport::CompletionQueue, what: &str) -> Completion {
    let mut wc = [Completion::EMPTY];
    assert_eq!(
        cq.wait(&mut wc, Duration::from_secs(30)),
        1,
        "no completion for {what}"
    );
    wc[0]
}

#[test]
fn rc_over_udp_with_injected_loss_and_reordering_delivers_exactly_once_in_order() {
    private_net();
    let link = LinkConfig {
        loss: 0.1,
        reorder: 0.1,
        reorder_delay_ns: 300_000,
        delay_ns: 0,
        ..LinkConfig::perfect()
    };
    let (a, fa) = lossy_udp("127.0.0.1", "fi-a", link, 11);
    let (b, fb) = lossy_udp("127.0.0.2", "fi-b", link, 12);
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let (cq_a, cq_b) = (a.create_cq(4096).unwrap(), b.create_cq(4096).unwrap());
    let qp_a = pd_a.create_qp(&QpInit::new(QpType::Rc, &cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&QpInit::new(QpType::Rc, &cq_b)).unwrap();
    let opts = ConnectOptions {
        // 4.096 us x 2^10 = 4 ms ACK timeout: retransmissions come quickly.
        timeout: 10,
        ..ConnectOptions::default()
    };
    let ra = RemoteQp {
        qpn: qp_a.qpn(),
        psn: opts.local_psn,
        gid: a.local_gid(),
    };
    let rb = RemoteQp {
        qpn: qp_b.qpn(),
        psn: opts.local_psn,
        gid: b.local_gid(),
    };
    qp_a.connect(&rb, &opts).unwrap();
    qp_b.connect(&ra, &opts).unwrap();

    // Messages of 1 to 3 packets (path MTU 4096 on lo: sizes up to 3 x 4096), each byte
    // telling which message it belongs to.
    const N: usize = 300;
    const SLOT: usize = 12_288;
    let size = |i: usize| 1 + (i * 7_919) % SLOT;
    let mut src = vec![0u8; N * SLOT];
    for i in 0..N {
        for (k, byte) in src[i * SLOT..i * SLOT + size(i)].iter_mut().enumerate() {
            *byte = (i as u8) ^ (k as u8).rotate_left(3);
        }
    }
    let src_mr = pd_a.register(src.clone(), Access::LOCAL_WRITE).unwrap();
    let dst_mr = pd_b.register_zeroed(N * SLOT, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        qp_b.post_recv(RecvWr {
            wr_id: i as u64,
            sges: vec![dst_mr.sge(i * SLOT, SLOT)],
        })
        .unwrap();
    }
    let started = Instant::now();
    for i in 0..N {
        let wr = SendWr::new(i as u64, SendOp::Send, vec![src_mr.sge(i * SLOT, size(i))]);
        qp_a.post_send(wr).unwrap();
    }
    for i in 0..N {
        let c = wait_one(&cq_b, "a receive");
        assert_eq!(c.status, WcStatus::Success, "receive {i}: {c:?}");
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(c.wr_id, i as u64, "receives complete once, in order");
        assert_eq!(c.byte_len as usize, size(i), "receive {i}");
    }
    for i in 0..N {
        let c = wait_one(&cq_a, "a send");
        assert_eq!(c.status, WcStatus::Success, "send {i}: {c:?}");
        assert_eq!(c.wr_id, i as u64, "sends complete once, in order");
    }
    // Nothing more: no message was delivered twice.
    std::thread::sleep(Duration::from_millis(50));
    assert!(cq_b.poll_one().is_none(), "an extra receive completion");
    assert!(cq_a.poll_one().is_none(), "an extra send completion");
    let got = dst_mr.to_vec();
    for i in 0..N {
        let (lo, n) = (i * SLOT, size(i));
        assert_eq!(got[lo..lo + n], src[lo..lo + n], "bytes of message {i}");
        assert!(
            got[lo + n..lo + SLOT].iter().all(|&x| x == 0),
            "message {i} overran"
        );
    }

    // The faults really happened, and RC repaired them.
    let (sa, sb) = (fa.stats(), fb.stats());
    eprintln!(
        "{N} messages in {:?}; a->b faults {sa:?}; b->a faults {sb:?}; a {:?}",
        started.elapsed(),
        a.counters()
    );
    assert!(sa.lost > 0 && sb.lost > 0, "{sa:?} {sb:?}");
    assert!(sa.reordered > 0 && sb.reordered > 0, "{sa:?} {sb:?}");
    let loss_pct = sa.lost * 100 / sa.offered;
    assert!((5..=15).contains(&loss_pct), "about 10% lost: {sa:?}");
    assert!(a.counters().retransmitted_pkts > 0);
    assert_eq!(a.counters().icrc_errors + b.counters().icrc_errors, 0);
}
