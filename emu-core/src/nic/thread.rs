//! The device thread's schedule: when it blocks on the socket, when it spins, and
//! when it naps and leaves the socket to an application that polls (run to
//! completion), and the timers it keeps meanwhile.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::link::Receiver;
use super::slice::Slice;
use super::{Core, Inbound, Inner};

/// The longest the device thread sleeps before looking at the engine's timers again.
const MAX_SLEEP: Duration = Duration::from_millis(1);
/// The device thread's nap while the application polls, on a link where a post may
/// leave packets for a later send (UDP with GSO, see `Inner::may_defer`): the longest
/// such a post waits if the application stops polling.
const NAP: Duration = Duration::from_micros(200);
/// The nap where no post leaves packets (the shared-memory link): only the timers,
/// and noticing that the application stopped polling, need the thread. Each wake-up
/// takes a core from the spinning application on a host with none spare (a context
/// switch in its round trip), so the fewer the better. Back to [`NAP`] while the
/// application leaves packets in the link (see [`Inner::left_on_socket`]): the first
/// of them after each hold waits for the nap's end.
const LONG_NAP: Duration = Duration::from_millis(1);
/// How long without a poll before the device thread takes the socket back (counted in
/// naps, at least one): one [`NAP`] in the default mode, 2 ms in busy-poll mode.
const IDLE: Duration = NAP;
const IDLE_BUSY: Duration = Duration::from_millis(2);
/// How long the device thread, while it holds the socket, keeps looking for datagrams
/// after the last one before it sleeps (unless a CQ is armed: then the application
/// waits for an event and needs the core). A streaming peer's sends then do not pay
/// this thread's wake-up (a third of a WRITE sender's time when it did).
const SPIN: Duration = Duration::from_micros(20);
/// [`SPIN`] in busy-poll mode.
const SPIN_BUSY: Duration = Duration::from_micros(50);
/// How long the polls and posts must stop, with a datagram waiting after a nap and
/// no verb call running, before the device thread concludes the application polls
/// for something else (see [`Inner::left_on_socket`]); a polling application polls
/// again within microseconds, unless the host descheduled it.
const STALL: Duration = Duration::from_micros(50);
/// How long the device thread then keeps the socket, though the application polls,
/// before it tries napping again.
const HOLD: Duration = Duration::from_millis(20);

/// An application thread inside `poll_cq` or a post ([`Inner::at_verbs`]).
pub(super) struct AtVerbs<'a>(&'a AtomicU32);

