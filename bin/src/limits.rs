//! The limits every tool checks its size and count options against before it allocates or
//! opens anything: one clear error line (exit status 1) instead of an abort on a failed
//! allocation or a panic on an overflow later.
//!
//! - A message carries at most 2^31 bytes ([`MAX_MSG_SIZE`], IBTA 9.4.1: the DMA length is
//!   31 bits; our responder refuses more, as rxe). Buffers are at most that plus the 40-byte
//!   UD GRH area, and are allocated with [`buffer`], which fails cleanly.
//! - A queue holds at most [`MAX_QP_WR`] work requests (`ibv_query_device`'s `max_qp_wr`).
//! - A perftest run keeps one timestamp per iteration: at most [`MAX_PERF_ITERS`].
//! - A pingpong run counts `size × iters × 2` bytes: `-n` is at most `u32::MAX` (the stock
//!   tools' `unsigned int`), so that the count fits in 64 bits.
//! - Timeouts are at most [`MAX_TIMEOUT_SECS`] (a deadline past it overflows the clock).

use anyhow::bail;

/// The largest message, in bytes (2^31, IBTA 9.4.1).
pub(crate) const MAX_MSG_SIZE: u64 = 1 << 31;

/// The most work requests a queue holds (`DeviceAttr::max_qp_wr`).
pub(crate) const MAX_QP_WR: u64 = 1 << 14;

/// The most iterations of a perftest run (8 bytes of timestamp each: 800 MB).
pub(crate) const MAX_PERF_ITERS: u64 = 100_000_000;

/// The longest timeout, in seconds (about 31 years).
pub(crate) const MAX_TIMEOUT_SECS: u64 = 1_000_000_000;

/// `size` (option `opt`) is a message size in `min..=MAX_MSG_SIZE`.
pub(crate) fn check_size(opt: &str, size: u64, min: u64) -> anyhow::Result<()> {
    if size < min || size > MAX_MSG_SIZE {
        bail!(
            "{opt} {size}: a message size is between {min} and {MAX_MSG_SIZE} bytes (2^31, the \
             largest RDMA message)"
        );
    }
    Ok(())
}

/// `depth` (option `opt`) is a queue depth in `1..=MAX_QP_WR`.
pub(crate) fn check_depth(opt: &str, depth: u64) -> anyhow::Result<()> {
    if depth == 0 || depth > MAX_QP_WR {
        bail!("{opt} {depth}: a queue depth is between 1 and {MAX_QP_WR} (the device's max_qp_wr)");
    }
    Ok(())
}

/// `n` (option `opt`) is at most `max`, and at least `min`.
pub(crate) fn check_count(opt: &str, n: u64, min: u64, max: u64, why: &str) -> anyhow::Result<()> {
    if n < min || n > max {
        bail!("{opt} {n}: between {min} and {max} ({why})");
    }
    Ok(())
}

/// `secs` (option `opt`) is a positive number of seconds, at most [`MAX_TIMEOUT_SECS`].
pub(crate) fn check_secs(opt: &str, secs: f64) -> anyhow::Result<()> {
    #[allow(clippy::cast_precision_loss)] // 10^9 is exact in f64.
    let max = MAX_TIMEOUT_SECS as f64;
    if !(secs.is_finite() && secs > 0.0 && secs <= max) {
        bail!("{opt} {secs:?}: expected a positive number of seconds, at most {MAX_TIMEOUT_SECS}");
    }
    Ok(())
}

/// A buffer of `len` bytes of `fill`, or an error saying it could not be allocated (instead of
/// the allocator's abort).
pub(crate) fn buffer(len: usize, fill: u8, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        bail!("cannot allocate {len} bytes for {what}");
    }
    v.resize(len, fill);
    Ok(v)
}

/// A zeroed array of `len` timestamps, or an error saying it could not be allocated.
pub(crate) fn timestamps(len: usize) -> anyhow::Result<Vec<u64>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        bail!("cannot allocate {len} timestamps (one per iteration): use a smaller -n");
    }
    v.resize(len, 0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_qp_wr_is_the_devices() {
        let net = roce_transport::SimNetwork::perfect();
        let dev = roce_transport::Device::open(roce_transport::DeviceConfig::sim(
            &net,
            "10.9.9.9".parse().unwrap(),
        ))
        .unwrap();
        assert_eq!(u64::from(dev.query_device().max_qp_wr), MAX_QP_WR);
    }

    #[test]
    fn limits_and_their_messages() {
        assert!(check_size("-s", MAX_MSG_SIZE, 1).is_ok());
        assert!(check_size("-s", 0, 0).is_ok());
        let e = check_size("-s", 99_999_999_999, 1).unwrap_err().to_string();
        assert_eq!(
            e,
            "-s 99999999999: a message size is between 1 and 2147483648 bytes (2^31, the \
             largest RDMA message)"
        );
        assert!(check_size("-s", 0, 1).is_err());
        assert!(check_depth("-t", MAX_QP_WR).is_ok());
        assert!(check_depth("-t", MAX_QP_WR + 1).is_err());
        assert!(check_depth("-t", 0).is_err());
        assert!(check_secs("--timeout", 1e300).is_err());
        assert!(check_secs("--timeout", f64::NAN).is_err());
        assert!(check_secs("--timeout", 0.5).is_ok());
        // The largest timeout still makes a deadline.
        let max = std::time::Duration::from_secs(MAX_TIMEOUT_SECS);
        assert!(std::time::Instant::now().checked_add(max).is_some());
        assert!(buffer(usize::MAX, 0, "the test").is_err());
        assert!(timestamps(usize::MAX / 2).is_err());
        assert_eq!(buffer(3, 7, "x").unwrap(), vec![7; 3]);
    }
}
