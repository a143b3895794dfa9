//! The layers of `rust/src`, checked on every `cargo test` (see `rust/src/lib.rs`):
//!
//! - every module belongs to a layer: the bottom (`error`, `near_miss`, `pool`,
//!   `allocator`) < `codec` < `storage` < `merge` < the top (`bindings`, `fuzzing`); the
//!   crate root (`lib.rs`) declares and re-exports, and nothing imports from it;
//! - no module imports one of a higher layer (`use crate::...`, `crate::x::y(...)`, `super::`
//!   and `self::` paths, paths through a child module, all resolved to the module that
//!   defines the item);
//! - no module imports another in a circle (the circle is printed);
//! - no hand-written file is over 700 lines (the unit tests at the bottom of a file and the
//!   generated protobuf code do not count).
//!
//! Test code (`#[cfg(test)]` modules) is left out: tests may use anything.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;
/// Generated files, included by a module rather than modules themselves.
const GENERATED: &[&str] = &["codec/proto/onnx.rs"];

fn layer(module: &str) -> (usize, &'static str) {
    match module.split("::").next().unwrap_or("") {
        "" => (5, "the crate root"),
        "error" | "near_miss" | "pool" | "allocator" => (0, "bottom"),
        "codec" => (1, "codec"),
        "storage" => (2, "storage"),
        "merge" => (3, "merge"),
        "bindings" | "fuzzing" => (4, "top"),
        _ => (usize::MAX, "no layer"),
    }
}

/// Source text with comments removed and string and char literals emptied.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let (ch, next) = (c[i], c.get(i + 1).copied());
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if ch == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(c.get(i.wrapping_sub(1))) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(ch);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                out.push_str("' '");
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(ch);
                i += 1;
            }
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
        } else if ident_char(Some(&c[i])) {
            let start = i;
            while ident_char(c.get(i)) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c[i].to_string());
            i += 1;
        }
    }
    out
}

/// The paths a use tree names, starting at `toks[*at]`, each as its segments.
fn use_tree(toks: &[String], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        match toks.get(*at).map(String::as_str) {
            Some("{") => {
                *at += 1;
                loop {
                    match toks.get(*at).map(String::as_str) {
                        Some("}") => {
                            *at += 1;
                            return;
                        }
                        Some(",") => *at += 1,
                        None => return,
                        _ => use_tree(toks, at, path.clone(), out),
                    }
                }
            }
            Some("*") => {
                *at += 1;
                out.push(path);
                return;
            }
            Some("::") => *at += 1,
            Some("self") if !path.is_empty() && toks.get(*at + 1).map(String::as_str) != Some("::") => {
                *at += 1;
                out.push(path);
                return;
            }
            Some(t) if ident_char(t.chars().next().as_ref()) && t != "as" => {
                path.push(t.to_string());
                *at += 1;
            }
            Some("as") => {
                *at += 2;
                out.push(path);
                return;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

struct File {
    module: String,
    path: PathBuf,
    /// The code before the unit tests at the bottom, comments and literals stripped.
    code: String,
    lines: usize,
    /// Child modules declared here (`mod x;`, `pub mod x;`), and those only for tests.
    children: BTreeSet<String>,
    test_children: BTreeSet<String>,
}

fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
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
        let rel = path.strip_prefix(src).unwrap();
        if GENERATED.iter().any(|g| rel == Path::new(g)) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let stripped = strip(&text);
        // The unit tests at the bottom: `#[cfg(test)]` then `mod name {`.
        let lines: Vec<&str> = stripped.lines().collect();
        let mut end = lines.len();
        let mut test_children = BTreeSet::new();
        for (k, l) in lines.iter().enumerate() {
            if l.trim() != "#[cfg(test)]" {
                continue;
            }
            let next = lines.get(k + 1).map_or("", |n| n.trim());
            let decl = next.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ") {
                let name = name.trim_end_matches(['{', ';', ' ']).to_string();
                if decl.ends_with('{') {
                    end = end.min(k);
                } else {
                    test_children.insert(name);
                }
            }
        }
        let code = lines[..end].join("\n");
        let toks = tokens(&code);
        let mut children = BTreeSet::new();
        for (k, t) in toks.iter().enumerate() {
            if t == "mod" && toks.get(k + 2).map(String::as_str) == Some(";") {
                children.insert(toks[k + 1].clone());
            }
        }
        files.push(File { module: module_of(rel), path: rel.to_path_buf(), code, lines: end, children, test_children });
    }
    files
}

