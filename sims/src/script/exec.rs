//! Runs a [`Script`] on a fresh fabric: sets the hosts up as `pair::pair` does, adds
//! the rules, does each step in order, then checks the expectations.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;

use verbs_api::{
    AccessFlags, Ah, AsyncEvent, Device, Mr, Mw, MwBindInfo, MwType, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpParams, QpType, RecvWr, SendFlags, SendWr, SrqAttr, SrqAttrMask, SrqId, UdDest,
    WorkCompletion, WrOperation,
};

use super::expect::{self, Report};
use super::{Act, Bytes, Mem, Op, RecvSpec, Rkey, Script, ScriptOutcome, SendSpec, Side, Want};
use crate::pair::{connect_qp, Host};
use crate::Fabric;

/// A host as the program sees it.
pub(super) struct HostState {
    pub host: Host,
    /// The QP the program uses: the host's own, or one on the SRQ.
    pub qpn: u32,
    pub srq: Option<SrqId>,
    /// On UD, an address handle to each host, by [`Side`] (`None` for itself).
    pub ahs: Vec<Option<Ah>>,
    /// A bound memory window: its rkey, and what keeps it and its region alive.
    pub window: Option<(u32, Mw, Mr)>,
    /// Every completion polled, in order.
    pub completions: Vec<WorkCompletion>,
    /// Every async event, in order.
    pub events: Vec<AsyncEvent>,
}

impl HostState {
    fn dev(&self) -> &dyn Device {
        self.host.ctx.device()
    }
}

/// A counter of `s` by name (see `load::COUNTERS`).
pub(super) fn counter(s: &HostState, name: &str) -> Option<u64> {
    let c = s.host.dev.counters();
    Some(match name {
        "rx_packets" => c.rx_packets,
        "tx_packets" => c.tx_packets,
        "rx_malformed" => c.rx_malformed,
        "rx_unknown_qp" => c.rx_unknown_qp,
        "rx_dropped" => c.rx_dropped,
        "duplicate_requests" => c.duplicate_requests,
        "out_of_sequence" => c.out_of_sequence,
        "uc_dropped_messages" => c.uc_dropped_messages,
        "seq_naks_sent" => c.seq_naks_sent,
        "rnr_naks_sent" => c.rnr_naks_sent,
        "rnr_naks_received" => c.rnr_naks_received,
        "ack_timeouts" => c.ack_timeouts,
        "retransmissions" => c.retransmissions,
        "cq_overruns" => c.cq_overruns,
        "qkey_violations" => c.qkey_violations,
        "bad_pkey" => c.bad_pkey,
        "ud_no_recv_drops" => c.ud_no_recv_drops,
        "rx_port_down" => c.rx_port_down,
        "tx_port_down" => c.tx_port_down,
        "ud_received" => c.ud_received,
        "icrc_errors" => s
            .host
            .dev
            .link_counters()
            .icrc_errors
            .load(Ordering::Relaxed),
        _ => return None,
    })
}

/// Writes `m` into `h`'s memory.
pub(super) fn write_mem(h: &Host, m: &Mem) -> Result<(), String> {
    let r = match &m.bytes {
        Bytes::U64(v) => h.mem.write_u64(m.offset, *v),
        other => h.mem.write(m.offset, &expect::bytes_of(other)),
    };
    r.map_err(|e| format!("write at offset {}: {e}", m.offset))
}

fn setup(s: &Script, f: &Fabric) -> Result<Vec<HostState>, String> {
    let e = |e: verbs_api::Error| e.to_string();
    let cfg = &s.cfg;
    let mut sides = Vec::new();
    for (i, spec) in s.hosts.iter().enumerate() {
        let ip = Ipv4Addr::new(192, 0, 2, i as u8 + 1);
        let host = Host::new(f, &spec.name, ip, cfg);
        let (qpn, srq) = match spec.srq {
            None => (host.qp.qpn(), None),
            Some(max_wr) => {
                let dev = host.ctx.device();
                let srq = dev
                    .create_srq(
                        host.pd.id(),
                        &SrqAttr {
                            max_wr,
                            max_sge: 1,
                            srq_limit: 0,
                        },
                    )
                    .map_err(e)?;
                let qpn = dev
                    .create_qp(
                        &QpInitAttr::new(
                            host.pd.id(),
                            host.cq.id(),
                            QpType::Rc,
                            QpCap::new(cfg.max_send_wr, 0),
                        )
                        .srq(srq)
                        .sq_sig_all(cfg.sq_sig_all),
                    )
                    .map_err(e)?;
                (qpn, Some(srq))
            }
        };
        sides.push(HostState {
            host,
            qpn,
            srq,
            ahs: Vec::new(),
            window: None,
            completions: Vec::new(),
            events: Vec::new(),
        });
    }
    let gids = sides
        .iter()
        .map(|h| h.dev().query_gid(1, 0).map_err(e))
        .collect::<Result<Vec<_>, _>>()?;
    let ud = cfg.qp_type == QpType::Ud;
    for (i, spec) in s.hosts.iter().enumerate() {
        // An RC or UC QP without a peer stays in RESET; a UD QP needs none.
        let peer = match spec.peer {
            Some(p) => p,
            None if ud => i,
            None => continue,
        };
        connect_qp(
            sides[i].dev(),
            sides[i].qpn,
            gids[peer],
            sides[peer].qpn,
            cfg,
        );
    }
    if ud {
        // An address handle from every host to every other.
        for (i, side) in sides.iter_mut().enumerate() {
            for (j, gid) in gids.iter().enumerate() {
                side.ahs.push(if i == j {
                    None
                } else {
                    let attr = QpParams::default().ah_attr(*gid);
                    Some(side.host.pd.create_ah(&attr).map_err(e)?)
                });
            }
        }
    }
    Ok(sides)
}

