//! The engine: drives every queue pair of a device over its datapath.
//!
//! One `Engine` per device, behind the device's mutex. A pass of [`Engine::progress`]:
//!
//! 1. **receive**: up to a budget of batches from the datapath into fixed receive slots; each
//!    datagram (GRO buffers are split by their stride) gets synthetic IP/UDP headers written
//!    into the slot's headroom in front of it, so the ICRC is checked in place over one
//!    contiguous buffer. A UDP socket hides the IPv4 Identification: it is recovered from the
//!    ICRC ([`roce_wire::icrc::Ipv4IdentSolver`]); other backends report it and all 32 bits are
//!    checked. Good packets are parsed, demultiplexed by destination QPN and fed to their QP;
//!    the QP scatters the payload straight from the slot into the MR (the one receive copy);
//! 2. **timers**: every QP whose deadline passed;
//! 3. **transmit**: each QP writes its packets (BTH .. ICRC, copied once from the MR) back to
//!    back into the transmit arena, the engine fills the ICRC for the IP header the backend
//!    will put on the wire (IPv4 Identification 0, DF), and the batch goes to the datapath in
//!    one call (sendmmsg, GSO when contiguous runs allow). Just before, the datapath says
//!    which IPv4 Identification each datagram will really carry
//!    ([`Datapath::plan_ipv4_idents`]: segment `k` of a GSO message gets `k`) and the engine
//!    rewrites those ICRCs in place ([`Ipv4IdentPatcher`]); the capture keeps the frames as
//!    built (Identification 0 and its ICRC);
//! 4. **completions**: drained from the QPs into their completion queues.
//!
//! The logic of each step (header synthesis, Identification recovery, ICRC, parsing,
//! demultiplexing, ICRC fill, round robin, timers) is the sans-IO [`Endpoint`]; the engine is
//! its shell: it owns the datapath, the buffers, the capture file and the clock, so the same
//! passes run on the system clock or on a [`crate::clock::VirtualClock`].
//!
//! Nothing here allocates per packet: the slots, the arena and the batch arrays are allocated
//! when the device opens.

use std::io::{self, IoSliceMut};
use std::sync::Arc;

use arrayvec::ArrayVec;

use roce_qp::Instant as QpInstant;
use roce_wire::aeth::Syndrome;
use roce_wire::bth;
use roce_wire::icrc::{Ipv4IdentPatcher, ICRC_LEN};

use crate::capture::CaptureFile;
use crate::clock::Clock;
use crate::datapath::{Datapath, RxDrops, RxMeta, TxDatagram};
use crate::endpoint::{Endpoint, TxDesc, MAX_HEADERS};
use crate::inbox::{InboxQueue, Route};
use crate::sys::lock;

/// Datagrams per receive or send batch.
pub(crate) const BATCH: usize = 64;
/// Room in front of each received datagram for synthetic Ethernet + IPv6 + UDP headers.
const HEADROOM: usize = 64;
const _: () = assert!(HEADROOM >= MAX_HEADERS);
/// IPv4 header (no options) + UDP header: what the engine puts in front of a payload.
const IPV4_UDP: usize = 20 + 8;
/// Receive batches per progress pass before yielding (bounds the time the lock is held).
const RX_BATCHES_PER_PASS: usize = 8;

