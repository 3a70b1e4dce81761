//! `rocectl coll-perf [COLLECTIVE] [nccl-tests flags]`: nccl-tests 2.19.6's benchmark
//! (`all_reduce_perf` and friends) on the rocectl collectives communicator, with its flags,
//! its table, its JSON and its exit status.
//!
//! - The ranks find each other as the library's `Bootstrap::Env` does: under `mpirun`
//!   (`OMPI_COMM_WORLD_*`), torchrun's variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//!   `MASTER_PORT`; what `rocectl coll launch` sets), PMI or `srun`.
//! - The sweep, the warm-up, the timing (`-n` iterations of `-m` operations, the mean per
//!   operation, averaged over ranks as `-a` says), busbw (allreduce 2(n−1)/n,
//!   reduce_scatter and all_gather (n−1)/n, the others 1) and the checks (`-c` runs on fresh
//!   data, every element compared with the exact expected value, `#wrong` summed over ranks)
//!   are nccl-tests'. Rank 0 prints.
//! - Exit status: 0; 1 when any value was wrong (or the average bus bandwidth is under 0.9 ×
//!   `NCCL_TESTS_MIN_BW`) or a collective failed (one line naming the rank and phase); 2 for
//!   bad flags (one line).
//! - GPU-only flags (`-G -R -x -y -V`) are accepted and ignored with a `#` note, as nccl-tests
//!   does for options its NCCL lacks; `-t`/`-g` other than 1 and `-D` are refused.
//! - Where the library's API differs from NCCL's: an out-of-place broadcast copies the send
//!   buffer into the receive buffer at the root, then broadcasts in place (the copy is
//!   timed); sendrecv orders its blocking send and receive by rank parity. A reduce's result is
//!   checked on the root only (nccl-tests also checks that the others' buffers are untouched).
//! - SIGUSR1 aborts the communicator (every rank's pending and later operations fail): what
//!   `rocectl coll launch --drill abort:R@S` sends.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_collectives::{CollError, DataType, ReduceOp};

use super::check;
use super::comm::Comm;
use super::report::{self, JsonBody, JsonPerIter, JsonReport, JsonResult, JsonTime};

/// The collectives nccl-tests has a `*_perf` for that the library implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Coll {
    /// all_reduce_perf
    #[value(name = "all_reduce", alias = "all_reduce_perf", alias = "allreduce")]
    AllReduce,
    /// reduce_scatter_perf
    #[value(
        name = "reduce_scatter",
        alias = "reduce_scatter_perf",
        alias = "reducescatter"
    )]
    ReduceScatter,
    /// all_gather_perf
    #[value(name = "all_gather", alias = "all_gather_perf", alias = "allgather")]
    AllGather,
    /// broadcast_perf
    #[value(name = "broadcast", alias = "broadcast_perf")]
    Broadcast,
    /// reduce_perf
    #[value(name = "reduce", alias = "reduce_perf")]
    Reduce,
    /// sendrecv_perf: each rank sends to rank+1 and receives from rank-1
    #[value(name = "sendrecv", alias = "sendrecv_perf")]
    SendRecv,
}

impl Coll {
    /// nccl-tests' program name.
    pub(crate) fn program(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce_perf",
            Self::ReduceScatter => "reduce_scatter_perf",
            Self::AllGather => "all_gather_perf",
            Self::Broadcast => "broadcast_perf",
            Self::Reduce => "reduce_perf",
            Self::SendRecv => "sendrecv_perf",
        }
    }

    fn has_op(self) -> bool {
        matches!(
            self,
            Self::AllReduce | Self::ReduceScatter | Self::Reduce | Self::SendRecv
        )
    }

    fn has_root(self) -> bool {
        matches!(self, Self::Broadcast | Self::Reduce)
    }

    /// busbw / algbw.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::ReduceScatter | Self::AllGather => (n - 1.0) / n,
            Self::Broadcast | Self::Reduce | Self::SendRecv => 1.0,
        }
    }
}

/// Element counts of one size (`getCollByteCount`): `param` is what the table prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) param: usize,
    pub(crate) send: usize,
    pub(crate) recv: usize,
}

/// nccl-tests' counts for `bytes` of `dt` over `n` ranks.
pub(crate) fn counts(coll: Coll, bytes: u64, dt: DataType, n: usize) -> Counts {
    let count = usize::try_from(bytes).unwrap_or(usize::MAX) / dt.size();
    match coll {
        Coll::ReduceScatter | Coll::AllGather => {
            // A multiple of 16 bytes per rank.
            let base = (count / n) & !(16 / dt.size() - 1);
            let (send, recv) = if coll == Coll::ReduceScatter {
                (base * n, base)
            } else {
                (base, base * n)
            };
            Counts {
                param: base,
                send,
                recv,
            }
        }
        _ => Counts {
            param: count,
            send: count,
            recv: count,
        },
    }
}

/// The sizes of the sweep: from `min` to `max`, ×`factor` when it is above 1, else +`step`.
pub(crate) fn sweep(min: u64, max: u64, step: u64, factor: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        let next = if factor > 1 {
            s.saturating_mul(factor)
        } else {
            s.saturating_add(step)
        };
        if next == s {
            break;
        }
        s = next;
    }
    v
}

/// nccl-tests' `parsesize`: a number with an optional K, M or G (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let mult: f64 = match unit.trim() {
        "" => 1.0,
        "K" | "k" => 1024.0,
        "M" | "m" => 1024.0 * 1024.0,
        "G" | "g" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "'{s}': a size is a number with an optional K, M or G"
            ))
        }
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': a size is a number with an optional K, M or G"))?;
    let bytes = v * mult;
    if !(0.0..=(1u64 << 40) as f64).contains(&bytes) {
        return Err(format!("'{s}': a size is between 0 and 1T"));
    }
    Ok(bytes as u64)
}

