//! The panic guard: every handler runs inside [`guard`], which (natively)
//! turns a panic into the handler's failure code, logged through the host;
//! the panic hook `init` installs records where the panic happened.

use crate::guest::host::Host;

/// Runs a handler: natively, a panic is caught, logged through the host
/// and turned into `failed`; on WebAssembly a panic traps (after the hook
/// installed by `init` logged it).
pub(in crate::guest) fn guard<R>(host: Host, failed: R, f: impl FnOnce() -> R) -> R {
    #[cfg(target_family = "wasm")]
    {
        let _ = (host, &failed);
        f()
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let outer = IN_GUARD.with(|g| g.replace(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        IN_GUARD.with(|g| g.set(outer));
        match r {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                let at = PANIC_AT.with(|p| p.take()).unwrap_or_default();
                host.error(&format!("plugin panicked: {msg}{at}"));
                failed
            }
        }
    }
}

#[cfg(not(target_family = "wasm"))]
thread_local! {
    /// True while [`guard`] runs a handler on this thread.
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last panic inside [`guard`] happened, for its log line.
    static PANIC_AT: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// Natively, panics in handlers are caught by [`guard`] and logged through
/// the host; this hook keeps their location and prints nothing for them.
/// Any other panic goes to the hook that was there before (a cdylib has its
/// own std, but a plugin linked as an rlib shares the host's).
#[cfg(not(target_family = "wasm"))]
pub(super) fn install_panic_hook() {
    use std::sync::Once;
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_GUARD.with(|g| g.get()) {
                let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line()));
                PANIC_AT.with(|p| p.set(at));
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(target_family = "wasm")]
pub(super) fn install_panic_hook() {
    use std::sync::Once;
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // On WebAssembly the host functions are imports: no vtable needed.
        std::panic::set_hook(Box::new(|info| {
            let msg = info.payload_as_str().unwrap_or("(no message)");
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            Host::from_raw(std::ptr::null()).error(&format!("plugin panicked: {msg}{at}"))
        }));
    });
}
