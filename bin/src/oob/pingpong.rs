//! rdma-core's pingpong exchange (`ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`,
//! `ibv_srq_pingpong`).
//!
//! Source: `pp_client_exch_dest` / `pp_server_exch_dest` in
//! <https://github.com/linux-rdma/rdma-core/blob/master/libibverbs/examples/rc_pingpong.c>
//! (uc, ud: same code), `srq_pingpong.c` for the 256-record variant, and
//! `gid_to_wire_gid`/`wire_gid_to_gid` in `libibverbs/examples/pingpong.c`.
//!
//! One record is `sprintf("%04x:%06x:%06x:%s", lid, qpn, psn, gid)` sent with its NUL,
//! 52 bytes; the GID is 32 hex digits, the 16 bytes in order. Captured
//! (`shared/captures/rc_pingpong.pcap`, frame 4):
//! `0000:000011:96d2ce:00000000000000000000ffff0a4d0002\0`.
//!
//! The sequence, over one TCP connection (server when no host is given):
//!
//! | # | client (`ibv_*_pingpong HOST`)  | server (`ibv_*_pingpong`)                        |
//! |---|---------------------------------|--------------------------------------------------|
//! | 1 | writes its record(s)            | reads them, moves its QP(s) to RTR and RTS       |
//! | 2 | reads the server's record(s)    | writes its record(s)                             |
//! | 3 | writes `done\0` (5 bytes), closes | reads `done` (a single `read` that must return 5), closes |
//!
//! `ibv_srq_pingpong` sends `MAX_QP` = 256 records in each direction, one `write` per record:
//! the first `-q N` describe its QPs, the others are all-zero fields
//! (`0000:000000:000000:000…0\0`, not zero bytes), and reads with a loop. The others send
//! exactly one record with one `write` and read it with one `read` of 52 bytes, so a record
//! must arrive in one piece: [`PingpongConn`] writes each record with a single call.

use std::net::TcpStream;

use roce_wire::{Gid, Psn, Qpn};

use super::{quote, read_exact, write_msg, OobError, Timeout, DONE};

/// Length of one record, NUL included.
pub(crate) const RECORD_LEN: usize = 52;

/// Records per direction in `ibv_srq_pingpong` (its `MAX_QP`).
pub(crate) const SRQ_RECORDS: usize = 256;

/// One side's address: what a pingpong record carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PingpongDest {
    /// LID; 0 on RoCE.
    pub(crate) lid: u16,
    /// QP number.
    pub(crate) qpn: Qpn,
    /// First PSN the QP sends.
    pub(crate) psn: Psn,
    /// GID (all zero when the tool runs without `-g`).
    pub(crate) gid: Gid,
}

impl PingpongDest {
    /// The 52-byte record.
    pub(crate) fn to_record(self) -> [u8; RECORD_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid.to_hex()
        );
        let mut out = [0u8; RECORD_LEN];
        out[..RECORD_LEN - 1].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a 52-byte record, strictly: 4, 6, 6 and 32 hex digits separated by `:`, then a
    /// NUL.
    ///
    /// # Errors
    /// [`OobError::Malformed`] quoting the bytes.
    pub(crate) fn parse(record: &[u8]) -> Result<Self, OobError> {
        let bad = |why: &str| OobError::Malformed {
            what: "pingpong address (LID:QPN:PSN:GID)",
            detail: format!("{why}, got {}", quote(record)),
        };
        if record.len() != RECORD_LEN {
            return Err(bad("expected 52 bytes"));
        }
        if record[RECORD_LEN - 1] != 0 {
            return Err(bad("expected a NUL at byte 52"));
        }
        let text = std::str::from_utf8(&record[..RECORD_LEN - 1])
            .map_err(|_| bad("expected ASCII text"))?;
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(bad("expected 4 fields separated by ':'"));
        };
        let field = |s: &str, width: usize, name: &str| {
            super::hex_field(s, width)
                .ok_or_else(|| bad(&format!("{name}: expected {width} hex digits")))
        };
        let lid = field(lid, 4, "LID")?;
        let qpn = field(qpn, 6, "QPN")?;
        let psn = field(psn, 6, "PSN")?;
        let gid = Gid::from_hex(gid).map_err(|_| bad("GID: expected 32 hex digits"))?;
        Ok(Self {
            // The widths checked above bound every value.
            lid: u16::try_from(lid).unwrap_or(u16::MAX),
            qpn: Qpn::new(u32::try_from(qpn).unwrap_or(u32::MAX)),
            psn: Psn::new(u32::try_from(psn).unwrap_or(u32::MAX)),
            gid,
        })
    }
}

