//! The engine is sans-IO: it reads no clock, opens no socket, spawns no thread and has
//! no `unsafe` (architecture.md). This test reads the engine's source and fails if any
//! of those appear.

use std::path::Path;

#[test]
fn engine_has_no_clock_no_io_no_unsafe() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let forbidden = [
        "Instant::now",
        "SystemTime",
        "std::net",
        "std::thread",
        "std::fs",
        "unsafe ",
        "tokio",
        "socket2",
    ];
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may build instants from a clock; only non-test code counts.
            let code = text.split("#[cfg(test)]").next().unwrap();
            for word in forbidden {
                assert!(!code.contains(word), "{} uses {word}", path.display());
            }
        }
    }
    assert!(files >= 10, "found the engine's modules");
}
