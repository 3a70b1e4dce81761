//! Device discovery without sysfs (`ibv_get_device_list` and friends). OWNER: helper "device".
//!
//! A device is a network interface and the address the engine binds on it. Where they come
//! from, first source present wins:
//!
//! 1. `ROCECTL_VERBS_DEVICES="name=IFNAME[@ADDR][,name=IFNAME[@ADDR]...]"`;
//! 2. the configuration file `$ROCECTL_VERBS_CONF`, else `/etc/rocectl/verbs.conf`: lines
//!    `name = IFNAME[@ADDR]`, `#` starts a comment;
//! 3. one device per interface that is up, is not loopback and has an address, named
//!    `rocectl_<ifname>` (rdma_rxe's `rxe_<ifname>` habit).
//!
//! An empty variable counts as unset. A source that is present decides alone: a
//! configuration file whose lines are all bad gives no devices, and a `$ROCECTL_VERBS_CONF`
//! that cannot be read gives none either (with a line saying so) rather than the defaults.
//! A bad entry is skipped with one line on stderr (once per process). Without `@ADDR` the
//! engine binds the interface's first IPv4 address, else its first IPv6 address that is not
//! link-local.
//!
//! Discovery is cheap: it lists the interfaces (`getifaddrs`) and nothing else; the engine
//! (socket, thread) starts in `ibv_open_device`. Each device's record is allocated once and
//! lives for the process, so pointers from an earlier `ibv_get_device_list` stay valid after
//! `ibv_free_device_list` and a new list; a name always means the record first made for it.
//!
//! The record's `ibv_device` says what rdma-core's would: `name` = `rocectl_x`, `dev_name` =
//! `uverbsN`, `dev_path` = `/dev/infiniband/uverbsN`, `ibdev_path` =
//! `/sys/class/infiniband/<name>` (no such directory exists: [`ibv_read_sysfs_file`] answers
//! for it from memory), node type CA, transport IB (RoCE is IB transport over Ethernet).

use std::collections::HashSet;
use std::ffi::{c_char, c_int, CStr};
use std::io::Read as _;
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock, Weak};

use roce_transport::netdev::{self, Ipv6Scope, NetDevice};

use crate::context::OpenDevice;
use crate::ffi;
use crate::sys::{
    __be64, ibv_device, ibv_node_type_IBV_NODE_CA, ibv_transport_type_IBV_TRANSPORT_IB,
};

/// The environment variable that lists the devices.
pub const DEVICES_ENV: &str = "ROCECTL_VERBS_DEVICES";
/// The environment variable that names the configuration file.
pub const CONF_ENV: &str = "ROCECTL_VERBS_CONF";
/// The configuration file read when [`CONF_ENV`] is not set.
pub const DEFAULT_CONF: &str = "/etc/rocectl/verbs.conf";
/// The sysfs-like directory every device claims as `ibdev_path`.
const IBDEV_DIR: &str = "/sys/class/infiniband";

/// One device as configured: a name, an interface, maybe an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceSpec {
    /// `ibv_get_device_name`.
    pub(crate) name: String,
    /// The network interface.
    pub(crate) ifname: String,
    /// The address to bind (`@ADDR`), if given.
    pub(crate) addr: Option<IpAddr>,
}

/// A device record: the `ibv_device` handed to C, then what rocectl needs to open it.
#[repr(C)]
pub(crate) struct DeviceRec {
    /// Must stay the first field: `ibv_device` pointers are `&rec.ibv`.
    pub(crate) ibv: ibv_device,
    /// Always 0. In rdma-core `struct verbs_device` continues with a `verbs_device_ops *`;
    /// libmlx5's `mlx5dv_is_supported` (perftest calls it) compares it with its own ops.
    ops: usize,
    /// `ibv_get_device_index` (the N of `uverbsN`).
    pub(crate) index: c_int,
    /// The name, interface and address.
    pub(crate) spec: DeviceSpec,
    /// The address the engine binds.
    pub(crate) addr: IpAddr,
    /// The interface's index (`ndev_ifindex`).
    pub(crate) ifindex: u32,
    /// Node GUID, host order: the EUI-64 of the MAC, as rdma_rxe makes it.
    pub(crate) node_guid: u64,
    /// The open transport device, shared by every context of this device in the process.
    pub(crate) open: Mutex<Weak<OpenDevice>>,
}

