//! Wire-codec benchmarks: ICRC against a plain `crc32fast` baseline, frame and packet parse,
//! frame emit, at several payload sizes and per opcode.
//!
//! Run with `cargo bench -p roce-benches --bench wire`; numbers are in `benches/README.md`.
//! Throughput is counted in bytes of the object processed: the IP packet without its ICRC for
//! the CRCs (what both functions hash), the whole Ethernet frame for parse and emit.
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented items

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roce_benches::wire::{
    frame_repr, opcode_frame, send_only_frame, ETH_IPV4_UDP_LEN, ETH_LEN, OPCODES, PAYLOAD_SIZES,
};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::{Caps, Check, Frame, PacketRepr};

const NO_ICRC: Caps = Caps { icrc: Check::None };

/// ICRC of the IP packet against `crc32fast::hash` over the same bytes (IP header .. pad).
fn icrc_vs_crc32fast(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in PAYLOAD_SIZES {
        let frame = send_only_frame(size);
        let ip = &frame[ETH_LEN..];
        let covered = &ip[..ip.len() - ICRC_LEN];
        g.throughput(Throughput::Bytes(covered.len() as u64));
        g.bench_with_input(BenchmarkId::new("crc32fast", size), covered, |b, bytes| {
            b.iter(|| crc32fast::hash(black_box(bytes)));
        });
        g.bench_with_input(BenchmarkId::new("compute", size), ip, |b, ip| {
            b.iter(|| icrc::compute(black_box(ip)));
        });
        g.bench_with_input(BenchmarkId::new("verify", size), ip, |b, ip| {
            b.iter(|| icrc::verify(black_box(ip)));
        });
    }
    g.finish();
}

/// Parse and emit of RC SEND_ONLY frames by payload size.
fn parse_emit_by_size(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    for size in PAYLOAD_SIZES {
        let frame = send_only_frame(size);
        g.throughput(Throughput::Bytes(frame.len() as u64));
        g.bench_with_input(BenchmarkId::new("parse_icrc", size), &frame, |b, f| {
            b.iter(|| {
                let parsed = Frame::parse_ethernet(black_box(f), &Caps::default()).unwrap();
                parsed.packet().unwrap().payload.len()
            });
        });
        g.bench_with_input(BenchmarkId::new("parse_no_icrc", size), &frame, |b, f| {
            b.iter(|| {
                let parsed = Frame::parse_ethernet(black_box(f), &NO_ICRC).unwrap();
                parsed.packet().unwrap().payload.len()
            });
        });
        let udp_payload = &frame[ETH_IPV4_UDP_LEN..];
        g.bench_with_input(
            BenchmarkId::new("packet_parse", size),
            udp_payload,
            |b, p| {
                b.iter(|| PacketRepr::parse(black_box(p)).unwrap().payload.len());
            },
        );
        let repr = frame_repr();
        let payload = roce_wire::samples::pattern(size);
        let packet = roce_benches::wire::send_only_packet(&payload);
        let mut buf = vec![0u8; repr.buffer_len(&packet)];
        g.bench_function(BenchmarkId::new("emit_icrc", size), |b| {
            b.iter(|| black_box(&repr).emit(black_box(&packet), &mut buf, &Caps::default()));
        });
        g.bench_function(BenchmarkId::new("emit_no_icrc", size), |b| {
            b.iter(|| black_box(&repr).emit(black_box(&packet), &mut buf, &NO_ICRC));
        });
    }
    g.finish();
}

/// Parse (with ICRC) and emit (with ICRC) of the sample frame of a handful of opcodes.
fn parse_emit_by_opcode(c: &mut Criterion) {
    let mut g = c.benchmark_group("opcode");
    for (name, op) in OPCODES {
        let frame = opcode_frame(op);
        g.throughput(Throughput::Bytes(frame.len() as u64));
        g.bench_with_input(BenchmarkId::new("parse", name), &frame, |b, f| {
            b.iter(|| {
                let parsed = Frame::parse_ethernet(black_box(f), &Caps::default()).unwrap();
                parsed.packet().unwrap().opcode()
            });
        });
        let parsed = Frame::parse_ethernet(&frame, &Caps::default()).unwrap();
        let (repr, packet) = (parsed.repr, parsed.packet().unwrap());
        let mut buf = vec![0u8; repr.buffer_len(&packet)];
        g.bench_function(BenchmarkId::new("emit", name), |b| {
            b.iter(|| black_box(&repr).emit(black_box(&packet), &mut buf, &Caps::default()));
        });
        assert_eq!(buf, frame, "{name}: emit reproduces the sample");
    }
    g.finish();
}

fn config() -> Criterion {
    // Short runs: the build machine is small and shared. Override on the command line
    // (`-- --measurement-time 10`) for publication-quality numbers.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = icrc_vs_crc32fast, parse_emit_by_size, parse_emit_by_opcode
}
criterion_main!(benches);
