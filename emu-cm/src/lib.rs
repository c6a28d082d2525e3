//! The emulator's connection manager: librdmacm's API ([`verbs_api::ConnectionManager`])
//! over the IB CM protocol, carried in MADs on QP1 inside RoCEv2 as rdma_cm does over
//! kernel rxe (the RDMA IP CM service IDs, rdma_cm's private-data header with the IP
//! addresses), so the wire is the one a real rdma_cm peer speaks.
//!
//! An [`EmuCm`] is the CM of one host: it serves the devices it is given (each gets its
//! GSI QP, QP1, made through the plain `Device` verbs; see `emu_core::engine::gsi`), and
//! an id is bound to the device that owns its address or reaches its peer. It uses
//! nothing of a device but [`Device`], so it runs over any backend that has QP1.
//!
//! - `emu_wire::mad`: the CM MADs as bytes.
//! - `agent`: one device's QP1, buffers and address handles.
//! - `proto`: ids, states, timers, and what each MAD does; time is passed in.
//! - `fabric` (feature `fabric`): the CM on a simulated fabric's clock.
//!
//! Time: [`EmuCm::open`] runs on real time, with a thread that takes MADs as they
//! arrive and fires the CM's timers. `EmuCm::on_fabric` (feature `fabric`, on by
//! default) runs on the clock of a `emu_sims::Fabric`, with no thread: the fabric fires
//! the CM's timers at its `now` and, after each packet it delivers, lets the CM take
//! the MADs that arrived, in order with everything else on the fabric; a CM call that
//! waits (`get_cm_event`, `get_request`) runs the fabric until its event comes or
//! nothing can happen any more. A single-threaded test is then deterministic, and a
//! lost REQ costs no real time.
#![forbid(unsafe_code)]

mod agent;
#[cfg(feature = "fabric")]
mod fabric;
mod proto;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use verbs_api::{
    CmChannelId, CmEvent, CmEventType, CmId, CmIdInfo, ConnParam, ConnectionManager, Device, Error,
    PortSpace, QpAttr, QpAttrMask, QpInitAttr, QpState, Result,
};

use agent::Agent;
use emu_core::notify::Notifier;
use emu_wire::mad;

/// The queue of one `rdma_event_channel`.
type EventQueue = Notifier<CmEvent>;
use proto::State;
pub use proto::{cm_time, RDMA_UDP_QKEY};

/// The CM's timing choices (IBTA 12, with rdma_cm's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmConfig {
    /// How long to wait for an answer, as IBTA's time code (4.096 us * 2^t); also the
    /// time-wait. rdma_cm: 20 (about 4.3 s).
    pub response_timeout: u8,
    /// Times a REQ, REP, DREQ or SIDR_REQ is sent again before giving up. rdma_cm: 15.
    pub max_retries: u8,
    /// The service timeout an MRA asks for (time code).
    pub mra_service_timeout: u8,
    /// The local ACK timeout of the connected QPs (time code).
    pub ack_timeout: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 20,
            max_retries: 15,
            mra_service_timeout: 22,
            ack_timeout: 14,
        }
    }
}

/// What a CM counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs sent (retransmissions included).
    pub sent: u64,
    /// MADs received.
    pub received: u64,
    /// REQ, REP, DREQ and SIDR_REQ sent again after a timeout.
    pub retransmits: u64,
    /// MRAs sent.
    pub mra_sent: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// Received MADs that were not CM MADs, or malformed.
    pub dropped: u64,
    /// MADs that matched no id in a state that takes them (stale duplicates).
    pub unmatched: u64,
    /// MADs that could not be posted.
    pub send_errors: u64,
}

/// The time a CM runs on, and how a CM call that waits for an event lets it pass.
trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;

    /// Waits up to `timeout` (forever for `None`) for an event of `q` that `want`
    /// takes, while the CM `cm` moves on this clock; `taken` sees it under the
    /// queue's lock ([`Notifier::pop_where_then`]).
    fn wait(
        &self,
        cm: &Shared,
        q: &EventQueue,
        want: &dyn Fn(&CmEvent) -> bool,
        taken: &dyn Fn(&CmEvent),
        timeout: Option<Duration>,
    ) -> Result<CmEvent>;
}

/// Real time: the CM's thread takes MADs as they come and fires the timers
/// ([`Shared::run`]); a call waits for its event in real time.
struct RealTime;

impl Clock for RealTime {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wait(
        &self,
        _: &Shared,
        q: &EventQueue,
        want: &dyn Fn(&CmEvent) -> bool,
        taken: &dyn Fn(&CmEvent),
        timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        q.pop_where_then(want, timeout, taken)
    }
}

