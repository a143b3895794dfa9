//! Tensor values between JSON and little-endian bytes: a request's `data` read straight from
//! its JSON text (no tree of values: one pass over the text, writing each value as it is
//! read), every value kept exactly in its datatype (an integer in range, a float that does
//! not overflow: 300 is no UINT8, 1e39 no FP32, 1e400 nothing); FP16 rounded to nearest-even
//! here; an answer's values written back as JSON; and the safe widenings (INT32 to INT64)
//! that the pipeline's input rule takes.
use serde_json::ser::{CompactFormatter, Formatter};

use crate::error::RequestError;
use crate::tensor::Datatype;

use crate::protocol::{list, values_word, MAX_DEPTH};

/// One value of a JSON `data` list, as its text.
#[derive(Clone, Copy)]
enum Leaf<'a> {
    Number(&'a str),
    Bool(bool),
    /// A string with its quotes, escapes as written.
    Str(&'a str),
    /// null, an object: never a tensor's value.
    Other,
}

/// Why a value does not belong in its datatype, worst first (Python's order: the count, then
/// the kinds, then the range).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wrong {
    Range,
    Kind,
}

/// Input `name`'s JSON `data` (`raw`: its text, flat or nested as the shape, or one scalar)
/// as `count` values of `datatype` in the tensor's binary form; a 400 for a count other than
/// the shape's, a value of another kind, or one out of the datatype's range.
pub fn from_json(
    name: &str,
    raw: &str,
    datatype: Datatype,
    shape: &[usize],
    count: u64,
) -> Result<Vec<u8>, RequestError> {
    decode(name, raw, datatype, shape, count, true)
}

/// [`from_json`], with (`quick`) or without the one-pass reader of flat float lists.
fn decode(
    name: &str,
    raw: &str,
    datatype: Datatype,
    shape: &[usize],
    count: u64,
    quick: bool,
) -> Result<Vec<u8>, RequestError> {
    let size = datatype.size().unwrap_or(8);
    // Each value takes 2 bytes of text at least (one and a comma): the buffer is bounded by
    // the body, whatever the shape claims.
    let mut out: Vec<u8> = Vec::with_capacity((count.min(raw.len() as u64 / 2 + 1) as usize).saturating_mul(size));
    if quick {
        // A float tensor as clients send it, a flat list of numbers that fit: each number
        // checked and read in one step. Anything else (and any doubt) goes to the scan below,
        // which reads it again from the start and says what is wrong.
        let flat = match datatype {
            Datatype::Fp32 => flat_floats(raw, count, |v| put_f32(v, &mut out)),
            Datatype::Fp64 => flat_floats(raw, count, |v| put_f64(v, &mut out)),
            Datatype::Fp16 => flat_floats(raw, count, |v| put_f16(v, &mut out)),
            _ => None,
        };
        if flat.is_some() {
            return Ok(out);
        }
        out.clear();
    }
    let mut wrong: Option<Wrong> = None;
    let mut note = |w: Wrong| wrong = wrong.max(Some(w));
    let scanned = match datatype {
        Datatype::Bool => scan(raw, count, |leaf| match leaf {
            Leaf::Bool(b) => out.push(b as u8),
            _ => note(Wrong::Kind),
        }),
        Datatype::Bytes => scan(raw, count, |leaf| match leaf {
            Leaf::Str(s) => match unquote(s) {
                Some(text) => {
                    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
                    out.extend_from_slice(text.as_bytes());
                }
                None => note(Wrong::Kind),
            },
            _ => note(Wrong::Kind),
        }),
        // One closure per float datatype: the per-value work stays a parse and a store.
        Datatype::Fp32 => scan(raw, count, |leaf| match float(leaf) {
            Ok(v) if !put_f32(v, &mut out) => note(Wrong::Range),
            Ok(_) => {}
            Err(w) => note(w),
        }),
        Datatype::Fp64 => scan(raw, count, |leaf| match float(leaf) {
            Ok(v) if !put_f64(v, &mut out) => note(Wrong::Range),
            Ok(_) => {}
            Err(w) => note(w),
        }),
        Datatype::Fp16 => scan(raw, count, |leaf| match float(leaf) {
            Ok(v) if !put_f16(v, &mut out) => note(Wrong::Range),
            Ok(_) => {}
            Err(w) => note(w),
        }),
        _ => {
            let (min, max) = int_range(datatype);
            scan(raw, count, |leaf| match leaf {
                Leaf::Number(text) if !text.contains(['.', 'e', 'E']) => match text.parse::<i128>() {
                    Ok(v) if (min..=max).contains(&v) => out.extend_from_slice(&v.to_le_bytes()[..size]),
                    _ => note(Wrong::Range),
                },
                _ => note(Wrong::Kind),
            })
        }
    };
    let (found, nested) = scanned.map_err(|e| e.named(name))?;
    if found != count {
        // Nested data is counted to one past the shape's (as Python's flattening stops).
        let found = if nested { found.min(count + 1) } else { found };
        return Err(RequestError::bad(format!(
            "input '{name}' has shape {}, {}, but its data holds {}",
            list(shape),
            values_word(count),
            values_word(found)
        )));
    }
    let d = datatype.name();
    match wrong {
        None => Ok(out),
        Some(Wrong::Kind) => Err(RequestError::bad(match datatype {
            Datatype::Bytes => format!("input '{name}' is BYTES: its JSON data must be strings"),
            Datatype::Bool => format!("input '{name}' is BOOL: its JSON data must be true or false"),
            Datatype::Fp16 | Datatype::Fp32 | Datatype::Fp64 => {
                format!("input '{name}' is {d}: its JSON data must be numbers")
            }
            _ => format!("input '{name}' is {d}: its JSON data must be integers"),
        })),
        Some(Wrong::Range) => Err(RequestError::bad(match datatype {
            Datatype::Fp16 | Datatype::Fp32 | Datatype::Fp64 => {
                format!("input '{name}' is {d}: a value of its data is past {d}'s range")
            }
            _ => {
                let (min, max) = int_range(datatype);
                format!("input '{name}' is {d}: a value of its data is outside {min}..{max}")
            }
        })),
    }
}

