//! Reading a decoded graph: its value names, initializer names and real inputs.
use std::collections::HashSet;

use crate::codec::proto::{GraphProto, ModelProto, ValueInfoProto};

pub fn graph(m: &ModelProto) -> &GraphProto {
    m.graph.as_ref().expect("checked on entry")
}

pub fn vi_name(vi: &ValueInfoProto) -> &str {
    vi.name.as_deref().unwrap_or("")
}

pub fn initializer_names(m: &ModelProto) -> HashSet<&str> {
    let g = graph(m);
    g.initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .chain(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()?.name.as_deref()))
        .collect()
}

/// Graph inputs that are real inputs (IR < 4 models also list their initializers).
pub fn real_inputs(m: &ModelProto) -> Vec<&ValueInfoProto> {
    let inits = initializer_names(m);
    graph(m).input.iter().filter(|vi| !inits.contains(vi_name(vi))).collect()
}
