//! Queue pairs (`ibv_qp`): creation through a protection domain, connection, posts.

use std::sync::Arc;

use roce_mr::Access;
use roce_qp::state::{bring_up_steps, AttrMask, QpAttr};
use roce_qp::verbs::{AddressHandle, Mtu, QpState, QpType, RecvWr, SendWr};
use roce_qp::{Mem, PostError, QpConfig, QpStats};
use roce_wire::{Gid, Psn, QKey, Qpn};

use super::cq::CompletionQueue;
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use crate::device::Device;
use crate::endpoint::QpSlot;
use crate::engine::Engine;
use crate::error::VerbsError;

impl ProtectionDomain {
    /// Creates a queue pair (`ibv_create_qp`), in RESET.
    ///
    /// # Errors
    /// [`VerbsError::WrongDevice`] if a CQ or the SRQ belongs to another device.
    pub fn create_qp(&self, init: &QpInit) -> Result<QueuePair, VerbsError> {
        let dev = &self.inner.dev;
        let same = |d: &Device| Arc::ptr_eq(d.shared(), dev.shared());
        if !same(&init.send_cq.dev) || !same(&init.recv_cq.dev) {
            return Err(VerbsError::WrongDevice("CQ of another device"));
        }
        if let Some(srq) = &init.srq {
            if !same(&srq.dev) {
                return Err(VerbsError::WrongDevice("SRQ of another device"));
            }
        }
        let reservation = dev.reserve(crate::control::Objects::qp())?;
        let qpn = dev.alloc_qpn().ok_or_else(|| {
            VerbsError::Io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                "every QPN is in use",
            ))
        })?;
        let mem = Mem::new(dev.shared().table.clone(), self.inner.pd);
        let mut qp = roce_qp::QueuePair::new(
            Qpn::new(qpn),
            init.config,
            mem,
            init.srq.as_ref().map(|s| s.inner.clone()),
        );
        qp.set_port_mtu(dev.shared().mtu);
        dev.lock_engine_of(qpn).ep.insert(QpSlot {
            qp,
            send_cq: init.send_cq.shared.clone(),
            recv_cq: init.recv_cq.shared.clone(),
        });
        Ok(QueuePair {
            pd: self.clone(),
            qpn: Qpn::new(qpn),
            qp_type: init.config.qp_type,
            _reservation: reservation,
        })
    }
}

/// How to create a QP (`ibv_qp_init_attr`).
#[derive(Clone, Debug)]
pub struct QpInit {
    /// Capacities, type and signalling.
    pub config: QpConfig,
    /// Where send completions go.
    pub send_cq: CompletionQueue,
    /// Where receive completions go.
    pub recv_cq: CompletionQueue,
    /// Receive from this SRQ instead of the QP's own queue.
    pub srq: Option<SharedReceiveQueue>,
}

impl QpInit {
    /// A QP of `qp_type` with default capacities, both completions to `cq`.
    pub fn new(qp_type: QpType, cq: &CompletionQueue) -> Self {
        Self {
            config: QpConfig::new(qp_type),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
        }
    }
}

/// The far end of a connection, as the out-of-band exchange gives it.
///
/// Each side sends the other its own `RemoteQp` (its QPN, the first PSN it will send, its
/// GID) over any channel the application has, then calls [`QueuePair::connect`] with the one
/// it received. Three forms travel well:
///
/// - **serde** (`Serialize`/`Deserialize`): a struct `{ "qpn": 17, "psn": 6761004,
///   "gid": "::ffff:127.0.0.2" }` (QPN and PSN as numbers, the GID in IPv6 text form), for
///   JSON, a key-value store or any serde format;
/// - **bytes** ([`RemoteQp::to_bytes`], [`RemoteQp::from_bytes`]): [`RemoteQp::WIRE_LEN`] = 24
///   bytes, QPN (u32 big-endian), PSN (u32 big-endian), then the 16 GID bytes in order;
/// - **text** ([`Display`](std::fmt::Display), [`FromStr`](std::str::FromStr)): the record
///   of rdma-core's `ibv_rc_pingpong` exchange without its NUL, `LID:QPN:PSN:GID` as 4, 6, 6
///   and 32 hex digits, the LID always `0000` on RoCE, e.g.
///   `0000:000011:672a2c:00000000000000000000ffff7f000002` (51 characters).
///
/// Every parser checks that QPN and PSN fit in 24 bits.
///
/// ```
/// use roce_transport::RemoteQp;
/// let me = RemoteQp {
///     qpn: roce_transport::Qpn::new(0x11),
///     psn: roce_transport::Psn::new(0x67_2a2c),
///     gid: "::ffff:127.0.0.2".parse().unwrap(),
/// };
/// let text = me.to_string();
/// assert_eq!(text, "0000:000011:672a2c:00000000000000000000ffff7f000002");
/// assert_eq!(text.parse::<RemoteQp>().unwrap(), me);
/// assert_eq!(RemoteQp::from_bytes(&me.to_bytes()).unwrap(), me);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "RemoteQpRepr", try_from = "RemoteQpRepr")]
pub struct RemoteQp {
    /// Its QPN.
    pub qpn: Qpn,
    /// The first PSN it will send.
    pub psn: Psn,
    /// Its GID.
    pub gid: Gid,
}

