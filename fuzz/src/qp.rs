//! The queue-pair targets: arbitrary packet sequences into an RC/UC responder
//! ([`qp_responder`]) and arbitrary responses into an RC requester/completer
//! ([`qp_requester`]), through `roce_qp::QueuePair`'s public API.
//!
//! The input is read as a script: a few header bytes choose the QP (type, state, access
//! rights, path MTU, RDMA resources, first PSN, posted receives), then each op byte chooses an
//! action (a crafted packet, a raw transport packet, a post, a timeout, a modify). Crafted
//! packets are emitted with `roce-wire` and parsed back, so the QP only ever sees what the
//! transport could hand it. After every action the target checks:
//!
//! - nothing panics (`QueuePair::check_invariants` also runs, even in release);
//! - every packet the QP transmits parses as a transport packet addressed to the peer;
//! - every completion names a work request that was posted and not completed before; send
//!   completions come out in posting order.
//!
//! Reading past the end of the input yields zeros, so every input is a valid script.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use roce_mr::{Access, MrTable, Pd};
use roce_qp::state::{AttrMask, QpAttr};
use roce_qp::verbs::{
    AddressHandle, CqSide, FlushLevel, FlushPlacement, Mtu, QpState, QpType, RecvWr, SendData,
    SendOp, SendWr, Sge,
};
use roce_qp::{Instant, Mem, QpConfig, QueuePair, RecvMeta};
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::opcode::ExtHeaders;
use roce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, feth, ieth, immdt, reth, Ext, Gid, LKey, Msn, Opcode,
    PacketRepr, Psn, QKey, Qpn, RKey,
};

/// Most actions per input (keeps one input's run time bounded).
const MAX_OPS: usize = 512;
/// Bytes in each registered region.
const REGION_LEN: u64 = 16 * 1024;
const LOCAL_QPN: Qpn = Qpn::new(0x11);
const PEER_QPN: Qpn = Qpn::new(0x22);

/// A byte reader that yields zeros once the input is exhausted.
struct Script<'a> {
    data: &'a [u8],
}

impl Script<'_> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
}

/// One registered region.
#[derive(Clone, Copy)]
struct Region {
    key: u32,
    addr: u64,
}

/// A QP under test with its memory and the bookkeeping of what was posted and completed.
struct Harness {
    qp: QueuePair,
    now: Instant,
    /// Full rights, and LOCAL_WRITE only.
    regions: [Region; 2],
    mtu: usize,
    next_wr_id: u64,
    /// Send WRs posted and not yet completed (wr_id).
    sends: BTreeSet<u64>,
    /// Last send wr_id completed (send completions come in posting order).
    last_send_done: Option<u64>,
    /// Receive WRs posted and not yet completed.
    recvs: BTreeSet<u64>,
    buf: Vec<u8>,
    peer: Gid,
    /// Packets transmitted so far.
    transmitted: u64,
}

fn register(table: &MrTable, pd: Pd, addr: u64, access: Access) -> Region {
    let mem = vec![0u8; REGION_LEN as usize].into_boxed_slice();
    // INVARIANT: a fresh 64-entry table takes two regions with consistent rights.
    let key = table.register(pd, mem, addr, access).expect("register");
    Region { key: key.0, addr }
}

