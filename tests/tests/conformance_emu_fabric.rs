//! The conformance suite on the emulator on the simulated fabric: every case, each on a
//! fabric of its own (virtual time, seeded), with the fault-injection capability;
//! cases the fabric cannot carry yet (`FABRIC_PENDING`) are ignored.

use libtest_mimic::{Arguments, Failed, Trial};
use verbs_conformance::matrix::Verdict;
use verbs_conformance::{all_cases, run_case, EmuFabric, FABRIC_PENDING};

fn main() {
    let args = Arguments::from_args();
    let trials = all_cases()
        .into_iter()
        .map(|case| {
            let pending = FABRIC_PENDING.iter().any(|p| case.name.starts_with(p));
            Trial::test(case.name.clone(), move || {
                match run_case(&case, &EmuFabric) {
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
