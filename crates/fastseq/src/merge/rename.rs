//! The names of a model and their renaming.
//!
//! One traversal, [`walk_model`], reaches every place where ONNX stores a name: value names
//! (node inputs and outputs, graph inputs, outputs, initializers, sparse initializers,
//! value_info, quantization annotations, sharding specs, training-info bindings and graphs,
//! If/Loop/Scan subgraphs at any depth), node names, and local-function names together with
//! their callers. It is used both to collect names and to rename them, so the two can never
//! disagree about what a name is.
//!
//! Renaming is one injective map per model applied to every scope of that model. Because the
//! map is injective, the model's own scoping (a subgraph reading an outer name, a subgraph
//! shadowing it) is preserved exactly, whatever was renamed. Function bodies are local: only
//! the calls they make to other local functions are touched.
//!
//! Graph nodes are kept as bytes (see [`node`]): the traversal reads their names in
//! place and writes a new node only when one of them changes.
use bumpalo::Bump;
use bytes::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::node;
use crate::codec::proto::{FunctionProto, GraphProto, ModelProto, NodeProto};

/// A function is identified by (domain, name, overload).
pub type FunctionKey = (String, String, String);

/// Sees every name of a model and may replace it: each method returns the new name, or
/// `None` to leave the name as it is. A name may be seen more than once (a node found not
/// to be plain partway through is read again decoded), so a visitor must not count visits.
pub trait Visitor {
    /// A value (tensor) name. Never called for empty names (absent optional inputs).
    fn value(&mut self, name: &str) -> Option<&str>;
    /// A node name. Never called for empty names.
    fn node_name(&mut self, _name: &str) -> Option<&str> {
        None
    }
    /// Whether a node without a name gets an empty one (present, ""), as onnx.compose's
    /// `add_prefix` leaves it: protobuf then writes the field, and the bytes are onnx's.
    fn name_unnamed(&self) -> bool {
        false
    }
    /// Whether [`Visitor::op_type`] can rename anything (when not, calls are not looked at).
    fn renames_calls(&self) -> bool {
        false
    }
    /// A node's op_type, which names a local function when its domain has one.
    fn op_type(&mut self, _domain: &str, _overload: &str, _op_type: &str) -> Option<&str> {
        None
    }
    /// The name of a local function.
    fn function(&mut self, _f: &mut FunctionProto) {}
    /// A subgraph of node `owner` (its name, else its op_type) is about to be walked; its
    /// names are a scope nested in the current one until [`Visitor::leave_subgraph`].
    fn enter_subgraph(&mut self, _owner: &str, _g: &GraphProto) {}
    fn leave_subgraph(&mut self) {}
}

fn set(name: &mut String, new: Option<&str>) -> bool {
    match new {
        Some(new) => {
            name.clear();
            name.push_str(new);
            true
        }
        None => false,
    }
}

pub fn walk_model(model: &mut ModelProto, v: &mut impl Visitor) {
    if let Some(g) = model.graph.as_mut() {
        walk_graph(g, v);
    }
    for t in &mut model.training_info {
        // Training graphs read the inference graph's names: same scope chain, same map.
        if let Some(g) = t.initialization.as_mut() {
            walk_graph(g, v);
        }
        if let Some(g) = t.algorithm.as_mut() {
            walk_graph(g, v);
        }
        for b in t.initialization_binding.iter_mut().chain(t.update_binding.iter_mut()) {
            opt_value(&mut b.key, v);
            opt_value(&mut b.value, v);
        }
    }
    for f in &mut model.functions {
        v.function(f);
        if v.renames_calls() {
            walk_function_calls(&mut f.node, v);
        }
    }
}

fn opt_value(name: &mut Option<String>, v: &mut impl Visitor) -> bool {
    match name.as_mut() {
        Some(n) if !n.is_empty() => set(n, v.value(n)),
        _ => false,
    }
}

fn value(name: &mut String, v: &mut impl Visitor) -> bool {
    !name.is_empty() && set(name, v.value(name))
}

