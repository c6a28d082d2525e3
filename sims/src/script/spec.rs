//! The rule vocabulary as text: `kind=read_response,nth=3`, the same words in a
//! scenario file's `[[rule]]` and on the command line (`--drop`), and, for counting
//! packets in `[expect.packets]`, over the trace.

use std::time::Duration;

use emu_core::engine::upper_snake;
use emu_wire::{NakCode, Opcode, Syndrome};

use crate::rules::{Action, Kind, Match, Rule};
use crate::trace::{Fate, PacketRecord, Trace};

/// What a rule does, by the word that names it (`drop`, `duplicate`, `delay`,
/// `corrupt`, `rnr_nak`, `truncate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// The packet is lost.
    Drop,
    /// Two copies arrive.
    Duplicate,
    /// It arrives later by `by=` (e.g. `by=200us`).
    Delay,
    /// One ICRC bit is flipped (IBTA Annex A17.4: the receiver drops it).
    Corrupt,
    /// The request is answered with an RNR NAK (IBTA 9.7.5.2.8), timer code `timer=`
    /// (default 1), to the QP of `requester=` (default the sender, `from=`, else `a`).
    RnrNak,
    /// The packet loses its last `bytes=` bytes of payload (IBTA 9.9: a malformed
    /// response).
    Truncate,
}

impl Verb {
    /// Every verb, in the order the documentation lists them.
    pub const ALL: [Verb; 6] = [
        Verb::Drop,
        Verb::Duplicate,
        Verb::Delay,
        Verb::Corrupt,
        Verb::RnrNak,
        Verb::Truncate,
    ];

    /// The word a file or the command line names it by.
    pub fn word(self) -> &'static str {
        match self {
            Verb::Drop => "drop",
            Verb::Duplicate => "duplicate",
            Verb::Delay => "delay",
            Verb::Corrupt => "corrupt",
            Verb::RnrNak => "rnr_nak",
            Verb::Truncate => "truncate",
        }
    }
}

/// A packet predicate and its modifiers, parsed from `key=value,...`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spec {
    /// The header predicate.
    pub when: Match,
    /// `nth=K`: only the K-th matching packet (1-based).
    pub nth: Option<u64>,
    /// `first=N`: the first N matching packets.
    pub first: Option<u64>,
    /// `by=DURATION` (delay).
    pub by: Option<Duration>,
    /// `bytes=N` (truncate).
    pub bytes: Option<usize>,
    /// `timer=CODE` (rnr_nak).
    pub timer: Option<u8>,
    /// `requester=HOST` (rnr_nak).
    pub requester: Option<String>,
    /// `aeth=...` (counting only): ack, rnr_nak, nak_psn, nak_invalid, nak_access,
    /// nak_op.
    pub aeth: Option<String>,
    /// `fate=...` (counting only): delivered, dropped, duplicated, delayed,
    /// corrupted, held, injected.
    pub fate: Option<String>,
}

const KINDS: [(&str, Kind); 8] = [
    ("ack", Kind::Ack),
    ("atomic_ack", Kind::AtomicAck),
    ("send_start", Kind::SendStart),
    ("send", Kind::Send),
    ("write", Kind::Write),
    ("read_request", Kind::ReadRequest),
    ("read_response", Kind::ReadResponse),
    ("atomic", Kind::Atomic),
];

const AETHS: [&str; 6] = [
    "ack",
    "rnr_nak",
    "nak_psn",
    "nak_invalid",
    "nak_access",
    "nak_op",
];

/// An opcode by its name in upper snake case, as the trace shows it
/// (`RC_SEND_ONLY`, `RC_RDMA_READ_RESPONSE_MIDDLE`, `UD_SEND_ONLY`).
pub fn opcode_by_name(name: &str) -> Option<Opcode> {
    Opcode::ALL
        .iter()
        .copied()
        .find(|o| upper_snake(&format!("{o:?}")) == name.to_ascii_uppercase())
}

/// A duration written `200us`, `1.28ms`, `67ms`, `1s` or `500ns`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{t:?} has no unit (ns, us, ms or s)"))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{t:?} is not a number with a unit"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("{t:?}: the unit is ns, us, ms or s")),
    };
    Ok(Duration::from_nanos((n * scale * 1e9).round() as u64))
}

fn number<T: TryFrom<u64>>(key: &str, v: &str) -> Result<T, String> {
    let n = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    }
    .map_err(|_| format!("{key}={v}: not a number"))?;
    T::try_from(n).map_err(|_| format!("{key}={v}: out of range"))
}

