//! Three nodes, one cluster store: three `xlfs daemon`s, each its own
//! node on its own loopback address (127.0.0.1, .2, .3: bricks and daemon
//! listen there), sharing one real etcd started by the test.
//!
//! A volume with a brick on each node is created on node 1, started and
//! mounted by name from node 3; `volume set` on node 2 reaches that mount;
//! a daemon restart (its brick comes back on the port it had), then an
//! etcd restart, during writes lose no volume state and leave the bricks
//! serving.

mod kit;

use std::path::Path;
use std::time::Duration;

use kit::daemon::{Daemon, Etcd, force_if_root, generation, graph_of, mount_status, replica3_args, strs, wait_for};
use kit::fuse_mount::FuseMount;

const DEADLINE: Duration = Duration::from_secs(60);
const NODES: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];

fn marked(dir: &Path) -> bool {
    let out = std::process::Command::new("getfattr")
        .args(["--absolute-names", "-n", "trusted.glusterfs.volume-id"])
        .arg(dir)
        .output()
        .expect("getfattr");
    out.status.success()
}

/// A brick as `volume status --json` shows it: (host, port, pid, up).
type Brick = (String, Option<u64>, Option<u64>, bool);

/// Each brick of `vol` as `volume status --json` on `d` shows it.
fn bricks(d: &Daemon, vol: &str) -> Vec<Brick> {
    let v: serde_json::Value = serde_json::from_str(&d.ok(&["status", vol, "--json"])).expect("JSON");
    v["volumes"][0]["bricks"]
        .as_array()
        .expect("bricks")
        .iter()
        .map(|b| {
            let host = b["host"].as_str().expect("host").to_string();
            (host, b["port"].as_u64(), b["pid"].as_u64(), b["up"].as_bool().expect("up"))
        })
        .collect()
}

fn all_up(d: &Daemon, vol: &str) -> Option<Vec<Brick>> {
    let b = bricks(d, vol);
    b.iter().all(|(_, port, pid, up)| port.is_some() && pid.is_some() && *up).then_some(b)
}

/// Writes `name` through the mount and reads it back.
fn write_check(mnt: &Path, name: &str, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + name.len()) as u8).collect();
    std::fs::write(mnt.join(name), &data).unwrap_or_else(|e| panic!("write {name}: {e}"));
    assert_eq!(std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}")), data, "{name}");
}

