//! Contexts (`ibv_open_device`, `ibv_close_device`), device and port queries, GIDs, P_Keys,
//! async events. OWNER: helper "device" (see verbs/OWNERS while the crate is being built).
//!
//! # Opening
//!
//! `ibv_open_device` starts the rocectl engine for the device
//! (`roce_transport::Device::open(DeviceConfig::udp(addr))`, with its progress thread); a
//! second context on the same device in the same process shares that engine (the UDP port
//! can be bound once per address), and the engine stops when the last context closes.
//!
//! # Engines
//!
//! The drop-in runs its device on one engine ([`DeviceConfig::engines`]`(1)`, explicitly) and
//! does not read `ROCECTL_ENGINES`, which only the `rocectl` CLI tools read. The transport's
//! own tests run every verb across engines, but the stock-tool suites that prove the drop-in
//! (the lab, pyverbs, UCX, perftest through the daemon) have only run it on one: turning it
//! on is a change to make with those suites, not a side effect of a variable meant for the
//! CLI. (Through the daemon a device runs one engine anyway.)
//!
//! # Async events
//!
//! Each context has a queue of pending events and an `eventfd` in semaphore mode as
//! `async_fd`: its counter is the number of queued events, so the descriptor is readable
//! exactly while an event waits, `ibv_get_async_event` reads it (blocking, or failing with
//! `EAGAIN` when the application set `O_NONBLOCK`) and then takes one event. The engine
//! hands events to the device's dispatcher (`roce_transport::Device::set_async_event_hook`,
//! under the engine lock), which gives each to the context that owns the QP (`qps`, filled
//! by the QP module) and counts it on that context's descriptor. An event of a QP no
//! context knows (destroyed meanwhile) is dropped.
//!
//! Lock order: engine → the dispatcher's context list → a context's `qps` → its event
//! queue. Never call into the transport while holding `qps`.
//!
//! # Command descriptor and import
//!
//! Each context's `cmd_fd` is a memfd of its own (close-on-exec) that identifies it: there is
//! no kernel command channel, but `ibv_import_device(3)` takes a dup of it (`dup`,
//! `SCM_RIGHTS` within the process) and finds the context by the descriptor's file identity
//! (`st_dev`, `st_ino`, not its number), then returns a new context on the same engine, which
//! owns the descriptor it was given and closes it in `ibv_close_device`. Import works within
//! one process only (the engine lives in it): a descriptor from another process matches no
//! context here and fails with `ENODEV`.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use roce_transport::netdev;
use roce_transport::{AsyncEvent, DeviceConfig, Event, Mtu, OpenError};

use crate::device::DeviceRec;
use crate::ffi;
use crate::sys::{
    __be16, ibv_async_event, ibv_context, ibv_device, ibv_device_attr, ibv_device_attr_ex, ibv_gid,
    ibv_gid_entry, ibv_port_attr, ibv_qp, ibv_query_device_ex_input, ibv_srq, verbs_context,
};
use crate::sys::{
    ibv_atomic_cap_IBV_ATOMIC_HCA as ATOMIC_HCA,
    ibv_device_cap_flags_IBV_DEVICE_RC_RNR_NAK_GEN as RC_RNR_NAK_GEN,
    ibv_device_cap_flags_IBV_DEVICE_SYS_IMAGE_GUID as SYS_IMAGE_GUID,
    ibv_event_type_IBV_EVENT_CQ_ERR as EV_CQ_ERR, ibv_event_type_IBV_EVENT_QP_FATAL as EV_QP_FATAL,
    ibv_event_type_IBV_EVENT_QP_REQ_ERR as EV_QP_REQ_ERR,
    ibv_event_type_IBV_EVENT_SQ_DRAINED as EV_SQ_DRAINED,
    ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED as EV_SRQ_LIMIT,
    ibv_gid_type_IBV_GID_TYPE_ROCE_V2 as GID_TYPE_ROCE_V2, ibv_mtu_IBV_MTU_4096 as MTU_4096,
    ibv_port_cap_flags_IBV_PORT_CM_SUP as PORT_CM_SUP,
    ibv_port_cap_flags_IBV_PORT_IP_BASED_GIDS as PORT_IP_BASED_GIDS,
    ibv_port_state_IBV_PORT_ACTIVE as PORT_ACTIVE, ibv_port_state_IBV_PORT_DOWN as PORT_DOWN,
    IBV_LINK_LAYER_ETHERNET,
};

/// `fw_ver` of every device (`ibv_devinfo`'s line, and the sysfs file).
pub(crate) const FW_VER: &str = concat!(env!("CARGO_PKG_VERSION"), " rocectl");
/// `vendor_id`: rdma_rxe's. Not 5157 (Chelsio) nor 0x8086 (Intel), which send perftest down
/// vendor paths.
const VENDOR_ID: u32 = 0x00FF_FFFF;
/// The sysfs GID type enum (`enum ibv_gid_type_sysfs` of rdma-core's driver.h): RoCE v2.
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// `IB_PORT_PHYS_STATE_*` as rdma_rxe reports them.
const PHYS_LINK_UP: u8 = 5;
const PHYS_POLLING: u8 = 2;
const PHYS_DISABLED: u8 = 3;
/// The default P_Key, the only entry of the P_Key table.
const DEFAULT_PKEY: u16 = 0xFFFF;
/// Size of the exported `ibv_query_port`'s `struct _compat_ibv_port_attr` (libibverbs/verbs.c):
/// `struct ibv_port_attr` without `port_cap_flags2` and the tail padding.
const COMPAT_PORT_ATTR_LEN: usize = 48;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A rocectl device open in this process, shared by every context of one device record.
pub(crate) struct OpenDevice {
    /// The engine.
    pub(crate) dev: roce_transport::Device,
    dispatch: Arc<Dispatch>,
}

