//! The correctness matrix of issue 15 ("What must show that it works"): every algorithm ×
//! {2, 3, 4, 5} ranks × sizes {0, 1 element, 4 KiB + 1 element, 1 MiB, 64 MiB} × every
//! type/op pair, every collective in place and out of place, with 0 wrong — lossless and at
//! 1 % and 10 % packet loss.
//!
//! # How it runs
//!
//! Ranks are threads of this process, each with its own device on one in-memory
//! [`SimNetwork`] (a `sim` device through [`DeviceChoice::Config`]), bootstrapped through a TCP
//! store on loopback. One communicator serves a whole (algorithm, ranks, loss) cell: every
//! case of the cell runs on it in the same order on every rank. A lossy cell's network drops
//! each datagram independently with probability 1 % or 10 % (`LinkConfig::loss`), so every
//! retransmission path of the RC transport underneath is exercised.
//!
//! "Algorithms" are the communicator's: [`Algorithm::Ring`], [`Algorithm::HalvingDoubling`],
//! [`Algorithm::RecursiveDoubling`], [`Algorithm::Auto`] (which takes the small-message
//! algorithms — recursive doubling, direct reduce-scatter/allgather, tree broadcast and
//! reduce — up to 64 KiB and the rings above) and the deterministic mode
//! (`deterministic: true`). With an explicit algorithm only allreduce changes (reduce-scatter,
//! allgather, broadcast and reduce take their ring forms), so the data-movement collectives
//! and reduce run in the Ring, Auto and deterministic cells, and the HalvingDoubling and
//! RecursiveDoubling cells run allreduce only.
//!
//! # Exact inputs
//!
//! Every input is a small integer chosen so that every result is exact in every type, in any
//! reduction order: sum, min, max and avg take values in −4..=4 (0..=8 unsigned), so sums stay
//! within ±20 (0..=40); prod takes values in {−2, −1, 1, 2} ({1, 2} unsigned), so products
//! stay within ±32 — exact in i8 and u8, and in f16 (11-bit significand) and bf16 (8-bit)
//! too. Bitwise operators take random bits of the whole width. avg is the exact sum divided
//! once by the rank count in the type's own arithmetic (integer division; for f16/bf16 an
//! f32 division rounded once), the definition of `reduce::finish`. No tolerance is needed
//! anywhere: results are compared bit for bit, so "all ranks hold the same bits" is checked
//! too. Values are a hash of (rank, element index, operator), so a block at a wrong offset
//! cannot pass by coincidence.
//!
//! Sizes are total buffer bytes, as nccl-tests' `size` column: allreduce, broadcast and reduce
//! move `size`; reduce-scatter reads `size` and leaves `size / n` per rank; allgather leaves
//! `size` made of `size / n` per rank (rounded up to at least one element when the size is
//! not 0). Broadcast has no out-of-place form in this API, and reduce no in-place one (its
//! `send` and `recv` are distinct slices), so each runs in its one form; roots rotate over
//! the ranks.
//!
//! # What runs (the budget)
//!
//! The whole matrix must fit CI's budget on a 2-core machine, so not every cell runs every
//! type/op pair at every size; [`plan`] is the exact list (each cell prints its case count,
//! wrong count and time). "Every pair" is the 68 the library defines: 10 types ×
//! sum/prod/min/max/avg, and the 6 integer types × band/bor/bxor.
//!
//! - **Lossless cells** (5 algorithms × 4 rank counts):
//!   - 0, 1 element and 4 KiB + 1 element: every pair for each reducing collective in each
//!     form (allreduce out of place and in place, reduce-scatter out of place and in place,
//!     reduce); allgather in both forms and broadcast once each (they move bytes);
//!   - 1 MiB: the same (every pair for each reducing collective and form, data movement once
//!     each);
//!   - 64 MiB: allreduce out of place and in place once each per cell, the type/op pair
//!     depending on the rank count (2: f64 sum, i64 bxor; 3: f32 min, u32 prod; 4: i64 avg,
//!     f16 sum; 5: u64 max, f64 prod); the Ring cells also run reduce-scatter (i32 max),
//!     allgather, broadcast and reduce (bf16 prod) once at 64 MiB.
//! - **1 % loss cells**: up to 4 KiB + 1 element, one pair per type for each reducing
//!   collective and form, data movement once each; at 1 MiB one pair per collective and form.
//! - **10 % loss cells**: one case per collective and form at 0, 1 element and 4 KiB + 1
//!   element (the pair rotating over all 68), and a 1 MiB allreduce in each form. At 10 % loss a
//!   1 MiB operation takes seconds here (each tail loss waits out a 67 ms ACK timeout) and a
//!   64 MiB one minutes, so the lossy cells have no 64 MiB case; the loss paths do not depend
//!   on the size beyond a few chunks.
//!
//! Every rank keeps its communicator until every rank of the cell is through. (Dropping it
//! right after the last operation is safe too since the closing handshake: see
//! `tests/teardown.rs`, which took over this file's repro of the teardown problem — a peer
//! timing out in 'allreduce: unfold' at 10 % loss.)
//!
//! Run alone: `cargo test --release -p roce-collectives --test matrix -- --nocapture`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use roce_collectives::{
    Algorithm, Bootstrap, CollError, CommOptions, Communicator, DataType, DeviceChoice, ReduceOp,
};
use roce_transport::{DeviceConfig, LinkConfig, SimNetwork};

