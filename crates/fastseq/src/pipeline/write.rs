//! Models out: a [`Composed`] written by storage's one writer (an export to a file, bytes),
//! the session's private copy with the pipeline's models spilled onto it, and the digest
//! that keys the session cache, all laid out as [`LAYOUT`](crate::storage::layout::LAYOUT) says.
use std::borrow::Cow;
use std::path::Path;

use prost::Message;

use crate::codec::model::{encode_into, strip_weights};
use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::pipeline::composed::Composed;
use crate::storage::digest::model_digest;
use crate::storage::ranges::inline;
use crate::storage::spill;
use crate::storage::writer::{save, Saved};

/// A model ready to encode, its weights inline (see [`Composed::encoded`]).
pub struct Encoded<'a>(Cow<'a, ModelProto>);

impl Encoded<'_> {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.encoded_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encodes it into `buf`, of exactly [`Encoded::len`] bytes (a caller's buffer: a Python
    /// `bytes` object is filled in place, with no copy in between).
    pub fn encode_into(&self, buf: &mut [u8]) -> Result<()> {
        encode_into(&self.0, buf)
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.0.encode_to_vec()
    }
}

/// What [`private_copy`] did: the bytes moved each way, and the models spilled onto it.
#[derive(Debug, Default)]
pub struct PrivateCopy {
    /// Bytes the kernel copied from the sources (and from earlier private copies).
    pub copied: u64,
    /// Of those, bytes copied with `sendfile` (across file systems).
    pub by_sendfile: u64,
    /// Bytes written from memory.
    pub written: u64,
    /// Bytes the spilled models map.
    pub mapped: u64,
    /// Copies of the models given that map the copy's data file instead of their sources.
    pub spilled: Option<Vec<Composed>>,
}

impl Composed {
    /// Writes the model to `path` atomically, with storage's one writer. `external`:
    /// Some(true) puts tensors of at least `threshold` bytes in a data file beside it (the
    /// name [`LAYOUT`](crate::storage::layout::LAYOUT) gives it, when that is free or the
    /// writer's), Some(false) keeps them inline, None decides by size (external at the 2 GB
    /// protobuf limit). A linked model links its sources' data files beside it. The file
    /// keeps the composition's stage map in its metadata (see `merge::stage_map`).
    pub fn save(&self, path: &Path, external: Option<bool>, threshold: usize) -> Result<Saved> {
        save(&self.composition().for_file(), path, external, self.is_linked(), threshold)
    }

    /// The same pipeline over its model as [`Composed::save`] writes it (its stage map in its
    /// metadata), for a writer that is not the core's (onnx.save with its own keywords).
    pub fn for_file(&self) -> Composed {
        self.with_model(self.composition().for_file().into_owned())
    }

    /// The model with its weights inline, ready to encode: weights still in their source
    /// files are read first (checked against them). A linked model has no bytes of its own.
    pub fn encoded(&self) -> Result<Encoded<'_>> {
        if self.is_linked() {
            return Err(Error::export(
                "this model refers to its sources' data files (external_data='reuse'): save() it instead",
            ));
        }
        Ok(Encoded(inline(self.model())?))
    }

    /// The serialized model (see [`Composed::encoded`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.encoded()?.to_vec())
    }

    /// The model without its initializers of at least `threshold` bytes (nor those still in
    /// their files), ready to encode: what a tool that reads only the structure needs (the
    /// opset converter), put back together by [`Composed::with_weights`].
    pub fn stripped(&self, threshold: usize) -> Encoded<'static> {
        Encoded(Cow::Owned(strip_weights(self.model(), threshold)))
    }

    /// The model's graph alone, serialized (a `GraphProto`), its weights inline.
    pub fn graph_bytes(&self) -> Result<Vec<u8>> {
        let model = inline(self.model())?;
        Ok(model.graph.as_ref().map(|g| g.encode_to_vec()).unwrap_or_default())
    }

    /// The digest of the model as [`private_copy`] writes it for a session (the session
    /// cache's key), read where its weights are without writing or keeping them (see
    /// `storage::digest::model_digest`). A source file that is no longer the one loaded is
    /// a load error naming it.
    pub fn digest(&self) -> Result<String> {
        model_digest(self.model())
    }
}

/// Writes `models[0]` for a session at `path` (weights in `<path>.data`, as [`LAYOUT`](crate::storage::layout::LAYOUT)
/// names it; not synced: the copy lives in a private folder). With `spill_min`, the weights
/// that only `models[1..]` hold as ranges of their sources go into the data file too, and
/// copies of all `models` that map it are returned (`spilled`): always when they hold
/// ranges (a pipeline must not depend on its sources), else when they hold at least
/// `spill_min` bytes in memory. The originals are left as they are.
pub fn private_copy(models: &[&Composed], path: &Path, spill_min: Option<u64>) -> Result<PrivateCopy> {
    let refs: Vec<&ModelProto> = models.iter().map(|c| c.model()).collect();
    let done = spill::private_copy(&refs, path, spill_min)?;
    let spilled = done.spilled.map(|copies| models.iter().zip(copies).map(|(c, m)| c.with_model(m)).collect());
    Ok(PrivateCopy {
        copied: done.copied,
        by_sendfile: done.by_sendfile,
        written: done.written,
        mapped: done.mapped,
        spilled,
    })
}

/// The bytes `models` hold in memory of their own (not mapped from a private copy), each
/// slice counted once: what [`private_copy`] spills from `spill_min` on.
pub fn memory_bytes(models: &[&Composed]) -> u64 {
    let refs: Vec<&ModelProto> = models.iter().map(|c| c.model()).collect();
    spill::memory_bytes(&refs)
}
