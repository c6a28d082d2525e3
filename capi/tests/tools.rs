//! Runs unmodified C programs on the emulator through this crate's libibverbs.so.1:
//! `ibv_devices`, `ibv_devinfo`, `ibv_rc_pingpong` (server and client as two
//! processes), `c/verbs_test.c`, `c/xrc_test.c` and `c/rdmacm_test.c` compiled against the installed
//! headers, and through librdmacm.so.1 `rping` (rdmacm-utils in PATH, or the directory
//! `RDMACM_UTILS`). Skips, saying so, when cc, ibverbs-utils or libibverbs-dev are missing
//! (`scripts/ci-capi.sh` runs the full tool list and makes them mandatory).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Links libibverbs.so.1 from the static library cargo built for this test into a
/// temporary directory.
fn build_library(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    // `cargo test` builds only the rlib for tests: build the static library (same
    // target directory and profile) so it is current.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "-q",
            "-p",
            env!("CARGO_PKG_NAME"),
            "--lib",
            "--target-dir",
        ])
        .arg(profile_dir.parent().unwrap())
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    assert!(
        build.status().unwrap().success(),
        "building the static library failed"
    );
    let archive = profile_dir.join("librdma_emu_ibverbs.a");
    let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("libibverbs.map");
    let cm_map = Path::new(env!("CARGO_MANIFEST_DIR")).join("librdmacm.map");
    let out = dir.join("libibverbs.so.1");
    let status = Command::new("cc")
        .arg("-shared")
        .arg("-o")
        .arg(&out)
        .arg("-Wl,--whole-archive")
        .arg(&archive)
        .arg("-Wl,--no-whole-archive")
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg(format!("-Wl,--version-script={}", cm_map.display()))
        .args([
            "-Wl,-soname,libibverbs.so.1",
            "-lpthread",
            "-ldl",
            "-lm",
            "-lgcc_s",
            "-lc",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "linking libibverbs.so.1 failed");
    std::os::unix::fs::symlink("libibverbs.so.1", dir.join("libibverbs.so")).unwrap();
    // librdmacm.so.1 is the same file (see build-so.sh).
    std::os::unix::fs::symlink("libibverbs.so.1", dir.join("librdmacm.so.1")).unwrap();
    std::os::unix::fs::symlink("libibverbs.so.1", dir.join("librdmacm.so")).unwrap();
    out
}

fn run(dir: &Path, env: &[(&str, &str)], cmd: &str, args: &[&str]) -> std::process::Child {
    Command::new(cmd)
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn finish(child: std::process::Child, what: &str) -> String {
    let (ok, text) = outcome(child);
    assert!(ok, "{what} failed:\n{text}");
    text
}

/// Whether `child` succeeded, and its output (stdout then stderr, then its exit
/// status if it failed).
fn outcome(child: std::process::Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    let mut text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        text += &format!("({})", out.status);
    }
    (out.status.success(), text)
}

