//! Kernel demultiplexing by destination QPN: several processes share one `IP:4791`, and the
//! kernel hands each datagram to the process that owns its destination QP.
//!
//! # How
//!
//! Every member process binds its own UDP socket to the same `IP:4791` with `SO_REUSEPORT`,
//! which makes the sockets one *reuseport group*. A `BPF_PROG_TYPE_SK_REUSEPORT` program
//! attached to the group picks the socket for each datagram: it reads the BTH DestQP (UDP
//! payload bytes 4..8, low 24 bits), computes a *slot* `DestQP >> shift` ([`SlotLayout`]) and
//! selects the socket stored at that slot of a `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY` map. A slot
//! with no socket, or a datagram too short to hold a BTH, is **dropped** (`SK_DROP`): a
//! datagram for a QPN nobody owns never reaches another member. When a member's socket closes
//! (the process exits or is killed) the kernel removes it from the map, so its slot's
//! datagrams are dropped from then on.
//!
//! Each member's QPNs come from its slot's range ([`SlotLayout::range`]), so the program
//! needs no per-QP state and the members need no coordination beyond who holds which slot
//! (the daemon's job). The program is 24 hand-assembled eBPF instructions ([`program`], each
//! documented); no compiler, libbpf or BTF is involved.
//!
//! ```text
//!   daemon (CAP_BPF, once)                     client process (no privilege)
//!   DemuxGroup::create(layout)  --map, prog fds over SCM_RIGHTS, slot-->  DemuxGroup::from_fds
//!                                                                          Demux::new(group, slot)
//!                                                                          DeviceConfig::udp(ip).demux(..)
//!                                              socket(SO_REUSEPORT) -> bind IP:4791
//!                                              -> SO_ATTACH_REUSEPORT_EBPF(prog) -> map[slot] = socket
//! ```
//!
//! # For the daemon
//!
//! - Once per address (per network namespace): `DemuxGroup::create(SlotLayout::DEFAULT)`, then
//!   [`DemuxGroup::pin`] it in a BPF filesystem (or keep the two descriptors in systemd's fd
//!   store) and, after a restart, [`DemuxGroup::open_pinned`]. Every member of an address must
//!   use this one group: a member attaching another group's program would replace the
//!   address's steering and strand the others.
//! - Per client: pick a free slot (keep slot 0, which holds QP1, for yourself; never hand out
//!   a slot within its quarantine after its owner died), send `map_fd()` and `prog_fd()` with
//!   `SCM_RIGHTS` plus the slot and the layout's shift. The client calls
//!   `DemuxGroup::from_fds(map, prog, SlotLayout::new(shift)?)`, `Demux::new(group, slot)` and
//!   `Device::open(DeviceConfig::udp(ip).demux(demux))`.
//! - [`DemuxGroup::occupant`] tells whether a slot's socket still exists (the kernel empties
//!   the slot when the socket closes, so ~1 ms after a `kill -9`); [`DemuxGroup::vacate`]
//!   evicts.
//! - Only processes of the uid that owns the address's sockets can join; refuse kernel demux
//!   to clients of other uids up front (SO_PEERCRED) and offer forwarding
//!   ([`super::fwdring`]).
//!
//! # Rules the data path keeps (measured in `design/daemon.md` §5.5)
//!
//! - **No GSO run mixes destination QPNs.** A UDP GSO message over loopback reaches the
//!   receiver as one packet and the program sees only its first segment: every segment went
//!   to the first one's owner. So in demux mode the `udp` backend cuts a GSO run at every
//!   change of BTH DestQP.
//! - **`UDP_GRO` with a relay off loopback.** NAPI GRO (a NIC's, or a veth's when GRO or XDP
//!   is on) looks the socket up without the program (`udp4_gro_lookup_skb` passes no skb, so
//!   the group picks a member by hash), merges the datagrams of one UDP flow by ports if
//!   *that* member has `UDP_GRO`, and the merged buffer then goes to the owner of its first
//!   datagram: one UD QP of a peer sending to two members' QPs is one flow, and so is all the
//!   traffic of a peer host whose processes share one address. So a member off loopback opens
//!   through [`super::relay`]: it keeps `UDP_GRO` and hands every datagram of another slot
//!   that GRO merged into its buffers on to that slot's member (a Unix connection between
//!   the two; a buffer's first datagram is always the receiver's own). Without it a member
//!   gets one datagram per receive and the kernel cuts each GSO message from a same-host
//!   sender: a pair over a veth ran at ~0.68× an exclusive one. When the relay cannot be set
//!   up (its directory is not safe) the member leaves GRO off ([`super::udp::UdpDatapath::bind_demux`]).
//!   A loopback address keeps `UDP_GRO` without a relay: loopback delivers through
//!   `netif_rx`, where no NAPI GRO runs, so the only multi-datagram packets there are a local
//!   sender's GSO messages, which never mix destination QPs (the rule above).
//! - **No raw receive.** A raw IP socket sees every datagram to the address, everybody's; in
//!   demux mode the `udp` backend receives on its UDP socket only (so the IPv4 ICRC check
//!   recovers the Identification, see [`super`]).
//!
//! # Isolation: one trust domain only
//!
//! The kernel lets only sockets of one user (the socket owner's uid) form a reuseport group:
//! a process of another uid cannot join and gets a clear error
//! ([`super::udp::UdpError::DemuxOtherUser`]). Within a group, a member can take others' datagrams: it can detach or
//! replace the group's program (`SO_DETACH_REUSEPORT_BPF`, `SO_ATTACH_REUSEPORT_CBPF`),
//! `connect()` its socket to a peer, and with the map descriptor it can put its socket in any
//! slot. So kernel demux is for the processes of one user (one job); hosts shared by several
//! users need the forwarding mode, where the daemon receives and delivers.
//!
//! # Privileges
//!
//! Creating the map and loading the program ([`DemuxGroup::create`]) need `CAP_BPF` and
//! `CAP_NET_ADMIN` (root). Joining ([`DemuxGroup::join`]) needs only the two descriptors:
//! attaching a loaded program to one's own socket and updating the map are not privileged.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::ids::{MAX_QPN, MIN_QPN};