/// `v` stored as FP32, FP64 or FP16 (both readers store through these); false where it is
/// past the datatype's range.
#[inline]
fn put_f32(v: f64, out: &mut Vec<u8>) -> bool {
    let f = v as f32;
    out.extend_from_slice(&f.to_le_bytes());
    f.is_finite()
}

#[inline]
fn put_f64(v: f64, out: &mut Vec<u8>) -> bool {
    out.extend_from_slice(&v.to_le_bytes());
    v.is_finite()
}

#[inline]
fn put_f16(v: f64, out: &mut Vec<u8>) -> bool {
    let h = f64_to_f16(v);
    out.extend_from_slice(&h.to_le_bytes());
    h & 0x7c00 != 0x7c00
}

/// A number's value as float64 (Python's float of it): a finite one, or why not.
fn float(leaf: Leaf<'_>) -> Result<f64, Wrong> {
    match leaf {
        Leaf::Number(text) => text.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or(Wrong::Range),
        _ => Err(Wrong::Kind),
    }
}

/// Reads `raw` where it is a flat list of exactly `count` JSON numbers (space allowed where
/// JSON allows it), handing each one's float64 (Python's float of it) to `each`, which
/// stores it and says whether it fits the datatype; None at the first thing that is not so,
/// having handed some values or none. Each number's text is checked against JSON's grammar
/// and read in one step (lexical's JSON format: no leading zeros, `+`, `.5`, `1.`, `NaN` or
/// `Infinity`), correctly rounded as `str::parse` rounds it.
fn flat_floats(raw: &str, count: u64, mut each: impl FnMut(f64) -> bool) -> Option<()> {
    const JSON: u128 = lexical_core::format::JSON;
    let options = lexical_core::ParseFloatOptions::new();
    let b = raw.as_bytes();
    let mut i = skip_space(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_space(b, i + 1);
    let mut found = 0u64;
    loop {
        if found == count || !matches!(b.get(i), Some(b'-' | b'0'..=b'9')) {
            return None;
        }
        let (v, len) = lexical_core::parse_partial_with_options::<f64, JSON>(&b[i..], &options).ok()?;
        if !each(v) {
            return None;
        }
        found += 1;
        i = skip_space(b, i + len);
        match b.get(i) {
            Some(b',') => i = skip_space(b, i + 1),
            Some(b']') => break,
            _ => return None,
        }
    }
    (found == count && skip_space(b, i + 1) == b.len()).then_some(())
}

/// The index past the JSON number at `i` (RFC 8259's grammar: `-? (0 | [1-9][0-9]*)
/// (. [0-9]+)? ([eE] [+-]? [0-9]+)?`); None where the text there is no number. (Its text is
/// then one that `str::parse` reads, as every JSON number is.)
pub(crate) fn number_end(b: &[u8], i: usize) -> Option<usize> {
    let digits_from = |mut j: usize| {
        // Eight bytes at a time while they are all digits (no byte below b'0', where
        // subtracting b'0' sets its top bit, nor above b'9', where adding 0x46 does), as
        // `str::parse` reads them; then byte by byte.
        while let Some(eight) = b.get(j..j + 8) {
            let v = u64::from_le_bytes(eight.try_into().expect("eight bytes"));
            if (v.wrapping_sub(0x3030_3030_3030_3030) | v.wrapping_add(0x4646_4646_4646_4646)) & 0x8080_8080_8080_8080
                != 0
            {
                break;
            }
            j += 8;
        }
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    let int = i + usize::from(b.get(i) == Some(&b'-'));
    let mut j = digits_from(int);
    if j == int || (b[int] == b'0' && j > int + 1) {
        return None; // no digits, or a leading 0
    }
    if b.get(j) == Some(&b'.') {
        let end = digits_from(j + 1);
        if end == j + 1 {
            return None;
        }
        j = end;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1 + usize::from(matches!(b.get(j + 1), Some(b'-' | b'+')));
        let end = digits_from(j);
        if end == j {
            return None;
        }
        j = end;
    }
    Some(j)
}

/// A JSON string's text (`s` with its quotes); None where it is not text (a lone surrogate).
fn unquote(s: &str) -> Option<std::borrow::Cow<'_, str>> {
    let inner = s.get(1..s.len().saturating_sub(1))?;
    if !inner.contains('\\') {
        return Some(inner.into());
    }
    serde_json::from_str::<String>(s).ok().map(Into::into)
}

/// The smallest and largest integer of an integer datatype.
pub(crate) fn int_range(d: Datatype) -> (i128, i128) {
    match d {
        Datatype::Uint8 => (0, u8::MAX as i128),
        Datatype::Uint16 => (0, u16::MAX as i128),
        Datatype::Uint32 => (0, u32::MAX as i128),
        Datatype::Uint64 => (0, u64::MAX as i128),
        Datatype::Int8 => (i8::MIN as i128, i8::MAX as i128),
        Datatype::Int16 => (i16::MIN as i128, i16::MAX as i128),
        Datatype::Int32 => (i32::MIN as i128, i32::MAX as i128),
        Datatype::Int64 => (i64::MIN as i128, i64::MAX as i128),
        _ => (0, 1),
    }
}

/// The text was not what it must be: a nesting past [`MAX_DEPTH`], or text that is not JSON
/// (which serde_json has refused already, unless the request was read quickly, its `data`
/// left to this scan: the document reader's `read_quick`).
struct Malformed(&'static str);

impl Malformed {
    fn named(self, name: &str) -> RequestError {
        RequestError::bad(format!("the request is not valid JSON: input '{name}''s data {}", self.0))
    }
}

const NOT_JSON: Malformed = Malformed("is not JSON");

/// Calls `each` on the values of `raw` (a JSON value: one scalar, or lists nested to any
/// shape), the first `count` of them; returns how many there are (counted on past `count`)
/// and whether lists were nested. The lists' text is checked as JSON (their commas and
/// brackets, each number's, string's and word's text) as it is read: a value that is read
/// at all is JSON.
fn scan<'a>(raw: &'a str, count: u64, mut each: impl FnMut(Leaf<'a>)) -> Result<(u64, bool), Malformed> {
    let b = raw.as_bytes();
    let mut i = skip_space(b, 0);
    if b.get(i) != Some(&b'[') {
        let (leaf, end) = leaf(raw, i)?;
        if skip_space(b, end) != b.len() {
            return Err(NOT_JSON);
        }
        if count >= 1 {
            each(leaf);
        }
        return Ok((1, false));
    }
    let (mut depth, mut found, mut nested) = (0usize, 0u64, false);
    // After `[` a value or `]` is due, after `,` a value, after a value `,` or `]`.
    let (mut value_due, mut may_close) = (true, true);
    loop {
        i = skip_space(b, i);
        match (b.get(i), value_due) {
            (Some(b'['), true) => {
                depth += 1;
                nested |= depth > 1;
                if depth > MAX_DEPTH {
                    return Err(Malformed("is nested deeper than 128 lists"));
                }
                may_close = true;
                i += 1;
            }
            (Some(b']'), _) if may_close || !value_due => {
                depth -= 1;
                i += 1;
                (value_due, may_close) = (false, false);
                if depth == 0 {
                    break;
                }
            }
            (Some(b','), false) => (value_due, may_close, i) = (true, false, i + 1),
            (Some(_), true) => {
                let (value, end) = leaf(raw, i)?;
                found += 1;
                if found <= count {
                    each(value);
                } else if nested {
                    return Ok((found, nested)); // counted one past the shape's: enough for the message
                }
                (value_due, may_close, i) = (false, false, end);
            }
            _ => return Err(NOT_JSON),
        }
    }
    if skip_space(b, i) != b.len() {
        return Err(NOT_JSON);
    }
    Ok((found, nested))
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// The value starting at `i` and the index past it.
fn leaf(raw: &str, i: usize) -> Result<(Leaf<'_>, usize), Malformed> {
    let b = raw.as_bytes();
    let word = |w: &str, v: Leaf<'static>| {
        if b[i..].starts_with(w.as_bytes()) {
            Ok((v, i + w.len()))
        } else {
            Err(NOT_JSON)
        }
    };
    match b.get(i) {
        Some(b'-' | b'0'..=b'9') => match number_end(b, i) {
            Some(end) => Ok((Leaf::Number(&raw[i..end]), end)),
            None => Err(NOT_JSON),
        },
        Some(b't') => word("true", Leaf::Bool(true)),
        Some(b'f') => word("false", Leaf::Bool(false)),
        Some(b'n') => word("null", Leaf::Other),
        Some(b'"') => {
            // Its escapes are checked where it is read ([`unquote`]); a control character
            // may not be in it at all.
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    Some(b'"') => return Ok((Leaf::Str(&raw[i..=j]), j + 1)),
                    Some(b'\\') => j += 2,
                    Some(&c) if c >= 0x20 => j += 1,
                    _ => return Err(NOT_JSON),
                }
            }
        }
        Some(b'{') => {
            // An object among the values (never a tensor's value): skipped whole (strings
            // minded), counted as one.
            let (mut depth, mut j, mut in_str) = (0usize, i, false);
            while j < b.len() {
                match (in_str, b[j]) {
                    (true, b'\\') => j += 1,
                    (true, b'"') | (false, b'"') => in_str = !in_str,
                    (false, b'{' | b'[') => depth += 1,
                    (false, b'}' | b']') => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok((Leaf::Other, j + 1));
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err(NOT_JSON)
        }
        _ => Err(NOT_JSON),
    }
}

/// `x` as the nearest FP16 (ties to even), overflowing to infinity.
pub fn f64_to_f16(x: f64) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 48) & 0x8000) as u16;
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let man = bits & ((1 << 52) - 1);
    if exp == 0x7ff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 1023 + 15; // FP16's biased exponent
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let round = |q: u64, rem: u64, half: u64| q + u64::from(rem > half || (rem == half && q & 1 == 1));
    if e <= 0 {
        if e < -10 {
            return sign; // below half the smallest subnormal
        }
        let m = man | (1 << 52);
        let shift = (43 - e) as u32; // to units of 2^-24
        let q = round(m >> shift, m & ((1 << shift) - 1), 1 << (shift - 1));
        return sign | q as u16;
    }
    let h = round(((e as u64) << 10) | (man >> 42), man & ((1 << 42) - 1), 1 << 41);
    sign | h as u16
}

