//! The messages of the control protocol: one enum of requests, one of replies, a versioned
//! hello, and the typed refusals ([`ControlError`]).
//!
//! Every message is one JSON object in one frame (see `super::frame`). The first request on a
//! connection must be [`Request::Hello`]; the daemon answers with its own version and refuses
//! a client of another major version ([`ControlError::VersionMismatch`]) before anything else.
//! A minor version adds optional fields only, so either side ignores the fields it does not
//! know (serde's default), and the older side's fields keep their meaning.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The protocol's major version: a client and a daemon of different majors do not talk.
pub const PROTOCOL_MAJOR: u16 = 1;
/// The protocol's minor version: only optional fields are added within a major version.
pub const PROTOCOL_MINOR: u16 = 1;

/// What a connection is for, said in the hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// A process opening a device: it allocates a QPN range and reserves objects, and the
    /// daemon reaps what it holds when the connection ends.
    Device,
    /// A viewer (`rocectl res show`, `rocectl stat`): it only reads.
    View,
}

/// How datagrams reach the processes sharing the address (the daemon's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every client's socket shares IP:4791; the kernel steers each datagram to its owner by
    /// destination QPN (SO_REUSEPORT + an SK_REUSEPORT BPF program). One trust domain (one
    /// uid): a member socket can detach or replace the program.
    KernelDemux,
    /// The daemon receives every datagram on IP:4791 and copies it into its owner's
    /// shared-memory ring; clients send from their own sockets. Several users: a client holds
    /// no socket on 4791, so it cannot take another's datagrams.
    Forwarding,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KernelDemux => "kernel-demux",
            Self::Forwarding => "forwarding",
        })
    }
}

/// The first request of every connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The client's [`PROTOCOL_MAJOR`].
    pub major: u16,
    /// The client's [`PROTOCOL_MINOR`].
    pub minor: u16,
    /// What the connection is for.
    pub role: Role,
    /// The program's own description of itself, for the logs only: the daemon takes the
    /// client's pid, uid, gid and command name from the kernel (`SO_PEERCRED`, `/proc`),
    /// never from this.
    #[serde(default)]
    pub program: String,
}

impl Hello {
    /// This library's hello.
    pub fn new(role: Role) -> Self {
        Self {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            role,
            program: String::new(),
        }
    }
}

/// The daemon's answer to a hello.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's [`PROTOCOL_MAJOR`].
    pub major: u16,
    /// The daemon's [`PROTOCOL_MINOR`].
    pub minor: u16,
    /// The daemon's software version (`rocectl --version`).
    pub software: String,
    /// The address the daemon serves; a device on another address does not use the daemon.
    pub address: IpAddr,
    /// The data-path mode.
    pub mode: Mode,
    /// The QPN range size the daemon hands out.
    pub qpn_range_size: u32,
}

/// A count of verbs objects: what a client reserves or releases, or holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Objects {
    /// Queue pairs.
    #[serde(default)]
    pub qps: u32,
    /// Completion queues.
    #[serde(default)]
    pub cqs: u32,
    /// Memory regions.
    #[serde(default)]
    pub mrs: u32,
    /// Bytes registered in memory regions.
    #[serde(default)]
    pub mr_bytes: u64,
}

impl Objects {
    /// One queue pair.
    pub fn qp() -> Self {
        Self {
            qps: 1,
            ..Self::default()
        }
    }

    /// One completion queue.
    pub fn cq() -> Self {
        Self {
            cqs: 1,
            ..Self::default()
        }
    }

    /// One memory region of `bytes` bytes.
    pub fn mr(bytes: u64) -> Self {
        Self {
            mrs: 1,
            mr_bytes: bytes,
            ..Self::default()
        }
    }

    /// The sum, saturating.
    #[must_use]
    pub fn plus(self, o: Self) -> Self {
        Self {
            qps: self.qps.saturating_add(o.qps),
            cqs: self.cqs.saturating_add(o.cqs),
            mrs: self.mrs.saturating_add(o.mrs),
            mr_bytes: self.mr_bytes.saturating_add(o.mr_bytes),
        }
    }

