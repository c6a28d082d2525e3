/*
 * rdmacm_test: the librdmacm calls of capi's librdmacm.so.1 from C, compiled against
 * the real <rdma/rdma_cma.h> and <rdma/rdma_verbs.h>. One process, two emulated
 * devices, a server and a client connected over loopback:
 *   RDMA_EMU_DEVICES="emu0=127.0.0.5,emu1=127.0.0.6" ./rdmacm_test [SERVER_IP CLIENT_IP]
 * (the two devices' addresses; 127.0.0.5 and 127.0.0.6 unless given).
 * Event channels and ids, address and route resolution, listen, connect with
 * private data, accept, a SEND each way and an RDMA WRITE with the rdma_verbs.h
 * helpers (rdma_reg_*, rdma_post_*, rdma_get_*_comp), disconnect, teardown; and the
 * calls the emulator does not have failing cleanly. Every check prints what failed
 * and the program exits 1; exit 0 means all passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
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

	/* What the emulator does not have fails cleanly. */
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS, "rsocket: ENOSYS");
	errno = 0;
	CHECK(rdma_notify(sid, IBV_EVENT_COMM_EST) == -1 && errno == EOPNOTSUPP, "notify");
	errno = 0;
	CHECK(rdma_set_option(sid, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof(one)) == -1 &&
	      errno == EOPNOTSUPP, "set_option TOS");

	/* Teardown. */
	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	CHECK(rdma_dereg_mr(cmr) == 0 && rdma_dereg_mr(smr) == 0, "dereg");
	CHECK(rdma_destroy_id(cid) == 0 && rdma_destroy_id(sid) == 0 &&
	      rdma_destroy_id(listen_id) == 0, "destroy ids");
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	free(cbuf);
	free(sbuf);
	printf("rdmacm_test: %d checks passed\n", checks);
	return 0;
}
