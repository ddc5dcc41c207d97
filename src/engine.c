/*
 * engine.c: the generation loop. Every rank of a replica runs the same schedulers on the
 * same inputs and so makes the same decisions; the only thing that travels besides
 * activations is each step's sampled tokens, broadcast from the sampler rank (last
 * stage, tp rank 0). Pipeline parallel: P = pp schedulers ("virtual engines") over
 * disjoint requests and KV blocks; at tick t stage s runs the batch that engine
 * (t - s) mod P started at tick t - s, so all stages compute at the same time.
 */
#include "engine.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "log.h"
#include "model.h"
#include "model_config.h"
#include "requests.h"
#include "sampler.h"
#include "scheduler.h"
#include "st_write.h"
#include "tokenizer.h"
#include "util.h"
#include "weights.h"

enum { REASON_LENGTH = 0, REASON_STOP = 1, REASON_ERROR = 2 };

typedef struct req {
    const tp_request *in;
    int32_t *prompt;
    int32_t n_prompt;
    int32_t max_new;
    int ignore_eos;
    tp_sampling_params sp;
    const char *error_code; /* NULL when the request runs */
    char *error_message;
    tp_ids out;             /* generated tokens */
    int reason;
    float *prompt_logits;   /* --dump-logits, sampler rank: [n_prompt, V] */
    int32_t n_prompt_logits;
    float *gen_logits;      /* [max_new, V] */
    int32_t n_gen_logits;
} req;

typedef struct engine {
    const tp_options *o;
    tp_mpi_world *w;
    const tp_grid *g;
    tp_model_config cfg;
    tp_generation_config gen;
    tp_tokenizer *tok;
    tp_request_list reqs;
    req *R;
    int64_t n_mine; /* requests of this replica */
    int32_t max_model_len;
    int32_t eos[TP_MAX_EOS_IDS];
    int n_eos;

    tp_weights weights;
    tp_backend *backend;
    tp_model model;
    tp_kv_cache kv;
    tp_step_buffers buf;
    tp_tensor rx, rdelta; /* activations received from the previous stage */

    int P;
    int32_t blocks_per_engine;
    tp_scheduler **S;
    tp_sched_batch *B;
    int *inflight;
    int64_t *entered;

    int is_sampler;
    tp_sampler *sampler;
    float *logits_host;
    int32_t *slot, *block_table, *logit_rows, *sync; /* host scratch */
    uint8_t *finish;
    int64_t generated_tokens, prompt_tokens;
} engine;

// ----------------------------------------------------------------------------
// phase 1: config, tokenizer, prompts (every rank, identically)

static void set_request_error(req *r, const char *code)
{
    r->error_code = code;
    r->error_message = strdup(*tp_error_message() ? tp_error_message() : code);
    tp_error_clear();
}

static void default_sampling(const engine *e, tp_sampling_params *sp)
{
    const tp_options *o = e->o;
    tp_sampling_params_default(sp);
    if (e->gen.do_sample == 1) { /* the model's own defaults, as transformers' generate() */
        sp->temperature = e->gen.temperature >= 0 ? e->gen.temperature : 1.0;
        if (e->gen.top_k >= 0) sp->top_k = (int32_t)e->gen.top_k;
        if (e->gen.top_p >= 0) sp->top_p = e->gen.top_p;
    }
    if (o->temperature >= 0) sp->temperature = o->temperature;
    if (o->top_k >= -1) sp->top_k = (int32_t)o->top_k;
    if (o->top_p >= 0) sp->top_p = o->top_p;
}

