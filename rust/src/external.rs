//! External data: tensors whose bytes live in a file beside the model.
//!
//! Reading: each `location` is untrusted. It must be a relative path inside the model's
//! folder (no absolute path, no `..`, no symlink leading out), its offset and length must
//! lie inside the file, and the length must be what the tensor's type and dims need. The
//! bytes are read into memory fastseq owns (see [`crate::model::read_path`] for why).
//!
//! Writing: large tensors go to one data file written next to the model. Both files are
//! written under temporary names and renamed; the data file's name carries a token, so an
//! interrupted export never pairs a new data file with an old model or the reverse. An
//! export holds a lock named by its token until its model is in place; every export then
//! removes the files of finished or killed exports that the model now in place does not
//! reference (see [`remove_orphans`]).
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::Identity;
use crate::proto::{tensor_proto::DataLocation, GraphProto, ModelProto, StringStringEntryProto, TensorProto};

/// Calls `f` on every tensor of `g` and of its subgraphs: initializers, sparse initializers
/// and the tensors of node attributes. `f` returns whether it changed the tensor; a node
/// (kept as bytes) is encoded again only then.
fn for_each_tensor(g: &mut GraphProto, f: &mut impl FnMut(&mut TensorProto) -> Result<bool>) -> Result<bool> {
    let mut changed = false;
    for t in &mut g.initializer {
        changed |= f(t)?;
    }
    for s in &mut g.sparse_initializer {
        if let Some(t) = s.values.as_mut() {
            changed |= f(t)?;
        }
        if let Some(t) = s.indices.as_mut() {
            changed |= f(t)?;
        }
    }
    for raw in &mut g.node {
        if !crate::node::has_tensors_or_graphs(raw) {
            continue;
        }
        // Checked when the model was decoded: a node that does not decode is not reached.
        let Ok(mut n) = crate::node::decode(raw) else { continue };
        let mut node_changed = false;
        for a in &mut n.attribute {
            if let Some(t) = a.t.as_mut() {
                node_changed |= f(t)?;
            }
            for t in &mut a.tensors {
                node_changed |= f(t)?;
            }
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                node_changed |= for_each_tensor(sub, f)?;
            }
        }
        if node_changed {
            *raw = crate::node::encode(&n);
            changed = true;
        }
    }
    Ok(changed)
}

/// Calls `f` on every tensor of `g` and of its subgraphs, without changing anything.
fn visit_tensors(g: &GraphProto, f: &mut impl FnMut(&TensorProto) -> Result<()>) -> Result<()> {
    g.initializer.iter().try_for_each(&mut *f)?;
    for s in &g.sparse_initializer {
        s.values.iter().chain(s.indices.iter()).try_for_each(&mut *f)?;
    }
    for raw in g.node.iter().filter(|raw| crate::node::has_tensors_or_graphs(raw)) {
        let Ok(n) = crate::node::decode(raw) else { continue };
        for a in &n.attribute {
            a.t.iter().chain(a.tensors.iter()).try_for_each(&mut *f)?;
            a.g.iter().chain(a.graphs.iter()).try_for_each(|sub| visit_tensors(sub, f))?;
        }
    }
    Ok(())
}

/// The number of bytes a tensor's data takes in `raw_data` (and so in external data),
/// from its type and dims: None when the type has no fixed packing (strings, types this
/// schema does not size), an error for dims that are negative or overflow.
pub fn expected_bytes(t: &TensorProto) -> std::result::Result<Option<u64>, String> {
    // Bits per element; sub-byte types are packed (two 4-bit or four 2-bit values a byte).
    let bits: u64 = match t.data_type.unwrap_or(0) {
        2 | 3 | 9 | 17 | 18 | 19 | 20 | 24 => 8,
        4 | 5 | 10 | 16 => 16,
        1 | 6 | 12 => 32,
        7 | 11 | 13 | 14 => 64,
        15 => 128,
        21..=23 => 4,
        25 | 26 => 2,
        _ => return Ok(None),
    };
    let mut count: u64 = 1;
    for &d in &t.dims {
        let d = u64::try_from(d).map_err(|_| format!("negative dimension {d} in {:?}", t.dims))?;
        count = count.checked_mul(d).ok_or_else(|| format!("dims {:?} overflow", t.dims))?;
    }
    let total = count.checked_mul(bits).ok_or_else(|| format!("dims {:?} overflow", t.dims))?;
    Ok(Some(total.div_ceil(8)))
}

