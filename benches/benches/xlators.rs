//! Per-translator microbenchmarks (ns per fop):
//! - storage/posix on tmpfs: stat, lookup, 4 KiB write and read, create+unlink
//!   (in the root and in a directory);
//! - features/locks over a null leaf: uncontended inodelk lock+unlock, and
//!   four lock owners contending for one inode;
//! - debug/io-stats over a null leaf against the null leaf alone (its
//!   overhead per fop), with latency measurement on and off;
//! - performance/quick-read over a null leaf: a 4 KiB read answered from
//!   the cache (hit), a read of an uncached inode (miss, to the leaf), and
//!   a lookup that fetches and caches the content;
//! - performance/open-behind over a null leaf: a deferred open + flush +
//!   release (nothing goes down), and open + read (the open is made) +
//!   release, against the null leaf alone.
//! - performance/write-behind over a null leaf: a 4 KiB write acknowledged
//!   from the queue (sequential, so it merges into the queue's tail) and a
//!   4 KiB O_SYNC write (not delayed: sent and answered synchronously).
//! - performance/md-cache over a null leaf: a stat answered from the cache,
//!   a stat that misses (a new gfid each time: wind, fill, evict at the
//!   bound), and a getxattr(security.selinux) answered ENODATA from the
//!   cache (what `ls -l` asks for every file).
//! - performance/readdir-ahead over a null leaf (endless directories): a
//!   4 KiB readdirp at the fd's sequential offset, served from the entries
//!   read ahead (hit; refills run in the background), and one at a seekdir'd
//!   offset, passed through to the leaf (miss), against the null leaf alone.
//! - cluster/distribute (`cluster/dht`) over three storage/posix bricks
//!   (under features/locks) on tmpfs: a lookup of an existing name (hit: its hashed subvolume), of an
//!   absent one with lookup-optimize (miss: the hashed subvolume only) and
//!   without (miss: every subvolume), and a stat by gfid (the remembered
//!   subvolume).

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use xlfs_benches::{Layer, null_graph, runtime, scratch_dir, stack};
use xlfs_runtime::client::Client;
use xlfs_sdk::{CallCtx, Dict, Fd, FdId, Flock, Fop, Gfid, LkCmd, Loc, LockType, Reply, Request, Response};

fn posix(c: &mut Criterion) {
    let rt = runtime();
    let dir = scratch_dir();
    let g = xlfs_benches::graph(&rt, &stack(dir.path(), &[]));
    let client = Client::new(g.top());
    let top = g.top();
    let ctx = client.ctx().clone();
    let f = rt.block_on(client.create("/f", libc::O_RDWR, 0o644)).expect("create");
    let fd = f.fd();
    rt.block_on(f.write(0, Bytes::from(vec![7u8; 1 << 20]))).expect("fill");
    let mut group = c.benchmark_group("posix");
    group.throughput(Throughput::Elements(1));
    group.bench_function("stat", |b| {
        b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(Fop::Stat { loc: Loc::gfid(fd.gfid) })))
    });
    group.bench_function("lookup", |b| {
        b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "f") })))
    });
    let block = Bytes::from(vec![1u8; 4096]);
    let mut off = 0u64;
    group.bench_function("write-4k", |b| {
        b.to_async(&rt).iter(|| {
            off = (off + 4096) % (1 << 20);
            top.call(ctx.clone(), Request::new(Fop::Writev { fd, data: block.clone(), offset: off, flags: 0 }))
        })
    });
    group.bench_function("read-4k", |b| {
        b.to_async(&rt).iter(|| {
            off = (off + 4096) % (1 << 20);
            top.call(ctx.clone(), Request::new(Fop::Readv { fd, size: 4096, offset: off, flags: 0 }))
        })
    });
    group.bench_function("create-unlink", |b| {
        b.to_async(&rt).iter(|| async {
            let f = client.create("/tmpfile", libc::O_RDWR, 0o644).await.expect("create");
            f.close().await.expect("close");
            client.unlink("/tmpfile").await.expect("unlink");
        })
    });
    // In a directory (resolved by its gfid, through its handle chain, for
    // each entry fop).
    rt.block_on(client.mkdir("/d", 0o755)).expect("mkdir");
    group.bench_function("create-unlink-in-dir", |b| {
        b.to_async(&rt).iter(|| async {
            let f = client.create("/d/tmpfile", libc::O_RDWR, 0o644).await.expect("create");
            f.close().await.expect("close");
            client.unlink("/d/tmpfile").await.expect("unlink");
        })
    });
    group.finish();
    g.shutdown();
}

