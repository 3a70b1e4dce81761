//! Everything before the traffic: the device, the buffer, the queues, perftest's out-of-band
//! exchange up to the last barrier, the test information block, and the QP connected.
//!
//! # The buffer
//!
//! One memory region of `2 · B` bytes, `B = max(largest size (+ 40 for UD), cycle buffer)`
//! (perftest's `BUFF_SIZE`): `[0, B)` is what we send from (and where READ and atomic results
//! land), `[B, 2B)` is what the peer targets. The key record advertises `addr + B` (stock
//! peers write, read and add there, moving by a cache line at a time inside the cycle buffer
//! when messages are small), and `ib_write_lat` polls the last byte of its message there.

use std::io;
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roce_transport::{
    netdev, Access, AddressHandle, Completion, CompletionQueue, ConnectOptions, Device,
    DeviceConfig, Gid, MemoryRegion, Mtu, Progress, ProtectionDomain, Psn, QKey, QpInit, QpType,
    QueuePair, RKey, RecvWr, RemoteQp, SendData, SendOp, SendWr, UdDest, WcStatus,
};

use super::report::{self, AddrStyle};
use super::{AtomicType, Config};
use crate::device::DeviceArgs;
use crate::oob::perftest::{BwReport, PerftestConn, PerftestDest, Role, Setup, Step, Tool};
use crate::oob::{self, Timeout};

/// The GRH room at the start of every UD receive buffer (`UD_ADDITION`).
pub(crate) const UD_GRH: usize = 40;
/// perftest's `DEF_QKEY`.
const QKEY: u32 = 0x1111_1111;

/// A connected test: what the traffic loops use.
#[derive(Debug)]
pub(crate) struct Session {
    /// The device.
    pub(crate) dev: Device,
    /// Keeps the region's and the QP's protection domain.
    _pd: ProtectionDomain,
    /// Send (and READ/atomic) completions.
    pub(crate) send_cq: CompletionQueue,
    /// Receive completions.
    pub(crate) recv_cq: CompletionQueue,
    /// The queue pair, connected (QP 0 of `-q N`).
    pub(crate) qp: QueuePair,
    /// QPs 1.. of `-q N` (write-bw, read-bw, atomic-bw), each connected to the peer's QP of
    /// the same index, with the peer's key record for it; they share the CQs and the buffer.
    pub(crate) more: Vec<(QueuePair, PerftestDest)>,
    /// The buffer (see the module docs).
    pub(crate) mr: MemoryRegion,
    /// `B`: where the half the peer targets starts.
    pub(crate) half: usize,
    /// Our key record.
    pub(crate) mine: PerftestDest,
    /// The peer's.
    pub(crate) peer: PerftestDest,
    /// The path MTU both sides use.
    pub(crate) mtu: Mtu,
    /// The message sizes to run (UD: those that fit the path MTU).
    pub(crate) sizes: Vec<u64>,
    /// Cycle buffer and cache line both sides use (the larger of each side's).
    pub(crate) cycle_buffer: u64,
    /// Cache line size.
    pub(crate) cache_line: u64,
    /// The out-of-band connection (taken by [`Self::finish`]).
    conn: Option<PerftestConn>,
    /// A second handle on the same socket, to notice the peer's next message or its close
    /// while traffic runs.
    watch: TcpStream,
    /// UD: where our sends go.
    ud: Option<UdDest>,
    /// The exchange ([`Tool::plan_for`] the sizes) and how far it went.
    plan: Vec<Step>,
    /// Index of the next step of `plan`.
    next: usize,
    /// What the exchange learned.
    learned: Setup,
    /// Who drives the engine.
    progress: Progress,
}

