//! From the TOML a file holds to a checked [`Script`]: every name, number and rule is
//! checked here, before anything runs, and every error names its line.

use std::ops::Range;

use emu_core::engine::upper_snake;
use toml::Spanned;
use verbs_api::{AsyncEventType, Mtu, QpState, QpType, WcStatus};

use super::format::{RawExpect, RawFile, RawHostExpect, RawMem, RawQp, RawRule, RawStep};
use super::spec::{parse_duration, Spec, Verb};
use super::{
    Act, Bytes, Expectation, FileError, HostSpec, Mem, Op, RecvSpec, Rkey, RuleLine, Script,
    SendSpec, Side, Step, Want,
};
use crate::pair::PairConfig;
use crate::LinkConfig;

/// The counters `[expect.HOST] counters` may name: the engine's
/// (`emu_core::engine::Counters`) and the link's ICRC errors.
pub(crate) const COUNTERS: [&str; 21] = [
    "rx_packets",
    "tx_packets",
    "rx_malformed",
    "rx_unknown_qp",
    "rx_dropped",
    "duplicate_requests",
    "out_of_sequence",
    "uc_dropped_messages",
    "seq_naks_sent",
    "rnr_naks_sent",
    "rnr_naks_received",
    "ack_timeouts",
    "retransmissions",
    "cq_overruns",
    "qkey_violations",
    "bad_pkey",
    "ud_no_recv_drops",
    "rx_port_down",
    "tx_port_down",
    "ud_received",
    "icrc_errors",
];

/// The most hosts a file may have (192.0.2.1 to 192.0.2.8).
pub(crate) const MAX_HOSTS: usize = 8;

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    /// The hosts' names, by [`Side`].
    names: Vec<String>,
}

impl Ctx<'_> {
    fn side(&self, name: &str) -> Option<Side> {
        self.names.iter().position(|h| h == name)
    }

    /// The host called `name`, or an error at `span` naming the hosts there are.
    fn host(&self, name: &str, span: Range<usize>) -> Result<Side, FileError> {
        self.side(name).ok_or_else(|| {
            self.err(
                span,
                format!("no host {name:?}: the hosts are {}", self.names.join(", ")),
            )
        })
    }

    fn line(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text[..end].matches('\n').count() + 1
    }

    fn err(&self, span: Range<usize>, message: impl Into<String>) -> FileError {
        FileError {
            file: self.file.to_owned(),
            line: Some(self.line(span)),
            message: message.into(),
        }
    }
}

/// A name among `names` by its upper snake case (`RNR_RETRY_EXC_ERR`).
fn by_name<T: Copy + std::fmt::Debug>(all: &[T], name: &str) -> Option<T> {
    let want = name.trim().to_ascii_uppercase();
    all.iter()
        .copied()
        .find(|v| upper_snake(&format!("{v:?}")) == want)
}

fn names<T: std::fmt::Debug>(all: &[T]) -> String {
    let v: Vec<String> = all.iter().map(|x| upper_snake(&format!("{x:?}"))).collect();
    v.join(", ")
}

pub(super) fn load(file: &str, text: &str) -> Result<Script, FileError> {
    let mut cx = Ctx {
        file,
        text,
        names: Vec::new(),
    };
    let raw: RawFile = toml::from_str(text).map_err(|e| FileError {
        file: file.to_owned(),
        line: e.span().map(|s| cx.line(s)),
        message: e.message().trim().to_owned(),
    })?;
    let name = raw.name.get_ref().trim().to_owned();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(cx.err(raw.name.span(), "the name is one word (e.g. my-experiment)"));
    }
    let cfg = qp_config(&cx, raw.qp.as_ref())?;
    // a and b always, then the hosts [hosts.NAME] adds, in name order.
    cx.names = vec!["a".to_owned(), "b".to_owned()];
    for (host, h) in &raw.hosts {
        if cx.side(host).is_some() {
            continue;
        }
        let word = host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !word || host == "packets" || host == "all" {
            return Err(cx.err(h.span(), format!("{host:?} cannot name a host")));
        }
        cx.names.push(host.clone());
    }
    if cx.names.len() > MAX_HOSTS {
        return Err(cx.err(0..0, format!("at most {MAX_HOSTS} hosts")));
    }
    let hosts = host_specs(&cx, &raw, &cfg)?;
    let mut rules = Vec::new();
    for r in &raw.rule {
        rules.push(rule(&cx, r)?);
    }
    let mut steps = Vec::new();
    for s in &raw.step {
        steps.push(step(&cx, s, &cfg, &hosts)?);
    }
    let expect = expectations(&cx, &raw.expect)?;
    Ok(Script {
        name,
        description: raw.description.trim().to_owned(),
        file: file.to_owned(),
        cfg,
        hosts,
        rules,
        steps,
        expect,
    })
}

