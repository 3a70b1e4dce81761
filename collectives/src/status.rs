//! The failure state a communicator's operations check while they wait: an abort (local or
//! from another rank) and peers known to have failed. Set by `abort()`, by the monitor
//! connection's reader thread and by the data path; read by every wait loop.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::CollError;

const NONE: usize = usize::MAX;

/// Shared by a communicator, its abort handles, its worker and its monitor thread.
#[derive(Debug)]
pub(crate) struct Status {
    /// This rank.
    pub(crate) rank: usize,
    /// The rank that aborted, `NONE` while none did.
    aborted_by: AtomicUsize,
    /// Whether `failed` holds anything (a cheap check for the wait loops).
    any_failed: AtomicBool,
    /// Failed peers and what was seen, first first.
    failed: Mutex<Vec<(usize, String)>>,
}

impl Status {
    pub(crate) fn new(rank: usize) -> Self {
        Self {
            rank,
            aborted_by: AtomicUsize::new(NONE),
            any_failed: AtomicBool::new(false),
            failed: Mutex::new(Vec::new()),
        }
    }

    /// Records an abort by `by` (the first one wins). Returns whether it was the first.
    pub(crate) fn set_aborted(&self, by: usize) -> bool {
        self.aborted_by
            .compare_exchange(NONE, by, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The rank that aborted, if any.
    pub(crate) fn aborted_by(&self) -> Option<usize> {
        let v = self.aborted_by.load(Ordering::Acquire);
        (v != NONE).then_some(v)
    }

    /// Records that `peer` failed (once per peer).
    pub(crate) fn set_failed(&self, peer: usize, reason: impl Into<String>) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if !f.iter().any(|(p, _)| *p == peer) {
            f.push((peer, reason.into()));
        }
        self.any_failed.store(true, Ordering::Release);
    }

    /// The peers known to have failed.
    pub(crate) fn failed(&self) -> Vec<(usize, String)> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error an operation in `phase` fails with now, if any: an abort first, then the
    /// first failed peer.
    pub(crate) fn check(&self, phase: &dyn Fn() -> String) -> Result<(), CollError> {
        if let Some(by) = self.aborted_by() {
            return Err(CollError::Aborted {
                rank: self.rank,
                by_rank: by,
                phase: phase(),
            });
        }
        if self.any_failed.load(Ordering::Acquire) {
            if let Some((peer, reason)) = self.failed().into_iter().next() {
                return Err(CollError::PeerFailed {
                    rank: self.rank,
                    peer,
                    phase: phase(),
                    reason,
                });
            }
        }
        Ok(())
    }
}
