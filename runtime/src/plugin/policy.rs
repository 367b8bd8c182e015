//! Policies from plugin modules (plugin ABI v1.1, `sdk/PLUGIN-ABI.md`
//! section 11): a module exporting the read-ahead or lock-contention group
//! serves as that policy wherever an option names one as `wasm:<path>` or
//! `dylib:<path>` (an absolute path): performance/read-ahead's `policy`,
//! cluster/replicate's `lock-contention-policy`. [`with_loaders`] adds the
//! two schemes to the registry's [`Policies`] (the registry's
//! [`Registry::builtin`](crate::registry::Registry::builtin) calls it, so
//! the `xlfs` binary and in-process graphs both have them), which every
//! graph built from it offers its translators in their `InitCtx`.
//!
//! Each option value that names a module gets its own instance, made with
//! the module's default options when the translator is built (a module
//! whose init fails, or that lacks the policy asked for, fails the build).
//! Calls are synchronous and short: a WebAssembly instance has
//! [`LIMITS`] (a 50 ms deadline per call, 16 MiB of memory). A call that
//! traps, misses its deadline, fails or answers something that does not
//! decode is a fault: the built-in default decides instead (read-ahead:
//! `tolerant`, whose stream is fed every read so it is ready to take over;
//! lock contention: `notify`), the fault is logged, and the instance is
//! dropped and made again on the next call. [`CRASH_LIMIT`] faults within
//! [`CRASH_WINDOW`] disable the module: the default decides from then on,
//! logged. Fops never fail because of a policy.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::Dict;
use xlfs_sdk::abi;
use xlfs_sdk::guest::sys::{self, PolicyExports};
use xlfs_sdk::policy::Policies;
use xlfs_sdk::policy::lock_contention::{self, Decision, Interest, LockContentionPolicy, LockEvent, LockView};
use xlfs_sdk::policy::read_ahead::{self, Advice, Geometry, ReadAheadPolicy, ReadAheadStream, ReadInfo};

use super::node::{Fault, Guest, GuestLimits, HostCtx, PolicyCall};
use super::{Kind, Loaded, load};

/// The bounds of a policy instance (WebAssembly): policy calls sit on the
/// fop path, so they must be quick.
pub(crate) const LIMITS: GuestLimits = GuestLimits { memory: 16 << 20, call_timeout: Duration::from_millis(50) };
/// Faults within [`CRASH_WINDOW`] that disable a policy module.
pub(crate) const CRASH_LIMIT: usize = 5;
/// The window [`CRASH_LIMIT`] counts faults in.
pub(crate) const CRASH_WINDOW: Duration = Duration::from_secs(60);

fn scheme(kind: Kind) -> &'static str {
    match kind {
        Kind::Wasm => "wasm",
        Kind::Dylib => "dylib",
    }
}

/// `policies` with the `wasm` and `dylib` loaders for read-ahead and
/// lock-contention policies added.
pub(crate) fn with_loaders(mut policies: Policies) -> Policies {
    for kind in [Kind::Wasm, Kind::Dylib] {
        let ra: read_ahead::Loader = Arc::new(move |spec: &str| {
            let host = PolicyHost::load(kind, spec, |p| p.read_ahead, "read-ahead")?;
            Ok(Arc::new(PluginReadAhead { host }) as Arc<dyn ReadAheadPolicy>)
        });
        let lock: lock_contention::Loader = Arc::new(move |spec: &str| {
            let host = PolicyHost::load(kind, spec, |p| p.lock_contention, "lock-contention")?;
            Ok(Arc::new(PluginLock::new(host)?) as Arc<dyn LockContentionPolicy>)
        });
        policies = policies.with_read_ahead(scheme(kind), ra).with_lock_contention(scheme(kind), lock);
    }
    policies
}

#[derive(Default)]
struct Slot {
    guest: Option<Box<dyn Guest>>,
    /// Bumped when an instance is dropped: stream ids of older ones are gone.
    generation: u64,
    crashes: VecDeque<Instant>,
    disabled: bool,
    last_disabled_log: Option<Instant>,
}

/// One instance of a policy module, for one option value of one node.
struct PolicyHost {
    /// `wasm:/path` or `dylib:/path`: the name dumps and logs show.
    label: String,
    loaded: Arc<Loaded>,
    ctx: Arc<HostCtx>,
    init_msg: Vec<u8>,
    slot: Mutex<Slot>,
}

