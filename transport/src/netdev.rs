//! Network interfaces as RDMA devices: names, MACs, MTUs, addresses and the GID table.
//!
//! A rocectl "device" is a network interface (`-d eth0`). This module lists the interfaces of
//! the current network namespace ([`interfaces`], `getifaddrs(3)`), finds one by name
//! ([`interface`]), by address ([`interface_for_addr`]) or by route ([`route_to`]), and
//! builds the GID table Linux rdma_rxe would build for it ([`NetDevice::gid_table`]), so that
//! `-g`/`-x` GID indexes mean the same with rocectl as with the stock tools on Soft-RoCE.
//!
//! Nothing here needs privileges. MTUs come from `SIOCGIFMTU` on a socket of the current
//! network namespace (correct inside `ip netns exec` and inside `unshare -n` alike), with
//! `/sys/class/net/NAME/mtu` as the fallback.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use roce_wire::Gid;

/// One network interface of the current network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDevice {
    /// Interface name (`eth0`, `lo`).
    pub name: String,
    /// Interface index (`if_nametoindex`).
    pub index: u32,
    /// 6-byte hardware address; `None` for interfaces without one (tun, wireguard, ipip).
    /// `lo` has the all-zero MAC.
    pub mac: Option<[u8; 6]>,
    /// IP MTU in bytes.
    pub mtu: u32,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Operationally up, carrier present (`IFF_RUNNING`).
    pub running: bool,
    /// The loopback interface (`IFF_LOOPBACK`).
    pub loopback: bool,
    /// IPv4 addresses, in the kernel's order (primaries first, then secondaries).
    pub ipv4: Vec<Ipv4Net>,
    /// IPv6 addresses, in the kernel's order (wider scope first, newest first within a scope).
    pub ipv6: Vec<Ipv6Net>,
}

/// An IPv4 address with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Net {
    /// The address.
    pub addr: Ipv4Addr,
    /// Prefix length (0..=32).
    pub prefix: u8,
}

/// An IPv6 address with its prefix length and scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Net {
    /// The address.
    pub addr: Ipv6Addr,
    /// Prefix length (0..=128).
    pub prefix: u8,
    /// Scope, as `ip -6 addr` prints it.
    pub scope: Ipv6Scope,
}

/// The scope of an IPv6 address (Linux `ipv6_addr_scope`, as `ip addr` shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ipv6Scope {
    /// `::1`.
    Host,
    /// `fe80::/10`.
    Link,
    /// `fec0::/10` (deprecated site-local).
    Site,
    /// Everything else, unique-local `fc00::/7` included.
    Global,
}

impl Ipv6Scope {
    /// The scope of `addr`.
    pub fn of(addr: Ipv6Addr) -> Self {
        let s = addr.segments();
        if addr.is_loopback() {
            Self::Host
        } else if s[0] & 0xFFC0 == 0xFE80 {
            Self::Link
        } else if s[0] & 0xFFC0 == 0xFEC0 {
            Self::Site
        } else {
            Self::Global
        }
    }
}

impl fmt::Display for Ipv6Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Host => "host",
            Self::Link => "link",
            Self::Site => "site",
            Self::Global => "global",
        })
    }
}

/// The type of a GID table entry (`ibv_gid_type`). rxe in Linux 6.1 builds RoCE v2 entries
/// only, and so do we.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidType {
    /// RoCE v2 (UDP/IP encapsulation, `IB_GID_TYPE_ROCE_UDP_ENCAP`).
    RoceV2,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::RoceV2 => "RoCE v2",
        })
    }
}

/// One entry of a GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// Index (what `-g`/`-x` select).
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub kind: GidType,
}