/// An FP16's value, exactly.
pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1f);
    let m = f64::from(h & 0x3ff);
    match e {
        0 => sign * m * (2f64).powi(-24),
        0x1f if m == 0.0 => sign * f64::INFINITY,
        0x1f => f64::NAN,
        _ => sign * (1.0 + m / 1024.0) * (2f64).powi(e - 15),
    }
}

/// Whether every value of `from` converts to `to` exactly (numpy's safe casts, which the
/// pipeline's input rule takes: int32 to int64, float16 to float32, bool to a number, and,
/// as numpy counts it, int64 and uint64 to float64).
pub fn widens(from: Datatype, to: Datatype) -> bool {
    use Datatype::*;
    if from == to {
        return true;
    }
    let bits = |d: Datatype| d.size().unwrap_or(0) * 8;
    match (from, to) {
        (_, Bytes | Bool) | (Bytes, _) => false,
        (Bool, _) => true,
        (Uint8 | Uint16 | Uint32 | Uint64, Uint8 | Uint16 | Uint32 | Uint64) => bits(to) > bits(from),
        (Uint8 | Uint16 | Uint32, Int16 | Int32 | Int64) | (Int8 | Int16 | Int32, Int16 | Int32 | Int64) => {
            bits(to) > bits(from)
        }
        (Uint8 | Int8, Fp16 | Fp32 | Fp64) | (Uint16 | Int16, Fp32 | Fp64) => true,
        (Uint32 | Int32 | Uint64 | Int64, Fp64) => true,
        (Fp16, Fp32 | Fp64) | (Fp32, Fp64) => true,
        _ => false,
    }
}

