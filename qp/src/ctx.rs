//! What the RC/UC/UD engines of one QP share: a context that borrows the QP's attributes,
//! memory, work queues, timers and output queues for the duration of one input or poll.
//!
//! The requester, completer and responder (`rc/`) and UD (`ud.rs`) own their protocol state
//! and receive a [`QpCtx`] for everything else, so none of them names `QueuePair`. The QP
//! builds the context, calls one engine, and then finishes what only it can see (flushing the
//! receive side after an error; see [`QpCtx::enter_error`]).

use std::collections::VecDeque;

use roce_mr::Access;
use roce_wire::Qpn;

use crate::config::QpConfig;
use crate::mem::Mem;
use crate::state::QpAttr;
use crate::stats::QpStats;
use crate::timer::TimerTable;
use crate::verbs::{Completion, CqSide, QpState, QpType, RecvWr, WcOpcode, WcStatus};
use crate::wq::{RecvQueue, SendQueue};

/// An asynchronous event (`enum ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The QP entered ERR on its own (`IBV_EVENT_QP_FATAL`), with the status that caused it.
    QpFatal(WcStatus),
    /// The send queue drained in SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained,
    /// An SRQ the QP uses went below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached,
    /// The QP entered SQE (`IBV_EVENT_QP_REQ_ERR` for UC/UD send errors).
    SendQueueError,
}

/// The shared part of a QP, borrowed for one call into an engine.
#[derive(Debug)]
pub(crate) struct QpCtx<'a> {
    pub(crate) qpn: Qpn,
    pub(crate) cfg: &'a QpConfig,
    pub(crate) state: &'a mut QpState,
    pub(crate) attr: &'a QpAttr,
    pub(crate) mem: &'a Mem,
    pub(crate) sq: &'a mut SendQueue,
    pub(crate) rq: &'a mut RecvQueue,
    pub(crate) timers: &'a mut TimerTable,
    pub(crate) completions: &'a mut VecDeque<(CqSide, Completion)>,
    pub(crate) events: &'a mut VecDeque<Event>,
    pub(crate) stats: &'a mut QpStats,
    /// Set by [`Self::enter_error`]: the receive side (the responder's current receive WR, the
    /// receive queue, queued responses) is still to be flushed by the QP.
    pub(crate) entered_error: bool,
}

impl QpCtx<'_> {
    pub(crate) fn qp_type(&self) -> QpType {
        self.cfg.qp_type
    }

    pub(crate) fn access_allows(&self, needed: Access) -> bool {
        self.attr.access_flags.contains(needed)
    }

    pub(crate) fn push_completion(&mut self, side: CqSide, c: Completion) {
        self.completions.push_back((side, c));
    }

    /// A receive WR flushed by an error.
    pub(crate) fn flush_recv(&mut self, wr: &RecvWr) {
        let c = Completion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
        self.push_completion(CqSide::Recv, c);
    }

    /// Completes the front send WQE (successfully or not) if it is signaled or failed.
    pub(crate) fn complete_front(&mut self, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else { return };
        if w.wr.signaled || status != WcStatus::Success {
            let mut c = Completion::new(w.wr.wr_id, status, w.wr.op.wc_opcode(), self.qpn);
            if status == WcStatus::Success {
                c.byte_len = u32::try_from(w.len).unwrap_or(u32::MAX);
            }
            self.push_completion(CqSide::Send, c);
        }
        if *self.state == QpState::Sqd {
            self.check_sq_drained();
        }
    }

    pub(crate) fn check_sq_drained(&mut self) {
        if *self.state == QpState::Sqd && self.sq.is_empty() {
            self.events.push_back(Event::SqDrained);
        }
    }

    /// Moves to ERR: disarms the timers and flushes the send queue; `cause` is the status of
    /// the error that caused it (`None` for a modify to ERR). The QP flushes the receive side
    /// when the engine returns ([`Self::entered_error`]), before any other output.
    pub(crate) fn enter_error(&mut self, cause: Option<WcStatus>) {
        if *self.state == QpState::Err {
            return;
        }
        *self.state = QpState::Err;
        self.timers.clear();
        while let Some(w) = self.sq.pop_front() {
            let status = w.error.unwrap_or(WcStatus::WrFlushErr);
            self.push_completion(
                CqSide::Send,
                Completion::new(w.wr.wr_id, status, w.wr.op.wc_opcode(), self.qpn),
            );
        }
        self.entered_error = true;
        if let Some(status) = cause {
            self.events.push_back(Event::QpFatal(status));
        }
    }

    /// A send WQE failed locally or remotely: complete it with `status`, then RC goes to ERR
    /// (flushing the rest) and UC/UD to SQE.
    pub(crate) fn fail_front(&mut self, status: WcStatus) {
        self.complete_front(status);
        match self.qp_type() {
            QpType::Rc => self.enter_error(Some(status)),
            _ => {
                *self.state = QpState::Sqe;
                self.events.push_back(Event::SendQueueError);
            }
        }
    }

    /// The WQE at `cur` failed while being sent: it completes with `status` in order (at
    /// once if it is the front, else when the error flushes the queue).
    pub(crate) fn fail_at(&mut self, cur: usize, status: WcStatus) {
        if let Some(w) = self.sq.get_mut(cur) {
            w.error = Some(status);
        }
        if cur == 0 {
            self.fail_front(status);
        } else {
            self.enter_error(Some(status));
        }
    }

    /// Flushes the QP's own receive queue (an SRQ keeps its WRs for other QPs).
    pub(crate) fn flush_recv_queue(&mut self) {
        if let RecvQueue::Own(q) = &mut *self.rq {
            let flushed: Vec<RecvWr> = q.drain(..).collect();
            for w in &flushed {
                self.flush_recv(w);
            }
        }
    }
}