/// Routes the engine's events to the contexts (runs under the engine lock).
#[derive(Default)]
struct Dispatch {
    contexts: Mutex<Vec<Weak<AsyncQueue>>>,
}

impl Dispatch {
    fn deliver(&self, ev: AsyncEvent) {
        let qpn = ev.qpn.value();
        let contexts = lock(&self.contexts);
        for q in contexts.iter().filter_map(Weak::upgrade) {
            if lock(&q.qps).contains_key(&qpn) {
                q.push(ev);
                return;
            }
        }
        ffi::trace(format_args!(
            "async event {ev:?} of a QP no context knows: dropped"
        ));
    }
}

/// One context's pending async events and its `async_fd`.
struct AsyncQueue {
    qps: Arc<Mutex<HashMap<u32, usize>>>,
    pending: Mutex<VecDeque<AsyncEvent>>,
    /// eventfd, semaphore mode: the counter is `pending.len()`.
    fd: OwnedFd,
}

impl AsyncQueue {
    fn new(qps: Arc<Mutex<HashMap<u32, usize>>>) -> Result<Self, i32> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        Ok(Self {
            qps,
            pending: Mutex::new(VecDeque::new()),
            // SAFETY: `fd` is fresh from eventfd and owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Queues `ev` and makes the descriptor readable once more.
    fn push(&self, ev: AsyncEvent) {
        lock(&self.pending).push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. It cannot block or fail
        // short of 2^64-2 unread events.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                std::ptr::from_ref(&one).cast(),
                size_of::<u64>(),
            )
        };
    }
}

/// An open device: `verbs_context` (the application sees `&vctx.context`, 320 bytes in) and
/// the rocectl device behind it.
#[repr(C)]
pub(crate) struct ContextRec {
    /// Must stay the first field: `ibv_context` pointers are `&vctx.context`.
    pub(crate) vctx: verbs_context,
    /// The engine this context drives.
    pub(crate) dev: roce_transport::Device,
    /// QPN -> the `ibv_qp` handed out (as `usize`), for async events (`element.qp`). The
    /// QP module inserts on create and removes on destroy (never while calling into the
    /// transport: the engine locks it while routing an event).
    pub(crate) qps: Arc<Mutex<HashMap<u32, usize>>>,
    /// `ibv_srq` pointers (as `usize`) of this context, for SRQ async events.
    pub(crate) srqs: Mutex<Vec<usize>>,
    /// The device this context was opened on.
    pub(crate) device: &'static DeviceRec,
    events: Arc<AsyncQueue>,
    open: Arc<OpenDevice>,
    /// `cmd_fd`: a memfd identifying the context (module doc, "Command descriptor").
    cmd: OwnedFd,
}

/// The open contexts by the identity of their `cmd_fd`, for `ibv_import_device`:
/// (`st_dev`, `st_ino`, the `ContextRec` address). A context is listed from its creation
/// until `ibv_close_device` removes it (under this lock, before freeing it).
static CONTEXTS: Mutex<Vec<(u64, u64, usize)>> = Mutex::new(Vec::new());

/// The file identity (`st_dev`, `st_ino`) of descriptor `fd`, or the errno of `fstat`.
fn fd_identity(fd: c_int) -> Result<(u64, u64), i32> {
    // SAFETY: C data, all zeroes valid; filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live stat struct; fstat checks `fd` itself (EBADF).
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF));
    }
    Ok((st.st_dev, st.st_ino))
}

