//! The verbs object model as plain data: work requests, completions, address handles, QP
//! attributes. Names and numbers follow rdma-core's `verbs.h`.

use roce_mr::AccessError;
use roce_wire::aeth::NakCode;
use roce_wire::{Gid, LKey, QKey, Qpn, RKey};

/// Work-completion status, `enum ibv_wc_status` (rdma-core verbs.h), same names and values.
///
/// It lives here, with the completions: the memory layer (`roce-mr`) only says which NAK a
/// refused remote access earns; [`WcStatus::of_local_access`] and
/// [`WcStatus::of_remote_access`] say what a refused access completes with.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum WcStatus {
    /// 0: success.
    Success = 0,
    /// 1: local length error.
    LocLenErr = 1,
    /// 2: local QP operation error (also failed LOCAL_INV / REG_MR in rxe).
    LocQpOpErr = 2,
    /// 3: local EE context operation error (RD only).
    LocEecOpErr = 3,
    /// 4: local protection error: bad lkey, wrong PD, or access not allowed for a local SGE.
    LocProtErr = 4,
    /// 5: work request flushed.
    WrFlushErr = 5,
    /// 6: memory window bind failed.
    MwBindErr = 6,
    /// 7: bad response.
    BadRespErr = 7,
    /// 8: local access error (receive side protection error for WRITE with immediate).
    LocAccessErr = 8,
    /// 9: remote invalid request (NAK 0x61).
    RemInvReqErr = 9,
    /// 10: remote access error (NAK 0x62).
    RemAccessErr = 10,
    /// 11: remote operational error (NAK 0x63).
    RemOpErr = 11,
    /// 12: transport retry counter exceeded.
    RetryExcErr = 12,
    /// 13: RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// 14: local RDD violation (RD only).
    LocRddViolErr = 14,
    /// 15: remote invalid RD request.
    RemInvRdReqErr = 15,
    /// 16: remote abort.
    RemAbortErr = 16,
    /// 17: invalid EE context number.
    InvEecnErr = 17,
    /// 18: invalid EE context state.
    InvEecStateErr = 18,
    /// 19: fatal error.
    FatalErr = 19,
    /// 20: response timeout.
    RespTimeoutErr = 20,
    /// 21: general error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Every status, in value order (0..=21).
    pub const ALL: [Self; 22] = [
        Self::Success,
        Self::LocLenErr,
        Self::LocQpOpErr,
        Self::LocEecOpErr,
        Self::LocProtErr,
        Self::WrFlushErr,
        Self::MwBindErr,
        Self::BadRespErr,
        Self::LocAccessErr,
        Self::RemInvReqErr,
        Self::RemAccessErr,
        Self::RemOpErr,
        Self::RetryExcErr,
        Self::RnrRetryExcErr,
        Self::LocRddViolErr,
        Self::RemInvRdReqErr,
        Self::RemAbortErr,
        Self::InvEecnErr,
        Self::InvEecStateErr,
        Self::FatalErr,
        Self::RespTimeoutErr,
        Self::GeneralErr,
    ];

    /// The text `ibv_wc_status_str` gives (rdma-core `libibverbs/enum_strs.c`, unchanged from
    /// v44 to v64), so that logs read like the stock tools' `Failed status %s (%d)`. Also
    /// what [`Display`](core::fmt::Display) prints.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocEecOpErr => "local EE context operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory management operation error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocRddViolErr => "local RDD violation error",
            Self::RemInvRdReqErr => "remote invalid RD request",
            Self::RemAbortErr => "aborted error",
            Self::InvEecnErr => "invalid EE context number",
            Self::InvEecStateErr => "invalid EE context state",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout error",
            Self::GeneralErr => "general error",
        }
    }

    /// The status of a local work request whose SGE (lkey) the key table refused: bad lkey, PD,
    /// rights or range are LOC_PROT_ERR (rxe: copy to/from the SGE failed); atomic-format
    /// errors are LOC_QP_OP_ERR.
    pub const fn of_local_access(e: &AccessError) -> Self {
        match e.responder_nak() {
            NakCode::InvalidRequest => Self::LocQpOpErr,
            _ => Self::LocProtErr,
        }
    }

    /// The status a requester completes its work request with when the responder answers
    /// `nak` (and the responder's own completion for the same refusal): 0x61 REM_INV_REQ_ERR,
    /// 0x62 REM_ACCESS_ERR, 0x63 REM_OP_ERR, 0x64 REM_INV_RD_REQ_ERR; `None` for a PSN
    /// sequence error (the requester rewinds) and reserved codes.
    pub const fn of_nak(nak: NakCode) -> Option<Self> {
        match nak {
            NakCode::InvalidRequest => Some(Self::RemInvReqErr),
            NakCode::RemoteAccessError => Some(Self::RemAccessErr),
            NakCode::RemoteOperationalError => Some(Self::RemOpErr),
            NakCode::InvalidRdRequest => Some(Self::RemInvRdReqErr),
            NakCode::PsnSequenceError | NakCode::Reserved(_) => None,
        }
    }

    /// The responder's completion status for a remote access the key table refused: the
    /// status that matches the NAK it sends ([`AccessError::responder_nak`]).
    pub const fn of_remote_access(e: &AccessError) -> Self {
        match Self::of_nak(e.responder_nak()) {
            Some(status) => status,
            None => Self::RemAccessErr,
        }
    }
}

