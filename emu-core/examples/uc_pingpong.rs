//! UC ping-pong between two emulated devices, after rdma-core's `ibv_uc_pingpong`:
//! `uc_pingpong` (server), `uc_pingpong 127.0.0.1` (client), `uc_pingpong --loopback`.
//! UC has no retransmission: a lost packet loses its message, as on real hardware.

#[path = "common/checks.rs"]
mod checks;
#[path = "common/pingpong.rs"]
mod pingpong;

fn main() {
    pingpong::main(pingpong::Mode::Uc);
}
