//! The Communication Management MADs (IBTA 12.6, tables 106-120 of release 1.4) and
//! rdma_cm's private-data header, as bytes.
//!
//! A MAD is 256 bytes: the 24-byte common MAD header (IBTA 13.4.3: base version 1,
//! management class 0x07 = CM, class version 2, method, status, transaction ID,
//! attribute ID, attribute modifier) and 232 bytes of message. Field offsets below are
//! from the start of the message (after the header), bit fields numbered from the most
//! significant bit as IBTA draws them. Private data has no length on the wire: a
//! receiver gets the whole field, zero-padded.
//!
//! rdma_cm puts a 36-byte header first in the REQ's (and SIDR_REQ's) private data
//! (kernel `struct cma_hdr`): version 0, IP version in the high nibble (4), the source
//! port, then the source and destination addresses as 16 bytes each (IPv4 in the last
//! 4). The service ID is the port space and the destination port (Annex A11).
//!
//! The connection manager (`emu-cm`) speaks them; the emulated device reads
//! [`Addressee`] to pass a MAD to the process whose CM it is for when processes share
//! an address (`emu-core`'s `nic::share`).

/// Bytes of a MAD.
pub const MAD_LEN: usize = 256;
/// Bytes of the common MAD header.
pub const HDR_LEN: usize = 24;
/// Management class of the CM (IBTA 13.4.4 table 146... `MgmtClass` 0x07).
pub const CM_CLASS: u8 = 0x07;
/// Class version of the CM (IBTA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD methods (IBTA 13.4.5).
pub mod method {
    /// `Get`.
    pub const GET: u8 = 0x01;
    /// `Send`: every CM message.
    pub const SEND: u8 = 0x03;
    /// `GetResp`.
    pub const GET_RESP: u8 = 0x81;
}

/// CM attribute IDs (IBTA 12.6).
pub mod attr {
    /// `ClassPortInfo` (13.4.8.1): the emulator's address probe.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: u16 = 0x0018;
}

/// REJ reasons (IBTA 12.6.7 table 108) the emulator sends.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Insufficient resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout: the sender gave up waiting.
    pub const TIMEOUT: u16 = 4;
    /// Invalid service ID: nobody listens.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Transport type not supported by the listener.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// Consumer reject (`rdma_reject`).
    pub const CONSUMER: u16 = 28;
}

/// Private-data sizes of each message.
pub mod pdata {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// Length of rdma_cm's address header in REQ private data.
pub const CMA_HDR_LEN: usize = 36;

/// The transport service type of a REQ (IBTA 12.6.5: 0 RC, 1 UC, 3 RD... 2 bits).
pub const TRANSPORT_RC: u8 = 0;

/// ConnectRequest (IBTA 12.6.5, table 106).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Req {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources offered.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits).
    pub transport: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (the IBTA code: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Primary local port LID.
    pub local_lid: u16,
    /// Primary remote port LID.
    pub remote_lid: u16,
    /// Primary local port GID.
    pub local_gid: [u8; 16],
    /// Primary remote port GID.
    pub remote_gid: [u8; 16],
    /// Primary traffic class.
    pub traffic_class: u8,
    /// Primary hop limit.
    pub hop_limit: u8,
    /// Primary local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
    /// Private data (92 bytes on the wire).
    pub private_data: Vec<u8>,
}

/// ConnectReply (IBTA 12.6.8, table 110).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rep {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN.
    pub local_qpn: u32,
    /// Starting PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReject (IBTA 12.6.7, table 108).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rej {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message rejected: 0 REQ, 1 REP, 2 other (2 bits).
    pub message_rejected: u8,
    /// Reason.
    pub reason: u16,
    /// Private data (148 bytes).
    pub private_data: Vec<u8>,
}

/// MsgRcptAck (IBTA 12.6.6, table 107).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Mra {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged: 0 REQ, 1 REP, 2 LAP (2 bits).
    pub message_mraed: u8,
    /// Service timeout (5 bits): 4.096 us * 2^t more to wait.
    pub service_timeout: u8,
}