impl NetDevice {
    /// The GID table Linux rdma_rxe builds for this interface (`rdma link add rxe0 type rxe
    /// netdev NAME`), entry for entry.
    ///
    /// The order, as `roce_rescan_device` → `add_netdev_ips` in the kernel's
    /// `drivers/infiniband/core/roce_gid_mgmt.c` fills it:
    ///
    /// 1. index 0: the *default GID*, `fe80::/64` + the EUI-64 of the MAC (U/L bit flipped,
    ///    `ff:fe` in the middle: `make_default_gid` → `addrconf_ifid_eui48`). It is there
    ///    even when IPv6 is disabled on the interface (the lab guests: `fe80::5054:ff:fe77:1`
    ///    at index 0 with IPv6 off, see `shared/captures/guest-A-info.txt`);
    /// 2. the IPv4-mapped GID (`::ffff:a.b.c.d`) of each IPv4 address, in the interface's
    ///    address order (`enum_netdev_ipv4_ips`);
    /// 3. the GID of each IPv6 address, in the interface's address order
    ///    (`enum_netdev_ipv6_ips`), skipping any already in the table: `ib_cache_gid_add`
    ///    finds an identical GID and adds nothing. The usual EUI-64 link-local address is
    ///    therefore not repeated, but a link-local address made another way (stable privacy,
    ///    `addr_gen_mode` 2/3) gets an entry of its own, exactly as with rxe.
    ///
    /// Every entry is [`GidType::RoceV2`] (rxe in 6.1 has no RoCE v1).
    ///
    /// Without a MAC the kernel's EUI-64 helper fails and leaves the interface id zero, so
    /// index 0 is `fe80::`. `lo` has the all-zero MAC, which gives `fe80::200:ff:fe00:0`;
    /// its table is `fe80::200:ff:fe00:0`, `::ffff:127.0.0.1` (index 1), then `::1` when
    /// IPv6 is enabled. The layout (IPv4 GID at index 1 on a single-address interface) is
    /// therefore the same on `lo` as on a real NIC.
    ///
    /// This is the table right after the rxe device is created. Addresses added later take
    /// the first free slot in rxe, and removed ones leave holes; this function always
    /// returns the freshly built order. It has at most 256 entries (indexes are `u8`).
    pub fn gid_table(&self) -> Vec<GidEntry> {
        let mut gids: Vec<Gid> = vec![self.default_gid()];
        let v4 = self.ipv4.iter().map(|n| Gid::from(n.addr));
        let v6 = self.ipv6.iter().map(|n| Gid::from(n.addr));
        for gid in v4.chain(v6) {
            if !gids.contains(&gid) {
                gids.push(gid);
            }
        }
        gids.truncate(usize::from(u8::MAX) + 1);
        gids.into_iter()
            .enumerate()
            .map(|(i, gid)| GidEntry {
                // INVARIANT: truncated to 256 entries just above.
                index: u8::try_from(i).expect("GID table truncated to 256 entries"),
                gid,
                kind: GidType::RoceV2,
            })
            .collect()
    }

    /// The default GID (index 0): `fe80::` + EUI-64 of the MAC, `fe80::` without a MAC.
    pub fn default_gid(&self) -> Gid {
        match self.mac {
            Some(mac) => Gid::link_local_from_mac(mac),
            None => Gid::from(Ipv6Addr::new(0xFE80, 0, 0, 0, 0, 0, 0, 0)),
        }
    }

    /// The index of `ip`'s GID in [`Self::gid_table`], if the interface has that address.
    pub fn gid_index_of(&self, ip: IpAddr) -> Option<u8> {
        let gid = Gid::from_ip(ip);
        self.gid_table()
            .into_iter()
            .find(|e| e.gid == gid)
            .map(|e| e.index)
    }

    /// The first IPv4-mapped GID's index (what the lab's `lab-info gid` prints: 1 on an
    /// interface with one IPv4 address).
    pub fn ipv4_gid_index(&self) -> Option<u8> {
        self.gid_table()
            .into_iter()
            .find(|e| e.gid.is_ipv4_mapped())
            .map(|e| e.index)
    }

