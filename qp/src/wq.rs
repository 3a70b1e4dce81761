//! Work queues: the send queue's WQEs and where received SENDs land.

use std::collections::VecDeque;
use std::sync::Arc;

use roce_wire::Psn;

use crate::cq::SharedReceiveQueue;
use crate::verbs::{RecvWr, SendWr, WcStatus};

/// A send WR in the send queue, with its transmission state.
#[derive(Clone, Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    pub(crate) len: u64,
    /// PSN of the first packet, assigned when first transmitted.
    pub(crate) first_psn: Option<Psn>,
    /// Number of PSNs the WR consumes (READ: one per response packet).
    pub(crate) npkts: u32,
    /// READ: response packets received so far.
    pub(crate) read_pkts_done: u32,
    /// Whether every packet has been handed to the transport at least once.
    pub(crate) all_sent: bool,
    /// A local error found while sending it: the status it completes with.
    pub(crate) error: Option<WcStatus>,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|p| p.add(self.npkts.saturating_sub(1)))
    }
}

/// The send queue: WQEs in posting order, and the requester's transmit cursor into them.
///
/// The cursor (`cur`: index of the WQE being sent, `cur_pkt`: its next packet) lives with the
/// queue because every removal from the front moves it: the completer retires WQEs the
/// requester may still be pointing into.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    wqes: VecDeque<SendWqe>,
    /// Index of the WQE being sent.
    pub(crate) cur: usize,
    /// Packet index inside that WQE.
    pub(crate) cur_pkt: u32,
}

impl SendQueue {
    pub(crate) fn len(&self) -> usize {
        self.wqes.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }
    pub(crate) fn front(&self) -> Option<&SendWqe> {
        self.wqes.front()
    }
    pub(crate) fn front_mut(&mut self) -> Option<&mut SendWqe> {
        self.wqes.front_mut()
    }
    pub(crate) fn get(&self, i: usize) -> Option<&SendWqe> {
        self.wqes.get(i)
    }
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut SendWqe> {
        self.wqes.get_mut(i)
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = &SendWqe> {
        self.wqes.iter()
    }
    pub(crate) fn push_back(&mut self, w: SendWqe) {
        self.wqes.push_back(w);
    }

    /// Removes the front WQE, keeping the cursor on the same WQE (or restarting it at packet 0
    /// when the front was the one being sent).
    pub(crate) fn pop_front(&mut self) -> Option<SendWqe> {
        let w = self.wqes.pop_front()?;
        if self.cur > 0 {
            self.cur -= 1;
        } else {
            self.cur_pkt = 0;
        }
        Some(w)
    }

    /// Puts the cursor back on the first WQE.
    pub(crate) fn rewind_cursor(&mut self) {
        self.cur = 0;
        self.cur_pkt = 0;
    }

    /// Oldest PSN not yet acknowledged, if any packet is outstanding, given the last
    /// cumulatively acknowledged PSN `acked`.
    pub(crate) fn una_psn(&self, acked: Psn) -> Option<Psn> {
        let w = self.wqes.front()?;
        let first = w.first_psn?;
        if w.wr.op.is_read_or_atomic() {
            return Some(first.add(w.read_pkts_done));
        }
        if acked.in_window(first, first.add(w.npkts)) {
            Some(acked.next())
        } else {
            Some(first)
        }
    }

    /// Checks the queue's own invariants: PSNs assigned along the queue are contiguous, READ
    /// progress never exceeds the READ, the cursor points into the queue.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let mut prev: Option<Psn> = None;
        for w in &self.wqes {
            match (prev, w.first_psn) {
                (Some(p), Some(f)) => {
                    if f != p {
                        return Err("PSNs of consecutive WQEs must be contiguous");
                    }
                    prev = Some(f.add(w.npkts));
                }
                (None, Some(f)) => prev = Some(f.add(w.npkts)),
                (_, None) => break,
            }
            if w.read_pkts_done > w.npkts {
                return Err("READ progress beyond the READ");
            }
        }
        if self.cur > self.wqes.len() {
            return Err("send cursor past the end of the send queue");
        }
        Ok(())
    }
}

/// Where received SENDs land.
#[derive(Debug)]
pub(crate) enum RecvQueue {
    Own(VecDeque<RecvWr>),
    Shared(Arc<SharedReceiveQueue>),
}

impl RecvQueue {
    pub(crate) fn pop(&mut self) -> Option<RecvWr> {
        match self {
            Self::Own(q) => q.pop_front(),
            Self::Shared(s) => s.pop(),
        }
    }
    pub(crate) fn push_front(&mut self, wr: RecvWr) {
        match self {
            Self::Own(q) => q.push_front(wr),
            Self::Shared(s) => s.push_front(wr),
        }
    }
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Self::Own(q) => q.is_empty(),
            Self::Shared(s) => s.is_empty(),
        }
    }
}
