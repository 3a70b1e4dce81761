//! RC (and UC) requester: segments send WRs into packets, assigns PSNs, sets AckReq, enforces
//! the in-flight and READ/atomic limits, and rewinds for go-back-N retransmission.
//!
//! **Read first:** IBTA vol. 1, 9.5 (transaction ordering), 9.7.1 (PSN), 9.7.4 (requester),
//! our spec digest 6 and 7; Linux `rxe_req.c`.
//!
//! Rules implemented here:
//! - a message of L bytes is one ONLY packet if L <= PMTU, else FIRST, MIDDLE*, LAST; FIRST
//!   and MIDDLE carry exactly one PMTU; RETH only on WRITE FIRST/ONLY; ImmDt/IETH only on
//!   LAST/ONLY (9.7.5.1);
//! - each request packet takes one PSN, a READ REQUEST takes one per response packet (9.7.1);
//! - AckReq on the last/only packet of every message and every `ack_req_every` packets (RC);
//! - go-back-N: after a timeout or a sequence NAK at PSN p, transmission resumes at p,
//!   restarting a partially acknowledged message at the packet for p and re-requesting only
//!   the missing part of a READ (rxe `req_retry`).

use std::collections::VecDeque;

use roce_wire::opcode::{ExtHeaders, Operation, Position, Transport};
use roce_wire::{atomic_eth, bth, feth, ieth, immdt, reth, Ext, Opcode, Psn};

use super::emit_in_place;
use crate::ctx::QpCtx;
use crate::time::Instant;
use crate::timer::Timer;
use crate::verbs::{QpState, QpType, SendData, SendOp, WcStatus};
use crate::wq::SendQueue;

/// Requester state (rxe `struct rxe_req_info`): where transmission stands in PSN space. The
/// transmit cursor (which WQE, which packet) is the send queue's ([`SendQueue`]).
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// PSN of the next packet to send.
    next_psn: Psn,
    /// Highest PSN ever assigned + 1: packets before it are retransmissions.
    high_psn: Psn,
    /// Packets since the last AckReq.
    since_ack_req: u32,
    /// Waiting for the RNR timer: send nothing.
    rnr_wait: bool,
    /// The go-back-N window (RC): most packets sent past the oldest unacknowledged PSN.
    window: Window,
    /// The last response PSN of every READ/atomic request sent for the first time (oldest
    /// first) that may still be re-requested, i.e. that ends at or after the oldest
    /// unacknowledged PSN. Each one holds a saved resource at the responder
    /// (`max_dest_rd_atomic` of them, the oldest evicted first), so at most `max_rd_atomic`
    /// may be outstanding, counting every request of a split READ; and a re-request must lie
    /// inside one of them, or the responder has nothing to replay it from and drops it.
    rd_ends: VecDeque<Psn>,
    /// Round-trip estimate for early retransmission (`Timer::Probe`).
    rtt: Rtt,
}

/// The requester's round-trip estimate (RFC 6298 smoothing), which paces early
/// retransmission ([`crate::timer::Timer::Probe`]).
///
/// One sample in flight at a time: the last PSN of a packet sent with AckReq set, timed until
/// an acknowledgement covers it. A go-back-N rewind to or before that PSN drops the sample
/// (the PSN will be sent again, and its ACK could answer either copy). Retransmitted packets
/// are timed too (under steady loss a go-back-N requester may send nothing new for a long
/// time, and would never measure at all); an ACK for an earlier copy of one can only make
/// the estimate shorter, and the wait never goes below `QpConfig::early_retransmit_min_ns`.
#[derive(Debug, Default)]
struct Rtt {
    /// The PSN being timed and when it was sent.
    timing: Option<(Psn, Instant)>,
    /// Smoothed round trip, ns (0: no sample yet, no early retransmission).
    srtt_ns: u64,
    /// Its mean deviation, ns.
    rttvar_ns: u64,
    /// Early retransmissions since the last progress: the wait doubles per probe.
    backoff: u32,
}

impl Rtt {
    fn sample(&mut self, ns: u64) {
        let ns = ns.max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = ns;
            self.rttvar_ns = ns / 2;
        } else {
            let dev = self.srtt_ns.abs_diff(ns);
            self.rttvar_ns = (3 * self.rttvar_ns + dev) / 4;
            self.srtt_ns = (7 * self.srtt_ns + ns) / 8;
        }
    }
}