// ------------------------------------------------------------------ kernel ABI (linux/bpf.h) --

/// `bpf(2)` commands.
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_OBJ_PIN: libc::c_int = 6;
const BPF_OBJ_GET: libc::c_int = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
/// `enum bpf_map_type`.
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
/// `enum bpf_prog_type`.
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
/// `enum bpf_attach_type`.
const BPF_SK_REUSEPORT_SELECT: u32 = 39;
/// Map update flags.
const BPF_NOEXIST: u64 = 1;
/// Helper function IDs (`enum bpf_func_id`).
const BPF_FUNC_SKB_LOAD_BYTES: i32 = 26;
const BPF_FUNC_SK_SELECT_REUSEPORT: i32 = 82;
/// `ld_imm64` source register meaning "imm is a map descriptor".
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `enum sk_action`.
const SK_DROP: i32 = 0;
const SK_PASS: i32 = 1;
/// `SO_ATTACH_REUSEPORT_EBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// Instruction classes, sizes, modes, sources and operations (linux/bpf_common.h, bpf.h).
mod op {
    pub(super) const LD: u8 = 0x00;
    pub(super) const LDX: u8 = 0x01;
    pub(super) const STX: u8 = 0x03;
    pub(super) const ALU: u8 = 0x04;
    pub(super) const JMP: u8 = 0x05;
    pub(super) const ALU64: u8 = 0x07;
    pub(super) const W: u8 = 0x00;
    pub(super) const DW: u8 = 0x18;
    pub(super) const IMM: u8 = 0x00;
    pub(super) const MEM: u8 = 0x60;
    pub(super) const K: u8 = 0x00;
    pub(super) const X: u8 = 0x08;
    pub(super) const ADD: u8 = 0x00;
    pub(super) const AND: u8 = 0x50;
    pub(super) const RSH: u8 = 0x70;
    pub(super) const MOV: u8 = 0xb0;
    pub(super) const END: u8 = 0xd0;
    /// With `END`: convert to big-endian (a byte swap on a little-endian host).
    pub(super) const TO_BE: u8 = 0x08;
    pub(super) const JNE: u8 = 0x50;
    pub(super) const CALL: u8 = 0x80;
    pub(super) const EXIT: u8 = 0x90;
}

/// Registers: r0 return value, r1..r5 arguments (clobbered by calls), r6..r9 callee-saved,
/// r10 the read-only frame pointer.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const FP: u8 = 10;

/// Where the BTH's second word (a reserved byte, then the 24-bit DestQP) starts in what the
/// program reads: the UDP header (8 bytes), then BTH bytes 0..4.
const DESTQP_WORD_OFFSET: i32 = 8 + 4;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    /// `dst_reg:4, src_reg:4`, a C bitfield: its order follows the byte order.
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        #[cfg(target_endian = "little")]
        let regs = (src << 4) | (dst & 0x0f);
        #[cfg(target_endian = "big")]
        let regs = (dst << 4) | (src & 0x0f);
        Self {
            code,
            regs,
            off,
            imm,
        }
    }

    /// The opcode byte.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// The jump or memory offset.
    pub fn off(&self) -> i16 {
        self.off
    }

    /// The immediate.
    pub fn imm(&self) -> i32 {
        self.imm
    }
}

