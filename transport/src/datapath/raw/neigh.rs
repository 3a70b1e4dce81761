//! The neighbour table: which MAC address each peer IP address has, and the datagrams waiting
//! for an answer. Sans-IO: time comes in, solicitations and verdicts come out.
//!
//! States (a small version of the kernel's, `net/core/neighbour.c`):
//!
//! ```text
//!            lookup                    reply             ttl passes        reply
//!   (none) ---------> Incomplete ----------> Reachable ------------> Stale -------> Reachable
//!                      |  attempts run out                             | attempts run out
//!                      v                                               v
//!                    Failed (for fail_hold; then a lookup starts over)
//! ```
//!
//! A `Stale` entry still sends: it is being re-confirmed in the background. Static entries
//! never change.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Timing and size limits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    /// Solicitations sent before giving up.
    pub(super) attempts: u32,
    /// Time between solicitations.
    pub(super) interval: Duration,
    /// How long an answer stays good before it is re-confirmed.
    pub(super) ttl: Duration,
    /// How long a failed address fails sends at once before it is tried again.
    pub(super) fail_hold: Duration,
    /// Datagrams held per unresolved address.
    pub(super) queue_len: usize,
    /// Unresolved addresses at a time.
    pub(super) max_unresolved: usize,
}

/// A datagram waiting for its next hop's MAC address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pending {
    /// Destination address and port.
    pub(super) dst: SocketAddr,
    /// UDP source port.
    pub(super) src_port: u16,
    /// TOS / traffic class.
    pub(super) tos: u8,
    /// TTL / hop limit.
    pub(super) hop_limit: u8,
    /// IPv6 flow label.
    pub(super) flow_label: u32,
    /// UDP payload.
    pub(super) payload: Vec<u8>,
}

/// What to do with a datagram for an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Send it to this MAC address.
    Mac([u8; 6]),
    /// Queue it ([`Table::enqueue`]); resolution is under way.
    Queue,
    /// Resolution failed recently (or too many addresses are unresolved): refuse it.
    Unreachable,
}

#[derive(Debug)]
enum State {
    Static([u8; 6]),
    Incomplete {
        attempts: u32,
        next: Instant,
        queue: VecDeque<Pending>,
    },
    Reachable {
        mac: [u8; 6],
        confirmed: Instant,
        /// Re-confirmation under way: attempts made, next one due.
        probe: Option<(u32, Instant)>,
    },
    Failed {
        until: Instant,
    },
}

/// Results of [`Table::poll`].
#[derive(Debug, Default)]
pub(super) struct Poll {
    /// Addresses to send a solicitation for now.
    pub(super) solicit: Vec<IpAddr>,
    /// Addresses that just failed, with how many queued datagrams were dropped.
    pub(super) failed: Vec<(IpAddr, usize)>,
}

/// The neighbour table.
#[derive(Debug)]
pub(super) struct Table {
    cfg: Config,
    entries: HashMap<IpAddr, State>,
    unresolved: usize,
    /// No timer is due before this (it may be early, never late); recomputed by `poll`, so
    /// the hot path does not scan the table.
    deadline: Option<Instant>,
}

impl Table {
    /// An empty table.
    pub(super) fn new(cfg: Config) -> Self {
        Self {
            cfg,
            entries: HashMap::new(),
            unresolved: 0,
            deadline: None,
        }
    }

    /// Adds a permanent entry.
    pub(super) fn insert_static(&mut self, ip: IpAddr, mac: [u8; 6]) {
        if let Some(State::Incomplete { .. }) = self.entries.insert(ip, State::Static(mac)) {
            self.unresolved -= 1;
        }
    }

    /// The MAC address of `ip`, if known.
    pub(super) fn mac(&self, ip: IpAddr) -> Option<[u8; 6]> {
        match self.entries.get(&ip)? {
            State::Static(mac) | State::Reachable { mac, .. } => Some(*mac),
            _ => None,
        }
    }

