//! Issue 12 item 1: how often a corrupted IPv4 packet gets through the receive check of a
//! backend that cannot see the IP header ([`icrc::Ipv4IdentChecker`]), measured.
//!
//! - millions of randomly corrupted frames per peer state, against the bound in the
//!   checker's docs (the counts are Poisson; the limits are set so that a correct checker fails
//!   about once in 10^4 runs or less, and a checker that accepted any solution fails always);
//! - every single-bit error of a few packet sizes;
//! - the real rxe Identifications of every capture under `shared/captures/` pass (no false
//!   reject on real traffic: reordering, retransmission, two directions, several flows).
//!
//! Run in release (`cargo test --release -p roce-wire`); the corrupted-frame test takes a few
//! seconds there.

use std::path::PathBuf;

use roce_wire::icrc::{self, IdentPolicy, IdentVerdict, Ipv4IdentChecker, Ipv4IdentSolver};
use roce_wire::pcap::{parse_link, read_capture};
use roce_wire::Caps;

/// splitmix64: the test's deterministic random source.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// An IPv4 RoCE packet (IP header .. ICRC) with Identification `ident` and DF, `payload`
/// bytes after the BTH, from 10.0.0.1; `seed` varies the payload.
fn packet(ident: u16, payload: usize, seed: u8) -> Vec<u8> {
    let total = 20 + 8 + 12 + payload + 4;
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0x02, (total >> 8) as u8, total as u8]);
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&[0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    let udp = total - 20;
    p.extend_from_slice(&[0xC0, 0x01, 0x12, 0xB7, (udp >> 8) as u8, udp as u8, 0, 0]);
    p.extend_from_slice(&[0x0A, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0x80, 0, 0, 9]);
    p.extend((0..payload).map(|i| (i as u8).wrapping_mul(31) ^ seed));
    p.extend_from_slice(&[0; 4]);
    let end = p.len() - 4;
    let crc = icrc::compute(&p).unwrap();
    p[end..].copy_from_slice(&crc);
    p
}

/// What a UDP socket lets the engine rebuild: the Identification and flags are unknown.
fn hide(p: &mut [u8]) {
    p[4..8].fill(0);
}

/// Flips random bits (1 to 8, or a random burst of up to 4 bytes) in the UDP payload (BTH ..
/// ICRC), never only in the masked BTH byte 4. Returns false if nothing covered changed.
fn corrupt(p: &mut [u8], rng: &mut Rng) -> bool {
    let start = 28;
    let orig = p.to_vec();
    if rng.below(4) == 0 {
        let len = 1 + rng.below(4);
        let at = start + rng.below(p.len() - start - len + 1);
        for b in &mut p[at..at + len] {
            *b ^= rng.next() as u8;
        }
    } else {
        for _ in 0..1 + rng.below(8) {
            let at = start + rng.below(p.len() - start);
            p[at] ^= 1 << rng.below(8);
        }
    }
    (0..p.len()).any(|i| i != 32 && p[i] != orig[i])
}

const SIZES: [usize; 4] = [0, 60, 256, 1024];

/// Feeds `peer_ident(i)` good packets and a corrupted one after each; returns how many
/// corrupted packets the checker accepted.
fn run(
    checker: &mut Ipv4IdentChecker,
    rng: &mut Rng,
    n: usize,
    peer_ident: impl Fn(usize) -> u16,
) -> usize {
    let mut accepted = 0;
    let mut now = 1_000_000u64;
    let mut i = 0;
    let mut tried = 0;
    while tried < n {
        let size = SIZES[i % SIZES.len()];
        let mut good = packet(peer_ident(i), size, i as u8);
        hide(&mut good);
        assert_eq!(
            checker.check(&good, now),
            IdentVerdict::Accept(peer_ident(i)),
            "good packet {i}"
        );
        i += 1;
        now += 10_000;
        let mut bad = packet(peer_ident(i), size, i as u8);
        hide(&mut bad);
        if !corrupt(&mut bad, rng) {
            continue;
        }
        tried += 1;
        if matches!(checker.check(&bad, now), IdentVerdict::Accept(_)) {
            accepted += 1;
        }
        now += 10_000;
    }
    accepted
}

