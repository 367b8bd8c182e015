//! The result lines of ../shared/bench's workload scripts.
//!
//! Each script prints one line per phase, `LABEL: ... VALUE UNIT ...`:
//!
//! ```text
//! seq-write numjobs=1 size=512m: 402 MiB/s (fio), 380 MiB/s by wall clock (fio start to exit), 1.3 s
//! create n=5000: 5.20 s, 961 files/s
//! pgbench c=4 j=2 t=2000 default-pgconf: 512 TPS, latency 7.8 ms; -t 8000 would take ~62 s
//! ```
//!
//! The value kept is the one before `MiB/s by wall clock` (fio-seq), `files/s`
//! (smallfile) or `TPS` (pgbench), as benches/workloads/table.py does; higher
//! is better for all. The label also says how much work the phase did, which
//! turns the CPU seconds spent during it into a cost per unit of work.

/// What one phase did, to divide its CPU time by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Bytes moved (fio-seq): CPU seconds per GiB.
    Bytes(f64),
    /// Files handled (smallfile): CPU milliseconds per file.
    Files(f64),
    /// Transactions (pgbench): CPU milliseconds per transaction.
    Txns(f64),
}

impl Work {
    /// The CPU cost per unit of work, from CPU seconds.
    pub fn cost(self, cpu_s: f64) -> f64 {
        match self {
            Work::Bytes(b) => cpu_s / (b / (1u64 << 30) as f64),
            Work::Files(n) => cpu_s * 1000.0 / n,
            Work::Txns(n) => cpu_s * 1000.0 / n,
        }
    }

    /// How much work, in the unit of the phase's rate: MiB, files or
    /// transactions (so the amount over the rate is the phase's seconds).
    pub fn amount(self) -> f64 {
        match self {
            Work::Bytes(b) => b / (1u64 << 20) as f64,
            Work::Files(n) | Work::Txns(n) => n,
        }
    }

    /// The unit of [`Work::cost`].
    pub fn cost_unit(self) -> &'static str {
        match self {
            Work::Bytes(_) => "CPU s/GiB",
            Work::Files(_) => "CPU ms/file",
            Work::Txns(_) => "CPU ms/txn",
        }
    }
}

/// One measured phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// The text before the first `: `, e.g. `create n=5000`.
    pub label: String,
    /// The measured rate.
    pub value: f64,
    /// Its unit: `MiB/s`, `files/s` or `TPS`.
    pub unit: &'static str,
    /// What the phase did, when the label says it.
    pub work: Option<Work>,
}

/// The number just before `marker` in `rest` (`"..., 961 files/s"`).
fn number_before(rest: &str, marker: &str) -> Option<f64> {
    let head = &rest[..rest.find(marker)?];
    head.trim_end().rsplit([' ', ',', '(']).next()?.parse().ok()
}

/// The value of `key=` in a label (`numjobs=4`), as text.
pub(crate) fn field<'a>(label: &'a str, key: &str) -> Option<&'a str> {
    label.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A size as fio and numfmt --from=iec take it: `512m`, `1g`, `4096`, `64K`.
pub fn parse_size(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => 1u64 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return None,
            };
            (&s[..i], m as f64)
        }
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|n| n * mult)
}

/// The label of the line xlfs-bench's remount wrapper prints
/// ([`timed_remount`]).
pub const REMOUNT_LABEL: &str = "remount+sync";

/// The remount command a workload script runs, timed, and followed by a
/// `sync`: it prints `remount+sync: SECONDS s` when done. A client that
/// answered early (write-behind, asynchronous directory operations) sends
/// what it kept at unmount, and a local disk writes its dirty pages at the
/// sync, so this is when a phase's work is on stable storage for every
/// system alike.
pub fn timed_remount(remount: &str) -> String {
    format!(
        r#"t0=$(date +%s.%N); ({remount}) && sync && printf '{REMOUNT_LABEL}: %.2f s\n' "$(echo "$(date +%s.%N) - $t0" | bc -l)""#
    )
}

/// The seconds of a [`timed_remount`] line.
pub fn parse_remount(line: &str) -> Option<f64> {
    let rest = line.trim().strip_prefix(REMOUNT_LABEL)?.strip_prefix(": ")?;
    rest.strip_suffix(" s")?.trim().parse().ok()
}

