//! Option declarations ([`OptionDecl`]) and the GlusterFS value forms they
//! accept: booleans as `on/off/yes/no/enable/disable/true/false/1/0`, sizes
//! as `64MB` or `1GB` (powers of 1024), times as `600s`, `5m`, `100ms`,
//! percentages as `10%`, enumerations case-insensitively.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The type of an option's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptType {
    /// on/off and synonyms.
    Bool,
    /// A signed integer.
    Int,
    /// A byte size with an optional KB/MB/GB/TB/PB suffix (1024-based).
    Size,
    /// A duration; a bare number is seconds.
    Time,
    /// A percentage, with or without `%`.
    Percent,
    /// Any string.
    Str,
    /// One of the listed words.
    Enum(&'static [&'static str]),
    /// A comma-separated list.
    List,
    /// An absolute path.
    Path,
    /// A module: a built-in name (`tolerant`), or the absolute path of a
    /// file, bare or after a `scheme:` (`wasm:/lib/ra.wasm`). The graph
    /// watches and hashes the files these options name (a module rebuilt
    /// in place is a change), and only these.
    Module,
}

impl OptType {
    /// The accepted form, for error messages.
    pub fn form(&self) -> String {
        match self {
            OptType::Bool => "a boolean (on/off, yes/no, enable/disable, true/false, 1/0)".into(),
            OptType::Int => "an integer".into(),
            OptType::Size => "a size (bytes, or with KB/MB/GB/TB/PB, e.g. 64MB)".into(),
            OptType::Time => "a time (seconds, or with ms/s/m/h/d, e.g. 600s)".into(),
            OptType::Percent => "a percentage (e.g. 10%)".into(),
            OptType::Str => "a string".into(),
            OptType::Enum(v) => format!("one of {}", v.join(", ")),
            OptType::List => "a comma-separated list".into(),
            OptType::Path => "an absolute path".into(),
            OptType::Module => "a built-in name, or an absolute path, bare or after 'wasm:' or 'dylib:'".into(),
        }
    }
}

/// One declared option of a translator type.
#[derive(Clone, Debug, PartialEq)]
pub struct OptionDecl {
    /// The option key; a `*` matches any run of characters, as in
    /// GlusterFS's `auth.addr.*.allow`.
    pub name: &'static str,
    /// The value type.
    pub ty: OptType,
    /// The default, in the volfile's textual form.
    pub default: Option<&'static str>,
    /// Inclusive bounds for numeric types (in bytes, seconds or percent).
    pub range: Option<(f64, f64)>,
    /// What the option does; shown by `xlfs volfile check` and docs.
    pub description: &'static str,
}

impl OptionDecl {
    /// A declaration with no default, range or description.
    pub const fn new(name: &'static str, ty: OptType) -> OptionDecl {
        OptionDecl { name, ty, default: None, range: None, description: "" }
    }
    /// Sets the default.
    pub const fn default(mut self, v: &'static str) -> OptionDecl {
        self.default = Some(v);
        self
    }
    /// Sets the inclusive range.
    pub const fn range(mut self, min: f64, max: f64) -> OptionDecl {
        self.range = Some((min, max));
        self
    }
    /// Sets the description.
    pub const fn desc(mut self, d: &'static str) -> OptionDecl {
        self.description = d;
        self
    }

    /// True if this declaration covers the key `key`.
    pub fn matches(&self, key: &str) -> bool {
        glob_match(self.name, key)
    }

