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

fn rdma_emu(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
        .args(args)
        .output()
        .expect("run rdma-emu");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A built-in scenario runs from its file and says which expectations held.
#[test]
fn a_builtin_scenario_reports_its_expectations() {
    let (ok, out, err) = rdma_emu(&["scenario", "run", "rnr-retry-exhausted"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("RNR_RETRY_EXC_ERR"), "{out}");
    assert!(
        out.contains("held      sims/scenarios/rnr-retry-exhausted.toml:"),
        "{out}"
    );
    assert!(out.contains("3 of 3 expectations held"), "{out}");
}

/// `--drop` adds a rule: the lost READ RESPONSE is drawn with the rule's name, and the
/// expectations that no longer hold are named, with a failing exit status.
#[test]
fn a_rule_from_the_command_line_is_applied_and_reported() {
    let (ok, out, err) = rdma_emu(&[
        "scenario",
        "run",
        "lost-read-response",
        "--drop",
        "kind=read_response,nth=3",
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("dropped by rule \"drop kind=read_response,nth=3\""),
        "{out}"
    );
    assert!(
        out.contains("NOT HELD  sims/scenarios/lost-read-response.toml:"),
        "{out}"
    );
    assert!(err.contains("expectation(s) did not hold"), "{err}");
    let (ok, _, err) = rdma_emu(&["scenario", "run", "fence", "--drop", "kind=reed"]);
    assert!(!ok);
    assert!(err.contains("--drop \"kind=reed\""), "{err}");
}

/// A file on disk runs; one with a mistake is refused with FILE:LINE.
#[test]
fn files_on_disk_run_and_bad_ones_name_their_line() {
    let dir = std::env::temp_dir().join(format!("rdma-emu-scenario-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("mine.toml");
    let (_, text, _) = rdma_emu(&["scenario", "show", "ack-coalescing"]);
    std::fs::write(&good, text.replace("\"1 SUCCESS\"", "\"1 REM_ACCESS_ERR\"")).unwrap();
    let (ok, out, _) = rdma_emu(&["scenario", "run", good.to_str().unwrap()]);
    assert!(!ok, "the changed expectation cannot hold: {out}");
    assert!(
        out.contains(
            "a completions: 1 REM_ACCESS_ERR, 2 SUCCESS, 3 SUCCESS, 4 SUCCESS; got 1 SUCCESS"
        ),
        "{out}"
    );
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"bad\"\ndescription = \"d\"\n\n[[step]]\non = \"a\"\nwait = \"one\"\n",
    )
    .unwrap();
    let (ok, _, err) = rdma_emu(&["scenario", "run", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.starts_with(&format!("rdma-emu: {}:6: ", bad.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--html` writes the page that steps through the run: one self-contained file with a
/// step for each row of the ladder.
#[test]
fn html_writes_a_page_with_a_step_per_ladder_row() {
    let path = std::env::temp_dir().join(format!("rdma-emu-fence-{}.html", std::process::id()));
    let (ok, out, err) = rdma_emu(&["scenario", "run", "fence", "--html", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let page = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    // The ladder's rows: between its header line and its "N packets" summary.
    let rows = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("time (s)"))
        .skip(1)
        .take_while(|l| !l.contains(" packets: "))
        .count();
    assert!(rows > 5, "{out}");
    assert!(
        page.contains(&format!(r#"data-steps="{rows}""#)),
        "{rows} rows"
    );
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<title>fence"));
}
