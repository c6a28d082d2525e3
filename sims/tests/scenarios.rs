//! Every scenario passes its own checks, and its text diagram is the one recorded
//! (insta snapshots in tests/snapshots).

use sims::scenario;

#[test]
fn every_scenario_passes_and_its_diagram_is_unchanged() {
    assert!(scenario::all().len() >= 15);
    let mut failed = Vec::new();
    for s in scenario::all() {
        let out = scenario::run(s, 1);
        if let Err(e) = &out.result {
            failed.push(format!(
                "{}: {e}\n{}",
                s.name,
                sims::ladder::render(&out.trace)
            ));
            continue;
        }
        insta::assert_snapshot!(s.name, sims::ladder::render(&out.trace));
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Same seed, same scenario: byte-identical packet traces (labelled addresses, see
/// `Trace::canonical_bytes`), for every scenario; the lossy one differs by seed.
#[test]
fn scenarios_are_deterministic() {
    for s in scenario::all() {
        let (x, y) = (scenario::run(s, 7), scenario::run(s, 7));
        assert_eq!(x.trace.lines(), y.trace.lines(), "{}", s.name);
        assert_eq!(
            x.trace.canonical_bytes(),
            y.trace.canonical_bytes(),
            "{}",
            s.name
        );
    }
    let lossy = scenario::find("lossy-link").unwrap();
    assert_ne!(
        scenario::run(lossy, 7).trace.lines(),
        scenario::run(lossy, 8).trace.lines()
    );
}
