//! `xlfs daemon` and `xlfs volume` end to end, through the `xlfs` binary:
//! a replica-3 volume created, started, mounted by name, reconfigured
//! live, a brick killed and restarted by the daemon and healed, stopped
//! and deleted; and every bad input refused with its reason, changing
//! nothing.

mod kit;
mod plugin_kit;

use std::path::Path;
use std::time::Duration;

use kit::daemon::{
    Daemon, brick_arg, brick_dirs, force_if_root, free_port, generation, graph_of, mount_status, replica3_args, strs,
    wait_for,
};
use kit::fuse_mount::FuseMount;

/// How long a condition may take to come true: a hang guard.
const DEADLINE: Duration = Duration::from_secs(60);

/// The distinct scheduling policies of a process's threads (field 41 of
/// `/proc/PID/task/TID/stat`).
fn thread_policies(pid: u32) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter_map(|stat| {
            let after_comm = &stat[stat.rfind(')')? + 2..];
            after_comm.split_whitespace().nth(41 - 3)?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The pid of the volume's self-heal daemon, if `volume status` shows it up.
fn shd(d: &Daemon, vol: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(&d.ok(&["status", vol, "--json"])).expect("status is JSON");
    let shd = &v["volumes"][0]["shd"];
    (shd["up"] == true).then(|| shd["pid"].as_u64().map(|p| p as u32)).flatten()
}

fn xattr_set(dir: &Path, name: &str) -> bool {
    let out = std::process::Command::new("getfattr").arg("-n").arg(name).arg(dir).output();
    match out {
        Ok(o) => o.status.success(),
        Err(_) => {
            // No getfattr: ask the kernel directly.
            let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
            let n = std::ffi::CString::new(name).expect("name");
            // SAFETY: valid C strings; a zero-length query.
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
        }
    }
}

#[test]
fn volume_lifecycle_mount_by_name_live_set_and_brick_restart() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-vol-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 3);
    let mut d = Daemon::start();

    let create = replica3_args("create", "gv0", dirs.iter().map(|p| brick_arg(p)), force_if_root(tmp.path()));
    let out = d.ok(&strs(&create));
    assert!(out.contains("volume create: gv0: success"), "{out}");
    for dir in &dirs {
        assert!(xattr_set(dir, "trusted.glusterfs.volume-id"), "{} is marked", dir.display());
    }
    let info = d.ok(&["info", "gv0"]);
    assert!(
        info.contains("name = \"gv0\"") && info.contains("replica = 3") && info.contains("status = \"created\""),
        "{info}"
    );

    assert!(d.ok(&["start", "gv0"]).contains("volume start: gv0: success"));
    let b = d.bricks("gv0");
    assert!(b.iter().all(|(port, pid, up, _)| port.is_some() && pid.is_some() && *up), "{b:?}");
    // Every thread of every brick runs SCHED_BATCH (xlfs's default, XLFS_SCHED).
    for (_, pid, _, _) in &b {
        let pid = pid.expect("pid");
        assert_eq!(thread_policies(pid), vec![libc::SCHED_BATCH], "brick {pid}'s threads");
    }
    // The volume's self-heal daemon runs (`volume status` shows it).
    let shd_pid = wait_for("the self-heal daemon to run", DEADLINE, || shd(&d, "gv0"));
    assert!(std::path::Path::new(&format!("/proc/{shd_pid}")).exists());
    let table = d.ok(&["status", "gv0"]);
    assert!(table.lines().any(|l| l.starts_with("Self-heal Daemon") && l.contains(&shd_pid.to_string())), "{table}");
    assert!(table.contains("Brick") && table.contains("Disk free") && table.contains(&brick_arg(&dirs[0])), "{table}");
    // The portmapper knows each brick's port.
    for (i, dir) in dirs.iter().enumerate() {
        assert_eq!(d.ok(&["portmap", &brick_arg(dir)]).trim(), b[i].0.expect("port").to_string());
    }

    // Mount by name and use it.
    let source = format!("{}:/gv0", d.addr());
    // At most one ask an hour: every change below reaches the mount because
    // the daemon answers a waiting ask as soon as the volfile changes.
    let m = FuseMount::start_by_name(&source, "", &["--spec-interval", "3600"]);
    let mnt = m.path().to_path_buf();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(mnt.join("hello"), &data).expect("write through the mount");
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read back"), data);
    let before = mount_status(&mnt);
    assert!(graph_of(&before).contains("gv0-write-behind"), "{before}");

    // volume set changes the mounted client's graph, without a remount.
    let pid = m.pid();
    assert_eq!(thread_policies(pid), vec![libc::SCHED_BATCH], "the mount's threads");
    assert!(d.ok(&["set", "gv0", "performance.write-behind", "off"]).contains("performance.write-behind = off"));
    let after = wait_for("the mount to drop write-behind", DEADLINE, || {
        let s = mount_status(&mnt);
        (!graph_of(&s).contains("gv0-write-behind")).then_some(s)
    });
    assert!(generation(&after) > generation(&before), "a new graph runs:\n{after}");
    assert_eq!(m.pid(), pid, "same mount process");
    assert!(kit::fuse_mount::is_mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read after the switch"), data);
    let got = d.ok(&["get", "gv0", "performance.write-behind"]);
    assert!(got.contains("performance.write-behind") && got.contains("off") && got.contains("set"), "{got}");
    // An option key is reconfigured in place (the graph's shape stays).
    d.ok(&["set", "gv0", "performance.md-cache-timeout", "5"]);
    let reconf = wait_for("md-cache-timeout reconfigured in the mount's graph", DEADLINE, || {
        let s = mount_status(&mnt);
        s.lines()
            .any(|l| l.starts_with("last reload") && l.contains("reconfigured") && l.contains("md-cache-timeout"))
            .then_some(s)
    });
    assert_eq!(generation(&reconf), generation(&after), "reconfigured in place:\n{reconf}");

    // A plugin key puts a wasm translator in the mounted client's graph
    // (above the performance translators, below io-stats); reset takes it
    // out; the file stays readable throughout.
    let passthrough = format!("wasm:{}", plugin_kit::wasm("passthrough").display());
    assert!(d.ok(&["set", "gv0", "plugin.pt-probe", &passthrough]).contains("plugin.pt-probe"));
    let with_plugin = wait_for("the mount to load the plugin", DEADLINE, || {
        let s = mount_status(&mnt);
        graph_of(&s).contains("pt-probe").then_some(s)
    });
    assert!(graph_of(&with_plugin).contains("plugin/wasm"), "{with_plugin}");
    assert!(d.ok(&["getspec", "gv0"]).contains("subvolumes pt-probe\nend-volume"), "io-stats sits on the plugin");
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read through the plugin"), data);
    assert!(d.ok(&["get", "gv0", "all"]).lines().any(|l| l.starts_with("plugin.pt-probe") && l.ends_with("set")));
    // The plugin's own options are keys of their own, checked against what
    // its module declares; the mount applies one as any option.
    let e = d.refused(&["set", "gv0", "plugin.pt-probe.nope", "on"]);
    assert!(e.contains("key plugin.pt-probe.nope") && e.contains("declares no option 'nope'"), "{e}");
    let e = d.refused(&["set", "gv0", "plugin.pt-probe.tail", "maybe"]);
    assert!(e.contains("key plugin.pt-probe.tail") && e.contains("option 'tail'"), "{e}");
    let e = d.refused(&["set", "gv0", "plugin.absent.tail", "on"]);
    assert!(e.contains("no plugin 'absent'") && e.contains("set plugin.absent first"), "{e}");
    d.ok(&["set", "gv0", "plugin.pt-probe.tail", "on"]);
    let module = plugin_kit::wasm("passthrough").display().to_string();
    let spec = d.ok(&["getspec", "gv0"]);
    assert!(spec.contains(&format!("option module {module}\n    option tail on\n")), "{spec}");
    wait_for("the mount to apply the plugin's option", DEADLINE, || {
        mount_status(&mnt).lines().any(|l| l.starts_with("last reload") && l.contains("tail off -> on")).then_some(())
    });
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read through the plugin's tail winds"), data);
    let got = d.ok(&["get", "gv0", "plugin.pt-probe.tail"]);
    assert!(got.contains("plugin.pt-probe.tail") && got.contains("on"), "{got}");
    // A plugin whose descriptor asks for the cluster place (access-log,
    // plugin ABI v1.4) goes below the performance translators.
    let faults = format!("wasm:{}", plugin_kit::wasm("access-log").display());
    d.ok(&["set", "gv0", "plugin.faults", &faults]);
    let spec = d.ok(&["getspec", "gv0"]);
    let module = plugin_kit::wasm("access-log").display().to_string();
    assert!(
        spec.contains(&format!(
            "volume faults\n    type plugin/wasm\n    option module {module}\n    subvolumes gv0-utime\n"
        )) && spec.contains("subvolumes faults\nend-volume")
            && spec.contains("subvolumes pt-probe\nend-volume"),
        "{spec}"
    );
    wait_for("the mount to load the cluster-placed plugin", DEADLINE, || {
        graph_of(&mount_status(&mnt)).contains("faults").then_some(())
    });
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read through both plugins"), data);
    d.ok(&["reset", "gv0", "plugin.faults"]);
    d.ok(&["reset", "gv0", "plugin.pt-probe"]);
    assert!(d.ok(&["get", "gv0", "plugin.pt-probe.tail"]).contains("(unset)"), "its options go with it");
    let without = wait_for("the mount to drop the plugin", DEADLINE, || {
        let s = mount_status(&mnt);
        (!graph_of(&s).contains("pt-probe")).then_some(s)
    });
    assert!(generation(&without) > generation(&with_plugin), "{without}");
    assert_eq!(std::fs::read(mnt.join("hello")).expect("read without the plugin"), data);
    assert_eq!(m.pid(), pid, "same mount process");
    // A policy key with a built-in policy is a reconfigure of replicate.
    d.ok(&["set", "gv0", "cluster.lock-contention-policy", "notify"]);
    assert!(d.ok(&["get", "gv0", "cluster.lock-contention-policy"]).contains("notify"));

    // SIGKILL a brick: the daemon restarts it; the mount and heal bring it back.
    let (port0, pid0) = (b[0].0.expect("port"), b[0].1.expect("pid"));
    // SAFETY: kill(2) on the brick's pid, which the daemon reported.
    assert_eq!(unsafe { libc::kill(pid0 as libc::pid_t, libc::SIGKILL) }, 0);
    std::fs::write(mnt.join("while-down"), b"written while a brick was down").expect("write with 2 of 3 up");
    let restarted = wait_for("the daemon to restart the killed brick", DEADLINE, || {
        let b = d.bricks("gv0");
        (b[0].2 && b[0].1.is_some_and(|p| p != pid0)).then_some(b)
    });
    assert!(restarted[0].3 >= 1, "a restart is counted: {restarted:?}");
    let new_port = restarted[0].0.expect("port");
    assert_eq!(d.ok(&["portmap", &brick_arg(&dirs[0])]).trim(), new_port.to_string());
    assert_eq!(new_port, port0, "restarted on the port it had");
    assert!(d.log().contains("brick died; restarting"), "the event is logged:\n{}", d.log());
    // `volume heal VOL info` lists each brick up; the volume's self-heal
    // daemon heals what the killed brick missed, until no brick lists
    // anything.
    let info = d.ok(&["heal", "gv0", "info"]);
    for dir in &dirs {
        let line = format!("Brick {}: up, ", brick_arg(dir));
        assert!(info.lines().any(|l| l.starts_with(&line) && l.contains("to heal")), "{info}");
    }
    wait_for("the self-heal daemon to leave nothing to heal", DEADLINE, || {
        let v: serde_json::Value = serde_json::from_str(&d.ok(&["heal", "gv0", "info", "--json"])).expect("JSON");
        let b = v["bricks"].as_array().expect("bricks").clone();
        let clean = b.len() == 3 && b.iter().all(|b| b["up"] == true && b["entries"] == 0);
        (clean && dirs.iter().all(|dir| dir.join("while-down").exists())).then_some(())
    });
    // `volume heal VOL [full]` heals now (the daemon runs `xlfs heal`'s
    // machinery on the volume's volfile); there is nothing left.
    assert!(d.ok(&["heal", "gv0"]).contains("failed 0, split-brain 0, remaining 0"));
    assert!(d.ok(&["heal", "gv0", "full"]).contains("volume heal: gv0: healed "));
    for dir in &dirs {
        assert_eq!(std::fs::read(dir.join("hello")).expect("brick copy"), data, "{}", dir.display());
        assert_eq!(
            std::fs::read(dir.join("while-down")).expect("healed copy"),
            b"written while a brick was down",
            "{}",
            dir.display()
        );
    }
    assert_eq!(std::fs::read(mnt.join("while-down")).expect("read"), b"written while a brick was down");

    // profile info: each brick's fop counts (the writes reached them all);
    // statedump: each brick's graph dump.
    let prof = d.ok(&["profile", "gv0", "info"]);
    for dir in &dirs {
        assert!(prof.contains(&format!("Brick {}: fop counts over", brick_arg(dir))), "{prof}");
    }
    assert!(prof.lines().filter(|l| l.starts_with("WRITE ")).count() == 3, "{prof}");
    let v: serde_json::Value = serde_json::from_str(&d.ok(&["profile", "gv0", "info", "--json"])).expect("JSON");
    let writes = v["bricks"][0]["fops"].as_array().expect("fops").iter().find(|f| f[0] == "WRITE").cloned();
    assert!(writes.is_some_and(|w| w[1].as_u64().unwrap_or(0) > 0), "{v}");
    // profile start zeroes every brick's counts, stop keeps them for info.
    let writes_on = |d: &Daemon| -> u64 {
        let v: serde_json::Value = serde_json::from_str(&d.ok(&["profile", "gv0", "info", "--json"])).expect("JSON");
        v["bricks"]
            .as_array()
            .expect("bricks")
            .iter()
            .map(|b| {
                b["fops"]
                    .as_array()
                    .expect("fops")
                    .iter()
                    .find(|f| f[0] == "WRITE")
                    .and_then(|f| f[1].as_u64())
                    .unwrap_or(0)
            })
            .sum()
    };
    // The mount reconnects to the restarted brick on its own schedule:
    // the write below must reach all three, and be on them (fsync) when
    // the counts are read.
    wait_for("the mount to see every brick up", DEADLINE, || {
        (kit::status_dump(&mnt).get("gv0-replicate-0.children-up").map(String::as_str) == Some("3/3")).then_some(())
    });
    assert!(d.ok(&["profile", "gv0", "start"]).contains("started"));
    assert_eq!(writes_on(&d), 0, "start zeroes the counts");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("profiled")).expect("create");
        f.write_all(&[7u8; 8192]).expect("write");
        f.sync_all().expect("fsync");
    }
    let counted = writes_on(&d);
    assert!(counted >= 3, "one write per brick at least: {counted}");
    assert!(d.ok(&["profile", "gv0", "stop"]).contains("stopped"));
    std::fs::write(mnt.join("profiled-2"), vec![7u8; 8192]).expect("write");
    assert_eq!(writes_on(&d), counted, "info after stop shows the counts kept at stop");
    assert!(d.ok(&["profile", "gv0", "start"]).contains("started"));
    assert_eq!(writes_on(&d), 0);
    let dump = d.ok(&["statedump", "gv0"]);
    for dir in &dirs {
        assert!(dump.contains(&format!("Brick {}:\n", brick_arg(dir))), "{dump}");
    }
    assert!(dump.matches(".type = storage/posix").count() == 3, "{dump}");
    assert!(!dump.contains("(no dump"), "{dump}");

    // Killed again while its port is taken: it comes back on another port,
    // the daemon serves a volfile naming it, and the mount follows (a
    // reload, no remount) and writes reach the brick again.
    let gen_before = generation(&mount_status(&mnt));
    let pid1 = restarted[0].1.expect("pid");
    // SAFETY: kill(2) on the brick's pid, which the daemon reported.
    assert_eq!(unsafe { libc::kill(pid1 as libc::pid_t, libc::SIGKILL) }, 0);
    let squatter = wait_for("the old port to be free to take", DEADLINE, || {
        std::net::TcpListener::bind(("127.0.0.1", port0)).ok()
    });
    let moved = wait_for("the brick to come back on another port", DEADLINE, || {
        let b = d.bricks("gv0");
        (b[0].2 && b[0].1.is_some_and(|p| p != pid1)).then_some(b)
    });
    let port2 = moved[0].0.expect("port");
    assert_ne!(port2, port0, "the old port was taken");
    assert_eq!(d.ok(&["portmap", &brick_arg(&dirs[0])]).trim(), port2.to_string());
    assert!(d.ok(&["getspec", "gv0"]).contains(&format!("option remote-port {port2}\n")));
    let followed = wait_for("the mount to load the volfile with the new port", DEADLINE, || {
        let s = mount_status(&mnt);
        (generation(&s) > gen_before).then_some(s)
    });
    assert!(followed.contains("(volfile server)"), "{followed}");
    let mut n = 0;
    wait_for("a write through the mount to reach the moved brick", DEADLINE, || {
        n += 1;
        let name = format!("probe-{n}");
        std::fs::write(mnt.join(&name), b"probe").expect("write");
        dirs[0].join(&name).exists().then_some(())
    });
    drop(squatter);

    // The daemon restarts: the volume is still there and its bricks are
    // served again on the ports they had (kept in the state directory), so
    // the volfile is the same and the mount reconnects in its own graph.
    let gen_before = generation(&mount_status(&mnt));
    let ports_before: Vec<Option<u16>> = d.bricks("gv0").iter().map(|b| b.0).collect();
    let spec_before = d.ok(&["getspec", "gv0"]);
    d.restart();
    assert!(d.ok(&["info", "gv0"]).contains("status = \"started\""));
    let again = wait_for("the restarted daemon to serve all bricks", DEADLINE, || {
        let b = d.bricks("gv0");
        b.iter().all(|(_, pid, up, _)| *up && pid.is_some()).then_some(b)
    });
    assert_eq!(again.iter().map(|b| b.0).collect::<Vec<_>>(), ports_before, "the bricks' ports survive the restart");
    assert_eq!(d.ok(&["getspec", "gv0"]), spec_before);
    assert!(d.ok(&["get", "gv0", "performance.write-behind"]).contains("off"), "keys survive the restart");
    // Every brick stopped with the daemon: the mount's clients reconnect
    // (with their backoff) to the same addresses.
    wait_for("the mount to reconnect to the restarted bricks", DEADLINE, || {
        std::fs::write(mnt.join("after-restart"), b"daemon restarted").ok()
    });
    wait_for("the write to reach every brick", DEADLINE, || {
        dirs.iter()
            .all(|d| std::fs::read(d.join("after-restart")).is_ok_and(|c| c == b"daemon restarted"))
            .then_some(())
    });
    assert_eq!(generation(&mount_status(&mnt)), gen_before, "no graph switch was needed");

    // start force with everything up changes nothing; stop, delete.
    assert!(d.refused(&["start", "gv0"]).contains("volume gv0 is already started"));
    assert!(d.ok(&["start", "gv0", "force"]).contains("gv0"));
    let mut m = m;
    assert!(m.stop_with(libc::SIGTERM).success(), "unmounted cleanly");
    assert!(d.ok(&["stop", "gv0"]).contains("volume stop: gv0: success"));
    assert!(d.bricks("gv0").iter().all(|(_, pid, up, _)| pid.is_none() && !up));
    wait_for("the self-heal daemon to stop with the volume", DEADLINE, || shd(&d, "gv0").is_none().then_some(()));
    assert!(d.refused(&["getspec", "gv0"]).contains("volume gv0 is not started"));
    assert!(d.refused(&["heal", "gv0", "info"]).contains("volume gv0 is not started"));
    assert!(d.ok(&["delete", "gv0"]).contains("volume delete: gv0: success"));
    assert_eq!(d.ok(&["info"]).trim(), "no volumes");
    for dir in &dirs {
        assert!(!xattr_set(dir, "trusted.glusterfs.volume-id"), "{} is unmarked", dir.display());
        assert_eq!(std::fs::read(dir.join("hello")).expect("data stays"), data);
    }
}

