//! Every struct layout `src/sys.rs` reproduces, checked against the C compiler and the real
//! `<infiniband/verbs.h>` (Debian's libibverbs-dev 44).
//!
//! `sys.rs` is bindgen output: each type carries compile-time checks of its size, alignment and
//! field offsets (`["Size of X"][size_of::<X>() - N]`, `["Offset of field: X::f"][...]`), so the
//! Rust side holds the numbers bindgen saw. This test turns every such check of a named type
//! into a C `_Static_assert` (`sizeof`, `_Alignof`, `offsetof`) and compiles them against the
//! installed header: the numbers must be the C compiler's, not only bindgen's. Anonymous types
//! (`…_bindgen_ty_N`) and anonymous members (`__bindgen_anon_N`) have no C spelling and are
//! skipped; their named containers' sizes and offsets still cover them.
//!
//! Needs `cc` and `/usr/include/infiniband/verbs.h`; without them it is skipped (testkit's
//! policy: `SKIPPED` locally, a failure in CI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use roce_testkit::skip;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// One layout fact of `sys.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Check {
    /// `sizeof(type) == n`
    Size(String, usize),
    /// `_Alignof(type) == n`
    Align(String, usize),
    /// `offsetof(type, field) == n`
    Offset(String, String, usize),
}

/// The checks of `sys.rs`, in file order: every `["<label>"][… - Nusize]` item.
fn parse_checks(src: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut rest = src;
    while let Some(start) = rest.find("[\"") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find("\"]") else { break };
        let label = &rest[..end];
        rest = &rest[end + 2..];
        let kinds = ["Size of ", "Alignment of ", "Offset of field: "];
        if !kinds.iter().any(|k| label.starts_with(k)) {
            continue;
        }
        // The value: `- 664usize]` closes the expression that follows the label.
        let Some(close) = rest.find("usize]") else {
            break;
        };
        let expr = &rest[..close];
        let digits = expr
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap_or("");
        let Ok(n) = digits.parse::<usize>() else {
            panic!("cannot read the value of {label:?} in {expr:?}")
        };
        if let Some(ty) = label.strip_prefix("Size of ") {
            checks.push(Check::Size(ty.to_string(), n));
        } else if let Some(ty) = label.strip_prefix("Alignment of ") {
            checks.push(Check::Align(ty.to_string(), n));
        } else if let Some(tf) = label.strip_prefix("Offset of field: ") {
            let (ty, field) = tf.split_once("::").expect("offset labels name TYPE::FIELD");
            checks.push(Check::Offset(ty.to_string(), field.to_string(), n));
        }
    }
    checks
}

/// The C name of a field bindgen renamed: it appends `_` to Rust keywords (`type` → `type_`).
fn c_field(field: &str) -> &str {
    const KEYWORDS: [&str; 38] = [
        "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn",
        "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref",
        "return", "self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use",
        "where", "while", "priv", "box", "final", "override",
    ];
    match field.strip_suffix('_') {
        Some(stem) if KEYWORDS.contains(&stem) => stem,
        _ => field,
    }
}

/// Whether a Rust type or field name stands for something anonymous in C.
fn anonymous(name: &str) -> bool {
    name.contains("_bindgen_ty_")
        || name.starts_with("__bindgen_anon_")
        || name.starts_with("_bitfield")
}

/// How C spells the type bindgen named `ty`: `struct ty`, `union ty`, or the typedef `ty`,
/// decided from the preprocessed header (whitespace collapsed).
fn c_type(ty: &str, header: &str) -> String {
    for tag in ["struct", "union"] {
        if header.contains(&format!(" {tag} {ty} {{")) {
            return format!("{tag} {ty}");
        }
    }
    ty.to_string()
}

/// The header, preprocessed, with every run of whitespace one space.
fn preprocessed_header() -> String {
    let out = Command::new("cc")
        .args(["-E", "-P", "-x", "c", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .expect("stdin is piped")
                .write_all(b"#include <infiniband/verbs.h>\n")?;
            child.wait_with_output()
        })
        .expect("cc -E runs");
    assert!(out.status.success(), "cc -E of <infiniband/verbs.h> failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flat = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        flat.push(' ');
        flat.push_str(word);
    }
    flat.push(' ');
    flat
}

