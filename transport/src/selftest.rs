//! An end-to-end exercise of two devices: every RC operation and UD SEND, data verified byte
//! for byte. `rocectl demo` prints its reports; the integration tests run it over every
//! backend (sim, loopback UDP, veth UDP and raw, with kernel-injected loss).

use std::fmt;
use std::time::{Duration, Instant};

use roce_qp::verbs::{
    AddressHandle, Completion, QpType, RecvWr, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
};
use roce_wire::{Psn, QKey};

use crate::{
    Access, CompletionQueue, ConnectOptions, Device, MemoryRegion, ProtectionDomain, QpInit,
    QueuePair, RemoteQp,
};

/// What one step did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Operation name (`RC SEND`, `RC RDMA_WRITE_WITH_IMM`, ...).
    pub op: &'static str,
    /// Message size in bytes.
    pub bytes: usize,
    /// Messages.
    pub messages: usize,
    /// Wall time from the first post to the last completion.
    pub elapsed: Duration,
}

impl StepReport {
    /// Payload bytes per second.
    pub fn bandwidth(&self) -> f64 {
        (self.bytes * self.messages) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Average time per message.
    pub fn latency(&self) -> Duration {
        self.elapsed / self.messages.max(1) as u32
    }
}

impl fmt::Display for StepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<24} {:>8} B x {:<4} {:>10.1} MB/s {:>9.1} us/msg",
            self.op,
            self.bytes,
            self.messages,
            self.bandwidth() / 1e6,
            self.latency().as_secs_f64() * 1e6
        )
    }
}

/// A failed step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelftestError {
    /// A completion did not arrive in time.
    #[error("{op} {bytes} B: no completion within {timeout:?} (device says: {last_error})")]
    Timeout {
        /// Operation.
        op: &'static str,
        /// Size.
        bytes: usize,
        /// How long we waited.
        timeout: Duration,
        /// The device's last error, if any.
        last_error: String,
    },
    /// A completion with an error status, or the wrong opcode/length/immediate.
    #[error("{op} {bytes} B: bad completion {completion:?}")]
    BadCompletion {
        /// Operation.
        op: &'static str,
        /// Size.
        bytes: usize,
        /// What came.
        completion: Box<Completion>,
    },
    /// The data arrived different.
    #[error("{op} {bytes} B: data differs at byte {offset}")]
    DataMismatch {
        /// Operation.
        op: &'static str,
        /// Size.
        bytes: usize,
        /// First differing byte.
        offset: usize,
    },
    /// Setting up failed.
    #[error("setup: {0}")]
    Setup(String),
}

/// Options of a run.
#[derive(Clone, Debug)]
pub struct SelftestOptions {
    /// Message sizes for SEND, WRITE, WRITE_WITH_IMM and READ.
    pub sizes: Vec<usize>,
    /// Messages per size.
    pub iterations: usize,
    /// UD SEND sizes (at most the path MTU).
    pub ud_sizes: Vec<usize>,
    /// Per-completion timeout.
    pub timeout: Duration,
    /// ACK timeout exponent for the RC QPs.
    pub ack_timeout: u8,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        Self {
            sizes: vec![0, 1, 4096, 65_536, 1 << 20],
            iterations: 1,
            ud_sizes: vec![0, 64, 1024],
            timeout: Duration::from_secs(20),
            ack_timeout: 12,
        }
    }
}

struct Side {
    dev: Device,
    peer: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

impl Side {
    fn new(dev: &Device, peer: &Device) -> Result<Self, SelftestError> {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4096).map_err(setup)?;
        Ok(Self {
            dev: dev.clone(),
            peer: peer.clone(),
            pd,
            cq,
        })
    }

    fn mr(&self, len: usize, fill: Option<u8>) -> Result<MemoryRegion, SelftestError> {
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = self.pd.register_zeroed(len, access).map_err(setup)?;
        if let Some(seed) = fill {
            mr.write(0, &pattern(len, seed)).map_err(setup)?;
        }
        Ok(mr)
    }

