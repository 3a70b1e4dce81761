//! Completion queues (`ibv_cq`) and their completion channels: the application's side. The
//! engine pushes into [`crate::cq::CqShared`].

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_qp::verbs::{Completion, WcOpcode};

use crate::cq::{CqShared, NOTIFY_ALL, NOTIFY_NONE, NOTIFY_SOLICITED};
use crate::device::{wait, Device};
use crate::error::VerbsError;
use crate::sys::lock;

/// A completion queue (`ibv_cq`), with a completion channel of its own: arm it with
/// [`Self::req_notify`], and its [`Self::event_fd`] becomes readable at the next completion
/// (register it with epoll/mio), or block in [`Self::get_event`].
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    pub(super) dev: Device,
    pub(super) shared: Arc<CqShared>,
    /// Held with the rocectl daemon, when one serves the device (released with the last
    /// clone).
    _reservation: Arc<Option<crate::control::Reservation>>,
}

impl CompletionQueue {
    pub(crate) fn new(dev: Device, depth: usize) -> Result<Self, VerbsError> {
        if depth == 0 || depth > 1 << 20 {
            return Err(VerbsError::BadCqDepth(depth));
        }
        let shared = Arc::new(CqShared::new(depth)?);
        let reservation = dev.reserve(crate::control::Objects::cq())?;
        Ok(Self {
            dev,
            shared,
            _reservation: Arc::new(reservation),
        })
    }

    /// Polls up to `out.len()` completions (`ibv_poll_cq`); returns how many. When the CQ is
    /// empty it makes engine progress itself first (busy-polling receive), unless another
    /// thread is doing so. When it is still empty it yields the CPU once (`sched_yield`): an
    /// application spinning on an empty CQ then lets the thread that holds its packets (the
    /// progress thread, or the peer on the same host) run on a busy machine, and on an idle
    /// core the yield returns at once. (Measured with the stock `ibv_rc_pingpong`, busy
    /// polling through the drop-in between two namespaces on a 2-core host at load 12:
    /// 0.6 to 2.7 ms per iteration without the yield, 0.13 to 0.6 ms with it.)
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = lock(&self.shared.queue).poll_many(out);
        if n > 0 || out.is_empty() {
            return n;
        }
        // Lock order engine -> CQ: the closure runs under the engine lock. A message just
        // received is what a ping-pong answers: the pass's ACK waits for that answer.
        self.dev.try_progress(|| self.front_is_receive());
        lock(&self.shared.queue).poll_many(out)
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Option<Completion> {
        let mut c = [Completion::EMPTY];
        (self.poll(&mut c) == 1).then_some(c[0])
    }

    /// Waits up to `timeout` for at least one completion; returns how many were stored in
    /// `out` (0 at the timeout).
    ///
    /// The waiting thread runs the engine itself: it sleeps on the datapath (and on this CQ,
    /// for a completion another thread's pass queues) until the next timer, and makes the
    /// progress pass when woken, while the engine thread (if any) steps back: one wake-up per
    /// message (`device/wait.rs`).
    pub fn wait(&self, out: &mut [Completion], timeout: Duration) -> usize {
        let deadline = wait::deadline_after(timeout);
        let wake = if self.dev.can_wait_in_datapath() {
            wait::cq_wake(&self.shared)
        } else {
            None
        };
        let (mut last, mut sleep) = (false, true);
        loop {
            let (n, left) = {
                let mut q = lock(&self.shared.queue);
                let n = q.poll_many(out);
                (n, q.len())
            };
            if n > 0 || out.is_empty() || last {
                if let Some(w) = wake {
                    // Completions left behind while another waiter sleeps: it may have missed
                    // its wake-up to this thread's read of `dp_wake` (`device/wait.rs`).
                    if left > 0 && self.shared.dp_waiters.load(Ordering::SeqCst) > 0 {
                        w.notify();
                    }
                }
                return n;
            }
            if let Some(w) = wake {
                // Lock order engine -> CQ: both closures run under the engine lock. The wait
                // returns to the application when its pass queued a completion here: the ACK
                // that pass built waits for the application's next post, which is usually the
                // answer (a ping-pong's reply, after waiting for its send's completion).
                let has_completion = || !lock(&self.shared.queue).is_empty();
                sleep = match self.dev.wait_running_engine(
                    deadline,
                    wait::WaitFor::Cq(&self.shared, w),
                    sleep,
                    has_completion,
                    has_completion,
                ) {
                    wait::Woke::Ready => true,
                    wait::Woke::Passed { received } => !received,
                };
                last = Instant::now() >= deadline;
                continue;
            }
            // No descriptor to sleep on: poll (a pass), then the condvar or a short nap.
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
                    // The poll above made a pass (unless another thread held the engine,
                    // which is then making progress itself).
                    self.dev
                        .wait_after_pass(deadline - now, || !lock(&self.shared.queue).is_empty());
                }
                crate::Progress::Thread => {
                    self.dev.app_blocks();
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

    /// Whether the next completion is a receive (a poll about to return it: the ACK of that
    /// message may wait for the reply the application posts next).
    fn front_is_receive(&self) -> bool {
        lock(&self.shared.queue)
            .front()
            .is_some_and(|c| matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm))
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
        // Arming is how an application says it is about to sleep on the channel.
        self.dev.app_blocks();
        // A completion that arrived before arming does not fire; like verbs, callers poll
        // after arming to catch it.
    }

    /// Fires an armed notification at once when a completion that made no event (it came
    /// while the CQ was not armed for it) is still queued; returns whether it fired. Called
    /// right after [`Self::req_notify`], this closes the gap between an application's last
    /// poll and its arming: UCX's sleep mode arms without polling again (a ConnectX device
    /// raises an event for completions past the consumer index). A completion that already
    /// made an event does not make another: perftest `-e` re-arms before polling the
    /// completion its event was for, and would consume the stale event later.
    pub fn notify_if_pending(&self) -> bool {
        {
            let q = lock(&self.shared.queue);
            let pushed = self.shared.pushed.load(Ordering::Acquire);
            let unsignalled = self.shared.unsignalled.load(Ordering::Acquire);
            // The queue holds the completions numbered pushed - len + 1 ..= pushed.
            let oldest_queued = pushed.saturating_sub(q.len() as u64) + 1;
            if unsignalled == 0 || unsignalled < oldest_queued {
                return false;
            }
        }
        if self.shared.armed.swap(NOTIFY_NONE, Ordering::AcqRel) == NOTIFY_NONE {
            // Not armed, or the engine fired it meanwhile.
            return false;
        }
        let notifier = lock(&self.shared.notifier);
        match notifier.as_ref() {
            Some(f) => f(),
            None => self.shared.event.notify(),
        }
        true
    }

    /// The completion channel's descriptor: readable when an armed notification fired.
    pub fn event_fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }

