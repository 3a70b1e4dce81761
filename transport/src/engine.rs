//! The engine: drives every queue pair of a device over its datapath.
//!
//! One `Engine` per device, behind the device's mutex. A pass of [`Engine::progress`]:
//!
//! 1. **receive**: up to a budget of batches from the datapath into fixed receive slots; each
//!    datagram (GRO buffers are split by their stride) gets synthetic IP/UDP headers written
//!    into the slot's headroom in front of it, so the ICRC is checked in place over one
//!    contiguous buffer. A UDP socket hides the IPv4 Identification: it is recovered from the
//!    ICRC and held to what the sender's earlier packets showed
//!    ([`roce_wire::icrc::Ipv4IdentChecker`], whose docs give the false-accept bound); other
//!    backends (and `udp` with raw receive) report it and all 32 bits are checked. Good
//!    packets are parsed, demultiplexed by destination QPN and fed to their QP; the QP
//!    scatters the payload straight from the slot into the MR (the one receive copy);
//! 2. **timers**: every QP whose deadline passed;
//! 3. **transmit**: each QP writes its packets (BTH .. ICRC, copied once from the MR) back to
//!    back into the transmit arena, the engine fills the ICRC for the IP header the backend
//!    will put on the wire (IPv4 Identification 0, DF), and the batch goes to the datapath in
//!    one call (sendmmsg, GSO when contiguous runs allow);
//! 4. **completions**: drained from the QPs into their completion queues.
//!
//! Nothing here allocates per packet: the slots, the arena and the batch arrays are allocated
//! when the device opens.

use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use roce_qp::verbs::CqSide;
use roce_qp::{Event, Instant as QpInstant, QpStats, QueuePair, RecvMeta};
use roce_wire::frame::{EthRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::icrc::{Icrc, IdentPolicy, IdentVerdict, Ipv4IdentChecker, ICRC_LEN};
use roce_wire::{Gid, PacketRepr, Qpn};

use crate::counters::DeviceCounters;
use crate::datapath::{Datapath, DatapathCaps, RxDrops, RxMeta, TxDatagram};
use crate::device::{lock, CaptureFile};
use crate::verbs::{AsyncEvent, CqShared};

/// Datagrams per receive or send batch.
pub(crate) const BATCH: usize = 64;
/// Room in front of each received datagram for synthetic Ethernet + IPv6 + UDP headers.
const HEADROOM: usize = 64;
/// Largest L2-L4 header we synthesize (Ethernet + IPv6 + UDP).
const MAX_HEADERS: usize = 14 + 40 + 8;
/// Receive batches per progress pass before yielding (bounds the time the lock is held).
const RX_BATCHES_PER_PASS: usize = 8;

/// A QP the engine drives and the CQs its completions go to.
#[derive(Debug)]
pub(crate) struct QpSlot {
    pub(crate) qp: QueuePair,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
}

/// One queued datagram in the transmit arena.
#[derive(Clone, Copy, Debug)]
struct TxDesc {
    offset: usize,
    len: usize,
    dst: SocketAddr,
    src_port: u16,
    tos: u8,
    hop_limit: u8,
    flow_label: u32,
}

/// What a progress pass did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PassResult {
    /// Datagrams received.
    pub(crate) received: usize,
    /// Datagrams sent.
    pub(crate) sent: usize,
    /// The receive budget ran out with data possibly still waiting.
    pub(crate) more_rx: bool,
    /// Datagrams are waiting for the datapath to accept them.
    pub(crate) tx_blocked: bool,
}

