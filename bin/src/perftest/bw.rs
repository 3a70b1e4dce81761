//! Bandwidth: `send-bw`, `write-bw`, `read-bw`, `atomic-bw` (perftest's `run_iter_bw`,
//! `run_iter_bw_server`).
//!
//! The client keeps up to `-t` requests outstanding on each of its `-q` QPs (perftest's
//! `run_iter_bw`: the QPs take turns posting, one CQ takes all their completions, the `wr_id`
//! says which QP; `-n` messages on each): whenever a window has room it builds
//! the missing work requests and posts them with **one** [`QueuePair::post_send_batch`] (one
//! engine lock, one doorbell: the first packets leave from this thread before it returns),
//! then waits for completions. One request in `-Q` is signalled (and the last one), so the
//! window moves by a moderation period at a time, as perftest's. Timestamps go into arrays
//! allocated before the loop; the only allocation per message is the work request's SGE list
//! (the API takes a `Vec<Sge>`).
//!
//! A SEND server keeps `min(-r, -n)` receives posted and reposts one per completion, never
//! more than `-n` in all (so `-a` starts each size with an empty receive queue). Its timer runs
//! from the barrier that lets the client start to the last completion, so that it covers the
//! whole transfer however late the server polls. A WRITE,
//! READ or atomic server does nothing during the traffic (its engine thread answers), waits
//! at the next barrier and prints the client's report, as perftest's.
//!
//! [`QueuePair::post_send_batch`]: roce_transport::QueuePair::post_send_batch

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roce_transport::{Completion, PostError, QpType};

use super::chk::{self, Filler, Kind, Record, Verdict};
use super::report::{self, BwResult, Json};
use super::session::{ok, wait_cq, Session};
use super::Config;
use crate::oob::perftest::{BwReport, Role, Tool};
use crate::oob::Timeout;

/// Completions taken per poll (perftest's `CTX_POLL_BATCH` is 16).
const POLL_BATCH: usize = 64;

/// Runs the test for `s`'s role.
///
/// # Errors
/// Completion errors, timeouts, the exchange's errors.
pub(crate) fn run(s: &mut Session, cfg: &Config) -> anyhow::Result<()> {
    match (cfg.tool, cfg.role) {
        (Tool::SendBw, Role::Server) => send_server(s, cfg),
        (_, Role::Client) => client(s, cfg),
        (_, Role::Server) => passive_server(s, cfg),
    }
}

fn header(cfg: &Config) {
    println!("{}", report::RESULT_LINE);
    println!("{}", report::bw_header(cfg.gbits));
}

fn client(s: &mut Session, cfg: &Config) -> anyhow::Result<()> {
    let sizes = s.sizes.clone();
    let mut last = BwResult::default();
    let mut json_lines = Vec::new();
    let mut filler = None;
    for (k, &size) in sizes.iter().enumerate() {
        if cfg.chk {
            // The base pattern goes in before the peer is let go (one size with --chk).
            let (slots, step) = s.places(size);
            let f = Filler::new(s.half, size, slots, step)?;
            s.mr.write(0, f.base())
                .context("writing the --chk pattern")?;
            filler = Some(f);
        }
        if !s.next_traffic()? {
            bail!("the exchange plan has no traffic step for size {size}");
        }
        if k == 0 {
            header(cfg);
        }
        if cfg.tool != Tool::SendBw {
            warm_up(s, cfg, size, filler.as_mut())?;
        }
        let r = client_iter(s, cfg, size, filler.as_mut())?;
        println!("{}", report::bw_line(&r.report(cfg.gbits)));
        json_lines.push(json(cfg, s, &r, None));
        last = r;
    }
    let verdict = match &filler {
        Some(f) => Some(client_check(s, cfg, f)?),
        None => None,
    };
    s.finish(&last.report(cfg.gbits), Timeout::After(cfg.timeout))?;
    println!("{}", report::RESULT_LINE);
    print_json(cfg, &json_lines);
    if let Some(v) = verdict {
        if !v.ok() {
            bail!(
                "--chk: the server found {} of the {} bytes of its buffer wrong",
                v.bad,
                v.bytes
            );
        }
        println!(
            " --chk: data verified by the server: all {} bytes of its buffer as expected",
            v.bytes
        );
    }
    Ok(())
}