/// `ibv_wc_status_str`'s text ([`WcStatus::as_str`]); `{:#}` adds the value as the stock
/// tools print it: `transport retry counter exceeded (12)`.
impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if f.alternate() {
            write!(f, "{} ({})", self.as_str(), *self as u8)
        } else {
            f.write_str(self.as_str())
        }
    }
}

/// Queue pair transport type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// Queue pair state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    /// 0: just created or reset; drops everything.
    Reset,
    /// 1: accepts receive WRs, no traffic.
    Init,
    /// 2: ready to receive: answers requests, sends nothing of its own.
    Rtr,
    /// 3: ready to send: full operation.
    Rts,
    /// 4: send queue drained: finishes in-flight requests, starts no new ones.
    Sqd,
    /// 5: send queue error (UC/UD only).
    Sqe,
    /// 6: error: everything flushed, traffic dropped.
    Err,
}

impl QpState {
    /// All states, in `ibv_qp_state` order.
    pub const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Err,
    ];
}

/// Path MTU: payload bytes per packet (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes.
    pub const fn bytes(self) -> usize {
        128 << (self as u32)
    }
    /// From payload bytes (256, 512, 1024, 2048 or 4096).
    pub const fn from_bytes(n: usize) -> Option<Self> {
        match n {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }
    /// The largest path MTU that fits an interface MTU (rxe: netdev MTU minus 80 bytes of
    /// headers; 1500 gives 1024, 9000 gives 4096).
    pub const fn for_netdev_mtu(mtu: usize) -> Option<Self> {
        let room = mtu.saturating_sub(80);
        if room >= 4096 {
            Some(Self::Mtu4096)
        } else if room >= 2048 {
            Some(Self::Mtu2048)
        } else if room >= 1024 {
            Some(Self::Mtu1024)
        } else if room >= 512 {
            Some(Self::Mtu512)
        } else if room >= 256 {
            Some(Self::Mtu256)
        } else {
            None
        }
    }
}

/// An address vector: where a QP's packets go (RoCEv2: a GID is an IP address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressHandle {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IP traffic class / TOS (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (also the UDP source port entropy).
    pub flow_label: u32,
}