/// A message carrying only the two communication IDs and private data: RTU (12.6.9,
/// table 111), DREQ (12.6.10, table 112, with the remote QPN), DREP (12.6.11, table 113).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Ids {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// DREQ only: the remote QPN (24 bits).
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// ServiceIDResReq (IBTA 12.11.1, table 119).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SidrReq {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResReqResp (IBTA 12.11.2, table 120).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SidrRep {
    /// Request ID.
    pub request_id: u32,
    /// Status: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP, ...
    pub status: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// One CM MAD's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMsg {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Ids),
    /// DREQ.
    Dreq(Ids),
    /// DREP.
    Drep(Ids),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
    /// `Get(ClassPortInfo)`: the emulator's address probe.
    ProbeGet,
    /// `GetResp(ClassPortInfo)`: its answer, whatever its status. An emulated CM
    /// answers with status 0; a Linux kernel's MAD layer, where no agent takes a CM
    /// `Get` (its CM registers `Send` only), answers with the request turned into a
    /// `GetResp` with status 0x000C, "unsupported method/attribute combination" (IBTA
    /// 13.4.7, status bits 2-4 = 3), with the same TID. Either way the address has a
    /// live QP1, which is all the probe asks.
    ProbeResp,
}

/// Why a MAD was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MadError {
    /// Shorter than 256 bytes.
    Short,
    /// Not base version 1, class CM, class version 2.
    NotCm,
    /// A method or attribute the CM does not handle.
    Unknown,
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[HDR_LEN + off..HDR_LEN + off + v.len()].copy_from_slice(v);
}
fn put24(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_be_bytes()[1..]);
}
fn get<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    b[HDR_LEN + off..HDR_LEN + off + N]
        .try_into()
        .expect("in bounds")
}
fn get8(b: &[u8], off: usize) -> u8 {
    b[HDR_LEN + off]
}
fn get16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(get(b, off))
}
fn get24(b: &[u8], off: usize) -> u32 {
    let [x, y, z] = get::<3>(b, off);
    u32::from_be_bytes([0, x, y, z])
}
fn get32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(get(b, off))
}
fn get64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(get(b, off))
}
fn put_pdata(b: &mut [u8], off: usize, max: usize, data: &[u8]) {
    let n = data.len().min(max);
    put(b, off, &data[..n]);
}
fn get_pdata(b: &[u8], off: usize, len: usize) -> Vec<u8> {
    b[HDR_LEN + off..HDR_LEN + off + len].to_vec()
}

