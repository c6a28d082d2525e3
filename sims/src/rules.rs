//! Per-packet rules: a predicate over the decoded headers of every packet the fabric
//! carries, and what to do with the packets it picks ("drop the ACK for PSN 5", "drop
//! the 3rd READ RESPONSE MIDDLE", "answer the next SEND with an RNR NAK", "corrupt the
//! ICRC of packet 4", "duplicate packet 2").
//!
//! Rules run in the order they were added; every rule sees (and counts) every packet
//! that reaches the rule stage, and the first rule that fires decides the packet's fate.

use std::fmt;
use std::time::Duration;

use emu_wire::{Opcode, PacketRepr, Position, Syndrome};

/// A packet as the rules see it.
#[derive(Debug)]
pub struct PacketInfo<'a> {
    /// The fabric's packet number (0-based, in send order).
    pub index: u64,
    /// Name of the sending device.
    pub src: &'a str,
    /// Name of the receiving device.
    pub dst: &'a str,
    /// Every header, decoded.
    pub repr: &'a PacketRepr,
    /// Payload bytes (pad and ICRC excluded).
    pub payload_len: usize,
}

/// What a rule does to a packet it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The packet is lost.
    Drop,
    /// Two copies arrive.
    Duplicate,
    /// It arrives this much later than it would have.
    Delay(Duration),
    /// One ICRC bit is flipped: the receiver must drop it and count it.
    CorruptIcrc,
    /// The packet (a request) is dropped and its sender gets an RNR NAK for its PSN
    /// instead, as if the responder had no receive WQE (IBTA 9.7.5.2.8). The NAK is
    /// addressed to `requester_qpn` (an RC header does not carry the sender's QPN),
    /// with the RNR timer code `timer`.
    RnrNak {
        /// The QPN of the requester the NAK goes to.
        requester_qpn: u32,
        /// The 5-bit RNR timer code of the NAK's AETH.
        timer: u8,
    },
    /// The packet arrives without the last `n` bytes of its payload (all of it if it
    /// is shorter) and with a correct ICRC: a well-formed packet that breaks the
    /// protocol, e.g. a READ response shorter than its position requires, which the
    /// requester must complete with BAD_RESP_ERR (IBTA 9.9).
    Truncate(usize),
}

/// Kinds of packet a [`Match`] can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RC ACKNOWLEDGE (ACKs, NAKs, RNR NAKs).
    Ack,
    /// RC ATOMIC ACKNOWLEDGE.
    AtomicAck,
    /// The first packet of a SEND (FIRST or ONLY, any transport).
    SendStart,
    /// Any SEND packet.
    Send,
    /// Any RDMA WRITE packet.
    Write,
    /// RDMA READ REQUEST.
    ReadRequest,
    /// Any RDMA READ RESPONSE packet.
    ReadResponse,
    /// COMPARE SWAP or FETCH ADD.
    Atomic,
}

impl Kind {
    fn matches(self, op: Opcode) -> bool {
        match self {
            Kind::Ack => op == Opcode::RcAcknowledge,
            Kind::AtomicAck => op == Opcode::RcAtomicAcknowledge,
            Kind::SendStart => {
                op.is_send() && matches!(op.position(), Position::First | Position::Only)
            }
            Kind::Send => op.is_send(),
            Kind::Write => op.is_write(),
            Kind::ReadRequest => op.is_read_request(),
            Kind::ReadResponse => op.is_read_response(),
            Kind::Atomic => op.is_atomic(),
        }
    }
}

/// A predicate over a packet's direction and headers; every field left `None` matches
/// anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    /// Sending device name.
    pub from: Option<String>,
    /// Receiving device name.
    pub to: Option<String>,
    /// Exact opcode.
    pub opcode: Option<Opcode>,
    /// Kind of packet.
    pub kind: Option<Kind>,
    /// BTH PSN.
    pub psn: Option<u32>,
    /// BTH destination QP.
    pub dest_qp: Option<u32>,
}

impl Match {
    /// Matches every packet.
    pub fn any() -> Match {
        Match::default()
    }

    /// Packets with `opcode`.
    pub fn opcode(mut self, opcode: Opcode) -> Match {
        self.opcode = Some(opcode);
        self
    }

    /// Packets of `kind`.
    pub fn kind(mut self, kind: Kind) -> Match {
        self.kind = Some(kind);
        self
    }

