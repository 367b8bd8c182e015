//! Tests of graph checking, building, events, timing, diff and reconfigure.

use std::cell::RefCell;

use xlfs_sdk::{CallCtx, Errno, Fop, FopFuture, Loc, OptType, OptionDecl, Request};

use super::*;

thread_local! {
    /// What the test translators saw, as "name:what" lines.
    static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn log(line: String) {
    LOG.with(|l| l.borrow_mut().push(line));
}

fn take_log() -> Vec<String> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// A test translator: a leaf says ChildUp on ParentUp and ChildDown on
/// ParentDown (when its `up` option is on); any node passes child events on.
struct TestXl {
    name: String,
    children: Vec<Child>,
    sink: EventSink,
    leaf_up: bool,
}

impl Xlator for TestXl {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            match self.children.first() {
                Some(c) => c.call(ctx, req).await,
                None => Err(Errno::ENOSYS),
            }
        })
    }
    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        log(format!("{}:{event:?}:{from:?}", self.name));
        match (from, &event) {
            (EventFrom::Graph, Event::ParentUp) if self.leaf_up => self.sink.send(Event::ChildUp),
            (EventFrom::Graph, Event::ParentDown) if self.leaf_up => self.sink.send(Event::ChildDown),
            (EventFrom::Child(_), _) => return Some(event),
            _ => {}
        }
        None
    }
    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        if self.children.is_empty() {
            return Err(ReconfigureError::Unsupported);
        }
        let n = options.int("thread-count").unwrap_or(0);
        if n == 13 {
            return Err(ReconfigureError::Invalid("13 is unlucky".into()));
        }
        log(format!("{}:reconfigure:{n}", self.name));
        Ok(())
    }
    fn dump(&self) -> Vec<(String, String)> {
        let names: Vec<&str> = self.children.iter().map(|c| &*c.name).collect();
        vec![("children".into(), names.join(","))]
    }
    fn fini(&self) {
        log(format!("{}:fini", self.name));
    }
}

fn build_test(init: InitCtx, leaf: bool) -> Result<Arc<dyn Xlator>, InitError> {
    if init.options.bool("fail") == Some(true) {
        return Err(InitError::new("option 'directory' is required"));
    }
    log(format!("{}:build", init.name));
    let leaf_up = leaf && init.options.bool("up") == Some(true);
    Ok(Arc::new(TestXl { name: init.name, children: init.children, sink: init.events, leaf_up }))
}

const LEAF_OPTS: &[OptionDecl] = &[
    OptionDecl::new("up", OptType::Bool).default("on"),
    OptionDecl::new("fail", OptType::Bool).default("off"),
    OptionDecl::new("directory", OptType::Path),
    OptionDecl::new("module", OptType::Module),
];
const PASS_OPTS: &[OptionDecl] = &[
    OptionDecl::new("thread-count", OptType::Int).default("16").range(1.0, 64.0),
    OptionDecl::new("mode", OptType::Enum(&["fast", "safe"])).default("safe"),
];

const LEAF: XlatorType = XlatorType {
    name: "test/leaf",
    description: "a leaf",
    options: LEAF_OPTS,
    min_children: 0,
    max_children: 0,
    build: |i| build_test(i, true),
};
const PASS: XlatorType = XlatorType {
    name: "test/pass",
    description: "one child",
    options: PASS_OPTS,
    min_children: 1,
    max_children: 1,
    build: |i| build_test(i, false),
};
const FAN: XlatorType = XlatorType {
    name: "test/fan",
    description: "two or more children",
    options: &[],
    min_children: 2,
    max_children: usize::MAX,
    build: |i| build_test(i, false),
};

fn registry() -> Registry {
    let mut r = Registry::new();
    for t in [LEAF, PASS, FAN] {
        r.register(t).expect("distinct");
    }
    r
}

fn check(text: &str) -> Result<GraphSpec, GraphError> {
    GraphSpec::validate(&Volfile::parse(text, "g.vol").expect("parses"), &registry())
}

fn build(text: &str) -> Graph {
    Graph::from_str(text, "g.vol", &registry()).expect("builds")
}

