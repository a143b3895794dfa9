//! Products, convolutions, pooling and recurrences: the batch axis may be carried along
//! (the rows of a matrix product, the samples of a convolution) but never contracted,
//! slid over or recurred along.
use crate::merge::rows::args::{dims_of, one, Args, Outs, R};
use crate::merge::rows::elementwise::broadcast;
use crate::merge::rows::value::{int_attr, ints_attr, str_attr, Dim, T};

pub fn step(args: &Args, op: &str) -> R<Outs> {
    match op {
        "MatMul" => matmul(args, op, 0, 1, &[]),
        "MatMulInteger" => matmul(args, op, 0, 1, &[2, 3]),
        "QLinearMatMul" => matmul(args, op, 0, 3, &[1, 2, 4, 5, 6, 7]),
        "Gemm" => gemm(args),
        "Einsum" => einsum(args),
        "Conv" | "ConvTranspose" | "ConvInteger" => conv(args, op, 0, 1, &[2, 3]),
        "QLinearConv" => conv(args, op, 0, 3, &[1, 2, 4, 5, 6, 7, 8]),
        "MaxPool" | "AveragePool" | "LpPool" => pool(args, op),
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let x = args.need(0)?;
            samples_and_channels(x, op)?;
            let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
            let out = dims.iter().enumerate().map(|(k, d)| if k < 2 { *d } else { Dim::Fixed(1) }).collect();
            one(T { on_n: x.on_n, ..T::shaped(out) })
        }
        "LSTM" | "GRU" | "RNN" => recurrent(args, op),
        _ => unreachable!("dispatched by ops::step"),
    }
}

/// Weights, scales and zero points: the same whatever the batch.
fn settings(args: &Args, ks: &[usize]) -> R<()> {
    for &k in ks {
        args.setting(k, "weights")?;
    }
    Ok(())
}

fn matmul(args: &Args, op: &str, ia: usize, ib: usize, extra: &[usize]) -> R<Outs> {
    settings(args, extra)?;
    let (a, b) = (args.need(ia)?, args.need(ib)?);
    if (a.batch().is_some() || b.batch().is_some()) && (a.on_n || b.on_n) {
        return Err(format!("{op} multiplies the rows with a value computed from the number of rows"));
    }
    let (Some(da), Some(db)) = (dims_of(args, a)?, dims_of(args, b)?) else {
        if a.batch().is_some() || b.batch().is_some() {
            return Err(format!("{op} multiplies the rows with a value whose shape cannot be told"));
        }
        return one(T::opaque(a.on_n || b.on_n));
    };
    if da.is_empty() || db.is_empty() {
        return Err(format!("{op} of a scalar"));
    }
    // numpy's rules: a vector is a matrix of one row (A) or one column (B), dropped after.
    let pa: Vec<Dim> = if da.len() == 1 { vec![Dim::Fixed(1), da[0]] } else { da.to_vec() };
    let pb: Vec<Dim> = if db.len() == 1 { vec![db[0], Dim::Fixed(1)] } else { db.to_vec() };
    let (ra, rb) = (pa.len(), pb.len());
    if pa[ra - 1] == Dim::Batch || pb[rb - 2] == Dim::Batch {
        return Err(format!("{op} contracts the batch axis (it sums over the rows)"));
    }
    let m = pa[ra - 2];
    let n = pb[rb - 1];
    let stack = broadcast(op, &[&T::shaped(pa[..ra - 2].to_vec()), &T::shaped(pb[..rb - 2].to_vec())])?;
    let mut out = stack.dims.expect("known ranks");
    let batches =
        out.iter().filter(|d| **d == Dim::Batch).count() + usize::from(m == Dim::Batch) + usize::from(n == Dim::Batch);
    if batches > 1 {
        return Err(format!("{op} multiplies every row of one input with every row of the other"));
    }
    if da.len() > 1 {
        out.push(m);
    }
    if db.len() > 1 {
        out.push(n);
    }
    one(T { on_n: a.on_n || b.on_n, ..T::shaped(out) })
}

