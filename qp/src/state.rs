//! The QP state machine and the attributes each transition needs and allows.
//!
//! IBTA vol. 1, 10.3.1 (QP state diagram) and 11.2.5.2 (Modify QP); Linux
//! `drivers/infiniband/core/verbs.c` `qp_state_table`; `ibv_modify_qp(3)`.
//!
//! ```text
//!            +-------+  modify   +------+  modify   +-----+  modify   +-----+ <--> SQD
//!  create -> | RESET | --------> | INIT | --------> | RTR | --------> | RTS |
//!            +-------+           +------+           +-----+           +-----+ --> SQE (UC/UD)
//!   any state --> RESET;  any state except RESET --> ERR;  SQE --> RTS (UC/UD)
//! ```
//!
//! The table below says, for each allowed (from, to) move and QP type, which attributes are
//! required and which are optional. An attribute outside required + optional fails the call,
//! as in the kernel.

use roce_mr::Access;
use roce_wire::{Psn, QKey, Qpn};

use crate::verbs::{AddressHandle, Mtu, QpState, QpType};

/// Attribute mask bits (`enum ibv_qp_attr_mask`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(u32);

impl AttrMask {
    /// `qp_state`.
    pub const STATE: Self = Self(1 << 0);
    /// `cur_qp_state`.
    pub const CUR_STATE: Self = Self(1 << 1);
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    /// `pkey_index`.
    pub const PKEY_INDEX: Self = Self(1 << 4);
    /// `port_num`.
    pub const PORT: Self = Self(1 << 5);
    /// `qkey`.
    pub const QKEY: Self = Self(1 << 6);
    /// `ah_attr`.
    pub const AV: Self = Self(1 << 7);
    /// `path_mtu`.
    pub const PATH_MTU: Self = Self(1 << 8);
    /// `timeout`.
    pub const TIMEOUT: Self = Self(1 << 9);
    /// `retry_cnt`.
    pub const RETRY_CNT: Self = Self(1 << 10);
    /// `rnr_retry`.
    pub const RNR_RETRY: Self = Self(1 << 11);
    /// `rq_psn`.
    pub const RQ_PSN: Self = Self(1 << 12);
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    /// `alt_ah_attr` and friends.
    pub const ALT_PATH: Self = Self(1 << 14);
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    /// `sq_psn`.
    pub const SQ_PSN: Self = Self(1 << 16);
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    /// `path_mig_state`.
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    /// `cap`.
    pub const CAP: Self = Self(1 << 19);
    /// `dest_qp_num`.
    pub const DEST_QPN: Self = Self(1 << 20);

    /// No bit.
    pub const NONE: Self = Self(0);

    /// From the raw bits.
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }
    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Union.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    /// Whether all bits of `other` are set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// Bits of `self` not in `other`.
    #[must_use]
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl core::ops::BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.with(rhs)
    }
}

impl core::fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const NAMES: [&str; 21] = [
            "STATE",
            "CUR_STATE",
            "EN_SQD_ASYNC_NOTIFY",
            "ACCESS_FLAGS",
            "PKEY_INDEX",
            "PORT",
            "QKEY",
            "AV",
            "PATH_MTU",
            "TIMEOUT",
            "RETRY_CNT",
            "RNR_RETRY",
            "RQ_PSN",
            "MAX_QP_RD_ATOMIC",
            "ALT_PATH",
            "MIN_RNR_TIMER",
            "SQ_PSN",
            "MAX_DEST_RD_ATOMIC",
            "PATH_MIG_STATE",
            "CAP",
            "DEST_QPN",
        ];
        let mut set = f.debug_set();
        for (i, name) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                set.entry(&format_args!("{name}"));
            }
        }
        set.finish()
    }
}

