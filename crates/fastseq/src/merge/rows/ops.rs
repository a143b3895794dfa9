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
use crate::merge::rows::value::{int_attr, Elem, T};
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
        t.ints = match op {
            "Cast" => x.ints.as_deref().and_then(|e| cast_ints(e, int_attr(args.node, "to"))),
            // The type cast to is another value's, which the analysis does not know.
            "CastLike" => None,
            _ => ints_of(op, &[x]).map(|(_, elems)| elems),
        };
        if matches!(op, "Identity" | "Cast" | "CastLike") {
            t.floats.clone_from(&x.floats);
        }
        return one(t);
    }
    if BROADCAST.contains(&op) || op == "Clip" {
        let ins: Vec<&T> = args.ins.iter().flatten().collect();
        let mut t = broadcast(op, &ins)?;
        // fmod=1: the remainder takes the dividend's sign (C's fmod), not the divisor's.
        let ints_op = if op == "Mod" && int_attr(args.node, "fmod") == Some(1) { "FMod" } else { op };
        if let Some((_, elems)) = ints_of(ints_op, &ins) {
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

/// The elements of an integer tensor cast to ONNX type `to`, where the cast keeps them
/// integers: each element the same number where it is known to be representable, an unknown
/// size where it may not be (a size cast to bool is 1, to uint8 wraps at 256: no longer that
/// size). None for any other type: elements are followed as integer arithmetic only (a float's
/// division is not an integer's, and Ceil of it is no longer the identity).
fn cast_ints(elems: &[Elem], to: Option<i64>) -> Option<Vec<Elem>> {
    // The range of each integer type; BOOL maps every non-zero value to 1.
    let (lo, hi): (i64, i64) = match to? {
        7 => (i64::MIN, i64::MAX), // INT64
        13 => (0, i64::MAX),       // UINT64 (an i64 that is not negative)
        6 => (i32::MIN.into(), i32::MAX.into()),
        12 => (0, u32::MAX.into()),
        5 => (i16::MIN.into(), i16::MAX.into()),
        4 => (0, u16::MAX.into()),
        3 => (i8::MIN.into(), i8::MAX.into()),
        2 => (0, u8::MAX.into()),
        9 => (0, 1), // BOOL
        _ => return None,
    };
    // Sizes and row counts are never negative and below 2^63: only 64-bit types hold any.
    // The one exception: the number of rows itself, in types that hold MAX_BATCH_ROWS.
    let wide = hi == i64::MAX;
    let rows_fit = hi >= crate::merge::rows::MAX_BATCH_ROWS;
    Some(
        elems
            .iter()
            .map(|e| match *e {
                Elem::Known(v) if (lo..=hi).contains(&v) => Elem::Known(v),
                Elem::Known(v) if to == Some(9) => Elem::Known(i64::from(v != 0)),
                Elem::Known(_) => Elem::Free(None),
                e if wide => e,
                Elem::Batch if rows_fit => Elem::Batch,
                e if e.on_n() => Elem::OnN,
                _ => Elem::Free(None),
            })
            .collect(),
    )
}
