//! How the ranks of a communicator find each other: the environment launchers set, a TCP
//! store, a file store or the caller's own allgather.
//!
//! What is exchanged (every rank's blob, see `comm.rs`): its GID, its service address and,
//! per peer, its QPNs and first PSNs and the address and rkey of the receive slots it holds
//! for that peer.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::CollError;

/// An allgather of byte blobs supplied by the caller: given this rank's blob, returns every
/// rank's, in rank order (an MPI allgather, a key-value store, a job scheduler...). Called a
/// few times during `init` (and `shrink`), in the same order on every rank.
pub type ExchangeFn = Arc<dyn Fn(Vec<u8>) -> Result<Vec<Vec<u8>>, String> + Send + Sync>;

/// How a communicator's ranks meet.
#[derive(Clone)]
pub enum Bootstrap {
    /// From the environment a launcher sets: the rank and size from torchrun's `RANK` and
    /// `WORLD_SIZE`, else Open MPI's `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`, else
    /// `PMI_RANK`/`PMI_SIZE` (MPICH, Intel MPI), else Slurm's `SLURM_PROCID`/`SLURM_NTASKS`.
    /// The store: `ROCECTL_COLL_STORE` = `tcp:HOST:PORT` or `file:PATH` when set, else a TCP
    /// store at `MASTER_ADDR`:`MASTER_PORT` (torchrun sets both; under `mpirun` or `srun`
    /// export them, or `ROCECTL_COLL_STORE`, yourself).
    Env,
    /// A TCP store at `addr`: rank 0 listens there, the others connect (retrying until the
    /// timeout, so the order of starting does not matter).
    Tcp {
        /// The store's address (rank 0 binds it).
        addr: SocketAddr,
        /// This rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
    },
    /// A file store on a filesystem every rank sees: each rank writes `PATH.<round>.<rank>`
    /// and reads the others'. Use a fresh path per job (files of an earlier job would be
    /// read); each rank removes its files when its communicator is dropped.
    File {
        /// The prefix of the files.
        path: PathBuf,
        /// This rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
    },
    /// The caller's allgather.
    Callback {
        /// This rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
        /// The allgather.
        exchange: ExchangeFn,
    },
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env => f.write_str("Env"),
            Self::Tcp { addr, rank, size } => f
                .debug_struct("Tcp")
                .field("addr", addr)
                .field("rank", rank)
                .field("size", size)
                .finish(),
            Self::File { path, rank, size } => f
                .debug_struct("File")
                .field("path", path)
                .field("rank", rank)
                .field("size", size)
                .finish(),
            Self::Callback { rank, size, .. } => f
                .debug_struct("Callback")
                .field("rank", rank)
                .field("size", size)
                .finish_non_exhaustive(),
        }
    }
}

impl Bootstrap {
    /// Resolves [`Bootstrap::Env`] from the process environment (the others are returned
    /// as they are).
    ///
    /// # Errors
    /// [`CollError::Bootstrap`] naming what is missing or does not parse.
    pub fn resolve(self) -> Result<Self, CollError> {
        match self {
            Self::Env => Self::from_lookup(|k| std::env::var(k).ok()),
            other => Ok(other),
        }
    }

