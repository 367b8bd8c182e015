//! CPU seconds of a system's client and brick processes, from
//! `/proc/PID/stat` (utime + stime).
//!
//! A workload may remount the filesystem, which ends one client process and
//! starts another, so a [`Meter`] samples `/proc` every 200 ms from a thread
//! and keeps the last value seen of every matching process: a process that
//! exits loses at most its last 200 ms. Processes already running when the
//! meter starts count from that moment, later ones from their start.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Which processes belong to a system.
#[derive(Debug, Clone, PartialEq)]
pub enum Matcher {
    /// `xlfs mount` (client) and `xlfs brick` processes whose command line
    /// names a path under this directory (`xlfs up DIR`).
    Xlfs(String),
    /// `glusterfs` (the FUSE client) and `glusterfsd` (bricks) processes
    /// whose command line names a path under this directory.
    Gluster(String),
    /// `mfsmount` (the client) and `mfsmaster` and `mfschunkserver` (the
    /// servers, counted as bricks) processes whose command line names a
    /// path under this directory (`moosefs-ref.sh up DIR`).
    Moosefs(String),
}

/// What a process is to its system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The FUSE client.
    Client,
    /// A brick server.
    Brick,
}

/// The role of the process with command line `args` in the system `m`, if any.
pub fn classify(m: &Matcher, args: &[String]) -> Option<Role> {
    let (dir, argv0) = match m {
        Matcher::Xlfs(d) | Matcher::Gluster(d) | Matcher::Moosefs(d) => (d.trim_end_matches('/'), args.first()?),
    };
    let under = format!("{dir}/");
    if !args.iter().any(|a| a.contains(&under) || a == dir) {
        return None;
    }
    let exe = argv0.rsplit('/').next().unwrap_or(argv0);
    match m {
        Matcher::Xlfs(_) => match args.get(1).map(String::as_str) {
            Some("mount") => Some(Role::Client),
            Some("brick") => Some(Role::Brick),
            _ => None,
        },
        Matcher::Gluster(_) => match exe {
            "glusterfs" => Some(Role::Client),
            "glusterfsd" => Some(Role::Brick),
            _ => None,
        },
        // mfsmount names itself "mfsmount (mounted on: DIR/mnt)".
        Matcher::Moosefs(_) => match argv0.split([' ', '/']).find(|w| w.starts_with("mfs")) {
            Some("mfsmount") => Some(Role::Client),
            Some("mfsmaster" | "mfschunkserver") => Some(Role::Brick),
            _ => None,
        },
    }
}

/// `(starttime, utime + stime)` in clock ticks from the text of `/proc/PID/stat`.
pub fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): utime is field 14, stime 15, starttime 22.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let start: u64 = f.get(19)?.parse().ok()?;
    Some((start, utime + stime))
}

/// The command line of a process, one string per argument.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

/// The pids in /proc.
pub fn pids() -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

struct Tracked {
    role: Role,
    base: u64,
    last: u64,
}

struct State {
    matcher: Matcher,
    procs: HashMap<(u32, u64), Tracked>,
    others: HashSet<(u32, u64)>,
}

impl State {
    fn scan(&mut self, first: bool) {
        for pid in pids() {
            let Some((start, ticks)) =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| parse_stat(&s))
            else {
                continue;
            };
            let key = (pid, start);
            if let Some(t) = self.procs.get_mut(&key) {
                t.last = t.last.max(ticks);
                continue;
            }
            if self.others.contains(&key) {
                continue;
            }
            match cmdline(pid).and_then(|a| classify(&self.matcher, &a)) {
                Some(role) => {
                    let base = if first { ticks } else { 0 };
                    self.procs.insert(key, Tracked { role, base, last: ticks });
                }
                None => {
                    self.others.insert(key);
                }
            }
        }
    }

    fn totals(&self) -> (f64, f64) {
        let hz = clock_ticks();
        let (mut c, mut b) = (0u64, 0u64);
        for t in self.procs.values() {
            let d = t.last.saturating_sub(t.base);
            match t.role {
                Role::Client => c += d,
                Role::Brick => b += d,
            }
        }
        (c as f64 / hz, b as f64 / hz)
    }
}

