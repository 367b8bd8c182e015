//! Volume keys (`xlfs volume set VOL KEY VALUE`): GlusterFS's names for
//! translators and options of the generated client graph.
//!
//! A key either turns a performance translator on or off (a toggle,
//! `performance.write-behind off` leaves write-behind out of the graph), or
//! sets one option on one or more translators (`network.ping-timeout` is
//! protocol/client's `ping-timeout`). Values are checked against the
//! translators' own option declarations ([`OptionDecl::parse`]), so a key
//! accepts exactly what the translator does; `xlfs volume set help` shows
//! the declared form, default and description.
//!
//! Key families reach the options no key names: `cluster.OPTION` is any
//! option of cluster/replicate, `storage.OPTION` any option of the bricks'
//! storage/posix ([`FAMILIES`], checked against the declarations like the
//! rest; `cluster.self-heal-daemon off` also keeps the daemon from running
//! a heal daemon for the volume).
//!
//! Keys whose targets include protocol/server (`server.ssl`, `ssl.*`,
//! `auth.ssl-allow`, `auth.allow` and `auth.reject`, the address patterns
//! a brick admits or refuses) set options of the bricks' graphs
//! ([`brick_options`]),
//! passed to each brick when it is (re)started, as are `storage.*` keys
//! ([`brick_posix_options`]): they take effect at the next `volume start`
//! (or `start force` of a stopped brick), as in GlusterFS.
//!
//! Policy keys (`performance.read-ahead-policy`,
//! `cluster.lock-contention-policy`) take a built-in policy name or a
//! `wasm:`/`dylib:` module, and the policy is loaded to check it. Plugin
//! keys (`plugin.NAME`, value `wasm:/ABS/PATH` or `dylib:/ABS/PATH`) add a
//! `plugin/wasm` or `plugin/dylib` translator named NAME to the client
//! graph ([`plugin`]); the module is loaded to check it. A plugin's own
//! options are keys of their own, `plugin.NAME.OPTION` ([`plugin_option`]),
//! checked against the declarations its module exports, once `plugin.NAME`
//! is set ([`validate_in`]); resetting `plugin.NAME` drops them too.

use serde::{Deserialize, Serialize};
use xlfs_sdk::options::{OptType, OptionDecl, OptionError, parse_bool};

use crate::registry::Registry;

/// What a key controls.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// Whether `performance/<name>` is in the client graph, and whether it
    /// is by default.
    Toggle {
        /// The translator type.
        xlator: &'static str,
        /// In the graph unless turned off.
        default_on: bool,
    },
    /// Options of translators of the client graph, (type, option) each.
    Options(&'static [(&'static str, &'static str)]),
}

/// One volume key.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// The GlusterFS-style name.
    pub name: &'static str,
    /// What it sets.
    pub target: Target,
}

const WB: &str = "performance/write-behind";
const MDC: &str = "performance/md-cache";
const QR: &str = "performance/quick-read";
const AFR: &str = "cluster/replicate";
const CLIENT: &str = "protocol/client";
const SERVER: &str = "protocol/server";
const POSIX: &str = "storage/posix";

/// Key families: `cluster.OPTION` sets any option of cluster/replicate
/// and `storage.OPTION` any option of the bricks' storage/posix (as
/// GlusterFS's `cluster.*` and `storage.*` keys do) that [`KEYS`] does not
/// name already, except those volgen and the daemon set themselves.
pub const FAMILIES: &[(&str, &str)] = &[("cluster.", AFR), ("storage.", POSIX)];

/// Options of a family's translator that no key sets: the generated graph
/// or the daemon gives them.
const MANAGED: &[(&str, &str)] = &[(AFR, "afr-pending-xattr"), (POSIX, "directory"), (POSIX, "volume-id")];

