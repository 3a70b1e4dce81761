//! The queue pair: one sans-IO state machine for RC, UC and UD.
//!
//! # Polling order and time
//!
//! The QP follows quinn-proto's shape. The caller owns the clock and the sockets:
//!
//! 1. feed inputs: [`QueuePair::handle_packet`] for each received packet addressed to this QP,
//!    [`QueuePair::handle_timeout`] when [`QueuePair::poll_timeout`]'s deadline has passed;
//! 2. issue commands: [`QueuePair::post_send`], [`QueuePair::post_recv`], [`QueuePair::modify`];
//! 3. drain outputs until they return `None`: [`QueuePair::poll_transmit`] (packets to send),
//!    [`QueuePair::poll_completion`] (work completions), [`QueuePair::poll_event`] (async
//!    events); then sleep until [`QueuePair::poll_timeout`].
//!
//! Every call that takes `now` requires it to be monotonic (never earlier than a previous
//! `now`). Nothing inside reads a clock, opens a socket or spawns a thread, so a run is
//! replayed exactly by replaying its inputs.

use std::collections::VecDeque;
use std::sync::Arc;

use roce_wire::{PKey, PacketRepr, Qpn};

pub use crate::config::QpConfig;
use crate::cq::SharedReceiveQueue;
pub use crate::ctx::Event;
use crate::ctx::QpCtx;
use crate::mem::Mem;
use crate::rc::completer::Completer;
use crate::rc::requester::Requester;
use crate::rc::responder::Responder;
use crate::state::{check_modify, AttrMask, ModifyError, QpAttr};
pub use crate::stats::QpStats;
use crate::time::Instant;
use crate::timer::{Timer, TimerTable};
use crate::ud;
use crate::verbs::{
    AddressHandle, Completion, CqSide, QpState, QpType, RecvWr, SendData, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use crate::wq::{RecvQueue, SendQueue, SendWqe};

/// Why a post failed (nothing was queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The queue is full.
    #[error("queue full")]
    QueueFull,
    /// Posting is not allowed in the QP's state (send: RTS/SQD... only; receive: not RESET).
    #[error("QP state {0:?} does not accept this post")]
    InvalidState(QpState),
    /// The operation does not exist for this QP type (e.g. READ on UC, RDMA on UD).
    #[error("operation not supported on this QP type")]
    UnsupportedOp,
    /// Too many scatter/gather entries, or inline data too long, or an atomic or ATOMIC WRITE
    /// whose data is not 8 bytes, or a FLUSH with data.
    #[error("invalid scatter/gather list or inline data")]
    InvalidSgl,
    /// A UD send without a destination, or an RC/UC send with one.
    #[error("UD destination missing or misplaced")]
    InvalidDest,
    /// The receive goes to the SRQ, not the QP.
    #[error("QP uses a shared receive queue")]
    HasSrq,
}

/// A packet the QP wants sent. The bytes (BTH through the ICRC field, ICRC zero) are in the
/// caller's buffer; the transport adds Ethernet/IP/UDP headers and the ICRC.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Length of the UDP payload written into the buffer.
    pub len: usize,
    /// Where it goes.
    pub ah: AddressHandle,
    /// UDP source port (constant per QP: flow entropy).
    pub udp_sport: u16,
}

/// What the transport knows about a received packet beyond its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// Sender's GID (its IP address).
    pub sgid: roce_wire::Gid,
    /// Our GID it was sent to.
    pub dgid: roce_wire::Gid,
    /// The 40-byte network header as UD receivers see it (IPv6 header, or 20 zero bytes
    /// then the IPv4 header).
    pub grh: [u8; 40],
    /// IP ECN was CE.
    pub ecn_ce: bool,
}

impl RecvMeta {
    /// Meta for tests and simulations: addresses only, a zero GRH.
    pub const fn new(sgid: roce_wire::Gid, dgid: roce_wire::Gid) -> Self {
        Self {
            sgid,
            dgid,
            grh: [0; 40],
            ecn_ce: false,
        }
    }
}

/// A queue pair.
///
/// It composes the RC engines (requester, completer, responder in `rc/`, like rxe's
/// `rxe_req.c`, `rxe_comp.c` and `rxe_resp.c`) and UD (`ud.rs`) over the state they share
/// (attributes, memory, work queues, timers, output queues), lending that state to one engine
/// at a time as a `QpCtx`.
#[derive(Debug)]
pub struct QueuePair {
    qpn: Qpn,
    cfg: QpConfig,
    state: QpState,
    attr: QpAttr,
    mem: Mem,
    sq: SendQueue,
    rq: RecvQueue,
    req: Requester,
    comp: Completer,
    resp: Responder,
    timers: TimerTable,
    completions: VecDeque<(CqSide, Completion)>,
    events: VecDeque<Event>,
    stats: QpStats,
    udp_sport: u16,
}