/// One queued datagram in the transmit arena.
#[derive(Clone, Copy, Debug)]
struct Queued {
    offset: usize,
    desc: TxDesc,
    /// The IPv4 Identification its ICRC is computed for (0 as built; see
    /// [`Datapath::plan_ipv4_idents`]).
    ident: u16,
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

/// The per-device engine: the I/O shell around the device's [`Endpoint`].
#[derive(Debug)]
pub(crate) struct Engine {
    dp: Box<dyn Datapath>,
    clock: Arc<dyn Clock>,
    /// The sans-IO core: the QPs, the counters, the events.
    pub(crate) ep: Endpoint,
    rx_slots: Box<[u8]>,
    rx_slot_len: usize,
    rx_meta: Box<[RxMeta]>,
    tx_arena: Box<[u8]>,
    tx_descs: Vec<Queued>,
    tx_used: usize,
    /// First descriptor not yet accepted by the datapath.
    tx_pending: usize,
    /// Packets were deferred by an earlier pass (see [`Engine::progress`]).
    tx_deferred_earlier: bool,
    /// Room one packet needs in the arena (path MTU + headers + trailer).
    tx_room: usize,
    scratch: Box<[u8]>,
    pub(crate) capture: Option<CaptureFile>,
    /// The datapath's receive drops already folded into the counters.
    rx_drops_seen: RxDrops,
    /// Rewrites ICRCs for the Identifications the datapath plans (IPv4 GSO segments).
    ident_patcher: Ipv4IdentPatcher,
    /// A device with several engines: where datagrams of other engines' QPs go
    /// ([`crate::inbox`]), and the empty buffer this engine's inbox is swapped with.
    pub(crate) route: Option<Route>,
    inbox_spare: InboxQueue,
}

impl Engine {
    /// An engine over `dp` for packets of at most `max_payload` bytes (path MTU), on `clock`.
    pub(crate) fn new(
        dp: Box<dyn Datapath>,
        max_payload: usize,
        local_mac: [u8; 6],
        clock: Arc<dyn Clock>,
    ) -> Self {
        let caps = dp.caps();
        let local = dp.local_addr();
        // One packet: BTH + largest extension headers (28) + payload + pad + ICRC.
        let tx_room = max_payload + 64;
        let segments = caps.gro_segments.max(1);
        // A GRO buffer holds up to 64 KiB, and so may a packet seen with its IP header (a
        // whole GSO message from a sender on this host; the `udp` backend's raw receive cuts
        // it); a plain one the largest IP packet.
        let rx_data = if segments > 1 || caps.sees_ip_header {
            65_536
        } else {
            caps.ip_mtu.clamp(1500, 65_536)
        };
        let rx_slot_len = HEADROOM + rx_data;
        let rx_slots_n = if segments > 1 { 8 } else { BATCH };
        Self {
            dp,
            clock,
            ep: Endpoint::new(local, local_mac, caps.fixed_source_port),
            rx_slots: vec![0u8; rx_slot_len * rx_slots_n].into_boxed_slice(),
            rx_slot_len,
            rx_meta: vec![RxMeta::empty(); rx_slots_n].into_boxed_slice(),
            tx_arena: vec![0u8; tx_room * BATCH].into_boxed_slice(),
            tx_descs: Vec::with_capacity(BATCH),
            tx_used: 0,
            tx_pending: 0,
            tx_deferred_earlier: false,
            tx_room,
            scratch: vec![0u8; MAX_HEADERS + tx_room.max(rx_data)].into_boxed_slice(),
            rx_drops_seen: RxDrops::default(),
            capture: None,
            ident_patcher: Ipv4IdentPatcher::new(),
            route: None,
            inbox_spare: InboxQueue::default(),
        }
    }

    /// The backend.
    pub(crate) fn datapath(&self) -> &dyn Datapath {
        &*self.dp
    }

    /// Folds the datapath's unseen receive drops into the counters (call before reading them;
    /// may make a system call): kernel drops into `rx_drop_kernel`, datagrams the backend
    /// discarded as malformed into `rx_packets` and `rx_drop_malformed`.
    pub(crate) fn refresh_rx_drops(&mut self) {
        let now = self.dp.rx_drops();
        let seen = self.rx_drops_seen;
        let malformed = now.malformed.saturating_sub(seen.malformed);
        let c = &mut self.ep.counters;
        c.rx_packets += malformed;
        c.rx_drop_malformed += malformed;
        c.rx_drop_kernel += now.kernel.saturating_sub(seen.kernel);
        if let Some(r) = &self.route {
            c.rx_drop_kernel += r.all[r.me].take_dropped();
        }
        self.rx_drops_seen = now;
    }

    /// The engine clock.
    pub(crate) fn now(&self) -> QpInstant {
        self.clock.now()
    }

    /// Removes a QP (its unsent packets are dropped, as a destroyed QP's would be).
    pub(crate) fn remove(&mut self, qpn: u32) {
        self.ep.remove(qpn);
    }

