//! UD: one packet per message, Q_Key checks, the 40-byte GRH area on receive.
//!
//! IBTA vol. 1, 9.8 (UD transport), our spec digest 4.3, 6 and 12; Linux `rxe_req.c`,
//! `rxe_resp.c` (`execute` writes the network header into the first 40 bytes).

use roce_wire::{bth, deth, immdt, Ext, Opcode, PacketRepr};

use crate::ctx::QpCtx;
use crate::rc::emit_in_place;
use crate::rc::requester::Requester;
use crate::verbs::{AddressHandle, Completion, CqSide, SendData, SendOp, WcOpcode, WcStatus};

/// Bytes at the head of every UD receive buffer that hold the network header.
pub const GRH_LEN: usize = 40;

/// Builds the next UD datagram into `buf`; returns its length and where it goes.
pub(crate) fn next(
    cx: &mut QpCtx<'_>,
    req: &mut Requester,
    buf: &mut [u8],
) -> Option<(usize, AddressHandle)> {
    let w = cx.sq.front()?;
    let ud = w.wr.ud?;
    let mtu = cx.attr.path_mtu.bytes() as u64;
    if w.len > mtu {
        // A UD message is one packet: longer than the path MTU is a local length error.
        cx.fail_front(WcStatus::LocLenErr);
        return None;
    }
    let qkey = if ud.remote_qkey.is_controlled() {
        cx.attr.qkey
    } else {
        ud.remote_qkey
    };
    let (opcode, immdt) = match w.wr.op {
        SendOp::SendWithImm { imm } => (
            Opcode::UdSendOnlyWithImmediate,
            Some(immdt::Repr { data: imm }),
        ),
        _ => (Opcode::UdSendOnly, None),
    };
    let mut b = bth::Repr::new(opcode, ud.remote_qpn, req.ud_psn());
    b.solicited = w.wr.solicited;
    let ext = Ext {
        deth: Some(deth::Repr {
            qkey,
            src_qp: cx.qpn,
        }),
        immdt,
        ..Ext::default()
    };
    let mem = &cx.mem;
    let data = &w.wr.data;
    let r = emit_in_place(buf, b, ext, w.len as usize, |out| match data {
        SendData::Inline(d) => {
            out.copy_from_slice(d);
            Ok(())
        }
        SendData::Sges(s) => mem.gather(s, 0, out),
    });
    match r {
        Ok(len) => {
            cx.stats.tx_bytes += w.len;
            req.ud_sent();
            cx.complete_front(WcStatus::Success);
            Some((len, ud.ah))
        }
        Err(status) => {
            cx.fail_front(status);
            None
        }
    }
}

/// Delivers a received UD SEND; `grh` is the network header as the receive buffer gets it.
pub(crate) fn receive(cx: &mut QpCtx<'_>, packet: &PacketRepr<'_>, grh: &[u8; GRH_LEN]) {
    let Some(deth) = packet.ext.deth else {
        cx.stats.drop_opcode += 1;
        return;
    };
    if deth.qkey != cx.attr.qkey {
        cx.stats.drop_qkey += 1;
        return;
    }
    let Some(wr) = cx.rq.pop() else {
        cx.stats.drop_no_recv += 1;
        return;
    };
    let total = GRH_LEN + packet.payload.len();
    if (total as u64) > wr.len() {
        cx.push_completion(
            CqSide::Recv,
            Completion::new(wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, cx.qpn),
        );
        return;
    }
    let result = cx
        .mem
        .scatter(&wr.sges, 0, grh)
        .and_then(|()| cx.mem.scatter(&wr.sges, GRH_LEN as u64, packet.payload));
    let mut c = Completion::new(wr.wr_id, WcStatus::Success, WcOpcode::Recv, cx.qpn);
    match result {
        Ok(()) => {
            c.byte_len = total as u32;
            c.imm_data = packet.ext.immdt.map(|i| i.data);
            c.src_qp = deth.src_qp;
            c.grh = true;
            c.solicited = packet.bth.solicited;
        }
        Err(status) => c.status = status,
    }
    cx.push_completion(CqSide::Recv, c);
}