static tp_status prepare_request(engine *e, req *r, const tp_request *in)
{
    r->in = in;
    default_sampling(e, &r->sp);
    if (in->has_temperature) r->sp.temperature = in->temperature;
    if (in->has_top_k) r->sp.top_k = in->top_k;
    if (in->has_top_p) r->sp.top_p = in->top_p;
    r->sp.seed = tp_sampler_request_seed(in->has_seed ? in->seed : e->o->seed, in->id);
    r->ignore_eos = in->ignore_eos >= 0 ? in->ignore_eos : e->o->ignore_eos;
    if (tp_sampling_params_validate(&r->sp) != TP_OK) {
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    if (in->prompt_ids) {
        r->prompt = malloc((size_t)in->n_prompt_ids * sizeof *r->prompt);
        if (!r->prompt) return tp_error(TP_ERR_OOM, "out of memory");
        memcpy(r->prompt, in->prompt_ids, (size_t)in->n_prompt_ids * sizeof *r->prompt);
        r->n_prompt = in->n_prompt_ids;
    } else {
        tp_ids ids = {0};
        tp_status st = tp_tokenizer_encode(e->tok, in->prompt, in->prompt_len, 1, &ids);
        if (st == TP_ERR_OOM) return st;
        if (st != TP_OK) {
            tp_ids_free(&ids);
            set_request_error(r, "invalid_request");
            return TP_OK;
        }
        r->prompt = ids.v;
        r->n_prompt = (int32_t)ids.n;
    }
    if (r->n_prompt == 0) {
        tp_error(TP_ERR_INVALID_ARG, "line %lld: the prompt is empty (it encodes to no tokens)",
                 (long long)in->line);
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    if (r->n_prompt >= e->max_model_len) {
        tp_error(TP_ERR_INVALID_ARG,
                 "line %lld: the prompt has %d tokens; the context is %d (--max-model-len), which "
                 "leaves no room to generate",
                 (long long)in->line, r->n_prompt, e->max_model_len);
        set_request_error(r, "context_length_exceeded");
        return TP_OK;
    }
    int32_t want = in->max_tokens > 0 ? in->max_tokens : (int32_t)e->o->max_tokens;
    int32_t room = e->max_model_len - r->n_prompt;
    r->max_new = want < room ? want : room;
    return TP_OK;
}

static tp_status setup(engine *e)
{
    const tp_options *o = e->o;
    TP_CHECK(tp_model_config_load(o->model, &e->cfg));
    TP_CHECK(tp_generation_config_load(o->model, &e->gen));
    char *what = tp_path_join(o->model, "generation_config.json");
    tp_status st = what ? tp_generation_config_check(&e->gen, &e->cfg, what) : TP_ERR_OOM;
    free(what);
    TP_CHECK(st);
    TP_CHECK(tp_shard_plan_validate(&e->cfg, e->g->tp, e->g->pp));
    int64_t ctx = o->max_model_len ? o->max_model_len : e->cfg.max_position_embeddings;
    if (ctx > e->cfg.max_position_embeddings)
        return tp_error(TP_ERR_INVALID_ARG, "--max-model-len %" PRId64 " exceeds the model's max_position_embeddings %" PRId64,
                        ctx, e->cfg.max_position_embeddings);
    if (ctx > INT32_MAX / 2) ctx = INT32_MAX / 2;
    e->max_model_len = (int32_t)ctx;
    e->n_eos = e->gen.n_eos ? e->gen.n_eos : e->cfg.n_eos;
    for (int i = 0; i < e->n_eos; i++)
        e->eos[i] = (int32_t)(e->gen.n_eos ? e->gen.eos_token_ids[i] : e->cfg.eos_token_ids[i]);

    TP_CHECK(tp_tokenizer_load(o->model, &e->tok));
    TP_CHECK(tp_requests_read(o->input, e->cfg.vocab_size, &e->reqs));
    e->R = calloc(e->reqs.n, sizeof *e->R);
    if (!e->R) return tp_error(TP_ERR_OOM, "out of memory for %zu requests", e->reqs.n);
    for (size_t i = 0; i < e->reqs.n; i++) TP_CHECK(prepare_request(e, &e->R[i], &e->reqs.v[i]));
    return TP_OK;
}

// ----------------------------------------------------------------------------
// phase 2: weights, KV cache, schedulers

static tp_dtype weight_dtype(const engine *e)
{
    tp_dtype dt = e->cfg.torch_dtype;
    if (strcmp(e->o->dtype, "auto")) tp_dtype_from_name(e->o->dtype, &dt);
    return dt;
}

/* Ranks sharing a node share its cores: without an OMP_NUM_THREADS of the user's, each
 * rank takes its part, so 4 ranks on 8 cores do not run 32 spinning threads. */
static void split_threads(const tp_grid *g)
{
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS")) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per = (int)(cores / (g->local_size > 0 ? g->local_size : 1));
    omp_set_num_threads(per > 0 ? per : 1);
#else
    (void)g;
#endif
}

static tp_status load(engine *e, int32_t *n_blocks)
{
    split_threads(e->g);
    const tp_grid *g = e->g;
    tp_shard_plan plan;
    TP_CHECK(tp_shard_plan_make(&e->cfg, g->tp, g->pp, g->tp_rank, g->pp_rank, &plan));
    TP_CHECK(tp_backend_create(e->o->backend, -1, weight_dtype(e), &e->backend));
    TP_CHECK(tp_weights_open(e->o->model, &e->weights));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    TP_CHECK(tp_model_load(&e->model, &e->cfg, &plan, &e->weights, e->backend, weight_dtype(e)));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    tp_log(TP_LOG_DEBUG, "loaded %" PRId64 " bytes of weights in %.2f s", e->model.weight_bytes, s);
    int64_t per_token = tp_shard_plan_kv_bytes_per_token(&e->cfg, &plan, (int64_t)tp_dtype_size(e->backend->act_dtype));
    int64_t per_block = per_token * e->o->kv_block_size;
    int64_t nb = per_block > 0 ? e->o->kv_cache_memory / per_block : 0;
    *n_blocks = nb > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)nb;
    return TP_OK;
}

static tp_status make_schedulers(engine *e, int32_t n_blocks)
{
    const tp_options *o = e->o;
    e->P = e->g->pp;
    e->blocks_per_engine = n_blocks / e->P;
    int32_t bs = (int32_t)o->kv_block_size;
    int32_t need = (int32_t)TP_CEIL_DIV(e->max_model_len, bs);
    if (e->blocks_per_engine < 1)
        return tp_error(TP_ERR_INVALID_ARG,
                        "--kv-cache-memory %" PRId64 " bytes holds %d KV blocks of %d tokens, too few "
                        "for %d pipeline micro-batches; give more memory",
                        o->kv_cache_memory, n_blocks, bs, e->P);
    if (e->blocks_per_engine < need)
        tp_log_info0("KV cache: %d blocks of %d tokens per micro-batch engine; a sequence of "
                     "--max-model-len %d would need %d",
                     e->blocks_per_engine, bs, e->max_model_len, need);
    e->S = calloc((size_t)e->P, sizeof *e->S);
    e->B = calloc((size_t)e->P, sizeof *e->B);
    e->inflight = calloc((size_t)e->P, sizeof *e->inflight);
    e->entered = calloc((size_t)e->P, sizeof *e->entered);
    if (!e->S || !e->B || !e->inflight || !e->entered) return tp_error(TP_ERR_OOM, "out of memory");
    tp_sched_config sc = {bs, e->blocks_per_engine, (int32_t)o->max_num_seqs,
                          (int32_t)o->max_num_batched_tokens, e->max_model_len};
    for (int p = 0; p < e->P; p++) TP_CHECK(tp_scheduler_create(&sc, &e->S[p]));
    /* this replica's requests, dealt round-robin to the engines */
    int64_t k = 0;
    for (size_t i = 0; i < e->reqs.n; i++) {
        if ((int64_t)i % e->g->dp != e->g->dp_rank) continue;
        req *r = &e->R[i];
        e->n_mine++;
        if (r->error_code) continue;
        tp_status st = tp_scheduler_add(e->S[k % e->P], (int64_t)i, r->prompt, r->n_prompt, r->max_new);
        if (st == TP_ERR_OOM) return st;
        if (st != TP_OK) set_request_error(r, "context_length_exceeded");
        else e->prompt_tokens += r->n_prompt;
        k++;
    }

    const tp_model_dims *d = &e->model.dims;
    int32_t T = (int32_t)o->max_num_batched_tokens;
    int32_t L = o->dump_logits ? T : (int32_t)(o->max_num_seqs < T ? o->max_num_seqs : T);
    int32_t seqs = (int32_t)(o->max_num_seqs < T ? o->max_num_seqs : T);
    TP_CHECK(tp_kv_cache_create(&e->model, n_blocks, bs, e->backend->act_dtype, &e->kv));
    TP_CHECK(tp_step_buffers_create(&e->model, T, L, seqs, need, &e->buf));
    void *p1, *p2;
    TP_CHECK(e->backend->ops->alloc(e->backend, (size_t)T * (size_t)d->d * sizeof(float), &p1));
    e->rx = tp_tensor_make(p1, TP_DTYPE_F32, T, d->d);
    TP_CHECK(e->backend->ops->alloc(e->backend, (size_t)T * (size_t)d->d * sizeof(float), &p2));
    e->rdelta = tp_tensor_make(p2, TP_DTYPE_F32, T, d->d);

    e->slot = malloc((size_t)T * sizeof *e->slot);
    e->logit_rows = malloc((size_t)T * sizeof *e->logit_rows);
    e->block_table = malloc((size_t)seqs * (size_t)need * sizeof *e->block_table);
    e->sync = malloc((size_t)2 * (size_t)T * sizeof *e->sync);
    e->finish = malloc((size_t)T);
    if (!e->slot || !e->logit_rows || !e->block_table || !e->sync || !e->finish)
        return tp_error(TP_ERR_OOM, "out of memory");
    e->is_sampler = e->g->pp_rank == e->g->pp - 1 && e->g->tp_rank == 0;
    if (e->is_sampler) {
        TP_CHECK(tp_sampler_create((int32_t)e->cfg.vocab_size, &e->sampler));
        e->logits_host = malloc((size_t)L * (size_t)e->cfg.vocab_size * sizeof(float));
        if (!e->logits_host) return tp_error(TP_ERR_OOM, "out of memory for %d rows of logits", L);
    }
    return TP_OK;
}

// ----------------------------------------------------------------------------
// phase 3: the step loop

static int stage_engine(const engine *e, int64_t tick, int stage)
{
    int64_t t = tick - stage;
    if (t < 0) return -1;
    int p = (int)(t % e->P);
    return e->inflight[p] && e->entered[p] == t ? p : -1;
}

/* The scheduler's step, with engine p's block ids moved to its part of the cache. */
static void make_step(engine *e, int p, tp_step *s)
{
    const tp_sched_batch *b = &e->B[p];
    int32_t bs = (int32_t)e->o->kv_block_size, off = p * e->blocks_per_engine;
    for (int32_t i = 0; i < b->n_tokens; i++) e->slot[i] = b->slot[i] + off * bs;
    for (int32_t i = 0; i < b->n_seqs * b->max_blocks; i++) e->block_table[i] = b->block_table[i] + off;
    s->n_tokens = b->n_tokens;
    s->ids = b->tokens;
    s->pos = b->pos;
    s->seq = b->seq;
    s->slot = e->slot;
    s->n_seqs = b->n_seqs;
    s->max_blocks = b->max_blocks;
    s->max_pos = b->max_pos;
    s->block_table = e->block_table;
    if (e->o->dump_logits) { /* every position's logits, for the dump */
        for (int32_t i = 0; i < b->n_tokens; i++) e->logit_rows[i] = i;
        s->n_logits = b->n_tokens;
    } else {
        memcpy(e->logit_rows, b->logit_token, (size_t)b->n_logits * sizeof(int32_t));
        s->n_logits = b->n_logits;
    }
    s->logit_rows = e->logit_rows;
}

static int is_eos(const engine *e, int32_t t)
{
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return 1;
    return 0;
}

static void keep_dump_rows(engine *e, const tp_sched_batch *b)
{
    const int64_t V = e->cfg.vocab_size;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        req *r = &e->R[b->seq_key[b->seq[t]]];
        if (b->pos[t] >= r->n_prompt || b->pos[t] != r->n_prompt_logits) continue;
        if (!r->prompt_logits) r->prompt_logits = malloc((size_t)r->n_prompt * (size_t)V * sizeof(float));
        if (!r->prompt_logits) continue; /* the dump of this request will say so */
        memcpy(r->prompt_logits + (size_t)b->pos[t] * (size_t)V, e->logits_host + (size_t)t * (size_t)V,
               (size_t)V * sizeof(float));
        r->n_prompt_logits++;
    }
}

