/*
 * check_scheduler.c: the continuous-batching scheduler driven by a fake engine whose
 * "model" reads each sequence's history back out of a fake paged KV cache, so a wrong
 * slot, block table or recomputation shows up as a wrong token. Every step is checked
 * against the batch invariants, every result against the sequence run alone.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_alloc.h"
#include "scheduler.h"

#define VOCAB 1000
#define MAX_STEPS 1000000

/* check records every passing ck_assert (a write each) and the engine checks millions
 * of facts, so these call into check only when the fact is false */
#define REQUIRE(c) do { if (!(c)) ck_assert(c); } while (0)
#define REQUIRE_EQ(a, b) do { if ((a) != (b)) ck_assert_int_eq(a, b); } while (0)
#define REQUIRE_NE(a, b) do { if ((a) == (b)) ck_assert_int_ne(a, b); } while (0)
#define REQUIRE_LT(a, b) do { if (!((a) < (b))) ck_assert_int_lt(a, b); } while (0)
#define REQUIRE_LE(a, b) do { if (!((a) <= (b))) ck_assert_int_le(a, b); } while (0)
#define REQUIRE_GE(a, b) do { if (!((a) >= (b))) ck_assert_int_ge(a, b); } while (0)

/* ---- the fake model --------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static int32_t model_next(const int32_t *hist, int32_t n)
{
    return (int32_t)(fnv(0xcbf29ce484222325ull, hist, (size_t)n * sizeof *hist) % VOCAB);
}

static int is_eos(int32_t tok) { return tok % 37 == 0; }

static uint64_t rng_next(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi] */
static int32_t rng_range(uint64_t *st, int32_t lo, int32_t hi)
{
    return lo + (int32_t)(rng_next(st) % (uint64_t)(hi - lo + 1));
}

/* ---- the fake engine -------------------------------------------------------------- */

typedef struct fake_seq {
    int64_t key;
    int32_t *prompt;
    int32_t n_prompt, max_new;
    int32_t stop_after; /* finish[] is set on this generated token (1-based); 0: never */
    int flags;          /* tp_scheduler_add's */
    int64_t add_step;   /* added before the step with this index */
    int32_t *expect;    /* the tokens it generates when run alone */
    int32_t n_expect;
    int32_t *hist;      /* engine view: prompt + sampled */
    int32_t len, computed;
    int added, done, restarts;
    int64_t mark;
} fake_seq;

typedef struct engine {
    tp_sched_config cfg;
    int eos;            /* also finish on the model's EOS tokens */
    fake_seq *seqs;
    int32_t n_seqs, n_added, n_done;
    /* fake KV cache: who wrote what where, and the history it was written after (a key
     * or value depends on every token before it: a shared block must have the same) */
    int64_t *cache_key;
    int32_t *cache_pos, *cache_tok;
    uint64_t *cache_hist;
    int64_t *slot_mark, *block_mark;
    int32_t *block_rows; /* rows of this step holding the block (block_mark == step) */
    uint64_t *hashes;   /* one per step: every batch array and the sampled tokens */
    int64_t n_hashes, cap_hashes;
    /* what was seen */
    int64_t restarts, partial_chunks, mixed_steps, max_rows, finish_order_violations;
    int64_t hit_tokens, shared_blocks; /* prefix caching: tokens not computed, blocks in two rows of a step */
    int64_t most_held;  /* the most blocks one row held in a step */
    int64_t last_done_index;
    tp_sched_stats stats;
} engine;

static void engine_init(engine *e, const tp_sched_config *cfg, int eos)
{
    memset(e, 0, sizeof *e);
    e->cfg = *cfg;
    e->eos = eos;
    size_t n_slots = (size_t)cfg->n_blocks * (size_t)cfg->block_size;
    e->cache_key = malloc(n_slots * sizeof *e->cache_key);
    e->cache_pos = malloc(n_slots * sizeof *e->cache_pos);
    e->cache_tok = malloc(n_slots * sizeof *e->cache_tok);
    e->cache_hist = calloc(n_slots, sizeof *e->cache_hist);
    e->slot_mark = calloc(n_slots, sizeof *e->slot_mark);
    e->block_mark = calloc((size_t)cfg->n_blocks, sizeof *e->block_mark);
    e->block_rows = calloc((size_t)cfg->n_blocks, sizeof *e->block_rows);
    REQUIRE(e->cache_key && e->cache_pos && e->cache_tok && e->cache_hist && e->slot_mark && e->block_mark &&
            e->block_rows);
    for (size_t i = 0; i < n_slots; i++) e->cache_key[i] = e->slot_mark[i] = -1;
    for (int32_t i = 0; i < cfg->n_blocks; i++) e->block_mark[i] = -1;
    e->last_done_index = -1;
}

static void engine_free(engine *e)
{
    for (int32_t i = 0; i < e->n_seqs; i++) {
        free(e->seqs[i].prompt);
        free(e->seqs[i].expect);
        free(e->seqs[i].hist);
    }
    free(e->seqs);
    free(e->cache_key);
    free(e->cache_pos);
    free(e->cache_tok);
    free(e->cache_hist);
    free(e->slot_mark);
    free(e->block_mark);
    free(e->block_rows);
    free(e->hashes);
}

static int64_t key_of(int32_t i) { return (int64_t)i * 1000003 - 500; }

static fake_seq *seq_of_key(engine *e, int64_t key)
{
    int64_t i = (key + 500) / 1000003;
    REQUIRE(key_of((int32_t)i) == key && i >= 0 && i < e->n_seqs);
    return &e->seqs[i];
}

/* Queue a sequence (added before step add_step) and compute what it generates alone. */
static void engine_seq(engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                       int32_t stop_after, int64_t add_step)
{
    e->seqs = realloc(e->seqs, (size_t)(e->n_seqs + 1) * sizeof *e->seqs);
    ck_assert_ptr_nonnull(e->seqs);
    fake_seq *fs = &e->seqs[e->n_seqs];
    memset(fs, 0, sizeof *fs);
    fs->key = key_of(e->n_seqs);
    e->n_seqs++;
    fs->n_prompt = n_prompt;
    fs->max_new = max_new;
    fs->stop_after = stop_after;
    fs->add_step = add_step;
    fs->mark = -1;
    fs->prompt = malloc((size_t)n_prompt * sizeof *fs->prompt);
    fs->hist = malloc((size_t)(n_prompt + max_new) * sizeof *fs->hist);
    fs->expect = malloc((size_t)max_new * sizeof *fs->expect);
    REQUIRE(fs->prompt && fs->hist && fs->expect);
    memcpy(fs->prompt, prompt, (size_t)n_prompt * sizeof *prompt);

    /* the reference: the model run on this sequence alone */
    int32_t *h = malloc((size_t)(n_prompt + max_new) * sizeof *h);
    ck_assert_ptr_nonnull(h);
    memcpy(h, prompt, (size_t)n_prompt * sizeof *prompt);
    int32_t n = n_prompt;
    for (int32_t g = 1; g <= max_new; g++) {
        int32_t tok = model_next(h, n);
        h[n++] = tok;
        fs->expect[fs->n_expect++] = tok;
        if (g == stop_after || (e->eos && is_eos(tok))) break;
    }
    free(h);
}

static void engine_random_seq(engine *e, uint64_t *rng, int32_t n_prompt, int32_t max_new,
                              int32_t stop_after, int64_t add_step)
{
    int32_t *p = malloc((size_t)n_prompt * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (int32_t i = 0; i < n_prompt; i++) p[i] = rng_range(rng, 0, VOCAB - 1);
    engine_seq(e, p, n_prompt, max_new, stop_after, add_step);
    free(p);
}

static void add_to_scheduler(engine *e, tp_scheduler *s, fake_seq *fs)
{
    ck_assert_int_eq(tp_scheduler_add(s, fs->key, fs->prompt, fs->n_prompt, fs->max_new, fs->flags), TP_OK);
    memcpy(fs->hist, fs->prompt, (size_t)fs->n_prompt * sizeof *fs->prompt);
    fs->len = fs->n_prompt;
    fs->computed = 0;
    fs->added = 1;
    e->n_added++;
}

static void record_hash(engine *e, const tp_sched_batch *b, const int32_t *sampled,
                        const uint8_t *finish)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, &b->n_tokens, sizeof b->n_tokens);
    h = fnv(h, b->tokens, (size_t)b->n_tokens * sizeof *b->tokens);
    h = fnv(h, b->pos, (size_t)b->n_tokens * sizeof *b->pos);
    h = fnv(h, b->seq, (size_t)b->n_tokens * sizeof *b->seq);
    h = fnv(h, b->slot, (size_t)b->n_tokens * sizeof *b->slot);
    h = fnv(h, &b->n_seqs, sizeof b->n_seqs);
    h = fnv(h, &b->max_blocks, sizeof b->max_blocks);
    h = fnv(h, b->block_table, (size_t)b->n_seqs * (size_t)b->max_blocks * sizeof(int32_t));
    h = fnv(h, b->seq_key, (size_t)b->n_seqs * sizeof *b->seq_key);
    h = fnv(h, b->seq_first, (size_t)b->n_seqs * sizeof *b->seq_first);
    h = fnv(h, b->seq_len, (size_t)b->n_seqs * sizeof *b->seq_len);
    h = fnv(h, &b->n_logits, sizeof b->n_logits);
    h = fnv(h, b->logit_token, (size_t)b->n_logits * sizeof *b->logit_token);
    h = fnv(h, b->logit_seq, (size_t)b->n_logits * sizeof *b->logit_seq);
    h = fnv(h, &b->max_pos, sizeof b->max_pos);
    h = fnv(h, sampled, (size_t)b->n_logits * sizeof *sampled);
    h = fnv(h, finish, (size_t)b->n_logits);
    if (e->n_hashes == e->cap_hashes) {
        e->cap_hashes = e->cap_hashes ? 2 * e->cap_hashes : 256;
        e->hashes = realloc(e->hashes, (size_t)e->cap_hashes * sizeof *e->hashes);
        ck_assert_ptr_nonnull(e->hashes);
    }
    e->hashes[e->n_hashes++] = h;
}

/* With a sliding window, the first position a token at pos reads (its window's first key,
 * rounded down as the backend reads it); 0 without one. The scheduler's own rule, written
 * again here from its description. */
