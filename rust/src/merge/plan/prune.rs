//! Pruning: the nodes, weights, value_info and graph inputs that no graph output needs,
//! found walking the stages backwards.
use bumpalo::Bump;
use rustc_hash::FxHashSet;

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::GraphProto;
use crate::codec::proto::ModelProto;
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
        if dropped > 0 && dropped == keep.len() {
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
