//! The one writer: every model file fastseq writes goes through here. A model alone is
//! written to a temporary file and renamed over the target; with external data, the data
//! file is written first under a name carrying the export's token (it cannot collide with a
//! user's file or another export's), the model last, under the export lock (see
//! [`crate::storage::export_lock`]), and the files of earlier exports that the model now in
//! place does not reference are removed.
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::codec::model::PROTOBUF_LIMIT;
use crate::codec::proto::{GraphProto, ModelProto};
use crate::codec::range::{inline_len, FileRange};
use crate::codec::stream::write_streaming;
use crate::codec::tensor::{for_each_tensor, is_external};
use crate::error::{Error, Result};
use crate::storage::copy::Copied;
use crate::storage::data_file::{Layout, Placed};
use crate::storage::export_lock::{remove_orphans, ExportLock};
use crate::storage::external::{check_identity, entry, IDENTITY_KEY};
use crate::storage::ranges::inline;
use crate::storage::read::{changed, Identity};
use crate::storage::temp::{remove_stale_temps, temp_path};

/// What [`save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub model_bytes: u64,
    pub data_bytes: u64,
    pub data_file: Option<String>,
}

/// Writes `model` to `path` atomically. `external`: Some(true) puts tensors of at least
/// `threshold` bytes in a data file beside it, Some(false) keeps them inline, None decides
/// by size (external at the protobuf limit). `linked` models (external data left pointing
/// at the sources) always take the external path, which links those files.
pub fn save(model: &ModelProto, path: &Path, external: Option<bool>, linked: bool, threshold: usize) -> Result<Saved> {
    // Named here: the writers' first file is a temporary one, whose name would mislead.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        return Err(Error::export(format!(
            "cannot write {}: the folder {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    let size = inline_len(model) as u64;
    if linked || external.unwrap_or(size >= PROTOBUF_LIMIT) {
        let (model_bytes, data_bytes, name) = crate::storage::writer::write_with_external(model, path, threshold)?;
        return Ok(Saved { model_bytes, data_bytes, data_file: Some(name) });
    }
    if size >= PROTOBUF_LIMIT {
        return Err(Error::export(format!(
            "{}: the model is {size} bytes, over the 2 GB protobuf limit: it needs external data",
            path.display()
        )));
    }
    let model_bytes = write_atomic(&*inline(model)?, path)?;
    // Data files of earlier external-data exports to this path are no longer referenced.
    remove_orphans(path);
    Ok(Saved { model_bytes, data_bytes: 0, data_file: None })
}

/// Writes `model` to `path` atomically: a temporary file in the same folder, synced, then
/// renamed over the target. On any failure the temporary file is removed and an existing
/// file at `path` is left as it was. Returns the number of bytes written.
pub fn write_atomic(model: &ModelProto, path: &Path) -> Result<u64> {
    write_atomic_with(model, path, true)
}

/// [`write_atomic`]; `durable: false` skips the sync, for files that only this process
/// reads and that need not outlive a crash (a session's private copy).
pub fn write_atomic_with(model: &ModelProto, path: &Path, durable: bool) -> Result<u64> {
    remove_stale_temps(path);
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<u64> {
        let file = File::create(&tmp)?;
        let mut out = BufWriter::with_capacity(256 << 10, file);
        let written = write_streaming(model, &mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        Ok(written)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::export(format!("cannot write {}: {e}", path.display()))
    })
}

/// Writes `model` to `path` with every tensor of at least `threshold` bytes in one data file
/// beside it, and every weight still in its source file (see [`crate::codec::range`]) copied
/// there in the kernel; tensors still external (from [`Mode::Link`]) get their source file
/// linked beside it instead (a hard link, or a copy across file systems). Returns (model
/// bytes, data bytes written, data file name). Atomic as described above; afterwards the
/// folder holds no file of an earlier, concurrent or killed export that the model in place
/// does not reference, but for those of exports still running.
///
/// [`Mode::Link`]: crate::storage::external::Mode::Link
pub fn write_with_external(model: &ModelProto, path: &Path, threshold: usize) -> Result<(u64, u64, String)> {
    let w = write_external(model, path, threshold, None, true, 1, &mut Vec::new())?;
    Ok((w.model_bytes, w.data_bytes, w.data_names.into_iter().next().unwrap_or_default()))
}

