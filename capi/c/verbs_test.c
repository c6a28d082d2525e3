/*
 * verbs_test: exercises the verbs capi's libibverbs.so.1 exports, compiled against
 * the real <infiniband/verbs.h> (so the inline verbs go through ctx->ops and
 * verbs_context exactly as in any program). Needs two emulated devices:
 *   RDMA_EMU_DEVICES="emu0=127.0.0.3,emu1=127.0.0.4" ./verbs_test
 * Every check prints what failed and the program exits 1; exit 0 means all passed.
 * Extended verbs: every ibv_wr_* operation and setter the library implements
 * (test_wr_rc, test_wr_ud), every ibv_wc_read_* of an extended CQ, and the clean
 * EOPNOTSUPP of those it does not (test_ex_unsupported).
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
#include <infiniband/verbs.h>

#include "check.h"

#define SZ 4096

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx; /* set by open_ext_end: cq is ibv_cq_ex_to_cq(cqx) */
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (int i = 0; i < 5000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			CHECK(0, "poll_cq");
		if (n == 1)
			return wc;
	}
	CHECK(0, "no completion");
	return wc;
}

static void expect_ok(struct ibv_cq *cq, enum ibv_wc_opcode op)
{
	struct ibv_wc wc = poll_one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc.status));
	CHECK(wc.opcode == op, "opcode %d, want %d", wc.opcode, op);
}

static void open_end(struct ibv_device *dev, struct end *e, enum ibv_qp_type type)
{
	e->ctx = ibv_open_device(dev);
	CHECK(e->ctx, "open %s", ibv_get_device_name(dev));
	e->cqx = NULL;
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd, "alloc_pd");
	e->ch = ibv_create_comp_channel(e->ctx);
	CHECK(e->ch, "create_comp_channel");
	e->cq = ibv_create_cq(e->ctx, 64, e, e->ch, 0);
	CHECK(e->cq, "create_cq");
	e->buf = aligned_alloc(64, SZ);
	memset(e->buf, 0, SZ);
	e->mr = ibv_reg_mr(e->pd, e->buf, SZ,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(e->mr && e->mr->addr == e->buf && e->mr->length == SZ, "reg_mr");
	struct ibv_qp_init_attr ia = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
	};
	e->qp = ibv_create_qp(e->pd, &ia);
	CHECK(e->qp, "create_qp");
	CHECK(ia.cap.max_send_wr >= 32 && ia.cap.max_inline_data >= 64, "cap written back");
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "query_gid");
}

static void connect_rc(struct end *a, struct end *b)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	CHECK(a->qp->state == IBV_QPS_INIT, "state field");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = b->qp->qp_num;
	at.rq_psn = 100;
	at.max_dest_rd_atomic = 4;
	at.min_rnr_timer = 1;
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.dgid = b->gid;
	at.ah_attr.grh.hop_limit = 64;
	at.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER) == 0, "RTR");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.sq_psn = 100;
	at.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(a->qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
}

/* A UD QP through INIT (Q_Key `qkey`), RTR and RTS. */
static void ud_up(struct end *e, uint32_t qkey)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey };
	CHECK(ibv_modify_qp(e->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_QKEY) == 0, "UD INIT");
	at.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(e->qp, &at, IBV_QP_STATE) == 0, "UD RTR");
	at.qp_state = IBV_QPS_RTS;
	at.sq_psn = 1;
	CHECK(ibv_modify_qp(e->qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
}

static void post_send(struct end *e, enum ibv_wr_opcode op, size_t off, uint32_t len,
		      struct end *peer, size_t roff, unsigned flags)
{
	struct ibv_sge sge = { (uintptr_t)e->buf + off, len, e->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED | flags }, *bad;
	wr.imm_data = htonl(0xabcd);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = (uintptr_t)peer->buf + roff;
		wr.wr.atomic.rkey = peer->mr->rkey;
		wr.wr.atomic.compare_add = 5;
		wr.wr.atomic.swap = 77;
	} else if (peer) {
		wr.wr.rdma.remote_addr = (uintptr_t)peer->buf + roff;
		wr.wr.rdma.rkey = peer->mr->rkey;
	}
	CHECK(ibv_post_send(e->qp, &wr, &bad) == 0, "post_send op %d", op);
}

static void post_recv(struct ibv_qp *qp, struct end *e, size_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)e->buf + off, len, e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = off, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "post_recv");
}

static void test_device_queries(struct ibv_device **list, int n)
{
	CHECK(n == 2, "two devices, got %d", n);
	CHECK(strcmp(ibv_get_device_name(list[1]), "emu1") == 0, "name");
	CHECK(ibv_get_device_index(list[1]) == 1, "index");
	CHECK(ibv_get_device_guid(list[0]) != 0, "guid");
	CHECK(strcmp(ibv_node_type_str(list[0]->node_type), "InfiniBand channel adapter") == 0,
	      "node type %s", ibv_node_type_str(list[0]->node_type));
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0 && da.phys_port_cnt == 1 && da.max_qp > 0, "query_device");
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.orig_attr.max_qp == da.max_qp, "query_device_ex");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET, "query_port");
	CHECK(strcmp(ibv_port_state_str(pa.state), "active") == 0, "port_state_str");
	CHECK(ibv_query_port(ctx, 2, &pa) != 0, "port 2 does not exist");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff && gid.raw[12] == 127,
	      "IPv4-mapped GID in 127/8");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, "gid_ex");
	struct ibv_gid_entry table[16];
	CHECK(ibv_query_gid_table(ctx, table, 16, 0) >= 1, "gid_table");
	__be16 pkey;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && ntohs(pkey) == 0xffff, "pkey %x", ntohs(pkey));
	CHECK(ibv_get_pkey_index(ctx, 1, pkey) == 0, "pkey index");
	int fl = fcntl(ctx->async_fd, F_GETFL);
	CHECK(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "nonblock");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "no async event pending");
	CHECK(ibv_close_device(ctx) == 0, "close");
}


