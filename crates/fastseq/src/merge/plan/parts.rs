//! What a plan is made of: edges, where each value takes its final name from, the exposed
//! graph inputs and outputs, adapters, and what the merged graph keeps of each stage.
use rustc_hash::FxHashMap;

use crate::codec::graph::graph;
use crate::codec::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::codec::proto::{GraphProto, ModelProto};
use crate::merge::options::Edge;
use crate::merge::plan::adapters::Adapter;

/// Where a stage's value takes its final name from instead of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The final name of this value of an earlier stage (an edge, a deduplicated weight).
    Value(usize, String),
    /// The output of the adapter on this edge.
    Adapter(usize),
}

/// A graph input of the merged model.
#[derive(Debug, Clone)]
pub struct GraphInput {
    /// The exposed name; `None` keeps the stage's own name where no earlier stage claims
    /// it (the linear form), `m<i>/name` otherwise.
    pub name: Option<String>,
    /// The stage input whose type the graph input takes.
    pub stage: usize,
    pub index: usize,
    /// Every (stage, input) it feeds, the first one included.
    pub feeds: Vec<(usize, String)>,
    /// Named by the caller: kept even when pruning finds no use for it.
    pub explicit: bool,
    /// An initializer that an IR < 4 model lists as an input (not the user's).
    pub weight: bool,
}

/// A graph output of the merged model.
#[derive(Debug, Clone)]
pub struct GraphOutput {
    pub name: Option<String>,
    pub stage: usize,
    pub index: usize,
}

/// Per stage, which of its entries the merged graph keeps (all of them without pruning).
#[derive(Debug, Clone, Default)]
pub struct Kept {
    pub nodes: Vec<Vec<bool>>,
    pub initializers: Vec<Vec<bool>>,
    pub sparse: Vec<Vec<bool>>,
    pub value_info: Vec<Vec<bool>>,
}

/// What pruning left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Stages of which no requested output needs anything: no node, no output.
    pub stages: Vec<usize>,
    pub nodes: usize,
    pub initializers: usize,
    /// Graph inputs that nothing kept reads (by their exposed names).
    pub inputs: Vec<String>,
}

/// What the merged graph is made of, by index into each stage's own lists.
pub struct Plan {
    pub edges: Vec<Edge>,
    /// Per stage: values whose final name comes from elsewhere (edges, deduplication).
    pub alias: Vec<FxHashMap<String, Target>>,
    /// Per stage: values with a final name chosen here (exposed under another name).
    pub pinned: Vec<FxHashMap<String, String>>,
    /// Per stage: inputs not exposed as graph inputs because something else feeds them.
    pub fed_inputs: Vec<Vec<usize>>,
    pub inputs: Vec<GraphInput>,
    pub outputs: Vec<GraphOutput>,
    /// Per stage: outputs that an edge consumes and no graph output exposes (kept as value_info).
    pub internal_outputs: Vec<Vec<usize>>,
    /// Per stage: symbolic dims replaced by the one name, or the static size, their edges agree on.
    pub dims: Vec<FxHashMap<String, Dim>>,
    pub adapters: Vec<Adapter>,
    /// `None`: everything is kept (no pruning, nothing deduplicated).
    pub kept: Option<Kept>,
    pub pruned: PruneReport,
    /// Outputs that no edge consumes and no graph output exposes (graph form only).
    pub unused: Vec<(usize, String)>,
    /// Per stage (onnx.compose's rules): cut down as `onnx.utils.Extractor` cuts a graph.
    pub extracted: Vec<bool>,
    /// onnx.compose's rules: joints whose two sides disagree (element type, shape), which
    /// onnx.compose merges as they are: only onnx's checker can say whether the result holds.
    pub mismatches: Vec<String>,
}

impl Plan {
    /// The kept masks, all true until something is left out.
    pub fn kept_mut(&mut self, models: &[ModelProto]) -> &mut Kept {
        self.kept.get_or_insert_with(|| {
            let all = |f: &dyn Fn(&GraphProto) -> usize| -> Vec<Vec<bool>> {
                models.iter().map(|m| vec![true; f(graph(m))]).collect()
            };
            Kept {
                nodes: all(&|g| g.node.len()),
                initializers: all(&|g| g.initializer.len()),
                sparse: all(&|g| g.sparse_initializer.len()),
                value_info: all(&|g| g.value_info.len()),
            }
        })
    }
}
