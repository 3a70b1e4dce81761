//! RC and UC responder: checks PSNs and opcode sequences, executes SENDs, WRITEs, READs and
//! atomics against registered memory, and queues ACKs, NAKs, READ responses and atomic ACKs.
//!
//! **Read first:** IBTA vol. 1, 9.7.4 (responder), 9.7.5.2 (responder errors), 9.7.8
//! (duplicates); our spec digest 7.2-7.9; Linux `rxe_resp.c`.
//!
//! - PSN == expected: execute; expected += 1 (READ: += response packets) (9.7.4.1).
//! - PSN after expected: one NAK "PSN sequence error" carrying the expected PSN, then silent
//!   drops until the expected PSN arrives (C9-112).
//! - PSN before expected: a duplicate (9.7.4.1.4). SEND/WRITE: re-ACK the last executed PSN,
//!   do not execute again. READ: re-execute from the duplicate's PSN inside the saved
//!   resource. Atomic: resend the saved result, never execute twice (C9-113).
//! - ACKs are coalesced: a newer ACK replaces a queued older one (they are cumulative).
//! - No receive WR for a SEND or WRITE with immediate: RNR NAK with our `min_rnr_timer`.
//! - Opcode out of sequence, disallowed operation, bad length, misaligned atomic: NAK invalid
//!   request; bad rkey/bounds/rights: NAK remote access error; unusable receive WR: NAK remote
//!   operational error. Each of these is fatal: the QP enters ERR after the NAK.
//! - UC never acknowledges: on a PSN gap the message in progress is dropped and reception
//!   resumes at the next FIRST/ONLY.

use std::collections::VecDeque;

use roce_mr::Access;
use roce_wire::aeth::{NakCode, Syndrome, CREDIT_INVALID};
use roce_wire::opcode::{Operation, Position};
use roce_wire::{aeth, atomic_ack_eth, bth, Ext, Msn, Opcode, PacketRepr, Psn, RKey};

use super::emit_in_place;
use crate::mem::{AtomicOp, MemError};
use crate::qp::QueuePair;
use crate::verbs::{Completion, CqSide, QpType, RecvWr, WcOpcode, WcStatus};

/// A message being received.
#[derive(Debug)]
pub(crate) enum InMsg {
    Send {
        wr: RecvWr,
        offset: u64,
    },
    Write {
        va: u64,
        rkey: RKey,
        total: u64,
        offset: u64,
    },
}

/// Saved READ/atomic state for duplicate handling.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: RKey,
        len: u64,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A response waiting to be sent.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RespJob {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: Msn,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: Msn,
    },
    Read {
        psn: Psn,
        va: u64,
        rkey: RKey,
        remaining: u64,
        first: bool,
        msn: Msn,
        /// Answers a duplicate request: the original already executed, so the requester may
        /// have completed the READ and freed the region meanwhile.
        duplicate: bool,
    },
}

/// Responder state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    pub(crate) epsn: Psn,
    pub(crate) msn: Msn,
    pub(crate) nak_sent: bool,
    pub(crate) cur: Option<InMsg>,
    pub(crate) resources: VecDeque<Resource>,
    pub(crate) out: VecDeque<RespJob>,
}

impl Responder {
    pub(crate) fn reset(&mut self, rq_psn: Psn) {
        self.epsn = rq_psn;
        self.msn = Msn::new(0);
        self.nak_sent = false;
        self.cur = None;
        self.resources.clear();
        self.out.clear();
    }

    pub(crate) fn take_current_recv(&mut self) -> Option<RecvWr> {
        match self.cur.take() {
            Some(InMsg::Send { wr, .. }) => Some(wr),
            other => {
                self.cur = other;
                None
            }
        }
    }

