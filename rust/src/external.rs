//! External data: tensors whose bytes live in a file beside the model.
//!
//! Reading: each `location` is untrusted. It must be a relative path inside the model's
//! folder (no absolute path, no `..`, no symlink leading out), and its offset and length
//! must lie inside the file. The bytes are then a slice of a memory map of that file, so
//! reading a model "in place" copies nothing.
//!
//! Writing: large tensors go to one data file written next to the model. Both files are
//! written under temporary names and renamed; the data file's name carries a token, so an
//! interrupted export never pairs a new data file with an old model or the reverse.
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;

use crate::error::{Error, Result};
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
pub fn locations(model: &mut ModelProto) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(g) = model.graph.as_mut() {
        let _ = for_each_tensor(g, &mut |t| {
            for e in &t.external_data {
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
    /// Each tensor becomes a slice of its memory-mapped data file.
    InPlace,
    /// Each tensor stays external, its location made the checked absolute path of its file,
    /// so that a later save can link that file instead of copying its bytes.
    Link,
}

/// Resolves every external tensor of `model` (see [`Mode`]). Locations are relative to
/// `base` and must resolve inside `root`; offsets and lengths must lie inside the file.
pub fn resolve(model: &mut ModelProto, base: &Path, root: &Path, label: &str, mode: Mode) -> Result<()> {
    let mut maps: HashMap<PathBuf, Bytes> = HashMap::new();
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
        if mode == Mode::Link {
            let size = fs::metadata(&path).map_err(|e| Error::load(format!("{label}: '{location}': {e}")))?.len();
            let offset = parse_u64(t, "offset").map_err(with_label)?.unwrap_or(0);
            let length = parse_u64(t, "length").map_err(with_label)?.unwrap_or(size.saturating_sub(offset));
            if offset.checked_add(length).is_none_or(|end| end > size) {
                return Err(Error::load(format!(
                    "{label}: tensor '{}': external data offset {offset} length {length} lies past the end of '{location}' ({size} bytes)",
                    t.name()
                )));
            }
            for e in &mut t.external_data {
                if e.key.as_deref() == Some("location") {
                    e.value = Some(path.to_string_lossy().into_owned());
                }
            }
            return Ok(true);
        }
        let data = match maps.get(&path) {
            Some(d) => d.clone(),
            None => {
                let d = crate::model::read_path(&path).or_else(|e| {
                    // An empty data file is valid when every tensor in it is empty.
                    if fs::metadata(&path).map(|m| m.len() == 0).unwrap_or(false) {
                        Ok(Bytes::new())
                    } else {
                        Err(e)
                    }
                })?;
                maps.insert(path.clone(), d.clone());
                d
            }
        };
        let offset = parse_u64(t, "offset").map_err(with_label)?.unwrap_or(0);
        let length = parse_u64(t, "length").map_err(with_label)?;
        let size = data.len() as u64;
        let end = match length {
            Some(len) => offset.checked_add(len),
            None => Some(size),
        };
        match end {
            Some(end) if offset <= size && end <= size => {
                t.raw_data = Some(data.slice(offset as usize..end as usize));
            }
            _ => {
                return Err(Error::load(format!(
                    "{label}: tensor '{}': external data offset {offset} length {} lies past the end of '{location}' ({size} bytes)",
                    t.name(),
                    length.map_or("(to end)".to_string(), |l| l.to_string())
                )))
            }
        }
        t.external_data.clear();
        t.data_location = None;
        Ok(true)
    })?;
    Ok(())
}

fn kv(key: &str, value: String) -> StringStringEntryProto {
    StringStringEntryProto { key: Some(key.into()), value: Some(value) }
}

const ALIGN: u64 = 4096;

/// Writes `model` to `path` with every tensor of at least `threshold` bytes in one data file
/// beside it; tensors still external (from [`Mode::Link`]) get their source file linked
/// beside it instead (a hard link, or a copy across file systems). Returns (model bytes,
/// data bytes written, data file name). Atomic as described above.
pub fn write_with_external(model: &ModelProto, path: &Path, threshold: usize) -> Result<(u64, u64, String)> {
    write_with_external_tee(model, path, threshold, None, &mut std::io::sink())
}

/// [`write_with_external`], also sending every byte of the data file and then the model file
/// to `tee` (a digest computed while encoding, instead of reading the files again).
/// `data_name` fixes the data file's name (in a private folder, where no other export can
/// collide with it, so that the bytes, and their digest, depend on the model alone).
pub fn write_with_external_tee(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    data_name: Option<&str>,
    tee: &mut dyn Write,
) -> Result<(u64, u64, String)> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model.onnx".into());
    let token = format!("{:08x}", (crate::model::nanos() as u64 ^ std::process::id() as u64) & 0xffff_ffff);
    let data_name = data_name.map_or_else(|| format!("{name}.{token}.data"), str::to_string);
    let data_path = path.with_file_name(&data_name);
    let data_tmp = crate::model::temp_path(&data_path);
    let old_data = previous_data_files(path);

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
        file.sync_all().map_err(io)?;
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
    match crate::model::write_atomic(&header, path) {
        Ok(n) => {
            // The new pair is in place; the data files of earlier exports are not referenced.
            for old in old_data {
                if old != data_path && !linked.contains(&old) {
                    let _ = fs::remove_file(old);
                }
            }
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
/// tensors at the links. Returns the links made.
fn link_sources(model: &mut ModelProto, path: &Path, token: &str) -> Result<Vec<PathBuf>> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut links: HashMap<String, String> = HashMap::new();
    let mut made = Vec::new();
    let Some(g) = model.graph.as_mut() else { return Ok(made) };
    let result = for_each_tensor(g, &mut |t| {
        if !is_external(t) {
            return Ok(false);
        }
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
            let base = Path::new(&source).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let link_name = format!("{name}.{token}.{}.{base}", links.len());
            let link_path = path.with_file_name(&link_name);
            if fs::hard_link(&source, &link_path).is_err() {
                fs::copy(&source, &link_path).map_err(|err| {
                    Error::export(format!("cannot link or copy {source} beside {}: {err}", path.display()))
                })?;
            }
            made.push(link_path);
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

/// Data files an earlier export wrote for the model now at `path`.
fn previous_data_files(path: &Path) -> Vec<PathBuf> {
    let Ok(data) = crate::model::read_path(path) else { return Vec::new() };
    let Ok(mut model) = <ModelProto as prost::Message>::decode(data) else { return Vec::new() };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    locations(&mut model).into_iter().filter(|l| written_by_us(&name, l)).map(|l| path.with_file_name(l)).collect()
}

/// `{name}.{8 hex digits}.…`: the names [`write_with_external`] gives its files, so that a
/// re-export removes only files an earlier export made.
fn written_by_us(name: &str, location: &str) -> bool {
    let Some(rest) = location.strip_prefix(name).and_then(|r| r.strip_prefix('.')) else { return false };
    !location.contains('/')
        && rest.len() > 9
        && rest.as_bytes()[8] == b'.'
        && rest[..8].bytes().all(|b| b.is_ascii_hexdigit())
}