static int32_t first_read(const tp_sched_config *c, int32_t pos)
{
    if (c->window <= 0 || pos < c->window) return 0;
    const int32_t first = pos - c->window + 1, a = c->window_align > 1 ? c->window_align : 1;
    return first / a * a;
}

/* The longest sequence (prompt + new tokens) a config takes: what its cache holds, or behind
 * a window, any up to max_model_len whose window fits it. */
static int64_t longest_seq(const tp_sched_config *c)
{
    if (c->window > 0 && tp_sched_seq_blocks(c, c->max_model_len, 1) <= c->n_blocks) return c->max_model_len;
    const int64_t cap = (int64_t)c->n_blocks * c->block_size;
    return cap < c->max_model_len ? cap : c->max_model_len;
}

/* Every structural promise of one batch, and the KV that attention would read. */
static void check_batch(engine *e, tp_scheduler *s, const tp_sched_batch *b, int64_t step)
{
    const tp_sched_config *c = &e->cfg;
    const int32_t bs = c->block_size;
    tp_sched_stats st;
    tp_scheduler_stats(s, &st);

    REQUIRE_GE(b->n_tokens, 1);
    REQUIRE_LE(b->n_tokens, c->max_num_batched_tokens);
    REQUIRE_GE(b->n_seqs, 1);
    REQUIRE_LE(b->n_seqs, c->max_num_seqs);
    REQUIRE_LE(st.running, c->max_num_seqs);
    REQUIRE_GE(st.running, b->n_seqs);
    REQUIRE_EQ(st.waiting + st.running, e->n_added - e->n_done);
    REQUIRE_EQ(b->max_blocks, (c->max_model_len + bs - 1) / bs);
    if (b->n_seqs > e->max_rows) e->max_rows = b->n_seqs;

    int32_t t = 0, max_pos = 0, logits_expected = 0, owned = 0;
    int has_decode = 0, has_prefill = 0;
    for (int32_t r = 0; r < b->n_seqs; r++) {
        fake_seq *fs = seq_of_key(e, b->seq_key[r]);
        REQUIRE(fs->added && !fs->done);
        REQUIRE_NE(fs->mark, step); /* one row per sequence */
        fs->mark = step;
        REQUIRE_EQ(b->seq_first[r], t);
        int32_t n = b->seq_len[r];
        REQUIRE_GE(n, 1);
        REQUIRE_LE(t + n, b->n_tokens);
        int32_t p0 = b->pos[t];
        if (p0 == 0 && fs->computed > 0) { /* preempted and now recomputed */
            fs->restarts++;
            e->restarts++;
            fs->computed = 0;
        }
        if (c->prefix_caching && p0 != fs->computed) {
            /* (re)admitted after a cached prefix of whole prompt blocks, the last prompt
             * token always computed */
            REQUIRE_EQ(p0 % bs, 0);
            REQUIRE_LT(p0, fs->n_prompt);
            REQUIRE(!(fs->flags & TP_SCHED_NO_PREFIX_HITS));
            if (fs->computed > 0) fs->restarts++, e->restarts++;
            e->hit_tokens += p0;
            fs->computed = p0;
        }
        REQUIRE_EQ(p0, fs->computed);
        int32_t last = p0 + n - 1;
        REQUIRE_LT(last, fs->len); /* only known tokens are fed */
        if (n == 1 && last == fs->len - 1 && p0 > 0) has_decode = 1;
        else has_prefill = 1;
        if (last < fs->len - 1) e->partial_chunks++;
        if (last == fs->len - 1) logits_expected++;

        /* the block table row: exactly the blocks its positions need, then zeros; behind a
         * window, zeros too for the blocks before what its first token reads, given back */
        const int32_t *bt = b->block_table + (size_t)r * (size_t)b->max_blocks;
        int32_t nb = last / bs + 1, kept = first_read(c, p0) / bs;
        REQUIRE_LE(nb, b->max_blocks);
        REQUIRE_LE(nb - kept, tp_sched_seq_blocks(c, last + 1, n));
        if (nb - kept > e->most_held) e->most_held = nb - kept;
        for (int32_t j = 0; j < b->max_blocks; j++) {
            if (j >= nb || j < kept) {
                REQUIRE_EQ(bt[j], 0);
                continue;
            }
            REQUIRE_GE(bt[j], 0);
            REQUIRE_LT(bt[j], c->n_blocks);
            if (e->block_mark[bt[j]] != step) {
                e->block_mark[bt[j]] = step;
                e->block_rows[bt[j]] = 0;
                owned++;
            } else {
                REQUIRE(c->prefix_caching); /* never owned twice but as a shared prefix */
                e->shared_blocks++;
            }
            e->block_rows[bt[j]]++;
        }

        uint64_t hist = fnv(0xcbf29ce484222325ull, fs->hist, (size_t)p0 * sizeof *fs->hist);
        for (int32_t j = 0; j < n; j++, t++) {
            int32_t p = p0 + j;
            REQUIRE_EQ(b->seq[t], r);
            REQUIRE_EQ(b->pos[t], p);
            REQUIRE_EQ(b->tokens[t], fs->hist[p]);
            REQUIRE_EQ(b->slot[t], bt[p / bs] * bs + p % bs);
            REQUIRE_NE(e->slot_mark[b->slot[t]], step); /* no shared slot */
            e->slot_mark[b->slot[t]] = step;
            /* the layer writes this token's KV */
            hist = fnv(hist, &fs->hist[p], sizeof *fs->hist);
            e->cache_key[b->slot[t]] = fs->key;
            e->cache_pos[b->slot[t]] = p;
            e->cache_tok[b->slot[t]] = b->tokens[t];
            e->cache_hist[b->slot[t]] = hist;
        }
        if (last + 1 > max_pos) max_pos = last + 1;
    }
    REQUIRE_EQ(t, b->n_tokens);
    REQUIRE_EQ(b->max_pos, max_pos);
    REQUIRE_EQ(b->n_logits, logits_expected);
    if (has_decode && has_prefill) e->mixed_steps++;
    /* a block this step writes belongs to one row alone (the rows run in one pass: a
     * block shared with another row would be read while written) */
    for (int32_t i = 0; i < b->n_tokens; i++) REQUIRE_EQ(e->block_rows[b->slot[i] / bs], 1);

    /* blocks: all of them are free or owned by a running sequence */
    REQUIRE_LE(st.free_blocks + owned, c->n_blocks);
    if (st.running == b->n_seqs) REQUIRE_EQ(st.free_blocks + owned, c->n_blocks);

    /* attention reads positions 0..last of every row through its block table (behind a
     * window, from what its first token reads): all must hold that sequence's own tokens */
    for (int32_t r = 0; r < b->n_seqs; r++) {
        fake_seq *fs = seq_of_key(e, b->seq_key[r]);
        const int32_t *bt = b->block_table + (size_t)r * (size_t)b->max_blocks;
        int32_t last = b->pos[b->seq_first[r] + b->seq_len[r] - 1];
        const int32_t from = first_read(c, b->pos[b->seq_first[r]]);
        uint64_t hist = 0xcbf29ce484222325ull;
        for (int32_t q = 0; q <= last; q++) {
            int32_t sl = bt[q / bs] * bs + q % bs;
            hist = fnv(hist, &fs->hist[q], sizeof *fs->hist);
            if (q < from) continue;
            if (!c->prefix_caching) REQUIRE_EQ(e->cache_key[sl], fs->key);
            REQUIRE_EQ(e->cache_pos[sl], q);
            REQUIRE_EQ(e->cache_tok[sl], fs->hist[q]);
            REQUIRE_EQ(e->cache_hist[sl], hist);
        }
    }
}

/* The model at a logit row: read the history back from the fake cache. Behind a window the
 * positions before it are not in the cache: they reach the model through the keys it reads
 * (whose histories check_batch compared), so here they come from the engine's view. */
static int32_t model_from_cache(const engine *e, const tp_sched_batch *b, int32_t row,
                                int32_t last, const fake_seq *fs, int32_t *scratch)
{
    const int32_t bs = e->cfg.block_size, from = first_read(&e->cfg, last);
    const int32_t *bt = b->block_table + (size_t)row * (size_t)b->max_blocks;
    for (int32_t q = 0; q <= last; q++) scratch[q] = q < from ? fs->hist[q] : e->cache_tok[bt[q / bs] * bs + q % bs];
    return model_next(scratch, last + 1);
}

