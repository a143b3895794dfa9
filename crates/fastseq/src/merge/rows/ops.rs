//! Which operators keep the rows of a batch apart, and how each moves the batch axis: one
//! function per kind of operator (element-wise, shapes, indexing, reductions and
//! normalisations, linear algebra, `ai.onnx.ml`), called by [`step`].
//!
//! An operator the table does not know keeps nothing: its outputs count as mixed unless
//! none of its inputs depends on the batch. A wrong "independent" silently computes wrong
//! results, a wrong "dependent" only asks the user to say so; every rule leans that way.
use crate::merge::opsets::normalize_domain;
use crate::merge::rows::args::{each, one, unknown, Args, Outs, R};
use crate::merge::rows::elementwise::{broadcast, ints_of, BROADCAST, UNARY};
use crate::merge::rows::value::T;
use crate::merge::rows::{index, linalg, ml, place, reduce, shape};

/// Whether `op` follows rows of unknown rank (see `T::loose`): element-wise operators do,
/// when their other inputs are scalars that do not depend on the batch.
pub fn follows_loose(op: &str, domain: &str, ins: &[Option<T>]) -> bool {
    let plain = normalize_domain(domain).is_empty() && (UNARY.contains(&op) || BROADCAST.contains(&op) || op == "Clip");
    plain && ins.iter().flatten().all(|t| t.loose || (t.fixed() && t.scalar()))
}

/// What `node` makes of its inputs. Mixed inputs, functions and subgraphs are dealt with by
/// the caller.
pub fn step(args: &Args) -> R<Outs> {
    let node = args.node;
    let op = args.op();
    let domain = node.domain.as_deref().unwrap_or("");
    match normalize_domain(domain) {
        "" => default_domain(args, op),
        "ai.onnx.ml" => ml::step(args, op),
        _ => unknown(args, &format!("{op} (domain '{domain}')")),
    }
}

fn default_domain(args: &Args, op: &str) -> R<Outs> {
    if args.ins.iter().flatten().any(|t| t.loose) {
        // Checked by the caller (`follows_loose`): element-wise, so the output is as loose.
        return each(args, T { loose: true, ..T::default() });
    }
    if UNARY.contains(&op) || op == "CastLike" {
        let x = args.need(0)?;
        let mut t = T { dims: x.dims.clone(), on_n: x.on_n, ..T::default() };
        if let Some((scalar, elems)) = ints_of(if op == "CastLike" { "Cast" } else { op }, &[x]) {
            t = T { ints: Some(elems), ..t };
            let _ = scalar;
        }
        if matches!(op, "Identity" | "Cast" | "CastLike") {
            t.floats.clone_from(&x.floats);
        }
        return one(t);
    }
    if BROADCAST.contains(&op) || op == "Clip" {
        let ins: Vec<&T> = args.ins.iter().flatten().collect();
        let mut t = broadcast(op, &ins)?;
        if let Some((_, elems)) = ints_of(op, &ins) {
            t.ints = Some(elems);
        }
        return one(t);
    }
    match op {
        "Constant" => one(crate::merge::rows::value::constant(args.node)),
        "Dropout" => {
            args.setting(1, "ratio")?;
            args.setting(2, "training mode")?;
            let x = args.need(0)?;
            each(args, T { dims: x.dims.clone(), on_n: x.on_n, ..T::default() })
        }
        // A batch axis merged with one input axis of unknown size (BERT's flattened mask).
        "Reshape" | "Flatten" => place::flattened(args).map_or_else(|| shape::step(args, op), one),
        "Shape" | "Size" | "Squeeze" | "Unsqueeze" | "Transpose" | "Concat" | "Split" | "Slice" | "Expand" | "Tile"
        | "ConstantOfShape" | "Pad" => shape::step(args, op),
        // Each row's place (a Range over the batch size) first: followed apart, as an index.
        "Range" => place::range(args).map_or_else(|| shape::step(args, op), one),
        "Gather" | "GatherElements" | "GatherND" | "ScatterElements" | "OneHot" | "Compress" | "Resize"
        | "Upsample" | "DepthToSpace" | "SpaceToDepth" | "Trilu" | "CumSum" | "EyeLike" => index::step(args, op),
        "ReduceSum"
        | "ReduceMean"
        | "ReduceMax"
        | "ReduceMin"
        | "ReduceProd"
        | "ReduceL1"
        | "ReduceL2"
        | "ReduceLogSum"
        | "ReduceLogSumExp"
        | "ReduceSumSquare"
        | "ArgMax"
        | "ArgMin"
        | "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "LpNormalization"
        | "LayerNormalization"
        | "RMSNormalization"
        | "GroupNormalization"
        | "InstanceNormalization"
        | "BatchNormalization"
        | "MeanVarianceNormalization"
        | "LRN"
        | "TopK"
        | "QuantizeLinear"
        | "DequantizeLinear"
        | "DynamicQuantizeLinear" => reduce::step(args, op),
        "MatMul" | "MatMulInteger" | "QLinearMatMul" | "Gemm" | "Einsum" | "Conv" | "ConvTranspose" | "ConvInteger"
        | "QLinearConv" | "MaxPool" | "AveragePool" | "LpPool" | "GlobalAveragePool" | "GlobalMaxPool"
        | "GlobalLpPool" | "LSTM" | "GRU" | "RNN" => linalg::step(args, op),
        "RandomNormal" | "RandomUniform" => each(args, T::opaque(false)),
        "NonZero" if args.rows() => Err("NonZero lists the places of the non-zero values of the whole batch".into()),
        "Unique" if args.rows() => Err("Unique takes the distinct values of the whole batch".into()),
        "NonMaxSuppression" if args.rows() => {
            Err("NonMaxSuppression selects boxes of the whole batch into one list".into())
        }
        _ => unknown(args, op),
    }
}