/// The attributes of `ibv_modify_qp`; only those named in the mask are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// Asserted current state (with `CUR_STATE`).
    pub cur_state: QpState,
    /// Remote access the QP allows (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, FLUSH_GLOBAL,
    /// FLUSH_PERSISTENT).
    pub access_flags: Access,
    /// P_Key table index (the table holds only the default P_Key 0xFFFF at index 0).
    pub pkey_index: u16,
    /// Port number (1).
    pub port: u8,
    /// Q_Key (UD).
    pub qkey: QKey,
    /// Primary path address vector.
    pub ah: AddressHandle,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Retries after timeouts or sequence NAKs (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// Expected PSN of the responder.
    pub rq_psn: Psn,
    /// Outstanding READ/atomic requests this QP may have as requester.
    pub max_rd_atomic: u8,
    /// RNR timer code this QP's responder advertises in RNR NAKs.
    pub min_rnr_timer: u8,
    /// First PSN of the requester.
    pub sq_psn: Psn,
    /// READ/atomic resources of this QP's responder.
    pub max_dest_rd_atomic: u8,
    /// Remote QPN (RC/UC).
    pub dest_qpn: Qpn,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            state: QpState::Reset,
            cur_state: QpState::Reset,
            access_flags: Access::empty(),
            pkey_index: 0,
            port: 1,
            qkey: QKey::new(0),
            ah: AddressHandle::new(roce_wire::Gid::ZERO),
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            sq_psn: Psn::new(0),
            max_dest_rd_atomic: 1,
            dest_qpn: Qpn::new(0),
        }
    }
}

/// Why a modify failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// The transition is not in the state table for this QP type.
    #[error("invalid transition {from:?} -> {to:?} for this QP type")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing from the mask.
    #[error("missing required attributes {0:?}")]
    MissingAttributes(AttrMask),
    /// The mask names attributes the transition does not allow.
    #[error("attributes not allowed in this transition: {0:?}")]
    ExtraAttributes(AttrMask),
    /// `CUR_STATE` does not match the QP's state.
    #[error("cur_qp_state {asserted:?} does not match the QP state {actual:?}")]
    CurrentStateMismatch {
        /// The asserted state.
        asserted: QpState,
        /// The real state.
        actual: QpState,
    },
    /// An attribute value is out of range.
    #[error("attribute value out of range: {0}")]
    BadValue(&'static str),
}

use AttrMask as M;

/// The `modify` calls that bring a new QP of type `ty` from RESET up to `to` (INIT, RTR or
/// RTS): each target state with `STATE` plus exactly the attributes [`transition_attrs`]
/// requires for that step, so the bring-up every caller does (the tools' `connect`, the
/// simulator, the capture replay) cannot disagree with the table. Empty for any other `to`.
///
/// ```
/// use roce_qp::state::{bring_up_steps, AttrMask};
/// use roce_qp::verbs::{QpState, QpType};
///
/// let steps: Vec<_> = bring_up_steps(QpType::Ud, QpState::Rts).collect();
/// assert_eq!(steps[1], (QpState::Rtr, AttrMask::STATE));
/// assert_eq!(steps[2], (QpState::Rts, AttrMask::STATE | AttrMask::SQ_PSN));
/// ```
pub fn bring_up_steps(ty: QpType, to: QpState) -> impl Iterator<Item = (QpState, AttrMask)> {
    const PATH: [QpState; 4] = [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts];
    let n = PATH
        .iter()
        .position(|&s| s == to)
        .filter(|&n| n > 0)
        .unwrap_or(0);
    PATH.windows(2).take(n).map(move |w| {
        // INVARIANT: RESET->INIT->RTR->RTS is allowed for every QP type (tested below).
        let (required, _) = transition_attrs(ty, w[0], w[1]).expect("bring-up path allowed");
        (w[1], required | AttrMask::STATE)
    })
}

