//! Operators that pick, place or resample entries: indexing along the batch axis picks
//! other rows, indexing a constant table by the rows is a lookup per row.
use crate::merge::rows::args::{dims_of, one, Args, Outs, R};
use crate::merge::rows::value::{axis, int_attr, ints_attr, str_attr, Dim, Elem, T};

pub fn step(args: &Args, op: &str) -> R<Outs> {
    match op {
        "Gather" => gather(args),
        "GatherElements" => gather_elements(args),
        "GatherND" => gather_nd(args),
        "ScatterElements" => scatter_elements(args),
        "OneHot" => one_hot(args),
        "Compress" => compress(args),
        "Resize" | "Upsample" => resize(args),
        "DepthToSpace" | "SpaceToDepth" => {
            let x = args.need(0)?;
            match x.batch() {
                Some(b) if b != 0 => Err(format!("{op} moves entries across the batch axis (axis {b})")),
                _ => one(T { on_n: x.on_n, ..x.rank().map_or_else(|| T::opaque(false), |r| keep_first(x, r)) }),
            }
        }
        "Trilu" => {
            args.setting(1, "diagonal")?;
            let x = args.need(0)?;
            match (x.batch(), x.rank()) {
                (Some(b), Some(r)) if b + 2 >= r => Err("Trilu keeps a triangle across the batch axis".into()),
                _ => one(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() }),
            }
        }
        "CumSum" => {
            let x = args.need(0)?;
            args.setting(1, "axis")?;
            if let (Some(b), Some(r)) = (x.batch(), x.rank()) {
                let a = args.get(1).and_then(T::known_one).ok_or("CumSum adds along an axis that cannot be told")?;
                if axis(a, r)? == b {
                    return Err("CumSum adds up along the batch axis".into());
                }
            }
            one(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() })
        }
        "EyeLike" => {
            let x = args.need(0)?;
            if x.batch().is_some() {
                return Err("EyeLike's values depend on each row's place in the batch".into());
            }
            one(T::shaped(x.dims.clone().unwrap_or_default()))
        }
        _ => unreachable!("dispatched by ops::step"),
    }
}

/// The batch axis first, the other axes of unknown size.
fn keep_first(x: &T, rank: usize) -> T {
    let mut d = vec![Dim::Free(None); rank];
    if x.batch() == Some(0) {
        d[0] = Dim::Batch;
    }
    T::shaped(d)
}

fn gather(args: &Args) -> R<Outs> {
    let (data, idx) = (args.need(0)?, args.need(1)?);
    let a = int_attr(args.node, "axis").unwrap_or(0);
    // Shape arithmetic: elements of a vector picked by known indices.
    if let (Some(list), Some(picks)) = (&data.ints, idx.known()) {
        if data.rank() == Some(1) && (a == 0 || a == -1) && idx.rank().is_some_and(|r| r <= 1) {
            let n = list.len() as i64;
            let picked: Option<Vec<Elem>> =
                picks.iter().map(|&p| list.get((if p < 0 { p + n } else { p }) as usize).copied()).collect();
            if let Some(picked) = picked {
                return one(T::ints(idx.scalar(), picked));
            }
        }
    }
    if data.batch().is_some() && idx.batch().is_some() {
        return Err("Gather indexes the rows with values of the rows".into());
    }
    if idx.on_n && (data.batch().is_some() || idx.ints.is_none()) {
        return Err("Gather indexes with a value computed from the number of rows".into());
    }
    if data.on_n && idx.batch().is_some() {
        return Err("Gather looks the rows up in a value computed from the number of rows".into());
    }
    let (Some(dd), Some(id)) = (dims_of(args, data)?, dims_of(args, idx)?) else {
        if data.batch().is_some() || idx.batch().is_some() {
            return Err("Gather indexes with values of a shape that cannot be told".into());
        }
        return one(T::opaque(data.on_n || idx.on_n));
    };
    let k = axis(a, dd.len())?;
    if data.batch() == Some(k) {
        return Err("Gather picks entries of the batch axis by index".into());
    }
    let dims: Vec<Dim> = dd[..k].iter().chain(id).chain(&dd[k + 1..]).copied().collect();
    let on_n = data.on_n || idx.on_n;
    let mut t = T::shaped(dims);
    t.on_n = on_n;
    if data.ints.is_some() && on_n && t.rank().is_some_and(|r| r <= 1) {
        let len = t.numel().unwrap_or(1) as usize;
        t.ints = Some(vec![Elem::OnN; len.max(1)]);
    }
    one(t)
}

