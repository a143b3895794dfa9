//! What protobuf keeps of a message and prost would lose: fields the schema does not know,
//! and `string` fields whose bytes are not UTF-8 (onnx-ml.proto is proto2, whose parsers
//! accept any bytes there: a `dim_param` or a domain of arbitrary bytes passes onnx's
//! checker). The vendored prost-derive (`crates/vendor/prost-derive`) calls this module, as
//! `crate::__prost_fidelity`, for both:
//!
//! - every message's `unknown_fields` holds the fields it does not know, as read, and
//!   writes them after its known fields (where protobuf writes them);
//! - every `String` is decoded losslessly: bytes that are not UTF-8, and the escape
//!   characters themselves, become one escape character each (U+10FF00 + the byte, in a
//!   private-use plane no ONNX name uses), which encoding turns back into the byte. A
//!   string of UTF-8 costs one scan for the lead byte of the escapes (0xF4) each way.
//!
//! So a model decoded and encoded again is the same bytes (up to the order of its fields),
//! whatever its strings hold; a name with odd bytes is renamed as text, its bytes kept.
use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, DecodeContext, WireType};
use prost::DecodeError;

const ESCAPE: u32 = 0x10FF00;
/// The lead byte of every escape character in UTF-8 (and of other plane-16 characters).
const LEAD: u8 = 0xF4;

fn is_escape(c: char) -> bool {
    (ESCAPE..=ESCAPE + 0xFF).contains(&(c as u32))
}

fn escape(b: u8) -> char {
    char::from_u32(ESCAPE + u32::from(b)).expect("plane 16 is valid")
}

/// The text of `bytes`: as it is when UTF-8 without escape characters, else each odd byte
/// (and each byte of an escape character) as an escape character.
pub fn text_of(mut bytes: Vec<u8>) -> String {
    if !bytes.contains(&LEAD) {
        match String::from_utf8(bytes) {
            Ok(s) => return s,
            Err(e) => bytes = e.into_bytes(),
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if is_escape(c) {
                let mut b = [0u8; 4];
                out.extend(c.encode_utf8(&mut b).bytes().map(escape));
            } else {
                out.push(c);
            }
        }
        out.extend(chunk.invalid().iter().copied().map(escape));
    }
    out
}

/// The bytes a text decoded by [`text_of`] was read from.
pub fn bytes_of(s: &str) -> std::borrow::Cow<'_, [u8]> {
    if !s.as_bytes().contains(&LEAD) {
        return std::borrow::Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        if is_escape(c) {
            out.push((c as u32 - ESCAPE) as u8);
        } else {
            let mut b = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
        }
    }
    std::borrow::Cow::Owned(out)
}

pub(crate) fn wire_len(s: &str) -> usize {
    if !s.as_bytes().contains(&LEAD) {
        return s.len();
    }
    // An escape character is 4 bytes of text for 1 on the wire.
    s.len() - 3 * s.chars().filter(|&c| is_escape(c)).count()
}

/// prost's `encoding::string`, lossless (see the module's doc).
pub mod string {
    use prost::bytes::{Buf, BufMut};
    use prost::encoding::{check_wire_type, encode_key, encode_varint, encoded_len_varint, key_len};
    use prost::encoding::{DecodeContext, WireType};
    use prost::DecodeError;

    use crate::codec::fidelity::{bytes_of, text_of, wire_len};

    pub fn encode(tag: u32, value: &str, buf: &mut impl BufMut) {
        let bytes = bytes_of(value);
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(bytes.len() as u64, buf);
        buf.put_slice(&bytes);
    }

    pub fn merge(
        wire_type: WireType,
        value: &mut String,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut bytes: Vec<u8> = Vec::new();
        prost::encoding::bytes::merge(wire_type, &mut bytes, buf, ctx)?;
        *value = text_of(bytes);
        Ok(())
    }

    pub fn encode_repeated(tag: u32, values: &[String], buf: &mut impl BufMut) {
        for value in values {
            encode(tag, value, buf);
        }
    }

    pub fn merge_repeated(
        wire_type: WireType,
        values: &mut Vec<String>,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        check_wire_type(WireType::LengthDelimited, wire_type)?;
        let mut value = String::new();
        merge(wire_type, &mut value, buf, ctx)?;
        values.push(value);
        Ok(())
    }

    #[allow(clippy::ptr_arg)]
    pub fn encoded_len(tag: u32, value: &String) -> usize {
        let n = wire_len(value);
        key_len(tag) + encoded_len_varint(n as u64) + n
    }

    pub fn encoded_len_repeated(tag: u32, values: &[String]) -> usize {
        values.iter().map(|v| encoded_len(tag, v)).sum()
    }
}

/// Groups nest no deeper than this in what is kept (no ONNX message has groups at all).
const MAX_GROUP_DEPTH: usize = 32;

/// Appends a field the message does not know (its key already read) to `out`, as read
/// (varints as their value, which protobuf writes the same way).
pub fn keep_unknown(
    tag: u32,
    wire_type: WireType,
    buf: &mut impl Buf,
    _ctx: DecodeContext,
    out: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    keep(tag, wire_type, buf, out, 0)
}

#[allow(deprecated)] // prost has no other public way to make one
fn error(message: &'static str) -> DecodeError {
    DecodeError::new(message)
}

