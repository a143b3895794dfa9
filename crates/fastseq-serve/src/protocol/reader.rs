//! An HTTP request's JSON read in one pass, as far as the decode needs it: the top-level
//! object's members, its `inputs` list's objects' members, every value unread (a borrowed
//! slice of the text, checked to be JSON). A tensor's `data` is read once more, by
//! [`crate::protocol::values::from_json`], and nothing else is; a tree of values is never built.
//!
//! Two readers give the same [`Document`]: serde_json's ([`Document::read`]), which takes any
//! JSON and says what is wrong with the rest, and a quick one ([`Document::read_quick`]) for
//! the requests that clients send, which leaves each input's `data` list unchecked for
//! `from_json` to check as it reads it, so that a tensor's values are read once, not twice.
use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::RequestError;

use crate::protocol::MAX_DEPTH;

/// The answer to JSON that serde_json refuses: its message, cut short.
pub fn not_json(e: serde_json::Error) -> RequestError {
    let mut message = format!("the request is not valid JSON: {e}");
    if message.len() > 300 {
        let cut = (0..=300).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
        message.truncate(cut);
    }
    RequestError::bad(message)
}

/// The most members of one object, or items of one list, that the decode keeps (each costs
/// more than its text: without a bound, a body of `{"a":0,"b":0,...}` would take ten times
/// its size). No request needs nearly as many.
pub const MAX_MEMBERS: usize = 65_536;

fn too_many<E: de::Error>() -> E {
    E::custom(format_args!("more than {MAX_MEMBERS} members or items in one object or list"))
}

/// One JSON value's text (no space around it), checked to be JSON by the reader that found
/// it (a `data` list of [`Document::read_quick`]'s: as `from_json` reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// The value's text.
    pub fn get(self) -> &'a str {
        self.0
    }

    /// `text` as one JSON value (checked by serde_json).
    pub fn parse(text: &'a str) -> Result<Self, RequestError> {
        serde_json::from_str::<&RawValue>(text).map(Raw::from).map_err(not_json)
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Raw(raw.get())
    }
}

/// A JSON object's members, their values unread (the last of a name wins, as Python's json
/// reads), in the order given. A list, not a map: objects of the protocol have a handful of
/// members, and a map cost a hash (and a String) per member of every request; the few lookups
/// a decode makes each scan it once, so a hostile object of [`MAX_MEMBERS`] members costs
/// a few scans of it, not a quadratic.
#[derive(Default)]
pub struct Fields<'a>(Vec<(Cow<'a, str>, Raw<'a>)>);

impl<'a> Fields<'a> {
    /// The members of `raw`, an object.
    pub fn parse(raw: Raw<'a>) -> Result<Self, RequestError> {
        match serde_json::from_str::<Shaped<Fields<'a>>>(raw.get()).map_err(not_json)? {
            Shaped::Is(fields) => Ok(fields),
            Shaped::Null => Err(RequestError::bad("a JSON object was due, got null")),
            Shaped::Not(kind) => Err(RequestError::bad(format!("a JSON object was due, got {kind}"))),
        }
    }

    /// The member `key` (its last value), null included.
    pub fn get(&self, key: &str) -> Option<Raw<'a>> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The member `key` (its last value), taken out with every value of that name, null
    /// included.
    pub fn remove(&mut self, key: &str) -> Option<Raw<'a>> {
        let found = self.get(key);
        if found.is_some() {
            self.0.retain(|(k, _)| k != key);
        }
        found
    }

    /// The member `key`, taken out (null counts as absent, as Python's `dict.get` reads it
    /// where it matters: `"id": null`, `"parameters": null`, `"binary_data_size": null`).
    pub fn take(&mut self, key: &str) -> Option<Raw<'a>> {
        self.remove(key).filter(|v| v.get() != "null")
    }

    /// Whether the member `key` is there at all (null included).
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    fn push<E: de::Error>(&mut self, key: Cow<'a, str>, value: &'a RawValue) -> Result<(), E> {
        self.0.push((key, value.into()));
        if self.0.len() > MAX_MEMBERS {
            return Err(too_many());
        }
        Ok(())
    }

    /// The members that are none of `known` (which the decode reads, each by its kind):
    /// nested no deeper than the rest of the document may be, checked at once (before any
    /// other error, as a JSON parser would find them).
    pub fn known(self, known: &[&str]) -> Result<Self, RequestError> {
        for (k, v) in &self.0 {
            if !known.contains(&k.as_ref()) && too_deep(v.get()) {
                return Err(RequestError::bad(format!(
                    "the request is not valid JSON: nested deeper than {MAX_DEPTH}"
                )));
            }
        }
        Ok(self)
    }
}

