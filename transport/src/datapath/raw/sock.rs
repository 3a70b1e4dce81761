//! The `AF_PACKET` socket: the only place of the raw backend that calls into libc unsafely.
//!
//! One `SOCK_RAW` packet socket, bound to the interface, non-blocking:
//!
//! - created with protocol 0, so it receives nothing until it is bound with `ETH_P_ALL`
//!   *after* its filter is attached (no stray frames from other interfaces in between);
//! - a classic BPF filter keeps only ARP, IPv6 neighbour discovery and UDP to our port, and
//!   drops 802.1Q-tagged frames (they belong to a VLAN interface, not this one);
//! - `PACKET_IGNORE_OUTGOING`: we do not read back our own frames (nor the kernel's);
//! - `PACKET_VNET_HDR`: every frame in either direction starts with a `virtio_net_hdr`. On
//!   receive it says whether the kernel verified the checksum or never computed it (a local
//!   sender over veth), and the segment size of a UDP GSO frame from a local sender (those
//!   cross veth unsegmented). On send we write zeros: no offloads.
//!
//! Batching is `recvmmsg`/`sendmmsg`: a receive fills up to [`RX_SLOTS`] slots of
//! [`SLOT_LEN`] bytes (room for a 64 KiB GSO frame); a send gathers header and payload of
//! each frame from two buffers, so payloads are never copied. A `PACKET_RX_RING`
//! (`TPACKET_V3`) would save the copy into the slots and most system calls; it is the next
//! step if profiles show the socket.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockFilter, Socket, Type};

use super::codec::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETH_LEN, VNET_LEN};

/// Frames read by one `recvmmsg`.
pub(super) const RX_SLOTS: usize = 32;
/// Bytes per receive slot: virtio-net header, Ethernet header and the largest IP packet,
/// rounded so that consecutive slots do not share cache sets (65 600 = 64 mod 4096).
pub(super) const SLOT_LEN: usize = 65_600;
/// Frames written by one `sendmmsg`.
pub(super) const TX_BATCH: usize = 64;

/// `linux/if_packet.h` options not in every libc release.
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_STATISTICS: libc::c_int = 6;
/// `sockaddr_ll.sll_pkttype` of a frame another host sent to us.
pub(super) const PACKET_OUTGOING: u8 = 4;

/// What `recvmmsg` said about one frame.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RxInfo {
    /// Bytes in the slot.
    pub(super) len: usize,
    /// The frame did not fit the slot.
    pub(super) truncated: bool,
    /// `sll_pkttype`.
    pub(super) pkttype: u8,
}

/// What [`PacketSocket::send_batch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Sent {
    /// Frames taken (a prefix of the batch): sent, or dropped by the kernel.
    pub(super) taken: usize,
    /// Of those, frames the kernel dropped (`ENOBUFS`).
    pub(super) dropped: usize,
}

/// A bound, filtered, non-blocking packet socket.
#[derive(Debug)]
pub(super) struct PacketSocket {
    sock: Socket,
    ifindex: i32,
    /// The send buffer size the kernel granted.
    sndbuf: usize,
}

