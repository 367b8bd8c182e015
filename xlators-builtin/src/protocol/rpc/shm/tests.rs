use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::*;

fn region(size: usize) -> Arc<Region> {
    Region::create("xlfs-test", size).expect("memfd region")
}

fn dup(fd: RawFd) -> OwnedFd {
    // SAFETY: dup of a live fd; the new one is owned by the result.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    assert!(n >= 0, "dup: {}", io::Error::last_os_error());
    // SAFETY: a fresh fd nothing else owns.
    unsafe { OwnedFd::from_raw_fd(n) }
}

#[test]
fn chunks_are_page_aligned_disjoint_and_come_back_when_dropped() {
    let r = region(64 * PAGE);
    assert_eq!(r.size(), 64 * PAGE);
    let a = r.alloc(1).expect("one page");
    let b = r.alloc(3 * PAGE).expect("four pages");
    let c = r.alloc(PAGE + 1).expect("two pages");
    for ch in [&a, &b, &c] {
        assert_eq!(ch.offset() % PAGE as u64, 0);
    }
    let span = |ch: &Chunk| ch.offset()..ch.offset() + ch.len().next_power_of_two().max(PAGE) as u64;
    let (sa, sb, sc) = (span(&a), span(&b), span(&c));
    assert!(sa.end <= sb.start || sb.end <= sa.start);
    assert!(sb.end <= sc.start || sc.end <= sb.start);
    assert!(sa.end <= sc.start || sc.end <= sa.start);
    assert_eq!(r.counters().2, 7 * PAGE as u64, "1 + 4 + 2 pages in use");
    drop((a, b, c));
    assert_eq!(r.counters().2, 0);
    // Everything merged back: the whole region is one run again.
    let all = r.alloc(64 * PAGE).expect("whole region after frees");
    assert_eq!(all.offset(), 0);
    assert!(r.alloc(1).is_none(), "a full region refuses");
    assert_eq!(r.counters().1, 1, "the refusal is counted");
}

#[test]
fn a_frozen_chunk_lives_as_long_as_its_bytes() {
    let r = region(4 * PAGE);
    let mut c = r.alloc(10).expect("chunk");
    c.as_mut_slice().copy_from_slice(b"0123456789");
    let b = c.freeze();
    let tail = b.slice(4..);
    drop(b);
    assert_eq!(&tail[..], b"456789");
    assert_eq!(r.locate(&tail), Some((4, 6)));
    assert!(r.alloc(4 * PAGE).is_none(), "still held by the slice");
    drop(tail);
    assert!(r.alloc(4 * PAGE).is_some(), "freed with the last slice");
    assert_eq!(r.locate(b"elsewhere"), None);
}

#[test]
fn a_peer_sees_the_owners_bytes_and_fills_lent_chunks() {
    let r = region(16 * PAGE);
    let ro = Mapping::from_peer(dup(r.raw_fd()), false).expect("read-only mapping");
    let rw = Mapping::from_peer(dup(r.raw_fd()), true).expect("read-write mapping");
    let mut c = r.alloc(5).expect("chunk");
    c.as_mut_slice().copy_from_slice(b"hello");
    let seen = ro.bytes(c.offset(), 5).expect("in range");
    assert_eq!(&seen[..], b"hello");
    rw.write(c.offset() + 1, b"ELL").expect("lent range");
    assert_eq!(&c.freeze()[..], b"hELLo");
    assert!(ro.write(0, b"x").is_err(), "read-only side cannot write");
}

#[test]
fn descriptors_outside_the_region_are_errors_not_faults() {
    let r = region(4 * PAGE);
    let m = Mapping::from_peer(dup(r.raw_fd()), true).expect("mapping");
    let size = m.size();
    assert!(matches!(m.bytes(size, 1), Err(ShmError::OutOfRange { .. })));
    assert!(matches!(m.bytes(u64::MAX, 2), Err(ShmError::OutOfRange { .. })));
    assert!(matches!(m.bytes(1, size), Err(ShmError::OutOfRange { .. })));
    assert!(matches!(m.write(size - 1, b"ab"), Err(ShmError::OutOfRange { .. })));
    assert_eq!(m.bytes(size - 1, 1).expect("last byte").len(), 1);
}

#[test]
fn only_a_memfd_sealed_against_shrinking_is_mapped() {
    let file = tempfile::tempfile().expect("temp file");
    file.set_len(PAGE as u64).expect("size");
    let e = Mapping::from_peer(OwnedFd::from(file), false).err().expect("a plain file is refused");
    assert!(e.to_string().contains("not a memfd"), "{e}");

    // A memfd without the seal: a peer could shrink it under the mapping.
    let name = std::ffi::CString::new("unsealed").expect("name");
    // SAFETY: a valid C string; the fd is owned below.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscall on our fd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) }, 0);
    let e = Mapping::from_peer(fd, false).err().expect("an unsealed memfd is refused");
    assert!(e.to_string().contains("not sealed against shrinking"), "{e}");

    // An empty region is refused too.
    let name = std::ffi::CString::new("empty").expect("name");
    // SAFETY: as above.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscall on our fd.
    assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) }, 0);
    assert!(Mapping::from_peer(fd, false).is_err());
}

#[test]
fn fds_cross_a_unix_socket_with_their_byte() {
    let (a, b) = UnixStream::pair().expect("socket pair");
    let r = region(PAGE);
    send_fds(a.as_raw_fd(), b'S', &[r.raw_fd(), r.raw_fd()]).expect("send");
    let (tag, fds) = recv_fds(b.as_raw_fd(), 2).expect("receive");
    assert_eq!((tag, fds.len()), (b'S', 2));
    let m = Mapping::from_peer(fds.into_iter().next().expect("fd"), false).expect("received memfd maps");
    assert_eq!(m.size(), PAGE as u64);

    send_fds(a.as_raw_fd(), b'P', &[]).expect("send plain");
    let (tag, fds) = recv_fds(b.as_raw_fd(), 2).expect("receive plain");
    assert_eq!((tag, fds.len()), (b'P', 0));

    // More fds than the receiver takes: refused, and none leak into it.
    send_fds(a.as_raw_fd(), b'S', &[r.raw_fd(), r.raw_fd(), r.raw_fd()]).expect("send three");
    assert!(recv_fds(b.as_raw_fd(), 2).is_err());

    assert_eq!(recv_fds(b.as_raw_fd(), 2).err().map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
    drop(a);
    assert_eq!(recv_fds(b.as_raw_fd(), 2).err().map(|e| e.kind()), Some(io::ErrorKind::UnexpectedEof));
}

#[test]
fn payloads_go_to_the_heap_without_a_send_region_or_when_small() {
    // Whether or not another test made the process's send region, a small
    // payload is never put there.
    let small = copy_from(&[7; 100]);
    assert!(current_send_region().is_none_or(|r| r.locate(&small).is_none()));
    let big = concat(&[Bytes::from(vec![1u8; SHARED_MIN]), Bytes::from_static(b"tail")]);
    assert_eq!(big.len(), SHARED_MIN + 4);
    assert_eq!(&big[SHARED_MIN..], b"tail");
    assert!(big[..SHARED_MIN].iter().all(|&b| b == 1));
}

#[test]
fn buried_memory_is_not_reused() {
    let r = region(4 * PAGE);
    let c = r.alloc(4 * PAGE).expect("whole region");
    let before = buried();
    bury(c.freeze());
    assert!(buried() > before);
    assert!(r.alloc(1).is_none(), "a buried payload's pages stay taken for the quarantine");
}