/// Visits every name of `g` and of its subgraphs. Returns whether any was renamed.
pub fn walk_graph(g: &mut GraphProto, v: &mut impl Visitor) -> bool {
    let mut changed = false;
    for vi in g.input.iter_mut().chain(g.output.iter_mut()).chain(g.value_info.iter_mut()) {
        changed |= opt_value(&mut vi.name, v);
    }
    for t in &mut g.initializer {
        changed |= opt_value(&mut t.name, v);
    }
    for s in &mut g.sparse_initializer {
        // The indices' name is no value of the graph, but onnx.compose treats it as a name
        // of the graph (check_overlapping_names, add_prefix): renamed along with the rest.
        for t in s.values.iter_mut().chain(s.indices.iter_mut()) {
            changed |= opt_value(&mut t.name, v);
        }
    }
    for a in &mut g.quantization_annotation {
        changed |= opt_value(&mut a.tensor_name, v);
        for p in &mut a.quant_parameter_tensor_names {
            changed |= opt_value(&mut p.value, v);
        }
    }
    changed |= walk_raw_nodes(&mut g.node, v, false);
    changed
}

/// Nodes kept as bytes: a plain one (see [`node::is_plain`]) is read, and rewritten only if
/// a name changes; any other is decoded, walked and encoded again if it changed.
/// `calls_only`: inside a function body, where only calls to other functions are renamed.
fn walk_raw_nodes(nodes: &mut [Bytes], v: &mut impl Visitor, calls_only: bool) -> bool {
    let mut changed = false;
    // Rewritten nodes go one after another into one buffer, then are sliced from it: one
    // allocation per graph rather than one per node.
    let mut buf: Vec<u8> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    // Reserved at the first rename: every node renamed, with names a little longer.
    let size: usize = nodes.iter().map(|n| n.len()).sum();
    let room = size + size / 2;
    for (i, raw) in nodes.iter_mut().enumerate() {
        let start = buf.len();
        match rename_plain(raw, v, calls_only, &mut buf, room) {
            Plain::Unchanged => {}
            Plain::Renamed => spans.push((i, start)),
            Plain::No => changed |= walk_decoded(raw, v, calls_only),
        }
    }
    if !spans.is_empty() {
        let shared = Bytes::from(buf);
        let ends = spans.iter().skip(1).map(|&(_, start)| start).chain([shared.len()]);
        for (&(i, start), end) in spans.iter().zip(ends) {
            nodes[i] = shared.slice(start..end);
        }
        changed = true;
    }
    changed
}

fn walk_decoded(raw: &mut Bytes, v: &mut impl Visitor, calls_only: bool) -> bool {
    // Checked when the model was decoded: a node that does not decode is not reached.
    let Ok(mut n) = node::decode(raw) else { return false };
    let changed = if calls_only { walk_function_calls(std::slice::from_mut(&mut n), v) } else { walk_node(&mut n, v) };
    if changed {
        *raw = node::encode(&n);
    }
    changed
}

enum Plain {
    Unchanged,
    /// The renamed node was appended to the buffer.
    Renamed,
    /// Not a plain node: it is walked decoded (names seen so far may be seen again).
    No,
}

