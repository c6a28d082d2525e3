//! `rdma-emu`: the project's command-line tool. Subcommands are variants of
//! [`Command`], each with a `run` function; add new ones there.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use emu_sims::scenario;

mod cli;

#[derive(Parser)]
#[command(
    name = "rdma-emu",
    version,
    about = "A userspace soft-RoCE you can test against"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Opens an emulated device and prints its attributes, as `ibv_devinfo -v`.
    Devinfo(cli::devinfo::DevinfoOpts),
    /// Ping-pong between two emulated devices, as rdma-core's ibv_{rc,uc,ud,srq}_pingpong:
    /// no HOST = server, HOST = client, `--loopback` = both ends in this process.
    /// Options: -s SIZE -n ITERS -p TCP_PORT --ip ADDR --udp-port N -q NUM_QP (srq)
    /// --timeout SECS --loopback, then HOST or nothing.
    Pingpong {
        /// The transport.
        #[arg(value_enum)]
        transport: PingpongKind,
        /// The options of the rdma-core example, passed through.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// perftest-style bandwidth and latency tests, each with its ratio against raw
    /// UDP (or memcpy) measured in the same run.
    Bench(cli::bench::BenchOpts),
    /// Runs an unmodified program (UCX, libfabric, pyverbs, ...) on the emulated
    /// device: the emulator's libibverbs/librdmacm first on LD_LIBRARY_PATH, and, in
    /// a user + mount namespace, /sys/class/infiniband, /sys/class/infiniband_verbs
    /// and /dev/infiniband describing the device. `rdma-emu exec [--ip ADDR] -- PROGRAM ARGS...`
    Exec(cli::exec::ExecOpts),
    /// The scenario library: deterministic programs on a simulated fabric, one rule
    /// of the transport each.
    Scenario {
        #[command(subcommand)]
        action: ScenarioCmd,
    },
    /// Prints a shell completion script on stdout.
    ///
    /// Bash: `rdma-emu completions bash > ~/.local/share/bash-completion/completions/rdma-emu`;
    /// zsh: `rdma-emu completions zsh > ~/.zfunc/_rdma-emu` (with ~/.zfunc on $fpath);
    /// fish: `rdma-emu completions fish > ~/.config/fish/completions/rdma-emu.fish`.
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Which ping-pong.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PingpongKind {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// RC QPs sharing a receive queue.
    Srq,
}

#[derive(Subcommand)]
enum ScenarioCmd {
    /// One scenario per line: its name, then what it shows.
    List,
    /// Runs a scenario (a built-in NAME or a scenario FILE), prints its packets as a
    /// ladder diagram and, for a file, which of its expectations held (the exit status
    /// is 1 if one did not).
    Run {
        /// The scenario's name (see `scenario list`) or a scenario file (TOML, see
        /// docs/learning.md).
        name: String,
        /// Seed of the fabric's random faults.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also write every packet to this pcap file (Wireshark, tshark).
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// Also write the diagram as SVG to this file.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Also write a page that steps through the run to this HTML file (one file,
        /// for any browser: each packet's headers and both sides' QPs, queues and
        /// completions at each step).
        #[arg(long)]
        html: Option<PathBuf>,
        // Boxed: the other variants are small.
        #[command(flatten)]
        rules: Box<RuleArgs>,
    },
    /// Prints a built-in scenario's file, to copy and change.
    Show {
        /// The scenario's name.
        name: String,
    },
}

/// Fault rules added after a scenario file's own, each `key=value,...` as a file's
/// `[[rule]]` takes it (e.g. `--drop 'kind=read_response,nth=3'`). Keys: from, to,
/// opcode, kind, psn, qp, nth, first; by (delay), bytes (truncate), timer and
/// requester (rnr-nak).
#[derive(clap::Args, Default)]
struct RuleArgs {
    /// Drops the packets the rule picks.
    #[arg(long, value_name = "RULE")]
    drop: Vec<String>,
    /// Delivers them twice.
    #[arg(long, value_name = "RULE")]
    duplicate: Vec<String>,
    /// Delays them by `by=` (e.g. `kind=ack,by=100us`).
    #[arg(long, value_name = "RULE")]
    delay: Vec<String>,
    /// Flips a bit of their ICRC.
    #[arg(long, value_name = "RULE")]
    corrupt: Vec<String>,
    /// Answers the requests with an RNR NAK (`timer=` code).
    #[arg(long, value_name = "RULE")]
    rnr_nak: Vec<String>,
    /// Cuts `bytes=` off their payload.
    #[arg(long, value_name = "RULE")]
    truncate: Vec<String>,
}

impl RuleArgs {
    /// Every rule, with its verb, in the order of the options above.
    fn all(&self) -> Vec<(emu_sims::script::Verb, &str)> {
        use emu_sims::script::Verb;
        [
            (Verb::Drop, &self.drop),
            (Verb::Duplicate, &self.duplicate),
            (Verb::Delay, &self.delay),
            (Verb::Corrupt, &self.corrupt),
            (Verb::RnrNak, &self.rnr_nak),
            (Verb::Truncate, &self.truncate),
        ]
        .into_iter()
        .flat_map(|(v, texts)| texts.iter().map(move |t| (v, t.as_str())))
        .collect()
    }
}

/// The scenario file `name` names: a path to a file, or a built-in file.
fn load_script(name: &str) -> Result<Option<emu_sims::script::Script>, String> {
    let path = std::path::Path::new(name);
    if path.is_file() || name.ends_with(".toml") {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
        return emu_sims::script::Script::parse(name, &text)
            .map(Some)
            .map_err(|e| e.to_string());
    }
    emu_sims::script::find_builtin(name)
        .transpose()
        .map_err(|e| e.to_string())
}

/// The files `scenario run` writes besides its ladder.
struct Outputs {
    pcap: Option<PathBuf>,
    svg: Option<PathBuf>,
    html: Option<PathBuf>,
}

/// Writes the pcap, SVG and HTML files asked for.
fn write_outputs(
    trace: &emu_sims::Trace,
    out: Outputs,
    name: &str,
    description: &str,
) -> Result<(), String> {
    let failed = |path: &PathBuf, e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(path) = out.pcap {
        let file = std::fs::File::create(&path).map_err(|e| failed(&path, e))?;
        emu_sims::pcap::write(trace, std::io::BufWriter::new(file))
            .map_err(|e| failed(&path, e))?;
    }
    if let Some(path) = out.svg {
        std::fs::write(
            &path,
            emu_sims::svg::render_titled(trace, name, description),
        )
        .map_err(|e| failed(&path, e))?;
    }
    if let Some(path) = out.html {
        std::fs::write(&path, emu_sims::html::render(trace, name, description))
            .map_err(|e| failed(&path, e))?;
    }
    Ok(())
}

fn scenario_cmd(action: ScenarioCmd) -> Result<(), String> {
    match action {
        ScenarioCmd::List => {
            for s in scenario::all() {
                println!("{:<30} {}", s.name, s.description);
            }
            Ok(())
        }
        ScenarioCmd::Show { name } => {
            let (_, text) = emu_sims::script::builtin()
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| format!("no scenario {name:?} (see `rdma-emu scenario list`)"))?;
            print!("{text}");
            Ok(())
        }
        ScenarioCmd::Run {
            name,
            seed,
            pcap,
            svg,
            html,
            rules,
        } => {
            let mut script = load_script(&name)?
                .ok_or_else(|| format!("no scenario {name:?} (see `rdma-emu scenario list`)"))?;
            for (verb, text) in rules.all() {
                script.add_rule(verb, text).map_err(|e| e.to_string())?;
            }
            println!("{}: {}\n", script.name, script.description);
            let out = script.run(seed);
            print!("{}", emu_sims::ladder::render(&out.trace));
            let files = Outputs { pcap, svg, html };
            write_outputs(&out.trace, files, &script.name, &script.description)?;
            println!("\n{}", out.report);
            if out.report.passed() {
                Ok(())
            } else {
                let failed = out.report.findings.len() - out.report.held();
                Err(match out.report.error {
                    Some(_) => "the program stopped at a failed verb".to_owned(),
                    None => format!("{failed} expectation(s) did not hold"),
                })
            }
        }
    }
}

