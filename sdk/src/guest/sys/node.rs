//! The optional translator exports of ABI v1.2: `xlfs_dump` (the
//! instance's own state, and its encoding) and `xlfs_reconfigure` (new
//! options in place).

use crate::abi::{self, AbiVersion, DecodeError, Limits};

/// The translator exports of ABI v1.2, each optional: the host probes for
/// them (in modules that declare v1.2 or newer) and does without.
pub mod node_exports {
    /// `int32_t (xlfs_inst, uint8_t *out, uint32_t cap)`: the instance's
    /// own state as an encoded Dict of Str values (ABI §3) written to
    /// `out`; returns the encoding's length. A length above `cap` means
    /// nothing was written: the host calls again with at least that much
    /// room (up to [`super::MAX_DUMP`]). `-1` failed (a crash), any other
    /// negative errno: nothing to report.
    pub const DUMP: &str = "xlfs_dump";
    /// `int32_t (xlfs_inst, const uint8_t *opts, uint32_t len)`: new
    /// options (a Dict, as `xlfs_init` gets them) for the running
    /// instance. `0` applied; [`super::RECONFIGURE_UNSUPPORTED`]
    /// (`-EOPNOTSUPP`): the plugin cannot, the host rebuilds the node; any
    /// other negative errno but `-1`: refused (the plugin logs why at error
    /// level first, naming the option), the old options stay; `-1` failed
    /// (a crash; the old options stay).
    pub const RECONFIGURE: &str = "xlfs_reconfigure";
}

/// Longest dump (`xlfs_dump`) the host accepts, in bytes.
pub const MAX_DUMP: usize = 1 << 20;
/// `xlfs_reconfigure`'s result when the plugin cannot change its options
/// in place (`-EOPNOTSUPP`): the host rebuilds the node instead.
pub const RECONFIGURE_UNSUPPORTED: i32 = -crate::Errno::EOPNOTSUPP.0;

/// Which ABI v1.2 translator exports a module has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeExports {
    /// `xlfs_dump` is there.
    pub dump: bool,
    /// `xlfs_reconfigure` is there.
    pub reconfigure: bool,
}

impl NodeExports {
    /// What a module of `version` with these export names has (nothing
    /// before v1.2).
    pub fn probe<'a>(version: AbiVersion, names: impl Iterator<Item = &'a str>) -> NodeExports {
        let mut found = NodeExports::default();
        if version.minor < 2 {
            return found;
        }
        for n in names {
            found.dump |= n == node_exports::DUMP;
            found.reconfigure |= n == node_exports::RECONFIGURE;
        }
        found
    }
}

/// Encodes a dump (`xlfs_dump`): the pairs as a Dict of Str values (a key
/// given twice keeps its last value; keys come back sorted).
pub fn encode_dump(pairs: &[(String, String)], out: &mut Vec<u8>) {
    let mut d = crate::Dict::new();
    for (k, v) in pairs {
        d.set_str(k.clone(), v.clone());
    }
    abi::encode(&d, out);
}

/// Decodes a dump; values that are not strings are shown as the ABI's
/// debug form of the value.
pub fn decode_dump(bytes: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
    let d = abi::decode::<crate::Dict>(bytes, None, &Limits::DEFAULT)?;
    Ok(d.iter()
        .map(|(k, v)| {
            let v = match v {
                crate::Value::Str(s) => s.clone(),
                other => format!("{other:?}"),
            };
            (k.clone(), v)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_exports_are_probed_from_v1_2_on_and_dumps_round_trip() {
        let names = ["xlfs_init", "xlfs_dump", "xlfs_reconfigure"];
        let all = NodeExports { dump: true, reconfigure: true };
        assert_eq!(NodeExports::probe(AbiVersion::new(1, 2), names.iter().copied()), all);
        assert_eq!(NodeExports::probe(AbiVersion::new(1, 1), names.iter().copied()), NodeExports::default());
        let only = NodeExports::probe(AbiVersion::new(1, 2), ["xlfs_dump"].into_iter());
        assert_eq!(only, NodeExports { dump: true, reconfigure: false });
        let pairs = vec![("b".to_string(), "2".to_string()), ("a".to_string(), "x y".to_string())];
        let mut b = Vec::new();
        encode_dump(&pairs, &mut b);
        assert_eq!(decode_dump(&b).expect("decodes"), [pairs[1].clone(), pairs[0].clone()]);
        for cut in 0..b.len() {
            assert!(decode_dump(&b[..cut]).is_err(), "cut at {cut}");
        }
    }
}
