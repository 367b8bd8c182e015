//! Live reload of a mounted client's volfile (GlusterFS's graph switch):
//! what `xlfs mount` runs on SIGHUP, on `xlfs reload`, and when its volfile
//! watcher sees the volfile (or a module file it names) change.
//!
//! A [`Reloader::reload`] reads and validates the volfile, then compares it
//! with the running graph ([`GraphSpec::diff`]):
//! - nothing changed: nothing happens;
//! - only option values changed: the translators concerned are
//!   reconfigured, all or nothing ([`Graph::reconfigure`]); a refused value
//!   leaves every translator as it was and the error names the volume, the
//!   option and the value; a translator that cannot reconfigure makes it a
//!   rebuild;
//! - volumes added, removed, retyped or rewired, or a module file rebuilt in
//!   place: a new graph is built beside the running one, activated, and
//!   once it is up the mount switches to it ([`SwitchTarget::switch`]:
//!   fds reopened, locks moved, the old graph drained and freed).
//!
//! A volfile that does not parse, validate, build (a plugin whose init
//! fails) or come up leaves the running graph in place; the reason is
//! logged and returned. Reloads run one at a time. [`Reloader::status`]
//! says what runs, since when, and how the last reload went.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::fuse::{Mount, SwitchReport};
use crate::graph::{Graph, GraphDiff, GraphSpec, LoadError, NotUp, OptionChange, ReconfigureFailure, live_graphs};
use crate::registry::Registry;
use crate::volfile::Volfile;

/// What a reload switches: a mount, or (in tests) a stand-in.
pub trait SwitchTarget: Send + Sync {
    /// The running graph (`None` if the target does not own one).
    fn graph(&self) -> Option<Arc<Graph>>;
    /// The running graph's generation.
    fn generation(&self) -> u64;
    /// Moves to `graph` (activated and up) and frees the old one.
    fn switch(&self, graph: Arc<Graph>) -> Pin<Box<dyn Future<Output = SwitchReport> + Send + '_>>;
}

impl SwitchTarget for Mount {
    fn graph(&self) -> Option<Arc<Graph>> {
        Mount::graph(self)
    }
    fn generation(&self) -> u64 {
        Mount::generation(self)
    }
    fn switch(&self, graph: Arc<Graph>) -> Pin<Box<dyn Future<Output = SwitchReport> + Send + '_>> {
        Box::pin(Mount::switch(self, graph))
    }
}

/// Why a reload was refused; the running graph is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ReloadFailure {
    /// The volfile could not be read, parsed or validated, or the new
    /// graph could not be built (a translator's or plugin's init failed).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The new graph was built but did not come up.
    #[error("the new graph did not come up: {0}")]
    NotUp(#[from] NotUp),
    /// A translator refused the new option values.
    #[error(transparent)]
    Reconfigure(#[from] ReconfigureFailure),
    /// The mount does not own its graph (it was mounted by a caller that
    /// keeps the graph).
    #[error("this mount's graph is not managed by the mount: it cannot be reloaded")]
    NoGraph,
    /// A task failed.
    #[error("reload task: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// What a successful reload did.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// The volfile (and the files it names) says what already runs.
    Unchanged,
    /// Options changed in place.
    Reconfigured(Vec<OptionChange>),
    /// A new graph replaced the old one.
    Switched {
        /// Why a new graph was needed.
        why: String,
        /// What the switch did.
        report: SwitchReport,
    },
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Applied::Unchanged => f.write_str("unchanged"),
            Applied::Reconfigured(c) => {
                let c: Vec<String> = c.iter().map(ToString::to_string).collect();
                write!(f, "reconfigured {}", c.join("; "))
            }
            Applied::Switched { why, report } => write!(f, "switched to a new graph ({why}): {report}"),
        }
    }
}

/// One reload and how it went.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// When it finished.
    pub at: SystemTime,
    /// What asked for it (SIGHUP, `xlfs reload`, the watcher).
    pub trigger: String,
    /// What it did, or why it was refused.
    pub outcome: Result<Applied, String>,
}

