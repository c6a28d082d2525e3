//! Runs a test again in a child process inside new, unprivileged user and network
//! namespaces (and a mount namespace, for tests that remount sysfs), via `unshare(1)`.

use std::process::Command;

/// The variable that tells the child it is the child.
pub(crate) const CHILD: &str = "EMU_TEST_IN_NAMESPACES";

/// Whether this process is the child (run the test's body).
pub(crate) fn is_child() -> bool {
    std::env::var(CHILD).is_ok()
}

/// Runs the test `name` of this binary as a child in new namespaces (`mount` adds a
/// mount namespace) and returns its output, or `None`, having said why on stderr,
/// where namespaces cannot be had (the test then skips).
pub(crate) fn run_child(name: &str, mount: bool) -> Option<(bool, String)> {
    let mut args = vec!["--user", "--map-root-user", "--net"];
    if mount {
        args.push("--mount");
    }
    args.push("--");
    let out = Command::new("unshare")
        .args(&args)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(CHILD, "1")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: unshare(1) cannot run: {e}");
            return None;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() && text.contains("unshare failed") {
        eprintln!("SKIPPED: no unprivileged user and network namespaces here: {text}");
        return None;
    }
    Some((out.status.success(), text))
}
