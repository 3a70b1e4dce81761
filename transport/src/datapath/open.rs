//! Opening the kernel-backed datapaths, with errors users can act on.

use std::net::IpAddr;

use super::demux::Demux;
use super::Datapath;
use crate::error::OpenError;

/// Opens the `udp` backend on `local`:`port`.
pub(crate) fn udp(local: IpAddr, port: u16) -> Result<Box<dyn Datapath>, OpenError> {
    let dp = super::udp::UdpDatapath::bind(
        std::net::SocketAddr::new(local, port),
        super::udp::UdpOptions::default(),
    )?;
    Ok(Box::new(dp))
}

/// Opens the `udp` backend on `local`:`port` as a member of a kernel-demux group.
pub(crate) fn udp_demux(
    local: IpAddr,
    port: u16,
    demux: &Demux,
) -> Result<Box<dyn Datapath>, OpenError> {
    let addr = std::net::SocketAddr::new(local, port);
    let opts = super::udp::UdpOptions::default();
    // Off loopback: UDP_GRO with the relay for what NAPI GRO merges across members (see
    // `relay`); without the relay, no GRO. Loopback keeps GRO without a relay (`demux`).
    if !local.is_loopback() && opts.gro {
        match super::relay::open(addr, opts, demux) {
            Ok(dp) => return Ok(Box::new(dp)),
            Err(super::relay::RelayError::Udp(e)) => return Err(e.into()),
            // No safe relay directory or socket: correct without GRO, only slower.
            Err(_) => {}
        }
    }
    let dp = super::udp::UdpDatapath::bind_demux(addr, opts, demux)?;
    Ok(Box::new(dp))
}

/// Opens the `raw` backend on `ifname` with address `local`.
pub(crate) fn raw(ifname: &str, local: IpAddr) -> Result<Box<dyn Datapath>, OpenError> {
    let dp = super::raw::RawDatapath::open(ifname, local, super::raw::RawOptions::default())?;
    Ok(Box::new(dp))
}
