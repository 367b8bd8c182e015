//! What a run compares: the systems (xlfs with its variants, GlusterFS,
//! MooseFS, the local disk) and the workloads, from the command line's
//! preset.

use super::*;

/// How a system is provided.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    /// `xlfs up DIR ARGS`, then, when set, read-ahead's `policy` option
    /// written into the client volfile (and the client remounted).
    /// `bin` is another xlfs binary than `--xlfs` (a column `NAME=@PATH ...`).
    Xlfs { args: Vec<String>, ra_policy: Option<String>, bin: Option<PathBuf> },
    /// gluster-ref.sh with this volume (or, for more than one replica-3
    /// set, the same steps with `3 x sets` bricks: distribute over
    /// replicate), then these `gluster volume set` options (and the
    /// client remounted).
    Gluster { vol: String, set: Vec<(String, String)>, sets: u32 },
    /// moosefs-ref.sh: a MooseFS master, three chunkservers and a mount,
    /// every chunk stored three times (one at a time: it takes the
    /// default MooseFS ports).
    Moosefs,
    /// A directory.
    Local,
}

/// One column of the table.
#[derive(Debug, Clone)]
pub(super) struct System {
    pub(super) name: String,
    pub(super) kind: Kind,
    /// Its directory under the work directory.
    pub(super) dir: PathBuf,
    /// Brought down after each step (the matrix has many columns).
    pub(super) fresh: bool,
}

impl System {
    pub(super) fn matcher(&self) -> Option<Matcher> {
        let d = self.dir.to_string_lossy().into_owned();
        match self.kind {
            Kind::Xlfs { .. } => Some(Matcher::Xlfs(d)),
            Kind::Gluster { .. } => Some(Matcher::Gluster(d)),
            Kind::Moosefs => Some(Matcher::Moosefs(d)),
            Kind::Local => None,
        }
    }
}

/// One workload with its arguments after MOUNT and REMOUNT.
#[derive(Debug, Clone)]
pub(super) struct Workload {
    pub(super) name: String,
    pub(super) script: &'static str,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
}