/* Memory windows on b's buffer, used by a: type 1 bound with ibv_bind_mw, type 2
 * bound with an IBV_WR_BIND_MW work request, then invalidated with LOCAL_INV. */
static void test_mw(struct end *a, struct end *b)
{
	struct ibv_mr *mr = ibv_reg_mr(b->pd, b->buf, SZ, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(mr, "MR with MW_BIND");
	struct ibv_mw *mw1 = ibv_alloc_mw(b->pd, IBV_MW_TYPE_1);
	CHECK(mw1, "alloc_mw type 1");
	struct ibv_mw_bind bind = { .wr_id = 70, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = (uintptr_t)b->buf + 3500, .length = 64,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	uint32_t old = mw1->rkey;
	CHECK(ibv_bind_mw(b->qp, mw1, &bind) == 0, "bind_mw");
	expect_ok(b->cq, IBV_WC_BIND_MW);
	CHECK(mw1->rkey != old, "bind gives a new rkey");
	strcpy(a->buf + 800, "through a window");
	struct ibv_sge sge = { (uintptr_t)a->buf + 800, 17, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 71, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf + 3500;
	wr.wr.rdma.rkey = mw1->rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "write via MW");
	expect_ok(a->cq, IBV_WC_RDMA_WRITE);
	CHECK(strcmp(b->buf + 3500, "through a window") == 0, "bytes via type 1 MW");

	struct ibv_mw *mw2 = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
	CHECK(mw2, "alloc_mw type 2");
	uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bw = { .wr_id = 72, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED };
	bw.bind_mw.mw = mw2;
	bw.bind_mw.rkey = rkey2;
	bw.bind_mw.bind_info = bind.bind_info;
	CHECK(ibv_post_send(b->qp, &bw, &bad) == 0, "post BIND_MW");
	expect_ok(b->cq, IBV_WC_BIND_MW);
	struct ibv_send_wr inv = { .wr_id = 73, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = rkey2;
	CHECK(ibv_post_send(b->qp, &inv, &bad) == 0, "post LOCAL_INV");
	expect_ok(b->cq, IBV_WC_LOCAL_INV);
	CHECK(ibv_dealloc_mw(mw2) == 0 && ibv_dealloc_mw(mw1) == 0, "dealloc_mw");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg MW_BIND MR");
}

static void test_rc(struct end *a, struct end *b)
{
	/* SEND with immediate, into a receive; a solicited event through the channel. */
	CHECK(ibv_req_notify_cq(b->cq, 0) == 0, "req_notify");
	post_recv(b->qp, b, 0, 64);
	strcpy(a->buf + 100, "hello");
	post_send(a, IBV_WR_SEND_WITH_IMM, 100, 6, NULL, 0, 0);
	expect_ok(a->cq, IBV_WC_SEND);
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(b->ch, &ecq, &ectx) == 0 && ecq == b->cq && ectx == b, "cq event");
	ibv_ack_cq_events(b->cq, 1);
	struct ibv_wc wc = poll_one(b->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 6 &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd &&
	      wc.qp_num == b->qp->qp_num, "recv wc");
	CHECK(strcmp(b->buf, "hello") == 0, "received bytes in place");

	/* WRITE, WRITE inline, READ, atomics: bytes land in the programs' own buffers. */
	memset(a->buf + 200, 'w', 300);
	post_send(a, IBV_WR_RDMA_WRITE, 200, 300, b, 1000, 0);
	expect_ok(a->cq, IBV_WC_RDMA_WRITE);
	CHECK(b->buf[1000] == 'w' && b->buf[1299] == 'w' && b->buf[1300] == 0, "write landed");
	{
		/* INLINE from memory that was never registered (the stack), lkey ignored. */
		char stack[8] = "inline!";
		struct ibv_sge s = { (uintptr_t)stack, 8, 0 };
		struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bw;
		w.wr.rdma.remote_addr = (uintptr_t)b->buf + 1400;
		w.wr.rdma.rkey = b->mr->rkey;
		CHECK(ibv_post_send(a->qp, &w, &bw) == 0, "inline post");
		memset(stack, 0, sizeof(stack)); /* reusable as soon as the post returns */
		expect_ok(a->cq, IBV_WC_RDMA_WRITE);
		CHECK(strcmp(b->buf + 1400, "inline!") == 0, "inline write");
	}
	strcpy(b->buf + 2000, "remote bytes");
	post_send(a, IBV_WR_RDMA_READ, 2000, 13, b, 2000, 0);
	expect_ok(a->cq, IBV_WC_RDMA_READ);
	CHECK(strcmp(a->buf + 2000, "remote bytes") == 0, "read");
	*(uint64_t *)(b->buf + 3000) = 5;
	post_send(a, IBV_WR_ATOMIC_FETCH_AND_ADD, 3008, 8, b, 3000, 0);
	expect_ok(a->cq, IBV_WC_FETCH_ADD);
	CHECK(*(uint64_t *)(a->buf + 3008) == 5 && *(uint64_t *)(b->buf + 3000) == 10, "fetch_add");
	post_send(a, IBV_WR_ATOMIC_CMP_AND_SWP, 3016, 8, b, 3000, 0);
	expect_ok(a->cq, IBV_WC_COMP_SWAP);
	CHECK(*(uint64_t *)(b->buf + 3000) == 10, "cmp_swp: 10 != 5, no swap");

	test_mw(a, b);

	/* A bad rkey: the requester's completion says so; QP goes to error. */
	struct ibv_sge sge = { (uintptr_t)a->buf, 8, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
	wr.wr.rdma.rkey = b->mr->rkey + 1000;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post bad write");
	wc = poll_one(a->cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "rem access err: %s", ibv_wc_status_str(wc.status));
	/* The responder's QP reports it as an asynchronous event (blocking read). */
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(b->ctx, &ev) == 0, "async event");
	CHECK(ev.event_type == IBV_EVENT_QP_ACCESS_ERR && ev.element.qp == b->qp,
	      "QP_ACCESS_ERR on b's QP: %s", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);

	/* post_send in RESET fails with bad_wr set. */
	struct ibv_qp_init_attr ia = { .send_cq = a->cq, .recv_cq = a->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *q2 = ibv_create_qp(a->pd, &ia);
	CHECK(q2, "second qp");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(q2);
	CHECK(qx && (void *)qx == (void *)q2, "qp_to_qp_ex");
	bad = NULL;
	CHECK(ibv_post_send(q2, &wr, &bad) == EINVAL && bad == &wr, "post in RESET");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(q2, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0 &&
	      qa.qp_state == IBV_QPS_RESET && qi.cap.max_send_wr >= 4 && qi.send_cq == a->cq, "query_qp");
	CHECK(ibv_destroy_cq(a->cq) == EBUSY, "cq busy while QPs use it");
	CHECK(ibv_destroy_qp(q2) == 0, "destroy qp");
}

static void test_srq_and_events(struct end *a)
{
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(a->pd, &si);
	CHECK(srq && si.attr.max_wr >= 16, "create_srq");
	struct ibv_sge sge = { (uintptr_t)a->buf, 64, a->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	for (int i = 0; i < 4; i++)
		CHECK(ibv_post_srq_recv(srq, &rw, &bad) == 0, "post_srq_recv");
	struct ibv_srq_attr sa = { .srq_limit = 8 };
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "arm limit");
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.max_wr >= 16, "query_srq");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
}

static void test_ud(struct ibv_device **list)
{
	struct end u[2];
	for (int i = 0; i < 2; i++) {
		open_end(list[i], &u[i], IBV_QPT_UD);
		ud_up(&u[i], 0x11111111);
	}
	post_recv(u[1].qp, &u[1], 0, 40 + 64);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = u[1].gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(u[0].pd, &aa);
	CHECK(ah, "create_ah");
	strcpy(u[0].buf + 500, "datagram");
	struct ibv_sge sge = { (uintptr_t)u[0].buf + 500, 9, u[0].mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = u[1].qp->qp_num;
	wr.wr.ud.remote_qkey = 0x11111111;
	CHECK(ibv_post_send(u[0].qp, &wr, &bad) == 0, "UD send");
	expect_ok(u[0].cq, IBV_WC_SEND);
	struct ibv_wc wc = poll_one(u[1].cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 9 && (wc.wc_flags & IBV_WC_GRH) &&
	      wc.src_qp == u[0].qp->qp_num, "UD recv");
	CHECK(strcmp(u[1].buf + 40, "datagram") == 0, "UD payload after the GRH");
	/* The GRH is in the IPv4 layout (20 zero bytes, then the IPv4 header), as kernel
	 * rxe writes it: the reply goes to the sender's IPv4-mapped GID. */
	CHECK(u[1].buf[20] == 0x45 && memcmp(u[1].buf + 32, u[0].gid.raw + 12, 4) == 0,
	      "UD GRH: IPv4 layout, source address at bytes 32..36");
	struct ibv_ah_attr back_attr;
	CHECK(ibv_init_ah_from_wc(u[1].ctx, 1, &wc, (struct ibv_grh *)u[1].buf, &back_attr) == 0,
	      "init_ah_from_wc");
	CHECK(back_attr.is_global && memcmp(back_attr.grh.dgid.raw, u[0].gid.raw, 16) == 0,
	      "init_ah_from_wc: the reply goes to the sender's GID");
	struct ibv_ah *back = ibv_create_ah_from_wc(u[1].pd, &wc, (struct ibv_grh *)u[1].buf, 1);
	CHECK(back, "create_ah_from_wc");
	CHECK(ibv_destroy_ah(back) == 0 && ibv_destroy_ah(ah) == 0, "destroy_ah");
	union ibv_gid mgid = { .raw = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3 } };
	int r = ibv_attach_mcast(u[1].qp, &mgid, 0);
	CHECK(r == 0, "attach_mcast: %d", r);
	CHECK(ibv_detach_mcast(u[1].qp, &mgid, 0) == 0, "detach_mcast");
}

static void test_extended_rc(struct ibv_device **list)
{
	/* A fresh pair whose requester uses ibv_wr_* and an extended CQ. */
	struct end a, b;
	open_end(list[0], &a, IBV_QPT_RC);
	open_end(list[1], &b, IBV_QPT_RC);
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(a.ctx, &ca);
	CHECK(cqx, "create_cq_ex");
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = a.pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND,
	};
	CHECK(ibv_destroy_qp(a.qp) == 0, "drop the plain QP");
	a.qp = ibv_create_qp_ex(a.ctx, &xa);
	CHECK(a.qp, "create_qp_ex");
	connect_rc(&a, &b);
	connect_rc(&b, &a);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a.qp);
	struct ibv_poll_cq_attr pa = { 0 };
	CHECK(ibv_start_poll(cqx, &pa) == ENOENT, "empty extended CQ");
	strcpy(a.buf, "via wr api");
	post_recv(b.qp, &b, 0, 64);
	ibv_wr_start(qx);
	qx->wr_id = 41;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf + 512);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 11);
	qx->wr_id = 42;
	ibv_wr_send_imm(qx, htonl(7));
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 11);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete");
	int ret;
	while ((ret = ibv_start_poll(cqx, &pa)) == ENOENT)
		;
	CHECK(ret == 0 && cqx->wr_id == 41 && cqx->status == IBV_WC_SUCCESS &&
	      ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_WRITE, "first extended completion");
	while ((ret = ibv_next_poll(cqx)) == ENOENT)
		;
	CHECK(ret == 0 && cqx->wr_id == 42 && ibv_wc_read_opcode(cqx) == IBV_WC_SEND, "second");
	ibv_end_poll(cqx);
	struct ibv_wc wc = poll_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 7,
	      "send_imm via wr api");
	CHECK(strcmp(b.buf + 512, "via wr api") == 0 && strcmp(b.buf, "via wr api") == 0, "bytes");
}

