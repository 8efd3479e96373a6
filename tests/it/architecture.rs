//! The structure docs/ARCHITECTURE.md promises, checked on the source itself:
//! - dependencies point one way, down the layers (cli -> commands -> rewrite ->
//!   {host, measure, report, sim} -> engine -> options -> support/sys), and no module
//!   imports, directly or through others, a module that imports it;
//! - nothing but the command line layer sees clap or `crate::cli`;
//! - no function outside tests is longer than a screen (60 lines), except those listed
//!   with the reason.
//!
//! The check reads `src/` as text: `crate::a::b` and `super::` paths, resolved to the
//! longest module that exists. It needs no root and no build of the binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of a module, by its first path segment. A module may use modules of its own
/// layer or below; a cycle is caught separately.
fn layer(module: &str) -> u32 {
    match module.split("::").next().unwrap_or("") {
        "support" | "sys" => 0,
        "options" => 1,
        "engine" => 2,
        "host" | "measure" | "report" | "sim" => 3,
        "rewrite" => 4,
        "commands" => 5,
        "cli" => 6,
        other => panic!("module {other} has no layer: add it to layer() and to docs/ARCHITECTURE.md"),
    }
}

/// Functions allowed over 60 lines, with the reason. Keep this short.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

/// Modules allowed to name clap or `crate::cli` besides the cli layer itself.
const CLI_USERS: &[&str] = &[];

const MAX_FUNCTION_LINES: usize = 60;

struct Source {
    module: String,
    path: PathBuf,
    /// The file without its `#[cfg(test)] mod tests` and comment lines.
    code: Vec<String>,
}

fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap();
                // src/tests/ is test code (unit tests of the parts together), like a
                // module's `mod tests`.
                if rel == Path::new("main.rs") || rel == Path::new("lib.rs") || rel.starts_with("tests") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                out.push(Source { module: module_of(rel), path, code: without_tests(&text) });
            }
        }
    }
    out.sort_by(|a, b| a.module.cmp(&b.module));
    out
}

/// The lines before a `#[cfg(test)]` that opens a test module, comments blanked (so line
/// numbers still match the file).
fn without_tests(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut end = lines.len();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|n| n.trim_start().starts_with("mod tests")) {
            end = i;
            break;
        }
    }
    lines[..end].iter().map(|l| if l.trim_start().starts_with("//") { String::new() } else { l.to_string() }).collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts with `anchor` (`crate::` or `super::`), as its segments; grouped
/// imports (`crate::a::{b, c::d}`) give one path per member.
fn paths_after(code: &str, anchor: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(anchor) {
        let before_ok = at == 0 || !is_ident(rest[..at].chars().last().unwrap());
        rest = &rest[at + anchor.len()..];
        if !before_ok {
            continue;
        }
        let mut segs = Vec::new();
        let mut s = rest;
        loop {
            let n = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
            if n == 0 {
                break;
            }
            segs.push(s[..n].to_string());
            s = &s[n..];
            if let Some(t) = s.strip_prefix("::") {
                s = t;
                if let Some(group) = s.strip_prefix('{') {
                    let close = group.find('}').unwrap_or(group.len());
                    for member in group[..close].split(',') {
                        let mut p = segs.clone();
                        p.extend(member.trim().split("::").filter(|x| !x.is_empty()).map(String::from));
                        out.push(p);
                    }
                    segs.clear();
                    break;
                }
            } else {
                break;
            }
        }
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

fn dependency_graph(srcs: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&str> = srcs.iter().map(|s| s.module.as_str()).collect();
    let resolve = |segs: &[String]| -> Option<String> {
        (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|m| modules.contains(m.as_str()))
    };
    let mut graph = BTreeMap::new();
    for s in srcs {
        let code = s.code.join("\n");
        let mut deps = BTreeSet::new();
        let parent: Vec<String> = {
            let mut p: Vec<String> = s.module.split("::").map(String::from).collect();
            let is_dir = s.path.file_name().is_some_and(|f| f == "mod.rs");
            if !is_dir {
                p.pop();
            }
            p.pop();
            p
        };
        let mut all = paths_after(&code, "crate::");
        all.extend(paths_after(&code, "super::").into_iter().map(|tail| [parent.clone(), tail].concat()));
        for p in all {
            if let Some(m) = resolve(&p) {
                // A module's own children and itself are not dependencies.
                if m != s.module && !m.starts_with(&format!("{}::", s.module)) {
                    deps.insert(m);
                }
            }
        }
        graph.insert(s.module.clone(), deps);
    }
    graph
}

#[test]
fn dependencies_point_down_the_layers() {
    let graph = dependency_graph(&sources());
    let mut wrong = Vec::new();
    for (m, deps) in &graph {
        for d in deps {
            if layer(d) > layer(m) {
                wrong.push(format!("{m} (layer {}) uses {d} (layer {})", layer(m), layer(d)));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies that point up:\n{}", wrong.join("\n"));
}

/// The cycles of `graph`, each with its edges, as text (Tarjan's strongly connected
/// components: any component of two or more is a cycle).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        cycles: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.stack.contains(&w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let at = t.stack.iter().position(|x| *x == v).unwrap();
            let comp: Vec<&str> = t.stack.split_off(at);
            if comp.len() > 1 {
                t.cycles.push(comp);
            }
        }
    }
    let mut t = T { g: graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), cycles: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.cycles
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    graph
                        .get(*a)
                        .into_iter()
                        .flatten()
                        .filter(|b| c.contains(&b.as_str()))
                        .map(move |b| format!("  {a} -> {b}"))
                })
                .collect();
            format!("{}:\n{}", c.join(", "), edges.join("\n"))
        })
        .collect()
}