/// Whether JSON text nests lists and objects deeper than [`MAX_DEPTH`] (serde_json skips
/// values it does not read without a limit; this is the limit for those).
pub fn too_deep(text: &str) -> bool {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for &b in text.as_bytes() {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A value that must be of one shape, or what kind it was instead.
pub enum Shaped<T> {
    Is(T),
    Null,
    Not(&'static str),
}

/// A request's `inputs`: a list of objects, each read as its members.
pub type Inputs<'a> = Shaped<Vec<Shaped<Fields<'a>>>>;

/// The request's top-level object: its members, and its `inputs`.
pub struct Document<'a> {
    pub fields: Fields<'a>,
    pub inputs: Inputs<'a>,
}

impl<'a> Document<'a> {
    /// The request in `text` (which starts with `{`).
    pub fn read(text: &'a str) -> Result<Self, RequestError> {
        serde_json::from_str(text).map_err(not_json)
    }

    /// The request in `text` read quickly, where it is written as clients write it: an object,
    /// its `inputs` a list of objects, no escapes in names or strings, no control characters
    /// in strings, lists and objects nested [`QUICK_DEPTH`] deep at most, no `data` twice in
    /// an input. Each input's `data` list is taken as far as its brackets close (strings
    /// minded) and left unchecked: [`crate::protocol::values::from_json`] checks it as it reads
    /// it, so that a decode that has read every input's data has read JSON. Every other value
    /// is checked as JSON. None for any other text, JSON or not: [`Document::read`] reads it,
    /// and says what is wrong.
    pub fn read_quick(text: &'a str) -> Option<Self> {
        let mut q = Quick { text, at: 0 };
        let (mut fields, mut inputs) = (Fields::default(), None);
        q.object(|q, key| {
            if key == "inputs" && inputs.is_none() {
                inputs = Some(q.inputs()?);
                return Some(());
            }
            fields.quick_push(key, q.value(1)?)
        })?;
        q.space();
        let inputs = inputs.map_or(Shaped::Null, Shaped::Is);
        (q.at == text.len()).then_some(Document { fields, inputs })
    }
}

/// The deepest that [`Document::read_quick`] reads (the top-level object counted): deeper
/// text is left to serde_json.
pub const QUICK_DEPTH: usize = 64;

impl<'a> Fields<'a> {
    fn quick_push(&mut self, key: &'a str, value: Raw<'a>) -> Option<()> {
        (self.0.len() < MAX_MEMBERS).then(|| self.0.push((Cow::Borrowed(key), value)))
    }
}

/// [`Document::read_quick`]'s reader: where it is in `text`. Each method reads one thing
/// after any space, or gives None.
struct Quick<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Quick<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn space(&mut self) {
        while matches!(self.bytes().get(self.at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    /// The byte `c`.
    fn eat(&mut self, c: u8) -> Option<()> {
        self.space();
        (self.bytes().get(self.at) == Some(&c)).then(|| self.at += 1)
    }

    /// An object, `each` reading the value of each member (its name given).
    fn object(&mut self, mut each: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            each(self, key)?;
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// A list, `each` reading each item.
    fn list(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            each(self)?;
            if self.eat(b',').is_none() {
                return self.eat(b']');
            }
        }
    }

    /// A string without escapes or control characters: its text, without the quotes.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let b = self.bytes();
        let len = b[self.at..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        let (start, end) = (self.at, self.at + len);
        (b[end] == b'"').then(|| {
            self.at = end + 1;
            &self.text[start..end]
        })
    }

    /// One JSON value inside `depth` lists and objects.
    fn value(&mut self, depth: usize) -> Option<Raw<'a>> {
        self.space();
        let (b, start) = (self.bytes(), self.at);
        match b.get(start)? {
            b'{' if depth < QUICK_DEPTH => self.object(|q, _| q.value(depth + 1).map(drop))?,
            b'[' if depth < QUICK_DEPTH => self.list(|q| q.value(depth + 1).map(drop))?,
            b'"' => self.string().map(drop)?,
            b't' | b'f' | b'n' => {
                let word = ["true", "false", "null"].into_iter().find(|w| b[start..].starts_with(w.as_bytes()))?;
                self.at += word.len();
            }
            _ => self.at = crate::protocol::values::number_end(b, start)?,
        }
        Some(Raw(&self.text[start..self.at]))
    }

    /// The request's `inputs`: a list of objects.
    fn inputs(&mut self) -> Option<Vec<Shaped<Fields<'a>>>> {
        let mut items = Vec::new();
        self.list(|q| {
            let (mut fields, mut data) = (Fields::default(), false);
            q.object(|q, key| {
                let value = if key != "data" {
                    q.value(3)?
                } else if std::mem::replace(&mut data, true) {
                    return None; // the first would be left unread, and unchecked
                } else {
                    q.space();
                    match q.bytes().get(q.at) {
                        Some(b'[') => q.unchecked_list()?,
                        _ => q.value(3)?,
                    }
                };
                fields.quick_push(key, value)
            })?;
            (items.len() < MAX_MEMBERS).then(|| items.push(Shaped::Is(fields)))
        })?;
        Some(items)
    }

    /// A list taken as far as its brackets close (strings minded), nested [`MAX_DEPTH`] deep
    /// at most, its text unchecked.
    fn unchecked_list(&mut self) -> Option<Raw<'a>> {
        let (b, start) = (self.bytes(), self.at);
        let mut depth = 0usize;
        loop {
            self.at += memchr::memchr3(b'[', b']', b'"', b.get(self.at..)?)?;
            match b[self.at] {
                b'[' => depth += 1,
                b']' => depth -= 1,
                _ => loop {
                    // a string: past its closing quote, each escape's next byte skipped
                    self.at += 1 + memchr::memchr2(b'"', b'\\', b.get(self.at + 1..)?)?;
                    if b[self.at] == b'"' {
                        break;
                    }
                    self.at += 1;
                },
            }
            self.at += 1;
            if depth == 0 {
                return Some(Raw(&self.text[start..self.at]));
            }
            if depth > MAX_DEPTH {
                return None;
            }
        }
    }
}

/// A member's name: borrowed from the text where it has no escapes (the common case), else
/// unescaped into a string of its own.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member's name")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The name of what a visitor met instead of the shape it wanted.
macro_rules! not_the_shape {
    ($($method:ident($($t:ty)?) => $kind:expr;)*) => {
        $(fn $method<E: de::Error>(self $(, _: $t)?) -> Result<Self::Value, E> { Ok(Shaped::Not($kind)) })*
    };
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Shaped<Fields<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            fields.push(key, map.next_value::<&RawValue>()?)?;
        }
        Ok(Shaped::Is(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Shaped::Not("a list"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Shaped::Null)
    }

    not_the_shape! {
        visit_bool(bool) => "a boolean";
        visit_i64(i64) => "a number";
        visit_u64(u64) => "a number";
        visit_f64(f64) => "a number";
        visit_str(&str) => "a string";
    }
}

impl<'de> Deserialize<'de> for Shaped<Fields<'de>> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectVisitor)
    }
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Shaped<Vec<Shaped<Fields<'de>>>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of JSON objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Shaped<Fields<'de>>>()? {
            items.push(item);
            if items.len() > MAX_MEMBERS {
                return Err(too_many());
            }
        }
        Ok(Shaped::Is(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shaped::Not("an object"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Shaped::Null)
    }

    not_the_shape! {
        visit_bool(bool) => "a boolean";
        visit_i64(i64) => "a number";
        visit_u64(u64) => "a number";
        visit_f64(f64) => "a number";
        visit_str(&str) => "a string";
    }
}

