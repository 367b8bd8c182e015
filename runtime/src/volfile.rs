//! The volfile parser: reads GlusterFS volfile syntax into a [`Volfile`], a
//! list of volume declarations in file order, each remembering the lines it
//! came from so that later checks (see [`graph`](crate::graph)) can point at
//! them.
//!
//! ```text
//! # a comment
//! volume b1-posix
//!     type storage/posix
//!     option directory /srv/b1
//! end-volume
//!
//! volume b1-locks
//!     type features/locks
//!     subvolumes b1-posix
//! end-volume
//! ```
//!
//! An option's value is the rest of its line, trimmed (it may contain
//! spaces). A `#` at the start of a line or after whitespace starts a comment
//! that runs to the end of the line, as in GlusterFS's lexer, where `#`
//! inside a word is part of the word. This parser only checks the syntax;
//! whether types, subvolumes and options make sense is the graph's job.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// A parsed volfile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volfile {
    /// Where the text came from (the path as given, or a label), used in
    /// every error message.
    pub origin: String,
    /// The volumes, in file order.
    pub volumes: Vec<VolumeDecl>,
}

/// One `volume ... end-volume` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeDecl {
    /// The volume name.
    pub name: String,
    /// The line of `volume NAME`.
    pub line: usize,
    /// The translator type (`storage/posix`).
    pub type_name: String,
    /// The line of `type`.
    pub type_line: usize,
    /// The options, in file order.
    pub options: Vec<OptionLine>,
    /// The subvolumes, in order.
    pub subvolumes: Vec<SubvolRef>,
}

/// One `option KEY VALUE` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionLine {
    /// The key.
    pub key: String,
    /// The value: the rest of the line, trimmed.
    pub value: String,
    /// The line number.
    pub line: usize,
}

/// A name on a `subvolumes` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubvolRef {
    /// The named volume.
    pub name: String,
    /// The line number.
    pub line: usize,
}

/// Why a volfile could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VolfileError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The path.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not a valid volfile.
    #[error("{file}:{line}: {kind}")]
    Syntax {
        /// The file (the volfile's origin).
        file: String,
        /// The 1-based line the problem is on.
        line: usize,
        /// What is wrong.
        kind: SyntaxError,
    },
}

/// What is wrong at a line of a volfile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    /// Something other than what the grammar allows here.
    #[error("expected {expected}, found {found}")]
    Unexpected {
        /// What would have been valid.
        expected: String,
        /// What the line holds (quoted), or `end of line` / `end of file`.
        found: String,
    },
    /// The file ends inside a volume.
    #[error("expected 'end-volume' for volume '{volume}' (started at line {start}), found end of file")]
    MissingEnd {
        /// The open volume.
        volume: String,
        /// Its `volume` line.
        start: usize,
    },
    /// A second volume with the same name.
    #[error("duplicate volume name '{name}': expected a new name, found one already defined at line {first}")]
    DuplicateVolume {
        /// The name.
        name: String,
        /// The first definition's line.
        first: usize,
    },
    /// A second `type` line in one volume.
    #[error("volume '{volume}': expected one 'type', found a second one ('{found}'; '{first}' at line {first_line})")]
    DuplicateType {
        /// The volume.
        volume: String,
        /// The first type.
        first: String,
        /// Its line.
        first_line: usize,
        /// The second type.
        found: String,
    },
    /// `end-volume` without a `type` before it.
    #[error("volume '{volume}' (line {start}): expected a 'type' line, found 'end-volume' without one")]
    MissingType {
        /// The volume.
        volume: String,
        /// Its `volume` line.
        start: usize,
    },
    /// `option KEY` with no value.
    #[error("volume '{volume}': expected a value after option '{key}', found end of line")]
    OptionWithoutValue {
        /// The volume.
        volume: String,
        /// The key.
        key: String,
    },
    /// The same option key twice in one volume.
    #[error("volume '{volume}': duplicate option '{key}' (first at line {first}): expected each option once")]
    DuplicateOption {
        /// The volume.
        volume: String,
        /// The key.
        key: String,
        /// The first occurrence's line.
        first: usize,
    },
    /// A second `subvolumes` line in one volume.
    #[error("volume '{volume}': expected one 'subvolumes' line, found a second one (first at line {first})")]
    DuplicateSubvolumes {
        /// The volume.
        volume: String,
        /// The first `subvolumes` line.
        first: usize,
    },
}

/// A word for error messages: quoted, or `end of line`.
fn found(word: Option<&str>) -> String {
    word.map_or_else(|| "end of line".to_string(), |w| format!("'{w}'"))
}

/// Removes a comment: a `#` at the start or after whitespace.
fn strip_comment(line: &str) -> &str {
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        if c == '#' && prev_space {
            return &line[..i];
        }
        prev_space = c.is_whitespace();
    }
    line
}