/* An end whose CQ is an extended CQ reporting every field the library has
 * (IBV_WC_STANDARD_FLAGS) and whose QP comes from ibv_create_qp_ex with every
 * ibv_wr_* operation it implements. */
static void open_ext_end(struct ibv_device *dev, struct end *e, enum ibv_qp_type type)
{
	open_end(dev, e, type);
	CHECK(ibv_destroy_qp(e->qp) == 0 && ibv_destroy_cq(e->cq) == 0, "drop the plain QP and CQ");
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };
	e->cqx = ibv_create_cq_ex(e->ctx, &ca);
	CHECK(e->cqx, "create_cq_ex with IBV_WC_STANDARD_FLAGS");
	e->cq = ibv_cq_ex_to_cq(e->cqx);
	uint64_t ops = type == IBV_QPT_UD ? IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM :
		IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
		IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
		IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV |
		IBV_QP_EX_WITH_ATOMIC_WRITE;
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = e->pd,
		.send_ops_flags = ops,
	};
	e->qp = ibv_create_qp_ex(e->ctx, &xa);
	CHECK(e->qp, "create_qp_ex");
	CHECK(ibv_qp_to_qp_ex(e->qp) == (struct ibv_qp_ex *)e->qp, "qp_to_qp_ex");
}

/* One completion of an extended CQ, every field read through its accessor. */
struct wcx {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t vendor_err, byte_len, imm_or_inv, qp_num, src_qp, slid;
	unsigned int wc_flags;
	uint8_t sl, dlid_path_bits;
};

