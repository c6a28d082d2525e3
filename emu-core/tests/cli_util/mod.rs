//! Running the project's programs as a user would, for the bad-arguments tests of
//! emu-core's examples and of `rdma-emu` (rdma-emu includes this file): each run has a time
//! limit, and a failure must be one line on stderr with a non-zero exit status.

#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A program started with its stdout and stderr going to files.
pub struct Running {
    pub child: Child,
    what: String,
    out: PathBuf,
    err: PathBuf,
}

/// How a program ended.
pub struct Ended {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

fn temp(kind: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "emu-bad-args-{}-{}.{kind}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Starts `cmd` (with no backtrace asked for, as a user's shell has it).
pub fn start(mut cmd: Command) -> Running {
    let what = format!("{cmd:?}");
    let (out, err) = (temp("out"), temp("err"));
    let child = cmd
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    Running {
        child,
        what,
        out,
        err,
    }
}

impl Running {
    /// What the program has written to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits until stdout contains `text`; panics after `limit` or if the program
    /// ended first.
    pub fn wait_for_stdout(&mut self, text: &str, limit: Duration) {
        let end = Instant::now() + limit;
        while !self.stdout().contains(text) {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!(
                    "{} ended ({st}) before printing {text:?}: {}",
                    self.what,
                    std::fs::read_to_string(&self.err).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < end,
                "{} did not print {text:?} within {limit:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the program to end; kills it and panics after `limit`.
    pub fn wait(mut self, limit: Duration) -> Ended {
        let end = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still ran after {limit:?} (killed); stderr: {}",
                    self.what,
                    std::fs::read_to_string(&self.err).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ended {
            what: self.what.clone(),
            status,
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
        }
    }
}

/// A program the test let go of (a killed victim, or one a failed assertion left
/// running) is ended and reaped, and its output files are removed: nothing is left in
/// the temporary directory or the process table.
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

/// Runs `cmd` to its end, within `limit`.
pub fn run(cmd: Command, limit: Duration) -> Ended {
    start(cmd).wait(limit)
}

/// What a program that refuses its input must do: exit non-zero, by an exit (not a
/// signal such as an abort's), with exactly one line on stderr, and no panic or
/// allocation failure.
pub fn assert_one_line_error(e: &Ended) {
    let err = e.stderr.trim_end();
    let lines = err.lines().count();
    assert!(
        e.status.code().is_some_and(|c| c != 0),
        "{}: exit status {} (want a non-zero exit code)\nstderr:\n{err}",
        e.what,
        e.status
    );
    assert_eq!(
        lines, 1,
        "{}: {lines} lines on stderr (want one):\n{err}",
        e.what
    );
    for bad in [
        "panicked",
        "RUST_BACKTRACE",
        "memory allocation",
        "stack backtrace",
    ] {
        assert!(!err.contains(bad), "{}: stderr says {bad:?}: {err}", e.what);
    }
}

/// A UDP port free on `ip` now (the system picks it).
pub fn free_udp_port(ip: Ipv4Addr) -> u16 {
    UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP port free on every address now (the system picks it).
pub fn free_tcp_port() -> u16 {
    TcpListener::bind(("0.0.0.0", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
