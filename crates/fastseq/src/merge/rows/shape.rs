//! Operators that move, join, cut or re-shape values: where the batch axis goes, and which
//! of them would merge it with other axes or cut it.
use crate::merge::rows::args::{dims_of, each, one, Args, Outs, R};
use crate::merge::rows::elementwise::broadcast;
use crate::merge::rows::value::{axes, axis, int_attr, ints_attr, Dim, Elem, T};

/// A sentinel end at or past this means "to the end" (INT_MAX and INT64_MAX are the usual).
const TO_THE_END: i64 = i32::MAX as i64;

pub fn step(args: &Args, op: &str) -> R<Outs> {
    match op {
        "Shape" => shape(args),
        "Size" => size(args),
        "Reshape" => reshape(args),
        "Flatten" => flatten(args),
        "Squeeze" => squeeze(args),
        "Unsqueeze" => unsqueeze(args),
        "Transpose" => transpose(args),
        "Concat" => concat(args),
        "Split" => split(args),
        "Slice" => slice(args),
        "Expand" => expand(args),
        "Tile" => tile(args),
        "ConstantOfShape" => constant_of_shape(args),
        "Range" => range(args),
        "Pad" => pad(args),
        _ => unreachable!("dispatched by ops::step"),
    }
}

/// A list of integers from attribute `name` or else input `k`: Ok(None) when neither is
/// there, Err when the input's values cannot be told.
pub fn list(args: &Args, name: &str, k: usize) -> R<Option<Vec<i64>>> {
    if let Some(v) = ints_attr(args.node, name) {
        return Ok(Some(v));
    }
    match args.get(k) {
        None => Ok(None),
        Some(t) => {
            args.setting(k, name)?;
            t.known()
                .map(Some)
                .ok_or_else(|| format!("{} reads its {name} from a value that cannot be told", args.op()))
        }
    }
}

/// The elements of integer input `k` (a shape, sizes, repeats): refused when unknown.
fn elems(args: &Args, k: usize, what: &str) -> R<Vec<Elem>> {
    let t = args.need(k)?;
    if t.batch().is_some() {
        return Err(format!("{} reads its {what} from the rows", args.op()));
    }
    t.ints.clone().ok_or_else(|| format!("{} takes its {what} from a value that cannot be told", args.op()))
}

fn dim_of(e: Elem) -> R<Dim> {
    match e {
        Elem::Known(v) => Ok(Dim::Fixed(v)),
        Elem::Free(s) => Ok(Dim::Free(s)),
        Elem::Batch => Ok(Dim::Batch),
        Elem::Rows(_) | Elem::OnN => Err("computed from the number of rows".into()),
    }
}

fn product(dims: &[Dim]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, d| if let Dim::Fixed(v) = d { acc.checked_mul(*v) } else { None })
}

fn product_dim(dims: &[Dim]) -> Dim {
    product(dims).map_or(Dim::Free(None), Dim::Fixed)
}

fn shape(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let Some(dims) = x.dims() else { return one(T::shaped(vec![Dim::Free(None)])) };
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(int_attr(args.node, "start").unwrap_or(0));
    let end = clamp(int_attr(args.node, "end").unwrap_or(r)).max(start);
    let (outer, inner) = x.layout();
    let elems = dims[start..end]
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => Elem::Known(*v),
            Dim::Batch => outer.checked_mul(inner).map_or(Elem::OnN, Elem::rows),
            Dim::Free(s) => Elem::Free(*s),
        })
        .collect();
    one(T::ints(false, elems))
}

fn size(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let e = if x.batch().is_some() { Elem::OnN } else { x.numel().map_or(Elem::Free(None), Elem::Known) };
    one(T::ints(true, vec![e]))
}

