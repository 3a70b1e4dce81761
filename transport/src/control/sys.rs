//! The system calls of the control socket: frames with file descriptors (`SCM_RIGHTS`), the
//! peer's identity from the kernel (`SO_PEERCRED`, `SO_PEERPIDFD`), and systemd's socket
//! activation and readiness protocol. Every `unsafe` of the control plane is here.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Descriptors ride on the
//! first byte of a frame (`sendmsg` with `SCM_RIGHTS`); the reader takes them with the
//! `recvmsg` that reads the length, so they are never separated from their message.

use std::io::{self, Read, Write};
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest frame either side accepts (a `res show` of many clients stays far below).
pub const MAX_FRAME: usize = 4 << 20;
/// The most descriptors one frame carries.
const MAX_FDS: usize = 4;
/// `SO_PEERPIDFD` (Linux 6.5; not in every libc release).
const SO_PEERPIDFD: libc::c_int = 77;

/// The identity of the process at the other end of a Unix socket, from the kernel: the
/// credentials it had when it connected (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// The peer's credentials (`getsockopt(SO_PEERCRED)`).
///
/// # Errors
/// Not a connected Unix socket.
pub fn peer_cred(sock: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: `cred` is a valid, writable `ucred` and `len` holds its size, as
    // getsockopt(SO_PEERCRED) requires; the fd is open for the borrow of `sock`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// A pidfd of the peer process (`getsockopt(SO_PEERPIDFD)`, Linux 6.5 and later): it becomes
/// readable when that process exits, and unlike the pid it cannot name a recycled process.
///
/// # Errors
/// An older kernel (`ENOPROTOOPT`) or not a connected Unix socket.
pub fn peer_pidfd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: `fd` is a writable c_int and `len` its size, as getsockopt(SO_PEERPIDFD)
    // requires.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    if r != 0 || fd < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: the kernel just created `fd` for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the process behind a pidfd has exited (the pidfd is readable), waiting at most
/// `wait` (the kernel closes a dying process's sockets a little before it marks it exited).
pub fn pidfd_exited(pidfd: BorrowedFd<'_>, wait: std::time::Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: one valid pollfd, count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, wait.as_millis().min(60_000) as libc::c_int) };
    n == 1 && pfd.revents & libc::POLLIN != 0
}

/// Waits up to `wait` for `fd` to be readable; whether it is.
pub fn wait_readable(fd: RawFd, wait: std::time::Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: one valid pollfd, count 1; an invalid fd only sets POLLNVAL.
    let n = unsafe { libc::poll(&mut pfd, 1, wait.as_millis().min(60_000) as libc::c_int) };
    n == 1 && pfd.revents & libc::POLLIN != 0
}

/// Writes `msg` as one frame, with `fds` attached to its first byte.
///
/// # Errors
/// The socket's error; `InvalidInput` for a message larger than [`MAX_FRAME`] or more than
/// four descriptors.
pub fn write_frame<T: Serialize>(
    sock: &mut UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "control message too large",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    let mut sent = 0;
    if !fds.is_empty() {
        sent = send_with_fds(sock, &buf, fds)?;
    }
    sock.write_all(&buf[sent..])
}

/// Reads one frame; `None` on a clean end of stream before its first byte.
///
/// # Errors
/// The socket's error; `UnexpectedEof` in the middle of a frame; `InvalidData` for a frame
/// larger than [`MAX_FRAME`] or JSON that is not a `T`.
pub fn read_frame<T: DeserializeOwned>(
    sock: &mut UnixStream,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < head.len() {
        let n = recv_with_fds(sock, &mut head[got..], &mut fds)?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("control frame of {len} bytes (limit {MAX_FRAME})"),
        ));
    }
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body)?;
    let msg =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((msg, fds)))
}

/// Space for the control message of [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

fn send_with_fds(sock: &UnixStream, buf: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let payload = size_of_val(raw.as_slice());
    let mut cmsg = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    #[allow(unsafe_code)]
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    debug_assert!(space <= cmsg.0.len());
    #[allow(unsafe_code)]
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to live buffers.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = space;
    #[allow(unsafe_code)]
    // SAFETY: `msg` points at `cmsg`, which has room for one header and `raw` (checked
    // above: at most MAX_FDS descriptors fit in 64 bytes); CMSG_FIRSTHDR is non-null because
    // msg_controllen >= sizeof(cmsghdr); the data copy stays inside that header's space.
    let n = unsafe {
        let hdr = libc::CMSG_FIRSTHDR(&msg);
        (*hdr).cmsg_level = libc::SOL_SOCKET;
        (*hdr).cmsg_type = libc::SCM_RIGHTS;
        (*hdr).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
        std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(hdr).cast(), raw.len());
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut cmsg = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    #[allow(unsafe_code)]
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to live buffers.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.0.len();
    let n = loop {
        #[allow(unsafe_code)]
        // SAFETY: `msg` points at `iov` (over `buf`) and `cmsg`, both live and writable.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    #[allow(unsafe_code)]
    // SAFETY: the kernel filled `msg.msg_control` with msg_controllen bytes of well-formed
    // headers; CMSG_FIRSTHDR/NXTHDR walk them and stay inside; each SCM_RIGHTS payload is
    // an array of descriptors the kernel installed in this process for us to own.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(hdr);
                let bytes = (*hdr).cmsg_len - (data as usize - hdr as usize);
                for i in 0..bytes / size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated (too many descriptors)",
        ));
    }
    Ok(n)
}

