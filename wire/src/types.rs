//! Domain newtypes for the fields of the transport headers.
//!
//! Every getter of the wire layer returns one of these rather than a bare integer, so a PSN can
//! never be passed where a QPN is expected. The 24-bit types mask their value on construction:
//! the upper 8 bits of the `u32` are always zero.

use core::fmt;

const MASK_24: u32 = 0x00FF_FFFF;

/// Packet sequence number: 24 bits, modulo 2^24.
///
/// # Ordering rule
///
/// PSNs wrap, so they have no total order. Two PSNs are compared within a half window of 2^23
/// (IBTA 9.7.1, rxe `psn_compare`): `a` is *after* `b` when `(a - b) mod 2^24` lies in
/// `1..2^23`, *before* `b` when it lies in `2^23..2^24`, and equal when it is 0. The distance
/// [`Psn::diff`] is that difference as a signed number in `-2^23..2^23`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN value.
    pub const MAX: u32 = MASK_24;
    /// The size of the half window used for comparisons.
    pub const HALF_WINDOW: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `value`; the upper 8 bits are ignored.
    pub const fn new(value: u32) -> Self {
        Self(value & MASK_24)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & MASK_24)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & MASK_24)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// Signed distance `self - other` in the half window, in `-2^23..2^23`.
    pub const fn diff(self, other: Self) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: the arithmetic shift
        // sign-extends bit 23, which is exactly the half-window rule.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// `self` comes after `other` within the half window.
    pub const fn is_after(self, other: Self) -> bool {
        self.diff(other) > 0
    }

    /// `self` comes before `other` within the half window.
    pub const fn is_before(self, other: Self) -> bool {
        self.diff(other) < 0
    }

    /// `self` lies in the half-open window `lo..hi`: at or after `lo` and before `hi`, each
    /// compared within the half window (the one PSN-window test of the RC state machines:
    /// "outstanding", "acknowledged", "inside this WQE").
    ///
    /// For `hi = lo + n` with `n` below 2^23 this is `(self - lo) mod 2^24 < n`; an empty window
    /// (`hi == lo`) holds nothing.
    pub const fn in_window(self, lo: Self, hi: Self) -> bool {
        self.diff(lo) >= 0 && self.diff(hi) < 0
    }

    /// `self` lies in the closed window `first..=last`: at or after `first` and at or before
    /// `last` (the PSNs of one message or one READ), each compared within the half window.
    pub const fn in_closed_window(self, first: Self, last: Self) -> bool {
        self.diff(first) >= 0 && self.diff(last) <= 0
    }

    /// Compare within the half window (not a total order: see the type docs).
    pub const fn cmp_window(self, other: Self) -> core::cmp::Ordering {
        let d = self.diff(other);
        if d < 0 {
            core::cmp::Ordering::Less
        } else if d > 0 {
            core::cmp::Ordering::Greater
        } else {
            core::cmp::Ordering::Equal
        }
    }
}

/// Message sequence number returned in every AETH: 24 bits, modulo 2^24, same window rule as
/// [`Psn`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Msn(u32);

impl Msn {
    /// An MSN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Self {
        Self(value & MASK_24)
    }
    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & MASK_24)
    }
    /// Signed distance `self - other` in the half window.
    pub const fn diff(self, other: Self) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
}

/// Queue pair number: 24 bits. QPN 1 is the GSI (CM MADs); 0xFF_FFFF is multicast.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// The general services interface QP (connection management MADs).
    pub const GSI: Self = Self(1);
    /// The multicast destination QPN.
    pub const MULTICAST: Self = Self(MASK_24);

    /// A QPN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Self {
        Self(value & MASK_24)
    }
    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
}

/// Partition key (16 bits; bit 15 = full membership).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PKey(u16);

impl PKey {
    /// The default partition key with full membership, sent by rxe in every packet.
    pub const DEFAULT: Self = Self(0xFFFF);

    /// A P_Key from its 16 bits.
    pub const fn new(value: u16) -> Self {
        Self(value)
    }
    /// The 16-bit value.
    pub const fn value(self) -> u16 {
        self.0
    }
    /// Bit 15: full member of the partition.
    pub const fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }
    /// The IBTA match rule (rxe `pkey_match`): the low 15 bits are equal and non-zero, and at
    /// least one of the two keys is a full member.
    pub const fn matches(self, other: Self) -> bool {
        let a = self.0 & 0x7FFF;
        let b = other.0 & 0x7FFF;
        a != 0 && a == b && (self.is_full_member() || other.is_full_member())
    }
}

