//! The verbs objects: protection domains, memory regions, completion queues, shared receive
//! queues and queue pairs. All are `Send + Sync` and cheap to share; each keeps its device
//! open, and each is destroyed when dropped (`ibv_dereg_mr`, `ibv_destroy_qp`...).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use roce_mr::{Access, AccessError, Key, Pd};
use roce_qp::state::{AttrMask, QpAttr};
use roce_qp::verbs::{AddressHandle, Completion, Mtu, QpState, QpType, RecvWr, SendWr, Sge};
use roce_qp::{Event, Mem, PostError, QpConfig, QpStats};
use roce_wire::{Gid, LKey, Psn, QKey, Qpn, RKey};

use crate::device::{lock, Device};
use crate::engine::QpSlot;
use crate::error::VerbsError;
use crate::sys::EventFd;

/// An asynchronous event on a QP (`ibv_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The QP.
    pub qpn: Qpn,
    /// What happened.
    pub event: Event,
}

// --------------------------------------------------------------------------- PD --

#[derive(Debug)]
struct PdInner {
    dev: Device,
    pd: Pd,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every MR and QP of the PD holds the PD, so it is unused by now.
        let _ = self.dev.shared().table.dealloc_pd(self.pd);
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Clone, Debug)]
pub struct ProtectionDomain {
    inner: Arc<PdInner>,
}

impl ProtectionDomain {
    pub(crate) fn new(dev: Device) -> Self {
        let pd = dev.shared().table.alloc_pd();
        Self {
            inner: Arc::new(PdInner { dev, pd }),
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Registers `data` (the region owns it) with `access`, at a fresh IOVA
    /// (`ibv_reg_mr`). Read and write it with [`MemoryRegion::read`]/[`MemoryRegion::write`].
    ///
    /// # Errors
    /// [`VerbsError::Register`]: inconsistent access flags, a full key table.
    pub fn register(
        &self,
        data: impl Into<Box<[u8]>>,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        let data = data.into();
        let len = data.len();
        let iova = self.inner.dev.alloc_iova(len);
        let key = self
            .inner
            .dev
            .shared()
            .table
            .register(self.inner.pd, data, iova, access)?;
        Ok(MemoryRegion::new(self.clone(), key, iova, len, access))
    }

    /// Registers `len` zeroed, 8-byte-aligned bytes (atomics need the alignment).
    ///
    /// # Errors
    /// As [`Self::register`].
    pub fn register_zeroed(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let iova = self.inner.dev.alloc_iova(len);
        let key =
            self.inner
                .dev
                .shared()
                .table
                .register_zeroed(self.inner.pd, len, iova, access)?;
        Ok(MemoryRegion::new(self.clone(), key, iova, len, access))
    }

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
        let qpn = dev.alloc_qpn().ok_or_else(|| {
            VerbsError::Io(io::Error::new(
                io::ErrorKind::OutOfMemory,
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
        dev.lock_engine().insert(QpSlot {
            qp,
            send_cq: init.send_cq.shared.clone(),
            recv_cq: init.recv_cq.shared.clone(),
        });
        Ok(QueuePair {
            pd: self.clone(),
            qpn: Qpn::new(qpn),
            qp_type: init.config.qp_type,
        })
    }
}

// --------------------------------------------------------------------------- MR --

/// A registered memory region (`ibv_mr`): its own translation from IOVA to memory, with an
/// lkey and an rkey (equal here). Deregistered when dropped.
#[derive(Debug)]
pub struct MemoryRegion {
    pd: ProtectionDomain,
    key: Key,
    addr: u64,
    len: usize,
    access: Access,
}

impl MemoryRegion {
    fn new(pd: ProtectionDomain, key: Key, addr: u64, len: usize, access: Access) -> Self {
        Self {
            pd,
            key,
            addr,
            len,
            access,
        }
    }

    /// The local key.
    pub fn lkey(&self) -> LKey {
        LKey::new(self.key.0)
    }

    /// The remote key.
    pub fn rkey(&self) -> RKey {
        RKey::new(self.key.0)
    }

    /// The IOVA of the first byte (what peers use as `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }

    /// Copies bytes out of the region.
    ///
    /// # Errors
    /// [`AccessError`] if `offset + dst.len()` passes the end.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), AccessError> {
        self.pd.inner.dev.shared().table.read(self.key, offset, dst)
    }

    /// Copies bytes into the region.
    ///
    /// # Errors
    /// [`AccessError`] if `offset + src.len()` passes the end.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        self.pd
            .inner
            .dev
            .shared()
            .table
            .write(self.key, offset, src)
    }

    /// The whole region's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // INVARIANT: the region is exactly `len` bytes long and alive while `self` is.
        self.read(0, &mut v).expect("INVARIANT: region in bounds");
        v
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self.pd.inner.dev.shared().table.deregister(self.key);
    }
}

// --------------------------------------------------------------------------- CQ --

const NOTIFY_NONE: u8 = 0;
const NOTIFY_ALL: u8 = 1;
const NOTIFY_SOLICITED: u8 = 2;

/// The part of a CQ the engine pushes into.
#[derive(Debug)]
pub(crate) struct CqShared {
    queue: Mutex<roce_qp::cq::CompletionQueue>,
    cond: Condvar,
    /// Threads blocked in [`CompletionQueue::wait`] (a notify with none is a wasted futex call).
    waiters: AtomicUsize,
    armed: AtomicU8,
    event: EventFd,
}

impl CqShared {
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
            || (armed == NOTIFY_SOLICITED
                && (c.solicited || c.status != roce_qp::verbs::WcStatus::Success));
        if fire && self.armed.swap(NOTIFY_NONE, Ordering::AcqRel) != NOTIFY_NONE {
            self.event.notify();
        }
    }
}

/// A completion queue (`ibv_cq`), with a completion channel of its own: arm it with
/// [`Self::req_notify`], and its [`Self::event_fd`] becomes readable at the next completion
/// (register it with epoll/mio), or block in [`Self::get_event`].
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    dev: Device,
    shared: Arc<CqShared>,
}

