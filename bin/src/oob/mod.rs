//! The out-of-band exchanges of the stock RDMA tools, byte for byte.
//!
//! Before the first RoCE packet, the stock tools swap queue pair addresses over a plain TCP
//! connection (port 18515 by default), and the perftest tools keep using it to synchronise:
//!
//! - [`pingpong`]: rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong` and
//!   `ibv_srq_pingpong` (52-byte `LID:QPN:PSN:GID` records, 256 of them for srq);
//! - [`perftest`]: perftest 6.06's `ib_{send,write,read,atomic}_{bw,lat}` (version string,
//!   sizing words, MTU, 108-byte key records, BW result words, `done`).
//!
//! The formats were read in the tools' sources and checked against the payloads of the real
//! exchanges in `shared/captures/*.pcap` (Linux rdma_rxe, rdma-core 44, perftest 6.06); the
//! tests in `bin/tests/oob_*.rs` replay those payloads.
//!
//! Every read and write is bounded by a [`Timeout`]: a peer that stops answering gives
//! [`OobError::Timeout`] ("peer did not answer the exchange within 10s ..."), never a hang.
//! Each message is written with a single `write` on a `TCP_NODELAY` socket, because the stock
//! tools read most messages with a single `read(2)` and treat a short read as an error.

// The tools that use this module land with the transport API (issue 6): until then parts of
// it are only exercised by the tests in bin/tests/oob_*.rs.
#![allow(dead_code)]

pub(crate) mod perftest;
pub(crate) mod pingpong;
#[cfg(test)]
pub(crate) mod testing;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The TCP port both tool families use by default (`-p`).
pub(crate) const DEFAULT_PORT: u16 = 18_515;

/// The 5-byte message that ends both exchanges: `"done"` and its NUL.
pub(crate) const DONE: &[u8; 5] = b"done\0";

/// How long to wait for the peer: at most a duration, or for ever (what the stock tools do,
/// useful for a server whose client runs a long test before the next synchronisation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timeout {
    /// Give up after this long.
    After(Duration),
    /// Wait for ever.
    Never,
}

impl Timeout {
    /// `After(secs)`.
    pub(crate) const fn secs(secs: u64) -> Self {
        Self::After(Duration::from_secs(secs))
    }

    fn deadline(self) -> Option<Instant> {
        match self {
            Self::After(d) => Some(Instant::now() + d),
            Self::Never => None,
        }
    }

    fn describe(self) -> String {
        match self {
            Self::After(d) => format_duration(d),
            Self::Never => "ever".to_owned(),
        }
    }
}

