//! One fault model for simulated links, and the seeded RNG every simulation draws from.
//!
//! Both simulators of the stack use this module, so a knob means the same thing at every
//! layer: the queue-pair simulator (`testing`, behind the `testing` feature) and the
//! transport's `FaultInjector` middleware (which wraps any datapath, and which its `sim`
//! backend uses). The model only *decides*: [`FaultModel::offer`] takes the length of a
//! datagram and returns a [`Verdict`] (lost, or up to two copies, each with a delay and maybe a
//! flipped bit); the caller owns the bytes, the clock and the queue of packets in flight.
//!
//! # The model, in the order the RNG is drawn
//!
//! For every datagram offered:
//!
//! 1. **Gilbert-Elliott burst loss**: in the good state the link enters the bad state with
//!    probability [`LinkConfig::burst_start`]; in the bad state it leaves with probability
//!    [`LinkConfig::burst_end`], and, offered with a time ([`FaultModel::offer_at`]), when
//!    the bad state began [`LinkConfig::burst_max_ns`] or more before (the draw is made
//!    either way, so a bound changes no other decision). Every datagram offered in the bad
//!    state is lost.
//! 2. **Independent loss** with probability [`LinkConfig::loss`].
//! 3. **Duplication** with probability [`LinkConfig::duplicate`]: two copies instead of one.
//!
//! Then for each copy:
//!
//! 4. **Corruption** with probability [`LinkConfig::corrupt`]: one uniformly chosen bit of the
//!    datagram (the UDP payload, BTH .. ICRC) flips; the receiver's ICRC check catches it.
//! 5. **Delay**: [`LinkConfig::delay_ns`] plus a uniform jitter in `0..=jitter_ns`.
//! 6. **Reordering** with probability [`LinkConfig::reorder`]: an extra delay uniform in
//!    `1..=reorder_delay_ns`, so the copy arrives after datagrams sent later.
//!
//! Every decision is a pure function of the seed and the sequence of offers: the same seed
//! and the same traffic replay the same faults.

use rand::rngs::ChaCha8Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};

/// The seeded generator every simulation uses (ChaCha8: portable, reproducible across
/// platforms and versions of this crate).
#[derive(Debug)]
pub struct SimRng(ChaCha8Rng);

impl SimRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// True with probability `p` (never for `p <= 0`, always for `p >= 1`).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        self.0.random_bool(p)
    }

    /// A value in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.0.random_range(0..n)
    }

    /// A value in `0..=n`.
    pub fn up_to(&mut self, n: u64) -> u64 {
        self.0.random_range(0..=n)
    }
}

/// Faults of one link direction. Probabilities are per datagram; see the module docs for the
/// exact model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Independent loss.
    pub loss: f64,
    /// Gilbert-Elliott burst loss: chance to enter the bad state (where every packet is lost).
    pub burst_start: f64,
    /// Chance to leave the bad state.
    pub burst_end: f64,
    /// Longest time the bad state lasts, in ns (0: no bound). The state changes per datagram
    /// offered, so without a bound a burst spans as much time as the traffic takes to offer
    /// its datagrams: one retry per ACK timeout stretches a burst of a few datagrams over
    /// several timeouts, which a congested or flapping link does not do. Applies to
    /// [`FaultModel::offer_at`] only.
    pub burst_max_ns: u64,
    /// Duplication.
    pub duplicate: f64,
    /// Reordering: the packet gets an extra delay uniform in `1..=reorder_delay_ns`.
    pub reorder: f64,
    /// Most extra delay of a reordered packet.
    pub reorder_delay_ns: u64,
    /// Corruption: one random bit of the datagram (BTH .. ICRC) flips.
    pub corrupt: f64,
    /// One-way delay.
    pub delay_ns: u64,
    /// Uniform jitter in `0..=jitter_ns` added to the delay (keeps order unless reordering is
    /// on or the jitter exceeds the gap between packets).
    pub jitter_ns: u64,
}

impl LinkConfig {
    /// A perfect link with 5 us of delay.
    pub const fn perfect() -> Self {
        Self {
            loss: 0.0,
            burst_start: 0.0,
            burst_end: 1.0,
            burst_max_ns: 0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay_ns: 0,
            corrupt: 0.0,
            delay_ns: 5_000,
            jitter_ns: 0,
        }
    }

    /// A link that loses every packet.
    pub const fn dead() -> Self {
        Self {
            loss: 1.0,
            ..Self::perfect()
        }
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self::perfect()
    }
}

/// What the model did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Datagrams offered.
    pub offered: u64,
    /// Lost (independent or burst loss).
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Copies with a flipped bit.
    pub corrupted: u64,
    /// Copies held back to arrive after later ones.
    pub reordered: u64,
}

/// One copy of a datagram that survives the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Nanoseconds from the offer until it arrives.
    pub delay_ns: u64,
    /// The bit to flip: byte index into the datagram and bit mask.
    pub corrupt: Option<(usize, u8)>,
    /// It was given a reordering delay.
    pub reordered: bool,
}

