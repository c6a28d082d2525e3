//! What the emulated devices and CMs of one host share: a folder of small files, one
//! per user and network namespace. Devices publish their heartbeats and their share of
//! an address there (`nic::share`, `nic::liveness`), CMs the ports they bound
//! (`crate::ports`), as the kernel keeps one table of these for every process of a host.

use std::path::PathBuf;

/// The folder of this user's emulated devices in this network namespace
/// (`/dev/shm/rdma-emu-UID/NETNS`, or under the temporary folder where `/dev/shm` is
/// missing): one address and port name different devices in different namespaces
/// (`rdma-emu exec --netns` runs several on 127.0.0.77:4791 at once), so the
/// namespace's inode is part of the path.
pub(crate) fn folder() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    let shm = PathBuf::from("/dev/shm");
    let base = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    base.join(format!("rdma-emu-{uid}")).join(netns.to_string())
}

/// The monotonic clock, in nanoseconds: the same in every process of the host.
pub(crate) fn mono_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail (clock_gettime(2): EINVAL is for unknown clocks).
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64
    })
}

/// Whether process `pid` exists (a file left by a process that is gone is stale).
pub(crate) fn pid_alive(pid: u32) -> bool {
    pid != 0 && PathBuf::from(format!("/proc/{pid}")).exists()
}
