//! `rocectl exec --dev-nodes`: a private mount namespace in which each rocectl device looks
//! like a kernel RDMA device to programs that check the file system (UCX).
//!
//! UCX keeps an IB device only when `/dev/infiniband/<ibv_device.dev_name>` is a character
//! device it may open read-write, and it reads the GID types from
//! `/sys/class/infiniband/<name>/ports/<p>/gid_attrs/types/<i>` (when it cannot, it assumes
//! RoCE v1). Our library never opens the node and answers its own sysfs reads from memory
//! (`ibv_read_sysfs_file`); only such direct checks need files.
//!
//! So, before `execvp`, this process:
//!
//! 1. enters a new mount namespace (`unshare(CLONE_NEWNS)` as root; a user and mount namespace
//!    mapping the caller's uid and gid to themselves otherwise) and makes every mount in it
//!    private: nothing below is visible outside, and it all disappears with the command;
//! 2. lists the devices as the drop-in library discovers them (`roce-verbs`'s
//!    `device_files`, the code behind `ibv_get_device_list`: same variable, configuration
//!    file and interfaces), each one's `dev_name`, `ibdev_path` and the sysfs files
//!    `ibv_read_sysfs_file` answers for it;
//! 3. makes `/dev/infiniband` and `/sys/class/infiniband/<name>` writable without touching
//!    the real directories: a directory is "shadowed" by a tmpfs mounted over it, holding a bind
//!    mount of each of its old entries (a symlink copy for a symlink), so the old contents stay
//!    visible and writes go to the tmpfs; a missing directory is created in its shadowed parent;
//! 4. creates `/dev/infiniband/<dev_name>` as a bind mount of `/dev/null` (a character device,
//!    1:3, mode 0666: it passes UCX's `stat` and `access(R_OK|W_OK)` and is never opened by the
//!    library; a bind mount also works unprivileged, where `mknod` does not), and writes the
//!    library's sysfs files (GID types "RoCE v2", GIDs, node GUID, ...) under
//!    `/sys/class/infiniband/<name>/`.
//!
//! The manual way, as root, changes the host until undone:
//! `mkdir -p /dev/infiniband && mknod -m 666 /dev/infiniband/uverbs0 c 1 3` (one node per
//! device, `uverbsN` as `ibv_devinfo -v` names it), then `rm -r /dev/infiniband` afterwards.

use std::collections::HashSet;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use ibverbs::device::{device_files, DeviceFiles};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{getegid, geteuid};

/// Enters the namespace and creates the files for the library's devices. Returns the device
/// nodes. `Err` is the one-line message.
pub(crate) fn enter() -> Result<Vec<PathBuf>, String> {
    enter_mount_namespace()?;
    let devices: Vec<DeviceFiles> =
        device_files().map_err(|e| format!("cannot list the network interfaces: {e}"))?;
    let mut fs = Shadow::default();
    let mut nodes = Vec::new();
    let dev_dir = Path::new("/dev/infiniband");
    for d in &devices {
        if !valid_component(&d.dev_name) {
            return Err(format!("the library names a device {:?}", d.dev_name));
        }
        let node = dev_dir.join(&d.dev_name);
        if !node.exists() {
            fs.writable_dir(dev_dir)?;
            fs::File::create(&node).map_err(|e| format!("{}: {e}", node.display()))?;
            bind(Path::new("/dev/null"), &node, false)?;
        }
        nodes.push(node);
        let ibdev = Path::new(&d.ibdev_path);
        if ibdev.starts_with("/sys/class/infiniband") && !ibdev.exists() {
            for (rel, content) in &d.files {
                let path = ibdev.join(rel);
                // INVARIANT: `path` is `ibdev_path` joined with a relative path.
                fs.writable_dir(path.parent().expect("a joined path has a parent"))?;
                fs::write(&path, content).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
    }
    Ok(nodes)
}

/// A path component we can create (no `/`, not `.`/`..`, not empty).
fn valid_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// `unshare` a mount namespace (with a user namespace when not root), all mounts private.
fn enter_mount_namespace() -> Result<(), String> {
    let (uid, gid) = (geteuid(), getegid());
    if uid.is_root() {
        unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("cannot create a mount namespace (unshare): {e}"))?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
            format!(
                "cannot create a user and mount namespace (unshare): {e}; run as root, or \
                 allow unprivileged user namespaces (kernel.unprivileged_userns_clone)"
            )
        })?;
        let w =
            |file: &str, text: String| fs::write(file, text).map_err(|e| format!("{file}: {e}"));
        w("/proc/self/setgroups", "deny".into())?;
        w("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        w("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))
}

fn bind(src: &Path, dst: &Path, recursive: bool) -> Result<(), String> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|e| {
        format!(
            "cannot bind-mount {} on {}: {e}",
            src.display(),
            dst.display()
        )
    })
}

/// The directories made writable so far (shadowed, or created inside a shadowed one).
#[derive(Default)]
struct Shadow {
    writable: HashSet<PathBuf>,
}

impl Shadow {
    /// Makes `dir` a directory this process may write without changing the real one.
    fn writable_dir(&mut self, dir: &Path) -> Result<(), String> {
        if self.writable.contains(dir) {
            return Ok(());
        }
        let meta = fs::symlink_metadata(dir);
        match meta {
            Ok(m) if m.is_dir() => shadow(dir)?,
            Ok(_) => return Err(format!("{} exists and is not a directory", dir.display())),
            Err(_) => {
                let parent = dir
                    .parent()
                    .ok_or_else(|| format!("cannot create {}", dir.display()))?;
                self.writable_dir(parent)?;
                fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
        }
        self.writable.insert(dir.to_path_buf());
        Ok(())
    }
}

/// What one entry of a shadowed directory was.
enum Entry {
    Symlink(PathBuf),
    Dir,
    Other,
}

/// Mounts a tmpfs over `dir` holding what `dir` held: a bind mount of each old entry (with
/// the mounts below it), a copy of each symlink.
fn shadow(dir: &Path) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", dir.display());
    let old = fs::File::open(dir).map_err(err)?;
    let mut entries = Vec::new();
    for e in fs::read_dir(dir).map_err(err)? {
        let e = e.map_err(err)?;
        let ty = e.file_type().map_err(err)?;
        let kind = if ty.is_symlink() {
            Entry::Symlink(fs::read_link(e.path()).map_err(err)?)
        } else if ty.is_dir() {
            Entry::Dir
        } else {
            Entry::Other
        };
        entries.push((e.file_name(), kind));
    }
    let mode = fs::metadata(dir).map_err(err)?.permissions();
    let opts = format!(
        "mode={:o}",
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777
    );
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some(opts.as_str()),
    )
    .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", dir.display()))?;
    // The old directory stays reachable through the open descriptor.
    let base = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    for (name, kind) in entries {
        let (src, dst) = (base.join(&name), dir.join(&name));
        let err = |e: std::io::Error| format!("{}: {e}", dst.display());
        match kind {
            Entry::Symlink(target) => std::os::unix::fs::symlink(target, &dst).map_err(err)?,
            Entry::Dir => {
                fs::create_dir(&dst).map_err(err)?;
                bind(&src, &dst, true)?;
            }
            Entry::Other => {
                fs::File::create(&dst).map_err(err)?;
                bind(&src, &dst, false)?;
            }
        }
    }
    Ok(())
}