/// Why an out-of-band exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OobError {
    /// The peer sent nothing (or not enough) in time.
    #[error("peer did not answer the exchange within {waited} (waiting for {step})")]
    Timeout {
        /// What we were waiting for.
        step: &'static str,
        /// How long we waited, e.g. `10s`.
        waited: String,
    },
    /// The peer closed the connection in the middle of the exchange.
    #[error(
        "peer closed the connection while we waited for {step} ({got} of {expected} bytes \
         received)"
    )]
    Closed {
        /// What we were waiting for.
        step: &'static str,
        /// Bytes received of the message.
        got: usize,
        /// Size of the message.
        expected: usize,
    },
    /// The peer sent something that is not the expected record.
    #[error("malformed record: {what}: {detail}")]
    Malformed {
        /// Which record.
        what: &'static str,
        /// What was wrong, quoting the bytes.
        detail: String,
    },
    /// Nothing listened at the address, or the network said no.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Where we tried.
        addr: String,
        /// The last error.
        source: io::Error,
    },
    /// The peer speaks a protocol version we cannot follow.
    #[error("peer speaks {peer}, which this implementation does not support ({why})")]
    Unsupported {
        /// What the peer sent.
        peer: String,
        /// Why it is not supported.
        why: &'static str,
    },
    /// Any other socket error.
    #[error("{step}: {source}")]
    Io {
        /// What we were doing.
        step: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl OobError {
    fn io(step: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { step, source }
    }
}

/// Connects to a server, retrying while it refuses (not listening yet) until `timeout`.
/// The stock clients try once; retrying lets a test start both sides at once.
///
/// # Errors
/// [`OobError::Connect`] with the last error once the time is up, at once for errors other
/// than "connection refused" and "timed out".
pub(crate) fn connect(addr: impl ToSocketAddrs, timeout: Timeout) -> Result<TcpStream, OobError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(OobError::io("resolve the server address"))?
        .collect();
    let name = addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let deadline = timeout.deadline();
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for a in &addrs {
            let attempt = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    TcpStream::connect_timeout(a, left.max(Duration::from_millis(10)))
                }
                None => TcpStream::connect(a),
            };
            match attempt {
                Ok(s) => {
                    s.set_nodelay(true)
                        .map_err(OobError::io("set TCP_NODELAY"))?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        let retry = matches!(
            last.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
        );
        let expired = deadline.is_some_and(|d| Instant::now() >= d);
        if !retry || expired {
            return Err(OobError::Connect {
                addr: name,
                source: last,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepts one client, waiting at most `timeout`.
///
/// # Errors
/// [`OobError::Timeout`] when nobody connects in time; socket errors.
pub(crate) fn accept(
    listener: &TcpListener,
    timeout: Timeout,
) -> Result<(TcpStream, SocketAddr), OobError> {
    let step = "a client to connect";
    let (stream, peer) = match timeout.deadline() {
        None => listener.accept().map_err(OobError::io(step))?,
        Some(deadline) => {
            listener
                .set_nonblocking(true)
                .map_err(OobError::io("make the listener non-blocking"))?;
            let got = loop {
                match listener.accept() {
                    Ok(pair) => break Ok(pair),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            break Err(OobError::Timeout {
                                step,
                                waited: timeout.describe(),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(OobError::Io { step, source: e }),
                }
            };
            listener
                .set_nonblocking(false)
                .map_err(OobError::io("make the listener blocking"))?;
            got?
        }
    };
    stream
        .set_nonblocking(false)
        .map_err(OobError::io("make the connection blocking"))?;
    stream
        .set_nodelay(true)
        .map_err(OobError::io("set TCP_NODELAY"))?;
    Ok((stream, peer))
}

/// Reads exactly `buf.len()` bytes within `timeout`.
fn read_exact(
    stream: &mut TcpStream,
    buf: &mut [u8],
    timeout: Timeout,
    step: &'static str,
) -> Result<(), OobError> {
    let deadline = timeout.deadline();
    let mut got = 0;
    while got < buf.len() {
        let left = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(OobError::Timeout {
                        step,
                        waited: timeout.describe(),
                    });
                }
                Some(left)
            }
            None => None,
        };
        stream
            .set_read_timeout(left)
            .map_err(OobError::io("set the read timeout"))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(OobError::Closed {
                    step,
                    got,
                    expected: buf.len(),
                })
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(OobError::Timeout {
                    step,
                    waited: timeout.describe(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(OobError::Io { step, source: e }),
        }
    }
    Ok(())
}

/// Writes one whole message (one `write` call for anything that fits the socket buffer).
fn write_msg(
    stream: &mut TcpStream,
    msg: &[u8],
    timeout: Timeout,
    step: &'static str,
) -> Result<(), OobError> {
    let limit = match timeout {
        Timeout::After(d) => Some(d.max(Duration::from_millis(1))),
        Timeout::Never => None,
    };
    stream
        .set_write_timeout(limit)
        .map_err(OobError::io("set the write timeout"))?;
    stream.write_all(msg).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => OobError::Timeout {
            step,
            waited: timeout.describe(),
        },
        _ => OobError::Io { step, source: e },
    })
}

/// Reads the peer's `done\0` if it arrives within `timeout`; its absence is not an error
/// (perftest writes `done` and closes without reading).
fn drain_done(stream: &mut TcpStream, timeout: Duration) {
    let mut buf = [0u8; DONE.len()];
    let _ = read_exact(stream, &mut buf, Timeout::After(timeout), "done");
}

/// Printable form of received bytes for error messages: text as is, other bytes escaped.
fn quote(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(120)];
    let mut s: String = shown.escape_ascii().to_string();
    if bytes.len() > shown.len() {
        s.push_str("...");
    }
    format!("\"{s}\" ({} bytes)", bytes.len())
}

fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Parses exactly `width` lowercase or uppercase hex digits.
fn hex_field(text: &str, width: usize) -> Option<u64> {
    if text.len() != width || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}
