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
use crate::merge::rows::value::{int_attr, Dim, Elem, Place, Sym, BY_PLACE, T};

/// `Range(start, limit, delta)` over the number of rows: each row's place, from 0 by 1 up to
/// the batch size exactly. None where it is not that.
pub fn range(args: &Args) -> Option<T> {
    let known = |k: usize| args.get(k).and_then(T::known_one);
    let limit = args.get(1)?;
    let batch = limit.batch().is_none() && matches!(limit.ints.as_deref(), Some([Elem::Batch]));
    let one_by_one = Place { stride: Elem::Known(1), within: Elem::Known(1) };
    (batch && known(0) == Some(0) && known(2) == Some(1))
        .then(|| T { place: Some(one_by_one), ..T::shaped(vec![Dim::Batch]) })
}

/// `Flatten` or `Reshape(x, [-1])` of rows `x` (`[N, ...]`, one entry per row) whose other
/// axes hold exactly one input axis of unknown size and otherwise 1s: the batch axis merged
/// with that axis, each row's entries after the other's. None where it is not that (the
/// shape rules say what it is).
pub fn flattened(args: &Args) -> Option<T> {
    let x = args.get(0)?;
    let dims = x.dims()?;
    if x.batch() != Some(0) || x.layout() != (1, 1) || x.on_n || x.place.is_some() || x.flat.is_some() {
        return None;
    }
    let (merged, rest): (&[Dim], Vec<Dim>) = match args.op() {
        "Flatten" => {
            let a = usize::try_from(int_attr(args.node, "axis").unwrap_or(1)).ok().filter(|&a| a <= dims.len())?;
            let after = dims[a..]
                .iter()
                .try_fold(1i64, |acc, d| if let Dim::Fixed(v) = d { acc.checked_mul(*v) } else { None });
            (dims.get(1..a)?, vec![after.map_or(Dim::Free(None), Dim::Fixed)])
        }
        "Reshape" if args.get(1).and_then(T::known).as_deref() == Some(&[-1]) => (&dims[1..], vec![]),
        _ => return None,
    };
    let s = one_size(merged)?;
    Some(T { flat: Some(s), ..T::shaped([vec![Dim::Batch], rest].concat()) })
}

/// The one input axis of unknown size among `dims`, the others all 1.
fn one_size(dims: &[Dim]) -> Option<Sym> {
    let mut found = None;
    for d in dims {
        match d {
            Dim::Fixed(1) => {}
            Dim::Free(Some(s)) if found.is_none() => found = Some(*s),
            _ => return None,
        }
    }
    found
}