enum Num {
    Int(i128),
    Float(f64),
}

fn read(d: Datatype, c: &[u8]) -> Num {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&c[..n]);
        x
    };
    match d {
        Datatype::Bool => Num::Int(i128::from(c[0] != 0)),
        Datatype::Uint8 => Num::Int(c[0].into()),
        Datatype::Uint16 => Num::Int(u16::from_le_bytes([c[0], c[1]]).into()),
        Datatype::Uint32 => Num::Int(u32::from_le_bytes([c[0], c[1], c[2], c[3]]).into()),
        Datatype::Uint64 => Num::Int(u64::from_le_bytes(a(8)).into()),
        Datatype::Int8 => Num::Int((c[0] as i8).into()),
        Datatype::Int16 => Num::Int(i16::from_le_bytes([c[0], c[1]]).into()),
        Datatype::Int32 => Num::Int(i32::from_le_bytes([c[0], c[1], c[2], c[3]]).into()),
        Datatype::Int64 => Num::Int(i64::from_le_bytes(a(8)).into()),
        Datatype::Fp16 => Num::Float(f16_to_f64(u16::from_le_bytes([c[0], c[1]]))),
        Datatype::Fp32 => Num::Float(f32::from_le_bytes([c[0], c[1], c[2], c[3]]).into()),
        Datatype::Fp64 | Datatype::Bytes => Num::Float(f64::from_le_bytes(a(8))),
    }
}

