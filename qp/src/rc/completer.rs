//! RC completer: handles ACKs, NAKs, READ responses and atomic ACKs for the requester's WQEs,
//! completes them in order, and drives retries from the timers.
//!
//! **Read first:** IBTA vol. 1, 9.7.5.1 (requester response handling), 9.7.6 (timeouts,
//! retries), 9.7.5.2.8 (RNR); our spec digest 7.3-7.9; Linux `rxe_comp.c`.
//!
//! - An ACK or response with PSN p acknowledges every request with PSN <= p (9.7.5.1.2);
//!   SEND/WRITE WQEs whose last PSN is covered complete.
//! - An ACK that covers a READ or atomic whose response has not arrived means that response
//!   was lost: retry from the READ's first missing PSN (rxe `check_psn`, implied NAK). So does
//!   a READ response or atomic ACK for a later request (they carry an AETH too), once per
//!   retry episode.
//! - NAK PSN sequence error at p: everything before p is acknowledged; go back to p; one
//!   `retry_cnt` spent unless the NAK acknowledged something. A repeated NAK for the PSN the
//!   requester already went back to, with nothing acknowledged since, neither goes back again
//!   nor spends a retry (the responder NAKs again when packets sent before the rewind arrive
//!   out of sequence). Every go-back-N episode shrinks the requester's window (see
//!   `requester::Window`). `retry_cnt` 7 means seven retries (IBTA); only `rnr_retry` 7 is
//!   infinite (rxe also treats `retry_cnt` 7 as infinite: we do not).
//! - RNR NAK at p: acknowledged before p; wait the encoded time, then go back to p; one
//!   `rnr_retry` spent (7 = infinite).
//! - NAK invalid request / remote access / remote operational error at p: the WQE holding p
//!   completes with REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR and the QP enters ERR.
//! - ACK timeout: go back to the oldest unacknowledged PSN; one `retry_cnt` spent; when none
//!   is left the front WQE completes with RETRY_EXC_ERR and the QP enters ERR.
//! - Early retransmission (`Timer::Probe`, not in IBTA, like the adaptive retransmission of
//!   RDMA NICs): no progress for max(srtt + 4 rttvar, `QpConfig::early_retransmit_min_ns`),
//!   doubling per probe: go back to the oldest unacknowledged PSN, the window halves, no
//!   `retry_cnt` spent and the ACK timer keeps running (see [`Completer::probe_fired`]).

use roce_wire::aeth::{rnr_timer_ns, NakCode, Syndrome};
use roce_wire::{Opcode, PacketRepr, Psn};

use super::requester::{ack_timeout_ns, Requester};
use crate::ctx::QpCtx;
use crate::state::QpAttr;
use crate::time::Instant;
use crate::timer::Timer;
use crate::verbs::{SendData, SendOp, WcStatus};

/// Completer state (rxe `struct rxe_comp_info`): what is acknowledged and the retry budgets.
///
/// Invariants: `retry_left <= retry_cnt` and `rnr_retry_left <= rnr_retry` of the attributes
/// they were loaded from; both are reloaded on progress (a consecutive-failure budget).
#[derive(Debug, Default)]
pub(crate) struct Completer {
    /// Last PSN acknowledged (cumulative).
    acked_psn: Psn,
    /// Retries left for timeouts and sequence NAKs.
    retry_left: u8,
    /// Retries left for RNR NAKs (7 = infinite).
    rnr_retry_left: u8,
    /// The PSN the requester last went back to (sequence NAK, lost response, ACK timeout),
    /// while nothing after it is acknowledged: a sequence NAK for that same PSN repeats the
    /// one the rewind already answered and does not rewind again.
    rewound_to: Option<Psn>,
}

impl Completer {
    /// A new send PSN: nothing before it is outstanding.
    pub(crate) fn reset(&mut self, sq_psn: Psn) {
        self.acked_psn = sq_psn.sub(1);
        self.rewound_to = None;
    }

    /// Reloads both retry budgets from the attributes.
    pub(crate) fn reload_retries(&mut self, attr: &QpAttr) {
        self.retry_left = attr.retry_cnt;
        self.rnr_retry_left = attr.rnr_retry;
    }

