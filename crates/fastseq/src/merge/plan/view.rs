//! The plan handed back: what a drawing, a report, `fastseq inspect` and a pipeline file
//! need to know of a composition, as decided here, so that nothing outside the core works
//! it out again: the stages in graph order with their declared inputs and outputs, the
//! edges, what the merged graph exposes and what each exposed input feeds, what was
//! pruned, left unused or adapted.
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::ModelProto;
use crate::codec::summary::{io_info, IoInfo};
use crate::merge::plan::parts::Plan;

/// A stage as the plan places it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageView {
    pub label: String,
    /// Its position in the order the stages were given.
    pub given: usize,
    /// Its own declared inputs and outputs, as a summary shows them.
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    /// None of its nodes is needed by an exposed output.
    pub pruned: bool,
}

/// An edge: output `output` of stage `from` feeds input `input` of stage `to` (labels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeView {
    pub from: String,
    pub output: String,
    pub to: String,
    pub input: String,
    /// Its index in the caller's edges (the linear form: joint by joint, pair by pair).
    pub index: usize,
}

/// The plan of a composition, as the merged model has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanView {
    /// Edges, graph inputs or graph outputs were given (else the linear form).
    pub graph_form: bool,
    /// In graph order: the order of the merged graph's nodes.
    pub stages: Vec<StageView>,
    /// In the caller's order.
    pub edges: Vec<EdgeView>,
    /// The merged model's graph inputs, in its order: (name, the (stage label, input)
    /// pairs it feeds).
    pub inputs: Vec<(String, Vec<(String, String)>)>,
    /// The merged model's graph outputs, in its order: (name, stage label, output).
    pub outputs: Vec<(String, String, String)>,
    /// Labels of the stages that were pruned, in graph order.
    pub pruned: Vec<String>,
    /// (stage label, output) that no edge consumes and no graph output exposes, in the order
    /// the stages were given (graph form only).
    pub unused_outputs: Vec<(String, String)>,
    /// (edge index, "Cast to float, Unsqueeze of axis 0").
    pub adapters: Vec<(usize, String)>,
}

impl PlanView {
    /// The view of `plan` over `models` (in graph order, named as the plan read them, before
    /// any renaming). `given[k]`: the position in the given order of stage k; `final_names[k]`:
    /// stage k's values renamed in the merged graph (absent: unchanged).
    pub fn of(
        models: &[ModelProto],
        labels: &[String],
        given: &[usize],
        plan: &Plan,
        graph_form: bool,
        final_names: &[FxHashMap<&str, &str>],
    ) -> PlanView {
        let final_name = |k: usize, own: &str| final_names[k].get(own).copied().unwrap_or(own).to_string();
        let pruned: FxHashSet<usize> = plan.pruned.stages.iter().copied().collect();
        let stages = models
            .iter()
            .enumerate()
            .map(|(k, m)| StageView {
                label: labels[k].clone(),
                given: given[k],
                inputs: graph(m).input.iter().map(io_info).collect(),
                outputs: graph(m).output.iter().map(io_info).collect(),
                pruned: pruned.contains(&k),
            })
            .collect();
        let edges = plan
            .edges
            .iter()
            .enumerate()
            .map(|(index, e)| EdgeView {
                from: labels[e.from].clone(),
                output: e.output.clone(),
                to: labels[e.to].clone(),
                input: e.input.clone(),
                index,
            })
            .collect();
        // As `assemble` lays them out: every planned input, the outputs once per name.
        let inputs = plan
            .inputs
            .iter()
            .map(|gi| {
                let name = gi
                    .name
                    .clone()
                    .unwrap_or_else(|| final_name(gi.stage, vi_name(&graph(&models[gi.stage]).input[gi.index])));
                (name, gi.feeds.iter().map(|(s, input)| (labels[*s].clone(), input.clone())).collect())
            })
            .collect();
        let mut seen: FxHashSet<String> = FxHashSet::default();
        let outputs = plan
            .outputs
            .iter()
            .filter_map(|go| {
                let own = vi_name(&graph(&models[go.stage]).output[go.index]);
                let name = go.name.clone().unwrap_or_else(|| final_name(go.stage, own));
                seen.insert(name.clone()).then(|| (name, labels[go.stage].clone(), own.to_string()))
            })
            .collect();
        let mut unused: Vec<(usize, String)> = plan.unused.clone();
        unused.sort_by_key(|(k, _)| given[*k]);
        PlanView {
            graph_form,
            stages,
            edges,
            inputs,
            outputs,
            pruned: plan.pruned.stages.iter().map(|&k| labels[k].clone()).collect(),
            unused_outputs: unused.into_iter().map(|(k, o)| (labels[k].clone(), o)).collect(),
            adapters: plan.adapters.iter().map(|a| (a.edge, a.describe())).collect(),
        }
    }

    /// Each stage's inputs and outputs as the stage declares them, read before a cut
    /// (`prune::leave_out`) drops those the merged graph does not keep: a drawing shows
    /// the whole stage.
    pub fn declared_io(models: &[ModelProto]) -> Vec<(Vec<IoInfo>, Vec<IoInfo>)> {
        models
            .iter()
            .map(|m| (graph(m).input.iter().map(io_info).collect(), graph(m).output.iter().map(io_info).collect()))
            .collect()
    }

    /// This view with the stages' inputs and outputs as [`PlanView::declared_io`] read them.
    pub fn with_declared(mut self, declared: Vec<(Vec<IoInfo>, Vec<IoInfo>)>) -> PlanView {
        for (st, (inputs, outputs)) in self.stages.iter_mut().zip(declared) {
            st.inputs = inputs;
            st.outputs = outputs;
        }
        self
    }

    /// The plan of one model on its own: one stage, its inputs and outputs exposed as they are.
    pub fn single(model: &ModelProto, label: &str) -> PlanView {
        let Some(g) = model.graph.as_ref() else { return PlanView::default() };
        PlanView {
            stages: vec![StageView {
                label: label.to_string(),
                given: 0,
                inputs: g.input.iter().map(io_info).collect(),
                outputs: g.output.iter().map(io_info).collect(),
                pruned: false,
            }],
            inputs: g
                .input
                .iter()
                .map(|v| (vi_name(v).to_string(), vec![(label.to_string(), vi_name(v).to_string())]))
                .collect(),
            outputs: g
                .output
                .iter()
                .map(|v| (vi_name(v).to_string(), label.to_string(), vi_name(v).to_string()))
                .collect(),
            ..Default::default()
        }
    }
}
