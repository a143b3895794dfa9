//! The final names of a composition: every value and node of every stage gets its name in
//! the merged graph from the plan (exposed names, edges, deduplicated weights, adapters) and
//! the name sets of the stages, in one pass; [`crate::merge::rename`] then applies them.
use bumpalo::Bump;
use rustc_hash::{FxHashMap, FxHashSet};

use rayon::prelude::*;

use crate::codec::graph::{graph, vi_name};
use crate::codec::node;
use crate::codec::proto::ModelProto;
use crate::merge::assemble::AdapterNames;
use crate::merge::plan::parts::{Plan, Target};
use crate::merge::rename::{fresh, function_body, function_key, FreshNames, FunctionKey, NameSet, Renamer};

/// The names one stage's values and nodes had before they were renamed in the merged graph:
/// (new, old) pairs kept in one buffer per stage.
#[derive(Debug, Clone, Default)]
pub struct Renamed {
    text: String,
    spans: Vec<(u32, u32, u32)>,
}

impl Renamed {
    fn push(&mut self, new: &str, old: &str) {
        self.spans.push((self.text.len() as u32, new.len() as u32, old.len() as u32));
        self.text.push_str(new);
        self.text.push_str(old);
    }

    /// (merged name, original name) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spans.iter().map(|&(at, new, old)| {
            let (at, new, old) = (at as usize, new as usize, old as usize);
            (&self.text[at..at + new], &self.text[at + new..at + new + old])
        })
    }
}

fn model_prefix(i: usize) -> String {
    format!("m{i}/")
}

/// Marks a name that an exposed graph input or output claims (not a stage).
const EXPOSED: usize = usize::MAX;
/// Marks a name that only subgraphs have so far: taken (fresh names avoid it), but nobody's,
/// since the bodies of two models are never nested in one another.
const NESTED: usize = usize::MAX - 1;

/// Model `k` claims `name` unless someone did before; a top-level name takes over from
/// names only subgraphs have.
fn claim<'a>(owner: &mut FxHashMap<&'a str, usize>, name: &'a str, k: usize, nested: bool) {
    let by = if nested { NESTED } else { k };
    let o = owner.entry(name).or_insert(by);
    if *o == NESTED {
        *o = by;
    }
}

fn nested_only(set: &FxHashSet<&str>, name: &str) -> bool {
    !set.is_empty() && set.contains(name)
}

/// Whether model `k` must give up `name`: another model or an exposed name claimed it.
fn claimed_by_other(owner: &FxHashMap<&str, usize>, name: &str, k: usize) -> bool {
    owner.get(name).is_some_and(|&o| o != k && o != NESTED)
}

pub struct ValueNames<'a> {
    pub maps: Vec<FxHashMap<&'a str, &'a str>>,
    /// Per adapter: (final upstream name, fresh output name, fresh names for the rest).
    pub adapters: Vec<(String, String, String, String)>,
    pub renamed: Vec<Renamed>,
}

