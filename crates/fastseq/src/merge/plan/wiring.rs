//! The graph form's wiring, checked in the caller's own terms before anything else: every
//! edge, graph input and graph output names an existing stage, input or output
//! (`edges[2]: 'backbone.feature' is not an output of backbone (did you mean 'features'?)`),
//! each input is fed once, the edges make no circle, and no name is both a graph input and a
//! graph output. Keys are those of the caller's lists (`edges[i]`, `inputs.name[j]`,
//! `outputs[i]`), so that a pipeline file only adds its own name in front.
//!
//! Then the stages are put in graph order ([`crate::merge::plan::order`]) and, without
//! `graph_outputs`, the outputs that no edge consumes are chosen: each under its own name
//! when no other such output has it, `label.output` when one does.
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::{ModelProto, ValueInfoProto};
use crate::error::{Error, Result};
use crate::merge::options::{Edge, Options};
use crate::merge::plan::order::stage_order;
use crate::near_miss::did_you_mean;

/// What the checks decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiring {
    /// The stages in graph order, by their index in the given order.
    pub order: Vec<usize>,
    /// The exposed outputs (name, stage, output), the caller's or the default ones, by the
    /// stages' index in the given order.
    pub outputs: Vec<(String, usize, String)>,
}

fn fail(key: &str, text: String) -> Error {
    Error::composition(format!("{key}: {text}"))
}

/// Checks the graph form's wiring of `models` (in the given order) under `opts`.
pub fn check_wiring(models: &[ModelProto], labels: &[String], opts: &Options) -> Result<Wiring> {
    let n = models.len();
    let port = |s: usize, name: &str| format!("{}.{name}", labels[s]);
    let stage = |key: &str, s: usize| -> Result<()> {
        if s < n {
            return Ok(());
        }
        let given = if n == 1 { "1 stage given".to_string() } else { format!("{n} stages given") };
        Err(fail(key, format!("there is no stage {s} ({given})")))
    };
    let find = |key: &str, s: usize, name: &str, output: bool| -> Result<()> {
        stage(key, s)?;
        let list: &[ValueInfoProto] = if output { &graph(&models[s]).output } else { &graph(&models[s]).input };
        if list.iter().any(|v| vi_name(v) == name) {
            return Ok(());
        }
        let what = if output { "an output" } else { "an input" };
        let hint = did_you_mean(name, list.iter().map(vi_name));
        Err(fail(key, format!("'{}' is not {what} of {}{hint}", port(s, name), labels[s])))
    };

    let edges: &[Edge] = opts.edges.as_deref().unwrap_or(&[]);
    // (stage, input) -> what feeds it, as messages name it.
    let mut fed: FxHashMap<(usize, &str), String> = FxHashMap::default();
    let mut consumed: FxHashSet<(usize, &str)> = FxHashSet::default();
    for (i, e) in edges.iter().enumerate() {
        let key = format!("edges[{i}]");
        find(&key, e.from, &e.output, true)?;
        find(&key, e.to, &e.input, false)?;
        let text = format!("{} -> {}", port(e.from, &e.output), port(e.to, &e.input));
        if let Some(prev) = fed.get(&(e.to, e.input.as_str())) {
            return Err(fail(&key, format!("'{}' is fed twice: by {prev} and by {text}", port(e.to, &e.input))));
        }
        fed.insert((e.to, &e.input), format!("{key} ({text})"));
        consumed.insert((e.from, &e.output));
    }
    let graph_inputs = opts.graph_inputs.as_deref().unwrap_or(&[]);
    let mut input_names: FxHashSet<&str> = FxHashSet::default();
    for (name, feeds) in graph_inputs {
        if name.is_empty() {
            return Err(fail("inputs", "an exposed name cannot be empty".to_string()));
        }
        let key = format!("inputs.{name}");
        if !input_names.insert(name) {
            return Err(fail(&key, format!("the input name '{name}' is given twice")));
        }
        if feeds.is_empty() {
            return Err(fail(&key, "feeds no stage input".to_string()));
        }
        for (j, (s, input)) in feeds.iter().enumerate() {
            let key = format!("inputs.{name}[{j}]");
            find(&key, *s, input, false)?;
            if let Some(prev) = fed.get(&(*s, input.as_str())) {
                let text = format!("'{}' is fed twice: by {prev} and by graph input '{name}'", port(*s, input));
                return Err(fail(&key, text));
            }
            fed.insert((*s, input), format!("graph input '{name}'"));
        }
    }

    let order = stage_order(n, edges.iter().map(|e| (e.from, e.to))).map_err(|circle| {
        let stages: Vec<&str> = circle.iter().map(|&s| labels[s].as_str()).collect();
        fail("edges", format!("the edges make a cycle: {}", stages.join(" -> ")))
    })?;

    let outputs = match &opts.graph_outputs {
        Some(listed) => {
            let mut taken: FxHashMap<&str, usize> = FxHashMap::default();
            let mut exposed: FxHashMap<(usize, &str), &str> = FxHashMap::default();
            for (i, (name, s, output)) in listed.iter().enumerate() {
                let key = format!("outputs[{i}]");
                find(&key, *s, output, true)?;
                if name.is_empty() {
                    return Err(fail(&key, "an exposed name cannot be empty".to_string()));
                }
                if let Some(prev) = taken.insert(name, i) {
                    return Err(fail(&key, format!("the output name '{name}' is taken by outputs[{prev}]")));
                }
                if let Some(prev) = exposed.insert((*s, output), name) {
                    return Err(fail(&key, format!("'{}' is already exposed as '{prev}'", port(*s, output))));
                }
            }
            listed.clone()
        }
        None => {
            // Every output no edge consumes, in graph order.
            let sinks: Vec<(usize, &str)> = order
                .iter()
                .flat_map(|&s| graph(&models[s]).output.iter().map(move |v| (s, vi_name(v))))
                .filter(|sink| !consumed.contains(sink))
                .collect();
            let mut count: FxHashMap<&str, usize> = FxHashMap::default();
            for (_, name) in &sinks {
                *count.entry(name).or_default() += 1;
            }
            sinks
                .iter()
                .map(|&(s, name)| {
                    let exposed = if count[name] == 1 { name.to_string() } else { port(s, name) };
                    (exposed, s, name.to_string())
                })
                .collect()
        }
    };
    if let Some(both) = outputs.iter().map(|(name, ..)| name.as_str()).filter(|n| input_names.contains(n)).min() {
        return Err(fail("inputs", format!("'{both}' is both a graph input and a graph output")));
    }
    Ok(Wiring { order, outputs })
}

