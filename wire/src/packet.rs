//! A whole InfiniBand transport packet as RoCEv2 carries it in a UDP payload:
//!
//! ```text
//! | BTH (12) | extension headers (0..44) | payload (0..PMTU) | pad (0..3) | ICRC (4) |
//! ```
//!
//! [`PacketRepr::parse`] reads the BTH, takes the extension headers the opcode table
//! ([`crate::opcode`]) requires, strips the pad and keeps a zero-copy slice of the payload.
//! [`PacketRepr::emit`] writes it back; the ICRC field is written by the frame layer
//! ([`crate::frame`]) or by [`crate::icrc::Icrc`] over the caller's IP/UDP headers, since the
//! ICRC covers them. For a one-copy data path, [`PacketRepr::emit_header`] writes only the BTH
//! and extension headers so that the payload can be gathered straight from registered memory.

use core::fmt;

use crate::icrc::ICRC_LEN;
use crate::opcode::{ExtHeaders, Operation};
use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, feth, ieth, immdt, reth, Opcode, ParseError,
    Result,
};

/// The smallest valid UDP payload: BTH + ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// The extension headers of one packet, each present or not.
///
/// Parsed packets have exactly the headers their opcode requires (none for unknown opcodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ext {
    /// DETH (UD).
    pub deth: Option<deth::Repr>,
    /// FETH (FLUSH).
    pub feth: Option<feth::Repr>,
    /// RETH (RDMA WRITE first/only, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<reth::Repr>,
    /// AtomicETH (compare-and-swap, fetch-and-add).
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// AETH (acknowledgements and READ responses).
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH (atomic acknowledge).
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// ImmDt (… WITH_IMMEDIATE).
    pub immdt: Option<immdt::Repr>,
    /// IETH (SEND … WITH_INVALIDATE).
    pub ieth: Option<ieth::Repr>,
    /// CNP body.
    pub cnp: Option<cnp::Repr>,
}

impl Ext {
    /// Which headers are present.
    pub const fn headers(&self) -> ExtHeaders {
        let mut h = ExtHeaders::NONE;
        if self.deth.is_some() {
            h = h.with(ExtHeaders::DETH);
        }
        if self.feth.is_some() {
            h = h.with(ExtHeaders::FETH);
        }
        if self.reth.is_some() {
            h = h.with(ExtHeaders::RETH);
        }
        if self.atomic_eth.is_some() {
            h = h.with(ExtHeaders::ATOMIC_ETH);
        }
        if self.aeth.is_some() {
            h = h.with(ExtHeaders::AETH);
        }
        if self.atomic_ack_eth.is_some() {
            h = h.with(ExtHeaders::ATOMIC_ACK_ETH);
        }
        if self.immdt.is_some() {
            h = h.with(ExtHeaders::IMMDT);
        }
        if self.ieth.is_some() {
            h = h.with(ExtHeaders::IETH);
        }
        if self.cnp.is_some() {
            h = h.with(ExtHeaders::CNP);
        }
        h
    }

    /// Total length of the present headers.
    pub const fn len(&self) -> usize {
        self.headers().len()
    }

    /// No header present.
    pub const fn is_empty(&self) -> bool {
        self.headers().is_empty()
    }

    /// Parses the headers in `set` from the front of `buf`, in wire order.
    fn parse(set: ExtHeaders, buf: &[u8]) -> Result<Self> {
        if buf.len() < set.len() {
            return Err(ParseError::MissingExtHeader);
        }
        let mut ext = Self::default();
        let mut at = 0;
        for (h, len) in ExtHeaders::ORDER {
            if !set.contains(h) {
                continue;
            }
            let b = &buf[at..at + len];
            match h {
                ExtHeaders::DETH => {
                    ext.deth = Some(deth::Repr::parse(&deth::Packet::new_unchecked(b))?)
                }
                ExtHeaders::FETH => {
                    ext.feth = Some(feth::Repr::parse(&feth::Packet::new_unchecked(b))?)
                }
                ExtHeaders::RETH => {
                    ext.reth = Some(reth::Repr::parse(&reth::Packet::new_unchecked(b))?)
                }
                ExtHeaders::ATOMIC_ETH => {
                    ext.atomic_eth = Some(atomic_eth::Repr::parse(
                        &atomic_eth::Packet::new_unchecked(b),
                    )?);
                }
                ExtHeaders::AETH => {
                    ext.aeth = Some(aeth::Repr::parse(&aeth::Packet::new_unchecked(b))?)
                }
                ExtHeaders::ATOMIC_ACK_ETH => {
                    ext.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(
                        &atomic_ack_eth::Packet::new_unchecked(b),
                    )?);
                }
                ExtHeaders::IMMDT => {
                    ext.immdt = Some(immdt::Repr::parse(&immdt::Packet::new_unchecked(b))?)
                }
                ExtHeaders::IETH => {
                    ext.ieth = Some(ieth::Repr::parse(&ieth::Packet::new_unchecked(b))?)
                }
                _ => ext.cnp = Some(cnp::Repr::parse(&cnp::Packet::new_unchecked(b))?),
            }
            at += len;
        }
        Ok(ext)
    }

    /// Writes the present headers in wire order; `buf` must be exactly [`Self::len`] long.
    fn emit(&self, buf: &mut [u8]) {
        let mut at = 0;
        macro_rules! put {
            ($field:ident, $module:ident) => {
                if let Some(r) = &self.$field {
                    let end = at + $module::HEADER_LEN;
                    r.emit(&mut $module::Packet::new_unchecked(&mut buf[at..end]));
                    at = end;
                }
            };
        }
        put!(deth, deth);
        put!(feth, feth);
        put!(reth, reth);
        put!(atomic_eth, atomic_eth);
        put!(aeth, aeth);
        put!(atomic_ack_eth, atomic_ack_eth);
        put!(immdt, immdt);
        put!(ieth, ieth);
        put!(cnp, cnp);
        debug_assert_eq!(at, buf.len());
    }
}