fn type_and_dims(t: &TensorProto) -> String {
    format!("{} {:?}", crate::compose::elem_type_name(t.data_type.unwrap_or(0)), t.dims)
}

pub fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(DataLocation::External as i32)
}

pub fn has_external(model: &mut ModelProto) -> bool {
    let mut found = false;
    if let Some(g) = model.graph.as_mut() {
        let _ = for_each_tensor(g, &mut |t| {
            found |= is_external(t);
            Ok(false)
        });
    }
    found
}

/// The external-data files a model's tensors refer to (`location` entries), each once.
/// Entries on a tensor whose data is not external are ignored, as ONNX Runtime does.
pub fn locations(model: &mut ModelProto) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(g) = model.graph.as_mut() {
        let _ = for_each_tensor(g, &mut |t| {
            for e in t.external_data.iter().filter(|_| is_external(t)) {
                if let (Some("location"), Some(v)) = (e.key.as_deref(), &e.value) {
                    if !out.contains(v) {
                        out.push(v.clone());
                    }
                }
            }
            Ok(false)
        });
    }
    out
}

/// The rule every external-data location must pass before it names a file (or a download):
/// a non-empty relative path with no `..`, no root, no drive, no NUL.
pub fn check_relative(location: &str) -> Result<()> {
    let rel = Path::new(location);
    let bad = location.is_empty()
        || rel.is_absolute()
        || location.starts_with('/')
        || location.starts_with('\\')
        || location.contains('\0')
        || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if bad {
        return Err(Error::load(format!(
            "external data location '{location}' is refused: it must be a relative path inside the model's folder"
        )));
    }
    Ok(())
}

/// Checks `location` (relative to `base`) and returns the file it names, which must
/// resolve, links followed, inside `root`.
pub fn safe_location(base: &Path, root: &Path, location: &str) -> Result<PathBuf> {
    check_relative(location)?;
    let path = base.join(location);
    let real_base = root
        .canonicalize()
        .map_err(|e| Error::load(format!("cannot resolve the model's folder {}: {e}", root.display())))?;
    let real = path
        .canonicalize()
        .map_err(|e| Error::load(format!("external data file '{location}' cannot be opened: {e}")))?;
    if !real.starts_with(&real_base) {
        return Err(Error::load(format!(
            "external data location '{location}' is refused: it resolves outside the model's folder (through a link)"
        )));
    }
    Ok(real)
}

fn entry<'a>(t: &'a TensorProto, key: &str) -> Option<&'a str> {
    t.external_data.iter().find(|e| e.key.as_deref() == Some(key)).and_then(|e| e.value.as_deref())
}

fn parse_u64(t: &TensorProto, key: &str) -> Result<Option<u64>> {
    entry(t, key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Error::load(format!("tensor '{}': external data {key} '{v}' is not a number", t.name())))
        })
        .transpose()
}

/// How external tensors are taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each tensor's bytes are read from its data file into memory fastseq owns.
    InPlace,
    /// Each tensor stays external, its location made the checked absolute path of its file,
    /// so that a later save can link that file instead of copying its bytes. The file's
    /// identity at load travels with the tensor (under [`IDENTITY_KEY`]) and is checked
    /// before the file is linked.
    Link,
}

/// The `external_data` key under which a tensor left pointing at its source file
/// ([`Mode::Link`]) carries that file's [`Identity`] from load to save. Never written out.
pub const IDENTITY_KEY: &str = "fastseq:identity";

