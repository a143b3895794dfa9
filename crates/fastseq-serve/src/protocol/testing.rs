//! What the protocol's tests share: a model of every datatype, and a seeded random source.
use crate::tensor::{Datatype, ModelSpec, TensorSpec};

/// `in_<datatype>` and `out_<datatype>` of every datatype, each `[-1, 3]`, batched.
pub fn model() -> ModelSpec {
    let tensors = |prefix: &str| {
        Datatype::ALL
            .iter()
            .map(|d| TensorSpec {
                name: format!("{prefix}_{}", d.name().to_lowercase()),
                datatype: *d,
                shape: Some(vec![-1, 3]),
            })
            .collect()
    };
    ModelSpec {
        name: "m".into(),
        version: "1".into(),
        inputs: tensors("in"),
        outputs: tensors("out"),
        max_batch_size: 8,
        max_delay_us: 500,
    }
}

/// Values of every datatype, shape `[1, 3]`: as JSON `data`, and in the binary form.
pub fn every() -> Vec<(Datatype, &'static str, Vec<u8>)> {
    fn le<T: Copy, const N: usize>(values: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| f(v)).collect()
    }
    vec![
        (Datatype::Bool, "[true, false, true]", vec![1, 0, 1]),
        (Datatype::Uint8, "[0, 7, 255]", vec![0, 7, 255]),
        (Datatype::Uint16, "[0, 7, 65535]", le(&[0u16, 7, 65535], u16::to_le_bytes)),
        (Datatype::Uint32, "[0, 7, 4294967295]", le(&[0u32, 7, u32::MAX], u32::to_le_bytes)),
        (Datatype::Uint64, "[0, 7, 18446744073709551615]", le(&[0u64, 7, u64::MAX], u64::to_le_bytes)),
        (Datatype::Int8, "[-128, 0, 127]", le(&[-128i8, 0, 127], i8::to_le_bytes)),
        (Datatype::Int16, "[-32768, 0, 32767]", le(&[i16::MIN, 0, i16::MAX], i16::to_le_bytes)),
        (Datatype::Int32, "[-2147483648, 0, 2147483647]", le(&[i32::MIN, 0, i32::MAX], i32::to_le_bytes)),
        (
            Datatype::Int64,
            "[-9223372036854775808, 0, 9223372036854775807]",
            le(&[i64::MIN, 0, i64::MAX], i64::to_le_bytes),
        ),
        (Datatype::Fp16, "[-1.5, 0.0, 65504.0]", le(&[0xbe00u16, 0, 0x7bff], u16::to_le_bytes)),
        (Datatype::Fp32, "[-1.5, 1e-30, 3.4e38]", le(&[-1.5f32, 1e-30, 3.4e38], f32::to_le_bytes)),
        (Datatype::Fp64, "[-1.5, 1e-300, 1.7e308]", le(&[-1.5f64, 1e-300, 1.7e308], f64::to_le_bytes)),
        (
            Datatype::Bytes,
            r#"["", "caf\u00e9", "a\u0000b"]"#,
            crate::protocol::binary::from_elements([&b""[..], "café".as_bytes(), b"a\0b"]),
        ),
    ]
}

/// An HTTP infer body: `doc` (its inputs each with `data`, or with `binary_data_size` and
/// its bytes among `binary`, in order), and its header length where binary data follows.
pub fn http(doc: serde_json::Value, binary: &[&[u8]]) -> (bytes::Bytes, Option<usize>) {
    let mut body = serde_json::to_vec(&doc).unwrap();
    let header = body.len();
    for b in binary {
        body.extend_from_slice(b);
    }
    (body.into(), (!binary.is_empty()).then_some(header))
}

/// xorshift64*: small, seeded, the same sequence everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}
