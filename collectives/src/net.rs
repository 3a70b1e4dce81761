//! The data path: RC queue pairs to every peer, registered receive slots, the
//! receiver-driven protocol and the executor that runs a schedule of transfers over them.
//!
//! ## Protocol (as NCCL's net_ib, with credits instead of a polled FIFO)
//!
//! Between two ranks each direction is an ordered stream of chunks numbered `seq = 0, 1, …`
//! for the communicator's life. The receiver owns `slots` receive slots of `chunk` bytes for
//! that sender (a registered region it told the sender about at bootstrap); chunk `seq`
//! always goes to slot `seq % slots` over QP `seq % qps`. A sender may write chunk `seq`
//! only once it holds a clear-to-send credit for it: the first `slots` are granted by the
//! bootstrap, every later one by a CTS message the receiver sends (a zero-length SEND with
//! immediate `{CTS, slot}`) after it has consumed — copied or reduced out of the slot — the
//! chunk that occupied that slot. So no chunk is ever written into a slot its receiver has
//! not released. The data goes as one RDMA WRITE WITH IMMEDIATE into the slot whose
//! immediate carries `{DATA, slot, length}`; its receive completion tells the receiver the
//! slot is full. A chunk of more than [`SPLIT_AFTER_PACKETS`] packets whose last packet is full
//! goes as a plain WRITE followed by a zero-length WRITE WITH IMMEDIATE, posted together
//! (fewer UDP GSO messages, [`split_pays`]; the receiver, which takes the length from the
//! immediate, sees no difference).
//!
//! Credits also ride on data: every chunk's immediate carries the slots its sender has
//! consumed from the receiver since it last granted any (up to 63), so traffic in both
//! directions (a ring at 2 ranks, recursive doubling's exchanges) needs no CTS messages at
//! all, and with them no extra packets and no extra wake-ups of the peer. A CTS goes only
//! when half the slots are held back and nothing is about to leave for that peer, or
//! before this rank waits while the peer may be out of credits.
//!
//! Immediate layout: bits 31–30 the kind (0 data, 1 CTS, 2 FIN), 23 the last chunk of a
//! message, 21–0 the length (a CTS: the credits it grants); a data chunk's bits 29–24 carry
//! the credits granted with it. A chunk's slot is not in it: chunks arrive in order on each
//! QP (RC), so the receiver counts them (chunk `seq` is the `seq / qps`-th on QP `seq % qps`).
//!
//! ## Closing
//!
//! A rank that drops its communicator has finished every operation, but the RC transport
//! may still be recovering its last packets (a lost chunk waits out an ACK timeout), and its
//! peers may still be recovering theirs to it. Tearing the QPs down then would cut a peer off
//! from the data it still waits for, or make the peer's retransmissions fail as if this rank
//! had died. So closing is a handshake ([`Net::close`]): the rank posts a signalled FIN (a
//! zero-length SEND WITH IMMEDIATE) on every QP after everything else, and keeps its QPs
//! until each FIN is acknowledged — RC delivers in order, so that ACK means the peer has
//! every chunk and credit this rank ever sent on that QP — or has failed (a dead peer's QP
//! errs after its retries, about half a second), or has closed too (its own FINs came: it
//! has finished and needs nothing more), bounded by the communicator's timeout. A
//! peer that takes a FIN on every QP marks this rank closed: it has finished all its
//! operations and needs nothing more, so errors on the QPs to it afterwards (its QPs are
//! gone; the peer's own last retransmissions to it fail) are not failures, and an operation
//! still waiting for data from it fails at once (mismatched operations) rather than at its
//! timeout.
//!
//! ## Executor
//!
//! A collective is a list of phases; a transfer phase is a set of sends and receives (each a
//! region of one of the operation's buffers) with chunk-level dependencies: a send's chunk
//! leaves once the receives it depends on have applied the bytes it covers (so a ring
//! forwards each chunk as soon as it is reduced: the pipeline), and a receive's chunk is
//! applied only after the sends listed as reading the same bytes have taken them (no
//! write-after-read hazard). Sends and receives of one peer are streamed in list order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use roce_transport::{
    Access, Completion, CompletionQueue, ConnectOptions, Device, Gid, MemoryRegion,
    ProtectionDomain, Psn, QpConfig, QpInit, QpType, Qpn, QueuePair, RKey, RecvWr, RemoteQp,
    SendData, SendOp, SendWr, Sge, VerbsError, WcOpcode, WcStatus,
};

use crate::codec::{Dec, Enc, Short};
use crate::dtype::{DataType, ReduceOp};
use crate::error::CollError;
use crate::pinned::{LentMut, SlotMem};
use crate::reduce::{reduce_into, reduce_many};
use crate::status::Status;

const KIND_DATA: u32 = 0;
const KIND_CTS: u32 = 1;
/// The closing notice: a zero-length SEND WITH IMMEDIATE on every QP, after the last data
/// (see [`Net::close`]).
const KIND_FIN: u32 = 2;
/// wr_id flag of the data WRITEs (the low bits carry the chunk's sequence number). Chunks
/// sent from the caller's memory in place are signalled (their bytes may be overwritten
/// only once they completed); inline ones are not. Errors complete whatever the flag.
const WR_DATA: u64 = 1 << 63;
/// Chunks of at least this many bytes are sent from the operation's buffer in place (one
/// WRITE with a scatter/gather entry into the buffer, registered for the phase), smaller ones
/// inline (copied into the work request: no registration, no wait for their completion).
const ZERO_COPY_MIN: usize = 16 << 10;
/// A chunk of more than this many packets whose last packet is full may go as a plain RDMA
/// WRITE followed by a zero-length WRITE WITH IMMEDIATE carrying its immediate, posted
/// together ([`split_pays`]).
const SPLIT_AFTER_PACKETS: usize = 3;

