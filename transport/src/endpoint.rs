//! The sans-IO core of a device: datagrams and time in; datagrams, completions, events and the
//! next deadline out (quinn-proto's `Endpoint` role, with `roce_qp::QueuePair`'s four method
//! groups).
//!
//! An [`Endpoint`] owns the device's queue pairs and everything that is pure logic between the
//! datapath and them; it owns no socket, no clock, no buffer pool and no file. The
//! [`crate::engine::Engine`] is the shell around it: it owns the datapath, the receive slots,
//! the transmit arena, the capture file and the clock, and calls in this order each pass:
//!
//! - **Inputs:** [`Endpoint::handle`] for each received datagram (it synthesises the IP/UDP
//!   headers in front of it, recovers a hidden IPv4 Identification, verifies the ICRC, parses,
//!   and demultiplexes by destination QPN), then [`Endpoint::handle_timeouts`].
//! - **Outputs:** [`Endpoint::poll_transmit`] until it returns `None` (each packet has its
//!   ICRC filled for the headers the datapath will put on the wire),
//!   [`Endpoint::drain_completions`] (completions go to their CQs, events to
//!   [`Endpoint::events`]), and [`Endpoint::poll_timeout`] for the next deadline.
//! - **Commands:** [`Endpoint::insert`] and [`Endpoint::remove`] (the verbs reach a QP through
//!   [`Endpoint::qps`]).
//! - **Getters:** the counters, the last error, the statistics of removed QPs.
//!
//! Time is `roce_qp`'s [`Instant`], passed into every call and never read here, so the core
//! runs the same on the system clock and on a virtual one. Bad input from the network never
//! panics: it is dropped and counted in exactly one of [`DeviceCounters`]' `rx_*` counters.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;

use roce_qp::verbs::CqSide;
use roce_qp::{Event, Instant, QpStats, QueuePair, RecvMeta};
use roce_wire::frame::{EthRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::icrc::{Icrc, IdentPolicy, IdentVerdict, Ipv4IdentChecker, ICRC_LEN};
use roce_wire::{bth, Gid, PacketRepr, ParseError, Qpn};

use crate::counters::DeviceCounters;
use crate::cq::{AsyncEvent, CqShared};
use crate::datapath::RxMeta;

/// Largest L2-L4 header the core synthesises (Ethernet + IPv6 + UDP): the headroom a receive
/// buffer needs in front of the datagram, and the size of a transmit header buffer.
pub(crate) const MAX_HEADERS: usize = 14 + 40 + 8;
/// Most asynchronous events kept for the application (older ones are not dropped; newer are).
const MAX_EVENTS: usize = 1024;

/// Takes asynchronous events as the engine produces them, instead of [`Endpoint::events`]
/// (`Device::set_async_event_hook`). It runs under the engine lock.
pub(crate) struct EventHook(pub(crate) Box<dyn Fn(AsyncEvent) + Send>);

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventHook")
    }
}

/// A QP the core drives and the CQs its completions go to.
#[derive(Debug)]
pub(crate) struct QpSlot {
    pub(crate) qp: QueuePair,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
}

/// One datagram [`Endpoint::poll_transmit`] produced: where it goes and how it leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxDesc {
    /// Bytes written into the buffer (BTH .. ICRC).
    pub(crate) len: usize,
    /// Destination IP address and UDP port.
    pub(crate) dst: SocketAddr,
    /// The UDP source port the ICRC was computed for.
    pub(crate) src_port: u16,
    /// IPv4 TOS / IPv6 traffic class.
    pub(crate) tos: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub(crate) hop_limit: u8,
    /// IPv6 flow label.
    pub(crate) flow_label: u32,
    /// Length of the Ethernet/IP/UDP headers written into the header buffer (for capture).
    pub(crate) hdr_len: usize,
}

