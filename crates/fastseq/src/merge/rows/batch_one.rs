//! Batch-1 exports made batchable: a model exported with a fixed first axis of 1 (the onnx
//! wheel's AlexNet, ResNet-50, VGG-19...) given a symbolic batch axis where the graph allows.
//!
//! The inputs' and outputs' first axes of 1 become `batch`; the value infos (shapes the
//! export inferred for a batch of one) are dropped; every constant Reshape shape that the
//! analysis finds giving the rows' axis a size of 1 copies it instead (`0`). The result is
//! proved by the same analysis as any batch ([`row_findings`]): what it cannot prove
//! is refused with the node at fault, never rewritten on a guess.
use std::collections::HashSet;

use crate::codec::node::{decode, encode};
use crate::codec::proto::tensor_shape_proto::dimension::Value as DimValue;
use crate::codec::proto::type_proto::Value as TypeValue;
use crate::codec::proto::{ModelProto, TensorProto, ValueInfoProto};
use crate::merge::rows::value::{attr, from_tensor, int_attr};
use crate::merge::rows::{free_names, opset_of, row_findings, Finding};

/// The name the new batch axes are given.
pub const BATCH: &str = "batch";

/// `model` with a symbolic batch axis in place of its fixed first axis of 1, or why not: the
/// findings name the input or the node that keeps the rows from being batched.
pub fn dynamic_batch(model: &ModelProto) -> Result<ModelProto, Vec<Finding>> {
    let refuse =
        |reason: String| vec![Finding { node: None, name: String::new(), op_type: String::new(), inner: None, reason }];
    let mut m = model.clone();
    let opset = opset_of(&m.opset_import);
    let Some(g) = m.graph.as_mut() else { return Err(refuse("the model has no graph".into())) };
    let weights: HashSet<String> = g.initializer.iter().filter_map(|t| t.name.clone()).collect();
    let mut made = 0;
    for vi in g.input.iter_mut().filter(|v| !weights.contains(v.name.as_deref().unwrap_or(""))) {
        let name = vi.name.clone().unwrap_or_default();
        match first_axis(vi) {
            Some(DimValue::DimValue(1)) => {
                set_batch(vi);
                made += 1;
            }
            Some(DimValue::DimValue(v)) => {
                return Err(refuse(format!("input '{name}' has a fixed first axis of {v}, not a batch of 1")));
            }
            _ => {}
        }
    }
    if made == 0 {
        return Err(refuse("no input has a fixed first axis of 1 (nothing to make dynamic)".into()));
    }
    for vi in &mut g.output {
        if matches!(first_axis(vi), Some(DimValue::DimValue(1))) {
            set_batch(vi);
        }
    }
    g.value_info.clear();
    // Each pass fixes the Reshape that the analysis stops at, or ends: at most one pass per node.
    let mut replaced = Vec::new();
    for _ in 0..=g.node.len() {
        let findings = row_findings(&m);
        let Some(k) = findings.iter().find_map(|f| f.node.filter(|&k| copies_rows(&m, k, opset))) else {
            if !findings.is_empty() {
                return Err(findings);
            }
            drop_unused(&mut m, &replaced);
            return Ok(m);
        };
        replaced.extend(copy_first_axis(&mut m, k, opset));
    }
    Err(row_findings(&m))
}

/// The batch-1 shapes in `replaced` that no node reads any more (each Reshape got a copy),
/// and their IR 3 graph-input entries: ONNX Runtime would warn about each.
fn drop_unused(m: &mut ModelProto, replaced: &[String]) {
    let Some(g) = m.graph.as_mut() else { return };
    let mut read: HashSet<String> = g.output.iter().filter_map(|v| v.name.clone()).collect();
    for raw in &g.node {
        let Ok(n) = decode(raw) else { return };
        for sub in crate::codec::node::subgraphs(&n) {
            let mut free = Vec::new();
            free_names(sub, &mut free);
            read.extend(free);
        }
        read.extend(n.input);
    }
    let gone: HashSet<&str> = replaced.iter().map(String::as_str).filter(|n| !read.contains(*n)).collect();
    g.initializer.retain(|t| !gone.contains(t.name.as_deref().unwrap_or("")));
    g.input.retain(|v| !gone.contains(v.name.as_deref().unwrap_or("")));
}

