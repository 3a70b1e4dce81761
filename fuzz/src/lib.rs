//! # roce-fuzz: fuzz target bodies shared by cargo-fuzz and the stable runner
//!
//! Each target is a plain function of `&[u8]` that panics only on a bug:
//!
//! - [`wire_parse`]: bytes through every parser of `roce-wire` (Ethernet frame, raw IP packet,
//!   captured link types, bare transport packet, the ICRC functions), each result rendered with
//!   `Display` and `Debug` into a `String` sink. The contract is "`parse` never panics".
//! - [`wire_roundtrip`]: whatever parses is emitted into a buffer of exactly `buffer_len()`
//!   bytes and parsed again, and must come back equal.
//! - [`qp_responder`]: a script of crafted and raw transport packets (plus receives, posts,
//!   timeouts, modifies) into an RC or UC queue pair in any state: never panics, the QP's
//!   invariants hold, everything it sends parses, no completion names a WR never posted.
//! - [`qp_requester`]: arbitrary responses into an RC requester/completer with work posted,
//!   with the same checks, and send completions in posting order.
//!
//! `fuzz_targets/*.rs` wrap them for libFuzzer (`cargo +nightly fuzz run wire_parse`);
//! `stable-runner/` wraps them for a seeded mutation loop that builds on stable Rust.
//! [`seeds`] builds the seed corpus both use from the rxe captures and the wire samples.
//!
//! # Fuzzing
//!
//! Under `cfg(fuzzing)` (cargo-fuzz) `roce_wire::icrc::verify` always passes, so mutated frames
//! reach the transport parser even with the ICRC check on. The stable runner has no
//! `cfg(fuzzing)`; the targets therefore also parse with `Check::None` and call
//! `PacketRepr::parse` straight on the candidate UDP payload offsets, so that both builds
//! exercise the same code.

mod qp;

use std::fmt::Write as _;

use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::pcap::{linktype, parse_link};
use roce_wire::{Caps, Check, Frame, PacketRepr, ParseError};

pub use qp::{qp_requester, qp_responder};

/// Receive with the ICRC checked (what the stack does).
const CHECKED: Caps = Caps { icrc: Check::Both };
/// Receive without the ICRC (reaches the transport parser on the stable runner).
const UNCHECKED: Caps = Caps { icrc: Check::None };

/// Where a UDP payload may start in an Ethernet frame: IPv4, IPv4 + 802.1Q, IPv6,
/// IPv6 + 802.1Q.
const UDP_PAYLOAD_OFFSETS: [usize; 4] = [14 + 20 + 8, 18 + 20 + 8, 14 + 40 + 8, 18 + 40 + 8];

/// Link types tried through `parse_link`, chosen by the first input byte.
const LINKTYPES: [u32; 8] = [
    linktype::ETHERNET,
    linktype::RAW,
    linktype::IPV4,
    linktype::IPV6,
    linktype::LINUX_SLL,
    linktype::LINUX_SLL2,
    linktype::NULL,
    999, // unsupported
];

/// Parses `data` every way `roce-wire` can and renders the results; must never panic.
pub fn wire_parse(data: &[u8]) {
    let mut sink = String::new();
    for caps in [CHECKED, UNCHECKED] {
        show_frame(&mut sink, Frame::parse_ethernet(data, &caps));
        show_frame(&mut sink, Frame::parse_ip(data, &caps));
    }
    if let Some((&first, rest)) = data.split_first() {
        let lt = LINKTYPES[usize::from(first) % LINKTYPES.len()];
        show_frame(&mut sink, parse_link(lt, rest, &UNCHECKED));
    }
    show_packet(&mut sink, PacketRepr::parse(data));
    for off in UDP_PAYLOAD_OFFSETS {
        if let Some(udp_payload) = data.get(off..) {
            show_packet(&mut sink, PacketRepr::parse(udp_payload));
        }
    }
    let _ = write!(sink, "{:?}", icrc::compute(data));
    let _ = write!(sink, "{}", icrc::verify(data));
    std::hint::black_box(&sink);
}

/// Parse → emit into exactly `buffer_len()` bytes → parse must give back the same `Repr`, for
/// bare transport packets and for whole frames (Ethernet and raw IP).
///
/// # Panics
/// On a broken round trip (that is a bug in `roce-wire`).
pub fn wire_roundtrip(data: &[u8]) {
    packet_roundtrip(data);
    for off in UDP_PAYLOAD_OFFSETS {
        if let Some(udp_payload) = data.get(off..) {
            packet_roundtrip(udp_payload);
        }
    }
    for caps in [CHECKED, UNCHECKED] {
        if let Ok(frame) = Frame::parse_ethernet(data, &caps) {
            frame_roundtrip(&frame, true);
        }
        if let Ok(frame) = Frame::parse_ip(data, &caps) {
            frame_roundtrip(&frame, false);
        }
    }
}

fn show_frame(sink: &mut String, frame: Result<Frame<'_>, ParseError>) {
    match frame {
        Ok(f) => {
            let _ = write!(sink, "{} {:?} {:?}", f.repr, f.repr, f.icrc());
            show_packet(sink, f.packet());
        }
        Err(e) => {
            let _ = write!(sink, "{e} {e:?}");
        }
    }
}

fn show_packet(sink: &mut String, packet: Result<PacketRepr<'_>, ParseError>) {
    match packet {
        Ok(p) => {
            // Debug of the headers only: the payload bytes would dominate the run time.
            let _ = write!(sink, "{p} {:?} {:?} {:?}", p.bth, p.ext, p.check());
        }
        Err(e) => {
            let _ = write!(sink, "{e} {e:?}");
        }
    }
}

