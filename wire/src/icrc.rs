//! The RoCEv2 invariant CRC.
//!
//! **Read first:** IBTA vol. 1, 7.8.1 (ICRC), RoCEv2 annex A17.4.4 (the IP/UDP form), our
//! digest `shared/spec/rocev2.md` section 5, and Linux `rxe_icrc.c`.
//!
//! The ICRC is CRC-32 (IEEE 802.3, reflected, init 0xFFFF_FFFF, final XOR) over:
//!
//! ```text
//! 8 x 0xFF                              (stands for the absent LRH)
//! IP header   IPv4: TOS, TTL, checksum  -> 0xFF     IPv6: traffic class, flow label, hop limit -> 1s
//! UDP header  checksum                  -> 0xFFFF
//! BTH         byte 4 (FECN, BECN, resv6) -> 0xFF
//! extension headers, payload, pad       (as sent)
//! ```
//!
//! and travels least-significant byte first (like the Ethernet FCS). Everything else, including
//! the IPv4 Identification, is covered.
//!
//! The masked IP/UDP/BTH prefix (at most 60 + 8 + 12 bytes) is copied to the stack and masked
//! there; the rest of the packet is fed to the CRC in place, so a 4 KiB payload costs one
//! `crc32fast` pass and no copy. The 8 bytes of 0xFF are folded into the starting state.
//!
//! # Fuzzing
//!
//! Under `cfg(fuzzing)`, [`verify`] always returns `true`, so fuzzers reach the code behind the
//! ICRC check without having to forge CRCs.

use crate::bth;

/// CRC-32 of eight 0xFF bytes: the running CRC after the masked LRH placeholder.
const CRC_OF_LRH_PLACEHOLDER: u32 = 0x2144_DF1C;

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Longest IP header we mask (IPv4 with the maximum options).
const MAX_IP_HEADER: usize = 60;
const UDP_HEADER: usize = 8;
const PREFIX_MAX: usize = MAX_IP_HEADER + UDP_HEADER + bth::HEADER_LEN;

/// An incremental ICRC computation.
///
/// ```
/// use roce_wire::icrc::Icrc;
/// # let (ip, udp, bth, rest) = ([0x45u8; 20], [0u8; 8], [0u8; 12], [0u8; 4]);
/// let mut icrc = Icrc::start(&ip, &udp, &bth).unwrap();
/// icrc.update(&rest); // extension headers, payload, pad: any number of pieces
/// let wire_bytes: [u8; 4] = icrc.finish();
/// # let _ = wire_bytes;
/// ```
#[derive(Clone, Debug)]
pub struct Icrc {
    hasher: crc32fast::Hasher,
}

impl Icrc {
    /// Starts the ICRC over the IP header (IPv4 with or without options, or the fixed IPv6
    /// header), the UDP header and the BTH, masking the variant fields on a stack copy.
    ///
    /// Returns `None` if the IP version nibble is neither 4 nor 6, or a slice has the wrong
    /// length (IPv4: its IHL; IPv6: 40; UDP: 8; BTH: 12).
    pub fn start(ip_header: &[u8], udp_header: &[u8], bth: &[u8]) -> Option<Self> {
        let ip_len = ip_header.len();
        let version = ip_header.first()? >> 4;
        let expected_ip = match version {
            4 => usize::from(ip_header[0] & 0x0F) * 4,
            6 => 40,
            _ => return None,
        };
        if ip_len != expected_ip
            || ip_len < 20
            || udp_header.len() != UDP_HEADER
            || bth.len() != bth::HEADER_LEN
        {
            return None;
        }
        let mut prefix = [0u8; PREFIX_MAX];
        let total = ip_len + UDP_HEADER + bth::HEADER_LEN;
        prefix[..ip_len].copy_from_slice(ip_header);
        prefix[ip_len..ip_len + UDP_HEADER].copy_from_slice(udp_header);
        prefix[ip_len + UDP_HEADER..total].copy_from_slice(bth);
        if version == 4 {
            prefix[1] = 0xFF; // TOS (DSCP + ECN)
            prefix[8] = 0xFF; // TTL
            prefix[10] = 0xFF; // header checksum
            prefix[11] = 0xFF;
        } else {
            prefix[0] |= 0x0F; // traffic class, high nibble
            prefix[1] = 0xFF; // traffic class low nibble + flow label
            prefix[2] = 0xFF;
            prefix[3] = 0xFF;
            prefix[7] = 0xFF; // hop limit
        }
        prefix[ip_len + 6] = 0xFF; // UDP checksum
        prefix[ip_len + 7] = 0xFF;
        prefix[ip_len + UDP_HEADER + 4] = 0xFF; // BTH FECN, BECN, resv6
        let mut hasher = crc32fast::Hasher::new_with_initial(CRC_OF_LRH_PLACEHOLDER);
        hasher.update(&prefix[..total]);
        Some(Self { hasher })
    }

