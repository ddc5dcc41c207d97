/*
 * engine.c: a run of the generation loop, phase by phase: the input (config, tokenizer,
 * prompts: each replica its share, made the engine's requests by engine_requests.c), the
 * output (rank 0) and --resume, the weights, KV cache and schedulers, then the steps
 * (engine_step.c) and the end. Every rank of a replica runs
 * the same schedulers on the same inputs and so makes the same decisions; besides
 * activations, only each step's sampled tokens travel, broadcast from the sampler rank (last
 * stage, tp rank 0) together with its decision to stop early. Pipeline parallel: P = pp
 * schedulers ("virtual engines") over disjoint requests and KV blocks; at tick t stage s runs
 * the batch that engine (t - s) mod P started at tick t - s, so all stages compute at the
 * same time. The sampler rank turns finished requests into output lines (collect.c takes
 * them to rank 0, which writes them as they come).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine_internal.h"
#include "log.h"
#include "weights.h"

static volatile sig_atomic_t stop_signal; /* SIGTERM, SIGINT or SIGUSR1 arrived */

static void on_stop_signal(int sig) { stop_signal = sig; }
static int stop_requested(void) { return stop_signal != 0; }
int eng_stop_signal(void) { return stop_signal; }

/* Rank 0 says how long loading took: all ranks' bytes over the slowest rank's time. */
static tp_status report_load(engine *e)
{
    int n = e->w->world->size;
    float mine[2] = {(float)e->model.weight_bytes, (float)e->load_seconds};
    float *all = malloc((size_t)n * sizeof mine);
    if (!all) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = tp_comm_all_gather(e->w->world, mine, all, 2, TP_DTYPE_F32, NULL);
    if (st == TP_OK && e->g->rank == 0) {
        double bytes = 0, slowest = 0;
        int who = 0;
        for (int r = 0; r < n; r++) {
            bytes += all[2 * r];
            if (all[2 * r + 1] > slowest) slowest = all[2 * r + 1], who = r;
        }
        char size[32], described[320];
        tp_format_bytes((int64_t)bytes, size, sizeof size);
        tp_model_config_describe(&e->cfg, described, sizeof described);
        tp_log_info0("loaded %s of weights (%s, %s) on %d rank(s) in %.3f s (%.2f GB/s; slowest rank %d)", size,
                     tp_model_config_arch_name(&e->cfg), described, n, slowest, slowest > 0 ? bytes / 1e9 / slowest : 0.0,
                     who);
    }
    free(all);
    return st;
}



// ----------------------------------------------------------------------------
// phase 1: config, tokenizer (every rank alike), prompts (each replica its share)

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
    const char *slash = strrchr(o->model, '/');
    e->model_name = slash && slash[1] ? slash + 1 : o->model;

    TP_CHECK(tp_tokenizer_load(o->model, &e->tok));
    TP_CHECK(eng_load_chat_template(e));
    tp_input_format fmt = TP_INPUT_AUTO;
    tp_input_format_from_name(o->input_format, &fmt);
    /* a replica keeps its share, the requests at pos % dp == dp_rank, tokenized as they are
     * read (with --resume, once the done ones are known); rank 0 needs every id, for the
     * duplicate check and the resume: its own share's is every one at dp 1, else it gathers
     * the other replicas' (tp_share_gather_ids) */
    const tp_request_share share = {e->g->dp, e->g->dp_rank, e->g->rank == 0 && e->g->dp == 1, eng_take_kept, e, NULL};
    e->exchange_heads = malloc(3 * sizeof(int32_t) * (size_t)e->w->replica->size);
    if (!e->exchange_heads) return tp_error(TP_ERR_OOM, "out of memory");
    TP_CHECK(tp_requests_read_share(o->input, fmt, e->cfg.vocab_size, (size_t)o->max_line_bytes, &share, &e->reqs));
    tp_ids_free(&e->encode_scratch); /* as long as the longest prompt: not kept for the run */
    tp_log(TP_LOG_DEBUG, "rank %d (replica %d): %zu of the input's %zu requests kept", e->g->rank, e->g->dp_rank,
           e->reqs.n, e->reqs.n_total);
    return eng_make_requests(e);
}


// ----------------------------------------------------------------------------
// phase 2: the output (rank 0), resume, and what each replica runs