/// The systems of the standard comparison or of a preset.
pub(super) fn systems(args: &Args, work: &Path, vol: &str) -> Result<Vec<System>> {
    let mut v = Vec::new();
    if args.sets == 0 {
        bail!("--sets: at least one replica set");
    }
    let sets = args.sets;
    let xlfs = |name: &str, dir: PathBuf, mut args: Vec<String>| {
        if sets > 1 {
            args.extend(["--sets".to_string(), sets.to_string()]);
        }
        System { name: name.into(), kind: Kind::Xlfs { args, ra_policy: None, bin: None }, dir, fresh: false }
    };
    let gluster = |name: &str, dir: PathBuf, vol: String| System {
        name: name.into(),
        kind: Kind::Gluster { vol, set: Vec::new(), sets: args.sets },
        dir,
        fresh: false,
    };
    let ext4 = || System { name: "ext4".into(), kind: Kind::Local, dir: work.join("ext4"), fresh: false };
    if args.preset == Some(Preset::SeqReadMatrix) {
        // Where GlusterFS puts them: io-threads on top of the client's
        // performance translators, read-ahead just above write-behind.
        // Each policy: its column name and the value of read-ahead's
        // `policy` option.
        let mut policies: Vec<Option<(String, String)>> = vec![
            None,
            Some(("tolerant".into(), "tolerant".into())),
            Some(("gluster-strict".into(), "gluster-strict".into())),
        ];
        for spec in &args.ra_plugin {
            policies.push(Some((format!("plugin:{}", plugin_stem(spec)), spec.clone())));
        }
        for iot in [false, true] {
            for ra in &policies {
                let mut perf = Vec::new();
                if iot {
                    perf.push("io-threads");
                }
                perf.extend(["md-cache", "quick-read", "open-behind", "readdir-ahead"]);
                if ra.is_some() {
                    perf.push("read-ahead");
                }
                perf.push("write-behind");
                let ra_name = ra.as_ref().map_or("off", |(n, _)| n.as_str());
                let name = format!("xlfs ra={ra_name} iot={}", if iot { "on" } else { "off" });
                v.push(System {
                    dir: work.join(format!("xm{}", v.len())),
                    name,
                    kind: Kind::Xlfs {
                        args: vec!["--perf".into(), perf.join(",")],
                        ra_policy: ra.as_ref().map(|(_, spec)| spec.clone()),
                        bin: None,
                    },
                    fresh: true,
                });
            }
        }
        for iot in ["off", "on"] {
            for ra in ["off", "on"] {
                v.push(System {
                    name: format!("glusterfs ra={ra} iot={iot}"),
                    kind: Kind::Gluster {
                        vol: vol.into(),
                        sets: 1,
                        set: vec![
                            ("performance.read-ahead".into(), ra.into()),
                            ("performance.client-io-threads".into(), iot.into()),
                        ],
                    },
                    dir: work.join("gl"),
                    fresh: false,
                });
            }
        }
        v.push(ext4());
        return Ok(v);
    }
    if args.preset == Some(Preset::LockPolicy) {
        let mut policies: Vec<(String, String)> =
            ["fd-count", "inodelk-count", "notify"].iter().map(|p| (p.to_string(), p.to_string())).collect();
        for spec in &args.lock_plugin {
            policies.push((format!("plugin:{}", plugin_stem(spec)), spec.clone()));
        }
        for (name, spec) in policies {
            let dir = work.join(format!("xl{}", v.len()));
            v.push(System {
                name: format!("xlfs lock={name}"),
                kind: Kind::Xlfs {
                    args: vec!["--afr".into(), format!("lock-contention-policy={spec}")],
                    ra_policy: None,
                    bin: None,
                },
                dir,
                fresh: true,
            });
        }
        // The references the --systems list names (default: both).
        if args.systems.iter().any(|s| s == "glusterfs") {
            v.push(gluster("glusterfs", work.join("gl"), vol.into()));
        }
        if args.systems.iter().any(|s| s == "ext4") {
            v.push(ext4());
        }
        return Ok(v);
    }
    for s in &args.systems {
        match s.as_str() {
            "xlfs" => {
                v.push(xlfs("xlfs", work.join("xlfs"), Vec::new()));
                for c in &args.xlfs_columns {
                    let (name, a) =
                        c.split_once('=').with_context(|| format!("--xlfs-column {c:?}: expected NAME=ARGS"))?;
                    let name = name.trim();
                    if name.is_empty() || report::is_reference(name) || v.iter().any(|x: &System| x.name == name) {
                        bail!(
                            "--xlfs-column {c:?}: the name must be new and not start with glusterfs, moosefs or ext4"
                        );
                    }
                    let dir = work.join(format!("xc{}", v.len()));
                    let mut up: Vec<String> = a.split_whitespace().map(String::from).collect();
                    let bin = match up.first().and_then(|t| t.strip_prefix('@')) {
                        Some(path) => {
                            let bin = std::fs::canonicalize(path)
                                .with_context(|| format!("--xlfs-column {c:?}: the binary {path}"))?;
                            up.remove(0);
                            Some(bin)
                        }
                        None => None,
                    };
                    let mut column = xlfs(name, dir, up);
                    if let Kind::Xlfs { bin: b, .. } = &mut column.kind {
                        *b = bin;
                    }
                    v.push(column);
                }
            }
            "glusterfs" => v.push(gluster("glusterfs", work.join("gl"), vol.into())),
            "moosefs" => {
                v.push(System { name: "moosefs".into(), kind: Kind::Moosefs, dir: work.join("mfs"), fresh: false })
            }
            "ext4" => v.push(ext4()),
            other => bail!("--systems: unknown system {other:?} (xlfs, glusterfs, moosefs, ext4)"),
        }
    }
    if args.tmpfs {
        let t = work.join("tmpfs");
        v.push(xlfs("xlfs-tmpfs", t.join("xlfs"), Vec::new()));
        v.push(gluster("glusterfs-tmpfs", t.join("gl"), format!("{vol}t")));
        if args.systems.iter().any(|s| s == "ext4") {
            v.push(System { name: "tmpfs".into(), kind: Kind::Local, dir: t.join("local"), fresh: false });
        }
    }
    Ok(v)
}

