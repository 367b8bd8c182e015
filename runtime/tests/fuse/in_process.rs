//! FUSE tests that mount in-process to see the bridge's insides:
//! invalidation upcalls reaching the kernel, and the inode table's bound.

use xlfs_runtime::fuse::{Mount, MountOptions};

use super::*;

/// A translator for in-process tests: passes every fop to its child and
/// hands out its event sink so the test can send upcalls from "below".
mod upcaller {
    use std::sync::{Arc, Mutex};

    use xlfs_sdk::{
        CallCtx, Child, EventSink, FopFuture, InitCtx, InitError, OptType, OptionDecl, Request, Xlator, XlatorType,
    };

    /// Each instance's sink under its `tag` option (tests run in parallel).
    static SINKS: Mutex<Vec<(String, EventSink)>> = Mutex::new(Vec::new());

    /// The sink of the instance tagged `tag`.
    pub fn sink(tag: &str) -> Option<EventSink> {
        SINKS.lock().expect("sinks").iter().rev().find(|(t, _)| t == tag).map(|(_, s)| s.clone())
    }

    struct Upcaller(Child);

    impl Xlator for Upcaller {
        fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
            self.0.call(ctx, req)
        }
    }

    pub const TYPE: XlatorType = XlatorType {
        name: "test/upcaller",
        description: "passes fops on; the test sends upcalls through its sink",
        options: &[OptionDecl::new("tag", OptType::Str).default("").desc("names this instance for the test")],
        min_children: 1,
        max_children: 1,
        build: |init: InitCtx| -> Result<Arc<dyn Xlator>, InitError> {
            let tag = init.options.str("tag").unwrap_or_default().to_string();
            SINKS.lock().expect("sinks").push((tag, init.events.clone()));
            let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs a child"))?;
            Ok(Arc::new(Upcaller(child)))
        },
    };
}

/// An in-process mount of a local posix graph under `test/upcaller`.
struct Local {
    mount: Mount,
    graph: xlfs_runtime::graph::Graph,
    brick: PathBuf,
    _dir: tempfile::TempDir,
}

async fn local_mount(opts: &str) -> Local {
    kit::init_tracing();
    let dir = tempfile::tempdir().expect("dir");
    let brick = dir.path().join("brick");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&brick).expect("brick");
    std::fs::create_dir(&mnt).expect("mnt");
    let mut reg = xlfs_runtime::registry::Registry::builtin();
    reg.register(upcaller::TYPE).expect("register");
    let text = format!(
        "volume posix\n type storage/posix\n option directory {}\nend-volume\n\
         volume top\n type test/upcaller\n option tag {}\n subvolumes posix\nend-volume\n",
        brick.display(),
        brick.display()
    );
    let graph = xlfs_runtime::graph::Graph::from_str(&text, "local.vol", &reg).expect("graph");
    graph.activate();
    graph.wait_up(Duration::from_secs(10)).await.expect("up");
    let (top, up) = (graph.top(), graph.upcalls());
    let o = MountOptions::parse(opts).expect("options");
    let rt = tokio::runtime::Handle::current();
    let mount = tokio::task::spawn_blocking(move || Mount::new(top, Some(up), &mnt, o, rt))
        .await
        .expect("join")
        .expect("mount");
    Local { mount, graph, brick, _dir: dir }
}

impl Drop for Local {
    /// A test that panics leaves no mount behind.
    fn drop(&mut self) {
        if is_mounted(self.mount.mountpoint()) {
            let _ = xlfs_runtime::fuse::lazy_unmount(self.mount.mountpoint());
        }
    }
}

impl Local {
    async fn finish(self) {
        self.mount.unmount(Duration::from_secs(10)).await.expect("unmount");
        assert!(!is_mounted(self.mount.mountpoint()));
        self.graph.shutdown();
    }
}

