/*
 * xrc_test: XRC through capi's libibverbs.so.1, compiled against the real
 * <infiniband/verbs.h>, whose XRC verbs are inline calls of verbs_context operations.
 * Needs two emulated devices: the initiator on the first, the target on the second:
 *   RDMA_EMU_DEVICES="emu0=127.0.0.19,emu1=127.0.0.20" ./xrc_test
 * Checks: ibv_open_xrcd by file (O_CREAT, O_EXCL, joining) and private (fd -1),
 * ibv_close_xrcd (EBUSY while an XRC SRQ belongs to the domain), ibv_create_srq_ex of
 * type XRC, ibv_get_srq_num (EINVAL on a basic SRQ), XRC_SEND and XRC_RECV QPs from
 * ibv_create_qp_ex, a SEND by ibv_post_send (wr.qp_type.xrc.remote_srqn) and one by
 * ibv_wr_send + ibv_wr_set_xrc_srqn completing on the SRQ's CQ, ibv_open_qp (the QP
 * outlives its creator's destroy while opened).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

#define SZ 4096

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (int i = 0; i < 5000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return wc;
	}
	CHECK(0, "no completion");
	return wc;
}

static void up(struct ibv_qp *qp, uint32_t dest, union ibv_gid *dgid, int recv)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = dest;
	at.rq_psn = 100;
	at.max_dest_rd_atomic = 4;
	at.min_rnr_timer = 1;
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.dgid = *dgid;
	at.ah_attr.grh.hop_limit = 64;
	at.ah_attr.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (recv)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(qp, &at, mask) == 0, "RTR");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.sq_psn = 100;
	at.max_rd_atomic = 4;
	mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	if (!recv)
		mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(qp, &at, mask) == 0, "RTS");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n >= 2, "two devices");
	struct ibv_context *ci = ibv_open_device(list[0]), *ct = ibv_open_device(list[1]);
	CHECK(ci && ct, "open devices");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ct, &da) == 0 && (da.device_cap_flags & IBV_DEVICE_XRC),
	      "IBV_DEVICE_XRC");

	/* Domains: by file and private. */
	char path[] = "/tmp/capi-xrc-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
					 IBV_XRCD_INIT_ATTR_OFLAGS, .fd = fd, .oflags = 0 };
	errno = 0;
	CHECK(!ibv_open_xrcd(ct, &xa) && errno == EINVAL, "no domain yet, no O_CREAT");
	xa.oflags = O_CREAT | O_EXCL;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ct, &xa);
	CHECK(xrcd && xrcd->context == ct, "O_CREAT|O_EXCL makes it");
	errno = 0;
	CHECK(!ibv_open_xrcd(ct, &xa) && errno == EINVAL, "O_EXCL on an existing one");
	xa.oflags = 0;
	struct ibv_xrcd *again = ibv_open_xrcd(ct, &xa);
	CHECK(again, "joining the file's domain");
	xa.fd = -1;
	xa.oflags = O_CREAT;
	struct ibv_xrcd *priv = ibv_open_xrcd(ct, &xa);
	CHECK(priv, "a private domain");
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD;
	errno = 0;
	CHECK(!ibv_open_xrcd(ct, &xa) && errno == EINVAL, "oflags missing from comp_mask");

	/* The target: PD, memory, CQ, XRC SRQ, XRC receive QP. */
	struct ibv_pd *pdt = ibv_alloc_pd(ct);
	char *bt = calloc(1, SZ);
	struct ibv_mr *mrt = ibv_reg_mr(pdt, bt, SZ, IBV_ACCESS_LOCAL_WRITE |
					IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cqt = ibv_create_cq(ct, 16, NULL, NULL, 0);
	CHECK(pdt && mrt && cqt, "target objects");
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = pdt, .xrcd = again, .cq = cqt,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(ct, &sa);
	CHECK(srq, "create_srq_ex XRC");
	uint32_t srqn = 0;
	CHECK(ibv_get_srq_num(srq, &srqn) == 0 && srqn != 0, "get_srq_num");
	struct ibv_srq_init_attr basic_a = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *basic = ibv_create_srq(pdt, &basic_a);
	uint32_t none;
	CHECK(basic && ibv_get_srq_num(basic, &none) == EINVAL, "no number for a basic SRQ");
	struct ibv_qp_init_attr_ex ta = { .qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = xrcd };
	struct ibv_qp *tgt = ibv_create_qp_ex(ct, &ta);
	CHECK(tgt && tgt->qp_type == IBV_QPT_XRC_RECV, "XRC_RECV QP");
	ta.comp_mask = 0;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ct, &ta) && errno == EINVAL, "XRC_RECV without a domain");

	/* The initiator: an XRC send QP with the ibv_wr_* SEND. */
	struct ibv_pd *pdi = ibv_alloc_pd(ci);
	char *bi = calloc(1, SZ);
	struct ibv_mr *mri = ibv_reg_mr(pdi, bi, SZ, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *cqi = ibv_create_cq(ci, 16, NULL, NULL, 0);
	CHECK(pdi && mri && cqi, "initiator objects");
	struct ibv_qp_init_attr_ex ia = { .send_cq = cqi, .qp_type = IBV_QPT_XRC_SEND,
		.cap = { .max_send_wr = 8, .max_send_sge = 1 }, .sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pdi,
		.send_ops_flags = IBV_QP_EX_WITH_SEND };
	struct ibv_qp *ini = ibv_create_qp_ex(ci, &ia);
	CHECK(ini && ini->qp_type == IBV_QPT_XRC_SEND, "XRC_SEND QP");

	union ibv_gid gi, gt;
	CHECK(ibv_query_gid(ci, 1, 0, &gi) == 0 && ibv_query_gid(ct, 1, 0, &gt) == 0, "gids");
	up(ini, tgt->qp_num, &gt, 0);
	up(tgt, ini->qp_num, &gi, 1);

	for (int i = 0; i < 2; i++) {
		struct ibv_sge rs = { (uintptr_t)bt + 64 * i, 64, mrt->lkey };
		struct ibv_recv_wr rw = { .wr_id = 10 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_srq_recv(srq, &rw, &rbad) == 0, "post_srq_recv");
	}
	strcpy(bi, "legacy xrc send");
	struct ibv_sge ss = { (uintptr_t)bi, 16, mri->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *sbad;
	sw.qp_type.xrc.remote_srqn = srqn;
	CHECK(ibv_post_send(ini, &sw, &sbad) == 0, "post_send");
	struct ibv_wc wc = poll_one(cqi);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "send: %s",
	      ibv_wc_status_str(wc.status));
	wc = poll_one(cqt);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 && wc.opcode == IBV_WC_RECV &&
	      wc.byte_len == 16 && wc.qp_num == tgt->qp_num, "receive on the SRQ's CQ");
	CHECK(strcmp(bt, "legacy xrc send") == 0, "bytes");

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini);
	strcpy(bi + 128, "wr_set_xrc_srqn");
	ibv_wr_start(qx);
	qx->wr_id = 2;
	ibv_wr_send(qx);
	ibv_wr_set_xrc_srqn(qx, srqn);
	ibv_wr_set_sge(qx, mri->lkey, (uintptr_t)bi + 128, 16);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete");
	wc = poll_one(cqi);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "wr send");
	wc = poll_one(cqt);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 11, "second receive");
	CHECK(strcmp(bt + 64, "wr_set_xrc_srqn") == 0, "bytes");

	/* ibv_open_qp: the QP outlives its creator's destroy. */
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM |
		IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE, .qp_num = tgt->qp_num,
		.xrcd = xrcd, .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp *opened = ibv_open_qp(ct, &oa);
	CHECK(opened && opened->qp_num == tgt->qp_num, "open_qp");
	oa.xrcd = priv;
	errno = 0;
	CHECK(!ibv_open_qp(ct, &oa) && errno == EINVAL, "open_qp through another domain");
	CHECK(ibv_destroy_qp(tgt) == 0, "destroy the creator's QP");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(opened, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_RTS,
	      "the opened QP lives");
	CHECK(ibv_destroy_qp(opened) == 0, "destroy the opened QP");

	/* Closing: the file's domain holds the SRQ. */
	CHECK(ibv_close_xrcd(xrcd) == 0, "first close keeps the domain");
	CHECK(ibv_close_xrcd(again) == EBUSY, "EBUSY with an XRC SRQ");
	CHECK(ibv_destroy_srq(srq) == 0 && ibv_destroy_srq(basic) == 0, "destroy SRQs");
	CHECK(ibv_close_xrcd(again) == 0, "last close");
	CHECK(ibv_close_xrcd(priv) == 0, "close private");
	CHECK(ibv_destroy_qp(ini) == 0, "destroy XRC_SEND");
	close(fd);
	unlink(path);
	printf("xrc_test: %d checks passed\n", checks);
	return 0;
}