fn gemm(args: &Args) -> R<Outs> {
    let (a, b) = (args.need(0)?, args.need(1)?);
    let ta = int_attr(args.node, "transA").unwrap_or(0) == 1;
    let tb = int_attr(args.node, "transB").unwrap_or(0) == 1;
    if args.rows() && args.ins.iter().flatten().any(|t| t.on_n) {
        return Err("Gemm multiplies the rows with a value computed from the number of rows".into());
    }
    let pick = |t: &T, k: usize| t.dims().and_then(|d| d.get(k).copied()).unwrap_or(Dim::Free(None));
    let (m, ka) = if ta { (pick(a, 1), pick(a, 0)) } else { (pick(a, 0), pick(a, 1)) };
    let (kb, n) = if tb { (pick(b, 1), pick(b, 0)) } else { (pick(b, 0), pick(b, 1)) };
    if ka == Dim::Batch || kb == Dim::Batch {
        return Err("Gemm contracts the batch axis (it sums over the rows)".into());
    }
    if (a.batch().is_some() || b.batch().is_some()) && (a.rank() != Some(2) || b.rank() != Some(2)) {
        return Err("Gemm multiplies the rows with a value whose shape cannot be told".into());
    }
    if m == Dim::Batch && n == Dim::Batch {
        return Err("Gemm multiplies every row of one input with every row of the other".into());
    }
    let out = T::shaped(vec![m, n]);
    if let Some(c) = args.get(2) {
        broadcast("Gemm", &[&out, c])?;
    }
    one(T { on_n: a.on_n || b.on_n, ..out })
}