/// Runs blocking file system calls off the runtime (the runtime serves them).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_upcalls_reach_the_kernel() {
    let l = local_mount("attribute-timeout=3600,entry-timeout=3600,keep-cache=on").await;
    let sink = upcaller::sink(&l.brick.display().to_string()).expect("this mount's sink");
    let (mnt, brick) = (l.mount.mountpoint().to_path_buf(), l.brick.clone());
    let read = move |name: &str| {
        let p = mnt.join(name);
        async move { blocking(move || std::fs::read(&p).map_err(|e| e.raw_os_error())).await }
    };
    let m = l.mount.mountpoint().to_path_buf();
    blocking(move || std::fs::write(m.join("f"), b"one")).await.expect("write");
    assert_eq!(read("f").await, Ok(b"one".to_vec()));

    // Changed behind the mount's back: reads through an open fd come from
    // the kernel's cache (a stat would refresh the attributes: the kernel
    // marks atime stale after every read).
    let m = l.mount.mountpoint().to_path_buf();
    let fd = Arc::new(blocking(move || std::fs::File::open(m.join("f"))).await.expect("open"));
    let pread = |fd: &Arc<std::fs::File>| {
        let fd = fd.clone();
        async move {
            blocking(move || {
                let mut b = vec![0u8; 16];
                let n = fd.read_at(&mut b, 0).expect("pread");
                b.truncate(n);
                b
            })
            .await
        }
    };
    assert_eq!(pread(&fd).await, b"one");
    std::fs::write(brick.join("f"), b"two!").expect("write on the brick");
    assert_eq!(pread(&fd).await, b"one", "cached attributes and data");
    let gfid = kit::workload::gfid_xattr(&brick.join("f"));
    sink.send(xlfs_sdk::Event::Upcall(xlfs_sdk::Upcall::Invalidate { gfid }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while pread(&fd).await != b"two!" {
        assert!(Instant::now() < deadline, "the upcall invalidated the inode");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(fd);

    // Renamed behind its back: the name (looked up again after the upcall
    // above dropped it) is cached until the directory's upcall drops the
    // entries under it.
    assert_eq!(read("f").await, Ok(b"two!".to_vec()));
    std::fs::rename(brick.join("f"), brick.join("g")).expect("rename on the brick");
    assert_eq!(read("f").await, Ok(b"two!".to_vec()), "cached entry (opened by gfid)");
    sink.send(xlfs_sdk::Event::Upcall(xlfs_sdk::Upcall::Invalidate { gfid: xlfs_sdk::Gfid::ROOT }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while read("f").await != Err(Some(libc::ENOENT)) {
        assert!(Instant::now() < deadline, "the directory upcall dropped the entry");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(read("g").await, Ok(b"two!".to_vec()));
    l.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inode_table_stays_bounded() {
    const LIMIT: usize = 64;
    let l = local_mount(&format!("inode-lru-limit={LIMIT},entry-timeout=0,attribute-timeout=0")).await;
    let m = l.mount.mountpoint().to_path_buf();
    blocking(move || {
        for d in 0..10 {
            let dir = m.join(format!("d{d}"));
            std::fs::create_dir(&dir).expect("mkdir");
            for f in 0..100 {
                std::fs::write(dir.join(format!("f{f}")), b"x").expect("create");
            }
        }
        assert_eq!(walk(&m), 1010, "every entry listed");
    })
    .await;
    let (inodes, _) = l.mount.table_sizes();
    assert!(inodes > LIMIT, "the kernel holds them while cached: {inodes}");
    // Releases arrive after close(2) returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.mount.table_sizes().1 != 0 {
        assert!(Instant::now() < deadline, "every open is released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The kernel lets go of its inodes: forgets bring the table down to
    // the LRU limit (plus the few the kernel still holds).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        blocking(|| std::fs::write("/proc/sys/vm/drop_caches", b"2")).await.expect("drop caches");
        let (inodes, _) = l.mount.table_sizes();
        if inodes <= LIMIT + 16 {
            break;
        }
        assert!(Instant::now() < deadline, "table still holds {inodes} inodes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Still correct after eviction: names resolve again, inode numbers stay.
    let m = l.mount.mountpoint().to_path_buf();
    blocking(move || {
        let ino = std::fs::metadata(m.join("d3/f7")).expect("stat").ino();
        assert_eq!(walk(&m), 1010);
        std::fs::write("/proc/sys/vm/drop_caches", b"2").expect("drop caches");
        assert_eq!(std::fs::metadata(m.join("d3/f7")).expect("stat").ino(), ino, "same inode number after eviction");
    })
    .await;
    l.finish().await;
}

/// Counts the entries under `dir`, recursively.
fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("readdir")
        .map(|e| {
            let e = e.expect("entry");
            1 + if e.file_type().expect("type").is_dir() { walk(&e.path()) } else { 0 }
        })
        .sum()
}
