//! perftest's exchange (`ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`,
//! `ib_send_lat`, `ib_write_lat`, `ib_read_lat`), as perftest 6.06 (Debian 12's
//! `perftest 4.5+0.17`, the lab's) speaks it without `-R`/`--rdma_cm`.
//!
//! Sources: <https://github.com/linux-rdma/perftest/blob/master/src/perftest_communication.c>
//! (`ctx_xchg_data_ethernet`, `ethernet_write_keys`/`ethernet_read_keys`, `exchange_versions`,
//! `check_sys_data`, `check_mtu`, `xchg_bw_reports`, `ctx_hand_shake`,
//! `ctx_close_connection`), the formats in `src/perftest_communication.h`, and the order in
//! each tool's `main()`: `src/send_bw.c`, `src/write_bw.c`, `src/read_bw.c`,
//! `src/atomic_bw.c`, `src/send_lat.c`, `src/write_lat.c`, `src/read_lat.c` (tag
//! `v4.5-0.17` for the lab's version). The counts below were checked message by message
//! against the lab's captures of 6.06 (`shared/captures/ib_*.pcap`, and the variants listed
//! under "Options that change the order"); later perftest versions add messages
//! (`negotiate_params`).
//!
//! # Messages
//!
//! Every exchange is symmetric: the **client writes first, then reads**; the server reads,
//! then writes (`ctx_xchg_data_ethernet`, `ctx_hand_shake`). Each message goes out in one
//! `write` and is read with one `read` of exactly its size.
//!
//! | step | bytes | content |
//! |---|---|---|
//! | versions | 16 | `"6.06"` NUL-padded (`user_param->version`) |
//! | sys data | 4 + 4 | `cycle_buffer` (page size, `00 00 10 00`), then `cache_line_size` (`00 00 00 40`), big-endian ints; both sides keep the larger (peer ≥ 5.32) |
//! | MTU | 2 | the `ibv_mtu` enum in ASCII + NUL, `"3\0"` = 1024; both use the smaller (peer ≥ 5.31, else 4 bytes) |
//! | key record | 108 | `"%04x:%04x:%06x:%06x:%08x:%016llx:"` lid:out_reads:qpn:psn:rkey:vaddr, 16 × `"%02x:"` GID bytes, `"%08x:"` srqn, NUL |
//! | BW report | 5 × 8 | size, iters (u64 since 5.33), BW peak, BW average, msg rate (IEEE doubles); all big-endian, one exchange each |
//! | done | 5 | `"done\0"`, written by each side *without* reading the other's, then close |
//!
//! Peers older than 5.33 are refused (their sizes differ, see the notes in the table).
//!
//! A *hand shake* is one key-record exchange: the first carries each QP's record, the later
//! ones repeat QP 0's record as a barrier. `ctx_close_connection` is a hand shake followed by
//! `done`.
//!
//! # Order per tool (1 QP, default options, not `-a`)
//!
//! After `connect`/`accept`: versions, sys data, MTU, then
//!
//! | tool | before traffic | after traffic |
//! |---|---|---|
//! | `ib_send_bw` (RC, UC, UD) | 4 hand shakes | close (hand shake + done) |
//! | `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw` | 3 hand shakes | hand shake, BW report, close |
//! | `ib_send_lat`, `ib_read_lat` | 4 hand shakes | close |
//! | `ib_write_lat` | 4 hand shakes | nothing: both sides just close the socket |
//!
//! In the BW tests without `-b` only the client runs traffic: the server sits in the first
//! "after traffic" barrier until the client finishes, so that read needs [`Timeout::Never`]
//! or a timeout longer than the test. The server prints the client's BW report (its own
//! words are uninitialised stack in 6.06: ignore them). With `-q N` the first hand shake
//! happens once per QP; `-a`, `-b` (bidirectional) and `-D` add barriers not listed here.
//! [`Tool::plan`] encodes the table.
//!
//! # Options that change the order
//!
//! Captured with perftest 6.06 in the lab (`conformance/lab/captures/perftest-options/`,
//! `-n 5`), checked by `bin/tests/oob_perftest.rs`:
//!
//! | option | effect |
//! |---|---|
//! | `-a` (sizes 2^1..2^23; UD: up to the MTU) | `ib_send_bw`: the 4th hand shake becomes one hand shake before *and* one after each size (3 + 2 × 23 + close); `ib_send_lat`: one before each size (3 + 23 + close); `ib_write_bw`, `ib_read_bw`, `ib_read_lat`, `ib_write_lat`: unchanged, the sizes run back to back (BW tools: one report at the end). [`Tool::plan_for`] |
//! | `-q 2` | `ib_send_bw`: the first and the third hand shake happen once per QP, each with that QP's record (2 + 1 + 2 + 1 + close) |
//! | `-b` | `ib_write_bw -b`: the same sequence as without |
//! | `-c UC`, `-c UD` | the same sequence as RC (`ib_send_bw`, `ib_write_bw`, `ib_send_lat`) |

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use roce_wire::{Gid, Psn, Qpn, RKey};