    /// In ERR only the final NAK still goes out.
    pub(crate) fn clear_pending_except_naks(&mut self) {
        self.out.retain(|j| {
            matches!(
                j,
                RespJob::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.cur = None;
    }

    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(RespJob::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.out.back_mut()
        {
            // Cumulative: the newer ACK replaces the queued one.
            *p = psn;
            *m = msn;
            return;
        }
        self.out.push_back(RespJob::Ack {
            psn,
            syndrome: Syndrome::ACK_UNLIMITED,
            msn,
        });
    }
}

/// What went wrong with a request: the NAK to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reject {
    Rnr,
    Nak(NakCode, WcStatus),
}

const INV_REQ: Reject = Reject::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);

fn from_mem(e: MemError) -> Reject {
    match e {
        MemError::Access(nak) => Reject::Nak(nak, WcStatus::RemAccessErr),
        MemError::Local(_) => Reject::Nak(NakCode::RemoteOperationalError, WcStatus::LocProtErr),
    }
}

impl QueuePair {
    pub(crate) fn handle_request(&mut self, packet: &PacketRepr<'_>) {
        if self.cfg.qp_type == QpType::Uc {
            self.uc_request(packet);
            return;
        }
        let psn = packet.bth.psn;
        if psn.is_after(self.resp.epsn) {
            if self.resp.nak_sent {
                self.stats.drop_psn += 1;
            } else {
                self.resp.nak_sent = true;
                self.stats.seq_naks_sent += 1;
                let msn = self.resp.msn;
                self.resp.out.push_back(RespJob::Ack {
                    psn: self.resp.epsn,
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn,
                });
            }
            return;
        }
        if psn.is_before(self.resp.epsn) {
            self.duplicate_request(packet);
            return;
        }
        self.resp.nak_sent = false;
        match self.execute(packet) {
            Ok(()) => {}
            Err(Reject::Rnr) => {
                self.stats.rnr_naks_sent += 1;
                let msn = self.resp.msn;
                self.resp.out.push_back(RespJob::Ack {
                    psn,
                    syndrome: Syndrome::RnrNak {
                        timer: self.attr.min_rnr_timer,
                    },
                    msn,
                });
            }
            Err(Reject::Nak(code, status)) => {
                self.stats.nak_sent(code);
                let msn = self.resp.msn;
                self.resp.out.push_back(RespJob::Ack {
                    psn,
                    syndrome: Syndrome::Nak(code),
                    msn,
                });
                // The receive WR being filled, if any, completes with the error.
                if let Some(wr) = self.resp.take_current_recv() {
                    self.push_completion(
                        CqSide::Recv,
                        Completion::new(wr.wr_id, status, WcOpcode::Recv, self.qpn),
                    );
                }
                self.enter_error(Some(status));
            }
        }
    }

    fn check_length(&self, packet: &PacketRepr<'_>, position: Position) -> Result<(), Reject> {
        let mtu = self.attr.path_mtu.bytes();
        let n = packet.payload.len();
        let ok = match position {
            Position::First | Position::Middle => n == mtu,
            Position::Last => (1..=mtu).contains(&n),
            Position::Only => n <= mtu,
        };
        if ok {
            Ok(())
        } else {
            Err(INV_REQ)
        }
    }

    /// Executes an in-sequence RC request (psn == expected).
    fn execute(&mut self, packet: &PacketRepr<'_>) -> Result<(), Reject> {
        let Some(info) = packet.bth.opcode.info() else {
            return Err(INV_REQ);
        };
        let psn = packet.bth.psn;
        // Opcode sequence: a message in progress accepts only its own MIDDLE/LAST.
        let continues = matches!(info.position, Position::Middle | Position::Last);
        let seq_ok = match (&self.resp.cur, info.operation) {
            (Some(InMsg::Send { .. }), Operation::Send) => continues,
            (Some(InMsg::Write { .. }), Operation::Write) => continues,
            (Some(_), _) => false,
            (None, _) => !continues,
        };
        if !seq_ok {
            return Err(INV_REQ);
        }
        match info.operation {
            Operation::Send => {
                self.check_length(packet, info.position)?;
                self.exec_send(packet, info.is_start(), info.is_end())?;
                self.resp.epsn = psn.next();
                if packet.bth.ack_req {
                    self.resp.push_ack(psn);
                }
            }
            Operation::Write => {
                if !self.access_allows(Access::REMOTE_WRITE) {
                    return Err(INV_REQ);
                }
                self.check_length(packet, info.position)?;
                self.exec_write(packet, info.is_start(), info.is_end(), info.has_immediate())?;
                self.resp.epsn = psn.next();
                if packet.bth.ack_req {
                    self.resp.push_ack(psn);
                }
            }
            Operation::ReadRequest => {
                if !self.access_allows(Access::REMOTE_READ) || self.attr.max_dest_rd_atomic == 0 {
                    return Err(INV_REQ);
                }
                let Some(reth) = packet.ext.reth else {
                    return Err(INV_REQ);
                };
                let len = u64::from(reth.dma_len);
                if len > 1 << 31 {
                    return Err(INV_REQ);
                }
                if len > 0 {
                    self.mem
                        .check_remote(self.qpn, reth.rkey, reth.va, len, Access::REMOTE_READ)
                        .map_err(from_mem)?;
                }
                let mtu = self.attr.path_mtu.bytes() as u64;
                let npkts = len.div_ceil(mtu).max(1) as u32;
                self.save_resource(Resource::Read {
                    first: psn,
                    last: psn.add(npkts - 1),
                    va: reth.va,
                    rkey: reth.rkey,
                    len,
                });
                self.resp.msn = self.resp.msn.add(1);
                self.resp.epsn = psn.add(npkts);
                let msn = self.resp.msn;
                self.resp.out.push_back(RespJob::Read {
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    remaining: len,
                    first: true,
                    msn,
                    duplicate: false,
                });
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if !self.access_allows(Access::REMOTE_ATOMIC) || self.attr.max_dest_rd_atomic == 0 {
                    return Err(INV_REQ);
                }
                let Some(a) = packet.ext.atomic_eth else {
                    return Err(INV_REQ);
                };
                if a.va % 8 != 0 {
                    return Err(INV_REQ);
                }
                let op = if info.operation == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = self
                    .mem
                    .atomic(self.qpn, a.rkey, a.va, op)
                    .map_err(from_mem)?;
                self.save_resource(Resource::Atomic { psn, orig });
                self.resp.msn = self.resp.msn.add(1);
                self.resp.epsn = psn.next();
                let msn = self.resp.msn;
                self.resp
                    .out
                    .push_back(RespJob::AtomicAck { psn, orig, msn });
            }
            // FLUSH / ATOMIC WRITE are not offered by this device.
            _ => return Err(INV_REQ),
        }
        Ok(())
    }