/// The requester's go-back-N window, in packets (additive increase, multiplicative decrease).
///
/// Go-back-N resends everything in flight after a lost (or reordered) packet, so one loss
/// costs about as many retransmissions as there are packets in flight, and the resent packets
/// meet the same loss and reordering again: with a fixed window of W packets and a fault
/// chance q per packet, each round of W packets advances about 1/q packets, about q x W
/// transmissions per data packet (measured: 10% loss + 10% reordering with W = 512, about 60
/// transmissions per data packet over the simulator, 54 over udp). The window therefore halves
/// at every go-back-N episode (a timeout shrinks it to the minimum) and grows again as packets
/// are acknowledged, by one per acknowledged packet up to `ssthresh`, then by one per window
/// (TCP's AIMD, RFC 5681): a lossy link keeps few packets in flight and each loss costs a few
/// retransmissions, a clean link opens it back to `max_inflight_packets` within a few round
/// trips. It starts fully open, so a link without faults behaves exactly as a fixed window.
///
/// Invariant: `MIN_WINDOW <= cwnd <= max`, `MIN_WINDOW <= ssthresh <= max` once `max` is set.
#[derive(Debug, Default)]
struct Window {
    /// Packets allowed in flight now.
    cwnd: u32,
    /// Where growth turns from one per acknowledged packet to one per window.
    ssthresh: u32,
    /// Packets acknowledged since the last increase above `ssthresh`.
    acked_credit: u32,
    /// The ceiling (`QpConfig::max_inflight_packets`), 0 until first used.
    max: u32,
    /// The last acknowledged PSN the window has counted.
    acked: Psn,
}

/// AckReqs per go-back-N window, at least (more with `QpConfig::ack_req_every`): a lost ACK
/// then does not leave the window shut. Measured over the simulator (16 x 512 KiB WRITEs,
/// `qp/tests/early_retransmit.rs`'s link): one per window needs 16 / 197 / 537 early
/// retransmissions at 1% / 5% / 10% loss, two need 7 / 127 / 391 (9.4 -> 5.9 ms, 93 -> 62
/// ms, 264 -> 198 ms per transfer); four are no better than two.
const ACK_REQS_PER_WINDOW: u32 = 2;

/// The smallest go-back-N window: enough to keep a message end and an AckReq in flight.
const MIN_WINDOW: u32 = 4;

/// While the window is shrunk, READ requests end at multiples of this many response packets.
const READ_SPLIT: u32 = 16;

impl Window {
    fn reset(&mut self, acked: Psn) {
        *self = Self {
            acked,
            ..Self::default()
        };
    }

    /// Opens the window to `max` the first time (and follows a changed configuration).
    fn ensure(&mut self, max: u32) {
        let max = max.max(1);
        if self.max != max {
            self.max = max;
            self.cwnd = max;
            self.ssthresh = max;
            self.acked_credit = 0;
        }
    }

    fn limit(&self) -> u32 {
        self.cwnd.clamp(1, self.max.max(1))
    }
}

impl Requester {
    pub(crate) fn reset(&mut self, sq_psn: Psn) {
        self.next_psn = sq_psn;
        self.high_psn = sq_psn;
        self.rnr_wait = false;
        self.since_ack_req = 0;
        self.window.reset(sq_psn.sub(1));
        self.rd_ends.clear();
        self.rtt = Rtt::default();
    }

    /// The completer acknowledged every PSN up to `acked` (progress): a timed PSN it covers
    /// is a round-trip sample, and early retransmission starts again from its shortest wait.
    pub(crate) fn rtt_acked(&mut self, acked: Psn, now: Instant) {
        if let Some((psn, sent)) = self.rtt.timing {
            if !psn.is_after(acked) {
                self.rtt
                    .sample(now.as_nanos().saturating_sub(sent.as_nanos()));
                self.rtt.timing = None;
            }
        }
        self.rtt.backoff = 0;
    }

