//! Reading files into memory fastseq owns, and the identity of a file's contents (what
//! tells a file that was rewritten or replaced since it was read).
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use bytes::Bytes;

use crate::error::{Error, Result};

/// What identifies a file's contents without reading them: a rewrite in place changes the
/// size or the times (`ctime` even when `mtime` is put back), a replacement the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Identity {
    pub fn of(meta: &fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }

    /// The identity of the file at `path` now (links followed).
    pub fn at(path: &Path) -> std::io::Result<Identity> {
        fs::metadata(path).map(|m| Identity::of(&m))
    }

    /// As text, to travel with a tensor that still points at its file (see `external`).
    pub fn encode(&self) -> String {
        format!("{}:{}:{}:{}:{}", self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)
    }

    pub fn decode(text: &str) -> Option<Identity> {
        let mut it = text.split(':');
        let id = Identity {
            dev: it.next()?.parse().ok()?,
            ino: it.next()?.parse().ok()?,
            size: it.next()?.parse().ok()?,
            mtime_ns: it.next()?.parse().ok()?,
            ctime_ns: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(id)
    }
}

/// The error for a source that is not what it was when it was read.
pub fn changed(shown: &dyn std::fmt::Display, when: &str) -> Error {
    Error::load(format!(
        "{shown}: the file changed {when} (rewritten or replaced by another program); \
         load it again once it is written"
    ))
}

/// Reads a whole file into memory that fastseq owns. Sources are read rather than mapped:
/// a mapped file that another program truncates (as `onnx.save` does when it rewrites a
/// model in place) turns the next access into SIGBUS, and a same-size rewrite would change
/// a pipeline's weights under it. Memory the process owns cannot change; the peak RSS is
/// the same as a mapping's (touched file pages count too). Measured in SECURITY.md.
pub fn read_path(path: &Path) -> Result<Bytes> {
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| Error::load(format!("{shown}: cannot read: {e}")))?;
    if meta.is_dir() {
        return Err(Error::load(format!("{shown}: is a directory, not an ONNX file")));
    }
    if meta.len() == 0 {
        return Err(Error::load(format!("{shown}: empty file (0 bytes), not an ONNX model")));
    }
    let file = File::open(path).map_err(|e| Error::load(format!("{shown}: cannot open: {e}")))?;
    read_range(&file, &shown, 0, None).map(|(data, _)| data)
}

/// Reads of at least this many bytes get an anonymous mapping of their own (see [`read_range`]).
const OWN_MAPPING_MIN: usize = 1 << 20;

/// Memory read from a file, held by this process alone.
enum Owned {
    Heap(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        match self {
            Owned::Heap(v) => v,
            Owned::Mapped(m) => m,
        }
    }
}

/// Reads `len` bytes at `offset` of `file` (to its end when `len` is None) into memory this
/// process owns, and checks that the file did not change while it was read; returns the
/// bytes and the file's identity. Running out of memory is an error, not an abort.
///
/// Large reads go into an anonymous mapping (memory, not a view of the file: nothing another
/// program does to the file reaches it) rather than the allocator's heap, so that dropping
/// them gives the memory back to the system at once: mimalloc keeps freed blocks for reuse,
/// which would keep a spilled pipeline's sources (see `spill`) counted in its RSS.
pub fn read_range(
    file: &File,
    shown: &dyn std::fmt::Display,
    offset: u64,
    len: Option<u64>,
) -> Result<(Bytes, Identity)> {
    let io = |e: std::io::Error| Error::load(format!("{shown}: cannot read: {e}"));
    let before = Identity::of(&file.metadata().map_err(io)?);
    let len = match len {
        Some(l) => l,
        None => before.size.saturating_sub(offset),
    };
    if offset.checked_add(len).is_none_or(|end| end > before.size) {
        return Err(Error::load(format!(
            "{shown}: {len} bytes at offset {offset} lie past its end ({} bytes)",
            before.size
        )));
    }
    let n = usize::try_from(len).map_err(|_| Error::load(format!("{shown}: {len} bytes do not fit in memory")))?;
    let no_memory = || Error::load(format!("{shown}: cannot allocate {n} bytes to read it (out of memory)"));
    let mut reader = file;
    reader.seek(SeekFrom::Start(offset)).map_err(io)?;
    let owned = if n >= OWN_MAPPING_MIN {
        let mut map = memmap2::MmapMut::map_anon(n).map_err(|_| no_memory())?;
        reader.read_exact(&mut map).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => changed(shown, "while it was read (it got shorter)"),
            _ => io(e),
        })?;
        Owned::Mapped(map.make_read_only().map_err(io)?)
    } else {
        let mut buf = Vec::new();
        buf.try_reserve_exact(n).map_err(|_| no_memory())?;
        // Read into the reserved capacity: no zeroing of memory about to be overwritten.
        reader.take(len).read_to_end(&mut buf).map_err(io)?;
        if buf.len() != n {
            return Err(changed(shown, "while it was read (it got shorter)"));
        }
        Owned::Heap(buf)
    };
    if Identity::of(&file.metadata().map_err(io)?) != before {
        return Err(changed(shown, "while it was read"));
    }
    Ok((Bytes::from_owner(owned), before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_as_text() {
        let id = Identity { dev: 1, ino: 2, size: 3, mtime_ns: -4, ctime_ns: 5_000_000_000_123 };
        assert_eq!(Identity::decode(&id.encode()), Some(id));
        assert_eq!(Identity::decode("1:2:3"), None);
        assert_eq!(Identity::decode("1:2:3:4:5:6"), None);
    }
}