impl Default for PKey {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Queue key of UD queue pairs (32 bits; bit 31 set = controlled Q_Key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QKey(u32);

impl QKey {
    /// The Q_Key of QP1 (GSI).
    pub const GSI: Self = Self(0x8001_0000);

    /// A Q_Key from its 32 bits.
    pub const fn new(value: u32) -> Self {
        Self(value)
    }
    /// The 32-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// Bit 31: a controlled Q_Key (privileged; in a send WR it means "use the QP's Q_Key").
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

/// Local memory key, as carried in scatter/gather entries.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LKey(u32);

/// Remote memory key, as carried in RETH, AtomicETH and IETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RKey(u32);

macro_rules! key_impl {
    ($ty:ident) => {
        impl $ty {
            /// A key from its 32 bits.
            pub const fn new(value: u32) -> Self {
                Self(value)
            }
            /// The 32-bit value.
            pub const fn value(self) -> u32 {
                self.0
            }
            /// The table index part (upper 24 bits, rxe layout).
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }
            /// The consumer-owned 8-bit key part (low byte).
            pub const fn key(self) -> u8 {
                self.0 as u8
            }
        }
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#010x})", stringify!($ty), self.0)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}
key_impl!(LKey);
key_impl!(RKey);

macro_rules! hex_fmt {
    ($ty:ident, $width:literal) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($ty), "({:#0", $width, "x})"), self.0)
            }
        }
    };
}
hex_fmt!(Psn, 8);
hex_fmt!(Msn, 8);
hex_fmt!(Qpn, 8);
hex_fmt!(PKey, 6);
hex_fmt!(QKey, 10);

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}
impl fmt::Display for QKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn psn_wraps_and_compares_in_window() {
        let max = Psn::new(Psn::MAX);
        assert_eq!(max.next(), Psn::new(0));
        assert!(Psn::new(0).is_after(max));
        assert!(max.is_before(Psn::new(0)));
        assert_eq!(Psn::new(5).diff(Psn::new(3)), 2);
        assert_eq!(Psn::new(3).diff(Psn::new(5)), -2);
        // Exactly half a window away counts as "before" (the sign bit is set).
        assert_eq!(Psn::new(Psn::HALF_WINDOW).diff(Psn::new(0)), -(1 << 23));
        assert_eq!(Psn::new(0x1FF_FFFF).value(), 0xFF_FFFF);
        assert_eq!(Psn::new(0).sub(1), max);
    }

    #[test]
    fn pkey_match_rule() {
        assert!(PKey::DEFAULT.matches(PKey::DEFAULT));
        assert!(PKey::new(0x7FFF).matches(PKey::new(0xFFFF)));
        assert!(
            !PKey::new(0x7FFF).matches(PKey::new(0x7FFF)),
            "two limited members"
        );
        assert!(
            !PKey::new(0x8000).matches(PKey::new(0x8000)),
            "zero low bits"
        );
        assert!(!PKey::new(0xFFFF).matches(PKey::new(0x8001)));
    }

    #[test]
    fn key_parts() {
        let k = RKey::new(0x0000_1234);
        assert_eq!(k.index(), 0x12);
        assert_eq!(k.key(), 0x34);
        assert_eq!(format!("{k:?}"), "RKey(0x00001234)");
        assert_eq!(format!("{:?}", Psn::new(0x2a)), "Psn(0x00002a)");
    }

    proptest! {
        #[test]
        fn psn_laws(a in 0u32..=Psn::MAX, n in 0u32..(1 << 23)) {
            let p = Psn::new(a);
            // Adding then subtracting is the identity.
            prop_assert_eq!(p.add(n).sub(n), p);
            // Moving forward by less than half a window is "after", with the exact distance.
            prop_assert_eq!(p.add(n).diff(p), n as i32);
            prop_assert_eq!(p.diff(p.add(n)), -(n as i32));
            if n > 0 {
                prop_assert!(p.add(n).is_after(p));
                prop_assert!(p.is_before(p.add(n)));
            }
            // Antisymmetry within the window.
            prop_assert_eq!(p.add(n).cmp_window(p), p.cmp_window(p.add(n)).reverse());
        }

        #[test]
        fn psn_window_laws(a in 0u32..=Psn::MAX, n in 0u32..(1 << 22), k in 0u32..(1 << 23)) {
            let lo = Psn::new(a);
            let hi = lo.add(n);
            let p = lo.add(k);
            // Below half a window, membership is the modular distance from `lo`.
            prop_assert_eq!(p.in_window(lo, hi), k < n);
            // The closed window of first..=last is the half-open one up to last + 1.
            prop_assert_eq!(p.in_closed_window(lo, hi), k <= n);
            prop_assert_eq!(p.in_closed_window(lo, hi), p.in_window(lo, hi.next()));
            // The definition: at or after lo, before hi.
            prop_assert_eq!(p.in_window(lo, hi), !p.is_before(lo) && p.is_before(hi));
            // An empty window holds nothing; a one-PSN window holds exactly its PSN.
            prop_assert!(!p.in_window(lo, lo));
            prop_assert_eq!(p.in_window(lo, lo.next()), p == lo);
            prop_assert_eq!(p.in_closed_window(lo, lo), p == lo);
        }

        #[test]
        fn newtypes_mask_to_24_bits(v in any::<u32>()) {
            prop_assert!(Psn::new(v).value() <= Psn::MAX);
            prop_assert!(Qpn::new(v).value() <= 0xFF_FFFF);
            prop_assert!(Msn::new(v).value() <= 0xFF_FFFF);
        }
    }
}
