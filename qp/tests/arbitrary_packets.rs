//! Bad network input never panics and never breaks the QP's invariants: arbitrary parsed
//! packets (any opcode, PSN, destination QPN, P_Key, keys, addresses, lengths, AETH
//! syndromes) into an RC QP in each state (RESET, INIT, RTR, RTS, SQD, ERR), with send and
//! receive work posted and time advancing between packets.
//!
//! After every packet: `check_invariants` holds (it runs in release too), everything the QP
//! transmits parses, and every completion names a WR that was posted and not completed
//! before, send completions in posting order. The fuzz targets `qp_responder` and
//! `qp_requester` (fuzz/) explore the same space with coverage feedback.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use proptest::prelude::*;
use roce_mr::{Access, MrTable};
use roce_qp::state::{AttrMask, QpAttr};
use roce_qp::verbs::{
    AddressHandle, CqSide, FlushLevel, FlushPlacement, Mtu, QpState, QpType, RecvWr, SendOp,
    SendWr, Sge,
};
use roce_qp::{Instant, Mem, QpConfig, QueuePair, RecvMeta};
use roce_wire::aeth::Syndrome;
use roce_wire::opcode::ExtHeaders;
use roce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, feth, ieth, immdt, reth, Ext, Gid, LKey, Msn, Opcode,
    PKey, PacketRepr, Psn, Qpn, RKey,
};

const LOCAL: Qpn = Qpn::new(0x11);
const PEER: Qpn = Qpn::new(0x22);
const RQ_PSN: u32 = 0xFF_FFF0; // close to the wrap
const SQ_PSN: u32 = 0x100;
const BASE: u64 = 0x10_0000;
const LEN: u64 = 8192;

/// The fields of one packet; the opcode decides which extension headers it carries.
#[derive(Clone, Debug)]
struct Pkt {
    opcode: u8,
    /// PSN relative to the responder's first PSN or the requester's, or absolute.
    psn: PsnChoice,
    other_qpn: Option<u32>,
    bad_pkey: bool,
    ack_req: bool,
    good_rkey: bool,
    rkey: u32,
    va_off: u64,
    dma_len: u32,
    syndrome: u8,
    msn: u32,
    value: u64,
    payload_len: usize,
    /// Nanoseconds to advance before the packet (timeouts fire).
    wait: u64,
}

#[derive(Clone, Debug)]
enum PsnChoice {
    Request(i16),
    Response(u16),
    Any(u32),
}

fn any_pkt() -> impl Strategy<Value = Pkt> {
    let opcode = prop_oneof![
        4 => prop::sample::select(Opcode::ALL.iter().map(|o| o.as_u8()).collect::<Vec<_>>()),
        1 => any::<u8>(),
    ];
    let psn = prop_oneof![
        4 => (-8i16..40).prop_map(PsnChoice::Request),
        4 => (0u16..40).prop_map(PsnChoice::Response),
        1 => any::<u32>().prop_map(PsnChoice::Any),
    ];
    (
        (
            opcode,
            psn,
            prop::option::weighted(0.05, any::<u32>()),
            prop::bool::weighted(0.05),
        ),
        (
            any::<bool>(),
            prop::bool::weighted(0.8),
            any::<u32>(),
            0u64..LEN + 64,
        ),
        (
            prop_oneof![0u32..3000, Just(8), any::<u32>()],
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
        ),
        (
            0usize..1100,
            prop_oneof![4 => Just(0u64), 1 => 0u64..1_000_000_000],
        ),
    )
        .prop_map(
            |(
                (opcode, psn, other_qpn, bad_pkey),
                (ack_req, good_rkey, rkey, va_off),
                (dma_len, syndrome, msn, value),
                (payload_len, wait),
            )| Pkt {
                opcode,
                psn,
                other_qpn,
                bad_pkey,
                ack_req,
                good_rkey,
                rkey,
                va_off,
                dma_len,
                syndrome,
                msn,
                value,
                payload_len,
                wait,
            },
        )
}

struct Rig {
    qp: QueuePair,
    key: u32,
    now: Instant,
    sends: BTreeSet<u64>,
    last_send: Option<u64>,
    recvs: BTreeSet<u64>,
    buf: Vec<u8>,
}

