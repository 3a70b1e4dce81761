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
        self.dev.count_pd(false);
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
        dev.count_pd(true);
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

/// Two connected RC QPs on a perfect simulated network, for the object modules' and the
/// device's tests.
#[cfg(test)]
pub(crate) mod testing {
    use crate::{
        CompletionQueue, ConnectOptions, Device, DeviceConfig, ProtectionDomain, QpInit, QpType,
        QueuePair, RemoteQp, SimNetwork,
    };
    use roce_wire::Psn;

    /// One side of the pair.
    pub(crate) struct Side {
        pub(crate) dev: Device,
        pub(crate) pd: ProtectionDomain,
        pub(crate) cq: CompletionQueue,
        pub(crate) qp: QueuePair,
    }

    /// A connected pair on `net`, at 10.9.`x`.1 and 10.9.`x`.2.
    pub(crate) fn rc_pair(net: &SimNetwork, x: u8) -> (Side, Side) {
        let side = |host: u8| {
            let dev = Device::open(DeviceConfig::sim(
                net,
                format!("10.9.{x}.{host}").parse().unwrap(),
            ))
            .unwrap();
            let pd = dev.alloc_pd();
            let cq = dev.create_cq(64).unwrap();
            let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
            Side { dev, pd, cq, qp }
        };
        let (a, b) = (side(1), side(2));
        let remote = |s: &Side| RemoteQp {
            qpn: s.qp.qpn(),
            psn: Psn::new(0),
            gid: s.dev.local_gid(),
        };
        let o = ConnectOptions::default();
        a.qp.connect(&remote(&b), &o).unwrap();
        b.qp.connect(&remote(&a), &o).unwrap();
        (a, b)
    }
}
