/*
 * engine_step.c: the step loop (phase 4 of a run). Each tick schedules a batch, runs it
 * (over pp the stages each run the batch their engine started), chooses its tokens (on the
 * device: argmax or the sample op, by the rules each row's request sets; or on the host),
 * and applies them: text, stops, finished requests. Where every step's tokens are chosen on
 * the device, each step is enqueued before the one before is read (steps ahead).
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine_internal.h"
#include "log.h"
#include "st_write.h"

// ----------------------------------------------------------------------------
// phase 4: the step loop

static int stage_engine(const engine *e, int64_t tick, int stage)
{
    int64_t t = tick - stage;
    if (t < 0) return -1;
    int p = (int)(t % e->P);
    return e->inflight[p] && e->entered[p] == t ? p : -1;
}

/* The scheduler's step, with engine p's block ids moved to its part of the cache. Logit
 * rows: first one per sampling sequence, then (prompt logprobs, dumps) the prompt tokens. */
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
    memcpy(e->rows, b->logit_token, (size_t)b->n_logits * sizeof(int32_t));
    int32_t n = b->n_logits;
    e->n_extra = 0;
    for (int32_t t = 0; t < b->n_tokens && n < e->max_rows; t++) {
        const seq *q = &e->S_[b->seq_key[b->seq[t]]];
        const req *r = &e->R[q->req];
        if (b->pos[t] < r->n_prompt && eng_wants_prompt_rows(e, r, q->choice)) {
            e->extra_seq[e->n_extra++] = t;
            e->rows[n++] = t;
        }
    }
    s->n_logits = n;
    s->logit_rows = e->rows;
    s->take = NULL;
}

static int is_eos(const engine *e, int32_t t)
{
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return 1;
    return 0;
}

static int is_stop_token(const req *r, int32_t t)
{
    for (int32_t i = 0; i < r->in->p.n_stop_token_ids; i++)
        if (r->in->p.stop_token_ids[i] == t) return 1;
    return 0;
}

/* Sampler rank: what the prompt rows of this step say (prompt logprobs, dumps). */
static tp_status keep_prompt_rows(engine *e, const tp_sched_batch *b)
{
    const int64_t V = e->cfg.vocab_size;
    for (int32_t k = 0; k < e->n_extra; k++) {
        int32_t t = e->extra_seq[k];
        req *r = &e->R[e->S_[b->seq_key[b->seq[t]]].req];
        int32_t pos = b->pos[t];
        if (pos != r->n_plp) continue; /* recomputed after a preemption: kept already */
        const float *lg = e->logits_host + (size_t)(b->n_logits + k) * (size_t)V;
        if (e->o->dump_logits) {
            if (!r->dump_prompt) r->dump_prompt = malloc((size_t)r->n_prompt * (size_t)V * sizeof(float));
            if (!r->dump_prompt) return tp_error(TP_ERR_OOM, "out of memory keeping logits for --dump-logits");
            memcpy(r->dump_prompt + (size_t)pos * (size_t)V, lg, (size_t)V * sizeof(float));
        }
        if (r->prompt_lp >= 0 && pos + 1 < r->n_prompt) {
            if (!r->plp) {
                r->plp = calloc((size_t)r->n_prompt, sizeof *r->plp);
                r->plp_top = calloc((size_t)r->n_prompt * (size_t)(r->prompt_lp + 1), sizeof *r->plp_top);
                if (!r->plp || !r->plp_top) return tp_error(TP_ERR_OOM, "out of memory for prompt logprobs");
            }
            tp_prompt_logprob *pl = &r->plp[pos + 1];
            pl->id = r->prompt[pos + 1];
            pl->top = r->plp_top + (size_t)(pos + 1) * (size_t)(r->prompt_lp + 1);
            tp_logprob_of(lg, (int32_t)V, pl->id, r->prompt_lp, &pl->logprob, &pl->rank, pl->top);
        }
        r->n_plp++;
    }
    return TP_OK;
}

static tp_status write_dump(engine *e, req *r);

/* A repetition, presence or frequency penalty: the rule reads the tokens chosen so far. */
static int has_penalties(const tp_sampling_params *p)
{
    return p->repetition_penalty != 1.0 || p->presence_penalty != 0.0 || p->frequency_penalty != 0.0;
}

/* guided_choice or a JSON object: which tokens may come depends on the text so far */
static int is_guided(const req *r) { return r->in->p.n_choices > 0 || r->in->p.json_object; }

/* The sampling rule reads the values of the tokens chosen so far (penalties, guided decoding,
 * bad words), not only their count: a step enqueued ahead samples such a row only once the
 * step before is read. */
static int rule_reads_output(const req *r)
{
    return has_penalties(&r->sp) || is_guided(r) || r->in->p.n_bad_words > 0;
}

/* logit_bias, allowed_token_ids, guided decoding or bad_words: the rule edits the logits first */
static int has_logit_edits(const req *r)
{
    const tp_request_params *p = &r->in->p;
    return p->n_bias > 0 || p->n_allowed_token_ids > 0 || is_guided(r) || p->n_bad_words > 0;
}

/* Guided decoding: the ids that may follow the n_out tokens of out (*ids, *n); where none may
 * (the text is whole and the ids that end it are its only way on, or it left the rule), the
 * end tokens. A JSON object's set comes as the guide keeps it: where most of the vocabulary
 * may come (inside a string), the few ids that may not (*negated), which is what the sampler
 * is sent, unless the row bans ids of its own (negate 0). Made on first use: the tokenizer's
 * pieces take a while. */
#define GUIDE_DEAD_ENDS_NAMED 5

static tp_status guided_ids(engine *e, req *r, int32_t choice, const int32_t *out, int32_t n_out, int negate,
                            const int32_t **ids, int32_t *n, int *negated)
{
    const int32_t V = (int32_t)e->cfg.vocab_size;
    if (!e->guide) {
        tp_guide *g;
        TP_CHECK(tp_guide_create(e->tok, V, e->eos, e->n_eos, &g));
        e->guided = malloc((size_t)tp_guide_max_allowed(g) * sizeof *e->guided);
        if (!e->guided) {
            tp_guide_destroy(g);
            return tp_error(TP_ERR_OOM, "out of memory for guided decoding");
        }
        e->guide = g;
    }
    const tp_request_params *p = &r->in->p;
    *ids = e->guided;
    *negated = 0;
    if (p->json_object) {
        if (!r->guide_cursor && !(r->guide_cursor = calloc((size_t)r->n, sizeof *r->guide_cursor)))
            return tp_error(TP_ERR_OOM, "out of memory for guided JSON");
        tp_guide_cursor **cursor = &r->guide_cursor[choice];
        TP_CHECK(tp_guide_json_ids(e->guide, p->schema, p->json_compact, cursor, out, n_out, ids, n, negated));
        if (*negated && negate) return TP_OK;
        if (*negated) {
            TP_CHECK(tp_guide_allowed_json(e->guide, p->schema, p->json_compact, cursor, out, n_out, e->guided, n));
            *ids = e->guided;
            *negated = 0;
        }
    } else {
        TP_CHECK(tp_guide_allowed(e->guide, p->choices, p->n_choices, out, n_out, e->guided, n));
    }
    if (*n == 0) { /* a dead end: no token writes what the guide wants next */
        if (++e->guide_dead_ends <= GUIDE_DEAD_ENDS_NAMED) /* a million alike would drown the log: the rest counted */
            tp_log(TP_LOG_WARN, "request %s (choice %d): after %d generated tokens its guided decoding (schema, regex "
                   "or choices) allows no next token (a string whose pattern and lengths leave none, or text this "
                   "vocabulary cannot write); the text ends there, unfinished, with finish_reason \"stop\"%s",
                   r->in->id, (int)choice, (int)n_out,
                   e->guide_dead_ends == GUIDE_DEAD_ENDS_NAMED ? " (later ones are counted at the end, not named)" : "");
        memcpy(e->guided, e->eos, (size_t)e->n_eos * sizeof *e->guided);
        *ids = e->guided;
        *n = e->n_eos;
    }
    return TP_OK;
}