/// Every key, as `set help` lists them.
pub const KEYS: &[Key] = &[
    Key { name: "performance.write-behind", target: Target::Toggle { xlator: WB, default_on: true } },
    Key {
        name: "performance.read-ahead",
        target: Target::Toggle { xlator: "performance/read-ahead", default_on: false },
    },
    Key { name: "performance.quick-read", target: Target::Toggle { xlator: QR, default_on: true } },
    Key {
        name: "performance.open-behind",
        target: Target::Toggle { xlator: "performance/open-behind", default_on: true },
    },
    Key {
        name: "performance.readdir-ahead",
        target: Target::Toggle { xlator: "performance/readdir-ahead", default_on: true },
    },
    Key {
        name: "performance.client-io-threads",
        target: Target::Toggle { xlator: "performance/io-threads", default_on: false },
    },
    Key { name: "performance.stat-prefetch", target: Target::Toggle { xlator: MDC, default_on: true } },
    Key { name: "performance.md-cache-timeout", target: Target::Options(&[(MDC, "md-cache-timeout")]) },
    Key { name: "performance.cache-size", target: Target::Options(&[(WB, "cache-size")]) },
    Key { name: "performance.flush-behind", target: Target::Options(&[(WB, "flush-behind")]) },
    Key { name: "performance.strict-o-direct", target: Target::Options(&[(WB, "strict-O_DIRECT")]) },
    Key { name: "cluster.eager-lock", target: Target::Options(&[(AFR, "eager-lock")]) },
    Key { name: "cluster.quorum-type", target: Target::Options(&[(AFR, "quorum-type")]) },
    Key { name: "cluster.ensure-durability", target: Target::Options(&[(AFR, "ensure-durability")]) },
    Key { name: "network.ping-timeout", target: Target::Options(&[(CLIENT, "ping-timeout")]) },
    Key { name: "network.frame-timeout", target: Target::Options(&[(CLIENT, "frame-timeout")]) },
    Key { name: "network.local-transport", target: Target::Options(&[(CLIENT, "transport.local")]) },
    Key { name: "network.local-shm-size", target: Target::Options(&[(CLIENT, "transport.local.shm-size")]) },
    Key { name: "performance.read-ahead-policy", target: Target::Options(&[("performance/read-ahead", "policy")]) },
    Key { name: "cluster.lock-contention-policy", target: Target::Options(&[(AFR, "lock-contention-policy")]) },
    Key { name: "client.ssl", target: Target::Options(&[(CLIENT, "transport.socket.ssl-enabled")]) },
    Key { name: "server.ssl", target: Target::Options(&[(SERVER, "transport.socket.ssl-enabled")]) },
    Key {
        name: "ssl.own-cert",
        target: Target::Options(&[
            (CLIENT, "transport.socket.ssl-own-cert"),
            (SERVER, "transport.socket.ssl-own-cert"),
        ]),
    },
    Key {
        name: "ssl.private-key",
        target: Target::Options(&[
            (CLIENT, "transport.socket.ssl-private-key"),
            (SERVER, "transport.socket.ssl-private-key"),
        ]),
    },
    Key {
        name: "ssl.ca-list",
        target: Target::Options(&[(CLIENT, "transport.socket.ssl-ca-list"), (SERVER, "transport.socket.ssl-ca-list")]),
    },
    Key { name: "auth.ssl-allow", target: Target::Options(&[(SERVER, "auth.ssl-allow")]) },
    Key { name: "auth.allow", target: Target::Options(&[(SERVER, "auth.addr.*.allow")]) },
    Key { name: "auth.reject", target: Target::Options(&[(SERVER, "auth.addr.*.reject")]) },
    Key {
        name: "features.cache-invalidation",
        target: Target::Options(&[(MDC, "cache-invalidation"), (QR, "cache-invalidation")]),
    },
];

/// The protocol/server options the keys set in `options` give each brick,
/// as (option, value).
pub fn brick_options(options: &std::collections::BTreeMap<String, String>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for key in KEYS {
        if let (Target::Options(targets), Some(v)) = (key.target, options.get(key.name)) {
            out.extend(targets.iter().filter(|(ty, _)| *ty == SERVER).map(|(_, opt)| (*opt, v.clone())));
        }
    }
    out
}