/// A parsed transport packet: BTH, extension headers and a borrowed payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// The base transport header. `bth.pad_cnt` is what is on the wire; use
    /// [`PacketRepr::new`] to have it computed from the payload.
    pub bth: bth::Repr,
    /// The extension headers.
    pub ext: Ext,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// A packet whose PadCnt is computed from the payload length.
    pub const fn new(mut bth: bth::Repr, ext: Ext, payload: &'a [u8]) -> Self {
        bth.pad_cnt = pad_for(payload.len());
        Self { bth, ext, payload }
    }

    /// Parses a UDP payload (BTH .. ICRC). The ICRC is not checked here: it covers the IP and
    /// UDP headers, so the frame layer checks it.
    ///
    /// Checks: the length (at least BTH + ICRC, a multiple of 4), TVer, the extension headers
    /// the opcode requires, PadCnt against the payload, and no payload where the opcode allows
    /// none. Unknown opcodes are kept: everything between BTH and ICRC, less the pad, becomes
    /// the payload. Deliberately not checked here: the path-MTU size rules of FIRST/MIDDLE
    /// packets and that pad bytes are zero (the queue pair knows the MTU; rxe ignores pad
    /// content).
    ///
    /// # Errors
    /// `Truncated`, `BadLength`, `BadVersion`, `MissingExtHeader`, `BadPadCount`,
    /// `UnexpectedPayload`.
    pub fn parse(udp_payload: &'a [u8]) -> Result<Self> {
        if udp_payload.len() < MIN_LEN {
            return Err(ParseError::Truncated);
        }
        if udp_payload.len() % 4 != 0 {
            return Err(ParseError::BadLength);
        }
        let bth = bth::Repr::parse(&bth::Packet::new_unchecked(&udp_payload[..bth::HEADER_LEN]))?;
        let body = &udp_payload[bth::HEADER_LEN..udp_payload.len() - ICRC_LEN];
        let pad = usize::from(bth.pad_cnt);
        let (ext, rest, payload_allowed) = match bth.opcode.info() {
            Some(info) => {
                let ext = Ext::parse(info.ext, body)?;
                (ext, &body[info.ext.len()..], info.payload)
            }
            None => (Ext::default(), body, true),
        };
        if !payload_allowed {
            if pad != 0 {
                return Err(ParseError::BadPadCount);
            }
            if !rest.is_empty() {
                return Err(ParseError::UnexpectedPayload);
            }
        }
        if pad > rest.len() {
            return Err(ParseError::BadPadCount);
        }
        Ok(Self {
            bth,
            ext,
            payload: &rest[..rest.len() - pad],
        })
    }

    /// A lenient parse for a request that carries no payload (RDMA READ request, the two
    /// atomics, FLUSH) which [`Self::parse`] refused only for bytes after its headers: a
    /// payload (`UnexpectedPayload`), a PadCnt (`BadPadCount`) or a length that is not a
    /// multiple of 4 (`BadLength`). Linux rxe executes such requests as if the extra bytes
    /// and the pad were absent (`rxe_resp.c` reads only the RETH/AtomicETH of them), so a
    /// responder that answers like rxe parses them here: the payload is empty and PadCnt is
    /// kept as received. Every other check of [`Self::parse`] still applies. `None` for any
    /// other opcode or a packet that fails those checks.
    pub fn parse_payloadless_request(udp_payload: &'a [u8]) -> Option<Self> {
        if udp_payload.len() < MIN_LEN {
            return None;
        }
        let bth =
            bth::Repr::parse(&bth::Packet::new_unchecked(&udp_payload[..bth::HEADER_LEN])).ok()?;
        let info = bth.opcode.info()?;
        if !matches!(
            info.operation,
            Operation::ReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
                | Operation::Flush
        ) || info.payload
        {
            return None;
        }
        let body = &udp_payload[bth::HEADER_LEN..udp_payload.len() - ICRC_LEN];
        let ext = Ext::parse(info.ext, body).ok()?;
        Some(Self {
            bth,
            ext,
            payload: &[],
        })
    }

    /// Length of BTH + extension headers.
    pub const fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.ext.len()
    }

    /// Length of pad + ICRC.
    pub const fn trailer_len(&self) -> usize {
        self.bth.pad_cnt as usize + ICRC_LEN
    }

    /// The exact length of the emitted packet (the UDP payload).
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + self.trailer_len()
    }

    /// Writes BTH and extension headers; `buf` must be exactly [`Self::header_len`] long.
    pub fn emit_header(&self, buf: &mut [u8]) {
        let (b, e) = buf.split_at_mut(bth::HEADER_LEN);
        self.bth.emit(&mut bth::Packet::new_unchecked(b));
        self.ext.emit(e);
    }

    /// Writes the whole packet with a zero ICRC field; `buf` must be exactly
    /// [`Self::buffer_len`] long. The frame layer fills the ICRC.
    pub fn emit(&self, buf: &mut [u8]) {
        let header_len = self.header_len();
        let payload_end = header_len + self.payload.len();
        self.emit_header(&mut buf[..header_len]);
        buf[header_len..payload_end].copy_from_slice(self.payload);
        buf[payload_end..].fill(0);
    }

    /// Checks that the extension headers are those the opcode requires and that a payload is
    /// present only where allowed. Parsed packets always pass; built ones should before emit.
    ///
    /// # Errors
    /// `MissingExtHeader` for a header set that differs from the table, `UnexpectedPayload`,
    /// `BadPadCount` for a pad count that does not align the payload.
    pub fn check(&self) -> Result<()> {
        let Some(info) = self.bth.opcode.info() else {
            return Ok(());
        };
        if self.ext.headers() != info.ext {
            return Err(ParseError::MissingExtHeader);
        }
        if !info.payload && !self.payload.is_empty() {
            return Err(ParseError::UnexpectedPayload);
        }
        if (self.payload.len() + usize::from(self.bth.pad_cnt)) % 4 != 0 {
            return Err(ParseError::BadPadCount);
        }
        Ok(())
    }

    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        self.bth.opcode
    }
}