impl PolicyHost {
    fn load(kind: Kind, spec: &str, has: fn(&PolicyExports) -> bool, what: &str) -> Result<Arc<PolicyHost>, String> {
        let path = Path::new(spec.trim());
        if !path.is_absolute() {
            return Err(format!("'{spec}' is not an absolute path (expected {}:/path/to/module)", scheme(kind)));
        }
        let loaded = load(kind, path).map_err(|e| e.to_string())?;
        if !has(&loaded.policies) {
            return Err(format!(
                "{}: the module exports no {what} policy (plugin ABI v1.1; it was built for {})",
                path.display(),
                loaded.version
            ));
        }
        let label = format!("{}:{}", scheme(kind), path.display());
        let mut init_msg = Vec::new();
        abi::encode(&Dict::new(), &mut init_msg);
        let host =
            PolicyHost { ctx: HostCtx::describing(label.clone()), label, loaded, init_msg, slot: Mutex::default() };
        let first = host
            .instantiate()
            .map_err(|Fault(why)| format!("{}: init failed: {}", host.label, host.ctx.with_last_error(why)))?;
        host.slot.lock().guest = Some(first);
        Ok(Arc::new(host))
    }

    fn instantiate(&self) -> Result<Box<dyn Guest>, Fault> {
        self.loaded.module.instantiate(&self.ctx, &self.init_msg, &LIMITS)
    }

    /// Runs `f` on the instance (making one if the last one faulted), with
    /// the instance's generation; `None` when the module is disabled or
    /// `f` faults: the caller then uses the built-in default.
    fn call<R>(&self, f: impl FnOnce(&mut dyn Guest, u64) -> Result<R, Fault>) -> Option<R> {
        let mut slot = self.slot.lock();
        if slot.disabled {
            let now = Instant::now();
            if slot.last_disabled_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
                slot.last_disabled_log = Some(now);
                tracing::warn!(target: "xlfs::plugin", policy = %self.label,
                    "policy module is disabled after a crash loop: the built-in default decides until the graph is rebuilt");
            }
            return None;
        }
        if slot.guest.is_none() {
            match self.instantiate() {
                Ok(g) => slot.guest = Some(g),
                Err(Fault(why)) => {
                    self.crash(&mut slot, format!("restart failed: {why}"));
                    return None;
                }
            }
        }
        let generation = slot.generation;
        let guest = slot.guest.as_mut()?;
        match f(guest.as_mut(), generation) {
            Ok(r) => Some(r),
            Err(Fault(why)) => {
                self.crash(&mut slot, why);
                None
            }
        }
    }

    fn crash(&self, slot: &mut Slot, why: String) {
        let why = self.ctx.with_last_error(why);
        drop(slot.guest.take());
        slot.generation += 1;
        let now = Instant::now();
        slot.crashes.push_back(now);
        while slot.crashes.len() > CRASH_LIMIT
            || slot.crashes.front().is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW)
        {
            slot.crashes.pop_front();
        }
        if slot.crashes.len() >= CRASH_LIMIT {
            slot.disabled = true;
            tracing::error!(target: "xlfs::plugin", policy = %self.label,
                "policy module failed: {why}; the built-in default decided instead; {} failures within {CRASH_WINDOW:?}: \
                 module DISABLED, the built-in default decides until the graph is rebuilt", slot.crashes.len());
        } else {
            tracing::error!(target: "xlfs::plugin", policy = %self.label,
                "policy module failed: {why}; the built-in default decided instead; the instance is restarted on the next call");
        }
    }
}

/// A read-ahead policy from a module.
struct PluginReadAhead {
    host: Arc<PolicyHost>,
}

impl ReadAheadPolicy for PluginReadAhead {
    fn name(&self) -> &str {
        &self.host.label
    }

    fn open(&self, geometry: Geometry) -> Box<dyn ReadAheadStream> {
        let fallback = read_ahead::Tolerant.open(geometry);
        Box::new(PluginStream { host: self.host.clone(), geo: geometry, id: None, fallback, out: Vec::new() })
    }
}