/// A small tarball for --quick's untar (smallfile.sh's default untars 3617
/// entries, which alone takes half a minute on GlusterFS): 20 directories
/// of 20 files of 1-8 KiB.
pub(super) fn quick_tarball(work: &Path) -> Result<PathBuf> {
    let src = work.join("fixture/tree");
    for d in 0..20 {
        let dir = src.join(format!("pkg{d}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..20 {
            let len = 1024 + (d * 20 + f) * 389 % 7168;
            std::fs::write(dir.join(format!("mod{f}.py")), "x".repeat(len))?;
        }
    }
    let tar = work.join("fixture/tree.tar");
    let st = Command::new("tar").arg("cf").arg(&tar).arg("-C").arg(&src).arg(".").status()?;
    if !st.success() {
        bail!("tar cf {}: {st}", tar.display());
    }
    Ok(tar)
}

pub(super) fn workloads(args: &Args, work: &Path) -> Result<Vec<Workload>> {
    let q = args.quick;
    if let Some(size) = &args.fio_size
        && crate::parse::parse_size(size).is_none()
    {
        bail!("--fio-size {size:?}: expected e.g. 512m or 1g");
    }
    if args.numjobs.contains(&0) {
        bail!("--numjobs: a job count must be at least 1");
    }
    // Each job's file: the 512 MiB for one job, 4 x 256 MiB for more.
    let size_for = |nj: u32| {
        args.fio_size.clone().unwrap_or_else(|| {
            (if q {
                "128m"
            } else if nj > 1 {
                "256m"
            } else {
                "512m"
            })
            .into()
        })
    };
    let fio = |nj: u32, size: &str| Workload {
        name: format!("fio-seq nj={nj}"),
        script: "fio-seq.sh",
        args: vec![size.into(), nj.to_string(), "1".into()],
        env: Vec::new(),
    };
    if args.preset == Some(Preset::LockPolicy) {
        return Ok(vec![Workload {
            name: "pgbench".into(),
            script: "pgbench.sh",
            args: vec!["1".into()],
            env: vec![("TXNS".into(), args.txns.unwrap_or(if q { 250 } else { 2000 }).to_string())],
        }]);
    }
    if args.preset == Some(Preset::SeqReadMatrix) {
        let size = args.fio_size.clone().unwrap_or_else(|| (if q { "64m" } else { "256m" }).into());
        let njs = if args.numjobs.is_empty() { vec![1, 2, 4] } else { args.numjobs.clone() };
        return Ok(njs.iter().map(|nj| fio(*nj, &size)).collect());
    }
    let mut v = Vec::new();
    for w in &args.workloads {
        v.push(match w.as_str() {
            "fio-seq" => {
                let njs = if args.numjobs.is_empty() { vec![1] } else { args.numjobs.clone() };
                v.extend(njs.iter().map(|nj| fio(*nj, &size_for(*nj))));
                continue;
            }
            "smallfile" => {
                let files = args.files.clone().unwrap_or_else(|| (if q { "10x50" } else { "50x100" }).into());
                let (d, f) = files
                    .split_once('x')
                    .and_then(|(d, f)| Some((d.parse::<u32>().ok()?, f.parse::<u32>().ok()?)))
                    .with_context(|| format!("--files {files:?}: expected DIRSxFILES, e.g. 50x100"))?;
                let mut a = vec!["1".to_string()];
                if q {
                    a.push(quick_tarball(work)?.to_string_lossy().into_owned());
                }
                Workload {
                    name: "smallfile".into(),
                    script: "smallfile.sh",
                    args: a,
                    env: vec![("NDIRS".into(), d.to_string()), ("NFILES".into(), f.to_string())],
                }
            }
            "pgbench" => Workload {
                name: "pgbench".into(),
                script: "pgbench.sh",
                args: vec!["1".into()],
                env: vec![("TXNS".into(), args.txns.unwrap_or(if q { 250 } else { 2000 }).to_string())],
            },
            other => bail!("--workloads: unknown workload {other:?} (fio-seq, smallfile, pgbench)"),
        });
    }
    Ok(v)
}

/// The file stem of a policy module spec (`wasm:/p/ra.wasm` -> `ra`), to
/// name its column.
fn plugin_stem(spec: &str) -> String {
    Path::new(spec.split_once(':').map_or(spec, |(_, p)| p))
        .file_stem()
        .map_or("plugin".into(), |s| s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_read_matrix_has_a_column_per_policy_plugin_too() {
        let args = Args::parse_from([
            "xlfs-bench",
            "--preset",
            "seq-read-matrix",
            "--ra-plugin",
            "wasm:/p/xlfs_plugin_ra_tolerant.wasm",
        ]);
        let systems = systems(&args, Path::new("/w"), "gv").expect("systems");
        let names: Vec<&str> = systems.iter().map(|s| s.name.as_str()).collect();
        for iot in ["off", "on"] {
            for ra in ["off", "tolerant", "gluster-strict", "plugin:xlfs_plugin_ra_tolerant"] {
                assert!(names.contains(&format!("xlfs ra={ra} iot={iot}").as_str()), "{names:?}");
            }
        }
        let plugin =
            systems.iter().find(|s| s.name == "xlfs ra=plugin:xlfs_plugin_ra_tolerant iot=on").expect("column");
        let Kind::Xlfs { args, ra_policy, .. } = &plugin.kind else { panic!("an xlfs column") };
        assert_eq!(ra_policy.as_deref(), Some("wasm:/p/xlfs_plugin_ra_tolerant.wasm"));
        assert!(args.iter().any(|a| a.starts_with("io-threads,") && a.contains("read-ahead")), "{args:?}");
        assert_eq!(names.iter().filter(|n| n.starts_with("glusterfs")).count(), 4);
    }
}
