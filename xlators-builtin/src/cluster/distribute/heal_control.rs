//! Replicate's heal control (`xlfs heal`, `volume heal`, the self-heal
//! daemon) through distribute: a heal run or a gfid's heal on the root,
//! and heal info, go to every subvolume (each replica set heals its own
//! copies), and their answers are merged: counts summed, reports and
//! info joined. A subvolume that cannot answer is named in the report and
//! counted as failed; the whole fails only when none answers.

use xlfs_sdk::dict::keys::{
    HEAL_FAILED, HEAL_GFID, HEAL_HEALED, HEAL_INFO, HEAL_REMAINING, HEAL_REPORT, HEAL_RUN, HEAL_SPLIT_BRAIN,
};
use xlfs_sdk::{CallCtx, Dict, Errno, Fop, FopResult, Gfid, Reply, Request, Response};

use super::Inner;

/// True for a heal control fop on the root (see the module doc).
pub(super) fn is_heal_control(fop: &Fop) -> bool {
    match fop {
        Fop::Setxattr { loc, xattrs, .. } => {
            loc.gfid == Gfid::ROOT && !loc.is_entry() && (xattrs.contains(HEAL_RUN) || xattrs.contains(HEAL_GFID))
        }
        Fop::Getxattr { name, .. } => name == HEAL_INFO,
        _ => false,
    }
}

impl Inner {
    /// A heal control fop, sent to every subvolume; the answers merged.
    pub(super) async fn heal_control(&self, ctx: &CallCtx, req: Request) -> FopResult {
        let info = matches!(req.fop, Fop::Getxattr { .. });
        let res = self.fan(&self.all(), ctx, &req).await;
        if res.iter().all(Result::is_err) {
            return Err(res.iter().find_map(|r| r.as_ref().err().copied()).unwrap_or(Errno::ENOTCONN));
        }
        if info {
            let text: String = res
                .iter()
                .filter_map(|r| match r {
                    Ok(Response { reply: Reply::Xattrs(d), .. }) => d.get_str(HEAL_INFO).map(str::to_string),
                    _ => None,
                })
                .collect();
            let failed: String = self.unanswered(&res).map(|(name, e)| format!("{name}: {e}\n")).collect();
            let mut d = Dict::new();
            d.set_bytes(HEAL_INFO, (text + &failed).into_bytes());
            return Ok(Reply::Xattrs(d).into());
        }
        let mut sums = [0u64; 4];
        let keys = [HEAL_HEALED, HEAL_FAILED, HEAL_SPLIT_BRAIN, HEAL_REMAINING];
        let mut report: Vec<String> = Vec::new();
        for rsp in res.iter().flatten() {
            for (s, k) in sums.iter_mut().zip(keys) {
                *s += rsp.xdata.get_u64(k).unwrap_or(0);
            }
            report.extend(rsp.xdata.get_str(HEAL_REPORT).filter(|r| !r.is_empty()).map(str::to_string));
        }
        for (name, e) in self.unanswered(&res) {
            sums[1] += 1;
            report.push(format!("{name}: {e}"));
        }
        let mut x = Dict::new();
        for (s, k) in sums.iter().zip(keys) {
            x.set_str(k, s.to_string());
        }
        x.set_str(HEAL_REPORT, report.join("\n"));
        Ok(Response { reply: Reply::Empty, xdata: x })
    }

    /// The subvolumes whose answer in `res` is an error, with it.
    fn unanswered<'a>(&'a self, res: &'a [FopResult]) -> impl Iterator<Item = (&'a str, Errno)> + 'a {
        res.iter().enumerate().filter_map(|(i, r)| r.as_ref().err().map(|e| (&*self.children[i].name, *e)))
    }
}