use super::{drain_done, quote, read_exact, write_msg, OobError, Timeout, DONE};

/// The version we announce.
pub(crate) const VERSION: &str = "6.06";
/// Size of the version message.
pub(crate) const VERSION_LEN: usize = 16;
/// Size of a key record (`KEY_MSG_SIZE_GID`).
pub(crate) const KEY_RECORD_LEN: usize = 108;
/// `cycle_buffer` perftest sends: the page size.
pub(crate) const DEFAULT_CYCLE_BUFFER: u32 = 4_096;
/// `cache_line_size` perftest sends.
pub(crate) const DEFAULT_CACHE_LINE: u32 = 64;

/// Which side of the TCP connection we are. The client writes first in every exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Connected to a server (a host name was given).
    Client,
    /// Accepted the connection.
    Server,
}

/// One QP's key record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PerftestDest {
    /// LID; 0 on RoCE.
    pub(crate) lid: u16,
    /// Outstanding RDMA READs/atomics the sender allows (`-o`; rxe: 128 = 0x80 for read and
    /// atomic tests, 1 for the others).
    pub(crate) out_reads: u16,
    /// QP number.
    pub(crate) qpn: Qpn,
    /// First PSN.
    pub(crate) psn: Psn,
    /// Remote key of the buffer (0 in SEND tests).
    pub(crate) rkey: RKey,
    /// Address of the buffer the peer reads or writes.
    pub(crate) vaddr: u64,
    /// GID of the selected `-x` index.
    pub(crate) gid: Gid,
    /// SRQ number (XRC and DC only; 0 otherwise).
    pub(crate) srqn: u32,
}

impl PerftestDest {
    /// The 108-byte record.
    pub(crate) fn to_record(self) -> [u8; KEY_RECORD_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.value(),
            self.psn.value(),
            self.rkey.value(),
            self.vaddr
        );
        for b in self.gid.0 {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_RECORD_LEN];
        out[..KEY_RECORD_LEN - 1].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a 108-byte record, strictly (every field at its printed width).
    ///
    /// # Errors
    /// [`OobError::Malformed`] quoting the bytes.
    pub(crate) fn parse(record: &[u8]) -> Result<Self, OobError> {
        let bad = |why: &str| OobError::Malformed {
            what: "perftest key record (lid:out_reads:qpn:psn:rkey:vaddr:gid:srqn)",
            detail: format!("{why}, got {}", quote(record)),
        };
        if record.len() != KEY_RECORD_LEN {
            return Err(bad("expected 108 bytes"));
        }
        if record[KEY_RECORD_LEN - 1] != 0 {
            return Err(bad("expected a NUL at byte 108"));
        }
        let text = std::str::from_utf8(&record[..KEY_RECORD_LEN - 1])
            .map_err(|_| bad("expected ASCII text"))?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 24 || !fields[23].is_empty() {
            return Err(bad("expected 23 fields, each followed by ':'"));
        }
        let field = |i: usize, width: usize, name: &str| {
            super::hex_field(fields[i], width)
                .ok_or_else(|| bad(&format!("{name}: expected {width} hex digits")))
        };
        let mut gid = [0u8; 16];
        for (k, b) in gid.iter_mut().enumerate() {
            *b = u8::try_from(field(6 + k, 2, "GID byte")?).unwrap_or(u8::MAX);
        }
        // The widths checked bound every value, so the conversions cannot fail.
        Ok(Self {
            lid: u16::try_from(field(0, 4, "lid")?).unwrap_or(u16::MAX),
            out_reads: u16::try_from(field(1, 4, "out_reads")?).unwrap_or(u16::MAX),
            qpn: Qpn::new(u32::try_from(field(2, 6, "qpn")?).unwrap_or(u32::MAX)),
            psn: Psn::new(u32::try_from(field(3, 6, "psn")?).unwrap_or(u32::MAX)),
            rkey: RKey::new(u32::try_from(field(4, 8, "rkey")?).unwrap_or(u32::MAX)),
            vaddr: field(5, 16, "vaddr")?,
            gid: Gid(gid),
            srqn: u32::try_from(field(22, 8, "srqn")?).unwrap_or(u32::MAX),
        })
    }
}

