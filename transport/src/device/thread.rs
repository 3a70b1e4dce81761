//! Who drives the engine, and how the threads and locks of a device fit together.
//!
//! # Engines ("shards")
//!
//! A device runs one engine, or `n` with [`crate::DeviceConfig::engines`] (the `udp` backend
//! of a device holding its address alone): `n` [`super::Shard`]s, each an engine behind its
//! own lock with its own datapath socket, engine thread, `mio` waker, `sleep_until` and
//! `app_polled`. Every QP lives in exactly one: shard `QPN % n` (the QPN allocator hands out
//! QPNs that way, `crate::ids`), and the kernel steers each datagram to its destination QP's
//! shard (`crate::datapath::shard`); what arrives at the wrong one anyway (NAPI GRO merges)
//! goes through the owner's inbox (`crate::inbox`). Everything below holds per shard: "the
//! engine lock" is the lock of the shard that owns the QP in question, and the wake protocol
//! runs between a shard's doorbells and that shard's thread. Device-wide operations
//! (`progress`, `progress_wait`, `poll_timeout`, counters, async events, the drop) visit the
//! shards one at a time, never holding two engine locks; a CQ poll that finds nothing tries
//! every shard's lock in turn (a CQ may be fed by QPs of several shards).
//!
//! # Threads
//!
//! - **Application threads** call the verbs. A post locks the engine, queues the WR, and rings
//!   the doorbell ([`Device::doorbell`]): the packets leave from the caller's thread before the
//!   call returns. A CQ poll that finds nothing makes progress itself if the engine lock is
//!   free (`try_lock`), so a busy-polling application needs no other thread.
//! - **The engine thread** (one per shard, [`crate::Progress::Thread`]) loops in
//!   [`run_thread`]: one progress pass under the engine lock, then a `mio` poll on the
//!   datapath's readiness descriptor and a [`mio::Waker`] until the next deadline (a QP timer
//!   or a delayed simulated packet). With [`crate::Progress::Manual`] there is no such thread:
//!   the application's `progress`/`progress_wait`/CQ polls run the same pass.
//!
//! # Stepping back while the application polls
//!
//! A busy-polling application runs the receive pass itself (a CQ poll that finds nothing calls
//! `try_progress`). If the engine thread also sleeps on the datapath's descriptor, every
//! datagram wakes it too: two threads race for the engine lock and the packet, and on a
//! small host the wake-up itself (a context switch onto a CPU the poller wants) costs more
//! than the receive. So while an application thread has polled within [`APP_POLL_WINDOW`],
//! the engine thread does not wait on the descriptor: it sleeps until its next deadline, at
//! most one window, and then runs a pass (timers, and whatever the poller left). When the
//! polls stop it waits on the descriptor again, so one-sided operations into an idle
//! application still complete. An application that is about to sleep where it runs no pass
//! (arming a CQ for a completion channel it reads itself, a wait on a datapath without a
//! readiness descriptor) says so (`Device::app_blocks`): the engine thread is unparked at
//! once and goes back to the descriptor, so an event-driven application never waits out the
//! window.
//!
//! Polling now and then is not polling all the time: an application may poll its CQ and then
//! wait for data elsewhere, spinning on memory an RDMA WRITE fills (perftest's `ib_write_lat`
//! waits on its send completion, then on the buffer; eager-RDMA protocols do the same). No
//! poll of it receives that WRITE; parked for a whole window the engine thread left it
//! waiting up to 1 ms (`ib_write_lat` between two drop-ins: 537 µs typical, against 21 µs for
//! UC, which needs no ACK and so no CQ poll). So the engine thread looks back sooner: first
//! after [`STEP_CHECK_MIN`], each look that finds nothing doubling the next, up to the
//! window (a polling loop costs one look per window, as before). A look whose pass receives
//! packets although the application has not polled for [`LEFT_GAP_NS`] finds them left
//! behind: the engine thread then stays on the descriptor for [`LEFT_FD_HOLD`] whatever the
//! polls (measured: `ib_write_lat` 537 → 19-45 µs typical between two drop-ins; `ib_send_lat`,
//! `ib_read_lat`, `ib_atomic_lat` unchanged).
//!
//! An application thread blocked in a CQ wait or a completion-channel wait runs the engine
//! itself: it sleeps on the datapath's descriptor and makes the pass when woken, and the
//! engine thread steps back the same way while it does (`device/wait.rs`: the hand-over of
//! the descriptor and why no wake-up is lost).
//!
//! # Lock order
//!
//! **engine → CQ → capture → sim network.** Each lock is only ever taken while holding locks
//! to its left, never the other way round, and no thread holds two engine locks at once:
//!
//! - an engine `Mutex` (one per shard) is the doorbell of its QPs: every verb that touches a
//!   QP locks the QP's shard; the shard's engine thread's pass, the progress of a CQ poll,
//!   and the drops of QPs and devices take it too;
//! - a CQ's `Mutex` is taken by the engine while pushing a completion (under the engine lock)
//!   and by the application polling or waiting (with no other lock held);
//! - the capture `Mutex` is taken by the engine per frame (under the engine lock) and by
//!   `CaptureFile` methods (alone);
//! - the `sim` network's `Mutex` is taken by its ports' `send`/`recv`, i.e. under the engine
//!   lock, and by `SimNetwork` methods (alone);
//! - a fault model's `Mutex` (`SharedFaults`, shared by the `sim` network's fault injectors) is
//!   a leaf: taken under the engine lock while a batch is offered, and released before the
//!   injector calls the datapath it wraps (so never held with the sim lock).
//!
//! A shard's inbox `Mutex` (`crate::inbox`) is a leaf: taken by another shard's pass under
//! that shard's engine lock to hand a datagram on, and by the owner's pass (under its own
//! engine lock) to swap the buffer out. With several shards the async-event hook sits behind
//! a leaf `Mutex` shared by the shards, taken under one engine lock.
//!
//! The QPN allocator's `Mutex` (`DeviceShared::ids`) is a leaf too: taken alone by
//! `create_qp` and `random_psn`, and under the engine lock when a QP is dropped.
//!
//! The key table's per-slot locks (`roce_mr`) are leaves taken under the engine lock while a
//! QP touches memory, and by MR reads/writes alone. No lock is held across a syscall that can
//! block: sends and receives are non-blocking, and both the engine thread and
//! `progress_wait` release the engine lock before they sleep.
//!
//! # The `sleep_until` wake protocol
//!
//! A post can arm a timer (an RC ACK timeout) earlier than the engine thread planned to wake.
//! Waking the thread on every post would cost a syscall per post, so the thread publishes its
//! plan and the doorbell decides:
//!
//! 1. the engine thread, still holding the engine lock after its pass, stores its planned
//!    wake-up (the deadline on the device's [`crate::clock::Clock`], in nanoseconds;
//!    `u64::MAX` for "no deadline", never 0) into its shard's `sleep_until` with `Release`,
//!    releases the lock and sleeps in `mio::Poll::poll` until then (a `mio::Waker` wake-up
//!    sent before it reaches the poll is not lost: the waker stays readable);
//! 2. when it wakes it stores 0 ("awake, will run a pass") before looping;
//! 3. a doorbell, after queueing the WR and sending (under the engine lock), reads the QP's
//!    new deadline, releases the lock and loads `sleep_until` (`Acquire`): if it is 0 the
//!    thread is awake and its next pass sees the timer; if the deadline is earlier than the
//!    plan, it wakes the thread through the `mio::Waker`; otherwise the thread's own wake-up
//!    comes first and nothing is done.
//!
//! The store in step 1 happens under the engine lock, after the pass that computed it, so a
//! doorbell that takes the lock afterwards sees either the plan or 0; a doorbell that ran
//! before the pass had its timer included in the plan. A spurious wake-up only costs one
//! empty pass.

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{Device, DeviceShared, Shard};
use crate::clock;
use crate::engine::Engine;
use crate::sys::lock;
use crate::Progress;

