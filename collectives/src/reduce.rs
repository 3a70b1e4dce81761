//! Reduction kernels: `acc = op(acc, src)` element by element over byte slices of one
//! [`DataType`], and the final step of [`ReduceOp::Avg`].
//!
//! Integers wrap; `f16`/`bf16` are combined in `f32` and rounded once per step. Slices need no
//! alignment.
//!
//! # How they are fast
//!
//! Every kernel is one loop `a[i] = f(a[i], s[i])` over typed slices, which the compiler
//! vectorises (wrapping integer add/mul, bitwise ops, float add/mul/min/max):
//!
//! - when both byte slices are aligned for the element type, they are reinterpreted in place
//!   (`bytemuck::try_cast_slice`);
//! - otherwise the same loop reads and writes each element unaligned (`pod_read_unaligned`),
//!   which vectorises as well (stack blocks with `memcpy` in and out measured slower);
//! - `f16`/`bf16` are widened to `f32` in the same loop (branch-free conversions for `f16`,
//!   `half`'s shifts for `bf16`), combined in `f32`, and rounded back once.
//!
//! Each element's result is exactly what the element-at-a-time definition gives (the
//! `f32`/`f64` operation, or the `f32` operation then one rounding for `f16`/`bf16`), whatever
//! the alignment or length: the property test checks this bit for bit
//! against that definition for every type × operator, so two ranks reducing the same values
//! get the same bits whatever their buffers' addresses. One exception: an operation on NaNs
//! gives a NaN whose sign and payload are not specified (IEEE 754 leaves them open and the
//! compiler may swap the operands of `+`/`*`); a communicator that computes each element once
//! and sends the result on (ring, halving-doubling) still gives every rank the same bits.
//!
//! # Determinism
//!
//! The kernels are element-wise, so a result depends only on the order in which the
//! contributions are folded, never on how a buffer is cut into chunks. [`reduce_many`] folds a
//! list of contributions in list order (rank order, for a deterministic mode: every element is
//! `((x0 op x1) op x2) …` wherever it is computed).

use bytemuck::Pod;
use half::bf16;

use crate::dtype::{DataType, ReduceOp};
use crate::error::CollError;

fn check(dt: DataType, op: ReduceOp, a: usize, b: usize) -> Result<(), CollError> {
    if !dt.supports(op) {
        return Err(CollError::Unsupported { dtype: dt, op });
    }
    if a != b || a % dt.size() != 0 {
        return Err(CollError::InvalidArgument(format!(
            "reduce: {a} and {b} bytes of {dt} (equal lengths, multiples of {} expected)",
            dt.size()
        )));
    }
    Ok(())
}

/// `a[i] = f(a[i], s[i])`: the loop every kernel ends in (vectorised once `f` is inlined).
#[inline(always)]
fn zip_apply<T: Copy>(a: &mut [T], s: &[T], f: impl Fn(T, T) -> T) {
    for (x, y) in a.iter_mut().zip(s) {
        *x = f(*x, *y);
    }
}

