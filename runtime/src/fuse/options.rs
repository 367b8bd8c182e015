//! Mount options: what `xlfs mount -o ...` (and `mount -t fuse.xlfs -o ...`)
//! accepts, their defaults, and how they become fuser's [`Config`] and the
//! kernel's connection settings.
//!
//! Options are comma-separated `name`, `name=value` or standard mount flags
//! (`ro`, `noatime`, `nosuid` ...). Names take `-` or `_` alike. Boolean
//! options take `on/off`, `yes/no`, `true/false`, `enable/disable`, `1/0`
//! (a bare name means on). Timeouts are seconds (fractions allowed); sizes
//! are bytes with an optional `k`, `m` suffix (powers of 1024). Options that
//! only concern `/etc/fstab` (`defaults`, `auto`, `noauto`, `_netdev`,
//! `nofail`, `user`, `users`, `nouser`, `x-*`, `comment=*`) are accepted and
//! ignored. The README lists every option with its default and why.

use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};

/// Largest write and read fuser accepts (the kernel further limits a request
/// to `/proc/sys/fs/fuse/max_pages_limit` pages).
pub const MAX_IO_SIZE: u32 = 16 << 20;

/// Every option this module knows, with its default, for error messages and
/// `xlfs mount --help`.
pub const KNOWN: &[(&str, &str)] = &[
    ("entry-timeout", "1"),
    ("attribute-timeout", "1"),
    ("negative-timeout", "0"),
    ("keep-cache (kernel-cache)", "on"),
    ("auto-invalidation", "on"),
    ("writeback-cache", "off"),
    ("atime / noatime", "noatime"),
    ("max-write", "16m"),
    ("max-read", "16m"),
    ("max-readahead", "4m"),
    ("direct-io-mode", "off"),
    ("readdirplus", "on"),
    ("default-permissions", "on"),
    ("acl", "off"),
    ("selinux", "off"),
    ("allow-other", "on"),
    ("reader-threads", "2"),
    ("event-threads", "TOKIO_WORKER_THREADS, else one per core"),
    ("max-background", "64"),
    ("inode-lru-limit", "65536"),
    ("max-open-fds", "65536"),
    ("fsname", "xlfs"),
    ("backup-volfile-servers", "none"),
    ("ro / rw, suid / nosuid, dev / nodev, exec / noexec, sync / async, dirsync", "rw,nosuid,nodev,exec,async"),
];

