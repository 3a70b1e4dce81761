//! A hostile RoCEv2 peer: a plain UDP socket that forges transport packets with correct ICRCs
//! and reads what the victim answers.
//!
//! The suite in `tests/hostile.rs` connects an RC QP of a rocectl device to a [`HostilePeer`]
//! (it knows the QPN, PSN and rkeys it agreed on), injects malformed or malicious requests
//! built with [`Request`], and compares the [`Answer`]s on the wire with what Linux rdma_rxe
//! answers (`rxe_resp.c`).
//!
//! # The ICRC of a forged packet
//!
//! The ICRC covers the IPv4 header, which a UDP socket does not write. [`seal`] computes it
//! for the header Linux writes for an *unconnected* UDP socket with `IP_PMTUDISC_DO`:
//! Identification 0 (`ip_select_ident_segs()`), DF, no options. The peer's socket is made the
//! way our `udp` datapath makes its own (it is one), so the rule is the one that datapath's
//! wire test checks (`transport/tests/udp_ident.rs`).
//! TOS, TTL and the checksums are masked out of the ICRC.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use roce_transport::datapath::udp::{UdpDatapath, UdpOptions};

use roce_wire::aeth::Syndrome;
use roce_wire::frame::{FrameRepr, IpRepr, Ipv4Repr, UdpRepr, ROCEV2_PORT};
use roce_wire::icrc::{Icrc, ICRC_LEN};
use roce_wire::{atomic_eth, bth, reth, Ext, Msn, Opcode, PKey, PacketRepr, Psn, Qpn, RKey};

/// Length of an IPv4 header without options.
const IPV4_HEADER: usize = 20;
/// Length of a UDP header.
const UDP_HEADER: usize = 8;

/// Appends the ICRC to `body` (BTH .. pad) for a datagram from `src` to `dst` carried in an
/// IPv4 header with Identification 0 and DF (see the [module docs](self)), and returns the
/// UDP payload to send. `body` may have any length of at least a BTH (12 bytes); a shorter
/// body gets a zero ICRC (such a datagram cannot carry a valid one).
pub fn seal(body: &[u8], src: SocketAddrV4, dst: SocketAddrV4) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + ICRC_LEN);
    out.extend_from_slice(body);
    out.extend_from_slice(&icrc_for(body, src, dst).unwrap_or([0; ICRC_LEN]));
    out
}

/// The ICRC of `body` (BTH .. pad) sent from `src` to `dst` (IPv4 Identification 0, DF), or
/// `None` if `body` is shorter than a BTH.
pub fn icrc_for(body: &[u8], src: SocketAddrV4, dst: SocketAddrV4) -> Option<[u8; ICRC_LEN]> {
    icrc_for_ident(body, src, dst, 0)
}

/// As [`icrc_for`], for an IPv4 header with Identification `ident`.
pub fn icrc_for_ident(
    body: &[u8],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
) -> Option<[u8; ICRC_LEN]> {
    if body.len() < bth::HEADER_LEN {
        return None;
    }
    let frame = FrameRepr {
        eth: None,
        ip: IpRepr::V4(Ipv4Repr {
            src: *src.ip(),
            dst: *dst.ip(),
            tos: 0,
            ident,
            dont_fragment: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            checksum: 0,
        },
    };
    let mut headers = [0u8; IPV4_HEADER + UDP_HEADER];
    frame.emit_headers(body.len() + ICRC_LEN, &mut headers);
    let mut icrc = Icrc::start(
        &headers[..IPV4_HEADER],
        &headers[IPV4_HEADER..],
        &body[..bth::HEADER_LEN],
    )?;
    icrc.update(&body[bth::HEADER_LEN..]);
    Some(icrc.finish())
}

/// A request packet to forge: a BTH, extension headers and a payload, with hooks to break
/// the fields a well-behaved requester would get right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The BTH. [`Request::body`] writes its `pad_cnt` as given, so set it with
    /// [`Request::pad_cnt`] to lie about the pad; the constructors compute the right one.
    pub bth: bth::Repr,
    /// The extension headers, written in wire order whatever the opcode says.
    pub ext: Ext,
    /// The payload.
    pub payload: Vec<u8>,
    /// Pad bytes written after the payload (normally `bth.pad_cnt`).
    pub pad_bytes: usize,
}

