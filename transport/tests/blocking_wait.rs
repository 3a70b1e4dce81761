//! Blocking waits over real `udp` sockets: thousands of SEND ping-pongs between two devices
//! on loopback (127.31.7.1 and 127.31.7.2, port 4791, no privileges), both sides blocked in
//! `CompletionQueue::wait` (which runs the engine in the waiting thread, `device/wait.rs`) or
//! in `get_event` between messages. A lost wake-up sleeps out a wait (5 s) or an ACK timeout;
//! the bound on the slowest wait catches it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce_transport::{
    Access, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion,
    Progress, Psn, QpInit, QpType, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcOpcode, WcStatus,
};

/// The tests bind the same two addresses.
static PORTS: Mutex<()> = Mutex::new(());

struct Side {
    dev: Device,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

/// A connected RC pair on 127.31.7.1 and 127.31.7.2 with `progress`.
fn pair(progress: Progress) -> (Side, Side) {
    let side = |ip: &str| {
        let cfg = DeviceConfig::udp(ip.parse().unwrap())
            .name(ip)
            .progress(progress);
        let dev = Device::open(cfg).unwrap_or_else(|e| panic!("open {ip}: {e}"));
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(256).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let mr = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        Side { dev, cq, qp, mr }
    };
    let (a, b) = (side("127.31.7.1"), side("127.31.7.2"));
    let remote = |s: &Side| RemoteQp {
        qpn: s.qp.qpn(),
        psn: Psn::new(0),
        gid: s.dev.local_gid(),
    };
    let o = ConnectOptions::default();
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

/// How a side blocks between messages.
#[derive(Clone, Copy, Debug)]
enum Block {
    /// `CompletionQueue::wait`.
    Wait,
    /// `req_notify` + `get_event`, then `poll` (rc_pingpong `-e`).
    Channel,
}

/// Up to `wc.len()` completions, blocking as `how` says; 0 after 5 s with none.
fn next(s: &Side, wc: &mut [Completion], how: Block) -> usize {
    match how {
        Block::Wait => s.cq.wait(wc, Duration::from_secs(5)),
        Block::Channel => {
            // Armed, then polled: a completion that came before the arming is taken here
            // (verbs' rule), so the event is awaited only when the CQ was empty. An event may
            // be stale (fired for a completion an earlier poll took): then round again.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                s.cq.req_notify(false);
                let n = s.cq.poll(wc);
                if n > 0 {
                    return n;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !s.cq.get_event(left) {
                    return 0;
                }
                let n = s.cq.poll(wc);
                if n > 0 {
                    return n;
                }
            }
        }
    }
}

/// One side: the initiator sends message `i` and waits for the answer; the responder waits
/// for message `i` and answers it. Returns the slowest blocking call.
fn run(s: &Side, n: u64, initiator: bool, how: Block) -> Duration {
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
            let k = next(s, &mut wc, how);
            slowest = slowest.max(t.elapsed());
            assert!(k > 0, "{how:?}: message {i}: nothing within 5 s");
            take(&wc[..k], &mut sends, &mut recvs);
        }
        if !initiator {
            send(s, i);
        }
    }
    while sends < n {
        let k = next(s, &mut wc, how);
        assert!(k > 0, "{how:?}: {sends} of {n} send completions");
        take(&wc[..k], &mut sends, &mut recvs);
    }
    slowest
}

fn ping_pong(progress: Progress, how: Block, n: u64) {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b) = pair(progress);
    post_recv(&a, 0);
    post_recv(&b, 0);
    let t = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    // With manual progress a side that is done goes on driving its device until the other
    // is: it may owe the other side an ACK.
    let side = move |s: Side, initiator: bool, done: Arc<AtomicUsize>| {
        let slowest = run(&s, n, initiator, how);
        done.fetch_add(1, Ordering::SeqCst);
        while done.load(Ordering::SeqCst) < 2 {
            s.dev.progress_wait(Duration::from_millis(1));
        }
        slowest
    };
    let d = done.clone();
    let responder = std::thread::spawn(move || side(b, false, d));
    let slow_a = side(a, true, done);
    let slow_b = responder.join().unwrap();
    let took = t.elapsed();
    eprintln!("{progress:?} {how:?}: {n} round trips in {took:?}, slowest {slow_a:?} {slow_b:?}");
    // A lost wake-up costs the 5 s wait or an ACK timeout (about 67 ms, then a retry).
    assert!(
        slow_a.max(slow_b) < Duration::from_secs(2),
        "{progress:?} {how:?}"
    );
    assert!(
        took < Duration::from_secs(60),
        "{progress:?} {how:?}: {took:?}"
    );
}

#[test]
fn blocking_ping_pong_over_loopback_udp_with_engine_threads() {
    ping_pong(Progress::Thread, Block::Wait, 4000);
}

#[test]
fn blocking_ping_pong_over_loopback_udp_with_manual_progress() {
    ping_pong(Progress::Manual, Block::Wait, 2000);
}

#[test]
fn completion_channel_ping_pong_over_loopback_udp() {
    ping_pong(Progress::Thread, Block::Channel, 2000);
    ping_pong(Progress::Manual, Block::Channel, 1000);
}