fn reshape(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let target: Vec<Elem> = match ints_attr(args.node, "shape") {
        Some(v) if args.opset < 5 => v.into_iter().map(Elem::Known).collect(),
        _ => match args.get(1).and_then(|t| t.ints.clone()) {
            Some(e) if args.get(1).is_some_and(|t| t.batch().is_none()) => e,
            _ if x.batch().is_none() && args.get(1).is_some_and(T::fixed) => {
                let rank = args.get(1).and_then(T::numel);
                return one(T {
                    on_n: x.on_n,
                    ..rank.map_or_else(|| T::opaque(false), |n| T::shaped(vec![Dim::Free(None); n as usize]))
                });
            }
            _ => {
                args.setting(1, "shape")?;
                return Err("Reshape takes a shape that cannot be told".into());
            }
        },
    };
    let allowzero = int_attr(args.node, "allowzero").unwrap_or(0) == 1;
    let xdims = dims_of(args, x)?;
    let Some(b) = x.batch() else {
        return reshape_fixed(x, xdims, &target, allowzero);
    };
    let xdims = xdims.expect("rows have dims");
    let (outer, inner) = x.layout();
    // Each target entry: a size, the batch axis (N times a factor) or -1 (None).
    let mut want: Vec<Option<Want>> = Vec::with_capacity(target.len());
    for (k, e) in target.iter().enumerate() {
        want.push(match e {
            Elem::Known(0) if !allowzero => match xdims.get(k) {
                Some(Dim::Batch) => Some(Want::Rows(outer.checked_mul(inner).ok_or("Reshape's sizes overflow")?)),
                Some(d) => Some(Want::Size(*d)),
                None => return Err("Reshape copies an axis that its input does not have".into()),
            },
            Elem::Known(-1) => None,
            Elem::OnN => {
                return Err("Reshape merges the batch axis with other axes (its shape is computed from the number \
                            of rows)"
                    .into())
            }
            e => match e.per_row() {
                Some(c) => Some(Want::Rows(c)),
                None => Some(Want::Size(dim_of(*e)?)),
            },
        });
    }
    let rows: Vec<usize> = (0..want.len()).filter(|&k| matches!(want[k], Some(Want::Rows(_)))).collect();
    if rows.len() > 1 {
        return Err("Reshape puts the batch size on two axes".into());
    }
    let minus = want.iter().position(Option::is_none);
    let Some(at) = rows.first().copied().or(minus) else {
        return Err(format!("Reshape to {} does not keep a batch axis", show_target(&target)));
    };
    let sizes = |range: &[Option<Want>]| -> Option<i64> {
        range.iter().try_fold(1i64, |acc, w| match w {
            Some(Want::Size(Dim::Fixed(v))) => acc.checked_mul(*v),
            _ => None,
        })
    };
    // The entries before the batch axis: the same axes copied, or a known number of them
    // that divides the entries before the rows (outer blocks).
    let (front, row) = (&xdims[..b], &xdims[b + 1..]);
    let copied = at == b
        && (0..b).all(|k| {
            target[k] == Elem::Known(0) && !allowzero
                || matches!((want[k], front[k]), (Some(Want::Size(Dim::Fixed(w))), Dim::Fixed(f)) if w == f)
        });
    let new_outer = if copied {
        outer
    } else {
        let before = product(front).and_then(|p| p.checked_mul(outer));
        match (before, sizes(&want[..at])) {
            (Some(p), Some(f)) if f > 0 && p % f == 0 => p / f,
            _ => {
                return Err(format!(
                    "Reshape to {} moves entries across the batch axis (the axes before it change)",
                    show_target(&target)
                ))
            }
        }
    };
    let new_inner = match want[at] {
        Some(Want::Rows(c)) if c % new_outer == 0 => c / new_outer,
        Some(Want::Rows(_)) => {
            return Err(format!("Reshape to {} splits the rows of the batch axis", show_target(&target)));
        }
        // [.., -1, rest]: the -1 holds the rows only if `rest` divides each row's entries.
        _ => {
            let after = product(row).and_then(|p| p.checked_mul(inner));
            match (after, sizes(&want[at + 1..])) {
                (Some(p), Some(r)) if r > 0 && p % r == 0 => p / r,
                _ => {
                    return Err(format!(
                        "Reshape to {} may merge rows or split them: it cannot be told that each row keeps its own \
                         (give the batch axis as 0 or from Shape)",
                        show_target(&target)
                    ))
                }
            }
        }
    };
    let mut dims: Vec<Dim> = want
        .iter()
        .map(|w| match w {
            Some(Want::Size(d)) => *d,
            _ => Dim::Free(None),
        })
        .collect();
    dims[at] = Dim::Batch;
    // A -1 after the batch axis: the row's entries left over, where they are known.
    if let Some(p) = minus.filter(|&p| p != at) {
        let rest: Vec<Option<Want>> =
            want.iter().enumerate().filter(|(k, _)| *k != p && *k != at).map(|(_, w)| *w).collect();
        let total = product(front).and_then(|f| f.checked_mul(outer)?.checked_mul(inner)?.checked_mul(product(row)?));
        if let (Some(t), Some(r)) = (total, sizes(&rest)) {
            let per = new_outer.checked_mul(new_inner).and_then(|c| c.checked_mul(r)).filter(|d| *d > 0);
            if let Some(d) = per {
                dims[p] = Dim::Fixed(t / d);
            }
        }
    }
    let merged = (new_outer, new_inner);
    one(T { merged: (merged != (1, 1)).then_some(merged), ..T::shaped(dims) })
}

