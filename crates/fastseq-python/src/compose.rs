//! Loading and composing: `compose`, `load_model`, `load_models`.
use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes};

use crate::buffers::shared;
use crate::composed::Composed;
use crate::errors::to_py;
use crate::sources::PySource;
use fastseq::{Adapt, Edge, IoMap, Keep, Mode, Options, Rules, Source};

fn keep_outputs(k: Option<Bound<'_, PyAny>>) -> PyResult<Keep> {
    Ok(match k {
        None => Keep::Last,
        Some(k) if k.is_instance_of::<PyBool>() => {
            if k.extract::<bool>()? {
                Keep::Unconsumed
            } else {
                Keep::Last
            }
        }
        Some(k) => Keep::Names(k.extract::<Vec<String>>()?),
    })
}

fn adapt(a: Option<Bound<'_, PyAny>>) -> PyResult<Adapt> {
    Ok(match a {
        None => Adapt::Off,
        Some(a) if a.is_instance_of::<PyBool>() => {
            if a.extract::<bool>()? {
                Adapt::All
            } else {
                Adapt::Off
            }
        }
        Some(a) => Adapt::Edges(a.extract::<Vec<usize>>()?),
    })
}

/// Loads and composes `sources` (`labels` name them in errors). The linear form:
/// `io_maps[i]` joins model i to i + 1 (by position without it, or where it is None). The
/// graph form: `edges` (from stage, output, to stage, input), stages and edges in any order (the stages are put
/// in an order where every edge goes forward, the given one where the edges allow; a cycle
/// is an error); `graph_inputs` (name, [(stage, input), ...]) and `graph_outputs` (name,
/// stage, output) expose values under the caller's names (without `graph_outputs`: every
/// output no edge consumes, under its own name when unique among them, else
/// `stage.output`). Errors name the caller's keys (`edges[2]: ...`). `prune` and `dedupe`
/// default to on in the graph form, off in the linear one; `adapt`: True or a list of edge
/// indices; `rules="onnx.compose"`: two models as `onnx.compose.merge_models` merges them;
/// `adapt_remedy`: what an edge an adapter would fix says to do where adapters are off (the
/// entry point's own remedy, `{}` standing for the adapter); `link_external`: external
/// tensors keep pointing at their files, which a save links. :meth:`Composed.plan` says
/// what was decided.
#[pyfunction(name = "compose")]
#[pyo3(signature = (sources, labels, io_maps=None, edges=None, graph_inputs=None, graph_outputs=None,
                    keep_outputs: "bool | collections.abc.Sequence[str] | None" = None, prefixes=None,
                    inputs=None, outputs=None, ir_version=None, meta=None, model_version=None,
                    link_external=false, prune=None, dedupe=None,
                    adapt: "bool | collections.abc.Sequence[int] | None" = None, rules="fastseq",
                    adapt_remedy=None))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(crate) fn compose_sources(
    py: Python<'_>,
    sources: Vec<PySource>,
    labels: Vec<String>,
    io_maps: Option<Vec<Option<IoMap>>>,
    edges: Option<Vec<(usize, String, usize, String)>>,
    graph_inputs: Option<Vec<(String, Vec<(usize, String)>)>>,
    graph_outputs: Option<Vec<(String, usize, String)>>,
    keep_outputs: Option<Bound<'_, PyAny>>,
    prefixes: Option<Vec<Option<String>>>,
    inputs: Option<Vec<String>>,
    outputs: Option<Vec<String>>,
    ir_version: Option<i64>,
    meta: Option<HashMap<String, String>>,
    model_version: Option<i64>,
    link_external: bool,
    prune: Option<bool>,
    dedupe: Option<bool>,
    adapt: Option<Bound<'_, PyAny>>,
    rules: &str,
    adapt_remedy: Option<String>,
) -> PyResult<Composed> {
    let rules = match rules {
        "fastseq" => Rules::Fastseq,
        "onnx.compose" => Rules::OnnxCompose,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "rules must be 'fastseq' or 'onnx.compose', not {other:?}"
            )))
        }
    };
    let meta = meta.unwrap_or_default();
    let opts = Options {
        io_maps,
        edges: edges
            .map(|es| es.into_iter().map(|(from, output, to, input)| Edge { from, output, to, input }).collect()),
        graph_inputs,
        graph_outputs,
        keep_outputs: self::keep_outputs(keep_outputs)?,
        prefixes: prefixes.unwrap_or_default(),
        inputs,
        outputs,
        prune,
        dedupe,
        adapt: self::adapt(adapt)?,
        ir_version,
        graph_name: meta.get("name").cloned(),
        doc_string: meta.get("doc_string").cloned(),
        producer_name: meta.get("producer_name").cloned(),
        producer_version: meta.get("producer_version").cloned(),
        domain: meta.get("domain").cloned(),
        model_version,
        rules,
        adapt_remedy,
        read_weight: None, // the core's pipeline hands in its own
    };
    let sources: Vec<Source> = sources.into_iter().map(|s| s.0).collect();
    let mode = if link_external { Mode::Link } else { Mode::Range };
    let composed = py.detach(|| fastseq::compose(sources, &labels, opts, mode)).map_err(to_py)?;
    Ok(Composed(composed))
}

/// Loads one model (external data resolved) without composing it.
#[pyfunction]
#[pyo3(signature = (source, label=None))]
pub(crate) fn load_model(py: Python<'_>, source: PySource, label: Option<String>) -> PyResult<Composed> {
    py.detach(|| fastseq::load(source.0, label.as_deref())).map(Composed).map_err(to_py)
}

/// Loads several models in parallel (external data resolved), one Composed each: the
/// stages a pipeline keeps so that it can be composed again without reading its sources.
#[pyfunction]
pub(crate) fn load_models(py: Python<'_>, sources: Vec<PySource>, labels: Vec<String>) -> PyResult<Vec<Composed>> {
    let sources: Vec<Source> = sources.into_iter().map(|s| s.0).collect();
    let models = py.detach(|| fastseq::load_all(sources, &labels)).map_err(to_py)?;
    Ok(models.into_iter().map(Composed).collect())
}

/// Decodes a serialized model (a `GraphProto` with `graph=True`) as it is: tensors in
/// external data stay references, nothing is read from disk.
#[pyfunction]
#[pyo3(signature = (data, label="model", graph=false))]
pub(crate) fn decode(py: Python<'_>, data: Bound<'_, PyBytes>, label: &str, graph: bool) -> PyResult<Composed> {
    let data = shared(&data);
    py.detach(|| fastseq::decode(data, label, graph)).map(Composed).map_err(to_py)
}

/// The names the graphs of `g1` and `g2` share, by kind: see `Composed::overlapping_names`.
#[pyfunction]
pub(crate) fn overlapping_names(
    g1: PyRef<'_, Composed>,
    g2: PyRef<'_, Composed>,
    io_map_inputs: Vec<String>,
) -> Vec<(&'static str, Vec<String>)> {
    g1.0.overlapping_names(&g2.0, &io_map_inputs)
}
