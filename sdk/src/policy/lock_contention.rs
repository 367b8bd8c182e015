//! The lock-contention policy: when cluster/replicate (AFR) gives up an
//! eager lock.
//!
//! AFR keeps the inode lock of a data transaction after the transaction
//! ends and delays its post-op (the "eager lock"), so that back-to-back
//! writes cost one lock and one pre-op/post-op pair. While it holds the
//! lock, other clients wait. The policy decides when to let go. It is told
//! about each [`LockEvent`] on the inode together with a [`LockView`] of
//! what AFR knows, and answers with a [`Decision`]. Whatever it answers, AFR
//! also releases the lock when no transaction arrived for
//! `post-op-delay-secs` and after a transaction that failed on some child.
//!
//! Built-in policies ([`builtin`]):
//! - `fd-count` ([`FdCount`]): release when the file has more than one open
//!   fd (GlusterFS before 2018; pgbench-style workloads with several fds on
//!   one file then lose the eager lock after every write).
//! - `inodelk-count` ([`InodelkCount`]): release when a brick reports more
//!   than one inodelk (granted or waiting) in AFR's domain on the inode
//!   (GlusterFS since 2018; the count rides on lock and write replies).
//! - `notify` ([`NotifyPolicy`]): release when the locks translator sends a
//!   contention upcall saying another client waits (as GlusterFS's
//!   erasure-coding translator does).
//!
//! Other policies come from plugin modules: the graph offers a loader per
//! scheme ([`Policies`](super::Policies)), which maps an option value such
//! as `wasm:/path/policy.wasm` to one.

use std::sync::Arc;

use crate::types::Gfid;

/// Something that happened to an inode while AFR may hold its eager lock.
/// The numeric codes are stable (they are what plugin ABIs carry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LockEvent {
    /// AFR acquired the eager lock on the bricks.
    Acquired = 1,
    /// A transaction started under the lock.
    TxnStart = 2,
    /// A transaction under the lock ended.
    TxnEnd = 3,
    /// An fd was opened on the inode through this AFR.
    FdOpened = 4,
    /// An fd on the inode was released through this AFR.
    FdClosed = 5,
    /// A brick reported how many inodelks (granted and waiting) AFR's
    /// domain has on the inode; [`LockView::inodelk_count`] has the number.
    InodelkCount = 6,
    /// A brick reported how many fds are open on the inode;
    /// [`LockView::brick_open_fds`] has the number.
    OpenFdCount = 7,
    /// The locks translator says another client waits for this lock.
    Contention = 8,
}

impl LockEvent {
    /// Every event, in code order.
    pub const ALL: &'static [LockEvent] = &[
        LockEvent::Acquired,
        LockEvent::TxnStart,
        LockEvent::TxnEnd,
        LockEvent::FdOpened,
        LockEvent::FdClosed,
        LockEvent::InodelkCount,
        LockEvent::OpenFdCount,
        LockEvent::Contention,
    ];

    /// The stable numeric code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The event with this code.
    pub fn from_code(code: u8) -> Option<LockEvent> {
        LockEvent::ALL.iter().copied().find(|e| e.code() == code)
    }
}

/// What AFR knows about the inode and its eager lock when it asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LockView {
    /// The inode.
    pub gfid: Gfid,
    /// True while AFR holds the eager lock.
    pub held: bool,
    /// Fds open on the inode through this AFR.
    pub local_open_fds: u32,
    /// The highest open-fd count a brick reported for the inode (all
    /// clients' fds), 0 when none was reported.
    pub brick_open_fds: u32,
    /// The highest number of inodelks in AFR's domain a brick reported on
    /// the inode, this lock included (so 1 means "only us"); 0 when none
    /// was reported since the lock was taken.
    pub inodelk_count: u32,
    /// Transactions running under the lock now.
    pub in_flight: u32,
    /// Transactions run under the lock since it was acquired.
    pub txns: u64,
    /// Milliseconds since the lock was acquired.
    pub held_ms: u64,
    /// True once a contention upcall arrived for this lock.
    pub contended: bool,
}

impl LockView {
    /// The larger of the local and the brick-reported open fd counts.
    pub fn open_fds(&self) -> u32 {
        self.local_open_fds.max(self.brick_open_fds)
    }
}

/// The policy's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Keep the lock; AFR releases it after `post-op-delay-secs` without
    /// transactions.
    Keep,
    /// Release as soon as the transactions now running end; new ones wait
    /// and take the lock again.
    ReleaseNow,
    /// Release at the latest this many milliseconds from now (as
    /// `ReleaseNow` then).
    ReleaseAfter {
        /// Milliseconds.
        ms: u64,
    },
}

/// Which counts the policy wants the bricks to report. Asking costs a few
/// bytes on each write and lock reply, so policies ask only for what they
/// use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Interest {
    /// Ask for the inodelk count in AFR's domain with each lock and write.
    pub inodelk_count: bool,
    /// Ask for the open fd count with each pre-op and lookup.
    pub open_fd_count: bool,
}

/// A lock-contention policy. It must answer quickly and without blocking:
/// AFR calls it under its per-inode state.
pub trait LockContentionPolicy: Send + Sync + 'static {
    /// The name it was chosen by (for dumps and logs).
    fn name(&self) -> &str;
    /// The counts it wants reported.
    fn interest(&self) -> Interest {
        Interest::default()
    }
    /// What to do after `event`, given `view`.
    fn decide(&self, event: LockEvent, view: &LockView) -> Decision;
}

/// `fd-count`: release whenever the file has more than one open fd.
#[derive(Clone, Copy, Debug, Default)]
pub struct FdCount;