/// A reader that closes the pipe early (`rdma-emu scenario list | head`) ends the tool
/// quietly, as SIGPIPE ends a C program, with the shell's status for it (128 + 13),
/// instead of a panic: `println!` panics when stdout is a closed pipe, and restoring
/// SIGPIPE's default action would need `unsafe`. Every other panic is reported as
/// before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print to stdout and exit 0, as clap does.
        Err(e) if !e.use_stderr() => e.exit(),
        // No subcommand: clap would print the whole help to stderr.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let given: Vec<String> = std::iter::once("rdma-emu".into())
                .chain(std::env::args().skip(1))
                .collect();
            let given = given.join(" ");
            eprintln!("rdma-emu: `{given}` needs a command (see `{given} --help`)");
            return ExitCode::from(2);
        }
        // A usage error on one line: clap's first paragraph (the error, and the
        // arguments it names on the lines below), without the usage and tips after it.
        Err(e) => {
            let text = e.to_string();
            let error: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let error = error.join(" ");
            eprintln!(
                "rdma-emu: {} (see rdma-emu --help)",
                error.strip_prefix("error: ").unwrap_or(&error)
            );
            return ExitCode::from(2);
        }
    };
    let r = match cli.command {
        Command::Scenario { action } => scenario_cmd(action),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "rdma-emu",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Devinfo(o) => cli::devinfo::run(o),
        Command::Bench(o) => cli::bench::run(o),
        Command::Exec(o) => cli::exec::run(o),
        Command::Pingpong { transport, args } => {
            use cli::pingpong::{main_with_args, Mode};
            let mode = match transport {
                PingpongKind::Rc => Mode::Rc,
                PingpongKind::Uc => Mode::Uc,
                PingpongKind::Ud => Mode::Ud,
                PingpongKind::Srq => Mode::Srq,
            };
            main_with_args(mode, args);
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-emu: {e}");
            ExitCode::FAILURE
        }
    }
}