/* A request whose tokens the device's argmax can choose: greedy, no logprobs, penalties,
 * min_tokens or logit edits. */
static int plain_greedy(const req *r)
{
    const tp_sampling_params *p = &r->sp;
    int greedy = p->temperature < 1e-5 || p->top_k == 1;
    return greedy && !r->in->p.has_logprobs && !r->min_tokens && !has_penalties(p) && !has_logit_edits(r);
}

/* A step whose every sampling row is plain greedy (and no prompt rows or dumps) chooses its
 * tokens on the device: only ids come back. */
static int argmax_possible(const engine *e)
{
    return !e->n_extra && !e->o->dump_logits && tp_model_can_argmax(&e->model);
}

static int device_greedy(const engine *e, const tp_sched_batch *b)
{
    /* decided alike on every rank of the last stage: at tp > 1 they all take part */
    if (!argmax_possible(e)) return 0;
    for (int32_t i = 0; i < b->n_logits; i++)
        if (!plain_greedy(&e->R[e->S_[b->seq_key[b->logit_seq[i]]].req])) return 0;
    return 1;
}

/* Sampler rank: a step whose rows need no logits on the host (no prompt rows or dumps) is
 * sampled by the backend's sample op; TPINFER_SAMPLE_ON_HOST=1 keeps the host sampler. */
static int device_sample(const engine *e)
{
    return !e->sample_on_host && !e->n_extra && !e->o->dump_logits && tp_model_can_sample(&e->model);
}

static tp_status choice_of(engine *e, req *r, int32_t j, tp_choice **out);

/* The random stream of choice j of a request: choice 0 has the request's own, so n = 1 draws
 * what a single-choice request draws. */
static uint64_t choice_seed(const req *r, int32_t j)
{
    return j ? tp_sampler_request_seed(r->sp.seed, "choice") + (uint64_t)j : r->sp.seed;
}

/* min_tokens: before n_out tokens reach it, the end tokens cannot be drawn. */
static int bans_end_tokens(const engine *e, const req *r, int32_t n_out)
{
    return n_out < r->min_tokens && (e->n_eos || r->in->p.n_stop_token_ids);
}

/* min_tokens' end tokens, banned before it: the model's EOS ids, then the line's stop_token_ids */
static int32_t n_end_tokens(const engine *e, const req *r) { return e->n_eos + r->in->p.n_stop_token_ids; }

static int32_t end_tokens(const engine *e, const req *r, int32_t *dst)
{
    if (e->n_eos) memcpy(dst, e->eos, (size_t)e->n_eos * sizeof(int32_t));
    if (r->in->p.n_stop_token_ids)
        memcpy(dst + e->n_eos, r->in->p.stop_token_ids, (size_t)r->in->p.n_stop_token_ids * sizeof(int32_t));
    return n_end_tokens(e, r);
}

/* bad_words as vLLM tokenizes them: each word without its leading white space, and with one
 * space before it where that spells it with another first token in as many tokens (the
 * word in mid-text); made on first use. */
static tp_status bad_words_of(engine *e, req *r)
{
    if (r->bad_ready) return TP_OK;
    const tp_request_params *p = &r->in->p;
    tp_ids all = {0}, one = {0};
    int32_t *len = malloc(2 * (size_t)p->n_bad_words * sizeof *len);
    tp_status st = len ? TP_OK : tp_error(TP_ERR_OOM, "out of memory for bad_words");
    int32_t n = 0;
    for (int32_t w = 0; st == TP_OK && w < p->n_bad_words; w++) {
        const char *word = p->bad_words[w];
        while (*word && strchr(" \t\n\r\f\v", *word)) word++;
        int32_t first = -1, first_len = 0;
        for (int space = 0; space < 2 && st == TP_OK; space++) {
            char *text = malloc(strlen(word) + 2);
            if (!text) {
                st = tp_error(TP_ERR_OOM, "out of memory for bad_words");
                break;
            }
            strcpy(text, space ? " " : "");
            strcat(text, word);
            one.n = 0;
            st = tp_tokenizer_encode(e->tok, text, strlen(text), 0, &one);
            free(text);
            if (st != TP_OK || one.n == 0) break;
            int outside = 0; /* an id the model cannot generate: nothing to ban */
            for (size_t i = 0; i < one.n; i++) outside |= one.v[i] >= e->cfg.vocab_size;
            if (outside) break;
            if (space && (one.v[0] == first || (int32_t)one.n != first_len)) break;
            if (!space) {
                first = one.v[0];
                first_len = (int32_t)one.n;
            }
            for (size_t i = 0; i < one.n && st == TP_OK; i++) st = tp_ids_push(&all, one.v[i]);
            len[n++] = (int32_t)one.n;
        }
    }
    tp_ids_free(&one);
    if (st != TP_OK) {
        free(len);
        tp_ids_free(&all);
        return st;
    }
    r->bad_ids = all.v;
    r->bad_len = len;
    r->n_bad = n;
    r->bad_ready = 1;
    return TP_OK;
}

/* The ids a row may not draw after out[0 .. n_out): min_tokens' end tokens before it, and
 * the last token of each bad word whose other tokens end the output (vLLM: output tokens
 * only), into e->ban. */
static tp_status banned_ids(engine *e, req *r, const int32_t *out, int32_t n_out, int32_t *n)
{
    *n = 0;
    const int ends = bans_end_tokens(e, r, n_out);
    if (!ends && !r->in->p.n_bad_words) return TP_OK;
    if (r->in->p.n_bad_words) TP_CHECK(bad_words_of(e, r));
    const size_t most = (size_t)n_end_tokens(e, r) + (size_t)r->n_bad;
    if (most > e->ban_cap) {
        int32_t *b = realloc(e->ban, most * sizeof *b);
        if (!b) return tp_error(TP_ERR_OOM, "out of memory for a row's banned ids");
        e->ban = b;
        e->ban_cap = most;
    }
    if (ends) *n = end_tokens(e, r, e->ban);
    const int32_t *w = r->bad_ids;
    for (int32_t k = 0; k < r->n_bad; w += r->bad_len[k], k++) {
        const int32_t L = r->bad_len[k];
        if (L - 1 > n_out || (L > 1 && memcmp(out + n_out - (L - 1), w, (size_t)(L - 1) * sizeof *w) != 0))
            continue;
        e->ban[(*n)++] = w[L - 1];
    }
    return TP_OK;
}