/// The listening socket systemd passed (socket activation: `LISTEN_PID` is us and
/// `LISTEN_FDS` ≥ 1), as a Unix stream listener; `None` when not socket-activated. The
/// variables are removed so that children do not take the socket for theirs.
///
/// # Errors
/// `LISTEN_FDS` names a descriptor that is not a listening Unix stream socket.
pub fn systemd_listener() -> io::Result<Option<UnixListener>> {
    let pid = std::env::var("LISTEN_PID").ok();
    let count = std::env::var("LISTEN_FDS").ok();
    let (Some(pid), Some(count)) = (pid, count) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let count: u32 = count.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={count:?} is not a number"),
        )
    })?;
    // Removing them keeps them from reaching any child process.
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    if count == 0 {
        return Ok(None);
    }
    const SD_LISTEN_FDS_START: RawFd = 3;
    // Check what fd 3 is before taking ownership of it.
    let mut ty: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: a writable c_int and its size; on a closed fd getsockopt fails with EBADF.
    let r = unsafe {
        libc::getsockopt(
            SD_LISTEN_FDS_START,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&raw mut ty).cast(),
            &mut len,
        )
    };
    if r != 0 || ty != libc::SOCK_STREAM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket systemd passed (fd 3) is not a stream socket: use ListenStream= in rocectl.socket",
        ));
    }
    #[allow(unsafe_code)]
    // SAFETY: systemd passed fd 3 to this process (LISTEN_PID is ours) and nothing else in
    // the process owns it; it is a socket (checked above).
    let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
    let sock = socket2::Socket::from(fd);
    sock.set_cloexec(true)?;
    if sock.domain()? != socket2::Domain::UNIX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket systemd passed (fd 3) is not a Unix socket",
        ));
    }
    Ok(Some(UnixListener::from(OwnedFd::from(sock))))
}

/// Tells systemd the daemon's state (`sd_notify`: `READY=1`, `STOPPING=1`, `STATUS=...`),
/// when it runs under a `Type=notify` unit (`NOTIFY_SOCKET` set); otherwise does nothing.
///
/// # Errors
/// The notification socket cannot be reached.
pub fn sd_notify(state: &str) -> io::Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &path)?;
    }
    Ok(())
}

/// Whether `fd` is open (used by tests to check that passed descriptors are owned).
pub fn fd_is_open(fd: impl AsFd) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: F_GETFD only reads the descriptor flags.
    let r = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_GETFD) };
    r >= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_and_without_descriptors() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        write_frame(&mut a, &"hello".to_string(), &[]).unwrap();
        let (m, fds): (String, _) = read_frame(&mut b).unwrap().unwrap();
        assert_eq!((m.as_str(), fds.len()), ("hello", 0));
        let file = std::fs::File::open("/proc/self/status").unwrap();
        write_frame(&mut a, &vec![1u32, 2, 3], &[file.as_fd()]).unwrap();
        let (m, fds): (Vec<u32>, _) = read_frame(&mut b).unwrap().unwrap();
        assert_eq!(m, [1, 2, 3]);
        assert_eq!(fds.len(), 1);
        assert!(fd_is_open(&fds[0]));
        // The received descriptor is a new one naming the same open file.
        assert_ne!(fds[0].as_raw_fd(), file.as_raw_fd());
        drop(a);
        assert!(read_frame::<String>(&mut b).unwrap().is_none());
    }

    #[test]
    fn an_oversized_or_cut_frame_is_an_error_not_a_panic() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let e = read_frame::<String>(&mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[0, 0]).unwrap();
        drop(a);
        let e = read_frame::<String>(&mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[0, 0, 0, 3, b'{', b'x', b'}']).unwrap();
        let e = read_frame::<String>(&mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn peer_credentials_come_from_the_kernel() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.pid, std::process::id());
        #[allow(unsafe_code)]
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(cred.uid, uid);
    }
}