/// The allreduce algorithm of a cell, or the deterministic mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Ring,
    HalvingDoubling,
    RecursiveDoubling,
    Auto,
    Deterministic,
}

const ALGOS: [Algo; 5] = [
    Algo::Ring,
    Algo::HalvingDoubling,
    Algo::RecursiveDoubling,
    Algo::Auto,
    Algo::Deterministic,
];

/// Buffer sizes in bytes (`ONE_ELEMENT` and `PAGE_PLUS_ONE` depend on the type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    Zero,
    OneElement,
    PagePlusOne,
    OneMib,
    SixtyFourMib,
}

impl Size {
    /// Elements of `dt` in a buffer of this size.
    fn count(self, dt: DataType) -> usize {
        match self {
            Self::Zero => 0,
            Self::OneElement => 1,
            Self::PagePlusOne => 4096 / dt.size() + 1,
            Self::OneMib => (1 << 20) / dt.size(),
            Self::SixtyFourMib => (64 << 20) / dt.size(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    Allreduce { in_place: bool },
    ReduceScatter { in_place: bool },
    Allgather { in_place: bool },
    Broadcast,
    Reduce,
}

impl Coll {
    fn reduces(self) -> bool {
        !matches!(self, Self::Allgather { .. } | Self::Broadcast)
    }
}

/// Every collective in every form the API has.
const COLLS: [Coll; 7] = [
    Coll::Allreduce { in_place: false },
    Coll::Allreduce { in_place: true },
    Coll::ReduceScatter { in_place: false },
    Coll::ReduceScatter { in_place: true },
    Coll::Allgather { in_place: false },
    Coll::Allgather { in_place: true },
    Coll::Broadcast,
];

#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    size: Size,
    root: usize,
}

/// Every type/op pair the library defines (bitwise operators on integers only).
fn all_pairs() -> Vec<(DataType, ReduceOp)> {
    let mut v = Vec::new();
    for dt in DataType::ALL {
        for op in ReduceOp::ALL {
            if dt.supports(op) {
                v.push((dt, op));
            }
        }
    }
    v
}

/// One pair per type, the operator rotating with `turn` over the ones the type supports.
fn pair_per_type(turn: usize) -> Vec<(DataType, ReduceOp)> {
    DataType::ALL
        .iter()
        .enumerate()
        .map(|(k, &dt)| {
            let ops: Vec<ReduceOp> = ReduceOp::ALL
                .into_iter()
                .filter(|o| dt.supports(*o))
                .collect();
            (dt, ops[(k + turn) % ops.len()])
        })
        .collect()
}

/// Which type/op pairs a (size, collective) runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// All 68.
    Every,
    /// One per type, the operator rotating.
    PerType,
    /// One, rotating over all pairs.
    One,
    /// Allreduce only (both forms), one pair each (10 % loss at 1 MiB).
    None,
}

/// The cases of one cell, in the order every rank runs them.
fn plan(algo: Algo, n: usize, loss: f64) -> Vec<Case> {
    let mut cases = Vec::new();
    let allreduce_only = matches!(algo, Algo::HalvingDoubling | Algo::RecursiveDoubling);
    let colls: Vec<Coll> = COLLS
        .into_iter()
        .chain([Coll::Reduce])
        .filter(|c| !allreduce_only || matches!(c, Coll::Allreduce { .. }))
        .collect();
    let mut push = |coll: Coll, dt, op, size| {
        let root = cases.len() % n;
        cases.push(Case {
            coll,
            dt,
            op,
            size,
            root,
        });
    };
    // Data movement does not look at the type: one run per size and form, as bytes.
    let bytes = (DataType::U8, ReduceOp::BXor);
    let every = all_pairs();
    // The pairs a (size, collective) gets: every pair, one per type, or one.
    let pick = |how: Pick, turn: usize| -> Vec<(DataType, ReduceOp)> {
        match how {
            Pick::Every => every.clone(),
            Pick::PerType => pair_per_type(turn),
            Pick::One | Pick::None => vec![every[turn * 7 % every.len()]],
        }
    };
    let sizes: Vec<(Size, Pick, Pick)> = if loss == 0.0 {
        // (size, allreduce out of place, the other reducing collectives and forms)
        vec![
            (Size::Zero, Pick::Every, Pick::Every),
            (Size::OneElement, Pick::Every, Pick::Every),
            (Size::PagePlusOne, Pick::Every, Pick::Every),
            (Size::OneMib, Pick::Every, Pick::Every),
        ]
    } else if loss < 0.05 {
        vec![
            (Size::Zero, Pick::PerType, Pick::PerType),
            (Size::OneElement, Pick::PerType, Pick::PerType),
            (Size::PagePlusOne, Pick::PerType, Pick::PerType),
            (Size::OneMib, Pick::One, Pick::One),
        ]
    } else {
        vec![
            (Size::Zero, Pick::One, Pick::One),
            (Size::OneElement, Pick::One, Pick::One),
            (Size::PagePlusOne, Pick::One, Pick::One),
            (Size::OneMib, Pick::None, Pick::None),
        ]
    };
    for (s, &(size, first, rest)) in sizes.iter().enumerate() {
        for (k, &coll) in colls.iter().enumerate() {
            let how = if coll == (Coll::Allreduce { in_place: false }) {
                first
            } else {
                rest
            };
            if how == Pick::None && !matches!(coll, Coll::Allreduce { .. }) {
                continue;
            }
            let how = if how == Pick::None { Pick::One } else { how };
            if coll.reduces() {
                for (dt, op) in pick(how, s * 3 + k) {
                    push(coll, dt, op, size);
                }
            } else {
                push(coll, bytes.0, bytes.1, size);
            }
        }
    }
    if loss == 0.0 {
        // 64 MiB: both allreduce forms in every cell, the pairs varying with the rank count.
        let big = [
            [
                (DataType::F64, ReduceOp::Sum),
                (DataType::I64, ReduceOp::BXor),
            ],
            [
                (DataType::F32, ReduceOp::Min),
                (DataType::U32, ReduceOp::Prod),
            ],
            [
                (DataType::I64, ReduceOp::Avg),
                (DataType::F16, ReduceOp::Sum),
            ],
            [
                (DataType::U64, ReduceOp::Max),
                (DataType::F64, ReduceOp::Prod),
            ],
        ][n - 2];
        push(
            Coll::Allreduce { in_place: false },
            big[0].0,
            big[0].1,
            Size::SixtyFourMib,
        );
        push(
            Coll::Allreduce { in_place: true },
            big[1].0,
            big[1].1,
            Size::SixtyFourMib,
        );
        if algo == Algo::Ring {
            push(
                Coll::ReduceScatter {
                    in_place: n % 2 == 1,
                },
                DataType::I32,
                ReduceOp::Max,
                Size::SixtyFourMib,
            );
            push(
                Coll::Allgather {
                    in_place: n % 2 == 0,
                },
                bytes.0,
                bytes.1,
                Size::SixtyFourMib,
            );
            push(Coll::Broadcast, bytes.0, bytes.1, Size::SixtyFourMib);
            push(
                Coll::Reduce,
                DataType::Bf16,
                ReduceOp::Prod,
                Size::SixtyFourMib,
            );
        }
    }
    cases
}

// ----- exact inputs and the expected results -----

fn hash(rank: usize, i: usize, salt: u64) -> u64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ salt.wrapping_mul(0x1656_67B1_9E37_79F9);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    x
}

