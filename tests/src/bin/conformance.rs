//! Runs the conformance suite on one backend and reports per-case results; writes the
//! coverage matrix with the results as markdown.
//!
//! ```text
//! conformance [--list] [--backend emu-udp|emu-fabric|hw|hw:NAME] [--ip ADDR [--link-faults IFNAME]] [--markdown FILE] [--save FILE] [--results FILE]... [--skip-list FILE] [FILTER]
//! ```
//!
//! `--ip ADDR` is the address of the emu-udp backend's devices (127.0.0.1 by default);
//! `--link-faults IFNAME` lets the link-fault cases take the interface that carries it
//! down and up (root). `scripts/ci-netns.sh` runs the suite so, in a network namespace
//! with the devices on a veth.
//!
//! `--results FILE` (repeatable) reads earlier runs' result files (one `name<TAB>verdict`
//! line per case, as `--save` writes them) so one markdown table can compare backends,
//! e.g. the emulator here and kernel rxe in the VM. Exits non-zero if a case failed.
//!
//! `--skip-list FILE` names cases not to run on this backend, one `name | why` per line
//! (`#` starts a comment): cases that crash the kernel under test
//! (`scripts/rxe-vm/conformance-crashes.txt`), which would end the run. They are
//! reported as skipped with their reason.

use std::io::Write;

// `conformance/checks.rs` is a symbolic link to emu-core's examples' `common/checks.rs`,
// so that `cargo package` puts its text in this crate's package.
#[path = "conformance/checks.rs"]
mod checks;
use checks::{die, OrDie};

use verbs_conformance::matrix::{render, Verdict};
use verbs_conformance::{
    all_cases, run_case, Backend, EmuFabric, EmuUdp, EMU_PENDING, FABRIC_PENDING,
};

fn parse_results(text: &str) -> Vec<(String, Verdict)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, '\t');
            let name = it.next()?.to_string();
            let v = match it.next()? {
                "pass" => Verdict::Pass,
                "fail" => Verdict::Fail(it.next().unwrap_or("").to_string()),
                _ => Verdict::Skip(it.next().unwrap_or("").to_string()),
            };
            Some((name, v))
        })
        .collect()
}

/// The cases of a `--skip-list` file: `name | why` per line, `#` comments.
fn parse_skips(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let (name, why) = l.split_once('|')?;
            Some((name.trim().to_string(), why.trim().to_string()))
        })
        .filter(|(n, _)| !n.is_empty())
        .collect()
}

/// A case that takes this long is named in the output with its time.
const SLOW: std::time::Duration = std::time::Duration::from_secs(2);