/// Required and optional attributes of one transition for one QP type, or `None` if the
/// transition is not allowed.
pub fn transition_attrs(ty: QpType, from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    let rcuc = matches!(ty, QpType::Rc | QpType::Uc);
    let rc = ty == QpType::Rc;
    let none = M::NONE;
    Some(match (from, to) {
        (_, Reset) => (none, none),
        (Reset, Err) => return None,
        (_, Err) => (none, none),
        (Reset, Init) | (Init, Init) => {
            let base = M::PKEY_INDEX | M::PORT;
            let extra = if rcuc { M::ACCESS_FLAGS } else { M::QKEY };
            if from == Reset {
                (base | extra, none)
            } else {
                (none, base | extra)
            }
        }
        (Init, Rtr) => {
            if rc {
                (
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                )
            } else if rcuc {
                (
                    M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                )
            } else {
                (none, M::PKEY_INDEX | M::QKEY)
            }
        }
        (Rtr, Rts) => {
            if rc {
                (
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                    M::CUR_STATE
                        | M::ALT_PATH
                        | M::ACCESS_FLAGS
                        | M::MIN_RNR_TIMER
                        | M::PATH_MIG_STATE,
                )
            } else if rcuc {
                (
                    M::SQ_PSN,
                    M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
                )
            } else {
                (M::SQ_PSN, M::CUR_STATE | M::QKEY)
            }
        }
        (Rts, Rts) => {
            if rc {
                (
                    none,
                    M::CUR_STATE
                        | M::ACCESS_FLAGS
                        | M::ALT_PATH
                        | M::PATH_MIG_STATE
                        | M::MIN_RNR_TIMER,
                )
            } else if rcuc {
                (
                    none,
                    M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
                )
            } else {
                (none, M::CUR_STATE | M::QKEY)
            }
        }
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Rts) => {
            if rcuc {
                (
                    none,
                    M::CUR_STATE
                        | M::ACCESS_FLAGS
                        | M::ALT_PATH
                        | M::PATH_MIG_STATE
                        | M::MIN_RNR_TIMER,
                )
            } else {
                (none, M::CUR_STATE | M::QKEY)
            }
        }
        (Sqd, Sqd) => {
            if rc {
                (
                    none,
                    M::AV
                        | M::ALT_PATH
                        | M::ACCESS_FLAGS
                        | M::PKEY_INDEX
                        | M::MIN_RNR_TIMER
                        | M::PATH_MIG_STATE
                        | M::TIMEOUT
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC,
                )
            } else if rcuc {
                (
                    none,
                    M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
                )
            } else {
                (none, M::PKEY_INDEX | M::QKEY)
            }
        }
        (Sqe, Rts) if !rc => {
            if rcuc {
                (none, M::CUR_STATE | M::ACCESS_FLAGS)
            } else {
                (none, M::CUR_STATE | M::QKEY)
            }
        }
        _ => return None,
    })
}

