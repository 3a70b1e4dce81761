//! A fuzzer for the `roce-fuzz` targets that needs neither nightly nor libFuzzer.
//!
//! It loads the seed corpus (rxe captures + `roce_wire::samples`, see `roce_fuzz::seeds`),
//! then, for a bounded time per target, picks a seed input, applies a few random mutations
//! (bit flips, byte sets, truncation, extension, splices of two inputs, length-field and opcode
//! tweaks, and an ICRC fix-up so the checked path is reached without `cfg(fuzzing)`) and runs
//! the target under `catch_unwind`. There is no coverage feedback: it is a smoke fuzzer that
//! any CI machine can run.
//!
//! Every iteration draws from its own RNG, seeded by `(seed, iteration)`, so a failure prints
//! the input as hex and the exact command that replays it.
//!
//! ```text
//! cargo run --release -- --seconds 30                     # both targets, 30 s each
//! cargo run --release -- --target wire_parse --seconds 5 --seed 7
//! cargo run --release -- --target wire_roundtrip --seed 7 --iteration 123456  # replay one
//! cargo run --release -- --target wire_parse --input 0011aabb…                # replay hex
//! cargo run --release -- --write-corpus ../corpus                  # seed cargo-fuzz corpora
//! ```
//!
//! Exit status: 0 when no target panicked, 1 on a panic (a bug), 2 on bad arguments.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_fuzz::{qp_requester, qp_responder, seeds, wire_parse, wire_roundtrip};

/// A fuzz target: its name and body.
#[derive(Clone, Copy)]
struct Target {
    name: &'static str,
    run: fn(&[u8]),
}

const TARGETS: [Target; 4] = [
    Target {
        name: "wire_parse",
        run: wire_parse,
    },
    Target {
        name: "wire_roundtrip",
        run: wire_roundtrip,
    },
    Target {
        name: "qp_responder",
        run: qp_responder,
    },
    Target {
        name: "qp_requester",
        run: qp_requester,
    },
];

/// Longest input the mutator produces (a jumbo frame).
const MAX_LEN: usize = 9_216;

const USAGE: &str =
    "usage: roce-fuzz-stable [--target wire_parse|wire_roundtrip|qp_responder|qp_requester|all] \
[--seconds N] [--seed N] [--iteration N] [--input HEX] [--write-corpus DIR]";