/// What [`write_external`] wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub model_bytes: u64,
    /// The data files' lengths (their weights, aligned), together.
    pub data_bytes: u64,
    /// The data files' names, the first one first (the only one of an export).
    pub data_names: Vec<String>,
    /// The weights copied by the kernel (from their source files, or from an earlier copy).
    pub copied: Copied,
    /// The weights written from memory.
    pub from_memory: u64,
}

/// [`write_with_external`]. `data_name` fixes the data file's name (in a private folder,
/// where no other export can collide with it, so that the bytes depend on the model alone);
/// `durable: false` skips the syncs (a private copy that need not outlive a crash); the
/// weights copied by the kernel are spread over up to `max_parts` data files, copied side by
/// side (see [`crate::storage::data_file`]). `placed` receives, for each weight put in the
/// data files, where it was held and where it went (see `spill::spill_onto`).
pub fn write_external(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    data_name: Option<&str>,
    durable: bool,
    max_parts: usize,
    placed: &mut Vec<Placed>,
) -> Result<Written> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model.onnx".into());
    let lock = ExportLock::acquire(path)?;
    let token = lock.token.clone();
    let data_name = data_name.map_or_else(|| format!("{name}.{token}.data"), str::to_string);

    let mut header = model.clone();
    let linked = link_sources(&mut header, path, &token)?;
    let (mut temps, mut renamed): (Vec<PathBuf>, Vec<PathBuf>) = (Vec::new(), Vec::new());
    let result = (|| -> Result<(Layout, Copied)> {
        let mut no_graph = GraphProto::default();
        let graph = header.graph.as_mut().unwrap_or(&mut no_graph);
        let layout = Layout::place(graph, threshold, &data_name, max_parts, placed)?;
        let paths = layout.paths(path);
        let mut files = Vec::new();
        for p in &paths {
            let tmp = temp_path(p);
            let file = File::options().read(true).write(true).create_new(true).open(&tmp);
            let file = file.map_err(|e| Error::export(format!("cannot write {}: {e}", p.display())))?;
            temps.push(tmp);
            files.push(file);
        }
        let copied = layout.write(&files, &paths)?;
        for (f, p) in files.iter().zip(&paths).filter(|_| durable) {
            f.sync_all().map_err(|e| Error::export(format!("cannot write {}: {e}", p.display())))?;
        }
        for (tmp, p) in temps.iter().zip(&paths) {
            fs::rename(tmp, p).map_err(|e| Error::export(format!("cannot write {}: {e}", p.display())))?;
            renamed.push(p.clone());
        }
        Ok((layout, copied))
    })();
    let remove = |files: &[PathBuf]| {
        for f in files {
            let _ = fs::remove_file(f);
        }
    };
    let (layout, copied) = result.inspect_err(|_| {
        remove(&temps);
        remove(&renamed);
        remove(&linked);
    })?;
    let data_paths = layout.paths(path);
    match crate::storage::writer::write_atomic_with(&header, path, durable) {
        Ok(n) => {
            // Released first, so that this export's own files are judged like any other's.
            drop(lock);
            remove_orphans(path);
            Ok(Written {
                model_bytes: n,
                data_bytes: layout.lens.iter().sum(),
                from_memory: layout.from_memory(),
                data_names: layout.names,
                copied,
            })
        }
        Err(e) => {
            remove(&data_paths);
            remove(&linked);
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
        // Weights left in their source files are copied, not linked (see write_external).
        if !is_external(t) || FileRange::of(t).is_some() {
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
                    return Err(changed(&source, "since the model was loaded"));
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
