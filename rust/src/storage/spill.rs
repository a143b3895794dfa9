//! Spilling: pointing what a pipeline holds in owned memory (the sources' bytes: weights
//! and nodes) at the private copy written for its session instead.
//!
//! Sources are read into owned memory (see `model::read_path`), which a live pipeline keeps
//! for exports, new sessions and `combine`. While ONNX Runtime builds a session from the
//! private copy, that memory counts a second time. The copy's data file holds the same
//! weights, so once it is written the pipeline maps it (it stays alive, unlinked, after its
//! folder is removed) and lets go of the sources' memory: the weights are then pages of a
//! file, not counted until touched, written back and reclaimed under pressure, and no other
//! program can open the file by name to change them once the folder is gone. Nothing is
//! written twice.
//!
//! Every `Bytes` of the given models is visited; slices that several models share (a stage
//! and the composed model) stay shared. What is not in the data file (nodes, small tensors,
//! weights only a stage holds) is copied into one fresh buffer, so that no slice keeps a
//! source buffer alive.
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

use bytes::Bytes;

use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use crate::error::{Error, Result};

/// Address ranges of the live spill mappings: bytes already in one are not spilled again.
static MAPPED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A spill file's mapping; its range leaves [`MAPPED`] when the last slice of it is dropped.
struct Mapping(memmap2::Mmap);

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let start = self.0.as_ptr() as usize;
        if let Ok(mut m) = MAPPED.lock() {
            m.retain(|&(s, _)| s != start);
        }
    }
}

fn is_mapped(b: &Bytes) -> bool {
    let p = b.as_ptr() as usize;
    MAPPED.lock().map(|m| m.iter().any(|&(s, e)| p >= s && p < e)).unwrap_or(false)
}

/// Calls `f` on every `Bytes` of `model`: the nodes kept as bytes (with whatever they hold)
/// and the `raw_data` of every tensor outside them, in functions and training graphs too.
pub fn for_each_bytes(model: &mut ModelProto, f: &mut impl FnMut(&mut Bytes)) {
    fn tensor(t: &mut TensorProto, f: &mut impl FnMut(&mut Bytes)) {
        if let Some(raw) = t.raw_data.as_mut() {
            f(raw);
        }
    }
    fn graph(g: &mut GraphProto, f: &mut impl FnMut(&mut Bytes)) {
        g.node.iter_mut().for_each(&mut *f);
        g.initializer.iter_mut().for_each(|t| tensor(t, f));
        for s in &mut g.sparse_initializer {
            s.values.iter_mut().chain(s.indices.iter_mut()).for_each(|t| tensor(t, f));
        }
    }
    fn attribute(a: &mut AttributeProto, f: &mut impl FnMut(&mut Bytes)) {
        a.t.iter_mut().chain(a.tensors.iter_mut()).for_each(|t| tensor(t, f));
        a.g.iter_mut().chain(a.graphs.iter_mut()).for_each(|g| graph(g, f));
        for s in a.sparse_tensor.iter_mut().chain(a.sparse_tensors.iter_mut()) {
            s.values.iter_mut().chain(s.indices.iter_mut()).for_each(|t| tensor(t, f));
        }
    }
    fn node(n: &mut NodeProto, f: &mut impl FnMut(&mut Bytes)) {
        n.attribute.iter_mut().for_each(|a| attribute(a, f));
    }
    if let Some(g) = model.graph.as_mut() {
        graph(g, f);
    }
    for t in &mut model.training_info {
        t.initialization.iter_mut().chain(t.algorithm.iter_mut()).for_each(|g| graph(g, f));
    }
    for func in &mut model.functions {
        func.node.iter_mut().for_each(|n| node(n, f));
        func.attribute_proto.iter_mut().for_each(|a| attribute(a, f));
    }
}

/// Whether files in `dir` live in memory (tmpfs, ramfs): spilling there would only move
/// the bytes from this process's memory to the file system's.
fn in_memory(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return true };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statfs struct to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return true;
    }
    let kind = st.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Points the bytes of `models` at `data`, the data file of a private copy of `models[0]`