#[test]
fn bad_input_is_refused_with_its_reason_and_changes_nothing() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-vol-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 4);
    let b: Vec<String> = dirs.iter().map(|p| brick_arg(p)).collect();
    let force = force_if_root(tmp.path());
    let with_force = |mut v: Vec<&'static str>, extra: &[String]| -> Vec<String> {
        let mut all: Vec<String> = v.drain(..).map(String::from).collect();
        all.extend(extra.iter().cloned());
        all.extend(force.map(String::from));
        all
    };
    let d = Daemon::start();
    let run = |args: &[String]| d.volume(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let refused = |args: &[String]| {
        let (ok, out, err) = run(args);
        assert!(!ok, "{args:?} should fail, said {out}");
        err
    };

    // A volume to collide with.
    let (ok, _, err) = run(&with_force(vec!["create", "v1"], &b[..1]));
    assert!(ok, "{err}");
    let info_before = d.ok(&["info", "--json"]);

    let e = refused(&with_force(vec!["create", "v1"], &b[1..2]));
    assert!(e.contains("volume v1 already exists"), "{e}");
    let e = refused(&with_force(vec!["create", "v2"], &b[..1]));
    assert!(e.contains(&format!("brick {} is already part of volume v1", b[0])), "{e}");
    let e = refused(&with_force(vec!["create", "v2"], &[b[1].clone(), b[1].clone()]));
    assert!(e.contains(&format!("brick {} is listed more than once", b[1])), "{e}");
    let e = refused(&with_force(vec!["create", "v2", "replica", "2"], &b[1..4]));
    assert!(e.contains("replica count 2 does not divide the brick count 3"), "{e}");
    let missing = format!("127.0.0.1:{}/nope", tmp.path().display());
    let e = refused(&with_force(vec!["create", "v2"], std::slice::from_ref(&missing)));
    assert!(e.contains(&format!("brick {missing}: directory")) && e.contains("No such file"), "{e}");
    // A brick on the root file system needs `force`.
    let on_root = tempfile::Builder::new().prefix("xlfs-rootfs-brick-").tempdir_in("/").expect("dir on /");
    let root_brick = brick_arg(on_root.path());
    let e = refused(&["create".to_string(), "v2".to_string(), root_brick.clone()]);
    assert!(e.contains(&format!("brick {root_brick} is on the root file system")) && e.contains("force"), "{e}");
    assert!(!xattr_set(on_root.path(), "trusted.glusterfs.volume-id"));
    let e = refused(&with_force(vec!["create", "bad/name"], &b[1..2]));
    assert!(e.contains("volume name \"bad/name\""), "{e}");
    // Nothing was marked or stored by the refused creates.
    for dir in &dirs[1..] {
        assert!(!xattr_set(dir, "trusted.glusterfs.volume-id"), "{} stays unmarked", dir.display());
    }
    assert_eq!(d.ok(&["info", "--json"]), info_before);

    // Keys and values.
    let e = d.refused(&["set", "v1", "performance.nope", "on"]);
    assert!(e.contains("unknown key 'performance.nope'"), "{e}");
    let e = d.refused(&["set", "v1", "performance.cache-size", "1KB"]);
    assert!(
        e.contains("performance/write-behind option cache-size") && e.contains("out of range 524288..=1073741824"),
        "{e}"
    );
    let e = d.refused(&["set", "v1", "cluster.quorum-type", "most"]);
    assert!(e.contains("one of none, auto, fixed"), "{e}");
    let help = d.ok(&["set", "help"]);
    for key in
        ["performance.write-behind", "performance.md-cache-timeout", "cluster.quorum-type", "network.ping-timeout"]
    {
        assert!(help.contains(key), "set help lists {key}:\n{help}");
    }
    assert!(help.contains("default: 600") && help.contains("a time"), "{help}");
    // Plugin and policy keys: the module must be absolute and load.
    let e = d.refused(&["set", "v1", "plugin.pt-probe", "wasm:relative.wasm"]);
    assert!(e.contains("key plugin.pt") && e.contains("must be absolute"), "{e}");
    let e = d.refused(&["set", "v1", "plugin.pt-probe", "/abs.wasm"]);
    assert!(e.contains("expected wasm:/ABSOLUTE/PATH or dylib:/ABSOLUTE/PATH"), "{e}");
    let junk = tmp.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").expect("junk module");
    let e = d.refused(&["set", "v1", "plugin.pt-probe", &format!("wasm:{}", junk.display())]);
    assert!(e.contains("key plugin.pt-probe: plugin/wasm:") && e.contains(&junk.display().to_string()), "{e}");
    let e = d.refused(&["set", "v1", "plugin.v1-client-0", &format!("wasm:{}", junk.display())]);
    assert!(e.contains("the name is taken by the generated graph"), "{e}");
    let e = d.refused(&["set", "v1", "plugin.a/b", &format!("wasm:{}", junk.display())]);
    assert!(e.contains("plugin name"), "{e}");
    let e = d.refused(&["set", "v1", "performance.read-ahead-policy", "nope"]);
    assert!(e.contains("key performance.read-ahead-policy: policy 'nope'"), "{e}");
    let e = d.refused(&["set", "v1", "cluster.lock-contention-policy", &format!("wasm:{}", junk.display())]);
    assert!(e.contains("key cluster.lock-contention-policy"), "{e}");
    assert!(help.contains("performance.read-ahead-policy") && help.contains("cluster.lock-contention-policy"));
    assert_eq!(d.ok(&["info", "--json"]), info_before, "refused sets change nothing");
    d.ok(&["set", "v1", "performance.read-ahead", "on"]);
    assert!(
        d.ok(&["get", "v1", "all"])
            .lines()
            .any(|l| l.starts_with("performance.read-ahead") && l.contains("on") && l.ends_with("set"))
    );
    let e = d.refused(&["reset", "v1", "performance.nope"]);
    assert!(e.contains("unknown key 'performance.nope'"), "{e}");
    d.ok(&["reset", "v1", "performance.read-ahead"]);
    assert!(
        d.ok(&["get", "v1", "performance.read-ahead"]).lines().any(|l| l.contains("off") && l.ends_with("default"))
    );
    assert_eq!(d.ok(&["info", "--json"]), info_before, "set then reset leaves the spec as it was");

    // Lifecycle refusals.
    d.ok(&["start", "v1"]);
    assert!(d.refused(&["start", "v1"]).contains("volume v1 is already started"));
    let e = d.refused(&["delete", "v1"]);
    assert!(e.contains("volume v1 is started; stop it first"), "{e}");
    assert!(d.refused(&["stop", "nope"]).contains("volume nope does not exist"));
    d.ok(&["stop", "v1"]);
    assert!(d.refused(&["stop", "v1"]).contains("volume v1 is not started"));
    d.ok(&["delete", "v1"]);

    // A daemon nobody runs.
    let addr = format!("127.0.0.1:{}", free_port());
    let out = kit::run_xlfs(&["volume", "--daemon", &addr, "info"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains(&format!("cannot reach the xlfs daemon at {addr}")), "{e}");
    let mnt = tempfile::tempdir().expect("mount point");
    let out = kit::run_xlfs(&["mount".as_ref(), format!("{addr}:/v1").as_ref(), mnt.path().as_os_str()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains(&format!("cannot reach the xlfs daemon at {addr}")), "{e}");
}

#[test]
fn split_brain_is_resolved_through_the_daemon() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-sb-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 3);
    let d = Daemon::start();
    let create = replica3_args("create", "sb", dirs.iter().map(|p| brick_arg(p)), force_if_root(tmp.path()));
    d.ok(&strs(&create));
    d.ok(&["start", "sb"]);
    {
        let m = FuseMount::start_by_name(&format!("{}:/sb", d.addr()), "", &[]);
        std::fs::write(m.path().join("f"), b"original\n").expect("write");
        std::fs::write(m.path().join("g"), b"original\n").expect("write");
    }
    // Each copy of f and g blames the others, with different contents.
    for name in ["f", "g"] {
        for (k, dir) in dirs.iter().enumerate() {
            let p = dir.join(name);
            let data: &[u8] = match k {
                0 => b"copy zero, the biggest of the three\n",
                1 => b"copy one\n",
                _ => b"copy two!\n",
            };
            std::fs::write(&p, data).expect("write a brick copy");
            for j in 0..3 {
                let v = if j == k { [0, 0, 0] } else { [1, 0, 0] };
                xlfs_sdk::testing::set_xattr(&p, &format!("trusted.afr.sb-client-{j}"), &kit::workload::afr_value(v))
                    .expect("setxattr");
            }
        }
    }

    // Bad requests name what is wrong.
    let e = d.refused(&["heal", "sb", "split-brain", "newest", "/f"]);
    assert!(e.contains("newest") && e.contains("bigger-file"), "{e}");
    let e = d.refused(&["heal", "sb", "split-brain", "source-brick", "/f"]);
    assert!(e.contains("source-brick"), "{e}");
    let e = d.refused(&["heal", "sb", "split-brain", "source-brick", "127.0.0.1:/nowhere", "/f"]);
    assert!(e.contains("127.0.0.1:/nowhere") && e.contains("not part of volume sb"), "{e}");

    // bigger-file takes copy zero of f; source-brick takes brick 2's g.
    let out = d.ok(&["heal", "sb", "split-brain", "bigger-file", "/f"]);
    assert!(out.contains("/f: resolved (bigger-file)"), "{out}");
    let out = d.ok(&["heal", "sb", "split-brain", "source-brick", &brick_arg(&dirs[2]), "/g"]);
    assert!(out.contains("/g: resolved"), "{out}");
    for dir in &dirs {
        assert_eq!(std::fs::read(dir.join("f")).expect("f"), b"copy zero, the biggest of the three\n");
        assert_eq!(std::fs::read(dir.join("g")).expect("g"), b"copy two!\n");
    }
    let e = d.refused(&["heal", "sb", "split-brain", "bigger-file", "/f"]);
    assert!(e.contains("not in split-brain"), "{e}");
    let m = FuseMount::start_by_name(&format!("{}:/sb", d.addr()), "", &[]);
    assert_eq!(std::fs::read(m.path().join("f")).expect("read f"), b"copy zero, the biggest of the three\n");
    assert_eq!(std::fs::read(m.path().join("g")).expect("read g"), b"copy two!\n");
}

