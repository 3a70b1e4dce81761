//! Devices, contexts and queries through the exported C functions, in network namespaces
//! joined by a veth pair: discovery from the environment, a configuration file and the
//! defaults; every query checked against the interface (`NetDevice`, its GID table as
//! rdma_rxe builds it); the caller's lengths respected to the byte.
//!
//! The environment is process-wide, so the tests here take [`ENV`] for their whole run.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::Mutex;

use ibverbs::context::*;
use ibverbs::device::*;
use ibverbs::sys::*;
use roce_testkit::netns::{netns_or_skip, NetnsPair};
use roce_transport::netdev;

static ENV: Mutex<()> = Mutex::new(());

fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets (or removes, for `None`) the two discovery variables.
fn set_env(devices: Option<&str>, conf: Option<&str>) {
    // SAFETY (for the unsafe env calls): every test of this file holds `ENV`, and nothing
    // else in the process reads these variables concurrently.
    unsafe {
        match devices {
            Some(v) => std::env::set_var("ROCECTL_VERBS_DEVICES", v),
            None => std::env::remove_var("ROCECTL_VERBS_DEVICES"),
        }
        match conf {
            Some(v) => std::env::set_var("ROCECTL_VERBS_CONF", v),
            None => std::env::remove_var("ROCECTL_VERBS_CONF"),
        }
    }
}

fn cstr(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: NUL-terminated strings of the library or of a C struct.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn arr(a: &[c_char]) -> String {
    cstr(a.as_ptr())
}

/// The devices `ibv_get_device_list` returns now, as (pointer, name).
fn device_list() -> Vec<(*mut ibv_device, String)> {
    let mut n: c_int = -1;
    // SAFETY: `n` is a live int.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null());
    let mut out = Vec::new();
    for i in 0..usize::try_from(n).unwrap() {
        // SAFETY: `list` has n entries and a NULL.
        let d = unsafe { *list.add(i) };
        // SAFETY: a device of the list.
        out.push((d, cstr(unsafe { ibv_get_device_name(d) })));
    }
    // SAFETY: the list's terminator.
    assert!(unsafe { *list.add(out.len()) }.is_null());
    // SAFETY: the list from ibv_get_device_list, freed once.
    unsafe { ibv_free_device_list(list) };
    out
}

fn find(name: &str) -> *mut ibv_device {
    device_list()
        .into_iter()
        .find(|d| d.1 == name)
        .unwrap_or_else(|| panic!("no device {name}"))
        .0
}

fn eui64(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xFF,
        0xFE,
        mac[3],
        mac[4],
        mac[5],
    ])
}

