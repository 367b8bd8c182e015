//! `first-translator`: the plugin of examples/first-translator. A
//! read-only gate: every fop that would change the volume fails with
//! EROFS, everything else passes through.

use xlfs_sdk::guest::{Cx, FopSet, Host, Plugin};
use xlfs_sdk::{Errno, OptType, OptionDecl, Options, Request};

/// The plugin: one instance per graph node.
pub struct ReadOnly {
    errno: Errno,
}

impl Plugin for ReadOnly {
    type Frame = ();
    const NAME: &'static str = "first-translator";
    const DESCRIPTION: &'static str = "refuses every fop that changes the volume";
    // Only these fops enter the plugin; the host passes the rest on for free.
    const FOPS: FopSet = FopSet::MODIFYING;
    const OPTIONS: &'static [OptionDecl] =
        &[OptionDecl::new("quiet", OptType::Bool).default("off").desc("Fail with EPERM instead of EROFS.")];

    fn init(_host: Host, options: &Options) -> Result<Self, String> {
        let quiet = options.bool("quiet").unwrap_or(false);
        Ok(ReadOnly { errno: if quiet { Errno::EPERM } else { Errno::EROFS } })
    }

    fn fop(&mut self, cx: &mut Cx<'_, ()>, _req: Request) {
        cx.unwind(Err(self.errno));
    }
}

xlfs_sdk::export_plugin!(ReadOnly);