fn gather_elements(args: &Args) -> R<Outs> {
    let (data, idx) = (args.need(0)?, args.need(1)?);
    let a = int_attr(args.node, "axis").unwrap_or(0);
    let rank = idx.rank().or(data.rank());
    let ok = match (data.batch(), idx.batch(), rank) {
        (None, None, _) => true,
        (Some(b), Some(c), Some(r)) => b == c && axis(a, r)? != b,
        // Each row of indices looks up along the batch axis of a constant table.
        (None, Some(c), Some(r)) => axis(a, r)? == c && !data.on_n,
        _ => false,
    };
    if !ok || idx.on_n && idx.batch().is_some() {
        return Err("GatherElements picks entries across the batch axis".into());
    }
    one(T { on_n: data.on_n || idx.on_n, dims: idx.dims.clone(), ..T::default() })
}

fn gather_nd(args: &Args) -> R<Outs> {
    let (data, idx) = (args.need(0)?, args.need(1)?);
    let bd = int_attr(args.node, "batch_dims").unwrap_or(0) as usize;
    let (Some(dd), Some(id)) = (data.dims(), idx.dims()) else {
        if args.rows() {
            return Err("GatherND indexes with values of a shape that cannot be told".into());
        }
        return one(T::opaque(data.on_n || idx.on_n));
    };
    let depth = match id.last() {
        Some(Dim::Fixed(k)) => *k as usize,
        _ if args.rows() => return Err("GatherND indexes with a depth that cannot be told".into()),
        _ => return one(T::opaque(data.on_n || idx.on_n)),
    };
    let ok = match (data.batch(), idx.batch()) {
        (None, None) => true,
        (Some(b), Some(c)) => b == 0 && c == 0 && bd >= 1,
        (None, Some(c)) => bd == 0 && c + 1 < id.len() && !data.on_n,
        (Some(_), None) => false,
    };
    if !ok {
        return Err("GatherND picks entries across the batch axis".into());
    }
    if bd + depth > dd.len() {
        return Err("GatherND's indices are deeper than its data".into());
    }
    let dims: Vec<Dim> = id[..id.len() - 1].iter().chain(&dd[bd + depth..]).copied().collect();
    one(T { on_n: data.on_n || idx.on_n, ..T::shaped(dims) })
}

fn scatter_elements(args: &Args) -> R<Outs> {
    let (data, idx, upd) = (args.need(0)?, args.need(1)?, args.need(2)?);
    if args.rows() {
        let b = data.batch();
        let a = int_attr(args.node, "axis").unwrap_or(0);
        let same = b.is_some() && idx.batch() == b && upd.batch() == b;
        if !same
            || axis(a, data.rank().unwrap_or(0))? == b.expect("same")
            || !args.ins.iter().flatten().all(|t| !t.on_n)
        {
            return Err("ScatterElements writes entries across the batch axis".into());
        }
    }
    one(T { on_n: data.on_n || idx.on_n || upd.on_n, dims: data.dims.clone(), ..T::default() })
}

fn one_hot(args: &Args) -> R<Outs> {
    let idx = args.need(0)?;
    args.setting(1, "depth")?;
    args.setting(2, "values")?;
    let Some(dims) = dims_of(args, idx)? else { return one(T::opaque(idx.on_n)) };
    let k = axis(int_attr(args.node, "axis").unwrap_or(-1), dims.len() + 1)?;
    let depth = args.get(1).and_then(T::known_one).map_or(Dim::Free(None), Dim::Fixed);
    let mut out = dims.to_vec();
    out.insert(k, depth);
    one(T { on_n: idx.on_n, ..T::shaped(out) })
}