/* Sampler rank: choose each logit row's token; everyone: receive them and commit. */
static tp_status sample_and_commit(engine *e, int p)
{
    const tp_sched_batch *b = &e->B[p];
    const int64_t V = e->cfg.vocab_size;
    int32_t n = b->n_logits;
    if (e->is_sampler) {
        if (e->o->dump_logits) keep_dump_rows(e, b);
        for (int32_t i = 0; i < n; i++) {
            int64_t key = b->seq_key[b->logit_seq[i]];
            req *r = &e->R[key];
            int32_t row = e->o->dump_logits ? b->logit_token[i] : i;
            const float *lg = e->logits_host + (size_t)row * (size_t)V;
            tp_sample_result res = {0};
            TP_CHECK(tp_sampler_sample(e->sampler, &r->sp, (uint64_t)r->out.n, lg, r->prompt, r->n_prompt,
                                       r->out.v, (int32_t)r->out.n, &res));
            e->sync[i] = res.token;
            e->sync[n + i] = !r->ignore_eos && is_eos(e, res.token);
            if (e->o->dump_logits) {
                if (!r->gen_logits) r->gen_logits = malloc((size_t)r->max_new * (size_t)V * sizeof(float));
                if (r->gen_logits && r->n_gen_logits < r->max_new)
                    memcpy(r->gen_logits + (size_t)r->n_gen_logits++ * (size_t)V, lg, (size_t)V * sizeof(float));
            }
        }
    }
    if (e->g->tp * e->g->pp > 1)
        TP_CHECK(tp_comm_broadcast(e->w->replica, e->sync, (size_t)2 * (size_t)n, TP_DTYPE_I32,
                                   (e->g->pp - 1) * e->g->tp, NULL));
    for (int32_t i = 0; i < n; i++) {
        req *r = &e->R[b->seq_key[b->logit_seq[i]]];
        TP_CHECK(tp_ids_push(&r->out, e->sync[i]));
        if (e->sync[n + i]) r->reason = REASON_STOP;
        e->finish[i] = (uint8_t)e->sync[n + i];
    }
    e->generated_tokens += n;
    return tp_scheduler_commit(e->S[p], b, e->sync, e->finish);
}

