//! `access-log`: logs one line per fop through the host's log: the fop,
//! what it named, the result and how long the child took, and how many fops
//! this node has seen on that inode (kept in the host's per-inode context,
//! which the host drops when the inode is forgotten). Child up and down
//! events are logged too.
//!
//! Plugin ABI v1.4 placement `cluster`: added to a volume by a
//! `plugin.NAME` key, it sits below the performance translators and logs
//! the traffic that reaches the bricks, not what the caches answered.

use xlfs_sdk::guest::{CallId, Cx, EventSet, Host, Placement, Plugin, sys::log_level};
use xlfs_sdk::{Event, EventFrom, FopKind, FopResult, OptType, OptionDecl, Options, Request};

/// What a frame remembers between its fop and its reply.
#[derive(Default)]
pub struct Pending {
    start_ns: u64,
    line: String,
}

/// The plugin: one instance per graph node.
pub struct AccessLog {
    /// Fops to log; empty for all.
    only: Vec<FopKind>,
    level: u32,
}

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("fops", OptType::List)
        .desc("Fops to log (names as FOP statistics show them, e.g. WRITE,READ); empty logs all."),
    OptionDecl::new("log-level", OptType::Enum(&["info", "debug"])).default("info").desc("Level of the access lines."),
];

impl Plugin for AccessLog {
    type Frame = Pending;
    const NAME: &'static str = "access-log";
    const DESCRIPTION: &'static str = "logs each fop with its result and latency";
    const PLACEMENT: Placement = Placement::Cluster;
    const OPTIONS: &'static [OptionDecl] = OPTIONS;
    const EVENTS: EventSet = EventSet::CHILD_UP.union(EventSet::CHILD_DOWN);

    fn init(_host: Host, options: &Options) -> Result<Self, String> {
        let mut only = Vec::new();
        for name in options.list("fops").unwrap_or_default() {
            only.push(FopKind::from_name(name).ok_or_else(|| format!("option 'fops': unknown fop '{name}'"))?);
        }
        let level = if options.str("log-level") == Some("debug") { log_level::DEBUG } else { log_level::INFO };
        Ok(AccessLog { only, level })
    }

    fn fop(&mut self, cx: &mut Cx<'_, Pending>, req: Request) {
        let kind = req.fop.kind();
        if !self.only.is_empty() && !self.only.contains(&kind) {
            if let Err(e) = cx.forward(&req) {
                cx.unwind(Err(e));
            }
            return;
        }
        let host = cx.host();
        let gfid = req.fop.gfid();
        let mut line = kind.name().to_string();
        if let Some(loc) = req.fop.loc() {
            line.push_str(&format!(" {}/{}", loc.parent, loc.name));
        }
        if !gfid.is_null() && kind != FopKind::Forget {
            let seen = host.inode_ctx(&gfid).unwrap_or(0) + 1;
            // A full table only costs the count.
            let _ = host.set_inode_ctx(&gfid, seen);
            line.push_str(&format!(" gfid={gfid} seen={seen}"));
        }
        if let Some(d) = cx.data() {
            line.push_str(&format!(" bytes={}", d.len()));
        }
        let start_ns = host.now_ns();
        *cx.state() = Pending { start_ns, line };
        if let Err(e) = cx.wind(0, &req, None) {
            cx.unwind(Err(e));
        }
    }

    fn reply(&mut self, cx: &mut Cx<'_, Pending>, _call: CallId, result: FopResult) {
        let host = cx.host();
        let us = host.now_ns().saturating_sub(cx.state().start_ns) / 1000;
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("{e:?}"),
        };
        let extra = cx.data().map(|d| format!(" read={}", d.len())).unwrap_or_default();
        host.log(self.level, &format!("access: {} -> {outcome}{extra} {us}us", cx.state().line));
        cx.unwind(result);
    }

    fn event(&mut self, host: Host, event: &Event, from: EventFrom) -> bool {
        host.log(self.level, &format!("access: event {event:?} from {from:?}"));
        matches!(from, EventFrom::Child(_))
    }
}

xlfs_sdk::export_plugin!(AccessLog);
