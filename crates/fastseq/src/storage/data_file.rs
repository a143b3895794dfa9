//! The data files of a model written with external data: where each weight goes (aligned
//! offsets), the weights in memory written once, and those still in a file (a source's range,
//! or an earlier private copy that a pipeline maps) copied by the kernel.
//!
//! A private copy's large copies are spread over several files copied side by side: the
//! kernel serialises the writes to one file (its inode lock), so a single file copies on one
//! core (8 x 64 MB: 0.20 s on one file, 0.12 s on two files from two threads, on 2 cores).
//! An export keeps one data file.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rayon::prelude::*;

use crate::codec::proto::{tensor_proto::DataLocation, GraphProto, TensorProto};
use crate::codec::range::FileRange;
use crate::codec::tensor::for_each_tensor;
use crate::error::{Error, Result};
use crate::storage::copy::{Copied, Copier};
use crate::storage::external::kv;
use crate::storage::mapped::file_of;
use crate::storage::ranges::{by_file, Source};

const ALIGN: u64 = 4096;

/// Below this many bytes to copy in the kernel, one data file is enough.
const SPLIT_MIN: u64 = 64 << 20;

/// Where a weight written to the data files was held: what a model holding it can be
/// matched by (see `spill::spill_onto`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Held {
    /// `Bytes` in memory: (address, length).
    Memory(usize, usize),
    /// A range of a source file.
    File(FileRange),
}

/// A weight put in the data files: where it was held, which file (`part`) and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub held: Held,
    pub part: usize,
    pub offset: u64,
}

/// One weight of the data files (see [`Placement::pieces`]).
pub enum Piece<'a> {
    /// Bytes in memory, written from there.
    Memory(&'a Bytes),
    /// A range of a source file.
    Range(&'a FileRange),
    /// `len` bytes at an offset of a file a pipeline maps (an earlier private copy).
    Private(&'a File, u64, u64),
}

impl Piece<'_> {
    /// Its length in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Piece::Memory(b) => b.len() as u64,
            Piece::Range(r) => r.len,
            Piece::Private(_, _, len) => *len,
        }
    }
}

/// Bytes the kernel copies: a range of a source file, or of a file a pipeline maps.
enum Copy {
    Range(FileRange),
    Private(Arc<File>, u64),
}

/// What goes in each data file.
#[derive(Default)]
pub struct Placement {
    /// The files' names: the first is the name given, the others `{name}.{part}`.
    pub names: Vec<String>,
    pub lens: Vec<u64>,
    /// Weights written from memory (all in the first file): (bytes, offset).
    memory: Vec<(Bytes, u64)>,
    /// Per file: (what to copy, offset, length).
    copies: Vec<Vec<(Copy, u64, u64)>>,
}

impl Placement {
    /// Points every tensor of `g` that goes to the data files (at least `threshold` bytes,
    /// or still in a file) at its place in them, taking its bytes out; `name` is the first
    /// file's name, and the large copies are spread over up to `max_parts` files.
    pub fn place(
        g: &mut GraphProto,
        threshold: usize,
        name: &str,
        max_parts: usize,
        placed: &mut Vec<Placed>,
    ) -> Result<Placement> {
        // The main graph's initializers (where the weights are) are spread over the parts;
        // whatever else goes to the data files goes to the first.
        let mut initializers = std::mem::take(&mut g.initializer);
        let parts = parts_for(&initializers, threshold, max_parts);
        let n = parts.iter().flatten().max().map_or(1, |m| m + 1);
        let mut placement = Placement {
            names: (0..n).map(|j| if j == 0 { name.to_string() } else { format!("{name}.{j}") }).collect(),
            lens: vec![0; n],
            copies: (0..n).map(|_| Vec::new()).collect(),
            ..Default::default()
        };
        for (t, part) in initializers.iter_mut().zip(&parts) {
            placement.put(t, threshold, part.unwrap_or(0), placed);
        }
        let rest = for_each_tensor(g, &mut |t| Ok(placement.put(t, threshold, 0, placed)));
        g.initializer = initializers;
        rest?;
        Ok(placement)
    }

