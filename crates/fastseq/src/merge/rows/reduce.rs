//! Operators that combine entries along axes (reductions, arg-max, softmax, sorting,
//! normalisations, quantisation scales): row-wise only when the batch axis is not among them.
use crate::merge::rows::args::{dims_of, each, one, Args, Outs, R};
use crate::merge::rows::shape::list;
use crate::merge::rows::value::{axes, axis, int_attr, ints_attr, Dim, T};

pub fn step(args: &Args, op: &str) -> R<Outs> {
    match op {
        "ArgMax" | "ArgMin" => arg(args, op),
        "Softmax" | "LogSoftmax" | "Hardmax" => softmax(args, op),
        "LpNormalization" => along(args, op, int_attr(args.node, "axis").unwrap_or(-1), "normalises along"),
        "LayerNormalization" | "RMSNormalization" => layer_norm(args, op),
        "GroupNormalization" | "InstanceNormalization" => per_sample(args, op),
        "BatchNormalization" => batch_norm(args),
        "MeanVarianceNormalization" => {
            let over = ints_attr(args.node, "axes").unwrap_or_else(|| vec![0, 2, 3]);
            over_axes(args, op, &over, "normalises over")?;
            same_dims(args)
        }
        "LRN" => {
            let x = args.need(0)?;
            if x.batch() == Some(1) {
                return Err("LRN sums across the channel axis, which is the batch axis here".into());
            }
            same_dims(args)
        }
        "TopK" => topk(args),
        "QuantizeLinear" | "DequantizeLinear" => quantize(args, op),
        "DynamicQuantizeLinear" => {
            let x = args.need(0)?;
            if x.batch().is_some() {
                return Err("DynamicQuantizeLinear scales by the range of the whole batch".into());
            }
            Ok(vec![
                Ok(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() }),
                Ok(T::shaped(vec![])),
                Ok(T::shaped(vec![])),
            ])
        }
        _ => reduce(args, op),
    }
}

fn same_dims(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    one(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() })
}

/// Refuses `over` (axes of input 0) if it holds the batch axis.
fn over_axes(args: &Args, op: &str, over: &[i64], verb: &str) -> R<()> {
    let x = args.need(0)?;
    if let (Some(b), Some(r)) = (x.batch(), x.rank()) {
        if axes(over, r)?.contains(&b) {
            return Err(format!("{op} {verb} axes {over:?}, which include the batch axis (axis {b})"));
        }
    }
    Ok(())
}

fn reduce(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    let keep = int_attr(args.node, "keepdims").unwrap_or(1) == 1;
    let noop = int_attr(args.node, "noop_with_empty_axes").unwrap_or(0) == 1;
    let over = match list(args, "axes", 1) {
        Ok(v) => v.unwrap_or_default(),
        Err(e) if x.batch().is_some() => return Err(e),
        Err(_) => return one(T::opaque(x.on_n)),
    };
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    if over.is_empty() {
        if noop {
            return same_dims(args);
        }
        if x.batch().is_some() {
            return Err(format!("{op} reduces over every axis, the batch axis included"));
        }
        let out = if keep { vec![Dim::Fixed(1); dims.len()] } else { vec![] };
        return one(T { on_n: x.on_n, ..T::shaped(out) });
    }
    over_axes(args, op, &over, "reduces over")?;
    let gone = axes(&over, dims.len())?;
    let out = reduced(dims, &gone, keep);
    one(T { on_n: x.on_n, ..T::shaped(out) })
}

