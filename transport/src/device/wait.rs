//! Blocking waits that run the engine in the waiting thread.
//!
//! A blocking CQ wait ([`crate::CompletionQueue::wait`]) or completion-channel wait
//! ([`crate::CompletionQueue::get_event`]) used to sleep on a condvar (or the channel's
//! eventfd) while the engine thread slept on the datapath's descriptor: every message that
//! ended a wait cost two thread wake-ups, the engine thread's and then the application's.
//! Here the waiting thread sleeps on the datapath's readiness descriptor itself, together
//! with a descriptor of the object it waits for and until the next engine deadline (a QP
//! timer), and runs the progress pass itself when woken: one wake-up per message, and no
//! receive system call that finds nothing before the sleep (the sleep's `poll` returns at once
//! when something is already queued). With [`crate::Progress::Manual`] this is the only
//! thread that drives the engine while it waits.
//!
//! Measured (send-lat 64 B `--recv block`, loopback in a namespace of its own, 2 shared cores,
//! load 3.4-5.9, medians of 3 alternating runs against main d9848ef; the kernel's blocking UDP
//! ping-pong 12.7 us): with an engine thread 82.0 -> 26.0 us, `rc-pingpong -e` (completion
//! channel, engine thread) 84.2 -> 32.2 us per iteration; with manual progress, where the
//! waiting thread already ran the engine, unchanged within the noise (24.6 -> 25.1 us, medians
//! of 9).
//!
//! # When
//!
//! Only on a device with one engine whose datapath has a readiness descriptor
//! ([`Device::can_wait_in_datapath`]). A datapath without one (a custom backend) keeps the
//! old waits (the CQ's condvar, the channel's eventfd). So must a device with several engines
//! (shards, each its own descriptor and engine thread): a waiter would sleep on one shard's
//! descriptor while its completion may come from another's, and the hand-over below is per
//! engine thread.
//!
//! # The engine thread steps back
//!
//! While an application thread is blocked here ([`WaitState::app_waiting`] is not 0) the
//! engine thread does not wait on the datapath: it parks for at most one poll window and runs
//! a pass (timers, and what nobody else received), as it does for a busy-polling application
//! (`device/thread.rs`). When a CQ waiter leaves it stamps `app_polled`, so the engine thread
//! goes on stepping back for one window (the application usually answers and waits again
//! within microseconds) and then returns to the descriptor: it is back within one window of
//! the last wait, never later. A completion-channel waiter does not stamp: the application
//! arms the channel next ([`crate::CompletionQueue::req_notify`]), which unparks a stepping
//! engine thread whose window is open (`Device::app_blocks`: it cannot tell a `get_event`
//! caller from one that sleeps on the event fd itself); without the stamp it stays parked
//! and is not woken twice per message.
//!
//! Should the engine thread already be asleep on the descriptor when a waiter arrives (the
//! first wait after a quiet spell), the waiter wakes it out of it so that one datagram does
//! not wake two threads from then on. The engine thread publishes that it is about to sleep
//! on the descriptor ([`WaitState::engine_on_fd`], `SeqCst`) and then reads `app_waiting`
//! (`SeqCst`); a waiter increments `app_waiting` and then reads `engine_on_fd`: at least one
//! of the two sees the other, so the engine thread either stays off the descriptor or is
//! woken through the device's `mio::Waker` (which stays readable until its poll). None of
//! this is needed for correctness (two threads asleep on one descriptor race for the engine
//! lock, and the loser finds nothing): it saves the second wake-up.
//!
//! # No lost wake-up
//!
//! Something else may run the pass that receives what the waiter waits for: the engine
//! thread's periodic pass, a poster, another application thread polling or waiting on another
//! CQ. A CQ waiter registers in the CQ ([`crate::cq::CqShared::dp_waiters`], `SeqCst`), then
//! checks the queue under the CQ lock; a push queues under the CQ lock and then reads the
//! count (`SeqCst`). If the push's critical section came first, the check sees the
//! completion; if the check's came first, the registration happens before the push's read, so
//! the push makes the CQ's [`crate::cq::CqShared::dp_wake`] readable, and the waiter sleeps
//! on it: an eventfd stays readable until read, and a waiter reads it only after a sleep that
//! found it readable, before its next check (never between its check and its sleep). (The
//! argument needs only the CQ lock, not the engine lock the check also runs under.) A stale
//! readable `dp_wake` costs one spurious round. A completion-channel wait sleeps on the
//! channel's own eventfd, which the push that fires it makes readable anyway.
//!
//! Several threads waiting on one CQ share its `dp_wake`: one of them may read it while
//! another was about to wake for it. The reader then checks the queue itself, and a waiter
//! that returns completions leaving others queued makes `dp_wake` readable again when another
//! waiter is registered (`CompletionQueue::wait`; the same argument on the CQ lock): a
//! completion never sits in the queue while every registered waiter sleeps.
//!
//! A round after one whose pass received something makes its pass without sleeping first: an
//! RC message usually comes as two datagrams, the answer and the ACK of what this side sent,
//! and the second is often right behind the first (one receive call instead of a `ppoll` that
//! returns at once and then the receive). Skipping a sleep cannot lose a wake-up: the round
//! still checks first and passes.
//!
//! The pass the waiter makes when it wakes may not empty the datapath (its receive budget ran
//! out); it then makes another at once rather than sleep on a descriptor that need not be
//! readable again (the forwarding ring's eventfd is written only to a consumer that said it
//! sleeps). Should another thread hold the engine lock then, the waiter's next round locks it
//! to check. Datagrams the datapath would not take (`tx_blocked`) shorten the sleep to
//! 200 µs, as they do for the engine thread. Spurious wake-ups (a signal, a stale `dp_wake`)
//! cost one pass: every round checks again, and the caller stops at its deadline.
//!
//! What this does not do: a timer armed by another thread's post after the waiter computed
//! its sleep wakes the engine thread (the doorbell's `sleep_until` protocol), not the waiter;
//! a stepping engine thread plans at most one window ahead, so such a timer fires at most one
//! window late. With [`crate::Progress::Manual`] there is no such thread and it fires when the
//! waiter wakes (its own timer, the deadline, or input).
//!
//! Lock order is unchanged (engine → CQ): the check takes the CQ lock under the engine lock,
//! and nothing is held across the sleep.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{before_sleep, Device, DeviceShared};
use crate::cq::CqShared;
use crate::sys::{lock, EventFd};
use crate::Progress;

