//! Weights left in their source files (see [`crate::codec::range`]): recorded when a source
//! is read, checked against the file's identity at load whenever they are used, copied in
//! the kernel into the files fastseq writes, and read (into memory fastseq owns, or a chunk
//! at a time) only where the bytes themselves are needed.
//!
//! A source that is not the file it was at load (rewritten, truncated, replaced) is a
//! LoadError naming it; nothing is ever mapped from a source, so a truncation under a copy is
//! a short copy, never SIGBUS.
use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::codec::model::size_error;
use crate::codec::proto::ModelProto;
use crate::codec::range::{set_inline, FileRange};
use crate::codec::tensor::is_external;
use crate::error::{Error, Result};
use crate::storage::copy::{Copied, Copier};
use crate::storage::read::{changed, open_regular, read_range, Identity, LeftInFile};

/// Inline weights of at least this many bytes are left in their source file; smaller ones
/// are read with the rest of the model (reading them costs no more than recording them).
pub const RANGE_MIN: u64 = 64 << 10;

/// Makes the initializers `left` in the model file at `path` (absolute) ranges of it.
/// An initializer that is external data too takes its data file, as ONNX Runtime does.
/// `label` names the source in errors.
pub fn attach(
    model: &mut ModelProto,
    path: &Path,
    identity: &Identity,
    left: &[LeftInFile],
    label: &str,
) -> Result<()> {
    let Some(g) = model.graph.as_mut() else { return Ok(()) };
    let mut file: Option<File> = None;
    for l in left {
        let Some(t) = g.initializer.get_mut(l.initializer) else { continue };
        if is_external(t) {
            continue;
        }
        if let Some(e) = size_error(t, l.len) {
            return Err(Error::load(format!("{label}: {e}")));
        }
        let shown = path.display();
        if t.data_location.is_none() && t.external_data.is_empty() {
            let path = path.to_string_lossy().into_owned();
            FileRange { path, offset: l.offset, len: l.len, identity: identity.encode() }.put(t);
            continue;
        }
        // A tensor that says something of its location already (inline all the same) keeps
        // what it says: its bytes are read, as they would have been with the rest.
        let f = match &mut file {
            Some(f) => f,
            None => file.insert(open_regular(path, &shown)?.0),
        };
        let (data, seen) = read_range(f, &shown, l.offset, Some(l.len))?;
        if seen != *identity {
            return Err(changed(&shown, "while it was read"));
        }
        t.raw_data = Some(data);
    }
    Ok(())
}

/// A source file opened for its ranges, checked to be the file its model was read from.
pub struct Source {
    pub file: File,
    identity: Identity,
    shown: String,
}

impl Source {
    pub fn open(range: &FileRange) -> Result<Source> {
        let shown = range.path.clone();
        let gone = |e: io::Error| Error::load(format!("{shown}: gone since the model was loaded: {e}"));
        // Not a plain open: the path may name a FIFO by now, which would block it.
        let file = match fs::metadata(&range.path) {
            Err(e) => return Err(gone(e)),
            Ok(_) => open_regular(Path::new(&range.path), &shown)?.0,
        };
        let identity = Identity::decode(&range.identity)
            .ok_or_else(|| Error::load(format!("{shown}: no identity recorded for its weights")))?;
        let source = Source { file, identity, shown };
        source.check("since the model was loaded")?;
        Ok(source)
    }

    /// The file is still the one loaded (a rewrite in place changes its size or times).
    pub fn check(&self, when: &str) -> Result<()> {
        let now = self.file.metadata().map(|m| Identity::of(&m));
        match now {
            Ok(now) if now == self.identity => Ok(()),
            Ok(_) => Err(changed(&self.shown, when)),
            Err(e) => Err(Error::load(format!("{}: cannot read: {e}", self.shown))),
        }
    }

    /// Reads `buf.len()` bytes at `offset` of the range, checking the file after.
    pub fn read_at(&self, range: &FileRange, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset + buf.len() as u64 > range.len {
            return Err(Error::load(format!("{}: read past the end of a weight", self.shown)));
        }
        self.file.read_exact_at(buf, range.offset + offset).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => changed(&self.shown, "while it was read (it got shorter)"),
            _ => Error::load(format!("{}: cannot read: {e}", self.shown)),
        })?;
        self.check("while it was read")
    }

    /// Copies the ranges into `dst` at the offsets given, in the kernel; the file must be
    /// the one loaded before and after. `dst` must be long enough already.
    pub fn copy_into(&self, ranges: &[(&FileRange, u64)], dst: &File, shown_dst: &Path) -> Result<Copied> {
        let mut copier = Copier::new(&self.file, dst);
        let mut done = Copied::default();
        for (range, to) in ranges {
            done += copier.copy(range.offset, *to, range.len).map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => changed(&self.shown, "while it was copied (it got shorter)"),
                _ => Error::export(format!(
                    "cannot write {} (copying weights of {}): {e}",
                    shown_dst.display(),
                    self.shown
                )),
            })?;
        }
        self.check("while it was copied")?;
        Ok(done)
    }
}

