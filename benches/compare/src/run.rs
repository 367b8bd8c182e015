//! Bringing the systems up and down, running the workloads, cleaning up.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cpu::{self, Matcher, Meter};
use crate::parse::{parse_line, parse_remount, timed_remount};
use crate::report::{self, Sample};
use crate::{Args, Preset};

mod matrix;

use matrix::*;

/// Set by SIGINT or SIGTERM: stop after the running step and clean up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The process group of the running workload, for the signal thread to stop.
static RUNNING: AtomicI32 = AtomicI32::new(0);

/// `'text'` for bash.
fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Mount points in /proc/mounts.
fn mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(|m| m.replace("\\040", " ")))
        .collect()
}

fn is_mounted(p: &Path) -> bool {
    let p = p.to_string_lossy();
    mounts().iter().any(|m| *m == p)
}

/// Runs a setup command to its end (its own process group, so a Ctrl-C on
/// the terminal reaches only us); its output goes to the raw log.
fn setup_cmd(cmd: &mut Command, log: &mut File) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.stdin(Stdio::null()).process_group(0).output().with_context(|| what.clone())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = writeln!(log, "$ {what}\n{stdout}{stderr}");
    if !out.status.success() {
        bail!("{what}: {}: {}", out.status, stderr.trim());
    }
    Ok(stdout)
}

struct Ctx {
    xlfs: PathBuf,
    bench: PathBuf,
    work: PathBuf,
    log: File,
    systems: Vec<System>,
    /// The gluster-ref.sh directories used, with their volume.
    gluster_dirs: Vec<(PathBuf, String)>,
    /// The moosefs-ref.sh directory, if used.
    moosefs_dir: Option<PathBuf>,
    tmpfs: Option<PathBuf>,
    glusterd_before: bool,
    gluster_pids_before: Vec<u32>,
    pg_port: u16,
    /// lock-policy: count the lock fops of the xlfs columns' pgbench runs.
    count_locks: bool,
}

/// gluster-ref.sh's `up` for a distributed-replicated volume of `sets`
/// replica-3 sets (bricks DIR/b1..b{3 x sets}); prints MNT= and REMOUNT=
/// as the script does. Its `down` tears it down as well.
fn gluster_sets_up(dir: &Path, vol: &str, sets: u32) -> String {
    let d = sq(&dir.to_string_lossy());
    let bricks: Vec<String> = (1..=3 * sets).map(|i| format!("\"$HOST:\"{d}/b{i}")).collect();
    format!(
        r#"set -euo pipefail
HOST=$(hostname)
pgrep -x glusterd >/dev/null || {{ mkdir -p /var/log/glusterfs; glusterd; sleep 3; }}
mkdir -p {d}/mnt {dirs}
gluster volume info {vol} >/dev/null 2>&1 || gluster --mode=script volume create {vol} replica 3 {bricks} force >/dev/null
gluster volume info {vol} | grep -q 'Status: Started' || gluster volume start {vol} >/dev/null
mountpoint -q {d}/mnt || mount -t glusterfs "$HOST:/{vol}" {d}/mnt
echo "MNT='{raw}/mnt'"
echo "REMOUNT='umount {raw}/mnt && mount -t glusterfs $HOST:/{vol} {raw}/mnt'""#,
        raw = dir.display(),
        dirs = (1..=3 * sets).map(|i| format!("{d}/b{i}")).collect::<Vec<_>>().join(" "),
        bricks = bricks.join(" "),
    )
}

fn gluster_pids() -> Vec<u32> {
    cpu::pids()
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with("gluster")))
        .collect()
}

/// The mount point and remount command a reference script (gluster-ref.sh,
/// moosefs-ref.sh) printed as `MNT='...'` and `REMOUNT='...'`.
fn mnt_and_remount(script: &str, out: &str) -> Result<(PathBuf, String)> {
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim_matches('\'').to_string())
            .with_context(|| format!("{script} printed no {k}: {out}"))
    };
    Ok((PathBuf::from(get("MNT=")?), get("REMOUNT=")?))
}

