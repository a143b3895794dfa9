//! Committing a write: what every writer does under the export lock once its bytes are on
//! disk. Data files are placed first, each under its plain name when that is free (the
//! writer's own earlier file there is replaced in a second step, below), else under a token
//! name; the model is renamed over the target last; then the files of earlier and killed
//! writes that the new model does not reference are removed.
//!
//! Replacing the writer's own `model.onnx.data` cannot be one rename: the old model, still in
//! place, reads that file. So the new data file is placed under its token name and a model
//! referring to it is put in place first; only then is the old file removed, the new one
//! linked under the plain name and the model written again to refer to it. Killed at any
//! step, the model in place refers to data that is there, and the next write removes what is
//! left over (a token name, or a file marked as the writer's that nothing refers to).
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use crate::codec::proto::ModelProto;
use crate::codec::stream::write_streaming;
use crate::codec::tensor::{for_each_tensor, is_external};
use crate::error::{Error, Result};
use crate::storage::export_lock::ExportLock;
use crate::storage::ownership::{found, is_ours, mark, Found};
use crate::storage::temp::{remove_stale, Staging, Temp};
use crate::storage::token::{token_named, token_stem};

/// Turns the protobuf encoding of the model to commit into the bytes to write (a text
/// format); called under the export lock.
pub type Encoder<'a> = dyn FnMut(Vec<u8>) -> Result<Vec<u8>> + 'a;

/// What a write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub model_bytes: u64,
    pub data_bytes: u64,
    /// The data files the model refers to, relative to its folder.
    pub data_files: Vec<String>,
}

/// The file a writer writes, checked before anything is written.
pub(crate) struct Target {
    pub(crate) path: PathBuf,
    pub(crate) folder: PathBuf,
    pub(crate) name: String,
    /// A file written beside another (`owner`, its name in the same folder: a pipeline
    /// file's stage models): it replaces only a file the writer made for that owner.
    pub(crate) owner: Option<String>,
}

/// The name a file written beside `owner` is marked with: no file is named so (a `/`), so
/// that neither the owner's writes nor any other take it for one of their data files.
fn beside_mark(owner: &str) -> String {
    format!("{owner}/")
}

impl Target {
    pub(crate) fn new(path: &Path) -> Result<Target> {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Err(Error::export(format!("cannot write {}: not a file name", path.display())));
        };
        let folder = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Named here: the writer's first file is a temporary one, whose name would mislead.
        if !folder.is_dir() {
            return Err(Error::export(format!(
                "cannot write {}: the folder {} does not exist",
                path.display(),
                folder.display()
            )));
        }
        let target = Target { path: path.to_path_buf(), folder, name, owner: None };
        target.check_kind()?;
        Ok(target)
    }

    /// A file written beside `owner` (see [`Target::owner`]), checked as [`Target::new`] does
    /// and refused when a file the writer did not make for `owner` is there.
    pub(crate) fn beside(path: &Path, owner: &str) -> Result<Target> {
        let mut target = Target::new(path)?;
        target.owner = Some(owner.to_string());
        target.check_kind()?;
        Ok(target)
    }

    /// Marks a file written for a [`Target::beside`] target as the writer's (synced: its
    /// size and time are final); nothing for other targets.
    pub(crate) fn mark(&self, file: &fs::File) {
        if let Some(owner) = &self.owner {
            mark(file, &beside_mark(owner), &[&self.name]);
        }
    }

    pub(crate) fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::export(format!("cannot write {}: {e}", self.path.display()))
    }

    /// A file there now must be one a model can replace: not a folder, a device or a pipe,
    /// nor a file this process may not write (`onnx.save` would fail on it: EACCES, EROFS);
    /// beside an owner, only a file the writer made for it. A link is replaced, never
    /// followed.
    fn check_kind(&self) -> Result<()> {
        match fs::metadata(&self.path) {
            Ok(m) if m.is_dir() => return Err(self.err("it is a directory")),
            Ok(m) if !m.is_file() => return Err(self.err("it is not a regular file")),
            Ok(_) => {
                if let Err(e) = writable(&self.path) {
                    return Err(self.err(format!("it is read-only ({e})")));
                }
            }
            Err(_) => {}
        }
        if let Some(owner) = &self.owner {
            // One look at what is there: other writers rename their files over it at any
            // moment (see `found`), and this check also runs outside the export lock.
            if found(&self.folder, &self.name, &beside_mark(owner)) == Found::Theirs {
                return Err(self.err(format!(
                    "a file that fastseq did not write for {owner} is there; move it away or write {owner} elsewhere"
                )));
            }
        }
        Ok(())
    }

    /// A temporary file for this target, made under the export lock.
    pub(crate) fn temp(&self, token: &str, what: &str) -> Result<Temp> {
        let _lock = ExportLock::acquire(&self.folder, &self.path)?;
        remove_stale(&self.folder);
        Temp::create(&self.path, token, what).map_err(|e| self.err(e))
    }

    /// A staging folder for this target, made under the export lock.
    pub(crate) fn staging(&self, token: &str) -> Result<Staging> {
        let _lock = ExportLock::acquire(&self.folder, &self.path)?;
        remove_stale(&self.folder);
        Staging::create(&self.path, token).map_err(|e| self.err(e))
    }
}