impl DeviceRec {
    /// The record behind an `ibv_device` this library handed out; `None` for NULL or any
    /// other pointer.
    pub(crate) fn from_ibv(dev: *const ibv_device) -> Option<&'static Self> {
        if dev.is_null() {
            return None;
        }
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .find(|r| std::ptr::eq(&r.ibv, dev))
    }

    /// The `ibv_device` pointer applications hold.
    pub(crate) fn ibv(&'static self) -> *mut ibv_device {
        std::ptr::from_ref(&self.ibv).cast_mut()
    }

    fn new(index: usize, spec: DeviceSpec, dev: &NetDevice, addr: IpAddr) -> Self {
        // SAFETY: `ibv_device` is plain C data (integers, char arrays, NULL pointers): all
        // zeroes is a valid value.
        let mut ibv: ibv_device = unsafe { std::mem::zeroed() };
        ibv.node_type = ibv_node_type_IBV_NODE_CA;
        ibv.transport_type = ibv_transport_type_IBV_TRANSPORT_IB;
        copy_cstr(&mut ibv.name, &spec.name);
        copy_cstr(&mut ibv.dev_name, &format!("uverbs{index}"));
        copy_cstr(&mut ibv.dev_path, &format!("/dev/infiniband/uverbs{index}"));
        copy_cstr(&mut ibv.ibdev_path, &format!("{IBDEV_DIR}/{}", spec.name));
        Self {
            ibv,
            ops: 0,
            index: c_int::try_from(index).unwrap_or(c_int::MAX),
            addr,
            ifindex: dev.index,
            node_guid: node_guid(dev.mac),
            spec,
            open: Mutex::new(Weak::new()),
        }
    }
}

/// rdma_rxe's node GUID: the EUI-64 of the MAC (U/L bit flipped, `ff:fe` in the middle);
/// without a MAC, the EUI-64 of the all-zero MAC.
pub(crate) fn node_guid(mac: Option<[u8; 6]>) -> u64 {
    let m = mac.unwrap_or([0; 6]);
    u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]])
}

/// Writes `s` NUL-terminated into `dst`, truncated to fit.
fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// Every record made so far, in creation order (leaked: records live for the process).
fn registry() -> &'static Mutex<Vec<&'static DeviceRec>> {
    static REGISTRY: OnceLock<Mutex<Vec<&'static DeviceRec>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Vec::new()))
}

/// Prints `msg` on stderr once per process (discovery runs at every `ibv_get_device_list`).
pub(crate) fn warn_once(msg: String) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    if seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(msg.clone())
    {
        eprintln!("rocectl libibverbs: {msg}");
    }
}

// ------------------------------------------------------------------------- parsing --

/// Parses one `name=IFNAME[@ADDR]` item (spaces around `=` allowed).
fn parse_item(item: &str) -> Result<DeviceSpec, String> {
    let (name, rest) = item
        .split_once('=')
        .ok_or_else(|| format!("expected `name=IFNAME[@ADDR]`, got {item:?}"))?;
    let (name, rest) = (name.trim(), rest.trim());
    if name.is_empty() || name.len() > 63 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "bad device name {name:?} (1 to 63 printable characters, no spaces)"
        ));
    }
    if name.contains('/') {
        return Err(format!("bad device name {name:?} (no '/')"));
    }
    let (ifname, addr) = match rest.split_once('@') {
        Some((i, a)) => {
            let addr = a
                .trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("bad address {:?} for device {name}", a.trim()))?;
            (i.trim(), Some(addr))
        }
        None => (rest, None),
    };
    if ifname.is_empty() || ifname.len() >= 16 || !ifname.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("bad interface name {ifname:?} for device {name}"));
    }
    Ok(DeviceSpec {
        name: name.to_owned(),
        ifname: ifname.to_owned(),
        addr,
    })
}

/// Parses `ROCECTL_VERBS_DEVICES`: the entries, and one message per bad entry.
pub(crate) fn parse_env(text: &str) -> (Vec<DeviceSpec>, Vec<String>) {
    let mut specs: Vec<DeviceSpec> = Vec::new();
    let mut errors = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match parse_item(item) {
            Ok(s) if specs.iter().any(|o| o.name == s.name) => errors.push(format!(
                "{DEVICES_ENV}: device {} listed twice; the second entry is skipped",
                s.name
            )),
            Ok(s) => specs.push(s),
            Err(e) => errors.push(format!("{DEVICES_ENV}: {e}; entry skipped")),
        }
    }
    (specs, errors)
}

