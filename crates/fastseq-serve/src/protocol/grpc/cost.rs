//! What decoding a `ModelInferRequest` will take in memory, read from its wire bytes before
//! it is decoded, so that the memory budget is charged before prost allocates anything. A
//! message's wire form can be far smaller than its decoded form: an empty input is 2 bytes on
//! the wire and a struct of a few hundred bytes once decoded, an element of `bytes_contents`
//! 2 bytes and a 32-byte `Bytes`, an `int64_contents` zero 1 byte and 8. The walk follows
//! the messages' fields (as [`crate::protocol::grpc::messages`] declares them) and bounds each: the decoded
//! struct or element (twice: a `Vec` grows by doubling), the tensor built from typed contents
//! after it, strings and maps by their length. Where the bytes stop being a valid message the
//! walk stops too, as prost's decode does.
use std::mem::size_of;

use bytes::Bytes;

use crate::protocol::grpc::messages::{InferInputTensor, InferParameter, InferRequestedOutputTensor};

/// A map entry's cost beyond its bytes (a HashMap slot, its String and its value).
const MAP_ENTRY: u64 = 160;

enum Value<'a> {
    Varint,
    Fixed,
    Delimited(&'a [u8]),
}

struct Wire<'a> {
    b: &'a [u8],
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for k in 0..10 {
            let (&byte, rest) = self.b.split_first()?;
            self.b = rest;
            v |= u64::from(byte & 0x7f) << (7 * k);
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// The next field: its number and value; None at the end or where the bytes are no message.
    fn field(&mut self) -> Option<(u64, Value<'a>)> {
        if self.b.is_empty() {
            return None;
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => {
                self.varint()?;
                Value::Varint
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if self.b.len() < n {
                    return None;
                }
                self.b = &self.b[n..];
                Value::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                if self.b.len() < n {
                    return None;
                }
                let (v, rest) = self.b.split_at(n);
                self.b = rest;
                Value::Delimited(v)
            }
            _ => return None,
        };
        Some((key >> 3, value))
    }
}

/// The elements of a repeated numeric field's value: one where it came unpacked, as many as
/// the packed bytes hold otherwise (`fixed`: each element's size on the wire, 0 for varints).
fn elements(value: &Value<'_>, fixed: usize) -> u64 {
    match value {
        Value::Delimited(b) if fixed > 0 => (b.len() / fixed) as u64,
        Value::Delimited(b) => b.iter().filter(|&&x| x < 0x80).count() as u64,
        _ => 1,
    }
}

fn delimited_len(value: &Value<'_>) -> u64 {
    match value {
        Value::Delimited(b) => b.len() as u64,
        _ => 0,
    }
}

/// Bytes a map entry or a string takes once decoded.
fn text(value: &Value<'_>, entry: bool) -> u64 {
    delimited_len(value) * 2 + if entry { MAP_ENTRY + size_of::<InferParameter>() as u64 } else { 0 }
}

/// An `InferTensorContents`: each element decoded (twice, for the Vec's growth) and as the
/// tensor built from it (8 bytes a number at most; a string's 4-byte length and its bytes).
fn contents(b: &[u8]) -> u64 {
    let mut w = Wire { b };
    let mut cost = 0u64;
    while let Some((tag, value)) = w.field() {
        let (decoded, fixed) = match tag {
            1 => (1, 0),
            2 | 4 => (4, 0),
            3 | 5 => (8, 0),
            6 => (4, 4),
            7 => (8, 8),
            8 => {
                cost = cost.saturating_add(2 * size_of::<Bytes>() as u64 + 4 + delimited_len(&value));
                continue;
            }
            _ => continue,
        };
        cost = cost.saturating_add(elements(&value, fixed).saturating_mul(2 * decoded + 8));
    }
    cost
}

fn input(b: &[u8]) -> u64 {
    let mut w = Wire { b };
    let mut cost = 2 * size_of::<InferInputTensor>() as u64;
    while let Some((tag, value)) = w.field() {
        cost = cost.saturating_add(match (tag, &value) {
            (1 | 2, v) => text(v, false),
            (3, v) => elements(v, 0) * 16,
            (4, v) => text(v, true),
            (5, Value::Delimited(c)) => contents(c),
            _ => 0,
        });
    }
    cost
}

fn output(b: &[u8]) -> u64 {
    let mut w = Wire { b };
    let mut cost = 2 * size_of::<InferRequestedOutputTensor>() as u64;
    while let Some((tag, value)) = w.field() {
        cost = cost.saturating_add(match tag {
            1 => text(&value, false),
            2 => text(&value, true),
            _ => 0,
        });
    }
    cost
}

/// The bytes decoding the `ModelInferRequest` in `message` takes, at most (its
/// `raw_input_contents` are slices of the message: their bytes are the message's own and are
/// not counted again).
pub fn decoded_cost(message: &[u8]) -> u64 {
    let mut w = Wire { b: message };
    let mut cost = 512u64;
    while let Some((tag, value)) = w.field() {
        cost = cost.saturating_add(match (tag, &value) {
            (1..=3, v) => text(v, false),
            (4, v) => text(v, true),
            (5, Value::Delimited(b)) => input(b),
            (6, Value::Delimited(b)) => output(b),
            (7, _) => 2 * size_of::<Bytes>() as u64,
            _ => 0,
        });
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::super::messages::{InferTensorContents, ModelInferRequest};
    use super::*;
    use prost::Message;

    fn request(inputs: Vec<InferInputTensor>, raw: Vec<Bytes>) -> Vec<u8> {
        ModelInferRequest { model_name: "m".into(), inputs, raw_input_contents: raw, ..Default::default() }
            .encode_to_vec()
    }

    #[test]
    fn what_expands_once_decoded_is_counted_before() {
        // 100,000 empty inputs: 200 KB on the wire, tens of MB decoded.
        let wire = request(vec![InferInputTensor::default(); 100_000], vec![]);
        assert!(wire.len() < 300_000);
        assert!(decoded_cost(&wire) >= 100_000 * size_of::<InferInputTensor>() as u64);
        // 1,000,000 empty strings and int64 zeros: a byte or two each on the wire.
        let strings = InferTensorContents { bytes_contents: vec![Bytes::new(); 1_000_000], ..Default::default() };
        let zeros = InferTensorContents { int64_contents: vec![0; 1_000_000], ..Default::default() };
        for (c, least) in [(strings, 1_000_000 * (size_of::<Bytes>() + 4) as u64), (zeros, 16_000_000)] {
            let wire = request(vec![InferInputTensor { contents: Some(c), ..Default::default() }], vec![]);
            assert!(decoded_cost(&wire) >= least, "{} < {least}", decoded_cost(&wire));
        }
        // raw contents are the message's own bytes: a few bytes each, not their length again
        let wire = request(vec![InferInputTensor::default()], vec![Bytes::from(vec![0u8; 1 << 20])]);
        assert!(decoded_cost(&wire) < 10_000);
    }

    #[test]
    fn the_walk_stops_where_the_message_does() {
        let mut wire = request(vec![InferInputTensor::default(); 1000], vec![]);
        let whole = decoded_cost(&wire);
        wire.truncate(wire.len() / 2);
        wire.push(0xff);
        let cut = decoded_cost(&wire);
        assert!(cut < whole && cut > whole / 3);
        assert_eq!(decoded_cost(&[]), 512);
        assert_eq!(decoded_cost(&[0xff; 64]), 512);
    }
}