/// A fresh memfd for a context's `cmd_fd` (close-on-exec).
fn new_cmd_fd() -> Result<OwnedFd, i32> {
    // SAFETY: a NUL-terminated name; a negative return is an error.
    let fd = unsafe { libc::memfd_create(c"rocectl-verbs-context".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: `fd` is fresh from memfd_create and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl ContextRec {
    /// The record behind an `ibv_context` this library handed out; `None` for NULL.
    ///
    /// # Safety
    /// `ctx` is NULL or a context from [`ibv_open_device`] that is still open.
    pub(crate) unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> Option<&'a Self> {
        // SAFETY: per the contract, the pointer is into a live record.
        unsafe { Self::rec_ptr(ctx).map(|p| &*p) }
    }

    /// The record's address, from its context pointer.
    ///
    /// # Safety
    /// As [`Self::from_ibv`].
    unsafe fn rec_ptr(ctx: *mut ibv_context) -> Option<*mut Self> {
        if ctx.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(Self, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` points `off` bytes into a live `ContextRec`.
        Some(unsafe { ctx.cast::<u8>().sub(off).cast::<Self>() })
    }

    /// The `ibv_context` pointer applications hold.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        std::ptr::from_ref(&self.vctx.context).cast_mut()
    }

    /// Identifies the engine this context drives: equal for the contexts of one device (an
    /// imported context and the one it was imported from), different otherwise.
    pub(crate) fn engine_id(&self) -> usize {
        Arc::as_ptr(&self.open) as usize
    }
}

/// The shared engine of `rec`, opened if no context holds it.
fn open_shared(rec: &'static DeviceRec) -> Result<Arc<OpenDevice>, i32> {
    let mut slot = lock(&rec.open);
    if let Some(open) = slot.upgrade() {
        return Ok(open);
    }
    // One engine, whatever ROCECTL_ENGINES says (module docs, "Engines").
    let config = DeviceConfig::udp(rec.addr)
        .name(rec.spec.name.clone())
        .engines(1);
    let dev = roce_transport::Device::open(config).map_err(|e| {
        // The transport's hint for this one names the rocectl CLI's flags.
        let why = match &e {
            OpenError::AddrNotAvailable { addr } => format!(
                "{} is not an address of this host (configure it, or change the device's \
                 @ADDR in {} or the configuration file)",
                addr.ip(),
                crate::device::DEVICES_ENV
            ),
            other => other.to_string(),
        };
        eprintln!(
            "rocectl libibverbs: cannot open {} (interface {}, address {}): {why}",
            rec.spec.name, rec.spec.ifname, rec.addr
        );
        ffi::errno_of_open(&e)
    })?;
    let open = OpenDevice::new(dev);
    *slot = Arc::downgrade(&open);
    Ok(open)
}

impl OpenDevice {
    /// Wraps an open engine, its async events routed to the contexts.
    fn new(dev: roce_transport::Device) -> Arc<Self> {
        let dispatch = Arc::new(Dispatch::default());
        let d = dispatch.clone();
        dev.set_async_event_hook(move |ev| d.deliver(ev));
        Arc::new(Self { dev, dispatch })
    }
}

/// `ibv_open_device(3)`: a context on `device`, its engine running. NULL with `errno` when
/// the device is not one of this library's (`EINVAL`) or cannot be opened (`EADDRINUSE`,
/// `EADDRNOTAVAIL`, ...; one line on stderr says why).
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    ffi::guard_ptr("ibv_open_device", || {
        let rec = DeviceRec::from_ibv(device).ok_or(libc::EINVAL)?;
        let open = open_shared(rec)?;
        new_context(rec, open, None).map_err(|(e, _)| e)
    })
}

/// `ibv_import_device(3)` (IBVERBS_1.10): a new context on the engine of the open context whose
/// `cmd_fd` is the same file as `cmd_fd` (a dup of it, module doc). The new context owns
/// `cmd_fd` and closes it in `ibv_close_device`. NULL with `errno`: `EBADF` (not a
/// descriptor), `ENODEV` (no open context of this process has it).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    ffi::guard_ptr("ibv_import_device", || {
        let (dev, ino) = fd_identity(cmd_fd)?;
        let (device, open) = {
            let list = lock(&CONTEXTS);
            let &(_, _, p) = list
                .iter()
                .find(|(d, i, _)| (*d, *i) == (dev, ino))
                .ok_or(libc::ENODEV)?;
            // SAFETY: a listed context is live: `ibv_close_device` unlists it under this
            // lock before freeing it.
            let r = unsafe { &*(p as *const ContextRec) };
            (r.device, r.open.clone())
        };
        // SAFETY: the caller hands the descriptor over (ibv_import_device(3): the context may
        // close it); it is open (fstat succeeded).
        let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
        new_context(device, open, Some(fd)).map_err(|(e, fd)| {
            // Failed: the descriptor stays the caller's.
            if let Some(fd) = fd {
                let _ = fd.into_raw_fd();
            }
            e
        })
    })
}

/// A new context of `rec` on its open engine, with `cmd` as its `cmd_fd` (a fresh memfd when
/// `None`). On failure `cmd` is handed back.
fn new_context(
    rec: &'static DeviceRec,
    open: Arc<OpenDevice>,
    cmd: Option<OwnedFd>,
) -> Result<*mut ibv_context, (i32, Option<OwnedFd>)> {
    let qps = Arc::new(Mutex::new(HashMap::new()));
    let events = match AsyncQueue::new(qps.clone()) {
        Ok(q) => Arc::new(q),
        Err(e) => return Err((e, cmd)),
    };
    let cmd = match cmd {
        Some(fd) => fd,
        None => new_cmd_fd().map_err(|e| (e, None))?,
    };
    let identity = fd_identity(cmd.as_raw_fd()).map_err(|e| (e, None))?;
    let b = Box::new(ContextRec {
        // SAFETY: verbs_context is C data (pointers, integers, `Option<fn>`s, a pthread
        // mutex initialised below): all zeroes is valid.
        vctx: unsafe { std::mem::zeroed() },
        dev: open.dev.clone(),
        qps,
        srqs: Mutex::new(Vec::new()),
        device: rec,
        events: events.clone(),
        open: open.clone(),
        cmd,
    });
    let p = Box::into_raw(b);
    // SAFETY: `p` is the live record just leaked; nothing else refers to it yet.
    let r = unsafe { &mut *p };
    let c = &mut r.vctx.context;
    c.device = rec.ibv();
    c.cmd_fd = r.cmd.as_raw_fd();
    c.async_fd = events.fd.as_raw_fd();
    c.num_comp_vectors = 1;
    // SAFETY: the mutex is in the boxed record, which does not move until it is freed.
    unsafe { libc::pthread_mutex_init(std::ptr::from_mut(&mut c.mutex).cast(), std::ptr::null()) };
    crate::install_ops(&mut r.vctx);
    lock(&open.dispatch.contexts).push(Arc::downgrade(&events));
    lock(&CONTEXTS).push((identity.0, identity.1, p as usize));
    ffi::trace(format_args!(
        "opened {} on {}",
        rec.spec.name,
        open.dev.local_addr()
    ));
    Ok(r.ibv())
}

/// For unit tests of the other modules: a context exactly as `ibv_open_device` makes it,
/// around an already open `dev` (a `sim` device, say), under a device record named after
/// it. Close it with [`ibv_close_device`].
#[cfg(test)]
pub(crate) fn open_test_context(dev: roce_transport::Device) -> *mut ibv_context {
    let rec = crate::device::test_record(dev.name(), dev.local_addr().ip());
    let open = OpenDevice::new(dev);
    *lock(&rec.open) = Arc::downgrade(&open);
    // INVARIANT: only an eventfd can fail here; a test may panic on it.
    new_context(rec, open, None).expect("eventfd for async_fd")
}

/// `ibv_close_device(3)`: frees the context; the engine stops with the last context of the
/// device. The application must have destroyed the context's objects first.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    ffi::guard_int("ibv_close_device", || {
        // SAFETY: `context` is NULL or an open context of this library.
        let p = unsafe { ContextRec::rec_ptr(context) }.ok_or(libc::EINVAL)?;
        lock(&CONTEXTS).retain(|&(_, _, c)| c != p as usize);
        // SAFETY: the record came from Box::into_raw in ibv_open_device; closing it twice is
        // the application's bug, as with rdma-core. Unlisted above, so no import reaches it.
        let mut b = unsafe { Box::from_raw(p) };
        lock(&b.open.dispatch.contexts)
            .retain(|w| w.strong_count() > 0 && !w.ptr_eq(&Arc::downgrade(&b.events)));
        // SAFETY: initialised in ibv_open_device, no longer used.
        unsafe {
            libc::pthread_mutex_destroy(std::ptr::from_mut(&mut b.vctx.context.mutex).cast())
        };
        drop(b);
        Ok(())
    })
}

// --------------------------------------------------------------------- queries --

/// The record of an `int` verb's context, or `EINVAL`.
fn ctx_of<'a>(ctx: *mut ibv_context) -> Result<&'a ContextRec, i32> {
    // SAFETY: the verbs' contract: NULL or a live context of this library.
    unsafe { ContextRec::from_ibv(ctx) }.ok_or(libc::EINVAL)
}

/// The device attributes (rdma_rxe's values where rocectl has no limit of its own).
fn device_attr(rec: &ContextRec) -> ibv_device_attr_ex {
    let a = rec.dev.query_device();
    let clamp = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    // SAFETY: plain C data; all zeroes is valid.
    let mut x: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    let o = &mut x.orig_attr;
    for (d, s) in o.fw_ver.iter_mut().zip(FW_VER.bytes()) {
        *d = s as std::ffi::c_char;
    }
    o.node_guid = rec.device.node_guid.to_be();
    o.sys_image_guid = rec.device.node_guid.to_be();
    o.max_mr_size = u64::MAX;
    o.page_size_cap = 0xFFFF_F000;
    o.vendor_id = VENDOR_ID;
    o.vendor_part_id = 0;
    o.hw_ver = 0;
    o.max_qp = clamp(a.max_qp);
    o.max_qp_wr = clamp(a.max_qp_wr);
    o.device_cap_flags = SYS_IMAGE_GUID | RC_RNR_NAK_GEN;
    o.max_sge = clamp(a.max_sge);
    o.max_sge_rd = clamp(a.max_sge);
    o.max_cq = 1 << 20;
    o.max_cqe = clamp(a.max_cqe);
    o.max_mr = clamp(a.max_mr);
    o.max_pd = 1 << 20;
    o.max_qp_rd_atom = clamp(a.max_qp_rd_atom);
    o.max_res_rd_atom = clamp(a.max_qp_rd_atom.saturating_mul(a.max_qp));
    o.max_qp_init_rd_atom = clamp(a.max_qp_init_rd_atom);
    o.atomic_cap = ATOMIC_HCA;
    o.max_ah = 1 << 20;
    o.max_srq = 1 << 20;
    o.max_srq_wr = clamp(a.max_qp_wr);
    o.max_srq_sge = clamp(a.max_sge);
    o.max_pkeys = 1;
    o.local_ca_ack_delay = 15;
    o.phys_port_cnt = 1;
    // No optional attribute group is reported (no ODP, timestamps, TSO, RSS...).
    x.comp_mask = 0;
    x.device_cap_flags_ex = u64::from(o.device_cap_flags) | a.device_cap_flags_ex.bits();
    x.phys_port_cnt_ex = 1;
    // Device memory in ordinary memory (crate::dm).
    x.max_dm_size = crate::dm::MAX_DM_SIZE;
    x
}

/// `ibv_query_device(3)`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr_out: *mut ibv_device_attr,
) -> c_int {
    ffi::guard_int("ibv_query_device", || {
        let rec = ctx_of(context)?;
        if device_attr_out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct, non-NULL.
        unsafe { *device_attr_out = device_attr(rec).orig_attr };
        Ok(())
    })
}

/// `verbs_context.query_device_ex` (what the inline `ibv_query_device_ex` calls): writes
/// `min(attr_size, sizeof(struct ibv_device_attr_ex))` bytes and zeroes the rest of the
/// caller's `attr_size`.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi::guard_int("ibv_query_device_ex", || {
        let rec = ctx_of(ctx)?;
        // SAFETY: NULL or the caller's input struct.
        if unsafe { input.as_ref() }.is_some_and(|i| i.comp_mask != 0) {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        let x = device_attr(rec);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer has `attr_size` bytes; we write `n` <= attr_size from
        // our struct, then zero the rest.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&x).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            );
            std::ptr::write_bytes(attr.cast::<u8>().add(n), 0, attr_size - n);
        }
        Ok(())
    })
}

/// Port 1's attributes, the interface read now (state, MTU) as rdma_rxe reports them.
fn port_attr(rec: &ContextRec) -> ibv_port_attr {
    let t = rec.dev.query_port();
    let live = netdev::interface(&rec.device.spec.ifname).ok();
    // SAFETY: plain C data; all zeroes is valid.
    let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
    let (up, active) = live
        .as_ref()
        .map_or((false, false), |d| (d.up, d.up && d.running));
    p.state = if active { PORT_ACTIVE } else { PORT_DOWN };
    p.phys_state = match (active, up) {
        (true, _) => PHYS_LINK_UP,
        (false, true) => PHYS_POLLING,
        (false, false) => PHYS_DISABLED,
    };
    p.max_mtu = MTU_4096;
    // rxe: the interface MTU less 80 bytes of headers, rounded down to an IB MTU, 256 at
    // least; never above what this engine was opened with.
    let mtu = live.map_or(t.active_mtu, |d| {
        Mtu::for_netdev_mtu(d.mtu as usize)
            .unwrap_or(Mtu::Mtu256)
            .min(t.max_mtu)
    });
    p.active_mtu = mtu as u32;
    p.gid_tbl_len = c_int::try_from(t.gid_tbl_len).unwrap_or(c_int::MAX);
    p.port_cap_flags = PORT_CM_SUP | PORT_IP_BASED_GIDS;
    p.max_msg_sz = 1 << 31;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 1; // IBV_WIDTH_1X, as rxe on a link of unknown speed
    p.active_speed = 1; // IBV_SPEED_SDR (2.5 Gbps)
    p.link_layer = IBV_LINK_LAYER_ETHERNET as u8;
    p
}

/// `ibv_query_port@IBVERBS_1.1`, the exported function behind the `ibv_query_port` macro
/// for contexts without `verbs_context.query_port`: fills rdma-core's 48-byte
/// `struct _compat_ibv_port_attr` (no `port_cap_flags2`), not one byte more.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
) -> c_int {
    ffi::guard_int("ibv_query_port", || {
        let rec = ctx_of(context)?;
        if port_num != 1 || port_attr_out.is_null() {
            return Err(libc::EINVAL);
        }
        let p = port_attr(rec);
        // SAFETY: the caller's struct is at least the 48-byte compat struct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&p).cast::<u8>(),
                port_attr_out.cast::<u8>(),
                COMPAT_PORT_ATTR_LEN,
            );
        }
        Ok(())
    })
}

/// `verbs_context.query_port` (what the `ibv_query_port` macro calls): as rdma-core's
/// `__lib_query_port`, writes `min(port_attr_len, sizeof(struct ibv_port_attr))` bytes and
/// zeroes the rest of the caller's length.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    ffi::guard_int("ibv_query_port", || {
        let rec = ctx_of(ctx)?;
        if port != 1 || attr.is_null() {
            return Err(libc::EINVAL);
        }
        let p = port_attr(rec);
        let n = len.min(size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer has `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&p).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            );
            std::ptr::write_bytes(attr.cast::<u8>().add(n), 0, len - n);
        }
        Ok(())
    })
}