struct Args {
    targets: Vec<Target>,
    seconds: u64,
    seed: u64,
    iteration: Option<u64>,
    input: Option<Vec<u8>>,
    write_corpus: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let captures = seeds::captures_dir();
    let (corpus, from_captures) = seeds::corpus(&captures);
    if let Some(dir) = &args.write_corpus {
        return write_corpus(dir, &corpus);
    }
    if let Some(input) = &args.input {
        let mut ok = true;
        for t in &args.targets {
            ok &= run_one(t.name, t.run, input, None);
        }
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    eprintln!(
        "seed corpus: {} inputs ({from_captures} capture frames from {}, plus samples)",
        corpus.len(),
        captures.display()
    );
    if corpus.is_empty() {
        eprintln!("no seeds");
        return ExitCode::from(2);
    }
    // Panics are reported by `run_one`; keep the default hook's message but only once.
    let mut failed = false;
    for &Target { name, run: target } in &args.targets {
        // Every seed unmutated first: a regression there is the cheapest to read.
        for input in &corpus {
            if !run_one(name, target, input, None) {
                return ExitCode::FAILURE;
            }
        }
        let start = Instant::now();
        let budget = Duration::from_secs(args.seconds);
        let (first, last) = match args.iteration {
            Some(i) => (i, i + 1),
            None => (0, u64::MAX),
        };
        let mut iterations = 0u64;
        let mut input = Vec::with_capacity(MAX_LEN);
        for iteration in first..last {
            if args.iteration.is_none() && iterations % 256 == 0 && start.elapsed() >= budget {
                break;
            }
            let mut rng = Rng::new(args.seed, iteration);
            mutate(&mut rng, &corpus, &mut input);
            iterations += 1;
            if !run_one(name, target, &input, Some((args.seed, iteration))) {
                failed = true;
                break;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{name}: {iterations} iterations in {secs:.1} s = {:.0} iterations/s (seed {})",
            iterations as f64 / secs.max(1e-9),
            args.seed
        );
        if failed {
            break;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs `target` on `input`; on a panic prints how to replay it and returns `false`.
fn run_one(name: &str, target: fn(&[u8]), input: &[u8], origin: Option<(u64, u64)>) -> bool {
    if panic::catch_unwind(AssertUnwindSafe(|| target(input))).is_ok() {
        return true;
    }
    eprintln!("\n=== {name} PANICKED on a {}-byte input", input.len());
    eprintln!("input hex: {}", hex(input));
    match origin {
        Some((seed, iteration)) => eprintln!(
            "replay: cargo run --release -- --target {name} --seed {seed} --iteration {iteration}"
        ),
        None => eprintln!("(an unmutated seed input)"),
    }
    eprintln!("replay: cargo run --release -- --target {name} --input <hex above>");
    false
}

fn write_corpus(dir: &std::path::Path, corpus: &[Vec<u8>]) -> ExitCode {
    for t in TARGETS {
        let sub = dir.join(t.name);
        if let Err(e) = std::fs::create_dir_all(&sub) {
            eprintln!("{}: {e}", sub.display());
            return ExitCode::from(2);
        }
        for (i, input) in corpus.iter().enumerate() {
            let path = sub.join(format!("seed-{i:04}"));
            if let Err(e) = std::fs::write(&path, input) {
                eprintln!("{}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    println!(
        "wrote {} seeds per target under {}",
        corpus.len(),
        dir.display()
    );
    ExitCode::SUCCESS
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        targets: TARGETS.to_vec(),
        seconds: 10,
        seed: 0x5EED,
        iteration: None,
        input: None,
        write_corpus: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => {
                let v = value()?;
                if v != "all" {
                    args.targets = TARGETS.iter().copied().filter(|t| t.name == v).collect();
                    if args.targets.is_empty() {
                        return Err(format!("unknown target {v}"));
                    }
                }
            }
            "--seconds" => args.seconds = number(&value()?)?,
            "--seed" => args.seed = number(&value()?)?,
            "--iteration" => args.iteration = Some(number(&value()?)?),
            "--input" => args.input = Some(unhex(&value()?)?),
            "--write-corpus" => args.write_corpus = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn number(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("{s}: {e}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if s.len() % 2 != 0 {
        return Err("odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

/// SplitMix64: tiny, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, iteration: u64) -> Self {
        let mut r = Self(seed ^ iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Values that often sit on a boundary.
const INTERESTING_U8: [u8; 8] = [0x00, 0x01, 0x03, 0x7F, 0x80, 0xC0, 0xF0, 0xFF];

/// Offsets of 16-bit length fields and of the BTH, for an Ethernet frame and for a raw IP
/// packet, IPv4 and IPv6, with and without a VLAN tag. The mutator does not parse: it pokes
/// at all plausible places and lets the targets sort it out.
const LENGTH_FIELDS: [usize; 9] = [
    14 + 2,      // IPv4 total length (Ethernet)
    14 + 20 + 4, // UDP length (Ethernet, IPv4)
    14 + 4,      // IPv6 payload length (Ethernet)
    14 + 40 + 4, // UDP length (Ethernet, IPv6)
    18 + 2,      // IPv4 total length (VLAN)
    18 + 20 + 4, // UDP length (VLAN, IPv4)
    2,           // IPv4 total length (raw IP)
    20 + 4,      // UDP length (raw IPv4)
    4,           // IPv6 payload length (raw IP)
];
const BTH_OFFSETS: [usize; 6] = [42, 46, 62, 28, 48, 0];

/// Replaces `out` with a mutation of a random corpus entry.
fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&corpus[rng.below(corpus.len())]);
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        match rng.below(12) {
            0 | 1 => {
                // Bit flip.
                if !out.is_empty() {
                    let i = rng.below(out.len());
                    out[i] ^= 1 << rng.below(8);
                }
            }
            2 => {
                // Random or interesting byte.
                if !out.is_empty() {
                    let i = rng.below(out.len());
                    out[i] = if rng.chance(2) {
                        rng.byte()
                    } else {
                        INTERESTING_U8[rng.below(INTERESTING_U8.len())]
                    };
                }
            }
            3 => {
                // Truncate.
                let n = rng.below(out.len() + 1);
                out.truncate(n);
            }
            4 => {
                // Extend with random bytes or zeros.
                let n = 1 + rng.below(64);
                let zero = rng.chance(2);
                for _ in 0..n {
                    let b = if zero { 0 } else { rng.byte() };
                    out.push(b);
                }
            }
            5 => {
                // Splice: our head, another input's tail.
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(out.len() + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            6 | 7 => {
                // Length field: small delta, extreme, or consistent with the input.
                let at = LENGTH_FIELDS[rng.below(LENGTH_FIELDS.len())];
                if at + 2 <= out.len() {
                    let cur = u16::from_be_bytes([out[at], out[at + 1]]);
                    let v = match rng.below(4) {
                        0 => cur.wrapping_add(1 + rng.below(8) as u16),
                        1 => cur.wrapping_sub(1 + rng.below(8) as u16),
                        2 => [0, 1, 0x7FFF, 0xFFFF][rng.below(4)],
                        _ => (out.len() - at + 2) as u16,
                    };
                    out[at..at + 2].copy_from_slice(&v.to_be_bytes());
                }
            }
            8 => {
                // BTH opcode or flags byte (SE/M/PadCnt/TVer).
                let bth = BTH_OFFSETS[rng.below(BTH_OFFSETS.len())];
                let at = bth + rng.below(2);
                if at < out.len() {
                    out[at] = rng.byte();
                }
            }
            9 => {
                // Delete a range.
                if !out.is_empty() {
                    let a = rng.below(out.len());
                    let b = (a + 1 + rng.below(16)).min(out.len());
                    out.drain(a..b);
                }
            }
            10 => {
                // Duplicate a range (grows extension-header regions).
                if !out.is_empty() {
                    let a = rng.below(out.len());
                    let b = (a + 1 + rng.below(16)).min(out.len());
                    let chunk = out[a..b].to_vec();
                    let at = rng.below(out.len() + 1);
                    out.splice(at..at, chunk);
                }
            }
            _ => {
                // Round the length to a multiple of 4 after the headers (RoCE packets are).
                let n = out.len() - out.len() % 4;
                out.truncate(n);
            }
        }
    }
    out.truncate(MAX_LEN);
    if rng.chance(2) {
        fix_icrc(out);
    }
}

/// If `data` parses as a frame (Ethernet or raw IP) with the ICRC ignored, rewrites its ICRC
/// so that the checked parse path accepts it too.
fn fix_icrc(data: &mut [u8]) {
    use roce_wire::icrc::{compute, ICRC_LEN};
    use roce_wire::{Caps, Check, Frame};
    let none = Caps { icrc: Check::None };
    let (start, len) = if let Ok(f) = Frame::parse_ethernet(data, &none) {
        (
            f.ip_packet.as_ptr() as usize - data.as_ptr() as usize,
            f.ip_packet.len(),
        )
    } else if let Ok(f) = Frame::parse_ip(data, &none) {
        (0, f.ip_packet.len())
    } else {
        return;
    };
    let ip = &mut data[start..start + len];
    if let Some(crc) = compute(ip) {
        ip[len - ICRC_LEN..].copy_from_slice(&crc);
    }
}