/// `-d`: one type or all.
#[derive(Clone, Debug)]
pub(crate) struct Types(Vec<DataType>);

/// `-o`: one operator or nccl-tests' five.
#[derive(Clone, Debug)]
pub(crate) struct Ops(Vec<ReduceOp>);

fn parse_types(s: &str) -> Result<Types, String> {
    if s == "all" {
        return Ok(Types(DataType::ALL.to_vec()));
    }
    DataType::from_name(s).map(|t| Types(vec![t])).ok_or_else(|| {
        format!("'{s}': the types are int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 (or all)")
    })
}

fn parse_ops(s: &str) -> Result<Ops, String> {
    if s == "all" {
        // nccl-tests' five.
        return Ok(Ops(vec![
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ]));
    }
    ReduceOp::from_name(s).map(|o| Ops(vec![o])).ok_or_else(|| {
        format!("'{s}': the operators are sum prod min max avg band bor bxor (or all)")
    })
}

/// `rocectl coll-perf` arguments: nccl-tests' (same letters, same long names), then rocectl's.
#[derive(Debug, clap::Args)]
#[allow(clippy::struct_excessive_bools)]
pub(crate) struct PerfArgs {
    /// The collective (nccl-tests' program: all_reduce_perf…)
    #[arg(value_enum, default_value = "all_reduce")]
    pub(crate) collective: Coll,
    /// Threads per process (only 1: one rank per process)
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    nthreads: u32,
    /// GPUs per thread (only 1: one rank per process)
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    ngpus: u32,
    /// Smallest size, bytes (K, M, G: powers of 1024)
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    minbytes: u64,
    /// Largest size, bytes
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    maxbytes: u64,
    /// Size increment (when the factor is 1)
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    stepbytes: u64,
    /// Size factor
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    stepfactor: u64,
    /// Timed iterations per size
    #[arg(short = 'n', long = "iters", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Operations per iteration
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    agg_iters: u32,
    /// Warm-up iterations per size
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    warmup_iters: u32,
    /// Run the sweep this many times (0: forever)
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    run_cycles: u32,
    /// Parallel init (0/1; one rank per process: no effect)
    #[arg(short = 'p', long = "parallel_init", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    parallel_init: u8,
    /// Check iterations (0: no check, #wrong is N/A)
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// Reduction: sum prod min max avg band bor bxor, or all (nccl-tests' five)
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_ops)]
    op: Ops,
    /// Type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, or all
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_types)]
    datatype: Types,
    /// Root of broadcast and reduce (-1: every rank in turn)
    #[arg(short = 'r', long = "root", default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    root: i64,
    /// Blocking: 0 none, 1 barrier after each operation, 2 wait after each, 3 barrier after each
    /// iteration, not timed
    #[arg(short = 'z', long = "blocking", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    blocking: u8,
    /// CUDA stream (GPU only: ignored)
    #[arg(short = 'y', long = "stream_null", default_value_t = 0)]
    stream_null: i32,
    /// Timeout of every operation, seconds (0: the library's default)
    #[arg(short = 'T', long = "timeout", default_value_t = 0)]
    pub(crate) timeout: u64,
    /// CUDA graph launches (GPU only: ignored)
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    cudagraph: i32,
    /// Report CPU time (0/1)
    #[arg(short = 'C', long = "report_cputime", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    report_cputime: u8,
    /// Print a timestamp on every line (0/1)
    #[arg(short = 'S', long = "report_timestamps", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    report_timestamps: u8,
    /// Also write the results as JSON to this file (rank 0; name.N when it exists)
    #[arg(short = 'J', long = "output_file")]
    output_file: Option<PathBuf>,
    /// Time reported: 0 rank 0's, 1 the average over ranks, 2 the minimum, 3 the maximum
    #[arg(short = 'a', long = "average", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    average: u8,
    /// Buffer registration (GPU only: ignored)
    #[arg(short = 'R', long = "local_register", default_value_t = 0)]
    local_register: i32,
    /// CTA policy (GPU only: ignored)
    #[arg(short = 'x', long = "cta_policy")]
    cta_policy: Option<i32>,
    /// Device implementation (GPU only: only 0)
    #[arg(short = 'D', long = "device_implementation", default_value_t = 0)]
    device_implementation: i32,
    /// Device CTA count (GPU only: ignored)
    #[arg(short = 'V', long = "device_cta_count")]
    device_cta_count: Option<i32>,
    /// Memory report (0/1; GPU memory: ignored)
    #[arg(short = 'M', long = "memory", default_value_t = 0)]
    memory: i32,
    /// Misalign the buffers by this many elements
    #[arg(short = 'u', long = "unalign", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    unalign: u32,
    /// Per-iteration timing: adds i_min i_max i_p99 i_cv% (0/1)
    #[arg(short = 'I', long = "per_iter_timing", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    per_iter_timing: u8,
    /// Leading iterations left out of the -I statistics
    #[arg(short = 'K', long = "per_iter_skip", default_value_t = 0)]
    per_iter_skip: u32,
    /// Algorithm (rocectl): auto, ring, hd (halving-doubling)
    #[arg(long, default_value = "auto", value_parser = ["auto", "ring", "hd"])]
    pub(crate) algo: String,
    /// Chunk size of the data protocol, bytes (rocectl; default: the library's)
    #[arg(long, value_parser = parse_size)]
    pub(crate) chunk: Option<u64>,
    /// Receive slots per peer (rocectl; default: the library's)
    #[arg(long)]
    pub(crate) slots: Option<usize>,
    /// Queue pairs per peer (rocectl; default: the library's)
    #[arg(long)]
    pub(crate) qps: Option<usize>,
    /// Deterministic reduction order (rocectl)
    #[arg(long)]
    pub(crate) deterministic: bool,
    /// Busy-poll completions instead of blocking (rocectl)
    #[arg(long)]
    pub(crate) busy_poll: bool,
    /// How long a blocking wait polls first: auto, off, or microseconds (rocectl; default:
    /// ROCECTL_COLL_SPIN, else auto: 50 us where every rank on the host has a CPU)
    #[arg(long)]
    pub(crate) spin: Option<String>,
    /// This rank's RoCE address (rocectl; default: ROCECTL_COLL_ADDR, else the library's choice)
    #[arg(long)]
    pub(crate) addr: Option<std::net::IpAddr>,
}

