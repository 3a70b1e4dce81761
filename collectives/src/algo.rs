//! The algorithms, as plans: lists of phases (transfer phases for the executor in
//! [`crate::net`], and local steps) over an operation's buffers. Buffer 0 is the working
//! buffer (the caller's, or a copy); temporaries follow.
//!
//! Every element's final value is computed by exactly one rank and then copied to the
//! others, or computed by every rank in the same canonical order (recursive doubling: the
//! lower half's partial first), so all ranks hold bit-identical results.

use crate::dtype::{DataType, ReduceOp};
use crate::error::CollError;
use crate::net::{Apply, Region, Xfer, SRC};
use crate::reduce::{finish, reduce_many};

/// A local step over the buffers.
pub(crate) type LocalFn = Box<dyn FnOnce(&mut [&mut [u8]]) -> Result<(), CollError> + Send>;

/// One phase of a plan.
pub(crate) enum Phase {
    /// Transfers, with the name errors give.
    X(String, Xfer),
    /// A local computation.
    Local(LocalFn),
}

/// A plan: phases and the sizes of its temporary buffers (buffers 1, 2, …).
#[derive(Default)]
pub(crate) struct Plan {
    pub(crate) phases: Vec<Phase>,
    pub(crate) temps: Vec<usize>,
}

impl Plan {
    fn x(&mut self, name: impl Into<String>, x: Xfer) {
        if !x.sends.is_empty() || !x.recvs.is_empty() {
            self.phases.push(Phase::X(name.into(), x));
        }
    }
    fn local(
        &mut self,
        f: impl FnOnce(&mut [&mut [u8]]) -> Result<(), CollError> + Send + 'static,
    ) {
        self.phases.push(Phase::Local(Box::new(f)));
    }
    fn temp(&mut self, len: usize) -> usize {
        self.temps.push(len);
        self.temps.len()
    }
}

/// Balanced split of `count` elements into `n` blocks: (byte offset, byte length) each.
pub(crate) fn blocks(count: usize, n: usize, es: usize) -> Vec<(usize, usize)> {
    let base = count / n;
    let extra = count % n;
    let mut off = 0;
    (0..n)
        .map(|i| {
            let len = (base + usize::from(i < extra)) * es;
            let b = (off, len);
            off += len;
            b
        })
        .collect()
}

fn block(b: &[(usize, usize)], i: usize) -> Region {
    Region::new(0, b[i].0, b[i].1)
}

const fn md(a: isize, n: usize) -> usize {
    a.rem_euclid(n as isize) as usize
}

/// The avg division, on `region` of buffer 0.
fn finish_step(plan: &mut Plan, dt: DataType, op: ReduceOp, n: usize, region: Region) {
    if op == ReduceOp::Avg {
        plan.local(move |b| finish(dt, op, &mut b[0][region.off..region.off + region.len], n));
    }
}

/// Ring reduce-scatter over the blocks `b` of buffer 0, into `x`: rank `r` ends with block
/// `r` reduced. With `from_src` the rank's own contribution is read from the [`SRC`] buffer
/// (an out-of-place allreduce: the first send goes from it, and every receive writes
/// `source op incoming` into a block of buffer 0 not yet written), else it is buffer 0's.
/// Returns (the sends, the last receive).
fn ring_rs(
    x: &mut Xfer,
    r: usize,
    n: usize,
    b: &[(usize, usize)],
    from_src: bool,
) -> (Vec<usize>, Option<usize>) {
    let (left, right) = ((r + n - 1) % n, (r + 1) % n);
    let mut sends = Vec::new();
    let mut prev = None;
    let apply = if from_src {
        Apply::ReduceFromSource
    } else {
        Apply::Reduce
    };
    for k in 0..n - 1 {
        let sb = md(r as isize - k as isize - 1, n);
        let rb = md(r as isize - k as isize - 2, n);
        let mut from = block(b, sb);
        if from_src && k == 0 {
            from.buf = SRC;
        }
        sends.push(x.send(right, from, prev.into_iter().collect()));
        prev = Some(x.recv(left, block(b, rb), apply, vec![], vec![]));
    }
    (sends, prev)
}

