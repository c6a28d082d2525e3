//! Scenario files: an experiment on the fabric written as text (TOML) instead of
//! Rust. A file names its hosts (`a` and `b`, and more if it likes) and their QP
//! attributes, the fault rules, the program (a list of steps, each a verb on one host
//! or an act on the fabric) and what the
//! student expects to see: completions with their statuses, async events, final QP
//! states, counters, memory and packets on the wire. [`Script::run`] runs it and
//! reports which expectations held.
//!
//! docs/learning.md describes the format for users; the built-in files are in
//! `sims/scenarios/` ([`builtin`]). Errors name the file's line: `FILE:LINE: what`.

mod exec;
mod expect;
mod format;
mod load;
pub mod spec;

use std::fmt;
use std::time::Duration;

use verbs_api::{AsyncEventType, QpState, WcStatus};

use crate::pair::PairConfig;
use crate::trace::Trace;

pub use expect::{Finding, Report};
pub use spec::{Spec, Verb};

/// A file that cannot be run as written: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file's name as given.
    pub file: String,
    /// The 1-based line, where the error has one (a rule given on the command line
    /// has none).
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for FileError {}

/// A host, by its place in [`Script::hosts`]: `a` (192.0.2.1), `b` (192.0.2.2), then
/// the others in name order (192.0.2.3, ...).
pub(crate) type Side = usize;

/// A host: its name, its QP's peer and whether that QP takes its receives from an SRQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostSpec {
    pub name: String,
    /// The host its RC or UC QP is connected to; for UD, where a SEND goes by default.
    pub peer: Option<Side>,
    /// `Some(max_wr)`: the QP's receives come from an SRQ of that size.
    pub srq: Option<u32>,
}

/// Bytes written to memory or expected there.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Bytes {
    /// These bytes.
    Text(Vec<u8>),
    /// One little-endian 64-bit word (an atomic's operand or result).
    U64(u64),
    /// `len` bytes, byte i = i * mul + add (mod 256).
    Pattern { mul: u8, add: u8, len: usize },
    /// `len` copies of one byte.
    Fill { byte: u8, len: usize },
}

/// A memory range and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Mem {
    pub offset: usize,
    pub bytes: Bytes,
}

/// What a work request does (its `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Send,
    SendWithInv,
    Write,
    Read,
    FetchAdd,
    CmpSwap,
}

/// Which rkey a work request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rkey {
    /// The peer's memory region.
    Mr,
    /// The peer's region's rkey with a bit flipped: no such key.
    Wrong,
    /// The memory window the peer bound (`bind_mw`).
    Window,
}

/// One send work request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SendSpec {
    pub wr_id: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u32,
    pub text: Option<Vec<u8>>,
    pub remote_offset: u64,
    pub rkey: Rkey,
    pub add: u64,
    pub compare: u64,
    pub swap: u64,
    pub fence: bool,
    pub signaled: bool,
    pub qkey: Option<u32>,
    /// The host whose memory (or, on UD, whose QP) the WR is for.
    pub to: Side,
}

/// One receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvSpec {
    pub wr_id: u64,
    pub offset: u64,
    pub len: u32,
}

/// What a step does.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Act {
    PostSend(Side, Vec<SendSpec>),
    PostRecv(Side, Vec<RecvSpec>),
    PostSrqRecv(Side, Vec<RecvSpec>),
    Wait(Side, usize),
    RunFor(Duration),
    Run(Duration),
    ModifyQp(Side, QpState),
    ArmSrq(Side, u32),
    Write(Side, Mem),
    BindMw {
        side: Side,
        wr_id: u64,
        offset: u64,
        len: u64,
        key: u8,
    },
    Partition(Side, Side),
    Link(Side, Side, crate::LinkConfig),
}

/// A step of the program and its line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Step {
    pub line: usize,
    pub act: Act,
}

