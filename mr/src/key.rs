//! Keys and handles: [`Key`], [`Pd`], [`MwType`], [`Origin`].

use core::fmt;

use roce_wire::{LKey, Qpn, RKey};

/// A 32-bit L_Key / R_Key: `(table index << 8) | 8-bit key`, as in rxe (`rxe_mr_init`).
///
/// The table's own name for a key: one registration's lkey and rkey are the same value, so a
/// [`Key`] converts from and to `roce-wire`'s [`LKey`] and [`RKey`] ([`lkey`](Self::lkey),
/// [`rkey`](Self::rkey)).
///
/// A memory region's lkey and rkey are the same value. The table finds the object by
/// [`index`](Self::index) in O(1) and then requires the whole 32-bit value to match. The low
/// byte changes every time the table reuses an index, so a key from an earlier registration of
/// the index never reaches the new object. Fast registration and memory-window binds let the
/// consumer choose the low byte (IBTA: it is "consumer owned").
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u32);

impl Key {
    /// Builds a key from a 24-bit table index and an 8-bit key; index bits above 24 are dropped.
    pub const fn new(index: u32, key8: u8) -> Self {
        Self(((index & 0x00FF_FFFF) << 8) | key8 as u32)
    }

    /// The table index (upper 24 bits).
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The 8-bit key (low byte).
    pub const fn key8(self) -> u8 {
        (self.0 & 0xFF) as u8
    }

    /// The same index with another 8-bit key (what `ibv_inc_rkey` and fast-reg produce).
    pub const fn with_key8(self, key8: u8) -> Self {
        Self((self.0 & !0xFF) | key8 as u32)
    }
}

impl From<u32> for Key {
    fn from(raw: u32) -> Self {
        Self(raw)
    }
}

impl From<Key> for u32 {
    fn from(key: Key) -> Self {
        key.0
    }
}

impl From<LKey> for Key {
    fn from(lkey: LKey) -> Self {
        Self(lkey.value())
    }
}

impl From<RKey> for Key {
    fn from(rkey: RKey) -> Self {
        Self(rkey.value())
    }
}

impl Key {
    /// This key as the L_Key a local scatter/gather entry carries.
    pub const fn lkey(self) -> LKey {
        LKey::new(self.0)
    }

    /// This key as the R_Key a peer presents in a RETH, AtomicETH or IETH.
    pub const fn rkey(self) -> RKey {
        RKey::new(self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Key({:#010x}: index={} key={:#04x})",
            self.0,
            self.index(),
            self.key8()
        )
    }
}

/// A protection domain, allocated by [`MrTable::alloc_pd`](crate::MrTable::alloc_pd).
///
/// A queue pair, every region and every window belongs to exactly one PD; an access succeeds only
/// when the key's object is in the PD of the queue pair that uses it. PD numbers are never reused
/// by one table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pd(pub(crate) u32);

impl Pd {
    /// The PD number (for logs and stats).
    pub const fn number(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pd({})", self.0)
    }
}

/// Memory window type (`enum ibv_mw_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum MwType {
    /// Type 1: bound by the `ibv_bind_mw` verb, unbound by binding with length 0, never
    /// invalidated by LOCAL_INV or SEND_WITH_INVALIDATE.
    Type1,
    /// Type 2 (2B as in rxe): bound by a BIND_MW work request to one queue pair, usable only by
    /// that queue pair, invalidated by LOCAL_INV or SEND_WITH_INVALIDATE.
    Type2,
}

/// Who presents a key to [`MrTable::check`](crate::MrTable::check).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Origin {
    /// A local SGE of a work request (lkey): gather for SEND/WRITE, scatter for receives, READ
    /// responses and atomic results.
    Local,
    /// A peer's RDMA WRITE, READ or atomic (rkey), arriving on queue pair `qpn`.
    Remote {
        /// The local queue pair number the request arrived on (type 2 windows check it).
        qpn: Qpn,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let k = Key::new(0x12_3456, 0xAB);
        assert_eq!(k.0, 0x1234_56AB);
        assert_eq!(k.index(), 0x12_3456);
        assert_eq!(k.key8(), 0xAB);
        assert_eq!(k.with_key8(1).0, 0x1234_5601);
        assert_eq!(Key::new(0x0100_0001, 0).index(), 1);
        assert_eq!(k.to_string(), "0x123456ab");
        assert_eq!(k.lkey(), LKey::new(0x1234_56AB));
        assert_eq!(k.rkey().index(), k.index());
        assert_eq!(Key::from(k.rkey()), k);
        assert_eq!(Key::from(k.lkey()), k);
    }
}