/// The GID at `index` of port `port`, or `None`.
fn gid_at(rec: &ContextRec, port: u32, index: u32) -> Option<ibv_gid> {
    if port != 1 {
        return None;
    }
    let g = rec.dev.gid(u8::try_from(index).ok()?).ok()?;
    // SAFETY: `ibv_gid` is a 16-byte union of byte arrays and integers.
    let mut out: ibv_gid = unsafe { std::mem::zeroed() };
    out.raw = g.0;
    Some(out)
}

fn gid_entry(rec: &ContextRec, index: u32) -> Option<ibv_gid_entry> {
    Some(ibv_gid_entry {
        gid: gid_at(rec, 1, index)?,
        gid_index: index,
        port_num: 1,
        gid_type: GID_TYPE_ROCE_V2,
        ndev_ifindex: rec.device.ifindex,
    })
}

/// `ibv_query_gid(3)`: 0, or -1 for a port or index past the table.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi::guard("ibv_query_gid", -1, || {
        let Ok(rec) = ctx_of(context) else { return -1 };
        let Ok(index) = u32::try_from(index) else {
            return -1;
        };
        match gid_at(rec, u32::from(port_num), index) {
            Some(g) if !gid.is_null() => {
                // SAFETY: the caller's GID, non-NULL.
                unsafe { *gid = g };
                0
            }
            _ => -1,
        }
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex(3)`): the entry, `entry_size`
/// bytes of it (zero-filled past ours); `EINVAL` for a port or index past the table,
/// `EOPNOTSUPP` for any flag.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi::guard_int("ibv_query_gid_ex", || {
        let rec = ctx_of(context)?;
        if flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if port_num != 1 || entry.is_null() {
            return Err(libc::EINVAL);
        }
        let e = gid_entry(rec, gid_index).ok_or(libc::EINVAL)?;
        // SAFETY: the caller's entry has `entry_size` bytes.
        unsafe { write_entry(&e, entry.cast(), entry_size) };
        Ok(())
    })
}

/// Writes `e` into `size` bytes at `dst`, zero-filling past our struct.
///
/// # Safety
/// `dst` is valid for `size` bytes.
unsafe fn write_entry(e: &ibv_gid_entry, dst: *mut u8, size: usize) {
    let n = size.min(size_of::<ibv_gid_entry>());
    // SAFETY: per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(e).cast::<u8>(), dst, n);
        std::ptr::write_bytes(dst.add(n), 0, size - n);
    }
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table(3)`): the number of
/// entries written (`entry_size` apart), or a negative errno (`-EINVAL` when they do not
/// fit in `max_entries` or `entry_size` is too small, `-EOPNOTSUPP` for any flag).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi::guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        let Ok(rec) = ctx_of(context) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 {
            return -(libc::EOPNOTSUPP as isize);
        }
        let table = rec.dev.gid_table();
        if entry_size < size_of::<ibv_gid_entry>()
            || table.len() > max_entries
            || entries.is_null() && !table.is_empty()
        {
            return -(libc::EINVAL as isize);
        }
        for (i, _) in table.iter().enumerate() {
            let Some(e) = gid_entry(rec, i as u32) else {
                return -(libc::EINVAL as isize);
            };
            // SAFETY: the caller's array has `max_entries` entries of `entry_size` bytes and
            // i < table.len() <= max_entries.
            unsafe { write_entry(&e, entries.cast::<u8>().add(i * entry_size), entry_size) };
        }
        table.len() as isize
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by `ibv_devinfo`): the *sysfs* GID type,
/// 1 (RoCE v2) for every entry; 0, or -1 for a port or index past the table.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    ffi::guard("ibv_query_gid_type", -1, || {
        let Ok(rec) = ctx_of(context) else { return -1 };
        if gid_type.is_null() || gid_at(rec, u32::from(port_num), index).is_none() {
            return -1;
        }
        // SAFETY: the caller's enum, non-NULL.
        unsafe { *gid_type = GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

/// `ibv_query_pkey(3)`: the default P_Key 0xffff at index 0 of port 1; -1 otherwise.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    ffi::guard("ibv_query_pkey", -1, || {
        if ctx_of(context).is_err() || port_num != 1 || index != 0 || pkey.is_null() {
            return -1;
        }
        // SAFETY: the caller's P_Key, non-NULL.
        unsafe { *pkey = DEFAULT_PKEY.to_be() };
        0
    })
}