/// The modules `file` imports, each with the path that names it.
fn imports(file: &File, modules: &BTreeSet<String>) -> Vec<(String, String)> {
    let toks = tokens(&file.code);
    let mut paths: Vec<Vec<String>> = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        let t = toks[k].as_str();
        let prev = if k == 0 { ";" } else { toks[k - 1].as_str() };
        if t == "use" && matches!(prev, ";" | "{" | "}" | "]" | ")" | "pub") {
            let mut at = k + 1;
            let mut tree = Vec::new();
            use_tree(&toks, &mut at, Vec::new(), &mut tree);
            paths.extend(tree);
            k = at;
            continue;
        }
        let starts_path = matches!(t, "crate" | "super" | "self") || file.children.contains(t);
        if starts_path && toks.get(k + 1).map(String::as_str) == Some("::") && prev != "::" {
            let mut path = vec![t.to_string()];
            let mut at = k + 1;
            while toks.get(at).map(String::as_str) == Some("::")
                && toks.get(at + 1).is_some_and(|s| ident_char(s.chars().next().as_ref()))
            {
                path.push(toks[at + 1].clone());
                at += 2;
            }
            paths.push(path);
            k = at;
            continue;
        }
        k += 1;
    }
    let here: Vec<String> =
        if file.module.is_empty() { Vec::new() } else { file.module.split("::").map(str::to_string).collect() };
    // A file `a/b.rs` is module a::b, and `super` is a; `a/b/mod.rs` is a::b too.
    let mut out = Vec::new();
    for path in paths {
        let mut abs: Vec<String> = match path.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") | Some("self") => here.clone(),
            Some(first) if file.children.contains(first) => here.clone(),
            _ => continue, // another crate, or a name of this module
        };
        let mut rest = &path[..];
        if rest.first().is_some_and(|s| s == "crate") {
            rest = &rest[1..];
        }
        while let Some(s) = rest.first() {
            match s.as_str() {
                "super" => {
                    abs.pop();
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        abs.extend(rest.iter().cloned());
        // The longest prefix that is a module defines the item.
        let mut target = String::new();
        for n in (0..=abs.len()).rev() {
            let m = abs[..n].join("::");
            if modules.contains(&m) {
                target = m;
                break;
            }
        }
        if target != file.module {
            out.push((target, path.join("::")));
        }
    }
    out
}

/// Tarjan's strongly connected components, as they are found.
#[derive(Default)]
struct Components {
    next: usize,
    /// Per module: (index, lowest index reachable).
    seen: BTreeMap<String, (usize, usize)>,
    stack: Vec<String>,
    on_stack: BTreeSet<String>,
    found: Vec<Vec<String>>,
}

impl Components {
    fn connect(&mut self, v: &str, graph: &BTreeMap<String, BTreeSet<String>>) {
        let index = self.next;
        self.next += 1;
        self.seen.insert(v.to_string(), (index, index));
        self.stack.push(v.to_string());
        self.on_stack.insert(v.to_string());
        for w in graph.get(v).into_iter().flatten() {
            let low = if !self.seen.contains_key(w) {
                self.connect(w, graph);
                self.seen[w].1
            } else if self.on_stack.contains(w) {
                self.seen[w].0
            } else {
                continue;
            };
            let entry = self.seen.get_mut(v).unwrap();
            entry.1 = entry.1.min(low);
        }
        if self.seen[v].0 == self.seen[v].1 {
            let mut component = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on_stack.remove(&w);
                let done = w == v;
                component.push(w);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                self.found.push(component);
            }
        }
    }
}

