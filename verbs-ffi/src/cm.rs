//! Conversions between the C structs of `<rdma/rdma_cma.h>` (module [`sys::rdma`]) and
//! the connection manager types of `verbs_api` ([`verbs_api::cm`]): socket addresses,
//! port spaces, event types, connection and UD parameters, events.
//!
//! Two directions, as in [`convert`](crate::convert):
//!
//! * C to Rust (`*_from_c`): what a C program hands capi's `librdmacm.so.1`
//!   (`rdma_bind_addr`'s `sockaddr`, `rdma_connect`'s `rdma_conn_param`), and what the
//!   real librdmacm hands hw-backend's `HwCm` (an event's parameters, an id's route
//!   addresses). A socket address is read by its family first: `AF_INET` and
//!   `AF_INET6` are read as their structs; another family is EINVAL, as librdmacm's
//!   calls answer an address whose length they cannot tell (its `ucma_addrlen`), but
//!   `AF_IB`, which librdmacm knows, is EAFNOSUPPORT: the RoCE devices here have IP
//!   addresses only.
//! * Rust to C (`*_to_c`): the events capi hands a program, the addresses and
//!   parameters `HwCm` hands librdmacm. Private data longer than its `u8` length field
//!   can say is EINVAL; [`verbs_api::cm::check_private_data`] has the tighter limits of each port
//!   space and call (what the kernel's rdma_cm answers EINVAL to).
//!
//! # Pointers
//!
//! `rdma_conn_param` and `rdma_ud_param` point at their private data. A `*_to_c`
//! result points into the `private_data` of the Rust value it was made from (null
//! when empty): it may be used while that value lives and is not changed (moving it
//! is fine: a `Vec`'s buffer stays where it is). The `*_from_c` functions take the
//! private data as a slice; [`private_data`] makes that slice from the C pointer, and
//! [`sockaddr_from_ptr`] reads a `struct sockaddr *`: the two places here that follow
//! a pointer, each `unsafe` with its contract stated. Everything else works on values.
//!
//! # Safety argument
//!
//! Besides those two functions, the `unsafe` here reads or writes members of C unions
//! (`in6_addr`'s bytes; the `conn` or `ud` member of `rdma_cm_event`'s `param`,
//! which bindgen gives as a struct of `__BindgenUnionField`s over a `[u64; 7]`:
//! every member starts at its offset 0, and the struct is as large as the largest
//! member, which bindgen's layout tests check against the header). Every member of
//! those unions is made of integers, arrays of integers and (the private data) a raw
//! pointer that is only copied here, so every bit pattern is a valid value of every
//! member; a write through `__BindgenUnionField::as_mut` stays inside the struct.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use verbs_api::{
    CmEvent, CmEventParam, CmEventType, ConnParam, Error, PortSpace, QpType, Result, UdParam,
};

use crate::convert::{ah_attr_from_c, ah_attr_to_c};
use crate::sys;
use crate::sys::rdma as r;

/// `AF_INET` (Linux `<bits/socket.h>`).
pub const AF_INET: i32 = 2;
/// `AF_INET6`.
pub const AF_INET6: i32 = 10;
/// `AF_IB` (librdmacm's InfiniBand addresses, `<infiniband/ib.h>`).
pub const AF_IB: i32 = 27;
/// `EAFNOSUPPORT`: the address family is not supported.
pub const EAFNOSUPPORT: i32 = 97;

// ---- socket addresses ----

/// The offset in a `sockaddr_storage`'s padding of the field at `at` of a
/// `sockaddr_in` / `sockaddr_in6` (all three start with the family).
const fn pad(at: usize) -> usize {
    at - offset_of!(r::sockaddr_storage, __ss_padding)
}

/// `sockaddr_in` to [`SocketAddrV4`] (the family is not looked at).
pub fn sockaddr_in_from_c(s: &r::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
        u16::from_be(s.sin_port),
    )
}