/// One entry of a Reshape's target, for a value with rows.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    Size(Dim),
    /// The batch axis: N times this many entries.
    Rows(i64),
}

/// A Reshape of a value without a batch axis.
fn reshape_fixed(x: &T, xdims: Option<&[Dim]>, target: &[Elem], allowzero: bool) -> R<Outs> {
    let mut want: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    for (k, e) in target.iter().enumerate() {
        want.push(match e {
            Elem::Known(0) if !allowzero => Some(xdims.and_then(|d| d.get(k)).copied().unwrap_or(Dim::Free(None))),
            Elem::Known(-1) => None,
            Elem::Batch | Elem::Rows(_) => {
                return Err("Reshape spreads a value without a batch axis over the batch axis".into())
            }
            e => Some(dim_of(*e).map_err(|_| "Reshape gives a value a shape computed from the number of rows")?),
        });
    }
    let mut t = T::shaped(want.iter().map(|d| d.unwrap_or(Dim::Free(None))).collect());
    if let (Some(d), Some(n)) = (want.iter().position(Option::is_none), x.numel()) {
        let rest: Vec<Dim> = want.iter().flatten().copied().collect();
        if let Some(p) = product(&rest).filter(|p| *p > 0) {
            t.dims.as_mut().expect("shaped")[d] = Dim::Fixed(n / p);
        }
    }
    t.on_n = x.on_n;
    if x.ints.is_some() && want.len() <= 1 {
        t.ints.clone_from(&x.ints);
        t.on_n = x.ints.as_ref().is_some_and(|e| e.iter().any(|e| e.on_n()));
        if want.is_empty() {
            t.dims = Some(vec![]);
        }
    }
    one(t)
}