/// Gives every value name its final name. Exposed names chosen by the caller claim their
/// spelling first; then a name keeps its spelling in the model that claims it first, exposed
/// inputs and outputs of the linear form claiming before anything else (so that they keep
/// the user's names); other models get a fresh `m<i>/` name for it. Names that only
/// subgraphs have are nobody's: models keep them unless one has the name at its top level.
/// An input fed by an edge
/// (or a weight stored once) takes the final name of the value feeding it. `free`, per model
/// (empty under fastseq's rules): names it reads without defining them, which onnx.compose's
/// merge binds to the other model's value of that name (see
/// [`crate::merge::onnx_rules::free_names`]): they claim nothing and are never renamed.
pub fn assign_value_names<'a>(
    models: &[ModelProto],
    names: &[NameSet<'a>],
    free: &[FxHashSet<String>],
    plan: &'a Plan,
    arenas: Vec<&'a mut Bump>,
    extra: &'a mut Bump,
) -> ValueNames<'a> {
    let extra: &'a Bump = extra;
    let n = models.len();
    let total: usize = names.iter().map(|s| s.values.len()).sum();
    let mut owner: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(total, Default::default());
    let is_free = |k: usize, name: &str| free.get(k).is_some_and(|f| f.contains(name));
    for pinned in &plan.pinned {
        for fin in pinned.values() {
            owner.entry(fin.as_str()).or_insert(EXPOSED);
        }
    }
    // Weights that IR < 4 models list as inputs are not the user's inputs: no priority.
    for gi in plan.inputs.iter().filter(|gi| gi.name.is_none() && !gi.weight) {
        owner.entry(vi_name(&graph(&models[gi.stage]).input[gi.index])).or_insert(gi.stage);
    }
    for go in plan.outputs.iter().filter(|go| go.name.is_none()) {
        let name = vi_name(&graph(&models[go.stage]).output[go.index]);
        if !plan.alias[go.stage].contains_key(name) && !is_free(go.stage, name) {
            owner.entry(name).or_insert(go.stage);
        }
    }
    let own = |k: usize, name: &str| {
        !plan.alias[k].contains_key(name) && !plan.pinned[k].contains_key(name) && !is_free(k, name)
    };
    for (k, set) in names.iter().enumerate() {
        for &name in &set.values {
            if own(k, name) {
                claim(&mut owner, name, k, nested_only(&set.nested_values, name));
            } else if is_free(k, name) {
                // Taken (no fresh name may be it), not owned: it binds to whoever defines it.
                owner.entry(name).or_insert(NESTED);
            }
        }
    }
    // Each model's fresh names depend only on `owner`: made side by side.
    let (mut maps, mut renamed): (Vec<FxHashMap<&'a str, &'a str>>, Vec<Renamed>) = arenas
        .into_par_iter()
        .enumerate()
        .map(|(k, arena)| {
            let mut fresh = FreshNames::new(model_prefix(k), arena, names[k].values.len());
            for &name in &names[k].values {
                if own(k, name) && claimed_by_other(&owner, name, k) {
                    fresh.rename(name, |c| owner.contains_key(c));
                }
            }
            let mut renamed = Renamed::default();
            for (old, new) in &fresh.renamed {
                renamed.push(new, old);
            }
            (fresh.renamed, renamed)
        })
        .unzip();
    for k in 0..n {
        for (old, new) in &plan.pinned[k] {
            if old != new {
                maps[k].insert(old, new);
                renamed[k].push(new, old);
            }
        }
    }
    // Adapter names avoid every original and exposed name; fresh names start with `m<i>/`.
    let mut used: FxHashSet<String> = FxHashSet::default();
    let mut pick = |base: String| {
        let name = fresh("fastseq/", &base, |c| !owner.contains_key(c) && !used.contains(c));
        used.insert(name.clone());
        name
    };
    let mut adapter_names: FxHashMap<usize, String> = FxHashMap::default();
    let mut adapters = Vec::with_capacity(plan.adapters.len());
    for a in &plan.adapters {
        let e = &plan.edges[a.edge];
        let base = format!("adapt{}/{}", a.edge, e.input);
        let (out, between, axes) = (pick(base.clone()), pick(format!("{base}/cast")), pick(format!("{base}/axes")));
        adapter_names.insert(a.edge, out.clone());
        adapters.push((String::new(), out, between, axes));
    }
    let adapter_names: FxHashMap<usize, &'a str> =
        adapter_names.into_iter().map(|(e, s)| (e, &*extra.alloc_str(&s))).collect();
    // In model order, so that the value feeding model k has its final name. (An upstream
    // name is an original name or another model's fresh one: never one of model k's fresh names.)
    for k in 1..n {
        for (input, target) in &plan.alias[k] {
            let fin: &'a str = match target {
                Target::Value(s, name) => maps[*s].get(name.as_str()).copied().unwrap_or(name.as_str()),
                Target::Adapter(e) => adapter_names[e],
            };
            if fin != input {
                maps[k].insert(input.as_str(), fin);
            }
        }
    }
    for (a, names) in plan.adapters.iter().zip(&mut adapters) {
        let e = &plan.edges[a.edge];
        names.0 = maps[e.from].get(e.output.as_str()).copied().unwrap_or(e.output.as_str()).to_string();
    }
    ValueNames { maps, adapters, renamed }
}

#[allow(clippy::type_complexity)]
pub fn assign_node_names<'a>(
    names: &[NameSet<'a>],
    arenas: Vec<&'a mut Bump>,
) -> Vec<(FxHashMap<&'a str, &'a str>, Renamed)> {
    let total: usize = names.iter().map(|s| s.nodes.len()).sum();
    let mut owner: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(total, Default::default());
    for (k, set) in names.iter().enumerate() {
        for &name in &set.nodes {
            claim(&mut owner, name, k, nested_only(&set.nested_nodes, name));
        }
    }
    names
        .par_iter()
        .zip(arenas)
        .enumerate()
        .map(|(k, (set, arena))| {
            let mut fresh = FreshNames::new(model_prefix(k), arena, set.nodes.len());
            for &name in &set.nodes {
                if claimed_by_other(&owner, name, k) {
                    fresh.rename(name, |c| owner.contains_key(c));
                }
            }
            let mut renamed = Renamed::default();
            for (old, new) in &fresh.renamed {
                renamed.push(new, old);
            }
            (fresh.renamed, renamed)
        })
        .collect()
}

