//! Memory regions (`ibv_mr`): registration through a protection domain, and the region
//! handle.

use roce_mr::{Access, AccessError, Key, RegisterError};
use roce_qp::verbs::Sge;
use roce_wire::{LKey, RKey};

use super::pd::ProtectionDomain;
use crate::control::{Objects, Reservation};
use crate::error::VerbsError;

impl ProtectionDomain {
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
        let reservation = self.inner.dev.reserve(Objects::mr(len as u64))?;
        let iova = self.inner.dev.alloc_iova(len);
        let key = self
            .inner
            .dev
            .shared()
            .table
            .register(self.inner.pd, data, iova, access)?;
        Ok(MemoryRegion::new(
            self.clone(),
            key,
            (iova, len),
            access,
            reservation,
        ))
    }

    /// Registers `len` zeroed, 8-byte-aligned bytes (atomics need the alignment).
    ///
    /// # Errors
    /// As [`Self::register`].
    pub fn register_zeroed(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let reservation = self.inner.dev.reserve(Objects::mr(len as u64))?;
        let iova = self.inner.dev.alloc_iova(len);
        let key =
            self.inner
                .dev
                .shared()
                .table
                .register_zeroed(self.inner.pd, len, iova, access)?;
        Ok(MemoryRegion::new(
            self.clone(),
            key,
            (iova, len),
            access,
            reservation,
        ))
    }

    /// Registers the caller's memory `ptr .. ptr + len` **in place** at `iova`, as a NIC
    /// does for `ibv_reg_mr` (`ibv_reg_mr_iova2`): peers and local work requests address
    /// it as `iova ..= iova + len - 1` ([`MemoryRegion::addr`] is `iova`; 0 with
    /// [`Access::ZERO_BASED`]). The region never frees the memory; dropping it deregisters
    /// the keys, waiting for any access in progress.
    ///
    /// # Safety
    /// From this call until the returned [`MemoryRegion`] is dropped, `ptr .. ptr + len`
    /// must stay valid for reads and writes (not freed, not unmapped). The engine reads and
    /// writes it concurrently with the caller, like a NIC's DMA: every access on rocectl's
    /// side is a relaxed atomic, so the caller's own plain accesses race only in the sense
    /// that DMA races (ordering comes from completions); see
    /// [`roce_mr::MrTable::register_raw`].
    ///
    /// # Errors
    /// [`VerbsError::Register`]: a null `ptr` with a non-zero `len`, inconsistent access
    /// flags (REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE, unknown bits), ZERO_BASED
    /// with a non-zero `iova`, `iova + len` overflowing, a full key table.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        let reservation = self.inner.dev.reserve(Objects::mr(len as u64))?;
        // SAFETY: forwarded to our caller's contract, which is `MrTable::register_raw`'s:
        // the memory stays valid until the region (and so the key) is dropped, and the table
        // touches it only through relaxed atomics.
        let key = unsafe {
            self.inner
                .dev
                .shared()
                .table
                .register_raw(self.inner.pd, ptr, len, iova, access)
        }?;
        Ok(MemoryRegion::new(
            self.clone(),
            key,
            (iova, len),
            access,
            reservation,
        ))
    }
}

/// How a region holds its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Borrow {
    /// The region owns its memory, or the caller upholds `register_raw`'s contract.
    None,
    /// The caller's `&mut [u8]`, for the length of a closure.
    Exclusive,
    /// The caller's `&[u8]`, for the length of a closure: never written.
    Shared,
}

