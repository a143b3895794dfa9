//! Requests' tensors joined along the batch axis into one contiguous buffer per input, and a
//! joint run's outputs split back into each request's own rows (copied out, so an answer
//! holds its own bytes only). Rows are counted from each request's own first axis, so a request of 0 rows
//! gets 0 rows and its neighbours theirs.
use bytes::{Bytes, BytesMut};

use crate::tensor::{Datatype, Tensor};

/// The key of the batches a request may join: each input's shape past its first axis (the
/// datatypes are the model's, the same for every request). None where an input has no first
/// axis (a scalar) or the inputs' row counts differ: such a request runs alone.
pub fn key(inputs: &[Tensor]) -> Option<(usize, Vec<Vec<usize>>)> {
    let mut rows = None;
    let mut key = Vec::with_capacity(inputs.len());
    for t in inputs {
        let r = t.rows()?;
        if *rows.get_or_insert(r) != r {
            return None;
        }
        key.push(t.shape[1..].to_vec());
    }
    Some((rows.unwrap_or(0), key))
}

/// The requests' inputs joined along the first axis: one tensor per input, its rows the
/// requests' rows in order. Every request shares the key of [`key`].
pub fn join(requests: &[&[Tensor]]) -> Vec<Tensor> {
    let first = requests[0];
    (0..first.len())
        .map(|i| {
            let size: usize = requests.iter().map(|r| r[i].data.len()).sum();
            let rows: usize = requests.iter().map(|r| r[i].shape[0]).sum();
            let mut data = BytesMut::with_capacity(size);
            for r in requests {
                data.extend_from_slice(&r[i].data);
            }
            let mut shape = first[i].shape.clone();
            shape[0] = rows;
            Tensor { datatype: first[i].datatype, shape, data: data.freeze() }
        })
        .collect()
}

/// A joint run's output that does not keep the batch axis (its first axis is not the rows
/// given), or whose bytes do not match its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSplit {
    pub output: usize,
    pub shape: Vec<usize>,
}

/// Each request's own rows of `outputs` (`rows[k]` rows for request k, in order), each in a
/// buffer of its own.
pub fn split(outputs: &[Tensor], rows: &[usize]) -> Result<Vec<Vec<Tensor>>, NotSplit> {
    let total: usize = rows.iter().sum();
    let mut answers: Vec<Vec<Tensor>> = rows.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for (o, out) in outputs.iter().enumerate() {
        let bad = || NotSplit { output: o, shape: out.shape.clone() };
        if out.rows() != Some(total) {
            return Err(bad());
        }
        let per_row: usize = out.shape[1..].iter().product();
        let bounds = match out.datatype.size() {
            Some(size) => {
                if out.data.len() != total * per_row * size {
                    return Err(bad());
                }
                let mut at = 0;
                rows.iter()
                    .map(|&r| {
                        let start = at;
                        at += r * per_row * size;
                        (start, at)
                    })
                    .collect::<Vec<_>>()
            }
            None => strings_bounds(&out.data, rows, per_row).ok_or_else(bad)?,
        };
        for (answer, ((start, end), &r)) in answers.iter_mut().zip(bounds.into_iter().zip(rows)) {
            let mut shape = out.shape.clone();
            shape[0] = r;
            // A copy where the run had several requests: each answer then holds its own bytes
            // only, not the whole batch's, for as long as its client takes to read it.
            let data = if rows.len() == 1 { out.data.slice(start..end) } else { Bytes::copy_from_slice(&out.data[start..end]) };
            answer.push(Tensor { datatype: out.datatype, shape, data });
        }
    }
    Ok(answers)
}

/// Where each request's elements start and end in BYTES data (each element a 4-byte
/// little-endian length and its bytes); None where the data does not hold them.
fn strings_bounds(data: &Bytes, rows: &[usize], per_row: usize) -> Option<Vec<(usize, usize)>> {
    let mut at = 0usize;
    let mut bounds = Vec::with_capacity(rows.len());
    for &r in rows {
        let start = at;
        for _ in 0..r * per_row {
            let len = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
            at = at.checked_add(4 + len)?;
            if at > data.len() {
                return None;
            }
        }
        bounds.push((start, at));
    }
    (at == data.len()).then_some(bounds)
}

