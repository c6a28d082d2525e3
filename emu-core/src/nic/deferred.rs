//! The device a thread last left packets in. While the application polls, a post on
//! UDP leaves its last partial run for its device's next poll, and a poll the ACKs
//! its packets make (`Inner::may_defer`). A thread that drives two devices, posting
//! on one and polling the other (a unit test with two emulated NICs in one thread),
//! would then get each message, or the ACK of it, only when that device's thread
//! ended its nap, a few hundred microseconds later: a poll or a wait of another
//! device from the same thread sends them first.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::Inner;

thread_local! {
    static LEFT_IN: RefCell<Option<Weak<Inner>>> = const { RefCell::new(None) };
}

/// Notes that a call from this thread left packets in `dev`.
pub(super) fn left_in(dev: &Arc<Inner>) {
    LEFT_IN.with(|l| {
        let mut l = l.borrow_mut();
        if !l
            .as_ref()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(dev)))
        {
            *l = Some(Arc::downgrade(dev));
        }
    });
}

/// Before this thread polls or waits on `dev`: sends what its last post left in
/// another device (that device's own poll would have sent it).
pub(super) fn send_elsewhere(dev: &Inner) {
    let other = LEFT_IN.with(|l| {
        let mut l = l.borrow_mut();
        if l.as_ref().is_none_or(|w| std::ptr::eq(w.as_ptr(), dev)) {
            return None;
        }
        l.take()
    });
    if let Some(d) = other.and_then(|w| w.upgrade()) {
        d.flush_pending();
    }
}