impl ProtectionDomain {
    /// Registers the caller's `buf` in place with `access` (a fresh IOVA; 0 with
    /// [`Access::ZERO_BASED`]) for the length of `f`, and deregisters it when `f` returns or
    /// panics. After this returns (or a panic in `f` leaves it) the transport never touches
    /// `buf` again ([borrowed registrations](MemoryRegion#borrowed-registrations)): queued work requests naming the lkey fail with a
    /// local protection error, a peer's WRITE or READ with the rkey with a remote access
    /// error, and READ responses in flight complete their request in error, writing nothing.
    ///
    /// The safe counterpart of [`Self::register_raw`] for memory the caller lends rather
    /// than owns for good (sending from or receiving into an application buffer without a
    /// copy). Returns `f`'s result.
    ///
    /// ```
    /// use roce_transport::{Access, Device, DeviceConfig, SimNetwork};
    /// let net = SimNetwork::perfect();
    /// let dev = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
    /// let pd = dev.alloc_pd();
    /// let mut buf = vec![0u8; 64];
    /// let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    /// let rkey = pd.with_borrowed(&mut buf, rights, |mr| {
    ///     mr.write(0, b"in place").unwrap();
    ///     mr.rkey() // plain data may leave the scope; the region may not
    /// });
    /// assert!(rkey.is_ok());
    /// assert_eq!(&buf[..8], b"in place");
    /// ```
    ///
    /// The region cannot outlive the scope (so it cannot be kept, or `mem::forget`-ed,
    /// registered past it):
    /// ```compile_fail
    /// # use roce_transport::{Access, Device, DeviceConfig, SimNetwork};
    /// # let net = SimNetwork::perfect();
    /// # let dev = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
    /// # let pd = dev.alloc_pd();
    /// let mut buf = vec![0u8; 64];
    /// let mr = pd.with_borrowed(&mut buf, Access::LOCAL_WRITE, |mr| mr).unwrap();
    /// ```
    /// and the caller cannot touch the buffer inside it (only the transport does):
    /// ```compile_fail
    /// # use roce_transport::{Access, Device, DeviceConfig, SimNetwork};
    /// # let net = SimNetwork::perfect();
    /// # let dev = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
    /// # let pd = dev.alloc_pd();
    /// let mut buf = vec![0u8; 64];
    /// pd.with_borrowed(&mut buf, Access::LOCAL_WRITE, |_mr| buf[0] = 1).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::Register`]: [`Access::MW_BIND`] (windows are not bound to borrowed
    /// memory), inconsistent access flags, a full key table; `f` is not called then.
    pub fn with_borrowed<R>(
        &self,
        buf: &mut [u8],
        access: Access,
        f: impl FnOnce(&MemoryRegion) -> R,
    ) -> Result<R, VerbsError> {
        if access.contains(Access::MW_BIND) {
            return Err(RegisterError::InvalidAccess { access }.into());
        }
        let mr = self.register_borrowed(buf.as_mut_ptr(), buf.len(), access, Borrow::Exclusive)?;
        // `mr` is dropped (deregistered, waiting for any access in progress) when `f`
        // returns or unwinds, while `buf` is still borrowed.
        Ok(f(&mr))
    }

    /// As [`Self::with_borrowed`] for a buffer the caller only lends for reading (sending
    /// from it, or exposing it to peers' RDMA READs): `access` may hold only
    /// [`Access::REMOTE_READ`] and [`Access::ZERO_BASED`], and [`MemoryRegion::write`] on the
    /// region is refused, so nothing writes `buf` while it is shared.
    ///
    /// The region cannot outlive the scope either, and the buffer cannot be written inside
    /// it:
    /// ```compile_fail
    /// # use roce_transport::{Access, Device, DeviceConfig, SimNetwork};
    /// # let net = SimNetwork::perfect();
    /// # let dev = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
    /// # let pd = dev.alloc_pd();
    /// let buf = vec![0u8; 64];
    /// let mr = pd.with_borrowed_ref(&buf, Access::REMOTE_READ, |mr| mr).unwrap();
    /// ```
    /// ```compile_fail
    /// # use roce_transport::{Access, Device, DeviceConfig, SimNetwork};
    /// # let net = SimNetwork::perfect();
    /// # let dev = Device::open(DeviceConfig::sim(&net, "10.9.0.1".parse().unwrap())).unwrap();
    /// # let pd = dev.alloc_pd();
    /// let mut buf = vec![0u8; 64];
    /// pd.with_borrowed_ref(&buf, Access::REMOTE_READ, |_mr| buf[0] = 1).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`VerbsError::Register`]: any other access bit, a full key table; `f` is not called.
    pub fn with_borrowed_ref<R>(
        &self,
        buf: &[u8],
        access: Access,
        f: impl FnOnce(&MemoryRegion) -> R,
    ) -> Result<R, VerbsError> {
        if !Access::REMOTE_READ
            .union(Access::ZERO_BASED)
            .contains(access)
        {
            return Err(RegisterError::InvalidAccess { access }.into());
        }
        let ptr = buf.as_ptr().cast_mut();
        let mr = self.register_borrowed(ptr, buf.len(), access, Borrow::Shared)?;
        Ok(f(&mr))
    }

