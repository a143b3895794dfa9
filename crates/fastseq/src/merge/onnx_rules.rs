//! onnx.compose's rules, where they differ from fastseq's: what `merge_models` makes of two
//! models' fields ([`Frame`], [`merged_metadata`]), the value_info that `onnx.utils.Extractor`
//! keeps of a cut-down graph ([`extracted_value_info`]), which names `add_prefix` prefixes
//! ([`prefix_map`]), and `check_overlapping_names` ([`overlapping_names`]).
//!
//! The renaming itself is [`crate::merge::rename`]'s one walk, so where onnx.compose leaves a
//! model broken (a body reading an outer initializer, a quantization annotation, a call in a
//! subgraph) the result here stays valid.
use bumpalo::Bump;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::node;
use crate::codec::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, ValueInfoProto,
};
use crate::error::{Error, Result};
use crate::merge::options::Options;
use crate::merge::rename::{function_key, walk_model, NameSet, Renamer};

/// The fields `onnx.compose.merge_models` gives the merged model and graph, decided from the
/// two stages (after they were cut down) before they are merged.
pub struct Frame {
    graph_name: String,
    doc_string: String,
    opset_import: Vec<OperatorSetIdProto>,
    metadata: Vec<StringStringEntryProto>,
}

impl Frame {
    /// `models` are the two stages as `merge_graphs` sees them: a stage cut down by
    /// `inputs`/`outputs` is named "Extracted from {name}" and has no doc_string, as
    /// `onnx.utils.Extractor` leaves it. `labels` name the models in the metadata error.
    pub fn of(models: &[ModelProto], labels: &[String], opts: &Options) -> Result<Frame> {
        let (g1, g2) = (graph(&models[0]), graph(&models[1]));
        let (n1, n2) = (g1.name.as_deref().unwrap_or(""), g2.name.as_deref().unwrap_or(""));
        let doc = |g: &GraphProto| g.doc_string.clone().unwrap_or_default();
        Ok(Frame {
            graph_name: opts.graph_name.clone().unwrap_or_else(|| format!("{n1}_{n2}")),
            doc_string: opts.doc_string.clone().unwrap_or_else(|| {
                format!("Graph combining {n1} and {n2}\n{n1}\n\n{}\n\n{n2}\n\n{}", doc(g1), doc(g2))
            }),
            // Both lists as they are, repeated domains included (the checker and ONNX
            // Runtime accept them; merge_opsets has refused differing versions already).
            opset_import: models.iter().flat_map(|m| m.opset_import.iter().cloned()).collect(),
            metadata: merged_metadata(models, labels)?,
        })
    }

    /// Sets the fields on the merged model and drops what `merge_models` does not carry
    /// over: the model's doc_string (it is the graph's), training info, multi-device
    /// configurations, the graph's quantization annotations and metadata.
    pub fn apply(self, model: &mut ModelProto) {
        model.opset_import = self.opset_import;
        model.metadata_props = self.metadata;
        model.doc_string = None;
        model.training_info.clear();
        model.configuration.clear();
        if let Some(g) = model.graph.as_mut() {
            g.name = Some(self.graph_name);
            g.doc_string = Some(self.doc_string);
            g.quantization_annotation.clear();
            g.metadata_props.clear();
        }
    }
}

/// The models' metadata_props as `merge_models` merges them: the first model's (a repeated
/// key keeps its first position and last value), then the second's new keys. A key that
/// both set to different values is refused.
pub fn merged_metadata(models: &[ModelProto], labels: &[String]) -> Result<Vec<StringStringEntryProto>> {
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut at: FxHashMap<String, (usize, usize)> = FxHashMap::default();
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    for p in &models[0].metadata_props {
        let (key, value) = (text(&p.key), text(&p.value));
        match at.get(&key) {
            Some(&(x, _)) => entries[x].1 = value,
            None => {
                at.insert(key.clone(), (entries.len(), 0));
                entries.push((key, value));
            }
        }
    }
    for (k, m) in models.iter().enumerate().skip(1) {
        for p in &m.metadata_props {
            let (key, value) = (text(&p.key), text(&p.value));
            match at.get(&key) {
                Some(&(x, from)) if entries[x].1 != value => {
                    return Err(Error::composition(format!(
                        "the metadata property '{key}' is '{}' in {} but '{value}' in {}: \
                         merge_models refuses different values for one key",
                        entries[x].1, labels[from], labels[k]
                    )));
                }
                Some(_) => {}
                None => {
                    at.insert(key.clone(), (entries.len(), k));
                    entries.push((key, value));
                }
            }
        }
    }
    Ok(entries
        .into_iter()
        .map(|(k, v)| StringStringEntryProto { key: Some(k), value: Some(v), ..Default::default() })
        .collect())
}

