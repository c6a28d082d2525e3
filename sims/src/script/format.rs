//! The file format as serde reads it: TOML tables and keys, each value with its byte
//! span so that every error names its line. `load` turns it into a checked
//! [`Script`](super::Script).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub name: Spanned<String>,
    pub description: String,
    #[serde(default)]
    pub qp: Option<Spanned<RawQp>>,
    #[serde(default)]
    pub hosts: BTreeMap<String, Spanned<RawHost>>,
    #[serde(default)]
    pub rule: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub step: Vec<Spanned<RawStep>>,
    #[serde(default)]
    pub expect: RawExpect,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQp {
    #[serde(rename = "type")]
    pub qp_type: Option<Spanned<String>>,
    pub path_mtu: Option<Spanned<u32>>,
    pub timeout: Option<Spanned<u8>>,
    pub retry_cnt: Option<Spanned<u8>>,
    pub rnr_retry: Option<Spanned<u8>>,
    pub min_rnr_timer: Option<Spanned<u8>>,
    pub rd_atomic: Option<u8>,
    pub cq_size: Option<u32>,
    pub max_send_wr: Option<u32>,
    pub max_recv_wr: Option<u32>,
    pub sq_sig_all: Option<bool>,
    pub psn: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub srq: Option<RawSrq>,
    pub peer: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSrq {
    pub max_wr: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub name: Option<String>,
    pub drop: Option<Spanned<String>>,
    pub duplicate: Option<Spanned<String>>,
    pub delay: Option<Spanned<String>>,
    pub corrupt: Option<Spanned<String>>,
    pub rnr_nak: Option<Spanned<String>>,
    pub truncate: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStep {
    pub on: Option<Spanned<String>>,
    pub post_send: Option<Vec<Spanned<RawSend>>>,
    pub post_recv: Option<Vec<RawRecv>>,
    pub post_srq_recv: Option<Vec<RawRecv>>,
    pub wait: Option<usize>,
    pub run_for: Option<Spanned<String>>,
    pub run: Option<Spanned<String>>,
    pub modify_qp: Option<Spanned<String>>,
    pub arm_srq: Option<u32>,
    pub write: Option<Spanned<RawMem>>,
    pub bind_mw: Option<RawBind>,
    pub partition: Option<Spanned<Vec<String>>>,
    pub link: Option<Spanned<RawLink>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSend {
    pub wr_id: u64,
    pub op: Spanned<String>,
    #[serde(default)]
    pub offset: u64,
    pub len: Option<u32>,
    pub text: Option<String>,
    #[serde(default)]
    pub remote_offset: u64,
    pub rkey: Option<Spanned<String>>,
    #[serde(default)]
    pub add: u64,
    #[serde(default)]
    pub compare: u64,
    #[serde(default)]
    pub swap: u64,
    #[serde(default)]
    pub fence: bool,
    #[serde(default)]
    pub signaled: bool,
    pub qkey: Option<u32>,
    pub to: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecv {
    pub wr_id: u64,
    #[serde(default)]
    pub offset: u64,
    pub len: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMem {
    pub offset: u64,
    pub len: Option<usize>,
    pub text: Option<String>,
    pub u64: Option<u64>,
    pub pattern: Option<[u8; 2]>,
    pub fill: Option<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBind {
    pub wr_id: u64,
    pub offset: u64,
    pub len: u64,
    pub key: u8,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    pub between: Option<Vec<String>>,
    #[serde(default)]
    pub loss: f64,
    pub jitter: Option<Spanned<String>>,
    pub latency: Option<Spanned<String>>,
}

/// `[expect.HOST]` tables, one per host, and `[expect.packets]`: a map whose values
/// take two shapes, read key by key so that every value keeps its span (serde's
/// `flatten` would buffer them and lose it).
#[derive(Default)]
pub(super) struct RawExpect {
    pub hosts: Vec<(String, Spanned<RawHostExpect>)>,
    pub packets: BTreeMap<String, Spanned<u64>>,
}

impl<'de> Deserialize<'de> for RawExpect {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Tables;
        impl<'de> Visitor<'de> for Tables {
            type Value = RawExpect;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("tables [expect.HOST] and [expect.packets]")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawExpect, A::Error> {
                let mut out = RawExpect::default();
                while let Some(key) = m.next_key::<String>()? {
                    if key == "packets" {
                        out.packets = m.next_value()?;
                    } else {
                        let table = m.next_value()?;
                        out.hosts.push((key, table));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Tables)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHostExpect {
    pub completions: Option<Spanned<Vec<String>>>,
    pub events: Option<Spanned<Vec<String>>>,
    pub state: Option<Spanned<String>>,
    #[serde(default)]
    pub counters: BTreeMap<String, Spanned<u64>>,
    #[serde(default)]
    pub memory: Vec<Spanned<RawMem>>,
}
