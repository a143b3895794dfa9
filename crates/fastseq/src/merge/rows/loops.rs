//! Loop and Scan: their bodies followed like any graph, where the rows stay apart from one
//! step to the next. A Loop runs as many steps for every row (its trip count and condition
//! the same whatever the batch, the body's condition too); a Scan steps along an axis that
//! is not the batch axis. The values carried from step to step are followed to a fixed point
//! (their batch axis where it was), and each step's outputs stacked along a new axis.
use crate::codec::proto::{GraphProto, NodeProto};
use crate::merge::rows::value::{attr, int_attr, ints_attr, Dim, Elem, Val, BY_PLACE, T};
use crate::merge::rows::{join, Cx, Fault, Scope, Site};

/// Steps the analysis takes to reach the carried values' fixed point before refusing.
const ROUNDS: usize = 4;

impl Cx<'_> {
    /// A Loop (`M`, `cond`, carried values...; its body: iteration, cond, carried... ->
    /// cond, carried..., scan outputs...).
    pub(super) fn loop_node(
        &self,
        node: &NodeProto,
        top: usize,
        ins: &[Option<T>],
        scope: &Scope,
        site: &Site,
    ) -> Result<Vec<Val>, Fault> {
        for (k, what) in [(0, "trip count"), (1, "condition")] {
            match ins.get(k).and_then(Option::as_ref) {
                Some(t) if t.batch().is_some() => return Err(here(format!("Loop reads its {what} from the rows"))),
                Some(t) if t.on_n => {
                    return Err(here(format!("Loop computes its {what} from the number of rows")));
                }
                _ => {}
            }
        }
        let body = graph_attr(node, "body", "Loop")?;
        let carried: Vec<T> = ins.iter().skip(2).map(|t| t.clone().unwrap_or_default()).collect();
        let fixed_scalar = T::ints(true, vec![Elem::Free(None)]);
        let (carried, outs) = self.to_fixed_point(node, top, body, scope, site, carried, |carried| {
            [vec![fixed_scalar.clone(), T::shaped(vec![])], carried.to_vec()].concat()
        })?;
        let Some((cond, rest)) = outs.split_first() else { return Err(here("Loop's body has no outputs".into())) };
        if cond.batch().is_some() || cond.on_n {
            return Err(here("Loop stops by a condition computed from the rows".into()));
        }
        let scans = rest.get(carried.len()..).unwrap_or_default();
        let stacked = scans.iter().map(|t| stack(t, 0)).collect::<Result<Vec<T>, Fault>>()?;
        Ok(carried.into_iter().chain(stacked).map(Val::T).collect())
    }

    /// A Scan (opset 9 on: states..., scan inputs...; its body: states..., one step's slice
    /// of each scan input -> states..., one step of each scan output).
    pub(super) fn scan_node(
        &self,
        node: &NodeProto,
        top: usize,
        ins: &[Option<T>],
        scope: &Scope,
        site: &Site,
    ) -> Result<Vec<Val>, Fault> {
        if site.opset < 9 {
            return Err(here("Scan before opset 9 steps along its own batch axis".into()));
        }
        let body = graph_attr(node, "body", "Scan")?;
        let m = int_attr(node, "num_scan_inputs").and_then(|m| usize::try_from(m).ok()).unwrap_or(0);
        let n = ins.len().checked_sub(m).ok_or_else(|| here("Scan has fewer inputs than num_scan_inputs".into()))?;
        let in_axes = ints_attr(node, "scan_input_axes").unwrap_or_else(|| vec![0; m]);
        let mut slices = Vec::with_capacity(m);
        for (j, x) in ins[n..].iter().enumerate() {
            let x = x.clone().unwrap_or_default();
            let a = *in_axes.get(j).unwrap_or(&0);
            slices.push(slice(&x, a)?);
        }
        let states: Vec<T> = ins[..n].iter().map(|t| t.clone().unwrap_or_default()).collect();
        let (states, outs) =
            self.to_fixed_point(node, top, body, scope, site, states, |states| [states, &slices[..]].concat())?;
        let out_axes = ints_attr(node, "scan_output_axes").unwrap_or_default();
        let scans = outs.get(states.len()..).unwrap_or_default();
        let stacked = scans
            .iter()
            .enumerate()
            .map(|(k, t)| stack(t, *out_axes.get(k).unwrap_or(&0)))
            .collect::<Result<Vec<T>, Fault>>()?;
        Ok(states.into_iter().chain(stacked).map(Val::T).collect())
    }

    /// Follows `body` with the carried values `carried` (and the other inputs `inputs`
    /// makes around them) until they come out as they went in: the carried values at that
    /// point, and the body's outputs after them.
    #[allow(clippy::too_many_arguments)]
    fn to_fixed_point(
        &self,
        node: &NodeProto,
        top: usize,
        body: &GraphProto,
        scope: &Scope,
        site: &Site,
        mut carried: Vec<T>,
        inputs: impl Fn(&[T]) -> Vec<T>,
    ) -> Result<(Vec<T>, Vec<T>), Fault> {
        let op = node.op_type.as_deref().unwrap_or("");
        let at = Site {
            top: Some(top),
            within: format!(" in the body of {op} '{}'{}", node.name.as_deref().unwrap_or(""), site.within),
            opset: site.opset,
            depth: site.depth + 1,
        };
        // The Loop's outputs start with its condition: the carried values come after it.
        let skip = usize::from(op == "Loop");
        for _ in 0..ROUNDS {
            let outs = self.body(body, inputs(&carried), scope, &at)?;
            let after: Vec<&T> = outs.iter().skip(skip).take(carried.len()).collect();
            if after.len() != carried.len() {
                return Err(here(format!("{op}'s body gives fewer values than it carries")));
            }
            let mut next = Vec::with_capacity(carried.len());
            for (before, after) in carried.iter().zip(after) {
                let same_rows = before.batch() == after.batch()
                    && before.rank() == after.rank()
                    && before.merged == after.merged
                    && before.loose == after.loose
                    && [before, after].iter().all(|t| t.place.is_none() && t.flat.is_none());
                if !same_rows {
                    return Err(here(format!(
                        "{op} carries a value from step to step whose rows are laid out differently after a step"
                    )));
                }
                next.push(join(before, after));
            }
            if next == carried {
                return Ok((carried, outs));
            }
            carried = next;
        }
        Err(here(format!("{op} carries values the analysis does not settle")))
    }

    /// The outputs of a subgraph run with `inputs` (by position), reading its parents' values.
    fn body(&self, g: &GraphProto, inputs: Vec<T>, scope: &Scope, site: &Site) -> Result<Vec<T>, Fault> {
        if inputs.len() != g.input.len() {
            return Err(here("a body takes another number of inputs than it is given".into()));
        }
        let mut inner = Scope::new(Some(scope));
        for (vi, t) in g.input.iter().zip(inputs) {
            inner.set(vi.name.clone().unwrap_or_default(), Val::T(t));
        }
        self.graph_nodes(g, &mut inner, site);
        g.output
            .iter()
            .map(|o| match inner.get(o.name.as_deref().unwrap_or("")) {
                Some(Val::T(t)) => Ok(t.clone()),
                Some(Val::Mixed(w)) => Err(Fault::From(w.clone())),
                _ => Err(here(format!("a body's output '{}' is not computed", o.name.as_deref().unwrap_or("")))),
            })
            .collect()
    }
}

