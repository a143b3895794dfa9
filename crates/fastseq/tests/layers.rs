//! What Cargo cannot check about the layers of `src/` (Cargo keeps the bindings crate above
//! the core: the core cannot name it). Checked on every `cargo test` (see `src/lib.rs`):
//!
//! - each folder is a layer, and a layer names only the layers it stands on: the base
//!   (`error`, `near_miss`, `pool`, `allocator`) < `codec` < `storage` and `merge`, side by
//!   side (neither names the other: merge takes decoded models and an injected weight reader)
//!   < `pipeline` (load, compose, write) < `fuzzing`; the crate root declares and re-exports;
//! - no file names another in a circle, file by file;
//! - no hand-written file is over 700 lines before its unit tests;
//! - `docs/architecture.md`'s Rust table lists every module in its layer's row, the rows in
//!   this order, and its picture (`docs/architecture.dot`) draws no arrow the layers forbid.
//!
//! The bindings (`crates/fastseq-python/src`, one layer: each file converts one concept) are
//! checked the same way for circles, `super::` paths and long files: a file that needs what
//! two others share asks a third, it does not name them both ways.
//!
//! A file names a module by a `crate::` path, in code or in a doc link: both break when the
//! module moves, so a doc link up a layer or around a circle counts like an import. The
//! sources use `crate::` paths only (`super::` only in unit tests), which keeps this a scan
//! of paths, not a resolver. Unit tests (`#[cfg(test)]` at the bottom of a file, and modules
//! declared for tests only) may name anything.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;
/// Generated files, included by a module rather than written by hand.
const GENERATED: &[&str] = &["codec/proto/onnx.rs"];

/// What [`layer`] says: a module's layer and the layers it may name.
type Layer = Option<(&'static str, &'static [&'static str])>;

/// The layer of a module's first segment, and the layers it may name.
fn layer(first: &str) -> Layer {
    const BASE: &[&str] = &["base"];
    Some(match first {
        "error" | "near_miss" | "pool" | "allocator" => ("base", BASE),
        "codec" => ("codec", BASE),
        "storage" => ("storage", &["base", "codec"]),
        "merge" => ("merge", &["base", "codec"]),
        "pipeline" => ("pipeline", &["base", "codec", "storage", "merge"]),
        "fuzzing" => ("fuzzing", &["base", "codec", "storage", "merge", "pipeline"]),
        _ => return None,
    })
}

/// The layers bottom to top, as `docs/architecture.md` lists them: each names only layers
/// before it.
const ORDER: &[&str] = &["base", "codec", "storage", "merge", "pipeline", "fuzzing"];

struct File {
    module: String,
    path: PathBuf,
    /// The text before the unit tests at the bottom.
    text: String,
    lines: usize,
    /// Modules it declares for tests only (`#[cfg(test)] mod testing;`).
    test_children: Vec<String>,
}

fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    if !matches!(last.as_str(), "lib.rs" | "mod.rs") {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts.join("::")
}

fn read_files(src: &Path) -> Vec<File> {
    let mut paths = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                paths.push(p);
            }
        }
    }
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let rel = path.strip_prefix(src).unwrap().to_path_buf();
        if GENERATED.iter().any(|g| rel == Path::new(g)) {
            continue;
        }
        let all = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = all.lines().collect();
        let mut end = lines.len();
        let mut test_children = Vec::new();
        for (k, l) in lines.iter().enumerate() {
            if l.trim() != "#[cfg(test)]" {
                continue;
            }
            let next = lines.get(k + 1).map_or("", |n| n.trim());
            let decl = next.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ") {
                if decl.ends_with('{') {
                    end = end.min(k);
                } else {
                    test_children.push(name.trim_end_matches(';').to_string());
                }
            }
        }
        let text = lines[..end].join("\n");
        files.push(File { module: module_of(&rel), path: rel, text, lines: end, test_children });
    }
    files
}

fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after each `crate::` in `text` (code and comments alike), a `{...}` group
/// expanded into one path per item.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    fn tree(s: &[char], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            if s.get(*at) == Some(&'{') {
                *at += 1;
                loop {
                    while s.get(*at).is_some_and(|c| c.is_whitespace() || *c == ',') {
                        *at += 1;
                    }
                    match s.get(*at) {
                        Some('}') | None => {
                            *at += 1;
                            return;
                        }
                        _ => tree(s, at, path.clone(), out),
                    }
                }
            }
            let start = *at;
            while *at < s.len() && ident(s[*at]) {
                *at += 1;
            }
            if *at > start {
                path.push(s[start..*at].iter().collect());
            }
            if s.get(*at) == Some(&':') && s.get(*at + 1) == Some(&':') {
                *at += 2;
                continue;
            }
            out.push(path);
            return;
        }
    }
    let s: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 7 <= s.len() {
        if s[i..i + 7].iter().collect::<String>() == "crate::" && (i == 0 || !ident(s[i - 1])) {
            let mut at = i + 7;
            tree(&s, &mut at, Vec::new(), &mut out);
            i = at.max(i + 7);
        } else {
            i += 1;
        }
    }
    out
}

/// The bindings' one layer: every file may name every other, but not in a circle.
fn bindings_layer(_first: &str) -> Layer {
    Some(("bindings", &["bindings"]))
}

/// The server crate's layers (`crates/fastseq-serve/src`): the base (a request's failure,
/// the tensors, the metrics) < the protocol and batching, side by side (neither names the
/// other: a decoded request is the base's `InferRequest`) < the service < the transports.
fn serve_layer(first: &str) -> Layer {
    const BASE: &[&str] = &["base"];
    Some(match first {
        "error" | "tensor" | "metrics" => ("base", BASE),
        "protocol" => ("protocol", BASE),
        "batching" => ("batching", BASE),
        "service" => ("service", &["base", "batching"]),
        "transport" => ("transport", &["base", "protocol", "batching", "service"]),
        _ => return None,
    })
}

/// Every problem with the layers of the crate whose sources are in `src`, each module's
/// layer as `layer` says.
fn problems(src: &Path, layer: fn(&str) -> Layer) -> Vec<String> {
    let files = read_files(src);
    let test_only: BTreeSet<String> = files
        .iter()
        .flat_map(|f| f.test_children.iter().map(move |c| [f.module.as_str(), c].join("::").trim_matches(':').into()))
        .collect();
    let files: Vec<&File> = files.iter().filter(|f| !test_only.contains(&f.module)).collect();
    let modules: BTreeSet<&str> = files.iter().map(|f| f.module.as_str()).collect();
    let mut out = Vec::new();
    let mut graph: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let shown = f.path.display();
        if f.lines > MAX_LINES {
            out.push(format!("{shown}: {} lines before its tests (at most {MAX_LINES}): split it", f.lines));
        }
        if f.module.is_empty() {
            continue; // the crate root declares and re-exports
        }
        let first = f.module.split("::").next().unwrap_or_default();
        let Some((mine, may)) = layer(first) else {
            out.push(format!("{shown}: {} is in no layer (add its folder to layer() in tests/layers.rs)", f.module));
            continue;
        };
        if f.text.contains("super::") {
            out.push(format!("{shown}: a `super::` path outside the unit tests; name modules by `crate::` paths"));
        }
        for path in crate_paths(&f.text) {
            // The longest prefix that is a module is the module named.
            let target = (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m.as_str()));
            let Some(target) = target else { continue };
            if target == f.module {
                continue;
            }
            let theirs = layer(path[0].as_str()).map_or("no layer", |l| l.0);
            if theirs != mine && !may.contains(&theirs) {
                out.push(format!(
                    "{shown}: {} ({mine}) names {target} ({theirs}) through `crate::{}`",
                    f.module,
                    path.join("::")
                ));
            }
            graph.entry(f.module.as_str()).or_default().insert(target);
        }
    }
    for circle in circles(&graph) {
        out.push(format!("files name each other in a circle: {}", circle.join(" -> ")));
    }
    out
}