/// The sans-IO core of a device (see the module docs).
#[derive(Debug)]
pub(crate) struct Endpoint {
    local: SocketAddr,
    local_mac: [u8; 6],
    /// The UDP source port of every datagram when the datapath cannot choose it.
    fixed_source_port: Option<u16>,
    /// By QPN. FxHash: the keys are our own QPNs (only lookups take a peer's value), and
    /// SipHash was ~2% of each side's samples at PMTU 1024 and ~4% of a busy ping-pong.
    pub(crate) qps: HashMap<u32, QpSlot, rustc_hash::FxBuildHasher>,
    /// QPNs in creation order, for fair transmit order.
    order: Vec<u32>,
    /// Where the next transmit scan starts in `order`.
    rr: usize,
    ident_checker: Ipv4IdentChecker,
    pub(crate) counters: DeviceCounters,
    pub(crate) events: Vec<AsyncEvent>,
    /// When set, events go here instead of into `events`.
    pub(crate) event_hook: Option<EventHook>,
    pub(crate) last_error: Option<String>,
    /// Statistics of destroyed QPs (device counters keep counting them).
    pub(crate) retired: Vec<QpStats>,
}

impl Endpoint {
    /// A core for a device at `local` (IP and UDP port) with MAC `local_mac`; datagrams leave
    /// from `fixed_source_port` when the datapath cannot choose the source port.
    pub(crate) fn new(
        local: SocketAddr,
        local_mac: [u8; 6],
        fixed_source_port: Option<u16>,
    ) -> Self {
        Self {
            local,
            local_mac,
            fixed_source_port,
            qps: HashMap::default(),
            order: Vec::new(),
            rr: 0,
            ident_checker: Ipv4IdentChecker::new(IdentPolicy::default()),
            counters: DeviceCounters::default(),
            events: Vec::new(),
            event_hook: None,
            last_error: None,
            retired: Vec::new(),
        }
    }

    // ---------------------------------------------------------------- commands --

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

    // ------------------------------------------------------------------ inputs --

    /// Handles one received datagram: `buf[at..at + len]` is its UDP payload, as `meta`
    /// describes it, and the [`MAX_HEADERS`] bytes before `at` are free: the synthetic
    /// Ethernet/IP/UDP headers are written there so the ICRC is checked in place over one
    /// contiguous buffer. A good packet goes to its QP (which scatters the payload straight
    /// from `buf` into the MR); anything else is counted and dropped.
    ///
    /// With `capture`, the headers are rewritten with the recovered IPv4 Identification.
    /// Returns the range of `buf` holding the whole frame (headers + datagram), whether the
    /// packet was good or not, for capture; `None` if no frame could be built.
    #[must_use]
    pub(crate) fn handle(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        buf: &mut [u8],
        at: usize,
        len: usize,
        capture: bool,
    ) -> Option<Range<usize>> {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += len as u64;
        let Some(mut frame) = rx_frame(self.local_mac, meta) else {
            self.counters.rx_drop_malformed += 1;
            return None;
        };
        let hdr_len = frame.header_len();
        let end = at.checked_add(len).filter(|&e| e <= buf.len());
        let (Some(start), Some(end)) = (at.checked_sub(hdr_len), end) else {
            // The caller's buffer breaks the contract; count it rather than panic.
            self.counters.rx_drop_malformed += 1;
            return None;
        };
        frame.emit_headers(len, &mut buf[start..at]);
        let ip_off = start + 14;
        // Too short for BTH + ICRC: malformed, not an ICRC error (there is no ICRC to check).
        if len < bth::HEADER_LEN + ICRC_LEN {
            self.counters.rx_drop_malformed += 1;
            return Some(start..end);
        }
        let ok = if matches!(frame.ip, IpRepr::V4(_)) && meta.ipv4.is_none() {
            // A UDP socket: solve for the hidden Identification (with DF) and check it is one
            // this peer would send now.
            match self.ident_checker.check(&buf[ip_off..end], now.as_nanos()) {
                IdentVerdict::Accept(ident) => {
                    if let IpRepr::V4(v4) = &mut frame.ip {
                        v4.ident = ident;
                        v4.dont_fragment = true;
                    }
                    if capture {
                        frame.emit_headers(len, &mut buf[start..at]);
                    }
                    true
                }
                IdentVerdict::NoSolution | IdentVerdict::Implausible(_) => false,
            }
        } else {
            roce_wire::icrc::verify(&buf[ip_off..end])
        };
        if !ok {
            self.counters.rx_icrc_errors += 1;
            return Some(start..end);
        }
        self.deliver(now, &frame, meta, &buf[ip_off..end], at - ip_off);
        Some(start..end)
    }

