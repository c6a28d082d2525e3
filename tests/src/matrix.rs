//! The coverage matrix: every `WcStatus` and every async event type, with the cases that
//! produce it, or the reason no case does.
//!
//! A variant no case produces must be listed here as not applicable to RC/UC/UD (with
//! the reason), or as missing from the emulator (with what it waits for, also listed in
//! the README). [`render`] writes the matrix as markdown (`docs/conformance.md`).

use std::fmt::Write;

use verbs_api::{AsyncEventType as E, WcStatus as S};

use crate::{Case, Produces};

/// Why no case produces a variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncovered {
    /// The variant cannot arise on RC, UC or UD (or on an emulated RoCE port).
    NotApplicable(&'static str),
    /// The emulator cannot produce it yet; what it waits for.
    Missing(&'static str),
}

/// The work-completion statuses no case produces, and why.
pub fn uncovered_status(s: S) -> Option<Uncovered> {
    use Uncovered::*;
    Some(match s {
        S::LocEecOpErr | S::InvEecnErr | S::InvEecStateErr => NotApplicable(
            "EE context errors exist only for the Reliable Datagram transport (IBTA 10.2), \
             which RoCE NICs and libibverbs do not offer",
        ),
        S::LocRddViolErr => {
            NotApplicable("RD domain violation: Reliable Datagram only (IBTA 10.2)")
        }
        S::RemInvRdReqErr => NotApplicable(
            "the Invalid RD Request NAK (IBTA 9.7.5.2) is sent only to RD requests; RC, UC \
             and UD responders never send it",
        ),
        S::TmErr | S::TmRndvIncomplete => NotApplicable(
            "tag matching (IBV_SRQT_TM SRQs): an mlx5 offload outside IBTA transports",
        ),
        S::RespTimeoutErr => NotApplicable(
            "IBTA has no response-timeout completion error for RC/UC/UD: a requester whose \
             local ACK timer expires with its retry count spent completes with \
             RETRY_EXC_ERR (IBTA 9.7.6.1.3), a responder that is not ready answers RNR and \
             ends in RNR_RETRY_EXC_ERR (9.7.5.2.8), as kernel rxe and mlx5 do; the status \
             comes from adapters outside IBTA (ocrdma, iWARP)",
        ),
        S::GeneralErr => NotApplicable(
            "manual 6.2.22: a transport error no other status describes; every error the \
             RC/UC/UD transport can meet has its own status in IBTA 10.8, so only vendor \
             syndromes without one (e.g. mlx5's unknown CQE syndromes) map to it",
        ),
        _ => return None,
    })
}

/// The async event types no case produces, and why.
pub fn uncovered_event(e: E) -> Option<Uncovered> {
    use Uncovered::*;
    Some(match e {
        E::WqFatal => NotApplicable(
            "work queues (ibv_create_wq, RSS) are outside the verbs of the manual's chapter 3",
        ),
        E::DeviceSpeedChange => NotApplicable("an emulated port has no physical speed to change"),
        _ => return None,
    })
}

/// One row of the matrix.
#[derive(Clone, Debug)]
pub struct Row {
    /// The variant's libibverbs name.
    pub name: String,
    /// Cases producing it.
    pub cases: Vec<String>,
    /// Why none does, if none does.
    pub uncovered: Option<Uncovered>,
}

/// The rows for WC statuses, then for async events.
pub fn rows(cases: &[Case]) -> (Vec<Row>, Vec<Row>) {
    let producing = |p: Produces| -> Vec<String> {
        cases
            .iter()
            .filter(|c| c.produces.contains(&p))
            .map(|c| c.name.clone())
            .collect()
    };
    let wc = S::ALL
        .iter()
        .map(|&s| Row {
            name: format!("{s:?} ({s})"),
            cases: producing(Produces::Wc(s)),
            uncovered: uncovered_status(s),
        })
        .collect();
    let ev = E::ALL
        .iter()
        .map(|&e| Row {
            name: format!("{e:?} ({e})"),
            cases: producing(Produces::Event(e)),
            uncovered: uncovered_event(e),
        })
        .collect();
    (wc, ev)
}

/// Variants with neither a case nor an entry here (must be empty), and variants with
/// both (the entry is stale).
pub fn problems(cases: &[Case]) -> Vec<String> {
    let (wc, ev) = rows(cases);
    wc.iter()
        .chain(&ev)
        .filter_map(|r| match (r.cases.is_empty(), r.uncovered) {
            (true, None) => Some(format!(
                "{}: no case produces it and no reason is given",
                r.name
            )),
            (false, Some(Uncovered::Missing(_))) => Some(format!(
                "{}: listed as missing but produced by {:?}",
                r.name, r.cases
            )),
            _ => None,
        })
        .collect()
}

/// A result of one case on one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Passed.
    Pass,
    /// Failed, with the message.
    Fail(String),
    /// Skipped, with the reason.
    Skip(String),
}

