//! Sources in: loading them (storage) and composing them (merge, with storage's reader of
//! the weights still in their files handed in).
use bytes::Bytes;

use crate::codec::model::{decode as decode_model, decode_graph};
use crate::error::Result;
use crate::merge::compose::compose as merge;
use crate::merge::options::Options;
use crate::pipeline::composed::Composed;
use crate::storage::external::Mode;
use crate::storage::ranges::read_weight;
use crate::storage::source::{load as load_source, load_all as load_sources, Source};

/// Loads one model, its external data resolved, its large weights left in their files as
/// ranges ([`Mode::Range`]). `label` names it in errors (default: its path, or "model").
pub fn load(source: Source, label: Option<&str>) -> Result<Composed> {
    let label = label.map_or_else(|| source.default_label(), str::to_string);
    let model = load_source(&label, source, Mode::Range)?;
    Ok(Composed::single(model, &label, false))
}

/// Loads several models side by side (as [`load`]), one [`Composed`] each: the stages a
/// pipeline keeps so that it can be composed again without reading its sources.
pub fn load_all(sources: Vec<Source>, labels: &[String]) -> Result<Vec<Composed>> {
    let models = load_sources(sources, labels, Mode::Range)?;
    Ok(models.into_iter().zip(labels).map(|(model, label)| Composed::single(model, label, false)).collect())
}

/// Decodes a serialized model (a `GraphProto` with `graph`) as it is: tensors in external
/// data stay references, nothing is read from disk.
pub fn decode(data: Bytes, label: &str, graph: bool) -> Result<Composed> {
    let model = if graph { decode_graph(label, &data)? } else { decode_model(label, data)? };
    Ok(Composed::single(model, label, false))
}

/// Loads `sources` side by side (`labels[i]` names `sources[i]` in errors) and composes them
/// as `options` say. `mode` says how external data is taken in: [`Mode::Range`] leaves
/// large weights in their files (copied by the kernel when the result is written),
/// [`Mode::Link`] leaves external tensors pointing at their files, which a save links
/// beside the model instead of copying; [`Mode::InPlace`] reads every byte.
pub fn compose(sources: Vec<Source>, labels: &[String], mut options: Options, mode: Mode) -> Result<Composed> {
    // The merge compares weights still in their files (dedupe) through storage's reader.
    options.read_weight = Some(read_weight);
    let models = load_sources(sources, labels, mode)?;
    Ok(Composed::new(merge(models, labels, &options)?, mode == Mode::Link))
}
