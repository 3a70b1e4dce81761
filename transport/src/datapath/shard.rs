//! The sockets of a device with several engines ([`crate::DeviceConfig::engines`]): `n` UDP
//! sockets on one `IP:4791`, one per engine, and the kernel steers each datagram to the
//! engine that owns its destination QP.
//!
//! # How
//!
//! Every socket binds the same address with `SO_REUSEPORT`, in order, which makes them one
//! reuseport group whose socket *index* is the order they joined (`reuse->socks[]`). Then the
//! first attaches a classic BPF program (`SO_ATTACH_REUSEPORT_CBPF`, unprivileged) to the
//! group ([`program`]):
//!
//! ```text
//!   ld  [4]            A = UDP payload bytes 4..8 (BTH: a reserved byte, then DestQP)
//!   and #0x00ffffff    A = DestQP
//!   mod #n             A = DestQP % n
//!   ret a              the index of the socket that gets the datagram
//! ```
//!
//! The kernel (`net/core/sock_reuseport.c`, `run_bpf_filter`) pulls the UDP header before it
//! runs the program, so offset 0 is the UDP payload; an index at or past the group's size
//! makes it fall back to the flow hash (`reuseport_select_sock_by_hash`), which this program
//! never returns. A datagram shorter than 8 bytes makes the load fail and a classic program
//! then returns 0: socket 0, which counts it malformed. QPNs are handed out so that
//! `QPN % n` is the owning engine (`crate::ids`), and QP1 (GSI) belongs to engine `1 % n`.
//!
//! Steering is an optimisation, never what makes delivery correct: every engine checks each
//! datagram's DestQP and hands another engine's on through that engine's inbox
//! ([`crate::shard`]). That covers the datagrams NAPI GRO merged into one buffer before the
//! program ran (GRO merges a flow by ports, and our senders use source port 4791 for every
//! QP), and any that arrived before the program was attached.
//!
//! # Who else can join the group
//!
//! The kernel only groups sockets of one uid that all set `SO_REUSEPORT`: a socket without
//! it (an exclusive rocectl, rdma_rxe) cannot bind the address while the group exists, nor
//! can the group form while such a socket holds it (`EADDRINUSE`, reported with its owner by
//! [`crate::portowner`]). A process of the same uid that also sets `SO_REUSEPORT` can join,
//! so after binding, the device checks in `/proc/thread-self/net/udp{,6}` that exactly its
//! own `n` sockets hold the address, and refuses to open otherwise ([`OpenError::AddrInUse`]):
//! of two sharded devices racing for one address, the later (or both) fail, none shares
//! silently. The program is attached only after that check, so a device that backs out never
//! replaces the steering of the one that holds the address (and its sockets, which joined
//! last, leave the holder's indexes as they were). A same-uid program that joins after that check gets nothing from the steering
//! (the program only returns indexes `< n`, and NAPI GRO's lookup only decides whether GRO
//! runs, delivery still goes through the program) but could replace the program
//! (`SO_ATTACH_REUSEPORT_CBPF` on its socket): one uid is one trust domain, as for kernel
//! demux ([`super::demux`]). When `/proc` cannot be read, the check is skipped.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use super::udp::{UdpDatapath, UdpOptions};
use super::Datapath;
use crate::error::OpenError;

/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// The steering program for `n` engines (see the module docs).
pub(crate) fn program(n: u32) -> [libc::sock_filter; 4] {
    // linux/bpf_common.h: classes, sizes, modes, operations.
    const LD: u16 = 0x00;
    const W: u16 = 0x00;
    const ABS: u16 = 0x20;
    const ALU: u16 = 0x04;
    const AND: u16 = 0x50;
    const MOD: u16 = 0x90;
    const K: u16 = 0x00;
    const RET: u16 = 0x06;
    const A: u16 = 0x10;
    let insn = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    [
        insn(LD | W | ABS, 4),
        insn(ALU | AND | K, 0x00FF_FFFF),
        insn(ALU | MOD | K, n.max(1)),
        insn(RET | A, 0),
    ]
}

/// Attaches [`program`] for `n` sockets to the reuseport group of `fd`.
fn attach(fd: RawFd, n: u32) -> std::io::Result<()> {
    let mut code = program(n);
    let prog = libc::sock_fprog {
        len: code.len() as u16,
        filter: code.as_mut_ptr(),
    };
    #[allow(unsafe_code)]
    // SAFETY: `prog` points at `code`, four initialised instructions that outlive the call;
    // the kernel copies the program before returning.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&prog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The inode of socket `fd` (`/proc/self/fd/N` reads `socket:[inode]`).
fn inode(fd: RawFd) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Opens `n` (≥ 2) `udp` sockets on `local`:`port` in one steered reuseport group; element `i`
/// receives the datagrams whose DestQP `% n == i`.
///
/// # Errors
/// As the `udp` backend's bind; [`OpenError::AddrInUse`] also when another socket joined
/// the group (see the module docs); [`OpenError::Backend`] when the program cannot be
/// attached.
pub(crate) fn open_udp(
    local: IpAddr,
    port: u16,
    n: usize,
) -> Result<Vec<Box<dyn Datapath>>, OpenError> {
    let addr = SocketAddr::new(local, port);
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n {
        socks.push(UdpDatapath::bind_reuseport(addr, UdpOptions::default())?);
    }
    let bound = socks[0].local_addr();
    if let Some(mut present) = crate::portowner::udp_socket_inodes(bound) {
        let mut ours: Vec<u64> = socks
            .iter()
            .filter_map(|s| inode(s.socket().as_raw_fd()))
            .collect();
        ours.sort_unstable();
        present.dedup();
        if ours.len() == n && present != ours {
            return Err(OpenError::AddrInUse {
                addr: bound,
                detail: format!(
                    "{} other socket(s) with SO_REUSEPORT share it (another rocectl with \
                     several engines?), and this device's {n} engines need it alone; {}",
                    present.len().saturating_sub(n),
                    crate::portowner::in_use_detail(bound)
                ),
            });
        }
    }
    // Only now: a device that found others in the group must not replace their program.
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    attach(socks[0].socket().as_raw_fd(), n32).map_err(|e| OpenError::Backend {
        backend: "udp",
        message: format!("{addr}: attaching the engines' steering program: {e}"),
    })?;
    Ok(socks
        .into_iter()
        .map(|s| Box::new(s) as Box<dyn Datapath>)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program is the four instructions the module docs show, with `n` in `mod`.
    #[test]
    fn the_program_is_destqp_mod_n() {
        let p = program(3);
        let words: Vec<(u16, u32)> = p.iter().map(|i| (i.code, i.k)).collect();
        assert_eq!(
            words,
            vec![(0x20, 4), (0x54, 0x00FF_FFFF), (0x94, 3), (0x16, 0)]
        );
    }
}
