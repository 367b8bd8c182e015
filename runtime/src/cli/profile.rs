//! `xlfs profile MOUNTPOINT` and `xlfs profile --brick HOST:PORT
//! --subvolume PATH`: where the time goes, per fop and translator, in a
//! running graph (every node is timed, always: [`crate::profile`]).
//!
//! For a mount, the mount process (through its control socket, as `xlfs
//! status`) answers with its graph's counters and, asked over each
//! protocol/client node's own connection, those of the brick behind it
//! ([`crate::profile::collect`]). For each fop kind the translators are
//! listed by self time. A protocol/client node's self time is the wait on
//! the wire; it is shown split in two: the brick's translators (the brick
//! graph below protocol/server, each with its self time) and a
//! `network+queue` line, the rest (the network both ways, the server's
//! decoding, queueing and encoding, and the client's). Both are estimated
//! from per-call means: a brick counts the calls of every client it serves,
//! so its times are scaled to this client's number of calls. Estimated
//! rows are marked `~`.
//!
//! `--brick` asks one brick directly (a protocol/client connection made for
//! the purpose, so `auth.login` bricks are not reachable this way); `--reset`
//! restarts the counters after printing them (a brick's for all its
//! clients); `--json` prints the same rows as JSON.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args};
use xlfs_sdk::FopKind;
use xlfs_sdk::profile::{FopTimes, GraphProfile, NodeProfile};

use super::CliError;
use super::reload::{ReloadError, ask};
use crate::graph::Graph;
use crate::profile::{CLIENT_TYPE, ProfileBundle, ask_brick};
use crate::registry::Registry;

/// How long a brick asked with `--brick` may take to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `xlfs profile`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["mountpoint", "brick"])))]
pub struct ProfileArgs {
    /// The mount point of the client.
    pub mountpoint: Option<PathBuf>,
    /// Ask a brick directly instead: its server's HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", requires = "subvolume", conflicts_with = "mountpoint")]
    pub brick: Option<String>,
    /// With --brick: the brick's subvolume (its path, as clients name it
    /// in `remote-subvolume`).
    #[arg(long, value_name = "PATH")]
    pub subvolume: Option<String>,
    /// Restart the counters after printing them.
    #[arg(long)]
    pub reset: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// One line of a fop's table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The volume (for the network line, the protocol/client volume
    /// followed by ` network+queue`).
    pub translator: String,
    /// Its translator type.
    pub type_name: String,
    /// `mount`, `brick HOST:PORT`, or for `--brick` `brick`.
    pub place: String,
    /// Calls counted by this node (at a brick: from all its clients).
    pub calls: u64,
    /// Self time in nanoseconds (estimated: this client's share).
    pub self_ns: f64,
    /// Self nanoseconds per call of this node.
    pub self_per_call_ns: f64,
    /// The part of the top's total this row stands for, in nanoseconds:
    /// its self time, with parallel children (replicate's) sharing their
    /// parent's wait in proportion to their times. None for a node the
    /// fop does not reach from the top.
    pub latency_ns: Option<f64>,
    /// Estimated from per-call means rather than measured.
    pub estimated: bool,
    /// Why the row stands for more than itself (a brick not reached).
    pub note: Option<String>,
}

/// One fop kind: its calls at the graph's entry and the rows by self time.
#[derive(Clone, Debug, PartialEq)]
pub struct FopReport {
    /// The fop.
    pub kind: FopKind,
    /// Calls at the graph's entry (0: only issued inside the graph).
    pub entry_calls: u64,
    /// Their total time, nanoseconds.
    pub entry_total_ns: u64,
    /// Every node that saw the fop in a caller's latency, the largest part
    /// of the top's total first.
    pub rows: Vec<Row>,
    /// Every node that saw the fop behind (in no caller's latency: sent
    /// after its caller replied, or by a translator for itself), most self
    /// time first.
    pub behind: Vec<Row>,
}

impl FopReport {
    /// What the rows' parts of the top's total add up to, nanoseconds.
    pub fn accounted_ns(&self) -> f64 {
        self.rows.iter().filter_map(|r| r.latency_ns).sum()
    }
}

/// Which counters of a node a table shows.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    /// In a caller's latency.
    Latency,
    /// Behind.
    Behind,
}

