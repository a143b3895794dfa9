//! A request's failure: the status it is answered with (HTTP's and gRPC's) and a message in
//! the model's own names; and a client's own text made safe to show, in an answer or a log
//! line (cut short, control characters escaped: one error is one line, whatever was sent).

/// How a failed request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The request is wrong (400, INVALID_ARGUMENT).
    BadRequest,
    /// No such model, version or route (404, NOT_FOUND).
    NotFound,
    /// A route taken with another method (405, UNIMPLEMENTED).
    MethodNotAllowed,
    /// The request did not arrive in time (408, DEADLINE_EXCEEDED).
    RequestTimeout,
    /// The request alone is over a limit (413, RESOURCE_EXHAUSTED).
    PayloadTooLarge,
    /// A body encoding the server does not read (415, UNIMPLEMENTED).
    UnsupportedMediaType,
    /// The request's headers are over their limit (431, RESOURCE_EXHAUSTED).
    HeadersTooLarge,
    /// Not now: not ready, shutting down, full, or not answered within its timeout (503, UNAVAILABLE).
    Unavailable,
    /// The model failed for a reason of its own (500, INTERNAL).
    Internal,
}

impl Status {
    pub fn http(self) -> u16 {
        match self {
            Status::BadRequest => 400,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::PayloadTooLarge => 413,
            Status::UnsupportedMediaType => 415,
            Status::HeadersTooLarge => 431,
            Status::Unavailable => 503,
            Status::Internal => 500,
        }
    }

    /// gRPC's status code.
    pub fn grpc(self) -> u32 {
        match self {
            Status::BadRequest => 3,                                                      // INVALID_ARGUMENT
            Status::NotFound => 5,                                                        // NOT_FOUND
            Status::MethodNotAllowed | Status::UnsupportedMediaType => 12,                // UNIMPLEMENTED
            Status::RequestTimeout => 4,                                                  // DEADLINE_EXCEEDED
            Status::PayloadTooLarge | Status::HeadersTooLarge => 8,                       // RESOURCE_EXHAUSTED
            Status::Unavailable => 14,                                                    // UNAVAILABLE
            Status::Internal => 13,                                                       // INTERNAL
        }
    }

    /// The reason Triton's failure counter gives it: the client's mistake (OTHER), not taken
    /// (REJECTED), or the model's own failure (BACKEND).
    pub fn reason(self) -> &'static str {
        match self {
            Status::Unavailable => "REJECTED",
            Status::Internal => "BACKEND",
            _ => "OTHER",
        }
    }
}

/// A request's failure: its status and a message naming the model's own tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub status: Status,
    pub message: String,
}

impl RequestError {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        RequestError { status, message: message.into() }
    }

    /// A 400: the request is wrong.
    pub fn bad(message: impl Into<String>) -> Self {
        RequestError::new(Status::BadRequest, message)
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RequestError {}

/// The most characters of a client's text that an answer or a log line repeats.
pub const MAX_ECHO: usize = 64;

/// A client's text quoted as a message may show it: `'...'`, at most [`MAX_ECHO`]
/// characters (then `...` and how long it was), control characters and quotes escaped.
pub fn client_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_ECHO * 2) + 2);
    out.push('\'');
    let mut shown = 0;
    for c in s.chars() {
        if shown == MAX_ECHO {
            out.push_str(&format!("...' ({} bytes)", s.len()));
            return out;
        }
        escape_into(&mut out, c);
        shown += 1;
    }
    out.push('\'');
    out
}

/// A client's bytes (a name that may not be UTF-8) as [`client_text`] shows them, bytes that
/// are not UTF-8 as `\xNN`.
pub fn client_bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => client_text(s),
        Err(_) => {
            let shown: String = b.iter().take(MAX_ECHO).map(|&x| escape_byte(x)).collect();
            if b.len() > MAX_ECHO {
                format!("'{shown}...' ({} bytes)", b.len())
            } else {
                format!("'{shown}'")
            }
        }
    }
}

fn escape_byte(x: u8) -> String {
    if x.is_ascii_graphic() && x != b'\'' && x != b'\\' || x == b' ' {
        (x as char).to_string()
    } else {
        format!("\\x{x:02x}")
    }
}

fn escape_into(out: &mut String, c: char) {
    match c {
        '\'' => out.push_str("\\'"),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}') => {
            out.push_str(&format!("\\u{{{:x}}}", c as u32))
        }
        c => out.push(c),
    }
}

/// `s` as one log line: line breaks and other control characters escaped (a message built
/// from [`client_text`] already is; paths and the like are not).
pub fn log_line(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}')) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\'' | '\\' => out.push(c),
            c => escape_into(&mut out, c),
        }
    }
    out
}

/// Seconds as a message says them: `0.5`, `60`, `0.001` (no trailing zeros).
pub fn seconds(d: std::time::Duration) -> String {
    let s = format!("{:.6}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The most characters of a name that a near-miss search looks at: longer names are not
/// typos of a short model or tensor name, and the search costs their length squared.
pub const MAX_NEAR_MISS: usize = 128;

/// ` (did you mean 'x'?)` for `name` among `candidates`, or nothing; names longer than
/// [`MAX_NEAR_MISS`] are not searched.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    if name.len() > MAX_NEAR_MISS {
        return String::new();
    }
    fastseq::did_you_mean(name, candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_text_is_cut_and_escaped() {
        assert_eq!(client_text("x"), "'x'");
        assert_eq!(client_text("a\nb'c\\"), "'a\\nb\\'c\\\\'");
        let long = "y".repeat(10_000);
        let shown = client_text(&long);
        assert!(shown.len() < 100 && shown.ends_with("(10000 bytes)"), "{shown}");
        assert_eq!(client_text("\u{2028}\u{0}"), "'\\u{2028}\\u{0}'");
        assert_eq!(client_bytes(b"a\xffb"), "'a\\xffb'");
        assert!(client_bytes(&[0xff; 500]).ends_with("(500 bytes)"));
    }

    #[test]
    fn log_lines_are_one_line() {
        assert_eq!(log_line("GET /a\nb: 404"), "GET /a\\nb: 404");
        assert_eq!(log_line("plain 'x'"), "plain 'x'");
    }

    #[test]
    fn near_miss_only_for_short_names() {
        assert!(did_you_mean("cnm", ["cnn"]).contains("cnn"));
        assert_eq!(did_you_mean(&"c".repeat(1000), ["cnn"]), "");
    }
}