/* Run every sequence of e to the end, checking each step and each result. */
static void engine_run(engine *e)
{
    tp_scheduler *s = NULL;
    ck_assert_int_eq(tp_scheduler_create(&e->cfg, &s), TP_OK);
    int32_t *sampled = malloc((size_t)e->cfg.max_num_seqs * sizeof *sampled);
    uint8_t *finish = malloc((size_t)e->cfg.max_num_seqs);
    int32_t *scratch = malloc((size_t)e->cfg.max_model_len * sizeof *scratch);
    REQUIRE(sampled && finish && scratch);

    int64_t step = 0;
    for (;;) {
        REQUIRE_LT(step, MAX_STEPS);
        for (int32_t i = 0; i < e->n_seqs; i++)
            if (!e->seqs[i].added && e->seqs[i].add_step <= step)
                add_to_scheduler(e, s, &e->seqs[i]);
        tp_sched_batch b;
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        if (b.n_tokens == 0) {
            REQUIRE(tp_scheduler_idle(s));
            REQUIRE_EQ(b.n_seqs, 0);
            REQUIRE_EQ(b.n_logits, 0);
            if (e->n_added == e->n_seqs) break;
            /* idle before the next arrival: let it arrive now */
            int64_t next = INT64_MAX;
            for (int32_t i = 0; i < e->n_seqs; i++)
                if (!e->seqs[i].added && e->seqs[i].add_step < next) next = e->seqs[i].add_step;
            step = next;
            continue;
        }
        REQUIRE(!tp_scheduler_idle(s));
        check_batch(e, s, &b, step);

        for (int32_t i = 0; i < b.n_logits; i++) {
            int32_t r = b.logit_seq[i];
            REQUIRE_GE(r, 0);
            REQUIRE_LT(r, b.n_seqs);
            REQUIRE_EQ(b.logit_token[i], b.seq_first[r] + b.seq_len[r] - 1);
            REQUIRE(i == 0 || b.logit_seq[i - 1] < r);
            fake_seq *fs = seq_of_key(e, b.seq_key[r]);
            int32_t tok = model_from_cache(e, &b, r, b.pos[b.logit_token[i]], fs, scratch);
            REQUIRE_EQ(tok, model_next(fs->hist, fs->len));
            int32_t g = fs->len - fs->n_prompt; /* tokens generated before this one */
            REQUIRE_LT(g, fs->n_expect);
            REQUIRE_EQ(tok, fs->expect[g]);
            sampled[i] = tok;
            finish[i] = (uint8_t)(g + 1 == fs->stop_after || (e->eos && is_eos(tok)));
        }
        /* the engine's view advances: fed tokens computed, sampled ones appended */
        for (int32_t r = 0; r < b.n_seqs; r++) {
            fake_seq *fs = seq_of_key(e, b.seq_key[r]);
            fs->computed = b.pos[b.seq_first[r] + b.seq_len[r] - 1] + 1;
        }
        for (int32_t i = 0; i < b.n_logits; i++) {
            fake_seq *fs = seq_of_key(e, b.seq_key[b.logit_seq[i]]);
            fs->hist[fs->len++] = sampled[i];
        }
        record_hash(e, &b, sampled, finish);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, sampled, finish), TP_OK);

        int64_t key;
        const int32_t *gen;
        int32_t n_gen;
        while (tp_scheduler_pop_finished(s, &key, &gen, &n_gen)) {
            fake_seq *fs = seq_of_key(e, key);
            REQUIRE(fs->added && !fs->done);
            REQUIRE_EQ(fs->mark, step); /* finished by this step's commit */
            REQUIRE_EQ(n_gen, fs->n_expect);
            REQUIRE_EQ(n_gen, fs->len - fs->n_prompt);
            ck_assert_mem_eq(gen, fs->expect, (size_t)n_gen * sizeof *gen);
            fs->done = 1;
            e->n_done++;
            int64_t idx = fs - e->seqs;
            if (idx < e->last_done_index) e->finish_order_violations++;
            e->last_done_index = idx;
        }
        step++;
    }

    for (int32_t i = 0; i < e->n_seqs; i++) REQUIRE(e->seqs[i].done);
    tp_scheduler_stats(s, &e->stats);
    REQUIRE_EQ(e->stats.waiting, 0);
    REQUIRE_EQ(e->stats.running, 0);
    REQUIRE_EQ(e->stats.free_blocks, e->cfg.n_blocks);
    REQUIRE_EQ(e->stats.steps, e->n_hashes);
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n_gen), 0);
    REQUIRE(e->stats.preemptions > 0 || e->restarts == 0);
    REQUIRE_GE(e->stats.preemptions, e->restarts);
    /* a sequence readmitted with as many cached tokens as it had computed goes unseen */
    if (!e->stats.preemptions) REQUIRE_EQ(e->stats.cached_tokens, e->hit_tokens);
    REQUIRE_GE(e->stats.cached_tokens, e->hit_tokens);
    if (!e->cfg.prefix_caching) REQUIRE_EQ(e->hit_tokens, 0);
    free(sampled);
    free(finish);
    free(scratch);
    tp_scheduler_destroy(s);
}

/* n random sequences that each fit the config; add_spread > 0 staggers their arrival */
static void random_workload(engine *e, uint64_t seed, int32_t n, int32_t max_prompt,
                            int32_t max_new, int64_t add_spread, int stops)
{
    uint64_t rng = seed;
    const int64_t cap = longest_seq(&e->cfg);
    for (int32_t i = 0; i < n; i++) {
        int32_t np = rng_range(&rng, 1, max_prompt);
        if (np > cap - 1) np = (int32_t)cap - 1;
        if (np < 1) np = 1;
        int32_t mn = rng_range(&rng, 1, max_new);
        if (np + mn > cap) mn = (int32_t)cap - np;
        REQUIRE_GE(mn, 1);
        int32_t stop = stops && rng_range(&rng, 0, 3) == 0 ? rng_range(&rng, 1, mn) : 0;
        int64_t at = add_spread > 0 ? rng_range(&rng, 0, (int32_t)add_spread) : 0;
        engine_random_seq(e, &rng, np, mn, stop, at);
    }
}

/* ---- the cases -------------------------------------------------------------------- */

START_TEST(block_alloc_basics)
{
    tp_block_alloc *a = NULL;
    tp_error_clear();
    ck_assert_int_eq(tp_block_alloc_create(0, 0, &a), TP_ERR_INVALID_ARG);
    ck_assert_ptr_null(a);
    ck_assert_int_eq(tp_block_alloc_create(3, 0, &a), TP_OK);
    ck_assert_int_eq(tp_block_alloc_n_blocks(a), 3);
    ck_assert_int_eq(tp_block_alloc_get(a), 0);
    ck_assert_int_eq(tp_block_alloc_get(a), 1);
    ck_assert_int_eq(tp_block_alloc_get(a), 2);
    ck_assert_int_eq(tp_block_alloc_get(a), -1);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 0);
    ck_assert_int_eq(tp_block_alloc_put(a, 1), TP_OK);
    tp_error_clear();
    ck_assert_int_eq(tp_block_alloc_put(a, 1), TP_ERR_INTERNAL);
    tp_error_clear();
    ck_assert_int_eq(tp_block_alloc_put(a, 3), TP_ERR_INTERNAL);
    tp_error_clear();
    ck_assert_int_eq(tp_block_alloc_put(a, -1), TP_ERR_INTERNAL);
    tp_error_clear();
    ck_assert_int_eq(tp_block_alloc_n_free(a), 1);
    ck_assert_int_eq(tp_block_alloc_get(a), 1); /* LIFO */
    tp_block_alloc_destroy(a);
    tp_block_alloc_destroy(NULL);
}
END_TEST

START_TEST(single_sequence)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 16, 4, 32, 64, 0, 0, 0}, 0);
    uint64_t rng = 1;
    engine_random_seq(&e, &rng, 10, 20, 0, 0);
    engine_run(&e);
    /* one prefill step that samples the first token, then 19 decodes */
    ck_assert_int_eq(e.stats.steps, 20);
    ck_assert_int_eq(e.stats.prefill_tokens, 10);
    ck_assert_int_eq(e.stats.decode_tokens, 19);
    ck_assert_int_eq(e.stats.preemptions, 0);
    ck_assert_int_eq(e.seqs[0].n_expect, 20);
    engine_free(&e);
}
END_TEST

START_TEST(one_token_prompt_one_new_token)
{
    engine e;
    engine_init(&e, &(tp_sched_config){1, 2, 1, 1, 2, 0, 0, 0}, 0);
    int32_t p = 7;
    engine_seq(&e, &p, 1, 1, 0, 0);
    engine_seq(&e, &p, 1, 1, 0, 0);
    engine_run(&e);
    ck_assert_int_eq(e.stats.steps, 2);
    engine_free(&e);
}
END_TEST

START_TEST(many_random_sequences)
{
    engine e;
    engine_init(&e, &(tp_sched_config){8, 256, 16, 64, 96, 0, 0, 0}, 0);
    random_workload(&e, 42, 60, 40, 40, 0, 0);
    engine_run(&e);
    ck_assert_int_eq(e.stats.preemptions, 0);
    ck_assert_int_eq(e.max_rows, 16);
    ck_assert_int_gt(e.mixed_steps, 0);
    engine_free(&e);
}
END_TEST

START_TEST(long_prompts_are_chunked)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 128, 4, 16, 256, 0, 0, 0}, 0);
    uint64_t rng = 7;
    engine_random_seq(&e, &rng, 100, 5, 0, 0);
    engine_random_seq(&e, &rng, 57, 30, 0, 0);
    engine_random_seq(&e, &rng, 16, 3, 0, 0);
    engine_random_seq(&e, &rng, 17, 3, 0, 0);
    engine_random_seq(&e, &rng, 200, 1, 0, 0);
    engine_run(&e);
    ck_assert_int_gt(e.partial_chunks, 12);
    ck_assert_int_eq(e.stats.prefill_tokens, 100 + 57 + 16 + 17 + 200);
    engine_free(&e);
}
END_TEST

START_TEST(tight_blocks_preempt_and_recompute)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 12, 8, 64, 48, 0, 0, 0}, 0);
    random_workload(&e, 3, 24, 20, 25, 0, 0);
    engine_run(&e);
    ck_assert_int_gt(e.stats.preemptions, 0);
    ck_assert_int_gt(e.restarts, 0);
    engine_free(&e);
}
END_TEST

START_TEST(tight_blocks_chunked_prefill)
{
    /* preemption while prompts are still being chunked */
    engine e;
    engine_init(&e, &(tp_sched_config){2, 20, 6, 7, 40, 0, 0, 0}, 0);
    random_workload(&e, 11, 30, 30, 12, 40, 0);
    engine_run(&e);
    ck_assert_int_gt(e.stats.preemptions, 0);
    ck_assert_int_gt(e.partial_chunks, 0);
    engine_free(&e);
}
END_TEST

/* The offline shape that thrashed (H100, 1024 prompts of 128 / 2048 at 256 at once where
 * the cache holds ~213 whole: 939 preemptions): sequences of one length that fill the
 * cache together. Once the cache is full a preempted sequence must wait for room for all
 * of its tokens, so none is preempted twice and what is recomputed is at most one full
 * length of each sequence that did not fit. */
START_TEST(lockstep_overflow_preempts_each_once)
{
    const int32_t bs = 16, n = 32, fit = 24, prompt = 16, max_new = 240; /* 16 blocks each */
    for (int caching = 0; caching < 2; caching++) {
        engine e;
        engine_init(&e, &(tp_sched_config){bs, fit * (prompt + max_new) / bs, n, 512, prompt + max_new, caching, 0, 0}, 0);
        uint64_t rng = 77 + (uint64_t)caching;
        for (int32_t i = 0; i < n; i++) engine_random_seq(&e, &rng, prompt, max_new, 0, 0);
        engine_run(&e);
        int32_t most = 0;
        for (int32_t i = 0; i < n; i++)
            if (e.seqs[i].restarts > most) most = e.seqs[i].restarts;
        ck_assert_int_gt(e.stats.preemptions, 0);
        ck_assert_int_le(most, 1);
        ck_assert_int_le(e.stats.preemptions, n - fit);
        ck_assert_int_le(e.stats.prefill_tokens, (int64_t)n * prompt + (int64_t)(n - fit) * (prompt + max_new));
        engine_free(&e);
    }
}
END_TEST

