//! Times the phases of a merge in Rust alone, for profiling (`perf record`, callgrind):
//!
//!     cargo run --release --example profile_compose -- benches/out/cases/node_heavy 20
//!
//! Composes every `*.onnx` in the folder, in name order, `runs` times, and prints the time
//! of decoding, composing, saving (to a temporary folder) and freeing for each run. The
//! first run is the cold one that `benches/bench.py` measures. It calls the layers below the
//! pipeline (decode, merge, the writer) one by one, to time each; `fastseq::compose` does
//! the same job in one call.
use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

fn main() {
    fastseq::tune_allocator();
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: profile_compose FOLDER [RUNS]");
    let runs: usize = args.next().map_or(5, |s| s.parse().expect("RUNS is a number"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("a folder of .onnx files")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    let labels: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let out = tempfile::tempdir().unwrap();
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    for _ in 0..runs {
        let t0 = Instant::now();
        let models: Vec<_> = files
            .par_iter()
            .zip(labels.par_iter())
            .map(|(p, l)| fastseq::codec::model::decode(l, fastseq::storage::read::read_path(p).unwrap()).unwrap())
            .collect();
        let t1 = Instant::now();
        let merged = fastseq::merge::compose::compose(models, &labels, &Default::default()).unwrap().model;
        let t2 = Instant::now();
        fastseq::storage::writer::save(
            &merged,
            &out.path().join("merged.onnx"),
            None,
            false,
            fastseq::LAYOUT.threshold,
        )
        .unwrap();
        let t3 = Instant::now();
        drop(merged);
        let t4 = Instant::now();
        println!(
            "decode {:.1} ms, compose {:.1} ms, save {:.1} ms, free {:.1} ms",
            ms(t0, t1),
            ms(t1, t2),
            ms(t2, t3),
            ms(t3, t4)
        );
    }
}
