//! The reserved body of a RoCEv2 Congestion Notification Packet (RoCEv2 annex A17.9.3).
//!
//! ```text
//! BTH (opcode 0x81, BECN=1, P_Key 0xFFFF, DestQP = the flow's sender QP, PSN 0)
//! +---------------------------------------------------------------+
//! |                     reserved (16 bytes)                       |
//! +---------------------------------------------------------------+
//! ICRC
//! ```
//!
//! The 16 bytes are written as zero and ignored on read (a ConnectX-4 Lx sends zeros).

use core::fmt;

use crate::macros::header_view;
use crate::Result;

mod field {
    use core::ops::Range;

    pub(super) const RESERVED: Range<usize> = 0..16;
}

/// Length of the CNP body.
pub const HEADER_LEN: usize = field::RESERVED.end;

header_view! {
    /// A view of the 16 reserved bytes of a CNP.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved bytes.
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[field::RESERVED]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Zeroes the reserved bytes.
    pub fn clear(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }
}

/// The CNP body: nothing but reserved bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Repr;

impl Repr {
    /// Parses the CNP body; the reserved bytes are deliberately not checked.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self)
    }
    /// The length of the emitted body.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes 16 zero bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.clear();
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CNP")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit() {
        let mut buf = [0xa5u8; 16];
        Repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, [0u8; 16]);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(Repr));
        assert!(Packet::new_checked(&buf[..15]).is_err());
    }
}
