//! The step-through page in a real browser: headless Chromium loads the page of a
//! scenario, steps it from the first step to the last through its own "next" button
//! (`#play`), and the page it leaves must agree with the text ladder of the same run:
//! the last step shown is the ladder's last line, and each device's QP is in the state
//! of the last transition the ladder shows in that device's column. No script error
//! may occur, and a screenshot of the last step is a picture of the window's size.
//!
//! Skipped (with a printed reason) when no Chromium is installed, unless
//! `REQUIRE_CHROMIUM` is set, as `.ci/run` does. `CHROMIUM` names the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use emu_sims::{html, ladder, scenario};

/// Columns between two lifelines of the text ladder, and the width of its time column
/// (see `emu_sims::ladder`).
const GAP: usize = 48;
const TIME: usize = 11;

fn chromium() -> Option<String> {
    let candidates = match std::env::var("CHROMIUM") {
        Ok(c) => vec![c],
        Err(_) => vec!["chromium".into(), "chromium-browser".into()],
    };
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs headless Chromium on `page` (with its own profile folder `dir`) with `args`;
/// its standard output.
fn run(bin: &str, dir: &Path, page: &Path, hash: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(format!("file://{}{hash}", page.display()))
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of `attr="..."` on the first element that has it.
fn attr<'a>(dom: &'a str, attr: &str) -> Option<&'a str> {
    let at = dom.find(&format!(" {attr}=\""))? + attr.len() + 3;
    Some(&dom[at..at + dom[at..].find('"')?])
}

/// From the text ladder: its last line's text, and per device (by column) the state of
/// the last `QP X -> Y` in its column.
fn from_ladder(text: &str, devices: usize) -> (String, Vec<Option<String>>) {
    let rows: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.contains(" packets: "))
        .collect();
    let last = rows.last().expect("a ladder with rows")[TIME + 2..]
        .replace(['|', '*'], " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut states = vec![None; devices];
    for r in &rows {
        let body = &r[TIME + 2..];
        let (Some(star), Some(arrow)) = (body.find('*'), body.find(" -> ")) else {
            continue;
        };
        if body.contains("QP ") {
            let to = body[arrow + 4..].split_whitespace().next().unwrap();
            states[star / GAP] = Some(to.to_string());
        }
    }
    (last, states)
}

#[test]
fn the_page_steps_to_the_end_and_agrees_with_the_text_ladder() {
    let Some(bin) = chromium() else {
        assert!(
            std::env::var_os("REQUIRE_CHROMIUM").is_none(),
            "REQUIRE_CHROMIUM is set but no chromium is installed"
        );
        println!("skipping: chromium is not installed");
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("emu-sims-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "cq-overrun",
        "lost-read-response",
        "uc-message-lost",
        "qp-error-flush",
    ] {
        let s = scenario::find(name).unwrap();
        let out = scenario::run(s, 1);
        assert_eq!(out.result, Ok(()), "{name}");
        let page = dir.join(format!("{name}.html"));
        std::fs::write(&page, html::render(&out.trace, s.name, s.description)).unwrap();
        let steps = out.trace.entries().len();

        let dom = run(&bin, &dir, &page, "#play", &["--dump-dom"]);
        assert_eq!(attr(&dom, "data-error"), None, "{name}: a script error");
        assert_eq!(attr(&dom, "data-steps"), Some(steps.to_string().as_str()));
        assert_eq!(
            attr(&dom, "data-played"),
            Some(steps.to_string().as_str()),
            "{name}: stepping stopped early"
        );
        // The one section shown is the last step's.
        let shown: Vec<&str> = dom
            .split("<section ")
            .skip(1)
            .filter(|s| !s[..s.find('>').unwrap()].contains("hidden"))
            .collect();
        assert_eq!(shown.len(), 1, "{name}: one step shown");
        let shown = shown[0];
        assert!(shown.starts_with(&format!(r#"class="step" id="step-{}""#, steps - 1)));

        let text = ladder::render(&out.trace);
        let (last, states) = from_ladder(&text, out.trace.devices.len());
        assert!(
            states.iter().any(Option::is_some),
            "{name}: no QP state in the ladder"
        );
        let heading = &shown[shown.find("<h2>").unwrap()..shown.find("</h2>").unwrap()];
        assert!(
            heading.contains(&last.replace('>', "&gt;")),
            "{name}: the last step is {heading:?}, the ladder ends with {last:?}"
        );
        for (d, want) in states.iter().enumerate() {
            let Some(want) = want else { continue };
            let dev = &out.trace.devices[d];
            let side = &shown[shown
                .find(&format!("<h3>{} ({})</h3>", dev.name, dev.ip))
                .unwrap_or_else(|| panic!("{name}: no panel for {}", dev.name))..];
            let cell = r#"<td class="state">"#;
            let at = side.find(cell).unwrap() + cell.len();
            let got = &side[at..at + side[at..].find('<').unwrap()];
            assert_eq!(got, want, "{name}: {}'s QP state", dev.name);
        }

        // A screenshot of the last step: a PNG of the window's size, not blank.
        let shot = dir.join(format!("{name}.png"));
        run(
            &bin,
            &dir,
            &page,
            "#end",
            &[
                "--window-size=1200,800",
                &format!("--screenshot={}", shot.display()),
            ],
        );
        let png = std::fs::read(&shot).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}: not a PNG");
        let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        assert_eq!((size(16), size(20)), (1200, 800), "{name}: screenshot size");
        assert!(png.len() > 20_000, "{name}: a blank screenshot");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