/// The pad that aligns a payload of `len` bytes to 4.
pub const fn pad_for(len: usize) -> u8 {
    (len.wrapping_neg() & 3) as u8
}

impl fmt::Display for PacketRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        macro_rules! show {
            ($($field:ident),*) => {
                $( if let Some(r) = &self.ext.$field { write!(f, " {r}")?; } )*
            };
        }
        show!(
            deth,
            feth,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            immdt,
            ieth
        );
        if !self.payload.is_empty() || self.bth.opcode.info().is_none_or(|i| i.payload) {
            write!(f, " payload={}", self.payload.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PKey, Psn, Qpn, RKey};

    fn bth(op: Opcode) -> bth::Repr {
        bth::Repr::new(op, Qpn::new(0x11), Psn::new(42))
    }

    fn roundtrip(repr: &PacketRepr<'_>) {
        repr.check().unwrap();
        let mut buf = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut buf);
        assert_eq!(buf.len() % 4, 0);
        assert_eq!(PacketRepr::parse(&buf).unwrap(), *repr);
    }

    #[test]
    fn send_only_with_pad() {
        let repr = PacketRepr::new(bth(Opcode::RcSendOnly), Ext::default(), b"hi!");
        assert_eq!(repr.bth.pad_cnt, 1);
        assert_eq!(repr.buffer_len(), 12 + 3 + 1 + 4);
        roundtrip(&repr);
    }

    #[test]
    #[cfg(feature = "alloc")]
    fn every_opcode_roundtrips() {
        let ext_for = crate::samples::ext_for;
        for &op in Opcode::ALL {
            let info = op.info().unwrap();
            let payload: &[u8] = if info.payload { b"abcde" } else { b"" };
            roundtrip(&PacketRepr::new(bth(op), ext_for(info.ext), payload));
        }
    }

    #[test]
    fn unknown_opcode_is_kept() {
        let repr = PacketRepr::new(bth(Opcode::Unknown(0x44)), Ext::default(), b"rd packet");
        roundtrip(&repr);
    }

    /// READ requests, atomics and FLUSH with bytes after their headers, a PadCnt or an odd
    /// length parse leniently (as rxe executes them); nothing else does.
    #[test]
    fn payloadless_requests_parse_leniently() {
        let reth = reth::Repr {
            va: 0x1000,
            rkey: RKey::new(7),
            dma_len: 8,
        };
        let ext = Ext {
            reth: Some(reth),
            ..Ext::default()
        };
        let mut b = bth(Opcode::RcRdmaReadRequest);
        b.pad_cnt = 2;
        // BTH + RETH + 5 payload bytes + ICRC: not a multiple of 4, PadCnt 2.
        let mut buf = [0u8; 12 + 16 + 5 + 4];
        b.emit(&mut bth::Packet::new_unchecked(&mut buf[..12]));
        ext.emit(&mut buf[12..28]);
        assert_eq!(PacketRepr::parse(&buf), Err(ParseError::BadLength));
        let p = PacketRepr::parse_payloadless_request(&buf).unwrap();
        assert_eq!((p.ext.reth, p.payload), (Some(reth), &[][..]));
        assert!(PacketRepr::parse_payloadless_request(&buf[..24]).is_none());
        // A payload-bearing request, a response and an ACK are never parsed this way.
        for op in [
            Opcode::RcSendOnly,
            Opcode::RcRdmaWriteOnly,
            Opcode::RcAcknowledge,
        ] {
            bth(op).emit(&mut bth::Packet::new_unchecked(&mut buf[..12]));
            assert!(
                PacketRepr::parse_payloadless_request(&buf).is_none(),
                "{op:?}"
            );
        }
    }

    #[test]
    fn errors() {
        let mut buf = [0u8; 24];
        bth(Opcode::RcAcknowledge).emit(&mut bth::Packet::new_unchecked(&mut buf[..12]));
        // ACK without room for the AETH.
        assert_eq!(
            PacketRepr::parse(&buf[..16]),
            Err(ParseError::MissingExtHeader)
        );
        assert!(PacketRepr::parse(&buf[..20]).is_ok());
        // ACK with bytes after the AETH.
        assert_eq!(
            PacketRepr::parse(&buf[..24]),
            Err(ParseError::UnexpectedPayload)
        );
        assert_eq!(PacketRepr::parse(&buf[..15]), Err(ParseError::Truncated));
        assert_eq!(PacketRepr::parse(&buf[..18]), Err(ParseError::BadLength));
        // SEND_ONLY with PadCnt 3 but no payload.
        let mut send = [0u8; 16];
        let mut b = bth(Opcode::RcSendOnly);
        b.pad_cnt = 3;
        b.emit(&mut bth::Packet::new_unchecked(&mut send[..12]));
        assert_eq!(PacketRepr::parse(&send), Err(ParseError::BadPadCount));
        // TVer != 0.
        send[1] = 0x01;
        assert_eq!(PacketRepr::parse(&send), Err(ParseError::BadVersion));
        // Pad on an ACK.
        let mut ack = [0u8; 20];
        let mut b = bth(Opcode::RcAcknowledge);
        b.pad_cnt = 1;
        b.emit(&mut bth::Packet::new_unchecked(&mut ack[..12]));
        assert_eq!(PacketRepr::parse(&ack), Err(ParseError::BadPadCount));
        let _ = PKey::DEFAULT;
    }

    #[test]
    fn check_catches_inconsistent_builds() {
        let repr = PacketRepr::new(bth(Opcode::RcRdmaWriteOnly), Ext::default(), b"x");
        assert_eq!(repr.check(), Err(ParseError::MissingExtHeader));
        let repr = PacketRepr::new(
            bth(Opcode::RcRdmaReadRequest),
            Ext {
                reth: Some(reth::Repr {
                    va: 0,
                    rkey: RKey::new(0),
                    dma_len: 0,
                }),
                ..Ext::default()
            },
            b"x",
        );
        assert_eq!(repr.check(), Err(ParseError::UnexpectedPayload));
    }

    #[test]
    fn display() {
        let repr = PacketRepr::new(
            bth::Repr {
                ack_req: true,
                ..bth(Opcode::RcRdmaWriteOnly)
            },
            Ext {
                reth: Some(reth::Repr {
                    va: 0x10,
                    rkey: RKey::new(0x22),
                    dma_len: 5,
                }),
                ..Ext::default()
            },
            b"hello",
        );
        assert_eq!(
            repr.to_string(),
            "BTH RC_RDMA_WRITE_ONLY qpn=0x11 psn=42 ack_req pad=3 RETH va=0x10 rkey=0x00000022 len=5 payload=5"
        );
    }
}