fn inodelk(domain: &str, ty: LockType, owner: u64) -> Fop {
    Fop::Inodelk {
        domain: domain.into(),
        loc: Loc::gfid(Gfid::ROOT),
        cmd: LkCmd::SetLkw,
        lock: Flock::whole(ty, owner),
    }
}

fn locks(c: &mut Criterion) {
    let rt = runtime();
    let g = null_graph(&rt, &[("features/locks", &[])]);
    let top = g.top();
    let ctx = CallCtx::root("bench");
    let mut group = c.benchmark_group("locks");
    group.throughput(Throughput::Elements(1));
    group.bench_function("inodelk-lock-unlock-uncontended", |b| {
        b.to_async(&rt).iter(|| async {
            top.call(ctx.clone(), inodelk("d", LockType::Write, 1).into()).await.expect("lock");
            top.call(ctx.clone(), inodelk("d", LockType::Unlock, 1).into()).await.expect("unlock");
        })
    });
    // Four owners each take and release the same lock: every acquisition
    // but the first waits for a release, so this measures hand-off.
    group.throughput(Throughput::Elements(4 * 64));
    group.bench_function("inodelk-4-owners-contended-x64", |b| {
        b.to_async(&rt).iter(|| async {
            let tasks: Vec<_> = (0..4u64)
                .map(|o| {
                    let (top, ctx) = (top.clone(), ctx.with_lk_owner(o + 10));
                    tokio::spawn(async move {
                        for _ in 0..64 {
                            top.call(ctx.clone(), inodelk("c", LockType::Write, o + 10).into()).await.expect("lock");
                            top.call(ctx.clone(), inodelk("c", LockType::Unlock, o + 10).into()).await.expect("unlock");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("join");
            }
        })
    });
    group.finish();
    g.shutdown();
}

fn io_stats(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let write = || {
        Request::with_xdata(
            Fop::Writev {
                fd: Fd { id: FdId(1), gfid: Gfid::ROOT },
                data: Bytes::from_static(&[0; 4096]),
                offset: 0,
                flags: 0,
            },
            Dict::new(),
        )
    };
    let mut group = c.benchmark_group("io-stats");
    group.throughput(Throughput::Elements(1));
    let configs: [(&str, &[Layer<'_>]); 3] = [
        ("null-alone", &[]),
        ("io-stats-latency-on", &[("debug/io-stats", &[("latency-measurement", "on")])]),
        ("io-stats-latency-off", &[("debug/io-stats", &[("latency-measurement", "off")])]),
    ];
    for (name, layers) in configs {
        let g = null_graph(&rt, layers);
        let top = g.top();
        group.bench_function(format!("stat/{name}"), |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), stat())));
        group.bench_function(format!("write-4k/{name}"), |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), write())));
        g.shutdown();
    }
    group.finish();
}

