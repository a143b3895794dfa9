//! Exports to one path, side by side: the lock an export holds from before it makes any
//! file until its model is in place, the tokens that name its files, and the removal of the
//! files that finished or killed exports left and the model in place does not reference.
use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::storage::external::locations;
use crate::storage::read::read_path;
use crate::storage::temp::{nanos, temp_path};

/// An export in progress: an exclusive lock (`flock`) on `.{name}.{token}.lock` beside the
/// model, taken before the export makes any file with its token and released (the file
/// removed) once its model is in place. A killed export's lock is released by the kernel.
pub(crate) struct ExportLock {
    _file: File,
    path: PathBuf,
    pub(crate) token: String,
}

impl ExportLock {
    pub(crate) fn acquire(target: &Path) -> Result<ExportLock> {
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let err = |p: &Path, e: std::io::Error| Error::export(format!("cannot write {}: {e}", p.display()));
        loop {
            let token = new_token();
            let path = target.with_file_name(format!(".{name}.{token}.lock"));
            // Locked under a temporary name, then given its own: no other export ever sees
            // this lock unheld while this export runs. The temporary name is one that the
            // next export removes if this process is killed (`.{name}.{token}.lock.{pid}…`).
            let tmp = temp_path(&target.with_file_name(format!("{name}.{token}.lock")));
            let file = File::create(&tmp).map_err(|e| err(&tmp, e))?;
            if let Err(e) = flock(&file, LOCK_EX) {
                let _ = fs::remove_file(&tmp);
                return Err(err(&tmp, e));
            }
            // A hard link does not replace a lock of the same token; a file system without
            // hard links gets a rename.
            let placed = match fs::hard_link(&tmp, &path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                Err(_) => Some(fs::rename(&tmp, &path)),
                Ok(()) => Some(Ok(())),
            };
            let _ = fs::remove_file(&tmp);
            match placed {
                None => continue,
                Some(Ok(())) => return Ok(ExportLock { _file: file, path, token }),
                Some(Err(e)) => return Err(err(&path, e)),
            }
        }
    }
}

impl Drop for ExportLock {
    fn drop(&mut self) {
        // Removed while still held; the lock goes with the file descriptor just after.
        let _ = fs::remove_file(&self.path);
    }
}

const LOCK_EX: std::ffi::c_int = 2;

const LOCK_NB: std::ffi::c_int = 4;

fn flock(file: &File, op: std::ffi::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    unsafe extern "C" {
        fn flock(fd: std::ffi::c_int, operation: std::ffi::c_int) -> std::ffi::c_int;
    }
    // SAFETY: flock(2) on a descriptor this `File` owns; it only reads its arguments.
    if unsafe { flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A fresh token for an export's files, `fastseq-` and 8 hex digits: time, process and a
/// counter, mixed (splitmix64), so that threads and processes exporting at once do not
/// collide. The marker keeps a user's `model.onnx.20261203.bak` from looking like ours.
fn new_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut x = (nanos() as u64)
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

/// Removes, beside `path`, the files fastseq exports wrote (`{name}.{token}.…`) that the
/// model now at `path` does not reference, and the locks that killed exports left, but
/// never a file of an export still running (its token's lock is held). Run after every
/// export, so that whatever mix of concurrent, failed and killed exports came before, the
/// folder ends with the model and the data files it references.
pub fn remove_orphans(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let name = name.to_string_lossy().into_owned();
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut files: Vec<(String, String)> = Vec::new();
    let mut locks: HashMap<String, PathBuf> = HashMap::new();
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(token) = token_of(&name, &file).filter(|_| written_by_us(&name, &file)) {
            files.push((file.clone(), token.to_string()));
        } else if let Some(token) = file.strip_prefix('.').and_then(|f| f.strip_suffix(".lock")).and_then(|f| {
            let token = token_of(&name, f)?;
            (f.len() == name.len() + 1 + token.len()).then_some(token)
        }) {
            locks.insert(token.to_string(), e.path());
        }
    }
    // Judged before the model is read: a finished export renames nothing any more, so the
    // model read next says for good whether its files are referenced.
    let mut finished: std::collections::HashSet<String> = std::collections::HashSet::new();
    let tokens: std::collections::HashSet<String> =
        files.iter().map(|(_, t)| t.clone()).chain(locks.keys().cloned()).collect();
    for token in tokens {
        match locks.get(&token) {
            None => {
                finished.insert(token);
            }
            Some(lock) => match File::open(lock) {
                Ok(f) => {
                    if flock(&f, LOCK_EX | LOCK_NB).is_ok() {
                        let _ = fs::remove_file(lock); // its export was killed
                        finished.insert(token);
                    }
                }
                Err(_) => {
                    finished.insert(token); // removed just now: its export finished
                }
            },
        }
    }
    if !files.iter().any(|(_, t)| finished.contains(t)) {
        return;
    }
    let referenced: Vec<String> = match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(_) => return,
        Ok(_) => {
            let Ok(data) = read_path(path) else { return };
            // A file that is not a model (being rewritten by another program): left for
            // the next export to judge.
            let Ok(mut model) = <ModelProto as prost::Message>::decode(data) else { return };
            locations(&mut model)
        }
    };
    for (file, token) in files {
        if finished.contains(&token) && !referenced.contains(&file) {
            let _ = fs::remove_file(dir.join(&file));
        }
    }
}