/// Ring allgather of blocks `b` of buffer 0 starting from block `r`, pipelined after `prev`
/// (the receive that completes block `r`, if in the same phase); `rs_sends[k]`, when given,
/// are the sends that read block `r - k - 1` before it is overwritten.
fn ring_ag(
    x: &mut Xfer,
    r: usize,
    n: usize,
    b: &[(usize, usize)],
    mut prev: Option<usize>,
    rs_sends: &[usize],
) {
    let (left, right) = ((r + n - 1) % n, (r + 1) % n);
    for k in 0..n - 1 {
        let sb = md(r as isize - k as isize, n);
        let rb = md(r as isize - k as isize - 1, n);
        x.send(right, block(b, sb), prev.into_iter().collect());
        let after = rs_sends.get(k).copied().into_iter().collect();
        prev = Some(x.recv(left, block(b, rb), Apply::Copy, vec![], after));
    }
}

/// Direct allgather: block `r` to everyone, every other block from its owner.
fn direct_ag(x: &mut Xfer, r: usize, n: usize, b: &[(usize, usize)]) {
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        x.send(to, block(b, r), vec![]);
        x.recv(from, block(b, from), Apply::Copy, vec![], vec![]);
    }
}

/// Direct reduce-scatter in rank order: every rank sends block `j` to rank `j`; rank `r`
/// folds the n contributions to block `r` as `((x0 op x1) op x2) …` — the deterministic
/// order. Needs a temporary of n × |block r|.
fn direct_rs(
    plan: &mut Plan,
    dt: DataType,
    op: ReduceOp,
    r: usize,
    n: usize,
    b: &[(usize, usize)],
) {
    let mine = block(b, r);
    let l = mine.len;
    let t = plan.temp(n * l);
    let mut x = Xfer::default();
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        x.send(to, block(b, to), vec![]);
        x.recv(
            from,
            Region::new(t, from * l, l),
            Apply::Copy,
            vec![],
            vec![],
        );
    }
    plan.x("reduce-scatter (direct)", x);
    plan.local(move |bufs| fold_in_rank_order(dt, op, bufs, mine.off, t, l, r, n));
}

/// Buffer `t` holds rank j's contribution at `j · l` for every j but `r`, whose own is at
/// `own` in buffer 0: writes `((x0 op x1) op x2) …` over the own one.
#[allow(clippy::too_many_arguments)]
fn fold_in_rank_order(
    dt: DataType,
    op: ReduceOp,
    bufs: &mut [&mut [u8]],
    own: usize,
    t: usize,
    l: usize,
    r: usize,
    n: usize,
) -> Result<(), CollError> {
    let (head, tail) = bufs.split_at_mut(1);
    let (out, tmp) = (&mut head[0][own..own + l], &mut tail[t - 1]);
    tmp[r * l..(r + 1) * l].copy_from_slice(out);
    let inputs: Vec<&[u8]> = (0..n).map(|j| &tmp[j * l..(j + 1) * l]).collect();
    reduce_many(dt, op, out, &inputs)
}

