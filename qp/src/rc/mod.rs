//! The reliable-connected transport, split like Linux rxe: the requester sends requests, the
//! completer handles their responses, the responder answers the peer's requests. UC reuses
//! the requester and responder with ACKs, NAKs and retries switched off.

pub(crate) mod completer;
pub(crate) mod requester;
pub(crate) mod responder;

use roce_wire::packet::pad_for;
use roce_wire::{bth, Ext, PacketRepr};

/// Writes BTH + extension headers, lets `fill` write `payload_len` payload bytes in place,
/// then zero pad and a zero ICRC field. Returns the packet length, or `fill`'s error.
pub(crate) fn emit_in_place<E>(
    buf: &mut [u8],
    mut bth: bth::Repr,
    ext: Ext,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    bth.pad_cnt = pad_for(payload_len);
    let shape = PacketRepr {
        bth,
        ext,
        payload: &[],
    };
    let header_len = shape.header_len();
    let total = header_len + payload_len + shape.trailer_len();
    shape.emit_header(&mut buf[..header_len]);
    fill(&mut buf[header_len..header_len + payload_len])?;
    buf[header_len + payload_len..total].fill(0);
    Ok(total)
}
