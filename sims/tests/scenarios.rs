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
        assert_eq!(x.trace.notes, y.trace.notes, "{}: host events", s.name);
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

/// The ladder of scenario `name` (which must pass).
fn ladder(name: &str) -> String {
    let out = scenario::run(scenario::find(name).unwrap(), 1);
    out.result.unwrap();
    emu_sims::ladder::render(&out.trace)
}

/// The rows of `ladder` that are host events (a `*` on a lifeline).
fn host_rows(ladder: &str) -> Vec<&str> {
    ladder.lines().filter(|l| l.contains('*')).collect()
}

/// IBTA 11.6.2: the overrun CQ raises CQ_ERR, and its QP QP_FATAL and goes to error;
/// the ladder shows all three on b's side, in that order.
#[test]
fn cq_overrun_shows_cq_err_and_qp_fatal() {
    let l = ladder("cq-overrun");
    let rows = host_rows(&l);
    let at = |s: &str| {
        rows.iter()
            .position(|r| r.contains(s))
            .unwrap_or_else(|| panic!("no {s}:\n{l}"))
    };
    assert!(at("event CQ_ERR") < at("event QP_FATAL"), "{l}");
    assert!(at("event QP_FATAL") < at("QP RTS -> ERR"), "{l}");
    // b's events sit in b's column (right of a's lifeline).
    assert!(
        rows[at("event QP_FATAL")].find("event").unwrap() > 15,
        "{l}"
    );
    // b's QP in error discards the retransmissions, and says so.
    assert!(l.contains("b discarded: QP not ready to receive"), "{l}");
}

/// IBTA 9.7.6.1.4: after retry_cnt retries the ACK timer's last firing completes the
/// head WR with RETRY_EXC_ERR; the ladder ends on it, not on the dropped packets.
#[test]
fn retry_exhausted_ends_with_retry_exc_err() {
    let l = ladder("retry-exhausted");
    let rows: Vec<&str> = l.lines().collect();
    let last_packet = rows.iter().rposition(|r| r.contains("SEND_ONLY")).unwrap();
    let tail = rows[last_packet..].join("\n");
    assert!(tail.contains("ACK timer fired"), "{l}");
    assert!(tail.contains("completion wr_id=1 RETRY_EXC_ERR"), "{l}");
    assert!(tail.contains("QP RTS -> ERR"), "{l}");
    assert_eq!(l.matches("ACK timer armed (4.19 ms)").count(), 4, "{l}");
}

/// IBTA 9.8: UC drops the rest of a message whose FIRST was lost; the LAST that
/// arrives says the responder discarded it.
#[test]
fn uc_message_lost_shows_the_discard() {
    let l = ladder("uc-message-lost");
    let last = l
        .lines()
        .find(|r| r.contains("UC_SEND_LAST 101"))
        .unwrap_or_else(|| panic!("{l}"));
    assert!(
        last.contains("b discarded: PSN gap, message dropped"),
        "{last}"
    );
    assert!(
        l.contains("completion wr_id=1 SUCCESS RECV len=2000"),
        "{l}"
    );
}

/// IBTA 9.7.5.2.8: the RNR NAK's timer code 14 is 1.28 ms; the requester arms its RNR
/// timer with it and retries when it fires.
#[test]
fn rnr_shows_the_rnr_timer_and_its_value() {
    let l = ladder("rnr-nak-then-success");
    let rows: Vec<&str> = l.lines().collect();
    let armed = rows
        .iter()
        .position(|r| r.contains("RNR timer armed (1.28 ms)"))
        .unwrap_or_else(|| panic!("{l}"));
    let fired = rows
        .iter()
        .position(|r| r.contains("RNR timer fired"))
        .unwrap_or_else(|| panic!("{l}"));
    assert!(armed < fired, "{l}");
    assert!(rows[fired].trim_start().starts_with("0.001282"), "{l}");
    assert!(
        l.contains("b not taken: no receive WQE, RNR NAK sent"),
        "{l}"
    );
}

/// The SVG of a scenario reads on its own: its title and lesson, the legend, host
/// events, tooltips, and the RNR wait drawn as one labelled compressed gap.
#[test]
fn the_svg_has_title_lesson_legend_and_a_compressed_gap() {
    let s = scenario::find("rnr-nak-then-success").unwrap();
    let out = scenario::run(s, 1);
    let svg = emu_sims::svg::render_titled(&out.trace, s.name, s.description);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    let all = texts.join("\n");
    assert!(texts.contains(&s.name), "no title");
    // The lesson, wrapped over lines: its first words and its citation.
    assert!(all.contains("a SEND finds no receive WQE"), "no lesson");
    assert!(all.contains("IBTA 9.7.5.2.8"), "no citation");
    assert!(all.contains("A = AckReq"), "no legend");
    assert!(all.contains("msn = "), "no legend for msn");
    // The RNR wait (1.28 ms from the RNR NAK; the receive is posted 100 us in) is
    // compressed: no band taller than a row, each labelled with its length.
    let gaps: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("gap"))
        .flat_map(|g| g.descendants().filter(|n| n.has_tag_name("text")))
        .filter_map(|n| n.text())
        .collect();
    assert!(
        gaps.contains(&"... 1.18 ms ..."),
        "no compressed RNR wait: {gaps:?}"
    );
    assert!(gaps.contains(&"... 98 us ..."), "{gaps:?}");
    assert!(all.contains("RNR timer armed (1.28 ms)"), "no host event");
    // Every packet row has a tooltip with its full headers.
    let tips: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for p in &out.trace.packets {
        let d = out.trace.describe(p);
        assert!(tips.iter().any(|t| t.contains(&d)), "no tooltip {d}");
    }
}
