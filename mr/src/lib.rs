//! rocectl memory layer: protection domains, memory regions, memory windows, and the lkey/rkey
//! check every queue-pair access goes through.
//!
//! This is the part of the software NIC that keeps a peer out of memory it was never given.
//! A device owns one [`MrTable`]; queue pairs (crate `roce-qp`) share it through an `Arc` and
//! call [`MrTable::check`] for every local SGE (lkey) and every remote RDMA WRITE, READ and
//! atomic (rkey). A successful check returns a [`Checked`] through which the bytes are copied
//! and the atomics run; a failed one returns an [`AccessError`] that says which NAK to send
//! ([`AccessError::responder_nak`], `roce-wire`'s `NakCode`); the queue pairs map it to a
//! completion status. Queue pair numbers and keys are `roce-wire`'s types (`Qpn`; [`Key`]
//! converts to and from `LKey`/`RKey`). No I/O, clocks or global state; the only randomness,
//! the initial 8-bit keys, comes from the seed given to [`MrTable::new`].
//!
//! Keys are `(table index << 8) | 8-bit key` ([`Key`]); the 8-bit key changes each time an
//! index is reused, so a stale rkey never reaches a new region. Lookups are O(1) and take only
//! the read lock of the key's own slot; see [`MrTable`] for the concurrency scheme and why
//! deregistration is safe while accesses are in flight.
//!
//! ```
//! use roce_mr::{Access, MrTable, Origin};
//! use roce_wire::Qpn;
//!
//! let table = MrTable::new(1024, 0x5eed);
//! let pd = table.alloc_pd();
//! let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
//! // 4 KiB owned by the table, exposed to peers at IOVA 0x1000_0000.
//! let rkey = table.register_zeroed(pd, 4096, 0x1000_0000, access)?;
//!
//! // An incoming RDMA WRITE of 5 bytes at 0x1000_0010 on queue pair 17.
//! let remote = Origin::Remote { qpn: Qpn::new(17) };
//! let w = table.check(remote, rkey, pd, 0x1000_0010, 5, Access::REMOTE_WRITE)?;
//! w.write(0, b"hello")?;
//! drop(w);
//!
//! // A fetch-and-add on the aligned word at 0x1000_0008 returns the original value.
//! let a = table.check(remote, rkey, pd, 0x1000_0008, 8, Access::REMOTE_ATOMIC)?;
//! assert_eq!(a.fetch_add(5)?, 0);
//! assert_eq!(a.compare_swap(5, 42)?, 5);
//! drop(a);
//!
//! // A READ is refused: the region grants no REMOTE_READ. The responder NAKs 0x62.
//! let err = table.check(remote, rkey, pd, 0x1000_0010, 5, Access::REMOTE_READ).unwrap_err();
//! assert_eq!(err.responder_nak().code(), 2); // AETH syndrome 0x60 | 2
//!
//! // The application reads its own memory back (offsets into the region's memory).
//! let mut buf = [0u8; 5];
//! table.read(rkey, 0x10, &mut buf)?;
//! assert_eq!(&buf, b"hello");
//! let mut word = [0u8; 8];
//! table.read(rkey, 8, &mut word)?;
//! assert_eq!(u64::from_ne_bytes(word), 42);
//!
//! table.deregister(rkey)?;
//! assert!(table.check(remote, rkey, pd, 0x1000_0010, 5, Access::REMOTE_WRITE).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod access;
mod error;
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
mod guard;
mod key;
mod mem;
mod table;

pub use access::Access;
pub use error::{AccessError, BindError, DeregisterError, InvalidateError, PdError, RegisterError};
pub use key::{Key, MwType, Origin, Pd};
pub use table::{BindMw, Checked, FastReg, MrTable, RegionInfo, MAX_CAPACITY};

/// How many accesses to region memory in this process found the memory unmapped (the
/// application unmapped it while registered) and failed with [`AccessError::Unmapped`]
/// instead of faulting. Always 0 where such accesses are not guarded (other than Linux
/// x86_64), because there they are fatal.
pub fn unmapped_accesses() -> u64 {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        guard::faults()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        0
    }
}

/// Whether the handler that turns faults on unmapped region memory into
/// [`AccessError::Unmapped`] is the first SIGSEGV handler right now (false before the first
/// registration of caller memory, under a handler installed after ours, and off Linux x86_64).
pub fn unmapped_guard_on_top() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        guard::on_top()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        false
    }
}