static struct wcx read_wcx(struct ibv_cq_ex *cq)
{
	struct wcx w = {
		.wr_id = cq->wr_id, .status = cq->status,
		.opcode = ibv_wc_read_opcode(cq), .vendor_err = ibv_wc_read_vendor_err(cq),
		.byte_len = ibv_wc_read_byte_len(cq), .qp_num = ibv_wc_read_qp_num(cq),
		.src_qp = ibv_wc_read_src_qp(cq), .wc_flags = ibv_wc_read_wc_flags(cq),
		.slid = ibv_wc_read_slid(cq), .sl = ibv_wc_read_sl(cq),
		.dlid_path_bits = ibv_wc_read_dlid_path_bits(cq),
	};
	/* One union in the completion: imm_data (network order) or, with
	 * IBV_WC_WITH_INV, the invalidated rkey (host order). */
	if (w.wc_flags & IBV_WC_WITH_INV)
		w.imm_or_inv = ibv_wc_read_invalidated_rkey(cq);
	else
		w.imm_or_inv = ntohl(ibv_wc_read_imm_data(cq));
	return w;
}

/* start_poll .. end_poll around one completion. */
static struct wcx poll_ex(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = { 0 };
	for (int i = 0; i < 5000000; i++) {
		int ret = ibv_start_poll(cq, &pa);
		if (ret == 0) {
			struct wcx w = read_wcx(cq);
			ibv_end_poll(cq);
			return w;
		}
		if (ret != ENOENT)
			CHECK(0, "start_poll: %d", ret);
	}
	CHECK(0, "no extended completion");
	return (struct wcx){ 0 };
}

/* A successful completion, checked field by field. */
static struct wcx expect_ex(struct end *e, uint64_t wr_id, enum ibv_wc_opcode op, uint32_t byte_len)
{
	struct wcx w = poll_ex(e->cqx);
	CHECK(w.status == IBV_WC_SUCCESS, "status %s (wr_id %" PRIu64 ")",
	      ibv_wc_status_str(w.status), w.wr_id);
	CHECK(w.wr_id == wr_id, "wr_id %" PRIu64 ", want %" PRIu64, w.wr_id, wr_id);
	CHECK(w.opcode == op, "opcode %d, want %d (wr_id %" PRIu64 ")", w.opcode, op, wr_id);
	CHECK(w.byte_len == byte_len, "byte_len %u, want %u (wr_id %" PRIu64 ")", w.byte_len,
	      byte_len, wr_id);
	CHECK(w.vendor_err == 0, "vendor_err %u", w.vendor_err);
	CHECK(w.qp_num == e->qp->qp_num, "qp_num %u, want %u", w.qp_num, e->qp->qp_num);
	/* No LIDs on RoCE. A UD receive reports RoCEv2 over IPv4 in sl (IBTA A17.4.5.1, in
	 * the encoding RoCE devices use: bit 3 UDP, type 2 IPv4); anything else has 0. */
	int ud_recv = e->qp->qp_type == IBV_QPT_UD && (op == IBV_WC_RECV);
	CHECK(w.slid == 0 && w.sl == (ud_recv ? 0xA : 0) && w.dlid_path_bits == 0,
	      "slid %u sl %u dlid_path_bits %u on RoCE", w.slid, w.sl, w.dlid_path_bits);
	return w;
}