#[test]
fn no_import_cycles() {
    let graph = dependency_graph(&sources());
    let found = cycles(&graph);
    assert!(found.is_empty(), "import cycles between files:\n{}", found.join("\n"));
    // Nor between the folders (host and measure, say, each using the other).
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let top = |m: &str| m.split("::").next().unwrap_or("").to_string();
    for (m, deps) in &graph {
        let entry = folders.entry(top(m)).or_default();
        entry.extend(deps.iter().map(|d| top(d)).filter(|d| *d != top(m)));
    }
    let found = cycles(&folders);
    assert!(found.is_empty(), "import cycles between top-level modules:\n{}", found.join("\n"));
}

#[test]
fn only_the_command_line_layer_sees_clap() {
    let mut wrong = Vec::new();
    for s in sources() {
        if s.module == "cli" || s.module.starts_with("cli::") || CLI_USERS.contains(&s.module.as_str()) {
            continue;
        }
        let code = s.code.join("\n");
        if code.contains("clap::") || paths_after(&code, "crate::").iter().any(|p| p[0] == "cli") {
            wrong.push(s.module.clone());
        }
    }
    assert!(wrong.is_empty(), "modules below the command line that see clap or crate::cli: {wrong:?}");
}

/// Functions (outside test modules) and their length in lines, `fn` line to closing brace.
fn functions(s: &Source) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let lines = &s.code;
    let mut i = 0;
    while i < lines.len() {
        let l = &lines[i];
        let t = l.trim_start();
        let indent = &l[..l.len() - t.len()];
        let mut rest = t;
        for kw in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(kw).unwrap_or(rest);
        }
        if let Some(after) = rest.strip_prefix("fn ") {
            let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
            let mut j = i;
            while j < lines.len() && !lines[j].trim_end().ends_with('{') && !lines[j].trim_end().ends_with(';') {
                j += 1;
            }
            if j < lines.len() && lines[j].trim_end().ends_with('{') {
                let close = format!("{indent}}}");
                let end = (j + 1..lines.len()).find(|&k| lines[k].starts_with(&close)).unwrap_or(lines.len() - 1);
                out.push((name, i + 1, end - i + 1));
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let mut long = Vec::new();
    let mut seen = BTreeSet::new();
    for s in sources() {
        for (name, line, n) in functions(&s) {
            let key = format!("{}::{name}", s.module);
            if n <= MAX_FUNCTION_LINES {
                continue;
            }
            if LONG_FUNCTIONS.iter().any(|(k, _)| *k == key) {
                seen.insert(key);
                continue;
            }
            long.push(format!("{key} ({}:{line}): {n} lines", s.path.display()));
        }
    }
    let stale: Vec<&str> = LONG_FUNCTIONS.iter().map(|(k, _)| *k).filter(|k| !seen.contains(*k)).collect();
    assert!(long.is_empty(), "functions over {MAX_FUNCTION_LINES} lines:\n{}", long.join("\n"));
    assert!(stale.is_empty(), "LONG_FUNCTIONS lists functions that are no longer long (remove them): {stale:?}");
}

/// The commit that started the rule: subjects before it were written without one.
const FIRST_COMMIT_UNDER_THE_SUBJECT_RULE: &str = "7601133";

/// History a newcomer can read: every commit since the rule began has a one-line subject
/// of at most 72 characters (the why goes in the body). Outside a git checkout, or in a
/// clone too shallow to hold the starting commit, there is no history to check.
#[test]
fn commit_subjects_fit_one_line() {
    let root = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(root).args(args).output();
    let base = format!("{FIRST_COMMIT_UNDER_THE_SUBJECT_RULE}^{{commit}}");
    if !git(&["cat-file", "-e", &base]).is_ok_and(|o| o.status.success()) {
        eprintln!("commit_subjects_fit_one_line: no history to check here");
        return;
    }
    let out = git(&["log", "--format=%s", &format!("{FIRST_COMMIT_UNDER_THE_SUBJECT_RULE}..HEAD")]).unwrap();
    let long: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|s| s.chars().count() > 72)
        .map(|s| format!("{} characters: {s}", s.chars().count()))
        .collect();
    assert!(long.is_empty(), "commit subjects over 72 characters:\n{}", long.join("\n"));
}
