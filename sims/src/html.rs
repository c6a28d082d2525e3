//! A trace as one self-contained HTML page that plays the ladder step by step: every
//! packet and host event of [`Trace::entries`] is a step; the page moves through them
//! (next and previous, first and last, a click on any row, a list to jump to any
//! packet, the arrow keys) and shows, for the current step, its full decoded headers
//! (and bytes, when the trace kept them) and each device's QP states, send and
//! receive queues, completions and async events at that moment ([`replay`](crate::replay)).
//!
//! The page needs nothing but a browser: no network, no build step, its style and
//! script inline. Its address picks the first step shown: `#step=K` (from 1), `#end`,
//! or `#play`, which steps from the first to the last through the page's own "next"
//! button and records the last step reached in `<body data-played>` (the tests drive
//! a headless browser so). A script error is recorded in `<html data-error>`.

use std::fmt::Write;

use crate::replay::{snapshots, SideView, Wqe};
use crate::svg::esc;
use crate::trace::{fmt_time, Entry, Fate, PacketRecord, Trace};

const STYLE: &str = r#"
body { font-family: sans-serif; margin: 0 1em 1em; color: #111; }
h1 { font-size: 1.3em; margin: 0.6em 0 0.2em; }
.lesson { margin: 0 0 0.6em; max-width: 70em; }
nav { position: sticky; top: 0; background: #fff; padding: 0.4em 0; border-bottom: 1px solid #ccc; }
nav button { font-size: 1em; }
#where { margin: 0 1em; font-weight: bold; }
main { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 1em; }
#steps { font-family: monospace; font-size: 0.85em; list-style: none; padding: 0; margin: 0.5em 0;
  max-height: 80vh; overflow-y: auto; }
#steps li { padding: 1px 4px; cursor: pointer; white-space: nowrap; }
#steps li.host { color: #333; }
#steps li.lost { color: #b71c1c; }
#steps li.current { background: #ffe082; }
#steps .t { color: #666; }
#steps .who { display: inline-block; min-width: 5em; }
.step h2 { font-size: 1.1em; }
.step pre { font-size: 0.8em; background: #f5f5f5; padding: 0.4em; overflow-x: auto; }
.sides { display: flex; flex-wrap: wrap; gap: 1em; }
.side { border: 1px solid #ccc; padding: 0 0.6em 0.6em; min-width: 16em; }
.side h3 { font-size: 1em; }
.side h4 { font-size: 0.9em; margin: 0.6em 0 0.2em; }
.side table { border-collapse: collapse; font-size: 0.85em; }
.side td, .side th { border: 1px solid #ddd; padding: 1px 4px; text-align: left; vertical-align: top; }
.side ol { font-family: monospace; font-size: 0.8em; margin: 0; padding-left: 1.5em; }
.none { color: #888; font-style: italic; }
@media print { nav { display: none; } #steps { max-height: none; } }
"#;

const SCRIPT: &str = r##"
(function () {
  "use strict";
  var n = Number(document.body.dataset.steps);
  var cur = -1;
  function el(id) { return document.getElementById(id); }
  function show(k) {
    if (n === 0) return;
    k = Math.max(0, Math.min(n - 1, k));
    if (cur >= 0) {
      el("step-" + cur).hidden = true;
      var old = el("row-" + cur);
      old.classList.remove("current");
      old.removeAttribute("aria-current");
    }
    cur = k;
    el("step-" + k).hidden = false;
    var row = el("row-" + k);
    row.classList.add("current");
    row.setAttribute("aria-current", "step");
    if (row.scrollIntoView) row.scrollIntoView({ block: "nearest" });
    document.body.dataset.step = String(k + 1);
    el("where").textContent = "step " + (k + 1) + " of " + n;
    if (row.dataset.near !== undefined) el("jump").value = row.dataset.near;
  }
  el("first").addEventListener("click", function () { show(0); });
  el("prev").addEventListener("click", function () { show(cur - 1); });
  el("next").addEventListener("click", function () { show(cur + 1); });
  el("last").addEventListener("click", function () { show(n - 1); });
  el("jump").addEventListener("change", function (e) {
    var row = document.querySelector('#steps li[data-packet="' + e.target.value + '"]');
    if (row) show(Number(row.dataset.k));
  });
  var rows = document.querySelectorAll("#steps li");
  for (var i = 0; i < rows.length; i++) {
    rows[i].addEventListener("click", function (e) { show(Number(e.currentTarget.dataset.k)); });
  }
  document.addEventListener("keydown", function (e) {
    if (e.target.tagName === "SELECT") return;
    if (e.key === "ArrowRight" || e.key === "ArrowDown" || e.key === "n") { show(cur + 1); e.preventDefault(); }
    else if (e.key === "ArrowLeft" || e.key === "ArrowUp" || e.key === "p") { show(cur - 1); e.preventDefault(); }
    else if (e.key === "Home") { show(0); e.preventDefault(); }
    else if (e.key === "End") { show(n - 1); e.preventDefault(); }
  });
  var h = location.hash, m = /^#step=(\d+)$/.exec(h);
  if (h === "#play") {
    show(0);
    var next = el("next");
    for (var guard = 0; cur < n - 1 && guard < n; guard++) next.click();
    document.body.dataset.played = String(cur + 1);
  } else if (h === "#end") {
    show(n - 1);
  } else {
    show(m ? Number(m[1]) - 1 : 0);
  }
})();
"##;

/// Whether a packet's arrow ends before its receiver (it never arrived as sent).
fn lost(p: &PacketRecord) -> bool {
    matches!(p.fate, Fate::Dropped(_) | Fate::Corrupted(_))
}

/// The device names of a packet's two ends: `a → b`.
fn ends(trace: &Trace, p: &PacketRecord) -> String {
    let dst = p
        .dst
        .map_or_else(|| p.dst_ip.to_string(), |d| trace.devices[d].name.clone());
    format!("{} \u{2192} {dst}", trace.devices[p.src].name)
}

/// The page for `trace`, headed by `title` and the `lesson` it shows (a scenario's
/// name and description).
pub fn render(trace: &Trace, title: &str, lesson: &str) -> String {
    let entries = trace.entries();
    let states = snapshots(trace);
    let mut rows = String::new();
    let mut steps = String::new();
    let mut jump = String::new();
    let mut near = None;
    for (k, e) in entries.iter().enumerate() {
        let (class, who, what, packet) = match e {
            Entry::Packet(p) => (
                if lost(p) { "packet lost" } else { "packet" },
                ends(trace, p),
                format!(
                    "{}  {} [{}]{}",
                    trace.arrow_label(p),
                    trace.fields(p),
                    p.fate,
                    trace.verdict_text(p)
                ),
                Some(p.index),
            ),
            Entry::Host(n) => (
                "host",
                trace.devices[n.device].name.clone(),
                n.note.to_string(),
                None,
            ),
        };
        if let Some(i) = packet {
            near = Some(i);
        }
        // Every row names the packet at or before it, which the jump list then shows.
        let data = match (packet, near) {
            (Some(i), _) => format!(r#" data-packet="{i}" data-near="{i}""#),
            (None, Some(i)) => format!(r#" data-near="{i}""#),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            rows,
            r#"<li id="row-{k}" data-k="{k}" class="{class}"{data}><span class="t">{}</span> <span class="who">{}</span> {}</li>"#,
            fmt_time(e.at()),
            esc(&who),
            esc(&what)
        );
        if let Some(i) = packet {
            let _ = writeln!(
                jump,
                r#"<option value="{i}">#{i} {} ({})</option>"#,
                esc(&match e {
                    Entry::Packet(p) => trace.arrow_label(p),
                    Entry::Host(_) => String::new(),
                }),
                esc(&who)
            );
        }
        let _ = write!(
            steps,
            r#"<section class="step" id="step-{k}" hidden><h2>Step {} of {}: {}</h2>"#,
            k + 1,
            entries.len(),
            esc(&format!("{who}: {what}"))
        );
        steps += &detail(trace, e);
        steps += r#"<div class="sides">"#;
        for (d, side) in states[k].iter().enumerate() {
            let dev = &trace.devices[d];
            steps += &side_html(&format!("{} ({})", dev.name, dev.ip), side);
        }
        steps += "</div></section>\n";
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title_e}: step through</title>
<script>window.addEventListener("error", function (e) {{ document.documentElement.dataset.error = String(e.message); }});</script>
<style>{STYLE}</style>
</head>
<body data-steps="{n}" data-step="0">
<header><h1>{title_e}</h1><p class="lesson">{lesson_e}</p></header>
<nav id="controls">
<button id="first" title="first step (Home)">|&lt; first</button>
<button id="prev" title="previous step (left arrow)">&lt; previous</button>
<button id="next" title="next step (right arrow)">next &gt;</button>
<button id="last" title="last step (End)">last &gt;|</button>
<span id="where">{where_}</span>
<label>jump to packet <select id="jump">
{jump}</select></label>
</nav>
<main>
<ol id="steps">
{rows}</ol>
<div id="panel">
{steps}</div>
</main>
<script>{SCRIPT}</script>
</body>
</html>
"#,
        title_e = esc(title),
        lesson_e = esc(lesson),
        n = entries.len(),
        where_ = if entries.is_empty() {
            "no packets and no host events"
        } else {
            ""
        },
    )
}

/// The current step's own details: a packet's headers, fate, arrivals, what its
/// receiver did, and its bytes; a host event's text.
fn detail(trace: &Trace, e: &Entry<'_>) -> String {
    let mut s = String::from("<dl>");
    match e {
        Entry::Packet(p) => {
            let arrivals: Vec<String> = p.arrivals.iter().map(|a| fmt_time(*a)).collect();
            let mut field = |k: &str, v: &str| {
                let _ = write!(s, "<dt>{k}</dt><dd>{}</dd>", esc(v));
            };
            field("packet", &format!("#{} {}", p.index, ends(trace, p)));
            field("sent", &fmt_time(p.sent));
            field("headers", &trace.describe(p));
            field("fate", &p.fate.to_string());
            field(
                "arrived",
                &if arrivals.is_empty() {
                    "never (or not by the end)".into()
                } else {
                    arrivals.join(", ")
                },
            );
            if let Some(v) = &p.verdict {
                field("receiver", v);
            }
            s += "</dl>";
            if let Some(b) = &p.bytes {
                s += "<pre>";
                for (i, line) in b.chunks(16).enumerate() {
                    let hex: Vec<String> = line.iter().map(|x| format!("{x:02x}")).collect();
                    let _ = writeln!(s, "{:04x}  {}", i * 16, hex.join(" "));
                }
                s += "</pre>";
            }
        }
        Entry::Host(n) => {
            let _ = write!(
                s,
                "<dt>host event</dt><dd>{}: {}</dd><dt>at</dt><dd>{}</dd></dl>",
                esc(&trace.devices[n.device].name),
                esc(&n.note.to_string()),
                fmt_time(n.at)
            );
        }
    }
    s
}

/// The work requests of a queue, one a line, or "empty".
fn wqes(ws: &[Wqe]) -> String {
    if ws.is_empty() {
        return r#"<span class="none">empty</span>"#.to_string();
    }
    ws.iter()
        .map(|w| esc(&format!("wr_id={} {}", w.wr_id, w.what)))
        .collect::<Vec<_>>()
        .join("<br>")
}

/// One device's QPs (state, send and receive queues), completions and events.
fn side_html(name: &str, side: &SideView) -> String {
    let mut s = format!(r#"<div class="side"><h3>{}</h3>"#, esc(name));
    if side.qps.is_empty() {
        s += r#"<p class="none">no QP seen yet</p>"#;
    } else {
        s += "<table><tr><th>QP</th><th>state</th><th>send queue</th><th>receive queue</th></tr>";
        for q in side.qps.values() {
            let _ = write!(
                s,
                r#"<tr class="qp" data-qpn="{0}"><td>{0:#08x}</td><td class="state">{1}</td><td>{2}</td><td>{3}</td></tr>"#,
                q.qpn,
                q.state.map_or("?".to_string(), |st| st.to_string()),
                wqes(&q.send_queue),
                wqes(&q.recv_queue)
            );
        }
        s += "</table>";
    }
    for (srq, queue) in &side.srqs {
        let _ = write!(s, r#"<h4>SRQ {srq}</h4><p class="srq">{}</p>"#, wqes(queue));
    }
    for (title, list) in [
        ("completions delivered", &side.completions),
        ("async events", &side.events),
    ] {
        let _ = write!(s, "<h4>{title}</h4>");
        if list.is_empty() {
            s += r#"<p class="none">none</p>"#;
        } else {
            s += "<ol>";
            for c in list {
                let _ = write!(s, "<li>{}</li>", esc(c));
            }
            s += "</ol>";
        }
    }
    s += "</div>";
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario;

    #[test]
    fn every_entry_is_a_step_with_its_row_and_every_packet_can_be_jumped_to() {
        let s = scenario::find("cq-overrun").unwrap();
        let out = scenario::run(s, 1);
        let page = render(&out.trace, s.name, s.description);
        let n = out.trace.entries().len();
        assert!(n > 10);
        assert!(page.contains(&format!(r#"data-steps="{n}""#)));
        assert_eq!(page.matches(r#"<section class="step""#).count(), n);
        assert_eq!(page.matches(r#"<li id="row-"#).count(), n);
        assert_eq!(
            page.matches("<option value=").count(),
            out.trace.packets.len()
        );
        // Self-contained: nothing fetched.
        for outside in ["src=", "href=", "http:", "https:", "@import"] {
            assert!(!page.contains(outside), "the page refers to {outside}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let page = render(&Trace::default(), "<a&b>", "\"x\"");
        assert!(page.contains("&lt;a&amp;b&gt;") && page.contains("&quot;x&quot;"));
        assert!(page.contains(r#"data-steps="0""#));
    }
}