/// `ibv_get_pkey_index(3)`: the index of `pkey` (network order) in port `port_num`'s table,
/// -1 when absent (rdma-core's loop over `ibv_query_pkey`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: __be16,
) -> c_int {
    ffi::guard("ibv_get_pkey_index", -1, || {
        let mut i = 0;
        loop {
            let mut p: __be16 = 0;
            // SAFETY: forwards the caller's context; `p` is a live local.
            if unsafe { ibv_query_pkey(context, port_num, i, &mut p) } < 0 {
                return -1;
            }
            if p == pkey {
                return i;
            }
            i += 1;
        }
    })
}

// ----------------------------------------------------------------- async events --

/// Maps a transport event to its `ibv_event_type` and element; `None` when the QP (or its
/// SRQ) is gone or the event has no verbs counterpart.
fn to_ibv_event(rec: &ContextRec, ev: AsyncEvent) -> Option<ibv_async_event> {
    let qp = *lock(&rec.qps).get(&ev.qpn.value())? as *mut ibv_qp;
    // SAFETY: plain C data; all zeroes is valid.
    let mut out: ibv_async_event = unsafe { std::mem::zeroed() };
    match ev.event {
        Event::QpFatal(_) => out.event_type = EV_QP_FATAL,
        Event::SqDrained => out.event_type = EV_SQ_DRAINED,
        Event::SendQueueError => out.event_type = EV_QP_REQ_ERR,
        Event::SrqLimitReached => {
            // SAFETY: `qp` is in `qps`, so the QP module has not destroyed it.
            let srq: *mut ibv_srq = unsafe { (*qp).srq };
            if srq.is_null() {
                return None;
            }
            out.event_type = EV_SRQ_LIMIT;
            out.element.srq = srq;
            return Some(out);
        }
        #[allow(unreachable_patterns)]
        _ => return None,
    }
    out.element.qp = qp;
    Some(out)
}

