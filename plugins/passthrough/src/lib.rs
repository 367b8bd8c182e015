//! `passthrough`: winds every fop to its child and unwinds the child's
//! result unchanged. Every fop enters the guest and every reply comes back
//! through it (unless `tail` is on), so the whole plugin ABI round trip is
//! exercised; WRITE and READ data pass as host buffer handles, never copied.
//! With `delay-ms`, each fop is first held for that long on a host timer.

use std::collections::BTreeMap;

use xlfs_sdk::guest::{Buf, Ctl, Cx, Host, Plugin, TimerId};
use xlfs_sdk::{OptType, OptionDecl, Options, Request};

/// A fop held until its timer fires.
#[derive(Default)]
pub struct Held {
    req: Option<Request>,
    data: Option<Buf>,
}

/// The plugin: one instance per graph node.
pub struct Passthrough {
    tail: bool,
    delay_ms: u64,
    /// Held frames by timer.
    timers: BTreeMap<u64, u64>,
}

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("tail", OptType::Bool)
        .default("off")
        .desc("Pass fops on with tail winds: the child's result goes straight up without re-entering the plugin."),
    OptionDecl::new("delay-ms", OptType::Int)
        .default("0")
        .range(0.0, 60000.0)
        .desc("Hold each fop this many milliseconds (on a host timer) before passing it on."),
];

impl Passthrough {
    fn pass(&self, cx: &mut Cx<'_, Held>, req: &Request, data: Option<&Buf>) {
        let wound = if self.tail { cx.forward_to(0, req, data) } else { cx.wind(0, req, data).map(drop) };
        if let Err(e) = wound {
            cx.unwind(Err(e));
        }
    }
}

impl Plugin for Passthrough {
    type Frame = Held;
    const NAME: &'static str = "passthrough";
    const DESCRIPTION: &'static str = "winds every fop to its child and unwinds the result unchanged";
    const OPTIONS: &'static [OptionDecl] = OPTIONS;

    fn init(_host: Host, options: &Options) -> Result<Self, String> {
        let delay_ms = u64::try_from(options.int("delay-ms").unwrap_or(0)).map_err(|e| e.to_string())?;
        Ok(Passthrough { tail: options.bool("tail").unwrap_or(false), delay_ms, timers: BTreeMap::new() })
    }

    fn fop(&mut self, cx: &mut Cx<'_, Held>, req: Request) {
        if self.delay_ms == 0 {
            return self.pass(cx, &req, None);
        }
        match cx.host().set_timer(self.delay_ms) {
            Ok(t) => {
                self.timers.insert(t.0, cx.frame());
                let data = cx.take_data();
                *cx.state() = Held { req: Some(req), data };
            }
            Err(e) => cx.unwind(Err(e)),
        }
    }

    fn timer(&mut self, ctl: &mut Ctl<'_, Held>, timer: TimerId) {
        let Some(frame) = self.timers.remove(&timer.0) else { return };
        let Some(held) = ctl.state(frame).map(std::mem::take) else { return };
        let Some(req) = held.req else { return };
        // A tail wind is not available outside the frame's own handlers:
        // wind, and let the default reply handler unwind.
        if let Err(e) = ctl.wind(frame, 0, &req, held.data.as_ref()) {
            let _ = ctl.unwind(frame, Err(e), None);
        }
    }
}

xlfs_sdk::export_plugin!(Passthrough);
