//! For the TLS tests (certificates: `xlfs_sdk::testing::pki`): a TCP relay
//! that records every byte it carries (what anyone on the path between a
//! client and a brick would see).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

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
