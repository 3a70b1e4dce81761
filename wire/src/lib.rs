//! # roce-wire: the RoCEv2 wire format
//!
//! Zero-copy views and owned representations of every InfiniBand transport header RoCEv2
//! carries (BTH, RETH, AETH, DETH, ImmDt, IETH, AtomicETH, AtomicAckETH, FETH, the CNP body),
//! the opcode table for RC, UC, UD and CNP, the invariant CRC, whole Ethernet/IP/UDP frames,
//! GIDs, and (with `std`) pcap capture files. No I/O, clock, RNG or allocation in parse/emit.
//!
//! Each header module (`bth`, `reth`, …) follows the smoltcp pattern: a `Packet<T>` view with
//! `new_unchecked`, `new_checked`, `check_len`, getters and `set_*` setters, and a `Repr` with
//! `parse`, `emit` and `buffer_len`. [`PacketRepr`] puts them together for a whole transport
//! packet and [`FrameRepr`]/[`Frame`] for a whole frame.
//!
//! ## Contract
//!
//! - After `check_len` (or `new_checked`) succeeds, the accessors of a view never panic.
//! - `parse` never panics, on any input.
//! - `emit` never panics when its buffer is exactly `buffer_len()` bytes long.
//! - `new_checked` is never used on the emit path (the buffer is sized by `buffer_len`).
//!
//! ## Example: emit a frame, then parse it back
//!
//! ```
//! use core::net::Ipv4Addr;
//! use roce_wire::{bth, frame::*, packet::Ext, Caps, Frame, Opcode, PacketRepr, Psn, Qpn};
//!
//! let packet = PacketRepr::new(
//!     bth::Repr { ack_req: true, ..bth::Repr::new(Opcode::RcSendOnly, Qpn::new(0x12), Psn::new(7)) },
//!     Ext::default(),
//!     b"hello",
//! );
//! let frame = FrameRepr {
//!     eth: Some(EthRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None }),
//!     ip: IpRepr::V4(Ipv4Repr {
//!         src: Ipv4Addr::new(10, 0, 0, 1),
//!         dst: Ipv4Addr::new(10, 0, 0, 2),
//!         tos: 0,
//!         ident: 0,
//!         dont_fragment: true,
//!         ttl: 64,
//!     }),
//!     udp: UdpRepr { src_port: 0xC000, dst_port: ROCEV2_PORT, checksum: 0 },
//! };
//! let mut buf = vec![0; frame.buffer_len(&packet)];
//! frame.emit(&packet, &mut buf, &Caps::default());
//!
//! let parsed = Frame::parse_ethernet(&buf, &Caps::default()).unwrap(); // ICRC verified
//! assert_eq!(parsed.repr, frame);
//! assert_eq!(parsed.packet().unwrap(), packet);
//! assert_eq!(parsed.packet().unwrap().to_string(),
//!            "BTH RC_SEND_ONLY qpn=0x12 psn=7 ack_req pad=3 payload=5");
//! ```
//!
//! # Fuzzing
//!
//! Under `cfg(fuzzing)` the ICRC check ([`icrc::verify`]) always passes, so fuzzers explore the
//! parsers behind it.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;

mod error;
mod macros;
mod types;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cnp;
pub mod deth;
pub mod feth;
pub mod frame;
pub mod gid;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod packet;
#[cfg(feature = "std")]
pub mod pcap;
pub mod reth;
#[cfg(feature = "alloc")]
pub mod samples;

pub use error::{ParseError, Result};
pub use frame::{Frame, FrameRepr};
pub use gid::Gid;
pub use opcode::{Opcode, OpcodeInfo};
pub use packet::{Ext, PacketRepr};
pub use types::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};

/// Which directions compute or verify the ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Check {
    /// Compute on transmit and verify on receive.
    #[default]
    Both,
    /// Verify on receive only.
    Rx,
    /// Compute on transmit only.
    Tx,
    /// Neither.
    None,
}

impl Check {
    /// Verify on receive.
    pub const fn rx(self) -> bool {
        matches!(self, Self::Both | Self::Rx)
    }
    /// Compute on transmit.
    pub const fn tx(self) -> bool {
        matches!(self, Self::Both | Self::Tx)
    }
}

/// Capabilities of a parse or emit: what the caller wants checked or computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Caps {
    /// The ICRC.
    pub icrc: Check,
}