static tp_status write_dump(engine *e, int64_t key);

static tp_status run_stage(engine *e, int p, tp_step *s)
{
    make_step(e, p, s);
    const tp_tensor *in_x = NULL, *in_delta = NULL;
    tp_tensor rx = tp_tensor_rows(&e->rx, 0, s->n_tokens), rd = tp_tensor_rows(&e->rdelta, 0, s->n_tokens);
    if (!e->model.plan.has_embedding) {
        in_x = &rx;
        in_delta = &rd;
    }
    return tp_model_forward(&e->model, &e->kv, &e->buf, s, e->w->tp, in_x, in_delta,
                            e->is_sampler ? e->logits_host : NULL);
}

/* After every stage computed: stage s receives what s-1 produced (for its next tick),
 * then sends its own output to s+1. Receiving first keeps the chain free of cycles. */
static tp_status exchange(engine *e, int64_t tick, int mine_p, const tp_step *mine)
{
    const int s = e->g->pp_rank;
    const size_t d = (size_t)e->model.dims.d;
    if (s > 0) {
        int prev = stage_engine(e, tick, s - 1);
        if (prev >= 0) {
            size_t n = (size_t)e->B[prev].n_tokens * d;
            TP_CHECK(tp_comm_recv(e->w->pp, e->rx.data, n, TP_DTYPE_F32, s - 1, e->backend->stream));
            TP_CHECK(tp_comm_recv(e->w->pp, e->rdelta.data, n, TP_DTYPE_F32, s - 1, e->backend->stream));
        }
    }
    if (s < e->g->pp - 1 && mine_p >= 0) {
        size_t n = (size_t)mine->n_tokens * d;
        TP_CHECK(tp_comm_send(e->w->pp, e->buf.x.data, n, TP_DTYPE_F32, s + 1, e->backend->stream));
        TP_CHECK(tp_comm_send(e->w->pp, e->buf.delta.data, n, TP_DTYPE_F32, s + 1, e->backend->stream));
    }
    return TP_OK;
}