fn rig(target: QpState) -> Rig {
    let table = Arc::new(MrTable::new(16, 7));
    let pd = table.alloc_pd();
    let all = Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::FLUSH_GLOBAL
        | Access::FLUSH_PERSISTENT;
    let key = table
        .register(pd, vec![0u8; LEN as usize].into_boxed_slice(), BASE, all)
        .expect("register")
        .0;
    let cfg = QpConfig::new(QpType::Rc);
    let mut r = Rig {
        qp: QueuePair::new(LOCAL, cfg, Mem::new(table, pd), None),
        key,
        now: Instant::from_nanos(0),
        sends: BTreeSet::new(),
        last_send: None,
        recvs: BTreeSet::new(),
        buf: vec![0u8; 2048],
    };
    let attr = QpAttr {
        access_flags: all,
        ah: AddressHandle::new(Gid::from(Ipv4Addr::new(10, 0, 0, 2))),
        path_mtu: Mtu::Mtu1024,
        timeout: 4,
        retry_cnt: 3,
        rnr_retry: 3,
        rq_psn: Psn::new(RQ_PSN),
        sq_psn: Psn::new(SQ_PSN),
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        dest_qpn: PEER,
        ..QpAttr::default()
    };
    let steps = [
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
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        ),
        (
            QpState::Rts,
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC,
        ),
    ];
    for (state, mask) in steps {
        if target == QpState::Reset {
            break;
        }
        r.qp.modify(&QpAttr { state, ..attr }, mask)
            .expect("bring-up");
        if state == QpState::Init {
            for i in 0..4u64 {
                let sge = Sge {
                    addr: BASE + i * 2048,
                    length: 2048,
                    lkey: LKey::new(key),
                };
                r.qp.post_recv(RecvWr {
                    wr_id: 100 + i,
                    sges: vec![sge],
                })
                .expect("recv");
                r.recvs.insert(100 + i);
            }
        }
        if state == QpState::Rts {
            // One of each kind of request, so responses find something to act on.
            let rkey = RKey::new(key);
            let sge = |len| Sge {
                addr: BASE + 4096,
                length: len,
                lkey: LKey::new(key),
            };
            let ops = [
                (SendOp::Send, 1500),
                (
                    SendOp::RdmaWrite {
                        remote_addr: BASE,
                        rkey,
                    },
                    100,
                ),
                (
                    SendOp::RdmaRead {
                        remote_addr: BASE,
                        rkey,
                    },
                    2500,
                ),
                (
                    SendOp::AtomicFetchAndAdd {
                        remote_addr: BASE,
                        rkey,
                        add: 1,
                    },
                    8,
                ),
                (SendOp::Send, 10),
                (
                    SendOp::AtomicWrite {
                        remote_addr: BASE + 64,
                        rkey,
                    },
                    8,
                ),
                (
                    SendOp::Flush {
                        remote_addr: BASE,
                        rkey,
                        len: 64,
                        placement: FlushPlacement::GLOBAL,
                        level: FlushLevel::Range,
                    },
                    0,
                ),
            ];
            for (i, (op, len)) in ops.into_iter().enumerate() {
                let id = i as u64 + 1;
                r.qp.post_send(
                    r.now,
                    SendWr::new(id, op, if len == 0 { vec![] } else { vec![sge(len)] }),
                )
                .expect("post");
                r.sends.insert(id);
            }
            r.drain();
        }
        if state == target {
            break;
        }
    }
    if matches!(target, QpState::Sqd | QpState::Err) {
        r.qp.modify(
            &QpAttr {
                state: target,
                ..attr
            },
            AttrMask::STATE,
        )
        .expect("SQD/ERR");
    }
    r.drain();
    r
}

impl Rig {
    fn drain(&mut self) {
        let mut n = 0;
        while let Some(t) = self.qp.poll_transmit(self.now, &mut self.buf) {
            let p = PacketRepr::parse(&self.buf[..t.len]).expect("transmitted packets parse");
            assert_eq!(p.bth.dest_qp, PEER);
            n += 1;
            assert!(n < 10_000, "poll_transmit runs dry");
        }
        while let Some((side, c)) = self.qp.poll_completion() {
            match side {
                CqSide::Send => {
                    assert!(
                        self.sends.remove(&c.wr_id),
                        "send completion {c:?} not posted"
                    );
                    assert!(
                        self.last_send.is_none_or(|l| l < c.wr_id),
                        "in posting order"
                    );
                    self.last_send = Some(c.wr_id);
                }
                CqSide::Recv => {
                    assert!(
                        self.recvs.remove(&c.wr_id),
                        "receive completion {c:?} not posted"
                    );
                }
            }
        }
        while self.qp.poll_event().is_some() {}
        if let Err(e) = self.qp.check_invariants() {
            panic!("invariant broken in {:?}: {e}", self.qp.state());
        }
    }

