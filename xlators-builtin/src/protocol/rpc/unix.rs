//! The local transport's socket (a Unix stream between a mount and a brick
//! on one host), split so that the runtime watches it for reading only.
//!
//! tokio registers a socket for reading and writing at once, and a Unix
//! stream socket signals "writable" each time its peer reads a message (TCP
//! does so only after a write found the buffer full). So every request a
//! brick read woke the mount's I/O thread, and every reply the mount read
//! woke the brick's, for nothing: writes here are non-blocking and almost
//! always find room. Here the read half is registered for reading alone;
//! the write half is a second descriptor of the same socket, written
//! without the runtime, and registered only while a writer waits for room
//! (the socket full), then let go.

use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, ReadBuf};

/// The read half: readiness for reading only.
pub struct UnixRead(AsyncFd<UnixStream>);

/// The write half: the same socket through a descriptor of its own.
pub struct UnixWrite(UnixStream);

/// Splits a connected local socket (it must be inside a runtime).
pub fn split(stream: tokio::net::UnixStream) -> io::Result<(UnixRead, UnixWrite)> {
    // Leaves tokio's registration; the socket stays non-blocking.
    let sock = stream.into_std()?;
    let wr = sock.try_clone()?;
    let rd = watch(sock, Interest::READABLE)?;
    Ok((UnixRead(rd), UnixWrite(wr)))
}

/// Registers `sock` with the runtime for `interest` alone.
fn watch(sock: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the AsyncFd owns `sock`, whose descriptor stays open and the
    // same until the AsyncFd is dropped.
    unsafe { AsyncFd::register_with_interest(sock, interest) }.map_err(|e| e.into_parts().1)
}

impl UnixRead {
    pub(super) fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.0.poll_read_ready(cx))?;
            // SAFETY: only read(2) writes here, and only initialised bytes
            // are marked as such below.
            let unfilled = unsafe { buf.unfilled_mut() };
            let fd = self.0.get_ref().as_raw_fd();
            // SAFETY: `unfilled` is writable memory of its length; read(2)
            // writes at most that many bytes into it.
            let n = unsafe { libc::read(fd, unfilled.as_mut_ptr().cast(), unfilled.len()) };
            if n >= 0 {
                let n = n as usize;
                // SAFETY: read(2) initialised the first `n` bytes.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => ready.clear_ready(),
                io::ErrorKind::Interrupted => {}
                _ => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl UnixWrite {
    /// Writes without waiting; WouldBlock when the socket is full.
    pub(super) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.0).write_vectored(slices)
    }

    /// Waits until the socket takes more: watched only for this wait.
    pub(super) async fn writable(&self) -> io::Result<()> {
        let watched = watch(self.0.try_clone()?, Interest::WRITABLE)?;
        let _ready = watched.writable().await?;
        Ok(())
    }

    pub(super) fn sock(&self) -> socket2::SockRef<'_> {
        socket2::SockRef::from(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// `UnixRead` as an `AsyncRead`, for the test.
    struct Reader(UnixRead);

    impl AsyncRead for Reader {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.0.poll_read(cx, buf)
        }
    }

    #[tokio::test]
    async fn both_ways_a_full_socket_and_the_end() {
        let (a, mut b) = tokio::net::UnixStream::pair().expect("pair");
        let (rd, wr) = split(a).expect("split");
        let mut rd = Reader(rd);

        // Reads.
        b.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        rd.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");

        // Writes until the socket is full; a waiting writer goes on once the
        // peer reads.
        let chunk = vec![7u8; 65536];
        let mut sent = 0usize;
        loop {
            match wr.try_write_vectored(&[IoSlice::new(&chunk)]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        assert!(sent > 0);
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; sent];
            b.read_exact(&mut buf).await.expect("drain");
            assert!(buf.iter().all(|&x| x == 7));
            b
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), wr.writable())
            .await
            .expect("writable once the peer reads")
            .expect("no error");
        assert!(wr.try_write_vectored(&[IoSlice::new(b"more")]).expect("room") > 0);
        let mut b = drain.await.expect("drained");
        let mut more = [0u8; 4];
        b.read_exact(&mut more).await.expect("read more");
        assert_eq!(&more, b"more");

        // The peer's end is a read of nothing.
        drop(b);
        let mut rest = Vec::new();
        rd.read_to_end(&mut rest).await.expect("eof");
        assert!(rest.is_empty());
    }
}
