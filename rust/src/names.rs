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
use rustc_hash::{FxHashMap, FxHashSet};

use crate::proto::{FunctionProto, GraphProto, ModelProto, NodeProto};

/// A function is identified by (domain, name, overload).
pub type FunctionKey = (String, String, String);

pub trait Visitor {
    /// A value (tensor) name. Never called for empty names (absent optional inputs).
    fn value(&mut self, name: &mut String);
    /// A node name. Never called for empty names.
    fn node_name(&mut self, _name: &mut String) {}
    /// A node's op_type, which names a local function when its domain has one.
    fn op_type(&mut self, _domain: &str, _overload: &str, _op_type: &mut String) {}
    /// The name of a local function.
    fn function(&mut self, _f: &mut FunctionProto) {}
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
        walk_function_calls(&mut f.node, v);
    }
}

fn opt_value(name: &mut Option<String>, v: &mut impl Visitor) {
    if let Some(n) = name.as_mut() {
        if !n.is_empty() {
            v.value(n);
        }
    }
}

fn value(name: &mut String, v: &mut impl Visitor) {
    if !name.is_empty() {
        v.value(name);
    }
}

pub fn walk_graph(g: &mut GraphProto, v: &mut impl Visitor) {
    for vi in g.input.iter_mut().chain(g.output.iter_mut()).chain(g.value_info.iter_mut()) {
        opt_value(&mut vi.name, v);
    }
    for t in &mut g.initializer {
        opt_value(&mut t.name, v);
    }
    for s in &mut g.sparse_initializer {
        if let Some(values) = s.values.as_mut() {
            opt_value(&mut values.name, v);
        }
    }
    for a in &mut g.quantization_annotation {
        opt_value(&mut a.tensor_name, v);
        for p in &mut a.quant_parameter_tensor_names {
            opt_value(&mut p.value, v);
        }
    }
    for node in &mut g.node {
        walk_node(node, v);
    }
}

fn walk_node(node: &mut NodeProto, v: &mut impl Visitor) {
    for n in node.input.iter_mut().chain(node.output.iter_mut()) {
        value(n, v);
    }
    if let Some(n) = node.name.as_mut() {
        if !n.is_empty() {
            v.node_name(n);
        }
    }
    visit_op_type(node, v);
    for dc in &mut node.device_configurations {
        for s in &mut dc.sharding_spec {
            opt_value(&mut s.tensor_name, v);
        }
    }
    for a in &mut node.attribute {
        if let Some(g) = a.g.as_mut() {
            walk_graph(g, v);
        }
        for g in &mut a.graphs {
            walk_graph(g, v);
        }
    }
}

fn visit_op_type(node: &mut NodeProto, v: &mut impl Visitor) {
    if let Some(op) = node.op_type.as_mut() {
        v.op_type(node.domain.as_deref().unwrap_or(""), node.overload.as_deref().unwrap_or(""), op);
    }
}

/// Inside a function body only the calls are visited: its value names are local.
fn walk_function_calls(nodes: &mut [NodeProto], v: &mut impl Visitor) {
    for node in nodes {
        visit_op_type(node, v);
        for a in &mut node.attribute {
            if let Some(g) = a.g.as_mut() {
                walk_function_calls(&mut g.node, v);
            }
            for g in &mut a.graphs {
                walk_function_calls(&mut g.node, v);
            }
        }
    }
}

pub fn function_key(f: &FunctionProto) -> FunctionKey {
    (f.domain.clone().unwrap_or_default(), f.name.clone().unwrap_or_default(), f.overload.clone().unwrap_or_default())
}

/// Every value and node name of a model, each once. (FxHash has no random seed, so the
/// iteration order, and with it every generated name, is the same from run to run.)
#[derive(Default)]
pub struct NameSet {
    pub values: FxHashSet<String>,
    pub nodes: FxHashSet<String>,
}

impl NameSet {
    pub fn of(model: &mut ModelProto) -> NameSet {
        // Sized up front: growing the tables was a visible share of a node-heavy merge.
        let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
        let mut set = NameSet {
            values: FxHashSet::with_capacity_and_hasher(2 * nodes + 8, Default::default()),
            nodes: FxHashSet::with_capacity_and_hasher(nodes + 8, Default::default()),
        };
        walk_model(model, &mut set);
        set
    }
}

impl Visitor for NameSet {
    fn value(&mut self, name: &mut String) {
        if !self.values.contains(name.as_str()) {
            self.values.insert(name.clone());
        }
    }
    fn node_name(&mut self, name: &mut String) {
        if !self.nodes.contains(name.as_str()) {
            self.nodes.insert(name.clone());
        }
    }
}

