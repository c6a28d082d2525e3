//! The build without the `hw` feature: the same names as the real backend, but no
//! device can be opened, so every caller gets a clear error instead of a link failure.

use std::convert::Infallible;
use std::time::Duration;

use verbs_api::{
    AccessFlags, AhAttr, AhId, AsyncEvent, ChannelId, CqId, Device, DeviceAttr, Error, Gid, MemBuf,
    MrInfo, MwBind, MwId, MwInfo, MwType, PdId, PortAttr, PostError, QpAttr, QpAttrMask,
    QpInitAttr, RecvWr, ReregMrFlags, Result, SendWr, SrqAttr, SrqAttrMask, SrqId, WorkCompletion,
};

use crate::DeviceListEntry;

/// Why nothing works in this build.
const DISABLED: &str = "hw-backend was built without the `hw` feature; rebuild with \
                        `--features hw` (needs libibverbs-dev, librdmacm-dev, libclang-dev)";

/// A real RDMA device. This build has no libibverbs, so none can be opened: the type
/// has no values and [`HwDevice::open`] always fails.
#[derive(Debug)]
pub struct HwDevice {
    never: Infallible,
}

impl HwDevice {
    /// Always EOPNOTSUPP in this build (no `hw` feature).
    pub fn open(_name: Option<&str>) -> Result<HwDevice> {
        Err(Error::Unsupported(DISABLED))
    }
}

/// Always EOPNOTSUPP in this build (no `hw` feature).
pub fn devices() -> Result<Vec<DeviceListEntry>> {
    Err(Error::Unsupported(DISABLED))
}

/// Always EOPNOTSUPP in this build (no `hw` feature).
pub fn wait_fd_readable(_fd: i32, _timeout: Option<Duration>) -> Result<bool> {
    Err(Error::Unsupported(DISABLED))
}

impl Device for HwDevice {
    fn name(&self) -> &str {
        match self.never {}
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        match self.never {}
    }

    fn query_port(&self, _port: u8) -> Result<PortAttr> {
        match self.never {}
    }

    fn query_gid(&self, _port: u8, _index: u32) -> Result<Gid> {
        match self.never {}
    }

    fn query_pkey(&self, _port: u8, _index: u16) -> Result<u16> {
        match self.never {}
    }

    fn alloc_pd(&self) -> Result<PdId> {
        match self.never {}
    }

    fn dealloc_pd(&self, _pd: PdId) -> Result<()> {
        match self.never {}
    }

    fn reg_mr(
        &self,
        _pd: PdId,
        _buf: &MemBuf,
        _offset: usize,
        _length: usize,
        _access: AccessFlags,
    ) -> Result<MrInfo> {
        match self.never {}
    }

    fn dereg_mr(&self, _lkey: u32) -> Result<()> {
        match self.never {}
    }

    fn rereg_mr(
        &self,
        _lkey: u32,
        _flags: ReregMrFlags,
        _pd: Option<PdId>,
        _range: Option<(&MemBuf, usize, usize)>,
        _access: AccessFlags,
    ) -> Result<MrInfo> {
        match self.never {}
    }

    fn alloc_mw(&self, _pd: PdId, _mw_type: MwType) -> Result<MwInfo> {
        match self.never {}
    }

    fn dealloc_mw(&self, _mw: MwId) -> Result<()> {
        match self.never {}
    }

    fn bind_mw(&self, _qpn: u32, _mw: MwId, _bind: &MwBind) -> Result<u32> {
        match self.never {}
    }

    fn create_comp_channel(&self) -> Result<ChannelId> {
        match self.never {}
    }

    fn destroy_comp_channel(&self, _channel: ChannelId) -> Result<()> {
        match self.never {}
    }

    fn get_cq_event(&self, _channel: ChannelId, _timeout: Option<Duration>) -> Result<CqId> {
        match self.never {}
    }

    fn comp_channel_fd(&self, _channel: ChannelId) -> Result<i32> {
        match self.never {}
    }

    fn create_cq_with_vector(
        &self,
        _cqe: u32,
        _channel: Option<ChannelId>,
        _comp_vector: u32,
    ) -> Result<CqId> {
        match self.never {}
    }

    fn num_comp_vectors(&self) -> u32 {
        match self.never {}
    }

    fn destroy_cq(&self, _cq: CqId) -> Result<()> {
        match self.never {}
    }

    fn resize_cq(&self, _cq: CqId, _cqe: u32) -> Result<()> {
        match self.never {}
    }

    fn poll_cq(&self, _cq: CqId, _max: usize, _out: &mut Vec<WorkCompletion>) -> Result<usize> {
        match self.never {}
    }

    fn req_notify_cq(&self, _cq: CqId, _solicited_only: bool) -> Result<()> {
        match self.never {}
    }

    fn create_qp(&self, _init: &QpInitAttr) -> Result<u32> {
        match self.never {}
    }

    fn modify_qp(&self, _qpn: u32, _attr: &QpAttr, _mask: QpAttrMask) -> Result<()> {
        match self.never {}
    }

    fn query_qp(&self, _qpn: u32) -> Result<(QpAttr, QpInitAttr)> {
        match self.never {}
    }

    fn destroy_qp(&self, _qpn: u32) -> Result<()> {
        match self.never {}
    }

    fn post_send(&self, _qpn: u32, _wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        match self.never {}
    }

    fn post_recv(&self, _qpn: u32, _wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        match self.never {}
    }

    fn create_srq(&self, _pd: PdId, _attr: &SrqAttr) -> Result<SrqId> {
        match self.never {}
    }

    fn modify_srq(&self, _srq: SrqId, _attr: &SrqAttr, _mask: SrqAttrMask) -> Result<()> {
        match self.never {}
    }

    fn query_srq(&self, _srq: SrqId) -> Result<SrqAttr> {
        match self.never {}
    }

    fn destroy_srq(&self, _srq: SrqId) -> Result<()> {
        match self.never {}
    }

    fn post_srq_recv(&self, _srq: SrqId, _wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        match self.never {}
    }

    fn create_ah(&self, _pd: PdId, _attr: &AhAttr) -> Result<AhId> {
        match self.never {}
    }

    fn destroy_ah(&self, _ah: AhId) -> Result<()> {
        match self.never {}
    }

    fn init_ah_from_wc(&self, _port_num: u8, _wc: &WorkCompletion, _grh: &[u8]) -> Result<AhAttr> {
        match self.never {}
    }

    fn attach_mcast(&self, _qpn: u32, _gid: &Gid, _lid: u16) -> Result<()> {
        match self.never {}
    }

    fn detach_mcast(&self, _qpn: u32, _gid: &Gid, _lid: u16) -> Result<()> {
        match self.never {}
    }

    fn get_async_event(&self, _timeout: Option<Duration>) -> Result<AsyncEvent> {
        match self.never {}
    }

    fn async_fd(&self) -> Result<i32> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_says_the_feature_is_missing() {
        let e = HwDevice::open(Some("rxe0")).unwrap_err();
        assert_eq!(e.errno(), verbs_api::errno::EOPNOTSUPP);
        assert!(e.to_string().contains("`hw` feature"), "{e}");
        assert_eq!(devices().unwrap_err(), e);
        assert!(HwDevice::open(None).is_err());
    }
}
