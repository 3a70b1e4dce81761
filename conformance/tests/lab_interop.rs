//! Live interop against Linux rdma_rxe (`shared/lab/rxe/`), both directions per tool.
//!
//! Runs only with `ROCE_LAB=1` (it needs root, `/dev/net/tun` and about a minute; without
//! the variable it prints why it is skipped and passes):
//!
//! ```sh
//! sudo ROCE_LAB=1 cargo test --release -p roce-conformance --test lab_interop -- --nocapture
//! ```
//!
//! Each row of [`CASES`] is one tool in one direction. Until the rocectl tools exist the
//! table holds the lab's own userspace peer, `py_rc_pingpong.py`, as the stand-in for "ours";
//! rows for `rocectl rc-pingpong`, `send-bw`, ... replace and extend it (`@ROCECTL@` is
//! `target/release/rocectl`, or `$ROCECTL`).
//!
//! The run writes `target/lab/<case>.{pcap,txt}` and rewrites the generated section of
//! `conformance/README.md` (not with `ROCE_LAB_README=0`). `ROCE_LAB_CASES=a,b` runs only the
//! cases whose names contain one of the words. See `conformance/lab/README.md`.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use roce_conformance::lab::{
    render_results, render_section, update_readme, update_readme_marked, CaseResult, DaemonReport,
    InteropCase, Lab, LabConfig, LabReport, SectionStyle, Side,
};
use roce_conformance::stock::DropinPaths;