/// The device's side of the waits in this module (one per device, in `DeviceShared`).
#[derive(Debug, Default)]
pub(crate) struct WaitState {
    /// Application threads asleep on the datapath (or about to be): the engine thread stays
    /// off the descriptor while this is not 0.
    pub(super) app_waiting: AtomicUsize,
    /// The engine thread is asleep on the datapath's descriptor (or about to be).
    pub(super) engine_on_fd: AtomicBool,
    /// Datagrams the engine thread's own passes received (tests: it stepped back).
    pub(crate) thread_received: AtomicU64,
    /// Times the engine thread went to sleep on the datapath's descriptor (tests: its spin).
    pub(crate) thread_fd_sleeps: AtomicU64,
    /// Times the engine thread, stepping back for a polling application, found packets the
    /// application had left behind and took the descriptor back (tests).
    pub(crate) left_behind: AtomicU64,
    /// Whether the datapath has a readiness descriptor (asked once).
    has_fd: OnceLock<bool>,
}

/// What a [`Device::wait_running_engine`] waits for, and the descriptor it sleeps on besides
/// the datapath's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WaitFor<'a> {
    /// A completion on this CQ; its `dp_wake` (from [`cq_wake`]).
    Cq(&'a CqShared, &'a EventFd),
    /// The CQ's completion channel to fire: its event fd (left for the caller to read).
    Channel(&'a EventFd),
}

/// How a [`Device::wait_running_engine`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woke {
    /// `ready()` returned true (checked under the engine lock before sleeping).
    Ready,
    /// Ran a pass (after a sleep, unless told not to); check again. `received`: the pass
    /// received datagrams (a message often comes as two, its ACK right behind it: the next
    /// round then passes again before it sleeps).
    Passed {
        /// Whether the pass received any datagram.
        received: bool,
    },
}

/// How long a waiter sleeps at most while the datapath refuses datagrams (as the engine
/// thread).
const TX_BLOCKED_NAP: Duration = Duration::from_micros(200);

impl Device {
    /// Whether [`Self::wait_running_engine`] can be used: the datapath has a readiness
    /// descriptor to sleep on (and the device runs one engine: module docs).
    pub(crate) fn can_wait_in_datapath(&self) -> bool {
        let s = self.shared();
        *s.wait.has_fd.get_or_init(|| {
            s.shards.len() == 1
                && lock(&s.shards[0].engine)
                    .datapath()
                    .readiness_fd()
                    .is_some()
        })
    }