fn one_of(key: &str, v: &str, words: &[&str]) -> Result<String, String> {
    if words.contains(&v) {
        Ok(v.to_owned())
    } else {
        Err(format!("{key}={v}: expected one of {}", words.join(", ")))
    }
}

impl Spec {
    /// Parses `key=value,key=value` (an empty text matches every packet). Keys: `from`,
    /// `to` (a host), `opcode` (`RC_SEND_ONLY`, ...), `kind` (`ack`, `atomic_ack`,
    /// `send_start`, `send`, `write`, `read_request`, `read_response`, `atomic`), `psn`,
    /// `qp` (destination QP), `nth`, `first`, `by`, `bytes`, `timer`, `requester`,
    /// `aeth`, `fate`.
    pub fn parse(text: &str) -> Result<Spec, String> {
        let mut s = Spec::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| format!("{item:?} is not key=value"))?;
            match k {
                "from" => s.when.from = Some(v.to_owned()),
                "to" => s.when.to = Some(v.to_owned()),
                "opcode" => {
                    s.when.opcode = Some(opcode_by_name(v).ok_or_else(|| {
                        format!("opcode={v}: no such opcode (e.g. RC_SEND_ONLY, RC_ACKNOWLEDGE)")
                    })?)
                }
                "kind" => {
                    let kind = KINDS.iter().find(|(n, _)| *n == v).ok_or_else(|| {
                        let names: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
                        format!("kind={v}: expected one of {}", names.join(", "))
                    })?;
                    s.when.kind = Some(kind.1);
                }
                "psn" => s.when.psn = Some(number(k, v)?),
                "qp" => s.when.dest_qp = Some(number(k, v)?),
                "nth" => s.nth = Some(number(k, v)?),
                "first" => s.first = Some(number(k, v)?),
                "by" => s.by = Some(parse_duration(v).map_err(|e| format!("by={v}: {e}"))?),
                "bytes" => s.bytes = Some(number(k, v)?),
                "timer" => s.timer = Some(number(k, v)?),
                "requester" => s.requester = Some(v.to_owned()),
                "aeth" => s.aeth = Some(one_of(k, v, &AETHS)?),
                "fate" => s.fate = Some(one_of(k, v, &Fate::NAMES)?),
                _ => {
                    return Err(format!(
                        "unknown key {k:?} (from, to, opcode, kind, psn, qp, nth, first, by, bytes, timer, requester, aeth, fate)"
                    ))
                }
            }
        }
        if s.nth == Some(0) {
            return Err("nth counts from 1".into());
        }
        if s.nth.is_some() && s.first.is_some() {
            return Err("nth and first exclude each other".into());
        }
        Ok(s)
    }

    /// Names every host the spec mentions, so a caller can check they exist.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        [&self.when.from, &self.when.to, &self.requester]
            .into_iter()
            .filter_map(|h| h.as_deref())
    }

    /// The fabric rule `verb` with this spec, named `verb text` in traces; `qpn_of`
    /// gives a host's QP number (for an RNR NAK's requester). Keys that only count (`aeth`, `fate`) and action
    /// parameters of another verb are refused.
    pub fn rule(
        &self,
        verb: Verb,
        text: &str,
        qpn_of: impl Fn(&str) -> Option<u32>,
    ) -> Result<Rule, String> {
        if self.aeth.is_some() || self.fate.is_some() {
            return Err(
                "aeth= and fate= count packets in [expect.packets]; a rule cannot use them".into(),
            );
        }
        let only = |what: &str, given: bool, verbs: Verb| {
            if given && verb != verbs {
                Err(format!("{what}= belongs to {}", verbs.word()))
            } else {
                Ok(())
            }
        };
        only("by", self.by.is_some(), Verb::Delay)?;
        only("bytes", self.bytes.is_some(), Verb::Truncate)?;
        only("timer", self.timer.is_some(), Verb::RnrNak)?;
        only("requester", self.requester.is_some(), Verb::RnrNak)?;
        let action = match verb {
            Verb::Drop => Action::Drop,
            Verb::Duplicate => Action::Duplicate,
            Verb::Corrupt => Action::CorruptIcrc,
            Verb::Delay => Action::Delay(self.by.ok_or("delay needs by= (e.g. by=200us)")?),
            Verb::Truncate => Action::Truncate(self.bytes.ok_or("truncate needs bytes=")?),
            Verb::RnrNak => {
                let host = self
                    .requester
                    .as_deref()
                    .or(self.when.from.as_deref())
                    .unwrap_or("a");
                Action::RnrNak {
                    requester_qpn: qpn_of(host).ok_or_else(|| format!("no host {host:?}"))?,
                    timer: self.timer.unwrap_or(1),
                }
            }
        };
        let name = format!("{} {}", verb.word(), text.trim());
        let mut rule = Rule::new(name, self.when.clone(), action);
        if let Some(k) = self.nth {
            rule = rule.nth(k);
        }
        if let Some(n) = self.first {
            rule = rule.first(n);
        }
        Ok(rule)
    }

    /// How many packets of `trace` match (`nth`, `first` and action parameters play
    /// no part in counting).
    pub fn count(&self, trace: &Trace) -> usize {
        let name = |i: usize| trace.devices.get(i).map(|d| d.name.as_str());
        trace
            .packets
            .iter()
            .filter(|p| self.counts(p, name(p.src), p.dst.and_then(name)))
            .count()
    }

    fn counts(&self, p: &PacketRecord, src: Option<&str>, dst: Option<&str>) -> bool {
        let m = &self.when;
        let host_ok = m.from.as_deref().is_none_or(|f| Some(f) == src)
            && m.to.as_deref().is_none_or(|t| Some(t) == dst);
        let fate_ok = self.fate.as_deref().is_none_or(|f| p.fate.name() == f);
        if !(host_ok && fate_ok) {
            return false;
        }
        let needs_headers = m.opcode.is_some()
            || m.kind.is_some()
            || m.psn.is_some()
            || m.dest_qp.is_some()
            || self.aeth.is_some();
        let Some(repr) = p.repr else {
            return !needs_headers;
        };
        let info = crate::rules::PacketInfo {
            index: p.index,
            src: src.unwrap_or(""),
            dst: dst.unwrap_or(""),
            repr: &repr,
            payload_len: p.payload_len,
        };
        let header_ok = Match {
            from: None,
            to: None,
            ..m.clone()
        }
        .matches(&info);
        header_ok
            && self
                .aeth
                .as_deref()
                .is_none_or(|a| repr.aeth.is_some_and(|x| aeth_word(x.syndrome) == a))
    }
}

