//! The clock the engine and the simulated datapaths read: injected, so a whole device can run
//! on virtual time.
//!
//! Time is `roce_qp`'s [`Instant`] (nanoseconds from an arbitrary epoch), the type the queue
//! pairs already take. A device reads its clock once per progress pass; the fault injector
//! reads it per batch. [`SystemClock`] (the default) follows the monotonic wall clock;
//! [`VirtualClock`] moves only when told, so a scenario driven with [`crate::Progress::Manual`]
//! replays exactly from its seed.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A point in time on a [`Clock`]: `roce_qp`'s nanoseconds from an arbitrary epoch.
pub use roce_qp::Instant;

/// A source of the current time. Must be monotonic (never go back).
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Instant;
}

/// The monotonic wall clock, counted from when the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    /// A clock reading 0 now.
    pub fn new() -> Self {
        Self {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }
}

/// A clock that moves only when told to; clones share the time.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock reading 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::AcqRel,
        );
    }

    /// Moves the clock to `t` if that is later than now (it never goes back).
    pub fn advance_to(&self, t: Instant) {
        self.0.fetch_max(t.as_nanos(), Ordering::AcqRel);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.load(Ordering::Acquire))
    }
}

/// The default clock of a device or network: the system clock.
pub(crate) fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

/// Nanoseconds from `now` until `t` (zero if `t` has passed).
pub(crate) fn until(now: Instant, t: Instant) -> Duration {
    Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_clock_moves_only_forward_and_clones_share_it() {
        let c = VirtualClock::new();
        let d = c.clone();
        assert_eq!(c.now(), Instant::ZERO);
        c.advance(Duration::from_micros(3));
        assert_eq!(d.now().as_nanos(), 3_000);
        d.advance_to(Instant::from_nanos(1_000));
        assert_eq!(c.now().as_nanos(), 3_000);
        d.advance_to(Instant::from_nanos(10_000));
        assert_eq!(c.now().as_nanos(), 10_000);
    }

    #[test]
    fn the_system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = c.now();
        assert!(b.as_nanos() >= a.as_nanos() + 2_000_000);
        assert_eq!(until(b, a), Duration::ZERO);
        assert_eq!(
            until(a, b),
            Duration::from_nanos(b.as_nanos() - a.as_nanos())
        );
    }
}
