//! Temporary files and staging folders beside a target, and the removal of those that killed
//! writers left.
//!
//! A writer's temporary file is `.{name}.{token}.{what}.tmp` and a staging folder (where
//! another program, onnx or ONNX Runtime, writes a model for the writer to commit) is
//! `.{name}.{token}.staging`, both beside the target `name`. Each is created under the export
//! lock and `flock`ed by its writer (a staging folder through a file inside) until it is
//! renamed or removed: one that nobody holds belongs to a writer that was killed, and any
//! export into the folder removes it.
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::storage::export_lock::{flock, is_held, LOCK_EX};
use crate::storage::token::leading_token;

/// A temporary file that this writer holds; removed when dropped unless [`Temp::disarm`]ed
/// (once renamed into place).
pub(crate) struct Temp {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    armed: bool,
}

impl Temp {
    /// Creates and locks `.{name}.{token}.{what}.tmp` beside `target`. Call under the export lock.
    pub(crate) fn create(target: &Path, token: &str, what: &str) -> std::io::Result<Temp> {
        let path = target.with_file_name(temp_name(target, token, &format!("{what}.tmp")));
        let file = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let temp = Temp { file, path, armed: true };
        flock(&temp.file, LOCK_EX)?;
        Ok(temp)
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The file in a staging folder whose lock says its writer is alive.
const HELD: &str = ".held";

/// A staging folder that this writer holds; removed with what it holds when dropped.
pub struct Staging {
    path: PathBuf,
    target: PathBuf,
    _lock: File,
}

impl Staging {
    /// Creates and locks `.{name}.{token}.staging` beside `target`. Call under the export lock.
    pub(crate) fn create(target: &Path, token: &str) -> std::io::Result<Staging> {
        let path = target.with_file_name(temp_name(target, token, "staging"));
        fs::create_dir(&path)?;
        // Held through a file inside: the folder itself is the export lock of what is
        // written into it (the core's own writes into a staging folder take it).
        let lock = File::create(path.join(HELD)).and_then(|f| flock(&f, LOCK_EX).map(|_| f));
        match lock {
            Ok(lock) => Ok(Staging { path, target: target.to_path_buf(), _lock: lock }),
            Err(e) => {
                let _ = fs::remove_dir_all(&path);
                Err(e)
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file whose model this folder stages.
    pub fn target(&self) -> &Path {
        &self.target
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The longest file name the file systems fastseq writes to take, in bytes (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `.{name}.{token}.{suffix}` beside `target` (the target's name shows what is being
/// written), or `.{token}.{suffix}` when that would be longer than a file name may be: a
/// target of a legal name of up to 255 bytes can always be written.
fn temp_name(target: &Path, token: &str, suffix: &str) -> String {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let long = format!(".{name}.{token}.{suffix}");
    if long.len() <= NAME_MAX {
        long
    } else {
        format!(".{token}.{suffix}")
    }
}

/// Whether `file` is named like a writer's temporary file or staging folder (a dot, a
/// token, `.tmp` or `.staging` at the end; see [`temp_name`]).
fn is_temp_name(file: &str) -> bool {
    let Some(rest) = file.strip_prefix('.') else { return false };
    if !(rest.ends_with(".tmp") || rest.ends_with(".staging")) {
        return false;
    }
    leading_token(rest).is_some()
        || rest.match_indices(".fastseq-").any(|(i, _)| leading_token(&rest[i + 1..]).is_some())
}

/// Removes the temporary files and staging folders in `folder` that no live writer holds.
/// Call under the export lock (a new one is locked before that lock is released).
pub(crate) fn remove_stale(folder: &Path) {
    let Ok(entries) = fs::read_dir(folder) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if !is_temp_name(&file) {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() && !is_held(&e.path().join(HELD)) => {
                let _ = fs::remove_dir_all(e.path());
            }
            Ok(t) if t.is_file() && !is_held(&e.path()) => {
                let _ = fs::remove_file(e.path());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unheld_temporary_names_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("m.onnx");
        let live = Temp::create(&target, "fastseq-0000000a", "data").unwrap();
        let staging = Staging::create(&target, "fastseq-0000000b").unwrap();
        fs::write(staging.path().join("inside"), b"x").unwrap();
        // A killed writer's: nobody holds them (the short names are a long target's).
        fs::write(dir.path().join(".m.onnx.fastseq-0000000c.model.tmp"), b"x").unwrap();
        fs::write(dir.path().join(".fastseq-0000000f.model.tmp"), b"x").unwrap();
        fs::create_dir(dir.path().join(".fastseq-00000010.staging")).unwrap();
        fs::create_dir(dir.path().join(".m.onnx.fastseq-0000000d.staging")).unwrap();
        let theirs = [".m.onnx.tmp", ".m.onnx.fastseq-zz.tmp", "m.onnx.fastseq-0000000e.tmp", ".hidden.staging"];
        for t in theirs {
            fs::write(dir.path().join(t), b"user").unwrap();
        }
        remove_stale(dir.path());
        let mut left: Vec<String> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        let mut want: Vec<String> = theirs.iter().map(|s| s.to_string()).collect();
        want.push(".m.onnx.fastseq-0000000a.data.tmp".into());
        want.push(".m.onnx.fastseq-0000000b.staging".into());
        want.sort();
        assert_eq!(left, want);
        drop((live, staging));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), theirs.len(), "a writer's own are removed when dropped");
    }

    #[test]
    fn a_target_of_the_longest_legal_name_gets_short_temporary_names() {
        let dir = tempfile::tempdir().unwrap();
        for len in [200, 227, 228, 255] {
            let target = dir.path().join("m".repeat(len));
            let temp = Temp::create(&target, "fastseq-0000000a", "model").unwrap();
            let staging = Staging::create(&target, "fastseq-0000000b").unwrap();
            for made in [&temp.path, staging.path()] {
                let name = made.file_name().unwrap().to_string_lossy().into_owned();
                assert!(name.len() <= NAME_MAX && is_temp_name(&name), "{name}");
                if len == 200 {
                    assert!(name.starts_with(&format!(".{}.fastseq-", "m".repeat(len))), "{name}");
                }
                if len == 255 {
                    assert!(name.starts_with(".fastseq-"), "{name}");
                }
            }
        }
    }
}