/// The "sys data" words (`check_sys_data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SysData {
    /// Buffer cycle size (the page size, 4096).
    pub(crate) cycle_buffer: u32,
    /// Cache line size (64).
    pub(crate) cache_line_size: u32,
}

impl Default for SysData {
    fn default() -> Self {
        Self {
            cycle_buffer: DEFAULT_CYCLE_BUFFER,
            cache_line_size: DEFAULT_CACHE_LINE,
        }
    }
}

/// A BW test's results (`struct bw_report_data`, the fields that cross the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct BwReport {
    /// Message size in bytes.
    pub(crate) size: u64,
    /// Iterations.
    pub(crate) iters: u64,
    /// Peak bandwidth, MB/s.
    pub(crate) bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub(crate) bw_avg: f64,
    /// Average message rate, Mpps.
    pub(crate) msg_rate_avg: f64,
}

/// The perftest tools rocectl mirrors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tool {
    /// `ib_send_bw`.
    SendBw,
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_atomic_bw`.
    AtomicBw,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_read_lat`.
    ReadLat,
}

/// One step of a tool's exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// [`PerftestConn::exchange_versions`].
    Versions,
    /// [`PerftestConn::exchange_sys_data`].
    SysData,
    /// [`PerftestConn::exchange_mtu`].
    Mtu,
    /// [`PerftestConn::hand_shake`].
    HandShake,
    /// The RDMA traffic (no TCP); a BW server just proceeds to the next barrier.
    Traffic,
    /// [`PerftestConn::exchange_bw_report`].
    BwReport,
    /// [`PerftestConn::close`]: hand shake and `done`.
    Close,
}

impl Tool {
    /// All tools.
    pub(crate) const ALL: [Self; 7] = [
        Self::SendBw,
        Self::WriteBw,
        Self::ReadBw,
        Self::AtomicBw,
        Self::SendLat,
        Self::WriteLat,
        Self::ReadLat,
    ];

