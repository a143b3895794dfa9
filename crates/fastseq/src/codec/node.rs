//! Graph nodes kept as their encoded bytes.
//!
//! `GraphProto.node` is generated as `Vec<Bytes>` (see tools/gen_proto): each node is the
//! slice of the input it was encoded in. Decoding a graph then allocates nothing per node,
//! and writing it copies the same bytes back. Almost every node only ever needs its names
//! read or replaced, which [`fields`] and [`write_string`] do on the bytes (see
//! `names::walk_graph`). A node that holds subgraphs, tensors or anything unusual is decoded
//! into a [`NodeProto`] where that is needed, and encoded again only if it changed.
//! (Encoding such a node again copies what it holds, Constant weights in its subgraphs
//! included: a rare case, traded for never decoding the common one.)
//!
//! Nothing is trusted: [`check`] validates every node when a model is decoded, as prost
//! would have, and the scanners here return "not plain" instead of panicking on bad bytes.
use std::borrow::Cow;

use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

use crate::codec::proto::{AttributeProto, NodeProto};

// NodeProto's fields.
pub const INPUT: u32 = 1;
pub const OUTPUT: u32 = 2;
pub const NAME: u32 = 3;
pub const OP_TYPE: u32 = 4;
const ATTRIBUTE: u32 = 5;
const DOC_STRING: u32 = 6;
pub const DOMAIN: u32 = 7;
pub const OVERLOAD: u32 = 8;
const METADATA_PROPS: u32 = 9;
const DEVICE_CONFIGURATIONS: u32 = 10;

// AttributeProto's fields that hold tensors or graphs (the ones external data and the
// summary look into; sparse tensors in attributes are not among them).
const ATTR_TENSOR: u32 = 5;
const ATTR_GRAPH: u32 = 6;
const ATTR_TENSORS: u32 = 10;
const ATTR_GRAPHS: u32 = 11;

const LEN: u8 = 2;

/// Subgraphs nested deeper than this are refused when a model is decoded (prost's own
/// recursion limit stopped them at about this depth), so that no traversal overflows its stack.
pub const MAX_NESTING: usize = 32;

/// One field of an encoded message.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a> {
    pub tag: u32,
    pub wire: u8,
    /// The whole field, key included.
    pub raw: &'a [u8],
    /// The payload of a length-delimited field; empty for the other wire types.
    pub value: &'a [u8],
}

impl<'a> Field<'a> {
    /// The payload as text, if it is a length-delimited, valid UTF-8 field.
    pub fn text(&self) -> Option<&'a str> {
        if self.wire == LEN {
            std::str::from_utf8(self.value).ok()
        } else {
            None
        }
    }
}

/// The field could not be read: truncated, an impossible length or tag, or a group (which
/// no ONNX message uses; prost handles those when it decodes the node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The fields of an encoded message, in order. Yields `Err` once and stops at the first
/// malformed field.
pub fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, pos: 0 }
}

pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Option<Field<'a>> {
        let (buf, start) = (self.buf, self.pos);
        let key = varint(buf, &mut self.pos)?;
        let (tag, wire) = (key >> 3, (key & 7) as u8);
        if tag == 0 || tag > (1 << 29) - 1 {
            return None;
        }
        let mut value: &[u8] = &[];
        let skip = |pos: &mut usize, n: usize| -> Option<()> {
            *pos = pos.checked_add(n).filter(|&end| end <= buf.len())?;
            Some(())
        };
        match wire {
            0 => {
                varint(buf, &mut self.pos)?;
            }
            1 => skip(&mut self.pos, 8)?,
            2 => {
                let n = usize::try_from(varint(buf, &mut self.pos)?).ok()?;
                let from = self.pos;
                skip(&mut self.pos, n)?;
                value = &buf[from..self.pos];
            }
            5 => skip(&mut self.pos, 4)?,
            _ => return None,
        }
        Some(Field { tag: tag as u32, wire, raw: &buf[start..self.pos], value })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        match self.field() {
            Some(f) => Some(Ok(f)),
            None => {
                self.pos = self.buf.len();
                Some(Err(Malformed))
            }
        }
    }
}

/// Whether an attribute (encoded) holds any of `tags`; true for one that cannot be read,
/// so that the caller takes the decoding path, which reports it.
fn attribute_holds(attr: &[u8], tags: &[u32]) -> bool {
    fields(attr).any(|f| f.map_or(true, |f| tags.contains(&f.tag)))
}

