//! [`TestProcess`]: this test binary re-run as a separate process that
//! plays a role (a lock holder to be killed, for example).

use super::*;

/// This test binary run again as a separate process that plays a role:
/// the test `test_name` (marked `#[ignore]`, so that it only runs when
/// asked) reads its role from the environment variable [`ROLE_VAR`],
/// prints lines on stdout and waits to be killed.
pub struct TestProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// The environment variable that gives a [`TestProcess`] its role.
pub const ROLE_VAR: &str = "XLFS_KIT_ROLE";

/// The role this process was started with, if any.
pub fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

impl TestProcess {
    /// Runs test `test_name` of this binary with [`ROLE_VAR`] = `role`.
    pub fn spawn(test_name: &str, role: &str) -> TestProcess {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test_name, "--nocapture", "--ignored", "--test-threads", "1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("spawn test process");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        TestProcess { child, lines }
    }

    /// Waits for a stdout line starting with `prefix` and returns it
    /// (panics if the process ends or is silent for [`PROCESS_TIMEOUT`]).
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => {
                    panic!("test process sent no line starting with {prefix:?} (status {:?})", self.child.try_wait())
                }
            }
        }
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
