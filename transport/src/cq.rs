//! The engine's side of a completion queue: where completions and asynchronous events go.
//!
//! The engine pushes completions into a [`CqShared`] while it holds the engine lock; the
//! application polls and waits on the same object through [`crate::CompletionQueue`]. The CQ
//! lock is always taken after the engine lock, never before (see the lock order in
//! [`crate::device`]).

use std::io;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

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
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) queue: Mutex<roce_qp::cq::CompletionQueue>,
    pub(crate) cond: Condvar,
    /// Threads blocked in [`crate::CompletionQueue::wait`] (a notify with none is a wasted
    /// futex call).
    pub(crate) waiters: AtomicUsize,
    pub(crate) armed: AtomicU8,
    pub(crate) event: EventFd,
}

impl CqShared {
    /// A CQ of `depth` entries, not armed.
    pub(crate) fn new(depth: usize) -> io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(roce_qp::cq::CompletionQueue::new(depth)),
            cond: Condvar::new(),
            waiters: AtomicUsize::new(0),
            armed: AtomicU8::new(NOTIFY_NONE),
            event: EventFd::new()?,
        })
    }

    /// Queues a completion, wakes waiters and fires an armed completion channel.
    pub(crate) fn push(&self, c: Completion) {
        {
            let mut q = lock(&self.queue);
            // A full CQ is an overflow (the queue records it; `overflowed()` reports it).
            let _ = q.push(c);
        }
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.cond.notify_all();
        }
        let armed = self.armed.load(Ordering::Acquire);
        let fire = armed == NOTIFY_ALL
            || (armed == NOTIFY_SOLICITED && (c.solicited || c.status != WcStatus::Success));
        if fire && self.armed.swap(NOTIFY_NONE, Ordering::AcqRel) != NOTIFY_NONE {
            self.event.notify();
        }
    }
}