fn check_err(text: &str) -> (usize, String) {
    let e = check(text).expect_err("must fail");
    (e.line, e.to_string())
}

const CHAIN: &str = "\
volume leaf
    type test/leaf
    option directory /srv/b1
end-volume

volume mid
    type test/pass
    option thread-count 4
    subvolumes leaf
end-volume

volume top
    type test/pass
    subvolumes mid
end-volume
";

#[test]
fn unknown_type_lists_known_and_reports_first() {
    let (line, msg) = check_err(
        "volume a\n type test/leaf\nend-volume\nvolume b\n type test/nope\n subvolumes a\nend-volume\n\
             volume c\n type test/other\n subvolumes b\nend-volume\n",
    );
    assert_eq!(line, 5);
    assert_eq!(msg, "g.vol:5: volume 'b': unknown type 'test/nope' (known types: test/fan, test/leaf, test/pass)");
}

#[test]
fn unknown_option_lists_known() {
    let (line, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-cont 4"));
    assert_eq!(line, 8);
    assert!(msg.starts_with("g.vol:8: volume 'mid' (test/pass): unknown option 'thread-cont'"), "{msg}");
    assert!(msg.contains("thread-count") && msg.contains("mode"), "{msg}");
}

#[test]
fn bad_value_names_option_value_and_form() {
    let (line, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-count many"));
    assert_eq!(line, 8);
    assert!(msg.contains("'thread-count'") && msg.contains("'many'") && msg.contains("an integer"), "{msg}");
    let (_, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-count 100"));
    assert!(msg.contains("out of range"), "{msg}");
    let (line, msg) = check_err(&CHAIN.replace("/srv/b1", "relative/dir"));
    assert_eq!(line, 3);
    assert!(msg.contains("'relative/dir'") && msg.contains("absolute path"), "{msg}");
}

#[test]
fn cycle_names_path_and_line() {
    let (line, msg) = check_err(
        "volume top\n type test/pass\n subvolumes a\nend-volume\n\
             volume a\n type test/pass\n subvolumes b\nend-volume\n\
             volume b\n type test/pass\n subvolumes a\nend-volume\n",
    );
    assert_eq!(line, 11);
    assert_eq!(msg, "g.vol:11: cycle in subvolumes: a -> b -> a");
    let (line, msg) = check_err("volume a\n type test/pass\n subvolumes a\nend-volume\n");
    assert_eq!(line, 3);
    assert!(msg.ends_with("cycle in subvolumes: a -> a"), "{msg}");
}

#[test]
fn two_tops_names_both() {
    let (line, msg) = check_err(&format!("{CHAIN}\nvolume other\n type test/leaf\nend-volume\n"));
    assert_eq!(line, 17);
    assert!(msg.contains("found 2: 'top', 'other'"), "{msg}");
}

#[test]
fn undefined_and_repeated_subvolume() {
    let (line, msg) = check_err(&CHAIN.replace("subvolumes mid", "subvolumes midd"));
    assert_eq!(line, 14);
    assert!(msg.contains("volume 'top': subvolume 'midd' is not defined"), "{msg}");
    let (line, msg) =
        check_err("volume l\n type test/leaf\nend-volume\nvolume f\n type test/fan\n subvolumes l l\nend-volume\n");
    assert_eq!(line, 6);
    assert!(msg.contains("subvolume 'l' is listed twice"), "{msg}");
}

#[test]
fn child_count() {
    let (line, msg) = check_err("volume p\n type test/pass\nend-volume\n");
    assert_eq!(line, 1);
    assert_eq!(msg, "g.vol:1: volume 'p' (test/pass): expected exactly 1 subvolume, found 0");
    let (line, msg) =
        check_err("volume l\n type test/leaf\nend-volume\nvolume f\n type test/fan\n subvolumes l\nend-volume\n");
    assert_eq!(line, 6);
    assert!(msg.ends_with("expected at least 2 subvolumes, found 1"), "{msg}");
    let (_, msg) =
        check_err("volume l\n type test/leaf\nend-volume\nvolume m\n type test/leaf\n subvolumes l\nend-volume\n");
    assert!(msg.ends_with("(test/leaf): expected no subvolumes, found 1"), "{msg}");
}

#[test]
fn describe_shows_tree_and_defaults() {
    let spec = check(CHAIN).expect("valid");
    assert_eq!(spec.top_name(), "top");
    let tree = spec.describe();
    let expected = "\
top (test/pass)
│   mode safe (default)
│   thread-count 16 (default)
└── mid (test/pass)
    │   mode safe (default)
    │   thread-count 4
    └── leaf (test/leaf)
            directory /srv/b1
            fail off (default)
            up on (default)
";
    assert_eq!(tree, expected);
}

#[test]
fn validate_runs_no_constructor() {
    take_log();
    check(CHAIN).expect("valid");
    assert!(take_log().is_empty());
}

#[tokio::test]
async fn child_up_reaches_top_and_child_down_follows() {
    take_log();
    let g = build(CHAIN);
    assert_eq!(take_log(), ["leaf:build", "mid:build", "top:build"]);
    assert_eq!(g.state(), TopState::Down);
    assert_eq!(g.top().name.as_ref(), "top");
    g.activate();
    g.wait_up(Duration::from_secs(5)).await.expect("up");
    assert_eq!(g.state(), TopState::Up);
    let log = take_log();
    // ParentUp goes top-down; the leaf's ChildUp climbs through mid to top.
    assert_eq!(
        log,
        [
            "top:ParentUp:Graph",
            "mid:ParentUp:Graph",
            "leaf:ParentUp:Graph",
            "mid:ChildUp:Child(0)",
            "top:ChildUp:Child(0)",
        ]
    );
    g.shutdown();
    assert_eq!(g.state(), TopState::Down);
    let log = take_log();
    assert!(log.contains(&"top:ChildDown:Child(0)".to_string()), "{log:?}");
    // A fop at the top goes down the chain to the leaf.
    let r = g.top().call(CallCtx::root("t"), Request::new(Fop::Stat { loc: Loc::root() })).await;
    assert_eq!(r.err(), Some(Errno::ENOSYS));
}

#[tokio::test]
async fn wait_up_times_out_when_no_leaf_says_up() {
    let g = build(&CHAIN.replace("option directory /srv/b1", "option up off"));
    g.activate();
    let e = g.wait_up(Duration::from_millis(20)).await.expect_err("never up");
    assert!(e.to_string().contains("'top'"), "{e}");
}

#[test]
fn fini_exactly_once_top_down() {
    take_log();
    let g = build(CHAIN);
    take_log();
    g.shutdown();
    g.shutdown();
    drop(g);
    let finis: Vec<String> = take_log().into_iter().filter(|l| l.ends_with(":fini")).collect();
    assert_eq!(finis, ["top:fini", "mid:fini", "leaf:fini"]);

    let g = build(CHAIN);
    take_log();
    drop(g);
    let finis = take_log().into_iter().filter(|l| l.ends_with(":fini")).count();
    assert_eq!(finis, 3);
}

const DIAMOND: &str = "\
volume shared
    type test/leaf
end-volume
volume a
    type test/pass
    subvolumes shared
end-volume
volume b
    type test/pass
    subvolumes shared
end-volume
volume top
    type test/fan
    subvolumes a b
end-volume
";

#[test]
fn shared_child_notifies_every_parent_and_is_built_once() {
    take_log();
    let g = build(DIAMOND);
    let builds = take_log();
    assert_eq!(builds.iter().filter(|l| *l == "shared:build").count(), 1);
    g.activate();
    let log = take_log();
    for l in ["a:ChildUp:Child(0)", "b:ChildUp:Child(0)", "top:ChildUp:Child(0)", "top:ChildUp:Child(1)"] {
        assert!(log.contains(&l.to_string()), "{l} missing in {log:?}");
    }
    assert_eq!(g.state(), TopState::Up);
    assert!(g.describe().contains("shared (test/leaf) (shown above)"), "{}", g.describe());
    let dump = g.dump();
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(dump[..2], [pair("top.type", "test/fan"), pair("top.children", "a,b")]);
    assert_eq!(dump.len(), 8);
    assert!(dump.contains(&pair("shared.type", "test/leaf")));
}

#[tokio::test]
async fn every_node_is_timed_and_self_times_add_up_to_the_top() {
    let g = build(CHAIN);
    for _ in 0..4 {
        let r = g.top().call(CallCtx::root("t"), Fop::Stat { loc: Loc::root() }.into()).await;
        assert_eq!(r.err(), Some(Errno::ENOSYS), "the test leaf answers ENOSYS");
    }
    let p = g.profile(false);
    assert_eq!(p.top, "top");
    assert_eq!(p.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["top", "mid", "leaf"], "top first");
    let stat: Vec<_> = p.nodes.iter().map(|n| *n.fop(xlfs_sdk::FopKind::Stat).expect("counted")).collect();
    assert!(stat.iter().all(|f| f.count == 4), "{stat:?}");
    assert!(stat.iter().all(|f| f.self_ns <= f.total_ns), "{stat:?}");
    // Exact in clock ticks; converting each counter to nanoseconds
    // truncates, so a sum of k of them may be k ns off.
    assert!(stat.iter().map(|f| f.self_ns).sum::<u64>().abs_diff(stat[0].total_ns) <= 3, "{stat:?}");
    assert!(
        (stat[0].total_ns - stat[0].self_ns).abs_diff(stat[1].total_ns) <= 2,
        "top waited exactly for mid: {stat:?}"
    );
    // What protocol/server asks through its sink: the same counters.
    let via_sink = g.nodes[0].sink.graph_profile(true).expect("linked");
    assert_eq!(via_sink.nodes, p.nodes);
    assert!(g.profile(false).nodes.iter().all(|n| n.fops.is_empty()), "reset");
    // The graph's own calls of a node (nodes_of_type) are not timed.
    let (leaf, _) = g.nodes_of_type("test/leaf").remove(0);
    let _ = leaf.call(CallCtx::root("t"), Fop::Stat { loc: Loc::root() }.into()).await;
    assert!(g.profile(false).nodes.iter().all(|n| n.fops.is_empty()), "untimed");
}

#[test]
fn broadcast_reaches_every_node() {
    let g = build(DIAMOND);
    take_log();
    g.broadcast(Event::ClientGone { client_id: "c1".into() });
    let log = take_log();
    for n in ["top", "a", "b", "shared"] {
        let line = format!("{n}:ClientGone {{ client_id: \"c1\" }}:Graph");
        assert_eq!(log.iter().filter(|l| **l == line).count(), 1, "{n}: {log:?}");
    }
}

#[test]
fn a_node_can_broadcast_through_its_sink() {
    let g = build(DIAMOND);
    take_log();
    let leaf = g.spec().nodes.iter().position(|n| &*n.name == "shared").expect("shared node");
    g.nodes[leaf].sink.broadcast(Event::ClientGone { client_id: "c2".into() });
    let log = take_log();
    for n in ["top", "a", "b", "shared"] {
        let line = format!("{n}:ClientGone {{ client_id: \"c2\" }}:Graph");
        assert_eq!(log.iter().filter(|l| **l == line).count(), 1, "{n}: {log:?}");
    }
    let sink = g.nodes[leaf].sink.clone();
    drop(g);
    sink.broadcast(Event::ClientGone { client_id: "c3".into() });
    assert!(take_log().iter().all(|l| !l.contains("c3")), "a dropped graph hears nothing");
}

#[test]
fn init_error_names_volume_and_type_and_finalizes_built_nodes() {
    let text = "\
volume ok
    type test/leaf
end-volume
volume b1-posix
    type test/leaf
    option fail on
end-volume
volume top
    type test/fan
    subvolumes ok b1-posix
end-volume
";
    take_log();
    let e = Graph::build(&Volfile::parse(text, "g.vol").expect("parses"), &registry()).expect_err("fails");
    assert_eq!(e.to_string(), "g.vol:4: volume 'b1-posix' (test/leaf): option 'directory' is required");
    assert_eq!(take_log(), ["ok:build", "ok:fini"]);
}

#[test]
fn gluster_brick_volfile_stops_at_first_unknown_type() {
    // The built-in registry knows storage/posix etc.; an unknown type in a
    // real GlusterFS brick volfile is reported with the built-in list.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/gluster-volfiles/replica3-brick.vol");
    let v = Volfile::load(&path).expect("fixture parses");
    let e = GraphSpec::validate(&v, &Registry::builtin()).expect_err("features/trash is not built in");
    assert_eq!(e.line, 10);
    assert!(e.to_string().contains("unknown type 'features/trash'") && e.to_string().contains("storage/posix"), "{e}");
}

#[test]
fn diff_tells_options_from_structure() {
    let old = check(CHAIN).expect("valid");
    assert_eq!(old.diff(&check(CHAIN).expect("valid")), GraphDiff::Same);
    let GraphDiff::Options(c) = old.diff(&check(&CHAIN.replace("thread-count 4", "thread-count 8")).expect("valid"))
    else {
        panic!("options only")
    };
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].to_string(), "volume 'mid' (test/pass): thread-count 4 -> 8");
    let more = CHAIN.replace("subvolumes mid\n", "subvolumes extra\n")
        + "volume extra\n type test/pass\n subvolumes mid\nend-volume\n";
    let GraphDiff::Structure(why) = old.diff(&check(&more).expect("valid")) else { panic!("structure") };
    assert_eq!(why, "volumes added 'extra'");
    let fewer = "volume leaf\n type test/leaf\nend-volume\nvolume top\n type test/pass\n subvolumes leaf\nend-volume\n";
    let GraphDiff::Structure(why) = old.diff(&check(fewer).expect("valid")) else { panic!("structure") };
    assert_eq!(why, "volumes removed 'mid'");
}

#[test]
fn a_changed_module_file_is_a_structural_change() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("module.bin");
    std::fs::write(&file, b"one").expect("write");
    let with_module =
        |f: &std::path::Path| CHAIN.replace("option directory /srv/b1", &format!("option module wasm:{}", f.display()));
    let text = with_module(&file);
    let old = check(&text).expect("valid");
    assert_eq!(old.files(), vec![file.clone()]);
    assert_eq!(old.diff(&check(&text).expect("valid")), GraphDiff::Same);
    std::fs::write(&file, b"two").expect("rewrite in place");
    let GraphDiff::Structure(why) = old.diff(&check(&text).expect("valid")) else { panic!("structure") };
    assert_eq!(why, "volume 'leaf': the file option 'module' names changed");
    // Naming another file is an option change.
    let other = tmp.path().join("other.bin");
    std::fs::write(&other, b"three").expect("write");
    let GraphDiff::Options(c) = old.diff(&check(&with_module(&other)).expect("valid")) else { panic!("options") };
    assert_eq!(c[0].values[0].key, "module");
    // A path option is not a module: the file it names is neither watched nor hashed.
    let dir = check(&CHAIN.replace("/srv/b1", &file.display().to_string())).expect("valid");
    assert!(dir.files().is_empty(), "{:?}", dir.files());
}

