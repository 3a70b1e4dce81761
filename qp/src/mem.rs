//! The queue pairs' window onto registered memory: one adapter over [`roce_mr::MrTable`] that
//! gathers and scatters across scatter/gather lists and runs remote accesses and atomics, each
//! through the table's single checked entry point.

use std::sync::Arc;

use roce_mr::{Access, AccessError, Key, MrTable, Origin, Pd};
use roce_wire::aeth::NakCode;
use roce_wire::{Qpn, RKey};

use crate::verbs::{Sge, WcStatus};

/// A device's memory-region table and the protection domain of one QP.
#[derive(Clone, Debug)]
pub struct Mem {
    table: Arc<MrTable>,
    pd: Pd,
}

/// An 8-byte atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Compare and swap.
    CompareSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Fetch and add.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// A failed remote access: the NAK code to answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemError {
    /// Answer with this NAK.
    Access(NakCode),
    /// A local failure while serving the request.
    #[allow(dead_code)]
    Local(WcStatus),
}

fn nak_of(e: &AccessError) -> MemError {
    MemError::Access(e.responder_nak())
}

fn local_status(e: &AccessError) -> WcStatus {
    WcStatus::of_local_access(e)
}

impl Mem {
    /// The table and the PD the QP belongs to.
    pub fn new(table: Arc<MrTable>, pd: Pd) -> Self {
        Self { table, pd }
    }
    /// The table.
    pub fn table(&self) -> &Arc<MrTable> {
        &self.table
    }
    /// The protection domain.
    pub fn pd(&self) -> Pd {
        self.pd
    }

