//! Flush Extended Transport Header (IBTA vol. 1 annex A19; rxe_hdr.h `feth_init`).
//!
//! ```text
//! +-----------------------------------------------------+---+-----+
//! |                    reserved (26)                    |Sel| PLT |
//! +-----------------------------------------------------+---+-----+
//! ```
//!
//! PLT (bits 3-0): placement type, 1 global visibility, 2 persistence. Sel (bits 5-4):
//! selectivity, 0 the address range of the RETH, 1 the whole memory region. The reserved bits
//! are ignored on read and written as zero.

use core::fmt;

use crate::macros::{be, header_view};
use crate::Result;

mod field {
    use core::ops::Range;

    pub(super) const WORD: Range<usize> = 0..4;
    pub(super) const PLT: u32 = 0x0000_000F;
    pub(super) const SEL: u32 = 0x0000_0030;
    pub(super) const SEL_SHIFT: u32 = 4;
}

/// Length of the FETH.
pub const HEADER_LEN: usize = field::WORD.end;

header_view! {
    /// A read/write view of a FETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The placement type.
    pub fn placement(&self) -> u8 {
        (be::u32(&self.buffer.as_ref()[field::WORD]) & field::PLT) as u8
    }
    /// The selectivity level.
    pub fn selectivity(&self) -> u8 {
        ((be::u32(&self.buffer.as_ref()[field::WORD]) & field::SEL) >> field::SEL_SHIFT) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets placement and selectivity, clearing the reserved bits.
    pub fn set_fields(&mut self, placement: u8, selectivity: u8) {
        let word = (u32::from(placement) & field::PLT)
            | ((u32::from(selectivity) << field::SEL_SHIFT) & field::SEL);
        be::set_u32(&mut self.buffer.as_mut()[field::WORD], word);
    }
}

/// The FETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Placement type (4 bits).
    pub placement: u8,
    /// Selectivity level (2 bits).
    pub selectivity: u8,
}

impl Repr {
    /// Parses a FETH.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            placement: packet.placement(),
            selectivity: packet.selectivity(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_fields(self.placement, self.selectivity);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FETH plt={} sel={}", self.placement, self.selectivity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct_parse_emit() {
        static BYTES: [u8; 4] = [0, 0, 0, 0x12];
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.placement(), p.selectivity()), (2, 1));
        let repr = Repr {
            placement: 2,
            selectivity: 1,
        };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr));
        let mut buf = [0xa5u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
}
