//! Samples, their summaries and the Markdown tables.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One phase of one workload on one system in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The round, from 1.
    pub round: u32,
    /// The column: `xlfs`, `glusterfs`, `ext4`, or a name given on the command line.
    pub system: String,
    /// The phase's label, e.g. `create n=5000`.
    pub label: String,
    /// The rate's unit (`MiB/s`, `files/s`, `TPS`); higher is better.
    pub unit: String,
    /// The rate.
    pub value: f64,
    /// The client and brick processes' CPU per unit of work, with its unit
    /// (None for a system without such processes, e.g. ext4).
    pub cpu: Option<(f64, String)>,
    /// CPU seconds of the client processes during the phase.
    pub cpu_client_s: f64,
    /// CPU seconds of the brick processes during the phase.
    pub cpu_bricks_s: f64,
    /// Fops the client sent to the bricks per unit of work, by name
    /// (`--preset lock-policy`: INODELK+FINODELK and XATTROP+FXATTROP per
    /// transaction, from `xlfs profile`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fops: BTreeMap<String, f64>,
}

/// Median, min, max and count of some values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

/// The summary of `vals`, None when empty.
pub fn summarize(vals: &[f64]) -> Option<Summary> {
    if vals.is_empty() {
        return None;
    }
    let mut v = vals.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some(Summary { median, min: v[0], max: v[n - 1], n })
}

/// A number with about three significant digits, no exponent.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `median (min-max, n=N)`, or `—` for no values.
fn cell(s: Option<Summary>) -> String {
    match s {
        Some(s) => format!("{} ({}-{}, n={})", num(s.median), num(s.min), num(s.max), s.n),
        None => "—".into(),
    }
}

/// The ratio of two medians, `1.23x`, or `—`.
fn ratio(a: Option<Summary>, b: Option<Summary>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.2}x", a.median / b.median),
        _ => "—".into(),
    }
}

/// Whether a column is a reference (GlusterFS, MooseFS or the local disk)
/// rather than one of the xlfs columns being compared.
pub fn is_reference(system: &str) -> bool {
    system.starts_with("glusterfs") || system.starts_with("moosefs") || system.starts_with("ext4") || system == "tmpfs"
}

/// The MooseFS column, if the run has one (the second peer: every xlfs
/// column gets a ratio to it too).
pub fn moosefs_ref(systems: &[String]) -> Option<&str> {
    systems.iter().find(|s| *s == "moosefs").map(String::as_str)
}

/// The local-disk column that `system` is compared with: `tmpfs` for a
/// tmpfs column when there is one, else `ext4`.
pub fn local_ref<'a>(system: &str, systems: &'a [String]) -> Option<&'a str> {
    let find = |name: &str| systems.iter().find(|s| *s == name).map(String::as_str);
    if system.ends_with("-tmpfs")
        && let Some(t) = find("tmpfs")
    {
        return Some(t);
    }
    find("ext4")
}

/// The GlusterFS column that `system` is compared with: the tmpfs one for
/// a tmpfs column, the one with the matching read-ahead and io-threads
/// settings in the seq-read matrix (`xlfs ra=tolerant iot=on` with
/// `glusterfs ra=on iot=on`), else `glusterfs`, else the first GlusterFS column.
pub fn gluster_ref<'a>(system: &str, systems: &'a [String]) -> Option<&'a str> {
    let find = |name: &str| systems.iter().find(|s| *s == name).map(String::as_str);
    let token = |key: &str| system.split_whitespace().find_map(|w| w.strip_prefix(key));
    if let (Some(ra), Some(iot)) = (token("ra="), token("iot="))
        && let Some(t) = find(&format!("glusterfs ra={} iot={iot}", if ra == "off" { "off" } else { "on" }))
    {
        return Some(t);
    }
    if system.ends_with("-tmpfs")
        && let Some(t) = find("glusterfs-tmpfs")
    {
        return Some(t);
    }
    find("glusterfs").or_else(|| systems.iter().find(|s| s.starts_with("glusterfs")).map(String::as_str))
}