    /// The last cumulatively acknowledged PSN.
    pub(crate) fn acked_psn(&self) -> Psn {
        self.acked_psn
    }

    /// Handles a response to one of our requests (ACK/NAK, READ response, atomic ACK).
    pub(crate) fn on_response(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        packet: &PacketRepr<'_>,
    ) {
        let psn = packet.bth.psn;
        match packet.bth.opcode {
            Opcode::RcAcknowledge => {
                let Some(aeth) = packet.ext.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => self.on_ack(req, cx, now, psn),
                    Syndrome::RnrNak { timer } => self.on_rnr_nak(req, cx, now, psn, timer),
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.on_seq_nak(req, cx, psn);
                    }
                    Syndrome::Nak(code) => self.on_fatal_nak(req, cx, psn, code),
                    Syndrome::Reserved(_) => cx.stats.drop_opcode += 1,
                }
            }
            Opcode::RcAtomicAcknowledge => self.on_atomic_ack(req, cx, now, packet),
            Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly => self.on_read_response(req, cx, now, packet),
            _ => cx.stats.drop_opcode += 1,
        }
    }

    /// Whether `psn` lies in the window of sent-but-unacknowledged PSNs.
    fn psn_outstanding(&self, req: &Requester, cx: &QpCtx<'_>, psn: Psn) -> bool {
        match cx.sq.una_psn(self.acked_psn) {
            Some(una) => psn.in_window(una, req.high_psn()),
            None => false,
        }
    }

    /// Cumulative acknowledgement of every PSN <= `psn`: completes covered SEND/WRITE WQEs.
    /// Returns false if a READ/atomic before `psn` is still unanswered (its response was
    /// lost; the caller retries).
    fn ack_through(&mut self, cx: &mut QpCtx<'_>, psn: Psn) -> bool {
        self.advance_acked(psn);
        while let Some(w) = cx.sq.front() {
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
                cx.complete_front(WcStatus::Success);
            } else {
                break;
            }
        }
        true
    }

    /// Moves the cumulative acknowledgement forward to `psn` (never back); once the PSN the
    /// requester went back to is acknowledged, that retry episode is over.
    fn advance_acked(&mut self, psn: Psn) {
        if psn.is_after(self.acked_psn) {
            self.acked_psn = psn;
        }
        if self.rewound_to.is_some_and(|r| !r.is_after(self.acked_psn)) {
            self.rewound_to = None;
        }
    }

    /// Go-back-N: resume transmission at `psn`.
    fn rewind(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, psn: Psn) {
        self.rewound_to = Some(psn);
        req.go_back(cx.sq, psn);
    }

    /// A go-back-N episode for a lost packet (not RNR): rewind, and the window shrinks.
    fn rewind_lost(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, psn: Psn, timeout: bool) {
        req.window_loss(timeout);
        self.rewind(req, cx, psn);
    }

    fn progress_made(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, now: Instant) {
        self.reload_retries(cx.attr);
        req.window_acked(self.acked_psn);
        req.rtt_acked(self.acked_psn, now);
        cx.timers.stop(Timer::AckTimeout);
        cx.timers.stop(Timer::Probe);
        if req.has_outstanding(cx.sq, self.acked_psn) {
            if let Some(ns) = ack_timeout_ns(cx.attr.timeout) {
                cx.timers.set(
                    Timer::AckTimeout,
                    Instant::from_nanos(now.as_nanos().saturating_add(ns)),
                );
            }
            req.arm_probe(cx, now);
        }
    }

    /// Retries from the oldest unacknowledged PSN, if any.
    fn retry_from_una(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, timeout: bool) {
        if let Some(una) = cx.sq.una_psn(self.acked_psn) {
            self.rewind_lost(req, cx, una, timeout);
        }
    }

    fn on_ack(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, now: Instant, psn: Psn) {
        if !self.psn_outstanding(req, cx, psn) {
            // Duplicate or stale ACK.
            cx.stats.drop_psn += 1;
            return;
        }
        let before = self.acked_psn;
        if !self.ack_through(cx, psn) {
            // An ACK beyond an unanswered READ/atomic: its response was lost. Retry it.
            self.retry_from_una(req, cx, false);
        }
        if self.acked_psn != before {
            self.progress_made(req, cx, now);
        }
    }

    fn on_seq_nak(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, psn: Psn) {
        if !self.psn_outstanding(req, cx, psn) {
            // A NAK for a PSN never sent (or already acknowledged): dropped, counted only as
            // a drop, not as a NAK received (rxe counts nothing for it either).
            cx.stats.drop_psn += 1;
            return;
        }
        cx.stats.seq_naks_received += 1;
        let before = self.acked_psn;
        self.ack_through(cx, psn.sub(1));
        let progress = self.acked_psn != before;
        if !progress && self.rewound_to == Some(psn) {
            // The requester already went back to `psn` and nothing was acknowledged since:
            // this NAK repeats the one that rewound (the responder NAKs again when packets
            // sent before that rewind arrive out of sequence). Going back again would resend
            // the window once more per repeated NAK, and spending a retry on it would fail a
            // connection that is making progress (the RETRY_EXC_ERR under load); should the
            // resent packet itself be lost, the ACK timeout goes back (IBTA 9.7.6.1.3; rxe's
            // `started_retry` likewise lets only a timeout start a second retry).
            return;
        }
        if progress {
            // The NAK acknowledged new packets: that is progress, and the retry budget counts
            // consecutive failures only (rxe resets it when a WQE completes).
            self.reload_retries(cx.attr);
            req.window_acked(self.acked_psn);
        }
        if self.retry_left == 0 {
            cx.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        let resume = cx.sq.una_psn(self.acked_psn).unwrap_or(psn);
        self.rewind_lost(req, cx, resume, false);
        cx.timers.stop(Timer::AckTimeout);
        cx.timers.stop(Timer::Probe);
    }

    fn on_rnr_nak(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        psn: Psn,
        timer: u8,
    ) {
        if !self.psn_outstanding(req, cx, psn) {
            // A NAK for a PSN never sent (or already acknowledged): dropped, counted only as
            // a drop, not as a NAK received (rxe counts nothing for it either).
            cx.stats.drop_psn += 1;
            return;
        }
        cx.stats.rnr_naks_received += 1;
        self.ack_through(cx, psn.sub(1));
        if self.rnr_retry_left == 0 {
            cx.fail_front(WcStatus::RnrRetryExcErr);
            return;
        }
        if cx.attr.rnr_retry != 7 {
            self.rnr_retry_left -= 1;
        }
        self.rewind(req, cx, psn);
        req.wait_rnr();
        cx.timers.stop(Timer::AckTimeout);
        cx.timers.stop(Timer::Probe);
        cx.timers.set(
            Timer::Rnr,
            Instant::from_nanos(now.as_nanos().saturating_add(rnr_timer_ns(timer))),
        );
    }

    fn on_fatal_nak(&mut self, req: &Requester, cx: &mut QpCtx<'_>, psn: Psn, code: NakCode) {
        if !self.psn_outstanding(req, cx, psn) {
            // A NAK for a PSN never sent (or already acknowledged): dropped, counted only as
            // a drop, not as a NAK received (rxe counts nothing for it either).
            cx.stats.drop_psn += 1;
            return;
        }
        cx.stats.nak_received(code);
        self.ack_through(cx, psn.sub(1));
        let status = match code {
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
            _ => WcStatus::RemOpErr,
        };
        cx.fail_front(status);
    }

    fn on_read_response(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        packet: &PacketRepr<'_>,
    ) {
        let psn = packet.bth.psn;
        let mtu = cx.attr.path_mtu.bytes();
        let Some(w) = cx.sq.front() else {
            cx.stats.drop_psn += 1;
            return;
        };
        if let (SendOp::AtomicWrite { .. } | SendOp::Flush { .. }, Some(first)) =
            (w.wr.op, w.first_psn)
        {
            self.on_empty_read_response(req, cx, now, packet, first);
            return;
        }
        let (SendOp::RdmaRead { .. }, Some(first)) = (w.wr.op, w.first_psn) else {
            // A response that does not belong to the oldest WQE: maybe an old duplicate; the
            // AETH of FIRST/LAST/ONLY still acknowledges what precedes it.
            if packet.ext.aeth.is_some() && self.psn_outstanding(req, cx, psn) {
                self.on_ack(req, cx, now, psn);
            } else {
                cx.stats.drop_psn += 1;
            }
            return;
        };
        let expected = first.add(w.read_pkts_done);
        if packet.ext.aeth.is_some() && self.past_unanswered_front(req, cx, now, psn) {
            return;
        }
        // INVARIANT: front exists: checked above and nothing removed it (the check above
        // returned false, so it changed nothing).
        let w = cx.sq.front().expect("front READ WQE");
        if psn != expected {
            // Duplicate (before) or a gap (after): drop; a gap is repaired by the timeout.
            cx.stats.drop_psn += 1;
            return;
        }
        let offset = w.read_pkts_done as u64 * mtu as u64;
        let remaining = w.len - offset.min(w.len);
        let is_last = matches!(
            packet.bth.opcode,
            Opcode::RcRdmaReadResponseLast | Opcode::RcRdmaReadResponseOnly
        );
        // A LAST/ONLY ends the WQE, or (a READ split while the window is shrunk, see the
        // requester) one of its requests: then it carries a full MTU and more remains.
        let ends_wqe = is_last && packet.payload.len() as u64 == remaining;
        let len_ok = if is_last {
            ends_wqe || (packet.payload.len() == mtu && (mtu as u64) < remaining)
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
        if (packet.payload.len() as u64) > remaining && !middle_first {
            // More data than the READ asked for: rxe's do_read -> copy_data finds the
            // response longer than what is left of the local buffer and completes the WQE with
            // LOC_PROT_ERR (the QP enters ERR). The response was processed, not dropped;
            // nothing is written.
            cx.fail_front(WcStatus::LocProtErr);
            return;
        }
        if !len_ok || middle_first {
            cx.stats.drop_length += 1;
            cx.fail_front(WcStatus::BadRespErr);
            return;
        }
        let SendData::Sges(sges) = &w.wr.data else {
            cx.fail_front(WcStatus::LocQpOpErr);
            return;
        };
        if let Err(status) = cx.mem.scatter(sges, offset, packet.payload) {
            cx.fail_front(status);
            return;
        }
        // INVARIANT: front exists: checked above and nothing removed it.
        let w = cx.sq.front_mut().expect("front READ WQE");
        w.read_pkts_done += 1;
        self.advance_acked(psn);
        if ends_wqe {
            cx.complete_front(WcStatus::Success);
            self.complete_covered(req, cx);
        }
        self.progress_made(req, cx, now);
    }

    /// The response to an ATOMIC WRITE or FLUSH at the front: an RDMA READ response ONLY with
    /// no payload at the WR's PSN (IBTA 1.5 A19; rxe `send_read_response_ack`).
    fn on_empty_read_response(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        packet: &PacketRepr<'_>,
        first: Psn,
    ) {
        let psn = packet.bth.psn;
        let all_sent = cx.sq.front().is_some_and(|w| w.all_sent);
        if psn != first || !all_sent {
            // A duplicate, or a response to something else: the ACK part of its AETH still
            // acknowledges what precedes it, as for any READ response out of place.
            if packet.ext.aeth.is_some() && self.psn_outstanding(req, cx, psn) && psn != first {
                self.on_ack(req, cx, now, psn);
            } else {
                cx.stats.drop_psn += 1;
            }
            return;
        }
        if packet.bth.opcode != Opcode::RcRdmaReadResponseOnly || !packet.payload.is_empty() {
            cx.stats.drop_length += 1;
            cx.fail_front(WcStatus::BadRespErr);
            return;
        }
        if let Some(w) = cx.sq.front_mut() {
            w.read_pkts_done = 1;
        }
        self.advance_acked(psn);
        cx.complete_front(WcStatus::Success);
        self.complete_covered(req, cx);
        self.progress_made(req, cx, now);
    }

    fn on_atomic_ack(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        packet: &PacketRepr<'_>,
    ) {
        let psn = packet.bth.psn;
        let (Some(w), Some(ack)) = (cx.sq.front(), packet.ext.atomic_ack_eth) else {
            cx.stats.drop_psn += 1;
            return;
        };
        if !w.wr.op.is_atomic() || w.first_psn != Some(psn) || !w.all_sent {
            if !self.past_unanswered_front(req, cx, now, psn) {
                cx.stats.drop_psn += 1;
            }
            return;
        }
        let SendData::Sges(sges) = &w.wr.data else {
            cx.fail_front(WcStatus::LocQpOpErr);
            return;
        };
        // The original value lands in host byte order, as verbs hands it to applications.
        if let Err(status) = cx.mem.scatter(sges, 0, &ack.orig.to_ne_bytes()) {
            cx.fail_front(status);
            return;
        }
        // INVARIANT: front exists: checked above.
        cx.sq.front_mut().expect("front atomic WQE").read_pkts_done = 1;
        self.advance_acked(psn);
        cx.complete_front(WcStatus::Success);
        self.complete_covered(req, cx);
        self.progress_made(req, cx, now);
    }

    /// A response with an AETH at `psn` (a READ response FIRST/LAST/ONLY, an atomic ACK) for a
    /// request after the whole of the front READ or atomic, which still waits for (part of) its
    /// own response. The responder answers in PSN order, so the front's answer was lost: as for
    /// an ACK beyond it ([`Self::on_ack`]; rxe `check_psn` retries the same way), everything
    /// before `psn` is acknowledged and the front is retried from its first missing PSN at
    /// once, instead of after an ACK timeout (which would also spend a retry). Once per
    /// episode: while the requester has already gone back to that PSN with nothing answered
    /// since, further such responses (the rest of a later READ's stream) change nothing; the
    /// ACK timeout covers a lost re-request. Returns whether the response was handled so.
    fn past_unanswered_front(
        &mut self,
        req: &mut Requester,
        cx: &mut QpCtx<'_>,
        now: Instant,
        psn: Psn,
    ) -> bool {
        let Some(w) = cx.sq.front() else {
            return false;
        };
        let past = w.wr.op.is_read_or_atomic() && w.last_psn().is_some_and(|l| psn.is_after(l));
        if !past || !self.psn_outstanding(req, cx, psn) {
            return false;
        }
        if self.rewound_to.is_some() && self.rewound_to == cx.sq.una_psn(self.acked_psn) {
            cx.stats.drop_psn += 1;
            return true;
        }
        self.on_ack(req, cx, now, psn);
        true
    }

    /// After a READ or atomic completed: WQEs behind it that an earlier (reordered) ACK
    /// already covered complete now; a READ/atomic behind it that the ACK covered lost its
    /// response and is retried.
    fn complete_covered(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>) {
        if !self.ack_through(cx, self.acked_psn) {
            self.retry_from_una(req, cx, false);
        }
    }

    /// The early retransmission timer fired (`Timer::Probe`): packets have been outstanding
    /// for several round trips with no progress, most likely because a retransmitted packet, a
    /// sequence NAK or the tail of a message was lost, none of which the responder reports
    /// again (one NAK per error episode, C9-112). Go back to the oldest unacknowledged PSN now
    /// rather than after the ACK timeout. A requester may send a packet again at any time (the
    /// responder answers duplicates, 9.7.5.1.1), so this is invisible to the peer but for the
    /// copies; like adaptive retransmission in RDMA NICs, it spends no `retry_cnt` and leaves
    /// the ACK timer running, so a dead peer is still detected after `retry_cnt` ACK timeouts.
    /// The window halves (a loss episode), and the next probe waits twice as long.
    pub(crate) fn probe_fired(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>, now: Instant) {
        // Never armed while an RNR wait holds the requester (`Requester::arm_probe`; an RNR
        // NAK stops it), so only a probe with nothing left to resend is moot.
        if !req.has_outstanding(cx.sq, self.acked_psn) {
            return;
        }
        cx.stats.early_retransmits += 1;
        req.probe_fired();
        self.retry_from_una(req, cx, false);
        // Re-armed by the first packet sent again; should none go (the window or the READ
        // limits hold them), from here.
        req.arm_probe(cx, now);
    }

    /// The ACK timer fired: go back to the oldest unacknowledged PSN, or give up.
    pub(crate) fn ack_timer_fired(&mut self, req: &mut Requester, cx: &mut QpCtx<'_>) {
        if !req.has_outstanding(cx.sq, self.acked_psn) {
            return;
        }
        cx.stats.timeouts += 1;
        if self.retry_left == 0 {
            cx.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        self.retry_from_una(req, cx, true);
    }
}