#[test]
fn discovery_from_the_environment_a_config_file_and_the_defaults() {
    if !netns_or_skip("discovery_from_the_environment_a_config_file_and_the_defaults") {
        return;
    }
    let _env = env_lock();
    let pair = NetnsPair::create("vdisc").unwrap();
    let a = pair.a().clone();
    let conf = std::env::temp_dir().join(format!("rocectl-verbs-{}.conf", std::process::id()));
    std::fs::write(
        &conf,
        "# test\nconf_a = veth-a   # the veth\nconf_lo=lo@127.0.0.1\nthis line is bad\nconf_x = nosuchif0\n",
    )
    .unwrap();
    let conf_path = conf.to_str().unwrap().to_owned();
    a.netns()
        .enter_scoped(|| {
            // 3. Defaults: the veth only (lo is loopback). Skipped when this host has the
            // system-wide file, which would take precedence.
            set_env(None, None);
            if std::path::Path::new(DEFAULT_CONF).exists() {
                eprintln!("{DEFAULT_CONF} exists: default discovery not checked");
            } else {
                let names: Vec<String> = device_list().into_iter().map(|d| d.1).collect();
                assert_eq!(names, ["rocectl_veth-a"]);
                let d = find("rocectl_veth-a");
                // SAFETY: a device of this library, valid for the process.
                let dev = unsafe { &*d };
                let idx = unsafe { ibv_get_device_index(d) };
                assert!(idx >= 0);
                assert_eq!(arr(&dev.dev_name), format!("uverbs{idx}"));
                assert_eq!(arr(&dev.dev_path), format!("/dev/infiniband/uverbs{idx}"));
                assert_eq!(arr(&dev.ibdev_path), "/sys/class/infiniband/rocectl_veth-a");
                assert_eq!(dev.node_type, ibv_node_type_IBV_NODE_CA);
                assert_eq!(dev.transport_type, ibv_transport_type_IBV_TRANSPORT_IB);
                // SAFETY: a device of this library.
                let guid = unsafe { ibv_get_device_guid(d) };
                assert_eq!(u64::from_be(guid), eui64(a.mac()));
                // libmlx5's mlx5dv_is_supported reads a pointer right after ibv_device.
                // SAFETY: the record continues past the ibv_device.
                let after = unsafe { *d.cast::<u8>().add(size_of::<ibv_device>()).cast::<usize>() };
                assert_eq!(after, 0);
                // The same record on every list, after the old list was freed.
                assert_eq!(find("rocectl_veth-a"), d);
            }

            // 2. The configuration file: good lines only, in order.
            set_env(None, Some(&conf_path));
            let names: Vec<String> = device_list().into_iter().map(|d| d.1).collect();
            assert_eq!(names, ["conf_a", "conf_lo"]);

            // 1. The environment wins over the file.
            set_env(
                Some(&format!("env_a=veth-a@{},env_bad", a.ipv4())),
                Some(&conf_path),
            );
            let names: Vec<String> = device_list().into_iter().map(|d| d.1).collect();
            assert_eq!(names, ["env_a"]);

            // A configuration file that cannot be read gives no devices (and says so).
            set_env(None, Some("/nonexistent/rocectl.conf"));
            assert!(device_list().is_empty());
            set_env(None, None);
        })
        .unwrap();
    std::fs::remove_file(conf).unwrap();
    // Foreign pointers are refused, not dereferenced.
    let mut junk = [0u8; 700];
    let p = junk.as_mut_ptr().cast::<ibv_device>();
    // SAFETY: the functions check the pointer against their records first.
    unsafe {
        assert!(ibv_get_device_name(p).is_null());
        assert_eq!(ibv_get_device_index(p), -1);
        assert_eq!(ibv_get_device_guid(p), 0);
        assert!(ibv_open_device(p).is_null());
    }
}

/// Opens `name` inside the pair's namespace A; the engine's socket stays there.
fn open_in(pair: &NetnsPair, spec: &str, name: &str) -> (*mut ibv_context, i32) {
    let spec = spec.to_owned();
    let name = name.to_owned();
    let (p, e) = pair
        .a()
        .netns()
        .enter_scoped(move || {
            set_env(Some(&spec), None);
            let d = find(&name);
            // SAFETY: a device of this library.
            let c = unsafe { ibv_open_device(d) };
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            set_env(None, None);
            (c as usize, e)
        })
        .unwrap();
    (p as *mut ibv_context, e)
}

