//! Pruning: the nodes, weights, value_info and graph inputs that no graph output needs,
//! found walking the stages backwards ([`prune`]), or stage by stage as
//! `onnx.compose.merge_models` cuts its two graphs down ([`extract`]).
use bumpalo::Bump;
use rustc_hash::FxHashSet;

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::GraphProto;
use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::merge::onnx_rules::extracted_value_info;
use crate::merge::plan::parts::{Kept, Plan, PruneReport, Target};
use crate::merge::rename::{walk_graph, Visitor};

/// Leaves out the nodes, weights, value_info and graph inputs that no graph output needs,
/// walking the stages backwards (an edge makes its output needed when its input is).
pub fn prune(plan: &mut Plan, models: &[ModelProto]) {
    use rayon::prelude::*;
    let n = models.len();
    // What each stage must produce: its exposed outputs, and the outputs edges take.
    let mut wanted: Vec<FxHashSet<&str>> = vec![FxHashSet::default(); n];
    for o in &plan.outputs {
        wanted[o.stage].insert(vi_name(&graph(&models[o.stage]).output[o.index]));
    }
    let exposed = wanted.clone();
    let feeder = |target: &'_ Target| -> (usize, usize) {
        let (s, out) = match target {
            Target::Value(s, out) => (*s, out.as_str()),
            Target::Adapter(e) => (plan.edges[*e].from, plan.edges[*e].output.as_str()),
        };
        (s, graph(&models[s]).output.iter().position(|v| vi_name(v) == out).unwrap_or(usize::MAX))
    };
    for alias in &plan.alias {
        for target in alias.values() {
            let (s, x) = feeder(target);
            if let Some(vi) = graph(&models[s]).output.get(x) {
                wanted[s].insert(vi_name(vi));
            }
        }
    }
    // Each stage's liveness side by side, assuming every edge's output is needed; then,
    // from the last stage back, a stage whose consumers turn out not to need all of
    // it is walked again (rare: only where something is pruned).
    let (mut arenas, again): (Vec<Bump>, Bump) = ((0..n).map(|_| Bump::new()).collect(), Bump::new());
    let mut live: Vec<(Vec<bool>, FxHashSet<&str>)> = arenas
        .par_iter_mut()
        .zip(wanted.par_iter())
        .enumerate()
        .map(|(k, (arena, seeds))| liveness(graph(&models[k]), seeds, arena))
        .collect();
    for k in (0..n).rev() {
        let mut actual = exposed[k].clone();
        for (t, alias) in plan.alias.iter().enumerate().skip(k + 1) {
            for (input, target) in alias {
                let (s, x) = feeder(target);
                if s == k && live[t].1.contains(input.as_str()) {
                    actual.extend(graph(&models[k]).output.get(x).map(vi_name));
                }
            }
        }
        if actual.len() != wanted[k].len() {
            live[k] = liveness(graph(&models[k]), &actual, &again);
        }
    }
    let (nodes_kept, needed): (Vec<Vec<bool>>, Vec<FxHashSet<&str>>) = live.into_iter().unzip();
    let mut kept = Kept::default();
    let mut report = PruneReport::default();
    for (k, keep) in nodes_kept.iter().enumerate() {
        let dropped = keep.iter().filter(|&&b| !b).count();
        report.nodes += dropped;
        // A stage is left out when nothing of it is needed: no node, and no output (a
        // stage without nodes passes its inputs through).
        let outputs_needed = graph(&models[k]).output.iter().any(|v| needed[k].contains(vi_name(v)));
        if dropped == keep.len() && !outputs_needed {
            report.stages.push(k);
        }
    }
    for (k, m) in models.iter().enumerate() {
        let g = graph(m);
        let inits: Vec<bool> =
            g.initializer.iter().map(|t| needed[k].contains(t.name.as_deref().unwrap_or(""))).collect();
        report.initializers += inits.iter().filter(|&&b| !b).count();
        kept.initializers.push(inits);
        kept.sparse.push(
            g.sparse_initializer
                .iter()
                .map(|s| needed[k].contains(s.values.as_ref().and_then(|v| v.name.as_deref()).unwrap_or("")))
                .collect(),
        );
        kept.value_info.push(g.value_info.iter().map(|v| needed[k].contains(vi_name(v))).collect());
        plan.internal_outputs[k].retain(|&x| needed[k].contains(vi_name(&g.output[x])));
    }
    kept.nodes = nodes_kept;
    plan.inputs.retain(|gi| {
        let used = gi.feeds.iter().any(|(s, name)| needed[*s].contains(name.as_str()));
        if !used && !gi.explicit {
            report.inputs.push(gi.name.clone().unwrap_or_else(|| gi.feeds[0].1.clone()));
        }
        used || gi.explicit
    });
    plan.kept = Some(kept);
    plan.pruned = report;
}