pub(super) fn run(s: &Script, seed: u64) -> ScriptOutcome {
    let f = Fabric::new(seed);
    let mut report = Report::new(&s.file);
    match setup(s, &f) {
        Err(e) => report.error = Some(format!("setting up the hosts: {e}")),
        Ok(mut sides) => {
            let qpns: Vec<u32> = sides.iter().map(|h| h.qpn).collect();
            for r in &s.rules {
                let qpn_of = |h: &str| s.hosts.iter().position(|x| x.name == h).map(|i| qpns[i]);
                match r.spec.rule(r.verb, &r.text, qpn_of) {
                    Ok(rule) => {
                        f.add_rule(match &r.name {
                            Some(n) => rule.renamed(n),
                            None => rule,
                        });
                    }
                    Err(e) => {
                        report.error = Some(at(s, r.line, &e));
                        break;
                    }
                }
            }
            if report.error.is_none() {
                for st in &s.steps {
                    if let Err(e) = step(s, &f, &mut sides, &st.act) {
                        report.error = Some(at(s, Some(st.line), &e));
                        break;
                    }
                }
            }
            for (i, side) in sides.iter_mut().enumerate() {
                // Reading the events lets the network run until it is quiet, so they
                // are read only where the file expects some.
                let wants_events = s
                    .expect
                    .iter()
                    .any(|e| matches!(e.want, Want::Events(h, _) if h == i));
                if wants_events {
                    side.events.extend(side.host.events());
                }
            }
            expect::check(s, &f.trace(), &sides, &mut report);
        }
    }
    ScriptOutcome {
        trace: f.trace(),
        report,
    }
}

fn at(s: &Script, line: Option<usize>, e: &str) -> String {
    match line {
        Some(l) => format!("{}:{l}: {e}", s.file),
        None => format!("{}: {e}", s.file),
    }
}

fn recv_wrs(h: &Host, r: &[RecvSpec]) -> Vec<RecvWr> {
    r.iter()
        .map(|r| RecvWr::new(r.wr_id, vec![h.sge(r.offset, r.len)]))
        .collect()
}

fn send_wr(s: &Script, sides: &[HostState], me: Side, w: &SendSpec) -> Result<SendWr, String> {
    let (my, peer) = (&sides[me], &sides[w.to]);
    let h = &my.host;
    if let Some(t) = &w.text {
        h.mem
            .write(w.offset as usize, t)
            .map_err(|e| format!("text at offset {}: {e}", w.offset))?;
    }
    let sge = h.sge(w.offset, w.len);
    let window = || {
        peer.window
            .as_ref()
            .map(|(k, _, _)| *k)
            .ok_or_else(|| format!("host {} bound no window (bind_mw)", s.hosts[w.to].name))
    };
    let rkey = match w.rkey {
        Rkey::Mr => peer.host.rkey(),
        Rkey::Wrong => peer.host.rkey() ^ 0x100,
        Rkey::Window => window()?,
    };
    let raddr = peer.host.addr(w.remote_offset);
    let mut wr = match w.op {
        Op::Send => SendWr::send(w.wr_id, vec![sge]),
        Op::SendWithInv => SendWr::new(
            w.wr_id,
            vec![sge],
            WrOperation::SendWithInv {
                invalidate_rkey: window()?,
            },
        ),
        Op::Write => SendWr::rdma_write(w.wr_id, vec![sge], raddr, rkey),
        Op::Read => SendWr::rdma_read(w.wr_id, vec![sge], raddr, rkey),
        Op::FetchAdd => SendWr::atomic_fetch_add(w.wr_id, sge, raddr, rkey, w.add),
        Op::CmpSwap => SendWr::atomic_cmp_swp(w.wr_id, sge, raddr, rkey, w.compare, w.swap),
    };
    if w.fence {
        wr.send_flags |= SendFlags::FENCE;
    }
    if w.signaled {
        wr.send_flags |= SendFlags::SIGNALED;
    }
    if let Some(Some(ah)) = my.ahs.get(w.to) {
        wr = wr.with_ud(UdDest {
            ah: ah.id(),
            remote_qpn: peer.qpn,
            remote_qkey: w.qkey.unwrap_or(QpParams::default().qkey),
        });
    }
    Ok(wr)
}