impl AddressHandle {
    /// An address handle to `dgid` with rxe's defaults (hop limit 64, traffic class 0).
    pub const fn new(dgid: Gid) -> Self {
        Self {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// A scatter/gather element: `length` bytes at `addr` (an IOVA) in the region of `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Address (IOVA) in the region.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: LKey,
}

/// The operation of a send work request (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND with invalidate: the responder invalidates `rkey`.
    SendWithInv {
        /// Remote key to invalidate.
        rkey: RKey,
    },
    /// RDMA WRITE.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// RDMA WRITE with immediate data (consumes a receive WR at the responder).
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// 8-byte compare and swap; the original value lands in the local SGE.
    AtomicCmpAndSwp {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// 8-byte fetch and add; the original value lands in the local SGE.
    AtomicFetchAndAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Value to add.
        add: u64,
    },
    /// Invalidate a local key (no packet).
    LocalInv {
        /// The key to invalidate.
        key: u32,
    },
    /// ATOMIC WRITE (IBTA 1.5 annex A19, `IBV_WR_ATOMIC_WRITE`): the WR's 8 bytes of data are
    /// stored at once at an 8-byte aligned remote address. The responder needs REMOTE_WRITE
    /// on the QP and the region; the response is an empty RDMA READ response.
    AtomicWrite {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// FLUSH (IBTA 1.5 annex A19, `ibv_wr_flush`): makes the earlier writes to a remote range
    /// (or the whole region) globally visible or persistent before it completes. No data; the
    /// responder needs the FLUSH_GLOBAL/FLUSH_PERSISTENT access the placement names.
    Flush {
        /// Remote address of the range (ignored for [`FlushLevel::Mr`]).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Length of the range.
        len: u32,
        /// Where the data must be placed.
        placement: FlushPlacement,
        /// A range or the whole region.
        level: FlushLevel,
    },
}

/// FLUSH placement types (`enum ibv_placement_type`), a set; the FETH's placement type field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlushPlacement(u8);

impl FlushPlacement {
    /// Global visibility (`IBV_FLUSH_GLOBAL`).
    pub const GLOBAL: Self = Self(1 << 0);
    /// Persistence (`IBV_FLUSH_PERSISTENT`).
    pub const PERSISTENT: Self = Self(1 << 1);

    /// From the 4-bit FETH field (upper bits ignored).
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits & 0x0F)
    }
    /// The 4-bit field.
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// Whether every type of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// The union of two sets.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// FLUSH selectivity level (`enum ibv_selectivity_level`); the FETH's selectivity field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushLevel {
    /// The range `remote_addr .. + len` (`IBV_FLUSH_RANGE`).
    Range = 0,
    /// The whole memory region of the rkey (`IBV_FLUSH_MR`).
    Mr = 1,
}

impl SendOp {
    /// Whether the operation uses the RC read/atomic resources (limited by max_rd_atomic) and
    /// completes on its response rather than on an ACK: READ, the atomics, ATOMIC WRITE and
    /// FLUSH.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            Self::RdmaRead { .. }
                | Self::AtomicCmpAndSwp { .. }
                | Self::AtomicFetchAndAdd { .. }
                | Self::AtomicWrite { .. }
                | Self::Flush { .. }
        )
    }
    /// Whether the responder's data comes back into the WR's buffer (READ, compare and swap,
    /// fetch and add): such a WR takes no inline data.
    pub const fn returns_data(self) -> bool {
        matches!(
            self,
            Self::RdmaRead { .. } | Self::AtomicCmpAndSwp { .. } | Self::AtomicFetchAndAdd { .. }
        )
    }
    /// Whether the operation is an atomic.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            Self::AtomicCmpAndSwp { .. } | Self::AtomicFetchAndAdd { .. }
        )
    }
    /// The work-completion opcode of this operation.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::Send | Self::SendWithImm { .. } | Self::SendWithInv { .. } => WcOpcode::Send,
            Self::RdmaWrite { .. } | Self::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            Self::RdmaRead { .. } => WcOpcode::RdmaRead,
            Self::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            Self::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
            Self::LocalInv { .. } => WcOpcode::LocalInv,
            Self::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            Self::Flush { .. } => WcOpcode::Flush,
        }
    }
}

/// The destination of a UD send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Where to send.
    pub ah: AddressHandle,
    /// Remote QPN.
    pub remote_qpn: Qpn,
    /// Remote Q_Key (bit 31 set: use the QP's own Q_Key).
    pub remote_qkey: QKey,
}

/// The data of a send: gathered from registered memory, or copied at post time (inline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendData {
    /// Scatter/gather list (for READ and atomics: where the result lands).
    Sges(Vec<Sge>),
    /// Inline data, copied when posted (not for READ or atomics).
    Inline(Vec<u8>),
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The data.
    pub data: SendData,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Ask for a solicited event at the receiver (SE bit).
    pub solicited: bool,
    /// UD only: destination.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled work request with a scatter/gather list.
    pub fn new(wr_id: u64, op: SendOp, sges: Vec<Sge>) -> Self {
        Self {
            wr_id,
            op,
            data: SendData::Sges(sges),
            signaled: true,
            solicited: false,
            ud: None,
        }
    }

    /// Total length of the data.
    pub fn len(&self) -> u64 {
        match &self.data {
            SendData::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            SendData::Inline(d) => d.len() as u64,
        }
    }

    /// Whether there is no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where incoming data lands.
    pub sges: Vec<Sge>,
}

