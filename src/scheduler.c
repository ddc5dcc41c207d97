/*
 * scheduler.c: vLLM-style continuous batching over block_alloc's paged KV blocks.
 * Sequences move WAITING -> RUNNING -> FINISHED through intrusive lists; a preempted
 * one goes back to the front of WAITING without blocks and is recomputed from its
 * tokens. Every decision depends only on the calls made, so all ranks agree.
 */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "block_alloc.h"
#include "util.h"

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_FINISHED };

typedef struct seq {
    int64_t key;
    int32_t *tokens;     /* prompt then generated tokens */
    int32_t len, cap;    /* tokens known (pending ones included) / allocated */
    int32_t n_resolved;  /* leading tokens whose values are known: the rest are TP_TOKEN_PENDING */
    int32_t n_prompt, max_new;
    int32_t n_computed;  /* leading tokens whose KV are in the cache */
    uint64_t chain;      /* prefix caching: the id of the prefix its first n_chain blocks hold */
    int32_t n_chain;     /* leading blocks taken from the cache or registered */
    int32_t n_cached;    /* prompt tokens taken from the cache at its first admission; -1 before */
    int no_hits;         /* TP_SCHED_NO_PREFIX_HITS */
    int32_t *blocks;     /* physical block of positions [i * block_size, (i+1) * block_size) */
    int32_t n_blocks, cap_blocks;
    int32_t n_dropped;   /* leading blocks given back behind a sliding window (their entries keep
                          * the ids, for release_blocks; the batch's table has 0 there) */
    int state;
    int64_t step_mark;   /* == the scheduler's step_id once placed in the step being built */
    struct seq *prev, *next;
} seq;

typedef struct seq_list {
    seq *head, *tail;
    int32_t n;
} seq_list;

typedef struct step_row {
    seq *sq;
    int32_t len;   /* tokens fed, from sq->n_computed on */
    int logit;     /* the chunk ends the known tokens: it samples one */
    int decode;
} step_row;

struct tp_scheduler {
    tp_sched_config cfg;
    int32_t max_blocks; /* block table columns */
    tp_block_alloc *alloc;
    seq_list waiting, running, finished;
    seq *popped; /* handed out by pop_finished; freed on the next call */

    /* key -> sequence for every sequence not yet popped; open addressing */
    seq **table;
    size_t table_cap, table_n;

    /* the step being built, then awaiting commit */
    int64_t step_id;
    int pending, preempted_now;
    step_row *rows;
    int32_t n_rows, n_logits;
    size_t cap_rows;
    seq **order; /* snapshot of RUNNING at the start of schedule */
    size_t cap_order;
    /* prefix caching: the prompt blocks this step completes (each row's first), which a
     * sequence waiting with the same prefix waits for rather than computes too */
    struct inflight { uint64_t hash, chain; const int32_t *tokens; } *inflight;
    size_t n_inflight, cap_inflight;

    /* batch arrays handed to the caller */
    int32_t *tok, *pos, *tseq, *slot;
    size_t cap_tokens;
    int32_t *block_table;
    size_t cap_table;
    int64_t *seq_key;
    int32_t *seq_first, *seq_len, *logit_token, *logit_seq;
    size_t cap_seq_arrays;

    int64_t steps, preemptions, prefill_tokens, decode_tokens, cached_tokens;
};

/* ---- small helpers ---------------------------------------------------------------- */

static int32_t min32(int32_t a, int32_t b) { return a < b ? a : b; }

/* The tokens a waiting sequence is admitted with (schedule's 2b): its next chunk, within the
 * step's budget and what free_blocks hold */
static int32_t admit_want(const tp_scheduler *s, const seq *sq, int32_t budget, int64_t free_blocks)
{
    const int64_t fit = free_blocks * s->cfg.block_size;
    const int32_t want = min32(sq->len - sq->n_computed, budget);
    return fit < want ? (int32_t)fit : want;
}

static int32_t blocks_for(const tp_scheduler *s, int64_t n_tokens)
{
    return (int32_t)((n_tokens + s->cfg.block_size - 1) / s->cfg.block_size);
}

/* Whether a waiting sequence holding held blocks may join n_running others: the blocks for
 * all of its known tokens (behind a window, those it holds at once) must be free beside one
 * block for each running sequence's next block_size tokens. Admitting on its first chunk
 * alone let a preempted sequence back in as soon as a few blocks were free, only to be
 * preempted again before it made a token (an H100 run of 1024 x 128 / 2048 at 256 at once:
 * 939 preemptions, each a recompute of up to 2,000 tokens); vLLM's note on its "full ISL"
 * option and V0's watermark say the same. With
 * nothing running it goes on its first chunk: waiting could not make more room. */
static int admit_fits(const tp_scheduler *s, const seq *sq, int32_t held, int64_t free_blocks, int32_t n_running)
{
    if (n_running == 0) return 1;
    const int32_t chunk = min32(sq->len - sq->n_computed, s->cfg.max_num_batched_tokens);
    return tp_sched_seq_blocks(&s->cfg, sq->len, chunk) - held + n_running <= free_blocks;
}

/* The first position whose keys and values a token at pos may read: its window's first key,
 * rounded down as the backend reads it; 0 without a window. */