    /// Feeds the next bytes after the BTH (extension headers, payload, pad), in order.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The four ICRC bytes as they appear on the wire.
    pub fn finish(self) -> [u8; ICRC_LEN] {
        self.hasher.finalize().to_le_bytes()
    }
}

/// Computes the ICRC of a whole IP packet: `ip_packet` runs from the first byte of the IP
/// header to the end of the ICRC field (whose content is ignored).
///
/// Returns `None` if the packet is too short to hold IP + UDP + BTH + ICRC or the IP header is
/// not IPv4/IPv6 (IPv6 extension headers are not supported: RoCEv2 does not use them).
pub fn compute(ip_packet: &[u8]) -> Option<[u8; ICRC_LEN]> {
    let ip_len = match ip_packet.first()? >> 4 {
        4 => usize::from(ip_packet[0] & 0x0F) * 4,
        6 => 40,
        _ => return None,
    };
    let bth_start = ip_len.checked_add(UDP_HEADER)?;
    let rest_start = bth_start + bth::HEADER_LEN;
    let end = ip_packet.len().checked_sub(ICRC_LEN)?;
    if end < rest_start {
        return None;
    }
    let mut icrc = Icrc::start(
        &ip_packet[..ip_len],
        &ip_packet[ip_len..bth_start],
        &ip_packet[bth_start..rest_start],
    )?;
    icrc.update(&ip_packet[rest_start..end]);
    Some(icrc.finish())
}