/// The mount's settings. [`Default`] gives the documented defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    /// How long the kernel trusts a name -> inode entry (`entry-timeout`).
    pub entry_timeout: Duration,
    /// How long the kernel trusts attributes (`attribute-timeout`).
    pub attribute_timeout: Duration,
    /// How long the kernel remembers that a name does not exist
    /// (`negative-timeout`; 0 does not cache misses).
    pub negative_timeout: Duration,
    /// Keep the page cache of a file across opens (`keep-cache`,
    /// `kernel-cache`): FOPEN_KEEP_CACHE.
    pub keep_cache: bool,
    /// Drop a file's cached data when its size or mtime is seen to change
    /// other than through this mount (`auto-invalidation`). The bridge does
    /// this itself (FUSE_AUTO_INVAL_DATA would also drop it after the
    /// mount's own writes).
    pub auto_invalidation: bool,
    /// Let the kernel cache writes and send them later, merged
    /// (`writeback-cache`): FUSE_WRITEBACK_CACHE.
    pub writeback_cache: bool,
    /// Do not update access times (`noatime`; `atime` turns it off).
    pub noatime: bool,
    /// Largest write request (`max-write`).
    pub max_write: u32,
    /// Largest read request (`max-read`).
    pub max_read: u32,
    /// Read-ahead window (`max-readahead`): asked for at INIT (the kernel
    /// caps that at its default) and then set on the mount's backing device.
    pub max_readahead: u32,
    /// Bypass the page cache for file data (`direct-io-mode`): FOPEN_DIRECT_IO.
    pub direct_io: bool,
    /// List directories with attributes (`readdirplus`): FUSE_DO_READDIRPLUS.
    pub readdirplus: bool,
    /// Let the kernel check permissions from the mode bits
    /// (`default-permissions`). The bricks do not check them.
    pub default_permissions: bool,
    /// POSIX ACLs (`acl`, GlusterFS's mount option): off, as in GlusterFS,
    /// getting, setting or removing `system.posix_acl_access` and
    /// `system.posix_acl_default` fails with EOPNOTSUPP without a fop, and
    /// tools such as `ls -l` stop asking after the first file.
    pub acl: bool,
    /// SELinux labels (`selinux`, GlusterFS's mount option): off,
    /// `security.selinux` fails with EOPNOTSUPP likewise.
    pub selinux: bool,
    /// Let users other than the mounter use the mount (`allow-other`).
    pub allow_other: bool,
    /// How many threads read requests from /dev/fuse, each on its own cloned
    /// fd (`reader-threads`). They never wait on a fop.
    pub reader_threads: usize,
    /// The mount process's worker threads (`event-threads`, GlusterFS's
    /// `client.event-threads`); None: `TOKIO_WORKER_THREADS`, else one per
    /// core. Read by `main` before the runtime starts.
    pub event_threads: Option<usize>,
    /// Most background requests (read-ahead, write-back) the kernel keeps in
    /// flight (`max-background`).
    pub max_background: u16,
    /// Most inodes the kernel has forgotten that the bridge keeps cached
    /// (`inode-lru-limit`).
    pub inode_lru_limit: usize,
    /// Most files and directories open at once (`max-open-fds`; EMFILE beyond).
    pub max_open_fds: usize,
    /// The source shown in /proc/mounts (`fsname`).
    pub fsname: String,
    /// Daemons to fetch the volfile from when the one named in the source
    /// does not answer, in order (`backup-volfile-servers=H1:H2...`, as
    /// GlusterFS's; a number after a host is its port, e.g.
    /// `node2:24008:node3`; without one, the source's port). Only for a
    /// mount by name.
    pub backup_volfile_servers: Vec<String>,
    /// Read-only mount (`ro`).
    pub read_only: bool,
    /// Honour set-user-id bits (`suid`).
    pub suid: bool,
    /// Allow device files (`dev`).
    pub dev: bool,
    /// Disallow executing (`noexec`).
    pub noexec: bool,
    /// Synchronous writes (`sync`).
    pub sync: bool,
    /// Synchronous directory changes (`dirsync`).
    pub dirsync: bool,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            entry_timeout: Duration::from_secs(1),
            attribute_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            keep_cache: true,
            auto_invalidation: true,
            writeback_cache: false,
            noatime: true,
            max_write: MAX_IO_SIZE,
            max_read: MAX_IO_SIZE,
            max_readahead: 4 << 20,
            direct_io: false,
            readdirplus: true,
            default_permissions: true,
            acl: false,
            selinux: false,
            allow_other: true,
            reader_threads: 2,
            event_threads: None,
            max_background: 64,
            inode_lru_limit: 65536,
            max_open_fds: 65536,
            fsname: "xlfs".to_string(),
            backup_volfile_servers: Vec::new(),
            read_only: false,
            suid: false,
            dev: false,
            noexec: false,
            sync: false,
            dirsync: false,
        }
    }
}

/// Why an option string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A name this module does not know.
    #[error("unknown mount option '{name}' (known: {})", known_names())]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A value of the wrong form or out of range.
    #[error("mount option '{name}': {why} (got '{value}')")]
    BadValue {
        /// The option.
        name: String,
        /// The value given.
        value: String,
        /// What was expected.
        why: &'static str,
    },
}

fn known_names() -> String {
    KNOWN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

fn parse_bool(name: &str, v: Option<&str>) -> Result<bool, OptionsError> {
    match v.map(str::to_ascii_lowercase).as_deref() {
        None | Some("on" | "yes" | "true" | "enable" | "1") => Ok(true),
        Some("off" | "no" | "false" | "disable" | "0") => Ok(false),
        Some(other) => Err(bad(name, other, "expected on or off")),
    }
}

fn bad(name: &str, value: &str, why: &'static str) -> OptionsError {
    OptionsError::BadValue { name: name.to_string(), value: value.to_string(), why }
}

fn need<'a>(name: &str, v: Option<&'a str>) -> Result<&'a str, OptionsError> {
    v.ok_or_else(|| bad(name, "", "needs a value"))
}