fn main() {
    let mut backend_name = "emu-udp".to_string();
    let mut emu_udp = EmuUdp::default();
    let mut markdown = None;
    let mut save = None;
    let mut earlier = Vec::new();
    let mut filter = None;
    let mut skips: Vec<(String, String)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--backend" => backend_name = val(),
            "--ip" => {
                let ip = val();
                emu_udp.ip = ip.parse().or_die(&format!("--ip {ip}"));
            }
            "--link-faults" => emu_udp.link_faults = Some(val()),
            "--markdown" => markdown = Some(val()),
            "--save" => save = Some(val()),
            "--results" => {
                let f = val();
                let text = std::fs::read_to_string(&f).or_die(&f);
                let label = std::path::Path::new(&f)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or(f.clone());
                earlier.push((label, parse_results(&text)));
            }
            "--skip-list" => {
                let f = val();
                let text = std::fs::read_to_string(&f).or_die(&f);
                skips.extend(parse_skips(&text));
            }
            "--list" => {
                for c in all_cases() {
                    println!("{}", c.name);
                }
                return;
            }
            "-h" | "--help" => {
                println!("conformance [--backend emu-udp|emu-fabric|hw|hw:NAME] [--ip ADDR [--link-faults IFNAME]] [--markdown FILE] [--save FILE] [--results FILE]... [--skip-list FILE] [FILTER]");
                return;
            }
            o if o.starts_with('-') => die(&format!("unknown option {o}")),
            f => {
                if let Some(first) = filter.replace(f.to_string()) {
                    die(&format!("one FILTER only (got {first} and {f})"));
                }
            }
        }
    }
    let backend: Box<dyn Backend> = match backend_name.as_str() {
        "emu-udp" => Box::new(emu_udp),
        "emu-fabric" => Box::new(EmuFabric),
        #[cfg(feature = "hw")]
        hw if hw == "hw" || hw.starts_with("hw:") => Box::new(verbs_conformance::backends::Hw {
            name: hw.strip_prefix("hw:").map(String::from),
        }),
        other => {
            eprintln!(
                "conformance: unknown backend {other} (this build knows: emu-udp, emu-fabric{})",
                if cfg!(feature = "hw") {
                    ", hw, hw:NAME"
                } else {
                    "; build with --features hw for hw"
                }
            );
            std::process::exit(2);
        }
    };
    let cases = all_cases();
    if let Some(f) = filter
        .as_ref()
        .filter(|f| !cases.iter().any(|c| c.name.contains(f.as_str())))
    {
        die(&format!("no case matches {f} (see --list)"));
    }
    let mut results = Vec::new();
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    let stdout = std::io::stdout();
    for case in &cases {
        if filter
            .as_ref()
            .is_some_and(|f| !case.name.contains(f.as_str()))
        {
            continue;
        }
        let started = std::time::Instant::now();
        let v = if let Some((_, why)) = skips.iter().find(|(n, _)| *n == case.name) {
            Verdict::Skip(format!("not run on this backend: {why}"))
        } else if backend.is_emulator() && EMU_PENDING.iter().any(|p| case.name.starts_with(p)) {
            Verdict::Skip("not emulated yet (README: what does not work yet)".into())
        } else if backend.name() == "emu-fabric"
            && FABRIC_PENDING.iter().any(|p| case.name.starts_with(p))
        {
            Verdict::Skip("the simulated fabric does not carry the IP TOS byte yet".into())
        } else {
            run_case(case, backend.as_ref())
        };
        let mut out = stdout.lock();
        let took = started.elapsed();
        if took >= SLOW {
            // The suite runs within a time budget on hardware (scripts/rxe-vm/hw-job.sh).
            let _ = writeln!(out, "slow {}: {:.1} s", case.name, took.as_secs_f64());
        }
        match &v {
            Verdict::Pass => pass += 1,
            Verdict::Fail(m) => {
                fail += 1;
                let _ = writeln!(
                    out,
                    "FAIL {}: {}",
                    case.name,
                    m.lines().next().unwrap_or("")
                );
            }
            Verdict::Skip(r) => {
                skip += 1;
                let _ = writeln!(out, "skip {}: {r}", case.name);
            }
        }
        results.push((case.name.clone(), v));
    }
    println!(
        "{}: {pass} passed, {fail} failed, {skip} skipped",
        backend.name()
    );
    if let Some(f) = save {
        let text: String = results
            .iter()
            .map(|(n, v)| match v {
                Verdict::Pass => format!("{n}\tpass\n"),
                Verdict::Fail(m) => format!(
                    "{n}\tfail\t{}\n",
                    m.lines().next().unwrap_or("").replace('\t', " ")
                ),
                Verdict::Skip(r) => format!("{n}\tskip\t{}\n", r.replace('\t', " ")),
            })
            .collect();
        std::fs::write(&f, text).or_die(&f);
    }
    if let Some(f) = markdown {
        let mut all = vec![(backend.name().to_string(), results)];
        all.extend(earlier);
        std::fs::write(&f, render(&cases, &all)).or_die(&f);
        println!("wrote {f}");
    }
    if fail > 0 {
        std::process::exit(1);
    }
}
