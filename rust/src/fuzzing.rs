//! What the fuzz targets (fuzz/) run, kept in the library so that `cargo test` replays the
//! corpus and every past crash through the very same code.
use bytes::Bytes;

use crate::compose::{compose, Keep, Options};
use crate::model;

/// Decodes `data` and, when it is a model, merges it with itself and round-trips the result.
/// Must never panic, whatever `data` is.
pub fn decode_and_merge(data: &[u8]) {
    let Ok(mut m) = model::decode("fuzz", Bytes::copy_from_slice(data)) else { return };
    let _ = model::summary(&m);
    let _ = crate::external::locations(&mut m);
    let stripped = model::strip_weights(&m, 16);
    let _ = model::restore_weights(stripped, &m, "fuzz");
    for keep in [Keep::Last, Keep::Unconsumed] {
        let opts = Options { keep_outputs: keep, ..Default::default() };
        if let Ok(merged) = compose(vec![m.clone(), m.clone()], &["a".into(), "b".into()], &opts) {
            round_trip(&merged);
        }
    }
    let side_by_side = Options { io_maps: Some(vec![vec![]]), keep_outputs: Keep::Unconsumed, ..Default::default() };
    if let Ok(merged) = compose(vec![m.clone(), m], &["a".into(), "b".into()], &side_by_side) {
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
        Options { io_maps: Some(vec![vec![]]), ..Default::default() },
        graph_form(&a, &b),
    ] {
        if let Ok(merged) = compose(vec![a.clone(), b.clone()], &["a".into(), "b".into()], &opts) {
            round_trip(&merged);
        }
    }
}

/// The graph form: a's first output to b's first input, b's first output exposed, every
/// clean-up on (prune, dedupe, adapters).
fn graph_form(a: &crate::proto::ModelProto, b: &crate::proto::ModelProto) -> Options {
    let first = |m: &crate::proto::ModelProto, outputs: bool| {
        let g = m.graph.as_ref();
        let list = g.map(|g| if outputs { &g.output } else { &g.input });
        list.and_then(|l| l.first()?.name.clone()).unwrap_or_default()
    };
    Options {
        edges: Some(vec![crate::Edge { from: 0, output: first(a, true), to: 1, input: first(b, false) }]),
        graph_outputs: Some(vec![("out".into(), 1, first(b, true))]),
        adapt: crate::Adapt::All,
        ..Default::default()
    }
}

fn round_trip(merged: &crate::proto::ModelProto) {
    let mut out = Vec::new();
    model::write_streaming(merged, &mut out).expect("writing to memory cannot fail");
    let back = <crate::proto::ModelProto as prost::Message>::decode(Bytes::from(out)).expect("our output decodes");
    // Compared as canonical bytes: NaN weights are equal bit for bit, not as floats.
    assert!(
        prost::Message::encode_to_vec(&back) == prost::Message::encode_to_vec(merged),
        "streamed encoding round-trips"
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every file of the fuzz corpus and every past crash, through both targets.
    #[test]
    fn corpus_and_regressions_never_panic() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut seen = 0;
        for dir in ["corpus/decode", "corpus/compose_two", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                super::decode_and_merge(&data);
                super::compose_two(&data);
                seen += 1;
            }
        }
        assert!(seen >= 5, "the corpus is in fuzz/corpus: {seen} files");
    }
}