fn quick_read(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let mut group = c.benchmark_group("quick-read");
    group.throughput(Throughput::Elements(1));
    let cached = Gfid([0x11; 16]);
    let uncached = Gfid([0x22; 16]);
    let read = |gfid: Gfid| Request::new(Fop::Readv { fd: Fd { id: FdId(1), gfid }, size: 4096, offset: 0, flags: 0 });
    let configs: [(&str, &[Layer<'_>]); 2] =
        [("null-alone", &[]), ("quick-read", &[("performance/quick-read", &[("cache-invalidation", "on")])])];
    for (name, layers) in configs {
        let g = null_graph(&rt, layers);
        let top = g.top();
        rt.block_on(top.call(ctx.clone(), Request::new(Fop::Lookup { loc: Loc::gfid(cached) }))).expect("lookup");
        group.bench_function(format!("read-4k-hit/{name}"), |b| {
            b.to_async(&rt).iter(|| top.call(ctx.clone(), read(cached)))
        });
        group.bench_function(format!("read-4k-miss/{name}"), |b| {
            b.to_async(&rt).iter(|| top.call(ctx.clone(), read(uncached)))
        });
        group.bench_function(format!("lookup-fetching-content/{name}"), |b| {
            b.to_async(&rt)
                .iter(|| top.call(ctx.clone(), Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "f") })))
        });
        g.shutdown();
    }
    group.finish();
}

fn open_behind(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let gfid = Gfid([0x33; 16]);
    let mut group = c.benchmark_group("open-behind");
    group.throughput(Throughput::Elements(1));
    let configs: [(&str, &[Layer<'_>]); 2] =
        [("null-alone", &[]), ("open-behind", &[("performance/open-behind", &[])])];
    for (name, layers) in configs {
        let g = null_graph(&rt, layers);
        let top = g.top();
        let mut next = 0u64;
        let mut fd = || {
            next += 1;
            Fd { id: FdId(next), gfid }
        };
        let open = |fd: Fd| Request::new(Fop::Open { loc: Loc::gfid(gfid), flags: libc::O_RDONLY as u32, fd: fd.id });
        group.bench_function(format!("open-flush-release/{name}"), |b| {
            b.to_async(&rt).iter(|| {
                let (top, ctx, fd) = (&top, &ctx, fd());
                async move {
                    top.call(ctx.clone(), open(fd)).await.expect("open");
                    top.call(ctx.clone(), Request::new(Fop::Flush { fd })).await.expect("flush");
                    top.call(ctx.clone(), Request::new(Fop::Release { fd })).await.expect("release");
                }
            })
        });
        group.bench_function(format!("open-read-release/{name}"), |b| {
            b.to_async(&rt).iter(|| {
                let (top, ctx, fd) = (&top, &ctx, fd());
                async move {
                    top.call(ctx.clone(), open(fd)).await.expect("open");
                    let read = Fop::Readv { fd, size: 4096, offset: 0, flags: 0 };
                    top.call(ctx.clone(), Request::new(read)).await.expect("read");
                    top.call(ctx.clone(), Request::new(Fop::Release { fd })).await.expect("release");
                }
            })
        });
        g.shutdown();
    }
    group.finish();
}

fn write_behind(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let gfid = Gfid([9; 16]);
    let mut group = c.benchmark_group("write-behind");
    group.throughput(Throughput::Elements(1));
    let g = null_graph(&rt, &[("performance/write-behind", &[])]);
    let top = g.top();
    let open = |id: u64, flags: u32| {
        rt.block_on(top.call(ctx.clone(), Request::new(Fop::Open { loc: Loc::gfid(gfid), flags, fd: FdId(id) })))
            .expect("open");
    };
    open(1, 0);
    open(2, libc::O_SYNC as u32);
    let write = |id: u64, offset: u64| {
        let fd = Fd { id: FdId(id), gfid };
        Request::new(Fop::Writev { fd, data: Bytes::from_static(&[0; 4096]), offset, flags: 0 })
    };
    // The first write seeds the attributes (sent synchronously).
    rt.block_on(top.call(ctx.clone(), write(1, 0))).expect("seed write");
    let offset = std::sync::atomic::AtomicU64::new(4096);
    group.bench_function("write-4k/queued", |b| {
        b.to_async(&rt).iter(|| {
            let off = offset.fetch_add(4096, std::sync::atomic::Ordering::Relaxed) % (1 << 30);
            top.call(ctx.clone(), write(1, off))
        })
    });
    group.bench_function("write-4k/o-sync", |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), write(2, 0))));
    rt.block_on(top.call(ctx.clone(), Request::new(Fop::Fsync { fd: Fd { id: FdId(1), gfid }, datasync: false })))
        .expect("fsync");
    group.finish();
    g.shutdown();
}