/// An input's values for a warm-up run: one row of zeros (empty strings), each dynamic axis
/// 1, fixed ones as declared (a spec without a shape: one value).
pub fn zeros(datatype: Datatype, shape: &Option<Vec<i64>>) -> Tensor {
    let shape: Vec<usize> = match shape {
        Some(dims) => dims.iter().map(|&d| if d >= 0 { d as usize } else { 1 }).collect(),
        None => vec![1],
    };
    let n: usize = shape.iter().product();
    let data = match datatype.size() {
        Some(size) => vec![0u8; n * size],
        None => vec![0u8; n * 4],
    };
    Tensor { datatype, shape, data: Bytes::from(data) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(rows: usize, first: f32) -> Tensor {
        let values: Vec<u8> = (0..rows * 2).flat_map(|k| (first + k as f32).to_le_bytes()).collect();
        Tensor { datatype: Datatype::Fp32, shape: vec![rows, 2], data: Bytes::from(values) }
    }

    fn strings(values: &[&str]) -> Tensor {
        let mut data = Vec::new();
        for v in values {
            data.extend_from_slice(&(v.len() as u32).to_le_bytes());
            data.extend_from_slice(v.as_bytes());
        }
        Tensor { datatype: Datatype::Bytes, shape: vec![values.len()], data: Bytes::from(data) }
    }

    #[test]
    fn rows_of_zero_one_and_two_come_back_to_their_own() {
        for counts in [vec![0, 2], vec![2, 0], vec![0, 1, 1], vec![1, 0, 1], vec![3, 0, 0], vec![0, 0]] {
            let inputs: Vec<Vec<Tensor>> = counts.iter().enumerate().map(|(k, &r)| vec![f32s(r, 100.0 * k as f32)]).collect();
            let refs: Vec<&[Tensor]> = inputs.iter().map(Vec::as_slice).collect();
            let joined = join(&refs);
            assert_eq!(joined[0].shape, vec![counts.iter().sum::<usize>(), 2]);
            let answers = split(&joined, &counts).unwrap();
            for (answer, input) in answers.iter().zip(&inputs) {
                assert_eq!(answer[0], input[0], "{counts:?}");
            }
        }
    }

    #[test]
    fn strings_split_by_their_own_lengths() {
        let joined = join(&[&[strings(&["a", "bcd"])], &[strings(&[])], &[strings(&["", "xy", "z"])]]);
        let answers = split(&joined, &[2, 0, 3]).unwrap();
        assert_eq!(answers[0][0], strings(&["a", "bcd"]));
        assert_eq!(answers[1][0], strings(&[]));
        assert_eq!(answers[2][0], strings(&["", "xy", "z"]));
        let mut lying = strings(&["abc"]);
        lying.data = lying.data.slice(..5);
        assert!(split(&[lying], &[1]).is_err());
    }

    #[test]
    fn an_output_without_the_batch_axis_is_not_split() {
        let out = Tensor { datatype: Datatype::Fp32, shape: vec![2], data: Bytes::from(vec![0u8; 8]) };
        assert_eq!(split(&[out], &[1, 2]), Err(NotSplit { output: 0, shape: vec![2] }));
    }

    #[test]
    fn keys_need_a_first_axis_and_equal_rows() {
        assert_eq!(key(&[f32s(3, 0.0)]), Some((3, vec![vec![2]])));
        assert_eq!(key(&[f32s(3, 0.0), f32s(2, 0.0)]), None);
        let scalar = Tensor { datatype: Datatype::Fp32, shape: vec![], data: Bytes::from(vec![0u8; 4]) };
        assert_eq!(key(&[scalar]), None);
    }
}
