//! The plugin descriptor (`xlfs_describe` -> `declare`): what a plugin
//! says about itself (its fop and event sets, children and declared
//! options), and its encoding (`sdk/PLUGIN-ABI.md`, "Descriptor").

use crate::options::{OptType, OptionDecl};
use crate::{Event, FopFlags, FopKind};

/// `max_children` in a descriptor meaning "no limit".
pub const UNLIMITED_CHILDREN: u32 = u32::MAX;

/// A set of fop kinds, by ABI fop code (bit `c % 64` of word `c / 64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FopSet(pub [u64; 2]);

impl FopSet {
    /// No fop.
    pub const NONE: FopSet = FopSet([0; 2]);
    /// Every fop of this ABI version.
    pub const ALL: FopSet = {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < FopKind::ALL.len() {
            s = s.with(FopKind::ALL[i]);
            i += 1;
        }
        s
    };

    /// Every fop that changes data, metadata or the namespace
    /// ([`FopKind::is_modifying`]): what a read-only gate must see.
    pub const MODIFYING: FopSet = FopSet::having(FopFlags::MODIFYING);

    /// Every fop with all of `flags` ([`FopKind::flags`]).
    pub const fn having(flags: FopFlags) -> FopSet {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < FopKind::ALL.len() {
            if FopKind::ALL[i].flags().contains(flags) {
                s = s.with(FopKind::ALL[i]);
            }
            i += 1;
        }
        s
    }

    /// The kinds listed.
    pub const fn of(kinds: &[FopKind]) -> FopSet {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < kinds.len() {
            s = s.with(kinds[i]);
            i += 1;
        }
        s
    }

    /// This set and `kind`.
    pub const fn with(mut self, kind: FopKind) -> FopSet {
        let code = kind as u16 as usize;
        self.0[code / 64] |= 1 << (code % 64);
        self
    }

    /// This set without `kind`.
    pub const fn without(mut self, kind: FopKind) -> FopSet {
        let code = kind as u16 as usize;
        self.0[code / 64] &= !(1 << (code % 64));
        self
    }

    /// True if `kind` is in the set.
    pub const fn contains(&self, kind: FopKind) -> bool {
        let code = kind as u16 as usize;
        self.0[code / 64] & (1 << (code % 64)) != 0
    }
}

/// A set of event kinds, by the ABI v1 event tag (`sdk/ABI.md` section 7):
/// bit 0 ChildUp ... bit 5 Upcall, bit 6 ClientGone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EventSet(pub u64);

impl EventSet {
    /// No event.
    pub const NONE: EventSet = EventSet(0);
    /// ChildUp.
    pub const CHILD_UP: EventSet = EventSet(1 << 0);
    /// ChildDown.
    pub const CHILD_DOWN: EventSet = EventSet(1 << 1);
    /// ChildConnecting.
    pub const CHILD_CONNECTING: EventSet = EventSet(1 << 2);
    /// ParentUp.
    pub const PARENT_UP: EventSet = EventSet(1 << 3);
    /// ParentDown.
    pub const PARENT_DOWN: EventSet = EventSet(1 << 4);
    /// Upcalls (lock contention, invalidation).
    pub const UPCALL: EventSet = EventSet(1 << 5);
    /// ClientGone.
    pub const CLIENT_GONE: EventSet = EventSet(1 << 6);

    /// Both sets.
    pub const fn union(self, other: EventSet) -> EventSet {
        EventSet(self.0 | other.0)
    }

    /// True if the set holds `event`'s kind.
    pub fn contains(&self, event: &Event) -> bool {
        let tag = match event {
            Event::ChildUp => 0,
            Event::ChildDown => 1,
            Event::ChildConnecting => 2,
            Event::ParentUp => 3,
            Event::ParentDown => 4,
            Event::Upcall(_) => 5,
            Event::ClientGone { .. } => 6,
        };
        self.0 & (1 << tag) != 0
    }
}

/// What a plugin declares about itself (`xlfs_describe` -> `declare`):
/// everything the host needs before building a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    /// The plugin's name (for logs and `xlfs volfile check`).
    pub name: String,
    /// One line on what it does.
    pub description: String,
    /// Fewest children.
    pub min_children: u32,
    /// Most children ([`UNLIMITED_CHILDREN`] for no limit).
    pub max_children: u32,
    /// The fops that enter the guest; the rest pass to child 0 untouched.
    pub fops: FopSet,
    /// The events that enter the guest; the rest take the default path.
    pub events: EventSet,
    /// Declared options.
    pub options: Vec<DeclaredOption>,
    /// Where generated client graphs put the plugin (ABI v1.4).
    pub placement: Placement,
}

