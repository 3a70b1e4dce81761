//! Immediate Data Extended Transport Header (IBTA vol. 1, 9.3.4).
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                    Immediate Data (32)                        |
//! +---------------------------------------------------------------+
//! ```
//!
//! Opaque 32 bits handed to the receiver as is, on SEND/WRITE ... WITH_IMMEDIATE.

use core::fmt;

use crate::macros::{be, header_view};
use crate::Result;

mod field {
    use core::ops::Range;

    pub(super) const DATA: Range<usize> = 0..4;
}

/// Length of the ImmDt.
pub const HEADER_LEN: usize = field::DATA.end;

header_view! {
    /// A read/write view of an ImmDt.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate data, in network order as a `u32` (verbs hands it over unchanged).
    pub fn data(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate data.
    pub fn set_data(&mut self, v: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::DATA], v);
    }
}

/// The ImmDt as a plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Immediate data.
    pub data: u32,
}

impl Repr {
    /// Parses an ImmDt.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            data: packet.data(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_data(self.data);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImmDt {:#010x}", self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct_parse_emit() {
        static BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.data(), 0xdead_beef);
        let repr = Repr { data: 0xdead_beef };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr));
        let mut buf = [0xa5u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Packet::new_checked(&BYTES[..3]).is_err());
    }
}
