//! Stress runs on the simulated fabric: the concurrency cases many times over (a race
//! that shows once in a hundred runs shows here), and the full traffic mixes of issue
//! #28 (100 QPs x 10,000 operations each, on the fabric and over UDP on loopback),
//! which the suite runs shortened.

use verbs_conformance::cases::traffic::{run_mix, FULL_OPS, MIXES};
use verbs_conformance::matrix::Verdict;
use verbs_conformance::{all_cases, run_case, Backend, EmuFabric, Env};

/// How many times each concurrency case runs.
const RUNS: usize = 30;

#[test]
fn concurrency_cases_hold_run_after_run() {
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.name.starts_with("threads::"))
        .collect();
    assert!(cases.len() >= 10, "the concurrency cases are registered");
    for run in 0..RUNS {
        for c in &cases {
            match run_case(c, &EmuFabric) {
                Verdict::Pass => {}
                v => panic!("run {run} of {}: {v:?}", c.name),
            }
        }
    }
}

/// Mix `which` in full on `backend`.
fn full_on(backend: &dyn Backend, which: usize) {
    let env = Env::from_opened(backend.open(), backend);
    run_mix(&env, which, FULL_OPS);
}

fn full(which: usize) {
    full_on(&EmuFabric, which);
}

#[test]
fn traffic_full_rc_mixed_ops() {
    assert_eq!(MIXES[0].0, "rc_mixed_ops_on_100_qps");
    full(0);
}

#[test]
fn traffic_full_uc_sends_and_writes() {
    full(1);
}

#[test]
fn traffic_full_rc_mixed_ops_from_4_threads() {
    full(2);
}

/// The full mixes over UDP on loopback: every packet through the kernel's sockets.
fn full_udp(which: usize) {
    full_on(&verbs_conformance::EmuUdp::default(), which);
}

#[test]
fn traffic_full_rc_mixed_ops_over_udp() {
    full_udp(0);
}

#[test]
fn traffic_full_uc_sends_and_writes_over_udp() {
    full_udp(1);
}

#[test]
fn traffic_full_rc_mixed_ops_from_4_threads_over_udp() {
    full_udp(2);
}
