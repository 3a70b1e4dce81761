//! A deterministic network simulator for queue pairs: a virtual clock, two endpoints, and a
//! seeded fault model per link direction (loss, burst loss, duplication, reordering,
//! corruption, delay and jitter: [`crate::fault`], the same model the transport's
//! `FaultInjector` and `sim` backend use).
//!
//! Only built with the `testing` feature: it is test infrastructure, not part of the API.
//!
//! Packets cross the simulated link as whole Ethernet/IPv4/UDP frames with a real ICRC, built
//! and parsed by `roce-wire`, so corruption is caught exactly where a real receiver catches it.
//! Everything is a pure function of the [`PairConfig`] (including its seed): a failing run is
//! replayed by running the same config again.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;

use roce_mr::{Access, Key, MrTable, Pd};
use roce_wire::frame::{EthRepr, IpRepr, Ipv4Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::{icrc, Caps, Frame, FrameRepr, Gid, LKey, Psn, QKey, Qpn, RKey};

use crate::fault::{FaultModel, SimRng};
use crate::mem::Mem;
use crate::qp::{QpConfig, QueuePair, RecvMeta};
use crate::state::{bring_up_steps, QpAttr};
use crate::time::Instant;
use crate::verbs::{AddressHandle, Completion, CqSide, Mtu, QpState, QpType, SendOp, SendWr, Sge};

pub use crate::fault::LinkConfig;

/// Configuration of a two-node simulation.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    /// QP type of both ends.
    pub qp_type: QpType,
    /// Seed of everything random.
    pub seed: u64,
    /// Path MTU.
    pub mtu: Mtu,
    /// Link A -> B.
    pub a_to_b: LinkConfig,
    /// Link B -> A.
    pub b_to_a: LinkConfig,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// RNR timer code of the responders.
    pub min_rnr_timer: u8,
    /// READ/atomic depth.
    pub rd_atomic: u8,
    /// Remote access both QPs allow.
    pub access: Access,
    /// QP capacities.
    pub qp: QpConfig,
    /// Give B a shared receive queue of this depth instead of its own receive queue.
    pub b_srq: Option<usize>,
}

impl PairConfig {
    /// A perfect network, MTU 1024, timeout 10 (4 ms), 7 retries, infinite RNR retries.
    pub fn new(qp_type: QpType, seed: u64) -> Self {
        Self {
            qp_type,
            seed,
            mtu: Mtu::Mtu1024,
            a_to_b: LinkConfig::perfect(),
            b_to_a: LinkConfig::perfect(),
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            qp: QpConfig::new(qp_type),
            b_srq: None,
        }
    }
    /// The same faults on both directions.
    #[must_use]
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.a_to_b = link;
        self.b_to_a = link;
        self
    }
}

/// A registered region of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The key (lkey = rkey).
    pub key: Key,
    /// The IOVA the region starts at.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

impl Region {
    /// An SGE over `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: LKey::new(self.key.0),
        }
    }
    /// The rkey.
    pub fn rkey(&self) -> RKey {
        RKey::new(self.key.0)
    }
}

/// One endpoint: a device's key table, a PD, a QP and its two completion queues.
#[derive(Debug)]
pub struct Node {
    /// The QP.
    pub qp: QueuePair,
    /// The device's key table.
    pub table: Arc<MrTable>,
    /// The QP's protection domain.
    pub pd: Pd,
    /// The node's GID (IPv4-mapped).
    pub gid: Gid,
    /// Send completions collected so far.
    pub send_cq: Vec<Completion>,
    /// Receive completions collected so far.
    pub recv_cq: Vec<Completion>,
    /// The shared receive queue, if the node's QP uses one.
    pub srq: Option<Arc<crate::cq::SharedReceiveQueue>>,
    next_iova: u64,
}

impl Node {
    fn new(qpn: u32, ip: Ipv4Addr, cfg: &PairConfig, srq_depth: Option<usize>) -> Self {
        let table = Arc::new(MrTable::new(1024, cfg.seed ^ u64::from(qpn)));
        let pd = table.alloc_pd();
        let srq = srq_depth.map(|d| Arc::new(crate::cq::SharedReceiveQueue::new(d)));
        let qp = QueuePair::new(
            Qpn::new(qpn),
            cfg.qp,
            Mem::new(table.clone(), pd),
            srq.clone(),
        );
        Self {
            qp,
            table,
            pd,
            gid: Gid::from(ip),
            send_cq: Vec::new(),
            recv_cq: Vec::new(),
            srq,
            next_iova: 0x10_0000,
        }
    }

