//! One pingpong run, in the stock tools' order: device and verbs objects, receives posted,
//! the TCP exchange (a server connects its QPs between reading and answering), the loop, the
//! report.
//!
//! The loop is rdma-core's (`rc_pingpong.c` `parse_single_wc`, `ud_pingpong.c`,
//! `srq_pingpong.c`): each QP has a `pending` mask of `RECV_WRID | SEND_WRID`; a completion
//! clears its bit, and when a QP has nothing pending and fewer than `iters` sends completed,
//! it sends again. The client starts by sending (each QP for srq); the server starts by
//! waiting. Receives are refilled up to `rx_depth` when at most 1 (srq: `num_qp`) remain. The
//! counts are global: srq's `-n` counts messages over all QPs, as in rdma-core.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roce_transport::{
    Access, AddressHandle, AttrMask, Completion, CompletionQueue, ConnectOptions, Device, Gid,
    MemoryRegion, PostError, ProtectionDomain, Psn, QKey, QpAttr, QpState, QpStats, QpType,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, SharedReceiveQueue, UdDest, WcStatus,
};

use super::status::{failed_line, hints, Failure};
use super::{Options, Tool};
use crate::device::{ip_text, open_device, DeviceArgs};
use crate::oob::pingpong::{Layout, PingpongConn, PingpongDest};
use crate::oob::{self, Timeout};

/// `PINGPONG_RECV_WRID`.
const RECV_WRID: u64 = 1;
/// `PINGPONG_SEND_WRID`.
const SEND_WRID: u64 = 2;
/// Bytes in front of every UD receive buffer for the network header (GRH).
const GRH_LEN: usize = 40;
/// The Q_Key of `ibv_ud_pingpong`.
const PINGPONG_QKEY: u32 = 0x1111_1111;
/// `sysconf(_SC_PAGESIZE)` on the hosts the stock tools run on (x86-64): `--chk` writes a 0
/// at the start of every page of the message.
const PAGE_SIZE: usize = 4096;
/// How long one wait for a completion lasts before the loop checks `--timeout`.
const SLICE: Duration = Duration::from_millis(100);

