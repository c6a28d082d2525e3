//! docs/architecture.md describes the code as it is: every file or folder it names in
//! backquotes (`emu-core/src/nic/link.rs`, or `nic/gro.rs` relative to a crate's
//! source) must exist, so a move that forgets the page fails here.

use std::path::{Path, PathBuf};

/// Every file and folder below `dir`, as paths relative to `root`, skipping build
/// output and hidden folders.
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            out.push(format!("{rel}/"));
            walk(root, &p, out);
        } else {
            out.push(rel);
        }
    }
}

/// The backquoted tokens of `text` that look like a path: a file with an extension
/// the tree uses, or a folder (ending in `/`), with no spaces or wildcards.
fn named_paths(text: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 8] = [".rs", ".md", ".sh", ".txt", ".toml", ".c", ".py", ".h"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            !t.is_empty()
                && t.contains('/')
                && !t.starts_with('/')
                && !t.contains(char::is_whitespace)
                && !t.contains(['*', '<', '>', '$', '{', ':'])
                && (t.ends_with('/') || EXTENSIONS.iter().any(|e| t.ends_with(e)))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut tree = Vec::new();
    walk(&root, &root, &mut tree);
    let named = named_paths(&page);
    assert!(
        named.len() > 20,
        "the page names paths; found only {named:?}"
    );
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| {
            !tree
                .iter()
                .any(|p| p == *n || p.ends_with(&format!("/{n}")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn a_path_that_is_not_there_is_caught() {
    let named = named_paths("see `emu-core/src/nic/gone.rs` and `nic/udp/` and `a b/c.rs`");
    assert_eq!(named, ["emu-core/src/nic/gone.rs", "nic/udp/"]);
}
