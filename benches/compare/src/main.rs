//! `xlfs-bench`: xlfs side by side with GlusterFS 10.3 and a local ext4
//! directory on one machine, in one run.
//!
//! It brings the systems up (`xlfs up` replica 3 with its defaults, GlusterFS
//! replica 3 with its defaults through ../shared/bench/gluster-ref.sh, a
//! directory on the same disk; optionally the same on tmpfs bricks, MooseFS
//! with three copies (moosefs-ref.sh) and more xlfs columns with other
//! `xlfs up` arguments), runs ../shared/bench's
//! workloads interleaved round by round (for each round, for each workload,
//! every system in turn, in reverse order every other round), measures the
//! CPU time of each system's client and brick processes during each phase,
//! and writes results.md (the table),
//! results.png (the chart), samples.json and raw.log into the output
//! directory. Everything it starts and every directory it makes is stopped and
//! removed at the end, also on Ctrl-C or SIGTERM.

mod chart;
mod cpu;
mod parse;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

/// A named experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Sequential read (fio-seq) with read-ahead off / each policy x client
    /// io-threads off/on x numjobs 1/2/4, on xlfs and on GlusterFS with the
    /// matching `gluster volume set` options.
    SeqReadMatrix,
    /// pgbench with each of replicate's lock-contention policies (fd-count,
    /// inodelk-count, notify, and each --lock-plugin) as an xlfs column,
    /// with the INODELK and XATTROP calls each sent per transaction.
    LockPolicy,
}

/// xlfs side by side with GlusterFS 10.3 and a local directory: one table, one chart.
#[derive(Debug, Parser)]
#[command(name = "xlfs-bench", version, about, long_about = None)]
pub struct Args {
    /// The xlfs binary under test (build it with `cargo build --release`).
    #[arg(long, default_value = "target/release/xlfs")]
    pub xlfs: PathBuf,
    /// The workload scripts (fio-seq.sh, smallfile.sh, pgbench.sh, gluster-ref.sh);
    /// default: ../shared/bench from the current directory or from the repository.
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
    /// Where the systems' bricks, mounts and the local directory go (on the disk
    /// to measure); made and removed by the run. Default: /srv/xlfs-bench.PID.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Where results.md, results.png, samples.json and raw.log are written.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Small sizes and one round: under 10 minutes on a 2-core machine.
    #[arg(long)]
    pub quick: bool,
    /// Rounds (default 3, 1 with --quick).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Workloads, comma-separated, run in this order each round.
    #[arg(long, value_delimiter = ',', default_value = "fio-seq,smallfile,pgbench")]
    pub workloads: Vec<String>,
    /// The standard columns, comma-separated (any of xlfs, glusterfs, ext4,
    /// and moosefs: MooseFS with three copies through
    /// ../shared/bench/moosefs-ref.sh, the second peer, not in the default).
    #[arg(long, value_delimiter = ',', default_value = "xlfs,glusterfs,ext4")]
    pub systems: Vec<String>,
    /// Also xlfs and GlusterFS with their bricks on tmpfs (the CPU-bound
    /// case), and a tmpfs directory as their local reference.
    #[arg(long)]
    pub tmpfs: bool,
    /// Replica-3 sets of the xlfs and GlusterFS columns: more than one puts
    /// distribute over them (`xlfs up --sets N`; a GlusterFS N x 3 volume).
    #[arg(long, default_value_t = 1)]
    pub sets: u32,
    /// One more xlfs column: NAME='xlfs up arguments', e.g. wb='-o writeback-cache'
    /// or noperf='--perf none'; repeatable. Arguments that start with
    /// `@PATH` run another xlfs binary (e.g. base='@/tmp/xlfs-old', a build
    /// before a change) with the rest.
    #[arg(long = "xlfs-column", value_name = "NAME=ARGS")]
    pub xlfs_columns: Vec<String>,
    /// Run a named experiment instead of the standard comparison.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// lock-policy: a policy plugin as one more column, as
    /// `wasm:/abs/path/policy.wasm` or `dylib:/abs/path/libpolicy.so`; repeatable.
    #[arg(long, value_name = "SPEC")]
    pub lock_plugin: Vec<String>,
    /// seq-read-matrix: a read-ahead policy plugin as one more policy (a
    /// column with client io-threads off and one with them on), as
    /// `wasm:/abs/path/policy.wasm` or `dylib:/abs/path/libpolicy.so`; repeatable.
    #[arg(long, value_name = "SPEC")]
    pub ra_plugin: Vec<String>,
    /// fio-seq: size of each job's file (default 512m with one job, 256m
    /// with more; 128m with --quick).
    #[arg(long)]
    pub fio_size: Option<String>,
    /// fio-seq: jobs, one or a comma-separated list run as separate
    /// workloads (e.g. 1,4; default 1; seq-read-matrix: 1, 2 and 4, or
    /// these).
    #[arg(long, value_delimiter = ',')]
    pub numjobs: Vec<u32>,
    /// smallfile: directories x files each (default 50x100, 10x50 with --quick).
    #[arg(long)]
    pub files: Option<String>,
    /// pgbench: transactions per client (default 2000, 250 with --quick).
    #[arg(long)]
    pub txns: Option<u32>,
    /// Run nothing: make results.md and results.png in --out again from
    /// its samples.json (e.g. after changing the table or the chart).
    #[arg(long)]
    pub render: bool,
    /// pgbench: the private PostgreSQL port.
    #[arg(long, default_value_t = 55329)]
    pub pg_port: u16,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run::main(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xlfs-bench: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
