//! Mounting and unmounting: [`Mount`] starts the bridge on a mount point,
//! serves, switches graphs and unmounts (lazily if it must); the kernel's
//! read-ahead is set through the mount's bdi in sysfs.

use super::*;

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// The mount point cannot be used.
    #[error("mount point {}: {source}", path.display())]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Mounting (or the FUSE handshake) failed.
    #[error("mounting {} failed: {source}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The session thread could not be started.
    #[error("starting the FUSE session: {0}")]
    Session(std::io::Error),
    /// Unmounting failed.
    #[error("unmounting {}: {source}", path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A mounted graph: serves FUSE requests until unmounted.
pub struct Mount {
    core: Arc<Core>,
    mountpoint: PathBuf,
    ended: watch::Receiver<bool>,
    session: Mutex<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("mountpoint", &self.mountpoint).finish()
    }
}

/// How long an unmount waits for the kernel to let go of a busy mount
/// before it detaches it lazily.
pub(super) const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

impl Mount {
    /// Mounts `top` (an active graph's top) on `mountpoint` and starts
    /// serving. `upcalls` carries the graph's upcalls (invalidations).
    /// The caller keeps the graph (and shuts it down); a later
    /// [`Mount::switch`] leaves it to the caller too.
    /// Blocks for the mount and the FUSE handshake: call it from a blocking
    /// context (such as `spawn_blocking`) inside a tokio runtime.
    pub fn new(
        top: Child,
        upcalls: Option<broadcast::Receiver<Upcall>>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        Mount::start(switch::Active::new(1, top, None), upcalls, mountpoint, opts, rt)
    }

    /// Mounts `graph` (activated and up), which the mount then owns: a
    /// [`Mount::switch`] away from it shuts it down once drained. Blocks as
    /// [`Mount::new`] does.
    pub fn with_graph(
        graph: Arc<Graph>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        let upcalls = graph.upcalls();
        Mount::start(switch::Active::new(1, graph.top(), Some(graph)), Some(upcalls), mountpoint, opts, rt)
    }