#[test]
fn corrupted_frames_get_through_at_the_documented_rates() {
    const N: usize = 1 << 21;
    let mut rng = Rng(0x1CC0_FFEE);

    // The solver alone (any Identification with DF): 2^-16 per corrupted packet, mean 32.
    let mut solver = Ipv4IdentSolver::new();
    let mut solved = 0;
    for k in 0..N {
        let mut bad = packet(k as u16, SIZES[k % SIZES.len()], k as u8);
        hide(&mut bad);
        if corrupt(&mut bad, &mut rng) && solver.solve(&bad).is_some() {
            solved += 1;
        }
    }
    eprintln!("solver alone: {solved} of {N} (2^-16 predicts 32)");
    assert!((10..=64).contains(&solved), "{solved}");

    // A window peer (rxe-like Identifications, +1 per packet): 2^-16 x 321/2^16 with the
    // default policy, mean 0.16 here; a checker that accepted any solution would let ~32 in.
    let mut window = Ipv4IdentChecker::new(IdentPolicy::default());
    let accepted = run(&mut window, &mut rng, N, |i| {
        0x4000u16.wrapping_add(i as u16)
    });
    eprintln!("window peer: {accepted} of {N} accepted (bound predicts 0.16)");
    assert!(accepted <= 3, "{accepted}");

    // A zero peer (rocectl): the full 32-bit check, mean 0.0005.
    let mut zero = Ipv4IdentChecker::new(IdentPolicy::default());
    let accepted = run(&mut zero, &mut rng, N, |_| 0);
    assert!(zero.is_zero_peer([10, 0, 0, 1]));
    eprintln!("zero peer: {accepted} of {N} accepted");
    assert!(accepted <= 1, "{accepted}");
}

#[test]
fn single_bit_errors() {
    for size in [0usize, 100, 1_000, 4_000] {
        // Zero peer and a known header: every single-bit error caught.
        let mut zero = Ipv4IdentChecker::new(IdentPolicy::default());
        for k in 0..8 {
            let mut p = packet(0, size, k);
            hide(&mut p);
            assert_eq!(
                zero.check(&p, 1_000 + u64::from(k)),
                IdentVerdict::Accept(0)
            );
        }
        assert!(zero.is_zero_peer([10, 0, 0, 1]));
        // Window peer anchored at 0x1234.
        let mut window = Ipv4IdentChecker::new(IdentPolicy::default());
        let mut p = packet(0x1234, size, 0);
        hide(&mut p);
        assert_eq!(window.check(&p, 1_000), IdentVerdict::Accept(0x1234));
        let mut solver = Ipv4IdentSolver::new();

        let clean0 = packet(0, size, 9);
        let clean_w = packet(0x1235, size, 9);
        let (mut blind, mut window_passed) = (0, 0);
        for byte in 28..clean0.len() {
            if byte == 32 {
                continue; // BTH byte 4: masked by the ICRC
            }
            for bit in 0..8 {
                let mut full = clean_w.clone();
                full[byte] ^= 1 << bit;
                assert!(
                    !icrc::verify(&full),
                    "size {size} byte {byte} bit {bit}: full"
                );
                let mut z = clean0.clone();
                z[byte] ^= 1 << bit;
                hide(&mut z);
                assert!(
                    !matches!(zero.check(&z, 2_000), IdentVerdict::Accept(_)),
                    "size {size} byte {byte} bit {bit}: zero peer"
                );
                let mut w = clean_w.clone();
                w[byte] ^= 1 << bit;
                hide(&mut w);
                if solver.solve(&w).is_some() {
                    blind += 1;
                }
                // Each try is independent: a fresh window anchored at 0x1234.
                let mut win = Ipv4IdentChecker::new(IdentPolicy::default());
                assert_eq!(win.check(&p, 1_000), IdentVerdict::Accept(0x1234));
                if matches!(win.check(&w, 1_010), IdentVerdict::Accept(_)) {
                    window_passed += 1;
                }
            }
        }
        let bits = (clean0.len() - 29) * 8;
        eprintln!(
            "size {size}: {bits} bit positions, {blind} solve to some Identification, \
             {window_passed} pass a window peer"
        );
        // Expected bits / 2^16 blind positions (<= 0.6 here), and of those ~ 321/2^16 pass.
        assert!(blind <= 4, "{blind} blind positions at size {size}");
        assert_eq!(window_passed, 0, "size {size}");
    }
}

