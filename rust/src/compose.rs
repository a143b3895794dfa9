//! Joints and the N-way merge: all models are renamed and merged in one pass.
use std::collections::{HashMap, HashSet};

use bumpalo::Bump;
use rustc_hash::{FxHashMap, FxHashSet};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::names::{
    did_you_mean, fresh, function_body, function_key, walk_model, FreshNames, FunctionKey, NameSet, Renamer,
};
use crate::opset::{merge_opsets, merged_ir_version};
use crate::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::proto::{tensor_proto, type_proto, GraphProto, ModelProto, ValueInfoProto};

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
    /// Stamp this IR version instead of the highest of the models.
    pub ir_version: Option<i64>,
    pub graph_name: Option<String>,
    pub doc_string: Option<String>,
    pub producer_name: Option<String>,
    pub producer_version: Option<String>,
    pub domain: Option<String>,
    pub model_version: Option<i64>,
}

/// A resolved joint: pairs of (output of model j, input of model j+1), user names.
type Joint = Vec<(String, String)>;

/// Composes `models` (in order) into one model. `labels` name the models in errors.
pub fn compose(models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<ModelProto> {
    crate::pool::install(|| compose_models(models, labels, opts))
}

fn compose_models(mut models: Vec<ModelProto>, labels: &[String], opts: &Options) -> Result<ModelProto> {
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
    let io_maps = apply_prefixes(&mut models, opts);
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
    let joints = resolve_joints(&models, labels, io_maps.as_deref())?;
    let plan = Plan::new(&models, labels, &joints, opts)?;

    // Per model, arenas for its names and for the fresh value and node names it gets. (An
    // arena is used by one thread at a time, hence one per model and per task.)
    let arenas = || -> Vec<Bump> { (0..n).map(|_| Bump::new()).collect() };
    let (mut name_arenas, mut value_arenas, mut node_arenas) = (arenas(), arenas(), arenas());
    let names: Vec<NameSet> =
        models.par_iter_mut().zip(&mut name_arenas).map(|(m, arena)| NameSet::of(m, arena)).collect();
    // Values and node names are separate namespaces: assigned side by side.
    let (value_maps, node_maps) = rayon::join(
        || assign_value_names(&models, &names, &joints, &plan, value_arenas.iter_mut().collect()),
        || assign_node_names(&names, node_arenas.iter_mut().collect()),
    );
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
    crate::pool::spawn(move || drop((name_arenas, value_arenas, node_arenas)));

    Ok(assemble(models, &plan, dropped_functions, opset_import, ir_version, opts))
}

/// Applies `opts.prefixes` to every name of the models, and to the io_maps, as
/// `onnx.compose.merge_models(prefix1=..., prefix2=...)` does.
fn apply_prefixes(models: &mut [ModelProto], opts: &Options) -> Option<Vec<Joint>> {
    let prefix = |i: usize| opts.prefixes.get(i).cloned().flatten().filter(|p| !p.is_empty());
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
    opts.io_maps.as_ref().map(|maps| {
        maps.iter()
            .enumerate()
            .map(|(j, pairs)| {
                pairs
                    .iter()
                    .map(|(o, i)| {
                        let o = prefix(j).map_or_else(|| o.clone(), |p| format!("{p}{o}"));
                        let i = prefix(j + 1).map_or_else(|| i.clone(), |p| format!("{p}{i}"));
                        (o, i)
                    })
                    .collect()
            })
            .collect()
    })
}

fn prefixed<'a>(names: &FxHashSet<&'a str>, prefix: &str, arena: &'a Bump) -> FxHashMap<&'a str, &'a str> {
    names.iter().map(|&v| (v, &*arena.alloc_str(&format!("{prefix}{v}")))).collect()
}

fn graph(m: &ModelProto) -> &GraphProto {
    m.graph.as_ref().expect("checked on entry")
}

fn vi_name(vi: &ValueInfoProto) -> &str {
    vi.name.as_deref().unwrap_or("")
}

fn initializer_names(m: &ModelProto) -> HashSet<&str> {
    let g = graph(m);
    g.initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .chain(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()?.name.as_deref()))
        .collect()
}

/// Graph inputs that are real inputs (IR < 4 models also list their initializers).
fn real_inputs(m: &ModelProto) -> Vec<&ValueInfoProto> {
    let inits = initializer_names(m);
    graph(m).input.iter().filter(|vi| !inits.contains(vi_name(vi))).collect()
}

