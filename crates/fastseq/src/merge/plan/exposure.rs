//! What the merged graph exposes: its inputs and outputs and their names, in the linear
//! form (unfed inputs, the last model's outputs, what `inputs`/`outputs`/`keep_outputs` ask
//! for) and in the graph form (the caller's graph inputs and outputs, the rest automatic).
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, initializer_names, vi_name};
use crate::codec::proto::{ModelProto, ValueInfoProto};
use crate::error::{Error, Result};
use crate::merge::options::{Keep, Options, Rules};
use crate::merge::plan::edges::stage_io;
use crate::merge::plan::parts::{GraphInput, GraphOutput};
use crate::merge::rename::fresh;
use crate::near_miss::did_you_mean;

/// Indices of the named inputs (or outputs) per model; every name must match exactly one.
fn select(
    models: &[ModelProto],
    labels: &[String],
    wanted: &[String],
    what: &str,
    list: impl Fn(&ModelProto) -> &Vec<ValueInfoProto>,
    within: Option<&Vec<Vec<usize>>>,
) -> Result<Vec<Vec<usize>>> {
    let mut chosen = vec![Vec::new(); models.len()];
    for name in wanted {
        let mut hits = Vec::new();
        for (k, m) in models.iter().enumerate() {
            for (x, vi) in list(m).iter().enumerate() {
                if vi_name(vi) == name && within.is_none_or(|w| w[k].contains(&x)) {
                    hits.push((k, x));
                }
            }
        }
        match hits.as_slice() {
            [(k, x)] => {
                if !chosen[*k].contains(x) {
                    chosen[*k].push(*x)
                }
            }
            [] => {
                let all: Vec<&str> = models.iter().flat_map(|m| list(m).iter().map(vi_name)).collect();
                return Err(Error::composition(format!(
                    "'{name}' is not an {what} of any model{}",
                    did_you_mean(name, all.iter().copied())
                )));
            }
            many => {
                let who: Vec<&str> = many.iter().map(|(k, _)| labels[*k].as_str()).collect();
                return Err(Error::composition(format!(
                    "'{name}' is an {what} of several models ({}); it is ambiguous",
                    who.join(", ")
                )));
            }
        }
    }
    for c in &mut chosen {
        c.sort_unstable();
    }
    Ok(chosen)
}

/// Exposed names chosen automatically: a value's own name when no other automatic or chosen
/// name is the same, `label.name` when not (then `label.name_1`, ...).
fn auto_names(wanted: &[(String, String)], taken: &mut FxHashSet<String>) -> Vec<String> {
    let mut count: FxHashMap<&str, usize> = FxHashMap::default();
    for (own, _) in wanted {
        *count.entry(own.as_str()).or_default() += 1;
    }
    wanted
        .iter()
        .map(|(own, qualified)| {
            let name = if count[own.as_str()] == 1 && !taken.contains(own) {
                own.clone()
            } else {
                fresh("", qualified, |c| !taken.contains(c))
            };
            taken.insert(name.clone());
            name
        })
        .collect()
}

