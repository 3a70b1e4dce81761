//! The small exported helpers: strings (`ibv_wc_status_str`, …), rates, fork support.
//! OWNER: helper "device".
//!
//! The strings and the rate tables are rdma-core 44's (`libibverbs/enum_strs.c` and
//! `libibverbs/verbs.c` at tag `v44.0`), value for value; the tests compare every value with
//! the installed rdma-core library when it is present.
//!
//! Fork support: registered memory is never pinned (the engine reads and writes the
//! application's pages through ordinary loads and stores), so `fork()` needs no
//! `MADV_DONTFORK` and these calls have nothing to do.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::sys::{ibv_event_type, ibv_fork_status, ibv_node_type, ibv_port_state, ibv_rate};
use crate::sys::{ibv_fork_status_IBV_FORK_UNNEEDED, ibv_rate_IBV_RATE_MAX, ibv_wc_status};

/// `enum_strs.c`: `wc_status_str`, indexed by `enum ibv_wc_status`.
const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `enum_strs.c`: `event_type_str`, indexed by `enum ibv_event_type`.
const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `enum_strs.c`: `node_type_str`, indexed by `enum ibv_node_type` (1 = `IBV_NODE_CA`).
const NODE_TYPE: [&CStr; 8] = [
    c"unknown", // 0 is no node type; rdma-core's table has a NULL hole there
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `enum_strs.c`: `port_state_str`, indexed by `enum ibv_port_state`.
const PORT_STATE: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

const UNKNOWN: &CStr = c"unknown";

/// `verbs.c`: `enum ibv_rate` → (multiple of 2.5 Gb/s or -1, Mb/s or -1).
const RATES: [(ibv_rate, c_int, c_int); 23] = [
    (2, 1, 2_500),        // IBV_RATE_2_5_GBPS
    (5, 2, 5_000),        // IBV_RATE_5_GBPS
    (3, 4, 10_000),       // IBV_RATE_10_GBPS
    (6, 8, 20_000),       // IBV_RATE_20_GBPS
    (4, 12, 30_000),      // IBV_RATE_30_GBPS
    (7, 16, 40_000),      // IBV_RATE_40_GBPS
    (8, 24, 60_000),      // IBV_RATE_60_GBPS
    (9, 32, 80_000),      // IBV_RATE_80_GBPS
    (10, 48, 120_000),    // IBV_RATE_120_GBPS
    (11, -1, 14_062),     // IBV_RATE_14_GBPS
    (12, -1, 56_250),     // IBV_RATE_56_GBPS
    (13, -1, 112_500),    // IBV_RATE_112_GBPS
    (14, -1, 168_750),    // IBV_RATE_168_GBPS
    (15, -1, 25_781),     // IBV_RATE_25_GBPS
    (16, -1, 103_125),    // IBV_RATE_100_GBPS
    (17, -1, 206_250),    // IBV_RATE_200_GBPS
    (18, -1, 309_375),    // IBV_RATE_300_GBPS
    (19, 11, 28_125),     // IBV_RATE_28_GBPS
    (20, 20, 53_125),     // IBV_RATE_50_GBPS
    (21, 160, 425_000),   // IBV_RATE_400_GBPS
    (22, 240, 637_500),   // IBV_RATE_600_GBPS
    (23, 320, 850_000),   // IBV_RATE_800_GBPS
    (24, 480, 1_275_000), // IBV_RATE_1200_GBPS
];

fn table_str(table: &[&'static CStr], i: u64) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .unwrap_or(&UNKNOWN)
        .as_ptr()
}

/// `ibv_wc_status_str(3)`: the text of a completion status ("unknown" outside the enum).
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    crate::ffi::guard("ibv_wc_status_str", UNKNOWN.as_ptr(), || {
        table_str(&WC_STATUS, u64::from(status))
    })
}

/// `ibv_event_type_str(3)`: the text of an asynchronous event type.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    crate::ffi::guard("ibv_event_type_str", UNKNOWN.as_ptr(), || {
        table_str(&EVENT_TYPE, u64::from(event))
    })
}

