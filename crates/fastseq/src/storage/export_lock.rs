//! The export lock: an exclusive `flock` on the folder a model is written into, held while a
//! writer makes a file there, names its data files and puts its model in place, and while
//! the files of killed and earlier writers are removed. Writers of one folder therefore see
//! each other only before or after their commit, never half-way through. The lock is the
//! folder itself, not a lock file, so nothing is left behind; a killed writer's lock goes
//! with its process.
//!
//! The slow part of a write (gigabytes of weights into a temporary file) runs outside the
//! lock; that file is `flock`ed by its writer from its creation (under the lock) to its
//! rename, so that a clean-up can tell a live writer's file from a killed one's.
use std::fs::{self, File};
use std::path::Path;

use crate::error::{Error, Result};

/// The export lock of one folder, held until dropped.
pub(crate) struct ExportLock {
    _folder: File,
}

impl ExportLock {
    /// Waits for the lock of `folder`; errors name `target`, the file being written.
    pub(crate) fn acquire(folder: &Path, target: &Path) -> Result<ExportLock> {
        let err = |e: std::io::Error| Error::export(format!("cannot write {}: {e}", target.display()));
        let dir = File::open(folder).map_err(err)?;
        match flock(&dir, LOCK_EX) {
            Ok(()) => Ok(ExportLock { _folder: dir }),
            // NFS emulates flock with byte-range locks, which a folder (never open for
            // writing) cannot take: a lock file there instead, left in place.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ENOLCK | libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                let mut open = fs::OpenOptions::new();
                let file = open.read(true).write(true).create(true).truncate(false);
                let file = file.open(folder.join(FALLBACK)).map_err(err)?;
                flock(&file, LOCK_EX).map_err(err)?;
                Ok(ExportLock { _folder: file })
            }
            Err(e) => Err(err(e)),
        }
    }
}

/// The lock file of a folder whose file system cannot lock the folder itself.
const FALLBACK: &str = ".fastseq.lock";

pub(crate) const LOCK_EX: std::ffi::c_int = libc::LOCK_EX;

/// Whether the file at `path` is `flock`ed by another open file (a live writer's). A file
/// that is not there is not held.
pub(crate) fn is_held(path: &Path) -> bool {
    // Open for writing where it can be: NFS's emulated flock needs it for an exclusive lock.
    match fs::OpenOptions::new().read(true).write(true).open(path).or_else(|_| File::open(path)) {
        // Released when `f` is closed, just after.
        Ok(f) => flock(&f, LOCK_EX | libc::LOCK_NB).is_err(),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound, // unreadable: not ours to judge
    }
}

pub(crate) fn flock(file: &File, op: std::ffi::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock(2) on a descriptor this `File` owns; it only reads its arguments.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

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

/// `{name}.fastseq-{8 hex digits}.…`: the names the writer gives the data files of `name`
/// when it cannot give them their plain name, and the links of a reuse export.
pub(crate) fn token_named(name: &str, file: &str) -> bool {
    let Some(rest) = file.strip_prefix(name).and_then(|r| r.strip_prefix('.')) else { return false };
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
        let a = new_token();
        assert!(a.starts_with(TOKEN_MARK) && a.len() == TOKEN_MARK.len() + 8 && a != new_token());
    }

    #[test]
    fn a_held_lock_is_seen_and_a_released_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        assert!(!is_held(&path));
        let f = File::open(&path).unwrap();
        flock(&f, LOCK_EX).unwrap();
        assert!(is_held(&path));
        drop(f); // as if its process were killed
        assert!(!is_held(&path));
        let lock = ExportLock::acquire(dir.path(), &path).unwrap();
        assert!(is_held(dir.path()), "the folder itself is the lock");
        drop(lock);
        assert!(!is_held(dir.path()));
        assert!(!is_held(&dir.path().join("gone")));
    }
}
