//! The latency path of an RC ping-pong over the `udp` backend on loopback: the ACK of the
//! message a side answers leaves *behind* the answer, in the same `sendmmsg`, as one UDP GSO
//! message (`Engine::acks_last`), and the peer still sees its send complete before the
//! answer arrives, as with a NIC (`QueuePair::drain_completions_sends_first`).
//!
//! Two devices with application-driven progress (as the latency tools run) ping-pong 64-byte
//! SENDs; a probe datapath records every batch the engine hands to the socket. Checked: the
//! data of every message, the order of each side's completions (its send's before the
//! answer's receive), that a batch holding an ACK and a request has the request first, and
//! that such batches went out as GSO messages (one packet through the kernel instead of
//! two), with no ICRC error at the receiver (the ACK's ICRC was rewritten for Identification
//! 1, the segment number the kernel gives it). Once with receivers that take the GSO message
//! whole (`UDP_GRO`), once with receivers the kernel cuts it for; and from senders without GSO,
//! which keep the ACK first.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::{UdpDatapath, UdpOptions, UdpStats};
use roce_transport::datapath::{Datapath, DatapathCaps, RxDrops, RxMeta, TxDatagram};
use roce_transport::{
    Access, Backend, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig, Progress,
    Psn, QpInit, QpType, QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcStatus,
};

/// Opcode bytes of one batch, in the order the engine handed them over.
type Batch = Vec<u8>;

/// A `udp` datapath that records the batches sent and keeps the socket's counters.
#[derive(Debug)]
struct Probe {
    inner: UdpDatapath,
    batches: Arc<Mutex<Vec<Batch>>>,
    stats: Arc<Mutex<UdpStats>>,
}

impl Datapath for Probe {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn caps(&self) -> DatapathCaps {
        self.inner.caps()
    }
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn send(&mut self, batch: &[TxDatagram<'_>]) -> std::io::Result<usize> {
        self.batches
            .lock()
            .unwrap()
            .push(batch.iter().map(|d| d.payload[0]).collect());
        let r = self.inner.send(batch);
        *self.stats.lock().unwrap() = self.inner.stats();
        r
    }
    fn plan_ipv4_idents(&mut self, batch: &[TxDatagram<'_>], idents: &mut [u16]) {
        self.inner.plan_ipv4_idents(batch, idents);
    }
    fn first_message_len(&mut self, batch: &[TxDatagram<'_>]) -> usize {
        self.inner.first_message_len(batch)
    }
    fn recv(
        &mut self,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [RxMeta],
    ) -> std::io::Result<usize> {
        let r = self.inner.recv(bufs, meta);
        *self.stats.lock().unwrap() = self.inner.stats();
        r
    }
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.readiness_fd()
    }
    fn rx_drops(&mut self) -> RxDrops {
        self.inner.rx_drops()
    }
}

struct Side {
    dev: Device,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: roce_transport::MemoryRegion,
    batches: Arc<Mutex<Vec<Batch>>>,
    stats: Arc<Mutex<UdpStats>>,
}

const SIZE: usize = 64;
const ROUNDS: usize = 200;
/// RC SEND ONLY and RC ACKNOWLEDGE.
const SEND_ONLY: u8 = 0x04;
const ACK: u8 = 0x11;

fn side(ip: &str) -> Side {
    side_with(ip, UdpOptions::default())
}

fn side_with(ip: &str, opts: UdpOptions) -> Side {
    let local = SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 4791);
    let inner = UdpDatapath::bind(local, opts).unwrap_or_else(|e| panic!("bind {local}: {e}"));
    let batches = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(Mutex::new(UdpStats::default()));
    let probe = Probe {
        inner,
        batches: batches.clone(),
        stats: stats.clone(),
    };
    let dev = Device::open(
        DeviceConfig::new(Backend::Custom(Box::new(probe)))
            .name(format!("ack-order-{ip}"))
            .progress(Progress::Manual),
    )
    .expect("open the device");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    // First half: what this side sends; second half: where the peer's messages land.
    let mr = pd
        .register_zeroed(2 * SIZE, Access::LOCAL_WRITE)
        .expect("register");
    Side {
        dev,
        cq,
        qp,
        mr,
        batches,
        stats,
    }
}

impl Side {
    fn post_recv(&self, id: u64) {
        self.qp
            .post_recv(RecvWr {
                wr_id: id,
                sges: vec![self.mr.sge(SIZE, SIZE)],
            })
            .unwrap();
    }

    fn send(&self, round: usize) {
        self.mr.write(0, &[round as u8; SIZE]).unwrap();
        self.qp
            .post_send(SendWr::new(
                round as u64,
                SendOp::Send,
                vec![self.mr.sge(0, SIZE)],
            ))
            .unwrap();
    }

    /// Busy-polls until one completion arrives; checks it is a successful send (`send`) or
    /// receive.
    fn poll(&self, send: bool) -> Completion {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wc = [Completion::EMPTY];
        loop {
            if self.cq.poll(&mut wc) == 1 {
                assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
                let is_send = wc[0].opcode == roce_transport::WcOpcode::Send;
                assert_eq!(is_send, send, "completion order: {:?}", wc[0]);
                return wc[0];
            }
            assert!(Instant::now() < deadline, "no completion within 10 s");
        }
    }

