//! Weights that several stages hold byte for byte, stored once: grouped by type, dims and
//! size, then by a hash of sampled bytes, then compared whole.
use bytes::Bytes;
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::graph::{graph, vi_name};
use crate::codec::proto::ModelProto;
use crate::codec::range::FileRange;
use crate::codec::tensor::is_external;
use crate::merge::options::ReadWeight;
use crate::merge::plan::parts::{Plan, Target};

/// What deduplication saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deduped {
    pub initializers: usize,
    pub bytes: u64,
}

/// Bytes read from each end of a weight to tell most different weights of one size apart
/// without reading all of them.
const SAMPLE: usize = 4096;

/// Weights are hashed and compared this many bytes at a time (a weight still in its file
/// is read a chunk at a time, never held whole).
const CHUNK: usize = 1 << 20;

/// A weight's bytes: in memory, or still in its source file.
enum Contents<'m> {
    Memory(&'m Bytes),
    File(FileRange, ReadWeight),
}

impl Contents<'_> {
    fn len(&self) -> usize {
        match self {
            Contents::Memory(b) => b.len(),
            Contents::File(r, _) => r.len as usize,
        }
    }

    /// Calls `f` on the bytes in `[at, at + n)`, a chunk at a time; false when they cannot
    /// be read (a source file changed: the copy that follows says so).
    fn chunks(&self, at: usize, n: usize, f: &mut impl FnMut(&[u8])) -> bool {
        match self {
            Contents::Memory(b) => b[at..at + n].chunks(CHUNK).for_each(f),
            Contents::File(r, read) => {
                let mut buf = vec![0u8; n.min(CHUNK)];
                for start in (at..at + n).step_by(CHUNK) {
                    let k = (at + n - start).min(CHUNK);
                    if read(r, start as u64, &mut buf[..k]).is_err() {
                        return false;
                    }
                    f(&buf[..k]);
                }
            }
        }
        true
    }

    /// A hash of `[at, at + n)` fed chunk by chunk, the same for equal bytes in memory and
    /// in a file.
    fn hash(&self, parts: &[(usize, usize)], h: &mut impl std::hash::Hasher) -> bool {
        parts.iter().all(|&(at, n)| self.chunks(at, n, &mut |c| h.write(c)))
    }

    fn same_as(&self, other: &Contents<'_>) -> bool {
        if let (Contents::Memory(a), Contents::Memory(b)) = (self, other) {
            return a == b;
        }
        let n = self.len();
        (0..n).step_by(CHUNK).all(|at| {
            let k = (n - at).min(CHUNK);
            let mut mine = Vec::with_capacity(k);
            self.chunks(at, k, &mut |c| mine.extend_from_slice(c)) && {
                let mut equal = true;
                let mut pos = 0;
                other.chunks(at, k, &mut |c| {
                    equal &= mine[pos..pos + c.len()] == *c;
                    pos += c.len();
                }) && equal
            }
        })
    }
}

/// A hash of a sample of the weight's bytes (or all of them), or of all of them; None when
/// they cannot be read.
fn content_hash(c: &Contents<'_>, full: bool) -> Option<u64> {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    let n = c.len();
    let parts =
        if full || n <= 3 * SAMPLE { vec![(0, n)] } else { vec![(0, SAMPLE), (n / 2, SAMPLE), (n - SAMPLE, SAMPLE)] };
    c.hash(&parts, &mut h).then(|| h.finish())
}

