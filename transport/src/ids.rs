//! Where a device's unpredictable numbers come from: the seeds of its memory-key table, initial
//! PSNs and queue-pair numbers.
//!
//! Off-path injection against a RoCE device needs the destination QPN, a PSN inside the
//! receive window and, for RDMA, an rkey (ReDMArk, USENIX Security 2021). So none of them is
//! derived from a constant: by default a device seeds a ChaCha12 generator ([`StdRng`]) from
//! the operating system ([`SysRng`], `getrandom(2)`), and every rkey seed, PSN and QPN is drawn
//! from it. A test that wants identical runs asks for [`crate::DeviceConfig::seed`]; the
//! generator is then seeded from that value and two devices with the same seed draw the same
//! numbers in the same order.
//!
//! QPNs are drawn at random from `MIN_QPN..=MAX_QPN` (or, under kernel demux, from the
//! process's slot of it: [`Ids::restrict`]) (24 bits, never 0/1, which are SMI/GSI,
//! nor the multicast QPN 0xFF_FFFF), unique among the live QPs, and a freed QPN is not handed
//! out again until [`QUARANTINE`] later QPs have been destroyed, so a stale packet or a late
//! peer of a destroyed QP does not land in its successor.
//!
//! On a device with `n` engines ([`Ids::set_engines`]) a QPN also says which engine owns the
//! QP: `QPN % n`. Each new QP goes to the engine with the fewest live QPs (the lowest index
//! among equals), and its QPN is drawn at random among that engine's.

use std::collections::{HashSet, VecDeque};
use std::io;

use rand::rngs::{StdRng, SysRng};
use rand::{Rng, SeedableRng};

/// Lowest QPN handed out (rxe's `RXE_MIN_QP_INDEX`: the low numbers are special QPs).
pub(crate) const MIN_QPN: u32 = 0x10;
/// Highest QPN handed out (0xFF_FFFF is the multicast QPN).
pub(crate) const MAX_QPN: u32 = 0x00FF_FFFE;
/// How many recently freed QPNs are kept out of circulation.
pub(crate) const QUARANTINE: usize = 4_096;
/// Random draws before falling back to a scan (only a nearly full space needs it).
const DRAWS: usize = 64;

/// A device's random source and its QPN allocator.
#[derive(Debug)]
pub(crate) struct Ids {
    rng: StdRng,
    /// The QPN range (`MIN_QPN..=MAX_QPN`; tests shrink it).
    min: u32,
    max: u32,
    live: HashSet<u32>,
    /// Recently freed QPNs, oldest first, and the same as a set.
    recent: VecDeque<u32>,
    recent_set: HashSet<u32>,
    /// Live QPs per engine (one entry per engine; `[live.len()]` with one engine).
    per_engine: Vec<u32>,
}

