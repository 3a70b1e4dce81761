//! Generates `$OUT_DIR/stubs.rs`: an `extern "C"` stand-in for every name of `ibverbs.map`
//! (rdma-core 44's exports) that no file under `src/` defines yet, so `libibverbs.so.1` always
//! exports the whole ABI and a program that calls a verb rocectl lacks gets an error return
//! (`EOPNOTSUPP`) instead of failing to load or aborting.
//!
//! A name counts as defined when a source file has `fn <name>(` on a line with `extern "C"`
//! (or `static <name>:`), under a `#[no_mangle]` / `#[unsafe(no_mangle)]` attribute. The stub's
//! return follows the real prototype (`<infiniband/verbs.h>`, rdma-core's `driver.h`): see
//! [`kind_of`]. Stubs take no parameters: on x86_64 SysV a caller passing arguments (even
//! variadic ones) to a function that ignores them is harmless.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

/// What a stub returns, after the real function's prototype.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `int` verb returning 0 or an errno value: returns `EOPNOTSUPP` (errno set too).
    Errno,
    /// `int` returning -1 with errno on failure (`ibv_get_cq_event`, `ibv_read_sysfs_file`, …).
    MinusOne,
    /// `ssize_t` returning a negative errno value (`_ibv_query_gid_table`).
    NegErrno,
    /// Pointer: NULL with errno `EOPNOTSUPP`.
    Null,
    /// `void`: does nothing (errno `EOPNOTSUPP`).
    Void,
    /// A value with no error encoding (a GUID, an enum, a flag set, a count): 0, errno set.
    Zero,
    /// `verbs_register_driver_34`: a silent no-op, so real providers' constructors
    /// (libmlx5, libefa, loaded by perftest) run.
    NoOp,
    /// `ibv_get_sysfs_path`: the static string "/sys".
    SysfsPath,
    /// A data symbol (`verbs_allow_disassociate_destroy`, a `bool`): a 1-byte atomic.
    Bool,
}

impl Kind {
    /// The kind's name in `stubs::STUBBED` (what `tests/c/call_stubs.c` checks).
    fn tag(self) -> &'static str {
        match self {
            Self::Errno => "errno",
            Self::MinusOne => "minus_one",
            Self::NegErrno => "neg_errno",
            Self::Null => "null",
            Self::Void => "void",
            Self::Zero => "zero",
            Self::NoOp => "noop",
            Self::SysfsPath => "sysfs_path",
            Self::Bool => "data",
        }
    }
}

/// The stub kind of an export of rdma-core 44's libibverbs.
fn kind_of(name: &str) -> Kind {
    match name {
        "verbs_register_driver_34" => Kind::NoOp,
        "ibv_get_sysfs_path" => Kind::SysfsPath,
        "verbs_allow_disassociate_destroy" => Kind::Bool,
        "_ibv_query_gid_table" => Kind::NegErrno,
        // int, -1 + errno on failure
        "ibv_get_cq_event"
        | "ibv_get_async_event"
        | "ibv_get_device_index"
        | "ibv_get_pkey_index"
        | "ibv_read_sysfs_file"
        | "ibv_read_ibdev_sysfs_file"
        | "ibv_rate_to_mult"
        | "ibv_rate_to_mbps" => Kind::MinusOne,
        // values without an error encoding
        "ibv_get_device_guid"
        | "ibv_is_fork_initialized"
        | "ibv_query_qp_data_in_order"
        | "mult_to_ibv_rate"
        | "mbps_to_ibv_rate"
        | "__ioctl_final_num_attrs" => Kind::Zero,
        // void
        "ibv_free_device_list"
        | "ibv_ack_async_event"
        | "ibv_ack_cq_events"
        | "ibv_unimport_pd"
        | "ibv_unimport_mr"
        | "ibv_unimport_dm"
        | "ibv_copy_ah_attr_from_kern"
        | "ibv_copy_path_rec_from_kern"
        | "ibv_copy_path_rec_to_kern"
        | "ibv_copy_qp_attr_from_kern"
        | "verbs_set_ops"
        | "verbs_uninit_context"
        | "__verbs_log" => Kind::Void,
        // pointers (const char * included)
        "ibv_get_device_list"
        | "ibv_get_device_name"
        | "ibv_open_device"
        | "ibv_import_device"
        | "ibv_alloc_pd"
        | "ibv_import_pd"
        | "ibv_reg_mr"
        | "ibv_reg_mr_iova"
        | "ibv_reg_mr_iova2"
        | "ibv_reg_dmabuf_mr"
        | "ibv_import_mr"
        | "ibv_import_dm"
        | "ibv_create_ah"
        | "ibv_create_ah_from_wc"
        | "ibv_create_cq"
        | "ibv_create_comp_channel"
        | "ibv_create_srq"
        | "ibv_create_qp"
        | "ibv_qp_to_qp_ex"
        | "ibv_wc_status_str"
        | "ibv_event_type_str"
        | "ibv_node_type_str"
        | "ibv_port_state_str"
        | "verbs_open_device"
        | "_verbs_init_and_alloc_context" => Kind::Null,
        // everything else is an int verb: the ibv_cmd_* marshalling, execute_ioctl,
        // verbs_init_cq, ibv_query_*, ibv_modify_*, ibv_destroy_*, ibv_fork_init, …
        _ => Kind::Errno,
    }
}

