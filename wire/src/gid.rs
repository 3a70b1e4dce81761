//! Global identifiers: the 16-byte addresses RoCEv2 puts in GID tables and address vectors.
//!
//! A RoCEv2 GID is an IPv6 address; an IPv4 address a.b.c.d is carried as the IPv4-mapped form
//! `::ffff:a.b.c.d` (rdma-core `ib_addr.h`, rxe `rxe_av.c`). The link-local GID rxe puts at
//! index 0 is `fe80::/64` with the EUI-64 interface id made from the MAC.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

use crate::ParseError;

/// A 16-byte GID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty GID table slot).
    pub const ZERO: Self = Self([0; 16]);

    /// The GID of an IP address: IPv4-mapped for IPv4, the address itself for IPv6.
    pub const fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Self(v6.octets()),
        }
    }

    /// The IP address a GID stands for (rdma-core `rdma_gid2ip`): IPv4 for a v4-mapped GID,
    /// IPv6 otherwise.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// Whether this is an IPv4-mapped GID.
    pub fn is_ipv4_mapped(self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// The link-local GID made from a MAC address (fe80::/64 + EUI-64 with the U/L bit
    /// flipped), as rxe places at GID index 0.
    pub const fn link_local_from_mac(mac: [u8; 6]) -> Self {
        Self([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            mac[0] ^ 0x02,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ])
    }

    /// The 32-hex-digit form used by `ibv_rc_pingpong`'s out-of-band exchange
    /// (`00000000000000000000ffff0a4d0001`).
    pub fn to_hex(self) -> HexGid {
        HexGid(self)
    }

    /// Parses the 32-hex-digit form.
    ///
    /// # Errors
    /// `BadFrame` if the text is not exactly 32 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, ParseError> {
        let b = text.as_bytes();
        if b.len() != 32 {
            return Err(ParseError::BadFrame);
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            let hi = hex_val(b[2 * i]).ok_or(ParseError::BadFrame)?;
            let lo = hex_val(b[2 * i + 1]).ok_or(ParseError::BadFrame)?;
            *byte = (hi << 4) | lo;
        }
        Ok(Self(out))
    }
}

const fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Displays a GID as 32 hex digits.
#[derive(Clone, Copy, Debug)]
pub struct HexGid(Gid);

impl fmt::Display for HexGid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 .0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Self {
        Self::from_ip(ip)
    }
}
impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Self {
        Self::from_ip(IpAddr::V4(ip))
    }
}
impl From<Ipv6Addr> for Gid {
    fn from(ip: Ipv6Addr) -> Self {
        Self::from_ip(IpAddr::V6(ip))
    }
}

impl FromStr for Gid {
    type Err = core::net::AddrParseError;
    /// Parses the IPv6 text form (`fe80::1`, `::ffff:10.0.0.1`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(Ipv6Addr::from_str(s)?.octets()))
    }
}

/// The IPv6 text form, like `ibv_devinfo -v` prints GIDs.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always the v6 notation; v4-mapped ones print as ::ffff:a.b.c.d.
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped() {
        let g = Gid::from(Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(g.to_hex().to_string(), "00000000000000000000ffff0a4d0001");
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)));
        assert_eq!(g.to_string(), "::ffff:10.77.0.1");
        assert_eq!(
            Gid::from_hex("00000000000000000000ffff0a4d0001").unwrap(),
            g
        );
        assert!(Gid::from_hex("00000000000000000000ffff0a4d000").is_err());
        assert!(Gid::from_hex("00000000000000000000ffff0a4d000g").is_err());
    }

    #[test]
    fn ipv6_and_link_local() {
        let g: Gid = "fd77::1".parse().unwrap();
        assert!(!g.is_ipv4_mapped());
        assert_eq!(g.to_ip(), IpAddr::V6("fd77::1".parse().unwrap()));
        let ll = Gid::link_local_from_mac([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]);
        assert_eq!(ll.to_string(), "fe80::5054:ff:fe77:1");
    }
}
