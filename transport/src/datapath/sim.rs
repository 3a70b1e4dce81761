//! The `sim` backend: an in-memory network of ports with seeded faults.
//!
//! A [`SimNetwork`] is a switch: every [`SimDatapath`] opened on it owns one IP address, and a
//! datagram sent to an address is queued at that port. Faults (loss, Gilbert burst loss,
//! duplication, reordering, corruption, delay and jitter) come from a
//! [`FaultInjector`] in front of each port, all of them sharing
//! the network's one fault model and seed ([`roce_qp::fault`], the model the queue-pair
//! simulator uses too), and all reading the network's [`Clock`]. Ports report the IPv4
//! Identification the engine used (0) and DF, so the engine checks all 32 ICRC bits, and a
//! corrupted packet is caught by the ICRC like on a real wire.
//!
//! Readiness is an `eventfd` per port, so devices on a simulated network run under the same
//! engine loop as real ones. On a [`crate::clock::VirtualClock`], devices driven by
//! [`crate::Progress::Manual`] replay exactly from the seed. It is for tests and the embedded
//! demo, not for speed.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use roce_qp::fault::LinkConfig;

use super::fault::{FaultInjector, SharedFaults};
use super::{Datapath, DatapathCaps, Ipv4Info, RxMeta, TxDatagram};
use crate::clock::{self, Clock};
use crate::sys::EventFd;

/// Counters of a simulated network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Datagrams offered.
    pub sent: u64,
    /// Dropped by loss or burst loss.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Delivered with a flipped bit.
    pub corrupted: u64,
    /// Held back to arrive after later ones.
    pub reordered: u64,
    /// Addressed to no port.
    pub no_port: u64,
    /// Dropped because the destination queue was full.
    pub queue_full: u64,
}

/// An in-memory network; clone it to share.
#[derive(Clone, Debug)]
pub struct SimNetwork {
    inner: Arc<Mutex<SimInner>>,
    faults: SharedFaults,
    clock: Arc<dyn Clock>,
}

#[derive(Debug)]
struct SimInner {
    ports: HashMap<IpAddr, Port>,
    no_port: u64,
    queue_full: u64,
    ip_mtu: usize,
    queue_limit: usize,
}

#[derive(Debug)]
struct Port {
    event: Arc<EventFd>,
    queue: VecDeque<InFlight>,
}

#[derive(Debug)]
struct InFlight {
    data: Vec<u8>,
    meta: RxMeta,
}

impl SimNetwork {
    /// A network whose every link behaves as `link`, faults drawn from `seed`, on the system
    /// clock.
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self::with_clock(link, seed, clock::system())
    }

    /// A network on `clock` (share a [`crate::clock::VirtualClock`] with the devices for a
    /// replayable run).
    pub fn with_clock(link: LinkConfig, seed: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(SimInner {
                ports: HashMap::new(),
                no_port: 0,
                queue_full: 0,
                ip_mtu: 9000,
                queue_limit: 65_536,
            })),
            faults: SharedFaults::new(link, seed),
            clock,
        }
    }

    /// A perfect network without delay.
    pub fn perfect() -> Self {
        Self::new(
            LinkConfig {
                delay_ns: 0,
                ..LinkConfig::perfect()
            },
            1,
        )
    }

    /// Changes the fault model of every link from now on.
    pub fn set_link(&self, link: LinkConfig) {
        self.faults.set_link(link);
    }

    /// Sets the interface MTU ports report (default 9000).
    pub fn set_ip_mtu(&self, mtu: usize) {
        self.lock().ip_mtu = mtu;
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        let f = self.faults.stats();
        let inner = self.lock();
        SimStats {
            sent: f.offered,
            lost: f.lost,
            duplicated: f.duplicated,
            corrupted: f.corrupted,
            reordered: f.reordered,
            no_port: inner.no_port,
            queue_full: inner.queue_full,
        }
    }

    /// The clock the network's delays run on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Opens a port with address `ip` (UDP port 4791).
    ///
    /// # Errors
    /// `AddrInUse` if the address already has a port; eventfd creation errors.
    pub fn open(&self, ip: IpAddr) -> io::Result<SimDatapath> {
        let mut inner = self.lock();
        if inner.ports.contains_key(&ip) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("simulated address {ip} already has a port"),
            ));
        }
        let event = Arc::new(EventFd::new()?);
        inner.ports.insert(
            ip,
            Port {
                event: event.clone(),
                queue: VecDeque::new(),
            },
        );
        let port = SimPort {
            net: self.clone(),
            local: SocketAddr::new(ip, roce_wire::frame::ROCEV2_PORT),
            event,
        };
        Ok(SimDatapath(FaultInjector::with_shared(
            port,
            self.faults.clone(),
            self.clock.clone(),
        )))
    }

    fn lock(&self) -> MutexGuard<'_, SimInner> {
        // A panic while holding the lock leaves plain data; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SimInner {
    /// Queues a datagram (its faults already applied) at its destination port.
    fn deliver(&mut self, from: SocketAddr, d: &TxDatagram<'_>) {
        let limit = self.queue_limit;
        let Some(port) = self.ports.get_mut(&d.dst.ip()) else {
            self.no_port += 1;
            return;
        };
        if port.queue.len() >= limit {
            self.queue_full += 1;
            return;
        }
        let meta = RxMeta {
            len: d.payload.len(),
            stride: d.payload.len(),
            src: SocketAddr::new(from.ip(), d.src_port),
            dst: d.dst,
            tos: d.tos,
            ipv4: from.is_ipv4().then_some(Ipv4Info {
                ident: 0,
                dont_fragment: true,
            }),
        };
        port.queue.push_back(InFlight {
            data: d.payload.to_vec(),
            meta,
        });
        if port.queue.len() == 1 {
            // Readable while the queue is not empty (`recv` re-arms it when it leaves some).
            port.event.notify();
        }
    }
}

