//! A GlusterFS `gluster volume info` listing, read so that `xlfs volume
//! create NAME --from-info FILE` makes the same volume: its bricks, its
//! replica count and its reconfigured options.
//!
//! ```text
//! Volume Name: gv0
//! Type: Distributed-Replicate
//! Number of Bricks: 2 x 3 = 6
//! Bricks:
//! Brick1: node1:/data/b1
//! ...
//! Options Reconfigured:
//! performance.write-behind: off
//! nfs.disable: on
//! ```
//!
//! Layouts xlfs does not have (disperse, arbiter) are refused with the
//! line that says so; options are returned as listed, for the caller to
//! split into the keys xlfs has and those it has no equivalent for.

/// What a listing describes.
#[derive(Debug, PartialEq)]
pub struct GlusterInfo {
    /// `Volume Name`, if given.
    pub name: Option<String>,
    /// Copies per file.
    pub replica: usize,
    /// `HOST:DIR` each, in order.
    pub bricks: Vec<String>,
    /// `Options Reconfigured`, as (key, value).
    pub options: Vec<(String, String)>,
}

/// Why a listing cannot be used.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{origin}:{line}: {why}")]
pub struct InfoError {
    /// The file.
    pub origin: String,
    /// The line (1-based; 0: the listing as a whole).
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

/// Reads the listing of one volume (`origin` names it in errors).
pub fn parse(text: &str, origin: &str) -> Result<GlusterInfo, InfoError> {
    let err = |line: usize, why: String| InfoError { origin: origin.to_string(), line, why };
    let (mut name, mut count, mut bricks, mut options) = (None, None, Vec::new(), Vec::new());
    let mut in_options = false;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(err(n, format!("expected KEY: VALUE, found {line:?}")));
        };
        let (key, value) = (key.trim(), value.trim());
        if in_options {
            if value.is_empty() {
                return Err(err(n, format!("option {key} has no value")));
            }
            options.push((key.to_string(), value.to_string()));
            continue;
        }
        match key {
            "Volume Name" => {
                if name.is_some() {
                    return Err(err(n, "a second volume: give the listing of one volume".into()));
                }
                name = Some(value.to_string());
            }
            "Type" if value.contains("Disperse") => {
                return Err(err(n, format!("type {value}: xlfs has no disperse (erasure-coded) volumes")));
            }
            "Number of Bricks" => count = Some((n, value.to_string())),
            "Options Reconfigured" => in_options = true,
            k if k.starts_with("Brick") && k[5..].bytes().all(|b| b.is_ascii_digit()) && k.len() > 5 => {
                // "Brick3: node3:/data/b3 (arbiter)".
                if value.ends_with("(arbiter)") {
                    return Err(err(n, "an arbiter brick: xlfs has no arbiter volumes".into()));
                }
                bricks.push(value.to_string());
            }
            _ => {} // Volume ID, Status, Transport-type, Bricks, Snapshot Count...
        }
    }
    let Some((n, count)) = count else { return Err(err(0, "no 'Number of Bricks:' line".into())) };
    let replica = replica_of(&count).ok_or_else(|| {
        err(n, format!("Number of Bricks {count:?}: expected N or S x R = N (no arbiter or disperse layouts)"))
    })?;
    if bricks.is_empty() {
        return Err(err(0, "no 'BrickN: HOST:DIR' lines".into()));
    }
    if !bricks.len().is_multiple_of(replica) {
        return Err(err(n, format!("{} bricks listed, not whole replica sets of {replica}", bricks.len())));
    }
    Ok(GlusterInfo { name, replica, bricks, options })
}

/// The replica count of `N` (distribute: 1) or `S x R = N`.
fn replica_of(count: &str) -> Option<usize> {
    match count.split_once('x') {
        None => count.trim().parse::<usize>().ok().map(|_| 1),
        Some((_, rest)) => {
            let r = rest.split('=').next()?.trim();
            if r.contains('+') || r.contains('(') {
                return None; // arbiter "(2 + 1)", disperse "(4 + 2)"
            }
            r.parse().ok().filter(|r| *r > 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
Volume Name: gv0
Type: Distributed-Replicate
Volume ID: 6f0e1c6a-1b1f-4a43-9d6c-0d3d0b0c1e2f
Status: Started
Snapshot Count: 0
Number of Bricks: 2 x 3 = 6
Transport-type: tcp
Bricks:
Brick1: node1:/data/b1
Brick2: node2:/data/b1
Brick3: node3:/data/b1
Brick4: node1:/data/b2
Brick5: node2:/data/b2
Brick6: node3:/data/b2
Options Reconfigured:
performance.write-behind: off
network.ping-timeout: 20
nfs.disable: on
";

    #[test]
    fn a_listing_gives_bricks_replica_and_options() {
        let i = parse(LISTING, "info.txt").expect("parses");
        assert_eq!(i.name.as_deref(), Some("gv0"));
        assert_eq!(i.replica, 3);
        assert_eq!(i.bricks.len(), 6);
        assert_eq!(i.bricks[3], "node1:/data/b2");
        assert_eq!(i.options[0], ("performance.write-behind".to_string(), "off".to_string()));
        assert_eq!(i.options.len(), 3);
        let plain = "Volume Name: d\nNumber of Bricks: 2\nBrick1: a:/x\nBrick2: b:/x\n";
        assert_eq!(parse(plain, "d").expect("distribute").replica, 1);
    }

    #[test]
    fn layouts_xlfs_lacks_and_bad_lines_are_named() {
        let cases = [
            ("Type: Disperse\n", "disperse", 1),
            ("Number of Bricks: 1 x (2 + 1) = 3\nBrick1: a:/x\n", "Number of Bricks", 1),
            ("Number of Bricks: 1 x 3 = 3\nBrick1: a:/x\nBrick2: b:/x\nBrick3: c:/x (arbiter)\n", "arbiter", 4),
            ("Number of Bricks: 1 x 3 = 3\nBrick1: a:/x\n", "not whole replica sets", 1),
            ("Number of Bricks: 1 x 3 = 3\nnonsense\n", "expected KEY: VALUE", 2),
            ("Brick1: a:/x\n", "no 'Number of Bricks:'", 0),
        ];
        for (text, needle, line) in cases {
            let e = parse(text, "f").expect_err(text);
            assert!(e.why.contains(needle) || e.to_string().contains(needle), "{text}: {e}");
            assert_eq!(e.line, line, "{text}: {e}");
        }
    }
}
