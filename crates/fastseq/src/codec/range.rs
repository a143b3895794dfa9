//! Weights left in their source file: a main-graph initializer whose bytes are a range of
//! the file the rest of its model was read from (its inline `raw_data`, left unread, or its
//! external data). The range travels in the tensor's own `external_data` entries (the
//! file's absolute path, offset, length) with the file's identity at load under
//! [`RANGE_KEY`], so that clones, compositions and renames carry it like any tensor field.
//! The storage layer copies such a range (in the kernel) when it writes a model, and reads it
//! where the bytes must be in memory; a model holding ranges never reaches a reader as is.
use prost::encoding::{encoded_len_varint, key_len};
use prost::Message;

use crate::codec::proto::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto, TensorProto};

/// The `external_data` key that marks a range and carries its file's identity at load (as
/// `storage::read::Identity` encodes it). Never written out.
pub const RANGE_KEY: &str = "fastseq:range";

/// Where a tensor's bytes are: `len` bytes at `offset` of the file at `path`, which had
/// `identity` when its model was read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileRange {
    pub path: String,
    pub offset: u64,
    pub len: u64,
    pub identity: String,
}

fn entry<'a>(t: &'a TensorProto, key: &str) -> Option<&'a str> {
    t.external_data.iter().find(|e| e.key.as_deref() == Some(key)).and_then(|e| e.value.as_deref())
}

fn kv(key: &str, value: String) -> StringStringEntryProto {
    StringStringEntryProto { key: Some(key.into()), value: Some(value), ..Default::default() }
}

impl FileRange {
    /// The range a tensor's bytes are, if they are one. (A source's own entries under
    /// [`RANGE_KEY`] are removed when it is loaded: only fastseq's count.)
    pub fn of(t: &TensorProto) -> Option<FileRange> {
        if t.data_location != Some(DataLocation::External as i32) {
            return None;
        }
        let identity = entry(t, RANGE_KEY)?;
        Some(FileRange {
            path: entry(t, "location")?.to_string(),
            offset: entry(t, "offset")?.parse().ok()?,
            len: entry(t, "length")?.parse().ok()?,
            identity: identity.to_string(),
        })
    }

    /// Makes the tensor's bytes this range (whatever data it held inline is dropped).
    pub fn put(&self, t: &mut TensorProto) {
        t.raw_data = None;
        t.data_location = Some(DataLocation::External as i32);
        t.external_data = vec![
            kv("location", self.path.clone()),
            kv("offset", self.offset.to_string()),
            kv("length", self.len.to_string()),
            kv(RANGE_KEY, self.identity.clone()),
        ];
    }
}

/// Takes a range out of `t`: it holds `raw` from now on, inline, as if it had been read.
pub fn set_inline(t: &mut TensorProto, raw: bytes::Bytes) {
    t.external_data.clear();
    t.data_location = None;
    t.raw_data = Some(raw);
}

/// The main-graph initializers held as ranges: (index, range).
pub fn ranges(m: &ModelProto) -> impl Iterator<Item = (usize, FileRange)> + '_ {
    m.graph.iter().flat_map(|g| g.initializer.iter().enumerate()).filter_map(|(i, t)| Some((i, FileRange::of(t)?)))
}

pub fn has_ranges(m: &ModelProto) -> bool {
    ranges(m).next().is_some()
}

/// The length of `m` encoded with every range as inline `raw_data`: what a reader of the
/// model (and the 2 GB protobuf limit) sees.
pub fn inline_len(m: &ModelProto) -> usize {
    let Some(g) = m.graph.as_ref() else { return m.encoded_len() };
    let field = |tag: u32, len: usize| key_len(tag) + encoded_len_varint(len as u64) + len;
    let mut graph_len = g.encoded_len();
    for t in g.initializer.iter().filter(|t| t.external_data.iter().any(|e| e.key.as_deref() == Some(RANGE_KEY))) {
        let Some(r) = FileRange::of(t) else { continue };
        let mut inline = t.clone();
        inline.external_data.clear();
        inline.data_location = None;
        let inline_len = inline.encoded_len() + field(9, r.len as usize);
        graph_len = graph_len - field(5, t.encoded_len()) + field(5, inline_len);
    }
    m.encoded_len() - field(7, g.encoded_len()) + field(7, graph_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::proto::GraphProto;
    use bytes::Bytes;

    #[test]
    fn a_range_round_trips_and_counts_as_inline_in_the_length() {
        let inline = TensorProto {
            name: Some("w".into()),
            data_type: Some(1),
            dims: vec![100_000],
            raw_data: Some(Bytes::from(vec![3u8; 400_000])),
            ..Default::default()
        };
        let model = |t: TensorProto| ModelProto {
            ir_version: Some(8),
            graph: Some(GraphProto { name: Some("g".into()), initializer: vec![t], ..Default::default() }),
            ..Default::default()
        };
        let whole = model(inline.clone());
        let mut t = inline.clone();
        let r = FileRange { path: "/x/m.onnx".into(), offset: 1234, len: 400_000, identity: "1:2:3:4:5".into() };
        r.put(&mut t);
        assert_eq!(FileRange::of(&t), Some(r.clone()));
        let ranged = model(t.clone());
        assert!(has_ranges(&ranged) && !has_ranges(&whole));
        assert_eq!(ranges(&ranged).collect::<Vec<_>>(), vec![(0, r)]);
        assert_eq!(inline_len(&ranged), whole.encoded_len());
        assert_eq!(inline_len(&whole), whole.encoded_len());
        set_inline(&mut t, Bytes::from(vec![3u8; 400_000]));
        assert_eq!(model(t).encode_to_vec(), whole.encode_to_vec());
    }
}