    fn check_received(&self, round: usize) {
        let mut got = [0u8; SIZE];
        self.mr.read(SIZE, &mut got).unwrap();
        assert_eq!(got, [round as u8; SIZE], "round {round}");
    }
}

#[test]
fn a_pingpong_sends_each_answer_before_the_ack_it_carries_in_one_gso_message() {
    // Addresses of our own in 127/8 so that no other test's device is in the way.
    pingpong(["127.61.0.1", "127.61.0.2"], true, true);
}

#[test]
fn the_ack_behind_an_answer_still_completes_first_when_the_kernel_cuts_the_message() {
    pingpong(["127.61.0.4", "127.61.0.5"], false, true);
}

/// A sender that cannot make one GSO message of the pair keeps the built order: the ACK
/// leaves first (two datagrams could reach the peer apart).
#[test]
fn without_gso_the_ack_leaves_before_the_answer() {
    pingpong(["127.61.0.6", "127.61.0.7"], true, false);
}

fn pingpong(ips: [&str; 2], gro: bool, gso: bool) {
    let opts = UdpOptions {
        gro,
        gso,
        ..UdpOptions::default()
    };
    let (a, b) = (side_with(ips[0], opts), side_with(ips[1], opts));
    let remote = |s: &Side| RemoteQp {
        qpn: s.qp.qpn(),
        psn: Psn::new(0),
        gid: s.dev.local_gid(),
    };
    let o = ConnectOptions::default();
    a.qp.connect(&remote(&b), &o).unwrap();
    b.qp.connect(&remote(&a), &o).unwrap();
    b.post_recv(0);
    a.post_recv(0);
    // One thread drives both sides in turn, as two ping-pong processes would. A side's
    // send completes before the message that answers it is received (one CQ per side),
    // although the ACK travelled behind the answer.
    for round in 1..=ROUNDS {
        a.send(round);
        a.post_recv(round as u64);
        if round > 1 {
            // The ACK of `b`'s previous answer came behind `a`'s SEND.
            b.poll(true);
        }
        b.poll(false);
        b.check_received(round);
        b.post_recv(round as u64);
        b.send(round);
        a.poll(true);
        a.poll(false);
        a.check_received(round);
    }
    // `a` deferred the ACK of the last answer: its next pass sends it.
    a.dev.progress();
    b.poll(true);
    for (name, s) in [("a", &a), ("b", &b)] {
        let batches = s.batches.lock().unwrap().clone();
        let mixed: Vec<&Batch> = batches
            .iter()
            .filter(|x| x.contains(&ACK) && x.contains(&SEND_ONLY))
            .collect();
        // Every round but the first has a deferred ACK to carry (`a`), every round (`b`).
        assert!(
            mixed.len() >= ROUNDS - 1,
            "{name}: {} of {} batches carry a SEND and an ACK: {batches:?}",
            mixed.len(),
            batches.len()
        );
        let order = if gso {
            [SEND_ONLY, ACK]
        } else {
            [ACK, SEND_ONLY]
        };
        for x in &mixed {
            assert_eq!(
                x.as_slice(),
                order,
                "{name}: the order of a SEND and an ACK"
            );
        }
        let st = *s.stats.lock().unwrap();
        if gso {
            assert!(
                st.gso_messages >= mixed.len() as u64,
                "{name}: {} GSO messages for {} SEND+ACK batches ({st:?})",
                st.gso_messages,
                mixed.len()
            );
        } else {
            assert_eq!(st.gso_messages, 0, "{name}: {st:?}");
        }
        let c = s.dev.device_counters();
        assert_eq!(c.rx_icrc_errors, 0, "{name}: {c:?}");
    }
    for s in [&a, &b] {
        let c = s.dev.counters();
        assert_eq!(c.retransmitted_pkts, 0, "{c:?}");
    }
}

/// A busy poll that finds nothing to receive still moves completions made outside a pass to
/// their CQ: a receive posted to a QP in the error state is flushed at once (the engine's
/// empty-poll shortcut skips timers and transmit, not completions).
#[test]
fn an_empty_busy_poll_still_delivers_a_flush_made_outside_a_pass() {
    let a = side("127.61.0.3");
    let itself = RemoteQp {
        qpn: a.qp.qpn(),
        psn: Psn::new(0),
        gid: a.dev.local_gid(),
    };
    a.qp.connect(&itself, &ConnectOptions::default()).unwrap();
    let err = roce_transport::QpAttr {
        state: roce_transport::QpState::Err,
        ..roce_transport::QpAttr::default()
    };
    a.qp.modify(&err, roce_transport::AttrMask::STATE).unwrap();
    // Anything the error state flushed so far.
    let mut wc = [Completion::EMPTY; 4];
    while a.cq.poll(&mut wc) > 0 {}
    a.post_recv(42);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if a.cq.poll(&mut wc[..1]) == 1 {
            assert_eq!((wc[0].wr_id, wc[0].status), (42, WcStatus::WrFlushErr));
            break;
        }
        assert!(Instant::now() < deadline, "the flush never reached the CQ");
    }
}