static void expect_rows(const tp_sched_batch *b, int32_t n, const int64_t *keys,
                        const int32_t *first_pos, const int32_t *lens, int32_t n_logits)
{
    ck_assert_int_eq(b->n_seqs, n);
    ck_assert_int_eq(b->n_logits, n_logits);
    for (int32_t r = 0; r < n; r++) {
        ck_assert_int_eq(b->seq_key[r], keys[r]);
        ck_assert_int_eq(b->pos[b->seq_first[r]], first_pos[r]);
        ck_assert_int_eq(b->seq_len[r], lens[r]);
    }
}

/* The hand-traced runs' scheduler: blocks of 2, two sequences at once; A (key 10) and B
 * (20) of 3 prompt tokens and 5 new ones, 4 blocks each when whole; with_c, C (30) of one
 * token and one new. */
static tp_scheduler *hand_traced(int32_t n_blocks, int with_c)
{
    tp_scheduler *s;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){2, n_blocks, 2, 16, 8, 0, 0, 0}, &s), TP_OK);
    const int32_t p[3] = {1, 2, 3};
    ck_assert_int_eq(tp_scheduler_add(s, 10, p, 3, 5, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 20, p, 3, 5, 0), TP_OK);
    if (with_c) ck_assert_int_eq(tp_scheduler_add(s, 30, p, 1, 1, 0), TP_OK);
    return s;
}

/* A hand-traced run: 6 blocks, A, B and C. */
START_TEST(preempted_sequence_resumes_first)
{
    tp_scheduler *s = hand_traced(6, 1);
    tp_sched_batch b;
    int32_t tok[2] = {4, 4};
    tp_sched_stats st;

    /* 1: both prompts (2 blocks each; B's 2 fit beside a block for A); C waits for a slot */
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    expect_rows(&b, 2, (int64_t[]){10, 20}, (int32_t[]){0, 0}, (int32_t[]){3, 3}, 2);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    /* 2-4: decodes at positions 3, 4 (a third block each: none left) and 5 */
    for (int32_t pos = 3; pos <= 5; pos++) {
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        expect_rows(&b, 2, (int64_t[]){10, 20}, (int32_t[]){pos, pos}, (int32_t[]){1, 1}, 2);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    }
    /* 5: A needs a fourth block: B, the newest, is preempted; nobody is admitted */
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    expect_rows(&b, 1, (int64_t[]){10}, (int32_t[]){6}, (int32_t[]){1}, 1);
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.preemptions, 1);
    ck_assert_int_eq(st.waiting, 2);
    ck_assert_int_eq(st.running, 1);
    ck_assert_int_eq(st.free_blocks, 2);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK); /* A's fifth token: done */
    /* 6: B, ahead of C, recomputes its 7 known tokens at once; C's one block fits beside
     * a block for B */
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    expect_rows(&b, 2, (int64_t[]){20, 30}, (int32_t[]){0, 0}, (int32_t[]){7, 1}, 2);
    const int32_t b_known[7] = {1, 2, 3, 4, 4, 4, 4};
    ck_assert_mem_eq(b.tokens, b_known, sizeof b_known);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    ck_assert(tp_scheduler_idle(s));

    int64_t key;
    const int32_t *gen;
    int32_t n;
    const int64_t order[3] = {10, 20, 30};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
        ck_assert_int_eq(key, order[i]);
        ck_assert_int_eq(n, key == 30 ? 1 : 5);
    }
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.preemptions, 1);
    tp_scheduler_destroy(s);
}
END_TEST

/* The rule that keeps a preempted sequence out until all of its tokens fit: 4 blocks of 2,
 * A and B each need all 4 when whole, so B waits for A rather than being admitted beside
 * it and preempted (the earlier rule, on the first chunk, preempted B twice here). */
START_TEST(admission_waits_for_the_whole_sequence)
{
    tp_scheduler *s = hand_traced(4, 0);
    tp_sched_batch b;
    int32_t tok[2] = {4, 4};
    tp_sched_stats st;
    /* 1-5: A alone (B's 2 blocks and one for A's growth are 3; 2 are free) */
    for (int32_t step = 1; step <= 5; step++) {
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        expect_rows(&b, 1, (int64_t[]){10}, (int32_t[]){step == 1 ? 0 : step + 1}, (int32_t[]){step == 1 ? 3 : 1}, 1);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    }
    /* 6-10: B alone, after A */
    for (int32_t step = 6; step <= 10; step++) {
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        expect_rows(&b, 1, (int64_t[]){20}, (int32_t[]){step == 6 ? 0 : step - 4}, (int32_t[]){step == 6 ? 3 : 1}, 1);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    }
    ck_assert(tp_scheduler_idle(s));
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.preemptions, 0);
    tp_scheduler_destroy(s);
}
END_TEST

START_TEST(one_sequence_at_a_time)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 32, 1, 16, 64, 0, 0, 0}, 0);
    random_workload(&e, 5, 12, 30, 20, 0, 0);
    engine_run(&e);
    ck_assert_int_eq(e.max_rows, 1);
    ck_assert_int_eq(e.finish_order_violations, 0); /* FIFO */
    ck_assert_int_eq(e.stats.preemptions, 0);
    engine_free(&e);
}
END_TEST

START_TEST(block_sizes_1_and_16)
{
    const int32_t sizes[] = {1, 16};
    for (int k = 0; k < 2; k++) {
        int32_t bs = sizes[k];
        engine e;
        /* roomy, then tight */
        engine_init(&e, &(tp_sched_config){bs, 2048 / bs, 8, 48, 64, 0, 0, 0}, 0);
        random_workload(&e, 100 + (uint64_t)k, 30, 40, 24, 0, 0);
        engine_run(&e);
        ck_assert_int_eq(e.stats.preemptions, 0);
        engine_free(&e);
        engine_init(&e, &(tp_sched_config){bs, 96 / bs, 8, 48, 64, 0, 0, 0}, 0);
        random_workload(&e, 200 + (uint64_t)k, 30, 40, 24, 0, 0);
        engine_run(&e);
        ck_assert_int_gt(e.stats.preemptions, 0);
        engine_free(&e);
    }
}
END_TEST

START_TEST(continuous_batching)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 64, 6, 24, 64, 0, 0, 0}, 0);
    random_workload(&e, 9, 40, 20, 30, 150, 0);
    engine_run(&e);
    ck_assert_int_gt(e.mixed_steps, 0);
    engine_free(&e);
}
END_TEST

START_TEST(finish_early)
{
    engine e;
    engine_init(&e, &(tp_sched_config){4, 64, 4, 32, 64, 0, 0, 0}, 0);
    uint64_t rng = 13;
    engine_random_seq(&e, &rng, 8, 30, 1, 0);
    engine_random_seq(&e, &rng, 8, 30, 5, 0);
    engine_random_seq(&e, &rng, 8, 30, 0, 0);
    engine_random_seq(&e, &rng, 8, 30, 30, 0);
    engine_run(&e);
    ck_assert_int_eq(e.seqs[0].n_expect, 1);
    ck_assert_int_eq(e.seqs[1].n_expect, 5);
    ck_assert_int_eq(e.seqs[2].n_expect, 30);
    ck_assert_int_eq(e.seqs[3].n_expect, 30);
    engine_free(&e);

    /* EOS-driven stops under preemption */
    engine_init(&e, &(tp_sched_config){2, 24, 8, 16, 48, 0, 0, 0}, 1);
    random_workload(&e, 14, 30, 20, 28, 20, 1);
    engine_run(&e);
    int early = 0;
    for (int32_t i = 0; i < e.n_seqs; i++) early += e.seqs[i].n_expect < e.seqs[i].max_new;
    ck_assert_int_gt(early, 0);
    engine_free(&e);
}
END_TEST

START_TEST(commit_without_finish_array)
{
    tp_scheduler *s;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 8, 2, 8, 32, 0, 0, 0}, &s), TP_OK);
    int32_t prompt[3] = {1, 2, 3};
    ck_assert_int_eq(tp_scheduler_add(s, 5, prompt, 3, 2, 0), TP_OK);
    tp_sched_batch b;
    int32_t tok = 9;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        ck_assert_int_eq(b.n_logits, 1);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, &tok, NULL), TP_OK);
    }
    ck_assert(tp_scheduler_idle(s));
    int64_t key;
    const int32_t *gen;
    int32_t n;
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, 5);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(gen[0], 9);
    ck_assert_int_eq(gen[1], 9);
    tp_scheduler_destroy(s);
}
END_TEST

/* Tokens committed as TP_TOKEN_PENDING (the device chose them, the host has not read them):
 * the next step feeds them as pending, tp_scheduler_resolve fills them oldest first, and an
 * end there drops the later pending token and gives every block back, whether the sequence
 * runs, was preempted or finished by length already. */