/* Room for n more ids in e->stokens. */
static tp_status stokens_reserve(engine *e, size_t used, size_t n)
{
    if (used + n <= e->stokens_cap) return TP_OK;
    size_t cap = 2 * (used + n);
    int32_t *p = realloc(e->stokens, cap * sizeof *p);
    if (!p) return tp_error(TP_ERR_OOM, "out of memory for the sampling tokens of a step");
    e->stokens = p;
    e->stokens_cap = cap;
    return TP_OK;
}

/* A row's n ids (banned or allowed) into e->stokens after the *used there: *at their
 * offset, *count n. */
static tp_status put_ids(engine *e, size_t *used, const int32_t *ids, int32_t n, int32_t *at, int32_t *count)
{
    if (n == 0) return TP_OK;
    TP_CHECK(stokens_reserve(e, *used, (size_t)n));
    *at = (int32_t)*used;
    *count = n;
    memcpy(e->stokens + *used, ids, (size_t)n * sizeof(int32_t));
    *used += (size_t)n;
    return TP_OK;
}

/* Sampler rank: the sample op's rule for each logit row, as sample_one would apply it on the
 * host: the choice's stream and step, the penalty tokens (prompt, then output) where a
 * penalty is on, and min_tokens' end tokens banned. pending: the step enqueued ahead whose
 * tokens the host has not read (0: none), one more token of each of its sequences (only its
 * count: a rule that reads the tokens' values waits for that step to be read). A row of a
 * sequence that ended at the step before (enqueued ahead, then dropped) is greedy. */