/// Each host's SRQ and peer: a and b are each other's unless a file says otherwise;
/// an RC or UC QP's peer must name it back, as both ends of a connection do.
fn host_specs(cx: &Ctx<'_>, raw: &RawFile, cfg: &PairConfig) -> Result<Vec<HostSpec>, FileError> {
    let mut hosts: Vec<HostSpec> = cx
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| HostSpec {
            name: n.clone(),
            peer: match i {
                0 => Some(1),
                1 => Some(0),
                _ => None,
            },
            srq: None,
        })
        .collect();
    let mut lines = vec![None; hosts.len()];
    for (name, h) in &raw.hosts {
        let i = cx.host(name, h.span())?;
        lines[i] = Some(h.span());
        if let Some(q) = &h.get_ref().srq {
            if cfg.qp_type != QpType::Rc {
                return Err(cx.err(h.span(), "an SRQ here serves an RC QP"));
            }
            hosts[i].srq = Some(q.max_wr);
        }
        if let Some(p) = &h.get_ref().peer {
            let peer = cx.host(p.get_ref(), p.span())?;
            if peer == i {
                return Err(cx.err(p.span(), "a host is not its own peer"));
            }
            hosts[i].peer = Some(peer);
        }
    }
    if cfg.qp_type != QpType::Ud {
        for i in 0..hosts.len() {
            if let Some(p) = hosts[i].peer {
                if hosts[p].peer != Some(i) {
                    let span = lines[i].clone().or(lines[p].clone()).unwrap_or(0..0);
                    return Err(cx.err(
                        span,
                        format!(
                            "{}'s QP is connected to {}, so {}'s must be connected to {}: give [hosts.{}] peer = {:?}",
                            hosts[i].name, hosts[p].name, hosts[p].name, hosts[i].name, hosts[p].name, hosts[i].name
                        ),
                    ));
                }
            }
        }
    }
    Ok(hosts)
}

fn qp_config(cx: &Ctx<'_>, qp: Option<&Spanned<RawQp>>) -> Result<PairConfig, FileError> {
    let mut cfg = PairConfig::default();
    let Some(qp) = qp else { return Ok(cfg) };
    let q = qp.get_ref();
    if let Some(t) = &q.qp_type {
        cfg.qp_type = match t.get_ref().to_ascii_uppercase().as_str() {
            "RC" => QpType::Rc,
            "UC" => QpType::Uc,
            "UD" => QpType::Ud,
            other => return Err(cx.err(t.span(), format!("type {other:?}: RC, UC or UD"))),
        };
    }
    if let Some(m) = &q.path_mtu {
        cfg.path_mtu = match *m.get_ref() {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            n => {
                return Err(cx.err(
                    m.span(),
                    format!("path_mtu {n}: 256, 512, 1024, 2048 or 4096"),
                ))
            }
        };
    }
    // The 5-bit and 3-bit fields of the QP context (IBTA 9.7.6.1.3, 9.7.5.2.8).
    let codes = [
        ("timeout", &q.timeout, 31, &mut cfg.timeout),
        ("retry_cnt", &q.retry_cnt, 7, &mut cfg.retry_cnt),
        ("rnr_retry", &q.rnr_retry, 7, &mut cfg.rnr_retry),
        (
            "min_rnr_timer",
            &q.min_rnr_timer,
            31,
            &mut cfg.min_rnr_timer,
        ),
    ];
    for (what, v, max, field) in codes {
        if let Some(v) = v {
            if *v.get_ref() > max {
                return Err(cx.err(v.span(), format!("{what} is at most {max}")));
            }
            *field = *v.get_ref();
        }
    }
    cfg.rd_atomic = q.rd_atomic.unwrap_or(cfg.rd_atomic);
    cfg.cq_size = q.cq_size.unwrap_or(cfg.cq_size);
    cfg.max_send_wr = q.max_send_wr.unwrap_or(cfg.max_send_wr);
    cfg.max_recv_wr = q.max_recv_wr.unwrap_or(cfg.max_recv_wr);
    cfg.sq_sig_all = q.sq_sig_all.unwrap_or(cfg.sq_sig_all);
    cfg.psn = q.psn.unwrap_or(cfg.psn);
    Ok(cfg)
}

