//! End-to-end tests of the FUSE mount.
//!
//! Most mount a volume served by a real `xlfs brick` process (the kit's
//! [`kit::Brick`]) with `xlfs mount --foreground` in a child process and
//! drive it with ordinary tools and system calls: a POSIX workload with cp,
//! tar, mv, ln, chmod, chown, truncate, setfattr/getfattr and flock; a random
//! read/write/truncate exerciser checked against an in-memory model; git;
//! POSIX, OFD and flock locks with an interrupted wait; SIGTERM and SIGINT;
//! daemon mode through the `mount.xlfs` helper; ACL and SELinux xattrs as
//! the mount options say; the page cache kept across the mount's own
//! writes; set-user-ID dropped by other users' writes. All but the
//! mount-process tests (signals, the helper, mount errors) run again on a
//! 2 x 3 distributed-replicate volume (six brick processes, the volfile
//! `xlfs up --sets 2` writes). Two tests mount in-process to see the
//! bridge's insides (`fuse/in_process.rs`): invalidation upcalls and the
//! inode table's bound.
//!
//! Every mount is a [`FuseMount`] guard: dropping it (also when a test
//! panics) stops the mount process and detaches the mount if still there.
//! Each test has its own brick, temp dirs and ports, so they run in parallel.

#[path = "fuse/in_process.rs"]
mod in_process;
mod kit;

use kit::fuse_mount::{FuseMount, MOUNT_TIMEOUT, XLFS, is_mounted, send_signal, sh};
use xlfs_sdk::testing::{Rng, eventually};

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The brick processes of a [`Volume`].
enum Bricks {
    /// One brick: the volfile is protocol/client and the performance
    /// translators over it.
    One(kit::Brick),
    /// Six bricks as a 2 x 3 distributed-replicate volume (the volfile
    /// `xlfs up --sets 2` writes).
    TwoByThree(kit::Cluster),
}

/// Brick processes and a mount of them.
struct Volume {
    bricks: Bricks,
    mount: FuseMount,
}

impl Volume {
    /// The brick directories.
    fn brick_dirs(&self) -> Vec<PathBuf> {
        match &self.bricks {
            Bricks::One(b) => vec![b.dir().to_path_buf()],
            Bricks::TwoByThree(c) => c.bricks.iter().map(|b| b.dir().to_path_buf()).collect(),
        }
    }

    /// Where the bricks hold `rel` as data (a distribute link file is not
    /// data): one path per copy.
    fn copies(&self, rel: &str) -> Vec<PathBuf> {
        let copies: Vec<PathBuf> = self
            .brick_dirs()
            .iter()
            .map(|d| d.join(rel))
            .filter(|p| p.exists() && xlfs_sdk::testing::xattr(p, "trusted.glusterfs.dht.linkto").is_none())
            .collect();
        let want = if matches!(self.bricks, Bricks::One(_)) { 1 } else { 3 };
        assert_eq!(copies.len(), want, "{rel}: copies on the bricks");
        copies
    }

    /// What the bricks hold for `rel`: its bytes on every brick that has
    /// it as data (a distribute link file is not data), all alike.
    fn stored(&self, rel: &str) -> Vec<u8> {
        let copies: Vec<Vec<u8>> = self
            .copies(rel)
            .iter()
            .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .collect();
        assert!(copies.windows(2).all(|w| w[0] == w[1]), "{rel}: the copies differ");
        copies.into_iter().next().unwrap_or_default()
    }
}

fn volume(opts: &str) -> Volume {
    let brick = kit::Brick::start();
    let mount = FuseMount::start(&kit::client_volfile(&brick, &[]), opts);
    Volume { bricks: Bricks::One(brick), mount }
}

/// A 2 x 3 volume: what runs on one brick runs on distribute over
/// replicate as well.
fn volume_two_by_three(opts: &str) -> Volume {
    let c = kit::Cluster::start(6);
    let bricks: Vec<(u16, String)> = c.bricks.iter().map(|b| (b.port(), b.subvolume())).collect();
    let text = xlfs_runtime::cli::distributed_volfile("d23", &bricks, 3, &[], xlfs_runtime::cli::DEFAULT_PERF);
    let mount = FuseMount::start(&text, opts);
    Volume { bricks: Bricks::TwoByThree(c), mount }
}

#[test]
fn posix_workload_with_ordinary_tools() {
    posix_workload(volume(""));
}

#[test]
fn posix_workload_on_two_by_three() {
    posix_workload(volume_two_by_three(""));
}