/// Per model, the (index, op_type) of each top-level node that has no name, in order. Read
/// before anything is left out (`kept`, the nodes pruning keeps, when it left some out): the
/// index is the node's position in the stage's own graph, what the stage's author can find.
pub fn unnamed_nodes(models: &[ModelProto], kept: Option<&[Vec<bool>]>) -> Vec<Vec<(usize, String)>> {
    models
        .par_iter()
        .enumerate()
        .map(|(k, m)| {
            let keep = kept.and_then(|masks| masks.get(k));
            graph(m)
                .node
                .iter()
                .enumerate()
                .filter(|(i, _)| keep.is_none_or(|mask| mask.get(*i).copied().unwrap_or(true)))
                .filter_map(|(i, raw)| {
                    // Any bytes make a name (one that is not UTF-8 included): kept as it is.
                    let (name, op, _) = node::head_bytes(raw);
                    name.is_empty().then(|| (i, String::from_utf8_lossy(op).into_owned()))
                })
                .collect()
        })
        .collect()
}

/// Names for the top-level nodes that have none (see [`unnamed_nodes`]), per model in order:
/// `<stage label>/<op_type>_<index>`, which says the stage, the operator and where the node
/// sits in the stage's own graph, so that ONNX Runtime's profiles and errors, which name
/// nodes, name the stage too. Never any node's name in any stage (subgraphs included), nor a
/// renamed node's new name, nor another such name (a clash takes a `_1`, `_2`, ... suffix);
/// the same composition gives the same names.
pub fn name_unnamed_nodes(
    unnamed: &[Vec<(usize, String)>],
    labels: &[String],
    names: &[NameSet],
    node_maps: &[FxHashMap<&str, &str>],
) -> Vec<Vec<String>> {
    if unnamed.iter().all(Vec::is_empty) {
        return vec![Vec::new(); unnamed.len()];
    }
    let renamed: FxHashSet<&str> = node_maps.iter().flat_map(|m| m.values().copied()).collect();
    let mut used: FxHashSet<String> = FxHashSet::default();
    unnamed
        .iter()
        .zip(labels)
        .map(|(nodes, label)| {
            nodes
                .iter()
                .map(|(i, op)| {
                    let op = if op.is_empty() { "node" } else { op.as_str() };
                    let name = fresh(&format!("{label}/"), &format!("{op}_{i}"), |c| {
                        !used.contains(c) && !renamed.contains(c) && names.iter().all(|s| !s.nodes.contains(c))
                    });
                    used.insert(name.clone());
                    name
                })
                .collect()
        })
        .collect()
}

/// The adapters' names: values from the naming step, nodes fresh among every node name
/// (`given`: the names given to nodes that had none).
pub fn name_adapter_nodes(
    adapters: Vec<(String, String, String, String)>,
    plan: &Plan,
    names: &[NameSet],
    given: &[Vec<String>],
) -> Vec<AdapterNames> {
    let given: FxHashSet<&str> = given.iter().flatten().map(String::as_str).collect();
    let mut used: FxHashSet<String> = FxHashSet::default();
    let mut pick = |base: String| {
        let name = fresh("fastseq/", &base, |c| {
            !used.contains(c) && !given.contains(c) && names.iter().all(|s| !s.nodes.contains(c))
        });
        used.insert(name.clone());
        name
    };
    plan.adapters
        .iter()
        .zip(adapters)
        .map(|(a, (input, output, between, axes))| AdapterNames {
            input,
            output,
            between,
            axes,
            nodes: [pick(format!("adapt{}/Cast", a.edge)), pick(format!("adapt{}/Axis", a.edge))],
        })
        .collect()
}