impl RecvWr {
    /// A receive work request with a scatter list (`ibv_recv_wr { wr_id, sg_list }`); an
    /// empty list accepts only zero-length messages (and WRITE_WITH_IMM's immediate).
    pub fn new(wr_id: u64, sges: Vec<Sge>) -> Self {
        Self { wr_id, sges }
    }

    /// Total capacity.
    pub fn len(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.length)).sum()
    }
    /// Whether the receive has no room at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Work completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND completed.
    Send,
    /// An RDMA WRITE completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// A compare and swap completed.
    CompSwap,
    /// A fetch and add completed.
    FetchAdd,
    /// A local invalidate completed.
    LocalInv,
    /// A FLUSH completed (`IBV_WC_FLUSH` = 8).
    Flush,
    /// An ATOMIC WRITE completed (`IBV_WC_ATOMIC_WRITE` = 9).
    AtomicWrite,
    /// A receive completed (incoming SEND).
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A work completion (`struct ibv_wc`). On error only `wr_id`, `status` and `qp_num` are
/// meaningful.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes written, including the 40-byte GRH area for UD).
    pub byte_len: u32,
    /// Immediate data, if any.
    pub imm_data: Option<u32>,
    /// The rkey a SEND with invalidate invalidated.
    pub invalidated_rkey: Option<RKey>,
    /// The local QP.
    pub qp_num: Qpn,
    /// UD receives: the sender's QPN.
    pub src_qp: Qpn,
    /// UD receives: the first 40 bytes of the buffer hold the network header.
    pub grh: bool,
    /// Receives: the sender asked for a solicited event.
    pub solicited: bool,
}

impl Completion {
    /// A placeholder for arrays that [`crate::cq::CompletionQueue::poll_many`] fills.
    pub const EMPTY: Self = Self::new(0, WcStatus::Success, WcOpcode::Send, Qpn::new(0));

    pub(crate) const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        Self {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: Qpn::new(0),
            grh: false,
            solicited: false,
        }
    }
}

/// Which of the two completion queues of a QP a completion goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqSide {
    /// The send CQ.
    Send,
    /// The receive CQ.
    Recv,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wc_status_str[]` of `ibv_wc_status_str`, copied from rdma-core v44.0
    /// `libibverbs/enum_strs.c` (identical in v64.0), indexed by `enum ibv_wc_status`. The
    /// last two (`IBV_WC_TM_ERR`, `IBV_WC_TM_RNDV_INCOMPLETE`) are tag-matching statuses
    /// rocectl never produces, so [`WcStatus`] has no variant for them.
    const RDMA_CORE: [&str; 24] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
        "TM error",
        "TM software rendezvous",
    ];

    #[test]
    fn wc_status_display_is_ibv_wc_status_str() {
        for (i, status) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(*status as usize, i, "ALL is in value order");
            assert_eq!(status.to_string(), RDMA_CORE[i], "{status:?}");
            assert_eq!(status.as_str(), RDMA_CORE[i]);
        }
        assert_eq!(
            format!("{:#}", WcStatus::RetryExcErr),
            "transport retry counter exceeded (12)"
        );
        assert_eq!(format!("{:#}", WcStatus::Success), "success (0)");
    }

    #[test]
    fn recv_wr_new_holds_its_fields() {
        let sge = Sge {
            addr: 0x1000,
            length: 64,
            lkey: LKey::new(7),
        };
        let wr = RecvWr::new(9, vec![sge, sge]);
        assert_eq!(
            wr,
            RecvWr {
                wr_id: 9,
                sges: vec![sge, sge]
            }
        );
        assert_eq!(wr.len(), 128);
        assert!(RecvWr::new(1, vec![]).is_empty());
    }
}
