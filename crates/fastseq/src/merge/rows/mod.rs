//! Whether the rows of a batch stay apart: an analysis over a composed graph that follows
//! the batch axis (axis 0 of every graph input) through every node, so that a batcher can
//! tell whether joining requests along it gives each caller what it would get alone.
//!
//! Every value is tracked as: its dims, one of which may be the batch axis ([`value::Dim`]);
//! for small integer tensors, their elements (so that shape arithmetic such as
//! `Reshape(x, Concat(Shape(x)[0], -1))` is followed exactly); and whether its values are
//! computed from the number of rows. A node that reduces, normalises, sorts, contracts,
//! slides over, recurs along, cuts, pads or merges the batch axis, or that uses the batch
//! size as data, makes its outputs "mixed" ([`value::Val::Mixed`]), with the reason; so does
//! any operator the table ([`ops`]) does not know, unless none of its inputs depends on the
//! batch. Model-local functions are followed into; `If` branches are followed when the
//! condition does not depend on the batch; `Loop` and `Scan` bodies step by step where the
//! rows stay apart from one step to the next (`loops`).
//! The graph's rows are independent when every output is row-wise with its batch axis at 0.
//!
//! Conservative by design: a false "independent" would silently compute wrong results, a
//! false "dependent" only asks the user to confirm (`row_independent=True` in Python).
use std::collections::{HashMap, HashSet};

use crate::codec::node::{decode, subgraphs};
use crate::codec::proto::tensor_shape_proto::dimension::Value as DimValue;
use crate::codec::proto::type_proto::Value as TypeValue;
use crate::codec::proto::{AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, ValueInfoProto};
use crate::merge::opsets::normalize_domain;
use crate::merge::rows::args::Args;
use crate::merge::rows::value::{attr, from_tensor, Dim, Sym, Val, Why, T};

mod args;
mod batch_one;
mod elementwise;
mod index;
mod linalg;
mod loops;
mod ml;
mod ops;
mod place;
mod reduce;
mod shape;
#[cfg(test)]
mod testing;
pub mod value;

pub use batch_one::{dynamic_batch, BATCH};

/// One reason why the rows of a batch may mix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The top-level node at fault (its index in the graph), if a node is.
    pub node: Option<usize>,
    pub name: String,
    pub op_type: String,
    /// The node inside it (function body, If branch) that is at fault, described.
    pub inner: Option<String>,
    pub reason: String,
}

/// The most rows a batcher may join into one batch (its `max_batch_size` at most): below
/// 2^31, so that the number of rows cast to a 32-bit integer in a model is that number, as
/// the analysis takes it (paddle2onnx casts it to INT32 for its Reshapes). The batchers ask
/// for it (`_core.MAX_BATCH_SIZE`); a request run alone computes what it does whatever its size.
pub const MAX_BATCH_ROWS: i64 = i32::MAX as i64;

/// Functions and subgraphs nested deeper than this are not followed (refused).
const MAX_DEPTH: usize = 32;

/// Nodes followed in one analysis beyond the graph's own, counting each function call's
/// body and each loop step's again: far above what real models expand to, far below what
/// nesting can reach (calls of calls and loops in loops, followed each time, double a level).
const MAX_EXTRA_VISITS: usize = 200_000;