static char *settings_json(const engine *e)
{
    const tp_options *o = e->o;
    json_t *s = json_pack("{s:I, s:f, s:I, s:f, s:b, s:I, s:s, s:s, s:s}", "max_tokens", (json_int_t)o->max_tokens,
                          "temperature", o->temperature, "top_k", (json_int_t)o->top_k, "top_p", o->top_p,
                          "ignore_eos", o->ignore_eos, "seed", (json_int_t)o->seed, "dtype", o->dtype,
                          "input_format", o->input_format, "chat_template",
                          o->chat_template ? o->chat_template : "");
    json_object_set_new(s, "max_model_len", json_integer(e->max_model_len));
    if (o->tool_call_parser) /* only where given: other runs' manifests are as before */
        json_object_set_new(s, "tool_call_parser", json_string(tp_tool_parser_name(o->tool_call_parser)));
    /* OpenAI chat lines that give no max_tokens run to the context's end unless --max-tokens
     * is given: recorded only where the input has such lines, so that other runs' manifests
     * are as before (and an earlier run's, which cut them at --max-tokens, is refused) */
    if (e->reqs.any_chat_room && !o->max_tokens_given)
        json_object_set_new(s, "chat_max_tokens", json_string("the context (no --max-tokens)"));
    char *text = s ? json_dumps(s, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(s);
    return text;
}

static tp_status open_output(engine *e)
{
    const tp_options *o = e->o;
    tp_output_config oc = {o->output, o->errors, o->resume, o->force, o->overwrite, o->ordered, 2.0};
    char *settings = settings_json(e);
    if (!settings) return tp_error(TP_ERR_OOM, "out of memory");
    tp_manifest m = {PACKAGE_VERSION, o->model, o->input, settings};
    /* the status file first ("validating"): one that cannot be written (or would replace
     * the input or the results) fails the run before the output is touched */
    tp_status st = TP_OK;
    if (o->status_file) {
        st = tp_output_check_target("--status-file", o->status_file, o->input, o->output, o->errors);
        if (st == TP_OK) st = tp_progress_write_early(o->status_file, 0);
        e->status_early = st == TP_OK;
    }
    if (st == TP_OK) st = tp_output_open(&oc, &m, &e->out);
    free(settings);
    return st;
}

/* Rank 0: the fields of the input that no replica reads (a misspelt one would pass unseen). */
static void warn_unknown_fields(const engine *e)
{
    if (!e->reqs.unknown_lines || e->g->rank != 0) return;
    char fields[1024];
    tp_requests_unknown_summary(&e->reqs, fields, sizeof fields);
    tp_log(TP_LOG_WARN, "%s: %" PRId64 " line(s) hold fields tpinfer does not read, which it ignores: %s; check "
           "their spelling (tpinfer(1), Input, lists the fields)", e->o->input, e->reqs.unknown_lines, fields);
}

/* A fingerprint of a model directory's files, in order: each one's tp_hash_file (read in
 * chunks, not held whole), an absent one as a mark. */
static tp_status hash_model_files(const char *dir, const char *const *names, uint64_t *h)
{
    *h = TP_FNV_OFFSET;
    for (; *names; names++) {
        char *path = tp_path_join(dir, *names);
        if (!path) return tp_error(TP_ERR_OOM, "out of memory");
        struct stat sb;
        char hex[17] = "";
        const tp_status st = stat(path, &sb) == 0 ? tp_hash_file(path, hex) : TP_OK;
        free(path);
        TP_CHECK(st);
        *h = tp_fnv1a(*h, hex, sizeof hex);
    }
    return TP_OK;
}

/* Every rank must read the same model: where a node's own copy differed (stale, partial,
 * another checkpoint of the same shapes) the ranks computed garbage together, or met in
 * collectives of other sizes. Each rank compares its fingerprints of the configs, the
 * tokenizer and the weights (tp_weights_fingerprint) with rank 0's. */
static tp_status same_model(engine *e)
{
    static const char *const configs[] = {"config.json", "generation_config.json", NULL},
                             *const tokenizer[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                                   "chat_template.json", NULL},
                             *const parts[] = {"config.json / generation_config.json",
                                               "tokenizer.json / tokenizer_config.json / chat templates",
                                               "weights (safetensors)"};
    uint64_t mine[3], rank0[3];
    TP_CHECK(hash_model_files(e->o->model, configs, &mine[0]));
    TP_CHECK(hash_model_files(e->o->model, tokenizer, &mine[1]));
    tp_weights w;
    TP_CHECK(tp_weights_open(e->o->model, &w));
    const tp_status st = tp_weights_fingerprint(&w, &mine[2]);
    tp_weights_free(&w);
    TP_CHECK(st);
    memcpy(rank0, mine, sizeof mine);
    TP_CHECK(tp_comm_broadcast(e->w->world, rank0, 2 * 3, TP_DTYPE_I32, 0, NULL));
    for (int k = 0; k < 3; k++)
        if (mine[k] != rank0[k])
            return tp_error(TP_ERR_INVALID_ARG,
                            "rank %d reads another model in %s than rank 0 does: its %s differ (a copy on this "
                            "node's disk that is stale, partial or of another checkpoint); give every rank the same "
                            "model: one directory on a shared filesystem, or the same copy on every node",
                            e->g->rank, e->o->model, parts[k]);
    return TP_OK;
}

/* Every rank must read the same file, or the replicas' shares overlap and miss: each
 * compares its count of requests with rank 0's, before anything is written. */
static tp_status same_count(engine *e)
{
    const size_t n = e->reqs.n_total;
    int32_t head[2] = {(int32_t)(n & 0x7fffffff), (int32_t)(n >> 31)};
    TP_CHECK(tp_comm_broadcast(e->w->world, head, 2, TP_DTYPE_I32, 0, NULL));
    const size_t n0 = (size_t)head[0] | (size_t)head[1] << 31;
    if (n0 != n)
        return tp_error(TP_ERR_INVALID_ARG, "rank %d reads %zu requests in %s, rank 0 reads %zu: the file differs "
                        "between nodes (a copy on local disks that differs, or a file being written); give every rank "
                        "the same file", e->g->rank, n, e->o->input, n0);
    /* (room for share_done's bits, while a failure can still be agreed) */
    e->done_bits = calloc((n + 31) / 32 + 1, sizeof *e->done_bits);
    return e->done_bits ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
}

/* Rank 0 knows what an earlier run finished; every rank learns it as a bit per request (by
 * pos), with the input's dialect. */
static tp_status share_done(engine *e)
{
    const size_t n = e->reqs.n_total;
    int32_t head[2] = {e->reqs.any_endpoint, 0};
    if (e->g->rank == 0 && e->out) {
        for (size_t i = 0; i < n; i++)
            if (tp_output_is_done(e->out, tp_requests_id(&e->reqs, i))) e->done_bits[i / 32] |= 1u << (i % 32);
        const int64_t errs = tp_output_done_errors(e->out);
        head[1] = errs > INT32_MAX ? INT32_MAX : (int32_t)errs;
    }
    TP_CHECK(tp_comm_broadcast(e->w->world, head, 2, TP_DTYPE_I32, 0, NULL));
    e->openai = head[0];
    e->done_errors = head[1];
    return tp_comm_broadcast(e->w->world, e->done_bits, (n + 31) / 32 + 1, TP_DTYPE_I32, 0, NULL);
}

static int is_done_earlier(const engine *e, size_t i) { return (e->done_bits[i / 32] >> (i % 32)) & 1; }

/* Test hooks, PHASE:RANK: TPINFER_TEST_STOP_AT (comms, warm-up): that rank stops itself
 * (SIGSTOP) as it enters the phase, as a stopped or hung rank would, so that its peers'
 * watchdog is seen to end the job (reread: before --resume reads the input again, so that a
 * test can change the file); TPINFER_TEST_TERM_AT (input: preparing the requests, load:
 * the weights): it sends itself SIGTERM, as Slurm or mpirun would, so that the startup is seen
 * cut short; TPINFER_TEST_SKEW_AT (read): that TP peer misreads its first row's token of the
 * second step enqueued ahead, as ranks that chose apart would, so that the check is seen. */
static int test_hook_at(const engine *e, const char *var, const char *phase)
{
    const char *v = getenv(var);
    const size_t n = strlen(phase);
    if (!v || strncmp(v, phase, n) || v[n] != ':') return 0;
    char *end;
    const long rank = strtol(v + n + 1, &end, 10);
    return end != v + n + 1 && !*end && rank == e->g->rank;
}

static void test_stop_at(const engine *e, const char *phase)
{
    if (test_hook_at(e, "TPINFER_TEST_STOP_AT", phase)) raise(SIGSTOP);
}

static void test_term_at(const engine *e, const char *phase)
{
    if (test_hook_at(e, "TPINFER_TEST_TERM_AT", phase)) raise(SIGTERM);
}

/* --resume: the replicas split the requests to go, not the file (request j of those to go
 * to replica j mod dp), so a replica whose share of an earlier run is done is not idle now;
 * asked of every request of the file, in order. */
static int keep_to_go(void *arg, size_t pos)
{
    engine *e = arg;
    for (; e->keep_pos < pos; e->keep_pos++) e->keep_index += !is_done_earlier(e, e->keep_pos);
    return !is_done_earlier(e, pos) && e->keep_index % e->g->dp == e->g->dp_rank;
}

/* --resume, once the done requests are known: the share read again, of those to go. */
static tp_status reread_to_go(engine *e)
{
    test_stop_at(e, "reread");
    const size_t n_total = e->reqs.n_total;
    tp_input_format fmt = TP_INPUT_AUTO;
    tp_input_format_from_name(e->o->input_format, &fmt);
    tp_requests_free(&e->reqs);
    free(e->R); /* it pointed into the list just freed (and engine_free walks it by the new count) */
    e->R = NULL;
    tp_guide_destroy(e->guide); /* its JSON sets name the freed list's schemas */
    e->guide = NULL;
    free(e->guided);
    e->guided = NULL;
    e->reread = 1;
    e->n_kept_read = 0;
    const tp_request_share share = {1, 0, 0, eng_take_kept, e, keep_to_go};
    TP_CHECK(tp_requests_read_share(e->o->input, fmt, e->cfg.vocab_size, (size_t)e->o->max_line_bytes, &share,
                                    &e->reqs));
    tp_ids_free(&e->encode_scratch); /* as long as the longest prompt: not kept for the run */
    if (e->reqs.n_total != n_total)
        return tp_error(TP_ERR_INVALID_ARG, "%s changed while tpinfer read it (%zu requests, then %zu); give a file "
                        "that no one writes", e->o->input, n_total, e->reqs.n_total);
    tp_log(TP_LOG_DEBUG, "rank %d (replica %d): %zu of the input's requests to go kept", e->g->rank, e->g->dp_rank,
           e->reqs.n);
    return eng_make_requests(e);
}

enum { ENCODE_ROUND = 128 }; /* requests a rank encodes between two exchanges of a replica's ids */

/* Number the requests of this run (all replicas'), take the ids of the prompts this
 * replica's other ranks tokenized (ENCODE_ROUND a rank at a time), and find those that
 * cannot run.
 * A rank of a replica that fails goes on to the next exchange, which tells the others. */
static tp_status prepare_all(engine *e)
{
    test_term_at(e, "input");
    const int split = e->w->replica->size > 1;
    const size_t n = e->reqs.n, round = (size_t)ENCODE_ROUND * (size_t)e->w->replica->size;
    size_t pos = 0;     /* positions before pos: index counts those not done */
    int64_t index = 0;
    tp_status mine = TP_OK;
    for (size_t b0 = 0; b0 < n; b0 += round) {
        const size_t b1 = n - b0 < round ? n : b0 + round;
        if (split) {
            int stop, failed;
            const tp_status st = tp_share_exchange(&e->reqs, e->w->replica, e->exchange_heads, b0, b1, stop_signal != 0,
                                                   &mine, &stop, &failed);
            if (st != TP_OK) {
                e->abort_startup = 1;
                return st;
            }
            if (stop || failed) return mine; /* phases() stops, or fails, every rank next */
        } else if (mine != TP_OK || stop_signal) {
            return mine;
        }
        for (size_t k = b0; k < b1 && mine == TP_OK; k++) {
            req *r = &e->R[k];
            for (; pos < (size_t)r->in->pos; pos++) index += !is_done_earlier(e, pos);
            if (is_done_earlier(e, pos)) {
                eng_drop_prompt(r->in);
                continue;
            }
            r->index = index;
            mine = eng_prepare_request(e, r);
            if (mine == TP_OK && !r->error_code) r->runnable = e->n_runnable++;
        }
    }
    if (mine != TP_OK) return mine; /* (the last round's: every rank goes to the agreement next) */
    for (; pos < e->reqs.n_total; pos++) index += !is_done_earlier(e, pos);
    e->n_index = index;
    tp_log(TP_LOG_DEBUG, "rank %d (replica %d): %" PRId64 " of the replica's %zu prompts tokenized here", e->g->rank,
           e->g->dp_rank, e->n_encoded, n);
    return TP_OK;
}

/* Whether any replica runs a request: if none does, no rank loads the model. */
static tp_status count_runnable(engine *e)
{
    int32_t mine = e->g->tp_rank == 0 && e->g->pp_rank == 0 && e->n_runnable > 0, any = 0;
    TP_CHECK(tp_comm_all_reduce_sum(e->w->world, &mine, &any, 1, TP_DTYPE_I32, NULL));
    e->any_runnable = any > 0;
    return TP_OK;
}

static int is_sender(const engine *e) { return e->g->pp_rank == e->g->pp - 1 && e->g->tp_rank == 0; }

/* Each replica's sender (it holds the replica's share) sends the records of its requests
 * that cannot run, at once. */
static tp_status write_error_records(engine *e)
{
    if (!is_sender(e)) return TP_OK;
    for (size_t i = 0; i < e->reqs.n; i++) {
        req *r = &e->R[i];
        if (r->index < 0 || !r->error_code) continue;
        char *line;
        size_t len;
        TP_CHECK(tp_error_line_format(r->in, r->index, r->error_code, r->error_message, e->openai, &line, &len));
        tp_record_stats rs = {0, 0, -1, -1, 0};
        tp_status st = tp_collector_send(e->collector, r->index, 1, line, len, &rs);
        free(line);
        TP_CHECK(st);
    }
    return TP_OK;
}

// ----------------------------------------------------------------------------
// phase 3: weights, KV cache, schedulers

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

static tp_dtype compute_dtype(const engine *e)
{
    tp_dtype dt = e->cfg.torch_dtype;
    if (strcmp(e->o->dtype, "auto")) tp_dtype_from_name(e->o->dtype, &dt);
    return dt;
}

/* The weights' dtype: the compute dtype, except where the CPU backend (float32 math, the
 * reference) would fold Granite's multipliers or Gemma's (its embedding's, its norms' 1 +
 * weight) into 16-bit weights (model.c): a multiplier other than a power of two would round
 * each weight again, so they are kept in float32 */
static tp_dtype weight_dtype(const engine *e)
{
    const tp_dtype dt = compute_dtype(e);
    const int folds = e->cfg.arch == TP_ARCH_GRANITE || e->cfg.gemma_norms;
    return folds && !strcmp(e->backend->name, "cpu") ? TP_DTYPE_F32 : dt;
}

static tp_status make_backend(engine *e)
{
    const char *name = e->o->backend;
    int gpu = e->dev->count > 0 ? e->dev->index : -1;
    if (!strcmp(name, "cpu")) gpu = -1;
    if (!strcmp(name, "cuda") && gpu < 0)
        return tp_error(TP_ERR_UNAVAILABLE, "--backend cuda: rank %d sees no GPU; use --backend cpu", e->g->rank);
#ifdef HAVE_CUDA
    /* auto on a machine meant to have GPUs (CUDA_VISIBLE_DEVICES set) that shows none: likely
     * a scheduler or launcher setting, and the CPU backend is orders of magnitude slower */
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (!strcmp(name, "auto") && gpu < 0 && visible)
        tp_log(TP_LOG_WARN, "rank %d sees no GPU (CUDA_VISIBLE_DEVICES=\"%s\"): running on the CPU backend; "
               "--backend cuda makes this an error, --backend cpu says it is meant", e->g->rank, visible);
#endif
    /* a tensor-parallel slice's decode products are small enough that the CUDA backend's
     * own GEMV beats cuBLASLt (batch-1 decode 3.49 against 3.70 ms at tp=2 on two H200s;
     * at tp=1 cuBLASLt wins, the gate/up product too): the backend reads TPINFER_GEMV at
     * creation, a user's setting stays */
    if (e->g->tp > 1) setenv("TPINFER_GEMV", "all", 0);
    TP_CHECK(tp_backend_create(gpu >= 0 ? "cuda" : "cpu", gpu, compute_dtype(e), &e->backend));
    e->tpc = e->w->tp;
    e->ppc = e->w->pp;
    return TP_OK;
}

/* Whether every rank made a backend of the same kind (a rank of a GPU job on a node whose
 * GPUs are hidden falls back to the CPU with --backend auto, and its group would then wait
 * for a communicator it never joins): one sum over the world, the same verdict everywhere. */
static tp_status same_backend(engine *e)
{
    const int32_t mine = !strcmp(e->backend->name, "cuda");
    int32_t on_gpu = 0;
    TP_CHECK(tp_comm_all_reduce_sum(e->w->world, &mine, &on_gpu, 1, TP_DTYPE_I32, NULL));
    if (on_gpu == 0 || on_gpu == e->g->world) return TP_OK;
    return tp_error(TP_ERR_UNAVAILABLE, "the ranks do not all run one backend: %d of the %d have a GPU, the others run "
                    "on the CPU (no GPU visible to them: CUDA_VISIBLE_DEVICES, the node); give every rank a GPU, or "
                    "--backend cpu", (int)on_gpu, e->g->world);
}

/* The NCCL communicators of the GPU backend (their creation is collective over each group:
 * called once every rank's backend exists, so a rank that failed before is not awaited). */
static tp_status make_comms(engine *e)
{
    if (strcmp(e->backend->name, "cuda")) return TP_OK;
    /* device buffers travel through NCCL; MPI keeps the host-side agreements */
#ifdef HAVE_NCCL
    const int gpu = e->dev->index;
    if (e->g->tp > 1) TP_CHECK(tp_comm_nccl_create(e->w->tp, gpu, "tp", &e->nccl_tp));
    if (e->g->pp > 1) {
        TP_CHECK(tp_comm_nccl_create(e->w->pp, gpu, "pp", &e->nccl_pp));
        TP_CHECK(tp_comm_nccl_connect_next(e->nccl_pp));
    }
    if (e->nccl_tp) e->tpc = e->nccl_tp;
    if (e->nccl_pp) e->ppc = e->nccl_pp;
    return TP_OK;
#else
    if (e->g->tp * e->g->pp > 1)
        return tp_error(TP_ERR_UNAVAILABLE, "this tpinfer was built without NCCL: a grid of several GPUs needs it");
    return TP_OK;
#endif
}

/* Whether the environment variable name is set to value. */
static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && !strcmp(v, value);
}

