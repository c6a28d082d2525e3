//! The conformance suite on the emulator on the simulated fabric: every case, each on a
//! fabric of its own (virtual time, seeded), with the fault-injection capability.

use libtest_mimic::{Arguments, Failed, Trial};
use tests::matrix::Verdict;
use tests::{all_cases, run_case, EmuFabric};

fn main() {
    let args = Arguments::from_args();
    let trials = all_cases()
        .into_iter()
        .map(|case| {
            Trial::test(case.name.clone(), move || {
                match run_case(&case, &EmuFabric) {
                    Verdict::Pass => Ok(()),
                    Verdict::Fail(m) => Err(Failed::from(m)),
                    Verdict::Skip(why) => Err(Failed::from(format!(
                        "skipped on the emulator, which should produce every condition: {why}"
                    ))),
                }
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