fn show_target(target: &[Elem]) -> String {
    let parts: Vec<String> = target
        .iter()
        .map(|e| match e {
            Elem::Known(v) => v.to_string(),
            Elem::Free(_) => "?".into(),
            Elem::Batch => "N".into(),
            Elem::Rows(c) => format!("N*{c}"),
            Elem::OnN => "f(N)".into(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn flatten(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let Some(dims) = dims_of(args, x)? else { return one(T { on_n: x.on_n, ..T::shaped(vec![Dim::Free(None); 2]) }) };
    let r = dims.len() as i64;
    let a = int_attr(args.node, "axis").unwrap_or(1);
    let a = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&a) {
        return Err(format!("Flatten's axis {a} is out of range"));
    }
    let a = a as usize;
    let Some(b) = x.batch() else {
        return one(T { on_n: x.on_n, ..T::shaped(vec![product_dim(&dims[..a]), product_dim(&dims[a..])]) });
    };
    // The batch axis merged with the axes flattened with it: known sizes before and after
    // it say how (outer, inner) its rows are laid out.
    let (outer, inner) = x.layout();
    let (lo, hi) = if b < a { (0, a) } else { (a, dims.len()) };
    let merged = product(&dims[lo..b])
        .and_then(|f| f.checked_mul(outer))
        .zip(product(&dims[b + 1..hi]).and_then(|r| r.checked_mul(inner)))
        .ok_or_else(|| format!("Flatten with axis {a} merges the batch axis with axes of sizes that cannot be told"))?;
    let out = if b < a { vec![Dim::Batch, product_dim(&dims[a..])] } else { vec![product_dim(&dims[..a]), Dim::Batch] };
    one(T { on_n: x.on_n, merged: (merged != (1, 1)).then_some(merged), ..T::shaped(out) })
}

fn squeeze(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let list = list(args, "axes", 1)?;
    if x.ints.as_ref().is_some_and(|e| e.len() == 1)
        && x.rank() == Some(1)
        && list.as_deref().is_none_or(|a| a == [0] || a == [-1])
    {
        return one(T::ints(true, x.ints.clone().expect("checked")));
    }
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let gone: Vec<usize> = match list {
        Some(l) if !l.is_empty() => axes(&l, dims.len())?,
        _ => {
            if x.batch().is_some() {
                return Err("Squeeze without axes removes the batch axis of a batch of one row".into());
            }
            if dims.iter().any(|d| matches!(d, Dim::Free(_))) {
                return one(T::opaque(x.on_n));
            }
            (0..dims.len()).filter(|&k| dims[k] == Dim::Fixed(1)).collect()
        }
    };
    if x.batch().is_some_and(|b| gone.contains(&b)) {
        return Err("Squeeze removes the batch axis (of size 1 only in a batch of one row)".into());
    }
    let out = dims.iter().enumerate().filter(|(k, _)| !gone.contains(k)).map(|(_, d)| *d).collect();
    one(T { on_n: x.on_n, ..T::shaped(out) })
}

fn unsqueeze(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let Some(list) = list(args, "axes", 1)? else { return Err("Unsqueeze has no axes".into()) };
    if x.scalar() && x.ints.is_some() && (list == [0] || list == [-1]) {
        return one(T { below: x.below, ..T::ints(false, x.ints.clone().expect("checked")) });
    }
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let rank = dims.len() + list.len();
    let mut new = axes(&list, rank)?;
    new.sort_unstable();
    let mut rest = dims.iter();
    let out = (0..rank)
        .map(|k| if new.contains(&k) { Dim::Fixed(1) } else { *rest.next().unwrap_or(&Dim::Free(None)) })
        .collect();
    // Unsqueeze moves no value: bounds stay.
    one(T { on_n: x.on_n, below: x.below, ..T::shaped(out) })
}

fn transpose(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let perm = match ints_attr(args.node, "perm") {
        Some(p) => axes(&p, dims.len())?,
        None => (0..dims.len()).rev().collect(),
    };
    if perm.len() != dims.len() {
        return Err("Transpose's perm does not match its input's rank".into());
    }
    one(T { on_n: x.on_n, ..T::shaped(perm.iter().map(|&k| dims[k]).collect()) })
}

fn concat(args: &Args) -> R<Outs> {
    let ins: Vec<&T> = args.ins.iter().flatten().collect();
    let a = int_attr(args.node, "axis").ok_or("Concat has no axis")?;
    let on_n = ins.iter().any(|t| t.on_n);
    let rows = ins.iter().any(|t| t.batch().is_some());
    if !rows {
        // Shape arithmetic: vectors joined.
        if a == 0 || a == -1 {
            let lists: Option<Vec<Vec<Elem>>> = ins
                .iter()
                .map(|t| match (&t.ints, t.numel()) {
                    (Some(e), _) if t.rank() == Some(1) => Some(e.clone()),
                    (None, Some(n)) if t.rank() == Some(1) && !t.on_n => Some(vec![Elem::Free(None); n as usize]),
                    _ => None,
                })
                .collect();
            if let Some(lists) = lists {
                return one(T::ints(false, lists.concat()));
            }
        }
        let Some(first) = ins.first().and_then(|t| t.dims()) else { return one(T::opaque(on_n)) };
        let k = axis(a, first.len())?;
        let mut out = first.to_vec();
        let along: Vec<Dim> =
            ins.iter().map(|t| t.dims().and_then(|d| d.get(k).copied()).unwrap_or(Dim::Free(None))).collect();
        out[k] = product_sum(&along);
        return one(T { on_n, ..T::shaped(out) });
    }
    if on_n {
        return Err("Concat joins the rows with a value computed from the number of rows".into());
    }
    let b = ins.iter().find_map(|t| t.batch()).expect("rows");
    let rank = ins.iter().find_map(|t| t.rank()).expect("rows");
    let k = axis(a, rank)?;
    if k == b {
        return Err("Concat joins values along the batch axis".into());
    }
    if ins.iter().any(|t| t.batch() != Some(b) || t.rank() != Some(rank)) {
        return Err("Concat joins the rows with a value that does not have them on the same axis".into());
    }
    let mut out = ins[0].dims().expect("rows").to_vec();
    out[k] = product_sum(&ins.iter().map(|t| t.dims().expect("rows")[k]).collect::<Vec<_>>());
    one(T::shaped(out))
}

/// The sum of sizes along the joined axis.
fn product_sum(dims: &[Dim]) -> Dim {
    dims.iter()
        .try_fold(0i64, |acc, d| if let Dim::Fixed(v) = d { acc.checked_add(*v) } else { None })
        .map_or(Dim::Free(None), Dim::Fixed)
}

fn split(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let a = int_attr(args.node, "axis").unwrap_or(0);
    let Some(dims) = dims_of(args, x)? else { return each(args, T::opaque(x.on_n)) };
    let k = axis(a, dims.len())?;
    if x.batch() == Some(k) {
        return Err("Split cuts along the batch axis".into());
    }
    let sizes = list(args, "split", 1).ok().flatten();
    let mut outs = Vec::new();
    for o in 0..args.outputs() {
        let mut d = dims.to_vec();
        d[k] = sizes.as_ref().and_then(|s| s.get(o)).map_or(Dim::Free(None), |&v| Dim::Fixed(v));
        outs.push(Ok(T { on_n: x.on_n, ..T::shaped(d) }));
    }
    if sizes.is_none() {
        args.setting(1, "split sizes")?;
    }
    Ok(outs)
}

fn slice(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let legacy = args.opset < 10;
    let get = |name: &str, k: usize| -> R<Option<Vec<Elem>>> {
        if legacy {
            return Ok(ints_attr(args.node, name).map(|v| v.into_iter().map(Elem::Known).collect()));
        }
        match args.get(k) {
            None => Ok(None),
            Some(t) if t.batch().is_some() => Err(format!("Slice reads its {name} from the rows")),
            Some(t) => Ok(Some(t.ints.clone().unwrap_or_default()).filter(|e| !e.is_empty() || t.numel() == Some(0))),
        }
    };
    let starts = get("starts", 1)?;
    let ends = get("ends", 2)?;
    let axes_list = if legacy { ints_attr(args.node, "axes") } else { list(args, "axes", 3)? };
    let steps = if legacy { None } else { list(args, "steps", 4)? };
    let (Some(starts), Some(ends)) = (starts, ends) else {
        if x.batch().is_none() {
            return one(T {
                on_n: x.on_n || !args.all_fixed(),
                ..x.rank().map_or_else(|| T::opaque(false), |r| T::shaped(vec![Dim::Free(None); r]))
            });
        }
        return Err("Slice takes bounds that cannot be told".into());
    };
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n || !args.all_fixed())) };
    let rank = dims.len();
    let which = match axes_list {
        Some(a) => axes(&a, rank)?,
        None => (0..starts.len()).collect(),
    };
    if which.len() != starts.len() || ends.len() != starts.len() {
        return Err("Slice's starts, ends and axes differ in length".into());
    }
    let mut out = dims.to_vec();
    let mut ints = x.ints.clone();
    for (i, &k) in which.iter().enumerate() {
        let step = steps.as_ref().and_then(|s| s.get(i).copied()).unwrap_or(1);
        let (s, e) = (starts[i], ends[i]);
        if dims.get(k) == Some(&Dim::Batch) {
            let whole = step == 1
                && matches!(s, Elem::Known(v) if v == 0 || v <= -TO_THE_END)
                && matches!(e, Elem::Batch | Elem::Known(TO_THE_END..));
            if !whole {
                return Err("Slice takes part of the batch axis".into());
            }
            continue;
        }
        if s.on_n() || e.on_n() {
            return Err("Slice cuts an axis at a place computed from the number of rows".into());
        }
        out[k] = match (dims[k], s, e) {
            (Dim::Fixed(n), Elem::Known(s), Elem::Known(e)) => Dim::Fixed(slice_len(n, s, e, step)),
            _ => Dim::Free(None),
        };
        if let (Some(list), Elem::Known(s), Elem::Known(e)) = (ints.as_mut(), s, e) {
            if rank == 1 && step > 0 {
                let n = list.len() as i64;
                let (a, b) = (clamp(s, n), clamp(e, n));
                // Every step-th element from a up to b (a step of 2 takes half of them).
                let by = usize::try_from(step).unwrap_or(usize::MAX);
                *list = if a < b { list[a as usize..b as usize].iter().step_by(by).copied().collect() } else { vec![] };
            } else {
                ints = None;
            }
        } else {
            ints = None;
        }
    }
    let on_n = x.on_n;
    match ints {
        Some(e) if rank == 1 => one(T::ints(false, e)),
        _ => one(T { on_n, ..T::shaped(out) }),
    }
}