static int32_t first_kept(const tp_scheduler *s, int32_t pos)
{
    const int32_t w = s->cfg.window, a = s->cfg.window_align > 1 ? s->cfg.window_align : 1;
    if (w <= 0 || pos < w) return 0;
    const int32_t first = pos - w + 1;
    return first - first % a;
}

/* Give back sq's leading blocks that no token from n_computed on reads: its next token's
 * window starts after them, and later tokens' windows start later still. A prefix block
 * given back is registered already (at the commit that filled it), so it stays cached. */
static void drop_behind_window(tp_scheduler *s, seq *sq)
{
    const int32_t upto = min32(first_kept(s, sq->n_computed) / s->cfg.block_size, sq->n_blocks);
    for (; sq->n_dropped < upto; sq->n_dropped++) (void)tp_block_alloc_put(s->alloc, sq->blocks[sq->n_dropped]);
}

/* realloc array p to n elements, or jump to label on failure (p then unchanged) */
#define RESIZE(p, n, label)                                      \
    do {                                                         \
        void *resize_q_ = realloc((p), (size_t)(n) * sizeof *(p)); \
        if (!resize_q_) goto label;                              \
        (p) = resize_q_;                                         \
    } while (0)

/* room for need elements in p, doubling its capacity cap (a size_t) */
#define GROW(p, cap, need, label)                                \
    do {                                                         \
        if ((size_t)(need) > (cap)) {                            \
            size_t grow_n_ = (cap) ? (cap) : 16;                 \
            while (grow_n_ < (size_t)(need)) grow_n_ *= 2;       \
            RESIZE(p, grow_n_, label);                           \
            (cap) = grow_n_;                                     \
        }                                                        \
    } while (0)

static int grow32(int32_t **p, int32_t *cap, int32_t need, int32_t limit)
{
    if (need <= *cap) return 1;
    int64_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    if (n > limit) n = limit < need ? need : limit; /* no slack past the sequence's end */
    int32_t *q = realloc(*p, (size_t)n * sizeof *q);
    if (!q) return 0;
    *p = q;
    *cap = (int32_t)n;
    return 1;
}

static void list_push_back(seq_list *l, seq *sq)
{
    sq->next = NULL;
    sq->prev = l->tail;
    if (l->tail) l->tail->next = sq;
    else l->head = sq;
    l->tail = sq;
    l->n++;
}

static void list_push_front(seq_list *l, seq *sq)
{
    sq->prev = NULL;
    sq->next = l->head;
    if (l->head) l->head->prev = sq;
    else l->tail = sq;
    l->head = sq;
    l->n++;
}

static void list_remove(seq_list *l, seq *sq)
{
    if (sq->prev) sq->prev->next = sq->next;
    else l->head = sq->next;
    if (sq->next) sq->next->prev = sq->prev;
    else l->tail = sq->prev;
    sq->prev = sq->next = NULL;
    l->n--;
}

static void seq_free(seq *sq)
{
    if (!sq) return;
    free(sq->tokens);
    free(sq->blocks);
    free(sq);
}

static void list_free(seq_list *l)
{
    seq *sq = l->head;
    while (sq) {
        seq *next = sq->next;
        seq_free(sq);
        sq = next;
    }
    l->head = l->tail = NULL;
    l->n = 0;
}

/* ---- key table (linear probing, backward-shift deletion) -------------------------- */

static size_t key_hash(int64_t key)
{
    uint64_t x = (uint64_t)key + 0x9e3779b97f4a7c15ull; /* splitmix64 finalizer */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (size_t)(x ^ (x >> 31));
}

static seq **table_find(const tp_scheduler *s, int64_t key)
{
    if (!s->table_cap) return NULL;
    size_t mask = s->table_cap - 1;
    for (size_t i = key_hash(key) & mask;; i = (i + 1) & mask) {
        if (!s->table[i]) return NULL;
        if (s->table[i]->key == key) return &s->table[i];
    }
}

static void table_place(seq **table, size_t cap, seq *sq)
{
    size_t mask = cap - 1, i = key_hash(sq->key) & mask;
    while (table[i]) i = (i + 1) & mask;
    table[i] = sq;
}

static int table_insert(tp_scheduler *s, seq *sq)
{
    if (2 * (s->table_n + 1) > s->table_cap) { /* keep the load at most 1/2 */
        size_t cap = s->table_cap ? 2 * s->table_cap : 64;
        seq **t = calloc(cap, sizeof *t);
        if (!t) return 0;
        for (size_t i = 0; i < s->table_cap; i++)
            if (s->table[i]) table_place(t, cap, s->table[i]);
        free(s->table);
        s->table = t;
        s->table_cap = cap;
    }
    table_place(s->table, s->table_cap, sq);
    s->table_n++;
    return 1;
}

static void table_remove(tp_scheduler *s, int64_t key)
{
    seq **slot = table_find(s, key);
    if (!slot) return;
    size_t mask = s->table_cap - 1, hole = (size_t)(slot - s->table);
    s->table[hole] = NULL;
    s->table_n--;
    /* shift later members of the probe run back so lookups never stop early */
    for (size_t i = (hole + 1) & mask; s->table[i]; i = (i + 1) & mask) {
        size_t home = key_hash(s->table[i]->key) & mask;
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            s->table[hole] = s->table[i];
            s->table[i] = NULL;
            hole = i;
        }
    }
}

