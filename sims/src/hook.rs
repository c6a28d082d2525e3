//! The fabric's per-packet [`Rule`]s on a real wire: [`RuleHook`] is an
//! `emu_core::nic::interop::PacketHook` that runs rules over the packets of an
//! `EmuDevice`'s UDP link (interop mode, toward kernel rxe or a NIC), so a test can say
//! "drop our first ACK" or "duplicate the READ request" toward a real peer in the same
//! words it uses on the simulated [`Fabric`](crate::Fabric). (emu-core does not depend
//! on sims; this adapter is why it need not.)
//!
//! Devices are named by their IPv4 address in text (`"192.168.77.1"`), so
//! [`Match::from`](crate::Match::from) and [`Match::to`](crate::Match::to) pick a
//! direction. Rules run in order; the first that fires decides, as on the fabric.
//!
//! What a hook can do is narrower than what the fabric can: it changes or drops a packet
//! before the link computes its ICRC, and cannot inject one. So:
//!
//! | action | on a packet we send | on a packet we receive |
//! |---|---|---|
//! | `Drop` | dropped | dropped |
//! | `Duplicate`, `Delay` | done | not possible |
//! | `Truncate(n)` | re-emitted without the last `n` payload bytes, ICRC right | not possible |
//! | `CorruptIcrc` | not possible (the link writes the ICRC after the hook) | not possible |
//! | `RnrNak` | not possible (needs a packet injected toward the sender) | not possible |
//!
//! A rule that fires with an action that is not possible in its direction leaves the
//! packet unchanged and is recorded: [`RuleHook::unsupported`] lists them, so a test
//! can fail instead of believing a fault was applied.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use emu_core::nic::interop::{PacketHook, Verdict};
use emu_wire::PacketRepr;
use parking_lot::Mutex;

use crate::rules::{Action, PacketInfo, Rule};

/// A [`PacketHook`] that applies sims [`Rule`]s to the UDP link of one device.
pub struct RuleHook {
    me: String,
    state: Mutex<State>,
}

struct State {
    rules: Vec<Rule>,
    /// Packets seen, both directions, in order (the rules' `PacketInfo::index`).
    seen: u64,
    unsupported: Vec<(String, Action)>,
}

impl fmt::Debug for RuleHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("RuleHook")
            .field("me", &self.me)
            .field("rules", &st.rules)
            .field("seen", &st.seen)
            .finish()
    }
}

impl RuleHook {
    /// A hook for the device at `me` with `rules`, applied in order.
    pub fn new(me: Ipv4Addr, rules: Vec<Rule>) -> RuleHook {
        RuleHook {
            me: me.to_string(),
            state: Mutex::new(State {
                rules,
                seen: 0,
                unsupported: Vec::new(),
            }),
        }
    }

    /// Adds a rule after the others; returns its index.
    pub fn add_rule(&self, rule: Rule) -> usize {
        let mut st = self.state.lock();
        st.rules.push(rule);
        st.rules.len() - 1
    }

    /// How many packets rule `index` acted on (0 for no such rule).
    pub fn fired(&self, index: usize) -> u64 {
        self.state.lock().rules.get(index).map_or(0, Rule::fired)
    }

    /// Packets the hook saw, both directions.
    pub fn seen(&self) -> u64 {
        self.state.lock().seen
    }

    /// Rules that fired with an action this direction of a UDP link cannot carry out
    /// (rule name and action, in order); those packets went on unchanged.
    pub fn unsupported(&self) -> Vec<(String, Action)> {
        self.state.lock().unsupported.clone()
    }

    /// Runs the rules over one packet; the firing rule's action and name.
    fn decide(&self, src: &str, dst: &str, packet: &[u8]) -> Option<(Action, String, PacketRepr)> {
        let mut st = self.state.lock();
        let index = st.seen;
        st.seen += 1;
        // A packet that does not parse is left to the link (which drops and counts it).
        let (repr, payload) = PacketRepr::parse(packet).ok()?;
        let info = PacketInfo {
            index,
            src,
            dst,
            repr: &repr,
            payload_len: payload.len(),
        };
        let (action, name) = st
            .rules
            .iter_mut()
            .find_map(|r| r.apply(&info).map(|a| (a, r.name().to_owned())))?;
        Some((action, name, repr))
    }

    fn not_possible(&self, name: String, action: Action) -> Verdict {
        self.state.lock().unsupported.push((name, action));
        Verdict::Pass
    }
}

impl PacketHook for RuleHook {
    fn on_send(&self, dst: Ipv4Addr, packet: &[u8]) -> Verdict {
        let Some((action, name, repr)) = self.decide(&self.me, &dst.to_string(), packet) else {
            return Verdict::Pass;
        };
        match action {
            Action::Drop => Verdict::Drop,
            Action::Duplicate => Verdict::Duplicate,
            Action::Delay(d) => Verdict::Delay(d),
            Action::Truncate(n) => {
                // The same headers over a shorter payload; the link writes the ICRC.
                let Ok((_, payload)) = PacketRepr::parse(packet) else {
                    return Verdict::Pass;
                };
                let keep = payload.len().saturating_sub(n);
                let mut buf = vec![0u8; repr.buffer_len(keep)];
                let len = repr.emit(&mut buf, &payload[..keep]);
                buf.truncate(len);
                Verdict::Replace(buf)
            }
            Action::CorruptIcrc | Action::RnrNak { .. } => self.not_possible(name, action),
        }
    }