fn quoted(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

fn resolve_joints(models: &[ModelProto], labels: &[String], io_maps: Option<&[Joint]>) -> Result<Vec<Joint>> {
    let joints = models.len() - 1;
    if let Some(maps) = io_maps {
        if maps.len() != joints {
            return Err(Error::composition(format!(
                "io_maps has {} entr{} but {} models have {joints} joint{}: io_maps[i] lists the \
                 (output, input) pairs from model i to model i+1",
                maps.len(),
                if maps.len() == 1 { "y" } else { "ies" },
                models.len(),
                if joints == 1 { "" } else { "s" },
            )));
        }
    }
    let mut resolved = Vec::with_capacity(joints);
    for j in 0..joints {
        let (up, down) = (&models[j], &models[j + 1]);
        let where_ = format!("joint {j} ({} -> {})", labels[j], labels[j + 1]);
        let outs: Vec<&str> = graph(up).output.iter().map(vi_name).collect();
        let all_ins: Vec<&str> = graph(down).input.iter().map(vi_name).collect();
        let pairs: Joint = match io_maps {
            Some(maps) => maps[j].clone(),
            None => {
                let ins: Vec<&str> = real_inputs(down).into_iter().map(vi_name).collect();
                if outs.len() != ins.len() {
                    return Err(Error::composition(format!(
                        "{where_}: without io_maps outputs are joined to inputs by position, but {} \
                         has {} output{} ({}) and {} has {} input{} ({}); pass io_maps",
                        labels[j],
                        outs.len(),
                        if outs.len() == 1 { "" } else { "s" },
                        quoted(&outs),
                        labels[j + 1],
                        ins.len(),
                        if ins.len() == 1 { "" } else { "s" },
                        quoted(&ins),
                    )));
                }
                outs.iter().zip(&ins).map(|(o, i)| (o.to_string(), i.to_string())).collect()
            }
        };
        let mut fed: HashMap<&str, &str> = HashMap::new();
        for (o, i) in &pairs {
            if !outs.contains(&o.as_str()) {
                return Err(Error::composition(format!(
                    "{where_}: '{o}' is not an output of {}{}; its outputs are {}",
                    labels[j],
                    did_you_mean(o, outs.iter().copied()),
                    quoted(&outs)
                )));
            }
            if !all_ins.contains(&i.as_str()) {
                return Err(Error::composition(format!(
                    "{where_}: '{i}' is not an input of {}{}; its inputs are {}",
                    labels[j + 1],
                    did_you_mean(i, all_ins.iter().copied()),
                    quoted(&all_ins)
                )));
            }
            if let Some(prev) = fed.insert(i.as_str(), o.as_str()) {
                return Err(Error::composition(if prev == o {
                    format!("{where_}: the connection '{o}' -> '{i}' is listed twice")
                } else {
                    format!("{where_}: input '{i}' of {} is fed twice, by '{prev}' and by '{o}'", labels[j + 1])
                }));
            }
            let out_vi = graph(up).output.iter().find(|v| vi_name(v) == o).expect("checked");
            let in_vi = graph(down).input.iter().find(|v| vi_name(v) == i).expect("checked");
            check_types(&where_, o, out_vi, i, in_vi)?;
        }
        resolved.push(pairs);
    }
    Ok(resolved)
}

fn tensor_type(vi: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t),
        _ => None,
    }
}

pub fn elem_type_name(t: i32) -> String {
    tensor_proto::DataType::try_from(t).map(|d| d.as_str_name().to_lowercase()).unwrap_or_else(|_| format!("type {t}"))
}