/// The storage/posix options `storage.*` keys in `options` give each
/// brick, as (option, value).
pub fn brick_posix_options(options: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    family_options(options, POSIX).map(|(o, v)| (o.to_string(), v.clone())).collect()
}

/// The options of translator `xlator` that family keys in `options` set.
pub fn family_options<'a>(
    options: &'a std::collections::BTreeMap<String, String>,
    xlator: &'static str,
) -> impl Iterator<Item = (&'a str, &'a String)> {
    options.iter().filter_map(move |(k, v)| family(k).filter(|(x, _)| *x == xlator).map(|(_, o)| (o, v)))
}

/// The (translator, option) a family key names (`cluster.OPTION`,
/// `storage.OPTION`), if `name` is one and not one of [`KEYS`]; syntax
/// only (the registry says whether the option exists).
pub fn family(name: &str) -> Option<(&'static str, &str)> {
    if find(name).is_ok() {
        return None;
    }
    FAMILIES.iter().find_map(|(prefix, x)| name.strip_prefix(prefix).filter(|o| !o.is_empty()).map(|o| (*x, o)))
}

/// Why a key or value was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// No such key.
    #[error("unknown key '{0}' (`xlfs volume set help` lists the keys)")]
    Unknown(String),
    /// The value is not what the translator accepts.
    #[error("key {key} ({xlator} option {option}): {source}")]
    BadValue {
        /// The key.
        key: String,
        /// The translator type.
        xlator: &'static str,
        /// Its option.
        option: String,
        /// What the declaration says.
        source: Box<OptionError>,
    },
    /// A toggle's value is not a boolean.
    #[error("key {key}: bad value '{value}', expected {}", OptType::Bool.form())]
    NotBool {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// A policy value that does not load.
    #[error("key {key}: policy '{value}': {why}")]
    Policy {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// The loader's message.
        why: String,
    },
    /// A bad plugin key or module.
    #[error("key {key}: {why}")]
    Plugin {
        /// The key.
        key: String,
        /// What is wrong (for a module that does not load, the loader's
        /// message).
        why: String,
    },
    /// A key names an option its translator does not declare (a bug in
    /// [`KEYS`], caught by the tests).
    #[error("key {key}: {xlator} declares no option {option}")]
    Undeclared {
        /// The key.
        key: String,
        /// The translator type.
        xlator: &'static str,
        /// The option.
        option: String,
    },
    /// A family key for an option the generated graph or the daemon sets.
    #[error("key {key}: {xlator} option {option} is set by the daemon, not by a key")]
    Managed {
        /// The key.
        key: String,
        /// The translator type.
        xlator: &'static str,
        /// The option.
        option: String,
    },
}

/// The prefix of plugin keys: `plugin.NAME`.
pub const PLUGIN_PREFIX: &str = "plugin.";

/// A plugin translator a `plugin.NAME` key puts in the client graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plugin {
    /// NAME, also the translator's volume name in the graph.
    pub name: String,
    /// `plugin/wasm` or `plugin/dylib`.
    pub xlator: &'static str,
    /// The module's absolute path.
    pub module: String,
    /// Its options (`plugin.NAME.OPTION` keys), option -> value.
    pub options: std::collections::BTreeMap<String, String>,
}

/// The (NAME, OPTION) a `plugin.NAME.OPTION` key names, if `key` is one
/// (syntax only; a plugin name has no dots).
pub fn plugin_option(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(PLUGIN_PREFIX)?.split_once('.').filter(|(n, o)| !n.is_empty() && !o.is_empty())
}

/// The `plugin.NAME.OPTION` keys of `options` for the plugin `NAME`, as
/// (option, value).
pub fn plugin_options<'a>(
    options: &'a std::collections::BTreeMap<String, String>,
    name: &'a str,
) -> impl Iterator<Item = (&'a str, &'a String)> {
    options.iter().filter_map(move |(k, v)| plugin_option(k).filter(|(n, _)| *n == name).map(|(_, o)| (o, v)))
}