/* Nothing arrives on this CQ (after a pause long enough for loopback delivery). */
static void expect_none(struct ibv_cq_ex *cq, const char *what)
{
	usleep(200000);
	struct ibv_poll_cq_attr pa = { 0 };
	int ret = ibv_start_poll(cq, &pa);
	if (ret == 0) {
		fprintf(stderr, "unexpected completion wr_id %" PRIu64 " opcode %d\n", cq->wr_id,
			ibv_wc_read_opcode(cq));
		ibv_end_poll(cq);
	}
	CHECK(ret == ENOENT, "%s: start_poll %d", what, ret);
}

static uint64_t u64_at(struct end *e, size_t off)
{
	uint64_t v;
	memcpy(&v, e->buf + off, 8);
	return v;
}

/* Every ibv_wr_* operation and setter on RC, each completion read with the
 * ibv_wc_read_* accessors, each result checked in the target buffers. */
static void test_wr_rc(struct ibv_device **list)
{
	struct end a, b;
	open_ext_end(list[0], &a, IBV_QPT_RC);
	open_ext_end(list[1], &b, IBV_QPT_RC);
	connect_rc(&a, &b);
	connect_rc(&b, &a);
	struct ibv_qp_ex *qa = ibv_qp_to_qp_ex(a.qp), *qb = ibv_qp_to_qp_ex(b.qp);
	uint32_t sender = a.qp->qp_num;

	/* ibv_wr_abort: a SEND and a WRITE built, then dropped: nothing is posted. */
	post_recv(b.qp, &b, 0, 64);
	strcpy(a.buf + 50, "aborted!");
	ibv_wr_start(qa);
	qa->wr_id = 900;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qa);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 50, 9);
	qa->wr_id = 901;
	ibv_wr_rdma_write(qa, b.mr->rkey, (uintptr_t)b.buf + 1500);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 50, 9);
	ibv_wr_abort(qa);
	expect_none(a.cqx, "after wr_abort, no send completion");
	expect_none(b.cqx, "after wr_abort, no receive completion");
	CHECK(b.buf[0] == 0 && b.buf[1500] == 0, "after wr_abort, no byte moved");
	/* An empty batch posts nothing and succeeds. */
	ibv_wr_start(qa);
	CHECK(ibv_wr_complete(qa) == 0, "empty wr batch");

	/* ibv_wr_send + ibv_wr_set_sge_list: two pieces gathered into one message,
	 * landing in the receive that the aborted SEND did not take. */
	strcpy(a.buf + 100, "abc");
	strcpy(a.buf + 200, "defg");
	struct ibv_sge two[2] = { { (uintptr_t)a.buf + 100, 3, a.mr->lkey },
				  { (uintptr_t)a.buf + 200, 4, a.mr->lkey } };
	ibv_wr_start(qa);
	qa->wr_id = 1;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qa);
	ibv_wr_set_sge_list(qa, 2, two);
	CHECK(ibv_wr_complete(qa) == 0, "wr_send");
	expect_ex(&a, 1, IBV_WC_SEND, 7);
	struct wcx w = expect_ex(&b, 0, IBV_WC_RECV, 7);
	CHECK((w.wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV)) == 0, "plain SEND flags %x",
	      w.wc_flags);
	CHECK(w.src_qp == sender, "src_qp %u, want %u", w.src_qp, sender);
	CHECK(memcmp(b.buf, "abcdefg", 7) == 0 && b.buf[7] == 0, "sge_list bytes: %.8s", b.buf);

	/* ibv_wr_send_imm + ibv_wr_set_inline_data from the stack (reused at once). */
	post_recv(b.qp, &b, 100, 64);
	{
		char stack[6] = "inlin";
		ibv_wr_start(qa);
		qa->wr_id = 2;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qa, htonl(0x01020304));
		ibv_wr_set_inline_data(qa, stack, sizeof(stack));
		CHECK(ibv_wr_complete(qa) == 0, "wr_send_imm inline");
		memset(stack, 'X', sizeof(stack));
	}
	expect_ex(&a, 2, IBV_WC_SEND, 6);
	w = expect_ex(&b, 100, IBV_WC_RECV, 6);
	CHECK((w.wc_flags & IBV_WC_WITH_IMM) && !(w.wc_flags & IBV_WC_WITH_INV) &&
	      w.imm_or_inv == 0x01020304, "imm flags %x imm %x", w.wc_flags, w.imm_or_inv);
	CHECK(memcmp(b.buf + 100, "inlin", 6) == 0, "inline bytes");

	/* ibv_wr_set_inline_data_list: three buffers, one of them empty. */
	post_recv(b.qp, &b, 200, 64);
	{
		char p1[] = "inline", p2[] = "-list";
		struct ibv_data_buf bufs[3] = { { p1, 6 }, { p2, 0 }, { p2, 6 } };
		ibv_wr_start(qa);
		qa->wr_id = 3;
		qa->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
		ibv_wr_send(qa);
		ibv_wr_set_inline_data_list(qa, 3, bufs);
		CHECK(ibv_wr_complete(qa) == 0, "inline list");
		memset(p1, 0, sizeof(p1));
		memset(p2, 0, sizeof(p2));
	}
	expect_ex(&a, 3, IBV_WC_SEND, 12);
	expect_ex(&b, 200, IBV_WC_RECV, 12);
	CHECK(memcmp(b.buf + 200, "inline-list", 12) == 0, "inline list bytes: %s", b.buf + 200);

	/* ibv_wr_rdma_write_imm: bytes at the target address, the immediate in a
	 * receive completion whose buffer stays untouched. */
	memset(b.buf + 300, 'z', 16);
	post_recv(b.qp, &b, 300, 16);
	strcpy(a.buf + 300, "write-imm");
	ibv_wr_start(qa);
	qa->wr_id = 4;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(qa, b.mr->rkey, (uintptr_t)b.buf + 1000, htonl(0xfeedbeef));
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 300, 10);
	CHECK(ibv_wr_complete(qa) == 0, "wr_rdma_write_imm");
	expect_ex(&a, 4, IBV_WC_RDMA_WRITE, 10);
	w = expect_ex(&b, 300, IBV_WC_RECV_RDMA_WITH_IMM, 10);
	CHECK((w.wc_flags & IBV_WC_WITH_IMM) && w.imm_or_inv == 0xfeedbeef, "write imm %x flags %x",
	      w.imm_or_inv, w.wc_flags);
	CHECK(strcmp(b.buf + 1000, "write-imm") == 0, "write_imm bytes");
	for (int i = 0; i < 16; i++)
		CHECK(b.buf[300 + i] == 'z', "receive buffer of a WRITE with imm untouched");

	/* ibv_wr_rdma_read. */
	strcpy(b.buf + 1200, "read me back");
	ibv_wr_start(qa);
	qa->wr_id = 5;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qa, b.mr->rkey, (uintptr_t)b.buf + 1200);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 1200, 13);
	CHECK(ibv_wr_complete(qa) == 0, "wr_rdma_read");
	expect_ex(&a, 5, IBV_WC_RDMA_READ, 13);
	CHECK(memcmp(a.buf + 1200, "read me back", 13) == 0, "read bytes");

	/* Atomics: compare-and-swap that swaps, one that does not, then two
	 * fetch-and-adds in one batch; each returns the original value. */
	uint64_t ten = 10;
	memcpy(b.buf + 2048, &ten, 8);
	ibv_wr_start(qa);
	qa->wr_id = 6;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(qa, b.mr->rkey, (uintptr_t)b.buf + 2048, 10, 99);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 2048, 8);
	qa->wr_id = 7;
	ibv_wr_atomic_cmp_swp(qa, b.mr->rkey, (uintptr_t)b.buf + 2048, 5, 1234);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 2056, 8);
	CHECK(ibv_wr_complete(qa) == 0, "wr_atomic_cmp_swp");
	expect_ex(&a, 6, IBV_WC_COMP_SWAP, 8);
	expect_ex(&a, 7, IBV_WC_COMP_SWAP, 8);
	CHECK(u64_at(&a, 2048) == 10 && u64_at(&a, 2056) == 99 && u64_at(&b, 2048) == 99,
	      "cmp_swp: originals %" PRIu64 " %" PRIu64 ", remote %" PRIu64, u64_at(&a, 2048),
	      u64_at(&a, 2056), u64_at(&b, 2048));
	ibv_wr_start(qa);
	qa->wr_id = 8;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qa, b.mr->rkey, (uintptr_t)b.buf + 2048, 1);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 2064, 8);
	qa->wr_id = 9;
	ibv_wr_atomic_fetch_add(qa, b.mr->rkey, (uintptr_t)b.buf + 2048, 1ULL << 32);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 2072, 8);
	CHECK(ibv_wr_complete(qa) == 0, "wr_atomic_fetch_add");
	expect_ex(&a, 8, IBV_WC_FETCH_ADD, 8);
	expect_ex(&a, 9, IBV_WC_FETCH_ADD, 8);
	CHECK(u64_at(&a, 2064) == 99 && u64_at(&a, 2072) == 100 &&
	      u64_at(&b, 2048) == 100 + (1ULL << 32), "fetch_add: originals %" PRIu64 " %" PRIu64
	      ", remote %" PRIx64, u64_at(&a, 2064), u64_at(&a, 2072), u64_at(&b, 2048));

	/* ibv_wr_atomic_write (IBTA 1.5): the 8 bytes are read during the call only. */
	{
		uint64_t v = 0x1122334455667788ULL;
		ibv_wr_start(qa);
		qa->wr_id = 10;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qa, b.mr->rkey, (uintptr_t)b.buf + 2056, &v);
		v = 0;
		CHECK(ibv_wr_complete(qa) == 0, "wr_atomic_write");
		expect_ex(&a, 10, IBV_WC_ATOMIC_WRITE, 8);
		CHECK(u64_at(&b, 2056) == 0x1122334455667788ULL && u64_at(&b, 2048) == 100 + (1ULL << 32),
		      "atomic_write: remote %" PRIx64, u64_at(&b, 2056));
	}

	/* ibv_wr_bind_mw (type 2 window on b's buffer), a WRITE through it;
	 * ibv_wr_local_inv; a bind again (a type 2 window binds only while unbound, so
	 * this shows the invalidation took), a SEND with invalidate (ibv_wr_send_inv,
	 * the rkey read back with ibv_wc_read_invalidated_rkey); then the window's rkey
	 * no longer works. */
	struct ibv_mr *mr = ibv_reg_mr(b.pd, b.buf, SZ, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(mr, "MR with MW_BIND");
	struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	CHECK(mw, "alloc_mw type 2");
	struct ibv_mw_bind_info bi = { .mr = mr, .addr = (uintptr_t)b.buf + 3500, .length = 64,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	uint32_t rkey2 = ibv_inc_rkey(mw->rkey);
	ibv_wr_start(qb);
	qb->wr_id = 20;
	qb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qb, mw, rkey2, &bi);
	CHECK(ibv_wr_complete(qb) == 0, "wr_bind_mw");
	expect_ex(&b, 20, IBV_WC_BIND_MW, 0);
	strcpy(a.buf + 400, "via wr_bind_mw");
	ibv_wr_start(qa);
	qa->wr_id = 10;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qa, rkey2, (uintptr_t)b.buf + 3500);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 400, 15);
	CHECK(ibv_wr_complete(qa) == 0, "write through the window");
	expect_ex(&a, 10, IBV_WC_RDMA_WRITE, 15);
	CHECK(strcmp(b.buf + 3500, "via wr_bind_mw") == 0, "bytes through the window");

	ibv_wr_start(qb);
	qb->wr_id = 21;
	qb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qb, rkey2);
	CHECK(ibv_wr_complete(qb) == 0, "wr_local_inv");
	expect_ex(&b, 21, IBV_WC_LOCAL_INV, 0);
	uint32_t rkey3 = ibv_inc_rkey(rkey2);
	ibv_wr_start(qb);
	qb->wr_id = 22;
	qb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qb, mw, rkey3, &bi);
	CHECK(ibv_wr_complete(qb) == 0, "wr_bind_mw after local_inv");
	expect_ex(&b, 22, IBV_WC_BIND_MW, 0);

	post_recv(b.qp, &b, 400, 64);
	strcpy(a.buf + 500, "inv");
	ibv_wr_start(qa);
	qa->wr_id = 11;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(qa, rkey3);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 500, 4);
	CHECK(ibv_wr_complete(qa) == 0, "wr_send_inv");
	expect_ex(&a, 11, IBV_WC_SEND, 4);
	w = expect_ex(&b, 400, IBV_WC_RECV, 4);
	CHECK((w.wc_flags & IBV_WC_WITH_INV) && !(w.wc_flags & IBV_WC_WITH_IMM) &&
	      w.imm_or_inv == rkey3, "invalidated rkey %x, want %x (flags %x)", w.imm_or_inv, rkey3,
	      w.wc_flags);
	CHECK(strcmp(b.buf + 400, "inv") == 0, "send_inv bytes");

	/* What the library does not do fails the batch at ibv_wr_complete, posting none
	 * of it (checked by the WRITE that follows being the next completion). */
	{
		uint64_t v = 1;
		ibv_wr_start(qa);
		qa->wr_id = 12;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qa);
		ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 500, 4);
		ibv_wr_send_tso(qa, &v, sizeof(v), 64);
		CHECK(ibv_wr_complete(qa) == EOPNOTSUPP, "wr_send_tso");
		ibv_wr_start(qa);
		qa->wr_id = 13;
		ibv_wr_bind_mw(qa, NULL, 0, &bi);
		CHECK(ibv_wr_complete(qa) == EINVAL, "wr_bind_mw without a window");
	}

	/* The invalidated window: the access fails, as a remote access error. */
	ibv_wr_start(qa);
	qa->wr_id = 14;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qa, rkey3, (uintptr_t)b.buf + 3500);
	ibv_wr_set_sge(qa, a.mr->lkey, (uintptr_t)a.buf + 400, 15);
	CHECK(ibv_wr_complete(qa) == 0, "write through the invalidated window");
	w = poll_ex(a.cqx);
	CHECK(w.wr_id == 14 && w.status == IBV_WC_REM_ACCESS_ERR, "wr_id %" PRIu64 " status %s",
	      w.wr_id, ibv_wc_status_str(w.status));
	CHECK(ibv_destroy_qp(b.qp) == 0 && ibv_dealloc_mw(mw) == 0 && ibv_dereg_mr(mr) == 0,
	      "teardown of the window");
}