fn shape_text(dims: &[Option<&Dim>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Some(Dim::DimValue(v)) => v.to_string(),
            Some(Dim::DimParam(p)) => p.clone(),
            None => "?".to_string(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn check_types(where_: &str, o: &str, out: &ValueInfoProto, i: &str, inp: &ValueInfoProto) -> Result<()> {
    let (Some(a), Some(b)) = (tensor_type(out), tensor_type(inp)) else { return Ok(()) };
    let (ea, eb) = (a.elem_type.unwrap_or(0), b.elem_type.unwrap_or(0));
    if ea != 0 && eb != 0 && ea != eb {
        return Err(Error::composition(format!(
            "{where_}: element type mismatch: output '{o}' is {} but input '{i}' expects {}",
            elem_type_name(ea),
            elem_type_name(eb)
        )));
    }
    let (Some(sa), Some(sb)) = (a.shape.as_ref(), b.shape.as_ref()) else { return Ok(()) };
    let da: Vec<Option<&Dim>> = sa.dim.iter().map(|d| d.value.as_ref()).collect();
    let db: Vec<Option<&Dim>> = sb.dim.iter().map(|d| d.value.as_ref()).collect();
    let clash = da.len() != db.len()
        || da
            .iter()
            .zip(&db)
            .any(|pair| matches!(pair, (Some(Dim::DimValue(x)), Some(Dim::DimValue(y))) if x != y && *x > 0 && *y > 0));
    if clash {
        return Err(Error::composition(format!(
            "{where_}: shape mismatch: output '{o}' has shape {} but input '{i}' expects {}",
            shape_text(&da),
            shape_text(&db)
        )));
    }
    Ok(())
}

/// What the merged graph exposes and drops, by index into each model's own lists.
struct Plan {
    /// Per model: input name -> the upstream output name feeding it.
    fed_by: Vec<FxHashMap<String, String>>,
    /// Per model: indices of graph inputs fed by a joint.
    fed_inputs: Vec<Vec<usize>>,
    /// Per model: indices of graph inputs that stay graph inputs.
    inputs: Vec<Vec<usize>>,
    /// Per model: indices of graph outputs that become graph outputs.
    outputs: Vec<Vec<usize>>,
    /// Per model: indices of consumed outputs that are not exposed (kept as value_info).
    internal_outputs: Vec<Vec<usize>>,
}

impl Plan {
    fn new(models: &[ModelProto], labels: &[String], joints: &[Joint], opts: &Options) -> Result<Plan> {
        let n = models.len();
        let mut fed_by = vec![FxHashMap::default(); n];
        let mut consumed: Vec<HashSet<&str>> = vec![HashSet::new(); n];
        for (j, pairs) in joints.iter().enumerate() {
            for (o, i) in pairs {
                fed_by[j + 1].insert(i.clone(), o.clone());
                consumed[j].insert(o.as_str());
            }
        }
        let fed_inputs: Vec<Vec<usize>> = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.input.len()).filter(|&x| fed_by[k].contains_key(vi_name(&g.input[x]))).collect()
            })
            .collect();
        let mut inputs: Vec<Vec<usize>> = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.input.len()).filter(|&x| !fed_by[k].contains_key(vi_name(&g.input[x]))).collect()
            })
            .collect();
        if let Some(wanted) = &opts.inputs {
            inputs = select(models, labels, wanted, "input", |m| &graph(m).input, Some(&inputs))?;
        }
        let outputs = match (&opts.outputs, &opts.keep_outputs) {
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
        let internal_outputs = (0..n)
            .map(|k| {
                let g = graph(&models[k]);
                (0..g.output.len())
                    .filter(|x| consumed[k].contains(vi_name(&g.output[*x])) && !outputs[k].contains(x))
                    .collect()
            })
            .collect();
        Ok(Plan { fed_by, fed_inputs, inputs, outputs, internal_outputs })
    }
}

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

fn model_prefix(i: usize) -> String {
    format!("m{i}/")
}

/// Gives every value name its final name. A name keeps its spelling in the model that
/// claims it first, exposed inputs and outputs claiming before anything else (so that they
/// keep the user's names); other models get a fresh `m<i>/` name for it. An input fed by a
/// joint takes the final name of the output feeding it.
#[allow(clippy::needless_range_loop)] // k indexes models, the plan and the maps alike
fn assign_value_names<'a>(
    models: &[ModelProto],
    names: &[NameSet<'a>],
    joints: &'a [Joint],
    plan: &Plan,
    arenas: Vec<&'a mut Bump>,
) -> Vec<FxHashMap<&'a str, &'a str>> {
    let n = models.len();
    let total: usize = names.iter().map(|s| s.values.len()).sum();
    let mut owner: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(total, Default::default());
    for k in 0..n {
        // Weights that IR < 4 models list as inputs are not the user's inputs: no priority.
        let inits = initializer_names(&models[k]);
        let g = graph(&models[k]);
        for &x in &plan.inputs[k] {
            let name = vi_name(&g.input[x]);
            if !inits.contains(name) {
                owner.entry(name).or_insert(k);
            }
        }
    }
    for k in 0..n {
        let g = graph(&models[k]);
        for &x in &plan.outputs[k] {
            let name = vi_name(&g.output[x]);
            if !plan.fed_by[k].contains_key(name) {
                owner.entry(name).or_insert(k);
            }
        }
    }
    for (k, set) in names.iter().enumerate() {
        for &name in &set.values {
            if !plan.fed_by[k].contains_key(name) {
                owner.entry(name).or_insert(k);
            }
        }
    }
    // Each model's fresh names depend only on `owner`: made side by side.
    let mut maps: Vec<FxHashMap<&'a str, &'a str>> = arenas
        .into_par_iter()
        .enumerate()
        .map(|(k, arena)| {
            let mut fresh = FreshNames::new(model_prefix(k), arena, names[k].values.len());
            for &name in &names[k].values {
                // An input fed by a joint is aliased to its upstream output below.
                if !plan.fed_by[k].contains_key(name) && owner.get(name).is_some_and(|&o| o != k) {
                    fresh.rename(name, |c| owner.contains_key(c));
                }
            }
            fresh.renamed
        })
        .collect();
    // In model order, so that the output feeding model k has its final name. (An upstream
    // name is an original name or another model's fresh one: never one of model k's fresh names.)
    for k in 1..n {
        for (o, i) in &joints[k - 1] {
            let upstream: &'a str = maps[k - 1].get(o.as_str()).copied().unwrap_or(o.as_str());
            if upstream != i {
                maps[k].insert(i.as_str(), upstream);
            }
        }
    }
    maps
}

