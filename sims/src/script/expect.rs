//! Checking what the student expected against what happened, one finding per
//! expectation.

use std::fmt;

use emu_core::engine::upper_snake;

use super::exec::{counter, HostState};
use super::{Bytes, Script, Want};
use crate::trace::Trace;

/// The verdict on one expectation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The expectation's line in its file.
    pub line: usize,
    /// What was expected, in words (`a completions: 1 SUCCESS`).
    pub what: String,
    /// Whether it held.
    pub held: bool,
    /// What happened instead, when it did not hold.
    pub got: Option<String>,
}

/// What a run of a script found: each expectation's verdict, and the error that
/// stopped the program, if one did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The file the expectations come from.
    pub file: String,
    /// One per expectation, in the file's order.
    pub findings: Vec<Finding>,
    /// A verb the program called failed (`FILE:LINE: post_send: ...`): the program
    /// stopped there, and the expectations were checked against what had happened.
    pub error: Option<String>,
}

impl Report {
    pub(super) fn new(file: &str) -> Report {
        Report {
            file: file.to_owned(),
            ..Report::default()
        }
    }

    /// True when the program ran to its end and every expectation held.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.findings.iter().all(|f| f.held)
    }

    /// How many expectations held.
    pub fn held(&self) -> usize {
        self.findings.iter().filter(|f| f.held).count()
    }
}

impl fmt::Display for Report {
    /// One line per expectation (`held` or `NOT HELD`, its line, what, and what came
    /// instead), then the count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.error {
            writeln!(f, "error: {e}")?;
        }
        for x in &self.findings {
            let verdict = if x.held { "held    " } else { "NOT HELD" };
            write!(f, "{verdict}  {}:{}: {}", self.file, x.line, x.what)?;
            match &x.got {
                Some(g) => writeln!(f, "; got {g}")?,
                None => writeln!(f)?,
            }
        }
        write!(
            f,
            "{} of {} expectations held",
            self.held(),
            self.findings.len()
        )
    }
}

/// The bytes of `b` (a `U64` as little-endian, as `MemBuf::write_u64` stores it on
/// the hosts this runs on).
pub(super) fn bytes_of(b: &Bytes) -> Vec<u8> {
    match b {
        Bytes::Text(t) => t.clone(),
        Bytes::U64(v) => v.to_ne_bytes().to_vec(),
        Bytes::Pattern { mul, add, len } => (0..*len)
            .map(|i| (i as u8).wrapping_mul(*mul).wrapping_add(*add))
            .collect(),
        Bytes::Fill { byte, len } => vec![*byte; *len],
    }
}

fn describe(b: &Bytes) -> String {
    match b {
        Bytes::Text(t) => format!("{:?}", String::from_utf8_lossy(t)),
        Bytes::U64(v) => format!("u64 {v}"),
        Bytes::Pattern { mul, add, len } => format!("{len} bytes i*{mul}+{add}"),
        Bytes::Fill { byte, len } => format!("{len} bytes of {byte:#04x}"),
    }
}

fn completions(v: &[(u64, verbs_api::WcStatus, Option<u32>)]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let words: Vec<String> = v
        .iter()
        .map(|(id, st, len)| {
            let st = upper_snake(&format!("{st:?}"));
            match len {
                Some(l) => format!("{id} {st} len={l}"),
                None => format!("{id} {st}"),
            }
        })
        .collect();
    words.join(", ")
}

fn list<T: fmt::Debug>(v: &[T]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let w: Vec<String> = v.iter().map(|x| upper_snake(&format!("{x:?}"))).collect();
    w.join(", ")
}

pub(super) fn check(s: &Script, trace: &Trace, sides: &[HostState], report: &mut Report) {
    let host = |h: &usize| s.hosts[*h].name.as_str();
    for e in &s.expect {
        let (what, got): (String, Option<String>) = match &e.want {
            Want::Completions(h, want) => {
                // A length is compared where the file gives one.
                let same = sides[*h].completions.len() == want.len()
                    && sides[*h]
                        .completions
                        .iter()
                        .zip(want)
                        .all(|(w, (id, st, len))| {
                            w.wr_id == *id && w.status == *st && len.is_none_or(|l| l == w.byte_len)
                        });
                let got_text = completions(
                    &sides[*h]
                        .completions
                        .iter()
                        .zip(want.iter().map(|x| x.2).chain(std::iter::repeat(None)))
                        .map(|(w, l)| (w.wr_id, w.status, l.map(|_| w.byte_len)))
                        .collect::<Vec<_>>(),
                );
                (
                    format!("{} completions: {}", host(h), completions(want)),
                    (!same).then_some(got_text),
                )
            }
            Want::Events(h, want) => {
                let seen: Vec<_> = sides[*h].events.iter().map(|e| e.event_type).collect();
                (
                    format!("{} events: {}", host(h), list(want)),
                    (seen != *want).then(|| list(&seen)),
                )
            }
            Want::State(h, want) => {
                let st = &sides[*h];
                let seen = st.host.ctx.device().query_qp(st.qpn).map(|q| q.0.qp_state);
                (
                    format!("{} QP state: {want}", host(h)),
                    match seen {
                        Ok(s) if s == *want => None,
                        Ok(s) => Some(s.to_string()),
                        Err(e) => Some(format!("query_qp failed: {e}")),
                    },
                )
            }
            Want::Counter(h, name, want) => {
                let seen = counter(&sides[*h], name);
                (
                    format!("{} counter {name} = {want}", host(h)),
                    (seen != Some(*want)).then(|| format!("{seen:?}")),
                )
            }
            Want::Memory(h, m) => {
                let want = bytes_of(&m.bytes);
                let mut seen = vec![0u8; want.len()];
                let r = sides[*h].host.mem.read(m.offset, &mut seen);
                (
                    format!("{} memory at {}: {}", host(h), m.offset, describe(&m.bytes)),
                    match r {
                        Err(e) => Some(e.to_string()),
                        Ok(()) if seen == want => None,
                        Ok(()) => Some(match &m.bytes {
                            Bytes::Text(_) => format!("{:?}", String::from_utf8_lossy(&seen)),
                            Bytes::U64(_) => {
                                let mut w = [0u8; 8];
                                w.copy_from_slice(&seen);
                                format!("u64 {}", u64::from_ne_bytes(w))
                            }
                            _ => {
                                let first = seen.iter().zip(&want).position(|(a, b)| a != b);
                                format!("other bytes (first difference at +{})", first.unwrap_or(0))
                            }
                        }),
                    },
                )
            }
            Want::Packets(key, spec, want) => {
                let n = spec.count(trace) as u64;
                (
                    format!("packets {key}: {want}"),
                    (n != *want).then(|| n.to_string()),
                )
            }
        };
        report.findings.push(Finding {
            line: e.line,
            what,
            held: got.is_none(),
            got,
        });
    }
}