/// Where a volume's generated client graph puts a plugin translator that a
/// `plugin.NAME` key adds (plugin ABI v1.4; older plugins are [`Placement::Top`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Above the performance translators, just below io-stats: it sees
    /// every fop the application makes (tag 0, the default).
    #[default]
    Top,
    /// Below the performance translators, just above the cluster
    /// translators: it sees only what the caches let through to the bricks
    /// (tag 1).
    Cluster,
}

impl Placement {
    /// Its name, as `xlfs volfile check` and the docs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Top => "top",
            Placement::Cluster => "cluster",
        }
    }

    /// Every placement, in tag order.
    pub const ALL: [Placement; 2] = [Placement::Top, Placement::Cluster];

    /// The placement [`Placement::name`] spells `name`.
    pub fn from_name(name: &str) -> Option<Placement> {
        Placement::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One option a plugin declares (an owned [`OptionDecl`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredOption {
    /// The key.
    pub name: String,
    /// The type (enum words in `words`).
    pub ty: DeclaredType,
    /// The default, in textual form.
    pub default: Option<String>,
    /// Inclusive numeric bounds.
    pub range: Option<(f64, f64)>,
    /// What it does.
    pub description: String,
}

/// An option's type as declared by a plugin.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // as OptType
pub enum DeclaredType {
    Bool,
    Int,
    Size,
    Time,
    Percent,
    Str,
    Enum(Vec<String>),
    List,
    Path,
}

impl From<&OptionDecl> for DeclaredOption {
    fn from(d: &OptionDecl) -> DeclaredOption {
        let ty = match d.ty {
            OptType::Bool => DeclaredType::Bool,
            OptType::Int => DeclaredType::Int,
            OptType::Size => DeclaredType::Size,
            OptType::Time => DeclaredType::Time,
            OptType::Percent => DeclaredType::Percent,
            OptType::Str => DeclaredType::Str,
            OptType::Enum(words) => DeclaredType::Enum(words.iter().map(|w| w.to_string()).collect()),
            OptType::List => DeclaredType::List,
            OptType::Path => DeclaredType::Path,
            // Plugin ABI v1 has no module type: a plugin sees the text.
            OptType::Module => DeclaredType::Str,
        };
        DeclaredOption {
            name: d.name.to_string(),
            ty,
            default: d.default.map(String::from),
            range: d.range,
            description: d.description.to_string(),
        }
    }
}

/// Why a descriptor could not be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DescriptorError {
    /// It ends early.
    #[error("descriptor truncated at offset {0}")]
    Truncated(usize),
    /// A string is not UTF-8.
    #[error("descriptor string at offset {0} is not UTF-8")]
    BadUtf8(usize),
    /// A tag or flag out of range.
    #[error("descriptor has unknown {what} tag {tag}")]
    BadTag {
        /// What the tag selects.
        what: &'static str,
        /// The byte read.
        tag: u8,
    },
    /// A count or length over the descriptor limits.
    #[error("descriptor {what} {len} is over the limit {max}")]
    TooLong {
        /// What is too long.
        what: &'static str,
        /// The value read.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Bytes after the descriptor.
    #[error("{0} trailing bytes after the descriptor")]
    Trailing(usize),
    /// Contradictory content.
    #[error("descriptor: {0}")]
    Invalid(String),
}

/// Longest descriptor accepted, in bytes.
pub const MAX_DESCRIPTOR: usize = 1 << 20;
/// Most options a descriptor may declare.
pub const MAX_OPTIONS: usize = 256;
const MAX_STR: usize = 64 << 10;

impl Descriptor {
    /// Appends the encoding (`sdk/PLUGIN-ABI.md`, "Descriptor").
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, &self.name);
        put_str(out, &self.description);
        out.extend_from_slice(&self.min_children.to_le_bytes());
        out.extend_from_slice(&self.max_children.to_le_bytes());
        out.extend_from_slice(&(self.fops.0.len() as u32).to_le_bytes());
        for w in self.fops.0 {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.events.0.to_le_bytes());
        out.extend_from_slice(&(self.options.len() as u32).to_le_bytes());
        for o in &self.options {
            put_str(out, &o.name);
            let tag = match &o.ty {
                DeclaredType::Bool => 0u8,
                DeclaredType::Int => 1,
                DeclaredType::Size => 2,
                DeclaredType::Time => 3,
                DeclaredType::Percent => 4,
                DeclaredType::Str => 5,
                DeclaredType::Enum(_) => 6,
                DeclaredType::List => 7,
                DeclaredType::Path => 8,
            };
            out.push(tag);
            if let DeclaredType::Enum(words) = &o.ty {
                out.extend_from_slice(&(words.len() as u32).to_le_bytes());
                for w in words {
                    put_str(out, w);
                }
            }
            match &o.default {
                None => out.push(0),
                Some(d) => {
                    out.push(1);
                    put_str(out, d);
                }
            }
            match o.range {
                None => out.push(0),
                Some((lo, hi)) => {
                    out.push(1);
                    out.extend_from_slice(&lo.to_bits().to_le_bytes());
                    out.extend_from_slice(&hi.to_bits().to_le_bytes());
                }
            }
            put_str(out, &o.description);
        }
        // The default is left out, so a plugin that keeps it describes
        // itself in the bytes a v1.3 host reads.
        if self.placement != Placement::Top {
            out.push(self.placement as u8);
        }
    }

    /// Reads a descriptor; hostile input gives an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor, DescriptorError> {
        if bytes.len() > MAX_DESCRIPTOR {
            return Err(DescriptorError::TooLong {
                what: "length",
                len: bytes.len() as u64,
                max: MAX_DESCRIPTOR as u64,
            });
        }
        let mut r = Rd { b: bytes, pos: 0 };
        let name = r.str()?;
        let description = r.str()?;
        let min_children = r.u32()?;
        let max_children = r.u32()?;
        if min_children > max_children {
            return Err(DescriptorError::Invalid(format!("min_children {min_children} > max_children {max_children}")));
        }
        let words = r.count("fop mask words", 64)?;
        let mut fops = FopSet::NONE;
        for w in 0..words {
            let bits = r.u64()?;
            // Codes this host does not know are never sent, so ignore them.
            if let Some(word) = fops.0.get_mut(w) {
                *word = bits;
            }
        }
        let known = FopSet::ALL;
        fops = FopSet([fops.0[0] & known.0[0], fops.0[1] & known.0[1]]);
        let events = EventSet(r.u64()?);
        let n = r.count("option count", MAX_OPTIONS)?;
        let mut options = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.str()?;
            let ty = match r.u8()? {
                0 => DeclaredType::Bool,
                1 => DeclaredType::Int,
                2 => DeclaredType::Size,
                3 => DeclaredType::Time,
                4 => DeclaredType::Percent,
                5 => DeclaredType::Str,
                6 => {
                    let k = r.count("enum word count", 1024)?;
                    let mut words = Vec::with_capacity(k);
                    for _ in 0..k {
                        words.push(r.str()?);
                    }
                    DeclaredType::Enum(words)
                }
                7 => DeclaredType::List,
                8 => DeclaredType::Path,
                tag => return Err(DescriptorError::BadTag { what: "option type", tag }),
            };
            let default = match r.u8()? {
                0 => None,
                1 => Some(r.str()?),
                tag => return Err(DescriptorError::BadTag { what: "default flag", tag }),
            };
            let range = match r.u8()? {
                0 => None,
                1 => Some((f64::from_bits(r.u64()?), f64::from_bits(r.u64()?))),
                tag => return Err(DescriptorError::BadTag { what: "range flag", tag }),
            };
            let description = r.str()?;
            if name.is_empty() {
                return Err(DescriptorError::Invalid("an option has an empty name".into()));
            }
            options.push(DeclaredOption { name, ty, default, range, description });
        }
        let placement = match r.b.len() - r.pos {
            0 => Placement::Top,
            _ => match r.u8()? {
                0 => Placement::Top,
                1 => Placement::Cluster,
                tag => return Err(DescriptorError::BadTag { what: "placement", tag }),
            },
        };
        if r.pos != bytes.len() {
            return Err(DescriptorError::Trailing(bytes.len() - r.pos));
        }
        Ok(Descriptor { name, description, min_children, max_children, fops, events, options, placement })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DescriptorError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(DescriptorError::Truncated(self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DescriptorError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DescriptorError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, DescriptorError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn count(&mut self, what: &'static str, max: usize) -> Result<usize, DescriptorError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DescriptorError::TooLong { what, len: n as u64, max: max as u64 });
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, DescriptorError> {
        let n = self.count("string length", MAX_STR)?;
        let at = self.pos;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| DescriptorError::BadUtf8(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Descriptor {
        const DECLS: &[OptionDecl] = &[
            OptionDecl::new("level", OptType::Enum(&["debug", "info"])).default("info").desc("how loud"),
            OptionDecl::new("count", OptType::Int).default("3").range(1.0, 10.0),
            OptionDecl::new("fops", OptType::List),
        ];
        Descriptor {
            name: "t".into(),
            description: "a test".into(),
            min_children: 1,
            max_children: UNLIMITED_CHILDREN,
            fops: FopSet::of(&[FopKind::Writev, FopKind::Forget]),
            events: EventSet::CHILD_UP.union(EventSet::UPCALL),
            options: DECLS.iter().map(DeclaredOption::from).collect(),
            placement: Placement::Top,
        }
    }

    #[test]
    fn descriptor_round_trips_and_refuses_every_truncation() {
        let d = sample();
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(Descriptor::decode(&b), Ok(d.clone()));
        for cut in 0..b.len() {
            assert!(Descriptor::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        // A placement byte after the options (ABI v1.4); the default is
        // not written, and anything after the placement is refused.
        let mut top = b.clone();
        top.push(0);
        assert_eq!(Descriptor::decode(&top), Ok(d.clone()));
        let cluster = Descriptor { placement: Placement::Cluster, ..d };
        let mut c = Vec::new();
        cluster.encode(&mut c);
        assert_eq!(c.len(), b.len() + 1);
        assert_eq!(Descriptor::decode(&c), Ok(cluster));
        c.push(0);
        assert_eq!(Descriptor::decode(&c), Err(DescriptorError::Trailing(1)));
        b.push(7);
        assert!(matches!(Descriptor::decode(&b), Err(DescriptorError::BadTag { what: "placement", tag: 7 })));
    }

    #[test]
    fn descriptor_refuses_bad_tags_and_huge_counts() {
        let mut d = sample();
        d.options.truncate(1);
        let mut b = Vec::new();
        d.encode(&mut b);
        // The option's type tag follows everything before the options and
        // the option's name.
        let mut head = Vec::new();
        Descriptor { options: Vec::new(), ..d.clone() }.encode(&mut head);
        let tag_at = head.len() + 4 + d.options[0].name.len();
        assert_eq!(b[tag_at], 6, "the enum tag");
        let mut bad = b.clone();
        bad[tag_at] = 42;
        assert!(matches!(Descriptor::decode(&bad), Err(DescriptorError::BadTag { what: "option type", tag: 42 })));
        let mut huge = Vec::new();
        put_str(&mut huge, "n");
        put_str(&mut huge, "");
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Descriptor::decode(&huge), Err(DescriptorError::TooLong { .. })));
    }

    #[test]
    fn fop_and_event_sets() {
        let s = FopSet::of(&[FopKind::Lookup, FopKind::Forget]);
        assert!(s.contains(FopKind::Lookup) && s.contains(FopKind::Forget) && !s.contains(FopKind::Stat));
        assert!(!s.without(FopKind::Lookup).contains(FopKind::Lookup));
        assert!(FopKind::ALL.iter().all(|&k| FopSet::ALL.contains(k)));
        for &k in FopKind::ALL {
            assert_eq!(FopSet::MODIFYING.contains(k), k.is_modifying(), "{k:?}");
        }
        assert!(FopSet::MODIFYING.contains(FopKind::Xattrop) && FopSet::MODIFYING.contains(FopKind::Fxattrop));
        let e = EventSet::CHILD_UP.union(EventSet::CLIENT_GONE);
        assert!(e.contains(&Event::ChildUp) && e.contains(&Event::ClientGone { client_id: "c".into() }));
        assert!(!e.contains(&Event::ParentUp));
    }
}