    /// Waits up to `timeout` for a notification and consumes it (`ibv_get_cq_event` +
    /// `ibv_ack_cq_events`). Returns whether one came.
    pub fn get_event(&self, timeout: Duration) -> bool {
        let deadline = wait::deadline_after(timeout);
        if self.dev.can_wait_in_datapath() {
            // Run the engine here until the channel fires (`device/wait.rs`); the push that
            // fires it makes the event fd readable, which the wait sleeps on too. Once it has
            // fired (the CQ is disarmed) the application polls and answers next, so the
            // pass's ACK may wait for that post, as for a CQ wait.
            let mut sleep = true;
            loop {
                match self.dev.wait_running_engine(
                    deadline,
                    wait::WaitFor::Channel(&self.shared.event),
                    sleep,
                    || self.shared.event.drain(),
                    || self.shared.armed.load(Ordering::Acquire) == NOTIFY_NONE,
                ) {
                    wait::Woke::Ready => return true,
                    wait::Woke::Passed { received } => sleep = !received,
                }
                if Instant::now() >= deadline {
                    return self.shared.event.drain();
                }
            }
        }
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
                    self.dev.app_blocks();
                    self.shared.event.wait(deadline - now);
                }
            }
        }
    }

    /// Attaches a notifier, called when the armed CQ fires, instead of making
    /// [`Self::event_fd`] readable; `None` detaches it (the event fd is used again). This is
    /// the hook for a completion channel shared by several CQs (`ibv_comp_channel`).
    ///
    /// The notifier runs on whichever thread makes engine progress, **while the engine lock
    /// is held**: it must not block, must not call back into this device (post, poll, arm,
    /// `set_notify`...) and may only take locks that nothing else holds while calling into
    /// the device (leaf locks; e.g. a mutex around a queue, then a write to an eventfd).
    ///
    /// When `set_notify` returns, the previous notifier is not running and will not be
    /// called again, so the state it captured may be torn down.
    pub fn set_notify(&self, notify: Option<Arc<dyn Fn() + Send + Sync>>) {
        self.shared.set_notifier(notify);
    }

    /// Changes the depth (`ibv_resize_cq`), keeping the completions waiting.
    ///
    /// # Errors
    /// [`VerbsError::BadCqDepth`]: 0 or above the device limit (1 << 20);
    /// [`VerbsError::CqTooSmall`]: fewer entries than completions waiting.
    pub fn resize(&self, depth: usize) -> Result<(), VerbsError> {
        if depth == 0 || depth > 1 << 20 {
            return Err(VerbsError::BadCqDepth(depth));
        }
        self.shared
            .resize(depth)
            .map_err(|waiting| VerbsError::CqTooSmall { depth, waiting })
    }

    /// Whether completions were lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.shared.overflowed_before.load(Ordering::Acquire)
            || lock(&self.shared.queue).overflowed()
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        lock(&self.shared.queue).len()
    }

    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::pd::testing::{rc_pair, Side};
    use crate::{
        Access, AttrMask, Completion, ConnectOptions, Psn, QpAttr, QpInit, QpState, QpType, RecvWr,
        RemoteQp, SendOp, SendWr, SimNetwork, VerbsError, WcStatus,
    };

    /// Sends one 8-byte message from `a` to `b` and waits for both completions (until `b`'s
    /// CQ holds `id` completions: the tests send ids 1, 2, ... and poll only at the end).
    fn send(a: &Side, b: &Side, id: u64) {
        let src = a.pd.register(vec![1u8; 8], Access::empty()).unwrap();
        let dst = b.pd.register_zeroed(8, Access::LOCAL_WRITE).unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(id, SendOp::Send, vec![src.sge(0, 8)]))
            .unwrap();
        let mut wc = [Completion::EMPTY];
        assert_eq!(a.cq.wait(&mut wc, Duration::from_secs(5)), 1);
        // Wait for the receive without consuming it: poll would take it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (b.cq.len() as u64) < id {
            assert!(std::time::Instant::now() < deadline, "receive missing");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_notifier_replaces_the_event_fd_while_attached() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 3);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        b.cq.set_notify(Some(Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        })));
        // Not armed: no call.
        send(&a, &b, 1);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Armed: one call per arming, and the CQ's own fd stays quiet.
        b.cq.req_notify(false);
        send(&a, &b, 2);
        send(&a, &b, 3);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(!b.cq.get_event(Duration::ZERO));
        // Detached: the event fd is the channel again, the notifier is never called.
        b.cq.set_notify(None);
        b.cq.req_notify(false);
        send(&a, &b, 4);
        assert!(b.cq.get_event(Duration::from_secs(5)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let mut wc = [Completion::EMPTY; 8];
        assert_eq!(b.cq.poll(&mut wc), 4);
    }

    #[test]
    fn resize_keeps_waiting_completions_and_refuses_to_drop_them() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 4);
        for id in 1..=3 {
            send(&a, &b, id);
        }
        assert!(matches!(b.cq.resize(0), Err(VerbsError::BadCqDepth(0))));
        assert!(matches!(
            b.cq.resize(2),
            Err(VerbsError::CqTooSmall {
                depth: 2,
                waiting: 3
            })
        ));
        assert_eq!(b.cq.depth(), 64);
        b.cq.resize(3).unwrap();
        assert_eq!(b.cq.depth(), 3);
        // Full at 3: a fourth completion overflows, and the flag survives a later resize.
        assert!(!b.cq.overflowed());
        send_unwaited(&a, &b, 4);
        b.cq.resize(16).unwrap();
        assert!(b.cq.overflowed());
        let mut wc = [Completion::EMPTY; 8];
        assert_eq!(b.cq.poll(&mut wc), 3);
        assert_eq!(
            wc[..3].iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn a_qp_reset_removes_its_completions_and_only_its() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 6);
        send(&a, &b, 1);
        // A second QP on `b`'s CQ, moved to ERR with a receive posted: one flush of its own.
        let other = b.pd.create_qp(&QpInit::new(QpType::Rc, &b.cq)).unwrap();
        let itself = RemoteQp {
            qpn: other.qpn(),
            psn: Psn::new(0),
            gid: b.dev.local_gid(),
        };
        other.connect(&itself, &ConnectOptions::default()).unwrap();
        let err = QpAttr {
            state: QpState::Err,
            ..QpAttr::default()
        };
        other
            .post_recv(RecvWr {
                wr_id: 90,
                sges: vec![],
            })
            .unwrap();
        other.modify(&err, AttrMask::STATE).unwrap();
        // `b`'s QP errs with two receives posted: two flushes, behind the other QP's.
        for id in [20, 21] {
            b.qp.post_recv(RecvWr {
                wr_id: id,
                sges: vec![],
            })
            .unwrap();
        }
        b.qp.modify(&err, AttrMask::STATE).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while b.cq.len() < 4 {
            assert!(std::time::Instant::now() < deadline, "flushes missing");
            std::thread::sleep(Duration::from_millis(1));
        }
        let reset = QpAttr {
            state: QpState::Reset,
            ..QpAttr::default()
        };
        b.qp.modify(&reset, AttrMask::STATE).unwrap();
        // Left: the other QP's flush only (the success and the flushes of `b.qp` went).
        let mut wc = [Completion::EMPTY; 8];
        assert_eq!(b.cq.poll(&mut wc), 1);
        assert_eq!((wc[0].wr_id, wc[0].qp_num), (90, other.qpn()));
        assert_eq!(wc[0].status, WcStatus::WrFlushErr);
    }

    /// As [`send`], but the receive overflows `b`'s full CQ, so wait for the overflow flag.
    fn send_unwaited(a: &Side, b: &Side, id: u64) {
        let src = a.pd.register(vec![1u8; 8], Access::empty()).unwrap();
        let dst = b.pd.register_zeroed(8, Access::LOCAL_WRITE).unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(id, SendOp::Send, vec![src.sge(0, 8)]))
            .unwrap();
        let mut wc = [Completion::EMPTY];
        assert_eq!(a.cq.wait(&mut wc, Duration::from_secs(5)), 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !b.cq.overflowed() {
            assert!(std::time::Instant::now() < deadline, "no overflow");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