/// The plugin a `plugin.NAME` key with `value` names (syntax only: the
/// module is not loaded).
pub fn plugin(key: &str, value: &str) -> Result<Plugin, KeyError> {
    let bad = |why: String| KeyError::Plugin { key: key.to_string(), why };
    let name = key.strip_prefix(PLUGIN_PREFIX).ok_or_else(|| KeyError::Unknown(key.to_string()))?;
    if name.is_empty()
        || name.len() > 64
        || name.starts_with('-')
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(bad(format!("plugin name {name:?}: use letters, digits, '-' or '_'")));
    }
    let value = value.trim();
    let (xlator, path) = match value.split_once(':') {
        Some(("wasm", p)) => ("plugin/wasm", p),
        Some(("dylib", p)) => ("plugin/dylib", p),
        _ => return Err(bad(format!("value '{value}': expected wasm:/ABSOLUTE/PATH or dylib:/ABSOLUTE/PATH"))),
    };
    if !path.starts_with('/') {
        return Err(bad(format!("value '{value}': the module path must be absolute")));
    }
    Ok(Plugin { name: name.to_string(), xlator, module: path.to_string(), options: Default::default() })
}

impl Plugin {
    /// Where the module asks to sit in the client graph (its descriptor's
    /// placement, plugin ABI v1.4), loading it (the loader caches it).
    pub fn placement(&self) -> Result<xlfs_sdk::guest::sys::Placement, String> {
        let kind = if self.xlator == "plugin/wasm" { crate::plugin::Kind::Wasm } else { crate::plugin::Kind::Dylib };
        crate::plugin::load(kind, std::path::Path::new(&self.module))
            .map(|l| l.desc.placement)
            .map_err(|e| format!("key plugin.{}: {e}", self.name))
    }
}

/// The `plugin.NAME.OPTION` that overrides where the module asks to sit
/// (not passed to the plugin: a plugin cannot declare an option of this
/// name).
pub const PLACEMENT_OPTION: &str = "placement";

/// The placement a `plugin.NAME.placement` value names.
pub fn placement_value(value: &str) -> Result<xlfs_sdk::guest::sys::Placement, String> {
    use xlfs_sdk::guest::sys::Placement;
    Placement::from_name(value).ok_or_else(|| {
        let names: Vec<&str> = Placement::ALL.iter().map(|p| p.name()).collect();
        format!("option '{PLACEMENT_OPTION}': '{value}' is not one of {}", names.join(", "))
    })
}

/// Checks a `plugin.NAME` key and loads its module through the registry's
/// specializer for `plugin/wasm` or `plugin/dylib`; returns the module's
/// type (its option declarations).
fn plugin_type(reg: &Registry, key: &str, value: &str) -> Result<xlfs_sdk::XlatorType, KeyError> {
    let p = plugin(key, value)?;
    let bad = |why: String| KeyError::Plugin { key: key.to_string(), why };
    let specialize = reg.specializer(p.xlator).ok_or_else(|| bad(format!("{} is not registered", p.xlator)))?;
    specialize(&[("module", p.module.as_str())]).map_err(|e| bad(format!("{}: {e}", p.xlator)))
}

/// Checks the value of option `option` of the plugin whose module `ty` is,
/// for key `key`; returns it trimmed.
fn check_plugin_option(ty: &xlfs_sdk::XlatorType, key: &str, option: &str, value: &str) -> Result<String, KeyError> {
    let bad = |why: String| KeyError::Plugin { key: key.to_string(), why };
    if option == "module" {
        return Err(bad("the module is the value of the plugin's own key".into()));
    }
    if option == PLACEMENT_OPTION {
        let value = value.trim();
        return placement_value(value).map(|_| value.to_string()).map_err(bad);
    }
    let d = ty.options.iter().find(|d| d.matches(option));
    let d = d.ok_or_else(|| bad(format!("the plugin's module declares no option '{option}'")))?;
    let value = value.trim();
    d.parse(value).map_err(|e| bad(format!("option '{option}': {e}")))?;
    Ok(value.to_string())
}

