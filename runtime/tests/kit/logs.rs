//! Captures the test process's log (`tracing`) so tests can assert on what
//! was logged (`#[path = "kit/logs.rs"] mod logs;`).
#![allow(dead_code)]

use std::sync::{Mutex, OnceLock};

/// This process's log, kept for assertions (see [`capture_logs`]).
fn log_buffer() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| Mutex::new(Vec::new()))
}

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if std::env::var_os("XLFS_TEST_ECHO_LOG").is_some() {
            eprint!("{}", String::from_utf8_lossy(b));
        }
        log_buffer().lock().expect("log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this process's logs (plugin logs at debug) for the assertions;
/// with `XLFS_TEST_ECHO_LOG` set they are printed too.
pub fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,xlfs::plugin=debug"))
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

/// The captured log lines that mention every needle.
pub fn log_lines(needles: &[&str]) -> Vec<String> {
    let buf = log_buffer().lock().expect("log buffer");
    String::from_utf8_lossy(&buf).lines().filter(|l| needles.iter().all(|n| l.contains(n))).map(String::from).collect()
}
