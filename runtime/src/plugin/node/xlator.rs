//! A plugin node as the graph sees it: [`PluginXlator`], the [`Xlator`]
//! that passes fops the plugin does not want straight to child 0, plus the
//! node's dump (the host's counters, then the plugin's `xlfs_dump` pairs) and
//! reconfigure (the plugin's own options, given in place through
//! `xlfs_reconfigure`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use xlfs_sdk::abi;
use xlfs_sdk::guest::sys;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{CallCtx, Dict, Errno, Event, EventFrom, Fop, FopFuture, Options, Request, Xlator};

use super::Core;
use crate::plugin::Kind;

/// The plugin's own options in `options` (those the volfile sets, not the
/// host's), as the Dict of Str values `xlfs_init` and `xlfs_reconfigure` get.
pub(crate) fn plugin_options(kind: Kind, options: &Options) -> Vec<u8> {
    let mut mine = Dict::new();
    for (k, v, set) in options.iter() {
        if set && !kind.host_options().iter().any(|h| h.matches(k)) {
            mine.set_str(k.to_string(), v.to_string());
        }
    }
    let mut msg = Vec::new();
    abi::encode(&mine, &mut msg);
    msg
}

impl Core {
    /// New options for the node ([`Xlator::reconfigure`]): given in place
    /// to the instance through `xlfs_reconfigure` (ABI v1.2) when only the
    /// plugin's own options changed and the module exports it; otherwise
    /// [`ReconfigureError::Unsupported`] (the graph builds a new node).
    /// Checked against the module's declarations first, as at init. A
    /// refusal (or a crash) leaves the old options in force: a restarted
    /// instance gets them too.
    pub(super) fn reconfigure(&self, new: &Options) -> Result<(), ReconfigureError> {
        if !self.loaded.node_exports.reconfigure {
            return Err(ReconfigureError::Unsupported);
        }
        {
            let old = self.options.lock();
            if self.loaded.kind.host_options().iter().any(|h| old.get(h.name) != new.get(h.name)) {
                // module, limits: the host's own options need a new node.
                return Err(ReconfigureError::Unsupported);
            }
        }
        let given: Vec<(String, String)> =
            new.iter().filter(|(_, _, set)| *set).map(|(k, v, _)| (k.to_string(), v.to_string())).collect();
        Options::resolve(self.loaded.decls, given.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| ReconfigureError::Invalid(e.to_string()))?;
        let msg = plugin_options(self.loaded.kind, new);
        let r = self.with_guest(None, |g, _| {
            let code = g.reconfigure(&msg)?;
            // The plugin logs why before refusing (under the slot lock,
            // so this is this call's line).
            let said = if code < 0 { self.host.last_error.lock().take() } else { None };
            Ok((code, said))
        });
        match r {
            Ok((sys::HANDLER_OK, _)) => {
                *self.init_msg.lock() = msg;
                *self.options.lock() = new.clone();
                self.reconfigures.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "xlfs::plugin", node = %self.name, "plugin took its new options in place");
                Ok(())
            }
            Ok((sys::RECONFIGURE_UNSUPPORTED, _)) => Err(ReconfigureError::Unsupported),
            Ok((code, said)) => Err(ReconfigureError::Invalid(said.unwrap_or_else(|| {
                format!("{} refused them ({})", sys::node_exports::RECONFIGURE, Errno(code.saturating_neg()))
            }))),
            // A disabled plugin stays so until its node is rebuilt: let
            // the reload rebuild it with the new options.
            Err(_) if self.slot.lock().disabled => Err(ReconfigureError::Unsupported),
            Err(e) => Err(ReconfigureError::Invalid(format!(
                "{} failed ({e}): the plugin crashed, see the log; its old options stay",
                sys::node_exports::RECONFIGURE
            ))),
        }
    }

    /// The instance's own dump pairs (ABI v1.2), if it runs and reports
    /// any. A crash while dumping is handled as any other.
    fn guest_dump(&self) -> Vec<(String, String)> {
        if !self.loaded.node_exports.dump {
            return Vec::new();
        }
        let mut slot = self.slot.lock();
        if slot.shut || slot.disabled {
            return Vec::new();
        }
        let Some(guest) = slot.guest.as_mut() else { return Vec::new() };
        self.host.last_error.lock().take();
        let bytes = match guest.dump() {
            Ok(Some(b)) => b,
            Ok(None) => return Vec::new(),
            Err(fault) => {
                self.crash(&mut slot, fault);
                return Vec::new();
            }
        };
        drop(slot);
        match sys::decode_dump(&bytes) {
            Ok(pairs) => pairs,
            Err(e) => {
                tracing::warn!(target: "xlfs::plugin", node = %self.name, "plugin dumped garbage ({e}): left out");
                Vec::new()
            }
        }
    }
}

