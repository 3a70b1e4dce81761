//! Atomic Extended Transport Header (IBTA vol. 1, 9.3.3.2; rxe_hdr.h `struct rxe_atmeth`).
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                    Virtual Address (64)                       |
//! +-------------------------------+-------------------------------+
//! |            R_Key (32)         |                               |
//! +-------------------------------+                               |
//! |              Swap (CmpSwap) or Add (FetchAdd) Data (64)       |
//! +-------------------------------+-------------------------------+
//! |                     Compare Data (64)                         |
//! +---------------------------------------------------------------+
//! ```
//!
//! 28 bytes, packed: the swap/add data sits at offset 12 and the compare data at 20, so both
//! are read byte-wise. Operands travel big-endian; the 8-byte memory word is host order.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{RKey, Result};

mod field {
    use core::ops::Range;

    pub(super) const VA: Range<usize> = 0..8;
    pub(super) const RKEY: Range<usize> = 8..12;
    pub(super) const SWAP_ADD: Range<usize> = 12..20;
    pub(super) const COMPARE: Range<usize> = 20..28;
}

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = field::COMPARE.end;

header_view! {
    /// A read/write view of an AtomicETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The virtual address of the 8-byte word.
    pub fn va(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VA])
    }
    /// The remote key.
    pub fn rkey(&self) -> RKey {
        RKey::new(be::u32(&self.buffer.as_ref()[field::RKEY]))
    }
    /// The swap value (compare and swap) or the addend (fetch and add).
    pub fn swap_add(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    /// The compare value (0 for fetch and add).
    pub fn compare(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::VA], v);
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: RKey) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], v.value());
    }
    /// Sets the swap or add data.
    pub fn set_swap_add(&mut self, v: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SWAP_ADD], v);
    }
    /// Sets the compare data.
    pub fn set_compare(&mut self, v: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::COMPARE], v);
    }
}

/// The AtomicETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Swap or add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl Repr {
    /// Parses an AtomicETH. Alignment of `va` is the responder's check (NAK invalid request).
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#x} rkey={} swap_add={:#x} compare={:#x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 28] = [
        0, 0, 0x56, 0x48, 0x0e, 0xc1, 0xf0, 0x00, 0, 0, 0x0b, 0x31, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0,
        0, 0, 0, 0, 0, 2,
    ];
    const REPR: Repr = Repr {
        va: 0x5648_0ec1_f000,
        rkey: RKey::new(0xb31),
        swap_add: 1,
        compare: 2,
    };

    #[test]
    fn deconstruct_construct_parse_emit() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (p.va(), p.rkey(), p.swap_add(), p.compare()),
            (REPR.va, REPR.rkey, 1, 2)
        );
        let mut buf = [0xa5u8; 28];
        let mut q = Packet::new_unchecked(&mut buf[..]);
        q.set_va(REPR.va);
        q.set_rkey(REPR.rkey);
        q.set_swap_add(1);
        q.set_compare(2);
        assert_eq!(buf, BYTES);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(REPR));
        let mut buf = [0xa5u8; 28];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Packet::new_checked(&BYTES[..27]).is_err());
    }
}