#[test]
fn three_nodes_share_volumes_through_etcd() {
    kit::init_tracing();
    let mut etcd = Etcd::start();
    let url = etcd.url();
    let d1 = Daemon::start_node(NODES[0], &url);
    let mut d2 = Daemon::start_node(NODES[1], &url);
    let mut d3 = Daemon::start_node(NODES[2], &url);
    let tmp = tempfile::Builder::new().prefix("xlfs-cluster-").tempdir().expect("tempdir");
    let dirs: Vec<_> = (0..3)
        .map(|i| {
            let d = tmp.path().join(format!("node{}-b", i + 1));
            std::fs::create_dir_all(&d).expect("brick dir");
            std::fs::canonicalize(&d).expect("canonical")
        })
        .collect();
    let brick = |i: usize| format!("{}:{}", NODES[i], dirs[i].display());
    let create = replica3_args("create", "cv", (0..3).map(brick), force_if_root(tmp.path()));
    let create = strs(&create);

    // Bricks on nodes that are not peers yet are refused, naming the host.
    let err = d1.refused(&create);
    assert!(err.contains("127.0.0.2") && err.contains("peer add"), "{err}");
    assert!(!dirs.iter().any(|d| marked(d)), "a refused create marks nothing");
    // A peer that does not answer is refused, naming it.
    let dead = format!("127.0.0.4:{}", kit::daemon::free_port());
    let out = std::process::Command::new(kit::XLFS)
        .args(["peer", "--daemon", d1.addr(), "add", &dead])
        .output()
        .expect("xlfs peer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&dead), "{err}");
    // The nodes join from node 1; node 2 sees all three.
    let peer = |d: &Daemon, args: &[&str]| {
        let mut all = vec!["peer", "--daemon", d.addr()];
        all.extend_from_slice(args);
        let out = kit::run_xlfs(&all);
        assert!(out.status.success(), "xlfs peer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(peer(&d1, &["add", d2.addr()]).contains("success"));
    assert!(peer(&d1, &["add", d3.addr()]).contains("success"));
    let list = peer(&d2, &["list"]);
    for n in NODES {
        assert!(
            list.lines().any(|l| l.starts_with(n) && (l.contains("connected") || l.contains("this node"))),
            "{list}"
        );
    }
    assert!(!list.contains("disconnected"), "{list}");

    // Created on node 1: each node checked and marked its own brick.
    assert!(d1.ok(&create).contains("volume create: cv: success"));
    assert!(dirs.iter().all(|d| marked(d)), "every node marked its brick");
    assert!(d3.ok(&["info", "cv"]).contains("status = \"created\""), "node 3 sees the volume");
    // The same brick again, from another node, is refused.
    let again = d2.refused(&["create", "cv2", &brick(1), "force"]);
    assert!(again.contains("already part of"), "{again}");

    // Started on node 1: every node serves its own brick, on its address.
    assert!(d1.ok(&["start", "cv"]).contains("volume start: cv: success"));
    let up = wait_for("every brick up, seen from node 3", DEADLINE, || all_up(&d3, "cv"));
    assert_eq!(up.iter().map(|b| b.0.as_str()).collect::<Vec<_>>(), NODES);
    let spec = d3.ok(&["getspec", "cv"]);
    for (i, (_, port, ..)) in up.iter().enumerate() {
        let needle = format!("option remote-host {}\n    option remote-port {}\n", NODES[i], port.expect("port"));
        assert!(spec.contains(&needle), "node 3's volfile names brick {i} where it serves:\n{spec}");
    }

    // Mounted by name from node 3, with node 2 as its backup volfile server.
    let backup = format!("backup-volfile-servers={}", d2.addr());
    let m = FuseMount::start_by_name(&format!("{}:/cv", d3.addr()), &backup, &["--spec-interval", "0.3"]);
    let mnt = m.path().to_path_buf();
    write_check(&mnt, "first", 300_000);
    let before = mount_status(&mnt);
    assert!(graph_of(&before).contains("cv-write-behind"), "{before}");

    // volume set on node 2 reaches the client mounted from node 3.
    d2.ok(&["set", "cv", "performance.write-behind", "off"]);
    let after = wait_for("the mount from node 3 to drop write-behind", DEADLINE, || {
        let s = mount_status(&mnt);
        (!graph_of(&s).contains("cv-write-behind")).then_some(s)
    });
    assert!(generation(&after) > generation(&before), "{after}");
    write_check(&mnt, "after-set", 100_000);

    // Node 2's daemon restarts while the mount writes: replica 3 keeps
    // serving, the daemon finds the volume in etcd and serves its brick
    // again.
    let pid2 = up[1].2;
    d2.stop();
    write_check(&mnt, "daemon2-down", 200_000);
    d2.start_again();
    let back = wait_for("node 2's brick to serve again", DEADLINE, || all_up(&d1, "cv").filter(|b| b[1].2 != pid2));
    assert_eq!(back[1].0, NODES[1]);
    assert_eq!(back[1].1, up[1].1, "it serves on the port it had (published in etcd), so clients find it there");
    assert!(d2.ok(&["info", "cv"]).contains("status = \"started\""), "node 2 kept the volume");
    write_check(&mnt, "daemon2-back", 200_000);

    // etcd restarts: bricks keep serving and the mount keeps working;
    // management answers again once etcd is back, with nothing lost.
    etcd.stop();
    write_check(&mnt, "etcd-down", 200_000);
    let err = d1.refused(&["info", "cv"]);
    assert!(err.contains("cluster store"), "the store is named: {err}");
    etcd.restart();
    let info = wait_for("node 1 to answer from etcd again", DEADLINE, || {
        let (ok, out, _) = d1.volume(&["info", "cv"]);
        ok.then_some(out)
    });
    assert!(info.contains("status = \"started\"") && info.contains("performance.write-behind"), "{info}");
    d1.ok(&["set", "cv", "performance.write-behind", "on"]);
    wait_for("the mount to take write-behind back after the etcd restart", DEADLINE, || {
        graph_of(&mount_status(&mnt)).contains("cv-write-behind").then_some(())
    });

    // Node 3, the mount's volfile server, goes away: the mount follows a
    // change made on node 1 through its backup server, node 2.
    d3.stop();
    d1.ok(&["set", "cv", "performance.write-behind", "off"]);
    wait_for("the mount to follow node 1's change through node 2", DEADLINE, || {
        (!graph_of(&mount_status(&mnt)).contains("cv-write-behind")).then_some(())
    });
    write_check(&mnt, "node3-down", 100_000);
    d3.start_again();
    wait_for("node 3's brick to serve again", DEADLINE, || all_up(&d1, "cv"));

    // `mount -t xlfs HOST:/VOLUME` (mount(8) runs the helper so).
    helper_mount(&format!("{}:/cv", d1.addr()), tmp.path());

    for (name, len) in [("first", 300_000), ("after-set", 100_000), ("daemon2-down", 200_000), ("etcd-down", 200_000)] {
        assert_eq!(std::fs::metadata(mnt.join(name)).expect(name).len(), len as u64, "{name}");
    }
    drop(m);

    // Stopped from node 3 (every node stops its brick), deleted from node 2
    // (every node unmarks its brick).
    assert!(d3.ok(&["stop", "cv"]).contains("success"));
    let down = bricks(&d1, "cv");
    assert!(down.iter().all(|(_, _, pid, up)| pid.is_none() && !up), "{down:?}");

    // auth.allow: the bricks (at their next start) admit only matching
    // addresses; `volfile show --brick` on any node shows what a brick serves.
    d1.ok(&["set", "cv", "auth.allow", "10.1.2.*"]);
    let show = kit::run_xlfs(&["volfile", "show", "cv", "--brick", &brick(0), "--daemon", d3.addr()]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "volfile show: {}", String::from_utf8_lossy(&show.stderr));
    assert!(text.contains("option auth.addr.*.allow 10.1.2.*") && !text.contains(".allow *\n"), "{text}");
    assert!(text.contains(&format!("option directory {}", dirs[0].display())), "{text}");
    d1.ok(&["start", "cv"]);
    wait_for("every brick up again", DEADLINE, || all_up(&d1, "cv"));
    let refused_at = tmp.path().join("refused-mnt");
    std::fs::create_dir_all(&refused_at).expect("mount point");
    let src = format!("{}:/cv", d1.addr());
    let log = tmp.path().join("refused-mount.log");
    let out = kit::run_xlfs(&[
        "mount".as_ref(),
        "--log-file".as_ref(),
        log.as_os_str(),
        "--up-timeout".as_ref(),
        "5".as_ref(),
        src.as_ref(),
        refused_at.as_os_str(),
    ]);
    assert!(!out.status.success(), "a client from 127.0.0.1 is refused by every brick");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("address 127.0.0.1 is not allowed"), "the mount's log says why:\n{text}");
    assert!(!kit::fuse_mount::is_mounted(&refused_at));
    d1.ok(&["reset", "cv", "auth.allow"]);
    d1.ok(&["stop", "cv"]);
    assert!(d2.ok(&["delete", "cv"]).contains("success"));
    assert!(!dirs.iter().any(|d| marked(d)), "every node unmarked its brick");
    assert!(d1.ok(&["info"]).contains("no volumes"));
    // A node that still holds nothing can leave; this node cannot remove itself.
    assert!(peer(&d1, &["remove", NODES[2]]).contains("success"));
    let out = kit::run_xlfs(&["peer", "--daemon", d1.addr(), "remove", NODES[0]]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("this node"));
}

/// Mounts `source` through `runtime/mount.xlfs` as mount(8) would, checks
/// the file written before is there, writes one, and unmounts.
fn helper_mount(source: &str, tmp: &Path) {
    let mnt = tmp.join("helper-mnt");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let log = tmp.join("helper-mount.log");
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount.xlfs");
    let out = std::process::Command::new("sh")
        .arg(&helper)
        .arg(source)
        .arg(&mnt)
        .arg("-o")
        .arg(format!("_netdev,log-file={}", log.display()))
        .env("XLFS", kit::XLFS)
        .output()
        .expect("mount.xlfs");
    assert!(out.status.success(), "mount.xlfs {source}: {}", String::from_utf8_lossy(&out.stderr));
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if kit::fuse_mount::is_mounted(&self.0) {
                let _ = kit::run_xlfs(&["umount".as_ref(), self.0.as_os_str()]);
            }
        }
    }
    let guard = Unmount(mnt.clone());
    assert_eq!(std::fs::metadata(mnt.join("first")).expect("first through the helper's mount").len(), 300_000);
    write_check(&mnt, "via-helper", 50_000);
    let out = kit::run_xlfs(&["umount".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "xlfs umount: {}", String::from_utf8_lossy(&out.stderr));
    drop(guard);
}