    /// Parses a verified packet (`ip_packet[udp_payload..]` is BTH .. ICRC) and hands it to
    /// its QP.
    fn deliver(
        &mut self,
        now: Instant,
        frame: &FrameRepr,
        m: &RxMeta,
        ip_packet: &[u8],
        udp_payload: usize,
    ) {
        let bytes = &ip_packet[udp_payload..];
        // A READ request, atomic or FLUSH with bytes after its headers, a PadCnt or an odd
        // length: rxe ignores those bytes and executes it, so it is parsed without them.
        let parsed = PacketRepr::parse(bytes).or_else(|e| match e {
            ParseError::UnexpectedPayload | ParseError::BadPadCount | ParseError::BadLength => {
                PacketRepr::parse_payloadless_request(bytes).ok_or(e)
            }
            _ => Err(e),
        });
        // Any other packet whose PadCnt is larger than its payload, or whose length is not a
        // multiple of 4, cannot be parsed, yet rxe answers such a request (a length error:
        // NAK invalid request): it still goes to its QP.
        let bad_pad = match &parsed {
            Err(ParseError::BadPadCount | ParseError::BadLength) => bth::Packet::new_checked(bytes)
                .and_then(|p| bth::Repr::parse(&p))
                .ok(),
            _ => None,
        };
        let dqpn = match (&parsed, &bad_pad) {
            (Ok(packet), _) => packet.bth.dest_qp.value(),
            (Err(_), Some(bth)) => bth.dest_qp.value(),
            (Err(_), None) => {
                self.counters.rx_drop_malformed += 1;
                return;
            }
        };
        let Some(slot) = self.qps.get_mut(&dqpn) else {
            self.counters.rx_drop_no_qp += 1;
            return;
        };
        self.counters.rx_delivered += 1;
        let mut grh = [0u8; 40];
        match frame.ip {
            IpRepr::V4(_) => grh[20..].copy_from_slice(&ip_packet[..20]),
            IpRepr::V6(_) => grh.copy_from_slice(&ip_packet[..40]),
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
        match (parsed, bad_pad) {
            (Ok(packet), _) => slot.qp.handle_packet(now, &packet, &meta),
            (Err(_), Some(bth)) => slot.qp.handle_bad_pad(now, &bth, &meta),
            (Err(_), None) => {}
        }
    }

    /// Fires every QP timer due at `now`, in QP creation order (so a run replays exactly).
    pub(crate) fn handle_timeouts(&mut self, now: Instant) {
        for qpn in &self.order {
            let Some(slot) = self.qps.get_mut(qpn) else {
                continue;
            };
            if slot.qp.poll_timeout().is_some_and(|t| t <= now) {
                slot.qp.handle_timeout(now);
            }
        }
    }

    // ----------------------------------------------------------------- outputs --

    /// The next packet of the QPs, round robin (a QP is drained before the next one's turn),
    /// written into `buf` (BTH .. ICRC, `buf` at least path MTU + 64 bytes) with its ICRC
    /// filled for the headers it will travel with; those headers are written into `hdr`. A
    /// packet that cannot be sent is counted and skipped.
    #[must_use]
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        hdr: &mut [u8; MAX_HEADERS],
    ) -> Option<TxDesc> {
        let n = self.order.len();
        if n == 0 {
            return None;
        }
        let mut idle = 0;
        let mut i = self.rr % n;
        while idle < n {
            let qpn = self.order[i];
            let Some(slot) = self.qps.get_mut(&qpn) else {
                idle += 1;
                i = (i + 1) % n;
                continue;
            };
            let Some(t) = slot.qp.poll_transmit(now, buf) else {
                idle += 1;
                i = (i + 1) % n;
                continue;
            };
            idle = 0;
            self.rr = i;
            let mut desc = TxDesc {
                len: t.len,
                dst: SocketAddr::new(t.ah.dgid.to_ip(), ROCEV2_PORT),
                src_port: self.fixed_source_port.unwrap_or(t.udp_sport),
                tos: t.ah.traffic_class,
                hop_limit: t.ah.hop_limit,
                flow_label: t.ah.flow_label,
                hdr_len: 0,
            };
            if let Some(hdr_len) = self.finish_packet(&desc, &mut buf[..t.len], hdr) {
                desc.hdr_len = hdr_len;
                return Some(desc);
            }
        }
        self.rr = i;
        None
    }