/// Resolves every external tensor of `model` (see [`Mode`]). Locations are relative to
/// `base` and must resolve inside `root`; offsets and lengths must lie inside the file, and
/// the length must be what the tensor's type and dims need.
pub fn resolve(model: &mut ModelProto, base: &Path, root: &Path, label: &str, mode: Mode) -> Result<()> {
    // Each data file is opened once; its identity then is what every read must still see.
    let mut files: HashMap<PathBuf, (File, Identity)> = HashMap::new();
    let Some(g) = model.graph.as_mut() else { return Ok(()) };
    for_each_tensor(g, &mut |t| {
        if !is_external(t) {
            return Ok(false);
        }
        let with_label = |e: Error| Error::load(format!("{label}: {}", e.message));
        let location = entry(t, "location")
            .ok_or_else(|| Error::load(format!("{label}: tensor '{}' is external but has no location", t.name())))?
            .to_string();
        let path = safe_location(base, root, &location).map_err(with_label)?;
        let shown = format!("{label}: external data file '{location}'");
        // The file is the tensor's data (as ONNX Runtime reads it): data also held inline
        // would otherwise be what a save writes (found by fuzzing the linked export).
        t.raw_data = None;
        t.float_data.clear();
        t.int32_data.clear();
        t.string_data.clear();
        t.int64_data.clear();
        t.double_data.clear();
        t.uint64_data.clear();
        if !files.contains_key(&path) {
            let file = File::open(&path).map_err(|e| Error::load(format!("{shown} cannot be opened: {e}")))?;
            let meta = file.metadata().map_err(|e| Error::load(format!("{shown} cannot be read: {e}")))?;
            if meta.is_dir() {
                return Err(Error::load(format!("{shown} is a directory")));
            }
            files.insert(path.clone(), (file, Identity::of(&meta)));
        }
        let (file, identity) = &files[&path];
        let size = identity.size;
        let offset = parse_u64(t, "offset").map_err(with_label)?.unwrap_or(0);
        let length = parse_u64(t, "length").map_err(with_label)?;
        if t.data_type == Some(crate::proto::tensor_proto::DataType::String as i32) {
            return Err(Error::load(format!(
                "{label}: tensor '{}' is a string tensor in external data '{location}': strings cannot be stored there",
                t.name()
            )));
        }
        let need = expected_bytes(t).map_err(|e| Error::load(format!("{label}: tensor '{}': {e}", t.name())))?;
        // Without a length the tensor takes what its type and dims need (as ONNX Runtime
        // reads it), or the rest of the file for a type without a fixed size.
        let len = length.or(need).unwrap_or(size.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::load(format!(
                "{label}: tensor '{}' ({}): external data of {len} bytes at offset {offset} lies past the end of \
                 '{location}', which has {} bytes there ({size} bytes in all)",
                t.name(),
                type_and_dims(t),
                size.saturating_sub(offset)
            )));
        }
        if let (Some(len), Some(need)) = (length, need) {
            if len != need {
                return Err(Error::load(format!(
                    "{label}: tensor '{}' ({}) needs {need} bytes but its external data in '{location}' has length {len}",
                    t.name(),
                    type_and_dims(t)
                )));
            }
        }
        if mode == Mode::Link {
            for e in &mut t.external_data {
                if e.key.as_deref() == Some("location") {
                    e.value = Some(path.to_string_lossy().into_owned());
                }
            }
            t.external_data.retain(|e| e.key.as_deref() != Some(IDENTITY_KEY));
            t.external_data.push(kv(IDENTITY_KEY, identity.encode()));
            return Ok(true);
        }
        let (data, seen) = crate::model::read_range(file, &shown, offset, Some(len))?;
        if seen != *identity {
            return Err(crate::model::changed(&shown, "while the model was read"));
        }
        t.raw_data = Some(data);
        t.external_data.clear();
        t.data_location = None;
        Ok(true)
    })?;
    Ok(())
}

/// Checks that every source file `model` still refers to (the data files of a model loaded
/// with [`Mode::Link`]) is the file that was there at load. Sources read into memory
/// cannot change, so a model without such references always passes.
pub fn check_sources(model: &ModelProto) -> Result<()> {
    let Some(g) = model.graph.as_ref() else { return Ok(()) };
    visit_tensors(g, &mut |t| {
        if let (Some(location), Some(recorded)) = (entry(t, "location"), entry(t, IDENTITY_KEY)) {
            check_identity(Path::new(location), recorded)?;
        }
        Ok(())
    })
}

fn check_identity(path: &Path, recorded: &str) -> Result<()> {
    let Some(recorded) = Identity::decode(recorded) else { return Ok(()) };
    match Identity::at(path) {
        Ok(now) if now == recorded => Ok(()),
        Ok(_) => Err(crate::model::changed(&path.display(), "since the model was loaded")),
        Err(e) => Err(Error::load(format!("{}: gone since the model was loaded: {e}", path.display()))),
    }
}

