//! Issue 12 item 3: rkeys, initial PSNs and QPNs are unpredictable unless a test asks for a
//! seed (off-path injection needs all three; ReDMArk, USENIX Security 2021).

use std::collections::HashSet;

use roce_transport::{Access, Device, DeviceConfig, Progress, QpInit, QpType, SimNetwork};

/// What an attacker would want to guess: the first rkeys, initial PSNs and QPNs of a device.
#[derive(Debug, PartialEq, Eq)]
struct Numbers {
    rkeys: Vec<u32>,
    psns: Vec<u32>,
    qpns: Vec<u32>,
}

fn numbers(seed: Option<u64>) -> Numbers {
    let net = SimNetwork::perfect();
    let mut cfg = DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap()).progress(Progress::Manual);
    if let Some(s) = seed {
        cfg = cfg.seed(s);
    }
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4).unwrap();
    let mrs: Vec<_> = (0..4)
        .map(|_| pd.register(vec![0u8; 64], Access::REMOTE_WRITE | Access::LOCAL_WRITE))
        .collect::<Result<_, _>>()
        .unwrap();
    let qps: Vec<_> = (0..4)
        .map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq)))
        .collect::<Result<_, _>>()
        .unwrap();
    Numbers {
        rkeys: mrs.iter().map(|m| m.rkey().value()).collect(),
        psns: (0..4).map(|_| dev.random_psn()).collect(),
        qpns: qps.iter().map(|q| q.qpn().value()).collect(),
    }
}

#[test]
fn two_unseeded_devices_differ() {
    let (a, b) = (numbers(None), numbers(None));
    // rkeys: the 8-bit key part is random (the 24-bit index is the table slot); four keys
    // all equal by chance: 2^-32.
    assert_ne!(a.rkeys, b.rkeys, "{a:x?} {b:x?}");
    assert_ne!(a.psns, b.psns, "{a:x?} {b:x?}");
    assert_ne!(a.qpns, b.qpns, "{a:x?} {b:x?}");
    // No longer the old constants (QPNs 0x11, 0x12, ...).
    assert_ne!(a.qpns, [0x11, 0x12, 0x13, 0x14]);
    for q in a.qpns.iter().chain(&b.qpns) {
        assert!((0x10..=0xFF_FFFE).contains(q), "{q:#x}");
    }
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    assert_eq!(numbers(Some(42)), numbers(Some(42)));
    assert_ne!(numbers(Some(42)), numbers(Some(43)));
}

#[test]
fn qpns_stay_unique_under_create_and_destroy() {
    let net = SimNetwork::perfect();
    let cfg = DeviceConfig::sim(&net, "10.9.0.2".parse().unwrap()).progress(Progress::Manual);
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4).unwrap();
    let mut live = Vec::new();
    let mut recently_freed = Vec::new();
    for round in 0..3_000usize {
        if live.len() < 64 || round % 2 == 0 {
            let qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq)).unwrap();
            let q = qp.qpn().value();
            assert!(live
                .iter()
                .all(|l: &roce_transport::QueuePair| l.qpn().value() != q));
            assert!(
                !recently_freed.contains(&q),
                "{q:#x} reused right after its QP died"
            );
            live.push(qp);
        } else {
            let qp = live.swap_remove(round * 7 % live.len());
            recently_freed.push(qp.qpn().value());
            drop(qp);
        }
    }
    let qpns: HashSet<u32> = live.iter().map(|q| q.qpn().value()).collect();
    assert_eq!(qpns.len(), live.len());
}