impl CmMsg {
    fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
            CmMsg::ProbeGet | CmMsg::ProbeResp => attr::CLASS_PORT_INFO,
        }
    }

    /// The name IBTA gives the message.
    pub fn name(&self) -> &'static str {
        match self {
            CmMsg::Req(_) => "REQ",
            CmMsg::Mra(_) => "MRA",
            CmMsg::Rej(_) => "REJ",
            CmMsg::Rep(_) => "REP",
            CmMsg::Rtu(_) => "RTU",
            CmMsg::Dreq(_) => "DREQ",
            CmMsg::Drep(_) => "DREP",
            CmMsg::SidrReq(_) => "SIDR_REQ",
            CmMsg::SidrRep(_) => "SIDR_REP",
            CmMsg::ProbeGet => "Get(ClassPortInfo)",
            CmMsg::ProbeResp => "GetResp(ClassPortInfo)",
        }
    }

    /// The 256-byte MAD with transaction ID `tid`. Private data longer than its field
    /// is cut (the API refuses it before it gets here).
    pub fn encode(&self, tid: u64) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        b[0] = 1; // BaseVersion
        b[1] = CM_CLASS;
        b[2] = CM_CLASS_VERSION;
        b[3] = match self {
            CmMsg::ProbeGet => method::GET,
            CmMsg::ProbeResp => method::GET_RESP,
            _ => method::SEND,
        };
        b[8..16].copy_from_slice(&tid.to_be_bytes());
        b[16..18].copy_from_slice(&self.attr_id().to_be_bytes());
        let b2 = &mut b[..];
        match self {
            CmMsg::Req(r) => {
                put(b2, 0, &r.local_comm_id.to_be_bytes());
                put(b2, 8, &r.service_id.to_be_bytes());
                put(b2, 16, &r.local_ca_guid.to_be_bytes());
                put24(b2, 32, r.local_qpn);
                put(b2, 35, &[r.responder_resources]);
                put(b2, 39, &[r.initiator_depth]);
                put(
                    b2,
                    43,
                    &[(r.remote_cm_response_timeout << 3)
                        | ((r.transport & 3) << 1)
                        | u8::from(r.flow_control)],
                );
                put24(b2, 44, r.starting_psn);
                put(
                    b2,
                    47,
                    &[(r.local_cm_response_timeout << 3) | (r.retry_count & 7)],
                );
                put(b2, 48, &r.pkey.to_be_bytes());
                put(b2, 50, &[(r.path_mtu << 4) | (r.rnr_retry_count & 7)]);
                put(b2, 51, &[(r.max_cm_retries << 4) | (u8::from(r.srq) << 3)]);
                put(b2, 52, &r.local_lid.to_be_bytes());
                put(b2, 54, &r.remote_lid.to_be_bytes());
                put(b2, 56, &r.local_gid);
                put(b2, 72, &r.remote_gid);
                put(b2, 92, &[r.traffic_class, r.hop_limit]);
                put(b2, 95, &[r.local_ack_timeout << 3]);
                put_pdata(b2, 140, pdata::REQ, &r.private_data);
            }
            CmMsg::Mra(m) => {
                put(b2, 0, &m.local_comm_id.to_be_bytes());
                put(b2, 4, &m.remote_comm_id.to_be_bytes());
                put(b2, 8, &[m.message_mraed << 6, m.service_timeout << 3]);
            }
            CmMsg::Rej(r) => {
                put(b2, 0, &r.local_comm_id.to_be_bytes());
                put(b2, 4, &r.remote_comm_id.to_be_bytes());
                put(b2, 8, &[r.message_rejected << 6]);
                put(b2, 10, &r.reason.to_be_bytes());
                put_pdata(b2, 84, pdata::REJ, &r.private_data);
            }
            CmMsg::Rep(r) => {
                put(b2, 0, &r.local_comm_id.to_be_bytes());
                put(b2, 4, &r.remote_comm_id.to_be_bytes());
                put(b2, 8, &r.local_qkey.to_be_bytes());
                put24(b2, 12, r.local_qpn);
                put24(b2, 20, r.starting_psn);
                put(
                    b2,
                    24,
                    &[
                        r.responder_resources,
                        r.initiator_depth,
                        (r.target_ack_delay << 3) | u8::from(r.flow_control),
                        (r.rnr_retry_count << 5) | (u8::from(r.srq) << 4),
                    ],
                );
                put(b2, 28, &r.local_ca_guid.to_be_bytes());
                put_pdata(b2, 36, pdata::REP, &r.private_data);
            }
            CmMsg::Rtu(m) | CmMsg::Drep(m) => {
                put(b2, 0, &m.local_comm_id.to_be_bytes());
                put(b2, 4, &m.remote_comm_id.to_be_bytes());
                put_pdata(b2, 8, pdata::RTU, &m.private_data);
            }
            CmMsg::Dreq(m) => {
                put(b2, 0, &m.local_comm_id.to_be_bytes());
                put(b2, 4, &m.remote_comm_id.to_be_bytes());
                put24(b2, 8, m.remote_qpn);
                put_pdata(b2, 12, pdata::DREQ, &m.private_data);
            }
            CmMsg::SidrReq(s) => {
                put(b2, 0, &s.request_id.to_be_bytes());
                put(b2, 4, &s.pkey.to_be_bytes());
                put(b2, 8, &s.service_id.to_be_bytes());
                put_pdata(b2, 16, pdata::SIDR_REQ, &s.private_data);
            }
            CmMsg::SidrRep(s) => {
                put(b2, 0, &s.request_id.to_be_bytes());
                put(b2, 4, &[s.status]);
                put24(b2, 8, s.qpn);
                put(b2, 12, &s.service_id.to_be_bytes());
                put(b2, 20, &s.qkey.to_be_bytes());
                put_pdata(b2, 96, pdata::SIDR_REP, &s.private_data);
            }
            CmMsg::ProbeGet | CmMsg::ProbeResp => {}
        }
        b
    }

    /// Parses a MAD: the transaction ID and the message.
    pub fn decode(b: &[u8]) -> Result<(u64, CmMsg), MadError> {
        if b.len() < MAD_LEN {
            return Err(MadError::Short);
        }
        if b[0] != 1 || b[1] != CM_CLASS || b[2] != CM_CLASS_VERSION {
            return Err(MadError::NotCm);
        }
        let tid = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
        let attr_id = u16::from_be_bytes([b[16], b[17]]);
        let ids = |qpn: bool, pd_off: usize, pd_len: usize| Ids {
            local_comm_id: get32(b, 0),
            remote_comm_id: get32(b, 4),
            remote_qpn: if qpn { get24(b, 8) } else { 0 },
            private_data: get_pdata(b, pd_off, pd_len),
        };
        let msg = match (b[3], attr_id) {
            (method::GET, attr::CLASS_PORT_INFO) => CmMsg::ProbeGet,
            (method::GET_RESP, attr::CLASS_PORT_INFO) => CmMsg::ProbeResp,
            (method::SEND, attr::REQ) => CmMsg::Req(Req {
                local_comm_id: get32(b, 0),
                service_id: get64(b, 8),
                local_ca_guid: get64(b, 16),
                local_qpn: get24(b, 32),
                responder_resources: get8(b, 35),
                initiator_depth: get8(b, 39),
                remote_cm_response_timeout: get8(b, 43) >> 3,
                transport: (get8(b, 43) >> 1) & 3,
                flow_control: get8(b, 43) & 1 != 0,
                starting_psn: get24(b, 44),
                local_cm_response_timeout: get8(b, 47) >> 3,
                retry_count: get8(b, 47) & 7,
                pkey: get16(b, 48),
                path_mtu: get8(b, 50) >> 4,
                rnr_retry_count: get8(b, 50) & 7,
                max_cm_retries: get8(b, 51) >> 4,
                srq: get8(b, 51) & 8 != 0,
                local_lid: get16(b, 52),
                remote_lid: get16(b, 54),
                local_gid: get(b, 56),
                remote_gid: get(b, 72),
                traffic_class: get8(b, 92),
                hop_limit: get8(b, 93),
                local_ack_timeout: get8(b, 95) >> 3,
                private_data: get_pdata(b, 140, pdata::REQ),
            }),
            (method::SEND, attr::MRA) => CmMsg::Mra(Mra {
                local_comm_id: get32(b, 0),
                remote_comm_id: get32(b, 4),
                message_mraed: get8(b, 8) >> 6,
                service_timeout: get8(b, 9) >> 3,
            }),
            (method::SEND, attr::REJ) => CmMsg::Rej(Rej {
                local_comm_id: get32(b, 0),
                remote_comm_id: get32(b, 4),
                message_rejected: get8(b, 8) >> 6,
                reason: get16(b, 10),
                private_data: get_pdata(b, 84, pdata::REJ),
            }),
            (method::SEND, attr::REP) => CmMsg::Rep(Rep {
                local_comm_id: get32(b, 0),
                remote_comm_id: get32(b, 4),
                local_qkey: get32(b, 8),
                local_qpn: get24(b, 12),
                starting_psn: get24(b, 20),
                responder_resources: get8(b, 24),
                initiator_depth: get8(b, 25),
                target_ack_delay: get8(b, 26) >> 3,
                flow_control: get8(b, 26) & 1 != 0,
                rnr_retry_count: get8(b, 27) >> 5,
                srq: get8(b, 27) & 0x10 != 0,
                local_ca_guid: get64(b, 28),
                private_data: get_pdata(b, 36, pdata::REP),
            }),
            (method::SEND, attr::RTU) => CmMsg::Rtu(ids(false, 8, pdata::RTU)),
            (method::SEND, attr::DREQ) => CmMsg::Dreq(ids(true, 12, pdata::DREQ)),
            (method::SEND, attr::DREP) => CmMsg::Drep(ids(false, 8, pdata::DREP)),
            (method::SEND, attr::SIDR_REQ) => CmMsg::SidrReq(SidrReq {
                request_id: get32(b, 0),
                pkey: get16(b, 4),
                service_id: get64(b, 8),
                private_data: get_pdata(b, 16, pdata::SIDR_REQ),
            }),
            (method::SEND, attr::SIDR_REP) => CmMsg::SidrRep(SidrRep {
                request_id: get32(b, 0),
                status: get8(b, 4),
                qpn: get24(b, 8),
                service_id: get64(b, 12),
                qkey: get32(b, 20),
                private_data: get_pdata(b, 96, pdata::SIDR_REP),
            }),
            _ => return Err(MadError::Unknown),
        };
        Ok((tid, msg))
    }
}