/* ---- create / destroy / add ------------------------------------------------------- */

int64_t tp_sched_seq_blocks(const tp_sched_config *cfg, int64_t n_tokens, int64_t chunk)
{
    const int64_t bs = cfg->block_size > 0 ? cfg->block_size : 1;
    const int64_t all = (n_tokens + bs - 1) / bs;
    if (cfg->window <= 0) return all;
    /* a step from p0 of chunk tokens holds blocks first_kept(p0) / bs .. (p0 + chunk - 1) / bs,
     * and first_kept(p0) >= p0 - window + 1 - (align - 1) */
    const int64_t a = cfg->window_align > 1 ? cfg->window_align : 1;
    const int64_t span = ((int64_t)cfg->window + a + (chunk > 1 ? chunk : 1) - 3) / bs + 2;
    return span < all ? span : all;
}

int32_t tp_sched_fit_seqs(int64_t n_blocks, int64_t seq_blocks, int64_t n_seqs, int32_t lo, int32_t hi)
{
    if (lo > hi) lo = hi;
    if (n_seqs < 1 || seq_blocks < 1) return hi;
    /* n_blocks / (seq_blocks / n_seqs), without the product overflowing */
    double fit = (double)(n_blocks > 0 ? n_blocks : 0) * (double)n_seqs / (double)seq_blocks;
    return fit < lo ? lo : fit > hi ? hi : (int32_t)fit;
}

struct tp_prefix_count {
    int32_t block_size;
    uint64_t *set; /* open addressing; 0 is empty (a hash of 0 is taken as 1) */
    size_t cap, n, max;
};

tp_status tp_prefix_count_create(int32_t block_size, int64_t max_blocks, tp_prefix_count **out)
{
    *out = NULL;
    if (block_size < 1 || max_blocks < 1)
        return tp_error(TP_ERR_INVALID_ARG, "a prefix count of blocks of %d tokens, at most %lld",
                        (int)block_size, (long long)max_blocks);
    tp_prefix_count *c = calloc(1, sizeof *c);
    if (!c) return tp_error(TP_ERR_OOM, "out of memory");
    c->block_size = block_size;
    c->max = (size_t)max_blocks;
    c->cap = 64;
    while (c->cap < 2 * c->max && c->cap < ((size_t)1 << 40)) c->cap *= 2;
    c->set = calloc(c->cap, sizeof *c->set);
    if (!c->set) {
        free(c);
        return tp_error(TP_ERR_OOM, "out of memory for %lld prefixes", (long long)max_blocks);
    }
    *out = c;
    return TP_OK;
}

void tp_prefix_count_destroy(tp_prefix_count *c)
{
    if (!c) return;
    free(c->set);
    free(c);
}

int64_t tp_prefix_count_add(tp_prefix_count *c, const int32_t *prompt, int32_t n_prompt, int32_t copies)
{
    const int32_t bs = c->block_size, limit = n_prompt > 0 ? (n_prompt - 1) / bs : 0;
    int64_t shared = 0;
    uint64_t h = 0;
    for (int32_t j = 0; j < limit; j++) {
        h = tp_block_prefix_hash(h, prompt + (size_t)j * (size_t)bs, bs);
        const uint64_t k = h ? h : 1;
        size_t i = (size_t)k & (c->cap - 1);
        while (c->set[i] && c->set[i] != k) i = (i + 1) & (c->cap - 1);
        if (c->set[i]) shared++;
        else if (c->n < c->max) c->set[i] = k, c->n++;
    }
    if (copies < 1) return 0;
    return shared + (int64_t)limit * (copies - 1); /* later copies read every block the first computes */
}

tp_status tp_scheduler_create(const tp_sched_config *cfg, tp_scheduler **out)
{
    if (!out) return tp_error(TP_ERR_INVALID_ARG, "tp_scheduler_create needs an out pointer");
    *out = NULL;
    if (!cfg) return tp_error(TP_ERR_INVALID_ARG, "tp_scheduler_create needs a config");
    if (cfg->block_size < 1)
        return tp_error(TP_ERR_INVALID_ARG, "KV block size must be at least 1, got %d",
                        (int)cfg->block_size);
    if (cfg->n_blocks < 1)
        return tp_error(TP_ERR_INVALID_ARG, "the KV cache must hold at least 1 block, got %d",
                        (int)cfg->n_blocks);
    if (cfg->max_num_seqs < 1)
        return tp_error(TP_ERR_INVALID_ARG, "--max-num-seqs must be at least 1, got %d",
                        (int)cfg->max_num_seqs);
    if (cfg->max_num_batched_tokens < 1)
        return tp_error(TP_ERR_INVALID_ARG, "--max-num-batched-tokens must be at least 1, got %d",
                        (int)cfg->max_num_batched_tokens);
    if (cfg->max_model_len < 1)
        return tp_error(TP_ERR_INVALID_ARG, "max model length must be at least 1, got %d",
                        (int)cfg->max_model_len);
    if (cfg->window < 0 || cfg->window_align < 0)
        return tp_error(TP_ERR_INVALID_ARG, "a sliding window of %d keys read from multiples of %d",
                        (int)cfg->window, (int)cfg->window_align);
    /* slots are int32: block * block_size + offset must not overflow */
    if ((int64_t)cfg->n_blocks * cfg->block_size > INT32_MAX)
        return tp_error(TP_ERR_INVALID_ARG,
                        "%d KV blocks of %d tokens exceed the 2^31 slots a batch can address",
                        (int)cfg->n_blocks, (int)cfg->block_size);

    tp_scheduler *s = calloc(1, sizeof *s);
    if (!s) return tp_error(TP_ERR_OOM, "out of memory for the scheduler");
    s->cfg = *cfg;
    s->max_blocks = blocks_for(s, cfg->max_model_len);
    tp_status st = tp_block_alloc_create(cfg->n_blocks, cfg->prefix_caching ? cfg->block_size : 0, &s->alloc);
    if (st != TP_OK) {
        free(s);
        return st;
    }
    *out = s;
    return TP_OK;
}

