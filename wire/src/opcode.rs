//! The BTH opcode and the one table that says what each opcode carries.
//!
//! IBTA vol. 1, 9.2 and table 38 ("OpCode field"); Linux `include/rdma/ib_pack.h` and
//! `drivers/infiniband/sw/rxe/rxe_opcode.c`; Wireshark `packet-infiniband.h` for the names.
//!
//! ```text
//!  bits 7-5: transport   000 RC, 001 UC, 010 RD, 011 UD, 100 CNP, 101 XRC, 111 vendor
//!  bits 4-0: operation
//! ```
//!
//! Extension headers follow the BTH in this wire order:
//! `DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, CNP reserved`.
//! Opcodes outside the table (RD, XRC, vendor, reserved codes) become [`Opcode::Unknown`]:
//! they are kept and re-emitted unchanged, with everything after the BTH treated as payload.

use core::fmt;

/// The transport service an opcode belongs to (opcode bits 7-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (0x00-0x1F).
    Rc,
    /// Unreliable connected (0x20-0x3F).
    Uc,
    /// Reliable datagram (0x40-0x5F), not supported by RoCE devices.
    Rd,
    /// Unreliable datagram (0x60-0x7F).
    Ud,
    /// Congestion notification (0x80-0x9F, RoCEv2 CNP is 0x81).
    Cnp,
    /// Extended reliable connected (0xA0-0xBF).
    Xrc,
    /// Reserved or manufacturer specific (0xC0-0xFF).
    Other,
}

impl Transport {
    /// The transport of an opcode byte.
    pub const fn of(code: u8) -> Self {
        match code >> 5 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            3 => Self::Ud,
            4 => Self::Cnp,
            5 => Self::Xrc,
            _ => Self::Other,
        }
    }
}

/// Where a packet sits inside its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message (carries exactly one path MTU).
    First,
    /// Middle packet (exactly one path MTU).
    Middle,
    /// Last packet (1..=path MTU bytes).
    Last,
    /// The only packet of its message (or a packet that is not part of a message).
    Only,
}

/// The operation an opcode belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with or without immediate or invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK, NAK or RNR NAK.
    Acknowledge,
    /// Response to an atomic.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// FLUSH (persistent memory).
    Flush,
    /// ATOMIC WRITE (8 bytes).
    AtomicWrite,
    /// RoCEv2 congestion notification packet.
    Cnp,
}

/// A set of extension headers, in wire order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders(u16);

impl ExtHeaders {
    /// No extension header.
    pub const NONE: Self = Self(0);
    /// Datagram ETH (8 bytes).
    pub const DETH: Self = Self(1 << 0);
    /// Flush ETH (4 bytes).
    pub const FETH: Self = Self(1 << 1);
    /// RDMA ETH (16 bytes).
    pub const RETH: Self = Self(1 << 2);
    /// Atomic ETH (28 bytes).
    pub const ATOMIC_ETH: Self = Self(1 << 3);
    /// ACK ETH (4 bytes).
    pub const AETH: Self = Self(1 << 4);
    /// Atomic ACK ETH (8 bytes).
    pub const ATOMIC_ACK_ETH: Self = Self(1 << 5);
    /// Immediate data (4 bytes).
    pub const IMMDT: Self = Self(1 << 6);
    /// Invalidate ETH (4 bytes).
    pub const IETH: Self = Self(1 << 7);
    /// The 16 reserved bytes of a CNP.
    pub const CNP: Self = Self(1 << 8);

    /// Every header, in wire order, with its length.
    pub const ORDER: [(Self, usize); 9] = [
        (Self::DETH, 8),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::ATOMIC_ETH, 28),
        (Self::AETH, 4),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMMDT, 4),
        (Self::IETH, 4),
        (Self::CNP, 16),
    ];

    /// The union of two sets.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The headers in both sets.
    #[must_use]
    pub const fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// Whether every header of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The total length of the headers in the set.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for ExtHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 9] = [
            "DETH",
            "FETH",
            "RETH",
            "AtomicETH",
            "AETH",
            "AtomicAckETH",
            "ImmDt",
            "IETH",
            "CNP",
        ];
        let mut list = f.debug_set();
        for (i, (h, _)) in Self::ORDER.iter().enumerate() {
            if self.contains(*h) {
                list.entry(&format_args!("{}", NAMES[i]));
            }
        }
        list.finish()
    }
}

/// What the table says about one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Name as Wireshark and the kernel print it, e.g. `RC_SEND_ONLY`.
    pub name: &'static str,
    /// The extension headers after the BTH.
    pub ext: ExtHeaders,
    /// Whether a payload may follow the headers.
    pub payload: bool,
    /// The place of the packet in its message.
    pub position: Position,
    /// The operation.
    pub operation: Operation,
}