impl QueuePair {
    /// A new QP in RESET. `mem` is the device's memory-region table and the QP's protection
    /// domain; `srq` makes received SENDs consume from a shared receive queue.
    pub fn new(qpn: Qpn, cfg: QpConfig, mem: Mem, srq: Option<Arc<SharedReceiveQueue>>) -> Self {
        let rq = match srq {
            Some(s) => RecvQueue::Shared(s),
            None => RecvQueue::Own(VecDeque::new()),
        };
        Self {
            qpn,
            cfg,
            state: QpState::Reset,
            attr: QpAttr::default(),
            mem,
            sq: SendQueue::default(),
            rq,
            req: Requester::default(),
            comp: Completer::default(),
            resp: Responder::default(),
            timers: TimerTable::default(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            stats: QpStats::default(),
            udp_sport: 0xC000 | (hash_qpn(qpn.value()) & 0x3FFF),
        }
    }

    // ----------------------------------------------------------------- getters --

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }
    /// The state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// The type.
    pub fn qp_type(&self) -> QpType {
        self.cfg.qp_type
    }
    /// The attributes as last modified.
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }
    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }
    /// Send WRs not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }
    /// The UDP source port this QP's packets carry.
    pub fn udp_sport(&self) -> u16 {
        self.udp_sport
    }

    // ---------------------------------------------------------------- commands --

    /// Sets the MTU of the port the QP sends through. UD QPs have no path MTU attribute
    /// (`ibv_modify_qp` takes none): they send up to the port's active MTU, which the device
    /// sets here at creation. RC/UC QPs keep the path MTU `modify` gives them.
    pub fn set_port_mtu(&mut self, mtu: crate::verbs::Mtu) {
        if self.cfg.qp_type == QpType::Ud {
            self.attr.path_mtu = mtu;
        }
    }

    /// `ibv_modify_qp`: moves the QP along the state table and sets attributes.
    ///
    /// # Errors
    /// [`ModifyError`] for a transition or attribute the table does not allow; nothing changes.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        check_modify(self.cfg.qp_type, self.state, attr, mask)?;
        macro_rules! take {
            ($bit:ident, $field:ident) => {
                if mask.contains(AttrMask::$bit) {
                    self.attr.$field = attr.$field;
                }
            };
        }
        take!(ACCESS_FLAGS, access_flags);
        take!(PKEY_INDEX, pkey_index);
        take!(PORT, port);
        take!(QKEY, qkey);
        take!(AV, ah);
        take!(PATH_MTU, path_mtu);
        take!(TIMEOUT, timeout);
        take!(RETRY_CNT, retry_cnt);
        take!(RNR_RETRY, rnr_retry);
        take!(RQ_PSN, rq_psn);
        take!(MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(MIN_RNR_TIMER, min_rnr_timer);
        take!(SQ_PSN, sq_psn);
        take!(MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        take!(DEST_QPN, dest_qpn);
        if mask.contains(AttrMask::AV) {
            self.udp_sport = udp_sport_for(attr.ah.flow_label, self.qpn, self.attr.dest_qpn);
        }
        if mask.contains(AttrMask::RQ_PSN) {
            self.resp.reset(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req.reset(attr.sq_psn);
            self.comp.reset(attr.sq_psn);
            self.sq.rewind_cursor();
        }
        if mask.contains(AttrMask::RETRY_CNT) || mask.contains(AttrMask::RNR_RETRY) {
            self.comp.reload_retries(&self.attr);
        }
        if mask.contains(AttrMask::STATE) {
            let to = attr.state;
            match to {
                QpState::Reset => self.reset(),
                QpState::Err => self.with_ctx(|cx, _| cx.enter_error(None)),
                QpState::Sqd => {
                    self.state = QpState::Sqd;
                    self.with_ctx(|cx, _| cx.check_sq_drained());
                }
                other => self.state = other,
            }
        }
        self.invariants();
        Ok(())
    }

    /// `ibv_post_send`.
    ///
    /// # Errors
    /// [`PostError`]; nothing is queued.
    pub fn post_send(&mut self, _now: Instant, mut wr: SendWr) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                // Verbs allow posting in ERR: the WR completes at once with a flush error.
                self.completions.push_back((
                    CqSide::Send,
                    Completion::new(wr.wr_id, WcStatus::WrFlushErr, wr.op.wc_opcode(), self.qpn),
                ));
                return Ok(());
            }
            other => return Err(PostError::InvalidState(other)),
        }
        if self.sq.len() >= self.cfg.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let ty = self.cfg.qp_type;
        let supported = match (ty, wr.op) {
            (QpType::Rc, _) => true,
            (QpType::Uc, op) => {
                !op.is_read_or_atomic() && !matches!(op, SendOp::SendWithInv { .. })
            }
            (QpType::Ud, op) => matches!(op, SendOp::Send | SendOp::SendWithImm { .. }),
        };
        if !supported {
            return Err(PostError::UnsupportedOp);
        }
        if (ty == QpType::Ud) != wr.ud.is_some() {
            return Err(PostError::InvalidDest);
        }
        match &wr.data {
            SendData::Sges(s) if s.len() > self.cfg.max_sge => return Err(PostError::InvalidSgl),
            SendData::Inline(d) if d.len() > self.cfg.max_inline_data || wr.op.returns_data() => {
                return Err(PostError::InvalidSgl)
            }
            _ => {}
        }
        let atomic_sized = wr.op.is_atomic() || matches!(wr.op, SendOp::AtomicWrite { .. });
        if atomic_sized && wr.len() != 8 {
            return Err(PostError::InvalidSgl);
        }
        if matches!(wr.op, SendOp::Flush { .. }) && !wr.is_empty() {
            // A FLUSH carries no data.
            return Err(PostError::InvalidSgl);
        }
        if self.cfg.sq_sig_all {
            wr.signaled = true;
        }
        let len = wr.len();
        let mtu = self.attr.path_mtu.bytes() as u64;
        let npkts = match wr.op {
            SendOp::LocalInv { .. } => 0,
            // One packet, one PSN: the atomics, ATOMIC WRITE and FLUSH.
            op if op.is_read_or_atomic() && !matches!(op, SendOp::RdmaRead { .. }) => 1,
            _ => len.div_ceil(mtu).max(1) as u32,
        };
        self.sq.push_back(SendWqe {
            wr,
            len,
            first_psn: None,
            npkts,
            read_pkts_done: 0,
            all_sent: false,
            error: None,
        });
        self.invariants();
        Ok(())
    }

    /// `ibv_post_recv`.
    ///
    /// # Errors
    /// [`PostError`]; nothing is queued.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if wr.sges.len() > self.cfg.max_sge {
            return Err(PostError::InvalidSgl);
        }
        let max = self.cfg.max_recv_wr;
        match &mut self.rq {
            RecvQueue::Shared(_) => Err(PostError::HasSrq),
            RecvQueue::Own(_) if self.state == QpState::Err => {
                self.completions.push_back((
                    CqSide::Recv,
                    Completion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn),
                ));
                Ok(())
            }
            RecvQueue::Own(q) if q.len() >= max => Err(PostError::QueueFull),
            RecvQueue::Own(q) => {
                q.push_back(wr);
                Ok(())
            }
        }
    }

    // ------------------------------------------------------------------ inputs --

    /// Feeds a received packet addressed to this QP (the BTH DestQP matched). `packet` was
    /// parsed and its ICRC verified by the transport.
    pub fn handle_packet(&mut self, now: Instant, packet: &PacketRepr<'_>, meta: &RecvMeta) {
        let drops = self.stats.drops();
        self.handle_packet_inner(now, packet, meta);
        // Exactly one counter per packet: processed, or dropped (wherever it was dropped).
        if self.stats.drops() == drops {
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += packet.payload.len() as u64;
        }
        self.invariants();
    }

    fn handle_packet_inner(&mut self, now: Instant, packet: &PacketRepr<'_>, meta: &RecvMeta) {
        let Some(info) = self.accepts(&packet.bth, meta) else {
            return;
        };
        match self.cfg.qp_type {
            QpType::Ud => self.with_ctx(|cx, _| ud::receive(cx, packet, &meta.grh)),
            _ if info.is_response() => {
                if self.cfg.qp_type == QpType::Rc {
                    self.with_ctx(|cx, e| e.comp.on_response(e.req, cx, now, packet));
                } else {
                    self.stats.drop_opcode += 1;
                }
            }
            _ => self.with_ctx(|cx, e| e.resp.on_request(cx, packet)),
        }
    }

    /// Feeds a packet addressed to this QP that the transport could not parse because its BTH
    /// PadCnt is larger than the bytes after its headers (`ParseError::BadPadCount`) or whose
    /// length is not a multiple of 4 (`ParseError::BadLength`); `bth` is its parsed BTH. Linux rxe answers such a request as a length error: an in-sequence RC
    /// SEND, RDMA WRITE or ATOMIC WRITE is NAKed invalid request (0x61) and the QP enters ERR;
    /// UC drops the message; other opcodes are dropped (counted in `drop_length`).
    pub fn handle_bad_pad(&mut self, _now: Instant, bth: &roce_wire::bth::Repr, meta: &RecvMeta) {
        let drops = self.stats.drops();
        if self.accepts(bth, meta).is_some() {
            if self.cfg.qp_type == QpType::Ud {
                self.stats.drop_length += 1;
            } else {
                self.with_ctx(|cx, e| e.resp.on_bad_pad(cx, bth));
            }
        }
        if self.stats.drops() == drops {
            self.stats.rx_packets += 1;
        }
        self.invariants();
    }

    /// The checks every received packet passes before an engine sees it (state, P_Key, opcode
    /// known and of the QP's transport, source address), each refusal counted; the opcode's
    /// table entry if it passes.
    fn accepts(
        &mut self,
        bth: &roce_wire::bth::Repr,
        meta: &RecvMeta,
    ) -> Option<&'static roce_wire::opcode::OpcodeInfo> {
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            self.stats.drop_state += 1;
            return None;
        }
        if !bth.pkey.matches(PKey::DEFAULT) {
            self.stats.drop_pkey += 1;
            return None;
        }
        let Some(info) = bth.opcode.info() else {
            self.stats.drop_opcode += 1;
            return None;
        };
        let transport_ok = matches!(
            (self.cfg.qp_type, bth.opcode.transport()),
            (QpType::Rc, roce_wire::opcode::Transport::Rc)
                | (QpType::Uc, roce_wire::opcode::Transport::Uc)
                | (QpType::Ud, roce_wire::opcode::Transport::Ud)
        );
        if !transport_ok {
            self.stats.drop_opcode += 1;
            return None;
        }
        if self.cfg.qp_type != QpType::Ud && meta.sgid != self.attr.ah.dgid {
            self.stats.drop_address += 1;
            return None;
        }
        Some(info)
    }

    /// Fires the timers whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.timers.take_expired(Timer::Rnr, now) {
            self.req.rnr_timer_fired();
        }
        if self.timers.take_expired(Timer::AckTimeout, now) {
            self.with_ctx(|cx, e| e.comp.ack_timer_fired(e.req, cx));
        }
        if self.timers.take_expired(Timer::Probe, now) {
            self.with_ctx(|cx, e| e.comp.probe_fired(e.req, cx, now));
        }
        self.invariants();
    }

    // ----------------------------------------------------------------- outputs --

    /// The next packet to send, written into `buf` (UDP payload: BTH .. ICRC, the ICRC field
    /// zero). `buf` must hold the path MTU plus 64 bytes of headers and trailer.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.poll_transmit_inner(now, buf);
        if t.is_some() {
            self.stats.tx_packets += 1;
        }
        self.invariants();
        t
    }

    fn poll_transmit_inner(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.cfg.qp_type != QpType::Ud {
            // Responses first: they unblock the peer.
            if let Some(len) = self.with_ctx(|cx, e| e.resp.next_response(cx, buf)) {
                return Some(self.transmit(len, self.attr.ah));
            }
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        match self.cfg.qp_type {
            QpType::Ud => self
                .with_ctx(|cx, e| ud::next(cx, e.req, buf))
                .map(|(len, ah)| self.transmit(len, ah)),
            _ => self
                .with_ctx(|cx, e| e.req.next_request(cx, e.comp.acked_psn(), now, buf))
                .map(|len| self.transmit(len, self.attr.ah)),
        }
    }

    fn transmit(&self, len: usize, ah: AddressHandle) -> Transmit {
        Transmit {
            len,
            ah,
            udp_sport: self.udp_sport,
        }
    }

    /// The earliest timer deadline, if any: call [`Self::handle_timeout`] then.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }

    /// The next work completion and the CQ it belongs to.
    #[must_use]
    pub fn poll_completion(&mut self) -> Option<(CqSide, Completion)> {
        self.completions.pop_front()
    }

    /// Hands every waiting completion to `f`, the send queue's first, then the receive
    /// queue's (each queue's in its own order, which is all verbs promise).
    ///
    /// Call once per batch of input: a requester's ACK and the peer's next request that
    /// arrive together then complete in the order a NIC shows them, where the ACK always
    /// leaves the peer before the peer's application can answer. A peer may send its answer
    /// ahead of the ACK (rocectl does, as one UDP GSO message: the engine's `acks_last`), and
    /// applications count on the causal order: perftest 4.5's `ib_send_lat -e` takes the
    /// receive CQ's event while it waits for its send's and polls the send CQ once.
    pub fn drain_completions_sends_first(&mut self, mut f: impl FnMut(CqSide, Completion)) {
        if self.completions.is_empty() {
            return;
        }
        self.completions.retain(|&(side, c)| {
            if side == CqSide::Send {
                f(side, c);
                false
            } else {
                true
            }
        });
        for (side, c) in self.completions.drain(..) {
            f(side, c);
        }
    }

    /// The next asynchronous event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        if let RecvQueue::Shared(s) = &self.rq {
            if s.take_limit_event() {
                return Some(Event::SrqLimitReached);
            }
        }
        self.events.pop_front()
    }

    // ---------------------------------------------------------------- internal --

    /// Lends the shared state to one engine call, then finishes an error the call entered:
    /// the responder's receive WR, the receive queue and the queued responses are flushed
    /// right after the send queue, before anything else happens.
    fn with_ctx<R>(&mut self, f: impl FnOnce(&mut QpCtx<'_>, Engines<'_>) -> R) -> R {
        let Self {
            qpn,
            cfg,
            state,
            attr,
            mem,
            sq,
            rq,
            req,
            comp,
            resp,
            timers,
            completions,
            events,
            stats,
            udp_sport: _,
        } = self;
        let mut cx = QpCtx {
            qpn: *qpn,
            cfg,
            state,
            attr,
            mem,
            sq,
            rq,
            timers,
            completions,
            events,
            stats,
            entered_error: false,
        };
        let r = f(
            &mut cx,
            Engines {
                req: &mut *req,
                comp,
                resp: &mut *resp,
            },
        );
        if cx.entered_error {
            resp.on_error(&mut cx);
        }
        r
    }

    fn reset(&mut self) {
        let srq = match &self.rq {
            RecvQueue::Shared(s) => Some(s.clone()),
            RecvQueue::Own(_) => None,
        };
        let fresh = Self::new(self.qpn, self.cfg, self.mem.clone(), srq);
        *self = Self {
            stats: self.stats,
            ..fresh
        };
    }

    /// Checks the cross-field invariants after every input (debug builds only).
    fn invariants(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("QP {:?} invariant broken: {e}", self.qpn);
        }
    }

    /// The QP's invariants, checked after every input in debug builds: the send queue's
    /// PSNs are contiguous and within capacity, ERR holds no send WQE and arms no timer and
    /// queues nothing but its final NAK, RESET holds no send WQE, the requester's next PSN
    /// never passes the highest sent.
    ///
    /// Not part of the API: exposed for the fuzz targets and property tests, which also
    /// run in release.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.sq.len() > self.cfg.max_send_wr + 1 {
            return Err("send queue over capacity");
        }
        self.sq.check()?;
        if self.state == QpState::Err {
            if !self.sq.is_empty() {
                return Err("ERR holds no send WQE");
            }
            if self.timers.next_timeout().is_some() {
                return Err("ERR arms no timer");
            }
        }
        if self.state == QpState::Reset && !self.sq.is_empty() {
            return Err("RESET holds no send WQE");
        }
        self.resp.check(self.state)?;
        if self.cfg.qp_type != QpType::Ud {
            self.req.check()?;
        }
        Ok(())
    }
}

/// The engines one call may drive (the responder, or the requester with its completer).
struct Engines<'a> {
    req: &'a mut Requester,
    comp: &'a mut Completer,
    resp: &'a mut Responder,
}

/// rxe's create-time UDP source port hash: `hash_32(qpn, 14)`.
const fn hash_qpn(qpn: u32) -> u16 {
    (qpn.wrapping_mul(0x61C8_8647) >> (32 - 14)) as u16
}

/// The UDP source port for a connection (rdma-core/kernel `rdma_get_udp_sport`): symmetric in
/// the two QPNs, so both ends use the same port.
pub fn udp_sport_for(flow_label: u32, lqpn: Qpn, rqpn: Qpn) -> u16 {
    let mut fl = flow_label & 0xF_FFFF;
    if fl == 0 {
        let mut v = u64::from(lqpn.value()) * u64::from(rqpn.value());
        v ^= v >> 20;
        v ^= v >> 40;
        fl = (v & 0xF_FFFF) as u32;
    }
    (((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) | 0xC000) as u16
}