fn posix_workload(v: Volume) {
    let local = tempfile::tempdir().expect("local dir");
    sh(
        v.mount.path(),
        &[("L", local.path())],
        r#"
fail() { echo "FAIL: $*" >&2; exit 1; }
src=$L/src
mkdir -p $src/a/b $src/empty
printf 'hello\n' > $src/a/hello
head -c 3000017 /dev/urandom > $src/a/b/big
: > $src/zero
ln -s hello $src/a/link
ln $src/a/hello $src/a/hard
chmod 600 $src/a/b/big; chmod 751 $src/a/b
setfattr -n user.color -v blue $src/a/hello
touch -h -d '2001-02-03 04:05:06' $src/a/hello $src/a/link

# cp -a onto the mount keeps contents, modes, links, times, xattrs.
cp -a $src copy
diff -r $src copy
[ "$(stat -c '%a %s %h %Y' copy/a/hello)" = "$(stat -c '%a %s %h %Y' $src/a/hello)" ] || fail "cp -a attributes"
[ "$(stat -c %a copy/a/b)" = 751 ] || fail "dir mode"
[ "$(stat -c %a copy/a/b/big)" = 600 ] || fail "file mode"
[ "$(readlink copy/a/link)" = hello ] || fail symlink
[ "$(stat -c %i copy/a/hello)" = "$(stat -c %i copy/a/hard)" ] || fail "hard link kept"
[ "$(getfattr --only-values -n user.color copy/a/hello)" = blue ] || fail "xattr copied"
[ -d copy/empty ] && [ -f copy/zero ] && [ ! -s copy/zero ] || fail "empty dir and file"

# tar c from the mount, x elsewhere; tar x onto the mount.
tar -C . -cf $L/t.tar copy
mkdir $L/x && tar -C $L/x -xf $L/t.tar && diff -r $src $L/x/copy
mkdir untar && tar -C untar -xf $L/t.tar && diff -r $src untar/copy
[ "$(stat -c %Y untar/copy/a/hello)" = "$(stat -c %Y $src/a/hello)" ] || fail "tar keeps mtime"

# A directory larger than one readdir reply.
mkdir many
for i in $(seq 1 1500); do : > many/file-with-a-longish-name-$i; done
[ "$(ls many | wc -l)" = 1500 ] || fail "ls sees every entry"
[ "$(ls -f many | wc -l)" = 1502 ] || fail "with . and .."
[ "$(find many -type f | wc -l)" = 1500 ] || fail "find sees every entry"
ls -l many > /dev/null
rm -rf many; [ ! -e many ] || fail "rm -rf"

# mv: rename in a directory, across directories, over an existing file.
mv copy/a/hello copy/a/hello2
[ ! -e copy/a/hello ] && [ "$(cat copy/a/hello2)" = hello ] || fail "rename"
mv copy/a/b untar/moved
cmp untar/moved/big $src/a/b/big
mv untar/moved copy/a/b
echo new > copy/newfile
mv copy/newfile copy/a/hard
[ "$(cat copy/a/hard)" = new ] && [ ! -e copy/newfile ] || fail "rename over a file"
[ "$(stat -c %h copy/a/hello2)" = 1 ] || fail "nlink after its other name was replaced"

# ln and ln -s.
ln copy/a/hello2 copy/h3
[ "$(stat -c %h copy/h3)" = 2 ] && [ "$(stat -c %i copy/h3)" = "$(stat -c %i copy/a/hello2)" ] || fail "ln"
ln -s ../hello2 copy/a/b/sl
[ "$(cat copy/a/b/sl)" = hello ] || fail "ln -s"

# chmod, chown (also of a symlink itself), truncate.
chmod 604 copy/h3
[ "$(stat -c %a copy/a/hello2)" = 604 ] || fail chmod
chown 1234:2345 copy/h3
[ "$(stat -c %u:%g copy/a/hello2)" = 1234:2345 ] || fail chown
chown -h 42:43 copy/a/link
[ "$(stat -c %u:%g copy/a/link)" = 42:43 ] && [ "$(stat -c %u copy/h3)" = 1234 ] || fail "chown -h"
truncate -s 1M copy/grown
[ "$(stat -c %s copy/grown)" = 1048576 ] && [ -z "$(tr -d '\0' < copy/grown)" ] || fail "truncate up"
truncate -s 10 copy/a/b/big
[ "$(stat -c %s copy/a/b/big)" = 10 ] || fail "truncate down"
cmp <(head -c 10 $src/a/b/big) copy/a/b/big

# xattrs: set, get, list, remove; the bricks' own stay hidden.
setfattr -n user.k -v v1 copy/h3
setfattr -n user.k2 -v 0x00ff copy/h3
[ "$(getfattr --only-values -n user.k copy/h3)" = v1 ] || fail getfattr
getfattr -d copy/h3 | grep -q 'user.k2=0sAP8=' || fail "binary xattr"
setfattr -x user.k copy/h3
if getfattr -n user.k copy/h3 2>/dev/null; then fail "removed xattr still there"; fi
if getfattr -d -m - copy/h3 | grep -q gfid; then fail "trusted.gfid shown"; fi

# flock: exclusive conflicts between two opens, shared ones do not.
: > copy/lockf
if flock -x copy/lockf -c 'flock -n -x copy/lockf true'; then fail "second exclusive flock granted"; fi
flock -n -x copy/lockf true || fail "flock after release"
# The kernel does not wait for the release that drops a flock: the next
# holder's flock must still find it gone (it raced the release on 2 x 3).
for i in $(seq 1 40); do
  flock -x copy/lockf -c "echo $i >> copy/lockf"
  flock -n -x copy/lockf true || fail "flock $i right after the last holder closed"
done
flock -s copy/lockf -c 'flock -n -s copy/lockf true' || fail "shared flocks"

# mkfifo, mknod, statfs, du.
mkfifo copy/fifo && [ -p copy/fifo ] || fail mkfifo
df -P . | tail -1 | awk '{ exit !($2 > 0) }' || fail "statfs"
du -s copy > /dev/null

rm -rf copy untar
[ -z "$(ls -A)" ] || fail "empty at the end: $(ls -A)"
"#,
    );
    // Everything happened on the bricks, and nothing is left there.
    for dir in v.brick_dirs() {
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("brick")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|n| n != ".glusterfs")
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", dir.display());
    }
}

