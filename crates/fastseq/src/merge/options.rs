//! What the caller asks of a composition: the linear form (`io_maps`, `keep_outputs`,
//! `inputs`, `outputs`) or the graph form (`edges`, `graph_inputs`, `graph_outputs`), and
//! the clean-ups (prune, dedupe, adapters) and metadata of the result.
use crate::error::{Error, Result};

use crate::codec::range::FileRange;

/// Exposed graph inputs: (name, the (stage, input) pairs it feeds).
pub type GraphInputs = Vec<(String, Vec<(usize, String)>)>;

/// Which outputs of the earlier models stay graph outputs besides the last model's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Keep {
    /// Only the last model's outputs.
    #[default]
    Last,
    /// Every output that no joint consumes.
    Unconsumed,
    /// These outputs (by the user's name), consumed or not.
    Names(Vec<String>),
}

/// Whose rules the linear form of two models follows where fastseq's and onnx.compose's
/// differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rules {
    #[default]
    Fastseq,
    /// `onnx.compose.merge_models`' result wherever onnx.compose succeeds (the merge layer's
    /// `onnx_rules`, which reads these options): the first model's unconsumed outputs kept, each model
    /// cut down to what `inputs`/`outputs` need as `onnx.utils.Extractor` cuts it, its
    /// model and graph fields, metadata merged with its conflict rule.
    OnnxCompose,
}

/// One joint of the linear form: the (output of model j, input of model j+1) pairs that
/// join two models, in the models' own names.
pub type IoMap = Vec<(String, String)>;

/// How to compose. The linear form (`io_maps`, `keep_outputs`, `inputs`, `outputs`) and the
/// graph form (`edges`, `graph_inputs`, `graph_outputs`) both become edges in the plan.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `io_maps[j]`: the (output of model j, input of model j+1) pairs of joint j, in the
    /// models' own names. `None` joins outputs to inputs by position, every joint or one.
    pub io_maps: Option<Vec<Option<IoMap>>>,
    pub keep_outputs: Keep,
    /// A prefix applied to every name of model i before merging (`onnx.compose` style).
    pub prefixes: Vec<Option<String>>,
    /// Restrict the merged graph's inputs / outputs to these names (`merge_models` style).
    pub inputs: Option<Vec<String>>,
    pub outputs: Option<Vec<String>>,
    /// Any earlier stage's output to any later stage's input (instead of io_maps).
    pub edges: Option<Vec<Edge>>,
    /// Exposed graph inputs: name -> the (stage, input) pairs it feeds. Unfed inputs not
    /// listed are exposed under their own name when unique, `label.input` when not.
    pub graph_inputs: Option<GraphInputs>,
    /// Exposed graph outputs: (name, stage, output). Without it: every output no edge consumes.
    pub graph_outputs: Option<Vec<(String, usize, String)>>,
    /// Leave out what no graph output needs. Default: on in the graph form, off in the linear one.
    pub prune: Option<bool>,
    /// Store identical weights of different stages once. Default: as `prune`.
    pub dedupe: Option<bool>,
    pub adapt: Adapt,
    /// Stamp this IR version instead of the highest of the models.
    pub ir_version: Option<i64>,
    pub graph_name: Option<String>,
    pub doc_string: Option<String>,
    pub producer_name: Option<String>,
    pub producer_version: Option<String>,
    pub domain: Option<String>,
    pub model_version: Option<i64>,
    pub rules: Rules,
    /// What an edge that an adapter would fix says to do, where adapters are off: the
    /// entry point's own remedy, `{}` standing for the adapter ("a Cast to float"). None:
    /// "pass adapt=True (or this edge's index in adapt) to insert a {}".
    pub adapt_remedy: Option<String>,
    /// Reads the bytes of a weight still in its source file (see [`crate::codec::range`]):
    /// how deduplication compares such weights. Without it they are left as they are.
    pub read_weight: Option<ReadWeight>,
}

/// Reads `buf.len()` bytes at an offset of a weight still in its source file.
pub type ReadWeight = fn(&FileRange, u64, &mut [u8]) -> crate::error::Result<()>;

impl Options {
    /// Whether the graph form is used (edges, graph inputs or graph outputs given).
    pub fn is_graph(&self) -> bool {
        self.edges.is_some() || self.graph_inputs.is_some() || self.graph_outputs.is_some()
    }

    /// Refuses options of the two forms mixed.
    pub fn check_form(&self) -> Result<()> {
        let graph_form = self.is_graph();
        if graph_form && (self.inputs.is_some() || self.outputs.is_some()) {
            return Err(Error::composition(
                "inputs/outputs restrict the linear form; with edges, graph_inputs or graph_outputs, \
                 name the exposed inputs and outputs there",
            ));
        }
        if graph_form && matches!(self.keep_outputs, Keep::Names(_)) {
            return Err(Error::composition(
                "keep_outputs with names applies to the linear form; with edges, graph_inputs or \
                 graph_outputs, list the outputs to expose in graph_outputs",
            ));
        }
        if self.edges.is_some() && self.io_maps.is_some() {
            return Err(Error::composition("pass either io_maps (a chain) or edges (a graph), not both"));
        }
        Ok(())
    }
}

/// One connection: output `output` of stage `from` feeds input `input` of stage `to`
/// (the stages' own names and their indices in the given order).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Edge {
    pub from: usize,
    pub output: String,
    pub to: usize,
    pub input: String,
}

/// Which edges may get an adapter (a Cast, an Unsqueeze or Squeeze of the leading axis)
/// where the two sides do not match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Adapt {
    /// None: a mismatch is an error that says which adapter would fix it.
    #[default]
    Off,
    All,
    /// These edges, by index into the edge list (the converted one for io_maps: joint by
    /// joint, pair by pair).
    Edges(Vec<usize>),
}

impl Adapt {
    pub(crate) fn covers(&self, edge: usize) -> bool {
        match self {
            Adapt::Off => false,
            Adapt::All => true,
            Adapt::Edges(set) => set.contains(&edge),
        }
    }
}