/// One circle through each module that can reach itself, shortest first found.
fn circles(graph: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut seen_in: BTreeSet<String> = BTreeSet::new();
    for &start in graph.keys() {
        if seen_in.contains(start) {
            continue;
        }
        // Breadth first from start, back to start.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.to_string()]);
        'search: while let Some(v) = queue.pop_front() {
            for w in graph.get(v.as_str()).into_iter().flatten() {
                if w == start {
                    let mut path = vec![start.to_string(), v.clone()];
                    let mut at = v.clone();
                    while at != start {
                        at = prev[&at].clone();
                        path.push(at.clone());
                    }
                    path.reverse();
                    seen_in.extend(path.iter().cloned());
                    found.push(path);
                    break 'search;
                }
                if !prev.contains_key(w) {
                    prev.insert(w.clone(), v.clone());
                    queue.push_back(w.clone());
                }
            }
        }
    }
    found
}

#[test]
fn each_layer_names_only_layers_below_it() {
    for (k, name) in ORDER.iter().enumerate() {
        let first = if *name == "base" { "error" } else { name };
        let (mine, may) = layer(first).unwrap();
        assert_eq!(mine, *name);
        assert!(may.iter().all(|m| ORDER[..=k].contains(m)), "{name} may name {may:?}");
    }
}

#[test]
fn layers_go_one_way_without_circles_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = problems(&src, layer);
    assert!(found.is_empty(), "the layers of crates/fastseq/src are broken:\n  {}", found.join("\n  "));
}

/// The bindings crate, file by file: `composed` named `sources` (for sharing a `bytes`
/// buffer) while `sources` named `composed` (for its class): a circle, now a third file.
#[test]
fn the_bindings_name_each_other_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fastseq-python/src");
    let found = problems(&src, bindings_layer);
    assert!(found.is_empty(), "the files of crates/fastseq-python/src are broken:\n  {}", found.join("\n  "));
}

/// The server crate's table in `docs/architecture.md` lists each of its modules in the row of
/// the layer [`serve_layer`] puts it in.
#[test]
fn the_architecture_page_lists_the_server_crate_by_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let section = page.split("\n### The request path").nth(1).expect("a '### The request path' section");
    let section = section.split("\n## ").next().unwrap();
    let mut listed = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| layer")) {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        for m in cells[1].split('`').skip(1).step_by(2) {
            listed.insert(m.trim_end_matches('/').to_string(), cells[0].to_string());
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fastseq-serve/src");
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        let m = entry.path().file_stem().unwrap().to_string_lossy().into_owned();
        if m == "lib" {
            continue;
        }
        let want = serve_layer(&m).map(|l| l.0.to_string());
        assert_eq!(listed.get(&m), want.as_ref(), "docs/architecture.md's server table, module {m}");
    }
}

/// The server crate, layer by layer and file by file.
#[test]
fn the_server_crate_goes_one_way_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fastseq-serve/src");
    let found = problems(&src, serve_layer);
    assert!(found.is_empty(), "the layers of crates/fastseq-serve/src are broken:\n  {}", found.join("\n  "));
}