/// Parses a configuration file: the entries, and one message per bad line.
pub(crate) fn parse_conf(path: &str, text: &str) -> (Vec<DeviceSpec>, Vec<String>) {
    let mut specs: Vec<DeviceSpec> = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match parse_item(line) {
            Ok(s) if specs.iter().any(|o| o.name == s.name) => errors.push(format!(
                "{path}:{}: device {} defined twice; this line is skipped",
                n + 1,
                s.name
            )),
            Ok(s) => specs.push(s),
            Err(e) => errors.push(format!(
                "{path}:{}: {e} (lines are `name = IFNAME[@ADDR]`); line skipped",
                n + 1
            )),
        }
    }
    (specs, errors)
}

/// The default devices: every interface that is up, not loopback, and has an address the
/// engine can bind.
pub(crate) fn default_specs(ifaces: &[NetDevice]) -> Vec<DeviceSpec> {
    ifaces
        .iter()
        .filter(|d| d.up && !d.loopback && bind_addr(d).is_some())
        .map(|d| DeviceSpec {
            name: format!("rocectl_{}", d.name),
            ifname: d.name.clone(),
            addr: None,
        })
        .collect()
}

/// The address the engine binds on `dev` when none is given: the first IPv4 address, else
/// the first IPv6 address that is not link-local.
pub(crate) fn bind_addr(dev: &NetDevice) -> Option<IpAddr> {
    dev.ipv4.first().map(|n| IpAddr::V4(n.addr)).or_else(|| {
        dev.ipv6
            .iter()
            .find(|n| n.scope != Ipv6Scope::Link)
            .map(|n| IpAddr::V6(n.addr))
    })
}

/// Where the device list comes from, with the messages for bad entries.
pub(crate) fn configured_specs(ifaces: &[NetDevice]) -> (Vec<DeviceSpec>, Vec<String>) {
    if let Some(text) = std::env::var_os(DEVICES_ENV).filter(|t| !t.is_empty()) {
        return parse_env(&text.to_string_lossy());
    }
    let (path, explicit) = match std::env::var_os(CONF_ENV).filter(|t| !t.is_empty()) {
        Some(p) => (p.to_string_lossy().into_owned(), true),
        None => (DEFAULT_CONF.to_owned(), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_conf(&path, &text),
        Err(e) if explicit => {
            let msg = format!("{CONF_ENV}={path}: cannot read it ({e}); no devices");
            (Vec::new(), vec![msg])
        }
        Err(_) => (default_specs(ifaces), Vec::new()),
    }
}

/// The record of `spec`: the one made earlier under its name, else a new one on the
/// interface of `ifaces` it names. `None` (after one line on stderr) when there is no such
/// interface, or it has no address to bind and `spec` gives none.
pub(crate) fn record(spec: DeviceSpec, ifaces: &[NetDevice]) -> Option<&'static DeviceRec> {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rec) = reg.iter().find(|r| r.spec.name == spec.name) {
        return Some(*rec);
    }
    let Some(dev) = ifaces.iter().find(|d| d.name == spec.ifname) else {
        warn_once(format!(
            "device {}: no network interface named {:?}; device skipped",
            spec.name, spec.ifname
        ));
        return None;
    };
    let Some(addr) = spec.addr.or_else(|| bind_addr(dev)) else {
        warn_once(format!(
            "device {}: interface {} has no IPv4 or non-link-local IPv6 address; device \
             skipped (give one with {}@ADDR)",
            spec.name, spec.ifname, spec.ifname
        ));
        return None;
    };
    let rec: &'static DeviceRec = Box::leak(Box::new(DeviceRec::new(reg.len(), spec, dev, addr)));
    reg.push(rec);
    Some(rec)
}

/// For unit tests: a record named `name` for an engine opened by the test itself (a `sim`
/// device), registered like the others; the same record for the same name.
#[cfg(test)]
pub(crate) fn test_record(name: &str, addr: IpAddr) -> &'static DeviceRec {
    let dev = NetDevice {
        name: "sim".into(),
        index: 0,
        mac: None,
        mtu: 1500,
        up: true,
        running: true,
        loopback: false,
        ipv4: Vec::new(),
        ipv6: Vec::new(),
    };
    let spec = DeviceSpec {
        name: name.into(),
        ifname: "sim".into(),
        addr: Some(addr),
    };
    // INVARIANT: the spec names the interface given and has an address.
    record(spec, &[dev]).expect("a record for a named interface with an address")
}

