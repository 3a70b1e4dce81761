//! Latency: `send-lat`, `write-lat`, `read-lat` (perftest's `run_iter_lat_send`,
//! `run_iter_lat_write`, `run_iter_lat`).
//!
//! - SEND: ping-pong; the client sends first, each side waits for the other's message before
//!   sending its next one and reposts the receive it consumed. One send in `-Q` is signalled
//!   and waited for (a send queue that only grows would fill).
//! - WRITE: the **server** writes first (as perftest's; see `ib_write_lat.pcap`). Each side
//!   RDMA-writes `-s` bytes into the peer's buffer, the last byte carrying its iteration
//!   count, then polls the last byte of its own buffer until the peer's count arrives. No
//!   completion announces an incoming WRITE, so the waiting side drives the engine itself
//!   ([`Device::progress`], or [`Device::progress_wait`] with `-e`).
//! - READ: the client reads and waits for each completion; the server only answers.
//!
//! A sample is the time between two consecutive posts of one side: a round trip. The tables
//! print half of it for SEND and WRITE (perftest's one-way latency) and all of it for READ;
//! the JSON line always has the round trip.
//!
//! [`Device::progress`]: roce_transport::Device::progress
//! [`Device::progress_wait`]: roce_transport::Device::progress_wait

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roce_transport::Completion;

use super::report::{self, Json, LatStats};
use super::session::{ok, wait_cq, Session};
use super::Config;
use crate::oob::perftest::{BwReport, Role, Tool};
use crate::oob::Timeout;

/// Runs the test for `s`'s role.
///
/// # Errors
/// Completion errors, timeouts, the exchange's errors.
pub(crate) fn run(s: &mut Session, cfg: &Config) -> anyhow::Result<()> {
    if cfg.tool == Tool::ReadLat && cfg.role == Role::Server {
        // Nothing to do but answer: the engine thread does.
        s.next_traffic()?;
        println!("{}", report::RESULT_LINE);
        s.finish(&BwReport::default(), Timeout::Never)?;
        return Ok(());
    }
    let rtt_factor = if cfg.tool == Tool::ReadLat { 1.0 } else { 2.0 };
    let sizes = s.sizes.clone();
    let mut json_lines = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        // SEND: the receives go up before the barrier that lets the peer start.
        let recvs = if cfg.tool == Tool::SendLat {
            s.post_recvs(cfg.rx_depth as u64, size)?
        } else {
            0
        };
        if !s.next_traffic()? {
            bail!("the exchange plan has no traffic step for size {size}");
        }
        if k == 0 {
            println!("{}", report::RESULT_LINE);
            println!("{}", report::LAT_HEADER);
        }
        let posted = match cfg.tool {
            Tool::SendLat => send_iter(s, cfg, size, recvs)?,
            Tool::WriteLat => write_iter(s, cfg, size)?,
            _ => read_iter(s, cfg, size)?,
        };
        let stats = LatStats::from_posts(size, &posted);
        println!("{}", stats.line(rtt_factor));
        json_lines.push(json(cfg, s, &stats, rtt_factor));
    }
    s.finish(&BwReport::default(), Timeout::After(cfg.timeout))?;
    println!("{}", report::RESULT_LINE);
    if cfg.json {
        for l in &json_lines {
            println!("{l}");
        }
    }
    Ok(())
}

/// Nanoseconds since `t0`.
fn ns(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}

fn send_iter(s: &Session, cfg: &Config, size: u64, mut recvs: u64) -> anyhow::Result<Vec<u64>> {
    let n = usize::try_from(cfg.iters).context("-n too large")?;
    let client = cfg.role == Role::Client;
    let cq_mod = cfg.cq_mod.max(1) as usize;
    let mut posted = crate::limits::timestamps(n)?;
    let mut wc = [Completion::EMPTY; 1];
    let (mut scnt, mut rcnt) = (0usize, 0usize);
    let t0 = Instant::now();
    while scnt < n || rcnt < n {
        if rcnt < n && !(scnt == 0 && client) {
            wait_cq(
                &s.recv_cq,
                &mut wc,
                cfg.events,
                cfg.timeout,
                "the peer's message",
            )?;
            if !ok(&wc[0]) {
                return Err(s.completion_error(&wc[0], cfg.role, scnt as u64, rcnt as u64));
            }
            rcnt += 1;
            if recvs < cfg.iters {
                s.qp.post_recv(s.recv_wr(recvs, size))
                    .map_err(|e| anyhow::anyhow!("reposting a receive: {e}"))?;
                recvs += 1;
            }
        }
        if scnt < n {
            let signaled = scnt % cq_mod == 0 || scnt == n - 1;
            posted[scnt] = ns(t0);
            s.qp.post_send(s.send_wr(cfg.tool, cfg.atomic, 0, size, signaled))
                .map_err(|e| anyhow::anyhow!("posting send {scnt}: {e}"))?;
            scnt += 1;
            if signaled {
                wait_cq(
                    &s.send_cq,
                    &mut wc,
                    cfg.events,
                    cfg.timeout,
                    "a send completion",
                )?;
                if !ok(&wc[0]) {
                    return Err(s.completion_error(&wc[0], cfg.role, scnt as u64, rcnt as u64));
                }
            }
        }
    }
    Ok(posted)
}

