//! Element-wise operators: numpy broadcasting with the batch axis, and the small integer
//! arithmetic that computes shapes.
use crate::merge::rows::value::{Dim, Elem, T};

type R<X> = Result<X, String>;

/// Operators that compute each output element from the same element of their one input.
pub const UNARY: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BitwiseNot",
    "Cast",
    "Ceil",
    "Celu",
    "Cos",
    "Cosh",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "IsInf",
    "IsNaN",
    "LeakyRelu",
    "Log",
    "Mish",
    "Neg",
    "Not",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Swish",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
];

/// Operators that broadcast their inputs (numpy's rules) and compute each output element
/// from the elements at the same place.
pub const BROADCAST: &[&str] = &[
    "Add",
    "And",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Div",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Max",
    "Mean",
    "Min",
    "Mod",
    "Mul",
    "Or",
    "Pow",
    "PRelu",
    "Sub",
    "Sum",
    "Where",
    "Xor",
];

/// Numpy broadcasting of `ins`, with the batch axis kept apart: every input that has one
/// must have it at the same place of the result, and any other input must have size 1
/// there (or not reach it). A batch-size used as data next to rows mixes them.
pub fn broadcast(op: &str, ins: &[&T]) -> R<T> {
    let rows = ins.iter().any(|t| t.batch().is_some());
    let on_n = ins.iter().any(|t| t.on_n);
    if rows && on_n {
        return Err(format!("{op} combines the rows with a value computed from the number of rows in the batch"));
    }
    let Some(ranks) = ins.iter().map(|t| t.rank()).collect::<Option<Vec<usize>>>() else {
        if rows {
            return Err(format!("{op} broadcasts the rows against a value whose shape cannot be told"));
        }
        return Ok(T::opaque(on_n));
    };
    let rank = ranks.iter().copied().max().unwrap_or(0);
    let mut out = vec![Dim::Fixed(1); rank];
    let mut batch_at: Option<usize> = None;
    for t in ins {
        if let Some(b) = t.batch() {
            let at = b + rank - t.rank().expect("known");
            if batch_at.is_some_and(|p| p != at) {
                return Err(format!("{op} broadcasts the batch axis of one input against another axis of another"));
            }
            batch_at = Some(at);
        }
    }
    for (t, r) in ins.iter().zip(&ranks) {
        let dims = t.dims().expect("known");
        for (k, d) in dims.iter().enumerate() {
            let at = k + rank - r;
            out[at] = match (out[at], *d) {
                (_, Dim::Batch) | (Dim::Batch, _) => {
                    if *d != Dim::Batch && *d != Dim::Fixed(1) {
                        return Err(format!("{op} broadcasts a value of size {} against the batch axis", show(*d)));
                    }
                    Dim::Batch
                }
                (Dim::Fixed(1), x) | (x, Dim::Fixed(1)) => x,
                (Dim::Fixed(a), Dim::Fixed(b)) if a == b => Dim::Fixed(a),
                (Dim::Fixed(a), Dim::Fixed(_)) => Dim::Fixed(a), // ONNX Runtime refuses it at run time
                (Dim::Fixed(a), Dim::Free(_)) | (Dim::Free(_), Dim::Fixed(a)) => Dim::Fixed(a),
                // One size where both are known to be the same axis' size.
                (Dim::Free(a), Dim::Free(b)) => Dim::Free(a.filter(|_| a == b)),
            };
        }
    }
    // A batch axis met only by inputs of size 1 there is set above; one that no input reaches
    // cannot be (every input that has it has it).
    if let Some(at) = batch_at {
        for (t, r) in ins.iter().zip(&ranks) {
            if t.batch().is_none() && at + r >= rank {
                let d = t.dims().expect("known")[at + r - rank];
                if d != Dim::Fixed(1) {
                    return Err(format!("{op} broadcasts a value of size {} against the batch axis", show(d)));
                }
            }
        }
    }
    let mut v = T::shaped(out);
    v.on_n = on_n;
    Ok(v)
}

pub fn show(d: Dim) -> String {
    match d {
        Dim::Fixed(v) => v.to_string(),
        Dim::Batch => "N".into(),
        Dim::Free(_) => "unknown".into(),
    }
}