/// The per-device engine.
#[derive(Debug)]
pub(crate) struct Engine {
    dp: Box<dyn Datapath>,
    caps: DatapathCaps,
    local: SocketAddr,
    local_mac: [u8; 6],
    origin: std::time::Instant,
    pub(crate) qps: HashMap<u32, QpSlot>,
    /// QPNs in creation order, for fair transmit order.
    order: Vec<u32>,
    /// Where the next transmit scan starts in `order`.
    rr: usize,
    rx_slots: Box<[u8]>,
    rx_slot_len: usize,
    rx_meta: Box<[RxMeta]>,
    tx_arena: Box<[u8]>,
    tx_descs: Vec<TxDesc>,
    tx_used: usize,
    /// First descriptor not yet accepted by the datapath.
    tx_pending: usize,
    /// Packets were deferred by an earlier pass (see [`Engine::progress`]).
    tx_deferred_earlier: bool,
    /// Room one packet needs in the arena (path MTU + headers + trailer).
    tx_room: usize,
    ident_checker: Ipv4IdentChecker,
    scratch: Box<[u8]>,
    pub(crate) capture: Option<CaptureFile>,
    pub(crate) counters: DeviceCounters,
    /// The datapath's receive drops already folded into `counters`.
    rx_drops_seen: RxDrops,
    pub(crate) events: Vec<AsyncEvent>,
    pub(crate) last_error: Option<String>,
    /// Statistics of destroyed QPs (device counters keep counting them).
    pub(crate) retired: Vec<QpStats>,
}

impl Engine {
    /// An engine over `dp` for packets of at most `max_payload` bytes (path MTU).
    pub(crate) fn new(dp: Box<dyn Datapath>, max_payload: usize, local_mac: [u8; 6]) -> Self {
        let caps = dp.caps();
        let local = dp.local_addr();
        // One packet: BTH + largest extension headers (28) + payload + pad + ICRC.
        let tx_room = max_payload + 64;
        let segments = caps.gro_segments.max(1);
        // A GRO buffer holds up to 64 KiB; a plain one the largest IP packet.
        let rx_data = if segments > 1 {
            65_536
        } else {
            caps.ip_mtu.clamp(1500, 65_536)
        };
        let rx_slot_len = HEADROOM + rx_data;
        let rx_slots_n = if segments > 1 { 8 } else { BATCH };
        Self {
            dp,
            caps,
            local,
            local_mac,
            origin: std::time::Instant::now(),
            qps: HashMap::new(),
            order: Vec::new(),
            rr: 0,
            rx_slots: vec![0u8; rx_slot_len * rx_slots_n].into_boxed_slice(),
            rx_slot_len,
            rx_meta: vec![RxMeta::empty(); rx_slots_n].into_boxed_slice(),
            tx_arena: vec![0u8; tx_room * BATCH].into_boxed_slice(),
            tx_descs: Vec::with_capacity(BATCH),
            tx_used: 0,
            tx_pending: 0,
            tx_deferred_earlier: false,
            tx_room,
            ident_checker: Ipv4IdentChecker::new(IdentPolicy::default()),
            scratch: vec![0u8; MAX_HEADERS + tx_room.max(rx_data)].into_boxed_slice(),
            capture: None,
            counters: DeviceCounters::default(),
            rx_drops_seen: RxDrops::default(),
            events: Vec::new(),
            last_error: None,
            retired: Vec::new(),
        }
    }

    /// The backend.
    pub(crate) fn datapath(&self) -> &dyn Datapath {
        &*self.dp
    }