/// that [`crate::storage::digest::save_placed`] wrote, where `placed` says each weight went; copies
/// the rest into one fresh buffer. Done when there are at least `min_bytes` of bytes not
/// spilled yet and `data` is on a disk (on a tmpfs it would only move memory). Returns the
/// number of bytes now mapped (0: nothing done). The models encode exactly as before.
pub fn spill_onto(
    models: &mut [&mut ModelProto],
    data: &Path,
    placed: &[(usize, usize, u64)],
    min_bytes: u64,
) -> Result<u64> {
    let placed: HashMap<(usize, usize), u64> = placed.iter().map(|&(p, n, off)| ((p, n), off)).collect();
    // The distinct slices not spilled yet; those the data file does not hold, in order, with
    // their offset in the buffer that will hold them.
    let mut seen: HashMap<(usize, usize), Option<usize>> = HashMap::new();
    let (mut total, mut mapped, mut rest) = (0u64, 0u64, Vec::<Bytes>::new());
    let mut rest_len = 0usize;
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            if b.is_empty() || is_mapped(b) {
                return;
            }
            let key = (b.as_ptr() as usize, b.len());
            seen.entry(key).or_insert_with(|| {
                total += b.len() as u64;
                if placed.contains_key(&key) {
                    mapped += b.len() as u64;
                    None
                } else {
                    rest.push(b.clone());
                    rest_len += b.len();
                    Some(rest_len - b.len())
                }
            });
        });
    }
    if total < min_bytes || mapped == 0 || data.parent().is_none_or(in_memory) {
        return Ok(0);
    }
    let io = |e: std::io::Error| Error::export(format!("cannot map {}: {e}", data.display()));
    let file = File::open(data).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if placed.iter().any(|(&(_, n), &off)| off + n as u64 > len) {
        return Err(Error::export(format!("{}: shorter than what was written to it", data.display())));
    }
    // SAFETY: the file is in a folder only this process uses, removed once the session
    // exists; nothing else writes to it.
    let mapping = Mapping(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?);
    let start = mapping.0.as_ptr() as usize;
    MAPPED
        .lock()
        .map_err(|_| Error::export("spill registry poisoned".to_string()))?
        .push((start, start + mapping.0.len()));
    let whole = Bytes::from_owner(mapping);
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(rest_len).map_err(|_| Error::export("out of memory".to_string()))?;
    rest.iter().for_each(|b| buffer.extend_from_slice(b));
    drop(rest);
    let copied = Bytes::from(buffer);
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            let key = (b.as_ptr() as usize, b.len());
            let n = b.len();
            if let Some(&off) = placed.get(&key) {
                *b = whole.slice(off as usize..off as usize + n);
            } else if let Some(Some(off)) = seen.get(&key) {
                *b = copied.slice(*off..*off + n);
            }
        });
    }
    Ok(mapped)
}