fn first_axis(vi: &ValueInfoProto) -> Option<DimValue> {
    let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref()?.value.as_ref() else { return None };
    t.shape.as_ref()?.dim.first()?.value.clone()
}

fn set_batch(vi: &mut ValueInfoProto) {
    if let Some(TypeValue::TensorType(t)) = vi.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        if let Some(d) = t.shape.as_mut().and_then(|s| s.dim.first_mut()) {
            d.value = Some(DimValue::DimParam(BATCH.into()));
        }
    }
}

/// The constant shape of Reshape `k`, if it is one whose first entry is 1 (the batch of the
/// export), with where it comes from: an initializer's index, or None for the attribute.
fn batch_one_shape(m: &ModelProto, k: usize, opset: i64) -> Option<(Option<usize>, Vec<i64>)> {
    let g = m.graph.as_ref()?;
    let node = decode(g.node.get(k)?).ok()?;
    if node.op_type.as_deref() != Some("Reshape") || !node.domain.as_deref().unwrap_or("").is_empty() {
        return None;
    }
    let (at, shape) = if opset < 5 {
        (None, attr(&node, "shape")?.ints.clone())
    } else {
        let name = node.input.get(1)?;
        let at = g.initializer.iter().position(|t| t.name.as_deref() == Some(name))?;
        (Some(at), from_tensor(&g.initializer[at]).known()?)
    };
    (shape.first() == Some(&1)).then_some((at, shape))
}

fn copies_rows(m: &ModelProto, k: usize, opset: i64) -> bool {
    let Some((_, shape)) = batch_one_shape(m, k, opset) else { return false };
    let allowzero = m.graph.as_ref().and_then(|g| decode(&g.node[k]).ok()).and_then(|n| int_attr(&n, "allowzero"));
    allowzero != Some(1) || !shape.contains(&-1)
}