fn clamp(v: i64, n: i64) -> i64 {
    (if v < 0 { v.saturating_add(n) } else { v }).clamp(0, n)
}

/// a / b rounded up, for a >= 0 and b > 0.
pub fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn slice_len(n: i64, s: i64, e: i64, step: i64) -> i64 {
    if step > 0 {
        ceil_div((clamp(e, n) - clamp(s, n)).max(0), step)
    } else if step < 0 {
        let s = (if s < 0 { s.saturating_add(n) } else { s }).clamp(-1, n - 1);
        let e = (if e < 0 { e.saturating_add(n) } else { e }).clamp(-1, n - 1);
        ceil_div((s - e).max(0), -step)
    } else {
        0
    }
}

/// A shape given as elements, as a value of those dims (for broadcasting against it).
fn as_shape(e: &[Elem], op: &str) -> R<T> {
    let dims: R<Vec<Dim>> = e.iter().map(|e| dim_of(*e)).collect();
    let dims = dims.map_err(|_| format!("{op} gives a value a size computed from the number of rows"))?;
    if dims.iter().filter(|d| **d == Dim::Batch).count() > 1 {
        return Err(format!("{op} gives two axes the batch size"));
    }
    Ok(T::shaped(dims))
}

fn expand(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let target = match elems(args, 1, "shape") {
        Ok(e) => e,
        Err(_) if args.all_fixed() => return one(T::opaque(false)),
        Err(e) => return Err(e),
    };
    let shape = as_shape(&target, "Expand")?;
    let mut t = broadcast("Expand", &[x, &shape])?;
    t.on_n = x.on_n;
    one(t)
}

