//! Compiled WebAssembly kept on disk between processes.
//!
//! Compiling a module with Cranelift takes 0.3 s for the 260 KB
//! pass-through example on this project's machine, and every process that
//! loads it paid that: `xlfs up` checking the key, the daemon, each mount
//! and each remount. The machine code the compiler makes is saved here
//! (`Engine::precompile_module`), named by the SHA-256 of the module's
//! bytes and the engine's compatibility hash (wasmtime's version and
//! settings), and the next process maps it in (`Module::deserialize_file`)
//! in a few milliseconds.
//!
//! Loading machine code from a file trusts the file as much as the
//! program itself, so the directory must be this user's own: made mode
//! 0700, and used only if it is a real directory owned by the effective
//! user and writable by nobody else (as ssh checks `~/.ssh`); a file in it
//! must be owned by the user and not writable by others too. Anything else
//! is logged once and the process compiles as before. A file that does
//! not load (truncated, from another build) is compiled again and
//! replaced. Entries are written whole (a temporary file renamed), and at
//! most [`MAX_ENTRIES`] are kept, the least recently used removed first.
//!
//! The directory: `XLFS_WASM_CACHE` if set (`off` turns the cache off),
//! else `/var/cache/xlfs/wasm` for root and `$XDG_CACHE_HOME/xlfs/wasm`
//! (or `~/.cache/xlfs/wasm`) for other users.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::{Engine, Module};

/// Most compiled modules kept.
pub(super) const MAX_ENTRIES: usize = 64;

/// Modules loaded from the cache in this process (read by the tests).
pub(super) static HITS: AtomicU64 = AtomicU64::new(0);

/// The cache directory this process uses, if any.
fn dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = configured()?;
        match trusted_dir(&dir) {
            Ok(()) => Some(dir),
            Err(why) => {
                tracing::warn!(target: "xlfs::plugin", dir = %dir.display(),
                    "not using the compiled-plugin cache: {why}; each process compiles its plugins");
                None
            }
        }
    })
    .as_deref()
}

fn configured() -> Option<PathBuf> {
    match std::env::var_os("XLFS_WASM_CACHE") {
        Some(v) if v == "off" => return None,
        Some(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/cache/xlfs/wasm"));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("xlfs/wasm"))
}

/// Makes `dir` (mode 0700) if missing, and checks it is this user's alone.
fn trusted_dir(dir: &Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err("not an absolute path".into());
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("cannot make it: {e}"))?;
    let m = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !m.is_dir() {
        return Err("not a directory (a symbolic link?)".into());
    }
    owned_by_me(&m)
}

fn owned_by_me(m: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(format!("owned by uid {}, not {me}", m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("mode {:o} lets others write", m.mode() & 0o7777));
    }
    Ok(())
}

/// The module in `bytes` (whose SHA-256 the loader already took for its
/// own cache: `sha256`), compiled, from the cache when it holds it.
pub(super) fn compile(engine: &Engine, bytes: &[u8], sha256: &[u8; 32]) -> wasmtime::Result<Module> {
    match dir() {
        Some(dir) => compile_in(engine, bytes, sha256, dir),
        None => Module::new(engine, bytes),
    }
}

/// [`compile`] with the cache in `dir` (already checked).
pub(super) fn compile_in(engine: &Engine, bytes: &[u8], sha256: &[u8; 32], dir: &Path) -> wasmtime::Result<Module> {
    let path = dir.join(entry_name(engine, sha256));
    if let Ok(m) = std::fs::symlink_metadata(&path)
        && m.is_file()
        && owned_by_me(&m).is_ok()
    {
        // SAFETY: the file is this user's own, in a directory only this
        // user can write, and was written whole by `precompile_module` for
        // an engine with the same compatibility hash (its name says so);
        // wasmtime checks its header and refuses another version's.
        match unsafe { Module::deserialize_file(engine, &path) } {
            Ok(module) => {
                HITS.fetch_add(1, Ordering::Relaxed);
                // Its modification time orders the entries for eviction.
                let _ = std::fs::File::open(&path).and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return Ok(module);
            }
            Err(e) => {
                tracing::info!(target: "xlfs::plugin", file = %path.display(), "compiled plugin not usable, compiling again: {e:#}")
            }
        }
    }
    let code = engine.precompile_module(bytes)?;
    // SAFETY: `code` is what this engine's `precompile_module` just made.
    let module = unsafe { Module::deserialize(engine, &code)? };
    if let Err(e) = store(dir, &path, &code) {
        tracing::info!(target: "xlfs::plugin", dir = %dir.display(), "compiled plugin not kept: {e}");
    }
    Ok(module)
}

/// The entry's file name: the module's SHA-256 and the engine's
/// compatibility hash.
fn entry_name(engine: &Engine, sha256: &[u8; 32]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let sha: String = sha256.iter().map(|b| format!("{b:02x}")).collect();
    format!("{sha}-{:016x}.cwasm", h.finish())
}

/// Writes `code` as `path` whole (a temporary file renamed), then keeps
/// the directory at [`MAX_ENTRIES`].
fn store(dir: &Path, path: &Path, code: &[u8]) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, code)?;
            // The same clock as a hit's touch: the kernel's write time is
            // coarser and can sort a new entry before one touched just now.
            f.set_modified(std::time::SystemTime::now())
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    evict(dir, MAX_ENTRIES)
}