/// Local functions with the same (domain, name, overload) in several models: identical
/// bodies are kept once; different ones are renamed, callers included (same domain only).
/// Bodies are compared with their calls renamed, so two that read the same but call
/// different functions differ; as a rename can make its callers differ in turn, this runs
/// until the renames stop changing (once more per level of calls, at most once per function).
/// Returns, per model, the indices of functions dropped as duplicates.
pub fn assign_function_names(models: &[ModelProto], renamers: &mut [Renamer]) -> Vec<Vec<usize>> {
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

#[cfg(test)]
mod tests {
    use crate::merge::testing::*;

    fn unnamed(mut m: ModelProto) -> ModelProto {
        for raw in &mut m.graph.as_mut().unwrap().node {
            let mut n = crate::codec::node::decode(raw).unwrap();
            n.name = None;
            *raw = crate::codec::node::encode(&n);
        }
        m
    }

    fn node_names(g: &GraphProto) -> Vec<String> {
        (0..g.node.len()).map(|k| node_at(g, k).name.unwrap_or_default()).collect()
    }

    #[test]
    fn unnamed_nodes_are_named_after_their_stage_never_as_another_node() {
        // Stage 0's own node is called what stage 1's unnamed Mul would be.
        let mut first = unnamed(scale(1));
        let g = first.graph.as_mut().unwrap();
        let mut relu = node_at(g, 1);
        relu.name = Some("m1.onnx/Mul_0".into());
        g.node[1] = crate::codec::node::encode(&relu);
        let c = compose(vec![first, unnamed(scale(1)), scale(1)], &labels(3), &Options::default()).unwrap();
        let g = c.model.graph.as_ref().unwrap();
        assert_eq!(
            node_names(g),
            ["m0.onnx/Mul_0", "m1.onnx/Mul_0", "m1.onnx/Mul_0_1", "m1.onnx/Relu_1", "mul", "relu"]
        );
        // The same composition gives the same names.
        let again = compose(vec![unnamed(scale(1)), unnamed(scale(1))], &labels(2), &Options::default()).unwrap();
        let twice = compose(vec![unnamed(scale(1)), unnamed(scale(1))], &labels(2), &Options::default()).unwrap();
        assert_eq!(node_names(again.model.graph.as_ref().unwrap()), node_names(twice.model.graph.as_ref().unwrap()));
        // onnx.compose's rules leave them unnamed, as onnx.compose does.
        let opts = Options { rules: crate::merge::options::Rules::OnnxCompose, ..Default::default() };
        let c = compose(vec![unnamed(scale(1)), unnamed(scale(1))], &labels(2), &opts).unwrap();
        assert!(node_names(c.model.graph.as_ref().unwrap()).iter().all(String::is_empty));
    }

    #[test]
    fn an_unnamed_nodes_index_is_its_place_in_its_own_graph_whatever_pruning_leaves() {
        // A graph: stage 1 has a branch nothing uses (pruned) before the Mul it keeps.
        let mut second = unnamed(distinct(2.0));
        let g = second.graph.as_mut().unwrap();
        g.node
            .insert(0, crate::codec::node::encode(&NodeProto { name: None, ..node_proto("Neg", &["x"], &["unused"]) }));
        g.output.push(vi("unused", 1, &[2, 4]));
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let c = compose(vec![unnamed(distinct(1.0)), second], &labels(2), &opts).unwrap();
        assert_eq!(c.report.pruned.nodes, 1);
        let g = c.model.graph.as_ref().unwrap();
        assert_eq!(node_names(g), ["m0.onnx/Mul_0", "m0.onnx/Relu_1", "m1.onnx/Mul_1", "m1.onnx/Relu_2"]);
    }

    #[test]
    fn under_onnx_rules_a_name_a_model_reads_and_never_defines_binds_to_the_others() {
        // onnx's harness, seed 36015: stage 0 has an input 'cond' it never reads; stage 1
        // reads 'cond' and defines it nowhere. onnx.compose's merge binds the read to the
        // input; renaming it as a clash ('m1/cond') left it reading nothing.
        let mut first = scale(1);
        first.graph.as_mut().unwrap().input.push(vi("cond", 1, &[2, 4]));
        let mut second = join("Neg", &["cond"]);
        second.graph.as_mut().unwrap().input = vec![vi("k", 1, &[2, 4])];
        let opts = Options { rules: crate::merge::options::Rules::OnnxCompose, ..Default::default() };
        let c = compose(vec![first, second], &labels(2), &opts).unwrap();
        let g = c.model.graph.as_ref().unwrap();
        let neg = (0..g.node.len()).map(|k| node_at(g, k)).find(|n| n.op_type.as_deref() == Some("Neg")).unwrap();
        assert_eq!(neg.input, ["cond"]);
        assert!(names(&g.input).contains(&"cond"), "{:?}", names(&g.input));
    }

    #[test]
    fn a_graph_input_feeds_several_stages_under_the_callers_name() {
        let opts = Options {
            edges: Some(vec![]),
            graph_inputs: Some(vec![("image".into(), vec![(0, "x".into()), (1, "x".into())])]),
            ..Default::default()
        };
        let c = compose(vec![distinct(1.0), distinct(2.0)], &labels(2), &opts).unwrap();
        let g = c.model.graph.as_ref().unwrap();
        assert_eq!(names(&g.input), ["image"]);
        assert_eq!(node_at(g, 0).input[0], "image");
        assert_eq!(node_at(g, 2).input[0], "image");
        // Outputs no edge consumes are exposed; the clash is resolved with the stage labels.
        assert_eq!(names(&g.output), ["m0.onnx.y", "m1.onnx.y"]);
        let renamed: Vec<(&str, &str)> = c.origins.values[1].iter().collect();
        assert!(renamed.contains(&("m1/c", "c")) && renamed.contains(&("image", "x")), "{renamed:?}");
        let nodes: Vec<(&str, &str)> = c.origins.node_names[1].iter().collect();
        assert!(nodes.contains(&("m1/mul", "mul")), "{nodes:?}");
    }
}