/// Reshape `k`'s first entry 1 made 0 (copy the rows' axis), or -1 with `allowzero` (where 0
/// is a size); an initializer shared with other nodes is left to them, the Reshape given a
/// copy of its own.
fn copy_first_axis(m: &mut ModelProto, k: usize, opset: i64) -> Option<String> {
    let (at, mut shape) = batch_one_shape(m, k, opset)?;
    let mut replaced = None;
    let g = m.graph.as_mut().expect("checked");
    let mut node = decode(&g.node[k]).expect("checked");
    shape[0] = if int_attr(&node, "allowzero") == Some(1) { -1 } else { 0 };
    match at {
        None => {
            if let Some(a) = node.attribute.iter_mut().find(|a| a.name.as_deref() == Some("shape")) {
                a.ints = shape;
            }
        }
        Some(i) => {
            let old = g.initializer[i].name.clone().unwrap_or_default();
            let mut name = format!("{old}_{BATCH}");
            while g.initializer.iter().any(|t| t.name.as_deref() == Some(&name))
                || g.input.iter().any(|v| v.name.as_deref() == Some(&name))
            {
                name.push('_');
            }
            let tensor = TensorProto {
                name: Some(name.clone()),
                dims: vec![shape.len() as i64],
                data_type: Some(7),
                int64_data: shape,
                ..Default::default()
            };
            if m.ir_version.unwrap_or(0) < 4 {
                // IR 3 lists every initializer among the graph's inputs too.
                let listed = g.input.iter().find(|v| v.name.as_deref() == Some(&old)).cloned();
                if let Some(mut vi) = listed {
                    vi.name = Some(name.clone());
                    g.input.push(vi);
                }
            }
            g.initializer.push(tensor);
            node.input[1] = name;
            replaced = Some(old);
        }
    }
    g.node[k] = encode(&node);
    replaced
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{AttributeProto, GraphProto, NodeProto};
    use crate::codec::testing::value as vi;

    fn n(op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
        crate::merge::rows::testing::node(op, ins, outs, vec![])
    }

    fn ints(name: &str, v: &[i64]) -> TensorProto {
        crate::merge::rows::testing::ints(name, v, false)
    }

    fn model(nodes: Vec<NodeProto>, inits: Vec<TensorProto>, out: &[i64]) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: nodes.iter().map(encode).collect(),
                input: vec![vi("x", &[1, 4, 2])],
                output: vec![vi("y", out)],
                value_info: vec![vi("h", &[1, 4, 2])],
                initializer: inits,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_flattening_reshape_of_a_batch_one_export_copies_the_rows_axis() {
        // AlexNet's classifier: Reshape(x, [1, 8]) shared by two Reshapes, and one that is not
        // on the rows (a weight's shape) left alone.
        let m = model(
            vec![
                n("Relu", &["x"], &["h"]),
                n("Reshape", &["h", "flat"], &["f"]),
                n("Reshape", &["w", "flat"], &["wf"]),
                n("Add", &["f", "wf"], &["y"]),
            ],
            vec![
                ints("flat", &[1, 8]),
                TensorProto {
                    name: Some("w".into()),
                    dims: vec![8],
                    data_type: Some(1),
                    float_data: vec![0.0; 8],
                    ..Default::default()
                },
            ],
            &[1, 8],
        );
        assert!(!row_findings(&m).is_empty(), "a fixed [1, 8] does not keep N rows");
        let out = dynamic_batch(&m).expect("batchable");
        let g = out.graph.as_ref().unwrap();
        assert_eq!(first_axis(&g.input[0]), Some(DimValue::DimParam(BATCH.into())));
        assert_eq!(first_axis(&g.output[0]), Some(DimValue::DimParam(BATCH.into())));
        assert!(g.value_info.is_empty());
        let reshaped = decode(&g.node[1]).unwrap();
        let copy = g.initializer.iter().find(|t| t.name.as_deref() == Some(reshaped.input[1].as_str())).unwrap();
        assert_eq!(copy.int64_data, vec![0, 8]);
        assert_eq!(decode(&g.node[2]).unwrap().input[1], "flat", "the weight's Reshape keeps its shape");
        assert_eq!(row_findings(&out), vec![]);
    }

    #[test]
    fn what_cannot_be_proved_is_refused_with_its_node() {
        // A token of a batch of one joined along axis 1: Concat cannot take N rows.
        let token = TensorProto {
            name: Some("t".into()),
            dims: vec![1, 1, 2],
            data_type: Some(1),
            float_data: vec![0.0; 2],
            ..Default::default()
        };
        let mut concat = n("Concat", &["t", "x"], &["y"]);
        concat.attribute.push(AttributeProto {
            name: Some("axis".into()),
            i: Some(1),
            r#type: Some(2),
            ..Default::default()
        });
        let m = model(vec![concat], vec![token], &[1, 5, 2]);
        let found = dynamic_batch(&m).unwrap_err();
        assert_eq!((found[0].node, found[0].op_type.as_str()), (Some(0), "Concat"));
        let fixed = ModelProto {
            graph: Some(GraphProto { input: vec![vi("x", &[2, 4])], ..Default::default() }),
            ..Default::default()
        };
        assert!(dynamic_batch(&fixed).unwrap_err()[0].reason.contains("fixed first axis of 2"));
        let none = ModelProto {
            graph: Some(GraphProto { input: vec![vi("x", &[4])], ..Default::default() }),
            ..Default::default()
        };
        let mut dynamic = none.clone();
        dynamic.graph.as_mut().unwrap().input[0] = crate::codec::testing::value_of("x", &["N"]);
        assert!(dynamic_batch(&dynamic).unwrap_err()[0].reason.contains("no input has a fixed first axis of 1"));
    }
}