    fn save_resource(&mut self, r: Resource) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= cap {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
    }

    fn exec_send(&mut self, packet: &PacketRepr<'_>, start: bool, end: bool) -> Result<(), Reject> {
        if start {
            let Some(wr) = self.rq.pop() else {
                return Err(Reject::Rnr);
            };
            self.resp.cur = Some(InMsg::Send { wr, offset: 0 });
        }
        let Some(InMsg::Send { wr, offset }) = &mut self.resp.cur else {
            return Err(INV_REQ);
        };
        let new_end = *offset + packet.payload.len() as u64;
        if new_end > wr.len() {
            // The message is longer than the receive WR: LOC_LEN_ERR on the receive side.
            return Err(Reject::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr));
        }
        if let Err(status) = self.mem.scatter(&wr.sges, *offset, packet.payload) {
            return Err(Reject::Nak(NakCode::RemoteOperationalError, status));
        }
        *offset = new_end;
        if end {
            let mut invalidated = None;
            if let Some(ieth) = packet.ext.ieth {
                if self.mem.invalidate_remote(self.qpn, ieth.rkey).is_err() {
                    return Err(INV_REQ);
                }
                invalidated = Some(ieth.rkey);
            }
            let Some(InMsg::Send { wr, offset }) = self.resp.cur.take() else {
                return Err(INV_REQ);
            };
            let mut c = Completion::new(wr.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
            c.byte_len = u32::try_from(offset).unwrap_or(u32::MAX);
            c.imm_data = packet.ext.immdt.map(|i| i.data);
            c.invalidated_rkey = invalidated;
            c.solicited = packet.bth.solicited;
            c.src_qp = self.attr.dest_qpn;
            self.push_completion(CqSide::Recv, c);
            self.resp.msn = self.resp.msn.add(1);
        }
        Ok(())
    }

