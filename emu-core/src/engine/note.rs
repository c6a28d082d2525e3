//! What the engine did, as notes for a trace: the verbs posted, the completions and
//! async events it produced, QP state changes, timers armed and fired, and packets
//! it discarded, with why. Off by default; a driver that traces turns them on with
//! [`Engine::set_notes`](super::Engine::set_notes) and drains them after every entry
//! point (the engine stays pure: a note carries no time, the driver knows `now`).
//! Off, noting is one branch and allocates nothing.

use std::fmt;
use std::time::Duration;

use verbs_api::{AsyncEvent, EventElement, QpState, WcOpcode, WcStatus, WrOpcode};

/// One thing the engine did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// `ibv_post_send` took a work request.
    PostSend {
        /// The QP.
        qpn: u32,
        /// The WR's identifier.
        wr_id: u64,
        /// Its opcode.
        opcode: WrOpcode,
        /// Bytes in its gather list.
        len: u64,
    },
    /// `ibv_post_recv` took a work request.
    PostRecv {
        /// The QP.
        qpn: u32,
        /// The WR's identifier.
        wr_id: u64,
        /// Bytes in its scatter list.
        len: u64,
    },
    /// `ibv_post_srq_recv` took a work request.
    PostSrqRecv {
        /// The SRQ.
        srq: u32,
        /// The WR's identifier.
        wr_id: u64,
        /// Bytes in its scatter list.
        len: u64,
    },
    /// A work completion was delivered to a CQ (or lost to a full one).
    Completion {
        /// The QP it is for.
        qpn: u32,
        /// The WR's identifier.
        wr_id: u64,
        /// Its opcode.
        opcode: WcOpcode,
        /// Its status.
        status: WcStatus,
        /// Bytes it reports.
        byte_len: u32,
    },
    /// An asynchronous event was queued.
    Event(AsyncEvent),
    /// A QP changed state.
    State {
        /// The QP.
        qpn: u32,
        /// The state before.
        from: QpState,
        /// The state after.
        to: QpState,
    },
    /// A timer that was not running was armed.
    TimerArmed {
        /// The QP.
        qpn: u32,
        /// Which timer.
        timer: TimerKind,
        /// When it fires, from now.
        after: Duration,
    },
    /// A timer fired.
    TimerFired {
        /// The QP.
        qpn: u32,
        /// Which timer.
        timer: TimerKind,
    },
    /// A packet for a QP was discarded, or refused, or taken as a duplicate: not
    /// executed as a new request.
    Discard {
        /// The QP.
        qpn: u32,
        /// The packet's PSN.
        psn: u32,
        /// What the receiver did and why, in a few words (`discarded: PSN gap,
        /// message dropped (UC, 9.8)`, `duplicate: answered again...`).
        reason: &'static str,
    },
}

/// The timers a QP arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerKind {
    /// The local ACK timeout (IBTA 9.7.6.1.3).
    AckTimeout,
    /// The RNR wait after an RNR NAK (IBTA 9.7.5.2.8).
    Rnr,
}

impl fmt::Display for TimerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimerKind::AckTimeout => "ACK timer",
            TimerKind::Rnr => "RNR timer",
        })
    }
}

/// `RetryExcErr` as `RETRY_EXC_ERR`: a verbs enum's Debug name in the C constants'
/// style.
pub fn upper_snake(debug: &str) -> String {
    let mut s = String::with_capacity(debug.len() + 4);
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
    }
    s
}

/// A duration in the unit that reads best: `640 ns`, `1.28 ms`, `67.1 ms`, `2 s`.
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    let (v, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "us")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let t = format!("{v:.digits$}");
    let t = if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    };
    format!("{t} {unit}")
}

impl fmt::Display for Note {
    /// One short line: `post_send SEND wr_id=10 len=2000`, `completion wr_id=1
    /// RETRY_EXC_ERR`, `event QP_FATAL qp=0x000011`, `QP RTS -> ERR`, `RNR timer armed
    /// (1.28 ms)`, `psn=101 discarded: PSN gap, message dropped`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::PostSend {
                wr_id, opcode, len, ..
            } => write!(
                f,
                "post_send {} wr_id={wr_id} len={len}",
                upper_snake(&format!("{opcode:?}"))
            ),
            Note::PostRecv { wr_id, len, .. } => write!(f, "post_recv wr_id={wr_id} len={len}"),
            Note::PostSrqRecv { srq, wr_id, len } => {
                write!(f, "post_srq_recv srq={srq} wr_id={wr_id} len={len}")
            }
            Note::Completion {
                wr_id,
                opcode,
                status,
                byte_len,
                ..
            } => {
                write!(
                    f,
                    "completion wr_id={wr_id} {}",
                    upper_snake(&format!("{status:?}"))
                )?;
                if *status == WcStatus::Success {
                    write!(f, " {} len={byte_len}", upper_snake(&format!("{opcode:?}")))?;
                }
                Ok(())
            }
            Note::Event(e) => {
                write!(f, "event {}", upper_snake(&format!("{:?}", e.event_type)))?;
                match e.element {
                    EventElement::Qp(q) => write!(f, " qp={q:#08x}"),
                    EventElement::Cq(c) => write!(f, " cq={c}"),
                    EventElement::Srq(s) => write!(f, " srq={s}"),
                    _ => Ok(()),
                }
            }
            Note::State { from, to, .. } => write!(f, "QP {from} -> {to}"),
            Note::TimerArmed { timer, after, .. } => {
                write!(f, "{timer} armed ({})", fmt_duration(*after))
            }
            Note::TimerFired { timer, .. } => write!(f, "{timer} fired"),
            Note::Discard { psn, reason, .. } => write!(f, "psn={psn} {reason}"),
        }
    }
}

/// The engine's note queue: `None` while nobody traces.
#[derive(Debug, Default)]
pub(crate) struct Notes(pub(crate) Option<Vec<Note>>);

impl Notes {
    /// Adds the note `f` makes, if notes are on (`f` is not called otherwise).
    #[inline]
    pub(crate) fn add(&mut self, f: impl FnOnce() -> Note) {
        if let Some(v) = &mut self.0 {
            v.push(f());
        }
    }

    /// Whether notes are on.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.0.is_some()
    }
}