/// The linear form's exposure: unfed inputs (or those named in `opts.inputs`), and the
/// last model's outputs plus those `opts.keep_outputs` / `opts.outputs` ask for.
pub fn expose_linear(
    models: &[ModelProto],
    labels: &[String],
    opts: &Options,
    fed: &[FxHashMap<&str, usize>],
    consumed: &[FxHashSet<&str>],
) -> Result<(Vec<GraphInput>, Vec<GraphOutput>)> {
    let n = models.len();
    let mut inputs: Vec<Vec<usize>> = (0..n)
        .map(|k| {
            let g = graph(&models[k]);
            (0..g.input.len()).filter(|&x| !fed[k].contains_key(vi_name(&g.input[x]))).collect()
        })
        .collect();
    if let Some(wanted) = &opts.inputs {
        let unfed = |w: &str| (0..n).any(|k| inputs[k].iter().any(|&x| vi_name(&graph(&models[k]).input[x]) == w));
        if let Some(name) = wanted.iter().find(|w| !unfed(w) && fed.iter().any(|f| f.contains_key(w.as_str()))) {
            return Err(Error::composition(format!(
                "'{name}' is in inputs but an io_map pair feeds it: it cannot be a graph input too"
            )));
        }
        let chosen = select(models, labels, wanted, "input", |m| &graph(m).input, Some(&inputs))?;
        // The weights an IR < 4 model lists as inputs stay: without them it is invalid.
        inputs = inputs
            .iter()
            .zip(chosen)
            .enumerate()
            .map(|(k, (unfed, chosen))| {
                let weights = initializer_names(&models[k]);
                let g = graph(&models[k]);
                unfed
                    .iter()
                    .copied()
                    .filter(|x| chosen.contains(x) || weights.contains(vi_name(&g.input[*x])))
                    .collect()
            })
            .collect();
    }
    // onnx.compose keeps the outputs that no io_map pair consumes.
    let keep = if opts.rules == Rules::OnnxCompose { &Keep::Unconsumed } else { &opts.keep_outputs };
    let outputs = match (&opts.outputs, keep) {
        (Some(wanted), _) => select(models, labels, wanted, "output", |m| &graph(m).output, None)?,
        (None, Keep::Names(wanted)) => {
            let mut chosen = select(models, labels, wanted, "output", |m| &graph(m).output, None)?;
            chosen[n - 1] = (0..graph(&models[n - 1]).output.len()).collect();
            chosen
        }
        (None, keep) => (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.output.len())
                    .filter(|&x| {
                        k == n - 1 || (*keep == Keep::Unconsumed && !consumed[k].contains(vi_name(&g.output[x])))
                    })
                    .collect()
            })
            .collect(),
    };
    let gi = inputs
        .iter()
        .enumerate()
        .flat_map(|(k, xs)| {
            let inits = initializer_names(&models[k]);
            let g = graph(&models[k]);
            xs.iter()
                .map(|&x| {
                    let name = vi_name(&g.input[x]);
                    GraphInput {
                        name: None,
                        stage: k,
                        index: x,
                        feeds: vec![(k, name.to_string())],
                        explicit: true,
                        weight: inits.contains(name),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let go = outputs
        .iter()
        .enumerate()
        .flat_map(|(k, xs)| xs.iter().map(move |&x| GraphOutput { name: None, stage: k, index: x }))
        .collect();
    Ok((gi, go))
}

/// The graph form's exposure, its wiring checked (see [`crate::merge::plan::wiring`]): the
/// caller's graph inputs and outputs under the caller's names (the default outputs were
/// chosen with the wiring); unfed inputs under their own names when unique, `label.name`
/// when not (then `label.name_1`, ...), avoiding every name already exposed.
pub fn expose_graph(
    models: &[ModelProto],
    labels: &[String],
    opts: &Options,
    fed: &[FxHashMap<&str, usize>],
    pinned: &mut [FxHashMap<String, String>],
) -> Result<(Vec<GraphInput>, Vec<GraphOutput>)> {
    let mut taken: FxHashSet<String> = FxHashSet::default();
    let mut inputs: Vec<GraphInput> = Vec::new();
    // (stage, input) fed by a graph input.
    let mut listed: FxHashSet<(usize, String)> = FxHashSet::default();
    for (name, feeds) in opts.graph_inputs.iter().flatten() {
        taken.insert(name.clone());
        let what = format!("graph input '{name}'");
        let (stage, first) = &feeds[0];
        let (index, _) = stage_io(models, labels, &what, *stage, first, false)?;
        listed.extend(feeds.iter().cloned());
        inputs.push(GraphInput {
            name: Some(name.clone()),
            stage: *stage,
            index,
            feeds: feeds.clone(),
            explicit: true,
            weight: false,
        });
    }
    let mut outputs: Vec<GraphOutput> = Vec::new();
    for (name, stage, output) in opts.graph_outputs.iter().flatten() {
        taken.insert(name.clone());
        let what = format!("graph output '{name}'");
        let (index, _) = stage_io(models, labels, &what, *stage, output, true)?;
        outputs.push(GraphOutput { name: Some(name.clone()), stage: *stage, index });
    }
    // Inputs that nothing feeds: exposed automatically.
    let mut auto_in: Vec<(usize, usize)> = Vec::new();
    let mut weights: Vec<(usize, usize)> = Vec::new();
    for (k, m) in models.iter().enumerate() {
        let inits = initializer_names(m);
        for (x, vi) in graph(m).input.iter().enumerate() {
            let name = vi_name(vi);
            if fed[k].contains_key(name) || listed.contains(&(k, name.to_string())) {
                continue;
            }
            if inits.contains(name) {
                weights.push((k, x));
            } else {
                auto_in.push((k, x));
            }
        }
    }
    let own = |k: usize, name: &str| (name.to_string(), format!("{}.{name}", labels[k]));
    let wanted_in: Vec<(String, String)> =
        auto_in.iter().map(|&(k, x)| own(k, vi_name(&graph(&models[k]).input[x]))).collect();
    for (&(k, x), name) in auto_in.iter().zip(auto_names(&wanted_in, &mut taken)) {
        let own = vi_name(&graph(&models[k]).input[x]).to_string();
        inputs.push(GraphInput {
            name: Some(name),
            stage: k,
            index: x,
            feeds: vec![(k, own)],
            explicit: false,
            weight: false,
        });
    }
    for &(k, x) in &weights {
        let own = vi_name(&graph(&models[k]).input[x]).to_string();
        inputs.push(GraphInput {
            name: None,
            stage: k,
            index: x,
            feeds: vec![(k, own)],
            explicit: false,
            weight: true,
        });
    }
    // The exposed names become the values' final names.
    for gi in &inputs {
        let Some(name) = &gi.name else { continue };
        for (s, input) in &gi.feeds {
            pinned[*s].insert(input.clone(), name.clone());
        }
    }
    for go in &outputs {
        let Some(name) = &go.name else { continue };
        let own = vi_name(&graph(&models[go.stage]).output[go.index]);
        if let Some(prev) = pinned[go.stage].insert(own.to_string(), name.clone()) {
            if prev != *name {
                return Err(Error::composition(format!(
                    "'{own}' of {} is exposed both as graph input '{prev}' and as graph output '{name}'",
                    labels[go.stage]
                )));
            }
        }
    }
    Ok((inputs, outputs))
}