fn parse_secs(name: &str, v: Option<&str>) -> Result<Duration, OptionsError> {
    let v = need(name, v)?;
    let s: f64 = v.parse().map_err(|_| bad(name, v, "expected seconds"))?;
    if !(0.0..=86_400.0).contains(&s) {
        return Err(bad(name, v, "expected 0 to 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

fn parse_size(name: &str, v: Option<&str>, min: u64, max: u64) -> Result<u64, OptionsError> {
    let v = need(name, v)?;
    let lower = v.to_ascii_lowercase();
    let t = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'm')) => (&t[..i], 1 << 20),
        Some((i, 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| bad(name, v, "expected a size in bytes (k, m suffixes allowed)"))?;
    let bytes = n.checked_mul(mul).ok_or_else(|| bad(name, v, "too large"))?;
    if bytes < min || bytes > max {
        return Err(bad(name, v, "out of range"));
    }
    Ok(bytes)
}

fn parse_count(name: &str, v: Option<&str>, min: u64, max: u64) -> Result<u64, OptionsError> {
    let v = need(name, v)?;
    let n: u64 = v.parse().map_err(|_| bad(name, v, "expected a whole number"))?;
    if n < min || n > max {
        return Err(bad(name, v, "out of range"));
    }
    Ok(n)
}

impl MountOptions {
    /// The defaults with `opts` (a comma-separated `-o` string) applied.
    pub fn parse(opts: &str) -> Result<MountOptions, OptionsError> {
        let mut o = MountOptions::default();
        o.apply(opts)?;
        Ok(o)
    }

    /// Applies a comma-separated option string over the current values.
    pub fn apply(&mut self, opts: &str) -> Result<(), OptionsError> {
        for item in opts.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (raw, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            let name = raw.to_ascii_lowercase().replace('_', "-");
            self.set(&name, raw, value)?;
        }
        Ok(())
    }

    fn set(&mut self, name: &str, raw: &str, v: Option<&str>) -> Result<(), OptionsError> {
        let flag = |on: bool| -> Result<bool, OptionsError> {
            match v {
                None => Ok(on),
                Some(val) => Err(bad(raw, val, "takes no value")),
            }
        };
        match name {
            "entry-timeout" => self.entry_timeout = parse_secs(raw, v)?,
            "attribute-timeout" | "attr-timeout" => self.attribute_timeout = parse_secs(raw, v)?,
            "negative-timeout" => self.negative_timeout = parse_secs(raw, v)?,
            "keep-cache" | "kernel-cache" | "fopen-keep-cache" => self.keep_cache = parse_bool(raw, v)?,
            "auto-invalidation" | "auto-inval-data" => self.auto_invalidation = parse_bool(raw, v)?,
            "writeback-cache" | "kernel-writeback-cache" => self.writeback_cache = parse_bool(raw, v)?,
            "noatime" => self.noatime = flag(true)?,
            "atime" | "relatime" | "strictatime" => self.noatime = !flag(true)?,
            "max-write" => self.max_write = parse_size(raw, v, 4096, MAX_IO_SIZE.into())? as u32,
            "max-read" => self.max_read = parse_size(raw, v, 4096, MAX_IO_SIZE.into())? as u32,
            "max-readahead" => self.max_readahead = parse_size(raw, v, 4096, 1 << 30)? as u32,
            "direct-io-mode" | "direct-io" => self.direct_io = parse_bool(raw, v)?,
            "readdirplus" | "use-readdirp" => self.readdirplus = parse_bool(raw, v)?,
            "default-permissions" => self.default_permissions = parse_bool(raw, v)?,
            "acl" => self.acl = parse_bool(raw, v)?,
            "noacl" => self.acl = !flag(true)?,
            "selinux" => self.selinux = parse_bool(raw, v)?,
            "allow-other" => self.allow_other = parse_bool(raw, v)?,
            "reader-threads" => self.reader_threads = parse_count(raw, v, 1, 64)? as usize,
            "event-threads" => self.event_threads = Some(parse_count(raw, v, 1, 256)? as usize),
            "max-background" | "background-qlen" => self.max_background = parse_count(raw, v, 1, 65535)? as u16,
            "inode-lru-limit" | "lru-limit" => self.inode_lru_limit = parse_count(raw, v, 0, 1 << 30)? as usize,
            "max-open-fds" => self.max_open_fds = parse_count(raw, v, 1, 1 << 24)? as usize,
            "fsname" => {
                let n = need(raw, v)?;
                if n.is_empty() || n.contains(char::is_whitespace) {
                    return Err(bad(raw, n, "expected a word"));
                }
                self.fsname = n.to_string();
            }
            "backup-volfile-servers" | "backup-volfile-server" => {
                self.backup_volfile_servers = parse_servers(raw, need(raw, v)?)?;
            }
            "ro" => self.read_only = flag(true)?,
            "rw" => self.read_only = !flag(true)?,
            "suid" => self.suid = flag(true)?,
            "nosuid" => self.suid = !flag(true)?,
            "dev" => self.dev = flag(true)?,
            "nodev" => self.dev = !flag(true)?,
            "exec" => self.noexec = !flag(true)?,
            "noexec" => self.noexec = flag(true)?,
            "sync" => self.sync = flag(true)?,
            "async" => self.sync = !flag(true)?,
            "dirsync" => self.dirsync = flag(true)?,
            // fstab-only options, for mount(8) and mount.xlfs.
            "defaults" | "auto" | "noauto" | "-netdev" | "nofail" | "user" | "users" | "nouser" | "owner" | "group"
            | "comment" => {}
            n if n.starts_with("x-") => {}
            _ => return Err(OptionsError::Unknown { name: raw.to_string() }),
        }
        Ok(())
    }

    /// fuser's session configuration: mount flags and kernel options, who
    /// may use the mount, reader threads on cloned fds.
    pub fn fuser_config(&self) -> Config {
        let mut m = vec![MountOption::FSName(self.fsname.clone()), MountOption::Subtype("xlfs".to_string())];
        let flags = [
            (self.default_permissions, MountOption::DefaultPermissions),
            (self.noatime, MountOption::NoAtime),
            (self.read_only, MountOption::RO),
            (self.suid, MountOption::Suid),
            (self.dev, MountOption::Dev),
            (self.noexec, MountOption::NoExec),
            (self.sync, MountOption::Sync),
            (self.dirsync, MountOption::DirSync),
        ];
        m.extend(flags.into_iter().filter(|(on, _)| *on).map(|(_, o)| o));
        m.push(MountOption::CUSTOM(format!("max_read={}", self.max_read)));
        let mut c = Config::default();
        c.mount_options = m;
        c.acl = if self.allow_other { SessionACL::All } else { SessionACL::Owner };
        c.n_threads = Some(self.reader_threads);
        c.clone_fd = true;
        c
    }

    /// `-o` text that gives these options (for the daemon re-exec and logs).
    pub fn to_option_string(&self) -> String {
        let b = |x: bool| if x { "on" } else { "off" };
        let mut v = vec![
            format!("entry-timeout={}", self.entry_timeout.as_secs_f64()),
            format!("attribute-timeout={}", self.attribute_timeout.as_secs_f64()),
            format!("negative-timeout={}", self.negative_timeout.as_secs_f64()),
            format!("keep-cache={}", b(self.keep_cache)),
            format!("auto-invalidation={}", b(self.auto_invalidation)),
            format!("writeback-cache={}", b(self.writeback_cache)),
            (if self.noatime { "noatime" } else { "atime" }).to_string(),
            format!("max-write={}", self.max_write),
            format!("max-read={}", self.max_read),
            format!("max-readahead={}", self.max_readahead),
            format!("direct-io-mode={}", b(self.direct_io)),
            format!("readdirplus={}", b(self.readdirplus)),
            format!("default-permissions={}", b(self.default_permissions)),
            format!("acl={}", b(self.acl)),
            format!("selinux={}", b(self.selinux)),
            format!("allow-other={}", b(self.allow_other)),
            format!("reader-threads={}", self.reader_threads),
            format!("max-background={}", self.max_background),
            format!("inode-lru-limit={}", self.inode_lru_limit),
            format!("max-open-fds={}", self.max_open_fds),
            format!("fsname={}", self.fsname),
            (if self.read_only { "ro" } else { "rw" }).to_string(),
            (if self.suid { "suid" } else { "nosuid" }).to_string(),
            (if self.dev { "dev" } else { "nodev" }).to_string(),
            (if self.noexec { "noexec" } else { "exec" }).to_string(),
            (if self.sync { "sync" } else { "async" }).to_string(),
        ];
        if self.dirsync {
            v.push("dirsync".to_string());
        }
        if !self.backup_volfile_servers.is_empty() {
            v.push(format!("backup-volfile-servers={}", self.backup_volfile_servers.join(":")));
        }
        if let Some(n) = self.event_threads {
            v.push(format!("event-threads={n}"));
        }
        v.join(",")
    }
}

/// `H1:H2:PORT:H3` as `["H1", "H2:PORT", "H3"]`: a number is the port of
/// the host before it.
fn parse_servers(raw: &str, v: &str) -> Result<Vec<String>, OptionsError> {
    let mut out: Vec<String> = Vec::new();
    let mut has_port = false;
    for t in v.split(':') {
        if t.is_empty() || t.contains(char::is_whitespace) {
            return Err(bad(raw, v, "expected HOST[:PORT]:HOST[:PORT]..."));
        }
        if t.bytes().all(|b| b.is_ascii_digit()) {
            let port_ok = t.parse::<u16>().is_ok_and(|p| p > 0);
            match out.last_mut() {
                Some(last) if port_ok && !has_port => {
                    last.push(':');
                    last.push_str(t);
                    has_port = true;
                }
                _ => return Err(bad(raw, v, "a port must follow a host, once, and be 1-65535")),
            }
        } else {
            out.push(t.to_string());
            has_port = false;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_volfile_servers_take_hosts_and_ports() {
        let mut o = MountOptions::default();
        o.apply("backup-volfile-servers=node2:node3:24008:10.0.0.4").expect("parses");
        assert_eq!(o.backup_volfile_servers, ["node2", "node3:24008", "10.0.0.4"]);
        let again = MountOptions::parse(&o.to_option_string()).expect("round trip");
        assert_eq!(again.backup_volfile_servers, o.backup_volfile_servers);
        for bad in [
            "backup-volfile-servers=",
            "backup-volfile-servers=24008",
            "backup-volfile-servers=a:1:2",
            "backup-volfile-servers=a::b",
        ] {
            let e = MountOptions::default().apply(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.to_string().contains("backup-volfile-servers"), "{e}");
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let d = MountOptions::default();
        assert_eq!(MountOptions::parse("").expect("empty"), d);
        let o = MountOptions::parse(
            "entry_timeout=0.5,attribute-timeout=3,negative-timeout=2,kernel-cache=off,writeback-cache,atime,\
             max-write=128k,max_read=1M,max-readahead=8m,direct-io-mode=enable,allow_other=no,reader-threads=4,\
             fsname=vol1,ro,suid,defaults,_netdev,noauto,x-systemd.automount,inode-lru-limit=0,event-threads=1",
        )
        .expect("parses");
        assert_eq!(o.entry_timeout, Duration::from_millis(500));
        assert_eq!(o.attribute_timeout, Duration::from_secs(3));
        assert_eq!(o.negative_timeout, Duration::from_secs(2));
        assert!(!o.keep_cache && o.writeback_cache && !o.noatime && o.direct_io && !o.allow_other);
        assert_eq!((o.max_write, o.max_read, o.max_readahead), (128 << 10, 1 << 20, 8 << 20));
        assert_eq!(
            (o.reader_threads, o.fsname.as_str(), o.read_only, o.suid, o.inode_lru_limit),
            (4, "vol1", true, true, 0)
        );
        assert_eq!((o.event_threads, d.event_threads), (Some(1), None));
        // Round trip through the option string.
        assert_eq!(MountOptions::parse(&o.to_option_string()).expect("round trip"), o);
        assert_eq!(MountOptions::parse(&d.to_option_string()).expect("round trip"), d);
    }

    #[test]
    fn refusals_name_the_option() {
        let e = MountOptions::parse("entry-timeout=soon").expect_err("bad");
        assert_eq!(e.to_string(), "mount option 'entry-timeout': expected seconds (got 'soon')");
        let e = MountOptions::parse("max-write=64m").expect_err("too big");
        assert!(matches!(e, OptionsError::BadValue { ref name, .. } if name == "max-write"), "{e}");
        assert!(MountOptions::parse("max-write=1k").is_err(), "below 4k");
        assert!(MountOptions::parse("keep-cache=maybe").is_err());
        assert!(MountOptions::parse("noatime=1").is_err(), "flags take no value");
        assert!(MountOptions::parse("reader-threads=0").is_err());
        assert!(MountOptions::parse("event-threads=0").is_err());
        assert!(MountOptions::parse("event-threads=257").is_err());
        assert!(MountOptions::parse("entry-timeout").is_err(), "needs a value");
        let e = MountOptions::parse("frobnicate").expect_err("unknown");
        assert!(e.to_string().starts_with("unknown mount option 'frobnicate' (known: entry-timeout,"), "{e}");
    }

    #[test]
    fn fuser_config_carries_flags_acl_and_threads() {
        let c = MountOptions::parse("ro,noexec,reader-threads=3,max-read=1m").expect("parses").fuser_config();
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(c.mount_options.contains(&MountOption::NoExec));
        assert!(c.mount_options.contains(&MountOption::NoAtime));
        assert!(c.mount_options.contains(&MountOption::DefaultPermissions));
        assert!(c.mount_options.contains(&MountOption::CUSTOM("max_read=1048576".into())));
        assert!(!c.mount_options.contains(&MountOption::Suid));
        assert_eq!((c.acl, c.n_threads, c.clone_fd), (SessionACL::All, Some(3), true));
        let c = MountOptions::parse("allow-other=off,default-permissions=off").expect("parses").fuser_config();
        assert_eq!(c.acl, SessionACL::Owner);
        assert!(!c.mount_options.contains(&MountOption::DefaultPermissions));
    }
}
