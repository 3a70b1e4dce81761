//! Device and port attributes (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`).

use std::net::SocketAddr;

use roce_qp::verbs::Mtu;
use roce_wire::Gid;

use super::Device;
use crate::netdev::{GidEntry, GidType};

/// Device attributes (`ibv_query_device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Device name.
    pub name: String,
    /// Backend (`udp`, `raw`, `sim`...).
    pub backend: &'static str,
    /// Node GUID (EUI-64 from the MAC, as rxe).
    pub node_guid: u64,
    /// Most QPs.
    pub max_qp: u32,
    /// Most WRs per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Outstanding READ/atomic requests per QP, as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic requests per QP, as requester.
    pub max_qp_init_rd_atom: u32,
    /// Atomics are atomic with respect to this device only (IBV_ATOMIC_HCA).
    pub atomic_cap: &'static str,
    /// Extended capabilities (`ibv_device_attr_ex.device_cap_flags_ex`).
    pub device_cap_flags_ex: DeviceCapFlagsEx,
}

/// Extended device capability flags (`ibv_device_attr_ex.device_cap_flags_ex`): the bits of
/// `enum ib_uverbs_device_cap_flags` in rdma-core's `kernel-headers/rdma/ib_user_verbs.h`
/// (Linux `include/uapi/rdma/ib_user_verbs.h`), of which the device reports those it
/// implements beyond the IBTA 1.4 base.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceCapFlagsEx(u64);

impl DeviceCapFlagsEx {
    /// No extended capability.
    pub const EMPTY: Self = Self(0);
    /// FLUSH with placement type global visibility (`IB_UVERBS_DEVICE_FLUSH_GLOBAL`).
    pub const FLUSH_GLOBAL: Self = Self(1 << 38);
    /// FLUSH with placement type persistence (`IB_UVERBS_DEVICE_FLUSH_PERSISTENT`).
    pub const FLUSH_PERSISTENT: Self = Self(1 << 39);
    /// ATOMIC WRITE (`IB_UVERBS_DEVICE_ATOMIC_WRITE`).
    pub const ATOMIC_WRITE: Self = Self(1 << 40);

    /// The flags with the names `ibv_devinfo -v` prints for them, in bit order.
    const NAMED: [(Self, &'static str); 3] = [
        (Self::FLUSH_GLOBAL, "FLUSH_GLOBAL"),
        (Self::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
        (Self::ATOMIC_WRITE, "ATOMIC_WRITE"),
    ];

    /// The raw value, as `device_cap_flags_ex`.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of flags.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The names of the flags set, in bit order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED
            .into_iter()
            .filter(move |(f, _)| self.contains(*f))
            .map(|(_, name)| name)
    }
}

impl std::ops::BitOr for DeviceCapFlagsEx {
    type Output = Self;

    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// Port state (`ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Up.
    Active,
}

/// Port attributes (`ibv_query_port`, port 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// State.
    pub state: PortState,
    /// Largest path MTU the interface allows.
    pub max_mtu: Mtu,
    /// Path MTU in use.
    pub active_mtu: Mtu,
    /// The interface's IP MTU.
    pub ip_mtu: usize,
    /// GID table entries.
    pub gid_tbl_len: usize,
    /// Link layer.
    pub link_layer: &'static str,
    /// Local IP address and UDP port.
    pub local: SocketAddr,
    /// The network interface the device sends through (`None` on `sim`).
    pub netdev: Option<String>,
}

impl Device {
    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let s = self.shared();
        let m = s.mac;
        let guid = u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]]);
        DeviceAttr {
            name: s.name.clone(),
            backend: s.backend,
            node_guid: guid,
            max_qp: 0x00FF_FFFF - 0x11,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cqe: 1 << 20,
            max_mr: s.table.capacity(),
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            atomic_cap: "ATOMIC_HCA",
            // The queue pairs execute and issue ATOMIC WRITE and FLUSH of both placement
            // types (IBTA 1.5 annex A19; qp/tests/atomic_write_flush.rs), as rxe since 6.2.
            device_cap_flags_ex: DeviceCapFlagsEx::FLUSH_GLOBAL
                | DeviceCapFlagsEx::FLUSH_PERSISTENT
                | DeviceCapFlagsEx::ATOMIC_WRITE,
        }
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        let s = self.shared();
        PortAttr {
            state: PortState::Active,
            max_mtu: s.max_mtu,
            active_mtu: s.mtu,
            ip_mtu: s.ip_mtu,
            gid_tbl_len: s.gids.len(),
            link_layer: "Ethernet",
            local: s.local,
            netdev: s.netdev.clone(),
        }
    }

    /// The GID table (every entry is RoCE v2).
    pub fn gid_table(&self) -> Vec<GidEntry> {
        self.shared()
            .gids
            .iter()
            .enumerate()
            .map(|(i, g)| GidEntry {
                index: i as u8,
                gid: *g,
                kind: GidType::RoceV2,
            })
            .collect()
    }

    /// `ibv_query_gid`.
    ///
    /// # Errors
    /// [`crate::VerbsError::NoSuchGid`] for an index past the table.
    pub fn gid(&self, index: u8) -> Result<Gid, crate::VerbsError> {
        self.shared()
            .gids
            .get(usize::from(index))
            .copied()
            .ok_or(crate::VerbsError::NoSuchGid {
                index,
                len: self.shared().gids.len(),
            })
    }

    /// The index of our IP address's GID in the table (what `-g`/`-x` should select).
    pub fn local_gid_index(&self) -> Option<u8> {
        let gid = self.local_gid();
        self.shared()
            .gids
            .iter()
            .position(|g| *g == gid)
            .map(|i| i as u8)
    }

    /// The GID of our IP address (what peers put in their address handles).
    pub fn local_gid(&self) -> Gid {
        Gid::from_ip(self.shared().local.ip())
    }
}

#[cfg(test)]
mod cap_tests {
    use super::DeviceCapFlagsEx;

    /// The values of rdma-core's kernel-headers/rdma/ib_user_verbs.h.
    #[test]
    fn extended_capability_bits_are_rdma_cores() {
        assert_eq!(DeviceCapFlagsEx::FLUSH_GLOBAL.bits(), 0x0040_0000_0000);
        assert_eq!(DeviceCapFlagsEx::FLUSH_PERSISTENT.bits(), 0x0080_0000_0000);
        assert_eq!(DeviceCapFlagsEx::ATOMIC_WRITE.bits(), 0x0100_0000_0000);
        let all = DeviceCapFlagsEx::ATOMIC_WRITE | DeviceCapFlagsEx::FLUSH_GLOBAL;
        assert_eq!(
            all.names().collect::<Vec<_>>(),
            ["FLUSH_GLOBAL", "ATOMIC_WRITE"]
        );
        assert!(!all.contains(DeviceCapFlagsEx::FLUSH_PERSISTENT));
        assert_eq!(DeviceCapFlagsEx::EMPTY.names().count(), 0);
    }
}