/* UD through ibv_wr_*: ibv_wr_set_ud_addr with inline data and with an SGE, both
 * in one batch, read with ibv_start_poll + ibv_next_poll; the receiver's
 * completion fields (src_qp, GRH flag, imm) read with the accessors. */
static void test_wr_ud(struct ibv_device **list)
{
	struct end u[2];
	for (int i = 0; i < 2; i++) {
		open_ext_end(list[i], &u[i], IBV_QPT_UD);
		ud_up(&u[i], 0x2222);
	}
	post_recv(u[1].qp, &u[1], 0, 40 + 64);
	post_recv(u[1].qp, &u[1], 200, 40 + 64);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = u[1].gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(u[0].pd, &aa);
	CHECK(ah, "create_ah");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(u[0].qp);
	strcpy(u[0].buf + 500, "ud with sge");
	{
		char stack[] = "ud inline";
		ibv_wr_start(qx);
		qx->wr_id = 30;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qx, htonl(0x55aa));
		ibv_wr_set_ud_addr(qx, ah, u[1].qp->qp_num, 0x2222);
		ibv_wr_set_inline_data(qx, stack, sizeof(stack));
		qx->wr_id = 31;
		ibv_wr_send(qx);
		ibv_wr_set_ud_addr(qx, ah, u[1].qp->qp_num, 0x2222);
		ibv_wr_set_sge(qx, u[0].mr->lkey, (uintptr_t)u[0].buf + 500, 12);
		CHECK(ibv_wr_complete(qx) == 0, "UD wr batch");
		memset(stack, 0, sizeof(stack));
	}
	/* Both send completions in one start_poll .. end_poll. */
	struct ibv_poll_cq_attr pa = { 0 };
	int ret;
	while ((ret = ibv_start_poll(u[0].cqx, &pa)) == ENOENT)
		;
	CHECK(ret == 0, "start_poll %d", ret);
	struct wcx s1 = read_wcx(u[0].cqx);
	while ((ret = ibv_next_poll(u[0].cqx)) == ENOENT)
		;
	CHECK(ret == 0, "next_poll %d", ret);
	struct wcx s2 = read_wcx(u[0].cqx);
	ibv_end_poll(u[0].cqx);
	CHECK(s1.wr_id == 30 && s1.status == IBV_WC_SUCCESS && s1.opcode == IBV_WC_SEND &&
	      s1.qp_num == u[0].qp->qp_num, "first UD send completion");
	CHECK(s2.wr_id == 31 && s2.status == IBV_WC_SUCCESS && s2.opcode == IBV_WC_SEND &&
	      s2.qp_num == u[0].qp->qp_num, "second UD send completion");

	struct wcx r = expect_ex(&u[1], 0, IBV_WC_RECV, 40 + 10);
	CHECK((r.wc_flags & IBV_WC_GRH) && (r.wc_flags & IBV_WC_WITH_IMM) && r.imm_or_inv == 0x55aa,
	      "UD imm: flags %x imm %x", r.wc_flags, r.imm_or_inv);
	CHECK(r.src_qp == u[0].qp->qp_num, "UD src_qp %u, want %u", r.src_qp, u[0].qp->qp_num);
	CHECK(memcmp(u[1].buf + 40, "ud inline", 10) == 0, "UD inline payload after the GRH");
	r = expect_ex(&u[1], 200, IBV_WC_RECV, 40 + 12);
	CHECK((r.wc_flags & IBV_WC_GRH) && !(r.wc_flags & IBV_WC_WITH_IMM) &&
	      r.src_qp == u[0].qp->qp_num, "second UD recv: flags %x src_qp %u", r.wc_flags, r.src_qp);
	CHECK(memcmp(u[1].buf + 240, "ud with sge", 12) == 0, "UD sge payload after the GRH");

	/* A UD batch with a NULL address handle fails whole. */
	ibv_wr_start(qx);
	qx->wr_id = 32;
	ibv_wr_send(qx);
	ibv_wr_set_ud_addr(qx, NULL, u[1].qp->qp_num, 0x2222);
	ibv_wr_set_sge(qx, u[0].mr->lkey, (uintptr_t)u[0].buf + 500, 12);
	CHECK(ibv_wr_complete(qx) == EINVAL, "UD without an AH");
	expect_none(u[0].cqx, "nothing posted from the failed batch");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");
}

