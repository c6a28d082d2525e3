//! RC ping-pong between two emulated devices, after rdma-core's `ibv_rc_pingpong`:
//! `rc_pingpong` (server), `rc_pingpong 127.0.0.1` (client), `rc_pingpong --loopback`.
//! See `common/pingpong.rs` for the options.

#[path = "common/checks.rs"]
mod checks;
#[path = "common/pingpong.rs"]
mod pingpong;

fn main() {
    pingpong::main(pingpong::Mode::Rc);
}