/// A port's wire: delivers what it is given at once, without faults.
#[derive(Debug)]
struct SimPort {
    net: SimNetwork,
    local: SocketAddr,
    event: Arc<EventFd>,
}

impl Drop for SimPort {
    fn drop(&mut self) {
        self.net.lock().ports.remove(&self.local.ip());
    }
}

impl Datapath for SimPort {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn caps(&self) -> DatapathCaps {
        DatapathCaps {
            ip_mtu: self.net.lock().ip_mtu,
            max_gso_segments: 1,
            gro_segments: 1,
            fixed_source_port: None,
            sees_ip_header: true,
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        let mut inner = self.net.lock();
        for d in batch {
            inner.deliver(self.local, d);
        }
        Ok(batch.len())
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        let mut inner = self.net.lock();
        let port = inner
            .ports
            .get_mut(&self.local.ip())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        self.event.drain();
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let Some(p) = port.queue.pop_front() else {
                break;
            };
            let len = p.data.len().min(bufs[n].len());
            bufs[n][..len].copy_from_slice(&p.data[..len]);
            meta[n] = RxMeta {
                len,
                stride: len,
                ..p.meta
            };
            n += 1;
        }
        if !port.queue.is_empty() {
            self.event.notify();
        }
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.event.as_raw_fd())
    }
}

/// One port of a [`SimNetwork`]: a perfect in-memory wire behind the network's
/// [`FaultInjector`].
#[derive(Debug)]
pub struct SimDatapath(FaultInjector<SimPort>);

impl Datapath for SimDatapath {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn caps(&self) -> DatapathCaps {
        self.0.caps()
    }

    fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    fn send(&mut self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.0.send(batch)
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        self.0.recv(bufs, meta)
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        self.0.readiness_fd()
    }

    fn next_wakeup(&self) -> Option<Duration> {
        self.0.next_wakeup()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(dst: SocketAddr, payload: &[u8]) -> TxDatagram<'_> {
        TxDatagram {
            dst,
            src_port: 0xC001,
            tos: 0,
            hop_limit: 64,
            flow_label: 0,
            payload,
        }
    }

    #[test]
    fn delivers_in_order_and_signals_readiness() {
        let net = SimNetwork::perfect();
        let mut a = net.open("10.0.0.1".parse().unwrap()).unwrap();
        let mut b = net.open("10.0.0.2".parse().unwrap()).unwrap();
        assert!(net.open("10.0.0.2".parse().unwrap()).is_err());
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let batch: Vec<_> = payloads
            .iter()
            .map(|p| datagram(b.local_addr(), p))
            .collect();
        assert_eq!(a.send(&batch).unwrap(), 10);
        let fd = b.readiness_fd().unwrap();
        assert!(crate::sys::wait_readable(fd, Duration::from_millis(100)));
        let mut storage = vec![[0u8; 256]; 16];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|s| IoSliceMut::new(s)).collect();
        let mut meta = [RxMeta::empty(); 16];
        let n = b.recv(&mut bufs, &mut meta).unwrap();
        assert_eq!(n, 10);
        for (i, m) in meta[..n].iter().enumerate() {
            assert_eq!(m.len, 100 + i);
            assert_eq!(&bufs[i][..m.len], &payloads[i][..]);
            assert_eq!(m.src, SocketAddr::new(a.local_addr().ip(), 0xC001));
        }
        assert_eq!(
            b.recv(&mut bufs, &mut meta).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn loss_is_seeded_and_counted() {
        let link = LinkConfig {
            loss: 0.25,
            ..LinkConfig::perfect()
        };
        let run = |seed| {
            let net = SimNetwork::new(link, seed);
            let mut a = net.open("10.0.0.1".parse().unwrap()).unwrap();
            let b = net.open("10.0.0.2".parse().unwrap()).unwrap();
            let p = [0u8; 10];
            let batch = vec![datagram(b.local_addr(), &p); 1000];
            a.send(&batch).unwrap();
            net.stats()
        };
        let s = run(7);
        assert_eq!(s, run(7));
        assert!((150..350).contains(&s.lost), "{s:?}");
    }
}