/// The C translation unit asserting `checks`; returns it and how many asserts it holds.
fn c_source(checks: &[Check], header: &str) -> (String, usize) {
    let mut c = String::from(
        "/* generated by verbs/tests/layout.rs from src/sys.rs */\n\
         #include <stddef.h>\n#include <infiniband/verbs.h>\n\n",
    );
    let mut n = 0;
    for check in checks {
        let line = match check {
            Check::Size(ty, v) if !anonymous(ty) => {
                let t = c_type(ty, header);
                format!("_Static_assert(sizeof({t}) == {v}, \"sizeof({t}) is not {v}\");")
            }
            Check::Align(ty, v) if !anonymous(ty) => {
                let t = c_type(ty, header);
                format!("_Static_assert(_Alignof({t}) == {v}, \"_Alignof({t}) is not {v}\");")
            }
            Check::Offset(ty, f, v) if !anonymous(ty) && !anonymous(f) => {
                let (t, f) = (c_type(ty, header), c_field(f));
                format!(
                    "_Static_assert(offsetof({t}, {f}) == {v}, \"offsetof({t}, {f}) is not {v}\");"
                )
            }
            _ => continue,
        };
        c.push_str(&line);
        c.push('\n');
        n += 1;
    }
    (c, n)
}

/// Compiles `source` (syntax only) with cc; `Err(stderr)` when it does not compile.
fn compile(source: &str, name: &str) -> Result<(), String> {
    let dir = scratch();
    let path = dir.join(name);
    std::fs::write(&path, source).expect("the scratch directory is writable");
    let out = Command::new("cc")
        .args(["-std=gnu11", "-fsyntax-only", "-Wall"])
        .arg(&path)
        .output()
        .expect("cc runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `target/<profile>/verbs-tests`, next to this test binary.
fn scratch() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let d = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps")
        .join("verbs-tests");
    std::fs::create_dir_all(&d).expect("the target directory is writable");
    d
}

fn prerequisites() -> Result<(), String> {
    if !Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Err("`cc` is not installed (apt install build-essential)".into());
    }
    if !Path::new(HEADER).exists() {
        return Err(format!("{HEADER} is missing (apt install libibverbs-dev)"));
    }
    Ok(())
}

fn sys_rs() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sys.rs");
    std::fs::read_to_string(&path).expect("src/sys.rs is readable")
}

