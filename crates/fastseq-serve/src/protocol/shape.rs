//! A request's shapes: each declared shape checked before anything is sized by it (at most
//! [`MAX_RANK`] axes, each at most [`MAX_DIM`], multiplying to at most [`MAX_SPAN`]); then the
//! decoded tensors against the model, HTTP and gRPC alike: every input given, each in the
//! model's datatype (a safe widening converted, as the pipeline's input rule takes it), of
//! the model's rank and fixed sizes. Messages word these as the pipeline's rule does.
use crate::error::{log_line, RequestError};
use crate::tensor::{Datatype, ModelSpec, Tensor};

use crate::protocol::{list, values, Checks, MAX_DIM, MAX_RANK, MAX_SPAN};

/// One axis as a request declared it: an integer in range, or not (shown as given).
pub enum Dim<'a> {
    Size(u64),
    Bad(&'a str),
}

/// The declared shape of input `name` and the number of values it holds, checked before any
/// allocation. `dims` is the request's list (already known to be one).
pub fn declared(name: &str, dims: &[Dim<'_>]) -> Result<(Vec<usize>, u64), RequestError> {
    if dims.len() > MAX_RANK {
        return Err(RequestError::bad(format!("input '{name}' has {} axes, more than {MAX_RANK}", dims.len())));
    }
    let mut count: u128 = 1;
    let mut span: u128 = 1;
    let mut shape = Vec::with_capacity(dims.len());
    for d in dims {
        match *d {
            Dim::Size(n) if n <= MAX_DIM => {
                count = count.saturating_mul(n as u128);
                span = span.saturating_mul(n.max(1) as u128);
                shape.push(n as usize);
            }
            _ => {
                return Err(RequestError::bad(format!(
                    "input '{name}' has shape {}: each axis must be an integer from 0 to {MAX_DIM}",
                    shown(dims)
                )))
            }
        }
    }
    if span > MAX_SPAN as u128 {
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}: its axes multiply past {MAX_SPAN}, more than any array holds",
            shown(dims)
        )));
    }
    Ok((shape, count as u64))
}

