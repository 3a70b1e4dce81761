//! Communicator options: timeout, algorithm, chunking, slots, QPs per peer, determinism,
//! waiting mode and which device to open; and how they are read from the environment.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use roce_transport::DeviceConfig;

use crate::error::CollError;

/// Which algorithm an allreduce (and, where it applies, the other collectives) uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Chosen per call by message size: recursive doubling up to
    /// [`CommOptions::small_bytes`], the pipelined ring above. (With
    /// [`CommOptions::deterministic`]: [`Self::Direct`] while (n−1)·S stays within half of
    /// `small_bytes`, else a direct reduce-scatter then a ring allgather.)
    #[default]
    Auto,
    /// Pipelined ring: reduce-scatter then allgather, 2(n−1)/n·S bytes per rank; every chunk
    /// of one step is forwarded as soon as it has been reduced.
    Ring,
    /// Recursive halving (reduce-scatter) then recursive doubling (allgather) — Rabenseifner;
    /// a rank count that is not a power of two folds the extra ranks in first.
    HalvingDoubling,
    /// Recursive doubling of the whole vector: log2(n) exchanges, the latency-optimal one;
    /// the same fold for rank counts that are not powers of two.
    RecursiveDoubling,
    /// One round: every rank sends its whole vector to every other and folds the n vectors
    /// in rank order (latency-optimal for small vectors on few ranks; (n−1)·S bytes per
    /// rank).
    Direct,
}

impl Algorithm {
    /// The short name (`auto`, `ring`, `hd`, `rd`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ring => "ring",
            Self::HalvingDoubling => "hd",
            Self::RecursiveDoubling => "rd",
            Self::Direct => "direct",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = CollError;

    fn from_str(s: &str) -> Result<Self, CollError> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "ring" => Ok(Self::Ring),
            "hd" | "halving-doubling" | "halving_doubling" | "rabenseifner" => {
                Ok(Self::HalvingDoubling)
            }
            "rd" | "recursive-doubling" | "recursive_doubling" => Ok(Self::RecursiveDoubling),
            "direct" => Ok(Self::Direct),
            other => Err(CollError::InvalidArgument(format!(
                "unknown algorithm {other:?} (auto, ring, hd, rd, direct)"
            ))),
        }
    }
}

/// Builds the device configuration of one rank (see [`DeviceChoice::Config`]).
pub type DeviceConfigFn = Arc<dyn Fn(usize) -> DeviceConfig + Send + Sync>;

/// Which RDMA device (local address) a communicator opens.
#[derive(Clone, Default)]
pub enum DeviceChoice {
    /// The local address that routes to the store's host (the address `connect` would pick);
    /// when the store is on this host (or there is no store: file and callback bootstraps)
    /// each rank takes its own loopback address `127.0.0.(rank + 1)`, since a `udp` device
    /// holds its address's port 4791 alone when no rocectl daemon runs.
    #[default]
    Auto,
    /// The first IPv4 address (else the first address) of this interface.
    Interface(String),
    /// This local address.
    Address(IpAddr),
    /// A configuration built by the caller for a rank: any backend (`sim` networks with loss
    /// for tests, `raw`, a daemon socket...).
    Config(DeviceConfigFn),
}

impl fmt::Debug for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("Auto"),
            Self::Interface(i) => f.debug_tuple("Interface").field(i).finish(),
            Self::Address(a) => f.debug_tuple("Address").field(a).finish(),
            Self::Config(_) => f.write_str("Config(..)"),
        }
    }
}

/// How long a blocking wait polls the completion queue before it sleeps on it.
///
/// Sleeping costs a wake-up when the data comes: 6–9 µs on a quiet host, ~35 µs on some
/// virtual machines (this project's test VM: the kernel's own blocking UDP ping-pong takes
/// 75 µs there, its busy-polling one 7 µs), which is most of a small collective's time.
/// Polling first for a bounded time keeps the short waits of a small operation or of a
/// pipeline's next chunk off the scheduler, and a wait that lasts longer still sleeps: the
/// kernel's `SO_BUSY_POLL` and Intel MPI's spin-then-wait do the same. On a host with more
/// ranks than CPUs a spinning rank takes the core another rank needs, so the default spins
/// only where every rank of the communicator on this host can have a CPU of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Spin {
    /// [`DEFAULT_SPIN`] when this host runs no more of the communicator's ranks than this
    /// process may use CPUs (`std::thread::available_parallelism`: affinity and cgroup
    /// quota), else none. The ranks of a host are those that report the same kernel boot ID
    /// at set-up (network namespaces and containers share it with the host).
    #[default]
    Auto,
    /// Sleep at once.
    Never,
    /// Poll this long before sleeping, whatever the host.
    For(Duration),
}

/// What [`Spin::Auto`] polls for: the kernel's suggested `busy_poll`/`busy_read` value
/// (Documentation/networking/napi.rst), above a small collective's whole time on a LAN.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

