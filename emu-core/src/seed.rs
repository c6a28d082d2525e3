//! Values that must differ between the devices and CMs one process after another
//! opens on one address, so that a peer still holding state of an earlier process
//! (one that ended without saying goodbye) does not take the new one's packets for
//! the old one's. Real-time devices use them; virtual-time (fabric) runs keep fixed
//! values so that they stay reproducible.
//!
//! Two uses, each measured against or modelled on the kernel:
//! - the first Local Communication ID of a CM (IBTA 12.6.5): the kernel's cm.c matches
//!   REQs on the remote communication ID and CA GUID and drops a REQ it takes for a
//!   duplicate; with IDs a function of the address alone, the next process's REQs went
//!   unanswered by kernel rxe until it let the old connection go. The kernel starts its
//!   own IDs at a random value.
//! - the first QP number of a UDP device: a REQ from a QPN and GID the peer still holds
//!   a connection for is answered with REJ "stale connection" (IBTA 12.9.8.3.1); rxe
//!   allocates QPNs cyclically, so a new process rarely reuses the last one's.

/// A value that differs between calls made one after the other, in one process or in
/// successive ones: the clock's nanoseconds and the process id, mixed by a Fibonacci
/// multiply.
pub fn instance_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 32) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn successive_seeds_differ() {
        let a = super::instance_seed();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(a, super::instance_seed());
    }
}
