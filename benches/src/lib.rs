//! rocectl benchmarks.