/// A stream of a module's read-ahead policy, with the default's stream fed
/// alongside to decide when the module cannot.
struct PluginStream {
    host: Arc<PolicyHost>,
    geo: Geometry,
    /// The module's stream: (instance generation, id).
    id: Option<(u64, u64)>,
    fallback: Box<dyn ReadAheadStream>,
    out: Vec<u8>,
}

/// The module's stream id in instance `generation`, opened if need be.
fn stream_id(id: &mut Option<(u64, u64)>, geo: Geometry, g: &mut dyn Guest, generation: u64) -> Result<u64, Fault> {
    if let Some((era, s)) = *id
        && era == generation
    {
        return Ok(s);
    }
    let s = g.policy(PolicyCall::RaOpen { page_size: geo.page_size, page_count: geo.page_count })?;
    let s = u64::try_from(s)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| Fault(format!("{} returned {s}", sys::policy_exports::RA_OPEN)))?;
    *id = Some((generation, s));
    Ok(s)
}

impl ReadAheadStream for PluginStream {
    fn on_read(&mut self, read: ReadInfo) -> Advice {
        let default = self.fallback.on_read(read);
        let PluginStream { host, geo, id, out, .. } = self;
        let mine = host.call(|g, generation| {
            let stream = stream_id(id, *geo, g, generation)?;
            let n =
                g.policy(PolicyCall::RaRead { stream, offset: read.offset, size: read.size, at_ns: read.at_ns, out })?;
            if n < 0 {
                return Err(Fault(format!("{} returned {n}", sys::policy_exports::RA_READ)));
            }
            sys::decode_advice(out)
                .ok_or_else(|| Fault(format!("{} answered advice that does not decode", sys::policy_exports::RA_READ)))
        });
        mine.unwrap_or(default)
    }

    fn reset_cache(&mut self, geometry: Geometry) {
        self.fallback.reset_cache(geometry);
        self.geo = geometry;
        let Some((era, stream)) = self.id else { return };
        self.host.call(|g, generation| {
            if era != generation {
                return Ok(());
            }
            let r = g.policy(PolicyCall::RaReset {
                stream,
                page_size: geometry.page_size,
                page_count: geometry.page_count,
            })?;
            if r < 0 { Err(Fault(format!("{} returned {r}", sys::policy_exports::RA_RESET))) } else { Ok(()) }
        });
    }

    fn close(&mut self) {
        self.fallback.close();
        let Some((era, stream)) = self.id.take() else { return };
        self.host.call(
            |g, generation| if era == generation { g.policy(PolicyCall::RaClose { stream }).map(drop) } else { Ok(()) },
        );
    }
}

/// A lock-contention policy from a module.
struct PluginLock {
    host: Arc<PolicyHost>,
    interest: Interest,
    fallback: Arc<dyn LockContentionPolicy>,
}

impl PluginLock {
    fn new(host: Arc<PolicyHost>) -> Result<PluginLock, String> {
        let fallback =
            lock_contention::builtin(lock_contention::DEFAULT).ok_or("no built-in default lock-contention policy")?;
        let bits = host
            .call(|g, _| g.policy(PolicyCall::LockInterest))
            .filter(|b| *b >= 0)
            .ok_or_else(|| format!("{}: {} failed", host.label, sys::policy_exports::LOCK_INTEREST))?;
        // The default's counts too, so that it can take over at any time.
        let (mine, theirs) = (sys::interest_from_bits(bits as i32), fallback.interest());
        let interest = Interest {
            inodelk_count: mine.inodelk_count || theirs.inodelk_count,
            open_fd_count: mine.open_fd_count || theirs.open_fd_count,
        };
        Ok(PluginLock { host, interest, fallback })
    }
}

impl LockContentionPolicy for PluginLock {
    fn name(&self) -> &str {
        &self.host.label
    }

    fn interest(&self) -> Interest {
        self.interest
    }

    fn decide(&self, event: LockEvent, view: &LockView) -> Decision {
        let mut msg = Vec::with_capacity(sys::LOCK_VIEW_LEN);
        sys::encode_lock_view(view, &mut msg);
        let mine = self.host.call(|g, _| {
            let v = g.policy(PolicyCall::LockDecide { event: u32::from(event.code()), view: &msg })?;
            sys::decode_decision(v).ok_or_else(|| Fault(format!("{} returned {v}", sys::policy_exports::LOCK_DECIDE)))
        });
        mine.unwrap_or_else(|| self.fallback.decide(event, view))
    }
}