/// Counts the CPU time of one system's processes from its start.
pub struct Meter {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Meter {
    /// Starts counting for the processes `matcher` names.
    pub fn start(matcher: Matcher) -> Meter {
        let mut st = State { matcher, procs: HashMap::new(), others: HashSet::new() };
        st.scan(true);
        let state = Arc::new(Mutex::new(st));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if let Ok(mut st) = s2.lock() {
                    st.scan(false);
                }
            }
        });
        Meter { state, stop, thread: Some(thread) }
    }

    /// CPU seconds of the client and of the brick processes since the start.
    pub fn snapshot(&self) -> (f64, f64) {
        let mut st = self.state.lock().expect("cpu meter state");
        st.scan(false);
        st.totals()
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn xlfs_processes() {
        let m = Matcher::Xlfs("/srv/w/xlfs".into());
        let mount = args("/t/xlfs mount --volfile /srv/w/xlfs/client.vol --foreground /srv/w/xlfs/mnt");
        assert_eq!(classify(&m, &mount), Some(Role::Client));
        assert_eq!(classify(&m, &args("/t/xlfs brick --dir /srv/w/xlfs/bricks/b0 --port 0")), Some(Role::Brick));
        assert_eq!(classify(&m, &args("/t/xlfs heal --volfile /srv/w/xlfs/client.vol --daemon")), None);
        // Another volume whose directory starts with the same name.
        assert_eq!(classify(&m, &args("/t/xlfs brick --dir /srv/w/xlfs-tmpfs/bricks/b0")), None);
        assert_eq!(classify(&m, &args("bash -c /t/xlfs umount /srv/w/xlfs/mnt")), None);
    }

    #[test]
    fn gluster_processes() {
        let m = Matcher::Gluster("/srv/w/gl".into());
        let fuse = args("/usr/sbin/glusterfs --process-name fuse --volfile-server=h --volfile-id=/v /srv/w/gl/mnt");
        assert_eq!(classify(&m, &fuse), Some(Role::Client));
        let brick = args("/usr/sbin/glusterfsd -s h --volfile-id v.h.srv-w-gl-b1 --brick-name /srv/w/gl/b1");
        assert_eq!(classify(&m, &brick), Some(Role::Brick));
        assert_eq!(classify(&m, &args("/usr/sbin/glusterfs -s localhost --volfile-id shd/v")), None);
    }

    #[test]
    fn moosefs_processes() {
        let m = Matcher::Moosefs("/srv/w/mfs".into());
        let mount = vec!["mfsmount (mounted on: /srv/w/mfs/mnt)".to_string()];
        assert_eq!(classify(&m, &mount), Some(Role::Client));
        assert_eq!(classify(&m, &args("mfschunkserver -c /srv/w/mfs/etc/cs1.cfg start")), Some(Role::Brick));
        assert_eq!(
            classify(&m, &args("/usr/sbin/mfsmaster -a -c /srv/w/mfs/etc/mfsmaster.cfg start")),
            Some(Role::Brick)
        );
        assert_eq!(classify(&m, &args("mfschunkserver -c /srv/other/etc/cs1.cfg start")), None);
        assert_eq!(classify(&m, &args("bash /b/moosefs-ref.sh up /srv/w/mfs")), None);
    }

    #[test]
    fn stat_fields() {
        let stat = "1234 (xlfs (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 98765 1000 10 0";
        assert_eq!(parse_stat(stat), Some((98765, 300)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn meter_counts_own_process() {
        // This test process is no system's; the meter sees nothing.
        let m = Meter::start(Matcher::Xlfs("/nonexistent/dir".into()));
        assert_eq!(m.snapshot(), (0.0, 0.0));
    }
}