/// Checks what a rule's spec names beyond its syntax: hosts, and the verb's own
/// parameters (by building the rule against dummy QP numbers).
pub(super) fn check_rule(
    spec: &Spec,
    verb: Verb,
    text: &str,
    names: &[&str],
) -> Result<(), String> {
    if let Some(h) = spec.hosts().find(|h| !names.contains(h)) {
        return Err(format!("no host {h:?}: the hosts are {}", names.join(", ")));
    }
    spec.rule(verb, text, |_| Some(0)).map(|_| ())
}

fn rule(cx: &Ctx<'_>, r: &Spanned<RawRule>) -> Result<RuleLine, FileError> {
    let x = r.get_ref();
    let given: Vec<(Verb, &Spanned<String>)> = [
        (Verb::Drop, &x.drop),
        (Verb::Duplicate, &x.duplicate),
        (Verb::Delay, &x.delay),
        (Verb::Corrupt, &x.corrupt),
        (Verb::RnrNak, &x.rnr_nak),
        (Verb::Truncate, &x.truncate),
    ]
    .into_iter()
    .filter_map(|(v, t)| t.as_ref().map(|t| (v, t)))
    .collect();
    let [(verb, text)] = given[..] else {
        return Err(cx.err(
            r.span(),
            "a [[rule]] has exactly one of drop, duplicate, delay, corrupt, rnr_nak, truncate",
        ));
    };
    let spec = Spec::parse(text.get_ref()).map_err(|e| cx.err(text.span(), e))?;
    let names: Vec<&str> = cx.names.iter().map(String::as_str).collect();
    check_rule(&spec, verb, text.get_ref(), &names).map_err(|e| cx.err(text.span(), e))?;
    Ok(RuleLine {
        verb,
        text: text.get_ref().clone(),
        spec,
        name: x.name.clone(),
        line: Some(cx.line(text.span())),
    })
}

fn duration(cx: &Ctx<'_>, d: &Spanned<String>) -> Result<std::time::Duration, FileError> {
    parse_duration(d.get_ref()).map_err(|e| cx.err(d.span(), e))
}