static tp_status collect_finished(engine *e, int p)
{
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    while (tp_scheduler_pop_finished(e->S[p], &key, &gen, &n_gen)) {
        req *r = &e->R[key];
        if ((size_t)n_gen != r->out.n || memcmp(gen, r->out.v, (size_t)n_gen * sizeof *gen))
            return tp_error(TP_ERR_INTERNAL, "request %s: the scheduler's tokens disagree with the engine's",
                            r->in->id);
        if (e->is_sampler && e->o->dump_logits) TP_CHECK(write_dump(e, key));
    }
    return TP_OK;
}

static tp_status loop(engine *e)
{
    tp_step step;
    for (int64_t tick = 0;; tick++) {
        int p0 = (int)(tick % e->P);
        if (!e->inflight[p0]) {
            TP_CHECK(tp_scheduler_schedule(e->S[p0], &e->B[p0]));
            e->inflight[p0] = e->B[p0].n_tokens > 0;
            e->entered[p0] = tick;
        }
        int mine = stage_engine(e, tick, e->g->pp_rank);
        if (mine >= 0) TP_CHECK(run_stage(e, mine, &step));
        if (e->P > 1) TP_CHECK(exchange(e, tick, mine, &step));
        int last = stage_engine(e, tick, e->P - 1);
        if (last >= 0) {
            TP_CHECK(sample_and_commit(e, last));
            e->inflight[last] = 0;
            TP_CHECK(collect_finished(e, last));
        }
        int busy = 0;
        for (int p = 0; p < e->P; p++) busy |= e->inflight[p] || !tp_scheduler_idle(e->S[p]);
        if (!busy) return TP_OK;
        if (tick > INT64_C(1) << 40) return tp_error(TP_ERR_INTERNAL, "the step loop does not end");
    }
}

