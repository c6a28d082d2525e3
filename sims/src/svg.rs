//! The ladder diagram of a trace as SVG, for reading on screen or on paper: a title,
//! the lesson and a legend at the top; lifelines; one arrow per packet sloping from its
//! send row down to its arrival, its line style telling its fate (solid delivered,
//! dashed and crossed lost, dotted corrupted; colour only repeats it), with the
//! packet's name above it and its fields and fate to the right; host events (verbs,
//! completions, async events, QP states, timers) as a square on their device's
//! lifeline with their text beside it. Every row's `<title>` (a tooltip) holds its
//! full decoded headers.
//!
//! Time runs down to scale for short gaps (a few pixels per microsecond); a gap longer
//! than [`BREAK`] is drawn as a fixed band labelled with its length (`... 1.28 ms
//! ...`), so a long wait shows as one.

use std::fmt::Write;
use std::time::Duration;

use emu_core::engine::fmt_duration;

use crate::trace::{fmt_time, Entry, Fate, HostNote, PacketRecord, Trace};

const ROW: usize = 24;
const COL: usize = 360;
const LEFT: usize = 110;
const NOTE: usize = 760;
/// Line height of the header's text.
const LINE: usize = 15;
/// Idle stretches longer than this are compressed into a labelled band.
pub const BREAK: Duration = Duration::from_micros(10);
/// Height of a compressed band.
const BAND: usize = 22;
/// Pixels per microsecond of a shorter gap.
const PX_PER_US: usize = 2;

/// What the header says: the legend, one line each.
const LEGEND: [&str; 6] = [
    "Legend: each arrow is a packet, from its send time (left column) down to its arrival; its name and PSN above it.",
    "  solid arrow: delivered;  dashed arrow ending in X: lost (dropped on the link);  dotted arrow: corrupted (the receiver's ICRC check drops it).",
    "  A = AckReq (the sender asks for an ACK);  S = Solicited;  psn = packet sequence number;  msn = the responder's message sequence number (AETH);",
    "  qp = destination QP;  RETH/AtomicETH va, rkey, len = remote address, key, length;  AETH ACK / NAK / RNR_NAK t=code = the responder's answer.",
    "  square on a lifeline: that host's side: a verb posted, a completion (status, bytes), an async event, a QP state change, a timer armed or fired.",
    "  '... 1.28 ms ...': idle time compressed (the vertical axis is to scale only for gaps under 10 us). Hover a row for its full headers.",
];

/// `s` with `&`, `<`, `>` and `"` escaped for XML and HTML text and attributes.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Colour, a dark one (it only repeats what the line style says).
fn colour(f: &Fate) -> &'static str {
    match f {
        Fate::Delivered => "#000",
        Fate::Dropped(_) => "#b71c1c",
        Fate::Corrupted(_) => "#bf360c",
        Fate::Duplicated(_) => "#0d47a1",
        Fate::Injected(_) => "#4a148c",
        Fate::Delayed(_) | Fate::Held => "#1b5e20",
    }
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for w in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + w.len() > width {
            lines.push(w.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(w);
        }
    }
    lines
}

/// The diagram with no title (see [`render_titled`]).
pub fn render(trace: &Trace) -> String {
    render_titled(trace, "", "")
}