/// Appends to `out` a plain node's bytes with its names replaced, in one pass over its
/// fields, if any name is replaced; `out` is left as it was otherwise. Fields other than the
/// names are copied as they are.
fn rename_plain(raw: &[u8], v: &mut impl Visitor, calls_only: bool, out: &mut Vec<u8>, room: usize) -> Plain {
    let call = if v.renames_calls() { Some(node::call_of(raw)) } else { None };
    let start = out.len();
    let mut renamed = false;
    // An empty name goes before the first field after NAME (fields are in tag order as
    // protobuf writes them; anywhere would parse the same).
    let mut unnamed = !calls_only && v.name_unnamed() && !node::fields(raw).flatten().any(|f| f.tag == node::NAME);
    let give_up = |out: &mut Vec<u8>| {
        out.truncate(start);
        Plain::No
    };
    for f in node::fields(raw) {
        let Ok(f) = f else { return give_up(out) };
        if !node::is_plain_field(&f) {
            return give_up(out);
        }
        if unnamed && f.tag > node::NAME {
            unnamed = false;
            if !renamed {
                if out.capacity() == 0 {
                    out.reserve(room);
                }
                let at = f.raw.as_ptr() as usize - raw.as_ptr() as usize;
                out.extend_from_slice(&raw[..at]);
                renamed = true;
            }
            node::write_string(node::NAME, "", out);
        }
        let new = match (f.tag, f.text()) {
            (node::INPUT | node::OUTPUT, Some(s)) if !calls_only && !s.is_empty() => v.value(s),
            (node::NAME, Some(s)) if !calls_only && !s.is_empty() => v.node_name(s),
            (node::OP_TYPE, Some(s)) => match call {
                Some((domain, overload)) => v.op_type(domain, overload, s),
                None => None,
            },
            (node::INPUT | node::OUTPUT | node::NAME | node::OP_TYPE, None) => return give_up(out),
            _ => None,
        };
        match (new, renamed) {
            (Some(new), true) => node::write_string(f.tag, new, out),
            (Some(new), false) => {
                if out.capacity() == 0 {
                    out.reserve(room);
                }
                let at = f.raw.as_ptr() as usize - raw.as_ptr() as usize;
                out.extend_from_slice(&raw[..at]);
                node::write_string(f.tag, new, out);
                renamed = true;
            }
            (None, true) => out.extend_from_slice(f.raw),
            (None, false) => {}
        }
    }
    if unnamed {
        // Only inputs and outputs (or nothing): the name goes last.
        if !renamed {
            out.extend_from_slice(raw);
            renamed = true;
        }
        node::write_string(node::NAME, "", out);
    }
    if renamed {
        Plain::Renamed
    } else {
        Plain::Unchanged
    }
}

fn walk_node(node: &mut NodeProto, v: &mut impl Visitor) -> bool {
    let mut changed = false;
    for n in node.input.iter_mut().chain(node.output.iter_mut()) {
        changed |= value(n, v);
    }
    match node.name.as_mut() {
        Some(n) if !n.is_empty() => changed |= set(n, v.node_name(n)),
        Some(_) => {}
        None if v.name_unnamed() => {
            node.name = Some(String::new());
            changed = true;
        }
        None => {}
    }
    changed |= visit_op_type(node, v);
    for dc in &mut node.device_configurations {
        for s in &mut dc.sharding_spec {
            changed |= opt_value(&mut s.tensor_name, v);
        }
    }
    if node.attribute.iter().any(|a| a.g.is_some() || !a.graphs.is_empty()) {
        let owner = node.name.clone().filter(|n| !n.is_empty()).or_else(|| node.op_type.clone()).unwrap_or_default();
        for a in &mut node.attribute {
            for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                v.enter_subgraph(&owner, g);
                changed |= walk_graph(g, v);
                v.leave_subgraph();
            }
        }
    }
    changed
}

fn visit_op_type(node: &mut NodeProto, v: &mut impl Visitor) -> bool {
    if !v.renames_calls() {
        return false;
    }
    let Some(op) = node.op_type.as_mut() else { return false };
    set(op, v.op_type(node.domain.as_deref().unwrap_or(""), node.overload.as_deref().unwrap_or(""), op))
}

/// Inside a function body only the calls are visited: its value names are local.
fn walk_function_calls(nodes: &mut [NodeProto], v: &mut impl Visitor) -> bool {
    let mut changed = false;
    for node in nodes {
        changed |= visit_op_type(node, v);
        for a in &mut node.attribute {
            for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                changed |= walk_raw_nodes(&mut g.node, v, true);
            }
        }
    }
    changed
}

