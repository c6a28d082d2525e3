//! Ping-pong on several RC QPs that share one receive queue, after rdma-core's
//! `ibv_srq_pingpong`: `srq_pingpong` (server), `srq_pingpong 127.0.0.1` (client),
//! `srq_pingpong --loopback`; `-q N` QPs per side (16 by default). See
//! `common/pingpong.rs` for the options.

#[path = "common/checks.rs"]
mod checks;
#[path = "common/pingpong.rs"]
mod pingpong;

fn main() {
    pingpong::main(pingpong::Mode::Srq);
}