/// Groups ranges by their file, in first-seen order.
pub fn by_file<'a, T>(
    items: impl IntoIterator<Item = (&'a FileRange, T)>,
) -> Vec<(&'a FileRange, Vec<(&'a FileRange, T)>)> {
    let mut order: Vec<(&FileRange, Vec<(&FileRange, T)>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (r, x) in items {
        let k = *at.entry(r.path.as_str()).or_insert_with(|| {
            order.push((r, Vec::new()));
            order.len() - 1
        });
        order[k].1.push((r, x));
    }
    order
}

/// Reads every range of `model` into memory fastseq owns (each file checked before and
/// after): the model then holds its weights inline, for a reader of its bytes.
pub fn materialize(model: &mut ModelProto) -> Result<()> {
    let Some(g) = model.graph.as_mut() else { return Ok(()) };
    let ranges: Vec<(usize, FileRange)> =
        g.initializer.iter().enumerate().filter_map(|(i, t)| Some((i, FileRange::of(t)?))).collect();
    for (first, items) in by_file(ranges.iter().map(|(i, r)| (r, *i))) {
        let source = Source::open(first)?;
        for (r, i) in items {
            let (data, seen) = read_range(&source.file, &source.shown, r.offset, Some(r.len))?;
            if seen != source.identity {
                return Err(changed(&source.shown, "since the model was loaded"));
            }
            set_inline(&mut g.initializer[i], data);
        }
    }
    Ok(())
}

/// A copy of `model` with every range read into memory (see [`materialize`]); the model
/// itself when it holds none (its bytes shared, nothing copied).
pub fn inline(model: &ModelProto) -> Result<std::borrow::Cow<'_, ModelProto>> {
    if !crate::codec::range::has_ranges(model) {
        return Ok(std::borrow::Cow::Borrowed(model));
    }
    let mut m = model.clone();
    materialize(&mut m)?;
    Ok(std::borrow::Cow::Owned(m))
}

/// Every range of `model` checked against its file (see [`Source::check`]).
pub fn check(model: &ModelProto) -> Result<()> {
    let ranges: Vec<FileRange> = crate::codec::range::ranges(model).map(|(_, r)| r).collect();
    for (first, _) in by_file(ranges.iter().map(|r| (r, ()))) {
        Source::open(first)?;
    }
    Ok(())
}

/// Reads `buf.len()` bytes at `offset` of a weight still in its file: how the merge layer
/// compares weights (see `merge::dedupe`) without holding them.
pub fn read_weight(range: &FileRange, offset: u64, buf: &mut [u8]) -> Result<()> {
    Source::open(range)?.read_at(range, offset, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{GraphProto, TensorProto};
    use crate::storage::external::Mode;
    use crate::storage::source::{load, Source as ModelSource};
    use bytes::Bytes;
    use prost::Message;

    /// A model whose one initializer holds `n` float32 values from `seed`.
    pub(crate) fn weight_model(n: usize, seed: u8) -> ModelProto {
        let raw: Vec<u8> = (0..n * 4).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        ModelProto {
            ir_version: Some(8),
            graph: Some(GraphProto {
                name: Some("g".into()),
                initializer: vec![TensorProto {
                    name: Some("w".into()),
                    data_type: Some(1),
                    dims: vec![n as i64],
                    raw_data: Some(Bytes::from(raw)),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn large_inline_weights_are_ranges_read_back_only_when_asked() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("m.onnx");
        let model = weight_model(50_000, 3);
        std::fs::write(&path, model.encode_to_vec()).unwrap();
        let m = load("m.onnx", ModelSource::Path(path.clone(), None), Mode::Range).unwrap();
        let (_, r) = crate::codec::range::ranges(&m).next().expect("left in the file");
        assert_eq!((r.len, r.path.clone()), (200_000, path.canonicalize().unwrap().to_string_lossy().into_owned()));
        check(&m).unwrap();
        assert_eq!(inline(&m).unwrap().encode_to_vec(), model.encode_to_vec());
        let mut buf = [0u8; 8];
        read_weight(&r, 100, &mut buf).unwrap();
        assert_eq!(&buf, &model.graph.as_ref().unwrap().initializer[0].raw_data.as_ref().unwrap()[100..108]);
        // Small weights are read with the model; every byte read in place mode.
        let small = load("m", ModelSource::Path(path.clone(), None), Mode::InPlace).unwrap();
        assert!(!crate::codec::range::has_ranges(&small));
        // The file rewritten (same size, other bytes): every use of the range refuses it.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&path, weight_model(50_000, 4).encode_to_vec()).unwrap();
        for err in [check(&m).unwrap_err(), inline(&m).unwrap_err(), read_weight(&r, 0, &mut buf).unwrap_err()] {
            assert!(err.message.contains("the file changed since the model was loaded"), "{}", err.message);
            assert!(err.message.starts_with(&r.path), "{}", err.message);
        }
        std::fs::remove_file(&path).unwrap();
        assert!(check(&m).unwrap_err().message.contains("gone since the model was loaded"));
    }

    #[test]
    fn a_wrong_size_left_in_the_file_is_a_load_error() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("m.onnx");
        let mut model = weight_model(50_000, 3);
        model.graph.as_mut().unwrap().initializer[0].dims = vec![50_001];
        std::fs::write(&path, model.encode_to_vec()).unwrap();
        let err = load("m.onnx", ModelSource::Path(path, None), Mode::Range).unwrap_err();
        assert!(
            err.message.starts_with("m.onnx: tensor 'w'") && err.message.contains("need 200004"),
            "{}",
            err.message
        );
    }
}
