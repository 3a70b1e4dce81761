//! Completion queues (`ibv_cq`) and their completion channels: the application's side. The
//! engine pushes into [`crate::cq::CqShared`].

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_qp::verbs::Completion;

use crate::cq::{CqShared, NOTIFY_ALL, NOTIFY_SOLICITED};
use crate::device::Device;
use crate::error::VerbsError;
use crate::sys::lock;

/// A completion queue (`ibv_cq`), with a completion channel of its own: arm it with
/// [`Self::req_notify`], and its [`Self::event_fd`] becomes readable at the next completion
/// (register it with epoll/mio), or block in [`Self::get_event`].
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    pub(super) dev: Device,
    pub(super) shared: Arc<CqShared>,
}

impl CompletionQueue {
    pub(crate) fn new(dev: Device, depth: usize) -> Result<Self, VerbsError> {
        if depth == 0 || depth > 1 << 20 {
            return Err(VerbsError::BadCqDepth(depth));
        }
        Ok(Self {
            dev,
            shared: Arc::new(CqShared::new(depth)?),
        })
    }

    /// Polls up to `out.len()` completions (`ibv_poll_cq`); returns how many. When the CQ is
    /// empty it makes engine progress itself first (busy-polling receive), unless another
    /// thread is doing so.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = lock(&self.shared.queue).poll_many(out);
        if n > 0 || out.is_empty() {
            return n;
        }
        self.dev.try_progress();
        lock(&self.shared.queue).poll_many(out)
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Option<Completion> {
        let mut c = [Completion::EMPTY];
        (self.poll(&mut c) == 1).then_some(c[0])
    }

    /// Waits up to `timeout` for at least one completion; returns how many were stored in
    /// `out` (0 at the timeout).
    pub fn wait(&self, out: &mut [Completion], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll(out);
            if n > 0 {
                return n;
            }
            let now = Instant::now();
            if now >= deadline {
                return 0;
            }
            match self.dev.shared().progress {
                crate::Progress::Manual => {
                    self.dev.progress_wait(deadline - now);
                }
                crate::Progress::Thread => {
                    let q = lock(&self.shared.queue);
                    if q.is_empty() {
                        // Registered under the queue lock, which `push` takes before
                        // checking: no wakeup is lost.
                        self.shared.waiters.fetch_add(1, Ordering::AcqRel);
                        let _ = self
                            .shared
                            .cond
                            .wait_timeout(q, (deadline - now).min(Duration::from_millis(100)));
                        self.shared.waiters.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
    }

    /// Arms the completion channel (`ibv_req_notify_cq`): the next completion (or, with
    /// `solicited_only`, the next solicited or failed one) makes [`Self::event_fd`] readable.
    pub fn req_notify(&self, solicited_only: bool) {
        let mode = if solicited_only {
            NOTIFY_SOLICITED
        } else {
            NOTIFY_ALL
        };
        self.shared.armed.store(mode, Ordering::Release);
        // A completion that arrived before arming does not fire; like verbs, callers poll
        // after arming to catch it.
    }

    /// The completion channel's descriptor: readable when an armed notification fired.
    pub fn event_fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }

    /// Waits up to `timeout` for a notification and consumes it (`ibv_get_cq_event` +
    /// `ibv_ack_cq_events`). Returns whether one came.
    pub fn get_event(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.shared.event.drain() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            match self.dev.shared().progress {
                crate::Progress::Manual => {
                    self.dev
                        .progress_wait((deadline - now).min(Duration::from_millis(10)));
                }
                crate::Progress::Thread => {
                    self.shared.event.wait(deadline - now);
                }
            }
        }
    }

    /// Whether completions were lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        lock(&self.shared.queue).overflowed()
    }

    /// Entries.
    pub fn depth(&self) -> usize {
        lock(&self.shared.queue).depth()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

impl Device {
    /// Creates a completion queue of `depth` entries.
    ///
    /// # Errors
    /// A depth of 0 or above the device limit; eventfd creation failure.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, VerbsError> {
        CompletionQueue::new(self.clone(), depth)
    }
}
