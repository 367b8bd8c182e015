//! The host functions a plugin's guest calls (the `xlfs_host_*` imports of
//! a WebAssembly module, the vtable of a native one), on [`HostCtx`].

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::guest::sys;
use xlfs_sdk::{Errno, FdId, Gfid};

use super::{Core, neg};

/// Longest log line kept from a guest, in bytes.
const MAX_LOG: usize = 4096;
/// Log lines a plugin node may write per second, on average...
const LOG_RATE: f64 = 100.0;
/// ...and at once.
const LOG_BURST: f64 = 200.0;

/// A token bucket over a node's log lines.
pub(crate) struct LogBudget {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl Default for LogBudget {
    fn default() -> LogBudget {
        LogBudget { tokens: LOG_BURST, at: Instant::now(), dropped: 0 }
    }
}

impl LogBudget {
    /// Whether a line may be written now; when it may after some were
    /// dropped, how many were.
    fn take(&mut self) -> Result<u64, ()> {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * LOG_RATE).min(LOG_BURST);
        self.at = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return Err(());
        }
        self.tokens -= 1.0;
        Ok(std::mem::take(&mut self.dropped))
    }
}

/// A guest's log text as one line: control characters (a newline that
/// would start a forged host line, terminal escapes) shown escaped.
fn one_line(msg: &str) -> std::borrow::Cow<'_, str> {
    if !msg.chars().any(char::is_control) {
        return msg.into();
    }
    msg.chars()
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .collect::<String>()
        .into()
}

/// What host functions act on: one node (or, while a module is being
/// described, no node). WebAssembly stores hold it; a native guest gets a
/// pointer to it as its vtable's `ctx`.
pub(crate) struct HostCtx {
    pub(super) label: String,
    pub(super) core: Weak<Core>,
    pub(super) declared: Mutex<Option<Vec<u8>>>,
    pub(super) last_error: Mutex<Option<String>>,
    /// Bounds the node's log ([`LOG_RATE`] lines a second).
    pub(super) log_budget: Mutex<LogBudget>,
}

impl HostCtx {
    /// A context for `xlfs_describe`: only `declare` and `log` work.
    pub(crate) fn describing(label: String) -> Arc<HostCtx> {
        Arc::new(HostCtx {
            label,
            core: Weak::new(),
            declared: Mutex::new(None),
            last_error: Mutex::new(None),
            log_budget: Mutex::default(),
        })
    }

    /// What the guest declared.
    pub(crate) fn take_declared(&self) -> Option<Vec<u8>> {
        self.declared.lock().take()
    }

    /// `why`, with the guest's last error log line if it logged one.
    pub(crate) fn with_last_error(&self, why: String) -> String {
        match self.last_error.lock().take() {
            Some(e) => format!("{why} (plugin said: {e})"),
            None => why,
        }
    }

    fn core(&self) -> Result<Arc<Core>, Errno> {
        self.core.upgrade().ok_or(Errno::EPERM)
    }

    pub(crate) fn wind(&self, frame: u64, child: u32, flags: u32, msg: &[u8], payload: u32) -> i64 {
        self.core().map_or_else(neg, |c| c.wind(frame, child, flags, msg, payload))
    }

    /// A wind or unwind for `frame` whose message the guest pointed
    /// outside its memory: refused with EFAULT, and the frame fails now
    /// (the guest may not unwind it at all).
    pub(crate) fn bad_pointer(&self, frame: u64, what: &str) -> i32 {
        if frame != 0
            && let Ok(c) = self.core()
        {
            c.fail_frame(frame, &format!("{what} with a message outside the plugin's memory"));
        }
        -Errno::EFAULT.0
    }

    pub(crate) fn unwind(&self, frame: u64, msg: &[u8], payload: u32) -> i32 {
        self.core().map_or_else(|e| -e.0, |c| c.unwind(frame, msg, payload))
    }

    pub(crate) fn timer_set(&self, delay_ms: u64) -> i64 {
        self.core().map_or_else(neg, |c| c.timer_set(delay_ms))
    }

    pub(crate) fn timer_cancel(&self, id: u64) -> i32 {
        self.core().map_or_else(|e| -e.0, |c| c.timer_cancel(id))
    }

    pub(crate) fn inode_ctx_get(&self, gfid: [u8; 16]) -> Option<u64> {
        self.core().ok()?.inode_ctx.get(&Gfid(gfid))
    }