fn here(reason: String) -> Fault {
    Fault::Here(reason)
}

fn graph_attr<'n>(node: &'n NodeProto, name: &str, op: &str) -> Result<&'n GraphProto, Fault> {
    attr(node, name).and_then(|a| a.g.as_ref()).ok_or_else(|| here(format!("{op} has no {name}")))
}

/// Slices and stacks are built as plain values (their dims only), which would forget that a
/// value holds each row's place in the batch or rows merged with an axis of unknown size: a
/// body's scan output of `Unsqueeze(places)` stacked and squeezed back would be read as
/// row-wise data (each row's place, which differs alone and in a batch). Refused instead.
fn refuse_places(t: &T) -> Result<(), Fault> {
    if t.place.is_some() {
        return Err(here(format!("stacks each row's place in the batch as data ({BY_PLACE})")));
    }
    if t.flat.is_some() {
        return Err(here("stacks a batch axis merged with an axis of a size that cannot be told".into()));
    }
    Ok(())
}

/// One step's slice of a scan input along axis `a`: refused along the batch axis (a state
/// would carry one row into the next).
fn slice(x: &T, a: i64) -> Result<T, Fault> {
    refuse_places(x)?;
    let Some(dims) = x.dims() else {
        if x.batch().is_some() || x.loose {
            return Err(here("Scan steps along an axis of rows whose shape cannot be told".into()));
        }
        return Ok(T::opaque(x.on_n));
    };
    let k = crate::merge::rows::value::axis(a, dims.len()).map_err(here)?;
    if dims[k] == Dim::Batch {
        return Err(here("Scan steps along the batch axis: each step's state carries one row into the next".into()));
    }
    let mut d = dims.to_vec();
    d.remove(k);
    Ok(T { on_n: x.on_n, merged: x.merged, ..T::shaped(d) })
}