    /// How long after the last progress (or the last early retransmission) packets still
    /// unacknowledged are sent again: max(srtt + 4 rttvar, the configured minimum), doubled
    /// per early retransmission without progress; `None` when disabled, while waiting out an
    /// RNR NAK, or when it would not come well before the ACK timeout anyway.
    fn probe_ns(&self, cx: &QpCtx<'_>) -> Option<u64> {
        let min = cx.cfg.early_retransmit_min_ns?;
        if self.rnr_wait {
            return None;
        }
        // Before the first sample (the first ACK lost, or every packet since the connection
        // began sent again), four times the minimum: as TCP's initial RTO, cautious.
        let base = if self.rtt.srtt_ns == 0 {
            min.saturating_mul(4)
        } else {
            (self.rtt.srtt_ns + 4 * self.rtt.rttvar_ns).max(min)
        };
        let ns = base.saturating_mul(1 << self.rtt.backoff.min(20));
        match ack_timeout_ns(cx.attr.timeout) {
            Some(ack) if ns >= ack / 2 => None,
            _ => Some(ns),
        }
    }

    /// Arms the early retransmission timer from `now`, unless armed or not applicable.
    pub(crate) fn arm_probe(&self, cx: &mut QpCtx<'_>, now: Instant) {
        if cx.qp_type() != QpType::Rc || cx.timers.is_set(Timer::Probe) {
            return;
        }
        if let Some(ns) = self.probe_ns(cx) {
            cx.timers.set(
                Timer::Probe,
                Instant::from_nanos(now.as_nanos().saturating_add(ns)),
            );
        }
    }

    /// An early retransmission fired: the next one waits twice as long.
    pub(crate) fn probe_fired(&mut self) {
        self.rtt.backoff = self.rtt.backoff.saturating_add(1);
    }

    /// The completer acknowledged every PSN up to `acked`: the window grows.
    pub(crate) fn window_acked(&mut self, acked: Psn) {
        let w = &mut self.window;
        let n = acked.diff(w.acked);
        if n <= 0 || w.max == 0 {
            return;
        }
        w.acked = acked;
        let mut n = n as u32;
        if w.cwnd < w.ssthresh {
            let step = n.min(w.ssthresh - w.cwnd);
            w.cwnd += step;
            n -= step;
        }
        w.acked_credit = w.acked_credit.saturating_add(n);
        while w.acked_credit >= w.cwnd && w.cwnd < w.max {
            w.acked_credit -= w.cwnd;
            w.cwnd += 1;
        }
        if w.cwnd >= w.max {
            w.acked_credit = 0;
        }
    }

    /// A go-back-N episode starts after a sequence NAK or a lost READ/atomic response: the
    /// window halves. `timeout`: after an ACK timeout it drops to the minimum.
    pub(crate) fn window_loss(&mut self, timeout: bool) {
        let w = &mut self.window;
        if w.max == 0 {
            return;
        }
        let floor = MIN_WINDOW.min(w.max);
        w.ssthresh = (w.cwnd / 2).max(floor);
        w.cwnd = if timeout { floor } else { w.ssthresh };
        w.acked_credit = 0;
    }

    /// Highest PSN ever sent + 1.
    pub(crate) fn high_psn(&self) -> Psn {
        self.high_psn
    }

    /// After an RNR NAK: send nothing until [`Self::rnr_timer_fired`].
    pub(crate) fn wait_rnr(&mut self) {
        self.rnr_wait = true;
    }

    /// The RNR wait is over: transmission resumes (from where go-back-N put the cursor).
    pub(crate) fn rnr_timer_fired(&mut self) {
        self.rnr_wait = false;
    }

    /// UD: the PSN of the next datagram (UD has no acknowledgement and no window).
    pub(crate) fn ud_psn(&self) -> Psn {
        self.next_psn
    }

    /// UD: a datagram went out with [`Self::ud_psn`].
    pub(crate) fn ud_sent(&mut self) {
        self.next_psn = self.next_psn.next();
    }

    /// Checks the requester's invariants (RC/UC): the next PSN never passes the highest
    /// sent.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if self.next_psn.is_after(self.high_psn) {
            return Err("requester next PSN after the highest PSN sent");
        }
        Ok(())
    }
}

/// The local ACK timeout: 4.096 us x 2^timeout (`None` for 0 = infinite).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4_096u64 << timeout.min(31))
}