impl CompletionQueue {
    pub(crate) fn new(dev: Device, depth: usize) -> Result<Self, VerbsError> {
        if depth == 0 || depth > 1 << 20 {
            return Err(VerbsError::BadCqDepth(depth));
        }
        Ok(Self {
            dev,
            shared: Arc::new(CqShared {
                queue: Mutex::new(roce_qp::cq::CompletionQueue::new(depth)),
                cond: Condvar::new(),
                waiters: AtomicUsize::new(0),
                armed: AtomicU8::new(NOTIFY_NONE),
                event: EventFd::new()?,
            }),
        })
    }

    /// Polls up to `out.len()` completions (`ibv_poll_cq`); returns how many. When the CQ is
    /// empty it makes engine progress itself first (busy-polling receive), unless another
    /// thread is doing so.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = lock(&self.shared.queue).poll_many(out);
        if n > 0 || out.is_empty() {
            return n;
        }
        self.dev.try_progress();
        lock(&self.shared.queue).poll_many(out)
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Option<Completion> {
        let mut c = [Completion::EMPTY];
        (self.poll(&mut c) == 1).then_some(c[0])
    }

    /// Waits up to `timeout` for at least one completion; returns how many were stored in
    /// `out` (0 at the timeout).
    pub fn wait(&self, out: &mut [Completion], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
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
                    self.dev.progress_wait(deadline - now);
                }
                crate::Progress::Thread => {
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

    /// Arms the completion channel (`ibv_req_notify_cq`): the next completion (or, with
    /// `solicited_only`, the next solicited or failed one) makes [`Self::event_fd`] readable.
    pub fn req_notify(&self, solicited_only: bool) {
        let mode = if solicited_only {
            NOTIFY_SOLICITED
        } else {
            NOTIFY_ALL
        };
        self.shared.armed.store(mode, Ordering::Release);
        // A completion that arrived before arming does not fire; like verbs, callers poll
        // after arming to catch it.
    }

    /// The completion channel's descriptor: readable when an armed notification fired.
    pub fn event_fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }

    /// Waits up to `timeout` for a notification and consumes it (`ibv_get_cq_event` +
    /// `ibv_ack_cq_events`). Returns whether one came.
    pub fn get_event(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
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
                    self.shared.event.wait(deadline - now);
                }
            }
        }
    }

    /// Whether completions were lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        lock(&self.shared.queue).overflowed()
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

// -------------------------------------------------------------------------- SRQ --

/// A shared receive queue (`ibv_srq`).
#[derive(Clone, Debug)]
pub struct SharedReceiveQueue {
    dev: Device,
    inner: Arc<roce_qp::cq::SharedReceiveQueue>,
}

impl SharedReceiveQueue {
    pub(crate) fn new(dev: Device, max_wr: usize) -> Self {
        Self {
            dev,
            inner: Arc::new(roce_qp::cq::SharedReceiveQueue::new(max_wr)),
        }
    }

    /// Posts a receive WR (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// [`PostError::QueueFull`].
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.inner.post_recv(wr).map_err(|_| PostError::QueueFull)
    }

    /// Arms the limit event (`IBV_SRQ_LIMIT`).
    pub fn arm_limit(&self, limit: usize) {
        self.inner.arm_limit(limit);
    }

    /// Posted WRs not yet consumed.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no WR is posted.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