/// The steering program for a map at descriptor `map_fd` and slots of `1 << shift` QPNs.
/// The comment on each line says what it does; the whole is what
/// `design/daemon-study/qpdemux.c` measured, reading the full DestQP instead of one byte.
pub fn program(map_fd: RawFd, layout: SlotLayout) -> Vec<Insn> {
    use op::*;
    let i = Insn::new;
    vec![
        // 0: r6 = r1. Keep the context (`struct sk_reuseport_md *`): calls clobber r1..r5.
        i(ALU64 | MOV | X, R6, R1, 0, 0),
        // 1: r2 = 12, the offset to read: UDP header (8) + BTH bytes 0..4; the context's data
        // starts at the UDP header.
        i(ALU64 | MOV | K, R2, 0, 0, DESTQP_WORD_OFFSET),
        // 2-3: r3 = fp - 4, a 4-byte stack buffer to copy into.
        i(ALU64 | MOV | X, R3, FP, 0, 0),
        i(ALU64 | ADD | K, R3, 0, 0, -4),
        // 4: r4 = 4 bytes.
        i(ALU64 | MOV | K, R4, 0, 0, 4),
        // 5: r0 = bpf_skb_load_bytes(ctx, 12, fp - 4, 4).
        i(JMP | CALL, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES),
        // 6: failed (datagram shorter than 8 + 8 bytes: no BTH) -> 22, drop.
        i(JMP | JNE | K, R0, 0, 15, 0),
        // 7: r1 = the 32-bit word as loaded (network byte order in memory).
        i(LDX | MEM | W, R1, FP, -4, 0),
        // 8: r1 = be32(r1): the word's value (a byte swap on little-endian hosts).
        i(ALU | END | TO_BE, R1, 0, 0, 32),
        // 9: r1 &= 0xFF_FFFF: DestQP (the top byte is reserved).
        i(ALU64 | AND | K, R1, 0, 0, 0x00FF_FFFF),
        // 10: r1 >>= shift: the slot.
        i(ALU64 | RSH | K, R1, 0, 0, layout.shift as i32),
        // 11: *(u32 *)(fp - 8) = r1: the map key.
        i(STX | MEM | W, FP, R1, -8, 0),
        // 12: r1 = ctx.
        i(ALU64 | MOV | X, R1, R6, 0, 0),
        // 13-14: r2 = the map (a 16-byte `ld_imm64`; the loader turns the descriptor into the
        // map's address).
        i(LD | DW | IMM, R2, BPF_PSEUDO_MAP_FD, 0, map_fd),
        i(0, 0, 0, 0, 0),
        // 15-16: r3 = fp - 8, the key.
        i(ALU64 | MOV | X, R3, FP, 0, 0),
        i(ALU64 | ADD | K, R3, 0, 0, -8),
        // 17: r4 = 0, flags.
        i(ALU64 | MOV | K, R4, 0, 0, 0),
        // 18: r0 = bpf_sk_select_reuseport(ctx, map, &key, 0).
        i(JMP | CALL, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT),
        // 19: no socket in that slot (or slot past the map's end, or a socket of another
        // group) -> 22, drop.
        i(JMP | JNE | K, R0, 0, 2, 0),
        // 20-21: return SK_PASS: deliver to the selected socket.
        i(ALU64 | MOV | K, R0, 0, 0, SK_PASS),
        i(JMP | EXIT, 0, 0, 0, 0),
        // 22-23: return SK_DROP: nobody gets it (never another member by hash).
        i(ALU64 | MOV | K, R0, 0, 0, SK_DROP),
        i(JMP | EXIT, 0, 0, 0, 0),
    ]
}

// ------------------------------------------------------------------ slots --

/// How QPNs map to slots: slot = QPN >> `shift`, so each slot owns `1 << shift` consecutive
/// QPNs and there are `1 << (24 - shift)` slots.
///
/// Slot 0 holds the special QPNs 0 and 1 (SMI, GSI: connection management); a daemon keeps
/// it for itself and hands out slots from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    shift: u8,
}

impl SlotLayout {
    /// 256 slots of 65 536 QPNs (slot = the DestQP's top byte, as the study's program).
    pub const DEFAULT: Self = Self { shift: 16 };

    /// Slots of `1 << shift` QPNs, `shift` in 8..=20 (65 536 to 16 slots).
    ///
    /// # Errors
    /// [`DemuxError::BadLayout`] outside that range.
    pub fn new(shift: u8) -> Result<Self, DemuxError> {
        if !(8..=20).contains(&shift) {
            return Err(DemuxError::BadLayout { shift });
        }
        Ok(Self { shift })
    }

    /// QPN bits per slot.
    pub fn shift(&self) -> u8 {
        self.shift
    }

    /// How many slots.
    pub fn slots(&self) -> u32 {
        1 << (24 - u32::from(self.shift))
    }

    /// The slot of `qpn`.
    pub fn slot_of(&self, qpn: u32) -> u32 {
        (qpn & 0x00FF_FFFF) >> self.shift
    }

    /// The QPNs a member in `slot` hands out: the slot's QPNs without the reserved ones (0
    /// to 0xF, and the multicast QPN 0xFF_FFFF). `None` if there is no such slot.
    pub fn range(&self, slot: u32) -> Option<RangeInclusive<u32>> {
        if slot >= self.slots() {
            return None;
        }
        let lo = (slot << self.shift).max(MIN_QPN);
        let hi = ((slot << self.shift) | ((1 << self.shift) - 1)).min(MAX_QPN);
        Some(lo..=hi)
    }
}