/// Whom a CM MAD is for, among the CMs of the processes that share one device address
/// (`nic::share`), as the kernel's one CM tells its connections apart (IBTA 12.6):
/// a request opens a connection to whoever listens on its service ID; every other
/// message names the receiver's own number, which the receiver's CM chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressee {
    /// REQ and SIDR_REQ: the listener of this service ID.
    Service(u64),
    /// The CM that chose this communication ID: the Remote Communication ID of an
    /// MRA, REJ, REP, RTU, DREQ or DREP, the Request ID of a SIDR_REP, the TID of a
    /// probe's answer (a probe's TID is its id's communication ID).
    Comm(u32),
    /// Any of them: a probe (`Get(ClassPortInfo)`), which only asks whether the
    /// address has a CM; a REJ that names no communication ID of ours.
    Any,
}

impl Addressee {
    /// Reads whom the MAD `b` is for without parsing the rest; `None` for what is not
    /// a CM MAD the emulator takes.
    pub fn of(b: &[u8]) -> Option<Addressee> {
        if b.len() < MAD_LEN || b[0] != 1 || b[1] != CM_CLASS || b[2] != CM_CLASS_VERSION {
            return None;
        }
        let tid = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
        let comm = |c: u32| {
            if c == 0 {
                Addressee::Any
            } else {
                Addressee::Comm(c)
            }
        };
        Some(match (b[3], u16::from_be_bytes([b[16], b[17]])) {
            (method::GET, attr::CLASS_PORT_INFO) => Addressee::Any,
            (method::GET_RESP, attr::CLASS_PORT_INFO) => comm(tid as u32),
            (method::SEND, attr::REQ | attr::SIDR_REQ) => Addressee::Service(get64(b, 8)),
            (method::SEND, attr::SIDR_REP) => comm(get32(b, 0)),
            (
                method::SEND,
                attr::MRA | attr::REJ | attr::REP | attr::RTU | attr::DREQ | attr::DREP,
            ) => comm(get32(b, 4)),
            _ => return None,
        })
    }
}