#[test]
fn random_read_write_truncate_matches_a_model() {
    random_read_write_truncate(volume(""));
}

#[test]
fn random_read_write_truncate_on_two_by_three() {
    random_read_write_truncate(volume_two_by_three(""));
}

fn random_read_write_truncate(v: Volume) {
    const FILES: usize = 4;
    const OPS: usize = 20_000;
    const MAX_SIZE: u64 = 2 << 20;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let paths: Vec<PathBuf> = (0..FILES).map(|i| v.mount.path().join(format!("f{i}"))).collect();
    let open = |p: &Path| {
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).expect("open")
    };
    let mut files: Vec<std::fs::File> = paths.iter().map(|p| open(p)).collect();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); FILES];
    let mut counts = [0usize; 7];
    for op in 0..OPS {
        let i = rng.below(FILES as u64) as usize;
        let (f, m) = (&mut files[i], &mut model[i]);
        match rng.below(100) {
            // Write somewhere: inside, across the end, or past it (a hole).
            0..=39 => {
                let max = if rng.below(10) == 0 { 256 << 10 } else { 8 << 10 };
                let len = 1 + rng.below(max) as usize;
                let off = rng.below((m.len() as u64 + (16 << 10)).min(MAX_SIZE));
                let byte = (op % 251) as u8;
                let data: Vec<u8> = (0..len).map(|k| byte.wrapping_add(k as u8)).collect();
                f.write_all_at(&data, off).expect("write");
                let end = off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
                counts[0] += 1;
            }
            // Read a range and compare.
            40..=74 => {
                let off = rng.below(m.len() as u64 + 4096);
                let len = 1 + rng.below(64 << 10) as usize;
                let mut buf = vec![0u8; len];
                let mut got = 0;
                while got < len {
                    let n = f.read_at(&mut buf[got..], off + got as u64).expect("read");
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                let start = (off as usize).min(m.len());
                let end = (off as usize + len).min(m.len());
                assert_eq!(got, end - start, "op {op}: read length of f{i} at {off}+{len}");
                assert!(buf[..got] == m[start..end], "op {op}: data of f{i} at {off}+{len} differs from the model");
                counts[1] += 1;
            }
            // Truncate up or down.
            75..=84 => {
                let size = rng.below(MAX_SIZE / 2);
                f.set_len(size).expect("truncate");
                m.resize(size as usize, 0);
                counts[2] += 1;
            }
            // Size check by fstat and by path.
            85..=91 => {
                assert_eq!(f.metadata().expect("fstat").len(), m.len() as u64, "op {op}: fstat size of f{i}");
                assert_eq!(
                    std::fs::metadata(&paths[i]).expect("stat").len(),
                    m.len() as u64,
                    "op {op}: stat size of f{i}"
                );
                counts[3] += 1;
            }
            // fsync / fdatasync.
            92..=94 => {
                if rng.below(2) == 0 { f.sync_all() } else { f.sync_data() }.expect("fsync");
                counts[4] += 1;
            }
            // Close and reopen (the page cache kept across opens must agree).
            95..=97 => {
                *f = open(&paths[i]);
                counts[5] += 1;
            }
            // Whole-file check through a second, fresh descriptor.
            _ => {
                let got = std::fs::read(&paths[i]).expect("read whole");
                assert!(got == *m, "op {op}: whole content of f{i} differs ({} vs {} bytes)", got.len(), m.len());
                counts[6] += 1;
            }
        }
    }
    assert!(counts.iter().all(|&c| c > 0), "every kind of op ran: {counts:?}");
    // Synced before the bricks are read: a close returns before its writes
    // reach the bricks (flush-behind).
    for f in &files {
        f.sync_all().expect("fsync");
    }
    drop(files);
    // The bricks hold exactly the model.
    for (i, m) in model.iter().enumerate() {
        assert!(v.stored(&format!("f{i}")) == *m, "brick copy of f{i} differs");
    }
}

#[test]
fn git_repository_with_commits() {
    git_repository(volume(""));
}

#[test]
fn git_repository_on_two_by_three() {
    git_repository(volume_two_by_three(""));
}

fn git_repository(v: Volume) {
    let out = sh(
        v.mount.path(),
        &[],
        r#"
export GIT_CONFIG_NOSYSTEM=1 HOME=$PWD/home
mkdir home repo && cd repo
git init -q -b main
git config user.email t@example.com && git config user.name tester
for n in 1 2 3 4; do
    mkdir -p dir$n
    seq 1 $((n * 1000)) > dir$n/data
    echo "commit $n" > README
    git add -A && git commit -q -m "commit $n"
done
git mv dir1 renamed && git commit -q -m rename
git rm -q -r dir2 && git commit -q -m remove
git gc -q
git fsck --full --strict
[ -z "$(git status --porcelain)" ]
git log --oneline | wc -l
git clone -q . ../clone && diff -r --exclude=.git . ../clone
"#,
    );
    assert_eq!(out.trim(), "6", "six commits");
}

/// `fcntl` on a raw fd.
fn fcntl_lock(f: &std::fs::File, cmd: libc::c_int, ty: libc::c_int, start: i64, len: i64) -> Result<libc::flock, i32> {
    // SAFETY: a zeroed flock is valid; the fd is open.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: fcntl with a valid fd and a pointer to our flock.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if rc < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { Ok(fl) }
}