    /// Parses and range-checks a value of this option.
    pub fn parse(&self, raw: &str) -> Result<OptValue, OptionError> {
        let bad =
            || OptionError::BadValue { name: self.name.to_string(), value: raw.to_string(), expected: self.ty.form() };
        let v = match self.ty {
            OptType::Bool => OptValue::Bool(parse_bool(raw).ok_or_else(bad)?),
            OptType::Int => OptValue::Int(raw.trim().parse().map_err(|_| bad())?),
            OptType::Size => OptValue::Size(parse_size(raw).ok_or_else(bad)?),
            OptType::Time => OptValue::Time(parse_time(raw).ok_or_else(bad)?),
            OptType::Percent => OptValue::Percent(parse_percent(raw).ok_or_else(bad)?),
            OptType::Str => OptValue::Str(raw.to_string()),
            OptType::Enum(allowed) => {
                let hit = allowed.iter().find(|a| a.eq_ignore_ascii_case(raw.trim())).ok_or_else(bad)?;
                OptValue::Str(hit.to_string())
            }
            OptType::List => {
                OptValue::List(raw.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            }
            OptType::Path => {
                if !raw.starts_with('/') {
                    return Err(bad());
                }
                OptValue::Path(PathBuf::from(raw))
            }
            OptType::Module => {
                let raw = raw.trim();
                if raw.is_empty() || (raw.contains('/') && module_file(raw).is_none()) {
                    return Err(bad());
                }
                OptValue::Str(raw.to_string())
            }
        };
        if let (Some((lo, hi)), Some(n)) = (self.range, v.as_f64())
            && (n < lo || n > hi)
        {
            return Err(OptionError::OutOfRange {
                name: self.name.to_string(),
                value: raw.to_string(),
                min: lo,
                max: hi,
            });
        }
        Ok(v)
    }
}

/// The declaration of `key` among `decls`: the one with that exact name,
/// else the first pattern (`auth.addr.*.allow`) that matches it.
pub fn declaration<'a>(decls: &'a [OptionDecl], key: &str) -> Option<&'a OptionDecl> {
    decls.iter().find(|d| d.name == key).or_else(|| decls.iter().find(|d| d.matches(key)))
}

/// The file a [`OptType::Module`] value names: the absolute path after an
/// optional `scheme:` (a scheme has no `/`); None for a built-in name.
pub fn module_file(value: &str) -> Option<&Path> {
    let path = value.split_once(':').filter(|(scheme, _)| !scheme.contains('/')).map_or(value, |(_, rest)| rest);
    path.starts_with('/').then(|| Path::new(path))
}

fn glob_match(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((pre, rest)) => {
            let Some(tail) = s.strip_prefix(pre) else { return false };
            if rest.is_empty() {
                return true;
            }
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob_match(rest, &tail[i..]))
        }
    }
}

/// A parsed option value.
#[derive(Clone, Debug, PartialEq)]
pub enum OptValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A size in bytes.
    Size(u64),
    /// A duration.
    Time(Duration),
    /// A percentage.
    Percent(f64),
    /// A string (also enum values, in their declared spelling).
    Str(String),
    /// A list.
    List(Vec<String>),
    /// A path.
    Path(PathBuf),
}

impl OptValue {
    fn as_f64(&self) -> Option<f64> {
        match self {
            OptValue::Int(i) => Some(*i as f64),
            OptValue::Size(s) => Some(*s as f64),
            OptValue::Time(t) => Some(t.as_secs_f64()),
            OptValue::Percent(p) => Some(*p),
            _ => None,
        }
    }
}

impl fmt::Display for OptValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptValue::Bool(b) => f.write_str(if *b { "on" } else { "off" }),
            OptValue::Int(i) => write!(f, "{i}"),
            OptValue::Size(s) => f.write_str(&format_size(*s)),
            OptValue::Time(t) => {
                if t.subsec_millis() != 0 {
                    write!(f, "{}ms", t.as_millis())
                } else {
                    write!(f, "{}s", t.as_secs())
                }
            }
            OptValue::Percent(p) => write!(f, "{p}%"),
            OptValue::Str(s) => f.write_str(s),
            OptValue::List(l) => f.write_str(&l.join(",")),
            OptValue::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

fn format_size(s: u64) -> String {
    const UNITS: [(&str, u64); 5] =
        [("PB", 1 << 50), ("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)];
    for (u, m) in UNITS {
        if s >= m && s.is_multiple_of(m) {
            return format!("{}{u}", s / m);
        }
    }
    s.to_string()
}

/// Parses GlusterFS boolean forms.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "yes" | "true" | "enable" | "1" => Some(true),
        "off" | "no" | "false" | "disable" | "0" => Some(false),
        _ => None,
    }
}

fn split_number(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    let n: f64 = s[..end].parse().ok()?;
    Some((n, s[end..].trim().to_ascii_lowercase()))
}

