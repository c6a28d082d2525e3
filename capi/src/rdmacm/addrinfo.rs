//! `rdma_getaddrinfo` and `rdma_freeaddrinfo` (manual 4.2.23, 4.2.24; librdmacm's
//! `rdma_getaddrinfo(3)`): the host name and service through the system resolver,
//! IPv4 or IPv6 (the hints' family, or the resolver's first answer).
//! (Safety argument: the parent module's.)

use std::ffi::{c_char, c_int};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::*;
use crate::objects::{free, into_ptr, Wraps};

// SAFETY: #[repr(C)] with rdma_addrinfo first (parent module).
unsafe impl Wraps<r::rdma_addrinfo> for AddrInfoObj {}

/// The first address and port of `node`/`service` (either may be null) of `family`
/// (AF_INET, AF_INET6, or 0 for either), or EADDRNOTAVAIL.
unsafe fn lookup(
    node: *const c_char,
    service: *const c_char,
    numeric: bool,
    family: c_int,
) -> Result<SocketAddr, c_int> {
    let hints = libc::addrinfo {
        ai_family: family,
        ai_socktype: libc::SOCK_STREAM,
        ai_flags: if numeric { libc::AI_NUMERICHOST } else { 0 },
        ..unsafe { std::mem::zeroed() }
    };
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings or null (the caller's contract), our hints.
    if unsafe { libc::getaddrinfo(node, service, &hints, &mut res) } != 0 || res.is_null() {
        return Err(libc::EADDRNOTAVAIL);
    }
    // SAFETY: getaddrinfo gave a list; the first entry's address is a sockaddr of
    // its family.
    let found = unsafe { cm::sockaddr_from_ptr((*res).ai_addr.cast()) };
    // SAFETY: the list getaddrinfo made.
    unsafe { libc::freeaddrinfo(res) };
    match found {
        Ok(Some(a)) => Ok(a),
        _ => Err(libc::EADDRNOTAVAIL),
    }
}

/// `rdma_getaddrinfo`: one entry. `RAI_PASSIVE` makes `node:service` (or
/// 0.0.0.0:service) the source address; otherwise it is the destination and the
/// source comes from `hints->ai_src_addr` if given. The port space and QP type
/// come from the hints (default `RDMA_PS_TCP`, RC). With neither node nor service,
/// the entry is the hints' own addresses (librdmacm copies them; libfabric's verbs
/// provider and pyverbs' `AddrInfo(src=...)` ask this way); EINVAL only when the hints
/// are missing too.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const r::rdma_addrinfo,
    res: *mut *mut r::rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return err(libc::EINVAL);
    }
    // SAFETY: the caller's hints or null.
    let h = unsafe { hints.as_ref() };
    let from_hints = node.is_null() && service.is_null();
    let flags = h.map_or(0, |h| h.ai_flags);
    let family = h.map_or(0, |h| h.ai_family);
    if family != 0 && family != libc::AF_INET && family != libc::AF_INET6 {
        return err(libc::EAFNOSUPPORT);
    }
    let passive = flags & r::RAI_PASSIVE as c_int != 0;
    let numeric = flags & r::RAI_NUMERICHOST as c_int != 0;
    let any = if family == libc::AF_INET6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let addr = if from_hints {
        // No name to resolve: the hints' addresses are the entry's (below).
        SocketAddr::new(any, 0)
    } else if node.is_null() {
        // SAFETY: as lookup's contract.
        match unsafe { lookup(c"0.0.0.0".as_ptr(), service, true, libc::AF_INET) } {
            Ok(a) => SocketAddr::new(any, a.port()),
            Err(e) => return err(e),
        }
    } else {
        // SAFETY: the caller's strings.
        match unsafe { lookup(node, service, numeric, family) } {
            Ok(a) => a,
            Err(e) => return err(e),
        }
    };
    let ps = h.map_or(0, |h| h.ai_port_space);
    let ps = if ps == 0 { r::RDMA_PS_TCP as c_int } else { ps };
    let qp_type = match h.map_or(0, |h| h.ai_qp_type) {
        0 => cm::qp_type_of_port_space(ps as r::rdma_port_space) as c_int,
        t => t,
    };
    // SAFETY (both): the hints' addresses, each a sockaddr of its family, or null.
    let hint_src = match h.map(|h| unsafe { cm::sockaddr_from_ptr(h.ai_src_addr) }) {
        Some(Err(e)) => return err(e.errno()),
        Some(Ok(a)) => a,
        None => None,
    };
    let hint_dst = match h.map(|h| unsafe { cm::sockaddr_from_ptr(h.ai_dst_addr) }) {
        Some(Err(e)) => return err(e.errno()),
        Some(Ok(a)) => a,
        None => None,
    };
    let src = if passive && !from_hints {
        Some(addr)
    } else {
        hint_src
    };
    let dst = if from_hints {
        hint_dst
    } else {
        (!passive).then_some(addr)
    };
    let v6 = src.or(dst).is_some_and(|a| a.is_ipv6());
    let (src_c, src_len) = cm::sockaddr_to_c(src.unwrap_or(NO_ADDR));
    let (dst_c, dst_len) = cm::sockaddr_to_c(dst.unwrap_or(NO_ADDR));
    let p = into_ptr::<r::rdma_addrinfo, AddrInfoObj>(AddrInfoObj {
        raw: r::rdma_addrinfo {
            ai_flags: flags,
            ai_family: if v6 { libc::AF_INET6 } else { libc::AF_INET },
            ai_qp_type: qp_type,
            ai_port_space: ps,
            ..Default::default()
        },
        src: src_c,
        dst: dst_c,
    });
    // SAFETY: just made; the addresses live in the same allocation as the entry.
    unsafe {
        let o = &mut *p.cast::<AddrInfoObj>();
        if src.is_some() {
            o.raw.ai_src_addr = std::ptr::addr_of_mut!(o.src).cast();
            o.raw.ai_src_len = src_len;
        }
        if dst.is_some() {
            o.raw.ai_dst_addr = std::ptr::addr_of_mut!(o.dst).cast();
            o.raw.ai_dst_len = dst_len;
        }
        *res = p;
    }
    0
}

/// `rdma_freeaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut r::rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: an entry rdma_getaddrinfo made; freed once.
        let next = unsafe { (*p).ai_next };
        // SAFETY: as above.
        unsafe { free::<_, AddrInfoObj>(p) };
        p = next;
    }
}