/// The volume being read, with the line of its `subvolumes` (if seen).
struct Open {
    decl: VolumeDecl,
    subvolumes_line: Option<usize>,
}

impl Volfile {
    /// Reads and parses the file at `path`; errors name it as given.
    pub fn load(path: impl AsRef<Path>) -> Result<Volfile, VolfileError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Volfile::parse(&text, file),
            Err(source) => Err(VolfileError::Io { file, source }),
        }
    }

    /// Parses volfile text; `origin` names it in errors.
    pub fn parse(text: &str, origin: impl Into<String>) -> Result<Volfile, VolfileError> {
        let origin = origin.into();
        let err = |line: usize, kind: SyntaxError| VolfileError::Syntax { file: origin.clone(), line, kind };
        let unexpected = |line: usize, expected: &str, word: Option<&str>| {
            err(line, SyntaxError::Unexpected { expected: expected.to_string(), found: found(word) })
        };

        let mut volumes: Vec<VolumeDecl> = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut open: Option<Open> = None;
        let mut last_line = 0;

        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            last_line = line;
            let content = strip_comment(raw).trim();
            let mut words = content.split_whitespace();
            let Some(keyword) = words.next() else { continue };
            // Everything after the keyword, trimmed (an option's key and value).
            let rest = content[keyword.len()..].trim();

            let Some(cur) = open.as_mut() else {
                if keyword != "volume" {
                    return Err(unexpected(line, "'volume'", Some(keyword)));
                }
                let name = words.next().ok_or_else(|| unexpected(line, "a volume name after 'volume'", None))?;
                if let Some(extra) = words.next() {
                    return Err(unexpected(line, "end of line after the volume name", Some(extra)));
                }
                if let Some(&first) = names.get(name) {
                    return Err(err(line, SyntaxError::DuplicateVolume { name: name.to_string(), first }));
                }
                names.insert(name.to_string(), line);
                open = Some(Open {
                    decl: VolumeDecl {
                        name: name.to_string(),
                        line,
                        type_name: String::new(),
                        type_line: 0,
                        options: Vec::new(),
                        subvolumes: Vec::new(),
                    },
                    subvolumes_line: None,
                });
                continue;
            };
            let volume = cur.decl.name.clone();

            match keyword {
                "type" => {
                    let ty = words.next().ok_or_else(|| unexpected(line, "a type name after 'type'", None))?;
                    if let Some(extra) = words.next() {
                        return Err(unexpected(line, "end of line after the type name", Some(extra)));
                    }
                    if cur.decl.type_line != 0 {
                        return Err(err(
                            line,
                            SyntaxError::DuplicateType {
                                volume,
                                first: cur.decl.type_name.clone(),
                                first_line: cur.decl.type_line,
                                found: ty.to_string(),
                            },
                        ));
                    }
                    cur.decl.type_name = ty.to_string();
                    cur.decl.type_line = line;
                }
                "option" => {
                    let key = words.next().ok_or_else(|| unexpected(line, "an option name after 'option'", None))?;
                    let value = rest[key.len()..].trim();
                    if value.is_empty() {
                        return Err(err(line, SyntaxError::OptionWithoutValue { volume, key: key.to_string() }));
                    }
                    if let Some(first) = cur.decl.options.iter().find(|o| o.key == key) {
                        let first = first.line;
                        return Err(err(line, SyntaxError::DuplicateOption { volume, key: key.to_string(), first }));
                    }
                    cur.decl.options.push(OptionLine { key: key.to_string(), value: value.to_string(), line });
                }
                "subvolumes" => {
                    if let Some(first) = cur.subvolumes_line {
                        return Err(err(line, SyntaxError::DuplicateSubvolumes { volume, first }));
                    }
                    let subs: Vec<SubvolRef> = words.map(|w| SubvolRef { name: w.to_string(), line }).collect();
                    if subs.is_empty() {
                        return Err(unexpected(line, "at least one volume name after 'subvolumes'", None));
                    }
                    cur.subvolumes_line = Some(line);
                    cur.decl.subvolumes = subs;
                }
                "end-volume" => {
                    if let Some(extra) = words.next() {
                        return Err(unexpected(line, "end of line after 'end-volume'", Some(extra)));
                    }
                    if cur.decl.type_line == 0 {
                        return Err(err(line, SyntaxError::MissingType { volume, start: cur.decl.line }));
                    }
                    if let Some(done) = open.take() {
                        volumes.push(done.decl);
                    }
                }
                other => {
                    let expected = if other == "volume" {
                        format!("'end-volume' to close volume '{volume}' (line {})", cur.decl.line)
                    } else {
                        "'subvolumes', 'option', 'type' or 'end-volume'".to_string()
                    };
                    return Err(unexpected(line, &expected, Some(other)));
                }
            }
        }

        if let Some(cur) = open {
            return Err(err(last_line.max(1), SyntaxError::MissingEnd { volume: cur.decl.name, start: cur.decl.line }));
        }
        if volumes.is_empty() {
            return Err(err(
                last_line.max(1),
                SyntaxError::Unexpected { expected: "at least one 'volume'".into(), found: "end of file".into() },
            ));
        }
        Ok(Volfile { origin, volumes })
    }

    /// The volume called `name`.
    pub fn volume(&self, name: &str) -> Option<&VolumeDecl> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

