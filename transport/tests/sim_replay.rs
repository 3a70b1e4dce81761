//! A lossy transport scenario on the `sim` backend replays exactly from its seed.
//!
//! Two devices driven by the test thread ([`Progress::Manual`]) on one [`VirtualClock`], over
//! a network that loses (independently and in bursts), duplicates, reorders, corrupts and
//! delays. Every frame either device sends or receives is captured; run twice from one seed,
//! the captures and the completions (with their virtual times) must be identical. A failing
//! case prints the seed; `ROCECTL_REPLAY_SEED=<seed>` runs just that one, and
//! `ROCECTL_REPLAY_PCAP=<file>` keeps its capture (`rocectl pcap dump <file>`).

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use roce_transport::clock::{Clock, VirtualClock};
use roce_transport::{
    Access, CaptureFile, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig,
    LinkConfig, Progress, Psn, QpInit, QpType, RecvWr, RemoteQp, SendOp, SendWr, SimNetwork,
    SimStats, WcStatus,
};

/// What a run produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Every captured frame, in capture order.
    frames: Vec<Vec<u8>>,
    /// `(virtual ns, device, wr_id, status, opcode, byte_len)` in the order they were polled.
    completions: Vec<(u64, char, u64, WcStatus, String, u32)>,
    /// The bytes the receiver ended with.
    received: Vec<u8>,
    /// The bytes READ back.
    read_back: Vec<u8>,
    net: SimStats,
}

const SENDS: usize = 24;
const SLOT: usize = 9_000;

fn link() -> LinkConfig {
    LinkConfig {
        loss: 0.04,
        burst_start: 0.005,
        burst_end: 0.3,
        // Bursts end within 100 us of virtual time (under half an ACK timeout): a burst is a
        // spell of congestion, not a number of datagrams; see the seed test below.
        burst_max_ns: 100_000,
        duplicate: 0.03,
        reorder: 0.05,
        reorder_delay_ns: 40_000,
        corrupt: 0.03,
        delay_ns: 2_000,
        jitter_ns: 1_000,
    }
}

fn poll_all(cq: &CompletionQueue, who: char, now: u64, out: &mut Outcome, done: &mut usize) {
    let mut wc = [Completion::EMPTY; 16];
    loop {
        let n = cq.poll(&mut wc);
        for c in &wc[..n] {
            out.completions.push((
                now,
                who,
                c.wr_id,
                c.status,
                format!("{:?}", c.opcode),
                c.byte_len,
            ));
            *done += 1;
        }
        if n == 0 {
            return;
        }
    }
}