impl Request {
    /// A request with no extension header and no payload.
    pub fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            bth: bth::Repr::new(opcode, dest_qp, psn),
            ext: Ext::default(),
            payload: Vec::new(),
            pad_bytes: 0,
        }
    }

    /// Sets AckReq.
    pub fn ack_req(mut self) -> Self {
        self.bth.ack_req = true;
        self
    }

    /// Sets the P_Key.
    pub fn pkey(mut self, pkey: u16) -> Self {
        self.bth.pkey = PKey::new(pkey);
        self
    }

    /// Adds a RETH.
    pub fn reth(mut self, va: u64, rkey: RKey, dma_len: u32) -> Self {
        self.ext.reth = Some(reth::Repr { va, rkey, dma_len });
        self
    }

    /// Adds an AtomicETH.
    pub fn atomic(mut self, va: u64, rkey: RKey, swap_add: u64, compare: u64) -> Self {
        self.ext.atomic_eth = Some(atomic_eth::Repr {
            va,
            rkey,
            swap_add,
            compare,
        });
        self
    }

    /// Sets the payload, with the pad that aligns it to 4 (PadCnt and pad bytes).
    pub fn payload(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.payload = data.into();
        let pad = roce_wire::packet::pad_for(self.payload.len());
        self.bth.pad_cnt = pad;
        self.pad_bytes = usize::from(pad);
        self
    }

    /// Overrides the PadCnt field only (the bytes on the wire stay as they are).
    pub fn pad_cnt(mut self, pad_cnt: u8) -> Self {
        self.bth.pad_cnt = pad_cnt & 0x3;
        self
    }

    /// Overrides how many pad bytes follow the payload (0 makes an unaligned datagram).
    pub fn pad_bytes(mut self, n: usize) -> Self {
        self.pad_bytes = n;
        self
    }

    /// The packet without its ICRC: BTH, extension headers, payload, pad bytes.
    pub fn body(&self) -> Vec<u8> {
        // PacketRepr writes the BTH and the present extension headers in wire order; the pad
        // is ours to lie about.
        let header = PacketRepr {
            bth: self.bth,
            ext: self.ext,
            payload: &[],
        };
        let mut out = vec![0u8; header.header_len()];
        header.emit_header(&mut out);
        out.extend_from_slice(&self.payload);
        out.resize(out.len() + self.pad_bytes, 0);
        out
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(r) = self.ext.reth {
            write!(
                f,
                " RETH va={:#x} rkey={:#x} len={:#x}",
                r.va,
                r.rkey.value(),
                r.dma_len
            )?;
        }
        if let Some(a) = self.ext.atomic_eth {
            write!(f, " AtomicETH va={:#x} rkey={:#x}", a.va, a.rkey.value())?;
        }
        write!(
            f,
            " payload={} pad_bytes={}",
            self.payload.len(),
            self.pad_bytes
        )
    }
}

/// What the victim sent back: the fields a conformance assertion compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Opcode.
    pub opcode: Opcode,
    /// BTH DestQP (our QPN as the victim knows it).
    pub dest_qp: Qpn,
    /// BTH PSN.
    pub psn: Psn,
    /// AETH syndrome, if the opcode carries an AETH.
    pub syndrome: Option<Syndrome>,
    /// AETH MSN, if the opcode carries an AETH.
    pub msn: Option<Msn>,
    /// AtomicAckETH original value, for atomic acknowledgements.
    pub orig: Option<u64>,
    /// RETH, for requests (when the victim is the requester).
    pub reth: Option<reth::Repr>,
    /// Payload (READ responses).
    pub payload: Vec<u8>,
}

