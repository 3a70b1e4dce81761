//! Shared receive queues (`ibv_srq`).

use std::sync::Arc;

use roce_qp::verbs::RecvWr;
use roce_qp::PostError;

use crate::device::Device;

/// A shared receive queue (`ibv_srq`).
#[derive(Clone, Debug)]
pub struct SharedReceiveQueue {
    pub(super) dev: Device,
    pub(super) inner: Arc<roce_qp::cq::SharedReceiveQueue>,
}

impl SharedReceiveQueue {
    pub(crate) fn new(dev: Device, max_wr: usize) -> Self {
        Self {
            dev,
            inner: Arc::new(roce_qp::cq::SharedReceiveQueue::new(max_wr)),
        }
    }

    /// Posts a receive WR (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// [`PostError::QueueFull`].
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.inner.post_recv(wr).map_err(|_| PostError::QueueFull)
    }

    /// Arms the limit event (`IBV_SRQ_LIMIT`).
    pub fn arm_limit(&self, limit: usize) {
        self.inner.arm_limit(limit);
    }

    /// Posted WRs not yet consumed.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no WR is posted.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

impl Device {
    /// Creates a shared receive queue of `max_wr` entries.
    pub fn create_srq(&self, max_wr: usize) -> SharedReceiveQueue {
        SharedReceiveQueue::new(self.clone(), max_wr)
    }
}