/// Gives the top-level nodes of `g` that have no name the names `given`, in order (see
/// `final_names::name_unnamed_nodes`); the nodes are rewritten into one buffer.
pub fn name_unnamed(g: &mut GraphProto, given: &[String]) {
    if given.is_empty() {
        return;
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(given.len());
    let mut names = given.iter();
    for (i, raw) in g.node.iter().enumerate() {
        if !node::head_bytes(raw).0.is_empty() {
            continue;
        }
        let Some(name) = names.next() else { break };
        spans.push((i, buf.len()));
        node::write_named(raw, name, &mut buf);
    }
    let shared = Bytes::from(buf);
    let ends = spans.iter().skip(1).map(|&(_, start)| start).chain([shared.len()]);
    for (&(i, start), end) in spans.iter().zip(ends) {
        g.node[i] = shared.slice(start..end);
    }
}

/// `f` encoded with its calls renamed by `functions` (its own name left as it is): what
/// decides whether two local functions are the same.
pub fn function_body(f: &FunctionProto, functions: &FxHashMap<FunctionKey, String>) -> Vec<u8> {
    use prost::Message;
    if functions.is_empty() {
        return f.encode_to_vec();
    }
    let mut f = f.clone();
    let mut calls = Renamer { functions: functions.clone(), ..Default::default() };
    walk_function_calls(&mut f.node, &mut calls);
    f.encode_to_vec()
}

pub fn function_key(f: &FunctionProto) -> FunctionKey {
    (f.domain.clone().unwrap_or_default(), f.name.clone().unwrap_or_default(), f.overload.clone().unwrap_or_default())
}

/// Every value and node name of a model, each once, the text kept in an arena (one
/// allocation per few thousand names instead of one per name). FxHash has no random seed,
/// so the iteration order, and with it every generated name, is the same from run to run.
#[derive(Default)]
pub struct NameSet<'a> {
    pub values: FxHashSet<&'a str>,
    pub nodes: FxHashSet<&'a str>,
    /// The values and node names found only inside subgraphs (If/Loop/Scan bodies): two
    /// models' bodies are never nested in one another, so such names of two models never
    /// clash with each other, only with the other model's top-level names.
    pub nested_values: FxHashSet<&'a str>,
    pub nested_nodes: FxHashSet<&'a str>,
}

impl<'a> NameSet<'a> {
    pub fn of(model: &mut ModelProto, arena: &'a Bump) -> NameSet<'a> {
        // Sized up front: growing the tables was a visible share of a node-heavy merge.
        let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
        let set = NameSet {
            values: FxHashSet::with_capacity_and_hasher(2 * nodes + 8, Default::default()),
            nodes: FxHashSet::with_capacity_and_hasher(nodes + 8, Default::default()),
            ..Default::default()
        };
        let mut collect = Collect { set, arena, depth: 0 };
        walk_model(model, &mut collect);
        let mut set = collect.set;
        // Seen in a body first, then at the top: not nested only.
        set.nested_values.retain(|n| !set.values.contains(n));
        set.nested_nodes.retain(|n| !set.nodes.contains(n));
        set.values.extend(set.nested_values.iter().copied());
        set.nodes.extend(set.nested_nodes.iter().copied());
        set
    }

    /// Whether the top-level graph (or a training graph) has this value name.
    pub fn has_top_value(&self, name: &str) -> bool {
        self.values.contains(name) && !self.nested_values.contains(name)
    }
}

struct Collect<'a> {
    set: NameSet<'a>,
    arena: &'a Bump,
    /// How deep in subgraphs the walk is: names at depth 0 are top-level.
    depth: usize,
}

fn collect<'a>(set: &mut FxHashSet<&'a str>, name: &str, arena: &'a Bump) {
    if !set.contains(name) {
        set.insert(arena.alloc_str(name));
    }
}

impl Visitor for Collect<'_> {
    fn value(&mut self, name: &str) -> Option<&str> {
        let set = if self.depth == 0 { &mut self.set.values } else { &mut self.set.nested_values };
        collect(set, name, self.arena);
        None
    }
    fn node_name(&mut self, name: &str) -> Option<&str> {
        let set = if self.depth == 0 { &mut self.set.nodes } else { &mut self.set.nested_nodes };
        collect(set, name, self.arena);
        None
    }
    fn enter_subgraph(&mut self, _owner: &str, _g: &GraphProto) {
        self.depth += 1;
    }
    fn leave_subgraph(&mut self) {
        self.depth -= 1;
    }
}

