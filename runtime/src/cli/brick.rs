//! `xlfs brick`: serves a brick graph until SIGTERM or SIGINT.
//!
//! Either the graph comes from `--volfile FILE` (its top must be
//! protocol/server), or it is generated for `--dir DIR` as GlusterFS's
//! glusterd would: `NAME-posix` (storage/posix on DIR) -> `NAME-locks` ->
//! `NAME-io-threads` -> `NAME-index` (features/index, its index kept in
//! `DIR/.glusterfs/indices`; above io-threads and below io-stats, as in
//! GlusterFS's brick graph) -> `DIR` (debug/io-stats, named by the absolute brick
//! path, which is what clients give as `remote-subvolume`) -> `NAME-server`
//! (protocol/server). Once the graph is up and the server listens, one line
//! goes to stdout, `xlfs brick: serving DIR as NAME on HOST:PORT`, with the
//! real port (scripts and the test kit read it). On SIGTERM or SIGINT the
//! server stops accepting, in-flight fops finish (the graph's shutdown runs
//! on a blocking thread) and the command returns `Ok`; a second signal while
//! stopping gives up waiting ([`BrickError::Forced`], exit status 1).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args};
use tokio::signal::unix::{SignalKind, signal};

use super::CliError;
use crate::graph::{Graph, TopState};
use crate::registry::Registry;
use crate::volfile::Volfile;

/// The translator type a brick graph's top must have.
const SERVER_TYPE: &str = "protocol/server";

/// How long the graph may take to come up and listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `xlfs brick`: `--volfile FILE`, or `--dir DIR` with the options below.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["volfile", "dir"])))]
pub struct BrickArgs {
    /// Serve the graph in this volfile (its top must be protocol/server).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dir", "port", "host", "volume", "allow", "posix", "server"])]
    pub volfile: Option<PathBuf>,
    /// Serve this directory with the standard brick graph.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// TCP port to listen on; 0 picks a free one (the start line says which).
    #[arg(long, default_value_t = 49152)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    pub host: String,
    /// The volume's name [default: the directory's file name].
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// Client addresses allowed to connect, as patterns (`127.0.0.1`,
    /// `10.1.*`); several may follow one flag or be comma-separated
    /// [default: all].
    #[arg(long, value_name = "PATTERN", num_args = 1.., value_delimiter = ',')]
    pub allow: Vec<String>,
    /// A storage/posix option for the generated graph, as KEY=VALUE (e.g.
    /// o-direct-min-size=0); repeatable.
    #[arg(long = "posix", value_name = "KEY=VALUE")]
    pub posix: Vec<String>,
    /// A protocol/server option for the generated graph, as KEY=VALUE (e.g.
    /// transport.socket.ssl-enabled=on); repeatable.
    #[arg(long = "server", value_name = "KEY=VALUE")]
    pub server: Vec<String>,
    /// Print the volfile that would be served, and exit.
    #[arg(long)]
    pub print_volfile: bool,
    /// Append the log to FILE instead of writing it to stderr.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

/// Why a brick could not be served.
#[derive(Debug, thiserror::Error)]
pub enum BrickError {
    /// The brick directory cannot be used.
    #[error("brick directory {}: {source}", dir.display())]
    Dir {
        /// The directory as given.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The brick path is not a directory.
    #[error("brick directory {}: not a directory", .0.display())]
    NotDir(PathBuf),
    /// The directory has no file name to name the volume after.
    #[error("brick directory {}: cannot name a volume after it; give --volume NAME", .0.display())]
    NoName(PathBuf),
    /// A value cannot be written into a volfile.
    #[error("{what} {value:?}: must be non-empty, without whitespace, ',' or '#'")]
    BadWord {
        /// What the value is (`--volume`, `--host` ...).
        what: &'static str,
        /// The value.
        value: String,
    },
    /// The volfile's top is not a server.
    #[error("{origin}: top volume '{top}' is {type_name}; a brick's top must be {SERVER_TYPE}")]
    NotServer {
        /// The volfile.
        origin: String,
        /// The top volume.
        top: String,
        /// Its type.
        type_name: String,
    },
    /// The graph did not come up or the server did not listen in time.
    #[error("brick '{top}' did not start within {timeout:?}: {why} (see the log)")]
    NotStarted {
        /// The top volume.
        top: String,
        /// How long was waited.
        timeout: Duration,
        /// What was missing.
        why: &'static str,
    },
    /// Arguments that do not parse (a brick volfile asked of the daemon).
    #[error("xlfs brick arguments: {0}")]
    Args(String),
    /// A second signal came while stopping: in-flight fops were not waited for.
    #[error("{0} while stopping: stopped without waiting for in-flight fops")]
    Forced(&'static str),
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
    /// The shutdown task failed.
    #[error("shutting down: {0}")]
    Shutdown(#[from] tokio::task::JoinError),
}

/// What to serve: the volfile text and how to name it in the start line.
#[derive(Debug)]
struct Plan {
    text: String,
    origin: String,
}

/// Accepts `value` if it is a single volfile word.
fn word<'a>(what: &'static str, value: &'a str) -> Result<&'a str, BrickError> {
    if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == ',' || c == '#') {
        return Err(BrickError::BadWord { what, value: value.to_string() });
    }
    Ok(value)
}

/// KEY=VALUE arguments of `what` as (key, value): the key a volfile word,
/// the value an option value (a list's commas allowed, as in
/// `auth.ssl-allow=node1,node2`).
fn pairs<'a>(what: &'static str, kvs: &'a [String]) -> Result<Vec<(&'a str, &'a str)>, BrickError> {
    let value = |v: &'a str| match v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == '#') {
        true => Err(BrickError::BadWord { what, value: v.to_string() }),
        false => Ok(v),
    };
    kvs.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((word(what, k)?, value(v)?)),
            None => Err(BrickError::BadWord { what, value: kv.clone() }),
        })
        .collect()
}