/* Sequences a step of T tokens holds at most. */
static int32_t step_seqs(const engine *e, int32_t T)
{
    return e->max_seqs < T ? e->max_seqs : T;
}

/* Logit rows a step of T tokens may compute: one per sampled sequence, and every prompt
 * token's where some request of this replica wants prompt rows (prompt logprobs, dumps). */
static int32_t logit_rows(const engine *e, int32_t T)
{
    const int32_t seqs = step_seqs(e, T);
    int prompt_rows = e->o->dump_logits != NULL;
    for (size_t i = 0; !prompt_rows && i < e->reqs.n; i++) {
        const req *r = &e->R[i];
        prompt_rows = r->runnable >= 0 && r->prompt_lp >= 0;
    }
    return prompt_rows ? seqs + T : seqs;
}

/* The schedulers' settings but for the blocks (n_blocks, 0 here) and --max-num-seqs. Where
 * every layer slides, the window: sequences give back the blocks behind it (from where the
 * backend reads it); a model with some full-attention layer keeps every block. */
static tp_sched_config sched_config(const engine *e)
{
    /* a dump holds every prompt token's logits: every one is computed, none taken from the cache */
    tp_sched_config sc = {(int32_t)e->o->kv_block_size, 0, e->max_seqs, e->max_batched, e->max_model_len,
                          e->o->prefix_caching && !e->o->dump_logits, 0, e->backend->window_align};
    const int64_t window = tp_model_config_window_of_all(&e->cfg);
    if (window < e->max_model_len) sc.window = (int32_t)window;
    return sc;
}

