//! `FaultInjector`: seeded loss, burst loss, duplication, reordering, corruption and delay in
//! front of any [`Datapath`] (smoltcp's `phy::FaultInjector` pattern).
//!
//! The decisions come from [`roce_qp::fault::FaultModel`], the one fault model of the stack
//! (the queue-pair simulator uses it too), so a [`LinkConfig`] means the same thing at every
//! layer. Faults apply to what is *sent*: each datagram is offered to the model, and its copies
//! (none if lost, two if duplicated) are held until their delay passes, on the injected
//! [`Clock`], then handed to the wrapped datapath in due order. A corrupted copy has one bit
//! flipped after the engine computed its ICRC, so the receiver's ICRC check catches it as on a
//! real wire.
//!
//! Held copies go out at the next `send` or `recv` call after they fall due;
//! [`Datapath::next_wakeup`] tells the engine when that is. Buffers of held copies are reused,
//! so a steady stream does not allocate. `send` always accepts the whole batch: when the
//! wrapped datapath would block, due copies wait in the injector (unbounded: this is test
//! middleware, not a queue discipline) and `next_wakeup` reports zero until they are out.
//!
//! Wrapping the `udp` backend gives deterministic loss over real sockets without root or
//! nftables:
//!
//! ```no_run
//! use roce_transport::datapath::fault::FaultInjector;
//! use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};
//! use roce_transport::{Backend, DeviceConfig, LinkConfig};
//!
//! let udp = UdpDatapath::bind("127.0.0.1:4791".parse().unwrap(), UdpOptions::default()).unwrap();
//! let link = LinkConfig { loss: 0.1, ..LinkConfig::perfect() };
//! let lossy = FaultInjector::new(udp, link, 42);
//! let config = DeviceConfig::new(Backend::Custom(Box::new(lossy)));
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roce_qp::fault::{FaultModel, FaultStats, LinkConfig};
use roce_qp::Instant;

use super::{Datapath, DatapathCaps, RxMeta, TxDatagram};
use crate::clock::{self, Clock};
use crate::sys::lock;

/// A fault model that several injectors may share (the `sim` network shares one across its
/// ports, so one seed decides the faults of the whole network). Clone it to share.
#[derive(Clone, Debug)]
pub struct SharedFaults(Arc<Mutex<FaultModel>>);

impl SharedFaults {
    /// A model behaving as `link`, its faults drawn from `seed`.
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self(Arc::new(Mutex::new(FaultModel::new(link, seed))))
    }

    /// Changes the faults from the next datagram on.
    pub fn set_link(&self, link: LinkConfig) {
        lock(&self.0).set_config(link);
    }

    /// The current faults.
    pub fn link(&self) -> LinkConfig {
        lock(&self.0).config()
    }

    /// What the model did so far.
    pub fn stats(&self) -> FaultStats {
        lock(&self.0).stats()
    }
}

/// A copy waiting for its delay to pass.
struct Held {
    due: Instant,
    dst: SocketAddr,
    src_port: u16,
    tos: u8,
    hop_limit: u8,
    flow_label: u32,
    data: Vec<u8>,
}

/// Wraps a datapath and applies a [`FaultModel`] to everything sent through it.
pub struct FaultInjector<D: Datapath> {
    inner: D,
    faults: SharedFaults,
    clock: Arc<dyn Clock>,
    /// Copies in flight, sorted by due time (FIFO among equals).
    held: VecDeque<Held>,
    /// Buffers of delivered copies, reused.
    spare: Vec<Vec<u8>>,
    /// Copies the wrapped datapath refused with an error (lost).
    send_errors: u64,
}

