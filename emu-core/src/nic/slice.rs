//! The time slice a receiving thread asks the scheduler for (`thread-slice`): the
//! shortest while it receives for round trips, the kernel's default while it receives
//! behind a stream.
//!
//! With the shortest slice a woken thread preempts whatever runs on the core it is
//! woken on. That is what a round trip needs where programs spin on every core
//! (perftest's `ib_write_lat` spins on memory for the peer's RDMA WRITE, which only
//! this thread can place; an Open MPI rank bound to one core shares it with the
//! device thread it started): woken later, each half round trip waits for a spinner's
//! slice to end. But a socket's wake-up is a sync wake-up: the scheduler places the
//! woken thread on the waker's core, which is a streaming sender's. There the short
//! slice preempts the sender at every wake, while the other core may idle, and each
//! wake finds a smaller batch. A thread that finds many datagrams at each receive is
//! behind a stream (its latency is the queue's, not its wake-up's), so it takes the
//! default slice and lets the sender run; one that finds one or two (a question, an
//! answer and the ACK of the question) is on a round trip and takes the shortest.

/// The average datagrams per receive (see [`Slice::received`]) at or above which a
/// thread is behind a stream: a quarter of a full `recvmmsg` batch.
const STREAM: u32 = 16;

/// The average at or below which a thread behind a stream is back on round trips.
const ROUND_TRIP: u32 = 4;

/// Fixed-point scale of the average: 1/256 of a datagram.
const SCALE: u32 = 256;

/// How a receiving thread chooses its slice (see the module's documentation).
#[derive(Debug)]
pub(super) struct Slice {
    /// The thread has the shortest slice (it asked, or the kernel refused either way).
    short: bool,
    /// Datagrams per receive, averaged over about the last eight receives
    /// (exponentially: each receive weighs an eighth), in [`SCALE`]ths.
    average: u32,
}

impl Slice {
    /// Asks for the shortest slice for the calling thread, which receives.
    pub(super) fn start() -> Slice {
        request(true);
        Slice {
            short: true,
            average: SCALE,
        }
    }

    /// Counts a receive of the calling thread that handed the engine `got` datagrams
    /// (more than none), and asks for the other slice when the average crosses into
    /// the other kind of traffic.
    pub(super) fn received(&mut self, got: usize) {
        let got = u32::try_from(got).unwrap_or(u32::MAX).min(1 << 16);
        self.average = self.average - self.average / 8 + got * SCALE / 8;
        let short = if self.short {
            self.average < STREAM * SCALE
        } else {
            self.average <= ROUND_TRIP * SCALE
        };
        if short != self.short {
            self.short = short;
            request(short);
        }
    }

    /// Whether the thread is to have the shortest slice now.
    #[cfg(test)]
    fn is_short(&self) -> bool {
        self.short
    }
}

/// Asks the scheduler for the shortest slice (`short`) or the default. A kernel that
/// refuses leaves the thread as it was: nothing else depends on it.
fn request(short: bool) {
    let _ = if short {
        thread_slice::request(thread_slice::SHORTEST)
    } else {
        thread_slice::reset()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_of_full_batches_takes_the_default_and_round_trips_the_shortest() {
        std::thread::spawn(|| {
            let default = thread_slice::slice().unwrap();
            let mut s = Slice::start();
            if default.is_some() {
                assert_eq!(thread_slice::slice().unwrap(), Some(thread_slice::SHORTEST));
            }
            // Ping-pongs: a question, or an answer with the ACK of the question.
            for got in [1, 2, 1, 2, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2] {
                s.received(got);
                assert!(s.is_short(), "a round trip's receive took the default");
            }
            // A stream: full batches. The average crosses STREAM within a few.
            let mut n = 0;
            while s.is_short() {
                s.received(64);
                n += 1;
                assert!(n <= 8, "eight full batches left the shortest slice");
            }
            // Where the kernel reports slices, the default is back.
            if default.is_some() {
                assert_eq!(thread_slice::slice().unwrap(), default);
            }
            // Between the thresholds it stays as it is: no request on every receive.
            for got in [8, 10, 6, 12, 8] {
                s.received(got);
                assert!(!s.is_short());
            }
            // The stream ends; round trips again.
            let mut n = 0;
            while !s.is_short() {
                s.received(1);
                n += 1;
                assert!(n <= 16, "sixteen single datagrams kept the default");
            }
            if default.is_some() {
                assert_eq!(thread_slice::slice().unwrap(), Some(thread_slice::SHORTEST));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_huge_receive_does_not_overflow_the_average() {
        let mut s = Slice {
            short: false,
            average: u32::MAX / 2,
        };
        s.received(usize::MAX);
        s.received(usize::MAX);
        assert!(!s.is_short());
    }
}
