//! The merged graph: the renamed stages laid end to end as the plan says, with adapters on
//! the edges that asked for them, and weights that several stages hold stored once.
use std::collections::HashSet;

use bytes::Bytes;
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::compose::Options;
use crate::plan::{graph, vi_name, AxisOp, Plan, Target};
use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto,
};

/// What deduplication saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deduped {
    pub initializers: usize,
    pub bytes: u64,
}

/// Bytes read from each end of a weight to tell most different weights of one size apart
/// without reading all of them.
const SAMPLE: usize = 4096;

fn hash(parts: &[&[u8]]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    for p in parts {
        h.write(p);
    }
    h.finish()
}

fn sample_hash(b: &[u8]) -> u64 {
    if b.len() <= 3 * SAMPLE {
        return hash(&[b]);
    }
    let mid = b.len() / 2;
    hash(&[&b[..SAMPLE], &b[mid..mid + SAMPLE], &b[b.len() - SAMPLE..]])
}

/// Finds initializers that an earlier stage holds too (same element type, dims and bytes)
/// and makes each later one an alias of the first: its uses take the first one's name and
/// it is left out. Weights are grouped by type, dims and size, then by a hash of a sample,
/// then of all their bytes; equal hashes are confirmed byte for byte, in place (the bytes
/// are slices of the sources, never copied). Weights that are graph inputs (IR < 4),
/// outputs, exposed or fed by an edge are left alone, and so are the weights of a model
/// with training information.
pub fn dedupe(models: &[ModelProto], plan: &mut Plan) -> Deduped {
    // (stage, index, bytes) of each candidate, grouped by (type, dims, size).
    let mut groups: FxHashMap<(i32, &[i64], usize), Vec<Weight>> = FxHashMap::default();
    for (k, m) in models.iter().enumerate() {
        // Training graphs update weights by name: two stages' weights must stay two.
        if !m.training_info.is_empty() {
            continue;
        }
        let g = graph(m);
        let io: FxHashSet<&str> = g.input.iter().chain(&g.output).map(vi_name).collect();
        for (x, t) in g.initializer.iter().enumerate() {
            let (Some(raw), Some(name)) = (t.raw_data.as_ref(), t.name.as_deref()) else { continue };
            let kept = plan.kept.as_ref().is_none_or(|kept| kept.initializers[k][x]);
            if !kept
                || crate::external::is_external(t)
                || io.contains(name)
                || plan.pinned[k].contains_key(name)
                || plan.alias[k].contains_key(name)
            {
                continue;
            }
            groups.entry((t.data_type.unwrap_or(0), &t.dims, raw.len())).or_default().push((k, x, raw));
        }
    }
    // Only groups spanning several stages can save anything.
    let mut groups: Vec<Vec<(usize, usize, &Bytes)>> =
        groups.into_values().filter(|g| g.iter().any(|&(k, ..)| k != g[0].0)).collect();
    groups.sort_unstable_by_key(|g| (g[0].0, g[0].1));
    let mut saved = Deduped::default();
    let mut dropped: Vec<(usize, usize)> = Vec::new();
    for group in groups {
        for sub in split_by_hash(group, false) {
            // A weight small enough to be sampled whole needs no second hash.
            let subs = if sub[0].2.len() <= 3 * SAMPLE { vec![sub] } else { split_by_hash(sub, true) };
            for members in subs {
                // Members are in stage order: each is compared with the distinct contents seen so far.
                let mut keepers: Vec<Weight> = Vec::new();
                for (k, x, b) in members {
                    match keepers.iter().find(|(_, _, kb)| kb.as_ref() == b.as_ref()) {
                        Some(&(j, y, _)) if j < k => {
                            let keeper = graph(&models[j]).initializer[y].name.clone().unwrap_or_default();
                            let name = graph(&models[k]).initializer[x].name.clone().unwrap_or_default();
                            plan.alias[k].insert(name, Target::Value(j, keeper));
                            dropped.push((k, x));
                            saved.initializers += 1;
                            saved.bytes += b.len() as u64;
                        }
                        // The same bytes twice in one stage: left as they are.
                        Some(_) => {}
                        None => keepers.push((k, x, b)),
                    }
                }
            }
        }
    }
    if !dropped.is_empty() {
        let kept = plan.kept_mut(models);
        for (k, x) in dropped {
            kept.initializers[k][x] = false;
        }
    }
    saved
}

