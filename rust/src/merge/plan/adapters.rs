//! The checks at each edge (element types, shapes) and the adapter that fixes a mismatch (a
//! Cast, an Unsqueeze or Squeeze of the leading axis); symbolic dims joined by edges.
use rustc_hash::FxHashMap;

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::codec::proto::{type_proto, ModelProto, ValueInfoProto};
use crate::codec::tensor::elem_type_name;
use crate::error::{Error, Result};
use crate::merge::options::Edge;

/// What an adapter on an edge does, in order: a Cast, then the axis change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    pub edge: usize,
    pub cast_to: Option<i32>,
    pub axis: Option<AxisOp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AxisOp {
    /// The input expects a leading (batch) axis that the output lacks.
    Unsqueeze,
    /// The output has a leading axis of size 1 that the input lacks.
    Squeeze,
}

impl Adapter {
    /// "Cast to float, Unsqueeze of axis 0".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.cast_to {
            parts.push(format!("Cast to {}", elem_type_name(t)));
        }
        match self.axis {
            Some(AxisOp::Unsqueeze) => parts.push("Unsqueeze of axis 0".to_string()),
            Some(AxisOp::Squeeze) => parts.push("Squeeze of axis 0".to_string()),
            None => {}
        }
        parts.join(", ")
    }
}

fn tensor_type(vi: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t),
        _ => None,
    }
}

fn shape_text(dims: &[Option<&Dim>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Some(Dim::DimValue(v)) => v.to_string(),
            Some(Dim::DimParam(p)) => p.clone(),
            None => "?".to_string(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn dims_of(t: &type_proto::Tensor) -> Option<Vec<Option<&Dim>>> {
    t.shape.as_ref().map(|s| s.dim.iter().map(|d| d.value.as_ref()).collect())
}

/// Two dims that cannot be the same size: two different static sizes.
fn clash(a: &Option<&Dim>, b: &Option<&Dim>) -> bool {
    matches!((a, b), (Some(Dim::DimValue(x)), Some(Dim::DimValue(y))) if x != y && *x > 0 && *y > 0)
}

fn compatible(a: &[Option<&Dim>], b: &[Option<&Dim>]) -> bool {
    a.len() == b.len() && !a.iter().zip(b).any(|(x, y)| clash(x, y))
}

/// Checks one edge; returns the adapter it needs (allowed or not by `adapt`), if any.
pub(crate) fn check_edge(
    where_: &str,
    edge: usize,
    o: &str,
    out: &ValueInfoProto,
    i: &str,
    inp: &ValueInfoProto,
    adapt: bool,
) -> Result<Option<Adapter>> {
    let (Some(a), Some(b)) = (tensor_type(out), tensor_type(inp)) else { return Ok(None) };
    let mut adapter = Adapter { edge, cast_to: None, axis: None };
    let mut problems: Vec<String> = Vec::new();
    let (ea, eb) = (a.elem_type.unwrap_or(0), b.elem_type.unwrap_or(0));
    if ea != 0 && eb != 0 && ea != eb {
        adapter.cast_to = Some(eb);
        problems.push(format!(
            "element type mismatch: output '{o}' is {} but input '{i}' expects {}",
            elem_type_name(ea),
            elem_type_name(eb)
        ));
    }
    if let (Some(da), Some(db)) = (dims_of(a), dims_of(b)) {
        if !compatible(&da, &db) {
            let text = format!(
                "shape mismatch: output '{o}' has shape {} but input '{i}' expects {}",
                shape_text(&da),
                shape_text(&db)
            );
            let leading_one = matches!(da.first(), Some(Some(Dim::DimValue(1)) | Some(Dim::DimParam(_)) | None));
            if da.len() + 1 == db.len() && compatible(&da, &db[1..]) {
                adapter.axis = Some(AxisOp::Unsqueeze);
            } else if da.len() == db.len() + 1 && leading_one && compatible(&da[1..], &db) {
                adapter.axis = Some(AxisOp::Squeeze);
            } else {
                // No adapter fixes this one.
                return Err(Error::composition(format!("{where_}: {text}")));
            }
            problems.push(text);
        }
    }
    if problems.is_empty() {
        return Ok(None);
    }
    if !adapt {
        return Err(Error::composition(format!(
            "{where_}: {}; pass adapt=True (or this edge's index in adapt) to insert a {}",
            problems.join("; "),
            adapter.describe()
        )));
    }
    Ok(Some(adapter))
}

/// Symbolic dims joined by edges, as one name per class: the earliest stage's.
pub(crate) fn unify_dims(models: &[ModelProto], edges: &[Edge]) -> Vec<FxHashMap<String, String>> {
    let mut parent: FxHashMap<(usize, String), (usize, String)> = FxHashMap::default();
    fn root(parent: &FxHashMap<(usize, String), (usize, String)>, mut x: (usize, String)) -> (usize, String) {
        while let Some(p) = parent.get(&x) {
            x = p.clone();
        }
        x
    }
    for e in edges {
        let out = graph(&models[e.from]).output.iter().find(|v| vi_name(v) == e.output);
        let inp = graph(&models[e.to]).input.iter().find(|v| vi_name(v) == e.input);
        let (Some(a), Some(b)) = (out.and_then(tensor_type), inp.and_then(tensor_type)) else { continue };
        let (Some(da), Some(db)) = (dims_of(a), dims_of(b)) else { continue };
        // With an adapter on the leading axis, the other axes line up from the end.
        let skip_a = da.len().saturating_sub(db.len());
        let skip_b = db.len().saturating_sub(da.len());
        for (x, y) in da[skip_a..].iter().zip(&db[skip_b..]) {
            if let (Some(Dim::DimParam(p)), Some(Dim::DimParam(q))) = (x, y) {
                let (rp, rq) = (root(&parent, (e.from, p.clone())), root(&parent, (e.to, q.clone())));
                if rp != rq {
                    // The earlier (stage, name) stays the root: its name wins.
                    let (keep, other) = if rq < rp { (rq, rp) } else { (rp, rq) };
                    parent.insert(other, keep);
                }
            }
        }
    }
    let mut out = vec![FxHashMap::default(); models.len()];
    let members: Vec<(usize, String)> = parent.keys().cloned().collect();
    for m in members {
        let r = root(&parent, m.clone());
        if r.1 != m.1 {
            out[m.0].insert(m.1, r.1);
        }
    }
    out
}