fn step(
    cx: &Ctx<'_>,
    s: &Spanned<RawStep>,
    cfg: &PairConfig,
    hosts: &[HostSpec],
) -> Result<Step, FileError> {
    let span = s.span();
    let x = s.get_ref();
    let on = match &x.on {
        Some(h) => Some(cx.host(h.get_ref(), h.span())?),
        None => None,
    };
    let host =
        |verb: &str| on.ok_or_else(|| cx.err(span.clone(), format!("{verb} needs on = \"HOST\"")));
    let mut acts = Vec::new();
    if let Some(wrs) = &x.post_send {
        let side = host("post_send")?;
        let mut v = Vec::new();
        for w in wrs {
            v.push(send(cx, w, cfg, side, hosts)?);
        }
        acts.push(Act::PostSend(side, v));
    }
    let recvs = |r: &[super::format::RawRecv]| -> Vec<RecvSpec> {
        r.iter()
            .map(|r| RecvSpec {
                wr_id: r.wr_id,
                offset: r.offset,
                len: r.len,
            })
            .collect()
    };
    if let Some(r) = &x.post_recv {
        acts.push(Act::PostRecv(host("post_recv")?, recvs(r)));
    }
    if let Some(r) = &x.post_srq_recv {
        let side = host("post_srq_recv")?;
        if hosts[side].srq.is_none() {
            let n = &hosts[side].name;
            return Err(cx.err(
                span,
                format!("host {n} has no SRQ ([hosts.{n}] srq = {{ max_wr = N }})"),
            ));
        }
        acts.push(Act::PostSrqRecv(side, recvs(r)));
    }
    if let Some(n) = x.wait {
        acts.push(Act::Wait(host("wait")?, n));
    }
    if let Some(d) = &x.run_for {
        acts.push(Act::RunFor(duration(cx, d)?));
    }
    if let Some(d) = &x.run {
        acts.push(Act::Run(duration(cx, d)?));
    }
    if let Some(st) = &x.modify_qp {
        let side = host("modify_qp")?;
        let state = by_name(QpState::ALL, st.get_ref()).ok_or_else(|| {
            cx.err(
                st.span(),
                format!("no QP state {:?} ({})", st.get_ref(), names(QpState::ALL)),
            )
        })?;
        acts.push(Act::ModifyQp(side, state));
    }
    if let Some(limit) = x.arm_srq {
        let side = host("arm_srq")?;
        if hosts[side].srq.is_none() {
            return Err(cx.err(span, format!("host {} has no SRQ", hosts[side].name)));
        }
        acts.push(Act::ArmSrq(side, limit));
    }
    if let Some(m) = &x.write {
        acts.push(Act::Write(host("write")?, mem(cx, m)?));
    }
    if let Some(b) = &x.bind_mw {
        if cfg.qp_type != QpType::Rc {
            return Err(cx.err(span, "bind_mw posts a BIND_MW work request: an RC QP's"));
        }
        acts.push(Act::BindMw {
            side: host("bind_mw")?,
            wr_id: b.wr_id,
            offset: b.offset,
            len: b.len,
            key: b.key,
        });
    }
    if let Some(p) = &x.partition {
        let (h1, h2) = two_hosts(cx, p.get_ref(), p.span())?;
        acts.push(Act::Partition(h1, h2));
    }
    if let Some(ls) = &x.link {
        let l = ls.get_ref();
        let (h1, h2) = match &l.between {
            Some(b) => two_hosts(cx, b, ls.span())?,
            None => (0, 1),
        };
        if !(0.0..=1.0).contains(&l.loss) {
            return Err(cx.err(span, "link loss is a share between 0 and 1"));
        }
        let mut link = LinkConfig {
            loss: l.loss,
            ..LinkConfig::default()
        };
        if let Some(j) = &l.jitter {
            link.jitter = duration(cx, j)?;
        }
        if let Some(d) = &l.latency {
            link.latency = duration(cx, d)?;
        }
        acts.push(Act::Link(h1, h2, link));
    }
    let global = matches!(
        acts.first(),
        Some(Act::RunFor(_) | Act::Run(_) | Act::Partition(..) | Act::Link(..))
    );
    if let (true, Some(h)) = (global, &x.on) {
        return Err(cx.err(
            h.span(),
            "run_for, run, partition and link act on the fabric: they take no on =",
        ));
    }
    match acts.len() {
        1 => Ok(Step {
            line: cx.line(span),
            act: acts.remove(0),
        }),
        0 => Err(cx.err(span, "a [[step]] does one thing: post_send, post_recv, post_srq_recv, wait, run_for, run, modify_qp, arm_srq, write, bind_mw, partition or link")),
        _ => Err(cx.err(span, "a [[step]] does one thing only: split it in two")),
    }
}

/// `["a", "c"]`: two different hosts.
fn two_hosts(cx: &Ctx<'_>, v: &[String], span: Range<usize>) -> Result<(Side, Side), FileError> {
    match v {
        [x, y] if x != y => Ok((cx.host(x, span.clone())?, cx.host(y, span)?)),
        _ => Err(cx.err(span, "name two different hosts, e.g. [\"a\", \"b\"]")),
    }
}