/// [`SocketAddrV4`] to `sockaddr_in` (`AF_INET`, network byte order).
pub fn sockaddr_in_to_c(a: SocketAddrV4) -> r::sockaddr_in {
    r::sockaddr_in {
        sin_family: AF_INET as r::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: r::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// `sockaddr_in6` to [`SocketAddrV6`] (the family is not looked at).
pub fn sockaddr_in6_from_c(s: &r::sockaddr_in6) -> SocketAddrV6 {
    // SAFETY: a union of byte and integer arrays (module docs).
    let bytes = unsafe { s.sin6_addr.__in6_u.__u6_addr8 };
    SocketAddrV6::new(
        Ipv6Addr::from(bytes),
        u16::from_be(s.sin6_port),
        u32::from_be(s.sin6_flowinfo),
        s.sin6_scope_id,
    )
}

/// [`SocketAddrV6`] to `sockaddr_in6` (`AF_INET6`; port and flow label in network
/// byte order, the scope id in host order, as the kernel keeps them).
pub fn sockaddr_in6_to_c(a: SocketAddrV6) -> r::sockaddr_in6 {
    r::sockaddr_in6 {
        sin6_family: AF_INET6 as r::sa_family_t,
        sin6_port: a.port().to_be(),
        sin6_flowinfo: a.flowinfo().to_be(),
        sin6_addr: r::in6_addr {
            __in6_u: r::in6_addr__bindgen_ty_1 {
                __u6_addr8: a.ip().octets(),
            },
        },
        sin6_scope_id: a.scope_id(),
    }
}

/// A socket address as a `sockaddr_storage` holding the `sockaddr_in` or
/// `sockaddr_in6` of its family, and that struct's length (what a `sockaddr *`
/// argument and its `socklen_t` take).
pub fn sockaddr_to_c(a: SocketAddr) -> (r::sockaddr_storage, r::socklen_t) {
    let mut ss = r::sockaddr_storage {
        ss_family: 0,
        __ss_padding: [0; 118],
        __ss_align: 0,
    };
    let mut put = |at: usize, bytes: &[u8]| {
        for (d, s) in ss.__ss_padding[pad(at)..].iter_mut().zip(bytes) {
            *d = *s as c_char;
        }
    };
    let len = match a {
        SocketAddr::V4(v) => {
            put(
                offset_of!(r::sockaddr_in, sin_port),
                &v.port().to_be_bytes(),
            );
            put(offset_of!(r::sockaddr_in, sin_addr), &v.ip().octets());
            ss.ss_family = AF_INET as r::sa_family_t;
            size_of::<r::sockaddr_in>()
        }
        SocketAddr::V6(v) => {
            put(
                offset_of!(r::sockaddr_in6, sin6_port),
                &v.port().to_be_bytes(),
            );
            let flow = v.flowinfo().to_be_bytes();
            put(offset_of!(r::sockaddr_in6, sin6_flowinfo), &flow);
            put(offset_of!(r::sockaddr_in6, sin6_addr), &v.ip().octets());
            let scope = v.scope_id().to_ne_bytes();
            put(offset_of!(r::sockaddr_in6, sin6_scope_id), &scope);
            ss.ss_family = AF_INET6 as r::sa_family_t;
            size_of::<r::sockaddr_in6>()
        }
    };
    (ss, len as r::socklen_t)
}

/// The error for a socket address of `family` (neither `AF_INET` nor `AF_INET6`):
/// module docs.
fn family_error(family: i32) -> Error {
    if family == AF_IB {
        Error::Os {
            errno: EAFNOSUPPORT,
            context: "AF_IB addresses are not supported: the devices are RoCE",
        }
    } else {
        Error::InvalidArgument("not an AF_INET or AF_INET6 socket address")
    }
}

/// A `sockaddr_storage` as a socket address, by its family (module docs for the
/// errors).
pub fn sockaddr_from_c(ss: &r::sockaddr_storage) -> Result<SocketAddr> {
    let bytes = |at: usize, n: usize| -> Vec<u8> {
        ss.__ss_padding[pad(at)..pad(at) + n]
            .iter()
            .map(|b| *b as u8)
            .collect()
    };
    let family = i32::from(ss.ss_family);
    let port = |at| u16::from_be_bytes(bytes(at, 2).try_into().expect("2 bytes"));
    let u32_at = |at| -> [u8; 4] { bytes(at, 4).try_into().expect("4 bytes") };
    match family {
        AF_INET => Ok(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(u32_at(offset_of!(r::sockaddr_in, sin_addr))),
            port(offset_of!(r::sockaddr_in, sin_port)),
        ))),
        AF_INET6 => {
            let ip: [u8; 16] = bytes(offset_of!(r::sockaddr_in6, sin6_addr), 16)
                .try_into()
                .expect("16 bytes");
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port(offset_of!(r::sockaddr_in6, sin6_port)),
                u32::from_be_bytes(u32_at(offset_of!(r::sockaddr_in6, sin6_flowinfo))),
                u32::from_ne_bytes(u32_at(offset_of!(r::sockaddr_in6, sin6_scope_id))),
            )))
        }
        f => Err(family_error(f)),
    }
}