/// (stage, initializer index, its bytes).
type Weight<'m> = (usize, usize, &'m Bytes);

/// Splits a group of weights by a hash of a sample of their bytes, or of all of them;
/// keeps the parts that span several stages, in stage order.
fn split_by_hash(group: Vec<Weight<'_>>, full: bool) -> Vec<Vec<Weight<'_>>> {
    let hashes: Vec<u64> = group.par_iter().map(|(_, _, b)| if full { hash(&[b]) } else { sample_hash(b) }).collect();
    let mut by: FxHashMap<u64, Vec<Weight>> = FxHashMap::default();
    for (h, m) in hashes.into_iter().zip(group) {
        by.entry(h).or_default().push(m);
    }
    let mut out: Vec<_> = by.into_values().filter(|g| g.iter().any(|&(k, ..)| k != g[0].0)).collect();
    out.sort_unstable_by_key(|g| (g[0].0, g[0].1));
    out
}

/// The names an adapter's nodes use, chosen by the naming step.
#[derive(Debug, Clone)]
pub struct AdapterNames {
    /// The final name of the upstream output.
    pub input: String,
    /// What the downstream input reads instead.
    pub output: String,
    /// Between the Cast and the axis change when there are both.
    pub between: String,
    /// The axes initializer (opset 13 and later).
    pub axes: String,
    pub nodes: [String; 2],
}

fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

/// The nodes (and the axes initializer, if any) of one adapter.
fn adapter_nodes(a: &crate::plan::Adapter, names: &AdapterNames, opset: i64) -> (Vec<Bytes>, Option<TensorProto>) {
    let mut nodes = Vec::new();
    let mut axes = None;
    let mut input = names.input.clone();
    if let Some(to) = a.cast_to {
        let out = if a.axis.is_some() { names.between.clone() } else { names.output.clone() };
        nodes.push(crate::node::encode(&NodeProto {
            input: vec![input],
            output: vec![out.clone()],
            name: Some(names.nodes[0].clone()),
            op_type: Some("Cast".into()),
            attribute: vec![attr_int("to", to as i64)],
            ..Default::default()
        }));
        input = out;
    }
    if let Some(op) = a.axis {
        let op_type = match op {
            AxisOp::Unsqueeze => "Unsqueeze",
            AxisOp::Squeeze => "Squeeze",
        };
        let mut node = NodeProto {
            input: vec![input],
            output: vec![names.output.clone()],
            name: Some(names.nodes[1].clone()),
            op_type: Some(op_type.into()),
            ..Default::default()
        };
        if opset >= 13 {
            node.input.push(names.axes.clone());
            axes = Some(TensorProto {
                name: Some(names.axes.clone()),
                dims: vec![1],
                data_type: Some(crate::proto::tensor_proto::DataType::Int64 as i32),
                raw_data: Some(Bytes::from_static(&[0; 8])),
                ..Default::default()
            });
        } else {
            node.attribute.push(AttributeProto {
                name: Some("axes".into()),
                r#type: Some(AttributeType::Ints as i32),
                ints: vec![0],
                ..Default::default()
            });
        }
        nodes.push(crate::node::encode(&node));
    }
    (nodes, axes)
}

fn rename_dims(vis: &mut [ValueInfoProto], dims: &FxHashMap<String, Dim>) {
    use crate::proto::type_proto::Value;
    for vi in vis {
        let Some(Value::TensorType(t)) = vi.r#type.as_mut().and_then(|t| t.value.as_mut()) else { continue };
        for d in t.shape.iter_mut().flat_map(|s| s.dim.iter_mut()) {
            if let Some(Dim::DimParam(p)) = d.value.as_ref() {
                if let Some(new) = dims.get(p.as_str()) {
                    d.value = Some(new.clone());
                }
            }
        }
    }
}

fn keep_by<'m, T: 'm>(list: Vec<T>, mask: &'m [bool]) -> impl Iterator<Item = T> + 'm {
    list.into_iter().zip(mask).filter(|(_, &k)| k).map(|(t, _)| t)
}

/// Lays the renamed stages out as one model. Returns it and, per stage, the range of its
/// nodes in the merged graph (adapters into a stage count as its own).
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    mut models: Vec<ModelProto>,
    plan: &Plan,
    adapters: &[AdapterNames],
    dropped_functions: Vec<Vec<usize>>,
    opset_import: Vec<OperatorSetIdProto>,
    ir_version: i64,
    opts: &Options,
) -> (ModelProto, Vec<(usize, usize)>) {
    let graph_names: Vec<String> =
        models.iter().filter_map(|m| graph(m).name.clone()).filter(|s| !s.is_empty()).collect();
    let default_opset = opset_import
        .iter()
        .find(|o| crate::opset::normalize_domain(o.domain.as_deref().unwrap_or("")).is_empty())
        .and_then(|o| o.version)
        .unwrap_or(1);
    let mut g = GraphProto {
        name: Some(opts.graph_name.clone().unwrap_or_else(|| {
            if graph_names.is_empty() {
                "fastseq".to_string()
            } else {
                graph_names.join("+")
            }
        })),
        ..Default::default()
    };
    // Sized once: growing a list of tens of thousands of nodes copies it again and again.
    g.node.reserve_exact(models.iter().map(|m| graph(m).node.len()).sum::<usize>() + 2 * adapters.len());
    g.initializer.reserve_exact(models.iter().map(|m| graph(m).initializer.len()).sum());
    let mut out = ModelProto {
        ir_version: Some(ir_version),
        opset_import,
        producer_name: Some(opts.producer_name.clone().unwrap_or_else(|| "fastseq".to_string())),
        producer_version: Some(opts.producer_version.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string())),
        domain: opts.domain.clone(),
        model_version: opts.model_version,
        doc_string: opts.doc_string.clone(),
        ..Default::default()
    };
    // Inputs and outputs first: the plan orders them across stages.
    let mut ios: Vec<(Vec<ValueInfoProto>, Vec<ValueInfoProto>)> = models
        .iter_mut()
        .enumerate()
        .map(|(k, m)| {
            let mg = m.graph.as_mut().expect("checked on entry");
            if !plan.dims[k].is_empty() {
                rename_dims(&mut mg.input, &plan.dims[k]);
                rename_dims(&mut mg.output, &plan.dims[k]);
                rename_dims(&mut mg.value_info, &plan.dims[k]);
            }
            (std::mem::take(&mut mg.input), std::mem::take(&mut mg.output))
        })
        .collect();
    for gi in &plan.inputs {
        g.input.push(std::mem::take(&mut ios[gi.stage].0[gi.index]));
    }
    let mut output_seen: HashSet<String> = HashSet::new();
    for go in &plan.outputs {
        let vi = std::mem::take(&mut ios[go.stage].1[go.index]);
        if output_seen.insert(vi_name(&vi).to_string()) {
            g.output.push(vi);
        }
    }
    let mut internal: Vec<ValueInfoProto> = Vec::new();
    for (k, xs) in plan.internal_outputs.iter().enumerate() {
        for &x in xs {
            internal.push(std::mem::take(&mut ios[k].1[x]));
        }
    }
    drop(ios);
    let mut into_stage: Vec<Vec<usize>> = vec![Vec::new(); models.len()];
    for (x, a) in plan.adapters.iter().enumerate() {
        into_stage[plan.edges[a.edge].to].push(x);
    }
    let mut ranges = Vec::with_capacity(models.len());
    let mut meta_seen: HashSet<(String, String)> = HashSet::new();
    for (k, m) in models.into_iter().enumerate() {
        let mg = m.graph.expect("checked on entry");
        let start = g.node.len();
        for &x in &into_stage[k] {
            let (nodes, axes) = adapter_nodes(&plan.adapters[x], &adapters[x], default_opset);
            g.node.extend(nodes);
            g.initializer.extend(axes);
        }
        match &plan.kept {
            None => {
                let mut mg = mg;
                g.node.append(&mut mg.node);
                g.initializer.append(&mut mg.initializer);
                g.sparse_initializer.append(&mut mg.sparse_initializer);
                g.value_info.append(&mut mg.value_info);
                g.quantization_annotation.append(&mut mg.quantization_annotation);
                g.metadata_props.append(&mut mg.metadata_props);
            }
            Some(kept) => {
                g.node.extend(keep_by(mg.node, &kept.nodes[k]));
                g.initializer.extend(keep_by(mg.initializer, &kept.initializers[k]));
                g.sparse_initializer.extend(keep_by(mg.sparse_initializer, &kept.sparse[k]));
                g.value_info.extend(keep_by(mg.value_info, &kept.value_info[k]));
                g.quantization_annotation.extend(mg.quantization_annotation);
                g.metadata_props.extend(mg.metadata_props);
            }
        }
        ranges.push((start, g.node.len()));
        let drop = &dropped_functions[k];
        out.functions.extend(m.functions.into_iter().enumerate().filter(|(x, _)| !drop.contains(x)).map(|(_, f)| f));
        out.training_info.extend(m.training_info);
        out.configuration.extend(m.configuration);
        for p in m.metadata_props {
            let key = (p.key.clone().unwrap_or_default(), p.value.clone().unwrap_or_default());
            if meta_seen.insert(key) {
                out.metadata_props.push(p);
            }
        }
    }
    // The types of the tensors that cross an edge stay known to shape inference.
    let mut info_seen: HashSet<String> = g.value_info.iter().map(|v| vi_name(v).to_string()).collect();
    info_seen.extend(output_seen);
    for vi in internal {
        if info_seen.insert(vi_name(&vi).to_string()) {
            g.value_info.push(vi);
        }
    }
    out.graph = Some(g);
    (out, ranges)
}

