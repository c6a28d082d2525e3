//! Asynchronous events: what `ibv_get_async_event` returns (manual 2.3.9
//! Asynchronous Events, 3.7.1 ibv_get_async_event, 3.7.3 ibv_event_type_str).
//!
//! libibverbs' `struct ibv_async_event` holds a union of CQ, QP, SRQ and WQ
//! pointers and a port number, "one member of the element union will be valid,
//! depending on the event_type" (manual 3.7.1). Here the union is the enum
//! [`EventElement`], which names objects by number, and
//! [`AsyncEventType::element_kind`] says which member each event type carries.

use core::fmt;

verbs_enum! {
    /// `enum ibv_event_type` (manual 3.7.1 ibv_get_async_event).
    pub enum AsyncEventType ("ibv_event_type") {
        /// `IBV_EVENT_CQ_ERR`: CQ is in error (CQ overrun). CQ event.
        CqErr = 0,
        /// `IBV_EVENT_QP_FATAL`: error occurred on a QP and it transitioned to
        /// the Error state. QP event.
        QpFatal = 1,
        /// `IBV_EVENT_QP_REQ_ERR`: invalid request local work queue error.
        /// QP event.
        QpReqErr = 2,
        /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation error. QP event.
        QpAccessErr = 3,
        /// `IBV_EVENT_COMM_EST`: communication was established on a QP (the
        /// first packet arrived while in RTR). QP event.
        CommEst = 4,
        /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD was drained
        /// of outstanding messages. QP event.
        SqDrained = 5,
        /// `IBV_EVENT_PATH_MIG`: a connection has migrated to the alternate
        /// path. QP event.
        PathMig = 6,
        /// `IBV_EVENT_PATH_MIG_ERR`: a connection failed to migrate to the
        /// alternate path. QP event.
        PathMigErr = 7,
        /// `IBV_EVENT_DEVICE_FATAL`: the CA is in the FATAL state. Device
        /// event.
        DeviceFatal = 8,
        /// `IBV_EVENT_PORT_ACTIVE`: link became active on a port. Port event.
        PortActive = 9,
        /// `IBV_EVENT_PORT_ERR`: link became unavailable on a port. Port event.
        PortErr = 10,
        /// `IBV_EVENT_LID_CHANGE`: LID was changed on a port. Port event.
        LidChange = 11,
        /// `IBV_EVENT_PKEY_CHANGE`: P_Key table was changed on a port. Port
        /// event.
        PkeyChange = 12,
        /// `IBV_EVENT_SM_CHANGE`: SM was changed on a port. Port event.
        SmChange = 13,
        /// `IBV_EVENT_SRQ_ERR`: error occurred on an SRQ. SRQ event.
        SrqErr = 14,
        /// `IBV_EVENT_SRQ_LIMIT_REACHED`: SRQ limit was reached. SRQ event.
        SrqLimitReached = 15,
        /// `IBV_EVENT_QP_LAST_WQE_REACHED`: last WQE reached on a QP
        /// associated with an SRQ. QP event.
        QpLastWqeReached = 16,
        /// `IBV_EVENT_CLIENT_REREGISTER`: the SM sent a CLIENT_REREGISTER
        /// request to a port. Port event.
        ClientReregister = 17,
        /// `IBV_EVENT_GID_CHANGE`: GID table was changed on a port. Port event.
        GidChange = 18,
        /// `IBV_EVENT_WQ_FATAL`: error occurred on a WQ and it transitioned to
        /// the error state. WQ event.
        WqFatal = 19,
        /// `IBV_EVENT_DEVICE_SPEED_CHANGE`: link speed changed on one or more
        /// ports of the device. Device event. (Newer than the manual; from
        /// current libibverbs.)
        DeviceSpeedChange = 20,
    }
}

/// Which member of the `ibv_async_event` element union an event type carries
/// (manual 3.7.1 ibv_get_async_event: QP, CQ, SRQ, port and CA events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementKind {
    /// A completion queue (`element.cq`).
    Cq,
    /// A queue pair (`element.qp`).
    Qp,
    /// A shared receive queue (`element.srq`).
    Srq,
    /// A port (`element.port_num`).
    Port,
    /// A work queue (`element.wq`).
    Wq,
    /// The device (CA) as a whole; no element.
    Device,
}

impl AsyncEventType {
    /// The kind of element an event of this type refers to, per the grouping
    /// of manual 3.7.1 ibv_get_async_event (and the libibverbs man page for
    /// `PATH_MIG_ERR`, `WQ_FATAL` and `DEVICE_SPEED_CHANGE`).
    #[must_use]
    pub const fn element_kind(self) -> ElementKind {
        use AsyncEventType as T;
        match self {
            T::CqErr => ElementKind::Cq,
            T::QpFatal
            | T::QpReqErr
            | T::QpAccessErr
            | T::CommEst
            | T::SqDrained
            | T::PathMig
            | T::PathMigErr
            | T::QpLastWqeReached => ElementKind::Qp,
            T::SrqErr | T::SrqLimitReached => ElementKind::Srq,
            T::PortActive
            | T::PortErr
            | T::LidChange
            | T::PkeyChange
            | T::SmChange
            | T::ClientReregister
            | T::GidChange => ElementKind::Port,
            T::WqFatal => ElementKind::Wq,
            T::DeviceFatal | T::DeviceSpeedChange => ElementKind::Device,
        }
    }