    fn exec_write(
        &mut self,
        packet: &PacketRepr<'_>,
        start: bool,
        end: bool,
        imm: bool,
    ) -> Result<(), Reject> {
        if start {
            let Some(reth) = packet.ext.reth else {
                return Err(INV_REQ);
            };
            let total = u64::from(reth.dma_len);
            if total > 1 << 31 {
                return Err(INV_REQ);
            }
            if total > 0 {
                self.mem
                    .check_remote(self.qpn, reth.rkey, reth.va, total, Access::REMOTE_WRITE)
                    .map_err(from_mem)?;
            }
            self.resp.cur = Some(InMsg::Write {
                va: reth.va,
                rkey: reth.rkey,
                total,
                offset: 0,
            });
        }
        let Some(InMsg::Write {
            va,
            rkey,
            total,
            offset,
        }) = self.resp.cur
        else {
            return Err(INV_REQ);
        };
        let new_end = offset + packet.payload.len() as u64;
        if new_end > total || (end && new_end != total) {
            return Err(INV_REQ);
        }
        // WRITE with immediate consumes a receive WR at its last packet: take it before
        // touching memory, so an RNR NAK leaves everything as it was.
        let recv = if end && imm {
            match self.rq.pop() {
                Some(wr) => Some(wr),
                None => return Err(Reject::Rnr),
            }
        } else {
            None
        };
        if !packet.payload.is_empty() {
            if let Err(e) =
                self.mem
                    .write_remote(self.qpn, rkey, va.wrapping_add(offset), packet.payload)
            {
                if let Some(wr) = recv {
                    self.rq.push_front(wr);
                }
                return Err(from_mem(e));
            }
        }
        if let Some(InMsg::Write { offset: o, .. }) = &mut self.resp.cur {
            *o = new_end;
        }
        if end {
            self.resp.cur = None;
            self.resp.msn = self.resp.msn.add(1);
            if let Some(wr) = recv {
                let mut c = Completion::new(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    self.qpn,
                );
                c.byte_len = u32::try_from(total).unwrap_or(u32::MAX);
                c.imm_data = packet.ext.immdt.map(|i| i.data);
                c.solicited = packet.bth.solicited;
                c.src_qp = self.attr.dest_qpn;
                self.push_completion(CqSide::Recv, c);
            }
        }
        Ok(())
    }

    fn duplicate_request(&mut self, packet: &PacketRepr<'_>) {
        self.stats.duplicate_requests += 1;
        let psn = packet.bth.psn;
        let Some(info) = packet.bth.opcode.info() else {
            return;
        };
        match info.operation {
            Operation::Send | Operation::Write => {
                // C9-105: do not execute again; acknowledge what was executed.
                self.resp.push_ack(self.resp.epsn.sub(1));
            }
            Operation::ReadRequest => {
                let Some(reth) = packet.ext.reth else { return };
                let found = self.resp.resources.iter().any(|r| match *r {
                    Resource::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } => {
                        psn.in_closed_window(first, last)
                            && rkey == reth.rkey
                            && reth.va >= va
                            && reth.va.saturating_add(u64::from(reth.dma_len))
                                <= va.saturating_add(len)
                    }
                    Resource::Atomic { .. } => false,
                });
                if found {
                    // The requester went back to `psn`: whatever we still meant to send from
                    // there on (the rest of a long response stream, earlier re-answers) is
                    // already behind its cursor and would only delay the answer it waits for;
                    // replace it, as rxe restarts the read (`rxe_resp.c`, duplicate READ).
                    self.resp.out.retain(
                        |j| !matches!(j, RespJob::Read { psn: p, .. } if !p.is_before(psn)),
                    );
                    let msn = self.resp.msn;
                    self.resp.out.push_back(RespJob::Read {
                        psn,
                        va: reth.va,
                        rkey: reth.rkey,
                        remaining: u64::from(reth.dma_len),
                        first: true,
                        msn,
                        duplicate: true,
                    });
                } else {
                    self.stats.drop_psn += 1;
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let saved = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                match saved {
                    Some(orig) => {
                        let msn = self.resp.msn;
                        self.resp
                            .out
                            .push_back(RespJob::AtomicAck { psn, orig, msn });
                    }
                    None => self.stats.drop_psn += 1,
                }
            }
            _ => self.stats.drop_opcode += 1,
        }
    }

    /// UC: no ACKs, no NAKs; a gap drops the message in progress.
    fn uc_request(&mut self, packet: &PacketRepr<'_>) {
        let psn = packet.bth.psn;
        let Some(info) = packet.bth.opcode.info() else {
            return;
        };
        if psn != self.resp.epsn {
            self.stats.drop_psn += 1;
            self.uc_drop_message();
            if !info.is_start() {
                self.resp.epsn = psn.next();
                return;
            }
        }
        self.resp.epsn = psn.next();
        let continues = !info.is_start();
        let seq_ok = match (&self.resp.cur, info.operation) {
            (Some(InMsg::Send { .. }), Operation::Send)
            | (Some(InMsg::Write { .. }), Operation::Write) => continues,
            (Some(_), _) => false,
            (None, _) => !continues,
        };
        if !seq_ok {
            self.stats.drop_opcode += 1;
            self.uc_drop_message();
            if continues {
                return;
            }
        }
        if self.check_length(packet, info.position).is_err() {
            self.stats.drop_length += 1;
            self.uc_drop_message();
            return;
        }
        let result = match info.operation {
            Operation::Send => self.exec_send(packet, info.is_start(), info.is_end()),
            Operation::Write if self.access_allows(Access::REMOTE_WRITE) => {
                self.exec_write(packet, info.is_start(), info.is_end(), info.has_immediate())
            }
            _ => Err(INV_REQ),
        };
        if let Err(r) = result {
            if r == Reject::Rnr {
                self.stats.drop_no_recv += 1;
            } else {
                self.stats.drop_opcode += 1;
            }
            self.uc_drop_message();
        }
    }

