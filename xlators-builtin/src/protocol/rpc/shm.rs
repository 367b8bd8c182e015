//! Payloads in shared memory, for a client and a brick on one host (the
//! local transport, `sdk/WIRE.md` section 12).
//!
//! Over TCP every byte of a write is copied into the socket and out of it
//! again once per brick: three bricks, six copies of each byte, plus the
//! brick's copy into an aligned buffer for `O_DIRECT`. Over the local
//! transport the client hands each brick two memfds when it connects:
//!
//! - its **send region**, one per process ([`send_region`]), mapped
//!   read-only by every brick it talks to. Write data is put there once
//!   ([`copy_from`], [`concat()`]: the FUSE bridge and write-behind build
//!   their payloads in it), and a CALL names where it lies instead of
//!   carrying it, so replicate's three children send one buffer by
//!   reference and each brick writes it to its file from the mapping (page
//!   aligned, so `O_DIRECT` needs no copy either);
//! - a **receive region** per connection, mapped read-write by that brick
//!   only: a large read names a chunk of it, the brick puts the data
//!   there, and the client's caller gets the chunk as its `Bytes`.
//!
//! [`Region`] is the owner's side: a memfd sealed against shrinking (so a
//! peer's mapping can never fault) with a buddy allocator of 4 KiB pages
//! over it; a [`Chunk`] frees its pages when the last `Bytes` made of it
//! goes. [`Mapping`] is the peer's side: a region received over the socket,
//! checked (a memfd, sealed, of a bounded size) and mapped; every
//! descriptor a peer sends is checked against it, so bad input is an
//! error, never a fault. When a region is full, payloads go inline in the
//! frame as over TCP: nothing waits for room.
//!
//! A peer could change shared bytes while the other side reads them; each
//! side only ever exposes its own data that way (a client's pending writes,
//! the chunk it lent for a read), and a brick must not keep a shared
//! payload past its reply. A call that ends without its reply (the
//! connection dropped, frame-timeout) may still be running on the brick,
//! which may still read its payload or fill its lent chunk: the client
//! [`bury`]s those for [`QUARANTINE`] instead of reusing them, so one
//! file's bytes never land in another's.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};

/// The allocation unit.
pub const PAGE: usize = 4096;

/// Payloads below this size travel inline: a copy of a few KiB through the
/// socket costs less than the allocator.
pub const SHARED_MIN: usize = 32 << 10;

/// Largest region a peer may hand over.
pub const MAX_PEER_REGION: u64 = 4 << 30;

/// How long shared memory of a call that ended without its reply is kept
/// from reuse ([`bury`]): well past the brick's drain of a closed
/// connection's calls.
pub const QUARANTINE: std::time::Duration = std::time::Duration::from_secs(120);

/// A memory region this process owns and lends to its peers.
pub struct Region {
    fd: OwnedFd,
    base: NonNull<u8>,
    size: usize,
    alloc: parking_lot::Mutex<Buddy>,
    stats: RegionStats,
}

// SAFETY: the mapping is plain shared memory; access to allocator state is
// behind the mutex, and a chunk's bytes are touched only through the chunk
// that owns them.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

#[derive(Default)]
struct RegionStats {
    allocs: AtomicU64,
    full: AtomicU64,
    in_use: AtomicU64,
}

impl Region {
    /// Creates a region of `size` bytes (rounded up to a power of two
    /// pages): a memfd sealed against shrinking and growing, mapped here
    /// read-write.
    pub fn create(name: &str, size: usize) -> io::Result<Arc<Region>> {
        let pages = size.div_ceil(PAGE).max(1).next_power_of_two();
        let size = pages * PAGE;
        let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid C string; the returned fd is owned below.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on the fd we own.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
                return Err(io::Error::last_os_error());
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let base = map(fd.as_raw_fd(), size, true)?;
        Ok(Arc::new(Region {
            fd,
            base,
            size,
            alloc: parking_lot::Mutex::new(Buddy::new(pages)),
            stats: RegionStats::default(),
        }))
    }