/// Why the rows of a batch run through `model` may depend on other rows: empty when every
/// output keeps each row apart, with its batch axis first.
pub fn row_findings(model: &ModelProto) -> Vec<Finding> {
    let Some(g) = model.graph.as_ref() else { return Vec::new() };
    let cx = Cx {
        functions: model
            .functions
            .iter()
            .map(|f| ((f.domain.clone().unwrap_or_default(), f.name.clone().unwrap_or_default()), f))
            .collect(),
        opset: opset_of(&model.opset_import),
        visits: std::cell::Cell::new(0),
        max_visits: g.node.len().saturating_add(MAX_EXTRA_VISITS),
    };
    let mut scope = Scope::new(None);
    for t in &g.initializer {
        scope.set(t.name.clone().unwrap_or_default(), Val::T(from_tensor(t)));
    }
    for s in &g.sparse_initializer {
        if let Some(name) = s.values.as_ref().and_then(|v| v.name.clone()) {
            scope.set(name, Val::T(T::shaped(s.dims.iter().map(|&d| Dim::Fixed(d)).collect())));
        }
    }
    for (j, vi) in g.input.iter().enumerate() {
        let name = vi.name.clone().unwrap_or_default();
        if !scope.vars.contains_key(&name) {
            scope.set(name, input(vi, j));
        }
    }
    let mut top: Vec<(String, String)> = Vec::with_capacity(g.node.len());
    let mut producer: HashMap<String, usize> = HashMap::new();
    for (k, raw) in g.node.iter().enumerate() {
        let Ok(node) = decode(raw) else {
            top.push((String::new(), String::new()));
            continue;
        };
        top.push((node.name.clone().unwrap_or_default(), node.op_type.clone().unwrap_or_default()));
        for o in &node.output {
            producer.insert(o.clone(), k);
        }
        let site = Site { top: None, within: String::new(), opset: cx.opset, depth: 0 };
        cx.node(&node, k, &mut scope, &site);
    }
    let mut findings: Vec<Finding> = Vec::new();
    let describe = |node: Option<usize>, inner: Option<String>, reason: String| {
        let node = node.filter(|&k| k != usize::MAX);
        let (name, op_type) = node.and_then(|k| top.get(k).cloned()).unwrap_or_default();
        Finding { node, name, op_type, inner, reason }
    };
    for vi in &g.output {
        let name = vi.name.clone().unwrap_or_default();
        let at = producer.get(&name).copied();
        let finding = match scope.get(&name) {
            Some(Val::Mixed(why)) => Some(describe(Some(why.node), why.inner.clone(), why.reason.clone())),
            Some(Val::T(t)) if t.place.is_some() => Some(describe(
                at,
                None,
                format!("output '{name}' holds each row's place in the batch, not the row's own values"),
            )),
            Some(Val::T(t)) if t.flat.is_some() => Some(describe(
                at,
                None,
                format!("output '{name}' holds several entries per row on its batch axis (merged with other axes)"),
            )),
            Some(Val::T(t)) => match t.batch() {
                Some(0) if t.merged.is_some() => Some(describe(
                    at,
                    None,
                    format!("output '{name}' holds several entries per row on its batch axis (merged with other axes)"),
                )),
                Some(0) => None,
                None if t.loose => None,
                Some(k) => Some(describe(
                    at,
                    None,
                    format!("leaves the batch axis of output '{name}' on axis {k} (a batch is split along axis 0)"),
                )),
                None if t.on_n => {
                    Some(describe(at, None, format!("output '{name}' is computed from the number of rows")))
                }
                None => {
                    Some(describe(at, None, format!("output '{name}' has no batch axis: it does not follow the rows")))
                }
            },
            Some(Val::Absent) | None => {
                Some(describe(at, None, format!("output '{name}' is not computed by the graph")))
            }
        };
        if let Some(f) = finding {
            if !findings.contains(&f) {
                findings.push(f);
            }
        }
    }
    findings
}

/// A graph input (number `j`): its axis 0 is the batch axis (every request's rows); a size
/// its other axes do not fix is known by which input and axis it is.
fn input(vi: &ValueInfoProto, j: usize) -> Val {
    let name = vi.name.as_deref().unwrap_or("");
    let why = |reason: String| Val::Mixed(Why { node: usize::MAX, inner: None, reason });
    let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return why(format!("input '{name}' is not a tensor: it has no batch axis"));
    };
    let Some(shape) = t.shape.as_ref() else {
        return Val::T(T { loose: true, ..T::default() });
    };
    if shape.dim.is_empty() {
        return why(format!("input '{name}' is a scalar: it has no batch axis"));
    }
    let batch_name = match &shape.dim[0].value {
        Some(DimValue::DimParam(p)) if !p.is_empty() => Some(p.as_str()),
        _ => None,
    };
    let mut dims = vec![Dim::Batch];
    for (k, d) in shape.dim.iter().enumerate().skip(1) {
        dims.push(match &d.value {
            Some(DimValue::DimValue(v)) => Dim::Fixed(*v),
            Some(DimValue::DimParam(p)) if Some(p.as_str()) == batch_name => {
                return why(format!("input '{name}' has the batch size '{p}' on axis {k} too"));
            }
            _ => Dim::Free(u32::try_from(j).ok().zip(u32::try_from(k).ok()).map(|(input, axis)| Sym { input, axis })),
        });
    }
    Val::T(T::shaped(dims))
}

