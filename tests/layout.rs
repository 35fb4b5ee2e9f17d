//! The layout stays without import cycles: in every crate, no module
//! (a file, or a directory's `mod.rs`, down to two levels) reaches back
//! to itself through the `crate::` and `super::` paths of its non-test
//! code. A cycle means two seams were cut in the wrong place; the test
//! names the modules in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use armada_tests::root;

/// Module paths are cut to this depth (`collab::children`).
const DEPTH: usize = 2;

const CRATES: [&str; 9] = [
    "shared/domain/src",
    "shared/api/src",
    "shared/core/src",
    "functions/ingress/src",
    "functions/dispatcher/src",
    "functions/harness/src",
    "functions/hitl/src",
    "sandbox/src",
    "cli/src",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("a source directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `collab::children` for `src/collab/children.rs`; `None` for the root.
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.is_empty() || parts == ["lib"] || parts == ["main"] {
        return None;
    }
    parts.truncate(DEPTH);
    Some(parts)
}

/// The code of a file that is not a test.
fn non_test_code(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_string_lossy();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => &text,
    };
    Some(
        code.lines()
            .map(|l| l.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// The module paths `code` names after `prefix` (`crate::a::b::Item` → `a::b`).
fn named_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let mut path = Vec::new();
        for seg in rest.split("::") {
            let ident: String = seg
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !ident.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                break;
            }
            let whole = ident.len() == seg.len();
            path.push(ident);
            // The path ends where anything but `::` follows a name.
            if !whole {
                break;
            }
        }
        if !path.is_empty() {
            found.push(path);
        }
    }
    found
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().filter_map(|f| module_of(src, f)).collect();
    let mut edges = Graph::new();
    for file in &files {
        let (Some(from), Some(code)) = (module_of(src, file), non_test_code(file)) else {
            continue;
        };
        let mut targets = named_after(&code, "crate::");
        // `super::x` from `a::b` is `a::x`; from a top-level module, `x`.
        let parent = &from[..from.len() - 1];
        for path in named_after(&code, "super::") {
            targets.push(parent.iter().cloned().chain(path).collect());
        }
        for mut to in targets {
            to.truncate(DEPTH);
            // Only modules that exist (not items), and never a module and
            // its own parent or child: a parent declares its children.
            while !to.is_empty() && !modules.contains(&to) {
                to.pop();
            }
            let related = to.is_empty() || to.starts_with(&from) || from.starts_with(&to);
            if !related {
                edges
                    .entry(from.join("::"))
                    .or_default()
                    .insert(to.join("::"));
            }
        }
    }
    edges
}

/// A cycle through `start`, if there is one.
fn cycle_from(g: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        g: &Graph,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in g.get(at).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    walk(g, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn no_module_imports_itself_through_others() {
    let (mut cycles, mut edges) = (Vec::new(), 0);
    for krate in CRATES {
        let g = graph(&root().join(krate));
        edges += g.values().map(BTreeSet::len).sum::<usize>();
        for module in g.keys() {
            if let Some(cycle) = cycle_from(&g, module) {
                cycles.push(format!("{krate}: {} -> {module}", cycle.join(" -> ")));
                break;
            }
        }
    }
    // The domain alone names well over this many of its modules.
    assert!(
        edges > 100,
        "only {edges} imports between modules were read"
    );
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_check_sees_a_cycle_when_there_is_one() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle_from(&g, "a"), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        cycle_from(&g, "a"),
        Some(vec!["a".to_string(), "b".to_string(), "c".to_string()])
    );
    let code = "use crate::run::family::ChildSlot;\nlet x = super::retried(1); mycrate::no::Thing";
    assert_eq!(
        named_after(code, "crate::"),
        vec![vec!["run".to_string(), "family".to_string()]]
    );
    assert_eq!(
        named_after(code, "super::"),
        vec![vec!["retried".to_string()]]
    );
}