impl OpcodeInfo {
    /// The packet starts a message (FIRST or ONLY).
    pub const fn is_start(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }
    /// The packet ends a message (LAST or ONLY).
    pub const fn is_end(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
    /// The packet carries immediate data.
    pub const fn has_immediate(&self) -> bool {
        self.ext.contains(ExtHeaders::IMMDT)
    }
    /// The packet carries an invalidate rkey.
    pub const fn has_invalidate(&self) -> bool {
        self.ext.contains(ExtHeaders::IETH)
    }
    /// The packet is a response (sent by the responder: READ response, ACK, atomic ACK).
    pub const fn is_response(&self) -> bool {
        matches!(
            self.operation,
            Operation::ReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
        )
    }
}

macro_rules! opcodes {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $code:literal, $name:literal, [$($ext:ident)|*], $payload:literal,
            $pos:ident, $op:ident;
    )*) => {
        /// A BTH opcode.
        ///
        /// Variants follow the spec order. Codes not in the table are kept as `Unknown`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( $(#[$doc])* $variant, )*
            /// An opcode outside the table (RD, XRC, vendor or reserved), kept as is.
            Unknown(u8),
        }

        impl Opcode {
            /// Every opcode of the table, in spec order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The opcode of a BTH opcode byte.
            pub const fn from_u8(code: u8) -> Self {
                match code {
                    $( $code => Self::$variant, )*
                    other => Self::Unknown(other),
                }
            }

            /// The opcode byte.
            pub const fn as_u8(self) -> u8 {
                match self {
                    $( Self::$variant => $code, )*
                    Self::Unknown(code) => code,
                }
            }

            /// The table entry, or `None` for an unknown opcode.
            pub const fn info(self) -> Option<&'static OpcodeInfo> {
                match self {
                    $( Self::$variant => Some(&const { OpcodeInfo {
                        name: $name,
                        ext: ExtHeaders::NONE $(.with(ExtHeaders::$ext))*,
                        payload: $payload,
                        position: Position::$pos,
                        operation: Operation::$op,
                    } }), )*
                    Self::Unknown(_) => None,
                }
            }
        }
    };
}

opcodes! {
    /// RC SEND first packet.
    RcSendFirst = 0x00, "RC_SEND_FIRST", [], true, First, Send;
    /// RC SEND middle packet.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", [], true, Middle, Send;
    /// RC SEND last packet.
    RcSendLast = 0x02, "RC_SEND_LAST", [], true, Last, Send;
    /// RC SEND last packet with immediate.
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", [IMMDT], true, Last, Send;
    /// RC SEND only packet.
    RcSendOnly = 0x04, "RC_SEND_ONLY", [], true, Only, Send;
    /// RC SEND only packet with immediate.
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT], true, Only, Send;
    /// RC RDMA WRITE first packet.
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", [RETH], true, First, Write;
    /// RC RDMA WRITE middle packet.
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", [], true, Middle, Write;
    /// RC RDMA WRITE last packet.
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST", [], true, Last, Write;
    /// RC RDMA WRITE last packet with immediate.
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT], true,
        Last, Write;
    /// RC RDMA WRITE only packet.
    RcRdmaWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", [RETH], true, Only, Write;
    /// RC RDMA WRITE only packet with immediate.
    RcRdmaWriteOnlyWithImmediate = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH | IMMDT],
        true, Only, Write;
    /// RC RDMA READ request.
    RcRdmaReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", [RETH], false, Only, ReadRequest;
    /// RC RDMA READ response first packet.
    RcRdmaReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", [AETH], true, First,
        ReadResponse;
    /// RC RDMA READ response middle packet (no AETH).
    RcRdmaReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", [], true, Middle,
        ReadResponse;
    /// RC RDMA READ response last packet.
    RcRdmaReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", [AETH], true, Last,
        ReadResponse;
    /// RC RDMA READ response only packet (payload may be empty).
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", [AETH], true, Only,
        ReadResponse;
    /// RC ACK, NAK or RNR NAK.
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", [AETH], false, Only, Acknowledge;
    /// RC atomic acknowledge.
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", [AETH | ATOMIC_ACK_ETH], false, Only,
        AtomicAcknowledge;
    /// RC atomic compare and swap.
    RcCompareSwap = 0x13, "RC_CMP_SWAP", [ATOMIC_ETH], false, Only, CompareSwap;
    /// RC atomic fetch and add.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", [ATOMIC_ETH], false, Only, FetchAdd;
    /// RC SEND last packet with invalidate.
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", [IETH], true, Last, Send;
    /// RC SEND only packet with invalidate.
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", [IETH], true, Only, Send;
    /// RC FLUSH.
    RcFlush = 0x1C, "RC_FLUSH", [FETH | RETH], false, Only, Flush;
    /// RC ATOMIC WRITE (exactly 8 bytes of payload).
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", [RETH], true, Only, AtomicWrite;
    /// UC SEND first packet.
    UcSendFirst = 0x20, "UC_SEND_FIRST", [], true, First, Send;
    /// UC SEND middle packet.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", [], true, Middle, Send;
    /// UC SEND last packet.
    UcSendLast = 0x22, "UC_SEND_LAST", [], true, Last, Send;
    /// UC SEND last packet with immediate.
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", [IMMDT], true, Last, Send;
    /// UC SEND only packet.
    UcSendOnly = 0x24, "UC_SEND_ONLY", [], true, Only, Send;
    /// UC SEND only packet with immediate.
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT], true, Only, Send;
    /// UC RDMA WRITE first packet.
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", [RETH], true, First, Write;
    /// UC RDMA WRITE middle packet.
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", [], true, Middle, Write;
    /// UC RDMA WRITE last packet.
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST", [], true, Last, Write;
    /// UC RDMA WRITE last packet with immediate.
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT], true,
        Last, Write;
    /// UC RDMA WRITE only packet.
    UcRdmaWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", [RETH], true, Only, Write;
    /// UC RDMA WRITE only packet with immediate.
    UcRdmaWriteOnlyWithImmediate = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH | IMMDT],
        true, Only, Write;
    /// UD SEND only packet.
    UdSendOnly = 0x64, "UD_SEND_ONLY", [DETH], true, Only, Send;
    /// UD SEND only packet with immediate.
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", [DETH | IMMDT], true, Only,
        Send;
    /// RoCEv2 congestion notification packet.
    Cnp = 0x81, "CNP", [CNP], false, Only, Cnp;
}

