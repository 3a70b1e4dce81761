//! RDMA Extended Transport Header (IBTA vol. 1, 9.3.3; rxe_hdr.h `struct rxe_reth`).
//!
//! ```text
//! +-------------------------------+-------------------------------+
//! |                    Virtual Address (64)                       |
//! +-------------------------------+-------------------------------+
//! |            R_Key (32)         |        DMA Length (32)        |
//! +-------------------------------+-------------------------------+
//! ```
//!
//! Carried by RDMA WRITE FIRST/ONLY, READ REQUEST, FLUSH and ATOMIC WRITE.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{RKey, Result};

mod field {
    use core::ops::Range;

    pub(super) const VA: Range<usize> = 0..8;
    pub(super) const RKEY: Range<usize> = 8..12;
    pub(super) const DMA_LEN: Range<usize> = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = field::DMA_LEN.end;

header_view! {
    /// A read/write view of a RETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The virtual address (IOVA) at the responder.
    pub fn va(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VA])
    }
    /// The remote key.
    pub fn rkey(&self) -> RKey {
        RKey::new(be::u32(&self.buffer.as_ref()[field::RKEY]))
    }
    /// The DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::DMA_LEN])
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
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::DMA_LEN], v);
    }
}

/// The RETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// DMA length.
    pub dma_len: u32,
}

impl Repr {
    /// Parses a RETH. No field is checked here: the DMA length limit (2^31) and the rkey are
    /// the responder's business.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
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
        packet.set_dma_len(self.dma_len);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#x} rkey={} len={}",
            self.va, self.rkey, self.dma_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x56, 0x38, 0x3b, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x0b, 0x90, 0x00, 0x00, 0x10,
        0x00,
    ];
    const REPR: Repr = Repr {
        va: 0x5638_3b2a_0000,
        rkey: RKey::new(0xb90),
        dma_len: 4096,
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (p.va(), p.rkey(), p.dma_len()),
            (REPR.va, REPR.rkey, REPR.dma_len)
        );
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 16];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_va(REPR.va);
        p.set_rkey(REPR.rkey);
        p.set_dma_len(REPR.dma_len);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse_emit() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(REPR));
        let mut buf = [0xa5u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Repr::parse(&Packet::new_unchecked(&BYTES[..15])).is_err());
    }
}