/// The standard brick volfile for `dir` (absolute) served as `name`.
fn brick_volfile(
    dir: &str,
    name: &str,
    host: &str,
    port: u16,
    allow: &[&str],
    posix: &[(&str, &str)],
    server: &[(&str, &str)],
) -> String {
    // An `auth.addr.*.allow` among the server options (the volume key
    // `auth.allow`) replaces the default of every address.
    let given = server.iter().any(|(k, _)| k.starts_with("auth.addr.") && k.ends_with(".allow"));
    let allow = match (allow.is_empty(), given) {
        (true, true) => String::new(),
        (true, false) => format!("    option auth.addr.{dir}.allow *\n"),
        (false, _) => format!("    option auth.addr.{dir}.allow {}\n", allow.join(",")),
    };
    let lines =
        |opts: &[(&str, &str)]| -> String { opts.iter().map(|(k, v)| format!("    option {k} {v}\n")).collect() };
    let (posix, server) = (lines(posix), lines(server));
    format!(
        "# generated by xlfs brick\n\
         volume {name}-posix\n    type storage/posix\n    option directory {dir}\n{posix}end-volume\n\n\
         volume {name}-locks\n    type features/locks\n    subvolumes {name}-posix\nend-volume\n\n\
         volume {name}-upcall\n    type features/upcall\n    subvolumes {name}-locks\nend-volume\n\n\
         volume {name}-io-threads\n    type performance/io-threads\n    subvolumes {name}-upcall\nend-volume\n\n\
         volume {name}-index\n    type features/index\n    option index-base {dir}/.glusterfs/indices\n    \
         subvolumes {name}-io-threads\nend-volume\n\n\
         volume {dir}\n    type debug/io-stats\n    option unique-id {dir}\n    subvolumes {name}-index\nend-volume\n\n\
         volume {name}-server\n    type {SERVER_TYPE}\n    option transport.socket.listen-port {port}\n    \
         option transport.socket.bind-address {host}\n{allow}{server}    \
         subvolumes {dir}\nend-volume\n"
    )
}