impl Opcode {
    /// The transport of this opcode (from bits 7-5).
    pub const fn transport(self) -> Transport {
        Transport::of(self.as_u8())
    }

    /// Looks a request opcode up in the table: the one of `transport` for `operation` at
    /// `position` whose optional trailer (immediate data or invalidate rkey) is exactly
    /// `trailer` (`ExtHeaders::NONE`, `IMMDT` or `IETH`). `None` if the table has no such
    /// opcode (e.g. a SEND FIRST with immediate, a READ on UC, an atomic on UD). Responses
    /// (ACK, READ response, atomic ACK) are never returned.
    ///
    /// Requesters build their opcodes here rather than from code arithmetic, so the table stays
    /// the one source of opcode facts.
    pub fn request(
        transport: Transport,
        operation: Operation,
        position: Position,
        trailer: ExtHeaders,
    ) -> Option<Self> {
        // One lookup in a table built from `ALL` at compile time (a requester asks once per
        // packet).
        let t = trailer_index(trailer)?;
        REQUESTS[transport as usize][operation as usize][position as usize][t]
    }

    /// The name (`RC_SEND_ONLY`), or `UNKNOWN` for codes outside the table.
    pub const fn name(self) -> &'static str {
        match self.info() {
            Some(info) => info.name,
            None => "UNKNOWN",
        }
    }
}

/// The trailers a request opcode may carry at its end, in [`REQUESTS`]' last index order.
const TRAILERS: [ExtHeaders; 3] = [ExtHeaders::NONE, ExtHeaders::IMMDT, ExtHeaders::IETH];