/// The CPU seconds (client, bricks) `meter` counted since `prev`, which
/// becomes now.
fn since(meter: &Option<Meter>, prev: &mut (f64, f64)) -> (f64, f64) {
    let now = meter.as_ref().map(Meter::snapshot).unwrap_or_default();
    let d = (now.0 - prev.0, now.1 - prev.1);
    *prev = now;
    d
}

/// The row of `phase` carried on to the end of the remount and sync that
/// followed it (`secs` long, `dc` and `db` CPU seconds of the client and
/// the bricks): its work over the time of both, and the CPU of both.
fn through_remount(phase: &Sample, work: crate::parse::Work, secs: f64, dc: f64, db: f64, metered: bool) -> Sample {
    let amount = work.amount();
    let phase_secs = if phase.value > 0.0 { amount / phase.value } else { 0.0 };
    let (cc, cb) = (phase.cpu_client_s + dc, phase.cpu_bricks_s + db);
    Sample {
        round: phase.round,
        system: phase.system.clone(),
        label: format!("{} + {}", phase.label, crate::parse::REMOUNT_LABEL),
        unit: phase.unit.clone(),
        value: if phase_secs + secs > 0.0 { amount / (phase_secs + secs) } else { 0.0 },
        cpu: metered.then(|| (work.cost(cc + cb), work.cost_unit().to_string())),
        cpu_client_s: cc,
        cpu_bricks_s: cb,
        fops: Default::default(),
    }
}

/// The row of an untar and the rm of its tree together: the entries over
/// the time of both, and the CPU of both. A client that answers creates
/// and writes before its bricks have done them (xlfs's async directory
/// operations and write-behind) is still storing the tree when `tar`
/// returns, and `sync -f` does not wait for it (FUSE does not pass syncfs
/// on), so the rm after it waits for that work: the untar row alone flatters
/// such a client and the rm row alone blames it. None when `untar` and `rm`
/// are not the untar and rm of the same number of entries.
fn untar_cycle(untar: &Sample, rm: &Sample, metered: bool) -> Option<Sample> {
    let n = |label: &str, phase: &str| -> Option<f64> {
        let mut words = label.split_whitespace();
        if words.next()? != phase || label.contains(" + ") {
            return None;
        }
        crate::parse::field(label, "n")?.parse().ok()
    };
    let entries = n(&untar.label, "untar")?;
    if n(&rm.label, "rm-untar")? != entries || untar.value <= 0.0 || rm.value <= 0.0 {
        return None;
    }
    let secs = entries / untar.value + entries / rm.value;
    let work = crate::parse::Work::Files(entries);
    let (cc, cb) = (untar.cpu_client_s + rm.cpu_client_s, untar.cpu_bricks_s + rm.cpu_bricks_s);
    Some(Sample {
        round: rm.round,
        system: rm.system.clone(),
        label: format!("untar + rm-untar n={entries}"),
        unit: rm.unit.clone(),
        value: entries / secs,
        cpu: metered.then(|| (work.cost(cc + cb), work.cost_unit().to_string())),
        cpu_client_s: cc,
        cpu_bricks_s: cb,
        fops: Default::default(),
    })
}

impl Ctx {
    /// The xlfs binary of an xlfs system: its column's own, or `--xlfs`.
    fn bin(&self, s: &System) -> PathBuf {
        match &s.kind {
            Kind::Xlfs { bin: Some(b), .. } => b.clone(),
            _ => self.xlfs.clone(),
        }
    }