/// The samples grouped: label -> system -> samples, labels and systems in
/// the order first seen (systems in the order given).
pub struct Grouped<'a> {
    /// The phases' labels with their unit and CPU unit, in the order run.
    pub labels: Vec<(String, String, Option<String>)>,
    /// The columns.
    pub systems: Vec<String>,
    cells: BTreeMap<(usize, usize), Vec<&'a Sample>>,
}

impl<'a> Grouped<'a> {
    /// Groups `samples` for the columns `systems` (samples of other systems are left out).
    pub fn new(samples: &'a [Sample], systems: &[String]) -> Grouped<'a> {
        let mut labels: Vec<(String, String, Option<String>)> = Vec::new();
        let mut cells: BTreeMap<(usize, usize), Vec<&Sample>> = BTreeMap::new();
        for s in samples {
            let Some(si) = systems.iter().position(|x| *x == s.system) else { continue };
            let li = match labels.iter().position(|(l, _, _)| *l == s.label) {
                Some(i) => i,
                None => {
                    labels.push((s.label.clone(), s.unit.clone(), None));
                    labels.len() - 1
                }
            };
            if let Some((_, u)) = &s.cpu {
                labels[li].2.get_or_insert_with(|| u.clone());
            }
            cells.entry((li, si)).or_default().push(s);
        }
        Grouped { labels, systems: systems.to_vec(), cells }
    }

    fn samples(&self, label: usize, system: &str) -> &[&'a Sample] {
        let Some(si) = self.systems.iter().position(|x| x == system) else { return &[] };
        self.cells.get(&(label, si)).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The summary of the rates of `label` on `system`.
    pub fn rate(&self, label: usize, system: &str) -> Option<Summary> {
        summarize(&self.samples(label, system).iter().map(|s| s.value).collect::<Vec<_>>())
    }

    /// The summary of the CPU cost of `label` on `system`.
    pub fn cpu(&self, label: usize, system: &str) -> Option<Summary> {
        summarize(&self.samples(label, system).iter().filter_map(|s| s.cpu.as_ref().map(|c| c.0)).collect::<Vec<_>>())
    }

    /// The median share of the client processes in the CPU of `label` on `system`, in percent.
    fn client_share(&self, label: usize, system: &str) -> Option<f64> {
        let shares: Vec<f64> = self
            .samples(label, system)
            .iter()
            .filter(|s| s.cpu_client_s + s.cpu_bricks_s > 0.0)
            .map(|s| 100.0 * s.cpu_client_s / (s.cpu_client_s + s.cpu_bricks_s))
            .collect();
        summarize(&shares).map(|s| s.median)
    }
}

/// The fops sent per unit of work (lock-policy), one row per phase and fop.
fn fops_table(g: &Grouped) -> String {
    let mut keys: Vec<(usize, String)> = Vec::new();
    let mut cols: Vec<&String> = Vec::new();
    for li in 0..g.labels.len() {
        for s in &g.systems {
            for x in g.samples(li, s) {
                for k in x.fops.keys() {
                    if !keys.contains(&(li, k.clone())) {
                        keys.push((li, k.clone()));
                    }
                    if !cols.contains(&s) {
                        cols.push(s);
                    }
                }
            }
        }
    }
    if keys.is_empty() {
        return String::new();
    }
    let mut head: Vec<String> = vec!["workload".into(), "fops sent per unit".into()];
    head.extend(cols.iter().map(|s| s.to_string()));
    let mut out = format!("\n{}{}", row(&head), rule(head.len()));
    for (li, k) in &keys {
        let mut r = vec![g.labels[*li].0.clone(), k.clone()];
        for s in &cols {
            let v: Vec<f64> = g.samples(*li, s).iter().filter_map(|x| x.fops.get(k).copied()).collect();
            r.push(cell(summarize(&v)));
        }
        out += &row(&r);
    }
    out += "\nCalls the client's protocol/client translators sent to the bricks (all three), per transaction, \
            from `xlfs profile` around the pgbench run; median (min-max, n=rounds).\n";
    out
}

/// Each further xlfs column over the `xlfs` one, round by round: the ratio
/// of its rate and of its CPU per unit of work to `xlfs`'s in the same
/// round, median (min-max) over the rounds. Two builds or settings run
/// side by side drift with the machine together; the ratio of each round's
/// pair keeps a few percent's difference that medians of each column lose
/// in the spread.
fn paired_table(g: &Grouped) -> String {
    const BASE: &str = "xlfs";
    let others: Vec<&String> =
        g.systems.iter().filter(|s| *s != BASE && !is_reference(s) && !s.ends_with("-tmpfs")).collect();
    if others.is_empty() || !g.systems.iter().any(|s| s == BASE) {
        return String::new();
    }
    let paired = |li: usize, other: &str, of: fn(&Sample) -> Option<f64>| {
        let ratios: Vec<f64> = g
            .samples(li, BASE)
            .iter()
            .filter_map(|b| {
                let o = g.samples(li, other).iter().find(|o| o.round == b.round)?;
                let (bv, ov) = (of(b)?, of(o)?);
                (bv > 0.0).then(|| ov / bv)
            })
            .collect();
        match summarize(&ratios) {
            Some(r) => format!("{:.2}x ({:.2}-{:.2}, n={})", r.median, r.min, r.max, r.n),
            None => "—".into(),
        }
    };
    let mut head: Vec<String> = vec!["workload".into()];
    for o in &others {
        head.push(format!("{o} / {BASE}"));
        head.push(format!("{o} / {BASE} CPU"));
    }
    let mut out = format!("\n{}{}", row(&head), rule(head.len()));
    for (li, (label, _, _)) in g.labels.iter().enumerate() {
        let mut r = vec![label.clone()];
        for o in &others {
            r.push(paired(li, o, |s| Some(s.value)));
            r.push(paired(li, o, |s| s.cpu.as_ref().map(|c| c.0)));
        }
        out += &row(&r);
    }
    out += "\nPaired by round: each round's rate (and CPU per unit) of the column over `xlfs`'s in the same \
            round, median (min-max, n=rounds); above 1x the column is faster (or costs more CPU).\n";
    out
}

fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

fn rule(n: usize) -> String {
    format!("|{}\n", "---|".repeat(n))
}

/// The Markdown tables: the rates (median, min-max, rounds, and each xlfs
/// column's median over GlusterFS's and over the local disk's), then the CPU cost of
/// the client and brick processes. With more than `wide` columns the tables
/// are turned (one row per system) so they stay readable.
pub fn render(samples: &[Sample], systems: &[String], wide: usize) -> String {
    let g = Grouped::new(samples, systems);
    if g.labels.is_empty() {
        return "(no results)\n".into();
    }
    let compared: Vec<&String> = systems.iter().filter(|s| !is_reference(s)).collect();
    let mut out = String::new();
    if systems.len() <= wide {
        let mut head: Vec<String> = vec!["workload".into(), "unit".into()];
        head.extend(systems.iter().cloned());
        for s in &compared {
            if let Some(r) = gluster_ref(s, systems) {
                head.push(format!("{s} / {}", if r == "glusterfs" { "GlusterFS" } else { r }));
            }
            if moosefs_ref(systems).is_some() {
                head.push(format!("{s} / MooseFS"));
            }
            if let Some(l) = local_ref(s, systems) {
                head.push(format!("{s} / {l}"));
            }
        }
        out += &row(&head);
        out += &rule(head.len());
        for (li, (label, unit, _)) in g.labels.iter().enumerate() {
            let mut r = vec![label.clone(), unit.clone()];
            r.extend(systems.iter().map(|s| cell(g.rate(li, s))));
            for s in &compared {
                if let Some(gl) = gluster_ref(s, systems) {
                    r.push(ratio(g.rate(li, s), g.rate(li, gl)));
                }
                if let Some(m) = moosefs_ref(systems) {
                    r.push(ratio(g.rate(li, s), g.rate(li, m)));
                }
                if let Some(e) = local_ref(s, systems) {
                    r.push(ratio(g.rate(li, s), g.rate(li, e)));
                }
            }
            out += &row(&r);
        }
        out += "\nmedian (min-max, n=rounds); higher is better.\n\n";
        let cpu_systems: Vec<&String> =
            systems.iter().filter(|s| (0..g.labels.len()).any(|li| g.cpu(li, s).is_some())).collect();
        if !cpu_systems.is_empty() {
            let mut head: Vec<String> = vec!["workload".into(), "CPU unit".into()];
            head.extend(cpu_systems.iter().map(|s| s.to_string()));
            out += &row(&head);
            out += &rule(head.len());
            for (li, (label, _, cpu_unit)) in g.labels.iter().enumerate() {
                let mut r = vec![label.clone(), cpu_unit.clone().unwrap_or_else(|| "—".into())];
                for s in &cpu_systems {
                    r.push(match (g.cpu(li, s), g.client_share(li, s)) {
                        (Some(c), Some(share)) => format!("{} (client {share:.0}%)", cell(Some(c))),
                        (c, _) => cell(c),
                    });
                }
                out += &row(&r);
            }
            out += "\nCPU of the client and brick processes (utime+stime from /proc) per unit of work, \
                    median (min-max, n=rounds), with the client's share; lower is better.\n";
        }
        out += &paired_table(&g);
        out += &fops_table(&g);
    } else {
        let mut head: Vec<String> = vec!["system".into()];
        head.extend(g.labels.iter().map(|(l, u, _)| format!("{l} ({u})")));
        out += &row(&head);
        out += &rule(head.len());
        for s in systems {
            let mut r = vec![s.clone()];
            for li in 0..g.labels.len() {
                let mut c = cell(g.rate(li, s));
                if !is_reference(s)
                    && let Some(gl) = gluster_ref(s, systems)
                {
                    let of = if gl == "glusterfs" { "GlusterFS" } else { gl };
                    c += &format!(", {} {of}", ratio(g.rate(li, s), g.rate(li, gl)));
                }
                if !is_reference(s)
                    && let Some(m) = moosefs_ref(systems)
                {
                    c += &format!(", {} MooseFS", ratio(g.rate(li, s), g.rate(li, m)));
                }
                if let Some(cpu) = g.cpu(li, s) {
                    c += &format!(", {} {}", num(cpu.median), g.labels[li].2.as_deref().unwrap_or("CPU"));
                }
                r.push(c);
            }
            out += &row(&r);
        }
        out += "\nmedian (min-max, n=rounds), higher is better; the xlfs columns' ratio to GlusterFS; \
                the median CPU of the client and brick processes per unit of work.\n";
        out += &fops_table(&g);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(round: u32, system: &str, label: &str, value: f64, cpu: Option<f64>) -> Sample {
        Sample {
            round,
            system: system.into(),
            label: label.into(),
            unit: "files/s".into(),
            value,
            cpu: cpu.map(|c| (c, "CPU ms/file".to_string())),
            cpu_client_s: cpu.map_or(0.0, |_| 1.0),
            cpu_bricks_s: cpu.map_or(0.0, |_| 3.0),
            fops: BTreeMap::new(),
        }
    }

    #[test]
    fn summaries() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[3.0, 1.0, 2.0]), Some(Summary { median: 2.0, min: 1.0, max: 3.0, n: 3 }));
        assert_eq!(summarize(&[4.0, 1.0]).map(|s| s.median), Some(2.5));
    }

