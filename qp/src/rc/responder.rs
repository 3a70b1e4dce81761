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
//!   operational error. Each of these is fatal: the QP enters ERR after the NAK. The checks run
//!   in rxe's order (`rxe_resp.c`: operation allowed on the QP, resources, length, rkey, then
//!   execution), so a request with several faults gets rxe's NAK code.
//! - UC never acknowledges: on a PSN gap the message in progress is dropped and reception
//!   resumes at the next FIRST/ONLY.

use std::collections::VecDeque;

use roce_mr::Access;
use roce_wire::aeth::{NakCode, Syndrome, CREDIT_INVALID};
use roce_wire::opcode::{OpcodeInfo, Operation, Position};
use roce_wire::{aeth, atomic_ack_eth, bth, Ext, Msn, Opcode, PacketRepr, Psn, RKey};

use super::emit_in_place;
use crate::ctx::QpCtx;
use crate::mem::{AtomicOp, MemError};
use crate::verbs::{
    Completion, CqSide, FlushPlacement, QpState, QpType, RecvWr, WcOpcode, WcStatus,
};

/// A message being received.
#[derive(Debug)]
enum InMsg {
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
enum Resource {
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
    /// An ATOMIC WRITE or FLUSH executed at `psn`: a duplicate gets the same empty READ
    /// response and is never executed again (rxe `res->replay`).
    Done {
        psn: Psn,
    },
}

/// A response waiting to be sent.
#[derive(Clone, Copy, Debug)]
enum RespJob {
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

impl RespJob {
    /// An answer of one packet (anything but a READ response with data still to send).
    fn is_single_packet(&self) -> bool {
        !matches!(self, Self::Read { remaining, .. } if *remaining > 0)
    }
}

/// Responder state (rxe `struct rxe_resp_info`).
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// The expected PSN of the next new request.
    epsn: Psn,
    /// Messages completed (returned in every AETH).
    msn: Msn,
    /// A PSN sequence error NAK went out for `epsn`: drop further out-of-order requests
    /// silently until it arrives (C9-112).
    nak_sent: bool,
    /// The message being received.
    cur: Option<InMsg>,
    /// Saved READ/atomic state for duplicates, oldest first (at most `max_dest_rd_atomic`).
    resources: VecDeque<Resource>,
    /// Responses waiting to be sent.
    out: VecDeque<RespJob>,
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

    fn take_current_recv(&mut self) -> Option<RecvWr> {
        match self.cur.take() {
            Some(InMsg::Send { wr, .. }) => Some(wr),
            other => {
                self.cur = other;
                None
            }
        }
    }

    /// The QP entered ERR: the receive WR being filled and the receive queue are flushed (in
    /// that order), and of the queued responses only the final NAK and the single-packet
    /// answers before any READ stream still go out.
    pub(crate) fn on_error(&mut self, cx: &mut QpCtx<'_>) {
        if let Some(w) = self.take_current_recv() {
            cx.flush_recv(&w);
        }
        cx.flush_recv_queue();
        self.clear_pending_except_naks();
    }

    /// Checks the responder's invariants: in ERR no READ response stream is queued and no
    /// message is in progress.
    pub(crate) fn check(&self, state: QpState) -> Result<(), &'static str> {
        if state == QpState::Err {
            if self.cur.is_some() {
                return Err("ERR with a message in progress");
            }
            if !self.out.iter().all(RespJob::is_single_packet) {
                return Err("ERR with a READ response stream queued");
            }
        }
        Ok(())
    }