START_TEST(pending_tokens_resolve)
{
    tp_scheduler *s;
    /* blocks of 4 tokens, 6 of them: two sequences of 5 + 4 tokens fit, not three */
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 6, 4, 64, 32, 0, 0, 0}, &s), TP_OK);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    ck_assert_int_eq(tp_scheduler_add(s, 10, prompt, 5, 6, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 11, prompt, 3, 2, 0), TP_OK);
    tp_sched_batch b;
    int32_t pend[2] = {TP_TOKEN_PENDING, TP_TOKEN_PENDING};
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK); /* both prompts */
    ck_assert_int_eq(b.n_logits, 2);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, pend, NULL), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK); /* both decode their pending token */
    ck_assert_int_eq(b.n_tokens, 2);
    ck_assert_int_eq(b.tokens[0], TP_TOKEN_PENDING);
    ck_assert_int_eq(b.tokens[1], TP_TOKEN_PENDING);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, pend, NULL), TP_OK); /* 11 ends by length here */
    int64_t key;
    const int32_t *gen;
    int32_t n;
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, 11);
    ck_assert_int_eq(tp_scheduler_resolve(s, 11, 7, 0), 0); /* popped: unknown now */
    ck_assert_int_eq(tp_scheduler_resolve(s, 99, 7, 0), 0);
    /* the first step's tokens read: 10's first is 40; the second stays pending */
    ck_assert_int_eq(tp_scheduler_resolve(s, 10, 40, 0), 1);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_tokens, 1);
    ck_assert_int_eq(b.pos[0], 6);
    ck_assert_int_eq(b.tokens[0], TP_TOKEN_PENDING);
    int32_t one = TP_TOKEN_PENDING;
    ck_assert_int_eq(tp_scheduler_commit(s, &b, &one, NULL), TP_OK);
    /* the second token (41) ends it: the third, computed by the step in flight, is dropped */
    ck_assert_int_eq(tp_scheduler_resolve(s, 10, 41, 1), 1);
    ck_assert(tp_scheduler_idle(s));
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, 10);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(gen[0], 40);
    ck_assert_int_eq(gen[1], 41);
    ck_assert_int_eq(tp_scheduler_resolve(s, 10, 42, 0), 0);
    tp_sched_stats st;
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.free_blocks, 6);

    /* a sequence preempted while its token is pending (the step that will read it is not
     * the one it is in): that token read as its end finishes it where it waits */
    ck_assert_int_eq(tp_scheduler_add(s, 20, prompt, 5, 12, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 21, prompt, 5, 12, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_logits, 2);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, pend, NULL), TP_OK);
    int64_t prev[2] = {b.seq_key[b.logit_seq[0]], b.seq_key[b.logit_seq[1]]}, victim = -1;
    for (int step = 0; step < 12 && victim < 0; step++) { /* 2 x 4 blocks past 12 tokens: one must go */
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        tp_scheduler_stats(s, &st);
        if (st.preemptions) {
            ck_assert_int_eq(b.n_seqs, 1);
            victim = b.seq_key[0] == prev[0] ? prev[1] : prev[0];
        }
        for (int32_t i = 0; i < b.n_logits; i++) pend[i] = TP_TOKEN_PENDING;
        ck_assert_msg(tp_scheduler_commit(s, &b, pend, NULL) == TP_OK, "%s", tp_error_message());
        if (victim >= 0) break;
        for (int k = 0; k < 2; k++) ck_assert_int_eq(tp_scheduler_resolve(s, prev[k], 50 + step, 0), 1);
        for (int32_t i = 0; i < b.n_logits; i++) prev[i] = b.seq_key[b.logit_seq[i]];
    }
    ck_assert_int_ge(victim, 20);
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.waiting, 1);
    ck_assert_int_eq(tp_scheduler_resolve(s, victim, 77, 1), 1);
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.waiting, 0);
    ck_assert_int_eq(st.running, 1);
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, victim);
    ck_assert_int_eq(gen[n - 1], 77);
    for (int32_t i = 0; i < n - 1; i++) ck_assert_int_ne(gen[i], TP_TOKEN_PENDING);

    tp_scheduler_destroy(s);

    /* a known token after a pending one would be overwritten by the next resolve: refused */
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 6, 4, 64, 32, 0, 0, 0}, &s), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 30, prompt, 3, 4, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, pend, NULL), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    int32_t known = 5;
    ck_assert_int_eq(tp_scheduler_commit(s, &b, &known, NULL), TP_ERR_INTERNAL);
    ck_assert_msg(strstr(tp_error_message(), "known token after 1 pending") != NULL, "%s", tp_error_message());
    tp_error_clear();
    tp_scheduler_destroy(s);
}
END_TEST

static int message_has(const char *a, const char *b)
{
    const char *m = tp_error_message();
    return strstr(m, a) && strstr(m, b);
}

START_TEST(add_refusals)
{
    tp_scheduler *s;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){16, 4, 4, 8, 100, 0, 0, 0}, &s), TP_OK);
    int32_t prompt[80] = {0};
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 0, 4, 0), TP_ERR_INVALID_ARG);
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 1, NULL, 3, 4, 0), TP_ERR_INVALID_ARG);
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 3, 0, 0), TP_ERR_INVALID_ARG);
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 80, 21, 0), TP_ERR_INVALID_ARG);
    ck_assert(message_has("101", "100"));
    tp_error_clear();
    /* fits max_model_len but needs 5 blocks of 16 > 4 */
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 60, 5, 0), TP_ERR_INVALID_ARG);
    ck_assert(message_has("needs 5", "only 4"));
    tp_error_clear();
    ck_assert(tp_scheduler_idle(s));
    tp_sched_batch b;
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_tokens, 0);

    /* exactly 4 blocks: accepted; a duplicate key is refused while queued, running or
     * finished but not popped, and accepted again once popped */
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 60, 4, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 2, 1, 0), TP_ERR_INVALID_ARG);
    ck_assert(message_has("1", "already"));
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 2, prompt, 2, 1, 0), TP_OK);
    int32_t sampled[4] = {0};
    uint8_t fin[4] = {1, 1, 1, 1};
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 2, 1, 0), TP_ERR_INVALID_ARG);
    tp_error_clear();
    while (!tp_scheduler_idle(s)) {
        ck_assert_int_eq(tp_scheduler_commit(s, &b, sampled, fin), TP_OK);
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    }
    ck_assert_int_eq(tp_scheduler_add(s, 2, prompt, 2, 1, 0), TP_ERR_INVALID_ARG);
    tp_error_clear();
    int64_t key;
    const int32_t *gen;
    int32_t n;
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, 1);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 2, 1, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 1);
    ck_assert_int_eq(key, 2);
    ck_assert_int_eq(tp_scheduler_pop_finished(s, &key, &gen, &n), 0);
    tp_scheduler_destroy(s); /* with key 1 still waiting: no leak */

    /* behind a window of 8 the 65-token sequence refused above holds 2 blocks at most; one that
     * cannot hold even its window is refused, saying so */
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){16, 4, 4, 8, 100, 0, 8, 1}, &s), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 60, 5, 0), TP_OK);
    tp_scheduler_destroy(s);
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){16, 2, 4, 8, 100, 0, 40, 1}, &s), TP_OK);
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 60, 5, 0), TP_ERR_INVALID_ARG);
    ck_assert(message_has("needs 4", "behind a sliding window"));
    tp_error_clear();
    tp_scheduler_destroy(s);
}
END_TEST

START_TEST(create_refusals_and_misuse)
{
    tp_scheduler *s = (tp_scheduler *)&s;
    const tp_sched_config bad[] = {
        {0, 4, 4, 8, 64, 0, 0, 0}, {4, 0, 4, 8, 64, 0, 0, 0}, {4, 4, 0, 8, 64, 0, 0, 0}, {4, 4, 4, 0, 64, 0, 0, 0},
        {4, 4, 4, 8, 0, 0, 0, 0},  {-1, 4, 4, 8, 64, 0, 0, 0}, {1 << 16, 1 << 16, 4, 8, 64, 0, 0, 0},
        {4, 4, 4, 8, 64, 0, -1, 1}, {4, 4, 4, 8, 64, 0, 8, -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_error_clear();
        ck_assert_int_eq(tp_scheduler_create(&bad[i], &s), TP_ERR_INVALID_ARG);
        ck_assert_ptr_null(s);
        ck_assert_str_ne(tp_error_message(), "");
    }
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_create(NULL, &s), TP_ERR_INVALID_ARG);
    tp_error_clear();
    tp_scheduler_destroy(NULL);

    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 8, 2, 8, 32, 0, 0, 0}, &s), TP_OK);
    tp_sched_batch b;
    int32_t tok = 1;
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK); /* idle: empty */
    ck_assert_int_eq(b.n_tokens, 0);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, &tok, NULL), TP_ERR_INTERNAL);
    tp_error_clear();
    int32_t prompt[3] = {1, 2, 3};
    ck_assert_int_eq(tp_scheduler_add(s, 1, prompt, 3, 2, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_tokens, 3);
    tp_sched_batch b2;
    ck_assert_int_eq(tp_scheduler_schedule(s, &b2), TP_ERR_INTERNAL); /* not committed */
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_commit(s, &b, NULL, NULL), TP_ERR_INVALID_ARG);
    tp_error_clear();
    ck_assert_int_eq(tp_scheduler_commit(s, &b, &tok, NULL), TP_OK);
    ck_assert_int_eq(tp_scheduler_commit(s, &b, &tok, NULL), TP_ERR_INTERNAL); /* twice */
    tp_error_clear();
    tp_scheduler_destroy(s); /* with a running sequence holding blocks */
}
END_TEST

/* tp_sched_fit_seqs: the default --max-num-seqs of a large GPU. */
START_TEST(fit_seqs)
{
    /* 1024 sequences of 128 + 128 tokens in blocks of 16 need 16 blocks each: 51,200 blocks
     * hold 3,200 of them, capped at 1024 */
    ck_assert_int_eq(tp_sched_fit_seqs(51200, 1024 * 16, 1024, 256, 1024), 1024);
    /* 2048 + 128 tokens: 136 blocks each; 51,200 blocks hold 376 */
    ck_assert_int_eq(tp_sched_fit_seqs(51200, 1024 * 136, 1024, 256, 1024), 376);
    /* mixed lengths: the mean (10 of 4 blocks, 10 of 36: 20 blocks each) */
    ck_assert_int_eq(tp_sched_fit_seqs(6000, 10 * 4 + 10 * 36, 20, 256, 1024), 300);
    /* never under lo (preemption handles the rest), never over hi */
    ck_assert_int_eq(tp_sched_fit_seqs(100, 1000, 10, 256, 1024), 256);
    ck_assert_int_eq(tp_sched_fit_seqs(INT64_C(1) << 40, 16, 1, 256, 1024), 1024);
    /* small devices: lo = hi; no sequences, no blocks */
    ck_assert_int_eq(tp_sched_fit_seqs(51200, 1024 * 136, 1024, 256, 256), 256);
    ck_assert_int_eq(tp_sched_fit_seqs(51200, 0, 0, 256, 1024), 1024);
    ck_assert_int_eq(tp_sched_fit_seqs(0, 16, 1, 256, 1024), 256);
    ck_assert_int_eq(tp_sched_fit_seqs(51200, 16, 1, 512, 300), 300);
}
END_TEST

/* Thousands of keys through the key table: growth, and removal on pop must keep every
 * other key findable (a live key stays refused as a duplicate to the end). */