    /// The difference, saturating at 0.
    #[must_use]
    pub fn minus(self, o: Self) -> Self {
        Self {
            qps: self.qps.saturating_sub(o.qps),
            cqs: self.cqs.saturating_sub(o.cqs),
            mrs: self.mrs.saturating_sub(o.mrs),
            mr_bytes: self.mr_bytes.saturating_sub(o.mr_bytes),
        }
    }
}

/// One QP as a client reports it, with `rdma res show qp`'s field names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpView {
    /// Local QPN.
    pub lqpn: u32,
    /// Remote QPN (0 before the QP is connected).
    pub rqpn: u32,
    /// `RC`, `UC`, `UD`...
    #[serde(rename = "type")]
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE`, `ERR`.
    pub state: String,
    /// Next send PSN.
    #[serde(rename = "sq-psn")]
    pub sq_psn: u32,
    /// Expected receive PSN.
    #[serde(rename = "rq-psn")]
    pub rq_psn: u32,
}

/// The most memory regions one report lists.
pub const MAX_REPORTED_MRS: usize = 4096;

/// One memory region as `rocectl res show mr` shows it (`rdma resource show mr`'s columns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrView {
    /// The region's number (its key's table index).
    pub mrn: u32,
    /// Its rkey.
    pub rkey: u32,
    /// Its lkey (the same number as the rkey).
    pub lkey: u32,
    /// Its length in bytes.
    pub mrlen: u64,
    /// Its protection domain's number.
    pub pdn: u32,
    /// IOVA of its first byte.
    pub iova: u64,
}

/// What a client pushes for the views (a snapshot; the daemon keeps the last one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The device name.
    #[serde(default)]
    pub device: String,
    /// The live QPs.
    #[serde(default)]
    pub qps: Vec<QpView>,
    /// Protection domains (not limited, only shown).
    #[serde(default)]
    pub pds: u32,
    /// The registered memory regions (at most [`MAX_REPORTED_MRS`]; `mrs_total` counts all).
    #[serde(default)]
    pub mrs: Vec<MrView>,
    /// How many regions the device has (more than `mrs.len()` when the list was cut).
    #[serde(default)]
    pub mrs_total: u32,
    /// The device's counters (`rdma statistic` names), in the device's order.
    #[serde(default)]
    pub counters: Vec<(String, u64)>,
}

/// The QPN range a device client gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The slot number (`qpn_base / qpn_count`); slot 0 is the daemon's.
    pub slot: u32,
    /// The first QPN of the range.
    pub qpn_base: u32,
    /// How many QPNs (a power of two).
    pub qpn_count: u32,
    /// The data-path mode.
    pub mode: Mode,
    /// Whether the kernel demultiplexer's map and program descriptors ride along with this
    /// reply (`SCM_RIGHTS`, in that order).
    #[serde(default)]
    pub demux_fds: bool,
    /// Whether the forwarding ring's memory and eventfd descriptors ride along with this
    /// reply (`SCM_RIGHTS`, in that order; forwarding mode).
    #[serde(default)]
    pub ring_fds: bool,
}

impl Lease {
    /// The QPNs of the range.
    pub fn qpns(&self) -> std::ops::RangeInclusive<u32> {
        self.qpn_base..=self.qpn_base.saturating_add(self.qpn_count.max(1) - 1)
    }
}

/// One client as the views show it: identity from the kernel, accounting from the daemon,
/// details from the client's last [`Report`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientView {
    /// Process id (`SO_PEERCRED`).
    pub pid: u32,
    /// User id (`SO_PEERCRED`).
    pub uid: u32,
    /// Group id (`SO_PEERCRED`).
    pub gid: u32,
    /// Command name (`/proc/PID/comm`, read by the daemon at connect).
    pub comm: String,
    /// The QPN range, if one was allocated.
    pub lease: Option<Lease>,
    /// What the daemon accounts to the client.
    pub objects: Objects,
    /// The client's last report.
    pub report: Report,
    /// Milliseconds since the last report (how stale `report` is).
    pub report_age_ms: u64,
}

/// The daemon's own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonStats {
    /// Device clients connected now.
    pub clients: u32,
    /// Slots a new client can get now.
    pub slots_free: u32,
    /// Slots waiting out their quarantine.
    pub slots_quarantined: u32,
    /// Clients reaped since the daemon started.
    pub clients_reaped: u64,
    /// Requests refused for a limit since the daemon started.
    pub limit_refusals: u64,
    /// Forwarding mode: datagrams copied into a client's ring.
    #[serde(default)]
    pub forwarded: u64,
    /// Forwarding mode: datagrams for a QPN no client owns (dropped).
    #[serde(default)]
    pub rx_drop_no_owner: u64,
    /// Forwarding mode: datagrams dropped because their owner's ring was full.
    #[serde(default)]
    pub ring_full_drops: u64,
}

/// A request from a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Request {
    /// The first request: versions and role.
    Hello(Hello),
    /// Allocates the client's QPN range (once per connection) for a device on `address`.
    AllocRange {
        /// The device name (for the views).
        device: String,
    },
    /// Reserves objects before creating them; refused with [`ControlError::LimitExceeded`].
    Reserve(Objects),
    /// Returns objects reserved earlier.
    Release(Objects),
    /// The client's snapshot for the views.
    Report(Report),
    /// Every client (`rocectl res show`).
    ResShow,
    /// The daemon's counters (`rocectl stat`).
    Stat,
    /// (1.1) A device of an earlier daemon run takes its QPN range back after the daemon
    /// restarted: the connection carries the device's kernel-demux socket (`SCM_RIGHTS`), and
    /// the daemon grants the range only if that very socket (its cookie) holds `slot` in the
    /// demultiplexer. `objects` are what the device holds, counted again from then on.
    Resume {
        /// The device name (for the views).
        device: String,
        /// The slot it holds.
        slot: u32,
        /// What it holds.
        objects: Objects,
    },
}

/// A reply from the daemon; exactly one per request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Reply {
    /// The answer to a hello.
    Welcome(Welcome),
    /// The answer to [`Request::AllocRange`].
    Lease(Lease),
    /// Done.
    Ok,
    /// The answer to [`Request::ResShow`].
    Clients {
        /// Every device client.
        clients: Vec<ClientView>,
    },
    /// The answer to [`Request::Stat`].
    Stats {
        /// The daemon's counters.
        daemon: DaemonStats,
        /// Every device client (their counters are in `report.counters`).
        clients: Vec<ClientView>,
    },
    /// The request was refused; nothing changed.
    Error(ControlError),
}

/// Which resource a limit is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// Device clients (connections holding a QPN range).
    Clients,
    /// Queue pairs.
    Qps,
    /// Completion queues.
    Cqs,
    /// Memory regions.
    Mrs,
    /// Registered bytes.
    MrBytes,
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Clients => "clients",
            Self::Qps => "QPs",
            Self::Cqs => "CQs",
            Self::Mrs => "MRs",
            Self::MrBytes => "registered bytes",
        })
    }
}

/// Whose limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// One connection (one process's device).
    Client,
    /// Every client of one uid together.
    Uid,
    /// The whole daemon.
    Daemon,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Client => "per-client",
            Self::Uid => "per-uid",
            Self::Daemon => "daemon-wide",
        })
    }
}

/// Why the daemon refused a request (typed, so a client can act on it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ControlError {
    /// The client speaks another major version of the protocol.
    #[error("protocol version mismatch: client speaks {client_major}.x, daemon speaks {daemon_major}.{daemon_minor} (upgrade the older side)")]
    VersionMismatch {
        /// The client's major version.
        client_major: u16,
        /// The daemon's major version.
        daemon_major: u16,
        /// The daemon's minor version.
        daemon_minor: u16,
    },
    /// The first request was not a hello.
    #[error("the first request on a connection must be a hello")]
    NoHello,
    /// A limit would be exceeded.
    #[error("{scope} limit on {resource} reached: {in_use} in use, {requested} more asked, limit {limit}")]
    LimitExceeded {
        /// Which resource.
        resource: Resource,
        /// Whose limit.
        scope: Scope,
        /// The limit.
        limit: u64,
        /// In use now.
        in_use: u64,
        /// Asked for.
        requested: u64,
    },
    /// Every QPN range is allocated or in quarantine.
    #[error("no free QPN range ({quarantined} in quarantine after their owners died)")]
    NoFreeRange {
        /// Ranges waiting out their quarantine.
        quarantined: u32,
    },
    /// The connection already holds a range.
    #[error("this connection already holds QPN range slot {slot}")]
    AlreadyHasRange {
        /// Its slot.
        slot: u32,
    },
    /// The request needs a range first (reserve before allocating a range).
    #[error("allocate a QPN range first")]
    NoRange,
    /// The caller may not do this.
    #[error("forbidden: {reason}")]
    Forbidden {
        /// Why.
        reason: String,
    },
    /// A feature the daemon does not have yet.
    #[error("not implemented yet: {what}")]
    NotImplemented {
        /// What.
        what: String,
    },
    /// A malformed request.
    #[error("bad request: {reason}")]
    BadRequest {
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire form is stable JSON with a tag per enum: what another implementation reads.
    #[test]
    fn requests_and_replies_have_a_tagged_json_form() {
        let hello = Request::Hello(Hello::new(Role::Device));
        let text = serde_json::to_string(&hello).unwrap();
        assert_eq!(
            text,
            r#"{"op":"hello","major":1,"minor":1,"role":"device","program":""}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), hello);
        // 1.1: a member of an earlier daemon run takes its range back.
        let resume = Request::Resume {
            device: "rocectl0".into(),
            slot: 3,
            objects: Objects::default(),
        };
        let text = serde_json::to_string(&resume).unwrap();
        assert!(
            text.starts_with(r#"{"op":"resume","device":"rocectl0","slot":3,"objects":{"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), resume);
        let err = Reply::Error(ControlError::LimitExceeded {
            resource: Resource::Qps,
            scope: Scope::Uid,
            limit: 4,
            in_use: 4,
            requested: 1,
        });
        let text = serde_json::to_string(&err).unwrap();
        assert!(text.contains(r#""reply":"error""#), "{text}");
        assert!(text.contains(r#""error":"limit-exceeded""#), "{text}");
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), err);
        // Every refusal serialises (an internally tagged enum cannot hold a bare string).
        for e in [
            ControlError::NoHello,
            ControlError::NoRange,
            ControlError::NoFreeRange { quarantined: 1 },
            ControlError::AlreadyHasRange { slot: 3 },
            ControlError::Forbidden { reason: "x".into() },
            ControlError::NotImplemented { what: "x".into() },
            ControlError::BadRequest { reason: "x".into() },
            ControlError::VersionMismatch {
                client_major: 2,
                daemon_major: 1,
                daemon_minor: 0,
            },
        ] {
            let r = Reply::Error(e);
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), r);
        }
    }

    /// A newer minor version's unknown fields are ignored, and missing optional ones default.
    #[test]
    fn unknown_fields_are_ignored_and_optional_ones_default() {
        let text = r#"{"op":"hello","major":1,"minor":7,"role":"view","future":[1,2]}"#;
        let Request::Hello(h) = serde_json::from_str::<Request>(text).unwrap() else {
            panic!("not a hello");
        };
        assert_eq!((h.major, h.minor, h.role), (1, 7, Role::View));
        assert!(h.program.is_empty());
    }

    #[test]
    fn objects_add_and_subtract_without_wrapping() {
        let a = Objects::mr(10).plus(Objects::qp());
        assert_eq!(a.minus(Objects::mr(20)), Objects::qp());
        assert_eq!(Objects::default().minus(Objects::cq()), Objects::default());
    }
}
