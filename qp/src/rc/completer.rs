//! RC completer: handles ACKs, NAKs, READ responses and atomic ACKs for the requester's WQEs,
//! completes them in order, and drives retries from the timers.
//!
//! **Read first:** IBTA vol. 1, 9.7.5.1 (requester response handling), 9.7.6 (timeouts,
//! retries), 9.7.5.2.8 (RNR); our spec digest 7.3-7.9; Linux `rxe_comp.c`.
//!
//! - An ACK or response with PSN p acknowledges every request with PSN <= p (9.7.5.1.2);
//!   SEND/WRITE WQEs whose last PSN is covered complete.
//! - An ACK that covers a READ or atomic whose response has not arrived means that response
//!   was lost: retry from the READ's first missing PSN (rxe `check_psn`, implied NAK).
//! - NAK PSN sequence error at p: everything before p is acknowledged; go back to p; one
//!   `retry_cnt` spent. `retry_cnt` 7 means seven retries (IBTA); only `rnr_retry` 7 is
//!   infinite (rxe also treats `retry_cnt` 7 as infinite: we do not).
//! - RNR NAK at p: acknowledged before p; wait the encoded time, then go back to p; one
//!   `rnr_retry` spent (7 = infinite).
//! - NAK invalid request / remote access / remote operational error at p: the WQE holding p
//!   completes with REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR and the QP enters ERR.
//! - ACK timeout: go back to the oldest unacknowledged PSN; one `retry_cnt` spent; when none
//!   is left the front WQE completes with RETRY_EXC_ERR and the QP enters ERR.

use roce_wire::aeth::{rnr_timer_ns, NakCode, Syndrome};
use roce_wire::{Opcode, PacketRepr, Psn};

use crate::qp::QueuePair;
use crate::time::Instant;
use crate::timer::Timer;
use crate::verbs::{SendData, SendOp, WcStatus};