impl fmt::Display for Volfile {
    /// Writes the volfile back in canonical volfile syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.volumes.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "volume {}", v.name)?;
            writeln!(f, "    type {}", v.type_name)?;
            for o in &v.options {
                writeln!(f, "    option {} {}", o.key, o.value)?;
            }
            if !v.subvolumes.is_empty() {
                let names: Vec<&str> = v.subvolumes.iter().map(|s| s.name.as_str()).collect();
                writeln!(f, "    subvolumes {}", names.join(" "))?;
            }
            writeln!(f, "end-volume")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Volfile, VolfileError> {
        Volfile::parse(text, "test.vol")
    }

    fn syntax_err(text: &str) -> (usize, SyntaxError, String) {
        match parse(text).expect_err("must fail") {
            e @ VolfileError::Syntax { .. } => {
                let msg = e.to_string();
                let VolfileError::Syntax { line, kind, .. } = e else { unreachable!() };
                (line, kind, msg)
            }
            other => panic!("not a syntax error: {other}"),
        }
    }

    const GOOD: &str = "\
# leading comment

volume b1-posix
    type storage/posix   # trailing comment
    option directory /srv/b1
    option volume-id  a b  c
end-volume
   volume b1-locks
type features/locks
  subvolumes b1-posix
    option x#y on
end-volume
";

    #[test]
    fn parses_volumes_options_subvolumes_and_lines() {
        let v = parse(GOOD).expect("valid");
        assert_eq!(v.origin, "test.vol");
        assert_eq!(v.volumes.len(), 2);
        let p = &v.volumes[0];
        assert_eq!((p.name.as_str(), p.line, p.type_name.as_str(), p.type_line), ("b1-posix", 3, "storage/posix", 4));
        assert_eq!(p.options[0], OptionLine { key: "directory".into(), value: "/srv/b1".into(), line: 5 });
        assert_eq!(p.options[1].value, "a b  c");
        let l = &v.volumes[1];
        assert_eq!((l.line, l.type_line), (8, 9));
        assert_eq!(l.subvolumes, vec![SubvolRef { name: "b1-posix".into(), line: 10 }]);
        assert_eq!(l.options[0].key, "x#y");
        assert!(v.volume("b1-locks").is_some() && v.volume("nope").is_none());
    }

    #[test]
    fn display_round_trips() {
        let v = parse(GOOD).expect("valid");
        let again = Volfile::parse(&v.to_string(), "test.vol").expect("reparses");
        let strip = |v: &Volfile| -> Vec<VolumeDecl> {
            let mut vols = v.volumes.clone();
            for d in &mut vols {
                (d.line, d.type_line) = (0, 0);
                d.options.iter_mut().for_each(|o| o.line = 0);
                d.subvolumes.iter_mut().for_each(|s| s.line = 0);
            }
            vols
        };
        assert_eq!(strip(&v), strip(&again));
    }

    #[test]
    fn typo_keyword_names_expected_and_found() {
        let text = "volume a\n type t\n subvolume b\nend-volume\n";
        let (line, _, msg) = syntax_err(text);
        assert_eq!(line, 3);
        assert_eq!(msg, "test.vol:3: expected 'subvolumes', 'option', 'type' or 'end-volume', found 'subvolume'");
    }

    #[test]
    fn missing_end_volume_at_eof_names_volume_and_start() {
        let (line, kind, msg) = syntax_err("volume a\n type t\n\nvolume b\n type t\n option k v\n");
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains("'end-volume' to close volume 'a' (line 1)") && msg.contains("found 'volume'"), "{msg}");
        assert!(matches!(kind, SyntaxError::Unexpected { .. }));

