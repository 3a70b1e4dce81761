//! Completion queues and shared receive queues: the objects several QPs share.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::verbs::{Completion, RecvWr};

/// Why a completion could not be queued or a WR could not be posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The completion queue is full: the completion is lost and the CQ is in error (verbs:
    /// `IBV_EVENT_CQ_ERR`).
    #[error("completion queue overflow")]
    Overflow,
    /// The queue already holds its maximum number of work requests.
    #[error("queue full")]
    Full,
}

/// A bounded completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    entries: VecDeque<Completion>,
    depth: usize,
    overflowed: bool,
}

impl CompletionQueue {
    /// A CQ that holds up to `depth` completions.
    pub fn new(depth: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(depth.min(4096)),
            depth,
            overflowed: false,
        }
    }
    /// Queues a completion.
    ///
    /// # Errors
    /// [`QueueError::Overflow`] when full; the CQ stays in error.
    pub fn push(&mut self, c: Completion) -> Result<(), QueueError> {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            return Err(QueueError::Overflow);
        }
        self.entries.push_back(c);
        Ok(())
    }
    /// Takes the oldest completion.
    pub fn poll(&mut self) -> Option<Completion> {
        self.entries.pop_front()
    }
    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll_many(&mut self, out: &mut [Completion]) -> usize {
        let n = out.len().min(self.entries.len());
        for slot in out.iter_mut().take(n) {
            // INVARIANT: n <= entries.len().
            *slot = self.entries.pop_front().expect("counted");
        }
        n
    }
    /// The oldest completion, left in place.
    pub fn front(&self) -> Option<&Completion> {
        self.entries.front()
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// No completion waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Whether a completion was ever lost to overflow.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
    /// Maximum depth.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

/// A shared receive queue: receive WRs several QPs consume from, with a limit event.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    inner: Mutex<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    wrs: VecDeque<RecvWr>,
    max_wr: usize,
    limit: usize,
    limit_reached: bool,
}

impl SharedReceiveQueue {
    /// An SRQ of up to `max_wr` receive WRs.
    pub fn new(max_wr: usize) -> Self {
        Self {
            inner: Mutex::new(SrqInner {
                wrs: VecDeque::new(),
                max_wr,
                limit: 0,
                limit_reached: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SrqInner> {
        // A poisoned lock only means another thread panicked mid-update of a VecDeque of
        // plain data; the queue is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Posts a receive WR.
    ///
    /// # Errors
    /// [`QueueError::Full`].
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), QueueError> {
        let mut s = self.lock();
        if s.wrs.len() >= s.max_wr {
            return Err(QueueError::Full);
        }
        s.wrs.push_back(wr);
        Ok(())
    }

    /// Arms the limit event: when fewer than `limit` WRs remain, [`Self::take_limit_event`]
    /// reports it once (`IBV_EVENT_SRQ_LIMIT_REACHED`). 0 disarms.
    pub fn arm_limit(&self, limit: usize) {
        let mut s = self.lock();
        s.limit = limit;
        s.limit_reached = false;
    }

    /// Whether the limit event fired since it was armed; disarms it.
    pub fn take_limit_event(&self) -> bool {
        let mut s = self.lock();
        let fired = s.limit_reached;
        if fired {
            s.limit_reached = false;
            s.limit = 0;
        }
        fired
    }

    /// WRs queued.
    pub fn len(&self) -> usize {
        self.lock().wrs.len()
    }

    /// No WR queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn pop(&self) -> Option<RecvWr> {
        let mut s = self.lock();
        let wr = s.wrs.pop_front();
        if s.limit > 0 && s.wrs.len() < s.limit {
            s.limit_reached = true;
        }
        wr
    }

    pub(crate) fn push_front(&self, wr: RecvWr) {
        self.lock().wrs.push_front(wr);
    }
}

#[cfg(test)]
mod tests {
    use roce_wire::Qpn;

    use super::*;
    use crate::verbs::{WcOpcode, WcStatus};

    #[test]
    fn cq_overflow_is_an_error() {
        let mut cq = CompletionQueue::new(2);
        let c = Completion::new(1, WcStatus::Success, WcOpcode::Send, Qpn::new(5));
        cq.push(c).unwrap();
        cq.push(c).unwrap();
        assert_eq!(cq.push(c), Err(QueueError::Overflow));
        assert!(cq.overflowed());
        assert_eq!(cq.poll().unwrap().wr_id, 1);
        assert_eq!(cq.len(), 1);
    }

    #[test]
    fn srq_limit_event_fires_once() {
        let srq = SharedReceiveQueue::new(4);
        for i in 0..4 {
            srq.post_recv(RecvWr {
                wr_id: i,
                sges: vec![],
            })
            .unwrap();
        }
        assert_eq!(
            srq.post_recv(RecvWr {
                wr_id: 9,
                sges: vec![]
            }),
            Err(QueueError::Full)
        );
        srq.arm_limit(3);
        assert!(!srq.take_limit_event());
        assert_eq!(srq.pop().unwrap().wr_id, 0);
        assert!(!srq.take_limit_event(), "3 left, not below the limit");
        srq.pop();
        assert!(srq.take_limit_event());
        assert!(!srq.take_limit_event(), "fires once");
    }
}