START_TEST(many_keys)
{
    enum { N = 3000 };
    tp_scheduler *s;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 4096, 64, 256, 16, 0, 0, 0}, &s), TP_OK);
    int64_t keys[N];
    uint8_t popped[N] = {0};
    uint64_t rng = 99;
    const int32_t p[2] = {5, 6};
    for (int i = 0; i < N; i++) {
        keys[i] = (int64_t)(rng_next(&rng) >> 1) * (i % 2 ? -1 : 1);
        ck_assert_int_eq(tp_scheduler_add(s, keys[i], p, 1 + i % 2, 1 + i % 3, 0), TP_OK);
    }
    tp_error_clear();
    tp_sched_batch b;
    int32_t tok[64] = {0};
    int done = 0;
    while (!tp_scheduler_idle(s)) {
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
        int64_t key;
        const int32_t *gen;
        int32_t n;
        while (tp_scheduler_pop_finished(s, &key, &gen, &n)) {
            int i = 0;
            while (i < N && keys[i] != key) i++;
            ck_assert_int_lt(i, N);
            ck_assert(!popped[i]);
            ck_assert_int_eq(n, 1 + i % 3);
            popped[i] = 1;
            done++;
            int j = (int)(rng_next(&rng) % N); /* a key still held is still refused */
            if (!popped[j]) {
                ck_assert_int_eq(tp_scheduler_add(s, keys[j], p, 1, 1, 0), TP_ERR_INVALID_ARG);
                tp_error_clear();
            }
        }
    }
    ck_assert_int_eq(done, N);
    for (int i = 0; i < N; i++) ck_assert_int_eq(tp_scheduler_add(s, keys[i], p, 1, 1, 0), TP_OK);
    tp_scheduler_destroy(s);
}
END_TEST

/* tp_scheduler_peek_first says what the first schedule then takes: its tokens and sequences,
 * under a token budget, a sequence cap and KV caches too small for every prompt. */
START_TEST(peek_first_is_the_first_step)
{
    static const tp_sched_config cfgs[] = {
        {16, 64, 8, 512, 256, 0, 0, 0}, /* room for all: the budget or the cap decides */
        {16, 10, 8, 512, 160, 0, 0, 0}, /* 10 blocks: the cache decides, the last admitted in part */
        {4, 30, 3, 1000, 120, 0, 0, 0}, /* the sequence cap */
        {1, 40, 16, 25, 40, 0, 0, 0},   /* a small budget, one-token blocks */
        {8, 12, 64, 4096, 96, 0, 0, 0},
        /* prefix caching: the prompts share their first tokens, so all but the first whose
         * first block another completes wait (and a prompt of one block or less does not) */
        {16, 64, 8, 512, 256, 1, 0, 0},
        {4, 30, 3, 1000, 120, 1, 0, 0},
        {1, 40, 16, 25, 40, 1, 0, 0},
        {8, 12, 64, 4096, 96, 1, 0, 0},
    };
    uint64_t rng = 12345;
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (int trial = 0; trial < 20; trial++) {
            tp_scheduler *s = NULL;
            ck_assert_int_eq(tp_scheduler_create(&cfgs[c], &s), TP_OK);
            int32_t prompt[64];
            for (int i = 0; i < 64; i++) prompt[i] = i;
            for (int64_t k = 0; k < 12; k++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                const int32_t n = 1 + (int32_t)((rng >> 33) % 60);
                const int32_t max_new = cfgs[c].max_model_len - n < 8 ? cfgs[c].max_model_len - n : 8;
                const int flags = (rng >> 20) % 5 == 0 ? TP_SCHED_NO_PREFIX_HITS : 0;
                if (max_new < 1 || tp_scheduler_add(s, k, prompt, n, max_new, flags) != TP_OK) continue;
            }
            int32_t tokens = -1, seqs = -1;
            tp_scheduler_peek_first(s, &tokens, &seqs);
            tp_sched_batch b;
            ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
            ck_assert_msg(tokens == b.n_tokens && seqs == b.n_seqs,
                          "config %zu trial %d: peek %d tokens / %d sequences, the step %d / %d", c, trial, tokens,
                          seqs, b.n_tokens, b.n_seqs);
            tp_scheduler_destroy(s);
        }
}
END_TEST

START_TEST(determinism)
{
    for (int caching = 0; caching < 2; caching++) {
    engine e1, e2;
    const tp_sched_config cfg = {2, 30, 6, 12, 48, caching, 0, 0};
    engine_init(&e1, &cfg, 1);
    engine_init(&e2, &cfg, 1);
    random_workload(&e1, 77, 40, 30, 18, 60, 1);
    random_workload(&e2, 77, 40, 30, 18, 60, 1);
    engine_run(&e1);
    engine_run(&e2);
    ck_assert_int_gt(e1.stats.preemptions, 0);
    ck_assert_int_eq(e1.n_hashes, e2.n_hashes);
    ck_assert_mem_eq(e1.hashes, e2.hashes, (size_t)e1.n_hashes * sizeof *e1.hashes);
    ck_assert_int_eq(e1.stats.preemptions, e2.stats.preemptions);
    engine_free(&e1);
    engine_free(&e2);
    }
}
END_TEST

/* n sequences whose prompts start with one of n_prefixes random prefixes (some none, some
 * whole prompts repeated), arriving over add_spread steps; every fourth computes its whole
 * prompt (TP_SCHED_NO_PREFIX_HITS) */
static void shared_prefix_workload(engine *e, uint64_t seed, int32_t n, int32_t n_prefixes, int32_t max_prompt,
                                   int32_t max_new, int64_t add_spread)
{
    uint64_t rng = seed;
    const int64_t cap = longest_seq(&e->cfg);
    if (max_prompt > cap - 1) max_prompt = (int32_t)cap - 1;
    REQUIRE_GE(max_prompt, 1);
    int32_t *prefix = malloc((size_t)n_prefixes * (size_t)max_prompt * sizeof *prefix);
    int32_t *prefix_len = malloc((size_t)n_prefixes * sizeof *prefix_len);
    int32_t *p = malloc((size_t)max_prompt * sizeof *p);
    REQUIRE(prefix && prefix_len && p);
    for (int32_t k = 0; k < n_prefixes; k++) {
        prefix_len[k] = rng_range(&rng, 1, max_prompt);
        for (int32_t i = 0; i < max_prompt; i++) prefix[k * max_prompt + i] = rng_range(&rng, 0, VOCAB - 1);
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t k = rng_range(&rng, 0, n_prefixes), np = 0; /* k == n_prefixes: no shared prefix */
        if (k < n_prefixes) {
            np = prefix_len[k];
            memcpy(p, prefix + (size_t)k * (size_t)max_prompt, (size_t)np * sizeof *p);
        }
        if (np == 0 || rng_range(&rng, 0, 2) > 0) { /* a suffix of its own (else the prompt repeats whole) */
            int32_t more = rng_range(&rng, 1, max_prompt);
            if (np + more > max_prompt) more = max_prompt - np;
            for (int32_t j = 0; j < more; j++) p[np++] = rng_range(&rng, 0, VOCAB - 1);
        }
        if (np < 1) p[np++] = 7;
        int32_t mn = rng_range(&rng, 1, max_new);
        if (np + mn > cap) mn = (int32_t)cap - np;
        REQUIRE_GE(mn, 1);
        int32_t stop = rng_range(&rng, 0, 3) == 0 ? rng_range(&rng, 1, mn) : 0;
        int64_t at = add_spread > 0 ? rng_range(&rng, 0, (int32_t)add_spread) : 0;
        engine_seq(e, p, np, mn, stop, at);
        e->seqs[e->n_seqs - 1].flags = i % 4 == 3 ? TP_SCHED_NO_PREFIX_HITS : 0;
    }
    free(prefix);
    free(prefix_len);
    free(p);
}

START_TEST(block_alloc_prefix_cache)
{
    tp_block_alloc *a = NULL;
    ck_assert_int_eq(tp_block_alloc_create(4, 2, &a), TP_OK);
    const int32_t ab[2] = {1, 2}, cd[2] = {3, 4}, ef[2] = {5, 6};
    uint64_t id = 0, id_ab, id_abcd;
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, &id), -1);
    int32_t b0 = tp_block_alloc_get(a), b1 = tp_block_alloc_get(a);
    id_ab = tp_block_alloc_register(a, b0, 0, ab);
    id_abcd = tp_block_alloc_register(a, b1, id_ab, cd);
    ck_assert(id_ab != 0 && id_abcd != 0 && id_ab != id_abcd);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, &id), b0);
    ck_assert(id == id_ab);
    ck_assert_int_eq(tp_block_alloc_lookup(a, id_ab, cd, &id), b1);
    ck_assert(id == id_abcd);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, cd, NULL), -1);     /* cd only after ab */
    ck_assert_int_eq(tp_block_alloc_lookup(a, id_abcd, ab, NULL), -1); /* nor ab after abcd */
    /* the same prefix computed again elsewhere: its first id stands, the copy stays plain */
    int32_t b2 = tp_block_alloc_get(a);
    ck_assert(tp_block_alloc_register(a, b2, 0, ab) == id_ab);
    ck_assert_int_eq(tp_block_alloc_put(a, b2), TP_OK); /* plain: straight back to the free list */
    ck_assert_int_eq(tp_block_alloc_n_free(a), 2);
    /* let go, tail first: still found, still free */
    ck_assert_int_eq(tp_block_alloc_put(a, b1), TP_OK);
    ck_assert_int_eq(tp_block_alloc_put(a, b0), TP_OK);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 4);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, NULL), b0);
    /* held again: not free, and a second hold needs a second put */
    tp_block_alloc_hold(a, b0);
    tp_block_alloc_hold(a, b0);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 3);
    ck_assert_int_eq(tp_block_alloc_put(a, b0), TP_OK);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 3);
    ck_assert_int_eq(tp_block_alloc_put(a, b0), TP_OK);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 4);
    ck_assert_int_eq(tp_block_alloc_put(a, b0), TP_ERR_INTERNAL);
    /* plain free blocks go first, then the cached ones, the one let go longest ago first:
     * b1 (abcd's tail), then b0 */
    int32_t g1 = tp_block_alloc_get(a), g2 = tp_block_alloc_get(a);
    ck_assert(g1 != b0 && g1 != b1 && g2 != b0 && g2 != b1);
    ck_assert_int_eq(tp_block_alloc_get(a), b1);
    ck_assert_int_eq(tp_block_alloc_lookup(a, id_ab, cd, NULL), -1);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, NULL), b0);
    ck_assert_int_eq(tp_block_alloc_get(a), b0);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, NULL), -1);
    ck_assert_int_eq(tp_block_alloc_get(a), -1);
    /* ab computed anew: a new id, so a block registered under the old one is not reached */
    uint64_t id_ab2 = tp_block_alloc_register(a, b0, 0, ab);
    ck_assert(id_ab2 != id_ab && id_ab2 != id_abcd);
    uint64_t id_abef = tp_block_alloc_register(a, b1, id_ab2, ef);
    ck_assert_int_eq(tp_block_alloc_lookup(a, id_ab2, ef, &id), b1);
    ck_assert(id == id_abef);
    ck_assert_int_eq(tp_block_alloc_lookup(a, id_ab, ef, NULL), -1);
    /* touched: an evictable block becomes the one let go last; a held or plain one is left */
    ck_assert_int_eq(tp_block_alloc_put(a, b0), TP_OK);
    ck_assert_int_eq(tp_block_alloc_put(a, b1), TP_OK); /* evictable, oldest first: b0, b1 */
    tp_block_alloc_touch(a, b0);                          /* b1, b0 */
    tp_block_alloc_touch(a, g1);                          /* held: nothing */
    tp_block_alloc_touch(a, -1);
    tp_block_alloc_touch(a, 4);
    ck_assert_int_eq(tp_block_alloc_n_free(a), 2);
    ck_assert_int_eq(tp_block_alloc_get(a), b1);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, NULL), b0);
    tp_block_alloc_touch(a, b1); /* held again, unregistered: nothing */
    ck_assert_int_eq(tp_block_alloc_put(a, b1), TP_OK); /* plain now: the free list */
    tp_block_alloc_touch(a, b1);
    ck_assert_int_eq(tp_block_alloc_get(a), b1);
    ck_assert_int_eq(tp_block_alloc_get(a), b0);
    ck_assert_int_eq(tp_block_alloc_get(a), -1);
    tp_block_alloc_destroy(a);
    /* without prefix caching nothing is ever found (and nothing is touched) */
    ck_assert_int_eq(tp_block_alloc_create(2, 0, &a), TP_OK);
    ck_assert_int_eq(tp_block_alloc_lookup(a, 0, ab, NULL), -1);
    tp_block_alloc_touch(a, 0);
    ck_assert_int_eq(tp_block_alloc_get(a), 0);
    tp_block_alloc_destroy(a);
    ck_assert_int_eq(tp_block_alloc_create(2, -1, &a), TP_ERR_INVALID_ARG);
}
END_TEST

