//! Access flags (`enum ibv_access_flags`), IBTA 10.6.3.

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

/// A set of access rights, with the same bit values as ibverbs `ibv_access_flags`.
///
/// Local read access is always implied and has no bit. The verbs rule holds at registration:
/// [`REMOTE_WRITE`](Self::REMOTE_WRITE) or [`REMOTE_ATOMIC`](Self::REMOTE_ATOMIC) requires
/// [`LOCAL_WRITE`](Self::LOCAL_WRITE) (ib_verbs.h `ib_check_mr_access`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// The local HCA may write the memory (receive buffers, READ destinations, atomic results).
    pub const LOCAL_WRITE: Self = Self(0x01);
    /// A peer may RDMA WRITE the memory.
    pub const REMOTE_WRITE: Self = Self(0x02);
    /// A peer may RDMA READ the memory.
    pub const REMOTE_READ: Self = Self(0x04);
    /// A peer may run 8-byte atomics on the memory.
    pub const REMOTE_ATOMIC: Self = Self(0x08);
    /// Memory windows may be bound to this memory region.
    pub const MW_BIND: Self = Self(0x10);
    /// Remote addresses are offsets from the start of the region or window (its IOVA is 0).
    pub const ZERO_BASED: Self = Self(0x20);
    /// A peer may FLUSH the memory to global visibility (`IBV_ACCESS_FLUSH_GLOBAL`, IBTA 1.5).
    pub const FLUSH_GLOBAL: Self = Self(0x100);
    /// A peer may FLUSH the memory to persistence (`IBV_ACCESS_FLUSH_PERSISTENT`, IBTA 1.5).
    pub const FLUSH_PERSISTENT: Self = Self(0x200);

    /// Every bit this crate understands.
    pub const ALL: Self = Self(0x33F);
    /// Bits that a peer exercises: what a memory window may grant.
    pub const REMOTE: Self = Self(0x02 | 0x04 | 0x08);

    /// No rights beyond local read.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// Builds a set from raw ibverbs bits; `None` if a bit outside [`ALL`](Self::ALL) is set.
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// The raw ibverbs bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether `self` and `other` share a right.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Union of two sets (usable in `const` context).
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The verbs registration rule: remote write or atomic access needs local write access.
    pub const fn is_consistent(self) -> bool {
        !self.intersects(Self::REMOTE_WRITE.union(Self::REMOTE_ATOMIC))
            || self.contains(Self::LOCAL_WRITE)
    }
}

impl BitOr for Access {
    type Output = Self;

    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Access {
    type Output = Self;

    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

const NAMES: [(Access, &str); 8] = [
    (Access::LOCAL_WRITE, "LOCAL_WRITE"),
    (Access::REMOTE_WRITE, "REMOTE_WRITE"),
    (Access::REMOTE_READ, "REMOTE_READ"),
    (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
    (Access::MW_BIND, "MW_BIND"),
    (Access::ZERO_BASED, "ZERO_BASED"),
    (Access::FLUSH_GLOBAL, "FLUSH_GLOBAL"),
    (Access::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
];

impl fmt::Display for Access {
    /// `LOCAL_WRITE|REMOTE_READ`, or `-` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let unknown = self.0 & !Self::ALL.0;
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({:#x}: {self})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_ibverbs() {
        assert_eq!(Access::LOCAL_WRITE.bits(), 1);
        assert_eq!(Access::REMOTE_WRITE.bits(), 2);
        assert_eq!(Access::REMOTE_READ.bits(), 4);
        assert_eq!(Access::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(Access::MW_BIND.bits(), 0x10);
        assert_eq!(Access::ZERO_BASED.bits(), 0x20);
        assert_eq!(Access::FLUSH_GLOBAL.bits(), 0x100);
        assert_eq!(Access::FLUSH_PERSISTENT.bits(), 0x200);
        assert_eq!(Access::from_bits(0x40), None);
        assert_eq!(Access::from_bits(0x80), None);
        assert_eq!(Access::from_bits(0x33F), Some(Access::ALL));
    }

    #[test]
    fn consistency_rule() {
        assert!(Access::empty().is_consistent());
        assert!(Access::REMOTE_READ.is_consistent());
        assert!(!Access::REMOTE_WRITE.is_consistent());
        assert!(!Access::REMOTE_ATOMIC.is_consistent());
        assert!((Access::REMOTE_WRITE | Access::LOCAL_WRITE).is_consistent());
        assert!((Access::REMOTE_ATOMIC | Access::LOCAL_WRITE).is_consistent());
    }

    #[test]
    fn display() {
        assert_eq!(Access::empty().to_string(), "-");
        assert_eq!(
            (Access::LOCAL_WRITE | Access::REMOTE_READ).to_string(),
            "LOCAL_WRITE|REMOTE_READ"
        );
        assert_eq!(format!("{:?}", Access::MW_BIND), "Access(0x10: MW_BIND)");
    }
}