/// A fault rule and where it was given.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RuleLine {
    pub verb: Verb,
    pub text: String,
    pub spec: Spec,
    /// The name traces give it (`name = ...`), else the verb and its text.
    pub name: Option<String>,
    /// Its line, or `None` for a rule from the command line.
    pub line: Option<usize>,
}

/// What the student expects.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Want {
    Completions(Side, Vec<(u64, WcStatus, Option<u32>)>),
    Events(Side, Vec<AsyncEventType>),
    State(Side, QpState),
    Counter(Side, String, u64),
    Memory(Side, Mem),
    Packets(String, Box<Spec>, u64),
}

/// An expectation and its line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Expectation {
    pub line: usize,
    pub want: Want,
}

/// A checked scenario file, ready to run.
#[derive(Clone, Debug)]
pub struct Script {
    /// Its name (`name = ...`).
    pub name: String,
    /// What it shows (`description = ...`).
    pub description: String,
    /// The file's name, for messages.
    pub file: String,
    pub(crate) cfg: PairConfig,
    pub(crate) hosts: Vec<HostSpec>,
    pub(crate) rules: Vec<RuleLine>,
    pub(crate) steps: Vec<Step>,
    pub(crate) expect: Vec<Expectation>,
}

/// A run of a script: the trace and the verdict on each expectation.
#[derive(Debug)]
pub struct ScriptOutcome {
    /// Every packet and host event.
    pub trace: Trace,
    /// Which expectations held.
    pub report: Report,
}

impl Script {
    /// Reads a scenario file's text; `file` names it in errors (`FILE:LINE: ...`).
    pub fn parse(file: &str, text: &str) -> Result<Script, FileError> {
        load::load(file, text)
    }

    /// Adds a fault rule after the file's own (`rdma-emu scenario run NAME --drop
    /// 'kind=read_response,nth=3'`); `text` is the same `key=value,...` a file's
    /// `[[rule]]` takes.
    pub fn add_rule(&mut self, verb: Verb, text: &str) -> Result<(), FileError> {
        let err = |message: String| FileError {
            file: self.file.clone(),
            line: None,
            message: format!("--{} {text:?}: {message}", verb.word().replace('_', "-")),
        };
        let spec = Spec::parse(text).map_err(err)?;
        let names: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
        load::check_rule(&spec, verb, text, &names).map_err(err)?;
        self.rules.push(RuleLine {
            verb,
            text: text.to_owned(),
            spec,
            name: None,
            line: None,
        });
        Ok(())
    }

    /// Runs the script on a fresh fabric seeded with `seed`.
    pub fn run(&self, seed: u64) -> ScriptOutcome {
        exec::run(self, seed)
    }
}

/// The scenario files built into the library (`sims/scenarios/*.toml`), as
/// `(name, text)`: every scenario of [`crate::scenario::all`], written as a file.
pub fn builtin() -> &'static [(&'static str, &'static str)] {
    macro_rules! files {
        ($($name:literal),* $(,)?) => {
            &[$(($name, include_str!(concat!("../../scenarios/", $name, ".toml")))),*]
        };
    }
    files!(
        "rnr-nak-then-success",
        "rnr-retry-exhausted",
        "ack-timeout-retransmit",
        "retry-exhausted",
        "psn-sequence-error",
        "lost-read-response",
        "duplicate-read-replayed",
        "duplicate-atomic-saved-result",
        "ack-coalescing",
        "icrc-corruption",
        "lossy-link",
        "uc-message-lost",
        "rkey-violation",
        "cq-overrun",
        "srq-limit",
        "fence",
        "qp-error-flush",
        "ud-message-over-mtu",
        "qkey-mismatch",
        "mw-invalidation",
    )
}

/// The built-in file called `name`, parsed (the tests parse every one of them).
pub fn find_builtin(name: &str) -> Option<Result<Script, FileError>> {
    let (n, text) = builtin().iter().find(|(n, _)| *n == name)?;
    Some(Script::parse(&format!("sims/scenarios/{n}.toml"), text))
}