/// Waits until a TCP socket listens on `port` (`/proc/net/tcp`, state 0A), ten
/// seconds at most: a server started just before may still be loading under a busy
/// test run, where a fixed pause let its client find nobody.
fn wait_tcp_listen(port: u16) {
    let want = format!(":{port:04X}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        }) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn stock_binaries_run_on_the_emulator() {
    let missing: Vec<&str> = ["cc", "ibv_devices", "ibv_devinfo", "ibv_rc_pingpong"]
        .into_iter()
        .filter(|c| !have(c))
        .collect();
    if !missing.is_empty() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!(
            "SKIPPED: needs cc, ibverbs-utils and libibverbs-dev (missing: {missing:?}); \
             scripts/ci-capi.sh makes them mandatory"
        );
        return;
    }
    let tmp = std::env::temp_dir().join(format!("capi-tools-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    build_library(&tmp);

    let out = finish(
        run(&tmp, &[("RDMA_EMU_IP", "127.0.0.11")], "ibv_devices", &[]),
        "ibv_devices",
    );
    assert!(out.contains("emu0"), "{out}");
    let out = finish(
        run(
            &tmp,
            &[("RDMA_EMU_IP", "127.0.0.11")],
            "ibv_devinfo",
            &["-v"],
        ),
        "ibv_devinfo",
    );
    assert!(
        out.contains("PORT_ACTIVE") && out.contains("Ethernet"),
        "{out}"
    );

    // Two processes, each with its own address; -e: completion channel events.
    let server = run(
        &tmp,
        &[("RDMA_EMU_IP", "127.0.0.11")],
        "ibv_rc_pingpong",
        &["-g", "0", "-e", "-n", "200", "-p", "18611"],
    );
    wait_tcp_listen(18611);
    let client = run(
        &tmp,
        &[("RDMA_EMU_IP", "127.0.0.12")],
        "ibv_rc_pingpong",
        &["-g", "0", "-e", "-n", "200", "-p", "18611", "127.0.0.11"],
    );
    let c = finish(client, "ibv_rc_pingpong client");
    let s = finish(server, "ibv_rc_pingpong server");
    assert!(
        c.contains("200 iters in") && s.contains("200 iters in"),
        "{c}\n{s}"
    );

    // The C program over every verb the library implements.
    c_program(
        &tmp,
        "verbs_test",
        &["-libverbs"],
        "emu0=127.0.0.13,emu1=127.0.0.14",
        &[],
    );
    // XRC: the inline XRC verbs through verbs_context, initiator and target on two
    // devices.
    c_program(
        &tmp,
        "xrc_test",
        &["-libverbs"],
        "emu0=127.0.0.19,emu1=127.0.0.20",
        &[],
    );
    // The same for librdmacm: a server and a client in one process.
    if Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        c_program(
            &tmp,
            "rdmacm_test",
            &["-lrdmacm", "-libverbs"],
            "emu0=127.0.0.17,emu1=127.0.0.18",
            &["127.0.0.17", "127.0.0.18"],
        );
    } else {
        eprintln!("SKIPPED rdmacm_test.c: needs librdmacm-dev");
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Compiles `c/NAME.c` against the installed headers and our libraries in `tmp`
/// (linking `libs`), runs it with the emulated devices `devices` and `args`, and
/// checks that it reports its checks passed.
fn c_program(tmp: &Path, name: &str, libs: &[&str], devices: &str, args: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("c/{name}.c"));
    let exe = tmp.join(name);
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", tmp.display()))
        .args(libs)
        .status()
        .unwrap();
    assert!(status.success(), "compiling {name}.c failed");
    let out = finish(
        run(
            tmp,
            &[("RDMA_EMU_DEVICES", devices)],
            exe.to_str().unwrap(),
            args,
        ),
        name,
    );
    assert!(
        out.contains(&format!("{name}: ")) && out.contains("checks passed"),
        "{out}"
    );
}

/// rping server and client over the emulator's connection manager.
#[test]
fn rping_connects_through_the_cm() {
    let rping = match std::env::var("RDMACM_UTILS") {
        Ok(d) => Path::new(&d).join("rping").display().to_string(),
        Err(_) => "rping".into(),
    };
    if !have("cc") || !have(&rping) {
        eprintln!("SKIPPED: needs cc and rping (rdmacm-utils, or RDMACM_UTILS=dir)");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("capi-rping-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    build_library(&tmp);
    let mut server = run(
        &tmp,
        &[("RDMA_EMU_IP", "127.0.0.15")],
        &rping,
        &["-s", "-v", "-C", "5", "-a", "127.0.0.15", "-p", "7175"],
    );
    // A client that comes before the server listens finds nobody, as with the
    // kernel's CM: REJECTED (REJ "invalid service ID") once the server's device is
    // open, ADDR_ERROR before. It tries again while the server runs (a busy test run
    // can take the server's start past any fixed pause).
    let mut tries = 0;
    let c = loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let client = run(
            &tmp,
            &[("RDMA_EMU_IP", "127.0.0.16")],
            &rping,
            &["-c", "-v", "-C", "5", "-a", "127.0.0.15", "-p", "7175"],
        );
        let (ok, text) = outcome(client);
        tries += 1;
        let nobody = text.contains("RDMA_CM_EVENT_REJECTED, error 8")
            || text.contains("RDMA_CM_EVENT_ADDR_ERROR");
        if ok || !nobody || tries == 10 || server.try_wait().unwrap().is_some() {
            assert!(ok, "rping client failed (try {tries}):\n{text}");
            break text;
        }
    };
    let s = finish(server, "rping server");
    assert!(c.contains("ping data: rdma-ping-4"), "{c}");
    assert!(s.contains("server ping data: rdma-ping-4"), "{s}");
    assert!(
        !c.contains("rdma-emu") && !s.contains("rdma-emu"),
        "{c}\n{s}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// The exports of the installed (rdma-core) library at `soname`, as "name version"
/// lines, without the IBVERBS_1.0 compat ABI: the entry points rdma-core keeps for
/// binaries linked against libibverbs 1.0 (2006), whose structs predate today's
/// `ibv_context`, are not provided (capi/README.md); a name whose only version is 1.0
/// stays in the list.
fn rdma_core_exports(soname: &str) -> Option<Vec<String>> {
    let out = Command::new("cc")
        .arg(format!("-print-file-name={soname}"))
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if !Path::new(&path).is_absolute() {
        return None;
    }
    let nm = Command::new("nm")
        .args(["-D", "--with-symbol-versions", "--defined-only"])
        .arg(&path)
        .output()
        .ok()?;
    let text = String::from_utf8(nm.stdout).ok()?;
    let mut syms: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, sym) = (f.next()?, f.next()?, f.next()?);
            (kind != "A").then_some(())?;
            let (name, ver) = sym.split_once('@')?;
            Some((name.to_string(), ver.trim_start_matches('@').to_string()))
        })
        .collect();
    let later: std::collections::HashSet<String> = syms
        .iter()
        .filter(|(_, v)| v != "IBVERBS_1.0")
        .map(|(n, _)| n.clone())
        .collect();
    syms.retain(|(n, v)| v != "IBVERBS_1.0" || !later.contains(n));
    Some(syms.into_iter().map(|(n, v)| format!("{n} {v}")).collect())
}

/// Every export of rdma-core's libibverbs.so.1 and librdmacm.so.1 resolves in ours at
/// the same version (as a BIND_NOW binary or bindgen-made bindings bind it), and the
/// exports that differ from verbs.h's inline paths behave as rdma-core's do
/// (`c/exports_test.c`, which calls them through `dlvsym`).
#[test]
fn exports_match_rdma_core() {
    if !have("cc") || !have("nm") || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIPPED: needs cc, nm and libibverbs-dev");
        return;
    }
    let (Some(verbs), Some(cm)) = (
        rdma_core_exports("libibverbs.so.1"),
        rdma_core_exports("librdmacm.so.1"),
    ) else {
        eprintln!("SKIPPED: rdma-core's libibverbs.so.1 / librdmacm.so.1 are not installed");
        return;
    };
    let tmp = std::env::temp_dir().join(format!("capi-exports-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    build_library(&tmp);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/exports_test.c");
    let exe = tmp.join("exports_test");
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(status.success(), "compiling exports_test.c failed");
    let list = [verbs, cm].concat().join("\n");
    let mut child = Command::new(&exe)
        .arg(&tmp)
        .env("RDMA_EMU_DEVICES", "emu0=127.0.0.19")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let out = finish(child, "exports_test");
    assert!(out.contains("checks passed"), "{out}");
    eprintln!("{}", out.trim());
    std::fs::remove_dir_all(&tmp).unwrap();
}