    /// Brings `s` up if it is not, and returns its mount point and remount command.
    fn up(&mut self, s: &System) -> Result<(PathBuf, String)> {
        let (mnt, remount) = match &s.kind {
            Kind::Local => {
                std::fs::create_dir_all(&s.dir)?;
                (s.dir.clone(), ":".to_string())
            }
            Kind::Xlfs { args, ra_policy, .. } => {
                let mnt = s.dir.join("mnt");
                let xlfs = self.bin(s);
                let x = xlfs.to_string_lossy().into_owned();
                let vol = s.dir.join("client.vol");
                let opts = args.iter().position(|a| a == "-o").and_then(|i| args.get(i + 1));
                // `xlfs umount` can return before the old mount process has
                // let go of its control socket; the new mount is retried
                // for up to 10 s.
                let remount = format!(
                    "{x} umount {m} && for i in $(seq 20); do {x} mount --volfile {v} --log-file {l}{o} {m} >/dev/null 2>&1 && exit 0; sleep 0.5; done; {x} mount --volfile {v} --log-file {l}{o} {m} >/dev/null",
                    x = sq(&x),
                    m = sq(&mnt.to_string_lossy()),
                    v = sq(&vol.to_string_lossy()),
                    l = sq(&s.dir.join("logs/mount.log").to_string_lossy()),
                    o = opts.map(|o| format!(" -o {}", sq(o))).unwrap_or_default(),
                );
                if !is_mounted(&mnt) {
                    let _ = setup_cmd(Command::new(&xlfs).arg("down").arg(&s.dir), &mut self.log);
                    setup_cmd(Command::new(&xlfs).arg("up").arg(&s.dir).args(args), &mut self.log)
                        .with_context(|| format!("bringing up {}", s.name))?;
                    if let Some(p) = ra_policy {
                        let text = std::fs::read_to_string(&vol)?;
                        let patched = text.replace(
                            "    type performance/read-ahead\n",
                            &format!("    type performance/read-ahead\n    option policy {p}\n"),
                        );
                        if !patched.contains(&format!("option policy {p}")) {
                            bail!("{}: no performance/read-ahead volume to set policy {p} on", vol.display());
                        }
                        std::fs::write(&vol, patched)?;
                        setup_cmd(Command::new("bash").arg("-c").arg(&remount), &mut self.log)?;
                    }
                }
                (mnt, remount)
            }
            Kind::Gluster { vol, set, sets } => {
                if !self.gluster_dirs.iter().any(|(d, _)| *d == s.dir) {
                    self.gluster_dirs.push((s.dir.clone(), vol.clone()));
                }
                let script = self.bench.join("gluster-ref.sh");
                let out = if *sets > 1 {
                    setup_cmd(Command::new("bash").arg("-c").arg(gluster_sets_up(&s.dir, vol, *sets)), &mut self.log)
                } else {
                    setup_cmd(Command::new("bash").arg(&script).arg("up").arg(&s.dir).arg(vol), &mut self.log)
                }
                .with_context(|| format!("bringing up {}", s.name))?;
                let (mnt, remount) = mnt_and_remount("gluster-ref.sh", &out)?;
                if !set.is_empty() {
                    for (k, v) in set {
                        setup_cmd(
                            Command::new("gluster").args(["--mode=script", "volume", "set", vol, k, v]),
                            &mut self.log,
                        )?;
                    }
                    setup_cmd(Command::new("bash").arg("-c").arg(&remount), &mut self.log)?;
                }
                (mnt, remount)
            }
            Kind::Moosefs => {
                self.moosefs_dir = Some(s.dir.clone());
                let script = self.bench.join("moosefs-ref.sh");
                let out = setup_cmd(Command::new("bash").arg(&script).arg("up").arg(&s.dir), &mut self.log)
                    .with_context(|| format!("bringing up {}", s.name))?;
                mnt_and_remount("moosefs-ref.sh", &out)?
            }
        };
        // The workloads run postgres as its own user.
        let _ = Command::new("chmod").arg("755").arg(&mnt).status();
        Ok((mnt, remount))
    }

