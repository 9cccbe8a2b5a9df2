//! The engine library's module layering, checked from its sources.
//!
//! Crate boundaries are compiler facts (kvcore-router and kvcore-tools see
//! only kvcore's public API). Inside the kvcore package the compiler does not
//! stop a module from using another, so this test reads every `crate::` and
//! `super::` path in `src/` (the router and tools packages excluded) and checks
//! the rules docs/architecture.md states:
//!
//! 1. the graph of top-level modules is acyclic (a module never depends, even
//!    through others, on a module that depends on it);
//! 2. inside each module folder the graph of its files is acyclic;
//! 3. a system never uses another system: files in `src/systems/` reach each
//!    other only through `systems/mod.rs`, which only the engine calls;
//! 4. nothing but the crate root names the C layer (`ffi`): the core never
//!    depends on the C ABI.
//!
//! Method: a small tokenizer skips comments and string literals, then every
//! path that starts with `crate::` or `super::` (including the items of a
//! `use crate::{a, b::c}` group) is resolved to the file's module and the
//! module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Folders under `src/` that are packages of their own.
const OTHER_PACKAGES: &[&str] = &["router", "tools"];

/// A source file's module path, e.g. `["gpu", "dma"]`; the crate root is `[]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source with comments, string and char literals blanked out, so that
/// paths quoted in docs or messages are not taken for uses.
fn code_only(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as 'a' (lifetimes have no closing quote).
            i += 3;
            out.push_str("' '");
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let end = b[i + 2..].iter().position(|&c| c == b'\'').map_or(b.len(), |p| i + 3 + p);
            i = end;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &[u8], mut i: usize) -> (String, usize) {
    let start = i;
    while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
        i += 1;
    }
    (String::from_utf8_lossy(&s[start..i]).into_owned(), i)
}

/// Reads a path from `i` (the first segment, after `crate::` or `super::`),
/// pushing every full path it names onto `out`, each prefixed with `prefix`:
/// `a::b::C` gives `prefix::a::b::C`, `a::{b, c::D}` gives `prefix::a::b` and
/// `prefix::a::c::D`. Returns where the path ends.
fn read_path(s: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        if s.get(i) == Some(&b'{') {
            i += 1;
            loop {
                while i < s.len() && (s[i].is_ascii_whitespace() || s[i] == b',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == b'}' {
                    return i + 1;
                }
                if s[i].is_ascii_alphabetic() || s[i] == b'_' || s[i] == b'{' {
                    i = read_path(s, i, &path, out);
                } else {
                    // `self`, `*`, `as` renames and the like: skip a token.
                    i += 1;
                }
            }
        }
        let (id, next) = ident_at(s, i);
        if id.is_empty() {
            out.push(path);
            return i;
        }
        path.push(id);
        i = next;
        if s[i..].starts_with(b"::") {
            i += 2;
        } else {
            // Skip an `as` rename so the group reader resumes after it.
            let rest = &s[i..];
            let ws = rest.iter().take_while(|c| c.is_ascii_whitespace()).count();
            if rest[ws..].starts_with(b"as ") {
                let (_, after) =
                    ident_at(s, i + ws + 3 + rest[ws + 3..].iter().take_while(|c| c.is_ascii_whitespace()).count());
                i = after;
            }
            out.push(path);
            return i;
        }
    }
}

/// Every path that `code` names through `crate::` or `super::`, resolved to a
/// path from the crate root, from the file's own module `here`.
fn references(code: &str, here: &[String]) -> BTreeSet<Vec<String>> {
    let s = code.as_bytes();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_' || s[i - 1] == b':');
        if boundary && s[i..].starts_with(b"crate::") {
            i = read_path(s, i + 7, &[], &mut paths);
        } else if boundary && s[i..].starts_with(b"super::") {
            let mut up = here.to_vec();
            while s[i..].starts_with(b"super::") {
                up.pop();
                i += 7;
            }
            i = read_path(s, i, &up, &mut paths);
        } else {
            i += 1;
        }
    }
    paths.into_iter().filter(|p| !p.is_empty()).collect()
}

