//! Small models and option builders shared by the unit tests of the merge modules.
pub(crate) use std::collections::HashSet;

pub(crate) use crate::codec::graph::vi_name;
pub(crate) use crate::codec::proto::tensor_shape_proto::dimension::Value as Dim;
pub(crate) use crate::codec::proto::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
pub(crate) use crate::error::Kind;
pub(crate) use crate::merge::compose::compose;
pub(crate) use crate::merge::dedupe::Deduped;
pub(crate) use crate::merge::options::{Adapt, Edge, Options};
pub(crate) use crate::merge::plan::parts::PruneReport;

pub(crate) fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let shape = TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| tensor_shape_proto::Dimension {
                value: Some(Dim::DimValue(*d)),
                denotation: None,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(shape),
                ..Default::default()
            })),
            denotation: None,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn node(op: &str, ins: &[&str], outs: &[&str]) -> bytes::Bytes {
    crate::codec::node::encode(&node_proto(op, ins, outs))
}

pub(crate) fn node_proto(op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: Some(op.to_lowercase()),
        ..Default::default()
    }
}

/// y = Relu(x * c), with an initializer 'c' and an internal 't'.
pub(crate) fn scale(elem: i32) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: crate::codec::testing::opset17(),
        graph: Some(GraphProto {
            name: Some("scale".into()),
            node: vec![node("Mul", &["x", "c"], &["t"]), node("Relu", &["t"], &["y"])],
            initializer: vec![TensorProto {
                name: Some("c".into()),
                dims: vec![4],
                data_type: Some(elem),
                raw_data: Some(bytes::Bytes::from(vec![0u8; 16])),
                ..Default::default()
            }],
            input: vec![vi("x", elem, &[2, 4])],
            output: vec![vi("y", elem, &[2, 4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn labels(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}.onnx")).collect()
}

pub(crate) fn defined_names(g: &GraphProto) -> Vec<String> {
    let mut names: Vec<String> = g.input.iter().map(|v| vi_name(v).to_string()).collect();
    names.extend(g.initializer.iter().map(|t| t.name.clone().unwrap()));
    names.extend(g.node.iter().flat_map(|n| crate::codec::node::decode(n).unwrap().output));
    names
}

/// A model of one node over same-shaped float tensors: `op(ins...) -> y`.
pub(crate) fn join(op: &str, ins: &[&str]) -> ModelProto {
    let mut m = scale(1);
    let g = m.graph.as_mut().unwrap();
    g.node = vec![node(op, ins, &["y"])];
    g.initializer.clear();
    g.input = ins.iter().map(|i| vi(i, 1, &[2, 4])).collect();
    m
}

pub(crate) fn edge(from: usize, output: &str, to: usize, input: &str) -> Edge {
    Edge { from, output: output.into(), to, input: input.into() }
}

pub(crate) fn graph_opts(edges: Vec<Edge>, outputs: &[(&str, usize, &str)]) -> Options {
    Options {
        edges: Some(edges),
        graph_outputs: Some(outputs.iter().map(|(n, s, o)| (n.to_string(), *s, o.to_string())).collect()),
        ..Default::default()
    }
}

pub(crate) fn node_at(g: &GraphProto, k: usize) -> NodeProto {
    crate::codec::node::decode(&g.node[k]).unwrap()
}

pub(crate) fn names(vis: &[ValueInfoProto]) -> Vec<&str> {
    vis.iter().map(vi_name).collect()
}

pub(crate) fn distinct(c: f32) -> ModelProto {
    let mut m = scale(1);
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    t.raw_data = Some(bytes::Bytes::from(c.to_le_bytes().repeat(4)));
    m
}

pub(crate) fn composition_error(models: Vec<ModelProto>, opts: &Options) -> String {
    let n = models.len();
    let err = compose(models, &labels(n), opts).unwrap_err();
    assert_eq!(err.kind, Kind::Composition);
    err.message
}

pub(crate) fn with_shape(mut m: ModelProto, input: &[i64], output: &[i64], elem: i32) -> ModelProto {
    let g = m.graph.as_mut().unwrap();
    g.input[0] = vi("x", elem, input);
    g.output[0] = vi("y", elem, output);
    m
}

pub(crate) fn symbolic(m: &mut ModelProto, input: &str, output: &str) {
    let g = m.graph.as_mut().unwrap();
    for (vi, p) in [(&mut g.input[0], input), (&mut g.output[0], output)] {
        let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_mut().unwrap().value.as_mut() else { panic!() };
        t.shape.as_mut().unwrap().dim[0].value = Some(Dim::DimParam(p.into()));
    }
}
