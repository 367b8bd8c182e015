//! Who may use a subvolume: GlusterFS's `auth.addr` and `auth.login`
//! options, checked at the handshake.
//!
//! - `auth.addr.<subvolume>.reject`: address patterns refused.
//! - `auth.addr.<subvolume>.allow`: address patterns allowed. A subvolume
//!   with no `allow` option at all is open to every address (that is not
//!   rejected); with one, only matching addresses get in.
//! - `auth.login.<subvolume>.allow`: user names allowed; when present the
//!   HELLO must carry one of them with its password,
//!   `auth.login.<user>.password`.
//!
//! - `auth.ssl-allow`: with TLS on, the subject common names (patterns)
//!   whose client certificates may connect; `*` (the default) admits every
//!   certificate signed by one of the brick's CAs.
//!
//! Patterns are matched against the peer's IP address (`127.0.0.1`), with
//! `*` matching any run of characters and `?` any one character; host names
//! are not resolved. The `<subvolume>` part may itself be such a pattern.
//! Address checks run first, then the login check.

use std::collections::HashMap;

use xlfs_sdk::{OptValue, Options};

/// The parsed auth options.
#[derive(Debug, Default)]
pub(super) struct Auth {
    addr_allow: Vec<(String, Vec<String>)>,
    addr_reject: Vec<(String, Vec<String>)>,
    login_allow: Vec<(String, Vec<String>)>,
    passwords: HashMap<String, String>,
    /// `auth.ssl-allow` (empty: any certificate name).
    ssl_allow: Vec<String>,
}

/// `*` and `?` wildcard match (no escapes), in linear space.
pub(super) fn wildcard(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some(&c) if c == '?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn list(v: &OptValue) -> Vec<String> {
    match v {
        OptValue::List(l) => l.clone(),
        other => other.to_string().split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
    }
}

impl Auth {
    /// Reads the auth options; every `<subvolume>` named must match one of
    /// `subvolumes`, and every allowed user must have a password.
    pub(super) fn from_options(o: &Options, subvolumes: &[&str]) -> Result<Auth, String> {
        let mut auth = Auth::default();
        if let Some(v) = o.get("auth.ssl-allow") {
            auth.ssl_allow = list(v).into_iter().filter(|p| p != "*").collect();
        }
        for (key, value, _) in o.iter() {
            let Some((family, rest)) = key.strip_prefix("auth.").and_then(|r| r.split_once('.')) else {
                continue;
            };
            let Some((middle, last)) = rest.rsplit_once('.') else {
                continue;
            };
            let target = match (family, last) {
                ("addr", "allow") => &mut auth.addr_allow,
                ("addr", "reject") => &mut auth.addr_reject,
                ("login", "allow") => &mut auth.login_allow,
                ("login", "password") => {
                    auth.passwords.insert(middle.to_string(), value.to_string());
                    continue;
                }
                _ => continue,
            };
            if !subvolumes.iter().any(|s| wildcard(middle, s)) {
                return Err(format!(
                    "option '{key}' names no subvolume of this server (subvolumes: {})",
                    subvolumes.join(", ")
                ));
            }
            target.push((middle.to_string(), list(value)));
        }
        for (sub, users) in &auth.login_allow {
            if let Some(u) = users.iter().find(|u| !auth.passwords.contains_key(*u)) {
                return Err(format!(
                    "option 'auth.login.{sub}.allow' lists user '{u}' but 'auth.login.{u}.password' is not set"
                ));
            }
        }
        Ok(auth)
    }

    /// Decides whether a TLS client whose certificate names `cn` may
    /// connect (`auth.ssl-allow`).
    pub(super) fn check_cn(&self, cn: Option<&str>) -> Result<(), String> {
        if self.ssl_allow.is_empty() {
            return Ok(());
        }
        let Some(cn) = cn else {
            return Err("the client certificate has no common name (auth.ssl-allow is set)".into());
        };
        if self.ssl_allow.iter().any(|p| wildcard(p, cn)) {
            return Ok(());
        }
        Err(format!("certificate name '{cn}' is not allowed (auth.ssl-allow: {})", self.ssl_allow.join(",")))
    }