impl Default for SlotLayout {
    fn default() -> Self {
        Self::DEFAULT
    }
}

// ------------------------------------------------------------------ errors --

/// Why kernel demux could not be set up or joined.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemuxError {
    /// The slot layout asked for is not supported.
    #[error("kernel demux: {shift} QPN bits per slot is not supported (8..=20)")]
    BadLayout {
        /// The shift asked for.
        shift: u8,
    },
    /// The slot does not exist in the layout.
    #[error("kernel demux: slot {slot} does not exist (the group has {slots} slots)")]
    NoSuchSlot {
        /// The slot asked for.
        slot: u32,
        /// Slots in the layout.
        slots: u32,
    },
    /// Creating the map or loading the program was refused for lack of privilege.
    #[error(
        "kernel demux: {what} needs CAP_BPF and CAP_NET_ADMIN (run the daemon as root): {source}"
    )]
    NoPrivilege {
        /// What was refused.
        what: &'static str,
        /// What the system said.
        source: io::Error,
    },
    /// The kernel refused the program (its verifier log follows).
    #[error("kernel demux: the kernel refused the steering program: {source}\n{log}")]
    Rejected {
        /// What the system said.
        source: io::Error,
        /// The verifier's log.
        log: String,
    },
    /// A descriptor handed over is not what kernel demux needs.
    #[error("kernel demux: the {what} descriptor is not usable: {why}")]
    BadDescriptor {
        /// Which descriptor (`map`, `program`).
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Another member's socket already holds the slot.
    #[error(
        "kernel demux: slot {slot} is already taken by another socket (a live member owns \
         those QPNs; ask the daemon for another slot)"
    )]
    SlotTaken {
        /// The slot.
        slot: u32,
    },
    /// Another system call failed.
    #[error("kernel demux: {op}: {source}")]
    Io {
        /// The step that failed.
        op: &'static str,
        /// What the system said.
        source: io::Error,
    },
}

// ------------------------------------------------------------------ group --

/// The kernel objects of one demux group: the `REUSEPORT_SOCKARRAY` map and the steering
/// program that reads it. A daemon creates them once ([`DemuxGroup::create`]) and passes
/// both descriptors to each client ([`DemuxGroup::map_fd`], [`DemuxGroup::prog_fd`], over a
/// Unix socket with `SCM_RIGHTS`); a client rebuilds the group from them
/// ([`DemuxGroup::from_fds`]) and joins with its socket ([`DemuxGroup::join`], which the
/// `udp` backend does when the device is opened with a [`Demux`]).
///
/// The objects live as long as a descriptor or an attached group refers to them: a daemon
/// that exits does not disturb its clients' established traffic.
#[derive(Debug)]
pub struct DemuxGroup {
    map: OwnedFd,
    prog: OwnedFd,
    layout: SlotLayout,
}

