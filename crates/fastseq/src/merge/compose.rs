//! The entry point of a composition of decoded models: the plan ([`crate::merge::plan`])
//! says what connects to what, [`crate::merge::final_names`] gives every value and node its
//! final name, [`crate::merge::rename`] renames, and [`crate::merge::assemble`] lays the
//! result out.
use std::borrow::Cow;

use bumpalo::Bump;
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::model::MAX_IR_VERSION;
use crate::codec::node;
use crate::codec::proto::ModelProto;
use crate::codec::structure::naming_problem;
use crate::error::{Error, Result};
use crate::merge::assemble::assemble;
use crate::merge::dedupe::{dedupe, Deduped};
use crate::merge::final_names::{
    assign_function_names, assign_node_names, assign_value_names, name_adapter_nodes, name_unnamed_nodes,
    unnamed_nodes, Renamed, ValueNames,
};
use crate::merge::metadata::with_metadata;
use crate::merge::onnx_rules::{free_names, Frame};
use crate::merge::opsets::{merge_opsets, merged_ir_version};
use crate::merge::options::{Edge, Options, Rules};
use crate::merge::plan::build::build_plan;
use crate::merge::plan::parts::PruneReport;
use crate::merge::plan::prune::leave_out;
use crate::merge::plan::view::PlanView;
use crate::merge::plan::wiring::{check_wiring, in_graph_order};
use crate::merge::rename::{function_key, name_unnamed, walk_model, NameSet, Renamer};
use crate::merge::stage_map::{self, Stage};

/// What the composition did besides merging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub pruned: PruneReport,
    pub deduped: Deduped,
    /// (edge index, "Cast to float, Unsqueeze of axis 0").
    pub adapters: Vec<(usize, String)>,
    /// (stage, output) pairs that no edge consumes and no graph output exposes.
    pub unused_outputs: Vec<(usize, String)>,
    /// onnx.compose's rules: why the merge cannot vouch that the result passes onnx's
    /// checker although the models do (a joint whose sides disagree, differing IR
    /// versions, a naming rule broken); empty when it can. See `codec::structure`.
    pub unproven: Vec<String>,
}

/// Where the merged graph's parts come from, to translate runtime errors back.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    /// Per stage: (first node, end node) in the merged graph. The adapters on a stage's
    /// incoming edges come first in its range: an error in one is the stage's input.
    pub nodes: Vec<(usize, usize)>,
    /// Per stage: how many nodes at the start of its range the merge inserted (adapters),
    /// which are glue between stages rather than the stage's own work (see `profile`).
    pub inserted: Vec<usize>,
    /// Per stage: its values' renames, then its nodes'.
    pub values: Vec<Renamed>,
    pub node_names: Vec<Renamed>,
    /// The stages' labels, in the order of `nodes`: the composition's, or those of the
    /// stage map of the one model composed (see [`crate::merge::stage_map`]).
    pub labels: Vec<String>,
    /// Why the stage map the model holds was ignored (it does not fit its nodes), if it was.
    pub note: Option<String>,
}

impl Origins {
    /// Every renamed value or node name of the merged graph, with the stage it comes from
    /// and its name there: values first, then node names. A graph input feeding several
    /// stages is given for the first.
    pub fn renamed(&self) -> Vec<(&str, usize, &str)> {
        let mut seen: FxHashSet<&str> = FxHashSet::default();
        let stages = self.values.len().max(1);
        let mut out = Vec::new();
        for (k, renamed) in self.values.iter().chain(&self.node_names).enumerate() {
            for (new, old) in renamed.iter() {
                if seen.insert(new) {
                    out.push((new, k % stages, old));
                }
            }
        }
        out
    }
}

/// A composed model with its plan, report and origins.
#[derive(Debug, Clone, Default)]
pub struct Composition {
    pub model: ModelProto,
    /// The stages' labels in graph order (the order of `origins` and of the report's stage
    /// indices).
    pub labels: Vec<String>,
    /// The plan as decided: see [`PlanView`].
    pub plan: PlanView,
    pub report: Report,
    pub origins: Origins,
}

impl Composition {
    /// One model on its own, as a composition of one stage: its plan exposes its inputs
    /// and outputs as they are. A stage map in its metadata that fits its nodes gives the
    /// origins its stages (a model that fastseq composed and wrote); one that does not fit is
    /// ignored, with a note.
    pub fn single(model: ModelProto, label: &str) -> Composition {
        let plan = PlanView::single(&model, label);
        let mut origins = Origins::default();
        if let Some(parsed) = stage_map::parse(&model) {
            take_stage_map(&mut origins, parsed, &model);
        }
        Composition { model, labels: vec![label.to_string()], plan, origins, ..Default::default() }
    }

