//! The ports CM ids bind, claimed host-wide: the kernel's rdma_cm keeps one port space
//! for every process of a network namespace, so a second process binding a port the
//! first holds gets EADDRINUSE (`cma_check_port`: the same port on the same address, or
//! on any address when either side bound the wildcard), and a request to that port
//! reaches the process that bound it. Each process runs a CM of its own here, so the
//! claims live in the host's shared folder (`crate::host`): one file per claim,
//! `cm/PS-PORT-IP`, holding the claiming process and, for an id bound to one device,
//! that device's share of its address (`nic::share`: the member a request is passed
//! to). A claim is removed when its id goes; one left by a process that died is stale
//! (its process is gone) and is taken over.
//!
//! The CM (`emu-cm`) claims; a device that shares its address with other processes
//! reads the claims (`nic::share`) to pass a request to the process that listens.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use crate::host;

/// Marks "bound to every device" in a claim's member byte.
const ANY_MEMBER: u8 = 0xFF;

fn dir() -> PathBuf {
    host::folder().join("cm")
}

/// The wildcard address, one for both families: an id bound to every address holds
/// its port on IPv4 and IPv6 alike, as one port space holds both in the kernel.
const WILDCARD: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

fn path(ps: u16, port: u16, ip: IpAddr) -> PathBuf {
    let ip = if ip.is_unspecified() { WILDCARD } else { ip };
    dir().join(format!("{ps:04x}-{port}-{ip}"))
}

/// Who holds a claim: its process, and the member (share of the address) of the device
/// the id is bound to, `None` for an id bound to every address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) pid: u32,
    pub(crate) member: Option<u8>,
}

/// Reads a live claim (a stale one reads as none).
fn read(path: &PathBuf) -> Option<Holder> {
    let b = fs::read(path).ok()?;
    let pid = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    let member = *b.get(4)?;
    host::pid_alive(pid).then_some(Holder {
        pid,
        member: (member != ANY_MEMBER).then_some(member),
    })
}

/// A port this process holds; the claim goes when it is dropped.
#[derive(Debug)]
pub struct PortClaim {
    path: PathBuf,
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Claims port `port` of port space `ps` on `ip` (the wildcard for every address) for
/// this process, the id bound to the device that is `member` of its address.
/// `Ok(None)` when a live claim of another id conflicts (EADDRINUSE); an error when
/// no claim can be written (no shared folder: the port is then this process's alone,
/// as before there were claims).
pub fn claim(ps: u16, ip: IpAddr, port: u16, member: Option<u8>) -> io::Result<Option<PortClaim>> {
    if conflicts(ps, ip, port) {
        return Ok(None);
    }
    fs::create_dir_all(dir())?;
    let path = path(ps, port, ip);
    let mut rec = std::process::id().to_le_bytes().to_vec();
    rec.push(member.unwrap_or(ANY_MEMBER));
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(&rec)?;
                return Ok(Some(PortClaim { path }));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if read(&path).is_some() {
                    return Ok(None);
                }
                // Stale: its process is gone.
                let _ = fs::remove_file(&path);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Whether a live claim conflicts with `ip:port`: one on the same address or on the
/// wildcard, or any when `ip` is the wildcard.
fn conflicts(ps: u16, ip: IpAddr, port: u16) -> bool {
    if !ip.is_unspecified() {
        return [ip, WILDCARD]
            .iter()
            .any(|a| read(&path(ps, port, *a)).is_some());
    }
    let prefix = format!("{ps:04x}-{port}-");
    let Ok(entries) = fs::read_dir(dir()) else {
        return false;
    };
    entries
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(&prefix) && read(&e.path()).is_some())
}

/// Who holds port `port` of port space `ps` for requests to `ip`: the claim on `ip`,
/// else the wildcard's.
pub(crate) fn holder(ps: u16, ip: IpAddr, port: u16) -> Option<Holder> {
    read(&path(ps, port, ip)).or_else(|| read(&path(ps, port, WILDCARD)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim conflicts with the same port on its address and on the wildcard, not
    /// with another address or port space; it is gone once dropped; a claim left by a
    /// process that is gone is taken over.
    #[test]
    fn claims_conflict_as_the_kernels_port_space() {
        let ps = 0x0F00 | (std::process::id() % 0xFF) as u16;
        let (a, b) = (Ipv4Addr::new(127, 0, 97, 1), Ipv4Addr::new(127, 0, 97, 2));
        let c = claim(ps, a.into(), 7000, Some(3)).unwrap().expect("free");
        assert_eq!(
            holder(ps, a.into(), 7000),
            Some(Holder {
                pid: std::process::id(),
                member: Some(3)
            })
        );
        assert!(
            claim(ps, a.into(), 7000, None).unwrap().is_none(),
            "same address"
        );
        assert!(
            claim(ps, (Ipv4Addr::UNSPECIFIED).into(), 7000, None)
                .unwrap()
                .is_none(),
            "the wildcard"
        );
        let other = claim(ps, b.into(), 7000, None)
            .unwrap()
            .expect("another address");
        assert_eq!(holder(ps, b.into(), 7001), None);
        drop(c);
        assert_eq!(holder(ps, a.into(), 7000), None);
        drop(other);
        let any = claim(ps, (Ipv4Addr::UNSPECIFIED).into(), 7000, None)
            .unwrap()
            .expect("free again");
        assert_eq!(holder(ps, a.into(), 7000).map(|h| h.member), Some(None));
        assert!(
            claim(ps, b.into(), 7000, None).unwrap().is_none(),
            "under the wildcard"
        );
        drop(any);
        // A claim whose process is gone (pid 0 is never a process).
        fs::write(path(ps, 7002, a.into()), [0, 0, 0, 0, ANY_MEMBER]).unwrap();
        assert_eq!(holder(ps, a.into(), 7002), None);
        assert!(claim(ps, a.into(), 7002, None).unwrap().is_some(), "stale");
    }
}
