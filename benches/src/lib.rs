//! Helpers shared by the criterion benches in `benches/benches/`: building a
//! graph over a fresh brick directory on tmpfs, and the runtime to drive it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;
use xlfs_sdk::dict::keys;
use xlfs_sdk::{
    CallCtx, Dict, DirEntry, Event, EventFrom, FileType, Fop, FopFuture, Gfid, Iatt, InitCtx, InitError, Reply,
    Request, Response, Xlator, XlatorType,
};

/// A scratch directory for a brick: on tmpfs (`/dev/shm`) when it exists, so
/// that benches measure translators rather than a disk.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base: PathBuf = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("xlfs-bench-").tempdir_in(base).expect("scratch dir")
}

/// A multi-thread runtime like the one the `xlfs` binary runs.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Builds and activates the graph in `volfile` (text), waiting until it is up.
pub fn graph(rt: &tokio::runtime::Runtime, volfile: &str) -> Graph {
    let g = Graph::from_str(volfile, "bench.vol", &Registry::builtin()).expect("bench volfile builds");
    g.activate();
    rt.block_on(g.wait_up(Duration::from_secs(10))).expect("graph up");
    g
}

/// One translator stacked in a bench graph: its type and options.
pub type Layer<'a> = (&'a str, &'a [(&'a str, &'a str)]);

/// A volfile of `storage/posix` on `dir` with the given translators stacked
/// on top, each as `(type, options)`, bottom first.
pub fn stack(dir: &Path, layers: &[Layer<'_>]) -> String {
    layered(&format!("volume l0\n    type storage/posix\n    option directory {}\nend-volume\n", dir.display()), layers)
}

/// `leaf` (the text of volume `l0`) with the given translators stacked on
/// top as `l1`, `l2`..., each as `(type, options)`, bottom first.
fn layered(leaf: &str, layers: &[Layer<'_>]) -> String {
    let mut v = leaf.to_string();
    for (i, (ty, opts)) in layers.iter().enumerate() {
        v.push_str(&format!("volume l{}\n    type {ty}\n", i + 1));
        for (k, val) in opts.iter() {
            v.push_str(&format!("    option {k} {val}\n"));
        }
        v.push_str(&format!("    subvolumes l{i}\nend-volume\n"));
    }
    v
}

/// The size of every file the null leaf's lookups find.
pub const NULL_FILE_SIZE: usize = 4096;

static NULL_CONTENT: [u8; NULL_FILE_SIZE] = [0; NULL_FILE_SIZE];

/// A leaf that answers every fop at once, so that what is measured above it
/// is the translators' own cost. A lookup finds a regular file of
/// [`NULL_FILE_SIZE`] bytes (gfid as asked, or a fixed one for a name) and
/// returns its content when asked with `glusterfs.content`. Every directory
/// is endless: a readdirp returns as many entries as fit in its size
/// (counted as storage/posix counts them), the n-th after `offset` with
/// `d_off` `offset + n`.
struct Null;

/// Entries of the null leaf's endless directories, from `offset`.
fn null_dirents(size: u32, offset: u64) -> Vec<DirEntry> {
    let per = 216 + 12 + 1;
    let n = (size as usize / per).clamp(1, 4096) as u64;
    (1..=n)
        .map(|i| {
            let d_off = offset.wrapping_add(i);
            let gfid = Gfid([(d_off % 251) as u8 + 1; 16]);
            let iatt = Iatt { gfid, mode: 0o100644, size: NULL_FILE_SIZE as u64, ..Iatt::default() };
            DirEntry { name: format!("e{d_off:011}"), d_off, d_type: FileType::Regular, iatt }
        })
        .collect()
}

impl Xlator for Null {
    fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let mut xdata = Dict::new();
        let reply = match &req.fop {
            Fop::Stat { .. } | Fop::Fstat { .. } => Reply::Attr(Iatt { gfid: req.fop.gfid(), ..Iatt::default() }),
            Fop::Writev { .. } => Reply::PrePost { pre: Iatt::default(), post: Iatt::default() },
            Fop::Lookup { loc } => {
                let gfid = if loc.gfid.is_null() { Gfid([0xf1; 16]) } else { loc.gfid };
                let iatt = Iatt { gfid, mode: 0o100644, size: NULL_FILE_SIZE as u64, ..Iatt::default() };
                if req.xdata.get_u64(keys::CONTENT).is_some_and(|max| max >= NULL_FILE_SIZE as u64) {
                    xdata.set_bytes(keys::CONTENT, Bytes::from_static(&NULL_CONTENT));
                }
                Reply::Entry { iatt, postparent: Iatt::default() }
            }
            Fop::Readdirp { size, offset, .. } => Reply::Dirents(null_dirents(*size, *offset)),
            _ => Reply::Empty,
        };
        Box::pin(async move { Ok(Response { reply, xdata }) })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        (from == EventFrom::Graph && event == Event::ParentUp).then_some(Event::ChildUp)
    }
}

/// The null leaf's type (`bench/null`), for benches that build their own
/// registry or call it without a graph.
pub const NULL: XlatorType = XlatorType {
    name: "bench/null",
    description: "answers every fop at once",
    options: &[],
    min_children: 0,
    max_children: 0,
    build: |_: InitCtx| -> Result<Arc<dyn Xlator>, InitError> { Ok(Arc::new(Null)) },
};

/// Builds and activates the graph in `volfile` (text), whose leaves may be
/// the null leaf (`bench/null`).
pub fn null_volfile_graph(rt: &tokio::runtime::Runtime, volfile: &str) -> Graph {
    let mut reg = Registry::builtin();
    reg.register(NULL).expect("register bench/null");
    let g = Graph::from_str(volfile, "bench.vol", &reg).expect("bench volfile builds");
    g.activate();
    rt.block_on(g.wait_up(Duration::from_secs(10))).expect("graph up");
    g
}

/// Builds and activates a graph of the null leaf (`bench/null`) with the
/// given translators stacked on top, each as `(type, options)`, bottom first.
pub fn null_graph(rt: &tokio::runtime::Runtime, layers: &[Layer<'_>]) -> Graph {
    null_volfile_graph(rt, &layered("volume l0\n    type bench/null\nend-volume\n", layers))
}
