//! Hosts on a test's own network: [`Net`] makes one network namespace per
//! host, each joined by a veth pair to a bridge in this (the root)
//! namespace that has an address on the same /29, so a process here (the
//! FUSE client: a FUSE mount made inside `ip netns exec` would land in a
//! private mount namespace) reaches every host, and a link can be cut
//! ([`Net::cut`]: `ip link set <veth> down`) or made lossy ([`Net::lossy`])
//! without touching the processes. [`DelayProxy`] delays a TCP stream, for
//! kernels without `sch_netem` (see [`Net::netem`]). [`LoopFs`] is a small
//! loop-mounted ext4 for bricks whose disk fills up.
//!
//! Names and subnets are derived from the test process's pid and a
//! per-process counter, so tests run in parallel (nextest runs each in its
//! own process); interface names stay within 15 bytes. Dropping a [`Net`]
//! (also when a test panics) deletes its veths, bridge and namespaces;
//! stop the processes running in them first (drop the [`Cluster`] before
//! the [`Net`], i.e. declare the `Net` first).
//!
//! [`Cluster`]: super::Cluster

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use super::BrickConfig;

/// True when this process can make namespaces, links and mounts (root).
/// Tests that need them print why and pass when it is false.
pub fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping {test}: needs root (network namespaces, tc, loop mounts)");
    }
    root
}