/// The socket address at `sa`, read by its family: `None` for a null pointer (the
/// caller decides whether that is allowed), EINVAL / EAFNOSUPPORT for other families
/// (module docs).
///
/// # Safety
///
/// `sa` is null, or points to a readable `sockaddr` whose `sa_family` is readable and
/// which, when the family is `AF_INET` / `AF_INET6`, is a whole `sockaddr_in` /
/// `sockaddr_in6` (librdmacm's contract for the addresses it takes). Nothing past the
/// family is read for another family.
pub unsafe fn sockaddr_from_ptr(sa: *const r::sockaddr) -> Result<Option<SocketAddr>> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract: the family is readable.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        AF_INET => {
            // SAFETY: the caller's contract: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<r::sockaddr_in>() };
            Ok(Some(SocketAddr::V4(sockaddr_in_from_c(sin))))
        }
        AF_INET6 => {
            // SAFETY: the caller's contract: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<r::sockaddr_in6>() };
            Ok(Some(SocketAddr::V6(sockaddr_in6_from_c(sin6))))
        }
        f => Err(family_error(f)),
    }
}

// ---- port spaces and event types ----

/// `rdma_port_space` to [`PortSpace`]; EINVAL for a value `rdma_cma.h` does not name.
pub fn port_space_from_c(ps: r::rdma_port_space) -> Result<PortSpace> {
    PortSpace::try_from(ps).map_err(|_| Error::InvalidArgument("unknown rdma_port_space"))
}

/// [`PortSpace`] to `rdma_port_space`.
pub fn port_space_to_c(ps: PortSpace) -> r::rdma_port_space {
    ps.as_u32()
}

/// The QP type librdmacm gives an id of port space `ps` (`id->qp_type`,
/// `rdma_create_id`): UD for `RDMA_PS_UDP` and `RDMA_PS_IPOIB`, otherwise RC (also
/// for `RDMA_PS_IB`, whose ids may take any type, and for a value no port space has).
pub fn qp_type_of_port_space(ps: r::rdma_port_space) -> sys::ibv_qp_type {
    let t = port_space_from_c(ps)
        .ok()
        .and_then(PortSpace::qp_type)
        .unwrap_or(QpType::Rc);
    t.as_u32()
}

/// `rdma_cm_event_type` to [`CmEventType`]; EINVAL for a value `rdma_cma.h` does not
/// name (one a newer librdmacm added).
pub fn cm_event_type_from_c(t: r::rdma_cm_event_type) -> Result<CmEventType> {
    CmEventType::try_from(t).map_err(|_| Error::InvalidArgument("unknown rdma_cm_event_type"))
}

/// [`CmEventType`] to `rdma_cm_event_type`.
pub fn cm_event_type_to_c(t: CmEventType) -> r::rdma_cm_event_type {
    t.as_u32()
}

// ---- private data and connection parameters ----

/// The private data pointer and `u8` length of `data` for a C struct (null when
/// empty); EINVAL when the length does not fit.
fn private_data_to_c(data: &[u8]) -> Result<(*const c_void, u8)> {
    let len =
        u8::try_from(data.len()).map_err(|_| Error::InvalidArgument("private data too long"))?;
    let ptr = if data.is_empty() {
        std::ptr::null()
    } else {
        data.as_ptr().cast()
    };
    Ok((ptr, len))
}

/// The `len` bytes of private data at `ptr` (empty when `ptr` is null or `len` 0).
///
/// # Safety
///
/// `ptr` is null, or points to `len` readable bytes that stay unchanged while the
/// slice lives (an `rdma_conn_param` / `rdma_ud_param` of a caller, or of an event
/// not yet acknowledged).
pub unsafe fn private_data<'a>(ptr: *const c_void, len: u8) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), usize::from(len)) }
}