/// One circle per group of modules that import each other, as the modules it passes.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut c = Components::default();
    for v in graph.keys() {
        if !c.seen.contains_key(v) {
            c.connect(v, graph);
        }
    }
    c.found
        .into_iter()
        .map(|component| {
            let inside: BTreeSet<&String> = component.iter().collect();
            let start = component.iter().min().unwrap().clone();
            // Breadth-first from start back to start, inside the component.
            let mut prev: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start.clone()]);
            while let Some(v) = queue.pop_front() {
                for w in graph.get(&v).into_iter().flatten().filter(|w| inside.contains(w)) {
                    if *w == start {
                        let mut path = vec![start.clone(), v.clone()];
                        let mut at = v.clone();
                        while at != start {
                            at = prev[&at].clone();
                            path.push(at.clone());
                        }
                        path.reverse();
                        return path;
                    }
                    if !prev.contains_key(w) {
                        prev.insert(w.clone(), v.clone());
                        queue.push_back(w.clone());
                    }
                }
            }
            component
        })
        .collect()
}

/// Every problem with the layers of the crate whose sources are in `src`.
fn problems(src: &Path) -> Vec<String> {
    let files = read_files(src);
    let mut test_only: BTreeSet<String> = BTreeSet::new();
    for f in &files {
        for c in &f.test_children {
            test_only.insert(if f.module.is_empty() { c.clone() } else { format!("{}::{c}", f.module) });
        }
    }
    let files: Vec<File> = files.into_iter().filter(|f| !test_only.contains(&f.module)).collect();
    let modules: BTreeSet<String> = files.iter().map(|f| f.module.clone()).collect();
    let mut out = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let shown = f.path.display();
        if f.lines > MAX_LINES {
            out.push(format!("{shown}: {} lines before its tests (at most {MAX_LINES}): split it", f.lines));
        }
        let (mine, my_layer) = layer(&f.module);
        if mine == usize::MAX {
            out.push(format!(
                "{shown}: module {} is in no layer (add it to layer() in rust/tests/layers.rs)",
                f.module
            ));
        }
        for (target, named) in imports(f, &modules) {
            let (theirs, their_layer) = layer(&target);
            if target.is_empty() && !f.module.is_empty() {
                out.push(format!(
                    "{shown}: `{named}` goes through the crate root; import it from the module that defines it"
                ));
            } else if theirs > mine && !f.module.is_empty() {
                out.push(format!(
                    "{shown}: {} ({my_layer}) imports {target} ({their_layer}), a higher layer, through `{named}`",
                    f.module
                ));
            }
            graph.entry(f.module.clone()).or_default().insert(target);
        }
    }
    for circle in circles(&graph) {
        out.push(format!("modules import each other in a circle: {}", circle.join(" -> ")));
    }
    out
}

#[test]
fn layers_go_one_way_without_circles_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = problems(&src);
    assert!(found.is_empty(), "the layers of rust/src are broken:\n  {}", found.join("\n  "));
}

/// The check itself: a small crate with an upward import, a circle and a long file.
#[test]
fn the_check_finds_upward_imports_circles_and_long_files() {
    let dir = std::env::temp_dir().join(format!("fastseq-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod codec;\npub mod merge;\npub mod error;\n");
    write("error.rs", "pub struct Error;\n");
    write("codec/mod.rs", "pub mod model;\npub mod node;\n#[cfg(test)]\nmod testing;\n");
    // A circle through `super::` and a call path.
    write("codec/node.rs", "fn g() { super::model::f() }\n");
    write("merge/mod.rs", "pub mod plan;\n");
    write("merge/plan.rs", &format!("pub struct Plan;\n{}", "fn x() {}\n".repeat(MAX_LINES)));
    // Test code may use anything.
    write("codec/testing.rs", "use crate::merge::plan::Plan;\n");
    // Upward: codec reaches merge (inside a brace tree, past a comment and a string).
    write(
        "codec/model.rs",
        "// use crate::merge::x;\nuse crate::{error::Error, merge::plan::Plan};\n\
         pub fn f() { let _ = \"crate::merge\"; crate::codec::node::g() }\n\
         #[cfg(test)]\nmod tests {\n    use crate::merge::plan::Plan;\n}\n",
    );
    let found = problems(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let text = found.join("\n");
    assert!(text.contains("codec::model (codec) imports merge::plan (merge), a higher layer"), "{text}");
    assert!(text.contains("circle: codec::model -> codec::node -> codec::model"), "{text}");
    assert!(text.contains("merge/plan.rs: 701 lines before its tests"), "{text}");
    assert_eq!(found.len(), 3, "{text}");
}