/// Applies one model's maps. Names absent from a map are left as they are. The keys are
/// borrowed from the name tables, so only the new names are allocated.
#[derive(Default, Clone)]
pub struct Renamer<'a> {
    pub values: FxHashMap<&'a str, String>,
    pub nodes: FxHashMap<&'a str, String>,
    pub functions: FxHashMap<FunctionKey, String>,
}

impl Renamer<'_> {
    pub fn is_identity(&self) -> bool {
        self.values.is_empty() && self.nodes.is_empty() && self.functions.is_empty()
    }
}

impl Visitor for Renamer<'_> {
    fn value(&mut self, name: &mut String) {
        if let Some(new) = self.values.get(name.as_str()) {
            name.clone_from(new);
        }
    }
    fn node_name(&mut self, name: &mut String) {
        if let Some(new) = self.nodes.get(name.as_str()) {
            name.clone_from(new);
        }
    }
    fn op_type(&mut self, domain: &str, overload: &str, op_type: &mut String) {
        if self.functions.is_empty() {
            return;
        }
        let key = (domain.to_string(), op_type.clone(), overload.to_string());
        if let Some(new) = self.functions.get(&key) {
            op_type.clone_from(new);
        }
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
    /// The model's renames so far: original -> fresh.
    pub renamed: FxHashMap<&'a str, String>,
    /// The fresh names that needed a numeric suffix (rare), to avoid them too.
    suffixed: FxHashSet<String>,
}

impl<'a> FreshNames<'a> {
    pub fn new(prefix: String) -> Self {
        FreshNames { prefix, renamed: FxHashMap::default(), suffixed: FxHashSet::default() }
    }

    /// Renames `name` to a fresh name that no `taken` name and no earlier fresh name has.
    pub fn rename(&mut self, name: &'a str, taken: impl Fn(&str) -> bool) {
        let p = self.prefix.len();
        let free = |c: &str, renamed: &FxHashMap<&str, String>, suffixed: &FxHashSet<String>| {
            // c == prefix + m is an earlier fresh name iff m was renamed to exactly c.
            !taken(c) && !suffixed.contains(c) && renamed.get(&c[p..]).is_none_or(|v| v != c)
        };
        let mut candidate = String::with_capacity(p + name.len());
        candidate.push_str(&self.prefix);
        candidate.push_str(name);
        if !free(&candidate, &self.renamed, &self.suffixed) {
            let mut k = 1;
            loop {
                candidate.truncate(p + name.len());
                candidate.push_str(&format!("_{k}"));
                if free(&candidate, &self.renamed, &self.suffixed) {
                    break;
                }
                k += 1;
            }
            self.suffixed.insert(candidate.clone());
        }
        self.renamed.insert(name, candidate);
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

/// Up to three names from `candidates` close to `name`, best first, for "did you mean".
pub fn near_misses<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let lower = name.to_lowercase();
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter_map(|c| {
            let cl = c.to_lowercase();
            let d = if cl == lower {
                0
            } else if !lower.is_empty() && (cl.contains(&lower) || lower.contains(&cl)) {
                1
            } else {
                edit_distance(&lower, &cl)
            };
            let limit = (name.chars().count().max(c.chars().count()) / 3).max(2);
            (d <= limit).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// " (did you mean 'a' or 'b'?)" or "", for error messages.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let near = near_misses(name, candidates);
    match near.as_slice() {
        [] => String::new(),
        [one] => format!(" (did you mean '{one}'?)"),
        many => {
            let quoted: Vec<String> = many.iter().map(|c| format!("'{c}'")).collect();
            format!(" (did you mean {}?)", quoted.join(" or "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_rank_close_names_first() {
        let c = ["logits", "probs", "hidden_state"];
        assert_eq!(near_misses("logit", c), vec!["logits"]);
        assert_eq!(near_misses("LOGITS", c), vec!["logits"]);
        assert!(near_misses("zzzzzzzz", c).is_empty());
        assert_eq!(did_you_mean("prob", c), " (did you mean 'probs'?)");
    }

    #[test]
    fn fresh_names_never_collide_with_originals_or_each_other() {
        // Another model really has a tensor called "m1/x".
        let taken = ["m1/x", "x", "x_1"];
        let mut f = FreshNames::new("m1/".into());
        f.rename("x", |c| taken.contains(&c));
        f.rename("x_1", |c| taken.contains(&c));
        assert_eq!(f.renamed["x"], "m1/x_1");
        assert_eq!(f.renamed["x_1"], "m1/x_1_1");
        // In the other order, the plain name is taken by the earlier fresh one.
        let mut g = FreshNames::new("m1/".into());
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
