//! Which data files beside a model the writer made.
//!
//! A data file gets its plain name (`model.onnx.data`, or the `location` asked for) when that
//! name is free or holds the writer's own earlier file; a user's file of that name is never
//! overwritten or removed, and the data file then gets a token name
//! (`model.onnx.fastseq-1a2b3c4d.data`) that no user file has. To tell them apart, each data
//! file the writer places carries an extended attribute recording the model it belongs to,
//! the names the writer may give it, and its identity when it was written (device, inode,
//! size, modification time). A file is the writer's only while all of these hold: a copy, a
//! file the user renamed, rewrote or replaced, or one on a file system without extended
//! attributes (where the writer keeps to token names) is not.
use std::ffi::CStr;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const KEY: &CStr = c"user.fastseq.data";
const VERSION: &str = "fastseq-data 1";

fn identity(meta: &fs::Metadata) -> String {
    format!("{}:{}:{}:{}.{}", meta.dev(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec())
}

/// Records on `file` (written and synced: its size and time are final) that it is a data
/// file of the model named `model`, to be named one of `names` (relative to the model's
/// folder). Returns false where the file system keeps no extended attributes.
pub(crate) fn mark(file: &File, model: &str, names: &[&str]) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(meta) = file.metadata() else { return false };
    let mut value = vec![VERSION.to_string(), model.to_string(), identity(&meta)];
    value.extend(names.iter().map(|n| n.to_string()));
    let value = value.join("\0");
    // SAFETY: fsetxattr(2) on a descriptor `file` owns, with a NUL-terminated name and a
    // buffer of the length given; it only reads them.
    let done = unsafe { libc::fsetxattr(file.as_raw_fd(), KEY.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    done == 0
}

/// What is at a location: nothing, a file the writer made for a model, or anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    Nothing,
    Ours,
    Theirs,
}

/// Whether `location` (relative to `folder`) is a data file that the writer made for the
/// model named `model` and that nobody changed, renamed or replaced since. Links are not
/// followed: a link is never ours.
pub(crate) fn is_ours(folder: &Path, location: &str, model: &str) -> bool {
    found(folder, location, model) == Found::Ours
}

/// What is at `location` (relative to `folder`) for the model named `model` (see
/// [`is_ours`]), as it was at one instant. Other writers rename whole, marked files over the
/// name at any moment, outside any lock a reader holds: the answer comes from one open file,
/// whose identity and mark are read through its descriptor, never from two lookups of the
/// name that may each find another file (a file's identity beside the next one's mark, or
/// nothing there, then a file).
pub(crate) fn found(folder: &Path, location: &str, model: &str) -> Found {
    use std::os::unix::fs::OpenOptionsExt;
    let path = folder.join(location);
    match fs::symlink_metadata(&path) {
        Ok(meta) if !meta.is_file() => return Found::Theirs, // a link, a folder, a pipe: not opened
        Ok(_) => {}
        Err(e) if gone(&e) => return Found::Nothing,
        Err(_) => return Found::Theirs,
    }
    // Non-blocking, not following a link: whatever was renamed over the name since it was
    // looked at opens without waiting, and is judged on its descriptor below.
    let mut open = fs::OpenOptions::new();
    open.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = match open.open(&path) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Found::Nothing, // removed since: nothing there now
        Err(_) => return Found::Theirs,              // a link put there since, or unreadable
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() && marked_for(&file, &meta, location, model) => Found::Ours,
        _ => Found::Theirs,
    }
}

fn gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// Whether the open `file` (`meta`: its metadata) carries the mark of a data file of `model`
/// named `location`, made for this very file.
fn marked_for(file: &File, meta: &fs::Metadata, location: &str, model: &str) -> bool {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 4096];
    // SAFETY: fgetxattr(2) on a descriptor `file` owns, with a NUL-terminated name and a
    // buffer of the length given, which it fills with at most that many bytes.
    let n = unsafe { libc::fgetxattr(file.as_raw_fd(), KEY.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let Ok(n) = usize::try_from(n) else { return false };
    let Ok(value) = std::str::from_utf8(&buf[..n]) else { return false };
    let mut parts = value.split('\0');
    parts.next() == Some(VERSION)
        && parts.next() == Some(model)
        && parts.next() == Some(identity(meta).as_str())
        && parts.any(|name| name == location)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_marked_file_is_ours_until_it_is_renamed_rewritten_or_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx.data");
        let mut f = fs::OpenOptions::new().create(true).truncate(true).write(true).read(true).open(&path).unwrap();
        f.write_all(b"weights").unwrap();
        if !mark(&f, "m.onnx", &["m.onnx.data", "m.onnx.fastseq-00000001.data"]) {
            return; // no extended attributes here: nothing is ever ours by name
        }
        assert!(is_ours(dir.path(), "m.onnx.data", "m.onnx"));
        assert!(!is_ours(dir.path(), "m.onnx.data", "other.onnx"), "another model's");
        fs::hard_link(&path, dir.path().join("m.onnx.fastseq-00000001.data")).unwrap();
        assert!(is_ours(dir.path(), "m.onnx.fastseq-00000001.data", "m.onnx"), "a name it may have");
        fs::rename(dir.path().join("m.onnx.fastseq-00000001.data"), dir.path().join("backup.data")).unwrap();
        assert!(!is_ours(dir.path(), "backup.data", "m.onnx"), "renamed by the user");
        fs::copy(&path, dir.path().join("copy")).unwrap();
        fs::rename(dir.path().join("copy"), &path).unwrap();
        assert!(!is_ours(dir.path(), "m.onnx.data", "m.onnx"), "replaced by a copy");
        let mut f = fs::OpenOptions::new().create(true).truncate(true).write(true).open(&path).unwrap();
        f.write_all(b"weights").unwrap();
        assert!(mark(&f, "m.onnx", &["m.onnx.data"]));
        assert!(is_ours(dir.path(), "m.onnx.data", "m.onnx"));
        std::thread::sleep(std::time::Duration::from_millis(5));
        f.write_all(b"!").unwrap();
        assert!(!is_ours(dir.path(), "m.onnx.data", "m.onnx"), "rewritten in place");
        std::os::unix::fs::symlink(&path, dir.path().join("link")).unwrap();
        assert!(!is_ours(dir.path(), "link", "m.onnx"));
    }
}
