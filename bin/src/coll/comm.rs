//! What coll-perf needs of a communicator ([`Comm`]): the collectives out of place and in
//! place, over raw bytes, and a barrier. The `roce-collectives` communicator implements it;
//! the unit tests run the benchmark on `tests::ThreadComm`, N threads exchanging through
//! shared memory.

use roce_collectives::{CollError, DataType, ReduceOp};

/// The collectives coll-perf runs. Lengths are in bytes; `count` elements per rank as
/// nccl-tests counts them.
pub(crate) trait Comm {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// `recv = op over ranks of send`.
    fn allreduce(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError>;
    /// `buf = op over ranks of buf`.
    fn allreduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError>;
    /// `send` holds `size` blocks; `recv` (one block) = op over ranks of block `rank`.
    fn reduce_scatter(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError>;
    /// As [`Comm::reduce_scatter`], the result in block `rank` of `buf`.
    fn reduce_scatter_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError>;
    /// `recv` (`size` blocks) = every rank's `send`, in rank order.
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError>;
    /// As [`Comm::allgather`], this rank's block already in place in `buf`.
    fn allgather_in_place(&self, buf: &mut [u8]) -> Result<(), CollError>;
    /// `buf` = root's `buf`.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), CollError>;
    /// At `root`, `recv = op over ranks of send`.
    fn reduce(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
        root: usize,
    ) -> Result<(), CollError>;
    /// At `root`, `buf = op over ranks of buf`.
    fn reduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError>;
    /// Sends `buf` to `peer`.
    fn send(&self, buf: &[u8], peer: usize) -> Result<(), CollError>;
    /// Receives `buf` from `peer`.
    fn recv(&self, buf: &mut [u8], peer: usize) -> Result<(), CollError>;
    /// Returns once every rank called it.
    fn barrier(&self) -> Result<(), CollError>;
    /// This rank's device, for the `# Using devices` lines: (address, name).
    fn device(&self) -> (String, String) {
        (
            std::env::var("ROCECTL_COLL_ADDR").unwrap_or_else(|_| "auto".into()),
            "rocectl".into(),
        )
    }
}

/// Opens the communicator the environment describes (`Bootstrap::Env`: torchrun's, Open
/// MPI's, PMI's or Slurm's variables), with the library's environment options
/// (`ROCECTL_COLL_*`) overridden by the flags of `args`; SIGUSR1 aborts it.
///
/// # Errors
/// The options are out of range or the communicator cannot be set up (one line).
pub(crate) fn open(args: &super::perf::PerfArgs) -> anyhow::Result<Box<dyn Comm>> {
    use roce_collectives::{Algorithm, Bootstrap, CommOptions, Communicator, DeviceChoice};
    let mut o = CommOptions::from_env()?;
    if args.timeout > 0 {
        o.timeout = std::time::Duration::from_secs(args.timeout);
    }
    match args.algo.as_str() {
        "ring" => o.algorithm = Algorithm::Ring,
        "hd" => o.algorithm = Algorithm::HalvingDoubling,
        _ => {}
    }
    if let Some(c) = args.chunk {
        o.chunk_bytes = usize::try_from(c).unwrap_or(usize::MAX);
    }
    if let Some(s) = args.slots {
        o.slots = s;
    }
    if let Some(q) = args.qps {
        o.qps_per_peer = q;
    }
    o.deterministic |= args.deterministic;
    o.busy_poll |= args.busy_poll;
    if let Some(s) = &args.spin {
        o.spin = s.parse()?;
    }
    if let Some(a) = args.addr {
        o.device = DeviceChoice::Address(a);
    }
    let comm = Communicator::init(Bootstrap::Env, o)?;
    let abort = comm.abort_handle();
    // SIGUSR1: abort from another thread, as a user's watchdog would.
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])?;
    std::thread::Builder::new()
        .name("coll-perf-abort".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                abort.abort();
            }
        })?;
    Ok(Box::new(comm))
}

