//! A misbehaving plugin for the hosts' fault tests. Fops on an entry whose
//! name starts with option `trigger` (default `evil`) make it misbehave as
//! option `mode` says; every other fop passes through (tail wind), so the
//! tests can check that the node keeps serving once the host has dealt with
//! the fault. Mode `init-trap` panics (traps) in init already, so the node
//! cannot be built at all. Modes `dump-trap` and `reconfigure-trap` panic
//! in the ABI v1.2 exports instead (`xlfs_dump`, `xlfs_reconfigure`), and
//! otherwise trap on a triggering fop. Modes `bad-errno` and `root-gfid`
//! answer a triggering fop with an errno the kernel refuses (600) or, for a
//! lookup, with the root's gfid; `empty-writes` answers every WRITE (on
//! any file) with an empty success, as if written. Mode `log-flood` logs
//! 100,000 warnings per triggering fop, each with a newline and a forged
//! host line, then passes the fop on. Mode `rewind-loop` winds a triggering
//! fop and winds again from every reply, never unwinding; `wind-flood`
//! winds it 1,000 times, ignoring refusals, and never unwinds. Mode
//! `hoard-writes` keeps the data of every WRITE (any file) and never frees
//! it, answering the write as done. `sibling-gfid` answers a lookup of
//! `evil-NAME` with what a lookup of its sibling `NAME` gets, so one inode
//! shows under two names.

use std::hint::black_box;

use xlfs_sdk::guest::{Buf, CallId, Cx, Host, Plugin};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{Errno, Fop, FopResult, Gfid, Iatt, Loc, OptType, OptionDecl, Options, Reply, Request, Response};

/// What to do on a triggering fop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Spin forever.
    Loop,
    /// Allocate memory until none is left.
    Alloc,
    /// Panic (a trap on WebAssembly, a caught panic natively).
    Trap,
    /// Unwind bytes that are not an encoded result.
    Garbage,
    /// Wind to a child index the node does not have.
    BadChild,
    /// Never unwind the frame.
    NoUnwind,
    /// Panic in `dump` (and trap on a triggering fop).
    DumpTrap,
    /// Panic in `reconfigure` (and trap on a triggering fop).
    ReconfigureTrap,
    /// Fail with errno 600, beyond what the kernel takes.
    BadErrno,
    /// Answer a lookup with the root's gfid.
    RootGfid,
    /// Answer every WRITE with an empty success.
    EmptyWrites,
    /// Log without bound, forging host lines.
    LogFlood,
    /// Wind again from every reply.
    RewindLoop,
    /// Wind 1,000 calls for one fop, ignoring refusals; never unwind.
    WindFlood,
    /// Keep every WRITE's data buffer for good.
    HoardWrites,
    /// Answer a lookup of `TRIGGER-NAME` with the lookup of `NAME`.
    SiblingGfid,
}

/// The plugin: one instance per graph node.
pub struct Hostile {
    mode: Mode,
    trigger: String,
    /// What `hoard-writes` keeps.
    hoard: Vec<Buf>,
}

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new(
        "mode",
        OptType::Enum(&[
            "loop",
            "alloc",
            "trap",
            "garbage",
            "bad-child",
            "no-unwind",
            "init-trap",
            "dump-trap",
            "reconfigure-trap",
            "bad-errno",
            "root-gfid",
            "empty-writes",
            "log-flood",
            "rewind-loop",
            "wind-flood",
            "hoard-writes",
            "sibling-gfid",
        ]),
    )
    .default("trap")
    .desc("How to misbehave on a triggering fop (or in init, dump, reconfigure). Changes in place on a reload."),
    OptionDecl::new("trigger", OptType::Str)
        .default("evil")
        .desc("Entry-name prefix that triggers the misbehaviour. Changes in place on a reload."),
];

impl Plugin for Hostile {
    type Frame = ();
    const NAME: &'static str = "hostile";
    const DESCRIPTION: &'static str = "misbehaves on purpose, for fault tests";
    const OPTIONS: &'static [OptionDecl] = OPTIONS;

    fn init(_host: Host, options: &Options) -> Result<Self, String> {
        if options.str("mode") == Some("init-trap") {
            panic!("hostile plugin: trap in init on purpose");
        }
        Ok(Hostile {
            mode: mode(options),
            trigger: options.str("trigger").unwrap_or("evil").to_string(),
            hoard: Vec::new(),
        })
    }

    fn dump(&self, out: &mut Vec<(String, String)>) {
        if self.mode == Mode::DumpTrap {
            panic!("hostile plugin: trap in dump on purpose");
        }
        out.push(("trigger".into(), self.trigger.clone()));
    }