/* This replica's sequences (*n), the blocks they take at full length, prompt + max_tokens
 * (*need; behind a sliding window, those a decoding sequence holds at once), and their
 * prompts' full blocks (*prompt_blocks). */
static void full_length_blocks(const engine *e, int64_t *n, int64_t *need, int64_t *prompt_blocks)
{
    const tp_sched_config sc = sched_config(e);
    *n = *need = *prompt_blocks = 0;
    for (size_t i = 0; i < e->reqs.n; i++) {
        const req *r = &e->R[i];
        if (r->runnable < 0) continue;
        int64_t len = (int64_t)r->n_prompt + r->max_new;
        if (len > e->max_model_len) len = e->max_model_len;
        *n += r->n;
        *need += (int64_t)r->n * tp_sched_seq_blocks(&sc, len, 1);
        *prompt_blocks += r->n_prompt / sc.block_size;
    }
}

/* The default --max-num-seqs: on a large GPU as many of this replica's sequences as blocks
 * (one pipeline micro-batch's) hold at their full length, prompt + max_tokens, from 256 to
 * 1024 (on an H200, 8B's 1024 prompts of 2048 / 128 all at once preempted 92 sequences and
 * took 4 % longer than 256 at once; the cache holds ~400 of them whole); elsewhere 256; never
 * more than a micro-batch has (fewer graphs to record in the warm-up). */
static int32_t default_max_seqs(const engine *e, int large, int64_t blocks)
{
    const int64_t bs = e->o->kv_block_size;
    int64_t n, need, prompt_blocks;
    full_length_blocks(e, &n, &need, &prompt_blocks);
    /* with prefix caching, the blocks of prompts that start alike are held once (counted over
     * the first 4M prefixes, 64 MiB at most; a sizing, so done without where memory is short) */
    tp_prefix_count *pc = NULL;
    if (large && e->o->prefix_caching && !e->o->dump_logits && prompt_blocks > 0 &&
        tp_prefix_count_create((int32_t)bs, prompt_blocks < (INT64_C(1) << 22) ? prompt_blocks : INT64_C(1) << 22, &pc) != TP_OK)
        tp_error_clear();
    for (size_t i = 0; pc && i < e->reqs.n; i++) {
        const req *r = &e->R[i];
        if (r->runnable >= 0 && r->prompt_lp < 0) need -= tp_prefix_count_add(pc, r->prompt, r->n_prompt, r->n);
    }
    tp_prefix_count_destroy(pc);
    int32_t seqs = large ? tp_sched_fit_seqs(blocks, need, n, 256, 1024) : 256;
    const int64_t each = TP_CEIL_DIV(n, e->g->pp); /* sequences go to the micro-batches in turn */
    return each > 0 && each < seqs ? (int32_t)each : seqs;
}

/* Said at the end of a run where sequences were preempted: the cost, and the --max-num-seqs
 * that the KV cache holds at full length (vLLM warns of preemption likewise). Prompts that
 * share prefixes are counted whole here, so the count errs low. */
static void warn_preempted(const engine *e, int64_t preempted)
{
    int64_t n, need, prompt_blocks;
    full_length_blocks(e, &n, &need, &prompt_blocks);
    const int32_t fit = tp_sched_fit_seqs(e->blocks_per_engine, need / e->P, n / e->P, 1, INT32_MAX);
    char advice[160] = "", each[48] = "";
    if (e->P > 1) snprintf(each, sizeof each, " in each of %d micro-batches", e->P);
    if (fit < e->max_seqs)
        snprintf(advice, sizeof advice, " Where outputs run to max_tokens, --max-num-seqs %d avoids this;", (int)fit);
    tp_log(TP_LOG_WARN,
           "replica %d: %" PRId64 " sequence(s) were preempted (their KV blocks freed, their tokens computed again "
           "later) as the KV cache ran short: its %d blocks of %d tokens%s hold about %d of this run's sequences at "
           "full length (prompt + max_tokens), and --max-num-seqs let %d run at once%s.%s more room for the cache "
           "also avoids it (--gpu-memory-utilization, --kv-cache-memory on the CPU, or more GPUs with --tp or --pp)",
           e->g->dp_rank, preempted, (int)e->blocks_per_engine, (int)e->o->kv_block_size,
           e->P > 1 ? " a micro-batch" : "", (int)fit, (int)e->max_seqs, each, advice);
}

/* The KV cache's bytes on this rank: --kv-cache-memory (CPU), or on a GPU its share less
 * what is already taken (weights, workspace) and room for the step buffers (for
 * e->max_batched tokens and e->max_seqs sequences), the stage-input buffers and 256 MiB for
 * the libraries. */
