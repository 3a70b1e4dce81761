//! Who holds a UDP port: what `ss -uapn` shows, read from `/proc`, for the "address in use"
//! error of the `udp` backend.
//!
//! The socket is found by its local address in `/proc/net/udp` (IPv4) and `/proc/net/udp6`
//! (IPv6, and wildcard IPv6 sockets that also take IPv4), which give its inode; the process is
//! the one with a `/proc/<pid>/fd/*` link to `socket:[inode]`. A socket no process has open is
//! a kernel socket: on a RoCE host, Linux rdma_rxe's, which binds UDP 4791 on every address.
//! Another user's processes cannot be looked into without privileges; then nothing is claimed.

use std::fmt;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// Who holds a UDP address, as far as `/proc` tells.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortOwner {
    /// A process has the socket open.
    Process {
        /// Its process ID.
        pid: u32,
        /// Its command name (`/proc/<pid>/comm`).
        name: String,
        /// The address the socket is bound to (the wildcard address takes every one).
        bound: SocketAddr,
    },
    /// The socket exists and every process could be looked into: none has it open (a kernel
    /// socket, such as rdma_rxe's).
    Kernel {
        /// The address the socket is bound to.
        bound: SocketAddr,
    },
    /// The socket or its process could not be found (another network namespace, another
    /// user's process, `/proc` unavailable).
    Unknown,
}

impl fmt::Display for PortOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Process { pid, name, bound } => {
                write!(f, "process {pid} ({name}) holds {bound}")
            }
            Self::Kernel { bound } => write!(
                f,
                "no process owns {bound}: probably a kernel rdma_rxe device (`rdma link show`)"
            ),
            Self::Unknown => f.write_str("its owner could not be found"),
        }
    }
}

/// The detail of an "address in use" error for UDP `addr`: who holds it, or (when that cannot
/// be found) the usual suspect, with the `ss` command that shows it.
pub fn in_use_detail(addr: SocketAddr) -> String {
    let ss = format!("see `ss -uapn 'sport = :{}'`", addr.port());
    match udp_port_owner(addr) {
        PortOwner::Unknown => {
            format!(
                "a kernel rdma_rxe device holds 0.0.0.0:{}; {ss}",
                addr.port()
            )
        }
        owner => format!("{owner}; {ss}"),
    }
}

/// Who holds UDP `addr` in this network namespace.
pub fn udp_port_owner(addr: SocketAddr) -> PortOwner {
    owner_in(Path::new("/proc"), addr)
}

/// The owner uids of the UDP sockets bound exactly to `addr` in the calling thread's network
/// namespace (as `/proc/thread-self/net/udp{,6}` shows them: `/proc/net` is the main
/// thread's; empty when none or unreadable). For the kernel-demux error: a reuseport group
/// only takes sockets of its owner's uid.
pub(crate) fn udp_socket_uids(addr: SocketAddr) -> Vec<u32> {
    let mut uids = Vec::new();
    for table in ["/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"] {
        if let Ok(text) = fs::read_to_string(table) {
            uids.extend(
                parse_table(&text)
                    .into_iter()
                    .filter(|s| s.local == addr)
                    .map(|s| s.uid),
            );
        }
    }
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// The inodes of the UDP sockets bound exactly to `addr` in the calling thread's network
/// namespace (`/proc/thread-self/net/udp{,6}`); `None` when neither table can be read. For a
/// sharded device: after binding its reuseport group it checks that the group holds its own
/// sockets only.
pub(crate) fn udp_socket_inodes(addr: SocketAddr) -> Option<Vec<u64>> {
    let mut inodes = Vec::new();
    let mut read = false;
    for table in ["/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"] {
        if let Ok(text) = fs::read_to_string(table) {
            read = true;
            inodes.extend(
                parse_table(&text)
                    .into_iter()
                    .filter(|s| s.local == addr)
                    .map(|s| s.inode),
            );
        }
    }
    read.then(|| {
        inodes.sort_unstable();
        inodes
    })
}

/// [`udp_port_owner`] under the `/proc` at `proc`.
fn owner_in(proc: &Path, addr: SocketAddr) -> PortOwner {
    let mut sockets = Vec::new();
    for table in ["net/udp", "net/udp6"] {
        if let Ok(text) = fs::read_to_string(proc.join(table)) {
            sockets.extend(parse_table(&text));
        }
    }
    // An exact bind first, then a wildcard one (which takes every address of its family, and
    // for an IPv6 socket without IPV6_V6ONLY, the IPv4 ones too).
    let exact = sockets.iter().find(|s| s.local == addr);
    let wildcard = sockets.iter().find(|s| {
        s.local.port() == addr.port() && s.local.ip().is_unspecified() && covers(s, addr)
    });
    let Some(socket) = exact.or(wildcard) else {
        return PortOwner::Unknown;
    };
    match socket_process(proc, socket.inode) {
        Ok(Some((pid, name))) => PortOwner::Process {
            pid,
            name,
            bound: socket.local,
        },
        Ok(None) => PortOwner::Kernel {
            bound: socket.local,
        },
        Err(_) => PortOwner::Unknown,
    }
}

/// Whether a wildcard socket takes `addr`.
fn covers(socket: &Socket, addr: SocketAddr) -> bool {
    match (socket.local.ip(), addr.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), _) => true,
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// One row of `/proc/net/udp{,6}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Socket {
    local: SocketAddr,
    uid: u32,
    inode: u64,
}