fn md_cache(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let mut group = c.benchmark_group("md-cache");
    group.throughput(Throughput::Elements(1));
    let g = null_graph(&rt, &[("performance/md-cache", &[("md-cache-timeout", "600")])]);
    let top = g.top();
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let selinux = || Request::new(Fop::Getxattr { loc: Loc::gfid(Gfid::ROOT), name: "security.selinux".into() });
    // The null leaf answers removexattr: md-cache then knows the xattr is
    // absent; the first stat fills the attributes.
    let rm = Fop::Removexattr { loc: Loc::gfid(Gfid::ROOT), name: "security.selinux".into() };
    rt.block_on(top.call(ctx.clone(), Request::new(rm))).expect("removexattr");
    rt.block_on(top.call(ctx.clone(), stat())).expect("stat");
    group.bench_function("stat-hit", |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), stat())));
    group.bench_function("getxattr-selinux-absent-hit", |b| {
        b.to_async(&rt).iter(|| async {
            let r = top.call(ctx.clone(), selinux()).await;
            assert!(r.is_err(), "answered ENODATA from the cache");
        })
    });
    let next = std::sync::atomic::AtomicU64::new(1);
    group.bench_function("stat-miss", |b| {
        b.to_async(&rt).iter(|| {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut id = [0x42u8; 16];
            id[8..].copy_from_slice(&n.to_be_bytes());
            top.call(ctx.clone(), Request::new(Fop::Stat { loc: Loc::gfid(Gfid(id)) }))
        })
    });
    group.finish();
    g.shutdown();
}