/// What `onnx.compose.merge_models` keeps of each stage when `inputs` or `outputs` leave
/// some of its inputs or outputs out: the nodes that its kept outputs and the outputs the
/// io_map takes need, as `onnx.utils.Extractor` finds them, stage by stage (whether the next
/// stage uses what the io_map takes or not), and the weights and value_info those nodes
/// use. A stage that keeps all its inputs and outputs keeps everything, unused nodes
/// included. Unlike the Extractor, what a subgraph reads from outside counts as used. An
/// input that `inputs` leaves out but a kept node reads is refused (onnx.compose returns
/// a model that reads a tensor nothing defines).
pub fn extract(plan: &mut Plan, models: &[ModelProto], labels: &[String]) -> Result<()> {
    let n = models.len();
    let mut kept = Kept::default();
    let mut report = PruneReport::default();
    plan.extracted = vec![false; n];
    let arena = Bump::new();
    for (k, m) in models.iter().enumerate() {
        let g = graph(m);
        let exposed_in: FxHashSet<usize> = plan.inputs.iter().filter(|gi| gi.stage == k).map(|gi| gi.index).collect();
        let left_out: Vec<&str> = (0..g.input.len())
            .filter(|x| !exposed_in.contains(x) && !plan.alias[k].contains_key(vi_name(&g.input[*x])))
            .map(|x| vi_name(&g.input[x]))
            .collect();
        let mut seeds: FxHashSet<&str> = plan.internal_outputs[k].iter().map(|&x| vi_name(&g.output[x])).collect();
        seeds.extend(plan.outputs.iter().filter(|o| o.stage == k).map(|o| vi_name(&g.output[o.index])));
        let all = |len: usize| vec![true; len];
        if left_out.is_empty() && g.output.iter().all(|o| seeds.contains(vi_name(o))) {
            kept.nodes.push(all(g.node.len()));
            kept.initializers.push(all(g.initializer.len()));
            kept.sparse.push(all(g.sparse_initializer.len()));
            kept.value_info.push(all(g.value_info.len()));
            continue;
        }
        plan.extracted[k] = true;
        let (nodes, needed) = liveness(g, &seeds, &arena);
        if let Some(name) = left_out.iter().find(|name| needed.contains(*name)) {
            return Err(Error::composition(format!(
                "input '{name}' of {} is left out by inputs, but the outputs kept need it",
                labels[k]
            )));
        }
        report.nodes += nodes.iter().filter(|&&b| !b).count();
        let inits: Vec<bool> = g.initializer.iter().map(|t| needed.contains(t.name.as_deref().unwrap_or(""))).collect();
        report.initializers += inits.iter().filter(|&&b| !b).count();
        kept.initializers.push(inits);
        kept.sparse.push(
            g.sparse_initializer
                .iter()
                .map(|s| needed.contains(s.values.as_ref().and_then(|v| v.name.as_deref()).unwrap_or("")))
                .collect(),
        );
        // Replaced by the Extractor's own choice when the stage is cut down (see leave_out).
        kept.value_info.push(all(g.value_info.len()));
        kept.nodes.push(nodes);
    }
    plan.kept = Some(kept);
    plan.pruned = report;
    Ok(())
}