/// Removes the least recently used entries beyond `keep`.
fn evict(dir: &Path, keep: usize) -> std::io::Result<()> {
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if entries.len() <= keep {
        return Ok(());
    }
    entries.sort();
    for (_, p) in &entries[..entries.len() - keep] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::PermissionsExt;

    /// `compile_in` as the loader calls it, with the module's SHA-256.
    fn load(engine: &Engine, bytes: &[u8], dir: &Path) -> wasmtime::Result<Module> {
        compile_in(engine, bytes, &Sha256::digest(bytes).into(), dir)
    }

    /// The smallest valid module, and one with a different body.
    const EMPTY: &[u8] = b"\0asm\x01\0\0\0";
    /// A module with one custom section (another hash, another entry).
    const NAMED: &[u8] = b"\0asm\x01\0\0\0\x00\x03\x01x\x00";

    fn cwasm(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_module_compiled_once_is_loaded_from_the_cache() {
        let engine = Engine::default();
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("cache");
        trusted_dir(&dir).expect("made");
        assert_eq!(std::fs::metadata(&dir).expect("dir").mode() & 0o777, 0o700);
        load(&engine, EMPTY, &dir).expect("compiled");
        let files = cwasm(&dir);
        assert_eq!(files.len(), 1, "{files:?}");
        let hits = HITS.load(Ordering::Relaxed);
        load(&engine, EMPTY, &dir).expect("from the cache");
        assert!(HITS.load(Ordering::Relaxed) > hits, "the second load is a hit");
        // A damaged entry is compiled again and replaced.
        std::fs::write(&files[0], b"not machine code").expect("damage");
        let hits = HITS.load(Ordering::Relaxed);
        load(&engine, EMPTY, &dir).expect("compiled again");
        assert!(std::fs::read(&files[0]).expect("entry").len() > 16, "replaced");
        load(&engine, EMPTY, &dir).expect("from the cache again");
        assert!(HITS.load(Ordering::Relaxed) > hits);
        // Another module is another entry; beyond the bound the oldest goes.
        // (The first entry is made an hour older so the order does not
        // rest on two timestamps taken a few microseconds apart.)
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&files[0]).and_then(|f| f.set_modified(hour_ago)).expect("backdate");
        load(&engine, NAMED, &dir).expect("compiled");
        assert_eq!(cwasm(&dir).len(), 2);
        let newest = entry_name(&engine, &Sha256::digest(NAMED).into());
        evict(&dir, 1).expect("evict");
        let left = cwasm(&dir);
        assert!(left.len() == 1 && left[0].ends_with(&newest), "{left:?}");
    }

    #[test]
    fn a_directory_others_can_write_is_not_used() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("open");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = trusted_dir(&dir).expect_err("world-writable");
        assert!(e.contains("lets others write"), "{e}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).expect("symlink");
        let e = trusted_dir(&link).expect_err("a symlink");
        assert!(e.contains("not a directory"), "{e}");
        assert!(trusted_dir(Path::new("relative/dir")).is_err());
    }
}