    /// Takes an xlfs system down (GlusterFS ones are taken down at the end:
    /// the matrix's GlusterFS columns share one volume).
    fn down(&mut self, s: &System) {
        if let Kind::Xlfs { .. } = s.kind {
            let mnt = s.dir.join("mnt");
            let xlfs = self.bin(s);
            if is_mounted(&mnt) {
                let _ = setup_cmd(Command::new(&xlfs).arg("umount").arg(&mnt), &mut self.log);
            }
            if s.dir.exists() {
                let _ = setup_cmd(Command::new(&xlfs).arg("down").arg(&s.dir), &mut self.log);
            }
        }
    }

    /// One workload on one system: its phases as samples.
    fn step(&mut self, s: &System, w: &Workload, round: u32, pb: &ProgressBar) -> Result<Vec<Sample>> {
        let (mnt, remount) = self.up(s)?;
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        let meter = s.matcher().map(Meter::start);
        let raw = self.work.join("raw");
        std::fs::create_dir_all(&raw)?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(r#"exec bash "$0" "$@" 2>&1"#)
            .arg(self.bench.join(w.script))
            .arg(&mnt)
            .arg(timed_remount(&remount))
            .args(&w.args)
            .env("RAW", &raw)
            .env("PORT", self.pg_port.to_string())
            .envs(w.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().with_context(|| format!("running {}", w.script))?;
        RUNNING.store(child.id() as i32, Ordering::SeqCst);
        if INTERRUPTED.load(Ordering::SeqCst) {
            // SAFETY: kill(2) of the process group we just made.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
        }
        let mut samples = Vec::new();
        let mut prev = (0.0, 0.0);
        // The last phase reported (its sample's index and work): a remount
        // after it drains what it left queued.
        let mut last: Option<(usize, crate::parse::Work)> = None;
        let mut tail = Vec::new();
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(self.log, "{} | {line}", s.name);
            tail.push(line.clone());
            if tail.len() > 5 {
                tail.remove(0);
            }
            let profiled = self.count_locks && matches!(s.kind, Kind::Xlfs { .. });
            if profiled && line.starts_with("pgbench-init") {
                // Count from here: the run, not initdb and the table load.
                let _ = Command::new(self.bin(s)).args(["profile", "--reset"]).arg(&mnt).output();
            }
            if let Some(secs) = parse_remount(&line) {
                // The remount's CPU is not the next phase's. With the
                // phase before it, it makes a row of its own: that phase
                // until its work is on stable storage.
                let (dc, db) = since(&meter, &mut prev);
                if let Some((i, work)) = last.take() {
                    let through = through_remount(&samples[i], work, secs, dc, db, meter.is_some());
                    pb.suspend(|| {
                        eprintln!("  {:<12} {}: {} {}", s.name, through.label, report::num(through.value), through.unit)
                    });
                    samples.push(through);
                }
                continue;
            }
            let Some(p) = parse_line(&line) else { continue };
            let mut fops = std::collections::BTreeMap::new();
            if let (true, Some(crate::parse::Work::Txns(n))) = (profiled, p.work) {
                let out = Command::new(self.bin(s)).args(["profile", "--json"]).arg(&mnt).output()?;
                match crate::parse::lock_fops(&String::from_utf8_lossy(&out.stdout)) {
                    Some(m) => fops = m.into_iter().map(|(k, v)| (k, v / n)).collect(),
                    None => pb.suspend(|| eprintln!("xlfs-bench: `xlfs profile --json` gave no lock counts")),
                }
            }
            let (dc, db) = since(&meter, &mut prev);
            let cpu = match (&meter, p.work) {
                (Some(_), Some(work)) => Some((work.cost(dc + db), work.cost_unit().to_string())),
                _ => None,
            };
            let cpu_text = cpu.as_ref().map(|(c, u)| format!(", {} {u}", report::num(*c))).unwrap_or_default();
            pb.suspend(|| eprintln!("  {:<12} {}: {} {}{cpu_text}", s.name, p.label, report::num(p.value), p.unit));
            last = p.work.map(|w| (samples.len(), w));
            samples.push(Sample {
                round,
                system: s.name.clone(),
                label: p.label,
                unit: p.unit.to_string(),
                value: p.value,
                cpu,
                cpu_client_s: dc,
                cpu_bricks_s: db,
                fops,
            });
            let rm = &samples[samples.len() - 1];
            let cycle = samples
                .iter()
                .rev()
                .find(|u| u.label.split_whitespace().next() == Some("untar"))
                .and_then(|u| untar_cycle(u, rm, meter.is_some()));
            if let Some(c) = cycle {
                pb.suspend(|| eprintln!("  {:<12} {}: {} {}", s.name, c.label, report::num(c.value), c.unit));
                samples.push(c);
            }
        }
        let status = child.wait()?;
        RUNNING.store(0, Ordering::SeqCst);
        if !status.success() && !INTERRUPTED.load(Ordering::SeqCst) {
            bail!("{} on {} (round {round}): {status}; last output:\n{}", w.name, s.name, tail.join("\n"));
        }
        Ok(samples)
    }

    /// Stops every process whose command line names the work directory
    /// (SIGTERM, then SIGKILL after `grace`), except this process and its
    /// ancestors; with `keep_daemons`, not the xlfs and GlusterFS daemons
    /// (they are stopped by their own commands first).
    fn kill_strays(&self, keep_daemons: bool, grace: Duration) {
        let work = self.work.to_string_lossy().into_owned();
        let mut ancestors = vec![std::process::id()];
        let mut p = std::process::id();
        while let Some(pp) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok()))
        {
            if pp <= 1 {
                break;
            }
            ancestors.push(pp);
            p = pp;
        }
        let victims = || -> Vec<u32> {
            cpu::pids()
                .into_iter()
                .filter(|p| !ancestors.contains(p))
                .filter(|p| {
                    let Some(args) = cpu::cmdline(*p) else { return false };
                    if !args.iter().any(|a| a.contains(&work)) {
                        return false;
                    }
                    // (mfsmount calls itself "mfsmount (mounted on: DIR)")
                    let exe = args[0].split(' ').next().unwrap_or("").rsplit('/').next().unwrap_or("");
                    let daemon = exe.starts_with("gluster")
                        || exe.starts_with("mfs")
                        || matches!(args.get(1).map(String::as_str), Some("mount" | "brick" | "heal"));
                    !(keep_daemons && daemon)
                })
                .collect()
        };
        let first = victims();
        if first.is_empty() {
            return;
        }
        for p in &first {
            // SAFETY: kill(2) of a process whose command line names our work directory.
            unsafe { libc::kill(*p as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !victims().is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
        for p in victims() {
            // SAFETY: as above; it did not exit on SIGTERM.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
    }

    /// Stops and removes everything the run made; returns what is left, if anything.
    fn cleanup(&mut self) -> Vec<String> {
        let pg = RUNNING.swap(0, Ordering::SeqCst);
        if pg > 0 {
            // SAFETY: the process group of the workload we started.
            unsafe { libc::kill(-pg, libc::SIGKILL) };
        }
        // Workload leftovers first (a postgres server, fio), so the mounts are not busy.
        self.kill_strays(true, Duration::from_secs(15));
        for s in self.systems.clone() {
            self.down(&s);
        }
        for (d, vol) in self.gluster_dirs.clone() {
            let script = self.bench.join("gluster-ref.sh");
            let _ = setup_cmd(Command::new("bash").arg(&script).arg("down").arg(&d).arg(&vol), &mut self.log);
        }
        if let Some(d) = self.moosefs_dir.take() {
            let script = self.bench.join("moosefs-ref.sh");
            let _ = setup_cmd(Command::new("bash").arg(&script).arg("down").arg(&d), &mut self.log);
        }
        self.kill_strays(false, Duration::from_secs(10));
        let work = self.work.to_string_lossy().into_owned();
        let mut ours: Vec<String> = mounts().into_iter().filter(|m| m.starts_with(&work)).collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in &ours {
            let _ = setup_cmd(Command::new("umount").arg("-l").arg(m), &mut self.log);
        }
        if let Some(t) = &self.tmpfs
            && is_mounted(t)
        {
            let _ = setup_cmd(Command::new("umount").arg("-l").arg(t), &mut self.log);
        }
        // glusterd, if gluster-ref.sh started it, and what it started (the self-heal daemon).
        if !self.glusterd_before && !self.gluster_dirs.is_empty() {
            for p in gluster_pids() {
                if !self.gluster_pids_before.contains(&p) {
                    // SAFETY: a GlusterFS process that appeared during this run, whose glusterd we started.
                    unsafe { libc::kill(p as i32, libc::SIGTERM) };
                }
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && gluster_pids().iter().any(|p| !self.gluster_pids_before.contains(p)) {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let _ = std::fs::remove_dir_all(&self.work);
        let mut left: Vec<String> =
            mounts().into_iter().filter(|m| m.starts_with(&work)).map(|m| format!("mount {m}")).collect();
        for p in cpu::pids() {
            if let Some(a) = cpu::cmdline(p)
                && a.iter().any(|x| x.contains(&work))
                && p != std::process::id()
            {
                left.push(format!("process {p}: {}", a.join(" ")));
            }
        }
        if !self.glusterd_before && !self.gluster_dirs.is_empty() {
            for p in gluster_pids() {
                if !self.gluster_pids_before.contains(&p) {
                    left.push(format!("GlusterFS process {p}"));
                }
            }
        }
        if self.work.exists() {
            left.push(format!("directory {}", self.work.display()));
        }
        left
    }
}

fn find_bench_dir(args: &Args) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match &args.bench_dir {
        Some(d) => vec![d.clone()],
        None => {
            vec![PathBuf::from("../shared/bench"), Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench")]
        }
    };
    for c in &candidates {
        if c.join("fio-seq.sh").exists() {
            return Ok(std::fs::canonicalize(c)?);
        }
    }
    bail!("the workload scripts (fio-seq.sh ...) are not in {candidates:?}; give --bench-dir")
}

/// results.md and results.png in `out` from the samples and the header.
fn write_results(
    out: &Path,
    samples: &[Sample],
    names: &[String],
    header: &str,
    failures: &[String],
) -> Result<String> {
    let mut md = header.to_string();
    md += &report::render(samples, names, 5);
    if !failures.is_empty() {
        md += "\nFailed steps:\n\n";
        for f in failures {
            md += &format!("- {}\n", f.lines().next().unwrap_or(""));
        }
    }
    let png = out.join("results.png");
    match crate::chart::draw(samples, names, "median (whisker: min-max), higher is better", &png) {
        Ok(()) => md += "\n![chart](results.png)\n",
        Err(e) => eprintln!("xlfs-bench: no chart: {e:#}"),
    }
    std::fs::write(out.join("results.md"), &md)?;
    Ok(md)
}

/// `--render`: the table and chart again from `out`/samples.json.
fn render_only(out: &Path) -> Result<u8> {
    let path = out.join("samples.json");
    let samples: Vec<Sample> =
        serde_json::from_str(&std::fs::read_to_string(&path).with_context(|| path.display().to_string())?)?;
    let mut names: Vec<String> = Vec::new();
    for s in &samples {
        if !names.contains(&s.system) {
            names.push(s.system.clone());
        }
    }
    let header = format!("# xlfs-bench\n\nRe-rendered from {} on {}.\n\n", path.display(), chrono_now());
    let md = write_results(out, &samples, &names, &header, &[])?;
    let _ = writeln!(std::io::stdout(), "{md}");
    Ok(0)
}

/// The whole run; the exit code.
pub fn main(args: Args) -> Result<u8> {
    if args.render {
        return render_only(&args.out);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (mount, drop_caches, runuser postgres)");
    }
    if !args.xlfs.exists() {
        bail!("{}: missing: run `cargo build --release` first (or give --xlfs)", args.xlfs.display());
    }
    let xlfs = std::fs::canonicalize(&args.xlfs)?;
    let bench = find_bench_dir(&args)?;
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let work = args.workdir.clone().unwrap_or_else(|| PathBuf::from(format!("/srv/xlfs-bench.{}", std::process::id())));
    if work.exists() {
        bail!("{}: exists; give a --workdir that does not (the run removes it at the end)", work.display());
    }
    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let out = std::fs::canonicalize(&args.out)?;
    std::fs::create_dir_all(&work)?;
    let work = std::fs::canonicalize(&work)?;
    let log = File::create(out.join("raw.log"))?;

    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if !INTERRUPTED.swap(true, Ordering::SeqCst) {
                eprintln!("\nxlfs-bench: signal {sig}: stopping the running workload and cleaning up");
            }
            let pg = RUNNING.load(Ordering::SeqCst);
            if pg > 0 {
                // SAFETY: the process group of the workload we started.
                unsafe { libc::kill(-pg, libc::SIGTERM) };
            }
        }
    });

    let vol = format!("xb{}", std::process::id());
    let systems = systems(&args, &work, &vol)?;
    let mut ctx = Ctx {
        xlfs,
        bench,
        work: work.clone(),
        log,
        systems: systems.clone(),
        gluster_dirs: Vec::new(),
        moosefs_dir: None,
        tmpfs: None,
        glusterd_before: gluster_pids()
            .iter()
            .any(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "glusterd")),
        gluster_pids_before: gluster_pids(),
        pg_port: args.pg_port,
        count_locks: args.preset == Some(Preset::LockPolicy),
    };
    let started = chrono_now();
    // A panic still cleans up (then goes on unwinding).
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_all(&args, &mut ctx, &systems, rounds)));
    eprintln!("xlfs-bench: cleaning up {}", work.display());
    let left = ctx.cleanup();
    handle.close();
    let result = match result {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    if !left.is_empty() {
        eprintln!("xlfs-bench: warning: left after cleanup:\n  {}", left.join("\n  "));
    }
    let (samples, failures) = result?;
    let names: Vec<String> = systems.iter().map(|s| s.name.clone()).collect();
    let interrupted = INTERRUPTED.load(Ordering::SeqCst);
    let header = format!(
        "# xlfs-bench: {}\n\n{} {}, {rounds} round(s){}; `{}`.\n\n",
        match args.preset {
            Some(Preset::SeqReadMatrix) => "sequential read matrix",
            Some(Preset::LockPolicy) => "lock-contention policies under pgbench",
            None if systems.iter().any(|s| s.kind == Kind::Moosefs) => "xlfs, GlusterFS, MooseFS and a local disk",
            None => "xlfs, GlusterFS and a local disk",
        },
        started,
        if args.quick { "quick mode" } else { "full mode" },
        if interrupted { " (interrupted: partial results)" } else { "" },
        std::env::args().collect::<Vec<_>>().join(" "),
    );
    let md = write_results(&out, &samples, &names, &header, &failures)?;
    std::fs::write(out.join("samples.json"), serde_json::to_string_pretty(&samples)?)?;
    let _ = writeln!(std::io::stdout(), "{md}");
    eprintln!("xlfs-bench: wrote {}/results.md, results.png, samples.json, raw.log", out.display());
    Ok(if interrupted {
        130
    } else if failures.is_empty() && left.is_empty() {
        0
    } else {
        1
    })
}

/// The date and time now, UTC, from `date` (no date crate for one line).
fn chrono_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The systems in the order round `r` (from 1) runs them: as given in odd
/// rounds, reversed in even ones (A B C, C B A, A B C ...), so that going
/// first or last (after another system's teardown, with the disk still
/// writing back) falls on every system alike over the rounds.
fn round_order<T>(systems: &[T], r: u32) -> Vec<&T> {
    if r.is_multiple_of(2) { systems.iter().rev().collect() } else { systems.iter().collect() }
}

fn run_all(args: &Args, ctx: &mut Ctx, systems: &[System], rounds: u32) -> Result<(Vec<Sample>, Vec<String>)> {
    if systems.iter().any(|s| s.dir.starts_with(ctx.work.join("tmpfs"))) {
        let t = ctx.work.join("tmpfs");
        std::fs::create_dir_all(&t)?;
        setup_cmd(Command::new("mount").args(["-t", "tmpfs", "-o", "size=8g", "xlfs-bench"]).arg(&t), &mut ctx.log)?;
        ctx.tmpfs = Some(t);
    }
    let wls = workloads(args, &ctx.work)?;
    let steps = rounds as u64 * wls.len() as u64 * systems.len() as u64;
    let pb = ProgressBar::new(steps);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} (eta {eta}) {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(500));
    let (mut samples, mut failures) = (Vec::new(), Vec::new());
    'rounds: for r in 1..=rounds {
        for w in &wls {
            for s in round_order(systems, r) {
                if INTERRUPTED.load(Ordering::SeqCst) {
                    break 'rounds;
                }
                pb.set_message(format!("round {r}/{rounds}: {} on {}", w.name, s.name));
                pb.suspend(|| eprintln!("== round {r}/{rounds}: {} on {}", w.name, s.name));
                match ctx.step(s, w, r, &pb) {
                    Ok(mut v) => {
                        if args.preset == Some(Preset::SeqReadMatrix) {
                            v.retain(|x| x.label.starts_with("seq-read"));
                        }
                        samples.append(&mut v);
                    }
                    Err(e) => {
                        pb.suspend(|| eprintln!("xlfs-bench: step failed: {e:#}"));
                        failures.push(format!("{e:#}"));
                    }
                }
                if s.fresh {
                    ctx.down(s);
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    Ok((samples, failures))
}

#[cfg(test)]
mod tests {
    use super::{Sample, round_order, untar_cycle};

    fn sample(label: &str, value: f64, cpu_client_s: f64, cpu_bricks_s: f64) -> Sample {
        Sample {
            round: 1,
            system: "xlfs".into(),
            label: label.into(),
            unit: "files/s".into(),
            value,
            cpu: None,
            cpu_client_s,
            cpu_bricks_s,
            fops: Default::default(),
        }
    }

    #[test]
    fn the_untar_cycle_is_the_untar_and_its_rm_over_their_time() {
        // 1000 entries: untar 2 s, rm 8 s.
        let untar = sample("untar n=1000", 500.0, 1.0, 2.0);
        let rm = sample("rm-untar n=1000", 125.0, 0.5, 4.5);
        let c = untar_cycle(&untar, &rm, true).expect("a cycle");
        assert_eq!(c.label, "untar + rm-untar n=1000");
        assert!((c.value - 100.0).abs() < 1e-9, "1000 entries in 10 s: {}", c.value);
        let (cost, unit) = c.cpu.clone().expect("metered");
        assert_eq!(unit, "CPU ms/file");
        assert!((cost - 8.0).abs() < 1e-9, "8 CPU s over 1000 files: {cost}");
        assert!(untar_cycle(&untar, &rm, false).expect("a cycle").cpu.is_none());
        // Not a pair: other phases, other counts, the cycle row itself.
        assert!(untar_cycle(&sample("rm n=1000", 10.0, 0.0, 0.0), &rm, true).is_none());
        assert!(untar_cycle(&untar, &sample("rm-untar n=999", 10.0, 0.0, 0.0), true).is_none());
        assert!(untar_cycle(&c, &rm, true).is_none());
    }

    #[test]
    fn rounds_alternate_the_order_of_the_systems() {
        let s = ["xlfs", "glusterfs", "ext4"];
        let order = |r| round_order(&s, r).into_iter().copied().collect::<Vec<_>>();
        assert_eq!(order(1), ["xlfs", "glusterfs", "ext4"]);
        assert_eq!(order(2), ["ext4", "glusterfs", "xlfs"]);
        assert_eq!(order(3), order(1));
    }
}
