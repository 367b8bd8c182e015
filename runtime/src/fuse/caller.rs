//! Who calls: the request's uid, gid and pid ([`Caller`]) and the
//! caller's supplementary groups, read from `/proc/PID/status` and cached
//! for a second, made into the fop's [`CallCtx`].

use super::*;

/// Supplementary groups of callers, from `/proc/PID/status`, kept for
/// [`GROUPS_TTL`]; at most [`GROUPS_MAX`] processes.
pub(super) struct GroupCache(pub(super) Mutex<HashMap<u32, Groups>>);

/// A caller's groups and when they were read.
pub(super) type Groups = (Instant, Arc<[u32]>);

pub(super) const GROUPS_TTL: Duration = Duration::from_secs(1);

pub(super) const GROUPS_MAX: usize = 4096;

impl GroupCache {
    pub(super) fn get(&self, pid: u32) -> Arc<[u32]> {
        let now = Instant::now();
        if let Some((at, g)) = self.0.lock().get(&pid)
            && now.duration_since(*at) < GROUPS_TTL
        {
            return g.clone();
        }
        let groups: Arc<[u32]> = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| parse_groups(&s))
            .unwrap_or_default()
            .into();
        let mut m = self.0.lock();
        if m.len() >= GROUPS_MAX {
            m.retain(|_, (at, _)| now.duration_since(*at) < GROUPS_TTL);
            if m.len() >= GROUPS_MAX {
                m.clear();
            }
        }
        m.insert(pid, (now, groups.clone()));
        groups
    }
}

/// The `Groups:` line of a `/proc/PID/status` text.
pub(super) fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(line.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

/// The caller as the kernel names it: copied off the request so a task can
/// own it.
#[derive(Clone, Copy)]
pub(super) struct Caller {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) pid: u32,
}

impl From<&FuseRequest> for Caller {
    fn from(r: &FuseRequest) -> Caller {
        Caller { uid: r.uid(), gid: r.gid(), pid: r.pid() }
    }
}

impl Core {
    /// The call context for a caller; `groups` reads its supplementary
    /// groups (for fops whose result depends on them).
    pub(super) fn ctx(&self, c: Caller, lk_owner: u64, groups: bool) -> CallCtx {
        let groups = if groups && c.pid != 0 { self.groups.get(c.pid) } else { Arc::from(Vec::new()) };
        CallCtx {
            uid: c.uid,
            gid: c.gid,
            groups,
            pid: c.pid,
            lk_owner,
            client_id: self.client_id.clone(),
            frame: Default::default(),
            lent: Default::default(),
        }
    }
}
