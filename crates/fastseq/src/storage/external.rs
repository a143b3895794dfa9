//! External data: tensors whose bytes live in a file beside the model.
//!
//! Each `location` is untrusted. It must be a relative path inside the model's folder (no
//! absolute path, no `..`, no symlink leading out), its offset and length must lie inside the
//! file, and the length must be what the tensor's type and dims need. The bytes are read into
//! memory fastseq owns (see [`read_path`] for why), left in their file as a range of it to be
//! copied in the kernel, or, to link the files on export, left pointing at them with the
//! identity they had (see [`Mode`]).
//! Writing external data is the writer's job (`writer.rs`, above this file).
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::codec::model::decode;
use crate::codec::proto::{ModelProto, StringStringEntryProto, TensorProto};
use crate::codec::range::{set_inline, FileRange, RANGE_KEY};
use crate::codec::tensor::{elem_type_name, expected_bytes, for_each_tensor, is_external, visit_tensors};
use crate::error::{Error, Result};
use crate::storage::layout::LAYOUT;
use crate::storage::ranges::RANGE_MIN;
use crate::storage::read::{changed, open_regular, read_path, read_range, Identity};

fn type_and_dims(t: &TensorProto) -> String {
    format!("{} {:?}", elem_type_name(t.data_type.unwrap_or(0)), t.dims)
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

/// The external-data files that the model file at `path` refers to (not opened).
pub fn locations_in_file(path: &Path) -> Result<Vec<String>> {
    let mut model = decode(&path.display().to_string(), read_path(path)?)?;
    Ok(locations(&mut model))
}

/// Checks `location` (relative to `base`: see [`LAYOUT`]'s rule) and returns the file it
/// names, which must resolve, links followed, inside `root`.
pub fn safe_location(base: &Path, root: &Path, location: &str) -> Result<PathBuf> {
    LAYOUT.check_location(location)?;
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

pub(crate) fn entry<'a>(t: &'a TensorProto, key: &str) -> Option<&'a str> {
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
    /// Main-graph initializers of at least [`RANGE_MIN`] bytes stay in their data files, as
    /// ranges of them (see [`crate::storage::ranges`]): copied in the kernel when the model
    /// is written, never held. Other tensors are read as in [`Mode::InPlace`].
    Range,
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
    // The main graph's initializers may become ranges; the tensors anywhere else are read.
    let mut initializers = std::mem::take(&mut g.initializer);
    let first =
        initializers.iter_mut().try_for_each(|t| resolve_one(t, &mut files, base, root, label, mode).map(|_| ()));
    let inner = if mode == Mode::Range { Mode::InPlace } else { mode };
    let rest = first.and_then(|()| for_each_tensor(g, &mut |t| resolve_one(t, &mut files, base, root, label, inner)));
    g.initializer = initializers;
    rest.map(|_| ())
}

fn resolve_one(
    t: &mut TensorProto,
    files: &mut HashMap<PathBuf, (File, Identity)>,
    base: &Path,
    root: &Path,
    label: &str,
    mode: Mode,
) -> Result<bool> {
    if !is_external(t) {
        return Ok(false);
    }
    // What a source says under fastseq's own keys is not trusted: they are fastseq's to set.
    t.external_data.retain(|e| !e.key.as_deref().is_some_and(|k| k == IDENTITY_KEY || k == RANGE_KEY));
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
        let (file, meta) = open_regular(&path, &shown)?;
        files.insert(path.clone(), (file, Identity::of(&meta)));
    }
    let (file, identity) = &files[&path];
    let size = identity.size;
    let offset = parse_u64(t, "offset").map_err(with_label)?.unwrap_or(0);
    let length = parse_u64(t, "length").map_err(with_label)?;
    if t.data_type == Some(crate::codec::proto::tensor_proto::DataType::String as i32) {
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
    match mode {
        Mode::Link => {
            for e in &mut t.external_data {
                if e.key.as_deref() == Some("location") {
                    e.value = Some(path.to_string_lossy().into_owned());
                }
            }
            t.external_data.push(kv(IDENTITY_KEY, identity.encode()));
        }
        Mode::Range if len >= RANGE_MIN => {
            let path = path.to_string_lossy().into_owned();
            FileRange { path, offset, len, identity: identity.encode() }.put(t);
        }
        Mode::Range | Mode::InPlace => {
            let (data, seen) = read_range(file, &shown, offset, Some(len))?;
            if seen != *identity {
                return Err(changed(&shown, "while the model was read"));
            }
            set_inline(t, data);
        }
    }
    Ok(true)
}

/// Checks that every source file `model` still refers to (weights left in their files, the
/// data files of a model loaded with [`Mode::Link`]) is the file that was there at load.
/// Sources read into memory cannot change, so a model without such references always passes.
pub fn check_sources(model: &ModelProto) -> Result<()> {
    let Some(g) = model.graph.as_ref() else { return Ok(()) };
    let mut checked: std::collections::HashSet<String> = std::collections::HashSet::new();
    visit_tensors(g, &mut |t| {
        let recorded = entry(t, IDENTITY_KEY).or_else(|| FileRange::of(t).and(entry(t, RANGE_KEY)));
        if let (Some(location), Some(recorded)) = (entry(t, "location"), recorded) {
            if checked.insert(location.to_string()) {
                check_identity(Path::new(location), recorded)?;
            }
        }
        Ok(())
    })
}

pub(crate) fn check_identity(path: &Path, recorded: &str) -> Result<()> {
    let Some(recorded) = Identity::decode(recorded) else { return Ok(()) };
    match Identity::at(path) {
        Ok(now) if now == recorded => Ok(()),
        Ok(_) => Err(changed(&path.display(), "since the model was loaded")),
        Err(e) => Err(Error::load(format!("{}: gone since the model was loaded: {e}", path.display()))),
    }
}

pub(crate) fn kv(key: &str, value: String) -> StringStringEntryProto {
    StringStringEntryProto { key: Some(key.into()), value: Some(value), ..Default::default() }
}
