//! The one writer: every model file fastseq writes goes through here. A composed model
//! ([`save`]), bytes in any format ([`commit_bytes`]), a model that another program wrote
//! into a staging folder beside the target (ONNX Runtime's optimised model, a quantized
//! model, an `onnx.save` output: [`stage`], [`commit_staged`]) and the session's private copy
//! ([`write_session_copy`]).
//!
//! The bytes go to temporary files beside the target first (outside the export lock: the
//! weights may be gigabytes); the commit then places the data files, under their plain
//! names where they are free or the writer's own, the model last, atomically, under the
//! export lock, and removes what earlier and killed writes left (see
//! [`crate::storage::commit`]). A user's file is never overwritten or removed; every failure
//! is an export error naming the target.
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::codec::model::{decode, PROTOBUF_LIMIT};
use crate::codec::proto::{GraphProto, ModelProto, StringStringEntryProto};
use crate::codec::range::inline_len;
use crate::codec::stream::write_streaming;
use crate::error::{Error, Result};
use crate::storage::commit::{commit, link_sources, DataFile, Model, Target};
pub use crate::storage::commit::{Encoder, Saved};
use crate::storage::copy::Copied;
use crate::storage::data_file::{Placed, Placement};
use crate::storage::external::{locations, safe_location};
use crate::storage::layout::LAYOUT;
use crate::storage::ownership::mark;
use crate::storage::ranges::inline;
use crate::storage::read::read_path;
pub use crate::storage::temp::Staging;
use crate::storage::token::{new_token, token_stem};

/// Writes `model` to `path`. `external`: Some(true) puts tensors of at least `threshold`
/// bytes in a data file beside it (`<name>.data` when that name is free or the writer's),
/// Some(false) keeps them inline, None decides by size (external at the protobuf limit).
/// `linked` models (external data left pointing at the sources) always take the external
/// path, which links those files.
pub fn save(model: &ModelProto, path: &Path, external: Option<bool>, linked: bool, threshold: usize) -> Result<Saved> {
    let target = Target::new(path)?;
    let token = new_token();
    // Weights still in their source files count as they will be written (inline).
    let size = inline_len(model) as u64;
    if linked || external.unwrap_or(size >= PROTOBUF_LIMIT) {
        let temp = target.temp(&token, "data")?;
        let fallback = format!("{}.{token}.data", token_stem(&target.name));
        let mut header = model.clone();
        let mut no_graph = GraphProto::default();
        // One data file: weights in memory written once, those in a source copied by the kernel.
        let mut placed = Vec::new();
        let placement =
            Placement::place(header.graph.as_mut().unwrap_or(&mut no_graph), threshold, &fallback, 1, &mut placed)?;
        // Errors name the target (the temporary file's name would mislead).
        placement.write(std::slice::from_ref(&temp.file), &[path.to_path_buf()])?;
        temp.file.sync_all().map_err(|e| target.err(e))?;
        let mut data = Vec::new();
        let len = placement.lens.first().copied().unwrap_or(0);
        if !placed.is_empty() {
            let preferred = LAYOUT.data_file(&target.name);
            let marked = mark(&temp.file, &target.name, &[&preferred, &fallback]);
            let path = temp.path.clone();
            let preferred = marked.then_some(preferred);
            data.push(DataFile { path, temp: Some(temp), placeholder: fallback.clone(), preferred, fallback, len });
        }
        return commit(&target, &token, Model::Header { model: Box::new(header), encode: None, link: linked }, data);
    }
    if size >= PROTOBUF_LIMIT {
        return Err(Error::export(format!(
            "{}: the model is {size} bytes, over the 2 GB protobuf limit: it needs external data",
            path.display()
        )));
    }
    let temp = target.temp(&token, "model")?;
    let mut out = BufWriter::with_capacity(256 << 10, &temp.file);
    let len =
        write_streaming(&*inline(model)?, &mut out).and_then(|n| out.flush().map(|_| n)).map_err(|e| target.err(e))?;
    drop(out);
    temp.file.sync_all().map_err(|e| target.err(e))?;
    commit(&target, &token, Model::Written { path: temp.path.clone(), temp: Some(temp), len }, Vec::new())
}

/// Writes `bytes` (a model without external data, in any format, or any other file) to
/// `path`. With an `owner` (a file's name in the same folder), `path` is a file written
/// beside it, marked as the writer's: a file there that the writer did not make for that
/// owner is never replaced (see [`check`]).
pub fn commit_bytes(bytes: &[u8], path: &Path, owner: Option<&str>) -> Result<Saved> {
    let target = target(path, owner)?;
    let token = new_token();
    let temp = target.temp(&token, "model")?;
    (&temp.file).write_all(bytes).and_then(|_| temp.file.sync_all()).map_err(|e| target.err(e))?;
    target.mark(&temp.file);
    commit(
        &target,
        &token,
        Model::Written { path: temp.path.clone(), temp: Some(temp), len: bytes.len() as u64 },
        Vec::new(),
    )
}

