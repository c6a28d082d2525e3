//! The General Services Interface QP, QP1 (IBTA 13.5.1: "QP1 ... is used for all
//! General Services management datagrams"; every port has one).
//!
//! QP1 is a UD QP with QP number 1 whose Q_Key is fixed at 0x8001_0000 (IBTA 13.5,
//! "the well-known GSI Q_Key"). The connection manager sends and receives its MADs on
//! it; RoCEv2 carries them as UD SENDs to destination QP 1, as kernel rxe does.
//!
//! libibverbs has no QP type for it (the kernel keeps QP1 for its own MAD layer), so
//! the emulator takes the driver-specific type: `create_qp` with `QpType::Driver` makes
//! the device's QP1 (EBUSY if it exists). Otherwise it is an ordinary UD QP that
//! `query_qp` reports as UD: the same verbs bring it to RTS and post on it. Its Q_Key
//! stays the GSI Q_Key whatever `modify_qp` is given, and a packet with another Q_Key is
//! dropped and counted as any Q_Key violation.

/// The GSI QP's number (IBTA 13.5.1).
pub const GSI_QPN: u32 = 1;

/// The well-known Q_Key of QP1 (IBTA 13.5: 0x8001_0000).
pub const GSI_QKEY: u32 = 0x8001_0000;
