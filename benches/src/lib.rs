//! # roce-benches: rocectl benchmarks
//!
//! Two kinds of benchmarks live here:
//!
//! - criterion micro-benchmarks of the wire codec (`benches/wire.rs`: ICRC vs crc32fast, parse
//!   and emit), with their fixtures in [`wire`];
//! - issue 7's side-by-side run: rocectl's figures next to **the limit** ([`blaster`]: raw UDP
//!   at the same datagram sizes, plain / `sendmmsg` / GSO-GRO, and a 64-byte ping-pong) and
//!   next to **the peers** ([`peers`]: libfabric `udp;ofi_rxd` and UCX over TCP), over
//!   loopback and a veth pair between two namespaces ([`netns`]), driven by [`runner`].
//!
//! ```text
//! cargo bench -p roce-benches --bench wire                          # codec micro-benchmarks
//! cargo run -p roce-benches --release --bin blaster -- sweep        # the limit alone
//! benches/run.sh                                                    # everything, ~5 min
//! ```
//!
//! See `benches/README.md` for the measured numbers.
//!
//! ```
//! use roce_benches::blaster::datagram_len;
//! use roce_benches::wire::{send_only_frame, ETH_IPV4_UDP_LEN};
//! use roce_wire::{Caps, Frame};
//!
//! let frame = send_only_frame(1024);
//! assert_eq!(frame.len(), ETH_IPV4_UDP_LEN + 12 + 1024 + 4);
//! let parsed = Frame::parse_ethernet(&frame, &Caps::default()).unwrap();
//! assert_eq!(parsed.packet().unwrap().payload.len(), 1024);
//! // The blaster sends UDP payloads of exactly that RoCE packet's size.
//! assert_eq!(datagram_len(1024), frame.len() - ETH_IPV4_UDP_LEN);
//! ```

pub mod blaster;
pub mod netns;
pub mod peers;
pub mod runner;
pub mod stats;

pub mod wire {
    //! Fixtures for the wire-codec benches: IPv4 RC frames with payloads of chosen sizes.

    use roce_wire::{bth, samples, Ext, FrameRepr, Opcode, PacketRepr, Psn, Qpn};

    /// Payload sizes the wire benches sweep (the smallest and the two largest RoCE path MTUs
    /// worth of data; 256 is covered by the per-opcode FIRST samples).
    pub const PAYLOAD_SIZES: [usize; 3] = [64, 1_024, 4_096];

    /// Length of the Ethernet + IPv4 + UDP headers of [`samples::ipv4_frame`].
    pub const ETH_IPV4_UDP_LEN: usize = 14 + 20 + 8;

    /// Length of the Ethernet header (the IP packet starts here).
    pub const ETH_LEN: usize = 14;

    /// Opcodes the per-opcode benches cover, with a short label.
    pub const OPCODES: [(&str, Opcode); 6] = [
        ("rc_send_only", Opcode::RcSendOnly),
        ("rc_write_first_reth", Opcode::RcRdmaWriteFirst),
        ("rc_read_response_first", Opcode::RcRdmaReadResponseFirst),
        ("rc_ack", Opcode::RcAcknowledge),
        ("rc_compare_swap", Opcode::RcCompareSwap),
        ("ud_send_only", Opcode::UdSendOnly),
    ];

    /// An RC SEND_ONLY packet (ack_req set) carrying `payload`.
    pub fn send_only_packet(payload: &[u8]) -> PacketRepr<'_> {
        let mut b = bth::Repr::new(Opcode::RcSendOnly, Qpn::new(0x11), Psn::new(0x00AB_CDEF));
        b.ack_req = true;
        PacketRepr::new(b, Ext::default(), payload)
    }

    /// The layer 2-4 headers every fixture uses (IPv4, no VLAN).
    pub fn frame_repr() -> FrameRepr {
        samples::ipv4_frame()
    }

    /// A whole Ethernet frame (with a correct ICRC) of an RC SEND_ONLY with `payload_len`
    /// bytes of patterned payload.
    pub fn send_only_frame(payload_len: usize) -> Vec<u8> {
        let payload = samples::pattern(payload_len);
        samples::emit(&frame_repr(), &send_only_packet(&payload))
    }

    /// The sample frame of `op` (see [`samples::packet_for`]: 256-byte payloads for
    /// FIRST/MIDDLE, 61 bytes for other data packets, none for ACKs and atomics).
    pub fn opcode_frame(op: Opcode) -> Vec<u8> {
        let payload = samples::pattern(samples::SAMPLE_PMTU);
        samples::emit(&frame_repr(), &samples::packet_for(op, &payload))
    }
}
