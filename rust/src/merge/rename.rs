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
        if let Some(values) = s.values.as_mut() {
            changed |= opt_value(&mut values.name, v);
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
    let give_up = |out: &mut Vec<u8>| {
        out.truncate(start);
        Plain::No
    };
    for f in node::fields(raw) {
        let Ok(f) = f else { return give_up(out) };
        if !node::is_plain_field(&f) {
            return give_up(out);
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
    if let Some(n) = node.name.as_mut() {
        if !n.is_empty() {
            changed |= set(n, v.node_name(n));
        }
    }
    changed |= visit_op_type(node, v);
    for dc in &mut node.device_configurations {
        for s in &mut dc.sharding_spec {
            changed |= opt_value(&mut s.tensor_name, v);
        }
    }
    for a in &mut node.attribute {
        if let Some(g) = a.g.as_mut() {
            changed |= walk_graph(g, v);
        }
        for g in &mut a.graphs {
            changed |= walk_graph(g, v);
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
}

impl<'a> NameSet<'a> {
    pub fn of(model: &mut ModelProto, arena: &'a Bump) -> NameSet<'a> {
        // Sized up front: growing the tables was a visible share of a node-heavy merge.
        let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
        let set = NameSet {
            values: FxHashSet::with_capacity_and_hasher(2 * nodes + 8, Default::default()),
            nodes: FxHashSet::with_capacity_and_hasher(nodes + 8, Default::default()),
        };
        let mut collect = Collect { set, arena };
        walk_model(model, &mut collect);
        collect.set
    }
}

struct Collect<'a> {
    set: NameSet<'a>,
    arena: &'a Bump,
}

impl Visitor for Collect<'_> {
    fn value(&mut self, name: &str) -> Option<&str> {
        if !self.set.values.contains(name) {
            self.set.values.insert(self.arena.alloc_str(name));
        }
        None
    }
    fn node_name(&mut self, name: &str) -> Option<&str> {
        if !self.set.nodes.contains(name) {
            self.set.nodes.insert(self.arena.alloc_str(name));
        }
        None
    }
}

/// Applies one model's maps. Names absent from a map are left as they are. Keys and new
/// names are borrowed (from the name sets and the fresh-name arenas): nothing is allocated.
#[derive(Default, Clone)]
pub struct Renamer<'a> {
    pub values: FxHashMap<&'a str, &'a str>,
    pub nodes: FxHashMap<&'a str, &'a str>,
    pub functions: FxHashMap<FunctionKey, String>,
}

impl Renamer<'_> {
    pub fn is_identity(&self) -> bool {
        self.values.is_empty() && self.nodes.is_empty() && self.functions.is_empty()
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