/// The rows of `/proc/net/udp` or `/proc/net/udp6` (rows that do not parse are skipped).
fn parse_table(text: &str) -> Vec<Socket> {
    text.lines().skip(1).filter_map(parse_row).collect()
}

/// `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode`
fn parse_row(line: &str) -> Option<Socket> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let local = parse_addr(fields.get(1)?)?;
    let uid = fields.get(7)?.parse().ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some(Socket { local, uid, inode })
}

/// `0100007F:12B7` (IPv4) or 32 hex digits `:port` (IPv6): the address is the kernel's
/// in-memory words printed in hex, so each 32-bit word is in host byte order.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The process with a descriptor on socket `inode`, with its command name. `Ok(None)`: no
/// process has it; `Err`: some process could not be looked into (permission).
fn socket_process(proc: &Path, inode: u64) -> io::Result<Option<(u32, String)>> {
    let target = format!("socket:[{inode}]");
    let mut denied = None;
    for entry in fs::read_dir(proc)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let fds = match fs::read_dir(entry.path().join("fd")) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                denied = Some(e);
                continue;
            }
            // The process exited meanwhile.
            Err(_) => continue,
        };
        for fd in fds.flatten() {
            if fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                let name = fs::read_to_string(entry.path().join("comm"))
                    .map(|c| c.trim_end().to_owned())
                    .unwrap_or_else(|_| "?".into());
                return Ok(Some((pid, name)));
            }
        }
    }
    match denied {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_as_the_kernel_prints_them() {
        // Little-endian hosts print 127.0.0.1 as 0100007F; the words are in host order.
        let v4 = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  \
             timeout inode ref pointer drops\n  \
             12: {:08X}:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        \
             0 45678 2 0000000000000000 0\n",
            u32::from_ne_bytes([127, 0, 0, 1])
        );
        let rows = parse_table(&v4);
        assert_eq!(
            rows,
            vec![Socket {
                local: "127.0.0.1:4791".parse().unwrap(),
                uid: 0,
                inode: 45_678
            }]
        );
        let word = |b: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(b));
        let v6 = format!(
            "header\n   3: {}{}{}{}:12B7 00000000000000000000000000000000:0000 07 00000000:00000000 \
             00:00000000 00000000  1000        0 99 2 0000000000000000 0\n",
            word([0x20, 0x01, 0x0d, 0xb8]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 1])
        );
        let rows = parse_table(&v6);
        assert_eq!(rows[0].local, "[2001:db8::1]:4791".parse().unwrap());
        assert_eq!((rows[0].uid, rows[0].inode), (1000, 99));
        assert!(parse_table("header\ngarbage line\n").is_empty());
    }

    #[test]
    fn finds_this_process_holding_a_socket() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let owner = udp_port_owner(addr);
        let comm = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(
            owner,
            PortOwner::Process {
                pid: std::process::id(),
                name: comm.trim_end().to_owned(),
                bound: addr
            }
        );
        assert!(owner
            .to_string()
            .starts_with(&format!("process {} (", std::process::id())));
        // A wildcard bind takes every address of the port.
        let wild = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = wild.local_addr().unwrap().port();
        match udp_port_owner(SocketAddr::new([127, 0, 0, 9].into(), port)) {
            PortOwner::Process { pid, bound, .. } => {
                assert_eq!(pid, std::process::id());
                assert_eq!(bound, SocketAddr::new([0, 0, 0, 0].into(), port));
            }
            other => panic!("{other:?}"),
        }
        drop((socket, wild));
        // Nobody holds a port that was just released.
        assert_eq!(udp_port_owner(addr), PortOwner::Unknown);
    }

    #[test]
    fn a_socket_no_process_has_open_is_the_kernels() {
        // A fake /proc: the socket is listed, no process has it.
        let dir = std::env::temp_dir().join(format!("portowner-{}", std::process::id()));
        fs::create_dir_all(dir.join("net")).unwrap();
        fs::create_dir_all(dir.join("4242/fd")).unwrap();
        fs::write(
            dir.join("net/udp"),
            "header\n   1: 00000000:12B7 00000000:0000 07 00000000:00000000 00:00000000 \
             00000000     0        0 0 2 0000000000000000 0\n",
        )
        .unwrap();
        let owner = owner_in(&dir, "10.0.0.1:4791".parse().unwrap());
        assert_eq!(
            owner,
            PortOwner::Kernel {
                bound: "0.0.0.0:4791".parse().unwrap()
            }
        );
        assert_eq!(
            owner.to_string(),
            "no process owns 0.0.0.0:4791: probably a kernel rdma_rxe device (`rdma link show`)"
        );
        assert_eq!(
            owner_in(&dir, "10.0.0.1:4792".parse().unwrap()),
            PortOwner::Unknown
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
