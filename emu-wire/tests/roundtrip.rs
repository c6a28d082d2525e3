//! Properties of the packet codec: for every opcode and arbitrary field values and
//! payloads, `parse(emit(repr)) == repr`; arbitrary bytes and mutations of valid packets
//! parse to `Ok` or `Err`, never a panic.

use emu_wire::*;
use proptest::prelude::*;

fn arb_repr() -> impl Strategy<Value = (PacketRepr, Vec<u8>)> {
    (
        proptest::sample::select(Opcode::ALL.to_vec()),
        any::<(bool, bool, u16, bool, bool, u32, bool, u32)>(),
        any::<(u64, u32, u32, u64, u64, u32, u32)>(),
        (0u8..0x20, 0u8..3, 0u8..5, 0u32..1 << 24),
        proptest::collection::vec(any::<u8>(), 0..4096),
    )
        .prop_map(
            |(
                op,
                (se, m, pkey, fecn, becn, qp, ack, psn),
                (va, rkey, len, a, b, imm, src),
                (timer, kind, nak, msn),
                payload,
            )| {
                let mut r = PacketRepr::new(op, qp & 0xFF_FFFF, Psn::new(psn));
                r.bth.solicited = se;
                r.bth.mig_req = m;
                r.bth.pkey = pkey;
                r.bth.fecn = fecn;
                r.bth.becn = becn;
                r.bth.ack_req = ack;
                if r.reth.is_some() {
                    r.reth = Some(RethRepr {
                        va,
                        rkey,
                        dma_len: len,
                    });
                }
                if r.feth.is_some() {
                    // Every value the two fields can hold, reserved ones included.
                    r.feth = Some(FethRepr {
                        placement_type: (a & 0x0F) as u8,
                        selectivity_level: ((a >> 4) & 0x03) as u8,
                    });
                }
                if r.atomic_eth.is_some() {
                    r.atomic_eth = Some(AtomicEthRepr {
                        va,
                        rkey,
                        swap_add: a,
                        compare: b,
                    });
                }
                if r.atomic_ack_eth.is_some() {
                    r.atomic_ack_eth = Some(AtomicAckEthRepr { orig: a });
                }
                if r.aeth.is_some() {
                    let syndrome = match kind {
                        0 => Syndrome::Ack { credits: timer },
                        1 => Syndrome::RnrNak { timer },
                        _ => Syndrome::Nak(
                            [
                                NakCode::PsnSequenceError,
                                NakCode::InvalidRequest,
                                NakCode::RemoteAccessError,
                                NakCode::RemoteOperationalError,
                                NakCode::InvalidRdRequest,
                            ][nak as usize],
                        ),
                    };
                    r.aeth = Some(AethRepr { syndrome, msn });
                }
                if r.imm_dt.is_some() {
                    r.imm_dt = Some(imm);
                }
                if r.ieth.is_some() {
                    r.ieth = Some(rkey);
                }
                if r.xrceth.is_some() {
                    r.xrceth = Some(XrcEthRepr {
                        xrc_srqn: src & 0xFF_FFFF,
                    });
                }
                if r.deth.is_some() {
                    r.deth = Some(DethRepr {
                        qkey: imm,
                        src_qp: src & 0xFF_FFFF,
                    });
                }
                let payload = if op.has_payload() {
                    payload
                } else {
                    Vec::new()
                };
                r.bth.pad_count = pad_count(payload.len());
                (r, payload)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parse_inverts_emit((repr, payload) in arb_repr()) {
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut buf, &payload);
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(n % 4, 0);
        let (back, got) = PacketRepr::parse(&buf).unwrap();
        prop_assert_eq!(back, repr);
        prop_assert_eq!(got, &payload[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = PacketRepr::parse(&bytes);
        let _ = check_icrc_frame(&bytes);
        let _ = GrhRepr::parse(&GrhPacket::new_unchecked(&bytes));
        let _ = split_frame(&bytes);
    }

    /// What parses as a GRH re-emits to bytes that parse the same (the fuzzer found a
    /// GRH with version 4 in byte 0 that did not).
    #[test]
    fn grh_parse_emit_parse(mut bytes in proptest::collection::vec(any::<u8>(), 40), v4 in any::<bool>()) {
        if v4 {
            bytes[..20].fill(0);
            bytes[20] = 0x45;
        }
        if let Ok(grh) = GrhRepr::parse(&GrhPacket::new_unchecked(&bytes)) {
            let mut buf = [0u8; 40];
            grh.emit(&mut GrhPacket::new_unchecked(&mut buf[..]));
            prop_assert_eq!(GrhRepr::parse(&GrhPacket::new_unchecked(&buf[..])), Ok(grh));
            if v4 {
                prop_assert_eq!(grh.ip_version, 4);
            }
        }
    }

    #[test]
    fn mutated_packets_never_panic((repr, payload) in arb_repr(), at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        repr.emit(&mut buf, &payload);
        let i = at % buf.len();
        buf[i] = byte;
        let _ = PacketRepr::parse(&buf);
        let keep = cut % (buf.len() + 1);
        let _ = PacketRepr::parse(&buf[..keep]);
    }

    #[test]
    fn icrc_round_trip(payload in proptest::collection::vec(any::<u8>(), 16..300), id in any::<u16>(), flip in any::<usize>()) {
        let ep = Ipv4Endpoints { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), ip_id: id, src_port: 49152, dst_port: 4791 };
        let mut p = payload.clone();
        write_icrc(&ep, &mut p);
        prop_assert!(check_icrc(&ep, &p));
        prop_assert!(check_icrc_frame(&build_frame(&ep, &p)).unwrap());
        // A bit flip anywhere outside the masked BTH byte 4 and the ICRC itself is caught.
        let i = flip % (p.len() - 4);
        if i != 4 {
            p[i] ^= 0x10;
            prop_assert!(!check_icrc(&ep, &p));
        }
    }

    /// Over IPv6: the ICRC written for two addresses checks in the frame built for them
    /// and nowhere else.
    #[test]
    fn icrc_v6_round_trip(payload in proptest::collection::vec(any::<u8>(), 16..300), src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(), port in any::<u16>(), flip in any::<usize>()) {
        let ep = Ipv6Endpoints { src: src.into(), dst: dst.into(), src_port: port, dst_port: 4791 };
        let mut p = payload.clone();
        write_icrc_v6(&ep, &mut p);
        prop_assert!(check_icrc_v6(&ep, &p));
        prop_assert!(check_icrc_frame(&build_frame_v6(&ep, &p)).unwrap());
        let i = flip % (p.len() - 4);
        if i != 4 {
            p[i] ^= 0x10;
            prop_assert!(!check_icrc_v6(&ep, &p));
        }
    }

    /// The IP ID a packet's ICRC was computed with is solved from it, whatever ID the
    /// receiver tries first.
    #[test]
    fn the_ip_id_is_solved_whatever_the_guess(payload in proptest::collection::vec(any::<u8>(), 4..9000), id in any::<u16>(), guess in any::<u16>()) {
        let ep = Ipv4Endpoints { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), ip_id: id, src_port: 49152, dst_port: 4791 };
        let mut p = payload;
        write_icrc(&ep, &mut p);
        prop_assert_eq!(icrc_ip_id(&Ipv4Endpoints { ip_id: guess, ..ep }, &p), Some(id));
    }
}
