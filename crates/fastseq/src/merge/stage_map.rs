//! The stage map: which stage each node of a composed model comes from, kept in the
//! metadata of the files fastseq writes, so that a model exported here and loaded elsewhere
//! (`fastseq profile merged.onnx`, `fastseq inspect`) still tells its stages.
//!
//! The metadata key [`KEY`] holds one line of JSON:
//!
//! ```text
//! {"format":1,"nodes":13,"digest":"9c0e8f4a1b2c3d4e","stages":[["light",0,1,0],["heavy",1,13,0]]}
//! ```
//!
//! `stages` lists, in graph order, each stage's label and its nodes in the graph as a range
//! `[first, end)` of top-level node positions, then how many nodes at the start of that
//! range fastseq inserted (adapters on the stage's incoming edges: glue between stages, not
//! the stage's work). The ranges follow one another from 0 to `nodes`. `digest` is XXH3-64
//! (16 hex digits) over every top-level node's name, op_type and domain, in order (each
//! followed by a 0 byte, each node by a 0x1e byte), then every stage's label, first, end and
//! inserted count (in decimal, each followed by a 0 byte).
//!
//! A map is never trusted as it is: it is used only when it parses, its ranges follow one
//! another over exactly the graph's nodes, and the digest is that of the graph's nodes now
//! and of the stages it lists. A file edited elsewhere (nodes fused, added, removed, renamed
//! or reordered, or the map's text changed) fails that check, and the map is ignored with a
//! note, never used to attribute nodes wrongly.
use xxhash_rust::xxh3::Xxh3;

use crate::codec::node;
use crate::codec::proto::{GraphProto, ModelProto};

/// The metadata key of the stage map.
pub const KEY: &str = "fastseq.stages";
/// The map's format, the `format` field.
pub const FORMAT: u64 = 1;
/// The longest map read (a million stages' labels fit).
const MAX_LEN: usize = 64 << 20;

/// One stage of a map: its label, its nodes `[first, end)` in the graph and how many nodes
/// at the start of them fastseq inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub label: String,
    pub first: usize,
    pub end: usize,
    pub inserted: usize,
}

/// XXH3-64 over the top-level nodes' names, op_types and domains, in order, then the
/// stages' labels and ranges.
pub fn digest(g: &GraphProto, stages: &[Stage]) -> String {
    let mut h = Xxh3::new();
    for raw in &g.node {
        let (name, op, domain) = node::head_bytes(raw);
        for part in [name, op, domain] {
            h.update(part);
            h.update(&[0]);
        }
        h.update(&[0x1e]);
    }
    for s in stages {
        for part in [s.label.clone(), s.first.to_string(), s.end.to_string(), s.inserted.to_string()] {
            h.update(part.as_bytes());
            h.update(&[0]);
        }
    }
    format!("{:016x}", h.digest())
}

/// The map of `stages` over `model`'s graph, as the metadata value; None for fewer than two
/// stages (a map of one stage says nothing the file does not).
pub fn encode(stages: &[Stage], model: &ModelProto) -> Option<String> {
    if stages.len() < 2 {
        return None;
    }
    let g = model.graph.as_ref()?;
    let mut out =
        format!("{{\"format\":{FORMAT},\"nodes\":{},\"digest\":\"{}\",\"stages\":[", g.node.len(), digest(g, stages));
    for (k, s) in stages.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push('[');
        json_string(&s.label, &mut out);
        out.push_str(&format!(",{},{},{}]", s.first, s.end, s.inserted));
    }
    out.push_str("]}");
    Some(out)
}

/// A map as written: (node count, digest, stages), or the note saying why it does not parse.
pub type Parsed = Result<(u64, String, Vec<Stage>), String>;

/// The map held in `model`'s metadata, as it was written: None when there is none, an error
/// (the note to give) when it does not parse. See [`fit`] for the check against the nodes.
pub fn parse(model: &ModelProto) -> Option<Parsed> {
    let value = model.metadata_props.iter().rev().find(|p| p.key.as_deref() == Some(KEY))?.value.as_deref()?;
    Some(parse_value(value).ok_or_else(|| format!("its stage map ({KEY} in its metadata) does not parse: ignored")))
}

fn parse_value(text: &str) -> Option<(u64, String, Vec<Stage>)> {
    if text.len() > MAX_LEN {
        return None;
    }
    let mut p = Parser { s: text.as_bytes(), at: 0 };
    let v = p.value(0)?;
    p.ws();
    if p.at != p.s.len() {
        return None;
    }
    let Json::Object(fields) = v else { return None };
    let get = |k: &str| fields.iter().find(|(name, _)| name == k).map(|(_, v)| v);
    if !matches!(get("format"), Some(Json::Int(FORMAT))) {
        return None;
    }
    let Some(Json::Int(nodes)) = get("nodes") else { return None };
    let Some(Json::Str(digest)) = get("digest") else { return None };
    let Some(Json::Array(items)) = get("stages") else { return None };
    let mut stages = Vec::with_capacity(items.len());
    for item in items {
        let Json::Array(parts) = item else { return None };
        let [Json::Str(label), Json::Int(first), Json::Int(end), Json::Int(inserted)] = parts.as_slice() else {
            return None;
        };
        let n = |v: &u64| usize::try_from(*v).ok();
        stages.push(Stage { label: label.clone(), first: n(first)?, end: n(end)?, inserted: n(inserted)? });
    }
    Some((*nodes, digest.clone(), stages))
}

