/*
 * comm_nccl.c: tp_comm over NCCL (the documented MPI bootstrap: rank 0's ncclUniqueId
 * goes out through the bootstrap comm, then ncclCommInitRank). Every ncclResult_t is
 * checked and reported with ncclGetErrorString and ncclGetLastError; after each
 * operation ncclCommGetAsyncError is polled (cheap), so a network or peer failure
 * surfaces as TP_ERR_NCCL at the next operation instead of a silent hang later. After
 * any failure the communicator is marked failed: further operations refuse at once, and
 * destroy aborts it (ncclCommDestroy could block on peers that are gone).
 *
 * Small all-reduces take the custom one-shot kernel over CUDA IPC when the group has it
 * (cuda/custom_ar.cu, set up here after NCCL's warm-up); the rest, and every other
 * collective, are NCCL's. The choice depends on the byte count and dtype only, so every
 * rank of the group takes the same path for the same call.
 */
#include "comm_nccl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
/* nccl.h declares a few functions without prototypes (ncclGroupStart(), ...) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "cuda_check.h"
#include "custom_ar.h"

#define ID_WORDS ((int)(sizeof(ncclUniqueId) / sizeof(int32_t)))
_Static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0, "ncclUniqueId is whole int32 words");

typedef struct nccl_ctx {
    ncclComm_t comm;
    tp_comm *bootstrap; /* borrowed: the host barrier */
    int device;
    int failed;         /* an error or an abort happened: refuse, and abort on destroy */
    tp_car *car;        /* the custom all-reduce for small messages, NULL when none */
    int car_reason;     /* TP_CUSTOM_AR_* */
    char name[40];
} nccl_ctx;

/* The custom all-reduce of the communicator this process made last (tpinfer --check). */
static int last_car_reason = TP_CUSTOM_AR_NONE;
static size_t last_car_max = 0;

static const struct tp_comm_ops nccl_ops;

// ----------------------------------------------------------------------------
// errors