    fn wait(
        &self,
        op: &'static str,
        bytes: usize,
        timeout: Duration,
    ) -> Result<Completion, SelftestError> {
        let mut wc = [Completion::EMPTY];
        let deadline = Instant::now() + timeout;
        // Drive the peer too: with application-driven progress nobody else does (a
        // collective library polls all its devices the same way).
        let mut got = 0;
        while got == 0 && Instant::now() < deadline {
            got = self.cq.wait(&mut wc, Duration::from_millis(1));
            if got == 0 {
                self.peer.progress();
            }
        }
        if got == 0 {
            return Err(SelftestError::Timeout {
                op,
                bytes,
                timeout,
                last_error: self.dev.last_error().unwrap_or_else(|| "nothing".into()),
            });
        }
        if wc[0].status != WcStatus::Success {
            return Err(SelftestError::BadCompletion {
                op,
                bytes,
                completion: Box::new(wc[0]),
            });
        }
        Ok(wc[0])
    }
}

fn setup(e: impl fmt::Display) -> SelftestError {
    SelftestError::Setup(e.to_string())
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ seed)
        .collect()
}

fn compare(op: &'static str, got: &[u8], want: &[u8]) -> Result<(), SelftestError> {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(offset) => Err(SelftestError::DataMismatch {
            op,
            bytes: want.len(),
            offset,
        }),
        None if got.len() != want.len() => Err(SelftestError::DataMismatch {
            op,
            bytes: want.len(),
            offset: got.len().min(want.len()),
        }),
        None => Ok(()),
    }
}

fn expect(
    c: &Completion,
    op: &'static str,
    bytes: usize,
    opcode: WcOpcode,
    len: Option<usize>,
) -> Result<(), SelftestError> {
    if c.opcode != opcode || len.is_some_and(|l| c.byte_len as usize != l) {
        return Err(SelftestError::BadCompletion {
            op,
            bytes,
            completion: Box::new(*c),
        });
    }
    Ok(())
}

/// Connects an RC QP on each device and runs SEND, RDMA WRITE, WRITE_WITH_IMM and READ at
/// every size, then both atomics. `report` is called after each step.
///
/// # Errors
/// The first step that fails.
pub fn run_rc(
    a: &Device,
    b: &Device,
    opts: &SelftestOptions,
    report: &mut dyn FnMut(&StepReport),
) -> Result<(), SelftestError> {
    let (sa, sb) = (Side::new(a, b)?, Side::new(b, a)?);
    let qa = sa
        .pd
        .create_qp(&QpInit::new(QpType::Rc, &sa.cq))
        .map_err(setup)?;
    let qb = sb
        .pd
        .create_qp(&QpInit::new(QpType::Rc, &sb.cq))
        .map_err(setup)?;
    connect(&qa, &qb, a, b, opts)?;
    let max = opts.sizes.iter().copied().max().unwrap_or(0).max(8);
    let t = opts.timeout;
    for &n in &opts.sizes {
        for (i, op) in [
            "RC SEND",
            "RC RDMA_WRITE",
            "RC RDMA_WRITE_WITH_IMM",
            "RC RDMA_READ",
        ]
        .into_iter()
        .enumerate()
        {
            let seed = (i as u8).wrapping_mul(31) ^ (n as u8);
            let src = sa.mr(max, Some(seed))?;
            let dst = sb.mr(max, None)?;
            let want = pattern(n, seed);
            let start = Instant::now();
            for it in 0..opts.iterations {
                let wr_id = it as u64;
                match i {
                    0 => {
                        qb.post_recv(RecvWr {
                            wr_id,
                            sges: vec![dst.sge(0, n)],
                        })
                        .map_err(setup)?;
                        post(&qa, SendWr::new(wr_id, SendOp::Send, vec![src.sge(0, n)]))?;
                        expect(&sa.wait(op, n, t)?, op, n, WcOpcode::Send, None)?;
                        let c = sb.wait(op, n, t)?;
                        expect(&c, op, n, WcOpcode::Recv, Some(n))?;
                    }
                    1 => {
                        let wr = SendOp::RdmaWrite {
                            remote_addr: dst.addr(),
                            rkey: dst.rkey(),
                        };
                        post(&qa, SendWr::new(wr_id, wr, vec![src.sge(0, n)]))?;
                        expect(&sa.wait(op, n, t)?, op, n, WcOpcode::RdmaWrite, None)?;
                    }
                    2 => {
                        let imm = 0xC0DE_0000 | it as u32;
                        qb.post_recv(RecvWr {
                            wr_id,
                            sges: vec![],
                        })
                        .map_err(setup)?;
                        let wr = SendOp::RdmaWriteWithImm {
                            remote_addr: dst.addr(),
                            rkey: dst.rkey(),
                            imm,
                        };
                        post(&qa, SendWr::new(wr_id, wr, vec![src.sge(0, n)]))?;
                        expect(&sa.wait(op, n, t)?, op, n, WcOpcode::RdmaWrite, None)?;
                        let c = sb.wait(op, n, t)?;
                        expect(&c, op, n, WcOpcode::RecvRdmaWithImm, Some(n))?;
                        if c.imm_data != Some(imm) {
                            return Err(SelftestError::BadCompletion {
                                op,
                                bytes: n,
                                completion: Box::new(c),
                            });
                        }
                    }
                    _ => {
                        // READ: b's memory holds the pattern, a reads it into a zeroed region.
                        dst.write(0, &want).map_err(setup)?;
                        src.write(0, &vec![0u8; n]).map_err(setup)?;
                        let wr = SendOp::RdmaRead {
                            remote_addr: dst.addr(),
                            rkey: dst.rkey(),
                        };
                        post(&qa, SendWr::new(wr_id, wr, vec![src.sge(0, n)]))?;
                        expect(&sa.wait(op, n, t)?, op, n, WcOpcode::RdmaRead, Some(n))?;
                    }
                }
            }
            let elapsed = start.elapsed();
            let mut got = vec![0u8; n];
            if i == 3 {
                src.read(0, &mut got).map_err(setup)?;
            } else {
                dst.read(0, &mut got).map_err(setup)?;
            }
            compare(op, &got, &want)?;
            report(&StepReport {
                op,
                bytes: n,
                messages: opts.iterations,
                elapsed,
            });
        }
    }
    atomics(&sa, &sb, &qa, opts, report)
}