fn kv(key: &str, value: String) -> StringStringEntryProto {
    StringStringEntryProto { key: Some(key.into()), value: Some(value) }
}

const ALIGN: u64 = 4096;

/// Writes `model` to `path` with every tensor of at least `threshold` bytes in one data file
/// beside it; tensors still external (from [`Mode::Link`]) get their source file linked
/// beside it instead (a hard link, or a copy across file systems). Returns (model bytes,
/// data bytes written, data file name). Atomic as described above; afterwards the folder
/// holds no file of an earlier, concurrent or killed export that the model in place does
/// not reference, but for those of exports still running.
pub fn write_with_external(model: &ModelProto, path: &Path, threshold: usize) -> Result<(u64, u64, String)> {
    write_with_external_tee(model, path, threshold, None, true, &mut std::io::sink(), &mut Vec::new())
}

/// [`write_with_external`], also sending every byte of the data file and then the model file
/// to `tee` (a digest computed while encoding, instead of reading the files again).
/// `data_name` fixes the data file's name (in a private folder, where no other export can
/// collide with it, so that the bytes, and their digest, depend on the model alone);
/// `durable: false` skips the syncs (a private copy that need not outlive a crash).
/// `placed` receives, for each weight moved to the data file, its address and length in
/// `model` and its offset in the file (see `spill::spill_onto`).
pub fn write_with_external_tee(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    data_name: Option<&str>,
    durable: bool,
    tee: &mut dyn Write,
    placed: &mut Vec<(usize, usize, u64)>,
) -> Result<(u64, u64, String)> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model.onnx".into());
    let lock = ExportLock::acquire(path)?;
    let token = lock.token.clone();
    let data_name = data_name.map_or_else(|| format!("{name}.{token}.data"), str::to_string);
    let data_path = path.with_file_name(&data_name);
    let data_tmp = crate::model::temp_path(&data_path);

    let mut header = model.clone();
    let linked = link_sources(&mut header, path, &token)?;
    let io = |e: std::io::Error| Error::export(format!("cannot write {}: {e}", data_path.display()));
    let result = (|| -> Result<u64> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&data_tmp).map_err(io)?);
        let mut offset = 0u64;
        if let Some(g) = header.graph.as_mut() {
            for_each_tensor(g, &mut |t| {
                let Some(raw) = t.raw_data.take_if(|r| r.len() >= threshold) else { return Ok(false) };
                let pad = (ALIGN - offset % ALIGN) % ALIGN;
                let zeros = vec![0u8; pad as usize];
                out.write_all(&zeros).and_then(|_| out.write_all(&raw)).map_err(io)?;
                tee.write_all(&zeros).and_then(|_| tee.write_all(&raw)).map_err(io)?;
                offset += pad;
                placed.push((raw.as_ptr() as usize, raw.len(), offset));
                t.external_data = vec![
                    kv("location", data_name.clone()),
                    kv("offset", offset.to_string()),
                    kv("length", raw.len().to_string()),
                ];
                offset += raw.len() as u64;
                t.data_location = Some(DataLocation::External as i32);
                Ok(true)
            })?;
        }
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        if durable {
            file.sync_all().map_err(io)?;
        }
        Ok(offset)
    })();
    let cleanup = |linked: &[PathBuf]| {
        for l in linked {
            let _ = fs::remove_file(l);
        }
    };
    let data_len = result.inspect_err(|_| {
        let _ = fs::remove_file(&data_tmp);
        cleanup(&linked);
    })?;
    if let Err(e) = fs::rename(&data_tmp, &data_path) {
        let _ = fs::remove_file(&data_tmp);
        cleanup(&linked);
        return Err(Error::export(format!("cannot write {}: {e}", data_path.display())));
    }
    // The header is small: encoded once more for the tee.
    if let Err(e) = tee.write_all(&prost::Message::encode_to_vec(&header)) {
        let _ = fs::remove_file(&data_path);
        cleanup(&linked);
        return Err(Error::export(format!("cannot digest {}: {e}", path.display())));
    }
    match crate::model::write_atomic_with(&header, path, durable) {
        Ok(n) => {
            // Released first, so that this export's own files are judged like any other's.
            drop(lock);
            remove_orphans(path);
            Ok((n, data_len, data_name))
        }
        Err(e) => {
            let _ = fs::remove_file(&data_path);
            cleanup(&linked);
            Err(e)
        }
    }
}