/// Whether a chunk of `len` bytes leaves in fewer UDP GSO messages as a plain WRITE plus a
/// zero-length WRITE WITH IMMEDIATE than as one WRITE WITH IMMEDIATE, at path MTU `pmtu`.
///
/// One GSO message takes datagrams of one size and a shorter last one. A multi-packet
/// WRITE's first packet is 16 bytes longer than its middle ones (the RETH), so it leaves
/// with at most one middle packet behind it; the middles then go together (up to 64), and
/// a last packet with an immediate joins them only if it is no longer than they are: its
/// payload, padded to 4 bytes, plus the 4-byte immediate within `pmtu`. So WRITE WITH
/// IMMEDIATE of n ≥ 4 packets whose last payload pads to more than `pmtu − 4` leaves as
/// first two | middles | last; split, the plain last packet is as long as a middle one and
/// the 36-byte immediate ends their message: first two | middles, last, immediate. (With a
/// shorter last packet the single WRITE is already two messages and a split would make it
/// three.) Each message is a pass through the kernel's UDP send path and, over a veth, the
/// peer's whole receive path.
fn split_pays(len: usize, pmtu: usize) -> bool {
    if pmtu == 0 || len <= SPLIT_AFTER_PACKETS * pmtu {
        return false;
    }
    let last = len - (len.div_ceil(pmtu) - 1) * pmtu;
    last + 4 > pmtu
}
/// wr_id flag of the closing notices; the low bits carry the peer.
const WR_FIN: u64 = 1 << 62;

/// The ACK timeout exponent of every QP: 4.096 µs · 2^14 ≈ 67 ms per try, 8 tries: a QP with
/// traffic to a dead peer errs in about half a second (the default 14/7 of verbs is the
/// same per try; NCCL's 20 would take 35 s).
pub(crate) const QP_TIMEOUT: u8 = 14;
/// Transport retries before a QP errs.
pub(crate) const QP_RETRY: u8 = 7;

/// Bit 23 of a data immediate: the last chunk of a message.
const LAST: u32 = 1 << 23;
/// The most credits a data chunk carries (bits 29–24 of its immediate).
const MAX_PIGGYBACK: usize = 0x3f;

/// An immediate: `mid` is a data chunk's piggybacked credits (0 otherwise).
fn imm(kind: u32, mid: usize, len: usize) -> u32 {
    (kind << 30) | ((mid as u32 & 0x3f) << 24) | (len as u32 & 0x3f_ffff)
}

fn unimm(v: u32) -> (u32, usize, usize) {
    (
        v >> 30,
        ((v >> 24) & 0x3f) as usize,
        (v & 0x3f_ffff) as usize,
    )
}

/// The buffer index of an out-of-place operation's source (the caller's send buffer, read
/// only: sends read it, [`Apply::ReduceFromSource`] folds it in; nothing writes it).
pub(crate) const SRC: usize = usize::MAX;

/// A region of one of an operation's buffers (0: the caller's; others: temporaries;
/// [`SRC`]: the read-only source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) buf: usize,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Region {
    pub(crate) const fn new(buf: usize, off: usize, len: usize) -> Self {
        Self { buf, off, len }
    }
    fn end(&self) -> usize {
        self.off + self.len
    }
}

/// What a receive does with each chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Apply {
    /// `dst = incoming`.
    Copy,
    /// `dst = dst op incoming`.
    Reduce,
    /// `dst = incoming op dst` (the peer's contribution goes first: a canonical order).
    ReduceIncomingFirst,
    /// `dst = source op incoming`, the source being the same bytes of the [`SRC`] buffer
    /// (an out-of-place operation's first touch of `dst`: no copy of the source first).
    ReduceFromSource,
}

/// One send of a transfer phase.
#[derive(Clone, Debug)]
pub(crate) struct SendX {
    pub(crate) peer: usize,
    pub(crate) src: Region,
    /// Receives (indices in the phase) whose bytes this send forwards.
    pub(crate) deps: Vec<usize>,
}

/// One receive of a transfer phase.
#[derive(Clone, Debug)]
pub(crate) struct RecvX {
    pub(crate) peer: usize,
    pub(crate) dst: Region,
    pub(crate) apply: Apply,
    /// Receives that must have applied the same bytes first (a fixed reduction order).
    pub(crate) deps: Vec<usize>,
    /// Sends that read the bytes this receive overwrites: they must take them first.
    pub(crate) after: Vec<usize>,
}

/// A transfer phase.
#[derive(Clone, Debug, Default)]
pub(crate) struct Xfer {
    pub(crate) sends: Vec<SendX>,
    pub(crate) recvs: Vec<RecvX>,
}

impl Xfer {
    pub(crate) fn send(&mut self, peer: usize, src: Region, deps: Vec<usize>) -> usize {
        self.sends.push(SendX { peer, src, deps });
        self.sends.len() - 1
    }
    pub(crate) fn recv(
        &mut self,
        peer: usize,
        dst: Region,
        apply: Apply,
        deps: Vec<usize>,
        after: Vec<usize>,
    ) -> usize {
        self.recvs.push(RecvX {
            peer,
            dst,
            apply,
            deps,
            after,
        });
        self.recvs.len() - 1
    }
}

/// What this rank tells peer `p` about the connection to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub(crate) qps: Vec<(u32, u32)>,
    pub(crate) slots_addr: u64,
    pub(crate) slots_rkey: u32,
}

impl PeerInfo {
    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u32(self.qps.len() as u32);
        for (q, p) in &self.qps {
            e.u32(*q).u32(*p);
        }
        e.u64(self.slots_addr).u32(self.slots_rkey);
    }
    pub(crate) fn decode(d: &mut Dec<'_>) -> Result<Self, Short> {
        let n = d.u32()? as usize;
        if n > crate::options::MAX_QPS {
            return Err(Short);
        }
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            qps.push((d.u32()?, d.u32()?));
        }
        Ok(Self {
            qps,
            slots_addr: d.u64()?,
            slots_rkey: d.u32()?,
        })
    }
}

struct Peer {
    qps: Vec<QueuePair>,
    psns: Vec<u32>,
    /// The receive slots (`slots × chunk` bytes), read in place.
    rx: SlotMem,
    /// Per QP: every signalled data WRITE on it with a sequence number below this has
    /// completed (a QP completes in order).
    qp_done: Vec<u64>,
    remote_addr: u64,
    remote_rkey: RKey,
    tx_seq: u64,
    tx_limit: u64,
    rx_seq: u64,
    /// Per slot: the length of the chunk in it and whether it ends its message.
    rx_len: Vec<Option<(usize, bool)>>,
    /// Per QP: the sequence number of the next chunk to arrive on it.
    rx_next: Vec<u64>,
    /// Slots consumed but not yet granted back (credits are returned in batches).
    cts_pending: usize,
    /// FINs taken from this peer (one per QP: it has closed once all came).
    fin_rx: usize,
    /// Our FINs to this peer not completed yet.
    fin_tx: usize,
    /// The path MTU of the QPs to this peer, bytes (set when they connect).
    pmtu: usize,
}

