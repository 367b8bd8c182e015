//! Test certificates (rcgen) for the TLS tests, written as PEM files, and
//! a TCP relay that records every byte it carries (what anyone on the
//! path between a client and a brick would see).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA in a temp dir, and the certificates it signed there.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// One side's files: certificate, key and the CA list it trusts.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().expect("CA key")).expect("CA certificate");
        let dir = tempfile::Builder::new().prefix("xlfs-pki-").tempdir().expect("pki dir");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
        Pki { dir, ca }
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }

    /// A certificate for common name `cn`, valid for the names `sans`
    /// (DNS names or IP addresses), trusting this CA.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Identity {
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.ca).expect("sign");
        let path = |ext: &str| self.dir.path().join(format!("{cn}.{ext}")).display().to_string();
        std::fs::write(path("pem"), cert.pem()).expect("write certificate");
        std::fs::write(path("key"), key.serialize_pem()).expect("write key");
        Identity { cert: path("pem"), key: path("key"), ca: self.ca() }
    }
}

impl Identity {
    /// The same identity trusting another CA list.
    pub fn trusting(&self, ca: &str) -> Identity {
        Identity { ca: ca.to_string(), ..self.clone() }
    }

    /// The transport options that turn TLS on with these files.
    pub fn options(&self) -> Vec<(&str, &str)> {
        vec![
            ("transport.socket.ssl-enabled", "on"),
            ("transport.socket.ssl-own-cert", self.cert.as_str()),
            ("transport.socket.ssl-private-key", self.key.as_str()),
            ("transport.socket.ssl-ca-list", self.ca.as_str()),
        ]
    }
}

/// A TCP relay on 127.0.0.1 to `target` that keeps a copy of every byte
/// in both directions.
pub struct Tap {
    pub port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    /// Starts relaying (threads that end with the connections).
    pub fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("tap bind");
        let port = listener.local_addr().expect("tap addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else { continue };
                for (mut from, mut to) in
                    [(client.try_clone().expect("clone"), server.try_clone().expect("clone")), (server, client)]
                {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    s.lock().expect("tap log").extend_from_slice(&buf[..n]);
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
            }
        });
        Tap { port, seen }
    }

    /// Whether `needle` appeared in the bytes relayed so far, and how many
    /// bytes that was.
    pub fn saw(&self, needle: &[u8]) -> (bool, usize) {
        let seen = self.seen.lock().expect("tap log");
        (seen.windows(needle.len()).any(|w| w == needle), seen.len())
    }
}
