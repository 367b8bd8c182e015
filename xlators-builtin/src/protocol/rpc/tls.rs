//! TLS between clients and bricks (GlusterFS's `transport.socket.ssl-*`),
//! with rustls, and the [`WireRead`] / [`WireWrite`] halves a connection's
//! reader and [`Link`] use whether it is plain TCP or TLS.
//!
//! - **Certificates.** Each side has its own certificate and key
//!   (`transport.socket.ssl-own-cert`, `transport.socket.ssl-private-key`)
//!   and trusts the CAs in `transport.socket.ssl-ca-list`, all PEM files.
//!   Both are checked: the brick requires a client certificate signed by
//!   one of its CAs, and, when `auth.ssl-allow` is not `*`, one whose
//!   subject common name is in that list; the client checks that the
//!   brick's certificate is signed by one of its CAs and names the host it
//!   connected to (`remote-host`, as a DNS name or IP address in the
//!   certificate's subject alternative names).
//! - **Requiring it.** A brick with `transport.socket.ssl-enabled on`
//!   speaks only TLS: a plain client fails the TLS handshake and the brick
//!   logs why (so does a client without a certificate, or with one from
//!   another CA).
//! - **Sharing one session between tasks.** A connection's rustls state
//!   sits behind one mutex, shared by the reader (which decrypts what it
//!   reads) and by whichever task writes (which encrypts its frame and
//!   writes the records itself, with non-blocking writes, as on plain TCP).
//!   Encrypted bytes the socket did not take stay in the session (at most
//!   about [`TLS_WRITE_CHUNK`] plus record overhead; a writer finding some
//!   waits for the socket first) and are flushed by the connection's writer
//!   task ([`WireWrite::flush`]).

use std::io::{Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::*;

/// Plaintext taken into the session per write: one write system call's
/// worth of records.
pub const TLS_WRITE_CHUNK: usize = 256 << 10;

/// Largest TLS record on the wire (16 KiB of data plus overhead): the read
/// size for ciphertext.
const TLS_RECORD: usize = 16 * 1024 + 2048;

/// Why TLS could not be set up or a session failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file could not be read.
    #[error("{option} {path}: {why}")]
    File {
        /// The option that names the file.
        option: &'static str,
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The handshake failed (the peer's certificate, a protocol error, the
    /// socket).
    #[error("TLS handshake: {0}")]
    Handshake(String),
}

/// The certificate files and checks of one side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// `transport.socket.ssl-own-cert`.
    pub cert: String,
    /// `transport.socket.ssl-private-key`.
    pub key: String,
    /// `transport.socket.ssl-ca-list`.
    pub ca: String,
}

impl TlsFiles {
    /// The files named by the transport options, when
    /// `transport.socket.ssl-enabled` is on.
    pub fn from_options(o: &xlfs_sdk::Options) -> Option<TlsFiles> {
        use transport::*;
        SSL.get(o).then(|| TlsFiles {
            cert: SSL_OWN_CERT.get(o).to_string(),
            key: SSL_PRIVATE_KEY.get(o).to_string(),
            ca: SSL_CA_LIST.get(o).to_string(),
        })
    }

    fn certs(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        read_certs(transport::SSL_OWN_CERT.decl.name, &self.cert)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| file_error(transport::SSL_PRIVATE_KEY.decl.name, &self.key, e))
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in read_certs(transport::SSL_CA_LIST.decl.name, &self.ca)? {
            roots.add(c).map_err(|e| TlsError::File {
                option: transport::SSL_CA_LIST.decl.name,
                path: self.ca.clone(),
                why: e.to_string(),
            })?;
        }
        Ok(Arc::new(roots))
    }

    /// The brick's side: its certificate, and client certificates required
    /// and checked against the CA list.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs()?, self.key()?)
            .map_err(|e| TlsError::Config(format!("{} / {}: {e}", self.cert, self.key)))?;
        Ok(Arc::new(cfg))
    }

    /// The client's side: its certificate, and the brick's checked against
    /// the CA list.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.certs()?, self.key()?)
            .map_err(|e| TlsError::Config(format!("{} / {}: {e}", self.cert, self.key)))?;
        Ok(Arc::new(cfg))
    }
}

fn file_error(option: &'static str, path: &str, e: impl std::fmt::Display) -> TlsError {
    TlsError::File { option, path: path.to_string(), why: e.to_string() }
}