impl Delivery {
    /// Applies the corruption, if any, to `datagram` (the bytes that were offered).
    pub fn apply(&self, datagram: &mut [u8]) {
        if let Some((at, mask)) = self.corrupt {
            if let Some(b) = datagram.get_mut(at) {
                *b ^= mask;
            }
        }
    }
}

/// The fate of one offered datagram: no copy (lost), one, or two (duplicated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Verdict {
    copies: [Option<Delivery>; 2],
}

impl Verdict {
    /// The copies to deliver, in the order they were decided.
    pub fn copies(&self) -> impl Iterator<Item = Delivery> + '_ {
        self.copies.iter().flatten().copied()
    }

    /// Whether the datagram was lost.
    pub fn is_lost(&self) -> bool {
        self.copies[0].is_none()
    }
}

/// The fault model of one link direction: a [`LinkConfig`], the burst state and its RNG.
#[derive(Debug)]
pub struct FaultModel {
    cfg: LinkConfig,
    rng: SimRng,
    in_burst: bool,
    /// When the bad state began (`offer_at`'s clock; 0 when offered without a time).
    burst_since_ns: u64,
    stats: FaultStats,
}

impl FaultModel {
    /// A link behaving as `cfg`, its faults drawn from `seed`.
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: SimRng::new(seed),
            in_burst: false,
            burst_since_ns: 0,
            stats: FaultStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> LinkConfig {
        self.cfg
    }

    /// Changes the configuration from the next offer on (the RNG and burst state carry on).
    pub fn set_config(&mut self, cfg: LinkConfig) {
        self.cfg = cfg;
    }

    /// What the model did so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Decides the fate of a datagram of `len` bytes (see the module docs for the order of
    /// decisions).
    pub fn offer(&mut self, len: usize) -> Verdict {
        self.decide(len, None)
    }

    /// [`Self::offer`] at `now_ns` (any monotonic clock in ns): the same decisions, and a bad
    /// state that began [`LinkConfig::burst_max_ns`] or more before `now_ns` ends.
    pub fn offer_at(&mut self, len: usize, now_ns: u64) -> Verdict {
        self.decide(len, Some(now_ns))
    }