    /// The stock binary's name.
    pub(crate) const fn stock_name(self) -> &'static str {
        match self {
            Self::SendBw => "ib_send_bw",
            Self::WriteBw => "ib_write_bw",
            Self::ReadBw => "ib_read_bw",
            Self::AtomicBw => "ib_atomic_bw",
            Self::SendLat => "ib_send_lat",
            Self::WriteLat => "ib_write_lat",
            Self::ReadLat => "ib_read_lat",
        }
    }

    /// The exchange, in order, for 1 QP and default options (same for client and server).
    /// A tool whose plan does not end in [`Step::Close`] just closes the socket.
    pub(crate) const fn plan(self) -> &'static [Step] {
        use Step::{BwReport, Close, HandShake as Hs, Mtu, SysData, Traffic, Versions};
        match self {
            Self::SendBw => &[Versions, SysData, Mtu, Hs, Hs, Hs, Hs, Traffic, Close],
            Self::WriteBw | Self::ReadBw | Self::AtomicBw => &[
                Versions, SysData, Mtu, Hs, Hs, Hs, Traffic, Hs, BwReport, Close,
            ],
            Self::SendLat | Self::ReadLat => {
                &[Versions, SysData, Mtu, Hs, Hs, Hs, Hs, Traffic, Close]
            }
            Self::WriteLat => &[Versions, SysData, Mtu, Hs, Hs, Hs, Hs, Traffic],
        }
    }

    /// The exchange for 1 QP and `sizes` message sizes: 1, or with `-a` [`RC_ALL_SIZES`]
    /// (UD: [`ud_all_sizes`]). [`Step::Traffic`] appears once per size; `plan_for(1)` is
    /// [`Self::plan`]. Checked against the lab's `-a` captures
    /// (`conformance/lab/captures/perftest-options/`).
    pub(crate) fn plan_for(self, sizes: usize) -> Vec<Step> {
        use Step::{BwReport, Close, HandShake as Hs, Mtu, SysData, Traffic, Versions};
        let sizes = sizes.max(1);
        let mut plan = vec![Versions, SysData, Mtu];
        match self {
            Self::SendBw => {
                plan.extend([Hs, Hs, Hs]);
                for _ in 0..sizes {
                    plan.extend([Hs, Traffic]);
                    if sizes > 1 {
                        plan.push(Hs);
                    }
                }
                plan.push(Close);
            }
            Self::WriteBw | Self::ReadBw | Self::AtomicBw => {
                plan.extend([Hs, Hs, Hs]);
                plan.extend(std::iter::repeat_n(Traffic, sizes));
                plan.extend([Hs, BwReport, Close]);
            }
            Self::SendLat => {
                plan.extend([Hs, Hs, Hs]);
                for _ in 0..sizes {
                    plan.extend([Hs, Traffic]);
                }
                plan.push(Close);
            }
            Self::ReadLat | Self::WriteLat => {
                plan.extend([Hs, Hs, Hs, Hs]);
                plan.extend(std::iter::repeat_n(Traffic, sizes));
                if self == Self::ReadLat {
                    plan.push(Close);
                }
            }
        }
        plan
    }
}

/// Message sizes of `-a` on RC and UC: 2^1 ..= 2^23 bytes.
pub(crate) const RC_ALL_SIZES: usize = 23;

/// Message sizes of `-a` on UD: 2^1 up to the path MTU (10 at MTU 1024), as
/// `size_max_pow = log2(MTU) + 1` in `send_bw.c`.
pub(crate) fn ud_all_sizes(mtu_bytes: u32) -> usize {
    mtu_bytes.max(2).ilog2() as usize
}

/// One side of a perftest exchange over an established TCP connection.
#[derive(Debug)]
pub(crate) struct PerftestConn {
    stream: TcpStream,
    role: Role,
    timeout: Timeout,
    remote_version: Option<f64>,
    /// When a server last wrote its half of an exchange: the moment it let the client go.
    released_at: Option<std::time::Instant>,
}

impl PerftestConn {
    /// Connects to a perftest server (retrying while refused, until `timeout`).
    ///
    /// # Errors
    /// [`OobError::Connect`].
    pub(crate) fn connect(addr: impl ToSocketAddrs, timeout: Timeout) -> Result<Self, OobError> {
        let stream = super::connect(addr, timeout)?;
        Ok(Self::new(stream, Role::Client, timeout))
    }

    /// Accepts one perftest client within `accept_timeout`; later steps use `timeout`.
    ///
    /// # Errors
    /// [`OobError::Timeout`] when nobody connects.
    pub(crate) fn accept(
        listener: &TcpListener,
        accept_timeout: Timeout,
        timeout: Timeout,
    ) -> Result<Self, OobError> {
        let (stream, _) = super::accept(listener, accept_timeout)?;
        Ok(Self::new(stream, Role::Server, timeout))
    }