/// A plugin node as the graph sees it.
pub(crate) struct PluginXlator {
    pub(crate) core: Arc<Core>,
}

impl Xlator for PluginXlator {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let core = &self.core;
        // The host keeps context slots for the guest: drop them when the
        // inode or fd goes, whether or not the guest sees the fop.
        match &req.fop {
            Fop::Forget { gfid } => {
                core.inode_ctx.remove(gfid);
            }
            Fop::Release { fd } | Fop::Releasedir { fd } => {
                core.fd_ctx.remove(&fd.id);
            }
            _ => {}
        }
        // The frame's future itself, or the child's: no future around
        // either (it would be moved and polled once more per fop).
        if core.desc().fops.contains(req.fop.kind()) {
            return Box::pin(core.run_fop(ctx, req));
        }
        core.passed.fetch_add(1, Ordering::Relaxed);
        match core.children.first() {
            Some(c) => c.call(ctx, req),
            None => Box::pin(std::future::ready(Err(Errno::ENOSYS))),
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        let core = &self.core;
        // A leaf plugin cannot say ChildUp itself in ABI v1.0; the host
        // does it for it.
        if core.children.is_empty() && from == EventFrom::Graph {
            match event {
                Event::ParentUp => core.sink.send(Event::ChildUp),
                Event::ParentDown => core.sink.send(Event::ChildDown),
                _ => {}
            }
        }
        let default = || match from {
            EventFrom::Child(_) => Some(event.clone()),
            EventFrom::Graph => None,
        };
        if !core.desc().events.contains(&event) {
            return default();
        }
        let from_code = match from {
            EventFrom::Child(i) => i32::try_from(i).unwrap_or(i32::MAX),
            EventFrom::Graph => sys::FROM_GRAPH,
        };
        let mut msg = Vec::new();
        abi::encode(&event, &mut msg);
        match core.with_guest(None, |g, _| g.on_event(from_code, &msg)) {
            Ok(true) => Some(event),
            Ok(false) => None,
            Err(_) => default(),
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        self.core.reconfigure(options)
    }

    /// The host's counters for the node, then the plugin's own pairs
    /// (ABI v1.2 `xlfs_dump`), each key prefixed with the plugin's name.
    fn dump(&self) -> Vec<(String, String)> {
        let core = &self.core;
        let slot = core.slot.lock();
        let l = &core.loaded;
        let mut out = vec![
            ("plugin.module".into(), l.path.display().to_string()),
            ("plugin.engine".into(), l.kind.type_name().into()),
            ("plugin.name".into(), l.desc.name.clone()),
            ("plugin.abi".into(), l.version.to_string()),
            ("plugin.frames-in-flight".into(), core.frames.lock().len().to_string()),
            ("plugin.calls-in-flight".into(), core.calls.load(Ordering::Relaxed).to_string()),
            ("plugin.buffer-bytes".into(), core.bufs.lock().bytes().to_string()),
            ("plugin.fops-entered".into(), core.entered.load(Ordering::Relaxed).to_string()),
            ("plugin.fops-passed-through".into(), core.passed.load(Ordering::Relaxed).to_string()),
            ("plugin.crashes".into(), slot.total_crashes.to_string()),
            ("plugin.disabled".into(), slot.disabled.to_string()),
            ("plugin.instances".into(), core.instances.load(Ordering::Relaxed).to_string()),
            ("plugin.reconfigures".into(), core.reconfigures.load(Ordering::Relaxed).to_string()),
            ("plugin.modules-loaded".into(), crate::plugin::modules_loaded().to_string()),
        ];
        drop(slot);
        let name = &l.desc.name;
        out.extend(core.guest_dump().into_iter().map(|(k, v)| (format!("{name}.{k}"), v)));
        out
    }

    fn fini(&self) {
        self.core.shutdown();
    }
}
