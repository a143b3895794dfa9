//! A row's own place in the batch, followed only where it indexes that row's own entries.
//!
//! transformers (5) builds BERT's and DistilBERT's padding mask as `flat[b * L + k]`:
//! `b = Range(0, N)` (N read from the batch axis), `k = Range(0, L)`, both unsqueezed, a
//! `Mul`, an `Add`, then a `Gather` on axis 0 of `Flatten(mask, axis=2)` (`[N * L, 1]`). A
//! row's place `b` differs alone and in a batch, so anything else done with it mixes rows;
//! but `b * S + k` with `0 <= k < S`, gathered from a batch axis that holds `S` entries per
//! row (one block, the rows in order), reads exactly row `b`'s own entries. The analysis
//! follows that and nothing more: S must be a known size (a fixed sequence length), and a
//! value that holds a row's place reaches no operator but Unsqueeze, Mul by a known positive
//! size, Add of bounded offsets, Shape, and Gather as indices; anything else is refused with
//! the reason Range always had.
use crate::merge::rows::args::{one, Args, Outs, R};
use crate::merge::rows::elementwise::broadcast;
use crate::merge::rows::value::{int_attr, Dim, Elem, Place, BY_PLACE, T};

/// `Range(start, limit, delta)` over the number of rows: each row's place, from 0 by 1 up to
/// the batch size exactly. None where it is not that.
pub fn range(args: &Args) -> Option<T> {
    let known = |k: usize| args.get(k).and_then(T::known_one);
    let limit = args.get(1)?;
    let batch = limit.batch().is_none() && matches!(limit.ints.as_deref(), Some([Elem::Batch]));
    (batch && known(0) == Some(0) && known(2) == Some(1))
        .then(|| T { place: Some(Place { stride: 1, within: 1 }), ..T::shaped(vec![Dim::Batch]) })
}

/// An operator reading a value that holds the rows' places (`ins` has one, at least).
pub fn step(args: &Args, default_domain: bool) -> R<Outs> {
    let op = args.op();
    let refused = || Err(format!("{op} reads each row's place in the batch ({BY_PLACE})"));
    if !default_domain {
        return refused();
    }
    // Shape rules read no values: they run on the same inputs, their places forgotten.
    let plain: Vec<Option<T>> = args.ins.iter().map(|t| t.clone().map(|t| T { place: None, ..t })).collect();
    let plain = Args { node: args.node, ins: &plain, opset: args.opset };
    match op {
        "Unsqueeze" if args.get(1).is_none_or(|a| a.place.is_none()) => {
            let place = args.need(0)?.place;
            let outs = crate::merge::rows::shape::step(&plain, op)?;
            Ok(outs.into_iter().map(|o| o.map(|t| T { place, ..t })).collect())
        }
        // Only the shape is read: the same as that of any value with a batch axis.
        "Shape" | "Size" => crate::merge::rows::shape::step(&plain, op),
        "Mul" => scaled(args).map_or_else(refused, one),
        "Add" => offset(args).map_or_else(refused, one),
        "Gather" => gathered(args).map_or_else(refused, one),
        _ => refused(),
    }
}

/// The two inputs of a binary operator as (the one with places, the other).
fn pair<'a>(args: &Args<'a>) -> Option<(&'a T, Place, &'a T)> {
    if args.ins.len() != 2 {
        return None;
    }
    let (a, b) = (args.get(0)?, args.get(1)?);
    match (a.place, b.place) {
        (Some(p), None) => Some((a, p, b)),
        (None, Some(p)) => Some((b, p, a)),
        _ => None,
    }
}

/// `places * c`, c a known positive integer the same for every row: the stride of the rows.
fn scaled(args: &Args) -> Option<T> {
    let (x, p, c) = pair(args)?;
    let factor = c.known_one().filter(|&v| v > 0 && c.fixed())?;
    if p.within != 1 {
        return None; // an offset scaled too: no longer inside a row's block
    }
    let stride = p.stride.checked_mul(factor)?;
    let t = broadcast("Mul", &[x, c]).ok()?;
    Some(T { place: Some(Place { stride, within: 1 }), ..T::shaped(t.dims?) })
}

/// `places + k`, every k in `[0, stride)`: an entry inside the row's own block.
fn offset(args: &Args) -> Option<T> {
    let (x, p, k) = pair(args)?;
    let bound = k.below.filter(|&b| k.fixed() && b <= p.stride)?;
    if p.within != 1 {
        return None;
    }
    let t = broadcast("Add", &[x, k]).ok()?;
    Some(T { place: Some(Place { stride: p.stride, within: bound }), ..T::shaped(t.dims?) })
}

/// `Gather(data, places, axis=0)`, the data's batch axis holding `stride` entries per row in
/// one block of rows: each row picks among its own entries, so the result is row-wise, its
/// batch axis where the indices have theirs.
fn gathered(args: &Args) -> Option<T> {
    let (data, idx) = (args.get(0)?, args.get(1)?);
    let p = idx.place?;
    let a = int_attr(args.node, "axis").unwrap_or(0);
    let dd = data.dims()?;
    let own_block = data.batch() == Some(0) && data.layout() == (1, p.stride) && (a == 0 || a == -(dd.len() as i64));
    if data.place.is_some() || data.on_n || idx.on_n || !own_block || p.within > p.stride {
        return None;
    }
    let dims: Vec<Dim> = idx.dims()?.iter().chain(&dd[1..]).copied().collect();
    Some(T::shaped(dims))
}