/// Checks `value` for key `name` in a volume whose keys are `options` (a
/// `plugin.NAME.OPTION` key needs its `plugin.NAME` there; setting
/// `plugin.NAME` to another module checks the plugin's options against
/// it); returns it trimmed.
pub fn validate_in(
    reg: &Registry,
    options: &std::collections::BTreeMap<String, String>,
    name: &str,
    value: &str,
) -> Result<String, KeyError> {
    if let Some((plugin_name, option)) = plugin_option(name) {
        let module_key = format!("{PLUGIN_PREFIX}{plugin_name}");
        check_name(&module_key)?;
        let Some(module) = options.get(&module_key) else {
            let why = format!("the volume has no plugin '{plugin_name}': set {module_key} first");
            return Err(KeyError::Plugin { key: name.to_string(), why });
        };
        return check_plugin_option(&plugin_type(reg, &module_key, module)?, name, option, value);
    }
    if let Some(plugin_name) = name.strip_prefix(PLUGIN_PREFIX) {
        let ty = plugin_type(reg, name, value)?;
        for (option, v) in plugin_options(options, plugin_name) {
            check_plugin_option(&ty, &format!("{name}.{option}"), option, v)?;
        }
        return Ok(value.trim().to_string());
    }
    validate(reg, name, value)
}

/// Checks that a key exists: one of [`KEYS`], a family key (syntax only),
/// a well-formed `plugin.NAME` or `plugin.NAME.OPTION`.
pub fn check_name(name: &str) -> Result<(), KeyError> {
    if let Some((plugin_name, _)) = plugin_option(name) {
        return check_name(&format!("{PLUGIN_PREFIX}{plugin_name}"));
    }
    if name.starts_with(PLUGIN_PREFIX) {
        return plugin(name, "wasm:/x").map(|_| ());
    }
    if family(name).is_some() {
        return Ok(());
    }
    find(name).map(|_| ())
}

/// The key named `name`.
pub fn find(name: &str) -> Result<&'static Key, KeyError> {
    KEYS.iter().find(|k| k.name == name).ok_or_else(|| KeyError::Unknown(name.to_string()))
}

/// The declaration of `option` of translator `xlator`.
fn decl<'r>(reg: &'r Registry, key: &str, xlator: &'static str, option: &str) -> Result<&'r OptionDecl, KeyError> {
    reg.get(xlator).and_then(|t| t.options.iter().find(|d| d.matches(option))).ok_or_else(|| KeyError::Undeclared {
        key: key.to_string(),
        xlator,
        option: option.to_string(),
    })
}

/// Checks a family key's value against its option's declaration.
fn validate_family(
    reg: &Registry,
    name: &str,
    xlator: &'static str,
    option: &str,
    value: &str,
) -> Result<(), KeyError> {
    if MANAGED.contains(&(xlator, option)) {
        return Err(KeyError::Managed { key: name.to_string(), xlator, option: option.to_string() });
    }
    let d = decl(reg, name, xlator, option).map_err(|_| KeyError::Unknown(name.to_string()))?;
    d.parse(value).map_err(|source| KeyError::BadValue {
        key: name.into(),
        xlator,
        option: option.to_string(),
        source: Box::new(source),
    })?;
    Ok(())
}

/// Checks `value` for key `name`, on its own (a `plugin.NAME.OPTION` key
/// needs the volume's keys: [`validate_in`]); returns it trimmed.
pub fn validate(reg: &Registry, name: &str, value: &str) -> Result<String, KeyError> {
    if plugin_option(name).is_some() {
        let why = "a plugin's option is checked against the plugin the volume has".to_string();
        return Err(KeyError::Plugin { key: name.to_string(), why });
    }
    if name.starts_with(PLUGIN_PREFIX) {
        plugin_type(reg, name, value)?;
        return Ok(value.trim().to_string());
    }
    let value = value.trim();
    if let Some((xlator, option)) = family(name) {
        validate_family(reg, name, xlator, option, value)?;
        return Ok(value.to_string());
    }
    let key = find(name)?;
    match key.target {
        Target::Toggle { .. } => {
            parse_bool(value).ok_or_else(|| KeyError::NotBool { key: name.into(), value: value.into() })?;
        }
        Target::Options(targets) => {
            for (xlator, option) in targets {
                decl(reg, name, xlator, option)?.parse(value).map_err(|source| KeyError::BadValue {
                    key: name.into(),
                    xlator,
                    option: option.to_string(),
                    source: Box::new(source),
                })?;
            }
        }
    }
    let policy = |why: xlfs_sdk::policy::PolicyError| KeyError::Policy {
        key: name.into(),
        value: value.into(),
        why: why.to_string(),
    };
    match name {
        "performance.read-ahead-policy" => drop(reg.policies().read_ahead(value).map_err(policy)?),
        "cluster.lock-contention-policy" => drop(reg.policies().lock_contention(value).map_err(policy)?),
        _ => {}
    }
    Ok(value.to_string())
}

