//! Small models for the rows analysis' unit tests: nodes, integer weights, attributes, and
//! the findings as one line each.
use crate::codec::proto::{AttributeProto, ModelProto, NodeProto, TensorProto};
use crate::merge::rows::row_findings;

/// An INT64 weight: a scalar, or a vector of `v`.
pub(crate) fn ints(name: &str, v: &[i64], scalar: bool) -> TensorProto {
    let dims = if scalar { vec![] } else { vec![v.len() as i64] };
    TensorProto { name: Some(name.into()), dims, data_type: Some(7), int64_data: v.to_vec(), ..Default::default() }
}

/// An integer attribute.
pub(crate) fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), i: Some(i), r#type: Some(2), ..Default::default() }
}

/// A node named after its op and first output ("softmax_y").
pub(crate) fn node(op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{}_{}", op.to_lowercase(), outs[0])),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// The analysis' findings on `m`, "Op: reason" each.
pub(crate) fn findings(m: &ModelProto) -> Vec<String> {
    row_findings(m).into_iter().map(|f| format!("{}: {}", f.op_type, f.reason)).collect()
}