/// One CM's state behind its lock.
struct Shared {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    stop: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// The CM thread of real time: takes MADs as they come, fires timers.
    fn run(&self) {
        let (dev, ch, many) = {
            let st = self.state.lock();
            let a = &st.agents[0];
            (a.dev.clone(), a.channel, st.agents.len() > 1)
        };
        while !self.stop.load(Ordering::Relaxed) {
            let next = {
                let mut st = self.state.lock();
                let now = Instant::now();
                st.pump(now);
                st.next_deadline().map(|t| t.saturating_duration_since(now))
            };
            let cap = if many {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(20)
            };
            let wait = next.map_or(cap, |d| d.min(cap));
            if !matches!(
                dev.get_cq_event(ch, Some(wait)),
                Ok(_) | Err(Error::TimedOut)
            ) {
                // The device cannot wait (it is gone): keep the tick without spinning.
                std::thread::sleep(wait);
            }
        }
    }
}

/// The emulator's connection manager over a set of devices. See the [module docs](self).
pub struct EmuCm {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EmuCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuCm").finish_non_exhaustive()
    }
}

fn agents(devices: Vec<Arc<dyn Device>>) -> Result<Vec<Agent>> {
    if devices.is_empty() {
        return Err(Error::NoDevice("a CM needs a device".into()));
    }
    let mut out: Vec<Agent> = Vec::with_capacity(devices.len());
    for d in devices {
        match Agent::open(d) {
            Ok(a) => out.push(a),
            Err(e) => {
                for a in &mut out {
                    a.close();
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}

impl EmuCm {
    /// The CM of `devices` on real time (devices on UDP), with its own thread. Each
    /// device gets its QP1 (EBUSY if another CM serves it already).
    pub fn open(devices: Vec<Arc<dyn Device>>, cfg: CmConfig) -> Result<EmuCm> {
        // The first Local Communication ID differs per CM (see `emu_core::seed`).
        let mut state = State::new(agents(devices)?, cfg, emu_core::seed::instance_seed());
        state.host_ports = true;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            clock: Arc::new(RealTime),
            stop: AtomicBool::new(false),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("emu-cm".into())
            .spawn(move || worker.run())
            .map_err(|_| Error::NoMemory("cannot start the CM thread"))?;
        Ok(EmuCm {
            shared,
            thread: Some(thread),
        })
    }

    /// What the CM counted.
    pub fn stats(&self) -> CmStats {
        self.shared.state.lock().stats
    }

    /// `rdma_init_qp_attr` (manual 4.2.23): the attributes and attribute mask that
    /// bring a QP the program drives itself (one it made with `create_qp` on the
    /// device, not through [`ConnectionManager::create_qp`]) to `state` for this id's
    /// connection, as the kernel's `rdma_init_qp_attr` gives them (see
    /// `proto::State::init_qp_attr`). EINVAL when the id's state cannot give them.
    pub fn init_qp_attr(&self, id: CmId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        self.with(|s, _| s.init_qp_attr(id, state))
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT)`: the local ACK
    /// timeout (IBTA time code) of the id's QP, used when the CM moves it to RTS and
    /// returned by [`EmuCm::init_qp_attr`]. EINVAL for an id that is not RC.
    pub fn set_ack_timeout(&self, id: CmId, timeout: u8) -> Result<()> {
        self.with(|s, _| s.set_ack_timeout(id, timeout))
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)`: the traffic class of the
    /// id's path (the GRH of its QP's address vector, and of its REQ).
    pub fn set_tos(&self, id: CmId, tos: u8) -> Result<()> {
        self.with(|s, _| s.set_tos(id, tos))
    }

    /// The id goes as the kernel destroys the ids of an event channel whose file is
    /// closed (`rdma_destroy_event_channel` with ids still on it, or the process
    /// ending): the peer is told as [`ConnectionManager::destroy_id`] tells it, and a
    /// QP the CM made for the id stays on its device, no longer the CM's.
    pub fn abandon_id(&self, id: CmId) -> Result<()> {
        self.with(|s, now| s.abandon_id(id, now))
    }

    fn with<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let now = self.shared.clock.now();
        let mut st = self.shared.state.lock();
        st.watch();
        f(&mut st, now)
    }

    fn wait_event(
        &self,
        ch: u32,
        want: &dyn Fn(&CmEvent) -> bool,
        taken: &dyn Fn(&CmEvent),
        timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        let q: Arc<EventQueue> = self
            .shared
            .state
            .lock()
            .channels
            .get(&ch)
            .cloned()
            .ok_or(Error::InvalidArgument("no such event channel"))?;
        self.shared
            .clock
            .wait(&self.shared, &q, want, taken, timeout)
    }

    /// [`ConnectionManager::get_cm_event`], calling `reported` with the event before a
    /// [`ConnectionManager::destroy_id`] of its id can find the channel without it: a
    /// caller that counts the events handed out per id (librdmacm's
    /// `events_reported`, which `rdma_destroy_id` waits for) misses none.
    pub fn get_cm_event_reported(
        &self,
        ch: CmChannelId,
        timeout: Option<Duration>,
        reported: &dyn Fn(&CmEvent),
    ) -> Result<CmEvent> {
        self.wait_event(ch.0, &|_| true, reported, timeout)
    }

    /// [`ConnectionManager::get_request`], calling `reported` as
    /// [`EmuCm::get_cm_event_reported`] does.
    pub fn get_request_reported(
        &self,
        listen: CmId,
        timeout: Option<Duration>,
        reported: &dyn Fn(&CmEvent),
    ) -> Result<CmEvent> {
        let ch = self.with(|s, _| s.channel_of(listen))?;
        self.wait_event(
            ch,
            &|e| e.event == CmEventType::ConnectRequest && e.listen_id == Some(listen),
            reported,
            timeout,
        )
    }
}

impl Drop for EmuCm {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.state.lock().close();
    }
}

impl ConnectionManager for EmuCm {
    fn create_event_channel(&self) -> Result<CmChannelId> {
        self.with(|s, _| s.create_channel()).map(CmChannelId)
    }

    fn destroy_event_channel(&self, ch: CmChannelId) -> Result<()> {
        self.with(|s, _| s.destroy_channel(ch.0))
    }

    fn event_channel_fd(&self, ch: CmChannelId) -> Result<i32> {
        self.with(|s, _| {
            s.channels
                .get(&ch.0)
                .map(|q| q.fd())
                .ok_or(Error::InvalidArgument("no such event channel"))
        })
    }

    fn get_cm_event(&self, ch: CmChannelId, timeout: Option<Duration>) -> Result<CmEvent> {
        self.get_cm_event_reported(ch, timeout, &|_| {})
    }

    fn create_id(&self, ch: CmChannelId, ps: PortSpace) -> Result<CmId> {
        self.with(|s, _| s.create_id(ch.0, ps))
    }

    fn migrate_id(&self, id: CmId, ch: CmChannelId) -> Result<()> {
        self.with(|s, _| s.migrate_id(id, ch.0))
    }

    fn destroy_id(&self, id: CmId) -> Result<()> {
        self.with(|s, now| s.destroy_id(id, now))
    }

    fn bind_addr(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        self.with(|s, _| s.bind(id, addr))
    }

    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        self.with(|s, now| s.resolve_addr(id, src, dst, timeout, now))
    }

    fn resolve_route(&self, id: CmId, _timeout: Duration) -> Result<()> {
        self.with(|s, _| s.resolve_route(id))
    }

    fn listen(&self, id: CmId, backlog: u32) -> Result<()> {
        self.with(|s, _| s.listen(id, backlog))
    }

    fn get_request(&self, listen: CmId, timeout: Option<Duration>) -> Result<CmEvent> {
        self.get_request_reported(listen, timeout, &|_| {})
    }

    fn create_qp(&self, id: CmId, init: &QpInitAttr) -> Result<u32> {
        self.with(|s, _| s.create_qp(id, init))
    }

    fn destroy_qp(&self, id: CmId) -> Result<()> {
        self.with(|s, _| s.destroy_qp(id))
    }

    fn connect(&self, id: CmId, param: &ConnParam) -> Result<()> {
        self.with(|s, now| s.connect(id, param, now))
    }

    fn establish(&self, id: CmId) -> Result<()> {
        self.with(|s, now| s.establish(id, now))
    }

    fn accept(&self, id: CmId, param: &ConnParam) -> Result<()> {
        self.with(|s, now| s.accept(id, param, now))
    }

    fn reject(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        self.with(|s, now| s.reject(id, private_data, mad::reason::CONSUMER, now))
    }

    fn disconnect(&self, id: CmId) -> Result<()> {
        self.with(|s, now| s.disconnect(id, now))
    }

    fn join_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        self.with(|s, _| s.join_multicast(id, addr))
    }

    fn leave_multicast(&self, id: CmId, addr: SocketAddr) -> Result<()> {
        self.with(|s, _| s.leave_multicast(id, addr))
    }

    fn id_info(&self, id: CmId) -> Result<CmIdInfo> {
        self.with(|s, _| s.info(id))
    }

    fn device(&self, id: CmId) -> Result<Arc<dyn Device>> {
        self.with(|s, _| s.device(id))
    }
}