/// `ibv_get_async_event(3)`: the next asynchronous event of the context. Reads `async_fd`,
/// so it blocks until an event arrives, or returns -1 with `errno = EAGAIN` when the
/// application made the descriptor non-blocking and none is waiting.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ffi::guard("ibv_get_async_event", -1, || {
        let rec = match ctx_of(context) {
            Ok(r) if !event.is_null() => r,
            _ => {
                ffi::set_errno(libc::EINVAL);
                return -1;
            }
        };
        loop {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our eventfd (semaphore mode: takes
            // one event's count).
            let n = unsafe {
                libc::read(
                    rec.events.fd.as_raw_fd(),
                    std::ptr::from_mut(&mut count).cast(),
                    size_of::<u64>(),
                )
            };
            if n != size_of::<u64>() as isize {
                return -1; // errno from read: EAGAIN when non-blocking, EINTR...
            }
            let Some(ev) = lock(&rec.events.pending).pop_front() else {
                continue;
            };
            if let Some(e) = to_ibv_event(rec, ev) {
                // SAFETY: the caller's event struct, non-NULL.
                unsafe { *event = e };
                return 0;
            }
        }
    })
}

/// `ibv_ack_async_event(3)`: counts the event on its object (`events_completed` under the
/// object's mutex, with a signal), as rdma-core does, so a destroy waiting for it can go on.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    ffi::guard("ibv_ack_async_event", (), || {
        // SAFETY: NULL or the event ibv_get_async_event filled.
        let Some(e) = (unsafe { event.as_ref() }) else {
            return;
        };
        // SAFETY: the element is the live object the event named (the application acks
        // before destroying it); its mutex and cond were initialised at creation.
        unsafe {
            match e.event_type {
                EV_CQ_ERR => {
                    let cq = e.element.cq;
                    if let Some(cq) = cq.as_mut() {
                        bump(&mut cq.mutex, &mut cq.cond, &mut cq.async_events_completed);
                    }
                }
                EV_SRQ_LIMIT | crate::sys::ibv_event_type_IBV_EVENT_SRQ_ERR => {
                    if let Some(srq) = e.element.srq.as_mut() {
                        bump(&mut srq.mutex, &mut srq.cond, &mut srq.events_completed);
                    }
                }
                // QP_FATAL .. PATH_MIG_ERR and QP_LAST_WQE_REACHED: the QP events.
                1..=7 | 16 => {
                    if let Some(qp) = e.element.qp.as_mut() {
                        bump(&mut qp.mutex, &mut qp.cond, &mut qp.events_completed);
                    }
                }
                _ => {}
            }
        }
    });
}