/// The interop table.
const CASES: &[InteropCase] = &[
    InteropCase {
        name: "rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "rc_pingpong_ours_server",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "uc_pingpong_ours_client",
        guest_cmd: "ibv_uc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk",
        host_cmd: "@ROCECTL@ uc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "uc_pingpong_ours_server",
        guest_cmd: "ibv_uc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ uc-pingpong -d rbr0 -g 1 -n 10 -s 3000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 512 --chk",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 512 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 512 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 512 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "srq_pingpong_ours_client",
        guest_cmd: "ibv_srq_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 256 -q 2 --chk",
        host_cmd: "@ROCECTL@ srq-pingpong -d rbr0 -g 1 -n 10 -s 256 -q 2 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "srq_pingpong_ours_server",
        guest_cmd: "ibv_srq_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 256 -q 2 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ srq-pingpong -d rbr0 -g 1 -n 10 -s 256 -q 2 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_bw_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_bw_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_bw_ud_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -c UD -s 512",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -c UD -s 512 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_bw_ud_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid) -F -n 10 -c UD -s 512 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-bw -d rbr0 -x 1 -F -n 10 -c UD -s 512",
        server_side: Side::Host,
    },
    InteropCase {
        name: "write_bw_ours_client",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ write-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "write_bw_ours_server",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ write-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "read_bw_ours_client",
        guest_cmd: "ib_read_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000",
        host_cmd: "@ROCECTL@ read-bw -d rbr0 -x 1 -F -n 10 -s 3000 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "read_bw_ours_server",
        guest_cmd: "ib_read_bw -d rxe0 -x $(lab-info gid) -F -n 10 -s 3000 @HOST_IP@",
        host_cmd: "@ROCECTL@ read-bw -d rbr0 -x 1 -F -n 10 -s 3000",
        server_side: Side::Host,
    },
    InteropCase {
        name: "atomic_bw_fadd_ours_client",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A FETCH_AND_ADD",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A FETCH_AND_ADD @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "atomic_bw_fadd_ours_server",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A FETCH_AND_ADD @HOST_IP@",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A FETCH_AND_ADD",
        server_side: Side::Host,
    },
    InteropCase {
        name: "atomic_bw_cas_ours_client",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A CMP_AND_SWAP",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A CMP_AND_SWAP @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "atomic_bw_cas_ours_server",
        guest_cmd: "ib_atomic_bw -d rxe0 -x $(lab-info gid) -F -n 10 -A CMP_AND_SWAP @HOST_IP@",
        host_cmd: "@ROCECTL@ atomic-bw -d rbr0 -x 1 -F -n 10 -A CMP_AND_SWAP",
        server_side: Side::Host,
    },
    InteropCase {
        name: "send_lat_ours_client",
        guest_cmd: "ib_send_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ send-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "send_lat_ours_server",
        guest_cmd: "ib_send_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ send-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
    InteropCase {
        name: "write_lat_ours_client",
        guest_cmd: "ib_write_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ write-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "write_lat_ours_server",
        guest_cmd: "ib_write_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ write-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
    InteropCase {
        name: "read_lat_ours_client",
        guest_cmd: "ib_read_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64",
        host_cmd: "@ROCECTL@ read-lat -d rbr0 -x 1 -F -n 10 -s 64 @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "read_lat_ours_server",
        guest_cmd: "ib_read_lat -d rxe0 -x $(lab-info gid) -F -n 10 -s 64 @HOST_IP@",
        host_cmd: "@ROCECTL@ read-lat -d rbr0 -x 1 -F -n 10 -s 64",
        server_side: Side::Host,
    },
];

/// Our GID index for the bridge's IPv6 address, looked up in our own GID table (the host
/// command runs under `sh -c` in the namespace).
macro_rules! host_gid6 {
    () => {
        "$(@ROCECTL@ devinfo -d rbr0 -v | sed -n 's/.*GID\\[ *\\([0-9]*\\)\\]:[[:space:]]*@HOST_IP6@,.*/\\1/p')"
    };
}

/// The second pass: the lab booted with `ROCE_LAB_IPV6=1` and `ROCE_LAB_MTU=9000` (RoCE active
/// MTU 4096). RoCE over IPv6 GIDs (rxe sends IPv6 UDP with checksum 0) and over jumbo frames
/// (path MTU 4096), RC and UD, both directions. The out-of-band TCP exchange stays on IPv4;
/// the GIDs it carries decide the RoCE path.
const CASES_V6_JUMBO: &[InteropCase] = &[
    InteropCase {
        name: "v6_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 3000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 3000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_rc_pingpong_ours_server",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 3000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 3000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 512 --chk",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 512 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 512 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 512 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "jumbo_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -m 4096 -n 10 -s 20000 --chk",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -m 4096 -n 10 -s 20000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "jumbo_rc_pingpong_ours_server",
        guest_cmd:
            "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -m 4096 -n 10 -s 20000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ rc-pingpong -d rbr0 -g 1 -m 4096 -n 10 -s 20000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "jumbo_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 4000 --chk",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 4000 --chk @GUEST_IP@",
        server_side: Side::Guest,
    },
    InteropCase {
        name: "jumbo_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 4000 --chk @HOST_IP@",
        host_cmd: "@ROCECTL@ ud-pingpong -d rbr0 -g 1 -n 10 -s 4000 --chk",
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_rc_pingpong_ours_client",
        guest_cmd: "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -m 4096 -n 10 -s 20000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -m 4096 -n 10 -s 20000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_rc_pingpong_ours_server",
        guest_cmd:
            "ibv_rc_pingpong -d rxe0 -g $(lab-info gid6) -m 4096 -n 10 -s 20000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ rc-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -m 4096 -n 10 -s 20000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_ud_pingpong_ours_client",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 4000 --chk",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 4000 --chk @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_ud_pingpong_ours_server",
        guest_cmd: "ibv_ud_pingpong -d rxe0 -g $(lab-info gid6) -n 10 -s 4000 --chk @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ ud-pingpong -d rbr0 -g ",
            host_gid6!(),
            " -n 10 -s 4000 --chk"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_write_bw_ours_client",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid6) -m 4096 -F -n 20 -s 65536",
        host_cmd: concat!(
            "@ROCECTL@ write-bw -d rbr0 -x ",
            host_gid6!(),
            " -m 4096 -F -n 20 -s 65536 @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_write_bw_ours_server",
        guest_cmd: "ib_write_bw -d rxe0 -x $(lab-info gid6) -m 4096 -F -n 20 -s 65536 @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ write-bw -d rbr0 -x ",
            host_gid6!(),
            " -m 4096 -F -n 20 -s 65536"
        ),
        server_side: Side::Host,
    },
    InteropCase {
        name: "v6_jumbo_send_bw_ud_ours_client",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid6) -F -n 20 -c UD -s 4000",
        host_cmd: concat!(
            "@ROCECTL@ send-bw -d rbr0 -x ",
            host_gid6!(),
            " -F -n 20 -c UD -s 4000 @GUEST_IP@"
        ),
        server_side: Side::Guest,
    },
    InteropCase {
        name: "v6_jumbo_send_bw_ud_ours_server",
        guest_cmd: "ib_send_bw -d rxe0 -x $(lab-info gid6) -F -n 20 -c UD -s 4000 @HOST_IP@",
        host_cmd: concat!(
            "@ROCECTL@ send-bw -d rbr0 -x ",
            host_gid6!(),
            " -F -n 20 -c UD -s 4000"
        ),
        server_side: Side::Host,
    },
];