static tp_status sample_rows(engine *e, const tp_sched_batch *b, int64_t pending, tp_sample_request *rq)
{
    size_t used = 0;
    for (int32_t i = 0; i < b->n_logits; i++) {
        const seq *q = &e->S_[b->seq_key[b->logit_seq[i]]];
        req *r = &e->R[q->req];
        tp_sample_row *w = &e->srows[i];
        memset(w, 0, sizeof *w);
        if (q->dead) {
            w->top_p = 1.0;
            w->repetition_penalty = 1.0;
            w->n_logprobs = -1;
            continue;
        }
        tp_choice *c;
        TP_CHECK(choice_of(e, r, q->choice, &c));
        const tp_sampling_params *p = &r->sp;
        const int unread = pending && q->ahead_id == pending;
        if (unread && rule_reads_output(r))
            return tp_error(TP_ERR_INTERNAL, "the rule of sequence %" PRId64 " reads a token of step %" PRId64
                            " not read yet", b->seq_key[b->logit_seq[i]], pending);
        const int32_t n_out = (int32_t)c->out.n + unread;
        w->temperature = p->temperature;
        w->top_p = p->top_p;
        w->min_p = p->min_p;
        w->repetition_penalty = p->repetition_penalty;
        w->presence_penalty = p->presence_penalty;
        w->frequency_penalty = p->frequency_penalty;
        w->seed = choice_seed(r, q->choice);
        w->step = (uint64_t)n_out;
        w->top_k = p->top_k;
        w->n_logprobs = r->in->p.has_logprobs ? p->logprobs : -1; /* -1: no log-sum-exp over the row */
        if (has_penalties(p)) {
            TP_CHECK(stokens_reserve(e, used, (size_t)r->n_prompt + (size_t)n_out));
            w->tokens = (int32_t)used;
            w->n_prompt = r->n_prompt;
            w->n_output = n_out;
            if (r->n_prompt) memcpy(e->stokens + used, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
            if (n_out) memcpy(e->stokens + used + r->n_prompt, c->out.v, (size_t)n_out * sizeof(int32_t));
            used += (size_t)r->n_prompt + (size_t)n_out;
        }
        int32_t n_banned;
        TP_CHECK(banned_ids(e, r, c->out.v, n_out, &n_banned)); /* bad words: n_out is c's (above) */
        const int32_t *banned = e->ban;
        const tp_request_params *rp = &r->in->p;
        const int32_t *allowed = rp->allowed_token_ids;
        int32_t n_allowed = rp->n_allowed_token_ids;
        if (is_guided(r)) { /* n_out is c's (above) */
            const int32_t *ids;
            int32_t n;
            int negated;
            TP_CHECK(guided_ids(e, r, q->choice, c->out.v, n_out, n_banned == 0, &ids, &n, &negated));
            if (negated) {
                banned = ids;
                n_banned = n;
            } else {
                allowed = ids;
                n_allowed = n;
            }
        }
        TP_CHECK(put_ids(e, &used, banned, n_banned, &w->banned, &w->n_banned));
        TP_CHECK(put_ids(e, &used, allowed, n_allowed, &w->allowed, &w->n_allowed));
        if (rp->n_bias) { /* the ids, then their biases' bits */
            TP_CHECK(stokens_reserve(e, used, 2 * (size_t)rp->n_bias));
            w->bias = (int32_t)used;
            w->n_bias = rp->n_bias;
            memcpy(e->stokens + used, rp->bias_ids, (size_t)w->n_bias * sizeof(int32_t));
            memcpy(e->stokens + used + w->n_bias, rp->bias, (size_t)w->n_bias * sizeof(float));
            used += 2 * (size_t)w->n_bias;
        }
    }
    if (used > INT32_MAX) return tp_error(TP_ERR_UNSUPPORTED, "a step's sampling tokens exceed 2^31");
    rq->rows = e->srows;
    rq->tokens = e->stokens;
    rq->n_tokens = (int32_t)used;
    rq->out = e->sout;
    return TP_OK;
}

/* A step enqueued ahead: the rules of its rows, made by the sampler (sample_rows). Over tp
 * every rank of the group runs the sample op on the same gathered logits, so that each takes
 * the next step's tokens from its own device: the peers, which keep no outputs to make the
 * rules from, receive them (and ahead_read checks that the ranks chose alike). */
static tp_status step_rules(engine *e, const tp_sched_batch *b, int64_t pending, tp_sample_request *rq)
{
    if (e->is_sampler) TP_CHECK(sample_rows(e, b, pending, rq));
    if (e->g->tp == 1) return TP_OK;
    const int root = (e->g->pp - 1) * e->g->tp;
    int32_t n_tokens = e->is_sampler ? rq->n_tokens : 0;
    TP_CHECK(tp_comm_broadcast(e->w->replica, &n_tokens, 1, TP_DTYPE_I32, root, NULL));
    if (!e->is_sampler) TP_CHECK(stokens_reserve(e, 0, (size_t)n_tokens));
    _Static_assert(sizeof(tp_sample_row) % sizeof(int32_t) == 0, "tp_sample_row in int32 words");
    TP_CHECK(tp_comm_broadcast(e->w->replica, e->srows, (size_t)b->n_logits * (sizeof(tp_sample_row) / sizeof(int32_t)),
                               TP_DTYPE_I32, root, NULL));
    if (n_tokens) TP_CHECK(tp_comm_broadcast(e->w->replica, e->stokens, (size_t)n_tokens, TP_DTYPE_I32, root, NULL));
    rq->rows = e->srows;
    rq->tokens = e->stokens;
    rq->n_tokens = n_tokens;
    rq->out = e->sout;
    return TP_OK;
}

void eng_free_cursors(req *r)
{
    for (int32_t j = 0; r->guide_cursor && j < r->n; j++) tp_guide_cursor_free(r->guide_cursor[j]);
    free(r->guide_cursor);
    r->guide_cursor = NULL;
}

/* Sampler rank: a request whose choices have all finished becomes its output line. */
static tp_status complete_request(engine *e, req *r)
{
    tp_completion c = {r->in, r->index, r->n_prompt, r->prompt, r->choices, r->n, r->plp,
                       r->prompt_lp > 0 ? r->prompt_lp : 0, e->model_name, (int64_t)time(NULL),
                       r->in->parse_tool_calls ? (tp_tool_parser)e->o->tool_call_parser : TP_TOOL_PARSER_NONE,
                       r->n_cached};
    char *line = NULL;
    size_t len = 0;
    TP_CHECK(tp_completion_format(&c, e->tok, &line, &len));
    tp_record_stats rs = {r->n_prompt, 0, -1, -1, r->n_cached};
    const tp_choice *c0 = &r->choices[0];
    for (int32_t j = 0; j < r->n; j++) rs.completion_tokens += (int64_t)r->choices[j].out.n;
    if (c0->t_first > 0) {
        rs.ttft = c0->t_first - c0->t_sched;
        rs.itl = c0->out.n > 1 ? (c0->t_last - c0->t_first) / (double)(c0->out.n - 1) : 0;
    }
    tp_status st = tp_collector_send(e->collector, r->index, 0, line, len, &rs);
    free(line);
    TP_CHECK(st);
    if (e->o->dump_logits) TP_CHECK(write_dump(e, r));
    for (int32_t j = 0; j < r->n; j++) tp_choice_free(&r->choices[j]);
    free(r->choices);
    r->choices = NULL;
    eng_free_cursors(r);
    free(r->plp);
    free(r->plp_top);
    r->plp = NULL;
    r->plp_top = NULL;
    return TP_OK;
}

static tp_status choice_of(engine *e, req *r, int32_t j, tp_choice **out)
{
    if (!r->choices) {
        r->choices = calloc((size_t)r->n, sizeof *r->choices);
        if (!r->choices) return tp_error(TP_ERR_OOM, "out of memory");
        for (int32_t k = 0; k < r->n; k++)
            TP_CHECK(tp_choice_init(&r->choices[k], e->tok, r->skip_special, r->in->p.has_logprobs,
                                    r->sp.logprobs));
    }
    *out = &r->choices[j];
    return TP_OK;
}

/* Sampler rank: choose one sequence's next token (from lg; or dev, what the device's sample
 * op chose; or, when both are NULL, the token the device chose greedily) and whether it
 * ends there. */
static tp_status sample_one(engine *e, const seq *q, const float *lg, const tp_sample_out *dev, int32_t *token,
                            int *ends)
{
    req *r = &e->R[q->req];
    tp_choice *c;
    TP_CHECK(choice_of(e, r, q->choice, &c));
    const int64_t V = e->cfg.vocab_size;
    int32_t n_out = (int32_t)c->out.n;
    int32_t n_banned = 0; /* never drawn, yet in the raw logprobs */
    if (lg) TP_CHECK(banned_ids(e, r, c->out.v, n_out, &n_banned));
    tp_sample_result res = {0};
    res.top = e->top;
    if (lg) {
        tp_sampling_params sp = r->sp;
        sp.seed = choice_seed(r, q->choice);
        sp.logprob_off = !c->want_logprobs; /* nobody reads it: no log-sum-exp over the row */
        const tp_request_params *rp = &r->in->p;
        tp_logit_edits edits = {rp->allowed_token_ids, rp->n_allowed_token_ids, e->ban, n_banned,
                                rp->bias_ids, rp->bias, rp->n_bias};
        if (is_guided(r)) {
            const int32_t *ids;
            int32_t n;
            int negated;
            TP_CHECK(guided_ids(e, r, q->choice, c->out.v, n_out, n_banned == 0, &ids, &n, &negated));
            if (negated) {
                edits.banned = ids;
                edits.n_banned = n;
            } else {
                edits.allowed = ids;
                edits.n_allowed = n;
            }
        }
        TP_CHECK(tp_sampler_sample_edited(e->sampler, &sp, (uint64_t)n_out, lg, &edits, r->prompt, r->n_prompt,
                                          c->out.v, n_out, &res));
        TP_CHECK(tp_choice_keep_logprobs(c, &res));
    } else if (dev) {
        res.token = dev->token;
        res.logprob = dev->logprob;
        res.n_top = dev->n_top;
        for (int32_t k = 0; k < dev->n_top; k++) {
            e->top[k].id = dev->top_id[k];
            e->top[k].logprob = dev->top_logprob[k];
        }
        TP_CHECK(tp_choice_keep_logprobs(c, &res));
    } else {
        res.token = *token;
    }
    double now = now_s();
    if (!c->t_first) c->t_first = now;
    c->t_last = now;
    const int eos = !r->ignore_eos && is_eos(e, res.token);
    int end_token = n_out >= r->min_tokens && (eos || is_stop_token(r, res.token));
    if (end_token && !eos) c->stop_token = res.token; /* vLLM's stop_reason; an EOS has none */
    int stopped = 0;
    /* the ending token's text only with include_stop_str_in_output (vLLM's detokenizer;
     * a special token's still goes with skip_special_tokens) */
    TP_CHECK(tp_choice_push(c, res.token, !end_token || r->include_stop, r->in->p.stop, r->in->p.n_stop,
                            r->include_stop, n_out + 1 > r->min_tokens, &stopped));
    if (lg && e->o->dump_logits && q->choice == 0 && r->n_dump_gen < r->max_new) {
        if (r->n_dump_gen == r->dump_cap) { /* grows as tokens come: max_new may be the whole context */
            const int32_t cap = r->dump_cap ? (r->dump_cap > r->max_new / 2 ? r->max_new : 2 * r->dump_cap)
                                            : (r->max_new < 16 ? r->max_new : 16);
            float *g = realloc(r->dump_gen, (size_t)cap * (size_t)V * sizeof(float));
            if (!g) return tp_error(TP_ERR_OOM, "out of memory keeping logits for --dump-logits");
            r->dump_gen = g;
            r->dump_cap = cap;
        }
        memcpy(r->dump_gen + (size_t)r->n_dump_gen++ * (size_t)V, lg, (size_t)V * sizeof(float));
    }
    *token = res.token;
    *ends = end_token || stopped;
    if (*ends) c->finish = TP_FINISH_STOP; /* else it ends by length, if the scheduler says so */
    return TP_OK;
}

/* Sampler rank: a sequence ended (on its own token or string, or by length). */
static tp_status end_sequence(engine *e, const seq *q)
{
    req *r = &e->R[q->req];
    tp_choice *c;
    TP_CHECK(choice_of(e, r, q->choice, &c));
    TP_CHECK(tp_choice_finish(c, c->finish == TP_FINISH_STOP ? TP_FINISH_STOP : TP_FINISH_LENGTH, r->in->p.stop,
                              r->in->p.n_stop, r->include_stop));
    if (++r->n_finished == r->n) TP_CHECK(complete_request(e, r));
    return TP_OK;
}

/* The sampler's decisions in e->sync ([n tokens | n ends | stop signal]) to every rank of the
 * replica (the sampler: TP rank 0 of the last stage), and the stop taken alike. */
static tp_status share_decisions(engine *e, int32_t n)
{
    if (e->g->tp * e->g->pp > 1)
        TP_CHECK(tp_comm_broadcast(e->w->replica, e->sync, (size_t)2 * (size_t)n + 1, TP_DTYPE_I32,
                                   (e->g->pp - 1) * e->g->tp, NULL));
    if (e->sync[2 * n] && !e->stopping) {
        e->stopping = 1;
        if (e->is_sampler) tp_log(TP_LOG_WARN, "signal %d: stopping; finished requests are saved, --resume runs the rest",
                                  (int)eng_stop_signal());
    }
    return TP_OK;
}

/* Sampler rank decides; everyone receives the tokens and the stop decision, and commits. */
static tp_status sample_and_commit(engine *e, int p)
{
    const tp_sched_batch *b = &e->B[p];
    const int64_t V = e->cfg.vocab_size;
    int32_t n = b->n_logits;
    if (e->is_sampler) {
        TP_CHECK(keep_prompt_rows(e, b));
        /* the step's forward left greedy ids in e->sync, or sampled results in e->sout */
        int on_device = e->greedy_on_device || e->sample_on_device;
        for (int32_t i = 0; i < n; i++) {
            int ends = 0;
            TP_CHECK(sample_one(e, &e->S_[b->seq_key[b->logit_seq[i]]],
                                on_device ? NULL : e->logits_host + (size_t)i * (size_t)V,
                                e->sample_on_device ? &e->sout[i] : NULL, &e->sync[i], &ends));
            e->sync[n + i] = ends;
        }
        e->sync[2 * n] = eng_stop_signal() != 0;
    }
    TP_CHECK(share_decisions(e, n));
    for (int32_t i = 0; i < n; i++) e->finish[i] = (uint8_t)e->sync[n + i];
    e->generated_tokens += n;
    TP_CHECK(tp_scheduler_commit(e->S[p], b, e->sync, e->finish));
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    while (tp_scheduler_pop_finished(e->S[p], &key, &gen, &n_gen)) {
        eng_note_cached(e, e->S[p], key);
        if (e->is_sampler) TP_CHECK(end_sequence(e, &e->S_[key]));
    }
    return TP_OK;
}

static tp_status run_stage(engine *e, int p, tp_step *s)
{
    make_step(e, p, s);
    const tp_tensor *in_x = NULL, *in_delta = NULL;
    tp_tensor rx = tp_tensor_rows(&e->rx, 0, s->n_tokens), rd = tp_tensor_rows(&e->rdelta, 0, s->n_tokens);
    if (!e->model.plan.has_embedding) {
        in_x = &rx;
        in_delta = &rd;
    }
    e->greedy_on_device = device_greedy(e, &e->B[p]);
    e->sample_on_device = 0;
    /* alike on every rank: the sampler runs the sample op, its TP peers gather for it */
    const int group_samples = !e->greedy_on_device && device_sample(e);
    tp_sample_request rq;
    if (e->is_sampler && group_samples) {
        TP_CHECK(sample_rows(e, &e->B[p], 0, &rq));
        e->sample_on_device = 1;
    }
    if (e->is_sampler) e->steps_by_path[e->greedy_on_device ? 0 : e->sample_on_device ? 1 : 2]++;
    /* The first step whose rows the sample op takes is not recorded as a graph on the sampler
     * (the backend makes the op's scratch then); its TP peers run it eagerly too, since a graph
     * pads the batch and the ranks' all-reduces and all-gathers must have one size (without
     * the warm-up, a prefill with prompt rows on the host sampler left the first decode step
     * padded on the peers only: MPI_ERR_TRUNCATE on the CPU, a hang on GPUs). */
    const int first_sample = group_samples && s->n_logits > 0 && !e->sample_op_ran && e->buf.use_graphs;
    if (first_sample) e->buf.use_graphs = 0;
    const tp_status st = tp_model_forward(&e->model, &e->kv, &e->buf, s, e->tpc, in_x, in_delta,
                                          e->is_sampler && !e->greedy_on_device && !e->sample_on_device
                                              ? e->logits_host : NULL,
                                          e->greedy_on_device ? e->sync : NULL, e->sample_on_device ? &rq : NULL);
    if (first_sample) e->buf.use_graphs = 1;
    if (group_samples && s->n_logits > 0) e->sample_op_ran = 1;
    return st;
}

/* After every stage computed: stage s receives what s-1 produced (for its next tick),
 * then sends its own output to s+1. Receiving first keeps the chain free of cycles. */
/* The activations of n tokens from the stage before into rx / rdelta, or from buf.x /
 * buf.delta to the stage after (stream-ordered on a GPU). */
static tp_status recv_from_prev(engine *e, int32_t n)
{
    const size_t count = (size_t)n * (size_t)e->model.dims.d;
    const int prev = e->g->pp_rank - 1;
    TP_CHECK(tp_comm_recv(e->ppc, e->rx.data, count, TP_DTYPE_F32, prev, e->backend->stream));
    return tp_comm_recv(e->ppc, e->rdelta.data, count, TP_DTYPE_F32, prev, e->backend->stream);
}

static tp_status send_to_next(engine *e, int32_t n)
{
    const size_t count = (size_t)n * (size_t)e->model.dims.d;
    const int next = e->g->pp_rank + 1;
    TP_CHECK(tp_comm_send(e->ppc, e->buf.x.data, count, TP_DTYPE_F32, next, e->backend->stream));
    return tp_comm_send(e->ppc, e->buf.delta.data, count, TP_DTYPE_F32, next, e->backend->stream);
}

static tp_status exchange(engine *e, int64_t tick, int mine_p, const tp_step *mine)
{
    const int s = e->g->pp_rank;
    if (s > 0) {
        int prev = stage_engine(e, tick, s - 1);
        if (prev >= 0) TP_CHECK(recv_from_prev(e, e->B[prev].n_tokens));
    }
    if (s < e->g->pp - 1 && mine_p >= 0) TP_CHECK(send_to_next(e, mine->n_tokens));
    return TP_OK;
}

static void note_scheduled(engine *e, const tp_sched_batch *b)
{
    if (!e->is_sampler) return;
    double now = now_s();
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const seq *q = &e->S_[b->seq_key[i]];
        tp_choice *c;
        if (choice_of(e, &e->R[q->req], q->choice, &c) == TP_OK && !c->t_sched) c->t_sched = now;
        else tp_error_clear();
    }
}


