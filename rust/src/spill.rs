//! Spilling: moving what a pipeline holds in owned memory (the sources' bytes: weights and
//! nodes) into a private file that it maps instead.
//!
//! Sources are read into owned memory (see `model::read_path`), which a live pipeline keeps
//! for exports, new sessions and `combine`. While ONNX Runtime builds a session from the
//! private copy, that memory counts a second time. Once spilled, the same bytes are pages of
//! an unlinked file: not counted until touched, written back and reclaimed under pressure,
//! and still immune to anything another program does to the sources (no other process can
//! open an unlinked file by name, so it cannot truncate or rewrite it).
//!
//! Every `Bytes` of the given models is visited; slices that several models share (a stage
//! and the composed model) stay shared, so the source buffers are freed once all are moved.
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};

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

/// Moves the bytes of `models` that are not spilled yet into one unlinked file in `dir`,
/// mapped, when there are at least `min_bytes` of them and `dir` is on a disk. Returns the
/// number of bytes moved (0: nothing done). The models encode exactly as before; on any
/// error they are left as they were.
pub fn spill(models: &mut [&mut ModelProto], dir: &Path, min_bytes: u64) -> Result<u64> {
    // Distinct slices in the order they are first met, with their offset in the file.
    let mut offsets: HashMap<(usize, usize), u64> = HashMap::new();
    let mut order: Vec<Bytes> = Vec::new();
    let mut total = 0u64;
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            if b.is_empty() || is_mapped(b) {
                return;
            }
            offsets.entry((b.as_ptr() as usize, b.len())).or_insert_with(|| {
                order.push(b.clone());
                total += b.len() as u64;
                total - b.len() as u64
            });
        });
    }
    if total < min_bytes || in_memory(dir) {
        return Ok(0);
    }
    let path = dir.join(format!(".fastseq-spill.{}.{}", std::process::id(), crate::model::nanos()));
    let io = |e: std::io::Error| Error::export(format!("cannot spill to {}: {e}", path.display()));
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(io)?
    };
    // Unlinked at once: nothing is left behind whatever happens next, and no other program
    // can open it by name.
    let _ = fs::remove_file(&path);
    let mapping = write_and_map(&file, &order, total).map_err(io)?;
    drop(order);
    let start = mapping.0.as_ptr() as usize;
    MAPPED
        .lock()
        .map_err(|_| Error::export("spill registry poisoned".to_string()))?
        .push((start, start + mapping.0.len()));
    let whole = Bytes::from_owner(mapping);
    for m in models.iter_mut() {
        for_each_bytes(m, &mut |b| {
            if let Some(&off) = offsets.get(&(b.as_ptr() as usize, b.len())) {
                *b = whole.slice(off as usize..off as usize + b.len());
            }
        });
    }
    Ok(total)
}

fn write_and_map(file: &File, parts: &[Bytes], total: u64) -> std::io::Result<Mapping> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    for p in parts {
        out.write_all(p)?;
    }
    out.flush()?;
    drop(out);
    if file.metadata()?.len() != total {
        return Err(std::io::Error::other("short write"));
    }
    // SAFETY: the file is private and unlinked: nothing else can change it under the map.
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Mapping(map))
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
        use crate::proto::{AttributeProto, FunctionProto, GraphProto, NodeProto};
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

    #[test]
    fn spilled_models_encode_the_same_and_free_their_source() {
        let freed = Arc::new(AtomicBool::new(false));
        let source = Bytes::from_owner(Tracked(model_bytes(), freed.clone()));
        let mut a = ModelProto::decode(source.clone()).unwrap();
        let mut b = ModelProto::decode(source).unwrap();
        let before = (a.encode_to_vec(), b.encode_to_vec());
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let n = spill(&mut [&mut a, &mut b], dir.path(), 0).unwrap();
        assert!(n > 4096 && n < 2 * 4096 + 1024, "shared slices are written once: {n}");
        assert_eq!((a.encode_to_vec(), b.encode_to_vec()), before);
        assert!(freed.load(Ordering::SeqCst), "a slice of the source is still held");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "the spill file is unlinked");
        // Spilled bytes are not spilled again.
        assert_eq!(spill(&mut [&mut a], dir.path(), 0).unwrap(), 0);
    }

    #[test]
    fn below_the_minimum_nothing_moves() {
        let source = Bytes::from(model_bytes());
        let mut a = ModelProto::decode(source.clone()).unwrap();
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert_eq!(spill(&mut [&mut a], dir.path(), 1 << 30).unwrap(), 0);
        let w = &a.graph.as_ref().unwrap().initializer[0];
        let raw = w.raw_data.as_ref().unwrap();
        assert!(source.as_ptr_range().contains(&raw.as_ptr()), "still a slice of the source");
    }
}
