//! `fault-inject`: fails chosen fops at a chosen rate, like GlusterFS's
//! debug/error-gen, as a plugin: a chosen fop fails with `error-no`
//! (without reaching the child) `failure` percent of the time; everything
//! else passes through with a tail wind. The draws come from a xorshift
//! generator seeded by `seed` (0: from the host clock), so a run with a
//! fixed seed fails the same fops every time.

use xlfs_sdk::guest::{Cx, Host, Plugin};
use xlfs_sdk::{Errno, FopKind, OptType, OptionDecl, Options, Request};

/// The plugin: one instance per graph node.
pub struct FaultInject {
    /// Fops that may fail; empty: every fop.
    fops: Vec<FopKind>,
    /// Failure probability in parts per million.
    ppm: u64,
    errno: Errno,
    rng: u64,
}

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("fops", OptType::List)
        .desc("Fops that may fail (names as FOP statistics show them, e.g. WRITE,MKDIR); empty: all."),
    OptionDecl::new("failure", OptType::Percent).default("10%").range(0.0, 100.0).desc("How often a chosen fop fails."),
    OptionDecl::new("error-no", OptType::Str)
        .default("EIO")
        .desc("The errno a failed fop gets, by name (EIO, ENOSPC, EROFS...)."),
    OptionDecl::new("seed", OptType::Int)
        .default("0")
        .range(0.0, 9.0e15)
        .desc("Seed of the draws; 0 seeds from the clock."),
];

impl FaultInject {
    /// True when this fop should fail now (one draw per chosen fop).
    pub fn draw(&mut self, kind: FopKind) -> bool {
        if !self.fops.is_empty() && !self.fops.contains(&kind) {
            return false;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 1_000_000 < self.ppm
    }
}

impl Plugin for FaultInject {
    type Frame = ();
    const NAME: &'static str = "fault-inject";
    const DESCRIPTION: &'static str = "fails chosen fops at a chosen rate";
    const OPTIONS: &'static [OptionDecl] = OPTIONS;

    fn init(host: Host, options: &Options) -> Result<Self, String> {
        let mut fops = Vec::new();
        for name in options.list("fops").unwrap_or_default() {
            fops.push(FopKind::from_name(name).ok_or_else(|| format!("option 'fops': unknown fop '{name}'"))?);
        }
        let name = options.str("error-no").unwrap_or("EIO");
        let errno = Errno::from_name(name).ok_or_else(|| format!("option 'error-no': unknown errno '{name}'"))?;
        let ppm = (options.percent("failure").unwrap_or(10.0) * 10_000.0) as u64;
        let seed = options.int("seed").unwrap_or(0) as u64;
        let rng = if seed == 0 { host.now_ns() } else { seed } | 1;
        Ok(FaultInject { fops, ppm, errno, rng })
    }

    fn fop(&mut self, cx: &mut Cx<'_, ()>, req: Request) {
        if self.draw(req.fop.kind()) {
            return cx.unwind(Err(self.errno));
        }
        if let Err(e) = cx.forward(&req) {
            cx.unwind(Err(e));
        }
    }
}

xlfs_sdk::export_plugin!(FaultInject);

#[cfg(test)]
mod tests {
    use super::*;

    fn fi(fops: Vec<FopKind>, ppm: u64) -> FaultInject {
        FaultInject { fops, ppm, errno: Errno::EIO, rng: 42 }
    }

    #[test]
    fn draws_follow_the_rate_and_the_chosen_fops() {
        let mut all = fi(Vec::new(), 1_000_000);
        assert!((0..100).all(|_| all.draw(FopKind::Stat)));
        let mut none = fi(Vec::new(), 0);
        assert!((0..100).all(|_| !none.draw(FopKind::Stat)));
        let mut half = fi(vec![FopKind::Writev], 500_000);
        assert!((0..100).all(|_| !half.draw(FopKind::Readv)));
        let failed = (0..10_000).filter(|_| half.draw(FopKind::Writev)).count();
        assert!((4_500..5_500).contains(&failed), "{failed}");
    }
}
