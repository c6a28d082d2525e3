//! The ladder diagram of a trace as SVG, for a browser: lifelines, one arrow per
//! packet sloping from its send row down to its arrival, coloured by fate (black
//! delivered, red lost, orange corrupted, blue duplicated, purple injected, green
//! delayed or held), with the packet's name above it and its fields and fate to the
//! right.

use std::fmt::Write;

use crate::trace::{fmt_time, Fate, Trace};

const ROW: usize = 24;
const COL: usize = 360;
const LEFT: usize = 110;
const TOP: usize = 50;
const NOTE: usize = 760;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn colour(f: &Fate) -> &'static str {
    match f {
        Fate::Delivered => "#222",
        Fate::Dropped(_) => "#c62828",
        Fate::Corrupted(_) => "#ef6c00",
        Fate::Duplicated(_) => "#1565c0",
        Fate::Injected(_) => "#6a1b9a",
        Fate::Delayed(_) | Fate::Held => "#2e7d32",
    }
}

/// The whole diagram as an SVG document.
pub fn render(trace: &Trace) -> String {
    let cols = trace.devices.len().max(1);
    let rows = trace.packets.len();
    let width = LEFT + (cols - 1) * COL + 40 + NOTE;
    let height = TOP + (rows + 1) * ROW + 20;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    s += r#"<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>"#;
    s.push('\n');
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r##"<text x="8" y="{}" fill="#555">time (s)</text>"##,
        TOP - 20
    );
    for (i, d) in trace.devices.iter().enumerate() {
        let x = LEFT + i * COL;
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" text-anchor="middle" font-weight="bold">{} ({})</text>"#,
            TOP - 20,
            esc(&d.name),
            d.ip
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#999"/>"##,
            TOP - 10,
            height - 10
        );
    }
    for (row, p) in trace.packets.iter().enumerate() {
        let y = TOP + row * ROW + 12;
        let c = colour(&p.fate);
        let _ = writeln!(
            s,
            r##"<text x="8" y="{}" fill="#555">{}</text>"##,
            y + 4,
            fmt_time(p.sent)
        );
        if let Some(dst) = p.dst.filter(|d| *d != p.src) {
            let (x1, x2) = (LEFT + p.src * COL, LEFT + dst * COL);
            let (x2, y2, head) = match p.fate {
                Fate::Dropped(_) => ((x1 * 2 + x2 * 3) / 5, y + 6, false),
                _ => (x2, y + 10, true),
            };
            let _ = writeln!(
                s,
                r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y2}" stroke="{c}" stroke-width="1.5"{}/>"#,
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
            Fate::Delivered => trace.fields(p),
            ref f => format!("{}; {f}", trace.fields(p)),
        };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="{c}">{}</text>"#,
            LEFT + (cols - 1) * COL + 30,
            y + 4,
            esc(&note)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="8" y="{}" fill="#555">{}</text>"##,
        height - 4,
        esc(crate::ladder::summary(trace).trim_end())
    );
    s += "</svg>\n";
    s
}