fn times(n: &NodeProfile, kind: FopKind, side: Side) -> Option<&FopTimes> {
    let list = if side == Side::Latency { &n.fops } else { &n.behind };
    list.iter().find(|f| f.kind == kind && f.count > 0)
}

fn node_row(n: &NodeProfile, f: &FopTimes, place: &str, factor: Option<f64>) -> Row {
    Row {
        translator: n.name.clone(),
        type_name: n.type_name.clone(),
        place: place.to_string(),
        calls: f.count,
        self_ns: f.self_ns as f64,
        self_per_call_ns: f.self_ns as f64 / f.count as f64,
        latency_ns: factor.map(|k| f.self_ns as f64 * k),
        estimated: false,
        note: None,
    }
}

/// For each node the fop reaches from the graph's entry in callers'
/// latency: the share of its self time that is part of the top's total (1
/// at the entry; a parent's wait for its children, its total less its self
/// time, is shared by the children in proportion to their totals, so
/// children called in parallel count once and one child counts whole), and
/// the part of that wait its children of this kind do not account for:
/// time in other fops it sent for this one (write-behind's queued WRITEs
/// before a STAT, open-behind's OPEN before a READ), in nanoseconds of the
/// top's total.
fn latency_factors(g: &GraphProfile, kind: FopKind) -> HashMap<&str, (f64, f64)> {
    let mut out = HashMap::new();
    let Some(entry) = g.entry() else { return out };
    let mut todo = vec![(entry, 1.0)];
    while let Some((n, k)) = todo.pop() {
        if out.contains_key(n.name.as_str()) {
            continue;
        }
        let Some(t) = times(n, kind, Side::Latency) else {
            out.insert(n.name.as_str(), (k, 0.0));
            continue;
        };
        let kids: Vec<(&NodeProfile, f64)> = n
            .children
            .iter()
            .filter_map(|c| g.node(c))
            .filter_map(|c| times(c, kind, Side::Latency).map(|f| (c, f.total_ns as f64)))
            .collect();
        let sum: f64 = kids.iter().map(|(_, t)| t).sum();
        let wait = t.total_ns.saturating_sub(t.self_ns) as f64;
        out.insert(n.name.as_str(), (k, (wait - sum).max(0.0) * k));
        if sum > 0.0 {
            let share = (wait / sum).min(1.0);
            todo.extend(kids.into_iter().map(|(c, _)| (c, k * share)));
        }
    }
    out
}

/// The row of a node's wait for other fops it sent for `f`'s calls (see
/// [`latency_factors`]).
fn other_fops_row(n: &NodeProfile, f: &FopTimes, place: &str, part: f64) -> Row {
    Row {
        translator: format!("{} waiting for other fops", n.name),
        type_name: n.type_name.clone(),
        place: place.to_string(),
        calls: f.count,
        self_ns: part,
        self_per_call_ns: part / f.count as f64,
        latency_ns: Some(part),
        estimated: false,
        note: Some("its calls of other kinds for these: see their tables".into()),
    }
}

/// The rows of one node for `kind` on `side`: a protocol/client node's
/// wait split into its brick's nodes and network+queue when the brick
/// answered and counted the same fop.
fn rows_of(
    b: &ProfileBundle,
    n: &NodeProfile,
    kind: FopKind,
    side: Side,
    place: &str,
    factor: Option<f64>,
) -> Vec<Row> {
    let Some(f) = times(n, kind, side) else { return Vec::new() };
    let mut row = node_row(n, f, place, factor);
    if n.type_name != CLIENT_TYPE {
        return vec![row];
    }
    let Some(brick) = b.bricks.iter().find(|x| x.client == n.name) else { return vec![row] };
    let p: &GraphProfile = match &brick.profile {
        Ok(p) => p,
        Err(why) => {
            row.note = Some(format!("wire; brick {} not reached: {why}", brick.remote));
            return vec![row];
        }
    };
    // The brick cannot tell which calls were behind on this side: both
    // sides' calls are its entry's.
    let at_brick = p.entry().and_then(|e| times(e, kind, Side::Latency));
    let Some(at_brick) = at_brick else {
        row.note = Some(format!("wire; brick {} counted no {}", brick.remote, kind.name()));
        return vec![row];
    };
    // This client's share of the brick's calls of this kind, at their mean;
    // never more than the client waited (the brick's mean mixes this
    // client's calls with others', and this side's with those behind).
    let mut scale = row.calls as f64 / at_brick.count as f64;
    let at_brick_total = at_brick.total_ns as f64 * scale;
    if at_brick_total > row.self_ns && at_brick_total > 0.0 {
        scale *= row.self_ns / at_brick_total;
    }
    let network = (row.self_ns - at_brick.total_ns as f64 * scale).max(0.0);
    let mut out = vec![Row {
        translator: format!("{} network+queue", n.name),
        self_ns: network,
        self_per_call_ns: network / row.calls as f64,
        latency_ns: factor.map(|k| network * k),
        estimated: true,
        ..row
    }];
    let place = format!("brick {}", brick.remote);
    for bn in &p.nodes {
        if let Some(f) = times(bn, kind, Side::Latency) {
            let r = node_row(bn, f, &place, factor.map(|k| k * scale));
            out.push(Row { self_ns: r.self_ns * scale, estimated: true, ..r });
        }
    }
    out
}