    /// Writes the headers `d` leaves with into `hdr` and fills the ICRC of `packet` for them.
    /// Returns the header length, or `None` (counted) if the packet cannot be sent.
    fn finish_packet(
        &mut self,
        d: &TxDesc,
        packet: &mut [u8],
        hdr: &mut [u8; MAX_HEADERS],
    ) -> Option<usize> {
        let Some(frame) = tx_frame(self.local, self.local_mac, d) else {
            self.counters.tx_drop_address += 1;
            self.last_error = Some(format!(
                "cannot send from {} to {}: address families differ",
                self.local.ip(),
                d.dst.ip()
            ));
            return None;
        };
        let hdr_len = frame.header_len();
        frame.emit_headers(d.len, &mut hdr[..hdr_len]);
        if !fill_icrc(&hdr[..hdr_len], packet) {
            self.counters.tx_drop_address += 1;
            return None;
        }
        Some(hdr_len)
    }

    /// The earliest QP timer.
    #[must_use]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.qps.values().filter_map(|s| s.qp.poll_timeout()).min()
    }

    /// Moves completions from the QPs to their CQs, and QP events to [`Self::events`], in
    /// QP creation order (so QPs sharing a CQ replay exactly).
    pub(crate) fn drain_completions(&mut self) {
        for qpn in &self.order {
            let Some(slot) = self.qps.get_mut(qpn) else {
                continue;
            };
            let (send_cq, recv_cq) = (&slot.send_cq, &slot.recv_cq);
            slot.qp.drain_completions_sends_first(|side, c| match side {
                CqSide::Send => send_cq.push(c),
                CqSide::Recv => recv_cq.push(c),
            });
            while let Some(e) = slot.qp.poll_event() {
                let ev = AsyncEvent {
                    qpn: Qpn::new(slot.qp.qpn().value()),
                    event: e,
                };
                match &self.event_hook {
                    Some(hook) => (hook.0)(ev),
                    None if self.events.len() < MAX_EVENTS => self.events.push(ev),
                    None => {}
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

/// The headers a received datagram came with, as far as `m` tells them (the IPv4
/// Identification is 0 when the backend does not report it); `None` if the addresses are of
/// different families.
pub(crate) fn rx_frame(local_mac: [u8; 6], m: &RxMeta) -> Option<FrameRepr> {
    let ip = match (m.src.ip(), m.dst.ip()) {
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
        _ => return None,
    };
    Some(FrameRepr {
        eth: Some(EthRepr {
            dst: local_mac,
            src: mac_for(m.src.ip()),
            vlan: None,
        }),
        ip,
        udp: UdpRepr {
            src_port: m.src.port(),
            dst_port: m.dst.port(),
            checksum: 0,
        },
    })
}

/// The headers a datagram from `local` leaves with (what the backend puts on the wire: IPv4
/// Identification 0 and DF); `None` if the addresses are of different families.
pub(crate) fn tx_frame(local: SocketAddr, local_mac: [u8; 6], d: &TxDesc) -> Option<FrameRepr> {
    let ip = match (local.ip(), d.dst.ip()) {
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
            src: local_mac,
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

/// Fills the ICRC (the last four bytes of `packet`, BTH .. ICRC) for the Ethernet/IP/UDP
/// headers `hdr`. Returns false if the packet is too short to carry a BTH and an ICRC, or the
/// headers are not IP.
pub(crate) fn fill_icrc(hdr: &[u8], packet: &mut [u8]) -> bool {
    const BTH: usize = bth::HEADER_LEN;
    if packet.len() < BTH + ICRC_LEN || hdr.len() < 14 + 8 {
        return false;
    }
    let ip = &hdr[14..hdr.len() - 8];
    let udp = &hdr[hdr.len() - 8..];
    let body_end = packet.len() - ICRC_LEN;
    let Some(mut icrc) = Icrc::start(ip, udp, &packet[..BTH]) else {
        return false;
    };
    icrc.update(&packet[BTH..body_end]);
    packet[body_end..].copy_from_slice(&icrc.finish());
    true
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

#[cfg(test)]
mod tests {
    use roce_mr::{Access, MrTable};
    use roce_qp::state::{AttrMask, QpAttr};
    use roce_qp::verbs::{
        AddressHandle, Completion, Mtu, QpState, QpType, SendData, SendOp, SendWr, Sge, UdDest,
        WcOpcode, WcStatus,
    };
    use roce_qp::{Mem, QpConfig};
    use roce_wire::{LKey, Psn, QKey};

    use super::*;
    use crate::datapath::Ipv4Info;
    use crate::sys::lock;

    const QKEY: u32 = 0x1111_1111;
    const T0: Instant = Instant::ZERO;

    /// An endpoint with one UD QP in RTS, a CQ and a posted 256-byte receive.
    struct Node {
        ep: Endpoint,
        cq: Arc<CqShared>,
        addr: SocketAddr,
        qpn: u32,
    }

    fn node(ip: &str, qpn: u32, fixed_source_port: Option<u16>) -> Node {
        let addr = SocketAddr::new(ip.parse().unwrap(), ROCEV2_PORT);
        let mut ep = Endpoint::new(addr, mac_for(addr.ip()), fixed_source_port);
        let table = Arc::new(MrTable::new(16, 7));
        let pd = table.alloc_pd();
        let cfg = QpConfig::new(QpType::Ud);
        let mut qp = QueuePair::new(Qpn::new(qpn), cfg, Mem::new(table.clone(), pd), None);
        qp.set_port_mtu(Mtu::Mtu1024);
        let attr = QpAttr {
            state: QpState::Init,
            qkey: QKey::new(QKEY),
            port: 1,
            ..QpAttr::default()
        };
        let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
        qp.modify(&attr, init).unwrap();
        let rtr = QpAttr {
            state: QpState::Rtr,
            ..attr
        };
        qp.modify(&rtr, AttrMask::STATE).unwrap();
        let rts = QpAttr {
            state: QpState::Rts,
            sq_psn: Psn::new(0),
            ..attr
        };
        qp.modify(&rts, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
        let key = table
            .register_zeroed(pd, 256, 0x1000, Access::LOCAL_WRITE)
            .unwrap();
        let sge = Sge {
            addr: 0x1000,
            length: 256,
            lkey: LKey::new(key.0),
        };
        qp.post_recv(roce_qp::verbs::RecvWr {
            wr_id: 77,
            sges: vec![sge],
        })
        .unwrap();
        let cq = Arc::new(CqShared::new(64).unwrap());
        ep.insert(QpSlot {
            qp,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
        });
        Node { ep, cq, addr, qpn }
    }

    impl Node {
        /// Posts a UD SEND of `data` to `to`'s QP at `to_ip`.
        fn send(&mut self, to_ip: IpAddr, to_qpn: u32, data: &[u8]) {
            let mut wr = SendWr::new(5, SendOp::Send, vec![]);
            wr.data = SendData::Inline(data.to_vec());
            wr.ud = Some(UdDest {
                ah: AddressHandle::new(Gid::from_ip(to_ip)),
                remote_qpn: Qpn::new(to_qpn),
                remote_qkey: QKey::new(QKEY),
            });
            let qp = &mut self.ep.qps.get_mut(&self.qpn).unwrap().qp;
            qp.post_send(T0, wr).unwrap();
        }

        /// The next datagram: its descriptor, headers and bytes.
        fn transmit(&mut self) -> Option<(TxDesc, Vec<u8>, Vec<u8>)> {
            let mut buf = vec![0u8; 1024 + 64];
            let mut hdr = [0u8; MAX_HEADERS];
            let d = self.ep.poll_transmit(T0, &mut buf, &mut hdr)?;
            Some((d, hdr[..d.hdr_len].to_vec(), buf[..d.len].to_vec()))
        }

        /// Hands a datagram from `from` to this endpoint, as a backend would.
        fn receive(
            &mut self,
            d: &TxDesc,
            from: SocketAddr,
            packet: &[u8],
            ipv4: Option<Ipv4Info>,
        ) -> (Option<Range<usize>>, Vec<u8>) {
            let mut buf = vec![0u8; MAX_HEADERS + packet.len()];
            buf[MAX_HEADERS..].copy_from_slice(packet);
            let meta = RxMeta {
                len: packet.len(),
                stride: packet.len(),
                src: SocketAddr::new(from.ip(), d.src_port),
                dst: d.dst,
                tos: d.tos,
                ipv4,
            };
            let r = self
                .ep
                .handle(T0, &meta, &mut buf, MAX_HEADERS, packet.len(), true);
            (r, buf)
        }

        fn completions(&mut self) -> Vec<Completion> {
            self.ep.drain_completions();
            let mut out = [Completion::EMPTY; 8];
            let n = lock(&self.cq.queue).poll_many(&mut out);
            out[..n].to_vec()
        }
    }

    const SEEN: Option<Ipv4Info> = Some(Ipv4Info {
        ident: 0,
        dont_fragment: true,
    });

    fn icrc_ok(hdr: &[u8], packet: &[u8]) -> bool {
        roce_wire::icrc::verify(&[&hdr[14..], packet].concat())
    }

    #[test]
    fn a_datagram_one_endpoint_sends_is_delivered_by_another() {
        let mut a = node("10.0.0.1", 0x11, None);
        let mut b = node("10.0.0.2", 0x12, None);
        a.send(b.addr.ip(), b.qpn, b"hello");
        let (d, hdr, packet) = a.transmit().expect("a datagram");
        assert!(a.transmit().is_none());
        assert_eq!(d.dst, b.addr);
        assert_eq!(d.hdr_len, 14 + 20 + 8);
        assert!(icrc_ok(&hdr, &packet), "the ICRC is filled for the headers");
        let (frame, buf) = b.receive(&d, a.addr, &packet, SEEN);
        let frame = frame.expect("a frame for capture");
        assert_eq!(&buf[frame.clone()][d.hdr_len..], &packet[..]);
        assert_eq!(frame.len(), d.hdr_len + packet.len());
        let c = DeviceCounters {
            rx_packets: 1,
            rx_bytes: packet.len() as u64,
            rx_delivered: 1,
            ..DeviceCounters::default()
        };
        assert_eq!(b.ep.counters, c);
        let got = b.completions();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].wr_id, got[0].status), (77, WcStatus::Success));
        assert_eq!(got[0].opcode, WcOpcode::Recv);
        assert_eq!(got[0].byte_len, 40 + 5, "GRH + payload");
        let sent = a.completions();
        assert_eq!((sent[0].wr_id, sent[0].status), (5, WcStatus::Success));
    }

    #[test]
    fn a_hidden_ipv4_identification_is_recovered_from_the_icrc() {
        let mut a = node("10.0.0.1", 0x11, None);
        let mut b = node("10.0.0.2", 0x12, None);
        a.send(b.addr.ip(), b.qpn, b"ident");
        let (d, mut hdr, mut packet) = a.transmit().unwrap();
        // The wire carried Identification 0x1234 with DF (a kernel that numbers DF datagrams,
        // as Linux 6.18 does for unconnected sockets without IP_PMTUDISC_DO): the ICRC covers
        // it.
        hdr[14 + 4..14 + 6].copy_from_slice(&0x1234u16.to_be_bytes());
        assert!(fill_icrc(&hdr, &mut packet));
        // A UDP socket does not report the IP header.
        let (frame, buf) = b.receive(&d, a.addr, &packet, None);
        assert_eq!(b.ep.counters.rx_icrc_errors, 0);
        let frame = &buf[frame.unwrap()];
        assert_eq!(
            frame[14 + 4..14 + 6],
            [0x12, 0x34],
            "captured with the real ident"
        );
        assert_eq!(frame[14 + 6] & 0x40, 0x40, "and DF");
        assert!(roce_wire::icrc::verify(&frame[14..]));
        assert_eq!(b.completions().len(), 1);
        // The same without DF: every RoCEv2 sender sets DF, so no solution is taken that
        // clears it (issue 12: it halves the false-accept rate).
        a.send(b.addr.ip(), b.qpn, b"ident");
        let (d2, mut hdr2, mut packet2) = a.transmit().unwrap();
        hdr2[14 + 4..14 + 6].copy_from_slice(&0x1235u16.to_be_bytes());
        hdr2[14 + 6] &= !0x40;
        assert!(fill_icrc(&hdr2, &mut packet2));
        let _ = b.receive(&d2, a.addr, &packet2, None);
        assert_eq!(b.ep.counters.rx_icrc_errors, 1, "DF clear: rejected");
        // A backend that reports the header gets all 32 bits checked: ident 0 is wrong here.
        let (_, _) = b.receive(&d, a.addr, &packet, SEEN);
        assert_eq!(b.ep.counters.rx_icrc_errors, 2);
    }

    #[test]
    fn a_flipped_bit_is_an_icrc_error_and_reaches_no_qp() {
        let mut a = node("10.0.0.1", 0x11, None);
        let mut b = node("10.0.0.2", 0x12, None);
        a.send(b.addr.ip(), b.qpn, b"corrupt me");
        let (d, _, mut packet) = a.transmit().unwrap();
        let last = packet.len() - 6;
        packet[last] ^= 0x08;
        let (frame, _) = b.receive(&d, a.addr, &packet, SEEN);
        assert!(frame.is_some(), "bad frames are still captured");
        let (frame, _) = b.receive(&d, a.addr, &packet, None);
        assert!(frame.is_some());
        assert_eq!(b.ep.counters.rx_icrc_errors, 2);
        assert_eq!(b.ep.counters.rx_packets, 2);
        assert!(b.completions().is_empty());
    }

    #[test]
    fn a_datagram_for_no_qp_is_counted_once() {
        let mut a = node("10.0.0.1", 0x11, None);
        let mut b = node("10.0.0.2", 0x12, None);
        a.send(b.addr.ip(), 0x99, b"nobody");
        let (d, _, packet) = a.transmit().unwrap();
        let _ = b.receive(&d, a.addr, &packet, SEEN);
        let c = b.ep.counters;
        assert_eq!(
            (c.rx_drop_no_qp, c.rx_icrc_errors, c.rx_drop_malformed),
            (1, 0, 0)
        );
        assert!(b.completions().is_empty());
    }

    #[test]
    fn malformed_input_is_dropped_and_counted_without_panicking() {
        let mut a = node("10.0.0.1", 0x11, None);
        let mut b = node("10.0.0.2", 0x12, None);
        a.send(b.addr.ip(), b.qpn, b"x");
        let (d, _, packet) = a.transmit().unwrap();
        // Source and destination of different families.
        let v6 = TxDesc {
            dst: "[fe80::2]:4791".parse().unwrap(),
            ..d
        };
        let (frame, _) = b.receive(&v6, a.addr, &packet, SEEN);
        assert!(frame.is_none());
        assert_eq!(b.ep.counters.rx_drop_malformed, 1);
        // Shorter than a BTH and an ICRC: malformed (there is no ICRC to check).
        let _ = b.receive(&d, a.addr, &packet[..8], SEEN);
        assert_eq!(b.ep.counters.rx_drop_malformed, 2);
        assert_eq!(b.ep.counters.rx_icrc_errors, 0);
        // A buffer without room for the headers, and a length past its end.
        let meta = RxMeta {
            len: packet.len(),
            stride: packet.len(),
            src: a.addr,
            dst: b.addr,
            tos: 0,
            ipv4: SEEN,
        };
        let mut tight = packet.clone();
        assert!(b
            .ep
            .handle(T0, &meta, &mut tight, 0, packet.len(), false)
            .is_none());
        let mut short = vec![0u8; MAX_HEADERS + 4];
        assert!(b
            .ep
            .handle(T0, &meta, &mut short, MAX_HEADERS, 100, false)
            .is_none());
        assert_eq!(b.ep.counters.rx_drop_malformed, 4);
        assert_eq!(b.ep.counters.rx_packets, 4);
        assert!(b.completions().is_empty());
    }

    #[test]
    fn a_destination_of_the_other_family_is_not_sent_and_is_reported() {
        let mut a = node("10.0.0.1", 0x11, None);
        a.send("fe80::2".parse().unwrap(), 0x12, b"v6");
        assert!(a.transmit().is_none());
        assert_eq!(a.ep.counters.tx_drop_address, 1);
        assert!(a
            .ep
            .last_error
            .as_deref()
            .unwrap()
            .contains("families differ"));
    }

    #[test]
    fn a_fixed_source_port_is_what_the_icrc_covers() {
        let mut a = node("10.0.0.1", 0x11, Some(4_791));
        a.send("10.0.0.2".parse().unwrap(), 0x12, b"port");
        let (d, hdr, packet) = a.transmit().unwrap();
        assert_eq!(d.src_port, 4_791);
        let udp = &hdr[d.hdr_len - 8..];
        assert_eq!(udp[..2], 4_791u16.to_be_bytes());
        assert!(icrc_ok(&hdr, &packet));
    }

    #[test]
    fn fill_icrc_refuses_what_cannot_carry_an_icrc() {
        let mut a = node("10.0.0.1", 0x11, None);
        a.send("10.0.0.2".parse().unwrap(), 0x12, b"abc");
        let (_, hdr, mut packet) = a.transmit().unwrap();
        assert!(!fill_icrc(&hdr, &mut packet[..12 + 3]));
        assert!(!fill_icrc(&hdr[..10], &mut packet));
        packet.iter_mut().rev().take(4).for_each(|b| *b = 0);
        assert!(fill_icrc(&hdr, &mut packet));
        assert!(icrc_ok(&hdr, &packet));
    }

    #[test]
    fn transmit_drains_one_qp_before_the_next_ones_turn() {
        let mut a = node("10.0.0.1", 0x11, None);
        let second = node("10.0.0.1", 0x21, None);
        let (qpn2, slot2) = second.ep.qps.into_iter().next().unwrap();
        a.ep.insert(slot2);
        let dst: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..2 {
            a.send(dst, 0x12, b"one");
        }
        let qp2 = &mut a.ep.qps.get_mut(&qpn2).unwrap().qp;
        for _ in 0..2 {
            let mut wr = SendWr::new(9, SendOp::Send, vec![]);
            wr.data = SendData::Inline(b"two".to_vec());
            wr.ud = Some(UdDest {
                ah: AddressHandle::new(Gid::from_ip(dst)),
                remote_qpn: Qpn::new(0x12),
                remote_qkey: QKey::new(QKEY),
            });
            qp2.post_send(T0, wr).unwrap();
        }
        let order: Vec<u32> = std::iter::from_fn(|| a.transmit())
            .map(|(_, _, p)| {
                PacketRepr::parse(&p)
                    .unwrap()
                    .ext
                    .deth
                    .unwrap()
                    .src_qp
                    .value()
            })
            .collect();
        assert_eq!(order, [0x11, 0x11, 0x21, 0x21]);
        assert_eq!(a.ep.poll_timeout(), None, "UD arms no timer");
    }
}