/// How many records go each way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One record (rc, uc, ud).
    Single,
    /// 256 records, the first ones filled (srq).
    Srq,
}

impl Layout {
    /// Records per direction.
    pub(crate) const fn records(self) -> usize {
        match self {
            Self::Single => 1,
            Self::Srq => SRQ_RECORDS,
        }
    }
}

/// Encodes `dests` as the records of `layout`, padding with all-zero records.
///
/// # Panics
/// More destinations than the layout has records (a caller bug: `-q` is checked first).
pub(crate) fn encode(dests: &[PingpongDest], layout: Layout) -> Vec<u8> {
    assert!(
        dests.len() <= layout.records(),
        "{} destinations do not fit {} records",
        dests.len(),
        layout.records()
    );
    let zero = PingpongDest::default();
    (0..layout.records())
        .flat_map(|i| dests.get(i).unwrap_or(&zero).to_record())
        .collect()
}

/// Decodes the records of `layout` (all of them, padding included).
///
/// # Errors
/// A malformed record, or the wrong length.
pub(crate) fn decode(bytes: &[u8], layout: Layout) -> Result<Vec<PingpongDest>, OobError> {
    if bytes.len() != layout.records() * RECORD_LEN {
        return Err(OobError::Malformed {
            what: "pingpong address records",
            detail: format!(
                "expected {} bytes, got {}",
                layout.records() * RECORD_LEN,
                bytes.len()
            ),
        });
    }
    bytes.chunks(RECORD_LEN).map(PingpongDest::parse).collect()
}

/// One side of a pingpong exchange over an established TCP connection.
#[derive(Debug)]
pub(crate) struct PingpongConn {
    stream: TcpStream,
    layout: Layout,
    timeout: Timeout,
}

impl PingpongConn {
    /// Wraps a connected stream (from [`super::connect`] or [`super::accept`]).
    pub(crate) fn new(stream: TcpStream, layout: Layout, timeout: Timeout) -> Self {
        Self {
            stream,
            layout,
            timeout,
        }
    }

    /// The client's whole exchange: writes `mine`, reads the server's records, writes
    /// `done`. Returns every record the server sent (srq: 256, the first `-q` meaningful).
    ///
    /// # Errors
    /// Timeout, closed connection, malformed record.
    pub(crate) fn client_exchange(
        &mut self,
        mine: &[PingpongDest],
    ) -> Result<Vec<PingpongDest>, OobError> {
        self.write_records(mine, "send our address")?;
        let theirs = self.read_records("the server's address")?;
        write_msg(&mut self.stream, DONE, self.timeout, "send done")?;
        Ok(theirs)
    }

    /// Server, step 1: reads the client's records. Connect the QP(s) (RTR, RTS) before
    /// [`Self::server_reply`], as the stock server does.
    ///
    /// # Errors
    /// Timeout, closed connection, malformed record.
    pub(crate) fn server_read(&mut self) -> Result<Vec<PingpongDest>, OobError> {
        self.read_records("the client's address")
    }

    /// Server, step 2: writes `mine` and waits for the client's `done`.
    ///
    /// # Errors
    /// Timeout, closed connection, or something other than `done`.
    pub(crate) fn server_reply(&mut self, mine: &[PingpongDest]) -> Result<(), OobError> {
        self.write_records(mine, "send our address")?;
        let mut done = [0u8; 5];
        read_exact(
            &mut self.stream,
            &mut done,
            self.timeout,
            "the client's done",
        )?;
        if &done != DONE {
            return Err(OobError::Malformed {
                what: "end of exchange",
                detail: format!("expected \"done\\0\", got {}", quote(&done)),
            });
        }
        Ok(())
    }

    /// The underlying stream.
    pub(crate) fn into_inner(self) -> TcpStream {
        self.stream
    }

    fn write_records(&mut self, mine: &[PingpongDest], step: &'static str) -> Result<(), OobError> {
        if mine.len() > self.layout.records() {
            return Err(OobError::Malformed {
                what: "our own addresses",
                detail: format!(
                    "{} QPs do not fit the {} records of the exchange",
                    mine.len(),
                    self.layout.records()
                ),
            });
        }
        let zero = PingpongDest::default();
        for i in 0..self.layout.records() {
            let record = mine.get(i).unwrap_or(&zero).to_record();
            write_msg(&mut self.stream, &record, self.timeout, step)?;
        }
        Ok(())
    }

    fn read_records(&mut self, step: &'static str) -> Result<Vec<PingpongDest>, OobError> {
        let mut buf = vec![0u8; self.layout.records() * RECORD_LEN];
        read_exact(&mut self.stream, &mut buf, self.timeout, step)?;
        decode(&buf, self.layout)
    }
}