    /// Walks the SGEs from message byte `offset` for `len` bytes, calling `f(sge, addr,
    /// range)` per piece. Errors with LOC_LEN_ERR if the list is too short.
    fn walk(
        sges: &[Sge],
        mut offset: u64,
        len: usize,
        mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), WcStatus>,
    ) -> Result<(), WcStatus> {
        let mut done = 0usize;
        for sge in sges {
            if done == len {
                break;
            }
            let sl = u64::from(sge.length);
            if offset >= sl {
                offset -= sl;
                continue;
            }
            let piece = ((sl - offset) as usize).min(len - done);
            f(sge, sge.addr.wrapping_add(offset), done..done + piece)?;
            done += piece;
            offset = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(WcStatus::LocLenErr)
        }
    }

    /// Copies `out.len()` bytes of the message described by `sges`, from byte `offset`
    /// (SEND/WRITE payload, READ response data). Send buffers need only a valid lkey.
    pub(crate) fn gather(&self, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), WcStatus> {
        let len = out.len();
        Self::walk(sges, offset, len, |sge, addr, r| {
            let c = self
                .table
                .check(
                    Origin::Local,
                    Key::from(sge.lkey),
                    self.pd,
                    addr,
                    r.len() as u64,
                    Access::empty(),
                )
                .map_err(|e| local_status(&e))?;
            c.read(0, &mut out[r]).map_err(|e| local_status(&e))
        })
    }

    /// Writes `data` into the buffer described by `sges` from byte `offset` (receives, READ
    /// results, atomic results); needs LOCAL_WRITE.
    pub(crate) fn scatter(&self, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), WcStatus> {
        Self::walk(sges, offset, data.len(), |sge, addr, r| {
            let c = self
                .table
                .check(
                    Origin::Local,
                    Key::from(sge.lkey),
                    self.pd,
                    addr,
                    r.len() as u64,
                    Access::LOCAL_WRITE,
                )
                .map_err(|e| local_status(&e))?;
            c.write(0, &data[r]).map_err(|e| local_status(&e))
        })
    }

    /// The one remote entry point: checks `rkey` for `len` bytes at `va` with `needed`
    /// rights on QP `qpn`, mapping a refusal to the NAK to answer with.
    fn remote(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<roce_mr::Checked<'_>, MemError> {
        self.table
            .check(
                Origin::Remote { qpn },
                Key::from(rkey),
                self.pd,
                va,
                len,
                needed,
            )
            .map_err(|e| nak_of(&e))
    }

    /// Checks a remote access of `len` bytes at `va` without touching memory.
    pub(crate) fn check_remote(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(), MemError> {
        self.remote(qpn, rkey, va, len, needed).map(drop)
    }

    /// An incoming RDMA WRITE's payload.
    pub(crate) fn write_remote(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let c = self.remote(qpn, rkey, va, data.len() as u64, Access::REMOTE_WRITE)?;
        c.write(0, data).map_err(|e| nak_of(&e))
    }

    /// Data for a READ response.
    pub(crate) fn read_remote(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        let c = self.remote(qpn, rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        c.read(0, out).map_err(|e| nak_of(&e))
    }

    /// Executes an incoming atomic; returns the original value.
    pub(crate) fn atomic(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        let c = self.remote(qpn, rkey, va, 8, Access::REMOTE_ATOMIC)?;
        match op {
            AtomicOp::CompareSwap { compare, swap } => c.compare_swap(compare, swap),
            AtomicOp::FetchAdd { add } => c.fetch_add(add),
        }
        .map_err(|e| nak_of(&e))
    }

    /// An incoming ATOMIC WRITE: stores 8 bytes at `va` at once (an aligned word of region
    /// memory is written through one atomic store). Needs REMOTE_WRITE; a misaligned address
    /// is an invalid request, checked after the key as rxe does.
    pub(crate) fn atomic_write(
        &self,
        qpn: Qpn,
        rkey: RKey,
        va: u64,
        value: &[u8; 8],
    ) -> Result<(), MemError> {
        let c = self.remote(qpn, rkey, va, 8, Access::REMOTE_WRITE)?;
        if va % 8 != 0 {
            return Err(MemError::Access(NakCode::InvalidRequest));
        }
        c.write(0, value).map_err(|e| nak_of(&e))
    }

    /// SEND with invalidate: invalidates the named rkey.
    pub(crate) fn invalidate_remote(&self, qpn: Qpn, rkey: RKey) -> Result<(), WcStatus> {
        self.table
            .invalidate_remote(Key::from(rkey), self.pd, qpn)
            // A failed SEND_WITH_INVALIDATE is NAKed invalid request
            // (`InvalidateError::responder_nak`) and completes with the matching status.
            .map_err(|_| WcStatus::RemInvReqErr)
    }

    /// LOCAL_INV.
    pub(crate) fn invalidate_local(&self, qpn: Qpn, key: u32) -> Result<(), WcStatus> {
        self.table
            .invalidate_local(Key(key), self.pd, qpn)
            // rxe: a failed LOCAL_INV completes with LOC_QP_OP_ERR.
            .map_err(|_| WcStatus::LocQpOpErr)
    }
}

#[cfg(test)]
mod tests {
    use roce_mr::InvalidateError;

    use super::*;

    const K: Key = Key(0x100);

    #[test]
    fn refused_accesses_complete_with_the_status_of_their_nak() {
        let access = [
            AccessError::UnknownKey { key: K },
            AccessError::StaleKey { key: K },
            AccessError::PdMismatch { key: K },
            AccessError::Invalidated { key: K },
            AccessError::QpMismatch { key: K },
            AccessError::WindowAsLocalKey { key: K },
            AccessError::AccessDenied {
                needed: Access::REMOTE_READ,
                granted: Access::empty(),
            },
            AccessError::OutOfBounds { iova: 0, len: 1 },
            AccessError::Unmapped,
        ];
        for e in access {
            assert_eq!(
                nak_of(&e),
                MemError::Access(NakCode::RemoteAccessError),
                "{e}"
            );
            assert_eq!(WcStatus::of_remote_access(&e), WcStatus::RemAccessErr);
            assert_eq!(local_status(&e), WcStatus::LocProtErr);
        }
        for e in [
            AccessError::Misaligned { iova: 4 },
            AccessError::AtomicLength { len: 4 },
        ] {
            assert_eq!(nak_of(&e), MemError::Access(NakCode::InvalidRequest), "{e}");
            assert_eq!(WcStatus::of_remote_access(&e), WcStatus::RemInvReqErr);
            assert_eq!(local_status(&e), WcStatus::LocQpOpErr);
        }
        let inv = InvalidateError::Type1Window { key: K };
        assert_eq!(
            WcStatus::of_nak(inv.responder_nak()),
            Some(WcStatus::RemInvReqErr)
        );
        assert_eq!(
            WcStatus::of_nak(NakCode::RemoteOperationalError),
            Some(WcStatus::RemOpErr)
        );
        assert_eq!(WcStatus::of_nak(NakCode::PsnSequenceError), None);
        // rdma-core's numbering.
        assert_eq!(WcStatus::LocProtErr as u8, 4);
        assert_eq!(WcStatus::RemAccessErr as u8, 10);
        assert_eq!(WcStatus::GeneralErr as u8, 21);
    }

    #[test]
    fn invalidations_map_to_rxe_statuses() {
        let table = Arc::new(MrTable::new(16, 1));
        let pd = table.alloc_pd();
        let mem = Mem::new(table, pd);
        let qpn = Qpn::new(0x11);
        assert_eq!(
            mem.invalidate_remote(qpn, RKey::new(0x0500)),
            Err(WcStatus::RemInvReqErr)
        );
        assert_eq!(mem.invalidate_local(qpn, 0x0500), Err(WcStatus::LocQpOpErr));
    }
}
