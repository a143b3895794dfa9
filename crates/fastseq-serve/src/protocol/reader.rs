//! An HTTP request's JSON read in one pass, as far as the decode needs it: the top-level
//! object's members, its `inputs` list's objects' members, every value unread (a borrowed
//! slice of the text, which serde_json has checked). A tensor's `data` is read once more,
//! by [`crate::protocol::values::from_json`], and nothing else is; a tree of values is never built.
use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::RequestError;

use crate::protocol::params::not_json;
use crate::protocol::MAX_DEPTH;

/// The most members of one object, or items of one list, that the decode keeps (each costs
/// more than its text: without a bound, a body of `{"a":0,"b":0,...}` would take ten times
/// its size). No request needs nearly as many.
pub const MAX_MEMBERS: usize = 65_536;

fn too_many<E: de::Error>() -> E {
    E::custom(format_args!("more than {MAX_MEMBERS} members or items in one object or list"))
}

/// A JSON object's members, their values unread (the last of a name wins, as Python's json
/// reads), in the order given. A list, not a map: objects of the protocol have a handful of
/// members, and a map cost a hash (and a String) per member of every request; the few lookups
/// a decode makes each scan it once, so a hostile object of [`MAX_MEMBERS`] members costs
/// a few scans of it, not a quadratic.
#[derive(Default)]
pub struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    /// The members of `raw`, an object.
    pub fn parse(raw: &'a RawValue) -> Result<Self, RequestError> {
        match serde_json::from_str::<Shaped<Fields<'a>>>(raw.get()).map_err(not_json)? {
            Shaped::Is(fields) => Ok(fields),
            Shaped::Null => Err(RequestError::bad("a JSON object was due, got null")),
            Shaped::Not(kind) => Err(RequestError::bad(format!("a JSON object was due, got {kind}"))),
        }
    }

    /// The member `key` (its last value), null included.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The member `key` (its last value), taken out with every value of that name, null
    /// included.
    pub fn remove(&mut self, key: &str) -> Option<&'a RawValue> {
        let found = self.get(key);
        if found.is_some() {
            self.0.retain(|(k, _)| k != key);
        }
        found
    }

    /// The member `key`, taken out (null counts as absent, as Python's `dict.get` reads it
    /// where it matters: `"id": null`, `"parameters": null`, `"binary_data_size": null`).
    pub fn take(&mut self, key: &str) -> Option<&'a RawValue> {
        self.remove(key).filter(|v| v.get() != "null")
    }

    /// Whether the member `key` is there at all (null included).
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    fn push<E: de::Error>(&mut self, key: Cow<'a, str>, value: &'a RawValue) -> Result<(), E> {
        self.0.push((key, value));
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
pub fn capped_list(raw: &RawValue, cap: usize) -> Result<(Vec<&RawValue>, usize), RequestError> {
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
    de::DeserializeSeed::deserialize(Seed(cap), &mut d).map_err(not_json)
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
        assert!(
            too_deep(&"[".repeat(129)) && !too_deep(&"[".repeat(128)) && !too_deep(&format!("\"{}\"", "[".repeat(200)))
        );
    }
}
