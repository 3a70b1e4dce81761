//! UD: one packet per message, Q_Key checks, the 40-byte GRH area on receive.
//!
//! IBTA vol. 1, 9.8 (UD transport), our spec digest 4.3, 6 and 12; Linux `rxe_req.c`,
//! `rxe_resp.c` (`execute` writes the network header into the first 40 bytes).

use roce_wire::{bth, deth, immdt, Ext, Opcode, PacketRepr};

use crate::qp::{QueuePair, RecvMeta, Transmit};
use crate::rc::emit_in_place;
use crate::time::Instant;
use crate::verbs::{Completion, CqSide, SendData, SendOp, WcOpcode, WcStatus};

/// Bytes at the head of every UD receive buffer that hold the network header.
pub const GRH_LEN: usize = 40;

impl QueuePair {
    pub(crate) fn ud_next(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let w = self.sq.front()?;
        let ud = w.wr.ud?;
        let mtu = self.attr.path_mtu.bytes() as u64;
        if w.len > mtu {
            // A UD message is one packet: longer than the path MTU is a local length error.
            self.fail_front(WcStatus::LocLenErr);
            return None;
        }
        let qkey = if ud.remote_qkey.is_controlled() {
            self.attr.qkey
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
        let mut b = bth::Repr::new(opcode, ud.remote_qpn, self.req.next_psn);
        b.solicited = w.wr.solicited;
        let ext = Ext {
            deth: Some(deth::Repr {
                qkey,
                src_qp: self.qpn,
            }),
            immdt,
            ..Ext::default()
        };
        let mem = &self.mem;
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
                self.stats.tx_bytes += w.len;
                self.req.next_psn = self.req.next_psn.next();
                self.complete_front(WcStatus::Success);
                Some(self.transmit(len, ud.ah))
            }
            Err(status) => {
                self.fail_front(status);
                None
            }
        }
    }

    pub(crate) fn ud_receive(&mut self, packet: &PacketRepr<'_>, meta: &RecvMeta) {
        let Some(deth) = packet.ext.deth else {
            self.stats.drop_opcode += 1;
            return;
        };
        if deth.qkey != self.attr.qkey {
            self.stats.drop_qkey += 1;
            return;
        }
        let Some(wr) = self.rq.pop() else {
            self.stats.drop_no_recv += 1;
            return;
        };
        let total = GRH_LEN + packet.payload.len();
        if (total as u64) > wr.len() {
            self.push_completion(
                CqSide::Recv,
                Completion::new(wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, self.qpn),
            );
            return;
        }
        let result = self
            .mem
            .scatter(&wr.sges, 0, &meta.grh)
            .and_then(|()| self.mem.scatter(&wr.sges, GRH_LEN as u64, packet.payload));
        let mut c = Completion::new(wr.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
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
        self.push_completion(CqSide::Recv, c);
    }
}