impl Answer {
    /// Parses a UDP payload the victim at `src` sent to `dst`, checking its ICRC for an IPv4
    /// header the victim's `udp` datapath sends with: DF, and Identification 0, or `k` for
    /// the `k`-th segment of a GSO message (at most 64 segments; the kernel numbers them so,
    /// see `transport/src/datapath/udp.rs`). A plain UDP socket does not see the
    /// Identification, so every candidate is tried.
    ///
    /// # Errors
    /// A description of what is wrong: bad ICRC, or a packet `roce_wire` rejects.
    pub fn parse(datagram: &[u8], src: SocketAddrV4, dst: SocketAddrV4) -> Result<Self, String> {
        if datagram.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(format!("{}-byte datagram", datagram.len()));
        }
        let (body, icrc) = datagram.split_at(datagram.len() - ICRC_LEN);
        if !(0..64u16).any(|id| icrc_for_ident(body, src, dst, id).as_slice() == [icrc]) {
            return Err(format!("bad ICRC on {} bytes from {src}", datagram.len()));
        }
        let p = PacketRepr::parse(datagram).map_err(|e| format!("unparsable answer: {e}"))?;
        Ok(Self {
            opcode: p.bth.opcode,
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn,
            syndrome: p.ext.aeth.map(|a| a.syndrome),
            msn: p.ext.aeth.map(|a| a.msn),
            orig: p.ext.atomic_ack_eth.map(|a| a.orig),
            reth: p.ext.reth,
            payload: p.payload.to_vec(),
        })
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} qpn={:#x} psn={:#x}",
            self.opcode,
            self.dest_qp.value(),
            self.psn.value()
        )?;
        if let (Some(s), Some(m)) = (self.syndrome, self.msn) {
            write!(f, " syndrome={:#04x} msn={}", s.as_u8(), m.value())?;
        }
        if let Some(o) = self.orig {
            write!(f, " orig={o:#x}")?;
        }
        if let Some(r) = self.reth {
            write!(
                f,
                " RETH va={:#x} rkey={:#x} len={:#x}",
                r.va,
                r.rkey.value(),
                r.dma_len
            )?;
        }
        write!(f, " payload={}", self.payload.len())
    }
}

/// The hostile peer: one UDP socket on `local`:4791, talking to the victim's 4791.
#[derive(Debug)]
pub struct HostilePeer {
    sock: UdpSocket,
    local: SocketAddrV4,
    victim: SocketAddrV4,
    sent: u64,
}

impl HostilePeer {
    /// Binds `local_ip`:4791 (call it inside the peer's network namespace) to talk to
    /// `victim_ip`:4791.
    ///
    /// # Errors
    /// The bind fails.
    pub fn bind(local_ip: Ipv4Addr, victim_ip: Ipv4Addr) -> io::Result<Self> {
        Self::bind_addr(SocketAddrV4::new(local_ip, ROCEV2_PORT), victim_ip)
    }