    /// Registers the borrowed `ptr .. ptr + len` (the caller holds the borrow for longer
    /// than the returned region lives) at a fresh IOVA.
    fn register_borrowed(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        borrow: Borrow,
    ) -> Result<MemoryRegion, VerbsError> {
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            self.inner.dev.alloc_iova(len)
        };
        // SAFETY: `ptr .. ptr + len` is a live borrow that `with_borrowed*` holds until the
        // returned region is dropped, which it does before returning or while unwinding out
        // of it (the region is lent to the closure only by reference, so it cannot be
        // moved out or forgotten); the drop deregisters it and, for a borrowed region,
        // aborts rather than return if that failed (see `Drop`), so the table touches the
        // memory only while the borrow lives, through relaxed atomics. An exclusive borrow
        // is not otherwise accessed meanwhile; a shared one is only read: its rights are
        // checked above to be at most REMOTE_READ | ZERO_BASED (no LOCAL_WRITE, so no
        // receive, READ response or atomic result is scattered into it, no remote write or
        // atomic is allowed, no window can be bound), fast registration applies only to
        // regions from `alloc_mr`, and `MemoryRegion::write` refuses a shared borrow.
        #[allow(unsafe_code)]
        let mut mr = unsafe { self.register_raw(ptr, len, iova, access) }?;
        mr.borrow = borrow;
        Ok(mr)
    }
}

/// A registered memory region (`ibv_mr`): its own translation from IOVA to memory, with an
/// lkey and an rkey (equal here). Deregistered when dropped.
///
/// # Borrowed registrations
///
/// [`ProtectionDomain::with_borrowed`] and [`ProtectionDomain::with_borrowed_ref`]:
/// The caller's buffer is registered in place for the length of a closure and deregistered
/// when the closure returns or unwinds, before `with_borrowed*` returns or the unwinding
/// leaves it. From that moment no access by this device touches the buffer again:
///
/// - every access to region memory (the requester gathering a send's payload or a
///   retransmission's, the responder writing an incoming WRITE or reading for a READ
///   response, the completer scattering a READ response or an atomic result, a receive's
///   scatter) goes through the key table's one checked entry point, per SGE and per packet,
///   and holds the slot's read lock only while it copies;
/// - deregistration takes that slot's write lock, so it waits for an access in progress and
///   removes the key under the lock: an access checked afterwards finds no region (or
///   another region's key) and fails without touching memory. Taking the lock also orders
///   every write the transport made before the caller's own accesses after the scope.
///
/// So work requests still queued that name the lkey complete with a local protection error
/// ([`crate::WcStatus::LocProtErr`]) when the transport gets to them (a retransmission of a
/// WRITE posted inside the scope included); a READ response or atomic result arriving for
/// such a request completes it in error and writes nothing; a peer's RDMA WRITE or READ
/// with the rkey is answered with a remote access error NAK
/// ([`crate::WcStatus::RemAccessErr`] at the peer). A later registration may reuse the
/// slot with another 8-bit key (1 in 256 chance of the same key); a stale key then reaches
/// that other region's memory, never the borrowed buffer.
///
/// Inside the closure the buffer is the region's: with [`ProtectionDomain::with_borrowed`]
/// it is exclusively borrowed, so the only accesses are the transport's (and
/// [`MemoryRegion::read`]/[`MemoryRegion::write`]); with
/// [`ProtectionDomain::with_borrowed_ref`] it is shared, so the region grants no write
/// right at all and [`MemoryRegion::write`] is refused. The region cannot leave the closure
/// (it is lent as `&MemoryRegion`), so `mem::forget` cannot keep it registered.
///
/// Memory windows cannot be bound to a borrowed region (MW_BIND is refused): a bound window
/// would make deregistration fail.
#[derive(Debug)]
pub struct MemoryRegion {
    pd: ProtectionDomain,
    key: Key,
    addr: u64,
    len: usize,
    access: Access,
    /// Whether (and how) the memory is borrowed for a closure's length.
    borrow: Borrow,
    /// Held with the rocectl daemon, when one serves the device (released on drop).
    _reservation: Option<Reservation>,
}

