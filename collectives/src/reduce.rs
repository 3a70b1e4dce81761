//! Reduction kernels: `acc = op(acc, src)` element by element over byte slices of one
//! [`DataType`], and the final step of [`ReduceOp::Avg`].
//!
//! Integers wrap; `f16`/`bf16` are combined in `f32` and rounded once per step. Slices need no
//! alignment.

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
pub fn reduce_into(
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
pub fn finish(dt: DataType, op: ReduceOp, buf: &mut [u8], nranks: usize) -> Result<(), CollError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