    /// Whether `ip` is one of this interface's addresses.
    pub fn has_addr(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.ipv4.iter().any(|n| n.addr == v4),
            IpAddr::V6(v6) => self.ipv6.iter().any(|n| n.addr == v6),
        }
    }

    /// All addresses, IPv4 first.
    pub fn addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let v4 = self.ipv4.iter().map(|n| IpAddr::V4(n.addr));
        v4.chain(self.ipv6.iter().map(|n| IpAddr::V6(n.addr)))
    }

    /// The MAC as `aa:bb:cc:dd:ee:ff` (`-` without one).
    pub fn mac_string(&self) -> String {
        match self.mac {
            Some(m) => format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
            None => "-".to_owned(),
        }
    }

    /// Whether 127.0.0.0/8-style local delivery covers `ip` on this interface: Linux
    /// delivers the whole prefix of an address on `lo` locally (`ip route show table local`:
    /// `local 127.0.0.0/8 dev lo`), so 127.0.0.2 works as a source without being configured.
    fn loopback_covers(&self, ip: IpAddr) -> bool {
        if !self.loopback {
            return false;
        }
        match ip {
            IpAddr::V4(v4) => self.ipv4.iter().any(|n| {
                let mask = prefix_mask_v4(n.prefix);
                u32::from(n.addr) & mask == u32::from(v4) & mask
            }),
            IpAddr::V6(_) => false,
        }
    }
}

impl fmt::Display for NetDevice {
    /// `ip addr`-like summary: `2: eth0 mtu 1500 UP,RUNNING mac 52:54:00:77:00:01
    /// 10.77.0.1/24 fe80::5054:ff:fe77:1/64 (link)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} mtu {}", self.index, self.name, self.mtu)?;
        let mut flags = Vec::new();
        if self.up {
            flags.push("UP");
        }
        if self.running {
            flags.push("RUNNING");
        }
        if self.loopback {
            flags.push("LOOPBACK");
        }
        if !flags.is_empty() {
            write!(f, " {}", flags.join(","))?;
        }
        write!(f, " mac {}", self.mac_string())?;
        for n in &self.ipv4 {
            write!(f, " {}/{}", n.addr, n.prefix)?;
        }
        for n in &self.ipv6 {
            write!(f, " {}/{} ({})", n.addr, n.prefix, n.scope)?;
        }
        Ok(())
    }
}

/// Why an interface could not be found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetdevError {
    /// No interface has that name.
    #[error("no network interface named {name:?} (interfaces: {})", available.join(", "))]
    NoSuchInterface {
        /// The name asked for.
        name: String,
        /// The interfaces that exist, by name.
        available: Vec<String>,
    },
    /// No interface has that address.
    #[error("no network interface has the address {addr} (addresses: {})", available.join(", "))]
    NoInterfaceForAddr {
        /// The address asked for.
        addr: IpAddr,
        /// `name=addr` for every address that exists.
        available: Vec<String>,
    },
    /// The interfaces could not be listed.
    #[error("cannot list the network interfaces: {0}")]
    Io(#[from] io::Error),
}

impl From<NetdevError> for io::Error {
    fn from(e: NetdevError) -> Self {
        match e {
            NetdevError::Io(e) => e,
            other => Self::new(io::ErrorKind::NotFound, other),
        }
    }
}

/// Every interface of the current network namespace, by index.
///
/// # Errors
/// `getifaddrs(3)` failed.
pub fn interfaces() -> io::Result<Vec<NetDevice>> {
    let mut devs: Vec<NetDevice> = Vec::new();
    for raw in sys::ifaddrs()? {
        let pos = match devs.iter().position(|d| d.name == raw.name) {
            Some(pos) => pos,
            None => {
                devs.push(NetDevice {
                    index: 0,
                    mac: None,
                    mtu: 0,
                    up: raw.flags & sys::IFF_UP != 0,
                    running: raw.flags & sys::IFF_RUNNING != 0,
                    loopback: raw.flags & sys::IFF_LOOPBACK != 0,
                    ipv4: Vec::new(),
                    ipv6: Vec::new(),
                    name: raw.name.clone(),
                });
                devs.len() - 1
            }
        };
        let dev = &mut devs[pos];
        match raw.addr {
            sys::RawAddr::Link { index, mac } => {
                dev.index = index;
                dev.mac = mac;
            }
            sys::RawAddr::V4 { addr, prefix } => dev.ipv4.push(Ipv4Net { addr, prefix }),
            sys::RawAddr::V6 { addr, prefix } => dev.ipv6.push(Ipv6Net {
                addr,
                prefix,
                scope: Ipv6Scope::of(addr),
            }),
        }
    }
    for dev in &mut devs {
        if dev.index == 0 {
            dev.index = sys::name_to_index(&dev.name).unwrap_or(0);
        }
        dev.mtu = sys::mtu(&dev.name).unwrap_or(0);
    }
    devs.sort_by_key(|d| d.index);
    Ok(devs)
}

