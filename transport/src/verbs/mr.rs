//! Memory regions (`ibv_mr`): registration through a protection domain, and the region
//! handle.

use roce_mr::{Access, AccessError, Key};
use roce_qp::verbs::Sge;
use roce_wire::{LKey, RKey};

use super::pd::ProtectionDomain;
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
}

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
