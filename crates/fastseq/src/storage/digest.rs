//! Digests: of a composed model (the session cache's key), read from where its weights are
//! (memory, the source files, an earlier copy) a chunk at a time, never held and never
//! written; and of a file (the cache's entries).
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use prost::Message;
use rayon::prelude::*;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::codec::proto::{GraphProto, ModelProto};
use crate::error::{Error, Result};
use crate::storage::data_file::{Piece, Placement};
use crate::storage::layout::LAYOUT;
use crate::storage::ranges::Source;

/// XXH3-128 over a stream of bytes (several GB/s; the key is not a security boundary: cache
/// entries carry their own checksums).
#[derive(Default)]
pub struct Digest(Xxh3);

impl Write for Digest {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Digest {
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0.digest128())
    }
}

/// The bytes each task of [`model_digest`] reads: enough to spread a few large weights over
/// the pool's threads, few enough that the task's own cost does not show.
const TASK: u64 = 8 << 20;

/// The digest of `model` as it would be written for a session, laid out as [`LAYOUT`] says
/// (as the writer's `write_session_copy` lays it out: the same [`Placement`]), without
/// writing it: the model
/// with its weights replaced by their places in that file, then each weight's bytes, in
/// chunks digested side by side on the pool and combined in file order. Weights are read
/// where they are (memory, a source file checked before and after as every copy is, an
/// earlier private copy) a chunk at a time; nothing is kept. Models equal as a writer would
/// write them have equal digests, whatever threads or files their weights are in.
pub fn model_digest(model: &ModelProto) -> Result<String> {
    let mut header = model.clone();
    let mut no_graph = GraphProto::default();
    let graph = header.graph.as_mut().unwrap_or(&mut no_graph);
    // The data file's name is part of the digest: a fixed one, so that the key does not
    // depend on where a copy is written.
    let data_name = LAYOUT.data_file("model.onnx");
    let placement = Placement::place(graph, LAYOUT.threshold, &data_name, 1, &mut Vec::new())?;
    let pieces = placement.pieces();
    let mut sources: HashMap<&str, Source> = HashMap::new();
    for (_, _, p) in &pieces {
        if let Piece::Range(r) = p {
            if !sources.contains_key(r.path.as_str()) {
                sources.insert(r.path.as_str(), Source::open(r)?);
            }
        }
    }
    let tasks: Vec<(usize, u64, u64)> = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, (_, _, p))| {
            let size = p.size();
            (0..size.div_ceil(TASK).max(1)).map(move |k| (i, k * TASK, (size - k * TASK).min(TASK)))
        })
        .collect();
    let chunk = |&(i, from, len): &(usize, u64, u64)| -> Result<u128> {
        let piece = &pieces[i].2;
        if let Piece::Memory(b) = piece {
            return Ok(xxh3_128(&b[from as usize..(from + len) as usize]));
        }
        let mut d = Xxh3::new();
        let mut buf = vec![0u8; (len as usize).min(1 << 20)];
        let mut at = 0u64;
        while at < len {
            let k = ((len - at) as usize).min(buf.len());
            match piece {
                Piece::Range(r) => sources[r.path.as_str()].read_at(r, from + at, &mut buf[..k])?,
                Piece::Private(f, start, _) => f
                    .read_exact_at(&mut buf[..k], start + from + at)
                    .map_err(|e| Error::export(format!("cannot read the session's copy: {e}")))?,
                Piece::Memory(_) => unreachable!(),
            }
            d.update(&buf[..k]);
            at += k as u64;
        }
        Ok(d.digest128())
    };
    let digests: Vec<Result<u128>> = crate::pool::install(|| tasks.par_iter().map(chunk).collect());
    let mut d = Xxh3::new();
    d.update(b"fastseq model digest 1\0");
    d.update(&header.encode_to_vec());
    for x in digests {
        d.update(&x?.to_le_bytes());
    }
    Ok(format!("{:032x}", d.digest128()))
}

/// The digest of a file's bytes, read in chunks (the session cache checks its entries with
/// it: a large data file is never held in memory whole).
pub fn file_digest(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    // A FIFO under an entry's file name must not hang the start.
    let (mut file, _) = crate::storage::read::open_input(path)?;
    let mut digest = Digest::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(digest.hex()),
            Ok(n) => digest.0.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with one large weight holding `bytes` and one small tensor beside it.
    fn model_of(bytes: Vec<u8>) -> ModelProto {
        use crate::codec::proto::TensorProto;
        let t = |name: &str, raw: Vec<u8>| TensorProto {
            name: Some(name.into()),
            data_type: Some(2),
            dims: vec![raw.len() as i64],
            raw_data: Some(bytes::Bytes::from(raw)),
            ..Default::default()
        };
        let g = GraphProto { initializer: vec![t("w", bytes), t("small", vec![1, 2, 3])], ..Default::default() };
        ModelProto { ir_version: Some(8), graph: Some(g), ..Default::default() }
    }

    #[test]
    fn a_models_digest_covers_every_byte_of_large_weights_and_the_rest_of_the_model() {
        let big: Vec<u8> = (0..TASK as usize * 2 + 12345).map(|i| (i % 251) as u8).collect();
        let base = model_digest(&model_of(big.clone())).unwrap();
        assert_eq!(base, model_digest(&model_of(big.clone())).unwrap());
        for at in [0, TASK as usize - 1, TASK as usize, big.len() - 1] {
            let mut changed = big.clone();
            changed[at] ^= 1;
            assert_ne!(model_digest(&model_of(changed)).unwrap(), base, "byte {at}");
        }
        let mut renamed = model_of(big.clone());
        renamed.graph.as_mut().unwrap().initializer[1].name = Some("other".into());
        assert_ne!(model_digest(&renamed).unwrap(), base);
        let mut small = model_of(big);
        small.graph.as_mut().unwrap().initializer[1].raw_data = Some(bytes::Bytes::from(vec![1u8, 2, 4]));
        assert_ne!(model_digest(&small).unwrap(), base);
    }

    #[test]
    fn digest_is_stable_and_sensitive() {
        let mut a = Digest::default();
        a.write_all(b"hello").unwrap();
        let mut b = Digest::default();
        b.write_all(b"hel").unwrap();
        b.write_all(b"lo").unwrap();
        assert_eq!(a.hex(), b.hex());
        let mut c = Digest::default();
        c.write_all(b"hellp").unwrap();
        assert_ne!(a.hex(), c.hex());
        assert_eq!(a.hex().len(), 32);
    }
}