/// Whether this process may write the file at `path` (`access(2)`: root may write any file
/// on a writable file system).
fn writable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: access(2) with a NUL-terminated path; it reads only the string.
    match unsafe { libc::access(c.as_ptr(), libc::W_OK) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A data file written, synced and (where it could be) marked as the writer's, waiting to
/// be placed beside the model.
pub(crate) struct DataFile {
    /// Where it is now: a temporary file or a staging folder.
    pub(crate) path: PathBuf,
    pub(crate) temp: Option<Temp>,
    /// The location the model's tensors give it now.
    pub(crate) placeholder: String,
    /// Its plain name, relative to the model's folder: None when it could not be marked.
    pub(crate) preferred: Option<String>,
    /// Its token name.
    pub(crate) fallback: String,
    pub(crate) len: u64,
}

/// The model to commit.
pub(crate) enum Model<'a, 'e> {
    /// Written already, to a file beside the target, with no data files.
    Written { path: PathBuf, temp: Option<Temp>, len: u64 },
    /// Encoded under the lock, once its data files are named; `link` links the sources'
    /// data files that its tensors still point at (see [`link_sources`]).
    Header { model: Box<ModelProto>, encode: Option<&'a mut Encoder<'e>>, link: bool },
}

/// Places `data` and `model` at `target` (see the module's notes) and returns what was written.
pub(crate) fn commit(target: &Target, token: &str, mut model: Model<'_, '_>, mut data: Vec<DataFile>) -> Result<Saved> {
    let _lock = ExportLock::acquire(&target.folder, &target.path)?;
    remove_stale(&target.folder);
    target.check_kind()?;
    let folder = &target.folder;
    let mut made: Vec<PathBuf> = Vec::new(); // removed if the commit fails
    let mut names: Vec<(String, String)> = Vec::new(); // placeholder -> name
    let mut later: Vec<(usize, String)> = Vec::new(); // data files whose plain name holds our old file
    let mut links: Vec<String> = Vec::new(); // the sources' data files linked beside the model
    let result = (|| -> Result<(u64, (u64, u64))> {
        for (i, d) in data.iter_mut().enumerate() {
            let mut name = d.fallback.clone();
            if let Some(p) = d.preferred.as_ref().filter(|p| **p != target.name) {
                if let Some(link) = linked_folder(folder, p) {
                    return Err(target.err(format!(
                        "its data file {p} would be written through {}, a symbolic link: fastseq writes no file \
                         through a link (the export would leave its folder); give a location in real folders",
                        link.display()
                    )));
                }
                if fs::symlink_metadata(folder.join(p)).is_err() && make_parent(folder, p) {
                    name = p.clone();
                } else if is_ours(folder, p, &target.name) {
                    later.push((i, p.clone()));
                }
            }
            let placed = match rename_new(&d.path, &folder.join(&name)) {
                // Taken just now by another program: the token name is free.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && name != d.fallback => {
                    name = d.fallback.clone();
                    rename_new(&d.path, &folder.join(&name))
                }
                other => other,
            };
            placed.map_err(|e| target.err(format!("cannot place its data file {name}: {e}")))?;
            made.push(folder.join(&name));
            if let Some(t) = d.temp.as_mut() {
                t.disarm();
            }
            names.push((d.placeholder.clone(), name));
        }
        match &mut model {
            Model::Written { path, temp, len } => {
                let id = identity(path).map_err(|e| target.err(e))?;
                fs::rename(&*path, &target.path).map_err(|e| target.err(e))?;
                if let Some(t) = temp.as_mut() {
                    t.disarm();
                }
                Ok((*len, id))
            }
            Model::Header { model, encode, link } => {
                if *link {
                    for l in link_sources(model, &target.path, token)? {
                        links.extend(l.file_name().map(|n| n.to_string_lossy().into_owned()));
                        made.push(l);
                    }
                }
                relocate(model, &names);
                write_model(target, token, model, encode)
            }
        }
    })();
    let (mut model_bytes, mut written) = match result {
        Ok(r) => r,
        Err(e) => {
            made.iter().for_each(|m| drop(fs::remove_file(m)));
            return Err(e);
        }
    };
    if let (Model::Header { model, encode, .. }, false) = (&mut model, later.is_empty()) {
        if let Some((n, id)) = take_plain_names(target, token, model, encode, &data, &later, &mut names) {
            (model_bytes, written) = (n, id);
        }
    }
    let data_files: Vec<String> = names.into_iter().map(|(_, n)| n).collect();
    remove_orphans(target, &[&data_files[..], &links[..]].concat(), written);
    Ok(Saved { model_bytes, data_bytes: data.iter().map(|d| d.len).sum(), data_files })
}