/// `++*counter` under `mutex`, then signals `cond`.
///
/// # Safety
/// The three belong to a live object whose mutex and cond are initialised.
unsafe fn bump(
    mutex: &mut crate::sys::pthread_mutex_t,
    cond: &mut crate::sys::pthread_cond_t,
    counter: &mut u32,
) {
    let m = std::ptr::from_mut(mutex).cast::<libc::pthread_mutex_t>();
    // SAFETY: per the contract.
    unsafe {
        libc::pthread_mutex_lock(m);
        *counter += 1;
        libc::pthread_cond_signal(std::ptr::from_mut(cond).cast());
        libc::pthread_mutex_unlock(m);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use roce_testkit::netns::{netns_or_skip, TempNetns};
    use roce_transport::{
        Access, Completion, ConnectOptions, Psn, QpInit, QpType, Qpn, RemoteQp, SendOp, SendWr,
        WcStatus,
    };

    use super::*;
    use crate::device::{record, DeviceSpec};

    #[test]
    fn the_compat_port_attr_is_the_first_48_bytes() {
        assert_eq!(
            std::mem::offset_of!(ibv_port_attr, port_cap_flags2),
            COMPAT_PORT_ATTR_LEN
        );
        assert_eq!(size_of::<ibv_port_attr>(), 52);
    }

    /// The constructor the other modules' unit tests use: a context on a `sim` device, as
    /// `ibv_open_device` makes them.
    #[test]
    fn a_test_context_on_a_sim_device() {
        let net = roce_transport::SimNetwork::perfect();
        let config = DeviceConfig::sim(&net, "10.66.0.1".parse().unwrap()).name("sim_ctx");
        let dev = roce_transport::Device::open(config).unwrap();
        let ctx = open_test_context(dev);
        // SAFETY: just opened.
        let rec = unsafe { ContextRec::from_ibv(ctx) }.unwrap();
        let c = &rec.vctx.context;
        assert!(c.cmd_fd >= 0);
        assert_eq!(c.num_comp_vectors, 1);
        assert!(c.async_fd >= 0);
        assert_eq!(c.abi_compat as usize, usize::MAX);
        assert!(rec.vctx.query_port.is_some() && rec.vctx.query_device_ex.is_some());
        // SAFETY: the context's device is a record of this library.
        let name =
            unsafe { std::ffi::CStr::from_ptr(crate::device::ibv_get_device_name(c.device)) };
        assert_eq!(name.to_str().unwrap(), "sim_ctx");
        // SAFETY: zeroed C data, filled by the call.
        let mut da: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and attribute struct.
        assert_eq!(unsafe { ibv_query_device(ctx, &mut da) }, 0);
        assert_eq!(da.phys_port_cnt, 1);
        // SAFETY: zeroed C data.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and GID.
        assert_eq!(unsafe { ibv_query_gid(ctx, 1, 1, &mut gid) }, 0);
        // SAFETY: every member of the union is plain bytes.
        assert_eq!(
            unsafe { gid.raw },
            roce_transport::Gid::from_ip("10.66.0.1".parse().unwrap()).0
        );
        // SAFETY: open; not used afterwards.
        assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
    }

    fn readable(fd: c_int, ms: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// An `ibv_qp` as the QP module makes them: zeroed, mutex and cond initialised.
    fn fake_qp() -> Box<ibv_qp> {
        // SAFETY: C data, all zeroes valid; the mutex and cond are initialised in place.
        let mut qp: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: the boxed fields do not move.
        unsafe {
            libc::pthread_mutex_init(std::ptr::from_mut(&mut qp.mutex).cast(), std::ptr::null());
            libc::pthread_cond_init(std::ptr::from_mut(&mut qp.cond).cast(), std::ptr::null());
        }
        qp
    }

    /// A real QP error reaches the application through `async_fd`: an RC QP connected to
    /// itself WRITEs to memory without remote write access, which fails it (QP_FATAL),
    /// the engine's hook queues the event on this context, the descriptor turns readable,
    /// `ibv_get_async_event` returns the event with the application's `ibv_qp`, the
    /// descriptor is quiet again, and `ibv_ack_async_event` counts it on the QP.
    #[test]
    fn a_qp_error_arrives_through_async_fd() {
        if !netns_or_skip("a_qp_error_arrives_through_async_fd") {
            return;
        }
        let ns = TempNetns::create("vasync").unwrap();
        let ctx = ns
            .netns()
            .enter_scoped(|| {
                let ifaces = netdev::interfaces().unwrap();
                let spec = DeviceSpec {
                    name: "test_async".into(),
                    ifname: "lo".into(),
                    addr: Some("127.0.0.1".parse().unwrap()),
                };
                let rec = record(spec, &ifaces).unwrap();
                // SAFETY: a device record of this library.
                unsafe { ibv_open_device(rec.ibv()) as usize }
            })
            .unwrap() as *mut ibv_context;
        assert!(!ctx.is_null());
        // SAFETY: just opened.
        let rec = unsafe { ContextRec::from_ibv(ctx) }.unwrap();
        let fd = rec.vctx.context.async_fd;
        assert!(fd >= 0);
        // SAFETY: fcntl on our descriptor.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(fl & libc::FD_CLOEXEC, 0);
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
        // SAFETY: zeroed C data.
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and event.
        assert_eq!(unsafe { ibv_get_async_event(ctx, &mut ev) }, -1);
        assert_eq!(errno(), libc::EAGAIN);

        let dev = &rec.dev;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(8).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let mut ibqp = fake_qp();
        let ibqp_ptr: *mut ibv_qp = &mut *ibqp;
        lock(&rec.qps).insert(qp.qpn().value(), ibqp_ptr as usize);
        let me = RemoteQp {
            qpn: qp.qpn(),
            psn: Psn::new(0),
            gid: dev.local_gid(),
        };
        qp.connect(&me, &ConnectOptions::default()).unwrap();
        let src = pd.register(vec![1u8; 8], Access::LOCAL_WRITE).unwrap();
        let dst = pd.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        };
        qp.post_send(SendWr::new(7, op, vec![src.sge(0, 8)]))
            .unwrap();
        let mut wc = [Completion::EMPTY; 1];
        assert_eq!(cq.wait(&mut wc, Duration::from_secs(5)), 1);
        // The QP is both ends: its responder side fails first and flushes the WRITE.
        assert!(
            matches!(wc[0].status, WcStatus::RemAccessErr | WcStatus::WrFlushErr),
            "{:?}",
            wc[0].status
        );

        assert!(readable(fd, 5_000), "async_fd never became readable");
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_get_async_event(ctx, &mut ev) }, 0);
        assert_eq!(ev.event_type, EV_QP_FATAL);
        // SAFETY: a QP event's element is the QP.
        assert_eq!(unsafe { ev.element.qp }, ibqp_ptr);
        assert!(!readable(fd, 0), "async_fd readable with nothing queued");
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_get_async_event(ctx, &mut ev) }, -1);
        assert_eq!(errno(), libc::EAGAIN);
        ev.element.qp = ibqp_ptr;
        ev.event_type = EV_QP_FATAL;
        // SAFETY: the event names our live fake QP.
        unsafe { ibv_ack_async_event(&mut ev) };
        assert_eq!(ibqp.events_completed, 1);

        // Synthetic events through the dispatcher: one per known QP, in order, each counted
        // on the descriptor; one of a QP no context knows is dropped.
        let d = rec.open.dispatch.clone();
        let known = |event| AsyncEvent {
            qpn: Qpn::new(qp.qpn().value()),
            event,
        };
        d.deliver(AsyncEvent {
            qpn: Qpn::new(qp.qpn().value() ^ 1),
            event: Event::SqDrained,
        });
        assert!(!readable(fd, 0));
        d.deliver(known(Event::SqDrained));
        d.deliver(known(Event::SendQueueError));
        for want in [EV_SQ_DRAINED, EV_QP_REQ_ERR] {
            assert!(readable(fd, 0));
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_get_async_event(ctx, &mut ev) }, 0);
            assert_eq!(ev.event_type, want);
        }
        assert!(!readable(fd, 0));
        // An SRQ event names the QP's SRQ.
        // SAFETY: C data; all zeroes is valid.
        let mut fake_srq: Box<ibv_srq> = Box::new(unsafe { std::mem::zeroed() });
        ibqp.srq = &mut *fake_srq;
        d.deliver(known(Event::SrqLimitReached));
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_get_async_event(ctx, &mut ev) }, 0);
        assert_eq!(ev.event_type, EV_SRQ_LIMIT);
        // SAFETY: an SRQ event's element is the SRQ.
        assert_eq!(
            unsafe { ev.element.srq },
            std::ptr::from_mut(&mut *fake_srq)
        );

        lock(&rec.qps).clear();
        drop((qp, src, dst, cq, pd));
        // SAFETY: the context is open; nothing uses it afterwards.
        assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
    }
}