    /// The memfd, to hand to a peer.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The region's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A chunk of at least `len` bytes (page aligned), or None when the
    /// region has no such run free.
    pub fn alloc(self: &Arc<Region>, len: usize) -> Option<Chunk> {
        let pages = len.div_ceil(PAGE).max(1);
        let order = pages.next_power_of_two().trailing_zeros() as u8;
        let mut page = self.alloc.lock().alloc(order);
        if page.is_none() && exhume() > 0 {
            page = self.alloc.lock().alloc(order);
        }
        let Some(page) = page else {
            self.stats.full.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.stats.allocs.fetch_add(1, Ordering::Relaxed);
        self.stats.in_use.fetch_add((PAGE << order) as u64, Ordering::Relaxed);
        Some(Chunk { region: self.clone(), page, order, len })
    }

    /// Where `b` lies in this region, as (offset, length), when it does.
    pub fn locate(&self, b: &[u8]) -> Option<(u64, u64)> {
        let start = (b.as_ptr() as usize).checked_sub(self.base.as_ptr() as usize)?;
        (start.checked_add(b.len())? <= self.size && !b.is_empty()).then_some((start as u64, b.len() as u64))
    }

    /// Counters for a dump: chunks handed out, allocations refused for
    /// want of room, bytes in use now.
    pub fn counters(&self) -> (u64, u64, u64) {
        let s = &self.stats;
        (s.allocs.load(Ordering::Relaxed), s.full.load(Ordering::Relaxed), s.in_use.load(Ordering::Relaxed))
    }

    fn free(&self, page: u32, order: u8) {
        self.alloc.lock().free(page, order);
        self.stats.in_use.fetch_sub((PAGE << order) as u64, Ordering::Relaxed);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`; no chunk outlives the
        // region (each holds an Arc to it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.size) };
    }
}

/// Pages of a [`Region`], freed when dropped.
pub struct Chunk {
    region: Arc<Region>,
    page: u32,
    order: u8,
    len: usize,
}

impl Chunk {
    /// Offset of the chunk in its region.
    pub fn offset(&self) -> u64 {
        self.page as u64 * PAGE as u64
    }

    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true for a chunk that was asked for bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the pages are this chunk's alone until it is dropped, and
        // lie inside the mapping (the allocator hands out runs within it).
        unsafe { std::slice::from_raw_parts_mut(self.region.base.as_ptr().add(self.offset() as usize), self.len) }
    }

    /// The chunk as `Bytes` (of `len` bytes), freed once the last clone
    /// of them is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(Frozen(self))
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.region.free(self.page, self.order);
    }
}

struct Frozen(Chunk);

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        let c = &self.0;
        // SAFETY: as in `as_mut_slice`; no one writes the chunk once frozen
        // (a peer holding a read-write mapping was lent it only until its
        // reply, which came before the freeze).
        unsafe { std::slice::from_raw_parts(c.region.base.as_ptr().add(c.offset() as usize), c.len) }
    }
}

/// A buddy allocator over `2^max` pages: free runs per order, lowest
/// address first.
struct Buddy {
    max: u8,
    free: Vec<BTreeSet<u32>>,
}

impl Buddy {
    fn new(pages: usize) -> Buddy {
        let max = pages.trailing_zeros() as u8;
        let mut free = vec![BTreeSet::new(); max as usize + 1];
        free[max as usize].insert(0);
        Buddy { max, free }
    }

    fn alloc(&mut self, order: u8) -> Option<u32> {
        if order > self.max {
            return None;
        }
        let from = (order..=self.max).find(|&o| !self.free[o as usize].is_empty())?;
        let page = self.free[from as usize].pop_first()?;
        for o in (order..from).rev() {
            self.free[o as usize].insert(page + (1 << o));
        }
        Some(page)
    }

    fn free(&mut self, mut page: u32, mut order: u8) {
        while order < self.max {
            let buddy = page ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            page = page.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(page);
    }
}

fn map(fd: RawFd, size: usize, writable: bool) -> io::Result<NonNull<u8>> {
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    // SAFETY: a fresh shared mapping of a file we hold open; the kernel
    // picks the address.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Why a peer's region or descriptor is refused.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The fd is not a sealed memfd of an acceptable size.
    #[error("shared region refused: {0}")]
    Region(String),
    /// A descriptor points outside the region.
    #[error("shared payload at {offset}+{len} is outside the {size}-byte region")]
    OutOfRange {
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's size.
        size: u64,
    },
}

/// A peer's region, mapped here.
pub struct Mapping {
    _fd: OwnedFd,
    base: NonNull<u8>,
    size: usize,
    writable: bool,
}

// SAFETY: shared memory of the peer's; this side reads what descriptors
// name and writes only the chunks it is lent.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps a region a peer sent: it must be a memfd sealed against
    /// shrinking (so it can never fault under the mapping) of at most
    /// [`MAX_PEER_REGION`] bytes.
    pub fn from_peer(fd: OwnedFd, writable: bool) -> Result<Arc<Mapping>, ShmError> {
        let bad = |what: String| ShmError::Region(what);
        // SAFETY: fcntl and fstat on an fd we own, into a zeroed stat.
        let (seals, st) = unsafe {
            let seals = libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS);
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Err(bad(format!("fstat: {}", io::Error::last_os_error())));
            }
            (seals, st)
        };
        if seals < 0 {
            return Err(bad(format!("not a memfd: {}", io::Error::last_os_error())));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("the memfd is not sealed against shrinking".into()));
        }
        if writable && seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
            return Err(bad("the memfd is sealed against writes".into()));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size == 0 || size > MAX_PEER_REGION {
            return Err(bad(format!("size {size} is not within 1..={MAX_PEER_REGION}")));
        }
        let base = map(fd.as_raw_fd(), size as usize, writable).map_err(|e| bad(format!("mmap: {e}")))?;
        Ok(Arc::new(Mapping { _fd: fd, base, size: size as usize, writable }))
    }

    /// The region's size.
    pub fn size(&self) -> u64 {
        self.size as u64
    }

    fn check(&self, offset: u64, len: u64) -> Result<usize, ShmError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size as u64 => Ok(offset as usize),
            _ => Err(ShmError::OutOfRange { offset, len, size: self.size as u64 }),
        }
    }

    /// The `len` bytes at `offset`, without a copy (the mapping lives as
    /// long as they do).
    pub fn bytes(self: &Arc<Mapping>, offset: u64, len: u64) -> Result<Bytes, ShmError> {
        let at = self.check(offset, len)?;
        Ok(Bytes::from_owner(Slice { map: self.clone(), at, len: len as usize }))
    }

    /// Where `b` lies in this mapping, as an offset, when it does.
    pub fn locate(&self, b: &[u8]) -> Option<u64> {
        let start = (b.as_ptr() as usize).checked_sub(self.base.as_ptr() as usize)?;
        (start.checked_add(b.len())? <= self.size).then_some(start as u64)
    }

    /// The `len` bytes at `offset` lent for a read to fill (a writable
    /// mapping only): the sdk's [`xlfs_sdk::ctx::Lent`] memory.
    pub fn lend(self: &Arc<Mapping>, offset: u64, len: u64) -> Result<Box<dyn xlfs_sdk::ctx::LentMem>, ShmError> {
        let at = self.check(offset, len)?;
        if !self.writable {
            return Err(ShmError::Region("the region is read-only here".into()));
        }
        Ok(Box::new(Slice { map: self.clone(), at, len: len as usize }))
    }

    /// Copies `data` to `offset` (a writable mapping only).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ShmError> {
        let at = self.check(offset, data.len() as u64)?;
        if !self.writable {
            return Err(ShmError::Region("the region is read-only here".into()));
        }
        // SAFETY: in bounds (checked), a writable shared mapping; the peer
        // lent this range for this reply.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(at), data.len()) };
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `from_peer`; every `Slice` of it
        // holds an Arc, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.size) };
    }
}

struct Slice {
    map: Arc<Mapping>,
    at: usize,
    len: usize,
}

impl xlfs_sdk::ctx::LentMem for Slice {
    fn capacity(&self) -> usize {
        self.len
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: checked against the mapping's size when made, and made
        // only on a writable mapping (`lend`), for a range the peer lent
        // to this call alone.
        unsafe { std::slice::from_raw_parts_mut(self.map.base.as_ptr().add(self.at), self.len) }
    }

    fn freeze(mut self: Box<Self>, len: usize) -> Bytes {
        self.len = self.len.min(len);
        Bytes::from_owner(*self)
    }
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: checked against the mapping's size when made.
        unsafe { std::slice::from_raw_parts(self.map.base.as_ptr().add(self.at), self.len) }
    }
}

/// Shared memory kept from reuse, oldest first.
static GRAVE: parking_lot::Mutex<std::collections::VecDeque<(std::time::Instant, Box<dyn Send>)>> =
    parking_lot::Mutex::new(std::collections::VecDeque::new());

/// Keeps `held` (a payload's `Bytes`, a lent [`Chunk`]) from being freed
/// for [`QUARANTINE`]: the brick may still use it. What is older is freed
/// now. The memory held is bounded by the regions' sizes.
pub fn bury(held: impl Send + 'static) {
    exhume();
    GRAVE.lock().push_back((std::time::Instant::now(), Box::new(held)));
}

/// Frees what has been buried for longer than [`QUARANTINE`]; how many.
fn exhume() -> usize {
    let mut freed = Vec::new();
    {
        let mut g = GRAVE.lock();
        while g.front().is_some_and(|(t, _)| t.elapsed() >= QUARANTINE) {
            freed.extend(g.pop_front());
        }
    }
    // Dropped outside the lock: a chunk's drop takes its region's lock.
    freed.len()
}

/// Things buried now.
pub fn buried() -> usize {
    GRAVE.lock().len()
}

static SEND: OnceLock<Option<Arc<Region>>> = OnceLock::new();

/// The process's send region, made on first use with `size` bytes (the
/// first caller's size wins); None when it cannot be made (logged once).
pub fn send_region(size: usize) -> Option<Arc<Region>> {
    SEND.get_or_init(|| match Region::create("xlfs-send", size) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "no shared send region: payloads to local bricks go inline");
            None
        }
    })
    .clone()
}

/// The send region if one was made.
pub fn current_send_region() -> Option<&'static Arc<Region>> {
    SEND.get().and_then(Option::as_ref)
}

/// A payload of `len` bytes filled by `fill`: in the send region when there
/// is one, the payload is large enough to be worth it and it has room,
/// else on the heap.
fn build(len: usize, fill: impl FnOnce(&mut [u8])) -> Bytes {
    if len >= SHARED_MIN
        && let Some(mut c) = current_send_region().and_then(|r| r.alloc(len))
    {
        fill(c.as_mut_slice());
        return c.freeze();
    }
    let mut b = BytesMut::zeroed(len);
    fill(&mut b);
    b.freeze()
}

/// `data` as a payload (see `build`).
pub fn copy_from(data: &[u8]) -> Bytes {
    build(data.len(), |dst| dst.copy_from_slice(data))
}

/// The chunks, back to back, as one payload (see `build`).
pub fn concat(chunks: &[Bytes]) -> Bytes {
    let len = chunks.iter().map(Bytes::len).sum();
    build(len, |dst| {
        let mut at = 0;
        for c in chunks {
            dst[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    })
}

/// Sends `fds` with one byte (`tag`) over a Unix socket (SCM_RIGHTS).
pub fn send_fds(sock: RawFd, tag: u8, fds: &[RawFd]) -> io::Result<()> {
    let mut byte = [tag];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    // SAFETY: msghdr is plain data; zeroed is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds CMSG_SPACE(payload) bytes, so the
        // first header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: msg points at live buffers for the call's duration.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    match n {
        1 => Ok(()),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::new(io::ErrorKind::WriteZero, "the fd message was not sent")),
    }
}

/// Receives one byte and the fds sent with it ([`send_fds`]), at most
/// `max` (more are closed); WouldBlock when nothing is there yet, EOF as
/// `UnexpectedEof`.
pub fn recv_fds(sock: RawFd, max: usize) -> io::Result<(u8, Vec<OwnedFd>)> {
    let mut byte = [0u8];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // Room for a few more than expected, so extra fds are received (and
    // closed) rather than truncated.
    let want = (max + 4) * std::mem::size_of::<RawFd>();
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(want as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points at live buffers; MSG_CMSG_CLOEXEC keeps received
    // fds from leaking into children.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote, within
    // msg_controllen; each SCM_RIGHTS payload is an array of fds now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let n = data_len / std::mem::size_of::<RawFd>();
                let p = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many fds sent"));
    }
    if fds.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} fds sent, at most {max} expected", fds.len()),
        ));
    }
    Ok((byte[0], fds))
}

#[cfg(test)]
mod tests;