#[test]
fn a_plugin_module_hashes_as_what_its_options_were_checked_against() {
    // The file was rewritten after the module's declarations were read
    // (during a reload's validation): the spec must name the content it
    // validated, so that the next reload sees the change.
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("plug.wasm");
    std::fs::write(&file, b"the new build").expect("write");
    let loaded = crate::plugin::remember_decls(crate::plugin::Kind::Wasm, b"the old build", &[]);
    let module = format!("{}", file.display());
    let options = Options::resolve(loaded, [("module", module.as_str())]).expect("valid");
    let digest = |b: &[u8]| -> [u8; 32] { Sha256::digest(b).into() };
    assert_eq!(files_hash(loaded, &options), vec![("module".to_string(), digest(b"the old build"))]);
    // Declarations that come from no loaded module: the file is read.
    let generic = crate::plugin::WASM_TYPE.options;
    assert_eq!(files_hash(generic, &options), vec![("module".to_string(), digest(b"the new build"))]);
}

#[test]
fn reconfigure_is_all_or_nothing() {
    let g = build(CHAIN);
    take_log();
    let before = g.describe();
    // mid takes 8, then top refuses 13: mid gets 4 back.
    let bad = CHAIN
        .replace("thread-count 4", "thread-count 8")
        .replace("subvolumes mid", "option thread-count 13\n subvolumes mid");
    let e = g.reconfigure(check(&bad).expect("valid")).expect_err("refused");
    assert_eq!(e.to_string(), "volume 'top' (test/pass): thread-count 16 -> 13: refused: 13 is unlucky");
    assert_eq!(take_log(), ["mid:reconfigure:8", "mid:reconfigure:4"]);
    assert_eq!(g.describe(), before, "the running spec is unchanged");
    // A leaf that cannot reconfigure says so.
    let e = g.reconfigure(check(&CHAIN.replace("/srv/b1", "/srv/b2")).expect("valid")).expect_err("unsupported");
    assert!(matches!(e, ReconfigureFailure::Unsupported { .. }), "{e}");
    // Structure is refused; a good change applies and shows.
    assert!(matches!(g.reconfigure(check(DIAMOND).expect("valid")), Err(ReconfigureFailure::Structure(_))));
    let changes =
        g.reconfigure(check(&CHAIN.replace("thread-count 4", "thread-count 9")).expect("valid")).expect("applies");
    assert_eq!(changes.len(), 1);
    assert_eq!(take_log(), ["mid:reconfigure:9"]);
    assert!(g.describe().contains("thread-count 9"), "{}", g.describe());
    assert!(
        g.reconfigure(check(&CHAIN.replace("thread-count 4", "thread-count 9")).expect("valid"))
            .expect("same")
            .is_empty()
    );
}