fn copy(buf: &mut impl Buf, n: u64, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let n = usize::try_from(n).ok().filter(|&n| n <= buf.remaining());
    let Some(n) = n else { return Err(error("buffer underflow in an unknown field")) };
    let start = out.len();
    out.resize(start + n, 0);
    buf.copy_to_slice(&mut out[start..]);
    Ok(())
}

fn keep(tag: u32, wire_type: WireType, buf: &mut impl Buf, out: &mut Vec<u8>, depth: usize) -> Result<(), DecodeError> {
    encode_key(tag, wire_type, out);
    match wire_type {
        WireType::Varint => encode_varint(decode_varint(buf)?, out),
        WireType::ThirtyTwoBit => copy(buf, 4, out)?,
        WireType::SixtyFourBit => copy(buf, 8, out)?,
        WireType::LengthDelimited => {
            let n = decode_varint(buf)?;
            encode_varint(n, out);
            copy(buf, n, out)?;
        }
        WireType::StartGroup => loop {
            if depth >= MAX_GROUP_DEPTH {
                return Err(error("unknown groups nested too deep"));
            }
            let (inner, inner_wire) = decode_key(buf)?;
            if inner_wire == WireType::EndGroup {
                if inner != tag {
                    return Err(error("unexpected end group tag"));
                }
                encode_key(inner, WireType::EndGroup, out);
                break;
            }
            keep(inner, inner_wire, buf, out, depth + 1)?;
        },
        WireType::EndGroup => return Err(error("unexpected end group tag")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::codec::proto::{ModelProto, OperatorSetIdProto};

    #[test]
    fn odd_bytes_round_trip_and_plain_text_is_untouched() {
        for bytes in
            [b"plain".to_vec(), vec![0xff, b'a', 0xfe], "\u{10FF41}x".as_bytes().to_vec(), vec![0xf4, 0x8f], vec![]]
        {
            let text = text_of(bytes.clone());
            assert_eq!(&*bytes_of(&text), &bytes[..], "{bytes:?}");
            assert_eq!(wire_len(&text), bytes.len());
        }
        assert_eq!(text_of(b"plain".to_vec()), "plain");
        // A prefix before an odd name gives the prefix's bytes before the name's.
        let name = text_of(vec![0xff]);
        assert_eq!(&*bytes_of(&format!("p/{name}")), b"p/\xff");
    }

    #[test]
    fn unknown_fields_and_odd_strings_survive_decode_and_encode() {
        let opset = OperatorSetIdProto { domain: Some("d".into()), version: Some(3), ..Default::default() };
        let mut raw = opset.encode_to_vec();
        raw.extend_from_slice(&[0xb8, 0x3e, 0x2a]); // field 999, varint 42
        let back = OperatorSetIdProto::decode(&raw[..]).unwrap();
        assert_eq!(back.unknown_fields, [0xb8, 0x3e, 0x2a]);
        assert_eq!(back.encode_to_vec(), raw);
        // A domain of odd bytes (field 1), in a model (field 8).
        let odd = [0x0a, 0x02, 0xff, 0x41, 0x10, 0x01];
        let mut model = vec![0x42, odd.len() as u8];
        model.extend_from_slice(&odd);
        let m = ModelProto::decode(&model[..]).unwrap();
        assert_eq!(m.encode_to_vec(), model);
        assert_eq!(m.encoded_len(), model.len());
    }

    #[test]
    fn a_known_field_with_another_wire_type_is_kept_as_unknown() {
        // protobuf keeps it as an unknown field (and writes it after the known ones); prost
        // would refuse the message. OperatorSetIdProto: domain (1, a string) as a varint,
        // version (2, an int64) as bytes, then the real domain.
        let raw = [0x08, 0x05, 0x12, 0x01, 0x41, 0x0a, 0x01, b'd'];
        let back = OperatorSetIdProto::decode(&raw[..]).unwrap();
        assert_eq!(back.domain.as_deref(), Some("d"));
        assert_eq!(back.version, None);
        assert_eq!(back.unknown_fields, [0x08, 0x05, 0x12, 0x01, 0x41]);
        assert_eq!(back.encode_to_vec(), [0x0a, 0x01, b'd', 0x08, 0x05, 0x12, 0x01, 0x41]);
        // A message field (the model's graph, 7) as a varint; a repeated int64 packed or not
        // is read either way (TensorShapeProto's dims are messages: use TensorProto.dims, 1).
        let model = ModelProto::decode(&[0x38, 0x01][..]).unwrap();
        assert!(model.graph.is_none());
        assert_eq!(model.unknown_fields, [0x38, 0x01]);
        let packed = crate::codec::proto::TensorProto::decode(&[0x0a, 0x02, 0x02, 0x03, 0x08, 0x04][..]).unwrap();
        assert_eq!(packed.dims, [2, 3, 4]);
        assert!(packed.unknown_fields.is_empty());
        // A oneof's variant (TypeProto.tensor_type, 1, a message) as a varint.
        let typed = crate::codec::proto::TypeProto::decode(&[0x08, 0x07][..]).unwrap();
        assert!(typed.value.is_none());
        assert_eq!(typed.unknown_fields, [0x08, 0x07]);
    }
}