/// The interface called `name`.
///
/// # Errors
/// [`NetdevError::NoSuchInterface`] (listing the interfaces that exist), or
/// [`NetdevError::Io`].
pub fn interface(name: &str) -> Result<NetDevice, NetdevError> {
    let all = interfaces()?;
    let available: Vec<String> = all.iter().map(|d| d.name.clone()).collect();
    all.into_iter()
        .find(|d| d.name == name)
        .ok_or_else(|| NetdevError::NoSuchInterface {
            name: name.to_owned(),
            available,
        })
}

/// The interface that has the address `ip`. A 127.0.0.0/8 address that is not configured
/// but is delivered locally through `lo`'s prefix (127.0.0.2 with `127.0.0.1/8` on `lo`)
/// maps to `lo`.
///
/// # Errors
/// [`NetdevError::NoInterfaceForAddr`] (listing the addresses that exist), or
/// [`NetdevError::Io`].
pub fn interface_for_addr(ip: IpAddr) -> Result<NetDevice, NetdevError> {
    let all = interfaces()?;
    if let Some(dev) = all.iter().find(|d| d.has_addr(ip)) {
        return Ok(dev.clone());
    }
    if let Some(dev) = all.iter().find(|d| d.loopback_covers(ip)) {
        return Ok(dev.clone());
    }
    let available = all
        .iter()
        .flat_map(|d| d.addrs().map(move |a| format!("{}={a}", d.name)))
        .collect();
    Err(NetdevError::NoInterfaceForAddr {
        addr: ip,
        available,
    })
}