void tp_scheduler_destroy(tp_scheduler *s)
{
    if (!s) return;
    list_free(&s->waiting);
    list_free(&s->running);
    list_free(&s->finished);
    seq_free(s->popped);
    free(s->table);
    free(s->rows);
    free(s->order);
    free(s->inflight);
    free(s->tok);
    free(s->pos);
    free(s->tseq);
    free(s->slot);
    free(s->block_table);
    free(s->seq_key);
    free(s->seq_first);
    free(s->seq_len);
    free(s->logit_token);
    free(s->logit_seq);
    tp_block_alloc_destroy(s->alloc);
    free(s);
}

tp_status tp_scheduler_add(tp_scheduler *s, int64_t key, const int32_t *prompt, int32_t n_prompt,
                           int32_t max_new_tokens, int flags)
{
    if (n_prompt < 1 || !prompt)
        return tp_error(TP_ERR_INVALID_ARG, "sequence %lld has an empty prompt (%d tokens)",
                        (long long)key, (int)n_prompt);
    if (max_new_tokens < 1)
        return tp_error(TP_ERR_INVALID_ARG,
                        "sequence %lld asks for %d new tokens; it must ask for at least 1",
                        (long long)key, (int)max_new_tokens);
    int64_t total = (int64_t)n_prompt + max_new_tokens;
    if (total > s->cfg.max_model_len)
        return tp_error(TP_ERR_INVALID_ARG,
                        "sequence %lld: prompt of %d tokens + %d new tokens = %lld exceeds the "
                        "max model length %d; shorten the prompt or lower max_tokens",
                        (long long)key, (int)n_prompt, (int)max_new_tokens, (long long)total,
                        (int)s->cfg.max_model_len);
    int64_t need = tp_sched_seq_blocks(&s->cfg, total, 1);
    if (need > s->cfg.n_blocks)
        return tp_error(TP_ERR_INVALID_ARG,
                        "sequence %lld needs %lld KV blocks (%lld tokens%s, of %d per block) but "
                        "the cache has only %d; give the KV cache more memory or shorten it",
                        (long long)key, (long long)need, (long long)total,
                        s->cfg.window > 0 ? " behind a sliding window" : "",
                        (int)s->cfg.block_size, (int)s->cfg.n_blocks);
    if (table_find(s, key))
        return tp_error(TP_ERR_INVALID_ARG, "sequence key %lld is already in use",
                        (long long)key);

    seq *sq = calloc(1, sizeof *sq);
    if (!sq) return tp_error(TP_ERR_OOM, "out of memory for a sequence");
    /* room for the prompt and a first few tokens; the rest grows as generated */
    int32_t cap = (int32_t)(n_prompt + min32(max_new_tokens, 16));
    sq->key = key;
    sq->tokens = malloc((size_t)cap * sizeof *sq->tokens);
    if (!sq->tokens || !table_insert(s, sq)) {
        seq_free(sq);
        return tp_error(TP_ERR_OOM, "out of memory for a prompt of %d tokens", (int)n_prompt);
    }
    memcpy(sq->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    sq->len = n_prompt;
    sq->n_resolved = n_prompt;
    sq->cap = cap;
    sq->n_prompt = n_prompt;
    sq->max_new = max_new_tokens;
    sq->n_cached = -1;
    sq->no_hits = (flags & TP_SCHED_NO_PREFIX_HITS) != 0;
    sq->state = SEQ_WAITING;
    sq->step_mark = -1;
    list_push_back(&s->waiting, sq);
    return TP_OK;
}

/* ---- schedule --------------------------------------------------------------------- */

static void release_blocks(tp_scheduler *s, seq *sq)
{
    if (s->cfg.prefix_caching) { /* last block first: a prefix's tail is evicted before its head */
        for (int32_t i = sq->n_blocks - 1; i >= sq->n_dropped; i--) (void)tp_block_alloc_put(s->alloc, sq->blocks[i]);
        /* and the head its window gave back earlier after all of them, if still cached */
        for (int32_t i = sq->n_dropped - 1; i >= 0; i--) tp_block_alloc_touch(s->alloc, sq->blocks[i]);
    } else
        for (int32_t i = sq->n_dropped; i < sq->n_blocks; i++) (void)tp_block_alloc_put(s->alloc, sq->blocks[i]);
    sq->n_blocks = 0;
    sq->n_dropped = 0;
    sq->chain = 0;
    sq->n_chain = 0;
}

/* A sequence with nothing computed takes the registered blocks of its prompt's longest
 * cached prefix, leaving at least its last prompt token to compute. Returns the blocks
 * taken, or -1 on OOM (nothing taken). */
static int32_t take_cached_prefix(tp_scheduler *s, seq *sq)
{
    const int32_t bs = s->cfg.block_size;
    const int32_t limit = (min32(sq->n_prompt, sq->len) - 1) / bs;
    if (!s->cfg.prefix_caching || sq->no_hits || sq->n_computed || limit < 1) return 0;
    if (!grow32(&sq->blocks, &sq->cap_blocks, limit, blocks_for(s, (int64_t)sq->n_prompt + sq->max_new))) return -1;
    uint64_t chain = 0;
    int32_t m = 0;
    for (uint64_t id; m < limit; m++, chain = id) {
        int32_t b = tp_block_alloc_lookup(s->alloc, chain, sq->tokens + (size_t)m * (size_t)bs, &id);
        if (b < 0) break;
        tp_block_alloc_hold(s->alloc, b);
        sq->blocks[m] = b;
    }
    sq->n_blocks = sq->n_chain = m;
    sq->chain = chain;
    sq->n_computed = m * bs;
    return m;
}

/* sq, in this step for len tokens: the first prompt block it completes, if any, is in flight */
static int note_inflight(tp_scheduler *s, const seq *sq, int32_t len)
{
    const int32_t bs = s->cfg.block_size;
    if (!s->cfg.prefix_caching || (int64_t)(sq->n_chain + 1) * bs > min32(sq->n_computed + len, sq->n_prompt)) return 1;
    GROW(s->inflight, s->cap_inflight, s->n_inflight + 1, oom);
    const int32_t *t = sq->tokens + (size_t)sq->n_chain * (size_t)bs;
    s->inflight[s->n_inflight++] = (struct inflight){tp_block_prefix_hash(sq->chain, t, bs), sq->chain, t};
    return 1;
oom:
    return 0;
}

/* A sequence just given its cached prefix: would its next block be computed by a row of this
 * step? Then it does better to wait a step and read it (the step has work without it). */
static int waits_for_inflight(const tp_scheduler *s, const seq *sq)
{
    const int32_t bs = s->cfg.block_size;
    if (!s->n_inflight || sq->no_hits || sq->n_chain >= (min32(sq->n_prompt, sq->len) - 1) / bs) return 0;
    const int32_t *t = sq->tokens + (size_t)sq->n_chain * (size_t)bs;
    const uint64_t h = tp_block_prefix_hash(sq->chain, t, bs);
    for (size_t i = 0; i < s->n_inflight; i++)
        if (s->inflight[i].hash == h && s->inflight[i].chain == sq->chain &&
            !memcmp(s->inflight[i].tokens, t, (size_t)bs * sizeof *t))
            return 1;
    return 0;
}

/* Register sq's blocks that are now full of computed prompt tokens. */
static void register_full_blocks(tp_scheduler *s, seq *sq)
{
    const int32_t bs = s->cfg.block_size;
    const int32_t full = min32(sq->n_computed, sq->n_prompt) / bs;
    for (; sq->n_chain < full; sq->n_chain++)
        sq->chain = tp_block_alloc_register(s->alloc, sq->blocks[sq->n_chain], sq->chain,
                                            sq->tokens + (size_t)sq->n_chain * (size_t)bs);
}

/* Drop sq's KV: it waits at the front of the queue and recomputes its tokens later. Of
 * several preempted in one step (newest first), the older thus ends up first again. */
static void preempt(tp_scheduler *s, seq *sq)
{
    release_blocks(s, sq);
    sq->n_computed = 0;
    list_remove(&s->running, sq);
    list_push_front(&s->waiting, sq);
    sq->state = SEQ_WAITING;
    s->preemptions++;
    s->preempted_now = 1;
}

/* The most recently admitted running sequence not yet placed in this step. */
static seq *newest_unscheduled(const tp_scheduler *s)
{
    for (seq *sq = s->running.tail; sq; sq = sq->prev)
        if (sq->step_mark != s->step_id) return sq;
    return NULL;
}

/* Hold blocks for sq's next `want` tokens. While blocks are short, the newest running
 * sequence not yet in this step is preempted; once that is sq itself the chunk shrinks
 * to what fits. A sequence that cannot get even one slot is preempted when it is the
 * newest running one; otherwise the blocks are held by newer sequences already in this
 * step, and it sits the step out keeping its KV (they will be preempted before it).
 * Returns the tokens granted (maybe 0), or -1 on OOM (the state stays consistent). */
static int32_t reserve(tp_scheduler *s, seq *sq, int32_t want)
{
    const int32_t bs = s->cfg.block_size;
    for (;;) {
        int32_t need = blocks_for(s, (int64_t)sq->n_computed + want) - sq->n_blocks;
        if (need <= tp_block_alloc_n_free(s->alloc)) break;
        seq *victim = newest_unscheduled(s);
        if (victim && victim != sq) {
            preempt(s, victim);
            continue;
        }
        int64_t fit = (int64_t)(sq->n_blocks + tp_block_alloc_n_free(s->alloc)) * bs -
                      sq->n_computed;
        if (fit <= 0) {
            if (sq == s->running.tail) preempt(s, sq);
            return 0;
        }
        want = (int32_t)fit; /* fit < want here */
        break;
    }
    int32_t total = blocks_for(s, (int64_t)sq->n_computed + want);
    int32_t limit = blocks_for(s, (int64_t)sq->n_prompt + sq->max_new);
    if (!grow32(&sq->blocks, &sq->cap_blocks, total, limit)) return -1;
    while (sq->n_blocks < total) sq->blocks[sq->n_blocks++] = tp_block_alloc_get(s->alloc);
    return want;
}

static tp_status add_row(tp_scheduler *s, seq *sq, int32_t len, int decode)
{
    GROW(s->rows, s->cap_rows, (size_t)s->n_rows + 1, oom);
    s->rows[s->n_rows++] = (step_row){sq, len, sq->n_computed + len == sq->len, decode};
    sq->step_mark = s->step_id;
    return TP_OK;
oom:
    return tp_error(TP_ERR_OOM, "out of memory for the batch rows");
}

/* Size the caller-facing arrays for the rows chosen. */
static tp_status grow_batch(tp_scheduler *s, int32_t n_tokens)
{
    if ((size_t)n_tokens > s->cap_tokens) {
        size_t n = s->cap_tokens ? s->cap_tokens : 256;
        while (n < (size_t)n_tokens) n *= 2;
        RESIZE(s->tok, n, oom);
        RESIZE(s->pos, n, oom);
        RESIZE(s->tseq, n, oom);
        RESIZE(s->slot, n, oom);
        s->cap_tokens = n;
    }
    GROW(s->block_table, s->cap_table, (size_t)s->n_rows * (size_t)s->max_blocks, oom);
    if ((size_t)s->n_rows > s->cap_seq_arrays) {
        size_t n = s->cap_seq_arrays ? s->cap_seq_arrays : 16;
        while (n < (size_t)s->n_rows) n *= 2;
        RESIZE(s->seq_key, n, oom);
        RESIZE(s->seq_first, n, oom);
        RESIZE(s->seq_len, n, oom);
        RESIZE(s->logit_token, n, oom);
        RESIZE(s->logit_seq, n, oom);
        s->cap_seq_arrays = n;
    }
    return TP_OK;
oom:
    return tp_error(TP_ERR_OOM, "out of memory for a batch of %d tokens in %d sequences",
                    (int)n_tokens, (int)s->n_rows);
}

static void fill_batch(tp_scheduler *s, tp_sched_batch *b, int32_t n_tokens)
{
    const int32_t bs = s->cfg.block_size, mb = s->max_blocks;
    int32_t t = 0, max_pos = 0;
    s->n_logits = 0;
    for (int32_t r = 0; r < s->n_rows; r++) {
        const step_row *row = &s->rows[r];
        const seq *sq = row->sq;
        s->seq_key[r] = sq->key;
        s->seq_first[r] = t;
        s->seq_len[r] = row->len;
        int32_t *bt = s->block_table + (size_t)r * (size_t)mb;
        memcpy(bt, sq->blocks, (size_t)sq->n_blocks * sizeof *bt);
        memset(bt, 0, (size_t)sq->n_dropped * sizeof *bt); /* given back: entries no kernel reads, in range */
        memset(bt + sq->n_blocks, 0, (size_t)(mb - sq->n_blocks) * sizeof *bt);
        for (int32_t j = 0; j < row->len; j++, t++) {
            int32_t p = sq->n_computed + j;
            s->tok[t] = sq->tokens[p];
            s->pos[t] = p;
            s->tseq[t] = r;
            s->slot[t] = sq->blocks[p / bs] * bs + p % bs;
        }
        if (sq->n_computed + row->len > max_pos) max_pos = sq->n_computed + row->len;
        if (row->logit) {
            s->logit_token[s->n_logits] = t - 1;
            s->logit_seq[s->n_logits] = r;
            s->n_logits++;
        }
    }
    b->n_tokens = n_tokens;
    b->tokens = s->tok;
    b->pos = s->pos;
    b->seq = s->tseq;
    b->slot = s->slot;
    b->n_seqs = s->n_rows;
    b->block_table = s->block_table;
    b->seq_key = s->seq_key;
    b->seq_first = s->seq_first;
    b->seq_len = s->seq_len;
    b->n_logits = s->n_logits;
    b->logit_token = s->logit_token;
    b->logit_seq = s->logit_seq;
    b->max_pos = max_pos;
}

tp_status tp_scheduler_schedule(tp_scheduler *s, tp_sched_batch *b)
{
    memset(b, 0, sizeof *b);
    b->max_blocks = s->max_blocks;
    if (s->pending)
        return tp_error(TP_ERR_INTERNAL, "scheduler step %lld was never committed",
                        (long long)s->steps);
    s->step_id++;
    s->n_rows = 0;
    s->n_inflight = 0;
    s->n_logits = 0;
    s->preempted_now = 0;
    int32_t budget = s->cfg.max_num_batched_tokens;

    /* a snapshot, since preemption reorders the lists under the loops; blocks behind every
     * window go back first, for this step's sequences to take */
    GROW(s->order, s->cap_order, (size_t)s->running.n, oom);
    int32_t n_order = 0;
    for (seq *sq = s->running.head; sq; sq = sq->next) {
        drop_behind_window(s, sq);
        s->order[n_order++] = sq;
    }

    /* 1. decodes: all but the last token computed; one token each, admission order */
    for (int32_t i = 0; i < n_order && budget > 0; i++) {
        seq *sq = s->order[i];
        if (sq->state != SEQ_RUNNING || sq->n_computed != sq->len - 1) continue;
        int32_t got = reserve(s, sq, 1);
        if (got < 0) return tp_error(TP_ERR_OOM, "out of memory for a block list");
        if (got == 0) continue;
        TP_CHECK(add_row(s, sq, 1, 1));
        budget -= 1;
    }
    /* 2a. prefill chunks of running sequences (their chunk may end the known tokens) */
    for (int32_t i = 0; i < n_order && budget > 0; i++) {
        seq *sq = s->order[i];
        if (sq->state != SEQ_RUNNING || sq->step_mark == s->step_id ||
            sq->n_computed >= sq->len - 1)
            continue;
        int32_t got = reserve(s, sq, min32(sq->len - sq->n_computed, budget));
        if (got < 0) return tp_error(TP_ERR_OOM, "out of memory for a block list");
        if (got == 0) continue;
        TP_CHECK(add_row(s, sq, got, 0));
        if (!note_inflight(s, sq, got)) return tp_error(TP_ERR_OOM, "out of memory for the step's blocks");
        budget -= got;
    }
    /* 2b. admit waiting sequences FIFO; never in a step that had to preempt (vLLM does
     * the same: memory just ran short), and never by evicting running ones */
    while (!s->preempted_now && s->waiting.head && s->running.n < s->cfg.max_num_seqs &&
           budget > 0) {
        seq *sq = s->waiting.head;
        const int32_t hit = take_cached_prefix(s, sq);
        if (hit < 0) return tp_error(TP_ERR_OOM, "out of memory for a block list");
        drop_behind_window(s, sq); /* cached blocks before its first chunk's windows */
        const int64_t free_blocks = tp_block_alloc_n_free(s->alloc);
        const int32_t want = admit_want(s, sq, budget, free_blocks);
        if (want < 1 || !admit_fits(s, sq, sq->n_blocks - sq->n_dropped, free_blocks, s->running.n) ||
            waits_for_inflight(s, sq)) {
            release_blocks(s, sq); /* what it took waits in the cache with it */
            sq->n_computed = 0;
            break;
        }
        if (sq->n_cached < 0) sq->n_cached = hit * s->cfg.block_size;
        s->cached_tokens += (int64_t)hit * s->cfg.block_size;
        list_remove(&s->waiting, sq);
        list_push_back(&s->running, sq);
        sq->state = SEQ_RUNNING;
        int32_t got = reserve(s, sq, want); /* fits: no preemption */
        if (got < 0) return tp_error(TP_ERR_OOM, "out of memory for a block list");
        TP_CHECK(add_row(s, sq, got, 0));
        if (!note_inflight(s, sq, got)) return tp_error(TP_ERR_OOM, "out of memory for the step's blocks");
        budget -= got;
    }

    int32_t n_tokens = s->cfg.max_num_batched_tokens - budget;
    if (n_tokens == 0) {
        /* cannot happen: the oldest running sequence always fits; say so, not spin */
        if (tp_scheduler_idle(s)) return TP_OK;
        return tp_error(TP_ERR_INTERNAL, "scheduler found nothing to run with %d sequences "
                        "waiting and %d running", (int)s->waiting.n, (int)s->running.n);
    }
    TP_CHECK(grow_batch(s, n_tokens));
    fill_batch(s, b, n_tokens);
    for (int32_t r = 0; r < s->n_rows; r++) {
        if (s->rows[r].decode) s->decode_tokens += s->rows[r].len;
        else s->prefill_tokens += s->rows[r].len;
    }
    s->steps++;
    s->pending = 1;
    return TP_OK;
oom:
    return tp_error(TP_ERR_OOM, "out of memory for the running list");
}

/* ---- commit / results ------------------------------------------------------------- */

static void finish_seq(tp_scheduler *s, seq *sq)
{
    release_blocks(s, sq);
    list_remove(&s->running, sq);
    list_push_back(&s->finished, sq);
    sq->state = SEQ_FINISHED;
}

tp_status tp_scheduler_commit(tp_scheduler *s, const tp_sched_batch *b, const int32_t *sampled,
                              const uint8_t *finish)
{
    if (!s->pending)
        return tp_error(TP_ERR_INTERNAL, "scheduler commit without a scheduled step");
    if (b->n_seqs != s->n_rows || b->n_logits != s->n_logits)
        return tp_error(TP_ERR_INTERNAL,
                        "scheduler commit of a batch of %d rows / %d logits, but the step has "
                        "%d / %d", (int)b->n_seqs, (int)b->n_logits, (int)s->n_rows,
                        (int)s->n_logits);
    if (s->n_logits > 0 && !sampled)
        return tp_error(TP_ERR_INVALID_ARG, "scheduler commit without sampled tokens");
    /* make room for the new tokens first, so an OOM changes nothing; a known token after a
     * pending one would be overwritten by the next resolve: pending ones come last */
    for (int32_t i = 0; i < s->n_logits; i++) {
        seq *sq = s->rows[s->logit_seq[i]].sq;
        if (sampled && sampled[i] != TP_TOKEN_PENDING && sq->n_resolved != sq->len)
            return tp_error(TP_ERR_INTERNAL, "scheduler commit of a known token after %d pending ones of sequence "
                            "%lld", (int)(sq->len - sq->n_resolved), (long long)sq->key);
        if (!grow32(&sq->tokens, &sq->cap, sq->len + 1, sq->n_prompt + sq->max_new))
            return tp_error(TP_ERR_OOM, "out of memory for generated tokens");
    }
    s->pending = 0;
    for (int32_t r = 0; r < s->n_rows; r++) {
        seq *sq = s->rows[r].sq;
        sq->n_computed += s->rows[r].len;
        if (s->cfg.prefix_caching) register_full_blocks(s, sq);
    }
    for (int32_t i = 0; i < s->n_logits; i++) {
        seq *sq = s->rows[s->logit_seq[i]].sq;
        if (sq->n_resolved == sq->len && sampled[i] != TP_TOKEN_PENDING) sq->n_resolved++;
        sq->tokens[sq->len++] = sampled[i];
        if ((finish && finish[i]) || sq->len - sq->n_prompt >= sq->max_new ||
            sq->len >= s->cfg.max_model_len)
            finish_seq(s, sq);
    }
    return TP_OK;
}

int tp_scheduler_resolve(tp_scheduler *s, int64_t key, int32_t token, int end)
{
    seq **slot = table_find(s, key);
    seq *sq = slot ? *slot : NULL;
    if (!sq || sq->n_resolved >= sq->len) return 0;
    sq->tokens[sq->n_resolved++] = token;
    if (!end) return 1;
    sq->len = sq->n_resolved;
    if (sq->n_computed > sq->len) sq->n_computed = sq->len;
    if (sq->state == SEQ_RUNNING) {
        finish_seq(s, sq);
    } else if (sq->state == SEQ_WAITING) { /* preempted: nothing of it is in the cache */
        list_remove(&s->waiting, sq);
        list_push_back(&s->finished, sq);
        sq->state = SEQ_FINISHED;
    }
    return 1;
}

int tp_scheduler_pop_finished(tp_scheduler *s, int64_t *key, const int32_t **generated,
                              int32_t *n_generated)
{
    seq_free(s->popped);
    s->popped = NULL;
    seq *sq = s->finished.head;
    if (!sq) return 0;
    list_remove(&s->finished, sq);
    table_remove(s, sq->key);
    s->popped = sq;
    *key = sq->key;
    *generated = sq->tokens + sq->n_prompt;
    *n_generated = sq->len - sq->n_prompt;
    return 1;
}

int32_t tp_scheduler_cached_tokens(const tp_scheduler *s, int64_t key)
{
    seq **slot = table_find(s, key);
    const seq *sq = slot ? *slot : s->popped && s->popped->key == key ? s->popped : NULL;
    return sq && sq->n_cached > 0 ? sq->n_cached : 0;
}

int tp_scheduler_idle(const tp_scheduler *s) { return !s->waiting.n && !s->running.n; }

void tp_scheduler_peek_first(const tp_scheduler *s, int32_t *n_tokens, int32_t *n_seqs)
{
    int32_t budget = s->cfg.max_num_batched_tokens, n = 0;
    int64_t free_blocks = tp_block_alloc_n_free(s->alloc);
    const int32_t bs = s->cfg.block_size;
    /* prefix caching: nothing is cached yet, but a sequence waits where its first block is
     * one that an earlier one completes in this step (schedule's waits_for_inflight) */
    const int32_t **flight = s->cfg.prefix_caching ? malloc((size_t)s->cfg.max_num_seqs * sizeof *flight) : NULL;
    int32_t n_flight = 0;
    for (const seq *sq = s->waiting.head; sq && n < s->cfg.max_num_seqs && budget > 0; sq = sq->next, n++) {
        const int32_t want = admit_want(s, sq, budget, free_blocks);
        if (want < 1 || !admit_fits(s, sq, 0, free_blocks, n)) break;
        int waits = 0;
        if (flight && !sq->no_hits && (min32(sq->n_prompt, sq->len) - 1) / bs >= 1)
            for (int32_t k = 0; k < n_flight && !waits; k++)
                waits = !memcmp(flight[k], sq->tokens, (size_t)bs * sizeof *sq->tokens);
        if (waits) break;
        if (flight && bs <= min32(want, sq->n_prompt)) flight[n_flight++] = sq->tokens;
        budget -= want;
        free_blocks -= TP_CEIL_DIV(want, s->cfg.block_size); /* a fresh sequence's blocks */
    }
    free(flight);
    *n_tokens = s->cfg.max_num_batched_tokens - budget;
    *n_seqs = n;
}

void tp_scheduler_stats(const tp_scheduler *s, tp_sched_stats *st)
{
    st->steps = s->steps;
    st->preemptions = s->preemptions;
    st->prefill_tokens = s->prefill_tokens;
    st->decode_tokens = s->decode_tokens;
    st->cached_tokens = s->cached_tokens;
    st->waiting = s->waiting.n;
    st->running = s->running.n;
    st->free_blocks = tp_block_alloc_n_free(s->alloc);
}
