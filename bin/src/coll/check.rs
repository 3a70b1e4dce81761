//! The data coll-perf sends and the results it expects: integer-valued inputs chosen per
//! type, operator and rank count so that every result is exact (as nccl-tests' verifiable
//! initialisation), and the count of wrong elements.
//!
//! - sum, avg: `((i + 7·rank + rep) mod K) + 1`, with K small enough that the sum over all
//!   ranks is an exact integer in the type (f16: 2048, bf16: 256; integers wrap, which is
//!   exact too);
//! - prod: 1 or 2 (a product of powers of two is exact up to the type's exponent range);
//! - min, max, and the data of all_gather, broadcast and sendrecv:
//!   `((7·i + 13·rank + rep) mod K) + 1` within the type's range;
//! - band, bor, bxor: 64 random-looking bits per element (splitmix64 of rank, index, rep).
//!
//! Every comparison is bit-exact, except avg on f16/bf16, where one unit in the last place is
//! allowed (the sum is divided in f32 and rounded once more).

use roce_collectives::{DataType, ReduceOp};

/// A value before it is written in the element type.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    Int(i128),
    Float(f64),
}

/// The largest integer every value up to which is exact in a float type.
fn exact_limit(dt: DataType) -> i64 {
    match dt {
        DataType::F16 => 2048,
        DataType::Bf16 => 256,
        DataType::F32 => 1 << 24,
        DataType::F64 => 1 << 53,
        _ => i64::MAX,
    }
}

/// The largest positive value of the type that min/max data may use.
fn value_range(dt: DataType) -> i64 {
    match dt {
        DataType::I8 => 127,
        DataType::U8 => 255,
        _ => 251.min(exact_limit(dt)),
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The input of `rank` at element `i` for a reduction with `op` over `n` ranks.
fn input(dt: DataType, op: ReduceOp, n: usize, rank: usize, i: usize, rep: u64) -> Val {
    let (i, r, n) = (i as u64, rank as u64, n as u64);
    let small = |v: u64| {
        if dt.is_float() {
            Val::Float(v as f64)
        } else {
            Val::Int(i128::from(v))
        }
    };
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            let k = if dt.is_float() {
                (exact_limit(dt) as u64 / n.max(1)).clamp(1, 251)
            } else {
                251
            };
            small((i + 7 * r + rep) % k + 1)
        }
        ReduceOp::Prod => {
            // 2^n must stay in range: f16 holds 2^15.
            if n <= 15 || dt != DataType::F16 {
                small(1 + (i + r + rep) % 2)
            } else {
                small(1 + u64::from((i + r) % n == 0))
            }
        }
        ReduceOp::Min | ReduceOp::Max => small(data_value(dt, r, i, rep)),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            Val::Int(i128::from(splitmix64((r << 40) ^ i ^ (rep << 56))))
        }
    }
}

/// The plain data (no reduction) of `rank` at element `i`.
fn data_value(dt: DataType, rank: u64, i: u64, rep: u64) -> u64 {
    (7 * i + 13 * rank + rep) % value_range(dt) as u64 + 1
}

fn data(dt: DataType, rank: usize, i: usize, rep: u64) -> Val {
    let v = data_value(dt, rank as u64, i as u64, rep);
    if dt.is_float() {
        Val::Float(v as f64)
    } else {
        Val::Int(i128::from(v))
    }
}

/// Writes `v` as one element of `dt` at the start of `out` (integers truncate: they wrap).
fn put(dt: DataType, v: Val, out: &mut [u8]) {
    let f = match v {
        Val::Float(f) => f,
        Val::Int(x) => x as f64,
    };
    let x = match v {
        Val::Int(x) => x,
        Val::Float(f) => f as i128,
    };
    match dt {
        DataType::F32 => out[..4].copy_from_slice(&(f as f32).to_le_bytes()),
        DataType::F64 => out[..8].copy_from_slice(&f.to_le_bytes()),
        DataType::F16 => out[..2].copy_from_slice(&half::f16::from_f64(f).to_le_bytes()),
        DataType::Bf16 => out[..2].copy_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
        DataType::I8 | DataType::U8 => out[0] = x as u8,
        DataType::I32 | DataType::U32 => out[..4].copy_from_slice(&(x as u32).to_le_bytes()),
        DataType::I64 | DataType::U64 => out[..8].copy_from_slice(&(x as u64).to_le_bytes()),
    }
}

