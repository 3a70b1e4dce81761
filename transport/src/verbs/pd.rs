//! Protection domains (`ibv_pd`).

use std::sync::Arc;

use roce_mr::Pd;

use crate::device::Device;

#[derive(Debug)]
pub(super) struct PdInner {
    pub(super) dev: Device,
    pub(super) pd: Pd,
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
    pub(super) inner: Arc<PdInner>,
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
}

impl Device {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain::new(self.clone())
    }
}
