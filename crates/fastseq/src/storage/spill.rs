//! The session's private copy, and spilling: pointing what a pipeline holds at that copy.
//!
//! A pipeline keeps its models (the composed one and, for `ONNXSequential`, the ones it was
//! built from) for exports, new sessions and `combine`. Their large weights are ranges of
//! the source files (see [`crate::codec::range`]), which a live pipeline must not depend on,
//! and their other bytes are in memory read from the sources. The session's private copy is
//! written first: the ranges copied by the kernel, the weights in memory written once. Then
//! the pipeline maps the copy's data file (it stays alive, unlinked, after its folder is
//! removed) and points its models at it: every range, always, and the weights in memory
//! when there are enough of them to be worth it, letting go of the sources' memory. The
//! weights are then pages of one file, shared with ONNX Runtime's own mapping of it, not
//! counted until touched, and no other program can open the file by name once the folder is
//! gone. Nothing is copied twice.
//!
//! Every `Bytes` of the given models is visited; slices that several models share (a stage
//! and the composed model) stay shared. What is not in the data file (nodes, small tensors,
//! weights only a stage holds) is copied into one fresh buffer, so that no slice keeps a
//! source buffer alive.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use crate::codec::range::{set_inline, FileRange};
use crate::error::{Error, Result};
use crate::storage::copy::Copied;
use crate::storage::data_file::{Held, Placed};
use crate::storage::mapped::{is_mapped, Mapping};
use crate::storage::ranges::{by_file, Source};

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

/// The bytes `models` hold in memory of their own (not mapped from a private copy), each
/// slice counted once however many models share it: what [`spill_onto`] compares with its
/// minimum.
pub fn memory_bytes(models: &[&ModelProto]) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for m in models {
        // for_each_bytes takes a model to change: a clone shares every slice, copying none.
        let mut m = (*m).clone();
        for_each_bytes(&mut m, &mut |b| {
            if !b.is_empty() && !is_mapped(b) && seen.insert((b.as_ptr() as usize, b.len())) {
                total += b.len() as u64;
            }
        });
    }
    total
}

/// The ranges the main-graph initializers of `models` hold.
fn ranges_of(models: &[&mut ModelProto]) -> Vec<FileRange> {
    models.iter().flat_map(|m| crate::codec::range::ranges(m).map(|(_, r)| r)).collect()
}

/// Points the bytes of `models` at `data`, the data files of a private copy that hold each
/// weight `placed` lists where it says: every range of a source file, always (a pipeline
/// must not depend on its sources), and the weights in memory when at least `min_bytes` of
/// them are not spilled yet; the rest of the memory is then copied into one fresh buffer.
/// Returns the number of bytes now mapped (0: nothing done). The models encode exactly as
/// before.
pub fn spill_onto(models: &mut [&mut ModelProto], data: &[PathBuf], placed: &[Placed], min_bytes: u64) -> Result<u64> {
    let placed: HashMap<&Held, (usize, u64)> = placed.iter().map(|p| (&p.held, (p.part, p.offset))).collect();
    let mut ranges: HashMap<FileRange, (usize, u64)> = HashMap::new();
    for r in ranges_of(models) {
        let off = placed
            .get(&Held::File(r.clone()))
            .copied()
            .ok_or_else(|| Error::export(format!("{}: a weight of this file is not in the session's copy", r.path)))?;
        ranges.insert(r, off);
    }
    // The distinct slices in memory not spilled yet; those the data file does not hold, in
    // order, with their offset in the buffer that will hold them.
    let mut seen: HashMap<(usize, usize), Option<usize>> = HashMap::new();
    let (mut total, mut in_file, mut rest) = (0u64, 0u64, Vec::<Bytes>::new());
    let mut rest_len = 0usize;
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            if b.is_empty() || is_mapped(b) {
                return;
            }
            let key = (b.as_ptr() as usize, b.len());
            seen.entry(key).or_insert_with(|| {
                total += b.len() as u64;
                if placed.contains_key(&Held::Memory(key.0, key.1)) {
                    in_file += b.len() as u64;
                    None
                } else {
                    rest.push(b.clone());
                    rest_len += b.len();
                    Some(rest_len - b.len())
                }
            });
        });
    }
    let memory = total >= min_bytes && in_file > 0;
    if ranges.is_empty() && !memory {
        return Ok(0);
    }
    let mut wholes = Vec::new();
    for (j, path) in data.iter().enumerate() {
        let io = |e: std::io::Error| Error::export(format!("cannot map {}: {e}", path.display()));
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let ends = placed.iter().filter(|(_, (part, _))| *part == j).map(|(h, (_, off))| match h {
            Held::Memory(_, n) => off + *n as u64,
            Held::File(r) => off + r.len,
        });
        if ends.max().is_some_and(|end| end > len) {
            return Err(Error::export(format!("{}: shorter than what was written to it", path.display())));
        }
        wholes.push(Bytes::from_owner(Mapping::of(file).map_err(io)?));
    }
    let slice = |(part, off): (usize, u64), n: u64| wholes[part].slice(off as usize..(off + n) as usize);
    let mut mapped: u64 = ranges.keys().map(|r| r.len).sum();
    for m in models.iter_mut() {
        for t in m.graph.iter_mut().flat_map(|g| g.initializer.iter_mut()) {
            if let Some(r) = FileRange::of(t) {
                set_inline(t, slice(ranges[&r], r.len));
            }
        }
    }
    if !memory {
        return Ok(mapped);
    }
    mapped += in_file;
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(rest_len).map_err(|_| Error::export("out of memory".to_string()))?;
    rest.iter().for_each(|b| buffer.extend_from_slice(b));
    drop(rest);
    let copied = Bytes::from(buffer);
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            let key = (b.as_ptr() as usize, b.len());
            let n = b.len();
            if let Some(&at) = placed.get(&Held::Memory(key.0, key.1)) {
                *b = slice(at, n as u64);
            } else if let Some(Some(off)) = seen.get(&key) {
                *b = copied.slice(*off..*off + n);
            }
        });
    }
    Ok(mapped)
}