/// Runs one tool, server or client.
pub(super) fn run(opts: &Options) -> anyhow::Result<ExitCode> {
    let c = &opts.common;
    let server_addrs = match &c.host {
        Some(host) => Some(resolve(host, c.port)?),
        None => None,
    };
    let (device, gid_index, gid) = open_device(DeviceArgs {
        ib_dev: c.ib_dev.clone(),
        gid_idx: c.gid_idx,
        backend: c.backend,
        peer: server_addrs.as_ref().map(|a| a[0].ip()),
        mtu: None,
        pcap: c.pcap.clone(),
        progress: roce_transport::Progress::Thread,
        // One QP: `ROCECTL_ENGINES` only (no flag), default one engine.
        engines: crate::device::engines_setting(None, 1)?,
        engine_spin: Duration::ZERO,
    })?;
    let port = device.query_port();
    let ifname = port
        .netdev
        .clone()
        .unwrap_or_else(|| device.name().to_owned());
    if let Some(mtu) = opts.mtu {
        if mtu > port.active_mtu {
            bail!(
                "path MTU {} (-m) is larger than the active MTU {} of {ifname} (interface MTU \
                 {}): use -m {} or less, on both sides",
                mtu.bytes(),
                port.active_mtu.bytes(),
                port.ip_mtu,
                port.active_mtu.bytes()
            );
        }
    }
    if opts.tool == Tool::Ud && opts.size > port.active_mtu.bytes() {
        bail!(
            "Requested size larger than port MTU ({}): a UD message is one packet; use -s {} or \
             less",
            port.active_mtu.bytes(),
            port.active_mtu.bytes()
        );
    }

    let res = Resources::create(&device, opts)?;
    let routs = res.post_recv(c.rx_depth);
    if routs < c.rx_depth {
        bail!("Couldn't post receive ({routs})");
    }
    if c.events > 0 {
        res.cq.req_notify(false);
    }

    let mine: Vec<PingpongDest> = res
        .qps
        .iter()
        .map(|qp| PingpongDest {
            lid: 0,
            qpn: qp.qpn(),
            psn: Psn::new(device.random_psn()),
            gid,
        })
        .collect();
    for d in &mine {
        println!(
            "{}",
            address_line("local address: ", d, opts.tool == Tool::Ud)
        );
    }

    let layout = match opts.tool {
        Tool::Srq => Layout::Srq,
        _ => Layout::Single,
    };
    let oob_timeout = Timeout::After(Duration::from_secs_f64(c.oob_timeout));
    let (theirs, remotes) = match &server_addrs {
        Some(addrs) => {
            let stream = oob::connect(&addrs[..], oob_timeout)
                .map_err(flat)
                .with_context(|| {
                    format!(
                        "Couldn't connect to {}:{} (is the server running? `rocectl {}` or the \
                     stock tool without a host)",
                        c.host.as_deref().unwrap_or_default(),
                        c.port,
                        tool_name(opts.tool)
                    )
                })?;
            let tcp_peer = stream.peer_addr().map(|a| a.ip()).unwrap_or(addrs[0].ip());
            let mut conn = PingpongConn::new(stream, layout, oob_timeout);
            let theirs = conn
                .client_exchange(&mine)
                .map_err(flat)
                .context("Couldn't read/write remote address")?;
            let remotes = remote_qps(&theirs, opts.num_qp, tcp_peer, gid)?;
            (theirs, remotes)
        }
        None => {
            let listener = listen(c.port)?;
            let accept_timeout = c.timeout.map_or(Timeout::Never, |s| {
                Timeout::After(Duration::from_secs_f64(s))
            });
            let (stream, tcp_peer) =
                oob::accept(&listener, accept_timeout).map_err(|e| match e {
                    oob::OobError::Timeout { waited, .. } => anyhow::anyhow!(
                        "no client connected to TCP port {} within {waited} (--timeout)",
                        c.port
                    ),
                    other => flat(other).context(format!("accepting a client on port {}", c.port)),
                })?;
            drop(listener);
            let mut conn = PingpongConn::new(stream, layout, oob_timeout);
            let theirs = conn.server_read().context("Couldn't read remote address")?;
            let remotes = remote_qps(&theirs, opts.num_qp, tcp_peer.ip(), gid)?;
            res.connect(&remotes, &mine, opts)?;
            conn.server_reply(&mine)
                .map_err(flat)
                .context("Couldn't send/recv local address")?;
            (theirs, remotes)
        }
    };
    for d in theirs.iter().take(opts.num_qp) {
        println!("{}", address_line("remote address:", d, false));
    }
    if server_addrs.is_some() {
        res.connect(&remotes, &mine, opts)?;
    }

    let client = server_addrs.is_some();
    if client && c.chk {
        res.fill_chk_pattern(opts)?;
    }
    let ud: Vec<Option<UdDest>> = remotes
        .iter()
        .map(|r| {
            (opts.tool == Tool::Ud).then(|| UdDest {
                ah: AddressHandle {
                    sgid_index: gid_index,
                    ..AddressHandle::new(r.gid)
                },
                remote_qpn: r.qpn,
                remote_qkey: QKey::new(PINGPONG_QKEY),
            })
        })
        .collect();
    let mut pp = Pingpong {
        res: &res,
        opts,
        ud,
        pending: vec![0; opts.num_qp],
        routs,
    };
    let peer = remotes
        .first()
        .map_or_else(String::new, |r| r.gid.to_ip().to_string());
    match pp.run(client)? {
        Outcome::Done(elapsed) => {
            report(opts, elapsed);
            if c.chk && !res.check_chk_pattern(opts) {
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Failed(status) => {
            explain(&res, opts, Some(status), &peer);
            Ok(ExitCode::FAILURE)
        }
        Outcome::Silent(waited) => {
            eprintln!(
                "rocectl: error: no completion for {:.1} s (--timeout): the peer stopped \
                 answering",
                waited.as_secs_f64()
            );
            explain(&res, opts, None, &peer);
            Ok(ExitCode::FAILURE)
        }
        Outcome::Stopped(message) => {
            eprintln!("{message}");
            explain(&res, opts, None, &peer);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The verbs objects of a run.
struct Resources {
    device: Device,
    cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
}

impl Resources {
    /// `pp_init_ctx`: buffer, PD, MR, CQ, SRQ, QPs moved to INIT.
    fn create(device: &Device, opts: &Options) -> anyhow::Result<Self> {
        let c = &opts.common;
        let pd = device.alloc_pd();
        let grh = grh_len(opts.tool);
        // rc/uc/ud fill their buffer with 0x7b (`memset(ctx->buf, 0x7b, size)`), srq with 0.
        let fill = fill_byte(opts.tool);
        let mr = pd
            .register(
                crate::limits::buffer(opts.size + grh, fill, "the message buffer")?,
                Access::LOCAL_WRITE,
            )
            .context("Couldn't register MR")?;
        let cq_depth = match opts.tool {
            Tool::Srq => c.rx_depth + opts.num_qp,
            _ => c.rx_depth + 1,
        };
        let cq = device.create_cq(cq_depth).context("Couldn't create CQ")?;
        let srq = (opts.tool == Tool::Srq).then(|| device.create_srq(c.rx_depth));
        let qp_type = opts.tool.qp_type();
        let mut qps = Vec::with_capacity(opts.num_qp);
        for i in 0..opts.num_qp {
            let mut init = roce_transport::QpInit::new(qp_type, &cq);
            init.config.max_send_wr = 1;
            init.config.max_recv_wr = c.rx_depth;
            init.config.max_sge = 1;
            init.srq = srq.clone();
            let qp = pd
                .create_qp(&init)
                .with_context(|| format!("Couldn't create QP[{i}]"))?;
            let attr = QpAttr {
                state: QpState::Init,
                pkey_index: 0,
                port: 1,
                access_flags: Access::empty(),
                qkey: QKey::new(PINGPONG_QKEY),
                ..QpAttr::default()
            };
            let third = if qp_type == QpType::Ud {
                AttrMask::QKEY
            } else {
                AttrMask::ACCESS_FLAGS
            };
            qp.modify(
                &attr,
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | third,
            )
            .with_context(|| format!("Failed to modify QP[{i}] to INIT"))?;
            qps.push(qp);
        }
        Ok(Self {
            device: device.clone(),
            cq,
            srq,
            qps,
            mr,
            _pd: pd,
        })
    }

    /// `pp_post_recv`: posts up to `n` receives of the whole buffer; returns how many.
    fn post_recv(&self, n: usize) -> usize {
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sges: vec![self.mr.sge(0, self.mr.len())],
        };
        for i in 0..n {
            let posted = match &self.srq {
                Some(srq) => srq.post_recv(wr.clone()),
                None => self.qps[0].post_recv(wr.clone()),
            };
            if posted.is_err() {
                return i;
            }
        }
        n
    }

    /// `pp_connect_ctx` for every QP: RTR and RTS towards the peer's QPs.
    fn connect(
        &self,
        remotes: &[RemoteQp],
        mine: &[PingpongDest],
        opts: &Options,
    ) -> anyhow::Result<()> {
        for (i, ((qp, remote), me)) in self.qps.iter().zip(remotes).zip(mine).enumerate() {
            let connect = ConnectOptions {
                mtu: opts.mtu,
                local_psn: me.psn,
                access: Access::empty(),
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: 12,
                rd_atomic: 1,
                traffic_class: 0,
                qkey: QKey::new(PINGPONG_QKEY),
            };
            qp.connect(remote, &connect)
                .with_context(|| format!("Failed to modify QP[{i}] to RTR/RTS"))?;
        }
        Ok(())
    }

    /// The client's `--chk` pattern: byte 0 of every page of the message set to
    /// `i / page_size % sizeof(char)`, which is 0 (the rest keeps the buffer's fill).
    fn fill_chk_pattern(&self, opts: &Options) -> anyhow::Result<()> {
        let grh = grh_len(opts.tool);
        for i in (0..opts.size).step_by(PAGE_SIZE) {
            self.mr
                .write(grh + i, &[0])
                .context("writing the --chk pattern")?;
        }
        Ok(())
    }

    /// The `--chk` validation: rdma-core's (byte 0 of each page must be 0, else `invalid
    /// data in page N`), and the rest of each page must still be the stock fill byte (what
    /// a stock client sends). Returns whether the data is valid.
    fn check_chk_pattern(&self, opts: &Options) -> bool {
        let grh = grh_len(opts.tool);
        let data = self.mr.to_vec();
        let msg = &data[grh..grh + opts.size];
        let fill = fill_byte(opts.tool);
        let mut valid = true;
        for (page, chunk) in msg.chunks(PAGE_SIZE).enumerate() {
            let ok = chunk[0] == 0 && chunk[1..].iter().all(|&b| b == fill);
            if !ok {
                println!("invalid data in page {page}");
                valid = false;
            }
        }
        valid
    }

    /// The QPs' counters, summed.
    fn stats(&self) -> QpStats {
        let mut sum = QpStats::default();
        for qp in &self.qps {
            let s = qp.stats();
            sum.tx_packets += s.tx_packets;
            sum.rx_packets += s.rx_packets;
            sum.retransmitted_packets += s.retransmitted_packets;
            sum.timeouts += s.timeouts;
            sum.drop_length += s.drop_length;
            sum.drop_qkey += s.drop_qkey;
            sum.drop_no_recv += s.drop_no_recv;
            for k in 0..3 {
                sum.naks_sent_by_code[k] += s.naks_sent_by_code[k];
                sum.naks_received_by_code[k] += s.naks_received_by_code[k];
            }
        }
        sum
    }
}

/// How the loop ended.
enum Outcome {
    /// Every message went both ways, in this time.
    Done(Duration),
    /// A completion failed (its line is printed).
    Failed(WcStatus),
    /// Nothing completed for this long (`--timeout`).
    Silent(Duration),
    /// The loop stopped as the stock tools do (`Couldn't post send`...): the message.
    Stopped(String),
}

/// The loop's state.
struct Pingpong<'a> {
    res: &'a Resources,
    opts: &'a Options,
    /// UD: where each QP sends.
    ud: Vec<Option<UdDest>>,
    /// Per QP: the work requests it waits for (`ctx->pending`).
    pending: Vec<u64>,
    /// Receives posted and not completed.
    routs: usize,
}

impl Pingpong<'_> {
    fn post_send(&self, qp_index: usize) -> Result<(), PostError> {
        let grh = grh_len(self.opts.tool);
        let mut wr = SendWr::new(
            SEND_WRID,
            SendOp::Send,
            vec![self.res.mr.sge(grh, self.opts.size)],
        );
        wr.ud = self.ud[qp_index];
        self.res.qps[qp_index].post_send(wr)
    }

    fn run(&mut self, client: bool) -> anyhow::Result<Outcome> {
        let c = &self.opts.common;
        let iters = c.iters;
        let num_qp = self.opts.num_qp;
        for i in 0..num_qp {
            self.pending[i] = RECV_WRID;
            if client {
                if let Err(e) = self.post_send(i) {
                    return Ok(Outcome::Stopped(format!("Couldn't post send: {e}")));
                }
                self.pending[i] |= SEND_WRID;
            }
        }
        let refill_at = if self.opts.tool == Tool::Srq {
            num_qp
        } else {
            1
        };
        let num_wc = if self.opts.tool == Tool::Srq {
            num_qp + c.rx_depth
        } else {
            2
        };
        let mut wc = vec![Completion::EMPTY; num_wc];
        let idle_limit = c.timeout.map(Duration::from_secs_f64);
        let cq = &self.res.cq;
        let start = Instant::now();
        let mut last = start;
        let (mut rcnt, mut scnt) = (0_u64, 0_u64);
        while rcnt < iters || scnt < iters {
            let ne = if c.events > 0 {
                if cq.get_event(SLICE) {
                    cq.req_notify(false);
                    cq.poll(&mut wc)
                } else {
                    0
                }
            } else {
                cq.wait(&mut wc, SLICE)
            };
            if ne == 0 {
                if let Some(limit) = idle_limit {
                    if last.elapsed() >= limit {
                        return Ok(Outcome::Silent(last.elapsed()));
                    }
                }
                continue;
            }
            last = Instant::now();
            for w in &wc[..ne] {
                if w.status != WcStatus::Success {
                    eprintln!("{}", failed_line(w.status, w.wr_id));
                    return Ok(Outcome::Failed(w.status));
                }
                let Some(qp_index) = self.res.qps.iter().position(|q| q.qpn() == w.qp_num) else {
                    return Ok(Outcome::Stopped(format!(
                        "Couldn't find QPN {:06x}",
                        w.qp_num.value()
                    )));
                };
                match w.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        self.routs = self.routs.saturating_sub(1);
                        if self.routs <= refill_at {
                            self.routs += self.res.post_recv(c.rx_depth - self.routs);
                            if self.routs < c.rx_depth {
                                return Ok(Outcome::Stopped(format!(
                                    "Couldn't post receive ({})",
                                    self.routs
                                )));
                            }
                        }
                        rcnt += 1;
                    }
                    other => {
                        return Ok(Outcome::Stopped(format!(
                            "Completion for unknown wr_id {}",
                            other as i32
                        )))
                    }
                }
                self.pending[qp_index] &= !w.wr_id;
                if scnt < iters && self.pending[qp_index] == 0 {
                    if let Err(e) = self.post_send(qp_index) {
                        return Ok(Outcome::Stopped(format!("Couldn't post send: {e}")));
                    }
                    self.pending[qp_index] = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(Outcome::Done(start.elapsed()))
    }
}

/// The two result lines, `printf("%lld bytes in %.2f seconds = %.2f Mbit/sec\n", ...)` and
/// `printf("%d iters in %.2f seconds = %.2f usec/iter\n", ...)`.
fn report(opts: &Options, elapsed: Duration) {
    let iters = opts.common.iters;
    // At least a microsecond, as `gettimeofday` differences are never below one when the
    // stock tools print a rate.
    let usec = (elapsed.as_secs_f64() * 1e6).max(1.0);
    let bytes = opts.size as u64 * iters * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / iters.max(1) as f64
    );
}

/// Prints `rocectl: hint:` lines about a failed run.
fn explain(res: &Resources, opts: &Options, status: Option<WcStatus>, peer: &str) {
    let stats = res.stats();
    let failure = Failure {
        status,
        stats: &stats,
        mtu: opts.mtu,
        size: opts.size,
        peer,
    };
    for hint in hints(&failure) {
        eprintln!("rocectl: hint: {hint}");
    }
    if let Some(e) = res.device.last_error() {
        eprintln!("rocectl: hint: last transport event: {e}");
    }
}

/// One address line as the stock tools print it. `ibv_ud_pingpong` prints its local line with
/// `PSN 0x%06x: GID`.
fn address_line(label: &str, d: &PingpongDest, ud_local: bool) -> String {
    format!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{} GID {}",
        d.lid,
        d.qpn.value(),
        d.psn.value(),
        if ud_local { ":" } else { "," },
        ip_text(d.gid)
    )
}

/// The peer's QPs from its records: the first `num_qp`, checked. A zero GID (a stock tool run
/// without `-g`) is replaced by the GID of the peer's TCP address.
fn remote_qps(
    theirs: &[PingpongDest],
    num_qp: usize,
    tcp_peer: IpAddr,
    local_gid: Gid,
) -> anyhow::Result<Vec<RemoteQp>> {
    let tcp_peer = match tcp_peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let mut out = Vec::with_capacity(num_qp);
    for (i, d) in theirs.iter().take(num_qp).enumerate() {
        if d.qpn.value() == 0 {
            bail!(
                "the peer sent no QP in record {i}: it runs fewer QPs than our {num_qp}; both \
                 sides must use the same -q"
            );
        }
        let gid = if d.gid == Gid::ZERO {
            Gid::from_ip(tcp_peer)
        } else {
            d.gid
        };
        if gid.is_ipv4_mapped() != local_gid.is_ipv4_mapped() {
            bail!(
                "the peer's GID {} and ours {} are of different IP families: pick GID indexes \
                 of the same family on both sides (-g)",
                ip_text(gid),
                ip_text(local_gid)
            );
        }
        out.push(RemoteQp {
            qpn: d.qpn,
            psn: d.psn,
            gid,
        });
    }
    if out.len() < num_qp {
        bail!(
            "the peer sent {} QP addresses, we have {num_qp} QPs",
            out.len()
        );
    }
    Ok(out)
}

/// The server's listening socket: all addresses, IPv6 and IPv4 (`getaddrinfo(NULL, port,
/// AI_PASSIVE)` + `bind` in the stock tools).
fn listen(port: u16) -> anyhow::Result<TcpListener> {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .with_context(|| format!("Couldn't listen to port {port}"))
}

/// The server's addresses.
fn resolve(host: &str, port: u16) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host}:{port}"))?
        .collect();
    if addrs.is_empty() {
        bail!("{host} has no address");
    }
    Ok(addrs)
}