    /// The patterns of `rules` that apply to `subvolume`, if any rule does.
    fn rules<'a>(rules: &'a [(String, Vec<String>)], subvolume: &str) -> Option<Vec<&'a str>> {
        let mut hit = rules.iter().filter(|(sub, _)| wildcard(sub, subvolume)).peekable();
        hit.peek()?;
        Some(hit.flat_map(|(_, l)| l.iter().map(String::as_str)).collect())
    }

    /// Decides whether a client at `ip` logging in as `user` may use
    /// `subvolume`; the error is the reason told to the client.
    pub(super) fn check(
        &self,
        subvolume: &str,
        ip: &str,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<(), String> {
        if let Some(p) = Self::rules(&self.addr_reject, subvolume).and_then(|r| r.into_iter().find(|p| wildcard(p, ip)))
        {
            return Err(format!("address {ip} is rejected for '{subvolume}' (auth.addr reject pattern '{p}')"));
        }
        if let Some(allow) = Self::rules(&self.addr_allow, subvolume)
            && !allow.iter().any(|p| wildcard(p, ip))
        {
            return Err(format!(
                "address {ip} is not allowed for '{subvolume}' (auth.addr allow: {})",
                allow.join(",")
            ));
        }
        let Some(users) = Self::rules(&self.login_allow, subvolume) else {
            return Ok(());
        };
        let Some(user) = user.filter(|u| !u.is_empty()) else {
            return Err(format!("'{subvolume}' needs a login (auth.login) and the client sent no username"));
        };
        if !users.contains(&user) {
            return Err(format!("user '{user}' is not allowed for '{subvolume}'"));
        }
        let expected = self.passwords.get(user).map(String::as_bytes).unwrap_or_default();
        if !constant_time_eq(expected, password.unwrap_or_default().as_bytes()) {
            return Err(format!("wrong password for user '{user}'"));
        }
        Ok(())
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    diff == 0 && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use xlfs_sdk::OptionDecl;

    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard("*", ""));
        assert!(wildcard("127.0.0.*", "127.0.0.1"));
        assert!(!wildcard("127.0.0.*", "127.0.1.1"));
        assert!(wildcard("10.?.*.1", "10.3.200.1"));
        assert!(!wildcard("10.?.*.1", "10.33.200.1"));
        assert!(wildcard("a*b*c", "aXXbYYc"));
        assert!(!wildcard("a*b*c", "aXXbYY"));
    }

    fn auth(opts: &[(&str, &str)]) -> Result<Auth, String> {
        let decls = &[
            OptionDecl::new("auth.addr.*.allow", xlfs_sdk::OptType::List),
            OptionDecl::new("auth.addr.*.reject", xlfs_sdk::OptType::List),
            OptionDecl::new("auth.login.*.allow", xlfs_sdk::OptType::List),
            OptionDecl::new("auth.login.*.password", xlfs_sdk::OptType::Str),
        ];
        Auth::from_options(&Options::resolve(decls, opts.iter().copied()).expect("valid"), &["/b1", "/b2"])
    }

    #[test]
    fn addr_and_login_rules() {
        let open = auth(&[]).expect("ok");
        assert_eq!(open.check("/b1", "10.0.0.1", None, None), Ok(()), "no allow option: everything allowed");

        let a = auth(&[
            ("auth.addr./b1.allow", "127.0.0.*,10.1.*"),
            ("auth.addr./b1.reject", "127.0.0.9"),
            ("auth.login./b2.allow", "alice"),
            ("auth.login.alice.password", "s3cret"),
        ])
        .expect("ok");
        assert_eq!(a.check("/b1", "127.0.0.1", None, None), Ok(()));
        assert!(a.check("/b1", "127.0.0.9", None, None).expect_err("rejected").contains("rejected"));
        assert!(a.check("/b1", "192.168.0.1", None, None).expect_err("not allowed").contains("not allowed"));
        assert_eq!(a.check("/b2", "192.168.0.1", Some("alice"), Some("s3cret")), Ok(()));
        assert!(a.check("/b2", "1.1.1.1", Some("alice"), Some("nope")).expect_err("bad").contains("wrong password"));
        assert!(
            a.check("/b2", "1.1.1.1", Some("bob"), Some("s3cret")).expect_err("bad").contains("'bob' is not allowed")
        );
        assert!(a.check("/b2", "1.1.1.1", None, None).expect_err("bad").contains("no username"));
    }

    #[test]
    fn bad_configurations_are_init_errors() {
        let e = auth(&[("auth.addr./typo.allow", "*")]).expect_err("unknown subvolume");
        assert!(e.contains("auth.addr./typo.allow") && e.contains("/b1, /b2"), "{e}");
        let e = auth(&[("auth.login./b1.allow", "carol")]).expect_err("no password");
        assert!(e.contains("auth.login.carol.password"), "{e}");
        assert!(auth(&[("auth.addr./b*.allow", "*")]).is_ok(), "subvolume patterns");
    }
}
