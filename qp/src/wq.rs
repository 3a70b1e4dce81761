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
}