    /// Registers a copy of `data` with every access right, at a fresh IOVA.
    pub fn register(&mut self, data: &[u8]) -> Region {
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        self.register_with(data, access)
    }

    /// Registers a copy of `data` with `access`.
    ///
    /// # Panics
    /// If the table refuses (full table or inconsistent rights): a test setup error.
    pub fn register_with(&mut self, data: &[u8], access: Access) -> Region {
        let addr = self.next_iova;
        self.next_iova += (data.len() as u64 + 0xFFF) & !0xFFF;
        self.next_iova += 0x1000;
        let key = self
            .table
            .register(self.pd, data.to_vec().into_boxed_slice(), addr, access)
            .expect("register");
        Region {
            key,
            addr,
            len: data.len() as u64,
        }
    }

    /// The current bytes of a region.
    ///
    /// # Panics
    /// If the region is gone (test setup error).
    pub fn read(&self, r: &Region) -> Vec<u8> {
        let mut out = vec![0u8; r.len as usize];
        self.table.read(r.key, 0, &mut out).expect("read region");
        out
    }

    /// Takes the send completions collected so far.
    pub fn send_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.send_cq)
    }

    /// Takes the receive completions collected so far.
    pub fn recv_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.recv_cq)
    }

    fn drain_completions(&mut self) {
        while let Some((side, c)) = self.qp.poll_completion() {
            match side {
                CqSide::Send => self.send_cq.push(c),
                CqSide::Recv => self.recv_cq.push(c),
            }
        }
    }
}

/// One packet offered to a link, as the trace records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// When it was offered to the link.
    pub at: Instant,
    /// 0 = A to B, 1 = B to A.
    pub dir: usize,
    /// Opcode.
    pub opcode: roce_wire::Opcode,
    /// PSN.
    pub psn: Psn,
    /// AETH syndrome, if any.
    pub syndrome: Option<roce_wire::aeth::Syndrome>,
    /// AETH MSN, if any.
    pub msn: Option<roce_wire::Msn>,
    /// Whether the drop filter removed it.
    pub filtered: bool,
    /// Copies that arrive intact: 0 if it was lost, corrupted (the receiver's ICRC check drops
    /// it) or filtered; 2 if it was duplicated.
    pub intact: u8,
}

/// Decides whether to drop a packet (by its parsed form) before the link's own faults.
pub type DropFilter = Box<dyn FnMut(&roce_wire::PacketRepr<'_>) -> bool + Send>;

struct Link {
    filter: Option<DropFilter>,
    faults: FaultModel,
    in_flight: VecDeque<(Instant, u64, Vec<u8>)>,
    seq: u64,
    stats: LinkStats,
}

/// What a link did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered.
    pub sent: u64,
    /// Frames lost.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// Frames delivered (including copies).
    pub delivered: u64,
    /// Frames the receiver rejected (bad ICRC after corruption).
    pub rejected: u64,
}

impl Link {
    fn new(cfg: LinkConfig, seed: u64) -> Self {
        Self {
            filter: None,
            faults: FaultModel::new(cfg, seed),
            in_flight: VecDeque::new(),
            seq: 0,
            stats: LinkStats::default(),
        }
    }

    /// Offers a frame (Ethernet, no VLAN) whose UDP payload (what the fault model sees and may
    /// corrupt) starts at `payload_off`. Returns how many copies will arrive intact: 0 if it
    /// was lost or every copy corrupted (a flipped bit fails the receiver's ICRC check, except
    /// in the BTH's reserved byte the ICRC masks, which the receiver ignores: such a copy
    /// counts as intact).
    fn offer(&mut self, now: Instant, frame: Vec<u8>, payload_off: usize) -> u8 {
        self.stats.sent += 1;
        let verdict = self
            .faults
            .offer_at(frame.len() - payload_off, now.as_nanos());
        if verdict.is_lost() {
            self.stats.lost += 1;
            return 0;
        }
        let mut intact = 0;
        for copy in verdict.copies() {
            let mut f = frame.clone();
            copy.apply(&mut f[payload_off..]);
            if copy.corrupt.is_some() {
                self.stats.corrupted += 1;
            }
            if copy.corrupt.is_none() || icrc::verify(&f[14..]) {
                intact += 1;
            }
            let at = Instant::from_nanos(now.as_nanos() + copy.delay_ns);
            self.seq += 1;
            // Keep the queue sorted by delivery time, FIFO among equals.
            let pos = self
                .in_flight
                .iter()
                .position(|(t, _, _)| *t > at)
                .unwrap_or(self.in_flight.len());
            self.in_flight.insert(pos, (at, self.seq, f));
        }
        self.stats.duplicated += verdict.copies().count() as u64 - 1;
        intact
    }