/* Shared prefixes with the cache on: every result is the sequence's alone (engine_run), the
 * cache is hit, and a hit reads keys and values written after the same history. */
START_TEST(prefix_caching_shared_prompts)
{
    const tp_sched_config cfgs[] = {
        {4, 64, 8, 64, 96, 1, 0, 0},   /* room: hits, and blocks shared in a step */
        {2, 24, 6, 16, 40, 1, 0, 0},   /* tight: evictions and preemptions */
        {16, 40, 16, 256, 200, 1, 0, 0},
        {1, 30, 4, 8, 24, 1, 0, 0},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        engine e;
        engine_init(&e, &cfgs[c], 1);
        shared_prefix_workload(&e, 1000 + c, 60, 4, cfgs[c].max_model_len / 2, 12, 80);
        engine_run(&e);
        ck_assert_msg(e.hit_tokens > 0, "config %zu: no prompt token came from the cache", c);
        if (c == 0) ck_assert_int_gt(e.shared_blocks, 0);
        if (c == 1) ck_assert_int_gt(e.stats.preemptions, 0);
        engine_free(&e);
    }
    /* the same workload without the cache: the same tokens, every prompt token computed */
    engine e;
    engine_init(&e, &(tp_sched_config){4, 64, 8, 64, 96, 0, 0, 0}, 1);
    shared_prefix_workload(&e, 1000, 60, 4, 48, 12, 80);
    engine_run(&e);
    ck_assert_int_eq(e.stats.cached_tokens, 0);
    engine_free(&e);
}
END_TEST

START_TEST(prefix_caching_first_admission_counts)
{
    /* A computes an 8-token prompt; B, C arrive after it and share its first 4 or 8 tokens;
     * D asks for no hits */
    tp_scheduler *s = NULL;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 32, 4, 64, 32, 1, 0, 0}, &s), TP_OK);
    const int32_t a[9] = {10, 11, 12, 13, 14, 15, 16, 17, 18};
    const int32_t b[6] = {10, 11, 12, 13, 99, 98};
    ck_assert_int_eq(tp_scheduler_add(s, 1, a, 9, 2, 0), TP_OK);
    tp_sched_batch bt;
    int32_t tok[4] = {5, 5, 5, 5};
    ck_assert_int_eq(tp_scheduler_schedule(s, &bt), TP_OK);
    ck_assert_int_eq(bt.n_tokens, 9);
    ck_assert_int_eq(tp_scheduler_commit(s, &bt, tok, NULL), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 2, b, 6, 1, 0), TP_OK);
    ck_assert_int_eq(tp_scheduler_add(s, 3, a, 8, 1, 0), TP_OK); /* a's first 8: 4 computed again */
    ck_assert_int_eq(tp_scheduler_add(s, 4, a, 9, 1, TP_SCHED_NO_PREFIX_HITS), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &bt), TP_OK);
    /* A's decode, then B from position 4, C from 4 (its last token is computed), D from 0 */
    ck_assert_int_eq(bt.n_seqs, 4);
    ck_assert_int_eq(bt.pos[bt.seq_first[1]], 4);
    ck_assert_int_eq(bt.seq_len[1], 2);
    ck_assert_int_eq(bt.pos[bt.seq_first[2]], 4);
    ck_assert_int_eq(bt.seq_len[2], 4);
    ck_assert_int_eq(bt.pos[bt.seq_first[3]], 0);
    ck_assert_int_eq(bt.seq_len[3], 9);
    /* B and C read A's first block; C computes its second (its last token is in it) */
    ck_assert_int_eq(bt.block_table[1 * bt.max_blocks], bt.block_table[0]);
    ck_assert_int_eq(bt.block_table[2 * bt.max_blocks], bt.block_table[0]);
    ck_assert_int_ne(bt.block_table[2 * bt.max_blocks + 1], bt.block_table[1]);
    ck_assert_int_ne(bt.block_table[3 * bt.max_blocks], bt.block_table[0]);
    ck_assert_int_eq(tp_scheduler_cached_tokens(s, 2), 4);
    ck_assert_int_eq(tp_scheduler_cached_tokens(s, 3), 4);
    ck_assert_int_eq(tp_scheduler_cached_tokens(s, 4), 0);
    ck_assert_int_eq(tp_scheduler_commit(s, &bt, tok, NULL), TP_OK);
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    while (tp_scheduler_pop_finished(s, &key, &gen, &n_gen))
        ck_assert_int_eq(tp_scheduler_cached_tokens(s, key), key == 2 || key == 3 ? 4 : 0);
    tp_sched_stats st;
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.cached_tokens, 8);
    ck_assert_int_eq(st.free_blocks, 32);
    tp_scheduler_destroy(s);
}
END_TEST

/* Everything queued at once with one long shared prefix (the offline case): the first
 * step computes it once, the others wait a step and read it, rather than all computing it
 * in the first step. */
START_TEST(prefix_caching_waits_for_a_prefix_in_flight)
{
    tp_scheduler *s = NULL;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 64, 8, 64, 32, 1, 0, 0}, &s), TP_OK);
    int32_t p[5][11];
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < 11; i++) p[k][i] = 100 + i;
        p[k][10] = k; /* 10 shared, then its own */
    }
    p[3][0] = 7; /* nothing in common with the others */
    for (int k = 0; k < 5; k++) ck_assert_int_eq(tp_scheduler_add(s, k, p[k], 11, 1, 0), TP_OK);
    int32_t tokens = -1, seqs = -1;
    tp_scheduler_peek_first(s, &tokens, &seqs);
    tp_sched_batch b;
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_seqs, 1); /* 1 waits for 0's first blocks (FIFO: 2, 3, 4 behind it) */
    ck_assert_int_eq(b.n_tokens, 11);
    ck_assert_int_eq(tokens, 11);
    ck_assert_int_eq(seqs, 1);
    int32_t tok[5] = {1, 1, 1, 1, 1};
    ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
    ck_assert_int_eq(b.n_seqs, 4); /* 1, 2, 4 from position 8; 3 computed whole */
    const int32_t first[4] = {8, 8, 0, 8}, len[4] = {3, 3, 11, 3};
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(b.pos[b.seq_first[r]], first[r]);
        ck_assert_int_eq(b.seq_len[r], len[r]);
    }
    ck_assert_int_eq(tp_scheduler_commit(s, &b, tok, NULL), TP_OK);
    tp_sched_stats st;
    tp_scheduler_stats(s, &st);
    ck_assert_int_eq(st.cached_tokens, 24);
    ck_assert(tp_scheduler_idle(s));
    tp_scheduler_destroy(s);
}
END_TEST

START_TEST(prefix_count)
{
    tp_prefix_count *c = NULL;
    ck_assert_int_eq(tp_prefix_count_create(0, 8, &c), TP_ERR_INVALID_ARG);
    ck_assert_int_eq(tp_prefix_count_create(4, 8, &c), TP_OK);
    int32_t a[13], b[13];
    for (int i = 0; i < 13; i++) a[i] = b[i] = 50 + i;
    b[6] = 1; /* b shares a's first block only */
    ck_assert_int_eq(tp_prefix_count_add(c, a, 13, 1), 0);  /* 3 blocks, none seen */
    ck_assert_int_eq(tp_prefix_count_add(c, a, 13, 1), 3);  /* all 3 (the 13th token computed) */
    ck_assert_int_eq(tp_prefix_count_add(c, a, 12, 1), 2);  /* 12 tokens: its third block holds its last */
    ck_assert_int_eq(tp_prefix_count_add(c, b, 13, 1), 1);
    ck_assert_int_eq(tp_prefix_count_add(c, b, 13, 3), 3 + 2 * 3); /* seen whole, and two more copies */
    ck_assert_int_eq(tp_prefix_count_add(c, a, 4, 2), 0);   /* one block with its last token: nothing */
    ck_assert_int_eq(tp_prefix_count_add(c, a, 13, 0), 0);
    tp_prefix_count_destroy(c);
    /* room for 2 prefixes: a third is not remembered */
    ck_assert_int_eq(tp_prefix_count_create(4, 2, &c), TP_OK);
    ck_assert_int_eq(tp_prefix_count_add(c, a, 13, 1), 0);
    ck_assert_int_eq(tp_prefix_count_add(c, a, 13, 1), 2);
    tp_prefix_count_destroy(c);
    tp_prefix_count_destroy(NULL);
}
END_TEST