/// The second step for the data files whose plain name held the writer's old file (see the
/// module's notes): the old file goes, the new one is linked under the plain name, the model
/// is written again to refer to it. Returns the model's size and identity if it was; on any
/// failure the model in place keeps referring to the token names.
fn take_plain_names(
    target: &Target,
    token: &str,
    model: &mut ModelProto,
    encode: &mut Option<&mut Encoder<'_>>,
    data: &[DataFile],
    later: &[(usize, String)],
    names: &mut [(String, String)],
) -> Option<(u64, (u64, u64))> {
    let folder = &target.folder;
    let mut linked: Vec<PathBuf> = Vec::new();
    for (i, plain) in later {
        let old = folder.join(plain);
        // Checked again: the lock keeps other writers out, not other programs.
        let ok = is_ours(folder, plain, &target.name)
            && fs::remove_file(&old).is_ok()
            && fs::hard_link(folder.join(&data[*i].fallback), &old).is_ok();
        if !ok {
            linked.iter().for_each(|l| drop(fs::remove_file(l)));
            return None;
        }
        linked.push(old);
    }
    let renamed: Vec<(String, String)> =
        later.iter().map(|(i, plain)| (data[*i].fallback.clone(), plain.clone())).collect();
    relocate(model, &renamed);
    match write_model(target, token, model, encode) {
        Ok(written) => {
            for (i, plain) in later {
                let _ = fs::remove_file(folder.join(&data[*i].fallback));
                names[*i].1 = plain.clone();
            }
            Some(written)
        }
        Err(_) => {
            linked.iter().for_each(|l| drop(fs::remove_file(l)));
            None
        }
    }
}

/// The first folder of `location` (`sub/w.bin`: `sub`) that is a symbolic link in `folder`,
/// if one is: a data file placed through it would lie outside the model's folder, where the
/// loader (rightly) refuses to follow it.
fn linked_folder(folder: &Path, location: &str) -> Option<PathBuf> {
    let mut at = folder.to_path_buf();
    for part in Path::new(location).parent()?.components() {
        at.push(part);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => return Some(at),
            Ok(_) => {}
            Err(_) => return None, // made fresh below
        }
    }
    None
}

/// Creates the folders of a location with a folder in it (`weights/w.bin`); false if it cannot.
fn make_parent(folder: &Path, location: &str) -> bool {
    match Path::new(location).parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => fs::create_dir_all(folder.join(p)).is_ok(),
        None => true,
    }
}

/// Renames `from` to `to` unless `to` exists (`renameat2(RENAME_NOREPLACE)`; where the file
/// system has no such rename, a check first: the export lock keeps other writers out).
fn rename_new(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: renameat2(2) with two NUL-terminated paths relative to the working folder.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(e);
    }
    if fs::symlink_metadata(to).is_ok() {
        return Err(std::io::ErrorKind::AlreadyExists.into());
    }
    fs::rename(from, to)
}

fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Points the external tensors of `model` from each `(old, new)` location to the new one.
fn relocate(model: &mut ModelProto, names: &[(String, String)]) {
    let Some(g) = model.graph.as_mut() else { return };
    let _ = for_each_tensor(g, &mut |t| {
        let mut changed = false;
        for e in t.external_data.iter_mut().filter(|e| e.key.as_deref() == Some("location")) {
            if let Some((_, new)) = names.iter().find(|(old, _)| e.value.as_deref() == Some(old.as_str())) {
                e.value = Some(new.clone());
                changed = true;
            }
        }
        Ok(changed)
    });
}