impl DemuxGroup {
    /// Creates the map (one entry per slot) and loads the steering program.
    ///
    /// # Errors
    /// [`DemuxError::NoPrivilege`] without `CAP_BPF`/`CAP_NET_ADMIN`, [`DemuxError::Rejected`]
    /// if the kernel refuses the program (with the verifier's log), [`DemuxError::Io`].
    pub fn create(layout: SlotLayout) -> Result<Self, DemuxError> {
        let privileged = |what: &'static str| {
            move |source: io::Error| match source.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => DemuxError::NoPrivilege { what, source },
                _ => DemuxError::Io { op: what, source },
            }
        };
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_REUSEPORT_SOCKARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: layout.slots(),
            map_name: name16("rocectl_demux"),
            ..MapCreateAttr::default()
        };
        let map = bpf_fd(BPF_MAP_CREATE, &mut attr).map_err(privileged("creating the map"))?;
        let insns = program(map.as_raw_fd(), layout);
        let prog = load_program(&insns).map_err(|(source, log)| {
            if log.is_empty() {
                privileged("loading the program")(source)
            } else {
                DemuxError::Rejected { source, log }
            }
        })?;
        Ok(Self { map, prog, layout })
    }

    /// A group from descriptors another process created (the daemon's, received over a Unix
    /// socket). Checks that `map` is a `REUSEPORT_SOCKARRAY` with one entry per slot of
    /// `layout` and `prog` a reuseport program.
    ///
    /// # Errors
    /// [`DemuxError::BadDescriptor`] when they are not.
    pub fn from_fds(map: OwnedFd, prog: OwnedFd, layout: SlotLayout) -> Result<Self, DemuxError> {
        let bad = |what, why: String| DemuxError::BadDescriptor { what, why };
        let m = map_info(map.as_fd()).map_err(|e| bad("map", e.to_string()))?;
        if m.map_type != BPF_MAP_TYPE_REUSEPORT_SOCKARRAY || m.key_size != 4 || m.value_size != 8 {
            return Err(bad(
                "map",
                format!(
                    "type {} key {} value {} bytes (want a REUSEPORT_SOCKARRAY, 4, 8)",
                    m.map_type, m.key_size, m.value_size
                ),
            ));
        }
        if m.max_entries != layout.slots() {
            return Err(bad(
                "map",
                format!(
                    "{} entries, but the layout has {} slots",
                    m.max_entries,
                    layout.slots()
                ),
            ));
        }
        let p = prog_info(prog.as_fd()).map_err(|e| bad("program", e.to_string()))?;
        if p.prog_type != BPF_PROG_TYPE_SK_REUSEPORT {
            return Err(bad(
                "program",
                format!("program type {} (want SK_REUSEPORT)", p.prog_type),
            ));
        }
        Ok(Self { map, prog, layout })
    }

    /// Another handle on the same group (the descriptors duplicated).
    ///
    /// # Errors
    /// [`DemuxError::Io`]: out of descriptors.
    pub fn try_clone(&self) -> Result<Self, DemuxError> {
        let dup = |fd: &OwnedFd| {
            fd.try_clone().map_err(|source| DemuxError::Io {
                op: "duplicate a descriptor",
                source,
            })
        };
        Ok(Self {
            map: dup(&self.map)?,
            prog: dup(&self.prog)?,
            layout: self.layout,
        })
    }

    /// Pins the map and the program as `dir/map` and `dir/prog` in a BPF filesystem (`mount
    /// -t bpf bpf /sys/fs/bpf`), so that a restarted daemon gets the same objects back
    /// ([`DemuxGroup::open_pinned`]): its established members keep their slots, and the
    /// members it admits next join the same map. (Without it, a new daemon's new map and
    /// program would replace the group's steering and strand the old members.)
    ///
    /// # Errors
    /// [`DemuxError::Io`]: `dir` is not in a BPF filesystem, the names exist, no permission.
    pub fn pin(&self, dir: &Path) -> Result<(), DemuxError> {
        for (name, fd) in [("map", &self.map), ("prog", &self.prog)] {
            let path = c_path(&dir.join(name))?;
            let mut attr = ObjAttr {
                pathname: path.as_ptr() as u64,
                bpf_fd: fd.as_raw_fd() as u32,
                file_flags: 0,
            };
            bpf(BPF_OBJ_PIN, &mut attr).map_err(|source| DemuxError::Io {
                op: "pin in the BPF filesystem",
                source,
            })?;
        }
        Ok(())
    }

    /// The group pinned in `dir` by [`DemuxGroup::pin`], checked as [`DemuxGroup::from_fds`]
    /// does.
    ///
    /// # Errors
    /// [`DemuxError::Io`] when nothing is pinned there (or no permission),
    /// [`DemuxError::BadDescriptor`] when what is there is not a demux group of `layout`.
    pub fn open_pinned(dir: &Path, layout: SlotLayout) -> Result<Self, DemuxError> {
        let get = |name: &str| {
            let path = c_path(&dir.join(name))?;
            let mut attr = ObjAttr {
                pathname: path.as_ptr() as u64,
                bpf_fd: 0,
                file_flags: 0,
            };
            bpf_fd(BPF_OBJ_GET, &mut attr).map_err(|source| DemuxError::Io {
                op: "open a pinned object",
                source,
            })
        };
        Self::from_fds(get("map")?, get("prog")?, layout)
    }

    /// The kernel's ID of the map (as `bpftool map show` lists it): equal IDs, same group.
    ///
    /// # Errors
    /// [`DemuxError::Io`].
    pub fn map_id(&self) -> Result<u32, DemuxError> {
        map_info(self.map.as_fd())
            .map(|m| m.id)
            .map_err(|source| DemuxError::Io {
                op: "read the map's information",
                source,
            })
    }

    /// The map's descriptor, to pass to a client.
    pub fn map_fd(&self) -> BorrowedFd<'_> {
        self.map.as_fd()
    }

    /// The program's descriptor, to pass to a client.
    pub fn prog_fd(&self) -> BorrowedFd<'_> {
        self.prog.as_fd()
    }

    /// The slot layout.
    pub fn layout(&self) -> SlotLayout {
        self.layout
    }

    /// Puts `socket` (UDP, `SO_REUSEPORT`, already bound to the shared `IP:port`) in charge of
    /// `slot`: attaches the steering program to its reuseport group (the same program every
    /// member attaches, so a group formed by any member steers) and stores the socket in the
    /// map at `slot`. Needs no privilege.
    ///
    /// # Errors
    /// [`DemuxError::NoSuchSlot`], [`DemuxError::SlotTaken`] when a live socket holds the slot,
    /// [`DemuxError::Io`].
    pub fn join(&self, socket: BorrowedFd<'_>, slot: u32) -> Result<(), DemuxError> {
        self.check_slot(slot)?;
        let prog = self.prog.as_raw_fd();
        #[allow(unsafe_code)]
        // SAFETY: passes a pointer to a live local c_int and its exact size.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ATTACH_REUSEPORT_EBPF,
                (&prog as *const RawFd).cast(),
                size_of::<RawFd>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(DemuxError::Io {
                op: "attach the steering program (SO_ATTACH_REUSEPORT_EBPF)",
                source: io::Error::last_os_error(),
            });
        }
        let key = slot;
        let value = u64::try_from(socket.as_raw_fd()).unwrap_or(u64::MAX);
        let mut attr = MapElemAttr {
            map_fd: self.map.as_raw_fd() as u32,
            key: (&key as *const u32) as u64,
            value: (&value as *const u64) as u64,
            flags: BPF_NOEXIST,
            ..MapElemAttr::default()
        };
        match bpf(BPF_MAP_UPDATE_ELEM, &mut attr) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Err(DemuxError::SlotTaken { slot }),
            Err(source) => Err(DemuxError::Io {
                op: "store the socket in the map (is it bound with SO_REUSEPORT?)",
                source,
            }),
        }
    }

    /// Empties `slot` (the daemon evicting a member; a closed socket leaves by itself). Its
    /// datagrams are dropped from then on. `Ok(false)` if it was empty.
    ///
    /// # Errors
    /// [`DemuxError::NoSuchSlot`], [`DemuxError::Io`].
    pub fn vacate(&self, slot: u32) -> Result<bool, DemuxError> {
        self.check_slot(slot)?;
        let key = slot;
        let mut attr = MapElemAttr {
            map_fd: self.map.as_raw_fd() as u32,
            key: (&key as *const u32) as u64,
            ..MapElemAttr::default()
        };
        match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(source) => Err(DemuxError::Io {
                op: "empty a slot",
                source,
            }),
        }
    }

    /// The socket cookie (`SO_COOKIE`) of the socket in `slot`, `None` if the slot is empty:
    /// how a daemon sees that a member's socket is gone.
    ///
    /// # Errors
    /// [`DemuxError::NoSuchSlot`], [`DemuxError::Io`].
    pub fn occupant(&self, slot: u32) -> Result<Option<u64>, DemuxError> {
        self.check_slot(slot)?;
        let key = slot;
        let mut cookie = 0u64;
        let mut attr = MapElemAttr {
            map_fd: self.map.as_raw_fd() as u32,
            key: (&key as *const u32) as u64,
            value: (&mut cookie as *mut u64) as u64,
            ..MapElemAttr::default()
        };
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => Ok(Some(cookie)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(source) => Err(DemuxError::Io {
                op: "look up a slot",
                source,
            }),
        }
    }

    /// Whether `socket` is the very socket in `slot` (their `SO_COOKIE`s are equal): how a
    /// daemon checks a claim to a slot made with the socket in hand (`SCM_RIGHTS`).
    ///
    /// # Errors
    /// [`DemuxError::NoSuchSlot`], [`DemuxError::Io`] (also: `socket` is not a socket).
    pub fn holds(&self, slot: u32, socket: BorrowedFd<'_>) -> Result<bool, DemuxError> {
        let theirs = socket_cookie(socket).map_err(|source| DemuxError::Io {
            op: "read a socket's cookie",
            source,
        })?;
        Ok(self.occupant(slot)? == Some(theirs))
    }

    fn check_slot(&self, slot: u32) -> Result<(), DemuxError> {
        if slot >= self.layout.slots() {
            return Err(DemuxError::NoSuchSlot {
                slot,
                slots: self.layout.slots(),
            });
        }
        Ok(())
    }
}

