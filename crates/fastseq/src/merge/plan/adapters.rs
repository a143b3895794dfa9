//! The checks at each edge (element types, shapes) and the adapter that fixes a mismatch (a
//! Cast, an Unsqueeze or a Squeeze of one axis, found by matching the dims of both sides by
//! their sizes and symbolic names); symbolic dims joined by edges.
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
    /// The input expects an axis of size 1 at this position that the output lacks.
    Unsqueeze(i64),
    /// The output has an axis of size 1 at this position that the input lacks.
    Squeeze(i64),
}

impl AxisOp {
    pub fn op_type(self) -> &'static str {
        match self {
            AxisOp::Unsqueeze(_) => "Unsqueeze",
            AxisOp::Squeeze(_) => "Squeeze",
        }
    }

    pub fn axis(self) -> i64 {
        match self {
            AxisOp::Unsqueeze(a) | AxisOp::Squeeze(a) => a,
        }
    }

    fn describe(self) -> String {
        format!("{} of axis {}", self.op_type(), self.axis())
    }
}

impl Adapter {
    /// "Cast to float, Unsqueeze of axis 1".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.cast_to {
            parts.push(format!("Cast to {}", elem_type_name(t)));
        }
        if let Some(op) = self.axis {
            parts.push(op.describe());
        }
        parts.join(", ")
    }
}

/// How one dim of a tensor fits one dim of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Two different static sizes, or a symbolic size that the other side uses elsewhere.
    Clash,
    /// Nothing says they differ (a static size against a symbolic or unknown one).
    Weak,
    /// The same static size, or the same symbolic name.
    Exact,
}

fn fit(a: &Option<&Dim>, b: &Option<&Dim>) -> Fit {
    match (a, b) {
        (Some(Dim::DimValue(x)), Some(Dim::DimValue(y))) if *x > 0 && *y > 0 => {
            if x == y {
                Fit::Exact
            } else {
                Fit::Clash
            }
        }
        (Some(Dim::DimParam(p)), Some(Dim::DimParam(q))) if p == q => Fit::Exact,
        _ => Fit::Weak,
    }
}

/// The positions at which an axis of size 1 inserted into `short` gives `long` (an
/// Unsqueeze of `short`, or read backwards a Squeeze of `long`), best first: every dim must
/// fit, the extra one must be able to be 1 (a static 1, or a size `short` does not name),
/// and among those that fit the positions matching the most dims exactly win. Positions
/// that give the same layout (an axis added beside static 1s) count once.
fn axis_positions(short: &[Option<&Dim>], long: &[Option<&Dim>]) -> Vec<usize> {
    if short.len() + 1 != long.len() {
        return Vec::new();
    }
    let named: Vec<&str> = short
        .iter()
        .filter_map(|d| match d {
            Some(Dim::DimParam(p)) => Some(p.as_str()),
            _ => None,
        })
        .collect();
    let mut scored: Vec<(usize, usize)> = Vec::new();
    for k in 0..long.len() {
        let extra = match &long[k] {
            Some(Dim::DimValue(1)) => Fit::Exact,
            Some(Dim::DimValue(v)) if *v > 0 => Fit::Clash,
            Some(Dim::DimParam(p)) if named.contains(&p.as_str()) => Fit::Clash,
            _ => Fit::Weak,
        };
        let rest = long[..k].iter().chain(&long[k + 1..]);
        let fits: Vec<Fit> = std::iter::once(extra).chain(short.iter().zip(rest).map(|(a, b)| fit(a, b))).collect();
        if !fits.contains(&Fit::Clash) {
            scored.push((k, fits.iter().filter(|f| **f == Fit::Exact).count()));
        }
    }
    let best = scored.iter().map(|&(_, s)| s).max().unwrap_or(0);
    let mut out: Vec<usize> = Vec::new();
    for (k, s) in scored {
        let same_layout = out.last().is_some_and(|&j| short[j..k].iter().all(|d| matches!(d, Some(Dim::DimValue(1)))));
        if s == best && !same_layout {
            out.push(k);
        }
    }
    out
}

/// The one axis change that turns the output's dims into the input's, if exactly one fits.
/// `Err` lists the changes that fit equally well (more than one), or is empty (none).
fn axis_change(out: &[Option<&Dim>], inp: &[Option<&Dim>]) -> std::result::Result<AxisOp, Vec<AxisOp>> {
    let found: Vec<AxisOp> = if out.len() + 1 == inp.len() {
        axis_positions(out, inp).into_iter().map(|k| AxisOp::Unsqueeze(k as i64)).collect()
    } else if out.len() == inp.len() + 1 {
        axis_positions(inp, out).into_iter().map(|k| AxisOp::Squeeze(k as i64)).collect()
    } else {
        Vec::new()
    };
    match found.as_slice() {
        [one] => Ok(*one),
        _ => Err(found),
    }
}