/// Why bytes or text are not a [`RemoteQp`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteQpParseError {
    /// The byte form is not exactly [`RemoteQp::WIRE_LEN`] bytes.
    #[error("a remote QP is {expected} bytes, got {got}")]
    Length {
        /// [`RemoteQp::WIRE_LEN`].
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A QPN or PSN above 2^24 - 1.
    #[error("{field} {value:#x} does not fit in 24 bits")]
    Range {
        /// `"QPN"` or `"PSN"`.
        field: &'static str,
        /// The value.
        value: u32,
    },
    /// The text is not `LLLL:QQQQQQ:PPPPPP:` followed by 32 hex digits.
    #[error("expected LID:QPN:PSN:GID as 4:6:6:32 hex digits, got {0:?}")]
    Text(String),
    /// The GID of the serde form is not an IPv6 address in text form.
    #[error("GID {0:?} is not an IPv6 address")]
    Gid(String),
}

impl RemoteQp {
    /// Length of the byte form ([`RemoteQp::to_bytes`]).
    pub const WIRE_LEN: usize = 24;

    /// The byte form: QPN and PSN as big-endian u32, then the GID's 16 bytes.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut out = [0u8; Self::WIRE_LEN];
        out[..4].copy_from_slice(&self.qpn.value().to_be_bytes());
        out[4..8].copy_from_slice(&self.psn.value().to_be_bytes());
        out[8..].copy_from_slice(&self.gid.0);
        out
    }

    /// Parses the byte form.
    ///
    /// # Errors
    /// [`RemoteQpParseError::Length`] unless exactly [`RemoteQp::WIRE_LEN`] bytes;
    /// [`RemoteQpParseError::Range`] for a QPN or PSN above 24 bits.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, RemoteQpParseError> {
        let Ok(b) = <&[u8; Self::WIRE_LEN]>::try_from(bytes) else {
            return Err(RemoteQpParseError::Length {
                expected: Self::WIRE_LEN,
                got: bytes.len(),
            });
        };
        let word = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..]);
        Self::checked(word(0), word(4), Gid(gid))
    }

    fn checked(qpn: u32, psn: u32, gid: Gid) -> Result<Self, RemoteQpParseError> {
        for (field, value) in [("QPN", qpn), ("PSN", psn)] {
            if value > Psn::MAX {
                return Err(RemoteQpParseError::Range { field, value });
            }
        }
        Ok(Self {
            qpn: Qpn::new(qpn),
            psn: Psn::new(psn),
            gid,
        })
    }
}

/// The `ibv_rc_pingpong` record without its NUL: `0000:QQQQQQ:PPPPPP:` + 32 hex digits.
impl std::fmt::Display for RemoteQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "0000:{:06x}:{:06x}:{}",
            self.qpn.value(),
            self.psn.value(),
            self.gid.to_hex()
        )
    }
}

