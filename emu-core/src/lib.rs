//! The emulated RDMA NIC (the engine lands in the next commit).
#![forbid(unsafe_code)]
