//! Tokens: the mark in the names of a writer's temporary files, staging folders and data
//! files that could not take their plain name (`{name}.fastseq-0a1b2c3d.data`), which tells
//! them from a user's files and from another writer's.

/// A fresh token for a writer's files, `fastseq-` and 8 hex digits: time, process and a
/// counter, mixed (splitmix64), so that threads and processes writing at once do not
/// collide. The marker keeps a user's `model.onnx.20261203.bak` from looking like ours.
pub(crate) fn new_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos());
    let mut x = (nanos.unwrap_or(0) as u64)
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    format!("{TOKEN_MARK}{:08x}", x as u32)
}

const TOKEN_MARK: &str = "fastseq-";

/// The token in `text` if it starts with `fastseq-{8 hex digits}` followed by its end or a dot.
pub(crate) fn leading_token(text: &str) -> Option<&str> {
    let n = TOKEN_MARK.len() + 8;
    let token = text.get(..n)?;
    let hex = token.strip_prefix(TOKEN_MARK)?;
    (hex.bytes().all(|b| b.is_ascii_hexdigit()) && (text.len() == n || text.as_bytes()[n] == b'.')).then_some(token)
}

/// The longest target name that the token names of its data files keep whole.
const STEM_MAX: usize = 200;

/// What the token names of `name`'s data files start with: `name` itself, or, for a name
/// longer than [`STEM_MAX`] bytes (a legal file name has up to 255), its first bytes and a
/// digest of the whole (`{cut}~{8 hex digits}`), so that `{stem}.fastseq-0a1b2c3d.data` is
/// a legal name too and two long names that share their first bytes keep apart.
pub(crate) fn token_stem(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= STEM_MAX {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut cut = STEM_MAX - 9;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as u32;
    std::borrow::Cow::Owned(format!("{}~{digest:08x}", &name[..cut]))
}

/// `{stem}.fastseq-{8 hex digits}.…` (see [`token_stem`]): the names the writer gives the
/// data files of `name` when it cannot give them their plain name, and the links of a reuse
/// export.
pub(crate) fn token_named(name: &str, file: &str) -> bool {
    let stem = token_stem(name);
    let Some(rest) = file.strip_prefix(&*stem).and_then(|r| r.strip_prefix('.')) else { return false };
    !file.contains('/') && leading_token(rest).is_some_and(|t| rest.len() > t.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_with_the_marker_are_token_named() {
        assert!(token_named("m.onnx", "m.onnx.fastseq-0a1b2c3d.data"));
        assert!(token_named("m.onnx", "m.onnx.fastseq-0a1b2c3d.0.a.bin"));
        assert!(!token_named("m.onnx", "m.onnx.fastseq-0a1b2c3d"));
        for theirs in [
            "m.onnx.20261203.bak",
            "m.onnx.deadbeef.data",
            "m.onnx.fastseq-0a1b2c3z.data",
            "m.onnx.fastseq-é",
            "m.onnx.fastseq-0a1b2c3d/x",
            "n.onnx.fastseq-0a1b2c3d.data",
        ] {
            assert!(!token_named("m.onnx", theirs), "{theirs}");
        }
        // A long name's stem: a legal name with room for the token, apart from a look-alike's.
        let long = format!("{}.onnx", "é".repeat(120));
        let stem = token_stem(&long);
        assert!(stem.len() <= STEM_MAX && stem.len() + 22 <= 255);
        assert!(token_named(&long, &format!("{stem}.fastseq-0a1b2c3d.data")));
        let other = format!("{}.onnx", "é".repeat(121));
        assert!(!token_named(&other, &format!("{stem}.fastseq-0a1b2c3d.data")));
        assert_eq!(token_stem("m.onnx"), "m.onnx");
        let a = new_token();
        assert!(a.starts_with(TOKEN_MARK) && a.len() == TOKEN_MARK.len() + 8 && a != new_token());
    }
}