impl QueuePair {
    pub(crate) fn rc_handle_response(&mut self, now: Instant, packet: &PacketRepr<'_>) {
        let psn = packet.bth.psn;
        match packet.bth.opcode {
            Opcode::RcAcknowledge => {
                let Some(aeth) = packet.ext.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => self.on_ack(now, psn),
                    Syndrome::RnrNak { timer } => self.on_rnr_nak(now, psn, timer),
                    Syndrome::Nak(NakCode::PsnSequenceError) => self.on_seq_nak(psn),
                    Syndrome::Nak(code) => self.on_fatal_nak(psn, code),
                    Syndrome::Reserved(_) => self.stats.drop_opcode += 1,
                }
            }
            Opcode::RcAtomicAcknowledge => self.on_atomic_ack(now, packet),
            Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly => self.on_read_response(now, packet),
            _ => self.stats.drop_opcode += 1,
        }
    }

    /// Whether `psn` lies in the window of sent-but-unacknowledged PSNs.
    fn psn_outstanding(&self, psn: Psn) -> bool {
        match self.una_psn() {
            Some(una) => psn.in_window(una, self.req.high_psn),
            None => false,
        }
    }

    /// Cumulative acknowledgement of every PSN <= `psn`: completes covered SEND/WRITE WQEs.
    /// Returns false if a READ/atomic before `psn` is still unanswered (its response was
    /// lost; the caller retries).
    fn ack_through(&mut self, psn: Psn) -> bool {
        if psn.is_after(self.req.acked_psn) {
            self.req.acked_psn = psn;
        }
        while let Some(w) = self.sq.front() {
            let (Some(first), Some(last)) = (w.first_psn, w.last_psn()) else {
                break;
            };
            if !w.all_sent && !last.is_after(psn) {
                // Packets of it were never sent yet can be acknowledged: impossible; stop.
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                if !first.is_after(psn) {
                    return false;
                }
                break;
            }
            if !last.is_after(psn) {
                self.complete_front(WcStatus::Success);
            } else {
                break;
            }
        }
        true
    }

    fn progress_made(&mut self, now: Instant) {
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_retry_left = self.attr.rnr_retry;
        self.timers.stop(Timer::AckTimeout);
        if self.has_outstanding() {
            if let Some(ns) = super::requester::ack_timeout_ns(self.attr.timeout) {
                self.timers.set(
                    Timer::AckTimeout,
                    Instant::from_nanos(now.as_nanos().saturating_add(ns)),
                );
            }
        }
    }

    fn on_ack(&mut self, now: Instant, psn: Psn) {
        if !self.psn_outstanding(psn) {
            // Duplicate or stale ACK.
            self.stats.drop_psn += 1;
            return;
        }
        let before = self.req.acked_psn;
        if !self.ack_through(psn) {
            // An ACK beyond an unanswered READ/atomic: its response was lost. Retry it.
            if let Some(una) = self.una_psn() {
                self.go_back(una);
            }
        }
        if self.req.acked_psn != before {
            self.progress_made(now);
        }
    }

    fn on_seq_nak(&mut self, psn: Psn) {
        self.stats.seq_naks_received += 1;
        if !self.psn_outstanding(psn) {
            self.stats.drop_psn += 1;
            return;
        }
        let before = self.req.acked_psn;
        self.ack_through(psn.sub(1));
        if self.req.acked_psn != before {
            // The NAK acknowledged new packets: that is progress, and the retry budget counts
            // consecutive failures only (rxe resets it when a WQE completes).
            self.req.retry_left = self.attr.retry_cnt;
            self.req.rnr_retry_left = self.attr.rnr_retry;
        }
        if self.req.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        let resume = self.una_psn().unwrap_or(psn);
        self.go_back(resume);
        self.timers.stop(Timer::AckTimeout);
    }

    fn on_rnr_nak(&mut self, now: Instant, psn: Psn, timer: u8) {
        self.stats.rnr_naks_received += 1;
        if !self.psn_outstanding(psn) {
            self.stats.drop_psn += 1;
            return;
        }
        self.ack_through(psn.sub(1));
        if self.req.rnr_retry_left == 0 {
            self.fail_front(WcStatus::RnrRetryExcErr);
            return;
        }
        if self.attr.rnr_retry != 7 {
            self.req.rnr_retry_left -= 1;
        }
        self.go_back(psn);
        self.req.rnr_wait = true;
        self.timers.stop(Timer::AckTimeout);
        self.timers.set(
            Timer::Rnr,
            Instant::from_nanos(now.as_nanos().saturating_add(rnr_timer_ns(timer))),
        );
    }

    fn on_fatal_nak(&mut self, psn: Psn, code: NakCode) {
        self.stats.nak_received(code);
        if !self.psn_outstanding(psn) {
            self.stats.drop_psn += 1;
            return;
        }
        self.ack_through(psn.sub(1));
        let status = match code {
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
            _ => WcStatus::RemOpErr,
        };
        self.fail_front(status);
    }

    fn on_read_response(&mut self, now: Instant, packet: &PacketRepr<'_>) {
        let psn = packet.bth.psn;
        let mtu = self.attr.path_mtu.bytes();
        let Some(w) = self.sq.front() else {
            self.stats.drop_psn += 1;
            return;
        };
        let (SendOp::RdmaRead { .. }, Some(first)) = (w.wr.op, w.first_psn) else {
            // A response that does not belong to the oldest WQE: maybe an old duplicate; the
            // AETH of FIRST/LAST/ONLY still acknowledges what precedes it.
            if packet.ext.aeth.is_some() && self.psn_outstanding(psn) {
                self.on_ack(now, psn);
            } else {
                self.stats.drop_psn += 1;
            }
            return;
        };
        let expected = first.add(w.read_pkts_done);
        if psn != expected {
            // Duplicate (before) or a gap (after): drop; a gap is repaired by the timeout.
            self.stats.drop_psn += 1;
            return;
        }
        let offset = w.read_pkts_done as u64 * mtu as u64;
        let remaining = w.len - offset.min(w.len);
        let is_last = matches!(
            packet.bth.opcode,
            Opcode::RcRdmaReadResponseLast | Opcode::RcRdmaReadResponseOnly
        );
        let len_ok = if is_last {
            packet.payload.len() as u64 == remaining
        } else {
            packet.payload.len() == mtu && (packet.payload.len() as u64) < remaining
        };
        // A re-requested partial READ gets a new FIRST/ONLY stream from its first missing PSN
        // (rxe `req_retry`), so FIRST/ONLY may come at any point; only a MIDDLE/LAST before
        // any data is out of place. The lengths pin the rest down.
        let middle_first = w.read_pkts_done == 0
            && matches!(
                packet.bth.opcode,
                Opcode::RcRdmaReadResponseMiddle | Opcode::RcRdmaReadResponseLast
            );
        if !len_ok || middle_first {
            self.stats.drop_length += 1;
            self.fail_front(WcStatus::BadRespErr);
            return;
        }
        let SendData::Sges(sges) = &w.wr.data else {
            self.fail_front(WcStatus::LocQpOpErr);
            return;
        };
        if let Err(status) = self.mem.scatter(sges, offset, packet.payload) {
            self.fail_front(status);
            return;
        }
        // INVARIANT: front exists: checked above and nothing removed it.
        let w = self.sq.front_mut().expect("front READ WQE");
        w.read_pkts_done += 1;
        if psn.is_after(self.req.acked_psn) {
            self.req.acked_psn = psn;
        }
        if is_last {
            self.complete_front(WcStatus::Success);
            self.complete_covered();
        }
        self.progress_made(now);
    }

    fn on_atomic_ack(&mut self, now: Instant, packet: &PacketRepr<'_>) {
        let psn = packet.bth.psn;
        let (Some(w), Some(ack)) = (self.sq.front(), packet.ext.atomic_ack_eth) else {
            self.stats.drop_psn += 1;
            return;
        };
        if !w.wr.op.is_atomic() || w.first_psn != Some(psn) || !w.all_sent {
            self.stats.drop_psn += 1;
            return;
        }
        let SendData::Sges(sges) = &w.wr.data else {
            self.fail_front(WcStatus::LocQpOpErr);
            return;
        };
        // The original value lands in host byte order, as verbs hands it to applications.
        if let Err(status) = self.mem.scatter(sges, 0, &ack.orig.to_ne_bytes()) {
            self.fail_front(status);
            return;
        }
        // INVARIANT: front exists: checked above.
        self.sq
            .front_mut()
            .expect("front atomic WQE")
            .read_pkts_done = 1;
        if psn.is_after(self.req.acked_psn) {
            self.req.acked_psn = psn;
        }
        self.complete_front(WcStatus::Success);
        self.complete_covered();
        self.progress_made(now);
    }

    /// After a READ or atomic completed: WQEs behind it that an earlier (reordered) ACK
    /// already covered complete now; a READ/atomic behind it that the ACK covered lost its
    /// response and is retried.
    fn complete_covered(&mut self) {
        if !self.ack_through(self.req.acked_psn) {
            if let Some(una) = self.una_psn() {
                self.go_back(una);
            }
        }
    }

    pub(crate) fn ack_timer_fired(&mut self) {
        if !self.has_outstanding() {
            return;
        }
        self.stats.timeouts += 1;
        if self.req.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        if let Some(una) = self.una_psn() {
            self.go_back(una);
        }
    }

    pub(crate) fn rnr_timer_fired(&mut self, _now: Instant) {
        self.req.rnr_wait = false;
    }
}
