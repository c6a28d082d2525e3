//! The chaos soak (see `emu_sims::chaos`): RC, UC and UD traffic between three emulated
//! devices over UDP with seeded loss, duplication, reordering, junk datagrams and one
//! device restarting, every byte checked; or, with `--fabric`, its replay on the
//! simulated fabric. Prints the seed and a summary; exits 1 on any failure, with the
//! command that replays the run on the fabric.
//!
//! `cargo run --release -p emu-sims --example chaos_soak -- --secs 120 --pairs 8`

use clap::Parser;

/// Command line: the soak's options.
#[derive(Parser)]
#[command(about = "Chaos soak of the emulated RoCE devices over UDP (or its replay on the fabric)")]
struct Cli {
    #[command(flatten)]
    soak: emu_sims::chaos::SoakArgs,
}

fn main() {
    let cli = Cli::parse();
    let report = emu_sims::chaos::run(&cli.soak);
    print!("{report}");
    if !report.passed() {
        std::process::exit(1);
    }
}