    /// In ERR no READ response stream goes on: it is dropped with everything queued after it
    /// except NAKs. The single-packet answers queued before it (ACKs, atomic ACKs, the empty
    /// READ responses of ATOMIC WRITE and FLUSH) answer requests that executed before the
    /// error; rxe sends those at execution, so they were on the wire before the error, and
    /// the requester completes them (only the WQE the NAK names fails).
    fn clear_pending_except_naks(&mut self) {
        let mut stream_seen = false;
        self.out.retain(|j| {
            let nak = matches!(
                j,
                RespJob::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            );
            stream_seen |= !j.is_single_packet();
            nak || (!stream_seen && j.is_single_packet())
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

impl Responder {
    pub(crate) fn on_request(&mut self, cx: &mut QpCtx<'_>, packet: &PacketRepr<'_>) {
        if cx.qp_type() == QpType::Uc {
            self.uc_request(cx, packet);
            return;
        }
        let psn = packet.bth.psn;
        if !self.in_sequence(cx, psn) {
            if psn.is_before(self.epsn) {
                self.duplicate_request(cx, packet);
            }
            return;
        }
        let result = self.execute(cx, packet);
        self.answer(cx, psn, result);
    }

    /// The RC PSN check (rxe `check_psn`): true for the expected PSN. A PSN after it gets one
    /// sequence-error NAK, then silent drops (C9-112); one before it is a duplicate, which
    /// the caller handles.
    fn in_sequence(&mut self, cx: &mut QpCtx<'_>, psn: Psn) -> bool {
        if psn.is_after(self.epsn) {
            if self.nak_sent {
                cx.stats.drop_psn += 1;
            } else {
                self.nak_sent = true;
                cx.stats.seq_naks_sent += 1;
                let msn = self.msn;
                self.out.push_back(RespJob::Ack {
                    psn: self.epsn,
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn,
                });
            }
            return false;
        }
        if psn.is_before(self.epsn) {
            return false;
        }
        self.nak_sent = false;
        true
    }

    /// Answers an in-sequence request that was executed (`Ok`) or refused.
    fn answer(&mut self, cx: &mut QpCtx<'_>, psn: Psn, result: Result<(), Reject>) {
        match result {
            Ok(()) => {}
            Err(Reject::Rnr) => {
                cx.stats.rnr_naks_sent += 1;
                let msn = self.msn;
                self.out.push_back(RespJob::Ack {
                    psn,
                    syndrome: Syndrome::RnrNak {
                        timer: cx.attr.min_rnr_timer,
                    },
                    msn,
                });
            }
            Err(Reject::Nak(code, status)) => {
                cx.stats.nak_sent(code);
                let msn = self.msn;
                self.out.push_back(RespJob::Ack {
                    psn,
                    syndrome: Syndrome::Nak(code),
                    msn,
                });
                // The receive WR being filled, if any, completes with the error.
                if let Some(wr) = self.take_current_recv() {
                    cx.push_completion(
                        CqSide::Recv,
                        Completion::new(wr.wr_id, status, WcOpcode::Recv, cx.qpn),
                    );
                }
                cx.enter_error(Some(status));
            }
        }
    }

    /// A request whose BTH PadCnt exceeds the bytes after its headers (the transport could
    /// not parse it; `bth` is all there is). rxe computes a negative payload length, which its
    /// length check (`rxe_resp_check_length`, C9-92) refuses: an RC request in sequence that
    /// carries a payload (SEND, RDMA WRITE, ATOMIC WRITE) is NAKed invalid request (0x61) and
    /// the QP enters ERR, after the checks rxe runs first (PSN, opcode sequence, QP rights,
    /// responder resources, a receive WR for a SEND: RNR NAK without one). Out-of-sequence and
    /// duplicate PSNs are handled as for any request; UC drops the message in progress.
    pub(crate) fn on_bad_pad(&mut self, cx: &mut QpCtx<'_>, bth: &bth::Repr) {
        let Some(info) = bth.opcode.info() else {
            cx.stats.drop_length += 1;
            return;
        };
        if !info.payload || info.is_response() {
            // rxe's length check looks at payload-bearing requests only; these are dropped.
            cx.stats.drop_length += 1;
            return;
        }
        if cx.qp_type() == QpType::Uc {
            // Class D: the message is dropped; reception resumes at the next FIRST/ONLY.
            cx.stats.drop_length += 1;
            self.uc_drop_message(cx);
            if bth.psn == self.epsn {
                self.epsn = bth.psn.next();
            }
            return;
        }
        if !self.in_sequence(cx, bth.psn) {
            if bth.psn.is_before(self.epsn) {
                // A duplicate SEND/WRITE is acknowledged again whatever its length (C9-105).
                cx.stats.duplicate_requests += 1;
                if matches!(info.operation, Operation::Send | Operation::Write) {
                    self.push_ack(self.epsn.sub(1));
                } else {
                    cx.stats.drop_length += 1;
                }
            }
            return;
        }
        let result = self.bad_length_reject(cx, info);
        self.answer(cx, bth.psn, Err(result));
    }

    /// Opcode sequence (C9-28..C9-31, rxe `check_op_seq`): a message in progress accepts only
    /// its own MIDDLE/LAST; without one, only a FIRST or ONLY.
    fn sequence_ok(&self, info: &OpcodeInfo) -> bool {
        let continues = matches!(info.position, Position::Middle | Position::Last);
        match (&self.cur, info.operation) {
            (Some(InMsg::Send { .. }), Operation::Send) => continues,
            (Some(InMsg::Write { .. }), Operation::Write) => continues,
            (Some(_), _) => false,
            (None, _) => !continues,
        }
    }

    /// What an in-sequence request with an impossible payload length gets, rxe's checks in
    /// order up to its length check.
    fn bad_length_reject(&mut self, cx: &QpCtx<'_>, info: &OpcodeInfo) -> Reject {
        if !self.sequence_ok(info) {
            return INV_REQ;
        }
        match info.operation {
            Operation::Send if info.is_start() && cx.rq.is_empty() => Reject::Rnr,
            _ => INV_REQ,
        }
    }

    fn check_length(
        cx: &QpCtx<'_>,
        packet: &PacketRepr<'_>,
        position: Position,
    ) -> Result<(), Reject> {
        let mtu = cx.attr.path_mtu.bytes();
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
    fn execute(&mut self, cx: &mut QpCtx<'_>, packet: &PacketRepr<'_>) -> Result<(), Reject> {
        let Some(info) = packet.bth.opcode.info() else {
            return Err(INV_REQ);
        };
        let psn = packet.bth.psn;
        if !self.sequence_ok(info) {
            return Err(INV_REQ);
        }
        match info.operation {
            Operation::Send => {
                Self::check_length(cx, packet, info.position)?;
                self.exec_send(cx, packet, info.is_start(), info.is_end())?;
                self.epsn = psn.next();
                if packet.bth.ack_req {
                    self.push_ack(psn);
                }
            }
            Operation::Write => {
                if !cx.access_allows(Access::REMOTE_WRITE) {
                    return Err(INV_REQ);
                }
                Self::check_length(cx, packet, info.position)?;
                self.exec_write(
                    cx,
                    packet,
                    info.is_start(),
                    info.is_end(),
                    info.has_immediate(),
                )?;
                self.epsn = psn.next();
                if packet.bth.ack_req {
                    self.push_ack(psn);
                }
            }
            Operation::ReadRequest => {
                if !cx.access_allows(Access::REMOTE_READ) || cx.attr.max_dest_rd_atomic == 0 {
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
                    cx.mem
                        .check_remote(cx.qpn, reth.rkey, reth.va, len, Access::REMOTE_READ)
                        .map_err(from_mem)?;
                }
                let mtu = cx.attr.path_mtu.bytes() as u64;
                let npkts = len.div_ceil(mtu).max(1) as u32;
                self.save_resource(
                    cx,
                    Resource::Read {
                        first: psn,
                        last: psn.add(npkts - 1),
                        va: reth.va,
                        rkey: reth.rkey,
                        len,
                    },
                );
                self.msn = self.msn.add(1);
                self.epsn = psn.add(npkts);
                let msn = self.msn;
                self.out.push_back(RespJob::Read {
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
                if !cx.access_allows(Access::REMOTE_ATOMIC) || cx.attr.max_dest_rd_atomic == 0 {
                    return Err(INV_REQ);
                }
                let Some(a) = packet.ext.atomic_eth else {
                    return Err(INV_REQ);
                };
                // No alignment check here: like rxe (`check_rkey` before `atomic_reply`), the
                // rkey, bounds and rights are checked first (a bad rkey is a remote access
                // error, 0x62, even at a misaligned address); the table then refuses a
                // misaligned word as an invalid request (0x61).
                let op = if info.operation == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = cx.mem.atomic(cx.qpn, a.rkey, a.va, op).map_err(from_mem)?;
                self.save_resource(cx, Resource::Atomic { psn, orig });
                self.msn = self.msn.add(1);
                self.epsn = psn.next();
                let msn = self.msn;
                self.out.push_back(RespJob::AtomicAck { psn, orig, msn });
            }
            Operation::AtomicWrite => {
                // rxe order: REMOTE_WRITE on the QP, a responder resource, the rkey and range,
                // the length (exactly 8 bytes, as the RETH says), then the alignment.
                if !cx.access_allows(Access::REMOTE_WRITE) || cx.attr.max_dest_rd_atomic == 0 {
                    return Err(INV_REQ);
                }
                Self::check_length(cx, packet, Position::Only)?;
                let Some(reth) = packet.ext.reth else {
                    return Err(INV_REQ);
                };
                let len = u64::from(reth.dma_len);
                if len > 1 << 31 {
                    return Err(INV_REQ);
                }
                cx.mem
                    .check_remote(cx.qpn, reth.rkey, reth.va, len.max(1), Access::REMOTE_WRITE)
                    .map_err(from_mem)?;
                let Ok(value) = <[u8; 8]>::try_from(packet.payload) else {
                    return Err(INV_REQ);
                };
                if len != 8 {
                    return Err(INV_REQ);
                }
                cx.mem
                    .atomic_write(cx.qpn, reth.rkey, reth.va, &value)
                    .map_err(from_mem)?;
                self.executed_without_data(cx, psn);
            }
            Operation::Flush => {
                let Some(feth) = packet.ext.feth else {
                    return Err(INV_REQ);
                };
                let placement = FlushPlacement::from_bits(feth.placement);
                let mut needed = Access::empty();
                if placement.contains(FlushPlacement::GLOBAL) {
                    needed |= Access::FLUSH_GLOBAL;
                }
                if placement.contains(FlushPlacement::PERSISTENT) {
                    needed |= Access::FLUSH_PERSISTENT;
                }
                if !cx.access_allows(needed) || cx.attr.max_dest_rd_atomic == 0 {
                    return Err(INV_REQ);
                }
                let Some(reth) = packet.ext.reth else {
                    return Err(INV_REQ);
                };
                let len = u64::from(reth.dma_len);
                if len > 1 << 31 {
                    return Err(INV_REQ);
                }
                // The rkey must grant the placement's FLUSH rights. A range flush checks its
                // range; a region flush (selectivity 1) checks the key at the given address
                // (rxe skips the range; our table checks keys at an address).
                cx.mem
                    .check_remote(cx.qpn, reth.rkey, reth.va, len.max(1), needed)
                    .map_err(from_mem)?;
                // Region memory is ordinary host memory that every access reaches at once:
                // a fence orders this FLUSH after the writes before it, for global visibility
                // and for "persistence" alike (nothing here is more durable than memory).
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                self.executed_without_data(cx, psn);
            }
            // Responses, CNPs: not requests.
            _ => return Err(INV_REQ),
        }
        Ok(())
    }

    /// An ATOMIC WRITE or FLUSH at `psn` executed: remember it for duplicates and answer with
    /// an RDMA READ response ONLY without payload (IBTA 1.5 A19; rxe `send_read_response_ack`).
    fn executed_without_data(&mut self, cx: &QpCtx<'_>, psn: Psn) {
        self.save_resource(cx, Resource::Done { psn });
        self.msn = self.msn.add(1);
        self.epsn = psn.next();
        self.push_empty_read_response(psn);
    }

    fn push_empty_read_response(&mut self, psn: Psn) {
        let msn = self.msn;
        self.out.push_back(RespJob::Read {
            psn,
            va: 0,
            rkey: RKey::new(0),
            remaining: 0,
            first: true,
            msn,
            duplicate: false,
        });
    }

    fn save_resource(&mut self, cx: &QpCtx<'_>, r: Resource) {
        let cap = usize::from(cx.attr.max_dest_rd_atomic.max(1));
        while self.resources.len() >= cap {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    fn exec_send(
        &mut self,
        cx: &mut QpCtx<'_>,
        packet: &PacketRepr<'_>,
        start: bool,
        end: bool,
    ) -> Result<(), Reject> {
        if start {
            let Some(wr) = cx.rq.pop() else {
                return Err(Reject::Rnr);
            };
            self.cur = Some(InMsg::Send { wr, offset: 0 });
        }
        let Some(InMsg::Send { wr, offset }) = &mut self.cur else {
            return Err(INV_REQ);
        };
        let new_end = *offset + packet.payload.len() as u64;
        if new_end > wr.len() {
            // The message is longer than the receive WR: LOC_LEN_ERR on the receive side.
            return Err(Reject::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr));
        }
        if let Err(status) = cx.mem.scatter(&wr.sges, *offset, packet.payload) {
            return Err(Reject::Nak(NakCode::RemoteOperationalError, status));
        }
        *offset = new_end;
        if end {
            let mut invalidated = None;
            if let Some(ieth) = packet.ext.ieth {
                if cx.mem.invalidate_remote(cx.qpn, ieth.rkey).is_err() {
                    return Err(INV_REQ);
                }
                invalidated = Some(ieth.rkey);
            }
            let Some(InMsg::Send { wr, offset }) = self.cur.take() else {
                return Err(INV_REQ);
            };
            let mut c = Completion::new(wr.wr_id, WcStatus::Success, WcOpcode::Recv, cx.qpn);
            c.byte_len = u32::try_from(offset).unwrap_or(u32::MAX);
            c.imm_data = packet.ext.immdt.map(|i| i.data);
            c.invalidated_rkey = invalidated;
            c.solicited = packet.bth.solicited;
            c.src_qp = cx.attr.dest_qpn;
            cx.push_completion(CqSide::Recv, c);
            self.msn = self.msn.add(1);
        }
        Ok(())
    }

    fn exec_write(
        &mut self,
        cx: &mut QpCtx<'_>,
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
                cx.mem
                    .check_remote(cx.qpn, reth.rkey, reth.va, total, Access::REMOTE_WRITE)
                    .map_err(from_mem)?;
            }
            self.cur = Some(InMsg::Write {
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
        }) = self.cur
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
            match cx.rq.pop() {
                Some(wr) => Some(wr),
                None => return Err(Reject::Rnr),
            }
        } else {
            None
        };
        if !packet.payload.is_empty() {
            if let Err(e) =
                cx.mem
                    .write_remote(cx.qpn, rkey, va.wrapping_add(offset), packet.payload)
            {
                if let Some(wr) = recv {
                    cx.rq.push_front(wr);
                }
                return Err(from_mem(e));
            }
        }
        if let Some(InMsg::Write { offset: o, .. }) = &mut self.cur {
            *o = new_end;
        }
        if end {
            self.cur = None;
            self.msn = self.msn.add(1);
            if let Some(wr) = recv {
                let mut c = Completion::new(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    cx.qpn,
                );
                c.byte_len = u32::try_from(total).unwrap_or(u32::MAX);
                c.imm_data = packet.ext.immdt.map(|i| i.data);
                c.solicited = packet.bth.solicited;
                c.src_qp = cx.attr.dest_qpn;
                cx.push_completion(CqSide::Recv, c);
            }
        }
        Ok(())
    }

    fn duplicate_request(&mut self, cx: &mut QpCtx<'_>, packet: &PacketRepr<'_>) {
        cx.stats.duplicate_requests += 1;
        let psn = packet.bth.psn;
        let Some(info) = packet.bth.opcode.info() else {
            return;
        };
        match info.operation {
            Operation::Send | Operation::Write => {
                // C9-105: do not execute again; acknowledge what was executed.
                self.push_ack(self.epsn.sub(1));
            }
            Operation::ReadRequest => {
                let Some(reth) = packet.ext.reth else { return };
                let found = self.resources.iter().any(|r| match *r {
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
                    Resource::Atomic { .. } | Resource::Done { .. } => false,
                });
                if found {
                    // The requester went back to `psn`: whatever we still meant to send from
                    // there on (the rest of a long response stream, earlier re-answers) is
                    // already behind its cursor and would only delay the answer it waits for;
                    // replace it, as rxe restarts the read (`rxe_resp.c`, duplicate READ).
                    self.out.retain(
                        |j| !matches!(j, RespJob::Read { psn: p, .. } if !p.is_before(psn)),
                    );
                    let msn = self.msn;
                    self.out.push_back(RespJob::Read {
                        psn,
                        va: reth.va,
                        rkey: reth.rkey,
                        remaining: u64::from(reth.dma_len),
                        first: true,
                        msn,
                        duplicate: true,
                    });
                } else {
                    cx.stats.drop_psn += 1;
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let saved = self.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                match saved {
                    Some(orig) => {
                        let msn = self.msn;
                        self.out.push_back(RespJob::AtomicAck { psn, orig, msn });
                    }
                    None => cx.stats.drop_psn += 1,
                }
            }
            Operation::AtomicWrite | Operation::Flush => {
                // oA19-14/15 and rxe: acknowledged again, never executed twice.
                let found = self
                    .resources
                    .iter()
                    .any(|r| matches!(*r, Resource::Done { psn: p } if p == psn));
                if found {
                    self.push_empty_read_response(psn);
                } else {
                    cx.stats.drop_psn += 1;
                }
            }
            _ => cx.stats.drop_opcode += 1,
        }
    }

    /// UC: no ACKs, no NAKs; a gap drops the message in progress.
    fn uc_request(&mut self, cx: &mut QpCtx<'_>, packet: &PacketRepr<'_>) {
        let psn = packet.bth.psn;
        let Some(info) = packet.bth.opcode.info() else {
            return;
        };
        if psn != self.epsn {
            cx.stats.drop_psn += 1;
            self.uc_drop_message(cx);
            if !info.is_start() {
                self.epsn = psn.next();
                return;
            }
        }
        self.epsn = psn.next();
        let continues = !info.is_start();
        let seq_ok = match (&self.cur, info.operation) {
            (Some(InMsg::Send { .. }), Operation::Send)
            | (Some(InMsg::Write { .. }), Operation::Write) => continues,
            (Some(_), _) => false,
            (None, _) => !continues,
        };
        if !seq_ok {
            cx.stats.drop_opcode += 1;
            self.uc_drop_message(cx);
            if continues {
                return;
            }
        }
        if Self::check_length(cx, packet, info.position).is_err() {
            cx.stats.drop_length += 1;
            self.uc_drop_message(cx);
            return;
        }
        let result = match info.operation {
            Operation::Send => self.exec_send(cx, packet, info.is_start(), info.is_end()),
            Operation::Write if cx.access_allows(Access::REMOTE_WRITE) => self.exec_write(
                cx,
                packet,
                info.is_start(),
                info.is_end(),
                info.has_immediate(),
            ),
            _ => Err(INV_REQ),
        };
        if let Err(r) = result {
            if r == Reject::Rnr {
                cx.stats.drop_no_recv += 1;
            } else {
                cx.stats.drop_opcode += 1;
            }
            self.uc_drop_message(cx);
        }
    }

    fn uc_drop_message(&mut self, cx: &mut QpCtx<'_>) {
        if let Some(wr) = self.take_current_recv() {
            // The receive WR was not consumed: it serves the next message.
            cx.rq.push_front(wr);
        }
        self.cur = None;
    }

    /// Builds the next response packet into `buf`; returns its length.
    pub(crate) fn next_response(&mut self, cx: &mut QpCtx<'_>, buf: &mut [u8]) -> Option<usize> {
        let job = self.out.pop_front()?;
        let dest = cx.attr.dest_qpn;
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
                let mtu = cx.attr.path_mtu.bytes() as u64;
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
                let mem = &cx.mem;
                let qpn = cx.qpn;
                let r = emit_in_place(buf, b, ext, chunk as usize, |out| {
                    if out.is_empty() {
                        Ok(())
                    } else {
                        mem.read_remote(qpn, rkey, va, out)
                    }
                });
                match r {
                    Ok(len) => {
                        cx.stats.tx_bytes += chunk;
                        if !last {
                            self.out.push_front(RespJob::Read {
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
                        cx.stats.drop_state += 1;
                        self.next_response(cx, buf)
                    }
                    Err(_) => {
                        // The region went away after the request was checked.
                        self.out.clear();
                        self.out.push_back(RespJob::Ack {
                            psn,
                            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                            msn,
                        });
                        cx.stats.nak_sent(NakCode::RemoteAccessError);
                        cx.enter_error(Some(WcStatus::RemAccessErr));
                        self.next_response(cx, buf)
                    }
                }
            }
        }
    }
}