/// Whether the last four bytes of `ip_packet` are its correct ICRC (see [`compute`]).
///
/// # Fuzzing
/// Always `true` under `cfg(fuzzing)`.
pub fn verify(ip_packet: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    match compute(ip_packet) {
        Some(icrc) => ip_packet[ip_packet.len() - ICRC_LEN..] == icrc,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Bitwise CRC-32 (reflected polynomial 0xEDB88320): the reference the fast path is
    /// checked against.
    fn crc32_bitwise(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// Reference ICRC exactly as the spec digest's Python: copy, mask, CRC the whole thing.
    fn icrc_reference(ip_packet: &[u8]) -> [u8; 4] {
        let mut m = ip_packet[..ip_packet.len() - 4].to_vec();
        let udp = if m[0] >> 4 == 4 {
            m[1] = 0xFF;
            m[8] = 0xFF;
            m[10] = 0xFF;
            m[11] = 0xFF;
            usize::from(m[0] & 0xF) * 4
        } else {
            m[0] |= 0x0F;
            m[1..4].fill(0xFF);
            m[7] = 0xFF;
            40
        };
        m[udp + 6] = 0xFF;
        m[udp + 7] = 0xFF;
        m[udp + 12] = 0xFF;
        let mut all = vec![0xFFu8; 8];
        all.extend_from_slice(&m);
        crc32_bitwise(&all).to_le_bytes()
    }

    /// Spec digest 5.5: RC SEND_ONLY "hi!" over IPv4, ICRC 19 8f 0b 86.
    const V4_FRAME: &str = "020000000002020000000001080045020030000140004011\
        26b80a0000010a000002c00012b7001c00000410ffff000000128000000068692100198f0b86";
    /// Spec digest 5.5: the same over IPv6, ICRC 87 41 e9 6f.
    const V6_FRAME: &str = "02000000000202000000000186dd60200000001c1140\
        fd000000000000000000000000000001fd000000000000000000000000000002\
        c00012b7001c00000410ffff00000012800000006869210087 41e96f";
    /// ConnectX-4 Lx CNP (scapy test vector, via the spec digest), ICRC 82 fd 00 2a.
    const CNP_FRAME: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a00\
        1201000012b7002800008100ffff400001180000000000000000000000000000\
        00000000000082fd002a";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn seed_is_crc_of_eight_ff() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_OF_LRH_PLACEHOLDER);
        assert_eq!(crc32_bitwise(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn known_vectors() {
        for (frame, icrc) in [
            (V4_FRAME, [0x19, 0x8f, 0x0b, 0x86]),
            (V6_FRAME, [0x87, 0x41, 0xe9, 0x6f]),
            (CNP_FRAME, [0x82, 0xfd, 0x00, 0x2a]),
        ] {
            let frame = hex(frame);
            let ip = &frame[14..];
            assert_eq!(compute(ip), Some(icrc));
            assert_eq!(icrc_reference(ip), icrc);
            assert!(verify(ip));
            let mut bad = ip.to_vec();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            assert!(!verify(&bad));
        }
    }

    #[test]
    fn masked_fields_do_not_matter_and_others_do() {
        let frame = hex(V4_FRAME);
        let ip = &frame[14..];
        // TOS, TTL, IP checksum, UDP checksum, BTH byte 4 may change in flight.
        for offset in [1, 8, 10, 11, 26, 27, 32] {
            let mut m = ip.to_vec();
            m[offset] ^= 0x5A;
            assert!(verify(&m), "offset {offset} is masked");
        }
        // The IPv4 Identification (4, 5) and everything else is covered.
        for offset in [0, 2, 4, 5, 6, 9, 12, 16, 20, 22, 24, 28, 29, 33, 36, 38] {
            let mut m = ip.to_vec();
            m[offset] ^= 0x01;
            assert!(!verify(&m), "offset {offset} is covered");
        }
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert_eq!(compute(&[]), None);
        assert_eq!(compute(&[0x45; 10]), None);
        assert_eq!(compute(&[0x7F; 100]), None);
        assert_eq!(compute(&[0x4F; 70]), None, "IHL 15 leaves no room");
        assert!(!verify(&[0x60; 43]));
    }

    proptest! {
        /// The incremental fast path equals the copy-and-mask reference, whatever the split.
        #[test]
        fn incremental_matches_reference(
            v6 in any::<bool>(),
            header in proptest::collection::vec(any::<u8>(), 60),
            body in proptest::collection::vec(any::<u8>(), 4..600),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let mut pkt = header;
            if v6 {
                pkt[0] = 0x60 | (pkt[0] & 0x0F);
            } else {
                pkt[0] = 0x45;
                pkt.truncate(40);
            }
            pkt.extend_from_slice(&body);
            let ip_len = if v6 { 40 } else { 20 };
            let rest = ip_len + 20;
            let end = pkt.len() - 4;
            let mut icrc = Icrc::start(&pkt[..ip_len], &pkt[ip_len..ip_len + 8],
                &pkt[ip_len + 8..rest]).unwrap();
            let mut points: Vec<usize> = cuts.iter().map(|c| rest + c.index(end - rest + 1))
                .collect();
            points.sort_unstable();
            let mut at = rest;
            for p in points {
                icrc.update(&pkt[at..p]);
                at = p;
            }
            icrc.update(&pkt[at..end]);
            prop_assert_eq!(icrc.finish(), icrc_reference(&pkt));
            prop_assert_eq!(compute(&pkt), Some(icrc_reference(&pkt)));
        }
    }
}