/// What [`private_copy`] did.
#[derive(Debug, Default)]
pub struct PrivateCopy {
    /// Bytes the kernel copied from the sources (and from earlier private copies).
    pub copied: u64,
    /// Of those, bytes copied with `sendfile` (across file systems).
    pub by_sendfile: u64,
    /// Bytes written from memory.
    pub written: u64,
    /// Bytes the spilled models map (see [`spill_onto`]).
    pub mapped: u64,
    /// Copies of the models given, spilled onto the copy's data file.
    pub spilled: Option<Vec<ModelProto>>,
}

/// Writes `models[0]` for a session at `path` (weights in `<path>.data`, not synced; see
/// [`crate::storage::writer::write_session_copy`]). With `spill_min`, the weights that only
/// `models[1..]` hold as ranges of their sources are copied into the data file too, and
/// copies of all `models` spilled onto it are returned (see [`spill_onto`]): always when they hold ranges, else when there are at
/// least `spill_min` bytes to spill. The originals are left as they are.
pub fn private_copy(models: &[&ModelProto], path: &Path, spill_min: Option<u64>) -> Result<PrivateCopy> {
    let Some(first) = models.first() else { return Err(Error::export("no model to write".to_string())) };
    let mut placed = Vec::new();
    let written = crate::storage::writer::write_session_copy(first, path, &mut placed)?;
    let mut done = PrivateCopy {
        copied: written.copied.bytes,
        by_sendfile: written.copied.by_sendfile,
        written: written.from_memory,
        ..Default::default()
    };
    let Some(min) = spill_min else { return Ok(done) };
    let data: Vec<PathBuf> = written.data_names.iter().map(|n| path.with_file_name(n)).collect();
    let extra: Vec<FileRange> = models[1..]
        .iter()
        .flat_map(|m| crate::codec::range::ranges(m).map(|(_, r)| r))
        .filter(|r| !placed.iter().any(|p| matches!(&p.held, Held::File(q) if q == r)))
        .collect();
    let appended = append_ranges(&data[0], &extra, &mut placed)?;
    done.copied += appended.bytes;
    done.by_sendfile += appended.by_sendfile;
    // Below the minimum in the data file alone, and nothing to move off the sources, no
    // model is copied to find out more.
    let in_memory: u64 = placed.iter().map(|p| if let Held::Memory(_, n) = p.held { n as u64 } else { 0 }).sum();
    if in_memory < min && !placed.iter().any(|p| matches!(p.held, Held::File(_))) {
        return Ok(done);
    }
    let mut copies: Vec<ModelProto> = models.iter().map(|m| (*m).clone()).collect();
    let mut refs: Vec<&mut ModelProto> = copies.iter_mut().collect();
    done.mapped = spill_onto(&mut refs, &data, &placed, min)?;
    if done.mapped > 0 {
        done.spilled = Some(copies);
    }
    Ok(done)
}