/// `data` (values of `from`) as values of `to`, where [`widens`] says so.
pub fn widen(from: Datatype, to: Datatype, data: &[u8]) -> bytes::Bytes {
    let (Some(fs), Some(ts)) = (from.size(), to.size()) else { return bytes::Bytes::copy_from_slice(data) };
    let mut out = Vec::with_capacity(data.len() / fs * ts);
    for c in data.chunks_exact(fs) {
        let v = read(from, c);
        match (to, v) {
            (Datatype::Fp16, Num::Int(i)) => out.extend_from_slice(&f64_to_f16(i as f64).to_le_bytes()),
            (Datatype::Fp16, Num::Float(f)) => out.extend_from_slice(&f64_to_f16(f).to_le_bytes()),
            (Datatype::Fp32, Num::Int(i)) => out.extend_from_slice(&(i as f32).to_le_bytes()),
            (Datatype::Fp32, Num::Float(f)) => out.extend_from_slice(&(f as f32).to_le_bytes()),
            (Datatype::Fp64, Num::Int(i)) => out.extend_from_slice(&(i as f64).to_le_bytes()),
            (Datatype::Fp64, Num::Float(f)) => out.extend_from_slice(&f.to_le_bytes()),
            (_, Num::Int(i)) => out.extend_from_slice(&i.to_le_bytes()[..ts]),
            (_, Num::Float(f)) => out.extend_from_slice(&(f as i128).to_le_bytes()[..ts]),
        }
    }
    out.into()
}

/// Why an output's values cannot be written as JSON.
#[derive(Debug, PartialEq, Eq)]
pub enum Unwritable {
    /// NaN or an infinity: JSON has no such number.
    NonFinite,
    /// A BYTES element that is not UTF-8 text.
    NotText,
    /// Bytes that do not hold the shape's values (the engine's fault).
    Malformed,
}