/// `acc = f(acc, src)` over bytes holding `T`s (equal lengths, whole elements: checked by the
/// caller): as typed slices when both are aligned, else element by element through unaligned
/// loads and stores (which the compiler vectorises as well).
#[inline(always)]
fn apply<T: Pod>(acc: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T + Copy) {
    if let (Ok(a), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(&mut *acc),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        zip_apply(a, s, f);
        return;
    }
    let n = size_of::<T>();
    for (a, s) in acc.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
        let r = f(
            bytemuck::pod_read_unaligned(a),
            bytemuck::pod_read_unaligned(s),
        );
        a.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

/// `buf = f(buf)` over bytes holding `T`s, as [`apply`].
#[inline(always)]
fn map<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T + Copy) {
    if let Ok(a) = bytemuck::try_cast_slice_mut::<u8, T>(&mut *buf) {
        a.iter_mut().for_each(|x| *x = f(*x));
        return;
    }
    let n = size_of::<T>();
    for a in buf.chunks_exact_mut(n) {
        let r = f(bytemuck::pod_read_unaligned(a));
        a.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

// `f16` conversions written without branches (selects), so that the loops above vectorise
// through them (`half`'s per-element `f16::to_f32`/`from_f32` do not: they test for F16C on
// every call; its slice helpers need stack blocks and measured no faster). They give exactly
// what `half` gives for every non-NaN value (`half_conversions_equal_the_half_crate`); NaNs
// stay NaN and are made quiet on the way in, as `half` does, so that `min`/`max` treat them
// alike. `bf16` needs none: `half`'s `bf16` conversions are plain shifts that vectorise.

/// `if c { a } else { b }` as masks, which vectorises where a branch would not.
#[inline(always)]
fn select(c: bool, a: u32, b: u32) -> u32 {
    let m = u32::from(c).wrapping_neg();
    (a & m) | (b & !m)
}

/// `f16` bits to `f32`, exact (F. Giesen's `half_to_float`).
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    const MAGIC: u32 = 113 << 23;
    const SHIFTED_EXP: u32 = 0x7C00 << 13;
    let h = u32::from(h);
    let bits = (h & 0x7FFF) << 13;
    let exp = bits & SHIFTED_EXP;
    let normal = bits + ((127 - 15) << 23);
    let quiet = u32::from(h & 0x03FF != 0) << 22;
    let inf_nan = (normal + ((128 - 16) << 23)) | quiet;
    let subnormal = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(MAGIC)).to_bits();
    let r = select(
        exp == SHIFTED_EXP,
        inf_nan,
        select(exp == 0, subnormal, normal),
    );
    f32::from_bits(r | ((h & 0x8000) << 16))
}

/// `f32` to `f16` bits, rounding to nearest even (F. Giesen's `float_to_half_fast3_rtne`).
#[inline(always)]
fn f32_to_f16(f: f32) -> u16 {
    const F32_INF: u32 = 255 << 23;
    const F16_OVERFLOW: u32 = (127 + 16) << 23;
    const SUBNORMAL_BELOW: u32 = 113 << 23;
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let x = f.to_bits();
    let sign = x & 0x8000_0000;
    let a = x ^ sign;
    let big = select(a > F32_INF, 0x7E00, 0x7C00);
    let subnormal = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC))
        .to_bits()
        .wrapping_sub(DENORM_MAGIC);
    let mant_odd = (a >> 13) & 1;
    let normal = a
        .wrapping_add((15u32.wrapping_sub(127) << 23).wrapping_add(0xFFF))
        .wrapping_add(mant_odd)
        >> 13;
    let r = select(
        a >= F16_OVERFLOW,
        big,
        select(a < SUBNORMAL_BELOW, subnormal, normal),
    );
    // Every arm is below 2^16 (the sign goes to bit 15).
    ((r | (sign >> 16)) & 0xFFFF) as u16
}

macro_rules! int_op {
    ($acc:expr, $src:expr, $t:ty, $op:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => apply::<$t>($acc, $src, |x, y| x.wrapping_add(y)),
            ReduceOp::Prod => apply::<$t>($acc, $src, |x, y| x.wrapping_mul(y)),
            ReduceOp::Min => apply::<$t>($acc, $src, |x, y| x.min(y)),
            ReduceOp::Max => apply::<$t>($acc, $src, |x, y| x.max(y)),
            ReduceOp::BAnd => apply::<$t>($acc, $src, |x, y| x & y),
            ReduceOp::BOr => apply::<$t>($acc, $src, |x, y| x | y),
            ReduceOp::BXor => apply::<$t>($acc, $src, |x, y| x ^ y),
        }
    };
}

