//! Orchestration of a composition of decoded models: the plan (plan.rs) says what connects
//! to what, naming.rs gives every value and node its final name, names.rs renames, and
//! assemble.rs lays the result out.
use bumpalo::Bump;
use rustc_hash::{FxHashMap, FxHashSet};

use rayon::prelude::*;

use crate::assemble::{assemble, dedupe, Deduped};
use crate::error::{Error, Result};
use crate::names::{function_key, walk_model, NameSet, Renamer};
pub use crate::naming::Renamed;
use crate::naming::{assign_function_names, assign_node_names, assign_value_names, name_adapter_nodes, ValueNames};
use crate::opset::{merge_opsets, merged_ir_version};
use crate::plan::Plan;
pub use crate::plan::{elem_type_name, Adapt, Edge, PruneReport};
use crate::proto::ModelProto;

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

/// How to compose. The linear form (`io_maps`, `keep_outputs`, `inputs`, `outputs`) and the
/// graph form (`edges`, `graph_inputs`, `graph_outputs`) both become edges in the plan.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `io_maps[j]`: the (output of model j, input of model j+1) pairs of joint j, in the
    /// models' own names. `None` joins outputs to inputs by position.
    pub io_maps: Option<Vec<Vec<(String, String)>>>,
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
}

impl Options {
    /// Whether the graph form is used (edges, graph inputs or graph outputs given).
    pub fn is_graph(&self) -> bool {
        self.edges.is_some() || self.graph_inputs.is_some() || self.graph_outputs.is_some()
    }
}

/// What the composition did besides merging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub pruned: PruneReport,
    pub deduped: Deduped,
    /// (edge index, "Cast to float, Unsqueeze of axis 0").
    pub adapters: Vec<(usize, String)>,
    /// (stage, output) pairs that no edge consumes and no graph output exposes.
    pub unused_outputs: Vec<(usize, String)>,
}

/// Where the merged graph's parts come from, to translate runtime errors back.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    /// Per stage: (first node, end node) in the merged graph.
    pub nodes: Vec<(usize, usize)>,
    /// Per stage: its values' renames, then its nodes'.
    pub values: Vec<Renamed>,
    pub node_names: Vec<Renamed>,
}

/// A composed model with its report and origins.
#[derive(Debug, Clone, Default)]
pub struct Composition {
    pub model: ModelProto,
    pub report: Report,
    pub origins: Origins,
}