    /// The stages, in graph order, as the stage map writes them.
    pub fn stages(&self) -> Vec<Stage> {
        let o = &self.origins;
        o.nodes
            .iter()
            .enumerate()
            .map(|(k, &(first, end))| Stage {
                label: o.labels.get(k).or(self.labels.get(k)).cloned().unwrap_or_default(),
                first,
                end,
                inserted: o.inserted.get(k).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Every top-level node of the model, in order, with the stage it belongs to by
    /// position (see [`Composition::stages`]): None for the nodes the merge inserted between
    /// stages (adapters) and for a model without stages.
    pub fn nodes(&self) -> Vec<NodeOrigin> {
        let Some(g) = self.model.graph.as_ref() else { return Vec::new() };
        let mut stage = vec![None; g.node.len()];
        for (k, s) in self.stages().iter().enumerate() {
            let first = (s.first + s.inserted).min(s.end);
            for x in stage.iter_mut().take(s.end).skip(first) {
                *x = Some(k);
            }
        }
        g.node
            .iter()
            .zip(stage)
            .map(|(raw, stage)| {
                let (name, op, domain) = node::head(raw);
                NodeOrigin { name: name.into_owned(), op_type: op.into_owned(), domain: domain.into_owned(), stage }
            })
            .collect()
    }

    /// The model as fastseq writes it to a file: its stage map in its metadata (see
    /// [`crate::merge::stage_map`]) when it has two stages or more; a map it holds otherwise
    /// (read with it, and ignored) is left out, since it does not fit.
    pub fn for_file(&self) -> Cow<'_, ModelProto> {
        let map = stage_map::encode(&self.stages(), &self.model);
        let held = self.model.metadata_props.iter().any(|p| p.key.as_deref() == Some(stage_map::KEY));
        match map {
            Some(map) => Cow::Owned(with_metadata(&self.model, &[(stage_map::KEY.to_string(), map)])),
            None if held => {
                let mut model = self.model.clone();
                model.metadata_props.retain(|p| p.key.as_deref() != Some(stage_map::KEY));
                Cow::Owned(model)
            }
            None => Cow::Borrowed(&self.model),
        }
    }
}

/// One top-level node of a composed model: its name, op_type and domain, and its stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOrigin {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// The index of its stage in [`Composition::stages`]; None for an adapter or a model
    /// without stages.
    pub stage: Option<usize>,
}

/// Origins from a parsed stage map that fits `model`'s nodes, or the note saying why not.
fn take_stage_map(origins: &mut Origins, parsed: stage_map::Parsed, model: &ModelProto) {
    let Some(g) = model.graph.as_ref() else { return };
    match parsed.and_then(|p| stage_map::fit(p, g)) {
        Ok(stages) => {
            origins.nodes = stages.iter().map(|s| (s.first, s.end)).collect();
            origins.inserted = stages.iter().map(|s| s.inserted).collect();
            origins.values = vec![Renamed::default(); stages.len()];
            origins.node_names = vec![Renamed::default(); stages.len()];
            origins.labels = stages.into_iter().map(|s| s.label).collect();
        }
        Err(note) => origins.note = Some(note),
    }
}

/// Composes `models` into one model, with the plan as decided, what was pruned,
/// deduplicated and adapted, and where each part of the merged graph came from. `labels`
/// name the models in errors. The linear form takes the models in the given order; the
/// graph form in an order where every edge goes forward, the given one where the edges
/// allow. Runs on the process's thread pool.
pub fn compose(models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<Composition> {
    crate::pool::install(|| run_steps(models, labels, opts))
}

/// The steps of a composition, in order: wiring and order, plan, dedupe, leave out what is
/// not kept, final names, rename, assemble.
fn run_steps(mut models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<Composition> {
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
    opts.check_form()?;
    let prefixed = apply_prefixes(&mut models, opts);
    let opts = prefixed.as_ref().unwrap_or(opts);
    let opset_import = merge_opsets(&models, labels)?;
    let ir_versions: FxHashSet<i64> = models.iter().map(|m| m.ir_version.unwrap_or(0)).collect();
    let ir_version = match opts.ir_version {
        Some(v) if v <= 0 || v > MAX_IR_VERSION => {
            return Err(Error::composition(format!("target IR version {v} is out of range (1..={})", MAX_IR_VERSION)))
        }
        Some(v) => v,
        None => merged_ir_version(&models),
    };
    // The graph form: the wiring checked in the caller's terms, the stages in graph order.
    let graph_form = opts.is_graph();
    let (mut models, labels, ordered, given) = if graph_form {
        let wiring = check_wiring(&models, labels, opts)?;
        let (models, labels, ordered) = in_graph_order(models, labels, opts, &wiring);
        (models, labels, Some(ordered), wiring.order)
    } else {
        (models, labels.to_vec(), None, (0..n).collect())
    };
    let opts = ordered.as_ref().unwrap_or(opts);
    let labels = &labels[..];
    let mut plan = build_plan(&models, labels, opts)?;
    let deduped = if opts.dedupe.unwrap_or(opts.is_graph()) {
        dedupe(&models, &mut plan, opts.read_weight)
    } else {
        Deduped::default()
    };
    let declared = PlanView::declared_io(&models);
    // The stage map of a model composed on its own (the merged graph drops the stages' maps).
    let one_map = if n == 1 && opts.rules == Rules::Fastseq { stage_map::parse(&models[0]) } else { None };
    // fastseq's own compositions name the nodes that have none (onnx.compose leaves them
    // unnamed, and its drop-in does as it does).
    let unnamed = match opts.rules {
        Rules::Fastseq => unnamed_nodes(&models, plan.kept.as_ref().map(|k| &k.nodes[..])),
        Rules::OnnxCompose => vec![Vec::new(); n],
    };
    leave_out(&mut plan, &mut models);
    let frame = match opts.rules {
        Rules::OnnxCompose => Some(Frame::of(&models, labels, opts)?),
        Rules::Fastseq => None,
    };

    // Per model, arenas for its names and for the fresh value and node names it gets. (An
    // arena is used by one thread at a time, hence one per model and per task.)
    let arenas = || -> Vec<Bump> { (0..n).map(|_| Bump::new()).collect() };
    let (mut name_arenas, mut value_arenas, mut node_arenas) = (arenas(), arenas(), arenas());
    let names: Vec<NameSet> =
        models.par_iter_mut().zip(&mut name_arenas).map(|(m, arena)| NameSet::of(m, arena)).collect();
    // onnx.compose concatenates the graphs: a name a model reads without defining it binds
    // to the other model's value of that name, and is no clash to rename.
    let free: Vec<FxHashSet<String>> = match opts.rules {
        Rules::OnnxCompose => models.par_iter().map(free_names).collect(),
        Rules::Fastseq => Vec::new(),
    };
    // Values and node names are separate namespaces: assigned side by side.
    let mut extra = Bump::new();
    let (values, nodes) = rayon::join(
        || assign_value_names(&models, &names, &free, &plan, value_arenas.iter_mut().collect(), &mut extra),
        || assign_node_names(&names, node_arenas.iter_mut().collect()),
    );
    let view = PlanView::of(&models, labels, &given, &plan, graph_form, &values.maps).with_declared(declared);
    let ValueNames { maps: value_maps, adapters, renamed: value_renamed } = values;
    let (node_maps, node_renamed): (Vec<_>, Vec<_>) = nodes.into_iter().unzip();
    let given = name_unnamed_nodes(&unnamed, labels, &names, &node_maps);
    let adapters = name_adapter_nodes(adapters, &plan, &names, &given);
    let mut renamers: Vec<Renamer> = value_maps
        .into_iter()
        .zip(node_maps)
        .map(|(values, nodes)| Renamer { values, nodes, ..Default::default() })
        .collect();
    let dropped_functions = assign_function_names(&models, &mut renamers);
    models.par_iter_mut().zip(renamers.par_iter_mut()).zip(&given).for_each(|((m, r), given)| {
        if !r.is_identity() {
            walk_model(m, r)
        }
        name_unnamed(m.graph.as_mut().expect("checked on entry"), given);
    });
    drop((renamers, names));
    // Freeing the arenas is off the caller's path.
    crate::pool::spawn(move || drop((name_arenas, value_arenas, node_arenas, extra)));

    let (mut model, ranges, inserted) =
        assemble(models, &plan, &adapters, dropped_functions, opset_import, ir_version, opts);
    let mut unproven = Vec::new();
    if let Some(frame) = frame {
        frame.apply(&mut model);
        unproven = std::mem::take(&mut plan.mismatches);
        if ir_versions.len() > 1 {
            let mut v: Vec<i64> = ir_versions.into_iter().collect();
            v.sort_unstable();
            unproven.push(format!("the models' IR versions differ ({v:?}): merged at {ir_version}"));
        }
        unproven.extend(naming_problem(&model));
    }
    let report = Report {
        pruned: plan.pruned.clone(),
        deduped,
        adapters: plan.adapters.iter().map(|a| (a.edge, a.describe())).collect(),
        unused_outputs: plan.unused.clone(),
        unproven,
    };
    let mut origins = Origins {
        nodes: ranges,
        inserted,
        values: value_renamed,
        node_names: node_renamed,
        labels: labels.to_vec(),
        note: None,
    };
    // One model composed on its own keeps the stages its map names, when the map fits what
    // the composition made of it (nothing renamed, pruned or named).
    if let Some(parsed) = one_map {
        if origins.values.iter().chain(&origins.node_names).all(|r| r.iter().next().is_none()) {
            take_stage_map(&mut origins, parsed, &model);
        }
    }
    Ok(Composition { model, labels: labels.to_vec(), plan: view, report, origins })
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
                // onnx.compose's add_prefix sets every node's name, an unnamed one's to ""
                // (present, empty); fastseq's own prefixes leave unnamed nodes unnamed.
                name_unnamed: opts.rules == Rules::OnnxCompose,
            };
            walk_model(m, &mut r);
        }
    });
    let name = |stage: usize, s: &str| prefix(stage).map_or_else(|| s.to_string(), |p| format!("{p}{s}"));
    let mut out = opts.clone();
    out.io_maps = opts.io_maps.as_ref().map(|maps| {
        maps.iter()
            .enumerate()
            .map(|(j, pairs)| pairs.as_ref().map(|p| p.iter().map(|(o, i)| (name(j, o), name(j + 1, i))).collect()))
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

#[cfg(test)]
mod tests {
    use prost::Message;

    use crate::codec::proto::{attribute_proto::AttributeType, AttributeProto};
    use crate::merge::testing::*;

    #[test]
    fn chain_renames_only_clashing_internal_names() {
        let merged = compose(vec![scale(1), scale(1), scale(1)], &labels(3), &Options::default()).unwrap().model;
        let g = merged.graph.unwrap();
        assert_eq!(g.input.iter().map(vi_name).collect::<Vec<_>>(), ["x"]);
        assert_eq!(g.output.iter().map(vi_name).collect::<Vec<_>>(), ["y"]);
        let defined = defined_names(&g);
        let unique: HashSet<&String> = defined.iter().collect();
        assert_eq!(unique.len(), defined.len(), "SSA: {defined:?}");
        let node = |k: usize| crate::codec::node::decode(&g.node[k]).unwrap();
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
        g.node[1] = crate::codec::node::encode(&NodeProto {
            attribute: vec![AttributeProto {
                name: Some("then_branch".into()),
                r#type: Some(AttributeType::Graph as i32),
                g: Some(then),
                ..Default::default()
            }],
            ..node_proto("If", &["t"], &["y"])
        });
        let if_model = m.clone();
        let merged = compose(vec![m.clone(), m], &labels(2), &Options::default()).unwrap().model;
        let g = merged.graph.unwrap();
        let if_node = crate::codec::node::decode(&g.node[3]).unwrap();
        let sub = crate::codec::node::decode(&if_node.attribute[0].g.as_ref().unwrap().node[0]).unwrap();
        assert_eq!(sub.input, ["m0/y", "m1/c"]);
        // Both bodies define 'out': sibling scopes in the merged graph, so it keeps its name.
        assert_eq!(sub.output, ["out"]);
        // A top-level 'out' in the first model would make the body's shadow it: renamed.
        let mut first = scale(1);
        first.graph.as_mut().unwrap().node[1] = node("Relu", &["t"], &["out"]);
        first.graph.as_mut().unwrap().output[0].name = Some("out".into());
        let opts = Options { io_maps: Some(vec![Some(vec![("out".into(), "x".into())])]), ..Default::default() };
        let merged = compose(vec![first, if_model], &labels(2), &opts).unwrap().model;
        let g = merged.graph.unwrap();
        let if_node = crate::codec::node::decode(&g.node[3]).unwrap();
        let sub = crate::codec::node::decode(&if_node.attribute[0].g.as_ref().unwrap().node[0]).unwrap();
        assert_eq!(sub.output, ["m1/out"]);
    }

    #[test]
    fn joint_errors_are_typed_and_use_user_names() {
        let opts = Options { io_maps: Some(vec![Some(vec![("y".into(), "X".into())])]), ..Default::default() };
        let err = compose(vec![scale(1), scale(1)], &labels(2), &opts).unwrap_err();
        assert_eq!(err.kind, Kind::Composition);
        assert!(err.message.contains("'X' is not an input of m1.onnx (did you mean 'x'?)"), "{}", err.message);
        let err = compose(vec![scale(1), scale(11)], &labels(2), &Options::default()).unwrap_err();
        assert!(err.message.contains("output 'y' is float but input 'x' expects double"), "{}", err.message);
    }

    #[test]
    fn fifty_models_cost_linear_work() {
        let merged = compose((0..50).map(|_| scale(1)).collect(), &labels(50), &Options::default()).unwrap().model;
        let g = merged.graph.unwrap();
        assert_eq!(g.node.len(), 100);
        let defined = defined_names(&g);
        assert_eq!(defined.iter().collect::<HashSet<_>>().len(), defined.len());
    }

    #[test]
    fn streamed_file_decodes_to_the_same_model() {
        let merged = compose(vec![scale(1), scale(1)], &labels(2), &Options::default()).unwrap().model;
        let mut streamed = Vec::new();
        crate::codec::stream::write_streaming(&merged, &mut streamed).unwrap();
        assert_eq!(streamed.len(), merged.encoded_len());
        let back = crate::codec::model::decode("streamed", bytes::Bytes::from(streamed)).unwrap();
        assert_eq!(back, merged);
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
        let c = compose(models, &labels(4), &graph_opts(edges, &[("out", 3, "y")])).unwrap();
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
    fn a_written_model_keeps_its_stages_and_a_merge_drops_a_stages_map() {
        use crate::merge::compose::Composition;
        use crate::merge::stage_map::KEY;
        let c = compose(vec![scale(1), scale(1), scale(1)], &labels(3), &Options::default()).unwrap();
        assert!(c.model.metadata_props.is_empty(), "only a file gets the map");
        let written = c.for_file().into_owned();
        let has_map = |m: &ModelProto| m.metadata_props.iter().any(|p| p.key.as_deref() == Some(KEY));
        assert!(has_map(&written));
        // Read back on its own, loaded or composed alone: its three stages.
        let loaded = Composition::single(written.clone(), "merged.onnx");
        assert_eq!(loaded.stages(), c.stages());
        assert_eq!(loaded.origins.labels, labels(3));
        let alone = compose(vec![written.clone()], &["merged.onnx".into()], &Options::default()).unwrap();
        assert_eq!(alone.stages(), c.stages());
        assert!(!has_map(&alone.model) && has_map(&alone.for_file()));
        // A stage of a larger composition: its map says nothing of the merged graph.
        let opts = Options { io_maps: Some(vec![Some(vec![("y".into(), "x".into())])]), ..Default::default() };
        let larger = compose(vec![written.clone(), scale(1)], &labels(2), &opts).unwrap();
        assert!(!has_map(&larger.model));
        assert_eq!(larger.stages().iter().map(|s| s.label.as_str()).collect::<Vec<_>>(), ["m0.onnx", "m1.onnx"]);
        // Edited elsewhere (a node dropped): ignored with a note, and not written again.
        let mut edited = written;
        edited.graph.as_mut().unwrap().node.pop();
        let loaded = Composition::single(edited, "edited.onnx");
        assert!(loaded.stages().is_empty());
        assert!(loaded.origins.note.as_deref().unwrap().contains("is of 6 nodes, the graph has 5"));
        assert!(!has_map(&loaded.for_file()));
    }

    #[test]
    fn unfed_inputs_keep_their_names_when_unique() {
        let opts = Options { edges: Some(vec![]), ..Default::default() };
        let mut other = join("Neg", &["z"]);
        let g = other.graph.as_mut().unwrap();
        g.output[0].name = Some("w".into());
        g.node = vec![node("Neg", &["z"], &["w"])];
        let c = compose(vec![distinct(1.0), other], &labels(2), &opts).unwrap();
        let g = c.model.graph.unwrap();
        assert_eq!(names(&g.input), ["x", "z"]);
        assert_eq!(names(&g.output), ["y", "w"]);
    }
}