impl<'de> Deserialize<'de> for Shaped<Vec<Shaped<Fields<'de>>>> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListVisitor)
    }
}

/// A list's first `cap` items, unread, and how many items it has.
pub fn capped_list(raw: Raw<'_>, cap: usize) -> Result<(Vec<Raw<'_>>, usize), RequestError> {
    struct Capped(usize);

    impl<'de> Visitor<'de> for Capped {
        type Value = (Vec<&'de RawValue>, usize);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let (mut items, mut total) = (Vec::new(), 0);
            while total < self.0 {
                match seq.next_element::<&RawValue>()? {
                    Some(item) => items.push(item),
                    None => return Ok((items, total)),
                }
                total += 1;
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {
                total += 1;
            }
            Ok((items, total))
        }
    }

    struct Seed(usize);

    impl<'de> de::DeserializeSeed<'de> for Seed {
        type Value = (Vec<&'de RawValue>, usize);

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(Capped(self.0))
        }
    }

    let mut d = serde_json::Deserializer::from_str(raw.get());
    let (items, total) = de::DeserializeSeed::deserialize(Seed(cap), &mut d).map_err(not_json)?;
    Ok((items.into_iter().map(Raw::from).collect(), total))
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        let mut inputs = Shaped::Null;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if key == "inputs" {
                inputs = map.next_value()?;
            } else {
                fields.push(key, map.next_value::<&RawValue>()?)?;
            }
        }
        Ok(Document { fields, inputs })
    }
}

