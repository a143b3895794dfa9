//! The plan of a composition, read from the stages' own names before anything is renamed:
//! which output feeds which input (edges), the checks at each edge (element types, shapes,
//! symbolic dims, adapters), what the merged graph exposes (inputs, outputs, their names),
//! and what no requested output needs (pruning).
//!
//! Stages are taken in the given order and every edge goes from an earlier stage to a later
//! one, so that concatenating the stages' nodes in order keeps the graph topologically sorted.
use std::collections::HashSet;

use bumpalo::Bump;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::compose::{Keep, Options};
use crate::error::{Error, Result};
use crate::names::{did_you_mean, fresh, walk_graph, Visitor};
use crate::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::proto::{tensor_proto, type_proto, GraphProto, ModelProto, ValueInfoProto};

/// One connection: output `output` of stage `from` feeds input `input` of stage `to`
/// (the stages' own names; `from` < `to`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Edge {
    pub from: usize,
    pub output: String,
    pub to: usize,
    pub input: String,
}

/// Which edges may get an adapter (a Cast, an Unsqueeze or Squeeze of the leading axis)
/// where the two sides do not match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Adapt {
    /// None: a mismatch is an error that says which adapter would fix it.
    #[default]
    Off,
    All,
    /// These edges, by index into the edge list (the converted one for io_maps: joint by
    /// joint, pair by pair).
    Edges(Vec<usize>),
}

impl Adapt {
    fn covers(&self, edge: usize) -> bool {
        match self {
            Adapt::Off => false,
            Adapt::All => true,
            Adapt::Edges(set) => set.contains(&edge),
        }
    }
}

/// Where a stage's value takes its final name from instead of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The final name of this value of an earlier stage (an edge, a deduplicated weight).
    Value(usize, String),
    /// The output of the adapter on this edge.
    Adapter(usize),
}

/// A graph input of the merged model.
#[derive(Debug, Clone)]
pub struct GraphInput {
    /// The exposed name; `None` keeps the stage's own name where no earlier stage claims
    /// it (the linear form), `m<i>/name` otherwise.
    pub name: Option<String>,
    /// The stage input whose type the graph input takes.
    pub stage: usize,
    pub index: usize,
    /// Every (stage, input) it feeds, the first one included.
    pub feeds: Vec<(usize, String)>,
    /// Named by the caller: kept even when pruning finds no use for it.
    pub explicit: bool,
    /// An initializer that an IR < 4 model lists as an input (not the user's).
    pub weight: bool,
}

/// A graph output of the merged model.
#[derive(Debug, Clone)]
pub struct GraphOutput {
    pub name: Option<String>,
    pub stage: usize,
    pub index: usize,
}

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

/// Per stage, which of its entries the merged graph keeps (all of them without pruning).
#[derive(Debug, Clone, Default)]
pub struct Kept {
    pub nodes: Vec<Vec<bool>>,
    pub initializers: Vec<Vec<bool>>,
    pub sparse: Vec<Vec<bool>>,
    pub value_info: Vec<Vec<bool>>,
}

/// What pruning left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Stages none of whose nodes any requested output needs.
    pub stages: Vec<usize>,
    pub nodes: usize,
    pub initializers: usize,
    /// Graph inputs that nothing kept reads (by their exposed names).
    pub inputs: Vec<String>,
}

/// What the merged graph is made of, by index into each stage's own lists.
pub struct Plan {
    pub edges: Vec<Edge>,
    /// Per stage: values whose final name comes from elsewhere (edges, deduplication).
    pub alias: Vec<FxHashMap<String, Target>>,
    /// Per stage: values with a final name chosen here (exposed under another name).
    pub pinned: Vec<FxHashMap<String, String>>,
    /// Per stage: inputs not exposed as graph inputs because something else feeds them.
    pub fed_inputs: Vec<Vec<usize>>,
    pub inputs: Vec<GraphInput>,
    pub outputs: Vec<GraphOutput>,
    /// Per stage: outputs that an edge consumes and no graph output exposes (kept as value_info).
    pub internal_outputs: Vec<Vec<usize>>,
    /// Per stage: symbolic dims replaced by the one name, or the static size, their edges agree on.
    pub dims: Vec<FxHashMap<String, Dim>>,
    pub adapters: Vec<Adapter>,
    /// `None`: everything is kept (no pruning, nothing deduplicated).
    pub kept: Option<Kept>,
    pub pruned: PruneReport,
    /// Outputs that no edge consumes and no graph output exposes (graph form only).
    pub unused: Vec<(usize, String)>,
}

pub(crate) fn graph(m: &ModelProto) -> &GraphProto {
    m.graph.as_ref().expect("checked on entry")
}

pub(crate) fn vi_name(vi: &ValueInfoProto) -> &str {
    vi.name.as_deref().unwrap_or("")
}

pub(crate) fn initializer_names(m: &ModelProto) -> HashSet<&str> {
    let g = graph(m);
    g.initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .chain(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()?.name.as_deref()))
        .collect()
}

/// Graph inputs that are real inputs (IR < 4 models also list their initializers).
fn real_inputs(m: &ModelProto) -> Vec<&ValueInfoProto> {
    let inits = initializer_names(m);
    graph(m).input.iter().filter(|vi| !inits.contains(vi_name(vi))).collect()
}