/// Discovers the devices and returns their records, creating the new ones.
fn discover() -> std::io::Result<Vec<&'static DeviceRec>> {
    let ifaces = netdev::interfaces()?;
    let (specs, errors) = configured_specs(&ifaces);
    for e in errors {
        warn_once(e);
    }
    Ok(specs
        .into_iter()
        .filter_map(|s| record(s, &ifaces))
        .collect())
}

/// The files [`ibv_read_sysfs_file`] answers for every device, besides the GID ones.
const SYSFS_FILES: &[&str] = &[
    "board_id",
    "fw_ver",
    "hca_type",
    "hw_rev",
    "node_type",
    "node_guid",
    "sys_image_guid",
    "ports/1/link_layer",
    "ports/1/pkeys/0",
    "ports/1/lid",
    "ports/1/sm_lid",
];

/// A device as programs that check the file system expect to find it (`rocectl exec
/// --dev-nodes` makes these files in a private mount namespace): UCX wants a character
/// device `/dev/infiniband/<dev_name>` and reads GID types from sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFiles {
    /// `ibv_get_device_name`, e.g. `rocectl_eth0`.
    pub name: String,
    /// `ibv_device.dev_name`, `uverbsN`.
    pub dev_name: String,
    /// `ibv_device.ibdev_path`, `/sys/class/infiniband/<name>`.
    pub ibdev_path: String,
    /// What [`ibv_read_sysfs_file`] answers under `ibdev_path`: (relative path, content
    /// ending with a newline), the GID files (`ports/1/gids/N`, `gid_attrs/types/N`,
    /// `gid_attrs/ndevs/N`) for every entry of the GID table.
    pub files: Vec<(String, String)>,
}

/// This library's devices (discovered as [`ibv_get_device_list`] discovers them) and their
/// files.
///
/// # Errors
/// The interfaces cannot be listed.
pub fn device_files() -> std::io::Result<Vec<DeviceFiles>> {
    let text = |field: &[c_char]| -> String {
        let bytes: Vec<u8> = field
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok(discover()?
        .into_iter()
        .map(|rec| {
            let mut files: Vec<(String, String)> = SYSFS_FILES
                .iter()
                .filter_map(|f| Some(((*f).to_owned(), rec_sysfs(rec, f)?)))
                .collect();
            let gids = gid_table_of(rec).map_or(0, |t| t.len());
            for i in 0..gids {
                for kind in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
                    let rel = format!("ports/1/{kind}/{i}");
                    if let Some(c) = rec_sysfs(rec, &rel) {
                        files.push((rel, c));
                    }
                }
            }
            DeviceFiles {
                name: rec.spec.name.clone(),
                dev_name: text(&rec.ibv.dev_name),
                ibdev_path: text(&rec.ibv.ibdev_path),
                files,
            }
        })
        .collect())
}

// ------------------------------------------------------------------------ exports --

/// `ibv_get_device_list(3)`: a NULL-terminated array of the devices (see the module docs),
/// freed with [`ibv_free_device_list`]; `*num` (if not NULL) gets their number. NULL with
/// `errno` when the interfaces cannot be listed.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    if !num.is_null() {
        // SAFETY: a non-NULL `num` points at an int the caller owns.
        unsafe { *num = 0 };
    }
    ffi::guard_ptr("ibv_get_device_list", || {
        let recs = discover().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let list = unsafe { libc::calloc(recs.len() + 1, size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, rec) in recs.iter().enumerate() {
            // SAFETY: `list` has room for recs.len() + 1 pointers; the last stays NULL.
            unsafe { *list.add(i) = rec.ibv() };
        }
        if !num.is_null() {
            // SAFETY: as above.
            unsafe { *num = c_int::try_from(recs.len()).unwrap_or(c_int::MAX) };
        }
        Ok(list)
    })
}