/// The non-power-of-two fold of recursive doubling/halving: ranks below `2·rem` pair up,
/// the even one gives its vector to the odd one. Returns this rank's new rank among the
/// power of two, if it takes part.
fn fold(plan: &mut Plan, r: usize, n: usize, whole: Region) -> (usize, Option<usize>) {
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let mut x = Xfer::default();
    let v = if r < 2 * rem {
        if r % 2 == 0 {
            x.send(r + 1, whole, vec![]);
            None
        } else {
            x.recv(r - 1, whole, Apply::ReduceIncomingFirst, vec![], vec![]);
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    plan.x("fold", x);
    (p, v)
}

fn old_rank(v: usize, rem: usize) -> usize {
    if v < rem {
        2 * v + 1
    } else {
        v + rem
    }
}

fn unfold(plan: &mut Plan, r: usize, n: usize, p: usize, whole: Region) {
    let rem = n - p;
    let mut x = Xfer::default();
    if r < 2 * rem {
        if r % 2 == 1 {
            x.send(r - 1, whole, vec![]);
        } else {
            x.recv(r + 1, whole, Apply::Copy, vec![], vec![]);
        }
    }
    plan.x("unfold", x);
}

/// Which allreduce algorithm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Allreduce {
    Ring,
    HalvingDoubling,
    RecursiveDoubling,
    Deterministic,
    Direct,
}

/// Allreduce of buffer 0 (`count` elements). With `from_src` (the ring only: see
/// [`ring_from_source`]) the contributions are read from the [`SRC`] buffer and buffer 0 is
/// only written (an out-of-place allreduce without a copy first).
pub(crate) fn allreduce(
    algo: Allreduce,
    dt: DataType,
    op: ReduceOp,
    r: usize,
    n: usize,
    count: usize,
    from_src: bool,
) -> Plan {
    let es = dt.size();
    let whole = Region::new(0, 0, count * es);
    let mut plan = Plan::default();
    if n > 1 {
        match algo {
            Allreduce::Ring => {
                let b = blocks(count, n, es);
                let mut x = Xfer::default();
                let (sends, last) = ring_rs(&mut x, r, n, &b, from_src);
                ring_ag(&mut x, r, n, &b, last, &sends);
                plan.x("allreduce/ring", x);
            }
            Allreduce::RecursiveDoubling => {
                let (p, v) = fold(&mut plan, r, n, whole);
                if let Some(v) = v {
                    let mut mask = 1;
                    let mut step = 0;
                    while mask < p {
                        let pv = v ^ mask;
                        let partner = old_rank(pv, n - p);
                        let mut x = Xfer::default();
                        let s = x.send(partner, whole, vec![]);
                        let apply = if v < pv {
                            Apply::Reduce
                        } else {
                            Apply::ReduceIncomingFirst
                        };
                        x.recv(partner, whole, apply, vec![], vec![s]);
                        plan.x(format!("allreduce/rd step {step}"), x);
                        mask <<= 1;
                        step += 1;
                    }
                }
                unfold(&mut plan, r, n, p, whole);
            }
            Allreduce::HalvingDoubling => {
                let (p, v) = fold(&mut plan, r, n, whole);
                if let Some(v) = v {
                    let reg = |lo: usize, hi: usize| Region::new(0, lo * es, (hi - lo) * es);
                    let (mut lo, mut hi) = (0, count);
                    let mut stack = Vec::new();
                    let mut mask = p / 2;
                    while mask >= 1 {
                        let pv = v ^ mask;
                        let partner = old_rank(pv, n - p);
                        let mid = lo + (hi - lo) / 2;
                        let (keep, give) = if v & mask == 0 {
                            ((lo, mid), (mid, hi))
                        } else {
                            ((mid, hi), (lo, mid))
                        };
                        let mut x = Xfer::default();
                        x.send(partner, reg(give.0, give.1), vec![]);
                        let apply = if v < pv {
                            Apply::Reduce
                        } else {
                            Apply::ReduceIncomingFirst
                        };
                        x.recv(partner, reg(keep.0, keep.1), apply, vec![], vec![]);
                        plan.x(format!("allreduce/hd reduce-scatter mask {mask}"), x);
                        stack.push((mask, lo, hi));
                        (lo, hi) = keep;
                        mask /= 2;
                    }
                    while let Some((mask, plo, phi)) = stack.pop() {
                        let partner = old_rank(v ^ mask, n - p);
                        let other = if lo == plo { (hi, phi) } else { (plo, lo) };
                        let mut x = Xfer::default();
                        x.send(partner, reg(lo, hi), vec![]);
                        x.recv(partner, reg(other.0, other.1), Apply::Copy, vec![], vec![]);
                        plan.x(format!("allreduce/hd allgather mask {mask}"), x);
                        (lo, hi) = (plo, phi);
                    }
                }
                unfold(&mut plan, r, n, p, whole);
            }
            Allreduce::Direct => {
                // One round: every rank's whole vector to every other; each folds the n
                // vectors in rank order (so the same bits everywhere, and the
                // deterministic order).
                let len = count * es;
                let t = plan.temp(n * len);
                let mut x = Xfer::default();
                for k in 1..n {
                    let to = (r + k) % n;
                    let from = (r + n - k) % n;
                    x.send(to, whole, vec![]);
                    x.recv(
                        from,
                        Region::new(t, from * len, len),
                        Apply::Copy,
                        vec![],
                        vec![],
                    );
                }
                plan.x("allreduce/direct", x);
                plan.local(move |bufs| fold_in_rank_order(dt, op, bufs, 0, t, len, r, n));
            }
            Allreduce::Deterministic => {
                let b = blocks(count, n, es);
                direct_rs(&mut plan, dt, op, r, n, &b);
                let mut x = Xfer::default();
                ring_ag(&mut x, r, n, &b, None, &[]);
                plan.x("allreduce/deterministic allgather", x);
            }
        }
    }
    finish_step(&mut plan, dt, op, n, whole);
    plan
}

/// Whether [`allreduce`] reads an out-of-place operation's source in place for `algo` over
/// `n` ranks: the ring does (every block of the result is first written by a receive, as
/// `source op incoming`, or by the allgather's copy); the others want the source copied into
/// buffer 0 first.
pub(crate) fn ring_from_source(algo: Allreduce, n: usize) -> bool {
    algo == Allreduce::Ring && n > 1
}

/// Reduce-scatter of buffer 0 (`n` blocks of `count` elements): block `r` ends reduced.
pub(crate) fn reduce_scatter(
    ring: bool,
    dt: DataType,
    op: ReduceOp,
    r: usize,
    n: usize,
    count: usize,
) -> Plan {
    let es = dt.size();
    let b: Vec<(usize, usize)> = (0..n).map(|i| (i * count * es, count * es)).collect();
    let mut plan = Plan::default();
    if n > 1 {
        if ring {
            let mut x = Xfer::default();
            ring_rs(&mut x, r, n, &b, false);
            plan.x("reduce_scatter/ring", x);
        } else {
            direct_rs(&mut plan, dt, op, r, n, &b);
        }
    }
    finish_step(&mut plan, dt, op, n, block(&b, r));
    plan
}

/// Allgather into buffer 0 (`n` blocks of `bytes`; block `r` already in place).
pub(crate) fn allgather(ring: bool, r: usize, n: usize, bytes: usize) -> Plan {
    let b: Vec<(usize, usize)> = (0..n).map(|i| (i * bytes, bytes)).collect();
    let mut plan = Plan::default();
    if n > 1 {
        let mut x = Xfer::default();
        if ring {
            ring_ag(&mut x, r, n, &b, None, &[]);
        } else {
            direct_ag(&mut x, r, n, &b);
        }
        plan.x(
            if ring {
                "allgather/ring"
            } else {
                "allgather/direct"
            },
            x,
        );
    }
    plan
}

/// Broadcast of buffer 0 from `root`: a binomial tree or a chain, both pipelined by chunk.
pub(crate) fn broadcast(tree: bool, r: usize, n: usize, root: usize, bytes: usize) -> Plan {
    let whole = Region::new(0, 0, bytes);
    let mut plan = Plan::default();
    let v = (r + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut x = Xfer::default();
    if tree {
        let mut deps = Vec::new();
        if v > 0 {
            let high = 1usize << (usize::BITS - 1 - v.leading_zeros());
            deps.push(x.recv(real(v - high), whole, Apply::Copy, vec![], vec![]));
        }
        let mut m = if v == 0 {
            1
        } else {
            (1usize << (usize::BITS - 1 - v.leading_zeros())) << 1
        };
        while v + m < n {
            x.send(real(v + m), whole, deps.clone());
            m <<= 1;
        }
    } else {
        let mut deps = Vec::new();
        if v > 0 {
            deps.push(x.recv(real(v - 1), whole, Apply::Copy, vec![], vec![]));
        }
        if v + 1 < n {
            x.send(real(v + 1), whole, deps);
        }
    }
    plan.x(
        if tree {
            "broadcast/tree"
        } else {
            "broadcast/chain"
        },
        x,
    );
    plan
}

/// How a reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceAlgo {
    Tree,
    Ring,
    Deterministic,
}

/// Reduce of buffer 0 (`count` elements) to `root` (the result is in buffer 0 there).
pub(crate) fn reduce(
    algo: ReduceAlgo,
    dt: DataType,
    op: ReduceOp,
    r: usize,
    n: usize,
    root: usize,
    count: usize,
) -> Plan {
    let es = dt.size();
    let whole = Region::new(0, 0, count * es);
    let mut plan = Plan::default();
    if n > 1 {
        match algo {
            ReduceAlgo::Tree => {
                let v = (r + n - root) % n;
                let real = |v: usize| (v + root) % n;
                let mut x = Xfer::default();
                let mut m = if v == 0 {
                    1
                } else {
                    (1usize << (usize::BITS - 1 - v.leading_zeros())) << 1
                };
                let mut recvs: Vec<usize> = Vec::new();
                while v + m < n {
                    let deps = recvs.last().copied().into_iter().collect();
                    recvs.push(x.recv(real(v + m), whole, Apply::Reduce, deps, vec![]));
                    m <<= 1;
                }
                if v > 0 {
                    let high = 1usize << (usize::BITS - 1 - v.leading_zeros());
                    x.send(real(v - high), whole, recvs);
                }
                plan.x("reduce/tree", x);
            }
            ReduceAlgo::Ring | ReduceAlgo::Deterministic => {
                let b = blocks(count, n, es);
                let mut x = Xfer::default();
                let (sends, last) = if algo == ReduceAlgo::Ring {
                    ring_rs(&mut x, r, n, &b, false)
                } else {
                    direct_rs(&mut plan, dt, op, r, n, &b);
                    (Vec::new(), None)
                };
                if r == root {
                    for j in (0..n).filter(|j| *j != r) {
                        // The ring's send that reads block j (step k reads block r-k-1).
                        let after = if sends.is_empty() {
                            vec![]
                        } else {
                            vec![sends[md(r as isize - j as isize - 1, n)]]
                        };
                        x.recv(j, block(&b, j), Apply::Copy, vec![], after);
                    }
                } else {
                    x.send(root, block(&b, r), last.into_iter().collect());
                }
                plan.x(
                    if algo == ReduceAlgo::Ring {
                        "reduce/ring"
                    } else {
                        "reduce/deterministic gather"
                    },
                    x,
                );
            }
        }
    }
    if r == root {
        finish_step(&mut plan, dt, op, n, whole);
    }
    plan
}

/// A dissemination barrier: ⌈log2 n⌉ rounds of empty messages.
pub(crate) fn barrier(r: usize, n: usize) -> Plan {
    let mut plan = Plan::default();
    let mut d = 1;
    let mut round = 0;
    while d < n {
        let mut x = Xfer::default();
        x.send((r + d) % n, Region::new(0, 0, 0), vec![]);
        x.recv(
            (r + n - d) % n,
            Region::new(0, 0, 0),
            Apply::Copy,
            vec![],
            vec![],
        );
        plan.x(format!("barrier round {round}"), x);
        d <<= 1;
        round += 1;
    }
    plan
}

/// One send of buffer 0 to `peer`.
pub(crate) fn send(peer: usize, bytes: usize) -> Plan {
    let mut plan = Plan::default();
    let mut x = Xfer::default();
    x.send(peer, Region::new(0, 0, bytes), vec![]);
    plan.x(format!("send to rank {peer}"), x);
    plan
}

/// One receive into buffer 0 from `peer`.
pub(crate) fn recv(peer: usize, bytes: usize) -> Plan {
    let mut plan = Plan::default();
    let mut x = Xfer::default();
    x.recv(peer, Region::new(0, 0, bytes), Apply::Copy, vec![], vec![]);
    plan.x(format!("recv from rank {peer}"), x);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_buffer_in_order() {
        for count in [0, 1, 5, 1027] {
            for n in 1..6 {
                let b = blocks(count, n, 4);
                assert_eq!(b.len(), n);
                assert_eq!(b.iter().map(|x| x.1).sum::<usize>(), count * 4);
                for w in b.windows(2) {
                    assert_eq!(w[0].0 + w[0].1, w[1].0);
                }
            }
        }
    }
}