    /// Decides what to do with a datagram for `ip`, starting resolution if needed.
    pub(super) fn lookup(&mut self, now: Instant, ip: IpAddr) -> Lookup {
        let cfg = self.cfg;
        match self.entries.get_mut(&ip) {
            Some(State::Static(mac)) => Lookup::Mac(*mac),
            Some(State::Reachable {
                mac,
                confirmed,
                probe,
            }) => {
                if probe.is_none() && now.saturating_duration_since(*confirmed) >= cfg.ttl {
                    *probe = Some((0, now));
                    self.deadline = Some(now);
                }
                Lookup::Mac(*mac)
            }
            Some(State::Incomplete { .. }) => Lookup::Queue,
            Some(State::Failed { until }) if now < *until => Lookup::Unreachable,
            _ => {
                if self.unresolved >= cfg.max_unresolved {
                    return Lookup::Unreachable;
                }
                self.unresolved += 1;
                self.deadline = Some(now);
                self.entries.insert(
                    ip,
                    State::Incomplete {
                        attempts: 0,
                        next: now,
                        queue: VecDeque::new(),
                    },
                );
                Lookup::Queue
            }
        }
    }

    /// Queues a datagram for `ip` (after [`Lookup::Queue`]); returns how many older ones were
    /// dropped to make room (0 or 1).
    pub(super) fn enqueue(&mut self, ip: IpAddr, p: Pending) -> usize {
        let limit = self.cfg.queue_len.max(1);
        match self.entries.get_mut(&ip) {
            Some(State::Incomplete { queue, .. }) => {
                let dropped = usize::from(queue.len() >= limit);
                if dropped > 0 {
                    queue.pop_front();
                }
                queue.push_back(p);
                dropped
            }
            // Not unresolved: the caller broke the protocol; the datagram is lost.
            _ => 1,
        }
    }

    /// Records that `ip` is at `mac`. `create`: add an entry if there is none (a peer asking
    /// for us is about to talk to us); otherwise only entries we asked about are updated.
    /// Returns the datagrams that were waiting for this answer.
    pub(super) fn learn(
        &mut self,
        now: Instant,
        ip: IpAddr,
        mac: [u8; 6],
        create: bool,
    ) -> Vec<Pending> {
        let reachable = State::Reachable {
            mac,
            confirmed: now,
            probe: None,
        };
        match self.entries.get_mut(&ip) {
            Some(State::Static(_)) => Vec::new(),
            Some(state) => match std::mem::replace(state, reachable) {
                State::Incomplete { queue, .. } => {
                    self.unresolved -= 1;
                    queue.into()
                }
                _ => Vec::new(),
            },
            None => {
                if create && !is_unspecified(ip) {
                    self.entries.insert(ip, reachable);
                }
                Vec::new()
            }
        }
    }

    /// Fires due timers: solicitations to send, and addresses that ran out of attempts.
    pub(super) fn poll(&mut self, now: Instant, out: &mut Poll) {
        let cfg = self.cfg;
        let mut newly_failed = 0;
        for (&ip, state) in &mut self.entries {
            let verdict = match state {
                State::Incomplete {
                    attempts,
                    next,
                    queue,
                } if *next <= now => {
                    if *attempts < cfg.attempts {
                        *attempts += 1;
                        *next = now + cfg.interval;
                        out.solicit.push(ip);
                        None
                    } else {
                        newly_failed += 1;
                        Some(queue.len())
                    }
                }
                State::Reachable {
                    probe: Some((attempts, next)),
                    ..
                } if *next <= now => {
                    if *attempts < cfg.attempts {
                        *attempts += 1;
                        *next = now + cfg.interval;
                        out.solicit.push(ip);
                        None
                    } else {
                        Some(0)
                    }
                }
                _ => None,
            };
            if let Some(dropped) = verdict {
                *state = State::Failed {
                    until: now + cfg.fail_hold,
                };
                out.failed.push((ip, dropped));
            }
        }
        self.unresolved -= newly_failed;
        // Forget failures long past, so the table does not grow without bound.
        self.entries.retain(|_, s| match s {
            State::Failed { until } => now.saturating_duration_since(*until) < cfg.ttl,
            _ => true,
        });
        self.deadline = self.scan_deadline();
    }

    /// When [`Self::poll`] next has something to do (perhaps earlier: then it finds nothing
    /// and says the real time).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn scan_deadline(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|s| match s {
                State::Incomplete { next, .. } => Some(*next),
                State::Reachable {
                    probe: Some((_, next)),
                    ..
                } => Some(*next),
                _ => None,
            })
            .min()
    }
}