    fn next_due(&self) -> Option<Instant> {
        self.in_flight.front().map(|(t, _, _)| *t)
    }
}

impl core::fmt::Debug for Link {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Link")
            .field("cfg", &self.faults.config())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Two connected QPs over a simulated network.
#[derive(Debug)]
pub struct Pair {
    /// Endpoint A (10.0.0.1, QPN 0x11).
    pub a: Node,
    /// Endpoint B (10.0.0.2, QPN 0x12).
    pub b: Node,
    /// The virtual clock.
    pub now: Instant,
    /// The configuration (its seed replays the run).
    pub cfg: PairConfig,
    /// Every packet offered to either link, in order.
    pub trace: Vec<TraceEntry>,
    links: [Link; 2],
    buf: Vec<u8>,
}

const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

impl Pair {
    /// Creates both nodes and brings both QPs to RTS (RC/UC connected to each other).
    ///
    /// # Panics
    /// If a modify fails (a bug in the state table).
    pub fn new(cfg: PairConfig) -> Self {
        let mut rng = SimRng::new(cfg.seed);
        let mut a = Node::new(0x11, IP_A, &cfg, None);
        let mut b = Node::new(0x12, IP_B, &cfg, cfg.b_srq);
        let psn_a = Psn::new(rng.next_u64() as u32);
        let psn_b = Psn::new(rng.next_u64() as u32);
        connect(&mut a.qp, &cfg, b.gid, Qpn::new(0x12), psn_b, psn_a);
        connect(&mut b.qp, &cfg, a.gid, Qpn::new(0x11), psn_a, psn_b);
        let links = [
            Link::new(cfg.a_to_b, rng.next_u64()),
            Link::new(cfg.b_to_a, rng.next_u64()),
        ];
        Self {
            a,
            b,
            now: Instant::ZERO,
            cfg,
            trace: Vec::new(),
            links,
            buf: vec![0u8; 4096 + 128],
        }
    }