/// Writes `model` to a temporary file (synced) and renames it over the target; returns its
/// size and identity. Under the export lock.
fn write_model(
    target: &Target,
    token: &str,
    model: &ModelProto,
    encode: &mut Option<&mut Encoder<'_>>,
) -> Result<(u64, (u64, u64))> {
    let mut temp = Temp::create(&target.path, token, "model").map_err(|e| target.err(e))?;
    let len = match encode {
        None => {
            let mut out = BufWriter::with_capacity(256 << 10, &temp.file);
            let n = write_streaming(model, &mut out).and_then(|n| out.flush().map(|_| n));
            n.map_err(|e| target.err(e))?
        }
        Some(encode) => {
            let bytes = encode(model.encode_to_vec())?;
            (&temp.file).write_all(&bytes).map_err(|e| target.err(e))?;
            bytes.len() as u64
        }
    };
    temp.file.sync_all().map_err(|e| target.err(e))?;
    let id = identity(&temp.path).map_err(|e| target.err(e))?;
    fs::rename(&temp.path, &target.path).map_err(|e| target.err(e))?;
    temp.disarm();
    Ok((len, id))
}

/// Removes the data files of earlier and killed writes to `target` that the model just
/// written (identity `written`) does not reference: token-named ones, and those marked as
/// the writer's for this model (see [`crate::storage::ownership`]), in the model's folder and
/// in the folders of its data files. Nothing if the model in place is no longer that one
/// (another program replaced it: what it references is unknown).
fn remove_orphans(target: &Target, referenced: &[String], written: (u64, u64)) {
    if identity(&target.path).ok() != Some(written) {
        return;
    }
    let mut folders: Vec<&str> = vec![""];
    for r in referenced {
        if let Some((dir, _)) = r.rsplit_once('/') {
            if !folders.contains(&dir) {
                folders.push(dir);
            }
        }
    }
    for dir in folders {
        let Ok(entries) = fs::read_dir(target.folder.join(dir)) else { continue };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let file = e.file_name().to_string_lossy().into_owned();
            let location = if dir.is_empty() { file.clone() } else { format!("{dir}/{file}") };
            if referenced.contains(&location) {
                continue;
            }
            if (dir.is_empty() && token_named(&target.name, &file)) || is_ours(&target.folder, &location, &target.name)
            {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// Links each source data file of the still-external tensors beside `path` (token names)
/// and points the tensors at the links, after checking that each source is the file that
/// was loaded. Returns the links made.
pub(crate) fn link_sources(model: &mut ModelProto, path: &Path, token: &str) -> Result<Vec<PathBuf>> {
    use std::collections::HashMap;

    use crate::storage::external::{check_identity, entry, IDENTITY_KEY};
    use crate::storage::read::{changed, Identity};

    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut links: HashMap<String, String> = HashMap::new();
    let mut made = Vec::new();
    let Some(g) = model.graph.as_mut() else { return Ok(made) };
    let result = for_each_tensor(g, &mut |t| {
        // Weights left in their source files are copied, not linked (see `data_file`).
        if !is_external(t) || crate::codec::range::FileRange::of(t).is_some() {
            return Ok(false);
        }
        let recorded = entry(t, IDENTITY_KEY).map(str::to_string);
        t.external_data.retain(|e| e.key.as_deref() != Some(IDENTITY_KEY));
        for e in &mut t.external_data {
            if e.key.as_deref() != Some("location") {
                continue;
            }
            let source = e.value.clone().unwrap_or_default();
            if !Path::new(&source).is_absolute() {
                continue;
            }
            if let Some(link) = links.get(&source) {
                e.value = Some(link.clone());
                continue;
            }
            if let Some(recorded) = &recorded {
                check_identity(Path::new(&source), recorded)?;
            }
            let base = Path::new(&source).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let link_name = format!("{}.{token}.{}.{base}", token_stem(&name), links.len());
            let link_path = path.with_file_name(&link_name);
            let hard = fs::hard_link(&source, &link_path).is_ok();
            if !hard {
                fs::copy(&source, &link_path).map_err(|err| {
                    Error::export(format!("cannot link or copy {source} beside {}: {err}", path.display()))
                })?;
            }
            made.push(link_path.clone());
            // The link is the file itself (same inode): it must still be the file checked
            // above. Linking changes the inode's ctime, so that is not compared; a copy is
            // checked against the source, which must not have changed while it was copied.
            if let Some(recorded) = recorded.as_deref().and_then(Identity::decode) {
                let now = Identity::at(if hard { &link_path } else { Path::new(&source) });
                let same = now.is_ok_and(|n| {
                    (n.dev, n.ino, n.size, n.mtime_ns) == (recorded.dev, recorded.ino, recorded.size, recorded.mtime_ns)
                        && (hard || n.ctime_ns == recorded.ctime_ns)
                });
                if !same {
                    return Err(changed(&source, "since the model was loaded"));
                }
            }
            links.insert(source, link_name.clone());
            e.value = Some(link_name);
        }
        Ok(true)
    });
    if let Err(e) = result {
        made.iter().for_each(|m| drop(fs::remove_file(m)));
        return Err(e);
    }
    Ok(made)
}