/// `ibv_node_type_str(3)`: the text of a node type ("unknown" below `IBV_NODE_CA`).
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    crate::ffi::guard(
        "ibv_node_type_str",
        UNKNOWN.as_ptr(),
        || match u64::try_from(node_type) {
            Ok(i) if i >= 1 => table_str(&NODE_TYPE, i),
            _ => UNKNOWN.as_ptr(),
        },
    )
}

/// `ibv_port_state_str(3)`: the text of a port state.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: ibv_port_state) -> *const c_char {
    crate::ffi::guard("ibv_port_state_str", UNKNOWN.as_ptr(), || {
        table_str(&PORT_STATE, u64::from(port_state))
    })
}

/// `ibv_rate_to_mult(3)`: the rate as a multiple of 2.5 Gb/s, -1 for the rates that are not
/// one (and for values outside the enum).
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate(3)`: the rate of a multiple of 2.5 Gb/s, `IBV_RATE_MAX` when none.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult != -1)
        .map_or(ibv_rate_IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps(3)`: the rate in Mb/s, -1 outside the enum.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate(3)`: the rate of exactly `mbps` Mb/s, `IBV_RATE_MAX` when none.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(ibv_rate_IBV_RATE_MAX, |r| r.0)
}

/// `ibv_fork_init(3)`: nothing to prepare (no pinned memory); always 0.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized(3)`: `IBV_FORK_UNNEEDED`, as rdma-core answers on kernels where
/// fork is safe without `ibv_fork_init`.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    ibv_fork_status_IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing to do (no pinned memory); 0.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: nothing to undo; 0.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: *const c_char) -> String {
        // SAFETY: every function under test returns a pointer to a static NUL-terminated
        // string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Spot checks against the text of `enum_strs.c` at v44.0 (the full comparison against
    /// the installed library is below).
    #[test]
    fn strings_are_rdma_cores() {
        assert_eq!(text(ibv_wc_status_str(0)), "success");
        assert_eq!(text(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(
            text(ibv_wc_status_str(12)),
            "transport retry counter exceeded"
        );
        assert_eq!(text(ibv_wc_status_str(23)), "TM software rendezvous");
        assert_eq!(text(ibv_wc_status_str(24)), "unknown");
        assert_eq!(text(ibv_wc_status_str(u32::MAX)), "unknown");
        assert_eq!(
            text(ibv_event_type_str(1)),
            "local work queue catastrophic error"
        );
        assert_eq!(text(ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(text(ibv_event_type_str(20)), "unknown");
        assert_eq!(text(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(text(ibv_node_type_str(7)), "unspecified");
        assert_eq!(text(ibv_node_type_str(0)), "unknown");
        assert_eq!(text(ibv_node_type_str(-1)), "unknown");
        assert_eq!(text(ibv_node_type_str(8)), "unknown");
        assert_eq!(text(ibv_port_state_str(4)), "active");
        assert_eq!(text(ibv_port_state_str(5)), "active defer");
        assert_eq!(text(ibv_port_state_str(6)), "unknown");
    }

    #[test]
    fn rates_round_trip_as_in_rdma_core() {
        for &(rate, mult, mbps) in &RATES {
            assert_eq!(ibv_rate_to_mult(rate), mult);
            assert_eq!(ibv_rate_to_mbps(rate), mbps);
            assert_eq!(mbps_to_ibv_rate(mbps), rate);
            if mult != -1 {
                assert_eq!(mult_to_ibv_rate(mult), rate);
            }
        }
        assert_eq!(ibv_rate_to_mult(0), -1);
        assert_eq!(ibv_rate_to_mbps(25), -1);
        assert_eq!(mult_to_ibv_rate(-1), 0);
        assert_eq!(mult_to_ibv_rate(3), 0);
        assert_eq!(mbps_to_ibv_rate(100_000), 0);
        assert_eq!(ibv_fork_init(), 0);
        assert_eq!(ibv_is_fork_initialized(), 2);
        assert_eq!(ibv_dontfork_range(std::ptr::null_mut(), 0), 0);
        assert_eq!(ibv_dofork_range(std::ptr::null_mut(), 0), 0);
    }

    /// rdma-core's own `libibverbs.so.1` (libibverbs1 44), loaded with `dlopen`.
    struct RdmaCore(*mut c_void);

    impl RdmaCore {
        fn open() -> Option<Self> {
            // SAFETY: a constant NUL-terminated name; RTLD_LOCAL keeps its symbols out of the
            // global scope, so nothing in this process binds to them by accident.
            let h = unsafe {
                libc::dlopen(
                    c"/usr/lib/x86_64-linux-gnu/libibverbs.so.1".as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_LOCAL,
                )
            };
            (!h.is_null()).then_some(Self(h))
        }

        fn sym(&self, name: &CStr) -> *mut c_void {
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
            assert!(!p.is_null(), "{name:?} missing from rdma-core's library");
            p
        }
    }

    impl Drop for RdmaCore {
        fn drop(&mut self) {
            // SAFETY: the handle came from dlopen and is closed once.
            unsafe { libc::dlclose(self.0) };
        }
    }

    /// Every value of every enum (and some past the end) gives rdma-core's answer.
    #[test]
    fn every_value_matches_the_installed_rdma_core() {
        let Some(lib) = RdmaCore::open() else {
            roce_testkit::skip(
                "every_value_matches_the_installed_rdma_core",
                "rdma-core's libibverbs.so.1 (package libibverbs1) is not installed",
            );
            return;
        };
        type StrU = extern "C" fn(u32) -> *const c_char;
        type StrI = extern "C" fn(c_int) -> *const c_char;
        type IntU = extern "C" fn(u32) -> c_int;
        type UInt = extern "C" fn(c_int) -> u32;
        // SAFETY: these are the functions' C signatures (enums are passed as 32-bit ints).
        let (wc, ev, node, port, to_mult, from_mult, to_mbps, from_mbps) = unsafe {
            (
                std::mem::transmute::<*mut c_void, StrU>(lib.sym(c"ibv_wc_status_str")),
                std::mem::transmute::<*mut c_void, StrU>(lib.sym(c"ibv_event_type_str")),
                std::mem::transmute::<*mut c_void, StrI>(lib.sym(c"ibv_node_type_str")),
                std::mem::transmute::<*mut c_void, StrU>(lib.sym(c"ibv_port_state_str")),
                std::mem::transmute::<*mut c_void, IntU>(lib.sym(c"ibv_rate_to_mult")),
                std::mem::transmute::<*mut c_void, UInt>(lib.sym(c"mult_to_ibv_rate")),
                std::mem::transmute::<*mut c_void, IntU>(lib.sym(c"ibv_rate_to_mbps")),
                std::mem::transmute::<*mut c_void, UInt>(lib.sym(c"mbps_to_ibv_rate")),
            )
        };
        for v in 0..40u32 {
            assert_eq!(text(ibv_wc_status_str(v)), text(wc(v)), "wc status {v}");
            assert_eq!(text(ibv_event_type_str(v)), text(ev(v)), "event {v}");
            assert_eq!(text(ibv_port_state_str(v)), text(port(v)), "port state {v}");
            assert_eq!(ibv_rate_to_mult(v), to_mult(v), "rate {v}");
            assert_eq!(ibv_rate_to_mbps(v), to_mbps(v), "rate {v}");
        }
        for v in -2..12 {
            assert_eq!(text(ibv_node_type_str(v)), text(node(v)), "node type {v}");
        }
        let mults = RATES.iter().map(|r| r.1).chain([-1, 0, 3, 1000]);
        for m in mults {
            assert_eq!(mult_to_ibv_rate(m), from_mult(m), "mult {m}");
        }
        let mbps = RATES.iter().map(|r| r.2).chain([-1, 0, 100_000, 1]);
        for m in mbps {
            assert_eq!(mbps_to_ibv_rate(m), from_mbps(m), "mbps {m}");
        }
    }
}