/// A node whose names can be read and rewritten on its bytes: every field is readable, the
/// known ones have their wire type, and no attribute holds a subgraph. Fields this schema
/// does not know are kept as they are, as protobuf's own parsers keep them. (Anything
/// else, device configurations included, takes the decoded path.)
pub fn is_plain(raw: &[u8]) -> bool {
    fields(raw).all(|f| f.is_ok_and(|f| is_plain_field(&f)))
}

/// One field of a plain node (see [`is_plain`]).
pub fn is_plain_field(f: &Field) -> bool {
    match f.tag {
        INPUT | OUTPUT | NAME | OP_TYPE | DOC_STRING | DOMAIN | OVERLOAD | METADATA_PROPS => f.wire == LEN,
        ATTRIBUTE => f.wire == LEN && !attribute_holds(f.value, &[ATTR_GRAPH, ATTR_GRAPHS]),
        DEVICE_CONFIGURATIONS => false,
        _ => true,
    }
}

/// Whether any attribute of the node holds a tensor or a graph (true when unsure).
pub fn has_tensors_or_graphs(raw: &[u8]) -> bool {
    const HOLDERS: [u32; 4] = [ATTR_TENSOR, ATTR_GRAPH, ATTR_TENSORS, ATTR_GRAPHS];
    fields(raw).any(|f| match f {
        Ok(f) if f.tag == ATTRIBUTE => f.wire != LEN || attribute_holds(f.value, &HOLDERS),
        Ok(_) => false,
        Err(_) => true,
    })
}

/// The (domain, overload) a plain node's op_type is looked up in; the last occurrence
/// of a field wins, as in protobuf.
pub fn call_of(raw: &[u8]) -> (&str, &str) {
    let (mut domain, mut overload) = ("", "");
    for f in fields(raw).flatten() {
        match f.tag {
            DOMAIN => domain = f.text().unwrap_or(""),
            OVERLOAD => overload = f.text().unwrap_or(""),
            _ => {}
        }
    }
    (domain, overload)
}

/// A node's (name, op_type, domain) as their bytes, empty for an absent one; the last
/// occurrence of a field wins, as in protobuf. Strings may hold any bytes (protobuf and onnx
/// take them, and fastseq keeps them): a name that is not UTF-8 is still a name.
pub fn head_bytes(raw: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let (mut name, mut op, mut domain): (&[u8], &[u8], &[u8]) = (b"", b"", b"");
    for f in fields(raw).flatten() {
        match (f.tag, f.wire) {
            (NAME, LEN) => name = f.value,
            (OP_TYPE, LEN) => op = f.value,
            (DOMAIN, LEN) => domain = f.value,
            _ => {}
        }
    }
    (name, op, domain)
}

/// [`head_bytes`] as text, for people and Python: bytes that are not UTF-8 read as U+FFFD.
pub fn head(raw: &[u8]) -> (Cow<'_, str>, Cow<'_, str>, Cow<'_, str>) {
    let (name, op, domain) = head_bytes(raw);
    (String::from_utf8_lossy(name), String::from_utf8_lossy(op), String::from_utf8_lossy(domain))
}

/// Appends to `out` the node `raw` with `name` as its name: an empty name field is dropped,
/// and the new one goes where protobuf writes it (after the outputs, before the op_type);
/// every other field is copied as it is. For a node without a name (see [`head`]).
pub fn write_named(raw: &[u8], name: &str, out: &mut Vec<u8>) {
    let mut placed = false;
    for f in fields(raw).flatten() {
        if f.tag == NAME {
            continue;
        }
        if !placed && f.tag > NAME {
            write_string(NAME, name, out);
            placed = true;
        }
        out.extend_from_slice(f.raw);
    }
    if !placed {
        write_string(NAME, name, out);
    }
}