    /// Registers a `len`-byte source at A and an `n * len`-byte destination at B, and posts
    /// `n` RDMA WRITEs (wr_id `0..n`) of the whole source into consecutive slices of it.
    ///
    /// # Panics
    /// If a post fails (a send queue smaller than `n`: a test setup error).
    pub fn post_writes(&mut self, n: u64, len: u32) {
        let src = self.a.register(&vec![0x5a; len as usize]);
        let dst = self.b.register(&vec![0u8; len as usize * n as usize]);
        for i in 0..n {
            let wr = SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr + u64::from(len) * i,
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, len)],
            );
            self.a.qp.post_send(self.now, wr).expect("post_send");
        }
    }

    /// Link statistics, A -> B and B -> A.
    pub fn link_stats(&self) -> [LinkStats; 2] {
        [self.links[0].stats, self.links[1].stats]
    }

    /// Drops every packet of direction `dir` (0 = A to B) for which `filter` returns true.
    pub fn drop_matching(&mut self, dir: usize, filter: DropFilter) {
        self.links[dir].filter = Some(filter);
    }

    /// Removes the drop filter of direction `dir`.
    pub fn clear_filter(&mut self, dir: usize) {
        self.links[dir].filter = None;
    }

    /// The trace entries of direction `dir` that were not filtered.
    pub fn sent(&self, dir: usize) -> Vec<TraceEntry> {
        self.trace
            .iter()
            .filter(|t| t.dir == dir && !t.filtered)
            .copied()
            .collect()
    }

    /// Replaces the faults of both links from now on.
    pub fn set_links(&mut self, a_to_b: LinkConfig, b_to_a: LinkConfig) {
        self.links[0].faults.set_config(a_to_b);
        self.links[1].faults.set_config(b_to_a);
    }

    /// The Ethernet/IPv4/UDP frame of a datagram, and where its UDP payload starts.
    fn frame_for(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, udp_payload: &[u8]) -> (Vec<u8>, usize) {
        let repr = FrameRepr {
            eth: Some(EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan: None,
            }),
            ip: IpRepr::V4(Ipv4Repr {
                src,
                dst,
                tos: 2,
                ident: 0,
                dont_fragment: true,
                ttl: 64,
            }),
            udp: UdpRepr {
                src_port: sport,
                dst_port: ROCEV2_PORT,
                checksum: 0,
            },
        };
        let hl = repr.header_len();
        let mut f = vec![0u8; hl + udp_payload.len()];
        repr.emit_headers(udp_payload.len(), &mut f[..hl]);
        f[hl..].copy_from_slice(udp_payload);
        if let Some(crc) = icrc::compute(&f[14..]) {
            let n = f.len();
            f[n - 4..].copy_from_slice(&crc);
        }
        (f, hl)
    }

    /// One round: every node transmits all it can, due packets are delivered, due timers fire.
    /// Returns whether anything happened.
    pub fn step(&mut self) -> bool {
        let mut progress = false;
        let now = self.now;
        for (i, node) in [&mut self.a, &mut self.b].into_iter().enumerate() {
            let (src, dst) = if i == 0 { (IP_A, IP_B) } else { (IP_B, IP_A) };
            let mut budget = 256;
            while budget > 0 {
                budget -= 1;
                let Some(t) = node.qp.poll_transmit(now, &mut self.buf) else {
                    break;
                };
                let bytes = &self.buf[..t.len];
                let mut filtered = false;
                let traced = if let Ok(p) = roce_wire::PacketRepr::parse(bytes) {
                    if let Some(f) = self.links[i].filter.as_mut() {
                        filtered = f(&p);
                    }
                    self.trace.push(TraceEntry {
                        at: now,
                        dir: i,
                        opcode: p.bth.opcode,
                        psn: p.bth.psn,
                        syndrome: p.ext.aeth.map(|a| a.syndrome),
                        msn: p.ext.aeth.map(|a| a.msn),
                        filtered,
                        intact: 0,
                    });
                    true
                } else {
                    false
                };
                if !filtered {
                    let (frame, payload_off) = Self::frame_for(src, dst, t.udp_sport, bytes);
                    let intact = self.links[i].offer(now, frame, payload_off);
                    if let Some(e) = self.trace.last_mut().filter(|_| traced) {
                        e.intact = intact;
                    }
                }
                progress = true;
            }
            node.drain_completions();
        }
        for i in 0..2 {
            while self.links[i].next_due().is_some_and(|t| t <= now) {
                // INVARIANT: next_due returned Some.
                let (_, _, frame) = self.links[i].in_flight.pop_front().expect("due frame");
                let (ga, gb) = (self.a.gid, self.b.gid);
                let (rx, tx_gid, rx_gid) = if i == 0 {
                    (&mut self.b, ga, gb)
                } else {
                    (&mut self.a, gb, ga)
                };
                match Frame::parse_ethernet(&frame, &Caps::default()).and_then(|f| f.packet()) {
                    Ok(p) => {
                        self.links[i].stats.delivered += 1;
                        rx.qp.handle_packet(now, &p, &RecvMeta::new(tx_gid, rx_gid));
                    }
                    Err(_) => self.links[i].stats.rejected += 1,
                }
                rx.drain_completions();
                progress = true;
            }
        }
        for node in [&mut self.a, &mut self.b] {
            if node.qp.poll_timeout().is_some_and(|t| t <= now) {
                node.qp.handle_timeout(now);
                node.drain_completions();
                progress = true;
            }
        }
        progress
    }

    /// The next instant something is due (a delivery or a timer).
    pub fn next_event(&self) -> Option<Instant> {
        [
            self.links[0].next_due(),
            self.links[1].next_due(),
            self.a.qp.poll_timeout(),
            self.b.qp.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs until nothing is in flight and no timer is armed, or `max_steps` rounds passed.
    /// Returns true if the network went quiet.
    pub fn drive_bounded(&mut self, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if self.step() {
                continue;
            }
            match self.next_event() {
                Some(t) => self.now = self.now.max(t),
                None => return true,
            }
        }
        false
    }
}

/// Brings a QP from RESET to RTS with the pair's attributes.
fn connect(qp: &mut QueuePair, cfg: &PairConfig, dgid: Gid, dest: Qpn, rq_psn: Psn, sq_psn: Psn) {
    let ud = cfg.qp_type == QpType::Ud;
    let attr = QpAttr {
        state: QpState::Init,
        access_flags: cfg.access,
        qkey: QKey::new(0x1111_1111),
        ah: AddressHandle::new(dgid),
        path_mtu: cfg.mtu,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        rq_psn,
        max_rd_atomic: cfg.rd_atomic,
        min_rnr_timer: cfg.min_rnr_timer,
        sq_psn,
        max_dest_rd_atomic: cfg.rd_atomic,
        dest_qpn: dest,
        ..QpAttr::default()
    };
    for (state, mask) in bring_up_steps(cfg.qp_type, QpState::Rts) {
        qp.modify(&QpAttr { state, ..attr }, mask)
            .unwrap_or_else(|e| panic!("to {state:?}: {e}"));
    }
    if ud {
        // UD's path MTU comes from the port; the simulator uses the pair's.
        qp.set_port_mtu(cfg.mtu);
    }
}