/// `ibv_free_device_list(3)`: frees the array (the devices themselves stay valid).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi::guard("ibv_free_device_list", (), || {
        // SAFETY: `list` is NULL or an array from `ibv_get_device_list` (calloc).
        unsafe { libc::free(list.cast()) };
    });
}

/// `ibv_get_device_name(3)`: the device's name (`rocectl_eth0`); NULL for a foreign pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    ffi::guard_ptr("ibv_get_device_name", || {
        let rec = DeviceRec::from_ibv(device).ok_or(libc::EINVAL)?;
        Ok(rec.ibv.name.as_ptr().cast_mut())
    })
}

/// `ibv_get_device_guid(3)`: the node GUID in network byte order; 0 for a foreign pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    ffi::guard("ibv_get_device_guid", 0, || {
        DeviceRec::from_ibv(device).map_or(0, |r| r.node_guid.to_be())
    })
}

/// `ibv_get_device_index(3)`: the device's index (the N of `uverbsN`), -1 for a foreign
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    ffi::guard("ibv_get_device_index", -1, || {
        DeviceRec::from_ibv(device).map_or(-1, |r| r.index)
    })
}

/// `ibv_get_sysfs_path`: `"/sys"` (what rdma-core returns without `SYSFS_PATH`).
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: reads `dir/file` into `buf` the way
/// rdma-core does (one `read`, a trailing newline stripped, NUL-terminated; -1 when it does
/// not fit or cannot be read), and returns the length. For a device's `ibdev_path` the
/// files that `ibv_devinfo`, perftest and UCX read are answered from memory (`board_id`,
/// `fw_ver`, `hca_type`, `hw_rev`, `node_type`, `node_guid`, `sys_image_guid`, and under
/// `ports/1/`: `gid_attrs/types/N` ("RoCE v2"), `gid_attrs/ndevs/N`, `gids/N`, `pkeys/0`,
/// `link_layer`, `lid`, `sm_lid`); every other path is read from the file system.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    ffi::guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || (buf.is_null() && size > 0) {
            ffi::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: both are NUL-terminated strings per the contract.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
        let content = match sysfs_text(&dir, &file) {
            Some(Ok(text)) => text.into_bytes(),
            Some(Err(e)) => {
                ffi::set_errno(e);
                return -1;
            }
            None => match read_real(&format!("{dir}/{file}"), size) {
                Ok(bytes) => bytes,
                Err(e) => {
                    ffi::set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            },
        };
        let out: &mut [u8] = if size == 0 {
            &mut []
        } else {
            // SAFETY: `buf` holds `size` writable bytes per the contract.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) }
        };
        sysfs_copy(&content, out).unwrap_or(-1)
    })
}

/// One `read(2)` of at most `size` bytes of `path` (at most 64 KiB: sysfs files are one
/// page, and a huge `size` must not become a huge allocation).
fn read_real(path: &str, size: usize) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let mut v = vec![0u8; size.min(1 << 16)];
    let n = f.read(&mut v)?;
    v.truncate(n);
    Ok(v)
}

/// rdma-core's `ibv_read_sysfs_file_at` after its `read`: copies what fits, strips one
/// trailing newline or NUL-terminates; `None` (-1) when the text fills the buffer without a
/// newline to replace.
fn sysfs_copy(content: &[u8], out: &mut [u8]) -> Option<c_int> {
    let mut len = content.len().min(out.len());
    out[..len].copy_from_slice(&content[..len]);
    if len > 0 {
        if out[len - 1] == b'\n' {
            len -= 1;
            out[len] = 0;
        } else if len < out.len() {
            out[len] = 0;
        } else {
            return None;
        }
    }
    c_int::try_from(len).ok()
}

/// The sysfs files of a device, from memory: `Some` when `dir` is one of our `ibdev_path`s
/// (`Err(errno)` for a file we do not have), `None` for any other directory. The text ends
/// with a newline, as the kernel's does.
fn sysfs_text(dir: &str, file: &str) -> Option<Result<String, i32>> {
    let dir = dir.trim_end_matches('/');
    let name = dir.strip_prefix(IBDEV_DIR)?.strip_prefix('/')?;
    let rec = *registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|r| r.spec.name == name)?;
    Some(rec_sysfs(rec, file.trim_matches('/')).ok_or(libc::ENOENT))
}

fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn rec_sysfs(rec: &DeviceRec, file: &str) -> Option<String> {
    let text = match file {
        "board_id" => "rocectl".to_owned(),
        "fw_ver" => crate::context::FW_VER.to_owned(),
        "hca_type" => "rocectl".to_owned(),
        "hw_rev" => "0".to_owned(),
        "node_type" => "1: CA".to_owned(),
        "node_guid" | "sys_image_guid" => guid_text(rec.node_guid),
        "ports/1/link_layer" => "Ethernet".to_owned(),
        "ports/1/pkeys/0" => "0xffff".to_owned(),
        "ports/1/lid" | "ports/1/sm_lid" => "0x0".to_owned(),
        _ => {
            let gid_file = |prefix: &str| -> Option<usize> {
                file.strip_prefix(prefix)?.parse::<usize>().ok()
            };
            // The GID files need the table; it is the interface's, as the engine has it.
            let table = gid_table_of(rec)?;
            if let Some(i) = gid_file("ports/1/gid_attrs/types/") {
                table.get(i)?;
                "RoCE v2".to_owned()
            } else if let Some(i) = gid_file("ports/1/gid_attrs/ndevs/") {
                table.get(i)?;
                rec.spec.ifname.clone()
            } else if let Some(i) = gid_file("ports/1/gids/") {
                let g = table.get(i)?;
                let w: Vec<String> =
                    g.0.chunks(2)
                        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
                        .collect();
                w.join(":")
            } else {
                return None;
            }
        }
    };
    Some(text + "\n")
}