    /// Wraps a connected stream.
    pub(crate) fn new(stream: TcpStream, role: Role, timeout: Timeout) -> Self {
        Self {
            stream,
            role,
            timeout,
            remote_version: None,
            released_at: None,
        }
    }

    /// Our side.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// Changes the timeout of the following steps (a BW server waits for the whole test at
    /// its first barrier after traffic).
    pub(crate) fn set_timeout(&mut self, timeout: Timeout) {
        self.timeout = timeout;
    }

    /// The peer's version as a number, once exchanged.
    pub(crate) fn remote_version(&self) -> Option<f64> {
        self.remote_version
    }

    /// One symmetric exchange: the client writes `mine` then reads, the server the reverse.
    ///
    /// # Errors
    /// Timeout, closed connection, socket errors.
    pub(crate) fn xchg(
        &mut self,
        mine: &[u8],
        theirs: &mut [u8],
        step: &'static str,
    ) -> Result<(), OobError> {
        match self.role {
            Role::Client => {
                write_msg(&mut self.stream, mine, self.timeout, step)?;
                read_exact(&mut self.stream, theirs, self.timeout, step)
            }
            Role::Server => {
                read_exact(&mut self.stream, theirs, self.timeout, step)?;
                // The client goes on as soon as it reads this: a server's timer that starts
                // here covers the client's whole transfer, however late the server polls.
                self.released_at = Some(std::time::Instant::now());
                write_msg(&mut self.stream, mine, self.timeout, step)
            }
        }
    }

    /// When this server last let the client go (wrote its half of an exchange); `None` for a
    /// client or before any exchange.
    pub(crate) fn released_at(&self) -> Option<std::time::Instant> {
        self.released_at
    }

