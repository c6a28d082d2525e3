//! Every scenario passes its own checks, and its text diagram is the one recorded
//! (insta snapshots in tests/snapshots).

use emu_sims::scenario;

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
                emu_sims::ladder::render(&out.trace)
            ));
            continue;
        }
        insta::assert_snapshot!(s.name, emu_sims::ladder::render(&out.trace));
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Same seed, same scenario: byte-identical pcap files (labelled addresses written
/// label-relative, see `Trace::canonical_bytes`) and trace lines, for every scenario;
/// the lossy one differs by seed.
#[test]
fn scenarios_are_deterministic() {
    for s in scenario::all() {
        let x = scenario::run(s, 7);
        // Something else on the heap, so the second run's memory lies elsewhere (as in
        // another process): only addresses written label-relative compare equal.
        let elsewhere: Vec<Vec<u8>> = (0..4).map(|i| vec![i; 100_000]).collect();
        let y = scenario::run(s, 7);
        drop(elsewhere);
        assert_eq!(x.trace.lines(), y.trace.lines(), "{}", s.name);
        let pcap = |t: &emu_sims::Trace| emu_sims::pcap::write(t, Vec::new()).unwrap();
        let (px, py) = (pcap(&x.trace), pcap(&y.trace));
        assert!(px.len() > 24 || x.trace.packets.is_empty(), "{}", s.name);
        assert!(px == py, "{}: the pcap files differ", s.name);
    }
    let lossy = scenario::find("lossy-link").unwrap();
    assert_ne!(
        scenario::run(lossy, 7).trace.lines(),
        scenario::run(lossy, 8).trace.lines()
    );
}

/// Every scenario's SVG ladder is well-formed XML with one arrow per packet that
/// crosses between devices, a cross on each lost one, and each arrow's label.
#[test]
fn every_scenario_draws_a_well_formed_svg() {
    for s in scenario::all() {
        let out = scenario::run(s, 1);
        let svg = emu_sims::svg::render(&out.trace);
        let doc = roxmltree::Document::parse(&svg)
            .unwrap_or_else(|e| panic!("{}: not well-formed XML: {e}", s.name));
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{}", s.name);
        let arrows = doc
            .descendants()
            .filter(|n| n.has_tag_name("line") && n.attribute("stroke-width") == Some("1.5"))
            .count();
        let crossing: Vec<_> = out
            .trace
            .packets
            .iter()
            .filter(|p| p.dst.is_some_and(|d| d != p.src))
            .collect();
        assert_eq!(arrows, crossing.len(), "{}", s.name);
        let crosses = doc.descendants().filter(|n| n.has_tag_name("path")).count();
        let lost = crossing
            .iter()
            .filter(|p| matches!(p.fate, emu_sims::trace::Fate::Dropped(_)))
            .count();
        // The arrowhead's marker is a path too.
        assert_eq!(crosses, lost + 1, "{}", s.name);
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        for p in &crossing {
            let label = out.trace.arrow_label(p);
            assert!(
                texts.contains(&label.as_str()),
                "{}: no label {label}",
                s.name
            );
        }
    }
}