pub(crate) fn opset_of(imports: &[crate::codec::proto::OperatorSetIdProto]) -> i64 {
    imports
        .iter()
        .find(|o| normalize_domain(o.domain.as_deref().unwrap_or("")).is_empty())
        .and_then(|o| o.version)
        .unwrap_or(1)
}

/// Values by name; a subgraph's scope sees its parents'.
struct Scope<'p> {
    vars: HashMap<String, Val>,
    parent: Option<&'p Scope<'p>>,
}

impl<'p> Scope<'p> {
    fn new(parent: Option<&'p Scope<'p>>) -> Scope<'p> {
        Scope { vars: HashMap::new(), parent }
    }

    fn get(&self, name: &str) -> Option<&Val> {
        self.vars.get(name).or_else(|| self.parent.and_then(|p| p.get(name)))
    }

    fn set(&mut self, name: String, v: Val) {
        self.vars.insert(name, v);
    }
}

/// Where nodes are being read: inside which top-level node, if any.
struct Site {
    top: Option<usize>,
    /// " in function 'f'", " in the then_branch of If 'x'".
    within: String,
    opset: i64,
    depth: usize,
}

struct Cx<'m> {
    functions: HashMap<(String, String), &'m FunctionProto>,
    opset: i64,
    /// Nodes read so far, function bodies and loop steps each time they are followed.
    visits: std::cell::Cell<usize>,
    /// The most nodes followed before refusing the rest.
    max_visits: usize,
}