impl Comm for roce_collectives::Communicator {
    fn rank(&self) -> usize {
        Self::rank(self)
    }
    fn size(&self) -> usize {
        Self::size(self)
    }
    fn allreduce(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        self.allreduce_raw(dt, op, send, recv)
    }
    fn allreduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.allreduce_in_place_raw(dt, op, buf)
    }
    fn reduce_scatter(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollError> {
        self.reduce_scatter_raw(dt, op, send, recv)
    }
    fn reduce_scatter_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
    ) -> Result<(), CollError> {
        self.reduce_scatter_in_place_raw(dt, op, buf)
    }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        self.allgather_raw(send, recv)
    }
    fn allgather_in_place(&self, buf: &mut [u8]) -> Result<(), CollError> {
        self.allgather_in_place_raw(buf)
    }
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), CollError> {
        self.broadcast_raw(buf, root)
    }
    fn reduce(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        self.reduce_raw(dt, op, send, recv, root)
    }
    fn reduce_in_place(
        &self,
        dt: DataType,
        op: ReduceOp,
        buf: &mut [u8],
        root: usize,
    ) -> Result<(), CollError> {
        self.reduce_in_place_raw(dt, op, buf, root)
    }
    fn send(&self, buf: &[u8], peer: usize) -> Result<(), CollError> {
        self.send_raw(buf, peer)
    }
    fn recv(&self, buf: &mut [u8], peer: usize) -> Result<(), CollError> {
        self.recv_raw(buf, peer)
    }
    fn barrier(&self) -> Result<(), CollError> {
        Self::barrier(self)
    }
    fn device(&self) -> (String, String) {
        let o = self.options();
        let wait = if o.busy_poll {
            "busy-poll".to_string()
        } else {
            match self.spin().as_micros() {
                0 => "block".to_string(),
                us => format!("spin {us} us, block"),
            }
        };
        (
            self.local_addr().to_string(),
            format!("rocectl {} ({wait})", o.algorithm.name()),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Barrier, Mutex};

    use roce_collectives::reduce::{finish, reduce_into};

    use super::*;

    /// Messages in flight, per (from, to).
    type Mailboxes = HashMap<(usize, usize), VecDeque<Vec<u8>>>;

    /// Shared state of a [`ThreadComm`] world.
    struct World {
        n: usize,
        barrier: Barrier,
        slots: Mutex<Vec<Vec<u8>>>,
        mail: Mutex<Mailboxes>,
    }

    /// One rank of an in-memory world: every collective deposits its contribution, waits for
    /// all, computes its result from all the contributions with the library's kernels.
    /// `corrupt` flips a byte of every result (to show the checker sees it).
    pub(crate) struct ThreadComm {
        rank: usize,
        world: Arc<World>,
        pub(crate) corrupt: bool,
    }

    impl ThreadComm {
        /// `n` ranks.
        pub(crate) fn world(n: usize) -> Vec<Self> {
            let world = Arc::new(World {
                n,
                barrier: Barrier::new(n),
                slots: Mutex::new(vec![Vec::new(); n]),
                mail: Mutex::new(HashMap::new()),
            });
            (0..n)
                .map(|rank| Self {
                    rank,
                    world: Arc::clone(&world),
                    corrupt: false,
                })
                .collect()
        }

        /// Deposits `mine`, returns everyone's.
        fn exchange(&self, mine: &[u8]) -> Vec<Vec<u8>> {
            self.world.slots.lock().unwrap()[self.rank] = mine.to_vec();
            self.world.barrier.wait();
            let all = self.world.slots.lock().unwrap().clone();
            self.world.barrier.wait();
            all
        }

        fn spoil(&self, out: &mut [u8]) {
            if self.corrupt && !out.is_empty() {
                out[0] ^= 0x10;
            }
        }

        fn reduced(
            &self,
            dt: DataType,
            op: ReduceOp,
            all: &[Vec<u8>],
            range: std::ops::Range<usize>,
        ) -> Vec<u8> {
            let mut acc = all[0][range.clone()].to_vec();
            for src in &all[1..] {
                reduce_into(dt, op, &mut acc, &src[range.clone()]).unwrap();
            }
            finish(dt, op, &mut acc, self.world.n).unwrap();
            acc
        }
    }

    impl Comm for ThreadComm {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.world.n
        }
        fn allreduce(
            &self,
            dt: DataType,
            op: ReduceOp,
            send: &[u8],
            recv: &mut [u8],
        ) -> Result<(), CollError> {
            let all = self.exchange(send);
            recv.copy_from_slice(&self.reduced(dt, op, &all, 0..send.len()));
            self.spoil(recv);
            Ok(())
        }
        fn allreduce_in_place(
            &self,
            dt: DataType,
            op: ReduceOp,
            buf: &mut [u8],
        ) -> Result<(), CollError> {
            let all = self.exchange(buf);
            buf.copy_from_slice(&self.reduced(dt, op, &all, 0..buf.len()));
            self.spoil(buf);
            Ok(())
        }
        fn reduce_scatter(
            &self,
            dt: DataType,
            op: ReduceOp,
            send: &[u8],
            recv: &mut [u8],
        ) -> Result<(), CollError> {
            let all = self.exchange(send);
            let b = recv.len();
            recv.copy_from_slice(&self.reduced(dt, op, &all, self.rank * b..(self.rank + 1) * b));
            self.spoil(recv);
            Ok(())
        }
        fn reduce_scatter_in_place(
            &self,
            dt: DataType,
            op: ReduceOp,
            buf: &mut [u8],
        ) -> Result<(), CollError> {
            let all = self.exchange(buf);
            let b = buf.len() / self.world.n;
            let r = self.rank * b..(self.rank + 1) * b;
            buf[r.clone()].copy_from_slice(&self.reduced(dt, op, &all, r.clone()));
            self.spoil(&mut buf[r]);
            Ok(())
        }
        fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
            let all = self.exchange(send);
            recv.copy_from_slice(&all.concat());
            self.spoil(recv);
            Ok(())
        }
        fn allgather_in_place(&self, buf: &mut [u8]) -> Result<(), CollError> {
            let b = buf.len() / self.world.n;
            let mine = buf[self.rank * b..(self.rank + 1) * b].to_vec();
            let all = self.exchange(&mine);
            buf.copy_from_slice(&all.concat());
            self.spoil(buf);
            Ok(())
        }
        fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), CollError> {
            let all = self.exchange(buf);
            buf.copy_from_slice(&all[root]);
            self.spoil(buf);
            Ok(())
        }
        fn reduce(
            &self,
            dt: DataType,
            op: ReduceOp,
            send: &[u8],
            recv: &mut [u8],
            root: usize,
        ) -> Result<(), CollError> {
            let all = self.exchange(send);
            if self.rank == root {
                recv.copy_from_slice(&self.reduced(dt, op, &all, 0..send.len()));
                self.spoil(recv);
            }
            Ok(())
        }
        fn reduce_in_place(
            &self,
            dt: DataType,
            op: ReduceOp,
            buf: &mut [u8],
            root: usize,
        ) -> Result<(), CollError> {
            let all = self.exchange(buf);
            if self.rank == root {
                buf.copy_from_slice(&self.reduced(dt, op, &all, 0..buf.len()));
                self.spoil(buf);
            }
            Ok(())
        }
        fn send(&self, buf: &[u8], peer: usize) -> Result<(), CollError> {
            self.world
                .mail
                .lock()
                .unwrap()
                .entry((self.rank, peer))
                .or_default()
                .push_back(buf.to_vec());
            Ok(())
        }
        fn recv(&self, buf: &mut [u8], peer: usize) -> Result<(), CollError> {
            loop {
                let m = self
                    .world
                    .mail
                    .lock()
                    .unwrap()
                    .get_mut(&(peer, self.rank))
                    .and_then(VecDeque::pop_front);
                if let Some(m) = m {
                    buf.copy_from_slice(&m);
                    self.spoil(buf);
                    return Ok(());
                }
                std::thread::yield_now();
            }
        }
        fn barrier(&self) -> Result<(), CollError> {
            self.world.barrier.wait();
            Ok(())
        }
    }
}
