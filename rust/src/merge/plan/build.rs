//! Building the plan: the edges checked one by one, then exposure, pruning, and the IR < 4
//! weights that edges override.
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::merge::options::{Adapt, Keep, Options};
use crate::merge::plan::adapters::{check_edge, unify_dims};
use crate::merge::plan::edges::{linear_edges, path, stage_io};
use crate::merge::plan::exposure::{expose_graph, expose_linear};
use crate::merge::plan::parts::{Plan, PruneReport, Target};
use crate::merge::plan::prune::prune;

/// Plans the composition of `models` (already prefixed) under `opts`.
pub fn build_plan(models: &[ModelProto], labels: &[String], opts: &Options) -> Result<Plan> {
    let n = models.len();
    let graph_form = opts.is_graph();
    if graph_form && (opts.inputs.is_some() || opts.outputs.is_some()) {
        return Err(Error::composition(
            "inputs/outputs restrict the linear form; with edges, graph_inputs or graph_outputs, \
             name the exposed inputs and outputs there",
        ));
    }
    if graph_form && matches!(opts.keep_outputs, Keep::Names(_)) {
        return Err(Error::composition(
            "keep_outputs with names applies to the linear form; with edges, graph_inputs or \
             graph_outputs, list the outputs to expose in graph_outputs",
        ));
    }
    if opts.edges.is_some() && opts.io_maps.is_some() {
        return Err(Error::composition("pass either io_maps (a chain) or edges (a graph), not both"));
    }
    let (edges, wheres) = match &opts.edges {
        Some(edges) => {
            let wheres = edges
                .iter()
                .enumerate()
                .map(|(x, e)| {
                    let label = |s: usize| labels.get(s).map_or_else(|| format!("stage {s}"), Clone::clone);
                    format!("edge {x} ({}.{} -> {}.{})", label(e.from), e.output, label(e.to), e.input)
                })
                .collect();
            (edges.clone(), wheres)
        }
        None => linear_edges(models, labels, opts.io_maps.as_deref())?,
    };

    if let Adapt::Edges(listed) = &opts.adapt {
        if let Some(bad) = listed.iter().find(|&&x| x >= edges.len()) {
            return Err(Error::composition(format!(
                "adapt lists edge {bad}, but there {}",
                if edges.len() == 1 { "is 1 edge".to_string() } else { format!("are {} edges", edges.len()) }
            )));
        }
    }
    // Edges: existing stages and names, forward only, each input fed once.
    let mut alias: Vec<FxHashMap<String, Target>> = vec![FxHashMap::default(); n];
    let mut fed_by_edge: Vec<FxHashMap<&str, usize>> = vec![FxHashMap::default(); n];
    let mut consumed: Vec<FxHashSet<&str>> = vec![FxHashSet::default(); n];
    let mut adapters = Vec::new();
    for (x, e) in edges.iter().enumerate() {
        let where_ = &wheres[x];
        let (_, out_vi) = stage_io(models, labels, where_, e.from, &e.output, true)?;
        let (_, in_vi) = stage_io(models, labels, where_, e.to, &e.input, false)?;
        if e.from >= e.to {
            return Err(match path(&edges, e.to, e.from) {
                Some(stages) => {
                    let mut names: Vec<&str> = stages.iter().map(|&s| labels[s].as_str()).collect();
                    names.push(&labels[e.to]);
                    Error::composition(format!("{where_}: the edges form a loop: {}", names.join(" -> ")))
                }
                None if e.from == e.to => {
                    Error::composition(format!("{where_}: the edges form a loop: {} feeds itself", labels[e.from]))
                }
                None => Error::composition(format!(
                    "{where_}: {} comes after {} in the stage order; give the stages in an order \
                     where every edge goes forward",
                    labels[e.from], labels[e.to]
                )),
            });
        }
        if let Some(&prev) = fed_by_edge[e.to].get(e.input.as_str()) {
            let p = &edges[prev];
            return Err(Error::composition(if p == e {
                format!("{where_}: the connection '{}' -> '{}' is listed twice", e.output, e.input)
            } else if p.from == e.from {
                format!(
                    "{where_}: input '{}' of {} is fed twice, by '{}' and by '{}'",
                    e.input, labels[e.to], p.output, e.output
                )
            } else {
                format!(
                    "{where_}: input '{}' of {} is fed twice, by '{}' of {} and by '{}' of {}",
                    e.input, labels[e.to], p.output, labels[p.from], e.output, labels[e.from]
                )
            }));
        }
        fed_by_edge[e.to].insert(&e.input, x);
        consumed[e.from].insert(&e.output);
        let target = match check_edge(where_, x, &e.output, out_vi, &e.input, in_vi, opts.adapt.covers(x))? {
            Some(a) => {
                adapters.push(a);
                Target::Adapter(x)
            }
            None => Target::Value(e.from, e.output.clone()),
        };
        alias[e.to].insert(e.input.clone(), target);
    }

    let mut pinned: Vec<FxHashMap<String, String>> = vec![FxHashMap::default(); n];
    let mut fed_inputs: Vec<Vec<usize>> = (0..n)
        .map(|k| {
            let g = graph(&models[k]);
            (0..g.input.len()).filter(|&x| fed_by_edge[k].contains_key(vi_name(&g.input[x]))).collect()
        })
        .collect();
    let mut unused = Vec::new();
    let (inputs, outputs) = if graph_form {
        let (inputs, outputs) = expose_graph(models, labels, opts, &fed_by_edge, &consumed, &mut pinned)?;
        for gi in &inputs {
            for (s, name) in &gi.feeds[1..] {
                let g = graph(&models[*s]);
                fed_inputs[*s].extend(g.input.iter().position(|v| vi_name(v) == name));
            }
        }
        let exported: FxHashSet<(usize, usize)> = outputs.iter().map(|o| (o.stage, o.index)).collect();
        for (k, m) in models.iter().enumerate() {
            for (x, vi) in graph(m).output.iter().enumerate() {
                if !consumed[k].contains(vi_name(vi)) && !exported.contains(&(k, x)) {
                    unused.push((k, vi_name(vi).to_string()));
                }
            }
        }
        (inputs, outputs)
    } else {
        expose_linear(models, labels, opts, &fed_by_edge, &consumed)?
    };
    let exported: FxHashSet<(usize, usize)> = outputs.iter().map(|o| (o.stage, o.index)).collect();
    let internal_outputs = (0..n)
        .map(|k| {
            let g = graph(&models[k]);
            (0..g.output.len())
                .filter(|&x| consumed[k].contains(vi_name(&g.output[x])) && !exported.contains(&(k, x)))
                .collect()
        })
        .collect();
    let mut plan = Plan {
        dims: unify_dims(models, &edges),
        edges,
        alias,
        pinned,
        fed_inputs,
        inputs,
        outputs,
        internal_outputs,
        adapters,
        kept: None,
        pruned: PruneReport::default(),
        unused,
    };
    if opts.prune.unwrap_or(graph_form) {
        prune(&mut plan, models);
    }
    // An IR < 4 weight listed as an input and fed by an edge is overridden: dropped.
    if plan.fed_inputs.iter().any(|f| !f.is_empty()) {
        let fed_inputs = std::mem::take(&mut plan.fed_inputs);
        let kept = plan.kept_mut(models);
        for (k, m) in models.iter().enumerate() {
            let g = graph(m);
            let fed: FxHashSet<&str> = fed_inputs[k].iter().map(|&x| vi_name(&g.input[x])).collect();
            for (x, t) in g.initializer.iter().enumerate() {
                if fed.contains(t.name.as_deref().unwrap_or("")) {
                    kept.initializers[k][x] = false;
                }
            }
        }
        plan.fed_inputs = fed_inputs;
    }
    Ok(plan)
}