/// The request opcode of packet `first`/`last` of a WR, from wire's opcode table. `None` for
/// an operation that sends no packet (LOCAL_INV) or that the transport lacks.
fn opcode_for(op: SendOp, first: bool, last: bool, uc: bool) -> Option<Opcode> {
    let position = match (first, last) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, false) => Position::Middle,
        (false, true) => Position::Last,
    };
    // Immediate data and the invalidate rkey ride on the last (or only) packet.
    let at_end = |h: ExtHeaders| if last { h } else { ExtHeaders::NONE };
    let (operation, position, trailer) = match op {
        SendOp::Send => (Operation::Send, position, ExtHeaders::NONE),
        SendOp::SendWithImm { .. } => (Operation::Send, position, at_end(ExtHeaders::IMMDT)),
        SendOp::SendWithInv { .. } => (Operation::Send, position, at_end(ExtHeaders::IETH)),
        SendOp::RdmaWrite { .. } => (Operation::Write, position, ExtHeaders::NONE),
        SendOp::RdmaWriteWithImm { .. } => (Operation::Write, position, at_end(ExtHeaders::IMMDT)),
        SendOp::RdmaRead { .. } => (Operation::ReadRequest, Position::Only, ExtHeaders::NONE),
        SendOp::AtomicCmpAndSwp { .. } => {
            (Operation::CompareSwap, Position::Only, ExtHeaders::NONE)
        }
        SendOp::AtomicFetchAndAdd { .. } => (Operation::FetchAdd, Position::Only, ExtHeaders::NONE),
        SendOp::AtomicWrite { .. } => (Operation::AtomicWrite, Position::Only, ExtHeaders::NONE),
        SendOp::Flush { .. } => (Operation::Flush, Position::Only, ExtHeaders::NONE),
        SendOp::LocalInv { .. } => return None,
    };
    let transport = if uc { Transport::Uc } else { Transport::Rc };
    Opcode::request(transport, operation, position, trailer)
}

impl Requester {
    /// Whether any request packet is outstanding (sent, not acknowledged), given the last
    /// cumulatively acknowledged PSN.
    pub(crate) fn has_outstanding(&self, sq: &SendQueue, acked: Psn) -> bool {
        sq.una_psn(acked)
            .is_some_and(|una| self.high_psn.is_after(una))
    }

    fn arm_ack_timer(cx: &mut QpCtx<'_>, now: Instant) {
        if cx.qp_type() != QpType::Rc || cx.timers.is_set(Timer::AckTimeout) {
            return;
        }
        if let Some(ns) = ack_timeout_ns(cx.attr.timeout) {
            cx.timers.set(
                Timer::AckTimeout,
                Instant::from_nanos(now.as_nanos().saturating_add(ns)),
            );
        }
    }