static tp_status kv_budget(const engine *e, int on_gpu, int64_t *budget)
{
    *budget = e->o->kv_cache_memory;
    if (!on_gpu) return TP_OK;
    const int32_t T = e->max_batched;
    const int64_t steps = tp_step_buffers_bytes(&e->model, T, logit_rows(e, T), step_seqs(e, T),
                                                (int32_t)TP_CEIL_DIV(e->max_model_len, e->o->kv_block_size)) +
                          2 * (int64_t)T * e->model.dims.d * 4 + (INT64_C(256) << 20);
    *budget = (int64_t)((double)e->dev->total_bytes * e->o->gpu_memory_utilization) -
              (e->dev->total_bytes - e->dev->free_bytes) - e->model.weight_bytes - steps;
    if (*budget <= 0)
        return tp_error(TP_ERR_OOM,
                        "GPU %d: no memory left for the KV cache after %" PRId64 " bytes of weights and %" PRId64
                        " for the buffers of a %d-token step; raise --gpu-memory-utilization (now %.2f), lower "
                        "--max-num-batched-tokens, or split the model over more GPUs (--tp, --pp)",
                        e->dev->index, e->model.weight_bytes, steps, T, e->o->gpu_memory_utilization);
    return TP_OK;
}

/* --step-timeout, or the backend's default: 600 s on GPUs (a step of NCCL calls that waits
 * longer is a hang), none on the CPU (MPI's collectives, and steps of any length) */
static double watchdog_timeout(const engine *e)
{
    if (e->o->step_timeout >= 0) return e->o->step_timeout;
    return !strcmp(e->backend->name, "cuda") ? 600 : 0;
}

/* fn under the watchdog (--step-timeout), phase naming it in the watchdog's message (NULL:
 * the generation loop) and in TPINFER_TEST_STOP_AT (test_phase). A watchdog that cannot
 * start is said and gone without: the peers are on their way into the phase's collectives. */
static tp_status watched(engine *e, const char *phase, const char *test_phase, tp_status (*fn)(engine *))
{
    if (tp_watchdog_start(watchdog_timeout(e), e->g->rank, phase, &e->watchdog) != TP_OK) {
        tp_log(TP_LOG_WARN, "rank %d: %s; going on without a deadline", e->g->rank, tp_error_message());
        tp_error_clear();
    }
    if (test_phase) test_stop_at(e, test_phase);
    const tp_status st = fn(e);
    tp_watchdog_stop(e->watchdog);
    e->watchdog = NULL;
    return st;
}

static tp_status load(engine *e, int32_t *n_blocks)
{
    const tp_grid *g = e->g;
    /* first: the group's peers wait for this rank there. NCCL's creation (with its first
     * collective, where it connects the peers) has no deadline of its own */
    const tp_status comms = watched(e, "making the NCCL communicators", "comms", make_comms);
    if (comms != TP_OK) { /* said now: peers still inside NCCL's creation wait for this rank
                           * until their watchdog ends the job, before this status reaches main */
        tp_log(TP_LOG_ERROR, "rank %d: %s", e->g->rank, tp_error_message());
        return comms;
    }
    tp_shard_plan plan;
    TP_CHECK(tp_shard_plan_make(&e->cfg, g->tp, g->pp, g->tp_rank, g->pp_rank, &plan));
    TP_CHECK(tp_weights_open(e->o->model, &e->weights));
    if (g->rank == 0) (void)tp_model_warn_unused(&e->cfg, &e->weights);
    double t0 = now_s();
    test_term_at(e, "load");
    const tp_status loaded = tp_model_load(&e->model, &e->cfg, &plan, &e->weights, e->backend, weight_dtype(e),
                                           stop_requested);
    if (loaded != TP_OK && stop_signal) { /* not a failure: phases() stops every rank after the load */
        tp_error_clear();
        return TP_OK;
    }
    TP_CHECK(loaded);
    double s = now_s() - t0;
    e->load_seconds = s;
    tp_log(TP_LOG_DEBUG, "loaded %" PRId64 " bytes of weights in %.2f s (%.2f GB/s)", e->model.weight_bytes, s,
           s > 0 ? (double)e->model.weight_bytes / s / 1e9 : 0.0);
    int64_t per_token = tp_shard_plan_kv_bytes_per_token(&e->cfg, &plan, (int64_t)tp_dtype_size(e->backend->act_dtype));
    const int on_gpu = !strcmp(e->backend->name, "cuda") && e->dev->total_bytes > 0;
    /* as vLLM's offline defaults on GPUs of 70 GiB or more: prefill steps of 16384 tokens (its
     * GEMMs are as fast per token, and a batch of 128 prompts of 128 tokens is then one step,
     * with no mixed step after it) and up to 1024 sequences at once (decode steps of 1024
     * rows: on an H200, 8B's 1024 prompts of 128 / 128 took 7.4 s against 8.3 at 256; fewer
     * where the KV cache holds fewer, below); else 8192 and 256. TPINFER_LARGE_GPU_DEFAULTS=1:
     * the large GPU's on any device (tests) */
    const int large = (on_gpu && tp_device_large(e->dev)) || env_is("TPINFER_LARGE_GPU_DEFAULTS", "1");
    e->max_batched = (int32_t)e->o->max_num_batched_tokens;
    if (!e->max_batched) e->max_batched = large ? 16384 : 8192;
    e->max_seqs = (int32_t)e->o->max_num_seqs;
    if (!e->max_seqs) e->max_seqs = large ? 1024 : 256;
    int64_t budget;
    TP_CHECK(kv_budget(e, on_gpu, &budget));
    int64_t per_block = per_token * e->o->kv_block_size;
    int64_t nb = per_block > 0 ? budget / per_block : 0;
    e->seqs_fitted = !e->o->max_num_seqs && large;
    if (!e->o->max_num_seqs) {
        const int32_t first = e->max_seqs;
        e->max_seqs = default_max_seqs(e, large, nb / g->pp);
        /* step buffers for fewer sequences leave the KV cache more room (logit rows) */
        if (e->max_seqs < first) TP_CHECK(kv_budget(e, on_gpu, &budget));
        nb = per_block > 0 ? budget / per_block : 0;
    }
    /* more blocks than every engine's --max-num-seqs sequences of --max-model-len tokens
     * could hold would never be used */
    const tp_sched_config sc = sched_config(e);
    int64_t useful = (int64_t)g->pp * e->max_seqs * tp_sched_seq_blocks(&sc, e->max_model_len, e->max_batched);
    if (nb > useful) nb = useful;
    *n_blocks = nb > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)nb;
    return TP_OK;
}

int eng_wants_prompt_rows(const engine *e, const req *r, int32_t choice)
{
    return choice == 0 && (r->prompt_lp >= 0 || e->o->dump_logits);
}

static tp_status add_sequences(engine *e)
{
    /* this replica's requests that run; each of its n choices is a sequence, dealt
     * round-robin to the engines */
    int64_t count = 0;
    for (size_t i = 0; i < e->reqs.n; i++)
        if (e->R[i].runnable >= 0) count += e->R[i].n;
    e->S_ = calloc((size_t)(count ? count : 1), sizeof *e->S_);
    if (!e->S_) return tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; i < e->reqs.n; i++) {
        req *r = &e->R[i];
        if (r->runnable < 0) continue;
        r->first_seq = e->n_seqs;
        for (int32_t j = 0; j < r->n; j++) {
            int64_t k = e->n_seqs++;
            e->S_[k].req = (int64_t)i;
            e->S_[k].choice = j;
            tp_status st = tp_scheduler_add(e->S[k % e->P], k, r->prompt, r->n_prompt, r->max_new,
                                            eng_wants_prompt_rows(e, r, j) ? TP_SCHED_NO_PREFIX_HITS : 0);
            if (st != TP_OK) return st; /* the checks of eng_prepare_request make this internal */
        }
        e->prompt_tokens += (int64_t)r->n_prompt * r->n;
    }
    return TP_OK;
}