/// The whole diagram as an SVG document, headed by `title` and the `lesson` it shows
/// (a scenario's name and description) and the legend.
pub fn render_titled(trace: &Trace, title: &str, lesson: &str) -> String {
    let cols = trace.devices.len().max(1);
    let width = LEFT + (cols - 1) * COL + 40 + NOTE;
    let text_x = LEFT + (cols - 1) * COL + 30;
    let mut body = String::new();
    // The header.
    let mut y = 8;
    if !title.is_empty() {
        y += 18;
        let _ = writeln!(
            body,
            r#"<text x="8" y="{y}" font-size="16" font-weight="bold">{}</text>"#,
            esc(title)
        );
    }
    for l in wrap(lesson, width / 7) {
        if l.is_empty() {
            continue;
        }
        y += LINE;
        let _ = writeln!(body, r#"<text x="8" y="{y}">{}</text>"#, esc(&l));
    }
    y += 6;
    let _ = writeln!(body, r#"<g class="legend" font-size="10">"#);
    for l in LEGEND {
        y += LINE - 2;
        let _ = writeln!(
            body,
            r#"<text x="8" y="{y}" xml:space="preserve">{}</text>"#,
            esc(l)
        );
    }
    body += "</g>\n";
    y += 30;
    let names_y = y;
    let _ = writeln!(body, r#"<text x="8" y="{names_y}">time (s)</text>"#);
    for (i, d) in trace.devices.iter().enumerate() {
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{names_y}" text-anchor="middle" font-weight="bold">{} ({})</text>"#,
            LEFT + i * COL,
            esc(&d.name),
            d.ip
        );
    }
    y += 10;
    let top = y;
    // The rows.
    let mut rows = String::new();
    let mut last: Option<Duration> = None;
    for e in trace.entries() {
        let at = e.at();
        if let Some(prev) = last {
            let gap = at.saturating_sub(prev);
            if gap > BREAK {
                rows += &band(trace, y, gap);
                y += BAND;
            } else {
                y += (gap.as_micros() as usize) * PX_PER_US;
            }
        }
        last = Some(at);
        rows += &match e {
            Entry::Packet(p) => packet_row(trace, p, y + 12, text_x),
            Entry::Host(n) => host_row(trace, n, y + 12),
        };
        y += ROW;
    }
    let height = y + 40;
    for i in 0..trace.devices.len() {
        let x = LEFT + i * COL;
        let _ = writeln!(
            body,
            r##"<line x1="{x}" y1="{top}" x2="{x}" y2="{}" stroke="#000" stroke-width="0.8"/>"##,
            height - 24
        );
    }
    body += &rows;
    let _ = writeln!(
        body,
        r#"<text x="8" y="{}">{}</text>"#,
        height - 6,
        esc(crate::ladder::summary(trace).trim_end())
    );
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11" fill="#000">"##
    );
    if !title.is_empty() {
        let _ = writeln!(s, "<title>{}</title>", esc(title));
    }
    s += r#"<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>"#;
    s.push('\n');
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    s += &body;
    s += "</svg>\n";
    s
}

/// A compressed idle stretch: a white band across the lifelines with break marks and
/// its length.
fn band(trace: &Trace, y: usize, gap: Duration) -> String {
    let mut s = String::new();
    let mid = y + BAND / 2;
    let _ = writeln!(
        s,
        r#"<g class="gap"><title>idle {}</title>"#,
        fmt_duration(gap)
    );
    for i in 0..trace.devices.len() {
        let x = LEFT + i * COL;
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="12" height="{}" fill="white"/><polyline points="{},{} {},{} {},{} {},{}" fill="none" stroke="#000" stroke-width="0.8"/>"##,
            x - 6,
            y + 4,
            BAND - 8,
            x - 6,
            y + 6,
            x + 6,
            y + 3,
            x - 6,
            y + BAND - 6,
            x + 6,
            y + BAND - 9
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-style="italic">... {} ...</text>"#,
        LEFT + 14,
        mid + 4,
        fmt_duration(gap)
    );
    s += "</g>\n";
    s
}

/// A packet's row: its time, its arrow, its fields and fate, and the tooltip.
fn packet_row(trace: &Trace, p: &PacketRecord, y: usize, text_x: usize) -> String {
    let mut s = String::new();
    let c = colour(&p.fate);
    let arrivals: Vec<String> = p.arrivals.iter().map(|a| fmt_time(*a)).collect();
    let verdict = trace.verdict_text(p);
    let _ = writeln!(
        s,
        "<g class=\"packet\"><title>#{} sent {} by {}: {}; {}; arrived [{}]{}</title>",
        p.index,
        fmt_time(p.sent),
        esc(&trace.devices[p.src].name),
        esc(&trace.describe(p)),
        esc(&p.fate.to_string()),
        arrivals.join(", "),
        esc(&verdict)
    );
    let _ = writeln!(
        s,
        r#"<text x="8" y="{}">{}</text>"#,
        y + 4,
        fmt_time(p.sent)
    );
    if let Some(dst) = p.dst.filter(|d| *d != p.src) {
        let (x1, x2) = (LEFT + p.src * COL, LEFT + dst * COL);
        let (x2, y2, head) = match p.fate {
            Fate::Dropped(_) => ((x1 * 2 + x2 * 3) / 5, y + 6, false),
            _ => (x2, y + 10, true),
        };
        let dash = match p.fate {
            Fate::Dropped(_) => r#" stroke-dasharray="6,3""#,
            Fate::Corrupted(_) => r#" stroke-dasharray="2,2""#,
            _ => "",
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y2}" stroke="{c}" stroke-width="1.5"{dash}{}/>"#,
            if head {
                r#" marker-end="url(#head)""#
            } else {
                ""
            }
        );
        if !head {
            let _ = writeln!(
                s,
                r#"<path d="M{},{} l8,8 m0,-8 l-8,8" stroke="{c}" stroke-width="2"/>"#,
                x2 - 4,
                y2 - 4
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" fill="{c}">{}</text>"#,
            (x1 + x2) / 2,
            y - 3,
            esc(&trace.arrow_label(p))
        );
    }
    let note = match p.fate {
        Fate::Delivered => format!("{}{verdict}", trace.fields(p)),
        ref f => format!("{}; {f}{verdict}", trace.fields(p)),
    };
    let _ = writeln!(
        s,
        r#"<text x="{text_x}" y="{}" fill="{c}">{}</text>"#,
        y + 4,
        esc(&note)
    );
    s += "</g>\n";
    s
}

/// A host event's row: a square on its device's lifeline, its text beside it (left of
/// the last lifeline, right of the others).
fn host_row(trace: &Trace, n: &HostNote, y: usize) -> String {
    let mut s = String::new();
    let x = LEFT + n.device * COL;
    let text = n.note.to_string();
    let _ = writeln!(
        s,
        "<g class=\"host\"><title>{} at {}: {}</title>",
        esc(&trace.devices[n.device].name),
        fmt_time(n.at),
        esc(&text)
    );
    let _ = writeln!(s, r#"<text x="8" y="{}">{}</text>"#, y + 4, fmt_time(n.at));
    let _ = writeln!(
        s,
        r##"<rect x="{}" y="{}" width="7" height="7" fill="#000"/>"##,
        x - 3,
        y - 3
    );
    let last = n.device > 0 && n.device + 1 == trace.devices.len();
    let (tx, anchor) = if last {
        (x - 10, "end")
    } else {
        (x + 10, "start")
    };
    let _ = writeln!(
        s,
        r#"<text x="{tx}" y="{}" text-anchor="{anchor}" font-style="italic">{}</text>"#,
        y + 4,
        esc(&text)
    );
    s += "</g>\n";
    s
}