/// Each step's `t` stacked along a new axis `a` (of the result's rank).
fn stack(t: &T, a: i64) -> Result<T, Fault> {
    refuse_places(t)?;
    let Some(dims) = t.dims() else {
        if t.batch().is_some() || t.loose {
            return Err(here("stacks steps of rows whose shape cannot be told".into()));
        }
        return Ok(T::opaque(t.on_n));
    };
    let k = crate::merge::rows::value::axis(a, dims.len() + 1).map_err(here)?;
    let mut d = dims.to_vec();
    d.insert(k, Dim::Free(None));
    Ok(T { on_n: t.on_n, merged: t.merged, ..T::shaped(d) })
}

#[cfg(test)]
mod tests {
    use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
    use crate::codec::testing::value_of as vi;
    use crate::merge::rows::testing::{int, ints, node as n};

    fn floats(name: &str, n: usize) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: vec![n as i64],
            data_type: Some(1),
            float_data: vec![0.5; n],
            ..Default::default()
        }
    }

    fn along(axis: i64) -> AttributeProto {
        AttributeProto { name: Some("scan_input_axes".into()), ints: vec![axis], r#type: Some(7), ..Default::default() }
    }

    fn body(nodes: Vec<NodeProto>, ins: &[&str], outs: &[&str]) -> AttributeProto {
        let g = GraphProto {
            node: nodes.iter().map(crate::codec::node::encode).collect(),
            input: ins.iter().map(|s| vi(s, &[])).collect(),
            output: outs.iter().map(|s| vi(s, &[])).collect(),
            ..Default::default()
        };
        AttributeProto { name: Some("body".into()), g: Some(g), r#type: Some(5), ..Default::default() }
    }

    fn findings(nodes: Vec<NodeProto>, x: &[&str]) -> Vec<String> {
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: nodes.iter().map(crate::codec::node::encode).collect(),
                input: vec![vi("x", x)],
                output: vec![vi("y", &[])],
                initializer: vec![
                    ints("three", &[3], true),
                    ints("zero", &[0], true),
                    ints("one", &[1], true),
                    ints("ax1", &[1], false),
                    floats("w", 4),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        crate::merge::rows::testing::findings(&m)
    }

    /// y = x + 0.5, three times, by a Loop carrying x; `step` is the body's carried update.
    fn looped(trip: &str, step: NodeProto, cond: NodeProto) -> Vec<String> {
        let b = body(vec![step, cond], &["i", "c", "h"], &["c_out", "h_out", "h_out"]);
        findings(
            vec![
                n("Shape", &["x"], &["s"], vec![]),
                n("Gather", &["s", "zero"], &["rows"], vec![int("axis", 0)]),
                n("Loop", &[trip, "", "x"], &["y", "steps"], vec![b]),
            ],
            &["N", "4"],
        )
    }

    fn same_cond() -> NodeProto {
        n("Identity", &["c"], &["c_out"], vec![])
    }

    #[test]
    fn a_loop_whose_steps_keep_the_rows_apart_keeps_them_apart() {
        assert_eq!(looped("three", n("Add", &["h", "w"], &["h_out"], vec![]), same_cond()), Vec::<String>::new());
    }

    #[test]
    fn a_loop_that_mixes_rows_or_steps_by_them_is_refused() {
        let one = |found: Vec<String>, at: &str, why: &str| {
            assert!(found.len() == 1 && found[0].starts_with(at) && found[0].contains(why), "{found:?}");
        };
        let add = || n("Add", &["h", "w"], &["h_out"], vec![]);
        one(looped("rows", add(), same_cond()), "Loop", "trip count from the number of rows");
        let by_rows = n("ReduceMax", &["h"], &["c_out"], vec![int("keepdims", 0)]);
        one(looped("three", add(), by_rows), "Loop", "");
        let per_row = n("Cast", &["h"], &["c_out"], vec![int("to", 9)]);
        one(looped("three", add(), per_row), "Loop", "condition computed from the rows");
        let softmax = n("Softmax", &["h"], &["h_out"], vec![int("axis", 0)]);
        one(looped("three", softmax, same_cond()), "Loop", "batch axis");
        let moved = n("Transpose", &["h"], &["h_out"], vec![]);
        one(looped("three", moved, same_cond()), "Loop", "laid out differently");
    }

    #[test]
    fn each_rows_place_stacked_by_a_loop_or_a_scan_is_refused() {
        // The body's output: Unsqueeze of the rows' places (a Range over the batch size).
        let mut nodes = vec![
            n("Shape", &["x"], &["s"], vec![]),
            n("Gather", &["s", "zero"], &["rows"], vec![int("axis", 0)]),
            n("Range", &["zero", "rows", "one"], &["b"], vec![]),
        ];
        let b = body(
            vec![n("Unsqueeze", &["b", "ax1"], &["u"], vec![]), n("Identity", &["c"], &["c_out"], vec![])],
            &["i", "c"],
            &["c_out", "u"],
        );
        nodes.push(n("Loop", &["three", ""], &["y"], vec![b]));
        let found = findings(nodes.clone(), &["N", "4"]);
        assert!(found.len() == 1 && found[0].starts_with("Loop") && found[0].contains("place"), "{found:?}");
        let b = body(
            vec![n("Unsqueeze", &["b", "ax1"], &["u"], vec![]), n("Identity", &["xt"], &["xo"], vec![])],
            &["xt"],
            &["u", "xo"],
        );
        nodes.pop();
        nodes.push(n("Scan", &["x"], &["y", "xs"], vec![b, int("num_scan_inputs", 1), along(1)]));
        let found = findings(nodes, &["N", "4"]);
        assert!(found.len() == 1 && found[0].starts_with("Scan") && found[0].contains("place"), "{found:?}");
    }

    /// A Scan over x [N, T, 4] along `axis`, a running sum per row as its state.
    fn scanned(axis: i64) -> Vec<String> {
        let b = body(
            vec![n("Add", &["s", "step"], &["s_out"], vec![]), n("Identity", &["s_out"], &["each"], vec![])],
            &["s", "step"],
            &["s_out", "each"],
        );
        let axes = along(axis);
        findings(
            vec![
                n("ReduceSum", &["x", "ax1"], &["s0"], vec![int("keepdims", 0)]),
                n("Scan", &["s0", "x"], &["y", "all"], vec![b, int("num_scan_inputs", 1), axes]),
            ],
            &["N", "T", "4"],
        )
    }

    #[test]
    fn a_scan_along_another_axis_keeps_the_rows_and_along_the_batch_is_refused() {
        assert_eq!(scanned(1), Vec::<String>::new());
        let found = scanned(0);
        assert!(found.iter().any(|f| f.starts_with("Scan") && f.contains("along the batch axis")), "{found:?}");
    }
}

#[cfg(test)]
mod nesting {
    use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, TensorProto};
    use crate::codec::testing::value_of as vi;
    use crate::merge::rows::row_findings;
    use crate::merge::rows::testing::node as n;

    #[test]
    fn loops_nested_deep_are_refused_without_following_every_step() {
        // Each level carries a counter whose value the first round knows and the second does
        // not: every level takes two rounds, so 24 levels would be 2^24 body runs.
        let one =
            TensorProto { name: Some("one".into()), data_type: Some(7), int64_data: vec![1], ..Default::default() };
        let mut body: Option<GraphProto> = None;
        for level in 0..24 {
            let mut nodes = vec![n("Add", &["k", "one"], &["k2"], vec![]), n("Identity", &["c"], &["c2"], vec![])];
            if let Some(inner) = body.take() {
                let attr =
                    AttributeProto { name: Some("body".into()), g: Some(inner), r#type: Some(5), ..Default::default() };
                // Started afresh at each level: every time a level is followed, two rounds.
                nodes.push(n("Loop", &["one", "", "zero"], &["unused"], vec![attr]));
            }
            body = Some(GraphProto {
                name: Some(format!("level{level}")),
                node: nodes.iter().map(crate::codec::node::encode).collect(),
                input: vec![vi("i", &[]), vi("c", &[]), vi("k", &[])],
                output: vec![vi("c2", &[]), vi("k2", &[])],
                ..Default::default()
            });
        }
        let attr = AttributeProto { name: Some("body".into()), g: body, r#type: Some(5), ..Default::default() };
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: [n("Loop", &["one", "", "zero"], &["count"], vec![attr]), n("Identity", &["x"], &["y"], vec![])]
                    .iter()
                    .map(crate::codec::node::encode)
                    .collect(),
                input: vec![vi("x", &["N", "4"])],
                output: vec![vi("y", &["N", "4"]), vi("count", &[])],
                initializer: vec![
                    one,
                    TensorProto {
                        name: Some("zero".into()),
                        data_type: Some(7),
                        int64_data: vec![0],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let found = row_findings(&m);
        assert!(
            found
                .iter()
                .any(|f| f.reason.contains("nodes the analysis follows") || f.reason.contains("nested too deep")),
            "{found:?}"
        );
        assert!(started.elapsed().as_secs() < 60, "took {:?}", started.elapsed());
    }
}
