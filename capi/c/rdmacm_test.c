/*
 * rdmacm_test: the librdmacm calls of capi's librdmacm.so.1 from C, compiled against
 * the real <rdma/rdma_cma.h> and <rdma/rdma_verbs.h>. One process, two emulated
 * devices, a server and a client connected over loopback:
 *   RDMA_EMU_DEVICES="emu0=127.0.0.5,emu1=127.0.0.6" ./rdmacm_test [SERVER_IP CLIENT_IP]
 * (the two devices' addresses; 127.0.0.5 and 127.0.0.6 unless given).
 * Event channels and ids, address and route resolution, listen, connect with
 * private data, accept, a SEND each way and an RDMA WRITE with the rdma_verbs.h
 * helpers (rdma_reg_*, rdma_post_*, rdma_get_*_comp), disconnect, teardown; and the
 * calls the emulator does not have failing cleanly. Then two connections whose QPs the
 * program makes itself with ibv_create_qp (in id->qp, which librdmacm moves, or named
 * only by conn_param.qp_num, moved by the program with rdma_init_qp_attr), with a
 * synchronous server id (id->event), the id's PD, rdma_set_option, and an event
 * channel destroyed with an id still on it. Every check prints what failed and the
 * program exits 1; exit 0 means all passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

#include "check.h"

static const char *SRV_IP = "127.0.0.5", *CLI_IP = "127.0.0.6";
#define PORT 7391

static struct sockaddr_in sin_of(const char *ip, uint16_t port)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, ip, &s.sin_addr) == 1, "address %s", ip);
	return s;
}

/* The next event of a channel (5 s at most), which must be `type` with status 0. */
static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch,
					  enum rdma_cm_event_type type)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 5000) == 1, "no %s within 5 s", rdma_event_str(type));
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0, "get_cm_event");
	CHECK(ev->event == type && ev->status == 0, "event %s status %d, want %s",
	      rdma_event_str(ev->event), ev->status, rdma_event_str(type));
	return ev;
}

/* The masks rdma_init_qp_attr gives (the kernel's ib_cm_init_qp_attr and
 * cma_ib_init_qp_attr). */
#define MASK_GENERIC (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT)
#define MASK_INIT (MASK_GENERIC | IBV_QP_ACCESS_FLAGS)
#define MASK_RTR (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | \
		  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define MASK_RTS (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | \
		  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)

/* A QP the program makes itself on the id's device and PD, with one CQ. */
static struct ibv_qp *make_qp(struct rdma_cm_id *id, struct ibv_cq **cq)
{
	CHECK(id->verbs && id->pd && id->pd->context == id->verbs, "the id has its device's PD");
	*cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	CHECK(*cq, "create_cq");
	struct ibv_qp_init_attr a = { .send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(id->pd, &a);
	CHECK(qp && qp->state == IBV_QPS_RESET, "ibv_create_qp");
	return qp;
}

/* Moves the program's QP of `id` to RTS with rdma_init_qp_attr, as librdmacm's
 * ucma_modify_qp_rtr/_rts do, checking what each state gives: `peer_qpn` is the
 * peer's QP, `timeout` the ACK timeout the RTS step must carry. */
static void move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, uint32_t peer_qpn, uint8_t timeout)
{
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0xab, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "init_qp_attr INIT");
	CHECK(mask == MASK_INIT && a.qp_state == IBV_QPS_INIT && a.port_num == id->port_num &&
	      a.pkey_index == 0, "INIT mask %#x", mask);
	CHECK(a.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				    IBV_ACCESS_REMOTE_ATOMIC), "INIT access %#x (responder resources 1)",
	      a.qp_access_flags);
	CHECK(ibv_modify_qp(qp, &a, mask) == 0 && qp->state == IBV_QPS_INIT, "modify INIT");
	memset(&a, 0xab, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "init_qp_attr RTR");
	CHECK(mask == MASK_RTR && a.qp_state == IBV_QPS_RTR, "RTR mask %#x", mask);
	CHECK(a.dest_qp_num == peer_qpn, "RTR dest_qp_num %#x, want %#x", a.dest_qp_num, peer_qpn);
	CHECK(a.min_rnr_timer == 0 && a.max_dest_rd_atomic == 1 && a.path_mtu >= IBV_MTU_1024 &&
	      a.path_mtu <= IBV_MTU_4096, "RTR rnr timer %u, rd atomic %u, mtu %d",
	      a.min_rnr_timer, a.max_dest_rd_atomic, a.path_mtu);
	struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(id);
	CHECK(a.ah_attr.is_global && a.ah_attr.port_num == id->port_num &&
	      memcmp(&a.ah_attr.grh.dgid.raw[12], &peer->sin_addr, 4) == 0 &&
	      a.ah_attr.grh.dgid.raw[10] == 0xff && a.ah_attr.grh.dgid.raw[11] == 0xff,
	      "RTR address vector: the peer's IPv4-mapped GID");
	CHECK(ibv_modify_qp(qp, &a, mask) == 0 && qp->state == IBV_QPS_RTR, "modify RTR");
	memset(&a, 0xab, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "init_qp_attr RTS");
	CHECK(mask == MASK_RTS && a.qp_state == IBV_QPS_RTS, "RTS mask %#x", mask);
	CHECK(a.timeout == timeout && a.retry_cnt == 7 && a.rnr_retry == 7 && a.max_rd_atomic == 1,
	      "RTS timeout %u (want %u), retry %u, rnr %u, rd atomic %u", a.timeout, timeout,
	      a.retry_cnt, a.rnr_retry, a.max_rd_atomic);
	CHECK(ibv_modify_qp(qp, &a, mask) == 0 && qp->state == IBV_QPS_RTS, "modify RTS");
}