/// The local address and interface the kernel would use to reach `peer`: connects a UDP
/// socket to it (no packet is sent), reads the source address the route chose
/// (`getsockname`) and finds its interface.
///
/// # Errors
/// No route to `peer` (`ENETUNREACH`), or the chosen source address belongs to no interface.
pub fn route_to(peer: IpAddr) -> io::Result<(IpAddr, NetDevice)> {
    let any: IpAddr = match peer {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
    sock.connect(SocketAddr::new(peer, 4_791))
        .map_err(|e| io::Error::new(e.kind(), format!("no route to {peer}: {e}")))?;
    let local = sock.local_addr()?.ip();
    let dev = interface_for_addr(local).map_err(io::Error::from)?;
    Ok((local, dev))
}

fn prefix_mask_v4(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

fn prefix_len(mask: &[u8]) -> u8 {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    // A mask has at most 128 bits.
    u8::try_from(ones).unwrap_or(u8::MAX)
}

/// The FFI: `getifaddrs`, `if_nametoindex`, `SIOCGIFMTU`. Every `unsafe` block is here.
mod sys {
    use std::io;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::os::fd::AsRawFd;

    use super::{prefix_len, CStr, CString};

    pub(super) const IFF_UP: u32 = libc::IFF_UP as u32;
    pub(super) const IFF_RUNNING: u32 = libc::IFF_RUNNING as u32;
    pub(super) const IFF_LOOPBACK: u32 = libc::IFF_LOOPBACK as u32;

    /// One `struct ifaddrs` entry, copied out.
    pub(super) struct RawIfaddr {
        pub(super) name: String,
        pub(super) flags: u32,
        pub(super) addr: RawAddr,
    }

    /// The address part of an entry we care about.
    pub(super) enum RawAddr {
        /// `AF_PACKET`: one per interface, with its index and hardware address.
        Link { index: u32, mac: Option<[u8; 6]> },
        /// `AF_INET`.
        V4 { addr: Ipv4Addr, prefix: u8 },
        /// `AF_INET6`.
        V6 { addr: Ipv6Addr, prefix: u8 },
    }

    /// Owns the list `getifaddrs` returned; frees it on drop.
    struct IfaddrsList(*mut libc::ifaddrs);

    impl Drop for IfaddrsList {
        fn drop(&mut self) {
            #[allow(unsafe_code)]
            // SAFETY: the pointer came from a successful getifaddrs and is freed only here.
            unsafe {
                libc::freeifaddrs(self.0);
            }
        }
    }

    /// Every entry of `getifaddrs(3)` with an address family we use, in the kernel's order.
    pub(super) fn ifaddrs() -> io::Result<Vec<RawIfaddr>> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        #[allow(unsafe_code)]
        // SAFETY: getifaddrs writes a list head into a valid out-pointer; on failure it
        // returns -1 and we do not touch `head`.
        let rc = unsafe { libc::getifaddrs(&mut head) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let list = IfaddrsList(head);
        let mut out = Vec::new();
        let mut cur = list.0;
        while !cur.is_null() {
            #[allow(unsafe_code)]
            // SAFETY: `cur` is a node of the list owned by `list`, alive until it drops.
            let ifa = unsafe { &*cur };
            cur = ifa.ifa_next;
            if let Some(entry) = copy_entry(ifa) {
                out.push(entry);
            }
        }
        Ok(out)
    }

    fn copy_entry(ifa: &libc::ifaddrs) -> Option<RawIfaddr> {
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            return None;
        }
        #[allow(unsafe_code)]
        // SAFETY: ifa_name is a NUL-terminated string owned by the live list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        #[allow(unsafe_code)]
        // SAFETY: ifa_addr is non-null and points at a sockaddr at least as large as
        // sa_family's.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_PACKET => {
                #[allow(unsafe_code)]
                // SAFETY: for AF_PACKET entries glibc stores a `sockaddr_ll`.
                let ll = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_ll>() };
                let mac = (ll.sll_halen == 6).then(|| {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&ll.sll_addr[..6]);
                    m
                });
                RawAddr::Link {
                    index: u32::try_from(ll.sll_ifindex).unwrap_or(0),
                    mac,
                }
            }
            libc::AF_INET => {
                #[allow(unsafe_code)]
                // SAFETY: for AF_INET entries the address is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                let prefix = if ifa.ifa_netmask.is_null() {
                    32
                } else {
                    #[allow(unsafe_code)]
                    // SAFETY: the netmask of an AF_INET entry is a `sockaddr_in`.
                    let m = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in>() };
                    prefix_len(&m.sin_addr.s_addr.to_ne_bytes())
                };
                RawAddr::V4 {
                    addr: Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                    prefix,
                }
            }
            libc::AF_INET6 => {
                #[allow(unsafe_code)]
                // SAFETY: for AF_INET6 entries the address is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                let prefix = if ifa.ifa_netmask.is_null() {
                    128
                } else {
                    #[allow(unsafe_code)]
                    // SAFETY: the netmask of an AF_INET6 entry is a `sockaddr_in6`.
                    let m = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in6>() };
                    prefix_len(&m.sin6_addr.s6_addr)
                };
                RawAddr::V6 {
                    addr: Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    prefix,
                }
            }
            _ => return None,
        };
        Some(RawIfaddr {
            name,
            flags: ifa.ifa_flags,
            addr,
        })
    }

    /// `if_nametoindex(3)`.
    pub(super) fn name_to_index(name: &str) -> Option<u32> {
        let c = CString::new(name).ok()?;
        #[allow(unsafe_code)]
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        (index != 0).then_some(index)
    }

    /// The interface MTU: `SIOCGIFMTU` on a socket of this network namespace, else
    /// `/sys/class/net/NAME/mtu` (which shows the namespace `/sys` was mounted in).
    pub(super) fn mtu(name: &str) -> Option<u32> {
        mtu_ioctl(name).or_else(|| {
            std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
    }

    fn mtu_ioctl(name: &str) -> Option<u32> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return None;
        }
        let sock = std::net::UdpSocket::bind("127.0.0.1:0")
            .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
            .ok()?;
        #[allow(unsafe_code)]
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        #[allow(unsafe_code)]
        // SAFETY: SIOCGIFMTU reads ifr_name and writes ifru_mtu of the live, properly sized
        // `req`; the fd is an open socket we own.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) };
        if rc != 0 {
            return None;
        }
        #[allow(unsafe_code)]
        // SAFETY: after a successful SIOCGIFMTU the union holds ifru_mtu.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        u32::try_from(mtu).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab_eth0(ipv6: &[(&str, u8)]) -> NetDevice {
        NetDevice {
            name: "eth0".into(),
            index: 2,
            mac: Some([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]),
            mtu: 1_500,
            up: true,
            running: true,
            loopback: false,
            ipv4: vec![Ipv4Net {
                addr: Ipv4Addr::new(10, 77, 0, 1),
                prefix: 24,
            }],
            ipv6: ipv6
                .iter()
                .map(|(a, p)| {
                    let addr: Ipv6Addr = a.parse().unwrap();
                    Ipv6Net {
                        addr,
                        prefix: *p,
                        scope: Ipv6Scope::of(addr),
                    }
                })
                .collect(),
        }
    }

    fn table(dev: &NetDevice) -> Vec<String> {
        dev.gid_table()
            .iter()
            .map(|e| format!("{} {} {}", e.index, e.gid, e.kind))
            .collect()
    }

    /// The lab guest with IPv6 disabled: exactly `ibv_devinfo -v` of
    /// `shared/captures/guest-A-info.txt` (GID[0] fe80::5054:ff:fe77:1, GID[1]
    /// ::ffff:10.77.0.1, both RoCE v2).
    #[test]
    fn gid_table_matches_rxe_on_the_lab_guest() {
        let dev = lab_eth0(&[]);
        assert_eq!(
            table(&dev),
            [
                "0 fe80::5054:ff:fe77:1 RoCE v2",
                "1 ::ffff:10.77.0.1 RoCE v2"
            ]
        );
        assert_eq!(dev.ipv4_gid_index(), Some(1));
        assert_eq!(dev.gid_index_of("10.77.0.1".parse().unwrap()), Some(1));
        assert_eq!(dev.gid_index_of("10.77.0.2".parse().unwrap()), None);
        assert_eq!(
            dev.gid_table()[1].gid,
            "::ffff:10.77.0.1".parse::<Gid>().unwrap()
        );
    }

    /// IPv6 on (`lab.ipv6=1 lab.ip6=fd77::1/64`): the kernel lists the global address
    /// before the link-local one; the EUI-64 link-local equals the default GID and is not
    /// repeated, so fd77::1 lands at index 2 as the lab README says.
    #[test]
    fn gid_table_with_ipv6_skips_the_duplicate_link_local() {
        let dev = lab_eth0(&[("fd77::1", 64), ("fe80::5054:ff:fe77:1", 64)]);
        assert_eq!(
            table(&dev),
            [
                "0 fe80::5054:ff:fe77:1 RoCE v2",
                "1 ::ffff:10.77.0.1 RoCE v2",
                "2 fd77::1 RoCE v2"
            ]
        );
        assert_eq!(dev.ipv6[0].scope, Ipv6Scope::Global);
        assert_eq!(dev.ipv6[1].scope, Ipv6Scope::Link);
    }

    /// A stable-privacy link-local address is a different GID: rxe adds it, so do we.
    #[test]
    fn gid_table_keeps_a_non_eui64_link_local() {
        let dev = lab_eth0(&[("fe80::1234:5678:9abc:def0", 64)]);
        assert_eq!(
            table(&dev)[2],
            "2 fe80::1234:5678:9abc:def0 RoCE v2".to_owned()
        );
    }

    #[test]
    fn gid_table_several_ipv4_then_ipv6_in_kernel_order() {
        let mut dev = lab_eth0(&[("2001:db8::5", 64)]);
        dev.ipv4.push(Ipv4Net {
            addr: Ipv4Addr::new(192, 168, 1, 9),
            prefix: 24,
        });
        assert_eq!(
            table(&dev),
            [
                "0 fe80::5054:ff:fe77:1 RoCE v2",
                "1 ::ffff:10.77.0.1 RoCE v2",
                "2 ::ffff:192.168.1.9 RoCE v2",
                "3 2001:db8::5 RoCE v2"
            ]
        );
    }

    #[test]
    fn gid_table_without_mac_or_addresses() {
        let mut dev = lab_eth0(&[]);
        dev.mac = None;
        dev.ipv4.clear();
        assert_eq!(table(&dev), ["0 fe80:: RoCE v2"]);
        assert_eq!(dev.ipv4_gid_index(), None);
        dev.mac = Some([0; 6]);
        assert_eq!(table(&dev), ["0 fe80::200:ff:fe00:0 RoCE v2"]);
    }

    #[test]
    fn gid_table_is_capped_at_256_entries() {
        let mut dev = lab_eth0(&[]);
        dev.ipv4 = (0..300u32)
            .map(|i| Ipv4Net {
                addr: Ipv4Addr::from(0x0A00_0000 + i),
                prefix: 8,
            })
            .collect();
        let t = dev.gid_table();
        assert_eq!(t.len(), 256);
        assert_eq!(t[255].index, 255);
    }

    #[test]
    fn scopes_and_prefixes() {
        assert_eq!(Ipv6Scope::of(Ipv6Addr::LOCALHOST), Ipv6Scope::Host);
        assert_eq!(Ipv6Scope::of("fe80::1".parse().unwrap()), Ipv6Scope::Link);
        assert_eq!(Ipv6Scope::of("febf::1".parse().unwrap()), Ipv6Scope::Link);
        assert_eq!(Ipv6Scope::of("fec0::1".parse().unwrap()), Ipv6Scope::Site);
        assert_eq!(Ipv6Scope::of("fd77::1".parse().unwrap()), Ipv6Scope::Global);
        assert_eq!(prefix_len(&[255, 255, 255, 0]), 24);
        assert_eq!(prefix_len(&[0; 16]), 0);
        assert_eq!(prefix_len(&[255; 16]), 128);
        assert_eq!(prefix_mask_v4(8), 0xFF00_0000);
        assert_eq!(prefix_mask_v4(0), 0);
        assert_eq!(prefix_mask_v4(32), u32::MAX);
    }

    #[test]
    fn display_is_ip_addr_like() {
        let dev = lab_eth0(&[("fe80::5054:ff:fe77:1", 64)]);
        assert_eq!(
            dev.to_string(),
            "2: eth0 mtu 1500 UP,RUNNING mac 52:54:00:77:00:01 10.77.0.1/24 \
             fe80::5054:ff:fe77:1/64 (link)"
        );
    }

    /// The real `lo` of this network namespace.
    #[test]
    fn real_loopback() {
        let lo = interface("lo").expect("every network namespace has lo");
        assert!(lo.loopback, "{lo}");
        assert!(lo.up, "{lo}");
        assert_eq!(lo.mac, Some([0; 6]), "{lo}");
        assert!(lo.index >= 1, "{lo}");
        assert!(lo.mtu >= 1_500, "{lo}");
        assert!(
            lo.ipv4.contains(&Ipv4Net {
                addr: Ipv4Addr::LOCALHOST,
                prefix: 8
            }),
            "{lo}"
        );
        let t = lo.gid_table();
        assert_eq!(t[0].gid, "fe80::200:ff:fe00:0".parse::<Gid>().unwrap());
        assert_eq!(t[1].gid, Gid::from(Ipv4Addr::LOCALHOST));
        assert_eq!(lo.ipv4_gid_index(), Some(1));
        if lo.ipv6.iter().any(|n| n.addr == Ipv6Addr::LOCALHOST) {
            assert_eq!(t.last().unwrap().gid, Gid::from(Ipv6Addr::LOCALHOST));
            assert_eq!(lo.ipv6[0].scope, Ipv6Scope::Host);
        }

        let all = interfaces().unwrap();
        assert!(all.windows(2).all(|w| w[0].index < w[1].index));
        assert_eq!(
            interface_for_addr(Ipv4Addr::LOCALHOST.into()).unwrap().name,
            "lo"
        );
        // 127.0.0.2 is not configured, but lo's /8 delivers it locally.
        assert_eq!(
            interface_for_addr(Ipv4Addr::new(127, 0, 0, 2).into())
                .unwrap()
                .name,
            "lo"
        );
        let (local, dev) = route_to(Ipv4Addr::new(127, 0, 0, 2).into()).unwrap();
        assert_eq!(local, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(dev.name, "lo");
    }

    #[test]
    fn errors_list_what_exists() {
        let err = interface("no-such-if0").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("no network interface named \"no-such-if0\" (interfaces: "),
            "{msg}"
        );
        assert!(msg.contains("lo"), "{msg}");

        let err = interface_for_addr("192.0.2.77".parse().unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("192.0.2.77"), "{msg}");
        assert!(msg.contains("lo=127.0.0.1"), "{msg}");
        let io: io::Error = err.into();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
    }
}