    /// The earliest time something needs doing without input, on the engine clock: a QP
    /// timer or the datapath's next wake-up (a delayed packet of a fault injector).
    pub(crate) fn next_deadline(&self) -> Option<QpInstant> {
        let qp = self.ep.poll_timeout();
        let dp = self.dp.next_wakeup().map(|d| {
            let now = self.now().as_nanos();
            QpInstant::from_nanos(now.saturating_add(d.as_nanos().min(u128::from(u64::MAX)) as u64))
        });
        match (qp, dp) {
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
        self.drain_inbox(now, &mut result);
        self.receive(now, &mut result);
        if defer_tx
            && result.received == 0
            && !self.tx_waiting()
            && self.ep.poll_timeout().is_none_or(|t| t > now)
        {
            // An application's poll that found nothing (one spin of a busy poller): no
            // packet came in and no timer is due, so no QP has anything new to send (a post
            // rings its own doorbell); completions made outside a pass (a receive posted to a
            // QP in the error state) still go to their CQs.
            self.ep.drain_completions();
            return result;
        }
        self.ep.handle_timeouts(now);
        if defer_tx {
            self.transmit_deferred(now);
        } else {
            self.transmit(now, &mut result);
        }
        self.ep.drain_completions();
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
        self.ep.drain_completions();
        result
    }

    // ----------------------------------------------------------------- receive --

    /// Handles what other engines of the device handed to this one ([`crate::inbox`]).
    fn drain_inbox(&mut self, now: QpInstant, result: &mut PassResult) {
        let Some(route) = &self.route else {
            return;
        };
        if !route.all[route.me].take(&mut self.inbox_spare) {
            return;
        }
        let q = std::mem::take(&mut self.inbox_spare);
        let slot = &mut self.rx_slots[..self.rx_slot_len];
        for (meta, start) in &q.items {
            let len = meta.len;
            if HEADROOM + len > slot.len() {
                // Cannot happen (every engine's slots have one size); counted, not handled.
                self.ep.counters.rx_packets += 1;
                self.ep.counters.rx_drop_malformed += 1;
                continue;
            }
            slot[HEADROOM..HEADROOM + len].copy_from_slice(&q.bytes[*start..*start + len]);
            let capture = self.capture.is_some();
            let frame = self.ep.handle(now, meta, slot, HEADROOM, len, capture);
            if let (Some(cap), Some(frame)) = (&self.capture, frame) {
                lock(&cap.0).write(&slot[frame]);
            }
            self.ep.counters.rx_handed_in += 1;
            result.received += 1;
        }
        self.inbox_spare = q;
        self.inbox_spare.clear();
    }

    fn receive(&mut self, now: QpInstant, result: &mut PassResult) {
        // Engines (< 64, `MAX_ENGINES`) handed a datagram this pass: woken once each at the end.
        let mut woken = 0u64;
        self.receive_batches(now, result, &mut woken);
        if let Some(r) = &self.route {
            for to in 0..r.all.len().min(64) {
                if woken & (1u64 << to) != 0 {
                    r.wake(to);
                }
            }
        }
    }

    fn receive_batches(&mut self, now: QpInstant, result: &mut PassResult, woken: &mut u64) {
        for _ in 0..RX_BATCHES_PER_PASS {
            let n = {
                let slot_len = self.rx_slot_len;
                let mut bufs: ArrayVec<IoSliceMut<'_>, BATCH> = self
                    .rx_slots
                    .chunks_exact_mut(slot_len)
                    .take(BATCH)
                    .map(|chunk| IoSliceMut::new(&mut chunk[HEADROOM..]))
                    .collect();
                match self.dp.recv(&mut bufs, &mut self.rx_meta) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.ep.counters.rx_errors += 1;
                        self.ep.last_error = Some(format!("receive: {e}"));
                        return;
                    }
                }
            };
            for i in 0..n {
                let meta = self.rx_meta[i];
                let stride = meta.stride.max(1);
                let slot = &mut self.rx_slots[i * self.rx_slot_len..(i + 1) * self.rx_slot_len];
                let mut off = 0;
                // An empty datagram is still a datagram: handled once (counted malformed).
                let mut empty = meta.len == 0;
                let mut meta = meta;
                while off < meta.len || std::mem::take(&mut empty) {
                    let seg = stride.min(meta.len - off);
                    if let Some(r) = &self.route {
                        let data = &slot[HEADROOM + off..HEADROOM + off + seg];
                        if let Some(to) = r.owner(data) {
                            // Another engine's QP (NAPI GRO merged it in): hand it on.
                            if r.hand_on(to, &meta, data) {
                                self.ep.counters.rx_handed_on += 1;
                                *woken |= 1u64 << (to % 64);
                            }
                            result.received += 1;
                            off += stride;
                            if let Some(v4) = &mut meta.ipv4 {
                                v4.ident = v4.ident.wrapping_add(1);
                            }
                            continue;
                        }
                    }
                    let capture = self.capture.is_some();
                    let frame = self
                        .ep
                        .handle(now, &meta, slot, HEADROOM + off, seg, capture);
                    if let (Some(cap), Some(frame)) = (&self.capture, frame) {
                        lock(&cap.0).write(&slot[frame]);
                    }
                    result.received += 1;
                    off += stride;
                    if let Some(v4) = &mut meta.ipv4 {
                        // A whole GSO message seen with its header (raw receive): the kernel
                        // numbers its segments' Identifications on from the header's.
                        v4.ident = v4.ident.wrapping_add(1);
                    }
                }
            }
            if n < self.rx_meta.len() {
                return;
            }
        }
        result.more_rx = true;
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
                self.acks_last();
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