    fn uc_drop_message(&mut self) {
        if let Some(wr) = self.resp.take_current_recv() {
            // The receive WR was not consumed: it serves the next message.
            self.rq.push_front(wr);
        }
        self.resp.cur = None;
    }

    /// Builds the next response packet into `buf`; returns its length.
    pub(crate) fn next_response(&mut self, buf: &mut [u8]) -> Option<usize> {
        let job = self.resp.out.pop_front()?;
        let dest = self.attr.dest_qpn;
        match job {
            RespJob::Ack { psn, syndrome, msn } => {
                let ext = Ext {
                    aeth: Some(aeth::Repr { syndrome, msn }),
                    ..Ext::default()
                };
                let b = bth::Repr::new(Opcode::RcAcknowledge, dest, psn);
                emit_in_place::<()>(buf, b, ext, 0, |_| Ok(())).ok()
            }
            RespJob::AtomicAck { psn, orig, msn } => {
                let ext = Ext {
                    aeth: Some(aeth::Repr {
                        syndrome: Syndrome::Ack {
                            credit_code: CREDIT_INVALID,
                        },
                        msn,
                    }),
                    atomic_ack_eth: Some(atomic_ack_eth::Repr { orig }),
                    ..Ext::default()
                };
                let b = bth::Repr::new(Opcode::RcAtomicAcknowledge, dest, psn);
                emit_in_place::<()>(buf, b, ext, 0, |_| Ok(())).ok()
            }
            RespJob::Read {
                psn,
                va,
                rkey,
                remaining,
                first,
                msn,
                duplicate,
            } => {
                let mtu = self.attr.path_mtu.bytes() as u64;
                let chunk = remaining.min(mtu);
                let last = remaining <= mtu;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RcRdmaReadResponseOnly,
                    (true, false) => Opcode::RcRdmaReadResponseFirst,
                    (false, false) => Opcode::RcRdmaReadResponseMiddle,
                    (false, true) => Opcode::RcRdmaReadResponseLast,
                };
                let mut ext = Ext::default();
                if first || last {
                    ext.aeth = Some(aeth::Repr {
                        syndrome: Syndrome::ACK_UNLIMITED,
                        msn,
                    });
                }
                let b = bth::Repr::new(opcode, dest, psn);
                let mem = &self.mem;
                let qpn = self.qpn;
                let r = emit_in_place(buf, b, ext, chunk as usize, |out| {
                    if out.is_empty() {
                        Ok(())
                    } else {
                        mem.read_remote(qpn, rkey, va, out)
                    }
                });
                match r {
                    Ok(len) => {
                        self.stats.tx_bytes += chunk;
                        if !last {
                            self.resp.out.push_front(RespJob::Read {
                                psn: psn.next(),
                                va: va.wrapping_add(chunk),
                                rkey,
                                remaining: remaining - chunk,
                                first: false,
                                msn,
                                duplicate,
                            });
                        }
                        Some(len)
                    }
                    Err(_) if duplicate => {
                        // Re-answering a duplicate whose region is gone: the original READ
                        // executed in full, and the requester, which freed the region, has
                        // its data. Stop re-answering; do not fail the QP (rxe keeps the MR
                        // referenced instead; either way the connection survives).
                        self.stats.drop_state += 1;
                        self.next_response(buf)
                    }
                    Err(_) => {
                        // The region went away after the request was checked.
                        self.resp.out.clear();
                        self.resp.out.push_back(RespJob::Ack {
                            psn,
                            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                            msn,
                        });
                        self.stats.nak_sent(NakCode::RemoteAccessError);
                        self.enter_error(Some(WcStatus::RemAccessErr));
                        self.next_response(buf)
                    }
                }
            }
        }
    }
}