fn compress(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    args.setting(1, "condition")?;
    let Some(a) = int_attr(args.node, "axis") else {
        if x.batch().is_some() {
            return Err("Compress without an axis flattens the batch with the other axes".into());
        }
        return one(T { on_n: x.on_n, ..T::shaped(vec![Dim::Free(None)]) });
    };
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let k = axis(a, dims.len())?;
    if x.batch() == Some(k) {
        return Err("Compress drops entries of the batch axis".into());
    }
    let mut out = dims.to_vec();
    out[k] = Dim::Free(None);
    one(T { on_n: x.on_n, ..T::shaped(out) })
}

fn resize(args: &Args) -> R<Outs> {
    let x = args.need(0)?;
    let op = args.op();
    // Where the scales and sizes are: Upsample (attribute, then input 1), Resize 10 (input
    // 1), Resize 11+ (roi, scales, sizes as inputs 1, 2, 3).
    let (scales_at, sizes_at) = if op == "Upsample" || args.opset < 11 { (1, usize::MAX) } else { (2, 3) };
    if op == "Resize" && args.opset >= 11 {
        args.setting(1, "region of interest")?;
    }
    args.setting(scales_at, "scales")?;
    let Some(dims) = dims_of(args, x)? else { return one(T::opaque(x.on_n)) };
    let rank = dims.len();
    let over = match ints_attr(args.node, "axes") {
        Some(a) => crate::merge::rows::value::axes(&a, rank)?,
        None => (0..rank).collect(),
    };
    let scales: Option<Vec<f64>> = match crate::merge::rows::value::attr(args.node, "scales") {
        Some(a) if !a.floats.is_empty() => Some(a.floats.iter().map(|&f| f64::from(f)).collect()),
        _ => args.get(scales_at).and_then(|t| t.floats.clone()).filter(|f| !f.is_empty()),
    };
    let sizes: Option<Vec<Elem>> = match args.get(sizes_at) {
        Some(t) if t.batch().is_some() => return Err(format!("{op} reads its sizes from the rows")),
        Some(t) => t.ints.clone().filter(|e| !e.is_empty()),
        None => None,
    };
    let mut out = vec![Dim::Free(None); rank];
    let b = x.batch();
    if let Some(b) = b {
        out[b] = Dim::Batch;
        let policy = str_attr(args.node, "keep_aspect_ratio_policy").unwrap_or_else(|| "stretch".into());
        let mode = str_attr(args.node, "coordinate_transformation_mode").unwrap_or_default();
        if mode == "tf_crop_and_resize" {
            return Err(format!("{op} crops by a region of interest that includes the batch axis"));
        }
        let Some(at) = over.iter().position(|&k| k == b) else {
            return one(T::shaped(out));
        };
        if sizes.is_some() && policy != "stretch" {
            return Err(format!("{op} keeps the aspect ratio over axes that include the batch axis"));
        }
        let kept = match (&scales, &sizes) {
            (_, Some(s)) => s.get(at) == Some(&Elem::Batch) && !s.iter().enumerate().any(|(i, e)| i != at && e.on_n()),
            (Some(s), None) => s.get(at) == Some(&1.0),
            (None, None) => false,
        };
        if !kept {
            return Err(format!("{op} resamples the batch axis (or its scales and sizes cannot be told)"));
        }
    } else if sizes.as_ref().is_some_and(|s| s.iter().any(|e| e.on_n())) {
        return Err(format!("{op} resizes to sizes computed from the number of rows"));
    }
    if let Some(s) = &sizes {
        for (i, &k) in over.iter().enumerate() {
            if let Some(Elem::Known(v)) = s.get(i) {
                out[k] = Dim::Fixed(*v);
            }
        }
    }
    one(T { on_n: x.on_n, ..T::shaped(out) })
}