fn signed(dt: DataType) -> bool {
    !matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

fn op_salt(op: ReduceOp) -> u64 {
    ReduceOp::ALL.iter().position(|o| *o == op).unwrap_or(0) as u64 + 1
}

/// Rank `rank`'s element `i` for `op` (see the module docs for the ranges): an integer for
/// the arithmetic operators, raw bits for the bitwise ones.
fn value(dt: DataType, op: ReduceOp, rank: usize, i: usize) -> i64 {
    let h = hash(rank, i, op_salt(op));
    match op {
        ReduceOp::Prod if signed(dt) => [-2, -1, 1, 2][(h % 4) as usize],
        ReduceOp::Prod => [1, 2][(h % 2) as usize],
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => h as i64,
        _ if signed(dt) => (h % 9) as i64 - 4,
        _ => (h % 9) as i64,
    }
}

/// The bytes of `x` as one element of `dt` (integers truncate to the width: bitwise values
/// keep their low bits; the small arithmetic values are exact everywhere).
fn put(dt: DataType, x: i64, out: &mut [u8]) {
    match dt {
        DataType::I8 | DataType::U8 => out[0] = x as u8,
        DataType::I32 | DataType::U32 => out.copy_from_slice(&(x as u32).to_le_bytes()),
        DataType::I64 | DataType::U64 => out.copy_from_slice(&(x as u64).to_le_bytes()),
        DataType::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&(x as f64).to_le_bytes()),
        DataType::F16 => out.copy_from_slice(&f16::from_f64(x as f64).to_le_bytes()),
        DataType::Bf16 => out.copy_from_slice(&bf16::from_f64(x as f64).to_le_bytes()),
    }
}