/// The phase a workload line reports, or None for other lines (`cpu:`,
/// `note:`, `initdb: 3.1 s`, error messages).
pub fn parse_line(line: &str) -> Option<Phase> {
    let (label, rest) = line.trim().split_once(": ")?;
    if label.is_empty() || matches!(label, "cpu" | "note") {
        return None;
    }
    // smallfile.sh times the `sync -f` after untar on its own and reports
    // it as a rate over the untar's entries: a few milliseconds of sync
    // make a "rate" of hundreds of thousands of files a second that says
    // nothing. Not a workload; its CPU counts in the next phase.
    if label.starts_with("untar-sync") {
        return None;
    }
    let (value, unit) = if let Some(v) = number_before(rest, "MiB/s by wall clock") {
        (v, "MiB/s")
    } else if let Some(v) = number_before(rest, "files/s") {
        (v, "files/s")
    } else if let Some(v) = number_before(rest, "TPS") {
        (v, "TPS")
    } else {
        return None;
    };
    let work = match unit {
        "MiB/s" => {
            let size = parse_size(field(label, "size")?)?;
            let nj: f64 = field(label, "numjobs").and_then(|n| n.parse().ok()).unwrap_or(1.0);
            Some(Work::Bytes(size * nj))
        }
        "files/s" => field(label, "n").and_then(|n| n.parse().ok()).map(Work::Files),
        _ => {
            let c: Option<f64> = field(label, "c").and_then(|n| n.parse().ok());
            let t: Option<f64> = field(label, "t").and_then(|n| n.parse().ok());
            c.zip(t).map(|(c, t)| Work::Txns(c * t))
        }
    };
    Some(Phase { label: label.to_string(), value, unit, work })
}

