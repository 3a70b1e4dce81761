//! The `sim` backend: an in-memory network of ports with seeded faults.
//!
//! A [`SimNetwork`] is a switch: every [`SimDatapath`] opened on it owns one IP address, and a
//! datagram sent to an address is queued at that port after the link's fault model has run
//! (loss, Gilbert burst loss, duplication, reordering, corruption, delay and jitter: the same
//! knobs as `roce_qp::testing::LinkConfig`, which it reuses). Ports report the IPv4
//! Identification the engine used (0) and DF, so the engine checks all 32 ICRC bits, and a
//! corrupted packet is caught by the ICRC like on a real wire.
//!
//! Readiness is an `eventfd` per port, so devices on a simulated network run under the same
//! engine loop as real ones. It is for tests and the embedded demo, not for speed.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use roce_qp::testing::LinkConfig;
use roce_qp::testing::Rng;

use super::{Datapath, DatapathCaps, Ipv4Info, RxMeta, TxDatagram};
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
    /// Delivered with a flipped byte.
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
}

#[derive(Debug)]
struct SimInner {
    ports: HashMap<IpAddr, Port>,
    link: LinkConfig,
    rng: Rng,
    in_burst: bool,
    stats: SimStats,
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
    due: Instant,
    data: Vec<u8>,
    meta: RxMeta,
}

impl SimNetwork {
    /// A network whose every link behaves as `link`, faults drawn from `seed`.
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(SimInner {
                ports: HashMap::new(),
                link,
                rng: Rng::new(seed),
                in_burst: false,
                stats: SimStats::default(),
                ip_mtu: 9000,
                queue_limit: 65_536,
            })),
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
        self.lock().link = link;
    }

    /// Sets the interface MTU ports report (default 9000).
    pub fn set_ip_mtu(&self, mtu: usize) {
        self.lock().ip_mtu = mtu;
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
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
        Ok(SimDatapath {
            net: self.clone(),
            local: SocketAddr::new(ip, roce_wire::frame::ROCEV2_PORT),
            event,
        })
    }

    fn lock(&self) -> MutexGuard<'_, SimInner> {
        // A panic while holding the lock leaves plain data; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SimInner {
    fn offer(&mut self, now: Instant, from: SocketAddr, d: &TxDatagram<'_>) {
        self.stats.sent += 1;
        let link = self.link;
        if self.in_burst {
            if self.rng.chance(link.burst_end) {
                self.in_burst = false;
            }
        } else if self.rng.chance(link.burst_start) {
            self.in_burst = true;
        }
        if self.in_burst || self.rng.chance(link.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(link.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = link.delay_ns;
            if link.jitter_ns > 0 {
                delay += self.rng.below(link.jitter_ns + 1);
            }
            if self.rng.chance(link.reorder) {
                self.stats.reordered += 1;
                delay += link.reorder_delay_ns;
            }
            let mut data = d.payload.to_vec();
            if !data.is_empty() && self.rng.chance(link.corrupt) {
                self.stats.corrupted += 1;
                let at = self.rng.below(data.len() as u64) as usize;
                data[at] ^= 1 << self.rng.below(8);
            }
            let meta = RxMeta {
                len: data.len(),
                stride: data.len(),
                src: SocketAddr::new(from.ip(), d.src_port),
                dst: d.dst,
                tos: d.tos,
                ipv4: from.is_ipv4().then_some(Ipv4Info {
                    ident: 0,
                    dont_fragment: true,
                }),
            };
            let limit = self.queue_limit;
            let Some(port) = self.ports.get_mut(&d.dst.ip()) else {
                self.stats.no_port += 1;
                return;
            };
            if port.queue.len() >= limit {
                self.stats.queue_full += 1;
                return;
            }
            let due = now + Duration::from_nanos(delay);
            // Keep the queue sorted by due time (stable for equal times).
            let at = port
                .queue
                .iter()
                .rposition(|p| p.due <= due)
                .map_or(0, |i| i + 1);
            port.queue.insert(at, InFlight { due, data, meta });
            if at == 0 && due <= now {
                port.event.notify();
            }
        }
    }
}

/// One port of a [`SimNetwork`].
#[derive(Debug)]
pub struct SimDatapath {
    net: SimNetwork,
    local: SocketAddr,
    event: Arc<EventFd>,
}

impl Drop for SimDatapath {
    fn drop(&mut self) {
        self.net.lock().ports.remove(&self.local.ip());
    }
}

impl Datapath for SimDatapath {
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
        let now = Instant::now();
        let mut inner = self.net.lock();
        for d in batch {
            inner.offer(now, self.local, d);
        }
        Ok(batch.len())
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RxMeta]) -> io::Result<usize> {
        let now = Instant::now();
        let mut inner = self.net.lock();
        let port = inner
            .ports
            .get_mut(&self.local.ip())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        self.event.drain();
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            match port.queue.front() {
                Some(p) if p.due <= now => {}
                _ => break,
            }
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
        if port.queue.front().is_some_and(|p| p.due <= now) {
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

    fn next_wakeup(&self) -> Option<Instant> {
        let inner = self.net.lock();
        inner
            .ports
            .get(&self.local.ip())
            .and_then(|p| p.queue.front().map(|f| f.due))
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