/* A sequence just popped: its request's cached prompt tokens, as its first choice read them. */
void eng_note_cached(engine *e, const tp_scheduler *s, int64_t key)
{
    if (e->S_[key].choice == 0) e->R[e->S_[key].req].n_cached = tp_scheduler_cached_tokens(s, key);
}

static tp_status make_schedulers(engine *e, int32_t n_blocks)
{
    const tp_options *o = e->o;
    e->P = e->g->pp;
    e->blocks_per_engine = n_blocks / e->P;
    int32_t bs = (int32_t)o->kv_block_size;
    int32_t need = (int32_t)TP_CEIL_DIV(e->max_model_len, bs); /* block table columns */
    tp_sched_config sc = sched_config(e);
    const int64_t least = tp_sched_seq_blocks(&sc, e->max_model_len, 1);
    char behind[96] = "";
    if (sc.window > 0) snprintf(behind, sizeof behind, " (behind its sliding window of %d)", (int)sc.window);
    if (e->blocks_per_engine < least)
        return tp_error(TP_ERR_INVALID_ARG,
                        "the KV cache holds %d blocks of %d tokens per pipeline micro-batch, fewer than the %" PRId64
                        " that one sequence of --max-model-len %d needs%s; give more --kv-cache-memory (CPU), more "
                        "--gpu-memory-utilization (GPU), or a smaller --max-model-len",
                        e->blocks_per_engine, bs, least, e->max_model_len, behind);
    e->S = calloc((size_t)e->P, sizeof *e->S);
    e->B = calloc((size_t)e->P, sizeof *e->B);
    e->inflight = calloc((size_t)e->P, sizeof *e->inflight);
    e->entered = calloc((size_t)e->P, sizeof *e->entered);
    if (!e->S || !e->B || !e->inflight || !e->entered) return tp_error(TP_ERR_OOM, "out of memory");
    sc.n_blocks = e->blocks_per_engine;
    for (int p = 0; p < e->P; p++) TP_CHECK(tp_scheduler_create(&sc, &e->S[p]));
    TP_CHECK(add_sequences(e));

    const tp_model_dims *d = &e->model.dims;
    int32_t T = e->max_batched;
    int32_t seqs = step_seqs(e, T);
    e->max_rows = logit_rows(e, T); /* sampling rows (+ prompt rows: prompt logprobs, dumps) */
    TP_CHECK(tp_kv_cache_create(&e->model, n_blocks, bs, e->backend->act_dtype, &e->kv));
    TP_CHECK(tp_step_buffers_create(&e->model, T, e->max_rows, seqs, need, &e->buf));
    e->buf.use_graphs = e->pad_decode;
    e->buf.prune_last = e->prune_last;
    void *p1 = NULL, *p2 = NULL;
    TP_CHECK(e->backend->ops->alloc(e->backend, (size_t)T * (size_t)d->d * sizeof(float), &p1));
    e->rx = tp_tensor_make(p1, TP_DTYPE_F32, T, d->d);
    TP_CHECK(e->backend->ops->alloc(e->backend, (size_t)T * (size_t)d->d * sizeof(float), &p2));
    e->rdelta = tp_tensor_make(p2, TP_DTYPE_F32, T, d->d);

    e->slot = malloc((size_t)T * sizeof *e->slot);
    e->rows = malloc((size_t)e->max_rows * sizeof *e->rows);
    e->extra_seq = malloc((size_t)T * sizeof *e->extra_seq);
    e->block_table = malloc((size_t)seqs * (size_t)need * sizeof *e->block_table);
    e->sync = malloc(((size_t)2 * (size_t)T + 1) * sizeof *e->sync);
    e->finish = malloc((size_t)T);
    e->take = malloc((size_t)T * sizeof *e->take);
    if (!e->slot || !e->rows || !e->extra_seq || !e->block_table || !e->sync || !e->finish || !e->take)
        return tp_error(TP_ERR_OOM, "out of memory");
    for (int k = 0; k < 2; k++) {
        e->ahead[k].keys = malloc((size_t)e->max_rows * sizeof *e->ahead[k].keys);
        e->ahead[k].ids = malloc((size_t)e->max_rows * sizeof *e->ahead[k].ids);
        e->ahead[k].sout = malloc((size_t)e->max_rows * sizeof *e->ahead[k].sout);
        if (!e->ahead[k].keys || !e->ahead[k].ids || !e->ahead[k].sout) return tp_error(TP_ERR_OOM, "out of memory");
    }
    e->is_sampler = e->g->pp_rank == e->g->pp - 1 && e->g->tp_rank == 0;
    /* every rank: over tp, steps enqueued ahead are sampled by each rank of the group */
    e->srows = malloc((size_t)e->max_rows * sizeof *e->srows);
    e->sout = malloc((size_t)e->max_rows * sizeof *e->sout);
    if (!e->srows || !e->sout) return tp_error(TP_ERR_OOM, "out of memory for %d rows' sampling rules", e->max_rows);
    if (e->is_sampler) {
        TP_CHECK(tp_sampler_create((int32_t)e->cfg.vocab_size, &e->sampler));
        e->logits_host = malloc((size_t)e->max_rows * (size_t)e->cfg.vocab_size * sizeof(float));
        e->top = malloc(TP_MAX_LOGPROBS * sizeof *e->top);
        if (!e->logits_host || !e->top) return tp_error(TP_ERR_OOM, "out of memory for %d rows of logits", e->max_rows);
    }
    return TP_OK;
}

/* What this rank's environment asks (the replica's ranks then agree): the warm-up, on by
 * default where the backend records graphs (TPINFER_WARMUP=0 or 1 overrides), cuBLASLt tuning
 * in it unless TPINFER_GEMM_TUNE=0; the host sampler for every row (TPINFER_SAMPLE_ON_HOST=1);
 * decode steps padded as graphs (the backend's graphs, unless --enforce-eager or pp > 1;
 * TPINFER_PAD_DECODE=1 pads them also on a backend without graphs: the tests check on the CPU
 * that padding changes no result); the last layer pruned (unless TPINFER_PRUNE_LAST=0); steps
 * enqueued ahead where they can be (unless TPINFER_OVERLAP=0). */
static void env_wanted(engine *e)
{
    const char *warm = getenv("TPINFER_WARMUP");
    e->warm = warm ? strcmp(warm, "0") != 0 : e->backend->ops->graph_begin != NULL;
    e->tune = !env_is("TPINFER_GEMM_TUNE", "0");
    e->warm_first = !env_is("TPINFER_WARMUP_FIRST", "0");
    e->sample_on_host = env_is("TPINFER_SAMPLE_ON_HOST", "1");
    e->pad_decode = !e->o->enforce_eager && e->g->pp == 1 &&
                    (e->backend->ops->graph_begin || env_is("TPINFER_PAD_DECODE", "1"));
    e->prune_last = !env_is("TPINFER_PRUNE_LAST", "0");
    e->overlap = !env_is("TPINFER_OVERLAP", "0");
    e->test_skew = test_hook_at(e, "TPINFER_TEST_SKEW_AT", "read");
}

// ----------------------------------------------------------------------------