/// Writes `models[0]` for a session at `path` (weights in `<path>.data`, not synced; see
/// [`crate::storage::digest::save_placed`]) and returns the digest of what was written. With
/// `spill_min`, also returns copies of all `models` spilled onto that data file (see
/// [`spill_onto`]), or None when there is less than that in it or the spill cannot be done
/// (the memory is then kept). The originals are left as they are.
pub fn private_copy(
    models: &[&ModelProto],
    path: &Path,
    spill_min: Option<u64>,
) -> Result<(String, u64, Option<Vec<ModelProto>>)> {
    let Some(first) = models.first() else { return Err(Error::export("no model to write".to_string())) };
    let mut placed = Vec::new();
    let (saved, digest) = crate::storage::digest::save_placed(first, path, 1024, &mut placed)?;
    let (Some(min), Some(data)) = (spill_min, saved.data_file) else { return Ok((digest, 0, None)) };
    // Below the minimum in the data file alone, no model is copied to find out more.
    if placed.iter().map(|&(_, n, _)| n as u64).sum::<u64>() < min {
        return Ok((digest, 0, None));
    }
    let mut copies: Vec<ModelProto> = models.iter().map(|m| (*m).clone()).collect();
    let mut refs: Vec<&mut ModelProto> = copies.iter_mut().collect();
    match spill_onto(&mut refs, &path.with_file_name(data), &placed, min) {
        Ok(mapped) if mapped > 0 => Ok((digest, mapped, Some(copies))),
        _ => Ok((digest, 0, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use prost::Message;

    struct Tracked(Vec<u8>, Arc<AtomicBool>);
    impl AsRef<[u8]> for Tracked {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    fn model_bytes() -> Vec<u8> {
        use crate::codec::proto::{AttributeProto, FunctionProto, GraphProto, NodeProto};
        let w = TensorProto {
            name: Some("w".into()),
            data_type: Some(1),
            dims: vec![1024],
            raw_data: Some(Bytes::from(vec![7u8; 4096])),
            ..Default::default()
        };
        let constant = NodeProto {
            op_type: Some("Constant".into()),
            output: vec!["k".into()],
            attribute: vec![AttributeProto {
                name: Some("value".into()),
                r#type: Some(4),
                t: Some(TensorProto {
                    data_type: Some(1),
                    dims: vec![4],
                    raw_data: Some(Bytes::from(vec![1u8; 16])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let add = NodeProto {
            op_type: Some("Add".into()),
            input: vec!["x".into(), "w".into()],
            output: vec!["y".into()],
            ..Default::default()
        };
        let g = GraphProto {
            name: Some("g".into()),
            node: vec![Bytes::from(constant.encode_to_vec()), Bytes::from(add.encode_to_vec())],
            initializer: vec![w],
            ..Default::default()
        };
        let f = FunctionProto { name: Some("f".into()), node: vec![constant], ..Default::default() };
        ModelProto { ir_version: Some(8), graph: Some(g), functions: vec![f], ..Default::default() }.encode_to_vec()
    }

    /// Writes `a` as a private copy in `dir` and spills `models` onto its data file.
    fn copy_and_spill(models: &mut [&mut ModelProto], dir: &Path, min: u64) -> u64 {
        let path = dir.join("model.onnx");
        let mut placed = Vec::new();
        crate::storage::digest::save_placed(models[0], &path, 1024, &mut placed).unwrap();
        spill_onto(models, &dir.join("model.onnx.data"), &placed, min).unwrap()
    }

    #[test]
    fn spilled_models_encode_the_same_and_free_their_source() {
        let freed = Arc::new(AtomicBool::new(false));
        let source = Bytes::from_owner(Tracked(model_bytes(), freed.clone()));
        let mut a = ModelProto::decode(source.clone()).unwrap();
        let mut b = ModelProto::decode(source).unwrap();
        b.graph.as_mut().unwrap().initializer[0].name = Some("only in b".into()); // same bytes
        let before = (a.encode_to_vec(), b.encode_to_vec());
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert_eq!(copy_and_spill(&mut [&mut a, &mut b], dir.path(), 0), 4096, "the weight is mapped, once");
        assert_eq!((a.encode_to_vec(), b.encode_to_vec()), before);
        assert!(freed.load(Ordering::SeqCst), "a slice of the source is still held");
        let (wa, wb) = (&a.graph.as_ref().unwrap().initializer[0], &b.graph.as_ref().unwrap().initializer[0]);
        assert_eq!(wa.raw_data.as_ref().unwrap().as_ptr(), wb.raw_data.as_ref().unwrap().as_ptr(), "still shared");
        // The folder removed, the mapping still holds the data; spilled bytes are not spilled again.
        std::fs::remove_dir_all(dir.path()).unwrap();
        assert_eq!(a.encode_to_vec(), before.0);
        let again = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = again.path().join("model.onnx");
        let mut placed = Vec::new();
        crate::storage::digest::save_placed(&a, &path, 1024, &mut placed).unwrap();
        assert_eq!(spill_onto(&mut [&mut a], &again.path().join("model.onnx.data"), &placed, 0).unwrap(), 0);
    }

    #[test]
    fn below_the_minimum_nothing_moves() {
        let source = Bytes::from(model_bytes());
        let mut a = ModelProto::decode(source.clone()).unwrap();
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert_eq!(copy_and_spill(&mut [&mut a], dir.path(), 1 << 30), 0);
        let w = &a.graph.as_ref().unwrap().initializer[0];
        let raw = w.raw_data.as_ref().unwrap();
        assert!(source.as_ptr_range().contains(&raw.as_ptr()), "still a slice of the source");
    }
}
