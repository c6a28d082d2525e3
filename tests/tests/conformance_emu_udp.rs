//! The conformance suite on the emulator over UDP loopback: every case, each on a
//! device of its own (127.0.0.1, a port picked by the OS, talking to itself). Cases
//! that need fault injection run on the fabric (`conformance_emu_fabric`) only.

use libtest_mimic::{Arguments, Failed, Trial};
use verbs_conformance::matrix::Verdict;
use verbs_conformance::{all_cases, run_case, EmuUdp, EMU_PENDING};

fn main() {
    let args = Arguments::from_args();
    let trials = all_cases()
        .into_iter()
        .map(|case| {
            let pending = case.needs != verbs_conformance::FaultNeed::Nothing
                || EMU_PENDING.iter().any(|p| case.name.starts_with(p));
            Trial::test(case.name.clone(), move || {
                match run_case(&case, &EmuUdp::default()) {
                    Verdict::Pass => Ok(()),
                    Verdict::Fail(m) => Err(Failed::from(m)),
                    Verdict::Skip(why) => Err(Failed::from(format!(
                        "skipped on the emulator, which should produce every condition: {why}"
                    ))),
                }
            })
            .with_ignored_flag(pending)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