/// Which dims of the output line up with which dims of the input across an edge: all of
/// them for equal ranks, all but the adapter's axis where exactly one axis change fits.
fn aligned<'a, 'b>(
    a: &'a [Option<&'b Dim>],
    b: &'a [Option<&'b Dim>],
) -> Vec<(&'a Option<&'b Dim>, &'a Option<&'b Dim>)> {
    if a.len() == b.len() {
        return a.iter().zip(b).collect();
    }
    match axis_change(a, b) {
        Ok(AxisOp::Unsqueeze(k)) => {
            let k = k as usize;
            a.iter().zip(b[..k].iter().chain(&b[k + 1..])).collect()
        }
        Ok(AxisOp::Squeeze(k)) => {
            let k = k as usize;
            a[..k].iter().chain(&a[k + 1..]).zip(b).collect()
        }
        Err(_) => Vec::new(),
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

/// Checks one edge, from the output `(name, value info)` to the input `(name, value info)`;
/// returns the adapter it needs (allowed or not by `adapt`), if any.
pub(crate) fn check_edge(
    where_: &str,
    edge: usize,
    (o, out): (&str, &ValueInfoProto),
    (i, inp): (&str, &ValueInfoProto),
    adapt: bool,
    remedy: Option<&str>,
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
            match axis_change(&da, &db) {
                Ok(op) => adapter.axis = Some(op),
                Err(fits) if fits.is_empty() => {
                    // No adapter fixes this one.
                    return Err(Error::composition(format!("{where_}: {text}")));
                }
                Err(fits) => {
                    let shown: Vec<String> = fits.iter().map(|f| f.describe()).collect();
                    return Err(Error::composition(format!(
                        "{where_}: {text}; several adapters would fit ({}): the shapes do not say which, so none \
                         is inserted (name the dims alike in both models, or reshape in one of them)",
                        shown.join(", ")
                    )));
                }
            }
            problems.push(text);
        }
    }
    if problems.is_empty() {
        return Ok(None);
    }
    if !adapt {
        let remedy = remedy.unwrap_or("pass adapt=True (or this edge's index in adapt) to insert a {}");
        return Err(Error::composition(format!(
            "{where_}: {}; {}",
            problems.join("; "),
            remedy.replacen("{}", &adapter.describe(), 1)
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
        for (x, y) in aligned(&da, &db) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(spec: &[&str]) -> Vec<Dim> {
        spec.iter()
            .map(|s| match s.parse::<i64>() {
                Ok(v) => Dim::DimValue(v),
                Err(_) => Dim::DimParam(s.to_string()),
            })
            .collect()
    }

    fn change(out: &[&str], inp: &[&str]) -> std::result::Result<AxisOp, Vec<AxisOp>> {
        let (a, b) = (dims(out), dims(inp));
        let a: Vec<Option<&Dim>> = a.iter().map(Some).collect();
        let b: Vec<Option<&Dim>> = b.iter().map(Some).collect();
        axis_change(&a, &b)
    }

    #[test]
    fn the_axis_is_found_from_sizes_and_names() {
        // The cases: the batch name pins the batch axis.
        assert_eq!(change(&["N", "32"], &["N", "1", "32"]), Ok(AxisOp::Unsqueeze(1)));
        assert_eq!(change(&["N", "32"], &["N", "32", "1"]), Ok(AxisOp::Unsqueeze(2)));
        assert_eq!(change(&["3", "224", "224"], &["N", "3", "224", "224"]), Ok(AxisOp::Unsqueeze(0)));
        assert_eq!(change(&["4"], &["1", "4"]), Ok(AxisOp::Unsqueeze(0)));
        assert_eq!(change(&["N", "1", "32"], &["N", "32"]), Ok(AxisOp::Squeeze(1)));
        assert_eq!(change(&["N", "32", "1"], &["N", "32"]), Ok(AxisOp::Squeeze(2)));
        assert_eq!(change(&["1", "4"], &["4"]), Ok(AxisOp::Squeeze(0)));
        // Beside static 1s every position gives the same layout: one adapter.
        assert_eq!(change(&["N", "1"], &["N", "1", "1"]), Ok(AxisOp::Unsqueeze(1)));
        // Nothing tells the axes apart: ambiguous, each fit listed.
        assert_eq!(
            change(&["a", "b"], &["c", "d", "e"]),
            Err(vec![AxisOp::Unsqueeze(0), AxisOp::Unsqueeze(1), AxisOp::Unsqueeze(2)])
        );
        // No position fits: none.
        assert_eq!(change(&["N", "32"], &["N", "2", "32"]), Err(vec![]));
        assert_eq!(change(&["N", "5", "32"], &["N", "32"]), Err(vec![]));
        assert_eq!(change(&["N", "32"], &["N", "32", "7", "1"]), Err(vec![]));
    }
}