    /// [`Bootstrap::Env`] resolved through `get` instead of the process environment.
    ///
    /// # Errors
    /// As [`Self::resolve`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, CollError> {
        let num = |k: &str| -> Result<Option<usize>, CollError> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| CollError::Bootstrap(format!("{k}={v:?} is not a number"))),
            }
        };
        let pairs = [
            ("RANK", "WORLD_SIZE"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
        ];
        let mut found = None;
        for (r, s) in pairs {
            if let (Some(rank), Some(size)) = (num(r)?, num(s)?) {
                found = Some((rank, size, r, s));
                break;
            }
        }
        let Some((rank, size, rk, sk)) = found else {
            return Err(CollError::Bootstrap(
                "no rank in the environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE, \
                 PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS)"
                    .into(),
            ));
        };
        if size == 0 || rank >= size {
            return Err(CollError::Bootstrap(format!(
                "{rk}={rank} is not below {sk}={size}"
            )));
        }
        if let Some(store) = get("ROCECTL_COLL_STORE") {
            if let Some(path) = store.strip_prefix("file:") {
                return Ok(Self::File {
                    path: path.into(),
                    rank,
                    size,
                });
            }
            if let Some(hp) = store.strip_prefix("tcp:") {
                let addr = resolve(hp).ok_or_else(|| {
                    CollError::Bootstrap(format!(
                        "ROCECTL_COLL_STORE={store:?}: {hp:?} does not resolve"
                    ))
                })?;
                return Ok(Self::Tcp { addr, rank, size });
            }
            return Err(CollError::Bootstrap(format!(
                "ROCECTL_COLL_STORE={store:?}: expected tcp:HOST:PORT or file:PATH"
            )));
        }
        match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(host), Some(port)) => {
                let hp = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                let addr = resolve(&hp).ok_or_else(|| {
                    CollError::Bootstrap(format!(
                        "MASTER_ADDR={host:?} MASTER_PORT={port:?} does not resolve"
                    ))
                })?;
                Ok(Self::Tcp { addr, rank, size })
            }
            _ => Err(CollError::Bootstrap(format!(
                "{rk}/{sk} set but no store: set MASTER_ADDR and MASTER_PORT, or \
                 ROCECTL_COLL_STORE=tcp:HOST:PORT|file:PATH"
            ))),
        }
    }

    /// This rank and the number of ranks (after [`Self::resolve`]; `Env` gives `None`).
    pub fn rank_size(&self) -> Option<(usize, usize)> {
        match self {
            Self::Env => None,
            Self::Tcp { rank, size, .. }
            | Self::File { rank, size, .. }
            | Self::Callback { rank, size, .. } => Some((*rank, *size)),
        }
    }
}

fn resolve(host_port: &str) -> Option<SocketAddr> {
    let addrs: Vec<SocketAddr> = host_port.to_socket_addrs().ok()?.collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}

/// Writes `blob` as `PATH.<tag>.<rank>` and waits for every rank's file.
pub(crate) fn file_exchange(
    path: &Path,
    tag: u64,
    rank: usize,
    size: usize,
    blob: &[u8],
    deadline: Instant,
) -> Result<Vec<Vec<u8>>, CollError> {
    let name = |r: usize| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{tag}.{r}"));
        PathBuf::from(p)
    };
    let mine = name(rank);
    let mut tmp = mine.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, blob)
        .and_then(|()| std::fs::rename(&tmp, &mine))
        .map_err(|e| {
            CollError::Bootstrap(format!("rank {rank}: file store {}: {e}", mine.display()))
        })?;
    let start = Instant::now();
    let mut got: Vec<Option<Vec<u8>>> = vec![None; size];
    loop {
        for (r, slot) in got.iter_mut().enumerate() {
            if slot.is_none() {
                if let Ok(b) = std::fs::read(name(r)) {
                    *slot = Some(b);
                }
            }
        }
        if got.iter().all(Option::is_some) {
            return Ok(got.into_iter().flatten().collect());
        }
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..size).filter(|r| got[*r].is_none()).collect();
            return Err(CollError::Timeout {
                rank,
                peer: missing.first().copied(),
                phase: format!(
                    "bootstrap exchange through the file store {}; missing ranks: {missing:?}",
                    path.display()
                ),
                after: start.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes this rank's files of a file store (rounds `0..rounds`).
pub(crate) fn file_cleanup(path: &Path, tags: &[u64], rank: usize) {
    for tag in tags {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{tag}.{rank}"));
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn launcher_environments_resolve_to_a_store() {
        let b = Bootstrap::from_lookup(env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert!(
            matches!(b, Bootstrap::Tcp { rank: 1, size: 4, addr } if addr.port() == 29500),
            "{b:?}"
        );
        let b = Bootstrap::from_lookup(env(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("ROCECTL_COLL_STORE", "file:/tmp/x"),
        ]))
        .unwrap();
        assert!(
            matches!(
                b,
                Bootstrap::File {
                    rank: 2,
                    size: 3,
                    ..
                }
            ),
            "{b:?}"
        );
        let b = Bootstrap::from_lookup(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("ROCECTL_COLL_STORE", "tcp:127.0.0.1:1234"),
        ]))
        .unwrap();
        assert_eq!(b.rank_size(), Some((0, 2)));
        let e = Bootstrap::from_lookup(env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")])).unwrap_err();
        assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
        let e = Bootstrap::from_lookup(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("not below"), "{e}");
        assert!(Bootstrap::from_lookup(env(&[])).is_err());
    }
}