/// Parses a size: `4096`, `64KB`, `64MB`, `1GB`, `1.5GB` (1024-based; a
/// trailing `B`, `iB` or none are all accepted).
pub fn parse_size(s: &str) -> Option<u64> {
    let (n, unit) = split_number(s)?;
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => return None,
    };
    let v = n * mult as f64;
    if !v.is_finite() || v > u64::MAX as f64 || v.fract() != 0.0 {
        return None;
    }
    Some(v as u64)
}

/// Parses a time: `42`, `600s`, `100ms`, `5m`, `2h`, `1d`.
pub fn parse_time(s: &str) -> Option<Duration> {
    let (n, unit) = split_number(s)?;
    let secs = match unit.as_str() {
        "ms" | "msec" => n / 1000.0,
        "" | "s" | "sec" | "secs" => n,
        "m" | "min" | "mins" => n * 60.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => n * 3600.0,
        "d" | "day" | "days" => n * 86400.0,
        "w" | "wk" | "week" | "weeks" => n * 604800.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// Parses a percentage: `10%` or `10`.
pub fn parse_percent(s: &str) -> Option<f64> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    let v: f64 = t.parse().ok()?;
    (v.is_finite() && (0.0..=100.0).contains(&v)).then_some(v)
}

/// A share of a file system: a percentage of its size or a number of bytes
/// (GlusterFS's `storage.reserve` and distribute's `min-free-disk`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// Percent of the file system's size (0 to 100).
    Percent(f64),
    /// Bytes.
    Bytes(u64),
}

impl Share {
    /// `N` or `N%` (a percentage, 0 to 100, as GlusterFS reads a bare
    /// number) or a size with a unit (`40MB`).
    pub fn parse(s: &str) -> Option<Share> {
        let t = s.trim();
        if t.ends_with('%') || t.parse::<f64>().is_ok() {
            return parse_percent(t).map(Share::Percent);
        }
        parse_size(t).map(Share::Bytes)
    }

    /// The share of a file system of `total` bytes, rounded down.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Share::Percent(p) => (total as f64 * p / 100.0) as u64,
            Share::Bytes(b) => b,
        }
    }

    /// True when `avail` bytes of a file system of `total` are less than
    /// this share (a percentage compared exactly, not rounded).
    pub fn exceeds(self, avail: u64, total: u64) -> bool {
        match self {
            Share::Percent(p) => (avail as f64) < total as f64 * p / 100.0,
            Share::Bytes(b) => avail < b,
        }
    }

    /// True for a share of nothing (`0`, `0%`, `0B`).
    pub fn is_zero(self) -> bool {
        matches!(self, Share::Bytes(0)) || matches!(self, Share::Percent(p) if p <= 0.0)
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Share::Percent(p) => write!(f, "{p}%"),
            Share::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// Why an option was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionError {
    /// No declaration matches the key.
    #[error("unknown option '{name}' ({})", if known.is_empty() { "this translator takes no options".to_string() } else { format!("known options: {}", known.join(", ")) })]
    Unknown {
        /// The key given.
        name: String,
        /// The declared keys.
        known: Vec<String>,
    },
    /// The value is not of the declared form.
    #[error("option '{name}': bad value '{value}', expected {expected}")]
    BadValue {
        /// The option.
        name: String,
        /// The value given.
        value: String,
        /// The accepted form.
        expected: String,
    },
    /// The value is outside the declared range.
    #[error("option '{name}': value '{value}' is out of range {min}..={max}")]
    OutOfRange {
        /// The option.
        name: String,
        /// The value given.
        value: String,
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
}

/// A translator's resolved options: every given option parsed, and every
/// declared option with a default filled in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    values: BTreeMap<String, (OptValue, bool)>,
}