fn reduced(dims: &[Dim], gone: &[usize], keep: bool) -> Vec<Dim> {
    dims.iter()
        .enumerate()
        .filter_map(|(k, d)| match (gone.contains(&k), keep) {
            (false, _) => Some(*d),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect()
}

fn arg(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    let a = int_attr(args.node, "axis").unwrap_or(0);
    let keep = int_attr(args.node, "keepdims").unwrap_or(1) == 1;
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let k = axis(a, dims.len())?;
    if x.batch() == Some(k) {
        return Err(format!("{op} picks along axis {a}, the batch axis"));
    }
    one(T { on_n: x.on_n, ..T::shaped(reduced(dims, &[k], keep)) })
}

fn softmax(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    let legacy = args.opset < 13;
    let a = int_attr(args.node, "axis").unwrap_or(if legacy { 1 } else { -1 });
    if let (Some(b), Some(r)) = (x.batch(), x.rank()) {
        let k = if legacy && a == r as i64 { r } else { axis(a, r)? };
        // Before opset 13 the input is seen as a matrix [axes before `axis`, the rest], and
        // each of its rows normalised: the batch axis must come before `axis`.
        let mixes = if legacy { b >= k } else { b == k };
        if mixes {
            return Err(format!(
                "{op} normalises along axis {a}, {} the batch axis",
                if legacy { "over axes that include" } else { "which is" }
            ));
        }
    }
    same_dims(args)
}

fn along(args: &Args, op: &str, a: i64, verb: &str) -> R<Outs> {
    let x = args.need(0)?;
    if let (Some(b), Some(r)) = (x.batch(), x.rank()) {
        if axis(a, r)? == b {
            return Err(format!("{op} {verb} axis {a}, the batch axis"));
        }
    }
    same_dims(args)
}

fn layer_norm(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    for k in 1..args.ins.len() {
        args.setting(k, "scale and bias")?;
    }
    let a = int_attr(args.node, "axis").unwrap_or(-1);
    let Some(dims) = dims_of(args, x)? else { return each(args, T::opaque(x.on_n)) };
    let k = axis(a, dims.len())?;
    if x.batch().is_some_and(|b| b >= k) {
        return Err(format!("{op} normalises over axes {k}.. of {}, which include the batch axis", dims.len()));
    }
    let stats: Vec<Dim> = dims.iter().enumerate().map(|(i, d)| if i >= k { Dim::Fixed(1) } else { *d }).collect();
    let mut outs = vec![Ok(T { on_n: x.on_n, ..T::shaped(dims.to_vec()) })];
    for _ in 1..args.outputs() {
        outs.push(Ok(T { on_n: x.on_n, ..T::shaped(stats.clone()) }));
    }
    Ok(outs)
}

fn per_sample(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    for k in 1..args.ins.len() {
        args.setting(k, "scale and bias")?;
    }
    if x.batch().is_some_and(|b| b != 0) {
        return Err(format!("{op} normalises each sample of axis 0, but the batch axis is another"));
    }
    same_dims(args)
}

fn batch_norm(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let training = int_attr(args.node, "training_mode").unwrap_or(0) == 1
        || args.node.output.iter().skip(1).any(|o| !o.is_empty())
        || (args.opset < 7 && int_attr(args.node, "is_test").unwrap_or(0) == 0 && args.outputs() > 1);
    if x.batch().is_some() && training {
        return Err("BatchNormalization in training mode normalises with the statistics of the whole batch".into());
    }
    for k in 1..5 {
        args.setting(k, "statistics")?;
    }
    if x.batch() == Some(1) {
        return Err("BatchNormalization scales each channel of axis 1, which is the batch axis here".into());
    }
    let mut outs = vec![Ok(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() })];
    for _ in 1..args.outputs() {
        outs.push(Ok(T::opaque(false)));
    }
    Ok(outs)
}

fn topk(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    args.setting(1, "k")?;
    let a = int_attr(args.node, "axis").unwrap_or(-1);
    let Some(dims) = dims_of(args, x)? else { return each(args, T::opaque(x.on_n)) };
    let k = axis(a, dims.len())?;
    if x.batch() == Some(k) {
        return Err(format!("TopK sorts along axis {a}, the batch axis"));
    }
    let kk = int_attr(args.node, "k").or_else(|| args.get(1).and_then(T::known_one));
    let mut out = dims.to_vec();
    out[k] = kk.map_or(Dim::Free(None), Dim::Fixed);
    each(args, T { on_n: x.on_n, ..T::shaped(out) })
}

fn quantize(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    args.setting(1, "scale")?;
    args.setting(2, "zero point")?;
    if let (Some(b), Some(r)) = (x.batch(), x.rank()) {
        let scale = args.need(1)?;
        let per_tensor = scale.numel().is_some_and(|n| n <= 1) && scale.rank().is_some_and(|r| r <= 1);
        let blocked = int_attr(args.node, "block_size").unwrap_or(0) != 0;
        if !per_tensor {
            let k = axis(int_attr(args.node, "axis").unwrap_or(1), r)?;
            if k == b || blocked {
                return Err(format!("{op} scales each entry of the batch axis by a scale of its own"));
            }
        }
    }
    same_dims(args)
}