/// Applies one model's maps. Names absent from a map are left as they are. Keys and new
/// names are borrowed (from the name sets and the fresh-name arenas): nothing is allocated.
#[derive(Default, Clone)]
pub struct Renamer<'a> {
    pub values: FxHashMap<&'a str, &'a str>,
    pub nodes: FxHashMap<&'a str, &'a str>,
    pub functions: FxHashMap<FunctionKey, String>,
    /// onnx.compose's `add_prefix` only: unnamed nodes get an empty name (see
    /// [`Visitor::name_unnamed`]); fastseq's own compositions never set it.
    pub name_unnamed: bool,
}

impl Renamer<'_> {
    pub fn is_identity(&self) -> bool {
        self.values.is_empty() && self.nodes.is_empty() && self.functions.is_empty() && !self.name_unnamed
    }
}

impl Visitor for Renamer<'_> {
    fn value(&mut self, name: &str) -> Option<&str> {
        self.values.get(name).copied()
    }
    fn node_name(&mut self, name: &str) -> Option<&str> {
        self.nodes.get(name).copied()
    }
    fn renames_calls(&self) -> bool {
        !self.functions.is_empty()
    }
    fn name_unnamed(&self) -> bool {
        self.name_unnamed
    }
    fn op_type(&mut self, domain: &str, overload: &str, op_type: &str) -> Option<&str> {
        let key = (domain.to_string(), op_type.to_string(), overload.to_string());
        self.functions.get(&key).map(String::as_str)
    }
    fn function(&mut self, f: &mut FunctionProto) {
        if let Some(new) = self.functions.get(&function_key(f)) {
            f.name = Some(new.clone());
        }
    }
}

/// The names a graph itself defines, in order, each once: its inputs, initializers, sparse
/// initializers and node outputs (not what its subgraphs define).
fn defined(g: &GraphProto) -> Vec<&str> {
    let mut seen = FxHashSet::default();
    let inputs = g.input.iter().filter_map(|v| v.name.as_deref());
    let weights = g.initializer.iter().filter_map(|t| t.name.as_deref());
    let sparse = g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()?.name.as_deref());
    let outputs = g.node.iter().flat_map(|raw| {
        node::fields(raw).filter_map(|f| f.ok()).filter(|f| f.tag == node::OUTPUT).filter_map(|f| f.text())
    });
    inputs.chain(weights).chain(sparse).chain(outputs).filter(|n| !n.is_empty() && seen.insert(*n)).collect()
}

/// Renames values of `model` as `mapping` says (old -> new): every reference in every
/// scope, except inside a subgraph that defines the old name itself (its own value, which
/// shadows the outer one, keeps its name). Names the model does not have are ignored.
/// Refused, with the model left as it was: a new name that a value of the graph already
/// has (unless that one is renamed too: swaps are fine), two names renamed onto one, and a
/// new name that a subgraph defines itself while the old one may be read inside it.
pub fn rename_values(model: &mut ModelProto, mapping: &[(String, String)]) -> crate::error::Result<()> {
    use crate::error::Error;
    let map: FxHashMap<String, String> = mapping.iter().filter(|(a, b)| a != b).cloned().collect();
    let Some(g) = model.graph.as_ref() else { return Ok(()) };
    if map.is_empty() {
        return Ok(());
    }
    let mut by_new: FxHashMap<&str, &str> = FxHashMap::default();
    for old in defined(g) {
        let new = map.get(old).map_or(old, String::as_str);
        if let Some(&other) = by_new.get(new) {
            // Whichever of the two is renamed (the other keeps `new`, or is renamed too).
            let (renamed, kept) = if map.contains_key(old) { (old, other) } else { (other, old) };
            return Err(Error::composition(if map.contains_key(kept) {
                format!("renaming '{renamed}' to '{new}' clashes with '{kept}', which is also renamed to '{new}'")
            } else {
                format!("renaming '{renamed}' to '{new}' clashes with the existing '{new}'")
            }));
        }
        by_new.insert(new, old);
    }
    let mut r = Scoped { maps: vec![map], error: None };
    let mut copy = model.clone();
    walk_model(&mut copy, &mut r);
    match r.error {
        Some(e) => Err(e),
        None => {
            *model = copy;
            Ok(())
        }
    }
}

