//! Triton's binary tensors: an input's raw bytes (HTTP's binary extension, gRPC's
//! `raw_input_contents`) checked against its declared shape and kept as they are, a slice of
//! the body; BYTES elements each a 4-byte little-endian length and that many bytes of UTF-8
//! (ONNX strings are text), every length checked against what is left.
use bytes::Bytes;

use crate::error::RequestError;
use crate::tensor::Datatype;

use crate::protocol::{list, values_word};

/// Input `name`'s binary data (`raw`) as `count` values of `datatype` of `shape`: the same
/// bytes (no copy) once they are known to hold exactly those values.
pub fn checked(name: &str, raw: Bytes, datatype: Datatype, shape: &[usize], count: u64) -> Result<Bytes, RequestError> {
    let Some(size) = datatype.size() else {
        strings(name, &raw, shape, count)?;
        return Ok(raw);
    };
    let expected = count as u128 * size as u128;
    if raw.len() as u128 != expected {
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}, {} of {} ({expected} bytes), but binary_data_size is {}",
            list(shape),
            values_word(count),
            datatype.name(),
            raw.len()
        )));
    }
    // A bool is one byte of 0 or 1: anything else is no bool (and undefined in C++).
    if datatype == Datatype::Bool && raw.iter().any(|&b| b > 1) {
        return Err(RequestError::bad(format!("input '{name}' is BOOL: each of its bytes must be 0 or 1")));
    }
    Ok(raw)
}

/// Checks that `raw` holds exactly `count` BYTES elements of UTF-8.
pub fn strings(name: &str, raw: &[u8], shape: &[usize], count: u64) -> Result<(), RequestError> {
    if count as u128 * 4 > raw.len() as u128 {
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}, {} of BYTES, but only {} bytes of binary data (each element takes 4 \
             bytes of length at least)",
            list(shape),
            values_word(count),
            raw.len()
        )));
    }
    let (mut at, mut found) = (0usize, 0u64);
    while found < count && at + 4 <= raw.len() {
        let n = u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]) as usize;
        at += 4;
        if n > raw.len() - at {
            return Err(RequestError::bad(format!(
                "input '{name}': a BYTES element of {n} bytes runs past its binary data"
            )));
        }
        if let Err(e) = std::str::from_utf8(&raw[at..at + n]) {
            return Err(RequestError::bad(format!(
                "input '{name}': a BYTES element is not UTF-8 text ({e}); ONNX strings are text"
            )));
        }
        at += n;
        found += 1;
    }
    if found != count || at != raw.len() {
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}, {} of BYTES, but its {} bytes of binary data hold {}{}",
            list(shape),
            values_word(count),
            raw.len(),
            found,
            if at != raw.len() { " and more" } else { "" }
        )));
    }
    Ok(())
}

/// BYTES elements (each its bytes) in the binary form.
pub fn from_elements<'a>(elements: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for e in elements {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// The elements of BYTES data in the binary form (which [`strings`] has checked), in order.
pub fn elements(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = data.get(at..at + 4)?;
        let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let e = data.get(at + 4..at + 4 + n)?;
        at += 4 + n;
        Some(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &[u8], d: Datatype, shape: &[usize]) -> Result<Bytes, String> {
        let count = shape.iter().product::<usize>() as u64;
        checked("x", Bytes::copy_from_slice(raw), d, shape, count).map_err(|e| e.message)
    }

    #[test]
    fn every_fixed_datatype_takes_exactly_its_bytes() {
        for d in Datatype::ALL {
            let Some(size) = d.size() else { continue };
            let raw = vec![1u8; size * 6];
            assert_eq!(&check(&raw, d, &[2, 3]).unwrap()[..], &raw[..], "{d:?}");
            let m = check(&raw[1..], d, &[2, 3]).unwrap_err();
            assert!(
                m.contains(&format!("6 values of {} ({} bytes), but binary_data_size is", d.name(), size * 6)),
                "{m}"
            );
        }
        assert!(check(&[], Datatype::Fp32, &[0, 3]).unwrap().is_empty());
        assert!(check(&[2], Datatype::Bool, &[1]).unwrap_err().contains("0 or 1"));
        // a shape lying about its bytes: 10^9 rows with 12 bytes
        let m = checked("x", Bytes::from_static(&[0; 12]), Datatype::Fp32, &[1_000_000_000, 3], 3_000_000_000);
        assert!(m.unwrap_err().message.contains("binary_data_size is 12"));
    }

    #[test]
    fn bytes_elements_are_checked_against_their_lengths() {
        let good = from_elements([&b""[..], "café".as_bytes(), b"a\0b"]);
        assert_eq!(&check(&good, Datatype::Bytes, &[1, 3]).unwrap()[..], &good[..]);
        assert_eq!(elements(&good).collect::<Vec<_>>(), vec![&b""[..], "café".as_bytes(), b"a\0b"]);
        assert!(check(&[0; 8], Datatype::Bytes, &[1, 3]).unwrap_err().contains("only 8 bytes"));
        let past = [&0x8000_0000u32.to_le_bytes()[..], b"abcd"].concat();
        assert!(check(&past, Datatype::Bytes, &[1, 1]).unwrap_err().contains("runs past"));
        let bad = [&4u32.to_le_bytes()[..], b"\xff\xfe\xfd\xfc"].concat();
        assert!(check(&bad, Datatype::Bytes, &[1, 1]).unwrap_err().contains("not UTF-8"));
        let more = from_elements([&b"a"[..], b"b"]);
        assert!(check(&more, Datatype::Bytes, &[1]).unwrap_err().contains("hold 1 and more"));
        let short = [&from_elements([&b"a"[..]])[..], &[0, 0]].concat();
        assert!(check(&short, Datatype::Bytes, &[1]).unwrap_err().contains("hold 1 and more"));
        assert!(check(&[0; 4], Datatype::Bytes, &[0]).unwrap_err().contains("hold 0 and more"));
    }
}