    /// Builds the next request packet into `buf`; returns its length. `acked` is the last
    /// cumulatively acknowledged PSN (the completer's).
    pub(crate) fn next_request(
        &mut self,
        cx: &mut QpCtx<'_>,
        acked: Psn,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<usize> {
        if self.rnr_wait {
            return None;
        }
        loop {
            let cur = cx.sq.cur;
            let w = cx.sq.get(cur)?;
            if let SendOp::LocalInv { key } = w.wr.op {
                // Local operations run in order: only once everything before them completed.
                if cur != 0 {
                    return None;
                }
                let status = match cx.mem.invalidate_local(cx.qpn, key) {
                    Ok(()) => WcStatus::Success,
                    Err(s) => s,
                };
                if status == WcStatus::Success {
                    cx.complete_front(status);
                } else {
                    cx.fail_front(status);
                }
                continue;
            }
            if w.first_psn.is_none() && *cx.state == QpState::Sqd {
                return None; // SQD: finish what is in flight, start nothing new.
            }
            if cx.qp_type() == QpType::Rc {
                self.window.ensure(cx.cfg.max_inflight_packets);
                if let Some(una) = cx.sq.una_psn(acked) {
                    if self.next_psn.diff(una) >= self.window.limit() as i32 {
                        return None;
                    }
                }
                if w.wr.op.is_read_or_atomic() {
                    // Requests ending before the oldest unacknowledged PSN are answered: the
                    // responder's resources for them are no longer needed.
                    match cx.sq.una_psn(acked) {
                        Some(una) => {
                            while self.rd_ends.front().is_some_and(|e| e.is_before(una)) {
                                self.rd_ends.pop_front();
                            }
                        }
                        None => self.rd_ends.clear(),
                    }
                    // A request sent for the first time takes a responder resource; a
                    // re-request replays inside one it already holds. Every request of a READ
                    // split while the window is shrunk counts (IBTA 9.5: max_rd_atomic bounds
                    // the outstanding READ/atomic requests); one more than the responder keeps
                    // would evict the oldest, whose lost responses could then never be
                    // re-requested (RETRY_EXC_ERR after `retry_cnt` ACK timeouts).
                    let new = w
                        .first_psn
                        .is_none_or(|f| !f.add(cx.sq.cur_pkt).is_before(self.high_psn));
                    if new && self.rd_ends.len() >= usize::from(cx.attr.max_rd_atomic.max(1)) {
                        return None;
                    }
                }
                if w.wr.op.is_read_or_atomic() && cx.sq.cur_pkt == 0 {
                    let outstanding = cx
                        .sq
                        .iter()
                        .take(cur)
                        .filter(|w| w.wr.op.is_read_or_atomic())
                        .count();
                    if outstanding >= usize::from(cx.attr.max_rd_atomic.max(1)) {
                        return None;
                    }
                }
            }
            // Room left in the window, in packets (at least 1 here). The packet that fills it
            // asks for an ACK, or nothing would open it again before the ACK timeout.
            let room = match cx.sq.una_psn(acked) {
                Some(una) if cx.qp_type() == QpType::Rc => {
                    (self.window.limit() as i32 - self.next_psn.diff(una)).max(1) as u32
                }
                _ => self.window.limit(),
            };
            return self.build_request(cx, now, buf, room);
        }
    }

    fn build_request(
        &mut self,
        cx: &mut QpCtx<'_>,
        now: Instant,
        buf: &mut [u8],
        room: u32,
    ) -> Option<usize> {
        let fills_window = cx.qp_type() == QpType::Rc && room <= 1;
        // While the window is shrunk after losses, a READ asks for at most the packets up to
        // the next multiple of READ_SPLIT: its response stream is go-back-N too (a lost
        // response packet drops the rest of the stream until the READ is re-requested), so an
        // unbounded READ would cost up to its whole length per loss. Splitting on a fixed grid
        // keeps every re-request inside the range of one request already sent (the responder
        // replays a duplicate READ only inside one saved resource). With the window fully
        // open a READ is one request, as before.
        let split_reads = self.window.cwnd < self.window.max;
        let cur = cx.sq.cur;
        let mtu = cx.attr.path_mtu.bytes() as u64;
        let uc = cx.qp_type() == QpType::Uc;
        let ack_req_every = cx.cfg.ack_req_every;
        let dest_qpn = cx.attr.dest_qpn;
        let w = cx.sq.get_mut(cur)?;
        if w.first_psn.is_none() {
            // A WQE never sent before starts after the highest PSN ever sent (`high_psn`),
            // never at `next_psn`: an ACK that completes the WQE being resent by go-back-N
            // leaves `next_psn` (and the packet cursor) inside that finished WQE.
            cx.sq.cur_pkt = 0;
            self.next_psn = self.high_psn;
        }
        let pkt = cx.sq.cur_pkt;
        // INVARIANT: `cur` indexes the queue: `get_mut(cur)` just succeeded and nothing
        // removed a WQE since.
        let w = cx.sq.get_mut(cur).expect("current WQE");
        // A packet's PSN is its WQE's first PSN plus its index, always: deriving it (rather
        // than trusting `next_psn`) keeps it right when an ACK completes the WQE being resent
        // and the cursor moves on to the next one.
        let first_psn = *w.first_psn.get_or_insert(self.high_psn);
        let psn = first_psn.add(pkt);
        let op = w.wr.op;
        let npkts = w.npkts;
        let first = pkt == 0;
        let last = pkt + 1 >= npkts;
        let Some(opcode) = opcode_for(op, first, last, uc) else {
            // post_send admits no such WR (LOCAL_INV never gets here, UC refuses READ and
            // atomics); should one get through, it fails alone rather than going on the wire.
            cx.fail_at(cur, WcStatus::LocQpOpErr);
            return None;
        };
        let mut b = bth::Repr::new(opcode, dest_qpn, psn);
        b.pkey = roce_wire::PKey::DEFAULT;
        let mut ext = Ext::default();
        let offset = u64::from(pkt) * mtu;
        let (payload_len, psn_span) = match op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                let mut span = if split_reads {
                    (npkts - pkt).min(READ_SPLIT - pkt % READ_SPLIT)
                } else {
                    npkts - pkt
                };
                if psn.is_before(self.high_psn) {
                    // A re-request ends where the request it repeats ended: the responder
                    // replays a duplicate READ only inside one saved resource.
                    if let Some(end) = self.rd_ends.iter().find(|e| !e.is_before(psn)) {
                        span = span.min(end.diff(psn) as u32 + 1);
                    }
                }
                let remaining = w.len - offset.min(w.len);
                let len = if pkt + span >= npkts {
                    remaining
                } else {
                    u64::from(span) * mtu
                };
                ext.reth = Some(reth::Repr {
                    va: remote_addr.wrapping_add(offset),
                    rkey,
                    dma_len: u32::try_from(len).unwrap_or(u32::MAX),
                });
                b.ack_req = true;
                (0, span)
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                b.ack_req = true;
                (0, 1)
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                b.ack_req = true;
                (0, 1)
            }
            SendOp::AtomicWrite { remote_addr, rkey } => {
                // The 8 bytes of data are the payload (A19.4.2: DMA length 8).
                ext.reth = Some(reth::Repr {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                b.ack_req = true;
                (w.len as usize, 1)
            }
            SendOp::Flush {
                remote_addr,
                rkey,
                len,
                placement,
                level,
            } => {
                ext.feth = Some(feth::Repr {
                    placement: placement.bits(),
                    selectivity: level as u8,
                });
                ext.reth = Some(reth::Repr {
                    va: remote_addr,
                    rkey,
                    dma_len: len,
                });
                b.ack_req = true;
                (0, 1)
            }
            _ => {
                if first {
                    if let SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } = op
                    {
                        ext.reth = Some(reth::Repr {
                            va: remote_addr,
                            rkey,
                            dma_len: u32::try_from(w.len).unwrap_or(u32::MAX),
                        });
                    }
                }
                if last {
                    match op {
                        SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                            ext.immdt = Some(immdt::Repr { data: imm });
                        }
                        SendOp::SendWithInv { rkey } => ext.ieth = Some(ieth::Repr { rkey }),
                        _ => {}
                    }
                    b.solicited = w.wr.solicited
                        && matches!(
                            op,
                            SendOp::Send
                                | SendOp::SendWithImm { .. }
                                | SendOp::SendWithInv { .. }
                                | SendOp::RdmaWriteWithImm { .. }
                        );
                }
                // At least ACK_REQS_PER_WINDOW AckReqs per window: with one, the ACK of the
                // packet that fills a small window (after losses) is the only thing that can
                // open it, and losing it stalls the QP until early retransmission.
                let every =
                    (self.window.limit() / ACK_REQS_PER_WINDOW).clamp(1, ack_req_every.max(1));
                b.ack_req = !uc && (last || fills_window || self.since_ack_req + 1 >= every);
                ((w.len - offset.min(w.len)).min(mtu) as usize, 1)
            }
        };
        let data = &w.wr.data;
        let mem = cx.mem;
        let result = emit_in_place(buf, b, ext, payload_len, |out| match data {
            SendData::Inline(d) => {
                out.copy_from_slice(&d[offset as usize..offset as usize + out.len()]);
                Ok(())
            }
            SendData::Sges(sges) => mem.gather(sges, offset, out),
        });
        let len = match result {
            Ok(len) => len,
            Err(status) => {
                // Local protection error reading the send buffer: the WQE fails in order.
                cx.fail_at(cur, status);
                return None;
            }
        };
        if op.is_read_or_atomic() && !psn.is_before(self.high_psn) {
            self.rd_ends.push_back(psn.add(psn_span.max(1) - 1));
        }
        // Advance.
        if self.next_psn.is_before(self.high_psn) {
            cx.stats.retransmitted_packets += 1;
        }
        if b.ack_req && !uc && self.rtt.timing.is_none() {
            self.rtt.timing = Some((psn.add(psn_span.max(1) - 1), now));
        }
        self.next_psn = psn.add(psn_span);
        if self.next_psn.is_after(self.high_psn) {
            self.high_psn = self.next_psn;
        }
        self.since_ack_req = if b.ack_req { 0 } else { self.since_ack_req + 1 };
        cx.stats.tx_bytes += payload_len as u64;
        let done = match op {
            SendOp::RdmaRead { .. } => pkt + psn_span >= npkts,
            _ => last || op.is_read_or_atomic(),
        };
        if done {
            w.all_sent = true;
            cx.sq.cur += 1;
            cx.sq.cur_pkt = 0;
        } else {
            cx.sq.cur_pkt += psn_span;
        }
        if uc {
            if done {
                // UC has no acknowledgements: a WR completes once its last packet is out.
                cx.complete_front(WcStatus::Success);
            }
        } else {
            Self::arm_ack_timer(cx, now);
            self.arm_probe(cx, now);
        }
        Some(len)
    }

    /// Go-back-N: resume transmission at `psn` (which must be outstanding).
    pub(crate) fn go_back(&mut self, sq: &mut SendQueue, psn: Psn) {
        // A timed PSN that will be sent again is not timed further (its ACK could answer
        // either copy; Karn).
        if self.rtt.timing.is_some_and(|(p, _)| !p.is_before(psn)) {
            self.rtt.timing = None;
        }
        let mut target = None;
        for (i, w) in sq.iter().enumerate() {
            let (Some(first), Some(last)) = (w.first_psn, w.last_psn()) else {
                break;
            };
            if psn.in_closed_window(first, last) {
                target = Some((i, psn.diff(first) as u32));
                break;
            }
        }
        if let Some((i, pkt)) = target {
            sq.cur = i;
            sq.cur_pkt = pkt;
            self.next_psn = psn;
            return;
        }
        // Nothing outstanding at that PSN: resume at the first WQE not fully sent.
        let i = sq.iter().position(|w| !w.all_sent).unwrap_or(sq.len());
        sq.cur = i;
        sq.cur_pkt = 0;
        if let Some(p) = sq.get(i).and_then(|w| w.first_psn) {
            self.next_psn = p;
        }
    }
}