impl MemoryRegion {
    fn new(
        pd: ProtectionDomain,
        key: Key,
        (addr, len): (u64, usize),
        access: Access,
        reservation: Option<Reservation>,
    ) -> Self {
        Self {
            pd,
            key,
            addr,
            len,
            access,
            borrow: Borrow::None,
            _reservation: reservation,
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

    /// Re-registers the region in place (`ibv_rereg_mr`): the caller's memory `ptr .. ptr +
    /// len` at `iova` in `pd` with `access`, keeping the lkey and rkey (peers that hold the
    /// rkey reach the new mapping). Waits for any access in progress to the old mapping; the
    /// old memory is never touched again. On error the region is unchanged.
    ///
    /// # Safety
    /// As [`ProtectionDomain::register_raw`], for the new memory.
    ///
    /// # Errors
    /// [`VerbsError::WrongDevice`]: `pd` belongs to another device;
    /// [`VerbsError::Register`]: the checks of [`ProtectionDomain::register_raw`], memory
    /// windows bound to the region.
    #[allow(unsafe_code)]
    pub unsafe fn reregister_raw(
        &mut self,
        pd: &ProtectionDomain,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(), VerbsError> {
        let table = &self.pd.inner.dev.shared().table;
        if !std::sync::Arc::ptr_eq(table, &pd.inner.dev.shared().table) {
            return Err(VerbsError::WrongDevice(
                "the new protection domain belongs to another device",
            ));
        }
        // SAFETY: forwarded to our caller's contract, which is `MrTable::reregister_raw`'s.
        unsafe { table.reregister_raw(self.key, pd.inner.pd, ptr, len, iova, access) }?;
        self.pd = pd.clone();
        self.addr = iova;
        self.len = len;
        self.access = access;
        Ok(())
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
    /// [`AccessError`] if `offset + src.len()` passes the end;
    /// [`AccessError::AccessDenied`] for a region over a shared borrow
    /// ([`ProtectionDomain::with_borrowed_ref`]).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        if self.borrow == Borrow::Shared {
            return Err(AccessError::AccessDenied {
                needed: Access::LOCAL_WRITE,
                granted: self.access,
            });
        }
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
        let gone = self.pd.inner.dev.shared().table.deregister(self.key);
        if gone.is_err() && self.borrow != Borrow::None {
            // Unreachable: only this handle deregisters its key, and the one refusal left
            // (windows bound) needs MW_BIND, which borrowed regions are refused. Returning
            // would let the transport reach memory whose borrow is about to end, so this is
            // the one place that aborts rather than report.
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::pd::testing::rc_pair;
    use crate::{Access, Completion, SendOp, SendWr, SimNetwork, WcStatus};

    /// Posts an RDMA WRITE of `src` from `a` to `remote_addr`/`rkey`; returns its status.
    fn write(
        a: &super::super::pd::testing::Side,
        src: &super::MemoryRegion,
        remote_addr: u64,
        rkey: roce_wire::RKey,
    ) -> WcStatus {
        let op = SendOp::RdmaWrite { remote_addr, rkey };
        a.qp.post_send(SendWr::new(7, op, vec![src.sge(0, src.len())]))
            .unwrap();
        let mut wc = [Completion::EMPTY];
        assert_eq!(a.cq.wait(&mut wc, Duration::from_secs(5)), 1);
        wc[0].status
    }

    #[test]
    #[allow(unsafe_code)]
    fn raw_registration_is_written_in_place_until_dropped() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 1);
        let mut buf = vec![0u8; 64];
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `buf` outlives `dst` (dropped below, before `buf` is read or freed).
        let dst = unsafe { b.pd.register_raw(buf.as_mut_ptr(), 64, 0x5555_0000, rights) }.unwrap();
        assert_eq!(dst.addr(), 0x5555_0000);
        assert_eq!(dst.len(), 64);
        let src = a.pd.register(vec![0xAB; 16], Access::empty()).unwrap();
        assert_eq!(write(&a, &src, 0x5555_0008, dst.rkey()), WcStatus::Success);
        // The peer's write landed in the caller's own buffer.
        let rkey = dst.rkey();
        drop(dst);
        assert_eq!(&buf[8..24], &[0xAB; 16]);
        assert!(buf[..8].iter().chain(&buf[24..]).all(|&x| x == 0));
        // Dropping the region removed its key: the same write is refused.
        assert_eq!(write(&a, &src, 0x5555_0008, rkey), WcStatus::RemAccessErr);
        assert_eq!(&buf[8..24], &[0xAB; 16]);
    }

    #[test]
    #[allow(unsafe_code)]
    fn reregistration_keeps_the_rkey_a_peer_holds() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 5);
        let mut old = vec![0u8; 32];
        let mut new = vec![0u8; 64];
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: both buffers outlive `dst`, dropped before they are read.
        let mut dst = unsafe { b.pd.register_raw(old.as_mut_ptr(), 32, 0x7000, rights) }.unwrap();
        let rkey = dst.rkey();
        let pd2 = b.dev.alloc_pd();
        // SAFETY: as above.
        let bad =
            unsafe { dst.reregister_raw(&pd2, new.as_mut_ptr(), 64, 0x9000, Access::REMOTE_WRITE) };
        assert!(matches!(bad, Err(crate::VerbsError::Register(_))));
        assert_eq!((dst.addr(), dst.len()), (0x7000, 32));
        let other = a.dev.alloc_pd();
        // SAFETY: as above.
        let bad = unsafe { dst.reregister_raw(&other, new.as_mut_ptr(), 64, 0x9000, rights) };
        assert!(matches!(bad, Err(crate::VerbsError::WrongDevice(_))));
        // SAFETY: as above.
        unsafe { dst.reregister_raw(&b.pd, new.as_mut_ptr(), 64, 0x9000, rights) }.unwrap();
        assert_eq!((dst.rkey(), dst.addr(), dst.len()), (rkey, 0x9000, 64));
        let src = a.pd.register(vec![0xCD; 8], Access::empty()).unwrap();
        assert_eq!(write(&a, &src, 0x9038, rkey), WcStatus::Success);
        drop(dst);
        assert_eq!(&new[56..], &[0xCD; 8]);
        assert!(old.iter().all(|&x| x == 0));
    }