    fn decide(&mut self, len: usize, now_ns: Option<u64>) -> Verdict {
        self.stats.offered += 1;
        let c = self.cfg;
        if self.in_burst {
            // Drawn whatever the bound says: the RNG stream is the same with and without one.
            let end = self.rng.chance(c.burst_end);
            let expired = c.burst_max_ns > 0
                && now_ns.is_some_and(|t| t.saturating_sub(self.burst_since_ns) >= c.burst_max_ns);
            if end || expired {
                self.in_burst = false;
            }
        } else if self.rng.chance(c.burst_start) {
            self.in_burst = true;
            self.burst_since_ns = now_ns.unwrap_or(0);
        }
        if self.in_burst || self.rng.chance(c.loss) {
            self.stats.lost += 1;
            return Verdict::default();
        }
        let n = if self.rng.chance(c.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let mut verdict = Verdict::default();
        for slot in verdict.copies.iter_mut().take(n) {
            let corrupt = if len > 0 && self.rng.chance(c.corrupt) {
                self.stats.corrupted += 1;
                let at = self.rng.below(len as u64) as usize;
                Some((at, 1u8 << self.rng.below(8)))
            } else {
                None
            };
            let mut delay_ns = c.delay_ns;
            if c.jitter_ns > 0 {
                delay_ns += self.rng.up_to(c.jitter_ns);
            }
            let reordered = self.rng.chance(c.reorder);
            if reordered {
                self.stats.reordered += 1;
                delay_ns += 1 + self.rng.below(c.reorder_delay_ns.max(1));
            }
            *slot = Some(Delivery {
                delay_ns,
                corrupt,
                reordered,
            });
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cfg: LinkConfig, seed: u64, n: usize) -> (Vec<Verdict>, FaultStats) {
        let mut m = FaultModel::new(cfg, seed);
        let v = (0..n).map(|_| m.offer(100)).collect();
        (v, m.stats())
    }

    #[test]
    fn a_perfect_link_delivers_every_datagram_once_after_the_delay() {
        let (v, s) = run(LinkConfig::perfect(), 1, 1000);
        for d in &v {
            let copies: Vec<_> = d.copies().collect();
            assert_eq!(
                copies,
                [Delivery {
                    delay_ns: 5_000,
                    corrupt: None,
                    reordered: false
                }]
            );
        }
        assert_eq!(
            s,
            FaultStats {
                offered: 1000,
                ..FaultStats::default()
            }
        );
    }

    #[test]
    fn the_same_seed_replays_the_same_faults_and_another_seed_does_not() {
        let cfg = LinkConfig {
            loss: 0.1,
            burst_start: 0.01,
            burst_end: 0.3,
            burst_max_ns: 0,
            duplicate: 0.05,
            reorder: 0.05,
            reorder_delay_ns: 50_000,
            corrupt: 0.05,
            delay_ns: 1_000,
            jitter_ns: 500,
        };
        assert_eq!(run(cfg, 9, 5000), run(cfg, 9, 5000));
        assert_ne!(run(cfg, 9, 5000).0, run(cfg, 10, 5000).0);
    }

    #[test]
    fn rates_match_the_configuration() {
        let cfg = LinkConfig {
            loss: 0.2,
            duplicate: 0.1,
            reorder: 0.1,
            reorder_delay_ns: 1_000,
            corrupt: 0.1,
            delay_ns: 0,
            jitter_ns: 100,
            ..LinkConfig::perfect()
        };
        let (v, s) = run(cfg, 3, 20_000);
        assert!((3_600..4_400).contains(&s.lost), "{s:?}");
        assert_eq!(v.iter().filter(|d| d.is_lost()).count() as u64, s.lost);
        let survivors = s.offered - s.lost;
        let dup_pct = s.duplicated * 100 / survivors;
        assert!((8..12).contains(&dup_pct), "{s:?}");
        let copies: Vec<Delivery> = v.iter().flat_map(|d| d.copies()).collect();
        assert_eq!(copies.len() as u64, survivors + s.duplicated);
        assert_eq!(
            copies.iter().filter(|c| c.corrupt.is_some()).count() as u64,
            s.corrupted
        );
        for c in &copies {
            // Jitter is 0..=100; a reordered copy gets 1..=1000 more.
            let max = if c.reordered { 1_100 } else { 100 };
            let min = u64::from(c.reordered);
            assert!((min..=max).contains(&c.delay_ns), "{c:?}");
            if let Some((at, mask)) = c.corrupt {
                assert!(at < 100 && mask.count_ones() == 1, "{c:?}");
            }
        }
        // The jitter's upper end is reachable (the range is inclusive).
        assert!(copies.iter().any(|c| !c.reordered && c.delay_ns == 100));
    }

    #[test]
    fn burst_loss_loses_runs() {
        let cfg = LinkConfig {
            burst_start: 0.01,
            burst_end: 0.1,
            burst_max_ns: 0,
            ..LinkConfig::perfect()
        };
        let (v, s) = run(cfg, 5, 20_000);
        assert!(s.lost > 0);
        let longest = v
            .split(|d| !d.is_lost())
            .map(<[Verdict]>::len)
            .max()
            .unwrap_or(0);
        assert!(longest >= 10, "bursts should lose runs, longest {longest}");
    }

    /// Sparse traffic (one datagram per 1 ms, as retries per ACK timeout): without a bound a
    /// burst that never ends by chance (`burst_end` 0) loses everything after it began; with
    /// `burst_max_ns` it ends at the first offer that much later, and the RNG draws (so every
    /// other decision) are the same as without the bound.
    #[test]
    fn a_burst_ends_after_its_time_bound() {
        let cfg = LinkConfig {
            burst_start: 0.2,
            burst_end: 0.0,
            ..LinkConfig::perfect()
        };
        let offers = |cfg: LinkConfig| {
            let mut m = FaultModel::new(cfg, 7);
            (0..200u64)
                .map(|i| m.offer_at(100, i * 1_000_000))
                .collect::<Vec<_>>()
        };
        let unbounded = offers(cfg);
        let first = unbounded
            .iter()
            .position(Verdict::is_lost)
            .expect("a burst began");
        assert!(unbounded[first..].iter().all(Verdict::is_lost));
        let bounded = offers(LinkConfig {
            burst_max_ns: 3_500_000,
            ..cfg
        });
        // Lost at +0, +1, +2 and +3 ms (still under 3.5 ms), delivered at +4 ms (the offer
        // that ends a burst does not draw for a new one).
        assert!(bounded[first..first + 4].iter().all(Verdict::is_lost));
        assert!(!bounded[first + 4].is_lost());
        assert!(bounded.iter().filter(|d| !d.is_lost()).count() > 100);
        let mut longest = 0;
        let mut run = 0;
        for d in &bounded {
            run = if d.is_lost() { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        // Every burst lasts exactly 4 offers here (`burst_end` 0), and at least one delivered
        // offer separates two.
        assert_eq!(longest, 4);
        // Offered without a time, the bound does not apply.
        let mut m = FaultModel::new(
            LinkConfig {
                burst_max_ns: 1,
                ..cfg
            },
            7,
        );
        let untimed: Vec<_> = (0..200).map(|_| m.offer(100)).collect();
        assert!(untimed[first..].iter().all(Verdict::is_lost));
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let d = Delivery {
            delay_ns: 0,
            corrupt: Some((3, 0x10)),
            reordered: false,
        };
        let mut b = [0u8; 8];
        d.apply(&mut b);
        assert_eq!(b, [0, 0, 0, 0x10, 0, 0, 0, 0]);
        let mut short = [0u8; 2];
        d.apply(&mut short);
        assert_eq!(short, [0, 0]);
    }

    #[test]
    fn chance_and_below_respect_their_bounds() {
        let mut r = SimRng::new(1);
        assert!((0..1000).all(|_| !r.chance(0.0) && r.chance(1.0)));
        assert_eq!(r.below(0), 0);
        assert!((0..1000).all(|_| r.below(7) < 7 && r.up_to(7) <= 7));
    }
}