/// `count` values of `datatype` (`data`, their binary form) appended to `out` as a JSON list.
pub fn write_json(datatype: Datatype, data: &[u8], count: usize, out: &mut Vec<u8>) -> Result<(), Unwritable> {
    let mut f = CompactFormatter;
    out.push(b'[');
    if datatype == Datatype::Bytes {
        let mut at = 0;
        for k in 0..count {
            let len = data.get(at..at + 4).ok_or(Unwritable::Malformed)?;
            let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let bytes = data.get(at + 4..at + 4 + n).ok_or(Unwritable::Malformed)?;
            let text = std::str::from_utf8(bytes).map_err(|_| Unwritable::NotText)?;
            if k > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut *out, text).map_err(|_| Unwritable::Malformed)?;
            at += 4 + n;
        }
        if at != data.len() {
            return Err(Unwritable::Malformed);
        }
        out.push(b']');
        return Ok(());
    }
    let size = datatype.size().unwrap_or(1);
    if data.len() != count.saturating_mul(size) {
        return Err(Unwritable::Malformed);
    }
    out.reserve(count * 4);
    for (k, c) in data.chunks_exact(size).enumerate() {
        if k > 0 {
            out.push(b',');
        }
        let written = match (datatype, read(datatype, c)) {
            (Datatype::Bool, Num::Int(i)) => f.write_bool(out, i != 0),
            (_, Num::Int(i)) => match i64::try_from(i) {
                Ok(v) => f.write_i64(out, v),
                Err(_) => f.write_u64(out, i as u64),
            },
            (_, Num::Float(v)) if !v.is_finite() => return Err(Unwritable::NonFinite),
            // FP16 and FP32 values written as the float64 they are exactly (as Python's
            // json writes numpy's tolist()): a reader parsing float64 gets the value back.
            (_, Num::Float(v)) => f.write_f64(out, v),
        };
        written.map_err(|_| Unwritable::Malformed)?;
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::Rng;

    fn json(raw: &str, d: Datatype, shape: &[usize]) -> Result<Vec<u8>, String> {
        let count = shape.iter().product::<usize>() as u64;
        from_json("x", raw, d, shape, count).map_err(|e| e.message)
    }

    fn back(d: Datatype, data: &[u8], count: usize) -> String {
        let mut out = Vec::new();
        write_json(d, data, count, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_datatype_from_json_and_back() {
        let cases: &[(Datatype, &str, &str)] = &[
            (Datatype::Bool, "[true, false, true]", "[true,false,true]"),
            (Datatype::Uint8, "[0, 7, 255]", "[0,7,255]"),
            (Datatype::Uint16, "[0, 7, 65535]", "[0,7,65535]"),
            (Datatype::Uint32, "[0, 7, 4294967295]", "[0,7,4294967295]"),
            (Datatype::Uint64, "[0, 7, 18446744073709551615]", "[0,7,18446744073709551615]"),
            (Datatype::Int8, "[-128, 0, 127]", "[-128,0,127]"),
            (Datatype::Int16, "[-32768, -0, 32767]", "[-32768,0,32767]"),
            (Datatype::Int32, "[-2147483648, 0, 2147483647]", "[-2147483648,0,2147483647]"),
            (
                Datatype::Int64,
                "[-9223372036854775808, 0, 9223372036854775807]",
                "[-9223372036854775808,0,9223372036854775807]",
            ),
            (Datatype::Fp16, "[-1.5, 0.25, 65504]", "[-1.5,0.25,65504.0]"),
            (Datatype::Fp32, "[-1.5, 1, 3e38]", "[-1.5,1.0,3.0000000054977558e+38]"),
            (Datatype::Fp64, "[-1.5, 1e-300, 1.7e308]", "[-1.5,1e-300,1.7e+308]"),
            (Datatype::Bytes, r#"["", "caf\u00e9", "a\"b"]"#, r#"["","café","a\"b"]"#),
        ];
        for &(d, raw, want) in cases {
            let data = json(raw, d, &[1, 3]).unwrap_or_else(|e| panic!("{d:?}: {e}"));
            assert_eq!(back(d, &data, 3), want, "{d:?}");
        }
        // nested as the shape, or a scalar for one value
        assert_eq!(json("[[1, 2], [3, 4]]", Datatype::Int8, &[2, 2]).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(json("5", Datatype::Int8, &[1]).unwrap(), vec![5]);
        assert_eq!(json("[]", Datatype::Fp32, &[0, 3]).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn values_keep_their_meaning_or_are_refused() {
        let e = |raw: &str, d: Datatype| json(raw, d, &[3]).unwrap_err();
        assert!(e("[300, 0, 0]", Datatype::Uint8).contains("outside 0..255"));
        assert!(e("[-1, 0, 0]", Datatype::Uint64).contains("outside 0..18446744073709551615"));
        assert!(e("[1.5, 0, 0]", Datatype::Int32).contains("must be integers"));
        assert!(e("[1e2, 0, 0]", Datatype::Int32).contains("must be integers"));
        assert!(e(&format!("[1{}, 0, 0]", "0".repeat(400)), Datatype::Int64).contains("outside"));
        assert!(e("[1e39, 0, 0]", Datatype::Fp32).contains("past FP32's range"));
        assert!(e("[1e400, 0, 0]", Datatype::Fp64).contains("past FP64's range"));
        assert!(e(&format!("[1{}, 0, 0]", "0".repeat(400)), Datatype::Fp64).contains("past FP64's range"));
        assert!(e("[65520, 0, 0]", Datatype::Fp16).contains("past FP16's range"));
        assert!(json("[65519, 0, 0]", Datatype::Fp16, &[3]).is_ok());
        assert!(e("[\"a\", 0, 0]", Datatype::Fp32).contains("must be numbers"));
        assert!(e("[1, 0, 1]", Datatype::Bool).contains("must be true or false"));
        assert!(e("[1, 2, 3]", Datatype::Bytes).contains("must be strings"));
        assert!(e("[null, {\"a\": [1]}, 3]", Datatype::Fp32).contains("must be numbers"));
        assert!(e(r#"["\ud800", "a", "b"]"#, Datatype::Bytes).contains("must be strings"));
        // the count first, then kinds, then ranges (Python's order)
        assert!(e("[300, 1.5]", Datatype::Uint8).contains("holds 2 values"));
        assert!(e("[300, 1.5, 0]", Datatype::Uint8).contains("must be integers"));
        assert!(json("[[1, 2], [3]]", Datatype::Fp32, &[2, 2]).unwrap_err().contains("holds 3 values"));
        let m = json("[[1, 2], [3, [4, [5, [6]]]]]", Datatype::Fp32, &[2, 2]).unwrap_err();
        assert!(m.contains("its data holds 5 values"), "{m}");
        assert!(json("[1, 2, 3, 4, 5, 6, 7]", Datatype::Fp32, &[3]).unwrap_err().contains("holds 7 values"));
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(json(&deep, Datatype::Fp32, &[1]).unwrap_err().contains("nested deeper than 128"));
        // a shape of 10^9 values with one value of data: nothing sized by the shape
        let m = from_json("x", "[1.0]", Datatype::Fp64, &[1_000_000_000], 1_000_000_000).unwrap_err().message;
        assert!(m.contains("1000000000 values, but its data holds 1 value"), "{m}");
    }

    #[test]
    fn numbers_are_json_numbers_read_exactly() {
        // the grammar: what serde_json takes as one number, and nothing else
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next();
        let mut tokens: Vec<String> = [
            "0",
            "-0",
            "01",
            "-01",
            "00",
            "1.",
            ".5",
            "-.5",
            "1.e5",
            "1e",
            "1e+",
            "1E-",
            "+1",
            "--1",
            "-",
            "0x10",
            "1_0",
            "Infinity",
            "-Infinity",
            "NaN",
            "-nan",
            "1.5.3",
            "1e5e5",
            "0.0",
            "1e05",
            "1E+05",
            "-0.0e-0",
        ]
        .map(String::from)
        .to_vec();
        for _ in 0..20_000 {
            let n = 1 + next() as usize % 8;
            tokens.push((0..n).map(|_| b"0123456789-+.eE"[next() as usize % 15] as char).collect());
        }
        for t in &tokens {
            let serde = serde_json::from_str::<&serde_json::value::RawValue>(t).is_ok();
            assert_eq!(number_end(t.as_bytes(), 0) == Some(t.len()), serde, "{t}");
            // the one-pass reader of flat lists takes the same numbers, and reads them as
            // str::parse does
            let mut read = None;
            let flat = flat_floats(&format!("[{t}]"), 1, |v| read.replace(v).is_none()).is_some();
            assert_eq!(flat, serde, "{t}");
            assert_eq!(
                read.filter(|_| flat).map(f64::to_bits),
                serde.then(|| t.parse::<f64>().unwrap().to_bits()),
                "{t}"
            );
        }
        // the values: str::parse's float64 (as float32: its float64, rounded), through the scan
        let mut texts: Vec<String> = [
            "0",
            "-0",
            "-0.0",
            "1e-46",
            "-1e-46",
            "1.4e-45",
            "7e-46",
            "7.1e-46",
            "1.1754942e-38",
            "1.17549435e-38",
            "3.4028235e38",
            "3.4028235677973366e38",
            "3.4028234663852886e+38",
            "2.2250738585072014e-308",
            "4.9e-324",
            "1.7976931348623157e308",
            "0.1",
            "0.30000000000000004",
            "9007199254740993",
            "123456789012345678901234567890",
            "1e22",
            "1e23",
            "8.589973e9",
            "0.000001",
            "1E-7",
        ]
        .map(String::from)
        .to_vec();
        for _ in 0..20_000 {
            let bits = next();
            let (f32_value, f64_value) = (f32::from_bits(bits as u32), f64::from_bits(bits));
            for v in [f64::from(f32_value), f64_value].into_iter().filter(|v| v.is_finite()) {
                texts.push(format!("{v:?}"));
                texts.push(format!("{v:e}"));
            }
            let digits: String = (0..1 + next() % 25).map(|_| char::from(b'0' + (next() % 10) as u8)).collect();
            let digits = Some(digits.trim_start_matches('0')).filter(|d| d.len() > 1).unwrap_or("10");
            let e = (next() % 700) as i64 - 350;
            texts.push(format!("{}.{}e{e}", &digits[..1], &digits[1..]));
        }
        for t in &texts {
            let want = t.parse::<f64>().unwrap();
            if (want as f32).is_finite() {
                let got = from_json("x", &format!("[{t}]"), Datatype::Fp32, &[1], 1).unwrap();
                assert_eq!(got, (want as f32).to_le_bytes(), "{t}");
            }
            let got = from_json("x", &format!("[ {t} ]"), Datatype::Fp64, &[1], 1);
            assert_eq!(got.ok(), want.is_finite().then(|| want.to_le_bytes().to_vec()), "{t}");
        }
    }

    #[test]
    fn flat_float_lists_read_in_one_pass_as_the_scan_reads_them() {
        // Whatever the text, the quick reader gives what the scan gives: the same bytes, or
        // it leaves the text to the scan, which says what is wrong.
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next();
        let mut texts: Vec<String> = [
            "[1,2]",
            " [ 1 , 2 ] ",
            "\t[\n1,\r2]\n",
            "[1,2,3]",
            "[1]",
            "[]",
            "[[1,2]]",
            "[1,[2]]",
            "[1,,2]",
            "[1,2,]",
            "[,1,2]",
            "[1 2]",
            "[1,2]x",
            "[1,2] ,",
            "[1,2",
            "[01,2]",
            "[1.,2]",
            "[1,true]",
            "[1,null]",
            "[1,\"2\"]",
            "[1e39,0]",
            "[1e309,0]",
            "[65520,0]",
            "[65519,0]",
            "[-3.4028235e38,1e-46]",
            "[0.30000000000000004,-0]",
            "7",
            "[1,{}]",
            "[-,1]",
            "[1,2]]",
            "[1e5,1E+5]",
        ]
        .map(String::from)
        .to_vec();
        let parts = ["1", "-0.5", "2.5e-3", "1e39", "1e400", ",", ", ", "[", "]", " ", "0.1", "01", "true", "x"];
        for _ in 0..20_000 {
            let n = next() as usize % 7;
            let inner: String = (0..n).map(|_| parts[next() as usize % parts.len()]).collect();
            texts.push(format!("[{inner}]"));
            let numbers: Vec<String> =
                (0..1 + next() % 4).map(|_| format!("{:?}", f64::from_bits(next()) / 7.0)).collect();
            texts.push(format!("[{}]", numbers.join(",")));
        }
        for t in &texts {
            for d in [Datatype::Fp16, Datatype::Fp32, Datatype::Fp64] {
                for count in [0u64, 1, 2, 3] {
                    let shape = [count as usize];
                    let quick = decode("x", t, d, &shape, count, true).map_err(|e| e.message);
                    let scan = decode("x", t, d, &shape, count, false).map_err(|e| e.message);
                    assert_eq!(quick, scan, "{t} {d:?} {count}");
                }
            }
        }
    }

    #[test]
    fn data_is_checked_as_json_as_it_is_read() {
        for bad in [
            "[1,,2]",
            "[,1]",
            "[1,]",
            "[1 2]",
            "[1][2]",
            "[[1],2,]",
            "[1,2",
            "[01]",
            "[1.]",
            "[tru]",
            "[truex]",
            "[\"a\u{1}\"]",
            "[-]",
            "[1]x",
            "x",
            "[NaN]",
            "[-Infinity]",
            "[1e]",
            "[\"a]",
        ] {
            for d in [Datatype::Fp32, Datatype::Int32, Datatype::Bool, Datatype::Bytes] {
                assert!(json(bad, d, &[2]).is_err(), "{bad} {d:?}");
            }
        }
        assert!(json(" [ 1 , [ ] , 2 ] ", Datatype::Fp32, &[2]).is_ok());
        assert!(json("\t[\n1,\r2]\n", Datatype::Int8, &[2]).is_ok());
        assert!(json("[\"a\\\"]\", \"\"]", Datatype::Bytes, &[2]).is_ok());
    }

    #[test]
    fn fp16_rounds_to_nearest_even() {
        for (x, h) in [
            (0.0, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65519.99, 0x7bff),
            (65520.0, 0x7c00),
            (5.960464477539063e-8, 0x0001),  // the smallest subnormal
            (2.9802322387695312e-8, 0x0000), // half of it: ties to even (0)
            (2.980232238769532e-8, 0x0001),
            (6.103515625e-5, 0x0400),     // the smallest normal
            (1.0 + 1.0 / 2048.0, 0x3c00), // a tie: to even
            (1.0 + 3.0 / 2048.0, 0x3c02),
            (0.1, 0x2e66),
            (1e-10, 0x0000),
            (f64::INFINITY, 0x7c00),
        ] {
            assert_eq!(f64_to_f16(x), h, "{x}");
        }
        for h in 0..0x7c00u16 {
            assert_eq!(f64_to_f16(f16_to_f64(h)), h);
            assert_eq!(f64_to_f16(-f16_to_f64(h)), h | 0x8000);
        }
        assert!(f16_to_f64(0x7e00).is_nan());
    }

    #[test]
    fn widenings_are_numpy_safe_casts() {
        use Datatype::*;
        assert!(widens(Int32, Int64) && widens(Fp16, Fp32) && widens(Bool, Fp32) && widens(Uint8, Int16));
        assert!(widens(Int64, Fp64) && widens(Uint8, Fp16) && widens(Int8, Fp16));
        assert!(!widens(Int64, Int32) && !widens(Fp64, Fp32) && !widens(Uint64, Int64) && !widens(Int32, Fp32));
        assert!(!widens(Int16, Fp16) && !widens(Int8, Uint8) && !widens(Fp32, Bytes) && !widens(Int8, Bool));
        let w = widen(Int8, Fp16, &[0xff, 2]);
        assert_eq!(&w[..], [f64_to_f16(-1.0).to_le_bytes(), f64_to_f16(2.0).to_le_bytes()].concat());
        assert_eq!(&widen(Uint16, Int32, &[0xff, 0xff])[..], 65535i32.to_le_bytes());
        assert_eq!(&widen(Bool, Fp64, &[1])[..], 1f64.to_le_bytes());
    }

    #[test]
    fn what_json_cannot_carry_is_said() {
        let mut out = Vec::new();
        assert_eq!(write_json(Datatype::Fp32, &f32::NAN.to_le_bytes(), 1, &mut out), Err(Unwritable::NonFinite));
        assert_eq!(write_json(Datatype::Fp16, &0x7c00u16.to_le_bytes(), 1, &mut out), Err(Unwritable::NonFinite));
        assert_eq!(write_json(Datatype::Bytes, &[1, 0, 0, 0, 0xff], 1, &mut out), Err(Unwritable::NotText));
        assert_eq!(write_json(Datatype::Bytes, &[9, 0, 0, 0, 0xff], 1, &mut out), Err(Unwritable::Malformed));
        assert_eq!(write_json(Datatype::Fp32, &[0; 5], 1, &mut out), Err(Unwritable::Malformed));
        assert_eq!(back(Datatype::Fp32, &[], 0), "[]");
        assert_eq!(back(Datatype::Bytes, b"\x02\0\0\0\n\x00", 1), "[\"\\n\\u0000\"]");
    }
}
