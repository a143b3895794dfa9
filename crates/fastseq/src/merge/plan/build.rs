//! Building the plan: the edges checked one by one (types, shapes, adapters), then exposure,
//! pruning, and the IR < 4 weights that edges override.
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::ModelProto;
use crate::error::{Error, Result};
use crate::merge::options::{Adapt, Keep, Options, Rules};
use crate::merge::plan::adapters::{check_edge, unify_dims};
use crate::merge::plan::edges::{linear_edges, stage_io};
use crate::merge::plan::exposure::{expose_graph, expose_linear};
use crate::merge::plan::parts::{Plan, PruneReport, Target};
use crate::merge::plan::prune::{extract, prune};

/// Plans the composition of `models` (already prefixed) under `opts`. In the graph form,
/// the models are in graph order and the wiring is checked (see
/// [`crate::merge::plan::wiring`]); the checks here are those of the linear form and the
/// ones that need the tensors' types (element types, shapes, adapters).
pub fn build_plan(models: &[ModelProto], labels: &[String], opts: &Options) -> Result<Plan> {
    let n = models.len();
    let graph_form = opts.is_graph();
    let onnx = opts.rules == Rules::OnnxCompose;
    if onnx && (graph_form || n != 2 || opts.keep_outputs != Keep::Last) {
        return Err(Error::composition(
            "onnx.compose's rules apply to two models joined by an io_map (merge_models); \
             they decide which outputs are kept",
        ));
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
    let mut mismatches = Vec::new();
    for (x, e) in edges.iter().enumerate() {
        let where_ = &wheres[x];
        let (_, out_vi) = stage_io(models, labels, where_, e.from, &e.output, true)?;
        let (_, in_vi) = stage_io(models, labels, where_, e.to, &e.input, false)?;
        // The wiring put the stages in graph order; the linear form joins j to j + 1.
        debug_assert!(e.from < e.to, "edges go forward");
        if let Some(&prev) = fed_by_edge[e.to].get(e.input.as_str()).filter(|_| !onnx) {
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
        // (onnx.compose: an input listed twice is fed by its last pair, as its reversed io_map
        // keeps it; the earlier output still counts as consumed.)
        fed_by_edge[e.to].insert(&e.input, x);
        consumed[e.from].insert(&e.output);
        let checked = check_edge(
            where_,
            x,
            (&e.output, out_vi),
            (&e.input, in_vi),
            opts.adapt.covers(x),
            opts.adapt_remedy.as_deref(),
        );
        let target = match checked {
            // onnx.compose joins them as they are; whether that holds is its checker's call.
            Err(e) if onnx => {
                mismatches.push(e.message);
                None
            }
            other => other?,
        };
        let target = match target {
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
        let (inputs, outputs) = expose_graph(models, labels, opts, &fed_by_edge, &mut pinned)?;
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
        // onnx.compose keeps every model's own dim names.
        dims: if onnx { vec![FxHashMap::default(); n] } else { unify_dims(models, &edges) },
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
        extracted: Vec::new(),
        mismatches,
    };
    if onnx {
        extract(&mut plan, models, labels)?;
    } else if opts.prune.unwrap_or(graph_form) {
        prune(&mut plan, models);
    }
    // A weight listed as an input (its default value) and fed by an edge is overridden: dropped.
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
            for (x, s) in g.sparse_initializer.iter().enumerate() {
                if fed.contains(s.values.as_ref().and_then(|v| v.name.as_deref()).unwrap_or("")) {
                    kept.sparse[k][x] = false;
                }
            }
        }
        plan.fed_inputs = fed_inputs;
    }
    Ok(plan)
}