    /// Fills the arena from the endpoint; returns whether anything is queued.
    fn fill(&mut self, now: QpInstant) -> bool {
        let mut hdr = [0u8; MAX_HEADERS];
        while self.tx_descs.len() < BATCH && self.tx_arena.len() - self.tx_used >= self.tx_room {
            let start = self.tx_used;
            let buf = &mut self.tx_arena[start..start + self.tx_room];
            let Some(desc) = self.ep.poll_transmit(now, buf, &mut hdr) else {
                break;
            };
            if let Some(cap) = &self.capture {
                let total = desc.hdr_len + desc.len;
                self.scratch[..desc.hdr_len].copy_from_slice(&hdr[..desc.hdr_len]);
                self.scratch[desc.hdr_len..total].copy_from_slice(&buf[..desc.len]);
                lock(&cap.0).write(&self.scratch[..total]);
            }
            self.tx_descs.push(Queued {
                offset: start,
                desc,
                ident: 0,
            });
            self.tx_used += desc.len;
        }
        !self.tx_descs.is_empty()
    }

    /// Moves a plain ACK at the front of the pending datagrams behind the requests that follow
    /// it, when the datapath then sends them all as one UDP GSO message
    /// ([`Datapath::first_message_len`], below; its bytes are copied to the end of the arena, so
    /// the run stays back to back in memory); otherwise the built order stands.
    ///
    /// The ACK of a message received by a pass that deferred its sending ([`Self::progress`]
    /// with `defer_tx`) waits in the arena until the application answers. A ping-pong's
    /// answer then leaves first and its ACK right behind it: the peer's next step waits for
    /// the answer, so the ACK's own send costs no latency, and the two (same peer, same QP,
    /// the shorter one last) form one UDP GSO message, which the kernel moves as one packet
    /// and the peer's GRO socket takes in one receive. Measured on loopback (two processes
    /// busy polling, 64-byte ping-pong): 2 datagrams per direction in one `sendmmsg` cost
    /// 12.0 µs per round trip against 7.1 for one, and 7.3 as one GSO message (on a later VM
    /// over veth, 64-byte `send-lat` busy: 10.4 µs ACK first against 7.0).
    ///
    /// Only as one GSO message: a NIC's ACK always leaves before the application can answer,
    /// and applications count on seeing their send complete before the answer arrives
    /// (perftest 4.5's `ib_send_lat -e` waits for its send's event on a channel shared with
    /// the receive CQ, then polls the send CQ once). One GSO message reaches a peer at once,
    /// and a rocectl peer hands the pair's completions out send queue first
    /// ([`roce_qp::QueuePair::drain_completions_sends_first`]); on a wire the two packets
    /// arrive back to back.
    ///
    /// IB semantics are kept: an ACK and the requests of the same QP travel in opposite PSN
    /// spaces, so their relative order means nothing to the peer; an ACK never moves past a
    /// response or a NAK (whose order against it does matter), and no request moves past
    /// another. The capture keeps the order the packets were built in.
    fn acks_last(&mut self) {
        let pending = &self.tx_descs[self.tx_pending..];
        let packet = |q: &Queued| &self.tx_arena[q.offset..q.offset + q.desc.len];
        let [ack, requests @ ..] = pending else {
            return;
        };
        if requests.is_empty()
            || pending.len() > BATCH
            || kind(packet(ack)) != Kind::Ack
            || !requests.iter().all(|q| kind(packet(q)) == Kind::Request)
        {
            return;
        }
        let len = ack.desc.len;
        if self.tx_arena.len() - self.tx_used < len {
            return;
        }
        let (offset, used) = (ack.offset, self.tx_used);
        self.tx_arena.copy_within(offset..offset + len, used);
        self.tx_descs[self.tx_pending].offset = used;
        self.tx_used += len;
        self.tx_descs[self.tx_pending..].rotate_left(1);
        // The datapath decides what forms one message (flow, sizes, GSO support).
        let whole = {
            let batch = Self::pending_batch(&self.tx_descs[self.tx_pending..], &self.tx_arena);
            self.dp.first_message_len(&batch) == batch.len()
        };
        if !whole {
            self.tx_descs[self.tx_pending..].rotate_right(1);
            self.tx_descs[self.tx_pending].offset = offset;
            self.tx_used = used;
        }
    }