struct Graph {
    /// File module → modules it names (each a path from the crate root).
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

impl Graph {
    fn load() -> Self {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut edges = BTreeMap::new();
        for f in files {
            let here = module_of(&src, &f);
            if here.first().is_some_and(|m| OTHER_PACKAGES.contains(&m.as_str())) {
                continue;
            }
            let code = code_only(&std::fs::read_to_string(&f).expect("read source"));
            let refs = references(&code, &here);
            edges.insert(here, refs);
        }
        Graph { edges }
    }

    /// Whether `m` (a path from the root) names a file module or something
    /// inside one; returns the longest file module that is a prefix of it.
    fn file_module<'a>(&'a self, m: &[String]) -> Option<&'a Vec<String>> {
        (1..=m.len()).rev().find_map(|n| self.edges.get_key_value(&m[..n]).map(|(k, _)| k))
    }

    /// The graph between the children of `parent` (a module folder, or the
    /// crate root for `[]`): child → the children it uses.
    fn between_children(&self, parent: &[String]) -> BTreeMap<String, BTreeSet<String>> {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let child = |m: &[String]| -> Option<String> {
            (m.len() > parent.len() && m[..parent.len()] == *parent).then(|| m[parent.len()].clone())
        };
        for (file, refs) in &self.edges {
            let Some(from) = child(file) else { continue };
            g.entry(from.clone()).or_default();
            for r in refs {
                let Some(target) = self.file_module(r) else { continue };
                if let Some(to) = child(target)
                    && to != from
                {
                    g.get_mut(&from).expect("inserted").insert(to);
                }
            }
        }
        g
    }
}

/// A cycle in `g`, as the list of nodes along it, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).expect("on the stack");
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = visit(n, g, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn top_level_modules_form_no_cycle() {
    let g = Graph::load().between_children(&[]);
    assert!(g.contains_key("engine") && g.contains_key("systems"), "the module graph was read: {g:?}");
    if let Some(c) = find_cycle(&g) {
        panic!("top-level modules of kvcore use each other in a cycle: {}", c.join(" -> "));
    }
}

#[test]
fn files_inside_each_folder_form_no_cycle() {
    let graph = Graph::load();
    let folders: BTreeSet<Vec<String>> =
        graph.edges.keys().filter(|m| m.len() >= 2).map(|m| m[..m.len() - 1].to_vec()).collect();
    for folder in folders {
        let g = graph.between_children(&folder);
        if let Some(c) = find_cycle(&g) {
            panic!("files of src/{} use each other in a cycle: {}", folder.join("/"), c.join(" -> "));
        }
    }
}

#[test]
fn systems_never_use_each_other() {
    let graph = Graph::load();
    for (file, refs) in &graph.edges {
        if file.len() != 2 || file[0] != "systems" {
            continue;
        }
        for r in refs {
            if r.len() >= 2 && r[0] == "systems" && r[1] != file[1] {
                panic!("src/systems/{}.rs uses {}: a system never calls another system", file[1], r.join("::"));
            }
        }
    }
}

#[test]
fn only_the_crate_root_names_the_c_layer() {
    let graph = Graph::load();
    for (file, refs) in &graph.edges {
        if file.is_empty() || file[0] == "ffi" {
            continue;
        }
        if let Some(r) = refs.iter().find(|r| r.first().is_some_and(|m| m == "ffi")) {
            panic!("src/{}.rs uses {}: the core never depends on the C ABI", file.join("/"), r.join("::"));
        }
    }
}

#[test]
fn the_reader_resolves_paths() {
    // Goal: the checks above read what they claim. Method: a made-up file in
    // module `a::b` naming paths in every supported form, comments and
    // strings included, must yield exactly the modules the code names.
    let code = code_only(
        "use crate::x::Y;\nuse crate::{p::Q, r};\nuse super::{s, t::U};\nfn f() { super::super::w::g(); }\n\
         use crate::systems::{admit::f as g};\n\
         // crate::comment::Z\nconst S: &str = \"crate::string::Z\";\nlet c = '\"'; crate::after_char::h();\n",
    );
    let here = vec!["a".to_owned(), "b".to_owned()];
    let got: Vec<String> = references(&code, &here).into_iter().map(|m| m.join("::")).collect();
    assert_eq!(got, ["a::s", "a::t::U", "after_char::h", "p::Q", "r", "systems::admit::f", "w::g", "x::Y"]);
}