    /// Versions: 16 bytes each way. Returns the peer's version string.
    ///
    /// # Errors
    /// [`OobError::Unsupported`] for a peer older than 5.33 or one whose message is not a
    /// version; I/O errors.
    pub(crate) fn exchange_versions(&mut self) -> Result<String, OobError> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&mine, &mut theirs, "the peer's perftest version")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        let text = String::from_utf8_lossy(&theirs[..end]).into_owned();
        let Some(number) = version_number(&text) else {
            return Err(OobError::Malformed {
                what: "perftest version",
                detail: format!("expected a version like \"6.06\", got {}", quote(&theirs)),
            });
        };
        if number < 5.33 {
            return Err(OobError::Unsupported {
                peer: format!("perftest {text}"),
                why: "versions before 5.33 use other message sizes; 6.06 is the reference",
            });
        }
        self.remote_version = Some(number);
        Ok(text)
    }

    /// Sys data: two 4-byte big-endian words each way. Returns the peer's; the test then
    /// uses the larger of each (`check_sys_data`).
    ///
    /// # Errors
    /// I/O errors.
    pub(crate) fn exchange_sys_data(&mut self, mine: SysData) -> Result<SysData, OobError> {
        let mut cycle = [0u8; 4];
        self.xchg(
            &mine.cycle_buffer.to_be_bytes(),
            &mut cycle,
            "the peer's cycle buffer size",
        )?;
        let mut line = [0u8; 4];
        self.xchg(
            &mine.cache_line_size.to_be_bytes(),
            &mut line,
            "the peer's cache line size",
        )?;
        Ok(SysData {
            cycle_buffer: u32::from_be_bytes(cycle),
            cache_line_size: u32::from_be_bytes(line),
        })
    }

    /// MTU: our `ibv_mtu` enum (1 = 256 … 5 = 4096) as `"%d"` in 2 bytes each way. Returns
    /// the MTU both sides then use, as `check_mtu` decides: the peer's if it is valid and
    /// smaller than ours, else ours.
    ///
    /// # Errors
    /// [`OobError::Malformed`] for an MTU enum we cannot send; I/O errors.
    pub(crate) fn exchange_mtu(&mut self, local_enum: u8) -> Result<u8, OobError> {
        if !(1..=5).contains(&local_enum) {
            return Err(OobError::Malformed {
                what: "our MTU",
                detail: format!("{local_enum} is not an ibv_mtu value (1..=5)"),
            });
        }
        let mine = [b'0' + local_enum, 0];
        let mut theirs = [0u8; 2];
        self.xchg(&mine, &mut theirs, "the peer's MTU")?;
        let remote = theirs
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0u32, |acc, b| acc * 10 + u32::from(b - b'0'));
        Ok(match u8::try_from(remote) {
            Ok(r) if (1..=5).contains(&r) && r < local_enum => r,
            _ => local_enum,
        })
    }

    /// A hand shake: one key record each way. Returns the peer's.
    ///
    /// # Errors
    /// Timeout, closed connection, malformed record.
    pub(crate) fn hand_shake(&mut self, mine: &PerftestDest) -> Result<PerftestDest, OobError> {
        let mut theirs = [0u8; KEY_RECORD_LEN];
        self.xchg(
            &mine.to_record(),
            &mut theirs,
            "the peer's key record (hand shake)",
        )?;
        PerftestDest::parse(&theirs)
    }

    /// The BW report: five words each way, one exchange per word (`xchg_bw_reports`).
    /// Returns the peer's.
    ///
    /// # Errors
    /// Timeout, closed connection.
    pub(crate) fn exchange_bw_report(&mut self, mine: &BwReport) -> Result<BwReport, OobError> {
        let mut word = [0u8; 8];
        self.xchg(
            &mine.size.to_be_bytes(),
            &mut word,
            "the peer's BW report (size)",
        )?;
        let size = u64::from_be_bytes(word);
        // 8 bytes since perftest 5.33; older peers are refused by exchange_versions.
        self.xchg(
            &mine.iters.to_be_bytes(),
            &mut word,
            "the peer's BW report (iterations)",
        )?;
        let iters = u64::from_be_bytes(word);
        let mut double = |mine: f64, step: &'static str| -> Result<f64, OobError> {
            let mut w = [0u8; 8];
            self.xchg(&mine.to_be_bytes(), &mut w, step)?;
            Ok(f64::from_be_bytes(w))
        };
        let bw_peak = double(mine.bw_peak, "the peer's BW report (peak)")?;
        let bw_avg = double(mine.bw_avg, "the peer's BW report (average)")?;
        let msg_rate_avg = double(mine.msg_rate_avg, "the peer's BW report (message rate)")?;
        Ok(BwReport {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate_avg,
        })
    }

    /// `ctx_close_connection`: a last hand shake, then `done`; reads the peer's `done` if it
    /// comes within a moment (so the socket closes without a reset), then closes.
    ///
    /// # Errors
    /// The hand shake failed, or `done` could not be written.
    pub(crate) fn close(mut self, mine: &PerftestDest) -> Result<(), OobError> {
        let mut st = Setup::new(1);
        self.run_step(Step::Close, mine, &BwReport::default(), &mut st)
    }

    /// Runs `tool`'s plan up to and including the first hand shake: versions, sys data, MTU
    /// and the key records. Returns the peer's key record and the negotiated MTU enum.
    ///
    /// Connect the QP (RTR, RTS) right after this, as the stock tools do (`ctx_connect`
    /// between the first and the second hand shake), post the receives a SEND test needs,
    /// then call [`Self::sync_before_traffic`]: once that returns the peer may send at once.
    ///
    /// # Errors
    /// Any step's.
    pub(crate) fn exchange_keys(
        &mut self,
        tool: Tool,
        mine: &PerftestDest,
        mtu_enum: u8,
    ) -> Result<Setup, OobError> {
        let mut st = Setup::new(mtu_enum);
        for step in tool.plan() {
            if *step == Step::Traffic {
                break;
            }
            self.run_step(*step, mine, &BwReport::default(), &mut st)?;
            if *step == Step::HandShake {
                break;
            }
        }
        Ok(st)
    }

    /// The barriers between the first hand shake and the traffic (the rest of the hand
    /// shakes before [`Step::Traffic`]).
    ///
    /// # Errors
    /// Any hand shake's.
    pub(crate) fn sync_before_traffic(
        &mut self,
        tool: Tool,
        mine: &PerftestDest,
    ) -> Result<(), OobError> {
        let plan = tool.plan();
        let first = plan.iter().position(|s| *s == Step::HandShake);
        let traffic = plan.iter().position(|s| *s == Step::Traffic);
        if let (Some(first), Some(traffic)) = (first, traffic) {
            for _ in plan[first + 1..traffic]
                .iter()
                .filter(|s| **s == Step::HandShake)
            {
                self.hand_shake(mine)?;
            }
        }
        Ok(())
    }

    /// Runs the TCP part of `tool`'s plan after [`Step::Traffic`]. `report` is what a BW
    /// client sends; returns the peer's BW report if the plan has one.
    ///
    /// # Errors
    /// Any step's.
    pub(crate) fn finish(
        mut self,
        tool: Tool,
        mine: &PerftestDest,
        report: &BwReport,
    ) -> Result<Option<BwReport>, OobError> {
        let plan = tool.plan();
        let after = plan
            .iter()
            .position(|s| *s == Step::Traffic)
            .map_or(plan.len(), |i| i + 1);
        let mut st = Setup::new(1);
        for step in &plan[after..] {
            self.run_step(*step, mine, report, &mut st)?;
        }
        Ok(st.peer_report)
    }

    /// Runs one step of a plan ([`Tool::plan_for`] for `-a`): the caller walks the plan,
    /// connects its QP after the first [`Step::HandShake`] and runs one size's traffic at
    /// each [`Step::Traffic`] (a no-op here). `report` is what [`Step::BwReport`] sends.
    /// [`Step::Close`] ends the exchange (hand shake, `done`); the socket closes on drop.
    ///
    /// # Errors
    /// The step's.
    pub(crate) fn run_step(
        &mut self,
        step: Step,
        mine: &PerftestDest,
        report: &BwReport,
        st: &mut Setup,
    ) -> Result<(), OobError> {
        match step {
            Step::Versions => st.peer_version = self.exchange_versions()?,
            Step::SysData => st.peer_sys = self.exchange_sys_data(SysData::default())?,
            Step::Mtu => st.mtu_enum = self.exchange_mtu(st.mtu_enum)?,
            Step::HandShake => st.peer = self.hand_shake(mine)?,
            Step::Traffic => {}
            Step::BwReport => st.peer_report = Some(self.exchange_bw_report(report)?),
            Step::Close => {
                self.hand_shake(mine)?;
                write_msg(&mut self.stream, DONE, self.timeout, "send done")?;
                drain_done(&mut self.stream, Duration::from_millis(500));
            }
        }
        Ok(())
    }

    /// The underlying stream.
    pub(crate) fn into_inner(self) -> TcpStream {
        self.stream
    }
}