fn step(s: &Script, f: &Fabric, sides: &mut [HostState], act: &Act) -> Result<(), String> {
    let name = |h: &Side| s.hosts[*h].name.as_str();
    let e = |e: verbs_api::Error| e.to_string();
    match act {
        Act::PostSend(me, wrs) => {
            let wrs = wrs
                .iter()
                .map(|w| send_wr(s, sides, *me, w))
                .collect::<Result<Vec<_>, _>>()?;
            let s = &sides[*me];
            s.dev()
                .post_send(s.qpn, &wrs)
                .map_err(|e| format!("post_send: {e}"))
        }
        Act::PostRecv(me, r) => {
            let s = &sides[*me];
            s.dev()
                .post_recv(s.qpn, &recv_wrs(&s.host, r))
                .map_err(|e| format!("post_recv: {e}"))
        }
        Act::PostSrqRecv(me, r) => {
            let s = &sides[*me];
            let srq = s.srq.ok_or("no SRQ")?;
            s.dev()
                .post_srq_recv(srq, &recv_wrs(&s.host, r))
                .map_err(|e| format!("post_srq_recv: {e}"))
        }
        Act::Wait(me, n) => {
            let got = sides[*me].host.wait(*n);
            sides[*me].completions.extend(got);
            Ok(())
        }
        Act::RunFor(d) => {
            f.run_for(*d);
            Ok(())
        }
        Act::Run(d) => {
            f.run(*d);
            Ok(())
        }
        Act::ModifyQp(me, state) => {
            let s = &sides[*me];
            let attr = QpAttr {
                qp_state: *state,
                ..QpAttr::default()
            };
            s.dev()
                .modify_qp(s.qpn, &attr, QpAttrMask::STATE)
                .map_err(|e| format!("modify_qp to {state}: {e}"))
        }
        Act::ArmSrq(me, limit) => {
            let s = &sides[*me];
            let attr = SrqAttr {
                srq_limit: *limit,
                ..SrqAttr::default()
            };
            s.dev()
                .modify_srq(s.srq.ok_or("no SRQ")?, &attr, SrqAttrMask::LIMIT)
                .map_err(|e| format!("arm_srq: {e}"))
        }
        Act::Write(me, m) => write_mem(&sides[*me].host, m),
        Act::BindMw {
            side,
            wr_id,
            offset,
            len,
            key,
        } => {
            let s = &mut sides[*side];
            let h = &s.host;
            // A window lies in a region registered with MW_BIND (IBTA 10.6.7.2).
            let bindable =
                h.pd.reg_mr(
                    &h.mem,
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::MW_BIND,
                )
                .map_err(e)?;
            let (mw, rkey0) = h.pd.alloc_mw(MwType::Type2).map_err(e)?;
            // A type 2 window's rkey keeps its index (upper 24 bits) and takes a new
            // key byte (IBTA 10.6.7.2.3).
            let rkey = (rkey0 & !0xFF) | u32::from(*key);
            let bind_info = MwBindInfo {
                mr_lkey: bindable.lkey(),
                addr: h.addr(*offset),
                length: *len,
                mw_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            };
            let wr = SendWr::new(
                *wr_id,
                vec![],
                WrOperation::BindMw {
                    mw_rkey: rkey0,
                    new_rkey: rkey,
                    bind_info,
                },
            );
            s.dev()
                .post_send(s.qpn, &[wr])
                .map_err(|e| format!("bind_mw: {e}"))?;
            s.window = Some((rkey, mw, bindable));
            Ok(())
        }
        Act::Partition(x, y) => f.partition(name(x), name(y)).map_err(|e| e.to_string()),
        Act::Link(x, y, cfg) => f
            .set_link(name(x), name(y), *cfg)
            .map_err(|e| e.to_string()),
    }
}