/// Copies `ranges` to the end of the data file at `data` (aligned), recording where.
fn append_ranges(data: &Path, ranges: &[FileRange], placed: &mut Vec<Placed>) -> Result<Copied> {
    if ranges.is_empty() {
        return Ok(Copied::default());
    }
    let io = |e: std::io::Error| Error::export(format!("cannot write {}: {e}", data.display()));
    let file = File::options().read(true).write(true).open(data).map_err(io)?;
    let mut end = file.metadata().map_err(io)?.len();
    let mut at = Vec::new();
    for r in ranges {
        end += (4096 - end % 4096) % 4096;
        at.push((r, end));
        placed.push(Placed { held: Held::File(r.clone()), part: 0, offset: end });
        end += r.len;
    }
    file.set_len(end).map_err(io)?;
    let mut copied = Copied::default();
    for (first, items) in by_file(at) {
        copied += Source::open(first)?.copy_into(&items, &file, data)?;
    }
    Ok(copied)
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
        crate::storage::writer::write_session_copy(models[0], &path, &mut placed).unwrap();
        spill_onto(models, &[dir.join("model.onnx.data")], &placed, min).unwrap()
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
        let held = memory_bytes(&[&a, &b]);
        assert!((4096..2 * 4096).contains(&held), "shared slices count once: {held}");
        assert_eq!(copy_and_spill(&mut [&mut a, &mut b], dir.path(), 0), 4096, "the weight is mapped, once");
        assert_eq!(memory_bytes(&[&a, &b]), held - 4096, "the mapped weight is not memory of their own");
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
        crate::storage::writer::write_session_copy(&a, &path, &mut placed).unwrap();
        assert_eq!(spill_onto(&mut [&mut a], &[again.path().join("model.onnx.data")], &placed, 0).unwrap(), 0);
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

    #[test]
    fn ranges_are_copied_into_the_copy_and_the_spilled_models_no_longer_need_their_sources() {
        use crate::storage::external::Mode;
        use crate::storage::source::{load, Source};
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let model = |seed: u8| {
            let raw: Vec<u8> = (0..200_000usize).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
            let mut m = ModelProto::decode(Bytes::from(model_bytes())).unwrap();
            m.graph.as_mut().unwrap().initializer[0] = TensorProto {
                name: Some("w".into()),
                data_type: Some(1),
                dims: vec![50_000],
                raw_data: Some(Bytes::from(raw)),
                ..Default::default()
            };
            m
        };
        let (pa, pb) = (dir.path().join("a.onnx"), dir.path().join("b.onnx"));
        std::fs::write(&pa, model(1).encode_to_vec()).unwrap();
        std::fs::write(&pb, model(2).encode_to_vec()).unwrap();
        let a = load("a", Source::Path(pa.clone(), None), Mode::Range).unwrap();
        let b = load("b", Source::Path(pb.clone(), None), Mode::Range).unwrap();
        assert!(crate::codec::range::has_ranges(&a) && crate::codec::range::has_ranges(&b));
        let expected = [model(1).encode_to_vec(), model(2).encode_to_vec()];
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        // b's weight is in no model written: it is appended to the data file all the same.
        let done = private_copy(&[&a, &b], &private.join("model.onnx"), Some(u64::MAX)).unwrap();
        assert_eq!((done.copied, done.written, done.mapped), (400_000, 0, 400_000));
        // The key is the model's, wherever its weights are: the sources, memory, the copy.
        let digest = |m: &ModelProto| crate::storage::digest::model_digest(m).unwrap();
        assert_eq!(digest(&a), digest(&model(1)));
        assert_ne!(digest(&a), digest(&b));
        let spilled = done.spilled.expect("ranges are always moved off the sources");
        std::fs::remove_dir_all(&private).unwrap();
        std::fs::write(&pa, b"").unwrap();
        std::fs::remove_file(&pb).unwrap();
        for (m, want) in spilled.iter().zip(&expected) {
            assert!(!crate::codec::range::has_ranges(m));
            assert_eq!(&m.encode_to_vec(), want);
        }
        assert_eq!(digest(&spilled[0]), digest(&model(1)));
        let gone = crate::storage::digest::model_digest(&a).unwrap_err();
        assert!(gone.message.contains("a.onnx"), "{}", gone.message);
        // A copy of the spilled models comes from the first copy's file, in the kernel.
        let again = dir.path().join("again");
        std::fs::create_dir(&again).unwrap();
        let done = private_copy(&[&spilled[0]], &again.join("model.onnx"), Some(u64::MAX)).unwrap();
        assert_eq!((done.copied, done.written, done.mapped), (200_000, 0, 0));
    }
}