impl Cx<'_> {
    /// Reads one node: its outputs set in `scope`.
    fn node(&self, node: &NodeProto, k: usize, scope: &mut Scope, site: &Site) {
        let op = node.op_type.as_deref().unwrap_or("");
        let at = site.top.unwrap_or(k);
        let inner = site.top.map(|_| format!("node '{}' ({op}){}", node.name.as_deref().unwrap_or(""), site.within));
        let why = |reason: String| Why { node: at, inner: inner.clone(), reason };
        // Functions calling functions and loops in loops are followed each time: nested
        // deep, a small graph expands without end; past this many nodes it is refused.
        self.visits.set(self.visits.get() + 1);
        let outs = if self.visits.get() > self.max_visits {
            Err(Fault::Here(format!(
                "{op} is past the {} nodes the analysis follows (function calls and loop steps nested deep)",
                self.max_visits
            )))
        } else {
            self.outputs(node, at, scope, site)
        };
        let outs = outs.unwrap_or_else(|e| match e {
            Fault::Here(reason) => vec![Val::Mixed(why(reason)); node.output.len()],
            Fault::From(w) => vec![Val::Mixed(w); node.output.len()],
        });
        for (name, v) in node.output.iter().zip(outs) {
            if !name.is_empty() {
                scope.set(
                    name.clone(),
                    match v {
                        Val::Mixed(w) if w.node == usize::MAX => Val::Mixed(why(w.reason)),
                        v => v,
                    },
                );
            }
        }
    }

    fn outputs(&self, node: &NodeProto, at: usize, scope: &Scope, site: &Site) -> Result<Vec<Val>, Fault> {
        let op = node.op_type.as_deref().unwrap_or("");
        let domain = node.domain.as_deref().unwrap_or("");
        let mut ins: Vec<Option<T>> = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                ins.push(None);
                continue;
            }
            match scope.get(name) {
                Some(Val::T(t)) => ins.push(Some(t.clone())),
                Some(Val::Mixed(w)) => return Err(Fault::From(w.clone())),
                Some(Val::Absent) => ins.push(None),
                None => return Err(Fault::Here(format!("{op} reads '{name}', which nothing before it defines"))),
            }
        }
        if site.depth > MAX_DEPTH {
            return Err(Fault::Here(format!("{op} is nested too deep to follow")));
        }
        // A row's place in the batch goes only where it indexes the row's own entries; this
        // comes before every other rule, so that none of them reads it as row-wise data.
        if ins.iter().flatten().any(|t| t.place.is_some() || t.flat.is_some()) {
            let outs = place::step(&Args { node, ins: &ins, opset: site.opset }, normalize_domain(domain).is_empty())
                .map_err(Fault::Here)?;
            return Ok(vals(op, outs, node.output.len(), None));
        }
        if ins.iter().flatten().any(|t| t.loose) && !ops::follows_loose(op, domain, &ins) {
            return Err(Fault::Here(format!(
                "{op} reads an input declared without a shape: where its batch axis is cannot be told"
            )));
        }
        let graphs: Vec<&GraphProto> = subgraphs(node).collect();
        if op == "If" && normalize_domain(domain).is_empty() {
            return self.if_node(node, at, &ins, scope, site);
        }
        if op == "Loop" && normalize_domain(domain).is_empty() {
            return self.loop_node(node, at, &ins, scope, site);
        }
        if op == "Scan" && normalize_domain(domain).is_empty() {
            return self.scan_node(node, at, &ins, scope, site);
        }
        if !graphs.is_empty() {
            // Other holders of subgraphs (other domains' ops): harmless only on values that do
            // not depend on the batch, theirs and those their subgraphs read from outside.
            let mut free = Vec::new();
            for g in &graphs {
                free_names(g, &mut free);
            }
            let mut fixed = ins.iter().flatten().all(T::fixed);
            for name in &free {
                match scope.get(name) {
                    Some(Val::Mixed(w)) => return Err(Fault::From(w.clone())),
                    Some(Val::T(t)) => fixed &= t.fixed(),
                    _ => {}
                }
            }
            if fixed {
                return Ok(vec![Val::T(T::opaque(false)); node.output.len()]);
            }
            return Err(Fault::Here(format!("{op} runs a subgraph over values of the batch, which is not followed")));
        }
        // A model-local function in the default domain does not replace a standard operator
        // of its name: ONNX Runtime runs the operator (a local 'Softmax' whose body is an
        // Identity still runs Softmax). Such calls take the operators' rules here, and one
        // named like no operator the table knows is refused as unknown.
        if !normalize_domain(domain).is_empty() {
            if let Some(f) = self.functions.get(&(domain.to_string(), op.to_string())) {
                return Ok(self.call(f, node, at, &ins, site));
            }
        }
        let opset = if normalize_domain(domain).is_empty() { site.opset } else { 0 };
        // Rows merged with other axes (attention's heads) stay in their blocks only where
        // every value combined lays them out the same way; outputs keep that layout unless
        // the operator re-lays them (Reshape, Flatten).
        let mut layouts = ins.iter().flatten().filter(|t| t.batch().is_some()).map(T::layout);
        let layout = layouts.next();
        if layout.is_some_and(|l| layouts.any(|m| m != l)) {
            return Err(Fault::Here(format!("{op} combines values whose batch axes hold their rows differently")));
        }
        let relays = matches!(op, "Reshape" | "Flatten") && normalize_domain(domain).is_empty();
        let merged = layout.filter(|l| *l != (1, 1) && !relays);
        let outs = ops::step(&Args { node, ins: &ins, opset }).map_err(Fault::Here)?;
        Ok(vals(op, outs, node.output.len(), merged))
    }

    /// An If: both branches followed, when the condition does not depend on the batch.
    fn if_node(
        &self,
        node: &NodeProto,
        top: usize,
        ins: &[Option<T>],
        scope: &Scope,
        site: &Site,
    ) -> Result<Vec<Val>, Fault> {
        let cond = ins.first().cloned().flatten().unwrap_or_default();
        if cond.batch().is_some() {
            return Err(Fault::Here("If takes one branch for the whole batch by a value of its rows".into()));
        }
        if cond.on_n {
            return Err(Fault::Here("If chooses its branch by the number of rows".into()));
        }
        let name = node.name.as_deref().unwrap_or("");
        let mut results: Vec<Vec<Val>> = Vec::new();
        for branch in ["then_branch", "else_branch"] {
            let Some(g) = attr(node, branch).and_then(|a| a.g.as_ref()) else {
                return Err(Fault::Here(format!("If has no {branch}")));
            };
            let mut inner = Scope::new(Some(scope));
            let at = Site {
                top: Some(top),
                within: format!(" in the {branch} of If '{name}'{}", site.within),
                opset: site.opset,
                depth: site.depth + 1,
            };
            self.graph(g, &mut inner, &at);
            results.push(
                g.output
                    .iter()
                    .map(|o| inner.get(o.name.as_deref().unwrap_or("")).cloned().unwrap_or(Val::Absent))
                    .collect(),
            );
        }
        let (then, other) = (&results[0], &results[1]);
        Ok(then
            .iter()
            .zip(other)
            .map(|pair| match pair {
                (Val::Mixed(w), _) | (_, Val::Mixed(w)) => Val::Mixed(w.clone()),
                (Val::T(a), Val::T(b))
                    if a.batch() == b.batch()
                        && a.rank() == b.rank()
                        && a.merged == b.merged
                        && a.place == b.place
                        && a.flat == b.flat =>
                {
                    Val::T(join(a, b))
                }
                _ => Val::Mixed(Why {
                    node: usize::MAX,
                    inner: None,
                    reason: "If's branches put the batch axis in different places".into(),
                }),
            })
            .collect())
    }

    /// The nodes of a subgraph, read in `scope` (whose parent is the enclosing scope).
    fn graph(&self, g: &GraphProto, scope: &mut Scope, site: &Site) {
        for vi in &g.input {
            // If's branches have none; Loop and Scan bodies are given theirs (loops.rs).
            scope.set(vi.name.clone().unwrap_or_default(), Val::T(T::opaque(false)));
        }
        self.graph_nodes(g, scope, site);
    }

    /// A subgraph's weights and nodes, its inputs already in `scope` (an input overrides a
    /// weight of its name, its default).
    fn graph_nodes(&self, g: &GraphProto, scope: &mut Scope, site: &Site) {
        for t in &g.initializer {
            let name = t.name.clone().unwrap_or_default();
            if !scope.vars.contains_key(&name) {
                scope.set(name, Val::T(from_tensor(t)));
            }
        }
        for (k, raw) in g.node.iter().enumerate() {
            // Checked when the model was decoded: a node that does not decode is not reached.
            if let Ok(n) = decode(raw) {
                self.node(&n, k, scope, site);
            }
        }
    }

    /// A call of a model-local function: its body followed with the caller's values and
    /// attributes.
    fn call(&self, f: &FunctionProto, caller: &NodeProto, top: usize, ins: &[Option<T>], site: &Site) -> Vec<Val> {
        let mut scope = Scope::new(None);
        for (k, name) in f.input.iter().enumerate() {
            let v = ins.get(k).cloned().flatten().map_or(Val::Absent, Val::T);
            scope.set(name.clone(), v);
        }
        let mut given: HashMap<&str, &AttributeProto> = HashMap::new();
        for a in &f.attribute_proto {
            given.insert(a.name.as_deref().unwrap_or(""), a);
        }
        for a in &caller.attribute {
            given.insert(a.name.as_deref().unwrap_or(""), a);
        }
        let fname = f.name.as_deref().unwrap_or("");
        let at = Site {
            top: Some(top),
            within: format!(" in function '{fname}'{}", site.within),
            opset: if f.opset_import.is_empty() { site.opset } else { opset_of(&f.opset_import) },
            depth: site.depth + 1,
        };
        for (k, body) in f.node.iter().enumerate() {
            let mut n = body.clone();
            n.attribute = body
                .attribute
                .iter()
                .filter_map(|a| match a.ref_attr_name.as_deref() {
                    None => Some(a.clone()),
                    Some(r) => given.get(r).map(|v| AttributeProto {
                        name: a.name.clone(),
                        ref_attr_name: None,
                        ..(*v).clone()
                    }),
                })
                .collect();
            self.node(&n, k, &mut scope, &at);
        }
        f.output.iter().map(|o| scope.get(o).cloned().unwrap_or(Val::Absent)).collect()
    }
}