/// Finds initializers that an earlier stage holds too (same element type, dims and bytes)
/// and makes each later one an alias of the first: its uses take the first one's name and
/// it is left out. Weights are grouped by type, dims and size, then by a hash of a sample,
/// then of all their bytes; equal hashes are confirmed byte for byte, in place (the bytes
/// are slices of the sources, never copied; weights still in their files are read through
/// `read` a chunk at a time, and without it left alone). Weights that are graph inputs
/// (IR < 4), outputs, exposed or fed by an edge are left alone, and so are the weights of a
/// model with training information and tensors in other external data.
pub fn dedupe(models: &[ModelProto], plan: &mut Plan, read: Option<ReadWeight>) -> Deduped {
    // (stage, index, bytes) of each candidate, grouped by (type, dims, size).
    let mut groups: FxHashMap<(i32, &[i64], usize), Vec<Weight>> = FxHashMap::default();
    for (k, m) in models.iter().enumerate() {
        // Training graphs update weights by name: two stages' weights must stay two.
        if !m.training_info.is_empty() {
            continue;
        }
        let g = graph(m);
        let io: FxHashSet<&str> = g.input.iter().chain(&g.output).map(vi_name).collect();
        for (x, t) in g.initializer.iter().enumerate() {
            let contents = match (FileRange::of(t), read, t.raw_data.as_ref()) {
                (Some(r), Some(read), _) => Contents::File(r, read),
                (None, _, Some(raw)) if !is_external(t) => Contents::Memory(raw),
                _ => continue,
            };
            let Some(name) = t.name.as_deref() else { continue };
            let kept = plan.kept.as_ref().is_none_or(|kept| kept.initializers[k][x]);
            if !kept || io.contains(name) || plan.pinned[k].contains_key(name) || plan.alias[k].contains_key(name) {
                continue;
            }
            groups.entry((t.data_type.unwrap_or(0), &t.dims, contents.len())).or_default().push((k, x, contents));
        }
    }
    // Only groups spanning several stages can save anything.
    let mut groups: Vec<Vec<Weight>> = groups.into_values().filter(|g| g.iter().any(|&(k, ..)| k != g[0].0)).collect();
    groups.sort_unstable_by_key(|g| (g[0].0, g[0].1));
    let mut saved = Deduped::default();
    let mut dropped: Vec<(usize, usize)> = Vec::new();
    for group in groups {
        for sub in split_by_hash(group, false) {
            // A weight small enough to be sampled whole needs no second hash.
            let subs = if sub[0].2.len() <= 3 * SAMPLE { vec![sub] } else { split_by_hash(sub, true) };
            for members in subs {
                // Members are in stage order: each is compared with the distinct contents seen so far.
                let mut keepers: Vec<Weight> = Vec::new();
                for (k, x, b) in members {
                    match keepers.iter().find(|(_, _, kb)| kb.same_as(&b)) {
                        Some(&(j, y, _)) if j < k => {
                            let keeper = graph(&models[j]).initializer[y].name.clone().unwrap_or_default();
                            let name = graph(&models[k]).initializer[x].name.clone().unwrap_or_default();
                            plan.alias[k].insert(name, Target::Value(j, keeper));
                            dropped.push((k, x));
                            saved.initializers += 1;
                            saved.bytes += b.len() as u64;
                        }
                        // The same bytes twice in one stage: left as they are.
                        Some(_) => {}
                        None => keepers.push((k, x, b)),
                    }
                }
            }
        }
    }
    if !dropped.is_empty() {
        let kept = plan.kept_mut(models);
        for (k, x) in dropped {
            kept.initializers[k][x] = false;
        }
    }
    saved
}

/// (stage, initializer index, its bytes).
type Weight<'m> = (usize, usize, Contents<'m>);

/// Splits a group of weights by a hash of a sample of their bytes, or of all of them;
/// keeps the parts that span several stages, in stage order. A weight that cannot be read
/// is left out (kept as it is).
fn split_by_hash(group: Vec<Weight<'_>>, full: bool) -> Vec<Vec<Weight<'_>>> {
    let hashes: Vec<Option<u64>> = group.par_iter().map(|(_, _, c)| content_hash(c, full)).collect();
    let mut by: FxHashMap<u64, Vec<Weight>> = FxHashMap::default();
    for (h, m) in hashes.into_iter().zip(group) {
        if let Some(h) = h {
            by.entry(h).or_default().push(m);
        }
    }
    let mut out: Vec<_> = by.into_values().filter(|g| g.iter().any(|&(k, ..)| k != g[0].0)).collect();
    out.sort_unstable_by_key(|g| (g[0].0, g[0].1));
    out
}

#[cfg(test)]
mod tests {
    use crate::merge::testing::*;

    #[test]
    fn identical_weights_are_stored_once() {
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("out", 2, "y")]);
        let c = compose(vec![scale(1), scale(1), distinct(5.0)], &labels(3), &opts).unwrap();
        assert_eq!(c.report.deduped, Deduped { initializers: 1, bytes: 16 });
        let g = c.model.graph.unwrap();
        assert_eq!(g.initializer.iter().map(|t| t.name.clone().unwrap()).collect::<Vec<_>>(), ["c", "m2/c"]);
        assert_eq!(node_at(&g, 2).input, ["y", "c"]);
        // Off on request, and off in the linear form unless asked.
        let off = Options { dedupe: Some(false), ..opts };
        assert_eq!(
            compose(vec![scale(1), scale(1), scale(1)], &labels(3), &off).unwrap().report.deduped.initializers,
            0
        );
        let linear = compose(vec![scale(1), scale(1)], &labels(2), &Options::default()).unwrap();
        assert_eq!(linear.model.graph.unwrap().initializer.len(), 2);
    }

    #[test]
    fn weights_equal_in_their_sampled_bytes_only_are_not_merged() {
        let big = |flip: bool| {
            let mut m = scale(1);
            let mut data = vec![7u8; 40_000];
            if flip {
                data[6_000] = 8; // outside the sampled ends and middle
            }
            let t = &mut m.graph.as_mut().unwrap().initializer[0];
            t.dims = vec![10_000];
            t.raw_data = Some(bytes::Bytes::from(data));
            m
        };
        let opts = Options { edges: Some(vec![]), ..Default::default() };
        let c = compose(vec![big(false), big(true), big(false)], &labels(3), &opts).unwrap();
        assert_eq!(c.report.deduped, Deduped { initializers: 1, bytes: 40_000 });
        let g = c.model.graph.unwrap();
        assert_eq!(node_at(&g, 4).input[1], "c");
        assert_eq!(node_at(&g, 2).input[1], "m1/c");
    }
}