impl Options {
    /// Validates `given` (key, raw value) pairs against `decls` and fills
    /// defaults.
    pub fn resolve<'a>(
        decls: &[OptionDecl],
        given: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Options, OptionError> {
        let mut values = BTreeMap::new();
        for (key, raw) in given {
            let decl = declaration(decls, key);
            let Some(decl) = decl else {
                return Err(OptionError::Unknown {
                    name: key.to_string(),
                    known: decls.iter().map(|d| d.name.to_string()).collect(),
                });
            };
            values.insert(key.to_string(), (decl.parse(raw)?, true));
        }
        for d in decls {
            if d.name.contains('*') || values.contains_key(d.name) {
                continue;
            }
            if let Some(def) = d.default {
                values.insert(d.name.to_string(), (d.parse(def)?, false));
            }
        }
        Ok(Options { values })
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<&OptValue> {
        self.values.get(key).map(|(v, _)| v)
    }
    /// True when the key was given explicitly rather than defaulted.
    pub fn is_set(&self, key: &str) -> bool {
        self.values.get(key).is_some_and(|(_, set)| *set)
    }
    /// A boolean value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            OptValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
    /// An integer value.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            OptValue::Int(i) => Some(*i),
            _ => None,
        }
    }
    /// A size in bytes.
    pub fn size(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            OptValue::Size(s) => Some(*s),
            _ => None,
        }
    }
    /// A duration.
    pub fn time(&self, key: &str) -> Option<Duration> {
        match self.get(key)? {
            OptValue::Time(t) => Some(*t),
            _ => None,
        }
    }
    /// A percentage.
    pub fn percent(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            OptValue::Percent(p) => Some(*p),
            _ => None,
        }
    }
    /// A string or enum value.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            OptValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// A list value.
    pub fn list(&self, key: &str) -> Option<&[String]> {
        match self.get(key)? {
            OptValue::List(l) => Some(l),
            _ => None,
        }
    }
    /// A path value.
    pub fn path(&self, key: &str) -> Option<&std::path::Path> {
        match self.get(key)? {
            OptValue::Path(p) => Some(p),
            _ => None,
        }
    }
    /// All values in key order, with whether each was given explicitly.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &OptValue, bool)> {
        self.values.iter().map(|(k, (v, set))| (k.as_str(), v, *set))
    }
}

/// A typed handle on one declared option: name, type, default, range and
/// description are written once, in the handle, and a translator reads the
/// value with [`Opt::get`], which knows the type and falls back to the
/// declared default, so no read restates it. The handle's
/// [`decl`](Opt::decl) goes into the translator's option list.
///
/// ```
/// use xlfs_sdk::options::{Opt, Options, kind};
/// const WINDOW: Opt<kind::Size> = Opt::size("cache-size", "4MB").desc("Bytes queued per file.");
/// let o = Options::resolve(&[WINDOW.decl], [("cache-size", "1MB")]).unwrap();
/// assert_eq!(WINDOW.get(&o), 1 << 20);
/// assert_eq!(WINDOW.get(&Options::default()), 4 << 20);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Opt<K> {
    /// The declaration, for the translator's option list.
    pub decl: OptionDecl,
    kind: PhantomData<fn() -> K>,
}

/// The value kinds of [`Opt`] handles: each names what [`Opt::get`]
/// returns.
pub mod kind {
    use super::{Duration, OptValue, Path};

