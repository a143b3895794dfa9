//! The naming rules of `onnx.checker` that a merge can break, checked on a decoded model:
//! every name defined once in its graph and the graphs around it (single static
//! assignment), every node input defined before the node (topological order), every graph
//! output defined, graph inputs and initializers unique and named.
//!
//! Renaming and merging change names and order, never operators, types or tensors: a
//! model built from models that pass the checker passes it too if it passes these (what a
//! merge can still break otherwise, differing IR versions or the types across a joint, the
//! merge reports itself). One pass over the names; nodes stay bytes except those that hold
//! subgraphs.
use bumpalo::Bump;
use rustc_hash::FxHashSet;

use crate::codec::graph::vi_name;
use crate::codec::node;
use crate::codec::proto::{GraphProto, ModelProto};

/// The first naming rule `model`'s graph breaks, as onnx.checker would word it, or `None`.
/// At IR < 4 initializers may also be listed as inputs (that is how such models declare
/// them); from IR 4 on they may too (an input with a default value).
pub fn naming_problem(model: &ModelProto) -> Option<String> {
    let g = model.graph.as_ref()?;
    // Names are copied into one arena (a bump per name, no allocation each).
    let arena = Bump::new();
    let mut scopes: Vec<FxHashSet<&str>> = Vec::new();
    graph_problem(g, &mut scopes, 0, &arena)
}

fn defined_outside(scopes: &[FxHashSet<&str>], name: &str) -> bool {
    scopes.iter().any(|s| s.contains(name))
}

fn graph_problem<'b>(
    g: &GraphProto,
    scopes: &mut Vec<FxHashSet<&'b str>>,
    depth: usize,
    arena: &'b Bump,
) -> Option<String> {
    if depth > node::MAX_NESTING {
        return Some(format!("subgraphs nested more than {} deep", node::MAX_NESTING));
    }
    let gname = g.name.as_deref().unwrap_or("");
    let mut here: FxHashSet<&'b str> =
        FxHashSet::with_capacity_and_hasher(g.input.len() + g.initializer.len() + g.node.len() + 8, Default::default());
    let define =
        |name: &str, here: &mut FxHashSet<&'b str>, scopes: &[FxHashSet<&'b str>], what: &str| -> Option<String> {
            if name.is_empty() {
                return None;
            }
            if here.contains(name) || defined_outside(scopes, name) {
                return Some(format!(
                    "Graph must be in single static assignment (SSA) form, however '{name}' has been used as {what} \
                 names multiple times (graph '{gname}')"
                ));
            }
            here.insert(arena.alloc_str(name));
            None
        };
    for vi in &g.input {
        let name = vi_name(vi);
        if name.is_empty() && depth == 0 {
            return Some(format!("a graph input of '{gname}' has no name"));
        }
        if let Some(p) = define(name, &mut here, scopes, "graph input") {
            return Some(p);
        }
    }
    let inputs: FxHashSet<&str> = g.input.iter().map(vi_name).collect();
    let mut weights: FxHashSet<&str> = FxHashSet::default();
    let sparse = g.sparse_initializer.iter().filter_map(|s| s.values.as_ref());
    for t in g.initializer.iter().chain(sparse) {
        let name = t.name.as_deref().unwrap_or("");
        if name.is_empty() {
            return Some(format!("an initializer of '{gname}' has no name"));
        }
        if !weights.insert(name) {
            return Some(format!("'{name}' initializer name is not unique (graph '{gname}')"));
        }
        if !inputs.contains(name) {
            if let Some(p) = define(name, &mut here, scopes, "initializer") {
                return Some(p);
            }
        }
    }
    for (k, raw) in g.node.iter().enumerate() {
        if node::is_plain(raw) {
            for f in node::fields(raw).flatten() {
                let Some(name) = f.text() else { continue };
                if f.tag == node::INPUT && !name.is_empty() && !here.contains(name) && !defined_outside(scopes, name) {
                    return Some(read_before_defined(name, k, gname));
                }
            }
            for f in node::fields(raw).flatten() {
                if f.tag == node::OUTPUT {
                    if let Some(p) = define(f.text().unwrap_or(""), &mut here, scopes, "output") {
                        return Some(p);
                    }
                }
            }
            continue;
        }
        // Holds subgraphs (or is unusual): decoded. Its inputs are read before its
        // subgraphs run; the subgraphs see every name defined so far, outer ones included.
        let Ok(n) = node::decode(raw) else { return Some(format!("node {k} of graph '{gname}' does not decode")) };
        for name in n.input.iter().filter(|s| !s.is_empty()) {
            if !here.contains(name.as_str()) && !defined_outside(scopes, name) {
                return Some(read_before_defined(name, k, gname));
            }
        }
        scopes.push(std::mem::take(&mut here));
        for sub in node::subgraphs(&n) {
            if let Some(p) = graph_problem(sub, scopes, depth + 1, arena) {
                return Some(p);
            }
        }
        here = scopes.pop().unwrap_or_default();
        for name in &n.output {
            if let Some(p) = define(name, &mut here, scopes, "output") {
                return Some(p);
            }
        }
    }
    for vi in &g.output {
        let name = vi_name(vi);
        if !here.contains(name) && !defined_outside(scopes, name) {
            return Some(format!("Graph output '{name}' is not an output of any node in graph '{gname}'"));
        }
    }
    None
}