    /// Packets with BTH PSN `psn`.
    pub fn psn(mut self, psn: u32) -> Match {
        self.psn = Some(psn);
        self
    }

    /// Packets for QP `qpn`.
    pub fn dest_qp(mut self, qpn: u32) -> Match {
        self.dest_qp = Some(qpn);
        self
    }

    /// Packets sent by device `name`.
    pub fn from(mut self, name: &str) -> Match {
        self.from = Some(name.to_owned());
        self
    }

    /// Packets sent to device `name`.
    pub fn to(mut self, name: &str) -> Match {
        self.to = Some(name.to_owned());
        self
    }

    /// Whether `p` matches.
    pub fn matches(&self, p: &PacketInfo<'_>) -> bool {
        let op = p.repr.bth.opcode;
        self.from.as_deref().is_none_or(|f| f == p.src)
            && self.to.as_deref().is_none_or(|t| t == p.dst)
            && self.opcode.is_none_or(|o| o == op)
            && self.kind.is_none_or(|k| k.matches(op))
            && self.psn.is_none_or(|n| n == p.repr.bth.psn.value())
            && self.dest_qp.is_none_or(|q| q == p.repr.bth.dest_qp)
    }
}

/// Which of the matching packets a rule acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Every one.
    Every,
    /// Only the k-th (1-based).
    Nth(u64),
    /// The first n.
    First(u64),
}

type CustomFn = Box<dyn FnMut(&PacketInfo<'_>) -> Option<Action> + Send>;

enum Body {
    Match {
        when: Match,
        which: Which,
        action: Action,
    },
    Custom(CustomFn),
}

/// A named per-packet rule.
pub struct Rule {
    name: String,
    body: Body,
    matched: u64,
    fired: u64,
    /// The MSN of the last ACK seen going to the requester of an RNR NAK rule: the NAK
    /// it crafts carries it (IBTA 9.7.5.1: the MSN of the last completed message).
    last_msn: u32,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("fired", &self.fired)
            .finish()
    }
}

impl Rule {
    /// A rule that applies `action` to every packet `when` matches (narrow it with
    /// [`Rule::nth`] or [`Rule::first`]).
    pub fn new(name: impl Into<String>, when: Match, action: Action) -> Rule {
        Rule {
            name: name.into(),
            body: Body::Match {
                when,
                which: Which::Every,
                action,
            },
            matched: 0,
            fired: 0,
            last_msn: 0,
        }
    }