/// The two single-bit errors issue 12 reported passing the old solver (Identification *and*
/// DF unknown) at every length: bit 3 of UDP-payload byte 173 and bit 6 of byte 1834.
#[test]
fn the_reported_single_bit_errors_no_longer_solve() {
    let mut solver = Ipv4IdentSolver::new();
    for size in [1_900usize, 2_000, 3_000, 4_000] {
        for (byte, bit) in [(173usize, 3u8), (1_834, 6)] {
            let mut p = packet(0x2222, size, 3);
            p[28 + byte] ^= 1 << bit;
            hide(&mut p);
            assert_eq!(solver.solve(&p), None, "size {size} byte {byte} bit {bit}");
        }
    }
}

#[test]
fn peers_re_anchor_after_one_packet_and_zero_peers_can_change() {
    let mut c = Ipv4IdentChecker::new(IdentPolicy::default());
    let pkt = |id: u16| {
        let mut p = packet(id, 64, 1);
        hide(&mut p);
        p
    };
    let ms = 1_000_000u64;
    assert_eq!(c.check(&pkt(100), ms), IdentVerdict::Accept(100));
    // Reordering behind, loss ahead.
    assert_eq!(c.check(&pkt(90), 2 * ms), IdentVerdict::Accept(90));
    assert_eq!(c.check(&pkt(300), 3 * ms), IdentVerdict::Accept(300));
    // A jump (the peer sent a burst of other traffic): one packet lost, then re-anchored.
    assert_eq!(
        c.check(&pkt(20_000), 4 * ms),
        IdentVerdict::Implausible(20_000)
    );
    assert_eq!(c.check(&pkt(20_001), 5 * ms), IdentVerdict::Accept(20_001));
    // Silence widens the window (Linux adds up to one step per jiffy of idle time).
    assert_eq!(
        c.check(&pkt(20_001 + 256 + 900), 1_000 * ms),
        IdentVerdict::Accept(21_157)
    );
    // Eight zeros: held to 0 from then on.
    let mut z = Ipv4IdentChecker::new(IdentPolicy::default());
    for k in 0..8 {
        assert_eq!(z.check(&pkt(0), k * ms), IdentVerdict::Accept(0));
    }
    assert!(z.is_zero_peer([10, 0, 0, 1]));
    // A GSO segment number (below gso_span) is what a zero peer also sends.
    assert_eq!(z.check(&pkt(63), 9 * ms), IdentVerdict::Accept(63));
    assert_eq!(z.check(&pkt(500), 9 * ms), IdentVerdict::Implausible(500));
    assert_eq!(z.check(&pkt(400), 10 * ms), IdentVerdict::Implausible(400));
    // The peer restarted as rxe: two consecutive Identifications re-anchor it.
    assert_eq!(z.check(&pkt(401), 11 * ms), IdentVerdict::Accept(401));
    assert!(!z.is_zero_peer([10, 0, 0, 1]));
    // A packet sent without DF never passes.
    let mut p = packet(7, 64, 1);
    p[6] = 0;
    let end = p.len() - 4;
    let crc = icrc::compute(&p).unwrap();
    p[end..].copy_from_slice(&crc);
    hide(&mut p);
    assert_eq!(c.check(&p, 1_001 * ms), IdentVerdict::NoSolution);
}

