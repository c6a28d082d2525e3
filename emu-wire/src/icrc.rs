//! The invariant CRC (IBTA Annex A17.4), exactly as kernel rxe computes and checks it:
//! CRC-32 (zlib polynomial) over 8 bytes of 0xFF (the masked LRH), the IP header with its
//! variant fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic
//! class, flow label, hop limit), the UDP header with its checksum set to 0xFFFF, the
//! BTH with byte 4 (FECN, BECN, reserved) set to 0xFF, then the rest of the packet up to
//! the ICRC. Stored little-endian in the last 4 bytes. The IPv4 identification field is
//! not masked: it is part of the ICRC.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use crc32fast::Hasher;

use crate::bth;
use crate::error::Result;
use crate::frame::split_frame;
use crate::packet::ICRC_LEN;

/// A fresh CRC-32 hasher. `Hasher::new` asks which CPU features it may use on every
/// call (some 60 instructions, a quarter of a small packet's ICRC); a clone of one made
/// once does not.
fn hasher() -> Hasher {
    static PROTOTYPE: OnceLock<Hasher> = OnceLock::new();
    PROTOTYPE.get_or_init(Hasher::new).clone()
}

/// The IPv4 and UDP fields a RoCEv2 packet's ICRC depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Endpoints {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IPv4 identification (Linux sends 0 on unconnected DF sockets; see roce-wire.md).
    pub ip_id: u16,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

/// The IPv6 and UDP fields a RoCEv2 packet's ICRC depends on. IPv6 has no
/// identification field, so the ICRC of a packet sent over IPv6 depends only on its
/// addresses, ports and length (Annex A17.4 masks traffic class, flow label and hop
/// limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Endpoints {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

/// Copies up to `N` bytes of `src` into a zeroed array; returns it and how many were
/// copied, so that short (malformed) input is hashed as it is instead of panicking.
fn copy_prefix<const N: usize>(src: &[u8]) -> ([u8; N], usize) {
    let mut out = [0u8; N];
    let n = src.len().min(N);
    out[..n].copy_from_slice(&src[..n]);
    (out, n)
}