fn tile(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let reps = match elems(args, 1, "repeats") {
        Ok(e) => e,
        Err(_) if args.all_fixed() => return one(T::opaque(false)),
        Err(e) => return Err(e),
    };
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    if reps.len() != dims.len() {
        return Err("Tile's repeats do not match its input's rank".into());
    }
    let mut out = Vec::with_capacity(dims.len());
    for (d, r) in dims.iter().zip(&reps) {
        out.push(match (d, r) {
            (Dim::Batch, Elem::Known(1)) => Dim::Batch,
            (Dim::Batch, _) => return Err("Tile repeats the batch axis".into()),
            (Dim::Fixed(1), Elem::Batch) => Dim::Batch,
            (_, e) if e.on_n() => {
                return Err("Tile repeats a value a number of times computed from the number of rows".into())
            }
            (Dim::Fixed(n), Elem::Known(k)) => Dim::Fixed(n * k),
            _ => Dim::Free(None),
        });
    }
    if out.iter().filter(|d| **d == Dim::Batch).count() > 1 {
        return Err("Tile gives two axes the batch size".into());
    }
    one(T { on_n: x.on_n, ..T::shaped(out) })
}

fn constant_of_shape(args: &Args) -> R<Outs> {
    let input = args.need(0)?;
    match &input.ints {
        Some(e) => {
            let mut t = as_shape(e, "ConstantOfShape")?;
            // A small vector of one integer (torch's expand writes ones of a shape's length).
            if let ([Elem::Known(n)], Some(v)) = (e.as_slice(), fill(args)) {
                if (0..=4096).contains(n) {
                    t.ints = Some(vec![Elem::Known(v); *n as usize]);
                }
            }
            one(t)
        }
        None if input.fixed() => {
            one(input.numel().map_or_else(|| T::opaque(false), |n| T::shaped(vec![Dim::Free(None); n as usize])))
        }
        None => Err("ConstantOfShape makes a value whose shape is computed from the batch".into()),
    }
}

