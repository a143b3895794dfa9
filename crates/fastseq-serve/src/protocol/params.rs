//! A request's `parameters`, HTTP's (JSON values) and gRPC's (`InferParameter`) alike, as one
//! kind of value, and the checks both transports make of them: the request's own `timeout`
//! (microseconds, as Triton's clients send it) and sequence batching's, which is not served.
use std::time::Duration;

use crate::protocol::reader::{not_json, Raw};

use crate::error::{client_text, RequestError};

/// One parameter's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Param<'a> {
    Null,
    Bool(bool),
    /// An integer; None where it does not fit an i128 (`10**400`).
    Int(Option<i128>),
    Float(f64),
    Str(std::borrow::Cow<'a, str>),
    /// A list or an object.
    Other,
}

impl Param<'_> {
    /// Python's truth: false, null, zero, "" and empty lists or objects are false.
    pub fn truthy(&self) -> bool {
        match self {
            Param::Null => false,
            Param::Bool(b) => *b,
            Param::Int(v) => *v != Some(0),
            Param::Float(f) => *f != 0.0,
            Param::Str(s) => !s.is_empty(),
            Param::Other => true,
        }
    }
}

/// What kind of JSON value `raw` is, as messages say it (`a list`).
pub fn kind(raw: Raw<'_>) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "a list",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// A JSON value's text as a message shows it: at most 40 characters, one line.
pub fn shown(raw: Raw<'_>) -> String {
    let text = raw.get();
    if text.len() <= 40 && text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return text.to_string();
    }
    client_text(text)
}

/// A JSON value as a parameter (a string that is no text, a lone surrogate, is a 400).
pub fn from_raw(raw: Raw<'_>) -> Result<Param<'_>, RequestError> {
    let text = raw.get();
    Ok(match text.as_bytes().first() {
        Some(b'n') => Param::Null,
        Some(b't') => Param::Bool(true),
        Some(b'f') => Param::Bool(false),
        Some(b'"') => Param::Str(string(raw)?.into()),
        Some(b'[' | b'{') => Param::Other,
        _ if text.contains(['.', 'e', 'E']) => Param::Float(text.parse().unwrap_or(f64::INFINITY)),
        _ => Param::Int(text.parse().ok()),
    })
}

/// A JSON string's text.
pub fn string(raw: Raw<'_>) -> Result<String, RequestError> {
    serde_json::from_str::<String>(raw.get()).map_err(not_json)
}

/// The parameters that only sequence batching reads.
const SEQUENCE: [&str; 3] = ["sequence_id", "sequence_start", "sequence_end"];

/// A request's own timeout from its parameters (`get` gives each by name): a positive
/// integer of microseconds; a 400 for any other, or for sequence batching's parameters
/// set (`shown` writes a value for the message).
pub fn request_timeout<'a>(
    get: impl Fn(&str) -> Option<Param<'a>>,
    shown: impl Fn(&str) -> String,
) -> Result<Option<Duration>, RequestError> {
    for key in SEQUENCE {
        if get(key).is_some_and(|v| v.truthy()) {
            return Err(RequestError::bad(format!(
                "the parameter {key}: sequence batching is not supported by fastseq serve"
            )));
        }
    }
    match get("timeout") {
        None => Ok(None),
        Some(Param::Int(Some(us))) if us > 0 && us <= u64::MAX as i128 => Ok(Some(Duration::from_micros(us as u64))),
        Some(_) => Err(RequestError::bad(format!(
            "the parameter timeout must be a positive integer of microseconds (at most {}), got {}",
            u64::MAX,
            shown("timeout")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Raw<'_> {
        Raw::parse(text).unwrap()
    }

    fn timeout(text: &str) -> Result<Option<Duration>, String> {
        let value = raw(text);
        let param = from_raw(value).map_err(|e| e.message)?;
        request_timeout(|k| (k == "timeout").then(|| param.clone()), |_| shown(value)).map_err(|e| e.message)
    }

    #[test]
    fn timeouts_are_positive_integers_of_microseconds() {
        assert_eq!(timeout("2500").unwrap(), Some(Duration::from_micros(2500)));
        assert_eq!(timeout("18446744073709551615").unwrap(), Some(Duration::from_micros(u64::MAX)));
        for bad in ["0", "-5", "1.5", "true", "\"10\"", "null", "[1]", "18446744073709551616"] {
            assert!(timeout(bad).unwrap_err().contains("positive integer of microseconds"), "{bad}");
        }
        let huge = format!("1{}", "0".repeat(400));
        let m = timeout(&huge).unwrap_err();
        assert!(m.len() < 300 && m.contains("positive integer"), "{m}");
        assert!(timeout("\"\\ud800\"").unwrap_err().contains("not valid JSON"));
    }

    #[test]
    fn sequence_parameters_are_refused_unless_unset() {
        let check = |v: Param<'static>| request_timeout(|k| (k == "sequence_id").then(|| v.clone()), |_| String::new());
        for unset in [Param::Null, Param::Bool(false), Param::Int(Some(0)), Param::Float(0.0), Param::Str("".into())] {
            assert_eq!(check(unset).unwrap(), None);
        }
        assert!(check(Param::Int(Some(4))).unwrap_err().message.contains("sequence batching"));
    }
}