impl Drop for AtVerbs<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Inner {
    /// The device thread: waits for datagrams or the next timer, then receives a batch.
    /// Receive buffers are allocated once: no heap allocation per packet.
    ///
    /// While the application polls (its `poll_cq` receives inline), the thread naps
    /// instead of blocking on the socket, which would wake it for every datagram the
    /// application takes itself (a context switch per packet); it takes the socket
    /// back after [`IDLE`] without a poll ([`IDLE_BUSY`] in busy-poll mode), and at
    /// once while a CQ is armed: an application that waits on a
    /// completion channel polls only after its event, so the thread must receive
    /// what makes it (`req_notify_cq` wakes it from a nap); QP1's CQ, which the CM
    /// agent keeps armed, does not count (`Engine::cq_armed`). Holding the socket, it
    /// looks again for [`SPIN`] ([`SPIN_BUSY`] in busy-poll mode) after each datagram
    /// before it sleeps. An application that polls but waits for something no poll
    /// brings (see [`Inner::left_on_socket`]) gets the socket taken back for [`HOLD`].
    ///
    /// Everything it does on the link is a [`Link`](super::Link) call: heartbeats
    /// (`beat`), waits (`wait_readable`, `pending`) and receives (`receive`, a
    /// [`Receiver::Thread`]).
    pub(super) fn run(&self) {
        let mut slice = Slice::start();
        let _ = self.thread.set(std::thread::current());
        let link = &*self.link;
        let idle = if self.cfg.busy_poll { IDLE_BUSY } else { IDLE };
        let mut seen = self.polls.load(Ordering::Relaxed);
        let mut seen_waits = self.waits.load(Ordering::Relaxed);
        let mut idle_naps = u32::MAX;
        // The last nap ended with packets the application left in the link.
        let mut left = false;
        let spin = if self.cfg.busy_poll { SPIN_BUSY } else { SPIN };
        let mut last_rx: Option<Instant> = None;
        // Half or more of the last receive had a wrong ICRC: junk keeps coming.
        let mut flooded = false;
        let mut skipped = false;
        let mut hold_until: Option<Instant> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            self.watch(now);
            link.beat(now);
            let (sleep, armed) = {
                let core = self.core.lock();
                let now = Instant::now();
                let sleep = core.engine.poll_timeout().map_or(MAX_SLEEP, |t| {
                    t.saturating_duration_since(now).min(MAX_SLEEP)
                });
                (sleep, core.engine.cq_armed())
            };
            let polls = self.polls.load(Ordering::Relaxed);
            // A poll that outlasts a nap is polling too.
            if polls != seen || self.in_verbs.load(Ordering::Relaxed) > 0 {
                seen = polls;
                idle_naps = 0;
            } else {
                idle_naps = idle_naps.saturating_add(1);
            }
            // A thread waits for its event receiving, or did within the last nap (it
            // arms, polls once and waits again for each message).
            let waits = self.waits.load(Ordering::Relaxed);
            let waiting = self.waiters.load(Ordering::Acquire) > 0 || waits != seen_waits;
            seen_waits = waits;
            self.waiter_mode.store(waiting, Ordering::Release);
            let holding = hold_until.is_some_and(|t| now < t);
            let nap = if left || link.max_segments() > 1 {
                NAP
            } else {
                LONG_NAP
            };
            let idle_limit = idle.as_micros().div_ceil(nap.as_micros()).max(1) as u32;
            if (idle_naps < idle_limit && !armed && !holding) || waiting {
                // The application takes the datagrams; only keep time.
                self.napping.store(true, Ordering::Release);
                // A timer the application arms meanwhile, due sooner, unparks it
                // (`unlock_waking`).
                let nap = sleep.min(nap);
                self.nap_until
                    .store(self.nanos_since_born(now + nap), Ordering::SeqCst);
                std::thread::park_timeout(nap);
                self.nap_until.store(u64::MAX, Ordering::SeqCst);
                self.link_counters.naps.fetch_add(1, Ordering::Relaxed);
                // Fire due timers and send what a deferred post left, but leave the
                // socket to the application: receiving here would race its inline
                // receive for the socket and, preempted with the receive lock held,
                // stall a spinning poller for a time slice. The top of the loop takes
                // the socket back once the naps go on without polls.
                // Nor wait for the engine while the application is in it: with many
                // QPs it holds the lock most of the time, and this thread spinning
                // for it took a sixth of the application's core (10,000 QPs). Skipped
                // at most once in a row, so a timer fires at most a nap late.
                let core = if skipped {
                    Some(self.core.lock())
                } else {
                    self.core.try_lock()
                };
                skipped = core.is_none();
                if let Some(core) = core {
                    self.keep_time_locked(core);
                }
                if !waiting {
                    left = self.left_on_socket();
                }
                if left && !waiting {
                    hold_until = Some(Instant::now() + HOLD);
                    self.link_counters
                        .socket_holds
                        .fetch_add(1, Ordering::Relaxed);
                }
                continue;
            } else {
                // Posts stop deferring before this thread blocks; one that deferred
                // just before is sent here first.
                self.napping.store(false, Ordering::Release);
                self.flush_pending();
                // Not while it holds the socket for an application that spins: a yield
                // hands the core to that spinner for its whole time slice, while a
                // thread that sleeps on the socket is woken ahead of it.
                let spinning = !armed && !holding && last_rx.is_some_and(|t| t.elapsed() < spin);
                if flooded {
                    // Take the next batch at once. Yielding here handed the core to
                    // any thread sharing it, for its whole time slice: a junk sender
                    // on the same core then filled the socket while this thread got a
                    // twentieth of the core (`rdma-emu bench flood`). Between batches
                    // of real traffic it still yields: the application's thread on
                    // this core makes that traffic (10,000 QPs lost a fifth without).
                } else if spinning {
                    // Traffic within SPIN: look again instead of sleeping, so the
                    // sender does not pay this thread's wake-up (yielding to any
                    // thread that waits for this core).
                    std::thread::yield_now();
                } else if !link.pending() {
                    let _ = link.wait_readable(None, Some(sleep));
                }
            }
            let junk_before = self.link_counters.icrc_errors.load(Ordering::Relaxed);
            let got = link.receive(&Inbound(self), Receiver::Thread);
            let junk = self.link_counters.icrc_errors.load(Ordering::Relaxed) - junk_before;
            flooded = got > 0 && 2 * junk >= got as u64;
            if got > 0 {
                slice.received(got);
                last_rx = Some(Instant::now());
                self.link_counters
                    .thread_datagrams
                    .fetch_add(got as u64, Ordering::Relaxed);
            }
            if got == 0 {
                self.keep_time();
            }
        }
    }

    /// Whether the application, though it polls, leaves datagrams on the socket: one
    /// waits after a nap, no poll nor post comes for [`STALL`] and none is running
    /// (the thread sleeps meanwhile, leaving the cores to the application). So does a
    /// program that polls its CQ for its own completions and then spins on memory for
    /// the peer's RDMA WRITE, which makes no completion at the responder (perftest's
    /// `ib_write_lat`): only this thread can receive that WRITE, and a nap per message
    /// made each half round trip a nap long. Not so a poller that was waiting for a
    /// core meanwhile ([`waited_for_a_core`]): it polls again once it runs.
    fn left_on_socket(&self) -> bool {
        if !self.link.pending()
            && !self
                .link
                .wait_readable(None, Some(Duration::ZERO))
                .unwrap_or(false)
        {
            return false;
        }
        let polls = self.polls.load(Ordering::Relaxed);
        let posts = self.posts.load(Ordering::Relaxed);
        // A poll, or a post (a sender with many QPs posts for longer than STALL
        // between its polls), or one of them still running (a poll that hands the
        // engine thousands of ACKs), says the application is at its verbs and will
        // poll.
        let busy = || {
            self.polls.load(Ordering::Relaxed) != polls
                || self.posts.load(Ordering::Relaxed) != posts
                || self.in_verbs.load(Ordering::Relaxed) > 0
        };
        // Asleep meanwhile: on a host with no more cores than busy threads, this
        // thread looking (even with yields) took the core the application needed for
        // the poll it waited for (10,000 QPs lost up to half to holds so begun).
        let tid = self.poller_tid.load(Ordering::Relaxed);
        let before = poller_state(tid);
        let deadline = Instant::now() + STALL;
        while !busy() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return !waited_for_a_core(before, poller_state(tid), STALL);
            }
            std::thread::park_timeout(left);
        }
        false
    }

    /// Counts a call of the application's into `count` (`polls` or `posts`) and, until
    /// the guard is dropped, into `in_verbs` (see [`Inner::left_on_socket`]).
    pub(super) fn at_verbs<'a>(&'a self, count: &AtomicU64) -> AtVerbs<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        self.poller_tid.store(own_tid(), Ordering::Relaxed);
        self.in_verbs.fetch_add(1, Ordering::Relaxed);
        AtVerbs(&self.in_verbs)
    }

    /// `at` in nanoseconds since the device was made (saturating; without the 128-bit
    /// arithmetic of `Duration::as_nanos`, as every verbs call asks).
    fn nanos_since_born(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.born);
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    }

    /// Ends an application's call that may have armed a timer (a receive, a post):
    /// releases the engine's lock and wakes a napping device thread whose nap ends
    /// after the engine's next timer, so that the timer fires on time rather than at
    /// the nap's end (a nap is longer than some timers on the shared-memory link).
    /// Best effort: a timer armed between the thread's look at the timers and the
    /// start of its nap fires at the nap's end, as every timer armed during a nap did
    /// before.
    pub(super) fn unlock_waking(&self, core: MutexGuard<'_, Core>) {
        let next = core.engine.poll_timeout();
        drop(core);
        let until = self.nap_until.load(Ordering::SeqCst);
        if until == u64::MAX {
            return;
        }
        if wakes_for(until, next.map(|t| self.nanos_since_born(t))) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Fires the engine's due timers and sends what they (or a deferred post) left.
    pub(super) fn keep_time(&self) {
        self.keep_time_locked(self.core.lock());
    }

    /// [`Inner::keep_time`] with the engine's lock taken.
    pub(super) fn keep_time_locked(&self, mut core: MutexGuard<'_, Core>) {
        let now = Instant::now();
        core.engine.handle_timeout(now);
        self.flush(&mut core, now, false);
    }
}