static tp_status nccl_fail(nccl_ctx *ctx, const char *call, ncclResult_t r)
{
    ctx->failed = 1;
    const char *last = ctx->comm ? ncclGetLastError(ctx->comm) : ncclGetLastError(NULL);
    return tp_error(TP_ERR_NCCL, "%s: %s failed: %s%s%s", ctx->name, call, ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

#define TP_NCCL_CHECK(ctx, call)                                      \
    do {                                                              \
        ncclResult_t tp_nccl_r_ = (call);                             \
        if (tp_nccl_r_ != ncclSuccess) return nccl_fail((ctx), #call, tp_nccl_r_); \
    } while (0)

/* The errors NCCL found in the background (a peer gone, a network failure). */
static tp_status async_check(nccl_ctx *ctx, const char *op)
{
    ncclResult_t async = ncclSuccess;
    TP_NCCL_CHECK(ctx, ncclCommGetAsyncError(ctx->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
        ctx->failed = 1;
        const char *last = ncclGetLastError(ctx->comm);
        return tp_error(TP_ERR_NCCL, "%s: %s: asynchronous NCCL error: %s%s%s", ctx->name, op,
                        ncclGetErrorString(async), last && *last ? ": " : "", last ? last : "");
    }
    return TP_OK;
}

/* Refuse on a failed comm; map the dtype. */
static tp_status begin(nccl_ctx *ctx, const char *op, tp_dtype dt, ncclDataType_t *type)
{
    if (ctx->failed || !ctx->comm)
        return tp_error(TP_ERR_NCCL, "%s: %s on a communicator that failed or was aborted earlier",
                        ctx->name, op);
    switch (dt) {
    case TP_DTYPE_F32: *type = ncclFloat32; return TP_OK;
    case TP_DTYPE_F16: *type = ncclFloat16; return TP_OK;
    case TP_DTYPE_BF16: *type = ncclBfloat16; return TP_OK;
    case TP_DTYPE_I32: *type = ncclInt32; return TP_OK;
    default:
        return tp_error(TP_ERR_INVALID_ARG, "%s: %s of dtype %s, which NCCL is not given", ctx->name, op,
                        tp_dtype_name(dt));
    }
}

static nccl_ctx *ctx_of(tp_comm *c) { return (nccl_ctx *)c->ctx; }

// ----------------------------------------------------------------------------
// operations

static tp_status nccl_all_reduce_sum(tp_comm *c, const void *send, void *recv, size_t count, tp_dtype dt,
                                     void *stream)
{
    nccl_ctx *ctx = ctx_of(c);
    ncclDataType_t t;
    TP_CHECK(begin(ctx, "all-reduce", dt, &t));
    if (tp_car_takes(ctx->car, count, dt)) {
        tp_status st = tp_car_all_reduce(ctx->car, send, recv, count, dt, stream);
        if (st != TP_OK) {
            ctx->failed = 1; /* peers may be waiting at the barrier of a call this rank never made */
            return st;
        }
    } else {
        TP_NCCL_CHECK(ctx, ncclAllReduce(send, recv, count, t, ncclSum, ctx->comm, (cudaStream_t)stream));
    }
    return async_check(ctx, "all-reduce");
}

static tp_status nccl_all_gather(tp_comm *c, const void *send, void *recv, size_t count, tp_dtype dt,
                                 void *stream)
{
    nccl_ctx *ctx = ctx_of(c);
    ncclDataType_t t;
    TP_CHECK(begin(ctx, "all-gather", dt, &t));
    TP_NCCL_CHECK(ctx, ncclAllGather(send, recv, count, t, ctx->comm, (cudaStream_t)stream));
    return async_check(ctx, "all-gather");
}

static tp_status nccl_send(tp_comm *c, const void *buf, size_t count, tp_dtype dt, int peer, void *stream)
{
    nccl_ctx *ctx = ctx_of(c);
    ncclDataType_t t;
    TP_CHECK(begin(ctx, "send", dt, &t));
    TP_NCCL_CHECK(ctx, ncclSend(buf, count, t, peer, ctx->comm, (cudaStream_t)stream));
    return async_check(ctx, "send");
}

static tp_status nccl_recv(tp_comm *c, void *buf, size_t count, tp_dtype dt, int peer, void *stream)
{
    nccl_ctx *ctx = ctx_of(c);
    ncclDataType_t t;
    TP_CHECK(begin(ctx, "recv", dt, &t));
    TP_NCCL_CHECK(ctx, ncclRecv(buf, count, t, peer, ctx->comm, (cudaStream_t)stream));
    return async_check(ctx, "recv");
}

static tp_status nccl_broadcast(tp_comm *c, void *buf, size_t count, tp_dtype dt, int root, void *stream)
{
    nccl_ctx *ctx = ctx_of(c);
    ncclDataType_t t;
    TP_CHECK(begin(ctx, "broadcast", dt, &t));
    TP_NCCL_CHECK(ctx, ncclBroadcast(buf, buf, count, t, root, ctx->comm, (cudaStream_t)stream));
    return async_check(ctx, "broadcast");
}

/* Host barrier through the bootstrap comm: it orders hosts, not streams. */
static tp_status nccl_barrier(tp_comm *c)
{
    return tp_comm_barrier(ctx_of(c)->bootstrap);
}

static void nccl_destroy(tp_comm *c)
{
    if (!c) return;
    nccl_ctx *ctx = ctx_of(c);
    if (ctx && ctx->failed) tp_car_abort(ctx->car); /* kernels waiting at its barrier give up */
    if (ctx && ctx->comm) {
        if (ctx->failed || ncclCommDestroy(ctx->comm) != ncclSuccess) ncclCommAbort(ctx->comm);
    }
    if (ctx) tp_car_destroy(ctx->car);
    free(ctx);
    free(c);
}

static const struct tp_comm_ops nccl_ops = {
    /* .all_reduce_sum = */ nccl_all_reduce_sum,
    /* .all_gather     = */ nccl_all_gather,
    /* .send           = */ nccl_send,
    /* .recv           = */ nccl_recv,
    /* .broadcast      = */ nccl_broadcast,
    /* .barrier        = */ nccl_barrier,
    /* .destroy        = */ nccl_destroy,
};

void tp_comm_nccl_abort(tp_comm *c)
{
    if (!c || c->ops != &nccl_ops) return;
    nccl_ctx *ctx = ctx_of(c);
    tp_car_abort(ctx->car);
    if (ctx->comm) ncclCommAbort(ctx->comm);
    ctx->comm = NULL;
    ctx->failed = 1;
}

int tp_comm_nccl_custom_ar(const tp_comm *c, size_t *max_bytes)
{
    int reason = last_car_reason;
    size_t max = last_car_max;
    if (c) {
        if (c->ops != &nccl_ops) {
            reason = TP_CUSTOM_AR_NONE;
            max = 0;
        } else {
            const nccl_ctx *ctx = (const nccl_ctx *)c->ctx;
            reason = ctx->car_reason;
            max = tp_car_max_bytes(ctx->car);
        }
    }
    if (max_bytes) *max_bytes = reason == TP_CUSTOM_AR_ON ? max : 0;
    return reason;
}

const char *tp_comm_nccl_custom_ar_why(int reason)
{
    switch (reason) {
    case TP_CUSTOM_AR_ON: return "on";
    case TP_CUSTOM_AR_OFF_ENV: return "TPINFER_CUSTOM_AR=0";
    case TP_CUSTOM_AR_GROUP_SIZE: return "a group of 1 or more than 8 ranks";
    case TP_CUSTOM_AR_HOSTS: return "ranks on several hosts";
    case TP_CUSTOM_AR_NO_P2P: return "no peer access between two of the GPUs";
    case TP_CUSTOM_AR_SETUP: return "its set-up failed (CUDA IPC)";
    default: return "not an NCCL communicator";
    }
}

// ----------------------------------------------------------------------------
// creation

/* A send from every rank to the next and a receive from the previous, one float each:
 * NCCL connects peer-to-peer channels at their first use (about a second for a pipeline's
 * first step on two H200s); the pipeline's own sends then find them ready. */
tp_status tp_comm_nccl_connect_next(tp_comm *c)
{
    nccl_ctx *ctx = ctx_of(c);
    if (c->size < 2) return TP_OK;
    float *buf = NULL;
    if (cudaMalloc((void **)&buf, 2 * sizeof *buf) != cudaSuccess) {
        (void)cudaGetLastError();
        return tp_error(TP_ERR_OOM, "%s: no GPU memory for the warm-up send", ctx->name);
    }
    tp_status st = TP_OK;
    (void)cudaMemset(buf, 0, 2 * sizeof *buf);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess && c->rank + 1 < c->size) r = ncclSend(buf, 1, ncclFloat32, c->rank + 1, ctx->comm, NULL);
    if (r == ncclSuccess && c->rank > 0) r = ncclRecv(buf + 1, 1, ncclFloat32, c->rank - 1, ctx->comm, NULL);
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess) st = nccl_fail(ctx, "the warm-up send/recv", r);
    else if (cudaDeviceSynchronize() != cudaSuccess) {
        (void)cudaGetLastError();
        st = tp_error(TP_ERR_NCCL, "%s: the warm-up send/recv failed", ctx->name);
    }
    cudaFree(buf);
    return st;
}

tp_status tp_comm_nccl_create(tp_comm *bootstrap, int device, const char *name, tp_comm **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "tp_comm_nccl_create: out is NULL");
    *out = NULL;
    if (!bootstrap) return tp_error(TP_ERR_INVALID_ARG, "tp_comm_nccl_create: no bootstrap comm");
    if (!name) name = "?";
    TP_CUDA_CHECK(cudaSetDevice(device));

    /* Rank 0's id, behind a status word: if ncclGetUniqueId fails there, every rank
     * returns the error instead of waiting in ncclCommInitRank for an id that never came. */
    ncclUniqueId id;
    int32_t msg[1 + ID_WORDS];
    memset(&id, 0, sizeof id);
    memset(msg, 0, sizeof msg);
    if (bootstrap->rank == 0) {
        msg[0] = (int32_t)ncclGetUniqueId(&id);
        memcpy(msg + 1, &id, sizeof id);
    }
    TP_CHECK(tp_comm_broadcast(bootstrap, msg, (size_t)(1 + ID_WORDS), TP_DTYPE_I32, 0, NULL));
    if (msg[0] != (int32_t)ncclSuccess)
        return tp_error(TP_ERR_NCCL, "nccl:%s: ncclGetUniqueId failed on rank 0: %s", name,
                        ncclGetErrorString((ncclResult_t)msg[0]));
    memcpy(&id, msg + 1, sizeof id);

    tp_comm *c = calloc(1, sizeof *c);
    nccl_ctx *ctx = calloc(1, sizeof *ctx);
    if (!c || !ctx) {
        free(c);
        free(ctx);
        return tp_error(TP_ERR_OOM, "out of memory creating communicator nccl:%s", name);
    }
    snprintf(ctx->name, sizeof ctx->name, "nccl:%s", name);
    ctx->bootstrap = bootstrap;
    ctx->device = device;
    ctx->car_reason = TP_CUSTOM_AR_NONE;
    c->ops = &nccl_ops;
    c->ctx = ctx;
    c->rank = bootstrap->rank;
    c->size = bootstrap->size;
    c->name = ctx->name;
    ncclResult_t r = ncclCommInitRank(&ctx->comm, bootstrap->size, id, bootstrap->rank);
    if (r != ncclSuccess) {
        ctx->comm = NULL;
        tp_status st = nccl_fail(ctx, "ncclCommInitRank", r);
        nccl_destroy(c);
        return st;
    }
    /* NCCL connects its peers at the first collective, about a second on two H200s: do it
     * here, at start-up, not inside the first step (where it was the first token's wait) */
    if (bootstrap->size > 1) {
        float *one = NULL;
        tp_status st = TP_OK;
        if (cudaMalloc((void **)&one, sizeof *one) != cudaSuccess) {
            (void)cudaGetLastError();
            st = tp_error(TP_ERR_OOM, "nccl:%s: no GPU memory for the warm-up all-reduce", name);
        } else {
            (void)cudaMemset(one, 0, sizeof *one);
            st = nccl_all_reduce_sum(c, one, one, 1, TP_DTYPE_F32, NULL);
            if (st == TP_OK && cudaDeviceSynchronize() != cudaSuccess) {
                (void)cudaGetLastError();
                st = tp_error(TP_ERR_NCCL, "nccl:%s: the warm-up all-reduce failed", name);
            }
            cudaFree(one);
        }
        if (st != TP_OK) {
            nccl_destroy(c);
            return st;
        }
    }
    /* the custom all-reduce: NULL and a reason when unavailable (not an error); only a
     * failed bootstrap collective is one */
    tp_status st = tp_car_create(bootstrap, device, ctx->name, &ctx->car, &ctx->car_reason);
    if (st != TP_OK) {
        nccl_destroy(c);
        return st;
    }
    last_car_reason = ctx->car_reason;
    last_car_max = tp_car_max_bytes(ctx->car);
    *out = c;
    return TP_OK;
}