#[cfg(test)]
mod tests {
    use crate::compose::testing::*;

    #[test]
    fn identical_weights_are_stored_once() {
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("out", 2, "y")]);
        let c = compose_graph(vec![scale(1), scale(1), distinct(5.0)], &labels(3), &opts).unwrap();
        assert_eq!(c.report.deduped, Deduped { initializers: 1, bytes: 16 });
        let g = c.model.graph.unwrap();
        assert_eq!(g.initializer.iter().map(|t| t.name.clone().unwrap()).collect::<Vec<_>>(), ["c", "m2/c"]);
        assert_eq!(node_at(&g, 2).input, ["y", "c"]);
        // Off on request, and off in the linear form unless asked.
        let off = Options { dedupe: Some(false), ..opts };
        assert_eq!(
            compose_graph(vec![scale(1), scale(1), scale(1)], &labels(3), &off).unwrap().report.deduped.initializers,
            0
        );
        let linear = compose_graph(vec![scale(1), scale(1)], &labels(2), &Options::default()).unwrap();
        assert_eq!(linear.model.graph.unwrap().initializer.len(), 2);
    }

    #[test]
    fn weights_equal_in_their_sampled_bytes_only_are_not_merged() {
        let big = |flip: bool| {
            let mut m = scale(1);
            let mut data = vec![7u8; 40_000];
            if flip {
                data[6_000] = 8; // outside the sampled ends and middle
            }
            let t = &mut m.graph.as_mut().unwrap().initializer[0];
            t.dims = vec![10_000];
            t.raw_data = Some(bytes::Bytes::from(data));
            m
        };
        let opts = Options { edges: Some(vec![]), ..Default::default() };
        let c = compose_graph(vec![big(false), big(true), big(false)], &labels(3), &opts).unwrap();
        assert_eq!(c.report.deduped, Deduped { initializers: 1, bytes: 40_000 });
        let g = c.model.graph.unwrap();
        assert_eq!(node_at(&g, 4).input[1], "c");
        assert_eq!(node_at(&g, 2).input[1], "m1/c");
    }
}