/// One key as `set help` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyHelp {
    /// The key.
    pub key: String,
    /// The accepted form of its value.
    pub form: String,
    /// The value the generated graph has when the key is not set.
    pub default: String,
    /// What it sets, and the translator's description of it.
    pub description: String,
}

/// The value the generated graph has for a key nobody set.
pub fn default_value(reg: &Registry, key: &Key) -> String {
    match key.target {
        Target::Toggle { default_on, .. } => (if default_on { "on" } else { "off" }).to_string(),
        Target::Options(targets) => targets.first().map(|(x, o)| option_default(reg, x, o)).unwrap_or_default(),
    }
}

/// The value of a key nobody set, for any key name but plugins'.
pub fn default_of(reg: &Registry, name: &str) -> Result<String, KeyError> {
    match family(name) {
        Some((xlator, option)) => {
            decl(reg, name, xlator, option).map_err(|_| KeyError::Unknown(name.to_string()))?;
            Ok(option_default(reg, xlator, option))
        }
        None => find(name).map(|k| default_value(reg, k)),
    }
}

/// What the generated graph has for `option` of `xlator` unless a key
/// sets it: volgen's own value, else the declared default.
fn option_default(reg: &Registry, xlator: &str, option: &str) -> String {
    let short = xlator.rsplit('/').next().unwrap_or(xlator);
    if let Some((_, v)) = super::volgen::generated_options(short).iter().find(|(k, _)| *k == option) {
        return v.to_string();
    }
    reg.get(xlator)
        .and_then(|t| t.options.iter().find(|d| d.matches(option)))
        .and_then(|d| d.default)
        .unwrap_or("(unset)")
        .to_string()
}

/// An option's accepted form (with its range).
fn form_of(d: &OptionDecl) -> String {
    match d.range {
        Some((lo, hi)) => format!("{}, {lo}..={hi}", d.ty.form()),
        None => d.ty.form(),
    }
}