/// The non-empty input and output names of a graph's nodes (its own level only).
fn node_io(g: &GraphProto) -> impl Iterator<Item = &str> {
    g.node.iter().flat_map(|raw| {
        node::fields(raw)
            .filter_map(|f| f.ok())
            .filter(|f| f.tag == node::INPUT || f.tag == node::OUTPUT)
            .filter_map(|f| f.text())
            .filter(|s| !s.is_empty())
    })
}

/// The value_info `onnx.utils.Extractor` gives a graph cut down to its remaining nodes:
/// of the graph's value_info, inputs and outputs (in that order, a later entry of one name
/// replacing an earlier one in its place), those that a remaining node reads or writes.
pub fn extracted_value_info(g: &GraphProto) -> Vec<ValueInfoProto> {
    let used: FxHashSet<&str> = node_io(g).collect();
    let mut order: Vec<&ValueInfoProto> = Vec::new();
    let mut at: FxHashMap<&str, usize> = FxHashMap::default();
    for vi in g.value_info.iter().chain(&g.input).chain(&g.output) {
        match at.get(vi_name(vi)) {
            Some(&x) => order[x] = vi,
            None => {
                at.insert(vi_name(vi), order.len());
                order.push(vi);
            }
        }
    }
    order.into_iter().filter(|vi| used.contains(vi_name(vi))).cloned().collect()
}

/// Names two graphs share, by kind, as `onnx.compose.check_overlapping_names` lists them:
/// "edge" (node inputs and outputs; the second graph's `io_map_inputs` left out),
/// "value_info", "initializer", "sparse_initializer" (values', then indices' names). Each
/// list in the first graph's order; kinds without a shared name are left out.
pub fn overlapping_names(
    g1: &GraphProto,
    g2: &GraphProto,
    io_map_inputs: &[String],
) -> Vec<(&'static str, Vec<String>)> {
    fn shared<'a>(a: impl Iterator<Item = &'a str>, b: impl Iterator<Item = &'a str>) -> Vec<String> {
        let b: FxHashSet<&str> = b.collect();
        let mut seen = FxHashSet::default();
        a.filter(|n| b.contains(n) && seen.insert(*n)).map(str::to_string).collect()
    }
    fn value_infos(g: &GraphProto) -> impl Iterator<Item = &str> {
        g.value_info.iter().map(vi_name)
    }
    fn initializers(g: &GraphProto) -> impl Iterator<Item = &str> {
        g.initializer.iter().map(|t| t.name.as_deref().unwrap_or(""))
    }
    fn sparse(g: &GraphProto, indices: bool) -> impl Iterator<Item = &str> {
        g.sparse_initializer
            .iter()
            .filter_map(move |s| if indices { s.indices.as_ref() } else { s.values.as_ref() })
            .map(|t| t.name.as_deref().unwrap_or(""))
    }
    let skip: FxHashSet<&str> = io_map_inputs.iter().map(String::as_str).collect();
    let mut sparse_shared = shared(sparse(g1, false), sparse(g2, false));
    sparse_shared.extend(shared(sparse(g1, true), sparse(g2, true)));
    let found = [
        ("edge", shared(node_io(g1), node_io(g2).filter(|n| !skip.contains(n)))),
        ("value_info", shared(value_infos(g1), value_infos(g2))),
        ("initializer", shared(initializers(g1), initializers(g2))),
        ("sparse_initializer", sparse_shared),
    ];
    found.into_iter().filter(|(_, names)| !names.is_empty()).collect()
}