/// The socket's cookie (`SO_COOKIE`): a number the kernel gives each socket, unique for the
/// boot, as a `REUSEPORT_SOCKARRAY` lookup returns it.
///
/// # Errors
/// `fd` is not a socket.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: getsockopt writes at most `len` (8) bytes into `cookie`, a live u64, and
    // stores the length written in `len`; `fd` is borrowed, open for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// A device's membership in a demux group: which group and which slot. Give it to
/// [`crate::DeviceConfig::demux`]; the `udp` backend then binds with `SO_REUSEPORT`, joins the
/// group at the slot, and the device hands out QPNs only from the slot's range.
#[derive(Debug)]
pub struct Demux {
    group: DemuxGroup,
    slot: u32,
}

impl Demux {
    /// Membership of `group` at `slot`.
    ///
    /// # Errors
    /// [`DemuxError::NoSuchSlot`].
    pub fn new(group: DemuxGroup, slot: u32) -> Result<Self, DemuxError> {
        group.check_slot(slot)?;
        Ok(Self { group, slot })
    }

    /// The group.
    pub fn group(&self) -> &DemuxGroup {
        &self.group
    }

    /// The slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The QPNs this member hands out.
    pub fn qpn_range(&self) -> RangeInclusive<u32> {
        // INVARIANT: `new` checked the slot against the layout.
        self.group
            .layout
            .range(self.slot)
            .expect("slot checked in Demux::new")
    }
}

// ------------------------------------------------------------------ bpf(2) --