// --------------------------------------------------------------------------- QP --

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// Its QPN.
    pub qpn: Qpn,
    /// The first PSN it will send.
    pub psn: Psn,
    /// Its GID.
    pub gid: Gid,
}

/// Connection parameters for [`QueuePair::connect`].
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Path MTU (default: the device's active MTU).
    pub mtu: Option<Mtu>,
    /// Our first PSN.
    pub local_psn: Psn,
    /// Remote access we allow.
    pub access: Access,
    /// ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// RNR timer code we advertise.
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
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn dev(&self) -> &Device {
        &self.pd.inner.dev
    }

    fn with<R>(&self, f: impl FnOnce(&mut roce_qp::QueuePair) -> R) -> R {
        let mut e = self.dev().lock_engine();
        let slot = e
            .qps
            .get_mut(&self.qpn.value())
            .expect("INVARIANT: a QueuePair's slot lives until its drop");
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
        let mut e = self.dev().lock_engine();
        let slot = e
            .qps
            .get_mut(&self.qpn.value())
            .expect("INVARIANT: a QueuePair's slot lives until its drop");
        slot.qp.modify(attr, mask)?;
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
        let mut attr = QpAttr {
            state: QpState::Init,
            access_flags: remote_only(opts.access),
            pkey_index: 0,
            port: 1,
            qkey: opts.qkey,
            ..QpAttr::default()
        };
        let init_mask = AttrMask::STATE
            | AttrMask::PKEY_INDEX
            | AttrMask::PORT
            | if self.qp_type == QpType::Ud {
                AttrMask::QKEY
            } else {
                AttrMask::ACCESS_FLAGS
            };
        self.modify(&attr, init_mask)?;
        attr.state = QpState::Rtr;
        let rtr_mask = match self.qp_type {
            QpType::Ud => AttrMask::STATE,
            QpType::Uc => {
                attr.ah = AddressHandle {
                    traffic_class: opts.traffic_class,
                    ..AddressHandle::new(remote.gid)
                };
                attr.path_mtu = mtu;
                attr.dest_qpn = remote.qpn;
                attr.rq_psn = remote.psn;
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
            }
            QpType::Rc => {
                attr.ah = AddressHandle {
                    traffic_class: opts.traffic_class,
                    ..AddressHandle::new(remote.gid)
                };
                attr.path_mtu = mtu;
                attr.dest_qpn = remote.qpn;
                attr.rq_psn = remote.psn;
                attr.max_dest_rd_atomic = opts.rd_atomic;
                attr.min_rnr_timer = opts.min_rnr_timer;
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER
            }
        };
        self.modify(&attr, rtr_mask)?;
        attr.state = QpState::Rts;
        attr.sq_psn = opts.local_psn;
        let rts_mask = match self.qp_type {
            QpType::Rc => {
                attr.timeout = opts.timeout;
                attr.retry_cnt = opts.retry_cnt;
                attr.rnr_retry = opts.rnr_retry;
                attr.max_rd_atomic = opts.rd_atomic;
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC
            }
            _ => AttrMask::STATE | AttrMask::SQ_PSN,
        };
        self.modify(&attr, rts_mask)
    }

    /// Posts a send WR (`ibv_post_send`) and rings the doorbell: its first packets leave
    /// from this thread before the call returns.
    ///
    /// # Errors
    /// [`PostError`]: nothing was queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let mut e = self.dev().lock_engine();
        let now = e.now();
        let slot = e
            .qps
            .get_mut(&self.qpn.value())
            .expect("INVARIANT: a QueuePair's slot lives until its drop");
        slot.qp.post_send(now, wr)?;
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
        let mut e = self.dev().lock_engine();
        let now = e.now();
        let slot = e
            .qps
            .get_mut(&self.qpn.value())
            .expect("INVARIANT: a QueuePair's slot lives until its drop");
        let mut n = 0;
        let mut err = None;
        for wr in wrs {
            if let Err(x) = slot.qp.post_send(now, wr) {
                err = Some(x);
                break;
            }
            n += 1;
        }
        self.dev().doorbell(e, self.qpn.value());
        match err {
            Some(x) => Err((n, x)),
            None => Ok(n),
        }
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
        let mut e = self.dev().lock_engine();
        e.remove(self.qpn.value());
        self.dev().free_qpn(self.qpn.value());
        // Packets already built (a deferred final ACK) still go out: the peer is waiting.
        if e.tx_waiting() {
            e.kick();
        }
    }
}

/// Remote access bits only (what a QP's access flags may hold).
fn remote_only(a: Access) -> Access {
    Access::from_bits(a.bits() & Access::REMOTE.bits()).unwrap_or(Access::empty())
}