fn assign_node_names<'a>(names: &[NameSet<'a>], arenas: Vec<&'a mut Bump>) -> Vec<FxHashMap<&'a str, &'a str>> {
    let total: usize = names.iter().map(|s| s.nodes.len()).sum();
    let mut owner: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(total, Default::default());
    for (k, set) in names.iter().enumerate() {
        for name in &set.nodes {
            owner.entry(name).or_insert(k);
        }
    }
    names
        .par_iter()
        .zip(arenas)
        .enumerate()
        .map(|(k, (set, arena))| {
            let mut fresh = FreshNames::new(model_prefix(k), arena, set.nodes.len());
            for &name in &set.nodes {
                if owner[name] != k {
                    fresh.rename(name, |c| owner.contains_key(c));
                }
            }
            fresh.renamed
        })
        .collect()
}

/// Local functions with the same (domain, name, overload) in several models: identical
/// bodies are kept once; different ones are renamed, callers included (same domain only).
/// Bodies are compared with their calls renamed, so two that read the same but call
/// different functions differ; as a rename can make its callers differ in turn, this runs
/// until the renames stop changing (once more per level of calls, at most once per function).
/// Returns, per model, the indices of functions dropped as duplicates.
fn assign_function_names(models: &[ModelProto], renamers: &mut [Renamer]) -> Vec<Vec<usize>> {
    let all: FxHashSet<FunctionKey> = models.iter().flat_map(|m| m.functions.iter().map(function_key)).collect();
    let mut renames: Vec<FxHashMap<FunctionKey, String>> = vec![FxHashMap::default(); models.len()];
    for _ in 0..=all.len() + 1 {
        let mut seen: FxHashMap<FunctionKey, Vec<u8>> = FxHashMap::default();
        let mut dropped = vec![Vec::new(); models.len()];
        let mut next: Vec<FxHashMap<FunctionKey, String>> = vec![FxHashMap::default(); models.len()];
        for (k, m) in models.iter().enumerate() {
            for (x, f) in m.functions.iter().enumerate() {
                let key = function_key(f);
                let body = function_body(f, &renames[k]);
                match seen.get(&key) {
                    None => {
                        seen.insert(key, body);
                    }
                    Some(existing) if *existing == body => dropped[k].push(x),
                    Some(_) => {
                        let (domain, name, overload) = key.clone();
                        let new = fresh(&format!("{name}__m{k}"), "", |c| {
                            let probe = (domain.clone(), c.to_string(), overload.clone());
                            !all.contains(&probe) && !seen.contains_key(&probe)
                        });
                        let new_key = (domain, new.clone(), overload);
                        seen.insert(new_key, body);
                        next[k].insert(key, new);
                    }
                }
            }
        }
        if next == renames {
            for (r, functions) in renamers.iter_mut().zip(next) {
                r.functions = functions;
            }
            return dropped;
        }
        renames = next;
    }
    unreachable!("the renames grow with each round and are bounded by the number of functions")
}