    /// The engine clock: nanoseconds since the device opened.
    pub(crate) fn now(&self) -> QpInstant {
        QpInstant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    /// The wall-clock time of an engine instant.
    pub(crate) fn to_std(&self, t: QpInstant) -> std::time::Instant {
        self.origin + std::time::Duration::from_nanos(t.as_nanos())
    }

    /// Folds the datapath's unseen receive drops into the counters (call before reading them;
    /// may make a system call): kernel drops into `rx_drop_kernel`, datagrams the backend
    /// discarded as malformed into `rx_packets` and `rx_drop_malformed`.
    pub(crate) fn refresh_rx_drops(&mut self) {
        let now = self.dp.rx_drops();
        let seen = self.rx_drops_seen;
        let malformed = now.malformed.saturating_sub(seen.malformed);
        self.counters.rx_packets += malformed;
        self.counters.rx_drop_malformed += malformed;
        self.counters.rx_drop_kernel += now.kernel.saturating_sub(seen.kernel);
        self.rx_drops_seen = now;
    }

    /// Adds a QP.
    pub(crate) fn insert(&mut self, slot: QpSlot) {
        let qpn = slot.qp.qpn().value();
        self.qps.insert(qpn, slot);
        self.order.push(qpn);
    }

    /// Removes a QP (its unsent packets are dropped, as a destroyed QP's would be).
    pub(crate) fn remove(&mut self, qpn: u32) -> Option<QpSlot> {
        self.order.retain(|&q| q != qpn);
        let slot = self.qps.remove(&qpn)?;
        // Fold the statistics into one retired entry so the list stays one long.
        let stats = slot.qp.stats();
        match self.retired.first_mut() {
            Some(r) => *r += &stats,
            None => self.retired.push(stats),
        }
        Some(slot)
    }

    /// The earliest time something needs doing without input: a QP timer or a delayed
    /// simulated packet.
    pub(crate) fn next_deadline(&self) -> Option<std::time::Instant> {
        let qp = self
            .qps
            .values()
            .filter_map(|s| s.qp.poll_timeout())
            .min()
            .map(|t| self.to_std(t));
        match (qp, self.dp.next_wakeup()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// One pass: receive, timers, transmit, completions.
    ///
    /// With `defer_tx` (application-driven progress), what the pass produces (typically the
    /// ACK of a message just received) is built into the arena but not sent yet: it goes out
    /// with the application's next post (the doorbell flushes the arena, so an ACK and the
    /// reply the application posts on seeing the completion share one `sendmmsg`), or at the
    /// start of the next pass, or before the application blocks. Whatever an earlier pass
    /// deferred is sent first.
    pub(crate) fn progress(&mut self, defer_tx: bool) -> PassResult {
        let mut result = PassResult::default();
        let now = self.now();
        if defer_tx && self.tx_deferred_earlier {
            // Deferred by an earlier pass and no post took it along: send it now, so an
            // ACK waits at most one pass.
            self.transmit(now, &mut result);
        }
        self.receive(now, &mut result);
        for slot in self.qps.values_mut() {
            if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                slot.qp.handle_timeout(now);
            }
        }
        if defer_tx {
            self.transmit_deferred(now);
        } else {
            self.transmit(now, &mut result);
        }
        self.drain_completions();
        result
    }

    /// Whether built packets wait to be sent.
    pub(crate) fn tx_waiting(&self) -> bool {
        self.tx_pending < self.tx_descs.len()
    }

    /// Sends what the QPs have queued and moves completions to their CQs (the doorbell after
    /// a post).
    pub(crate) fn kick(&mut self) -> PassResult {
        let mut result = PassResult::default();
        let now = self.now();
        self.transmit(now, &mut result);
        self.drain_completions();
        result
    }

    // ----------------------------------------------------------------- receive --

    fn receive(&mut self, now: QpInstant, result: &mut PassResult) {
        for _ in 0..RX_BATCHES_PER_PASS {
            let n = {
                let slot_len = self.rx_slot_len;
                let mut bufs: [IoSliceMut<'_>; BATCH] =
                    std::array::from_fn(|_| IoSliceMut::new(&mut []));
                let mut count = 0;
                for (buf, chunk) in bufs
                    .iter_mut()
                    .zip(self.rx_slots.chunks_exact_mut(slot_len))
                {
                    *buf = IoSliceMut::new(&mut chunk[HEADROOM..]);
                    count += 1;
                }
                match self.dp.recv(&mut bufs[..count], &mut self.rx_meta) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.counters.rx_errors += 1;
                        self.last_error = Some(format!("receive: {e}"));
                        return;
                    }
                }
            };
            for i in 0..n {
                let meta = self.rx_meta[i];
                let stride = meta.stride.max(1);
                if meta.len == 0 {
                    // An empty datagram is still a datagram: counted (malformed), not lost.
                    self.handle_datagram(now, i, 0, 0, &meta);
                    result.received += 1;
                }
                let mut off = 0;
                while off < meta.len {
                    let seg = stride.min(meta.len - off);
                    self.handle_datagram(now, i, off, seg, &meta);
                    result.received += 1;
                    off += stride;
                }
            }
            if n < self.rx_meta.len() {
                return;
            }
        }
        result.more_rx = true;
    }

    /// Handles the datagram at `slot`'s data offset `off`, `len` bytes long.
    fn handle_datagram(&mut self, now: QpInstant, slot: usize, off: usize, len: usize, m: &RxMeta) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += len as u64;
        let base = slot * self.rx_slot_len + HEADROOM + off;
        let mut frame = FrameRepr {
            eth: Some(EthRepr {
                dst: self.local_mac,
                src: mac_for(m.src.ip()),
                vlan: None,
            }),
            ip: match (m.src.ip(), m.dst.ip()) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                    src,
                    dst,
                    tos: m.tos,
                    ident: m.ipv4.map_or(0, |i| i.ident),
                    dont_fragment: m.ipv4.is_none_or(|i| i.dont_fragment),
                    ttl: 64,
                }),
                (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
                    src,
                    dst,
                    traffic_class: m.tos,
                    flow_label: 0,
                    hop_limit: 64,
                }),
                _ => {
                    self.counters.rx_drop_malformed += 1;
                    return;
                }
            },
            udp: UdpRepr {
                src_port: m.src.port(),
                dst_port: m.dst.port(),
                checksum: 0,
            },
        };
        let hdr_len = frame.header_len();
        let ip_off = base - hdr_len + 14;
        frame.emit_headers(len, &mut self.rx_slots[base - hdr_len..base]);
        let ip_packet_end = base + len;
        // Too short for BTH + ICRC: malformed, not an ICRC error (there is no ICRC to check).
        let short = len < roce_wire::bth::HEADER_LEN + ICRC_LEN;
        let ok = if short {
            false
        } else if matches!(frame.ip, IpRepr::V4(_)) && m.ipv4.is_none() {
            // A UDP socket: solve for the hidden Identification (with DF) and check it is one
            // this peer would send now.
            match self
                .ident_checker
                .check(&self.rx_slots[ip_off..ip_packet_end], now.as_nanos())
            {
                IdentVerdict::Accept(ident) => {
                    if let IpRepr::V4(v4) = &mut frame.ip {
                        v4.ident = ident;
                        v4.dont_fragment = true;
                    }
                    if self.capture.is_some() {
                        frame.emit_headers(len, &mut self.rx_slots[base - hdr_len..base]);
                    }
                    true
                }
                IdentVerdict::NoSolution | IdentVerdict::Implausible(_) => false,
            }
        } else {
            roce_wire::icrc::verify(&self.rx_slots[ip_off..ip_packet_end])
        };
        if let Some(cap) = &self.capture {
            lock(&cap.0).write(&self.rx_slots[base - hdr_len..ip_packet_end]);
        }
        if short {
            self.counters.rx_drop_malformed += 1;
            return;
        }
        if !ok {
            self.counters.rx_icrc_errors += 1;
            return;
        }
        let Ok(packet) = PacketRepr::parse(&self.rx_slots[base..ip_packet_end]) else {
            self.counters.rx_drop_malformed += 1;
            return;
        };
        let dqpn = packet.bth.dest_qp.value();
        let Some(slot) = self.qps.get_mut(&dqpn) else {
            self.counters.rx_drop_no_qp += 1;
            return;
        };
        self.counters.rx_delivered += 1;
        let mut grh = [0u8; 40];
        match frame.ip {
            IpRepr::V4(_) => grh[20..].copy_from_slice(&self.rx_slots[ip_off..ip_off + 20]),
            IpRepr::V6(_) => grh.copy_from_slice(&self.rx_slots[ip_off..ip_off + 40]),
        }
        let meta = RecvMeta {
            sgid: Gid::from_ip(m.src.ip()),
            dgid: Gid::from_ip(m.dst.ip()),
            grh,
            ecn_ce: m.tos & 0x03 == 0x03,
        };
        if meta.ecn_ce {
            self.counters.rx_ecn_ce += 1;
        }
        slot.qp.handle_packet(now, &packet, &meta);
    }

    // ---------------------------------------------------------------- transmit --

    fn transmit(&mut self, now: QpInstant, result: &mut PassResult) {
        self.tx_deferred_earlier = false;
        loop {
            if self.tx_pending == self.tx_descs.len() {
                self.tx_descs.clear();
                self.tx_used = 0;
                self.tx_pending = 0;
            }
            // Top up the arena behind anything still waiting (a deferred ACK), then send it
            // all in one call.
            let filled = self.fill(now);
            if self.tx_pending < self.tx_descs.len() {
                self.flush(result);
                if self.tx_pending < self.tx_descs.len() {
                    result.tx_blocked = true;
                    return;
                }
            }
            if !filled {
                return;
            }
        }
    }

    /// Like [`Self::transmit`], but leaves the last batch built and unsent.
    fn transmit_deferred(&mut self, now: QpInstant) {
        if self.tx_pending == self.tx_descs.len() {
            self.tx_descs.clear();
            self.tx_used = 0;
            self.tx_pending = 0;
        }
        self.fill(now);
        self.tx_deferred_earlier = self.tx_waiting();
    }

    /// Fills the arena from the QPs, round robin; returns whether anything was queued.
    fn fill(&mut self, now: QpInstant) -> bool {
        let n = self.order.len();
        if n == 0 {
            return false;
        }
        let mut idle = 0;
        let mut i = self.rr % n;
        while idle < n
            && self.tx_descs.len() < BATCH
            && self.tx_arena.len() - self.tx_used >= self.tx_room
        {
            let qpn = self.order[i];
            let Some(slot) = self.qps.get_mut(&qpn) else {
                idle += 1;
                i = (i + 1) % n;
                continue;
            };
            let start = self.tx_used;
            match slot
                .qp
                .poll_transmit(now, &mut self.tx_arena[start..start + self.tx_room])
            {
                Some(t) => {
                    idle = 0;
                    let dst = SocketAddr::new(t.ah.dgid.to_ip(), ROCEV2_PORT);
                    let desc = TxDesc {
                        offset: start,
                        len: t.len,
                        dst,
                        src_port: self.caps.fixed_source_port.unwrap_or(t.udp_sport),
                        tos: t.ah.traffic_class,
                        hop_limit: t.ah.hop_limit,
                        flow_label: t.ah.flow_label,
                    };
                    if self.finish_packet(&desc) {
                        self.tx_descs.push(desc);
                        self.tx_used += t.len;
                    }
                }
                None => {
                    idle += 1;
                    i = (i + 1) % n;
                }
            }
        }
        self.rr = i;
        !self.tx_descs.is_empty()
    }

    /// Computes the ICRC of a packet in the arena for the headers it will travel with, and
    /// captures it. Returns false (packet dropped and counted) if it cannot be sent.
    fn finish_packet(&mut self, d: &TxDesc) -> bool {
        let Some(frame) = self.tx_frame(d) else {
            self.counters.tx_drop_address += 1;
            self.last_error = Some(format!(
                "cannot send from {} to {}: address families differ",
                self.local.ip(),
                d.dst.ip()
            ));
            return false;
        };
        let hdr_len = frame.header_len();
        let mut hdr = [0u8; MAX_HEADERS];
        frame.emit_headers(d.len, &mut hdr[..hdr_len]);
        let packet = &mut self.tx_arena[d.offset..d.offset + d.len];
        if packet.len() < roce_wire::bth::HEADER_LEN + ICRC_LEN {
            self.counters.tx_drop_address += 1;
            return false;
        }
        let ip = &hdr[14..hdr_len - 8];
        let udp = &hdr[hdr_len - 8..hdr_len];
        let body_end = packet.len() - ICRC_LEN;
        let Some(mut icrc) = Icrc::start(ip, udp, &packet[..roce_wire::bth::HEADER_LEN]) else {
            return false;
        };
        icrc.update(&packet[roce_wire::bth::HEADER_LEN..body_end]);
        packet[body_end..].copy_from_slice(&icrc.finish());
        if let Some(cap) = &self.capture {
            let total = hdr_len + d.len;
            self.scratch[..hdr_len].copy_from_slice(&hdr[..hdr_len]);
            self.scratch[hdr_len..total].copy_from_slice(packet);
            lock(&cap.0).write(&self.scratch[..total]);
        }
        true
    }

    /// The headers a datagram leaves with (what the backend puts on the wire).
    fn tx_frame(&self, d: &TxDesc) -> Option<FrameRepr> {
        let ip = match (self.local.ip(), d.dst.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                tos: d.tos,
                ident: 0,
                dont_fragment: true,
                ttl: d.hop_limit,
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6(Ipv6Repr {
                src,
                dst,
                traffic_class: d.tos,
                flow_label: d.flow_label & 0xF_FFFF,
                hop_limit: d.hop_limit,
            }),
            _ => return None,
        };
        Some(FrameRepr {
            eth: Some(EthRepr {
                dst: mac_for(d.dst.ip()),
                src: self.local_mac,
                vlan: None,
            }),
            ip,
            udp: UdpRepr {
                src_port: d.src_port,
                dst_port: ROCEV2_PORT,
                checksum: 0,
            },
        })
    }

    /// Hands the pending descriptors to the datapath.
    fn flush(&mut self, result: &mut PassResult) {
        while self.tx_pending < self.tx_descs.len() {
            let pending = &self.tx_descs[self.tx_pending..];
            let mut batch: [TxDatagram<'_>; BATCH] = [TxDatagram::EMPTY; BATCH];
            for (b, d) in batch.iter_mut().zip(pending) {
                *b = TxDatagram {
                    dst: d.dst,
                    src_port: d.src_port,
                    tos: d.tos,
                    hop_limit: d.hop_limit,
                    flow_label: d.flow_label,
                    payload: &self.tx_arena[d.offset..d.offset + d.len],
                };
            }
            match self.dp.send(&batch[..pending.len()]) {
                Ok(n) => {
                    for d in &self.tx_descs[self.tx_pending..self.tx_pending + n] {
                        self.counters.tx_packets += 1;
                        self.counters.tx_bytes += d.len as u64;
                    }
                    self.tx_pending += n;
                    result.sent += n;
                    if n == 0 {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.counters.tx_would_block += 1;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Unreachable network or host, or a hard error: the datagram is lost (RC
                    // retries will report it); count it and keep the reason for the user.
                    let d = self.tx_descs[self.tx_pending];
                    self.counters.tx_errors += 1;
                    self.last_error = Some(format!("send to {}: {e}", d.dst));
                    self.tx_pending += 1;
                }
            }
        }
    }

    // ------------------------------------------------------------- completions --

    fn drain_completions(&mut self) {
        for slot in self.qps.values_mut() {
            while let Some((side, c)) = slot.qp.poll_completion() {
                let cq = match side {
                    CqSide::Send => &slot.send_cq,
                    CqSide::Recv => &slot.recv_cq,
                };
                cq.push(c);
            }
            while let Some(e) = slot.qp.poll_event() {
                if self.events.len() < 1024 {
                    self.events.push(AsyncEvent {
                        qpn: Qpn::new(slot.qp.qpn().value()),
                        event: e,
                    });
                }
                if let Event::QpFatal(status) = e {
                    self.last_error = Some(format!(
                        "QP {:#x} entered the error state: {:?}",
                        slot.qp.qpn().value(),
                        status
                    ));
                }
            }
        }
    }
}

/// The MAC address we show for an IP address in captures when the backend has no Ethernet
/// header (`udp`): locally administered, derived from the address, so flows are tellable.
pub(crate) fn mac_for(ip: IpAddr) -> [u8; 6] {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            [0x02, 0x00, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [0x02, o[11], o[12], o[13], o[14], o[15]]
        }
    }
}