#[test]
fn queries_describe_the_interface() {
    if !netns_or_skip("queries_describe_the_interface") {
        return;
    }
    let _env = env_lock();
    let pair = NetnsPair::create("vquery").unwrap();
    let a = pair.a().clone();
    let (ctx, _) = open_in(&pair, "q_a=veth-a", "q_a");
    assert!(!ctx.is_null());
    // A second context on the same device shares the engine (no EADDRINUSE).
    let (ctx2, e) = open_in(&pair, "q_a=veth-a", "q_a");
    assert!(!ctx2.is_null(), "second open failed: errno {e}");
    // SAFETY: open.
    assert_eq!(unsafe { ibv_close_device(ctx2) }, 0);
    // An address that is not the interface's: NULL and EADDRNOTAVAIL.
    let (bad, e) = open_in(&pair, "q_bad=veth-a@10.254.254.254", "q_bad");
    assert!(bad.is_null());
    assert_eq!(e, libc::EADDRNOTAVAIL);

    // SAFETY: `ctx` is open until the end of the test.
    let c = unsafe { &*ctx };
    // cmd_fd: the memfd that identifies the context (ibv_import_device), distinct from async_fd.
    assert!(c.cmd_fd >= 0 && c.cmd_fd != c.async_fd);
    assert!(c.async_fd >= 0);
    assert_eq!(c.num_comp_vectors, 1);
    // SAFETY: the context's device is one of ours.
    assert_eq!(cstr(unsafe { ibv_get_device_name(c.device) }), "q_a");

    let ctx_addr = ctx as usize;
    a.netns()
        .enter_scoped(|| {
            let ctx = ctx_addr as *mut ibv_context;
            // SAFETY: open until the end of the test.
            let c = unsafe { &*ctx };
            let nd = netdev::interface("veth-a").unwrap();
            let table = nd.gid_table();
            assert_eq!(table[1].gid, roce_transport::Gid::from(a.ipv4()));

            // ibv_query_device and query_device_ex.
            // SAFETY: zeroed C data, filled by the call.
            let mut da: ibv_device_attr = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { ibv_query_device(ctx, &mut da) }, 0);
            assert_eq!(
                arr(&da.fw_ver),
                concat!(env!("CARGO_PKG_VERSION"), " rocectl")
            );
            assert_eq!(u64::from_be(da.node_guid), eui64(a.mac()));
            assert_eq!(da.sys_image_guid, da.node_guid);
            assert_eq!(da.vendor_id, 0xFF_FFFF);
            assert_eq!(da.vendor_part_id, 0);
            assert_eq!(da.phys_port_cnt, 1);
            assert_eq!(da.atomic_cap, ibv_atomic_cap_IBV_ATOMIC_HCA);
            assert!(da.max_qp > 1000 && da.max_qp_wr >= 1024 && da.max_sge >= 16);
            assert_eq!(da.max_pkeys, 1);

            // SAFETY: `ctx` is extended, its query_device_ex slot is set.
            let vctx = unsafe { &*ctx.cast::<u8>().sub(320).cast::<verbs_context>() };
            let qdx = vctx.query_device_ex.unwrap();
            let mut buf = [0xA5u8; size_of::<ibv_device_attr_ex>() + 16];
            // SAFETY: the buffer is larger than the struct.
            let rc = unsafe { qdx(ctx, std::ptr::null(), buf.as_mut_ptr().cast(), buf.len()) };
            assert_eq!(rc, 0);
            // SAFETY: the call wrote a whole ibv_device_attr_ex.
            let dx = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<ibv_device_attr_ex>()) };
            assert_eq!(dx.orig_attr.vendor_id, 0xFF_FFFF);
            assert_eq!(dx.comp_mask, 0);
            assert_eq!(dx.odp_caps.general_caps, 0);
            assert_eq!(
                dx.device_cap_flags_ex & 0xFFFF_FFFF,
                u64::from(da.device_cap_flags)
            );
            assert!(buf[size_of::<ibv_device_attr_ex>()..]
                .iter()
                .all(|&b| b == 0));
            // A caller with the 232-byte legacy struct gets exactly that.
            let mut short = [0xA5u8; size_of::<ibv_device_attr>() + 8];
            let n = size_of::<ibv_device_attr>();
            // SAFETY: the call writes n bytes.
            assert_eq!(
                unsafe { qdx(ctx, std::ptr::null(), short.as_mut_ptr().cast(), n) },
                0
            );
            assert!(short[n..].iter().all(|&b| b == 0xA5));
            let input = ibv_query_device_ex_input { comp_mask: 1 };
            // SAFETY: as above.
            assert_eq!(
                unsafe { qdx(ctx, &input, buf.as_mut_ptr().cast(), buf.len()) },
                libc::EINVAL
            );

            // query_port: the verbs_context slot with the full length.
            let qp = vctx.query_port.unwrap();
            // SAFETY: zeroed C data.
            let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: a whole ibv_port_attr.
            assert_eq!(
                unsafe { qp(ctx, 1, &mut pa, size_of::<ibv_port_attr>()) },
                0
            );
            assert_eq!(pa.state, ibv_port_state_IBV_PORT_ACTIVE);
            assert_eq!(pa.phys_state, 5);
            assert_eq!(pa.max_mtu, ibv_mtu_IBV_MTU_4096);
            assert_eq!(
                pa.active_mtu, ibv_mtu_IBV_MTU_1024,
                "MTU 1500 gives 1024, as rxe"
            );
            assert_eq!(pa.gid_tbl_len as usize, table.len());
            assert_eq!(pa.link_layer, IBV_LINK_LAYER_ETHERNET as u8);
            assert_ne!(
                pa.port_cap_flags & ibv_port_cap_flags_IBV_PORT_IP_BASED_GIDS,
                0
            );
            assert_ne!(pa.port_cap_flags & ibv_port_cap_flags_IBV_PORT_CM_SUP, 0);
            assert_eq!((pa.pkey_tbl_len, pa.lid, pa.sm_lid), (1, 0, 0));
            assert_eq!((pa.active_width, pa.active_speed), (1, 1));
            // SAFETY: as above.
            assert_eq!(
                unsafe { qp(ctx, 2, &mut pa, size_of::<ibv_port_attr>()) },
                libc::EINVAL
            );

            // A short length: only that many bytes are written.
            let mut g = [0xA5u8; 64];
            // SAFETY: 16 bytes are writable (64 are).
            assert_eq!(unsafe { qp(ctx, 1, g.as_mut_ptr().cast(), 16) }, 0);
            assert_eq!(
                u32::from_ne_bytes(g[0..4].try_into().unwrap()),
                ibv_port_state_IBV_PORT_ACTIVE
            );
            assert!(g[16..].iter().all(|&b| b == 0xA5));
            // A longer one (a newer header): our struct, then zeroes.
            let mut g = [0xA5u8; 64];
            // SAFETY: 60 bytes are writable.
            assert_eq!(unsafe { qp(ctx, 1, g.as_mut_ptr().cast(), 60) }, 0);
            assert!(g[52..60].iter().all(|&b| b == 0));
            assert!(g[60..].iter().all(|&b| b == 0xA5));

            // The exported compat ibv_query_port: 48 bytes, not one more.
            let mut g = [0xA5u8; 64];
            // SAFETY: 64 bytes are writable.
            assert_eq!(unsafe { ibv_query_port(ctx, 1, g.as_mut_ptr().cast()) }, 0);
            assert!(
                g[48..].iter().all(|&b| b == 0xA5),
                "wrote past the 48-byte compat struct"
            );
            // SAFETY: read back the prefix.
            let pc = unsafe { std::ptr::read_unaligned(g.as_ptr().cast::<ibv_port_attr>()) };
            assert_eq!(pc.state, pa.state);
            assert_eq!(pc.active_mtu, pa.active_mtu);
            assert_eq!(pc.gid_tbl_len, pa.gid_tbl_len);
            assert_eq!(pc.link_layer, pa.link_layer);
            assert_eq!(pc.flags, 0);

            // GIDs: every entry as the interface's table, every API.
            for e in &table {
                let i = c_int::from(e.index);
                // SAFETY: zeroed C data, filled by the calls.
                let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
                assert_eq!(unsafe { ibv_query_gid(ctx, 1, i, &mut gid) }, 0);
                // SAFETY: every member of the GID union is plain bytes.
                assert_eq!(unsafe { gid.raw }, e.gid.0, "GID[{i}]");
                let mut ty = 99u32;
                assert_eq!(
                    // SAFETY: a live context and a live out-parameter.
                    unsafe { ibv_query_gid_type(ctx, 1, e.index.into(), &mut ty) },
                    0
                );
                assert_eq!(ty, 1, "sysfs enum: RoCE v2 = 1");
                // SAFETY: zeroed C data.
                let mut ent: ibv_gid_entry = unsafe { std::mem::zeroed() };
                let rc = unsafe {
                    _ibv_query_gid_ex(
                        ctx,
                        1,
                        e.index.into(),
                        &mut ent,
                        0,
                        size_of::<ibv_gid_entry>(),
                    )
                };
                assert_eq!(rc, 0);
                // SAFETY: every member of the GID union is plain bytes.
                assert_eq!(unsafe { ent.gid.raw }, e.gid.0);
                assert_eq!(ent.gid_index, u32::from(e.index));
                assert_eq!(ent.port_num, 1);
                assert_eq!(ent.gid_type, ibv_gid_type_IBV_GID_TYPE_ROCE_V2);
                assert_eq!(ent.ndev_ifindex, nd.index);
            }
            let past = table.len();
            // SAFETY: zeroed C data.
            let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
            assert_eq!(
                // SAFETY: a live context and a live out-parameter.
                unsafe { ibv_query_gid(ctx, 1, past as c_int, &mut gid) },
                -1
            );
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_query_gid(ctx, 2, 0, &mut gid) }, -1);
            let mut ty = 0u32;
            assert_eq!(
                // SAFETY: as above.
                unsafe { ibv_query_gid_type(ctx, 1, past as u32, &mut ty) },
                -1
            );
            // SAFETY: zeroed C data.
            let mut ent: ibv_gid_entry = unsafe { std::mem::zeroed() };
            let esz = size_of::<ibv_gid_entry>();
            assert_eq!(
                // SAFETY: as above.
                unsafe { _ibv_query_gid_ex(ctx, 1, past as u32, &mut ent, 0, esz) },
                libc::EINVAL
            );
            assert_eq!(
                // SAFETY: as above.
                unsafe { _ibv_query_gid_ex(ctx, 1, 0, &mut ent, 1, esz) },
                libc::EOPNOTSUPP
            );

            // The whole table, with a larger entry stride (zero-filled).
            let stride = esz + 8;
            let mut tbuf = vec![0xA5u8; stride * 8];
            // SAFETY: 8 entries of `stride` bytes.
            let n = unsafe { _ibv_query_gid_table(ctx, tbuf.as_mut_ptr().cast(), 8, 0, stride) };
            assert_eq!(n, table.len() as isize);
            for (i, e) in table.iter().enumerate() {
                let at = &tbuf[i * stride..(i + 1) * stride];
                assert_eq!(&at[..16], &e.gid.0);
                assert_eq!(u32::from_ne_bytes(at[24..28].try_into().unwrap()), 2);
                assert!(at[esz..].iter().all(|&b| b == 0));
            }
            // Too small for the table: -EINVAL.
            // SAFETY: one entry of `esz` bytes is writable.
            let n = unsafe { _ibv_query_gid_table(ctx, tbuf.as_mut_ptr().cast(), 1, 0, esz) };
            assert_eq!(n, -(libc::EINVAL as isize));

            // P_Keys.
            let mut pk: u16 = 0;
            // SAFETY: a live context and a live out-parameter.
            assert_eq!(unsafe { ibv_query_pkey(ctx, 1, 0, &mut pk) }, 0);
            assert_eq!(pk, 0xFFFF);
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_query_pkey(ctx, 1, 1, &mut pk) }, -1);
            // SAFETY: a live context.
            assert_eq!(unsafe { ibv_get_pkey_index(ctx, 1, 0xFFFF) }, 0);
            assert_eq!(
                // SAFETY: as above.
                unsafe { ibv_get_pkey_index(ctx, 1, 0x7FFF_u16.to_be()) },
                -1
            );

            // The sysfs files ibv_devinfo, UCX and perftest read, from memory.
            // SAFETY: the context's device is one of ours, valid for the process.
            let dir = CString::new(arr(&unsafe { &*c.device }.ibdev_path)).unwrap();
            let read = |file: &str| -> Option<String> {
                let f = CString::new(file).unwrap();
                let mut b = [0 as c_char; 64];
                // SAFETY: valid strings and a 64-byte buffer.
                let n =
                    unsafe { ibv_read_sysfs_file(dir.as_ptr(), f.as_ptr(), b.as_mut_ptr(), 64) };
                (n >= 0).then(|| {
                    let s = arr(&b);
                    assert_eq!(s.len(), n as usize);
                    s
                })
            };
            assert_eq!(read("node_type").unwrap(), "1: CA");
            let g = eui64(a.mac()).to_be_bytes();
            let want = format!(
                "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
                g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
            );
            assert_eq!(read("node_guid").unwrap(), want);
            assert!(read("board_id").is_some());
            assert_eq!(read("ports/1/gid_attrs/types/1").unwrap(), "RoCE v2");
            assert_eq!(read("ports/1/gid_attrs/ndevs/0").unwrap(), "veth-a");
            assert_eq!(read(&format!("ports/1/gid_attrs/types/{past}")), None);
            assert_eq!(read("ports/1/pkeys/0").unwrap(), "0xffff");
            assert_eq!(read("no_such_file"), None);

            // The port follows the interface: down, then up again.
            a.netns()
                .exec("ip", &["link", "set", "veth-a", "down"])
                .unwrap();
            let mut g = [0u8; size_of::<ibv_port_attr>()];
            // SAFETY: 52 bytes are writable (the call writes 48).
            assert_eq!(unsafe { ibv_query_port(ctx, 1, g.as_mut_ptr().cast()) }, 0);
            // SAFETY: the buffer is a whole ibv_port_attr; the call wrote its first 48 bytes.
            let pc = unsafe { std::ptr::read_unaligned(g.as_ptr().cast::<ibv_port_attr>()) };
            assert_eq!(pc.state, ibv_port_state_IBV_PORT_DOWN);
            assert_eq!(pc.phys_state, 3, "DISABLED");
            a.netns()
                .exec("ip", &["link", "set", "veth-a", "up"])
                .unwrap();
        })
        .unwrap();
    // SAFETY: open; nothing uses it afterwards.
    assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
}