/// The expected bytes of element `i` reduced over `n` ranks.
fn expected(dt: DataType, op: ReduceOp, n: usize, i: usize, out: &mut [u8]) {
    let vals = (0..n).map(|r| value(dt, op, r, i));
    let x = match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.min().unwrap_or(0),
        ReduceOp::Max => vals.max().unwrap_or(0),
        ReduceOp::BAnd => vals.fold(-1, |a, b| a & b),
        ReduceOp::BOr => vals.fold(0, |a, b| a | b),
        ReduceOp::BXor => vals.fold(0, |a, b| a ^ b),
        ReduceOp::Avg => {
            let s: i64 = vals.sum();
            let q = n as f32;
            match dt {
                DataType::F32 => return out.copy_from_slice(&(s as f32 / q).to_le_bytes()),
                DataType::F64 => return out.copy_from_slice(&(s as f64 / n as f64).to_le_bytes()),
                DataType::F16 => {
                    return out.copy_from_slice(&f16::from_f32(s as f32 / q).to_le_bytes())
                }
                DataType::Bf16 => {
                    return out.copy_from_slice(&bf16::from_f32(s as f32 / q).to_le_bytes())
                }
                // Every integer type: the exact sum fits it; divide in its own arithmetic
                // (truncation toward zero, as i64 division).
                _ => s / n as i64,
            }
        }
    };
    put(dt, x, out);
}

