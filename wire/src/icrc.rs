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

#[cfg(feature = "alloc")]
use alloc::{boxed::Box, collections::BTreeMap, vec::Vec};

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
        if let (Ok(ip), Ok(udp), Ok(bth)) =
            (ip_header.try_into(), udp_header.try_into(), bth.try_into())
        {
            // IPv4 without options, every packet rocectl sends or receives over a UDP socket.
            return Some(Self::start_ipv4(ip, udp, bth));
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

    /// [`Self::start`] for IPv4 without options: the 40 masked bytes are built as two 16-byte
    /// words and one 8-byte word and stored whole, so the CRC's 16-byte loads are forwarded
    /// from single stores instead of waiting on a dozen small ones (measured 5 ns a packet).
    fn start_ipv4(ip: &[u8; 20], udp: &[u8; UDP_HEADER], bth: &[u8; bth::HEADER_LEN]) -> Self {
        Self::start_ipv4_with_flags(ip, udp, bth, None)
    }

    /// [`Self::start_ipv4`], with IPv4 bytes 4..8 (Identification, flags, fragment offset)
    /// taken from `ident_flags` instead of `ip` when given (the ident solver's zero
    /// Identification with DF, without copying the header first).
    fn start_ipv4_with_flags(
        ip: &[u8; 20],
        udp: &[u8; UDP_HEADER],
        bth: &[u8; bth::HEADER_LEN],
        ident_flags: Option<[u8; 4]>,
    ) -> Self {
        let i0: [u8; 16] = core::array::from_fn(|k| ip[k]);
        let i1 = [ip[16], ip[17], ip[18], ip[19]];
        let mut a = u128::from_le_bytes(i0);
        if let Some(f) = ident_flags {
            a = a & !(0xFFFF_FFFF << 32) | u128::from(u32::from_le_bytes(f)) << 32;
        }
        // IPv4 bytes 1 (TOS), 8 (TTL), 10-11 (header checksum).
        let a = a | 0xFF << 8 | 0xFF << 64 | 0xFFFF << 80;
        // IPv4 16..20, UDP 0..8 (bytes 6-7: checksum), BTH 0..4.
        let b = u128::from(u32::from_le_bytes(i1))
            | u128::from(u64::from_le_bytes(*udp)) << 32
            | u128::from(u32::from_le_bytes([bth[0], bth[1], bth[2], bth[3]])) << 96
            | 0xFFFF << 80;
        // BTH 4..12 (byte 4: FECN, BECN, resv6).
        let c = u64::from_le_bytes([
            bth[4], bth[5], bth[6], bth[7], bth[8], bth[9], bth[10], bth[11],
        ]) | 0xFF;
        let mut prefix = [0u8; 40];
        prefix[..16].copy_from_slice(&a.to_le_bytes());
        prefix[16..32].copy_from_slice(&b.to_le_bytes());
        prefix[32..].copy_from_slice(&c.to_le_bytes());
        let mut hasher = crc32fast::Hasher::new_with_initial(CRC_OF_LRH_PLACEHOLDER);
        hasher.update(&prefix);
        Self { hasher }
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

/// Recovers the IPv4 Identification of a received packet from its ICRC.
///
/// A UDP socket never sees the IP header, but the ICRC covers its Identification (16 bits) and
/// flags, and Linux rdma_rxe sends a different Identification in every packet. CRC-32 is affine
/// over GF(2): for messages of equal length, `crc(m ^ e) = crc(m) ^ crc(e) ^ crc(0)`. So with
/// the Identification set to zero, the received ICRC differs from the computed one by a linear
/// combination of 16 fixed 32-bit vectors that depend only on the packet length. The solver
/// computes those vectors once per length (cached), reduces them to echelon form, and solves
/// for the Identification in at most 16 steps.
///
/// The flags are **not** unknowns: every RoCEv2 sender sets DF (rxe, ConnectX, rocectl) and
/// never fragments, so the solver takes DF = 1, MF = 0, fragment offset 0 and the reserved bit
/// 0. A packet sent without DF, fragmented, or carrying IP options does not solve.
///
/// # How strong the check is
///
/// The 16 vectors span a 16-dimensional subspace of the 2^32 possible differences, so a packet
/// corrupted anywhere else solves (to a uniformly random Identification) with probability
/// 2^16 / 2^32 = 2^-16, against 2^-32 for a full ICRC check. Taken alone that is too weak (a
/// single-bit error whose CRC difference lies in the subspace passes at every Identification):
/// [`Ipv4IdentChecker`] adds what is known about each peer's Identifications.
#[cfg(feature = "alloc")]
#[derive(Debug, Default)]
pub struct Ipv4IdentSolver {
    /// Echelon bases indexed by IPv4 total length.
    cache: Vec<Option<Box<IdentBasis>>>,
}

/// The 16 Identification bits' CRC contributions for one length, in echelon form.
#[cfg(feature = "alloc")]
#[derive(Debug)]
struct IdentBasis {
    /// `(pivot bit, vector, combination of Identification bits that makes it)`.
    rows: [(u32, u32, u32); 16],
}

/// Offset of the IPv4 Identification in the ICRC input (after the 8-byte LRH placeholder).
#[cfg(feature = "alloc")]
const IDENT_OFFSET: usize = 8 + 4;
/// The IPv4 flags/fragment-offset word every RoCEv2 packet carries: DF, nothing else.
#[cfg(feature = "alloc")]
const FLAGS_DF: [u8; 2] = [0x40, 0x00];
/// The longest IPv4 packet a solver caches a basis for.
#[cfg(feature = "alloc")]
const MAX_SOLVER_LEN: usize = 16 * 1024;

#[cfg(feature = "alloc")]
impl Ipv4IdentSolver {
    /// An empty solver (bases are computed on first use of each packet length).
    pub fn new() -> Self {
        Self::default()
    }

    /// Finds the Identification that makes the ICRC of `ip_packet` (an IPv4 header without
    /// options .. the end of the received ICRC) correct with DF set, MF clear and fragment
    /// offset 0, or `None` if none does (the packet is corrupt, was sent without DF, is not
    /// IPv4, is too short, or is longer than 16 KiB). The Identification, flags and
    /// fragment-offset bytes of `ip_packet` are ignored.
    ///
    /// # Fuzzing
    /// Under `cfg(fuzzing)` this returns the header's own Identification.
    pub fn solve(&mut self, ip_packet: &[u8]) -> Option<u16> {
        if ip_packet.len() < 20 + UDP_HEADER + bth::HEADER_LEN + ICRC_LEN
            || ip_packet[0] != 0x45
            || ip_packet.len() > MAX_SOLVER_LEN
        {
            return None;
        }
        if cfg!(fuzzing) {
            return Some(u16::from_be_bytes([ip_packet[4], ip_packet[5]]));
        }
        let (Some(header), Some(udp), Some(bth)) = (
            ip_packet.first_chunk::<20>(),
            ip_packet[20..].first_chunk::<UDP_HEADER>(),
            ip_packet[28..].first_chunk::<{ bth::HEADER_LEN }>(),
        ) else {
            return None;
        };
        let end = ip_packet.len() - ICRC_LEN;
        // Identification 0, DF, nothing else (written into the masked prefix directly: a copy
        // of the header patched bytewise and then loaded as words would stall).
        let [f0, f1] = FLAGS_DF;
        let mut icrc = Icrc::start_ipv4_with_flags(header, udp, bth, Some([0, 0, f0, f1]));
        icrc.update(&ip_packet[40..end]);
        let base = u32::from_le_bytes(icrc.finish());
        let mut received = [0u8; ICRC_LEN];
        received.copy_from_slice(&ip_packet[end..]);
        let mut delta = u32::from_le_bytes(received) ^ base;
        let basis = self.basis(ip_packet.len());
        let mut unknown = 0u32;
        // The basis is fully reduced (each pivot bit is set in its own row only), so whether a
        // row applies depends on the received difference alone, not on the rows applied
        // before it: the 16 steps are independent (no chain through `delta`), and branch-free
        // (which rows apply is random per packet; branches would mispredict half the time).
        let received_delta = delta;
        for &(pivot, vector, combo) in &basis.rows {
            let take = 0u32.wrapping_sub(u32::from(received_delta & pivot != 0));
            delta ^= vector & take;
            unknown ^= combo & take;
        }
        if delta != 0 {
            return None;
        }
        Some((unknown & 0xFFFF) as u16)
    }

    fn basis(&mut self, ip_len: usize) -> &IdentBasis {
        if self.cache.len() <= ip_len {
            self.cache.resize_with(ip_len + 1, || None);
        }
        self.cache[ip_len].get_or_insert_with(|| Box::new(IdentBasis::new(ip_len)))
    }
}

/// The CRC contribution of each of the 16 IPv4 Identification bits (bit `k` of the
/// Identification is element `k`) to the ICRC of an IPv4 packet `ip_len` bytes long (IP header
/// .. ICRC): flipping bit `k` flips exactly the bits of element `k` in the ICRC (as a
/// little-endian `u32` of its wire bytes).
#[cfg(feature = "alloc")]
fn ident_bit_vectors(ip_len: usize) -> [u32; 16] {
    // ICRC input: 8-byte placeholder + IP packet without the ICRC.
    let n = 8 + ip_len - ICRC_LEN;
    let zeros = [0u8; 256];
    let crc_with_bit = |byte: Option<(usize, u8)>| {
        let mut h = crc32fast::Hasher::new();
        let mut pos = 0;
        while pos < n {
            let take = (n - pos).min(zeros.len());
            match byte {
                Some((at, bit)) if at >= pos && at < pos + take => {
                    let mut chunk = [0u8; 256];
                    chunk[at - pos] = bit;
                    h.update(&chunk[..take]);
                }
                _ => h.update(&zeros[..take]),
            }
            pos += take;
        }
        h.finalize()
    };
    let zero = crc_with_bit(None);
    core::array::from_fn(|k| {
        // Bit k of the Identification (big-endian at IDENT_OFFSET).
        let (at, bit) = (IDENT_OFFSET + 1 - k / 8, 1u8 << (k % 8));
        crc_with_bit(Some((at, bit))) ^ zero
    })
}

/// Rewrites the ICRC of an outgoing IPv4 packet for another Identification, without touching
/// the rest of the packet: the sender's half of [`Ipv4IdentSolver`].
///
/// A UDP GSO message is cut into datagrams whose Identifications the kernel numbers `base`,
/// `base + 1`, ... (`inet_gso_segment`); each datagram's ICRC must be computed for its own
/// Identification. CRC-32 is affine, so for a fixed length the ICRC for Identification `b` is
/// the ICRC for `a` XOR the contributions of the bits of `a ^ b`; the 16 contributions are
/// computed once per packet length (cached, like the solver's bases), and a rewrite costs at
/// most 16 XORs.
#[cfg(feature = "alloc")]
#[derive(Debug, Default)]
pub struct Ipv4IdentPatcher {
    /// Bit contributions indexed by IPv4 total length.
    cache: Vec<Option<Box<[u32; 16]>>>,
}

#[cfg(feature = "alloc")]
impl Ipv4IdentPatcher {
    /// An empty patcher (contributions are computed on first use of each length).
    pub fn new() -> Self {
        Self::default()
    }

    /// The XOR that turns the ICRC of an IPv4 packet `ip_len` bytes long (IP header .. ICRC)
    /// sent with Identification `from` into its ICRC with Identification `to`, as the four
    /// wire bytes; `None` for a length no IPv4 RoCEv2 packet has (shorter than IP + UDP + BTH
    /// + ICRC, or longer than 65,535).
    pub fn delta(&mut self, ip_len: usize, from: u16, to: u16) -> Option<[u8; ICRC_LEN]> {
        if !(20 + UDP_HEADER + bth::HEADER_LEN + ICRC_LEN..=65_535).contains(&ip_len) {
            return None;
        }
        let diff = from ^ to;
        if diff == 0 {
            return Some([0; ICRC_LEN]);
        }
        if self.cache.len() <= ip_len {
            self.cache.resize_with(ip_len + 1, || None);
        }
        let bits = self.cache[ip_len].get_or_insert_with(|| Box::new(ident_bit_vectors(ip_len)));
        let mut d = 0u32;
        for (k, v) in bits.iter().enumerate() {
            // Branch-free (the bits differ from packet to packet).
            d ^= v & 0u32.wrapping_sub(u32::from((diff >> k) & 1));
        }
        Some(d.to_le_bytes())
    }

    /// Rewrites `icrc` (the four wire bytes of a packet `ip_len` bytes long) from
    /// Identification `from` to `to`; `false` (nothing changed) for an impossible length.
    pub fn patch(&mut self, ip_len: usize, icrc: &mut [u8; ICRC_LEN], from: u16, to: u16) -> bool {
        let Some(d) = self.delta(ip_len, from, to) else {
            return false;
        };
        for (b, x) in icrc.iter_mut().zip(d) {
            *b ^= x;
        }
        true
    }
}

#[cfg(feature = "alloc")]
impl IdentBasis {
    fn new(ip_len: usize) -> Self {
        let bits = ident_bit_vectors(ip_len);
        let mut rows = [(0u32, 0u32, 0u32); 16];
        for (k, row) in rows.iter_mut().enumerate() {
            *row = (0, bits[k], 1 << k);
        }
        // Gaussian elimination: give each row a pivot bit no later row has.
        for i in 0..rows.len() {
            let (_, v, _) = rows[i];
            if v == 0 {
                continue;
            }
            let pivot = 1u32 << (31 - v.leading_zeros());
            rows[i].0 = pivot;
            for j in 0..rows.len() {
                if j != i && rows[j].1 & pivot != 0 {
                    rows[j].1 ^= rows[i].1;
                    rows[j].2 ^= rows[i].2;
                }
            }
        }
        Self { rows }
    }
}

/// The receive check for IPv4 packets whose IP header was not seen (a UDP socket): the
/// [`Ipv4IdentSolver`] plus what each peer's Identifications have shown so far.
///
/// # Read first: the bound
///
/// A corrupted packet (a CRC difference that is random to us) gets through with probability
/// at most:
///
/// | peer state | accepted if the solved Identification | false accept |
/// |---|---|---|
/// | **zero** (rocectl; kernels sending ID 0 with DF) | is below `gso_span` | 2^-32 x `gso_span` |
/// | **window** (rdma_rxe: `__ip_select_ident`) | is in `[last-behind, last+ahead']` | see below |
/// | first packet from a peer | exists | 2^-16 |
///
/// In window mode: 2^-16 x (behind + ahead' + 1) / 2^16.
///
/// `ahead' = ahead + ahead_per_ms x (ms since the peer's last accepted packet)`: Linux adds a
/// random step up to the jiffies elapsed since a counter was last used. With the defaults
/// (`behind` 64, `ahead` 256, 1 per ms) an active flow is at 2^-16 x 321/65536 ~ 2^-23.7,
/// about one corrupted packet in 14 million; after a second of silence 2^-16 x 1321/65536 ~
/// 2^-21.6. For comparison, the backends that see the IP header (`raw`; `udp` with its raw
/// receive socket) get the full 2^-32, and zero-Identification peers 2^-32 x `gso_span`
/// (2^-26 with the default 64): a sender of UDP GSO messages from an unconnected socket with
/// DF (rocectl) sends Identification 0 in every single datagram and `0, 1, .., n-1` in the
/// `n` datagrams the kernel cuts a GSO message into (`inet_gso_segment`), so a zero peer is
/// held to `0..gso_span`.
///
/// **Single-bit errors.** CRC-32 catches every single-bit error when the Identification is
/// known, so zero peers and a full check always catch them. In window mode a flipped bit whose
/// CRC difference lies in the 16-dimensional Identification subspace (about `8 x len / 2^16` of
/// the bit positions of a `len`-byte packet) makes the packet solve to `true ID ^ d` for a
/// fixed `d`; it is caught unless that lands in the window, i.e. unless `d` is small (about
/// `(behind + ahead') / 2^16` of those positions). `wire/tests/ident_check.rs` measures both.
///
/// # How a peer is tracked
///
/// - A peer (source address: Linux keys its Identification counters by source, destination
///   and protocol, so every flow from a host to us shares one) starts in window mode at its
///   first packet.
/// - After `zero_after` packets with Identification 0, with nothing but Identifications below
///   `gso_span` between them (GSO segments), it is held to `0..gso_span` (zero mode). A
///   counting peer (rdma_rxe) passes through 0 once per 65,536 packets, so it never gets
///   there.
/// - Reordering is covered by `behind`, loss and other traffic from the peer by `ahead'`.
///   A packet outside the window (the peer sent a burst of other UDP to us, or restarted as
///   another stack) is rejected but remembered as a *candidate*; the next packet within
///   `ahead` after the candidate (within a second) re-anchors the window and is accepted. A
///   zero peer whose packets stop solving to 0 leaves zero mode the same way. So a change of
///   sender costs one dropped packet (which RC retransmits), and one corrupted packet can
///   only move the window if another corrupted packet lands right after it (2^-16 x 2^-16 x
///   ahead / 2^16).
/// - At most `max_peers` peers are tracked; the least recently seen is forgotten first.
#[cfg(feature = "alloc")]
#[derive(Debug)]
pub struct Ipv4IdentChecker {
    solver: Ipv4IdentSolver,
    policy: IdentPolicy,
    peers: BTreeMap<[u8; 4], Peer>,
}

/// The knobs of an [`Ipv4IdentChecker`] (see its table for what they cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdentPolicy {
    /// Packets with Identification 0 (only Identifications below `gso_span` between them)
    /// after which a peer is held to `0..gso_span`.
    pub zero_after: u32,
    /// A zero peer's accepted Identifications: `0..gso_span` (the segments of one UDP GSO
    /// message are numbered from 0; at most 64 segments per message). 1 holds it to 0.
    pub gso_span: u16,
    /// Identifications accepted behind the last accepted one (reordering).
    pub behind: u16,
    /// Identifications accepted ahead of the last accepted one (loss, other traffic).
    pub ahead: u16,
    /// Extra `ahead` per millisecond since the peer's last accepted packet (Linux HZ <= 1000).
    pub ahead_per_ms: u16,
    /// Most peers tracked at once.
    pub max_peers: usize,
}

impl Default for IdentPolicy {
    fn default() -> Self {
        Self {
            zero_after: 8,
            gso_span: 64,
            behind: 64,
            ahead: 256,
            ahead_per_ms: 1,
            max_peers: 4_096,
        }
    }
}

/// What [`Ipv4IdentChecker::check`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentVerdict {
    /// Accepted with this Identification.
    Accept(u16),
    /// No Identification (with DF) makes the ICRC right.
    NoSolution,
    /// It solves, but not to an Identification this peer would send now.
    Implausible(u16),
}

