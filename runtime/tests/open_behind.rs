//! performance/open-behind through a real FUSE mount (`xlfs mount`) over
//! features/locks and storage/posix: a close of an fd that open-behind never
//! opened below still drops the process's POSIX locks on the file, as POSIX
//! says any close does.

mod kit;

use std::os::fd::AsRawFd;

use kit::fuse_mount::FuseMount;

fn setlk(fd: i32, cmd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a zeroed flock is valid; the fields set below are the ones used.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: fcntl with a valid fd and a flock that outlives the call.
    if unsafe { libc::fcntl(fd, cmd, &mut fl) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[test]
fn closing_a_never_opened_fd_drops_the_locks_taken_through_another() {
    let dir = tempfile::tempdir().expect("dir");
    let brick = dir.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let vol = format!(
        "volume posix\n type storage/posix\n option directory {}\nend-volume\n\
         volume locks\n type features/locks\n subvolumes posix\nend-volume\n\
         volume ob\n type performance/open-behind\n subvolumes locks\nend-volume\n\
         volume top\n type debug/io-stats\n subvolumes ob\nend-volume\n",
        brick.display()
    );
    let m = FuseMount::start(&vol, "");
    let path = m.path().join("f");
    std::fs::write(&path, b"data").expect("create");
    let locked = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open rw");
    setlk(locked.as_raw_fd(), libc::F_SETLK).expect("process lock");
    let other = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open another description");
    assert_eq!(
        setlk(other.as_raw_fd(), libc::F_OFD_SETLK).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EAGAIN)),
        "the process lock conflicts with an OFD lock"
    );
    // A read-only open is deferred by open-behind; closing it must still
    // drop the process's lock.
    drop(std::fs::File::open(&path).expect("open read-only"));
    setlk(other.as_raw_fd(), libc::F_OFD_SETLK).expect("the close of any fd dropped the process lock");
    drop(locked);
}