/// Rank `rank`'s `count` elements starting at element index `first`.
fn input(dt: DataType, op: ReduceOp, rank: usize, first: usize, count: usize) -> Vec<u8> {
    let w = dt.size();
    let mut v = vec![0u8; count * w];
    for (k, e) in v.chunks_exact_mut(w).enumerate() {
        put(dt, value(dt, op, rank, first + k), e);
    }
    v
}

/// The expected reduction of elements `0..count`, computed once per case for all ranks of a
/// cell (the first rank to need it computes it; a cell keeps the last two).
#[derive(Default)]
struct Expected(Mutex<HashMap<usize, Arc<Vec<u8>>>>);

impl Expected {
    fn get(&self, idx: usize, dt: DataType, op: ReduceOp, n: usize, count: usize) -> Arc<Vec<u8>> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(v) = map.get(&idx) {
            return v.clone();
        }
        let w = dt.size();
        let mut v = vec![0u8; count * w];
        for (i, e) in v.chunks_exact_mut(w).enumerate() {
            expected(dt, op, n, i, e);
        }
        let v = Arc::new(v);
        map.retain(|k, _| k + 2 > idx);
        map.insert(idx, v.clone());
        v
    }
}

/// Counts the elements of `got` that differ from `want` (element indexes from `first`);
/// notes the first few.
fn check_reduced(
    dt: DataType,
    first: usize,
    got: &[u8],
    want: &[u8],
    what: &str,
    notes: &mut Vec<String>,
) -> usize {
    if got == want {
        return 0;
    }
    let w = dt.size();
    let mut wrong = 0;
    for (k, (e, x)) in got.chunks_exact(w).zip(want.chunks_exact(w)).enumerate() {
        if e != x {
            if wrong < 3 {
                notes.push(format!(
                    "{what}: element {} is {e:02x?}, expected {x:02x?}",
                    first + k
                ));
            }
            wrong += 1;
        }
    }
    wrong.max(usize::from(got.len() != want.len()))
}

/// The bytes rank `rank` contributes to a data-movement collective.
fn bytes_of(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| hash(rank, i, 99) as u8).collect()
}

fn check_bytes(got: &[u8], rank: usize, what: &str, notes: &mut Vec<String>) -> usize {
    let want = bytes_of(rank, got.len());
    if got == want.as_slice() {
        return 0;
    }
    let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    if wrong > 0 {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        notes.push(format!("{what}: {wrong} bytes differ, the first at {at}"));
    }
    wrong
}