/// The Rust table of `docs/architecture.md` and its picture say what the crate is: a row
/// per layer in [`ORDER`], each module of `src/` in its layer's row, the bindings' files in
/// theirs; and the picture draws no arrow that [`layer`] forbids (merge -> storage, say).
#[test]
fn the_architecture_page_draws_the_crate_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rust = page.split("\n## Rust").nth(1).expect("a '## Rust' section").split("\n## ").next().unwrap();
    // The core's table comes first; the server crate's has a section of its own (below).
    let section = rust.split("\n### ").next().unwrap();
    let rows: Vec<Vec<&str>> = section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| layer"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`').skip(1).step_by(2).map(|t| t.trim_end_matches('/').to_string()).collect()
    };
    let layers: Vec<&str> = rows.iter().map(|r| r[0]).filter(|l| *l != "bindings").collect();
    assert_eq!(layers, ORDER, "the rows of the Rust table, bottom to top");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .map(|e| e.path().file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "lib")
        .collect();
    for row in rows.iter().filter(|r| r[0] != "bindings") {
        for m in ticked(row[1]) {
            assert!(modules.remove(&m), "docs/architecture.md lists `{m}`, which src/ does not have (or twice)");
            assert_eq!(layer(&m).map(|l| l.0), Some(row[0]), "`{m}` is in the {} row", row[0]);
        }
    }
    assert!(modules.is_empty(), "modules of src/ the Rust table does not list: {modules:?}");
    let bindings = root.join("crates/fastseq-python/src");
    let mut files: BTreeSet<String> = std::fs::read_dir(&bindings)
        .unwrap()
        .flatten()
        .map(|e| e.path().file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "lib")
        .collect();
    let row = rows.iter().find(|r| r[0] == "bindings").expect("a bindings row");
    for f in ticked(row[1]).into_iter().skip(1) {
        assert!(files.remove(&f), "the bindings row lists `{f}`, which {} does not have", bindings.display());
    }
    assert!(files.is_empty(), "files of the bindings the table does not list: {files:?}");

    // The picture: nodes of the core's cluster named after their layer ("rbase": the base).
    let dot = std::fs::read_to_string(root.join("docs/architecture.dot")).unwrap();
    let node = |n: &str| match n.trim() {
        "rbase" => Some("base"),
        n => ORDER.iter().find(|l| **l == n).copied(),
    };
    let mut drawn = 0;
    for line in dot.lines().filter(|l| l.contains("->")) {
        for statement in line.split(';') {
            let chain: Vec<&str> = statement.split("->").map(|n| n.split('[').next().unwrap().trim()).collect();
            for pair in chain.windows(2) {
                let (Some(a), Some(b)) = (node(pair[0]), node(pair[1])) else { continue };
                let (_, may) = layer(if a == "base" { "error" } else { a }).unwrap();
                assert!(may.contains(&b), "docs/architecture.dot draws {a} -> {b}, which the layers forbid");
                drawn += 1;
            }
        }
    }
    assert!(drawn >= 5, "the picture draws the core's layers: {drawn} arrows found");
}

/// The check itself: a small crate with a name up a layer, one across (storage and merge
/// stand side by side), a circle through a doc link, a `super::` path and a long file.
#[test]
fn the_check_finds_upward_names_circles_and_long_files() {
    let dir = std::env::temp_dir().join(format!("fastseq-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod codec;\npub mod merge;\npub mod storage;\npub mod error;\n");
    write("error.rs", "pub struct Error;\n");
    write("codec/mod.rs", "pub mod model;\npub mod node;\n#[cfg(test)]\nmod testing;\n");
    write("codec/node.rs", "//! Read by [`crate::codec::model`].\npub fn g() {}\n");
    write("merge/mod.rs", "pub mod plan;\n");
    write(
        "merge/plan.rs",
        &format!("use crate::storage::read;\npub struct Plan;\n{}", "fn x() {}\n".repeat(MAX_LINES)),
    );
    write("storage/mod.rs", "pub mod read;\n");
    write("storage/read.rs", "fn f() { super::read::f() }\n");
    // Test code may name anything.
    write("codec/testing.rs", "use crate::merge::plan::Plan;\n");
    write(
        "codec/model.rs",
        "use crate::{error::Error, merge::plan::Plan};\npub fn f() { crate::codec::node::g() }\n\
         #[cfg(test)]\nmod tests {\n    use crate::merge::plan::Plan;\n}\n",
    );
    let found = problems(&dir, layer);
    let _ = std::fs::remove_dir_all(&dir);
    let text = found.join("\n");
    assert!(
        text.contains("codec::model (codec) names merge::plan (merge) through `crate::merge::plan::Plan`"),
        "{text}"
    );
    assert!(text.contains("merge::plan (merge) names storage::read (storage)"), "{text}");
    assert!(text.contains("circle: codec::model -> codec::node -> codec::model"), "{text}");
    assert!(text.contains("storage/read.rs: a `super::` path"), "{text}");
    assert!(text.contains("merge/plan.rs: 702 lines before its tests"), "{text}");
    assert_eq!(found.len(), 5, "{text}");
}
