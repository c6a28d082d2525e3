//! What the examples and `rdma-emu` do with bad input and failures (shared by the
//! examples that include it and by `rdma-emu`, which includes this file as
//! `cli::checks`): end with one line on stderr and exit status 1, never a panic or an
//! abort, and check every size against what can be allocated and registered before
//! allocating it.
#![allow(dead_code)] // each program uses what it needs

use verbs_api::Device;

/// The program's name as it was started (the file name of `argv[0]`).
fn program() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map_or_else(|| "error".into(), |n| n.to_string_lossy().into_owned())
}

/// Ends the program with `program: msg` on one line of stderr and exit status 1.
pub(crate) fn die(msg: &str) -> ! {
    eprintln!("{}: {msg}", program());
    std::process::exit(1)
}

/// Ends the program with a one-line error naming `what` failed, never a panic.
pub(crate) trait OrDie<T> {
    /// The value, or the end of the program with `what: error`.
    fn or_die(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrDie<T> for Result<T, E> {
    fn or_die(self, what: &str) -> T {
        self.unwrap_or_else(|e| die(&format!("{what}: {e}")))
    }
}

impl<T> OrDie<T> for Option<T> {
    fn or_die(self, what: &str) -> T {
        self.unwrap_or_else(|| die(&format!("{what}: nothing there")))
    }
}

/// The value `v` of option `name`: a number of at least 1, else the end of the
/// program.
pub(crate) fn positive<T: std::str::FromStr + PartialEq + Default>(name: &str, v: String) -> T {
    v.parse()
        .ok()
        .filter(|n| *n != T::default())
        .unwrap_or_else(|| die(&format!("{name} {v}: must be a number, at least 1")))
}

/// Ends the program if it was given any argument: a program that takes none must not
/// ignore one (a mistyped option would otherwise run with the defaults unseen).
pub(crate) fn no_args() {
    if let Some(a) = std::env::args().nth(1) {
        die(&format!("takes no arguments (got {a:?})"));
    }
}

/// The UDP port of the emulated devices: `$EMU_PORT`, else 4791; a value that is not
/// a port (1 to 65535) ends the program.
pub(crate) fn env_port() -> u16 {
    std::env::var("EMU_PORT").map_or(emu_core::nic::ROCE_PORT, |v| positive("EMU_PORT", v))
}

/// The bytes of memory available to this process now (`MemAvailable`), if known.
pub(crate) fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Whether `bytes` of memory, all the buffers `what` needs together, can be allocated
/// now; else an error naming the limit. Call it before allocating any of them: an
/// allocation the system refuses aborts the program.
pub(crate) fn check_memory(what: &str, bytes: u64) -> Result<(), String> {
    match mem_available() {
        Some(avail) if bytes > avail => Err(format!(
            "{what} needs {bytes} bytes of memory, more than is available ({avail} bytes)"
        )),
        _ => Ok(()),
    }
}

/// Whether one memory region of `len` bytes can be registered on `dev` (its
/// `max_mr_size`); else an error naming the limit.
pub(crate) fn check_mr(dev: &dyn Device, what: &str, len: u64) -> Result<(), String> {
    let max = dev
        .query_device()
        .map_err(|e| format!("query_device: {e}"))?
        .max_mr_size;
    if len > max {
        return Err(format!(
            "{what}: a region of {len} bytes is larger than the device's max_mr_size ({max})"
        ));
    }
    Ok(())
}

/// Whether one message of `len` bytes can be sent on port 1 of `dev` (its
/// `max_msg_sz`); else an error naming the limit.
pub(crate) fn check_msg(dev: &dyn Device, what: &str, len: u64) -> Result<(), String> {
    let max = dev
        .query_port(1)
        .map_err(|e| format!("query_port: {e}"))?
        .max_msg_sz;
    if len > u64::from(max) {
        return Err(format!(
            "{what}: a message of {len} bytes is larger than the port's max_msg_sz ({max})"
        ));
    }
    Ok(())
}
