//! Creation-time configuration of a QP.

use crate::verbs::QpType;

/// Creation-time capacities of a QP (`struct ibv_qp_cap` plus our knobs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// QP type.
    pub qp_type: QpType,
    /// Most outstanding send WRs.
    pub max_send_wr: usize,
    /// Most outstanding receive WRs (ignored with an SRQ).
    pub max_recv_wr: usize,
    /// Most scatter/gather entries per WR.
    pub max_sge: usize,
    /// Most inline bytes per send.
    pub max_inline_data: usize,
    /// Signal every send WR regardless of its own flag (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Most request packets in flight without an ACK (rxe: 128).
    pub max_inflight_packets: u32,
    /// Request an ACK at least every this many packets, as well as at message ends.
    pub ack_req_every: u32,
    /// Early retransmission (RC requester): the shortest wait, in nanoseconds, before packets
    /// left unacknowledged for several measured round trips are sent again, without waiting
    /// for the ACK timeout and without spending `retry_cnt`; `None` leaves recovery to NAKs
    /// and the ACK timeout alone (IBTA's minimum). See `Timer::Probe`.
    pub early_retransmit_min_ns: Option<u64>,
}

/// The default [`QpConfig::early_retransmit_min_ns`]: 2 ms, far above a round trip between
/// hosts that share a switch (tens of microseconds), so that a host that is merely slow to
/// answer (scheduling delays of a loaded machine) is rarely mistaken for a lost packet.
pub const DEFAULT_EARLY_RETRANSMIT_MIN_NS: u64 = 2_000_000;

impl QpConfig {
    /// Defaults for a QP type.
    pub const fn new(qp_type: QpType) -> Self {
        Self {
            qp_type,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_sge: 32,
            max_inline_data: 256,
            sq_sig_all: false,
            max_inflight_packets: 512,
            ack_req_every: 64,
            early_retransmit_min_ns: Some(DEFAULT_EARLY_RETRANSMIT_MIN_NS),
        }
    }
}