/// Checks a modify request against the table and the attribute ranges.
///
/// # Errors
/// See [`ModifyError`].
pub fn check_modify(
    ty: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
) -> Result<(), ModifyError> {
    let to = if mask.contains(M::STATE) {
        attr.state
    } else {
        cur
    };
    if mask.contains(M::CUR_STATE) && attr.cur_state != cur {
        return Err(ModifyError::CurrentStateMismatch {
            asserted: attr.cur_state,
            actual: cur,
        });
    }
    let Some((required, optional)) = transition_attrs(ty, cur, to) else {
        return Err(ModifyError::InvalidTransition { from: cur, to });
    };
    let given = mask.without(M::STATE);
    let missing = required.without(given);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes(missing));
    }
    let extra = given.without(required | optional);
    if !extra.is_empty() {
        return Err(ModifyError::ExtraAttributes(extra));
    }
    if mask.contains(M::PORT) && attr.port != 1 {
        return Err(ModifyError::BadValue("port must be 1"));
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        return Err(ModifyError::BadValue(
            "pkey_index must be 0 (one P_Key: 0xFFFF)",
        ));
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return Err(ModifyError::BadValue("timeout is 5 bits"));
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return Err(ModifyError::BadValue("retry_cnt is 3 bits"));
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return Err(ModifyError::BadValue("rnr_retry is 3 bits"));
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return Err(ModifyError::BadValue("min_rnr_timer is 5 bits"));
    }
    if mask.contains(M::ACCESS_FLAGS)
        && !Access::LOCAL_WRITE
            .union(Access::REMOTE)
            .union(Access::MW_BIND)
            .union(Access::FLUSH_GLOBAL)
            .union(Access::FLUSH_PERSISTENT)
            .contains(attr.access_flags)
    {
        return Err(ModifyError::BadValue("access_flags"));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > 128 {
        return Err(ModifyError::BadValue("max_rd_atomic above 128"));
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > 128 {
        return Err(ModifyError::BadValue("max_dest_rd_atomic above 128"));
    }
    // Controlled Q_Keys (bit 31) are for privileged consumers; this stack has no privilege
    // model, so it allows them (rxe: EPERM without CAP_NET_RAW).
    Ok(())
}

/// The transition table of a QP type as a Graphviz DOT graph (edges labelled with their
/// required attributes), for documentation and review.
pub fn dot(ty: QpType) -> String {
    let mut out = format!("digraph qp_{ty:?} {{\n");
    for from in QpState::ALL {
        for to in QpState::ALL {
            if let Some((required, _)) = transition_attrs(ty, from, to) {
                out += &format!("  {from:?} -> {to:?} [label=\"{required:?}\"];\n");
            }
        }
    }
    out += "}\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bring_up_follows_the_table() {
        use QpState::{Init, Reset, Rtr, Rts};
        for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let steps: Vec<_> = bring_up_steps(ty, Rts).collect();
            assert_eq!(steps.len(), 3);
            let mut from = Reset;
            for (to, mask) in &steps {
                let (required, _) = transition_attrs(ty, from, *to).unwrap();
                assert_eq!(*mask, required | AttrMask::STATE, "{ty:?} {from:?}->{to:?}");
                from = *to;
            }
            assert_eq!(bring_up_steps(ty, Rtr).count(), 2);
            assert_eq!(bring_up_steps(ty, Init).count(), 1);
            assert_eq!(bring_up_steps(ty, Reset).count(), 0);
            assert_eq!(bring_up_steps(ty, QpState::Err).count(), 0);
        }
        // What the tools sent before the bring-up was derived (rdma-core's pingpong masks).
        let rc: Vec<_> = bring_up_steps(QpType::Rc, Rts).map(|s| s.1).collect();
        assert_eq!(
            rc,
            [
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER,
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC,
            ]
        );
        let ud: Vec<_> = bring_up_steps(QpType::Ud, Rts).map(|s| s.1).collect();
        assert_eq!(
            ud[0],
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
        );
    }

    #[test]
    fn dot_graph_has_every_allowed_edge() {
        let g = dot(QpType::Rc);
        assert!(g.starts_with("digraph qp_Rc {"));
        assert_eq!(
            g.matches("->").count(),
            21,
            "the x cells of the RC matrix snapshot"
        );
        assert!(
            g.contains("Reset -> Init [label=\"{ACCESS_FLAGS, PKEY_INDEX, PORT}\"]"),
            "{g}"
        );
        assert!(g.contains("Rtr -> Rts"));
        assert!(!g.contains("Reset -> Err"));
        assert!(!g.contains("Sqe -> Rts"), "RC goes to ERR, never SQE");
        assert!(dot(QpType::Ud).contains("Sqe -> Rts"));
    }

    /// Snapshot of the state x state matrix for each type: `.` not allowed, `x` allowed.
    #[test]
    fn transition_matrix_snapshot() {
        let mut out = String::new();
        for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
            out += &format!("{ty:?}\n");
            for from in QpState::ALL {
                for to in QpState::ALL {
                    out.push(if transition_attrs(ty, from, to).is_some() {
                        'x'
                    } else {
                        '.'
                    });
                }
                out.push('\n');
            }
        }
        // Rows: from RESET, INIT, RTR, RTS, SQD, SQE, ERR; columns: to, same order.
        let expected = "\
Rc
xx.....
xxx...x
x..x..x
x..xx.x
x..xx.x
x.....x
x.....x
Uc
xx.....
xxx...x
x..x..x
x..xx.x
x..xx.x
x..x..x
x.....x
Ud
xx.....
xxx...x
x..x..x
x..xx.x
x..xx.x
x..x..x
x.....x
";
        assert_eq!(out, expected);
    }

    #[test]
    fn rc_bring_up_requires_the_verbs_attributes() {
        let attr = QpAttr {
            state: QpState::Init,
            ..QpAttr::default()
        };
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &attr, init),
            Ok(())
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Reset,
                &attr,
                M::STATE | M::PKEY_INDEX | M::PORT
            ),
            Err(ModifyError::MissingAttributes(M::ACCESS_FLAGS))
        );
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &attr, init | M::SQ_PSN),
            Err(ModifyError::ExtraAttributes(M::SQ_PSN))
        );
        let rtr = QpAttr {
            state: QpState::Rtr,
            ..attr
        };
        let m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &rtr, m),
            Err(ModifyError::MissingAttributes(
                M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
            ))
        );
        assert_eq!(check_modify(QpType::Uc, QpState::Init, &rtr, m), Ok(()));
        let rts = QpAttr {
            state: QpState::Rts,
            ..attr
        };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &rts, M::STATE | M::SQ_PSN),
            Err(ModifyError::MissingAttributes(
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
            ))
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Reset,
                &QpAttr {
                    state: QpState::Rts,
                    ..attr
                },
                M::STATE
            ),
            Err(ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
        let bad = QpAttr {
            state: QpState::Rts,
            retry_cnt: 8,
            ..attr
        };
        assert!(matches!(
            check_modify(
                QpType::Rc,
                QpState::Rtr,
                &bad,
                M::STATE
                    | M::SQ_PSN
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
            ),
            Err(ModifyError::BadValue(_))
        ));
    }
}