fn readdir_ahead(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let dir = Gfid([0x44; 16]);
    let mut group = c.benchmark_group("readdir-ahead");
    group.throughput(Throughput::Elements(1));
    let configs: [(&str, &[Layer<'_>]); 2] =
        [("null-alone", &[]), ("readdir-ahead", &[("performance/readdir-ahead", &[])])];
    for (name, layers) in configs {
        let g = null_graph(&rt, layers);
        let top = g.top();
        let (seq, seek) = (Fd { id: FdId(1), gfid: dir }, Fd { id: FdId(2), gfid: dir });
        for fd in [seq, seek] {
            rt.block_on(top.call(ctx.clone(), Request::new(Fop::Opendir { loc: Loc::gfid(dir), fd: fd.id })))
                .expect("opendir");
        }
        let readdirp = |fd: Fd, offset: u64| Request::new(Fop::Readdirp { fd, size: 4096, offset });
        // Hit: each readdirp continues where the last one ended.
        let cur = std::sync::atomic::AtomicU64::new(0);
        group.bench_function(format!("readdirp-4k-sequential/{name}"), |b| {
            b.to_async(&rt).iter(|| {
                let (top, ctx, cur) = (&top, &ctx, &cur);
                async move {
                    let off = cur.load(std::sync::atomic::Ordering::Relaxed);
                    match top.call(ctx.clone(), readdirp(seq, off)).await {
                        Ok(Response { reply: Reply::Dirents(v), .. }) => {
                            let last = v.last().map(|e| e.d_off).expect("entries");
                            cur.store(last, std::sync::atomic::Ordering::Relaxed);
                        }
                        r => panic!("readdirp: {r:?}"),
                    }
                }
            })
        });
        // Miss: after a seekdir the fd passes every readdirp to the leaf.
        rt.block_on(top.call(ctx.clone(), readdirp(seek, 0))).expect("readdirp");
        group.bench_function(format!("readdirp-4k-after-seekdir/{name}"), |b| {
            b.to_async(&rt).iter(|| top.call(ctx.clone(), readdirp(seek, 1_000_000)))
        });
        g.shutdown();
    }
    group.finish();
}

/// features/upcall (brick side): a fop by the only client of an inode
/// (recorded, nobody to tell), and a write by a second client of an inode
/// the first one has cached (an invalidation sent to the first).
fn upcall(c: &mut Criterion) {
    let rt = runtime();
    let (a, b) = (CallCtx::root("client-a"), CallCtx::root("client-b"));
    let mut group = c.benchmark_group("upcall");
    group.throughput(Throughput::Elements(1));
    let g = null_graph(&rt, &[("features/upcall", &[("cache-invalidation", "on")])]);
    let top = g.top();
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let write = || {
        Request::new(Fop::Writev {
            fd: Fd { id: FdId(1), gfid: Gfid::ROOT },
            data: Bytes::from_static(&[0; 4096]),
            offset: 0,
            flags: 0,
        })
    };
    group.bench_function("stat-one-client", |bch| bch.to_async(&rt).iter(|| top.call(a.clone(), stat())));
    group.bench_function("write-one-client", |bch| bch.to_async(&rt).iter(|| top.call(a.clone(), write())));
    group.bench_function("write-invalidating-another-client", |bch| {
        bch.to_async(&rt).iter(|| async {
            top.call(a.clone(), stat()).await.expect("stat by a");
            top.call(b.clone(), write()).await.expect("write by b")
        })
    });
    group.finish();
    g.shutdown();
}

/// The translators whose fast path is a pass-through, over the null leaf:
/// their cost on the fops they only forward and on the ones they act on.
fn pass_through(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let mut group = c.benchmark_group("pass-through");
    group.throughput(Throughput::Elements(1));
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
    let read = move |offset: u64| Request::new(Fop::Readv { fd, size: 4096, offset, flags: 0 });
    let configs: [(&str, &[Layer<'_>]); 5] = [
        ("read-ahead", &[("performance/read-ahead", &[])]),
        ("io-threads", &[("performance/io-threads", &[])]),
        ("error-gen", &[("debug/error-gen", &[("failure", "0")])]),
        ("index", &[("features/index", &[])]),
        ("utime", &[("features/utime", &[])]),
    ];
    for (name, layers) in configs {
        let g = null_graph(&rt, layers);
        let top = g.top();
        group.bench_function(format!("stat/{name}"), |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), stat())));
        match name {
            // Sequential reads (the window's hits) and scattered ones.
            "read-ahead" => {
                let next = std::sync::atomic::AtomicU64::new(0);
                group.bench_function("read-4k-sequential/read-ahead", |b| {
                    b.to_async(&rt).iter(|| {
                        let off = next.fetch_add(4096, std::sync::atomic::Ordering::Relaxed) % (1 << 30);
                        top.call(ctx.clone(), read(off))
                    })
                });
                let n = std::sync::atomic::AtomicU64::new(1);
                group.bench_function("read-4k-random/read-ahead", |b| {
                    b.to_async(&rt).iter(|| {
                        let k = n.fetch_add(7919, std::sync::atomic::Ordering::Relaxed) % (1 << 18);
                        top.call(ctx.clone(), read(k * 4096))
                    })
                });
            }
            // A lock bypasses the pool; a stat takes a permit.
            "io-threads" => {
                group.bench_function("inodelk-bypass/io-threads", |b| {
                    b.to_async(&rt).iter(|| top.call(ctx.clone(), inodelk("c", LockType::Unlock, 1).into()))
                });
            }
            // A watched xattrop goes through the index's bookkeeping.
            "index" => {
                let mut d = Dict::new();
                d.set_bytes("trusted.afr.c-0", Bytes::from_static(&[0; 12]));
                let x = Fop::Xattrop { loc: Loc::gfid(Gfid::ROOT), op: xlfs_sdk::XattropOp::AddArray, xattrs: d };
                group.bench_function("xattrop-watched/index", |b| {
                    b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(x.clone())))
                });
            }
            // A change: stamped with the clock.
            "utime" => {
                let w = Fop::Writev { fd, data: Bytes::from_static(&[0; 4096]), offset: 0, flags: 0 };
                group.bench_function("write-4k-stamped/utime", |b| {
                    b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(w.clone())))
                });
            }
            _ => {}
        }
        g.shutdown();
    }
    group.finish();
}