/// Every key with its form, default and description: [`KEYS`], then the
/// family keys of every option their translators declare.
pub fn help(reg: &Registry) -> Vec<KeyHelp> {
    let mut out: Vec<KeyHelp> = KEYS
        .iter()
        .map(|k| {
            let (form, description) = match k.target {
                Target::Toggle { xlator, .. } => {
                    let what = reg.get(xlator).map(|t| t.description).unwrap_or("");
                    (OptType::Bool.form(), format!("Load {xlator} in the client graph: {what}"))
                }
                Target::Options(targets) => {
                    let mut form = String::new();
                    let mut desc = Vec::new();
                    for (xlator, option) in targets {
                        match reg.get(xlator).and_then(|t| t.options.iter().find(|d| d.matches(option))) {
                            Some(d) => {
                                if form.is_empty() {
                                    form = form_of(d);
                                }
                                desc.push(format!("{xlator} option {option}: {}", d.description));
                            }
                            None => desc.push(format!("{xlator} option {option}")),
                        }
                    }
                    (form, desc.join(" "))
                }
            };
            KeyHelp { key: k.name.to_string(), form, default: default_value(reg, k), description }
        })
        .collect();
    let named = |xlator: &str, option: &str| {
        KEYS.iter().any(|k| matches!(k.target, Target::Options(t) if t.contains(&(xlator, option))))
    };
    for (prefix, xlator) in FAMILIES {
        let Some(t) = reg.get(xlator) else { continue };
        for d in t.options {
            let key = format!("{prefix}{}", d.name);
            if d.name.contains('*')
                || MANAGED.contains(&(*xlator, d.name))
                || named(xlator, d.name)
                || family(&key).is_none()
            {
                continue;
            }
            out.push(KeyHelp {
                form: form_of(d),
                default: option_default(reg, xlator, d.name),
                description: format!("{xlator} option {}: {}", d.name, d.description),
                key,
            });
        }
    }
    // Plugin keys name a module and its own declared options, so they are
    // listed by form.
    out.push(KeyHelp {
        key: format!("{PLUGIN_PREFIX}NAME"),
        form: "wasm:/ABSOLUTE/PATH | dylib:/ABSOLUTE/PATH".into(),
        default: "(unset)".into(),
        description: "A plugin translator in the client graph, where its module asks to sit; NAME (letters, digits, \
                      '-', '_') is its volume name, and plugins that ask for the same place stack in the order of \
                      their names. The module is loaded and checked when the key is set; `volume reset` of the key \
                      takes it out with its options."
            .into(),
    });
    out.push(KeyHelp {
        key: format!("{PLUGIN_PREFIX}NAME.OPTION"),
        form: "as the plugin declares it".into(),
        default: "(the plugin's default)".into(),
        description: "An option the plugin NAME declares (its module's descriptor); checked against that \
                      declaration, so plugin.NAME must be set first. One is the host's: plugin.NAME.placement \
                      (top or cluster) puts the plugin there whatever its module asks."
            .into(),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_names_a_declared_option_and_its_default_is_valid() {
        let reg = Registry::builtin();
        for k in KEYS {
            let d = default_value(&reg, k);
            if let Target::Toggle { xlator, .. } = k.target {
                assert!(reg.get(xlator).is_some(), "{}: {xlator}", k.name);
            }
            if d != "(unset)" {
                validate(&reg, k.name, &d).unwrap_or_else(|e| panic!("{}: default {d}: {e}", k.name));
            }
        }
        let help = help(&reg);
        assert!(help.len() > KEYS.len(), "family keys are listed too");
        let plugin_keys: Vec<&str> =
            help.iter().filter(|h| h.key.starts_with(PLUGIN_PREFIX)).map(|h| &*h.key).collect();
        assert_eq!(plugin_keys, ["plugin.NAME", "plugin.NAME.OPTION"], "plugin keys are listed by form");
        for h in help[KEYS.len()..].iter().filter(|h| !h.key.starts_with(PLUGIN_PREFIX)) {
            if h.default != "(unset)" {
                validate(&reg, &h.key, &h.default).unwrap_or_else(|e| panic!("{}: default {}: {e}", h.key, h.default));
            }
        }
    }

    #[test]
    fn bad_keys_and_values_are_refused_with_the_valid_form() {
        let reg = Registry::builtin();
        assert!(validate(&reg, "performance.nope", "on").expect_err("unknown").to_string().contains("unknown key"));
        let e = validate(&reg, "performance.cache-size", "1KB").expect_err("too small").to_string();
        assert!(e.contains("out of range 524288..=1073741824"), "{e}");
        let e = validate(&reg, "cluster.quorum-type", "most").expect_err("not a word").to_string();
        assert!(e.contains("one of none, auto, fixed"), "{e}");
        let e = validate(&reg, "performance.write-behind", "maybe").expect_err("not bool").to_string();
        assert!(e.contains("a boolean"), "{e}");
        assert_eq!(validate(&reg, "network.ping-timeout", " 10 ").expect("valid"), "10");
        let e = validate(&reg, "performance.read-ahead-policy", "nope").expect_err("no such policy").to_string();
        assert!(e.contains("performance.read-ahead-policy"), "{e}");
        validate(&reg, "cluster.lock-contention-policy", "notify").expect("built-in");
        let e = validate(&reg, "plugin.x", "wasm:rel.wasm").expect_err("relative").to_string();
        assert!(e.contains("must be absolute"), "{e}");
        let e = validate(&reg, "plugin.x", "/abs.wasm").expect_err("no scheme").to_string();
        assert!(e.contains("expected wasm:"), "{e}");
        let e = validate(&reg, "plugin.a/b", "wasm:/x.wasm").expect_err("bad name").to_string();
        assert!(e.contains("plugin name"), "{e}");
        let e = validate(&reg, "plugin.x", "wasm:/nonexistent/x.wasm").expect_err("no module").to_string();
        assert!(e.contains("plugin/wasm"), "{e}");
    }

    /// A volume's keys from (key, value) pairs.
    fn keys_of(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_plugin_option_key_names_its_plugin_and_needs_it_set() {
        let reg = Registry::builtin();
        assert_eq!(plugin_option("plugin.pt.tail"), Some(("pt", "tail")));
        assert_eq!(plugin_option("plugin.pt"), None);
        assert_eq!(plugin_option("plugin..tail"), None);
        check_name("plugin.pt.tail").expect("well formed");
        check_name("plugin.a/b.tail").expect_err("bad plugin name");
        let none = std::collections::BTreeMap::new();
        let e = validate_in(&reg, &none, "plugin.pt.tail", "on").expect_err("no plugin").to_string();
        assert!(e.contains("key plugin.pt.tail") && e.contains("set plugin.pt first"), "{e}");
        let e = validate(&reg, "plugin.pt.tail", "on").expect_err("needs the volume").to_string();
        assert!(e.contains("key plugin.pt.tail"), "{e}");
        let options = keys_of(&[("plugin.pt.tail", "on"), ("plugin.pt-x.tail", "off"), ("plugin.q.tail", "on")]);
        let got: Vec<(&str, &String)> = plugin_options(&options, "pt").collect();
        assert_eq!(got, vec![("tail", &"on".to_string())]);
        // placement is the host's, whatever the module declares.
        let ty = reg.get("debug/io-stats").expect("a type");
        assert_eq!(
            check_plugin_option(ty, "plugin.pt.placement", "placement", " cluster ").expect("host's"),
            "cluster"
        );
        let e = check_plugin_option(ty, "plugin.pt.placement", "placement", "bottom").expect_err("bad").to_string();
        assert!(e.contains("key plugin.pt.placement") && e.contains("'bottom' is not one of top, cluster"), "{e}");
    }

    #[test]
    fn family_keys_set_any_declared_option_of_replicate_and_posix() {
        let reg = Registry::builtin();
        assert_eq!(family("cluster.data-self-heal-algorithm"), Some((AFR, "data-self-heal-algorithm")));
        assert_eq!(family("storage.reserve"), Some((POSIX, "reserve")));
        assert_eq!(family("cluster.eager-lock"), None, "a named key");
        assert_eq!(validate(&reg, "storage.reserve", " 25% ").expect("posix option"), "25%");
        validate(&reg, "cluster.self-heal-daemon", "off").expect("replicate option");
        let e = validate(&reg, "storage.o-direct-min-size", "lots").expect_err("bad value").to_string();
        assert!(e.contains("storage/posix option o-direct-min-size"), "{e}");
        let e = validate(&reg, "storage.no-such-option", "1").expect_err("undeclared").to_string();
        assert!(e.contains("unknown key"), "{e}");
        let e = validate(&reg, "storage.directory", "/etc").expect_err("managed").to_string();
        assert!(e.contains("set by the daemon"), "{e}");
        let opts = keys_of(&[("storage.reserve", "25%"), ("cluster.eager-lock", "off"), ("storage.ctime", "off")]);
        assert_eq!(
            brick_posix_options(&opts),
            [("ctime".to_string(), "off".to_string()), ("reserve".to_string(), "25%".to_string())]
        );
        assert_eq!(default_of(&reg, "cluster.self-heal-daemon").expect("default"), "on");
        assert!(help(&reg).iter().any(|h| h.key == "storage.o-direct-min-size"));
    }
}