/// A host command of pairing 2: the stock binary on rocectl's drop-in `libibverbs.so.1`, on
/// the device of the lab bridge (`rocectl_rbr0`, GID index 1 as `rocectl devinfo` shows it).
macro_rules! dropin {
    ($tool:literal, $($part:expr),+) => {
        concat!(
            "LD_LIBRARY_PATH=@VERBS_LIB@ ",
            $tool,
            " -d rocectl_rbr0 ",
            $($part),+
        )
    };
}

/// Both directions of one stock tool on the drop-in against the same tool on rdma_rxe:
/// `dropin_<name>_ours_client` (rxe serves) and `dropin_<name>_ours_server`.
macro_rules! dropin_pair {
    ($name:literal, $tool:literal, $gid:literal, $args:literal) => {
        [
            InteropCase {
                name: concat!("dropin_", $name, "_ours_client"),
                guest_cmd: concat!($tool, " -d rxe0 ", $gid, " $(lab-info gid) ", $args),
                host_cmd: dropin!($tool, $gid, " 1 ", $args, " @GUEST_IP@"),
                server_side: Side::Guest,
            },
            InteropCase {
                name: concat!("dropin_", $name, "_ours_server"),
                guest_cmd: concat!(
                    $tool,
                    " -d rxe0 ",
                    $gid,
                    " $(lab-info gid) ",
                    $args,
                    " @HOST_IP@"
                ),
                host_cmd: dropin!($tool, $gid, " 1 ", $args),
                server_side: Side::Host,
            },
        ]
    };
}

/// Pairing 2 of issue 13 (first boot, IPv4, MTU 1500): the **unmodified** Debian binary on the
/// drop-in on the host against the same binary on Linux rdma_rxe in the guest, both
/// directions, for every tool, with the options of the rows above (plus `-e`). The full option
/// matrix runs over the veth pair (pairings 1 and 3, `tests/stock_tools.rs`); the lab's TCG
/// guest takes 5-20 s a case, so here each tool runs once per direction.
const CASES_DROPIN: [[InteropCase; 2]; 15] = [
    dropin_pair!(
        "rc_pingpong",
        "ibv_rc_pingpong",
        "-g",
        "-n 10 -s 3000 --chk"
    ),
    dropin_pair!("rc_pingpong_e", "ibv_rc_pingpong", "-g", "-n 10 -s 3000 -e"),
    dropin_pair!(
        "uc_pingpong",
        "ibv_uc_pingpong",
        "-g",
        "-n 10 -s 3000 --chk"
    ),
    dropin_pair!("ud_pingpong", "ibv_ud_pingpong", "-g", "-n 10 -s 512 --chk"),
    dropin_pair!(
        "srq_pingpong",
        "ibv_srq_pingpong",
        "-g",
        "-n 10 -s 256 -q 2 --chk"
    ),
    dropin_pair!("send_bw", "ib_send_bw", "-x", "-F -n 10 -s 3000"),
    dropin_pair!("send_bw_ud", "ib_send_bw", "-x", "-F -n 10 -c UD -s 512"),
    dropin_pair!("write_bw", "ib_write_bw", "-x", "-F -n 10 -s 3000"),
    dropin_pair!("read_bw", "ib_read_bw", "-x", "-F -n 10 -s 3000"),
    dropin_pair!(
        "atomic_bw_fadd",
        "ib_atomic_bw",
        "-x",
        "-F -n 10 -A FETCH_AND_ADD"
    ),
    dropin_pair!(
        "atomic_bw_cas",
        "ib_atomic_bw",
        "-x",
        "-F -n 10 -A CMP_AND_SWAP"
    ),
    dropin_pair!("send_lat", "ib_send_lat", "-x", "-F -n 10 -s 64"),
    dropin_pair!("send_lat_uc", "ib_send_lat", "-x", "-F -n 10 -s 64 -c UC"),
    dropin_pair!("write_lat", "ib_write_lat", "-x", "-F -n 10 -s 64"),
    dropin_pair!("read_lat", "ib_read_lat", "-x", "-F -n 10 -s 64"),
];