    /// How a kind reads its value out of an [`OptValue`] and out of the
    /// declared default's text.
    pub trait Kind: sealed::Sealed {
        /// What [`super::Opt::get`] returns.
        type Out<'a>;
        /// The declared type of an option of this kind.
        const TY: super::OptType;
        /// The value, when it has this kind.
        fn read<'a>(v: &'a OptValue) -> Option<Self::Out<'a>>;
        /// The value of the declared default (`raw`, already checked by
        /// the declaration test), or the kind's zero without one.
        fn default<'a>(raw: Option<&'static str>) -> Self::Out<'a>;
    }
    mod sealed {
        pub trait Sealed {}
    }
    macro_rules! kinds {
        ($($(#[$m:meta])* $name:ident: $ty:ident => $out:ty, |$v:ident| $read:expr, |$raw:ident| $def:expr;)*) => {$(
            $(#[$m])*
            #[derive(Clone, Copy, Debug, PartialEq)]
            pub struct $name;
            impl sealed::Sealed for $name {}
            impl Kind for $name {
                type Out<'a> = $out;
                const TY: super::OptType = super::OptType::$ty;
                fn read<'a>($v: &'a OptValue) -> Option<Self::Out<'a>> {
                    $read
                }
                fn default<'a>($raw: Option<&'static str>) -> Self::Out<'a> {
                    $def
                }
            }
        )*};
    }
    kinds! {
        /// A boolean.
        Bool: Bool => bool, |v| match v { OptValue::Bool(b) => Some(*b), _ => None },
            |raw| raw.and_then(super::parse_bool).unwrap_or(false);
        /// A signed integer.
        Int: Int => i64, |v| match v { OptValue::Int(i) => Some(*i), _ => None },
            |raw| raw.and_then(|r| r.trim().parse().ok()).unwrap_or(0);
        /// A size in bytes.
        Size: Size => u64, |v| match v { OptValue::Size(s) => Some(*s), _ => None },
            |raw| raw.and_then(super::parse_size).unwrap_or(0);
        /// A duration.
        Time: Time => Duration, |v| match v { OptValue::Time(t) => Some(*t), _ => None },
            |raw| raw.and_then(super::parse_time).unwrap_or_default();
        /// A percentage.
        Percent: Percent => f64, |v| match v { OptValue::Percent(p) => Some(*p), _ => None },
            |raw| raw.and_then(super::parse_percent).unwrap_or(0.0);
        /// A string, or an enumeration's word in its declared spelling.
        Str: Str => &'a str, |v| match v { OptValue::Str(s) => Some(s.as_str()), _ => None },
            |raw| raw.unwrap_or("");
        /// A module ([`super::OptType::Module`]): a built-in name or a
        /// file, as given.
        Module: Module => &'a str, |v| match v { OptValue::Str(s) => Some(s.as_str()), _ => None },
            |raw| raw.unwrap_or("");
        /// An absolute path; `None` when neither given nor defaulted.
        PathKind: Path => Option<&'a Path>, |v| match v { OptValue::Path(p) => Some(Some(p.as_path())), _ => None },
            |raw| raw.map(Path::new);
    }
    /// A comma-separated list.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct List;
    impl sealed::Sealed for List {}
    impl Kind for List {
        type Out<'a> = Vec<&'a str>;
        const TY: super::OptType = super::OptType::List;
        fn read<'a>(v: &'a OptValue) -> Option<Self::Out<'a>> {
            match v {
                OptValue::List(l) => Some(l.iter().map(String::as_str).collect()),
                _ => None,
            }
        }
        fn default<'a>(raw: Option<&'static str>) -> Self::Out<'a> {
            raw.map(|r| r.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()).unwrap_or_default()
        }
    }
}

impl<K: kind::Kind> Opt<K> {
    const fn of(name: &'static str, ty: OptType, default: Option<&'static str>) -> Opt<K> {
        Opt { decl: OptionDecl { name, ty, default, range: None, description: "" }, kind: PhantomData }
    }
    /// An option without a default: [`Opt::get`] reads the kind's zero
    /// when it is not given; [`Opt::given`] tells the two apart.
    pub const fn optional(name: &'static str) -> Opt<K> {
        Opt::of(name, K::TY, None)
    }
    /// Sets the inclusive range.
    pub const fn range(mut self, min: f64, max: f64) -> Opt<K> {
        self.decl.range = Some((min, max));
        self
    }
    /// Sets the description.
    pub const fn desc(mut self, d: &'static str) -> Opt<K> {
        self.decl.description = d;
        self
    }
    /// The option's name.
    pub const fn name(&self) -> &'static str {
        self.decl.name
    }
    /// The value: as given, else the declared default (also when `o` was
    /// not resolved against this declaration).
    pub fn get<'a>(&self, o: &'a Options) -> K::Out<'a> {
        o.get(self.decl.name).and_then(K::read).unwrap_or_else(|| K::default(self.decl.default))
    }
    /// The value only when it was given explicitly in the volfile.
    pub fn given<'a>(&self, o: &'a Options) -> Option<K::Out<'a>> {
        if o.is_set(self.decl.name) { o.get(self.decl.name).and_then(K::read) } else { None }
    }
}