fn quoted(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The linear form as edges, the one place it is converted: `io_maps[j]` joins stage j to
/// stage j + 1; without io_maps, outputs join real inputs by position. Returns the edges
/// and, per edge, how errors name it ("joint j (a -> b)").
pub fn linear_edges(
    models: &[ModelProto],
    labels: &[String],
    io_maps: Option<&[Vec<(String, String)>]>,
) -> Result<(Vec<Edge>, Vec<String>)> {
    let joints = models.len() - 1;
    if let Some(maps) = io_maps {
        if maps.len() != joints {
            return Err(Error::composition(format!(
                "io_maps has {} entr{} but {} models have {}: io_maps[i] lists the \
                 (output, input) pairs from model i to model i+1",
                maps.len(),
                if maps.len() == 1 { "y" } else { "ies" },
                models.len(),
                plural(joints, "joint", "joints"),
            )));
        }
    }
    let (mut edges, mut names) = (Vec::new(), Vec::new());
    for j in 0..joints {
        let where_ = format!("joint {j} ({} -> {})", labels[j], labels[j + 1]);
        let pairs: Vec<(String, String)> = match io_maps {
            Some(maps) => maps[j].clone(),
            None => {
                let outs: Vec<&str> = graph(&models[j]).output.iter().map(vi_name).collect();
                let ins: Vec<&str> = real_inputs(&models[j + 1]).into_iter().map(vi_name).collect();
                if outs.len() != ins.len() {
                    return Err(Error::composition(format!(
                        "{where_}: without io_maps outputs are joined to inputs by position, but {} \
                         has {} ({}) and {} has {} ({}); pass io_maps",
                        labels[j],
                        plural(outs.len(), "output", "outputs"),
                        quoted(&outs),
                        labels[j + 1],
                        plural(ins.len(), "input", "inputs"),
                        quoted(&ins),
                    )));
                }
                outs.iter().zip(&ins).map(|(o, i)| (o.to_string(), i.to_string())).collect()
            }
        };
        for (o, i) in pairs {
            edges.push(Edge { from: j, output: o, to: j + 1, input: i });
            names.push(where_.clone());
        }
    }
    Ok((edges, names))
}

/// A path of edges from stage `a` to stage `b`, as the stages it passes (both ends included).
fn path(edges: &[Edge], a: usize, b: usize) -> Option<Vec<usize>> {
    let mut prev: FxHashMap<usize, usize> = FxHashMap::default();
    let mut queue = std::collections::VecDeque::from([a]);
    let mut seen: FxHashSet<usize> = FxHashSet::from_iter([a]);
    while let Some(s) = queue.pop_front() {
        if s == b {
            let mut out = vec![b];
            let mut at = b;
            while at != a {
                at = prev[&at];
                out.push(at);
            }
            out.reverse();
            return Some(out);
        }
        for e in edges.iter().filter(|e| e.from == s) {
            if seen.insert(e.to) {
                prev.insert(e.to, s);
                queue.push_back(e.to);
            }
        }
    }
    None
}

fn tensor_type(vi: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t),
        _ => None,
    }
}