impl Device {
    /// After a post: send at once, and wake the engine thread if a new timer is due before
    /// it planned to wake.
    pub(crate) fn doorbell(&self, mut e: MutexGuard<'_, Engine>, qpn: u32) {
        e.kick();
        let s = self.shared();
        if s.progress != Progress::Thread {
            return;
        }
        let due = e.ep.qps.get(&qpn).and_then(|q| q.qp.poll_timeout());
        drop(e);
        if let Some(due) = due {
            let sh = s.shard_of(qpn);
            let planned = sh.sleep_until.load(Ordering::Acquire);
            if planned == 0 || due.as_nanos() < planned {
                sh.wake();
            }
        }
    }
}

impl Device {
    /// An application thread is about to block where it runs no pass (arming a CQ for its
    /// completion channel, a CQ wait on a condvar): it no longer receives for itself, so the
    /// engine thread must stop stepping back and wait on the datapath again, now.
    pub(crate) fn app_blocks(&self) {
        let s = self.shared();
        if s.progress != Progress::Thread {
            return;
        }
        for sh in s.shards.iter() {
            if sh.app_polled.swap(0, Ordering::Relaxed) != 0 {
                if let Some(t) = sh.engine_thread.get() {
                    t.unpark();
                }
            }
        }
    }
}