#[cfg(test)]
mod tests {
    use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
    use crate::codec::testing::value_of as vi;
    use crate::merge::rows::row_findings;

    fn ints(name: &str, v: &[i64], scalar: bool) -> TensorProto {
        let dims = if scalar { vec![] } else { vec![v.len() as i64] };
        TensorProto { name: Some(name.into()), dims, data_type: Some(7), int64_data: v.to_vec(), ..Default::default() }
    }

    fn n(op: &str, ins: &[&str], out: &str, axis: Option<i64>) -> NodeProto {
        NodeProto {
            op_type: Some(op.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            attribute: axis
                .map(|i| AttributeProto {
                    name: Some("axis".into()),
                    i: Some(i),
                    r#type: Some(2),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    /// transformers' padding mask, `flat[b * L + k]` over `x` of `[N, seq]`, row by row equal
    /// to `x`; `change` rewrites one node (by its output) to make a variant.
    fn mask(seq: &str, change: impl Fn(&mut NodeProto)) -> Vec<String> {
        let mut nodes = vec![
            n("Shape", &["x"], "s", None),
            n("Gather", &["s", "zero"], "rows", Some(0)),
            n("Gather", &["s", "one"], "len", Some(0)),
            n("Range", &["zero", "rows", "one"], "b", None),
            n("Unsqueeze", &["b", "axis1"], "b1", None),
            n("Mul", &["b1", "len"], "bs", None),
            n("Range", &["zero", "len", "one"], "k", None),
            n("Unsqueeze", &["k", "axis0"], "k1", None),
            n("Add", &["bs", "k1"], "idx", None),
            n("Flatten", &["x"], "flat", Some(2)),
            n("Gather", &["flat", "idx"], "g", Some(0)),
            n("Squeeze", &["g", "axis2"], "y", None),
        ];
        nodes.iter_mut().for_each(&change);
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: nodes.iter().map(crate::codec::node::encode).collect(),
                input: vec![vi("x", &["N", seq])],
                output: vec![vi("y", &["N", seq])],
                initializer: vec![
                    ints("zero", &[0], true),
                    ints("one", &[1], true),
                    ints("eleven", &[11], true),
                    ints("thirteen", &[13], true),
                    ints("axis0", &[0], false),
                    ints("axis1", &[1], false),
                    ints("axis2", &[2], false),
                    ints("table", &[0; 64], false),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        row_findings(&m).into_iter().map(|f| format!("{}: {}", f.op_type, f.reason)).collect()
    }

    fn set(out: &'static str, ins: &'static [&'static str]) -> impl Fn(&mut NodeProto) {
        move |node| {
            if node.output[0] == out {
                node.input = ins.iter().map(|s| s.to_string()).collect();
            }
        }
    }

    #[test]
    fn each_row_indexing_its_own_entries_by_its_place_keeps_the_rows_apart() {
        assert_eq!(mask("12", |_| ()), Vec::<String>::new());
    }

    #[test]
    fn a_place_used_any_other_way_is_refused() {
        let refused = |found: Vec<String>, at: &str| {
            assert!(
                found.len() == 1 && found[0].starts_with(at) && found[0].contains(crate::merge::rows::value::BY_PLACE),
                "{found:?}"
            );
        };
        // A sequence length the graph does not fix: the stride cannot be shown to be the
        // flattened rows' size (the first refusal reached is the Flatten's).
        let found = mask("L", |_| ());
        assert!(found.len() == 1 && found[0].starts_with("Flatten"), "{found:?}");
        // A stride other than the entries per row, or offsets past it, read the next row.
        refused(mask("12", set("bs", &["b1", "eleven"])), "Add");
        let eleven = |node: &mut NodeProto| {
            set("bs", &["b1", "eleven"])(node);
            set("k", &["zero", "eleven", "one"])(node);
        };
        refused(mask("12", eleven), "Gather");
        refused(mask("12", set("k", &["zero", "thirteen", "one"])), "Add");
        // Places counted from 1, or offsets scaled with them.
        refused(mask("12", set("b", &["one", "rows", "one"])), "Range");
        refused(
            mask("12", |node| {
                if node.output[0] == "y" {
                    *node = n("Mul", &["idx", "len"], "y", None)
                }
            }),
            "Mul",
        );
        // Places as data, or looking up a table that is the same for every row.
        refused(mask("12", set("g", &["table", "idx"])), "Gather");
        refused(
            mask("12", |node| {
                if node.output[0] == "y" {
                    *node = n("Cast", &["idx"], "y", None)
                }
            }),
            "Cast",
        );
        // Places kept as an output.
        let found = mask("12", |node| {
            if node.output[0] == "y" {
                *node = n("Identity", &["idx"], "y", None)
            }
        });
        assert!(found.iter().any(|f| f.contains("place")), "{found:?}");
    }
}