fn target(path: &Path, owner: Option<&str>) -> Result<Target> {
    match owner {
        Some(owner) => Target::beside(path, owner),
        None => Target::new(path),
    }
}

/// Checks, before anything is computed or written, that a write to `path` (beside `owner`,
/// as [`commit_bytes`] takes it) can be done: the target's checks, and a temporary file
/// made and removed beside it under the export lock (a read-only or full folder fails here).
pub fn check(path: &Path, owner: Option<&str>) -> Result<()> {
    let target = target(path, owner)?;
    target.temp(&new_token(), "check").map(drop)
}

/// A staging folder beside `path` for another program to write a model into, then
/// [`commit_staged`]. Removed when dropped, or by the next write into that folder if this
/// process is killed.
pub fn stage(path: &Path) -> Result<Staging> {
    let target = Target::new(path)?;
    target.staging(&new_token())
}

/// Commits the model `model_file` of `staging` (a protobuf file, a path relative to the
/// folder, with its external data files beside it in the folder) to the staging folder's target: each data file is moved
/// beside the target under the name it had in the folder when that name is free or the
/// writer's, else under a token name, and the model's locations are rewritten to match.
/// `metadata` pairs are set in the model's metadata_props (a key keeps its place and takes
/// the new value); `encode` turns the final model into another format (a text format).
pub fn commit_staged(
    staging: &Staging,
    model_file: &str,
    metadata: &[(String, String)],
    encode: Option<&mut Encoder<'_>>,
) -> Result<Saved> {
    let target = Target::new(staging.target())?;
    let token = new_token();
    let folder = staging.path();
    let staged = folder.join(model_file);
    let staged_err = |e: Error| target.err(format!("the model to write ({model_file}): {}", e.message));
    LAYOUT.check_location(model_file).map_err(staged_err)?;
    let mut model = decode(model_file, read_path(&staged).map_err(staged_err)?).map_err(staged_err)?;
    let found = locations(&mut model);
    if found.is_empty() && metadata.is_empty() && encode.is_none() {
        // As it is: synced, then renamed into place.
        let file = File::open(&staged).map_err(|e| target.err(e))?;
        file.sync_all().map_err(|e| target.err(e))?;
        let len = file.metadata().map_err(|e| target.err(e))?.len();
        return commit(&target, &token, Model::Written { path: staged, temp: None, len }, Vec::new());
    }
    let base = staged.parent().unwrap_or(folder);
    let mut data = Vec::new();
    for (k, location) in found.iter().enumerate() {
        LAYOUT.check_location(location).map_err(staged_err)?;
        let path = safe_location(base, folder, location).map_err(staged_err)?;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| target.err(e))?;
        file.sync_all().map_err(|e| target.err(e))?;
        let len = file.metadata().map_err(|e| target.err(e))?.len();
        let fallback = match found.len() {
            1 => format!("{}.{token}.data", token_stem(&target.name)),
            _ => format!("{}.{token}.{k}.data", token_stem(&target.name)),
        };
        let marked = mark(&file, &target.name, &[location, &fallback]);
        let preferred = marked.then(|| location.clone());
        data.push(DataFile { path, temp: None, placeholder: location.clone(), preferred, fallback, len });
    }
    for (key, value) in metadata {
        match model.metadata_props.iter_mut().find(|p| p.key.as_deref() == Some(key)) {
            Some(p) => p.value = Some(value.clone()),
            None => model.metadata_props.push(StringStringEntryProto {
                key: Some(key.clone()),
                value: Some(value.clone()),
                ..Default::default()
            }),
        }
    }
    commit(&target, &token, Model::Header { model: Box::new(model), encode, link: false }, data)
}

/// Writes `model` for a session, laid out as [`LAYOUT`] says: its large tensors, and its
/// weights still in their source files, in `<path>.data` beside `path` and, for large
/// copies, more data files `<path>.data.1`, ... copied side by side, one per thread of the
/// pool (see `write_private`; meant for a private folder, so not synced). `placed`
/// receives where each weight went in the data file (see `spill::spill_onto`).
pub fn write_session_copy(model: &ModelProto, path: &Path, placed: &mut Vec<Placed>) -> Result<Written> {
    let data_name = LAYOUT.data_file(&path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let parts = crate::pool::install(rayon::current_num_threads);
    write_private(model, path, LAYOUT.threshold, &data_name, parts, placed)
}

/// What [`write_session_copy`] wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub model_bytes: u64,
    /// The data files' lengths (their weights, aligned), together.
    pub data_bytes: u64,
    /// The data files' names, the first one first.
    pub data_names: Vec<String>,
    /// The weights copied by the kernel (from their source files, or from an earlier copy).
    pub copied: Copied,
    /// The weights written from memory.
    pub from_memory: u64,
}