    fn feed(&mut self, p: &Pkt) {
        if p.wait > 0 {
            self.now = Instant::from_nanos(self.now.as_nanos() + p.wait);
            self.qp.handle_timeout(self.now);
            self.drain();
        }
        let psn = match p.psn {
            PsnChoice::Request(d) => Psn::new(RQ_PSN).add(d as u32),
            PsnChoice::Response(d) => Psn::new(SQ_PSN).add(u32::from(d)),
            PsnChoice::Any(v) => Psn::new(v),
        };
        let opcode = Opcode::from_u8(p.opcode);
        let mut b = bth::Repr::new(opcode, p.other_qpn.map_or(LOCAL, Qpn::new), psn);
        b.ack_req = p.ack_req;
        if p.bad_pkey {
            b.pkey = PKey::new(0x7FFF);
        }
        let rkey = if p.good_rkey {
            RKey::new(self.key)
        } else {
            RKey::new(p.rkey)
        };
        let va = BASE + p.va_off;
        let need = opcode.info().map_or(ExtHeaders::NONE, |i| i.ext);
        let mut ext = Ext::default();
        if need.contains(ExtHeaders::FETH) {
            ext.feth = Some(feth::Repr {
                placement: p.syndrome & 0x0F,
                selectivity: p.syndrome >> 6,
            });
        }
        if need.contains(ExtHeaders::RETH) {
            ext.reth = Some(reth::Repr {
                va,
                rkey,
                dma_len: p.dma_len,
            });
        }
        if need.contains(ExtHeaders::ATOMIC_ETH) {
            ext.atomic_eth = Some(atomic_eth::Repr {
                va,
                rkey,
                swap_add: p.value,
                compare: p.value.rotate_left(7),
            });
        }
        if need.contains(ExtHeaders::AETH) {
            ext.aeth = Some(aeth::Repr {
                syndrome: Syndrome::from_u8(p.syndrome),
                msn: Msn::new(p.msn),
            });
        }
        if need.contains(ExtHeaders::ATOMIC_ACK_ETH) {
            ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: p.value });
        }
        if need.contains(ExtHeaders::IMMDT) {
            ext.immdt = Some(immdt::Repr { data: p.msn });
        }
        if need.contains(ExtHeaders::IETH) {
            ext.ieth = Some(ieth::Repr { rkey });
        }
        let payload_len = if opcode.info().is_none_or(|i| i.payload) {
            p.payload_len
        } else {
            0
        };
        let payload = vec![0xA5u8; payload_len];
        let repr = PacketRepr::new(b, ext, &payload);
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&mut bytes);
        if let Ok(parsed) = PacketRepr::parse(&bytes) {
            let peer = Gid::from(Ipv4Addr::new(10, 0, 0, 2));
            let meta = RecvMeta::new(peer, Gid::from(Ipv4Addr::new(10, 0, 0, 1)));
            self.qp.handle_packet(self.now, &parsed, &meta);
        }
        self.drain();
    }
}

fn any_state() -> impl Strategy<Value = QpState> {
    prop::sample::select(vec![
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_packets_never_break_an_rc_qp(
        state in any_state(),
        pkts in prop::collection::vec(any_pkt(), 1..40),
    ) {
        let mut r = rig(state);
        prop_assert_eq!(r.qp.state(), state);
        for p in &pkts {
            r.feed(p);
        }
    }
}

/// The rig reaches every state with work outstanding where the state allows it.
#[test]
fn rig_reaches_each_state() {
    for state in [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
    ] {
        let r = rig(state);
        assert_eq!(r.qp.state(), state);
        if matches!(state, QpState::Rts | QpState::Sqd) {
            assert_eq!(r.qp.send_queue_len(), 7, "{state:?}: sends outstanding");
        }
    }
    let r = rig(QpState::Err);
    assert!(
        r.sends.is_empty() && r.recvs.is_empty(),
        "ERR flushed everything"
    );
}
