//! Invalidate Extended Transport Header (IBTA vol. 1, 9.3.6).
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                         R_Key (32)                            |
//! +---------------------------------------------------------------+
//! ```
//!
//! Carried by SEND LAST/ONLY WITH INVALIDATE: the responder invalidates the named R_Key.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{RKey, Result};

mod field {
    use core::ops::Range;

    pub(super) const RKEY: Range<usize> = 0..4;
}

/// Length of the IETH.
pub const HEADER_LEN: usize = field::RKEY.end;

header_view! {
    /// A read/write view of an IETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> RKey {
        RKey::new(be::u32(&self.buffer.as_ref()[field::RKEY]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: RKey) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], v.value());
    }
}

/// The IETH as a plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: RKey,
}

impl Repr {
    /// Parses an IETH.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            rkey: packet.rkey(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_rkey(self.rkey);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IETH rkey={}", self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct_parse_emit() {
        static BYTES: [u8; 4] = [0x00, 0x00, 0x12, 0x34];
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.rkey(), RKey::new(0x1234));
        let repr = Repr {
            rkey: RKey::new(0x1234),
        };
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr));
        let mut buf = [0xa5u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
}