/* The next completion of a CQ (5 s at most), which must be a success of `opcode`. */
static void expect_wc(struct ibv_cq *cq, enum ibv_wc_opcode opcode, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 500000 && n == 0; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n == 0)
			usleep(10);
	}
	CHECK(n == 1, "a completion of wr %#lx", (unsigned long)wr_id);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == opcode && wc.wr_id == wr_id,
	      "wc %s opcode %d wr_id %#lx", ibv_wc_status_str(wc.status), wc.opcode,
	      (unsigned long)wc.wr_id);
}

/* The synchronous server of the second connection, on its own thread: a listening
 * id with no channel, rdma_get_request, a QP of its own named only by
 * conn_param.qp_num (moved with rdma_init_qp_attr, ACK timeout 18 set by option),
 * a blocking rdma_accept that leaves ESTABLISHED in id->event, a receive, and a
 * blocking rdma_disconnect. */
struct sync_server {
	struct rdma_cm_id *listen, *id;
	char buf[64];
	int done;
};

static void *sync_server_run(void *arg)
{
	struct sync_server *s = arg;
	CHECK(rdma_get_request(s->listen, &s->id) == 0, "sync get_request");
	CHECK(s->id->event && s->id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST &&
	      s->id->event->id == s->id, "get_request keeps the request in id->event");
	uint32_t peer_qpn = s->id->event->param.conn.qp_num;
	struct ibv_cq *cq;
	struct ibv_qp *qp = make_qp(s->id, &cq);
	uint8_t t = 18;
	CHECK(rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 1) == 0,
	      "ACK_TIMEOUT option");
	move_qp(s->id, qp, peer_qpn, 18);
	struct ibv_mr *mr = ibv_reg_mr(s->id->pd, s->buf, sizeof(s->buf),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "server reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = 32, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 0x61, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &rwr, &bad) == 0, "server post_recv");
	struct rdma_conn_param ap = { .responder_resources = 1, .initiator_depth = 1,
				      .qp_num = qp->qp_num, .private_data = mr,
				      .private_data_len = sizeof(mr) };
	/* The client learns where to RDMA READ from the reply's private data. */
	struct { uint64_t addr; uint32_t rkey; } __attribute__((packed)) where = {
		(uintptr_t)s->buf + 32, mr->rkey };
	strcpy(s->buf + 32, "read me");
	ap.private_data = &where;
	ap.private_data_len = sizeof(where);
	CHECK(s->id->qp == NULL, "the server's QP is not in id->qp");
	CHECK(rdma_accept(s->id, &ap) == 0, "sync accept");
	CHECK(s->id->event && s->id->event->event == RDMA_CM_EVENT_ESTABLISHED &&
	      s->id->event->id == s->id && s->id->event->status == 0,
	      "sync accept leaves ESTABLISHED in id->event");
	expect_wc(cq, IBV_WC_RECV, 0x61);
	CHECK(strcmp(s->buf, "from the client") == 0, "server received the client's bytes");
	CHECK(rdma_disconnect(s->id) == 0, "sync disconnect");
	CHECK(s->id->event && s->id->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "sync disconnect leaves DISCONNECTED in id->event");
	CHECK(ibv_destroy_qp(qp) == 0, "the program destroys its own QP");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0, "server teardown");
	CHECK(rdma_destroy_id(s->id) == 0, "destroy the sync server id");
	s->done = 1;
	return NULL;
}

/* What the client tells the server in its connect private data. */
struct offer {
	uint64_t addr;
	uint32_t rkey;
	char hello[12];
} __attribute__((packed));

