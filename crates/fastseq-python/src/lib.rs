//! The Python bindings: `fastseq._core`, over the core crate's API (`fastseq`: its
//! pipeline layer and the types it re-exports). Each file converts one concept's types
//! between Python and the core, releases the GIL around the core's work and maps errors
//! ([`errors`]); nothing here decides anything.
use pyo3::prelude::*;

mod buffers;
mod compose;
mod composed;
mod errors;
mod files;
mod io_infos;
mod layout;
mod plan;
mod server;
mod serving;
mod sources;
mod writer;

use crate::compose::{compose_sources, decode, load_model, load_models, overlapping_names};
use crate::composed::Composed;
use crate::errors::{composition_error, opset_mismatch_error, ExportError, FastseqError, LoadError};
use crate::files::{
    external_data_locations, file_digest, memory_bytes, model_digest, open_input, write_private_copy, PrivateCopyInfo,
};
use crate::layout::{merge_metadata, PyLayout};
use crate::writer::{check_target, commit_bytes, stage, Saved, Staging};
use fastseq::{tune_allocator, LAYOUT, MAX_BATCH_ROWS, MAX_IR_VERSION, PROTOBUF_LIMIT};

/// The hint ` (did you mean 'x'?)` for `name` among `candidates`, or an empty string.
#[pyfunction]
fn did_you_mean(name: &str, candidates: Vec<String>) -> String {
    fastseq::did_you_mean(name, candidates.iter().map(String::as_str))
}

/// A name's bytes as the core's text of it: UTF-8 as it is, each byte that is not kept as an
/// escape character (protobuf hands Python a `string` field that is not UTF-8 as `bytes`).
#[pyfunction]
fn name_text(data: &[u8]) -> String {
    fastseq::name_text(data.to_vec())
}

/// The target's C environment ("gnu", "musl", "msvc"; "" where there is none).
const TARGET_ENV: &str = if cfg!(target_env = "gnu") {
    "gnu"
} else if cfg!(target_env = "musl") {
    "musl"
} else if cfg!(target_env = "msvc") {
    "msvc"
} else {
    ""
};

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_allocator();
    let py = m.py();
    m.add("FastseqError", py.get_type::<FastseqError>())?;
    m.add("LoadError", py.get_type::<LoadError>())?;
    m.add("CompositionError", composition_error(py))?;
    m.add("OpsetMismatchError", opset_mismatch_error(py))?;
    m.add("ExportError", py.get_type::<ExportError>())?;
    m.add("MAX_IR_VERSION", MAX_IR_VERSION)?;
    m.add("PROTOBUF_LIMIT", PROTOBUF_LIMIT)?;
    m.add("MAX_BATCH_SIZE", MAX_BATCH_ROWS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // What this extension was built for, for `fastseq --version` and bug reports: the
    // target's arch-os-env and the profile (a debug build is far slower; say so).
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let (arch, os) = (std::env::consts::ARCH, std::env::consts::OS);
    let target = if TARGET_ENV.is_empty() { format!("{arch}-{os}") } else { format!("{arch}-{os}-{TARGET_ENV}") };
    m.add("__build__", format!("{target} {profile}"))?;
    m.add("LAYOUT", PyLayout(LAYOUT))?;
    m.add_class::<Composed>()?;
    m.add_class::<Staging>()?;
    m.add_class::<Saved>()?;
    m.add_class::<PrivateCopyInfo>()?;
    m.add_class::<PyLayout>()?;
    m.add_class::<server::Server>()?;
    m.add_class::<server::TensorData>()?;
    m.add_function(wrap_pyfunction!(server::start_server, m)?)?;
    m.add_class::<serving::ServedSpec>()?;
    m.add_function(wrap_pyfunction!(serving::served_spec, m)?)?;
    m.add_function(wrap_pyfunction!(serving::served_documents, m)?)?;
    m.add_function(wrap_pyfunction!(serving::decode_http, m)?)?;
    m.add_function(wrap_pyfunction!(serving::encode_http, m)?)?;
    m.add_function(wrap_pyfunction!(serving::error_json, m)?)?;
    m.add_function(wrap_pyfunction!(compose_sources, m)?)?;
    m.add_function(wrap_pyfunction!(load_model, m)?)?;
    m.add_function(wrap_pyfunction!(load_models, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(overlapping_names, m)?)?;
    m.add_function(wrap_pyfunction!(external_data_locations, m)?)?;
    m.add_function(wrap_pyfunction!(did_you_mean, m)?)?;
    m.add_function(wrap_pyfunction!(name_text, m)?)?;
    m.add_function(wrap_pyfunction!(file_digest, m)?)?;
    m.add_function(wrap_pyfunction!(open_input, m)?)?;
    m.add_function(wrap_pyfunction!(write_private_copy, m)?)?;
    m.add_function(wrap_pyfunction!(model_digest, m)?)?;
    m.add_function(wrap_pyfunction!(memory_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(merge_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(commit_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(stage, m)?)?;
    m.add_function(wrap_pyfunction!(check_target, m)?)?;
    Ok(())
}