// ----------------------------------------------------------------------------
// --dump-logits

/* An id as a file name: [A-Za-z0-9._-] kept, everything else %XX. */
static char *file_name_of(const char *id)
{
    size_t n = strlen(id);
    char *s = malloc(3 * n + 1 + 16);
    if (!s) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
            c == '-' || (c == '.' && i > 0))
            s[k++] = (char)c;
        else
            k += (size_t)sprintf(s + k, "%%%02X", c);
    }
    strcpy(s + k, ".safetensors");
    return s;
}

static tp_status write_dump(engine *e, int64_t key)
{
    req *r = &e->R[key];
    const int64_t V = e->cfg.vocab_size;
    tp_status st = TP_OK;
    if (!r->prompt_logits || !r->gen_logits || r->n_prompt_logits != r->n_prompt)
        st = tp_error(TP_ERR_OOM, "request %s: the logits to dump were not all kept (out of memory?)", r->in->id);
    char *name = file_name_of(r->in->id);
    char *path = name ? tp_path_join(e->o->dump_logits, name) : NULL;
    if (st == TP_OK && !path) st = tp_error(TP_ERR_OOM, "out of memory");
    if (st == TP_OK) {
        int32_t n_out = r->n_gen_logits;
        tp_st_out_tensor t[] = {
            {"prompt_ids", "I32", 1, {r->n_prompt}, r->prompt, (size_t)r->n_prompt * 4},
            {"output_ids", "I32", 1, {n_out}, r->out.v, (size_t)n_out * 4},
            {"prompt_logits", "F32", 2, {r->n_prompt, V}, r->prompt_logits, (size_t)r->n_prompt * (size_t)V * 4},
            {"logits", "F32", 2, {n_out, V}, r->gen_logits, (size_t)n_out * (size_t)V * 4},
        };
        const char *meta[] = {"id", r->in->id, "format", "tpinfer logits dump: logits[i] chose output_ids[i]"};
        st = tp_st_write(path, t, 4, meta, 2);
    }
    free(name);
    free(path);
    free(r->prompt_logits);
    free(r->gen_logits);
    r->prompt_logits = r->gen_logits = NULL;
    return st;
}

// ----------------------------------------------------------------------------
// phase 4: results to world rank 0, in input order