/// A map per scope: a subgraph drops the names it defines itself.
struct Scoped {
    maps: Vec<FxHashMap<String, String>>,
    error: Option<crate::error::Error>,
}

impl Visitor for Scoped {
    fn value(&mut self, name: &str) -> Option<&str> {
        self.maps.last()?.get(name).map(String::as_str)
    }
    fn enter_subgraph(&mut self, owner: &str, g: &GraphProto) {
        let local: FxHashSet<&str> = defined(g).into_iter().collect();
        let mut inner = self.maps.last().cloned().unwrap_or_default();
        inner.retain(|old, _| !local.contains(old.as_str()));
        let mut hidden: Vec<(&String, &String)> =
            inner.iter().filter(|(_, new)| local.contains(new.as_str())).collect();
        hidden.sort();
        if let (Some((old, new)), None) = (hidden.first(), &self.error) {
            self.error = Some(crate::error::Error::composition(format!(
                "'{old}' cannot become '{new}': the subgraph '{}' of node '{owner}' defines '{new}' itself",
                g.name.as_deref().unwrap_or("")
            )));
        }
        self.maps.push(inner);
    }
    fn leave_subgraph(&mut self) {
        self.maps.pop();
    }
}

/// Fresh names for one model, all starting with its own prefix (`m3/`). Prefixes of
/// different models never make the same name, so only this model's earlier fresh names and
/// the original names of every model (`taken`) need avoiding.
pub struct FreshNames<'a> {
    prefix: String,
    arena: &'a Bump,
    /// The model's renames so far: original -> fresh.
    pub renamed: FxHashMap<&'a str, &'a str>,
    /// The fresh names that needed a numeric suffix (rare), to avoid them too.
    suffixed: FxHashSet<&'a str>,
    candidate: String,
}

impl<'a> FreshNames<'a> {
    pub fn new(prefix: String, arena: &'a Bump, capacity: usize) -> Self {
        FreshNames {
            prefix,
            arena,
            renamed: FxHashMap::with_capacity_and_hasher(capacity, Default::default()),
            suffixed: FxHashSet::default(),
            candidate: String::new(),
        }
    }

    /// Renames `name` (not renamed before) to a fresh name that no `taken` name and no
    /// earlier fresh name has.
    pub fn rename(&mut self, name: &'a str, taken: impl Fn(&str) -> bool) {
        let p = self.prefix.len();
        let free = |c: &str, renamed: &FxHashMap<&str, &str>, suffixed: &FxHashSet<&str>| {
            // c == prefix + m is an earlier fresh name iff m was renamed to exactly c.
            !taken(c) && !suffixed.contains(c) && renamed.get(&c[p..]).is_none_or(|v| *v != c)
        };
        let candidate = &mut self.candidate;
        candidate.clear();
        candidate.push_str(&self.prefix);
        candidate.push_str(name);
        let mut suffixed = false;
        // prefix + name is an earlier unsuffixed fresh name only if `name` was renamed before,
        // which never happens: each name is renamed once. So the common case costs one lookup.
        let plain_free = !taken(candidate) && !self.suffixed.contains(candidate.as_str());
        if !plain_free {
            suffixed = true;
            let mut k = 1;
            loop {
                candidate.truncate(p + name.len());
                candidate.push_str(&format!("_{k}"));
                if free(candidate, &self.renamed, &self.suffixed) {
                    break;
                }
                k += 1;
            }
        }
        let fresh: &'a str = self.arena.alloc_str(candidate);
        if suffixed {
            self.suffixed.insert(fresh);
        }
        self.renamed.insert(name, fresh);
    }
}