/// The float operators, as one macro so that every path (f32, f64, and the f32 steps of
/// f16/bf16) uses the same expressions.
macro_rules! float_op {
    ($op:expr, $apply:ident, $t:ty) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $apply!(|x: $t, y: $t| x + y),
            ReduceOp::Prod => $apply!(|x: $t, y: $t| x * y),
            ReduceOp::Min => $apply!(|x: $t, y: $t| x.min(y)),
            ReduceOp::Max => $apply!(|x: $t, y: $t| x.max(y)),
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                // INVARIANT: `check` refused bitwise operators on float types.
                unreachable!("checked by DataType::supports")
            }
        }
    };
}

/// `acc[i] = op(acc[i], src[i])` for every element. [`ReduceOp::Avg`] accumulates as a sum:
/// call [`finish`] once on the result.
///
/// # Errors
/// [`CollError::Unsupported`] for a bitwise operator on a float type;
/// [`CollError::InvalidArgument`] if the lengths differ or are not whole elements.
pub fn reduce_into(
    dt: DataType,
    op: ReduceOp,
    acc: &mut [u8],
    src: &[u8],
) -> Result<(), CollError> {
    check(dt, op, acc.len(), src.len())?;
    match dt {
        DataType::I8 => int_op!(acc, src, i8, op),
        DataType::U8 => int_op!(acc, src, u8, op),
        DataType::I32 => int_op!(acc, src, i32, op),
        DataType::U32 => int_op!(acc, src, u32, op),
        DataType::I64 => int_op!(acc, src, i64, op),
        DataType::U64 => int_op!(acc, src, u64, op),
        DataType::F32 => {
            macro_rules! go {
                ($f:expr) => {
                    apply::<f32>(acc, src, $f)
                };
            }
            float_op!(op, go, f32)
        }
        DataType::F64 => {
            macro_rules! go {
                ($f:expr) => {
                    apply::<f64>(acc, src, $f)
                };
            }
            float_op!(op, go, f64)
        }
        DataType::F16 => {
            macro_rules! go {
                ($f:expr) => {
                    apply::<u16>(acc, src, |x, y| {
                        f32_to_f16($f(f16_to_f32(x), f16_to_f32(y)))
                    })
                };
            }
            float_op!(op, go, f32)
        }
        DataType::Bf16 => {
            macro_rules! go {
                ($f:expr) => {
                    apply::<bf16>(acc, src, |x, y| bf16::from_f32($f(x.to_f32(), y.to_f32())))
                };
            }
            float_op!(op, go, f32)
        }
    }
    Ok(())
}

/// `out = ((inputs[0] op inputs[1]) op inputs[2]) …`: a left fold of the contributions in
/// slice order (give them in rank order for a result that depends on nothing else), in
/// blocks that stay in cache. `f16`/`bf16` round after every step, as [`reduce_into`] does,
/// so the result is bit for bit that of `out = inputs[0]` then `reduce_into` with each next
/// input. [`ReduceOp::Avg`] is a sum here too: call [`finish`] on the result.
///
/// # Errors
/// As [`reduce_into`]; also [`CollError::InvalidArgument`] for an empty `inputs` or an input
/// whose length is not `out`'s.
pub fn reduce_many(
    dt: DataType,
    op: ReduceOp,
    out: &mut [u8],
    inputs: &[&[u8]],
) -> Result<(), CollError> {
    let Some((first, rest)) = inputs.split_first() else {
        return Err(CollError::InvalidArgument("reduce_many: no inputs".into()));
    };
    check(dt, op, out.len(), first.len())?;
    for i in rest {
        check(dt, op, out.len(), i.len())?;
    }
    // 16 KiB of output at a time: it stays in L1/L2 while every input is folded in.
    const STEP: usize = 16 << 10;
    let step = STEP - STEP % dt.size();
    for (k, o) in out.chunks_mut(step).enumerate() {
        let at = k * step;
        o.copy_from_slice(&first[at..at + o.len()]);
        for i in rest {
            reduce_into(dt, op, o, &i[at..at + o.len()])?;
        }
    }
    Ok(())
}