fn send(
    cx: &Ctx<'_>,
    w: &Spanned<super::format::RawSend>,
    cfg: &PairConfig,
    me: Side,
    hosts: &[HostSpec],
) -> Result<SendSpec, FileError> {
    let x = w.get_ref();
    let to = match (&x.to, hosts[me].peer) {
        (Some(t), peer) => {
            let to = cx.host(t.get_ref(), t.span())?;
            if cfg.qp_type != QpType::Ud && Some(to) != peer {
                let connected = peer.map_or("no host", |p| hosts[p].name.as_str());
                return Err(cx.err(
                    t.span(),
                    format!(
                        "{}'s QP is connected to {connected}: an RC or UC WR goes there",
                        hosts[me].name
                    ),
                ));
            }
            to
        }
        (None, Some(peer)) => peer,
        (None, None) => {
            return Err(cx.err(
                w.span(),
                format!(
                    "host {0} has no peer: give to = \"HOST\" (UD) or [hosts.{0}] peer",
                    hosts[me].name
                ),
            ))
        }
    };
    if to == me {
        return Err(cx.err(w.span(), "a host does not send to itself here"));
    }
    let op = match x.op.get_ref().to_ascii_uppercase().as_str() {
        "SEND" => Op::Send,
        "SEND_WITH_INV" => Op::SendWithInv,
        "WRITE" | "RDMA_WRITE" => Op::Write,
        "READ" | "RDMA_READ" => Op::Read,
        "FETCH_ADD" => Op::FetchAdd,
        "CMP_SWAP" => Op::CmpSwap,
        other => {
            return Err(cx.err(
                x.op.span(),
                format!("op {other:?}: SEND, SEND_WITH_INV, WRITE, READ, FETCH_ADD or CMP_SWAP"),
            ))
        }
    };
    let ud = cfg.qp_type == QpType::Ud;
    if ud && op != Op::Send {
        return Err(cx.err(x.op.span(), "a UD QP only SENDs (IBTA 9.8)"));
    }
    if cfg.qp_type == QpType::Uc && matches!(op, Op::Read | Op::FetchAdd | Op::CmpSwap) {
        return Err(cx.err(x.op.span(), "UC has no READ or atomics (IBTA 9.8)"));
    }
    if x.qkey.is_some() && !ud {
        return Err(cx.err(w.span(), "qkey= is for UD SENDs"));
    }
    let atomic = matches!(op, Op::FetchAdd | Op::CmpSwap);
    let len = match (x.len, &x.text) {
        (Some(l), _) => l,
        (None, Some(t)) => t.len() as u32,
        (None, None) if atomic => 8,
        (None, None) => {
            return Err(cx.err(w.span(), "a work request needs len = N or text = \"...\""))
        }
    };
    if atomic && len != 8 {
        return Err(cx.err(w.span(), "an atomic's result is 8 bytes (len = 8)"));
    }
    let rkey = match &x.rkey {
        None => Rkey::Mr,
        Some(k) => match k.get_ref().as_str() {
            "mr" => Rkey::Mr,
            "wrong" => Rkey::Wrong,
            "window" => Rkey::Window,
            other => return Err(cx.err(k.span(), format!("rkey {other:?}: mr, wrong or window"))),
        },
    };
    Ok(SendSpec {
        wr_id: x.wr_id,
        op,
        offset: x.offset,
        len,
        text: x.text.as_ref().map(|t| t.as_bytes().to_vec()),
        remote_offset: x.remote_offset,
        rkey,
        add: x.add,
        compare: x.compare,
        swap: x.swap,
        fence: x.fence,
        signaled: x.signaled,
        qkey: x.qkey,
        to,
    })
}

fn mem(cx: &Ctx<'_>, m: &Spanned<RawMem>) -> Result<Mem, FileError> {
    let x = m.get_ref();
    let need_len = |what: &str| {
        x.len
            .ok_or_else(|| cx.err(m.span(), format!("{what} needs len = N")))
    };
    let mut kinds = Vec::new();
    if let Some(t) = &x.text {
        kinds.push(Bytes::Text(t.as_bytes().to_vec()));
    }
    if let Some(v) = x.u64 {
        kinds.push(Bytes::U64(v));
    }
    if let Some([mul, add]) = x.pattern {
        kinds.push(Bytes::Pattern {
            mul,
            add,
            len: need_len("pattern")?,
        });
    }
    if let Some(byte) = x.fill {
        kinds.push(Bytes::Fill {
            byte,
            len: need_len("fill")?,
        });
    }
    if kinds.len() != 1 {
        return Err(cx.err(
            m.span(),
            "memory is given by exactly one of text, u64, pattern = [MUL, ADD], fill",
        ));
    }
    Ok(Mem {
        offset: x.offset as usize,
        bytes: kinds.remove(0),
    })
}

