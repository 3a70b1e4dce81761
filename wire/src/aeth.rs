//! ACK Extended Transport Header (IBTA vol. 1, 9.3.5; rxe_hdr.h `struct rxe_aeth`).
//!
//! ```text
//! +---------------+-----------------------------------------------+
//! | Syndrome (8)  |                   MSN (24)                    |
//! +---------------+-----------------------------------------------+
//!
//! Syndrome: bit 7 reserved | bits 6-5 type | bits 4-0 value
//!   type 00 ACK      value = credit code (31 = no credit information)
//!   type 01 RNR NAK  value = RNR timer code (table 7.7 of our spec digest)
//!   type 11 NAK      value = NAK code: 0 PSN sequence error, 1 invalid request,
//!                    2 remote access error, 3 remote operational error, 4 invalid RD request
//! ```
//!
//! Carried by ACKNOWLEDGE, ATOMIC ACKNOWLEDGE and READ RESPONSE FIRST/LAST/ONLY.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{Msn, Result};

mod field {
    use core::ops::Range;

    pub(super) const SYNDROME: usize = 0;
    pub(super) const MSN: Range<usize> = 1..4;
    pub(super) const TYPE_MASK: u8 = 0x60;
    pub(super) const VALUE_MASK: u8 = 0x1F;
    pub(super) const RESERVED: u8 = 0x80;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = field::MSN.end;

header_view! {
    /// A read/write view of an AETH.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }
    /// The message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::new(be::u24(&self.buffer.as_ref()[field::MSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = s.as_u8();
    }
    /// Sets the MSN.
    pub fn set_msn(&mut self, msn: Msn) {
        be::set_u24(&mut self.buffer.as_mut()[field::MSN], msn.value());
    }
}

/// NAK codes (syndrome type 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (the requester rewinds: go-back-N).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5..=31: reserved codes, kept.
    Reserved(u8),
}

impl NakCode {
    /// From the 5-bit code.
    pub const fn from_code(code: u8) -> Self {
        match code & field::VALUE_MASK {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            other => Self::Reserved(other),
        }
    }
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Reserved(c) => c & field::VALUE_MASK,
        }
    }
    /// Short name for logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::PsnSequenceError => "psn_seq_err",
            Self::InvalidRequest => "inv_req",
            Self::RemoteAccessError => "rem_acc_err",
            Self::RemoteOperationalError => "rem_op_err",
            Self::InvalidRdRequest => "inv_rd_req",
            Self::Reserved(_) => "reserved",
        }
    }
}

/// The AETH syndrome, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with a credit code (0..=30 credits codes, 31 = no credit information).
    Ack {
        /// The 5-bit credit code.
        credit_code: u8,
    },
    /// Receiver not ready, retry after the encoded time.
    RnrNak {
        /// The 5-bit RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Type 10 or bit 7 set: reserved, kept as the raw byte.
    Reserved(u8),
}

impl Syndrome {
    /// ACK with no credit information, as rxe and SRQ-attached QPs send.
    pub const ACK_UNLIMITED: Self = Self::Ack {
        credit_code: CREDIT_INVALID,
    };

    /// Decodes a syndrome byte; every byte maps to a value that [`Self::as_u8`] restores.
    pub const fn from_u8(raw: u8) -> Self {
        if raw & field::RESERVED != 0 {
            return Self::Reserved(raw);
        }
        let value = raw & field::VALUE_MASK;
        match (raw & field::TYPE_MASK) >> 5 {
            0 => Self::Ack { credit_code: value },
            1 => Self::RnrNak { timer: value },
            3 => Self::Nak(NakCode::from_code(value)),
            _ => Self::Reserved(raw),
        }
    }

    /// The syndrome byte.
    pub const fn as_u8(self) -> u8 {
        match self {
            Self::Ack { credit_code } => credit_code & field::VALUE_MASK,
            Self::RnrNak { timer } => 0x20 | (timer & field::VALUE_MASK),
            Self::Nak(code) => 0x60 | code.code(),
            Self::Reserved(raw) => raw,
        }
    }

    /// Whether this is a positive acknowledgement.
    pub const fn is_ack(self) -> bool {
        matches!(self, Self::Ack { .. })
    }
}

/// Credit code meaning "no credit information" (end-to-end flow control not used).
pub const CREDIT_INVALID: u8 = 31;

/// The number of receive credits a credit code stands for (IBTA table 47, rdmavt
/// `credit_table`); `None` for code 31 (invalid / unlimited) and above.
pub const fn credits(code: u8) -> Option<u32> {
    const TABLE: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    if (code as usize) < TABLE.len() {
        Some(TABLE[code as usize])
    } else {
        None
    }
}

/// The largest credit code whose credit count does not exceed `n` (what a responder with `n`
/// free receive WQEs advertises).
pub const fn credit_code_for(n: u32) -> u8 {
    let mut code = 0u8;
    while code < 30 {
        match credits(code + 1) {
            Some(c) if c <= n => code += 1,
            _ => break,
        }
    }
    code
}

/// The RNR NAK timer in nanoseconds for a 5-bit timer code (IBTA table 45, ib_verbs.h
/// `ib_rnr_timeout`; code 0 is the longest, 655.36 ms).
pub const fn rnr_timer_ns(code: u8) -> u64 {
    const MICROSECONDS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    MICROSECONDS[(code & 0x1F) as usize] * 1_000
}

/// The AETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// MSN.
    pub msn: Msn,
}

impl Repr {
    /// Parses an AETH. Reserved syndromes are kept, not rejected: the completer decides.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }
    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ack {
                credit_code: CREDIT_INVALID,
            } => f.write_str("ack"),
            Self::Ack { credit_code } => write!(f, "ack credits={credit_code}"),
            Self::RnrNak { timer } => write!(f, "rnr_nak timer={timer}"),
            Self::Nak(code) => write!(f, "nak {}", code.name()),
            Self::Reserved(raw) => write!(f, "reserved({raw:#04x})"),
        }
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AETH {} msn={}", self.syndrome, self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 4] = [0x1F, 0x00, 0x00, 0x05];
    const REPR: Repr = Repr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn: Msn::new(5),
    };

    #[test]
    fn deconstruct_construct_parse_emit() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.syndrome(), Syndrome::ACK_UNLIMITED);
        assert_eq!(p.msn(), Msn::new(5));
        let mut buf = [0xa5u8; 4];
        let mut q = Packet::new_unchecked(&mut buf[..]);
        q.set_syndrome(Syndrome::ACK_UNLIMITED);
        q.set_msn(Msn::new(5));
        assert_eq!(buf, BYTES);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(REPR));
        let mut buf = [0xa5u8; 4];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for raw in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(raw).as_u8(), raw);
        }
        assert_eq!(
            Syndrome::from_u8(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_u8(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_u8(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_u8(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(Syndrome::from_u8(0x2E), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from_u8(0x45), Syndrome::Reserved(0x45));
    }

    #[test]
    fn tables() {
        assert_eq!(credits(0), Some(0));
        assert_eq!(credits(5), Some(6));
        assert_eq!(credits(30), Some(32768));
        assert_eq!(credits(31), None);
        assert_eq!(credit_code_for(0), 0);
        assert_eq!(credit_code_for(7), 5);
        assert_eq!(credit_code_for(1_000_000), 30);
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(25), 61_440_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn display() {
        assert_eq!(REPR.to_string(), "AETH ack msn=5");
        let nak = Repr {
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: Msn::new(1),
        };
        assert_eq!(nak.to_string(), "AETH nak psn_seq_err msn=1");
    }
}