impl Ids {
    /// Seeded from `seed` when given, else from the operating system.
    ///
    /// # Errors
    /// The operating system's random source failed (only in early boot or a sandbox without
    /// `getrandom(2)`).
    pub(crate) fn new(seed: Option<u64>) -> io::Result<Self> {
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::try_from_rng(&mut SysRng).map_err(|e| {
                io::Error::other(format!("the OS random source (getrandom) failed: {e}"))
            })?,
        };
        Ok(Self {
            rng,
            min: MIN_QPN,
            max: MAX_QPN,
            live: HashSet::new(),
            recent: VecDeque::new(),
            recent_set: HashSet::new(),
            per_engine: vec![0],
        })
    }

    /// Hands out QPNs from `range` only (kernel demux: this process's slot), clipped to
    /// `MIN_QPN..=MAX_QPN`; an empty result leaves the full range.
    pub(crate) fn restrict(&mut self, range: std::ops::RangeInclusive<u32>) {
        let (min, max) = ((*range.start()).max(MIN_QPN), (*range.end()).min(MAX_QPN));
        if min <= max {
            self.min = min;
            self.max = max;
        }
    }

    /// Spreads QPNs over `n` engines (`QPN % n` is the owner); call before the first QP.
    pub(crate) fn set_engines(&mut self, n: usize) {
        self.per_engine = vec![0; n.max(1)];
    }

    /// The engine that owns `qpn`.
    pub(crate) fn engine_of(&self, qpn: u32) -> usize {
        qpn as usize % self.per_engine.len()
    }

    /// 64 random bits (the key table's seed).
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A random 24-bit PSN.
    pub(crate) fn psn(&mut self) -> u32 {
        self.rng.next_u32() & 0x00FF_FFFF
    }

    /// A QPN no live QP has and no recently destroyed QP had; `None` only when every QPN is
    /// live.
    pub(crate) fn alloc_qpn(&mut self) -> Option<u32> {
        let n = self.per_engine.len() as u32;
        // The least-loaded engine first; any other when its QPNs are all taken.
        let mut order: Vec<u32> = (0..n).collect();
        order.sort_by_key(|&e| (self.per_engine[e as usize], e));
        let q = order.into_iter().find_map(|e| self.alloc_on(e, n))?;
        self.live.insert(q);
        self.per_engine[(q % n) as usize] += 1;
        Some(q)
    }

    /// A free QPN with `QPN % n == engine`, not yet marked live.
    fn alloc_on(&mut self, engine: u32, n: u32) -> Option<u32> {
        let (min, max) = (self.min, self.max);
        let span = max - min + 1;
        let free = |ids: &Self, q: u32| !ids.live.contains(&q) && !ids.recent_set.contains(&q);
        // The QPN of `engine`'s residue class at or above `q`, if still in range.
        let fit = |q: u32| -> Option<u32> {
            let r = (engine + n - q % n) % n;
            q.checked_add(r).filter(|&x| x <= max)
        };
        for _ in 0..DRAWS {
            let Some(q) = fit(min + self.rng.next_u32() % span) else {
                continue;
            };
            if free(self, q) {
                return Some(q);
            }
        }
        // Nearly full: scan from a random point.
        let start = self.rng.next_u32() % span;
        if let Some(q) = (0..span)
            .map(|i| min + (start + i) % span)
            .find(|&q| q % n == engine && free(self, q))
        {
            return Some(q);
        }
        // Everything not live is quarantined: reuse the oldest of this engine's.
        let i = self.recent.iter().position(|&q| q % n == engine)?;
        let q = self.recent.remove(i)?;
        self.recent_set.remove(&q);
        Some(q)
    }

    /// Returns a QPN; it stays out of circulation for the next [`QUARANTINE`] frees.
    pub(crate) fn free_qpn(&mut self, qpn: u32) {
        if !self.live.remove(&qpn) {
            return;
        }
        let e = self.engine_of(qpn);
        self.per_engine[e] = self.per_engine[e].saturating_sub(1);
        if self.recent.len() == QUARANTINE {
            if let Some(old) = self.recent.pop_front() {
                self.recent_set.remove(&old);
            }
        }
        self.recent.push_back(qpn);
        self.recent_set.insert(qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_os_seed_different() {
        let draw = |ids: &mut Ids| {
            (
                ids.next_u64(),
                ids.psn(),
                (0..4).map(|_| ids.alloc_qpn().unwrap()).collect::<Vec<_>>(),
            )
        };
        let (mut a, mut b) = (Ids::new(Some(7)).unwrap(), Ids::new(Some(7)).unwrap());
        assert_eq!(draw(&mut a), draw(&mut b));
        let (mut c, mut d) = (Ids::new(None).unwrap(), Ids::new(None).unwrap());
        let (c, d) = (draw(&mut c), draw(&mut d));
        // 64 + 24 + 4 x 24 random bits: equal only if the OS source is broken.
        assert_ne!(c.0, d.0);
        assert_ne!(c.1, d.1);
        assert_ne!(c.2, d.2);
    }

    #[test]
    fn qpns_are_in_range_unique_and_not_soon_reused() {
        let mut ids = Ids::new(Some(1)).unwrap();
        let mut live = Vec::new();
        let mut freed: VecDeque<u32> = VecDeque::new();
        let mut seq = 0usize;
        for round in 0..50_000u32 {
            if live.len() < 300 || round % 3 == 0 {
                let q = ids.alloc_qpn().unwrap();
                assert!((MIN_QPN..=MAX_QPN).contains(&q), "{q:#x}");
                assert!(!live.contains(&q), "{q:#x} is live");
                assert!(!freed.contains(&q), "{q:#x} was freed recently");
                live.push(q);
            } else {
                // Free a pseudo-random live one.
                seq = seq.wrapping_mul(31).wrapping_add(round as usize);
                let q = live.swap_remove(seq % live.len());
                ids.free_qpn(q);
                freed.push_back(q);
                if freed.len() > QUARANTINE {
                    freed.pop_front();
                }
            }
        }
        // Not sequential: consecutive allocations are not neighbours.
        let a: Vec<u32> = (0..100).map(|_| ids.alloc_qpn().unwrap()).collect();
        let adjacent = a.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(adjacent < 3, "{adjacent} sequential pairs in {a:x?}");
    }

    #[test]
    fn a_restricted_allocator_stays_in_its_range_and_is_random_in_it() {
        let mut ids = Ids::new(None).unwrap();
        ids.restrict(0x2_0000..=0x2_FFFF);
        let got: Vec<u32> = (0..1_000).map(|_| ids.alloc_qpn().unwrap()).collect();
        assert!(
            got.iter().all(|q| (0x2_0000..=0x2_FFFF).contains(q)),
            "{got:x?}"
        );
        let adjacent = got.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(adjacent < 3, "{adjacent} sequential pairs");
        // Slot 0: the reserved QPNs stay out.
        let mut ids = Ids::new(Some(3)).unwrap();
        ids.restrict(0..=0x1F);
        let mut got: Vec<u32> = (0..16).map(|_| ids.alloc_qpn().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (MIN_QPN..=0x1F).collect::<Vec<_>>());
        assert_eq!(ids.alloc_qpn(), None);
    }

    #[test]
    fn a_full_space_scans_then_reuses_the_oldest_freed() {
        let mut ids = Ids::new(Some(2)).unwrap();
        // A small space, so that it fills: 0x10..=0x10F (256 QPNs).
        ids.max = MIN_QPN + 255;
        let mut got: Vec<u32> = (0..256).map(|_| ids.alloc_qpn().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (MIN_QPN..=MIN_QPN + 255).collect::<Vec<_>>());
        assert_eq!(ids.alloc_qpn(), None);
        ids.free_qpn(MIN_QPN + 9);
        ids.free_qpn(MIN_QPN + 10);
        ids.free_qpn(MIN_QPN + 10); // twice: ignored
        assert_eq!(ids.alloc_qpn(), Some(MIN_QPN + 9));
        assert_eq!(ids.alloc_qpn(), Some(MIN_QPN + 10));
        assert_eq!(ids.alloc_qpn(), None);
    }

    /// With 3 engines each QPN's residue names its engine, new QPs go to the least-loaded
    /// engine (lowest index first), and a freed QPN makes its engine the least loaded again.
    #[test]
    fn engines_get_qpns_of_their_residue_least_loaded_first() {
        let mut ids = Ids::new(None).unwrap();
        ids.set_engines(3);
        let got: Vec<u32> = (0..9).map(|_| ids.alloc_qpn().unwrap()).collect();
        let engines: Vec<u32> = got.iter().map(|q| q % 3).collect();
        assert_eq!(engines, vec![0, 1, 2, 0, 1, 2, 0, 1, 2], "{got:x?}");
        assert!(got.iter().all(|q| (MIN_QPN..=MAX_QPN).contains(q)));
        let on_one = got[4];
        ids.free_qpn(on_one);
        assert_eq!(ids.alloc_qpn().unwrap() % 3, 1);
        // A small range: every QPN of each residue is used before the allocator fails.
        let mut ids = Ids::new(Some(5)).unwrap();
        ids.set_engines(2);
        ids.restrict(0..=0x1F);
        let mut got: Vec<u32> = (0..16).map(|_| ids.alloc_qpn().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (MIN_QPN..=0x1F).collect::<Vec<_>>());
        assert_eq!(ids.alloc_qpn(), None);
    }
}