/// `rdma_conn_param` to [`ConnParam`], with `private_data` the bytes its pointer
/// points at ([`private_data`]).
pub fn conn_param_from_c(c: &r::rdma_conn_param, private_data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control != 0,
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: c.srq != 0,
        qp_num: c.qp_num,
    }
}

/// [`ConnParam`] to `rdma_conn_param`, pointing into `p.private_data` (module docs);
/// EINVAL for more than 255 bytes of it.
pub fn conn_param_to_c(p: &ConnParam) -> Result<r::rdma_conn_param> {
    let (private_data, private_data_len) = private_data_to_c(&p.private_data)?;
    Ok(r::rdma_conn_param {
        private_data,
        private_data_len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: u8::from(p.flow_control),
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: p.qp_num,
    })
}

/// `rdma_ud_param` to [`UdParam`], with `private_data` the bytes its pointer points
/// at ([`private_data`]).
pub fn ud_param_from_c(u: &r::rdma_ud_param, private_data: &[u8]) -> UdParam {
    UdParam {
        private_data: private_data.to_vec(),
        ah_attr: ah_attr_from_c(&u.ah_attr),
        qp_num: u.qp_num,
        qkey: u.qkey,
    }
}

/// [`UdParam`] to `rdma_ud_param`, pointing into `u.private_data` (module docs);
/// EINVAL for more than 255 bytes of it.
pub fn ud_param_to_c(u: &UdParam) -> Result<r::rdma_ud_param> {
    let (private_data, private_data_len) = private_data_to_c(&u.private_data)?;
    Ok(r::rdma_ud_param {
        private_data,
        private_data_len,
        ah_attr: ah_attr_to_c(&u.ah_attr),
        qp_num: u.qp_num,
        qkey: u.qkey,
    })
}

/// The `conn` member of an event's `param` (module docs on the union).
pub fn event_conn_param(p: &r::rdma_cm_event__bindgen_ty_1) -> &r::rdma_conn_param {
    // SAFETY: a member of a union of plain data, inside the struct (module docs).
    unsafe { p.conn.as_ref() }
}

/// The `ud` member of an event's `param` (module docs on the union).
pub fn event_ud_param(p: &r::rdma_cm_event__bindgen_ty_1) -> &r::rdma_ud_param {
    // SAFETY: as above.
    unsafe { p.ud.as_ref() }
}

/// [`CmEventParam`] to an event's `param` union: `conn` or `ud` written (pointing into
/// `p`'s private data, module docs), all zeros for none; EINVAL for more than 255
/// bytes of private data.
pub fn event_param_to_c(p: &CmEventParam) -> Result<r::rdma_cm_event__bindgen_ty_1> {
    let mut out = r::rdma_cm_event__bindgen_ty_1::default();
    match p {
        CmEventParam::None => {}
        // SAFETY (both): writing one member of a union of plain data, inside the
        // struct (module docs).
        CmEventParam::Conn(c) => *unsafe { out.conn.as_mut() } = conn_param_to_c(c)?,
        CmEventParam::Ud(u) => *unsafe { out.ud.as_mut() } = ud_param_to_c(u)?,
    }
    Ok(out)
}