/// Composes `models` (in order) into one model. `labels` name the models in errors.
pub fn compose(models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<ModelProto> {
    compose_graph(models, labels, opts).map(|c| c.model)
}

/// Like [`compose`], with what was pruned, deduplicated and adapted, and where each part
/// of the merged graph came from.
pub fn compose_graph(models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<Composition> {
    crate::pool::install(|| compose_models(models, labels, opts))
}

fn compose_models(mut models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<Composition> {
    let n = models.len();
    if n == 0 {
        return Err(Error::composition("no models to compose"));
    }
    if labels.len() != n {
        return Err(Error::composition(format!("{n} models but {} labels: one label per model", labels.len())));
    }
    for (m, label) in models.iter().zip(labels) {
        if m.graph.is_none() {
            return Err(Error::load(format!("{label}: the model has no graph")));
        }
    }
    let prefixed = apply_prefixes(&mut models, opts);
    let opts = prefixed.as_ref().unwrap_or(opts);
    let opset_import = merge_opsets(&models, labels)?;
    let ir_version = match opts.ir_version {
        Some(v) if v <= 0 || v > crate::model::MAX_IR_VERSION => {
            return Err(Error::composition(format!(
                "target IR version {v} is out of range (1..={})",
                crate::model::MAX_IR_VERSION
            )))
        }
        Some(v) => v,
        None => merged_ir_version(&models),
    };
    let mut plan = Plan::new(&models, labels, opts)?;
    let deduped = if opts.dedupe.unwrap_or(opts.is_graph()) { dedupe(&models, &mut plan) } else { Deduped::default() };

    // Per model, arenas for its names and for the fresh value and node names it gets. (An
    // arena is used by one thread at a time, hence one per model and per task.)
    let arenas = || -> Vec<Bump> { (0..n).map(|_| Bump::new()).collect() };
    let (mut name_arenas, mut value_arenas, mut node_arenas) = (arenas(), arenas(), arenas());
    let names: Vec<NameSet> =
        models.par_iter_mut().zip(&mut name_arenas).map(|(m, arena)| NameSet::of(m, arena)).collect();
    // Values and node names are separate namespaces: assigned side by side.
    let mut extra = Bump::new();
    let (values, nodes) = rayon::join(
        || assign_value_names(&models, &names, &plan, value_arenas.iter_mut().collect(), &mut extra),
        || assign_node_names(&names, node_arenas.iter_mut().collect()),
    );
    let ValueNames { maps: value_maps, adapters, renamed: value_renamed } = values;
    let (node_maps, node_renamed): (Vec<_>, Vec<_>) = nodes.into_iter().unzip();
    let adapters = name_adapter_nodes(adapters, &plan, &names);
    let mut renamers: Vec<Renamer> = value_maps
        .into_iter()
        .zip(node_maps)
        .map(|(values, nodes)| Renamer { values, nodes, ..Default::default() })
        .collect();
    let dropped_functions = assign_function_names(&models, &mut renamers);
    models.par_iter_mut().zip(renamers.par_iter_mut()).for_each(|(m, r)| {
        if !r.is_identity() {
            walk_model(m, r)
        }
    });
    drop((renamers, names));
    // Freeing the arenas is off the caller's path.
    crate::pool::spawn(move || drop((name_arenas, value_arenas, node_arenas, extra)));

    let (model, ranges) = assemble(models, &plan, &adapters, dropped_functions, opset_import, ir_version, opts);
    let report = Report {
        pruned: plan.pruned.clone(),
        deduped,
        adapters: plan.adapters.iter().map(|a| (a.edge, a.describe())).collect(),
        unused_outputs: plan.unused.clone(),
    };
    let origins = Origins { nodes: ranges, values: value_renamed, node_names: node_renamed };
    Ok(Composition { model, report, origins })
}

/// Applies `opts.prefixes` to every name of the models, as `onnx.compose.merge_models(
/// prefix1=..., prefix2=...)` does. Returns the options with the stage names they refer to
/// prefixed too, or `None` when there are no prefixes.
fn apply_prefixes(models: &mut [ModelProto], opts: &Options) -> Option<Options> {
    let prefix = |i: usize| opts.prefixes.get(i).cloned().flatten().filter(|p| !p.is_empty());
    if (0..models.len()).all(|i| prefix(i).is_none()) {
        return None;
    }
    models.par_iter_mut().enumerate().for_each(|(i, m)| {
        if let Some(p) = prefix(i) {
            let (arena, fresh) = (Bump::new(), Bump::new());
            let names = NameSet::of(m, &arena);
            let mut r = Renamer {
                values: prefixed(&names.values, &p, &fresh),
                nodes: prefixed(&names.nodes, &p, &fresh),
                functions: m
                    .functions
                    .iter()
                    .map(|f| {
                        let key = function_key(f);
                        let new = format!("{p}{}", key.1);
                        (key, new)
                    })
                    .collect(),
            };
            walk_model(m, &mut r);
        }
    });
    let name = |stage: usize, s: &str| prefix(stage).map_or_else(|| s.to_string(), |p| format!("{p}{s}"));
    let mut out = opts.clone();
    out.io_maps = opts.io_maps.as_ref().map(|maps| {
        maps.iter()
            .enumerate()
            .map(|(j, pairs)| pairs.iter().map(|(o, i)| (name(j, o), name(j + 1, i))).collect())
            .collect()
    });
    out.edges = opts.edges.as_ref().map(|edges| {
        edges
            .iter()
            .map(|e| Edge { from: e.from, output: name(e.from, &e.output), to: e.to, input: name(e.to, &e.input) })
            .collect()
    });
    out.graph_inputs = opts.graph_inputs.as_ref().map(|gi| {
        gi.iter().map(|(n, feeds)| (n.clone(), feeds.iter().map(|(s, i)| (*s, name(*s, i))).collect())).collect()
    });
    out.graph_outputs =
        opts.graph_outputs.as_ref().map(|go| go.iter().map(|(n, s, o)| (n.clone(), *s, name(*s, o))).collect());
    Some(out)
}

fn prefixed<'a>(names: &FxHashSet<&'a str>, prefix: &str, arena: &'a Bump) -> FxHashMap<&'a str, &'a str> {
    names.iter().map(|&v| (v, &*arena.alloc_str(&format!("{prefix}{v}")))).collect()
}

/// Small models and option builders shared by the unit tests of the composition modules.
#[cfg(test)]
pub(crate) mod testing {
    pub(crate) use std::collections::HashSet;

    pub(crate) use crate::assemble::Deduped;
    pub(crate) use crate::compose::{compose, compose_graph, Adapt, Edge, Options, PruneReport};
    pub(crate) use crate::error::Kind;
    pub(crate) use crate::plan::vi_name;
    pub(crate) use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    pub(crate) use crate::proto::{
        tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto, ValueInfoProto,
    };

    pub(crate) fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
        let shape = TensorShapeProto {
            dim: dims
                .iter()
                .map(|d| tensor_shape_proto::Dimension { value: Some(Dim::DimValue(*d)), denotation: None })
                .collect(),
        };
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(elem),
                    shape: Some(shape),
                })),
                denotation: None,
            }),
            ..Default::default()
        }
    }

    pub(crate) fn node(op: &str, ins: &[&str], outs: &[&str]) -> bytes::Bytes {
        crate::node::encode(&node_proto(op, ins, outs))
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
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
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
        names.extend(g.node.iter().flat_map(|n| crate::node::decode(n).unwrap().output));
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
        crate::node::decode(&g.node[k]).unwrap()
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
        let err = compose_graph(models, &labels(n), opts).unwrap_err();
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
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::testing::*;
    use crate::proto::{attribute_proto::AttributeType, AttributeProto};

    #[test]
    fn chain_renames_only_clashing_internal_names() {
        let merged = compose(vec![scale(1), scale(1), scale(1)], &labels(3), &Options::default()).unwrap();
        let g = merged.graph.unwrap();
        assert_eq!(g.input.iter().map(vi_name).collect::<Vec<_>>(), ["x"]);
        assert_eq!(g.output.iter().map(vi_name).collect::<Vec<_>>(), ["y"]);
        let defined = defined_names(&g);
        let unique: HashSet<&String> = defined.iter().collect();
        assert_eq!(unique.len(), defined.len(), "SSA: {defined:?}");
        let node = |k: usize| crate::node::decode(&g.node[k]).unwrap();
        assert_eq!(node(2).input, ["m0/y", "m1/c"]);
        assert_eq!(node(3).name.as_deref(), Some("m1/relu"));
        // The crossing tensors keep their types.
        assert_eq!(g.value_info.iter().map(vi_name).collect::<Vec<_>>(), ["m0/y", "m1/y"]);
    }

    #[test]
    fn outer_scope_reads_in_subgraphs_follow_the_rename() {
        let mut m = scale(1);
        let then = GraphProto {
            node: vec![node("Mul", &["x", "c"], &["out"])],
            output: vec![vi("out", 1, &[2, 4])],
            ..Default::default()
        };
        let g = m.graph.as_mut().unwrap();
        g.node[1] = crate::node::encode(&NodeProto {
            attribute: vec![AttributeProto {
                name: Some("then_branch".into()),
                r#type: Some(AttributeType::Graph as i32),
                g: Some(then),
                ..Default::default()
            }],
            ..node_proto("If", &["t"], &["y"])
        });
        let merged = compose(vec![m.clone(), m], &labels(2), &Options::default()).unwrap();
        let g = merged.graph.unwrap();
        let if_node = crate::node::decode(&g.node[3]).unwrap();
        let sub = crate::node::decode(&if_node.attribute[0].g.as_ref().unwrap().node[0]).unwrap();
        assert_eq!(sub.input, ["m0/y", "m1/c"]);
        assert_eq!(sub.output, ["m1/out"]);
    }

    #[test]
    fn joint_errors_are_typed_and_use_user_names() {
        let opts = Options { io_maps: Some(vec![vec![("y".into(), "X".into())]]), ..Default::default() };
        let err = compose(vec![scale(1), scale(1)], &labels(2), &opts).unwrap_err();
        assert_eq!(err.kind, Kind::Composition);
        assert!(err.message.contains("'X' is not an input of m1.onnx (did you mean 'x'?)"), "{}", err.message);
        let err = compose(vec![scale(1), scale(11)], &labels(2), &Options::default()).unwrap_err();
        assert!(err.message.contains("output 'y' is float but input 'x' expects double"), "{}", err.message);
    }

    #[test]
    fn fifty_models_cost_linear_work() {
        let merged = compose((0..50).map(|_| scale(1)).collect(), &labels(50), &Options::default()).unwrap();
        let g = merged.graph.unwrap();
        assert_eq!(g.node.len(), 100);
        let defined = defined_names(&g);
        assert_eq!(defined.iter().collect::<HashSet<_>>().len(), defined.len());
    }

    #[test]
    fn streamed_file_decodes_to_the_same_model() {
        let merged = compose(vec![scale(1), scale(1)], &labels(2), &Options::default()).unwrap();
        let mut streamed = Vec::new();
        crate::model::write_streaming(&merged, &mut streamed).unwrap();
        assert_eq!(streamed.len(), merged.encoded_len());
        let back = crate::model::decode("streamed", bytes::Bytes::from(streamed)).unwrap();
        assert_eq!(back, merged);
    }

    #[test]
    fn bad_bytes_are_load_errors() {
        use crate::model::decode;
        assert!(decode("e", bytes::Bytes::new()).unwrap_err().message.contains("empty input"));
        let err = decode("junk", bytes::Bytes::from_static(b"\xff\xff\xff\xff")).unwrap_err();
        assert_eq!(err.kind, Kind::Load);
        assert!(err.message.starts_with("junk: not a valid ONNX model"));
        let mut full = Vec::new();
        scale(1).encode(&mut full).unwrap();
        full.truncate(full.len() - 3);
        assert_eq!(decode("cut", bytes::Bytes::from(full)).unwrap_err().kind, Kind::Load);
    }

    #[test]
    fn fan_out_fan_in_and_a_skip() {
        // pre -> left, pre -> right, (left, right, pre) -> join.
        let models = vec![distinct(1.0), distinct(2.0), distinct(3.0), join("Sum", &["a", "b", "s"])];
        let edges = vec![
            edge(0, "y", 1, "x"),
            edge(0, "y", 2, "x"),
            edge(1, "y", 3, "a"),
            edge(2, "y", 3, "b"),
            edge(0, "y", 3, "s"),
        ];
        let c = compose_graph(models, &labels(4), &graph_opts(edges, &[("out", 3, "y")])).unwrap();
        let g = c.model.graph.unwrap();
        assert_eq!(names(&g.input), ["x"]);
        assert_eq!(names(&g.output), ["out"]);
        assert_eq!(g.node.len(), 7);
        let defined = defined_names(&g);
        assert_eq!(defined.iter().collect::<HashSet<_>>().len(), defined.len(), "SSA: {defined:?}");
        // Both branches read pre's output; the join reads both branches and pre's output.
        // (pre's 'y' keeps its name: no exposed name claims it.)
        assert_eq!(node_at(&g, 2).input, ["y", "m1/c"]);
        assert_eq!(node_at(&g, 4).input, ["y", "m2/c"]);
        assert_eq!(node_at(&g, 6).input, ["m1/y", "m2/y", "y"]);
        assert_eq!(node_at(&g, 6).output, ["out"]);
        assert!(c.report.unused_outputs.is_empty() && c.report.pruned == PruneReport::default());
        assert_eq!(c.origins.nodes, [(0, 2), (2, 4), (4, 6), (6, 7)]);
    }

    #[test]
    fn unfed_inputs_keep_their_names_when_unique() {
        let opts = Options { edges: Some(vec![]), ..Default::default() };
        let mut other = join("Neg", &["z"]);
        let g = other.graph.as_mut().unwrap();
        g.output[0].name = Some("w".into());
        g.node = vec![node("Neg", &["z"], &["w"])];
        let c = compose_graph(vec![distinct(1.0), other], &labels(2), &opts).unwrap();
        let g = c.model.graph.unwrap();
        assert_eq!(names(&g.input), ["x", "z"]);
        assert_eq!(names(&g.output), ["y", "w"]);
    }
}