/// A command line clap refused: for `coll-perf` and `coll …`, one line and exit status 2;
/// for the other commands clap's own report.
pub(crate) fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let cmd = std::env::args().nth(1).unwrap_or_default();
    let ours = cmd == "coll-perf" || cmd == "coll";
    let shown = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if ours && !shown {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or("bad arguments");
        let first = first.strip_prefix("error: ").unwrap_or(first);
        eprintln!("rocectl {cmd}: error: {first}");
        return ExitCode::from(2);
    }
    e.exit()
}

/// A flag combination nccl-tests would refuse, or that rocectl cannot honour.
fn validate(a: &PerfArgs) -> Result<Vec<String>, String> {
    if a.nthreads != 1 || a.ngpus != 1 {
        return Err("-t and -g: only 1 (one rank per process; start more processes)".into());
    }
    if a.minbytes > a.maxbytes {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
            a.minbytes, a.maxbytes
        ));
    }
    if a.stepfactor <= 1 && a.stepbytes == 0 && a.minbytes < a.maxbytes {
        return Err("-i 0 with -f 1 never reaches -e: give a step or a factor".into());
    }
    if a.device_implementation != 0 {
        return Err("-D: device implementations need a GPU".into());
    }
    if a.per_iter_skip > 0 && (a.per_iter_timing == 0 || a.per_iter_skip >= a.iters) {
        return Err(format!(
            "-K: needs -I 1 and must be between 0 and {}",
            a.iters.saturating_sub(1)
        ));
    }
    let mut notes = Vec::new();
    let mut ignored = |set: bool, what: &str| {
        if set {
            notes.push(format!(
                "Option {what} has no meaning without a GPU. Ignoring"
            ));
        }
    };
    ignored(a.cudagraph != 0, "-G (CUDA graph)");
    ignored(a.local_register != 0, "-R (register)");
    ignored(a.cta_policy.is_some(), "-x (cta_policy)");
    ignored(a.device_cta_count.is_some(), "-V (device CTA count)");
    ignored(a.stream_null != 0, "-y (stream_null)");
    ignored(a.memory != 0, "-M (GPU memory report)");
    Ok(notes)
}

