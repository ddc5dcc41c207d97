/*
 * dry_run.c: the --dry-run report. Each rank validates what it would load; the reports
 * travel to rank 0 with one all-gather so the output is in rank order, not interleaved.
 */
#include "dry_run.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "model.h"
#include "util.h"

#define REPORT_CAP 8192 /* bytes of text per rank; a multiple of 4 (sent as int32) */

static void appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}


static tp_status check_slice(const tp_weights *w, const tp_weight_slice *s, const tp_grid *g,
                             int64_t *bytes)
{
    if (!tp_weights_find(w, s->name))
        return tp_error(TP_ERR_FORMAT,
                        "tensor %s, which rank %d (tp %d, pp %d) needs, is not in the model's "
                        "safetensors files",
                        s->name, g->rank, g->tp_rank, g->pp_rank);
    tp_dtype dt;
    TP_CHECK(tp_weights_check(w, s->name, s->full_rows, s->full_cols, &dt));
    *bytes = s->nrows * s->ncols * (int64_t)tp_dtype_size(dt);
    return TP_OK;
}

/* The plan lists the tied embedding twice (embedding and LM head); one rank holding
 * both reads it once. */
static int same_as_earlier(const tp_weight_slice *s, int i)
{
    for (int j = 0; j < i; j++)
        if (!strcmp(s[j].name, s[i].name) && s[j].row0 == s[i].row0 && s[j].nrows == s[i].nrows &&
            s[j].col0 == s[i].col0 && s[j].ncols == s[i].ncols)
            return 1;
    return 0;
}

/* The KV cache's dtype: the CPU backend computes and caches in float32 whatever the model's
 * (backend.c), a GPU in the compute dtype (the model's torch_dtype, or --dtype). */
static tp_dtype kv_dtype(const tp_options *o, const tp_model_config *cfg, const tp_device_info *dev)
{
    if (!strcmp(o->backend, "cpu") || (!strcmp(o->backend, "auto") && dev->count == 0)) return TP_DTYPE_F32;
    tp_dtype dt = cfg->torch_dtype;
    if (strcmp(o->dtype, "auto")) tp_dtype_from_name(o->dtype, &dt);
    return dt;
}

tp_status tp_dry_run_rank(const tp_options *o, const tp_grid *g, const tp_model_config *cfg,
                          const tp_weights *w, const tp_device_info *dev, tp_rank_report *rep,
                          char *text, size_t cap)
{
    memset(rep, 0, sizeof *rep);
    tp_shard_plan plan;
    TP_CHECK(tp_shard_plan_make(cfg, g->tp, g->pp, g->tp_rank, g->pp_rank, &plan));
    tp_weight_slice *slices = NULL;
    int n = 0;
    TP_CHECK(tp_shard_plan_weights(cfg, &plan, &slices, &n));
    tp_status st = TP_OK;
    for (int i = 0; i < n; i++) {
        if (same_as_earlier(slices, i)) continue; /* tied embedding on a one-stage pipeline */
        int64_t b = 0;
        TP_CHECK_GOTO(check_slice(w, &slices[i], g, &b), st, out);
        rep->weight_bytes += b;
        rep->n_tensors++;
    }
    tp_dtype dt = kv_dtype(o, cfg, dev);
    rep->kv_bytes_per_token = tp_shard_plan_kv_bytes_per_token(cfg, &plan, (int64_t)tp_dtype_size(dt));

    char wb[32], kvb[32];
    tp_format_bytes(rep->weight_bytes, wb, sizeof wb);
    tp_format_bytes(rep->kv_bytes_per_token, kvb, sizeof kvb);
    size_t len = strlen(text);
    appendf(text, cap, &len, "rank %d: dp %d/%d  pp %d/%d  tp %d/%d  node-local %d/%d", g->rank,
            g->dp_rank, g->dp, g->pp_rank, g->pp, g->tp_rank, g->tp, g->local_rank, g->local_size);
    if (dev->count > 0)
        appendf(text, cap, &len, "  GPU %d %s (%s)\n", dev->index, dev->name, dev->pci_bus);
    else
        appendf(text, cap, &len, "  CPU\n");
    int64_t sliding = 0;
    for (int64_t l = plan.layers.begin; l < plan.layers.end; l++) sliding += cfg->sliding_layer[l];
    appendf(text, cap, &len, "  layers      [%" PRId64 ", %" PRId64 ")%s%s", plan.layers.begin,
            plan.layers.end, plan.has_embedding ? "  + embedding" : "",
            plan.has_lm_head ? "  + final norm, LM head" : "");
    if (sliding > 0)
        appendf(text, cap, &len, "  (%" PRId64 " of them a sliding window of %" PRId64 ")", sliding,
                cfg->sliding_window);
    appendf(text, cap, &len, "\n");
    appendf(text, cap, &len,
            "  query heads [%" PRId64 ", %" PRId64 ")  KV heads [%" PRId64 ", %" PRId64
            ")%s  MLP [%" PRId64 ", %" PRId64 ")  vocab [%" PRId64 ", %" PRId64 ")\n",
            plan.q_heads.begin, plan.q_heads.end, plan.kv_heads.begin, plan.kv_heads.end,
            plan.kv_replicas > 1 ? " (replicated)" : "", plan.mlp.begin, plan.mlp.end,
            plan.vocab.begin, plan.vocab.end);
    appendf(text, cap, &len, "  weights     %" PRId64 " slices, %s (%" PRId64 " bytes)\n",
            rep->n_tensors, wb, rep->weight_bytes);
    appendf(text, cap, &len, "  KV cache    %s per token (%s)\n", kvb, tp_dtype_name(dt));
out:
    free(slices);
    return st;
}

