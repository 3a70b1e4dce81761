//! Datagram Extended Transport Header (IBTA vol. 1, 9.3.2; rxe_hdr.h `struct rxe_deth`).
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                          Q_Key (32)                           |
//! +---------------+-----------------------------------------------+
//! |  reserved (8) |                  SrcQP (24)                   |
//! +---------------+-----------------------------------------------+
//! ```
//!
//! Carried by every UD packet. The reserved byte is ignored on read and written as zero.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{QKey, Qpn, Result};

mod field {
    use core::ops::Range;

    pub(super) const QKEY: Range<usize> = 0..4;
    pub(super) const SRC_QP: Range<usize> = 5..8;
}

/// Length of the DETH.
pub const HEADER_LEN: usize = field::SRC_QP.end;

header_view! {
    /// A read/write view of a DETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The Q_Key.
    pub fn qkey(&self) -> QKey {
        QKey::new(be::u32(&self.buffer.as_ref()[field::QKEY]))
    }
    /// The sender's QPN.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(be::u24(&self.buffer.as_ref()[field::SRC_QP]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: QKey) {
        be::set_u32(&mut self.buffer.as_mut()[field::QKEY], v.value());
    }
    /// Sets the source QPN and clears the reserved byte.
    pub fn set_src_qp(&mut self, v: Qpn) {
        self.buffer.as_mut()[field::SRC_QP.start - 1] = 0;
        be::set_u24(&mut self.buffer.as_mut()[field::SRC_QP], v.value());
    }
}

/// The DETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key.
    pub qkey: QKey,
    /// Source QP.
    pub src_qp: Qpn,
}

impl Repr {
    /// Parses a DETH. The Q_Key is compared by the UD queue pair, not here.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_qkey(self.qkey);
        packet.set_src_qp(self.src_qp);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DETH qkey={} src_qp={}", self.qkey, self.src_qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x13];
    const REPR: Repr = Repr {
        qkey: QKey::new(0x1111_1111),
        src_qp: Qpn::new(0x13),
    };

    #[test]
    fn deconstruct_construct_parse_emit() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.qkey(), p.src_qp()), (REPR.qkey, REPR.src_qp));
        let mut buf = [0xa5u8; 8];
        let mut q = Packet::new_unchecked(&mut buf[..]);
        q.set_qkey(REPR.qkey);
        q.set_src_qp(REPR.src_qp);
        assert_eq!(buf, BYTES);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(REPR));
        let mut buf = [0xa5u8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Packet::new_checked(&BYTES[..7]).is_err());
    }
}