/// The `bpf_attr` prefix `BPF_MAP_CREATE` reads.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// The `bpf_attr` prefix the element commands read.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `bpf_attr` prefix `BPF_PROG_LOAD` reads (up to `expected_attach_type`).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The `bpf_attr` of `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The `bpf_attr` of `BPF_OBJ_PIN` and `BPF_OBJ_GET`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The start of `struct bpf_map_info`.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

/// The start of `struct bpf_prog_info`.
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
}

/// Marks the `bpf_attr` prefixes above: plain `repr(C)` data the kernel may read and write.
trait Attr {}
impl Attr for MapCreateAttr {}
impl Attr for MapElemAttr {}
impl Attr for ProgLoadAttr {}
impl Attr for InfoAttr {}
impl Attr for ObjAttr {}

/// `bpf(cmd, attr, sizeof attr)`; the kernel treats a shorter `bpf_attr` as zero-extended.
fn bpf<A: Attr>(cmd: libc::c_int, attr: &mut A) -> io::Result<libc::c_long> {
    loop {
        #[allow(unsafe_code)]
        // SAFETY: `attr` is a live, exclusively borrowed `repr(C)` prefix of `union bpf_attr`
        // for `cmd`, passed with its exact size; pointers inside it point at live buffers of
        // the sizes the command implies (set up by the callers).
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                (attr as *mut A).cast::<libc::c_void>(),
                size_of::<A>() as libc::c_uint,
            )
        };
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A `bpf` command that returns a new descriptor.
fn bpf_fd<A: Attr>(cmd: libc::c_int, attr: &mut A) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("bpf returned a bad descriptor"))?;
    #[allow(unsafe_code)]
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads the program; on failure, loads it again with the verifier's log and returns that
/// (empty when the kernel refused before verifying: no privilege).
fn load_program(insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
    let license = b"GPL\0";
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SK_REUSEPORT,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16("rocectl_qpdemux"),
        expected_attach_type: BPF_SK_REUSEPORT_SELECT,
        ..ProgLoadAttr::default()
    };
    let err = match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    let mut log = vec![0u8; 64 * 1024];
    attr.log_level = 1;
    attr.log_size = log.len() as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim_end().to_owned();
            Err((if text.is_empty() { err } else { e }, text))
        }
    }
}

fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    let mut info = MapInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<MapInfo>() as u32,
        info: (&mut info as *mut MapInfo) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

fn prog_info(fd: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut info = ProgInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<ProgInfo>() as u32,
        info: (&mut info as *mut ProgInfo) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// `path` as a C string.
fn c_path(path: &Path) -> Result<CString, DemuxError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| DemuxError::Io {
        op: "name a pinned object",
        source: io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"),
    })
}

/// A NUL-padded object name (at most 15 characters; the kernel allows `[A-Za-z0-9_.]`).
fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (d, s) in out.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    out
}