    #[test]
    fn numbers() {
        assert_eq!(num(961.4), "961");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(0.1234), "0.123");
        assert_eq!(num(0.0), "0");
    }

    #[test]
    fn references() {
        let sys: Vec<String> =
            ["xlfs", "glusterfs", "ext4", "xlfs-tmpfs", "glusterfs-tmpfs"].iter().map(|s| s.to_string()).collect();
        assert_eq!(gluster_ref("xlfs", &sys), Some("glusterfs"));
        assert_eq!(gluster_ref("xlfs-tmpfs", &sys), Some("glusterfs-tmpfs"));
        let m: Vec<String> = ["xlfs ra-off", "glusterfs ra-on"].iter().map(|s| s.to_string()).collect();
        assert_eq!(gluster_ref("xlfs ra-off", &m), Some("glusterfs ra-on"));
        let m: Vec<String> = ["xlfs ra=gluster-strict iot=on", "glusterfs ra=off iot=on", "glusterfs ra=on iot=on"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(gluster_ref("xlfs ra=gluster-strict iot=on", &m), Some("glusterfs ra=on iot=on"));
        assert_eq!(gluster_ref("xlfs ra=off iot=on", &m), Some("glusterfs ra=off iot=on"));
        let t: Vec<String> = ["xlfs-tmpfs", "ext4", "tmpfs"].iter().map(|s| s.to_string()).collect();
        assert_eq!(local_ref("xlfs-tmpfs", &t), Some("tmpfs"));
        assert_eq!(local_ref("xlfs", &t), Some("ext4"));
        assert!(is_reference("tmpfs") && !is_reference("xlfs-tmpfs"));
        assert!(is_reference("ext4") && is_reference("glusterfs ra-on") && !is_reference("xlfs"));
    }

    #[test]
    fn table() {
        let samples = vec![
            s(1, "xlfs", "create n=100", 900.0, Some(0.5)),
            s(1, "glusterfs", "create n=100", 200.0, Some(2.0)),
            s(1, "ext4", "create n=100", 5000.0, None),
            s(2, "xlfs", "create n=100", 1000.0, Some(0.7)),
            s(2, "glusterfs", "create n=100", 300.0, Some(2.0)),
            s(2, "ext4", "create n=100", 6000.0, None),
        ];
        let sys: Vec<String> = ["xlfs", "glusterfs", "ext4"].iter().map(|s| s.to_string()).collect();
        let t = render(&samples, &sys, 5);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| workload | unit | xlfs | glusterfs | ext4 | xlfs / GlusterFS | xlfs / ext4 |");
        assert_eq!(lines[1], "|---|---|---|---|---|---|---|");
        assert_eq!(
            lines[2],
            "| create n=100 | files/s | 950 (900-1000, n=2) | 250 (200-300, n=2) | 5500 (5000-6000, n=2) | 3.80x | 0.17x |"
        );
        assert!(t.contains("| workload | CPU unit | xlfs | glusterfs |"), "{t}");
        assert!(t.contains("| create n=100 | CPU ms/file | 0.600 (0.500-0.700, n=2) (client 25%) | 2.00 (2.00-2.00, n=2) (client 25%) |"), "{t}");
        // Turned: one row per system.
        let t = render(&samples, &sys, 2);
        assert!(t.starts_with("| system | create n=100 (files/s) |\n|---|---|\n"), "{t}");
        assert!(t.contains("| xlfs | 950 (900-1000, n=2), 3.80x GlusterFS, 0.600 CPU ms/file |"), "{t}");
        assert!(t.contains("| ext4 | 5500 (5000-6000, n=2) |"), "{t}");
        assert!(!t.contains("fops sent"), "{t}");
    }

    #[test]
    fn columns_compared_round_by_round() {
        // The machine slows down in round 2 for both: the medians of the
        // columns overlap, the paired ratio stays 1.10x.
        let samples = vec![
            s(1, "xlfs", "rm n=100", 1000.0, Some(2.0)),
            s(1, "new", "rm n=100", 1100.0, Some(1.8)),
            s(2, "xlfs", "rm n=100", 500.0, Some(4.0)),
            s(2, "new", "rm n=100", 550.0, Some(3.6)),
            s(3, "xlfs", "rm n=100", 800.0, Some(2.5)),
        ];
        let sys: Vec<String> = ["xlfs", "new", "glusterfs"].iter().map(|s| s.to_string()).collect();
        let t = render(&samples, &sys, 5);
        assert!(t.contains("| workload | new / xlfs | new / xlfs CPU |"), "{t}");
        assert!(t.contains("| rm n=100 | 1.10x (1.10-1.10, n=2) | 0.90x (0.90-0.90, n=2) |"), "{t}");
        // Without a second xlfs column there is no such table.
        let sys: Vec<String> = ["xlfs", "glusterfs"].iter().map(|s| s.to_string()).collect();
        assert!(!render(&samples, &sys, 5).contains("Paired by round"));
    }

    #[test]
    fn fops() {
        let mut a = s(1, "xlfs", "pgbench", 500.0, Some(1.0));
        a.fops.insert("INODELK+FINODELK".into(), 4.0);
        let b = s(1, "glusterfs", "pgbench", 400.0, Some(1.0));
        let t = render(&[a, b], &["xlfs".into(), "glusterfs".into()], 5);
        assert!(t.contains("| workload | fops sent per unit | xlfs |\n|---|---|---|\n| pgbench | INODELK+FINODELK | 4.00 (4.00-4.00, n=1) |"), "{t}");
    }
}