impl Harness {
    /// A QP of `qp_type` brought to `target` (one of RESET, INIT, RTR, RTS, SQD, ERR), its
    /// parameters read from the script.
    fn new(s: &mut Script<'_>, qp_type: QpType, target: QpState) -> Self {
        let knobs = s.u8();
        let mtu = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ][usize::from(knobs % 5)];
        let mut access = Access::LOCAL_WRITE;
        let rights = s.u8();
        for (bit, a) in [
            (1, Access::REMOTE_WRITE),
            (2, Access::REMOTE_READ),
            (4, Access::REMOTE_ATOMIC),
            (8, Access::FLUSH_GLOBAL),
            (16, Access::FLUSH_PERSISTENT),
        ] {
            if rights & bit == 0 {
                access |= a;
            }
        }
        let rd_atomic = s.u8() % 17;
        let rq_psn = Psn::new(s.u32());
        let sq_psn = Psn::new(s.u32());
        let table = Arc::new(MrTable::new(64, u64::from(knobs)));
        let pd = table.alloc_pd();
        let full = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::FLUSH_GLOBAL
            | Access::FLUSH_PERSISTENT;
        let regions = [
            register(&table, pd, 0x10_0000, full),
            register(&table, pd, 0x20_0000, Access::LOCAL_WRITE),
        ];
        let cfg = QpConfig {
            max_send_wr: 64,
            max_recv_wr: 64,
            ..QpConfig::new(qp_type)
        };
        let qp = QueuePair::new(LOCAL_QPN, cfg, Mem::new(table, pd), None);
        let peer = Gid::from(Ipv4Addr::new(10, 0, 0, 2));
        let attr = QpAttr {
            access_flags: access,
            qkey: QKey::new(0x1111_1111),
            ah: AddressHandle::new(peer),
            path_mtu: mtu,
            timeout: 1 + knobs % 8,
            retry_cnt: (knobs >> 3) % 8,
            rnr_retry: (knobs >> 5) % 8,
            rq_psn,
            max_rd_atomic: rd_atomic,
            min_rnr_timer: 1,
            sq_psn,
            max_dest_rd_atomic: rd_atomic,
            dest_qpn: PEER_QPN,
            ..QpAttr::default()
        };
        let rc = qp_type == QpType::Rc;
        let steps: [(QpState, AttrMask); 3] = [
            (
                QpState::Init,
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            ),
            (
                QpState::Rtr,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | if rc {
                        AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
                    } else {
                        AttrMask::NONE
                    },
            ),
            (
                QpState::Rts,
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | if rc {
                        AttrMask::TIMEOUT
                            | AttrMask::RETRY_CNT
                            | AttrMask::RNR_RETRY
                            | AttrMask::MAX_QP_RD_ATOMIC
                    } else {
                        AttrMask::NONE
                    },
            ),
        ];
        let mut h = Self {
            qp,
            now: Instant::from_nanos(0),
            regions,
            mtu: mtu.bytes(),
            next_wr_id: 1,
            sends: BTreeSet::new(),
            last_send_done: None,
            recvs: BTreeSet::new(),
            buf: vec![0u8; 4096 + 128],
            peer,
            transmitted: 0,
        };
        for (state, mask) in steps {
            if target == QpState::Reset {
                break;
            }
            let a = QpAttr { state, ..attr };
            // INVARIANT: the standard bring-up masks are valid for RC and UC.
            h.qp.modify(&a, mask).expect("bring-up");
            if state == QpState::Init {
                // Receives while the QP can take them.
                for _ in 0..s.u8() % 8 {
                    h.post_recv(s);
                }
            }
            if state == target {
                break;
            }
        }
        if matches!(target, QpState::Sqd | QpState::Err) {
            let a = QpAttr {
                state: target,
                ..attr
            };
            // INVARIANT: RTS -> SQD and any state -> ERR are valid moves.
            h.qp.modify(&a, AttrMask::STATE).expect("to SQD/ERR");
        }
        h.check();
        h
    }

    fn sge(&self, s: &mut Script<'_>, max: u32) -> Sge {
        let r = self.regions[usize::from(s.u8() & 1)];
        let choice = s.u8();
        let (addr, length, lkey) = match choice % 8 {
            // Mostly valid: inside the region.
            0..=5 => {
                let off = u64::from(s.u16()) % REGION_LEN;
                let len = u32::from(s.u16()) % max.max(1);
                let len = len.min((REGION_LEN - off) as u32);
                (r.addr + off, len, r.key)
            }
            6 => (r.addr + u64::from(s.u16()), u32::from(s.u16()), r.key),
            _ => (s.u64(), u32::from(s.u16()), s.u32()),
        };
        Sge {
            addr,
            length,
            lkey: LKey::new(lkey),
        }
    }

    fn post_recv(&mut self, s: &mut Script<'_>) {
        let n = s.u8() % 3;
        let max = (self.mtu as u32) * 3;
        let sges = (0..n).map(|_| self.sge(s, max)).collect();
        let wr_id = self.next_wr_id;
        if self.qp.post_recv(RecvWr { wr_id, sges }).is_ok() {
            self.next_wr_id += 1;
            self.recvs.insert(wr_id);
        }
    }

    fn remote(&self, s: &mut Script<'_>) -> (u64, RKey) {
        let r = self.regions[usize::from(s.u8() & 1)];
        match s.u8() % 8 {
            0..=4 => (r.addr + u64::from(s.u16()) % REGION_LEN, RKey::new(r.key)),
            5 => (
                r.addr + (u64::from(s.u16()) & !7) % REGION_LEN,
                RKey::new(r.key),
            ),
            6 => (r.addr + u64::from(s.u16()), RKey::new(s.u32())),
            _ => (s.u64(), RKey::new(r.key)),
        }
    }

    fn post_send(&mut self, s: &mut Script<'_>) {
        let (remote_addr, rkey) = self.remote(s);
        let op = match s.u8() % 11 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm: s.u32() },
            2 => SendOp::SendWithInv { rkey },
            3 => SendOp::RdmaWrite { remote_addr, rkey },
            4 => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: s.u32(),
            },
            5 => SendOp::RdmaRead { remote_addr, rkey },
            6 => SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare: s.u64(),
                swap: s.u64(),
            },
            7 => SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add: s.u64(),
            },
            8 => SendOp::AtomicWrite { remote_addr, rkey },
            9 => SendOp::Flush {
                remote_addr,
                rkey,
                len: u32::from(s.u16()),
                placement: FlushPlacement::from_bits(s.u8()),
                level: if s.u8() & 1 == 0 {
                    FlushLevel::Range
                } else {
                    FlushLevel::Mr
                },
            },
            _ => SendOp::LocalInv { key: s.u32() },
        };
        let flags = s.u8();
        let max = (self.mtu as u32) * 3;
        let data = if flags & 1 == 0 || op.returns_data() {
            let eight = op.is_atomic() || matches!(op, SendOp::AtomicWrite { .. });
            let sges = if eight && flags & 2 == 0 {
                let r = self.regions[usize::from(flags >> 7)];
                vec![Sge {
                    addr: r.addr + (u64::from(s.u16()) & !7) % REGION_LEN,
                    length: 8,
                    lkey: LKey::new(r.key),
                }]
            } else {
                (0..s.u8() % 3).map(|_| self.sge(s, max)).collect()
            };
            SendData::Sges(sges)
        } else {
            let n = usize::from(s.u16()) % 300;
            SendData::Inline(s.bytes(n).to_vec())
        };
        let wr_id = self.next_wr_id;
        let wr = SendWr {
            wr_id,
            op,
            data,
            signaled: flags & 4 == 0,
            solicited: flags & 8 != 0,
            ud: None,
        };
        if self.qp.post_send(self.now, wr).is_ok() {
            self.next_wr_id += 1;
            self.sends.insert(wr_id);
        }
    }

    /// A packet of `opcode` with every header the table gives it, fields from the script;
    /// emitted and parsed back (`None` if the parse refuses it, e.g. a bad pad).
    fn craft(&mut self, s: &mut Script<'_>, opcode: Opcode, psn: Psn) -> Option<Vec<u8>> {
        let flags = s.u8();
        let mut b = bth::Repr::new(opcode, LOCAL_QPN, psn);
        b.ack_req = flags & 1 != 0;
        b.solicited = flags & 2 != 0;
        if flags & 0x80 != 0 {
            // Rarely: someone else's QPN or a P_Key that does not match.
            b.dest_qp = Qpn::new(s.u32());
            b.pkey = roce_wire::PKey::new(s.u16());
        }
        let need = opcode.info().map_or(ExtHeaders::NONE, |i| i.ext);
        let (va, rkey) = self.remote(s);
        let mut ext = Ext::default();
        if need.contains(ExtHeaders::FETH) {
            let v = s.u8();
            ext.feth = Some(feth::Repr {
                placement: v & 0x0F,
                selectivity: (v >> 4) & 0x03,
            });
        }
        if need.contains(ExtHeaders::RETH) {
            let dma_len = match s.u8() % 4 {
                0 => u32::from(s.u16()) % (3 * self.mtu as u32 + 1),
                1 => self.mtu as u32,
                2 => 8,
                _ => s.u32(),
            };
            ext.reth = Some(reth::Repr { va, rkey, dma_len });
        }
        if need.contains(ExtHeaders::ATOMIC_ETH) {
            ext.atomic_eth = Some(atomic_eth::Repr {
                va,
                rkey,
                swap_add: s.u64(),
                compare: s.u64(),
            });
        }
        if need.contains(ExtHeaders::AETH) {
            let syndrome = match s.u8() % 8 {
                0..=2 => Syndrome::ACK_UNLIMITED,
                3 => Syndrome::RnrNak { timer: s.u8() % 32 },
                4 => Syndrome::Nak(NakCode::PsnSequenceError),
                5 => Syndrome::Nak(NakCode::from_code(s.u8() % 5)),
                _ => Syndrome::from_u8(s.u8()),
            };
            ext.aeth = Some(aeth::Repr {
                syndrome,
                msn: Msn::new(s.u32()),
            });
        }
        if need.contains(ExtHeaders::ATOMIC_ACK_ETH) {
            ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: s.u64() });
        }
        if need.contains(ExtHeaders::IMMDT) {
            ext.immdt = Some(immdt::Repr { data: s.u32() });
        }
        if need.contains(ExtHeaders::IETH) {
            let rkey = if s.u8() & 1 == 0 {
                RKey::new(self.regions[0].key)
            } else {
                RKey::new(s.u32())
            };
            ext.ieth = Some(ieth::Repr { rkey });
        }
        let payload_allowed = opcode.info().is_none_or(|i| i.payload);
        let len = if payload_allowed {
            match s.u8() % 6 {
                0 => 0,
                1 => self.mtu,
                2 => 8,
                3 => self.mtu.saturating_sub(usize::from(s.u8())),
                4 => self.mtu + 4,
                _ => usize::from(s.u16()) % (self.mtu + 8),
            }
        } else {
            0
        };
        let payload: Vec<u8> = (0..len).map(|i| (i as u8) ^ flags).collect();
        let repr = PacketRepr::new(b, ext, &payload);
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut out);
        PacketRepr::parse(&out).is_ok().then_some(out)
    }

    /// Feeds a transport packet (if it parses), then drains and checks every output.
    fn deliver(&mut self, bytes: &[u8]) {
        if let Ok(p) = PacketRepr::parse(bytes) {
            let meta = RecvMeta::new(self.peer, Gid::from(Ipv4Addr::new(10, 0, 0, 1)));
            self.qp.handle_packet(self.now, &p, &meta);
        }
        self.drain();
    }

    fn advance(&mut self, s: &mut Script<'_>) {
        let step = match s.u8() % 4 {
            0 => u64::from(s.u16()),
            1 => u64::from(s.u32()) << 4,
            // Straight to the next deadline.
            _ => self
                .qp
                .poll_timeout()
                .map_or(1, |t| t.as_nanos().saturating_sub(self.now.as_nanos())),
        };
        self.now = Instant::from_nanos(self.now.as_nanos().saturating_add(step));
        self.qp.handle_timeout(self.now);
        self.drain();
    }

    /// Drains every output of the QP and checks it.
    fn drain(&mut self) {
        let mut sent = 0;
        while let Some(t) = self.qp.poll_transmit(self.now, &mut self.buf) {
            let p = PacketRepr::parse(&self.buf[..t.len])
                .unwrap_or_else(|e| panic!("QP transmitted a packet that does not parse: {e}"));
            assert_eq!(p.bth.dest_qp, PEER_QPN, "sent to the peer QP");
            sent += 1;
            self.transmitted += 1;
            // A go-back-N storm is bounded by the in-flight limit; this bounds the loop.
            if sent > 4096 {
                panic!("poll_transmit does not run dry");
            }
        }
        while let Some((side, c)) = self.qp.poll_completion() {
            assert_eq!(c.qp_num, LOCAL_QPN);
            match side {
                CqSide::Send => {
                    assert!(
                        self.sends.remove(&c.wr_id),
                        "send completion for wr_id {} never posted or completed twice",
                        c.wr_id
                    );
                    assert!(
                        self.last_send_done.is_none_or(|l| l < c.wr_id),
                        "send completions out of posting order"
                    );
                    self.last_send_done = Some(c.wr_id);
                }
                CqSide::Recv => assert!(
                    self.recvs.remove(&c.wr_id),
                    "receive completion for wr_id {} never posted or completed twice",
                    c.wr_id
                ),
            }
        }
        while self.qp.poll_event().is_some() {}
        self.check();
    }

    fn check(&self) {
        if let Err(e) = self.qp.check_invariants() {
            panic!("invariant broken: {e}");
        }
        if self.qp.state() == QpState::Err {
            assert_eq!(self.qp.send_queue_len(), 0, "ERR flushed the send queue");
        }
    }
}

