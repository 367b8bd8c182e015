//! Every translator in the built-in registry has a criterion bench: its
//! type name appears in a bench under `benches/benches/` (a bench adding a
//! translator names its type in the graph it builds).

#[test]
fn every_registered_translator_has_a_bench() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches");
    let mut text = String::new();
    for e in std::fs::read_dir(&dir).expect("benches/benches") {
        let path = e.expect("entry").path();
        if path.extension().is_some_and(|x| x == "rs") {
            text += &std::fs::read_to_string(&path).expect("read a bench");
        }
    }
    let missing: Vec<&str> =
        xlfs_xlators::builtin_types().iter().map(|t| t.name).filter(|name| !text.contains(name)).collect();
    assert!(missing.is_empty(), "translators without a criterion bench in benches/benches/: {missing:?}");
}
