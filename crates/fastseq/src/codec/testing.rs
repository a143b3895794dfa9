//! A small model with a bit of everything the codec handles, for the codec's unit tests:
//! nodes kept as bytes (one holding a subgraph and a tensor), weights, value_info, a local
//! function, metadata.
use bytes::Bytes;

use crate::codec::node;
use crate::codec::proto::attribute_proto::AttributeType;
use crate::codec::proto::tensor_shape_proto::{dimension::Value as Dim, Dimension};
use crate::codec::proto::{
    type_proto, AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// The default domain at opset 17, as the tests' models import it.
pub(crate) fn opset17() -> Vec<OperatorSetIdProto> {
    vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17), ..Default::default() }]
}

pub(crate) fn value(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    value_of(name, &dims.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A float32 value info with dims: numbers, or names for symbolic dims ("N").
pub(crate) fn value_of(name: &str, dims: &[&str]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(d.parse::<i64>().map_or_else(|_| Dim::DimParam(d.to_string()), Dim::DimValue)),
            denotation: None,
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto { dim, ..Default::default() }),
                ..Default::default()
            })),
            denotation: None,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn weight(name: &str, n: usize, fill: u8) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![n as i64],
        data_type: Some(1),
        raw_data: Some(Bytes::from(vec![fill; 4 * n])),
        ..Default::default()
    }
}

fn op(op_type: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op_type.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: Some(op_type.to_lowercase()),
        ..Default::default()
    }
}

/// y = If(c) { Mul(x, w) } else { Constant }, after t = Add(x, w).
pub(crate) fn sample_model() -> ModelProto {
    let then = GraphProto {
        name: Some("then".into()),
        node: vec![node::encode(&op("Mul", &["t", "w"], &["a"]))],
        output: vec![value("a", &[4])],
        ..Default::default()
    };
    let constant = AttributeProto {
        name: Some("value".into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(weight("k", 4, 3)),
        ..Default::default()
    };
    let other = GraphProto {
        name: Some("else".into()),
        node: vec![node::encode(&NodeProto { attribute: vec![constant], ..op("Constant", &[], &["a"]) })],
        output: vec![value("a", &[4])],
        ..Default::default()
    };
    let branch = |name: &str, g: GraphProto| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..Default::default()
    };
    let if_node = NodeProto {
        attribute: vec![branch("then_branch", then), branch("else_branch", other)],
        ..op("If", &["c"], &["y"])
    };
    ModelProto {
        ir_version: Some(8),
        producer_name: Some("fastseq tests".into()),
        opset_import: opset17(),
        metadata_props: vec![StringStringEntryProto {
            key: Some("k".into()),
            value: Some("v".into()),
            ..Default::default()
        }],
        functions: vec![FunctionProto {
            name: Some("f".into()),
            domain: Some("local".into()),
            input: vec!["p".into()],
            output: vec!["q".into()],
            node: vec![op("Relu", &["p"], &["q"])],
            ..Default::default()
        }],
        graph: Some(GraphProto {
            name: Some("sample".into()),
            node: vec![node::encode(&op("Add", &["x", "w"], &["t"])), node::encode(&if_node)],
            initializer: vec![weight("w", 4, 1), weight("big", 2048, 7)],
            input: vec![value("x", &[4]), value("c", &[])],
            output: vec![value("y", &[4])],
            value_info: vec![value("t", &[4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}
