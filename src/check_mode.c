/*
 * check_mode.c: tpinfer --check. Three phases, every rank in each:
 *   1. what this rank runs on (host, node-local rank, GPU, PCI bus, CUDA/NCCL versions),
 *      all-gathered so every rank knows the whole job and picks the same backend;
 *   2. this rank's row of its TP group's peer-access (P2P) matrix, asked of CUDA only for
 *      peers on the same host, all-gathered too; rank 0 prints the ranks, the matrices and
 *      the warnings (a TP group across hosts, a pair of GPUs without P2P);
 *   3. the all-reduce sweep, 4 KiB doubling to --check-max-bytes, in every TP group at
 *      once (as during inference): NCCL on device buffers (cuda) or MPI on host buffers
 *      (cpu). Each rank times its own loop; rank 0 prints per group the slowest rank's
 *      mean time per call, algbw, busbw and the wrong elements, as all_reduce_perf does.
 *      On cuda the NCCL communicator sends the small sizes through its custom one-shot
 *      all-reduce over CUDA IPC when the group has it (cuda/custom_ar.cu): each table
 *      says up to which size (TPINFER_CUSTOM_AR=0 measures NCCL alone).
 * Phases 1 and 2 end in an agreement (a failure is reported, the job ends cleanly); a
 * failure inside the sweep may leave peers waiting in a collective, so it aborts.
 */
#include "config.h"

#include "check_mode.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#ifdef HAVE_NCCL
#include "../cuda/comm_nccl.h" /* the custom all-reduce's state; no CUDA or NCCL header in it */
#endif

#define MIN_BYTES 4096
#define MAX_SIZES 24
#define MATRIX_MAX_TP 16 /* wider groups get a count instead of a matrix */

/* What one rank runs on; all-gathered as int32 words. */
typedef struct rank_rec {
    char host[64];
    char gpu[64];
    char pci[32];
    int64_t total_bytes;
    int32_t rank, dp_rank, pp_rank, tp_rank, local_rank, local_size;
    int32_t gpu_index, gpu_count, cuda_rt, cuda_drv, nccl, pad;
} rank_rec;
_Static_assert(sizeof(rank_rec) % 4 == 0, "rank_rec travels as int32 words");

/* A cell of the P2P matrix: > 0 is peer access with performance rank cell - 1. */
enum { P2P_SELF = -4, P2P_OTHER_NODE = -3, P2P_CPU = -2, P2P_UNKNOWN = -1, P2P_NONE = 0 };

/* One size of one rank's sweep. */
typedef struct size_res {
    double seconds; /* the timed loop */
    int64_t wrong;
    int32_t iters, pad;
} size_res;
_Static_assert(sizeof(size_res) % 4 == 0, "size_res travels as int32 words");