/// Reads one element of an integer type back as a number (signed types sign-extended).
fn get_int(dt: DataType, b: &[u8]) -> i128 {
    match dt {
        DataType::I8 => i128::from(b[0] as i8),
        DataType::U8 => i128::from(b[0]),
        DataType::I32 => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::U32 => i128::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::I64 => i128::from(i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))),
        DataType::U64 => i128::from(u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))),
        _ => 0,
    }
}

/// Fills `buf` (whole elements) with rank `rank`'s input for a reduction, element `first`
/// onwards.
pub(crate) fn fill_input(
    dt: DataType,
    op: ReduceOp,
    n: usize,
    rank: usize,
    first: usize,
    rep: u64,
    buf: &mut [u8],
) {
    for (k, e) in buf.chunks_exact_mut(dt.size()).enumerate() {
        put(dt, input(dt, op, n, rank, first + k, rep), e);
    }
}

/// Fills `buf` with rank `rank`'s plain data (all_gather, broadcast, sendrecv).
pub(crate) fn fill_data(dt: DataType, rank: usize, first: usize, rep: u64, buf: &mut [u8]) {
    for (k, e) in buf.chunks_exact_mut(dt.size()).enumerate() {
        put(dt, data(dt, rank, first + k, rep), e);
    }
}

/// The reduction of every rank's input at element `i`, written at the start of `out`.
fn put_reduced(dt: DataType, op: ReduceOp, n: usize, i: usize, rep: u64, out: &mut [u8]) {
    let vals = (0..n).map(|r| input(dt, op, n, r, i, rep));
    if dt.is_float() {
        let fs: Vec<f64> = vals
            .map(|v| match v {
                Val::Float(f) => f,
                Val::Int(x) => x as f64,
            })
            .collect();
        let v = match op {
            ReduceOp::Sum | ReduceOp::Avg => fs.iter().sum(),
            ReduceOp::Prod => fs.iter().product(),
            ReduceOp::Min => fs.iter().copied().fold(f64::INFINITY, f64::min),
            _ => fs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        };
        if op != ReduceOp::Avg {
            put(dt, Val::Float(v), out);
            return;
        }
        // The sum is exact in the type; it is divided as the library's finishing step does.
        let q = match dt {
            DataType::F64 => v / n as f64,
            _ => f64::from(v as f32 / n as f32),
        };
        put(dt, Val::Float(q), out);
        return;
    }
    // Integers: fold in i128, wrap into the type by writing, read back for avg's division.
    let xs: Vec<i128> = vals
        .map(|v| match v {
            Val::Int(x) => x,
            Val::Float(f) => f as i128,
        })
        .collect();
    let wrap = |x: i128| -> i128 {
        let mut b = [0u8; 8];
        put(dt, Val::Int(x), &mut b);
        get_int(dt, &b)
    };
    let v = match op {
        ReduceOp::Sum | ReduceOp::Avg => xs.iter().fold(0i128, |a, x| wrap(a + wrap(*x))),
        ReduceOp::Prod => xs.iter().fold(1i128, |a, x| wrap(a * wrap(*x))),
        ReduceOp::Min => xs.iter().map(|x| wrap(*x)).min().unwrap_or(0),
        ReduceOp::Max => xs.iter().map(|x| wrap(*x)).max().unwrap_or(0),
        ReduceOp::BAnd => xs.iter().fold(-1i128, |a, x| a & x),
        ReduceOp::BOr => xs.iter().fold(0i128, |a, x| a | x),
        ReduceOp::BXor => xs.iter().fold(0i128, |a, x| a ^ x),
    };
    let v = if op == ReduceOp::Avg {
        // Rust's integer division truncates toward zero, as the library's.
        v / n as i128
    } else {
        v
    };
    put(dt, Val::Int(v), out);
}

/// Fills `buf` with the expected reduction over `n` ranks, element `first` onwards.
pub(crate) fn fill_reduced(
    dt: DataType,
    op: ReduceOp,
    n: usize,
    first: usize,
    rep: u64,
    buf: &mut [u8],
) {
    for (k, e) in buf.chunks_exact_mut(dt.size()).enumerate() {
        put_reduced(dt, op, n, first + k, rep, e);
    }
}