/// A declared shape as a message shows it: at most 200 characters, one line.
fn shown(dims: &[Dim<'_>]) -> String {
    let mut out = String::from("[");
    for (k, d) in dims.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        match d {
            Dim::Size(n) => out.push_str(&n.to_string()),
            Dim::Bad(raw) => out.push_str(&raw.chars().take(40).collect::<String>()),
        }
        if out.len() > 200 {
            break;
        }
    }
    out.push(']');
    let mut out = log_line(&out);
    if out.len() > 200 {
        let cut = (0..=200).rev().find(|&i| out.is_char_boundary(i)).unwrap_or(0);
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// The tensors a request gave (`given`, one slot per input of the model, in the request's
/// order `order`) checked against the model: the inputs in the model's order.
pub fn against_model(
    model: &ModelSpec,
    mut given: Vec<Option<Tensor>>,
    order: &[usize],
    checks: Checks,
) -> Result<Vec<Tensor>, RequestError> {
    if checks.every_input {
        let missing: Vec<&str> =
            model.inputs.iter().zip(&given).filter(|(_, g)| g.is_none()).map(|(s, _)| s.name.as_str()).collect();
        if !missing.is_empty() {
            let takes: Vec<&str> = model.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(RequestError::bad(format!(
                "missing input{}: {} (model '{}' takes {})",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                model.name,
                takes.join(", ")
            )));
        }
    }
    for &k in order {
        let spec = &model.inputs[k];
        let Some(tensor) = given[k].as_mut() else { continue };
        if tensor.datatype != spec.datatype {
            if !values::widens(tensor.datatype, spec.datatype) {
                return Err(RequestError::bad(format!(
                    "input '{}' expects {}, got {}, which does not convert without changing values (model '{}' \
                     takes {}, the request sends {})",
                    spec.name,
                    numpy_name(spec.datatype),
                    numpy_name(tensor.datatype),
                    model.name,
                    spec.datatype.name(),
                    tensor.datatype.name()
                )));
            }
            tensor.data = values::widen(tensor.datatype, spec.datatype, &tensor.data);
            tensor.datatype = spec.datatype;
        }
        if let Some(want) = &spec.shape {
            let got = &tensor.shape;
            if want.len() != got.len() {
                return Err(RequestError::bad(format!(
                    "input '{}' expects rank {} {}, got shape {}",
                    spec.name,
                    want.len(),
                    list(want),
                    list(got)
                )));
            }
            for (axis, (&w, &g)) in want.iter().zip(got).enumerate() {
                if w >= 0 && w as u64 != g as u64 {
                    return Err(RequestError::bad(format!(
                        "input '{}' expects size {w} on axis {axis} {}, got shape {}",
                        spec.name,
                        list(want),
                        list(got)
                    )));
                }
            }
        }
    }
    Ok(given.into_iter().flatten().collect())
}

/// The numpy dtype's name of a datatype, as the pipeline's input rule words its errors.
pub fn numpy_name(d: Datatype) -> &'static str {
    match d {
        Datatype::Bool => "bool",
        Datatype::Uint8 => "uint8",
        Datatype::Uint16 => "uint16",
        Datatype::Uint32 => "uint32",
        Datatype::Uint64 => "uint64",
        Datatype::Int8 => "int8",
        Datatype::Int16 => "int16",
        Datatype::Int32 => "int32",
        Datatype::Int64 => "int64",
        Datatype::Fp16 => "float16",
        Datatype::Fp32 => "float32",
        Datatype::Fp64 => "float64",
        Datatype::Bytes => "str",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorSpec;
    use bytes::Bytes;

    fn dims(d: &[u64]) -> Vec<Dim<'static>> {
        d.iter().map(|&n| Dim::Size(n)).collect()
    }

    fn message(r: Result<(Vec<usize>, u64), RequestError>) -> String {
        r.unwrap_err().message
    }

    #[test]
    fn declared_shapes_are_bounded_before_anything_is_sized() {
        assert_eq!(declared("x", &dims(&[2, 3])).unwrap(), (vec![2, 3], 6));
        assert_eq!(declared("x", &dims(&[0, 5])).unwrap(), (vec![0, 5], 0));
        assert_eq!(declared("x", &[]).unwrap(), (vec![], 1));
        assert!(message(declared("x", &dims(&[1; 33]))).contains("has 33 axes, more than 32"));
        assert!(declared("x", &dims(&[1; 32])).is_ok());
        assert!(message(declared("x", &dims(&[MAX_DIM + 1]))).contains("each axis must be an integer from 0"));
        assert!(message(declared("x", &dims(&[0, MAX_DIM]))).contains("multiply past"));
        assert!(message(declared("x", &dims(&[MAX_DIM, 0, MAX_DIM]))).contains("multiply past"));
        assert!(message(declared("x", &dims(&[MAX_DIM; 32]))).contains("multiply past"));
        assert_eq!(declared("x", &dims(&[MAX_SPAN])).unwrap().1, MAX_SPAN);
        let m = message(declared("x", &[Dim::Size(1), Dim::Bad("\"a\nb\"")]));
        assert!(m.contains("[1, \"a\\nb\"]"), "{m}");
        let long = "9".repeat(10_000);
        assert!(message(declared("x", &[Dim::Bad(&long)])).len() < 300);
    }

    fn model() -> ModelSpec {
        let spec = |name: &str, datatype, shape: Option<Vec<i64>>| TensorSpec { name: name.into(), datatype, shape };
        ModelSpec {
            name: "m".into(),
            version: "1".into(),
            inputs: vec![spec("x", Datatype::Fp32, Some(vec![-1, 3])), spec("k", Datatype::Int64, None)],
            outputs: vec![],
            max_batch_size: 0,
            max_delay_us: 0,
        }
    }

    fn tensor(datatype: Datatype, shape: Vec<usize>, data: Vec<u8>) -> Tensor {
        Tensor { datatype, shape, data: Bytes::from(data) }
    }

    #[test]
    fn tensors_meet_the_model() {
        let m = model();
        let x = tensor(Datatype::Fp32, vec![1, 3], vec![0; 12]);
        let k = tensor(Datatype::Int32, vec![2], [7i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect());
        let got = against_model(&m, vec![Some(x.clone()), Some(k)], &[1, 0], Checks::default()).unwrap();
        assert_eq!(got[1].datatype, Datatype::Int64);
        assert_eq!(&got[1].data[..], [7i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
        let e = against_model(&m, vec![Some(x.clone()), None], &[0], Checks::default()).unwrap_err();
        assert!(e.message.starts_with("missing input: k"), "{}", e.message);
        let got = against_model(&m, vec![Some(x), None], &[0], Checks { every_input: false }).unwrap();
        assert_eq!(got.len(), 1);
        let wide = tensor(Datatype::Fp64, vec![1, 3], vec![0; 24]);
        let e = against_model(&m, vec![Some(wide), None], &[0], Checks { every_input: false }).unwrap_err();
        assert!(e.message.starts_with("input 'x' expects float32, got float64"), "{}", e.message);
        let bad = tensor(Datatype::Fp32, vec![1, 4], vec![0; 16]);
        let e = against_model(&m, vec![Some(bad), None], &[0], Checks { every_input: false }).unwrap_err();
        assert_eq!(e.message, "input 'x' expects size 3 on axis 1 [-1, 3], got shape [1, 4]");
        let bad = tensor(Datatype::Fp32, vec![3], vec![0; 12]);
        let e = against_model(&m, vec![Some(bad), None], &[0], Checks { every_input: false }).unwrap_err();
        assert_eq!(e.message, "input 'x' expects rank 2 [-1, 3], got shape [3]");
    }
}
