//! `rdma-emu scenario`: the scenario library (`emu_sims::scenario`) from the command line.

use emu_sims::scenario;

/// `rdma-emu scenario list` prints one scenario per line, its name first.
#[test]
fn the_scenario_list_names_one_scenario_per_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
        .args(["scenario", "list"])
        .output()
        .expect("run rdma-emu");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let all = scenario::all();
    assert_eq!(lines.len(), all.len(), "{text}");
    for (line, s) in lines.iter().zip(all) {
        assert_eq!(line.split_whitespace().next(), Some(s.name), "{line}");
    }
}