    /// Places one tensor in file `part`; whether it went to the data files.
    fn put(&mut self, t: &mut TensorProto, threshold: usize, part: usize, placed: &mut Vec<Placed>) -> bool {
        let range = FileRange::of(t);
        let len = match (&range, &t.raw_data) {
            (Some(r), _) => r.len,
            (None, Some(raw)) if raw.len() >= threshold => raw.len() as u64,
            _ => return false,
        };
        let end = &mut self.lens[part];
        let offset = *end + (ALIGN - *end % ALIGN) % ALIGN;
        *end = offset + len;
        let held = match range {
            Some(r) => {
                self.copies[part].push((Copy::Range(r.clone()), offset, len));
                Held::File(r)
            }
            None => {
                let raw = t.raw_data.take().unwrap_or_default();
                match file_of(&raw) {
                    Some((file, at)) => self.copies[part].push((Copy::Private(file, at), offset, len)),
                    None => self.memory.push((raw.clone(), offset)),
                }
                Held::Memory(raw.as_ptr() as usize, raw.len())
            }
        };
        placed.push(Placed { held, part, offset });
        t.raw_data = None;
        t.external_data = vec![
            kv("location", self.names[part].clone()),
            kv("offset", offset.to_string()),
            kv("length", len.to_string()),
        ];
        t.data_location = Some(DataLocation::External as i32);
        true
    }

    /// Bytes written from memory.
    pub fn from_memory(&self) -> u64 {
        self.memory.iter().map(|(b, _)| b.len() as u64).sum()
    }

    /// Writes the files (`files[j]` opened at `paths[j]`, for errors): the weights in memory,
    /// then the copies, the files side by side. Each source file is checked to be the file
    /// loaded before and after its copies.
    pub fn write(&self, files: &[File], paths: &[PathBuf]) -> Result<Copied> {
        let io = |j: usize| move |e: std::io::Error| Error::export(format!("cannot write {}: {e}", paths[j].display()));
        let mut out = Pending::new(&files[0]);
        for (b, offset) in &self.memory {
            out.write_at(b, *offset).map_err(io(0))?;
        }
        out.flush().map_err(io(0))?;
        for (j, f) in files.iter().enumerate() {
            f.set_len(self.lens[j]).map_err(io(j))?;
        }
        let copy_part = |j: usize| -> Result<Copied> {
            let mut done = Copied::default();
            let ranges = self.copies[j].iter().filter_map(|(c, to, _)| match c {
                Copy::Range(r) => Some((r, *to)),
                Copy::Private(..) => None,
            });
            for (first, items) in by_file(ranges) {
                done += Source::open(first)?.copy_into(&items, &files[j], &paths[j])?;
            }
            for (c, to, len) in &self.copies[j] {
                if let Copy::Private(src, at) = c {
                    done += Copier::new(src, &files[j]).copy(*at, *to, *len).map_err(io(j))?;
                }
            }
            Ok(done)
        };
        let parts: Vec<Result<Copied>> =
            crate::pool::install(|| (0..files.len()).into_par_iter().map(copy_part).collect());
        let mut done = Copied::default();
        for p in parts {
            done += p?;
        }
        Ok(done)
    }