/// Runs `prog args`; panics with its stderr if it fails.
pub fn run(prog: &str, args: &[&str]) {
    let out = Command::new(prog).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(out.status.success(), "{prog} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Runs `prog args`, ignoring the outcome (cleanup).
fn run_quiet(prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A unique small number per [`Net`] in this process.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One host: a namespace, its address, and the root end of its link.
pub struct Host {
    /// The namespace (`ip netns` name).
    pub ns: String,
    /// The veth end on the bridge, in the root namespace.
    pub veth: String,
    /// The host's address.
    pub ip: Ipv4Addr,
}

/// A bridge in the root namespace and hosts in namespaces of their own.
pub struct Net {
    bridge: String,
    /// A veth whose peer stays down: what is redirected to it is lost.
    sink: String,
    /// The bridge's (this namespace's) address.
    pub gateway: Ipv4Addr,
    /// The hosts, in order.
    pub hosts: Vec<Host>,
}

impl Net {
    /// Makes `n` hosts (at most 5) on a fresh /29.
    pub fn new(n: usize) -> Net {
        assert!(n <= 5, "a /29 holds 5 hosts beside the bridge");
        let pid = std::process::id();
        let k = COUNTER.fetch_add(1, Ordering::Relaxed);
        // 21 bits of /29s in 10.0.0.0/8: 17 bits of pid, 4 of counter.
        let key = ((pid & 0x1_ffff) << 4) | (k & 0xf);
        let base = u32::from(Ipv4Addr::new(10, 0, 0, 0)) | (key << 3);
        let tag = format!("{:x}", (pid << 4) | (k & 0xf));
        let mut net = Net {
            bridge: format!("xb{tag}"),
            sink: format!("xs{tag}"),
            gateway: Ipv4Addr::from(base + 1),
            hosts: Vec::new(),
        };
        assert!(net.bridge.len() <= 15, "interface name {} too long", net.bridge);
        // Anything failing below leaves `net` to be dropped: what was made goes.
        run("ip", &["link", "add", &net.bridge, "type", "bridge"]);
        run("ip", &["addr", "add", &format!("{}/29", net.gateway), "dev", &net.bridge]);
        run("ip", &["link", "set", &net.bridge, "up"]);
        run("ip", &["link", "add", &net.sink, "type", "veth", "peer", "name", &format!("xz{tag}")]);
        for i in 0..n {
            let host = Host {
                ns: format!("xlfs-{tag}-{i}"),
                veth: format!("xv{tag}{i}"),
                ip: Ipv4Addr::from(base + 2 + i as u32),
            };
            let peer = format!("xp{tag}{i}");
            run("ip", &["netns", "add", &host.ns]);
            net.hosts.push(host);
            let host = net.hosts.last().expect("just pushed");
            run("ip", &["link", "add", &host.veth, "type", "veth", "peer", "name", &peer]);
            run("ip", &["link", "set", &peer, "netns", &host.ns]);
            run("ip", &["link", "set", &host.veth, "master", &net.bridge, "up"]);
            run("ip", &["-n", &host.ns, "addr", "add", &format!("{}/29", host.ip), "dev", &peer]);
            run("ip", &["-n", &host.ns, "link", "set", &peer, "up"]);
            run("ip", &["-n", &host.ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// A brick config for host `i`: run in its namespace, listen on its address.
    pub fn brick(&self, i: usize) -> BrickConfig {
        BrickConfig {
            netns: Some(self.hosts[i].ns.clone()),
            host: Some(self.hosts[i].ip.to_string()),
            ..BrickConfig::default()
        }
    }

    /// Cuts host `i`'s link (`ip link set <veth> down`): its packets are
    /// dropped, its processes and connections stay, as in a partition.
    pub fn cut(&self, i: usize) {
        run("ip", &["link", "set", &self.hosts[i].veth, "down"]);
    }

    /// Restores host `i`'s link.
    pub fn restore(&self, i: usize) {
        run("ip", &["link", "set", &self.hosts[i].veth, "up"]);
    }

    /// Degrades host `i`'s link with `tc netem delay DELAY loss LOSS`
    /// (both ways: on both ends of the veth). False when the kernel has no
    /// netem (then nothing changed).
    pub fn netem(&self, i: usize, delay_ms: u32, loss_pct: f64) -> bool {
        let h = &self.hosts[i];
        let (delay, loss) = (format!("{delay_ms}ms"), format!("{loss_pct}%"));
        run_quiet("tc", &["qdisc", "add", "dev", &h.veth, "root", "netem", "delay", &delay, "loss", &loss])
    }

    /// Drops about `loss_pct` % of the packets leaving host `i`'s link in
    /// this namespace, without netem: a classic-BPF classifier reading the
    /// kernel's random number (`ld rand`) picks them and redirects them to
    /// a veth whose peer is down.
    pub fn lossy(&self, i: usize, loss_pct: f64) {
        let h = &self.hosts[i];
        let threshold = ((1.0 - loss_pct / 100.0) * u32::MAX as f64) as u32;
        // ld [SKF_AD_OFF + SKF_AD_RANDOM]; jge #threshold -> match; no match.
        let code = format!("4,32 0 0 4294963256,53 0 1 {threshold},6 0 0 4294967295,6 0 0 0,");
        run("tc", &["qdisc", "add", "dev", &h.veth, "clsact"]);
        run(
            "tc",
            &[
                "filter", "add", "dev", &h.veth, "egress", "bpf", "bytecode", &code, "action", "mirred", "egress",
                "redirect", "dev", &self.sink,
            ],
        );
    }

    /// Takes away what [`Net::netem`] or [`Net::lossy`] put on host
    /// `i`'s link.
    pub fn clear(&self, i: usize) {
        let veth = &self.hosts[i].veth;
        run_quiet("tc", &["qdisc", "del", "dev", veth, "root"]);
        run_quiet("tc", &["qdisc", "del", "dev", veth, "clsact"]);
    }

    /// Packets dropped so far by [`Net::lossy`] on host `i`'s link.
    pub fn lost(&self, i: usize) -> u64 {
        let out = Command::new("tc")
            .args(["-s", "filter", "show", "dev", &self.hosts[i].veth, "egress"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // "Sent N bytes M pkt": the packets the action took.
        out.split_once(" bytes ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Deleting one end of a veth deletes both (and its qdiscs).
            run_quiet("ip", &["link", "del", &h.veth]);
            run_quiet("ip", &["netns", "del", &h.ns]);
        }
        run_quiet("ip", &["link", "del", &self.sink]);
        run_quiet("ip", &["link", "del", &self.bridge]);
    }
}

/// A small ext4 file system in a file, loop-mounted on a directory for one
/// test; unmounted (and its loop device detached) when dropped.
pub struct LoopFs {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    mounted: bool,
}

impl LoopFs {
    /// Makes and mounts a file system of `mib` MiB (no blocks reserved for
    /// root, so a brick running as root fills it as anyone would).
    pub fn new(mib: u64) -> LoopFs {
        let dir = tempfile::Builder::new().prefix("xlfs-loopfs-").tempdir().expect("temp dir");
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        std::fs::File::create(&img).and_then(|f| f.set_len(mib << 20)).expect("image file");
        let img_s = img.to_str().expect("utf-8 path");
        run("mkfs.ext4", &["-q", "-F", "-m", "0", img_s]);
        let mut fs = LoopFs { dir, mnt, mounted: false };
        run("mount", &["-o", "loop", img_s, fs.mnt.to_str().expect("utf-8 path")]);
        fs.mounted = true;
        fs
    }

    /// The mounted directory.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Bytes available to unprivileged users.
    pub fn available(&self) -> u64 {
        let c = std::ffi::CString::new(self.mnt.to_str().expect("utf-8 path")).expect("no NUL");
        // SAFETY: a valid C string and a statvfs struct that outlives the call.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
        assert_eq!(rc, 0, "statvfs {}: {}", self.mnt.display(), std::io::Error::last_os_error());
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let m = self.mnt.to_str().unwrap_or_default().to_string();
            // The loop device: detached by umount (autoclear), else by hand.
            let dev = std::fs::read_to_string("/proc/self/mountinfo")
                .ok()
                .and_then(|mi| {
                    mi.lines()
                        .find(|l| l.split(' ').nth(4) == Some(m.as_str()))
                        .and_then(|l| l.split(" - ").nth(1))
                        .and_then(|r| r.split(' ').nth(1))
                        .map(str::to_string)
                })
                .filter(|d| d.starts_with("/dev/loop"));
            if !run_quiet("umount", &[&m]) {
                run_quiet("umount", &["-l", &m]);
            }
            if let Some(dev) = dev {
                run_quiet("losetup", &["-d", &dev]);
            }
        }
    }
}

/// A TCP relay that delays every chunk by a fixed time in each direction
/// (a link's latency, where `sch_netem` is missing), listening on an
/// address of this namespace and forwarding to `to`. Stopped when dropped.
pub struct DelayProxy {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl DelayProxy {
    /// Listens on `listen`:0 and relays to `to`, `delay` each way.
    pub fn start(listen: Ipv4Addr, to: std::net::SocketAddr, delay: std::time::Duration) -> DelayProxy {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let l = std::net::TcpListener::bind((listen, 0)).expect("proxy listens");
        l.set_nonblocking(true).expect("nonblocking listener");
        let port = l.local_addr().expect("proxy address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((a, _)) => {
                        let Ok(b) = std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(5)) else {
                            continue;
                        };
                        let _ = a.set_nonblocking(false);
                        let _ = a.set_nodelay(true);
                        let _ = b.set_nodelay(true);
                        for (from, into) in [(&a, &b), (&b, &a)] {
                            let (from, into) = (from.try_clone().expect("clone"), into.try_clone().expect("clone"));
                            relay(from, into, delay, st.clone());
                        }
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        });
        DelayProxy { port, stop }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `into`, each chunk sent `delay` after it was read (a
/// reader thread and a writer thread joined by a queue, so the delay does
/// not limit the throughput).
fn relay(
    mut from: std::net::TcpStream,
    mut into: std::net::TcpStream,
    delay: std::time::Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((std::time::Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        for (at, chunk) in rx {
            let now = std::time::Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if into.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = into.shutdown(std::net::Shutdown::Both);
    });
}