impl Shard {
    pub(super) fn wake(&self) {
        if let Some(w) = &self.waker {
            let _ = w.wake();
        }
    }
}

/// How recent an application's CQ poll must be for the engine thread to step back.
pub(super) const APP_POLL_WINDOW: Duration = Duration::from_millis(1);

/// The engine thread's first look back while it steps back; each look that finds nothing
/// left for it doubles the next, up to [`APP_POLL_WINDOW`].
const STEP_CHECK_MIN: Duration = Duration::from_micros(50);

/// How long the application's last poll must lie behind for packets the engine thread's pass
/// finds to count as left behind (a polling loop comes back within microseconds; one that
/// handles a batch of completions between polls, within tens: 20 µs made a busy 1 KiB
/// `ib_send_bw` server on the drop-in take the descriptor often enough to cost it ~15%).
const LEFT_GAP_NS: u64 = 100_000;

/// How long the engine thread stays on the descriptor, whatever the polls, once it found
/// packets an application had left behind while it stepped back.
const LEFT_FD_HOLD: Duration = Duration::from_millis(10);

/// The process-wide origin of [`since_epoch_ns`].
pub(super) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`], never 0.
pub(super) fn since_epoch_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether an application thread polled this shard within [`APP_POLL_WINDOW`].
fn app_polling(s: &Shard) -> bool {
    let at = s.app_polled.load(Ordering::Relaxed);
    at != 0 && since_epoch_ns().saturating_sub(at) < APP_POLL_WINDOW.as_nanos() as u64
}

pub(super) const DATAPATH: mio::Token = mio::Token(0);
pub(super) const WAKER: mio::Token = mio::Token(1);

/// The engine thread of shard `index` of the device.
pub(super) fn run_thread(d: &DeviceShared, index: usize, mut poll: mio::Poll, has_fd: bool) {
    let s = &d.shards[index];
    let _ = s.engine_thread.set(std::thread::current());
    unblock_faults();
    let mut events = mio::Events::with_capacity(16);
    // When a pass of this thread last received something (for `engine_spin`).
    let mut last_rx: Option<Instant> = None;
    // Stepping back: how long until the next look (module docs), and whether this pass is
    // such a look.
    let mut step = STEP_CHECK_MIN;
    let mut looking = false;
    // Until when the thread stays on the descriptor although the application polls (it left
    // packets behind: it waits for them elsewhere, e.g. spinning on memory a WRITE fills).
    let mut fd_hold: Option<Instant> = None;
    while !d.stop.load(Ordering::SeqCst) {
        // Whether the application receives for itself: then stay off the descriptor (module
        // docs) and plan to be back within one look, so that a doorbell does not wake this
        // thread for a timer the poller's own passes (or our next one) will see. An
        // application blocked in the datapath always has it; one that left packets behind
        // lately does not step in for the engine thread.
        let held = fd_hold.is_some_and(|t| Instant::now() < t);
        let blocked = d.wait.app_waiting.load(Ordering::SeqCst) > 0;
        let stepping = has_fd && ((app_polling(s) && !held) || blocked);
        // An application asleep in the datapath receives everything itself (it holds the
        // descriptor): no looks then, one pass per window for the timers, as before.
        let look = if blocked { APP_POLL_WINDOW } else { step };
        let (r, deadline) = {
            let mut e = lock(&s.engine);
            let r = e.progress(false);
            let d = e.next_deadline();
            let mut planned = d.map_or(u64::MAX, |d| d.as_nanos());
            if stepping {
                let back = e.now().as_nanos().saturating_add(look.as_nanos() as u64);
                planned = planned.min(back);
            }
            s.sleep_until.store(planned.max(1), Ordering::Release);
            (r, d.map(|d| clock::until(e.now(), d)))
        };
        if r.received > 0 {
            d.wait
                .thread_received
                .fetch_add(r.received as u64, Ordering::Relaxed);
        }
        if std::mem::take(&mut looking) {
            // A look while stepping back: packets waiting although the application has not
            // polled for a while were left for us; then hold the descriptor. A look that
            // found nothing waits twice as long next time (a polling loop costs one look
            // per window, as before).
            let gap = since_epoch_ns().saturating_sub(s.app_polled.load(Ordering::Relaxed));
            if r.received > 0 && gap > LEFT_GAP_NS {
                fd_hold = Some(Instant::now() + LEFT_FD_HOLD);
                step = STEP_CHECK_MIN;
                d.wait.left_behind.fetch_add(1, Ordering::Relaxed);
            } else if r.received == 0 {
                step = (step * 2).min(APP_POLL_WINDOW);
            }
        }
        if r.more_rx {
            continue;
        }
        if !d.engine_spin.is_zero() && !stepping && has_fd && !r.tx_blocked {
            // Requests came within the spin: poll on, so that the next one is answered
            // without a wake-up. Without the engine lock (an application thread may post
            // meanwhile): zero-timeout polls of the datapath's descriptor and the waker until
            // either is readable (then a pass), the next timer is due, or the spin since the
            // last receive is over. The plan stays published in `sleep_until`, so a doorbell
            // with an earlier timer wakes us through the waker as it would a sleeping thread.
            if r.received > 0 {
                last_rx = Some(Instant::now());
            }
            if let Some(t) = last_rx {
                let mut end = t + d.engine_spin;
                if let Some(due) = deadline {
                    end = end.min(Instant::now() + due);
                }
                if Instant::now() < end {
                    // An application thread that comes to wait in the datapath takes over.
                    while Instant::now() < end
                        && !d.stop.load(Ordering::Relaxed)
                        && d.wait.app_waiting.load(Ordering::Relaxed) == 0
                    {
                        if poll.poll(&mut events, Some(Duration::ZERO)).is_ok()
                            && !events.is_empty()
                        {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    s.sleep_until.store(0, Ordering::Release);
                    continue;
                }
            }
        }
        let mut timeout = deadline.unwrap_or(Duration::from_secs(1));
        if r.tx_blocked || !has_fd {
            timeout = timeout.min(Duration::from_micros(200));
        }
        if stepping {
            // Parked, not asleep: an application about to block unparks us (`app_blocks`).
            std::thread::park_timeout(timeout.min(look));
            s.sleep_until.store(0, Ordering::Release);
            looking = !blocked && d.wait.app_waiting.load(Ordering::SeqCst) == 0;
            continue;
        }
        // An application thread that blocks in the datapath (`wait.rs`) takes the descriptor:
        // publish that we are about to sleep on it, then look for one (the waiter does the
        // opposite, so one of us sees the other).
        d.wait.engine_on_fd.store(true, Ordering::SeqCst);
        if has_fd && d.wait.app_waiting.load(Ordering::SeqCst) > 0 {
            d.wait.engine_on_fd.store(false, Ordering::SeqCst);
            s.sleep_until.store(0, Ordering::Release);
            continue;
        }
        d.wait.thread_fd_sleeps.fetch_add(1, Ordering::Relaxed);
        if poll.poll(&mut events, Some(timeout)).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        d.wait.engine_on_fd.store(false, Ordering::SeqCst);
        s.sleep_until.store(0, Ordering::Release);
    }
}

/// Unblocks SIGSEGV and SIGBUS in the calling engine thread, which inherits the mask of the
/// thread that opened the device: this thread writes application memory, and `roce_mr`
/// recovers a fault there only if the signal can be delivered (a blocked fault kills the
/// process).
#[allow(unsafe_code)]
fn unblock_faults() {
    // SAFETY: an empty set filled through libc, then passed to pthread_sigmask with a null
    // old-mask pointer; no memory is shared.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGSEGV);
        libc::sigaddset(&mut set, libc::SIGBUS);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use crate::datapath::sim::SimNetwork;
    use crate::verbs::testing::rc_pair;
    use crate::{
        Access, ConnectOptions, Device, DeviceConfig, Progress, Psn, QpInit, QpType, RecvWr,
        RemoteQp, SendOp, SendWr,
    };

    /// How often the engine thread of a passive device (nobody polls its CQ) goes to sleep on
    /// its datapath while `n` SENDs arrive 1 ms apart, with `spin`.
    fn sleeps_while_receiving(x: u8, spin: Duration, n: u64) -> u64 {
        let net = SimNetwork::perfect();
        let open = |host: u8, spin: Duration| {
            Device::open(
                DeviceConfig::sim(&net, format!("10.32.{x}.{host}").parse().unwrap())
                    .progress(Progress::Thread)
                    .engine_spin(spin),
            )
            .unwrap()
        };
        let (a, b) = (open(1, Duration::ZERO), open(2, spin));
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (ca, cb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
        let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap();
        let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap();
        let ma = pa.register(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
        let mb = pb.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        let o = ConnectOptions::default();
        let remote = |d: &Device, q: &crate::QueuePair| RemoteQp {
            qpn: q.qpn(),
            psn: Psn::new(0),
            gid: d.local_gid(),
        };
        qa.connect(&remote(&b, &qb), &o).unwrap();
        qb.connect(&remote(&a, &qa), &o).unwrap();
        for id in 0..n {
            qb.post_recv(RecvWr {
                wr_id: id,
                sges: vec![mb.sge(0, 64)],
            })
            .unwrap();
        }
        // The first SEND wakes the thread whatever it does; count from there.
        qa.post_send(SendWr::new(0, SendOp::Send, vec![ma.sge(0, 64)]))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let before = b.shared().wait.thread_fd_sleeps.load(Ordering::Relaxed);
        for id in 1..n {
            qa.post_send(SendWr::new(id, SendOp::Send, vec![ma.sge(0, 64)]))
                .unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut wc = [crate::Completion::EMPTY; 64];
        let mut got = 0;
        let t = std::time::Instant::now();
        while got < n as usize {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{got} of {n} received"
            );
            got += cb.poll(&mut wc);
        }
        b.shared().wait.thread_fd_sleeps.load(Ordering::Relaxed) - before
    }

    /// An application that polls its CQ now and then and waits for a WRITE by spinning on
    /// its memory meanwhile (as `ib_write_lat` does) gets it without waiting out the
    /// step-back window: the engine thread finds the WRITE left behind and takes the
    /// descriptor back. Without that, every WRITE waited for the engine thread's next look,
    /// up to 1 ms, about half of it on average.
    #[test]
    fn writes_reach_an_application_that_polls_now_and_then_without_waiting_out_the_window() {
        const N: u32 = 40;
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 3);
        let ma = a.pd.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
        let mb =
            b.pd.register(vec![0u8; 8], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
        let (qa, ca, cb) = (&a.qp, &a.cq, &b.cq);
        let w = &b.dev.shared().wait;
        let (left0, sleeps0) = (
            w.left_behind.load(Ordering::Relaxed),
            w.thread_fd_sleeps.load(Ordering::Relaxed),
        );
        let mut wc = [crate::Completion::EMPTY; 64];
        let mut waits = Vec::new();
        for k in 1..=N {
            // b's application polls its (empty) CQ for 200 µs: the engine thread steps back.
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_micros(200) {
                assert_eq!(cb.poll(&mut wc), 0);
            }
            // Then waits on its memory for a's WRITE of `k`, polling nothing (yielding, so
            // that the engine thread gets a CPU at once when it is runnable: the time measured
            // is the transport's decision, not the scheduler's).
            ma.write(0, &u64::from(k).to_le_bytes()).unwrap();
            let t = std::time::Instant::now();
            qa.post_send(SendWr::new(
                u64::from(k),
                SendOp::RdmaWrite {
                    remote_addr: mb.addr(),
                    rkey: mb.rkey(),
                },
                vec![ma.sge(0, 8)],
            ))
            .unwrap();
            let mut v = [0u8; 8];
            loop {
                mb.read(0, &mut v).unwrap();
                if u64::from_le_bytes(v) == u64::from(k) {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "WRITE {k} never landed"
                );
                std::thread::yield_now();
            }
            waits.push(t.elapsed());
            // a's completion (its poll runs a's side; nothing else polls a).
            let t = std::time::Instant::now();
            while ca.poll(&mut wc) == 0 {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "WRITE {k} not acknowledged"
                );
            }
        }
        let left = w.left_behind.load(Ordering::Relaxed) - left0;
        let sleeps = w.thread_fd_sleeps.load(Ordering::Relaxed) - sleeps0;
        waits.sort();
        // The waits themselves depend on the machine's load (a runnable engine thread may
        // wait for a CPU for a scheduler tick); printed, not asserted. The application polled
        // within the window all along, so before this change the engine thread never went to
        // the descriptor here (0 sleeps on it; measured median wait 871 µs when idle).
        eprintln!(
            "left behind {left}, fd sleeps {sleeps}, median wait {:?}",
            waits[waits.len() / 2]
        );
        assert!(
            left >= 1,
            "the engine thread never found a WRITE left behind"
        );
        assert!(
            sleeps >= u64::from(N / 2),
            "the engine thread slept on the descriptor {sleeps} times over {N} WRITEs"
        );
    }

    /// With `engine_spin` the engine thread of a device whose application does not poll
    /// answers requests that keep coming without going to sleep between them; without it,
    /// it sleeps between every two.
    #[test]
    fn an_engine_thread_with_a_spin_stays_awake_while_requests_keep_coming() {
        const N: u64 = 40;
        let spinning = sleeps_while_receiving(1, Duration::from_secs(2), N);
        let sleeping = sleeps_while_receiving(2, Duration::ZERO, N);
        assert!(spinning <= 2, "slept {spinning} times with a spin");
        assert!(
            sleeping >= N / 2,
            "slept only {sleeping} times without a spin over {N} requests 1 ms apart"
        );
    }
}