impl PacketSocket {
    /// Opens the socket on interface `ifindex`, receiving UDP for `port` and neighbour
    /// messages.
    ///
    /// # Errors
    /// `PermissionDenied` without `CAP_NET_RAW`; other socket errors.
    pub(super) fn open(ifindex: u32, port: u16) -> io::Result<Self> {
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index"))?;
        let sock = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0)))?;
        sock.set_nonblocking(true)?;
        let sndbuf = sock.send_buffer_size()?;
        let this = Self {
            sock,
            ifindex,
            sndbuf,
        };
        // Kernels before 4.20 lack it; outgoing frames are then dropped by type on receive.
        let _ = this.set_int(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1);
        this.set_int(libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
        this.sock.attach_filter(&socket_filter(port))?;
        this.bind()?;
        Ok(this)
    }

    fn bind(&self) -> io::Result<()> {
        let addr = sockaddr_ll(self.ifindex, libc::ETH_P_ALL as u16, [0; 6]);
        #[allow(unsafe_code)]
        // SAFETY: `addr` is a live, initialised sockaddr_ll and we pass its exact size.
        let rc = unsafe {
            libc::bind(
                self.sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn set_int(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
        #[allow(unsafe_code)]
        // SAFETY: passes a pointer to a live c_int and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast::<libc::c_void>(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets the kernel buffer sizes, beyond `net.core.[rw]mem_max` when we may (root).
    pub(super) fn set_buffers(&mut self, recv: usize, send: usize) {
        let clamp = |n: usize| libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
        if self
            .set_int(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, clamp(recv))
            .is_err()
        {
            let _ = self.sock.set_recv_buffer_size(recv);
        }
        if self
            .set_int(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, clamp(send))
            .is_err()
        {
            let _ = self.sock.set_send_buffer_size(send);
        }
        if let Ok(n) = self.sock.send_buffer_size() {
            self.sndbuf = n;
        }
    }

    /// The MTU of interface `ifname`, asked through this socket (so in its namespace).
    pub(super) fn mtu(&self, ifname: &str) -> io::Result<usize> {
        #[allow(unsafe_code)]
        // SAFETY: ifreq is a plain C struct (name array and a union of integers and
        // pointers) for which all-zero bytes are a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let name = ifname.as_bytes();
        if name.len() >= req.ifr_name.len() || name.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad interface name",
            ));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        #[allow(unsafe_code)]
        // SAFETY: SIOCGIFMTU reads the NUL-terminated name from and writes an int into the
        // live `req` we pass.
        let rc = unsafe { libc::ioctl(self.sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: SIOCGIFMTU succeeded, so the kernel wrote the `ifru_mtu` member.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        usize::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
    }

    /// Reads up to `info.len()` frames (at most [`RX_SLOTS`]) into consecutive
    /// [`SLOT_LEN`]-byte slots of `buf`; returns how many. `Err(WouldBlock)` when none waits.
    pub(super) fn recv_batch(&self, buf: &mut [u8], info: &mut [RxInfo]) -> io::Result<usize> {
        let n = info.len().min(RX_SLOTS).min(buf.len() / SLOT_LEN);
        if n == 0 {
            return Ok(0);
        }
        #[allow(unsafe_code)]
        // SAFETY: all-zero bytes are a valid value of these plain C structs (null pointers,
        // zero lengths).
        let (mut addrs, mut iovs, mut msgs): (
            [libc::sockaddr_ll; RX_SLOTS],
            [libc::iovec; RX_SLOTS],
            [libc::mmsghdr; RX_SLOTS],
        ) = unsafe { std::mem::zeroed() };
        for (i, slot) in buf.chunks_exact_mut(SLOT_LEN).take(n).enumerate() {
            iovs[i] = libc::iovec {
                iov_base: slot.as_mut_ptr().cast::<libc::c_void>(),
                iov_len: SLOT_LEN,
            };
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_ll).cast();
            msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        }
        #[allow(unsafe_code)]
        // SAFETY: `msgs[..n]` point at `n` live iovecs, each covering a distinct SLOT_LEN
        // chunk of `buf` (exclusively borrowed), and at `n` live sockaddr_ll of the size
        // given; all outlive the call. MSG_DONTWAIT and a null timeout: it does not block.
        let got = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = got as usize;
        for i in 0..got {
            info[i] = RxInfo {
                len: (msgs[i].msg_len as usize).min(SLOT_LEN),
                truncated: msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                pkttype: addrs[i].sll_pkttype,
            };
        }
        Ok(got)
    }

    /// Sends frames, each the concatenation of a header block (starting with the virtio-net
    /// header) and a payload. Returns how many were taken (a prefix), of which how many the
    /// kernel dropped. `Err(WouldBlock)` when the first could not be queued.
    ///
    /// A frame the kernel drops after taking it (a full device queue, a tc or nftables egress
    /// drop) fails with `ENOBUFS`. Like a UDP socket (which hides `ENOBUFS` unless
    /// `IP_RECVERR` is set), we count it as taken: it left our hands, and sending it again
    /// would undo the drop. `sendmmsg` does not say why it stopped after the first frame, so
    /// then the send queue tells: `EAGAIN` needs it full, otherwise the frame was dropped.
    pub(super) fn send_batch(&self, frames: &[(&[u8], &[u8])]) -> io::Result<Sent> {
        let mut sent = Sent::default();
        while sent.taken < frames.len() {
            match self.sendmmsg(&frames[sent.taken..]) {
                Ok(n) => {
                    sent.taken += n;
                    if sent.taken == frames.len() || self.send_queue_full() {
                        break;
                    }
                    sent.taken += 1;
                    sent.dropped += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    sent.taken += 1;
                    sent.dropped += 1;
                }
                // Report what went; a lasting error shows again on the next call.
                Err(_) if sent.taken > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// Whether the socket's send queue is too full to take a frame (the only cause of
    /// `EAGAIN`). Half the buffer: completions may have freed some since.
    fn send_queue_full(&self) -> bool {
        let mut queued: libc::c_int = 0;
        #[allow(unsafe_code)]
        // SAFETY: SIOCOUTQ writes one int into the live `queued`.
        let rc = unsafe { libc::ioctl(self.sock.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        rc != 0 || usize::try_from(queued).unwrap_or(0) >= self.sndbuf / 2
    }

    /// One `sendmmsg` of up to [`TX_BATCH`] frames; returns how many went out.
    fn sendmmsg(&self, frames: &[(&[u8], &[u8])]) -> io::Result<usize> {
        let n = frames.len().min(TX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        #[allow(unsafe_code)]
        // SAFETY: all-zero bytes are a valid value of these plain C structs.
        let (mut addrs, mut iovs, mut msgs): (
            [libc::sockaddr_ll; TX_BATCH],
            [[libc::iovec; 2]; TX_BATCH],
            [libc::mmsghdr; TX_BATCH],
        ) = unsafe { std::mem::zeroed() };
        for (i, (head, payload)) in frames.iter().take(n).enumerate() {
            let eth = head
                .get(VNET_LEN..VNET_LEN + ETH_LEN)
                .unwrap_or(&[0; ETH_LEN]);
            let mut dst = [0u8; 6];
            dst.copy_from_slice(&eth[..6]);
            let ethertype = u16::from_be_bytes([eth[12], eth[13]]);
            addrs[i] = sockaddr_ll(self.ifindex, ethertype, dst);
            // The kernel only reads from these (iovec has no const variant).
            iovs[i] = [
                libc::iovec {
                    iov_base: head.as_ptr() as *mut libc::c_void,
                    iov_len: head.len(),
                },
                libc::iovec {
                    iov_base: payload.as_ptr() as *mut libc::c_void,
                    iov_len: payload.len(),
                },
            ];
            msgs[i].msg_hdr.msg_iov = iovs[i].as_mut_ptr();
            msgs[i].msg_hdr.msg_iovlen = if payload.is_empty() { 1 } else { 2 };
            msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_ll).cast();
            msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        }
        #[allow(unsafe_code)]
        // SAFETY: `msgs[..n]` point at live iovecs covering the borrowed header and payload
        // slices (read only by the kernel) and at live sockaddr_ll of the size given; all
        // outlive the call. MSG_DONTWAIT: it does not block.
        let sent = unsafe {
            libc::sendmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sent as usize)
    }

    /// Frames the kernel dropped because our receive buffer was full, since the last call
    /// (`PACKET_STATISTICS` resets on read).
    pub(super) fn kernel_drops(&self) -> u64 {
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        #[allow(unsafe_code)]
        // SAFETY: passes a live tpacket_stats and its size; the kernel writes at most `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast::<libc::c_void>(),
                &mut len,
            )
        };
        if rc != 0 {
            return 0;
        }
        u64::from(stats.tp_drops)
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

fn sockaddr_ll(ifindex: i32, protocol: u16, dst: [u8; 6]) -> libc::sockaddr_ll {
    let mut addr = [0u8; 8];
    addr[..6].copy_from_slice(&dst);
    libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: protocol.to_be(),
        sll_ifindex: ifindex,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: addr,
    }
}

/// A filter for UDP sockets that keeps nothing (the guard socket, which must exist but never
/// queue anything).
pub(super) fn drop_all_filter() -> [SockFilter; 1] {
    [SockFilter::new(
        (libc::BPF_RET | libc::BPF_K) as u16,
        0,
        0,
        0,
    )]
}

/// The packet socket's filter (classic BPF, offsets from the Ethernet header): keep ARP,
/// ICMPv6 neighbour solicitations and advertisements, and UDP to `port` over IPv4 (not a
/// non-first fragment) or IPv6 (no extension headers); drop everything else, and anything
/// 802.1Q-tagged.
pub(super) fn socket_filter(port: u16) -> Vec<SockFilter> {
    const ACCEPT: usize = 21;
    const DROP: usize = 22;
    const IPV4: usize = 6;
    const IPV6: usize = 13;
    const ICMPV6: usize = 17;
    let ld = |size: u32, k: u32| stmt(libc::BPF_LD | size | libc::BPF_ABS, k);
    let vlan_present = (libc::SKF_AD_OFF + libc::SKF_AD_VLAN_TAG_PRESENT) as u32;
    let prog = vec![
        /* 0 */ ld(libc::BPF_W, vlan_present),
        /* 1 */ jeq(1, 0, 2, DROP),
        /* 2 */ ld(libc::BPF_H, 12),
        /* 3 */ jeq(3, ETHERTYPE_ARP.into(), ACCEPT, 4),
        /* 4 */ jeq(4, ETHERTYPE_IPV4.into(), IPV4, 5),
        /* 5 */ jeq(5, ETHERTYPE_IPV6.into(), IPV6, DROP),
        // IPv4: UDP, fragment offset 0, destination port (after the IHL-long header).
        /* 6 */
        ld(libc::BPF_B, 14 + 9),
        /* 7 */ jeq(7, 17, 8, DROP),
        /* 8 */ ld(libc::BPF_H, 14 + 6),
        /* 9 */ jump(9, libc::BPF_JSET, 0x1FFF, DROP, 10),
        /* 10 */ stmt(libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH, 14),
        /* 11 */ stmt(libc::BPF_LD | libc::BPF_H | libc::BPF_IND, 14 + 2),
        /* 12 */ jeq(12, port.into(), ACCEPT, DROP),
        // IPv6: next header UDP and destination port, or ICMPv6.
        /* 13 */
        ld(libc::BPF_B, 14 + 6),
        /* 14 */ jeq(14, 17, 15, ICMPV6),
        /* 15 */ ld(libc::BPF_H, 14 + 40 + 2),
        /* 16 */ jeq(16, port.into(), ACCEPT, DROP),
        /* 17 */ jeq(17, 58, 18, DROP),
        /* 18 */ ld(libc::BPF_B, 14 + 40),
        /* 19 */ jeq(19, 135, ACCEPT, 20),
        /* 20 */ jeq(20, 136, ACCEPT, DROP),
        /* 21 */ stmt(libc::BPF_RET | libc::BPF_K, 0x0004_0000),
        /* 22 */ stmt(libc::BPF_RET | libc::BPF_K, 0),
    ];
    debug_assert_eq!(prog.len(), DROP + 1);
    prog
}

fn stmt(code: u32, k: u32) -> SockFilter {
    SockFilter::new(code as u16, 0, 0, k)
}

/// A conditional jump at index `at` to absolute instruction indexes `yes` / `no`.
fn jump(at: usize, op: u32, k: u32, yes: usize, no: usize) -> SockFilter {
    let rel = |to: usize| (to - at - 1) as u8;
    SockFilter::new(
        (libc::BPF_JMP | op | libc::BPF_K) as u16,
        rel(yes),
        rel(no),
        k,
    )
}

fn jeq(at: usize, k: u32, yes: usize, no: usize) -> SockFilter {
    jump(at, libc::BPF_JEQ, k, yes, no)
}