/// "float", "int64", ... for an element type.
pub fn elem_type_name(t: i32) -> String {
    tensor_proto::DataType::try_from(t).map(|d| d.as_str_name().to_lowercase()).unwrap_or_else(|_| format!("type {t}"))
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
fn check_edge(
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
fn placeholder(name: &str) -> bool {
    name.strip_prefix("unk__").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Symbolic dims joined by edges, per stage: what each is replaced with. A class of names
/// joined by edges takes one name (the earliest stage's, a made-up `unk__N` only when it is
/// the only one); a class that an edge joins to a static size takes the size (unless edges
/// join it to two different sizes, where it stays symbolic). A name such as `d1*d2*d3`
/// (what fastseq.ops.flatten declares) is the product of those dims of its stage: it takes
/// the size once every factor has one, and its factors' names otherwise.
fn unify_dims(models: &[ModelProto], edges: &[Edge]) -> Vec<FxHashMap<String, Dim>> {
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
            g.input.iter().chain(&g.output).filter_map(tensor_type).filter_map(dims_of).flatten().filter_map(
                move |d| match d {
                    Some(Dim::DimParam(p)) if p.contains('*') => Some((k, p.clone())),
                    _ => None,
                },
            )
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
            let parts: Vec<String> = m
                .1
                .split('*')
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

/// Indices of the named inputs (or outputs) per model; every name must match exactly one.
fn select(
    models: &[ModelProto],
    labels: &[String],
    wanted: &[String],
    what: &str,
    list: impl Fn(&ModelProto) -> &Vec<ValueInfoProto>,
    within: Option<&Vec<Vec<usize>>>,
) -> Result<Vec<Vec<usize>>> {
    let mut chosen = vec![Vec::new(); models.len()];
    for name in wanted {
        let mut hits = Vec::new();
        for (k, m) in models.iter().enumerate() {
            for (x, vi) in list(m).iter().enumerate() {
                if vi_name(vi) == name && within.is_none_or(|w| w[k].contains(&x)) {
                    hits.push((k, x));
                }
            }
        }
        match hits.as_slice() {
            [(k, x)] => {
                if !chosen[*k].contains(x) {
                    chosen[*k].push(*x)
                }
            }
            [] => {
                let all: Vec<&str> = models.iter().flat_map(|m| list(m).iter().map(vi_name)).collect();
                return Err(Error::composition(format!(
                    "'{name}' is not an {what} of any model{}",
                    did_you_mean(name, all.iter().copied())
                )));
            }
            many => {
                let who: Vec<&str> = many.iter().map(|(k, _)| labels[*k].as_str()).collect();
                return Err(Error::composition(format!(
                    "'{name}' is an {what} of several models ({}); it is ambiguous",
                    who.join(", ")
                )));
            }
        }
    }
    for c in &mut chosen {
        c.sort_unstable();
    }
    Ok(chosen)
}

fn stage_io<'m>(
    models: &'m [ModelProto],
    labels: &[String],
    where_: &str,
    stage: usize,
    name: &str,
    output: bool,
) -> Result<(usize, &'m ValueInfoProto)> {
    let Some(m) = models.get(stage) else {
        return Err(Error::composition(format!(
            "{where_}: there is no stage {stage} ({} given)",
            plural(models.len(), "stage", "stages")
        )));
    };
    let list = if output { &graph(m).output } else { &graph(m).input };
    if let Some(x) = list.iter().position(|v| vi_name(v) == name) {
        return Ok((x, &list[x]));
    }
    let names: Vec<&str> = list.iter().map(vi_name).collect();
    let what = if output { "output" } else { "input" };
    Err(Error::composition(format!(
        "{where_}: '{name}' is not an {what} of {}{}; its {what}s are {}",
        labels[stage],
        did_you_mean(name, names.iter().copied()),
        quoted(&names)
    )))
}

/// Exposed names chosen automatically: a value's own name when no other automatic or chosen
/// name is the same, `label.name` when not (then `label.name_1`, ...).
fn auto_names(wanted: &[(String, String)], taken: &mut FxHashSet<String>) -> Vec<String> {
    let mut count: FxHashMap<&str, usize> = FxHashMap::default();
    for (own, _) in wanted {
        *count.entry(own.as_str()).or_default() += 1;
    }
    wanted
        .iter()
        .map(|(own, qualified)| {
            let name = if count[own.as_str()] == 1 && !taken.contains(own) {
                own.clone()
            } else {
                fresh("", qualified, |c| !taken.contains(c))
            };
            taken.insert(name.clone());
            name
        })
        .collect()
}

impl Plan {
    /// Plans the composition of `models` (already prefixed) under `opts`.
    pub fn new(models: &[ModelProto], labels: &[String], opts: &Options) -> Result<Plan> {
        let n = models.len();
        let graph_form = opts.is_graph();
        if graph_form && (opts.inputs.is_some() || opts.outputs.is_some()) {
            return Err(Error::composition(
                "inputs/outputs restrict the linear form; with edges, graph_inputs or graph_outputs, \
                 name the exposed inputs and outputs there",
            ));
        }
        if graph_form && matches!(opts.keep_outputs, Keep::Names(_)) {
            return Err(Error::composition(
                "keep_outputs with names applies to the linear form; with edges, graph_inputs or \
                 graph_outputs, list the outputs to expose in graph_outputs",
            ));
        }
        if opts.edges.is_some() && opts.io_maps.is_some() {
            return Err(Error::composition("pass either io_maps (a chain) or edges (a graph), not both"));
        }
        let (edges, wheres) = match &opts.edges {
            Some(edges) => {
                let wheres = edges
                    .iter()
                    .enumerate()
                    .map(|(x, e)| {
                        let label = |s: usize| labels.get(s).map_or_else(|| format!("stage {s}"), Clone::clone);
                        format!("edge {x} ({}.{} -> {}.{})", label(e.from), e.output, label(e.to), e.input)
                    })
                    .collect();
                (edges.clone(), wheres)
            }
            None => linear_edges(models, labels, opts.io_maps.as_deref())?,
        };

        if let Adapt::Edges(listed) = &opts.adapt {
            if let Some(bad) = listed.iter().find(|&&x| x >= edges.len()) {
                return Err(Error::composition(format!(
                    "adapt lists edge {bad}, but there {}",
                    if edges.len() == 1 { "is 1 edge".to_string() } else { format!("are {} edges", edges.len()) }
                )));
            }
        }
        // Edges: existing stages and names, forward only, each input fed once.
        let mut alias: Vec<FxHashMap<String, Target>> = vec![FxHashMap::default(); n];
        let mut fed_by_edge: Vec<FxHashMap<&str, usize>> = vec![FxHashMap::default(); n];
        let mut consumed: Vec<FxHashSet<&str>> = vec![FxHashSet::default(); n];
        let mut adapters = Vec::new();
        for (x, e) in edges.iter().enumerate() {
            let where_ = &wheres[x];
            let (_, out_vi) = stage_io(models, labels, where_, e.from, &e.output, true)?;
            let (_, in_vi) = stage_io(models, labels, where_, e.to, &e.input, false)?;
            if e.from >= e.to {
                return Err(match path(&edges, e.to, e.from) {
                    Some(stages) => {
                        let mut names: Vec<&str> = stages.iter().map(|&s| labels[s].as_str()).collect();
                        names.push(&labels[e.to]);
                        Error::composition(format!("{where_}: the edges form a loop: {}", names.join(" -> ")))
                    }
                    None if e.from == e.to => {
                        Error::composition(format!("{where_}: the edges form a loop: {} feeds itself", labels[e.from]))
                    }
                    None => Error::composition(format!(
                        "{where_}: {} comes after {} in the stage order; give the stages in an order \
                         where every edge goes forward",
                        labels[e.from], labels[e.to]
                    )),
                });
            }
            if let Some(&prev) = fed_by_edge[e.to].get(e.input.as_str()) {
                let p = &edges[prev];
                return Err(Error::composition(if p == e {
                    format!("{where_}: the connection '{}' -> '{}' is listed twice", e.output, e.input)
                } else if p.from == e.from {
                    format!(
                        "{where_}: input '{}' of {} is fed twice, by '{}' and by '{}'",
                        e.input, labels[e.to], p.output, e.output
                    )
                } else {
                    format!(
                        "{where_}: input '{}' of {} is fed twice, by '{}' of {} and by '{}' of {}",
                        e.input, labels[e.to], p.output, labels[p.from], e.output, labels[e.from]
                    )
                }));
            }
            fed_by_edge[e.to].insert(&e.input, x);
            consumed[e.from].insert(&e.output);
            let target = match check_edge(where_, x, &e.output, out_vi, &e.input, in_vi, opts.adapt.covers(x))? {
                Some(a) => {
                    adapters.push(a);
                    Target::Adapter(x)
                }
                None => Target::Value(e.from, e.output.clone()),
            };
            alias[e.to].insert(e.input.clone(), target);
        }

        let mut pinned: Vec<FxHashMap<String, String>> = vec![FxHashMap::default(); n];
        let mut fed_inputs: Vec<Vec<usize>> = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.input.len()).filter(|&x| fed_by_edge[k].contains_key(vi_name(&g.input[x]))).collect()
            })
            .collect();
        let mut unused = Vec::new();
        let (inputs, outputs) = if graph_form {
            let (inputs, outputs) = Self::expose(models, labels, opts, &fed_by_edge, &consumed, &mut pinned)?;
            for gi in &inputs {
                for (s, name) in &gi.feeds[1..] {
                    let g = graph(&models[*s]);
                    fed_inputs[*s].extend(g.input.iter().position(|v| vi_name(v) == name));
                }
            }
            let exported: FxHashSet<(usize, usize)> = outputs.iter().map(|o| (o.stage, o.index)).collect();
            for (k, m) in models.iter().enumerate() {
                for (x, vi) in graph(m).output.iter().enumerate() {
                    if !consumed[k].contains(vi_name(vi)) && !exported.contains(&(k, x)) {
                        unused.push((k, vi_name(vi).to_string()));
                    }
                }
            }
            (inputs, outputs)
        } else {
            Self::expose_linear(models, labels, opts, &fed_by_edge, &consumed)?
        };
        let exported: FxHashSet<(usize, usize)> = outputs.iter().map(|o| (o.stage, o.index)).collect();
        let internal_outputs = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.output.len())
                    .filter(|&x| consumed[k].contains(vi_name(&g.output[x])) && !exported.contains(&(k, x)))
                    .collect()
            })
            .collect();
        let mut plan = Plan {
            dims: unify_dims(models, &edges),
            edges,
            alias,
            pinned,
            fed_inputs,
            inputs,
            outputs,
            internal_outputs,
            adapters,
            kept: None,
            pruned: PruneReport::default(),
            unused,
        };
        if opts.prune.unwrap_or(graph_form) {
            plan.prune(models);
        }
        // An IR < 4 weight listed as an input and fed by an edge is overridden: dropped.
        if plan.fed_inputs.iter().any(|f| !f.is_empty()) {
            let fed_inputs = std::mem::take(&mut plan.fed_inputs);
            let kept = plan.kept_mut(models);
            for (k, m) in models.iter().enumerate() {
                let g = graph(m);
                let fed: FxHashSet<&str> = fed_inputs[k].iter().map(|&x| vi_name(&g.input[x])).collect();
                for (x, t) in g.initializer.iter().enumerate() {
                    if fed.contains(t.name.as_deref().unwrap_or("")) {
                        kept.initializers[k][x] = false;
                    }
                }
            }
            plan.fed_inputs = fed_inputs;
        }
        Ok(plan)
    }

    /// The kept masks, all true until something is left out.
    pub fn kept_mut(&mut self, models: &[ModelProto]) -> &mut Kept {
        self.kept.get_or_insert_with(|| {
            let all = |f: &dyn Fn(&GraphProto) -> usize| -> Vec<Vec<bool>> {
                models.iter().map(|m| vec![true; f(graph(m))]).collect()
            };
            Kept {
                nodes: all(&|g| g.node.len()),
                initializers: all(&|g| g.initializer.len()),
                sparse: all(&|g| g.sparse_initializer.len()),
                value_info: all(&|g| g.value_info.len()),
            }
        })
    }

    /// The linear form's exposure: unfed inputs (or those named in `opts.inputs`), and the
    /// last model's outputs plus those `opts.keep_outputs` / `opts.outputs` ask for.
    fn expose_linear(
        models: &[ModelProto],
        labels: &[String],
        opts: &Options,
        fed: &[FxHashMap<&str, usize>],
        consumed: &[FxHashSet<&str>],
    ) -> Result<(Vec<GraphInput>, Vec<GraphOutput>)> {
        let n = models.len();
        let mut inputs: Vec<Vec<usize>> = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.input.len()).filter(|&x| !fed[k].contains_key(vi_name(&g.input[x]))).collect()
            })
            .collect();
        if let Some(wanted) = &opts.inputs {
            inputs = select(models, labels, wanted, "input", |m| &graph(m).input, Some(&inputs))?;
        }
        let outputs = match (&opts.outputs, &opts.keep_outputs) {
            (Some(wanted), _) => select(models, labels, wanted, "output", |m| &graph(m).output, None)?,
            (None, Keep::Names(wanted)) => {
                let mut chosen = select(models, labels, wanted, "output", |m| &graph(m).output, None)?;
                chosen[n - 1] = (0..graph(&models[n - 1]).output.len()).collect();
                chosen
            }
            (None, keep) => (0..n)
                .map(|k| {
                    let g = graph(&models[k]);
                    (0..g.output.len())
                        .filter(|&x| {
                            k == n - 1 || (*keep == Keep::Unconsumed && !consumed[k].contains(vi_name(&g.output[x])))
                        })
                        .collect()
                })
                .collect(),
        };
        let gi = inputs
            .iter()
            .enumerate()
            .flat_map(|(k, xs)| {
                let inits = initializer_names(&models[k]);
                let g = graph(&models[k]);
                xs.iter()
                    .map(|&x| {
                        let name = vi_name(&g.input[x]);
                        GraphInput {
                            name: None,
                            stage: k,
                            index: x,
                            feeds: vec![(k, name.to_string())],
                            explicit: true,
                            weight: inits.contains(name),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let go = outputs
            .iter()
            .enumerate()
            .flat_map(|(k, xs)| xs.iter().map(move |&x| GraphOutput { name: None, stage: k, index: x }))
            .collect();
        Ok((gi, go))
    }

    /// The graph form's exposure: the caller's graph inputs and outputs under the caller's
    /// names; unfed inputs (and, without graph_outputs, outputs no edge consumes) under
    /// their own names when unique, `label.name` when not.
    fn expose(
        models: &[ModelProto],
        labels: &[String],
        opts: &Options,
        fed: &[FxHashMap<&str, usize>],
        consumed: &[FxHashSet<&str>],
        pinned: &mut [FxHashMap<String, String>],
    ) -> Result<(Vec<GraphInput>, Vec<GraphOutput>)> {
        let mut taken: FxHashSet<String> = FxHashSet::default();
        let mut claim = |name: &str, what: String| -> Result<()> {
            if name.is_empty() {
                return Err(Error::composition(format!("{what}: an exposed name cannot be empty")));
            }
            if !taken.insert(name.to_string()) {
                return Err(Error::composition(format!("{what}: the name '{name}' is exposed twice")));
            }
            Ok(())
        };
        let mut inputs: Vec<GraphInput> = Vec::new();
        // (stage, input) -> the graph input feeding it.
        let mut listed: FxHashMap<(usize, String), String> = FxHashMap::default();
        for (name, feeds) in opts.graph_inputs.iter().flatten() {
            let what = format!("graph input '{name}'");
            claim(name, what.clone())?;
            let Some(&(stage, ref first)) = feeds.first() else {
                return Err(Error::composition(format!("{what}: it feeds no stage input")));
            };
            let (index, _) = stage_io(models, labels, &what, stage, first, false)?;
            for (s, input) in feeds {
                stage_io(models, labels, &what, *s, input, false)?;
                if let Some(&e) = fed[*s].get(input.as_str()) {
                    return Err(Error::composition(format!(
                        "{what}: input '{input}' of {} is fed twice, by this graph input and by edge {e}",
                        labels[*s]
                    )));
                }
                if let Some(prev) = listed.insert((*s, input.clone()), name.clone()) {
                    return Err(Error::composition(format!(
                        "{what}: input '{input}' of {} is fed twice, by graph inputs '{prev}' and '{name}'",
                        labels[*s]
                    )));
                }
            }
            inputs.push(GraphInput {
                name: Some(name.clone()),
                stage,
                index,
                feeds: feeds.clone(),
                explicit: true,
                weight: false,
            });
        }
        let mut outputs: Vec<GraphOutput> = Vec::new();
        let mut exported: FxHashMap<(usize, usize), String> = FxHashMap::default();
        for (name, stage, output) in opts.graph_outputs.iter().flatten() {
            let what = format!("graph output '{name}'");
            claim(name, what.clone())?;
            let (index, _) = stage_io(models, labels, &what, *stage, output, true)?;
            if let Some(prev) = exported.insert((*stage, index), name.clone()) {
                return Err(Error::composition(format!(
                    "{what}: output '{output}' of {} is already exposed as '{prev}'",
                    labels[*stage]
                )));
            }
            outputs.push(GraphOutput { name: Some(name.clone()), stage: *stage, index });
        }
        // Inputs that nothing feeds: exposed automatically.
        let mut auto_in: Vec<(usize, usize)> = Vec::new();
        let mut weights: Vec<(usize, usize)> = Vec::new();
        for (k, m) in models.iter().enumerate() {
            let inits = initializer_names(m);
            for (x, vi) in graph(m).input.iter().enumerate() {
                let name = vi_name(vi);
                if fed[k].contains_key(name) || listed.contains_key(&(k, name.to_string())) {
                    continue;
                }
                if inits.contains(name) {
                    weights.push((k, x));
                } else {
                    auto_in.push((k, x));
                }
            }
        }
        let auto_out: Vec<(usize, usize)> = if opts.graph_outputs.is_none() {
            (0..models.len())
                .flat_map(|k| {
                    let g = graph(&models[k]);
                    (0..g.output.len())
                        .filter(move |&x| !consumed[k].contains(vi_name(&g.output[x])))
                        .map(move |x| (k, x))
                })
                .collect()
        } else {
            Vec::new()
        };
        let own = |k: usize, name: &str| (name.to_string(), format!("{}.{name}", labels[k]));
        let wanted_in: Vec<(String, String)> =
            auto_in.iter().map(|&(k, x)| own(k, vi_name(&graph(&models[k]).input[x]))).collect();
        let wanted_out: Vec<(String, String)> =
            auto_out.iter().map(|&(k, x)| own(k, vi_name(&graph(&models[k]).output[x]))).collect();
        for (&(k, x), name) in auto_in.iter().zip(auto_names(&wanted_in, &mut taken)) {
            let own = vi_name(&graph(&models[k]).input[x]).to_string();
            inputs.push(GraphInput {
                name: Some(name),
                stage: k,
                index: x,
                feeds: vec![(k, own)],
                explicit: false,
                weight: false,
            });
        }
        for &(k, x) in &weights {
            let own = vi_name(&graph(&models[k]).input[x]).to_string();
            inputs.push(GraphInput {
                name: None,
                stage: k,
                index: x,
                feeds: vec![(k, own)],
                explicit: false,
                weight: true,
            });
        }
        for (&(k, x), name) in auto_out.iter().zip(auto_names(&wanted_out, &mut taken)) {
            outputs.push(GraphOutput { name: Some(name), stage: k, index: x });
        }
        // The exposed names become the values' final names.
        for gi in &inputs {
            let Some(name) = &gi.name else { continue };
            for (s, input) in &gi.feeds {
                pinned[*s].insert(input.clone(), name.clone());
            }
        }
        for go in &outputs {
            let Some(name) = &go.name else { continue };
            let own = vi_name(&graph(&models[go.stage]).output[go.index]);
            if let Some(prev) = pinned[go.stage].insert(own.to_string(), name.clone()) {
                if prev != *name {
                    return Err(Error::composition(format!(
                        "'{own}' of {} is exposed both as graph input '{prev}' and as graph output '{name}'",
                        labels[go.stage]
                    )));
                }
            }
        }
        Ok((inputs, outputs))
    }

    /// Leaves out the nodes, weights, value_info and graph inputs that no graph output needs,
    /// walking the stages backwards (an edge makes its output needed when its input is).
    fn prune(&mut self, models: &[ModelProto]) {
        use rayon::prelude::*;
        let n = models.len();
        // What each stage must produce: its exposed outputs, and the outputs edges take.
        let mut wanted: Vec<FxHashSet<&str>> = vec![FxHashSet::default(); n];
        for o in &self.outputs {
            wanted[o.stage].insert(vi_name(&graph(&models[o.stage]).output[o.index]));
        }
        let exposed = wanted.clone();
        let feeder = |target: &'_ Target| -> (usize, usize) {
            let (s, out) = match target {
                Target::Value(s, out) => (*s, out.as_str()),
                Target::Adapter(e) => (self.edges[*e].from, self.edges[*e].output.as_str()),
            };
            (s, graph(&models[s]).output.iter().position(|v| vi_name(v) == out).unwrap_or(usize::MAX))
        };
        for alias in &self.alias {
            for target in alias.values() {
                let (s, x) = feeder(target);
                if let Some(vi) = graph(&models[s]).output.get(x) {
                    wanted[s].insert(vi_name(vi));
                }
            }
        }
        // Each stage's liveness side by side, assuming every edge's output is needed; then,
        // from the last stage back, a stage whose consumers turn out not to need all of
        // it is walked again (rare: only where something is pruned).
        let (mut arenas, again): (Vec<Bump>, Bump) = ((0..n).map(|_| Bump::new()).collect(), Bump::new());
        let mut live: Vec<(Vec<bool>, FxHashSet<&str>)> = arenas
            .par_iter_mut()
            .zip(wanted.par_iter())
            .enumerate()
            .map(|(k, (arena, seeds))| liveness(graph(&models[k]), seeds, arena))
            .collect();
        for k in (0..n).rev() {
            let mut actual = exposed[k].clone();
            for (t, alias) in self.alias.iter().enumerate().skip(k + 1) {
                for (input, target) in alias {
                    let (s, x) = feeder(target);
                    if s == k && live[t].1.contains(input.as_str()) {
                        actual.extend(graph(&models[k]).output.get(x).map(vi_name));
                    }
                }
            }
            if actual.len() != wanted[k].len() {
                live[k] = liveness(graph(&models[k]), &actual, &again);
            }
        }
        let (nodes_kept, needed): (Vec<Vec<bool>>, Vec<FxHashSet<&str>>) = live.into_iter().unzip();
        let mut kept = Kept::default();
        let mut report = PruneReport::default();
        for (k, keep) in nodes_kept.iter().enumerate() {
            let dropped = keep.iter().filter(|&&b| !b).count();
            report.nodes += dropped;
            if dropped > 0 && dropped == keep.len() {
                report.stages.push(k);
            }
        }
        for (k, m) in models.iter().enumerate() {
            let g = graph(m);
            let inits: Vec<bool> =
                g.initializer.iter().map(|t| needed[k].contains(t.name.as_deref().unwrap_or(""))).collect();
            report.initializers += inits.iter().filter(|&&b| !b).count();
            kept.initializers.push(inits);
            kept.sparse.push(
                g.sparse_initializer
                    .iter()
                    .map(|s| needed[k].contains(s.values.as_ref().and_then(|v| v.name.as_deref()).unwrap_or("")))
                    .collect(),
            );
            kept.value_info.push(g.value_info.iter().map(|v| needed[k].contains(vi_name(v))).collect());
            self.internal_outputs[k].retain(|&x| needed[k].contains(vi_name(&g.output[x])));
        }
        kept.nodes = nodes_kept;
        self.inputs.retain(|gi| {
            let used = gi.feeds.iter().any(|(s, name)| needed[*s].contains(name.as_str()));
            if !used && !gi.explicit {
                report.inputs.push(gi.name.clone().unwrap_or_else(|| gi.feeds[0].1.clone()));
            }
            used || gi.explicit
        });
        self.kept = Some(kept);
        self.pruned = report;
    }
}

/// Which nodes of `g` produce what `seeds` names, directly or through other nodes, and
/// every name those nodes read.
fn liveness<'a>(g: &'a GraphProto, seeds: &FxHashSet<&'a str>, arena: &'a Bump) -> (Vec<bool>, FxHashSet<&'a str>) {
    let mut needed = seeds.clone();
    let mut keep = vec![false; g.node.len()];
    let (mut reads, mut found) = (Vec::new(), Vec::new());
    for (x, raw) in g.node.iter().enumerate().rev() {
        keep[x] = read_if_needed(raw, &needed, &mut reads, arena, &mut |name| found.push(name));
        needed.extend(found.drain(..));
    }
    (keep, needed)
}

/// NodeProto.attribute (node.rs keeps its own field numbers private).
const NODE_ATTRIBUTE: u32 = 5;

/// If any output of the node (kept as bytes) is in `needed`, calls `f` on every name it
/// reads and returns true. One pass over the node's fields; a node with subgraphs is decoded.
fn read_if_needed<'a>(
    raw: &'a bytes::Bytes,
    needed: &FxHashSet<&str>,
    inputs: &mut Vec<&'a str>,
    arena: &'a Bump,
    f: &mut impl FnMut(&'a str),
) -> bool {
    inputs.clear();
    let (mut wanted, mut attributes) = (false, false);
    for fl in crate::node::fields(raw) {
        match fl {
            Ok(fl) if fl.tag == crate::node::INPUT => inputs.extend(fl.text().filter(|s| !s.is_empty())),
            Ok(fl) if fl.tag == crate::node::OUTPUT => {
                wanted |= fl.text().is_some_and(|s| !s.is_empty() && needed.contains(s));
            }
            Ok(fl) => attributes |= fl.tag == NODE_ATTRIBUTE,
            // Checked when the model was decoded; kept when unsure.
            Err(_) => wanted = true,
        }
    }
    if wanted {
        inputs.iter().for_each(|&s| f(s));
        if attributes {
            subgraph_reads(raw, arena, f);
        }
    }
    wanted
}

/// Calls `f` on every name in the node's subgraphs (the outer names they read among them;
/// the rest is harmless).
fn subgraph_reads<'a>(raw: &'a bytes::Bytes, arena: &'a Bump, f: &mut impl FnMut(&'a str)) {
    if !crate::node::has_tensors_or_graphs(raw) {
        return;
    }
    let Ok(mut node) = crate::node::decode(raw) else { return };
    struct Reads<'a, 'f, F: FnMut(&'a str)>(&'a Bump, &'f mut F);
    impl<'a, F: FnMut(&'a str)> Visitor for Reads<'a, '_, F> {
        fn value(&mut self, name: &str) -> Option<&str> {
            (self.1)(self.0.alloc_str(name));
            None
        }
    }
    let mut reads = Reads(arena, f);
    for a in &mut node.attribute {
        for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
            walk_graph(g, &mut reads);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::compose::testing::*;

    #[test]
    fn edge_errors_name_stages_tensors_and_near_misses() {
        let three = || vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let loop_ = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x"), edge(2, "y", 0, "x")], &[]);
        let msg = composition_error(three(), &loop_);
        assert!(msg.contains("the edges form a loop: m0.onnx -> m1.onnx -> m2.onnx -> m0.onnx"), "{msg}");
        let back = graph_opts(vec![edge(2, "y", 0, "x")], &[]);
        assert!(composition_error(three(), &back).contains("m2.onnx comes after m0.onnx in the stage order"));
        let msg = composition_error(three(), &graph_opts(vec![edge(0, "y", 7, "x")], &[]));
        assert!(msg.contains("there is no stage 7 (3 stages given)"), "{msg}");
        let msg = composition_error(three(), &graph_opts(vec![edge(0, "Y", 1, "x")], &[]));
        assert!(
            msg.contains("edge 0 (m0.onnx.Y -> m1.onnx.x): 'Y' is not an output of m0.onnx (did you mean 'y'?)"),
            "{msg}"
        );
        let twice = graph_opts(vec![edge(0, "y", 2, "x"), edge(1, "y", 2, "x")], &[]);
        let msg = composition_error(three(), &twice);
        assert!(msg.contains("input 'x' of m2.onnx is fed twice, by 'y' of m0.onnx and by 'y' of m1.onnx"), "{msg}");
        let opts = Options {
            edges: Some(vec![edge(0, "y", 1, "x")]),
            graph_inputs: Some(vec![("x".into(), vec![(1, "x".into())])]),
            ..Default::default()
        };
        assert!(composition_error(three(), &opts).contains("is fed twice, by this graph input and by edge 0"));
        let msg = composition_error(three(), &graph_opts(vec![], &[("a", 0, "y"), ("a", 1, "y")]));
        assert!(msg.contains("the name 'a' is exposed twice"), "{msg}");
        let msg = composition_error(three(), &graph_opts(vec![], &[("a", 0, "yy")]));
        assert!(msg.contains("graph output 'a': 'yy' is not an output of m0.onnx (did you mean 'y'?)"), "{msg}");
    }

    #[test]
    fn mismatches_say_which_adapter_fixes_them_and_adapt_inserts_it() {
        let pair = || vec![scale(1), with_shape(scale(11), &[2, 4], &[2, 4], 11)];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let msg = composition_error(pair(), &opts);
        assert!(msg.contains("output 'y' is float but input 'x' expects double; pass adapt=True"), "{msg}");
        assert!(msg.ends_with("to insert a Cast to double"), "{msg}");
        let c = compose_graph(pair(), &labels(2), &Options { adapt: Adapt::All, ..opts.clone() }).unwrap();
        let g = c.model.graph.unwrap();
        let cast = node_at(&g, 2);
        assert_eq!((cast.op_type.as_deref(), cast.input.clone()), (Some("Cast"), vec!["y".to_string()]));
        assert_eq!(node_at(&g, 3).input[0], cast.output[0]);
        assert_eq!(c.report.adapters, [(0, "Cast to double".to_string())]);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 5)]);

        // A missing leading axis: an Unsqueeze (axes as an input from opset 13).
        let batch = || vec![with_shape(scale(1), &[2, 4], &[4], 1), with_shape(scale(1), &[1, 4], &[1, 4], 1)];
        let msg = composition_error(batch(), &opts);
        assert!(msg.contains("output 'y' has shape [4] but input 'x' expects [1, 4]"), "{msg}");
        assert!(msg.ends_with("insert a Unsqueeze of axis 0"), "{msg}");
        let adapt = Options { adapt: Adapt::Edges(vec![0]), ..opts.clone() };
        let g = compose_graph(batch(), &labels(2), &adapt).unwrap().model.graph.unwrap();
        let unsqueeze = node_at(&g, 2);
        assert_eq!(unsqueeze.op_type.as_deref(), Some("Unsqueeze"));
        assert!(g.initializer.iter().any(|t| t.name.as_deref() == Some(unsqueeze.input[1].as_str())));
        // An extra leading axis of size 1: a Squeeze (an attribute before opset 13).
        let mut extra = vec![with_shape(scale(1), &[2, 4], &[1, 4], 1), with_shape(scale(1), &[4], &[4], 1)];
        for m in &mut extra {
            m.opset_import[0].version = Some(11);
        }
        let msg = composition_error(extra.clone(), &opts);
        assert!(msg.ends_with("insert a Squeeze of axis 0"), "{msg}");
        let c = compose_graph(extra, &labels(2), &adapt).unwrap();
        let squeeze = node_at(c.model.graph.as_ref().unwrap(), 2);
        assert_eq!((squeeze.op_type.as_deref(), squeeze.input.len()), (Some("Squeeze"), 1));
        assert_eq!(squeeze.attribute[0].ints, [0]);
        let out_of_range = Options { adapt: Adapt::Edges(vec![3]), ..opts.clone() };
        assert!(composition_error(batch(), &out_of_range).contains("adapt lists edge 3, but there is 1 edge"));
        // Two different static sizes: no adapter helps, both sides are named.
        let wide = vec![scale(1), with_shape(scale(1), &[2, 5], &[2, 5], 1)];
        let msg = composition_error(wide, &adapt);
        assert!(
            msg.contains("output 'y' has shape [2, 4] but input 'x' expects [2, 5]") && !msg.contains("adapt"),
            "{msg}"
        );
    }

    #[test]
    fn symbolic_dims_joined_by_an_edge_take_one_name() {
        let (mut a, mut b) = (scale(1), scale(1));
        symbolic(&mut a, "batch", "batch");
        symbolic(&mut b, "N", "N");
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose_graph(vec![a, b], &labels(2), &opts).unwrap().model.graph.unwrap();
        let dim = |vi: &ValueInfoProto| match vi.r#type.as_ref().unwrap().value.as_ref().unwrap() {
            type_proto::Value::TensorType(t) => t.shape.as_ref().unwrap().dim[0].value.clone(),
            _ => None,
        };
        assert_eq!(dim(&g.output[0]), Some(Dim::DimParam("batch".into())));
    }

    /// `m` with the shapes of its input and output replaced: ints are sizes, other text names.
    fn shaped(mut m: ModelProto, input: &[&str], output: &[&str]) -> ModelProto {
        let g = m.graph.as_mut().unwrap();
        for (vi, dims) in [(&mut g.input[0], input), (&mut g.output[0], output)] {
            let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_mut().unwrap().value.as_mut() else { panic!() };
            t.shape.as_mut().unwrap().dim = dims
                .iter()
                .map(|d| tensor_shape_proto::Dimension {
                    value: Some(d.parse().map(Dim::DimValue).unwrap_or_else(|_| Dim::DimParam(d.to_string()))),
                    denotation: None,
                })
                .collect();
        }
        m
    }

    fn shape_of(vi: &ValueInfoProto) -> Vec<String> {
        let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().unwrap().value.as_ref() else { panic!() };
        t.shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| match d.value.as_ref() {
                Some(Dim::DimValue(v)) => v.to_string(),
                Some(Dim::DimParam(p)) => p.clone(),
                None => "?".into(),
            })
            .collect()
    }

    #[test]
    fn static_sizes_cross_edges_into_symbolic_dims() {
        // A backbone's [batch, 1000] into a softmax declared [N, d1] -> [N, d1]: the
        // softmax's output is [batch, 1000], and so is a topk's input after it.
        let models = vec![
            shaped(scale(1), &["batch", "3"], &["batch", "1000"]),
            shaped(scale(1), &["N", "d1"], &["N", "d1"]),
            shaped(scale(1), &["N", "d1"], &["N", "5"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("p", 1, "y"), ("top", 2, "y")]);
        let g = compose_graph(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "1000"]);
        assert_eq!(shape_of(&g.output[1]), ["batch", "5"]);
        // Backwards too: a static size that a later stage needs fixes the pipeline's input.
        let models = vec![shaped(scale(1), &["N", "C"], &["N", "C"]), shaped(scale(1), &["b", "3"], &["b", "7"])];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose_graph(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.input[0]), ["N", "3"]);
        assert_eq!(shape_of(&g.output[0]), ["N", "7"]);
        // A size reaching a class through a later member sizes its root too: to_float's
        // [N, d1, d2, d3] -> layout's [N, H, W, C] -> [N, C, H, W] -> grayscale's [N, 3, H, W].
        let models = vec![
            shaped(scale(1), &["N", "d1", "d2", "d3"], &["N", "d1", "d2", "d3"]),
            shaped(scale(1), &["N", "H", "W", "C"], &["N", "C", "H", "W"]),
            shaped(scale(1), &["N", "3", "H", "W"], &["N", "1", "H", "W"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("out", 2, "y")]);
        let g = compose_graph(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.input[0]), ["N", "d1", "d2", "3"]);
        assert_eq!(shape_of(&g.output[0]), ["N", "1", "d1", "d2"]);
        // Two different sizes for one class: it stays a name.
        let models = vec![
            shaped(scale(1), &["N", "4"], &["N", "4"]),
            shaped(scale(1), &["N", "d"], &["N", "d"]),
            shaped(scale(1), &["N", "5"], &["N", "5"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("mid", 1, "y"), ("out", 2, "y")]);
        let g = compose_graph(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["N", "d"]);
    }

    #[test]
    fn made_up_names_give_way_to_real_ones() {
        // skl2onnx's classifier declares [unk__1, 10]; the softmax after it calls it N.
        let models =
            vec![shaped(scale(1), &["unk__0", "4"], &["unk__1", "10"]), shaped(scale(1), &["N", "d1"], &["N", "d1"])];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("p", 1, "y")]);
        let g = compose_graph(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["N", "10"]);
        assert!(super::placeholder("unk__12") && !super::placeholder("unk__") && !super::placeholder("unknown"));
    }

    #[test]
    fn products_of_known_sizes_are_sizes() {
        // flatten declares [N, d1*d2*d3]; fed [batch, 3, 8, 8] it writes [batch, 192], and a
        // factor of unknown size keeps the product, in the names its classes took.
        let flatten = |m| shaped(m, &["N", "d1", "d2", "d3"], &["N", "d1*d2*d3"]);
        let models = vec![shaped(scale(1), &["batch", "3"], &["batch", "3", "8", "8"]), flatten(scale(1))];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose_graph(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "192"]);
        let models = vec![shaped(scale(1), &["batch", "3"], &["batch", "3", "H", "W"]), flatten(scale(1))];
        let g = compose_graph(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "3*H*W"]);
    }

    #[test]
    fn pruning_leaves_out_what_no_output_needs() {
        let models = vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let edges = vec![edge(0, "y", 1, "x"), edge(0, "y", 2, "x")];
        let c = compose_graph(models.clone(), &labels(3), &graph_opts(edges.clone(), &[("left", 1, "y")])).unwrap();
        let g = c.model.graph.unwrap();
        assert_eq!(g.node.len(), 4);
        assert_eq!(g.initializer.len(), 2);
        assert_eq!(c.report.pruned.stages, [2]);
        assert_eq!((c.report.pruned.nodes, c.report.pruned.initializers), (2, 1));
        assert_eq!(c.report.unused_outputs, [(2, "y".to_string())]);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 4), (4, 4)]);
        // A chain whose tail nothing needs: pruning walks back through it.
        let chain = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("first", 0, "y")]);
        let c = compose_graph(models.clone(), &labels(3), &chain).unwrap();
        assert_eq!(c.report.pruned.stages, [1, 2]);
        assert_eq!(c.model.graph.unwrap().node.len(), 2);
        // Off on request: everything stays.
        let keep = Options { prune: Some(false), ..graph_opts(edges, &[("left", 1, "y")]) };
        assert_eq!(compose_graph(models, &labels(3), &keep).unwrap().model.graph.unwrap().node.len(), 6);
    }

    #[test]
    fn the_linear_form_is_converted_to_edges_in_one_place() {
        let (edges, wheres) = crate::plan::linear_edges(&[scale(1), scale(1)], &labels(2), None).unwrap();
        assert_eq!(edges, [edge(0, "y", 1, "x")]);
        assert_eq!(wheres, ["joint 0 (m0.onnx -> m1.onnx)"]);
        // io_maps and edges together are refused.
        let both = Options { io_maps: Some(vec![vec![]]), edges: Some(vec![]), ..Default::default() };
        assert!(composition_error(vec![scale(1), scale(1)], &both).contains("not both"));
    }
}
