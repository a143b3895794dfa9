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

#[cfg(test)]
mod tests {
    use super::*;

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
