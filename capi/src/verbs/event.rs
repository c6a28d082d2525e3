//! Asynchronous events.
//! (Safety argument: the parent module's.)

use super::*;

/// `ibv_get_async_event`: waits for the next asynchronous event; 0, or -1 with
/// errno (EAGAIN when `async_fd` is non-blocking and nothing is pending). Events of a
/// QP or SRQ destroyed meanwhile are skipped.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
) -> c_int {
    let ctx = ctx_or!(context, {
        set_errno(EINVAL);
        -1
    });
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    let timeout = nonblocking(ctx.vctx.context.async_fd).then_some(Duration::ZERO);
    let ev = loop {
        let ev = match ctx.dev.get_async_event(timeout) {
            Ok(ev) => ev,
            Err(Error::TimedOut) => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            Err(e) => {
                set_errno(e.errno());
                return -1;
            }
        };
        // An event whose QP, SRQ or CQ is not an object of this context is not
        // delivered: one destroyed since the event was raised (the kernel drops an
        // object's pending events when it is destroyed, `ib_uverbs_release_uevent`),
        // or one of another context of the same device, which shares its event queue.
        // Delivered, its element would be a null pointer, which UCX dereferenced
        // (SIGSEGV in uct_ib_handle_async_event, seen once in ucx-rc-put_bw).
        let gone = match ev.element {
            EventElement::Qp(n) => ctx.lookup(Kind::Qp, n).is_none(),
            EventElement::Srq(n) => ctx.lookup(Kind::Srq, n).is_none(),
            EventElement::Cq(n) => ctx.lookup(Kind::Cq, n).is_none(),
            _ => false,
        };
        if !gone {
            break ev;
        }
    };
    let lookup = |kind, k| ctx.lookup(kind, k).unwrap_or(0) as *mut c_void;
    let element = match ev.element {
        EventElement::Cq(n) => sys::ibv_async_event__bindgen_ty_1 {
            cq: lookup(Kind::Cq, n).cast(),
        },
        EventElement::Qp(n) => sys::ibv_async_event__bindgen_ty_1 {
            qp: lookup(Kind::Qp, n).cast(),
        },
        EventElement::Srq(n) => sys::ibv_async_event__bindgen_ty_1 {
            srq: lookup(Kind::Srq, n).cast(),
        },
        EventElement::Port(p) => sys::ibv_async_event__bindgen_ty_1 {
            port_num: c_int::from(p),
        },
        EventElement::Wq(_) | EventElement::Device => {
            sys::ibv_async_event__bindgen_ty_1 { port_num: 0 }
        }
    };
    out!(
        event,
        sys::ibv_async_event {
            element,
            event_type: convert::event_type_to_c(ev.event_type),
        }
    );
    0
}

/// `ibv_ack_async_event`: nothing to release in the emulator.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut sys::ibv_async_event) {}