fn chk_kind(cfg: &Config) -> Kind {
    if cfg.tool == Tool::SendBw {
        Kind::Send
    } else {
        Kind::Write
    }
}

/// Stamps the messages of requests `first..end` before they are posted (`--chk`).
fn stamp(s: &Session, chk: Option<&mut Filler>, first: u64, end: u64) -> anyhow::Result<()> {
    if let Some(f) = chk {
        for (off, bytes) in f.batch(first, end) {
            s.mr.write(off as usize, bytes)
                .context("writing the --chk stamps")?;
        }
    }
    Ok(())
}

/// The client's half of the check: sends the record, receives the server's verdict.
fn client_check(s: &mut Session, cfg: &Config, f: &Filler) -> anyhow::Result<Verdict> {
    let rec = f.record(chk_kind(cfg), cfg.iters);
    let wait = Timeout::After(cfg.timeout);
    let mut ack = [0u8; 8];
    s.chk_xchg(&rec.to_bytes(), &mut ack, wait, "sending the check record")?;
    if ack != chk::PING {
        bail!("--chk: the server did not acknowledge the check record (does it run with --chk?)");
    }
    let mut v = [0u8; chk::VERDICT_LEN];
    s.chk_xchg(&chk::PING, &mut v, wait, "the server's verdict")?;
    Verdict::parse(&v)
}

/// The server's half of the check: waits (up to `wait`) for the client's record, compares
/// the whole buffer, sends the verdict. Returns both.
fn server_check(s: &mut Session, cfg: &Config, wait: Timeout) -> anyhow::Result<(Record, Verdict)> {
    let mut raw = [0u8; chk::RECORD_LEN];
    s.chk_xchg(&chk::PING, &mut raw, wait, "the client's check record")?;
    let rec = Record::parse(&raw)?;
    if rec.kind != chk_kind(cfg) {
        bail!(
            "--chk: the client's record is for another test ({:?})",
            rec.kind
        );
    }
    if let Some(o) = cfg.chk_corrupt {
        let o = usize::try_from(o).unwrap_or(usize::MAX);
        let mut b = [0u8; 1];
        s.mr.read(o, &mut b)
            .context("--chk-corrupt: offset outside the buffer")?;
        s.mr.write(o, &[b[0] ^ 0x5A]).context("--chk-corrupt")?;
    }
    let v = rec.verify(&s.mr.to_vec(), s.half)?;
    let mut ping = [0u8; 8];
    s.chk_xchg(
        &v.to_bytes(),
        &mut ping,
        Timeout::After(cfg.timeout),
        "sending the verdict",
    )?;
    Ok((rec, v))
}

/// Prints the server's verdict; an error if any byte differs.
fn server_verdict(rec: &Record, v: &Verdict) -> anyhow::Result<()> {
    if !v.ok() {
        bail!(
            "--chk: data check failed: {} of the {} bytes of the buffer differ; the first at \
             offset {}: {}",
            v.bad,
            v.bytes,
            v.first_bad.unwrap_or(0),
            v.detail.as_deref().unwrap_or("?")
        );
    }
    println!(
        " --chk: data verified: all {} bytes of the buffer as expected ({} messages of {} \
         bytes, seed {:#018x})",
        v.bytes, rec.iters, rec.size, rec.seed
    );
    Ok(())
}

/// Where a client's `wr_id` keeps the QP index (`-q`): message `i` of QP `q` is
/// `q << QP_SHIFT | i` (so with one QP the `wr_id` is the message number, as perftest's).
const QP_SHIFT: u32 = 40;

/// The `wr_id` of message `i` on QP `q`.
fn tag(q: usize, i: usize) -> u64 {
    ((q as u64) << QP_SHIFT) | i as u64
}

/// The QP and message number of a client's `wr_id`.
fn untag(wr_id: u64) -> (usize, usize) {
    (
        usize::try_from(wr_id >> QP_SHIFT).unwrap_or(usize::MAX),
        usize::try_from(wr_id & ((1 << QP_SHIFT) - 1)).unwrap_or(usize::MAX),
    )
}