fn aeth_word(s: Syndrome) -> &'static str {
    match s {
        Syndrome::Ack { .. } => "ack",
        Syndrome::RnrNak { .. } => "rnr_nak",
        Syndrome::Nak(NakCode::PsnSequenceError) => "nak_psn",
        Syndrome::Nak(NakCode::InvalidRequest) => "nak_invalid",
        Syndrome::Nak(NakCode::RemoteAccessError) => "nak_access",
        Syndrome::Nak(NakCode::RemoteOperationalError) => "nak_op",
        Syndrome::Nak(NakCode::InvalidRdRequest) => "nak_invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_example_and_refuses_bad_keys() {
        let s = Spec::parse("kind=read_response,nth=3").unwrap();
        assert_eq!(s.when.kind, Some(Kind::ReadResponse));
        assert_eq!(s.nth, Some(3));
        let s = Spec::parse("opcode=rc_send_only, psn=0x65").unwrap();
        assert_eq!(s.when.opcode, Some(Opcode::RcSendOnly));
        assert_eq!(s.when.psn, Some(101));
        assert!(Spec::parse("kind=readresponse")
            .unwrap_err()
            .contains("read_response"));
        assert!(Spec::parse("nth=0").is_err());
        assert!(Spec::parse("colour=red")
            .unwrap_err()
            .contains("unknown key"));
        assert!(Spec::parse("nth").is_err());
    }

    #[test]
    fn durations_take_their_units() {
        assert_eq!(parse_duration("200us"), Ok(Duration::from_micros(200)));
        assert_eq!(parse_duration("1.28ms"), Ok(Duration::from_micros(1280)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 min").is_err());
    }

    #[test]
    fn rule_parameters_belong_to_their_verb() {
        let s = Spec::parse("kind=send,by=1ms").unwrap();
        assert!(s.rule(Verb::Drop, "", |_| Some(1)).is_err());
        assert!(s.rule(Verb::Delay, "", |_| Some(1)).is_ok());
        let t = Spec::parse("kind=send").unwrap();
        assert!(t.rule(Verb::Truncate, "", |_| Some(1)).is_err());
        assert!(t.rule(Verb::RnrNak, "", |_| None).is_err());
    }
}