/* CUDA's 12040 -> "12.4"; 0 -> "none". */
static void cuda_version_str(int v, char *out, size_t cap)
{
    if (v <= 0) snprintf(out, cap, "none");
    else snprintf(out, cap, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* NCCL's 22803 -> "2.28.3" (codes before 2.9 were major*1000 + minor*100 + patch). */
static void nccl_version_str(int v, char *out, size_t cap)
{
    if (v <= 0) snprintf(out, cap, "none");
    else if (v >= 10000) snprintf(out, cap, "%d.%d.%d", v / 10000, (v % 10000) / 100, v % 100);
    else snprintf(out, cap, "%d.%d.%d", v / 1000, (v % 1000) / 100, v % 100);
}

static tp_status fill_rec(const tp_grid *g, const tp_device_info *dev, rank_rec *r)
{
    memset(r, 0, sizeof *r);
    if (gethostname(r->host, sizeof r->host - 1) != 0) snprintf(r->host, sizeof r->host, "?");
    r->host[sizeof r->host - 1] = '\0';
    r->rank = g->rank;
    r->dp_rank = g->dp_rank;
    r->pp_rank = g->pp_rank;
    r->tp_rank = g->tp_rank;
    r->local_rank = g->local_rank;
    r->local_size = g->local_size;
    r->gpu_count = dev->count;
    r->gpu_index = dev->count > 0 ? dev->index : -1;
    if (r->gpu_index >= 0) {
        /* names longer than the record keeps are cut (no NVIDIA name comes close) */
        memcpy(r->gpu, dev->name, sizeof r->gpu - 1);
        memcpy(r->pci, dev->pci_bus, sizeof r->pci - 1);
        r->total_bytes = dev->total_bytes;
    }
    int rt = 0, drv = 0, nccl = 0;
    TP_CHECK(tp_device_versions(&rt, &drv, &nccl));
    r->cuda_rt = rt;
    r->cuda_drv = drv;
    r->nccl = nccl;
    return TP_OK;
}

/* This rank's row of its TP group's matrix: cell j is what it knows of tp rank j. */
static tp_status p2p_row(const tp_grid *g, const rank_rec *all, int32_t *row)
{
    const rank_rec *me = &all[g->rank];
    int base = g->rank - g->tp_rank;
    for (int j = 0; j < g->tp; j++) {
        const rank_rec *peer = &all[base + j];
        if (j == g->tp_rank) row[j] = P2P_SELF;
        else if (strcmp(me->host, peer->host)) row[j] = P2P_OTHER_NODE;
        else if (me->gpu_index < 0 || peer->gpu_index < 0) row[j] = P2P_CPU;
        else {
            int can = 0, perf = -1;
            TP_CHECK(tp_device_p2p(me->gpu_index, peer->gpu_index, &can, &perf));
            row[j] = can < 0 ? P2P_UNKNOWN : can == 0 ? P2P_NONE : 1 + (perf < 0 ? 0 : perf);
        }
    }
    return TP_OK;
}

static void print_rank(FILE *out, const tp_grid *g, const rank_rec *r)
{
    fprintf(out, "rank %d: dp %d/%d  pp %d/%d  tp %d/%d  host %s  node-local %d/%d", r->rank,
            r->dp_rank, g->dp, r->pp_rank, g->pp, r->tp_rank, g->tp, r->host, r->local_rank,
            r->local_size);
    if (r->gpu_index >= 0) {
        char mem[32];
        tp_format_bytes(r->total_bytes, mem, sizeof mem);
        fprintf(out, "  GPU %d/%d %s (%s) %s", r->gpu_index, r->gpu_count, r->gpu, r->pci, mem);
    } else {
        fprintf(out, "  CPU");
    }
    if (r->cuda_rt > 0) {
        char rt[16], drv[16], nccl[16];
        cuda_version_str(r->cuda_rt, rt, sizeof rt);
        cuda_version_str(r->cuda_drv, drv, sizeof drv);
        nccl_version_str(r->nccl, nccl, sizeof nccl);
        fprintf(out, "  CUDA %s driver %s  NCCL %s", rt, drv, nccl);
    }
    fputc('\n', out);
}

static void cell_str(int32_t c, char *s, size_t cap)
{
    switch (c) {
    case P2P_SELF: snprintf(s, cap, "X"); break;
    case P2P_OTHER_NODE: snprintf(s, cap, "NET"); break;
    case P2P_CPU: snprintf(s, cap, "CPU"); break;
    case P2P_UNKNOWN: snprintf(s, cap, "?"); break;
    case P2P_NONE: snprintf(s, cap, "none"); break;
    default: snprintf(s, cap, "P2P/%d", (int)c - 1); break;
    }
}

/* Print each TP group's matrix, then the warnings; returns how many warnings. */
static int print_topology(FILE *out, const tp_grid *g, const rank_rec *all, const int32_t *rows)
{
    int n_groups = g->world / g->tp, any_gpu = 0, warnings = 0;
    for (int r = 0; r < g->world; r++) any_gpu |= all[r].gpu_index >= 0;
    if (g->tp == 1) {
        fprintf(out, "\nP2P: --tp 1: each TP group is one rank, with no peer to check\n");
    } else if (!any_gpu) {
        fprintf(out, "\nP2P: no rank has a GPU: no peer access to check\n");
    } else {
        fprintf(out, "\nP2P matrix of each TP group (row: from tp rank, column: to tp rank):\n"
                     "  P2P/k peer access, CUDA performance rank k (0 is the best link: NVLink where "
                     "there is one)\n"
                     "  none  no peer access: NCCL copies through host memory\n"
                     "  NET   on another host   CPU  a rank without a GPU   ?  GPU not visible here\n");
        for (int grp = 0; grp < n_groups; grp++) {
            const int32_t *m = rows + (size_t)grp * g->tp * g->tp;
            fprintf(out, "TP group %d (dp %d, pp %d):\n", grp, all[grp * g->tp].dp_rank,
                    all[grp * g->tp].pp_rank);
            if (g->tp > MATRIX_MAX_TP) {
                int pairs = 0, p2p = 0;
                for (int i = 0; i < g->tp; i++)
                    for (int j = 0; j < g->tp; j++)
                        if (i != j && m[i * g->tp + j] >= P2P_NONE) {
                            pairs++;
                            p2p += m[i * g->tp + j] > 0;
                        }
                fprintf(out, "  %d of %d ordered pairs of GPUs on one host have P2P\n", p2p, pairs);
                continue;
            }
            fprintf(out, "%8s", "");
            for (int j = 0; j < g->tp; j++) {
                char h[16];
                snprintf(h, sizeof h, "tp%d", j);
                fprintf(out, "%8s", h);
            }
            fputc('\n', out);
            for (int i = 0; i < g->tp; i++) {
                char h[16];
                snprintf(h, sizeof h, "tp%d", i);
                fprintf(out, "%8s", h);
                for (int j = 0; j < g->tp; j++) {
                    char c[16];
                    cell_str(m[i * g->tp + j], c, sizeof c);
                    fprintf(out, "%8s", c);
                }
                const rank_rec *r = &all[grp * g->tp + i];
                if (r->gpu_index >= 0) fprintf(out, "   rank %d GPU %d %s", r->rank, r->gpu_index, r->host);
                else fprintf(out, "   rank %d CPU %s", r->rank, r->host);
                fputc('\n', out);
            }
        }
    }

    int header = 0;
    for (int grp = 0; grp < n_groups; grp++) {
        const rank_rec *gr = &all[grp * g->tp];
        const int32_t *m = rows + (size_t)grp * g->tp * g->tp;
        /* the distinct hosts, in rank order */
        char hosts[512] = "";
        size_t len = 0;
        int n_hosts = 0;
        for (int i = 0; i < g->tp; i++) {
            int seen = 0;
            for (int k = 0; k < i && !seen; k++) seen = !strcmp(gr[k].host, gr[i].host);
            if (seen) continue;
            n_hosts++;
            if (len + 1 < sizeof hosts) {
                int n = snprintf(hosts + len, sizeof hosts - len, "%s%s", n_hosts > 1 ? ", " : "", gr[i].host);
                if (n > 0) len = len + (size_t)n < sizeof hosts ? len + (size_t)n : sizeof hosts - 1;
            }
        }
        if (n_hosts > 1) {
            if (!header++) fputc('\n', out);
            fprintf(out,
                    "warning: TP group %d spans nodes %s: every all-reduce crosses the network; put "
                    "tensor-parallel ranks on one node (mpirun --map-by ppr:N:node, N a multiple of "
                    "--tp %d)\n",
                    grp, hosts, g->tp);
            warnings++;
        }
        for (int i = 0; i < g->tp; i++)
            for (int j = i + 1; j < g->tp; j++) {
                int32_t a = m[i * g->tp + j], b = m[j * g->tp + i];
                if (a == P2P_NONE || b == P2P_NONE) {
                    if (!header++) fputc('\n', out);
                    fprintf(out,
                            "warning: TP group %d: no P2P between GPU %d (rank %d) and GPU %d (rank %d) "
                            "on %s: NCCL goes through host memory; see nvidia-smi topo -m, "
                            "NCCL_P2P_LEVEL, NCCL_P2P_DISABLE\n",
                            grp, gr[i].gpu_index, gr[i].rank, gr[j].gpu_index, gr[j].rank, gr[i].host);
                    warnings++;
                } else if (a == P2P_UNKNOWN || b == P2P_UNKNOWN) {
                    if (!header++) fputc('\n', out);
                    fprintf(out,
                            "warning: TP group %d: ranks %d and %d on %s cannot see each other's GPU "
                            "(CUDA_VISIBLE_DEVICES set per rank?): P2P unknown\n",
                            grp, gr[i].rank, gr[j].rank, gr[i].host);
                    warnings++;
                }
            }
    }
    return warnings;
}

static int iterations(int64_t bytes)
{
    int64_t n = (INT64_C(2) << 30) / bytes;
    return n < 5 ? 5 : n > 200 ? 200 : (int)n;
}

static int warmups(int64_t bytes) { return bytes <= (INT64_C(1) << 20) ? 5 : 2; }

/* The MPI sweep's one size: host buffers, each rank's send holding tp_rank + 1. */
static tp_status cpu_run(tp_comm *c, const float *send, float *recv, size_t count, int warmup,
                         int iters, double *seconds, int64_t *wrong)
{
    for (int i = 0; i < warmup; i++)
        TP_CHECK(tp_comm_all_reduce_sum(c, send, recv, count, TP_DTYPE_F32, NULL));
    TP_CHECK(tp_comm_barrier(c));
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        TP_CHECK(tp_comm_all_reduce_sum(c, send, recv, count, TP_DTYPE_F32, NULL));
    *seconds = MPI_Wtime() - t0;
    for (size_t i = 0; i < count; i++) recv[i] = NAN;
    TP_CHECK(tp_comm_all_reduce_sum(c, send, recv, count, TP_DTYPE_F32, NULL));
    const float want = (float)((double)c->size * (c->size + 1) / 2.0);
    int64_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += recv[i] != want;
    *wrong = bad;
    return TP_OK;
}

/* This rank's sweep over its TP group; res[k] for sizes[k]. */
static tp_status sweep(tp_mpi_world *w, const tp_device_info *dev, int use_cuda,
                       const int64_t *sizes, int n_sizes, size_res *res)
{
    tp_status st = TP_OK;
    size_t max_bytes = (size_t)sizes[n_sizes - 1];
    float *send = NULL, *recv = NULL;
    tp_ar_bench *bench = NULL;
    if (use_cuda) {
        TP_CHECK(tp_device_ar_bench_open(w->tp, dev->index, max_bytes, &bench));
    } else {
        send = malloc(max_bytes);
        recv = malloc(max_bytes);
        if (!send || !recv) {
            st = tp_error(TP_ERR_OOM, "--check: no memory for two all-reduce buffers of %zu bytes "
                          "(lower --check-max-bytes)", max_bytes);
            goto done;
        }
        const float mine = (float)(w->grid.tp_rank + 1);
        for (size_t i = 0; i < max_bytes / sizeof(float); i++) send[i] = mine;
    }
    /* every group starts together, as they run during inference */
    TP_CHECK_GOTO(tp_comm_barrier(w->world), st, done);
    for (int k = 0; k < n_sizes; k++) {
        size_t count = (size_t)sizes[k] / sizeof(float);
        res[k].iters = iterations(sizes[k]);
        if (use_cuda)
            TP_CHECK_GOTO(tp_device_ar_bench_run(bench, count, warmups(sizes[k]), res[k].iters,
                                                 &res[k].seconds, &res[k].wrong), st, done);
        else
            TP_CHECK_GOTO(cpu_run(w->tp, send, recv, count, warmups(sizes[k]), res[k].iters,
                                  &res[k].seconds, &res[k].wrong), st, done);
    }
done:
    tp_device_ar_bench_close(bench);
    free(send);
    free(recv);
    return st;
}

/* The all-reduce path of each rank's sweep: [0] a TP_CUSTOM_AR_ reason (-1: MPI, on host
 * memory), [1] the largest size the custom all-reduce took (0: none). */
static void sweep_path(int use_cuda, int32_t path[2])
{
    path[0] = -1;
    path[1] = 0;
#ifdef HAVE_NCCL
    if (use_cuda) {
        size_t max = 0;
        path[0] = tp_comm_nccl_custom_ar(NULL, &max); /* the sweep's communicator */
        path[1] = max > INT32_MAX ? INT32_MAX : (int32_t)max;
    }
#else
    (void)use_cuda;
#endif
}

/* "  all-reduce: ..." under a group's header; nothing for MPI. */
static void print_path(FILE *out, const int32_t path[2])
{
    if (path[0] < 0) return;
#ifdef HAVE_NCCL
    if (path[1] > 0) {
        char b[32];
        tp_format_bytes(path[1], b, sizeof b);
        fprintf(out, "  all-reduce: custom one-shot (CUDA IPC) up to %s, NCCL above\n", b);
    } else {
        fprintf(out, "  all-reduce: NCCL for every size (no custom one-shot: %s)\n",
                tp_comm_nccl_custom_ar_why(path[0]));
    }
#else
    (void)out;
#endif
}

static int64_t print_sweep(FILE *out, const tp_grid *g, const rank_rec *all, const int64_t *sizes,
                           int n_sizes, const size_res *res, const int32_t *paths, const char *how)
{
    int n_groups = g->world / g->tp;
    int64_t wrong_total = 0;
    double n = g->tp;
    fprintf(out,
            "\nAll-reduce sweep: sum of float32, out of place, every TP group at once; %s.\n"
            "  time: mean per call over the timed iterations, of the group's slowest rank;\n"
            "  algbw = bytes / time; busbw = algbw * 2(n-1)/n with n = %d (nccl-tests' "
            "all_reduce_perf);\n"
            "  #wrong: elements that differ from n(n+1)/2 = %d (each rank adds rank + 1)\n",
            how, g->tp, g->tp * (g->tp + 1) / 2);
    for (int grp = 0; grp < n_groups; grp++) {
        const rank_rec *gr = &all[grp * g->tp];
        fprintf(out, "TP group %d (dp %d, pp %d; world ranks %d-%d):\n", grp, gr->dp_rank,
                gr->pp_rank, grp * g->tp, grp * g->tp + g->tp - 1);
        print_path(out, &paths[(size_t)grp * g->tp * 2]); /* the group agreed: its first rank's */
        fprintf(out, "%12s %10s %6s %6s %11s %12s %12s %8s\n", "size(B)", "count", "type", "iters",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        double small_us = 0, large_bus = 0;
        for (int k = 0; k < n_sizes; k++) {
            double t = 0;
            int64_t wrong = 0;
            int iters = 1;
            for (int i = 0; i < g->tp; i++) {
                const size_res *r = &res[(size_t)(grp * g->tp + i) * MAX_SIZES + k];
                iters = r->iters > 0 ? r->iters : 1;
                double per_call = r->seconds / iters;
                if (per_call > t) t = per_call;
                wrong += r->wrong;
            }
            double algbw = t > 0 ? (double)sizes[k] / t / 1e9 : 0;
            double busbw = algbw * 2.0 * (n - 1) / n;
            if (k == 0) small_us = t * 1e6;
            if (k == n_sizes - 1) large_bus = busbw;
            wrong_total += wrong;
            fprintf(out, "%12" PRId64 " %10" PRId64 " %6s %6d %11.2f %12.2f %12.2f %8" PRId64 "\n",
                    sizes[k], sizes[k] / 4, "float", iters, t * 1e6, algbw, busbw, wrong);
        }
        char big[32];
        tp_format_bytes(sizes[n_sizes - 1], big, sizeof big);
        fprintf(out, "  %.1f us per call at 4 KiB (latency); busbw %.2f GB/s at %s (bandwidth)\n",
                small_us, large_bus, big);
    }
    return wrong_total;
}

tp_status tp_check(const tp_options *o, tp_mpi_world *world, const tp_device_info *dev, FILE *out,
                   int *n_failed, int *must_abort, int64_t *n_wrong)
{
    const tp_grid *g = &world->grid;
    rank_rec mine_rec, *all = NULL;
    int32_t *row = NULL, *rows = NULL;
    size_res *res = NULL, *all_res = NULL;
    int32_t path[2], *all_paths = NULL;
    tp_status st = TP_OK, mine;
    int n_usage = 0;
    *n_failed = 0;
    *must_abort = 0;
    *n_wrong = 0;

    /* 1. what each rank runs on */
    mine = fill_rec(g, dev, &mine_rec);
    TP_CHECK_GOTO(tp_mpi_agree(world->world, mine, n_failed, &n_usage), st, done);
    if (*n_failed) {
        st = mine != TP_OK ? mine : TP_ERR_UNAVAILABLE;
        goto done;
    }
    all = calloc((size_t)g->world, sizeof *all);
    row = calloc((size_t)g->tp, sizeof *row);
    rows = calloc((size_t)g->world * (size_t)g->tp, sizeof *rows);
    res = calloc(MAX_SIZES, sizeof *res);
    all_res = calloc((size_t)g->world * MAX_SIZES, sizeof *all_res);
    all_paths = calloc((size_t)g->world * 2, sizeof *all_paths);
    mine = all && row && rows && res && all_res && all_paths ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    TP_CHECK_GOTO(tp_mpi_agree(world->world, mine, n_failed, &n_usage), st, done);
    if (*n_failed) {
        st = mine != TP_OK ? mine : TP_ERR_OOM;
        goto done;
    }
    TP_CHECK_GOTO(tp_comm_all_gather(world->world, &mine_rec, all, sizeof mine_rec / 4, TP_DTYPE_I32, NULL),
                  st, done);

    /* the backend of the sweep: the same choice on every rank */
    int all_gpu = 1, any_gpu = 0, all_nccl = 1, use_cuda = 0;
    for (int r = 0; r < g->world; r++) {
        all_gpu &= all[r].gpu_index >= 0;
        any_gpu |= all[r].gpu_index >= 0;
        all_nccl &= all[r].nccl > 0;
    }
    mine = TP_OK;
    if (!strcmp(o->backend, "cuda")) {
        use_cuda = 1;
        if (mine_rec.gpu_index < 0)
            mine = tp_error(TP_ERR_UNAVAILABLE,
                            "--check --backend cuda: rank %d sees no GPU (or this tpinfer was built "
                            "without CUDA); use --backend cpu", g->rank);
        else if (g->tp > 1 && mine_rec.nccl <= 0)
            mine = tp_error(TP_ERR_UNAVAILABLE,
                            "--check --backend cuda: this tpinfer was built without NCCL, which the "
                            "GPU all-reduce needs; use --backend cpu");
    } else if (!strcmp(o->backend, "auto")) {
        use_cuda = all_gpu && all_nccl;
    }

    /* 2. the P2P rows */
    if (mine == TP_OK) mine = p2p_row(g, all, row);
    TP_CHECK_GOTO(tp_mpi_agree(world->world, mine, n_failed, &n_usage), st, done);
    if (*n_failed) {
        st = mine != TP_OK ? mine : TP_ERR_UNAVAILABLE;
        goto done;
    }
    TP_CHECK_GOTO(tp_comm_all_gather(world->world, row, rows, (size_t)g->tp, TP_DTYPE_I32, NULL), st, done);

    int64_t sizes[MAX_SIZES];
    int n_sizes = 0;
    for (int64_t b = MIN_BYTES; b <= o->check_max_bytes && n_sizes < MAX_SIZES; b *= 2) sizes[n_sizes++] = b;
    if (n_sizes == 0) sizes[n_sizes++] = MIN_BYTES; /* options.c allows no less */

    char how[160];
    if (use_cuda) {
        char v[16];
        nccl_version_str(mine_rec.nccl, v, sizeof v);
        snprintf(how, sizeof how, "NCCL %s on GPU memory (small sizes: see each group's all-reduce line)", v);
    } else {
        snprintf(how, sizeof how, "MPI on host memory%s",
                 !strcmp(o->backend, "cpu") ? " (--backend cpu)"
                 : !any_gpu                 ? ": no rank has a GPU"
                 : !all_gpu                 ? ": not every rank has a GPU"
                                            : ": this build has no NCCL");
    }

    int warnings = 0;
    if (g->rank == 0) {
        int n_hosts = 0;
        for (int r = 0; r < g->world; r++) {
            int seen = 0;
            for (int k = 0; k < r && !seen; k++) seen = !strcmp(all[k].host, all[r].host);
            n_hosts += !seen;
        }
        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int lib_len = 0;
        if (MPI_Get_library_version(lib, &lib_len) != MPI_SUCCESS) snprintf(lib, sizeof lib, "?");
        lib[strcspn(lib, ",\n")] = '\0';
        fprintf(out, "tpinfer --check: %d rank(s) on %d host(s); world %d = dp %d x pp %d x tp %d; %s\n",
                g->world, n_hosts, g->world, g->dp, g->pp, g->tp, lib);
        for (int r = 0; r < g->world; r++) print_rank(out, g, &all[r]);
        warnings = print_topology(out, g, all, rows);
        if (g->tp == 1)
            fprintf(out, "\nAll-reduce sweep skipped: with --tp 1 each TP group is one rank and makes no "
                         "all-reduce; give --tp N to measure N ranks\n");
        fflush(out);
    }

    /* 3. the sweep */
    if (g->tp > 1) {
        st = sweep(world, dev, use_cuda, sizes, n_sizes, res);
        if (st != TP_OK) {
            *must_abort = 1; /* peers may wait in a collective this rank left */
            *n_failed = 1;
            goto done;
        }
        TP_CHECK_GOTO(tp_comm_all_gather(world->world, res, all_res, MAX_SIZES * sizeof *res / 4,
                                         TP_DTYPE_I32, NULL), st, done);
        sweep_path(use_cuda, path);
        TP_CHECK_GOTO(tp_comm_all_gather(world->world, path, all_paths, 2, TP_DTYPE_I32, NULL), st, done);
        for (size_t i = 0; i < (size_t)g->world * MAX_SIZES; i++) *n_wrong += all_res[i].wrong;
        if (g->rank == 0) print_sweep(out, g, all, sizes, n_sizes, all_res, all_paths, how);
    }
    if (g->rank == 0) {
        if (*n_wrong)
            fprintf(out, "\ncheck: FAILED: %" PRId64 " wrong element(s) in the all-reduce results "
                         "(#wrong above)%s\n",
                    *n_wrong, warnings ? "; and see the warnings" : "");
        else if (warnings)
            fprintf(out, "\ncheck: all-reduce results correct; %d warning(s) above\n", warnings);
        else
            fprintf(out, "\ncheck: OK\n");
        fflush(out);
    }
done:
    free(all_paths);
    free(all_res);
    free(res);
    free(rows);
    free(row);
    free(all);
    return st;
}
