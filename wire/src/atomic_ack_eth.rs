//! Atomic Acknowledge Extended Transport Header (IBTA vol. 1, 9.3.5.3).
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                 Original Remote Data (64)                     |
//! +---------------------------------------------------------------+
//! ```
//!
//! Follows the AETH in an ATOMIC ACKNOWLEDGE: the value the word held before the atomic.

use core::fmt;

use crate::macros::{be, header_view};
use crate::Result;

mod field {
    use core::ops::Range;

    pub(super) const ORIG: Range<usize> = 0..8;
}

/// Length of the AtomicAckETH.
pub const HEADER_LEN: usize = field::ORIG.end;

header_view! {
    /// A read/write view of an AtomicAckETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The original value of the remote word.
    pub fn orig(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original value.
    pub fn set_orig(&mut self, v: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::ORIG], v);
    }
}

/// The AtomicAckETH as a plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Original remote data.
    pub orig: u64,
}

impl Repr {
    /// Parses an AtomicAckETH.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            orig: packet.orig(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_orig(self.orig);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicAckETH orig={:#x}", self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct_parse_emit() {
        static BYTES: [u8; 8] = [0, 0, 0, 0, 0, 0, 0x01, 0x02];
        assert_eq!(Packet::new_checked(&BYTES[..]).unwrap().orig(), 0x102);
        let repr = Repr { orig: 0x102 };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr));
        let mut buf = [0xa5u8; 8];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
}