fn atomics(
    sa: &Side,
    sb: &Side,
    qa: &QueuePair,
    opts: &SelftestOptions,
    report: &mut dyn FnMut(&StepReport),
) -> Result<(), SelftestError> {
    let t = opts.timeout;
    let target = sb.mr(8, None)?;
    target.write(0, &100u64.to_ne_bytes()).map_err(setup)?;
    let result = sa.mr(8, None)?;
    let n = opts.iterations.max(1);
    // FETCH_ADD n times: returns 100, 101, ...; the target ends at 100 + n.
    let op = "RC ATOMIC_FETCH_ADD";
    let start = Instant::now();
    for i in 0..n {
        let wr = SendOp::AtomicFetchAndAdd {
            remote_addr: target.addr(),
            rkey: target.rkey(),
            add: 1,
        };
        post(qa, SendWr::new(i as u64, wr, vec![result.sge(0, 8)]))?;
        expect(&sa.wait(op, 8, t)?, op, 8, WcOpcode::FetchAdd, Some(8))?;
        let mut old = [0u8; 8];
        result.read(0, &mut old).map_err(setup)?;
        compare(op, &old, &(100 + i as u64).to_ne_bytes())?;
    }
    let mut now = [0u8; 8];
    target.read(0, &mut now).map_err(setup)?;
    compare(op, &now, &(100 + n as u64).to_ne_bytes())?;
    report(&StepReport {
        op,
        bytes: 8,
        messages: n,
        elapsed: start.elapsed(),
    });
    // COMPARE_SWAP: a miss leaves the value, a hit swaps it; both return the old value.
    let op = "RC ATOMIC_CMP_SWAP";
    let start = Instant::now();
    let cur = 100 + n as u64;
    for (i, (compare_with, expect_after)) in
        [(cur + 1, cur), (cur, 0xFEED_F00D)].into_iter().enumerate()
    {
        let wr = SendOp::AtomicCmpAndSwp {
            remote_addr: target.addr(),
            rkey: target.rkey(),
            compare: compare_with,
            swap: 0xFEED_F00D,
        };
        post(qa, SendWr::new(i as u64, wr, vec![result.sge(0, 8)]))?;
        expect(&sa.wait(op, 8, t)?, op, 8, WcOpcode::CompSwap, Some(8))?;
        let mut old = [0u8; 8];
        result.read(0, &mut old).map_err(setup)?;
        compare(op, &old, &cur.to_ne_bytes())?;
        target.read(0, &mut now).map_err(setup)?;
        compare(op, &now, &expect_after.to_ne_bytes())?;
    }
    report(&StepReport {
        op,
        bytes: 8,
        messages: 2,
        elapsed: start.elapsed(),
    });
    Ok(())
}

