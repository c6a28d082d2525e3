//! `conformance` and the `interop` example refuse bad arguments with one line on stderr and a non-zero exit,
//! and a FILTER that matches no case is an error, not an empty run that passes
//! (issue 26, point 5).

#[path = "../../emu-core/tests/cli_util/mod.rs"]
mod cli_util;

use std::process::Command;
use std::time::Duration;

use cli_util::{assert_one_line_error, run};

#[test]
fn conformance_refuses_bad_arguments() {
    for args in [
        &["--backend"][..],
        &["--backend", "no-such-backend"],
        &["--ip", "300.1.1.1"],
        &["--results", "/nonexistent/results.tsv"],
        &["--bogus"],
        &["rc_", "ud_"],
        &["no_such_case_anywhere"],
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
        cmd.args(args);
        assert_one_line_error(&run(cmd, Duration::from_secs(60)));
    }
}

#[test]
fn interop_refuses_bad_arguments() {
    let exe = std::env::current_exe().unwrap();
    let interop = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples/interop");
    assert!(
        interop.exists(),
        "{} was not built (cargo test builds examples)",
        interop.display()
    );
    for args in [
        &[][..],
        &["bogus"],
        &["agent", "127.0.0.1:0", "extra"],
        &["agent", "not-an-address"],
        &["probe", "no-such-probe", "127.0.0.1"],
        &["probe", "ack-drop", "not-an-address"],
    ] {
        let mut cmd = Command::new(&interop);
        cmd.args(args);
        assert_one_line_error(&run(cmd, Duration::from_secs(60)));
    }
}