/* Behind a sliding window a sequence gives back the blocks before what its next token reads,
 * so sequences longer than the whole cache run, and another sequence takes those blocks while
 * it goes on (check_batch: every key a token reads is its own; model_from_cache: the tokens
 * are those of the sequence run alone). Windows read from multiples of 1, 4 and 64 (the CUDA
 * backend's), prefix caching on and off. */
START_TEST(window_gives_back_blocks)
{
    const tp_sched_config cfgs[] = {
        {4, 12, 4, 16, 160, 0, 8, 4},
        {1, 20, 3, 5, 100, 0, 6, 1},
        {16, 16, 8, 64, 400, 0, 40, 64},
        {4, 12, 4, 16, 160, 1, 8, 4},
        {2, 30, 6, 9, 120, 1, 5, 1},
        {16, 24, 8, 64, 400, 1, 40, 64},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
        const tp_sched_config *c = &cfgs[k];
        const int64_t cache_tokens = (int64_t)c->n_blocks * c->block_size;
        engine e;
        engine_init(&e, c, 0);
        if (c->prefix_caching)
            shared_prefix_workload(&e, 500 + k, 40, 3, c->max_model_len / 2, c->max_model_len / 2, 60);
        else
            random_workload(&e, 500 + k, 30, c->max_model_len / 2, c->max_model_len, 60, 1);
        int32_t longer = 0;
        for (int32_t i = 0; i < e.n_seqs; i++) longer += e.seqs[i].n_prompt + e.seqs[i].n_expect > cache_tokens;
        engine_run(&e);
        ck_assert_msg(longer > 0, "config %zu: no sequence outgrew the cache", k);
        ck_assert_int_le(e.most_held, tp_sched_seq_blocks(c, c->max_model_len, c->max_num_batched_tokens));
        if (c->prefix_caching) ck_assert_int_gt(e.hit_tokens, 0);
        engine_free(&e);
    }
    /* a window as long as the sequences gives nothing back: the cache bounds them as before */
    const tp_sched_config wide = {4, 12, 4, 16, 48, 0, 48, 1};
    ck_assert_int_eq(tp_sched_seq_blocks(&wide, 48, 1), 12);
    ck_assert_int_eq(tp_sched_seq_blocks(&wide, 47, 16), 12);
    /* the bound: a step of chunk tokens from p0 holds blocks first_read(p0) / bs .. (p0 + chunk
     * - 1) / bs; over every p0 its largest is what tp_sched_seq_blocks says at most */
    for (int32_t bs = 1; bs <= 16; bs *= 2)
        for (int32_t a = 1; a <= 64; a *= 4)
            for (int32_t w = 1; w <= 70; w += 3)
                for (int32_t chunk = 1; chunk <= 33; chunk += 8) {
                    const tp_sched_config c = {bs, 1000, 4, chunk, 4000, 0, w, a};
                    int64_t most = 0;
                    for (int32_t p0 = 0; p0 < 300; p0++) {
                        const int64_t held = (p0 + chunk - 1) / bs - first_read(&c, p0) / bs + 1;
                        if (held > most) most = held;
                    }
                    ck_assert_int_le(most, tp_sched_seq_blocks(&c, 4000, chunk));
                    ck_assert_int_ge(most + 2, tp_sched_seq_blocks(&c, 4000, chunk)); /* and not far above */
                }
}
END_TEST

/* Run s until nothing is left, every sampled token 5. */
static void run_to_idle(tp_scheduler *s)
{
    const int32_t five[64] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
                              5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
    tp_sched_batch b;
    int64_t key;
    const int32_t *gen;
    int32_t n_gen;
    for (int guard = 0; !tp_scheduler_idle(s); guard++) {
        ck_assert_int_lt(guard, 1000);
        ck_assert_int_eq(tp_scheduler_schedule(s, &b), TP_OK);
        ck_assert_int_le(b.n_logits, 64);
        ck_assert_int_eq(tp_scheduler_commit(s, &b, five, NULL), TP_OK);
        while (tp_scheduler_pop_finished(s, &key, &gen, &n_gen)) {}
    }
}

/* A prompt's head given back behind a sliding window while its sequence ran is evicted after
 * the rest of the prefix: A (12 prompt tokens, 3 blocks of 4, window 4) lets its prompt blocks
 * go one by one as it decodes; B then takes every free block and one evictable one; C, A's
 * prompt again, still finds A's first two blocks (the most it may take: its last token is
 * computed). Evicted oldest first, B took A's first block and C found nothing. */
START_TEST(window_keeps_the_prefix_head_longest)
{
    tp_scheduler *s = NULL;
    ck_assert_int_eq(tp_scheduler_create(&(tp_sched_config){4, 8, 1, 64, 64, 1, 4, 1}, &s), TP_OK);
    int32_t a[12], b[24];
    for (int i = 0; i < 12; i++) a[i] = 10 + i;
    for (int i = 0; i < 24; i++) b[i] = 100 + i;
    ck_assert_int_eq(tp_scheduler_add(s, 1, a, 12, 9, 0), TP_OK);
    run_to_idle(s);
    ck_assert_int_eq(tp_scheduler_add(s, 2, b, 24, 1, 0), TP_OK);
    run_to_idle(s);
    ck_assert_int_eq(tp_scheduler_add(s, 3, a, 12, 1, 0), TP_OK);
    tp_sched_batch bt;
    ck_assert_int_eq(tp_scheduler_schedule(s, &bt), TP_OK);
    ck_assert_int_eq(tp_scheduler_cached_tokens(s, 3), 8);
    ck_assert_int_eq(bt.n_tokens, 4);
    tp_scheduler_destroy(s);
}
END_TEST

START_TEST(stress)
{
    const int32_t sizes[] = {1, 2, 3, 4, 8, 16};
    int64_t preempted_runs = 0, hit_runs = 0;
    for (uint64_t seed = 1; seed <= 1000; seed++) {
        uint64_t rng = seed * 0x2545f4914f6cdd1dull;
        int32_t bs = sizes[rng_range(&rng, 0, 5)];
        int32_t max_len = rng_range(&rng, 2, 160);
        int32_t min_blocks = (max_len + bs - 1) / bs;
        int32_t n_blocks = rng_range(&rng, 1, 2 * min_blocks + 4);
        int32_t max_seqs = rng_range(&rng, 1, 12);
        int32_t mnbt = rng_range(&rng, 0, 3) == 0 ? rng_range(&rng, 1, 4) : rng_range(&rng, 1, 96);
        engine e;
        const int caching = rng_range(&rng, 0, 1);
        const int32_t aligns[] = {1, 2, 4, 64};
        const int32_t window = rng_range(&rng, 0, 2) == 0 ? rng_range(&rng, 1, max_len) : 0;
        engine_init(&e, &(tp_sched_config){bs, n_blocks, max_seqs, mnbt, max_len, caching, window, aligns[rng_range(&rng, 0, 3)]},
                    rng_range(&rng, 0, 1));
        int32_t cap = (int32_t)longest_seq(&e.cfg);
        if (cap >= 2) {
            if (caching && rng_range(&rng, 0, 1))
                shared_prefix_workload(&e, rng, rng_range(&rng, 1, 40), rng_range(&rng, 1, 4), rng_range(&rng, 1, cap),
                                       rng_range(&rng, 1, cap), rng_range(&rng, 0, 1) ? 0 : 100);
            else
                random_workload(&e, rng, rng_range(&rng, 1, 40), rng_range(&rng, 1, cap),
                                rng_range(&rng, 1, cap), rng_range(&rng, 0, 1) ? 0 : 100, 1);
            engine_run(&e);
            hit_runs += e.hit_tokens > 0;
            preempted_runs += e.stats.preemptions > 0;
        }
        engine_free(&e);
    }
    ck_assert_int_gt(preempted_runs, 100);
    ck_assert_int_gt(hit_runs, 50);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("scheduler");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, block_alloc_basics);
    tcase_add_test(tc, block_alloc_prefix_cache);
    tcase_add_test(tc, prefix_caching_shared_prompts);
    tcase_add_test(tc, prefix_caching_first_admission_counts);
    tcase_add_test(tc, prefix_caching_waits_for_a_prefix_in_flight);
    tcase_add_test(tc, prefix_count);
    tcase_add_test(tc, single_sequence);
    tcase_add_test(tc, one_token_prompt_one_new_token);
    tcase_add_test(tc, many_random_sequences);
    tcase_add_test(tc, long_prompts_are_chunked);
    tcase_add_test(tc, tight_blocks_preempt_and_recompute);
    tcase_add_test(tc, tight_blocks_chunked_prefill);
    tcase_add_test(tc, preempted_sequence_resumes_first);
    tcase_add_test(tc, admission_waits_for_the_whole_sequence);
    tcase_add_test(tc, lockstep_overflow_preempts_each_once);
    tcase_add_test(tc, one_sequence_at_a_time);
    tcase_add_test(tc, block_sizes_1_and_16);
    tcase_add_test(tc, continuous_batching);
    tcase_add_test(tc, finish_early);
    tcase_add_test(tc, commit_without_finish_array);
    tcase_add_test(tc, pending_tokens_resolve);
    tcase_add_test(tc, add_refusals);
    tcase_add_test(tc, create_refusals_and_misuse);
    tcase_add_test(tc, fit_seqs);
    tcase_add_test(tc, many_keys);
    tcase_add_test(tc, peek_first_is_the_first_step);
    tcase_add_test(tc, determinism);
    tcase_add_test(tc, window_gives_back_blocks);
    tcase_add_test(tc, window_keeps_the_prefix_head_longest);
    tcase_add_test(tc, stress);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