/// The names a model reads without defining them: read by its top-level nodes, read by
/// its subgraphs from outside themselves, or listed among its graph outputs, but neither a
/// graph input, an initializer (sparse included) nor a node output of its top-level graph.
/// Such a model is invalid on its own; `merge_models` concatenates the two graphs and leaves
/// these names as they are, so that they bind to the value the other model defines under the
/// name (a graph input or a weight nothing there reads, which `check_overlapping_names` does
/// not count). Under onnx.compose's rules they are no clash to rename: see
/// `final_names::assign_value_names`. Names are read as
/// [`crate::merge::rename::walk_graph`] reads them (a name that is not UTF-8 escaped).
pub fn free_names(model: &ModelProto) -> FxHashSet<String> {
    let mut free = FxHashSet::default();
    if let Some(g) = model.graph.as_ref() {
        undefined_reads(g, &mut |name| {
            if !free.contains(name) {
                free.insert(name.to_string());
            }
        });
    }
    free
}

/// Calls `found` on each name `g` reads (its outputs, its nodes' inputs, what its subgraphs
/// read from outside themselves) that it does not define, once or more.
fn undefined_reads(g: &GraphProto, found: &mut dyn FnMut(&str)) {
    // As the rename walk reads them: a plain node on its bytes, any other decoded.
    let decoded: Vec<Option<NodeProto>> = g
        .node
        .iter()
        .map(|raw| {
            let plain = node::is_plain(raw)
                && node::fields(raw)
                    .flatten()
                    .all(|f| !(f.tag == node::INPUT || f.tag == node::OUTPUT) || f.text().is_some());
            if plain {
                None
            } else {
                node::decode(raw).ok()
            }
        })
        .collect();
    let mut local: FxHashSet<&str> = g.input.iter().map(vi_name).collect();
    local.extend(g.initializer.iter().filter_map(|t| t.name.as_deref()));
    for s in &g.sparse_initializer {
        local.extend(s.values.iter().chain(&s.indices).filter_map(|t| t.name.as_deref()));
    }
    local.insert("");
    for (raw, n) in g.node.iter().zip(&decoded) {
        each_io(raw, n.as_ref(), node::OUTPUT, &mut |name| {
            local.insert(name);
        });
    }
    let mut outside = |name: &str| {
        if !local.contains(name) {
            found(name)
        }
    };
    g.output.iter().map(vi_name).for_each(&mut outside);
    for (raw, n) in g.node.iter().zip(&decoded) {
        each_io(raw, n.as_ref(), node::INPUT, &mut outside);
        for sub in n.iter().flat_map(node::subgraphs) {
            undefined_reads(sub, &mut outside);
        }
    }
}

/// Calls `found` on a node's inputs (`tag` [`node::INPUT`]) or outputs ([`node::OUTPUT`]):
/// from `decoded` where the node was decoded, else from its bytes.
fn each_io<'a>(raw: &'a [u8], decoded: Option<&'a NodeProto>, tag: u32, found: &mut dyn FnMut(&'a str)) {
    match decoded {
        Some(n) => {
            let names = if tag == node::INPUT { &n.input } else { &n.output };
            names.iter().for_each(|s| found(s));
        }
        None => node::fields(raw).flatten().filter(|f| f.tag == tag).filter_map(|f| f.text()).for_each(found),
    }
}

/// Which names `onnx.compose.add_prefix` prefixes (its `rename_*` arguments).
#[derive(Debug, Clone, Copy)]
pub struct Prefixed {
    /// Node names, and every name inside subgraphs (which add_prefix walks only then).
    pub nodes: bool,
    /// Node outputs that are not graph outputs.
    pub edges: bool,
    pub inputs: bool,
    pub outputs: bool,
    /// Initializers and sparse initializers (values' and indices' names).
    pub initializers: bool,
    pub value_infos: bool,
    /// Local functions and their callers.
    pub functions: bool,
}

/// Every name defined inside the subgraphs of `g`'s nodes, at any depth: their inputs,
/// outputs, node outputs, initializers and value_info (not what they read from outside).
fn defined_in_subgraphs(g: &GraphProto, out: &mut FxHashSet<String>) {
    for raw in &g.node {
        if !node::has_tensors_or_graphs(raw) {
            continue;
        }
        let Ok(n) = node::decode(raw) else { continue };
        for sub in node::subgraphs(&n) {
            let vis = sub.input.iter().chain(&sub.output).chain(&sub.value_info);
            out.extend(vis.map(vi_name).filter(|s| !s.is_empty()).map(str::to_string));
            out.extend(sub.initializer.iter().filter_map(|t| t.name.clone()));
            for s in &sub.sparse_initializer {
                out.extend(s.values.iter().chain(&s.indices).filter_map(|t| t.name.clone()));
            }
            for raw in &sub.node {
                out.extend(
                    node::fields(raw)
                        .filter_map(|f| f.ok())
                        .filter(|f| f.tag == node::OUTPUT)
                        .filter_map(|f| f.text())
                        .map(str::to_string),
                );
            }
            defined_in_subgraphs(sub, out);
        }
    }
    out.remove("");
}

