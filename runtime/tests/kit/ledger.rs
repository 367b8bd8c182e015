//! A writer that remembers what it was promised ([`Writer`]), for tests
//! that inject faults under a FUSE mount: on a thread, it writes files of
//! known bytes (64 KiB blocks of a pattern derived from the file and the
//! offset) through ordinary syscalls, fsyncs every few blocks and closes
//! each file, and records every operation: when it started and ended and
//! how it failed. Bytes are *promised* once an fsync or a close after
//! their write succeeded. After a fault, [`Ledger::verify_tree`] checks a
//! tree (the mount, or a brick's directory) holds every promised byte
//! exactly and nothing but the pattern or zeros past it.

use std::fs::{File, OpenOptions};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The size of one write.
pub const BLOCK: usize = 64 << 10;

/// What an operation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Create,
    Write,
    Fsync,
    Close,
}

/// One operation the writer made.
#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    pub file: usize,
    pub start: Instant,
    pub end: Instant,
    /// `None`: it succeeded.
    pub errno: Option<i32>,
    /// It promised the file's bytes so far: an fsync that succeeded, or a
    /// close that succeeded after every write and fsync of the file did.
    pub promised: bool,
}

impl Op {
    pub fn took(&self) -> Duration {
        self.end - self.start
    }

    /// See [`Op::promised`](struct.Op.html#structfield.promised).
    pub fn promised(&self) -> bool {
        self.promised
    }
}

/// One file the writer made (or tried to).
#[derive(Clone, Debug, Default)]
pub struct FileRecord {
    /// Its name under the writer's directory.
    pub name: String,
    /// Bytes whose write returned success.
    pub written: u64,
    /// Bytes promised (an fsync or close after their write succeeded).
    pub promised: u64,
}

/// What a writer did: its files and operations.
#[derive(Default)]
pub struct Ledger {
    pub files: Vec<FileRecord>,
    pub ops: Vec<Op>,
}

/// The writer's shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Blocks per file.
    pub blocks: u64,
    /// Blocks between fsyncs.
    pub fsync_every: u64,
    /// Pause after a failed operation before the next file.
    pub backoff: Duration,
    /// Pause after each block (keeps the data to verify and heal bounded
    /// on long runs).
    pub pace: Duration,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { blocks: 16, fsync_every: 4, backoff: Duration::from_millis(100), pace: Duration::from_millis(20) }
    }
}

/// The byte pattern of file `seed` for the block at `off` (a multiple of 8).
pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut w = off / 8;
    while out.len() < len {
        // splitmix64 of (file, word).
        let mut z = (seed << 40) ^ w ^ 0x9e37_79b9_7f4a_7c15;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        w += 1;
    }
    out.truncate(len);
    out
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The writer thread; [`Writer::stop`] ends it and returns its ledger.
pub struct Writer {
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Ledger>>,
    thread: Option<JoinHandle<()>>,
    dir: PathBuf,
}

impl Writer {
    /// Starts writing files `f00000`, `f00001`, ... into `dir` (made here).
    pub fn start(dir: &Path, shape: Shape) -> Writer {
        std::fs::create_dir_all(dir).expect("writer's directory");
        let stop = Arc::new(AtomicBool::new(false));
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let thread = std::thread::spawn({
            let (stop, ledger, dir) = (stop.clone(), ledger.clone(), dir.to_path_buf());
            move || write_loop(&dir, shape, &stop, &ledger)
        });
        Writer { stop, ledger, thread: Some(thread), dir: dir.to_path_buf() }
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A copy of the operations so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ledger.lock().ops.clone()
    }

    /// Waits until `n` operations that started at or after `since` have
    /// promised bytes; false after `timeout`.
    pub fn wait_promises(&self, since: Instant, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ledger.lock().ops.iter().filter(|o| o.start >= since && o.promised()).count() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops after the file being written is closed; returns the ledger.
    pub fn stop(mut self) -> Ledger {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("writer thread");
        }
        std::mem::take(&mut *self.ledger.lock())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Not joined: after a panic the mount may be what it waits on.
    }
}

fn write_loop(dir: &Path, shape: Shape, stop: &AtomicBool, ledger: &Mutex<Ledger>) {
    let record = |kind, file, start, res: Result<(), i32>, failed: bool| {
        let promised = matches!(kind, OpKind::Fsync | OpKind::Close) && res.is_ok() && !failed;
        let op = Op { kind, file, start, end: Instant::now(), errno: res.err(), promised };
        ledger.lock().ops.push(op);
        res
    };
    for n in 0usize.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let name = format!("f{n:05}");
        ledger.lock().files.push(FileRecord { name: name.clone(), ..FileRecord::default() });
        let set = |f: &dyn Fn(&mut FileRecord)| f(&mut ledger.lock().files[n]);
        let start = Instant::now();
        let opened = OpenOptions::new().write(true).create_new(true).mode(0o644).open(dir.join(&name));
        let file = match opened {
            Ok(f) => {
                let _ = record(OpKind::Create, n, start, Ok(()), false);
                f
            }
            Err(e) => {
                let _ = record(OpKind::Create, n, start, Err(errno_of(&e)), false);
                std::thread::sleep(shape.backoff);
                continue;
            }
        };
        let mut failed = false;
        for b in 0..shape.blocks {
            let off = b * BLOCK as u64;
            let start = Instant::now();
            let res = file.write_all_at(&pattern(n as u64, off, BLOCK), off).map_err(|e| errno_of(&e));
            if record(OpKind::Write, n, start, res, false).is_err() {
                failed = true;
                break;
            }
            set(&|r| r.written = off + BLOCK as u64);
            if (b + 1) % shape.fsync_every == 0 {
                let start = Instant::now();
                let res = file.sync_all().map_err(|e| errno_of(&e));
                if record(OpKind::Fsync, n, start, res, false).is_err() {
                    failed = true;
                    break;
                }
                set(&|r| r.promised = r.written);
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(shape.pace);
        }
        let start = Instant::now();
        let fd = file.into_raw_fd();
        // SAFETY: we own fd (into_raw_fd) and close it exactly once.
        let rc = unsafe { libc::close(fd) };
        let res = if rc == 0 { Ok(()) } else { Err(errno_of(&std::io::Error::last_os_error())) };
        if record(OpKind::Close, n, start, res, failed).is_ok() && !failed {
            set(&|r| r.promised = r.written);
        }
        if failed || res.is_err() {
            std::thread::sleep(shape.backoff);
        }
    }
}

