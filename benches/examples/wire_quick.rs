//! Noise-resistant companion to `benches/wire.rs`: the minimum over 200 batches of the time per
//! call, for the same fixtures. On a loaded shared machine the minimum is far more repeatable
//! than criterion's mean (which measures the neighbours' builds too).
//!
//! `cargo run --release -p roce-benches --example wire_quick`

use std::hint::black_box;
use std::time::Instant;

use roce_benches::wire::{
    frame_repr, opcode_frame, send_only_frame, send_only_packet, ETH_IPV4_UDP_LEN, ETH_LEN,
    OPCODES, PAYLOAD_SIZES,
};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::{samples, Caps, Check, Frame, PacketRepr};

const NO_ICRC: Caps = Caps { icrc: Check::None };

/// Minimum ns per call over 200 batches of 2 000 calls.
fn best(mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..2_000 {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / 2_000.0);
    }
    best
}

fn row(name: &str, bytes: usize, ns: f64) {
    println!("{name:40} {ns:9.1} ns {:7.2} GB/s", bytes as f64 / ns);
}

fn main() {
    println!("# ICRC vs crc32fast (bytes = IP packet without ICRC)");
    for size in PAYLOAD_SIZES {
        let frame = send_only_frame(size);
        let ip = &frame[ETH_LEN..];
        let covered = &ip[..ip.len() - ICRC_LEN];
        let base = best(|| {
            black_box(crc32fast::hash(black_box(covered)));
        });
        let ours = best(|| {
            black_box(icrc::compute(black_box(ip)));
        });
        row(&format!("crc32fast/{size}"), covered.len(), base);
        row(&format!("icrc::compute/{size}"), covered.len(), ours);
        println!(
            "{:40} icrc speed / crc32fast speed = {:.3}",
            "",
            base / ours
        );
    }
    println!("# parse / emit, RC SEND_ONLY (bytes = Ethernet frame)");
    for size in PAYLOAD_SIZES {
        let frame = send_only_frame(size);
        let n = frame.len();
        let parse = |caps: Caps| {
            best(|| {
                let f = Frame::parse_ethernet(black_box(&frame), &caps).unwrap();
                black_box(f.packet().unwrap());
            })
        };
        row(
            &format!("frame/parse_icrc/{size}"),
            n,
            parse(Caps::default()),
        );
        row(&format!("frame/parse_no_icrc/{size}"), n, parse(NO_ICRC));
        let udp = &frame[ETH_IPV4_UDP_LEN..];
        let ns = best(|| {
            black_box(PacketRepr::parse(black_box(udp)).unwrap());
        });
        row(&format!("frame/packet_parse/{size}"), n, ns);
        let payload = samples::pattern(size);
        let packet = send_only_packet(&payload);
        let repr = frame_repr();
        let mut buf = vec![0u8; repr.buffer_len(&packet)];
        for (label, caps) in [("emit_icrc", Caps::default()), ("emit_no_icrc", NO_ICRC)] {
            let ns = best(|| black_box(&repr).emit(black_box(&packet), &mut buf, &caps));
            row(&format!("frame/{label}/{size}"), n, ns);
        }
    }
    println!("# per opcode (sample frames, ICRC on)");
    for (name, op) in OPCODES {
        let frame = opcode_frame(op);
        let n = frame.len();
        let ns = best(|| {
            let f = Frame::parse_ethernet(black_box(&frame), &Caps::default()).unwrap();
            black_box(f.packet().unwrap());
        });
        row(&format!("opcode/parse/{name} ({n} B)"), n, ns);
        let parsed = Frame::parse_ethernet(&frame, &Caps::default()).unwrap();
        let (repr, packet) = (parsed.repr, parsed.packet().unwrap());
        let mut buf = vec![0u8; n];
        let ns = best(|| black_box(&repr).emit(black_box(&packet), &mut buf, &Caps::default()));
        row(&format!("opcode/emit/{name} ({n} B)"), n, ns);
    }
}