/// Whether a device thread napping until `until` (nanoseconds since the device was
/// made; `u64::MAX`: not napping) must be woken for the engine's next timer, due at
/// `next` (`None`: no timer armed): when the timer is due before the nap ends.
fn wakes_for(until: u64, next: Option<u64>) -> bool {
    until != u64::MAX && next.is_some_and(|t| t < until)
}

/// Whether a poller seen as `before` and then `after` ([`poller_state`]) across a
/// wait of `wait` was waiting for a core rather than busy elsewhere: runnable at the
/// end (state `R`) and run for less than half the wait. A program that spins on
/// memory for a WRITE (`ib_write_lat`) runs all along; one asleep in another call is
/// not runnable; one that polls but was preempted, or yielded to a busy core, ran
/// little (`rdma-emu bench flood`: a device thread that took the socket from such a
/// program made each half round trip wait for its wake-up, 2-3x the quiet latency).
fn waited_for_a_core(
    before: Option<(char, u64)>,
    after: Option<(char, u64)>,
    wait: Duration,
) -> bool {
    match (before, after) {
        (Some((_, ran0)), Some(('R', ran1))) => {
            ran1.saturating_sub(ran0) < u64::try_from(wait.as_nanos() / 2).unwrap_or(u64::MAX)
        }
        _ => false,
    }
}