/// An operator reading a value that holds the rows' places or rows merged with an axis of
/// unknown size (`ins` has one, at least).
pub fn step(args: &Args, default_domain: bool) -> R<Outs> {
    let op = args.op();
    let refused = || {
        if args.ins.iter().flatten().any(|t| t.place.is_some()) {
            Err(format!("{op} reads each row's place in the batch ({BY_PLACE})"))
        } else {
            Err(format!("{op} reads a batch axis merged with an axis of a size that cannot be told"))
        }
    };
    if !default_domain || args.ins.iter().flatten().any(|t| t.flat.is_some() && t.place.is_some()) {
        return refused();
    }
    let flat = args.get(0).and_then(|t| t.flat);
    let has_flat = args.ins.iter().flatten().any(|t| t.flat.is_some());
    // Shape rules read no values: they run on the same inputs, their places forgotten.
    let plain: Vec<Option<T>> = args.ins.iter().map(|t| t.clone().map(|t| T { place: None, ..t })).collect();
    let plain = Args { node: args.node, ins: &plain, opset: args.opset };
    match op {
        "Unsqueeze" if !has_flat && args.get(1).is_none_or(|a| a.place.is_none()) => {
            let place = args.need(0)?.place;
            let outs = crate::merge::rows::shape::step(&plain, op)?;
            Ok(outs.into_iter().map(|o| o.map(|t| T { place, ..t })).collect())
        }
        // Only the shape is read: the same as that of any value with a batch axis.
        "Shape" | "Size" if !has_flat => crate::merge::rows::shape::step(&plain, op),
        "Mul" if !has_flat => scaled(args).map_or_else(refused, one),
        "Add" if !has_flat => offset(args).map_or_else(refused, one),
        "Gather" => gathered(args).map_or_else(refused, one),
        "Reshape" if flat.is_some() => unflattened(args).map_or_else(refused, one),
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

/// `places * c`, c a known positive integer or an input's size, the same for every row: the
/// stride of the rows.
fn scaled(args: &Args) -> Option<T> {
    let (x, p, c) = pair(args)?;
    if !c.fixed() || p.within != Elem::Known(1) {
        return None; // an offset scaled too: no longer inside a row's block
    }
    let stride = match (p.stride, c.ints.as_deref()?) {
        (Elem::Known(a), [Elem::Known(b)]) if *b > 0 => Elem::Known(a.checked_mul(*b)?),
        (Elem::Known(1), [size @ Elem::Free(Some(_))]) => *size,
        _ => return None,
    };
    let t = broadcast("Mul", &[x, c]).ok()?;
    Some(T { place: Some(Place { stride, within: Elem::Known(1) }), ..T::shaped(t.dims?) })
}

/// `places + k`, every k in `[0, stride)`: an entry inside the row's own block.
fn offset(args: &Args) -> Option<T> {
    let (x, p, k) = pair(args)?;
    let bound = k.below.filter(|&b| k.fixed() && at_most(b, p.stride))?;
    if p.within != Elem::Known(1) {
        return None;
    }
    let t = broadcast("Add", &[x, k]).ok()?;
    Some(T { place: Some(Place { stride: p.stride, within: bound }), ..T::shaped(t.dims?) })
}

/// Whether `a <= b` for certain: two known numbers, or one input's size twice.
fn at_most(a: Elem, b: Elem) -> bool {
    match (a, b) {
        (Elem::Known(x), Elem::Known(y)) => x <= y,
        (Elem::Free(Some(s)), Elem::Free(Some(t))) => s == t,
        _ => false,
    }
}

/// `Gather(data, places, axis=0)`, the data's batch axis holding `stride` entries per row in
/// one block of rows: each row picks among its own entries, so the result is row-wise, its
/// batch axis where the indices have theirs.
fn gathered(args: &Args) -> Option<T> {
    let (data, idx) = (args.get(0)?, args.get(1)?);
    let p = idx.place?;
    let a = int_attr(args.node, "axis").unwrap_or(0);
    let dd = data.dims()?;
    let per_row = match (data.flat, data.layout()) {
        (Some(s), (1, 1)) => Elem::Free(Some(s)),
        (None, (1, inner)) => Elem::Known(inner),
        _ => return None,
    };
    let axis0 = a == 0 || a == -(dd.len() as i64);
    if data.batch() != Some(0) || !axis0 || data.place.is_some() || data.on_n || idx.on_n || idx.flat.is_some() {
        return None;
    }
    if p.stride != per_row || !at_most(p.within, p.stride) {
        return None;
    }
    let dims: Vec<Dim> = idx.dims()?.iter().chain(&dd[1..]).copied().collect();
    Some(T::shaped(dims))
}

/// `Reshape` of rows merged with an input axis of unknown size back to `[N, ...]`, the axes
/// after the batch holding exactly that size (1s, and that size or one -1).
fn unflattened(args: &Args) -> Option<T> {
    let (x, target) = (args.get(0)?, args.get(1)?);
    let s = x.flat?;
    let xdims = x.dims()?;
    if xdims.first() != Some(&Dim::Batch) || xdims[1..].iter().any(|d| *d != Dim::Fixed(1)) {
        return None;
    }
    if target.batch().is_some() || target.on_n && target.ints.is_none() || target.place.is_some() {
        return None;
    }
    let elems = target.ints.as_deref()?;
    let (first, rest) = elems.split_first()?;
    if *first != Elem::Batch || int_attr(args.node, "allowzero").unwrap_or(0) == 1 {
        return None;
    }
    let mut dims = vec![Dim::Batch];
    let mut seen = false;
    for e in rest {
        dims.push(match e {
            Elem::Known(1) => Dim::Fixed(1),
            Elem::Known(-1) | Elem::Free(Some(_)) if !seen && (*e == Elem::Known(-1) || *e == Elem::Free(Some(s))) => {
                seen = true;
                Dim::Free(Some(s))
            }
            _ => return None,
        });
    }
    seen.then(|| T::shaped(dims))
}

#[cfg(test)]
mod tests {
    use crate::codec::proto::{AttributeProto, GraphProto, ModelProto, NodeProto};
    use crate::codec::testing::value_of as vi;
    use crate::merge::rows::testing::{findings, int, ints, node};

    /// A node writing `out`, with an `axis` where given.
    fn n(op: &str, ins: &[&str], out: &str, axis: Option<i64>) -> NodeProto {
        node(op, ins, &[out], axis.map(|a| int("axis", a)).into_iter().collect())
    }

    /// transformers' padding mask, `flat[b * L + k]` over `x` of `[N, seq]`, row by row equal
    /// to `x`; `change` edits the nodes to make a variant.
    fn mask(seq: &str, change: impl Fn(&mut Vec<NodeProto>)) -> Vec<String> {
        let mut nodes = vec![
            n("Shape", &["w"], "ws", None),
            n("Gather", &["ws", "one"], "wlen", Some(0)),
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
        change(&mut nodes);
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: crate::codec::testing::opset17(),
            graph: Some(GraphProto {
                node: nodes.iter().map(crate::codec::node::encode).collect(),
                input: vec![vi("x", &["N", seq]), vi("w", &["N", seq])],
                output: vec![vi("y", &["N", seq])],
                initializer: vec![
                    ints("zero", &[0], true),
                    ints("one", &[1], true),
                    ints("eleven", &[11], true),
                    ints("thirteen", &[13], true),
                    ints("axis0", &[0], false),
                    ints("axis1", &[1], false),
                    ints("axis2", &[2], false),
                    ints("minus1", &[-1], false),
                    ints("table", &[0; 64], false),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        findings(&m)
    }

    /// Sets the inputs of the node writing `out`.
    fn set(out: &'static str, ins: &'static [&'static str]) -> impl Fn(&mut Vec<NodeProto>) {
        move |nodes| {
            for node in nodes.iter_mut().filter(|node| node.output[0] == out) {
                node.input = ins.iter().map(|s| s.to_string()).collect();
            }
        }
    }

    /// Replaces the last node (writing `y`) with `last`.
    fn ending(last: NodeProto) -> impl Fn(&mut Vec<NodeProto>) {
        move |nodes| *nodes.last_mut().expect("nodes") = last.clone()
    }

    #[test]
    fn each_row_indexing_its_own_entries_by_its_place_keeps_the_rows_apart() {
        assert_eq!(mask("12", |_| ()), Vec::<String>::new());
        // An input's size, read with Shape, is one size wherever it is read.
        assert_eq!(mask("L", |_| ()), Vec::<String>::new());
        // Through Reshape(g, [-1]) and back to the indices' shape, as transformers does.
        let back = |nodes: &mut Vec<NodeProto>| {
            nodes.pop();
            nodes.push(n("Reshape", &["g", "minus1"], "g1", None));
            nodes.push(n("Shape", &["idx"], "ishape", None));
            nodes.push(n("Reshape", &["g1", "ishape"], "y", None));
        };
        assert_eq!(mask("L", back), Vec::<String>::new());
        assert_eq!(mask("12", back), Vec::<String>::new());
    }

    /// `n` with an integer attribute `name` (Cast's `to`, Mod's `fmod`).
    fn with(mut node: NodeProto, name: &str, i: i64) -> NodeProto {
        node.attribute.push(AttributeProto {
            name: Some(name.into()),
            i: Some(i),
            r#type: Some(2),
            ..Default::default()
        });
        node
    }

    /// The mask with its stride computed by `nodes` (into `stride`) from the length `len`.
    fn stride(nodes: Vec<NodeProto>) -> impl Fn(&mut Vec<NodeProto>) {
        move |all| {
            let at = all.iter().position(|node| node.output[0] == "bs").expect("bs");
            all.splice(at..at, nodes.clone());
            set("bs", &["b1", "stride"])(all);
        }
    }

    #[test]
    fn shape_arithmetic_is_read_as_onnxruntime_computes_it_before_a_stride_is_trusted() {
        let refused = |found: Vec<String>| {
            assert!(found.len() == 1 && found[0].contains(crate::merge::rows::value::BY_PLACE), "{found:?}");
        };
        // Computed as the length itself: followed.
        let same = vec![with(n("Cast", &["len"], "l32", None), "to", 7), n("Identity", &["l32"], "stride", None)];
        assert_eq!(mask("L", stride(same)), Vec::<String>::new());
        // A size cast to bool is 1, to uint8 or float16 another number: no longer that size.
        for to in [9, 2, 10] {
            let cast = vec![
                with(n("Cast", &["len"], "lb", None), "to", to),
                with(n("Cast", &["lb"], "stride", None), "to", 7),
            ];
            refused(mask("L", stride(cast)));
        }
        // Every second element of [2, L] is [2].
        let every2 = vec![
            n("Unsqueeze", &["len", "axis0"], "lv", None),
            n("Concat", &["axis2", "lv"], "both", Some(0)),
            n("Slice", &["both", "axis0", "axis2", "axis0", "axis2"], "half", None),
            n("Gather", &["half", "minus1"], "stride", Some(0)),
        ];
        refused(mask("L", stride(every2)));
        // Mod(-1, 13) with fmod=1 is -1 (the dividend's sign), not 12.
        let fmod = vec![
            n("Neg", &["one"], "m1", None),
            n("Add", &["len", "one"], "l1", None),
            with(n("Mod", &["m1", "l1"], "stride", None), "fmod", 1),
        ];
        refused(mask("12", stride(fmod)));
        // A float division is not an integer one: Ceil(25 / 2) is 13, not 12.
        let ceil = vec![
            n("Add", &["len", "thirteen"], "l25", None),
            n("Add", &["one", "one"], "two", None),
            with(n("Cast", &["l25"], "f25", None), "to", 1),
            with(n("Cast", &["two"], "f2", None), "to", 1),
            n("Div", &["f25", "f2"], "q", None),
            n("Ceil", &["q"], "c", None),
            with(n("Cast", &["c"], "stride", None), "to", 7),
        ];
        refused(mask("12", stride(ceil)));
        // The row count cast to bool is 1: a Range up to it is not the rows' places.
        let one_row = |nodes: &mut Vec<NodeProto>| {
            let at = nodes.iter().position(|node| node.output[0] == "b").expect("b");
            nodes.splice(
                at..at,
                [with(n("Cast", &["rows"], "rb", None), "to", 9), with(n("Cast", &["rb"], "r1", None), "to", 7)],
            );
            set("b", &["zero", "r1", "one"])(nodes);
        };
        let found = mask("12", one_row);
        assert!(found.len() == 1 && found[0].starts_with("Range"), "{found:?}");
    }

    #[test]
    fn a_place_used_any_other_way_is_refused() {
        let refused = |found: Vec<String>, at: &str| {
            assert!(found.len() == 1 && found[0].starts_with(at), "{found:?}");
        };
        let by_place = |found: Vec<String>, at: &str| {
            assert!(found.len() == 1 && found[0].contains(crate::merge::rows::value::BY_PLACE), "{found:?}");
            refused(found, at);
        };
        // Another input's size, however named: not known to be the same size.
        by_place(mask("L", set("k", &["zero", "wlen", "one"])), "Add");
        let other = |nodes: &mut Vec<NodeProto>| {
            set("bs", &["b1", "wlen"])(nodes);
            set("k", &["zero", "wlen", "one"])(nodes);
        };
        by_place(mask("L", other), "Gather");
        // A stride other than the entries per row, or offsets past it, read the next row.
        by_place(mask("12", set("bs", &["b1", "eleven"])), "Add");
        let eleven = |nodes: &mut Vec<NodeProto>| {
            set("bs", &["b1", "eleven"])(nodes);
            set("k", &["zero", "eleven", "one"])(nodes);
        };
        by_place(mask("12", eleven), "Gather");
        by_place(mask("12", set("k", &["zero", "thirteen", "one"])), "Add");
        // Places counted from 1, or offsets scaled with them.
        by_place(mask("12", set("b", &["one", "rows", "one"])), "Range");
        by_place(mask("12", ending(n("Mul", &["idx", "len"], "y", None))), "Mul");
        // Places as data, or looking up a table that is the same for every row.
        by_place(mask("12", set("g", &["table", "idx"])), "Gather");
        by_place(mask("12", ending(n("Cast", &["idx"], "y", None))), "Cast");
        // Rows merged with an unknown size, read as anything but an index's source or
        // Reshaped back to other than that size.
        refused(mask("L", ending(n("Reshape", &["flat", "minus1"], "y", None))), "Reshape");
        refused(mask("L", ending(n("Neg", &["flat"], "y", None))), "Neg");
        // Places kept as an output.
        let found = mask("12", ending(n("Identity", &["idx"], "y", None)));
        assert!(found.iter().any(|f| f.contains("place")), "{found:?}");
    }
}