impl Peer {
    /// Whether the peer has closed: a FIN came on every QP, after all its data.
    fn closed(&self) -> bool {
        self.fin_rx >= self.qps.len()
    }
}

/// One of an operation's buffers during a phase: written by it, or only read (and then
/// possibly lent to the transport read-only), or written and also sent from in place
/// (registered for the phase: [`LentMut`]).
enum View<'a> {
    Mut(&'a mut [u8]),
    Ro(&'a [u8]),
    Lent(LentMut<'a>),
}

impl View<'_> {
    fn get(&self) -> &[u8] {
        match self {
            View::Mut(b) => b,
            View::Ro(b) => b,
            View::Lent(l) => l.bytes(),
        }
    }
}

/// Lends each of `bufs` read-only to the transport (nested scopes of
/// [`ProtectionDomain::with_borrowed_ref`]) and runs `f` with their regions, in order
/// (`prefix` first): deregistered, and so out of the transport's reach, when this returns.
fn with_lent<R>(
    pd: &ProtectionDomain,
    bufs: &[&[u8]],
    prefix: &[&MemoryRegion],
    f: &mut dyn FnMut(&[&MemoryRegion]) -> R,
) -> Result<R, VerbsError> {
    match bufs.split_first() {
        None => Ok(f(prefix)),
        Some((first, rest)) => pd.with_borrowed_ref(first, Access::empty(), |mr| {
            let mut all = prefix.to_vec();
            all.push(mr);
            with_lent(pd, rest, &all, f)
        })?,
    }
}

/// Data-path settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NetConfig {
    pub(crate) chunk: usize,
    pub(crate) slots: usize,
    pub(crate) qps: usize,
    /// How long a wait polls before it blocks (resolved from [`crate::Spin`] at set-up;
    /// [`Duration::MAX`] with [`crate::CommOptions::busy_poll`]: it never blocks).
    pub(crate) spin: Duration,
}

/// How [`Net::poll_and_handle`] looks for completions.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// Take what is queued, if anything.
    Poll,
    /// Poll once (a CQ poll that finds nothing runs an engine pass itself).
    Spin,
    /// Block on the CQ up to this long.
    Block(Duration),
}