/// cluster/replicate over three null leaves (in process): a stat goes to
/// one child, a write is a transaction on all three (under the eager lock
/// after the first).
fn replicate(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let mut v = String::new();
    for i in 0..3 {
        v += &format!("volume n{i}\n    type bench/null\nend-volume\n");
    }
    v += "volume afr\n    type cluster/replicate\n    option post-op-delay-secs 3600\n    subvolumes n0 n1 n2\nend-volume\n";
    let g = xlfs_benches::null_volfile_graph(&rt, &v);
    let top = g.top();
    let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
    let mut group = c.benchmark_group("replicate");
    group.throughput(Throughput::Elements(1));
    group.bench_function("stat", |b| {
        b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) })))
    });
    group.bench_function("write-4k", |b| {
        b.to_async(&rt).iter(|| {
            let w = Fop::Writev { fd, data: Bytes::from_static(&[0; 4096]), offset: 0, flags: 0 };
            top.call(ctx.clone(), Request::new(w))
        })
    });
    group.finish();
    g.shutdown();
}

/// cluster/distribute over three posix bricks on tmpfs: lookups that hit,
/// miss on the hashed subvolume (lookup-optimize), and miss everywhere.
fn distribute(c: &mut Criterion) {
    let rt = runtime();
    let dirs: Vec<_> = (0..3).map(|_| scratch_dir()).collect();
    let volfile = |ty: &str, optimize: &str| {
        let mut v = String::new();
        for (i, d) in dirs.iter().enumerate() {
            v += &format!(
                "volume p{i}\n    type storage/posix\n    option directory {}\nend-volume\n",
                d.path().display()
            );
            v += &format!("volume b{i}\n    type features/locks\n    subvolumes p{i}\nend-volume\n");
        }
        v + &format!(
            "volume dht\n    type {ty}\n    option lookup-optimize {optimize}\n    subvolumes b0 b1 b2\nend-volume\n"
        )
    };
    let g = xlfs_benches::graph(&rt, &volfile("cluster/distribute", "on"));
    let everywhere = xlfs_benches::graph(&rt, &volfile("cluster/dht", "off"));
    let client = Client::new(g.top());
    let ctx = client.ctx().clone();
    let f = rt.block_on(client.create("/f", libc::O_RDWR, 0o644)).expect("create");
    let gfid = f.fd().gfid;
    rt.block_on(f.close()).expect("close");
    let (top, top_off) = (g.top(), everywhere.top());
    rt.block_on(top_off.call(ctx.clone(), Request::new(Fop::Lookup { loc: Loc::root() }))).expect("root");
    let lookup = |name: &str| Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, name) });
    let mut group = c.benchmark_group("distribute");
    group.throughput(Throughput::Elements(1));
    group.bench_function("lookup-hit", |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), lookup("f"))));
    group.bench_function("lookup-miss", |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), lookup("absent"))));
    group.bench_function("lookup-miss-everywhere", |b| {
        b.to_async(&rt).iter(|| top_off.call(ctx.clone(), lookup("absent")))
    });
    group.bench_function("stat", |b| {
        b.to_async(&rt).iter(|| top.call(ctx.clone(), Request::new(Fop::Stat { loc: Loc::gfid(gfid) })))
    });
    group.finish();
    g.shutdown();
    everywhere.shutdown();
}

criterion_group!(
    benches,
    posix,
    locks,
    io_stats,
    md_cache,
    quick_read,
    open_behind,
    write_behind,
    readdir_ahead,
    upcall,
    pass_through,
    replicate,
    distribute
);
criterion_main!(benches);
