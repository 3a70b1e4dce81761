//! Base Transport Header (IBTA vol. 1, 9.2; rxe_hdr.h `struct rxe_bth`).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    OpCode     |S|M|Pad| TVer  |            P_Key              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |F|B|  resv6    |                  DestQP                       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |A|   resv7     |                    PSN                        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! S = SE (solicited event), M = MigReq, Pad = PadCnt, F/B = FECN/BECN, A = AckReq.
//! `resv6` and `resv7` are ignored on read and written as zero. Byte 4 (FECN, BECN, resv6) is
//! masked to 0xFF in the ICRC.

use core::fmt;

use crate::macros::{be, header_view};
use crate::{Opcode, PKey, ParseError, Psn, Qpn, Result};

mod field {
    use core::ops::Range;

    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const SE: u8 = 0x80;
    pub(super) const MIGREQ: u8 = 0x40;
    pub(super) const PAD_CNT: u8 = 0x30;
    pub(super) const PAD_SHIFT: u8 = 4;
    pub(super) const TVER: u8 = 0x0F;
    pub(super) const PKEY: Range<usize> = 2..4;
    pub(super) const FECN_BECN: usize = 4;
    pub(super) const FECN: u8 = 0x80;
    pub(super) const BECN: u8 = 0x40;
    pub(super) const DEST_QP: Range<usize> = 5..8;
    pub(super) const ACK_REQ_BYTE: usize = 8;
    pub(super) const ACK_REQ: u8 = 0x80;
    pub(super) const PSN: Range<usize> = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = field::PSN.end;

header_view! {
    /// A read/write view of a BTH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from_u8(self.buffer.as_ref()[field::OPCODE])
    }
    /// SE: solicited event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::SE != 0
    }
    /// M: migration request.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::MIGREQ != 0
    }
    /// PadCnt: bytes of padding after the payload (0..=3).
    pub fn pad_cnt(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & field::PAD_CNT) >> field::PAD_SHIFT
    }
    /// TVer: transport header version (must be 0).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & field::TVER
    }
    /// The partition key.
    pub fn pkey(&self) -> PKey {
        PKey::new(be::u16(&self.buffer.as_ref()[field::PKEY]))
    }
    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & field::FECN != 0
    }
    /// BECN: backward explicit congestion notification (set in CNPs).
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & field::BECN != 0
    }
    /// The destination QP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be::u24(&self.buffer.as_ref()[field::DEST_QP]))
    }
    /// AckReq: the requester asks for an acknowledgement.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ_BYTE] & field::ACK_REQ != 0
    }
    /// The packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be::u24(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_flag(&mut self, byte: usize, mask: u8, value: bool) {
        let b = &mut self.buffer.as_mut()[byte];
        *b = if value { *b | mask } else { *b & !mask };
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.as_u8();
    }
    /// Sets SE.
    pub fn set_solicited(&mut self, v: bool) {
        self.set_flag(field::FLAGS, field::SE, v);
    }
    /// Sets M.
    pub fn set_mig_req(&mut self, v: bool) {
        self.set_flag(field::FLAGS, field::MIGREQ, v);
    }
    /// Sets PadCnt (the low two bits of `pad`).
    pub fn set_pad_cnt(&mut self, pad: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::PAD_CNT) | ((pad << field::PAD_SHIFT) & field::PAD_CNT);
    }
    /// Sets TVer (the low four bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::TVER) | (v & field::TVER);
    }
    /// Sets the P_Key.
    pub fn set_pkey(&mut self, pkey: PKey) {
        be::set_u16(&mut self.buffer.as_mut()[field::PKEY], pkey.value());
    }
    /// Sets FECN and BECN and clears resv6.
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        let mut b = 0;
        if fecn {
            b |= field::FECN;
        }
        if becn {
            b |= field::BECN;
        }
        self.buffer.as_mut()[field::FECN_BECN] = b;
    }
    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        be::set_u24(&mut self.buffer.as_mut()[field::DEST_QP], qpn.value());
    }
    /// Sets AckReq and clears resv7.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ_BYTE] = if v { field::ACK_REQ } else { 0 };
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        be::set_u24(&mut self.buffer.as_mut()[field::PSN], psn.value());
    }
}

/// The BTH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// PadCnt (0..=3).
    pub pad_cnt: u8,
    /// P_Key.
    pub pkey: PKey,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH with every flag clear, the default P_Key and pad 0.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses a BTH. Checks TVer; resv6 and resv7 are deliberately not checked (IBTA: ignore
    /// on receive). PadCnt is checked against the payload by the whole-packet parse.
    ///
    /// # Errors
    /// `Truncated` or `BadVersion`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        if packet.tver() != 0 {
            return Err(ParseError::BadVersion);
        }
        Ok(Self {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_cnt: packet.pad_cnt(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// The length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header, TVer 0 and the reserved bits zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_opcode(self.opcode);
        packet.buffer.as_mut()[field::FLAGS] = 0;
        packet.set_solicited(self.solicited);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_cnt(self.pad_cnt);
        packet.set_pkey(self.pkey);
        packet.set_fecn_becn(self.fecn, self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH {} qpn={} psn={}",
            self.opcode, self.dest_qp, self.psn
        )?;
        if self.ack_req {
            f.write_str(" ack_req")?;
        }
        if self.solicited {
            f.write_str(" se")?;
        }
        if self.pad_cnt != 0 {
            write!(f, " pad={}", self.pad_cnt)?;
        }
        if self.pkey != PKey::DEFAULT {
            write!(f, " pkey={}", self.pkey)?;
        }
        if self.fecn {
            f.write_str(" fecn")?;
        }
        if self.becn {
            f.write_str(" becn")?;
        }
        if self.mig_req {
            f.write_str(" m")?;
        }
        Ok(())
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(&Packet::new_unchecked(self.buffer.as_ref())) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "BTH ({err})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY, pad 1, DestQP 0x12, AckReq, PSN 0 (spec 5.5 worked example).
    static BYTES: [u8; 12] = [
        0x04, 0x10, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x00,
    ];

    fn repr() -> Repr {
        Repr {
            pad_cnt: 1,
            ack_req: true,
            ..Repr::new(Opcode::RcSendOnly, Qpn::new(0x12), Psn::new(0))
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RcSendOnly);
        assert!(!p.solicited() && !p.mig_req());
        assert_eq!(p.pad_cnt(), 1);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), PKey::DEFAULT);
        assert!(!p.fecn() && !p.becn());
        assert_eq!(p.dest_qp(), Qpn::new(0x12));
        assert!(p.ack_req());
        assert_eq!(p.psn(), Psn::new(0));
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_opcode(Opcode::RcSendOnly);
        p.set_solicited(false);
        p.set_mig_req(false);
        p.set_pad_cnt(1);
        p.set_tver(0);
        p.set_pkey(PKey::DEFAULT);
        p.set_fecn_becn(false, false);
        p.set_dest_qp(Qpn::new(0x12));
        p.set_ack_req(true);
        p.set_psn(Psn::new(0));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse_and_emit() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&BYTES[..])), Ok(repr()));
        let mut buf = [0xa5u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn rejects_version_and_short() {
        let mut bad = BYTES;
        bad[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&bad[..])),
            Err(ParseError::BadVersion)
        );
        assert_eq!(
            Packet::new_checked(&BYTES[..11]).unwrap_err(),
            ParseError::Truncated
        );
    }

    #[test]
    fn display() {
        assert_eq!(
            repr().to_string(),
            "BTH RC_SEND_ONLY qpn=0x12 psn=0 ack_req pad=1"
        );
    }
}