fn read_certs(option: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    if !Path::new(path).is_file() {
        return Err(file_error(option, path, "no such file"));
    }
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(option, path, e))?;
    if certs.is_empty() {
        return Err(file_error(option, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The subject common name of a DER certificate (the first CN of the
/// subject), or None when it has none or does not parse.
pub fn subject_cn(der: &[u8]) -> Option<String> {
    /// One DER element: (tag, contents, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&first, mut b) = b.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let (bytes, rest) = b.split_at(n);
            b = rest;
            bytes.iter().fold(0usize, |acc, &x| (acc << 8) | usize::from(x))
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }
    const SEQ: u8 = 0x30;
    let (SEQ, cert, _) = tlv(der)? else { return None };
    let (SEQ, mut tbs, _) = tlv(cert)? else { return None };
    // [0] version (optional), serial, signature algorithm, issuer,
    // validity, then the subject.
    let (tag, _, rest) = tlv(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (SEQ, mut subject, _) = tlv(tbs)? else { return None };
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    while !subject.is_empty() {
        let (_set_tag, set, rest) = tlv(subject)?;
        subject = rest;
        let (SEQ, atv, _) = tlv(set)? else { continue };
        let (0x06, oid, value) = tlv(atv)? else { continue };
        if oid == CN {
            let (_string_tag, s, _) = tlv(value)?;
            return String::from_utf8(s.to_vec()).ok();
        }
    }
    None
}

/// The read half of a connection.
pub enum WireRead {
    /// Plain TCP.
    Tcp(OwnedReadHalf),
    /// TLS over TCP.
    Tls(Arc<TlsStream>),
    /// A Unix socket (the local transport).
    Unix(super::unix::UnixRead),
}

/// The write half of a connection.
pub enum WireWrite {
    /// Plain TCP.
    Tcp(OwnedWriteHalf),
    /// TLS over TCP.
    Tls(Arc<TlsStream>),
    /// A Unix socket (the local transport).
    Unix(super::unix::UnixWrite),
}

impl From<OwnedWriteHalf> for WireWrite {
    fn from(w: OwnedWriteHalf) -> WireWrite {
        WireWrite::Tcp(w)
    }
}

/// Splits a plain TCP connection.
pub fn plain(stream: TcpStream) -> (WireRead, WireWrite) {
    let (rd, wr) = stream.into_split();
    (WireRead::Tcp(rd), WireWrite::Tcp(wr))
}

/// Splits a Unix socket connection (the local transport; see [`super::unix`]).
pub fn unix(stream: tokio::net::UnixStream) -> io::Result<(WireRead, WireWrite)> {
    let (rd, wr) = super::unix::split(stream)?;
    Ok((WireRead::Unix(rd), WireWrite::Unix(wr)))
}

/// A TLS session over a TCP socket, shared by both halves.
pub struct TlsStream {
    sock: TcpStream,
    state: parking_lot::Mutex<TlsState>,
}

struct TlsState {
    conn: Connection,
    /// Ciphertext read but not yet taken by the session.
    incoming: Vec<u8>,
    eof: bool,
}

/// `std::io::Write` over a non-blocking socket (WouldBlock when full).
struct SockWriter<'a>(&'a TcpStream);

impl Write for SockWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tls_io(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsStream {
    /// The brick's side of the handshake; the peer's certificate common
    /// name with the halves.
    pub async fn accept(
        sock: TcpStream,
        cfg: Arc<ServerConfig>,
    ) -> Result<(WireRead, WireWrite, Option<String>), TlsError> {
        let conn = ServerConnection::new(cfg).map_err(|e| TlsError::Handshake(e.to_string()))?;
        let s = TlsStream::handshake(sock, conn.into()).await?;
        let cn = s.state.lock().conn.peer_certificates().and_then(|c| c.first()).and_then(|c| subject_cn(c));
        Ok((WireRead::Tls(s.clone()), WireWrite::Tls(s), cn))
    }

    /// The client's side of the handshake with the brick at `host`.
    pub async fn connect(
        sock: TcpStream,
        cfg: Arc<ClientConfig>,
        host: &str,
    ) -> Result<(WireRead, WireWrite), TlsError> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| TlsError::Handshake(format!("{host} is not a name to check a certificate against: {e}")))?;
        let conn = ClientConnection::new(cfg, name).map_err(|e| TlsError::Handshake(e.to_string()))?;
        let s = TlsStream::handshake(sock, conn.into()).await?;
        Ok((WireRead::Tls(s.clone()), WireWrite::Tls(s)))
    }

    async fn handshake(sock: TcpStream, mut conn: Connection) -> Result<Arc<TlsStream>, TlsError> {
        let fail = |e: &dyn std::fmt::Display| TlsError::Handshake(e.to_string());
        let mut buf = vec![0u8; TLS_RECORD];
        loop {
            while conn.wants_write() {
                match conn.write_tls(&mut SockWriter(&sock)) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.writable().await.map_err(|e| fail(&e))?,
                    Err(e) => return Err(fail(&e)),
                }
            }
            if !conn.is_handshaking() {
                break;
            }
            sock.readable().await.map_err(|e| fail(&e))?;
            let n = match sock.try_read(&mut buf) {
                Ok(0) => return Err(fail(&"the peer closed the connection")),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(fail(&e)),
            };
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                conn.read_tls(&mut rd).map_err(|e| fail(&e))?;
                if let Err(e) = conn.process_new_packets() {
                    // Tell the peer why (the alert rustls queued), then fail.
                    let _ = conn.write_tls(&mut SockWriter(&sock));
                    return Err(fail(&e));
                }
            }
        }
        let state = TlsState { conn, incoming: Vec::new(), eof: false };
        Ok(Arc::new(TlsStream { sock, state: parking_lot::Mutex::new(state) }))
    }

    /// Writes the session's pending records; WouldBlock when some remain.
    fn flush_locked(&self, st: &mut TlsState) -> io::Result<()> {
        while st.conn.wants_write() {
            st.conn.write_tls(&mut SockWriter(&self.sock))?;
        }
        Ok(())
    }

    fn try_write_vectored(&self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut st = self.state.lock();
        self.flush_locked(&mut st)?;
        let mut n = 0;
        for s in slices {
            if n >= TLS_WRITE_CHUNK {
                break;
            }
            let take = s.len().min(TLS_WRITE_CHUNK - n);
            let took = st.conn.writer().write(&s[..take])?;
            n += took;
            if took < take {
                break;
            }
        }
        match self.flush_locked(&mut st) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ if n == 0 => Err(io::ErrorKind::WouldBlock.into()),
            _ => Ok(n),
        }
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            {
                let mut st = self.state.lock();
                match st.conn.reader().read(buf.initialize_unfilled()) {
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && st.eof => {
                        // Closed without close_notify: an end like TCP's.
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
                if st.eof {
                    return Poll::Ready(Ok(()));
                }
                if !st.incoming.is_empty() {
                    self.feed(&mut st)?;
                    continue;
                }
            }
            ready!(self.sock.poll_read_ready(cx))?;
            // Ciphertext goes straight into the session's input buffer (its
            // capacity kept from read to read).
            let mut st = self.state.lock();
            let have = st.incoming.len();
            st.incoming.resize(have + TLS_RECORD, 0);
            let r = self.sock.try_read(&mut st.incoming[have..]);
            st.incoming.truncate(have + r.as_ref().map_or(0, |n| *n));
            match r {
                Ok(0) => st.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
            self.feed(&mut st)?;
        }
    }

    /// Gives the session the ciphertext it will take and processes it.
    fn feed(&self, st: &mut TlsState) -> io::Result<()> {
        let mut rd = &st.incoming[..];
        let before = rd.len();
        let r = st.conn.read_tls(&mut rd);
        let used = before - rd.len();
        st.incoming.drain(..used);
        let io_state = st.conn.process_new_packets().map_err(tls_io)?;
        // A session that takes nothing because it holds plaintext not read
        // yet is fine (the reader takes that first); any other refusal is an
        // error, or the reader would offer the same bytes for ever.
        if let Err(e) = r
            && !(used == 0 && io_state.plaintext_bytes_to_read() > 0)
        {
            return Err(e);
        }
        // Post-handshake messages (tickets, key updates) go out if they can.
        let _ = self.flush_locked(st);
        Ok(())
    }
}

impl tokio::io::AsyncRead for WireRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireRead::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            WireRead::Tls(s) => s.poll_read(cx, buf),
            WireRead::Unix(r) => r.poll_read(cx, buf),
        }
    }
}