/* After the warm-up's prefill-sized step, a stage before the last sends its output on at
 * once: the next stage waits for that step, not for this stage's whole warm-up (which would
 * outlast --step-timeout however short each step). Stream-ordered: the later steps' writes
 * to buf->x come after the send has read it. */
static tp_status warm_send_on(void *engine_, int32_t n)
{
    engine *e = engine_;
    return send_to_next(e, n);
}

/* After each warm-up step: the watchdog's beat, and the collector's (a replica's sender
 * tells rank 0 it is alive). TPINFER_TEST_WARMUP_STEP_S=X (tests): each step lasts X seconds
 * longer, so that a warm-up longer than --step-timeout, each of whose steps is shorter, is
 * seen to go on. */
static void warm_beat(void *engine_)
{
    engine *e = engine_;
    static double extra = -1;
    if (extra < 0) {
        const char *v = getenv("TPINFER_TEST_WARMUP_STEP_S");
        extra = v ? atof(v) : 0;
        if (!(extra > 0 && extra < 60)) extra = 0;
    }
    if (extra > 0) nanosleep(&(struct timespec){(time_t)extra, (long)((extra - (time_t)extra) * 1e9)}, NULL);
    tp_watchdog_beat(e->watchdog);
    if (tp_collector_beat(e->collector) != TP_OK) tp_error_clear(); /* a beat is advice; the loop's polls retry */
}