/// The matrix and per-case results as markdown. `results` holds, per backend, the
/// verdict of each case by name.
pub fn render(cases: &[Case], results: &[(String, Vec<(String, Verdict)>)]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Conformance\n\nGenerated by `scripts/conformance.sh` (emulator on the fabric and over UDP; kernel rxe from the VM run); \
         do not edit by hand. {} cases.\n",
        cases.len()
    );
    let (wc, ev) = rows(cases);
    for (title, rows) in [
        ("Work completion statuses", wc),
        ("Asynchronous events", ev),
    ] {
        let _ = writeln!(
            md,
            "## {title}\n\n| variant | produced by | otherwise |\n|---|---|---|"
        );
        for r in rows {
            let why = match r.uncovered {
                Some(Uncovered::NotApplicable(w)) => format!("not applicable: {w}"),
                Some(Uncovered::Missing(w)) => format!("missing: {w}"),
                None => String::new(),
            };
            let list = if r.cases.len() > 4 {
                format!("{} and {} more", r.cases[..4].join(", "), r.cases.len() - 4)
            } else {
                r.cases.join(", ")
            };
            let _ = writeln!(md, "| {} | {} | {} |", r.name, list, why);
        }
        md.push('\n');
    }
    if !results.is_empty() {
        let _ = write!(md, "## Results\n\n| case |");
        for (b, _) in results {
            let _ = write!(md, " {b} |");
        }
        let _ = write!(md, "\n|---|");
        for _ in results {
            md.push_str("---|");
        }
        md.push('\n');
        for c in cases {
            let _ = write!(md, "| {} |", c.name);
            for (_, vs) in results {
                let v = vs.iter().find(|(n, _)| *n == c.name).map(|(_, v)| v);
                let cell = match v {
                    Some(Verdict::Pass) => "pass".to_string(),
                    Some(Verdict::Fail(m)) => {
                        format!("FAIL: {}", m.replace('|', "/").lines().next().unwrap_or(""))
                    }
                    Some(Verdict::Skip(r)) => format!("skip: {}", r.replace('|', "/")),
                    None => "-".to_string(),
                };
                let _ = write!(md, " {cell} |");
            }
            md.push('\n');
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every WC status and every async event has a case or a stated reason (issue #7).
    #[test]
    fn every_variant_is_covered_or_explained() {
        let p = problems(&crate::all_cases());
        assert!(p.is_empty(), "{}", p.join("\n"));
    }

    /// Case names are unique and every case cites a rule.
    #[test]
    fn names_are_unique_and_rules_cited() {
        let cases = crate::all_cases();
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len(), "duplicate case names");
        for c in &cases {
            assert!(
                c.rule.contains("manual") || c.rule.contains("IBTA") || c.rule.contains("man page"),
                "{} cites no rule: {}",
                c.name,
                c.rule
            );
            assert!(
                !c.rule.contains('?'),
                "{} cites an unfinished section number: {}",
                c.name,
                c.rule
            );
        }
    }
}