impl Ledger {
    /// Operations that failed, with their errno.
    pub fn errors(&self) -> Vec<&Op> {
        self.ops.iter().filter(|o| o.errno.is_some()).collect()
    }

    /// The longest any operation took.
    pub fn longest(&self) -> Duration {
        self.ops.iter().map(Op::took).max().unwrap_or_default()
    }

    /// Promised bytes in all.
    pub fn promised_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.promised).sum()
    }

    /// Checks that `dir` (the writer's directory seen through the mount, or
    /// on a brick) holds every promised byte and, past them, only the
    /// pattern or zeros (a write that failed may or may not have landed).
    /// Returns the number of bytes checked; panics with what is wrong.
    pub fn verify_tree(&self, dir: &Path) -> u64 {
        self.check_tree(dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Ledger::verify_tree`], saying what is wrong instead of panicking.
    pub fn check_tree(&self, dir: &Path) -> Result<u64, String> {
        let mut checked = 0;
        for (n, f) in self.files.iter().enumerate() {
            let path = dir.join(&f.name);
            let data = match std::fs::read(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && f.promised == 0 => continue,
                Err(e) => return Err(format!("{}: {e} ({} bytes were promised)", path.display(), f.promised)),
            };
            if (data.len() as u64) < f.promised {
                return Err(format!("{}: {} bytes, {} were promised", path.display(), data.len(), f.promised));
            }
            let want = pattern(n as u64, 0, data.len());
            let p = f.promised as usize;
            // Slices first (memcmp); byte by byte only to say where.
            let bad = if data[..p] != want[..p] {
                data[..p].iter().zip(&want[..p]).position(|(g, w)| g != w)
            } else if data[p..] != want[p..] {
                data[p..].iter().zip(&want[p..]).position(|(&g, &w)| g != w && g != 0).map(|i| i + p)
            } else {
                None
            };
            if let Some(i) = bad {
                return Err(format!(
                    "{}: byte {i} is {:#x}, want {:#x} ({} bytes promised, {} written, {} on file)",
                    path.display(),
                    data[i],
                    want[i],
                    f.promised,
                    f.written,
                    data.len()
                ));
            }
            checked += data.len() as u64;
        }
        Ok(checked)
    }
}

/// Watches the threads of some processes for the uninterruptible sleep
/// (`D`) and keeps the longest time any one stayed in it.
pub struct DWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(Duration, String)>>,
}

impl DWatch {
    /// Samples every 50 ms the threads of `pids`.
    pub fn start(pids: Vec<u32>) -> DWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut since: std::collections::HashMap<String, Instant> = Default::default();
                let (mut worst, mut who) = (Duration::ZERO, String::new());
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let mut seen = std::collections::HashSet::new();
                    for pid in &pids {
                        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
                        for t in tasks.flatten() {
                            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                            let d = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('D'));
                            if d {
                                let key = format!("{pid}/{}", t.file_name().to_string_lossy());
                                let s = *since.entry(key.clone()).or_insert(now);
                                if now - s > worst {
                                    worst = now - s;
                                    who = format!("{key}: {}", stat.trim());
                                }
                                seen.insert(key);
                            }
                        }
                    }
                    since.retain(|k, _| seen.contains(k));
                    std::thread::sleep(Duration::from_millis(50));
                }
                (worst, who)
            }
        });
        DWatch { stop, thread: Some(thread) }
    }

    /// Stops; the longest stretch a thread spent in D state, and which.
    pub fn stop(mut self) -> (Duration, String) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(|t| t.join().expect("D watch")).unwrap_or_default()
    }
}

impl Drop for DWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes `len` bytes of pattern `seed` to `path`, fsyncs and closes;
/// the first error, if any.
pub fn write_file(path: &Path, seed: u64, len: u64) -> std::io::Result<()> {
    let f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(path)?;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(BLOCK as u64) as usize;
        f.write_all_at(&pattern(seed, off, n), off)?;
        off += n as u64;
    }
    f.sync_all()?;
    close(f)
}

/// Closes `f`, returning close(2)'s error (which `drop` would lose).
pub fn close(f: File) -> std::io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: we own fd and close it once.
    if unsafe { libc::close(fd) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Checks `path` holds exactly `len` bytes of pattern `seed`.
pub fn check_file(path: &Path, seed: u64, len: u64) {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(data.len() as u64, len, "size of {}", path.display());
    assert!(data == pattern(seed, 0, len as usize), "data of {} differs from what was written", path.display());
}
