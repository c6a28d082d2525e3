//! The trace: every packet the fabric carried, with its virtual send time, direction,
//! decoded headers, and what happened to it; and each device's host events (its
//! engine's notes: verbs, completions, events, QP states, timers), recorded at the
//! fabric's virtual time. [`Trace::entries`] merges the two into one log in time
//! order.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use emu_core::engine::Note;
use emu_wire::{write_icrc, Ipv4Endpoints, PacketRepr, Syndrome};

/// Why a packet was dropped, duplicated, delayed or corrupted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A rule, by name.
    Rule(String),
    /// The link's seeded random loss, duplication, corruption or jitter.
    Random,
    /// The two devices are partitioned.
    Partition,
    /// Larger than the link's MTU.
    Mtu,
    /// The link's queue was full (tail drop).
    QueueFull,
    /// No device has the destination address.
    NoRoute,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Rule(n) => write!(f, "rule \"{n}\""),
            Cause::Random => f.write_str("random"),
            Cause::Partition => f.write_str("partition"),
            Cause::Mtu => f.write_str("MTU"),
            Cause::QueueFull => f.write_str("queue full"),
            Cause::NoRoute => f.write_str("no route"),
        }
    }
}

/// What happened to a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It arrived as sent.
    Delivered,
    /// It never arrived.
    Dropped(Cause),
    /// Two copies arrived.
    Duplicated(Cause),
    /// It arrived later than the link's latency.
    Delayed(Cause),
    /// It arrived with a bit flipped: the receiver's ICRC check drops it.
    Corrupted(Cause),
    /// It was held on its link (see `Fabric::hold`) and arrives after the release.
    Held,
    /// A rule made it up (e.g. an RNR NAK in answer to a request it dropped).
    Injected(String),
}

impl Fate {
    /// The fates' names, one word each, in the order of [`Fate::index`].
    pub const NAMES: [&'static str; 7] = [
        "delivered",
        "dropped",
        "duplicated",
        "delayed",
        "corrupted",
        "held",
        "injected",
    ];

    /// Its place in [`Fate::NAMES`].
    pub fn index(&self) -> usize {
        match self {
            Fate::Delivered => 0,
            Fate::Dropped(_) => 1,
            Fate::Duplicated(_) => 2,
            Fate::Delayed(_) => 3,
            Fate::Corrupted(_) => 4,
            Fate::Held => 5,
            Fate::Injected(_) => 6,
        }
    }

    /// Its name in one word: `delivered`, `dropped`, ...
    pub fn name(&self) -> &'static str {
        Self::NAMES[self.index()]
    }
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fate::Delivered => f.write_str("delivered"),
            Fate::Dropped(c) => write!(f, "dropped by {c}"),
            Fate::Duplicated(c) => write!(f, "duplicated by {c}"),
            Fate::Delayed(c) => write!(f, "delayed by {c}"),
            Fate::Corrupted(c) => write!(f, "corrupted by {c}: ICRC check drops it"),
            Fate::Held => f.write_str("held"),
            Fate::Injected(r) => write!(f, "injected by rule \"{r}\""),
        }
    }
}

/// One packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketRecord {
    /// Packet number, in send order from 0.
    pub index: u64,
    /// Virtual time it was sent.
    pub sent: Duration,
    /// Virtual times its copies arrived (empty if none did, yet).
    pub arrivals: Vec<Duration>,
    /// Sending device (index into [`Trace::devices`]).
    pub src: usize,
    /// Receiving device, if one has the address.
    pub dst: Option<usize>,
    /// Destination address.
    pub dst_ip: Ipv4Addr,
    /// Headers, if it parsed.
    pub repr: Option<PacketRepr>,
    /// Payload bytes (pad and ICRC excluded).
    pub payload_len: usize,
    /// The UDP payload as sent (BTH through ICRC), when the trace keeps bytes.
    pub bytes: Option<Vec<u8>>,
    /// What happened to it.
    pub fate: Fate,
    /// What the receiver did with it when that was not to execute it (`discarded:
    /// PSN gap...`, `duplicate: answered again...`): the engine's [`Note::Discard`].
    pub verdict: Option<String>,
}

/// Something a device's host side did (a verb, a completion, an event, a QP state
/// change, a timer), from its engine's notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostNote {
    /// Virtual time it happened.
    pub at: Duration,
    /// The device (index into [`Trace::devices`]).
    pub device: usize,
    /// How many packets were recorded before it: its place among them.
    pub after_packets: usize,
    /// What happened.
    pub note: Note,
}