/// [`CmEvent`] to `rdma_cm_event`, with the C ids `id` and `listen_id` (only copied)
/// standing for `ev.id` and `ev.listen_id`: the event type, status and parameters
/// ([`event_param_to_c`], pointing into `ev`).
pub fn cm_event_to_c(
    ev: &CmEvent,
    id: *mut r::rdma_cm_id,
    listen_id: *mut r::rdma_cm_id,
) -> Result<r::rdma_cm_event> {
    Ok(r::rdma_cm_event {
        id,
        listen_id,
        event: cm_event_type_to_c(ev.event),
        status: ev.status,
        param: event_param_to_c(&ev.param)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use verbs_api::{
        AhAttr, CmId, Gid, GlobalRoute, MAX_ACCEPT_PRIVATE_DATA, MAX_UD_CONNECT_PRIVATE_DATA,
    };

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn family_and_errno_values_are_linuxs() {
        assert_eq!(AF_INET, libc::AF_INET);
        assert_eq!(AF_INET6, libc::AF_INET6);
        assert_eq!(AF_IB, libc::AF_IB);
        assert_eq!(EAFNOSUPPORT, libc::EAFNOSUPPORT);
        assert_eq!(
            size_of::<r::sockaddr_storage>(),
            size_of::<libc::sockaddr_storage>()
        );
    }

    #[test]
    fn ipv4_sockaddr_is_the_kernels() {
        let a = SocketAddrV4::new(Ipv4Addr::new(192, 168, 1, 2), 7471);
        let c = sockaddr_in_to_c(a);
        assert_eq!(c.sin_family, libc::AF_INET as u16);
        assert_eq!(c.sin_port.to_ne_bytes(), [0x1D, 0x2F]);
        assert_eq!(c.sin_addr.s_addr.to_ne_bytes(), [192, 168, 1, 2]);
        assert_eq!(sockaddr_in_from_c(&c), a);
        // The storage form holds the same bytes as the struct.
        let (ss, len) = sockaddr_to_c(SocketAddr::V4(a));
        assert_eq!(len as usize, size_of::<r::sockaddr_in>());
        // SAFETY: a sockaddr_storage holds a sockaddr_in of its family.
        let back = unsafe { *std::ptr::from_ref(&ss).cast::<r::sockaddr_in>() };
        assert_eq!((back.sin_family, back.sin_port), (c.sin_family, c.sin_port));
        assert_eq!(back.sin_addr.s_addr, c.sin_addr.s_addr);
        assert_eq!(back.sin_zero, [0; 8]);
    }

    #[test]
    fn ipv6_sockaddr_is_the_kernels() {
        let a = SocketAddrV6::new("fd00::1:7".parse().unwrap(), 7174, 0x0005_4321, 3);
        let c = sockaddr_in6_to_c(a);
        assert_eq!(c.sin6_family, libc::AF_INET6 as u16);
        assert_eq!(c.sin6_flowinfo.to_ne_bytes(), [0, 5, 0x43, 0x21]);
        assert_eq!(sockaddr_in6_from_c(&c), a);
        let (ss, len) = sockaddr_to_c(SocketAddr::V6(a));
        assert_eq!(len as usize, size_of::<r::sockaddr_in6>());
        // SAFETY: a sockaddr_storage holds a sockaddr_in6 of its family.
        let back = unsafe { *std::ptr::from_ref(&ss).cast::<r::sockaddr_in6>() };
        assert_eq!(sockaddr_in6_from_c(&back), a);
        assert_eq!(back.sin6_family, c.sin6_family);
    }

    #[test]
    fn other_families_are_einval_and_af_ib_eafnosupport() {
        let (mut ss, _) = sockaddr_to_c(v4("127.0.0.1:1"));
        for (family, errno) in [
            (libc::AF_UNIX, libc::EINVAL),
            (libc::AF_UNSPEC, libc::EINVAL),
            (libc::AF_IB, libc::EAFNOSUPPORT),
        ] {
            ss.ss_family = family as r::sa_family_t;
            assert_eq!(sockaddr_from_c(&ss).unwrap_err().errno(), errno);
            // SAFETY: a whole sockaddr_storage.
            let e = unsafe { sockaddr_from_ptr(std::ptr::from_ref(&ss).cast()) };
            assert_eq!(e.unwrap_err().errno(), errno);
        }
        // SAFETY: null is allowed.
        assert_eq!(
            unsafe { sockaddr_from_ptr(std::ptr::null()) }.unwrap(),
            None
        );
    }

    #[test]
    fn sockaddr_from_ptr_reads_only_its_familys_struct() {
        // A bare sockaddr_in (16 bytes), not a storage: AF_INET reads no further.
        let c = sockaddr_in_to_c(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9));
        // SAFETY: a whole sockaddr_in.
        let a = unsafe { sockaddr_from_ptr(std::ptr::from_ref(&c).cast()) };
        assert_eq!(a.unwrap(), Some(v4("127.0.0.1:9")));
    }

    fn any_socket_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            any::<([u8; 4], u16)>().prop_map(|(ip, port)| SocketAddr::from((ip, port))),
            any::<([u8; 16], u16, u32, u32)>().prop_map(|(ip, port, flow, scope)| {
                SocketAddr::V6(SocketAddrV6::new(ip.into(), port, flow, scope))
            }),
        ]
    }

    proptest! {
        #[test]
        fn sockaddrs_round_trip(a in any_socket_addr()) {
            let (ss, _) = sockaddr_to_c(a);
            prop_assert_eq!(sockaddr_from_c(&ss).unwrap(), a);
            // SAFETY: a whole sockaddr_storage.
            let p = unsafe { sockaddr_from_ptr(std::ptr::from_ref(&ss).cast()) };
            prop_assert_eq!(p.unwrap(), Some(a));
            match a {
                SocketAddr::V4(v) => prop_assert_eq!(sockaddr_in_from_c(&sockaddr_in_to_c(v)), v),
                SocketAddr::V6(v) => prop_assert_eq!(sockaddr_in6_from_c(&sockaddr_in6_to_c(v)), v),
            }
        }
    }

    #[test]
    fn port_spaces_and_their_qp_types() {
        for ps in PortSpace::ALL {
            assert_eq!(port_space_from_c(port_space_to_c(*ps)).unwrap(), *ps);
        }
        assert_eq!(port_space_to_c(PortSpace::Tcp), r::RDMA_PS_TCP);
        assert_eq!(port_space_to_c(PortSpace::Udp), r::RDMA_PS_UDP);
        assert_eq!(port_space_to_c(PortSpace::Ib), r::RDMA_PS_IB);
        assert_eq!(port_space_to_c(PortSpace::Ipoib), r::RDMA_PS_IPOIB);
        assert_eq!(port_space_from_c(0x0107).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(qp_type_of_port_space(r::RDMA_PS_TCP), sys::IBV_QPT_RC);
        assert_eq!(qp_type_of_port_space(r::RDMA_PS_IB), sys::IBV_QPT_RC);
        assert_eq!(qp_type_of_port_space(r::RDMA_PS_UDP), sys::IBV_QPT_UD);
        assert_eq!(qp_type_of_port_space(r::RDMA_PS_IPOIB), sys::IBV_QPT_UD);
        assert_eq!(qp_type_of_port_space(7), sys::IBV_QPT_RC);
    }

    #[test]
    fn event_types_are_the_headers() {
        let named = [
            r::RDMA_CM_EVENT_ADDR_RESOLVED,
            r::RDMA_CM_EVENT_ADDR_ERROR,
            r::RDMA_CM_EVENT_ROUTE_RESOLVED,
            r::RDMA_CM_EVENT_ROUTE_ERROR,
            r::RDMA_CM_EVENT_CONNECT_REQUEST,
            r::RDMA_CM_EVENT_CONNECT_RESPONSE,
            r::RDMA_CM_EVENT_CONNECT_ERROR,
            r::RDMA_CM_EVENT_UNREACHABLE,
            r::RDMA_CM_EVENT_REJECTED,
            r::RDMA_CM_EVENT_ESTABLISHED,
            r::RDMA_CM_EVENT_DISCONNECTED,
            r::RDMA_CM_EVENT_DEVICE_REMOVAL,
            r::RDMA_CM_EVENT_MULTICAST_JOIN,
            r::RDMA_CM_EVENT_MULTICAST_ERROR,
            r::RDMA_CM_EVENT_ADDR_CHANGE,
            r::RDMA_CM_EVENT_TIMEWAIT_EXIT,
        ];
        assert_eq!(named.len(), CmEventType::ALL.len());
        for (c, e) in named.iter().zip(CmEventType::ALL) {
            assert_eq!(cm_event_type_to_c(*e), *c);
            assert_eq!(cm_event_type_from_c(*c).unwrap(), *e);
        }
        assert_eq!(cm_event_type_from_c(16).unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn private_data_length_is_a_u8() {
        // The per-call limits are verbs_api's (PortSpace::max_private_data); the C
        // structs' length is a u8.
        let mut p = ConnParam {
            private_data: vec![1; 255],
            ..ConnParam::default()
        };
        assert_eq!(conn_param_to_c(&p).unwrap().private_data_len, 255);
        p.private_data.push(2);
        assert_eq!(conn_param_to_c(&p).unwrap_err().errno(), libc::EINVAL);
        let u = UdParam {
            private_data: vec![0; 256],
            ..UdParam::default()
        };
        assert_eq!(
            ud_param_to_c(&u).err().map(|e| e.errno()),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn empty_private_data_is_a_null_pointer() {
        let c = conn_param_to_c(&ConnParam::default()).unwrap();
        assert!(c.private_data.is_null());
        assert_eq!(c.private_data_len, 0);
        // SAFETY: null is allowed; so is a length of 0 with any pointer.
        unsafe {
            assert!(private_data(std::ptr::null(), 9).is_empty());
            assert!(
                private_data(std::ptr::NonNull::<u8>::dangling().as_ptr().cast(), 0).is_empty()
            );
        }
    }

    fn any_conn_param() -> impl Strategy<Value = ConnParam> {
        (
            proptest::collection::vec(any::<u8>(), 0..=MAX_ACCEPT_PRIVATE_DATA),
            any::<(u8, u8, bool, u8, u8, bool, u32)>(),
        )
            .prop_map(
                |(private_data, (rr, id, fc, rc, rnr, srq, qpn))| ConnParam {
                    private_data,
                    responder_resources: rr,
                    initiator_depth: id,
                    flow_control: fc,
                    retry_count: rc,
                    rnr_retry_count: rnr,
                    srq,
                    qp_num: qpn,
                },
            )
    }

    fn any_ud_param() -> impl Strategy<Value = UdParam> {
        (
            proptest::collection::vec(any::<u8>(), 0..=MAX_UD_CONNECT_PRIVATE_DATA),
            any::<([u8; 16], u32, u8, u8, u16, u8, u32, u32)>(),
        )
            .prop_map(
                |(private_data, (gid, flow, sgid, hop, dlid, sl, qpn, qkey))| UdParam {
                    private_data,
                    ah_attr: AhAttr {
                        grh: GlobalRoute {
                            dgid: Gid(gid),
                            flow_label: flow,
                            sgid_index: sgid,
                            hop_limit: hop,
                            traffic_class: sl,
                        },
                        dlid,
                        sl,
                        is_global: true,
                        port_num: 1,
                        ..AhAttr::default()
                    },
                    qp_num: qpn,
                    qkey,
                },
            )
    }

    proptest! {
        /// Any parameters within the limits cross to C and back unchanged, the C
        /// struct pointing at exactly their private data.
        #[test]
        fn conn_params_round_trip(p in any_conn_param()) {
            let c = conn_param_to_c(&p).unwrap();
            prop_assert_eq!(usize::from(c.private_data_len), p.private_data.len());
            // SAFETY: points into p.private_data, alive and unchanged.
            let data = unsafe { private_data(c.private_data, c.private_data_len) };
            prop_assert_eq!(data, &p.private_data[..]);
            prop_assert_eq!(conn_param_from_c(&c, data), p);
        }

        #[test]
        fn ud_params_round_trip(u in any_ud_param()) {
            let c = ud_param_to_c(&u).unwrap();
            // SAFETY: points into u.private_data, alive and unchanged.
            let data = unsafe { private_data(c.private_data, c.private_data_len) };
            prop_assert_eq!(ud_param_from_c(&c, data), u);
        }

        /// An event's parameters land in the member its kind selects.
        #[test]
        fn events_round_trip(
            p in any_conn_param(),
            u in any_ud_param(),
            which in 0..3usize,
            kind in 0..16u32,
            status in any::<i32>(),
        ) {
            let param = vec![CmEventParam::None, CmEventParam::Conn(p), CmEventParam::Ud(u)]
                .swap_remove(which);
            let ev = CmEvent {
                id: CmId(1),
                listen_id: None,
                event: CmEventType::try_from(kind).unwrap(),
                status,
                param,
            };
            let c = cm_event_to_c(&ev, std::ptr::null_mut(), std::ptr::null_mut()).unwrap();
            prop_assert_eq!(cm_event_type_from_c(c.event).unwrap(), ev.event);
            prop_assert_eq!(c.status, status);
            let back = match &ev.param {
                CmEventParam::None => {
                    prop_assert_eq!(c.param.bindgen_union_field, [0; 7]);
                    CmEventParam::None
                }
                CmEventParam::Conn(_) => {
                    let cc = event_conn_param(&c.param);
                    // SAFETY: points into ev's private data.
                    let d = unsafe { private_data(cc.private_data, cc.private_data_len) };
                    CmEventParam::Conn(conn_param_from_c(cc, d))
                }
                CmEventParam::Ud(_) => {
                    let cu = event_ud_param(&c.param);
                    // SAFETY: as above.
                    let d = unsafe { private_data(cu.private_data, cu.private_data_len) };
                    CmEventParam::Ud(ud_param_from_c(cu, d))
                }
            };
            prop_assert_eq!(back, ev.param);
        }
    }
}
