//! Datagrams the kernel dropped before the device could read them: a socket's receive
//! buffer was full (the device thread and the application's polls did not keep up; a
//! busy host, a flood) or a UDP checksum was wrong. A real NIC drops on overload too,
//! and counts it (`rx_discards_phy`); here the count is the kernel's per-socket drop
//! counter, the last column of `/proc/net/udp`, read for the device's receive sockets
//! (found by their inode) once a second. So a user can tell loss by overload from loss
//! on the path: the first shows here, the second only as retransmissions.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

/// The kernel's drop count of every receive socket, from one read of `/proc/net/udp`;
/// sums what each socket dropped since the last call, so sockets that come and go
/// (multicast groups) are counted once.
#[derive(Debug, Default)]
pub(crate) struct KernelDrops {
    /// Each socket's count at the last read, by inode.
    last: HashMap<u64, u64>,
}

impl KernelDrops {
    /// How many datagrams the sockets `socks` lost since the last call (their whole
    /// count, for a socket not seen before); `None` if the kernel does not say.
    pub(crate) fn since_last<S: AsFd>(&mut self, socks: &[S]) -> Option<u64> {
        let inodes: Vec<u64> = socks
            .iter()
            .filter_map(|s| {
                let fd = s.as_fd().as_raw_fd();
                let m = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
                Some(m.ino())
            })
            .collect();
        let table = std::fs::read_to_string("/proc/net/udp").ok()?;
        let now = parse(&table, &inodes);
        let mut more = 0;
        for (&ino, &n) in &now {
            more += n.saturating_sub(self.last.get(&ino).copied().unwrap_or(0));
        }
        self.last = now;
        Some(more)
    }
}

/// The drop count of each socket of `inodes` listed in `table` (the text of
/// `/proc/net/udp`: a header line, then one line per socket whose tenth field is the
/// inode and whose last field is the drop count).
fn parse(table: &str, inodes: &[u64]) -> HashMap<u64, u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let ino: u64 = f.get(9)?.parse().ok()?;
            let drops: u64 = f.last()?.parse().ok()?;
            inodes.contains(&ino).then_some((ino, drops))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn the_table_gives_each_sockets_drops() {
        let table = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
          1: 0100007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n\
          2: 0200007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4343 2 0000000000000000 0\n";
        let got = parse(table, &[4242, 9]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[&4242], 17);
    }

    /// A socket nobody reads, sent more than its receive buffer holds: the kernel drops
    /// the rest, and the count says how many.
    #[test]
    fn an_overflowing_socket_is_counted() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let _ = socket2::SockRef::from(&rx).set_recv_buffer_size(4096);
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut d = KernelDrops::default();
        assert_eq!(d.since_last(&[&rx]), Some(0));
        let sent = 2000;
        for _ in 0..sent {
            let _ = tx.send_to(&[0u8; 1000], rx.local_addr().unwrap());
        }
        let dropped = d.since_last(&[&rx]).unwrap();
        let mut got = 0;
        rx.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 2000];
        while rx.recv(&mut buf).is_ok() {
            got += 1;
        }
        assert!(dropped > 0, "nothing dropped of {sent}");
        assert_eq!(dropped + got, sent, "{dropped} dropped, {got} read");
        // Counted once.
        assert_eq!(d.since_last(&[&rx]), Some(0));
    }
}