static void engine_free(engine *e)
{
    tp_ids_free(&e->encode_scratch);
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
        tp_comm_destroy(e->nccl_tp);
        tp_comm_destroy(e->nccl_pp);
        tp_backend_destroy(e->backend);
    }
    tp_weights_free(&e->weights);
    for (size_t i = 0; e->R && i < e->reqs.n; i++) {
        req *r = &e->R[i];
        free(r->prompt);
        free(r->error_message);
        for (int32_t j = 0; r->choices && j < r->n; j++) tp_choice_free(&r->choices[j]);
        free(r->choices);
        eng_free_cursors(r);
        free(r->plp);
        free(r->plp_top);
        free(r->dump_prompt);
        free(r->dump_gen);
        free(r->bad_ids);
        free(r->bad_len);
    }
    free(e->R);
    free(e->S_);
    free(e->done_bits);
    free(e->exchange_heads);
    tp_requests_free(&e->reqs);
    tp_chat_template_destroy(e->tpl);
    tp_tokenizer_destroy(e->tok);
    tp_sampler_destroy(e->sampler);
    tp_guide_destroy(e->guide);
    free(e->guided);
    tp_collector_destroy(e->collector);
    free(e->logits_host);
    free(e->srows);
    free(e->sout);
    free(e->stokens);
    free(e->ban);
    free(e->top);
    free(e->slot);
    free(e->rows);
    free(e->extra_seq);
    free(e->block_table);
    free(e->sync);
    free(e->finish);
    free(e->take);
    for (int k = 0; k < 2; k++) {
        free(e->ahead[k].keys);
        free(e->ahead[k].ids);
        free(e->ahead[k].sout);
    }
}

/* A phase boundary: every rank brings its status; all learn whether any failed. */
static tp_status agree(engine *e, tp_status mine, int *n_failed)
{
    int n_usage = 0;
    TP_CHECK(tp_mpi_agree(e->w->world, mine, n_failed, &n_usage));
    if (*n_failed == 0) return TP_OK;
    return mine != TP_OK ? mine : n_usage ? TP_ERR_INVALID_ARG : TP_ERR_FORMAT;
}

/* Whether a rank has had a stop signal, asked of every rank at the startup's long phases'
 * ends (reading and tokenizing the input, loading the weights), which a signal cuts short:
 * then every rank stops there as at the end of a step, and the job exits 3 in seconds,
 * not after the load. */
static int stopped_everywhere(engine *e)
{
    int32_t mine = stop_signal != 0, any = 0;
    if (tp_comm_all_reduce_sum(e->w->world, &mine, &any, 1, TP_DTYPE_I32, NULL) != TP_OK) {
        tp_error_clear(); /* the next collective says what is wrong */
        any = mine;
    }
    if (any) e->stopping = 1;
    return any != 0;
}

static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}


static tp_status phases(engine *e, int *n_failed, int *must_abort)
{
    const tp_options *o = e->o;
    tp_status st = TP_OK;
    if (o->dump_logits && mkdir(o->dump_logits, 0755) != 0 && errno != EEXIST)
        st = tp_error(TP_ERR_IO, "cannot create --dump-logits directory %s: %s", o->dump_logits, strerror(errno));
    if (st == TP_OK) st = setup(e);
    TP_CHECK(agree(e, st, n_failed));
    st = e->w->world->size > 1 ? same_model(e) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    st = same_count(e);
    TP_CHECK(agree(e, st, n_failed));
    /* at dp > 1 rank 0 gathers every replica's ids, from their first ranks */
    st = e->g->dp > 1 && e->g->tp_rank == 0 && e->g->pp_rank == 0 ? tp_share_gather_ids(&e->reqs, e->w->dp, o->input)
                                                                   : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    warn_unknown_fields(e);

    st = e->g->rank == 0 ? open_output(e) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    TP_CHECK(share_done(e));
    st = o->resume ? reread_to_go(e) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    st = prepare_all(e);
    if (e->abort_startup) { /* peers may be in an exchange of prepare_all */
        *must_abort = 1;
        *n_failed = 1;
        return st;
    }
    TP_CHECK(agree(e, st, n_failed));
    TP_CHECK(count_runnable(e));
    if (e->g->rank == 0) {
        if (o->resume && tp_output_done_count(e->out))
            tp_log_info0("resuming: %" PRId64 " requests are done already, %" PRId64 " to go",
                         tp_output_done_count(e->out), e->n_index);
        st = tp_progress_create(e->n_index, o->status_file, isatty(2), o->progress_interval, &e->progress);
    }
    TP_CHECK(agree(e, st, n_failed));
    if (stopped_everywhere(e)) return TP_OK;
    st = tp_collector_create(e->w, is_sender(e), e->out, e->progress,
                             &e->collector);
    TP_CHECK(agree(e, st, n_failed));
    st = write_error_records(e);
    TP_CHECK(agree(e, st, n_failed));

    int32_t n_blocks = 0;
    /* every rank's backend first: the communicators made next wait for every rank of a group */
    if (e->any_runnable) split_threads(e->g);
    st = e->any_runnable ? make_backend(e) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    st = e->any_runnable ? same_backend(e) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    tp_collector_set_timeout(e->collector, e->any_runnable ? watchdog_timeout(e) : 0);
    st = e->any_runnable ? load(e, &n_blocks) : TP_OK;
    TP_CHECK(agree(e, st, n_failed));
    if (stopped_everywhere(e)) return TP_OK;
    if (e->any_runnable) {
        TP_CHECK(report_load(e));
        /* every rank of a replica must hold the same number of blocks and take the same
         * steps, of the same sizes (the warm-up's too, whatever each rank's environment
         * says): the smallest of each, but the host sampler where any rank asks for it */
        env_wanted(e);
        enum { N_AGREED = 10 };
        int32_t mine[N_AGREED] = {n_blocks, e->max_batched, e->warm, e->tune, !e->sample_on_host, e->pad_decode,
                                  e->prune_last, e->overlap, e->max_seqs, e->warm_first};
        int32_t *all = malloc((size_t)e->w->replica->size * sizeof mine);
        if (!all) return tp_error(TP_ERR_OOM, "out of memory");
        st = tp_comm_all_gather(e->w->replica, mine, all, N_AGREED, TP_DTYPE_I32, NULL);
        for (int i = 0; i < e->w->replica->size && st == TP_OK; i++)
            for (int k = 0; k < N_AGREED; k++)
                mine[k] = all[N_AGREED * i + k] < mine[k] ? all[N_AGREED * i + k] : mine[k];
        free(all);
        n_blocks = mine[0];
        e->max_batched = mine[1];
        e->warm = mine[2];
        e->tune = mine[3];
        e->sample_on_host = !mine[4];
        e->pad_decode = mine[5];
        e->prune_last = mine[6];
        e->overlap = mine[7];
        e->max_seqs = mine[8];
        e->warm_first = mine[9];
        if (st == TP_OK && e->seqs_fitted && e->g->tp_rank == 0 && e->g->pp_rank == 0)
            tp_log(TP_LOG_INFO,
                   "replica %d: %d sequences at once (the default --max-num-seqs on this GPU: as many of the run's "
                   "sequences as the KV cache holds at full length, prompt + max_tokens, from 256 to 1024, at most "
                   "the run's own)%s",
                   e->g->dp_rank, (int)e->max_seqs, e->g->pp > 1 ? ", in each pipeline micro-batch" : "");
        if (st == TP_OK) st = make_schedulers(e, n_blocks);
        TP_CHECK(agree(e, st, n_failed));
        /* the warm-up's steps are collectives of the whole group, under the watchdog as the
         * loop's (each step beats) */
        st = watched(e, "the warm-up", "warm-up", eng_warm_up);
        if (st != TP_OK) { /* peers may be waiting in a collective of the warm-up */
            *must_abort = 1;
            *n_failed = 1;
            return st;
        }
        e->t0 = now_s();
        /* a peer that stops (or hangs) would leave this rank in a collective for good */
        st = watched(e, NULL, NULL, eng_run_loop);
        e->t_loop_end = now_s();
        if (st != TP_OK) { /* peers may be waiting in a collective of the loop */
            *must_abort = 1;
            *n_failed = 1;
            return st;
        }
    }
    return TP_OK;
}