    /// One round of a blocking wait that runs the engine in this thread (module docs):
    /// registers as a waiter (in the CQ for [`WaitFor::Cq`], and in the device), checks
    /// `ready` under the engine lock (returns [`Woke::Ready`] if it holds); with `sleep`,
    /// sends what a pass deferred and sleeps until the datapath or the [`WaitFor`] descriptor
    /// is readable, the next engine deadline or `deadline`, whichever comes first (without,
    /// the previous round's pass received something and more may be right behind it); and
    /// then runs a pass
    /// ([`Woke::Passed`]; `completed`, which may run under the engine lock, says whether the
    /// caller now has what it waited for and returns to the application: the ACK the pass
    /// built then waits for the application's next post, as after a poll that returns a
    /// receive).
    pub(crate) fn wait_running_engine(
        &self,
        deadline: Instant,
        on: WaitFor<'_>,
        sleep: bool,
        ready: impl FnOnce() -> bool,
        completed: impl Fn() -> bool,
    ) -> Woke {
        let s = self.shared();
        let (wake, cq) = match on {
            WaitFor::Cq(cq, wake) => (wake, Some(cq)),
            WaitFor::Channel(event) => (event, None),
        };
        let registered = Registered::enter(s, cq);
        let (fd, timer, tx_blocked) = {
            // One engine ([`Self::can_wait_in_datapath`]).
            let mut e = lock(&s.shards[0].engine);
            if ready() {
                return Woke::Ready;
            }
            if sleep {
                let (fd, timer) = before_sleep(&mut e);
                (fd, timer, e.tx_waiting())
            } else {
                (None, None, false)
            }
        };
        if sleep {
            let mut wait = deadline.saturating_duration_since(Instant::now());
            if let Some(t) = timer {
                wait = wait.min(t);
            }
            if tx_blocked || fd.is_none() {
                wait = wait.min(TX_BLOCKED_NAP);
            }
            let [_, woken] = sleep_on([fd, Some(wake.as_raw_fd())], wait);
            if woken && cq.is_some() {
                // Read after the sleep that saw it, before the next check (module docs).
                wake.drain();
            }
        }
        drop(registered);
        // A pass whose receive budget ran out leaves datagrams the descriptor need not
        // announce again (module docs): make the next one at once, unless the caller has
        // what it waited for (it returns; the rest is for the next pass) or its time is up.
        let mut received = false;
        while let Some(r) = self.try_progress_pass(cq.is_some(), &completed) {
            received |= r.received > 0;
            if !r.more_rx || completed() || Instant::now() >= deadline {
                break;
            }
        }
        Woke::Passed { received }
    }
}

/// A waiter's registrations, undone when dropped (after the sleep, or on an early return).
struct Registered<'a> {
    s: &'a DeviceShared,
    cq: Option<&'a CqShared>,
    threaded: bool,
}