static tp_status gather_results(engine *e)
{
    const tp_grid *g = e->g;
    int cell = g->tp * g->pp;
    if (g->dp == 1) return TP_OK;
    if (g->rank % cell != 0) return TP_OK; /* replica leaders only */
    if (g->rank != 0) {
        int64_t n = 0, total = 0;
        for (size_t i = g->dp_rank; i < e->reqs.n; i += (size_t)g->dp) n++, total += (int64_t)e->R[i].out.n;
        int32_t *hdr = malloc((size_t)(2 * n + 1) * sizeof *hdr);
        int32_t *tok = malloc((size_t)(total ? total : 1) * sizeof *tok);
        if (!hdr || !tok) {
            free(hdr);
            free(tok);
            return tp_error(TP_ERR_OOM, "out of memory");
        }
        int64_t k = 0, t = 0;
        for (size_t i = g->dp_rank; i < e->reqs.n; i += (size_t)g->dp, k++) {
            hdr[2 * k] = (int32_t)e->R[i].out.n;
            hdr[2 * k + 1] = e->R[i].reason;
            memcpy(tok + t, e->R[i].out.v, e->R[i].out.n * sizeof *tok);
            t += (int64_t)e->R[i].out.n;
        }
        hdr[2 * n] = (int32_t)total;
        tp_status st = tp_comm_send(e->w->world, hdr, (size_t)(2 * n + 1), TP_DTYPE_I32, 0, NULL);
        if (st == TP_OK) st = tp_comm_send(e->w->world, tok, (size_t)(total ? total : 1), TP_DTYPE_I32, 0, NULL);
        free(hdr);
        free(tok);
        return st;
    }
    for (int r = 1; r < g->dp; r++) {
        int64_t n = 0;
        for (size_t i = (size_t)r; i < e->reqs.n; i += (size_t)g->dp) n++;
        int32_t *hdr = malloc((size_t)(2 * n + 1) * sizeof *hdr);
        if (!hdr) return tp_error(TP_ERR_OOM, "out of memory");
        tp_status st = tp_comm_recv(e->w->world, hdr, (size_t)(2 * n + 1), TP_DTYPE_I32, r * cell, NULL);
        int32_t total = hdr[2 * n];
        int32_t *tok = st == TP_OK ? malloc((size_t)(total ? total : 1) * sizeof *tok) : NULL;
        if (st == TP_OK && !tok) st = tp_error(TP_ERR_OOM, "out of memory");
        if (st == TP_OK)
            st = tp_comm_recv(e->w->world, tok, (size_t)(total ? total : 1), TP_DTYPE_I32, r * cell, NULL);
        int64_t k = 0, t = 0;
        for (size_t i = (size_t)r; st == TP_OK && i < e->reqs.n; i += (size_t)g->dp, k++) {
            req *q = &e->R[i];
            q->reason = hdr[2 * k + 1];
            for (int32_t j = 0; j < hdr[2 * k] && st == TP_OK; j++) st = tp_ids_push(&q->out, tok[t++]);
        }
        free(hdr);
        free(tok);
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

static tp_status write_results(engine *e, int64_t *n_errors)
{
    FILE *f = stdout;
    if (e->o->output && !(f = fopen(e->o->output, "w")))
        return tp_error(TP_ERR_IO, "cannot create --output %s: %s", e->o->output, strerror(errno));
    tp_status st = TP_OK;
    for (size_t i = 0; i < e->reqs.n && st == TP_OK; i++) {
        req *r = &e->R[i];
        json_t *o;
        if (r->error_code) {
            (*n_errors)++;
            o = json_pack("{s:s, s:I, s:{s:s, s:s}}", "id", r->in->id, "line", (json_int_t)r->in->line, "error",
                          "code", r->error_code, "message", r->error_message);
        } else {
            char *text = NULL;
            size_t len = 0;
            st = tp_tokenizer_decode(e->tok, r->out.v, r->out.n, 1, &text, &len);
            if (st != TP_OK) break;
            json_t *ids = json_array();
            for (size_t j = 0; j < r->out.n; j++) json_array_append_new(ids, json_integer(r->out.v[j]));
            o = json_pack("{s:s, s:s%, s:o, s:s, s:{s:i, s:I}}", "id", r->in->id, "text", text, len,
                          "token_ids", ids, "finish_reason", r->reason == REASON_STOP ? "stop" : "length",
                          "usage", "prompt_tokens", r->n_prompt, "completion_tokens", (json_int_t)r->out.n);
            free(text);
        }
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII) : NULL;
        json_decref(o);
        if (!line) {
            st = tp_error(TP_ERR_OOM, "out of memory writing results");
            break;
        }
        if (fprintf(f, "%s\n", line) < 0)
            st = tp_error(TP_ERR_IO, "cannot write %s: %s", e->o->output ? e->o->output : "stdout", strerror(errno));
        free(line);
    }
    if (fflush(f) != 0 && st == TP_OK)
        st = tp_error(TP_ERR_IO, "cannot write %s: %s", e->o->output ? e->o->output : "stdout", strerror(errno));
    if (f != stdout && fclose(f) != 0 && st == TP_OK)
        st = tp_error(TP_ERR_IO, "cannot close %s: %s", e->o->output, strerror(errno));
    return st;
}

// ----------------------------------------------------------------------------

static void engine_free(engine *e)
{
    for (int p = 0; e->S && p < e->P; p++) tp_scheduler_destroy(e->S[p]);
    free(e->S);
    free(e->B);
    free(e->inflight);
    free(e->entered);
    if (e->backend) {
        e->backend->ops->free(e->backend, e->rx.data);
        e->backend->ops->free(e->backend, e->rdelta.data);
        tp_kv_cache_free(&e->model, &e->kv);
        tp_step_buffers_free(&e->model, &e->buf);
        tp_model_free(&e->model);
        tp_backend_destroy(e->backend);
    }
    tp_weights_free(&e->weights);
    for (size_t i = 0; e->R && i < e->reqs.n; i++) {
        free(e->R[i].prompt);
        free(e->R[i].error_message);
        tp_ids_free(&e->R[i].out);
        free(e->R[i].prompt_logits);
        free(e->R[i].gen_logits);
    }
    free(e->R);
    tp_requests_free(&e->reqs);
    tp_tokenizer_destroy(e->tok);
    tp_sampler_destroy(e->sampler);
    free(e->logits_host);
    free(e->slot);
    free(e->logit_rows);
    free(e->block_table);
    free(e->sync);
    free(e->finish);
}

/* A phase boundary: every rank brings its status; all learn whether any failed. */
static tp_status agree(engine *e, tp_status mine, int *n_failed)
{
    int n_usage = 0;
    TP_CHECK(tp_mpi_agree(e->w->world, mine, n_failed, &n_usage));
    if (*n_failed == 0) return TP_OK;
    return mine != TP_OK ? mine : n_usage ? TP_ERR_INVALID_ARG : TP_ERR_FORMAT;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

tp_status tp_generate(const tp_options *o, tp_mpi_world *w, const tp_device_info *dev,
                      int *n_failed, int *must_abort, int64_t *n_request_errors)
{
    engine e;
    memset(&e, 0, sizeof e);
    e.o = o;
    e.w = w;
    e.g = &w->grid;
    *must_abort = 0;
    *n_failed = 0;
    *n_request_errors = 0;
    (void)dev;
    tp_status st = TP_OK;
    if (o->dump_logits && mkdir(o->dump_logits, 0755) != 0 && errno != EEXIST)
        st = tp_error(TP_ERR_IO, "cannot create --dump-logits directory %s: %s", o->dump_logits, strerror(errno));
    if (st == TP_OK) st = setup(&e);
    TP_CHECK_GOTO(agree(&e, st, n_failed), st, out);

    int32_t n_blocks = 0;
    st = load(&e, &n_blocks);
    TP_CHECK_GOTO(agree(&e, st, n_failed), st, out);
    /* every rank of a replica must hold the same number of blocks: take the smallest */
    int32_t *all = malloc((size_t)w->replica->size * sizeof *all);
    if (!all) {
        *must_abort = 1;
        st = tp_error(TP_ERR_OOM, "out of memory");
        goto out;
    }
    st = tp_comm_all_gather(w->replica, &n_blocks, all, 1, TP_DTYPE_I32, NULL);
    for (int i = 0; i < w->replica->size; i++) n_blocks = all[i] < n_blocks ? all[i] : n_blocks;
    free(all);
    if (st == TP_OK) st = make_schedulers(&e, n_blocks);
    TP_CHECK_GOTO(agree(&e, st, n_failed), st, out);

    double t0 = now_s();
    st = loop(&e);
    if (st != TP_OK) { /* peers may be waiting in a collective of the loop */
        *must_abort = 1;
        *n_failed = 1;
        goto out;
    }
    st = gather_results(&e);
    if (st != TP_OK) {
        *must_abort = 1;
        *n_failed = 1;
        goto out;
    }
    double dt = now_s() - t0;
    if (w->grid.rank == 0) {
        st = write_results(&e, n_request_errors);
        *n_failed = st != TP_OK;
    }
    int64_t gen_total = e.generated_tokens, steps = 0, preempted = 0;
    for (int p = 0; p < e.P; p++) {
        tp_sched_stats ss;
        tp_scheduler_stats(e.S[p], &ss);
        steps += ss.steps;
        preempted += ss.preemptions;
    }
    tp_log_info0("%zu requests, %" PRId64 " prompt + %" PRId64 " generated tokens (replica 0) in %.2f s: "
                 "%.1f generated tok/s; %" PRId64 " steps, %" PRId64 " preempted",
                 e.reqs.n, e.prompt_tokens, gen_total, dt, dt > 0 ? (double)gen_total / dt : 0.0, steps,
                 preempted);
out:
    engine_free(&e);
    return st;
}
