//! Edges: the linear form converted to edges, and the stage inputs and outputs an edge
//! names (with "did you mean").
use crate::codec::graph::{graph, real_inputs, vi_name};
use crate::codec::proto::{ModelProto, ValueInfoProto};
use crate::error::{Error, Result};
use crate::merge::options::{Edge, IoMap};
use crate::near_miss::did_you_mean;

pub(crate) fn quoted(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The linear form as edges, the one place it is converted: `io_maps[j]` joins stage j to
/// stage j + 1; without io_maps (or without an entry for joint j: a pipeline file gives one
/// only where a joint needs it), outputs join real inputs by position. Returns the edges
/// and, per edge, how errors name it ("joint j (a -> b)").
pub fn linear_edges(
    models: &[ModelProto],
    labels: &[String],
    io_maps: Option<&[Option<IoMap>]>,
) -> Result<(Vec<Edge>, Vec<String>)> {
    let joints = models.len() - 1;
    if let Some(maps) = io_maps {
        if maps.len() != joints {
            return Err(Error::composition(format!(
                "io_maps has {} entr{} but {} models have {}: io_maps[i] lists the \
                 (output, input) pairs from model i to model i+1",
                maps.len(),
                if maps.len() == 1 { "y" } else { "ies" },
                models.len(),
                plural(joints, "joint", "joints"),
            )));
        }
    }
    let (mut edges, mut names) = (Vec::new(), Vec::new());
    for j in 0..joints {
        let where_ = format!("joint {j} ({} -> {})", labels[j], labels[j + 1]);
        let pairs: Vec<(String, String)> = match io_maps.and_then(|maps| maps[j].as_ref()) {
            Some(pairs) => pairs.clone(),
            None => {
                let outs: Vec<&str> = graph(&models[j]).output.iter().map(vi_name).collect();
                let ins: Vec<&str> = real_inputs(&models[j + 1]).into_iter().map(vi_name).collect();
                if outs.len() != ins.len() {
                    return Err(Error::composition(format!(
                        "{where_}: without io_maps outputs are joined to inputs by position, but {} \
                         has {} ({}) and {} has {} ({}); pass io_maps",
                        labels[j],
                        plural(outs.len(), "output", "outputs"),
                        quoted(&outs),
                        labels[j + 1],
                        plural(ins.len(), "input", "inputs"),
                        quoted(&ins),
                    )));
                }
                outs.iter().zip(&ins).map(|(o, i)| (o.to_string(), i.to_string())).collect()
            }
        };
        for (o, i) in pairs {
            edges.push(Edge { from: j, output: o, to: j + 1, input: i });
            names.push(where_.clone());
        }
    }
    Ok((edges, names))
}

/// The index and the value info of input (or output) `name` of `stage`; the error names
/// the stage's inputs (or outputs) and the nearest ones, after `where_`.
pub(crate) fn stage_io<'m>(
    models: &'m [ModelProto],
    labels: &[String],
    where_: &str,
    stage: usize,
    name: &str,
    output: bool,
) -> Result<(usize, &'m ValueInfoProto)> {
    let Some(m) = models.get(stage) else {
        return Err(Error::composition(format!(
            "{where_}: there is no stage {stage} ({} given)",
            plural(models.len(), "stage", "stages")
        )));
    };
    let list = if output { &graph(m).output } else { &graph(m).input };
    if let Some(x) = list.iter().position(|v| vi_name(v) == name) {
        return Ok((x, &list[x]));
    }
    let names: Vec<&str> = list.iter().map(vi_name).collect();
    let what = if output { "output" } else { "input" };
    Err(Error::composition(format!(
        "{where_}: '{name}' is not an {what} of {}{}; its {what}s are {}",
        labels[stage],
        did_you_mean(name, names.iter().copied()),
        quoted(&names)
    )))
}