    pub(crate) fn inode_ctx_set(&self, gfid: [u8; 16], value: u64) -> i32 {
        match self.core().and_then(|c| c.inode_ctx.insert(Gfid(gfid), value)) {
            Ok(_) => 0,
            Err(e) => -e.0,
        }
    }

    pub(crate) fn inode_ctx_del(&self, gfid: [u8; 16]) -> i32 {
        match self.core() {
            Ok(c) => c.inode_ctx.remove(&Gfid(gfid)).map_or(-Errno::ENOENT.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn fd_ctx_get(&self, fd: u64) -> Option<u64> {
        self.core().ok()?.fd_ctx.get(&FdId(fd))
    }

    pub(crate) fn fd_ctx_set(&self, fd: u64, value: u64) -> i32 {
        match self.core().and_then(|c| c.fd_ctx.insert(FdId(fd), value)) {
            Ok(_) => 0,
            Err(e) => -e.0,
        }
    }

    pub(crate) fn fd_ctx_del(&self, fd: u64) -> i32 {
        match self.core() {
            Ok(c) => c.fd_ctx.remove(&FdId(fd)).map_or(-Errno::ENOENT.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn log(&self, level: u32, msg: &[u8]) {
        let raw = String::from_utf8_lossy(&msg[..msg.len().min(MAX_LOG)]);
        let msg = one_line(&raw);
        let node = &self.label;
        if level == sys::log_level::ERROR {
            *self.last_error.lock() = Some(msg.to_string());
        }
        let dropped = match self.log_budget.lock().take() {
            Ok(d) => d,
            Err(()) => return,
        };
        if dropped > 0 {
            tracing::warn!(target: "xlfs::plugin", %node, "{dropped} log lines of this plugin dropped (over {LOG_RATE} a second)");
        }
        match level {
            sys::log_level::ERROR => tracing::error!(target: "xlfs::plugin", %node, "{msg}"),
            sys::log_level::WARN => tracing::warn!(target: "xlfs::plugin", %node, "{msg}"),
            sys::log_level::INFO => tracing::info!(target: "xlfs::plugin", %node, "{msg}"),
            sys::log_level::DEBUG => tracing::debug!(target: "xlfs::plugin", %node, "{msg}"),
            _ => tracing::trace!(target: "xlfs::plugin", %node, "{msg}"),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The bytes behind a handle.
    pub(crate) fn buf(&self, h: u32) -> Result<Bytes, Errno> {
        self.core()?.bufs.lock().get(h).ok_or(Errno::EBADF)
    }

    pub(crate) fn buf_len(&self, h: u32) -> i64 {
        self.buf(h).map_or_else(neg, |b| b.len() as i64)
    }

    pub(crate) fn buf_new(&self, bytes: &[u8]) -> i64 {
        self.buf_insert(Bytes::copy_from_slice(bytes))
    }

    fn buf_insert(&self, b: Bytes) -> i64 {
        match self.core().and_then(|c| c.bufs.lock().insert(b)) {
            Ok(h) => h as i64,
            Err(e) => neg(e),
        }
    }

    pub(crate) fn buf_slice(&self, h: u32, offset: u64, len: u64) -> i64 {
        match self.buf(h) {
            Ok(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)).min(b.len());
                self.buf_insert(b.slice(start..end))
            }
            Err(e) => neg(e),
        }
    }

    pub(crate) fn buf_free(&self, h: u32) -> i32 {
        match self.core() {
            Ok(c) => c.bufs.lock().remove(h).map_or(-Errno::EBADF.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn declare(&self, msg: &[u8]) -> i32 {
        if self.core.strong_count() > 0 {
            return -Errno::EPERM.0;
        }
        if msg.len() > sys::MAX_DESCRIPTOR {
            return -Errno::E2BIG.0;
        }
        let mut d = self.declared.lock();
        if d.is_some() {
            return -Errno::EEXIST.0;
        }
        *d = Some(msg.to_vec());
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_log_text_stays_one_line_and_is_held_to_a_rate() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(one_line("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        let mut b = LogBudget::default();
        let kept = (0..10_000).filter(|_| b.take().is_ok()).count();
        assert!((LOG_BURST as usize..LOG_BURST as usize + 50).contains(&kept), "{kept}");
    }
}