/// How the Identifications of one peer are checked.
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Near the last accepted; `zeros` zeros so far (with only GSO segment numbers between).
    Window { zeros: u32 },
    /// Always below `gso_span` (0 for single datagrams, the segment number in GSO messages).
    Zero,
}

#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug)]
struct Peer {
    mode: Mode,
    last: u16,
    last_ns: u64,
    /// An implausible Identification and when it came (a possible re-anchor).
    candidate: Option<(u16, u64)>,
}

/// How long a candidate stays good for a re-anchor.
#[cfg(feature = "alloc")]
const CANDIDATE_NS: u64 = 1_000_000_000;

#[cfg(feature = "alloc")]
impl Ipv4IdentChecker {
    /// A checker with `policy`.
    pub fn new(policy: IdentPolicy) -> Self {
        Self {
            solver: Ipv4IdentSolver::new(),
            policy,
            peers: BTreeMap::new(),
        }
    }

    /// Checks one packet: `ip_packet` as for [`Ipv4IdentSolver::solve`] (its source address
    /// names the peer), `now_ns` a monotonic clock in nanoseconds.
    pub fn check(&mut self, ip_packet: &[u8], now_ns: u64) -> IdentVerdict {
        let Some(id) = self.solver.solve(ip_packet) else {
            return IdentVerdict::NoSolution;
        };
        let mut src = [0u8; 4];
        src.copy_from_slice(&ip_packet[12..16]);
        let p = self.policy;
        let Some(peer) = self.peers.get_mut(&src) else {
            if self.peers.len() >= p.max_peers {
                let oldest = self
                    .peers
                    .iter()
                    .min_by_key(|(_, v)| v.last_ns)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.peers.remove(&k);
                }
            }
            let peer = Peer {
                mode: Mode::Window {
                    zeros: u32::from(id == 0),
                },
                last: id,
                last_ns: now_ns,
                candidate: None,
            };
            self.peers.insert(src, peer);
            return IdentVerdict::Accept(id);
        };
        let plausible = match peer.mode {
            Mode::Zero => id < p.gso_span.max(1),
            Mode::Window { .. } => {
                let ms = now_ns.saturating_sub(peer.last_ns) / 1_000_000;
                let ahead = (u64::from(p.ahead) + ms * u64::from(p.ahead_per_ms))
                    .min(u64::from(u16::MAX - p.behind)) as u16;
                let fwd = id.wrapping_sub(peer.last);
                fwd <= ahead || peer.last.wrapping_sub(id) <= p.behind
            }
        };
        let reanchor = !plausible
            && peer.candidate.is_some_and(|(c, at)| {
                let fwd = id.wrapping_sub(c);
                now_ns.saturating_sub(at) <= CANDIDATE_NS && fwd >= 1 && fwd <= p.ahead
            });
        if !plausible && !reanchor {
            peer.candidate = Some((id, now_ns));
            return IdentVerdict::Implausible(id);
        }
        peer.candidate = None;
        if reanchor {
            peer.mode = Mode::Window { zeros: 0 };
            peer.last = id;
        } else if let Mode::Window { zeros } = &mut peer.mode {
            *zeros = if id == 0 {
                *zeros + 1
            } else if id < p.gso_span {
                *zeros
            } else {
                0
            };
            let z = *zeros;
            if id.wrapping_sub(peer.last) < 0x8000 {
                peer.last = id;
            }
            if z >= p.zero_after {
                peer.mode = Mode::Zero;
            }
        }
        peer.last_ns = now_ns;
        IdentVerdict::Accept(id)
    }

    /// Whether the peer `src` is held to Identifications below `gso_span` (zero mode).
    pub fn is_zero_peer(&self, src: [u8; 4]) -> bool {
        self.peers.get(&src).is_some_and(|p| p.mode == Mode::Zero)
    }

    /// The number of peers tracked.
    pub fn peers(&self) -> usize {
        self.peers.len()
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

    #[cfg(feature = "alloc")]
    /// The solver's shortcut (each row's use decided by the received difference alone) needs
    /// a fully reduced basis: every pivot bit set in its own row and in no other.
    #[test]
    fn ident_basis_is_fully_reduced() {
        for ip_len in [44, 45, 64, 100, 1_068, 4_140, 9_000, 16_384] {
            let basis = IdentBasis::new(ip_len);
            let mut pivots = 0;
            for (i, &(pivot, vector, _)) in basis.rows.iter().enumerate() {
                if pivot == 0 {
                    assert_eq!(vector, 0, "length {ip_len}: a row without pivot is zero");
                    continue;
                }
                pivots += 1;
                assert_eq!(pivot.count_ones(), 1);
                assert_ne!(vector & pivot, 0, "length {ip_len}: row {i} has its pivot");
                for (j, &(_, other, _)) in basis.rows.iter().enumerate() {
                    if j != i {
                        assert_eq!(other & pivot, 0, "length {ip_len}: row {j} has pivot {i}");
                    }
                }
            }
            assert_eq!(pivots, 16, "length {ip_len}: the 16 bits are independent");
        }
    }

    proptest! {
        #[test]
        fn ident_solver_recovers_ident_with_df_only(
            ident in any::<u16>(), df in any::<bool>(), payload in proptest::collection::vec(any::<u8>(), 0..2048),
            flip in any::<usize>(),
        ) {
            let mut pkt = Vec::new();
            let total = 20 + 8 + 12 + payload.len() + 4;
            pkt.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8]);
            pkt.extend_from_slice(&ident.to_be_bytes());
            pkt.extend_from_slice(&[if df { 0x40 } else { 0 }, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
            let udp_len = total - 20;
            pkt.extend_from_slice(&[0xC0, 0x01, 0x12, 0xB7, (udp_len >> 8) as u8, udp_len as u8, 0, 0]);
            pkt.extend_from_slice(&[0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 0, 1]);
            pkt.extend_from_slice(&payload);
            pkt.extend_from_slice(&[0; 4]);
            let icrc = compute(&pkt).unwrap();
            let end = pkt.len() - 4;
            pkt[end..].copy_from_slice(&icrc);
            let mut solver = Ipv4IdentSolver::new();
            // The header's own Identification and flags are ignored.
            let mut hidden = pkt.clone();
            hidden[4..8].fill(0);
            // Only DF packets solve: every RoCEv2 sender sets DF.
            prop_assert_eq!(solver.solve(&hidden), df.then_some(ident));
            // One flipped bit after the IP header is caught (CRC-32 detects every single-bit
            // error, so no Identification makes it valid with the true one), except in BTH
            // byte 4, which the ICRC masks.
            let pos = 28 + flip % (pkt.len() - 28 - 4);
            if pos != 28 + 4 {
                hidden[pos] ^= 0x01;
                let got = solver.solve(&hidden);
                prop_assert!(got != Some(ident));
            }
        }
    }
}