/// Leaves out of the models what the plan does not keep (nodes, weights, value_info, and
/// the graph inputs and outputs it neither exposes nor keeps as value_info; the plan's
/// indices follow), so that the names of what is left out neither clash nor get renamed,
/// and the value_info of values that take their name from elsewhere (inputs fed by an
/// edge, weights stored once): the value feeding them has its own. A stage cut down as
/// onnx.compose cuts it takes the Extractor's value_info, name and (empty) doc_string.
pub fn leave_out(plan: &mut Plan, models: &mut [ModelProto]) {
    use rayon::prelude::*;
    let kept = plan.kept.take();
    let mask = |len: &dyn Fn(&GraphProto) -> usize| -> Vec<Vec<bool>> {
        models.iter().map(|m| vec![false; len(graph(m))]).collect()
    };
    let (mut keep_in, mut keep_out) = (mask(&|g| g.input.len()), mask(&|g| g.output.len()));
    for gi in &plan.inputs {
        keep_in[gi.stage][gi.index] = true;
    }
    for go in &plan.outputs {
        keep_out[go.stage][go.index] = true;
    }
    for (k, xs) in plan.internal_outputs.iter().enumerate() {
        xs.iter().for_each(|&x| keep_out[k][x] = true);
    }
    let (alias, extracted) = (&plan.alias, &plan.extracted);
    models.par_iter_mut().enumerate().for_each(|(k, m)| {
        let g = m.graph.as_mut().expect("checked on entry");
        if let Some(kept) = &kept {
            retain(&mut g.node, &kept.nodes[k]);
            retain(&mut g.initializer, &kept.initializers[k]);
            retain(&mut g.sparse_initializer, &kept.sparse[k]);
            retain(&mut g.value_info, &kept.value_info[k]);
        }
        if extracted.get(k) == Some(&true) {
            // From the graph's own inputs and outputs, all of them, as the Extractor reads them.
            g.value_info = extracted_value_info(g);
            g.name = Some(format!("Extracted from {{{}}}", g.name.as_deref().unwrap_or("")));
            g.doc_string = None;
        }
        if !alias[k].is_empty() {
            g.value_info.retain(|vi| !alias[k].contains_key(vi_name(vi)));
        }
        retain(&mut g.input, &keep_in[k]);
        retain(&mut g.output, &keep_out[k]);
    });
    let position = |masks: &[Vec<bool>]| -> Vec<Vec<usize>> {
        masks
            .iter()
            .map(|m| m.iter().scan(0, |n, &keep| Some(std::mem::replace(n, *n + usize::from(keep)))).collect())
            .collect()
    };
    let (at_in, at_out) = (position(&keep_in), position(&keep_out));
    plan.inputs.iter_mut().for_each(|gi| gi.index = at_in[gi.stage][gi.index]);
    plan.outputs.iter_mut().for_each(|go| go.index = at_out[go.stage][go.index]);
    for (k, xs) in plan.internal_outputs.iter_mut().enumerate() {
        xs.iter_mut().for_each(|x| *x = at_out[k][*x]);
    }
    // Indices into the inputs as they were: the plan was done with them.
    plan.fed_inputs.clear();
}

fn retain<T>(list: &mut Vec<T>, mask: &[bool]) {
    let mut keep = mask.iter();
    list.retain(|_| *keep.next().unwrap_or(&true));
}

/// Which nodes of `g` produce what `seeds` names, directly or through other nodes, and
/// every name those nodes read.
fn liveness<'a>(g: &'a GraphProto, seeds: &FxHashSet<&'a str>, arena: &'a Bump) -> (Vec<bool>, FxHashSet<&'a str>) {
    let mut needed = seeds.clone();
    let mut keep = vec![false; g.node.len()];
    let (mut reads, mut found) = (Vec::new(), Vec::new());
    for (x, raw) in g.node.iter().enumerate().rev() {
        keep[x] = read_if_needed(raw, &needed, &mut reads, arena, &mut |name| found.push(name));
        needed.extend(found.drain(..));
    }
    (keep, needed)
}

/// NodeProto.attribute (node.rs keeps its own field numbers private).
const NODE_ATTRIBUTE: u32 = 5;

/// If any output of the node (kept as bytes) is in `needed`, calls `f` on every name it
/// reads and returns true. One pass over the node's fields; a node with subgraphs is decoded.
fn read_if_needed<'a>(
    raw: &'a bytes::Bytes,
    needed: &FxHashSet<&str>,
    inputs: &mut Vec<&'a str>,
    arena: &'a Bump,
    f: &mut impl FnMut(&'a str),
) -> bool {
    inputs.clear();
    let (mut wanted, mut attributes) = (false, false);
    for fl in crate::codec::node::fields(raw) {
        match fl {
            Ok(fl) if fl.tag == crate::codec::node::INPUT => inputs.extend(fl.text().filter(|s| !s.is_empty())),
            Ok(fl) if fl.tag == crate::codec::node::OUTPUT => {
                wanted |= fl.text().is_some_and(|s| !s.is_empty() && needed.contains(s));
            }
            Ok(fl) => attributes |= fl.tag == NODE_ATTRIBUTE,
            // Checked when the model was decoded; kept when unsure.
            Err(_) => wanted = true,
        }
    }
    if wanted {
        inputs.iter().for_each(|&s| f(s));
        if attributes {
            subgraph_reads(raw, arena, f);
        }
    }
    wanted
}

/// Calls `f` on every name in the node's subgraphs (the outer names they read among them;
/// the rest is harmless).
fn subgraph_reads<'a>(raw: &'a bytes::Bytes, arena: &'a Bump, f: &mut impl FnMut(&'a str)) {
    if !crate::codec::node::has_tensors_or_graphs(raw) {
        return;
    }
    let Ok(mut node) = crate::codec::node::decode(raw) else { return };
    struct Reads<'a, 'f, F: FnMut(&'a str)>(&'a Bump, &'f mut F);
    impl<'a, F: FnMut(&'a str)> Visitor for Reads<'a, '_, F> {
        fn value(&mut self, name: &str) -> Option<&str> {
            (self.1)(self.0.alloc_str(name));
            None
        }
    }
    let mut reads = Reads(arena, f);
    for a in &mut node.attribute {
        for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
            walk_graph(g, &mut reads);
        }
    }
}