/// Writes the session's private copy of `model` into `path`'s folder, which only this
/// process uses: tensors of at least `threshold` bytes, and every weight still in its source
/// file (copied there by the kernel), in `data_name` beside it and, for large copies, up to
/// `max_parts` files copied side by side (see [`crate::storage::data_file`]); no file is
/// synced (the page cache is enough for a file that need not outlive a crash). Tensors still
/// external (`external_data="reuse"`) get their source file linked beside it. `placed`
/// receives, for each weight put in the data files, where it was held and where it went
/// (see `spill::spill_onto`). On failure, the files it made are removed.
fn write_private(
    model: &ModelProto,
    path: &Path,
    threshold: usize,
    data_name: &str,
    max_parts: usize,
    placed: &mut Vec<Placed>,
) -> Result<Written> {
    let err = |p: &Path, e: std::io::Error| Error::export(format!("cannot write {}: {e}", p.display()));
    let mut header = model.clone();
    let linked = link_sources(&mut header, path, &new_token())?;
    let mut made: Vec<PathBuf> = linked;
    let result = (|| -> Result<Written> {
        let mut no_graph = GraphProto::default();
        let placement =
            Placement::place(header.graph.as_mut().unwrap_or(&mut no_graph), threshold, data_name, max_parts, placed)?;
        let paths = placement.paths(path);
        let mut files = Vec::new();
        for p in &paths {
            let file = File::options().read(true).write(true).create_new(true).open(p).map_err(|e| err(p, e))?;
            made.push(p.clone());
            files.push(file);
        }
        let copied = placement.write(&files, &paths)?;
        let file = File::options().write(true).create_new(true).open(path).map_err(|e| err(path, e))?;
        made.push(path.to_path_buf());
        let mut out = BufWriter::with_capacity(256 << 10, file);
        let model_bytes =
            write_streaming(&header, &mut out).and_then(|n| out.flush().map(|_| n)).map_err(|e| err(path, e))?;
        Ok(Written {
            model_bytes,
            data_bytes: placement.lens.iter().sum(),
            from_memory: placement.from_memory(),
            data_names: placement.names,
            copied,
        })
    })();
    if result.is_err() {
        for f in &made {
            let _ = fs::remove_file(f);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use std::fs;

    use bytes::Bytes;
    use prost::Message;

    use super::*;
    use crate::codec::proto::{GraphProto, TensorProto};

    fn model(value: u8) -> ModelProto {
        let w = TensorProto {
            name: Some("w".into()),
            dims: vec![256],
            data_type: Some(2), // uint8
            raw_data: Some(Bytes::from(vec![value; 256])),
            ..Default::default()
        };
        let graph = GraphProto { name: Some("g".into()), initializer: vec![w], ..Default::default() };
        ModelProto { ir_version: Some(8), graph: Some(graph), ..Default::default() }
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn data_files_keep_their_plain_name_and_a_users_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("m.onnx");
        for value in [1, 2] {
            let saved = save(&model(value), &target, Some(true), false, 0).unwrap();
            assert_eq!(saved.data_files, ["m.onnx.data"]);
            assert_eq!(listing(dir.path()), ["m.onnx", "m.onnx.data"]);
            assert_eq!(fs::read(dir.path().join("m.onnx.data")).unwrap(), vec![value; 256]);
        }
        save(&model(3), &target, Some(false), false, 0).unwrap();
        assert_eq!(listing(dir.path()), ["m.onnx"], "an inline write removes the writer's data file");

        fs::write(dir.path().join("u.onnx.data"), b"theirs").unwrap();
        let user = dir.path().join("u.onnx");
        for _ in 0..2 {
            let saved = save(&model(4), &user, Some(true), false, 0).unwrap();
            assert!(saved.data_files[0].starts_with("u.onnx.fastseq-"), "{:?}", saved.data_files);
            assert_eq!(listing(dir.path()), ["m.onnx", "u.onnx", "u.onnx.data", &saved.data_files[0]]);
        }
        assert_eq!(fs::read(dir.path().join("u.onnx.data")).unwrap(), b"theirs");
    }

    #[test]
    fn targets_that_cannot_be_written_are_export_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("m.onnx");
        fs::create_dir(&folder).unwrap();
        let err = save(&model(1), &folder, Some(true), false, 0).unwrap_err();
        assert_eq!(err.message, format!("cannot write {}: it is a directory", folder.display()));
        let missing = dir.path().join("nowhere").join("m.onnx");
        let err = commit_bytes(b"x", &missing, None).unwrap_err();
        assert!(err.message.starts_with(&format!("cannot write {}: the folder", missing.display())), "{}", err.message);
        assert_eq!(listing(dir.path()), ["m.onnx"]);
    }

    #[test]
    fn a_file_beside_an_owner_replaces_only_what_the_writer_made_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("p.a.onnx");
        commit_bytes(b"first", &ours, Some("p.toml")).unwrap();
        if check(&ours, Some("p.toml")).is_err() {
            return; // no extended attributes here: nothing beside an owner is ever ours
        }
        commit_bytes(b"second", &ours, Some("p.toml")).unwrap();
        assert_eq!(fs::read(&ours).unwrap(), b"second");
        // The owner's own write keeps it (it is no data file of the owner's).
        commit_bytes(b"pipeline", &dir.path().join("p.toml"), None).unwrap();
        assert_eq!(listing(dir.path()), ["p.a.onnx", "p.toml"]);
        let err = commit_bytes(b"x", &ours, Some("q.toml")).unwrap_err();
        assert!(err.message.contains("did not write for q.toml"), "{}", err.message);
        let users = dir.path().join("p.b.onnx");
        fs::write(&users, b"theirs").unwrap();
        let link = dir.path().join("p.c.onnx");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        for path in [&users, &link] {
            let err = commit_bytes(b"x", path, Some("p.toml")).unwrap_err();
            assert!(err.message.starts_with(&format!("cannot write {}: a file", path.display())), "{}", err.message);
            assert!(check(path, Some("p.toml")).is_err());
        }
        assert_eq!(fs::read(&users).unwrap(), b"theirs");
        assert_eq!(fs::read(&ours).unwrap(), b"second");
        assert_eq!(listing(dir.path()), ["p.a.onnx", "p.b.onnx", "p.c.onnx", "p.toml"]);
    }

    #[test]
    fn writers_racing_on_a_file_beside_an_owner_all_succeed_and_leave_it_whole() {
        // The checks outside the export lock see a file that another writer may put in
        // place at any moment: absent, then there; one marked file, then another.
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("p.a.onnx");
        commit_bytes(b"probe", &ours, Some("p.toml")).unwrap();
        if check(&ours, Some("p.toml")).is_err() {
            return; // no extended attributes here: nothing beside an owner is ever ours
        }
        for round in 0..20 {
            fs::remove_file(&ours).unwrap(); // each round starts with nothing there
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (ours, stop) = (&ours, &stop);
            std::thread::scope(|s| {
                let checker = s.spawn(move || {
                    let mut refused = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        refused.extend(check(ours, Some("p.toml")).err().map(|e| e.message));
                    }
                    refused
                });
                let writers: Vec<_> = (0..4u8)
                    .map(|i| {
                        s.spawn(move || (0..10).map(|_| commit_bytes(&[round, i], ours, Some("p.toml"))).collect())
                    })
                    .collect();
                let results: Vec<Vec<Result<Saved>>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let refused = checker.join().unwrap();
                assert!(refused.is_empty(), "round {round}: the check refused our own file: {refused:?}");
                for r in results.into_iter().flatten() {
                    r.unwrap();
                }
            });
            assert_eq!(fs::read(ours).unwrap()[0], round);
            assert_eq!(listing(dir.path()), ["p.a.onnx"], "round {round}: nothing left over");
        }
    }

    #[test]
    fn a_staged_model_is_committed_with_its_data_under_the_names_it_had() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("m.onnx");
        let staging = stage(&target).unwrap();
        let mut m = model(7);
        let placement = Placement::place(m.graph.as_mut().unwrap(), 0, "w.bin", 1, &mut Vec::new()).unwrap();
        placement
            .write(&[File::create(staging.path().join("w.bin")).unwrap()], &placement.paths(&staging.path().join("m")))
            .unwrap();
        fs::write(staging.path().join("m.onnx"), m.encode_to_vec()).unwrap();
        let meta = [("k".to_string(), "v".to_string())];
        let saved = commit_staged(&staging, "m.onnx", &meta, None).unwrap();
        assert_eq!(saved.data_files, ["w.bin"]);
        drop(staging);
        assert_eq!(listing(dir.path()), ["m.onnx", "w.bin"], "the staging folder goes when dropped");
        let back = decode("m", read_path(&target).unwrap()).unwrap();
        assert_eq!(back.metadata_props[0].value.as_deref(), Some("v"));
        assert_eq!(fs::read(dir.path().join("w.bin")).unwrap(), vec![7; 256]);
    }
}