/// The ICRC over the masked IP header `ip` (already masked), the UDP header and the
/// UDP payload (minus its ICRC). The masked LRH (8 bytes of 0xFF: Annex A17.4, RoCEv2
/// keeps the InfiniBand ICRC definition), the IP, UDP and BTH headers are laid out in
/// one buffer and hashed in one call, then the rest: a CRC call has a fixed cost that
/// five small ones paid five times.
fn crc_masked(ip: &[u8], udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    let mut head = [0xFFu8; 8 + 40 + 8 + bth::HEADER_LEN];
    let mut n = 8;
    let mut put = |bytes: &[u8]| {
        head[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    put(&ip[..ip.len().min(40)]);
    // Annex A17.4: the UDP checksum is a variant field, replaced by all ones.
    let (mut udp, k) = copy_prefix::<8>(udp_header);
    udp[6] = 0xFF;
    udp[7] = 0xFF;
    put(&udp[..k]);
    let end = udp_payload.len().saturating_sub(ICRC_LEN);
    let body = &udp_payload[..end];
    // IBTA 9.2 BTH byte 4 (FECN, BECN, resv6) is variant: all ones in the ICRC.
    let (mut bth, k) = copy_prefix::<{ bth::HEADER_LEN }>(body);
    if k > 4 {
        bth[4] = 0xFF;
    }
    put(&bth[..k]);
    let mut h = hasher();
    h.update(&head[..n]);
    h.update(&body[k..]);
    h.finalize()
}

/// The ICRC of a packet sent over IPv4: `ip_header` is the 20-byte header (no
/// options), `udp_header` the 8-byte UDP header, `udp_payload` the BTH through the ICRC
/// slot (whose content is ignored). Shorter slices never panic; they give a CRC no
/// real packet has.
pub fn icrc_ipv4(ip_header: &[u8], udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    // Annex A17.4 (IPv4): TOS, TTL and header checksum are variant: all ones.
    let (mut ip, n) = copy_prefix::<20>(ip_header);
    ip[1] = 0xFF;
    ip[8] = 0xFF;
    ip[10] = 0xFF;
    ip[11] = 0xFF;
    crc_masked(&ip[..n], udp_header, udp_payload)
}

/// The ICRC of a packet sent over IPv6 (`ip_header` the 40-byte header).
pub fn icrc_ipv6(ip_header: &[u8], udp_header: &[u8], udp_payload: &[u8]) -> u32 {
    // Annex A17.4 (IPv6): traffic class, flow label and hop limit are variant.
    let (mut ip, n) = copy_prefix::<40>(ip_header);
    ip[0] |= 0x0F;
    ip[1] = 0xFF;
    ip[2] = 0xFF;
    ip[3] = 0xFF;
    ip[7] = 0xFF;
    crc_masked(&ip[..n], udp_header, udp_payload)
}

/// The ICRC with the IPv4 and UDP headers a Linux DF sender would build for `ep`
/// ([`ipv4_header`](crate::frame::ipv4_header),
/// [`udp_header`](crate::frame::udp_header)). Every packet sent or received pays this,
/// so the masked headers are laid out in place, without building the real ones first
/// (the IP checksum that [`icrc_ipv4`] would mask anyway costs as much as the CRC of
/// a small packet).
pub fn icrc_for(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> u32 {
    let end = udp_payload.len().saturating_sub(ICRC_LEN);
    let body = &udp_payload[..end];
    let k = body.len().min(bth::HEADER_LEN);
    // Annex A17.4: 8 bytes of 0xFF for the LRH, then the IPv4 header with TOS, TTL
    // and header checksum all ones, the UDP header with its checksum all ones, and
    // the BTH with byte 4 all ones.
    let mut head = [0xFFu8; 8 + 20 + 8 + bth::HEADER_LEN];
    let ip_len = (20 + 8 + udp_payload.len()) as u16;
    let udp_len = (8 + udp_payload.len()) as u16;
    head[8] = 0x45;
    head[10..12].copy_from_slice(&ip_len.to_be_bytes());
    head[12..14].copy_from_slice(&ep.ip_id.to_be_bytes());
    // Flags DF, fragment offset 0; protocol UDP.
    head[14] = 0x40;
    head[15] = 0;
    head[17] = 17;
    head[20..24].copy_from_slice(&ep.src.octets());
    head[24..28].copy_from_slice(&ep.dst.octets());
    head[28..30].copy_from_slice(&ep.src_port.to_be_bytes());
    head[30..32].copy_from_slice(&ep.dst_port.to_be_bytes());
    head[32..34].copy_from_slice(&udp_len.to_be_bytes());
    head[36..36 + k].copy_from_slice(&body[..k]);
    if k > 4 {
        head[36 + 4] = 0xFF;
    }
    let mut h = hasher();
    h.update(&head[..36 + k]);
    h.update(&body[k..]);
    h.finalize()
}

/// The ICRC of a packet sent over IPv6 with the fixed header a Linux sender builds
/// for `ep` (no extension headers, next header UDP; see
/// [`ipv6_header`](crate::frame::ipv6_header)): the masked headers laid out in place, as
/// [`icrc_for`] does for IPv4. Annex A17.4 (IPv6): version kept, traffic class and flow
/// label all ones (bytes 0-3 become `0x6F FF FF FF`), payload length and next header
/// kept, hop limit all ones, both addresses kept.
pub fn icrc_for_v6(ep: &Ipv6Endpoints, udp_payload: &[u8]) -> u32 {
    let end = udp_payload.len().saturating_sub(ICRC_LEN);
    let body = &udp_payload[..end];
    let k = body.len().min(bth::HEADER_LEN);
    let mut head = [0xFFu8; 8 + 40 + 8 + bth::HEADER_LEN];
    let udp_len = (8 + udp_payload.len()) as u16;
    head[8] = 0x6F;
    head[12..14].copy_from_slice(&udp_len.to_be_bytes());
    head[14] = 17;
    head[16..32].copy_from_slice(&ep.src.octets());
    head[32..48].copy_from_slice(&ep.dst.octets());
    head[48..50].copy_from_slice(&ep.src_port.to_be_bytes());
    head[50..52].copy_from_slice(&ep.dst_port.to_be_bytes());
    head[52..54].copy_from_slice(&udp_len.to_be_bytes());
    head[56..56 + k].copy_from_slice(&body[..k]);
    if k > 4 {
        head[56 + 4] = 0xFF;
    }
    let mut h = hasher();
    h.update(&head[..56 + k]);
    h.update(&body[k..]);
    h.finalize()
}

/// [`write_icrc`] for a packet sent over IPv6.
pub fn write_icrc_v6(ep: &Ipv6Endpoints, udp_payload: &mut [u8]) {
    let crc = icrc_for_v6(ep, udp_payload);
    let n = udp_payload.len();
    if n >= ICRC_LEN {
        udp_payload[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// [`check_icrc`] for a packet received over IPv6.
pub fn check_icrc_v6(ep: &Ipv6Endpoints, udp_payload: &[u8]) -> bool {
    stored(udp_payload) == Some(icrc_for_v6(ep, udp_payload))
}

/// Computes the ICRC and stores it little-endian in the last 4 bytes.
pub fn write_icrc(ep: &Ipv4Endpoints, udp_payload: &mut [u8]) {
    let crc = icrc_for(ep, udp_payload);
    let n = udp_payload.len();
    if n >= ICRC_LEN {
        udp_payload[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The ICRC stored little-endian in the last 4 bytes (Annex A17.4), if there are 4.
fn stored(udp_payload: &[u8]) -> Option<u32> {
    match udp_payload {
        [.., a, b, c, d] => Some(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Whether the ICRC stored in the last 4 bytes matches the one computed for `ep`
/// (false when there are fewer than 4 bytes).
pub fn check_icrc(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> bool {
    stored(udp_payload) == Some(icrc_for(ep, udp_payload))
}

/// The IPv4 identification with which the ICRC stored in `udp_payload` is right for
/// `ep`, if any. `ep.ip_id` is the one tried first: a receiver that guesses the
/// sender's ID (the one after its last, for a socket that numbers them) pays no more
/// than [`check_icrc`].
///
/// A receiver holding only a UDP socket sees the addresses and ports but not the IP
/// identification, which the ICRC covers (Annex A17.4 masks TOS, TTL and checksum, not
/// the ID). Linux numbers it per socket or per GSO segment, kernel rxe by its own
/// counter; a CRC is linear, so the ID is solved for instead of assumed: the stored
/// ICRC XOR the one computed with the guess is the CRC, from a zero state, of the two
/// bytes by which the ID differs from the guess, followed by every byte after them
/// (`solve`). The check is then as strong as the 16 bits the ID leaves of the 32: a
/// corrupted packet passes with probability 2^-16 (the UDP checksum, which the kernel
/// or the NIC verified before we see the datagram, covers the same bytes).
pub fn icrc_ip_id(ep: &Ipv4Endpoints, udp_payload: &[u8]) -> Option<u16> {
    let stored = stored(udp_payload)?;
    let delta = stored ^ icrc_for(ep, udp_payload);
    if delta == 0 {
        return Some(ep.ip_id);
    }
    // The CRC runs over 8 bytes of LRH, 20 of IPv4, 8 of UDP and the payload less its
    // ICRC; the ID is bytes 12 and 13 of that, so `18 + len` bytes follow it.
    solve::ip_id(delta, 18 + udp_payload.len()).map(|d| d ^ ep.ip_id)
}

/// Inverting the CRC-32 over the IPv4 identification (see [`icrc_ip_id`]).
///
/// Reflected CRC-32 (zlib's): one byte `b` takes the state `s` to
/// `(s >> 8) ^ T[(s ^ b) & 0xFF]`, with zero init and final XOR in the difference of two
/// CRCs of equal length. The top byte of `T[i]` differs for every `i`, so a step can be
/// undone: the top byte of the new state names `i`. Undoing `n` zero bytes is a linear
/// map, applied as a product of precomputed powers (`n`'s bits), each as four byte
/// tables: a few dozen lookups per packet instead of one step per byte.
mod solve {
    use std::sync::OnceLock;

    /// The reflected CRC-32 polynomial.
    const POLY: u32 = 0xEDB8_8320;
    /// Powers of two of "undo one zero byte" kept: enough for 2^17 - 1 bytes, more than
    /// any IPv4 datagram.
    const POWERS: usize = 17;

    struct Tables {
        /// The byte table `T`.
        t: [u32; 256],
        /// `i` by the top byte of `T[i]`.
        by_top: [u8; 256],
        /// `undo[k][j][b]`: undoing `2^k` zero bytes applied to byte `b` at byte `j`
        /// of the state.
        undo: Vec<[[u32; 256]; 4]>,
    }

    fn tables() -> &'static Tables {
        static TABLES: OnceLock<Tables> = OnceLock::new();
        TABLES.get_or_init(|| {
            let mut t = [0u32; 256];
            for (i, e) in t.iter_mut().enumerate() {
                let mut c = i as u32;
                for _ in 0..8 {
                    c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
                }
                *e = c;
            }
            let mut by_top = [0u8; 256];
            for (i, e) in t.iter().enumerate() {
                by_top[(e >> 24) as usize] = i as u8;
            }
            // The map as the images of the 32 unit vectors; squared for each power.
            let back = |s: u32| -> u32 {
                let i = by_top[(s >> 24) as usize];
                ((s ^ t[i as usize]) << 8) | u32::from(i)
            };
            let apply = |m: &[u32; 32], v: u32| -> u32 {
                (0..32).filter(|j| v >> j & 1 == 1).fold(0, |a, j| a ^ m[j])
            };
            let mut m: [u32; 32] = std::array::from_fn(|j| back(1 << j));
            let mut undo = Vec::with_capacity(POWERS);
            for _ in 0..POWERS {
                let mut tab = [[0u32; 256]; 4];
                for (j, row) in tab.iter_mut().enumerate() {
                    for (b, e) in row.iter_mut().enumerate() {
                        *e = apply(&m, (b as u32) << (8 * j));
                    }
                }
                undo.push(tab);
                m = std::array::from_fn(|j| apply(&m, m[j]));
            }
            Tables { t, by_top, undo }
        })
    }

    /// The two bytes whose CRC from a zero state, followed by `after` zero bytes, is
    /// `delta`, as a big-endian `u16`; `None` when no two bytes give it.
    pub(super) fn ip_id(delta: u32, after: usize) -> Option<u16> {
        let tb = tables();
        let mut v = delta;
        for (k, tab) in tb.undo.iter().enumerate() {
            if after >> k & 1 == 1 {
                v = tab[0][(v & 0xFF) as usize]
                    ^ tab[1][(v >> 8 & 0xFF) as usize]
                    ^ tab[2][(v >> 16 & 0xFF) as usize]
                    ^ tab[3][(v >> 24) as usize];
            }
        }
        if after >> POWERS != 0 {
            return None;
        }
        // `v` is the state after two bytes b0, b1 from zero: (T[b0] >> 8) ^ T[j] with
        // j = (T[b0] ^ b1) & 0xFF.
        let j = tb.by_top[(v >> 24) as usize];
        let high = v ^ tb.t[j as usize];
        let b0 = tb.by_top[(high >> 16 & 0xFF) as usize];
        if tb.t[b0 as usize] >> 8 != high {
            return None;
        }
        let b1 = j ^ (tb.t[b0 as usize] & 0xFF) as u8;
        Some(u16::from_be_bytes([b0, b1]))
    }
}

/// Checks the ICRC of a whole Ethernet II frame carrying IPv4 or IPv6 and UDP; lengths
/// come from the IP and UDP headers (see [`split_frame`]), so captured frames shorter
/// than the Ethernet minimum and padded ones both work. Errors when the frame cannot
/// be split.
pub fn check_icrc_frame(frame: &[u8]) -> Result<bool> {
    let p = split_frame(frame)?;
    let crc = if p.ipv6 {
        icrc_ipv6(p.ip_header, p.udp_header, p.udp_payload)
    } else {
        icrc_ipv4(p.ip_header, p.udp_header, p.udp_payload)
    };
    Ok(stored(p.udp_payload) == Some(crc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{ipv4_header, udp_header};
    use crate::{Opcode, PacketRepr, Psn};

    fn ep() -> Ipv4Endpoints {
        Ipv4Endpoints {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            ip_id: 0,
            src_port: 0xC001,
            dst_port: crate::ROCEV2_PORT,
        }
    }

    fn packet() -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let n = PacketRepr::new(Opcode::RcSendOnly, 0x11, Psn::new(5)).emit(&mut buf, b"hello");
        buf.truncate(n);
        write_icrc(&ep(), &mut buf);
        buf
    }

    #[test]
    fn the_direct_layout_matches_the_built_headers() {
        let eps = [
            ep(),
            Ipv4Endpoints {
                src: Ipv4Addr::new(192, 168, 77, 2),
                dst: Ipv4Addr::new(127, 0, 0, 1),
                ip_id: 0xBEEF,
                src_port: 4791,
                dst_port: 4791,
            },
        ];
        for ep in eps {
            for len in [0, 1, 3, 4, 5, 8, 15, 16, 17, 20, 24, 80, 300, 4112] {
                let p: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
                let ip = ipv4_header(&ep, 8 + p.len());
                let udp = udp_header(&ep, p.len());
                assert_eq!(icrc_for(&ep, &p), icrc_ipv4(&ip, &udp, &p), "{ep:?} {len}");
            }
        }
    }

    #[test]
    fn one_corrupted_payload_byte_fails_the_check() {
        let p = packet();
        assert!(check_icrc(&ep(), &p));
        for i in 12..p.len() - ICRC_LEN {
            let mut q = p.clone();
            q[i] ^= 0x01;
            assert!(!check_icrc(&ep(), &q), "byte {i}");
        }
        // the stored ICRC itself
        let mut q = p.clone();
        q[p.len() - 1] ^= 0x80;
        assert!(!check_icrc(&ep(), &q));
    }

    #[test]
    fn masked_fields_do_not_matter_and_the_others_do() {
        let p = packet();
        // BTH byte 4 (FECN, BECN, resv6) is masked.
        let mut q = p.clone();
        q[4] = 0xFF;
        assert!(check_icrc(&ep(), &q));
        // The rest of the BTH is not (e.g. the PSN, the P_Key).
        for i in [0, 1, 2, 5, 8, 11] {
            let mut q = p.clone();
            q[i] ^= 0x02;
            assert!(!check_icrc(&ep(), &q), "BTH byte {i}");
        }
        // TTL, TOS, IP checksum and UDP checksum are masked; addresses, ports and the IP
        // identification are not.
        let mut frame = crate::build_frame(&ep(), &p);
        assert_eq!(check_icrc_frame(&frame), Ok(true));
        frame[14 + 8] = 3; // TTL
        frame[14 + 1] = 0x02; // TOS (ECN bits)
        frame[14 + 10] ^= 0x55; // IP checksum
        frame[14 + 20 + 6] = 0x12; // UDP checksum
        assert_eq!(check_icrc_frame(&frame), Ok(true));
        for i in [14 + 4, 14 + 12, 14 + 19, 14 + 20, 14 + 23] {
            let mut f = frame.clone();
            f[i] ^= 0x01;
            assert_eq!(check_icrc_frame(&f), Ok(false), "frame byte {i}");
        }
        let mut other = ep();
        other.ip_id = 1;
        assert!(!check_icrc(&other, &p));
    }

    #[test]
    fn the_ip_id_is_solved_from_the_icrc() {
        let mut p = packet();
        assert_eq!(icrc_ip_id(&ep(), &p), Some(0));
        // Whatever the guess, the answer is the same.
        for guess in [1u16, 0x8000, 0xFFFF] {
            let e = Ipv4Endpoints {
                ip_id: guess,
                ..ep()
            };
            assert_eq!(icrc_ip_id(&e, &p), Some(0));
        }
        for len in [0usize, 1, 7, 64, 1000, 4096, 9000, 65_000] {
            let mut q = vec![0u8; 20 + len];
            let n = PacketRepr::new(Opcode::RcSendOnly, 0x11, Psn::new(5))
                .emit(&mut q, &vec![0x5A; len]);
            q.truncate(n);
            for id in [1u16, 2, 0x00FF, 0x0100, 0xBEEF, 0xFFFF] {
                let e = Ipv4Endpoints { ip_id: id, ..ep() };
                write_icrc(&e, &mut q);
                assert_eq!(icrc_ip_id(&ep(), &q), Some(id), "len {len} id {id}");
                // Any one flipped bit elsewhere: either no ID fits, or (2^-16 of
                // corruptions) another one; never the right one.
                q[n / 2] ^= 0x10;
                assert_ne!(icrc_ip_id(&ep(), &q), Some(id), "len {len} id {id}");
                q[n / 2] ^= 0x10;
            }
        }
        // Of many random corruptions of the ICRC, about 2^-16 fit some ID.
        let mut fits = 0;
        for i in 0..20_000u32 {
            let n = p.len();
            let bad = i.wrapping_mul(0x9E37_79B9) | 1;
            let c = u32::from_le_bytes(p[n - 4..].try_into().unwrap());
            p[n - 4..].copy_from_slice(&(c ^ bad).to_le_bytes());
            fits += usize::from(icrc_ip_id(&ep(), &p).is_some());
            p[n - 4..].copy_from_slice(&c.to_le_bytes());
        }
        assert!(fits <= 3, "{fits} of 20000 random ICRCs fit an ID");
        assert_eq!(icrc_ip_id(&ep(), &[1, 2, 3]), None);
    }

    #[test]
    fn short_input_never_panics() {
        for n in 0..16 {
            let b = vec![0xA5u8; n];
            let _ = icrc_ipv4(&b, &b, &b);
            let _ = icrc_ipv6(&b, &b, &b);
            let _ = icrc_for(&ep(), &b);
            let mut m = b.clone();
            write_icrc(&ep(), &mut m);
            assert_eq!(check_icrc(&ep(), &m), n >= ICRC_LEN);
        }
    }

    fn ep6() -> Ipv6Endpoints {
        Ipv6Endpoints {
            src: "fd00::1".parse().unwrap(),
            dst: "fe80::2:3".parse().unwrap(),
            src_port: 0xC001,
            dst_port: crate::ROCEV2_PORT,
        }
    }

    #[test]
    fn the_direct_ipv6_layout_matches_the_built_headers() {
        use crate::frame::{ipv6_header, udp_header_v6};
        for len in [0, 1, 3, 4, 5, 8, 15, 16, 17, 20, 24, 80, 300, 4112] {
            let p: Vec<u8> = (0..len).map(|i| (i * 41 + len) as u8).collect();
            let ep = ep6();
            let ip = ipv6_header(&ep, 8 + p.len());
            let udp = udp_header_v6(&ep, p.len());
            assert_eq!(icrc_for_v6(&ep, &p), icrc_ipv6(&ip, &udp, &p), "{len}");
        }
    }

    #[test]
    fn an_ipv6_packet_checks_only_with_its_own_addresses_and_ports() {
        let mut p = packet();
        write_icrc_v6(&ep6(), &mut p);
        assert!(check_icrc_v6(&ep6(), &p));
        let swapped = Ipv6Endpoints {
            src: ep6().dst,
            dst: ep6().src,
            ..ep6()
        };
        assert!(!check_icrc_v6(&swapped, &p));
        let port = Ipv6Endpoints {
            src_port: 4791,
            ..ep6()
        };
        assert!(!check_icrc_v6(&port, &p));
        // The IPv4-mapped form of the same packet is another ICRC.
        assert!(!check_icrc(&ep(), &p));
        // FECN/BECN (BTH byte 4) stay masked.
        p[4] = 0xC0;
        assert!(check_icrc_v6(&ep6(), &p));
        p[8] ^= 1;
        assert!(!check_icrc_v6(&ep6(), &p));
        assert!(!check_icrc_v6(&ep6(), &[1, 2, 3]));
    }

    #[test]
    fn ipv6_masks_class_flow_and_hop_limit() {
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x60;
        ip6[6] = 17;
        let udp = [0xC0, 0x01, 0x12, 0xB7, 0, 20, 0, 0];
        let p = packet();
        let base = icrc_ipv6(&ip6, &udp, &p);
        let mut v = ip6;
        v[0] = 0x6F;
        v[1] = 0xAB;
        v[3] = 0x01;
        v[7] = 9;
        assert_eq!(icrc_ipv6(&v, &udp, &p), base);
        v[8] ^= 1; // source address
        assert_ne!(icrc_ipv6(&v, &udp, &p), base);
    }
}