#[test]
fn a_volume_is_created_from_a_gluster_volume_info_listing() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-info-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 3);
    let d = Daemon::start();
    let listing = |ping: &str| {
        let mut t = String::from(
            "Volume Name: gv0\nType: Replicate\nVolume ID: 6f0e1c6a-1b1f-4a43-9d6c-0d3d0b0c1e2f\nStatus: Started\n\
             Snapshot Count: 0\nNumber of Bricks: 1 x 3 = 3\nTransport-type: tcp\nBricks:\n",
        );
        for (i, dir) in dirs.iter().enumerate() {
            t += &format!("Brick{}: {}\n", i + 1, brick_arg(dir));
        }
        t += &format!(
            "Options Reconfigured:\nperformance.write-behind: off\nnetwork.ping-timeout: {ping}\nnfs.disable: on\n\
             transport.address-family: inet\n"
        );
        t
    };
    let file = tmp.path().join("info.txt");
    let force: Vec<&str> = force_if_root(tmp.path()).into_iter().collect();
    let path = file.to_str().expect("utf-8").to_string();
    let create = |name: &'static str| -> Vec<String> {
        ["create", name, "--from-info", &path].iter().chain(&force).map(|s| s.to_string()).collect()
    };

    // A value GlusterFS would take but the translator refuses: nothing is made.
    std::fs::write(&file, listing("forever")).expect("write listing");
    let e = d.refused(&strs(&create("imported")));
    assert!(e.contains("network.ping-timeout") && e.contains("forever"), "{e}");
    assert!(d.ok(&["info"]).contains("no volumes"));
    // A listing of a layout xlfs lacks is refused with its line.
    std::fs::write(&file, listing("20").replace("1 x 3 = 3", "1 x (2 + 1) = 3")).expect("write listing");
    let e = d.refused(&strs(&create("imported")));
    assert!(e.contains("info.txt:6") && e.contains("arbiter"), "{e}");

    std::fs::write(&file, listing("20")).expect("write listing");
    let out = d.ok(&strs(&create("imported")));
    assert!(out.contains("skipped (xlfs has no such key): nfs.disable: on"), "{out}");
    assert!(out.contains("transport.address-family") && out.contains("volume create: imported: success"), "{out}");
    let info = d.ok(&["info", "imported"]);
    assert!(info.contains("replica = 3") && info.contains("\"performance.write-behind\" = \"off\""), "{info}");
    assert!(info.contains("\"network.ping-timeout\" = \"20\""), "{info}");
    for dir in &dirs {
        assert!(info.contains(&dir.display().to_string()), "{info}");
    }
    d.ok(&["start", "imported"]);
    assert!(!d.ok(&["getspec", "imported"]).contains("imported-write-behind"), "the options shape the graph");
    d.ok(&["stop", "imported"]);
    d.ok(&["delete", "imported"]);
}