int main(int argc, char **argv)
{
	if (argc == 3) {
		SRV_IP = argv[1];
		CLI_IP = argv[2];
	}
	/* Devices, addresses. */
	int n = 0;
	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 2 && devs[0] && devs[1] && !devs[2], "rdma_get_devices: %d", n);
	rdma_free_devices(devs);
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	CHECK(rdma_getaddrinfo(SRV_IP, "7391", &hints, &res) == 0 && res->ai_src_addr &&
	      res->ai_src_addr->sa_family == AF_INET, "rdma_getaddrinfo");
	struct sockaddr_in want = sin_of(SRV_IP, PORT);
	CHECK(((struct sockaddr_in *)res->ai_src_addr)->sin_port == want.sin_port &&
	      ((struct sockaddr_in *)res->ai_src_addr)->sin_addr.s_addr == want.sin_addr.s_addr,
	      "getaddrinfo: passive address %s:7391", SRV_IP);
	rdma_freeaddrinfo(res);
	/* No node or service: the hints' own addresses (librdmacm copies them; libfabric's
	 * verbs provider asks this way). Nothing at all: EINVAL. */
	struct sockaddr_in hsrc = sin_of(CLI_IP, 7392);
	struct rdma_addrinfo h2 = { .ai_port_space = RDMA_PS_UDP,
				    .ai_src_addr = (struct sockaddr *)&hsrc,
				    .ai_src_len = sizeof(hsrc) };
	CHECK(rdma_getaddrinfo(NULL, NULL, &h2, &res) == 0 && res->ai_src_addr &&
	      !res->ai_dst_addr && res->ai_port_space == RDMA_PS_UDP &&
	      ((struct sockaddr_in *)res->ai_src_addr)->sin_addr.s_addr == hsrc.sin_addr.s_addr &&
	      ((struct sockaddr_in *)res->ai_src_addr)->sin_port == hsrc.sin_port,
	      "getaddrinfo from hints");
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) != 0 && errno == EINVAL, "no node, service, hints");
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0,
	      "event_str");

	/* Channels; an empty non-blocking channel says EAGAIN. */
	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	CHECK(sch && cch && sch->fd >= 0 && cch->fd >= 0 && sch->fd != cch->fd, "channels");
	int fl = fcntl(cch->fd, F_GETFL);
	CHECK(fcntl(cch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "non-blocking");
	struct rdma_cm_event *ev;
	errno = 0;
	CHECK(rdma_get_cm_event(cch, &ev) == -1 && errno == EAGAIN, "empty channel: EAGAIN");
	CHECK(fcntl(cch->fd, F_SETFL, fl) == 0, "blocking again");

	/* rdma_migrate_id: the id's events, the one already pending too, go to the new
	 * channel; NULL makes it synchronous on a channel of its own. */
	struct rdma_event_channel *mch = rdma_create_event_channel();
	struct rdma_cm_id *mid;
	CHECK(mch && rdma_create_id(cch, &mid, NULL, RDMA_PS_TCP) == 0, "id to migrate");
	struct sockaddr_in msrc = sin_of(CLI_IP, 0), mdst = sin_of(SRV_IP, 7399);
	CHECK(rdma_resolve_addr(mid, (struct sockaddr *)&msrc, (struct sockaddr *)&mdst, 2000) == 0,
	      "resolve_addr before migrating");
	struct pollfd mp = { .fd = cch->fd, .events = POLLIN };
	CHECK(poll(&mp, 1, 5000) == 1, "ADDR_RESOLVED pending on the old channel");
	CHECK(rdma_migrate_id(mid, mch) == 0 && mid->channel == mch, "migrate");
	CHECK(fcntl(cch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "non-blocking");
	errno = 0;
	CHECK(rdma_get_cm_event(cch, &ev) == -1 && errno == EAGAIN, "the old channel has nothing");
	CHECK(fcntl(cch->fd, F_SETFL, fl) == 0, "blocking again");
	CHECK(rdma_get_cm_event(mch, &ev) == 0 && ev->id == mid &&
	      ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "the pending event moved");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	CHECK(rdma_migrate_id(mid, NULL) == 0 && mid->channel && mid->channel != mch &&
	      mid->channel != cch, "migrate to synchronous");
	CHECK(rdma_resolve_route(mid, 2000) == 0, "a synchronous resolve_route");
	CHECK(rdma_destroy_id(mid) == 0, "destroy the migrated id");
	rdma_destroy_event_channel(mch);
	CHECK(rdma_migrate_id(NULL, cch) == -1 && errno == EINVAL, "migrate NULL");

	/* Server: bind, listen. */
	struct rdma_cm_id *listen_id, *cid, *sid;
	CHECK(rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP) == 0 && listen_id->channel == sch,
	      "create listen id");
	int one = 1;
	CHECK(rdma_set_option(listen_id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one,
			      sizeof(one)) == 0, "REUSEADDR");
	struct sockaddr_in sa = sin_of(SRV_IP, PORT);
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&sa) == 0, "bind %s", SRV_IP);
	CHECK(rdma_get_src_port(listen_id) == htons(PORT), "src port %u",
	      ntohs(rdma_get_src_port(listen_id)));
	CHECK(listen_id->verbs != NULL, "a bound id has its device");
	CHECK(rdma_listen(listen_id, 4) == 0, "listen");

	/* Client: resolve address and route from the second device. */
	int cctx = 42;
	CHECK(rdma_create_id(cch, &cid, &cctx, RDMA_PS_TCP) == 0 && cid->context == &cctx,
	      "create client id");
	struct sockaddr_in src = sin_of(CLI_IP, 0), dst = sin_of(SRV_IP, PORT);
	CHECK(rdma_resolve_addr(cid, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0,
	      "resolve_addr");
	/* A blocking rdma_get_cm_event (no poll first): it waits for the event. */
	CHECK(rdma_get_cm_event(cch, &ev) == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED &&
	      ev->status == 0, "blocking get_cm_event: %s", rdma_event_str(ev->event));
	CHECK(ev->id == cid && ev->id->context == &cctx, "event on the client id");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	CHECK(cid->verbs && cid->verbs != listen_id->verbs, "the client id is on the other device");
	CHECK(rdma_resolve_route(cid, 2000) == 0, "resolve_route");
	CHECK(rdma_ack_cm_event(expect_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0, "ack");
	CHECK(rdma_get_dst_port(cid) == htons(PORT), "dst port");
	struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(cid);
	CHECK(peer->sin_family == AF_INET && peer->sin_addr.s_addr == dst.sin_addr.s_addr,
	      "peer address");

	/* Client QP (CQs and PD made by the CM), buffers, a receive, connect. */
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(rdma_create_qp(cid, NULL, &qa) == 0, "client create_qp");
	CHECK(cid->qp && cid->pd && cid->send_cq && cid->recv_cq && cid->send_cq_channel &&
	      cid->recv_cq_channel && cid->qp->qp_type == IBV_QPT_RC, "client id's verbs objects");
	char *cbuf = calloc(1, 4096);
	struct ibv_mr *cmr = rdma_reg_write(cid, cbuf, 4096);
	CHECK(cmr && cmr->pd == cid->pd, "rdma_reg_write");
	CHECK(rdma_post_recv(cid, (void *)(uintptr_t)0xc1, cbuf, 64, cmr) == 0, "client post_recv");
	struct offer off = { .addr = (uintptr_t)cbuf + 1024, .rkey = cmr->rkey, .hello = "hello-req" };
	struct rdma_conn_param cp = { .private_data = &off, .private_data_len = sizeof(off),
				      .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	CHECK(rdma_connect(cid, &cp) == 0, "connect");

	/* Server: the request on a new id, with the client's private data; accept. */
	ev = expect_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	CHECK(sid && sid != listen_id && ev->listen_id == listen_id, "request on a new id");
	CHECK(ev->param.conn.private_data_len >= sizeof(off), "private data length %u",
	      ev->param.conn.private_data_len);
	struct offer got;
	memcpy(&got, ev->param.conn.private_data, sizeof(got));
	CHECK(got.addr == off.addr && got.rkey == off.rkey && strcmp(got.hello, "hello-req") == 0,
	      "private data byte for byte");
	CHECK(sid->verbs == listen_id->verbs, "request on the listener's device");
	struct sockaddr_in *from = (struct sockaddr_in *)rdma_get_peer_addr(sid);
	CHECK(from->sin_addr.s_addr == src.sin_addr.s_addr, "request from %s", CLI_IP);
	CHECK(rdma_ack_cm_event(ev) == 0, "ack request");
	CHECK(rdma_create_qp(sid, NULL, &qa) == 0, "server create_qp");
	char *sbuf = calloc(1, 4096);
	struct ibv_mr *smr = rdma_reg_msgs(sid, sbuf, 4096);
	CHECK(smr, "rdma_reg_msgs");
	CHECK(rdma_post_recv(sid, (void *)(uintptr_t)0x51, sbuf, 64, smr) == 0, "server post_recv");
	const char rep[] = "hello-rep";
	struct rdma_conn_param ap = { .private_data = rep, .private_data_len = sizeof(rep),
				      .responder_resources = 1, .initiator_depth = 1 };
	CHECK(rdma_accept(sid, &ap) == 0, "accept");

	ev = expect_event(cch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == cid && ev->param.conn.private_data_len >= sizeof(rep) &&
	      memcmp(ev->param.conn.private_data, rep, sizeof(rep)) == 0, "reply private data");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	ev = expect_event(sch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == sid, "server established");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");

	/* Client -> server SEND. */
	strcpy(cbuf + 512, "ping");
	CHECK(rdma_post_send(cid, (void *)(uintptr_t)0xc2, cbuf + 512, 5, cmr, IBV_SEND_SIGNALED) == 0,
	      "client post_send");
	struct ibv_wc wc;
	CHECK(rdma_get_send_comp(cid, &wc) == 1, "client send completion");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 0xc2,
	      "send wc: %s", ibv_wc_status_str(wc.status));
	CHECK(rdma_get_recv_comp(sid, &wc) == 1, "server recv completion");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 0x51 &&
	      wc.byte_len == 5 && wc.qp_num == sid->qp->qp_num, "recv wc: %s byte_len %u",
	      ibv_wc_status_str(wc.status), wc.byte_len);
	CHECK(memcmp(sbuf, "ping", 5) == 0, "ping bytes");

	/* Server -> client: an RDMA WRITE to the offered buffer, then a SEND. */
	strcpy(sbuf + 100, "written by the server");
	CHECK(rdma_post_write(sid, (void *)(uintptr_t)0x52, sbuf + 100, 22, smr, IBV_SEND_SIGNALED,
			      got.addr, got.rkey) == 0, "server post_write");
	CHECK(rdma_get_send_comp(sid, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 0x52, "write wc: %s",
	      ibv_wc_status_str(wc.status));
	strcpy(sbuf + 200, "pong");
	CHECK(rdma_post_send(sid, (void *)(uintptr_t)0x53, sbuf + 200, 5, smr, IBV_SEND_SIGNALED) == 0,
	      "server post_send");
	CHECK(rdma_get_send_comp(sid, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 0x53,
	      "server send wc");
	CHECK(rdma_get_recv_comp(cid, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RECV && wc.wr_id == 0xc1 && wc.byte_len == 5, "client recv wc");
	CHECK(memcmp(cbuf, "pong", 5) == 0, "pong bytes");
	CHECK(strcmp(cbuf + 1024, "written by the server") == 0, "written bytes");

	/* Disconnect, in rdma_cm's order: the client's DREQ gives the server
	 * DISCONNECTED, whose rdma_disconnect answers with the DREP that gives the
	 * client its DISCONNECTED. */
	CHECK(rdma_disconnect(cid) == 0, "client disconnect");
	ev = expect_event(sch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(ev->id == sid, "server's id disconnected");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	CHECK(rdma_disconnect(sid) == 0, "server disconnect (the DREP)");
	ev = expect_event(cch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(ev->id == cid, "client's id disconnected");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");

	/* What rsockets does not have fails cleanly. */
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_RAW, 0) == -1 && errno == EOPNOTSUPP,
	      "raw rsocket: EOPNOTSUPP");
	/* Stream and datagram rsockets are real descriptors, closed by rclose. */
	int rs = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rs >= 0 && fcntl(rs, F_GETFD) >= 0, "stream rsocket");
	CHECK(rclose(rs) == 0, "rclose");
	rs = rsocket(AF_INET, SOCK_DGRAM, 0);
	CHECK(rs >= 0 && fcntl(rs, F_GETFD) >= 0, "datagram rsocket");
	CHECK(rclose(rs) == 0, "rclose (datagram)");
	errno = 0;
	CHECK(rdma_notify(sid, IBV_EVENT_COMM_EST) == -1 && errno == EOPNOTSUPP, "notify");
	/* rdma_set_option: the kernel's sizes and errnos. */
	uint8_t tos = 32;
	CHECK(rdma_set_option(sid, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "TOS");
	errno = 0;
	CHECK(rdma_set_option(sid, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof(one)) == -1 &&
	      errno == EINVAL, "TOS of an int: EINVAL");
	errno = 0;
	CHECK(rdma_set_option(sid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, NULL, 1) == -1 &&
	      errno == EFAULT, "ACK_TIMEOUT without a value: EFAULT");
	errno = 0;
	CHECK(rdma_set_option(sid, RDMA_OPTION_ID, 77, &one, sizeof(one)) == -1 && errno == ENOSYS,
	      "unknown option: ENOSYS");
	errno = 0;
	CHECK(rdma_set_option(sid, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &one, sizeof(one)) == -1 &&
	      errno == EOPNOTSUPP, "IB_PATH: EOPNOTSUPP");

	/* Teardown. */
	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	CHECK(rdma_dereg_mr(cmr) == 0 && rdma_dereg_mr(smr) == 0, "dereg");
	CHECK(rdma_destroy_id(cid) == 0 && rdma_destroy_id(sid) == 0 &&
	      rdma_destroy_id(listen_id) == 0, "destroy ids");
	free(cbuf);
	free(sbuf);

	/* rdma_init_qp_attr where no connection gives attributes. */
	struct rdma_cm_id *uid, *lid2, *cid2;
	struct ibv_qp_attr qattr;
	int qmask;
	CHECK(rdma_create_id(cch, &uid, NULL, RDMA_PS_UDP) == 0, "UD id");
	qattr.qp_state = IBV_QPS_INIT;
	errno = 0;
	CHECK(rdma_init_qp_attr(uid, &qattr, &qmask) == -1 && errno == EINVAL,
	      "init_qp_attr on an unbound id: EINVAL");
	struct sockaddr_in ua = sin_of(CLI_IP, PORT + 1);
	CHECK(rdma_bind_addr(uid, (struct sockaddr *)&ua) == 0 && uid->pd &&
	      uid->pd->context == uid->verbs, "bound UD id has its device's PD");
	qattr.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(uid, &qattr, &qmask) == 0 && qmask == (MASK_GENERIC | IBV_QP_QKEY) &&
	      qattr.qkey == 0x01234567 && qattr.qp_state == IBV_QPS_RTS,
	      "UD: state, P_Key index, port and RDMA_UDP_QKEY (mask %#x)", qmask);
	errno = 0;
	uint8_t t8 = 16;
	CHECK(rdma_set_option(uid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t8, 1) == -1 &&
	      errno == EINVAL, "ACK_TIMEOUT on a UD id: EINVAL");
	qattr.qp_state = 42;
	errno = 0;
	CHECK(rdma_init_qp_attr(uid, &qattr, &qmask) == -1 && errno == EINVAL, "bad state: EINVAL");
	CHECK(rdma_destroy_id(uid) == 0, "destroy UD id");

	/* Second connection, both ids synchronous (no channel: each call waits for its
	 * event and leaves it in id->event): a server whose QP is named only by
	 * conn_param.qp_num, and a client whose own QP sits in id->qp. */
	CHECK(rdma_create_id(NULL, &lid2, NULL, RDMA_PS_TCP) == 0, "sync listen id");
	sa = sin_of(SRV_IP, PORT + 2);
	CHECK(rdma_bind_addr(lid2, (struct sockaddr *)&sa) == 0 && rdma_listen(lid2, 2) == 0,
	      "sync listen");
	CHECK(lid2->pd && lid2->pd == listen_id->pd, "one PD per device (librdmacm's)");
	qattr.qp_state = IBV_QPS_INIT;
	errno = 0;
	CHECK(rdma_init_qp_attr(lid2, &qattr, &qmask) == -1 && errno == EINVAL,
	      "init_qp_attr on a listening id: EINVAL");
	struct sync_server srv = { .listen = lid2 };
	pthread_t th;
	CHECK(pthread_create(&th, NULL, sync_server_run, &srv) == 0, "server thread");

	CHECK(rdma_create_id(NULL, &cid2, NULL, RDMA_PS_TCP) == 0, "sync client id 2");
	dst = sin_of(SRV_IP, PORT + 2);
	CHECK(rdma_resolve_addr(cid2, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0,
	      "resolve_addr 2");
	CHECK(cid2->event && cid2->event->event == RDMA_CM_EVENT_ADDR_RESOLVED &&
	      cid2->event->id == cid2, "sync resolve_addr leaves ADDR_RESOLVED in id->event");
	CHECK(cid2->pd && cid2->pd->context == cid2->verbs, "a resolved id has its device's PD");
	CHECK(rdma_resolve_route(cid2, 2000) == 0 && cid2->event &&
	      cid2->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED, "sync resolve_route");
	/* Before connect there is no IB CM connection: the kernel's cma_ib_init_qp_attr. */
	qattr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(cid2, &qattr, &qmask) == 0 && qmask == MASK_INIT &&
	      qattr.qp_access_flags == 0, "INIT before connect: access 0 (mask %#x)", qmask);
	errno = 0;
	CHECK(rdma_connect(cid2, NULL) == -1 && errno == EINVAL,
	      "connect with no QP and no parameters: EINVAL");
	struct ibv_cq *ccq2;
	struct ibv_qp *cqp2 = make_qp(cid2, &ccq2);
	cid2->qp = cqp2;
	errno = 0;
	CHECK(rdma_create_qp(cid2, NULL, &qa) == -1 && errno == EINVAL,
	      "create_qp on an id that has a QP: EINVAL");
	char *rbuf = calloc(1, 64);
	struct ibv_mr *rmr = ibv_reg_mr(cid2->pd, rbuf, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr, "client reg_mr");
	cp = (struct rdma_conn_param){ .responder_resources = 1, .initiator_depth = 1,
				       .retry_count = 7, .rnr_retry_count = 7 };
	CHECK(rdma_connect(cid2, &cp) == 0, "sync connect with the program's QP in id->qp");
	ev = cid2->event;
	CHECK(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == cid2 && ev->status == 0 &&
	      ev->param.conn.private_data_len >= 12, "sync connect leaves ESTABLISHED in id->event");
	struct { uint64_t addr; uint32_t rkey; } __attribute__((packed)) where;
	memcpy(&where, ev->param.conn.private_data, sizeof(where));
	CHECK(cqp2->state == IBV_QPS_RTS, "librdmacm moved the client's own QP to RTS");
	struct ibv_qp_attr got_attr;
	struct ibv_qp_init_attr got_init;
	CHECK(ibv_query_qp(cqp2, &got_attr, IBV_QP_STATE | IBV_QP_TIMEOUT, &got_init) == 0 &&
	      got_attr.qp_state == IBV_QPS_RTS, "query the client's QP");
	/* SEND to the server, RDMA READ from it (its QP got REMOTE_READ at INIT). */
	strcpy(rbuf, "from the client");
	struct ibv_sge sge = { .addr = (uintptr_t)rbuf, .length = 16, .lkey = rmr->lkey };
	struct ibv_send_wr swr = { .wr_id = 0x71, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(ibv_post_send(cqp2, &swr, &sbad) == 0, "client send");
	expect_wc(ccq2, IBV_WC_SEND, 0x71);
	struct ibv_sge rsge = { .addr = (uintptr_t)rbuf + 32, .length = 8, .lkey = rmr->lkey };
	struct ibv_send_wr rd = { .wr_id = 0x72, .sg_list = &rsge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = where.addr, .rkey = where.rkey } };
	CHECK(ibv_post_send(cqp2, &rd, &sbad) == 0, "client RDMA READ");
	expect_wc(ccq2, IBV_WC_RDMA_READ, 0x72);
	CHECK(strcmp(rbuf + 32, "read me") == 0, "read the server's bytes");
	CHECK(rdma_disconnect(cid2) == 0 && cqp2->state == IBV_QPS_ERR,
	      "disconnect moves the program's QP to ERROR");
	CHECK(cid2->event && cid2->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "sync disconnect: DISCONNECTED in id->event");
	CHECK(pthread_join(th, NULL) == 0 && srv.done, "server thread");
	/* librdmacm's rdma_destroy_qp destroys whatever QP the id holds. */
	rdma_destroy_qp(cid2);
	CHECK(cid2->qp == NULL, "rdma_destroy_qp took the program's QP");
	CHECK(ibv_dereg_mr(rmr) == 0 && ibv_destroy_cq(ccq2) == 0, "client teardown");
	CHECK(rdma_destroy_id(cid2) == 0 && rdma_destroy_id(lid2) == 0, "destroy ids 2");
	free(rbuf);

	/* Third connection, the other way round: the client's QP named only by
	 * conn_param.qp_num (CONNECT_RESPONSE, the program moves it, rdma_establish),
	 * the server's own QP in id->qp (rdma_accept moves it). */
	struct rdma_cm_id *lid3, *cid3, *sid3;
	CHECK(rdma_create_id(sch, &lid3, NULL, RDMA_PS_TCP) == 0, "listen id 3");
	sa = sin_of(SRV_IP, PORT + 3);
	CHECK(rdma_bind_addr(lid3, (struct sockaddr *)&sa) == 0 && rdma_listen(lid3, 2) == 0,
	      "listen 3");
	CHECK(rdma_create_id(cch, &cid3, NULL, RDMA_PS_TCP) == 0, "client id 3");
	dst = sin_of(SRV_IP, PORT + 3);
	CHECK(rdma_resolve_addr(cid3, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000) == 0,
	      "resolve_addr 3");
	CHECK(rdma_ack_cm_event(expect_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0, "ack");
	CHECK(rdma_resolve_route(cid3, 2000) == 0, "resolve_route 3");
	CHECK(rdma_ack_cm_event(expect_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0, "ack");
	struct ibv_cq *ccq3, *scq3;
	struct ibv_qp *cqp3 = make_qp(cid3, &ccq3);
	cp = (struct rdma_conn_param){ .responder_resources = 1, .initiator_depth = 1,
				       .retry_count = 7, .rnr_retry_count = 7,
				       .qp_num = cqp3->qp_num };
	CHECK(rdma_connect(cid3, &cp) == 0, "connect naming the QP by qp_num");
	qattr.qp_state = IBV_QPS_RTR;
	errno = 0;
	CHECK(rdma_init_qp_attr(cid3, &qattr, &qmask) == -1 && errno == EINVAL,
	      "RTR before the REP: EINVAL");
	qattr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(cid3, &qattr, &qmask) == 0 && qmask == MASK_INIT,
	      "INIT once the REQ is out");
	ev = expect_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid3 = ev->id;
	CHECK(ev->param.conn.qp_num == cqp3->qp_num, "the request names the client's QP");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	struct ibv_qp *sqp3 = make_qp(sid3, &scq3);
	sid3->qp = sqp3;
	/* The REP's RNR retry count is the one the client's QP sends with (cm.c). */
	ap = (struct rdma_conn_param){ .responder_resources = 1, .initiator_depth = 1,
				       .rnr_retry_count = 7 };
	CHECK(rdma_accept(sid3, &ap) == 0 && sqp3->state == IBV_QPS_RTS,
	      "accept moves the server's own QP to RTS");
	ev = expect_event(cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(ev->id == cid3 && ev->param.conn.qp_num == sqp3->qp_num, "CONNECT_RESPONSE");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	move_qp(cid3, cqp3, sqp3->qp_num, 14);
	CHECK(rdma_establish(cid3) == 0, "establish");
	CHECK(rdma_ack_cm_event(expect_event(sch, RDMA_CM_EVENT_ESTABLISHED)) == 0, "ack");
	char b3[16] = "third";
	struct ibv_mr *m3 = ibv_reg_mr(sid3->pd, b3, sizeof(b3), IBV_ACCESS_LOCAL_WRITE);
	CHECK(m3, "reg 3");
	struct ibv_sge s3 = { .addr = (uintptr_t)b3, .length = 6, .lkey = m3->lkey };
	struct ibv_recv_wr r3 = { .wr_id = 0x81, .sg_list = &s3, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(sqp3, &r3, &rbad) == 0, "server recv 3");
	char c3[16] = "ping3";
	struct ibv_mr *cm3 = ibv_reg_mr(cid3->pd, c3, sizeof(c3), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge cs3 = { .addr = (uintptr_t)c3, .length = 6, .lkey = cm3->lkey };
	swr = (struct ibv_send_wr){ .wr_id = 0x82, .sg_list = &cs3, .num_sge = 1,
				    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	CHECK(cm3 && ibv_post_send(cqp3, &swr, &sbad) == 0, "client send 3");
	expect_wc(ccq3, IBV_WC_SEND, 0x82);
	expect_wc(scq3, IBV_WC_RECV, 0x81);
	CHECK(strcmp(b3, "ping3") == 0, "third connection carries data");
	CHECK(rdma_disconnect(cid3) == 0, "disconnect 3");
	CHECK(rdma_ack_cm_event(expect_event(sch, RDMA_CM_EVENT_DISCONNECTED)) == 0, "ack");
	CHECK(rdma_disconnect(sid3) == 0 && sqp3->state == IBV_QPS_ERR, "server disconnect 3");
	CHECK(rdma_ack_cm_event(expect_event(cch, RDMA_CM_EVENT_DISCONNECTED)) == 0, "ack");
	CHECK(ibv_destroy_qp(cqp3) == 0, "the program destroys its QP");
	rdma_destroy_qp(sid3);
	CHECK(sid3->qp == NULL, "rdma_destroy_qp took the server's own QP");
	CHECK(ibv_dereg_mr(m3) == 0 && ibv_dereg_mr(cm3) == 0 && ibv_destroy_cq(ccq3) == 0 &&
	      ibv_destroy_cq(scq3) == 0, "teardown 3");
	CHECK(rdma_destroy_id(cid3) == 0 && rdma_destroy_id(sid3) == 0 &&
	      rdma_destroy_id(lid3) == 0, "destroy ids 3");

	/* An event channel destroyed with an id still on it: librdmacm closes it and
	 * the kernel destroys the id, so later calls on the id fail cleanly. */
	struct rdma_event_channel *ech = rdma_create_event_channel();
	struct rdma_cm_id *left;
	CHECK(ech && rdma_create_id(ech, &left, NULL, RDMA_PS_TCP) == 0, "id on a channel");
	rdma_destroy_event_channel(ech);
	errno = 0;
	CHECK(rdma_destroy_id(left) == -1 && errno == EINVAL, "the channel took its id");

	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	printf("rdmacm_test: %d checks passed\n", checks);
	return 0;
}