fn einsum(args: &Args) -> R<Outs> {
    let eq = str_attr(args.node, "equation").ok_or("Einsum has no equation")?.replace(' ', "");
    let ins: Vec<&T> = args.ins.iter().flatten().collect();
    let rows = ins.iter().any(|t| t.batch().is_some());
    if rows && ins.iter().any(|t| t.on_n) {
        return Err("Einsum combines the rows with a value computed from the number of rows".into());
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ins.len() {
        return Err("Einsum's equation does not match its inputs".into());
    }
    let Some(ranks) = ins.iter().map(|t| t.rank()).collect::<Option<Vec<usize>>>() else {
        if rows {
            return Err("Einsum multiplies the rows with a value whose shape cannot be told".into());
        }
        return one(T::opaque(ins.iter().any(|t| t.on_n)));
    };
    // Each axis gets a label; the axes under "..." get labels '0', '1', ... aligned from the right.
    let spread = |term: &str, rank: usize| -> R<Vec<char>> {
        let named: Vec<char> = term.chars().filter(|c| *c != '.').collect();
        if term.contains("...") {
            let n = rank.checked_sub(named.len()).ok_or("Einsum term longer than its input")?;
            let (before, after) = term.split_once("...").expect("contains");
            let dots = (0..n).map(|i| char::from(b'0' + (9usize.saturating_sub(n - 1 - i)) as u8));
            Ok(before.chars().chain(dots).chain(after.chars()).collect())
        } else if named.len() == rank {
            Ok(named)
        } else {
            Err("Einsum term does not match its input's rank".into())
        }
    };
    let labelled: Vec<Vec<char>> = terms.iter().zip(&ranks).map(|(t, r)| spread(t, *r)).collect::<R<_>>()?;
    let out_labels: Vec<char> = match &rhs {
        Some(r) => {
            let dots = labelled
                .iter()
                .flat_map(|l| l.iter().filter(|c| c.is_ascii_digit()))
                .copied()
                .collect::<std::collections::BTreeSet<char>>();
            let (before, after) = r.split_once("...").unwrap_or((r, ""));
            before
                .chars()
                .chain(if r.contains("...") { dots.into_iter().collect::<Vec<_>>() } else { vec![] })
                .chain(after.chars())
                .collect()
        }
        None => {
            let mut all: Vec<char> = labelled.concat();
            all.sort_unstable();
            // numpy's implicit output: the "..." axes, then the labels used once, sorted.
            let mut out: Vec<char> = all.iter().filter(|c| c.is_ascii_digit()).copied().collect();
            out.dedup();
            out.extend(all.iter().filter(|c| !c.is_ascii_digit() && all.iter().filter(|d| d == c).count() == 1));
            out
        }
    };
    let mut batch: Option<char> = None;
    for (t, l) in ins.iter().zip(&labelled) {
        if let Some(b) = t.batch() {
            let c = l[b];
            if batch.is_some_and(|x| x != c) || l.iter().filter(|x| **x == c).count() > 1 {
                return Err("Einsum multiplies rows along different axes".into());
            }
            batch = Some(c);
        }
    }
    if let Some(c) = batch {
        if !out_labels.contains(&c) {
            return Err(format!("Einsum '{eq}' sums over the batch axis"));
        }
        for (t, l) in ins.iter().zip(&labelled) {
            if t.batch().is_none() {
                if let Some(k) = l.iter().position(|x| *x == c) {
                    if t.dims().expect("ranks known")[k] != Dim::Fixed(1) {
                        return Err("Einsum pairs the batch axis with an axis of a value without rows".into());
                    }
                }
            }
        }
    }
    let size_of = |c: char| -> Dim {
        if Some(c) == batch {
            return Dim::Batch;
        }
        let mut found = Dim::Free(None);
        for (t, l) in ins.iter().zip(&labelled) {
            for (k, x) in l.iter().enumerate() {
                if *x == c {
                    match t.dims().expect("ranks known")[k] {
                        Dim::Fixed(1) => {}
                        d => found = d,
                    }
                }
            }
        }
        found
    };
    let dims = out_labels.iter().map(|c| size_of(*c)).collect();
    one(T { on_n: ins.iter().any(|t| t.on_n), ..T::shaped(dims) })
}

/// Convolutions and pools treat axis 0 as the samples and axis 1 as the channels.
fn samples_and_channels(x: &T, op: &str) -> R<()> {
    match x.batch() {
        Some(b) if b > 1 => Err(format!("{op} slides its window along the batch axis (axis {b})")),
        _ => Ok(()),
    }
}

fn conv(args: &Args, op: &str, ix: usize, iw: usize, extra: &[usize]) -> R<Outs> {
    let x = args.need(ix)?;
    settings(args, &[iw])?;
    settings(args, extra)?;
    match x.batch() {
        Some(0) | None => {}
        Some(b) => return Err(format!("{op} mixes the channels or windows of axis {b}, the batch axis")),
    }
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let w = args.need(iw)?.dims().map(<[Dim]>::to_vec).unwrap_or_default();
    let group = int_attr(args.node, "group").unwrap_or(1);
    let channels = match (op, w.first(), w.get(1)) {
        ("ConvTranspose", _, Some(Dim::Fixed(c))) => Dim::Fixed(c * group),
        ("ConvTranspose", _, _) => Dim::Free(None),
        (_, Some(d), _) => *d,
        _ => Dim::Free(None),
    };
    let kernel: Vec<Dim> = match ints_attr(args.node, "kernel_shape") {
        Some(k) => k.into_iter().map(Dim::Fixed).collect(),
        None => w.iter().skip(2).copied().collect(),
    };
    let mut out = vec![dims.first().copied().unwrap_or(Dim::Free(None)), channels];
    out.extend(spatial(args, &dims[2.min(dims.len())..], &kernel, op == "ConvTranspose"));
    one(T { on_n: x.on_n, ..T::shaped(out) })
}

/// The spatial sizes of a convolution or pool, where its attributes make them plain.
fn spatial(args: &Args, dims: &[Dim], kernel: &[Dim], transposed: bool) -> Vec<Dim> {
    let node = args.node;
    let n = dims.len();
    let get = |name: &str, default: i64, len: usize| ints_attr(node, name).unwrap_or_else(|| vec![default; len]);
    let strides = get("strides", 1, n);
    let dil = get("dilations", 1, n);
    let pads = get("pads", 0, 2 * n);
    let auto = str_attr(node, "auto_pad").unwrap_or_else(|| "NOTSET".into());
    let ceil = int_attr(node, "ceil_mode").unwrap_or(0) == 1;
    (0..n)
        .map(|i| {
            let (Dim::Fixed(d), Some(Dim::Fixed(k)), Some(&s), Some(&dl)) =
                (dims[i], kernel.get(i), strides.get(i), dil.get(i))
            else {
                return Dim::Free(None);
            };
            if transposed || s <= 0 || pads.len() != 2 * n {
                return Dim::Free(None);
            }
            let span = (k - 1) * dl + 1;
            match auto.as_str() {
                "SAME_UPPER" | "SAME_LOWER" => Dim::Fixed((d + s - 1) / s),
                "VALID" => Dim::Fixed((d - span) / s + 1),
                "NOTSET" => {
                    let total = d + pads[i] + pads[i + n] - span;
                    Dim::Fixed(
                        if ceil { crate::merge::rows::shape::ceil_div(total, s) } else { total.div_euclid(s) } + 1,
                    )
                }
                _ => Dim::Free(None),
            }
        })
        .collect()
}

fn pool(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    samples_and_channels(x, op)?;
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let kernel: Vec<Dim> =
        ints_attr(args.node, "kernel_shape").unwrap_or_default().into_iter().map(Dim::Fixed).collect();
    let mut out = dims[..2.min(dims.len())].to_vec();
    out.extend(spatial(args, &dims[2.min(dims.len())..], &kernel, false));
    let t = T { on_n: x.on_n, ..T::shaped(out) };
    let mut outs = vec![Ok(t.clone())];
    if args.outputs() > 1 {
        // MaxPool's indices count from the start of the whole tensor, batch included: a
        // row's indices change with its place in the batch.
        outs.push(if x.batch().is_some() {
            Err("MaxPool's indices count across the whole batch (they change with each row's place)".into())
        } else {
            Ok(t)
        });
    }
    Ok(outs)
}

fn recurrent(args: &Args, op: &str) -> R<Outs> {
    let x = args.need(0)?;
    let layout = int_attr(args.node, "layout").unwrap_or(0);
    // Layout 0: X [seq, batch, in], states [dirs, batch, hidden]; layout 1: batch first.
    let (xb, sb) = if layout == 0 { (1, 1) } else { (0, 0) };
    settings(args, &[1, 2, 3, 7])?;
    let rows = args.rows();
    if rows && args.ins.iter().flatten().any(|t| t.on_n) {
        return Err(format!("{op} combines the rows with a value computed from the number of rows"));
    }
    if rows {
        if x.batch() != Some(xb) || x.rank() != Some(3) {
            return Err(format!(
                "{op} runs its recurrence along the batch axis (layout {layout} wants it on axis {xb})"
            ));
        }
        if args.get(4).is_some_and(|t| t.batch() != Some(0)) {
            return Err(format!("{op}'s sequence lengths do not follow the rows of the batch"));
        }
        for k in [5, 6] {
            if args.get(k).is_some_and(|t| t.batch() != Some(sb)) {
                return Err(format!("{op}'s initial state has a fixed batch size, not one entry per row"));
            }
        }
    } else if !args.all_fixed() {
        return Err(format!("{op} is given values computed from the number of rows"));
    }
    let hidden = int_attr(args.node, "hidden_size").map_or(Dim::Free(None), Dim::Fixed);
    let dirs = Dim::Fixed(if str_attr(args.node, "direction").as_deref() == Some("bidirectional") { 2 } else { 1 });
    let (seq, batch) = match x.dims() {
        Some(d) if d.len() == 3 => (d[1 - xb], d[xb]),
        _ => (Dim::Free(None), Dim::Free(None)),
    };
    let y = if layout == 0 { vec![seq, dirs, batch, hidden] } else { vec![batch, seq, dirs, hidden] };
    let state = if layout == 0 { vec![dirs, batch, hidden] } else { vec![batch, dirs, hidden] };
    let mut outs = vec![Ok(T::shaped(y))];
    for _ in 1..args.outputs() {
        outs.push(Ok(T::shaped(state.clone())));
    }
    Ok(outs)
}