/// Prefixes the names of `model` that `what` selects, as `add_prefix` does, and applies the
/// one map to every scope (bodies reading an outer name included, which add_prefix misses
/// for initializers). Returns the value names renamed, (old, new).
pub fn prefix_names(model: &mut ModelProto, prefix: &str, what: Prefixed) -> Vec<(String, String)> {
    let Some(g) = model.graph.as_ref() else { return Vec::new() };
    let mut values: FxHashSet<String> = FxHashSet::default();
    let mut add =
        |names: &mut dyn Iterator<Item = &str>| values.extend(names.filter(|s| !s.is_empty()).map(str::to_string));
    let outputs: FxHashSet<&str> = g.output.iter().map(vi_name).collect();
    if what.edges {
        add(&mut g.node.iter().flat_map(|raw| {
            node::fields(raw)
                .filter_map(|f| f.ok())
                .filter(|f| f.tag == node::OUTPUT)
                .filter_map(|f| f.text())
                .filter(|s| !outputs.contains(s))
        }));
    }
    if what.inputs {
        add(&mut g.input.iter().map(vi_name));
    }
    if what.outputs {
        add(&mut g.output.iter().map(vi_name));
    }
    if what.initializers {
        add(&mut g.initializer.iter().filter_map(|t| t.name.as_deref()));
        add(&mut g
            .sparse_initializer
            .iter()
            .flat_map(|s| s.values.iter().chain(&s.indices))
            .filter_map(|t| t.name.as_deref()));
    }
    if what.value_infos {
        add(&mut g.value_info.iter().map(vi_name));
    }
    if what.nodes {
        defined_in_subgraphs(g, &mut values);
    }
    let arena = Bump::new();
    let node_names = if what.nodes { NameSet::of(model, &arena).nodes } else { FxHashSet::default() };
    let new = |n: &str| -> &str { arena.alloc_str(&format!("{prefix}{n}")) };
    let mut r = Renamer {
        values: values.iter().map(|v| (v.as_str(), new(v))).collect(),
        nodes: node_names.iter().map(|&v| (v, new(v))).collect(),
        functions: if what.functions {
            model
                .functions
                .iter()
                .map(|f| (function_key(f), format!("{prefix}{}", f.name.as_deref().unwrap_or(""))))
                .collect()
        } else {
            FxHashMap::default()
        },
        // Only with rename_nodes does add_prefix touch node names (and walk subgraphs).
        name_unnamed: what.nodes,
    };
    let renamed = r.values.iter().map(|(&old, &new)| (old.to_string(), new.to_string())).collect();
    if !r.is_identity() {
        walk_model(model, &mut r);
    }
    renamed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::NodeProto;
    use crate::merge::testing::*;

    fn prop(k: &str, v: &str) -> StringStringEntryProto {
        StringStringEntryProto { key: Some(k.into()), value: Some(v.into()), ..Default::default() }
    }

    #[test]
    fn metadata_merges_like_merge_models_and_refuses_a_conflict() {
        let (mut a, mut b) = (scale(1), scale(1));
        a.metadata_props = vec![prop("p1", "v1"), prop("p2", "v2"), prop("p1", "v3")];
        b.metadata_props = vec![prop("p1", "v3"), prop("p4", "v4")];
        let merged = merged_metadata(&[a.clone(), b.clone()], &labels(2)).unwrap();
        let pairs: Vec<(String, String)> =
            merged.iter().map(|p| (p.key.clone().unwrap(), p.value.clone().unwrap())).collect();
        assert_eq!(pairs, [("p1".into(), "v3".into()), ("p2".into(), "v2".into()), ("p4".into(), "v4".into())]);
        b.metadata_props[0] = prop("p1", "v5");
        let err = merged_metadata(&[a, b], &labels(2)).unwrap_err();
        assert!(err.message.contains("'p1' is 'v3' in m0.onnx but 'v5' in m1.onnx"), "{}", err.message);
    }

    #[test]
    fn extracted_value_info_keeps_what_remaining_nodes_touch_in_extractor_order() {
        let mut m = scale(1);
        let g = m.graph.as_mut().unwrap();
        g.value_info = vec![vi("t", 1, &[2, 4]), vi("unused", 1, &[1]), vi("y", 1, &[9])];
        let got = extracted_value_info(g);
        // 't' first (value_info), then the input 'x'; 'y' keeps the value_info's place but
        // takes the output's entry.
        assert_eq!(names(&got), ["t", "y", "x"]);
        assert_eq!(got[1], g.output[0]);
    }

    #[test]
    fn overlapping_names_by_kind_leaving_out_the_io_map_inputs() {
        let (a, b) = (scale(1), scale(1));
        let found = overlapping_names(graph(&a), graph(&b), &["x".to_string()]);
        assert_eq!(found[0], ("edge", vec!["c".to_string(), "t".to_string(), "y".to_string()]));
        assert_eq!(found[1], ("initializer", vec!["c".to_string()]));
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn free_names_are_what_a_model_reads_and_defines_nowhere_bodies_included() {
        use crate::codec::proto::AttributeProto;
        let mut m = scale(1);
        // 'outer' read by a body (whose own 'inner' is no free name), 't' read by it from the
        // graph; 'flag' read at the top; 'gone' an output nothing writes.
        let body = GraphProto {
            node: vec![node("Neg", &["outer"], &["inner"]), node("Add", &["inner", "t"], &["o"])],
            output: vec![vi("o", 1, &[2, 4])],
            ..Default::default()
        };
        let branch = AttributeProto { name: Some("then_branch".into()), g: Some(body), ..Default::default() };
        let call = NodeProto { attribute: vec![branch], ..node_proto("If", &["flag"], &["z"]) };
        // A name that is not UTF-8, read and defined: read as the rename walk reads it.
        let odd = crate::codec::fidelity::text_of(b"c\x99nd".to_vec());
        let g = m.graph.as_mut().unwrap();
        g.node.push(crate::codec::node::encode(&call));
        g.node.push(node("Abs", &[odd.as_str()], &["w"]));
        g.input.push(vi(&odd, 1, &[2, 4]));
        g.output.push(vi("gone", 1, &[2, 4]));
        let mut free: Vec<String> = free_names(&m).into_iter().collect();
        free.sort();
        assert_eq!(free, ["flag", "gone", "outer"]);
    }

    #[test]
    fn prefix_names_follows_the_flags_and_reaches_bodies() {
        let mut m = scale(1);
        let only_edges = Prefixed {
            nodes: false,
            edges: true,
            inputs: false,
            outputs: false,
            initializers: false,
            value_infos: false,
            functions: false,
        };
        let renamed = prefix_names(&mut m, "p/", only_edges);
        assert_eq!(renamed, [("t".to_string(), "p/t".to_string())]);
        let g = m.graph.unwrap();
        assert_eq!(node_at(&g, 0).output, ["p/t"]);
        assert_eq!(node_at(&g, 1).input, ["p/t"]);
        assert_eq!(node_at(&g, 0).name.as_deref(), Some("mul"));
    }

    #[test]
    fn prefixing_node_names_gives_unnamed_nodes_an_empty_one_as_add_prefix_does() {
        let mut m = scale(1);
        let g = m.graph.as_mut().unwrap();
        g.node[0] = crate::codec::node::encode(&NodeProto { name: None, ..node_at(g, 0) });
        let all = Prefixed {
            nodes: true,
            edges: true,
            inputs: true,
            outputs: true,
            initializers: true,
            value_infos: true,
            functions: true,
        };
        let mut prefixed = m.clone();
        prefix_names(&mut prefixed, "p/", all);
        let g = prefixed.graph.unwrap();
        assert_eq!(node_at(&g, 0).name.as_deref(), Some(""), "present and empty");
        assert_eq!(node_at(&g, 1).name.as_deref(), Some("p/relu"));
        // Without node names, add_prefix leaves an unnamed node unnamed.
        prefix_names(&mut m, "p/", Prefixed { nodes: false, ..all });
        assert_eq!(node_at(m.graph.as_ref().unwrap(), 0).name, None);
    }
}