/// Pairing 2 over jumbo frames (second boot, MTU 9000: RoCE active MTU 4096): `-m 4096`.
const CASES_DROPIN_JUMBO: [[InteropCase; 2]; 2] = [
    dropin_pair!(
        "jumbo_rc_pingpong",
        "ibv_rc_pingpong",
        "-g",
        "-m 4096 -n 10 -s 20000 --chk"
    ),
    dropin_pair!(
        "jumbo_ud_pingpong",
        "ibv_ud_pingpong",
        "-g",
        "-n 10 -s 4000 --chk"
    ),
];

/// The generated section of pairing 2.
const DROPIN_SECTION: SectionStyle<'static> = SectionStyle {
    begin: "<!-- BEGIN lab drop-in results: generated by conformance/tests/lab_interop.rs, do not edit -->",
    end: "<!-- END lab drop-in results -->",
    title: "Pairing 2: unmodified binaries on the drop-in against Linux rdma_rxe",
    host: "host (stock on drop-in)",
};

/// The generated section of the passes with the rocectl daemon on (issue 14).
const DAEMON_SECTION: SectionStyle<'static> = SectionStyle {
    begin: "<!-- BEGIN lab daemon results: generated by conformance/tests/lab_interop.rs, do not edit -->",
    end: "<!-- END lab daemon results -->",
    title: "The same rows with the rocectl daemon on: every host-side process (ours and the stock binaries on the drop-in) opens its device through `rocectl daemon`, in kernel-demux and in forwarding mode",
    host: "host (through the daemon)",
};

/// What one boot of the lab ran.
struct Pass {
    results: Vec<CaseResult>,
    environment: Vec<(String, String)>,
    timings: Vec<(String, Duration)>,
    daemon: Option<DaemonReport>,
}