/// A reloadable mount's state, as `xlfs status` shows it.
#[derive(Clone, Debug)]
pub struct Status {
    /// The volfile.
    pub volfile: PathBuf,
    /// The running graph's generation.
    pub generation: u64,
    /// When the running graph was switched in (or mounted).
    pub switched_at: SystemTime,
    /// The running graph ([`Graph::describe`]).
    pub graph: String,
    /// Graphs alive in the process (the running one, and old ones still
    /// draining).
    pub live_graphs: usize,
    /// The process's worker threads (`TOKIO_WORKER_THREADS`, else one per
    /// core; 0 outside a runtime).
    pub event_threads: usize,
    /// The last reload.
    pub last: Option<Attempt>,
}

/// Seconds since the epoch, and how long ago.
fn when(t: SystemTime) -> String {
    let epoch = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let ago = SystemTime::now().duration_since(t).unwrap_or_default();
    format!("unix time {epoch:.3} ({:.1} s ago)", ago.as_secs_f64())
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "volfile: {}", self.volfile.display())?;
        writeln!(f, "generation: {}", self.generation)?;
        writeln!(f, "switched: {}", when(self.switched_at))?;
        writeln!(f, "live graphs: {}", self.live_graphs)?;
        writeln!(f, "event threads: {}", self.event_threads)?;
        match &self.last {
            None => writeln!(f, "last reload: none")?,
            Some(a) => {
                let outcome = match &a.outcome {
                    Ok(applied) => format!("ok: {applied}"),
                    Err(why) => format!("rejected: {why}"),
                };
                writeln!(f, "last reload: {} ({}): {outcome}", when(a.at), a.trigger)?;
            }
        }
        writeln!(f, "graph:")?;
        f.write_str(&self.graph)
    }
}

/// A module file modified less than this long ago may still be being
/// written: validation is repeated once it has settled.
const SETTLE: Duration = Duration::from_millis(100);

/// What a watcher compares: the volfile's size, mtime and content hash,
/// and the size and mtime of each file the running graph names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    volfile: Option<(u64, SystemTime, [u8; 32])>,
    files: Vec<(PathBuf, Option<(u64, SystemTime)>)>,
}

fn meta(p: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?))
}

struct State {
    switched_at: SystemTime,
    last: Option<Attempt>,
    /// What the last reload (or the start) saw.
    seen: Option<Stamp>,
}

/// Reloads a mount's volfile; see the module documentation.
pub struct Reloader {
    volfile: PathBuf,
    registry: Arc<Registry>,
    target: Arc<dyn SwitchTarget>,
    up_timeout: Duration,
    serial: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

impl Reloader {
    /// A reloader of `target` from `volfile`, with types from `registry`;
    /// a new graph gets `up_timeout` to come up.
    pub fn new(volfile: PathBuf, registry: Registry, target: Arc<dyn SwitchTarget>, up_timeout: Duration) -> Reloader {
        let r = Reloader {
            volfile,
            registry: Arc::new(registry),
            target,
            up_timeout,
            serial: tokio::sync::Mutex::new(()),
            state: Mutex::new(State { switched_at: SystemTime::now(), last: None, seen: None }),
        };
        r.state.lock().seen = Some(r.stamp());
        r
    }

    fn stamp(&self) -> Stamp {
        let volfile = std::fs::read(&self.volfile).ok().and_then(|bytes| {
            let (len, mtime) = meta(&self.volfile)?;
            Some((len, mtime, Sha256::digest(&bytes).into()))
        });
        let files = match self.target.graph() {
            Some(g) => g.spec().files().into_iter().map(|p| (p.clone(), meta(&p))).collect(),
            None => Vec::new(),
        };
        Stamp { volfile, files }
    }