impl Opt<kind::Bool> {
    /// A boolean option with its default.
    pub const fn bool(name: &'static str, default: bool) -> Self {
        Opt::of(name, OptType::Bool, Some(if default { "on" } else { "off" }))
    }
}
impl Opt<kind::Int> {
    /// An integer option with its default.
    pub const fn int(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Int, Some(default))
    }
    /// The value as a count or size in memory (declare a range that starts
    /// at 0 or above; a negative value reads as 0).
    pub fn count(&self, o: &Options) -> usize {
        usize::try_from(self.get(o)).unwrap_or(0)
    }
}
impl Opt<kind::Size> {
    /// A size option with its default (`4MB`).
    pub const fn size(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Size, Some(default))
    }
}
impl Opt<kind::Time> {
    /// A time option with its default (`600s`, `100ms`).
    pub const fn time(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Time, Some(default))
    }
}
impl Opt<kind::Percent> {
    /// A percentage option with its default.
    pub const fn percent(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Percent, Some(default))
    }
}
impl Opt<kind::Str> {
    /// A string option with its default.
    pub const fn str(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Str, Some(default))
    }
    /// One of `words` (matched without case, read in the declared
    /// spelling), with its default.
    pub const fn one_of(name: &'static str, words: &'static [&'static str], default: &'static str) -> Self {
        Opt::of(name, OptType::Enum(words), Some(default))
    }
    /// Restricts the value to one of `words` (for an option without a
    /// default: `Opt::optional(name).words(...)`).
    pub const fn words(mut self, words: &'static [&'static str]) -> Self {
        self.decl.ty = OptType::Enum(words);
        self
    }
}
impl Opt<kind::Module> {
    /// A module option with its default (a built-in name).
    pub const fn module(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::Module, Some(default))
    }
}
impl Opt<kind::List> {
    /// A comma-separated list with its default.
    pub const fn list(name: &'static str, default: &'static str) -> Self {
        Opt::of(name, OptType::List, Some(default))
    }
}