/// One entry of a trace's time-ordered log: a packet or a host event.
#[derive(Clone, Copy, Debug)]
pub enum Entry<'a> {
    /// A packet, at its send time.
    Packet(&'a PacketRecord),
    /// A host event.
    Host(&'a HostNote),
}

impl Entry<'_> {
    /// When it happened (a packet: when it was sent).
    pub fn at(&self) -> Duration {
        match self {
            Entry::Packet(p) => p.sent,
            Entry::Host(n) => n.at,
        }
    }
}

/// A device of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceDevice {
    /// Its name.
    pub name: String,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// A named range of virtual addresses: traces print addresses inside it as
/// `name+offset`, which stay the same from run to run (a `MemBuf`'s address is a heap
/// address and does not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// Name printed.
    pub name: String,
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// How much the fabric records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceMode {
    /// Nothing (fastest).
    Off,
    /// Headers and fates.
    Headers,
    /// Headers, fates and every packet's bytes (needed for pcap).
    Full,
}

/// A recorded run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The devices, in the order they were added.
    pub devices: Vec<TraceDevice>,
    /// The packets, in send order.
    pub packets: Vec<PacketRecord>,
    /// Host events (verbs, completions, events, state changes, timers), in order;
    /// see [`Trace::entries`] for them merged with the packets.
    pub notes: Vec<HostNote>,
    /// Address labels.
    pub labels: Vec<Label>,
    /// The UDP port every device uses (both ends of every packet).
    pub port: u16,
}

