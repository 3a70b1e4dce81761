//! Element types and reduction operators, named as nccl-tests names them (`-d float`,
//! `-o sum`), and the [`Element`] trait that ties a Rust type to its [`DataType`].

use std::fmt;

/// The type of the elements of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32` (`float`).
    F32,
    /// `f64` (`double`).
    F64,
    /// IEEE half precision, [`half::f16`] (`half`).
    F16,
    /// bfloat16, [`half::bf16`] (`bfloat16`).
    Bf16,
    /// `i8` (`int8`).
    I8,
    /// `u8` (`uint8`).
    U8,
    /// `i32` (`int32`).
    I32,
    /// `u32` (`uint32`).
    U32,
    /// `i64` (`int64`).
    I64,
    /// `u64` (`uint64`).
    U64,
}

impl DataType {
    /// Every type, in nccl-tests' order for `-d all`.
    pub const ALL: [Self; 10] = [
        Self::I8,
        Self::U8,
        Self::I32,
        Self::U32,
        Self::I64,
        Self::U64,
        Self::F16,
        Self::F32,
        Self::F64,
        Self::Bf16,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::F16 | Self::Bf16 => 2,
            Self::F32 | Self::I32 | Self::U32 => 4,
            Self::F64 | Self::I64 | Self::U64 => 8,
        }
    }

    /// nccl-tests' name (`float`, `bfloat16`, `uint64`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "float",
            Self::F64 => "double",
            Self::F16 => "half",
            Self::Bf16 => "bfloat16",
            Self::I8 => "int8",
            Self::U8 => "uint8",
            Self::I32 => "int32",
            Self::U32 => "uint32",
            Self::I64 => "int64",
            Self::U64 => "uint64",
        }
    }

    /// The type named `name` (nccl-tests' names, plus `f32`, `f64`, `f16`, `bf16`, `i8`…).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| {
            t.name() == name
                || match t {
                    Self::F32 => name == "f32",
                    Self::F64 => name == "f64",
                    Self::F16 => name == "f16",
                    Self::Bf16 => name == "bf16",
                    Self::I8 => name == "i8",
                    Self::U8 => name == "u8",
                    Self::I32 => name == "i32" || name == "int",
                    Self::U32 => name == "u32",
                    Self::I64 => name == "i64",
                    Self::U64 => name == "u64",
                }
        })
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F64 | Self::F16 | Self::Bf16)
    }

    /// Whether `op` is defined on this type (bitwise operators only on integers).
    pub const fn supports(self, op: ReduceOp) -> bool {
        !(self.is_float() && op.is_bitwise())
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping on integers).
    Sum,
    /// Product (wrapping on integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average: the sum divided by the number of ranks (integer division on integers).
    Avg,
    /// Bitwise and (integers only).
    BAnd,
    /// Bitwise or (integers only).
    BOr,
    /// Bitwise exclusive or (integers only).
    BXor,
}

impl ReduceOp {
    /// Every operator, nccl-tests' five (`-o all`) first.
    pub const ALL: [Self; 8] = [
        Self::Sum,
        Self::Prod,
        Self::Max,
        Self::Min,
        Self::Avg,
        Self::BAnd,
        Self::BOr,
        Self::BXor,
    ];

    /// The name (`sum`, `prod`, `min`, `max`, `avg`, `band`, `bor`, `bxor`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
            Self::BAnd => "band",
            Self::BOr => "bor",
            Self::BXor => "bxor",
        }
    }

    /// The operator named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Whether this is a bitwise operator.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, Self::BAnd | Self::BOr | Self::BXor)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is one of the [`DataType`]s: plain old data, any bit pattern valid.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// Its data type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        })*
    };
}

element! {
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => Bf16, i8 => I8, u8 => U8,
    i32 => I32, u32 => U32, i64 => I64, u64 => U64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_the_rust_types() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(o.name()), Some(o));
        }
        assert_eq!(DataType::from_name("quad"), None);
        assert_eq!(f32::DTYPE.size(), size_of::<f32>());
        assert_eq!(half::bf16::DTYPE.size(), size_of::<half::bf16>());
        assert_eq!(u64::DTYPE.size(), size_of::<u64>());
        assert!(!DataType::F16.supports(ReduceOp::BXor));
        assert!(DataType::U8.supports(ReduceOp::BXor));
    }
}