/// An element-wise operator on small integers (shape arithmetic), where its inputs are
/// such: the elements it computes, or None.
pub fn ints_of(op: &str, ins: &[&T]) -> Option<(bool, Vec<Elem>)> {
    let lists: Vec<&Vec<Elem>> = ins.iter().map(|t| t.ints.as_ref()).collect::<Option<_>>()?;
    let scalar = ins.iter().all(|t| t.scalar());
    let len = lists.iter().map(|l| l.len()).max()?;
    if lists.iter().any(|l| l.len() != len && l.len() != 1) {
        return None;
    }
    let at = |l: &Vec<Elem>, k: usize| if l.len() == 1 { l[0] } else { l[k] };
    let mut out = Vec::with_capacity(len);
    for k in 0..len {
        let e: Vec<Elem> = lists.iter().map(|l| at(l, k)).collect();
        out.push(match (op, e.as_slice()) {
            // Cast is read by its type (ops::cast_ints); these keep an integer as it is.
            ("Identity" | "Floor" | "Ceil" | "Round", [a]) => *a,
            ("Neg", [Elem::Known(a)]) => Elem::Known(a.checked_neg()?),
            ("Abs", [Elem::Known(a)]) => Elem::Known(a.checked_abs()?),
            ("Add", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(a.checked_add(*b)?),
            ("Sub", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(a.checked_sub(*b)?),
            ("Mul", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(a.checked_mul(*b)?),
            // The size of a batch axis merged with `b` entries per row (attention's N * heads).
            ("Mul", [r, Elem::Known(b)] | [Elem::Known(b), r]) if r.per_row().is_some() && *b > 0 => {
                Elem::rows(r.per_row()?.checked_mul(*b)?)
            }
            ("Div", [r, Elem::Known(b)]) if *b > 0 && r.per_row().is_some_and(|c| c % b == 0) => {
                Elem::rows(r.per_row()? / b)
            }
            ("Div", [Elem::Known(a), Elem::Known(b)]) if *b != 0 => Elem::Known(a.checked_div(*b)?),
            // Integer Mod (fmod=0) takes the divisor's sign, as Python's %.
            ("Mod", [Elem::Known(a), Elem::Known(b)]) => {
                let r = a.checked_rem(*b)?;
                Elem::Known(if r != 0 && (r < 0) != (*b < 0) { r + b } else { r })
            }
            // Mod with fmod=1: the dividend's sign (Rust's %).
            ("FMod", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(a.checked_rem(*b)?),
            ("Max", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(*a.max(b)),
            ("Min", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(*a.min(b)),
            // torch's expand writes Where(Equal(shape, -1), ones, shape): a batch size is
            // never negative, so it is never -1.
            ("Equal", [Elem::Known(a), Elem::Known(b)]) => Elem::Known(i64::from(a == b)),
            ("Equal", [r, Elem::Known(v)] | [Elem::Known(v), r]) if *v < 0 && r.per_row().is_some() => Elem::Known(0),
            ("Where", [Elem::Known(c), a, b]) => {
                if *c != 0 {
                    *a
                } else {
                    *b
                }
            }
            ("Where", [c, a, b]) if a == b && !c.on_n() => *a,
            ("Where", [c, a, b]) if !c.on_n() && !a.on_n() && !b.on_n() => Elem::Free(None),
            ("Add" | "Sub", [x, Elem::Known(0)]) | ("Add", [Elem::Known(0), x]) => *x,
            ("Mul" | "Div", [x, Elem::Known(1)]) | ("Mul", [Elem::Known(1), x]) => *x,
            (_, e) if e.iter().any(|x| x.on_n()) => Elem::OnN,
            _ => Elem::Free(None),
        });
    }
    Some((scalar, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(dims: &[Dim]) -> T {
        T::shaped(dims.to_vec())
    }

    #[test]
    fn a_constant_broadcasts_along_the_other_axes() {
        let x = rows(&[Dim::Batch, Dim::Fixed(4)]);
        let bias = rows(&[Dim::Fixed(4)]);
        assert_eq!(broadcast("Add", &[&x, &bias]).unwrap().dims, x.dims);
        let per_row = rows(&[Dim::Fixed(1), Dim::Fixed(4)]);
        assert_eq!(broadcast("Add", &[&x, &per_row]).unwrap().dims, x.dims);
        let three = rows(&[Dim::Fixed(3), Dim::Batch, Dim::Fixed(4)]);
        let lifted = broadcast("Mul", &[&x, &three]).unwrap();
        assert_eq!(lifted.batch(), Some(1));
    }

    #[test]
    fn a_fixed_size_on_the_batch_axis_or_two_batch_axes_mix_rows() {
        let x = rows(&[Dim::Batch, Dim::Fixed(4)]);
        let table = rows(&[Dim::Fixed(8), Dim::Fixed(4)]);
        assert!(broadcast("Add", &[&x, &table]).unwrap_err().contains("size 8 against the batch axis"));
        let unknown = rows(&[Dim::Free(None), Dim::Fixed(4)]);
        assert!(broadcast("Add", &[&x, &unknown]).is_err());
        let column = rows(&[Dim::Batch, Dim::Fixed(1)]);
        let line = rows(&[Dim::Fixed(1), Dim::Fixed(1), Dim::Batch]);
        assert!(broadcast("Sub", &[&column, &line]).unwrap_err().contains("another axis"));
        let n = T::ints(true, vec![Elem::Batch]);
        assert!(broadcast("Div", &[&x, &n]).unwrap_err().contains("number of rows"));
    }

    #[test]
    fn shape_arithmetic_keeps_the_batch_size_through_identities() {
        let n = T::ints(true, vec![Elem::Batch]);
        let one = T::ints(true, vec![Elem::Known(1)]);
        let four = T::ints(true, vec![Elem::Known(4)]);
        assert_eq!(ints_of("Mul", &[&n, &one]), Some((true, vec![Elem::Batch])));
        assert_eq!(ints_of("Mul", &[&n, &four]), Some((true, vec![Elem::Rows(4)])));
        let eight = T::ints(true, vec![Elem::Rows(8)]);
        assert_eq!(ints_of("Div", &[&eight, &four]), Some((true, vec![Elem::Rows(2)])));
        assert_eq!(ints_of("Add", &[&eight, &four]), Some((true, vec![Elem::OnN])));
        assert_eq!(ints_of("Add", &[&four, &one]), Some((true, vec![Elem::Known(5)])));
        let v = T::ints(false, vec![Elem::Known(2), Elem::Free(None)]);
        assert_eq!(ints_of("Div", &[&v, &four]), Some((false, vec![Elem::Known(0), Elem::Free(None)])));
    }

    #[test]
    fn mod_takes_the_divisors_sign_or_with_fmod_the_dividends_and_never_overflows() {
        let k = |v: i64| T::ints(true, vec![Elem::Known(v)]);
        assert_eq!(ints_of("Mod", &[&k(-1), &k(6)]), Some((true, vec![Elem::Known(5)])));
        assert_eq!(ints_of("Mod", &[&k(5), &k(-3)]), Some((true, vec![Elem::Known(-1)])));
        assert_eq!(ints_of("FMod", &[&k(-1), &k(6)]), Some((true, vec![Elem::Known(-1)])));
        assert_eq!(ints_of("Mod", &[&k(i64::MIN), &k(-1)]), None, "no panic: onnxruntime's own business");
        assert_eq!(ints_of("Mod", &[&k(3), &k(0)]), None);
    }

    #[test]
    fn torchs_expand_shape_keeps_the_batch_size() {
        // Where(Equal(s, -1), ones, s) for s = [N, L]: N is never -1, L is unknown.
        let s = T::ints(false, vec![Elem::Batch, Elem::Free(None)]);
        let minus = T::ints(false, vec![Elem::Known(-1), Elem::Known(-1)]);
        let ones = T::ints(false, vec![Elem::Known(1), Elem::Known(1)]);
        let (_, eq) = ints_of("Equal", &[&s, &minus]).unwrap();
        assert_eq!(eq, vec![Elem::Known(0), Elem::Free(None)]);
        let cond = T::ints(false, eq);
        assert_eq!(ints_of("Where", &[&cond, &ones, &s]), Some((false, vec![Elem::Batch, Elem::Free(None)])));
        // A condition computed from the batch size does not choose a batch-free value.
        let on_n = T::ints(false, vec![Elem::OnN, Elem::OnN]);
        assert_eq!(ints_of("Where", &[&on_n, &ones, &s]).unwrap().1, vec![Elem::OnN, Elem::OnN]);
    }
}