/// perftest's `perform_warm_up`: a window of requests on every QP, all waited for, before
/// timing (at most 16 MiB of them per QP).
fn warm_up(s: &Session, cfg: &Config, size: u64, chk: Option<&mut Filler>) -> anyhow::Result<()> {
    let n = (cfg.tx_depth as u64).min((16 << 20) / size.max(1)).max(1);
    stamp(s, chk, 0, n)?;
    let mut posted = 0u64;
    for q in 0..s.qp_count() {
        let Some(qp) = s.qp_at(q) else { break };
        let wrs = (0..n).map(|i| {
            let mut wr = s.send_wr_on(q, cfg.tool, cfg.atomic, i, size, true);
            wr.wr_id = tag(q, i as usize);
            wr
        });
        posted += match qp.post_send_batch(wrs) {
            Ok(k) | Err((k, PostError::QueueFull)) => k as u64,
            Err((_, e)) => bail!("posting the warm-up requests: {e}"),
        };
    }
    let mut wc = [Completion::EMPTY; POLL_BATCH];
    let mut done = 0;
    while done < posted {
        let got = wait_cq(&s.send_cq, &mut wc, cfg.events, cfg.timeout, "warm-up")?;
        for c in &wc[..got] {
            if !ok(c) {
                return Err(s.completion_error(c, cfg.role, posted, done));
            }
            done += 1;
        }
    }
    Ok(())
}

/// One size: `-n` requests on each QP, a window of `-t` per QP (perftest's `run_iter_bw`:
/// the QPs take turns posting, one CQ takes every completion).
fn client_iter(
    s: &Session,
    cfg: &Config,
    size: u64,
    mut chk: Option<&mut Filler>,
) -> anyhow::Result<BwResult> {
    let n = usize::try_from(cfg.iters).context("-n too large")?;
    let nq = s.qp_count();
    let depth = cfg.tx_depth;
    let cq_mod = cfg.cq_mod as usize;
    // Every array the loop writes is allocated here. The timestamps are QP 0's (the peak is
    // computed for one QP only).
    let mut posted = crate::limits::timestamps(n)?;
    let mut completed: Vec<(usize, u64)> = Vec::with_capacity(n / cq_mod + 2);
    let mut scnt = vec![0usize; nq];
    let mut ccnt = vec![0usize; nq];
    let mut wc = [Completion::EMPTY; POLL_BATCH];
    let (mut sent, mut finished) = (0usize, 0usize);
    let mut end = 0u64;
    let t0 = Instant::now();
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    while finished < nq {
        for q in 0..nq {
            let room = depth.saturating_sub(scnt[q] - ccnt[q]).min(n - scnt[q]);
            if room == 0 {
                continue;
            }
            let Some(qp) = s.qp_at(q) else { break };
            let first = scnt[q];
            if q == 0 {
                stamp(s, chk.as_deref_mut(), first as u64, (first + room) as u64)?;
            }
            let wrs = (first..first + room).map(|i| {
                let signaled = i % cq_mod == cq_mod - 1 || i == n - 1;
                let mut wr = s.send_wr_on(q, cfg.tool, cfg.atomic, i as u64, size, signaled);
                wr.wr_id = tag(q, i);
                wr
            });
            let now = ns(Instant::now());
            let k = match qp.post_send_batch(wrs) {
                Ok(k) | Err((k, PostError::QueueFull)) => k,
                Err((_, e)) => bail!("posting request {first} on QP {q}: {e}"),
            };
            if q == 0 {
                posted[first..first + k].fill(now);
            }
            scnt[q] += k;
            sent += k;
        }
        let got = wait_cq(
            &s.send_cq,
            &mut wc,
            cfg.events,
            cfg.timeout,
            "a send completion",
        )?;
        let now = ns(Instant::now());
        for c in &wc[..got] {
            if !ok(c) {
                let done: usize = ccnt.iter().sum();
                return Err(s.completion_error(c, cfg.role, sent as u64, done as u64));
            }
            let (q, j) = untag(c.wr_id);
            let Some(cc) = ccnt.get_mut(q) else { continue };
            let j = j.min(n - 1);
            if *cc < n && j + 1 >= n {
                finished += 1;
            }
            *cc = (*cc).max(j + 1);
            if q == 0 {
                completed.push((j, now));
            }
            end = now;
        }
    }
    let peak = if cfg.no_peak || nq > 1 {
        0.0
    } else {
        report::peak_bytes_per_s(size, &posted, &completed)
    };
    Ok(BwResult {
        size,
        iters: n as u64,
        qps: nq as u64,
        seconds: end.saturating_sub(posted[0]) as f64 / 1e9,
        peak_bytes_per_s: peak,
    })
}