/// The state a script byte selects.
fn state_of(b: u8) -> QpState {
    [
        QpState::Rtr,
        QpState::Rts,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
        QpState::Init,
        QpState::Reset,
        QpState::Rtr,
    ][usize::from(b % 8)]
}

/// Arbitrary request packets (and some responses, raw packets, receives, timeouts and
/// modifies) into an RC or UC QP in RESET, INIT, RTR, RTS, SQD or ERR.
pub fn qp_responder(data: &[u8]) {
    let mut s = Script { data };
    let head = s.u8();
    let qp_type = if head & 1 == 0 {
        QpType::Rc
    } else {
        QpType::Uc
    };
    let mut h = Harness::new(&mut s, qp_type, state_of(head >> 1));
    // Requests arrive around the expected PSN; the script moves a cursor through PSN space.
    let mut cursor = h.qp.attr().rq_psn;
    for _ in 0..MAX_OPS {
        if s.is_empty() {
            break;
        }
        match s.u8() % 16 {
            0..=9 => {
                let pick = s.u8();
                let opcode = if pick < 0xF0 {
                    let all = Opcode::ALL;
                    let base = all[usize::from(pick) % all.len()];
                    // Mostly the QP's own transport.
                    if qp_type == QpType::Uc && base.as_u8() < 0x20 && pick & 1 == 0 {
                        Opcode::from_u8(base.as_u8() | 0x20)
                    } else {
                        base
                    }
                } else {
                    Opcode::from_u8(s.u8())
                };
                let delta = s.u8() as i8;
                let psn = match delta {
                    -128..=-100 => Psn::new(s.u32()),
                    d if d < 0 => cursor.sub(u32::from(d.unsigned_abs())),
                    d => cursor.add(d as u32 % 4),
                };
                if let Some(bytes) = h.craft(&mut s, opcode, psn) {
                    h.deliver(&bytes);
                }
                cursor = psn.next();
            }
            10 => {
                let n = usize::from(s.u8()) * 4 + 16;
                let bytes = s.bytes(n).to_vec();
                h.deliver(&bytes);
            }
            11 => {
                // A request whose PadCnt exceeds its payload: only its BTH reaches the QP.
                let opcode = Opcode::from_u8(s.u8());
                let delta = s.u8() as i8;
                let psn = cursor.add(delta as u32 % 4);
                let mut b = bth::Repr::new(opcode, LOCAL_QPN, psn);
                b.pad_cnt = 3;
                let meta = RecvMeta::new(h.peer, Gid::from(Ipv4Addr::new(10, 0, 0, 1)));
                h.qp.handle_bad_pad(h.now, &b, &meta);
                h.drain();
                cursor = psn.next();
            }
            12 => {
                h.post_recv(&mut s);
                h.drain();
            }
            13 => h.advance(&mut s),
            14 => {
                h.post_send(&mut s);
                h.drain();
            }
            _ => {
                let to = state_of(s.u8());
                let a = QpAttr {
                    state: to,
                    ..*h.qp.attr()
                };
                // Refused moves change nothing; accepted ones must keep the invariants.
                let _ = h.qp.modify(&a, AttrMask::STATE);
                h.drain();
            }
        }
    }
}