fn write_iter(s: &Session, cfg: &Config, size: u64) -> anyhow::Result<Vec<u64>> {
    let n = usize::try_from(cfg.iters).context("-n too large")?;
    let server = cfg.role == Role::Server;
    let post_byte = size as usize - 1;
    let poll_byte = s.half + size as usize - 1;
    let mut posted = crate::limits::timestamps(n)?;
    let mut wc = [Completion::EMPTY; 1];
    let (mut scnt, mut ccnt, mut rcnt) = (0usize, 0usize, 0usize);
    let t0 = Instant::now();
    while scnt < n || ccnt < n || rcnt < n {
        if rcnt < n && !(scnt == 0 && server) {
            rcnt += 1;
            wait_byte(s, cfg, poll_byte, rcnt as u8)?;
        }
        if scnt < n {
            posted[scnt] = ns(t0);
            scnt += 1;
            s.mr.write(post_byte, &[scnt as u8])
                .map_err(|e| anyhow::anyhow!("writing the counter byte: {e}"))?;
            s.qp.post_send(s.send_wr(cfg.tool, cfg.atomic, 0, size, true))
                .map_err(|e| anyhow::anyhow!("posting write {scnt}: {e}"))?;
        }
        if ccnt < n {
            wait_cq(
                &s.send_cq,
                &mut wc,
                cfg.events,
                cfg.timeout,
                "a write completion",
            )?;
            if !ok(&wc[0]) {
                return Err(s.completion_error(&wc[0], cfg.role, scnt as u64, ccnt as u64));
            }
            ccnt += 1;
        }
    }
    Ok(posted)
}

/// Waits until the byte at `offset` of the buffer is `value` (the peer's WRITE landed),
/// making engine progress meanwhile.
fn wait_byte(s: &Session, cfg: &Config, offset: usize, value: u8) -> anyhow::Result<()> {
    let mut b = [0u8; 1];
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    loop {
        s.mr.read(offset, &mut b)
            .map_err(|e| anyhow::anyhow!("reading the counter byte: {e}"))?;
        if b[0] == value {
            return Ok(());
        }
        if cfg.events {
            s.dev.progress_wait(Duration::from_millis(10));
        } else {
            s.dev.progress();
        }
        spins += 1;
        if cfg.events || spins % 1024 == 0 {
            let t = *start.get_or_insert_with(Instant::now);
            if t.elapsed() >= cfg.timeout {
                bail!(
                    "the peer's write {value} did not arrive within {}s",
                    cfg.timeout.as_secs()
                );
            }
        }
    }
}

fn read_iter(s: &Session, cfg: &Config, size: u64) -> anyhow::Result<Vec<u64>> {
    let n = usize::try_from(cfg.iters).context("-n too large")?;
    let mut posted = crate::limits::timestamps(n)?;
    let mut wc = [Completion::EMPTY; 1];
    let t0 = Instant::now();
    for (i, p) in posted.iter_mut().enumerate() {
        *p = ns(t0);
        s.qp.post_send(s.send_wr(cfg.tool, cfg.atomic, 0, size, true))
            .map_err(|e| anyhow::anyhow!("posting read {i}: {e}"))?;
        wait_cq(
            &s.send_cq,
            &mut wc,
            cfg.events,
            cfg.timeout,
            "a read completion",
        )?;
        if !ok(&wc[0]) {
            return Err(s.completion_error(&wc[0], cfg.role, i as u64 + 1, i as u64));
        }
    }
    Ok(posted)
}

fn json(cfg: &Config, s: &Session, st: &LatStats, rtt_factor: f64) -> String {
    Json::new()
        .str("tool", cfg.tool.command())
        .str(
            "role",
            match cfg.role {
                Role::Client => "client",
                Role::Server => "server",
            },
        )
        .num("bytes", st.size as f64)
        .num("iters", st.iters as f64)
        .num("mtu", s.mtu.bytes() as f64)
        .str("recv", if cfg.events { "block" } else { "busy" })
        .num("median_us", st.median_us)
        .num("p99_us", st.p99_us)
        .num("p999_us", st.p999_us)
        .num("min_us", st.min_us)
        .num("max_us", st.max_us)
        .num("avg_us", st.avg_us)
        .num("stdev_us", st.stdev_us)
        .num("typical_one_way_us", st.median_us / rtt_factor)
        .counters(&s.dev)
        .finish()
}
