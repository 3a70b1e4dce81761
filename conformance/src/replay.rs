//! Capture replay: every RC request stream of a capture, replayed into a fresh responder QP.
//!
//! For each (responder address, destination QPN) a responder QP is built with the PSN of the
//! first request, every access right, path MTU 1024 (the captures' MTU) and plenty of receive
//! WRs; each rkey seen in a RETH or AtomicETH gets a region covering every address it was used
//! with, and requests are rewritten to our keys (keys are the one thing we cannot choose).
//! Our responses are then compared with rxe's responses to the same requester QP. Atomic
//! original values and READ payload bytes depend on memory contents we do not have, so only
//! their headers and lengths are compared.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use roce_mr::{Access, MrTable};
use roce_qp::state::{bring_up_steps, QpAttr};
use roce_qp::verbs::{AddressHandle, Mtu, QpState, QpType, RecvWr, Sge};
use roce_qp::{Instant, Mem, QpConfig, QueuePair, RecvMeta};
use roce_wire::opcode::Transport;
use roce_wire::pcap::{parse_link, read_capture};
use roce_wire::{Caps, Gid, LKey, Msn, Opcode, PacketRepr, Psn, Qpn, RKey};

/// What a response looks like for the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseShape {
    /// Opcode.
    pub opcode: Opcode,
    /// PSN.
    pub psn: Psn,
    /// AETH syndrome byte, if any.
    pub syndrome: Option<u8>,
    /// AETH MSN, if any.
    pub msn: Option<Msn>,
    /// Payload length.
    pub payload_len: usize,
}

impl ResponseShape {
    fn of(p: &PacketRepr<'_>) -> Self {
        Self {
            opcode: p.bth.opcode,
            psn: p.bth.psn,
            syndrome: p.ext.aeth.map(|a| a.syndrome.as_u8()),
            msn: p.ext.aeth.map(|a| a.msn),
            payload_len: p.payload.len(),
        }
    }
}

/// The replay of one request stream.
#[derive(Clone, Debug)]
pub struct StreamReport {
    /// Responder IP and QPN.
    pub responder: (IpAddr, Qpn),
    /// Requests fed.
    pub requests: usize,
    /// rxe's responses.
    pub expected: Vec<ResponseShape>,
    /// Ours.
    pub ours: Vec<ResponseShape>,
}

impl StreamReport {
    /// Whether our responses equal rxe's.
    pub fn matches(&self) -> bool {
        self.expected == self.ours
    }
}

fn parse(o: &Owned) -> Option<PacketRepr<'_>> {
    PacketRepr::parse(&o.bytes).ok()
}

struct Owned {
    src: IpAddr,
    dst: IpAddr,
    bytes: Vec<u8>,
}

/// Replays every RC request stream of a capture.
///
/// # Errors
/// I/O errors reading the capture.
pub fn replay(path: &Path) -> io::Result<Vec<StreamReport>> {
    let frames = read_capture(std::fs::File::open(path)?)?;
    let caps = Caps::default();
    let mut pkts: Vec<Owned> = Vec::new();
    for f in &frames {
        if let Ok(fr) = parse_link(f.linktype, &f.data, &caps) {
            pkts.push(Owned {
                src: fr.repr.ip.src(),
                dst: fr.repr.ip.dst(),
                bytes: fr.udp_payload.to_vec(),
            });
        }
    }
    // Group RC requests by (responder address, destination QPN).
    let mut groups: BTreeMap<(IpAddr, Qpn), Vec<usize>> = BTreeMap::new();
    for (i, o) in pkts.iter().enumerate() {
        let Some(p) = parse(o) else { continue };
        let Some(info) = p.bth.opcode.info() else {
            continue;
        };
        if p.bth.opcode.transport() == Transport::Rc && !info.is_response() {
            groups.entry((o.dst, p.bth.dest_qp)).or_default().push(i);
        }
    }
    let mut reports = Vec::new();
    for ((responder_ip, qpn), reqs) in groups {
        let requester_ip = pkts[reqs[0]].src;
        // PSNs the requests occupy (READs take one per response packet).
        let mut psns = BTreeSet::new();
        for &i in &reqs {
            let Some(p) = parse(&pkts[i]) else { continue };
            let n = p
                .ext
                .reth
                .filter(|_| p.bth.opcode == Opcode::RcRdmaReadRequest)
                .map_or(1, |r| r.dma_len.div_ceil(1024).max(1));
            for k in 0..n {
                psns.insert(p.bth.psn.add(k).value());
            }
        }
        // rxe's responses to this stream: from the responder to the requester, at our PSNs;
        // they tell us the requester's QPN.
        let requester_qpn = pkts.iter().find_map(|o| {
            let p = parse(o)?;
            (o.src == responder_ip
                && o.dst == requester_ip
                && p.bth.opcode.info()?.is_response()
                && psns.contains(&p.bth.psn.value()))
            .then_some(p.bth.dest_qp)
        });
        let Some(requester_qpn) = requester_qpn else {
            continue;
        };
        let expected: Vec<ResponseShape> = pkts
            .iter()
            .filter(|o| o.src == responder_ip && o.dst == requester_ip)
            .filter_map(parse)
            .filter(|p| {
                p.bth.dest_qp == requester_qpn
                    && p.bth.opcode.info().is_some_and(|i| i.is_response())
            })
            .map(|p| ResponseShape::of(&p))
            .collect();
        let ours = run_stream(&pkts, &reqs, responder_ip, requester_ip, qpn, requester_qpn);
        reports.push(StreamReport {
            responder: (responder_ip, qpn),
            requests: reqs.len(),
            expected,
            ours,
        });
    }
    Ok(reports)
}