/// The last step of a reduction over `nranks` ranks: divides by `nranks` for
/// [`ReduceOp::Avg`] (integer division on integers), nothing for the other operators.
///
/// # Errors
/// [`CollError::InvalidArgument`] if `buf` is not whole elements or `nranks` is 0.
pub fn finish(dt: DataType, op: ReduceOp, buf: &mut [u8], nranks: usize) -> Result<(), CollError> {
    check(dt, op, buf.len(), buf.len())?;
    if nranks == 0 {
        return Err(CollError::InvalidArgument("finish: 0 ranks".into()));
    }
    if op != ReduceOp::Avg {
        return Ok(());
    }
    // Rank counts fit every type's range in practice; a count beyond it saturates.
    let n = nranks as u64;
    match dt {
        DataType::I8 => {
            let d = i8::try_from(n).unwrap_or(i8::MAX);
            map::<i8>(buf, |x| x / d);
        }
        DataType::U8 => {
            let d = u8::try_from(n).unwrap_or(u8::MAX);
            map::<u8>(buf, |x| x / d);
        }
        DataType::I32 => {
            let d = i32::try_from(n).unwrap_or(i32::MAX);
            map::<i32>(buf, |x| x / d);
        }
        DataType::U32 => {
            let d = u32::try_from(n).unwrap_or(u32::MAX);
            map::<u32>(buf, |x| x / d);
        }
        DataType::I64 => {
            let d = i64::try_from(n).unwrap_or(i64::MAX);
            map::<i64>(buf, |x| x / d);
        }
        DataType::U64 => map::<u64>(buf, |x| x / n),
        DataType::F32 => map::<f32>(buf, |x| x / n as f32),
        DataType::F64 => map::<f64>(buf, |x| x / n as f64),
        DataType::F16 => map::<u16>(buf, |x| f32_to_f16(f16_to_f32(x) / n as f32)),
        DataType::Bf16 => map::<bf16>(buf, |x| bf16::from_f32(x.to_f32() / n as f32)),
    }
    Ok(())
}

/// The element-at-a-time definition the fast kernels must match bit for bit (the first,
/// plain version of this module): the property tests and the throughput figures compare
/// against it.
#[cfg(test)]
mod scalar {
    use super::check;
    use crate::dtype::{DataType, ReduceOp};
    use crate::error::CollError;