fn flock(f: &std::fs::File, op: libc::c_int) -> Result<(), i32> {
    // SAFETY: flock on an open fd.
    let rc = unsafe { libc::flock(f.as_raw_fd(), op) };
    if rc < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { Ok(()) }
}

extern "C" fn on_sigusr1(_: libc::c_int) {}

#[test]
fn locks_conflict_wait_and_interrupt() {
    locks_conflict(volume(""));
}

#[test]
fn locks_conflict_wait_and_interrupt_on_two_by_three() {
    locks_conflict(volume_two_by_three(""));
}

fn locks_conflict(v: Volume) {
    let path = v.mount.path().join("locked");
    std::fs::write(&path, b"0123456789").expect("create");
    let open = || std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open");
    let (a, b) = (open(), open());

    // OFD locks: owned by the open file, so two opens conflict.
    fcntl_lock(&a, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 5).expect("a locks 0-4");
    assert_eq!(fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 2, 2).err(), Some(libc::EAGAIN), "b conflicts");
    fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 5, 5).expect("b locks 5-9, no overlap");
    let seen = fcntl_lock(&b, libc::F_OFD_GETLK, libc::F_RDLCK, 0, 0).expect("getlk");
    assert_eq!((seen.l_type as i32, seen.l_start, seen.l_len), (libc::F_WRLCK, 0, 5), "GETLK reports a's lock");

    // A waiting SETLKW is granted when the holder unlocks.
    let b = Arc::new(b);
    let b2 = b.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).expect("send");
        fcntl_lock(&b2, libc::F_OFD_SETLKW, libc::F_WRLCK, 0, 5).map(drop)
    });
    wait_in_syscall(rx.recv().expect("tid"), libc::SYS_fcntl);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiter.is_finished(), "b waits for a");
    fcntl_lock(&a, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 5).expect("a unlocks");
    waiter.join().expect("joins").expect("b granted after a unlocked");
    fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0).expect("b unlocks all");

    // A signal interrupts a waiting SETLKW with EINTR (handler without
    // SA_RESTART), and the lock is not taken.
    // SAFETY: installing a handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    fcntl_lock(&a, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0).expect("a locks the whole file");
    let b2 = b.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: pthread_self and gettid have no preconditions.
        tx.send(unsafe { (libc::pthread_self(), libc::gettid()) }).expect("send");
        fcntl_lock(&b2, libc::F_OFD_SETLKW, libc::F_WRLCK, 0, 0).map(drop)
    });
    let (thread, tid) = rx.recv().expect("thread id");
    // The signal must find the thread inside fcntl, not before it.
    wait_in_syscall(tid, libc::SYS_fcntl);
    assert!(!waiter.is_finished(), "b waits");
    // SAFETY: the thread is alive (it has not finished).
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    let t0 = Instant::now();
    assert_eq!(waiter.join().expect("joins"), Err(libc::EINTR), "interrupted");
    assert!(t0.elapsed() < Duration::from_secs(20), "interrupted promptly");
    assert_eq!(fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 1).err(), Some(libc::EAGAIN), "a still holds it");
    // The last close releases a's lock: FUSE sends RELEASE just after
    // close(2) returns, so the release may take a moment to arrive. b's
    // interrupted wait left the bricks' queues: a third open file (another
    // owner) gets the lock, which b's wait, had it been granted behind its
    // back, would hold while b stays open.
    let e = open();
    drop(a);
    eventually("a's close releases its lock to a new owner, not to b's cancelled wait", HANG_GUARD, || {
        fcntl_lock(&e, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0).map(drop).map_err(|e| format!("errno {e}"))
    });
    drop(e);
    eventually("e's close releases its lock", HANG_GUARD, || {
        fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0).map(drop).map_err(|e| format!("errno {e}"))
    });

    // flock and fcntl locks live apart, as on a local file system: c's
    // flock is granted while b holds an OFD write lock on the whole file
    // (flock arrives as a whole-file lock owned by the open file, just like
    // an OFD lock; only FUSE's flock flag tells them apart).
    let (c, d) = (open(), open());
    flock(&c, libc::LOCK_EX).expect("c flocks while b holds an OFD lock");
    assert_eq!(flock(&d, libc::LOCK_EX | libc::LOCK_NB), Err(libc::EWOULDBLOCK), "flocks conflict");
    assert_eq!(fcntl_lock(&d, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0).err(), Some(libc::EAGAIN), "OFD locks conflict");
    fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0).expect("b unlocks");
    fcntl_lock(&d, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0).expect("d's OFD lock beside c's flock");
    let posix = fcntl_lock(&c, libc::F_SETLK, libc::F_RDLCK, 0, 10);
    assert!(matches!(posix, Err(libc::EAGAIN | libc::EACCES)), "a POSIX lock meets d's OFD lock: {posix:?}");
    // A close of another fd (a flush) drops this process's POSIX locks,
    // never a flock.
    drop(open());
    assert_eq!(flock(&d, libc::LOCK_EX | libc::LOCK_NB), Err(libc::EWOULDBLOCK), "c's flock outlives a flush");
    // flock: released when the open file is closed; d's OFD lock stays.
    drop(c);
    eventually("c's close releases its flock", HANG_GUARD, || {
        flock(&d, libc::LOCK_EX | libc::LOCK_NB).map(drop).map_err(|e| format!("errno {e}"))
    });
    let probe = fcntl_lock(&b, libc::F_OFD_GETLK, libc::F_WRLCK, 0, 0).expect("getlk");
    assert_eq!(probe.l_type, libc::F_WRLCK as libc::c_short, "d still holds its OFD lock");

    // Between processes: a child process holds an exclusive flock that
    // this process cannot take until the child is gone.
    drop(d);
    let mut holder = Command::new("flock")
        .arg("-x")
        .arg(v.mount.path().join("locked"))
        .arg("-c")
        .arg("echo held; exec sleep 30")
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("flock holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout")).read_line(&mut line).expect("held line");
    let e = open();
    assert_eq!(flock(&e, libc::LOCK_EX | libc::LOCK_NB), Err(libc::EWOULDBLOCK), "the other process holds it");
    // SAFETY: killing the holder's own process group (flock and its sleep).
    unsafe { libc::kill(-(holder.id() as i32), libc::SIGKILL) };
    holder.wait().expect("reap");
    eventually("a dead holder's flock is released", HANG_GUARD, || {
        flock(&e, libc::LOCK_EX | libc::LOCK_NB).map(drop).map_err(|e| format!("errno {e}"))
    });
}