impl WireWrite {
    /// Writes without waiting; WouldBlock when the socket (or, with TLS,
    /// the session's unsent records) is full.
    pub(super) fn try_write_vectored(&self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WireWrite::Tcp(w) => w.try_write_vectored(slices),
            WireWrite::Tls(s) => s.try_write_vectored(slices),
            WireWrite::Unix(w) => w.try_write_vectored(slices),
        }
    }

    /// Writes what the session still holds (TLS records the socket did not
    /// take); WouldBlock while some remain. Nothing to do on plain TCP.
    pub(super) fn flush(&self) -> io::Result<()> {
        match self {
            WireWrite::Tcp(_) | WireWrite::Unix(_) => Ok(()),
            WireWrite::Tls(s) => s.flush_locked(&mut s.state.lock()),
        }
    }

    /// Waits until the socket takes more.
    pub(super) async fn writable(&self) -> io::Result<()> {
        match self {
            WireWrite::Tcp(w) => w.writable().await,
            WireWrite::Tls(s) => s.sock.writable().await,
            WireWrite::Unix(w) => w.writable().await,
        }
    }

    /// Shuts the socket down (`Write`: after a TLS close_notify). A peer
    /// already gone is not an error.
    pub(super) fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let sock = match self {
            WireWrite::Tcp(w) => socket2::SockRef::from(w.as_ref()),
            WireWrite::Unix(w) => w.sock(),
            WireWrite::Tls(s) => {
                if how == std::net::Shutdown::Write {
                    let mut st = s.state.lock();
                    st.conn.send_close_notify();
                    let _ = s.flush_locked(&mut st);
                }
                socket2::SockRef::from(&s.sock)
            }
        };
        match sock.shutdown(how) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests;