fn read_before_defined(name: &str, k: usize, gname: &str) -> String {
    format!(
        "Nodes in a graph must be topologically sorted, however input '{name}' of node {k} of graph '{gname}' is \
         not an output of a node before it, an input or an initializer"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto, ValueInfoProto};

    fn vi(name: &str) -> ValueInfoProto {
        ValueInfoProto { name: Some(name.into()), ..Default::default() }
    }

    fn n(op: &str, ins: &[&str], outs: &[&str]) -> bytes::Bytes {
        node::encode(&NodeProto {
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            op_type: Some(op.into()),
            ..Default::default()
        })
    }

    fn model(nodes: Vec<bytes::Bytes>, ins: &[&str], outs: &[&str], inits: &[&str]) -> ModelProto {
        let g = GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: ins.iter().map(|s| vi(s)).collect(),
            output: outs.iter().map(|s| vi(s)).collect(),
            initializer: inits
                .iter()
                .map(|s| TensorProto { name: Some(s.to_string()), ..Default::default() })
                .collect(),
            ..Default::default()
        };
        ModelProto { ir_version: Some(8), graph: Some(g), ..Default::default() }
    }

    #[test]
    fn a_valid_graph_has_no_problem() {
        let m = model(vec![n("Add", &["x", "w"], &["t"]), n("Relu", &["t"], &["y"])], &["x"], &["y"], &["w"]);
        assert_eq!(naming_problem(&m), None);
        // An output that is an input, an initializer also listed as input, optional inputs.
        let m = model(vec![n("Clip", &["x", "", "w"], &["y"])], &["x", "w"], &["y", "x"], &["w"]);
        assert_eq!(naming_problem(&m), None);
    }

    #[test]
    fn what_a_merge_can_break_is_found() {
        let twice = model(vec![n("Relu", &["x"], &["y"]), n("Neg", &["x"], &["y"])], &["x"], &["y"], &[]);
        assert!(naming_problem(&twice).unwrap().contains("'y' has been used as output names multiple times"));
        let inputs = model(vec![n("Relu", &["x"], &["y"])], &["x", "x"], &["y"], &[]);
        assert!(naming_problem(&inputs).unwrap().contains("'x' has been used as graph input names"));
        let weights = model(vec![n("Relu", &["w"], &["y"])], &[], &["y"], &["w", "w"]);
        assert!(naming_problem(&weights).unwrap().contains("'w' initializer name is not unique"));
        let order = model(vec![n("Relu", &["t"], &["y"]), n("Neg", &["x"], &["t"])], &["x"], &["y"], &[]);
        assert!(naming_problem(&order).unwrap().contains("input 't' of node 0"));
        let dangling = model(vec![n("Relu", &["x"], &["y"])], &["x"], &["z"], &[]);
        assert!(naming_problem(&dangling).unwrap().contains("Graph output 'z'"));
        let overwrite = model(vec![n("Unsqueeze", &["x", "w"], &["x"])], &["x"], &["x"], &["w"]);
        assert!(naming_problem(&overwrite).unwrap().contains("'x' has been used as output names"));
    }

    #[test]
    fn subgraphs_read_outer_names_and_may_not_redefine_them() {
        let body = |out: &str| GraphProto {
            name: Some("body".into()),
            node: vec![n("Neg", &["t"], &[out])],
            output: vec![vi(out)],
            ..Default::default()
        };
        let if_node = |out: &str| {
            node::encode(&NodeProto {
                input: vec!["c".into()],
                output: vec!["y".into()],
                op_type: Some("If".into()),
                attribute: vec![AttributeProto {
                    name: Some("then_branch".into()),
                    r#type: Some(AttributeType::Graph as i32),
                    g: Some(body(out)),
                    ..Default::default()
                }],
                ..Default::default()
            })
        };
        let ok = model(vec![n("Relu", &["x"], &["t"]), if_node("bo")], &["x", "c"], &["y"], &[]);
        assert_eq!(naming_problem(&ok), None);
        let shadow = model(vec![n("Relu", &["x"], &["t"]), if_node("x")], &["x", "c"], &["y"], &[]);
        assert!(naming_problem(&shadow).unwrap().contains("'x' has been used as output names"));
        let early = model(vec![if_node("bo"), n("Relu", &["x"], &["t"])], &["x", "c"], &["y"], &[]);
        assert!(naming_problem(&early).unwrap().contains("input 't'"));
    }
}