/// Parses the [`Display`](std::fmt::Display) form (hex digits in either case; the LID is
/// read and ignored, as RoCE has none). A trailing NUL, as the pingpong tools send it, is
/// accepted.
impl std::str::FromStr for RemoteQp {
    type Err = RemoteQpParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || RemoteQpParseError::Text(text.to_owned());
        let trimmed = text.strip_suffix('\0').unwrap_or(text);
        let fields: Vec<&str> = trimmed.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(bad());
        };
        let hex = |s: &str, width: usize| {
            (s.len() == width && s.bytes().all(|c| c.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        let (Some(_), Some(qpn), Some(psn)) = (hex(lid, 4), hex(qpn, 6), hex(psn, 6)) else {
            return Err(bad());
        };
        let gid = Gid::from_hex(gid).map_err(|_| bad())?;
        Self::checked(qpn, psn, gid)
    }
}

/// The serde form of [`RemoteQp`].
#[derive(serde::Serialize, serde::Deserialize)]
struct RemoteQpRepr {
    qpn: u32,
    psn: u32,
    gid: String,
}

impl From<RemoteQp> for RemoteQpRepr {
    fn from(r: RemoteQp) -> Self {
        Self {
            qpn: r.qpn.value(),
            psn: r.psn.value(),
            gid: r.gid.to_string(),
        }
    }
}

impl TryFrom<RemoteQpRepr> for RemoteQp {
    type Error = RemoteQpParseError;

    fn try_from(r: RemoteQpRepr) -> Result<Self, Self::Error> {
        let gid: Gid = r.gid.parse().map_err(|_| RemoteQpParseError::Gid(r.gid))?;
        Self::checked(r.qpn, r.psn, gid)
    }
}

/// Connection parameters for [`QueuePair::connect`].
///
/// # Retries: what happens when the peer is gone or not ready
///
/// The defaults are those of `ibv_rc_pingpong` and perftest, and they do not bound every
/// wait:
///
/// - **No answer at all** (peer dead, firewall, link down): after each ACK timeout
///   (`timeout`: 4.096 µs × 2^14 ≈ 67 ms) the requester resends from the oldest unacknowledged
///   PSN, `retry_cnt` (7) times; then the work request completes with
///   [`WcStatus::RetryExcErr`](crate::WcStatus::RetryExcErr) and the QP enters ERR (about
///   0.5 s with the defaults).
/// - **A lost packet** is normally repaired within a round trip (the responder's sequence
///   NAK). What the responder cannot report (a lost retransmission, NAK or message tail) is
///   sent again by early retransmission once the packets have waited max(several measured
///   round trips, 2 ms), doubling per attempt, without spending `retry_cnt` and without
///   delaying the ACK timeouts above ([`QpInit::config`]'s
///   `early_retransmit_min_ns`; `None` waits for the ACK timeout as IBTA alone would).
/// - **Receiver not ready** (a SEND or WRITE_WITH_IMM arrives where no receive is posted):
///   the responder answers an RNR NAK carrying its `min_rnr_timer`; the requester waits that
///   long and resends. **`rnr_retry` 7, the default, means retry forever**, as in verbs: a
///   SEND to a peer that never posts a receive never completes (it shows up only as RNR NAK
///   counters in [`QueuePair::stats`]). Set `rnr_retry` to 0..=6 to get
///   [`WcStatus::RnrRetryExcErr`](crate::WcStatus::RnrRetryExcErr) after that many retries
///   instead, or post receives before the peer can send (the usual verbs discipline: post
///   receives, then exchange [`RemoteQp`]s). An application that must never wait forever also
///   bounds its CQ waits ([`CompletionQueue::wait`]'s timeout).
/// - `min_rnr_timer` is the delay *we* ask senders to wait after our RNR NAK (IBTA code 12 =
///   0.64 ms; 0 means 655.36 ms).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Path MTU (default: the device's active MTU).
    pub mtu: Option<Mtu>,
    /// Our first PSN.
    pub local_psn: Psn,
    /// Remote access we allow.
    pub access: Access,
    /// ACK timeout exponent (4.096 us x 2^timeout; default 14, about 67 ms).
    pub timeout: u8,
    /// Retries after an ACK timeout before [`WcStatus::RetryExcErr`](crate::WcStatus)
    /// (0..=7, default 7; 7 means seven here, not infinite).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0..=7). **7, the default, retries forever** (verbs'
    /// meaning): see "Retries" on the type.
    pub rnr_retry: u8,
    /// RNR timer code we advertise in our RNR NAKs (IBTA table; default 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics as requester and responder.
    pub rd_atomic: u8,
    /// Traffic class (DSCP/ECN) of our packets.
    pub traffic_class: u8,
    /// Q_Key for UD.
    pub qkey: QKey,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            mtu: None,
            local_psn: Psn::new(0),
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            traffic_class: 0,
            qkey: QKey::new(0x1111_1111),
        }
    }
}