impl LockContentionPolicy for FdCount {
    fn name(&self) -> &str {
        "fd-count"
    }
    fn interest(&self) -> Interest {
        Interest { open_fd_count: true, ..Interest::default() }
    }
    fn decide(&self, _event: LockEvent, view: &LockView) -> Decision {
        if view.open_fds() > 1 { Decision::ReleaseNow } else { Decision::Keep }
    }
}

/// `inodelk-count`: release when a brick reports more than one inodelk in
/// AFR's domain on the inode (someone else holds or waits for one).
#[derive(Clone, Copy, Debug, Default)]
pub struct InodelkCount;

impl LockContentionPolicy for InodelkCount {
    fn name(&self) -> &str {
        "inodelk-count"
    }
    fn interest(&self) -> Interest {
        Interest { inodelk_count: true, ..Interest::default() }
    }
    fn decide(&self, _event: LockEvent, view: &LockView) -> Decision {
        if view.inodelk_count > 1 { Decision::ReleaseNow } else { Decision::Keep }
    }
}

/// `notify`: release when a contention upcall arrives.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotifyPolicy;

impl LockContentionPolicy for NotifyPolicy {
    fn name(&self) -> &str {
        "notify"
    }
    fn decide(&self, _event: LockEvent, view: &LockView) -> Decision {
        if view.contended { Decision::ReleaseNow } else { Decision::Keep }
    }
}

/// The names of the built-in policies.
pub const BUILTIN: &[&str] = &["fd-count", "inodelk-count", "notify"];

/// The default policy's name (cluster/replicate's default, and what a
/// policy from a plugin module falls back to when it fails).
pub const DEFAULT: &str = "notify";

/// A built-in policy by name.
pub fn builtin(name: &str) -> Option<Arc<dyn LockContentionPolicy>> {
    match name {
        "fd-count" => Some(Arc::new(FdCount)),
        "inodelk-count" => Some(Arc::new(InodelkCount)),
        "notify" => Some(Arc::new(NotifyPolicy)),
        _ => None,
    }
}

pub use super::PolicyError;

/// Builds a policy from the part of the option value after `scheme:`.
pub type Loader = super::Loader<dyn LockContentionPolicy>;

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> LockView {
        LockView { held: true, local_open_fds: 1, inodelk_count: 1, ..LockView::default() }
    }

    #[test]
    fn builtins_decide_on_their_signal_only() {
        let fd = builtin("fd-count").expect("fd-count");
        let ilk = builtin("inodelk-count").expect("inodelk-count");
        let n = builtin("notify").expect("notify");
        for p in [&fd, &ilk, &n] {
            assert_eq!(p.decide(LockEvent::TxnEnd, &view()), Decision::Keep, "{}", p.name());
        }
        let two_fds = LockView { brick_open_fds: 2, ..view() };
        assert_eq!(fd.decide(LockEvent::OpenFdCount, &two_fds), Decision::ReleaseNow);
        assert_eq!(ilk.decide(LockEvent::OpenFdCount, &two_fds), Decision::Keep);
        assert_eq!(n.decide(LockEvent::OpenFdCount, &two_fds), Decision::Keep);
        let waiter = LockView { inodelk_count: 2, ..view() };
        assert_eq!(ilk.decide(LockEvent::InodelkCount, &waiter), Decision::ReleaseNow);
        assert_eq!(fd.decide(LockEvent::InodelkCount, &waiter), Decision::Keep);
        let contended = LockView { contended: true, ..view() };
        assert_eq!(n.decide(LockEvent::Contention, &contended), Decision::ReleaseNow);
        assert_eq!(ilk.decide(LockEvent::Contention, &contended), Decision::Keep);
        assert!(fd.interest().open_fd_count && !fd.interest().inodelk_count);
        assert!(ilk.interest().inodelk_count && !ilk.interest().open_fd_count);
        assert_eq!(n.interest(), Interest::default());
    }

    #[test]
    fn event_codes_round_trip() {
        for e in LockEvent::ALL {
            assert_eq!(LockEvent::from_code(e.code()), Some(*e));
        }
        assert_eq!(LockEvent::from_code(0), None);
    }

    struct Always(String);
    impl LockContentionPolicy for Always {
        fn name(&self) -> &str {
            &self.0
        }
        fn decide(&self, _: LockEvent, _: &LockView) -> Decision {
            Decision::ReleaseAfter { ms: 5 }
        }
    }

    #[test]
    fn resolve_builtins_schemes_and_errors() {
        let none = crate::policy::Policies::default();
        assert_eq!(none.lock_contention(" notify ").expect("builtin").name(), "notify");
        let e = none.lock_contention("nope").err().expect("unknown");
        assert!(e.to_string().contains("fd-count, inodelk-count, notify"), "{e}");
        let policies = none.clone().with_lock_contention(
            "test-scheme",
            Arc::new(|spec: &str| {
                if spec == "bad" {
                    Err("no such module".to_string())
                } else {
                    Ok(Arc::new(Always(spec.to_string())) as Arc<dyn LockContentionPolicy>)
                }
            }),
        );
        let p = policies.lock_contention("test-scheme:mine").expect("loaded");
        assert_eq!(p.name(), "mine");
        assert_eq!(p.decide(LockEvent::Acquired, &view()), Decision::ReleaseAfter { ms: 5 });
        let e = policies.lock_contention("test-scheme:bad").err().expect("load error");
        assert!(matches!(e, PolicyError::Load { .. }) && e.to_string().contains("no such module"), "{e}");
        let e = policies.lock_contention("other:x").err().expect("unknown scheme");
        assert!(e.to_string().contains("test-scheme"), "{e}");
        // The loaders are the graph's, not the process's.
        assert!(none.lock_contention("test-scheme:mine").is_err());
        assert!(policies.read_ahead("test-scheme:mine").is_err());
    }
}
