//! UD ping-pong between two emulated devices, after rdma-core's `ibv_ud_pingpong`:
//! `ud_pingpong` (server), `ud_pingpong 127.0.0.1` (client), `ud_pingpong --loopback`.
//! Messages are one packet (`-s` up to the MTU, 2048 by default); each receive buffer
//! starts with the 40-byte GRH. See `common/pingpong.rs` for the options.

#[path = "common/checks.rs"]
mod checks;
#[path = "common/pingpong.rs"]
mod pingpong;

fn main() {
    pingpong::main(pingpong::Mode::Ud);
}