/// The calling thread's id, read once per thread.
fn own_tid() -> u32 {
    thread_local! {
        static TID: u32 = u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0);
    }
    TID.with(|t| *t)
}

/// Thread `tid`'s (of this process) scheduler state letter (`/proc/self/task/TID/stat`
/// field 3) and the CPU time it has had, in nanoseconds; `None` when unknown. The time
/// is the thread's CPU clock (`clock_gettime` on its thread CPU-time clock id, as
/// `pthread_getcpuclockid` makes it), which counts a running thread's current slice
/// too, where `schedstat` lags up to a tick.
fn poller_state(tid: u32) -> Option<(char, u64)> {
    let raw = i32::try_from(tid).ok().filter(|&t| t > 0)?;
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let state = stat.rsplit_once(") ")?.1.chars().next()?;
    // Linux's clock id of a thread's CPU time: the complement of its id shifted left
    // by three, with the per-thread (4) and scheduler-clock (2) bits.
    let clock = nix::time::ClockId::from_raw((!raw << 3) | 6);
    let t = nix::time::clock_gettime(clock).ok()?;
    let ran = u64::try_from(t.tv_sec()).ok()? * 1_000_000_000 + u64::try_from(t.tv_nsec()).ok()?;
    Some((state, ran))
}

#[cfg(test)]
mod tests {
    use super::super::*;

    use std::time::Duration;
    use verbs_api::{AccessFlags, Device, MemBuf, PdId, WorkCompletion};

    #[test]
    fn a_poller_that_waited_for_a_core_is_told_from_one_busy_elsewhere() {
        use super::{own_tid, poller_state, waited_for_a_core};
        let wait = Duration::from_micros(50);
        // Runnable and ran 5 us of 50: it waited for a core.
        assert!(waited_for_a_core(
            Some(('R', 1_000)),
            Some(('R', 6_000)),
            wait
        ));
        // Ran 40 us of 50 without a poll: busy elsewhere (spinning on memory).
        assert!(!waited_for_a_core(
            Some(('R', 1_000)),
            Some(('R', 41_000)),
            wait
        ));
        // Asleep in another call, or unknown: not waiting for a core.
        assert!(!waited_for_a_core(
            Some(('R', 1_000)),
            Some(('S', 1_000)),
            wait
        ));
        assert!(!waited_for_a_core(None, Some(('R', 1_000)), wait));
        assert!(!waited_for_a_core(Some(('R', 1_000)), None, wait));
        // This thread, as the kernel reports it: running, and it has run.
        let me = poller_state(own_tid()).expect("this thread's /proc entries");
        assert_eq!(me.0, 'R');
        assert!(me.1 > 0, "{me:?}");
        assert_eq!(poller_state(0), None);
    }

