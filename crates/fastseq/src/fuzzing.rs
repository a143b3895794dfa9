//! What the fuzz targets (fuzz/) run, kept in the library so that `cargo test` replays the
//! corpus and every past crash through the very same code.
use bytes::Bytes;

use crate::codec::model;
use crate::merge::compose::compose;
use crate::merge::options::{Keep, Options};

/// Decodes `data` and, when it is a model, merges it with itself and round-trips the result.
/// Must never panic, whatever `data` is.
pub fn decode_and_merge(data: &[u8]) {
    let Ok(mut m) = model::decode("fuzz", Bytes::copy_from_slice(data)) else { return };
    let _ = crate::codec::summary::summary(&m);
    let _ = crate::storage::external::locations(&mut m);
    let stripped = model::strip_weights(&m, 16);
    let _ = model::restore_weights(stripped, &m, "fuzz");
    for keep in [Keep::Last, Keep::Unconsumed] {
        let opts = Options { keep_outputs: keep, ..Default::default() };
        if let Ok(merged) = compose(vec![m.clone(), m.clone()], &["a".into(), "b".into()], &opts).map(|c| c.model) {
            round_trip(&merged);
        }
    }
    let side_by_side =
        Options { io_maps: Some(vec![Some(vec![])]), keep_outputs: Keep::Unconsumed, ..Default::default() };
    if let Ok(merged) = compose(vec![m.clone(), m], &["a".into(), "b".into()], &side_by_side).map(|c| c.model) {
        round_trip(&merged);
    }
}

/// Splits `data` in two models and composes them. Must never panic.
pub fn compose_two(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let cut = (usize::from(data[0]) << 8 | usize::from(data[1])) % data.len().max(1);
    let (a, b) = data[2..].split_at(cut.min(data.len() - 2));
    let (Ok(a), Ok(b)) = (model::decode("a", Bytes::copy_from_slice(a)), model::decode("b", Bytes::copy_from_slice(b)))
    else {
        return;
    };
    for opts in [
        Options::default(),
        Options { keep_outputs: Keep::Unconsumed, ..Default::default() },
        Options { io_maps: Some(vec![Some(vec![])]), ..Default::default() },
        graph_form(&a, &b),
    ] {
        if let Ok(merged) = compose(vec![a.clone(), b.clone()], &["a".into(), "b".into()], &opts).map(|c| c.model) {
            round_trip(&merged);
        }
    }
}

/// The graph form: a's first output to b's first input, b's first output exposed, every
/// clean-up on (prune, dedupe, adapters).
fn graph_form(a: &crate::codec::proto::ModelProto, b: &crate::codec::proto::ModelProto) -> Options {
    let first = |m: &crate::codec::proto::ModelProto, outputs: bool| {
        let g = m.graph.as_ref();
        let list = g.map(|g| if outputs { &g.output } else { &g.input });
        list.and_then(|l| l.first()?.name.clone()).unwrap_or_default()
    };
    Options {
        edges: Some(vec![crate::merge::options::Edge {
            from: 0,
            output: first(a, true),
            to: 1,
            input: first(b, false),
        }]),
        graph_outputs: Some(vec![("out".into(), 1, first(b, true))]),
        adapt: crate::merge::options::Adapt::All,
        ..Default::default()
    }
}