        let (line, kind, msg) = syntax_err("volume a\n type t\nend-volume\nvolume b\n type t\n option k v\n");
        assert_eq!(line, 6);
        assert_eq!(kind, SyntaxError::MissingEnd { volume: "b".into(), start: 4 });
        assert!(msg.starts_with("test.vol:6: expected 'end-volume' for volume 'b' (started at line 4)"), "{msg}");
    }

    #[test]
    fn duplicate_volume_name() {
        let (line, kind, msg) = syntax_err("volume a\n type t\nend-volume\nvolume a\n type t\nend-volume\n");
        assert_eq!(line, 4);
        assert_eq!(kind, SyntaxError::DuplicateVolume { name: "a".into(), first: 1 });
        assert!(msg.contains("'a'") && msg.contains("line 1"), "{msg}");
    }

    #[test]
    fn duplicate_type() {
        let (line, kind, _) = syntax_err("volume a\n type t\n type u\nend-volume\n");
        assert_eq!(line, 3);
        assert!(
            matches!(kind, SyntaxError::DuplicateType { ref first, first_line: 2, ref found, .. } if first == "t" && found == "u")
        );
    }

    #[test]
    fn missing_type() {
        let (line, kind, msg) = syntax_err("volume a\n option k v\nend-volume\n");
        assert_eq!(line, 3);
        assert_eq!(kind, SyntaxError::MissingType { volume: "a".into(), start: 1 });
        assert!(msg.contains("expected a 'type' line"), "{msg}");
    }

    #[test]
    fn option_without_value_or_key() {
        let (line, kind, msg) = syntax_err("volume a\n type t\n option lonely   # comment\nend-volume\n");
        assert_eq!(line, 3);
        assert_eq!(kind, SyntaxError::OptionWithoutValue { volume: "a".into(), key: "lonely".into() });
        assert!(msg.contains("expected a value after option 'lonely', found end of line"), "{msg}");
        let (line, _, msg) = syntax_err("volume a\n type t\n option\nend-volume\n");
        assert_eq!(line, 3);
        assert!(msg.contains("expected an option name after 'option', found end of line"), "{msg}");
    }

    #[test]
    fn duplicate_option_and_subvolumes() {
        let (line, kind, _) = syntax_err("volume a\n type t\n option k 1\n option k 2\nend-volume\n");
        assert_eq!(line, 4);
        assert_eq!(kind, SyntaxError::DuplicateOption { volume: "a".into(), key: "k".into(), first: 3 });
        let (line, kind, _) = syntax_err("volume a\n type t\n subvolumes b\n subvolumes c\nend-volume\n");
        assert_eq!(line, 4);
        assert_eq!(kind, SyntaxError::DuplicateSubvolumes { volume: "a".into(), first: 3 });
        let (line, _, msg) = syntax_err("volume a\n type t\n subvolumes\nend-volume\n");
        assert_eq!(line, 3);
        assert!(msg.contains("at least one volume name after 'subvolumes'"), "{msg}");
    }

    #[test]
    fn stray_keyword_outside_volume() {
        let (line, _, msg) = syntax_err("volume a\n type t\nend-volume\n option k v\n");
        assert_eq!(line, 4);
        assert_eq!(msg, "test.vol:4: expected 'volume', found 'option'");
        let (line, _, msg) = syntax_err("end-volume\n");
        assert_eq!(line, 1);
        assert!(msg.ends_with("expected 'volume', found 'end-volume'"), "{msg}");
    }

    #[test]
    fn extra_words_and_missing_names() {
        for (text, line, needle) in [
            ("volume\n", 1, "expected a volume name after 'volume', found end of line"),
            ("volume a b\n", 1, "found 'b'"),
            ("volume a\n type\n", 2, "expected a type name after 'type'"),
            ("volume a\n type t u\n", 2, "found 'u'"),
            ("volume a\n type t\nend-volume x\n", 3, "found 'x'"),
        ] {
            let (l, _, msg) = syntax_err(text);
            assert_eq!(l, line, "{text:?}: {msg}");
            assert!(msg.contains(needle), "{text:?}: {msg}");
        }
    }

    #[test]
    fn empty_file_is_an_error() {
        let (_, _, msg) = syntax_err("# nothing\n\n");
        assert!(msg.contains("expected at least one 'volume', found end of file"), "{msg}");
    }

    #[test]
    fn missing_file_names_it() {
        let e = Volfile::load("/nonexistent/x.vol").expect_err("no file");
        assert!(e.to_string().starts_with("/nonexistent/x.vol: "), "{e}");
    }

    #[test]
    fn parses_every_gluster_fixture() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gluster-volfiles");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "vol") {
                let v = Volfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(!v.volumes.is_empty());
                for d in &v.volumes {
                    assert!(!d.type_name.is_empty() && d.type_line > d.line, "{}", d.name);
                }
                n += 1;
            }
        }
        assert!(n >= 3, "found {n} fixtures in {}", dir.display());
        let brick = Volfile::load(dir.join("replica3-brick.vol")).expect("brick");
        let server = brick.volume("rep3-server").expect("server");
        let allow = server.options.iter().find(|o| o.key == "auth.addr./srv/gb/b1.allow").expect("auth");
        assert_eq!(allow.value, "*");
        assert_eq!(server.subvolumes[0].name, "/srv/gb/b1");
    }
}