/// Boots the lab with `extra_env`, runs the selected `cases` (through a `rocectl daemon` in
/// `daemon` mode when given), tears it down.
fn run_pass(
    title: &str,
    extra_env: &[(&str, &str)],
    cases: &[InteropCase],
    filter: &[String],
    daemon: Option<&str>,
) -> Pass {
    let selected: Vec<InteropCase> = cases
        .iter()
        .filter(|c| filter.is_empty() || filter.iter().any(|f| c.name.contains(f.as_str())))
        .copied()
        .collect();
    if selected.is_empty() {
        return Pass {
            results: Vec::new(),
            environment: Vec::new(),
            timings: Vec::new(),
            daemon: None,
        };
    }
    let mut cfg = LabConfig::from_env();
    if let Some(mode) = daemon {
        // Its own captures and logs, beside the exclusive pass's.
        cfg.out_dir = cfg.out_dir.join(format!("daemon-{mode}"));
    }
    cfg.extra_env.extend(
        extra_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let mut lab = Lab::up(cfg).unwrap_or_else(|e| panic!("booting the lab ({title}): {e}"));
    if lab.ipv6() {
        lab.resolve_ipv6_neighbours()
            .unwrap_or_else(|e| panic!("IPv6 in the lab ({title}): {e}"));
    }
    if let Some(mode) = daemon {
        lab.start_daemon(mode)
            .unwrap_or_else(|e| panic!("starting the rocectl daemon ({title}): {e}"));
    }
    eprintln!(
        "lab ({title}): guest {} up in {:.1}s, GID index {}",
        lab.info().guest_ip,
        lab.up_time().as_secs_f64(),
        lab.info().gid_index
    );
    let environment = lab
        .describe()
        .into_iter()
        .map(|(k, v)| (format!("{title}: {k}"), v))
        .collect();
    let up_time = lab.up_time();
    let cases_t0 = Instant::now();
    let results = lab.run_cases(&selected);
    for r in &results {
        eprintln!(
            "lab: {} {} in {:.1}s ({})",
            if r.passed() { "PASS" } else { "FAIL" },
            r.name,
            r.elapsed.as_secs_f64(),
            r.log.display()
        );
    }
    let cases_time = cases_t0.elapsed();
    let daemon = daemon.map(|_| {
        let report = lab
            .stop_daemon()
            .unwrap_or_else(|e| panic!("stopping the rocectl daemon ({title}): {e}"));
        eprintln!(
            "lab ({title}): the daemon ({}) allocated {} QPN ranges, reaped {}, refused {}, \
             clean exit {}",
            report.mode, report.clients, report.reaped, report.refused, report.clean_exit
        );
        report
    });
    let down = lab
        .down()
        .unwrap_or_else(|e| panic!("tearing the lab down ({title}): {e}"));
    Pass {
        results,
        environment,
        timings: vec![
            (format!("{title}: boot (host-peer.sh up)"), up_time),
            (format!("{title}: {} cases", selected.len()), cases_time),
            (format!("{title}: teardown"), down),
        ],
        daemon,
    }
}

/// What must hold of a pass through the daemon besides its cases passing: the daemon served
/// every host-side process (at least one QPN range per case, so no case ran beside it),
/// refused none, and stopped cleanly.
fn daemon_failures(title: &str, pass: &Pass) -> Vec<String> {
    let Some(d) = &pass.daemon else {
        return Vec::new();
    };
    let mut failed = Vec::new();
    if d.clients < pass.results.len() {
        failed.push(format!(
            "{title}: the daemon allocated {} QPN ranges for {} cases (some case did not use it)",
            d.clients,
            pass.results.len()
        ));
    }
    if d.refused != 0 {
        failed.push(format!(
            "{title}: the daemon refused {} requests",
            d.refused
        ));
    }
    if !d.clean_exit {
        failed.push(format!(
            "{title}: the daemon did not exit 0 on SIGTERM:\n{}",
            d.log
        ));
    }
    failed
}

#[test]
fn lab_interop() {
    if std::env::var("ROCE_LAB").as_deref() != Ok("1") {
        eprintln!(
            "lab_interop: skipped; set ROCE_LAB=1 (needs root and /dev/net/tun) to run the \
             live rdma_rxe suite"
        );
        return;
    }
    let started = SystemTime::now();
    let t0 = Instant::now();
    let cfg = LabConfig::from_env();
    if let Err(e) = Lab::prerequisites(&cfg) {
        panic!("{e}");
    }
    let prepare = Lab::prepare(&cfg).unwrap_or_else(|e| panic!("preparing the lab: {e}"));
    eprintln!("lab: prepared in {:.1}s", prepare.as_secs_f64());
    let filter: Vec<String> = std::env::var("ROCE_LAB_CASES")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    // Pairing 2 needs the drop-in (verbs/build-so.sh; conformance/lab/ci.sh builds it) and
    // Debian's binaries on the host: missing, its rows are skipped (a failure under CI).
    let paths = DropinPaths::from_env();
    let missing = paths.missing(&["ibv_rc_pingpong", "ib_send_bw"], false);
    let with_dropin = missing.is_empty();
    if !with_dropin {
        roce_testkit::skip(
            "lab_interop (pairing 2, the dropin_ rows)",
            format!("missing: {}", missing.join("; ")),
        );
    }
    let v4: Vec<InteropCase> = CASES
        .iter()
        .copied()
        .chain(
            CASES_DROPIN
                .iter()
                .flatten()
                .copied()
                .filter(|_| with_dropin),
        )
        .collect();
    let v6: Vec<InteropCase> = CASES_V6_JUMBO
        .iter()
        .copied()
        .chain(
            CASES_DROPIN_JUMBO
                .iter()
                .flatten()
                .copied()
                .filter(|_| with_dropin),
        )
        .collect();
    // ROCE_LAB_DAEMON=0 leaves out the passes through the daemon (issue 14).
    let with_daemon = std::env::var("ROCE_LAB_DAEMON").as_deref() != Ok("0");
    let passes = [
        run_pass("IPv4, MTU 1500", &[], &v4, &filter, None),
        run_pass(
            "IPv6 + MTU 9000",
            &[("ROCE_LAB_IPV6", "1"), ("ROCE_LAB_MTU", "9000")],
            &v6,
            &filter,
            None,
        ),
    ];
    let daemon_passes: Vec<(&str, Pass)> = if with_daemon {
        // Kernel demux, the default mode, with every IPv4 row (ours and the drop-in's);
        // forwarding with our tools' rows (the drop-in reaches the daemon through the same
        // `Device::open`, so its rows add time, not coverage, there).
        [
            ("daemon, kernel demux", "kernel-demux", &v4[..]),
            ("daemon, forwarding", "forwarding", CASES),
        ]
        .into_iter()
        .map(|(title, mode, cases)| {
            let t = format!("IPv4, MTU 1500, {title}");
            let pass = run_pass(&t, &[], cases, &filter, Some(mode));
            (title, pass)
        })
        .collect()
    } else {
        Vec::new()
    };
    let mut results = Vec::new();
    let mut environment = Vec::new();
    let mut timings = vec![("prepare (host-deps.sh + build.sh)".to_owned(), prepare)];
    for pass in passes {
        results.extend(pass.results);
        environment.extend(pass.environment);
        timings.extend(pass.timings);
    }
    let mut daemon_results: Vec<CaseResult> = Vec::new();
    let mut daemon_env = Vec::new();
    let mut daemon_timings = Vec::new();
    let mut daemon_failed = Vec::new();
    for (title, pass) in &daemon_passes {
        daemon_failed.extend(daemon_failures(title, pass));
        if let Some(d) = &pass.daemon {
            daemon_env.push((
                format!("{title}: daemon"),
                format!(
                    "{} QPN ranges allocated, {} clients reaped, {} refused, clean exit: {}",
                    d.clients, d.reaped, d.refused, d.clean_exit
                ),
            ));
        }
        daemon_env.extend(pass.environment.iter().cloned());
        daemon_timings.extend(pass.timings.iter().cloned());
        daemon_results.extend(pass.results.iter().cloned().map(|mut r| {
            r.name = format!("{} ({title})", r.name);
            r
        }));
    }
    timings.push(("total".to_owned(), t0.elapsed()));
    let command =
        "sudo ROCE_LAB=1 cargo test --release -p roce-conformance --test lab_interop".to_owned();
    let (dropin, ours): (Vec<CaseResult>, Vec<CaseResult>) = results
        .iter()
        .cloned()
        .partition(|r| r.name.starts_with("dropin_"));
    if std::env::var("ROCE_LAB_README").as_deref() != Ok("0") {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        // A section whose cases were all filtered out keeps its last results.
        if !ours.is_empty() {
            let report = LabReport {
                started,
                environment: environment.clone(),
                timings: timings.clone(),
                results: &ours,
                command: command.clone(),
            };
            update_readme(&readme, &render_results(&report))
                .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
        }
        if !dropin.is_empty() {
            let report = LabReport {
                started,
                environment,
                timings: timings.clone(),
                results: &dropin,
                command: command.clone(),
            };
            update_readme_marked(
                &readme,
                DROPIN_SECTION.begin,
                DROPIN_SECTION.end,
                &render_section(&report, &DROPIN_SECTION),
            )
            .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
        }
        if !daemon_results.is_empty() {
            let report = LabReport {
                started,
                environment: daemon_env,
                timings: daemon_timings,
                results: &daemon_results,
                command: command.clone(),
            };
            update_readme_marked(
                &readme,
                DAEMON_SECTION.begin,
                DAEMON_SECTION.end,
                &render_section(&report, &DAEMON_SECTION),
            )
            .unwrap_or_else(|e| panic!("writing {}: {e}", readme.display()));
        }
    }
    results.extend(daemon_results);
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            format!(
                "{}: {} (see {})",
                r.name,
                r.failure.as_deref().unwrap_or(""),
                r.log.display()
            )
        })
        .chain(daemon_failed)
        .collect();
    assert!(!results.is_empty(), "no case matched ROCE_LAB_CASES");
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