/// Checks a translator's declarations: every default parses as its type
/// and lies in its range, and no name is declared twice. Each translator's
/// tests call it (through the registry's test) so a bad default is a
/// failing test, not a silent zero from [`Opt::get`].
pub fn check_decls(decls: &[OptionDecl]) -> Result<(), String> {
    for (i, d) in decls.iter().enumerate() {
        if let Some(raw) = d.default {
            d.parse(raw).map_err(|e| format!("option '{}': default: {e}", d.name))?;
        }
        if decls[..i].iter().any(|e| e.name == d.name) {
            return Err(format!("option '{}' declared twice", d.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gluster_value_forms() {
        for t in ["on", "YES", "enable", "true", "1"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["off", "no", "Disable", "false", "0"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("maybe"), None);
        assert_eq!(parse_size("64MB"), Some(64 << 20));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        assert_eq!(parse_size("128KB"), Some(128 << 10));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1.5GB"), Some(3 << 29));
        assert_eq!(parse_size("12XB"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_time("600s"), Some(Duration::from_secs(600)));
        assert_eq!(parse_time("42"), Some(Duration::from_secs(42)));
        assert_eq!(parse_time("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse_time("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_time("soon"), None);
        assert_eq!(parse_percent("10%"), Some(10.0));
        assert_eq!(parse_percent("101%"), None);
    }

    const DECLS: &[OptionDecl] = &[
        OptionDecl::new("thread-count", OptType::Int).default("16").range(1.0, 64.0),
        OptionDecl::new("mode", OptType::Enum(&["fast", "safe"])).default("safe"),
        OptionDecl::new("auth.addr.*.allow", OptType::List),
        OptionDecl::new("cache-size", OptType::Size).default("32MB"),
    ];

    #[test]
    fn resolve_validates_and_defaults() {
        let o = Options::resolve(DECLS, [("mode", "FAST"), ("auth.addr./b1.allow", "127.0.0.1,*")]).expect("valid");
        assert_eq!(o.str("mode"), Some("fast"));
        assert_eq!(o.int("thread-count"), Some(16));
        assert!(!o.is_set("thread-count"));
        assert_eq!(o.size("cache-size"), Some(32 << 20));
        assert_eq!(o.list("auth.addr./b1.allow").map(|l| l.len()), Some(2));

        let e = Options::resolve(DECLS, [("thread-cont", "4")]).expect_err("typo");
        assert!(
            e.to_string().contains("unknown option 'thread-cont'") && e.to_string().contains("thread-count"),
            "{e}"
        );
        let e = Options::resolve(DECLS, [("thread-count", "many")]).expect_err("bad");
        assert!(e.to_string().contains("'many'") && e.to_string().contains("integer"), "{e}");
        let e = Options::resolve(DECLS, [("thread-count", "100")]).expect_err("range");
        assert!(matches!(e, OptionError::OutOfRange { .. }), "{e}");
        let e = Options::resolve(DECLS, [("mode", "medium")]).expect_err("enum");
        assert!(e.to_string().contains("one of fast, safe"), "{e}");
    }

    #[test]
    fn display_round_trips() {
        for raw in ["64MB", "600s", "100ms", "on", "10%"] {
            let ty = match raw {
                "64MB" => OptType::Size,
                "600s" | "100ms" => OptType::Time,
                "on" => OptType::Bool,
                _ => OptType::Percent,
            };
            let d = OptionDecl::new("x", ty);
            let v = d.parse(raw).expect("parses");
            assert_eq!(d.parse(&v.to_string()).expect("reparses"), v);
        }
    }

    #[test]
    fn typed_handles_read_given_values_and_declared_defaults() {
        const WINDOW: Opt<kind::Size> = Opt::size("cache-size", "4MB");
        const ON: Opt<kind::Bool> = Opt::bool("flush-behind", true);
        const MODE: Opt<kind::Str> = Opt::one_of("quorum-type", &["none", "auto", "fixed"], "auto");
        const WATCH: Opt<kind::List> = Opt::list("watchlist", "trusted.afr.,trusted.ec.");
        const DIR: Opt<kind::PathKind> = Opt::optional("directory");
        const SEED: Opt<kind::Int> = Opt::optional("seed");
        let decls = [WINDOW.decl, ON.decl, MODE.decl, WATCH.decl, DIR.decl, SEED.decl];
        check_decls(&decls).expect("valid declarations");
        let o = Options::resolve(&decls, [("cache-size", "1MB"), ("quorum-type", "FIXED")]).expect("valid");
        assert_eq!((WINDOW.get(&o), WINDOW.given(&o)), (1 << 20, Some(1 << 20)));
        assert_eq!((ON.get(&o), ON.given(&o)), (true, None));
        assert_eq!(MODE.get(&o), "fixed");
        assert_eq!(WATCH.get(&o), ["trusted.afr.", "trusted.ec."]);
        assert_eq!((DIR.get(&o), SEED.get(&o), SEED.given(&o)), (None, 0, None));
        // Options not resolved against the declarations still read the defaults.
        let none = Options::default();
        assert_eq!((WINDOW.get(&none), ON.get(&none), MODE.get(&none)), (4 << 20, true, "auto"));
        assert_eq!(WATCH.get(&none), ["trusted.afr.", "trusted.ec."]);
    }

    #[test]
    fn module_values_are_names_or_absolute_files() {
        let d = Opt::module("policy", "tolerant").decl;
        for ok in ["tolerant", "wasm:/lib/ra.wasm", "/lib/libx.so", "dylib:/a b/c.so"] {
            assert_eq!(d.parse(ok), Ok(OptValue::Str(ok.into())), "{ok}");
        }
        for bad in ["", "wasm:lib/ra.wasm", "lib/x.so", "./x.wasm"] {
            assert!(d.parse(bad).is_err(), "{bad}");
        }
        assert_eq!(module_file("wasm:/lib/ra.wasm"), Some(Path::new("/lib/ra.wasm")));
        assert_eq!(module_file("/x/y:z.so"), Some(Path::new("/x/y:z.so")));
        assert_eq!(module_file("notify"), None);
    }

    #[test]
    fn bad_declarations_are_found() {
        assert!(check_decls(&[Opt::size("a", "4 parsecs").decl]).expect_err("a bad default").contains("'a'"));
        assert!(check_decls(&[Opt::int("b", "9").range(0.0, 5.0).decl]).is_err());
        assert!(
            check_decls(&[Opt::bool("c", true).decl, Opt::bool("c", false).decl])
                .expect_err("a name declared twice")
                .contains("twice")
        );
    }
}