/// How long [`eventually`] waits here: a hang guard, not a timing
/// assertion.
const HANG_GUARD: Duration = Duration::from_secs(10);

/// Waits until thread `tid` of this process sits in system call `nr`
/// (`/proc/self/task/TID/syscall` names it while the thread is blocked).
fn wait_in_syscall(tid: libc::pid_t, nr: libc::c_long) {
    eventually("the thread is blocked in the system call", HANG_GUARD, || {
        let now = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<libc::c_long>().ok()));
        if now == Some(nr) { Ok(()) } else { Err(format!("in {now:?}, not {nr}")) }
    });
}

#[test]
fn sigint_and_sigterm_unmount_cleanly() {
    let brick = kit::Brick::start();
    let volfile = kit::client_volfile(&brick, &[]);

    // SIGINT, idle.
    let mut m = FuseMount::start(&volfile, "");
    std::fs::write(m.path().join("a"), b"x").expect("write");
    let mp = m.path().to_path_buf();
    let st = m.stop_with(libc::SIGINT);
    assert!(st.success(), "SIGINT exits 0: {st}\n{}", m.log());
    assert!(!is_mounted(&mp), "unmounted");

    // SIGTERM while a file is open: waits, then detaches lazily, exits 0.
    let mut m = FuseMount::start(&volfile, "");
    let f = std::fs::File::open(m.path().join("a")).expect("open");
    let mp = m.path().to_path_buf();
    let st = m.stop_with(libc::SIGTERM);
    assert!(st.success(), "SIGTERM exits 0: {st}\n{}", m.log());
    assert!(!is_mounted(&mp), "detached");
    let mut buf = [0u8; 1];
    assert!(f.read_at(&mut buf, 0).is_err(), "the connection is gone for a file left open");
    drop(f);

    // Unmounted from outside: the process notices and exits 0.
    let mut m = FuseMount::start(&volfile, "");
    let out = Command::new(XLFS).arg("umount").arg(m.path()).output().expect("xlfs umount");
    assert!(out.status.success(), "xlfs umount: {}", String::from_utf8_lossy(&out.stderr));
    let mut child = m.child.take().expect("child");
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    let st = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "exits after an outside unmount");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{st}");
    assert_eq!(std::fs::read(brick.dir().join("a")).expect("on the brick"), b"x");
}

#[test]
fn daemon_through_the_mount_helper() {
    let brick = kit::Brick::start();
    let dir = tempfile::tempdir().expect("dir");
    let vol = dir.path().join("v.vol");
    std::fs::write(&vol, kit::client_volfile(&brick, &[])).expect("volfile");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mnt");
    let mnt = std::fs::canonicalize(&mnt).expect("canonical");
    let log = dir.path().join("daemon.log");
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount.xlfs");
    let out = Command::new("sh")
        .arg(&helper)
        .arg(&vol)
        .arg(&mnt)
        .arg("-o")
        .arg(format!("rw,_netdev,noauto,x-systemd.automount,entry-timeout=2,log-file={}", log.display()))
        .env("XLFS", XLFS)
        .output()
        .expect("mount.xlfs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "mount.xlfs: {}\n{}", String::from_utf8_lossy(&out.stderr), stdout);
    // The helper returned: the daemon serves the mount on its own.
    let pid: u32 = stdout
        .rsplit_once("(pid ")
        .and_then(|(_, p)| p.trim().trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("pid in {stdout:?}"));
    struct Daemon(u32, PathBuf);
    impl Drop for Daemon {
        fn drop(&mut self) {
            if Path::new(&format!("/proc/{}", self.0)).exists() {
                send_signal(self.0, libc::SIGTERM);
                std::thread::sleep(Duration::from_secs(1));
            }
            if is_mounted(&self.1) {
                let _ = xlfs_runtime::fuse::lazy_unmount(&self.1);
            }
        }
    }
    let guard = Daemon(pid, mnt.clone());
    assert!(is_mounted(&mnt));
    std::fs::write(mnt.join("via-daemon"), b"d").expect("write");
    assert_eq!(std::fs::read(brick.dir().join("via-daemon")).expect("brick"), b"d");
    assert!(std::fs::read_to_string(&log).expect("daemon log").contains("mounted"), "logs to log-file");
    // Its own session: not in the test's process group.
    // SAFETY: getpgid on a live pid.
    assert_ne!(unsafe { libc::getpgid(pid as i32) }, unsafe { libc::getpgid(0) });
    let st = Command::new(XLFS).arg("umount").arg(&mnt).status().expect("umount");
    assert!(st.success());
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(Instant::now() < deadline, "the daemon exits after the unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(guard);
    // A bad option fails the helper with the reason, mounting nothing.
    let out = Command::new("sh")
        .arg(&helper)
        .arg(&vol)
        .arg(&mnt)
        .arg("-o")
        .arg("bogus=1")
        .env("XLFS", XLFS)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown mount option 'bogus'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mnt));
}