/// Runs `rocectl coll-perf`.
pub(crate) fn run(args: &PerfArgs) -> anyhow::Result<ExitCode> {
    let notes = match validate(args) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rocectl coll-perf: error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let comm = match super::comm::open(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rocectl coll-perf: error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let argv: Vec<String> = std::env::args().collect();
    match bench(comm.as_ref(), args, &notes, &argv, &mut out) {
        Ok(summary) if summary.failed() => Ok(ExitCode::FAILURE),
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(BenchError::Coll(e)) => {
            let _ = out.flush();
            eprintln!("rocectl coll-perf: error: {e}");
            Ok(ExitCode::FAILURE)
        }
        Err(BenchError::Io(e)) => Err(e.into()),
    }
}

/// Why a benchmark stopped.
#[derive(Debug)]
pub(crate) enum BenchError {
    /// A collective failed.
    Coll(CollError),
    /// Writing the output failed.
    Io(std::io::Error),
}

impl From<CollError> for BenchError {
    fn from(e: CollError) -> Self {
        Self::Coll(e)
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// What a run found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Summary {
    /// nccl-tests' `errors`: lines with wrong values, summed over ranks.
    pub(crate) errors: u64,
    /// Wrong elements over the whole run.
    pub(crate) wrong: u64,
    pub(crate) avg_busbw: f64,
    pub(crate) min_bw_failed: bool,
}

impl Summary {
    fn failed(&self) -> bool {
        self.errors > 0 || self.wrong > 0 || self.min_bw_failed
    }
}

/// The buffers of one run, allocated for the largest size.
struct Buffers {
    send: Vec<u8>,
    recv: Vec<u8>,
    expected: Vec<u8>,
    off: usize,
}

/// One collective, type, operator and root; `in_place` or not.
#[derive(Clone, Copy)]
struct Case {
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    root: usize,
    c: Counts,
}

impl Case {
    fn bytes(&self, elems: usize) -> usize {
        elems * self.dt.size()
    }
}

/// Sets up inputs (and expected results) for `rep`.
fn init(comm: &dyn Comm, k: &Case, in_place: bool, rep: u64, b: &mut Buffers) {
    let (n, r, dt, op) = (comm.size(), comm.rank(), k.dt, k.op);
    let off = b.off;
    let (sb, rb) = (k.bytes(k.c.send), k.bytes(k.c.recv));
    let send = &mut b.send[off..off + sb];
    let recv = &mut b.recv[off..off + rb];
    let exp = &mut b.expected[off..off + rb];
    recv.fill(0);
    match k.coll {
        Coll::AllReduce | Coll::Reduce => {
            let data = if in_place { &mut *recv } else { &mut *send };
            check::fill_input(dt, op, n, r, 0, rep, data);
            if k.coll == Coll::AllReduce || r == k.root {
                check::fill_reduced(dt, op, n, 0, rep, exp);
            }
        }
        Coll::ReduceScatter => {
            // In place, the result lands in block `rank` of the send buffer.
            check::fill_input(dt, op, n, r, 0, rep, send);
            check::fill_reduced(dt, op, n, r * k.c.recv, rep, exp);
        }
        Coll::AllGather => {
            let block = k.bytes(k.c.send);
            if in_place {
                check::fill_data(dt, r, 0, rep, &mut recv[r * block..(r + 1) * block]);
            } else {
                check::fill_data(dt, r, 0, rep, send);
            }
            for j in 0..n {
                check::fill_data(dt, j, 0, rep, &mut exp[j * block..(j + 1) * block]);
            }
        }
        Coll::Broadcast => {
            if r == k.root {
                let data = if in_place { &mut *recv } else { &mut *send };
                check::fill_data(dt, k.root, 0, rep, data);
            }
            check::fill_data(dt, k.root, 0, rep, exp);
        }
        Coll::SendRecv => {
            let data = if in_place { &mut *recv } else { &mut *send };
            check::fill_data(dt, r, 0, rep, data);
            check::fill_data(dt, (r + n - 1) % n, 0, rep, exp);
        }
    }
}

/// Runs the collective once.
fn once(comm: &dyn Comm, k: &Case, in_place: bool, b: &mut Buffers) -> Result<(), CollError> {
    let (n, r) = (comm.size(), comm.rank());
    let off = b.off;
    let (sb, rb) = (k.bytes(k.c.send), k.bytes(k.c.recv));
    let send = &mut b.send[off..off + sb];
    let recv = &mut b.recv[off..off + rb];
    match (k.coll, in_place) {
        (Coll::AllReduce, false) => comm.allreduce(k.dt, k.op, send, recv),
        (Coll::AllReduce, true) => comm.allreduce_in_place(k.dt, k.op, recv),
        (Coll::ReduceScatter, false) => comm.reduce_scatter(k.dt, k.op, send, recv),
        (Coll::ReduceScatter, true) => comm.reduce_scatter_in_place(k.dt, k.op, send),
        (Coll::AllGather, false) => comm.allgather(send, recv),
        (Coll::AllGather, true) => comm.allgather_in_place(recv),
        (Coll::Broadcast, ip) => {
            if !ip && r == k.root {
                recv.copy_from_slice(send);
            }
            comm.broadcast(recv, k.root)
        }
        (Coll::Reduce, false) => comm.reduce(k.dt, k.op, send, recv, k.root),
        (Coll::Reduce, true) => comm.reduce_in_place(k.dt, k.op, recv, k.root),
        (Coll::SendRecv, ip) => {
            let (to, from) = ((r + 1) % n, (r + n - 1) % n);
            let src: Vec<u8>;
            let src: &[u8] = if ip {
                src = recv.to_vec();
                &src
            } else {
                send
            };
            if n == 1 {
                recv.copy_from_slice(src);
                return Ok(());
            }
            // Even ranks send first, odd ones receive first: no cycle of waiting senders.
            if r % 2 == 0 {
                comm.send(src, to)?;
                comm.recv(recv, from)
            } else {
                comm.recv(recv, from)?;
                comm.send(src, to)
            }
        }
    }
}

/// Wrong elements on this rank.
fn check_result(comm: &dyn Comm, k: &Case, in_place: bool, b: &Buffers) -> u64 {
    let r = comm.rank();
    let off = b.off;
    let rb = k.bytes(k.c.recv);
    let exp = &b.expected[off..off + rb];
    let got: &[u8] = match (k.coll, in_place) {
        (Coll::ReduceScatter, true) => &b.send[off + r * rb..off + (r + 1) * rb],
        (Coll::Reduce, _) if r != k.root => return 0,
        _ => &b.recv[off..off + rb],
    };
    check::count_wrong(k.dt, k.op, got, exp)
}

fn allreduce_f64(comm: &dyn Comm, v: &mut [f64], op: ReduceOp) -> Result<(), CollError> {
    let send: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut recv = vec![0u8; send.len()];
    comm.allreduce(DataType::F64, op, &send, &mut recv)?;
    for (x, c) in v.iter_mut().zip(recv.chunks_exact(8)) {
        *x = f64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    }
    Ok(())
}

fn sum_u64(comm: &dyn Comm, v: u64) -> Result<u64, CollError> {
    let mut recv = [0u8; 8];
    comm.allreduce(DataType::U64, ReduceOp::Sum, &v.to_le_bytes(), &mut recv)?;
    Ok(u64::from_le_bytes(recv))
}

/// `-a`: rank 0's value, the mean, the minimum or the maximum over ranks.
fn across_ranks(comm: &dyn Comm, v: f64, average: u8) -> Result<f64, CollError> {
    let mut x = [v];
    match average {
        0 => {
            let mut b = v.to_le_bytes();
            comm.broadcast(&mut b, 0)?;
            return Ok(f64::from_le_bytes(b));
        }
        1 => allreduce_f64(comm, &mut x, ReduceOp::Sum)?,
        2 => allreduce_f64(comm, &mut x, ReduceOp::Min)?,
        _ => allreduce_f64(comm, &mut x, ReduceOp::Max)?,
    }
    Ok(if average == 1 {
        x[0] / comm.size() as f64
    } else {
        x[0]
    })
}

/// The result of timing one placement.
struct Timed {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
    per_iter: Option<(report::IterStats, Vec<f64>)>,
}

/// nccl-tests' `BenchTime`.
fn bench_time(
    comm: &dyn Comm,
    a: &PerfArgs,
    k: &Case,
    in_place: bool,
    rep: &mut u64,
    b: &mut Buffers,
) -> Result<Timed, CollError> {
    if a.check > 0 {
        init(comm, k, in_place, 99, b);
    }
    once(comm, k, in_place, b)?;
    comm.barrier()?;
    let per_iter = a.per_iter_timing == 1;
    let mut iter_times = Vec::new();
    let mut coll_only = Duration::ZERO;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    for _ in 0..a.iters {
        let it0 = Instant::now();
        for _ in 0..a.agg_iters {
            once(comm, k, in_place, b)?;
            if a.blocking == 1 {
                comm.barrier()?;
            }
        }
        let it = it0.elapsed();
        if per_iter {
            iter_times.push(it.as_secs_f64());
        }
        if a.blocking == 3 {
            coll_only += it;
            comm.barrier()?;
        }
    }
    let elapsed = if a.blocking == 3 {
        coll_only
    } else {
        t0.elapsed()
    };
    let ops = f64::from(a.iters) * f64::from(a.agg_iters);
    let cpu = (cpu_time() - cpu0) / ops;
    let delta = across_ranks(comm, elapsed.as_secs_f64() / ops, a.average)?;
    let n = comm.size();
    let bytes = k.bytes(k.c.param) as f64
        * if matches!(k.coll, Coll::ReduceScatter | Coll::AllGather) {
            n as f64
        } else {
            1.0
        };
    let algbw = bytes / 1e9 / delta;
    let busbw = algbw * k.coll.bus_factor(n);
    comm.barrier()?;
    let report_errors = a.check > 0 && !(k.coll == Coll::SendRecv && in_place);
    let mut wrong = 0u64;
    *rep += 1;
    for _ in 0..a.check {
        init(comm, k, in_place, *rep, b);
        once(comm, k, in_place, b)?;
        wrong = sum_u64(comm, check_result(comm, k, in_place, b))?;
        if wrong > 0 {
            break;
        }
    }
    let per = if per_iter {
        // Per iteration, the slowest rank.
        allreduce_f64(comm, &mut iter_times, ReduceOp::Max)?;
        let skip = (a.per_iter_skip as usize).min(iter_times.len());
        Some((report::iter_stats(&iter_times[skip..]), iter_times))
    } else {
        None
    };
    let time = if a.report_cputime == 1 { cpu } else { delta };
    Ok(Timed {
        time_us: time * 1e6,
        algbw,
        busbw,
        wrong: report_errors.then_some(wrong),
        per_iter: per,
    })
}

/// This process's CPU time, seconds.
fn cpu_time() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
        .unwrap_or(0.0)
}

/// Variables worth keeping in the JSON's `env`.
fn relevant_env(name: &str) -> bool {
    [
        "NCCL_",
        "ROCECTL_",
        "OMPI_COMM_WORLD_",
        "PMI_",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// The device line of this rank (`#  Rank  0 Group  0 Pid … on HOST device  0 [ADDR] NAME`).
fn device_line(comm: &dyn Comm) -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "?".into());
    let (addr, name) = comm.device();
    format!(
        "#  Rank {:>2} Group {:>2} Pid {:>6} on {host:>10} device {:>2} [{addr}] {name}",
        comm.rank(),
        0,
        std::process::id(),
        0
    )
}

/// Rank 0 gets every rank's device line, in rank order.
fn gather_lines(comm: &dyn Comm, line: &str) -> Result<Vec<String>, CollError> {
    const MAX: usize = 512;
    let mut mine = vec![0u8; MAX];
    let l = line.len().min(MAX - 1);
    mine[..l].copy_from_slice(&line.as_bytes()[..l]);
    let mut all = vec![0u8; MAX * comm.size()];
    comm.allgather(&mine, &mut all)?;
    Ok(all
        .chunks(MAX)
        .map(|c| {
            let end = c.iter().position(|&x| x == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

/// Opens `path` for the JSON as nccl-tests does: a new file, else `path.0`, `path.1`…
fn create_json(path: &std::path::Path) -> Option<(std::fs::File, PathBuf)> {
    let mut p = path.to_path_buf();
    for i in 0..1000 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Some((f, p)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                p = PathBuf::from(format!("{}.{i}", path.display()));
            }
            Err(_) => return None,
        }
    }
    None
}

/// The whole benchmark on `comm`; rank 0 writes the table to `out` (and the JSON).
pub(crate) fn bench(
    comm: &dyn Comm,
    a: &PerfArgs,
    notes: &[String],
    argv: &[String],
    out: &mut dyn Write,
) -> Result<Summary, BenchError> {
    let main = comm.rank() == 0;
    let n = comm.size();
    let print = |out: &mut dyn Write, s: &str| -> std::io::Result<()> {
        if main {
            out.write_all(s.as_bytes())?;
        }
        Ok(())
    };
    if a.root >= n as i64 && a.collective.has_root() {
        return Err(BenchError::Coll(CollError::InvalidArgument(format!(
            "-r {}: there are {n} ranks",
            a.root
        ))));
    }
    let mut json = match (&a.output_file, main) {
        (Some(p), true) => match create_json(p) {
            Some((f, path)) => {
                print(
                    out,
                    &format!("# Writing JSON output to {}\n", path.display()),
                )?;
                Some(f)
            }
            None => {
                print(
                    out,
                    &format!("# skipping json output; {} not accessible\n", p.display()),
                )?;
                None
            }
        },
        _ => None,
    };
    let mut doc = JsonReport {
        version: 3,
        start_time: report::now_string(),
        args: argv.to_vec(),
        env: std::env::vars()
            .filter(|(k, _)| relevant_env(k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        nccl_version: 0,
        rocectl_version: env!("CARGO_PKG_VERSION"),
        config: None,
        results: Vec::new(),
        out_of_bounds: None,
        average_bus_bandwidth: None,
        errors: Vec::new(),
        end_time: String::new(),
    };
    for note in notes {
        print(out, &format!("{note}\n"))?;
    }
    let step = if a.stepfactor > 1 {
        a.stepfactor
    } else {
        a.stepbytes
    };
    let step_kind = if a.stepfactor > 1 { "factor" } else { "bytes" };
    print(
        out,
        &format!(
            "# nccl-tests version 2.19.6 output by rocectl coll-perf {} (roce-collectives)\n\
             # Collective test starting: {}\n\
             # nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step}({step_kind}) warmup iters: {} \
             iters: {} agg iters: {} validation: {} graph: {} unalign: {}\n",
            env!("CARGO_PKG_VERSION"),
            a.collective.program(),
            a.minbytes,
            a.maxbytes,
            a.warmup_iters,
            a.iters,
            a.agg_iters,
            a.check,
            a.cudagraph,
            a.unalign
        ),
    )?;
    match a.blocking {
        1 => print(out, "# Blocking Enabled: wait and barrier after each inner iteration (-m) \n")?,
        2 => print(out, "# Blocking Enabled: wait after each inner iteration (-m), no barrier \n")?,
        3 => print(
            out,
            "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n",
        )?,
        _ => {}
    }
    if a.per_iter_timing == 1 {
        let skip = if a.per_iter_skip > 0 {
            format!("; summary skips first {} iterations", a.per_iter_skip)
        } else {
            String::new()
        };
        print(out, &format!("# Per-Iteration Report: wall-clock timing; i_* uses max over process rows{skip} \n"))?;
    }
    print(out, "#\n# Using devices\n")?;
    let lines = gather_lines(comm, &device_line(comm))?;
    for l in &lines {
        print(out, &format!("{l}\n"))?;
    }
    if main && json.is_some() {
        doc.config = Some(report::JsonConfig {
            nthreads: 1,
            ngpus: 1,
            minimum_bytes: a.minbytes,
            maximum_bytes: a.maxbytes,
            step_factor: (a.stepfactor > 1).then_some(a.stepfactor),
            step_bytes: (a.stepfactor <= 1).then_some(a.stepbytes),
            warmup_iters: a.warmup_iters,
            iterations: a.iters,
            aggregated_iterations: a.agg_iters,
            validation: a.check,
            graph: a.cudagraph,
            blocking_collectives: if a.blocking != 0 { "true" } else { "false" },
            per_iter_timing: if a.per_iter_timing != 0 {
                "true"
            } else {
                "false"
            },
            per_iter_skip: a.per_iter_skip,
            parallel_init: if a.parallel_init != 0 {
                "true"
            } else {
                "false"
            },
            devices: lines
                .iter()
                .enumerate()
                .map(|(i, l)| report::JsonDevice {
                    rank: i,
                    group: 0,
                    pid: l
                        .split("Pid")
                        .nth(1)
                        .and_then(|s| s.split_whitespace().next())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                    hostname: l
                        .split(" on ")
                        .nth(1)
                        .and_then(|s| s.split_whitespace().next())
                        .unwrap_or("")
                        .to_string(),
                    device: 0,
                    device_hex: l
                        .split('[')
                        .nth(1)
                        .and_then(|s| s.split(']').next())
                        .unwrap_or("")
                        .to_string(),
                    device_info: l.rsplit("] ").next().unwrap_or("").to_string(),
                })
                .collect(),
        });
    }
    print(
        out,
        &report::header(
            a.report_cputime == 1,
            a.report_timestamps == 1,
            a.per_iter_timing == 1,
        ),
    )?;

    // Buffers for the largest size of every type.
    let sizes = sweep(a.minbytes, a.maxbytes, a.stepbytes, a.stepfactor);
    let max_dt = a.datatype.0.iter().map(|d| d.size()).max().unwrap_or(8);
    let (mut max_send, mut max_recv) = (0usize, 0usize);
    for dt in &a.datatype.0 {
        for &s in sizes.iter().chain(std::iter::once(&a.maxbytes)) {
            let c = counts(a.collective, s, *dt, n);
            max_send = max_send.max(c.send * dt.size());
            max_recv = max_recv.max(c.recv * dt.size());
        }
    }
    let off = a.unalign as usize * max_dt;
    let mut bufs = Buffers {
        send: vec![0u8; max_send + off],
        recv: vec![0u8; max_recv + off],
        expected: vec![0u8; max_recv + off],
        off: 0,
    };
    let ops: Vec<Option<ReduceOp>> = if a.collective.has_op() {
        a.op.0.iter().copied().map(Some).collect()
    } else {
        vec![None]
    };
    let roots: Vec<i64> = if !a.collective.has_root() {
        vec![-1]
    } else if a.root == -1 {
        (0..n as i64).collect()
    } else {
        vec![a.root]
    };
    let mut summary = Summary::default();
    let (mut bw_sum, mut bw_count) = (0.0f64, 0u64);
    let mut rep = 0u64;
    comm.barrier()?;
    let mut cycle = 0u32;
    loop {
        for &dt in &a.datatype.0 {
            for &op in &ops {
                let opv = op.unwrap_or(ReduceOp::Sum);
                if !dt.supports(opv) {
                    continue;
                }
                for &root in &roots {
                    bufs.off = a.unalign as usize * dt.size();
                    let mk = |s: u64| Case {
                        coll: a.collective,
                        dt,
                        op: opv,
                        root: usize::try_from(root).unwrap_or(0),
                        c: counts(a.collective, s, dt, n),
                    };
                    // Warm-up: every size from min to max, doubling.
                    if cycle == 0 {
                        let mut s = a.minbytes;
                        while s <= a.maxbytes {
                            let k = mk(s);
                            for _ in 0..a.warmup_iters {
                                once(comm, &k, false, &mut bufs)?;
                            }
                            if s == 0 {
                                break;
                            }
                            s *= 2;
                        }
                    }
                    for &s in &sizes {
                        let k = mk(s);
                        let opname = op.map_or("none", ReduceOp::name);
                        let shown = k.bytes(k.c.send.max(k.c.recv));
                        let mut line = report::preamble(shown, k.c.param, dt.name(), opname, root);
                        let mut row = JsonResult {
                            size: shown,
                            count: k.c.param,
                            ty: dt.name().into(),
                            redop: opname.into(),
                            root: format!("{root:>6}"),
                            out_of_place: None,
                            out_of_place_per_iter: None,
                            in_place: None,
                            in_place_per_iter: None,
                            actual_iterations: a.iters,
                            experiment_name: String::new(),
                        };
                        for in_place in [false, true] {
                            let t = bench_time(comm, a, &k, in_place, &mut rep, &mut bufs)?;
                            line += &report::body(t.time_us, t.algbw, t.busbw, t.wrong);
                            let body = JsonBody {
                                time: if a.report_cputime == 1 {
                                    JsonTime::CpuTime(t.time_us)
                                } else {
                                    JsonTime::Time(t.time_us)
                                },
                                alg_bw: t.algbw,
                                bus_bw: t.busbw,
                                nwrong: t.wrong.map(|w| w as f64),
                            };
                            let per = t.per_iter.as_ref().map(|(st, times)| {
                                line += &report::per_iter(st);
                                JsonPerIter::new(st, times, a.per_iter_skip)
                            });
                            if in_place {
                                row.in_place = Some(body);
                                row.in_place_per_iter = per;
                            } else {
                                row.out_of_place = Some(body);
                                row.out_of_place_per_iter = per;
                            }
                            if let Some(w) = t.wrong {
                                summary.wrong += w;
                                if w > 0 {
                                    // Every rank counts the line, as nccl-tests' processes do.
                                    summary.errors += n as u64;
                                }
                            }
                            bw_sum += t.busbw;
                            bw_count += 1;
                        }
                        if a.report_timestamps == 1 {
                            line += &format!("{:>21}", report::now_string());
                        }
                        line.push('\n');
                        print(out, &line)?;
                        out.flush()?;
                        doc.results.push(row);
                    }
                }
            }
        }
        cycle += 1;
        if a.run_cycles != 0 && cycle >= a.run_cycles {
            break;
        }
    }
    summary.avg_busbw = if bw_count > 0 {
        bw_sum / bw_count as f64
    } else {
        0.0
    };
    let check_bw = std::env::var("NCCL_TESTS_MIN_BW")
        .ok()
        .and_then(|v| v.parse::<f64>().ok());
    summary.min_bw_failed = check_bw.is_some_and(|c| summary.avg_busbw < c * 0.9);
    print(
        out,
        &report::footer(
            summary.errors,
            summary.avg_busbw,
            check_bw,
            a.collective.program(),
        ),
    )?;
    out.flush()?;
    if let Some(f) = json.as_mut() {
        doc.out_of_bounds = Some(report::JsonBounds {
            count: summary.errors,
            okay: if summary.errors == 0 { "true" } else { "false" },
        });
        doc.average_bus_bandwidth = Some(report::JsonAvg {
            bandwidth: summary.avg_busbw,
            okay: match check_bw {
                None => "unchecked",
                Some(_) if summary.min_bw_failed => "false",
                Some(_) => "true",
            },
        });
        doc.end_time = report::now_string();
        serde_json::to_writer(&mut *f, &doc).map_err(std::io::Error::other)?;
        f.flush()?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::comm::tests::ThreadComm;
    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn args(line: &str) -> PerfArgs {
        Cli::try_parse_from(std::iter::once("coll-perf").chain(line.split_whitespace()))
            .unwrap()
            .perf
    }

    /// Runs `line` on an in-memory world of `n` ranks; rank 0's output and every summary.
    fn run_world(n: usize, line: &str, corrupt_rank: Option<usize>) -> (String, Vec<Summary>) {
        let comms = ThreadComm::world(n);
        let results: Vec<(String, Summary)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    c.corrupt = corrupt_rank == Some(c.rank());
                    let a = args(line);
                    s.spawn(move || {
                        let mut out = Vec::new();
                        let sum =
                            bench(&c, &a, &[], &[], &mut out).unwrap_or_else(|e| panic!("{e:?}"));
                        (String::from_utf8(out).unwrap(), sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let out = results[0].0.clone();
        assert!(
            results[1..].iter().all(|r| r.0.is_empty()),
            "only rank 0 prints"
        );
        (out, results.into_iter().map(|r| r.1).collect())
    }

    fn table(out: &str) -> Vec<Vec<String>> {
        out.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    }

    #[test]
    fn sizes_counts_and_bus_factors_are_nccl_tests() {
        assert_eq!(sweep(8, 128, 0, 2), vec![8, 16, 32, 64, 128]);
        assert_eq!(sweep(1024, 3072, 1024, 1), vec![1024, 2048, 3072]);
        assert_eq!(sweep(0, 0, 0, 2), vec![0]);
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert!(parse_size("12Q").is_err() && parse_size("x").is_err());
        let c = counts(Coll::AllGather, 1024, DataType::F32, 3);
        // 256 floats / 3 = 85, rounded down to a multiple of 4 (16 bytes).
        assert_eq!(
            c,
            Counts {
                param: 84,
                send: 84,
                recv: 252
            }
        );
        let c = counts(Coll::ReduceScatter, 1000, DataType::I8, 2);
        assert_eq!(
            c,
            Counts {
                param: 496,
                send: 992,
                recv: 496
            }
        );
        assert_eq!(counts(Coll::AllReduce, 4100, DataType::F64, 4).param, 512);
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::Broadcast.bus_factor(4), 1.0);
    }

    #[test]
    fn every_collective_checks_out_on_a_correct_world_and_the_table_has_nccl_tests_columns() {
        for coll in [
            "all_reduce",
            "reduce_scatter",
            "all_gather",
            "broadcast",
            "reduce",
            "sendrecv",
        ] {
            for n in [1, 2, 3] {
                let (out, sums) =
                    run_world(n, &format!("{coll} -b 8 -e 4K -f 4 -n 2 -w 1 -c 1"), None);
                assert!(
                    sums.iter().all(|s| s.wrong == 0 && s.errors == 0),
                    "{coll} n={n}\n{out}"
                );
                let rows = table(&out);
                assert_eq!(
                    rows.len(),
                    5,
                    "{coll} n={n}: sizes 8 32 128 512 2048\n{out}"
                );
                for r in &rows {
                    assert_eq!(r.len(), 13, "{coll}: {r:?}");
                    assert_eq!(r[2], "float");
                    assert_eq!(r[8], "0");
                    let in_place_wrong = if coll == "sendrecv" { "N/A" } else { "0" };
                    assert_eq!(r[12], in_place_wrong, "{coll}");
                }
                assert!(out.contains(&format!("# Collective test starting: {coll}_perf")));
                assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
                assert!(out.contains("# Avg bus bandwidth    : "));
                assert_eq!(out.matches("#  Rank ").count(), n);
            }
        }
    }

    #[test]
    fn a_wrong_value_on_one_rank_is_counted_and_fails_the_run() {
        let (out, sums) = run_world(3, "all_reduce -b 64 -e 64 -n 1 -c 1", Some(2));
        let rows = table(&out);
        assert_eq!(rows[0][8], "1", "{out}");
        assert!(out.contains("# Out of bounds values : 6 FAILED"), "{out}");
        assert!(sums.iter().all(Summary::failed));
        // Without checks nothing is counted, and #wrong says N/A.
        let (out, sums) = run_world(2, "all_reduce -b 64 -e 64 -n 1 -c 0", Some(1));
        assert_eq!(table(&out)[0][8], "N/A");
        assert!(sums.iter().all(|s| !s.failed()));
    }

    #[test]
    fn types_ops_roots_and_per_iteration_columns() {
        let (out, sums) = run_world(3, "reduce -b 256 -e 256 -d all -o all -r -1 -n 1", None);
        assert!(sums.iter().all(|s| s.wrong == 0), "{out}");
        // 10 types × 5 ops × 3 roots.
        assert_eq!(table(&out).len(), 150);
        let (out, _) = run_world(
            2,
            "all_reduce -b 1K -e 1K -n 4 -I 1 -K 1 -d int32 -o bxor",
            None,
        );
        let rows = table(&out);
        assert_eq!(rows[0].len(), 5 + 8 + 8, "{out}");
        assert_eq!(
            (rows[0][2].as_str(), rows[0][3].as_str()),
            ("int32", "bxor")
        );
        let (out, _) = run_world(
            2,
            "all_gather -b 1K -e 1K -n 1 -u 3 -d half -z 3 -a 3",
            None,
        );
        assert!(out.contains("time excludes barrier"));
        assert_eq!(table(&out)[0][8], "0");
    }

    #[test]
    fn json_has_nccl_tests_keys() {
        let dir = std::env::temp_dir().join(format!("collperf-json-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("r.json");
        let _ = std::fs::remove_file(&path);
        let (out, _) = run_world(
            2,
            &format!("broadcast -b 1K -e 2K -f 2 -n 1 -J {}", path.display()),
            None,
        );
        assert!(
            out.starts_with(&format!("# Writing JSON output to {}", path.display())),
            "{out}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["version"], 3);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        let r = &v["results"][0];
        assert_eq!(
            (r["size"].as_u64(), r["type"].as_str(), r["root"].as_str()),
            (Some(1024), Some("float"), Some("     0"))
        );
        assert!(r["out_of_place"]["alg_bw"].as_f64().unwrap() > 0.0);
        assert_eq!(r["in_place"]["nwrong"], 0.0);
        assert_eq!(v["out_of_bounds"]["okay"], "true");
        assert_eq!(v["config"]["devices"].as_array().unwrap().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_combinations_are_refused() {
        assert!(validate(&args("-b 2M -e 1M"))
            .unwrap_err()
            .contains("minbytes"));
        assert!(validate(&args("-t 2")).is_err());
        assert!(validate(&args("-b 1 -e 8 -i 0")).is_err());
        assert!(validate(&args("-K 1")).is_err());
        assert_eq!(validate(&args("-G 2")).unwrap().len(), 1);
        for bad in ["-d quad", "-o mulsum", "-z 4", "-b 1X", "-n 0", "bcast"] {
            assert!(
                Cli::try_parse_from(std::iter::once("coll-perf").chain(bad.split_whitespace()))
                    .is_err(),
                "{bad}"
            );
        }
    }
}