/// An exchange error as one message: its `Display` already includes its cause, which
/// `anyhow`'s `{:#}` would print a second time.
fn flat(e: oob::OobError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn grh_len(tool: Tool) -> usize {
    if tool == Tool::Ud {
        GRH_LEN
    } else {
        0
    }
}

fn fill_byte(tool: Tool) -> u8 {
    if tool == Tool::Srq {
        0
    } else {
        0x7B
    }
}

fn tool_name(tool: Tool) -> &'static str {
    match tool {
        Tool::Rc => "rc-pingpong",
        Tool::Uc => "uc-pingpong",
        Tool::Ud => "ud-pingpong",
        Tool::Srq => "srq-pingpong",
    }
}

#[cfg(test)]
mod tests {
    use roce_transport::Qpn;

    use super::*;

    #[test]
    fn address_lines_match_the_captures() {
        // shared/captures/rc_pingpong.txt and ud_pingpong.txt.
        let d = PingpongDest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0x71_77B7),
            gid: Gid::from_ip(Ipv4Addr::new(10, 77, 0, 1).into()),
        };
        assert_eq!(
            address_line("local address: ", &d, false),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x7177b7, GID ::ffff:10.77.0.1"
        );
        assert_eq!(
            address_line("remote address:", &d, false),
            "  remote address: LID 0x0000, QPN 0x000011, PSN 0x7177b7, GID ::ffff:10.77.0.1"
        );
        assert_eq!(
            address_line("local address: ", &d, true),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x7177b7: GID ::ffff:10.77.0.1"
        );
    }

    #[test]
    fn zero_gid_falls_back_to_the_tcp_peer() {
        let local = Gid::from_ip(Ipv4Addr::new(127, 0, 0, 2).into());
        let theirs = [PingpongDest {
            qpn: Qpn::new(0x11),
            ..PingpongDest::default()
        }];
        let peer = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped());
        let r = remote_qps(&theirs, 1, peer, local).unwrap();
        assert_eq!(r[0].gid.to_ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
        let missing = remote_qps(&theirs, 2, peer, local);
        assert!(missing.is_err());
    }

    #[test]
    fn srq_padding_records_are_refused() {
        let local = Gid::from_ip(Ipv4Addr::LOCALHOST.into());
        let theirs = [PingpongDest::default(); 4];
        let err = remote_qps(&theirs, 2, Ipv4Addr::LOCALHOST.into(), local).unwrap_err();
        assert!(err.to_string().contains("same -q"), "{err}");
    }
}