/// UD QPs on each device; `a` sends every UD size to `b`, data checked after the 40-byte
/// GRH area.
///
/// # Errors
/// The first step that fails.
pub fn run_ud(
    a: &Device,
    b: &Device,
    opts: &SelftestOptions,
    report: &mut dyn FnMut(&StepReport),
) -> Result<(), SelftestError> {
    let (sa, sb) = (Side::new(a, b)?, Side::new(b, a)?);
    let qa = sa
        .pd
        .create_qp(&QpInit::new(QpType::Ud, &sa.cq))
        .map_err(setup)?;
    let qb = sb
        .pd
        .create_qp(&QpInit::new(QpType::Ud, &sb.cq))
        .map_err(setup)?;
    let qkey = QKey::new(0x1111_1111);
    let copts = ConnectOptions {
        qkey,
        ..ConnectOptions::default()
    };
    let none = RemoteQp {
        qpn: qb.qpn(),
        psn: Psn::new(0),
        gid: b.local_gid(),
    };
    qa.connect(&none, &copts).map_err(setup)?;
    qb.connect(&none, &copts).map_err(setup)?;
    let op = "UD SEND";
    for &n in &opts.ud_sizes {
        let src = sa.mr(n.max(1), Some(n as u8))?;
        let dst = sb.mr(n + 40, None)?;
        let start = Instant::now();
        for it in 0..opts.iterations {
            qb.post_recv(RecvWr {
                wr_id: it as u64,
                sges: vec![dst.sge(0, n + 40)],
            })
            .map_err(setup)?;
            let mut wr = SendWr::new(it as u64, SendOp::Send, vec![src.sge(0, n)]);
            wr.ud = Some(UdDest {
                ah: AddressHandle::new(b.local_gid()),
                remote_qpn: qb.qpn(),
                remote_qkey: qkey,
            });
            post(&qa, wr)?;
            expect(&sa.wait(op, n, opts.timeout)?, op, n, WcOpcode::Send, None)?;
            let c = sb.wait(op, n, opts.timeout)?;
            expect(&c, op, n, WcOpcode::Recv, Some(n + 40))?;
            if c.src_qp != qa.qpn() || !c.grh {
                return Err(SelftestError::BadCompletion {
                    op,
                    bytes: n,
                    completion: Box::new(c),
                });
            }
        }
        let elapsed = start.elapsed();
        let mut got = vec![0u8; n];
        dst.read(40, &mut got).map_err(setup)?;
        compare(op, &got, &pattern(n, n as u8))?;
        report(&StepReport {
            op,
            bytes: n,
            messages: opts.iterations,
            elapsed,
        });
    }
    Ok(())
}

fn connect(
    qa: &QueuePair,
    qb: &QueuePair,
    a: &Device,
    b: &Device,
    opts: &SelftestOptions,
) -> Result<(), SelftestError> {
    let (pa, pb) = (a.random_psn(), b.random_psn());
    let base = ConnectOptions {
        timeout: opts.ack_timeout,
        ..ConnectOptions::default()
    };
    qa.connect(
        &RemoteQp {
            qpn: qb.qpn(),
            psn: Psn::new(pb),
            gid: b.local_gid(),
        },
        &ConnectOptions {
            local_psn: Psn::new(pa),
            ..base
        },
    )
    .map_err(setup)?;
    qb.connect(
        &RemoteQp {
            qpn: qa.qpn(),
            psn: Psn::new(pa),
            gid: a.local_gid(),
        },
        &ConnectOptions {
            local_psn: Psn::new(pb),
            ..base
        },
    )
    .map_err(setup)
}

fn post(qp: &QueuePair, wr: SendWr) -> Result<(), SelftestError> {
    qp.post_send(wr).map_err(setup)
}