fn send_server(s: &mut Session, cfg: &Config) -> anyhow::Result<()> {
    let sizes = s.sizes.clone();
    let mut json_lines = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        // The receives go up before the barrier that lets the client start.
        let first = s.post_recvs(cfg.rx_depth as u64, size)?;
        let before = Instant::now();
        if !s.next_traffic()? {
            bail!("the exchange plan has no traffic step for size {size}");
        }
        // The timer starts when the client was let go (our half of the barrier), not at the
        // first completion nor when the barrier returns: a server that polls late would find
        // the transfer queued and time only the draining of its CQ (UD showed 222,552 MB/s),
        // and on a loaded host the client can finish before the barrier call returns here.
        let start = s.released_at().filter(|&t| t >= before).unwrap_or(before);
        if k == 0 {
            header(cfg);
        }
        let (r, lost) = server_iter(s, cfg, size, first, start)?;
        // With manual progress (a busy server) the pass that received the last messages
        // deferred their ACK to the next pass or post; neither comes while this side prints
        // and waits at the barrier, so the client's last completion, the end of its timer,
        // would wait for it (under load its figure came out up to 9x too low). One pass
        // sends it now.
        s.dev.progress();
        println!("{}", report::bw_line(&r.report(cfg.gbits)));
        if lost > 0 {
            eprintln!(
                " {lost} of {} messages did not arrive (UD drops what finds no receive or \
                 overflows a socket buffer)",
                cfg.iters
            );
        }
        json_lines.push(json(cfg, s, &r, Some(lost)));
    }
    let checked = if cfg.chk {
        Some(server_check(s, cfg, Timeout::After(cfg.timeout))?)
    } else {
        None
    };
    s.finish(&BwReport::default(), Timeout::After(cfg.timeout))?;
    println!("{}", report::RESULT_LINE);
    print_json(cfg, &json_lines);
    if let Some((rec, v)) = checked {
        server_verdict(&rec, &v)?;
    }
    Ok(())
}

/// Receives one size's messages. `posted` receives are up already; the client was let go at
/// `start`, and the time from there to the last completion is the transfer's. Returns the
/// result and how many messages never came (UD only: the client finished and nothing arrived
/// for a while).
fn server_iter(
    s: &Session,
    cfg: &Config,
    size: u64,
    mut posted: u64,
    start: Instant,
) -> anyhow::Result<(BwResult, u64)> {
    let n = cfg.iters;
    let ud = s.qp.qp_type() == QpType::Ud;
    let mut wc = [Completion::EMPTY; POLL_BATCH];
    let mut rcnt = 0u64;
    let mut last: Option<Instant> = None;
    let mut idle_since = Instant::now();
    let mut peer_done: Option<Instant> = None;
    let mut spins = 0u32;
    while rcnt < n {
        let got = if cfg.events {
            s.recv_cq.wait(&mut wc, Duration::from_millis(2))
        } else {
            s.recv_cq.poll(&mut wc)
        };
        if got == 0 {
            spins += 1;
            if !cfg.events && spins % 1024 != 0 {
                continue;
            }
            let now = Instant::now();
            let idle = now.duration_since(idle_since);
            if idle >= Duration::from_millis(1) {
                match s.peer_activity() {
                    Some(false) => {
                        bail!("the client closed the connection after {rcnt} of {n} messages")
                    }
                    Some(true) => {
                        peer_done.get_or_insert(now);
                    }
                    None => {}
                }
            }
            // The client finished: what is still on its way arrives within moments.
            if let Some(d) = peer_done {
                let grace = if ud { 200 } else { 2_000 };
                if now.duration_since(d) >= Duration::from_millis(grace)
                    && idle >= Duration::from_millis(grace)
                {
                    if ud {
                        break;
                    }
                    bail!("the client finished but only {rcnt} of {n} messages arrived");
                }
            }
            if idle >= cfg.timeout {
                bail!(
                    "no message for {}s ({rcnt} of {n} received)",
                    cfg.timeout.as_secs()
                );
            }
            continue;
        }
        let now = Instant::now();
        idle_since = now;
        last = Some(now);
        for c in &wc[..got] {
            if !ok(c) {
                return Err(s.completion_error(c, cfg.role, 0, rcnt));
            }
            rcnt += 1;
        }
        // Repost as many as were consumed, never more than -n in all.
        let more = (got as u64).min(n - posted.min(n));
        for i in 0..more {
            s.qp.post_recv(s.recv_wr(posted + i, size))
                .map_err(|e| anyhow::anyhow!("reposting a receive: {e}"))?;
        }
        posted += more;
    }
    let seconds = last.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    Ok((
        BwResult {
            size,
            iters: rcnt,
            qps: 1,
            seconds,
            peak_bytes_per_s: 0.0,
        },
        n - rcnt,
    ))
}