    /// The first [`BATCH`] pending datagrams as the datapath takes them. Built only as long as
    /// there are datagrams (no array of placeholders filled per call: on a ping-pong's path
    /// that cost more than the two datagrams), and the same for planning and sending, so the
    /// datapath plans exactly the GSO runs it then sends.
    fn pending_batch<'a>(pending: &[Queued], arena: &'a [u8]) -> ArrayVec<TxDatagram<'a>, BATCH> {
        pending
            .iter()
            .take(BATCH)
            .map(|q| {
                let d = &q.desc;
                TxDatagram {
                    dst: d.dst,
                    src_port: d.src_port,
                    tos: d.tos,
                    hop_limit: d.hop_limit,
                    flow_label: d.flow_label,
                    payload: &arena[q.offset..q.offset + d.len],
                }
            })
            .collect()
    }

    /// Asks the datapath which IPv4 Identification each pending datagram will carry and
    /// rewrites the ICRCs of those whose differs from the one their ICRC is computed for.
    fn plan_idents(&mut self) {
        let mut idents = [0u16; BATCH];
        let n = {
            let batch = Self::pending_batch(&self.tx_descs[self.tx_pending..], &self.tx_arena);
            self.dp.plan_ipv4_idents(&batch, &mut idents[..batch.len()]);
            batch.len()
        };
        for (q, &id) in self.tx_descs[self.tx_pending..]
            .iter_mut()
            .zip(&idents[..n])
        {
            if q.ident == id || !q.desc.dst.is_ipv4() || q.desc.len < ICRC_LEN {
                continue;
            }
            let end = q.offset + q.desc.len;
            let mut icrc = [0u8; ICRC_LEN];
            icrc.copy_from_slice(&self.tx_arena[end - ICRC_LEN..end]);
            // IPv4 without options + UDP in front of the payload (what the engine built).
            if self
                .ident_patcher
                .patch(IPV4_UDP + q.desc.len, &mut icrc, q.ident, id)
            {
                self.tx_arena[end - ICRC_LEN..end].copy_from_slice(&icrc);
                q.ident = id;
            }
        }
    }

    /// Hands the pending descriptors to the datapath.
    fn flush(&mut self, result: &mut PassResult) {
        while self.tx_pending < self.tx_descs.len() {
            self.plan_idents();
            let sent = {
                let batch = Self::pending_batch(&self.tx_descs[self.tx_pending..], &self.tx_arena);
                self.dp.send(&batch)
            };
            match sent {
                Ok(n) => {
                    for q in &self.tx_descs[self.tx_pending..self.tx_pending + n] {
                        self.ep.counters.tx_packets += 1;
                        self.ep.counters.tx_bytes += q.desc.len as u64;
                    }
                    self.tx_pending += n;
                    result.sent += n;
                    if n == 0 {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.ep.counters.tx_would_block += 1;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Unreachable network or host, or a hard error: the datagram is lost (RC
                    // retries will report it); count it and keep the reason for the user.
                    let d = self.tx_descs[self.tx_pending].desc;
                    self.ep.counters.tx_errors += 1;
                    self.ep.last_error = Some(format!("send to {}: {e}", d.dst));
                    self.tx_pending += 1;
                }
            }
        }
    }
}

/// What [`Engine::acks_last`] may reorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An RC ACK with an ACK syndrome (not a NAK, not an RNR NAK).
    Ack,
    /// A request: SEND, WRITE, READ request, atomic, FLUSH, ATOMIC WRITE.
    Request,
    /// Anything else (responses, NAKs, CNPs, unknown opcodes).
    Other,
}

/// The [`Kind`] of a built packet (BTH .. ICRC).
fn kind(packet: &[u8]) -> Kind {
    use roce_wire::opcode::Operation;
    let Some(&code) = packet.first() else {
        return Kind::Other;
    };
    let Some(info) = roce_wire::Opcode::from_u8(code).info() else {
        return Kind::Other;
    };
    match info.operation {
        Operation::Acknowledge => match packet.get(bth::HEADER_LEN) {
            Some(&syndrome) if Syndrome::from_u8(syndrome).is_ack() => Kind::Ack,
            _ => Kind::Other,
        },
        Operation::Send
        | Operation::Write
        | Operation::ReadRequest
        | Operation::CompareSwap
        | Operation::FetchAdd
        | Operation::Flush
        | Operation::AtomicWrite => Kind::Request,
        Operation::ReadResponse | Operation::AtomicAcknowledge | Operation::Cnp => Kind::Other,
    }
}