const DYN_OPTS: &[OptionDecl] =
    &[OptionDecl::new("module", OptType::Module), OptionDecl::new("depth", OptType::Int).range(1.0, 3.0)];

/// A dynamic type: its volume's `module` option picks the child count.
fn specialize_dyn(given: &[(&str, &str)]) -> Result<XlatorType, String> {
    match given.iter().find(|(k, _)| *k == "module").map(|(_, v)| *v) {
        None => Err("option 'module' is required".into()),
        Some("/leaf") => {
            Ok(XlatorType { name: "test/dyn", options: DYN_OPTS, min_children: 0, max_children: 0, ..LEAF })
        }
        Some(other) => Err(format!("{other}: no such module")),
    }
}

#[test]
fn dynamic_types_validate_against_their_specialized_type() {
    let mut r = registry();
    let generic = XlatorType { name: "test/dyn", options: &DYN_OPTS[..1], ..LEAF };
    r.register_dynamic(generic, specialize_dyn).expect("new type");
    let check = |text: &str| GraphSpec::validate(&Volfile::parse(text, "d.vol").expect("parses"), &r);
    let spec = check("volume d\n type test/dyn\n option module /leaf\n option depth 2\nend-volume\n").expect("valid");
    assert!(spec.describe().contains("depth 2"), "{}", spec.describe());
    // The specialized declarations are the ones checked.
    let e = check("volume d\n type test/dyn\n option module /leaf\n option depth 9\nend-volume\n").expect_err("range");
    assert_eq!(e.line, 4);
    assert!(e.to_string().contains("out of range"), "{e}");
    // The specializer's refusal points at `option module`, or the type.
    let e = check("volume d\n type test/dyn\n\n option module /other\nend-volume\n").expect_err("refused");
    assert_eq!(e.to_string(), "d.vol:4: volume 'd' (test/dyn): /other: no such module");
    let e = check("volume d\n type test/dyn\nend-volume\n").expect_err("no module");
    assert_eq!(e.to_string(), "d.vol:2: volume 'd' (test/dyn): option 'module' is required");
    // So are its child counts.
    let e = check("volume l\n type test/leaf\nend-volume\nvolume d\n type test/dyn\n option module /leaf\n subvolumes l\nend-volume\n")
        .expect_err("a leaf");
    assert!(e.to_string().ends_with("expected no subvolumes, found 1"), "{e}");
}
