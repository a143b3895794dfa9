//! A short description of one model (inputs, outputs, opsets, counts, sizes), for
//! `fastseq inspect`, `repr` and the plan that a composition hands back.

use crate::codec::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::codec::proto::type_proto::Value;
use crate::codec::proto::{GraphProto, ModelProto, ValueInfoProto};
use crate::codec::tensor::elem_type_name;

/// A short description of a model, for `fastseq inspect` and `repr`.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    pub nodes: usize,
    pub initializers: usize,
    pub weight_bytes: u64,
    pub functions: usize,
    pub encoded_len: u64,
}

/// One dimension of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DimInfo {
    Static(i64),
    Symbolic(String),
    Unknown,
}

/// A graph input or output: its name, its element type in numpy's spelling (`float32`,
/// `int64`; `non-tensor` or `?` when it is not a tensor or has no type) and its dims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoInfo {
    pub name: String,
    pub dtype: String,
    pub dims: Vec<DimInfo>,
}

/// An element type in numpy's spelling, as `TensorInfo` prints it.
pub fn numpy_dtype(elem_type: i32) -> String {
    match elem_type_name(elem_type).as_str() {
        "float" => "float32".to_string(),
        "double" => "float64".to_string(),
        other => other.to_string(),
    }
}

/// What a summary says of one graph input or output.
pub fn io_info(vi: &ValueInfoProto) -> IoInfo {
    let name = vi.name.clone().unwrap_or_default();
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(t)) => {
            let dims = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(Dim::DimValue(v)) => DimInfo::Static(*v),
                            Some(Dim::DimParam(p)) => DimInfo::Symbolic(p.clone()),
                            None => DimInfo::Unknown,
                        })
                        .collect()
                })
                .unwrap_or_default();
            IoInfo { name, dtype: numpy_dtype(t.elem_type.unwrap_or(0)), dims }
        }
        Some(_) => IoInfo { name, dtype: "non-tensor".into(), dims: Vec::new() },
        None => IoInfo { name, dtype: "?".into(), dims: Vec::new() },
    }
}

pub fn summary(model: &ModelProto) -> Summary {
    fn count(g: &GraphProto, s: &mut Summary) {
        s.nodes += g.node.len();
        for t in &g.initializer {
            s.initializers += 1;
            s.weight_bytes += t.raw_data.as_ref().map_or(0, |r| r.len() as u64);
            s.weight_bytes += t
                .external_data
                .iter()
                .find(|e| e.key.as_deref() == Some("length"))
                .and_then(|e| e.value.as_deref()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        for raw in g.node.iter().filter(|raw| crate::codec::node::has_tensors_or_graphs(raw)) {
            let Ok(n) = crate::codec::node::decode(raw) else { continue };
            for a in &n.attribute {
                a.g.iter().chain(a.graphs.iter()).for_each(|sub| count(sub, s));
                s.weight_bytes += a.t.as_ref().and_then(|t| t.raw_data.as_ref()).map_or(0, |r| r.len() as u64);
            }
        }
    }
    let mut s = Summary {
        ir_version: model.ir_version.unwrap_or(0),
        producer: format!("{} {}", model.producer_name(), model.producer_version()).trim().to_string(),
        opsets: model
            .opset_import
            .iter()
            .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(0)))
            .collect(),
        functions: model.functions.len(),
        encoded_len: crate::codec::range::inline_len(model) as u64,
        ..Default::default()
    };
    if let Some(g) = &model.graph {
        s.inputs = g.input.iter().map(io_info).collect();
        s.outputs = g.output.iter().map(io_info).collect();
        count(g, &mut s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::testing::sample_model;

    #[test]
    fn a_summary_names_types_as_numpy_does() {
        let s = summary(&sample_model());
        let x = &s.inputs[0];
        assert_eq!((x.name.as_str(), x.dtype.as_str(), x.dims.as_slice()), ("x", "float32", &[DimInfo::Static(4)][..]));
        assert_eq!((s.nodes, s.initializers, s.functions), (4, 2, 1), "subgraph nodes count");
        assert_eq!(s.weight_bytes, 16 + 8192 + 16, "the Constant's tensor counts");
    }
}