enum Fault {
    /// This node is at fault, for this reason.
    Here(String),
    /// An input was already mixed.
    From(Why),
}

/// A rule's outputs as the node's `n` values: rows keep the layout `merged` of the rows
/// the node read (None: the rule's own); a reason becomes a mixed value (its node set by
/// `Cx::node`).
fn vals(op: &str, outs: args::Outs, n: usize, merged: Option<(i64, i64)>) -> Vec<Val> {
    let why = |reason: String| Val::Mixed(Why { node: usize::MAX, inner: None, reason });
    let mut outs = outs.into_iter();
    (0..n)
        .map(|k| match outs.next() {
            Some(Ok(t)) if merged.is_some() && t.batch().is_some() => Val::T(T { merged, ..t }),
            Some(Ok(t)) => Val::T(t),
            Some(Err(reason)) => why(reason),
            None => why(format!("{op}'s output {k} is not followed")),
        })
        .collect()
}

/// Two branches' values for one output: what both have in common.
fn join(a: &T, b: &T) -> T {
    let dims = match (a.dims(), b.dims()) {
        (Some(x), Some(y)) => Some(x.iter().zip(y).map(|(p, q)| if p == q { *p } else { Dim::Free(None) }).collect()),
        _ => None,
    };
    T {
        dims,
        ints: if a.ints == b.ints { a.ints.clone() } else { None },
        floats: None,
        on_n: a.on_n || b.on_n,
        loose: a.loose || b.loose,
        merged: a.merged,
        place: a.place, // the same in both (checked by the caller)
        flat: a.flat,
        below: if a.below == b.below { a.below } else { None },
    }
}

