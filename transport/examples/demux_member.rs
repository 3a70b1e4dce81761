//! A kernel-demux member process, for `tests/demux.rs` (a process to `kill -9`).
//!
//! `demux_member NETNS LOCAL_IP PEER_IP SLOT MAP_FD PROG_FD`: enters the network namespace,
//! rebuilds the demux group from the two inherited descriptors (as a client of the daemon
//! would after receiving them over its Unix socket), opens a device on `LOCAL_IP:4791` in
//! `SLOT`, registers a 64 KiB buffer for remote writes and reads, creates an RC QP and prints
//! `qpn=0x.. addr=0x.. rkey=0x..`. It then reads the peer's QPN (hex) from standard input,
//! connects, prints `connected`, and serves one-sided operations from its progress thread
//! until standard input closes or it is killed.

use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;

use roce_transport::datapath::demux::{Demux, DemuxGroup, SlotLayout};
use roce_transport::{
    Access, ConnectOptions, Device, DeviceConfig, Gid, QpInit, QpType, Qpn, RemoteQp,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demux_member: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ns, local, peer, slot, map, prog] = args.as_slice() else {
        return Err("usage: demux_member NETNS LOCAL_IP PEER_IP SLOT MAP_FD PROG_FD".into());
    };
    let ip = |s: &str| s.parse::<IpAddr>().map_err(|e| format!("{s}: {e}"));
    let num = |s: &str| s.parse::<i32>().map_err(|e| format!("{s}: {e}"));
    let (local, peer, slot) = (ip(local)?, ip(peer)?, num(slot)? as u32);
    let fd = |n: RawFd| {
        #[allow(unsafe_code)]
        // SAFETY: the parent passed these descriptors open across exec and nothing else in
        // this process owns them.
        unsafe {
            OwnedFd::from_raw_fd(n)
        }
    };
    let (map, prog) = (fd(num(map)?), fd(num(prog)?));
    roce_testkit::netns::enter_named(ns).map_err(|e| e.to_string())?;
    let group = DemuxGroup::from_fds(map, prog, SlotLayout::DEFAULT).map_err(|e| e.to_string())?;
    let demux = Demux::new(group, slot).map_err(|e| e.to_string())?;
    let dev = Device::open(DeviceConfig::udp(local).name("child").demux(demux))
        .map_err(|e| e.to_string())?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&QpInit::new(QpType::Rc, &cq))
        .map_err(|e| e.to_string())?;
    let mr = pd
        .register(
            vec![0u8; 64 * 1024],
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "qpn={:#x} addr={:#x} rkey={:#x}",
        qp.qpn().value(),
        mr.addr(),
        mr.rkey().value()
    )
    .and_then(|()| out.flush())
    .map_err(|e| e.to_string())?;
    let mut lines = std::io::stdin().lock().lines();
    let line = lines
        .next()
        .ok_or("no peer QPN on standard input")?
        .map_err(|e| e.to_string())?;
    let rqpn = u32::from_str_radix(line.trim().trim_start_matches("0x"), 16)
        .map_err(|e| format!("{line}: {e}"))?;
    let o = ConnectOptions::default();
    let remote = RemoteQp {
        qpn: Qpn::new(rqpn),
        psn: o.local_psn,
        gid: Gid::from(peer),
    };
    qp.connect(&remote, &o).map_err(|e| e.to_string())?;
    writeln!(out, "connected")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())?;
    // Serve one-sided operations (progress thread) until told to stop.
    for _ in lines {}
    Ok(())
}