fn packet_roundtrip(udp_payload: &[u8]) {
    let Ok(packet) = PacketRepr::parse(udp_payload) else {
        return;
    };
    assert_eq!(
        packet.buffer_len(),
        udp_payload.len(),
        "buffer_len of a parsed packet is its length: {packet}"
    );
    let mut buf = vec![0xA5; packet.buffer_len()];
    packet.emit(&mut buf);
    let again = PacketRepr::parse(&buf)
        .unwrap_or_else(|e| panic!("re-parse of emitted {packet} failed: {e}"));
    assert_eq!(again, packet, "packet round trip");
    // Emit is a function of the Repr: a second emit gives the same bytes.
    let mut buf2 = vec![0x5A; again.buffer_len()];
    again.emit(&mut buf2);
    assert_eq!(buf2, buf, "emit is deterministic");
}

fn frame_roundtrip(frame: &Frame<'_>, ethernet: bool) {
    let Ok(packet) = frame.packet() else {
        return;
    };
    let repr = frame.repr;
    assert_eq!(
        repr.buffer_len(&packet) - (repr.header_len() - repr.ip.header_len() - 8),
        frame.ip_packet.len(),
        "buffer_len of a parsed frame covers its IP packet: {repr} {packet}"
    );
    let mut buf = vec![0xA5; repr.buffer_len(&packet)];
    repr.emit(&packet, &mut buf, &CHECKED);
    let reparsed = if ethernet {
        Frame::parse_ethernet(&buf, &CHECKED)
    } else {
        Frame::parse_ip(&buf, &CHECKED)
    };
    let again = reparsed.unwrap_or_else(|e| panic!("re-parse of emitted {repr} {packet}: {e}"));
    assert_eq!(again.repr, repr, "frame round trip");
    assert_eq!(again.packet(), Ok(packet), "packet inside frame round trip");
    // `verify` is always true under cfg(fuzzing); `compute` is not.
    let n = again.ip_packet.len();
    assert_eq!(
        icrc::compute(again.ip_packet).map(|c| c.to_vec()),
        Some(again.ip_packet[n - ICRC_LEN..].to_vec()),
        "emit writes the ICRC that compute gives"
    );
}

pub mod seeds {
    //! The seed corpus: every frame of the rxe captures in `shared/captures/*.pcap` and every
    //! sample frame of `roce_wire::samples`, plus the UDP payload of each (so that the bare
    //! `PacketRepr::parse` path starts from real transport packets too).

    use std::collections::BTreeSet;
    use std::fs::File;
    use std::io::BufReader;
    use std::path::{Path, PathBuf};

    use roce_wire::pcap::{l3_offset, linktype, parse_link, read_capture};
    use roce_wire::{samples, Caps, Check};

    /// Where the captures are: `$ROCE_SHARED_DIR/captures`, else `<repo>/../shared/captures`
    /// (`shared/` beside the checkout), relative to this crate's manifest directory.
    pub fn captures_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("ROCE_SHARED_DIR") {
            return PathBuf::from(dir).join("captures");
        }
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures")
    }

    /// Inputs that once crashed a target (`fuzz/regressions/<target>/*`), kept so that every
    /// run replays them first. Both targets get all of them.
    pub fn regressions() -> Vec<Vec<u8>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .filter_map(|d| d.ok())
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten())
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .filter_map(|p| std::fs::read(p).ok())
            .collect()
    }

    /// The seed inputs (including [`regressions`]), deduplicated and in a stable order, and
    /// how many came from captures.
    /// Unreadable capture files are reported on stderr and skipped.
    pub fn corpus(captures: &Path) -> (Vec<Vec<u8>>, usize) {
        let mut set = BTreeSet::new();
        let mut from_captures = 0;
        let mut files: Vec<PathBuf> = std::fs::read_dir(captures)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_else(|e| {
                eprintln!("seeds: cannot read {}: {e}", captures.display());
                Vec::new()
            });
        files.retain(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"));
        files.sort();
        for path in files {
            let frames = match File::open(&path).and_then(|f| read_capture(BufReader::new(f))) {
                Ok(frames) => frames,
                Err(e) => {
                    eprintln!("seeds: skipping {}: {e}", path.display());
                    continue;
                }
            };
            for f in frames {
                let Ok(parsed) = parse_link(f.linktype, &f.data, &Caps { icrc: Check::None })
                else {
                    continue;
                };
                from_captures += 1;
                set.insert(parsed.udp_payload.to_vec());
                if f.linktype == linktype::ETHERNET {
                    set.insert(f.data.clone());
                } else if let Some(off) = l3_offset(f.linktype, &f.data) {
                    set.insert(f.data[off..].to_vec());
                }
            }
        }
        for input in regressions() {
            set.insert(input);
        }
        for (_, frame) in samples::all() {
            if let Ok(parsed) = roce_wire::Frame::parse_ethernet(&frame, &Caps::default()) {
                set.insert(parsed.udp_payload.to_vec());
                set.insert(parsed.ip_packet.to_vec());
            }
            set.insert(frame);
        }
        (set.into_iter().collect(), from_captures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regressions_pass() {
        for input in seeds::regressions() {
            wire_parse(&input);
            wire_roundtrip(&input);
        }
    }

    #[test]
    fn seeds_pass_both_targets() {
        let (corpus, _) = seeds::corpus(&seeds::captures_dir());
        assert!(corpus.len() > 40, "samples alone give more than 40 inputs");
        let regressions = seeds::regressions();
        for input in corpus.iter().filter(|i| !regressions.contains(i)) {
            wire_parse(input);
            wire_roundtrip(input);
        }
    }

    #[test]
    fn garbage_does_not_panic() {
        for len in 0..200 {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
            wire_parse(&data);
            wire_roundtrip(&data);
        }
    }
}