/* Extended objects the library cannot make fail with EOPNOTSUPP. */
static void test_ex_unsupported(struct end *a)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN |
					  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(ibv_create_cq_ex(a->ctx, &ca) == NULL && errno == EOPNOTSUPP,
	      "create_cq_ex with completion timestamps");
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = a->cq, .recv_cq = a->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = a->pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO,
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(a->ctx, &xa) == NULL && errno == EOPNOTSUPP,
	      "create_qp_ex with IBV_QP_EX_WITH_TSO");
}

static void test_misc(struct end *a)
{
	CHECK(ibv_fork_init() == 0, "fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork status");
	CHECK(ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4 && mult_to_ibv_rate(4) == IBV_RATE_10_GBPS, "rates");
	CHECK(ibv_rate_to_mbps(IBV_RATE_40_GBPS) == 40000 && mbps_to_ibv_rate(40000) == IBV_RATE_40_GBPS, "mbps");
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded") == 0,
	      "wc_status_str: %s", ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	CHECK(strcmp(ibv_event_type_str(IBV_EVENT_SRQ_LIMIT_REACHED), "SRQ limit reached") == 0,
	      "event_type_str: %s", ibv_event_type_str(IBV_EVENT_SRQ_LIMIT_REACHED));
	CHECK(ibv_resize_cq(a->cq, 128) == 0 && a->cq->cqe == 128, "resize_cq");
	/* What the emulator does not do fails cleanly. */
	errno = 0;
	CHECK(ibv_reg_mr_iova2(a->pd, a->buf, 64, 0x1000, IBV_ACCESS_LOCAL_WRITE) == NULL &&
	      errno == EOPNOTSUPP, "iova != addr");
	CHECK(ibv_reg_mr(a->pd, NULL, 64, 0) == NULL && errno == EINVAL, "null buffer");
	struct ibv_mr *m2 = ibv_reg_mr(a->pd, a->buf + 2048, 1024, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m2, "second mr");
	int r = ibv_rereg_mr(m2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(r == 0, "rereg_mr: %d", r);
	CHECK(ibv_dereg_mr(m2) == 0, "dereg");
	CHECK(ibv_query_ece(a->qp, NULL) == EOPNOTSUPP, "ece");
	CHECK(ibv_import_device(-1) == NULL, "import");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list, "get_device_list");
	test_device_queries(list, n);

	struct end a, b;
	open_end(list[0], &a, IBV_QPT_RC);
	open_end(list[1], &b, IBV_QPT_RC);
	connect_rc(&a, &b);
	connect_rc(&b, &a);
	test_rc(&a, &b);
	test_srq_and_events(&a);
	test_ud(list);
	test_extended_rc(list);
	test_wr_rc(list);
	test_wr_ud(list);
	test_ex_unsupported(&a);
	test_misc(&a);

	CHECK(ibv_destroy_qp(a.qp) == 0, "destroy qp");
	CHECK(ibv_destroy_cq(a.cq) == 0, "destroy cq");
	CHECK(ibv_destroy_comp_channel(a.ch) == 0, "destroy channel");
	CHECK(ibv_dereg_mr(a.mr) == 0, "dereg");
	CHECK(ibv_dealloc_pd(a.pd) == 0, "dealloc pd");
	CHECK(ibv_close_device(a.ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("verbs_test: %d checks passed\n", checks);
	return 0;
}