    fn on_receive(&self, from: SocketAddrV4, _ip_id: Option<u16>, packet: &[u8]) -> Verdict {
        let Some((action, name, _)) = self.decide(&from.ip().to_string(), &self.me, packet) else {
            return Verdict::Pass;
        };
        match action {
            Action::Drop => Verdict::Drop,
            _ => self.not_possible(name, action),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Kind, Match};
    use emu_wire::{Opcode, Psn, RethRepr};
    use std::time::Duration;

    const ME: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
    const PEER: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);

    fn packet(op: Opcode, psn: u32, payload: &[u8]) -> Vec<u8> {
        let mut r = PacketRepr::new(op, 0x11, Psn::new(psn));
        if r.reth.is_some() {
            r.reth = Some(RethRepr {
                va: 0x1000,
                rkey: 7,
                dma_len: payload.len() as u32,
            });
        }
        let mut b = vec![0u8; r.buffer_len(payload.len())];
        let n = r.emit(&mut b, payload);
        b.truncate(n);
        b
    }

    fn from_peer() -> SocketAddrV4 {
        SocketAddrV4::new(PEER, 4791)
    }

    #[test]
    fn drops_only_our_first_ack_and_counts_both_directions() {
        let hook = RuleHook::new(ME, vec![]);
        let i = hook.add_rule(
            Rule::new(
                "drop our first ACK",
                Match::any().kind(Kind::Ack).from("192.168.77.1"),
                Action::Drop,
            )
            .nth(1),
        );
        let ack = packet(Opcode::RcAcknowledge, 5, &[]);
        // rxe's ACK to us does not match `from`.
        assert_eq!(hook.on_receive(from_peer(), Some(9), &ack), Verdict::Pass);
        assert_eq!(hook.on_send(PEER, &ack), Verdict::Drop);
        assert_eq!(hook.on_send(PEER, &ack), Verdict::Pass, "only the first");
        assert_eq!(hook.fired(i), 1);
        assert_eq!(hook.seen(), 3);
        assert!(hook.unsupported().is_empty());
    }

    #[test]
    fn send_actions_map_to_verdicts_and_first_rule_wins() {
        let d = Duration::from_millis(3);
        let hook = RuleHook::new(
            ME,
            vec![
                Rule::new(
                    "dup reads",
                    Match::any().kind(Kind::ReadRequest),
                    Action::Duplicate,
                ),
                Rule::new("delay all", Match::any(), Action::Delay(d)),
            ],
        );
        let read = packet(Opcode::RcRdmaReadRequest, 1, &[]);
        let send = packet(Opcode::RcSendOnly, 2, &[1, 2, 3, 4]);
        assert_eq!(hook.on_send(PEER, &read), Verdict::Duplicate);
        assert_eq!(hook.on_send(PEER, &send), Verdict::Delay(d));
        assert_eq!(hook.fired(0), 1);
        // The delay rule never saw the READ: the first firing rule decides.
        assert_eq!(hook.fired(1), 1);
    }

    #[test]
    fn truncate_re_emits_a_shorter_well_formed_packet() {
        let hook = RuleHook::new(
            ME,
            vec![Rule::new(
                "cut 3",
                Match::any().kind(Kind::Write),
                Action::Truncate(3),
            )],
        );
        let w = packet(Opcode::RcRdmaWriteOnly, 4, &[9; 10]);
        let Verdict::Replace(b) = hook.on_send(PEER, &w) else {
            panic!("expected a replacement")
        };
        let (repr, payload) = PacketRepr::parse(&b).unwrap();
        assert_eq!(payload, &[9; 7]);
        assert_eq!(repr.bth.psn, Psn::new(4));
        assert_eq!(repr.reth.unwrap().rkey, 7);
    }

    #[test]
    fn actions_a_hook_cannot_do_pass_and_are_reported() {
        let hook = RuleHook::new(
            ME,
            vec![
                Rule::new(
                    "corrupt",
                    Match::any().kind(Kind::Send),
                    Action::CorruptIcrc,
                ),
                Rule::new("dup acks", Match::any().kind(Kind::Ack), Action::Duplicate),
            ],
        );
        let send = packet(Opcode::RcSendOnly, 2, &[0; 4]);
        let ack = packet(Opcode::RcAcknowledge, 2, &[]);
        assert_eq!(hook.on_send(PEER, &send), Verdict::Pass);
        // Received packets can only be dropped.
        assert_eq!(hook.on_receive(from_peer(), None, &ack), Verdict::Pass);
        let names: Vec<String> = hook.unsupported().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["corrupt", "dup acks"]);
    }

    #[test]
    fn garbage_passes_untouched() {
        let hook = RuleHook::new(ME, vec![Rule::new("all", Match::any(), Action::Drop)]);
        assert_eq!(hook.on_send(PEER, &[0xFF; 3]), Verdict::Pass);
        assert_eq!(hook.on_receive(from_peer(), None, &[]), Verdict::Pass);
        assert_eq!(hook.fired(0), 0);
    }
}