static void print_totals(FILE *out, const tp_options *o, const tp_grid *g,
                         const tp_model_config *cfg, const tp_weights *w,
                         const tp_rank_report *all, const tp_device_info *dev)
{
    int64_t total = 0, kv = 0, file_bytes = 0;
    for (int r = 0; r < g->world; r++) total += all[r].weight_bytes;
    for (int r = 0; r < g->tp * g->pp; r++) kv += all[r].kv_bytes_per_token; /* replica 0 */
    for (size_t i = 0; i < w->n_refs; i++)
        file_bytes += (int64_t)(w->refs[i].tensor->end - w->refs[i].tensor->begin);
    int64_t ctx = o->max_model_len ? o->max_model_len : cfg->max_position_embeddings;
    char tb[32], fb[32], kb[32], kf[32];
    tp_format_bytes(total, tb, sizeof tb);
    tp_format_bytes(file_bytes, fb, sizeof fb);
    tp_format_bytes(kv, kb, sizeof kb);
    /* the engine's default where no --max-num-seqs is given: on a large GPU at most 1024 (fewer
     * where the KV cache holds fewer, which only the run knows) */
    const int up_to = !o->max_num_seqs && strcmp(o->backend, "cpu") && tp_device_large(dev);
    int64_t seqs = o->max_num_seqs ? o->max_num_seqs : up_to ? 1024 : 256;
    /* where every layer slides, a sequence holds about its window's blocks (the scheduler) */
    const int64_t window = tp_model_config_window_of_all(cfg);
    const int64_t held_tokens = window > 0 && window < ctx ? window : ctx;
    char held[128] = "";
    if (held_tokens < ctx)
        snprintf(held, sizeof held, " (each holding about the %" PRId64 " tokens of its sliding window)", window);
    else if (cfg->sliding_window > 0 && cfg->sliding_window < ctx) /* some layers slide, not all */
        snprintf(held, sizeof held, " (whole contexts in every layer: a sliding layer gives blocks back only where all do)");
    tp_format_bytes(kv * held_tokens * seqs, kf, sizeof kf);
    char described[320];
    tp_model_config_describe(cfg, described, sizeof described);
    fprintf(out, "total: %s %s, %s, world %d = dp %d x pp %d x tp %d\n", tp_model_config_arch_name(cfg), o->model,
            described, g->world, g->dp, g->pp, g->tp);
    fprintf(out, "  weights read by all ranks: %s (%" PRId64 " bytes); the files hold %s in %zu tensors, %zu file(s)\n",
            tb, total, fb, w->n_refs, w->n_shards);
    fprintf(out, "  KV cache per token per replica: %s; for --max-num-seqs %s%" PRId64
            " x --max-model-len %" PRId64 "%s: %s\n",
            kb, up_to ? "(by default at most) " : "", seqs, ctx, held, kf);
    fprintf(out, "  no weight data was read (--dry-run)\n");
}

tp_status tp_dry_run(const tp_options *o, tp_mpi_world *world, const tp_device_info *dev,
                     FILE *out, int *n_failed)
{
    const tp_grid *g = &world->grid;
    tp_model_config cfg;
    tp_weights w;
    memset(&w, 0, sizeof w);
    char *text = calloc(1, REPORT_CAP);
    char *all_text = NULL;
    tp_rank_report rep, *all = NULL;
    tp_status st = TP_OK, mine = TP_OK;
    if (!text) return tp_error(TP_ERR_OOM, "out of memory");

    mine = tp_model_config_load(o->model, &cfg);
    if (mine == TP_OK) mine = tp_shard_plan_validate(&cfg, g->tp, g->pp);
    if (mine == TP_OK && o->max_model_len > cfg.max_position_embeddings)
        mine = tp_error(TP_ERR_INVALID_ARG,
                        "--max-model-len %" PRId64 " exceeds the model's max_position_embeddings %" PRId64,
                        o->max_model_len, cfg.max_position_embeddings);
    if (mine == TP_OK) mine = tp_weights_open(o->model, &w);
    if (mine == TP_OK && g->rank == 0) (void)tp_model_warn_unused(&cfg, &w);
    if (mine == TP_OK) mine = tp_dry_run_rank(o, g, &cfg, &w, dev, &rep, text, REPORT_CAP);
    if (mine != TP_OK) memset(&rep, 0, sizeof rep);

    /* Every rank reaches this point, failed or not: the exchange doubles as agreement. */
    int n_usage = 0;
    TP_CHECK_GOTO(tp_mpi_agree(world->world, mine, n_failed, &n_usage), st, done);
    if (*n_failed) {
        /* A rank that did not fail itself records no message: the failed ones speak. */
        st = mine != TP_OK ? mine : (n_usage ? TP_ERR_INVALID_ARG : TP_ERR_FORMAT);
        goto done;
    }
    all_text = calloc((size_t)g->world, REPORT_CAP);
    all = calloc((size_t)g->world, sizeof *all);
    if (!all_text || !all) {
        st = tp_error(TP_ERR_OOM, "out of memory");
        goto done;
    }
    TP_CHECK_GOTO(tp_comm_all_gather(world->world, text, all_text, REPORT_CAP / 4, TP_DTYPE_I32, NULL),
                  st, done);
    TP_CHECK_GOTO(tp_comm_all_gather(world->world, &rep, all, sizeof rep / 4, TP_DTYPE_I32, NULL),
                  st, done);
    if (g->rank == 0) {
        for (int r = 0; r < g->world; r++) fputs(all_text + (size_t)r * REPORT_CAP, out);
        print_totals(out, o, g, &cfg, &w, all, dev);
        fflush(out);
    }
done:
    free(all);
    free(all_text);
    free(text);
    tp_weights_free(&w);
    return st;
}