/// rdma_cm's header at the start of REQ and SIDR_REQ private data: version 0, the IP
/// version in the high nibble of byte 1, the active side's port, then the source and
/// destination addresses, 16 bytes each (an IPv4 one in the last four).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHdr {
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address.
    pub src: std::net::IpAddr,
    /// The address it connects to (of the same family).
    pub dst: std::net::IpAddr,
}

impl CmaHdr {
    /// The header followed by the user's private data.
    pub fn wrap(&self, user: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; CMA_HDR_LEN];
        v[0] = 0; // cma_version
        v[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        let mut put = |at: usize, ip: std::net::IpAddr| match ip {
            std::net::IpAddr::V4(a) => v[at + 12..at + 16].copy_from_slice(&a.octets()),
            std::net::IpAddr::V6(a) => v[at..at + 16].copy_from_slice(&a.octets()),
        };
        put(4, self.src);
        put(20, self.dst);
        v[1] = if self.src.is_ipv6() { 6 << 4 } else { 4 << 4 }; // ip_version
        v.extend_from_slice(user);
        v
    }

    /// Splits private data into the header and the user's part; `None` if it is not
    /// an rdma_cm header of IP version 4 or 6.
    pub fn unwrap(pd: &[u8]) -> Option<(CmaHdr, &[u8])> {
        if pd.len() < CMA_HDR_LEN || pd[0] != 0 || !matches!(pd[1] >> 4, 4 | 6) {
            return None;
        }
        let v6 = pd[1] >> 4 == 6;
        let ip = |o: usize| -> std::net::IpAddr {
            if v6 {
                let b: [u8; 16] = pd[o..o + 16].try_into().unwrap_or_default();
                std::net::IpAddr::V6(b.into())
            } else {
                std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                    pd[o + 12],
                    pd[o + 13],
                    pd[o + 14],
                    pd[o + 15],
                ))
            }
        };
        Some((
            CmaHdr {
                src_port: u16::from_be_bytes([pd[2], pd[3]]),
                src: ip(4),
                dst: ip(20),
            },
            &pd[CMA_HDR_LEN..],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pd(v: Vec<u8>, n: usize) -> Vec<u8> {
        let mut v = v;
        v.resize(n, 0);
        v
    }

    #[test]
    fn req_fields_sit_where_ibta_puts_them() {
        let r = Req {
            local_comm_id: 0x0102_0304,
            service_id: 0x0000_0000_0106_1D2F,
            local_qpn: 0x00AB_CDEF,
            responder_resources: 4,
            initiator_depth: 3,
            remote_cm_response_timeout: 20,
            starting_psn: 0x12_3456,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            ..Req::default()
        };
        let b = CmMsg::Req(r).encode(9);
        assert_eq!(&b[..4], &[1, 7, 2, 3]);
        assert_eq!(&b[16..18], &[0, 0x10]);
        assert_eq!(&b[24..28], &[1, 2, 3, 4]);
        assert_eq!(&b[24 + 32..24 + 36], &[0xAB, 0xCD, 0xEF, 4]);
        assert_eq!(b[24 + 43], 20 << 3);
        assert_eq!(b[24 + 47], (20 << 3) | 7);
        assert_eq!(b[24 + 50], (3 << 4) | 6);
        assert_eq!(b[24 + 51], 15 << 4);
    }

    #[test]
    fn cma_header_round_trips() {
        let h = CmaHdr {
            src_port: 4242,
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
        };
        let v = h.wrap(b"hi");
        assert_eq!(v.len(), 38);
        assert_eq!(&v[28..32], &[0, 0, 0, 0]);
        assert_eq!(CmaHdr::unwrap(&v), Some((h, &b"hi"[..])));
        assert_eq!(CmaHdr::unwrap(&v[..10]), None);
        let h6 = CmaHdr {
            src_port: 7,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let v = h6.wrap(b"");
        assert_eq!(v[1], 0x60);
        assert_eq!(&v[4..6], &[0xFD, 0x00]);
        assert_eq!(CmaHdr::unwrap(&v), Some((h6, &b""[..])));
    }

    #[test]
    fn foreign_mads_are_refused() {
        let mut b = CmMsg::ProbeGet.encode(1);
        assert_eq!(CmMsg::decode(&b[..100]), Err(MadError::Short));
        b[1] = 0x81;
        assert_eq!(CmMsg::decode(&b), Err(MadError::NotCm));
        let mut b = CmMsg::ProbeGet.encode(1);
        b[17] = 0x99;
        assert_eq!(CmMsg::decode(&b), Err(MadError::Unknown));
    }

    #[test]
    fn a_kernels_unsupported_answer_to_the_probe_is_an_answer() {
        // What a Linux kernel sends back for our Get: the same MAD, method GetResp,
        // status 0x000C (IBTA 13.4.7: invalid method/attribute combination).
        let mut b = CmMsg::ProbeGet.encode(0x1234);
        b[3] = method::GET_RESP;
        b[4..6].copy_from_slice(&0x000Cu16.to_be_bytes());
        assert_eq!(CmMsg::decode(&b), Ok((0x1234, CmMsg::ProbeResp)));
        // Our own answer carries status 0 and decodes alike.
        let ours = CmMsg::ProbeResp.encode(0x1234);
        assert_eq!(&ours[4..6], &[0, 0]);
        assert_eq!(CmMsg::decode(&ours), Ok((0x1234, CmMsg::ProbeResp)));
    }

    proptest! {
        #[test]
        fn messages_round_trip(
            a in any::<u32>(), c in any::<u32>(), q in 0u32..1 << 24, p in 0u32..1 << 24,
            t in 0u8..32, r in 0u8..8, small in 0u8..4, flag in any::<bool>(),
            sid in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..92),
        ) {
            let msgs = [
                CmMsg::Req(Req {
                    local_comm_id: a, service_id: sid, local_ca_guid: sid ^ 1, local_qpn: q,
                    responder_resources: r, initiator_depth: t, remote_cm_response_timeout: t,
                    transport: small, flow_control: flag, starting_psn: p,
                    local_cm_response_timeout: t, retry_count: r, pkey: a as u16,
                    path_mtu: small, rnr_retry_count: r, max_cm_retries: r, srq: flag,
                    local_lid: c as u16, remote_lid: a as u16,
                    local_gid: [r; 16], remote_gid: [t; 16],
                    traffic_class: t, hop_limit: r, local_ack_timeout: t,
                    private_data: pd(data.clone(), pdata::REQ),
                }),
                CmMsg::Rep(Rep {
                    local_comm_id: a, remote_comm_id: c, local_qkey: c, local_qpn: q,
                    starting_psn: p, responder_resources: r, initiator_depth: t,
                    target_ack_delay: t, flow_control: flag, rnr_retry_count: r, srq: flag,
                    local_ca_guid: sid, private_data: pd(data.clone(), pdata::REP),
                }),
                CmMsg::Rej(Rej {
                    local_comm_id: a, remote_comm_id: c, message_rejected: small.min(2),
                    reason: c as u16, private_data: pd(data.clone(), pdata::REJ),
                }),
                CmMsg::Mra(Mra {
                    local_comm_id: a, remote_comm_id: c, message_mraed: small.min(2),
                    service_timeout: t,
                }),
                CmMsg::Rtu(Ids { local_comm_id: a, remote_comm_id: c, remote_qpn: 0,
                    private_data: pd(data.clone(), pdata::RTU) }),
                CmMsg::Dreq(Ids { local_comm_id: a, remote_comm_id: c, remote_qpn: q,
                    private_data: pd(data.clone(), pdata::DREQ) }),
                CmMsg::Drep(Ids { local_comm_id: a, remote_comm_id: c, remote_qpn: 0,
                    private_data: pd(data.clone(), pdata::DREP) }),
                CmMsg::SidrReq(SidrReq { request_id: a, pkey: c as u16, service_id: sid,
                    private_data: pd(data.clone(), pdata::SIDR_REQ) }),
                CmMsg::SidrRep(SidrRep { request_id: a, status: r, qpn: q, service_id: sid,
                    qkey: c, private_data: pd(data.clone(), pdata::SIDR_REP) }),
                CmMsg::ProbeGet,
                CmMsg::ProbeResp,
            ];
            for m in msgs {
                let b = m.encode(u64::from(a) << 8);
                prop_assert_eq!(CmMsg::decode(&b), Ok((u64::from(a) << 8, m)));
            }
        }
    }
}
