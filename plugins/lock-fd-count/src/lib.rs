//! `lock-fd-count`: the lock-contention policy of GlusterFS before 2018,
//! written against `xlfs_sdk::policy::lock_contention` alone: AFR gives up
//! its eager lock whenever the file has more than one open fd (its own or,
//! as the bricks report, anyone's). Workloads that keep several fds on one
//! file (pgbench) then lose the eager lock after every write.
//!
//! A policy plugin (plugin ABI v1.1): load it with cluster/replicate's
//! option `lock-contention-policy wasm:/path/xlfs_plugin_lock_fd_count.wasm`
//! (or `dylib:/path/libxlfs_plugin_lock_fd_count.so`). The same rule is
//! built in as `fd-count`.

use xlfs_sdk::policy::lock_contention::{Decision, Interest, LockContentionPolicy, LockEvent, LockView};

/// The policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct LockFdCount;

impl LockContentionPolicy for LockFdCount {
    fn name(&self) -> &str {
        "lock-fd-count"
    }
    fn interest(&self) -> Interest {
        Interest { open_fd_count: true, ..Interest::default() }
    }
    fn decide(&self, _event: LockEvent, view: &LockView) -> Decision {
        if view.open_fds() > 1 { Decision::ReleaseNow } else { Decision::Keep }
    }
}

xlfs_sdk::export_policy!(lock_contention = LockFdCount);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_only_with_more_than_one_open_fd() {
        let one = LockView { held: true, local_open_fds: 1, ..LockView::default() };
        for e in LockEvent::ALL {
            assert_eq!(LockFdCount.decide(*e, &one), Decision::Keep, "{e:?}");
        }
        let local = LockView { local_open_fds: 2, ..one };
        let remote = LockView { brick_open_fds: 3, ..one };
        // A waiting inodelk or a contention upcall alone does not matter to it.
        let contended = LockView { inodelk_count: 2, contended: true, ..one };
        assert_eq!(LockFdCount.decide(LockEvent::FdOpened, &local), Decision::ReleaseNow);
        assert_eq!(LockFdCount.decide(LockEvent::OpenFdCount, &remote), Decision::ReleaseNow);
        assert_eq!(LockFdCount.decide(LockEvent::Contention, &contended), Decision::Keep);
        assert!(LockFdCount.interest().open_fd_count && !LockFdCount.interest().inodelk_count);
    }
}