/// What the exchange learned ([`PerftestConn::exchange_keys`], [`PerftestConn::run_step`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Setup {
    /// The peer's key record (its last hand shake).
    pub(crate) peer: PerftestDest,
    /// Our MTU enum before [`Step::Mtu`], the one both sides use after it.
    pub(crate) mtu_enum: u8,
    /// The peer's version string.
    pub(crate) peer_version: String,
    /// The peer's sys data.
    pub(crate) peer_sys: SysData,
    /// The peer's BW report, after [`Step::BwReport`].
    pub(crate) peer_report: Option<BwReport>,
}

impl Setup {
    /// Nothing learned yet; `mtu_enum` is ours (1 = 256 … 5 = 4096).
    pub(crate) fn new(mtu_enum: u8) -> Self {
        Self {
            peer: PerftestDest::default(),
            mtu_enum,
            peer_version: String::new(),
            peer_sys: SysData::default(),
            peer_report: None,
        }
    }
}

/// `atof` of a version string: the leading `digits[.digits]`.
pub(crate) fn version_number(text: &str) -> Option<f64> {
    let mut end = 0;
    let mut dot = false;
    for (i, c) in text.char_indices() {
        match c {
            '0'..='9' => end = i + 1,
            '.' if !dot => dot = true,
            _ => break,
        }
    }
    text[..end].parse().ok()
}