fn assemble(
    models: Vec<ModelProto>,
    plan: &Plan,
    dropped_functions: Vec<Vec<usize>>,
    opset_import: Vec<crate::proto::OperatorSetIdProto>,
    ir_version: i64,
    opts: &Options,
) -> ModelProto {
    let graph_names: Vec<String> =
        models.iter().filter_map(|m| graph(m).name.clone()).filter(|s| !s.is_empty()).collect();
    let mut g = GraphProto {
        name: Some(opts.graph_name.clone().unwrap_or_else(|| {
            if graph_names.is_empty() {
                "fastseq".to_string()
            } else {
                graph_names.join("+")
            }
        })),
        ..Default::default()
    };
    // Sized once: growing a list of tens of thousands of nodes copies it again and again.
    g.node.reserve_exact(models.iter().map(|m| graph(m).node.len()).sum());
    g.initializer.reserve_exact(models.iter().map(|m| graph(m).initializer.len()).sum());
    let mut out = ModelProto {
        ir_version: Some(ir_version),
        opset_import,
        producer_name: Some(opts.producer_name.clone().unwrap_or_else(|| "fastseq".to_string())),
        producer_version: Some(opts.producer_version.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string())),
        domain: opts.domain.clone(),
        model_version: opts.model_version,
        doc_string: opts.doc_string.clone(),
        ..Default::default()
    };
    let mut meta_seen: HashSet<(String, String)> = HashSet::new();
    let mut output_seen: HashSet<String> = HashSet::new();
    let mut internal: Vec<ValueInfoProto> = Vec::new();
    for (k, m) in models.into_iter().enumerate() {
        let mut mg = m.graph.expect("checked on entry");
        // An IR < 4 model lists initializers as inputs; one fed by a joint is overridden.
        if !plan.fed_inputs[k].is_empty() {
            let fed: HashSet<String> = plan.fed_inputs[k].iter().map(|&x| vi_name(&mg.input[x]).to_string()).collect();
            mg.initializer.retain(|t| !fed.contains(t.name.as_deref().unwrap_or("")));
        }
        let mut inputs = std::mem::take(&mut mg.input);
        let mut outputs = std::mem::take(&mut mg.output);
        for &x in &plan.inputs[k] {
            g.input.push(std::mem::take(&mut inputs[x]));
        }
        for &x in &plan.outputs[k] {
            if output_seen.insert(vi_name(&outputs[x]).to_string()) {
                g.output.push(outputs[x].clone());
            }
        }
        for &x in &plan.internal_outputs[k] {
            internal.push(std::mem::take(&mut outputs[x]));
        }
        g.node.append(&mut mg.node);
        g.initializer.append(&mut mg.initializer);
        g.sparse_initializer.append(&mut mg.sparse_initializer);
        g.value_info.append(&mut mg.value_info);
        g.quantization_annotation.append(&mut mg.quantization_annotation);
        g.metadata_props.append(&mut mg.metadata_props);
        let drop = &dropped_functions[k];
        out.functions.extend(m.functions.into_iter().enumerate().filter(|(x, _)| !drop.contains(x)).map(|(_, f)| f));
        out.training_info.extend(m.training_info);
        out.configuration.extend(m.configuration);
        for p in m.metadata_props {
            let key = (p.key.clone().unwrap_or_default(), p.value.clone().unwrap_or_default());
            if meta_seen.insert(key) {
                out.metadata_props.push(p);
            }
        }
    }
    // The types of the tensors that cross a joint stay known to shape inference.
    let mut info_seen: HashSet<String> = g.value_info.iter().map(|v| vi_name(v).to_string()).collect();
    info_seen.extend(output_seen);
    for vi in internal {
        if info_seen.insert(vi_name(&vi).to_string()) {
            g.value_info.push(vi);
        }
    }
    out.graph = Some(g);
    out
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::error::Kind;
    use crate::proto::{
        attribute_proto::AttributeType, tensor_shape_proto, AttributeProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto,
    };

    fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
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

    fn node(op: &str, ins: &[&str], outs: &[&str]) -> bytes::Bytes {
        crate::node::encode(&node_proto(op, ins, outs))
    }

    fn node_proto(op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: Some(op.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            name: Some(op.to_lowercase()),
            ..Default::default()
        }
    }

    /// y = Relu(x * c), with an initializer 'c' and an internal 't'.
    fn scale(elem: i32) -> ModelProto {
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

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}.onnx")).collect()
    }

    fn defined_names(g: &GraphProto) -> Vec<String> {
        let mut names: Vec<String> = g.input.iter().map(|v| vi_name(v).to_string()).collect();
        names.extend(g.initializer.iter().map(|t| t.name.clone().unwrap()));
        names.extend(g.node.iter().flat_map(|n| crate::node::decode(n).unwrap().output));
        names
    }

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
}