/// Runs the scenario from `seed`, capturing into `pcap`.
fn run(seed: u64, pcap: &Path) -> Outcome {
    let clock = VirtualClock::new();
    let net = SimNetwork::with_clock(link(), seed, Arc::new(clock.clone()));
    let capture = CaptureFile::create(pcap).unwrap();
    let open = |ip: &str, name: &str| {
        Device::open(
            DeviceConfig::sim(&net, ip.parse().unwrap())
                .name(name)
                .progress(Progress::Manual)
                .seed(seed)
                .capture(&capture),
        )
        .unwrap()
    };
    let (a, b) = (open("10.7.0.1", "replay-a"), open("10.7.0.2", "replay-b"));
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let (cq_a, cq_b) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qp_a = pd_a.create_qp(&QpInit::new(QpType::Rc, &cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&QpInit::new(QpType::Rc, &cq_b)).unwrap();
    let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
    let opts = |psn: u32| ConnectOptions {
        local_psn: Psn::new(psn),
        // 4.096 us x 2^6 = 262 us of virtual time per ACK timeout.
        timeout: 6,
        ..ConnectOptions::default()
    };
    qp_a.connect(
        &RemoteQp {
            qpn: qp_b.qpn(),
            psn: Psn::new(psn_b),
            gid: b.local_gid(),
        },
        &opts(psn_a),
    )
    .unwrap();
    qp_b.connect(
        &RemoteQp {
            qpn: qp_a.qpn(),
            psn: Psn::new(psn_a),
            gid: a.local_gid(),
        },
        &opts(psn_b),
    )
    .unwrap();

    let size = |i: usize| (i * 3_797 + (seed as usize % 1_000)) % SLOT;
    let src: Vec<u8> = (0..SENDS * SLOT)
        .map(|k| (k as u8).wrapping_mul(31) ^ (seed as u8))
        .collect();
    let src_mr = pd_a.register(src.clone(), Access::LOCAL_WRITE).unwrap();
    let dst_mr = pd_b
        .register_zeroed(
            SENDS * SLOT,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    let back_mr = pd_a.register_zeroed(40_000, Access::LOCAL_WRITE).unwrap();
    for i in 0..SENDS {
        qp_b.post_recv(RecvWr {
            wr_id: 1_000 + i as u64,
            sges: vec![dst_mr.sge(i * SLOT, SLOT)],
        })
        .unwrap();
    }
    for i in 0..SENDS {
        let wr = SendWr::new(i as u64, SendOp::Send, vec![src_mr.sge(i * SLOT, size(i))]);
        qp_a.post_send(wr).unwrap();
    }
    // An RDMA WRITE over the first half of B's region, then a READ of it back.
    let write = SendOp::RdmaWrite {
        remote_addr: dst_mr.addr(),
        rkey: dst_mr.rkey(),
    };
    qp_a.post_send(SendWr::new(100, write, vec![src_mr.sge(0, 40_000)]))
        .unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: dst_mr.addr(),
        rkey: dst_mr.rkey(),
    };
    qp_a.post_send(SendWr::new(101, read, vec![back_mr.sge(0, 40_000)]))
        .unwrap();

    let mut out = Outcome {
        frames: Vec::new(),
        completions: Vec::new(),
        received: Vec::new(),
        read_back: Vec::new(),
        net: SimStats::default(),
    };
    let expected = 2 * SENDS + 2;
    let mut done = 0;
    let mut quiet_rounds = 0;
    for _ in 0..2_000_000 {
        let now = clock.now().as_nanos();
        let busy = a.progress() | b.progress();
        poll_all(&cq_a, 'a', now, &mut out, &mut done);
        poll_all(&cq_b, 'b', now, &mut out, &mut done);
        if busy {
            quiet_rounds = 0;
            continue;
        }
        // A pass can build packets it defers to the next one: two quiet rounds mean quiet.
        quiet_rounds += 1;
        if quiet_rounds < 2 {
            continue;
        }
        if done == expected {
            break;
        }
        match [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
        {
            Some(t) => clock.advance_to(t),
            None => panic!("seed {seed}: stuck with {done}/{expected} completions"),
        }
    }
    assert_eq!(done, expected, "seed {seed}: did not finish");
    drop((qp_a, qp_b));
    capture.flush().unwrap();
    out.frames = roce_wire_frames(pcap);
    out.received = dst_mr.to_vec();
    out.read_back = back_mr.to_vec();
    out.net = net.stats();
    out
}

/// The frames of a pcap file, without their (wall-clock) timestamps.
fn roce_wire_frames(path: &Path) -> Vec<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap();
    roce_wire::pcap::read_capture(file)
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect()
}

fn check_outcome(seed: u64, o: &Outcome) {
    let sends: Vec<u64> = o
        .completions
        .iter()
        .filter(|c| c.1 == 'a')
        .map(|c| c.2)
        .collect();
    let want: Vec<u64> = (0..SENDS as u64).chain([100, 101]).collect();
    assert_eq!(sends, want, "seed {seed}: send completions once, in order");
    for c in &o.completions {
        assert_eq!(c.3, WcStatus::Success, "seed {seed}: {c:?}");
    }
    // The READ brought back what the WRITE put there.
    assert_eq!(o.read_back, o.received[..40_000], "seed {seed}");
}

fn replay(seed: u64) -> Result<(), TestCaseError> {
    let dir = std::env::temp_dir().join(format!("roce-replay-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = run(seed, &dir.join("1.pcap"));
    let second = run(seed, &dir.join("2.pcap"));
    if let Some(keep) = std::env::var_os("ROCECTL_REPLAY_PCAP") {
        std::fs::copy(dir.join("1.pcap"), keep).expect("ROCECTL_REPLAY_PCAP: a writable path");
    }
    let _ = std::fs::remove_dir_all(&dir);
    check_outcome(seed, &first);
    prop_assert!(
        first.frames.len() > 2 * SENDS,
        "seed {}: only {} frames",
        seed,
        first.frames.len()
    );
    prop_assert_eq!(
        first.frames.len(),
        second.frames.len(),
        "seed {} does not replay: frame counts differ (ROCECTL_REPLAY_SEED={} reruns it)",
        seed,
        seed
    );
    if let Some(i) = (0..first.frames.len()).find(|&i| first.frames[i] != second.frames[i]) {
        return Err(TestCaseError::fail(format!(
            "seed {seed} does not replay: frame {i} differs (ROCECTL_REPLAY_SEED={seed} reruns it)"
        )));
    }
    prop_assert_eq!(
        &first.completions,
        &second.completions,
        "seed {} does not replay: completions differ",
        seed
    );
    prop_assert_eq!(&first, &second, "seed {} does not replay", seed);
    Ok(())
}

#[test]
fn a_fixed_seed_replays_with_faults_of_every_kind() {
    let seed = std::env::var("ROCECTL_REPLAY_SEED")
        .ok()
        .map_or(0x5EED_0011, |s| {
            s.parse().expect("ROCECTL_REPLAY_SEED: a u64")
        });
    replay(seed).unwrap_or_else(|e| panic!("{e}"));
    // The scenario really exercised the fault model (for the default seed; a chosen seed
    // only has to replay).
    if std::env::var_os("ROCECTL_REPLAY_SEED").is_none() {
        let dir = std::env::temp_dir().join(format!("roce-replay-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let o = run(seed, &dir.join("s.pcap"));
        let _ = std::fs::remove_dir_all(&dir);
        let s = o.net;
        assert!(
            s.lost > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0,
            "{s:?}"
        );
    }
}

#[test]
fn different_seeds_give_different_runs() {
    let dir = std::env::temp_dir().join(format!("roce-replay-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = run(1, &dir.join("x.pcap"));
    let y = run(2, &dir.join("y.pcap"));
    let _ = std::fs::remove_dir_all(&dir);
    check_outcome(1, &x);
    check_outcome(2, &y);
    assert_ne!(x.frames, y.frames);
}

/// A seed proptest once drew (CI, clean clone) whose 40 KB READ ended in RETRY_EXC_ERR. The
/// requester re-requested the READ from PSN 17 of 14..22 once per ACK timeout, and the
/// simulated link lost every re-request: the burst state of the loss model advanced per
/// datagram, not per unit of time, so when the only traffic was one retry per ACK timeout a
/// burst of a few datagrams spanned all seven timeouts (`retry_cnt` 7 is finite; IBTA). The
/// model now bounds a burst in time (`LinkConfig::burst_max_ns`, 100 us here against an ACK
/// timeout of 262 us), and the READ finishes. Fails with `burst_max_ns: 0` in `link()`.
#[test]
fn seed_9880257181413380663_finishes_its_read() {
    let dir = std::env::temp_dir().join(format!("roce-replay-bug-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = run(9_880_257_181_413_380_663, &dir.join("bug.pcap"));
    let _ = std::fs::remove_dir_all(&dir);
    check_outcome(9_880_257_181_413_380_663, &o);
}

proptest! {
    // Fixed RNG seed: CI runs the same six scenarios every time, so a failure is a change in
    // behaviour, not the draw (a random draw found the case above). Explore other seeds with
    // `ROCECTL_REPLAY_SEED`.
    #![proptest_config(ProptestConfig {
        cases: 6,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_2026_1123),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_seed_replays(seed in any::<u64>()) {
        replay(seed)?;
    }
}