    /// Binds `local` (port 0: any free port) to talk to `victim_ip`:4791. The victim always
    /// answers to port 4791, so a peer on another port only sends.
    ///
    /// # Errors
    /// The bind fails.
    pub fn bind_addr(local: SocketAddrV4, victim_ip: Ipv4Addr) -> io::Result<Self> {
        // The socket of a rocectl `udp` datapath: `IP_PMTUDISC_DO`, never connected, so Linux
        // writes Identification 0 and DF into every IPv4 header (with the default
        // `IP_PMTUDISC_WANT`, Linux 6.18 numbers the datagrams of an unconnected socket, and a
        // receiver that sees the real header would find every forged ICRC wrong). No GRO (one
        // datagram per read) and no raw receive: the peer reads plain datagrams, blocking.
        let opts = UdpOptions {
            gso: false,
            gro: false,
            raw_receive: false,
            ..UdpOptions::default()
        };
        let dp = UdpDatapath::bind(SocketAddr::V4(local), opts)
            .map_err(|e| io::Error::other(format!("bind {local}: {e}")))?;
        let sock: UdpSocket = dp.socket().try_clone()?.into();
        drop(dp);
        sock.set_nonblocking(false)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bound to IPv6 {a}"),
                ))
            }
        };
        Ok(Self {
            sock,
            local,
            victim: SocketAddrV4::new(victim_ip, ROCEV2_PORT),
            sent: 0,
        })
    }

    /// Our address.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// Datagrams sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Sends `req` with a correct ICRC.
    ///
    /// # Errors
    /// The send fails.
    pub fn send(&mut self, req: &Request) -> io::Result<()> {
        self.send_body(&req.body())
    }

    /// Sends `body` (BTH .. pad, any bytes) with a correct ICRC appended.
    ///
    /// # Errors
    /// The send fails.
    pub fn send_body(&mut self, body: &[u8]) -> io::Result<()> {
        let datagram = seal(body, self.local, self.victim);
        self.sock.send_to(&datagram, self.victim)?;
        self.sent += 1;
        Ok(())
    }

    /// Waits up to `timeout` for the next datagram from the victim and parses it.
    ///
    /// # Errors
    /// A receive error, a datagram from someone else, or an answer [`Answer::parse`] rejects,
    /// as a message.
    pub fn recv(&self, timeout: Duration) -> Result<Option<Answer>, String> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 9_000];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|e| format!("set_read_timeout: {e}"))?;
            match self.sock.recv_from(&mut buf) {
                Ok((n, SocketAddr::V4(from))) if from.ip() == self.victim.ip() => {
                    return Answer::parse(&buf[..n], from, self.local).map(Some);
                }
                Ok((n, from)) => {
                    return Err(format!("{n}-byte datagram from a stranger: {from}"));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("recv: {e}")),
            }
        }
    }

    /// The victim's address.
    pub fn victim(&self) -> IpAddr {
        IpAddr::V4(*self.victim.ip())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_packets_verify_and_parse() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 3), ROCEV2_PORT);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), ROCEV2_PORT);
        let req = Request::new(Opcode::RcRdmaWriteOnly, Qpn::new(0x12), Psn::new(7))
            .ack_req()
            .reth(0x1000, RKey::new(0xABCD), 3)
            .payload(*b"abc");
        let datagram = seal(&req.body(), src, dst);
        assert_eq!(datagram.len(), 12 + 16 + 3 + 1 + 4);
        // The whole IP packet, as the kernel sends it, verifies with roce_wire's own check.
        let frame = FrameRepr {
            eth: None,
            ip: IpRepr::V4(Ipv4Repr {
                src: *src.ip(),
                dst: *dst.ip(),
                tos: 0x02,
                ident: 0,
                dont_fragment: true,
                ttl: 17,
            }),
            udp: UdpRepr {
                src_port: ROCEV2_PORT,
                dst_port: ROCEV2_PORT,
                checksum: 0x1234,
            },
        };
        let mut ip = vec![0u8; 28];
        frame.emit_headers(datagram.len(), &mut ip);
        ip.extend_from_slice(&datagram);
        assert!(roce_wire::icrc::verify(&ip));
        // A different Identification breaks it: the ICRC really covers the header we assume.
        ip[4] = 0x01;
        assert!(!roce_wire::icrc::verify(&ip));
        let parsed = PacketRepr::parse(&datagram).unwrap();
        assert_eq!(parsed.bth.pad_cnt, 1);
        assert_eq!(parsed.payload, b"abc");
        assert_eq!(parsed.ext.reth.unwrap().dma_len, 3);
    }

    #[test]
    fn lies_about_the_pad_reach_the_wire() {
        let req = Request::new(Opcode::RcRdmaWriteOnly, Qpn::new(1), Psn::new(0))
            .reth(0, RKey::new(1), 4)
            .pad_cnt(3);
        let body = req.body();
        assert_eq!(body.len(), 12 + 16);
        assert_eq!((body[1] >> 4) & 3, 3);
        let unaligned = Request::new(Opcode::RcRdmaWriteOnly, Qpn::new(1), Psn::new(0))
            .reth(0, RKey::new(1), 5)
            .payload(vec![1; 5])
            .pad_cnt(0)
            .pad_bytes(0);
        assert_eq!(unaligned.body().len(), 12 + 16 + 5);
    }

    #[test]
    fn answers_with_a_bad_icrc_are_refused() {
        let victim = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xC000);
        let us = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 3), ROCEV2_PORT);
        let mut ack = Request::new(Opcode::RcAcknowledge, Qpn::new(0x33), Psn::new(9));
        ack.ext.aeth = Some(roce_wire::aeth::Repr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: Msn::new(4),
        });
        let mut datagram = seal(&ack.body(), victim, us);
        let a = Answer::parse(&datagram, victim, us).unwrap();
        assert_eq!(a.syndrome, Some(Syndrome::ACK_UNLIMITED));
        assert_eq!(a.msn, Some(Msn::new(4)));
        assert_eq!(a.psn, Psn::new(9));
        *datagram.last_mut().unwrap() ^= 1;
        assert!(Answer::parse(&datagram, victim, us).is_err());
    }
}