/// `models`, `labels` and the stage indices of `opts` in graph order, with the outputs that
/// the wiring decided as `graph_outputs`.
pub fn in_graph_order(
    models: Vec<ModelProto>,
    labels: &[String],
    opts: &Options,
    wiring: &Wiring,
) -> (Vec<ModelProto>, Vec<String>, Options) {
    let Wiring { order, outputs } = wiring;
    let mut at = vec![0; order.len()];
    for (k, &s) in order.iter().enumerate() {
        at[s] = k;
    }
    let mut slots: Vec<Option<ModelProto>> = models.into_iter().map(Some).collect();
    let models = order.iter().map(|&s| slots[s].take().expect("each stage once")).collect();
    let labels = order.iter().map(|&s| labels[s].clone()).collect();
    let mut opts = opts.clone();
    if let Some(edges) = opts.edges.as_mut() {
        for e in edges {
            (e.from, e.to) = (at[e.from], at[e.to]);
        }
    }
    if let Some(inputs) = opts.graph_inputs.as_mut() {
        for (_, feeds) in inputs {
            for (s, _) in feeds {
                *s = at[*s];
            }
        }
    }
    opts.graph_outputs = Some(outputs.iter().map(|(name, s, output)| (name.clone(), at[*s], output.clone())).collect());
    if !opts.prefixes.is_empty() {
        opts.prefixes = order.iter().map(|&s| opts.prefixes.get(s).cloned().flatten()).collect();
    }
    (models, labels, opts)
}