impl<'de> Deserialize<'de> for Document<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(DocumentVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_reads_the_inputs_objects() {
        let doc =
            Document::read(r#"{"id": "a", "inputs": [{"name": "x", "data": [1, [2]]}, 5, [1], null], "inputs2": 1}"#)
                .unwrap();
        let Shaped::Is(items) = doc.inputs else { panic!("inputs") };
        let Shaped::Is(first) = &items[0] else { panic!("first") };
        assert_eq!(first.get("data").unwrap().get(), "[1, [2]]");
        assert!(matches!(items[1], Shaped::Not("a number")));
        assert!(matches!(items[2], Shaped::Not("a list")));
        assert!(matches!(items[3], Shaped::Null));
        assert_eq!(doc.fields.get("id").unwrap().get(), "\"a\"");
        for (text, kind) in [(r#"{"inputs": {"a": [1]}}"#, "an object"), (r#"{"inputs": "x"}"#, "a string")] {
            assert!(matches!(Document::read(text).unwrap().inputs, Shaped::Not(k) if k == kind));
        }
        assert!(Document::read(r#"{"inputs": [{"name": "\ud800"}]}"#).is_ok()); // unread: not checked
        assert!(Document::read(r#"{"inputs": [{"\ud800": 1}]}"#).is_err());
        // the quick reader: the same document, or none
        for text in [
            r#"{"id": "a", "inputs": [{"name": "x", "data": [1, [2]]}], "parameters": {"t": [1, {"u": null}]}}"#,
            r#" {"inputs": [{"data": ["a]", "\\\"]"], "data2": 1e400}] , "x": -0.5E+3} "#,
            r#"{"inputs": []}"#,
            r#"{}"#,
        ] {
            let (quick, full) = (Document::read_quick(text).expect(text), Document::read(text).unwrap());
            assert_eq!(quick.fields.0, full.fields.0, "{text}");
            let (Shaped::Is(q), Shaped::Is(f)) = (quick.inputs, full.inputs) else { continue };
            for (q, f) in q.iter().zip(&f) {
                let (Shaped::Is(q), Shaped::Is(f)) = (q, f) else { panic!("{text}") };
                assert_eq!(q.0, f.0, "{text}");
            }
        }
        for text in [
            r#"{"inputs": [{"name": "\u0078"}]}"#, // escapes: serde_json's
            r#"{"inputs": [{"data": [1], "data": [2]}]}"#,
            r#"{"inputs": {"a": 1}}"#,
            r#"{"inputs": [1]}"#,
            r#"{"a": 01}"#,
            r#"{"a": [1,]}"#,
            r#"{"a": 1} x"#,
            r#"{"a": tru}"#,
            r#"{"inputs": [{"data": [1, "]}]}"#,
            r#"{"inputs": [{"data": [[[1]]}]}"#,
        ] {
            assert!(Document::read_quick(text).is_none(), "{text}");
        }
        let deep = format!("{{\"a\": {}1{}}}", "[".repeat(QUICK_DEPTH), "]".repeat(QUICK_DEPTH));
        assert!(Document::read_quick(&deep).is_none() && Document::read(&deep).is_ok());
        assert!(
            too_deep(&"[".repeat(129)) && !too_deep(&"[".repeat(128)) && !too_deep(&format!("\"{}\"", "[".repeat(200)))
        );
    }
}
