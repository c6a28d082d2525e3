//! `rdma-emu --version` and `rdma-emu completions SHELL` (issue 29, point 5).

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-emu");

fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_is_the_crates() {
    let want = format!("rdma-emu {}\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(stdout_of(&["--version"]), want);
    assert_eq!(stdout_of(&["-V"]), want);
}

#[test]
fn completions_name_the_subcommands_and_their_options() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let s = stdout_of(&["completions", shell]);
        for word in [
            "devinfo", "pingpong", "bench", "exec", "scenario", "tx-depth",
        ] {
            assert!(s.contains(word), "{shell}: no {word:?} in its script");
        }
    }
    assert!(stdout_of(&["completions", "zsh"]).starts_with("#compdef rdma-emu"));
}

/// The bash script is valid bash (`bash -n`), where bash is installed.
#[test]
fn the_bash_script_parses() {
    let script = stdout_of(&["completions", "bash"]);
    let Ok(mut bash) = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("no bash here: not checked");
        return;
    };
    use std::io::Write as _;
    bash.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = bash.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