/* Before the first step: tp_model_warm_up with the outputs this replica's steps will use, so
 * the run pays no first-use costs; over pp the prefill step's activations pass down the
 * stages as a step's do. Part of the start-up time. */
static int ahead_wanted(const engine *e);

tp_status eng_warm_up(engine *e)
{
    if (!e->warm) return TP_OK;
    int greedy = argmax_possible(e);
    for (int64_t k = 0; greedy && k < e->n_seqs; k++) greedy = plain_greedy(&e->R[e->S_[k].req]);
    tp_warm_up w;
    memset(&w, 0, sizeof w);
    w.prefill_tokens = e->max_batched;
    w.max_len = e->max_model_len;
    if (e->warm_first) tp_scheduler_peek_first(e->S[0], &w.first_tokens, &w.first_seqs);
    w.graphs = e->buf.use_graphs;
    w.tune = e->tune;
    if (greedy) {
        w.ids = e->sync;
    } else if (device_sample(e)) { /* alike on every rank: the sampler's peers take part */
        w.sampled = 1;
        /* steps enqueued ahead whose rules wait for the step before: their graphs too, or
         * theirs alone where every request's rule does (a decode step then always waits) */
        int some = 0, all = 1;
        for (int64_t k = 0; k < e->n_seqs; k++) {
            const int reads = rule_reads_output(&e->R[e->S_[k].req]);
            some |= reads;
            all &= reads;
        }
        const int ahead = ahead_wanted(e);
        w.unsampled = some && ahead ? 1 + all : 0;
        if (e->is_sampler || ahead) { /* ahead, every TP rank runs the sample op */
            for (int32_t i = 0; i < e->max_rows; i++) {
                memset(&e->srows[i], 0, sizeof e->srows[i]);
                e->srows[i].top_p = 1.0; /* greedy, everything off */
                e->srows[i].repetition_penalty = 1.0;
            }
            w.sample_rows = e->srows;
            w.sample_out = e->sout;
        }
    } else if (e->is_sampler) {
        w.logits = e->logits_host;
    }
    w.beat = warm_beat; /* each step, and what the stage before sends */
    w.after_prefill = e->g->pp_rank < e->g->pp - 1 ? warm_send_on : NULL;
    w.beat_arg = e;
    double t0 = now_s();
    const int32_t n = tp_model_warm_up_tokens(&e->kv, &e->buf, &w);
    if (e->g->pp_rank > 0) {
        TP_CHECK(recv_from_prev(e, n));
        tp_watchdog_beat(e->watchdog);
        w.in_x = &e->rx;
        w.in_delta = &e->rdelta;
    }
    TP_CHECK(tp_model_warm_up(&e->model, &e->kv, &e->buf, e->tpc, &w));
    if (w.sampled && w.graphs) e->sample_op_ran = 1; /* its eager sampled step (tp_model_warm_up) */
    tp_log_info0("warm-up before the first step: %.0f ms (TPINFER_WARMUP=0 skips it)", 1e3 * (now_s() - t0));
    return TP_OK;
}

/* TPINFER_PROFILE_STEPS=A:B: a profiler started with capture off (ncu --profile-from-start
 * off) sees steps A to B of this rank (from 0), not the load, warm-up or other steps. */
static void profile_steps_parse(engine *e)
{
    const char *v = getenv("TPINFER_PROFILE_STEPS");
    long long a = -1, b = -1;
    char end = 0;
    e->prof_from = e->prof_to = -1;
    if (!v || !*v) return;
    if (sscanf(v, "%lld:%lld%c", &a, &b, &end) != 2 || a < 0 || b < a) {
        tp_log(TP_LOG_WARN, "TPINFER_PROFILE_STEPS=%s is not A:B with 0 <= A <= B (steps from 0); ignored", v);
        return;
    }
    if (!e->backend->ops->profile_range) {
        tp_log(TP_LOG_WARN, "TPINFER_PROFILE_STEPS: the %s backend has no profiler range; ignored", e->backend->name);
        return;
    }
    e->prof_from = a;
    e->prof_to = b;
}

/* step: the step about to be enqueued (begin) or just read (end) */
static void profile_steps_mark(engine *e, int64_t step, int begin)
{
    if (e->prof_from < 0) return;
    if (begin && step == e->prof_from) e->backend->ops->profile_range(e->backend, 1);
    if (!begin && step == e->prof_to) e->backend->ops->profile_range(e->backend, 0);
}

static tp_status loop(engine *e)
{
    tp_step step;
    for (int64_t tick = 0;; tick++) {
        tp_watchdog_beat(e->watchdog);
        int p0 = (int)(tick % e->P);
        if (!e->inflight[p0] && !e->stopping) {
            TP_CHECK(tp_scheduler_schedule(e->S[p0], &e->B[p0]));
            e->inflight[p0] = e->B[p0].n_tokens > 0;
            e->entered[p0] = tick;
            if (e->inflight[p0]) note_scheduled(e, &e->B[p0]);
        }
        int mine = stage_engine(e, tick, e->g->pp_rank);
        double t_tick = now_s(), t_forward = 0;
        if (mine >= 0) {
            profile_steps_mark(e, e->forward_steps, 1);
            TP_CHECK(run_stage(e, mine, &step));
            t_forward = now_s() - t_tick;
            e->forward_seconds += t_forward;
            e->forward_steps++;
        }
        if (e->P > 1) TP_CHECK(exchange(e, tick, mine, &step));
        int last = stage_engine(e, tick, e->P - 1);
        if (last >= 0) {
            TP_CHECK(sample_and_commit(e, last));
            e->inflight[last] = 0;
            profile_steps_mark(e, e->forward_steps - 1, 0);
        } else if (e->g->tp * e->g->pp == 1 && eng_stop_signal()) {
            e->stopping = 1;
        }
        TP_CHECK(tp_collector_poll(e->collector));
        if (mine >= 0 && e->g->rank == 0 && tp_log_enabled(TP_LOG_DEBUG)) /* the step timeline */
            tp_log(TP_LOG_DEBUG, "step %" PRId64 " at %.1f ms: %" PRId32 " tokens of %" PRId32 " sequences, %" PRId32
                   " sampled; forward %.2f ms, tick %.2f ms", tick, 1e3 * (t_tick - e->t0), e->B[mine].n_tokens,
                   e->B[mine].n_seqs, e->B[mine].n_logits, 1e3 * t_forward, 1e3 * (now_s() - t_tick));
        int busy = 0;
        for (int p = 0; p < e->P; p++) busy |= e->inflight[p] || (!e->stopping && !tp_scheduler_idle(e->S[p]));
        if (!busy) return TP_OK;
    }
}

