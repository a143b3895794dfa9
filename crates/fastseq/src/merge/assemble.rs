//! The merged graph: the renamed stages laid end to end as the plan says, with adapters on
//! the edges that asked for them.
use std::collections::HashSet;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::attribute_proto::AttributeType;
use crate::codec::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::codec::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto,
};
use crate::merge::metadata::kept_in_merge;
use crate::merge::options::Options;
use crate::merge::plan::adapters::Adapter;
use crate::merge::plan::parts::Plan;

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
fn adapter_nodes(a: &Adapter, names: &AdapterNames, opset: i64) -> (Vec<Bytes>, Option<TensorProto>) {
    let mut nodes = Vec::new();
    let mut axes = None;
    let mut input = names.input.clone();
    if let Some(to) = a.cast_to {
        let out = if a.axis.is_some() { names.between.clone() } else { names.output.clone() };
        nodes.push(crate::codec::node::encode(&NodeProto {
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
        let op_type = op.op_type();
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
                data_type: Some(crate::codec::proto::tensor_proto::DataType::Int64 as i32),
                raw_data: Some(Bytes::copy_from_slice(&op.axis().to_le_bytes())),
                ..Default::default()
            });
        } else {
            node.attribute.push(AttributeProto {
                name: Some("axes".into()),
                r#type: Some(AttributeType::Ints as i32),
                ints: vec![op.axis()],
                ..Default::default()
            });
        }
        nodes.push(crate::codec::node::encode(&node));
    }
    (nodes, axes)
}

fn rename_dims(vis: &mut [ValueInfoProto], dims: &FxHashMap<String, Dim>) {
    use crate::codec::proto::type_proto::Value;
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
/// nodes in the merged graph (adapters into a stage first in it) and the number of
/// adapter nodes at the start of that range.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    mut models: Vec<ModelProto>,
    plan: &Plan,
    adapters: &[AdapterNames],
    dropped_functions: Vec<Vec<usize>>,
    opset_import: Vec<OperatorSetIdProto>,
    ir_version: i64,
    opts: &Options,
) -> (ModelProto, Vec<(usize, usize)>, Vec<usize>) {
    let graph_names: Vec<String> =
        models.iter().filter_map(|m| graph(m).name.clone()).filter(|s| !s.is_empty()).collect();
    let default_opset = opset_import
        .iter()
        .find(|o| crate::merge::opsets::normalize_domain(o.domain.as_deref().unwrap_or("")).is_empty())
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
    let mut inserted = Vec::with_capacity(models.len());
    let mut meta_seen: HashSet<(String, String)> = HashSet::new();
    for (k, m) in models.into_iter().enumerate() {
        let mg = m.graph.expect("checked on entry");
        let start = g.node.len();
        for &x in &into_stage[k] {
            let (nodes, axes) = adapter_nodes(&plan.adapters[x], &adapters[x], default_opset);
            g.node.extend(nodes);
            g.initializer.extend(axes);
        }
        inserted.push(g.node.len() - start);
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
            if !kept_in_merge(p.key.as_deref().unwrap_or(""), opts.rules) {
                continue;
            }
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
    (out, ranges, inserted)
}