    /// What the data files will hold, by (file, offset): each weight's bytes in memory, or
    /// where the kernel would copy them from. What the session cache's key reads (see
    /// `digest::model_digest`) without writing anything.
    pub fn pieces(&self) -> Vec<(usize, u64, Piece<'_>)> {
        let mut out: Vec<(usize, u64, Piece<'_>)> =
            self.memory.iter().map(|(b, at)| (0, *at, Piece::Memory(b))).collect();
        for (j, copies) in self.copies.iter().enumerate() {
            out.extend(copies.iter().map(|(c, at, len)| match c {
                Copy::Range(r) => (j, *at, Piece::Range(r)),
                Copy::Private(f, from) => (j, *at, Piece::Private(f, *from, *len)),
            }));
        }
        out.sort_by_key(|(j, at, _)| (*j, *at));
        out
    }

    /// The files' paths beside `model`.
    pub fn paths(&self, model: &Path) -> Vec<PathBuf> {
        self.names.iter().map(|n| model.with_file_name(n)).collect()
    }
}

/// The file each main-graph initializer goes to: large copies spread over up to `max_parts`
/// files (the largest first, each to the least filled), everything else in the first.
fn parts_for(initializers: &[TensorProto], threshold: usize, max_parts: usize) -> Vec<Option<usize>> {
    let copied = |t: &TensorProto| -> Option<u64> {
        if let Some(r) = FileRange::of(t) {
            return Some(r.len);
        }
        t.raw_data.as_ref().filter(|raw| raw.len() >= threshold && file_of(raw).is_some()).map(|raw| raw.len() as u64)
    };
    let sizes: Vec<Option<u64>> = initializers.iter().map(copied).collect();
    let total: u64 = sizes.iter().flatten().sum();
    let count = sizes.iter().flatten().count();
    let n = if total >= SPLIT_MIN { max_parts.min(count).max(1) } else { 1 };
    let mut load = vec![0u64; n];
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i].is_some()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut parts = vec![None; sizes.len()];
    for i in order {
        let j = (0..n).min_by_key(|&j| (load[j], j)).unwrap_or(0);
        load[j] += sizes[i].unwrap_or(0);
        parts[i] = Some(j);
    }
    parts
}

/// Writes from memory gathered into one buffer while they are contiguous, so that many small
/// weights cost a few system calls, not one each.
struct Pending<'f> {
    file: &'f File,
    buf: Vec<u8>,
    at: u64,
}

impl<'f> Pending<'f> {
    const CAPACITY: usize = 1 << 20;

    fn new(file: &'f File) -> Pending<'f> {
        Pending { file, buf: Vec::new(), at: 0 }
    }

    fn write_at(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let end = self.at + self.buf.len() as u64;
        if offset < end || offset - end >= ALIGN || self.buf.len() + data.len() > Self::CAPACITY {
            self.flush()?;
        }
        if data.len() >= Self::CAPACITY {
            return self.file.write_all_at(data, offset);
        }
        if self.buf.is_empty() {
            self.at = offset;
        }
        let gap = offset - (self.at + self.buf.len() as u64);
        self.buf.resize(self.buf.len() + gap as usize, 0);
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.at)?;
            self.buf.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranged(len: u64) -> TensorProto {
        let mut t = TensorProto::default();
        FileRange { path: "/m.onnx".into(), offset: 0, len, identity: String::new() }.put(&mut t);
        t
    }

    #[test]
    fn large_copies_are_spread_evenly_and_small_ones_stay_in_one_file() {
        let mb = 1 << 20;
        let mut ts: Vec<TensorProto> = [64, 16, 16, 16, 16, 8].iter().map(|&n| ranged(n * mb)).collect();
        ts.push(TensorProto { raw_data: Some(Bytes::from(vec![0u8; 4096])), ..Default::default() });
        assert_eq!(parts_for(&ts, 1024, 2), [Some(0), Some(1), Some(1), Some(1), Some(1), Some(0), None]);
        assert_eq!(parts_for(&ts, 1024, 1).iter().flatten().max(), Some(&0));
        let small: Vec<TensorProto> = (0..4).map(|_| ranged(mb)).collect();
        assert!(parts_for(&small, 1024, 8).iter().all(|p| *p == Some(0)), "below SPLIT_MIN: one file");
        let mut g = GraphProto { initializer: ts, ..Default::default() };
        let mut placed = Vec::new();
        let placement = Placement::place(&mut g, 1024, "d", 2, &mut placed).unwrap();
        assert_eq!(placement.names, ["d", "d.1"]);
        assert_eq!(placement.lens, [72 * mb + 4096, 64 * mb]);
        assert_eq!(placed.len(), 7);
        assert!(placed.iter().all(|p| p.offset % ALIGN == 0));
        let locations: Vec<&str> =
            g.initializer.iter().map(|t| t.external_data[0].value.as_deref().unwrap_or_default()).collect();
        assert_eq!(locations, ["d", "d.1", "d.1", "d.1", "d.1", "d", "d"]);
    }
}
