//! The ladder (sequence) diagram of a trace as plain text: one lifeline per device,
//! one arrow per packet at its send time, the arrow's head telling its fate (`>`
//! arrived, `X` lost, `#` arrived corrupted and was dropped by the ICRC check), and
//! every header field, the fate and what the receiver did with it when it did not
//! execute it written after it; and, in time order with the packets, each device's
//! host events (verbs, completions, async events, QP states, timers) as a `*` on its
//! lifeline with the text beside it.
//!
//! ```text
//!  time (s)  a                                               b
//!  0.000000  * post_send SEND wr_id=1 len=8                  |
//!  0.000000  |--SEND_ONLY 100------------------------------->|  qp=0x000012 A len=8; arrives 0.000001
//!  0.000000  * ACK timer armed (67.1 ms)                     |
//!  0.000001  |         completion wr_id=7 SUCCESS RECV len=8 *
//!  0.000001  |<------------------------------ACKNOWLEDGE 100-|  qp=0x000011 AETH(ACK msn=1); arrives 0.000002
//!  0.000002  * completion wr_id=1 SUCCESS SEND len=8         |
//! ```

use crate::trace::{fmt_time, Entry, Fate, HostNote, PacketRecord, Trace};

/// Columns between two lifelines.
const GAP: usize = 48;
/// Width of the time column.
const TIME: usize = 11;

/// The whole diagram, ending with a summary line.
pub fn render(trace: &Trace) -> String {
    let cols = trace.devices.len().max(1);
    let width = (cols - 1) * GAP + 1;
    let mut out = String::new();
    // Header: device names over their lifelines.
    let mut head = vec![b' '; width + GAP];
    for (i, d) in trace.devices.iter().enumerate() {
        let name = format!("{} ({})", d.name, d.ip);
        let at = i * GAP;
        for (k, c) in name.bytes().enumerate() {
            if at + k < head.len() {
                head[at + k] = c;
            }
        }
    }
    out += &format!(
        "{:>TIME$}  {}\n",
        "time (s)",
        String::from_utf8_lossy(&head).trim_end()
    );
    for e in trace.entries() {
        out += &match e {
            Entry::Packet(p) => line(trace, p, width),
            Entry::Host(n) => host_line(trace, n, width),
        };
        out.push('\n');
    }
    out += &summary(trace);
    out
}

fn line(trace: &Trace, p: &PacketRecord, width: usize) -> String {
    let mut row = vec![b' '; width];
    for i in 0..trace.devices.len() {
        row[i * GAP] = b'|';
    }
    if let Some(dst) = p.dst.filter(|d| *d != p.src) {
        let (s, d) = (p.src * GAP, dst * GAP);
        let right = d > s;
        let (lo, hi) = if right { (s, d) } else { (d, s) };
        let lost = matches!(p.fate, Fate::Dropped(_));
        // A lost packet's arrow stops three quarters of the way.
        let (lo, hi) = match (lost, right) {
            (true, true) => (lo, lo + (hi - lo) * 3 / 4),
            (true, false) => (hi - (hi - lo) * 3 / 4, hi),
            _ => (lo, hi),
        };
        for c in &mut row[lo + 1..hi] {
            *c = b'-';
        }
        let head = match p.fate {
            Fate::Dropped(_) => b'X',
            Fate::Corrupted(_) => b'#',
            _ if right => b'>',
            _ => b'<',
        };
        if right {
            row[hi - 1] = head;
        } else {
            row[lo + 1] = head;
        }
        let label = trace.arrow_label(p);
        let label = label.as_bytes();
        let room = hi - lo - 4;
        let n = label.len().min(room);
        let at = if right { lo + 3 } else { hi - 2 - n };
        row[at..at + n].copy_from_slice(&label[..n]);
    }
    let arrivals: Vec<String> = p.arrivals.iter().map(|a| fmt_time(*a)).collect();
    let outcome = match (&p.fate, arrivals.is_empty()) {
        (Fate::Delivered, false) => format!("arrives {}", arrivals.join(", ")),
        (Fate::Delivered, true) => "in flight at the end".into(),
        (Fate::Dropped(_), _) => p.fate.to_string(),
        (f, true) => format!("{f}; not arrived at the end"),
        (f, false) => format!("{f}; arrives {}", arrivals.join(", ")),
    };
    let verdict = trace.verdict_text(p);
    format!(
        "{:>TIME$}  {}  {}; {}{}",
        fmt_time(p.sent),
        String::from_utf8_lossy(&row),
        trace.fields(p),
        outcome,
        verdict
    )
}

/// A host event in its device's column: `*` on the lifeline, the text beside it
/// (right of the lifeline for every device but the last, left of it for the last).
fn host_line(trace: &Trace, n: &HostNote, width: usize) -> String {
    let mut row = vec![b' '; width];
    for i in 0..trace.devices.len() {
        row[i * GAP] = b'|';
    }
    let at = n.device * GAP;
    let text = format!("{}", n.note);
    let last = n.device + 1 == trace.devices.len() && n.device > 0;
    let mut tail = String::new();
    if at < row.len() {
        row[at] = b'*';
        let t = text.as_bytes();
        if last && t.len() + 2 <= GAP {
            let from = at - 2 - t.len();
            row[from..from + t.len()].copy_from_slice(t);
        } else if !last && t.len() + 3 < GAP {
            row[at + 2..at + 2 + t.len()].copy_from_slice(t);
        } else {
            tail = format!("  {}: {text}", trace.devices[n.device].name);
        }
    }
    let row = String::from_utf8_lossy(&row).trim_end().to_string();
    format!("{:>TIME$}  {row}{tail}", fmt_time(n.at))
}

/// `N packets: delivered D, dropped X, ...` (only the fates that occurred).
pub fn summary(trace: &Trace) -> String {
    let mut counts = [0usize; Fate::NAMES.len()];
    for p in &trace.packets {
        counts[p.fate.index()] += 1;
    }
    let parts: Vec<String> = Fate::NAMES
        .iter()
        .zip(counts)
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    format!("{} packets: {}\n", trace.packets.len(), parts.join(", "))
}