/// Runs one case on this rank's communicator; returns the wrong element count (bytes for
/// data movement) and notes the first differences.
fn run_case(
    c: &Communicator,
    idx: usize,
    case: &Case,
    exp: &Expected,
    notes: &mut Vec<String>,
) -> Result<usize, CollError> {
    let (r, n) = (c.rank(), c.size());
    let (dt, op, w) = (case.dt, case.op, case.dt.size());
    let count = case.size.count(dt);
    // Per-rank blocks of reduce-scatter and allgather: at least one element unless empty.
    let block = if count == 0 { 0 } else { count.div_ceil(n) };
    let what = format!("rank {r}/{n} {case:?}");
    Ok(match case.coll {
        Coll::Allreduce { in_place } => {
            let send = input(dt, op, r, 0, count);
            let out = if in_place {
                let mut buf = send;
                c.allreduce_in_place_raw(dt, op, &mut buf)?;
                buf
            } else {
                let mut recv = vec![0xA5u8; count * w];
                c.allreduce_raw(dt, op, &send, &mut recv)?;
                recv
            };
            let want = exp.get(idx, dt, op, n, count);
            check_reduced(dt, 0, &out, &want, &what, notes)
        }
        Coll::ReduceScatter { in_place } => {
            let send = input(dt, op, r, 0, block * n);
            let out = if in_place {
                let mut buf = send;
                c.reduce_scatter_in_place_raw(dt, op, &mut buf)?;
                buf[r * block * w..(r + 1) * block * w].to_vec()
            } else {
                let mut recv = vec![0xA5u8; block * w];
                c.reduce_scatter_raw(dt, op, &send, &mut recv)?;
                recv
            };
            let want = exp.get(idx, dt, op, n, block * n);
            let mine = &want[r * block * w..(r + 1) * block * w];
            check_reduced(dt, r * block, &out, mine, &what, notes)
        }
        Coll::Allgather { in_place } => {
            let len = block * w;
            let mine = bytes_of(r, len);
            let out = if in_place {
                let mut buf = vec![0xA5u8; len * n];
                buf[r * len..(r + 1) * len].copy_from_slice(&mine);
                c.allgather_in_place_raw(&mut buf)?;
                buf
            } else {
                let mut recv = vec![0xA5u8; len * n];
                c.allgather_raw(&mine, &mut recv)?;
                recv
            };
            (0..n)
                .map(|q| check_bytes(&out[q * len..(q + 1) * len], q, &what, notes))
                .sum()
        }
        Coll::Broadcast => {
            let len = count * w;
            let mut buf = if r == case.root {
                bytes_of(case.root, len)
            } else {
                vec![0xA5u8; len]
            };
            c.broadcast_raw(&mut buf, case.root)?;
            check_bytes(&buf, case.root, &what, notes)
        }
        Coll::Reduce => {
            let send = input(dt, op, r, 0, count);
            let mut recv = vec![0xA5u8; count * w];
            c.reduce_raw(dt, op, &send, &mut recv, case.root)?;
            if r == case.root {
                let want = exp.get(idx, dt, op, n, count);
                check_reduced(dt, 0, &recv, &want, &what, notes)
            } else {
                0
            }
        }
    })
}

/// What a cell's rank reports: wrong elements, notes, errors.
#[derive(Default)]
struct RankReport {
    wrong: usize,
    /// Seconds spent per size (index of `Size` in declaration order).
    secs: [f64; 5],
    notes: Vec<String>,
    error: Option<String>,
}

/// Runs one cell: `n` ranks on a fresh sim network losing `loss` of the datagrams.
fn run_cell(algo: Algo, n: usize, loss: f64, seed: u64) -> (Vec<RankReport>, usize, Duration) {
    let cases = Arc::new(plan(algo, n, loss));
    let net = SimNetwork::new(
        LinkConfig {
            loss,
            delay_ns: 0,
            ..LinkConfig::perfect()
        },
        seed,
    );
    let store: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address")
    };
    let opts = CommOptions {
        timeout: Duration::from_secs(120),
        algorithm: match algo {
            Algo::Ring => Algorithm::Ring,
            Algo::HalvingDoubling => Algorithm::HalvingDoubling,
            Algo::RecursiveDoubling => Algorithm::RecursiveDoubling,
            Algo::Auto | Algo::Deterministic => Algorithm::Auto,
        },
        deterministic: algo == Algo::Deterministic,
        device: DeviceChoice::Config(Arc::new(move |r| {
            DeviceConfig::sim(&net, IpAddr::V4(Ipv4Addr::new(10, 9, 0, r as u8 + 1)))
        })),
        ..CommOptions::default()
    };
    let exp = Arc::new(Expected::default());
    let done = Arc::new(std::sync::Barrier::new(n));
    let started = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let (cases, opts, exp) = (cases.clone(), opts.clone(), exp.clone());
            let done = done.clone();
            std::thread::spawn(move || {
                let mut rep = RankReport::default();
                let comm = Communicator::init(
                    Bootstrap::Tcp {
                        addr: store,
                        rank,
                        size: n,
                    },
                    opts,
                );
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let comm = match &comm {
                        Ok(c) => c,
                        Err(e) => {
                            rep.error = Some(format!("init: {e}"));
                            return;
                        }
                    };
                    for (idx, case) in cases.iter().enumerate() {
                        let t = Instant::now();
                        let res = run_case(comm, idx, case, &exp, &mut rep.notes);
                        rep.secs[case.size as usize] += t.elapsed().as_secs_f64();
                        match res {
                            Ok(w) => rep.wrong += w,
                            Err(e) => {
                                rep.error = Some(format!("{case:?}: {e}"));
                                break;
                            }
                        }
                    }
                }));
                if run.is_err() {
                    rep.error = Some("panicked (see above)".into());
                }
                // Keep the communicator (and its device) until every rank is through: a rank
                // that closes its device at once stops retransmitting what a lossy link lost
                // of its last messages (see the module docs).
                done.wait();
                drop(comm);
                rep
            })
        })
        .collect();
    let reports = threads
        .into_iter()
        .map(|t| match t.join() {
            Ok(r) => r,
            Err(_) => RankReport {
                error: Some("the rank's thread panicked".into()),
                ..RankReport::default()
            },
        })
        .collect();
    (reports, cases.len(), started.elapsed())
}

