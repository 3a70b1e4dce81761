//! The timers of a queue pair.

use crate::time::Instant;

/// A QP timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// Local ACK timeout of the RC requester: 4.096 us x 2^timeout after the last progress
    /// while packets are outstanding; fires a go-back-N retry (costs one of `retry_cnt`).
    AckTimeout,
    /// RNR wait of the RC requester: after an RNR NAK, the encoded time before resending.
    Rnr,
    /// Early retransmission of the RC requester: packets outstanding with no progress for
    /// several smoothed round trips (at least `QpConfig::early_retransmit_min_ns`, doubling
    /// per probe without progress) are sent again from the oldest unacknowledged PSN. Unlike
    /// [`Timer::AckTimeout`] it spends no retry and does not delay the ACK timeout.
    Probe,
}

impl Timer {
    /// Every timer, in table order.
    pub const VALUES: [Self; 3] = [Self::AckTimeout, Self::Rnr, Self::Probe];
}

/// Deadlines of every [`Timer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerTable([Option<Instant>; Timer::VALUES.len()]);

impl TimerTable {
    /// Arms `timer` for `at`.
    pub fn set(&mut self, timer: Timer, at: Instant) {
        self.0[timer as usize] = Some(at);
    }
    /// Disarms `timer`.
    pub fn stop(&mut self, timer: Timer) {
        self.0[timer as usize] = None;
    }
    /// The deadline of `timer`.
    pub fn get(&self, timer: Timer) -> Option<Instant> {
        self.0[timer as usize]
    }
    /// Whether `timer` is armed.
    pub fn is_set(&self, timer: Timer) -> bool {
        self.0[timer as usize].is_some()
    }
    /// The earliest deadline.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
    /// Disarms `timer` and returns true if it had expired at `now`.
    pub fn take_expired(&mut self, timer: Timer, now: Instant) -> bool {
        match self.0[timer as usize] {
            Some(t) if t <= now => {
                self.0[timer as usize] = None;
                true
            }
            _ => false,
        }
    }
    /// Disarms everything.
    pub fn clear(&mut self) {
        self.0 = [None; Timer::VALUES.len()];
    }
}