/* This run's error records, over every replica. */
static tp_status count_request_errors(engine *e, int64_t *count)
{
    int64_t mine = 0;
    for (size_t i = 0; is_sender(e) && i < e->reqs.n; i++) mine += e->R[i].index >= 0 && e->R[i].error_code;
    int32_t m = mine > INT32_MAX ? INT32_MAX : (int32_t)mine, all = 0;
    TP_CHECK(tp_comm_all_reduce_sum(e->w->world, &m, &all, 1, TP_DTYPE_I32, NULL));
    *count = all;
    return TP_OK;
}

tp_status tp_generate(const tp_options *o, tp_mpi_world *w, const tp_device_info *dev, int *n_failed,
                      int *must_abort, int64_t *n_request_errors, int *interrupted)
{
    engine e;
    memset(&e, 0, sizeof e);
    e.o = o;
    e.w = w;
    e.g = &w->grid;
    e.dev = dev;
    *must_abort = 0;
    *n_failed = 0;
    *n_request_errors = 0;
    *interrupted = 0;
    stop_signal = 0;
    catch_stop_signals();

    tp_status st = phases(&e, n_failed, must_abort);
    if (st == TP_OK && !e.collector) { /* stopped by a signal before the collector was made */
        *interrupted = e.stopping;
    } else if (st == TP_OK) {
        int any = 0;
        st = tp_collector_finish(e.collector, e.stopping, &any);
        if (st != TP_OK) {
            *must_abort = 1;
            *n_failed = 1;
        }
        *interrupted = e.stopping || any;
        /* the exit status counts every replica's error records (each sender knows its own);
         * a rank whose finish failed ends the job instead (and so its peers here) */
        if (st == TP_OK) st = count_request_errors(&e, n_request_errors);
    }
    const double t_finished = now_s();
    if (w->grid.rank == 0 && e.out) {
        tp_status cs = tp_output_close(e.out, st == TP_OK && !*interrupted);
        e.out = NULL;
        if (st == TP_OK && cs != TP_OK) st = cs;
    }
    /* the run's end, which its throughput counts: the last results written (the collector
     * done), then the output synced and its manifest replaced */
    if (w->grid.rank == 0 && e.t0 > 0 && e.t_loop_end > 0)
        tp_log(TP_LOG_DEBUG, "the loop ended at %.1f ms; the results were written by %.1f ms, the output closed by "
               "%.1f ms", 1e3 * (e.t_loop_end - e.t0), 1e3 * (t_finished - e.t0), 1e3 * (now_s() - e.t0));
    if (w->grid.rank == 0 && e.progress) {
        const tp_status fin = tp_progress_finish(e.progress, st != TP_OK ? TP_PROGRESS_FAILED
                                                 : *interrupted ? TP_PROGRESS_CANCELLED : TP_PROGRESS_COMPLETED);
        if (fin != TP_OK && st == TP_OK) { /* the results are written; the status file is a view of them */
            tp_log(TP_LOG_WARN, "the status file's final state was not written: %s", tp_error_message());
            tp_error_clear();
        }
        tp_progress_destroy(e.progress);
        e.progress = NULL;
    } else if (w->grid.rank == 0 && e.status_early && st != TP_OK) { /* ended before the requests were counted */
        /* (the run's own error stays the message main reports: this one is not cleared) */
        if (tp_progress_write_early(o->status_file, 1) != TP_OK)
            tp_log(TP_LOG_WARN, "the status file %s could not be set to \"failed\"; it still says \"validating\"",
                   o->status_file);
    }
    if (st == TP_OK) {
        if (e.done_errors && w->grid.rank == 0)
            tp_log(TP_LOG_WARN, "--resume: the output holds %d error record(s) from an earlier run; the exit status "
                   "counts them", (int)e.done_errors);
        *n_request_errors += e.done_errors;
        double dt = e.t0 > 0 ? now_s() - e.t0 : 0;
        int64_t steps = 0, preempted = 0, cached = 0;
        for (int p = 0; e.S && p < e.P; p++) {
            tp_sched_stats ss;
            tp_scheduler_stats(e.S[p], &ss);
            steps += ss.steps;
            preempted += ss.preemptions;
            cached += ss.cached_tokens;
        }
        /* each replica's first rank speaks for it: one replica's cache may run short and
         * another's not */
        const int says = e.g->tp_rank == 0 && e.g->pp_rank == 0, replica = e.g->dp_rank;
        if (says)
            tp_log(TP_LOG_INFO, "replica %d: %" PRId64 " prompt + %" PRId64 " generated tokens in %.2f s: %.1f "
                   "generated tok/s; %" PRId64 " steps, %" PRId64 " preempted",
                   replica, e.prompt_tokens, e.generated_tokens, dt, dt > 0 ? (double)e.generated_tokens / dt : 0.0,
                   steps, preempted);
        if (says && preempted > 0) warn_preempted(&e, preempted);
        if (says && cached > 0)
            tp_log(TP_LOG_INFO, "replica %d: %" PRId64 " prompt tokens read from the prefix cache instead of "
                   "computed (of %" PRId64 " prompt tokens; a sequence preempted and admitted again counts again)",
                   replica, cached, e.prompt_tokens);
        if (e.is_sampler && e.guide_dead_ends > 0) /* the sampler met them: the last stage's */
            tp_log(TP_LOG_WARN, "replica %d: %" PRId64 " guided choice(s) reached a point where their guide allowed no "
                   "next token and ended there, unfinished, as \"stop\" (the first ones named above)",
                   replica, e.guide_dead_ends);
        /* what the loop spends outside forward steps (scheduling, sampling, output) is time
         * the GPU waits: per step, so a change to the host path shows in any run */
        const double *h = e.host_s, per = e.forward_steps > 0 ? 1e3 / (double)e.forward_steps : 0;
        const double forward = e.forward_seconds + h[HOST_ENQUEUE] + h[HOST_WAIT];
        if (e.forward_steps > 0 && dt > 0)
            tp_log_info0("rank 0: %.1f%% of the loop in forward steps (%.3f ms each, GPU wait included); "
                         "%.3f ms of host work per step besides", 100.0 * forward / dt, per * forward,
                         per * (dt - forward));
        if (w->grid.rank == 0 && h[HOST_WAIT] > 0)
            tp_log(TP_LOG_DEBUG, "rank 0, steps enqueued ahead, ms a step: schedule %.3f, rules %.3f, enqueue %.3f, "
                   "wait %.3f, tokens to text %.3f, apply %.3f, output %.3f", per * h[HOST_SCHEDULE],
                   per * h[HOST_RULES], per * h[HOST_ENQUEUE], per * h[HOST_WAIT], per * h[HOST_TOKENS],
                   per * h[HOST_APPLY], per * h[HOST_POLL]);
    }
    if (e.is_sampler)
        tp_log(TP_LOG_DEBUG, "tokens chosen in %" PRId64 " steps by the device's argmax, %" PRId64 " by its sample op, "
               "%" PRId64 " by the host sampler", e.steps_by_path[0], e.steps_by_path[1], e.steps_by_path[2]);
    engine_free(&e);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    return st;
}