    /// Re-reads the volfile and applies it (see the module documentation).
    /// `trigger` says who asked, for the log and the status.
    pub async fn reload(&self, trigger: &str) -> Result<Applied, ReloadFailure> {
        let _one = self.serial.lock().await;
        let stamp = self.stamp();
        let generation = self.target.generation();
        let r = self.apply().await;
        let mut st = self.state.lock();
        st.seen = Some(stamp);
        match &r {
            Ok(a @ Applied::Switched { .. }) => {
                st.switched_at = SystemTime::now();
                tracing::info!(trigger, volfile = %self.volfile.display(), "reload: {a}");
            }
            Ok(a) => tracing::info!(trigger, volfile = %self.volfile.display(), "reload: {a}"),
            Err(e) => tracing::error!(trigger, volfile = %self.volfile.display(),
                "reload rejected, graph generation {generation} left running: {e}"),
        }
        let outcome = r.as_ref().map(Clone::clone).map_err(ToString::to_string);
        st.last = Some(Attempt { at: SystemTime::now(), trigger: trigger.to_string(), outcome });
        r
    }

    async fn apply(&self) -> Result<Applied, ReloadFailure> {
        let current = self.target.graph().ok_or(ReloadFailure::NoGraph)?;
        let spec = self.validate().await?;
        let why = match current.spec().diff(&spec) {
            GraphDiff::Same => return Ok(Applied::Unchanged),
            GraphDiff::Structure(why) => why,
            GraphDiff::Options(_) => match current.reconfigure(spec.clone()) {
                Ok(changes) => return Ok(Applied::Reconfigured(changes)),
                Err(ReconfigureFailure::Unsupported { change }) => format!("{change}: needs a new instance"),
                Err(e) => return Err(e.into()),
            },
        };
        drop(current);
        let graph = tokio::task::spawn_blocking(move || Graph::from_spec(spec)).await?.map_err(LoadError::from)?;
        let graph = Arc::new(graph);
        graph.activate();
        if let Err(e) = graph.wait_up(self.up_timeout).await {
            let _ = tokio::task::spawn_blocking(move || graph.shutdown()).await;
            return Err(e.into());
        }
        let report = self.target.switch(graph).await;
        Ok(Applied::Switched { why, report })
    }

    /// Reads and validates the volfile. Validation loads the module files
    /// it names; if one changes meanwhile (being written), what was loaded
    /// and what was hashed may differ, so that is tried again.
    async fn validate(&self) -> Result<GraphSpec, ReloadFailure> {
        let mut tries = 0;
        loop {
            // Validation may compile plugin modules: off the async threads.
            let (path, registry) = (self.volfile.clone(), self.registry.clone());
            let spec = tokio::task::spawn_blocking(move || -> Result<GraphSpec, LoadError> {
                Ok(GraphSpec::validate(&Volfile::load(&path)?, &registry)?)
            })
            .await??;
            let after: Vec<(PathBuf, Option<(u64, SystemTime)>)> =
                spec.files().into_iter().map(|p| (p.clone(), meta(&p))).collect();
            let stable =
                after.iter().all(|(_, m)| m.is_some_and(|(_, mtime)| mtime.elapsed().unwrap_or_default() > SETTLE));
            tries += 1;
            if stable || tries >= 3 {
                return Ok(spec);
            }
            tokio::time::sleep(SETTLE).await;
        }
    }

    /// The running graph, if the mount owns one.
    pub fn graph(&self) -> Option<Arc<Graph>> {
        self.target.graph()
    }

    /// Every translator's dump of the running graph (`volume.key`, value).
    pub fn dump(&self) -> Vec<(String, String)> {
        self.target.graph().map(|g| g.dump()).unwrap_or_default()
    }

    /// Sends what the running graph delayed (see [`Graph::drain`]).
    pub async fn drain(&self) -> bool {
        match self.target.graph() {
            Some(g) => g.drain(crate::fuse::switch::DRAIN * 2).await,
            None => true,
        }
    }

    /// The mount's state.
    pub fn status(&self) -> Status {
        let st = self.state.lock();
        Status {
            volfile: self.volfile.clone(),
            generation: self.target.generation(),
            switched_at: st.switched_at,
            graph: self.target.graph().map(|g| g.describe()).unwrap_or_default(),
            live_graphs: live_graphs(),
            event_threads: tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_workers()),
            last: st.last.clone(),
        }
    }