impl BrickArgs {
    /// The volfile to serve.
    fn plan(&self) -> Result<Plan, CliError> {
        if let Some(file) = &self.volfile {
            let text = std::fs::read_to_string(file)
                .map_err(|source| crate::volfile::VolfileError::Io { file: file.display().to_string(), source })?;
            return Ok(Plan { text, origin: file.display().to_string() });
        }
        let Some(dir) = &self.dir else { unreachable!("clap requires --volfile or --dir") };
        // Printing the volfile serves nothing: the directory need not exist yet.
        let abs = match std::fs::canonicalize(dir) {
            Ok(abs) => abs,
            Err(_) if self.print_volfile => {
                std::path::absolute(dir).map_err(|source| BrickError::Dir { dir: dir.clone(), source })?
            }
            Err(source) => return Err(BrickError::Dir { dir: dir.clone(), source }.into()),
        };
        if !self.print_volfile && !abs.is_dir() {
            return Err(BrickError::NotDir(dir.clone()).into());
        }
        let name = match &self.volume {
            Some(v) => v.clone(),
            None => abs
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| BrickError::NoName(dir.clone()))?,
        };
        let abs_str =
            abs.to_str().ok_or_else(|| BrickError::BadWord { what: "--dir", value: abs.display().to_string() })?;
        let allow = self.allow.iter().map(|p| word("--allow", p)).collect::<Result<Vec<_>, _>>()?;
        let (posix, server) = (pairs("--posix", &self.posix)?, pairs("--server", &self.server)?);
        let text = brick_volfile(
            word("--dir", abs_str)?,
            word("--volume", &name)?,
            word("--host", &self.host)?,
            self.port,
            &allow,
            &posix,
            &server,
        );
        Ok(Plan { text, origin: format!("brick {}", abs.display()) })
    }

    /// The volfile `xlfs brick ARGS` serves (ARGS without the command).
    pub fn volfile_of(args: &[String]) -> Result<String, CliError> {
        #[derive(clap::Parser)]
        struct One {
            #[command(flatten)]
            brick: BrickArgs,
        }
        let argv = std::iter::once("brick".to_string()).chain(args.iter().cloned());
        let mut one = <One as clap::Parser>::try_parse_from(argv)
            .map_err(|e| BrickError::Args(e.to_string().trim().to_string()))?;
        one.brick.print_volfile = true;
        Ok(one.brick.plan()?.text)
    }

    /// Serves the brick until SIGTERM or SIGINT (or prints its volfile).
    pub(super) async fn run(self, out: &mut dyn Write) -> Result<(), CliError> {
        let plan = self.plan()?;
        if self.print_volfile {
            out.write_all(plan.text.as_bytes())?;
            out.flush()?;
            return Ok(());
        }
        let volfile = Volfile::parse(&plan.text, plan.origin.clone())?;
        let graph = Arc::new(Graph::build(&volfile, &Registry::builtin())?);
        let top = graph.spec().top_name().to_string();
        let Some(top_decl) = volfile.volume(&top) else { unreachable!("the graph's top is a volume of its volfile") };
        if top_decl.type_name != SERVER_TYPE {
            return Err(
                BrickError::NotServer { origin: plan.origin, top, type_name: top_decl.type_name.clone() }.into()
            );
        }
        let served: Vec<&str> = top_decl.subvolumes.iter().map(|s| s.name.as_str()).collect();
        let name = top.strip_suffix("-server").unwrap_or(&top);

        // Handlers first, so that a signal during start-up is not fatal.
        let mut term = signal(SignalKind::terminate()).map_err(BrickError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(BrickError::Signal)?;
        graph.activate();
        let started = tokio::select! {
            r = wait_listening(&graph, &top) => Some(r),
            _ = term.recv() => None,
            _ = int.recv() => None,
        };
        let listen = match started {
            Some(Ok(listen)) => listen,
            Some(Err(e)) => {
                shutdown(graph).await?;
                return Err(e.into());
            }
            None => {
                tracing::info!("signalled while starting; stopping");
                return shutdown(graph).await;
            }
        };
        let line = format!("xlfs brick: serving {} as {name} on {listen}", served.join(","));
        tracing::info!(origin = %plan.origin, "{line}");
        writeln!(out, "{line}")?;
        out.flush()?;

        let sig = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            signal = sig,
            "stopping: no new connections, letting in-flight fops finish (signal again to stop at once)"
        );
        tokio::select! {
            r = shutdown(graph) => r?,
            _ = term.recv() => return Err(BrickError::Forced("SIGTERM").into()),
            _ = int.recv() => return Err(BrickError::Forced("SIGINT").into()),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Waits until the graph's top is up and the server reports the address
/// it listens on (its dump's `listen`); returns that address.
async fn wait_listening(graph: &Graph, top: &str) -> Result<String, BrickError> {
    let key = format!("{top}.listen");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let listen = graph.dump().into_iter().find(|(k, _)| *k == key).map(|(_, v)| v);
        let up = graph.state() == TopState::Up;
        if let (Some(listen), true) = (&listen, up) {
            return Ok(listen.clone());
        }
        if Instant::now() >= deadline {
            let why = if listen.is_none() { "the server is not listening" } else { "the graph did not come up" };
            return Err(BrickError::NotStarted { top: top.to_string(), timeout: START_TIMEOUT, why });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Shuts the graph down on a blocking thread (the server's `fini` waits for
/// in-flight requests).
async fn shutdown(graph: Arc<Graph>) -> Result<(), CliError> {
    tokio::task::spawn_blocking(move || graph.shutdown()).await.map_err(BrickError::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;
    use crate::graph::GraphSpec;

    fn brick_args(args: &[&str]) -> Result<BrickArgs, clap::Error> {
        let cli = Cli::try_parse_from(["xlfs", "brick"].iter().chain(args))?;
        match cli.command {
            Command::Brick(b) => Ok(b),
            other => panic!("not a brick command: {other:?}"),
        }
    }

    #[test]
    fn parses_both_forms_and_refuses_mixes() {
        let b = brick_args(&["--dir", "/d"]).expect("dir form");
        assert_eq!((b.port, b.host.as_str(), b.allow.len(), b.print_volfile), (49152, "0.0.0.0", 0, false));
        let b = brick_args(&[
            "--dir",
            "/d",
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--allow",
            "10.1.*",
            "127.*",
            "--allow",
            "a,b",
        ])
        .expect("options");
        assert_eq!(b.port, 0);
        assert_eq!(b.allow, ["10.1.*", "127.*", "a", "b"]);
        let b = brick_args(&["--volfile", "b.vol", "--log-file", "/tmp/l"]).expect("volfile form");
        assert_eq!(b.volfile.as_deref(), Some(Path::new("b.vol")));
        assert!(brick_args(&[]).is_err(), "one of --dir and --volfile is required");
        assert!(brick_args(&["--volfile", "b.vol", "--dir", "/d"]).is_err());
        assert!(brick_args(&["--volfile", "b.vol", "--port", "1"]).is_err());
        assert!(brick_args(&["--dir", "/d", "--port", "70000"]).is_err());
    }

    #[test]
    fn generated_volfile_is_the_glusterfs_brick_stack() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("b1");
        std::fs::create_dir(&dir).expect("mkdir");
        let b = brick_args(&["--dir", dir.to_str().expect("utf-8"), "--port", "0", "--allow", "127.0.0.1,10.*"])
            .expect("args");
        let plan = b.plan().expect("plan");
        let v = Volfile::parse(&plan.text, "gen").expect("parses");
        let abs = std::fs::canonicalize(&dir).expect("canonical").display().to_string();
        let names: Vec<(&str, &str)> = v.volumes.iter().map(|d| (d.name.as_str(), d.type_name.as_str())).collect();
        assert_eq!(
            names,
            [
                ("b1-posix", "storage/posix"),
                ("b1-locks", "features/locks"),
                ("b1-upcall", "features/upcall"),
                ("b1-io-threads", "performance/io-threads"),
                ("b1-index", "features/index"),
                (abs.as_str(), "debug/io-stats"),
                ("b1-server", "protocol/server"),
            ]
        );
        let opt = |vol: &str, key: &str| {
            v.volume(vol).and_then(|d| d.options.iter().find(|o| o.key == key)).map(|o| o.value.clone())
        };
        assert_eq!(opt("b1-posix", "directory").as_deref(), Some(abs.as_str()));
        assert_eq!(opt("b1-index", "index-base"), Some(format!("{abs}/.glusterfs/indices")));
        assert_eq!(opt("b1-server", "transport.socket.listen-port").as_deref(), Some("0"));
        assert_eq!(opt("b1-server", "transport.socket.bind-address").as_deref(), Some("0.0.0.0"));
        assert_eq!(opt("b1-server", &format!("auth.addr.{abs}.allow")).as_deref(), Some("127.0.0.1,10.*"));
        assert_eq!(v.volume("b1-server").expect("server").subvolumes[0].name, abs);
        GraphSpec::validate(&v, &Registry::builtin()).expect("the generated volfile is valid");
    }

    #[test]
    fn server_and_posix_options_take_list_values() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_str().expect("utf-8");
        let args = ["--dir", dir, "--server", "auth.ssl-allow=node1,node2", "--posix", "o-direct-min-size=0"];
        let text = brick_args(&args).expect("args").plan().expect("plan").text;
        assert!(text.contains("    option auth.ssl-allow node1,node2\n"), "{text}");
        assert!(text.contains("    option o-direct-min-size 0\n"), "{text}");
        for bad in ["auth.ssl-allow=a b", "auth.ssl-allow=", "a b=1", "noequals", "k=v#x"] {
            let e = brick_args(&["--dir", dir, "--server", bad]).expect("args").plan().expect_err(bad);
            assert!(e.to_string().contains("--server"), "{bad}: {e}");
        }
    }

    #[test]
    fn volume_name_and_default_allow() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let b = brick_args(&["--dir", tmp.path().to_str().expect("utf-8"), "--volume", "vol7"]).expect("args");
        let text = b.plan().expect("plan").text;
        assert!(text.contains("volume vol7-server\n"), "{text}");
        assert!(text.contains(".allow *\n"), "all addresses by default: {text}");
    }

    #[test]
    fn bad_dirs_and_words_are_refused_with_the_reason() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("nope");
        let e = brick_args(&["--dir", missing.to_str().expect("utf-8")]).expect("args").plan().expect_err("missing");
        assert!(e.to_string().starts_with(&format!("brick directory {}: ", missing.display())), "{e}");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let e = brick_args(&["--dir", file.to_str().expect("utf-8")]).expect("args").plan().expect_err("a file");
        assert!(e.to_string().ends_with("not a directory"), "{e}");
        let e = brick_args(&["--dir", tmp.path().to_str().expect("utf-8"), "--volume", "a b"])
            .expect("args")
            .plan()
            .expect_err("space");
        assert!(e.to_string().starts_with("--volume \"a b\""), "{e}");
        let e = brick_args(&["--dir", tmp.path().to_str().expect("utf-8"), "--host", "#x"])
            .expect("args")
            .plan()
            .expect_err("hash");
        assert!(e.to_string().starts_with("--host"), "{e}");
    }

    #[tokio::test]
    async fn print_volfile_prints_and_returns() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let b = brick_args(&["--dir", tmp.path().to_str().expect("utf-8"), "--print-volfile"]).expect("args");
        let expected = b.plan().expect("plan").text;
        let mut out = Vec::new();
        b.run(&mut out).await.expect("prints");
        assert_eq!(String::from_utf8(out).expect("utf-8"), expected);
        // A directory not made yet: printing does not need it; serving does.
        let later = tmp.path().join("not-yet");
        let dir = later.to_str().expect("utf-8");
        let text = brick_args(&["--dir", dir, "--print-volfile"]).expect("args").plan().expect("plan").text;
        assert!(text.contains(&format!("option directory {dir}\n")), "{text}");
        assert!(brick_args(&["--dir", dir]).expect("args").plan().is_err(), "serving a missing directory");
    }

    #[tokio::test]
    async fn a_volfile_whose_top_is_not_a_server_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("b.vol");
        std::fs::write(
            &vol,
            format!("volume p\n type storage/posix\n option directory {}\nend-volume\n", tmp.path().display()),
        )
        .expect("write");
        let b = brick_args(&["--volfile", vol.to_str().expect("utf-8")]).expect("args");
        let e = b.run(&mut Vec::new()).await.expect_err("not a server");
        assert_eq!(
            e.to_string(),
            format!("{}: top volume 'p' is storage/posix; a brick's top must be protocol/server", vol.display())
        );
    }
}
