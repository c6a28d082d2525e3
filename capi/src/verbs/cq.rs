//! Completion channels and completion queues: create, poll, notify, events.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_create_comp_channel`: its fd is readable while an event is pending.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    let ctx = ctx_or!(context, null(EINVAL));
    let made = ctx
        .dev
        .create_comp_channel()
        .and_then(|id| Ok((id, ctx.dev.comp_channel_fd(id)?)));
    match made {
        Ok((id, fd)) => into_ptr(Channel {
            raw: sys::ibv_comp_channel {
                context,
                fd,
                refcnt: 0,
            },
            id,
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut sys::ibv_comp_channel) -> c_int {
    let ch = obj_or!(Channel, channel, EINVAL);
    let ctx = ctx_or!(ch.raw.context, EINVAL);
    match ctx.dev.destroy_comp_channel(ch.id) {
        // SAFETY: made by ibv_create_comp_channel; destroyed once.
        Ok(()) => unsafe {
            free::<_, Channel>(channel);
            0
        },
        Err(e) => fail(&e),
    }
}

/// Makes a CQ object for a created device CQ and records it in the context.
pub(crate) fn new_cq(
    ctx: &Context,
    id: verbs_api::CqId,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
) -> *mut sys::ibv_cq_ex {
    let mut raw = sys::ibv_cq_ex {
        context: ctx.as_ptr(),
        channel,
        cq_context,
        handle: id.0,
        cqe,
        ..Default::default()
    };
    crate::cq_ex::install(&mut raw);
    let p = into_ptr::<sys::ibv_cq_ex, Cq>(Cq {
        raw,
        id,
        polled: Mutex::default(),
    });
    ctx.record(Kind::Cq, id.0, p);
    p
}

/// The channel behind a `ibv_comp_channel` pointer (None for null).
pub(crate) unsafe fn channel_id(
    channel: *mut sys::ibv_comp_channel,
) -> Result<Option<ChannelId>, c_int> {
    if channel.is_null() {
        return Ok(None);
    }
    Ok(Some(obj_or!(Channel, channel, Err(EINVAL)).id))
}

/// `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut sys::ibv_cq {
    let ctx = ctx_or!(context, null(EINVAL));
    // SAFETY: module safety argument.
    let ch = match unsafe { channel_id(channel) } {
        Ok(c) => c,
        Err(e) => return null(e),
    };
    let Ok(n) = u32::try_from(cqe) else {
        return null(EINVAL);
    };
    // A negative vector becomes one past any the device has: EINVAL from the device.
    match ctx.dev.create_cq_with_vector(n, ch, comp_vector as u32) {
        Ok(id) => new_cq(ctx, id, cqe, cq_context, channel).cast(),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it; ENOENT for a CQ whose handle or
/// context is not one of this process's.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    let (c, ctx) = live_or!(Cq, cq, |e| e);
    match ctx.dev.destroy_cq(c.id) {
        Ok(()) => {
            ctx.forget(Kind::Cq, c.id.0);
            // SAFETY: made by ibv_create_cq; destroyed once (it left the table).
            unsafe { free::<_, Cq>(cq) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_resize_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut sys::ibv_cq, cqe: c_int) -> c_int {
    let (c, ctx) = live_or!(Cq, cq, |_e| EINVAL);
    let Ok(n) = u32::try_from(cqe) else {
        return EINVAL;
    };
    match ctx.dev.resize_cq(c.id, n) {
        Ok(()) => {
            // SAFETY: the program's CQ object; `cqe` is the field it reads back.
            unsafe { (*cq).cqe = cqe };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_get_cq_event`: waits for a completion event on the channel; 0, or -1 with
/// errno (EAGAIN on a non-blocking channel with nothing pending).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let ch = obj_or!(Channel, channel, {
        set_errno(EINVAL);
        -1
    });
    let ctx = ctx_or!(ch.raw.context, {
        set_errno(EINVAL);
        -1
    });
    let timeout = nonblocking(ch.raw.fd).then_some(Duration::ZERO);
    let got = loop {
        match ctx.dev.get_cq_event(ch.id, timeout) {
            Err(e) if e.errno() == libc::EINTR && !a_handler_interrupts() => continue,
            got => break got,
        }
    };
    match got {
        Ok(id) => {
            let Some(p) = ctx.lookup(Kind::Cq, id.0) else {
                set_errno(libc::EIO);
                return -1;
            };
            let p = p as *mut sys::ibv_cq;
            out!(cq, p);
            // SAFETY: a live CQ of this context (it is in the table).
            out!(cq_context, (*p).cq_context);
            0
        }
        Err(Error::TimedOut) => {
            set_errno(libc::EAGAIN);
            -1
        }
        Err(e) => {
            set_errno(e.errno());
            -1
        }
    }
}

/// Whether a signal handler may have ended a blocking read(2) with `EINTR`: true if
/// some signal has a handler installed without `SA_RESTART` (signal(7): a read of a
/// descriptor that blocks is restarted after a handler with it). The emulator's wait
/// is a poll(2), which any handler ends, and the signal that ran is not known; a
/// program that installed a handler without `SA_RESTART` (qperf's `SIGALRM`, which
/// ends its timed tests) counts on being interrupted, and one that did not must never
/// see `EINTR` from libibverbs. The signals a faulting instruction raises do not
/// count: they cannot arrive during a system call (Rust's runtime handles SIGSEGV and
/// SIGBUS without `SA_RESTART`, for its stack overflow report).
fn a_handler_interrupts() -> bool {
    const FAULTS: [c_int; 5] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
    ];
    (1..=libc::SIGRTMAX())
        .filter(|s| !FAULTS.contains(s))
        .any(|sig| {
            let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
            // SAFETY: a query only (no new action); `old` is a valid out pointer.
            if unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) } != 0 {
                return false;
            }
            // SAFETY: sigaction succeeded and filled it (zeroed before in any case).
            let old = unsafe { old.assume_init() };
            old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_flags & libc::SA_RESTART == 0
        })
}

/// `ibv_ack_cq_events`: counted in the CQ, as rdma-core does.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, nevents: c_uint) {
    // SAFETY: module safety argument.
    if let Some(c) = unsafe { from_ptr::<_, Cq>(cq) } {
        let _guard = c.polled.lock();
        // SAFETY: the program's CQ object; the counter is written under the CQ's lock.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}

pub(super) unsafe extern "C" fn op_poll_cq(
    cq: *mut sys::ibv_cq,
    num_entries: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    thread_local! {
        static BUF: RefCell<Vec<WorkCompletion>> = const { RefCell::new(Vec::new()) };
    }
    let c = obj_or!(Cq, cq, -1);
    let ctx = ctx_fast!(c.raw.context, -1);
    let Ok(max) = usize::try_from(num_entries) else {
        return -1;
    };
    if wc.is_null() && max > 0 {
        return -1;
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        match ctx.dev.poll_cq(c.id, max, buf) {
            // No sched_yield on an empty poll: the poll itself receives what waits on
            // the socket, and the device thread (timers) is woken by the kernel. On a
            // loaded host a yield hands the core to every other runnable task for a
            // slice, which made a spinning program's own progress (and its peer's
            // retries) wait on them (docs/performance.md).
            Ok(0) => 0,
            Ok(n) => {
                for (i, w) in buf.iter().take(n).enumerate() {
                    // SAFETY: the caller's array has num_entries entries; n <= max.
                    unsafe { wc.add(i).write(convert::wc_to_c(w)) };
                }
                n as c_int
            }
            Err(e) => {
                set_errno(e.errno());
                -1
            }
        }
    })
}

pub(super) unsafe extern "C" fn op_req_notify_cq(
    cq: *mut sys::ibv_cq,
    solicited_only: c_int,
) -> c_int {
    let (c, ctx) = live_or!(Cq, cq, |_e| EINVAL);
    status(ctx.dev.req_notify_cq(c.id, solicited_only != 0))
}
