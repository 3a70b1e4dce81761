//! # roce-transport: the software RoCEv2 NIC
//!
//! The layer that turns the codec (`roce-wire`), the key tables (`roce-mr`) and the sans-IO
//! queue pairs (`roce-qp`) into a working RDMA device:
//!
//! - [`datapath`]: how datagrams leave and enter the host: kernel UDP sockets (`udp`, no
//!   privileges), whole Ethernet frames (`raw`, `CAP_NET_RAW`) or an in-memory network with
//!   faults (`sim`); [`datapath::fault::FaultInjector`] adds seeded faults in front of any
//!   of them;
//! - the engine (private): receives, demultiplexes by QPN, runs the state machines, fires
//!   timers and sends in batches, on a thread per engine or under the application's
//!   progress calls. A device runs one engine, or several ([`DeviceConfig::engines`]: one
//!   socket, lock and thread each, every QP on one of them, the kernel steering datagrams to
//!   their QP's engine). Its logic is a sans-IO core (datagrams and time in; datagrams,
//!   completions, events and the next deadline out) around which the threaded and the
//!   application-driven loops are thin shells; the time it reads comes from an injected
//!   [`clock::Clock`], so a `sim` scenario on a [`clock::VirtualClock`] replays from its seed;
//! - the public API, shaped like verbs: [`Device`] (`ibv_context`), [`ProtectionDomain`],
//!   [`MemoryRegion`], [`CompletionQueue`] with a completion channel, [`SharedReceiveQueue`],
//!   [`QueuePair`]; work requests and completions are `roce-qp`'s, re-exported here;
//! - capture of every frame to pcap ([`DeviceConfig::pcap`], `ROCECTL_PCAP`), and
//!   [`Counters`].
//!
//! There is no global state: open as many devices in one process as you like.
//!
//! ## Example: two devices, one RDMA WRITE, one completion
//!
//! ```
//! use std::time::Duration;
//! use roce_transport::{
//!     Access, ConnectOptions, Device, DeviceConfig, QpInit, QpType, RemoteQp, SendOp, SendWr,
//!     SimNetwork, WcStatus,
//! };
//!
//! // Two devices on an in-memory network (swap in `DeviceConfig::udp(ip)` for real sockets).
//! let net = SimNetwork::perfect();
//! let a = Device::open(DeviceConfig::sim(&net, "10.0.0.1".parse().unwrap())).unwrap();
//! let b = Device::open(DeviceConfig::sim(&net, "10.0.0.2".parse().unwrap())).unwrap();
//!
//! let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
//! let (cq_a, cq_b) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
//! let qp_a = pd_a.create_qp(&QpInit::new(QpType::Rc, &cq_a)).unwrap();
//! let qp_b = pd_b.create_qp(&QpInit::new(QpType::Rc, &cq_b)).unwrap();
//!
//! // The out-of-band exchange, done by hand: each side learns the other's QPN, PSN and GID.
//! // Between processes, ship `qp.endpoint(psn)` in one of `RemoteQp`'s serialised forms
//! // (serde, 24 bytes, or rc_pingpong's text): see `examples/rdma_write.rs`.
//! let opts = ConnectOptions::default();
//! qp_a.connect(&RemoteQp { qpn: qp_b.qpn(), psn: opts.local_psn, gid: b.local_gid() }, &opts).unwrap();
//! qp_b.connect(&RemoteQp { qpn: qp_a.qpn(), psn: opts.local_psn, gid: a.local_gid() }, &opts).unwrap();
//!
//! let src = pd_a.register(b"hello, rdma".to_vec(), Access::LOCAL_WRITE).unwrap();
//! let dst = pd_b.register(vec![0u8; 11], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! let op = SendOp::RdmaWrite { remote_addr: dst.addr(), rkey: dst.rkey() };
//! qp_a.post_send(SendWr::new(1, op, vec![src.sge(0, 11)])).unwrap();
//!
//! let mut wc = [roce_transport::Completion::EMPTY; 1];
//! assert_eq!(cq_a.wait(&mut wc, Duration::from_secs(5)), 1);
//! assert_eq!(wc[0].status, WcStatus::Success);
//! assert_eq!(dst.to_vec(), b"hello, rdma");
//! ```

mod capture;
pub mod clock;
pub mod control;
mod counters;
mod cq;
mod device;
mod endpoint;
mod engine;
mod error;
mod ids;
mod inbox;
mod sys;
mod verbs;

pub mod datapath;
pub mod netdev;
pub mod portowner;
#[cfg(feature = "selftest")]
pub mod selftest;

pub use capture::CaptureFile;
pub use counters::{Counters, DeviceCounters};
pub use cq::AsyncEvent;
pub use datapath::sim::{LinkConfig, SimNetwork, SimStats};
pub use device::{
    Backend, Device, DeviceAttr, DeviceCapFlagsEx, DeviceConfig, PortAttr, PortState, Progress,
    MAX_ENGINES,
};
pub use error::{OpenError, VerbsError};
pub use netdev::{GidEntry, GidType};
pub use roce_mr::{unmapped_accesses, unmapped_guard_on_top, Access, AccessError, RegisterError};
pub use roce_qp::state::{AttrMask, ModifyError, QpAttr};
pub use roce_qp::verbs::{
    AddressHandle, Completion, FlushLevel, FlushPlacement, Mtu, QpState, QpType, RecvWr, SendData,
    SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus,
};
pub use roce_qp::{Event, PostError, QpConfig, QpStats};
pub use roce_wire::{Gid, LKey, Psn, QKey, Qpn, RKey};
pub use verbs::{
    CompletionQueue, ConnectOptions, MemoryRegion, ProtectionDomain, QpInit, QueuePair, RemoteQp,
    RemoteQpParseError, SharedReceiveQueue,
};