fn passive_server(s: &mut Session, cfg: &Config) -> anyhow::Result<()> {
    s.next_traffic()?;
    header(cfg);
    // The client's traffic runs now (every size); its next barrier ends it, however long it
    // takes.
    let checked = if cfg.chk {
        Some(server_check(s, cfg, Timeout::Never)?)
    } else {
        None
    };
    let theirs = s
        .finish(&BwReport::default(), Timeout::Never)?
        .unwrap_or_default();
    println!("{}", report::bw_line(&theirs));
    println!("{}", report::RESULT_LINE);
    if cfg.json {
        let per_s = if cfg.gbits {
            theirs.bw_avg * 1e9 / 8.0
        } else {
            theirs.bw_avg * f64::from(1u32 << 20)
        };
        let j = Json::new()
            .str("tool", cfg.tool.command())
            .str("role", "server")
            .str("source", "client's report")
            .num("bytes", theirs.size as f64)
            .num("iters", theirs.iters as f64)
            .num("mtu", s.mtu.bytes() as f64)
            .num("bytes_per_s", per_s)
            .num("ops_per_s", theirs.msg_rate_avg * 1e6)
            .counters(&s.dev)
            .finish();
        println!("{j}");
    }
    if let Some((rec, v)) = checked {
        server_verdict(&rec, &v)?;
    }
    Ok(())
}

fn json(cfg: &Config, s: &Session, r: &BwResult, lost: Option<u64>) -> String {
    let rep = r.report(cfg.gbits);
    let mut j = Json::new()
        .str("tool", cfg.tool.command())
        .str(
            "role",
            match cfg.role {
                Role::Client => "client",
                Role::Server => "server",
            },
        )
        .str(
            "conn",
            match s.qp.qp_type() {
                QpType::Rc => "RC",
                QpType::Uc => "UC",
                QpType::Ud => "UD",
            },
        )
        .num("bytes", r.size as f64)
        // Messages on all QPs (the table prints them per QP, as perftest).
        .num("iters", r.messages() as f64)
        .num("qps", r.qps.max(1) as f64)
        .num("mtu", s.mtu.bytes() as f64)
        .num("seconds", r.seconds)
        .num("bytes_per_s", r.bytes_per_s())
        .num("ops_per_s", r.ops_per_s())
        .num("peak_bytes_per_s", r.peak_bytes_per_s)
        .num("bw_avg", rep.bw_avg)
        .num("msg_rate_mpps", rep.msg_rate_avg);
    if let Some(l) = lost {
        j = j.num("lost", l as f64);
    }
    j.counters(&s.dev).finish()
}

fn print_json(cfg: &Config, lines: &[String]) {
    if cfg.json {
        for l in lines {
            println!("{l}");
        }
    }
}