fn expectations(cx: &Ctx<'_>, e: &RawExpect) -> Result<Vec<Expectation>, FileError> {
    let mut out = Vec::new();
    for (name, h) in &e.hosts {
        let side = cx.host(name, h.span())?;
        host_expect(cx, side, h.get_ref(), &mut out)?;
    }
    for (key, n) in &e.packets {
        let text = if key == "all" { "" } else { key.as_str() };
        let spec = Spec::parse(text)
            .map_err(|e| cx.err(n.span(), format!("[expect.packets] {key:?}: {e}")))?;
        if spec.nth.is_some()
            || spec.first.is_some()
            || spec.by.is_some()
            || spec.bytes.is_some()
            || spec.timer.is_some()
            || spec.requester.is_some()
        {
            return Err(cx.err(n.span(), format!("[expect.packets] {key:?}: a count takes the packet's headers, from, to, aeth and fate only")));
        }
        if let Some(h) = spec.hosts().find(|h| cx.side(h).is_none()) {
            return Err(cx.err(
                n.span(),
                format!("no host {h:?}: the hosts are {}", cx.names.join(", ")),
            ));
        }
        out.push(Expectation {
            line: cx.line(n.span()),
            want: Want::Packets(key.clone(), Box::new(spec), *n.get_ref()),
        });
    }
    // Tables read in key order: report in the file's order.
    out.sort_by_key(|e| e.line);
    Ok(out)
}

fn host_expect(
    cx: &Ctx<'_>,
    side: Side,
    h: &RawHostExpect,
    out: &mut Vec<Expectation>,
) -> Result<(), FileError> {
    if let Some(c) = &h.completions {
        let mut v = Vec::new();
        for item in c.get_ref() {
            v.push(completion(item).map_err(|e| cx.err(c.span(), e))?);
        }
        out.push(Expectation {
            line: cx.line(c.span()),
            want: Want::Completions(side, v),
        });
    }
    if let Some(ev) = &h.events {
        let mut v = Vec::new();
        for item in ev.get_ref() {
            v.push(by_name(AsyncEventType::ALL, item).ok_or_else(|| {
                cx.err(
                    ev.span(),
                    format!("no async event {item:?} ({})", names(AsyncEventType::ALL)),
                )
            })?);
        }
        out.push(Expectation {
            line: cx.line(ev.span()),
            want: Want::Events(side, v),
        });
    }
    if let Some(st) = &h.state {
        let state = by_name(QpState::ALL, st.get_ref()).ok_or_else(|| {
            cx.err(
                st.span(),
                format!("no QP state {:?} ({})", st.get_ref(), names(QpState::ALL)),
            )
        })?;
        out.push(Expectation {
            line: cx.line(st.span()),
            want: Want::State(side, state),
        });
    }
    for (name, n) in &h.counters {
        if !COUNTERS.contains(&name.as_str()) {
            return Err(cx.err(
                n.span(),
                format!("no counter {name:?} ({})", COUNTERS.join(", ")),
            ));
        }
        out.push(Expectation {
            line: cx.line(n.span()),
            want: Want::Counter(side, name.clone(), *n.get_ref()),
        });
    }
    for m in &h.memory {
        out.push(Expectation {
            line: cx.line(m.span()),
            want: Want::Memory(side, mem(cx, m)?),
        });
    }
    Ok(())
}

/// `"WR_ID STATUS"` or `"WR_ID STATUS len=N"`.
fn completion(item: &str) -> Result<(u64, WcStatus, Option<u32>), String> {
    let mut words = item.split_whitespace();
    let bad = || {
        format!("completion {item:?}: write \"WR_ID STATUS\" (e.g. \"1 SUCCESS\"), optionally \"len=N\"")
    };
    let wr_id = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let status_word = words.next().ok_or_else(bad)?;
    let status = by_name(WcStatus::ALL, status_word).ok_or_else(|| {
        format!(
            "no completion status {status_word:?} ({})",
            names(WcStatus::ALL)
        )
    })?;
    let len = match words.next() {
        None => None,
        Some(w) => Some(
            w.strip_prefix("len=")
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?,
        ),
    };
    if words.next().is_some() {
        return Err(bad());
    }
    Ok((wr_id, status, len))
}