// ----------------------------------------------------------------------------
// steps enqueued ahead: the next step goes to the device before this one's tokens reach
// the host, its tokens from this one's taken on the device; the host reads, detokenizes and
// checks stops while the device computes. A sequence that ends (EOS, stop) has one more row
// already enqueued: it is dropped, and its blocks given back are safe to reuse, since the
// steps scheduled later run after it on the device.

/* A replica of one pipeline stage (pp 1) whose every request has its tokens chosen on the
 * device: plain greedy (argmax; over tp the ranks' winners compared on the device), or
 * sampled by the sample op (over tp on every rank of the group, by the sampler's rules:
 * step_rules; a rule that reads the tokens not read yet, such as a penalty or guided
 * decoding, is made once they are: the step's forward is enqueued first, its sample op after
 * the step before is read), and no prompt rows; on a backend that can
 * (TPINFER_OVERLAP=0: never; each step then waits for the one before, as every other run
 * does). Alike on every rank of the replica: the requests, the grid and the backend are. */
static int ahead_wanted(const engine *e)
{
    if (!e->overlap || e->P != 1 || e->g->pp != 1 || e->o->dump_logits || !tp_model_can_overlap(&e->model))
        return 0;
    for (int64_t k = 0; k < e->n_seqs; k++) {
        const req *r = &e->R[e->S_[k].req];
        if (eng_wants_prompt_rows(e, r, e->S_[k].choice) || (!plain_greedy(r) && !device_sample(e))) return 0;
    }
    return 1;
}

/* Some row of the scheduled step has a rule that reads its sequence's token of step
 * `pending`, not read yet. */
static int reads_unread(const engine *e, const tp_sched_batch *b, int64_t pending)
{
    for (int32_t i = 0; pending && i < b->n_logits; i++) {
        const seq *q = &e->S_[b->seq_key[b->logit_seq[i]]];
        if (q->ahead_id == pending && rule_reads_output(&e->R[q->req])) return 1;
    }
    return 0;
}

/* Sequences the scheduler finished (by length at the commit of step `at`, or ended by the
 * host): the first end when step `at`, which holds their last token, is read; the others have
 * ended already. at 0: after a read, when only the host's ends can be there. */
static tp_status ahead_pop(engine *e, int64_t at)
{
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    while (tp_scheduler_pop_finished(e->S[0], &key, &gen, &n_gen)) {
        eng_note_cached(e, e->S[0], key);
        if (e->S_[key].dead) continue;
        if (!at) return tp_error(TP_ERR_INTERNAL, "sequence %" PRId64 " finished with no step left to read its end", key);
        e->S_[key].end_id = at;
    }
    return TP_OK;
}

/* Enqueue the scheduled step as `a`: its pending tokens taken from the step before's
 * ids on the device; then the scheduler takes its tokens as pending. */
static tp_status ahead_launch(engine *e, const ahead_step *prev, ahead_step *a)
{
    const tp_sched_batch *b = &e->B[0];
    double lap = now_s();
    tp_step step;
    make_step(e, 0, &step);
    if (e->n_extra) return tp_error(TP_ERR_INTERNAL, "a step enqueued ahead has prompt rows");
    int any = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        e->take[t] = -1;
        if (b->tokens[t] != TP_TOKEN_PENDING) continue;
        const seq *q = &e->S_[b->seq_key[b->seq[t]]];
        if (!prev || q->ahead_id != prev->id)
            return tp_error(TP_ERR_INTERNAL, "token %d of step %" PRId64 " is pending but not the step before's", t,
                            a->id);
        e->take[t] = q->ahead_row;
        any = 1;
    }
    step.take = any ? e->take : NULL;
    /* greedy rows by argmax, or every row by the sample op (its rules counting the tokens
     * not read yet) */
    tp_sample_request rq;
    a->sampled = !device_greedy(e, b);
    a->unsampled = a->sampled && prev && reads_unread(e, b, prev->id);
    if (a->sampled && !a->unsampled) TP_CHECK(step_rules(e, b, prev ? prev->id : 0, &rq));
    a->n = b->n_logits;
    for (int32_t i = 0; i < b->n_logits; i++) {
        const int64_t key = b->seq_key[b->logit_seq[i]];
        a->keys[i] = key;
        e->S_[key].ahead_id = a->id;
        e->S_[key].ahead_row = i;
    }
    lap = host_lap(e, HOST_RULES, lap);
    if (a->unsampled)
        TP_CHECK(tp_model_forward_start_unsampled(&e->model, &e->kv, &e->buf, &step, e->tpc));
    else
        TP_CHECK(tp_model_forward_start(&e->model, &e->kv, &e->buf, &step, e->tpc, a->sampled ? &rq : NULL,
                                        (int)(a->id % 2)));
    lap = host_lap(e, HOST_ENQUEUE, lap);
    e->forward_steps++;
    e->steps_by_path[a->sampled]++;
    for (int32_t i = 0; i < b->n_logits; i++) e->sync[i] = TP_TOKEN_PENDING;
    TP_CHECK(tp_scheduler_commit(e->S[0], b, e->sync, NULL));
    TP_CHECK(ahead_pop(e, a->id));
    host_lap(e, HOST_SCHEDULE, lap);
    return TP_OK;
}

/* A TP peer of the sampler: its device chose the tokens its next step took, the sampler's
 * those the output keeps (e->sync). The same gathered logits, rules and kernels make them
 * alike; were they not, the ranks' KV caches would part without a word. */
static tp_status same_choices(const engine *e, const ahead_step *a)
{
    for (int32_t i = 0; i < a->n; i++) {
        int32_t mine = a->sampled ? a->sout[i].token : a->ids[i];
        if (e->test_skew && a->id == 2 && i == 0) mine ^= 1;
        if (mine != e->sync[i])
            return tp_error(TP_ERR_INTERNAL, "rank %d chose token %d for sequence %" PRId64 " at step %" PRId64
                            " where its group's sampler (replica rank %d) chose %d: the TP ranks' %s disagree, so "
                            "their caches would part; TPINFER_OVERLAP=0 leaves the choice to the sampler alone",
                            e->g->rank, (int)mine, a->keys[i], a->id, (e->g->pp - 1) * e->g->tp, (int)e->sync[i],
                            a->sampled ? "sample ops" : "argmax merges");
    }
    return TP_OK;
}