/// The pairing-2 rows are the stock command on both sides, the host's on the drop-in.
#[test]
fn dropin_rows_run_the_stock_binary_on_both_sides() {
    let [client, server] = CASES_DROPIN[0];
    assert_eq!(client.name, "dropin_rc_pingpong_ours_client");
    assert_eq!(
        client.host_cmd,
        "LD_LIBRARY_PATH=@VERBS_LIB@ ibv_rc_pingpong -d rocectl_rbr0 -g 1 -n 10 -s 3000 --chk \
         @GUEST_IP@"
    );
    assert_eq!(
        client.guest_cmd,
        "ibv_rc_pingpong -d rxe0 -g $(lab-info gid) -n 10 -s 3000 --chk"
    );
    assert_eq!(client.server_side, Side::Guest);
    assert_eq!(server.server_side, Side::Host);
    assert!(server.guest_cmd.ends_with(" @HOST_IP@"));
    let all: Vec<InteropCase> = CASES_DROPIN
        .iter()
        .chain(&CASES_DROPIN_JUMBO)
        .flatten()
        .copied()
        .collect();
    for c in &all {
        let tool = c.guest_cmd.split_whitespace().next().unwrap_or_default();
        assert!(
            c.host_cmd.starts_with(&format!(
                "LD_LIBRARY_PATH=@VERBS_LIB@ {tool} -d rocectl_rbr0 "
            )),
            "{}",
            c.name
        );
    }
    let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len());
}