#[test]
fn every_named_layout_of_sys_rs_matches_the_c_compiler() {
    if let Err(why) = prerequisites() {
        return skip("every_named_layout_of_sys_rs_matches_the_c_compiler", why);
    }
    let checks = parse_checks(&sys_rs());

    // The layouts of design/verbs-abi.md, section 3 (measured with gdb on Debian 12).
    let sizes: BTreeMap<&str, usize> = checks
        .iter()
        .filter_map(|c| match c {
            Check::Size(t, n) => Some((t.as_str(), *n)),
            _ => None,
        })
        .collect();
    let study = [
        ("ibv_device", 664),
        ("ibv_context", 328),
        ("ibv_context_ops", 256),
        ("verbs_context", 648),
        ("ibv_pd", 16),
        ("ibv_mr", 48),
        ("ibv_cq", 128),
        ("ibv_cq_ex", 288),
        ("ibv_qp", 160),
        ("ibv_qp_ex", 352),
        ("ibv_srq", 128),
        ("ibv_ah", 24),
        ("ibv_comp_channel", 16),
        ("ibv_wc", 48),
        ("ibv_send_wr", 128),
        ("ibv_recv_wr", 32),
        ("ibv_sge", 16),
        ("ibv_qp_attr", 144),
        ("ibv_ah_attr", 32),
        ("ibv_qp_init_attr", 64),
        ("ibv_qp_init_attr_ex", 136),
        ("ibv_port_attr", 52),
        ("ibv_device_attr", 232),
        ("ibv_device_attr_ex", 400),
        ("ibv_gid_entry", 32),
    ];
    for (ty, size) in study {
        assert_eq!(sizes.get(ty), Some(&size), "sys.rs's size of {ty}");
    }
    let offsets: BTreeMap<(&str, &str), usize> = checks
        .iter()
        .filter_map(|c| match c {
            Check::Offset(t, f, n) => Some(((t.as_str(), f.as_str()), *n)),
            _ => None,
        })
        .collect();
    for (ty, field, off) in [
        ("ibv_context", "cmd_fd", 264),
        ("ibv_context", "abi_compat", 320),
        ("verbs_context", "sz", 312),
        ("verbs_context", "context", 320),
        ("ibv_qp", "state", 56),
        ("ibv_cq_ex", "start_poll", 144),
        ("ibv_port_attr", "link_layer", 46),
        ("ibv_device_attr", "phys_port_cnt", 227),
    ] {
        assert_eq!(
            offsets.get(&(ty, field)),
            Some(&off),
            "sys.rs's offset of {ty}::{field}"
        );
    }

    let header = preprocessed_header();
    let (source, asserted) = c_source(&checks, &header);
    // sys.rs holds ~280 types and ~1400 offsets; most are named.
    assert!(
        asserted >= 1000,
        "only {asserted} checks of {} are C-checkable",
        checks.len()
    );
    assert!(
        source.contains("sizeof(struct verbs_context) == 648"),
        "verbs_context unchecked"
    );
    assert!(
        source.contains("offsetof(struct ibv_wc, qp_num) == 28"),
        "ibv_wc unchecked"
    );
    if let Err(errors) = compile(&source, "layout_check.c") {
        let failed: Vec<&str> = errors
            .lines()
            .filter(|l| l.contains("error"))
            .take(40)
            .collect();
        panic!(
            "sys.rs disagrees with the C compiler on <infiniband/verbs.h> \
             (regenerate it with verbs/gen-sys.sh):\n{}",
            failed.join("\n")
        );
    }
}

/// The negative control: one wrong number makes the generated C fail to compile, so a layout
/// that drifted from the header cannot pass.
#[test]
fn a_wrong_size_or_offset_fails_to_compile() {
    if let Err(why) = prerequisites() {
        return skip("a_wrong_size_or_offset_fails_to_compile", why);
    }
    let header = preprocessed_header();
    for (wrong, expect) in [
        (
            Check::Size("ibv_device".into(), 665),
            "sizeof(struct ibv_device) is not 665",
        ),
        (
            Check::Offset("ibv_qp_attr".into(), "rate_limit".into(), 132),
            "offsetof(struct ibv_qp_attr, rate_limit) is not 132",
        ),
        (
            Check::Offset("ibv_flow_spec_eth".into(), "type_".into(), 4),
            "offsetof(struct ibv_flow_spec_eth, type) is not 4",
        ),
    ] {
        let (source, n) = c_source(std::slice::from_ref(&wrong), &header);
        assert_eq!(n, 1);
        let errors = compile(&source, "layout_wrong.c").expect_err("a wrong layout compiled");
        assert!(
            errors.contains(expect),
            "cc did not name the mismatch {expect:?}:\n{errors}"
        );
    }
}

#[test]
fn the_parser_reads_multi_line_checks() {
    let src = r#"
    ["Size of __atomic_wide_counter__bindgen_ty_1"]
        [::core::mem::size_of::<__atomic_wide_counter__bindgen_ty_1>() - 8usize];
    ["Offset of field: ibv_wc::qp_num"][::core::mem::offset_of!(ibv_wc, qp_num) - 28usize];
    ["Alignment of ibv_wc"][::core::mem::align_of::<ibv_wc>() - 8usize];
    let x = ["not a check"];
    "#;
    assert_eq!(
        parse_checks(src),
        [
            Check::Size("__atomic_wide_counter__bindgen_ty_1".into(), 8),
            Check::Offset("ibv_wc".into(), "qp_num".into(), 28),
            Check::Align("ibv_wc".into(), 8),
        ]
    );
    assert_eq!(c_field("type_"), "type");
    assert_eq!(c_field("priv_"), "priv");
    assert_eq!(c_field("wr_id"), "wr_id");
    assert_eq!(c_field("__value64"), "__value64");
}