fn run_matrix(loss: f64, seed: u64) {
    let started = Instant::now();
    let mut failures = Vec::new();
    // MATRIX_CELLS=Ring:5,Auto:2 runs only those cells (for measurements).
    let only = std::env::var("MATRIX_CELLS").ok();
    for algo in ALGOS {
        for n in 2..=5 {
            if let Some(o) = &only {
                if !o.split(',').any(|c| c == format!("{algo:?}:{n}")) {
                    continue;
                }
            }
            let (reports, ncases, took) = run_cell(algo, n, loss, seed + n as u64);
            let wrong: usize = reports.iter().map(|r| r.wrong).sum();
            let secs = reports.first().map(|r| r.secs).unwrap_or_default();
            println!(
                "matrix loss {:>4.1}% {algo:?} n={n}: {ncases} cases, {wrong} wrong, {:.1} s \
                 (rank 0 by size: 0 {:.1}, 1 elem {:.1}, 4K+1 {:.1}, 1M {:.1}, 64M {:.1})",
                loss * 100.0,
                took.as_secs_f64(),
                secs[0],
                secs[1],
                secs[2],
                secs[3],
                secs[4]
            );
            for (r, rep) in reports.iter().enumerate() {
                if let Some(e) = &rep.error {
                    failures.push(format!("{algo:?} n={n} rank {r}: error {e}"));
                }
                if rep.wrong > 0 {
                    failures.push(format!(
                        "{algo:?} n={n} rank {r}: {} wrong; {}",
                        rep.wrong,
                        rep.notes.join("; ")
                    ));
                }
            }
        }
    }
    println!(
        "matrix loss {:.1}%: done in {:.1} s",
        loss * 100.0,
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn matrix_lossless() {
    run_matrix(0.0, 1);
}

#[test]
fn matrix_one_percent_loss() {
    run_matrix(0.01, 100);
}

#[test]
fn matrix_ten_percent_loss() {
    run_matrix(0.10, 200);
}

#[test]
fn the_inputs_make_every_result_exact() {
    // The claims of the module docs, checked on the values themselves: every arithmetic
    // result over up to 5 ranks is a small integer exactly representable in every type.
    for (dt, op) in all_pairs() {
        if op.is_bitwise() {
            continue;
        }
        for i in 0..10_000 {
            let v: Vec<i64> = (0..5).map(|r| value(dt, op, r, i)).collect();
            let bound = match op {
                ReduceOp::Prod => 32,
                _ => 40,
            };
            for k in 1..=5 {
                let x: i64 = match op {
                    ReduceOp::Prod => v[..k].iter().product(),
                    _ => v[..k].iter().sum(),
                };
                assert!(x.abs() <= bound, "{dt} {op} {v:?}");
                if !signed(dt) {
                    assert!(v.iter().all(|x| *x >= 0));
                }
            }
        }
    }
    // A misplaced block cannot pass: neighbouring elements differ often.
    let differ = (0..1000)
        .filter(|&i| {
            value(DataType::F32, ReduceOp::Sum, 0, i)
                != value(DataType::F32, ReduceOp::Sum, 0, i + 1)
        })
        .count();
    assert!(differ > 800, "{differ}");
}