/// A fresh name `prefix + base` (then `_1`, `_2`, ...) for which `free` holds.
pub fn fresh(prefix: &str, base: &str, free: impl Fn(&str) -> bool) -> String {
    let mut candidate = format!("{prefix}{base}");
    let mut k = 1;
    while !free(&candidate) {
        candidate = format!("{prefix}{base}_{k}");
        k += 1;
    }
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::testing::{node, scale, vi};

    fn if_reading(outer: &str, local: &str) -> ModelProto {
        use crate::codec::proto::{attribute_proto::AttributeType, AttributeProto};
        let mut m = scale(1);
        let body = GraphProto {
            name: Some("body".into()),
            node: vec![node("Neg", &[outer], &[local]), node("Abs", &[local], &["out"])],
            output: vec![vi("out", 1, &[2, 4])],
            ..Default::default()
        };
        m.graph.as_mut().unwrap().node.push(node::encode(&NodeProto {
            name: Some("cond".into()),
            attribute: vec![AttributeProto {
                name: Some("then_branch".into()),
                r#type: Some(AttributeType::Graph as i32),
                g: Some(body),
                ..Default::default()
            }],
            ..crate::merge::testing::node_proto("If", &["b"], &["z"])
        }));
        m
    }

    fn body_nodes(m: &ModelProto) -> Vec<NodeProto> {
        let n = node::decode(m.graph.as_ref().unwrap().node.last().unwrap()).unwrap();
        n.attribute[0].g.as_ref().unwrap().node.iter().map(|raw| node::decode(raw).unwrap()).collect()
    }

    #[test]
    fn rename_values_follows_outer_reads_and_leaves_a_bodys_own_names() {
        let mut m = if_reading("c", "t");
        rename_values(&mut m, &[("c".into(), "weights".into()), ("t".into(), "total".into())]).unwrap();
        let body = body_nodes(&m);
        assert_eq!((body[0].input.clone(), body[0].output.clone()), (vec!["weights".into()], vec!["t".into()]));
        assert_eq!(node::decode(&m.graph.as_ref().unwrap().node[0]).unwrap().output, ["total"]);
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let err = rename_values(&mut scale(1), &pairs(&[("x", "t")])).unwrap_err();
        assert_eq!(err.message, "renaming 'x' to 't' clashes with the existing 't'");
        let err = rename_values(&mut scale(1), &pairs(&[("x", "w"), ("c", "w")])).unwrap_err();
        assert!(err.message.ends_with("which is also renamed to 'w'"), "{}", err.message);
        let mut hidden = if_reading("c", "local");
        let err = rename_values(&mut hidden, &pairs(&[("c", "local")])).unwrap_err();
        assert_eq!(err.message, "'c' cannot become 'local': the subgraph 'body' of node 'cond' defines 'local' itself");
        assert_eq!(hidden, if_reading("c", "local"), "left as it was");
    }

    #[test]
    fn names_only_bodies_have_are_set_apart() {
        let mut m = if_reading("c", "local");
        let arena = Bump::new();
        let names = NameSet::of(&mut m, &arena);
        assert!(names.nested_values.contains("local") && names.nested_values.contains("out"));
        assert!(!names.nested_values.contains("c") && names.has_top_value("c"));
    }

    #[test]
    fn fresh_names_never_collide_with_originals_or_each_other() {
        // Another model really has a tensor called "m1/x".
        let taken = ["m1/x", "x", "x_1"];
        let arena = Bump::new();
        let mut f = FreshNames::new("m1/".into(), &arena, 0);
        f.rename("x", |c| taken.contains(&c));
        f.rename("x_1", |c| taken.contains(&c));
        assert_eq!(f.renamed["x"], "m1/x_1");
        assert_eq!(f.renamed["x_1"], "m1/x_1_1");
        // In the other order, the plain name is taken by the earlier fresh one.
        let mut g = FreshNames::new("m1/".into(), &arena, 0);
        g.rename("x_1", |c| taken.contains(&c));
        g.rename("x", |c| taken.contains(&c));
        assert_eq!(g.renamed["x_1"], "m1/x_1");
        assert_eq!(g.renamed["x"], "m1/x_2");
    }

    #[test]
    fn fresh_skips_taken_names() {
        let taken = ["m1/x", "m1/x_1"];
        assert_eq!(fresh("m1/", "x", |c| !taken.contains(&c)), "m1/x_2");
    }
}