/// A queue pair (`ibv_qp`). Destroyed when dropped.
#[derive(Debug)]
pub struct QueuePair {
    pd: ProtectionDomain,
    qpn: Qpn,
    qp_type: QpType,
    /// Held with the rocectl daemon, when one serves the device (released on drop).
    _reservation: Option<crate::control::Reservation>,
}

impl QueuePair {
    /// How many send WRs must be outstanding before [`Self::post_send_coalesced`] leaves a
    /// new one to the engine thread (fewer: sent at once).
    pub const COALESCE_AFTER: usize = 2;

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// What the peer needs to connect to this QP: its QPN, `local_psn` (the first PSN it will
    /// send: pass the same value as [`ConnectOptions::local_psn`]) and the device's GID. Send
    /// it over the out-of-band channel (see [`RemoteQp`] for its serialised forms).
    pub fn endpoint(&self, local_psn: Psn) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: local_psn,
            gid: self.dev().local_gid(),
        }
    }

    fn dev(&self) -> &Device {
        &self.pd.inner.dev
    }

    fn with<R>(&self, f: impl FnOnce(&mut roce_qp::QueuePair) -> R) -> R {
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        let slot = slot_of(&mut e, self.qpn);
        f(&mut slot.qp)
    }

    /// The state (`ibv_query_qp`).
    pub fn state(&self) -> QpState {
        self.with(|q| q.state())
    }

    /// The attributes (`ibv_query_qp`).
    pub fn attr(&self) -> QpAttr {
        self.with(|q| *q.attr())
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.with(|q| q.stats())
    }

    /// `ibv_modify_qp`.
    ///
    /// # Errors
    /// [`VerbsError::Modify`] for a transition or attribute the state table refuses;
    /// [`VerbsError::MtuTooLarge`] for a path MTU above the device's.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let active = self.dev().shared().mtu;
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu > active {
            return Err(VerbsError::MtuTooLarge {
                requested: attr.path_mtu.bytes(),
                active: active.bytes(),
            });
        }
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        let slot = slot_of(&mut e, self.qpn);
        slot.qp.modify(attr, mask)?;
        if mask.contains(AttrMask::STATE) && attr.state == QpState::Reset {
            // A reset QP starts afresh: its completions still in the CQs (the flushes of the
            // error before) go, as mlx4/mlx5 clean their CQs (`mlx5_cq_clean`).
            slot.send_cq.purge(self.qpn);
            slot.recv_cq.purge(self.qpn);
        }
        // Entering ERR flushes WRs into completions; send them on.
        self.dev().doorbell(e, self.qpn.value());
        Ok(())
    }

    /// Moves a RESET QP to INIT, RTR and RTS towards `remote` (RC/UC), or to RTS (UD;
    /// `remote` is ignored), with `opts` — what the pingpong and perftest tools do after
    /// their out-of-band exchange.
    ///
    /// # Errors
    /// As [`Self::modify`].
    pub fn connect(&self, remote: &RemoteQp, opts: &ConnectOptions) -> Result<(), VerbsError> {
        let mtu = opts.mtu.unwrap_or(self.dev().shared().mtu);
        // Every attribute of the bring-up; each step sends the ones the state table requires
        // for it (`bring_up_steps`): UD ignores `remote`, UC the RC-only ones.
        let attr = QpAttr {
            state: QpState::Init,
            access_flags: remote_only(opts.access),
            pkey_index: 0,
            port: 1,
            qkey: opts.qkey,
            ah: AddressHandle {
                traffic_class: opts.traffic_class,
                ..AddressHandle::new(remote.gid)
            },
            path_mtu: mtu,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: opts.rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            sq_psn: opts.local_psn,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.rd_atomic,
            ..QpAttr::default()
        };
        for (state, mask) in bring_up_steps(self.qp_type, QpState::Rts) {
            self.modify(&QpAttr { state, ..attr }, mask)?;
        }
        Ok(())
    }

    /// Posts a send WR (`ibv_post_send`) and rings the doorbell: its first packets leave
    /// from this thread before the call returns.
    ///
    /// # Errors
    /// [`PostError`]: nothing was queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        let now = e.now();
        let slot = slot_of(&mut e, self.qpn);
        slot.qp.post_send(now, wr)?;
        self.dev().doorbell(e, self.qpn.value());
        Ok(())
    }

    /// Posts a send WR like [`Self::post_send`], but on an RC QP that already has at least
    /// [`Self::COALESCE_AFTER`] requests outstanding (on a device with an engine thread) it
    /// leaves the sending to the engine: the outstanding requests' ACK (or their timer) wakes
    /// it, and it sends this WR with whatever else was posted meanwhile in one batch. A caller
    /// posting one WR per call in a window (perftest's `ib_*_bw` through `ibv_post_send`) then
    /// costs one datagram batch per ACK instead of one send per WR; a ping-pong (at most one
    /// request outstanding: the latency tests) is sent from this thread at once, exactly as
    /// with `post_send`.
    ///
    /// # Errors
    /// [`PostError`]: nothing was queued.
    pub fn post_send_coalesced(&self, wr: SendWr) -> Result<(), PostError> {
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        let now = e.now();
        let slot = slot_of(&mut e, self.qpn);
        let leave_to_engine = self.leaves_sending_to_engine(&slot.qp);
        slot.qp.post_send(now, wr)?;
        if leave_to_engine {
            return Ok(());
        }
        self.dev().doorbell(e, self.qpn.value());
        Ok(())
    }

    /// Posts several send WRs with one doorbell. Stops at the first refused WR and returns
    /// how many were posted with its error.
    ///
    /// # Errors
    /// `(posted, error)` for the first WR refused.
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<usize, (usize, PostError)> {
        self.post_batch(wrs, false)
    }

    /// Posts several send WRs like [`Self::post_send_batch`], leaving the sending to the
    /// engine as [`Self::post_send_coalesced`] does when the QP already had
    /// [`Self::COALESCE_AFTER`] requests outstanding; otherwise one doorbell sends them all
    /// (their packets leave together: one batch, back to back).
    ///
    /// # Errors
    /// `(posted, error)` for the first WR refused.
    pub fn post_send_batch_coalesced(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<usize, (usize, PostError)> {
        self.post_batch(wrs, true)
    }

    /// [`Self::post_send_batch`], and with `coalesce` [`Self::post_send_batch_coalesced`].
    fn post_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
        coalesce: bool,
    ) -> Result<usize, (usize, PostError)> {
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        let now = e.now();
        let slot = slot_of(&mut e, self.qpn);
        let leave_to_engine = coalesce && self.leaves_sending_to_engine(&slot.qp);
        let mut n = 0;
        let mut err = None;
        for wr in wrs {
            if let Err(x) = slot.qp.post_send(now, wr) {
                err = Some(x);
                break;
            }
            n += 1;
        }
        if !leave_to_engine {
            self.dev().doorbell(e, self.qpn.value());
        }
        match err {
            Some(x) => Err((n, x)),
            None => Ok(n),
        }
    }

    /// Whether a coalesced post to `qp` leaves the sending to the engine thread: an RC QP
    /// with [`Self::COALESCE_AFTER`] requests outstanding, on a device with an engine thread.
    fn leaves_sending_to_engine(&self, qp: &roce_qp::QueuePair) -> bool {
        qp.qp_type() == QpType::Rc
            && qp.send_queue_len() >= Self::COALESCE_AFTER
            && self.dev().shared().progress == crate::Progress::Thread
    }

    /// Posts a receive WR (`ibv_post_recv`).
    ///
    /// # Errors
    /// [`PostError`]: nothing was queued.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.with(|q| q.post_recv(wr))
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let mut e = self.dev().lock_engine_of(self.qpn.value());
        e.remove(self.qpn.value());
        self.dev().free_qpn(self.qpn.value());
        // Packets already built (a deferred final ACK) still go out: the peer is waiting.
        if e.tx_waiting() {
            e.kick();
        }
    }
}

/// The engine slot of the QP `qpn` (under the engine lock the caller holds).
fn slot_of(e: &mut Engine, qpn: Qpn) -> &mut QpSlot {
    e.ep.qps
        .get_mut(&qpn.value())
        // INVARIANT: a QueuePair's slot lives until its drop, which removes it.
        .expect("INVARIANT: a QueuePair's slot lives until its drop")
}

/// The remote rights a QP's access flags may hold: REMOTE_WRITE/READ/ATOMIC and the FLUSH rights.
fn remote_only(a: Access) -> Access {
    let qp_rights = Access::REMOTE
        .union(Access::FLUSH_GLOBAL)
        .union(Access::FLUSH_PERSISTENT);
    Access::from_bits(a.bits() & qp_rights.bits()).unwrap_or(Access::empty())
}
