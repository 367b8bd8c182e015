//! The 32-bit hash of a name that picks its subvolume: GlusterFS's
//! Davies-Meyer hash (`gf_dm_hashfn`, libglusterfs `hashfn.c`), so that a
//! directory laid out by xlfs places names where GlusterFS would.
//!
//! The construction: a TEA-style block cipher in Davies-Meyer mode over two
//! 32-bit halves (`h0 = 0x9464a485`, `h1 = 0x542e1a94`); the name is read as
//! little-endian 32-bit words, 16 bytes per block with 6 rounds for every
//! whole block, and a last block of 10 rounds made of the remaining words
//! padded with `len | len << 8 | len << 16 | len << 24` (the trailing bytes
//! shifted in after the pad, each sign-extended as C's `char` is on x86).
//! The hash is `h0 ^ h1`. Unlike GlusterFS, names are hashed as given (no
//! rsync temporary-name munging).

const DELTA: u32 = 0x9E37_79B9;
const FULL_ROUNDS: u32 = 10;
const PART_ROUNDS: u32 = 6;

fn rounds(n: u32, block: &[u32; 4], h0: &mut u32, h1: &mut u32) {
    let (mut b0, mut b1, mut sum) = (*h0, *h1, 0u32);
    for _ in 0..n {
        sum = sum.wrapping_add(DELTA);
        b0 =
            b0.wrapping_add((b1 << 4).wrapping_add(block[0]) ^ b1.wrapping_add(sum) ^ (b1 >> 5).wrapping_add(block[1]));
        b1 =
            b1.wrapping_add((b0 << 4).wrapping_add(block[2]) ^ b0.wrapping_add(sum) ^ (b0 >> 5).wrapping_add(block[3]));
    }
    *h0 = h0.wrapping_add(b0);
    *h1 = h1.wrapping_add(b1);
}

/// The Davies-Meyer hash of `name`.
pub fn dm_hash(name: &[u8]) -> u32 {
    let (mut h0, mut h1) = (0x9464_a485u32, 0x542e_1a94u32);
    let len = name.len();
    // C computes the pad from an int length: only its low byte matters.
    let l = len as u32 & 0xff;
    let pad = {
        let p = l | (l << 8);
        p | (p << 16)
    };
    let word = |i: usize| u32::from_le_bytes([name[i], name[i + 1], name[i + 2], name[i + 3]]);
    let quads = len / 16;
    for q in 0..quads {
        let b = q * 16;
        let block = [word(b), word(b + 4), word(b + 8), word(b + 12)];
        rounds(PART_ROUNDS, &block, &mut h0, &mut h1);
    }
    let mut at = quads * 16;
    let mut block = [0u32; 4];
    for slot in block.iter_mut() {
        if len - at >= 4 {
            *slot = word(at);
            at += 4;
        } else {
            let mut v = pad;
            while at < len {
                // `char` is signed on x86: bytes >= 0x80 are sign-extended.
                v = (v << 8) | (name[at] as i8 as i32 as u32);
                at += 1;
            }
            *slot = v;
        }
    }
    rounds(FULL_ROUNDS, &block, &mut h0, &mut h1);
    h0 ^ h1
}

#[cfg(test)]
mod tests {
    use super::dm_hash;

    /// Values printed by GlusterFS's own `gf_dm_hashfn` (hashfn.c built
    /// with gcc on x86_64).
    #[test]
    fn matches_glusterfs() {
        for (name, want) in GLUSTER {
            assert_eq!(dm_hash(name.as_bytes()), *want, "{name:?}");
        }
    }

    const GLUSTER: &[(&str, u32)] = &[
        ("", 0x884774a2),
        ("a", 0x3a17e4e6),
        ("ab", 0xc3af40d9),
        ("abc", 0xba8bd29a),
        ("abcd", 0xd89627f6),
        ("file-1", 0x74375b05),
        ("hello.txt", 0xe68d61cc),
        ("0123456789abcdef", 0x6ecb5ada),
        ("0123456789abcdef0", 0x795ef9c7),
        ("a-much-longer-name-with-many-words.tar.gz", 0x23c15c54),
        ("\u{e9}t\u{e9}", 0xa2e5c9e9),
    ];
}