/// The stages of a parsed map when it fits `g`: at least two stages with labels, ranges
/// that follow one another from 0 to the graph's node count (as many as the map says),
/// inserted nodes within their range, and the digest of the nodes as they are now. Else the
/// note saying why it is ignored.
pub fn fit(parsed: (u64, String, Vec<Stage>), g: &GraphProto) -> Result<Vec<Stage>, String> {
    let (nodes, digest, stages) = parsed;
    let ignored = |why: String| Err(format!("its stage map ({KEY} in its metadata) {why}: ignored"));
    let count = g.node.len();
    if nodes != count as u64 {
        return ignored(format!("is of {nodes} nodes, the graph has {count}"));
    }
    if stages.len() < 2 || stages.iter().any(|s| s.label.is_empty()) {
        return ignored("names fewer than two stages, or a stage without a label".into());
    }
    let mut at = 0;
    for s in &stages {
        if s.first != at || s.end < s.first || s.inserted > s.end - s.first {
            return ignored(format!("has ranges that do not follow one another over the nodes (stage '{}')", s.label));
        }
        at = s.end;
    }
    if at != count {
        return ignored(format!("covers {at} of the graph's {count} nodes"));
    }
    if digest != self::digest(g, &stages) {
        return ignored("does not fit its nodes (they, or the map, were changed after it was written)".into());
    }
    Ok(stages)
}

fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The JSON a map is made of: objects, arrays, strings and non-negative integers.
enum Json {
    Object(Vec<(String, Json)>),
    Array(Vec<Json>),
    Str(String),
    Int(u64),
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.at).is_some_and(|b| b" \t\r\n".contains(b)) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        if depth > 4 {
            return None;
        }
        self.ws();
        match *self.s.get(self.at)? {
            b'{' => {
                self.at += 1;
                let mut fields = Vec::new();
                if self.eat(b'}') {
                    return Some(Json::Object(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    if !self.eat(b':') {
                        return None;
                    }
                    fields.push((key, self.value(depth + 1)?));
                    if self.eat(b'}') {
                        return Some(Json::Object(fields));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Some(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Some(Json::Array(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'"' => self.string().map(Json::Str),
            b'0'..=b'9' => {
                let start = self.at;
                while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
                    self.at += 1;
                }
                std::str::from_utf8(&self.s[start..self.at]).ok()?.parse().ok().map(Json::Int)
            }
            _ => None,
        }
    }

    fn string(&mut self) -> Option<String> {
        if self.s.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let b = *self.s.get(self.at)?;
            self.at += 1;
            match b {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.at)?;
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) {
                                if self.s.get(self.at..self.at + 2) != Some(b"\\u") {
                                    return None;
                                }
                                self.at += 2;
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return None;
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b if b < 0x20 => return None,
                b => out.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.at..self.at + 4)?;
        self.at += 4;
        u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::StringStringEntryProto;
    use crate::merge::testing::{node, scale};

    fn stages(labels: &[(&str, usize, usize)]) -> Vec<Stage> {
        labels.iter().map(|&(l, a, b)| Stage { label: l.into(), first: a, end: b, inserted: 0 }).collect()
    }

    fn with_map(mut m: ModelProto, value: &str) -> ModelProto {
        m.metadata_props.push(StringStringEntryProto {
            key: Some(KEY.into()),
            value: Some(value.into()),
            ..Default::default()
        });
        m
    }

    fn read(m: &ModelProto) -> Option<Result<Vec<Stage>, String>> {
        parse(m).map(|p| p.and_then(|p| fit(p, m.graph.as_ref().unwrap())))
    }

    #[test]
    fn a_map_written_reads_back_and_one_stage_writes_none() {
        let m = scale(1);
        let two = stages(&[("pre \"x\"\\ é\n", 0, 1), ("post", 1, 2)]);
        let text = encode(&two, &m).unwrap();
        assert!(text.starts_with("{\"format\":1,\"nodes\":2,\"digest\":\""), "{text}");
        assert_eq!(read(&with_map(m.clone(), &text)), Some(Ok(two)));
        assert_eq!(encode(&stages(&[("one", 0, 2)]), &m), None);
        assert_eq!(read(&m), None);
    }

    #[test]
    fn text_that_is_not_a_map_never_panics_the_reader() {
        // Hostile metadata, as a file edited elsewhere may carry: every prefix of a real map,
        // every byte of it replaced, deep nesting, odd escapes and numbers.
        let m = scale(1);
        let text = encode(&stages(&[("pre \"x\" é", 0, 1), ("post", 1, 2)]), &m).unwrap();
        let bytes = text.as_bytes();
        let mut tried = 0;
        for cut in 0..bytes.len() {
            if let Ok(t) = std::str::from_utf8(&bytes[..cut]) {
                assert_eq!(parse_value(t), None, "{t}");
                tried += 1;
            }
        }
        for at in 0..bytes.len() {
            for b in [b'"', b'\\', b'{', b'[', b']', b'}', b',', b':', b'-', b'9', b' ', b'x'] {
                let mut v = bytes.to_vec();
                v[at] = b;
                if let Ok(t) = std::str::from_utf8(&v) {
                    let _ = parse_value(t); // a map or None, never a panic
                    tried += 1;
                }
            }
        }
        assert!(tried > 1000);
        for t in [
            "[".repeat(100_000).as_str(),
            "{\"a\":".repeat(10_000).as_str(),
            "\"\\u",
            "\"\\ud800\"",
            "\"\\uZZZZ\"",
            "99999999999999999999999999",
            "-1",
            "{\"format\":1e400}",
            "",
        ] {
            assert_eq!(parse_value(t), None, "{t:.40}");
        }
    }

    #[test]
    fn a_map_that_does_not_fit_its_nodes_is_ignored_with_a_note() {
        let m = scale(1);
        let text = encode(&stages(&[("a", 0, 1), ("b", 1, 2)]), &m).unwrap();
        // A node changed after the map was written (renamed here), one added, one removed.
        let mut renamed = with_map(m.clone(), &text);
        renamed.graph.as_mut().unwrap().node[1] = node("Relu", &["t"], &["y"]);
        let mut edited = crate::codec::node::decode(&renamed.graph.as_ref().unwrap().node[1]).unwrap();
        edited.name = Some("other".into());
        renamed.graph.as_mut().unwrap().node[1] = crate::codec::node::encode(&edited);
        let note = read(&renamed).unwrap().unwrap_err();
        assert!(note.contains("does not fit its nodes"), "{note}");
        let mut added = with_map(m.clone(), &text);
        added.graph.as_mut().unwrap().node.push(node("Neg", &["y"], &["z"]));
        assert!(read(&added).unwrap().unwrap_err().contains("is of 2 nodes, the graph has 3"));
        // The map's own ranges edited to fit the count: its digest no longer matches.
        let moved = text.replace("[\"a\",0,1,0],[\"b\",1,2,0]", "[\"a\",0,2,0],[\"b\",2,2,0]");
        assert_ne!(moved, text);
        assert!(read(&with_map(m.clone(), &moved)).unwrap().unwrap_err().contains("does not fit its nodes"));
        // Ranges that overlap, leave a gap, or run past the graph; garbage; another format.
        let digest = "0000000000000000";
        for bad in [
            format!("{{\"format\":1,\"nodes\":2,\"digest\":\"{digest}\",\"stages\":[[\"a\",0,2,0],[\"b\",1,2,0]]}}"),
            format!("{{\"format\":1,\"nodes\":2,\"digest\":\"{digest}\",\"stages\":[[\"a\",0,1,0],[\"b\",1,3,0]]}}"),
            format!("{{\"format\":1,\"nodes\":2,\"digest\":\"{digest}\",\"stages\":[[\"a\",0,1,2],[\"b\",1,2,0]]}}"),
            format!("{{\"format\":1,\"nodes\":2,\"digest\":\"{digest}\",\"stages\":[[\"\",0,1,0],[\"b\",1,2,0]]}}"),
        ] {
            let note = read(&with_map(m.clone(), &bad)).unwrap().unwrap_err();
            assert!(note.ends_with(": ignored"), "{note}");
        }
        for garbage in ["", "{", "[1,2]", "{\"format\":2}", "{\"format\":1,\"nodes\":-1}", &"[".repeat(100_000)] {
            let note = read(&with_map(m.clone(), garbage)).unwrap().unwrap_err();
            assert!(note.contains("does not parse"), "{garbage:.20}: {note}");
        }
    }

    #[test]
    fn the_digest_sees_names_op_types_order_and_stages() {
        let a = scale(1);
        let mut b = scale(1);
        b.graph.as_mut().unwrap().node.swap(0, 1);
        let two = stages(&[("a", 0, 1), ("b", 1, 2)]);
        let d = |m: &ModelProto, s: &[Stage]| digest(m.graph.as_ref().unwrap(), s);
        assert_ne!(d(&a, &two), d(&b, &two));
        assert_eq!(d(&a, &two), d(&scale(1), &two));
        assert_ne!(d(&a, &two), d(&a, &stages(&[("a", 0, 2), ("b", 2, 2)])));
        assert_ne!(d(&a, &two), d(&a, &stages(&[("A", 0, 1), ("b", 1, 2)])));
    }
}