#[cfg(test)]
mod tests {
    use roce_wire::RKey;

    use super::*;

    /// The opcodes the requester emits, checked against the IBTA codes (table 38).
    #[test]
    fn request_opcodes_match_the_spec_codes() {
        let rkey = RKey::new(1);
        let write = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey,
        };
        let write_imm = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey,
            imm: 0,
        };
        let cases: &[(SendOp, bool, bool, u8)] = &[
            (SendOp::Send, true, true, 0x04),
            (SendOp::Send, true, false, 0x00),
            (SendOp::Send, false, false, 0x01),
            (SendOp::Send, false, true, 0x02),
            (SendOp::SendWithImm { imm: 0 }, true, true, 0x05),
            (SendOp::SendWithImm { imm: 0 }, true, false, 0x00),
            (SendOp::SendWithImm { imm: 0 }, false, true, 0x03),
            (SendOp::SendWithInv { rkey }, true, true, 0x17),
            (SendOp::SendWithInv { rkey }, false, false, 0x01),
            (SendOp::SendWithInv { rkey }, false, true, 0x16),
            (write, true, true, 0x0A),
            (write, true, false, 0x06),
            (write, false, false, 0x07),
            (write, false, true, 0x08),
            (write_imm, true, true, 0x0B),
            (write_imm, true, false, 0x06),
            (write_imm, false, true, 0x09),
            (
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey,
                },
                true,
                false,
                0x0C,
            ),
            (
                SendOp::AtomicCmpAndSwp {
                    remote_addr: 0,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
                true,
                true,
                0x13,
            ),
            (
                SendOp::AtomicFetchAndAdd {
                    remote_addr: 0,
                    rkey,
                    add: 0,
                },
                true,
                true,
                0x14,
            ),
        ];
        for &(op, first, last, code) in cases {
            assert_eq!(
                opcode_for(op, first, last, false).map(Opcode::as_u8),
                Some(code),
                "RC {op:?} first={first} last={last}"
            );
            let uc = opcode_for(op, first, last, true).map(Opcode::as_u8);
            if op.is_read_or_atomic() {
                assert_eq!(uc, None, "UC {op:?}");
            } else if matches!(op, SendOp::SendWithInv { .. }) && last {
                assert_eq!(uc, None, "UC has no SEND with invalidate");
            } else {
                assert_eq!(uc, Some(code + 0x20), "UC {op:?} first={first} last={last}");
            }
        }
        assert_eq!(
            opcode_for(SendOp::LocalInv { key: 1 }, true, true, false),
            None
        );
    }
}