    /// Two RC QPs of `dev` connected to each other (a's PSN 1, b's 2), a on `cqs[0]`
    /// and b on `cqs[1]`; four WRs each way.
    fn looped_rc_pair(dev: &EmuDevice, pd: PdId, cqs: [CqId; 2]) -> (u32, u32) {
        use verbs_api::{connect_qp, Endpoint, QpCap, QpInitAttr, QpParams, QpType};
        let qp = |cq: CqId| {
            dev.create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(4, 4)))
                .unwrap()
        };
        let (a, b) = (qp(cqs[0]), qp(cqs[1]));
        let params = QpParams::default();
        let end = |qpn, psn| Endpoint {
            qpn,
            psn,
            gid: dev.gid(),
            ..Endpoint::default()
        };
        connect_qp(dev, a, QpType::Rc, &params, 1, &end(b, 2)).unwrap();
        connect_qp(dev, b, QpType::Rc, &params, 2, &end(a, 1)).unwrap();
        (a, b)
    }

    /// A napping thread is woken for a timer due before its nap ends, not for one due
    /// later, nor when no timer is armed, nor when it does not nap.
    #[test]
    fn a_timer_due_before_the_naps_end_wakes_the_thread() {
        use super::wakes_for;
        assert!(wakes_for(1000, Some(999)));
        assert!(!wakes_for(1000, Some(1000)));
        assert!(!wakes_for(1000, Some(5000)));
        assert!(!wakes_for(1000, None));
        assert!(!wakes_for(u64::MAX, Some(0)));
    }

    /// A busy-poll device on a free loopback port, with a CQ.
    fn busy_poll_device() -> (EmuDevice, CqId) {
        let dev = EmuDevice::open(EmuConfig {
            ip: (Ipv4Addr::LOCALHOST).into(),
            port: 0,
            busy_poll: true,
            ..EmuConfig::default()
        })
        .expect("open a device on loopback");
        let cq = dev.create_cq(16, None).unwrap();
        (dev, cq)
    }

    /// Polls `cq` (up to `max` at a time) until the device thread naps; fails the test
    /// after 5 s.
    fn poll_until_napping(dev: &EmuDevice, cq: CqId, max: usize, out: &mut Vec<WorkCompletion>) {
        let t0 = Instant::now();
        while !dev.inner.napping.load(Ordering::Acquire) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the thread never napped"
            );
            dev.poll_cq(cq, max, out).unwrap();
        }
    }

    /// An application that polls while a CQ is armed (it will wait on the channel
    /// after its next empty poll) must not keep the device thread napping: the thread
    /// goes back to the socket, so the event's datagram is received without a nap.
    #[test]
    fn an_armed_cq_keeps_the_device_thread_on_the_socket() {
        // Busy-poll mode: without an armed CQ the thread naps on while polls come
        // less than ten naps (2 ms) apart.
        let (dev, cq) = busy_poll_device();
        let mut out = Vec::new();
        // Polls until the thread's napping flag is `want` (5 s at most).
        let reaches = |want: bool, out: &mut Vec<WorkCompletion>| {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                dev.poll_cq(cq, 1, out).unwrap();
                if dev.inner.napping.load(Ordering::Acquire) == want {
                    return true;
                }
            }
            false
        };
        // Polling alone puts the thread into its naps.
        assert!(
            reaches(true, &mut out),
            "polling never put the thread to nap"
        );
        // Armed, the thread leaves its nap though the polling goes on.
        dev.req_notify_cq(cq, false).unwrap();
        assert!(
            reaches(false, &mut out),
            "the device thread kept napping with a CQ armed"
        );
    }

    /// While the application polls, the device thread leaves the socket to it: after
    /// a nap it fires timers but receives nothing, even when datagrams wait (the
    /// application polls with pauses here, so some always do). The pauses stay under
    /// [`super::STALL`]: a longer one with a datagram waiting hands the socket to the
    /// thread (`write_spin.rs`).
    #[test]
    fn a_polling_application_receives_every_datagram_itself() {
        let (dev, cq) = busy_poll_device();
        let peer = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let to = (Ipv4Addr::LOCALHOST, dev.port());
        let counters = dev.link_counters();
        let mut out = Vec::new();
        // The thread takes the socket back after 2 ms without a poll (ten naps), or
        // after a nap that leaves a datagram and a pause of STALL: a round in which
        // this thread was descheduled that long proves nothing, and the next round
        // runs instead.
        let pause = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        };
        for _ in 0..50 {
            poll_until_napping(&dev, cq, 1, &mut out);
            let before = counters.thread_datagrams.load(Ordering::Relaxed);
            let bad_before = counters.icrc_errors.load(Ordering::Relaxed);
            // 40 datagrams with a wrong ICRC (dropped and counted by whoever receives
            // them), polled every 10 us in between: the thread naps 200 us at a time,
            // so it wakes to waiting datagrams several times.
            let mut last_poll = Instant::now();
            let mut longest_gap = Duration::ZERO;
            let mut poll = |out: &mut Vec<WorkCompletion>| {
                dev.poll_cq(cq, 1, out).unwrap();
                longest_gap = longest_gap.max(last_poll.elapsed());
                last_poll = Instant::now();
            };
            for _ in 0..40 {
                peer.send_to(&[0u8; 64], to).unwrap();
                for _ in 0..5 {
                    pause(Duration::from_micros(10));
                    poll(&mut out);
                }
            }
            let t0 = Instant::now();
            while counters.icrc_errors.load(Ordering::Relaxed) - bad_before < 40 {
                assert!(t0.elapsed() < Duration::from_secs(5), "datagrams were lost");
                poll(&mut out);
            }
            if longest_gap >= super::STALL {
                continue;
            }
            let by_thread = counters.thread_datagrams.load(Ordering::Relaxed) - before;
            assert_eq!(
                by_thread, 0,
                "the device thread took datagrams while the application polled"
            );
            return;
        }
        eprintln!("skipped: this thread was descheduled for STALL in every round");
    }

    /// A poll (or post) that runs for longer than the device thread's look at the
    /// socket still counts as the application at its verbs: with a datagram waiting,
    /// the thread neither takes it nor holds the socket, however long the call runs
    /// (a poll that hands the engine the ACKs of 10,000 QPs).
    #[test]
    fn a_long_poll_keeps_the_socket_with_the_application() {
        let (dev, cq) = busy_poll_device();
        let peer = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let counters = dev.link_counters();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let mut out = Vec::new();
        for _ in 0..20 {
            poll_until_napping(&dev, cq, 1, &mut out);
            let (holds, taken, bad) = (
                load(&counters.socket_holds),
                load(&counters.thread_datagrams),
                load(&counters.icrc_errors),
            );
            {
                // Inside a verb call, as a poll is, for three naps and many STALLs.
                let _in_poll = dev.inner.at_verbs(&dev.inner.polls);
                // Ten naps without a poll between the last one and the guard (this
                // thread descheduled) take the socket back: that round proves
                // nothing, and the next one runs.
                if !dev.inner.napping.load(Ordering::Acquire) {
                    continue;
                }
                peer.send_to(&[0u8; 64], (Ipv4Addr::LOCALHOST, dev.port()))
                    .unwrap();
                std::thread::sleep(3 * super::NAP);
            }
            assert_eq!(
                load(&counters.socket_holds),
                holds,
                "the device thread held the socket while a poll ran"
            );
            assert_eq!(
                load(&counters.thread_datagrams),
                taken,
                "the device thread took a datagram while a poll ran"
            );
            // The next poll takes it (a wrong ICRC: dropped and counted).
            let t0 = Instant::now();
            while load(&counters.icrc_errors) == bad {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "the datagram was lost"
                );
                dev.poll_cq(cq, 1, &mut out).unwrap();
            }
            return;
        }
        eprintln!("skipped: the device thread left its naps in every round");
    }

    /// While the application polls, a post waits for the next poll to leave (posts to
    /// many QPs go out as one send), except an answer to a peer whose ACK is held: it
    /// leaves at once, with the ACK (a ping-pong's half round trip).
    #[test]
    fn an_answer_leaves_at_once_with_the_held_ack() {
        use verbs_api::{RecvWr, SendFlags, SendWr, Sge, WrOperation};
        let (dev, cq) = busy_poll_device();
        let pd = dev.alloc_pd().unwrap();
        let (a, b) = looped_rc_pair(&dev, pd, [cq, cq]);
        let buf = MemBuf::new(64);
        let mr = dev
            .reg_mr(pd, &buf, 0, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let sge = |at: u64| Sge {
            addr: mr.addr + at,
            length: 8,
            lkey: mr.lkey,
        };
        dev.post_recv(a, &[RecvWr::new(1, vec![sge(0)])]).unwrap();
        dev.post_recv(b, &[RecvWr::new(2, vec![sge(8)])]).unwrap();
        let held = || {
            let core = dev.inner.core.lock();
            (core.tx.count, core.acks.count)
        };
        let mut out = Vec::new();
        // Each round: a's question is deferred to a poll, which sends it and receives
        // it at b, holding b's ACK; b's answer then leaves with it from `post_send`.
        // The device thread's nap also sends what waits: a round in which it woke
        // between the two steps proves nothing, and the next one runs.
        let mut checked = 0;
        for round in 0..20 {
            poll_until_napping(&dev, cq, 4, &mut out);
            let mut question = SendWr::new(round, vec![sge(16)], WrOperation::Send);
            question.send_flags = SendFlags::SIGNALED;
            dev.post_send(a, &[question]).unwrap();
            let t0 = Instant::now();
            loop {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "the question was lost"
                );
                out.clear();
                dev.poll_cq(cq, 4, &mut out).unwrap();
                if out.iter().any(|w| w.qp_num == b && w.opcode.is_recv()) {
                    break;
                }
            }
            dev.post_recv(b, &[RecvWr::new(2, vec![sge(8)])]).unwrap();
            if held() != (0, 1) {
                continue;
            }
            let mut answer = SendWr::new(round, vec![sge(24)], WrOperation::Send);
            answer.send_flags = SendFlags::SIGNALED;
            dev.post_send(b, &[answer]).unwrap();
            // (1, 0): the thread's nap sent the ACK between the look and the post,
            // which then waited for a poll as any post does; the round proves nothing.
            let after = held();
            if after != (1, 0) {
                assert_eq!(after, (0, 0), "the answer and the ACK wait for a poll");
                checked += 1;
            }
            // Drain: a's answer and both send completions.
            let t0 = Instant::now();
            let mut got = 0;
            while got < 3 {
                assert!(t0.elapsed() < Duration::from_secs(5), "the answer was lost");
                out.clear();
                dev.poll_cq(cq, 4, &mut out).unwrap();
                got += out.len();
            }
            dev.post_recv(a, &[RecvWr::new(1, vec![sge(0)])]).unwrap();
        }
        assert!(checked > 0, "the ACK was never held");
    }

    /// A MAD posted on QP1 leaves at once, also while the application polls and the
    /// device thread naps, when an ordinary post waits for the next poll: the CM's
    /// last MAD (the DREQ a process sends as it exits) has no poll after it.
    #[test]
    fn a_mad_on_qp1_is_never_held_for_a_poll() {
        use crate::engine::{GSI_QKEY, GSI_QPN};
        use verbs_api::{
            Endpoint, QpCap, QpInitAttr, QpParams, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest,
            WrOperation,
        };
        let (dev, cq) = busy_poll_device();
        let pd = dev.alloc_pd().unwrap();
        let (a, b) = looped_rc_pair(&dev, pd, [cq, cq]);
        let gsi = dev
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Driver, QpCap::new(64, 1)))
            .unwrap();
        assert_eq!(gsi, GSI_QPN);
        let params = QpParams {
            qkey: GSI_QKEY,
            ..QpParams::default()
        };
        for (attr, mask) in [
            params.init(QpType::Ud),
            params.rtr(QpType::Ud, &Endpoint::default()),
            params.rts(QpType::Ud, 0),
        ] {
            dev.modify_qp(gsi, &attr, mask).unwrap();
        }
        let ah = dev.create_ah(pd, &params.ah_attr(dev.gid())).unwrap();
        let buf = MemBuf::new(256);
        let mr = dev
            .reg_mr(pd, &buf, 0, 256, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let sge = Sge {
            addr: mr.addr,
            length: 256,
            lkey: mr.lkey,
        };
        let held = || dev.inner.core.lock().tx.count;
        let mut out = Vec::new();
        // Each round, the MAD first, then an ordinary SEND on an RC QP: when that one
        // is held, the device deferred posts then, and the MAD, an instant earlier, was
        // not. A round in which the device thread woke in between proves nothing.
        let mut checked = 0;
        for round in 0..20 {
            dev.post_recv(b, &[RecvWr::new(round, vec![sge])]).unwrap();
            poll_until_napping(&dev, cq, 4, &mut out);
            let mad = SendWr::send(round, vec![sge]).with_ud(UdDest {
                ah,
                remote_qpn: 0x00ff_ffff,
                remote_qkey: GSI_QKEY,
            });
            dev.post_send(gsi, &[mad]).unwrap();
            assert_eq!(held(), 0, "the MAD waits for a poll");
            let mut send = SendWr::new(round, vec![sge], WrOperation::Send);
            send.send_flags = SendFlags::SIGNALED;
            dev.post_send(a, &[send]).unwrap();
            if held() > 0 {
                checked += 1;
            }
            // Drain: the SEND's two completions.
            let t0 = Instant::now();
            let mut got = 0;
            while got < 2 {
                assert!(t0.elapsed() < Duration::from_secs(5), "the SEND was lost");
                out.clear();
                dev.poll_cq(cq, 4, &mut out).unwrap();
                got += out.len();
            }
        }
        assert!(checked > 0, "no ordinary post was ever held");
    }

    /// A thread waiting in `get_cq_event` receives for itself: with its CQ armed the
    /// device thread naps instead of taking the socket (which would put a second
    /// wake-up between the datagram and the waiter), and the event still comes.
    #[test]
    fn a_thread_waiting_for_its_event_receives_while_the_device_thread_naps() {
        use verbs_api::{RecvWr, SendWr, Sge, WcStatus, WrOperation};
        let dev = Arc::new(
            EmuDevice::open(EmuConfig {
                ip: (Ipv4Addr::LOCALHOST).into(),
                port: 0,
                ..EmuConfig::default()
            })
            .expect("open a device on loopback"),
        );
        let pd = dev.alloc_pd().unwrap();
        let ch = dev.create_comp_channel().unwrap();
        let send_cq = dev.create_cq(16, None).unwrap();
        let recv_cq = dev.create_cq(16, Some(ch)).unwrap();
        let (a, b) = looped_rc_pair(&dev, pd, [send_cq, recv_cq]);
        let buf = MemBuf::new(64);
        let mr = dev
            .reg_mr(pd, &buf, 0, 64, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let sge = Sge {
            addr: mr.addr,
            length: 8,
            lkey: mr.lkey,
        };
        dev.post_recv(b, &[RecvWr::new(5, vec![sge])]).unwrap();
        dev.req_notify_cq(recv_cq, false).unwrap();
        let waiter = {
            let dev = dev.clone();
            std::thread::spawn(move || dev.get_cq_event(ch, Some(Duration::from_secs(10))))
        };
        // The waiter is in, and the device thread naps though a CQ is armed.
        let t0 = Instant::now();
        while !(dev.inner.waiters.load(Ordering::Acquire) == 1
            && dev.inner.napping.load(Ordering::Acquire))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the device thread did not nap while a thread waited for its event"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        dev.post_send(a, &[SendWr::new(6, vec![sge], WrOperation::Send)])
            .unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), recv_cq);
        let mut wcs = Vec::new();
        assert_eq!(dev.poll_cq(recv_cq, 4, &mut wcs).unwrap(), 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::Success));
        // Armed again with nobody waiting that way (a program that watches the fd):
        // the device thread goes back to the socket within a nap or two.
        dev.req_notify_cq(recv_cq, false).unwrap();
        let t0 = Instant::now();
        while dev.inner.napping.load(Ordering::Acquire) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the device thread kept napping after the waits stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