/// A model file and its external data from one input (two bytes of cut, then the model,
/// then the bytes of `d.bin` beside it): loaded in place, linked and with its large weights
/// left in the files, exported with external data, loaded back. Must never panic; the loads
/// agree; what loads has the sizes its types and dims need; an export round-trips and leaves
/// only the files its model names. Returns whether the input loaded.
pub fn external_load_and_save(data: &[u8]) -> bool {
    use crate::storage::external::{self, Mode};
    if data.len() < 2 {
        return false;
    }
    let cut = (usize::from(data[0]) << 8 | usize::from(data[1])) % (data.len() - 1);
    let (model_bytes, data_bytes) = data[2..].split_at(cut.min(data.len() - 2));
    let Some(scratch) = Scratch::new() else { return false };
    let dir = scratch.0.as_path();
    let (model_path, data_path) = (dir.join("m.onnx"), dir.join("d.bin"));
    if std::fs::write(&model_path, model_bytes).is_err() || std::fs::write(&data_path, data_bytes).is_err() {
        return false;
    }
    let load = |mode: Mode| -> crate::error::Result<crate::codec::proto::ModelProto> {
        let mut m = model::decode("fuzz", crate::storage::read::read_path(&model_path)?)?;
        external::resolve(&mut m, dir, dir, "fuzz", mode)?;
        Ok(m)
    };
    let (in_place, linked) = (load(Mode::InPlace), load(Mode::Link));
    let ranged = crate::storage::source::load(
        "fuzz",
        crate::storage::source::Source::Path(model_path.clone(), Some(dir.to_path_buf())),
        Mode::Range,
    );
    assert_eq!(in_place.is_ok(), linked.is_ok(), "reading and linking judge external data alike");
    assert_eq!(in_place.is_ok(), ranged.is_ok(), "reading and leaving weights in the files judge alike");
    let (Ok(mut m), Ok(linked), Ok(ranged)) = (in_place, linked, ranged) else { return false };
    assert!(!external::has_external(&mut m), "in place, no tensor stays external");
    external::check_sources(&linked).expect("nothing changed since the load");
    let read_back = crate::storage::ranges::inline(&ranged).expect("nothing changed since the load");
    assert_eq!(*read_back, m, "weights left in the files read back as read in place");
    for (source, is_linked, out) in [(&m, false, "o.onnx"), (&linked, true, "l.onnx"), (&ranged, false, "r.onnx")] {
        let target = dir.join(out);
        if crate::storage::writer::save(source, &target, Some(true), is_linked, 0).is_err() {
            continue;
        }
        let mut back =
            model::decode("back", crate::storage::read::read_path(&target).unwrap()).expect("our output decodes");
        external::resolve(&mut back, dir, dir, "back", Mode::InPlace).expect("our output loads");
        let weights = |g: &crate::codec::proto::ModelProto| -> Vec<Option<bytes::Bytes>> {
            g.graph.iter().flat_map(|g| g.initializer.iter().map(|t| t.raw_data.clone())).collect()
        };
        assert_eq!(weights(&back), weights(&m), "an export with external data round-trips");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.starts_with(out))
            .collect();
        files.sort();
        let mut expected: Vec<String> =
            external::locations(&mut model::decode("back", crate::storage::read::read_path(&target).unwrap()).unwrap());
        expected.push(out.to_string());
        expected.sort();
        assert_eq!(files, expected, "the export left exactly its model and the files it names");
    }
    true
}

/// A fresh folder for one input, in memory where the system has one (fsync is then free),
/// removed afterwards.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Option<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let name = format!("fastseq-fuzz-{}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed));
        let dir = base.join(name);
        std::fs::create_dir(&dir).ok().map(|()| Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn round_trip(merged: &crate::codec::proto::ModelProto) {
    let mut out = Vec::new();
    crate::codec::stream::write_streaming(merged, &mut out).expect("writing to memory cannot fail");
    let back =
        <crate::codec::proto::ModelProto as prost::Message>::decode(Bytes::from(out)).expect("our output decodes");
    // Compared as canonical bytes: NaN weights are equal bit for bit, not as floats.
    assert!(
        prost::Message::encode_to_vec(&back) == prost::Message::encode_to_vec(merged),
        "streamed encoding round-trips"
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every file of the fuzz corpus and every past crash, through every target.
    #[test]
    fn corpus_and_regressions_never_panic() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut seen = 0;
        for dir in ["corpus/decode", "corpus/compose_two", "corpus/external", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                super::decode_and_merge(&data);
                super::compose_two(&data);
                let _ = super::external_load_and_save(&data);
                seen += 1;
            }
        }
        assert!(seen >= 5, "the corpus is in fuzz/corpus: {seen} files");
    }

    /// The external-data seeds are real models with their data: each loads, so the
    /// target reaches the export and the round trip.
    #[test]
    fn external_seeds_load_and_round_trip() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/external");
        let mut loaded = 0;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let data = std::fs::read(e.path()).unwrap();
            assert!(super::external_load_and_save(&data), "{} loads", e.path().display());
            loaded += 1;
        }
        assert!(loaded >= 5);
    }
}