/// Links each source data file of the still-external tensors beside `path` and points the
/// tensors at the links, after checking that each source is the file that was loaded.
/// Returns the links made.
fn link_sources(model: &mut ModelProto, path: &Path, token: &str) -> Result<Vec<PathBuf>> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut links: HashMap<String, String> = HashMap::new();
    let mut made = Vec::new();
    let Some(g) = model.graph.as_mut() else { return Ok(made) };
    let result = for_each_tensor(g, &mut |t| {
        if !is_external(t) {
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
            let link_name = format!("{name}.{token}.{}.{base}", links.len());
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
                    return Err(crate::model::changed(&source, "since the model was loaded"));
                }
            }
            links.insert(source, link_name.clone());
            e.value = Some(link_name);
        }
        Ok(true)
    });
    if let Err(e) = result {
        for m in &made {
            let _ = fs::remove_file(m);
        }
        return Err(e);
    }
    Ok(made)
}

/// An export in progress: an exclusive lock (`flock`) on `.{name}.{token}.lock` beside the
/// model, taken before the export makes any file with its token and released (the file
/// removed) once its model is in place. A killed export's lock is released by the kernel.
struct ExportLock {
    _file: File,
    path: PathBuf,
    token: String,
}

impl ExportLock {
    fn acquire(target: &Path) -> Result<ExportLock> {
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let err = |p: &Path, e: std::io::Error| Error::export(format!("cannot write {}: {e}", p.display()));
        loop {
            let token = new_token();
            let path = target.with_file_name(format!(".{name}.{token}.lock"));
            // Locked under a temporary name, then given its own: no other export ever sees
            // this lock unheld while this export runs. The temporary name is one that the
            // next export removes if this process is killed (`.{name}.{token}.lock.{pid}…`).
            let tmp = crate::model::temp_path(&target.with_file_name(format!("{name}.{token}.lock")));
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
    let mut x = (crate::model::nanos() as u64)
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
            let Ok(data) = crate::model::read_path(path) else { return };
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

    fn tensor(data_type: i32, dims: &[i64]) -> TensorProto {
        TensorProto { data_type: Some(data_type), dims: dims.to_vec(), ..Default::default() }
    }

    #[test]
    fn sizes_follow_type_and_dims() {
        assert_eq!(expected_bytes(&tensor(1, &[2, 3])), Ok(Some(24)));
        assert_eq!(expected_bytes(&tensor(1, &[])), Ok(Some(4)), "a scalar is one element");
        assert_eq!(expected_bytes(&tensor(1, &[0, 5])), Ok(Some(0)));
        assert_eq!(expected_bytes(&tensor(22, &[5])), Ok(Some(3)), "int4: two a byte, rounded up");
        assert_eq!(expected_bytes(&tensor(23, &[4])), Ok(Some(2)));
        assert_eq!(expected_bytes(&tensor(25, &[5])), Ok(Some(2)), "uint2: four a byte");
        assert_eq!(expected_bytes(&tensor(15, &[3])), Ok(Some(48)));
        assert_eq!(expected_bytes(&tensor(8, &[3])), Ok(None), "strings have no fixed size");
        assert_eq!(expected_bytes(&tensor(999, &[3])), Ok(None));
        assert!(expected_bytes(&tensor(1, &[-1])).is_err());
        assert!(expected_bytes(&tensor(1, &[i64::MAX, i64::MAX])).is_err());
        assert!(expected_bytes(&tensor(7, &[1 << 61])).is_err(), "bits overflow");
    }

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
        let dir =
            std::env::temp_dir().join(format!("fastseq-orphans-{}-{}", std::process::id(), crate::model::nanos()));
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

    #[test]
    fn identities_round_trip_as_text() {
        let id = Identity { dev: 1, ino: 2, size: 3, mtime_ns: -4, ctime_ns: 5_000_000_000_123 };
        assert_eq!(Identity::decode(&id.encode()), Some(id));
        assert_eq!(Identity::decode("1:2:3"), None);
        assert_eq!(Identity::decode("1:2:3:4:5:6"), None);
    }
}