/// The per-fop tables of `b`: for each fop kind, the rows in callers'
/// latency (each protocol/client's wait split into its brick's nodes and
/// network+queue) and the rows behind.
pub fn join(b: &ProfileBundle) -> Vec<FopReport> {
    let g = &b.graph;
    let entry = g.entry();
    let mut kinds: Vec<FopKind> =
        g.nodes.iter().flat_map(|n| n.fops.iter().chain(&n.behind).filter(|f| f.count > 0).map(|f| f.kind)).collect();
    kinds.sort();
    kinds.dedup();
    let own_place = if b.bricks.is_empty() && g.node(&g.top).is_some_and(|t| t.type_name == "protocol/server") {
        "brick"
    } else {
        "mount"
    };
    let by_self = |a: &Row, b: &Row| b.self_ns.total_cmp(&a.self_ns).then_with(|| a.translator.cmp(&b.translator));
    let mut out = Vec::new();
    for kind in kinds {
        let factors = latency_factors(g, kind);
        let mut rows = Vec::new();
        let mut behind = Vec::new();
        for n in &g.nodes {
            let (factor, other) = factors.get(n.name.as_str()).copied().unzip();
            rows.extend(rows_of(b, n, kind, Side::Latency, own_place, factor));
            // Under a microsecond per call is clock noise, not a wait.
            if let Some(f) = times(n, kind, Side::Latency)
                && let Some(part) = other.filter(|p| *p >= 1e3 * f.count as f64)
            {
                rows.push(other_fops_row(n, f, own_place, part));
            }
            behind.extend(rows_of(b, n, kind, Side::Behind, own_place, None));
        }
        rows.sort_by(|a, b| {
            let part = |r: &Row| r.latency_ns.unwrap_or(-1.0);
            part(b).total_cmp(&part(a)).then_with(|| by_self(a, b))
        });
        behind.sort_by(by_self);
        let at_entry = entry.and_then(|e| times(e, kind, Side::Latency));
        out.push(FopReport {
            kind,
            entry_calls: at_entry.map_or(0, |f| f.count),
            entry_total_ns: at_entry.map_or(0, |f| f.total_ns),
            rows,
            behind,
        });
    }
    // The fops that cost the most first.
    out.sort_by(|a, b| {
        let sum = |r: &FopReport| r.rows.iter().chain(&r.behind).map(|x| x.self_ns).sum::<f64>();
        sum(b).total_cmp(&sum(a)).then_with(|| a.kind.cmp(&b.kind))
    });
    out
}

