//! Scenario files (`emu_sims::script`): every built-in file does what its Rust
//! original does (the same ladder, packet for packet and host event for host event)
//! and its expectations hold; rules added from outside change what happens; bad files
//! are refused with their line.

use emu_sims::scenario;
use emu_sims::script::{self, Script, Verb};

#[test]
fn every_builtin_file_matches_its_rust_original_and_its_expectations_hold() {
    let files = script::builtin();
    // Every Rust scenario has its file (`rdma-emu scenario run NAME` runs the file).
    for s in scenario::all() {
        assert!(
            files.iter().any(|(n, _)| *n == s.name),
            "{} has no file",
            s.name
        );
    }
    let mut failed = Vec::new();
    for (name, _) in files {
        let s = script::find_builtin(name).unwrap().unwrap();
        assert_eq!(s.name, *name, "the file's name = its file name");
        let rust = scenario::find(name).unwrap_or_else(|| panic!("no Rust scenario {name}"));
        assert_eq!(s.description, rust.description, "{name}: description");
        for seed in [1, 7] {
            let file = s.run(seed);
            let orig = scenario::run(rust, seed);
            let (got, want) = (
                emu_sims::ladder::render(&file.trace),
                emu_sims::ladder::render(&orig.trace),
            );
            if got != want {
                failed.push(format!(
                    "{name} (seed {seed}): ladders differ\n--- file\n{got}\n--- rust\n{want}"
                ));
            }
            if !file.report.passed() {
                failed.push(format!("{name} (seed {seed}):\n{}", file.report));
            }
            assert!(!file.report.findings.is_empty(), "{name}: no expectation");
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn a_rule_from_the_command_line_changes_the_run_and_the_report_says_so() {
    let mut s = script::find_builtin("ack-timeout-retransmit")
        .unwrap()
        .unwrap();
    assert!(s.run(1).report.passed());
    // Every SEND lost: a's SEND ends in RETRY_EXC_ERR, not SUCCESS.
    s.add_rule(Verb::Drop, "kind=send").unwrap();
    let out = s.run(1);
    assert!(!out.report.passed());
    let a = out
        .report
        .findings
        .iter()
        .find(|f| f.what.starts_with("a completions"))
        .unwrap();
    assert!(!a.held);
    assert_eq!(a.got.as_deref(), Some("1 RETRY_EXC_ERR"));
    let text = out.report.to_string();
    assert!(
        text.contains("NOT HELD  sims/scenarios/ack-timeout-retransmit.toml:"),
        "{text}"
    );
}

#[test]
fn an_rnr_nak_rule_from_outside_is_answered_with_a_retry() {
    let mut s = script::find_builtin("ack-coalescing").unwrap().unwrap();
    s.add_rule(Verb::RnrNak, "kind=write,nth=1,timer=1")
        .unwrap();
    let out = s.run(1);
    let rnr = out
        .report
        .findings
        .iter()
        .find(|f| f.what.starts_with("a completions"))
        .unwrap();
    assert!(rnr.held, "the WRITEs still complete: {}", out.report);
    assert!(emu_sims::ladder::render(&out.trace).contains("RNR_NAK t=1"));
}

#[test]
fn bad_rules_from_outside_are_refused() {
    let mut s = script::find_builtin("fence").unwrap().unwrap();
    let e = s.add_rule(Verb::Drop, "kind=read_reponse").unwrap_err();
    assert_eq!(e.line, None);
    assert!(e.to_string().contains("--drop"), "{e}");
    assert!(e.to_string().contains("read_response"), "{e}");
    assert!(
        s.add_rule(Verb::Delay, "kind=ack").is_err(),
        "delay without by="
    );
    assert!(s.add_rule(Verb::Drop, "from=c").is_err(), "no host c");
}

/// `(file text, line of the error, words the message has)`.
const BAD: &[(&str, usize, &str)] = &[
    // TOML syntax.
    ("name = \"x\"\ndescription = \"d\"\n[[step]\n", 3, ""),
    // A key the format does not have.
    ("name = \"x\"\ndescription = \"d\"\n\n[qp]\ntimout = 3\n", 5, "timout"),
    // A rule with a misspelt kind.
    (
        "name = \"x\"\ndescription = \"d\"\n[[rule]]\ndrop = \"kind=read_reponse,nth=3\"\n",
        4,
        "read_response",
    ),
    // A rule with two verbs.
    (
        "name = \"x\"\ndescription = \"d\"\n[[rule]]\ndrop = \"nth=1\"\nduplicate = \"nth=2\"\n",
        3,
        "exactly one",
    ),
    // A status that does not exist.
    (
        "name = \"x\"\ndescription = \"d\"\n\n[expect.a]\ncompletions = [\"1 SUCESS\"]\n",
        5,
        "SUCESS",
    ),
    // A step without its host.
    (
        "name = \"x\"\ndescription = \"d\"\n\n[[step]]\nwait = 1\n",
        4,
        "on = ",
    ),
    // A host that does not exist.
    (
        "name = \"x\"\ndescription = \"d\"\n\n[[step]]\non = \"c\"\nwait = 1\n",
        5,
        "no host",
    ),
    // An unknown op.
    (
        "name = \"x\"\ndescription = \"d\"\n[[step]]\non = \"a\"\npost_send = [\n  { wr_id = 1, op = \"SEND\", len = 4 },\n  { wr_id = 2, op = \"WRTE\", len = 4 },\n]\n",
        7,
        "WRTE",
    ),
    // A duration without a unit.
    ("name = \"x\"\ndescription = \"d\"\n[[step]]\nrun_for = \"100\"\n", 4, "unit"),
    // An unknown counter.
    (
        "name = \"x\"\ndescription = \"d\"\n[expect.b]\ncounters = { rnr_nak = 1 }\n",
        4,
        "rnr_naks_received",
    ),
    // A fabric step given a host.
    (
        "name = \"x\"\ndescription = \"d\"\n[[step]]\non = \"a\"\nrun_for = \"1ms\"\n",
        4,
        "no on =",
    ),
    // c connected to a, whose QP is b's.
    (
        "name = \"x\"\ndescription = \"d\"\n\n[hosts.c]\npeer = \"a\"\n",
        4,
        "peer",
    ),
    // An RC WR for a host its QP is not connected to.
    (
        "name = \"x\"\ndescription = \"d\"\n[hosts.c]\n[[step]]\non = \"a\"\npost_send = [{ wr_id = 1, op = \"SEND\", len = 4, to = \"c\" }]\n",
        6,
        "connected to b",
    ),
    // A host of a third that has no peer.
    (
        "name = \"x\"\ndescription = \"d\"\n[hosts.c]\n[[step]]\non = \"c\"\npost_send = [{ wr_id = 1, op = \"SEND\", len = 4 }]\n",
        6,
        "no peer",
    ),
    // Expectations for a host there is not.
    ("name = \"x\"\ndescription = \"d\"\n[expect.c]\nstate = \"RTS\"\n", 3, "no host \"c\""),
    // A retry count past its 3 bits.
    ("name = \"x\"\ndescription = \"d\"\n[qp]\ntimeout = 10\nretry_cnt = 9\n", 5, "at most 7"),
    // READ on UC.
    (
        "name = \"x\"\ndescription = \"d\"\n[qp]\ntype = \"UC\"\n[[step]]\non = \"a\"\npost_send = [{ wr_id = 1, op = \"READ\", len = 8 }]\n",
        7,
        "UC",
    ),
];

#[test]
fn bad_files_are_refused_with_their_line() {
    for (text, line, words) in BAD {
        let e = Script::parse("bad.toml", text).expect_err(text);
        assert_eq!(e.line, Some(*line), "{e}\n{text}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("bad.toml:{line}: ")), "{shown}");
        assert!(shown.contains(words), "{shown} lacks {words:?}");
    }
}

#[test]
fn a_failing_verb_stops_the_program_at_its_line() {
    let text = "name = \"x\"\ndescription = \"d\"\n[[step]]\non = \"a\"\npost_send = [{ wr_id = 1, op = \"WRITE\", len = 8, rkey = \"window\" }]\n";
    let out = Script::parse("w.toml", text).unwrap().run(1);
    assert!(!out.report.passed());
    let e = out.report.error.unwrap();
    assert!(e.starts_with("w.toml:3: "), "{e}");
    assert!(e.contains("bind_mw"), "{e}");
}

/// Every file in `sims/scenarios/` is built in (so `rdma-emu scenario run NAME` finds
/// it with no file on disk), and every built-in text is that file's.
#[test]
fn the_builtin_files_are_the_files_on_disk() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut on_disk: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_str().unwrap().to_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    on_disk.sort();
    let mut built_in: Vec<(String, String)> = script::builtin()
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    built_in.sort();
    assert_eq!(on_disk, built_in);
}

/// The answers to the exercises of docs/learning.md: each is named there, parses, and
/// its expectations hold.
#[test]
fn every_exercise_answer_holds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/learning.md")).unwrap();
    let mut answers: Vec<_> = std::fs::read_dir(root.join("docs/exercises"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    answers.sort();
    assert!(
        (8..=10).contains(&answers.len()),
        "{} answers",
        answers.len()
    );
    for path in &answers {
        let name = path.file_name().unwrap().to_str().unwrap();
        let shown = format!("docs/exercises/{name}");
        assert!(
            guide.contains(&format!("`{shown}`")),
            "learning.md does not name {shown}"
        );
        let s = Script::parse(&shown, &std::fs::read_to_string(path).unwrap())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(format!("{}.toml", s.name), name, "the name is the file's");
        let out = s.run(1);
        assert!(
            out.report.findings.len() >= 3,
            "{shown}: too few expectations"
        );
        assert!(out.report.passed(), "{shown}:\n{}", out.report);
    }
}

/// Every TOML block of docs/learning.md is a scenario file that parses.
#[test]
fn the_guides_toml_blocks_parse() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/learning.md")).unwrap();
    let blocks: Vec<&str> = guide
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(!blocks.is_empty());
    for b in blocks {
        let s = Script::parse("learning.md", b).unwrap_or_else(|e| panic!("{e}\n{b}"));
        assert!(s.run(1).report.passed(), "{b}");
    }
}

/// The rule verbs a built-in file does not use, run from a file: a truncated READ
/// response completes BAD_RESP_ERR (IBTA 9.9), a duplicated SEND is answered as a
/// duplicate and delivered once (9.7.5.1.2).
#[test]
fn truncate_and_duplicate_rules_run_from_a_file() {
    let truncated = r#"
name = "short-read"
description = "a READ response loses 4 bytes"

[[rule]]
truncate = "kind=read_response,bytes=4"

[[step]]
on = "a"
post_send = [{ wr_id = 1, op = "READ", len = 64 }]

[[step]]
on = "a"
wait = 1

[expect.a]
completions = ["1 BAD_RESP_ERR"]
state = "ERR"
"#;
    let out = Script::parse("short-read.toml", truncated).unwrap().run(1);
    assert!(out.report.passed(), "{}", out.report);
    let duplicated = r#"
name = "twice"
description = "a SEND arrives twice"

[[rule]]
duplicate = "kind=send,nth=1"

[[step]]
on = "b"
post_recv = [{ wr_id = 1, len = 64 }, { wr_id = 2, len = 64 }]

[[step]]
on = "a"
post_send = [{ wr_id = 1, op = "SEND", text = "hello from a to b" }]

[[step]]
on = "a"
wait = 1

[[step]]
on = "b"
wait = 2

[expect.b]
completions = ["1 SUCCESS"]
counters = { duplicate_requests = 1 }

[expect.packets]
"fate=duplicated" = 1
"#;
    let out = Script::parse("twice.toml", duplicated).unwrap().run(1);
    assert!(out.report.passed(), "{}", out.report);
}

/// More than two hosts: a UD QP sends to any of them, each by its own address handle.
const UD_THREE_HOSTS: &str = r#"
name = "ud-three-hosts"
description = "a UD QP talks to any QP: a sends to b and to c, c sends to b"

[qp]
type = "UD"

[hosts.c]

[[step]]
on = "b"
post_recv = [{ wr_id = 1, len = 1024 }, { wr_id = 2, offset = 1024, len = 1024 }]

[[step]]
on = "c"
post_recv = [{ wr_id = 1, len = 1024 }]

[[step]]
on = "a"
post_send = [
    { wr_id = 1, op = "SEND", text = "hello from a to b", to = "b" },
    { wr_id = 2, op = "SEND", text = "hello from a to c", offset = 64, to = "c" },
]

[[step]]
on = "c"
post_send = [{ wr_id = 7, op = "SEND", text = "hello from c to b", to = "b" }]

[[step]]
on = "a"
wait = 2

[[step]]
on = "b"
wait = 2

[[step]]
on = "c"
wait = 2

[expect.b]
completions = ["1 SUCCESS len=57", "2 SUCCESS len=57"]
memory = [{ offset = 40, text = "hello from a to b" }, { offset = 1064, text = "hello from c to b" }]

[expect.c]
completions = ["7 SUCCESS", "1 SUCCESS len=57"]
memory = [{ offset = 40, text = "hello from a to c" }]

[expect.packets]
"from=a" = 2
"to=b" = 2
"from=c,to=b" = 1
"#;

#[test]
fn a_ud_host_sends_to_two_others() {
    let s = Script::parse("ud3.toml", UD_THREE_HOSTS).unwrap();
    let out = s.run(1);
    assert!(out.report.passed(), "{}", out.report);
    assert_eq!(out.trace.devices.len(), 3);
    assert_eq!(
        out.trace.devices[2].ip,
        std::net::Ipv4Addr::new(192, 0, 2, 3)
    );
}

/// Four RC hosts in two connections: a rule on one connection leaves the other alone.
#[test]
fn two_rc_connections_side_by_side() {
    let text = r#"
name = "two-pairs"
description = "a-b and c-d; c's first SEND is lost and retried, a's is not"

[qp]
timeout = 8

[hosts.c]
peer = "d"

[hosts.d]
peer = "c"

[[rule]]
drop = "from=c,kind=send,nth=1"

[[step]]
on = "b"
post_recv = [{ wr_id = 1, len = 64 }]

[[step]]
on = "d"
post_recv = [{ wr_id = 1, len = 64 }]

[[step]]
on = "a"
post_send = [{ wr_id = 1, op = "SEND", text = "hello from a to b" }]

[[step]]
on = "c"
post_send = [{ wr_id = 1, op = "SEND", text = "hello from c to d" }]

[[step]]
on = "a"
wait = 1

[[step]]
on = "c"
wait = 1

[[step]]
on = "d"
wait = 1

[expect.a]
completions = ["1 SUCCESS"]
counters = { ack_timeouts = 0 }

[expect.c]
completions = ["1 SUCCESS"]
counters = { ack_timeouts = 1 }

[expect.d]
completions = ["1 SUCCESS"]
memory = [{ offset = 0, text = "hello from c to d" }]

[expect.packets]
"from=a,kind=send" = 1
"from=c,kind=send" = 2
"to=d,fate=dropped" = 1
"#;
    let out = Script::parse("pairs.toml", text).unwrap().run(1);
    assert!(out.report.passed(), "{}", out.report);
}