/// The names a subgraph reads from outside itself (its nested subgraphs included).
pub(super) fn free_names(g: &GraphProto, out: &mut Vec<String>) {
    let mut defined: HashSet<String> = g.input.iter().filter_map(|v| v.name.clone()).collect();
    defined.extend(g.initializer.iter().filter_map(|t| t.name.clone()));
    defined.extend(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()?.name.clone()));
    for raw in &g.node {
        let Ok(n) = decode(raw) else { continue };
        for i in &n.input {
            if !i.is_empty() && !defined.contains(i) {
                out.push(i.clone());
            }
        }
        for sub in subgraphs(&n) {
            let mut inner = Vec::new();
            free_names(sub, &mut inner);
            out.extend(inner.into_iter().filter(|i| !defined.contains(i)));
        }
        defined.extend(n.output.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{AttributeProto, TensorProto};
    use crate::codec::testing::value_of as vi;
    use crate::merge::rows::testing::{int as attr_i, ints, node as n};

    fn model(nodes: Vec<NodeProto>, x: &[&str], y: &[&str], inits: Vec<TensorProto>) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: nodes.iter().map(crate::codec::node::encode).collect(),
                input: vec![vi("x", x)],
                output: vec![vi("y", y)],
                initializer: inits,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn torchs_view_of_the_batch_size_keeps_the_rows() {
        // y = x.view(x.size(0), -1), as torch's exporter writes it.
        let m = model(
            vec![
                n("Shape", &["x"], &["s"], vec![]),
                n("Gather", &["s", "zero"], &["b"], vec![attr_i("axis", 0)]),
                n("Unsqueeze", &["b", "axes"], &["b1"], vec![]),
                n("Concat", &["b1", "minus1"], &["shape"], vec![attr_i("axis", 0)]),
                n("Reshape", &["x", "shape"], &["y"], vec![]),
            ],
            &["N", "3", "4"],
            &["N", "12"],
            vec![ints("zero", &[0], true), ints("axes", &[0], false), ints("minus1", &[-1], false)],
        );
        assert_eq!(row_findings(&m), vec![]);
    }

    #[test]
    fn a_softmax_over_the_rows_is_found_at_its_node() {
        let sm = n("Softmax", &["h"], &["y"], vec![attr_i("axis", 0)]);
        let m = model(vec![n("Relu", &["x"], &["h"], vec![]), sm], &["N", "4"], &["N", "4"], vec![]);
        let found = row_findings(&m);
        assert_eq!(found.len(), 1);
        let f = &found[0];
        assert_eq!((f.node, f.name.as_str(), f.op_type.as_str()), (Some(1), "softmax_y", "Softmax"));
        assert!(f.reason.contains("axis 0, which is the batch axis"), "{}", f.reason);
    }

    #[test]
    fn an_output_with_its_batch_axis_elsewhere_is_found_at_the_node_that_moved_it() {
        let perm =
            AttributeProto { name: Some("perm".into()), ints: vec![1, 0], r#type: Some(7), ..Default::default() };
        let m = model(vec![n("Transpose", &["x"], &["y"], vec![perm])], &["N", "4"], &["4", "N"], vec![]);
        let f = &row_findings(&m)[0];
        assert_eq!(f.node, Some(0));
        assert!(f.reason.contains("on axis 1"), "{}", f.reason);
    }

    #[test]
    fn a_batch_size_named_on_two_axes_or_an_unknown_name_is_refused_without_panicking() {
        let m = model(vec![n("Relu", &["x"], &["y"], vec![])], &["N", "N"], &["N", "N"], vec![]);
        assert!(row_findings(&m)[0].reason.contains("batch size 'N' on axis 1"));
        let m = model(vec![n("Add", &["x", "nowhere"], &["y"], vec![])], &["N", "4"], &["N", "4"], vec![]);
        assert!(row_findings(&m)[0].reason.contains("reads 'nowhere', which nothing before it defines"));
        let mut empty = model(vec![], &["N"], &["N"], vec![]);
        empty.graph.as_mut().unwrap().output[0].name = Some("missing".into());
        assert!(row_findings(&empty)[0].reason.contains("is not computed"));
        assert_eq!(row_findings(&ModelProto::default()), vec![]);
    }

    #[test]
    fn function_bodies_are_followed_with_the_callers_attributes() {
        let mut sm = n("Softmax", &["a"], &["b"], vec![]);
        sm.attribute.push(AttributeProto {
            name: Some("axis".into()),
            ref_attr_name: Some("along".into()),
            r#type: Some(2),
            ..Default::default()
        });
        let f = FunctionProto {
            name: Some("Norm".into()),
            domain: Some("local".into()),
            input: vec!["a".into()],
            output: vec!["b".into()],
            attribute: vec!["along".into()],
            node: vec![sm],
            opset_import: crate::codec::testing::opset17(),
            ..Default::default()
        };
        for (along, mixes) in [(1, false), (0, true)] {
            let mut call = n("Norm", &["x"], &["y"], vec![attr_i("along", along)]);
            call.domain = Some("local".into());
            let mut m = model(vec![call], &["N", "4"], &["N", "4"], vec![]);
            m.functions = vec![f.clone()];
            let found = row_findings(&m);
            assert_eq!(!found.is_empty(), mixes);
            if mixes {
                assert_eq!(found[0].inner.as_deref(), Some("node 'softmax_b' (Softmax) in function 'Norm'"));
            }
        }
    }

    #[test]
    fn if_branches_are_followed_and_must_agree() {
        let branch = |op: &str, out: &str, attrs: Vec<AttributeProto>| GraphProto {
            node: vec![crate::codec::node::encode(&n(op, &["x"], &[out], attrs))],
            output: vec![vi(out, &["N", "4"])],
            ..Default::default()
        };
        let graph_attr = |name: &str, g: GraphProto| AttributeProto {
            name: Some(name.into()),
            g: Some(g),
            r#type: Some(5),
            ..Default::default()
        };
        let cond =
            TensorProto { name: Some("c".into()), data_type: Some(9), int32_data: vec![1], ..Default::default() };
        let same = n(
            "If",
            &["c"],
            &["y"],
            vec![
                graph_attr("then_branch", branch("Relu", "a", vec![])),
                graph_attr("else_branch", branch("Neg", "b", vec![])),
            ],
        );
        assert_eq!(row_findings(&model(vec![same], &["N", "4"], &["N", "4"], vec![cond.clone()])), vec![]);
        let softmax = branch("Softmax", "b", vec![attr_i("axis", 0)]);
        let mixed = n(
            "If",
            &["c"],
            &["y"],
            vec![graph_attr("then_branch", branch("Relu", "a", vec![])), graph_attr("else_branch", softmax)],
        );
        let found = row_findings(&model(vec![mixed], &["N", "4"], &["N", "4"], vec![cond]));
        assert_eq!(found[0].node, Some(0));
        assert!(found[0].inner.as_deref().unwrap().contains("in the else_branch of If"), "{:?}", found[0]);
    }
}
