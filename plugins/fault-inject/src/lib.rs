//! `fault-inject`: fails chosen fops at a chosen rate, like GlusterFS's
//! debug/error-gen, as a plugin: a chosen fop fails with `error-no`
//! (without reaching the child) `failure` percent of the time; everything
//! else passes through with a tail wind. The draws come from a xorshift
//! generator seeded by `seed` (0: from the host clock), so a run with a
//! fixed seed fails the same fops every time.
//!
//! Plugin ABI v1.2: `xlfs status --dump` shows its counters (`fops-seen`,
//! `fops-failed`) and settings, and a volfile reload that changes `fops`,
//! `failure` or `error-no` applies them in place, counters and draws kept
//! (`seed` is only read at init: changing it alone changes nothing).
//!
//! Plugin ABI v1.4 placement `cluster`: added to a volume by a
//! `plugin.NAME` key, it sits below the performance translators, so its
//! faults look to them as the bricks' own (a cached answer is not failed).

use xlfs_sdk::guest::{Cx, Host, Placement, Plugin};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{Errno, FopKind, OptType, OptionDecl, Options, Request};

/// The plugin: one instance per graph node.
pub struct FaultInject {
    /// Fops that may fail; empty: every fop.
    fops: Vec<FopKind>,
    /// Failure probability in parts per million.
    ppm: u64,
    errno: Errno,
    rng: u64,
    /// Fops that entered the plugin.
    seen: u64,
    /// Fops it failed.
    failed: u64,
}

/// What `fops`, `failure` and `error-no` say: (fops, ppm, errno).
fn settings(options: &Options) -> Result<(Vec<FopKind>, u64, Errno), String> {
    let mut fops = Vec::new();
    for name in options.list("fops").unwrap_or_default() {
        fops.push(FopKind::from_name(name).ok_or_else(|| format!("option 'fops': unknown fop '{name}'"))?);
    }
    let name = options.str("error-no").unwrap_or("EIO");
    let errno = Errno::from_name(name).ok_or_else(|| format!("option 'error-no': unknown errno '{name}'"))?;
    let ppm = (options.percent("failure").unwrap_or(10.0) * 10_000.0) as u64;
    Ok((fops, ppm, errno))
}

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("fops", OptType::List).desc(
        "Fops that may fail (names as FOP statistics show them, e.g. WRITE,MKDIR); empty: all. Changes in place on a reload.",
    ),
    OptionDecl::new("failure", OptType::Percent)
        .default("10%")
        .range(0.0, 100.0)
        .desc("How often a chosen fop fails. Changes in place on a reload."),
    OptionDecl::new("error-no", OptType::Str)
        .default("EIO")
        .desc("The errno a failed fop gets, by name (EIO, ENOSPC, EROFS...). Changes in place on a reload."),
    OptionDecl::new("seed", OptType::Int)
        .default("0")
        .range(0.0, 9.0e15)
        .desc("Seed of the draws; 0 seeds from the clock. Read at init only: a reload keeps the draws going."),
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
    const PLACEMENT: Placement = Placement::Cluster;
    const OPTIONS: &'static [OptionDecl] = OPTIONS;

    fn init(host: Host, options: &Options) -> Result<Self, String> {
        let (fops, ppm, errno) = settings(options)?;
        let seed = options.int("seed").unwrap_or(0) as u64;
        let rng = if seed == 0 { host.now_ns() } else { seed } | 1;
        Ok(FaultInject { fops, ppm, errno, rng, seen: 0, failed: 0 })
    }

    fn fop(&mut self, cx: &mut Cx<'_, ()>, req: Request) {
        self.seen += 1;
        if self.draw(req.fop.kind()) {
            self.failed += 1;
            return cx.unwind(Err(self.errno));
        }
        if let Err(e) = cx.forward(&req) {
            cx.unwind(Err(e));
        }
    }

    fn dump(&self, out: &mut Vec<(String, String)>) {
        let fops: Vec<&str> = self.fops.iter().map(|k| k.name()).collect();
        out.push(("fops-seen".into(), self.seen.to_string()));
        out.push(("fops-failed".into(), self.failed.to_string()));
        out.push(("fops".into(), if fops.is_empty() { "(all)".into() } else { fops.join(",") }));
        out.push(("failure-ppm".into(), self.ppm.to_string()));
        out.push(("error-no".into(), self.errno.name().unwrap_or("?").into()));
    }

    fn reconfigure(&mut self, options: &Options) -> Result<(), ReconfigureError> {
        // All or nothing: every value is checked before any is applied.
        let (fops, ppm, errno) = settings(options).map_err(ReconfigureError::Invalid)?;
        (self.fops, self.ppm, self.errno) = (fops, ppm, errno);
        Ok(())
    }
}

xlfs_sdk::export_plugin!(FaultInject);

#[cfg(test)]
mod tests {
    use super::*;

    fn fi(fops: Vec<FopKind>, ppm: u64) -> FaultInject {
        FaultInject { fops, ppm, errno: Errno::EIO, rng: 42, seen: 0, failed: 0 }
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

    fn options(pairs: &[(&str, &str)]) -> Options {
        Options::resolve(OPTIONS, pairs.iter().copied()).expect("valid options")
    }

    #[test]
    fn reconfigure_applies_all_or_nothing_and_keeps_the_counters() {
        let mut p = fi(Vec::new(), 0);
        p.seen = 7;
        p.reconfigure(&options(&[("fops", "MKDIR"), ("failure", "100%"), ("error-no", "ENOSPC")])).expect("applies");
        assert_eq!((p.fops.as_slice(), p.ppm, p.errno, p.seen), (&[FopKind::Mkdir][..], 1_000_000, Errno::ENOSPC, 7));
        let e = p.reconfigure(&options(&[("failure", "0%"), ("error-no", "EBOGUS")])).expect_err("refused");
        assert!(matches!(&e, ReconfigureError::Invalid(m) if m == "option 'error-no': unknown errno 'EBOGUS'"), "{e}");
        assert_eq!((p.ppm, p.errno), (1_000_000, Errno::ENOSPC), "nothing applied");
        let mut out = Vec::new();
        p.dump(&mut out);
        assert_eq!(out[0], ("fops-seen".to_string(), "7".to_string()));
        assert!(out.contains(&("error-no".to_string(), "ENOSPC".to_string())), "{out:?}");
    }
}