    fn reconfigure(&mut self, options: &Options) -> Result<(), ReconfigureError> {
        if self.mode == Mode::ReconfigureTrap {
            panic!("hostile plugin: trap in reconfigure on purpose");
        }
        self.mode = mode(options);
        self.trigger = options.str("trigger").unwrap_or("evil").to_string();
        Ok(())
    }

    fn reply(&mut self, cx: &mut Cx<'_, ()>, _call: CallId, result: FopResult) {
        match self.mode {
            Mode::RewindLoop => {
                let _ = cx.wind(0, &Request::new(Fop::Stat { loc: Loc::root() }), None);
            }
            Mode::WindFlood => {}
            _ => cx.unwind(result),
        }
    }

    fn fop(&mut self, cx: &mut Cx<'_, ()>, req: Request) {
        if self.mode == Mode::EmptyWrites && matches!(req.fop, Fop::Writev { .. }) {
            cx.unwind(Ok(Response::from(Reply::Empty)));
            return;
        }
        if self.mode == Mode::HoardWrites && matches!(req.fop, Fop::Writev { .. }) {
            self.hoard.extend(cx.take_data());
            cx.unwind(Ok(Response::from(Reply::PrePost { pre: Iatt::default(), post: Iatt::default() })));
            return;
        }
        let triggered = req.fop.loc().is_some_and(|l| !self.trigger.is_empty() && l.name.starts_with(&self.trigger));
        if !triggered {
            if let Err(e) = cx.forward(&req) {
                cx.unwind(Err(e));
            }
            return;
        }
        match self.mode {
            Mode::Loop => {
                let mut n = 0u64;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            Mode::Alloc => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![0xa5; 1 << 20]));
                }
            }
            Mode::Trap | Mode::DumpTrap | Mode::ReconfigureTrap => panic!("hostile plugin: trap on purpose"),
            Mode::Garbage => {
                // A result tag of 7 does not exist.
                let _ = cx.unwind_encoded(&[7, 0xde, 0xad, 0xbe, 0xef], None);
            }
            Mode::BadChild => {
                // The host refuses and fails the frame; ignore its answer.
                let _ = cx.wind(7, &req, None);
            }
            Mode::NoUnwind | Mode::EmptyWrites | Mode::HoardWrites => {}
            Mode::BadErrno => cx.unwind(Err(Errno(600))),
            Mode::RewindLoop => {
                let _ = cx.wind(0, &req, None);
            }
            Mode::WindFlood => {
                for _ in 0..1000 {
                    let _ = cx.wind(0, &req, None);
                }
            }
            Mode::LogFlood => {
                let host = cx.host();
                for i in 0..100_000 {
                    host.warn(&format!("flood {i}\n2026-01-01T00:00:00Z  INFO xlfs: FORGED host line"));
                }
                if let Err(e) = cx.forward(&req) {
                    cx.unwind(Err(e));
                }
            }
            Mode::SiblingGfid => {
                let fwd = match &req.fop {
                    Fop::Lookup { loc } => {
                        let sibling = loc.name[self.trigger.len()..].trim_start_matches('-');
                        Request::new(Fop::Lookup { loc: Loc::entry(loc.parent, sibling) })
                    }
                    _ => req,
                };
                if let Err(e) = cx.forward(&fwd) {
                    cx.unwind(Err(e));
                }
            }
            Mode::RootGfid => {
                let iatt = Iatt { gfid: Gfid::ROOT, mode: libc_dir_mode(), nlink: 2, ..Iatt::default() };
                cx.unwind(Ok(Response::from(Reply::Entry { iatt, postparent: Iatt { gfid: Gfid::ROOT, ..iatt } })));
            }
        }
    }
}

/// The mode option (init-trap only matters at init).
fn mode(options: &Options) -> Mode {
    match options.str("mode").unwrap_or("trap") {
        "loop" => Mode::Loop,
        "alloc" => Mode::Alloc,
        "garbage" => Mode::Garbage,
        "bad-child" => Mode::BadChild,
        "no-unwind" => Mode::NoUnwind,
        "dump-trap" => Mode::DumpTrap,
        "reconfigure-trap" => Mode::ReconfigureTrap,
        "bad-errno" => Mode::BadErrno,
        "root-gfid" => Mode::RootGfid,
        "empty-writes" => Mode::EmptyWrites,
        "log-flood" => Mode::LogFlood,
        "rewind-loop" => Mode::RewindLoop,
        "wind-flood" => Mode::WindFlood,
        "hoard-writes" => Mode::HoardWrites,
        "sibling-gfid" => Mode::SiblingGfid,
        _ => Mode::Trap,
    }
}

/// A directory's mode bits (S_IFDIR | 0755), without libc on wasm32.
const fn libc_dir_mode() -> u32 {
    0o040_755
}

xlfs_sdk::export_plugin!(Hostile);
