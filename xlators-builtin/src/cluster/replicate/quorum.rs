//! Client quorum (GlusterFS's `quorum-type` / `quorum-count`): how many
//! children must be up, locked and successful for a modifying fop to go
//! ahead. Without it, modifying fops fail with ENOTCONN, the errno
//! GlusterFS's `afr_quorum_errno` returns.

use xlfs_sdk::Errno;

use super::pending::{Mask, bit, count};

/// The errno of a fop refused for lack of quorum.
pub const QUORUM_ERRNO: Errno = Errno::ENOTCONN;

/// The quorum rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quorum {
    /// No quorum: one child is enough.
    None,
    /// More than half of the children, or exactly half including the first.
    Auto,
    /// At least this many children.
    Fixed(u32),
}

impl Quorum {
    /// From the options: `quorum-type` (None when not given: auto for more
    /// than two children, as GlusterFS) and `quorum-count`.
    pub fn from_options(qtype: Option<&str>, qcount: Option<i64>, children: usize) -> Quorum {
        match qtype {
            Some("auto") => Quorum::Auto,
            Some("fixed") => Quorum::Fixed(qcount.and_then(|c| u32::try_from(c).ok()).unwrap_or(1).max(1)),
            Some(_) => Quorum::None,
            None if children > 2 => Quorum::Auto,
            None => Quorum::None,
        }
    }

    /// True if the children in `m` (of `n`) make a quorum.
    pub fn met(self, m: Mask, n: usize) -> bool {
        let c = count(m) as usize;
        match self {
            Quorum::None => c > 0,
            Quorum::Auto => c * 2 > n || (c * 2 == n && m & bit(0) != 0),
            Quorum::Fixed(k) => c >= k as usize,
        }
    }

    /// True unless this is [`Quorum::None`].
    pub fn enabled(self) -> bool {
        self != Quorum::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(Quorum::from_options(None, None, 3), Quorum::Auto);
        assert_eq!(Quorum::from_options(None, None, 2), Quorum::None);
        assert_eq!(Quorum::from_options(Some("none"), None, 3), Quorum::None);
        assert_eq!(Quorum::from_options(Some("fixed"), Some(2), 3), Quorum::Fixed(2));
        let a = Quorum::Auto;
        assert!(a.met(0b011, 3) && a.met(0b110, 3) && !a.met(0b100, 3) && !a.met(0, 3));
        // Exactly half: only with the first child.
        assert!(a.met(0b0011, 4) && !a.met(0b1100, 4));
        assert!(a.met(0b01, 2) && !a.met(0b10, 2));
        let f = Quorum::Fixed(2);
        assert!(f.met(0b101, 3) && !f.met(0b100, 3));
        assert!(Quorum::None.met(0b100, 3) && !Quorum::None.met(0, 3));
    }
}
