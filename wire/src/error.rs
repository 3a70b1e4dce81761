//! The one error type of the wire layer.

use core::fmt;

/// Why a packet or header could not be parsed.
///
/// A small `Copy` enum: parsing allocates nothing, and every error is cheap to count per reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseError {
    /// The buffer is shorter than the header or the lengths the headers declare.
    Truncated,
    /// BTH TVer is not 0 (rxe drops such packets).
    BadVersion,
    /// PadCnt is larger than the bytes left for payload, or non-zero where no payload is allowed.
    BadPadCount,
    /// The opcode is one this layer cannot carry in this position (for example a known opcode
    /// in an unknown-transport context when a strict parse was asked for).
    BadOpcode,
    /// The opcode requires an extension header that does not fit in the packet.
    MissingExtHeader,
    /// The opcode carries no payload, yet bytes follow its headers.
    UnexpectedPayload,
    /// The invariant CRC does not match.
    BadIcrc,
    /// The frame is not Ethernet/IP/UDP, or its Layer-2..4 headers are malformed.
    BadFrame,
    /// The UDP destination port is not the RoCEv2 port.
    NotRoce,
    /// The IP packet is a fragment (RoCEv2 never fragments; the ICRC cannot be checked).
    Fragmented,
    /// The UDP payload length is not a multiple of 4 or is impossibly small.
    BadLength,
}

impl ParseError {
    /// A short stable name, for counters and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::BadVersion => "bad_version",
            Self::BadPadCount => "bad_pad_count",
            Self::BadOpcode => "bad_opcode",
            Self::MissingExtHeader => "missing_ext_header",
            Self::UnexpectedPayload => "unexpected_payload",
            Self::BadIcrc => "bad_icrc",
            Self::BadFrame => "bad_frame",
            Self::NotRoce => "not_roce",
            Self::Fragmented => "fragmented",
            Self::BadLength => "bad_length",
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Truncated => "packet truncated",
            Self::BadVersion => "BTH transport version is not 0",
            Self::BadPadCount => "BTH pad count does not fit the payload",
            Self::BadOpcode => "opcode not allowed here",
            Self::MissingExtHeader => "extension header required by the opcode is missing",
            Self::UnexpectedPayload => "payload present on an opcode that carries none",
            Self::BadIcrc => "invariant CRC mismatch",
            Self::BadFrame => "malformed Ethernet/IP/UDP headers",
            Self::NotRoce => "not a RoCEv2 packet (UDP destination port is not 4791)",
            Self::Fragmented => "IP fragment",
            Self::BadLength => "UDP payload length is not a multiple of 4",
        };
        f.write_str(text)
    }
}

impl core::error::Error for ParseError {}

/// Result of a parse.
pub type Result<T> = core::result::Result<T, ParseError>;