impl<'a> Registered<'a> {
    /// Counts the waiter in `cq` (a CQ wait) and in the device, and hands the descriptor over
    /// from the engine thread (module docs).
    fn enter(s: &'a DeviceShared, cq: Option<&'a CqShared>) -> Self {
        if let Some(cq) = cq {
            cq.dp_waiters.fetch_add(1, Ordering::SeqCst);
        }
        let threaded = s.progress == Progress::Thread;
        if threaded {
            s.wait.app_waiting.fetch_add(1, Ordering::SeqCst);
            if s.wait.engine_on_fd.load(Ordering::SeqCst) {
                // The engine thread sleeps on the descriptor: out of it, so that it parks.
                for sh in s.shards.iter() {
                    sh.wake();
                }
            }
        }
        Self { s, cq, threaded }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(cq) = self.cq {
            cq.dp_waiters.fetch_sub(1, Ordering::SeqCst);
        }
        if self.threaded {
            if self.cq.is_some() {
                // Stamped before leaving: the engine thread keeps stepping back for a window.
                let now = super::thread::since_epoch_ns();
                for sh in self.s.shards.iter() {
                    sh.app_polled.store(now, Ordering::Relaxed);
                }
            }
            self.s.wait.app_waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes; says which were readable.
fn sleep_on(fds: [Option<RawFd>; 2], timeout: Duration) -> [bool; 2] {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 2];
    for (p, fd) in pfds.iter_mut().zip(fds) {
        // A negative descriptor is ignored by poll(2).
        p.fd = fd.unwrap_or(-1);
    }
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    #[allow(unsafe_code)]
    // SAFETY: two live, initialised pollfds (nfds = 2), a live timespec, no signal mask.
    let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if n <= 0 {
        return [false; 2];
    }
    pfds.map(|p| p.revents & libc::POLLIN != 0)
}

/// The CQ's wake descriptor for [`Device::wait_running_engine`], made at its first use;
/// `None` if it cannot be made (the caller then waits on the CQ's condvar).
pub(crate) fn cq_wake(cq: &CqShared) -> Option<&EventFd> {
    if cq.dp_wake.get().is_none() {
        let fd = EventFd::new().ok()?;
        let _ = cq.dp_wake.set(fd);
    }
    cq.dp_wake.get()
}

/// `timeout` from now, or a year from now for a timeout too long to add (never panics).
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use crate::{
        Access, AttrMask, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig,
        LinkConfig, MemoryRegion, Progress, Psn, QpAttr, QpInit, QpState, QpType, QueuePair,
        RecvWr, RemoteQp, SendOp, SendWr, SimNetwork, WcOpcode, WcStatus,
    };

    /// A device with several engines keeps the old waits (module docs, "When"): a waiter
    /// would sleep on one engine's descriptor while its completion may come from another's.
    /// (Its blocking waits are exercised by `tests/engines.rs`, whose selftests wait on CQs.)
    #[test]
    fn a_device_with_several_engines_does_not_wait_in_the_datapath() {
        let _net = roce_testkit::netns::private_net();
        let open = |ip: &str, n: usize| {
            Device::open(
                DeviceConfig::udp(ip.parse().unwrap())
                    .exclusive()
                    .engines(n),
            )
            .unwrap()
        };
        let (one, two) = (open("127.0.0.1", 1), open("127.0.0.2", 2));
        assert_eq!((one.engines(), two.engines()), (1, 2));
        assert!(one.can_wait_in_datapath());
        assert!(!two.can_wait_in_datapath());
    }

    struct Side {
        dev: Device,
        cq: CompletionQueue,
        qp: QueuePair,
        mr: MemoryRegion,
    }

    /// A connected RC pair on `net` at 10.31.`x`.1 (`pa`) and 10.31.`x`.2 (`pb`), ACK timeout
    /// exponent 10 (about 4 ms).
    fn pair(net: &SimNetwork, x: u8, pa: Progress, pb: Progress) -> (Side, Side) {
        let side = |host: u8, progress| {
            let cfg = DeviceConfig::sim(net, format!("10.31.{x}.{host}").parse().unwrap())
                .progress(progress);
            let dev = Device::open(cfg).unwrap();
            let pd = dev.alloc_pd();
            let cq = dev.create_cq(1024).unwrap();
            let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
            let mr = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
            Side { dev, cq, qp, mr }
        };
        let (a, b) = (side(1, pa), side(2, pb));
        let remote = |s: &Side| RemoteQp {
            qpn: s.qp.qpn(),
            psn: Psn::new(0),
            gid: s.dev.local_gid(),
        };
        let o = ConnectOptions {
            timeout: 10,
            ..ConnectOptions::default()
        };
        a.qp.connect(&remote(&b), &o).unwrap();
        b.qp.connect(&remote(&a), &o).unwrap();
        (a, b)
    }

    fn post_recv(s: &Side, id: u64) {
        s.qp.post_recv(RecvWr {
            wr_id: id,
            sges: vec![s.mr.sge(0, 64)],
        })
        .unwrap();
    }

    fn send(s: &Side, id: u64) {
        s.qp.post_send(SendWr::new(id, SendOp::Send, vec![s.mr.sge(0, 64)]))
            .unwrap();
    }

    /// Waits for one completion on `cq` (at most 5 s) and checks it.
    fn one(cq: &CompletionQueue, opcode: WcOpcode) -> Completion {
        let mut wc = [Completion::EMPTY];
        assert_eq!(cq.wait(&mut wc, Duration::from_secs(5)), 1, "no completion");
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(wc[0].opcode, opcode);
        wc[0]
    }

    /// [`one`], driving `other` meanwhile (a manual-progress peer that owes an ACK).
    fn one_driving(cq: &CompletionQueue, opcode: WcOpcode, other: &Device) -> Completion {
        let t = Instant::now();
        let mut wc = [Completion::EMPTY];
        loop {
            assert!(t.elapsed() < Duration::from_secs(5), "no completion");
            other.progress();
            if cq.wait(&mut wc, Duration::from_millis(2)) == 1 {
                assert_eq!((wc[0].status, wc[0].opcode), (WcStatus::Success, opcode));
                return wc[0];
            }
        }
    }

    /// A thread blocked in `CompletionQueue::wait` receives its messages itself: the engine
    /// thread steps back and receives (almost) none of them. Before the waiter ran the
    /// engine, the engine thread received every one and woke the waiter's condvar.
    #[test]
    fn a_blocked_waiter_receives_itself_with_the_engine_thread_stepped_back() {
        let net = SimNetwork::perfect();
        let (a, b) = pair(&net, 1, Progress::Thread, Progress::Thread);
        const N: u64 = 40;
        for id in 0..N {
            post_recv(&b, id);
        }
        let cq = b.cq.clone();
        let waiter = std::thread::spawn(move || {
            (0..N)
                .map(|_| one(&cq, WcOpcode::Recv).wr_id)
                .collect::<Vec<_>>()
        });
        let before = b.dev.shared().wait.thread_received.load(Ordering::Relaxed);
        for id in 0..N {
            // Long enough for the waiter to be asleep on the datapath again.
            std::thread::sleep(Duration::from_millis(3));
            send(&a, id);
        }
        let got = waiter.join().unwrap();
        assert_eq!(got, (0..N).collect::<Vec<_>>());
        let by_thread = b.dev.shared().wait.thread_received.load(Ordering::Relaxed) - before;
        // The engine thread's pass once per window may catch a message now and then.
        assert!(
            by_thread <= N / 4,
            "the engine thread received {by_thread} of {N} messages"
        );
    }

    /// The first SEND is lost; its retransmission is timer-driven and must happen while the
    /// requester's only application thread is blocked in `wait` (with manual progress nobody
    /// else runs the timers). The link heals once the requester has retransmitted.
    #[test]
    fn a_timer_driven_retransmission_completes_while_the_application_blocks() {
        for (x, progress) in [(2, Progress::Manual), (3, Progress::Thread)] {
            let net = SimNetwork::perfect();
            let (a, b) = pair(&net, x, progress, progress);
            post_recv(&b, 7);
            net.set_link(LinkConfig::dead());
            let healed = Arc::new(AtomicBool::new(false));
            let (h, net2, adev) = (healed.clone(), net.clone(), a.dev.clone());
            let healer = std::thread::spawn(move || {
                let t = Instant::now();
                while adev.counters().retransmitted_pkts == 0 {
                    assert!(t.elapsed() < Duration::from_secs(5), "no retransmission");
                    std::thread::sleep(Duration::from_micros(200));
                }
                net2.set_link(LinkConfig {
                    delay_ns: 0,
                    ..LinkConfig::perfect()
                });
                h.store(true, Ordering::SeqCst);
            });
            // The responder's thread: its wait, then (manual progress) it goes on driving
            // its device, which owes the requester an ACK.
            let (bcq, bdev) = (b.cq.clone(), b.dev.clone());
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let receiver = std::thread::spawn(move || {
                let id = one(&bcq, WcOpcode::Recv).wr_id;
                while !d.load(Ordering::SeqCst) {
                    bdev.progress_wait(Duration::from_millis(1));
                }
                id
            });
            send(&a, 1);
            let c = one(&a.cq, WcOpcode::Send);
            done.store(true, Ordering::SeqCst);
            assert_eq!(c.wr_id, 1);
            assert!(healed.load(Ordering::SeqCst), "completed over a dead link");
            assert_eq!(receiver.join().unwrap(), 7);
            healer.join().unwrap();
            let n = a.dev.counters();
            assert!(n.retransmitted_pkts >= 1, "{progress:?}: {n:?}");
        }
    }

    /// Another thread runs every pass (a busy poller of the device), so each completion the
    /// waiter wants is queued by someone else, at any point of its check-then-sleep: it must
    /// be woken at once, never sleep out its timeout.
    #[test]
    fn no_wakeup_is_lost_when_another_thread_receives() {
        let net = SimNetwork::perfect();
        let (a, b) = pair(&net, 4, Progress::Thread, Progress::Manual);
        let stop = Arc::new(AtomicBool::new(false));
        let (dev, s) = (b.dev.clone(), stop.clone());
        let poller = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                dev.progress();
            }
        });
        let mut slowest = Duration::ZERO;
        for id in 0..300 {
            post_recv(&b, id);
            send(&a, id);
            let t = Instant::now();
            let mut wc = [Completion::EMPTY];
            let n = b.cq.wait(&mut wc, Duration::from_secs(3));
            slowest = slowest.max(t.elapsed());
            assert_eq!(n, 1, "message {id}: no completion within 3 s");
            assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::Success));
            one(&a.cq, WcOpcode::Send);
        }
        stop.store(true, Ordering::Relaxed);
        poller.join().unwrap();
        // A lost wake-up sleeps out the 3 s (or the next timer); a slow machine takes ms.
        assert!(
            slowest < Duration::from_millis(500),
            "slowest wait {slowest:?}"
        );
    }

    /// Waits until `dev`'s engine thread is parked for a blocked waiter (stepped back, off
    /// the descriptor); panics after 5 s.
    fn until_engine_thread_parked(dev: &Device) {
        let w = &dev.shared().wait;
        let t = Instant::now();
        while w.app_waiting.load(Ordering::SeqCst) == 0 || w.engine_on_fd.load(Ordering::SeqCst) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "engine thread never parked"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// A completion that another thread queues without any datagram (a receive posted to a
    /// QP in the error state is flushed by that thread's pass) can wake the waiter through the
    /// CQ's wake descriptor only: the datapath stays quiet. Each wait must end at once.
    #[test]
    fn a_completion_queued_by_another_thread_wakes_the_waiter() {
        for (x, progress) in [(15, Progress::Thread), (16, Progress::Manual)] {
            let net = SimNetwork::perfect();
            let (_a, b) = pair(&net, x, progress, progress);
            let err = QpAttr {
                state: QpState::Err,
                ..QpAttr::default()
            };
            b.qp.modify(&err, AttrMask::STATE).unwrap();
            let b = Arc::new(b);
            for id in 0..30 {
                let other = b.clone();
                let poster = std::thread::spawn(move || {
                    // Long enough for the waiter to be asleep.
                    std::thread::sleep(Duration::from_millis(3));
                    post_recv(&other, id);
                    other.dev.progress();
                });
                let t = Instant::now();
                let mut wc = [Completion::EMPTY];
                let n = b.cq.wait(&mut wc, Duration::from_secs(3));
                let took = t.elapsed();
                poster.join().unwrap();
                assert_eq!(n, 1, "{progress:?} flush {id}: no completion within 3 s");
                assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::WrFlushErr));
                // A lost wake-up sleeps out the 3 s (no timer is pending).
                assert!(
                    took < Duration::from_millis(500),
                    "{progress:?} {id}: {took:?}"
                );
            }
        }
    }

    /// Two threads block on one CQ; another thread's pass queues two completions at once
    /// (two flushed receives), which wakes both through the CQ's shared wake descriptor. The
    /// first to run reads it and takes one completion; the other must not sleep on with the
    /// second queued (the first passes the wake-up on).
    #[test]
    fn two_waiters_on_one_cq_each_take_one_of_two_completions_queued_at_once() {
        let net = SimNetwork::perfect();
        let (_a, b) = pair(&net, 17, Progress::Manual, Progress::Manual);
        let err = QpAttr {
            state: QpState::Err,
            ..QpAttr::default()
        };
        b.qp.modify(&err, AttrMask::STATE).unwrap();
        for round in 0..10u64 {
            let start = Arc::new(Barrier::new(3));
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let (cq, start) = (b.cq.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let mut wc = [Completion::EMPTY];
                        let n = cq.wait(&mut wc, Duration::from_secs(3));
                        let at = Instant::now();
                        // Busy with it long after the other should have its completion.
                        std::thread::sleep(Duration::from_millis(300));
                        (n, wc[0].wr_id, at)
                    })
                })
                .collect();
            start.wait();
            std::thread::sleep(Duration::from_millis(5));
            post_recv(&b, 2 * round);
            post_recv(&b, 2 * round + 1);
            let queued = Instant::now();
            b.dev.progress();
            let mut got: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            got.sort_by_key(|g| g.1);
            assert_eq!(
                got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
                [(1, 2 * round), (1, 2 * round + 1)],
                "round {round}"
            );
            for (_, id, at) in got {
                let took = at - queued;
                assert!(
                    took < Duration::from_millis(150),
                    "round {round}: {id} after {took:?}"
                );
            }
        }
    }

    /// A SEND that arrives while the engine thread is parked (a waiter took the descriptor)
    /// completes the blocked wait at once, every time.
    #[test]
    fn a_send_arriving_while_the_engine_thread_is_parked_completes_the_wait() {
        let net = SimNetwork::perfect();
        let (a, b) = pair(&net, 5, Progress::Thread, Progress::Thread);
        for id in 0..20 {
            post_recv(&b, id);
            let cq = b.cq.clone();
            let waiter = std::thread::spawn(move || {
                let t = Instant::now();
                let c = one(&cq, WcOpcode::Recv);
                (c.wr_id, t.elapsed())
            });
            until_engine_thread_parked(&b.dev);
            let sent = Instant::now();
            send(&a, id);
            let (got, _) = waiter.join().unwrap();
            assert_eq!(got, id);
            // A lost wake-up sleeps out the wait's 5 s (the responder has no timer).
            let took = sent.elapsed();
            assert!(took < Duration::from_millis(500), "message {id}: {took:?}");
            one(&a.cq, WcOpcode::Send);
        }
    }

    /// `k` RC QPs from `a` to `b` on `net` (10.31.`x`.1 and .2): `a`'s share one CQ, each of
    /// `b`'s has its own. Returns `a`'s QPs and MR, and `b`'s (QP, CQ, MR) triples.
    #[allow(clippy::type_complexity)]
    fn fan(
        net: &SimNetwork,
        x: u8,
        k: usize,
        pb: Progress,
    ) -> (
        Device,
        CompletionQueue,
        Vec<QueuePair>,
        MemoryRegion,
        Device,
        Vec<(QueuePair, CompletionQueue, MemoryRegion)>,
    ) {
        let open = |host: u8, progress| {
            let addr = format!("10.31.{x}.{host}").parse().unwrap();
            Device::open(DeviceConfig::sim(net, addr).progress(progress)).unwrap()
        };
        let (da, db) = (open(1, Progress::Thread), open(2, pb));
        let (pda, pdb) = (da.alloc_pd(), db.alloc_pd());
        let cqa = da.create_cq(1024).unwrap();
        let mra = pda.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        let o = ConnectOptions::default();
        let mut qas = Vec::new();
        let mut bs = Vec::new();
        for _ in 0..k {
            let qa = pda.create_qp(&QpInit::new(QpType::Rc, &cqa)).unwrap();
            let cqb = db.create_cq(64).unwrap();
            let qb = pdb.create_qp(&QpInit::new(QpType::Rc, &cqb)).unwrap();
            let mrb = pdb.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
            let remote = |q: &QueuePair, d: &Device| RemoteQp {
                qpn: q.qpn(),
                psn: Psn::new(0),
                gid: d.local_gid(),
            };
            qa.connect(&remote(&qb, &db), &o).unwrap();
            qb.connect(&remote(&qa, &da), &o).unwrap();
            qas.push(qa);
            bs.push((qb, cqb, mrb));
        }
        (da, cqa, qas, mra, db, bs)
    }

    /// Four threads block on four CQs of one device (engine thread, or manual progress: then
    /// the waiters are the only ones driving it); messages to the four QPs arrive in a
    /// scrambled order, and each thread gets exactly its own, in order, without sleeping out
    /// a timeout.
    #[test]
    fn threads_waiting_on_different_cqs_of_one_device_each_get_their_own() {
        for (x, progress) in [(6, Progress::Thread), (7, Progress::Manual)] {
            let net = SimNetwork::perfect();
            const K: usize = 4;
            const ROUNDS: u64 = 50;
            let (_da, cqa, qas, mra, db, bs) = fan(&net, x, K, progress);
            for (qb, _, mrb) in &bs {
                for r in 0..ROUNDS {
                    qb.post_recv(RecvWr {
                        wr_id: r,
                        sges: vec![mrb.sge(0, 64)],
                    })
                    .unwrap();
                }
            }
            let start = Arc::new(Barrier::new(K + 1));
            let waiters: Vec<_> = bs
                .iter()
                .enumerate()
                .map(|(i, (qb, cqb, _))| {
                    let (cq, qpn, start) = (cqb.clone(), qb.qpn(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let mut slowest = Duration::ZERO;
                        for r in 0..ROUNDS {
                            let t = Instant::now();
                            let c = one(&cq, WcOpcode::Recv);
                            slowest = slowest.max(t.elapsed());
                            assert_eq!((c.qp_num, c.wr_id), (qpn, r), "thread {i}");
                        }
                        slowest
                    })
                })
                .collect();
            start.wait();
            for r in 0..ROUNDS as usize {
                // A different order each round: 0 1 2 3, 0 3 2 1, 2 3 0 1, 2 1 0 3, ...
                for j in 0..K {
                    let i = if r % 2 == 0 { r + j } else { r + K - 1 - j };
                    let q = &qas[i % K];
                    q.post_send(SendWr::new(r as u64, SendOp::Send, vec![mra.sge(0, 64)]))
                        .unwrap();
                }
                std::thread::sleep(Duration::from_micros(300));
            }
            for w in waiters {
                let slowest = w.join().unwrap();
                assert!(
                    slowest < Duration::from_secs(2),
                    "{progress:?}: {slowest:?}"
                );
            }
            // The receivers may owe ACKs (manual progress): drive them meanwhile.
            let mut wc = [Completion::EMPTY; 16];
            let mut sends = 0;
            let t = Instant::now();
            while sends < K * ROUNDS as usize {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "{progress:?}: {sends} sends"
                );
                db.progress();
                let n = cqa.wait(&mut wc, Duration::from_millis(2));
                assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success));
                sends += n;
            }
        }
    }

    /// Several threads block on one CQ, each taking one completion at a time and then busy
    /// for a while: a burst of completions is shared out, none stays queued while a waiter
    /// sleeps (a waiter that read the shared wake-up passes it on).
    #[test]
    fn several_waiters_on_one_cq_share_a_burst() {
        let net = SimNetwork::perfect();
        let (a, b) = pair(&net, 8, Progress::Thread, Progress::Thread);
        const THREADS: usize = 3;
        const N: u64 = 60;
        for id in 0..N {
            post_recv(&b, id);
        }
        let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiters: Vec<_> = (0..THREADS)
            .map(|_| {
                let (cq, taken) = (b.cq.clone(), taken.clone());
                std::thread::spawn(move || loop {
                    let mut wc = [Completion::EMPTY];
                    if cq.wait(&mut wc, Duration::from_millis(1500)) == 0 {
                        return;
                    }
                    taken.lock().unwrap().push((wc[0].wr_id, Instant::now()));
                    std::thread::sleep(Duration::from_millis(2));
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let sent = Instant::now();
        for id in 0..N {
            send(&a, id);
        }
        for w in waiters {
            w.join().unwrap();
        }
        let mut taken = taken.lock().unwrap().clone();
        taken.sort_by_key(|t| t.0);
        assert_eq!(
            taken.iter().map(|t| t.0).collect::<Vec<_>>(),
            (0..N).collect::<Vec<_>>()
        );
        // Three threads at 2 ms each take 40 ms for 60 completions; one alone 120 ms; a
        // completion stranded behind a sleeping waiter waits out its 1.5 s.
        let last = taken.iter().map(|t| t.1).max().unwrap() - sent;
        assert!(
            last < Duration::from_millis(1000),
            "last taken after {last:?}"
        );
    }

    /// A wait with nothing to come returns 0 at its timeout, not before and not much after;
    /// a zero timeout returns at once; a huge one does not panic computing its deadline.
    #[test]
    fn a_wait_with_nothing_returns_at_its_timeout() {
        for (x, progress) in [(9, Progress::Thread), (10, Progress::Manual)] {
            let net = SimNetwork::perfect();
            let (a, b) = pair(&net, x, progress, progress);
            let mut wc = [Completion::EMPTY];
            for ms in [0u64, 30, 100] {
                let t = Instant::now();
                assert_eq!(b.cq.wait(&mut wc, Duration::from_millis(ms)), 0);
                let took = t.elapsed();
                assert!(
                    took >= Duration::from_millis(ms),
                    "{progress:?} {ms} ms: {took:?}"
                );
                assert!(
                    took < Duration::from_millis(ms + 300),
                    "{progress:?} {ms} ms: {took:?}"
                );
                let t = Instant::now();
                assert!(!b.cq.get_event(Duration::from_millis(ms)));
                let took = t.elapsed();
                assert!(
                    took >= Duration::from_millis(ms),
                    "{progress:?} {ms} ms: {took:?}"
                );
                assert!(
                    took < Duration::from_millis(ms + 300),
                    "{progress:?} {ms} ms: {took:?}"
                );
            }
            // Deadlines beyond what an Instant can hold: a message is queued first so the
            // wait returns.
            post_recv(&b, 1);
            send(&a, 1);
            assert_eq!(b.cq.wait(&mut wc, Duration::MAX), 1);
            assert_eq!(wc[0].wr_id, 1);
        }
    }

    /// The completion-channel path: a thread blocked in `get_event` (running the engine) is
    /// woken by the completion its armed CQ gets, and the completion is then polled; without
    /// arming, a completion makes no event.
    #[test]
    fn get_event_returns_for_the_completion_of_an_armed_cq() {
        for (x, progress) in [(11, Progress::Thread), (12, Progress::Manual)] {
            let net = SimNetwork::perfect();
            let (a, b) = pair(&net, x, progress, progress);
            for round in 0..10u64 {
                post_recv(&b, round);
                b.cq.req_notify(false);
                let cq = b.cq.clone();
                let waiter = std::thread::spawn(move || {
                    let fired = cq.get_event(Duration::from_secs(5));
                    (fired, cq.poll_one())
                });
                if progress == Progress::Thread {
                    until_engine_thread_parked(&b.dev);
                } else {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let sent = Instant::now();
                send(&a, round);
                let (fired, c) = waiter.join().unwrap();
                assert!(fired, "{progress:?} round {round}: no event");
                assert!(sent.elapsed() < Duration::from_millis(500));
                let c = c.expect("the completion behind the event");
                assert_eq!((c.wr_id, c.opcode), (round, WcOpcode::Recv));
                one_driving(&a.cq, WcOpcode::Send, &b.dev);
            }
            // Not armed: the completion is queued, the channel stays quiet.
            post_recv(&b, 99);
            send(&a, 99);
            one_driving(&a.cq, WcOpcode::Send, &b.dev);
            assert!(!b.cq.get_event(Duration::from_millis(30)));
            assert_eq!(b.cq.poll_one().map(|c| c.wr_id), Some(99));
        }
    }

    /// Thousands of ping-pongs between two devices, each side a thread blocked in `wait`
    /// between messages (engine threads parked, or manual progress): a lost wake-up on either
    /// side sleeps out the 5 s wait (the responder has no timer) or an ACK timeout, which
    /// the bound on the slowest round trip catches.
    #[test]
    fn blocking_ping_pong_stress() {
        for (x, progress, n) in [
            (13, Progress::Thread, 3000u64),
            (14, Progress::Manual, 2000),
        ] {
            let net = SimNetwork::perfect();
            let (a, b) = pair(&net, x, progress, progress);
            let t = Instant::now();
            let (slow_a, slow_b) = ping_pong(a, b, n);
            let took = t.elapsed();
            eprintln!(
                "{progress:?}: {n} round trips in {took:?} (slowest wait: {slow_a:?}, {slow_b:?})"
            );
            assert!(slow_a.max(slow_b) < Duration::from_secs(2), "{progress:?}");
            assert!(took < Duration::from_secs(60), "{progress:?}: {took:?}");
        }
    }

    /// `n` SEND ping-pongs from `a` to `b` and back, each side in its own thread blocked in
    /// `wait`; returns each side's slowest wait.
    fn ping_pong(a: Side, b: Side, n: u64) -> (Duration, Duration) {
        // Each side's first receive is posted before either sends.
        post_recv(&a, 0);
        post_recv(&b, 0);
        let done = Arc::new(AtomicUsize::new(0));
        // With manual progress a side that is done goes on driving its device until the
        // other is: it may owe the other side an ACK.
        let side = move |s: Side, initiator: bool, done: Arc<AtomicUsize>| {
            let slowest = ping_pong_side(&s, n, initiator);
            done.fetch_add(1, Ordering::SeqCst);
            while done.load(Ordering::SeqCst) < 2 {
                s.dev.progress_wait(Duration::from_millis(1));
            }
            slowest
        };
        let d = done.clone();
        let responder = std::thread::spawn(move || side(b, false, d));
        let slow_a = side(a, true, done);
        (slow_a, responder.join().unwrap())
    }

    /// One side of [`ping_pong`]: the initiator sends message `i` and waits for the answer;
    /// the responder waits for message `i` and answers it. Each consumed receive is reposted
    /// at once (one message in flight each way).
    fn ping_pong_side(s: &Side, n: u64, initiator: bool) -> Duration {
        let mut slowest = Duration::ZERO;
        let mut wc = [Completion::EMPTY; 2];
        let (mut sends, mut recvs) = (0u64, 0u64);
        let take = |wc: &[Completion], sends: &mut u64, recvs: &mut u64| {
            for c in wc {
                assert_eq!(c.status, WcStatus::Success, "after {recvs} messages");
                if c.opcode == WcOpcode::Recv {
                    assert_eq!(c.wr_id, *recvs);
                    *recvs += 1;
                    post_recv(s, *recvs);
                } else {
                    *sends += 1;
                }
            }
        };
        for i in 0..n {
            if initiator {
                send(s, i);
            }
            while recvs <= i {
                let t = Instant::now();
                let k = s.cq.wait(&mut wc, Duration::from_secs(5));
                slowest = slowest.max(t.elapsed());
                assert!(k > 0, "message {i}: no completion within 5 s");
                take(&wc[..k], &mut sends, &mut recvs);
            }
            if !initiator {
                send(s, i);
            }
        }
        while sends < n {
            let k = s.cq.wait(&mut wc, Duration::from_secs(5));
            assert!(k > 0, "{sends} of {n} send completions");
            take(&wc[..k], &mut sends, &mut recvs);
        }
        slowest
    }
}