/// ConstantOfShape's value, where it is an integer (0 without one: a float zero, not told).
fn fill(args: &Args) -> Option<i64> {
    let t = crate::merge::rows::value::attr(args.node, "value")?.t.as_ref()?;
    crate::merge::rows::value::from_tensor(t).known_one()
}

fn range(args: &Args) -> R<Outs> {
    if !args.all_fixed() {
        return Err(format!(
            "Range counts up to a number computed from the batch ({})",
            crate::merge::rows::value::BY_PLACE
        ));
    }
    let v: Option<Vec<i64>> = (0..3).map(|k| args.get(k).and_then(T::known_one)).collect();
    if let Some([start, limit, delta]) = v.as_deref() {
        if *delta != 0 {
            let n = ((limit - start) as f64 / *delta as f64).ceil().max(0.0) as i64;
            // Counting up from 0 or more: every value lies below the limit.
            let below = (*start >= 0 && *delta > 0 && n > 0).then_some(Elem::Known(*limit));
            if n <= 4096 {
                return one(T { below, ..T::ints(false, (0..n).map(|i| Elem::Known(start + i * delta)).collect()) });
            }
            return one(T { below, ..T::shaped(vec![Dim::Fixed(n)]) });
        }
    }
    // 0, 1, ... up to an input's size: as many values as that size, each below it.
    let known = |k: usize| args.get(k).and_then(T::known_one);
    if let (Some(0), Some(1), Some([Elem::Free(Some(s))])) =
        (known(0), known(2), args.get(1).and_then(|t| t.ints.as_deref()))
    {
        return one(T { below: Some(Elem::Free(Some(*s))), ..T::shaped(vec![Dim::Free(Some(*s))]) });
    }
    one(T::shaped(vec![Dim::Free(None)]))
}

fn pad(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    args.setting(2, "fill value")?;
    let pads: Option<Vec<Elem>> = match ints_attr(args.node, "pads") {
        Some(p) => Some(p.into_iter().map(Elem::Known).collect()),
        None => match args.get(1) {
            Some(t) if t.batch().is_some() => return Err("Pad reads its pads from the rows".into()),
            Some(t) => t.ints.clone(),
            None => None,
        },
    };
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let which = match list(args, "axes", 3)? {
        Some(a) => axes(&a, dims.len())?,
        None => (0..dims.len()).collect(),
    };
    let Some(pads) = pads.filter(|p| p.len() == 2 * which.len()) else {
        if x.batch().is_some() {
            return Err("Pad takes pads that cannot be told".into());
        }
        return one(T { on_n: x.on_n, ..T::shaped(vec![Dim::Free(None); dims.len()]) });
    };
    let mut out = dims.to_vec();
    for (i, &k) in which.iter().enumerate() {
        let (b, e) = (pads[i], pads[i + which.len()]);
        if dims[k] == Dim::Batch {
            if b != Elem::Known(0) || e != Elem::Known(0) {
                return Err("Pad adds entries to the batch axis".into());
            }
            continue;
        }
        if b.on_n() || e.on_n() {
            return Err("Pad pads by amounts computed from the number of rows".into());
        }
        out[k] = match (dims[k], b, e) {
            (Dim::Fixed(n), Elem::Known(b), Elem::Known(e)) => Dim::Fixed(n + b + e),
            _ => Dim::Free(None),
        };
    }
    one(T { on_n: x.on_n, ..T::shaped(out) })
}