/// The GID table: the open engine's when the device is open, else the interface's now.
fn gid_table_of(rec: &DeviceRec) -> Option<Vec<roce_transport::Gid>> {
    if let Some(open) = rec.open.lock().unwrap_or_else(|e| e.into_inner()).upgrade() {
        return Some(open.dev.gid_table().iter().map(|e| e.gid).collect());
    }
    let dev = netdev::interface(&rec.spec.ifname).ok()?;
    Some(dev.gid_table().iter().map(|e| e.gid).collect())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use roce_transport::netdev::{Ipv4Net, Ipv6Net};

    use super::*;

    fn spec(name: &str, ifname: &str, addr: Option<&str>) -> DeviceSpec {
        DeviceSpec {
            name: name.into(),
            ifname: ifname.into(),
            addr: addr.map(|a| a.parse().unwrap()),
        }
    }

    fn iface(name: &str, up: bool, lo: bool, v4: &[&str], v6: &[&str]) -> NetDevice {
        NetDevice {
            name: name.into(),
            index: 3,
            mac: Some([0x52, 0x54, 0, 0x77, 0, 1]),
            mtu: 1500,
            up,
            running: up,
            loopback: lo,
            ipv4: v4
                .iter()
                .map(|a| Ipv4Net {
                    addr: a.parse().unwrap(),
                    prefix: 24,
                })
                .collect(),
            ipv6: v6
                .iter()
                .map(|a| {
                    let addr: Ipv6Addr = a.parse().unwrap();
                    Ipv6Net {
                        addr,
                        prefix: 64,
                        scope: Ipv6Scope::of(addr),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn env_entries_parse_and_bad_ones_are_reported() {
        let (specs, errors) = parse_env(
            "a=eth0, b = veth1@10.0.0.2,c=eth2@fd00::1,,bad,d=@1.2.3.4,a=eth9,e=eth0@nope",
        );
        assert_eq!(
            specs,
            [
                spec("a", "eth0", None),
                spec("b", "veth1", Some("10.0.0.2")),
                spec("c", "eth2", Some("fd00::1")),
            ]
        );
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors[0].contains("expected `name=IFNAME[@ADDR]`, got \"bad\""),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("bad interface name \"\" for device d"),
            "{errors:?}"
        );
        assert!(errors[2].contains("device a listed twice"), "{errors:?}");
        assert!(
            errors[3].contains("bad address \"nope\" for device e"),
            "{errors:?}"
        );
        assert!(errors.iter().all(|e| e.starts_with(DEVICES_ENV)));
    }

    #[test]
    fn config_lines_parse_with_comments_and_line_numbers() {
        let text = "# rocectl devices\n\nrocectl0 = eth0   # the uplink\n  r1=lo@127.0.0.2\nthis is wrong\nx/y = eth1\n";
        let (specs, errors) = parse_conf("/etc/x.conf", text);
        assert_eq!(
            specs,
            [
                spec("rocectl0", "eth0", None),
                spec("r1", "lo", Some("127.0.0.2"))
            ]
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("/etc/x.conf:5: expected"),
            "{errors:?}"
        );
        assert!(errors[0].ends_with("line skipped"), "{errors:?}");
        assert!(
            errors[1].starts_with("/etc/x.conf:6: bad device name"),
            "{errors:?}"
        );
    }

    #[test]
    fn long_names_are_refused() {
        assert!(parse_item(&format!("{}=eth0", "n".repeat(64))).is_err());
        assert!(parse_item(&format!("{}=eth0", "n".repeat(63))).is_ok());
        assert!(parse_item("n=abcdefghijklmnop").is_err());
        assert!(parse_item("n=abcdefghijklmno").is_ok());
    }

    #[test]
    fn default_devices_are_up_non_loopback_interfaces_with_an_address() {
        let ifaces = [
            iface("lo", true, true, &["127.0.0.1"], &["::1"]),
            iface("eth0", true, false, &["10.0.0.1"], &[]),
            iface("eth1", false, false, &["10.0.1.1"], &[]),
            iface("eth2", true, false, &[], &["fe80::1"]),
            iface("eth3", true, false, &[], &["fe80::1", "fd00::3"]),
        ];
        assert_eq!(
            default_specs(&ifaces),
            [
                spec("rocectl_eth0", "eth0", None),
                spec("rocectl_eth3", "eth3", None)
            ]
        );
        assert_eq!(
            bind_addr(&ifaces[1]),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(bind_addr(&ifaces[2 + 1]), None);
        assert_eq!(bind_addr(&ifaces[4]), Some("fd00::3".parse().unwrap()));
        let both = iface("eth4", true, false, &["10.0.4.1", "10.0.4.2"], &["fd00::4"]);
        assert_eq!(bind_addr(&both), Some("10.0.4.1".parse().unwrap()));
    }

    #[test]
    fn node_guid_is_rxes_eui64() {
        // shared/captures/guest-A-info.txt: MAC 52:54:00:77:00:01 -> 5054:00ff:fe77:0001.
        let g = node_guid(Some([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]));
        assert_eq!(g, 0x5054_00FF_FE77_0001);
        assert_eq!(guid_text(g), "5054:00ff:fe77:0001");
        assert_eq!(node_guid(None), 0x0200_00FF_FE00_0000);
    }

    #[test]
    fn sysfs_reads_follow_rdma_core() {
        let mut buf = [0x55u8; 8];
        assert_eq!(sysfs_copy(b"RoCE v2\n", &mut buf), Some(7));
        assert_eq!(&buf, b"RoCE v2\0");
        let mut buf = [0x55u8; 8];
        assert_eq!(sysfs_copy(b"abc", &mut buf), Some(3));
        assert_eq!(&buf[..4], b"abc\0");
        // Fills the buffer without a newline to replace: rdma-core fails.
        let mut buf = [0x55u8; 4];
        assert_eq!(sysfs_copy(b"abcdef\n", &mut buf), None);
        let mut buf = [0u8; 0];
        assert_eq!(sysfs_copy(b"abc\n", &mut buf), Some(0));
    }

    /// A real file outside our directories is read from the file system.
    #[test]
    fn other_paths_are_read_for_real() {
        let dir = std::env::temp_dir().join(format!("rocectl-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), "hello\n").unwrap();
        let cdir = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let mut buf = [0 as c_char; 16];
        // SAFETY: valid strings and a 16-byte buffer.
        let n = unsafe { ibv_read_sysfs_file(cdir.as_ptr(), c"f".as_ptr(), buf.as_mut_ptr(), 16) };
        assert_eq!(n, 5);
        // SAFETY: NUL-terminated by the call.
        assert_eq!(
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(),
            "hello"
        );
        // SAFETY: as above.
        let n =
            unsafe { ibv_read_sysfs_file(cdir.as_ptr(), c"nope".as_ptr(), buf.as_mut_ptr(), 16) };
        assert_eq!(n, -1);
        std::fs::remove_dir_all(&dir).unwrap();
        // SAFETY: a static string.
        assert_eq!(
            unsafe { CStr::from_ptr(ibv_get_sysfs_path()) }
                .to_str()
                .unwrap(),
            "/sys"
        );
    }
}