/// Appends a length-delimited string field.
pub fn write_string(tag: u32, s: &str, out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

pub fn decode(raw: &Bytes) -> Result<NodeProto, prost::DecodeError> {
    NodeProto::decode(raw.clone())
}

pub fn encode(node: &NodeProto) -> Bytes {
    Bytes::from(node.encode_to_vec())
}

/// Checks one node as prost would decode it. A node of strings only is checked on its bytes;
/// any other is decoded, and returned so that the caller can check the graphs it holds.
pub fn check(raw: &Bytes) -> Result<Option<NodeProto>, String> {
    let strings_only = fields(raw).all(|f| {
        f.is_ok_and(|f| {
            matches!(f.tag, INPUT | OUTPUT | NAME | OP_TYPE | DOC_STRING | DOMAIN | OVERLOAD) && f.text().is_some()
        })
    });
    if strings_only {
        return Ok(None);
    }
    decode(raw).map(Some).map_err(|e| e.to_string())
}

/// The graphs a decoded node's attributes hold.
pub fn subgraphs(node: &NodeProto) -> impl Iterator<Item = &crate::codec::proto::GraphProto> {
    node.attribute.iter().flat_map(|a: &AttributeProto| a.g.iter().chain(a.graphs.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::{AttributeProto, GraphProto};

    fn node(ins: &[&str], outs: &[&str]) -> NodeProto {
        NodeProto {
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            name: Some("n".into()),
            op_type: Some("Add".into()),
            ..Default::default()
        }
    }

    #[test]
    fn fields_read_what_prost_wrote() {
        let raw = encode(&node(&["a", "b"], &["c"]));
        let got: Vec<(u32, &str)> = fields(&raw).map(|f| f.unwrap()).map(|f| (f.tag, f.text().unwrap())).collect();
        assert_eq!(got, [(INPUT, "a"), (INPUT, "b"), (OUTPUT, "c"), (NAME, "n"), (OP_TYPE, "Add")]);
        assert!(is_plain(&raw));
        assert!(!has_tensors_or_graphs(&raw));
        assert_eq!(check(&raw), Ok(None));
    }

    #[test]
    fn subgraphs_and_tensors_are_seen_in_attributes() {
        let mut n = node(&["c"], &["y"]);
        n.attribute.push(AttributeProto {
            name: Some("then_branch".into()),
            g: Some(GraphProto::default()),
            ..Default::default()
        });
        let raw = encode(&n);
        assert!(!is_plain(&raw));
        assert!(has_tensors_or_graphs(&raw));
        assert!(check(&raw).unwrap().is_some());
        let mut ints = node(&["x"], &["y"]);
        ints.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(1), ..Default::default() });
        let raw = encode(&ints);
        assert!(is_plain(&raw));
        assert!(!has_tensors_or_graphs(&raw));
    }

    #[test]
    fn a_name_goes_where_protobuf_writes_it() {
        let mut unnamed = node(&["a"], &["b"]);
        unnamed.name = None;
        unnamed.domain = Some("ai.onnx".into());
        let raw = encode(&unnamed);
        assert_eq!(head_bytes(&raw), (&b""[..], &b"Add"[..], &b"ai.onnx"[..]));
        let mut out = Vec::new();
        write_named(&raw, "stage/Add_0", &mut out);
        let named = NodeProto { name: Some("stage/Add_0".into()), ..unnamed.clone() };
        assert_eq!(out, encode(&named).to_vec(), "the bytes prost writes for the named node");
        // An empty name field is replaced, not repeated.
        let empty = encode(&NodeProto { name: Some(String::new()), ..unnamed });
        let mut out = Vec::new();
        write_named(&empty, "n", &mut out);
        assert_eq!(head(&out).0, "n");
        // A name that is not UTF-8 is a name all the same (kept byte for byte), and reads
        // as U+FFFD where it is shown.
        let odd = [(NAME << 3) as u8 | LEN, 2, 0xff, 0xfe];
        assert_eq!(head_bytes(&odd).0, b"\xff\xfe");
        assert_eq!(head(&odd).0, "\u{fffd}\u{fffd}");
        assert_eq!(fields(&out).flatten().filter(|f| f.tag == NAME).count(), 1);
    }

    #[test]
    fn bad_bytes_are_never_plain_and_never_panic() {
        let raw = encode(&node(&["a"], &["b"]));
        for cut in 0..raw.len() {
            let part = raw.slice(..cut);
            let _ = is_plain(&part);
            let _ = has_tensors_or_graphs(&part);
            let _ = check(&part);
        }
        // An input name that is not UTF-8 is kept as protobuf keeps it (codec::fidelity).
        let bad_utf8 = Bytes::from_static(&[0x0a, 0x01, 0xff]);
        let kept = check(&bad_utf8).unwrap().expect("decoded, not plain");
        assert_eq!(&encode(&kept)[..], &bad_utf8[..]);
        let group = Bytes::from_static(&[0x0b, 0x0c]);
        assert!(!is_plain(&group));
        let huge_len = Bytes::from_static(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(fields(&huge_len).next().unwrap().is_err());
    }
}