/// A communicator's connections and executor.
pub(crate) struct Net {
    rank: usize,
    cfg: NetConfig,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    peers: Vec<Option<Peer>>,
    qpn_peer: HashMap<u32, usize>,
    scratch: Vec<u8>,
    wc: Vec<Completion>,
    status: Arc<Status>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("rank", &self.rank)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn overlap_done(a: usize, b: usize, r: Region, done_bytes: usize, all_done: bool) -> bool {
    if all_done {
        return true;
    }
    if a == b {
        return false;
    }
    if b <= r.off || a >= r.end() {
        return true;
    }
    r.off + done_bytes >= b.min(r.end())
}

impl Net {
    /// Creates the QPs and receive slots for `peers` (global ranks; `None` entries are
    /// not connected: this rank itself, or ranks outside the communicator).
    pub(crate) fn new(
        dev: &Device,
        rank: usize,
        peers: &[bool],
        cfg: NetConfig,
        status: Arc<Status>,
    ) -> Result<Self, CollError> {
        let terr = |what: String| CollError::Transport { rank, what };
        let pd = dev.alloc_pd();
        let npeers = peers.iter().filter(|p| **p).count();
        let recv_per_qp = 2 * cfg.slots + 8;
        let depth = (npeers * (cfg.qps * recv_per_qp + 2 * cfg.slots + 8) + 64).min(1 << 20);
        let cq = dev
            .create_cq(depth)
            .map_err(|e| terr(format!("create_cq({depth}): {e}")))?;
        let mut config = QpConfig::new(QpType::Rc);
        config.max_inline_data = cfg.chunk;
        config.max_send_wr = 4 * cfg.slots + 64;
        config.max_recv_wr = recv_per_qp + 8;
        let mut out = Vec::with_capacity(peers.len());
        let mut qpn_peer = HashMap::new();
        for (p, &on) in peers.iter().enumerate() {
            if !on {
                out.push(None);
                continue;
            }
            let mut qps = Vec::with_capacity(cfg.qps);
            let mut psns = Vec::with_capacity(cfg.qps);
            for _ in 0..cfg.qps {
                let qp = pd
                    .create_qp(&QpInit {
                        config,
                        send_cq: cq.clone(),
                        recv_cq: cq.clone(),
                        srq: None,
                    })
                    .map_err(|e| terr(format!("create_qp for peer {p}: {e}")))?;
                qpn_peer.insert(qp.qpn().value(), p);
                qps.push(qp);
                psns.push(dev.random_psn() & 0x00ff_ffff);
            }
            let rx = SlotMem::new(
                &pd,
                cfg.slots * cfg.chunk,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .map_err(|e| terr(format!("registering the receive slots for peer {p}: {e}")))?;
            out.push(Some(Peer {
                qp_done: vec![0; cfg.qps],
                qps,
                psns,
                rx,
                remote_addr: 0,
                remote_rkey: RKey::new(0),
                tx_seq: 0,
                tx_limit: cfg.slots as u64,
                rx_seq: 0,
                rx_len: vec![None; cfg.slots],
                rx_next: (0..cfg.qps as u64).collect(),
                cts_pending: 0,
                fin_rx: 0,
                fin_tx: 0,
                pmtu: 4096,
            }));
        }
        Ok(Self {
            rank,
            cfg,
            pd,
            cq,
            peers: out,
            qpn_peer,
            scratch: vec![0; cfg.chunk],
            wc: vec![Completion::EMPTY; 64],
            status,
        })
    }

    /// Sets how long a wait polls before it blocks.
    pub(crate) fn set_spin(&mut self, spin: Duration) {
        self.cfg.spin = spin;
    }

    /// How long a wait polls before it blocks.
    pub(crate) fn spin(&self) -> Duration {
        self.cfg.spin
    }

    /// What to tell peer `p` (`None` if not connected to it).
    pub(crate) fn info_for(&self, p: usize) -> Option<PeerInfo> {
        let peer = self.peers.get(p)?.as_ref()?;
        Some(PeerInfo {
            qps: peer
                .qps
                .iter()
                .zip(&peer.psns)
                .map(|(q, s)| (q.qpn().value(), *s))
                .collect(),
            slots_addr: peer.rx.mr().addr(),
            slots_rkey: peer.rx.mr().rkey().value(),
        })
    }

    /// Connects to peer `p` as it described itself, and posts the receives.
    pub(crate) fn connect(&mut self, p: usize, gid: Gid, info: &PeerInfo) -> Result<(), CollError> {
        let rank = self.rank;
        let terr = |what: String| CollError::Transport { rank, what };
        let Some(peer) = self.peers.get_mut(p).and_then(Option::as_mut) else {
            return Ok(());
        };
        if info.qps.len() != peer.qps.len() {
            return Err(CollError::Bootstrap(format!(
                "rank {rank}: peer {p} has {} QPs for us, we have {} (qps_per_peer differs)",
                info.qps.len(),
                peer.qps.len()
            )));
        }
        for (i, qp) in peer.qps.iter().enumerate() {
            let opts = ConnectOptions {
                local_psn: Psn::new(peer.psns[i]),
                access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                timeout: QP_TIMEOUT,
                retry_cnt: QP_RETRY,
                ..ConnectOptions::default()
            };
            let remote = RemoteQp {
                qpn: Qpn::new(info.qps[i].0),
                psn: Psn::new(info.qps[i].1),
                gid,
            };
            qp.connect(&remote, &opts)
                .map_err(|e| terr(format!("connecting QP {i} to peer {p}: {e}")))?;
            for _ in 0..2 * self.cfg.slots + 8 {
                qp.post_recv(RecvWr {
                    wr_id: 0,
                    sges: Vec::new(),
                })
                .map_err(|e| terr(format!("post_recv on QP {i} to peer {p}: {e:?}")))?;
            }
        }
        peer.remote_addr = info.slots_addr;
        peer.remote_rkey = RKey::new(info.slots_rkey);
        if let Some(qp) = peer.qps.first() {
            peer.pmtu = qp.attr().path_mtu.bytes();
        }
        Ok(())
    }

    /// The closing handshake (see the module docs): unless the communicator has failed or
    /// was aborted, posts a signalled FIN on every QP to every peer, then waits until each has completed
    /// (acknowledged, or failed with its QP) or the peer has closed too (it finished its
    /// operations: it needs nothing more from us), at most `timeout`, or until an abort.
    /// Call once no operation runs any more.
    pub(crate) fn close(&mut self, timeout: Duration) {
        // After an abort or a failure the communicator's operations fail on every rank
        // anyway (the monitor tells them); a FIN could only race that notice and make a
        // peer fail naming this rank ("closed") instead of the rank really to blame.
        if self.status.aborted_by().is_some() || !self.status.failed().is_empty() {
            return;
        }
        let deadline = Instant::now() + timeout;
        for (p, peer) in self.peers.iter_mut().enumerate() {
            let Some(peer) = peer.as_mut() else { continue };
            for qp in &peer.qps {
                let fin = SendWr {
                    data: SendData::Inline(Vec::new()),
                    signaled: true,
                    ..SendWr::new(
                        WR_FIN | p as u64,
                        SendOp::SendWithImm {
                            imm: imm(KIND_FIN, 0, 0),
                        },
                        Vec::new(),
                    )
                };
                if qp.post_send(fin).is_ok() {
                    peer.fin_tx += 1;
                }
            }
        }
        loop {
            let waiting = self
                .peers
                .iter()
                .flatten()
                .any(|peer| peer.fin_tx > 0 && !peer.closed());
            if !waiting || self.status.aborted_by().is_some() {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let mut wc = std::mem::take(&mut self.wc);
            let n = self
                .cq
                .wait(&mut wc, (deadline - now).min(Duration::from_millis(10)));
            let _ = self.handle(&wc[..n]);
            self.wc = wc;
        }
    }

    fn handle(&mut self, wcs: &[Completion]) -> Result<(), (usize, String)> {
        let mut err = None;
        let nqp = self.cfg.qps as u64;
        for wc in wcs {
            let Some(&p) = self.qpn_peer.get(&wc.qp_num.value()) else {
                continue;
            };
            let Some(peer) = self.peers.get_mut(p).and_then(Option::as_mut) else {
                continue;
            };
            // Receives carry wr_id 0: only our FINs have the flag (an error completion's
            // opcode is not to be trusted).
            if wc.wr_id & WR_FIN != 0 {
                // Our FIN completed: acknowledged, or the QP failed (the peer is gone
                // either way as far as closing is concerned).
                peer.fin_tx = peer.fin_tx.saturating_sub(1);
                continue;
            }
            // A data WRITE completed: its bytes may be overwritten (with a closed peer an
            // error completes it too: the peer took everything before closing).
            if wc.wr_id & WR_DATA != 0 && (wc.status == WcStatus::Success || peer.closed()) {
                let seq = wc.wr_id & !WR_DATA;
                let q = (seq % nqp) as usize;
                peer.qp_done[q] = peer.qp_done[q].max(seq + 1);
                continue;
            }
            if wc.status != WcStatus::Success {
                if peer.closed() {
                    // The peer closed after taking everything: its QPs are gone, so
                    // whatever of ours it had not acknowledged yet fails. Not a failure.
                    continue;
                }
                let why = format!(
                    "work completion {:?} ({:?}) on QP {}",
                    wc.status,
                    wc.opcode,
                    wc.qp_num.value()
                );
                self.status.set_failed(p, why.clone());
                err.get_or_insert((p, why));
                continue;
            }
            match wc.opcode {
                WcOpcode::RecvRdmaWithImm | WcOpcode::Recv => {
                    let (kind, credits, len) = unimm(wc.imm_data.unwrap_or(u32::MAX));
                    let q = peer.qps.iter().position(|q| q.qpn() == wc.qp_num);
                    match (kind, q) {
                        (KIND_DATA, Some(q)) if len <= self.cfg.chunk => {
                            let seq = peer.rx_next[q];
                            peer.rx_next[q] += nqp;
                            let slot = (seq % self.cfg.slots as u64) as usize;
                            peer.tx_limit += credits as u64;
                            let last = wc.imm_data.unwrap_or(0) & LAST != 0;
                            if peer.rx_len[slot].replace((len, last)).is_some() {
                                let why = format!("protocol: slot {slot} written twice");
                                err.get_or_insert((p, why));
                            }
                        }
                        (KIND_CTS, _) => peer.tx_limit += len as u64,
                        (KIND_FIN, _) => peer.fin_rx += 1,
                        _ => {
                            err.get_or_insert((
                                p,
                                format!("protocol: bad immediate {:?}", wc.imm_data),
                            ));
                        }
                    }
                    if let Some(qp) = q.map(|q| &peer.qps[q]) {
                        if let Err(e) = qp.post_recv(RecvWr {
                            wr_id: 0,
                            sges: Vec::new(),
                        }) {
                            err.get_or_insert((p, format!("post_recv: {e:?}")));
                        }
                    }
                }
                _ => {}
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn poll_and_handle(&mut self, wait: Wait) -> Result<bool, (usize, String)> {
        let mut wc = std::mem::take(&mut self.wc);
        let n = match wait {
            Wait::Poll => {
                if self.cq.is_empty() {
                    0
                } else {
                    self.cq.poll(&mut wc)
                }
            }
            Wait::Spin => self.cq.poll(&mut wc),
            Wait::Block(t) => self.cq.wait(&mut wc, t),
        };
        let r = self.handle(&wc[..n]);
        self.wc = wc;
        r.map(|()| n > 0)
    }

    /// Credits are granted back in batches of this many (half the slots) when no chunk to
    /// the peer takes them along: a CTS per batch instead of per chunk (see the module docs
    /// for what goes before this rank waits).
    fn cts_batch(&self) -> usize {
        (self.cfg.slots / 2).max(1)
    }

    /// Grants peer `p` the slots consumed since the last grant (one CTS carrying the count).
    fn grant(&mut self, p: usize) -> Result<(), String> {
        let nqp = self.cfg.qps as u64;
        let Some(peer) = self.peers.get_mut(p).and_then(Option::as_mut) else {
            return Ok(());
        };
        if peer.cts_pending == 0 {
            return Ok(());
        }
        let qp = &peer.qps[(peer.rx_seq % nqp) as usize];
        let cts = SendWr {
            data: SendData::Inline(Vec::new()),
            signaled: false,
            ..SendWr::new(
                0,
                SendOp::SendWithImm {
                    imm: imm(KIND_CTS, 0, peer.cts_pending),
                },
                Vec::new(),
            )
        };
        qp.post_send(cts)
            .map_err(|e| format!("posting a CTS to rank {p}: {e:?}"))?;
        peer.cts_pending = 0;
        Ok(())
    }

    /// Runs one transfer phase over `bufs` until done, or fails (timeout at `deadline`,
    /// abort, a failed peer).
    #[allow(
        clippy::too_many_lines,
        clippy::needless_range_loop,
        clippy::too_many_arguments
    )]
    pub(crate) fn run(
        &mut self,
        x: &Xfer,
        bufs: &mut [&mut [u8]],
        src: &[u8],
        red: Option<(DataType, ReduceOp)>,
        deadline: Instant,
        timeout: Duration,
        phase: &dyn Fn() -> String,
    ) -> Result<(), CollError> {
        let rank = self.rank;
        // The buffers large chunks are sent from in place, registered for the phase: the
        // source and every buffer no receive of this phase writes, lent read-only to the
        // transport (`with_borrowed_ref`: nothing writes them meanwhile), and every buffer
        // the phase also writes, registered in place (`LentMut`: the executor writes only
        // bytes no WRITE in flight reads, checked before each write in `run_lent`).
        let zc_from = |b: usize| {
            x.sends
                .iter()
                .any(|s| s.src.buf == b && s.src.len.min(self.cfg.chunk) >= ZERO_COPY_MIN)
        };
        let written: Vec<bool> = (0..bufs.len())
            .map(|b| x.recvs.iter().any(|r| r.dst.buf == b))
            .collect();
        let mut views: Vec<View<'_>> = Vec::with_capacity(bufs.len());
        for (b, buf) in bufs.iter_mut().enumerate() {
            views.push(match (written[b], zc_from(b)) {
                (true, true) => {
                    View::Lent(
                        LentMut::new(&self.pd, buf).map_err(|e| CollError::Transport {
                            rank,
                            what: format!("registering a buffer in place in {}: {e}", phase()),
                        })?,
                    )
                }
                (true, false) => View::Mut(buf),
                (false, _) => View::Ro(buf),
            });
        }
        let mut lend: Vec<(usize, &[u8])> = Vec::new();
        if zc_from(SRC) {
            lend.push((SRC, src));
        }
        for (b, v) in views.iter().enumerate() {
            if let View::Ro(buf) = v {
                if zc_from(b) {
                    lend.push((b, buf));
                }
            }
        }
        let pd = self.pd.clone();
        let lent: Vec<&[u8]> = lend.iter().map(|(_, b)| *b).collect();
        let which: Vec<usize> = lend.iter().map(|(b, _)| *b).collect();
        // The written buffers' regions (owned by their views, registered until `views` is
        // dropped, after the phase): the entry of their first byte.
        let written_at: Vec<Option<Sge>> = views
            .iter()
            .map(|v| match v {
                View::Lent(l) => Some(l.mr().sge(0, 0)),
                _ => None,
            })
            .collect();
        let mut body = |mrs: &[&MemoryRegion]| {
            // The entry for `len` bytes at `off` of buffer `b`, if it is registered.
            let lookup = |b: usize, off: usize, len: usize| match which.iter().position(|w| *w == b)
            {
                Some(i) => Some(mrs[i].sge(off, len)),
                None => written_at.get(b).copied().flatten().map(|at| Sge {
                    addr: at.addr + off as u64,
                    length: len as u32,
                    lkey: at.lkey,
                }),
            };
            self.run_lent(x, &mut views, src, &lookup, red, deadline, timeout, phase)
        };
        with_lent(&pd, &lent, &[], &mut body).map_err(|e| CollError::Transport {
            rank,
            what: format!("registering a buffer in place in {}: {e}", phase()),
        })?
    }

    /// [`Self::run`]'s body: `lent(b, off, len)` is the entry for `len` bytes at `off` of
    /// buffer `b` when it is registered for the phase (every buffer large chunks are sent
    /// from).
    #[allow(
        clippy::too_many_lines,
        clippy::needless_range_loop,
        clippy::too_many_arguments
    )]
    fn run_lent(
        &mut self,
        x: &Xfer,
        bufs: &mut [View<'_>],
        src: &[u8],
        lent: &dyn Fn(usize, usize, usize) -> Option<Sge>,
        red: Option<(DataType, ReduceOp)>,
        deadline: Instant,
        timeout: Duration,
        phase: &dyn Fn() -> String,
    ) -> Result<(), CollError> {
        let rank = self.rank;
        let inval = |w: String| {
            Err(CollError::InvalidArgument(format!(
                "internal schedule: {w}"
            )))
        };
        // Check the schedule against the buffers and the connections once.
        let lens: Vec<usize> = bufs.iter().map(|b| b.get().len()).collect();
        let blen = |i: usize| {
            if i == SRC {
                Some(src.len())
            } else {
                lens.get(i).copied()
            }
        };
        for s in &x.sends {
            if blen(s.src.buf).is_none_or(|l| s.src.end() > l) {
                return inval(format!("send region {:?} out of bounds", s.src));
            }
            if self.peers.get(s.peer).is_none_or(Option::is_none) {
                return inval(format!("send to unconnected peer {}", s.peer));
            }
            if s.deps.iter().any(|d| *d >= x.recvs.len()) {
                return inval("send dependency out of range".into());
            }
        }
        for r in &x.recvs {
            if bufs
                .get(r.dst.buf)
                .is_none_or(|b| r.dst.end() > b.get().len())
                || (r.apply == Apply::ReduceFromSource && r.dst.end() > src.len())
            {
                return inval(format!("receive region {:?} out of bounds", r.dst));
            }
            if self.peers.get(r.peer).is_none_or(Option::is_none) {
                return inval(format!("receive from unconnected peer {}", r.peer));
            }
            if r.apply != Apply::Copy && red.is_none() {
                return inval("reduction without an operator".into());
            }
            if r.deps.iter().any(|d| *d >= x.recvs.len())
                || r.after.iter().any(|s| *s >= x.sends.len())
            {
                return inval("receive dependency out of range".into());
            }
        }
        let chunk = self.cfg.chunk;
        let slots = self.cfg.slots;
        let nqp = self.cfg.qps;
        // Bytes of each send posted, and completed (a prefix: what may be overwritten).
        let mut sent = vec![0usize; x.sends.len()];
        let mut acked = vec![0usize; x.sends.len()];
        let mut send_done = vec![false; x.sends.len()];
        let mut got = vec![0usize; x.recvs.len()];
        let mut recv_done = vec![false; x.recvs.len()];
        let npeers = self.peers.len();
        let mut sq: Vec<VecDeque<usize>> = vec![VecDeque::new(); npeers];
        let mut rq: Vec<VecDeque<usize>> = vec![VecDeque::new(); npeers];
        // Per peer, the chunks posted and not yet known complete: (seq, send, bytes, sent in
        // place). Inline chunks are complete when posted; they queue behind in-place ones so
        // that `acked` stays a prefix.
        let mut inflight: Vec<VecDeque<(u64, usize, usize, bool)>> = vec![VecDeque::new(); npeers];
        // In-place chunks in flight from the buffers the phase writes (`View::Lent`): (buffer,
        // start, end, seq, peer). Nothing writes their bytes until they completed.
        let mut reading: Vec<(usize, usize, usize, u64, usize)> = Vec::new();
        for (i, s) in x.sends.iter().enumerate() {
            sq[s.peer].push_back(i);
        }
        for (i, r) in x.recvs.iter().enumerate() {
            rq[r.peer].push_back(i);
        }
        let mut left = x.sends.len() + x.recvs.len();
        // When the current spell without progress began (the spin's clock).
        let mut idle_since: Option<Instant> = None;
        loop {
            self.status.check(phase)?;
            let mut progressed = false;
            // Completed sends: their bytes may be overwritten now.
            for p in 0..npeers {
                let Some(peer) = self.peers[p].as_ref() else {
                    continue;
                };
                while let Some(&(seq, i, clen, zc)) = inflight[p].front() {
                    if zc && seq >= peer.qp_done[(seq % nqp as u64) as usize] {
                        break;
                    }
                    inflight[p].pop_front();
                    if zc {
                        reading.retain(|r| (r.3, r.4) != (seq, p));
                    }
                    acked[i] += clen;
                    if acked[i] == x.sends[i].src.len {
                        send_done[i] = true;
                        left -= 1;
                        progressed = true;
                    }
                }
            }
            // Sends: as far as credits and dependencies allow.
            for p in 0..npeers {
                while let Some(&i) = sq[p].front() {
                    let s = &x.sends[i];
                    let off = sent[i];
                    let clen = chunk.min(s.src.len - off);
                    let (a, b) = (s.src.off + off, s.src.off + off + clen);
                    let ready = s.deps.iter().all(|&d| {
                        let r = &x.recvs[d];
                        if r.dst.buf != s.src.buf {
                            return recv_done[d];
                        }
                        overlap_done(a, b, r.dst, got[d], recv_done[d])
                    });
                    // INVARIANT: checked above: every send's peer is connected.
                    let peer = self.peers[p].as_mut().expect("INVARIANT: connected peer");
                    if !ready || peer.tx_seq >= peer.tx_limit {
                        break;
                    }
                    let zc = clen >= ZERO_COPY_MIN;
                    let bytes = if s.src.buf == SRC {
                        &src[a..b]
                    } else {
                        &bufs[s.src.buf].get()[a..b]
                    };
                    let seq = peer.tx_seq;
                    // A large chunk is read from the buffer itself (its bytes may be
                    // overwritten once the WRITE completed); inline ones were copied at the
                    // post.
                    let data = if zc {
                        // Sent in place: `run` registered every buffer a large chunk leaves
                        // from.
                        match lent(s.src.buf, a, clen) {
                            Some(sge) => SendData::Sges(vec![sge]),
                            None => return inval(format!("buffer {} not registered", s.src.buf)),
                        }
                    } else {
                        SendData::Inline(bytes.to_vec())
                    };
                    if zc && matches!(bufs.get(s.src.buf), Some(View::Lent(_))) {
                        reading.push((s.src.buf, a, b, seq, p));
                    }
                    // Signalled: the chunks sent in place (their bytes may be overwritten only
                    // once they completed). An inline chunk's completion would tell nothing
                    // (its bytes were copied at the post; the transport retires unsignalled
                    // requests as they are acknowledged) and would wake this rank for it.
                    let last = zc;
                    let slot = (seq % slots as u64) as usize;
                    let qp = &peer.qps[(seq % nqp as u64) as usize];
                    // The credits this rank owes the peer go with the chunk.
                    let credits = peer.cts_pending.min(MAX_PIGGYBACK);
                    let remote_addr = peer.remote_addr + (slot * chunk) as u64;
                    let imm_data = imm(KIND_DATA, credits, clen)
                        | if off + clen == s.src.len { LAST } else { 0 };
                    let data_wr = |data, op| SendWr {
                        data,
                        signaled: last,
                        ..SendWr::new(WR_DATA | seq, op, Vec::new())
                    };
                    let posted = if split_pays(clen, peer.pmtu) {
                        // The data as a plain WRITE, then its immediate as a zero-length
                        // WRITE WITH IMMEDIATE (RC places the first before the second
                        // completes): see `split_pays`.
                        let plain = SendWr {
                            data,
                            signaled: false,
                            ..SendWr::new(
                                0,
                                SendOp::RdmaWrite {
                                    remote_addr,
                                    rkey: peer.remote_rkey,
                                },
                                Vec::new(),
                            )
                        };
                        let tail = data_wr(
                            SendData::Inline(Vec::new()),
                            SendOp::RdmaWriteWithImm {
                                remote_addr,
                                rkey: peer.remote_rkey,
                                imm: imm_data,
                            },
                        );
                        // (A refusal fails the operation, whichever of the two it hit.)
                        qp.post_send_batch_coalesced([plain, tail])
                            .map(|_| ())
                            .map_err(|(_, e)| e)
                    } else {
                        qp.post_send_coalesced(data_wr(
                            data,
                            SendOp::RdmaWriteWithImm {
                                remote_addr,
                                rkey: peer.remote_rkey,
                                imm: imm_data,
                            },
                        ))
                    };
                    posted.map_err(|e| CollError::Transport {
                        rank,
                        what: format!("posting a WRITE to rank {p} in {}: {e:?}", phase()),
                    })?;
                    peer.tx_seq += 1;
                    peer.cts_pending -= credits;
                    sent[i] += clen;
                    inflight[p].push_back((seq, i, clen, zc));
                    progressed = true;
                    if sent[i] == s.src.len {
                        sq[p].pop_front();
                    }
                }
            }
            // Receives: apply every chunk that has arrived and may be applied.
            for p in 0..npeers {
                while let Some(&j) = rq[p].front() {
                    let r = &x.recvs[j];
                    // INVARIANT: checked above: every receive's peer is connected.
                    let peer = self.peers[p].as_mut().expect("INVARIANT: connected peer");
                    let slot = (peer.rx_seq % slots as u64) as usize;
                    let Some((len, ends)) = peer.rx_len[slot] else {
                        break;
                    };
                    let off = got[j];
                    let clen = chunk.min(r.dst.len - off);
                    if len != clen || ends != (off + clen == r.dst.len) {
                        let why = format!(
                            "protocol: a chunk of {len} bytes{} where {clen} bytes{} were expected \
                             (mismatched collective arguments?)",
                            if ends { " ending its message" } else { "" },
                            if off + clen == r.dst.len { " ending the message" } else { "" }
                        );
                        self.status.set_failed(p, why.clone());
                        return Err(CollError::PeerFailed {
                            rank,
                            peer: p,
                            phase: phase(),
                            reason: why,
                        });
                    }
                    let (a, b) = (r.dst.off + off, r.dst.off + off + clen);
                    let ready = r.deps.iter().all(|&d| {
                        let q = &x.recvs[d];
                        q.dst.buf != r.dst.buf || overlap_done(a, b, q.dst, got[d], recv_done[d])
                    }) && r.after.iter().all(|&s| {
                        let sx = &x.sends[s];
                        sx.src.buf != r.dst.buf
                            || overlap_done(a, b, sx.src, acked[s], send_done[s])
                    });
                    if !ready {
                        break;
                    }
                    let dst = match &mut bufs[r.dst.buf] {
                        View::Mut(d) => &mut d[a..b],
                        View::Lent(l) => {
                            // The schedule orders every overwrite after the sends that read
                            // the same bytes (`after`); checked here, as the write below
                            // must not race a WRITE still reading them.
                            if reading
                                .iter()
                                .any(|w| w.0 == r.dst.buf && w.1 < b && a < w.2)
                            {
                                return inval(format!(
                                    "a receive overwrites bytes {a}..{b} of buffer {} while a \
                                     WRITE reads them",
                                    r.dst.buf
                                ));
                            }
                            // SAFETY: no WRITE in flight reads these bytes (`reading` holds
                            // every in-place WRITE from this buffer posted and not completed;
                            // checked just above), and none is posted while `dst` lives (this
                            // loop posts nothing until it is dropped).
                            #[allow(unsafe_code)]
                            match unsafe { l.range_mut(a, b) } {
                                Some(d) => d,
                                None => {
                                    return inval(format!("receive region {a}..{b} out of range"))
                                }
                            }
                        }
                        View::Ro(_) => return inval("a receive into a read-only buffer".into()),
                    };
                    // The slot is full (its completion was taken) and not granted back
                    // before it has been applied: read in place.
                    let incoming = peer.rx.bytes(slot * chunk, clen);
                    match (r.apply, red) {
                        (Apply::Copy, _) => dst.copy_from_slice(incoming),
                        (Apply::Reduce, Some((dt, op))) => reduce_into(dt, op, dst, incoming)?,
                        (Apply::ReduceIncomingFirst, Some((dt, op))) => {
                            let tmp = &mut self.scratch[..clen];
                            tmp.copy_from_slice(incoming);
                            reduce_into(dt, op, tmp, dst)?;
                            dst.copy_from_slice(tmp);
                        }
                        (Apply::ReduceFromSource, Some((dt, op))) => {
                            reduce_many(dt, op, dst, &[&src[a..b], incoming])?;
                        }
                        (_, None) => return inval("reduction without an operator".into()),
                    }
                    peer.rx_len[slot] = None;
                    peer.rx_seq += 1;
                    peer.cts_pending += 1;
                    // Half the slots held back: grant them now, unless a chunk to this
                    // peer is about to take them along (one may leave: more to send, and
                    // credits to send it with).
                    let can_piggyback = !sq[p].is_empty() && peer.tx_seq < peer.tx_limit;
                    if peer.cts_pending >= self.cts_batch() && !can_piggyback {
                        self.grant(p).map_err(|what| CollError::Transport {
                            rank,
                            what: format!("{what} in {}", phase()),
                        })?;
                    }
                    got[j] += clen;
                    progressed = true;
                    if got[j] == r.dst.len {
                        recv_done[j] = true;
                        left -= 1;
                        rq[p].pop_front();
                    }
                }
            }
            if left == 0 {
                return Ok(());
            }
            let waited = if progressed {
                idle_since = None;
                self.poll_and_handle(Wait::Poll)
            } else {
                let now = Instant::now();
                if now >= deadline {
                    let peer = rq
                        .iter()
                        .position(|q| !q.is_empty())
                        .or_else(|| sq.iter().position(|q| !q.is_empty()))
                        .or_else(|| inflight.iter().position(|q| !q.is_empty()));
                    // The streams are out of step now (chunks of this operation may still
                    // arrive): later operations must not consume them as their own.
                    self.status.set_failed(
                        peer.unwrap_or(rank),
                        format!(
                            "an earlier operation timed out in {} waiting for it; the \
                             communicator is out of step (shrink or create a new one)",
                            phase()
                        ),
                    );
                    return Err(CollError::Timeout {
                        rank,
                        peer,
                        phase: phase(),
                        after: timeout,
                    });
                }
                // A peer that has closed sends nothing more: waiting for it is waiting for
                // nothing (the ranks ran different operations).
                if let Some(p) = (0..npeers).find(|&p| {
                    self.peers[p].as_ref().is_some_and(|peer| {
                        let starved = !rq[p].is_empty()
                            && peer.rx_len[(peer.rx_seq % slots as u64) as usize].is_none();
                        peer.closed() && (starved || !sq[p].is_empty())
                    })
                }) {
                    return Err(CollError::PeerFailed {
                        rank,
                        peer: p,
                        phase: phase(),
                        reason: "it closed its communicator while this rank still had data to \
                                 exchange with it (different operations on the two ranks?)"
                            .into(),
                    });
                }
                // About to wait: credits held back go now where half the slots are, or
                // where the peer may have none left (every slot it may write is full or
                // consumed here: nothing is on its way), so that no peer waits for one while
                // we wait for it. The rest ride on the next chunk to the peer.
                for p in 0..npeers {
                    let starving = self.peers[p].as_ref().is_some_and(|peer| {
                        let full = peer.rx_len.iter().filter(|l| l.is_some()).count();
                        peer.cts_pending > 0
                            && (peer.cts_pending >= (slots / 2).max(1)
                                || peer.cts_pending + full >= slots)
                    });
                    if starving {
                        self.grant(p).map_err(|what| CollError::Transport {
                            rank,
                            what: format!("{what} in {}", phase()),
                        })?;
                    }
                }
                // Poll (a CQ poll that finds nothing runs an engine pass itself) until this
                // idle spell has lasted the spin, then sleep on the CQ.
                let idle = now - *idle_since.get_or_insert(now);
                self.poll_and_handle(if idle < self.cfg.spin {
                    Wait::Spin
                } else {
                    Wait::Block((deadline - now).min(Duration::from_millis(10)))
                })
            };
            // Completions that unblocked nothing yet (credits, a part of a zero-copy send)
            // still show the peers are moving: the spin's clock starts again.
            if matches!(waited, Ok(true)) {
                idle_since = None;
            }
            if let Err((p, why)) = waited {
                return Err(CollError::PeerFailed {
                    rank,
                    peer: p,
                    phase: phase(),
                    reason: why,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_pays;

    /// UDP payload sizes (BTH 12, RETH 16, ImmDt 4, payload padded to 4, ICRC 4) of one
    /// RDMA WRITE of `len` bytes, with an immediate or not.
    fn write_packets(len: usize, pmtu: usize, imm: bool) -> Vec<usize> {
        let pad = |x: usize| x.div_ceil(4) * 4;
        let n = len.div_ceil(pmtu).max(1);
        let last = len - (n - 1) * pmtu;
        let tail = if imm { 4 } else { 0 };
        if n == 1 {
            return vec![12 + 16 + tail + pad(len) + 4];
        }
        let mut v = vec![12 + 16 + pmtu + 4];
        v.extend(std::iter::repeat_n(12 + pmtu + 4, n - 2));
        v.push(12 + tail + pad(last) + 4);
        v
    }

    /// How many UDP GSO messages the udp datapath makes of back-to-back datagrams of one
    /// destination (its `prepare_tx`): a run of one size, at most 64 datagrams and 65 507
    /// bytes, may end with one shorter datagram.
    fn gso_messages(sizes: &[usize]) -> usize {
        let (mut i, mut m) = (0, 0);
        while i < sizes.len() {
            let seg = sizes[i];
            let (mut run, mut total) = (1, seg);
            while i + run < sizes.len() && run < 64 {
                let len = sizes[i + run];
                if len > seg || total + len > 65_507 {
                    break;
                }
                total += len;
                run += 1;
                if len < seg {
                    break;
                }
            }
            i += run;
            m += 1;
        }
        m
    }

    #[test]
    fn a_split_never_costs_a_gso_message_and_is_taken_where_it_saves_one() {
        for pmtu in [256, 1024, 4096] {
            let mut saved = 0;
            for len in (1..=140 * pmtu).filter(|l| l % 4 == 0 || l % pmtu > pmtu - 8) {
                let whole = gso_messages(&write_packets(len, pmtu, true));
                let mut split = write_packets(len, pmtu, false);
                split.push(12 + 16 + 4 + 4);
                let split = gso_messages(&split);
                if split_pays(len, pmtu) {
                    assert!(split <= whole, "pmtu {pmtu} len {len}: {split} > {whole}");
                    saved += usize::from(split < whole);
                } else {
                    assert!(whole <= split, "pmtu {pmtu} len {len}: {whole} > {split}");
                }
            }
            // Whole packets only (every chunk of a power-of-two size): 4 packets and up.
            assert!(split_pays(4 * pmtu, pmtu) && split_pays(128 * pmtu, pmtu));
            assert!(!split_pays(3 * pmtu, pmtu) && !split_pays(4 * pmtu - 8, pmtu));
            assert!(saved > 0, "pmtu {pmtu}: the split never saved a message");
        }
    }
}
