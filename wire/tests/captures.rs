//! Every RoCEv2 frame in every capture under `shared/captures/` (real Linux rdma_rxe traffic):
//! parses, has a correct ICRC, and re-emits to exactly the original bytes.
//!
//! The captures directory is `../shared/captures` beside the repository, or
//! `$ROCE_SHARED_DIR/captures`. A missing directory fails the test: it is the ground truth.

use std::collections::BTreeMap;
use std::path::PathBuf;

use roce_wire::pcap::{parse_link, read_capture};
use roce_wire::{icrc, Caps, Frame, ParseError};

fn captures_dir() -> PathBuf {
    let shared = std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("captures")
}

#[test]
fn every_captured_frame_parses_verifies_and_reemits_exactly() {
    let dir = captures_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("captures directory {} unreadable: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 16,
        "expected the 16 rxe captures, found {}",
        files.len()
    );

    let caps = Caps::default();
    let mut per_opcode: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for path in &files {
        let frames = read_capture(std::fs::File::open(path).unwrap()).unwrap();
        let mut roce_here = 0;
        for (i, cf) in frames.iter().enumerate() {
            let what = format!("{} frame {}", path.display(), i + 1);
            let frame = match parse_link(cf.linktype, &cf.data, &caps) {
                Ok(f) => f,
                // ARP and the TCP out-of-band exchange are not RoCE.
                Err(ParseError::NotRoce) => continue,
                Err(e) => panic!("{what}: {e}"),
            };
            roce_here += 1;
            assert!(icrc::verify(frame.ip_packet), "{what}: ICRC");
            let packet = frame.packet().unwrap_or_else(|e| panic!("{what}: {e}"));
            packet
                .check()
                .unwrap_or_else(|e| panic!("{what}: inconsistent parse: {e}"));
            *per_opcode.entry(packet.opcode().to_string()).or_default() += 1;

            // Emit what was parsed and compare with the captured bytes (up to the end of the IP
            // packet: any Ethernet trailer is not part of the frame we build).
            let mut out = vec![0u8; frame.repr.buffer_len(&packet)];
            frame.repr.emit(&packet, &mut out, &caps);
            let l2 = out.len() - frame.ip_packet.len();
            assert_eq!(
                out[..],
                cf.data[..l2 + frame.ip_packet.len()],
                "{what}: re-emit differs"
            );
            // And the re-emitted frame parses to the same thing.
            let again = Frame::parse_ethernet(&out, &caps).unwrap();
            assert_eq!(again.packet().unwrap(), packet, "{what}");
        }
        assert!(roce_here > 0, "{}: no RoCEv2 frame", path.display());
        total += roce_here;
    }
    eprintln!(
        "{total} RoCEv2 frames in {} captures: {per_opcode:?}",
        files.len()
    );
    // The RoCEv2 column of shared/captures/SUMMARY.md sums to 685 frames.
    assert_eq!(total, 685);
    for op in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_ONLY",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_ONLY",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_ONLY",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_ACKNOWLEDGE",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_CMP_SWAP",
        "RC_FETCH_ADD",
        "UC_SEND_FIRST",
        "UD_SEND_ONLY",
    ] {
        assert!(per_opcode.contains_key(op), "no {op} seen");
    }
}

#[test]
fn a_flipped_bit_anywhere_covered_fails_the_icrc() {
    let path = captures_dir().join("rc_pingpong.pcap");
    let frames = read_capture(std::fs::File::open(path).unwrap()).unwrap();
    let cf = frames
        .iter()
        .find(|f| Frame::parse_ethernet(&f.data, &Caps::default()).is_ok())
        .expect("a RoCE frame");
    let ip_start = 14;
    // Flip every bit of every byte outside the masked fields: the ICRC must catch each.
    let masked = [1usize, 8, 10, 11, 26, 27, 32]; // TOS, TTL, IP csum, UDP csum, BTH byte 4
    let end = cf.data.len() - 4;
    for off in ip_start..end {
        if masked.contains(&(off - ip_start)) {
            continue;
        }
        let mut bad = cf.data.clone();
        bad[off] ^= 0x01;
        match Frame::parse_ethernet(&bad, &Caps::default()) {
            Err(_) => {}
            Ok(_) => panic!("bit flip at frame offset {off} not detected"),
        }
    }
}

/// The IPv4 Identification of every captured rxe packet (rxe increments it per packet) is
/// recovered from the ICRC alone, as the UDP backend must do.
#[test]
fn ipv4_ident_recovered_from_icrc_for_every_captured_frame() {
    let mut solver = icrc::Ipv4IdentSolver::new();
    let mut checked = 0;
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    let frames = files.iter().flat_map(|path| {
        let frames = read_capture(std::fs::File::open(path).unwrap()).unwrap();
        frames
            .into_iter()
            .enumerate()
            .map(move |(i, f)| (format!("{} frame {}", path.display(), i + 1), f))
    });
    for (what, cf) in frames {
        let Ok(frame) = parse_link(cf.linktype, &cf.data, &Caps::default()) else {
            continue;
        };
        let ip = frame.ip_packet;
        if ip.first() != Some(&0x45) {
            continue;
        }
        let ident = u16::from_be_bytes([ip[4], ip[5]]);
        let df = ip[6] & 0x40 != 0;
        let mut hidden = ip.to_vec();
        hidden[4..8].fill(0);
        // Only DF packets solve (every RoCEv2 sender sets DF; the captures agree).
        assert!(df, "{what}: a RoCEv2 packet without DF");
        assert_eq!(solver.solve(&hidden), Some(ident), "{what}");
        checked += 1;
    }
    assert!(checked > 600, "only {checked} IPv4 RoCE frames");
}