    fn start(
        active: switch::Active,
        upcalls: Option<broadcast::Receiver<Upcall>>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        let mountpoint = std::fs::canonicalize(mountpoint)
            .map_err(|source| FuseError::MountPoint { path: mountpoint.to_path_buf(), source })?;
        if !mountpoint.is_dir() {
            let source = std::io::Error::from_raw_os_error(libc::ENOTDIR);
            return Err(FuseError::MountPoint { path: mountpoint, source });
        }
        let client_id: Arc<str> =
            Arc::from(format!("fuse-{}-{}-{}", hostname(), std::process::id(), mountpoint.display()));
        let active = Arc::new(active);
        let core = Arc::new(Core::new(active.clone(), rt.clone(), opts, client_id));
        let config = core.opts.fuser_config();
        let session = fuser::Session::new(Bridge { core: core.clone() }, &mountpoint, &config)
            .map_err(|source| FuseError::Mount { path: mountpoint.clone(), source })?;
        let _ = core.notifier.set(session.notifier());
        let (tx, ended) = watch::channel(false);
        let _ = core.ended.set(ended.clone());
        let session = std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || {
                let r = session.run();
                let _ = tx.send(true);
                r
            })
            .map_err(FuseError::Session)?;
        set_readahead(&mountpoint, core.opts.max_readahead);
        if let Some(rx) = upcalls {
            core.watch_upcalls(&active, rx);
        }
        tracing::info!(mountpoint = %mountpoint.display(), options = %core.opts.to_option_string(), "mounted");
        Ok(Mount { core, mountpoint, ended, session: Mutex::new(Some(session)) })
    }

    /// Moves the mount to `graph` (activated, and up) while it serves:
    /// every open fd is reopened on it, the locks the mount holds move,
    /// new fops go to it, and the old graph drains; an old graph the mount
    /// owns is then shut down and dropped. The mount owns `graph` from now
    /// on. In-flight fops are not failed by the switch.
    pub async fn switch(&self, graph: Arc<Graph>) -> SwitchReport {
        self.core.switch(graph.top(), Some(graph)).await
    }

    /// The active graph's generation: 1 at mount, one more per switch.
    pub fn generation(&self) -> u64 {
        self.core.current().generation
    }

    /// The active graph, if the mount owns it.
    pub fn graph(&self) -> Option<Arc<Graph>> {
        self.core.current().graph.clone()
    }

    /// Locks the mount holds and would move in a switch, as (inode, owner)
    /// pairs (for diagnosis and tests).
    pub fn held_locks(&self) -> usize {
        self.core.held.len()
    }

    /// The mount point (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The client id fops carry ([`CallCtx::client_id`]).
    pub fn client_id(&self) -> &str {
        &self.core.client_id
    }

    /// Waits until the session ends (the file system was unmounted, by
    /// [`Mount::unmount`] or from outside).
    pub async fn ended(&self) {
        let mut rx = self.ended.clone();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Unmounts: a plain unmount, or if the mount is busy, a lazy one (no
    /// new opens; the files still open keep working) followed by up to
    /// `UNMOUNT_WAIT` for their users to close them (past that, they see
    /// ENOTCONN once this process exits); then waits up to `drain` for the
    /// fops in flight. The graph is left to the caller to shut down.
    pub async fn unmount(&self, drain: Duration) -> Result<(), FuseError> {
        let mp = self.mountpoint.clone();
        if !*self.ended.borrow() {
            match umount(&mp, 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    tracing::info!(wait = ?UNMOUNT_WAIT, "mount busy: detached lazily; waiting for its files to close");
                    lazy_unmount(&mp).map_err(|source| FuseError::Unmount { path: mp.clone(), source })?;
                }
                // Unmounted meanwhile (from outside).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !is_mount_point(&mp) => {}
                Err(source) => return Err(FuseError::Unmount { path: mp, source }),
            }
        }
        if tokio::time::timeout(UNMOUNT_WAIT, self.ended()).await.is_err() {
            tracing::warn!("files still open on the detached mount; their users will see ENOTCONN");
        }
        if !self.core.inflight.drained(drain).await {
            tracing::warn!(left = self.core.inflight.count.load(Ordering::Acquire), "fops still in flight at unmount");
        }
        if *self.ended.borrow() {
            let handle = self.session.lock().take();
            if let Some(h) = handle {
                let joined = tokio::task::spawn_blocking(move || h.join()).await;
                if let Ok(Ok(Err(e))) = joined {
                    tracing::debug!(error = %e, "FUSE session ended with an error");
                }
            }
        }
        Ok(())
    }

    /// Inodes and open fds the bridge holds (for diagnosis and tests).
    pub fn table_sizes(&self) -> (usize, usize) {
        (self.core.inodes.len(), self.core.fds.len())
    }
}

/// Detaches a mount lazily (`umount -l`).
pub fn lazy_unmount(mountpoint: &Path) -> std::io::Result<()> {
    umount(mountpoint, libc::MNT_DETACH)
}

/// `umount2(2)`.
pub fn umount(mountpoint: &Path, flags: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// True if something is mounted on `path` (from `/proc/self/mountinfo`).
pub(super) fn is_mount_point(path: &Path) -> bool {
    mount_device(path).is_some()
}

/// Sets the mount's read-ahead window on its backing device
/// (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`): the kernel caps what INIT may
/// ask for at its default (128 KiB); root may raise it afterwards. The
/// device comes from `/proc/self/mountinfo`, not from a stat, which would
/// be a FUSE request of its own.
pub(super) fn set_readahead(mountpoint: &Path, bytes: u32) {
    let Some(dev) = mount_device(mountpoint) else {
        tracing::info!("cannot find the mount's device; the kernel's read-ahead applies");
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, format!("{}", bytes / 1024)) {
        Ok(()) => tracing::debug!(path, kb = bytes / 1024, "read-ahead set"),
        Err(e) => tracing::info!(path, error = %e, "cannot set read-ahead; the kernel's default applies"),
    }
}

/// The `MAJ:MIN` of the newest mount on `mountpoint`.
pub(super) fn mount_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_device(&info, &mountpoint.display().to_string())
}

pub(super) fn mountinfo_device(info: &str, mountpoint: &str) -> Option<String> {
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && f[4] == mountpoint).then(|| f[2].to_string())
    })
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