    /// The text `ibv_event_type_str` returns for this event type.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        use AsyncEventType as T;
        match self {
            T::CqErr => "CQ error",
            T::QpFatal => "local work queue catastrophic error",
            T::QpReqErr => "invalid request local work queue error",
            T::QpAccessErr => "local access violation work queue error",
            T::CommEst => "communication established",
            T::SqDrained => "send queue drained",
            T::PathMig => "path migrated",
            T::PathMigErr => "path migration request error",
            T::DeviceFatal => "local catastrophic error",
            T::PortActive => "port active",
            T::PortErr => "port error",
            T::LidChange => "LID change",
            T::PkeyChange => "P_Key change",
            T::SmChange => "SM change",
            T::SrqErr => "SRQ catastrophic error",
            T::SrqLimitReached => "SRQ limit reached",
            T::QpLastWqeReached => "last WQE reached",
            T::ClientReregister => "client reregistration",
            T::GidChange => "GID table change",
            T::WqFatal => "WQ fatal",
            T::DeviceSpeedChange => "Device link speed change",
        }
    }
}

impl fmt::Display for AsyncEventType {
    /// Exactly `ibv_event_type_str` (manual 3.7.3).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object an async event is about: the valid member of libibverbs'
/// element union, with objects named by number instead of pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A completion queue, by the device's CQ handle number.
    Cq(u32),
    /// A queue pair, by QP number (`qp_num`).
    Qp(u32),
    /// A shared receive queue, by SRQ number.
    Srq(u32),
    /// A port, by port number (1 is the first port).
    Port(u8),
    /// A work queue, by WQ number.
    Wq(u32),
    /// The device as a whole.
    Device,
}

impl EventElement {
    /// Which kind of element this is.
    #[must_use]
    pub const fn kind(&self) -> ElementKind {
        match self {
            EventElement::Cq(_) => ElementKind::Cq,
            EventElement::Qp(_) => ElementKind::Qp,
            EventElement::Srq(_) => ElementKind::Srq,
            EventElement::Port(_) => ElementKind::Port,
            EventElement::Wq(_) => ElementKind::Wq,
            EventElement::Device => ElementKind::Device,
        }
    }
}

impl fmt::Display for EventElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventElement::Cq(n) => write!(f, "CQ {n}"),
            EventElement::Qp(n) => write!(f, "QP {n:#x}"),
            EventElement::Srq(n) => write!(f, "SRQ {n}"),
            EventElement::Port(n) => write!(f, "port {n}"),
            EventElement::Wq(n) => write!(f, "WQ {n}"),
            EventElement::Device => f.write_str("device"),
        }
    }
}

/// `struct ibv_async_event` (manual 3.7.1 ibv_get_async_event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: AsyncEventType,
    /// To which object.
    pub element: EventElement,
}

impl AsyncEvent {
    /// True if `element` is of the kind `event_type` carries
    /// ([`AsyncEventType::element_kind`]).
    #[must_use]
    pub const fn is_well_formed(&self) -> bool {
        self.event_type.element_kind() as u8 == self.element.kind() as u8
    }
}

impl fmt::Display for AsyncEvent {
    /// E.g. `"communication established (QP 0x11)"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.event_type, self.element)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        assert_eq!(AsyncEventType::ALL.len(), 21);
        for (i, t) in AsyncEventType::ALL.iter().enumerate() {
            assert_eq!(t.as_u32() as usize, i);
            assert_eq!(AsyncEventType::try_from(t.as_u32()), Ok(*t));
        }
        assert_eq!(AsyncEventType::DeviceFatal as u32, 8);
        assert_eq!(AsyncEventType::WqFatal as u32, 19);
        assert!(AsyncEventType::try_from(21).is_err());
    }

    #[test]
    fn strings_match_ibv_event_type_str() {
        assert_eq!(AsyncEventType::CqErr.to_string(), "CQ error");
        assert_eq!(
            AsyncEventType::QpFatal.to_string(),
            "local work queue catastrophic error"
        );
        assert_eq!(
            AsyncEventType::CommEst.to_string(),
            "communication established"
        );
        assert_eq!(AsyncEventType::SqDrained.to_string(), "send queue drained");
        assert_eq!(AsyncEventType::PkeyChange.to_string(), "P_Key change");
        assert_eq!(
            AsyncEventType::QpLastWqeReached.to_string(),
            "last WQE reached"
        );
        assert_eq!(AsyncEventType::GidChange.to_string(), "GID table change");
        assert_eq!(AsyncEventType::WqFatal.to_string(), "WQ fatal");
    }

    #[test]
    fn element_kinds_follow_the_manual() {
        use AsyncEventType as T;
        let count = |k| T::ALL.iter().filter(|t| t.element_kind() == k).count();
        assert_eq!(count(ElementKind::Qp), 8);
        assert_eq!(count(ElementKind::Cq), 1);
        assert_eq!(count(ElementKind::Srq), 2);
        assert_eq!(count(ElementKind::Port), 7);
        assert_eq!(count(ElementKind::Wq), 1);
        assert_eq!(count(ElementKind::Device), 2);
        assert_eq!(T::CommEst.element_kind(), ElementKind::Qp);
        assert_eq!(T::PortActive.element_kind(), ElementKind::Port);
        assert_eq!(T::DeviceFatal.element_kind(), ElementKind::Device);
    }

    #[test]
    fn well_formed_and_display() {
        let ev = AsyncEvent {
            event_type: AsyncEventType::CommEst,
            element: EventElement::Qp(0x11),
        };
        assert!(ev.is_well_formed());
        assert_eq!(ev.to_string(), "communication established (QP 0x11)");
        let bad = AsyncEvent {
            event_type: AsyncEventType::CqErr,
            element: EventElement::Port(1),
        };
        assert!(!bad.is_well_formed());
    }
}