#[test]
fn mount_errors_are_reported() {
    let dir = tempfile::tempdir().expect("dir");
    let vol = dir.path().join("v.vol");
    std::fs::write(
        &vol,
        format!("volume p\n type storage/posix\n option directory {}\nend-volume\n", dir.path().display()),
    )
    .expect("volfile");
    let missing = dir.path().join("no-such-dir");
    let out = Command::new(XLFS).args(["mount", "-f", "--volfile"]).arg(&vol).arg(&missing).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("mount point {}", missing.display())), "{err}");
    // A brick nobody serves: the graph does not come up in time.
    let vol2 = dir.path().join("c.vol");
    std::fs::write(&vol2, kit::client_volfile_to(1, "/nowhere", &[])).expect("volfile");
    let out = Command::new(XLFS)
        .args(["mount", "-f", "--up-timeout", "1", "--volfile"])
        .arg(&vol2)
        .arg(dir.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not report ChildUp"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A mount's worker threads follow `TOKIO_WORKER_THREADS` (what
/// GlusterFS calls `client.event-threads`) and `xlfs status` shows them;
/// without it there is one per core; a bad value is refused, named.
#[test]
fn event_threads_follow_the_mount_option_and_the_environment() {
    let brick = kit::Brick::start();
    let volfile = kit::client_volfile(&brick, &[]);
    let threads = |m: &FuseMount| {
        let out = kit::run_xlfs(&["status".as_ref(), m.path().as_os_str()]);
        assert!(out.status.success(), "xlfs status: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let n = text.lines().find_map(|l| l.strip_prefix("event threads: ")).map(str::to_string);
        n.unwrap_or_else(|| panic!("no event threads line:\n{text}"))
    };
    let one = FuseMount::start_env(&volfile, "", &[], &[("TOKIO_WORKER_THREADS", "1")]);
    assert_eq!(threads(&one), "1");
    std::fs::write(one.path().join("f"), b"one worker").expect("write through one worker");
    drop(one);
    let three = FuseMount::start_env(&volfile, "", &[], &[("TOKIO_WORKER_THREADS", "3")]);
    assert_eq!(threads(&three), "3");
    assert_eq!(std::fs::read(three.path().join("f")).expect("read"), b"one worker");
    drop(three);
    // The mount option wins over the variable.
    let opt = FuseMount::start_env(&volfile, "event-threads=2", &[], &[("TOKIO_WORKER_THREADS", "3")]);
    assert_eq!(threads(&opt), "2");
    assert_eq!(std::fs::read(opt.path().join("f")).expect("read"), b"one worker");
    drop(opt);
    // One per core, unless the tests themselves run with the variable set.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let default = FuseMount::start_env(&volfile, "", &[], &[]);
    assert_eq!(threads(&default), std::env::var("TOKIO_WORKER_THREADS").unwrap_or(cores), "one per core");
    drop(default);
    let dir = tempfile::tempdir().expect("dir");
    let vol = dir.path().join("c.vol");
    std::fs::write(&vol, &volfile).expect("volfile");
    for bad in ["0", "many", "100000"] {
        let out = Command::new(XLFS)
            .args(["mount", "-f", "--volfile"])
            .arg(&vol)
            .arg(dir.path())
            .env("TOKIO_WORKER_THREADS", bad)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("TOKIO_WORKER_THREADS=\"{bad}\"")), "{bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!is_mounted(dir.path()));
}

fn getxattr_errno(p: &Path, name: &str) -> i32 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    let mut buf = [0u8; 256];
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 { std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { 0 }
}

/// As on a GlusterFS mount, ACLs and SELinux labels are off unless the
/// mount asks for them (`acl`, `selinux`): EOPNOTSUPP, which `ls -l`
/// remembers for the whole mount instead of asking for every file.
#[test]
fn acl_and_selinux_xattrs_follow_the_mount_options() {
    xattrs_follow_the_mount_options(volume);
}

#[test]
fn acl_and_selinux_xattrs_follow_the_mount_options_on_two_by_three() {
    xattrs_follow_the_mount_options(volume_two_by_three);
}

fn xattrs_follow_the_mount_options(volume: fn(&str) -> Volume) {
    let v = volume("");
    let f = v.mount.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    for name in ["system.posix_acl_access", "system.posix_acl_default", "security.selinux"] {
        assert_eq!(getxattr_errno(&f, name), libc::EOPNOTSUPP, "{name} without the option");
    }
    assert_eq!(getxattr_errno(&f, "user.none"), libc::ENODATA, "other xattrs are supported");
    drop(v);
    let v = volume("acl,selinux");
    let f = v.mount.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    for name in ["system.posix_acl_access", "security.selinux"] {
        assert_eq!(getxattr_errno(&f, name), libc::ENODATA, "{name} with the option: asked, absent");
    }
}

/// How many READ fops reached the top of the mount's graph since the last
/// `xlfs profile --reset` (from `xlfs profile`'s "READ: N calls" line).
fn reads_at_top(mount: &Path) -> u64 {
    let out = kit::run_xlfs(&["profile", mount.to_str().expect("utf-8")]);
    assert!(out.status.success(), "xlfs profile: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix("READ: ")?.split(' ').next()?.parse().ok()).unwrap_or(0)
}

/// A file rewritten in place through the mount keeps its cached pages. The
/// kernel is not asked for FUSE_AUTO_INVAL_DATA, which drops them when the
/// next GETATTR shows the mtime the mount's own write moved; the bridge
/// drops them only for a change made elsewhere. So rereading the file after
/// each small overwrite and stat sends no READ (a database's pattern).
#[test]
fn own_writes_keep_the_page_cache() {
    own_writes_keep_pages(volume(""));
}

#[test]
fn own_writes_keep_the_page_cache_on_two_by_three() {
    own_writes_keep_pages(volume_two_by_three(""));
}

fn own_writes_keep_pages(v: Volume) {
    let p = v.mount.path().join("db");
    let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).expect("create");
    let mut model = vec![1u8; 16 * 4096];
    f.write_all_at(&model, 0).expect("write");
    f.sync_all().expect("fsync");
    let mut buf = vec![0u8; model.len()];
    f.read_exact_at(&mut buf, 0).expect("read");
    let out = kit::run_xlfs(&["profile", "--reset", v.mount.path().to_str().expect("utf-8")]);
    assert!(out.status.success(), "profile --reset");
    for i in 0..20u8 {
        let at = (i as usize % 16) * 4096;
        model[at..at + 4096].fill(i + 2);
        f.write_all_at(&model[at..at + 4096], at as u64).expect("overwrite");
        assert_eq!(std::fs::metadata(&p).expect("stat").len(), model.len() as u64);
        f.read_exact_at(&mut buf, 0).expect("reread");
        assert!(buf == model, "content after overwrite {i}");
    }
    assert_eq!(reads_at_top(v.mount.path()), 0, "rereads after the mount's own writes went to the bricks");
}

/// With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves set-user-ID and
/// set-group-ID to the filesystem: a write or truncate by a user other than
/// root takes them away (storage/posix does it for the caller), a write by
/// root keeps them, and set-group-ID without group execute stays.
#[test]
fn writes_by_other_users_drop_setuid_and_setgid() {
    setuid_dropped(volume(""));
}

#[test]
fn writes_by_other_users_drop_setuid_and_setgid_on_two_by_three() {
    setuid_dropped(volume_two_by_three(""));
}

fn setuid_dropped(v: Volume) {
    let p = v.mount.path().join("s");
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").mode() & 0o7777;
    let set = |m: u32| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).expect("chmod");
    let as_nobody = |script: &str| {
        let st = Command::new("sh").arg("-c").arg(script).arg("sh").arg(&p).uid(65534).gid(65534).status();
        assert!(st.expect("sh").success(), "as nobody: {script}");
    };
    std::fs::write(&p, b"x").expect("create");
    let backend = v.copies("s")[0].clone();
    set(0o6777);
    std::fs::OpenOptions::new().append(true).open(&p).expect("open").write_all(b"r").expect("root writes");
    assert_eq!(mode(&backend), 0o6777, "root's write keeps both bits");
    as_nobody(r#"printf y >> "$1""#);
    assert_eq!(mode(&backend), 0o0777, "another user's write drops both (group-executable)");
    assert_eq!(mode(&p), 0o0777, "as the mount shows it");
    assert_eq!(std::fs::read(&p).expect("read"), b"xry");
    set(0o6766);
    as_nobody(r#"truncate -s 1 "$1""#);
    assert_eq!(mode(&backend), 0o2766, "truncate drops set-user-ID; set-group-ID without group execute stays");
    set(0o4766);
    as_nobody(r#": > "$1""#);
    assert_eq!(mode(&backend), 0o0766, "open with O_TRUNC drops set-user-ID");
}

#[test]
fn an_unlinked_open_file_lives_until_its_last_close() {
    unlinked_open_file(volume(""));
}

#[test]
fn an_unlinked_open_file_lives_until_its_last_close_on_two_by_three() {
    unlinked_open_file(volume_two_by_three(""));
}

/// POSIX: a file unlinked while open lives until its last close. Reads,
/// writes and fstat through fds opened before the unlink work (one opened
/// read-only, which open-behind acknowledges without opening it below),
/// fstat reports no link, and stat through /proc/self/fd finds it too; all
/// of it again after a graph switch, and the bricks drop the file at the
/// last close.
fn unlinked_open_file(v: Volume) {
    use std::io::{Read, Seek, Write};
    let path = v.mount.path().join("tmpfile");
    std::fs::write(&path, b"before unlink\n").expect("create");
    let mut r = std::fs::File::open(&path).expect("open read-only");
    let mut w = std::fs::OpenOptions::new().append(true).open(&path).expect("open for append");
    std::fs::remove_file(&path).expect("unlink");
    assert!(!path.exists(), "the name is gone");
    let m = r.metadata().expect("fstat after unlink");
    assert_eq!((m.nlink(), m.len()), (0, 14), "no link left, the data stays");
    let mut got = String::new();
    r.read_to_string(&mut got).expect("read after unlink");
    assert_eq!(got, "before unlink\n");
    w.write_all(b"after unlink\n").expect("write after unlink");
    w.sync_all().expect("fsync after unlink");
    r.rewind().expect("rewind");
    got.clear();
    r.read_to_string(&mut got).expect("read again");
    assert_eq!(got, "before unlink\nafter unlink\n");
    let by_proc = std::fs::metadata(format!("/proc/self/fd/{}", r.as_raw_fd())).expect("stat through /proc");
    assert_eq!(by_proc.len(), 27);

    // A graph switch reopens the fds on the new graph by gfid: the bricks
    // still find the nameless file, and the fds go on working.
    switch_graph(&v.mount);
    let m = r.metadata().expect("fstat after a graph switch");
    assert_eq!((m.nlink(), m.len()), (0, 27), "after a graph switch");
    w.write_all(b"after switch\n").expect("write after a graph switch");
    w.sync_all().expect("fsync after a graph switch");
    r.rewind().expect("rewind");
    got.clear();
    r.read_to_string(&mut got).expect("read after a graph switch");
    assert_eq!(got, "before unlink\nafter unlink\nafter switch\n");
    drop((r, w));
    // The last close lets the bricks drop the file: nothing stays behind
    // in `.glusterfs/unlink`.
    for d in v.brick_dirs() {
        let parked = d.join(".glusterfs/unlink");
        eventually("the bricks drop the unlinked file after its last close", Duration::from_secs(10), || {
            let left: Vec<_> = std::fs::read_dir(&parked).map_err(|e| format!("{}: {e}", parked.display()))?.collect();
            if left.is_empty() { Ok(()) } else { Err(format!("{} holds {left:?}", parked.display())) }
        });
    }
}

#[test]
fn a_directorys_files_share_one_handle_directory_on_the_bricks() {
    handles_of_a_directory(volume(""));
}

#[test]
fn a_directorys_files_share_one_handle_directory_on_two_by_three() {
    handles_of_a_directory(volume_two_by_three(""));
}

/// The mount gives the inodes it makes in a directory gfids with the same
/// first two bytes, so each brick keeps their handles in one
/// `.glusterfs/xx/yy` (an `rm -r` of a cold directory reads one handle
/// directory, not one per file); another directory's go elsewhere.
fn handles_of_a_directory(v: Volume) {
    let m = v.mount.path();
    let mut buckets = Vec::new();
    for dir in ["a", "b"] {
        std::fs::create_dir(m.join(dir)).expect("mkdir");
        let names: Vec<String> = (0..24).map(|i| format!("{dir}/f{i}")).collect();
        for n in &names {
            std::fs::write(m.join(n), n).expect("create");
        }
        std::fs::create_dir(m.join(dir).join("sub")).expect("mkdir sub");
        // Made on the bricks once the directory's fsync returns.
        std::fs::File::open(m.join(dir)).and_then(|d| d.sync_all()).expect("fsync the directory");
        let mut seen = std::collections::BTreeSet::new();
        for rel in names.iter().map(String::as_str).chain([&*format!("{dir}/sub")]) {
            let mut copies = 0;
            for brick in v.brick_dirs() {
                let c = brick.join(rel);
                let Some(g) = xlfs_sdk::testing::xattr(&c, "trusted.gfid") else { continue };
                assert_eq!(g.len(), 16, "{}", c.display());
                let bucket = format!("{:02x}/{:02x}", g[0], g[1]);
                let handle = brick
                    .join(".glusterfs")
                    .join(&bucket)
                    .join(xlfs_sdk::Gfid(g[..].try_into().expect("16")).to_string());
                assert!(handle.symlink_metadata().is_ok(), "{}: no handle {}", c.display(), handle.display());
                seen.insert(bucket);
                copies += 1;
            }
            assert!(copies > 0, "{rel} on no brick");
        }
        assert_eq!(seen.len(), 1, "the handles of {dir}'s inodes are in {seen:?}");
        buckets.extend(seen);
    }
    assert_ne!(buckets[0], buckets[1], "two directories, one handle directory");
}

/// Puts another io-stats on top of the mount's graph and waits until the
/// mount runs the new graph (a switch: new connections, fds reopened).
fn switch_graph(m: &FuseMount) {
    let status = kit::daemon::mount_status(m.path());
    let before = kit::daemon::generation(&status);
    let text = std::fs::read_to_string(m.volfile()).expect("read volfile");
    let top =
        text.lines().filter_map(|l| l.trim().strip_prefix("volume ")).next_back().expect("a volume").trim().to_string();
    let tmp = m.dir().join("client.vol.new");
    std::fs::write(
        &tmp,
        format!("{text}\nvolume switch-top-{before}\n    type debug/io-stats\n    subvolumes {top}\nend-volume\n"),
    )
    .expect("write volfile");
    std::fs::rename(&tmp, m.volfile()).expect("replace volfile");
    let out = kit::run_xlfs(&["reload".as_ref(), m.path().as_os_str()]);
    assert!(out.status.success(), "xlfs reload: {}", String::from_utf8_lossy(&out.stderr));
    eventually("the mount switches to the new graph", Duration::from_secs(20), || {
        let now = kit::daemon::generation(&kit::daemon::mount_status(m.path()));
        if now > before { Ok(()) } else { Err(format!("generation {now}")) }
    });
}
