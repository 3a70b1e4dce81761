//! Protection domains (`ibv_alloc_pd`, `ibv_dealloc_pd`). OWNER: helper "memcq".

use crate::sys::ibv_pd;

/// A protection domain.
#[repr(C)]
pub(crate) struct PdRec {
    /// Must stay the first field.
    pub(crate) ibv: ibv_pd,
    /// The rocectl PD.
    pub(crate) pd: roce_transport::ProtectionDomain,
}

impl PdRec {
    /// The record behind an `ibv_pd` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `pd` is NULL or a live PD from `ibv_alloc_pd`.
    pub(crate) unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Self> {
        // SAFETY: `ibv` is the first field of the `#[repr(C)]` record.
        unsafe { pd.cast::<Self>().as_ref() }
    }
}