impl Session {
    /// Opens the device, creates the resources, runs the exchange up to the first hand shake,
    /// prints the test information and both address lines, and connects the QP. The caller
    /// then posts its receives (SEND tests) and calls [`Self::next_traffic`].
    ///
    /// # Errors
    /// Device, resources, exchange and connection errors, with context.
    pub(crate) fn establish(cfg: &Config) -> anyhow::Result<Self> {
        let peer_ip = match &cfg.host {
            Some(h) => Some(resolve(h, cfg.port)?),
            None => None,
        };
        let (dev, gid_index, gid) = open_device(cfg, peer_ip)?;
        let ud = cfg.qp_type == QpType::Ud;
        let largest = cfg.sizes.iter().copied().max().unwrap_or(1) as usize;
        let half = (largest + if ud { UD_GRH } else { 0 })
            .max(oob::perftest::DEFAULT_CYCLE_BUFFER as usize)
            .next_multiple_of(64);
        let pd = dev.alloc_pd();
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = pd
            .register_zeroed(2 * half, access)
            .context("registering the test buffer")?;
        let nq = cfg.qps as usize;
        let send_cq = dev.create_cq(cfg.tx_depth.max(cfg.cq_mod as usize) * 2 * nq + 64)?;
        let recv_cq = dev.create_cq(cfg.rx_depth * 2 + 64)?;
        let mut init = QpInit::new(cfg.qp_type, &send_cq);
        init.recv_cq = recv_cq.clone();
        // Unsignalled WRs stay in the send queue until a later one completes: room for a
        // window of tx_depth plus one moderation period.
        init.config.max_send_wr = cfg.tx_depth + cfg.cq_mod as usize + 16;
        init.config.max_recv_wr = cfg.rx_depth * 2 + 16;
        if let Some(w) = cfg.inflight {
            init.config.max_inflight_packets = w.max(1);
        }
        if let Some(a) = cfg.ack_every {
            init.config.ack_req_every = a.max(1);
        }
        let qp = pd.create_qp(&init).context("creating the queue pair")?;
        let mut extra = Vec::with_capacity(nq - 1);
        for _ in 1..nq {
            extra.push(pd.create_qp(&init).context("creating a queue pair (-q)")?);
        }
        let max_rd = u8::try_from(dev.query_device().max_qp_init_rd_atom).unwrap_or(u8::MAX);
        let out_reads = match cfg.out_reads {
            Some(o) if o > max_rd => {
                eprintln!(" Requested outstanding reads {o} is above the device's {max_rd}; using {max_rd}");
                max_rd
            }
            Some(o) => o,
            None if cfg.tool.uses_out_reads() => max_rd,
            None => 1,
        };
        let mine = PerftestDest {
            lid: 0,
            out_reads: u16::from(out_reads),
            qpn: qp.qpn(),
            psn: Psn::new(dev.random_psn()),
            rkey: if cfg.tool == Tool::SendBw || cfg.tool == Tool::SendLat {
                RKey::new(0)
            } else {
                mr.rkey()
            },
            vaddr: mr.addr() + half as u64,
            gid,
            srqn: 0,
        };
        let active = dev.query_port().active_mtu;
        let wanted = match cfg.mtu {
            Some(m) if m > active => bail!(
                "requested MTU {} is above the device's active MTU {} (interface {})",
                m.bytes(),
                active.bytes(),
                dev.query_port().netdev.as_deref().unwrap_or("?")
            ),
            Some(m) => m,
            None => active,
        };

        // The out-of-band connection.
        let timeout = Timeout::After(cfg.timeout);
        let stream = match &cfg.host {
            Some(h) => oob::connect((h.as_str(), cfg.port), timeout)
                .with_context(|| format!("connecting to the perftest server {h}:{}", cfg.port))?,
            None => {
                let listener = TcpListener::bind(("0.0.0.0", cfg.port))
                    .with_context(|| format!("listening on TCP port {}", cfg.port))?;
                println!("\n************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
                oob::accept(&listener, cfg.accept_timeout)
                    .context("waiting for a perftest client")?
                    .0
            }
        };
        let watch = stream.try_clone().context("duplicating the TCP socket")?;
        let mut conn = PerftestConn::new(stream, cfg.role, timeout);
        let setup = conn
            .exchange_keys(cfg.tool, &mine, mtu_enum(wanted))
            .context("perftest exchange with the peer")?;
        // perftest's first hand shake runs once per QP (`-q`), each with that QP's record;
        // the later barriers repeat QP 0's.
        let mut more = Vec::with_capacity(extra.len());
        for q in extra {
            let rec = PerftestDest {
                qpn: q.qpn(),
                psn: Psn::new(dev.random_psn()),
                ..mine
            };
            let theirs = conn
                .hand_shake(&rec)
                .context("perftest exchange with the peer (the key record of a -q QP)")?;
            more.push((q, rec, theirs));
        }
        let Some(mtu) = mtu_from_enum(setup.mtu_enum) else {
            bail!("negotiated MTU enum {} is not an MTU", setup.mtu_enum);
        };
        let peer = setup.peer;
        let peer_sys = setup.peer_sys;
        let cycle_buffer = u64::from(peer_sys.cycle_buffer.max(4_096)).min(half as u64);
        let cache_line = u64::from(peer_sys.cache_line_size.clamp(64, 4_096));

        print_info(cfg, &dev, gid_index, mtu, out_reads);
        let style = match cfg.tool {
            Tool::SendBw | Tool::SendLat | Tool::AtomicBw => AddrStyle::Plain,
            Tool::WriteBw | Tool::WriteLat => AddrStyle::Rdma,
            Tool::ReadBw | Tool::ReadLat => AddrStyle::Read,
        };
        // Every QP's address lines (-q): ours, then the peer's.
        println!("{}", report::address_lines("local", &mine, style));
        for (_, rec, _) in &more {
            println!("{}", report::address_lines("local", rec, style));
        }
        println!("{}", report::address_lines("remote", &peer, style));
        for (_, _, theirs) in &more {
            println!("{}", report::address_lines("remote", theirs, style));
        }

        let mut sizes = cfg.sizes.clone();
        if ud {
            let pmtu = mtu.bytes() as u64;
            if cfg.all {
                sizes.retain(|&s| s <= pmtu);
            } else if !cfg.size_given && sizes[0] > pmtu {
                println!(" Max msg size in UD is MTU {pmtu}\n Changing to this MTU");
                sizes = vec![pmtu];
            } else if sizes[0] > pmtu {
                bail!(
                    "UD messages must fit one packet: size {} is above the path MTU {pmtu}",
                    sizes[0]
                );
            }
        }
        let rd_atomic = out_reads
            .min(u8::try_from(peer.out_reads).unwrap_or(u8::MAX))
            .max(1);
        let opts = ConnectOptions {
            mtu: Some(mtu),
            local_psn: mine.psn,
            timeout: cfg.qp_timeout,
            rd_atomic,
            qkey: QKey::new(QKEY),
            ..ConnectOptions::default()
        };
        let remote = RemoteQp {
            qpn: peer.qpn,
            psn: peer.psn,
            gid: peer.gid,
        };
        qp.connect(&remote, &opts)
            .context("connecting the queue pair (INIT, RTR, RTS)")?;
        let more = more
            .into_iter()
            .map(|(q, rec, theirs)| {
                let opts = ConnectOptions {
                    local_psn: rec.psn,
                    rd_atomic: out_reads
                        .min(u8::try_from(theirs.out_reads).unwrap_or(u8::MAX))
                        .max(1),
                    ..opts
                };
                let remote = RemoteQp {
                    qpn: theirs.qpn,
                    psn: theirs.psn,
                    gid: theirs.gid,
                };
                q.connect(&remote, &opts)
                    .context("connecting a queue pair of -q (INIT, RTR, RTS)")?;
                Ok((q, theirs))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ud = ud.then(|| UdDest {
            ah: AddressHandle::new(peer.gid),
            remote_qpn: peer.qpn,
            remote_qkey: QKey::new(QKEY),
        });
        let plan = cfg.tool.plan_for(sizes.len());
        // exchange_keys ran the plan through its first hand shake.
        let next = plan
            .iter()
            .position(|s| *s == Step::HandShake)
            .map_or(plan.len(), |i| i + 1);
        Ok(Self {
            dev,
            _pd: pd,
            send_cq,
            recv_cq,
            qp,
            more,
            mr,
            half,
            mine,
            peer,
            mtu,
            sizes,
            cycle_buffer,
            cache_line,
            conn: Some(conn),
            watch,
            ud,
            plan,
            next,
            learned: setup,
            progress: cfg.progress,
        })
    }

    /// Runs the exchange up to the next [`Step::Traffic`] (the barriers before it) and
    /// consumes it. Returns false when the plan has no traffic left. Post the receives of a
    /// SEND test before: once this returns, the peer may send.
    ///
    /// # Errors
    /// The exchange's.
    /// When this server last let the client go in the exchange (see
    /// [`PerftestConn::released_at`]).
    pub(crate) fn released_at(&self) -> Option<Instant> {
        self.conn.as_ref().and_then(PerftestConn::released_at)
    }

    pub(crate) fn next_traffic(&mut self) -> anyhow::Result<bool> {
        let mine = self.mine;
        let conn = self.conn.as_mut().context("exchange already closed")?;
        let (plan, next, learned) = (&self.plan, &mut self.next, &mut self.learned);
        // Between the sizes of `-a` the peer may still be retransmitting its last message
        // or waiting for our last ACK: keep answering while the barrier waits on TCP.
        with_progress(&self.dev, self.progress, || {
            while let Some(&step) = plan.get(*next) {
                *next += 1;
                if step == Step::Traffic {
                    return Ok(true);
                }
                if step == Step::Close {
                    // Closing consumes the connection: leave it to finish.
                    *next -= 1;
                    return Ok(false);
                }
                conn.run_step(step, &mine, &BwReport::default(), learned)
                    .context("synchronising with the peer")?;
            }
            Ok(false)
        })
    }

    /// Runs the rest of the exchange (`report` is what a BW client sends); returns the peer's
    /// BW report if the plan has one. `wait` bounds each step (a BW server waits at the first
    /// one for the whole test: `Never`).
    ///
    /// # Errors
    /// The exchange's.
    pub(crate) fn finish(
        &mut self,
        report: &BwReport,
        wait: Timeout,
    ) -> anyhow::Result<Option<BwReport>> {
        let mine = self.mine;
        let mut conn = self.conn.take().context("exchange already closed")?;
        conn.set_timeout(wait);
        let plan = &self.plan[self.next.min(self.plan.len())..];
        self.next = self.plan.len();
        let learned = &mut self.learned;
        let exchange = || -> anyhow::Result<()> {
            for &step in plan {
                conn.run_step(step, &mine, report, learned)
                    .context("closing the perftest exchange")?;
            }
            Ok(())
        };
        with_progress(&self.dev, self.progress, exchange)?;
        Ok(self.learned.peer_report.take())
    }

    /// What the peer did on the out-of-band connection while traffic runs: `Some(true)` if
    /// it sent something (it finished its traffic and waits at the next barrier),
    /// `Some(false)` if it closed the connection, `None` if nothing happened.
    pub(crate) fn peer_activity(&self) -> Option<bool> {
        if self.watch.set_nonblocking(true).is_err() {
            return None;
        }
        let mut b = [0u8; 1];
        let r = self.watch.peek(&mut b);
        let _ = self.watch.set_nonblocking(false);
        match r {
            Ok(0) => Some(false),
            Ok(_) => Some(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(_) => Some(false),
        }
    }

    /// The offset of message `i` of `size` bytes inside a half of the buffer: perftest's
    /// `increase_loc_addr`/`increase_rem_addr`, a cache-line-rounded step that wraps inside
    /// the cycle buffer when a message fits in half of it, else always 0.
    pub(crate) fn offset(&self, i: u64, size: u64) -> u64 {
        let (slots, step) = self.places(size);
        (i % slots) * step
    }

    /// The places messages of `size` bytes take in a half of the buffer: `(slots, step)`,
    /// message `i` at `(i % slots) * step` ([`Self::offset`]).
    pub(crate) fn places(&self, size: u64) -> (u64, u64) {
        if size > self.cycle_buffer / 2 {
            return (1, 0);
        }
        let step = size.next_multiple_of(self.cache_line).max(self.cache_line);
        ((self.cycle_buffer / step).max(1), step)
    }

    /// One `--chk` exchange on the out-of-band connection (the client writes `mine` then
    /// reads, the server the reverse), each read bounded by `wait`.
    ///
    /// # Errors
    /// The exchange's (a peer without `--chk` answers nothing or something else).
    pub(crate) fn chk_xchg(
        &mut self,
        mine: &[u8],
        theirs: &mut [u8],
        wait: Timeout,
        what: &'static str,
    ) -> anyhow::Result<()> {
        let conn = self.conn.as_mut().context("exchange already closed")?;
        conn.set_timeout(wait);
        with_progress(&self.dev, self.progress, || {
            conn.xchg(mine, theirs, what)
                .with_context(|| format!("--chk: {what} (does the peer run with --chk?)"))
        })
    }

    /// The work request for message `i` of `tool` (on QP 0).
    pub(crate) fn send_wr(
        &self,
        tool: Tool,
        atomic: AtomicType,
        i: u64,
        size: u64,
        signaled: bool,
    ) -> SendWr {
        self.send_wr_on(0, tool, atomic, i, size, signaled)
    }

    /// The number of QPs (`-q`).
    pub(crate) fn qp_count(&self) -> usize {
        1 + self.more.len()
    }

    /// QP `q` of `-q N` (0 is [`Self::qp`]); `None` past the last.
    pub(crate) fn qp_at(&self, q: usize) -> Option<&QueuePair> {
        match q {
            0 => Some(&self.qp),
            q => self.more.get(q - 1).map(|(qp, _)| qp),
        }
    }

    /// The work request for message `i` of `tool` on QP `q`, aimed at the buffer the peer's
    /// QP `q` advertised; `wr_id` is `i` (the caller adds the QP if it needs to tell them
    /// apart).
    pub(crate) fn send_wr_on(
        &self,
        q: usize,
        tool: Tool,
        atomic: AtomicType,
        i: u64,
        size: u64,
        signaled: bool,
    ) -> SendWr {
        let peer = match q {
            0 => &self.peer,
            q => self.more.get(q - 1).map_or(&self.peer, |(_, p)| p),
        };
        let off = self.offset(i, size);
        let remote_addr = peer.vaddr + off;
        let rkey = peer.rkey;
        let op = match tool {
            Tool::SendBw | Tool::SendLat => SendOp::Send,
            Tool::WriteBw | Tool::WriteLat => SendOp::RdmaWrite { remote_addr, rkey },
            Tool::ReadBw | Tool::ReadLat => SendOp::RdmaRead { remote_addr, rkey },
            Tool::AtomicBw => match atomic {
                AtomicType::FetchAndAdd => SendOp::AtomicFetchAndAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                },
                AtomicType::CmpAndSwap => SendOp::AtomicCmpAndSwp {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
            },
        };
        SendWr {
            wr_id: i,
            op,
            data: SendData::Sges(vec![self.mr.sge(off as usize, size as usize)]),
            signaled,
            solicited: false,
            ud: self.ud,
        }
    }

    /// A receive WR for up to `len` bytes (plus the GRH room on UD) in the peer's half.
    pub(crate) fn recv_wr(&self, id: u64, len: u64) -> RecvWr {
        let len = len as usize + if self.ud.is_some() { UD_GRH } else { 0 };
        RecvWr {
            wr_id: id,
            sges: vec![self.mr.sge(self.half, len.min(self.half))],
        }
    }

    /// Posts up to `n` receives of `len` bytes; returns how many the queue took.
    ///
    /// # Errors
    /// A post refused for another reason than a full queue.
    pub(crate) fn post_recvs(&self, n: u64, len: u64) -> anyhow::Result<u64> {
        for i in 0..n {
            match self.qp.post_recv(self.recv_wr(i, len)) {
                Ok(()) => {}
                Err(roce_transport::PostError::QueueFull) => return Ok(i),
                Err(e) => bail!("posting a receive: {e}"),
            }
        }
        Ok(n)
    }

    /// Turns a failed completion into the error the stock tools print, with the device's
    /// last error as context.
    pub(crate) fn completion_error(
        &self,
        c: &Completion,
        role: Role,
        scnt: u64,
        ccnt: u64,
    ) -> anyhow::Error {
        let side = match role {
            Role::Client => "client",
            Role::Server => "server",
        };
        let mut msg = format!(
            "completion with error at {side}: status {} ({}), wr_id {}, opcode {:?}, scnt={scnt}, \
             ccnt={ccnt}",
            c.status as u8,
            crate::pingpong::status::status_str(c.status),
            c.wr_id,
            c.opcode
        );
        if let Some(e) = self.dev.last_error() {
            msg.push_str(&format!(" (device: {e})"));
        }
        anyhow::anyhow!(msg)
    }
}

/// Waits for completions on `cq`: spinning on [`CompletionQueue::poll`] (which drives the
/// engine itself when the queue is empty), or with `events` blocking in
/// [`CompletionQueue::wait`]. Fails after `limit` without any completion.
///
/// # Errors
/// Nothing completed within `limit`.
pub(crate) fn wait_cq(
    cq: &CompletionQueue,
    out: &mut [Completion],
    events: bool,
    limit: Duration,
    what: &str,
) -> anyhow::Result<usize> {
    if events {
        let n = cq.wait(out, limit);
        if n == 0 {
            bail!(
                "no completion within {} while waiting for {what}",
                secs(limit)
            );
        }
        return Ok(n);
    }
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    loop {
        let n = cq.poll(out);
        if n > 0 {
            return Ok(n);
        }
        spins += 1;
        if spins % 4096 == 0 {
            let s = *start.get_or_insert_with(Instant::now);
            if s.elapsed() >= limit {
                bail!(
                    "no completion within {} while waiting for {what}",
                    secs(limit)
                );
            }
        }
    }
}

/// Checks a completion's status.
pub(crate) fn ok(c: &Completion) -> bool {
    c.status == WcStatus::Success
}

fn secs(d: Duration) -> String {
    format!("{:.0}s", d.as_secs_f64())
}

/// The `ibv_mtu` enum of a path MTU (1 = 256 … 5 = 4096).
pub(crate) fn mtu_enum(m: Mtu) -> u8 {
    match m.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

fn mtu_from_enum(e: u8) -> Option<Mtu> {
    Mtu::from_bytes(128usize << e)
}

fn resolve(host: &str, port: u16) -> anyhow::Result<IpAddr> {
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .map(|a| a.ip())
        .find(IpAddr::is_ipv4)
        .with_context(|| format!("{host} has no IPv4 address (the perftest exchange is IPv4)"))
}

/// Opens the device the options name. Returns it with the GID index and the GID in use.
///
/// `--local IP` binds that address directly (two addresses of `lo` for a server and a client
/// on one host, as the bench does); otherwise [`crate::device::open_device`] picks the
/// interface (`-d`, else the route to the server, else the default route's) and the GID
/// (`-x`, else the routed source address's, else the first IPv4 one), as rxe users expect.
fn open_device(cfg: &Config, peer: Option<IpAddr>) -> anyhow::Result<(Device, u8, Gid)> {
    let Some(ip) = cfg.local else {
        return crate::device::open_device(DeviceArgs {
            ib_dev: cfg.ib_dev.clone(),
            gid_idx: cfg.gid_index,
            peer,
            pcap: cfg.pcap.clone(),
            progress: cfg.progress,
            backend: cfg.backend,
            mtu: None,
            engines: cfg.engines,
            engine_spin: cfg.engine_spin,
        });
    };
    let name = netdev::interface_for_addr(ip)
        .map(|n| n.name)
        .unwrap_or_else(|_| "rocectl0".into());
    let mut config = DeviceConfig::udp(ip)
        .name(name)
        .progress(cfg.progress)
        .engines(cfg.engines.n)
        .engine_spin(cfg.engine_spin);
    config.capture = crate::signals::open_capture(cfg.pcap.as_deref(), &config.name)?;
    let dev = Device::open(config)
        .with_context(|| format!("opening the device on {ip} (--local {ip})"))?;
    crate::device::report_engines(&dev, cfg.engines);
    let index = dev.local_gid_index().unwrap_or(0);
    let gid = dev.local_gid();
    Ok((dev, index, gid))
}

/// perftest's `ctx_print_test_info`, with the lines 6.06 prints for rxe.
fn print_info(cfg: &Config, dev: &Device, gid_index: u8, mtu: Mtu, out_reads: u8) {
    let title = match cfg.tool {
        Tool::SendBw => "Send BW Test".to_owned(),
        Tool::WriteBw => "RDMA_Write BW Test".to_owned(),
        Tool::ReadBw => "RDMA_Read BW Test".to_owned(),
        Tool::AtomicBw => format!("Atomic {} BW Test", cfg.atomic.name()),
        Tool::SendLat => "Send Latency Test".to_owned(),
        Tool::WriteLat => "RDMA_Write Latency Test".to_owned(),
        Tool::ReadLat => "RDMA_Read Latency Test".to_owned(),
    };
    let conn = match cfg.qp_type {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    };
    let bw = cfg.tool.is_bw();
    let client = cfg.role == Role::Client;
    let mut out = String::new();
    out.push_str(report::RESULT_LINE);
    out.push('\n');
    out.push_str(&format!("                    {title}\n"));
    out.push_str(&format!(
        " Dual-port       : OFF\t\tDevice         : {}\n",
        dev.name()
    ));
    out.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : IB\n",
        cfg.qps
    ));
    out.push_str(&format!(
        " Connection type : {conn}\t\tUsing SRQ      : OFF\n"
    ));
    out.push_str(" PCIe relax order: OFF\n ibv_wr* API     : OFF\n");
    if client {
        let depth = if bw { cfg.tx_depth } else { 1 };
        out.push_str(&format!(" TX depth        : {depth}\n"));
    } else if matches!(cfg.tool, Tool::SendBw | Tool::SendLat) {
        out.push_str(&format!(" RX depth        : {}\n", cfg.rx_depth));
    }
    if bw {
        out.push_str(&format!(" CQ Moderation   : {}\n", cfg.cq_mod));
    }
    out.push_str(&format!(" Mtu             : {}[B]\n", mtu.bytes()));
    out.push_str(" Link type       : Ethernet\n");
    out.push_str(&format!(" GID index       : {gid_index}\n"));
    if cfg.tool.uses_out_reads() {
        out.push_str(&format!(" Outstand reads  : {out_reads}\n"));
    } else {
        out.push_str(" Max inline data : 0[B]\n");
    }
    out.push_str(" rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n");
    out.push_str(report::RESULT_LINE);
    print!("{out}");
    println!();
}

/// Runs `f` (a wait on the out-of-band TCP connection); with `Progress::Manual` a scoped
/// thread drives the engine meanwhile, since nothing else does: a lost last ACK or a peer's
/// retransmission must still be answered, or the peer's retries run out.
fn with_progress<T>(
    dev: &Device,
    progress: Progress,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    if progress != Progress::Manual {
        return f();
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                dev.progress_wait(Duration::from_millis(5));
            }
        });
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}