/* Read step a's tokens (the steps after it keep running) and apply them: the sampler rank
 * turns them into text, checks stops and writes finished requests; over tp it shares the
 * tokens and its stop decisions, and every rank's scheduler takes them alike. */
static tp_status ahead_read(engine *e, ahead_step *a)
{
    const int32_t n = a->n;
    double t = now_s();
    TP_CHECK(tp_model_forward_wait(&e->model, (int)(a->id % 2), a->sampled ? (void *)a->sout : (void *)a->ids));
    t = host_lap(e, HOST_WAIT, t);
    if (e->is_sampler) {
        for (int32_t i = 0; i < n; i++) {
            seq *q = &e->S_[a->keys[i]];
            int32_t token = a->sampled ? a->sout[i].token : a->ids[i];
            int ends = 0;
            /* a row of a sequence that ended at an earlier step ran past its end: dropped */
            if (!q->dead) TP_CHECK(sample_one(e, q, NULL, a->sampled ? &a->sout[i] : NULL, &token, &ends));
            e->sync[i] = token;
            e->sync[n + i] = ends;
        }
        e->sync[2 * n] = eng_stop_signal() != 0;
    }
    t = host_lap(e, HOST_TOKENS, t);
    TP_CHECK(share_decisions(e, n));
    if (!e->is_sampler) TP_CHECK(same_choices(e, a));
    for (int32_t i = 0; i < n; i++) {
        seq *q = &e->S_[a->keys[i]];
        if (q->dead) continue;
        const int ends = e->sync[n + i] != 0;
        e->generated_tokens++;
        /* 0 only for a sequence the scheduler ended by length (popped: end_id is set) */
        if (!tp_scheduler_resolve(e->S[0], a->keys[i], e->sync[i], ends) && !q->end_id)
            return tp_error(TP_ERR_INTERNAL, "the scheduler has no pending token of sequence %lld read at step %lld",
                            (long long)a->keys[i], (long long)a->id);
        if (ends || q->end_id == a->id) {
            q->dead = 1;
            if (!q->end_id) eng_note_cached(e, e->S[0], a->keys[i]); /* ended here, popped only below */
            if (e->is_sampler) TP_CHECK(end_sequence(e, q));
        }
    }
    TP_CHECK(ahead_pop(e, 0)); /* those resolve ended: done above */
    host_lap(e, HOST_APPLY, t);
    return TP_OK;
}

/* An unsampled step (its forward enqueued, the step before now read): its rows' rules, then
 * its sample op. The scheduler's batch is still the step's (nothing is scheduled in between). */
static tp_status ahead_sample(engine *e, const ahead_step *a)
{
    tp_sample_request rq;
    const double t = now_s();
    TP_CHECK(step_rules(e, &e->B[0], 0, &rq));
    const double t_enqueue = host_lap(e, HOST_RULES, t);
    TP_CHECK(tp_model_sample_start(&e->model, &e->buf, &rq, (int)(a->id % 2)));
    host_lap(e, HOST_ENQUEUE, t_enqueue);
    return TP_OK;
}

static tp_status loop_ahead(engine *e)
{
    ahead_step *prev = NULL;
    for (int64_t tick = 0;; tick++) {
        tp_watchdog_beat(e->watchdog);
        ahead_step *cur = NULL;
        double t_tick = now_s();
        if (!e->stopping && !tp_scheduler_idle(e->S[0])) {
            TP_CHECK(tp_scheduler_schedule(e->S[0], &e->B[0]));
            host_lap(e, HOST_SCHEDULE, t_tick);
            if (e->B[0].n_tokens > 0) {
                note_scheduled(e, &e->B[0]);
                profile_steps_mark(e, e->launched, 1);
                const int64_t id = ++e->launched;
                cur = &e->ahead[id % 2];
                cur->id = id;
                TP_CHECK(ahead_launch(e, prev, cur));
            }
        }
        if (prev) {
            TP_CHECK(ahead_read(e, prev));
            profile_steps_mark(e, prev->id - 1, 0);
        }
        if (cur && cur->unsampled) TP_CHECK(ahead_sample(e, cur));
        const double t_poll = now_s();
        TP_CHECK(tp_collector_poll(e->collector));
        host_lap(e, HOST_POLL, t_poll);
        if (cur && e->g->rank == 0 && tp_log_enabled(TP_LOG_DEBUG))
            tp_log(TP_LOG_DEBUG, "step %" PRId64 " at %.1f ms: %" PRId32 " tokens of %" PRId32 " sequences, %" PRId32
                   " sampled, enqueued before the step before was read%s; tick %.2f ms", tick,
                   1e3 * (t_tick - e->t0), e->B[0].n_tokens, e->B[0].n_seqs, e->B[0].n_logits,
                   cur->unsampled ? " (its rules made after)" : "", 1e3 * (now_s() - t_tick));
        prev = cur;
        if (!prev && (e->stopping || tp_scheduler_idle(e->S[0]))) return TP_OK;
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

static tp_status write_dump(engine *e, req *r)
{
    const int64_t V = e->cfg.vocab_size;
    const tp_choice *c = &r->choices[0];
    tp_status st = TP_OK;
    if (!r->dump_prompt || r->n_plp != r->n_prompt || r->n_dump_gen != (int32_t)c->out.n)
        st = tp_error(TP_ERR_INTERNAL, "request %s: the logits to dump were not all kept", r->in->id);
    char *name = file_name_of(r->in->id);
    char *path = name ? tp_path_join(e->o->dump_logits, name) : NULL;
    if (st == TP_OK && !path) st = tp_error(TP_ERR_OOM, "out of memory");
    if (st == TP_OK) {
        int32_t n_out = r->n_dump_gen;
        tp_st_out_tensor t[] = {
            {"prompt_ids", "I32", 1, {r->n_prompt}, r->prompt, (size_t)r->n_prompt * 4},
            {"output_ids", "I32", 1, {n_out}, c->out.v, (size_t)n_out * 4},
            {"prompt_logits", "F32", 2, {r->n_prompt, V}, r->dump_prompt, (size_t)r->n_prompt * (size_t)V * 4},
            {"logits", "F32", 2, {n_out, V}, r->dump_gen ? r->dump_gen : r->dump_prompt,
             (size_t)n_out * (size_t)V * 4},
        };
        const char *meta[] = {"id", r->in->id, "format", "tpinfer logits dump: logits[i] chose output_ids[i]"};
        st = tp_st_write(path, t, 4, meta, 2);
    }
    free(name);
    free(path);
    free(r->dump_prompt);
    free(r->dump_gen);
    r->dump_prompt = r->dump_gen = NULL;
    return st;
}

// ----------------------------------------------------------------------------

/* Phase 4: the steps, with steps enqueued ahead where the run allows (ahead_wanted). */
tp_status eng_run_loop(engine *e)
{
    profile_steps_parse(e);
    return ahead_wanted(e) ? loop_ahead(e) : loop(e);
}