/// The lock and changelog fops a client sent to its bricks, from
/// `xlfs profile --json MOUNT`: calls of the mount's protocol/client
/// translators summed over the bricks, as `INODELK+FINODELK` and
/// `XATTROP+FXATTROP`. A protocol/client shows as its own row, as its
/// `network+queue` row (the wire), or both, with the same calls: each
/// client is counted once.
pub fn lock_fops(json: &str) -> Option<std::collections::BTreeMap<String, f64>> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let mut per_client: std::collections::BTreeMap<(&str, String), f64> = std::collections::BTreeMap::new();
    for fop in v.get("fops")?.as_array()? {
        let key = match fop.get("fop")?.as_str()? {
            "INODELK" | "FINODELK" => "INODELK+FINODELK",
            "XATTROP" | "FXATTROP" => "XATTROP+FXATTROP",
            _ => continue,
        };
        let mut this_fop: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
        for r in fop.get("rows")?.as_array()? {
            let s = |k: &str| r.get(k).and_then(|t| t.as_str()).unwrap_or("");
            if s("type") == "protocol/client" && s("where") == "mount" {
                let name = s("translator").trim_end_matches(" network+queue").to_string();
                let calls = r.get("calls").and_then(|c| c.as_f64()).unwrap_or(0.0);
                let e = this_fop.entry(name).or_default();
                *e = e.max(calls);
            }
        }
        for (client, calls) in this_fop {
            *per_client.entry((key, client)).or_default() += calls;
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for key in ["INODELK+FINODELK", "XATTROP+FXATTROP"] {
        out.insert(key.to_string(), per_client.iter().filter(|((k, _), _)| *k == key).map(|(_, c)| c).sum());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_fop_counts() {
        let row = |t: &str, ty: &str, w: &str, calls: u64| {
            format!(
                r#"{{"translator":"{t}","type":"{ty}","where":"{w}","calls":{calls},"self_ns":1,"self_per_call_ns":1,"estimated":false,"note":null}}"#
            )
        };
        let json = format!(
            r#"{{"graph":"xlfs","window_ms":5,"bricks":[],"fops":[{{"fop":"FINODELK","entry_calls":0,"entry_total_ns":0,"rows":[{},{},{},{}]}},{{"fop":"INODELK","entry_calls":0,"entry_total_ns":0,"rows":[{}]}},{{"fop":"FXATTROP","entry_calls":0,"entry_total_ns":0,"rows":[{}]}},{{"fop":"WRITE","entry_calls":9,"entry_total_ns":0,"rows":[{}]}}]}}"#,
            row("xlfs-client-0 network+queue", "protocol/client", "mount", 10),
            row("xlfs-client-0", "protocol/client", "mount", 10),
            row("xlfs-client-1", "protocol/client", "mount", 12),
            row("b0-locks", "features/locks", "brick 127.0.0.1:1", 10),
            row("xlfs-client-2", "protocol/client", "mount", 3),
            row("xlfs-client-2", "protocol/client", "mount", 7),
            row("xlfs-client-2", "protocol/client", "mount", 99),
        );
        let m = lock_fops(&json).expect("parsed");
        // client-0 once (10), client-1 (12), and client-2's INODELK (3).
        assert_eq!(m.get("INODELK+FINODELK"), Some(&25.0));
        assert_eq!(m.get("XATTROP+FXATTROP"), Some(&7.0));
        assert_eq!(lock_fops("not json"), None);
    }

    #[test]
    fn fio_line() {
        let p = parse_line(
            "seq-read numjobs=4 size=256m: 1083 MiB/s (fio), 1000 MiB/s by wall clock (fio start to exit), 1.0 s",
        )
        .expect("parsed");
        assert_eq!(p.label, "seq-read numjobs=4 size=256m");
        assert_eq!((p.value, p.unit), (1000.0, "MiB/s"));
        assert_eq!(p.work, Some(Work::Bytes(1024.0 * 1024.0 * 1024.0)));
        assert_eq!(p.work.expect("work").cost(2.0), 2.0);
    }

    #[test]
    fn smallfile_lines() {
        let p = parse_line("create n=5000: 5.20 s, 961 files/s").expect("parsed");
        assert_eq!((p.label.as_str(), p.value, p.unit), ("create n=5000", 961.0, "files/s"));
        assert_eq!(p.work, Some(Work::Files(5000.0)));
        assert!((p.work.expect("work").cost(1.0) - 0.2).abs() < 1e-9);
        assert_eq!(parse_line("untar-sync n=3617: 0.00 s, 736107 files/s"), None);
        assert!(parse_line("untar n=3617: 14.9 s, 243 files/s").is_some());
    }

    #[test]
    fn pgbench_line() {
        let p =
            parse_line("pgbench c=4 j=2 t=2000 default-pgconf: 512 TPS, latency 7.812 ms; -t 8000 would take ~62 s")
                .expect("parsed");
        assert_eq!((p.value, p.unit), (512.0, "TPS"));
        assert_eq!(p.work, Some(Work::Txns(8000.0)));
        assert_eq!(p.work.expect("work").cost_unit(), "CPU ms/txn");
    }

    #[test]
    fn other_lines() {
        for l in [
            "cpu: 5s sampled, machine busy 80% iowait 3% (of 2 cores=100%) | fuse:glref 40%",
            "note: drop_caches not permitted",
            "initdb: 3.1 s",
            "pgbench-init scale=10: 20.4 s",
            "",
            "fio: some error",
        ] {
            assert_eq!(parse_line(l), None, "{l}");
        }
    }

    #[test]
    fn remount_lines() {
        assert_eq!(parse_remount("remount+sync: 2.35 s"), Some(2.35));
        assert_eq!(parse_line("remount+sync: 2.35 s"), None, "not a phase of its own");
        assert_eq!(parse_remount("create n=5000: 5.20 s, 961 files/s"), None);
        // The wrapper prints such a line, and fails with the command.
        let run = |cmd: &str| std::process::Command::new("bash").arg("-c").arg(timed_remount(cmd)).output();
        let ok = run("true").expect("bash");
        assert!(ok.status.success());
        let secs = parse_remount(String::from_utf8_lossy(&ok.stdout).trim()).expect("a remount line");
        assert!(secs >= 0.0);
        let failed = run("false").expect("bash");
        assert!(!failed.status.success() && failed.stdout.is_empty());
        assert_eq!(Work::Bytes(512.0 * 1048576.0).amount(), 512.0);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512m"), Some(512.0 * 1048576.0));
        assert_eq!(parse_size("1G"), Some(1073741824.0));
        assert_eq!(parse_size("4096"), Some(4096.0));
        assert_eq!(parse_size("1x"), None);
    }
}