/// The number of elements of `got` that differ from `want` (bit-exact; avg on f16/bf16 may
/// be one unit in the last place off).
pub(crate) fn count_wrong(dt: DataType, op: ReduceOp, got: &[u8], want: &[u8]) -> u64 {
    let sz = dt.size();
    let ulp_ok = op == ReduceOp::Avg && matches!(dt, DataType::F16 | DataType::Bf16);
    let mut wrong = 0u64;
    for (g, w) in got.chunks_exact(sz).zip(want.chunks_exact(sz)) {
        if g == w {
            continue;
        }
        if ulp_ok {
            let a = i32::from(u16::from_le_bytes([g[0], g[1]]));
            let b = i32::from(u16::from_le_bytes([w[0], w[1]]));
            if (a - b).abs() <= 1 {
                continue;
            }
        }
        wrong += 1;
    }
    // A length mismatch counts every missing element.
    let (gn, wn) = (got.len() / sz, want.len() / sz);
    wrong + gn.abs_diff(wn) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_collectives::reduce::{finish, reduce_into};

    /// The expectation agrees with the library's own kernels folding every rank's input, for
    /// every type × operator at 1–5 ranks, and the inputs differ between ranks.
    #[test]
    fn expected_results_match_a_fold_of_the_inputs_for_every_type_and_op() {
        let count = 600;
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                if !dt.supports(op) {
                    continue;
                }
                for n in 1..=5 {
                    let sz = dt.size();
                    let mut acc = vec![0u8; count * sz];
                    fill_input(dt, op, n, 0, 0, 3, &mut acc);
                    for r in 1..n {
                        let mut src = vec![0u8; count * sz];
                        fill_input(dt, op, n, r, 0, 3, &mut src);
                        reduce_into(dt, op, &mut acc, &src).unwrap();
                    }
                    finish(dt, op, &mut acc, n).unwrap();
                    let mut want = vec![0u8; count * sz];
                    fill_reduced(dt, op, n, 0, 3, &mut want);
                    assert_eq!(count_wrong(dt, op, &acc, &want), 0, "{dt} {op} n={n}");
                    if n >= 2 {
                        let mut a = vec![0u8; count * sz];
                        let mut b = vec![0u8; count * sz];
                        fill_input(dt, op, n, 0, 0, 3, &mut a);
                        fill_input(dt, op, n, 1, 0, 3, &mut b);
                        assert_ne!(a, b, "{dt} {op}: ranks 0 and 1 send the same data");
                    }
                }
            }
        }
    }

    #[test]
    fn float_sums_stay_exact_so_a_wrong_element_is_caught() {
        // bf16 at 5 ranks: K = 51, sums up to 255, all exact.
        let (dt, op, n) = (DataType::Bf16, ReduceOp::Sum, 5);
        let mut want = vec![0u8; 512 * 2];
        fill_reduced(dt, op, n, 0, 0, &mut want);
        let mut got = want.clone();
        assert_eq!(count_wrong(dt, op, &got, &want), 0);
        got[10] ^= 1; // one element, one ulp off
        got[21] ^= 0x40;
        assert_eq!(count_wrong(dt, op, &got, &want), 2);
        assert_eq!(count_wrong(dt, op, &got[..100], &want), 2 + 462);
        // avg on bf16 forgives one ulp, not two.
        let mut want = vec![0u8; 2];
        fill_reduced(dt, ReduceOp::Avg, n, 7, 0, &mut want);
        let w = u16::from_le_bytes([want[0], want[1]]);
        let off = |d: u16| (w + d).to_le_bytes().to_vec();
        assert_eq!(count_wrong(dt, ReduceOp::Avg, &off(1), &want), 0);
        assert_eq!(count_wrong(dt, ReduceOp::Avg, &off(2), &want), 1);
    }

    #[test]
    fn data_differs_per_rank_and_rep_and_fits_the_type() {
        for dt in DataType::ALL {
            let mut a = vec![0u8; 64 * dt.size()];
            let mut b = a.clone();
            let mut c = a.clone();
            fill_data(dt, 0, 0, 0, &mut a);
            fill_data(dt, 1, 0, 0, &mut b);
            fill_data(dt, 0, 0, 1, &mut c);
            assert!(a != b && a != c, "{dt}");
        }
        let mut x = [0u8; 1];
        fill_data(DataType::I8, 9, 100, 5, &mut x);
        assert!((1..=127).contains(&(x[0] as i8)));
    }
}
