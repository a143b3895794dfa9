//! The checks at each edge (element types, shapes) and the adapter that fixes a mismatch (a
//! Cast, an Unsqueeze or Squeeze of the leading axis); symbolic dims joined by edges.
use rustc_hash::{FxHashMap, FxHashSet};

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

/// A name that shape inference made up for a dim it could not name (onnx writes
/// `unk__0`, `unk__1`, ...): any other name of the same class is a better one.
pub(crate) fn placeholder(name: &str) -> bool {
    name.strip_prefix("unk__").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Symbolic dims joined by edges, per stage: what each is replaced with. A class of names
/// joined by edges takes one name (the earliest stage's, a made-up `unk__N` only when it is
/// the only one); a class that an edge joins to a static size takes the size (unless edges
/// join it to two different sizes, where it stays symbolic). A name such as `d1*d2*d3`
/// (what fastseq.ops.flatten declares) is the product of those dims of its stage: it takes
/// the size once every factor has one, and its factors' names otherwise.
pub(crate) fn unify_dims(models: &[ModelProto], edges: &[Edge]) -> Vec<FxHashMap<String, Dim>> {
    type Key = (usize, String);
    let mut parent: FxHashMap<Key, Key> = FxHashMap::default();
    fn root(parent: &FxHashMap<Key, Key>, mut x: Key) -> Key {
        while let Some(p) = parent.get(&x) {
            x = p.clone();
        }
        x
    }
    let rank = |k: &Key| (placeholder(&k.1), k.0, k.1.clone());
    let mut statics: Vec<(Key, i64)> = Vec::new();
    for e in edges {
        let out = graph(&models[e.from]).output.iter().find(|v| vi_name(v) == e.output);
        let inp = graph(&models[e.to]).input.iter().find(|v| vi_name(v) == e.input);
        let (Some(a), Some(b)) = (out.and_then(tensor_type), inp.and_then(tensor_type)) else { continue };
        let (Some(da), Some(db)) = (dims_of(a), dims_of(b)) else { continue };
        // With an adapter on the leading axis, the other axes line up from the end.
        let skip_a = da.len().saturating_sub(db.len());
        let skip_b = db.len().saturating_sub(da.len());
        for (x, y) in da[skip_a..].iter().zip(&db[skip_b..]) {
            match (x, y) {
                (Some(Dim::DimParam(p)), Some(Dim::DimParam(q))) => {
                    let (rp, rq) = (root(&parent, (e.from, p.clone())), root(&parent, (e.to, q.clone())));
                    if rp != rq {
                        let (keep, other) = if rank(&rq) < rank(&rp) { (rq, rp) } else { (rp, rq) };
                        parent.insert(other, keep);
                    }
                }
                (Some(Dim::DimParam(p)), Some(Dim::DimValue(v))) if *v > 0 => statics.push(((e.from, p.clone()), *v)),
                (Some(Dim::DimValue(v)), Some(Dim::DimParam(q))) if *v > 0 => statics.push(((e.to, q.clone()), *v)),
                _ => {}
            }
        }
    }
    // The size of each class: None where edges disagree.
    let mut size: FxHashMap<Key, Option<i64>> = FxHashMap::default();
    for (k, v) in &statics {
        let r = root(&parent, k.clone());
        let known = size.entry(r).or_insert(Some(*v));
        if *known != Some(*v) {
            *known = None;
        }
    }
    let products: Vec<Key> = models
        .iter()
        .enumerate()
        .flat_map(|(k, m)| {
            let g = graph(m);
            g.input.iter().chain(&g.output).filter_map(tensor_type).filter_map(dims_of).flatten().filter_map(move |d| {
                match d {
                    Some(Dim::DimParam(p)) if p.contains('*') => Some((k, p.clone())),
                    _ => None,
                }
            })
        })
        .collect::<FxHashSet<Key>>()
        .into_iter()
        .collect();
    let factor = |size: &FxHashMap<Key, Option<i64>>, parent: &FxHashMap<Key, Key>, stage: usize, f: &str| {
        f.parse::<i64>().ok().or_else(|| size.get(&root(parent, (stage, f.to_string()))).copied().flatten())
    };
    // Products feed classes that feed other products: settle until nothing changes.
    let mut changed = true;
    while changed {
        changed = false;
        for (stage, text) in &products {
            let r = root(&parent, (*stage, text.clone()));
            if size.contains_key(&r) {
                continue;
            }
            let sizes: Option<Vec<i64>> = text.split('*').map(|f| factor(&size, &parent, *stage, f.trim())).collect();
            if let Some(total) = sizes.and_then(|s| s.into_iter().try_fold(1i64, i64::checked_mul)) {
                size.insert(r, Some(total));
                changed = true;
            }
        }
    }
    let mut out = vec![FxHashMap::default(); models.len()];
    // Every name that was joined, sized or is a product, and the roots of their classes
    // (a root that an edge never sized itself takes its class's size too).
    let mut members: FxHashSet<Key> =
        parent.keys().cloned().chain(statics.into_iter().map(|(k, _)| k)).chain(products.iter().cloned()).collect();
    members.extend(members.iter().map(|m| root(&parent, m.clone())).collect::<Vec<_>>());
    for m in members {
        let r = root(&parent, m.clone());
        let new = if let Some(Some(v)) = size.get(&r) {
            Dim::DimValue(*v)
        } else if m.1.contains('*') && r == m {
            // A product with a factor of unknown size: its factors as their classes say.
            let parts: Vec<String> =
                m.1.split('*')
                    .map(|f| match factor(&size, &parent, m.0, f.trim()) {
                        Some(v) => v.to_string(),
                        None => root(&parent, (m.0, f.trim().to_string())).1,
                    })
                    .collect();
            Dim::DimParam(parts.join("*"))
        } else {
            Dim::DimParam(r.1.clone())
        };
        if new != Dim::DimParam(m.1.clone()) {
            out[m.0].insert(m.1, new);
        }
    }
    out
}