/// The token of `file` if it is named `{name}.fastseq-{8 hex digits}` or
/// `{name}.fastseq-{8 hex}.…`.
fn token_of<'a>(name: &str, file: &'a str) -> Option<&'a str> {
    let rest = file.strip_prefix(name)?.strip_prefix('.')?;
    let n = TOKEN_MARK.len() + 8;
    let token = rest.get(..n)?;
    let hex = token.strip_prefix(TOKEN_MARK)?;
    (hex.bytes().all(|b| b.is_ascii_hexdigit()) && (rest.len() == n || rest.as_bytes()[n] == b'.')).then_some(token)
}

/// `{name}.fastseq-{8 hex digits}.…`: the names [`write_with_external`] gives its files,
/// so that an export removes only files that an export made.
fn written_by_us(name: &str, location: &str) -> bool {
    !location.contains('/') && token_of(name, location).is_some_and(|t| location.len() > name.len() + 1 + t.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_with_the_marker_are_ours() {
        assert_eq!(token_of("m.onnx", "m.onnx.fastseq-0a1b2c3d.data"), Some("fastseq-0a1b2c3d"));
        assert!(written_by_us("m.onnx", "m.onnx.fastseq-0a1b2c3d.data"));
        assert!(written_by_us("m.onnx", "m.onnx.fastseq-0a1b2c3d.0.a.bin"));
        assert_eq!(token_of("m.onnx", "m.onnx.fastseq-0a1b2c3d"), Some("fastseq-0a1b2c3d"));
        assert!(!written_by_us("m.onnx", "m.onnx.fastseq-0a1b2c3d"));
        for theirs in [
            "m.onnx.20261203.bak",
            "m.onnx.deadbeef.data",
            "m.onnx.fastseq-0a1b2c3z.data",
            "m.onnx.fastseq-é",
            "m.onnx.fastseq-0a1b2c3d/x",
        ] {
            assert!(!written_by_us("m.onnx", theirs), "{theirs}");
        }
        let a = new_token();
        assert!(a.starts_with(TOKEN_MARK) && a.len() == TOKEN_MARK.len() + 8 && a != new_token());
    }

    #[test]
    fn orphans_of_a_running_export_are_left_alone_until_its_lock_is_released() {
        let dir = std::env::temp_dir().join(format!(
            "fastseq-orphans-{}-{}",
            std::process::id(),
            crate::storage::temp::nanos()
        ));
        fs::create_dir(&dir).unwrap();
        let model = dir.join("m.onnx");
        let empty = ModelProto { ir_version: Some(8), ..Default::default() };
        fs::write(&model, prost::Message::encode_to_vec(&empty)).unwrap(); // references nothing
        let data = dir.join("m.onnx.fastseq-00000001.data");
        let lock_path = dir.join(".m.onnx.fastseq-00000001.lock");
        fs::write(&data, b"x").unwrap();
        let lock = File::create(&lock_path).unwrap();
        flock(&lock, LOCK_EX).unwrap();
        remove_orphans(&model);
        assert!(data.exists() && lock_path.exists(), "a running export's files stay");
        drop(lock); // as if its process were killed: the lock file stays, unheld
        remove_orphans(&model);
        assert!(!data.exists() && !lock_path.exists(), "a killed export's files go");
        fs::remove_dir_all(&dir).unwrap();
    }
}