/// The tables as text.
pub fn render_text(b: &ProfileBundle, reports: &[FopReport]) -> String {
    let mut out = format!("graph '{}': fop timings over {:.1} s\n", b.graph.top, b.graph.window_ms as f64 / 1000.0);
    for br in &b.bricks {
        let state = match &br.profile {
            Ok(p) => format!("brick graph '{}' over {:.1} s", p.top, p.window_ms as f64 / 1000.0),
            Err(why) => format!("not reached: {why}"),
        };
        out += &format!("  {} -> {} {}: {state}\n", br.client, br.remote, br.subvolume);
    }
    if !b.bricks.is_empty() {
        out += "~ estimated from per-call means: a brick's rows are its self times scaled to this client's calls;\n  \
                network+queue = protocol/client self time - the brick's total below protocol/server\n";
    }
    out += "self time = time a translator spent on a fop not waiting for a child call it made for it\n\
             us/call, % = the part of the top's time per call a row stands for: its self time, parallel children\n  \
             (replicate's) sharing their parent's wait, and a translator's wait for other fops it sent for this one\n  \
             (write-behind's WRITEs before a STAT, open-behind's OPEN before a READ: NAME waiting for other fops);\n  \
             the rows add up to the top's time\n\
             behind = calls in no caller's latency: sent after the caller was answered (write-behind, flush-behind,\n  \
             async directory operations) or by a translator for itself (heal)\n";
    if reports.is_empty() {
        out += "\nno fops counted yet\n";
    }
    // Columns: part of the top's time per call and of its total, self
    // time, calls, self time per call; "-" where a row has no part.
    let line = |out: &mut String, x: &Row, top: Option<(f64, u64)>| {
        let tilde = if x.estimated { "~" } else { "" };
        let (part, pct) = match (x.latency_ns, top) {
            (Some(ns), Some((total, calls))) if calls > 0 => (
                format!("{tilde}{:.1}", ns / calls as f64 / 1e3),
                format!("{:.1}", if total > 0.0 { 100.0 * ns / total } else { 0.0 }),
            ),
            _ => ("-".to_string(), "-".to_string()),
        };
        *out += &format!(
            "  {part:>10} {pct:>6} {:>12} {:>9} {:>12.1}  {} ({}) {}",
            format!("{tilde}{:.3}", x.self_ns / 1e6),
            x.calls,
            x.self_per_call_ns / 1e3,
            x.translator,
            x.type_name,
            x.place
        );
        if let Some(n) = &x.note {
            *out += &format!(" ({n})");
        }
        out.push('\n');
    };
    let header = format!(
        "  {:>10} {:>6} {:>12} {:>9} {:>12}  translator (type) where\n",
        "us/call", "%", "self ms", "calls", "self us/call"
    );
    for r in reports {
        out += &format!("\n{}: ", r.kind.name());
        let top = (r.entry_total_ns as f64, r.entry_calls);
        if r.entry_calls > 0 {
            let per_call = |ns: f64| ns / r.entry_calls as f64 / 1e3;
            let accounted = r.accounted_ns();
            out += &format!(
                "{} calls at the top, {:.3} ms total, {:.1} us/call; the rows add up to {:.1} us/call ({:.1} %)\n",
                r.entry_calls,
                top.0 / 1e6,
                per_call(top.0),
                per_call(accounted),
                if top.0 > 0.0 { 100.0 * accounted / top.0 } else { 0.0 }
            );
        } else {
            out += "not called at the top\n";
        }
        if !r.rows.is_empty() {
            out += &header;
        }
        for x in &r.rows {
            line(&mut out, x, Some(top));
        }
        if !r.behind.is_empty() {
            out += &format!("  behind, in no caller's latency:\n{header}");
            for x in &r.behind {
                line(&mut out, x, None);
            }
        }
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The tables as JSON: `{"graph", "window_ms", "bricks": [...], "fops":
/// [{"fop", "entry_calls", "entry_total_ns", "accounted_ns", "rows": [...],
/// "behind": [...]}]}`.
pub fn render_json(b: &ProfileBundle, reports: &[FopReport]) -> String {
    let bricks: Vec<String> = b
        .bricks
        .iter()
        .map(|br| {
            let (ok, detail) = match &br.profile {
                Ok(p) => ("true", format!("\"window_ms\":{}", p.window_ms)),
                Err(why) => ("false", format!("\"error\":{}", json_str(why))),
            };
            format!(
                "{{\"client\":{},\"remote\":{},\"subvolume\":{},\"reached\":{ok},{detail}}}",
                json_str(&br.client),
                json_str(&br.remote),
                json_str(&br.subvolume)
            )
        })
        .collect();
    let fops: Vec<String> = reports
        .iter()
        .map(|r| {
            let rows = |list: &[Row]| -> String {
                let items: Vec<String> = list
                    .iter()
                    .map(|x| {
                        format!(
                            "{{\"translator\":{},\"type\":{},\"where\":{},\"calls\":{},\"self_ns\":{},\"self_per_call_ns\":{},\"latency_ns\":{},\"estimated\":{},\"note\":{}}}",
                            json_str(&x.translator),
                            json_str(&x.type_name),
                            json_str(&x.place),
                            x.calls,
                            x.self_ns.round() as u64,
                            x.self_per_call_ns.round() as u64,
                            x.latency_ns.map_or("null".to_string(), |ns| (ns.round() as u64).to_string()),
                            x.estimated,
                            x.note.as_deref().map_or("null".to_string(), json_str)
                        )
                    })
                    .collect();
                items.join(",")
            };
            format!(
                "{{\"fop\":{},\"entry_calls\":{},\"entry_total_ns\":{},\"accounted_ns\":{},\"rows\":[{}],\"behind\":[{}]}}",
                json_str(r.kind.name()),
                r.entry_calls,
                r.entry_total_ns,
                r.accounted_ns().round() as u64,
                rows(&r.rows),
                rows(&r.behind)
            )
        })
        .collect();
    format!(
        "{{\"graph\":{},\"window_ms\":{},\"bricks\":[{}],\"fops\":[{}]}}\n",
        json_str(&b.graph.top),
        b.graph.window_ms,
        bricks.join(","),
        fops.join(",")
    )
}

impl ProfileArgs {
    /// The timings to show.
    async fn fetch(&self) -> Result<ProfileBundle, CliError> {
        if let Some(mountpoint) = &self.mountpoint {
            let (ok, text) = ask(mountpoint, if self.reset { "profile reset" } else { "profile" }).await?;
            if !ok {
                return Err(ReloadError::Failed(text.trim_end().to_string()).into());
            }
            return Ok(
                ProfileBundle::parse(&text).map_err(|e| ReloadError::Failed(format!("the mount's answer: {e}")))?
            );
        }
        let (Some(brick), Some(subvolume)) = (&self.brick, &self.subvolume) else {
            unreachable!("clap requires a mount point or --brick with --subvolume")
        };
        let bad = |what: &str| ReloadError::Failed(format!("--brick {brick:?}: {what}"));
        let (host, port) = brick.rsplit_once(':').ok_or_else(|| bad("expected HOST:PORT"))?;
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        if host.is_empty() || host.contains(char::is_whitespace) || subvolume.contains(char::is_whitespace) {
            return Err(bad("the host and subvolume must be single words").into());
        }
        let text = format!(
            "volume profile-client\n    type {CLIENT_TYPE}\n    option remote-host {host}\n    option remote-port {port}\n    \
             option remote-subvolume {subvolume}\nend-volume\n"
        );
        let graph = Graph::from_str(&text, "xlfs profile --brick", &Registry::builtin())?;
        graph.activate();
        let res = match graph.wait_up(CONNECT_TIMEOUT).await {
            Ok(()) => {
                let client = graph.nodes_of_type(CLIENT_TYPE).remove(0).0;
                ask_brick(&client, self.reset).await
            }
            Err(e) => Err(format!("{e}: the brick did not accept the connection (see --subvolume)")),
        };
        let _ = tokio::task::spawn_blocking(move || drop(graph)).await;
        let profile = res.map_err(|e| ReloadError::Failed(format!("brick {brick}: {e}")))?;
        Ok(ProfileBundle { graph: profile, bricks: Vec::new() })
    }

    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let bundle = self.fetch().await?;
        let reports = join(&bundle);
        let text = if self.json { render_json(&bundle, &reports) } else { render_text(&bundle, &reports) };
        out.write_all(text.as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::BrickProfile;

    fn node(name: &str, ty: &str, kids: &[&str], fops: &[(FopKind, u64, u64, u64)]) -> NodeProfile {
        NodeProfile {
            name: name.into(),
            type_name: ty.into(),
            children: kids.iter().map(|k| k.to_string()).collect(),
            fops: fops
                .iter()
                .map(|&(kind, count, total_ns, self_ns)| FopTimes { kind, count, total_ns, self_ns })
                .collect(),
            behind: Vec::new(),
        }
    }

    #[test]
    fn the_wire_is_split_into_the_brick_and_network_queue() {
        use FopKind::Writev as W;
        let mount = GraphProfile {
            top: "afr".into(),
            window_ms: 1000,
            nodes: vec![
                node("afr", "cluster/replicate", &["c0", "c1"], &[(W, 10, 10_000, 1_000)]),
                node("c0", CLIENT_TYPE, &[], &[(W, 10, 8_000, 8_000)]),
                node("c1", CLIENT_TYPE, &[], &[(W, 10, 9_000, 9_000)]),
            ],
        };
        // The brick served 20 writes (two clients): 400 ns each at its entry.
        let brick = GraphProfile {
            top: "srv".into(),
            window_ms: 1000,
            nodes: vec![
                node("srv", "protocol/server", &["stats"], &[]),
                node("stats", "debug/io-stats", &["posix"], &[(W, 20, 8_000, 2_000)]),
                node("posix", "storage/posix", &[], &[(W, 20, 6_000, 6_000)]),
            ],
        };
        let b = ProfileBundle {
            graph: mount,
            bricks: vec![
                BrickProfile { client: "c0".into(), remote: "h:1".into(), subvolume: "/b0".into(), profile: Ok(brick) },
                BrickProfile {
                    client: "c1".into(),
                    remote: "h:2".into(),
                    subvolume: "/b1".into(),
                    profile: Err("refused".into()),
                },
            ],
        };
        let mut b = b;
        // c0 also sent two fsyncs after its callers were answered.
        b.graph.nodes[1].behind.push(FopTimes { kind: FopKind::Fsync, count: 2, total_ns: 3000, self_ns: 3000 });
        let r = join(&b);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].entry_calls, r[0].entry_total_ns), (10, 10_000));
        let rows: Vec<(&str, f64)> = r[0].rows.iter().map(|x| (x.translator.as_str(), x.self_ns)).collect();
        // c0 waited 8000 ns; the brick's share is 10 calls x 400 ns = 4000.
        assert_eq!(
            rows,
            [("c1", 9000.0), ("c0 network+queue", 4000.0), ("posix", 3000.0), ("afr", 1000.0), ("stats", 1000.0)]
        );
        assert!(r[0].rows[0].note.as_deref().is_some_and(|n| n.contains("not reached: refused")));
        // In latency: afr waited 9000 ns for c0 and c1 in parallel (8000 +
        // 9000 ns): they share it, so the rows add up to the top's total.
        let part = |name: &str| r[0].rows.iter().find(|x| x.translator == name).and_then(|x| x.latency_ns);
        assert_eq!(part("afr"), Some(1000.0));
        assert!((part("c1").expect("c1") - 9000.0 * 9.0 / 17.0).abs() < 1e-6);
        assert!((part("posix").expect("posix") - 3000.0 * 9.0 / 17.0).abs() < 1e-6);
        assert!((r[0].accounted_ns() - 10_000.0).abs() < 1e-6, "{:?}", r[0].rows);
        // Behind: in its own table, in no latency.
        assert_eq!((r[1].kind, r[1].entry_calls, r[1].rows.len()), (FopKind::Fsync, 0, 0));
        assert_eq!(r[1].behind.len(), 1);
        assert_eq!((r[1].behind[0].translator.as_str(), r[1].behind[0].latency_ns), ("c0", None));
        assert!(r[1].behind[0].note.as_deref().is_some_and(|n| n.contains("counted no FSYNC")));
        let text = render_text(&b, &r);
        assert!(text.contains("WRITE: 10 calls at the top"), "{text}");
        assert!(text.contains("c0 network+queue (protocol/client) mount"), "{text}");
        assert!(text.contains("posix (storage/posix) brick h:1"), "{text}");
        assert!(text.contains("the rows add up to 1.0 us/call (100.0 %)"), "{text}");
        assert!(text.contains("behind, in no caller's latency"), "{text}");
        let json = render_json(&b, &r);
        assert!(
            json.starts_with("{\"graph\":\"afr\"") && json.contains("\"translator\":\"c0 network+queue\""),
            "{json}"
        );
        let back = ProfileBundle::parse(&b.to_text()).expect("parses");
        assert_eq!(back, b);
    }
}