fn is_unspecified(ip: IpAddr) -> bool {
    ip.is_unspecified() || ip.is_multicast()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn cfg() -> Config {
        Config {
            attempts: 3,
            interval: Duration::from_millis(100),
            ttl: Duration::from_secs(10),
            fail_hold: Duration::from_secs(1),
            queue_len: 2,
            max_unresolved: 2,
        }
    }

    fn pending(n: u8) -> Pending {
        Pending {
            dst: "10.0.0.2:4791".parse().unwrap(),
            src_port: 1,
            tos: 0,
            hop_limit: 64,
            flow_label: 0,
            payload: vec![n],
        }
    }

    #[test]
    fn resolves_and_hands_back_the_queue() {
        let t0 = Instant::now();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t = Table::new(cfg());
        assert_eq!(t.lookup(t0, ip), Lookup::Queue);
        for n in 0..3 {
            t.enqueue(ip, pending(n));
        }
        let mut p = Poll::default();
        t.poll(t0, &mut p);
        assert_eq!(p.solicit, vec![ip]);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(100)));
        // Only the last two fit.
        let q = t.learn(t0, ip, MAC, false);
        assert_eq!(q, vec![pending(1), pending(2)]);
        assert_eq!(t.lookup(t0, ip), Lookup::Mac(MAC));
        // The deadline may be early until the next poll, which finds nothing to do.
        let mut p = Poll::default();
        t.poll(t0 + Duration::from_millis(100), &mut p);
        assert!(p.solicit.is_empty() && p.failed.is_empty());
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.unresolved, 0);
    }

    #[test]
    fn gives_up_after_the_attempts_and_holds_the_failure() {
        let t0 = Instant::now();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t = Table::new(cfg());
        assert_eq!(t.lookup(t0, ip), Lookup::Queue);
        t.enqueue(ip, pending(0));
        let mut sent = 0;
        let mut failed = Vec::new();
        for ms in (0..1000).step_by(10) {
            let mut p = Poll::default();
            t.poll(t0 + Duration::from_millis(ms), &mut p);
            sent += p.solicit.len();
            failed.extend(p.failed);
        }
        assert_eq!(sent, 3);
        assert_eq!(failed, vec![(ip, 1)]);
        assert_eq!(
            t.lookup(t0 + Duration::from_millis(999), ip),
            Lookup::Unreachable
        );
        // After the hold, it starts over.
        assert_eq!(t.lookup(t0 + Duration::from_secs(2), ip), Lookup::Queue);
    }

    #[test]
    fn stale_entries_keep_sending_while_reconfirmed() {
        let t0 = Instant::now();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t = Table::new(cfg());
        t.learn(t0, ip, MAC, true);
        let later = t0 + Duration::from_secs(11);
        assert_eq!(t.lookup(later, ip), Lookup::Mac(MAC));
        let mut p = Poll::default();
        t.poll(later, &mut p);
        assert_eq!(p.solicit, vec![ip]);
        t.learn(later, ip, [2, 0, 0, 0, 0, 8], false);
        assert_eq!(t.lookup(later, ip), Lookup::Mac([2, 0, 0, 0, 0, 8]));
        t.poll(later, &mut p);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn learns_only_what_it_asked_unless_told_to_create() {
        let t0 = Instant::now();
        let ip: IpAddr = "10.0.0.3".parse().unwrap();
        let mut t = Table::new(cfg());
        t.learn(t0, ip, MAC, false);
        assert_eq!(t.mac(ip), None);
        t.learn(t0, ip, MAC, true);
        assert_eq!(t.mac(ip), Some(MAC));
        t.insert_static(ip, [1; 6]);
        t.learn(t0, ip, MAC, true);
        assert_eq!(t.mac(ip), Some([1; 6]));
    }

    #[test]
    fn bounds_unresolved_addresses() {
        let t0 = Instant::now();
        let mut t = Table::new(cfg());
        assert_eq!(t.lookup(t0, "10.0.0.2".parse().unwrap()), Lookup::Queue);
        assert_eq!(t.lookup(t0, "10.0.0.3".parse().unwrap()), Lookup::Queue);
        assert_eq!(
            t.lookup(t0, "10.0.0.4".parse().unwrap()),
            Lookup::Unreachable
        );
    }
}