fn run_stream(
    pkts: &[Owned],
    reqs: &[usize],
    responder_ip: IpAddr,
    requester_ip: IpAddr,
    qpn: Qpn,
    requester_qpn: Qpn,
) -> Vec<ResponseShape> {
    let table = Arc::new(MrTable::new(256, 1));
    let pd = table.alloc_pd();
    // One region per capture rkey, covering every address it was used with.
    let mut spans: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for &i in reqs {
        let Ok(p) = PacketRepr::parse(&pkts[i].bytes) else {
            continue;
        };
        let (rkey, va, len) = match (p.ext.reth, p.ext.atomic_eth) {
            (Some(r), _) => (r.rkey.value(), r.va, u64::from(r.dma_len)),
            (None, Some(a)) => (a.rkey.value(), a.va, 8),
            _ => continue,
        };
        let e = spans.entry(rkey).or_insert((va, va + len));
        e.0 = e.0.min(va);
        e.1 = e.1.max(va + len);
    }
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut keymap: BTreeMap<u32, u32> = BTreeMap::new();
    for (rkey, (lo, hi)) in &spans {
        let base = lo & !7;
        let len = usize::try_from((hi - base).max(8)).unwrap_or(8);
        if let Ok(k) = table.register_zeroed(pd, len, base, all) {
            keymap.insert(*rkey, k.0);
        }
    }
    let recv_buf = table
        .register_zeroed(pd, 1 << 20, 0x7000_0000_0000, all)
        .ok();
    let first_psn = PacketRepr::parse(&pkts[reqs[0]].bytes)
        .map(|p| p.bth.psn)
        .unwrap_or_default();
    let mut qp = QueuePair::new(
        qpn,
        QpConfig {
            max_recv_wr: 100_000,
            ..QpConfig::new(QpType::Rc)
        },
        Mem::new(table.clone(), pd),
        None,
    );
    let sgid = Gid::from_ip(requester_ip);
    let attr = QpAttr {
        state: QpState::Init,
        access_flags: all,
        ah: AddressHandle::new(sgid),
        path_mtu: Mtu::Mtu1024,
        rq_psn: first_psn,
        sq_psn: Psn::new(0),
        max_dest_rd_atomic: 16,
        max_rd_atomic: 16,
        min_rnr_timer: 12,
        dest_qpn: requester_qpn,
        ..QpAttr::default()
    };
    for (state, mask) in bring_up_steps(QpType::Rc, QpState::Rtr) {
        if qp.modify(&QpAttr { state, ..attr }, mask).is_err() {
            return Vec::new();
        }
    }
    if let Some(k) = recv_buf {
        for i in 0..reqs.len() as u64 {
            let _ = qp.post_recv(RecvWr {
                wr_id: i,
                sges: vec![Sge {
                    addr: 0x7000_0000_0000,
                    length: 1 << 20,
                    lkey: LKey::new(k.0),
                }],
            });
        }
    }
    let meta = RecvMeta::new(sgid, Gid::from_ip(responder_ip));
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096 + 128];
    let now = Instant::ZERO;
    for &i in reqs {
        let Ok(mut p) = PacketRepr::parse(&pkts[i].bytes) else {
            continue;
        };
        if let Some(r) = p.ext.reth.as_mut() {
            r.rkey = RKey::new(
                keymap
                    .get(&r.rkey.value())
                    .copied()
                    .unwrap_or(r.rkey.value()),
            );
        }
        if let Some(a) = p.ext.atomic_eth.as_mut() {
            a.rkey = RKey::new(
                keymap
                    .get(&a.rkey.value())
                    .copied()
                    .unwrap_or(a.rkey.value()),
            );
        }
        qp.handle_packet(now, &p, &meta);
        while let Some(t) = qp.poll_transmit(now, &mut buf) {
            if let Ok(r) = PacketRepr::parse(&buf[..t.len]) {
                out.push(ResponseShape::of(&r));
            }
        }
    }
    out
}
