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
//! last, leave the holder's indexes as they were). A same-uid program that joins after that
//! check gets nothing from the steering (the program only returns indexes `< n`, and NAPI
//! GRO's lookup only decides whether GRO runs, delivery still goes through the program) but
//! could replace the program (`SO_ATTACH_REUSEPORT_CBPF` on its socket): one uid is one trust
//! domain, as for kernel demux ([`super::demux`]). When `/proc` cannot be read, the check is
//! skipped.
//!
//! # A kernel-demux member joining later
//!
//! A device leased by the rocectl daemon runs one engine ([`crate::DeviceConfig::engines`]),
//! and a sharded device cannot open where demux members already hold the address (the check
//! above). But a sharded device opens alone when no daemon serves its address *at that
//! moment*; should a daemon start serving it later, its kernel-demux members (same uid,
//! `SO_REUSEPORT`) could join this group, and the first one's demux program would replace
//! this one: this device's datagrams would then be steered by the demux map, where its
//! sockets are not, and be lost without a word. So while it is open, a sharded device also
//! holds an abstract Unix socket named after its address ([`Marker`], per network namespace
//! as the UDP sockets are, released by the kernel when the process ends), and a demux member
//! looks for it after binding and before it attaches anything ([`sharded_device_holds`]):
//! found, it backs out with "address in use" ([`super::udp::UdpError::DemuxShardedHolder`]),
//! as it would against a one-engine device's plain socket. The marker is bound before the
//! UDP sockets, so a member that looked before it existed is seen by the inode check above.
//! Anyone in the namespace can bind a name, so a squatter can keep sharded devices from
//! opening (they fail with "address in use", never share): a local nuisance only.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};

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

/// The abstract Unix socket a sharded device holds while it is open (module docs); dropping it
/// releases the name.
#[derive(Debug)]
pub(crate) struct Marker {
    _socket: UnixDatagram,
}

/// The abstract name of the marker of a sharded device on `addr`.
fn marker_name(addr: SocketAddr) -> std::io::Result<UnixAddr> {
    UnixAddr::from_abstract_name(format!("rocectl-engines {addr}").as_bytes())
}

/// Whether a sharded device holds `addr` in this network namespace (its marker is bound).
/// Connecting tells without taking the name: refused when nobody holds it.
pub(crate) fn sharded_device_holds(addr: SocketAddr) -> bool {
    let Ok(name) = marker_name(addr) else {
        return false;
    };
    UnixDatagram::unbound().is_ok_and(|probe| probe.connect_addr(&name).is_ok())
}

/// Opens `n` (≥ 2) `udp` sockets on `local`:`port` in one steered reuseport group; element `i`
/// receives the datagrams whose DestQP `% n == i`. Port 0: the first socket gets an ephemeral
/// port and the others join it. With them the device's [`Marker`], to keep while they are open.
///
/// # Errors
/// As the `udp` backend's bind; [`OpenError::AddrInUse`] also when another socket joined
/// the group or another sharded device's marker is bound (see the module docs);
/// [`OpenError::Backend`] when the program cannot be attached.
pub(crate) fn open_udp(
    local: IpAddr,
    port: u16,
    n: usize,
) -> Result<(Vec<Box<dyn Datapath>>, Marker), OpenError> {
    let addr = SocketAddr::new(local, port);
    // The marker first (module docs); with port 0 the port is known only after the bind.
    let early = (port != 0).then(|| hold_marker(addr)).transpose()?;
    let mut socks = Vec::with_capacity(n);
    socks.push(UdpDatapath::bind_reuseport(addr, UdpOptions::default())?);
    // The others join the first one's port (the port it was given when `port` is 0).
    let bound = socks[0].local_addr();
    let marker = match early {
        Some(m) => m,
        None => hold_marker(bound)?,
    };
    for _ in 1..n {
        socks.push(UdpDatapath::bind_reuseport(bound, UdpOptions::default())?);
    }
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
        message: format!("{bound}: attaching the engines' steering program: {e}"),
    })?;
    Ok((
        socks
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn Datapath>)
            .collect(),
        marker,
    ))
}

/// Binds the marker for `addr`.
///
/// # Errors
/// [`OpenError::AddrInUse`]: another sharded device of this network namespace holds `addr`
/// (or something squats the name); [`OpenError::Backend`]: the socket cannot be made.
fn hold_marker(addr: SocketAddr) -> Result<Marker, OpenError> {
    let backend = |e: std::io::Error| OpenError::Backend {
        backend: "udp",
        message: format!("{addr}: the engines' marker socket: {e}"),
    };
    let name = marker_name(addr).map_err(backend)?;
    match UnixDatagram::bind_addr(&name) {
        Ok(socket) => Ok(Marker { _socket: socket }),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(OpenError::AddrInUse {
            addr,
            detail: format!(
                "another rocectl device with several engines holds it (its marker, the abstract \
                 Unix socket @rocectl-engines {addr}, is bound); {}",
                crate::portowner::in_use_detail(addr)
            ),
        }),
        Err(e) => Err(backend(e)),
    }
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