impl Spin {
    /// How long to poll, for `local_ranks` of the communicator on this host and `cpus`
    /// usable CPUs.
    pub fn resolve(self, local_ranks: usize, cpus: usize) -> Duration {
        match self {
            Self::Auto if local_ranks <= cpus => DEFAULT_SPIN,
            Self::Auto | Self::Never => Duration::ZERO,
            Self::For(d) => d,
        }
    }
}

impl FromStr for Spin {
    type Err = CollError;
    /// `auto`, `off` (or `0`, `never`), or microseconds (`50`, `50us`).
    fn from_str(s: &str) -> Result<Self, CollError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "auto" | "" => Ok(Self::Auto),
            "off" | "never" | "no" | "0" | "0us" => Ok(Self::Never),
            _ => t
                .strip_suffix("us")
                .unwrap_or(&t)
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&us| us <= 1_000_000)
                .map(|us| Self::For(Duration::from_micros(us)))
                .ok_or_else(|| {
                    CollError::InvalidArgument(format!(
                        "spin {s:?}: auto, off, or microseconds up to 1000000"
                    ))
                }),
        }
    }
}

/// How a communicator behaves. `Default`: 60 s timeout, [`Algorithm::Auto`], 512 KiB chunks,
/// 8 slots and 1 QP per peer, not deterministic, blocking waits after [`Spin::Auto`],
/// [`DeviceChoice::Auto`].
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// Every call (and [`crate::Communicator::init`]) fails with [`CollError::Timeout`]
    /// after this; override per call with [`crate::Communicator::with_timeout`].
    pub timeout: Duration,
    /// The allreduce algorithm.
    pub algorithm: Algorithm,
    /// Bytes per chunk: the unit a sender writes into one receive slot (1 ..= 2 MiB).
    pub chunk_bytes: usize,
    /// Receive slots per peer (clear-to-send credits; 1 ..= 64).
    pub slots: usize,
    /// RC queue pairs per peer (1 ..= 16); chunks go round-robin over them.
    pub qps_per_peer: usize,
    /// Reduce every element in rank order 0, 1, ..., n−1 whatever the size, the chunking or
    /// the algorithm (see the crate docs for the cost).
    pub deterministic: bool,
    /// Spin on the completion queue instead of blocking on it (lower latency on idle cores,
    /// unfair on shared ones). Overrides [`Self::spin`].
    pub busy_poll: bool,
    /// How long a blocking wait polls before it sleeps.
    pub spin: Spin,
    /// Which device to open.
    pub device: DeviceChoice,
    /// Messages up to this many bytes take the latency-optimal algorithms under
    /// [`Algorithm::Auto`] (recursive doubling, direct exchanges, binomial trees).
    pub small_bytes: usize,
}

impl Default for CommOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            algorithm: Algorithm::Auto,
            chunk_bytes: 512 << 10,
            slots: 8,
            qps_per_peer: 1,
            deterministic: false,
            busy_poll: false,
            spin: Spin::Auto,
            device: DeviceChoice::Auto,
            small_bytes: 64 << 10,
        }
    }
}

/// The largest chunk (the immediate carries its length in 22 bits).
pub const MAX_CHUNK: usize = 2 << 20;
/// The most slots per peer (the immediate carries the slot in 6 bits).
pub const MAX_SLOTS: usize = 64;
/// The most QPs per peer.
pub const MAX_QPS: usize = 16;

