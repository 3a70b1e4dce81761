//! The engine's side of a completion queue: where completions and asynchronous events go.
//!
//! The engine pushes completions into a [`CqShared`] while it holds the engine lock; the
//! application polls and waits on the same object through [`crate::CompletionQueue`]. The CQ
//! lock is always taken after the engine lock, never before (see the lock order in
//! [`crate::device`]).
//!
//! A CQ may carry a *notifier* ([`crate::CompletionQueue::set_notify`]): a completion
//! channel shared by several CQs (`ibv_comp_channel`) hooks in there. When the armed CQ fires,
//! the notifier is called instead of the CQ's own event fd, under the engine lock and under
//! the CQ's notifier lock (engine → CQ → whatever the notifier takes, which must be a leaf).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use roce_qp::verbs::{Completion, WcStatus};
use roce_qp::Event;
use roce_wire::Qpn;

use crate::sys::{lock, EventFd};

/// The completion channel is not armed.
pub(crate) const NOTIFY_NONE: u8 = 0;
/// The next completion fires the channel.
pub(crate) const NOTIFY_ALL: u8 = 1;
/// The next solicited or failed completion fires the channel.
pub(crate) const NOTIFY_SOLICITED: u8 = 2;

/// An asynchronous event on a QP (`ibv_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The QP.
    pub qpn: Qpn,
    /// What happened.
    pub event: Event,
}

/// The part of a CQ the engine pushes into.
pub(crate) struct CqShared {
    pub(crate) queue: Mutex<roce_qp::cq::CompletionQueue>,
    pub(crate) cond: Condvar,
    /// Threads blocked in [`crate::CompletionQueue::wait`] (a notify with none is a wasted
    /// futex call).
    pub(crate) waiters: AtomicUsize,
    /// Threads blocked in a wait that runs the engine itself ([`crate::device`]'s `wait`
    /// module): they sleep on the datapath and on [`Self::dp_wake`], which a push by another
    /// thread's pass makes readable.
    pub(crate) dp_waiters: AtomicUsize,
    /// Made readable by a push while [`Self::dp_waiters`] is not 0 (created at the first
    /// such wait).
    pub(crate) dp_wake: OnceLock<EventFd>,
    pub(crate) armed: AtomicU8,
    pub(crate) event: EventFd,
    /// Called instead of `event` when the armed CQ fires. Held while the notifier runs, so
    /// replacing it waits for a call in progress.
    pub(crate) notifier: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// A completion was lost to overflow before the queue was replaced by a resize (the new
    /// queue starts without the flag).
    pub(crate) overflowed_before: AtomicBool,
    /// Completions queued so far (written under the queue lock).
    pub(crate) pushed: AtomicU64,
    /// The number (1-based, as [`Self::pushed`] counts) of the last completion queued that
    /// fired no event (the CQ was not armed for it); 0 for none. Written under the queue lock.
    pub(crate) unsignalled: AtomicU64,
}

impl std::fmt::Debug for CqShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqShared")
            .field("queue", &self.queue)
            .field("armed", &self.armed)
            .field("event", &self.event)
            .finish_non_exhaustive()
    }
}

impl CqShared {
    /// A CQ of `depth` entries, not armed.
    pub(crate) fn new(depth: usize) -> io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(roce_qp::cq::CompletionQueue::new(depth)),
            cond: Condvar::new(),
            waiters: AtomicUsize::new(0),
            dp_waiters: AtomicUsize::new(0),
            dp_wake: OnceLock::new(),
            armed: AtomicU8::new(NOTIFY_NONE),
            event: EventFd::new()?,
            notifier: Mutex::new(None),
            overflowed_before: AtomicBool::new(false),
            pushed: AtomicU64::new(0),
            unsignalled: AtomicU64::new(0),
        })
    }

    /// Queues a completion, wakes waiters and fires an armed completion channel: the notifier
    /// if one is set, else the event fd.
    pub(crate) fn push(&self, c: Completion) {
        let fire = {
            let mut q = lock(&self.queue);
            // A full CQ is an overflow (the queue records it; `overflowed()` reports it).
            let queued = q.push(c).is_ok();
            let armed = self.armed.load(Ordering::Acquire);
            let fire = armed == NOTIFY_ALL
                || (armed == NOTIFY_SOLICITED && (c.solicited || c.status != WcStatus::Success));
            if queued {
                let n = self.pushed.fetch_add(1, Ordering::AcqRel) + 1;
                if !fire {
                    self.unsignalled.store(n, Ordering::Release);
                }
            }
            fire
        };
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.cond.notify_all();
        }
        // A thread asleep on the datapath for this CQ registered before it checked the queue
        // under the queue lock this push has just released: it either saw the completion or
        // is counted here (`device/wait.rs`).
        if self.dp_waiters.load(Ordering::SeqCst) > 0 {
            if let Some(w) = self.dp_wake.get() {
                w.notify();
            }
        }
        if fire && self.armed.swap(NOTIFY_NONE, Ordering::AcqRel) != NOTIFY_NONE {
            let notifier = lock(&self.notifier);
            match notifier.as_ref() {
                Some(f) => f(),
                None => self.event.notify(),
            }
        }
    }

    /// Replaces the notifier; when this returns, the old one is neither running nor called
    /// again.
    pub(crate) fn set_notifier(&self, f: Option<Arc<dyn Fn() + Send + Sync>>) {
        *lock(&self.notifier) = f;
    }

    /// Removes the completions of QP `qpn` still waiting (a QP reset: mlx4 and mlx5 clean
    /// their CQs the same way, `mlx5_cq_clean`); returns how many. Others keep their order.
    pub(crate) fn purge(&self, qpn: Qpn) -> usize {
        let mut q = lock(&self.queue);
        let total = q.len();
        let mut kept = Vec::with_capacity(total);
        while let Some(c) = q.poll() {
            if c.qp_num != qpn {
                kept.push(c);
            }
        }
        let removed = total - kept.len();
        for c in kept {
            // INVARIANT: the queue held at least these entries a moment ago, under this lock.
            q.push(c)
                .expect("INVARIANT: the kept completions fit where they were");
        }
        removed
    }

    /// Gives the queue a new depth, keeping the completions waiting.
    ///
    /// # Errors
    /// `depth` below the number of completions waiting: returns that number.
    pub(crate) fn resize(&self, depth: usize) -> Result<(), usize> {
        let mut q = lock(&self.queue);
        if depth < q.len() {
            return Err(q.len());
        }
        let mut new = roce_qp::cq::CompletionQueue::new(depth);
        while let Some(c) = q.poll() {
            // INVARIANT: depth >= the number of entries moved.
            new.push(c)
                .expect("INVARIANT: the new queue holds every waiting completion");
        }
        if q.overflowed() {
            self.overflowed_before.store(true, Ordering::Release);
        }
        *q = new;
        Ok(())
    }
}