/// Arbitrary responses (ACK, NAK, RNR NAK, READ responses, atomic ACKs, any other opcode)
/// into an RC QP whose requester has work posted, interleaved with posts, transmissions and
/// timeouts.
pub fn qp_requester(data: &[u8]) {
    let mut s = Script { data };
    let head = s.u8();
    let target = if head & 3 == 3 {
        QpState::Sqd
    } else {
        QpState::Rts
    };
    let mut h = Harness::new(&mut s, QpType::Rc, target);
    let first = h.qp.attr().sq_psn;
    for _ in 0..s.u8() % 6 {
        h.post_send(&mut s);
    }
    h.drain();
    for _ in 0..MAX_OPS {
        if s.is_empty() {
            break;
        }
        match s.u8() % 16 {
            0..=8 => {
                let pick = s.u8();
                let opcode = match pick % 8 {
                    0..=2 => Opcode::RcAcknowledge,
                    3 => Opcode::RcAtomicAcknowledge,
                    4 => Opcode::RcRdmaReadResponseOnly,
                    5 => Opcode::RcRdmaReadResponseFirst,
                    6 => [
                        Opcode::RcRdmaReadResponseMiddle,
                        Opcode::RcRdmaReadResponseLast,
                    ][usize::from(pick >> 7)],
                    _ => Opcode::from_u8(s.u8()),
                };
                // Responses name PSNs the requester sent: near the first PSN of the run.
                let psn = match s.u8() % 4 {
                    0 => Psn::new(s.u32()),
                    _ => first.add(u32::from(s.u16() % 512)).sub(4),
                };
                if let Some(bytes) = h.craft(&mut s, opcode, psn) {
                    h.deliver(&bytes);
                }
            }
            9..=11 => {
                h.post_send(&mut s);
                h.drain();
            }
            12 | 13 => h.advance(&mut s),
            14 => {
                let n = usize::from(s.u8()) * 4 + 16;
                let bytes = s.bytes(n).to_vec();
                h.deliver(&bytes);
            }
            _ => {
                let to = state_of(s.u8());
                let a = QpAttr {
                    state: to,
                    ..*h.qp.attr()
                };
                let _ = h.qp.modify(&a, AttrMask::STATE);
                h.drain();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness is not vacuous: an in-sequence SEND ONLY with AckReq into an RC QP in RTR
    /// completes a posted receive and is acknowledged; a READ of the full-rights region is
    /// answered; one with a wrong rkey gets a NAK and the QP enters ERR.
    #[test]
    fn harness_reaches_the_responder() {
        // Header: knobs 2 (MTU 1024), all rights, 4 RDMA resources, rq_psn 0x10, sq_psn 0;
        // at INIT: 3 receives of one SGE each (region 0, offset 0, 2048 bytes).
        let mut header = vec![2, 0, 4, 0x10, 0, 0, 0, 0, 0, 0, 0, 3];
        for _ in 0..3 {
            header.extend_from_slice(&[1, 0, 0, 0, 0, 0x00, 0x08]);
        }
        let mut s = Script { data: &header };
        let mut h = Harness::new(&mut s, QpType::Rc, QpState::Rtr);
        assert_eq!(h.recvs.len(), 3);
        // SEND ONLY, AckReq, remote() bytes, 8 payload bytes (choice 2).
        let fields = [1u8, 0, 0, 0, 0, 2];
        let bytes = h
            .craft(
                &mut Script { data: &fields },
                Opcode::RcSendOnly,
                Psn::new(0x10),
            )
            .expect("parses");
        h.deliver(&bytes);
        assert_eq!(h.recvs.len(), 2, "one receive completed");
        assert_eq!(h.transmitted, 1, "one ACK");
        // READ of 8 bytes (dma_len choice 2) at region 0.
        let fields = [1u8, 0, 0, 0, 0, 2];
        let bytes = h
            .craft(
                &mut Script { data: &fields },
                Opcode::RcRdmaReadRequest,
                Psn::new(0x11),
            )
            .expect("parses");
        h.deliver(&bytes);
        assert_eq!(h.transmitted, 2, "one READ response");
        // READ with a random rkey (remote() choice 6) at PSN 0x12.
        let fields = [1u8, 0, 6, 0, 0, 0xEF, 0xBE, 0xAD, 0xDE, 2];
        let bytes = h
            .craft(
                &mut Script { data: &fields },
                Opcode::RcRdmaReadRequest,
                Psn::new(0x12),
            )
            .expect("parses");
        h.deliver(&bytes);
        assert_eq!(h.transmitted, 3, "one NAK");
        assert_eq!(h.qp.state(), QpState::Err);
        assert!(h.recvs.is_empty(), "ERR flushed the receives");
    }

    /// The requester side too: a posted SEND goes out, its ACK completes it; an RNR NAK for
    /// a second one arms the RNR timer, and after it the SEND is resent.
    #[test]
    fn harness_reaches_the_completer() {
        // knobs 0xE2 (MTU 512, timeout 3, retry_cnt 4, rnr_retry 7), all rights, 4 RDMA
        // resources, rq_psn 0, sq_psn 0x100, no receives.
        let header = [0xE2u8, 0, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        let mut s = Script { data: &header };
        let mut h = Harness::new(&mut s, QpType::Rc, QpState::Rts);
        // SEND of 16 bytes from region 0: remote() 4 bytes, op 0, flags 0 (SGEs, signaled),
        // one SGE: region 0, choice 0, offset 0, length 16.
        let post = [0u8, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 16, 0];
        h.post_send(&mut Script { data: &post });
        h.drain();
        assert_eq!(h.transmitted, 1, "the SEND went out");
        assert_eq!(h.sends.len(), 1);
        // ACK for PSN 0x100: flags 0, remote() 4 bytes, AETH choice 0 (ACK), MSN 4 bytes.
        let fields = [0u8, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        let bytes = h
            .craft(
                &mut Script { data: &fields },
                Opcode::RcAcknowledge,
                Psn::new(0x100),
            )
            .expect("parses");
        h.deliver(&bytes);
        assert!(h.sends.is_empty(), "the ACK completed the SEND");
        assert_eq!(h.last_send_done, Some(1));
        // A second SEND, then an RNR NAK (AETH choice 3, timer 1): rnr_retry is 7 (infinite).
        h.post_send(&mut Script { data: &post });
        h.drain();
        assert_eq!(h.transmitted, 2);
        let fields = [0u8, 0, 0, 0, 0, 3, 1, 2, 0, 0, 0];
        let bytes = h
            .craft(
                &mut Script { data: &fields },
                Opcode::RcAcknowledge,
                Psn::new(0x101),
            )
            .expect("parses");
        h.deliver(&bytes);
        assert_eq!(h.qp.stats().rnr_naks_received, 1);
        assert_eq!(h.transmitted, 2, "nothing resent before the RNR timer");
        h.advance(&mut Script { data: &[2] });
        assert_eq!(h.transmitted, 3, "resent after the RNR timer");
        assert_eq!(h.qp.stats().retransmitted_packets, 1);
    }

    #[test]
    fn scripts_of_every_shape_run() {
        // Deterministic pseudo-random scripts: a smoke test of both targets on stable.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..300 {
            let script: Vec<u8> = (0..len * 7)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            qp_responder(&script);
            qp_requester(&script);
        }
    }
}