impl CommOptions {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] naming the field out of range.
    pub fn validate(&self) -> Result<(), CollError> {
        let bad = |what: String| Err(CollError::InvalidArgument(what));
        if self.chunk_bytes == 0 || self.chunk_bytes > MAX_CHUNK {
            return bad(format!(
                "chunk_bytes {} out of 1..={MAX_CHUNK}",
                self.chunk_bytes
            ));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return bad(format!("slots {} out of 1..={MAX_SLOTS}", self.slots));
        }
        if self.qps_per_peer == 0 || self.qps_per_peer > MAX_QPS {
            return bad(format!(
                "qps_per_peer {} out of 1..={MAX_QPS}",
                self.qps_per_peer
            ));
        }
        if self.timeout.is_zero() {
            return bad("timeout 0".into());
        }
        Ok(())
    }

    /// The defaults overridden by the environment:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `ROCECTL_COLL_TIMEOUT` | timeout in seconds (fractions allowed) |
    /// | `ROCECTL_COLL_ALGO` | `auto`, `ring`, `hd`, `rd`, `direct` |
    /// | `ROCECTL_COLL_CHUNK` | chunk bytes (`k`/`m` suffixes) |
    /// | `ROCECTL_COLL_SLOTS` | slots per peer |
    /// | `ROCECTL_COLL_QPS` | QPs per peer |
    /// | `ROCECTL_COLL_DETERMINISTIC` | `1` for the rank-ordered reduction |
    /// | `ROCECTL_COLL_BUSY_POLL` | `1` to spin |
    /// | `ROCECTL_COLL_SPIN` | a blocking wait's poll first: `auto`, `off`, microseconds |
    /// | `ROCECTL_COLL_SMALL` | the small-message threshold in bytes |
    /// | `ROCECTL_COLL_IFACE` / `ROCECTL_COLL_ADDR` | the device's interface / address |
    ///
    /// # Errors
    /// [`CollError::InvalidArgument`] naming the variable that does not parse.
    pub fn from_env() -> Result<Self, CollError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Self::from_env`], reading variables through `get`.
    ///
    /// # Errors
    /// As [`Self::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, CollError> {
        let mut o = Self::default();
        let bad =
            |k: &str, v: &str| CollError::InvalidArgument(format!("{k}={v:?} does not parse"));
        if let Some(v) = get("ROCECTL_COLL_TIMEOUT") {
            let s: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad("ROCECTL_COLL_TIMEOUT", &v))?;
            o.timeout = Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| bad("ROCECTL_COLL_TIMEOUT", &v))?;
        }
        if let Some(v) = get("ROCECTL_COLL_SPIN") {
            o.spin = v.parse().map_err(|_| bad("ROCECTL_COLL_SPIN", &v))?;
        }
        if let Some(v) = get("ROCECTL_COLL_ALGO") {
            o.algorithm = v.trim().parse()?;
        }
        for (k, field) in [
            ("ROCECTL_COLL_CHUNK", &mut o.chunk_bytes),
            ("ROCECTL_COLL_SLOTS", &mut o.slots),
            ("ROCECTL_COLL_QPS", &mut o.qps_per_peer),
            ("ROCECTL_COLL_SMALL", &mut o.small_bytes),
        ] {
            if let Some(v) = get(k) {
                *field = parse_size(&v).ok_or_else(|| bad(k, &v))?;
            }
        }
        for (k, field) in [
            ("ROCECTL_COLL_DETERMINISTIC", &mut o.deterministic),
            ("ROCECTL_COLL_BUSY_POLL", &mut o.busy_poll),
        ] {
            if let Some(v) = get(k) {
                *field = match v.trim() {
                    "1" | "true" | "yes" | "on" => true,
                    "0" | "false" | "no" | "off" | "" => false,
                    _ => return Err(bad(k, &v)),
                };
            }
        }
        if let Some(v) = get("ROCECTL_COLL_IFACE") {
            o.device = DeviceChoice::Interface(v);
        }
        if let Some(v) = get("ROCECTL_COLL_ADDR") {
            o.device =
                DeviceChoice::Address(v.trim().parse().map_err(|_| bad("ROCECTL_COLL_ADDR", &v))?);
        }
        o.validate()?;
        Ok(o)
    }
}

/// `4096`, `64k`, `2m`, `1g` (binary multiples).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1usize << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_spins_only_where_every_local_rank_has_a_cpu() {
        assert_eq!(Spin::Auto.resolve(2, 2), DEFAULT_SPIN);
        assert_eq!(Spin::Auto.resolve(1, 8), DEFAULT_SPIN);
        assert_eq!(Spin::Auto.resolve(4, 2), Duration::ZERO);
        assert_eq!(Spin::Never.resolve(1, 8), Duration::ZERO);
        let d = Duration::from_micros(7);
        assert_eq!(Spin::For(d).resolve(16, 1), d);
    }

    #[test]
    fn environment_overrides_parse_and_bad_values_are_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        let o = CommOptions::from_lookup(env(&[
            ("ROCECTL_COLL_TIMEOUT", "2.5"),
            ("ROCECTL_COLL_ALGO", "ring"),
            ("ROCECTL_COLL_CHUNK", "64k"),
            ("ROCECTL_COLL_DETERMINISTIC", "1"),
        ]))
        .unwrap();
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!(o.algorithm, Algorithm::Ring);
        assert_eq!(o.chunk_bytes, 64 << 10);
        assert!(o.deterministic);
        let e = CommOptions::from_lookup(env(&[("ROCECTL_COLL_SLOTS", "many")])).unwrap_err();
        assert!(e.to_string().contains("ROCECTL_COLL_SLOTS"), "{e}");
        let e = CommOptions::from_lookup(env(&[("ROCECTL_COLL_SLOTS", "1000")])).unwrap_err();
        assert!(e.to_string().contains("slots"), "{e}");
        assert_eq!(parse_size("2m"), Some(2 << 20));
        let o = CommOptions::from_lookup(env(&[("ROCECTL_COLL_SPIN", "20us")])).unwrap();
        assert_eq!(o.spin, Spin::For(Duration::from_micros(20)));
        let e = CommOptions::from_lookup(env(&[("ROCECTL_COLL_SPIN", "soon")])).unwrap_err();
        assert!(e.to_string().contains("ROCECTL_COLL_SPIN"), "{e}");
        assert_eq!("off".parse::<Spin>().unwrap(), Spin::Never);
        assert_eq!("auto".parse::<Spin>().unwrap(), Spin::Auto);
        assert!("-3".parse::<Spin>().is_err());
        assert_eq!(parse_size("x"), None);
    }
}