    /// Watches the volfile and the files the running graph names, every
    /// `every`, and reloads when their size, mtime or (for the volfile)
    /// content changed since the last reload and then stayed the same for
    /// one more look (a file still being written is not loaded half
    /// done). Runs until dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut previous: Option<Stamp> = None;
        loop {
            tokio::time::sleep(every).await;
            let stamp = self.stamp();
            let changed = self.state.lock().seen.as_ref() != Some(&stamp);
            if changed && previous.as_ref() == Some(&stamp) {
                let _ = self.reload("volfile watcher").await;
            }
            previous = Some(stamp);
        }
    }

    /// Waits for a reload in progress to end (at most `timeout`): call
    /// before unmounting.
    pub async fn quiesce(&self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.serial.lock()).await.is_err() {
            tracing::warn!("a reload is still running at unmount");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use parking_lot::RwLock;
    use xlfs_sdk::options::{OptType, OptionDecl};
    use xlfs_sdk::xlator::ReconfigureError;
    use xlfs_sdk::{
        CallCtx, Child, Errno, Event, EventFrom, EventSink, FopFuture, InitCtx, InitError, Options, Request, Xlator,
        XlatorType,
    };

    use super::*;

    /// A stand-in for a mount: switching swaps the graph and shuts the old
    /// one down.
    struct Target {
        graph: RwLock<Arc<Graph>>,
        generation: AtomicU64,
    }

    impl SwitchTarget for Target {
        fn graph(&self) -> Option<Arc<Graph>> {
            Some(self.graph.read().clone())
        }
        fn generation(&self) -> u64 {
            self.generation.load(Ordering::Acquire)
        }
        fn switch(&self, graph: Arc<Graph>) -> Pin<Box<dyn Future<Output = SwitchReport> + Send + '_>> {
            Box::pin(async move {
                let old = std::mem::replace(&mut *self.graph.write(), graph);
                old.shutdown();
                let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                SwitchReport { generation, drained: true, ..SwitchReport::default() }
            })
        }
    }

    /// A leaf that is up at once, and a pass-through whose `level` option
    /// reconfigures (refusing 13) and whose `fixed` option does not.
    struct Xl {
        children: Vec<Child>,
        sink: EventSink,
    }

    impl Xlator for Xl {
        fn call(&self, _ctx: CallCtx, _req: Request) -> FopFuture<'_> {
            Box::pin(async { Err(Errno::ENOSYS) })
        }
        fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
            match (from, &event) {
                (EventFrom::Graph, Event::ParentUp) if self.children.is_empty() => self.sink.send(Event::ChildUp),
                (EventFrom::Child(_), _) => return Some(event),
                _ => {}
            }
            None
        }
        fn reconfigure(&self, o: &Options) -> Result<(), ReconfigureError> {
            match o.int("level") {
                Some(13) => Err(ReconfigureError::Invalid("13 is not a level".into())),
                _ if o.is_set("fixed") => Err(ReconfigureError::Unsupported),
                _ => Ok(()),
            }
        }
    }

    fn build(i: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
        if i.options.bool("fail") == Some(true) {
            return Err(InitError::new("refused to start"));
        }
        Ok(Arc::new(Xl { children: i.children, sink: i.events }))
    }

    const OPTS: &[OptionDecl] = &[
        OptionDecl::new("level", OptType::Int).default("1").range(0.0, 20.0),
        OptionDecl::new("fixed", OptType::Bool),
        OptionDecl::new("fail", OptType::Bool).default("off"),
    ];

    fn registry() -> Registry {
        let mut r = Registry::new();
        let leaf =
            XlatorType { name: "t/leaf", description: "", options: OPTS, min_children: 0, max_children: 0, build };
        let pass =
            XlatorType { name: "t/pass", description: "", options: OPTS, min_children: 1, max_children: 1, build };
        r.register(leaf).expect("new");
        r.register(pass).expect("new");
        r
    }

    fn volfile(level: u32, extra: &str) -> String {
        format!(
            "volume leaf\n type t/leaf\nend-volume\n{extra}\
             volume top\n type t/pass\n option level {level}\n subvolumes {}\nend-volume\n",
            if extra.is_empty() { "leaf" } else { "mid" }
        )
    }

    const MID: &str = "volume mid\n type t/pass\n subvolumes leaf\nend-volume\n";

    async fn setup(text: &str) -> (tempfile::TempDir, PathBuf, Arc<Target>, Reloader) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.vol");
        std::fs::write(&path, text).expect("write");
        let g = Arc::new(Graph::load(&path, &registry()).expect("builds"));
        g.activate();
        let target = Arc::new(Target { graph: RwLock::new(g), generation: AtomicU64::new(1) });
        let r = Reloader::new(path.clone(), registry(), target.clone(), Duration::from_secs(5));
        (dir, path, target, r)
    }

    #[tokio::test]
    async fn options_reconfigure_and_structure_switches() {
        let (_d, path, target, r) = setup(&volfile(1, "")).await;
        assert_eq!(r.reload("test").await.expect("same"), Applied::Unchanged);
        let before = target.graph.read().clone();
        std::fs::write(&path, volfile(5, "")).expect("write");
        let Applied::Reconfigured(c) = r.reload("test").await.expect("options") else { panic!("reconfigured") };
        assert_eq!(c[0].to_string(), "volume 'top' (t/pass): level 1 -> 5");
        assert!(Arc::ptr_eq(&before, &target.graph.read()), "the same graph");
        assert!(r.status().graph.contains("level 5"), "{}", r.status().graph);
        drop(before);

        std::fs::write(&path, volfile(5, MID)).expect("write");
        let Applied::Switched { why, report } = r.reload("test").await.expect("structure") else { panic!("switched") };
        assert_eq!(why, "volumes added 'mid'");
        assert_eq!(report.generation, 2);
        let s = r.status();
        assert_eq!(s.generation, 2);
        assert!(s.graph.contains("mid (t/pass)"), "{}", s.graph);
        assert!(s.to_string().contains("last reload: ") && s.to_string().contains("(test): ok: switched"), "{s}");

        // An option the translator cannot change in place: a new graph.
        std::fs::write(
            &path,
            volfile(5, MID).replace("type t/pass\n option level", "type t/pass\n option fixed on\n option level"),
        )
        .expect("write");
        let Applied::Switched { why, .. } = r.reload("test").await.expect("rebuilt") else { panic!("switched") };
        assert!(why.contains("needs a new instance"), "{why}");
        assert_eq!(target.generation(), 3);
    }

    #[tokio::test]
    async fn bad_volfiles_leave_the_running_graph() {
        let (_d, path, target, r) = setup(&volfile(1, "")).await;
        let running = target.graph.read().clone();
        let cases = [
            ("volume top\n type t/pass\n subvolumes\n", "c.vol"),
            (&volfile(1, "").replace("level 1", "level 99") as &str, "'level'"),
            (&volfile(13, "") as &str, "volume 'top' (t/pass): level 1 -> 13: refused: 13 is not a level"),
            (&volfile(1, &MID.replace("subvolumes", "option fail on\n subvolumes")) as &str, "refused to start"),
        ];
        for (text, needle) in cases {
            std::fs::write(&path, text).expect("write");
            let e = r.reload("test").await.expect_err("rejected").to_string();
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
            assert!(Arc::ptr_eq(&running, &target.graph.read()), "still the same graph");
            assert_eq!(target.generation(), 1);
            let s = r.status();
            assert!(s.to_string().contains("rejected: "), "{s}");
            assert!(s.graph.contains("level 1"), "options untouched: {}", s.graph);
        }
    }

    #[tokio::test]
    async fn the_watcher_reloads_on_change() {
        let (_d, path, target, r) = setup(&volfile(1, "")).await;
        let r = Arc::new(r);
        let w = tokio::spawn(r.clone().watch(Duration::from_millis(20)));
        std::fs::write(&path, volfile(1, MID)).expect("write");
        for _ in 0..500 {
            if target.generation() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        w.abort();
        assert_eq!(target.generation(), 2);
        assert_eq!(r.status().last.expect("one").trigger, "volfile watcher");
    }
}