    #[test]
    #[allow(unsafe_code)]
    fn raw_registration_checks_access_and_zero_based_iova() {
        let net = SimNetwork::perfect();
        let (a, b) = rc_pair(&net, 2);
        let mut buf = vec![0u64; 4];
        let ptr = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `buf` outlives every region made here (refused ones make none).
        let bad = unsafe { b.pd.register_raw(ptr, 32, 0x1000, Access::REMOTE_WRITE) };
        assert!(matches!(bad, Err(crate::VerbsError::Register(_))));
        let zb = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::ZERO_BASED;
        // SAFETY: as above.
        let bad = unsafe { b.pd.register_raw(ptr, 32, 0x1000, zb) };
        assert!(matches!(bad, Err(crate::VerbsError::Register(_))));
        // SAFETY: as above; `dst` is dropped before `buf` is read.
        let dst = unsafe { b.pd.register_raw(ptr, 32, 0, zb) }.unwrap();
        assert_eq!(dst.addr(), 0);
        let src = a.pd.register(vec![0x11; 8], Access::empty()).unwrap();
        assert_eq!(write(&a, &src, 8, dst.rkey()), WcStatus::Success);
        drop(dst);
        assert_eq!(buf, [0, 0x1111_1111_1111_1111, 0, 0]);
    }
}