/// Index of `trailer` in [`TRAILERS`].
const fn trailer_index(trailer: ExtHeaders) -> Option<usize> {
    let mut i = 0;
    while i < TRAILERS.len() {
        if TRAILERS[i].0 == trailer.0 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Variants of [`Transport`], [`Operation`] and [`Position`] (each enum's last variant + 1).
const TRANSPORTS: usize = Transport::Other as usize + 1;
const OPERATIONS: usize = Operation::Cnp as usize + 1;
const POSITIONS: usize = Position::Only as usize + 1;

/// [`Opcode::request`]'s answers: `[transport][operation][position][trailer]`, built from the
/// opcode table; the first opcode of `ALL` wins should two share a key.
type RequestTable = [[[[Option<Opcode>; TRAILERS.len()]; POSITIONS]; OPERATIONS]; TRANSPORTS];
static REQUESTS: RequestTable = {
    let both = ExtHeaders::IMMDT.with(ExtHeaders::IETH);
    let mut table: RequestTable = [[[[None; TRAILERS.len()]; POSITIONS]; OPERATIONS]; TRANSPORTS];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        i += 1;
        let Some(info) = op.info() else {
            continue;
        };
        if info.is_response() {
            continue;
        }
        let Some(t) = trailer_index(info.ext.intersection(both)) else {
            continue;
        };
        let slot =
            &mut table[op.transport() as usize][info.operation as usize][info.position as usize][t];
        if slot.is_none() {
            *slot = Some(op);
        }
    }
    table
};

impl From<u8> for Opcode {
    fn from(code: u8) -> Self {
        Self::from_u8(code)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> Self {
        op.as_u8()
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(code) => write!(f, "UNKNOWN({code:#04x})"),
            other => f.write_str(other.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for code in 0..=255u8 {
            assert_eq!(Opcode::from_u8(code).as_u8(), code);
        }
    }

    #[test]
    fn table_matches_spec_header_sizes() {
        // Sizes of the extension headers per opcode, from rxe_opcode.c / check_pcap.sh.
        let expect: &[(u8, usize, bool)] = &[
            (0x00, 0, true),
            (0x03, 4, true),
            (0x06, 16, true),
            (0x0B, 20, true),
            (0x0C, 16, false),
            (0x0D, 4, true),
            (0x0E, 0, true),
            (0x11, 4, false),
            (0x12, 12, false),
            (0x13, 28, false),
            (0x14, 28, false),
            (0x17, 4, true),
            (0x1C, 20, false),
            (0x1D, 16, true),
            (0x2B, 20, true),
            (0x64, 8, true),
            (0x65, 12, true),
            (0x81, 16, false),
        ];
        for &(code, len, payload) in expect {
            let info = Opcode::from_u8(code).info().expect("in table");
            assert_eq!(info.ext.len(), len, "{}", info.name);
            assert_eq!(info.payload, payload, "{}", info.name);
        }
        assert_eq!(Opcode::ALL.len(), 40);
    }

    #[test]
    fn unknown_codes_are_kept() {
        for code in [0x15u8, 0x18, 0x40, 0x54, 0xA0, 0xE0, 0xFF, 0x66, 0x2C] {
            assert_eq!(Opcode::from_u8(code), Opcode::Unknown(code));
            assert!(Opcode::from_u8(code).info().is_none());
        }
        assert_eq!(Opcode::from_u8(0x40).transport(), Transport::Rd);
        assert_eq!(format!("{}", Opcode::from_u8(0x15)), "UNKNOWN(0x15)");
    }

    #[test]
    fn request_lookup_finds_every_request_opcode_of_the_table() {
        const TRAILERS: ExtHeaders = ExtHeaders::IMMDT.with(ExtHeaders::IETH);
        let mut found = 0;
        for &op in Opcode::ALL {
            let info = op.info().expect("in table");
            if info.is_response() || info.operation == Operation::Cnp {
                continue;
            }
            let trailer = info.ext.intersection(TRAILERS);
            assert_eq!(
                Opcode::request(op.transport(), info.operation, info.position, trailer),
                Some(op),
                "{}",
                info.name
            );
            found += 1;
        }
        // 19 RC requests (0x00-0x0C, 0x13, 0x14, 0x16, 0x17, 0x1C, 0x1D), 12 UC, 2 UD.
        assert_eq!(found, 19 + 12 + 2);
        // Combinations the table does not have.
        let none = [
            (
                Transport::Rc,
                Operation::Send,
                Position::First,
                ExtHeaders::IMMDT,
            ),
            (
                Transport::Rc,
                Operation::Write,
                Position::Last,
                ExtHeaders::IETH,
            ),
            (
                Transport::Uc,
                Operation::ReadRequest,
                Position::Only,
                ExtHeaders::NONE,
            ),
            (
                Transport::Uc,
                Operation::Send,
                Position::Only,
                ExtHeaders::IETH,
            ),
            (
                Transport::Ud,
                Operation::FetchAdd,
                Position::Only,
                ExtHeaders::NONE,
            ),
            (
                Transport::Rc,
                Operation::Acknowledge,
                Position::Only,
                ExtHeaders::NONE,
            ),
        ];
        for (t, o, p, x) in none {
            assert_eq!(Opcode::request(t, o, p, x), None, "{t:?} {o:?} {p:?} {x:?}");
        }
        assert_eq!(
            Opcode::request(
                Transport::Uc,
                Operation::Write,
                Position::Only,
                ExtHeaders::IMMDT
            ),
            Some(Opcode::UcRdmaWriteOnlyWithImmediate)
        );
    }

    #[test]
    fn uc_mirrors_rc_first_twelve() {
        for code in 0x00..=0x0Bu8 {
            let rc = Opcode::from_u8(code).info().unwrap();
            let uc = Opcode::from_u8(code + 0x20).info().unwrap();
            assert_eq!(
                (rc.ext, rc.payload, rc.position),
                (uc.ext, uc.payload, uc.position)
            );
            assert_eq!(&rc.name[3..], &uc.name[3..]);
        }
    }
}