impl<D: Datapath> fmt::Debug for FaultInjector<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultInjector")
            .field("inner", &self.inner)
            .field("faults", &self.faults)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl<D: Datapath> FaultInjector<D> {
    /// Wraps `inner` with faults `link` drawn from `seed`, on the system clock.
    pub fn new(inner: D, link: LinkConfig, seed: u64) -> Self {
        Self::with_shared(inner, SharedFaults::new(link, seed), clock::system())
    }

    /// Wraps `inner` with a shared fault model, on `clock`.
    pub fn with_shared(inner: D, faults: SharedFaults, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            faults,
            clock,
            held: VecDeque::new(),
            spare: Vec::new(),
            send_errors: 0,
        }
    }

    /// The fault model (to change the faults or read its counters).
    pub fn faults(&self) -> &SharedFaults {
        &self.faults
    }

    /// The wrapped datapath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Copies the wrapped datapath refused with an error (counted as lost).
    pub fn send_errors(&self) -> u64 {
        self.send_errors
    }

    /// Copies still held back.
    pub fn in_flight(&self) -> usize {
        self.held.len()
    }

    /// Offers a datagram to the model and holds its copies.
    fn offer(&mut self, now: Instant, model: &mut FaultModel, d: &TxDatagram<'_>) {
        let verdict = model.offer_at(d.payload.len(), now.as_nanos());
        for copy in verdict.copies() {
            let mut data = self.spare.pop().unwrap_or_default();
            data.clear();
            data.extend_from_slice(d.payload);
            copy.apply(&mut data);
            let due = Instant::from_nanos(now.as_nanos().saturating_add(copy.delay_ns));
            let held = Held {
                due,
                dst: d.dst,
                src_port: d.src_port,
                tos: d.tos,
                hop_limit: d.hop_limit,
                flow_label: d.flow_label,
                data,
            };
            // Sorted by due time, FIFO among equals (the common case appends).
            let at = self
                .held
                .iter()
                .rposition(|h| h.due <= due)
                .map_or(0, |i| i + 1);
            self.held.insert(at, held);
        }
    }

    /// Hands every copy that is due to the wrapped datapath, in order, until it would block.
    fn release(&mut self, now: Instant) {
        const CHUNK: usize = 64;
        loop {
            let n = self
                .held
                .iter()
                .take(CHUNK)
                .take_while(|h| h.due <= now)
                .count();
            if n == 0 {
                return;
            }
            let mut batch = [TxDatagram::EMPTY; CHUNK];
            for (b, h) in batch.iter_mut().zip(self.held.iter()) {
                *b = TxDatagram {
                    dst: h.dst,
                    src_port: h.src_port,
                    tos: h.tos,
                    hop_limit: h.hop_limit,
                    flow_label: h.flow_label,
                    payload: &h.data,
                };
            }
            let sent = match self.inner.send(&batch[..n]) {
                Ok(0) => return,
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // The copy cannot be sent (unreachable...): it is lost, like on a wire.
                    self.send_errors += 1;
                    1
                }
            };
            for h in self.held.drain(..sent) {
                self.spare.push(h.data);
            }
        }
    }
}

impl<D: Datapath> Datapath for FaultInjector<D> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The wrapped backend's drops; what the injector itself loses is the simulated network's
    /// loss, which a receiver cannot see either.
    fn rx_drops(&mut self) -> super::RxDrops {
        self.inner.rx_drops()
    }

    fn caps(&self) -> DatapathCaps {
        self.inner.caps()
    }

    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        let now = self.clock.now();
        let faults = self.faults.clone();
        {
            let mut model = lock(&faults.0);
            for d in batch {
                self.offer(now, &mut model, d);
            }
        }
        self.release(now);
        Ok(batch.len())
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        if !self.held.is_empty() {
            let now = self.clock.now();
            self.release(now);
        }
        self.inner.recv(bufs, meta)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        self.inner.readiness_fd()
    }

    fn member_socket_fd(&self) -> Option<RawFd> {
        self.inner.member_socket_fd()
    }

    fn next_wakeup(&self) -> Option<Duration> {
        let held = self
            .held
            .front()
            .map(|h| clock::until(self.clock.now(), h.due));
        match (held, self.inner.next_wakeup()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
