//! `rdma-emu bench`, mostly on the deterministic fabric: the packet counts it reports follow
//! the protocol (IBTA 9.7.5.1: a responder may coalesce ACKs only within a QP).

/// Runs `rdma-emu bench ARGS --fabric --no-baseline --json` and returns the JSON line.
fn bench_json(args: &[&str]) -> String {
    bench_json_with(args, &["--fabric", "--no-baseline", "--json"])
}

/// Runs `rdma-emu bench ARGS MORE` and returns the JSON line (`MORE` has `--json`).
fn bench_json_with(args: &[&str], more: &[&str]) -> String {
    json_line(&bench_text(&[args, more].concat()))
}

/// Runs `rdma-emu bench ARGS`, which must succeed, and returns all it printed.
fn bench_text(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run rdma-emu");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{args:?}: {text}");
    text
}

/// The last line of a bench's output with `--json`.
fn json_line(text: &str) -> String {
    text.lines().last().expect("a JSON line").to_owned()
}

/// How many packets `side` ("client" or "server") received through the rings, from
/// the line the bench prints for it.
fn received_through_rings(text: &str, side: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{side}:")) && l.contains("rings"))
        .unwrap_or_else(|| panic!("no {side} line in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs `rdma-emu bench ARGS`, which must be refused before anything runs (non-zero
/// exit, nothing on stdout); its stderr.
fn refused(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run rdma-emu");
    assert!(!out.status.success(), "{args:?} ran");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The number after `"key":` in a flat JSON object.
fn field(json: &str, key: &str) -> f64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing from {json}"));
    let rest = &json[at + key.len() + 3..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e} in {json}"))
}

/// With one message in flight per QP every message is a request and its own ACK;
/// one QP with the same messages in flight acknowledges a batch with one ACK.
#[test]
fn many_qps_with_one_message_each_need_an_ack_per_message() {
    let json = bench_json(&[
        "write_bw",
        "--qps",
        "8",
        "--tx-depth",
        "8",
        "--size",
        "64",
        "-n",
        "20",
    ]);
    assert_eq!(field(&json, "packets_per_msg"), 2.0, "{json}");
    let one = field(&json, "one_qp_packets_per_msg");
    assert!((1.0..1.5).contains(&one), "{json}");
    assert!(field(&json, "ratio_one_qp_packets") > 0.0, "{json}");
}

/// `--qp-depth` puts several WRs in flight on a QP while `--tx-depth` bounds them over
/// all QPs: 64 QPs with 64 WRs in flight take turns eight at a time, and a QP's
/// eight share ACKs (without it each QP has one in flight and every message is
/// ACKed on its own).
#[test]
fn qp_depth_lets_qps_take_turns_with_several_in_flight() {
    let json = bench_json(&[
        "write_bw",
        "--qps",
        "64",
        "--tx-depth",
        "64",
        "--qp-depth",
        "8",
        "--size",
        "64",
        "-n",
        "16",
    ]);
    assert_eq!(field(&json, "qps"), 64.0, "{json}");
    let p = field(&json, "packets_per_msg");
    assert!((1.0..1.9).contains(&p), "{json}");
}

/// With one QP, `--qp-depth` bounds its WRs in flight below `--tx-depth` (the send
/// queue is made that deep): one at a time, each message is ACKed on its own.
#[test]
fn one_qp_keeps_to_its_qp_depth() {
    let json = bench_json(&["write_bw", "--qp-depth", "1", "--size", "64", "-n", "40"]);
    assert_eq!(field(&json, "packets_per_msg"), 2.0, "{json}");
}

/// `--qp-depth` over `--tx-depth`, or zero, is refused before anything runs.
#[test]
fn a_qp_depth_over_the_tx_depth_is_an_error() {
    for (args, says) in [
        (
            &["--qp-depth", "9", "--tx-depth", "8"][..],
            "over --tx-depth 8",
        ),
        (&["--qp-depth", "0"][..], "--qp-depth must be at least 1"),
    ] {
        let err = refused(&[&["write_bw", "--fabric"][..], args].concat());
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A 64 KiB WRITE at MTU 1024 is 64 request packets; the ACKs add less than one per
/// message while several messages are in flight.
#[test]
fn a_message_takes_one_packet_per_mtu() {
    let json = bench_json(&["write_bw", "--size", "65536", "--mtu", "1024", "-n", "50"]);
    let p = field(&json, "packets_per_msg");
    assert!((64.0..65.0).contains(&p), "{json}");
}

/// `--rounds`: every round is listed, and the reported ratio is the median round's,
/// each round's QPs fresh and verified byte for byte.
#[test]
fn rounds_report_the_median_round() {
    let json = bench_json(&[
        "write_bw",
        "--qps",
        "4",
        "--tx-depth",
        "16",
        "--size",
        "256",
        "-n",
        "30",
        "--rounds",
        "3",
        "--verify",
    ]);
    assert_eq!(field(&json, "rounds"), 3.0, "{json}");
    let mut values = array(&json, "round_values");
    assert_eq!(values.len(), 3, "{json}");
    values.sort_by(f64::total_cmp);
    assert_eq!(field(&json, "ratio_one_qp"), values[1], "{json}");
    assert!(values[0] > 0.0, "{json}");
}

/// The numbers in the JSON array after `"key":[`.
fn array(json: &str, key: &str) -> Vec<f64> {
    let at = json.find(&format!("\"{key}\":[")).expect(key) + key.len() + 4;
    let end = at + json[at..].find(']').expect("]");
    json[at..end]
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

/// With one QP and the baseline on, each round is measured against its own memcpy
/// run, and the reported ratio is the median round's.
#[test]
fn rounds_measure_the_baseline_each() {
    let json = bench_json_with(
        &["write_bw", "--size", "4096", "-n", "20", "--rounds", "3"],
        &["--fabric", "--json"],
    );
    let mut values = array(&json, "round_values");
    assert_eq!(values.len(), 3, "{json}");
    values.sort_by(f64::total_cmp);
    assert_eq!(field(&json, "ratio"), values[1], "{json}");
    let (bw, base) = (field(&json, "bw_avg_mbps"), field(&json, "baseline_mbps"));
    assert!((bw / base - values[1]).abs() < 0.01, "{json}");
}

/// A UDP bandwidth test's rounds are ordered by the ratio its target names, against
/// raw UDP with GSO and GRO: the reported `ratio_gso_gro` is the median round's, and
/// the plain-UDP ratio is that same round's.
#[test]
fn udp_bandwidth_rounds_are_ordered_by_the_gso_gro_ratio() {
    let json = bench_json_with(
        &["write_bw", "--size", "4096", "-n", "20", "--rounds", "3"],
        &["--json"],
    );
    let mut values = array(&json, "round_values");
    assert_eq!(values.len(), 3, "{json}");
    values.sort_by(f64::total_cmp);
    assert_eq!(field(&json, "ratio_gso_gro"), values[1], "{json}");
    let bw = field(&json, "bw_avg_mbps");
    let (gso, plain) = (
        field(&json, "baseline_gso_gro_mbps"),
        field(&json, "baseline_mbps"),
    );
    // The JSON rounds each number to three decimals.
    assert!((bw / gso - values[1]).abs() < 0.001, "{json}");
    assert!((bw / plain - field(&json, "ratio")).abs() < 0.001, "{json}");
}

/// A latency test's rounds (UDP loopback): each round is measured against its own raw
/// ping-pong, and the reported ratio is the median round's.
#[test]
fn latency_rounds_measure_the_baseline_each() {
    let json = bench_json_with(&["send_lat", "-n", "200", "--rounds", "3"], &["--json"]);
    assert_eq!(field(&json, "rounds"), 3.0, "{json}");
    let mut values = array(&json, "round_values");
    assert_eq!(values.len(), 3, "{json}");
    values.sort_by(f64::total_cmp);
    assert_eq!(field(&json, "ratio"), values[1], "{json}");
    let (lat, base) = (field(&json, "lat_typical_us"), field(&json, "baseline_us"));
    assert!((lat / base / values[1] - 1.0).abs() < 0.01, "{json}");
}

/// `--wait-send` (perftest's latency loop: each side waits for its send's own
/// completion before the answer) runs both latency tests to the end on UDP loopback:
/// the ACK of each side's last message, which our peer sends after its answer, comes.
#[test]
fn latency_tests_can_wait_for_each_sends_completion() {
    for test in ["send_lat", "write_lat"] {
        let json = bench_json_with(
            &[test, "-n", "300", "--wait-send", "--busy-poll"],
            &["--no-baseline", "--json"],
        );
        assert!(json.contains("\"wait_send\":true"), "{json}");
        assert!(field(&json, "lat_typical_us") > 0.0, "{json}");
    }
}

/// `--rounds 0` is refused, as `--qps 0` is.
#[test]
fn zero_rounds_is_an_error() {
    let err = refused(&["send_lat", "-n", "10", "--rounds", "0"]);
    assert!(err.contains("--rounds must be at least 1"), "{err}");
}

/// A debug build's bench says so in its banner, ahead of its results, and in its JSON
/// line; a release build's says nothing of the kind (issue 29, point 5). The test and
/// the binary are built with the same profile, so `cfg!(debug_assertions)` here is
/// the binary's.
#[test]
fn a_debug_build_says_so_before_its_results() {
    let text = bench_text(&[
        "write_bw",
        "--fabric",
        "--no-baseline",
        "--json",
        "--size",
        "64",
        "-n",
        "10",
    ]);
    let note = text.find(" Build           : DEBUG");
    let results = text.find("#bytes").expect("a results table");
    let json = json_line(&text);
    if cfg!(debug_assertions) {
        assert!(note.is_some_and(|n| n < results), "{text}");
        assert!(json.contains("\"debug_build\":true"), "{json}");
    } else {
        assert!(note.is_none(), "{text}");
        assert!(json.contains("\"debug_build\":false"), "{json}");
    }
}

/// `--tx-depth` bounds the WRs in flight over all QPs, also with more QPs than that:
/// 10,000 QPs of 64 KiB WRITEs over UDP loopback with 32 in flight complete. With one
/// in flight per QP at once (625 MiB) the receiver's socket overflowed again and again
/// and an RC QP ran out of retries.
#[test]
fn tx_depth_bounds_the_writes_in_flight_over_all_qps() {
    let json = bench_json_with(
        &["write_bw", "--qps", "10000", "--tx-depth", "32"],
        &["--no-baseline", "--rounds", "1", "--json"],
    );
    assert_eq!(field(&json, "qps"), 10_000.0, "{json}");
    assert!(field(&json, "bw_avg_mbps") > 0.0, "{json}");
}

/// On the shared-memory link (`--link shm`) the bandwidth and latency tests run and say
/// so; WRITE's bytes arrive exactly (`--verify`). No timing is checked.
#[test]
fn the_shared_memory_link_carries_the_tests() {
    let port = (20000 + std::process::id() % 20000 + 7).to_string();
    let json = bench_json_with(
        &[
            "write_bw", "--link", "shm", "-s", "65536", "-n", "200", "--verify",
        ],
        &["--port", &port, "--no-baseline", "--json"],
    );
    assert!(json.contains("\"transport\":\"shm\""), "{json}");
    let json = bench_json_with(
        &["send_lat", "--link", "shm", "-n", "200"],
        &["--port", &port, "--no-baseline", "--json"],
    );
    assert!(json.contains("\"transport\":\"shm\""), "{json}");
}

/// A latency test on the rings is also compared with a cache line's trip between two
/// threads (the host's floor for the rings), which a test over UDP has no use for.
#[test]
fn latency_on_the_rings_reports_the_hosts_line_trip() {
    let port = (20000 + std::process::id() % 20000 + 13).to_string();
    let json = bench_json_with(
        &["send_lat", "--link", "shm", "-n", "300"],
        &["--port", &port, "--json"],
    );
    let line = field(&json, "line_pingpong_us");
    assert!(line > 0.0 && line.is_finite(), "{json}");
    let json = bench_json_with(&["send_lat", "-n", "300"], &["--json"]);
    assert!(!json.contains("line_pingpong_us"), "{json}");
}

/// With `--link auto` the two devices are UDP devices that find each other's offer of
/// the shared-memory link and use it: the bench says how many packets each received
/// through the rings. No timing is checked.
#[test]
fn the_automatic_link_chooses_the_rings() {
    let port = (20000 + std::process::id() % 20000 + 11).to_string();
    let text = bench_text(&[
        "send_lat",
        "--link",
        "auto",
        "-n",
        "200",
        "--port",
        &port,
        "--no-baseline",
        "--json",
    ]);
    assert!(text.contains("\"transport\":\"auto\""), "{text}");
    for side in ["client", "server"] {
        let n = received_through_rings(&text, side);
        assert!(n >= 200, "{side}: {n} packets through the rings");
    }
}

/// With `--two-processes` the server's device runs in a child process: a bandwidth
/// test runs on each link, the child's packets (its ACKs) are counted with the
/// client's, and the child reports what it received through the rings. No timing is
/// checked.
#[test]
fn a_server_in_its_own_process_serves_the_bandwidth_tests() {
    let port = (20000 + std::process::id() % 20000 + 17).to_string();
    for (test, link) in [("write_bw", "shm"), ("send_bw", "udp"), ("read_bw", "auto")] {
        let text = bench_text(&[
            test,
            "--link",
            link,
            "--two-processes",
            "-n",
            "200",
            "--qps",
            "2",
            "--port",
            &port,
            "--no-baseline",
            "--json",
        ]);
        let json = json_line(&text);
        assert!(json.contains("\"processes\":2"), "{json}");
        // 16 packets a 64 KiB message at MTU 4096, the requests or READ responses,
        // and the other side's ACKs or requests on top.
        let per_msg = field(&json, "packets_per_msg");
        assert!(
            per_msg > 16.0,
            "{test} on {link}: {per_msg} packets per message"
        );
        if link != "udp" {
            let n = received_through_rings(&text, "server");
            assert!(n >= 400, "{test} on {link}: {n} packets through the rings");
        }
    }
}

/// The options `--two-processes` cannot serve are refused before anything runs.
#[test]
fn two_processes_are_for_bandwidth_tests_without_verify() {
    for args in [
        &["send_lat", "--two-processes"][..],
        &["write_bw", "--two-processes", "--verify"],
        &["write_bw", "--two-processes", "--fabric"],
        &["flood", "--two-processes"],
    ] {
        let err = refused(args);
        assert!(err.contains("--two-processes"), "{args:?}: {err}");
    }
}

/// A latency test on the fabric is refused with the links it runs on: the fabric's
/// clock is virtual, so a wall-clock latency there would mean nothing.
#[test]
fn latency_tests_name_the_links_they_run_on() {
    for test in ["send_lat", "write_lat", "read_lat"] {
        let err = refused(&[test, "--fabric"]);
        assert!(err.contains("udp, shm or auto"), "{test}: {err}");
    }
}

/// `--port` names the links' ports; on the fabric, which has none, it is refused.
#[test]
fn a_port_on_the_fabric_is_refused() {
    let err = refused(&["write_bw", "--fabric", "--port", "20001"]);
    assert!(err.contains("udp, shm, auto"), "{err}");
}

/// `--one-thread` runs both sides of send_lat and write_lat in one thread, in turn, on
/// the rings: every message and answer arrives (the run ends), each side's device
/// received its packets through the rings, and no baseline is measured. No timing is
/// checked.
#[test]
fn one_thread_runs_both_sides_of_a_ping_pong_in_turn() {
    let port = (20000 + std::process::id() % 20000 + 19).to_string();
    for test in ["send_lat", "write_lat"] {
        let text = bench_text(&[
            test,
            "--link",
            "shm",
            "--busy-poll",
            "--one-thread",
            "-n",
            "500",
            "--port",
            &port,
            "--json",
        ]);
        let json = json_line(&text);
        assert!(json.contains("\"one_thread\":true"), "{json}");
        assert!(field(&json, "lat_typical_us") > 0.0, "{json}");
        assert!(!json.contains("baseline_us"), "{json}");
        assert!(text.contains("one thread in turn"), "{text}");
        // Each side's messages, and the ACKs of the other's.
        for side in ["client", "server"] {
            let n = received_through_rings(&text, side);
            assert!(n >= 500, "{test}: {side} {n} packets through the rings");
        }
    }
    let plain = bench_json_with(&["send_lat", "-n", "100"], &["--no-baseline", "--json"]);
    assert!(plain.contains("\"one_thread\":false"), "{plain}");
}

/// `--one-thread` needs `--busy-poll` (a yield or a wait for an event would wait for a
/// message nobody else sends) and a ping-pong that neither side awaits its own sends
/// in (the ACK it waits for comes only when the other side is polled).
#[test]
fn one_thread_is_for_busy_polled_ping_pongs() {
    for (args, says) in [
        (&["send_lat", "--one-thread"][..], "--busy-poll"),
        (
            &["send_lat", "--one-thread", "--busy-poll", "--wait-send"],
            "--wait-send",
        ),
        (&["send_lat", "--one-thread", "--events"], "--events"),
        (
            &["read_lat", "--one-thread", "--busy-poll"],
            "send_lat and write_lat",
        ),
        (
            &["write_bw", "--one-thread", "--busy-poll"],
            "send_lat and write_lat",
        ),
    ] {
        let err = refused(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