impl Trace {
    /// Packets and host events as one log in time order (in the order they were
    /// recorded: a host event before the packets its input sent).
    pub fn entries(&self) -> Vec<Entry<'_>> {
        let mut out = Vec::with_capacity(self.packets.len() + self.notes.len());
        let mut notes = self.notes.iter().peekable();
        for (i, p) in self.packets.iter().enumerate() {
            while let Some(n) = notes.next_if(|n| n.after_packets <= i) {
                out.push(Entry::Host(n));
            }
            out.push(Entry::Packet(p));
        }
        out.extend(notes.map(Entry::Host));
        out
    }

    /// `va` as `label+0xoff` if a label covers it, else as hex.
    pub fn addr(&self, va: u64) -> String {
        match self
            .labels
            .iter()
            .find(|l| va >= l.addr && va - l.addr < l.len.max(1))
        {
            Some(l) if va == l.addr => l.name.clone(),
            Some(l) => format!("{}+{:#x}", l.name, va - l.addr),
            None => format!("{va:#x}"),
        }
    }

    /// Every header field of a packet in one line, for diagrams and comparisons:
    /// `RC_SEND_ONLY psn=100 qp=0x000011 A len=8`.
    pub fn describe(&self, p: &PacketRecord) -> String {
        match &p.repr {
            Some(r) => format!(
                "{} psn={} {}",
                r.bth.opcode.name(),
                r.bth.psn.value(),
                self.fields(p)
            ),
            None => self.fields(p),
        }
    }

    /// The header fields after the opcode and PSN: destination QP, AckReq (`A`),
    /// Solicited (`S`), DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH and the
    /// payload length.
    pub fn fields(&self, p: &PacketRecord) -> String {
        let Some(r) = &p.repr else {
            return format!("unparsed ({} bytes)", p.bytes.as_ref().map_or(0, Vec::len));
        };
        let mut s = format!("qp={:#08x}", r.bth.dest_qp);
        if r.bth.ack_req {
            s.push_str(" A");
        }
        if r.bth.solicited {
            s.push_str(" S");
        }
        if let Some(d) = r.deth {
            s += &format!(" DETH(qkey={:#x} src_qp={:#x})", d.qkey, d.src_qp);
        }
        if let Some(x) = r.reth {
            s += &format!(
                " RETH(va={} rkey={:#x} len={})",
                self.addr(x.va),
                x.rkey,
                x.dma_len
            );
        }
        if let Some(x) = r.atomic_eth {
            s += &format!(
                " AtomicETH(va={} rkey={:#x} swap_add={} compare={})",
                self.addr(x.va),
                x.rkey,
                x.swap_add,
                x.compare
            );
        }
        if let Some(a) = r.aeth {
            s += &format!(" AETH({} msn={})", syndrome(a.syndrome), a.msn);
        }
        if let Some(x) = r.atomic_ack_eth {
            s += &format!(" orig={}", x.orig);
        }
        if let Some(i) = r.imm_dt {
            s += &format!(" imm={i:#x}");
        }
        if let Some(k) = r.ieth {
            s += &format!(" inv_rkey={k:#x}");
        }
        if p.payload_len > 0 {
            s += &format!(" len={}", p.payload_len);
        }
        s
    }

    /// What the receiver did with a packet it did not execute, after a `; `, named by
    /// the receiving device (`; b discarded: PSN gap...`); empty if it executed it.
    pub fn verdict_text(&self, p: &PacketRecord) -> String {
        match (&p.verdict, p.dst) {
            (Some(v), Some(d)) => format!("; {} {v}", self.devices[d].name),
            (Some(v), None) => format!("; {v}"),
            _ => String::new(),
        }
    }

    /// The short name of a packet for an arrow: the opcode without `RC_`, its PSN.
    pub fn arrow_label(&self, p: &PacketRecord) -> String {
        match &p.repr {
            Some(r) => {
                let name = r.bth.opcode.name();
                format!(
                    "{} {}",
                    name.strip_prefix("RC_").unwrap_or(name),
                    r.bth.psn.value()
                )
            }
            None => "?".into(),
        }
    }

    /// One line per packet: time, direction, headers, fate and arrivals. Stable from
    /// run to run (labelled addresses), so two runs of one program compare equal.
    pub fn lines(&self) -> Vec<String> {
        self.packets
            .iter()
            .map(|p| {
                let dst = p
                    .dst
                    .map_or_else(|| p.dst_ip.to_string(), |d| self.devices[d].name.clone());
                let arr: Vec<String> = p.arrivals.iter().map(|a| fmt_time(*a)).collect();
                format!(
                    "#{} {} {}->{} {} [{}] arrived [{}]",
                    p.index,
                    fmt_time(p.sent),
                    self.devices[p.src].name,
                    dst,
                    self.describe(p),
                    p.fate,
                    arr.join(", ")
                )
            })
            .collect()
    }

    /// The packets' bytes with every labelled virtual address (RETH and AtomicETH VA)
    /// rewritten as label-relative (label number in the top 16 bits, offset below) and
    /// the ICRC recomputed: equal for two runs of one seeded program, byte for byte.
    /// (The raw bytes differ only there, because a `MemBuf`'s address is a heap
    /// address.)
    pub fn canonical_bytes(&self) -> Vec<Vec<u8>> {
        self.packets
            .iter()
            .map(|p| {
                let mut b = p.bytes.clone().unwrap_or_default();
                let Some(r) = &p.repr else { return b };
                let op = r.bth.opcode;
                // IBTA 9.3: the RETH or AtomicETH follows the BTH (and DETH) directly,
                // its VA in the first 8 bytes.
                let at = 12 + if op.has_deth() { 8 } else { 0 };
                let va = r.reth.map(|x| x.va).or(r.atomic_eth.map(|x| x.va));
                if let Some(va) = va {
                    if let Some((i, l)) = self
                        .labels
                        .iter()
                        .enumerate()
                        .find(|(_, l)| va >= l.addr && va - l.addr < l.len.max(1))
                    {
                        let canon = ((i as u64 + 1) << 48) | (va - l.addr);
                        b[at..at + 8].copy_from_slice(&canon.to_be_bytes());
                        let ep = Ipv4Endpoints {
                            src: self.devices[p.src].ip,
                            dst: p.dst_ip,
                            ip_id: 0,
                            src_port: self.port,
                            dst_port: self.port,
                        };
                        write_icrc(&ep, &mut b);
                    }
                }
                b
            })
            .collect()
    }
}

/// `ACK`, `RNR_NAK(t=14)`, `NAK(PSN_SEQ_ERR)`...
pub fn syndrome(s: Syndrome) -> String {
    use emu_wire::NakCode::*;
    match s {
        Syndrome::Ack { .. } => "ACK".into(),
        Syndrome::RnrNak { timer } => format!("RNR_NAK t={timer}"),
        Syndrome::Nak(c) => match c {
            PsnSequenceError => "NAK PSN_SEQ_ERR",
            InvalidRequest => "NAK INV_REQ",
            RemoteAccessError => "NAK REM_ACCESS_ERR",
            RemoteOperationalError => "NAK REM_OP_ERR",
            InvalidRdRequest => "NAK INV_RD_REQ",
        }
        .into(),
    }
}

/// Virtual time as `ss.uuuuuu` seconds with microseconds.
pub fn fmt_time(t: Duration) -> String {
    format!("{}.{:06}", t.as_secs(), t.subsec_micros())
}
