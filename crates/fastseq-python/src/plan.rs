//! The plan of a composition as plain Python data (dicts, lists, tuples of str and int).
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::io_infos::io_infos;
use fastseq::PlanView;

/// `Composed.plan()`:
///
/// - `form`: `"graph"` (edges, graph inputs or outputs given) or `"chain"` (io_maps);
/// - `stages`: in graph order, dicts of `label`, `given` (position in the given order),
///   `inputs` and `outputs` (the stage's own, as `summary()` gives them: (name, dtype, dims)),
///   `pruned` (bool);
/// - `edges`: in the caller's order, (from label, output, to label, input, edge index);
/// - `inputs`: the merged model's graph inputs in its order, (name, [(stage label, input), ...]);
/// - `outputs`: the merged model's graph outputs in its order, (name, stage label, output);
/// - `pruned`: labels of the pruned stages; `unused_outputs`: (stage label, output) that
///   nothing consumes or exposes, in the given order; `adapters`: (edge index, description).
pub(crate) fn plan_dict<'py>(py: Python<'py>, plan: &PlanView) -> PyResult<Bound<'py, PyDict>> {
    let stages = PyList::empty(py);
    for s in &plan.stages {
        let d = PyDict::new(py);
        d.set_item("label", &s.label)?;
        d.set_item("given", s.given)?;
        d.set_item("inputs", io_infos(py, &s.inputs)?)?;
        d.set_item("outputs", io_infos(py, &s.outputs)?)?;
        d.set_item("pruned", s.pruned)?;
        stages.append(d)?;
    }
    let edges: Vec<(&str, &str, &str, &str, usize)> = plan
        .edges
        .iter()
        .map(|e| (e.from.as_str(), e.output.as_str(), e.to.as_str(), e.input.as_str(), e.index))
        .collect();
    let d = PyDict::new(py);
    d.set_item("form", if plan.graph_form { "graph" } else { "chain" })?;
    d.set_item("stages", stages)?;
    d.set_item("edges", edges)?;
    d.set_item("inputs", &plan.inputs)?;
    d.set_item("outputs", &plan.outputs)?;
    d.set_item("pruned", &plan.pruned)?;
    d.set_item("unused_outputs", &plan.unused_outputs)?;
    d.set_item("adapters", &plan.adapters)?;
    Ok(d)
}