impl fmt::Display for SlotLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} slots of {} QPNs",
            self.slots(),
            1u32 << u32::from(self.shift)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_the_kernel() {
        // Offsets from <linux/bpf.h> (checked with offsetof against libbpf-dev 6.x headers).
        assert_eq!(size_of::<MapCreateAttr>(), 44);
        assert_eq!(std::mem::offset_of!(MapCreateAttr, map_name), 28);
        assert_eq!(size_of::<MapElemAttr>(), 32);
        assert_eq!(std::mem::offset_of!(MapElemAttr, key), 8);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_ifindex), 64);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(size_of::<InfoAttr>(), 16);
        assert_eq!(std::mem::offset_of!(MapInfo, max_entries), 16);
        assert_eq!(size_of::<Insn>(), 8);
    }

    #[test]
    fn slots_cover_the_qpn_space_without_overlap() {
        for shift in [8u8, 12, 16, 20] {
            let l = SlotLayout::new(shift).unwrap();
            assert_eq!(l.slots(), 1 << (24 - u32::from(shift)));
            let mut next = MIN_QPN;
            for slot in 0..l.slots() {
                let r = l.range(slot).unwrap();
                assert_eq!(*r.start(), next, "shift {shift} slot {slot}");
                assert_eq!(l.slot_of(*r.start()), slot);
                assert_eq!(l.slot_of(*r.end()), slot);
                next = r.end() + 1;
            }
            assert_eq!(next, MAX_QPN + 1);
            assert_eq!(l.range(l.slots()), None);
        }
        let d = SlotLayout::DEFAULT;
        assert_eq!(d.range(1), Some(0x1_0000..=0x1_FFFF));
        assert_eq!(d.range(0), Some(0x10..=0xFFFF));
        assert_eq!(d.range(255), Some(0xFF_0000..=0xFF_FFFE));
        assert!(matches!(
            SlotLayout::new(7),
            Err(DemuxError::BadLayout { shift: 7 })
        ));
        assert!(SlotLayout::new(21).is_err());
    }

    /// The program's jumps land on the drop tail, it reads the DestQP word, shifts by the
    /// layout and ends in exits; an interpreter of this subset runs it on sample datagrams.
    #[test]
    fn program_steers_by_destqp_in_a_reference_interpreter() {
        let layout = SlotLayout::new(12).unwrap();
        let p = program(77, layout);
        assert_eq!(p.len(), 24);
        assert_eq!(p[13].imm(), 77);
        assert_eq!(p[10].imm(), 12);
        for (at, insn) in p.iter().enumerate() {
            if insn.code() == op::JMP | op::JNE | op::K {
                assert_eq!(at + 1 + insn.off() as usize, 22, "jump at {at}");
            }
        }
        // The map: slot 0x123 holds a socket, nothing else does.
        let run = |udp: &[u8]| interpret(&p, udp, |slot| slot == 0x123);
        let dgram = |qpn: u32| {
            let mut d = vec![0u8; 8 + 12 + 4];
            d[8] = 0x04;
            d[8 + 4] = 0xAB; // reserved byte: ignored
            d[8 + 5..8 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            d
        };
        assert_eq!(run(&dgram(0x12_3000)), (SK_PASS, Some(0x123)));
        assert_eq!(run(&dgram(0x12_3FFF)), (SK_PASS, Some(0x123)));
        assert_eq!(run(&dgram(0x12_4000)), (SK_DROP, Some(0x124)));
        assert_eq!(run(&dgram(0x12_2FFF)), (SK_DROP, Some(0x122)));
        // Too short to hold the DestQP: dropped before any lookup.
        assert_eq!(run(&dgram(0x12_3000)[..8 + 7]), (SK_DROP, None));
    }

    /// Runs the subset of eBPF `program` emits: returns the verdict and the slot looked up.
    fn interpret(p: &[Insn], udp: &[u8], occupied: impl Fn(u32) -> bool) -> (i32, Option<u32>) {
        let mut r = [0u64; 11];
        let mut stack = [0u8; 16]; // fp - 16 .. fp
        let mut looked_up = None;
        let reg = |i: &Insn| {
            #[cfg(target_endian = "little")]
            let (d, s) = (i.regs & 0xf, i.regs >> 4);
            #[cfg(target_endian = "big")]
            let (d, s) = (i.regs >> 4, i.regs & 0xf);
            (usize::from(d), usize::from(s))
        };
        const FPV: u64 = 1 << 32; // a fake frame pointer value
        r[10] = FPV;
        let mut pc = 0;
        loop {
            let i = p[pc];
            let (d, s) = reg(&i);
            let imm = i.imm as i64 as u64;
            pc += 1;
            match i.code {
                c if c == op::ALU64 | op::MOV | op::X => r[d] = r[s],
                c if c == op::ALU64 | op::MOV | op::K => r[d] = imm,
                c if c == op::ALU64 | op::ADD | op::K => r[d] = r[d].wrapping_add(imm),
                c if c == op::ALU64 | op::AND | op::K => r[d] &= imm,
                c if c == op::ALU64 | op::RSH | op::K => r[d] >>= imm,
                c if c == op::ALU | op::END | op::TO_BE => {
                    r[d] = u64::from(u32::from_be(r[d] as u32));
                }
                c if c == op::LDX | op::MEM | op::W => {
                    let at = (r[s] as i64 + i64::from(i.off) - (FPV as i64 - 16)) as usize;
                    r[d] = u64::from(u32::from_ne_bytes(stack[at..at + 4].try_into().unwrap()));
                }
                c if c == op::STX | op::MEM | op::W => {
                    let at = (r[d] as i64 + i64::from(i.off) - (FPV as i64 - 16)) as usize;
                    stack[at..at + 4].copy_from_slice(&(r[s] as u32).to_ne_bytes());
                }
                c if c == op::LD | op::DW | op::IMM => pc += 1,
                c if c == op::JMP | op::JNE | op::K => {
                    if r[d] != imm {
                        pc = (pc as i64 + i64::from(i.off)) as usize;
                    }
                }
                c if c == op::JMP | op::CALL => {
                    r[0] = match i.imm {
                        BPF_FUNC_SKB_LOAD_BYTES => {
                            let (off, len) = (r[2] as usize, r[4] as usize);
                            let at = (r[3] - (FPV - 16)) as usize;
                            match udp.get(off..off + len) {
                                Some(b) => {
                                    stack[at..at + len].copy_from_slice(b);
                                    0
                                }
                                None => (-libc::EFAULT) as u64,
                            }
                        }
                        BPF_FUNC_SK_SELECT_REUSEPORT => {
                            let at = (r[3] - (FPV - 16)) as usize;
                            let slot = u32::from_ne_bytes(stack[at..at + 4].try_into().unwrap());
                            looked_up = Some(slot);
                            if occupied(slot) {
                                0
                            } else {
                                (-libc::ENOENT) as u64
                            }
                        }
                        other => panic!("unexpected helper {other}"),
                    };
                }
                c if c == op::JMP | op::EXIT => return (r[0] as i32, looked_up),
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }
}