/// The names of the version script (`ibverbs.map`): every `\t\tname;` line.
fn map_names(map: &str) -> Vec<String> {
    map.lines()
        .map(str::trim)
        .filter(|l| l.ends_with(';') && !l.contains(' ') && !l.contains(':') && !l.contains('}'))
        .map(|l| l.trim_end_matches(';').to_string())
        .filter(|n| !n.is_empty() && n != "*")
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The exported names a source file defines: `extern "C" fn NAME(` or `static NAME:` items
/// whose attributes (the lines above, up to the previous item) include `no_mangle`.
fn defined_in(src: &str, out: &mut BTreeSet<String>) {
    let lines: Vec<&str> = src.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let name = if line.contains("extern \"C\" fn ") {
            line.split("extern \"C\" fn ")
                .nth(1)
                .and_then(|r| r.split('(').next())
        } else if let Some(r) = line
            .split("static ")
            .nth(1)
            .filter(|_| !line.contains("//"))
        {
            r.trim_start_matches("mut ").split(':').next()
        } else {
            None
        };
        let Some(name) = name.map(str::trim) else {
            continue;
        };
        if line.contains("no_mangle") {
            out.insert(name.to_string());
            continue;
        }
        for above in lines[..i].iter().rev() {
            let t = above.trim();
            if t.contains("no_mangle") {
                out.insert(name.to_string());
                break;
            }
            if !(t.starts_with("#[") || t.starts_with("///") || t.starts_with("//") || t.is_empty())
            {
                break;
            }
        }
    }
}

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let map_path = dir.join("ibverbs.map");
    println!("cargo:rerun-if-changed={}", map_path.display());
    println!("cargo:rerun-if-changed={}", dir.join("src").display());

    let map = fs::read_to_string(&map_path).expect("verbs/ibverbs.map is checked in");
    let mut files = Vec::new();
    rust_files(&dir.join("src"), &mut files);
    files.sort();
    let mut defined = BTreeSet::new();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        defined_in(&fs::read_to_string(f).unwrap_or_default(), &mut defined);
    }

    let mut code = String::from(
        "// @generated by verbs/build.rs from ibverbs.map: the exports src/ does not define.\n",
    );
    code.push_str(
        "/// Called first by every stub: sets `errno` to `EOPNOTSUPP` (when `errno`) and, when\n\
         /// `ROCECTL_VERBS_TRACE` is set, says once per name on stderr that it was called.\n\
         fn not_implemented(name: &str, traced: &::core::sync::atomic::AtomicBool, errno: bool) {\n    \
             if std::env::var_os(\"ROCECTL_VERBS_TRACE\").is_some()\n        \
                 && !traced.swap(true, ::core::sync::atomic::Ordering::Relaxed)\n    {\n        \
                 use std::io::Write as _;\n        \
                 let _ = writeln!(\n            std::io::stderr(),\n            \
                 \"rocectl libibverbs: {name}() is not implemented (stub)\"\n        );\n    \
             }\n    \
             // after the write, which may clobber errno\n    \
             if errno {\n        crate::ffi::set_errno(libc::EOPNOTSUPP);\n    }\n}\n\n",
    );
    let mut stubbed = Vec::new();
    for name in map_names(&map) {
        if defined.contains(&name) {
            continue;
        }
        stubbed.push(name.clone());
        let kind = kind_of(&name);
        let doc = match kind {
            Kind::Errno => "Not implemented: returns `EOPNOTSUPP` (also in `errno`).",
            Kind::MinusOne => "Not implemented: returns -1 with `errno = EOPNOTSUPP`.",
            Kind::NegErrno => "Not implemented: returns `-EOPNOTSUPP` (errno set too).",
            Kind::Null => "Not implemented: returns NULL with `errno = EOPNOTSUPP`.",
            Kind::Void => "Not implemented: does nothing (`errno = EOPNOTSUPP`).",
            Kind::Zero => "Not implemented: returns 0 with `errno = EOPNOTSUPP`.",
            Kind::NoOp => "Provider registration: a no-op (rocectl is the only provider).",
            Kind::SysfsPath => "The sysfs root, `\"/sys\"` (rocectl reads nothing from it).",
            Kind::Bool => "Provider flag of rdma-core's private ABI; rocectl never reads it.",
        };
        let (ret, body) = match kind {
            Kind::Errno => ("::core::ffi::c_int", "libc::EOPNOTSUPP"),
            Kind::MinusOne => ("::core::ffi::c_int", "-1"),
            Kind::NegErrno => ("isize", "-(libc::EOPNOTSUPP as isize)"),
            Kind::Null => ("*mut ::core::ffi::c_void", "::core::ptr::null_mut()"),
            Kind::Void => ("", ""),
            Kind::Zero => ("u64", "0"),
            Kind::NoOp => {
                writeln!(
                    code,
                    "/// {doc}\n#[no_mangle]\npub extern \"C\" fn {name}() {{\n    \
                     not_implemented(\"{name}\", &TRACED[{i}], false);\n}}\n",
                    i = stubbed.len() - 1
                )
                .expect("writing to a String");
                continue;
            }
            Kind::SysfsPath => {
                writeln!(
                    code,
                    "/// {doc}\n#[no_mangle]\npub extern \"C\" fn {name}() -> *const ::core::ffi::c_char {{\n    \
                     not_implemented(\"{name}\", &TRACED[{i}], false);\n    c\"/sys\".as_ptr()\n}}\n",
                    i = stubbed.len() - 1
                )
                .expect("writing to a String");
                continue;
            }
            Kind::Bool => {
                writeln!(
                    code,
                    "/// {doc}\n#[no_mangle]\npub static {name}: ::core::sync::atomic::AtomicBool = \
                     ::core::sync::atomic::AtomicBool::new(false);\n"
                )
                .expect("writing to a String");
                continue;
            }
        };
        let ret = if ret.is_empty() {
            String::new()
        } else {
            format!(" -> {ret}")
        };
        let body = if body.is_empty() {
            String::new()
        } else {
            format!("    {body}\n")
        };
        writeln!(
            code,
            "/// {doc}\n#[no_mangle]\npub extern \"C\" fn {name}(){ret} {{\n    \
             not_implemented(\"{name}\", &TRACED[{i}], true);\n{body}}}\n",
            i = stubbed.len() - 1
        )
        .expect("writing to a String");
    }
    writeln!(
        code,
        "/// One flag per stub: set once its first call has been traced.\n\
         static TRACED: [::core::sync::atomic::AtomicBool; {n}] = \
         [const {{ ::core::sync::atomic::AtomicBool::new(false) }}; {n}];\n\n\
         /// The names this build stubs, in `ibverbs.map` order, each with what it returns:\n\
         /// `errno` (`EOPNOTSUPP`), `minus_one`, `neg_errno` (`-EOPNOTSUPP`), `null`, `void`,\n\
         /// `zero` (all with `errno = EOPNOTSUPP`), `noop`, `sysfs_path` (\"/sys\") or `data`\n\
         /// (a variable, not a function).\n\
         pub const STUBBED: [(&str, &str); {n}] = [{list}];",
        n = stubbed.len(),
        list = stubbed
            .iter()
            .map(|s| format!("(\"{s}\", \"{}\")", kind_of(s).tag()))
            .collect::<Vec<_>>()
            .join(", ")
    )
    .expect("writing to a String");
    fs::write(out.join("stubs.rs"), code).expect("OUT_DIR is writable");
}
