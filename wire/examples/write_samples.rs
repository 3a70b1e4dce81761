//! Writes `roce_wire::samples::all()` to a pcap file: `cargo run -p roce-wire --example
//! write_samples -- OUT.pcap`.

use std::time::Duration;

fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "samples.pcap".into());
    let mut w = roce_wire::pcap::PcapWriter::new(std::fs::File::create(&path)?)?;
    for (i, (_, frame)) in roce_wire::samples::all().into_iter().enumerate() {
        w.write_frame(Duration::from_micros(1_000_000 + i as u64), &frame)?;
    }
    println!("wrote {path}");
    Ok(())
}