fn captures_dir() -> PathBuf {
    let shared = std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("captures")
}

#[test]
fn every_captured_rxe_packet_passes_the_per_peer_check() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    let mut checked = 0;
    for path in &files {
        // One receiver per capture: both directions' senders are peers of it.
        let mut checker = Ipv4IdentChecker::new(IdentPolicy::default());
        let frames = read_capture(std::fs::File::open(path).unwrap()).unwrap();
        for (i, cf) in frames.iter().enumerate() {
            let Ok(frame) = parse_link(cf.linktype, &cf.data, &Caps::default()) else {
                continue;
            };
            let ip = frame.ip_packet;
            if ip.first() != Some(&0x45) {
                continue;
            }
            let ident = u16::from_be_bytes([ip[4], ip[5]]);
            let mut hidden = ip.to_vec();
            hide(&mut hidden);
            let now = cf.timestamp.as_nanos() as u64;
            assert_eq!(
                checker.check(&hidden, now),
                IdentVerdict::Accept(ident),
                "{} frame {}",
                path.display(),
                i + 1
            );
            checked += 1;
        }
    }
    assert!(checked > 600, "only {checked} IPv4 RoCE frames");
}

/// A GSO sender (rocectl: unconnected socket, DF) numbers the segments of each message 0, 1,
/// .., n-1: such a peer becomes a zero peer held to `0..gso_span`; a counting peer (rxe) that
/// passes through 0..63 does not.
#[test]
fn gso_senders_become_zero_peers_and_counting_peers_do_not() {
    let pkt = |id: u16| {
        let mut p = packet(id, 64, 1);
        hide(&mut p);
        p
    };
    let mut g = Ipv4IdentChecker::new(IdentPolicy::default());
    let mut now = 0;
    for _ in 0..8 {
        for id in 0..40 {
            now += 1_000;
            assert_eq!(g.check(&pkt(id), now), IdentVerdict::Accept(id));
        }
    }
    assert!(g.is_zero_peer([10, 0, 0, 1]));
    assert_eq!(g.check(&pkt(64), now), IdentVerdict::Implausible(64));
    let mut r = Ipv4IdentChecker::new(IdentPolicy::default());
    for k in 0..70_000u32 {
        let id = (k as u16).wrapping_add(65_000);
        assert_eq!(
            r.check(&pkt(id), u64::from(k) * 1_000),
            IdentVerdict::Accept(id)
        );
        assert!(!r.is_zero_peer([10, 0, 0, 1]), "id {id}");
    }
}

/// The patcher turns the ICRC for one Identification into the ICRC for another, at every
/// length, and agrees with a full recomputation.
#[test]
fn the_patcher_rewrites_icrcs_for_another_identification() {
    let mut patcher = icrc::Ipv4IdentPatcher::new();
    for size in [0usize, 1, 60, 1_000, 4_096, 9_000] {
        for (from, to) in [(0u16, 1u16), (0, 63), (7, 0), (0x1234, 0xFFFF)] {
            let p = packet(from, size, 5);
            let q = packet(to, size, 5);
            let end = p.len() - 4;
            let mut icrc: [u8; 4] = p[end..].try_into().unwrap();
            assert!(patcher.patch(p.len(), &mut icrc, from, to));
            assert_eq!(&icrc[..], &q[end..], "size {size} {from} -> {to}");
        }
    }
    let mut icrc = [0u8; 4];
    assert!(!patcher.patch(10, &mut icrc, 0, 1), "too short for RoCEv2");
    assert!(!patcher.patch(70_000, &mut icrc, 0, 1), "too long for IPv4");
    assert_eq!(icrc, [0; 4]);
}