    /// A rule decided by a function of each packet (`None` leaves it alone).
    pub fn custom(
        name: impl Into<String>,
        f: impl FnMut(&PacketInfo<'_>) -> Option<Action> + Send + 'static,
    ) -> Rule {
        Rule {
            name: name.into(),
            body: Body::Custom(Box::new(f)),
            matched: 0,
            fired: 0,
            last_msn: 0,
        }
    }

    /// Acts only on the k-th matching packet (1-based).
    pub fn nth(mut self, k: u64) -> Rule {
        if let Body::Match { which, .. } = &mut self.body {
            *which = Which::Nth(k);
        }
        self
    }

    /// Acts on the first `n` matching packets.
    pub fn first(mut self, n: u64) -> Rule {
        if let Body::Match { which, .. } = &mut self.body {
            *which = Which::First(n);
        }
        self
    }

    /// Drops the first RC ACKNOWLEDGE with PSN `psn`.
    pub fn drop_ack_for_psn(psn: u32) -> Rule {
        Rule::new(
            format!("drop the ACK for PSN {psn}"),
            Match::any().kind(Kind::Ack).psn(psn),
            Action::Drop,
        )
        .nth(1)
    }

    /// Drops the k-th packet (1-based) with `opcode`.
    pub fn drop_nth(opcode: Opcode, k: u64) -> Rule {
        Rule::new(
            format!("drop {opcode} #{k}"),
            Match::any().opcode(opcode),
            Action::Drop,
        )
        .nth(k)
    }

    /// Answers the next SEND (its FIRST or ONLY packet) with an RNR NAK to
    /// `requester_qpn`, timer code `timer`; the SEND itself is dropped.
    pub fn rnr_nak_next_send(requester_qpn: u32, timer: u8) -> Rule {
        Rule::new(
            format!("RNR NAK the next SEND to QP {requester_qpn:#x}"),
            Match::any().kind(Kind::SendStart),
            Action::RnrNak {
                requester_qpn,
                timer,
            },
        )
        .nth(1)
    }

    /// Corrupts the ICRC of the k-th packet (1-based) the rule sees.
    pub fn corrupt_icrc_of_packet(k: u64) -> Rule {
        Rule::new(
            format!("corrupt the ICRC of packet {k}"),
            Match::any(),
            Action::CorruptIcrc,
        )
        .nth(k)
    }

    /// Duplicates the k-th packet (1-based) the rule sees.
    pub fn duplicate_packet(k: u64) -> Rule {
        Rule::new(
            format!("duplicate packet {k}"),
            Match::any(),
            Action::Duplicate,
        )
        .nth(k)
    }

    /// The same rule under another name.
    pub fn renamed(mut self, name: impl Into<String>) -> Rule {
        self.name = name.into();
        self
    }

    /// The rule's name (it names the cause of a packet's fate in traces).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many packets the rule acted on.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// The MSN an RNR NAK crafted now should carry.
    pub(crate) fn last_msn(&self) -> u32 {
        self.last_msn
    }

    /// Looks at one packet; returns what to do with it if the rule fires.
    pub(crate) fn apply(&mut self, p: &PacketInfo<'_>) -> Option<Action> {
        let action = match &mut self.body {
            Body::Custom(f) => f(p),
            Body::Match {
                when,
                which,
                action,
            } => {
                if let Action::RnrNak { requester_qpn, .. } = action {
                    if let (Some(aeth), true) = (p.repr.aeth, p.repr.bth.dest_qp == *requester_qpn)
                    {
                        if matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                            self.last_msn = aeth.msn;
                        }
                    }
                }
                if !when.matches(p) {
                    return None;
                }
                self.matched += 1;
                let k = self.matched;
                let fires = match *which {
                    Which::Every => true,
                    Which::Nth(n) => k == n,
                    Which::First(n) => k <= n,
                };
                fires.then_some(*action)
            }
        };
        if action.is_some() {
            self.fired += 1;
        }
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emu_wire::{AethRepr, Psn};

    fn info<'a>(repr: &'a PacketRepr, src: &'a str) -> PacketInfo<'a> {
        PacketInfo {
            index: 0,
            src,
            dst: "x",
            repr,
            payload_len: 0,
        }
    }

    #[test]
    fn nth_fires_once_on_the_kth_match_only() {
        let mut r = Rule::drop_nth(Opcode::RcSendOnly, 2);
        let send = PacketRepr::new(Opcode::RcSendOnly, 1, Psn::new(1));
        let ack = PacketRepr::new(Opcode::RcAcknowledge, 1, Psn::new(1));
        let got: Vec<_> = [&send, &ack, &send, &send]
            .iter()
            .map(|p| r.apply(&info(p, "a")))
            .collect();
        assert_eq!(got, [None, None, Some(Action::Drop), None]);
        assert_eq!(r.fired(), 1);
    }

    #[test]
    fn match_fields_narrow() {
        let mut ack = PacketRepr::new(Opcode::RcAcknowledge, 7, Psn::new(5));
        let m = Match::any().kind(Kind::Ack).psn(5).dest_qp(7).from("b");
        assert!(m.matches(&info(&ack, "b")));
        assert!(!m.matches(&info(&ack, "a")));
        ack.bth.psn = Psn::new(6);
        assert!(!m.matches(&info(&ack, "b")));
        let first = Rule::new("f", Match::any(), Action::Duplicate).first(2);
        let mut first = first;
        let p = PacketRepr::new(Opcode::RcSendOnly, 1, Psn::new(1));
        let n = (0..5)
            .filter(|_| first.apply(&info(&p, "a")).is_some())
            .count();
        assert_eq!(n, 2);
    }

    #[test]
    fn rnr_rule_remembers_the_msn_of_acks_to_its_requester() {
        let mut r = Rule::rnr_nak_next_send(0x11, 3);
        let mut ack = PacketRepr::new(Opcode::RcAcknowledge, 0x11, Psn::new(9));
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 4,
        });
        assert_eq!(r.apply(&info(&ack, "b")), None);
        assert_eq!(r.last_msn(), 4);
        let send = PacketRepr::new(Opcode::RcSendFirst, 0x12, Psn::new(10));
        assert_eq!(
            r.apply(&info(&send, "a")),
            Some(Action::RnrNak {
                requester_qpn: 0x11,
                timer: 3
            })
        );
        assert_eq!(r.apply(&info(&send, "a")), None, "only the next SEND");
    }
}
