//! Asks the Linux scheduler for a short time slice for the calling thread.
//!
//! Since Linux 6.12 the fair scheduler (EEVDF) takes a slice length from a task:
//! `sched_setattr(2)` with policy `SCHED_OTHER` (or `SCHED_BATCH`) and `sched_runtime`
//! set (clamped to 0.1-100 ms), no privilege needed. A task with a shorter slice than
//! the running one preempts it when it wakes (the scheduler's `PREEMPT_SHORT`); with
//! the default slice, a woken thread waits until the running thread's slice ends.
//! rdma-emu's device threads ask for the shortest while a program waits on them: they
//! sleep until a packet comes and then work for microseconds, often on a host whose
//! cores a program's threads spin on (perftest's `ib_write_lat` spins on memory for the
//! peer's RDMA WRITE, which only the device thread can place there); [`reset`] gives a
//! thread the default again. The thread's policy and nice value are kept: the
//! request reads the thread's attributes first and changes only the slice, and leaves a
//! thread of another policy (real time, deadline, idle) alone. Older kernels refuse the
//! request or ignore it; the thread then runs as before.
//!
//! This crate's one `unsafe` is the two system calls (see [`request`]).

#![deny(unsafe_code)]

use std::io;
use std::time::Duration;

/// The shortest slice the kernel grants (it raises a shorter `sched_runtime` to this).
pub const SHORTEST: Duration = Duration::from_micros(100);

/// `struct sched_attr` as the kernel first defined it (`SCHED_ATTR_SIZE_VER0`, 48
/// bytes); later kernels take this size and treat the fields added since as absent.
#[repr(C)]
#[derive(Default, Debug)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;
const _: () = assert!(SIZE == 48);

/// The fair scheduler's two policies (`sched.h`).
const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// The calling thread's scheduling attributes (`sched_getattr(2)`).
#[allow(unsafe_code)]
fn get() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `SIZE` bytes (its third argument) into
    // `attr`, a live, writable, properly aligned `repr(C)` value of exactly that size
    // whose every bit pattern is valid (integers only); it keeps no pointer past the
    // call. pid 0 is the calling thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            SIZE,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Sets the calling thread's scheduling attributes (`sched_setattr(2)`).
#[allow(unsafe_code)]
fn set(attr: &SchedAttr) -> io::Result<()> {
    // SAFETY: the kernel reads `attr.size` (48) bytes from `attr`, a live, properly
    // aligned `repr(C)` value of that size, and keeps no pointer past the call. pid 0
    // is the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for `slice` (at least [`SHORTEST`]) as the calling thread's time slice,
/// keeping its policy and nice value. `Ok(false)`: the thread's policy is not a fair
/// one, and it is left alone. An error is the kernel's refusal (a kernel before the
/// fair scheduler took slices may also accept and ignore it: see [`slice()`]).
pub fn request(slice: Duration) -> io::Result<bool> {
    set_runtime(u64::try_from(slice.max(SHORTEST).as_nanos()).unwrap_or(u64::MAX))
}

/// Gives the calling thread the kernel's default slice again (`sched_runtime` 0: the
/// slice the thread had before any [`request`]), keeping its policy and nice value.
/// `Ok(false)`: the thread's policy is not a fair one, and it is left alone.
pub fn reset() -> io::Result<bool> {
    set_runtime(0)
}

/// Sets `sched_runtime` (the slice; 0 for the default) of a fair-policy thread,
/// keeping the rest; `Ok(false)` for a thread of another policy, left alone.
fn set_runtime(runtime: u64) -> io::Result<bool> {
    let mut attr = get()?;
    if attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH {
        return Ok(false);
    }
    attr.size = SIZE;
    attr.sched_flags = 0;
    attr.sched_priority = 0;
    attr.sched_runtime = runtime;
    attr.sched_deadline = 0;
    attr.sched_period = 0;
    set(&attr)?;
    Ok(true)
}

/// The calling thread's slice as the kernel reports it: `None` where it reports none
/// (a kernel before slices were taken from tasks, or a policy without them).
pub fn slice() -> io::Result<Option<Duration>> {
    let attr = get()?;
    Ok((attr.sched_runtime != 0).then(|| Duration::from_nanos(attr.sched_runtime)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of the calling thread (`sched_getattr`).
    fn nice() -> i32 {
        get().unwrap().sched_nice
    }

    /// Sets the calling thread's attributes to what `f` makes of the present ones.
    fn change(f: impl FnOnce(&mut SchedAttr)) {
        let mut attr = get().unwrap();
        attr.size = SIZE;
        f(&mut attr);
        set(&attr).unwrap();
    }

    #[test]
    fn the_slice_is_what_was_asked_where_the_kernel_reports_one() {
        std::thread::spawn(|| {
            assert!(request(SHORTEST).unwrap());
            if let Some(s) = slice().unwrap() {
                assert_eq!(s, SHORTEST);
            }
            // Below the shortest, the shortest is asked for.
            assert!(request(Duration::from_micros(1)).unwrap());
            if let Some(s) = slice().unwrap() {
                assert_eq!(s, SHORTEST);
            }
            assert!(request(Duration::from_millis(2)).unwrap());
            if let Some(s) = slice().unwrap() {
                assert_eq!(s, Duration::from_millis(2));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_reset_gives_back_the_default_slice() {
        std::thread::spawn(|| {
            // A thread that asked for nothing has the default (some kernels report
            // it, others report none).
            let before = slice().unwrap();
            assert!(request(SHORTEST).unwrap());
            let asked = slice().unwrap();
            assert!(reset().unwrap());
            // Where the kernel reports slices, the request showed, and the reset
            // undid it.
            assert_eq!(slice().unwrap(), before);
            if asked.is_some() {
                assert_eq!(asked, Some(SHORTEST));
            }
            assert_eq!(get().unwrap().sched_policy, SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_nice_value_and_policy_are_kept() {
        std::thread::spawn(|| {
            // Raising one's own nice value needs no privilege.
            change(|a| a.sched_nice = 5);
            assert_eq!(nice(), 5);
            assert!(request(SHORTEST).unwrap());
            assert_eq!(nice(), 5);
            assert_eq!(get().unwrap().sched_policy, SCHED_OTHER);
            // A batch thread stays a batch thread.
            change(|a| a.sched_policy = SCHED_BATCH);
            assert!(request(SHORTEST).unwrap());
            assert_eq!(get().unwrap().sched_policy, SCHED_BATCH);
            assert_eq!(nice(), 5);
            assert!(reset().unwrap());
            assert_eq!(get().unwrap().sched_policy, SCHED_BATCH);
            assert_eq!(nice(), 5);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_idle_policy_thread_is_left_alone() {
        std::thread::spawn(|| {
            change(|a| {
                a.sched_policy = 5; // SCHED_IDLE
                a.sched_runtime = 0;
            });
            assert!(!request(SHORTEST).unwrap());
            assert!(!reset().unwrap());
            assert_eq!(get().unwrap().sched_policy, 5);
        })
        .join()
        .unwrap();
    }
}