    macro_rules! each {
        ($acc:expr, $src:expr, $t:ty, |$x:ident, $y:ident| $e:expr) => {{
            const N: usize = size_of::<$t>();
            for (a, s) in $acc.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
                let $x: $t = bytemuck::pod_read_unaligned(a);
                let $y: $t = bytemuck::pod_read_unaligned(s);
                let r: $t = $e;
                a.copy_from_slice(bytemuck::bytes_of(&r));
            }
        }};
    }

    macro_rules! int_op {
        ($acc:expr, $src:expr, $t:ty, $op:expr) => {
            match $op {
                ReduceOp::Sum | ReduceOp::Avg => each!($acc, $src, $t, |x, y| x.wrapping_add(y)),
                ReduceOp::Prod => each!($acc, $src, $t, |x, y| x.wrapping_mul(y)),
                ReduceOp::Min => each!($acc, $src, $t, |x, y| x.min(y)),
                ReduceOp::Max => each!($acc, $src, $t, |x, y| x.max(y)),
                ReduceOp::BAnd => each!($acc, $src, $t, |x, y| x & y),
                ReduceOp::BOr => each!($acc, $src, $t, |x, y| x | y),
                ReduceOp::BXor => each!($acc, $src, $t, |x, y| x ^ y),
            }
        };
    }

    macro_rules! float_op {
        ($acc:expr, $src:expr, $t:ty, $op:expr, $to:expr, $from:expr) => {
            match $op {
                ReduceOp::Sum | ReduceOp::Avg => {
                    each!($acc, $src, $t, |x, y| $from($to(x) + $to(y)))
                }
                ReduceOp::Prod => each!($acc, $src, $t, |x, y| $from($to(x) * $to(y))),
                ReduceOp::Min => each!($acc, $src, $t, |x, y| $from($to(x).min($to(y)))),
                ReduceOp::Max => each!($acc, $src, $t, |x, y| $from($to(x).max($to(y)))),
                ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                    unreachable!("checked by DataType::supports")
                }
            }
        };
    }

    /// `acc[i] = op(acc[i], src[i])` for every element. [`ReduceOp::Avg`] accumulates as a sum:
    /// call [`finish`] once on the result.
    ///
    /// # Errors
    /// [`CollError::Unsupported`] for a bitwise operator on a float type;
    /// [`CollError::InvalidArgument`] if the lengths differ or are not whole elements.
    pub(super) fn reduce_into(
        dt: DataType,
        op: ReduceOp,
        acc: &mut [u8],
        src: &[u8],
    ) -> Result<(), CollError> {
        check(dt, op, acc.len(), src.len())?;
        let id = |x| x;
        match dt {
            DataType::I8 => int_op!(acc, src, i8, op),
            DataType::U8 => int_op!(acc, src, u8, op),
            DataType::I32 => int_op!(acc, src, i32, op),
            DataType::U32 => int_op!(acc, src, u32, op),
            DataType::I64 => int_op!(acc, src, i64, op),
            DataType::U64 => int_op!(acc, src, u64, op),
            DataType::F32 => float_op!(acc, src, f32, op, id, id),
            DataType::F64 => float_op!(acc, src, f64, op, |x: f64| x, |x: f64| x),
            DataType::F16 => float_op!(
                acc,
                src,
                half::f16,
                op,
                half::f16::to_f32,
                half::f16::from_f32
            ),
            DataType::Bf16 => float_op!(
                acc,
                src,
                half::bf16,
                op,
                half::bf16::to_f32,
                half::bf16::from_f32
            ),
        }
        Ok(())
    }

    /// The last step of a reduction over `nranks` ranks: divides by `nranks` for
    /// [`ReduceOp::Avg`] (integer division on integers), nothing for the other operators.
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] if `buf` is not whole elements or `nranks` is 0.
    pub(super) fn finish(
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        nranks: usize,
    ) -> Result<(), CollError> {
        check(dt, op, buf.len(), buf.len())?;
        if nranks == 0 {
            return Err(CollError::InvalidArgument("finish: 0 ranks".into()));
        }
        if op != ReduceOp::Avg {
            return Ok(());
        }
        macro_rules! div {
            ($t:ty, $n:expr) => {{
                const N: usize = size_of::<$t>();
                for a in buf.chunks_exact_mut(N) {
                    let x: $t = bytemuck::pod_read_unaligned(a);
                    a.copy_from_slice(bytemuck::bytes_of(&(x / $n)));
                }
            }};
        }
        // Rank counts fit every type's range in practice; a count beyond it saturates.
        let n = nranks as u64;
        match dt {
            DataType::I8 => div!(i8, i8::try_from(n).unwrap_or(i8::MAX)),
            DataType::U8 => div!(u8, u8::try_from(n).unwrap_or(u8::MAX)),
            DataType::I32 => div!(i32, i32::try_from(n).unwrap_or(i32::MAX)),
            DataType::U32 => div!(u32, u32::try_from(n).unwrap_or(u32::MAX)),
            DataType::I64 => div!(i64, i64::try_from(n).unwrap_or(i64::MAX)),
            DataType::U64 => div!(u64, n),
            DataType::F32 => div!(f32, n as f32),
            DataType::F64 => div!(f64, n as f64),
            DataType::F16 => {
                for a in buf.chunks_exact_mut(2) {
                    let x: half::f16 = bytemuck::pod_read_unaligned(a);
                    let r = half::f16::from_f32(x.to_f32() / n as f32);
                    a.copy_from_slice(bytemuck::bytes_of(&r));
                }
            }
            DataType::Bf16 => {
                for a in buf.chunks_exact_mut(2) {
                    let x: half::bf16 = bytemuck::pod_read_unaligned(a);
                    let r = half::bf16::from_f32(x.to_f32() / n as f32);
                    a.copy_from_slice(bytemuck::bytes_of(&r));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use proptest::prelude::*;

    use super::*;

    fn pairs() -> impl Strategy<Value = (DataType, ReduceOp)> {
        (0..DataType::ALL.len(), 0..ReduceOp::ALL.len())
            .prop_map(|(t, o)| (DataType::ALL[t], ReduceOp::ALL[o]))
            .prop_filter("bitwise on floats", |(t, o)| t.supports(*o))
    }

    /// Buffers with random bytes (every bit pattern: NaNs, infinities, subnormals, ±0),
    /// `count` elements starting at byte offsets `off_a`/`off_s` (any alignment).
    fn buffers() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize, usize, usize)> {
        (0usize..700, 0usize..8, 0usize..8).prop_flat_map(|(count, oa, os)| {
            let n = count * 8 + 8;
            (
                proptest::collection::vec(any::<u8>(), n),
                proptest::collection::vec(any::<u8>(), n),
                Just(count),
                Just(oa),
                Just(os),
            )
        })
    }

    /// Whether two buffers of `dt` hold the same bits, element by element, except that any
    /// NaN equals any NaN: which NaN an operation on NaNs returns (sign, payload) is not
    /// specified (IEEE 754 6.2.3; the compiler may swap the operands of a commutative
    /// operation), so the kernels promise NaN there, not the bits.
    fn same_bits_or_both_nan(dt: DataType, a: &[u8], b: &[u8]) -> bool {
        fn eq<T: Pod>(a: &[u8], b: &[u8], nan: impl Fn(T) -> bool) -> bool {
            let n = size_of::<T>();
            a.len() == b.len()
                && a.chunks_exact(n).zip(b.chunks_exact(n)).all(|(x, y)| {
                    x == y
                        || (nan(bytemuck::pod_read_unaligned(x))
                            && nan(bytemuck::pod_read_unaligned(y)))
                })
        }
        match dt {
            DataType::F32 => eq::<f32>(a, b, f32::is_nan),
            DataType::F64 => eq::<f64>(a, b, f64::is_nan),
            DataType::F16 => eq::<f16>(a, b, f16::is_nan),
            DataType::Bf16 => eq::<bf16>(a, b, bf16::is_nan),
            _ => a == b,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn fast_kernels_equal_the_scalar_definition_bit_for_bit(
            (dt, op) in pairs(),
            (a, s, count, oa, os) in buffers(),
            nranks in 1usize..9,
        ) {
            let len = count * dt.size();
            let (mut fast, mut slow) = (a.clone(), a.clone());
            reduce_into(dt, op, &mut fast[oa..oa + len], &s[os..os + len]).unwrap();
            scalar::reduce_into(dt, op, &mut slow[oa..oa + len], &s[os..os + len]).unwrap();
            let (region, rest) = (oa..oa + len, oa + len..);
            prop_assert_eq!(&fast[..oa], &slow[..oa]);
            prop_assert_eq!(&fast[rest.clone()], &slow[rest.clone()]);
            prop_assert!(
                same_bits_or_both_nan(dt, &fast[region.clone()], &slow[region.clone()]),
                "{} {} count {} offsets {}/{}", dt, op, count, oa, os
            );
            finish(dt, op, &mut fast[oa..oa + len], nranks).unwrap();
            scalar::finish(dt, op, &mut slow[oa..oa + len], nranks).unwrap();
            prop_assert!(
                same_bits_or_both_nan(dt, &fast[region.clone()], &slow[region]),
                "finish {} {} /{}", dt, op, nranks
            );
        }

        #[test]
        fn reduce_many_is_the_left_fold_in_input_order(
            (dt, op) in pairs(),
            count in 0usize..9000,
            nin in 1usize..6,
            seed in any::<u64>(),
            off in 0usize..4,
        ) {
            let len = count * dt.size();
            let mut x = seed | 1;
            let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x >> 24) as u8 };
            let inputs: Vec<Vec<u8>> = (0..nin)
                .map(|_| (0..len + off).map(|_| next()).collect())
                .collect();
            let views: Vec<&[u8]> = inputs.iter().map(|v| &v[off..]).collect();
            let mut out = vec![0u8; len];
            reduce_many(dt, op, &mut out, &views).unwrap();
            let mut want = views[0].to_vec();
            for v in &views[1..] {
                scalar::reduce_into(dt, op, &mut want, v).unwrap();
            }
            prop_assert!(same_bits_or_both_nan(dt, &out, &want));
        }
    }

    /// The branch-free conversions against `half`'s, on every `f16` value, on the
    /// `f32` values around every rounding boundary (each half value's `f32` image and its
    /// neighbours, and the midpoints to the next value and theirs), and on a million
    /// pseudo-random `f32` bit patterns.
    #[test]
    fn half_conversions_equal_the_half_crate() {
        fn same(a: f32, b: f32) -> bool {
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
        }
        let mut probes: Vec<u32> = Vec::new();
        for h in 0..=u16::MAX {
            let f = f16::from_bits(h);
            assert!(same(f16_to_f32(h), f.to_f32()), "f16 {h:#06x}");
            {
                let x = f.to_f32().to_bits();
                let next = x.wrapping_add(1 << 13);
                let mid = x / 2 + next / 2;
                for p in [x, mid, x.wrapping_add(0x8000), x | 0x1000] {
                    probes.extend([p.wrapping_sub(1), p, p.wrapping_add(1)]);
                }
            }
        }
        let mut r = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1_000_000 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            probes.push((r >> 16) as u32);
        }
        for bits in probes {
            let x = f32::from_bits(bits);
            let (ours, theirs) = (f32_to_f16(x), f16::from_f32(x));
            assert!(
                ours == theirs.to_bits() || (x.is_nan() && f16::from_bits(ours).is_nan()),
                "f32 {bits:#010x} to f16: {ours:#06x}, half says {:#06x}",
                theirs.to_bits()
            );
        }
    }

    #[test]
    fn signed_zeros_and_nans_match_the_scalar_definition_on_every_path() {
        // min/max of ±0 and of NaN against numbers: the vector and scalar code must agree,
        // or two ranks with differently aligned buffers could disagree in bits.
        let vals = [0.0f32, -0.0, f32::NAN, -f32::NAN, 1.0, -1.0, f32::INFINITY];
        let mut a = Vec::new();
        let mut s = Vec::new();
        for x in vals {
            for y in vals {
                a.push(x);
                s.push(y);
            }
        }
        for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Prod] {
            for (dt, ab, sb) in [
                (
                    DataType::F32,
                    bytemuck::cast_slice::<f32, u8>(&a).to_vec(),
                    bytemuck::cast_slice::<f32, u8>(&s).to_vec(),
                ),
                (
                    DataType::F64,
                    a.iter().flat_map(|v| f64::from(*v).to_ne_bytes()).collect(),
                    s.iter().flat_map(|v| f64::from(*v).to_ne_bytes()).collect(),
                ),
                (
                    DataType::F16,
                    a.iter()
                        .flat_map(|v| f16::from_f32(*v).to_ne_bytes())
                        .collect(),
                    s.iter()
                        .flat_map(|v| f16::from_f32(*v).to_ne_bytes())
                        .collect(),
                ),
            ] {
                for off in [0usize, 1] {
                    let mut fa = vec![0u8; off];
                    fa.extend_from_slice(&ab);
                    let mut fs = vec![0u8; off];
                    fs.extend_from_slice(&sb);
                    let mut slow = fa.clone();
                    reduce_into(dt, op, &mut fa[off..], &fs[off..]).unwrap();
                    scalar::reduce_into(dt, op, &mut slow[off..], &fs[off..]).unwrap();
                    assert!(
                        same_bits_or_both_nan(dt, &fa[off..], &slow[off..]),
                        "{dt} {op} offset {off}"
                    );
                }
            }
        }
    }

    /// Throughput of the kernels against the scalar definition, `REDUCE_BYTES` (default
    /// 16 MiB) per operand, aligned and off by one byte: `cargo test --release -p roce-collectives --lib reduce::tests::throughput
    /// -- --ignored --nocapture`. Prints GB/s of `acc` bytes reduced (figures, not a pass/fail:
    /// record them with the load average).
    #[test]
    #[ignore = "a measurement: run by hand with --ignored --nocapture"]
    fn throughput() {
        use std::time::Instant;
        let bytes: usize = std::env::var("REDUCE_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16 << 20);
        println!("{bytes} bytes per operand");
        let src = vec![1u8; bytes + 8];
        let mut acc = vec![1u8; bytes + 8];
        let gbps = |f: &mut dyn FnMut()| {
            f();
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t = Instant::now();
                f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            bytes as f64 / best / 1e9
        };
        println!(
            "{:<9} {:<5} {:>10} {:>10} {:>10} {:>10}",
            "type", "op", "scalar", "fast", "scalar+1", "fast+1"
        );
        for dt in DataType::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let mut row = Vec::new();
                for off in [0usize, 1] {
                    let (a, s) = (&mut acc[off..off + bytes], &src[..bytes]);
                    row.push(gbps(&mut || scalar::reduce_into(dt, op, a, s).unwrap()));
                    let (a, s) = (&mut acc[off..off + bytes], &src[..bytes]);
                    row.push(gbps(&mut || reduce_into(dt, op, a, s).unwrap()));
                }
                println!(
                    "{:<9} {:<5} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                    dt.name(),
                    op.name(),
                    row[0],
                    row[1],
                    row[2],
                    row[3]
                );
            }
        }
    }

    #[test]
    fn sums_mins_and_averages_unaligned_bytes() {
        let mut acc = [0u8; 13];
        let mut src = [0u8; 13];
        acc[1..].copy_from_slice(bytemuck::cast_slice(&[1i32, -5, 7]));
        src[1..].copy_from_slice(bytemuck::cast_slice(&[2i32, 3, 9]));
        reduce_into(DataType::I32, ReduceOp::Sum, &mut acc[1..], &src[1..]).unwrap();
        let got: Vec<i32> = acc[1..]
            .chunks_exact(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(got, [3, -2, 16]);
        reduce_into(DataType::I32, ReduceOp::Min, &mut acc[1..], &src[1..]).unwrap();
        finish(DataType::I32, ReduceOp::Avg, &mut acc[1..], 2).unwrap();
        let got: Vec<i32> = acc[1..]
            .chunks_exact(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(got, [1, -1, 4]);
    }

    #[test]
    fn misuse_is_a_typed_error() {
        let mut a = [0u8; 4];
        assert!(matches!(
            reduce_into(DataType::F32, ReduceOp::BAnd, &mut a, &[0; 4]),
            Err(CollError::Unsupported { .. })
        ));
        assert!(matches!(
            reduce_into(DataType::F32, ReduceOp::Sum, &mut a, &[0; 3]),
            Err(CollError::InvalidArgument(_))
        ));
        assert!(matches!(
            reduce_into(DataType::I64, ReduceOp::Sum, &mut a, &[0; 4]),
            Err(CollError::InvalidArgument(_))
        ));
    }
}
