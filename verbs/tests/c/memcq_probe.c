/* Memory registration, CQs and completion channels through <infiniband/verbs.h> as a stock
 * program sees them: the ibv_reg_mr macro (-> ibv_reg_mr or ibv_reg_mr_iova2), the inline
 * ibv_create_cq_ex / ibv_start_poll / ibv_wc_read_* / ibv_poll_cq / ibv_req_notify_cq, and
 * the exported channel verbs, solicited-only arming, a ZERO_BASED region. Two RC QPs of one context talk to each other over the GID of
 * 127.0.0.1. Prints "memcq probe ok" and exits 0, or names the failed check. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "FAIL line %d: %s (errno %d)\n", __LINE__, #c, errno);             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t src[64], dst[64], zb[8];

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    for (long i = 0; i < 50000000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);
        CHECK(n >= 0);
        if (n == 1)
            return wc;
    }
    CHECK(!"a completion came");
    return wc;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, int gidx, union ibv_gid *gid)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_READ};
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                    IBV_QP_ACCESS_FLAGS) == 0);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = gidx;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                    IBV_QP_MIN_RNR_TIMER) == 0);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

int main(int argc, char **argv)
{
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx);
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0);
    int gidx = -1;
    union ibv_gid gid;
    for (int i = 0; i < port.gid_tbl_len && gidx < 0; i++) {
        static const uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
        if (ibv_query_gid(ctx, 1, i, &gid) == 0 && memcmp(gid.raw, lo, 16) == 0)
            gidx = i;
    }
    CHECK(gidx >= 0);

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd && pd->context == ctx);
    /* Constant flags: ibv_reg_mr@IBVERBS_1.1. */
    struct ibv_mr *msrc = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    CHECK(msrc && msrc->addr == src && msrc->length == sizeof src && msrc->pd == pd);
    /* Flags unknown at compile time: the macro calls ibv_reg_mr_iova2 with iova = addr. */
    int rights = argc > 100 ? 0 : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_RELAXED_ORDERING;
    struct ibv_mr *mdst = ibv_reg_mr(pd, dst, sizeof dst, rights);
    CHECK(mdst && mdst->addr == dst && mdst->lkey != msrc->lkey);
    CHECK(ibv_reg_mr(pd, dst, 8, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
    CHECK(ibv_reg_mr(pd, dst, 8, IBV_ACCESS_ON_DEMAND) == NULL && errno == EOPNOTSUPP);
    CHECK(ibv_dealloc_pd(pd) == EBUSY);

    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch && ch->fd >= 0 && ch->context == ctx);
    struct ibv_cq *scq = ibv_create_cq(ctx, 16, (void *)0x5e4d, ch, 0);
    CHECK(scq && scq->cqe == 16 && scq->channel == ch && scq->cq_context == (void *)0x5e4d);
    struct ibv_cq_init_attr_ex ax = {.cqe = 16, .cq_context = (void *)0x4ec5, .channel = ch,
                                     .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
                                                 IBV_WC_EX_WITH_QP_NUM};
    struct ibv_cq_ex *rcq = ibv_create_cq_ex(ctx, &ax);
    CHECK(rcq && rcq->cqe == 16);
    ax.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    CHECK(ibv_create_cq_ex(ctx, &ax) == NULL && errno == EOPNOTSUPP);
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);

    struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = ibv_cq_ex_to_cq(rcq),
                                  .cap = {.max_send_wr = 8, .max_recv_wr = 8,
                                          .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC};
    struct ibv_qp *a = ibv_create_qp(pd, &qa), *b = ibv_create_qp(pd, &qa);
    CHECK(a && b);
    connect_qp(a, b->qp_num, gidx, &gid);
    connect_qp(b, a->qp_num, gidx, &gid);

    /* SEND with immediate, both CQs armed: one event each on the shared channel. */
    CHECK(ibv_req_notify_cq(scq, 0) == 0);
    CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(rcq), 0) == 0);
    src[0] = 0x0102030405060708ull;
    struct ibv_sge rs = {.addr = (uintptr_t)&dst[8], .length = 64, .lkey = mdst->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 77, .sg_list = &rs, .num_sge = 1}, *rbad;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
    struct ibv_sge ss = {.addr = (uintptr_t)src, .length = 8, .lkey = msrc->lkey};
    struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &ss, .num_sge = 1,
                              .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
                              .imm_data = htonl(0x11223344)},
                       *sbad;
    CHECK(ibv_post_send(a, &swr, &sbad) == 0);
    int got_s = 0, got_r = 0;
    for (int i = 0; i < 2; i++) {
        struct ibv_cq *ecq;
        void *ectx;
        CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0); /* blocking */
        if (ecq == scq && ectx == (void *)0x5e4d)
            got_s++;
        else if (ecq == ibv_cq_ex_to_cq(rcq) && ectx == (void *)0x4ec5)
            got_r++;
        ibv_ack_cq_events(ecq, 1);
    }
    CHECK(got_s == 1 && got_r == 1);
    CHECK(scq->comp_events_completed == 1 && rcq->comp_events_completed == 1);
    /* Nothing else pending: a non-blocking read says EAGAIN. */
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    struct ibv_cq *ecq;
    void *ectx;
    CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN);

    struct ibv_poll_cq_attr pa = {0};
    CHECK(ibv_start_poll(rcq, &pa) == 0);
    CHECK(rcq->wr_id == 77 && rcq->status == IBV_WC_SUCCESS);
    CHECK(ibv_wc_read_opcode(rcq) == IBV_WC_RECV);
    CHECK(ibv_wc_read_byte_len(rcq) == 8);
    CHECK(ibv_wc_read_imm_data(rcq) == htonl(0x11223344));
    CHECK(ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_IMM);
    CHECK(ibv_wc_read_qp_num(rcq) == b->qp_num);
    CHECK(ibv_next_poll(rcq) == ENOENT);
    ibv_end_poll(rcq);
    CHECK(ibv_start_poll(rcq, &pa) == ENOENT);
    CHECK(dst[8] == 0x0102030405060708ull);
    struct ibv_wc wc = poll_one(scq);
    CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
    CHECK(wc.qp_num == a->qp_num);

    /* RDMA WRITE lands in the registered array itself, at its own address. */
    for (int i = 0; i < 4; i++)
        src[i] = 0xA0A0A0A000000000ull + i;
    ss.length = 32;
    swr.opcode = IBV_WR_RDMA_WRITE;
    swr.wr_id = 2;
    swr.wr.rdma.remote_addr = (uintptr_t)&dst[32];
    swr.wr.rdma.rkey = mdst->rkey;
    CHECK(ibv_post_send(a, &swr, &sbad) == 0);
    wc = poll_one(scq);
    CHECK(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
    CHECK(memcmp(&dst[32], src, 32) == 0);

    /* A zero-based region is addressed by offsets. */
    struct ibv_mr *mzb = ibv_reg_mr(pd, zb, sizeof zb,
                                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                        IBV_ACCESS_ZERO_BASED);
    CHECK(mzb && mzb->addr == zb);
    ss.length = 8;
    swr.wr_id = 4;
    swr.wr.rdma.remote_addr = 16;
    swr.wr.rdma.rkey = mzb->rkey;
    CHECK(ibv_post_send(a, &swr, &sbad) == 0);
    wc = poll_one(scq);
    CHECK(wc.wr_id == 4 && wc.status == IBV_WC_SUCCESS);
    CHECK(zb[2] == src[0] && zb[0] == 0 && zb[1] == 0 && zb[3] == 0);
    CHECK(ibv_dereg_mr(mzb) == 0);

    /* Solicited-only arming: an unsolicited SEND makes no event, a solicited one does. */
    CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(rcq), 1) == 0);
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    ss.length = 0;
    swr.opcode = IBV_WR_SEND;
    for (int solicited = 0; solicited < 2; solicited++) {
        rwr.wr_id = 80 + solicited;
        CHECK(ibv_post_recv(b, &rwr, &rbad) == 0);
        swr.wr_id = 5 + solicited;
        swr.send_flags = IBV_SEND_SIGNALED | (solicited ? IBV_SEND_SOLICITED : 0);
        CHECK(ibv_post_send(a, &swr, &sbad) == 0);
        wc = poll_one(scq);
        CHECK(wc.wr_id == 5 + (uint64_t)solicited && wc.status == IBV_WC_SUCCESS);
        wc = poll_one(ibv_cq_ex_to_cq(rcq));
        CHECK(wc.wr_id == 80 + (uint64_t)solicited && wc.opcode == IBV_WC_RECV);
        CHECK(poll(&pfd, 1, solicited ? 5000 : 50) == solicited);
    }
    CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == ibv_cq_ex_to_cq(rcq));
    ibv_ack_cq_events(ecq, 1);
    CHECK(rcq->comp_events_completed == 2);
    swr.opcode = IBV_WR_RDMA_WRITE;
    swr.send_flags = IBV_SEND_SIGNALED;
    ss.length = 32;

    /* Deregistered: the same rkey is refused. */
    uint32_t rkey = mdst->rkey;
    CHECK(ibv_dereg_mr(mdst) == 0);
    swr.wr_id = 3;
    swr.wr.rdma.remote_addr = (uintptr_t)&dst[40];
    swr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(a, &swr, &sbad) == 0);
    wc = poll_one(scq);
    CHECK(wc.wr_id == 3 && wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(dst[40] == 0);

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
    CHECK(ibv_resize_cq(scq, 64) == 0 && scq->cqe == 64);
    CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    CHECK(ibv_dereg_mr(msrc) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);
    ibv_free_device_list(list);
    printf("memcq probe ok\n");
    return 0;
}
