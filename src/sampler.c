/*
 * sampler.c: logits -> next token in vLLM/HF order (penalties, temperature, top-k, top-p,
 * min-p, inverse-CDF draw in rank order), plus raw log-softmax logprobs. Never sorts the
 * vocabulary: a heap or quickselect finds top-k; exponent buckets and a weighted quickselect
 * find the top-p cut and the draw. The random stream is a frozen function of (seed, step).
 */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Below this temperature vLLM samples greedily (_SAMPLING_EPS in vllm/v1/sample/sampler.py):
 * dividing by a near-zero temperature would only amplify rounding. */
#define GREEDY_TEMPERATURE 1e-5
#define SMALL_RANGE 16  /* selections finish ranges this short with an insertion sort */
#define BUCKETS 64      /* exponent buckets of a mass_view */
#define BUCKET_MIN 2048 /* below this many candidates, one bucket (no regrouping) is cheaper */

struct tp_sampler {
    int32_t vocab;
    double *val;    /* [vocab] penalized logits (sampling path only) */
    double *w;      /* [vocab] exp((val - max) / temperature): unnormalized probabilities */
    int32_t *idx;   /* [vocab] candidate ids, rearranged in place by the selections */
    int32_t *tmp;   /* [vocab] where candidates are regrouped by weight bucket */
    int32_t *count; /* [vocab] occurrences in the output; all zero between calls */
    uint8_t *seen;  /* [vocab] 1 if in prompt or output; all zero between calls */
    uint8_t *ban;   /* [vocab] EDIT_* bits of this call's edits; all zero between calls */
    float *bias;    /* [vocab] logit_bias of this call where EDIT_BIAS is set */
};

/* ---- parameters ---------------------------------------------------------------------- */

void tp_sampling_params_default(tp_sampling_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.0;
    p->top_k = 0;
    p->top_p = 1.0;
    p->min_p = 0.0;
    p->repetition_penalty = 1.0;
    p->presence_penalty = 0.0;
    p->frequency_penalty = 0.0;
    p->seed = 0;
    p->logprobs = 0;
}

/* The shortest %g form that reads back as v, so 1.0000001 is not printed as "1". */
static void format_double(char *buf, size_t n, double v)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (!isfinite(v) || strtod(buf, NULL) == v) return;
    }
}

static tp_status out_of_range(const char *field, double v, const char *range)
{
    char num[40];
    format_double(num, sizeof num, v);
    return tp_error(TP_ERR_INVALID_ARG, "%s %s is outside %s", field, num, range);
}

tp_status tp_sampling_params_validate(const tp_sampling_params *p)
{
    if (!p) return tp_error(TP_ERR_INVALID_ARG, "sampling parameters are missing");
    /* Every test is written as !(inside) so that NaN fails it too. */
    if (!(p->temperature >= 0.0 && isfinite(p->temperature)))
        return out_of_range("temperature", p->temperature, "[0, inf) (0 means greedy)");
    if (p->top_k < -1)
        return tp_error(TP_ERR_INVALID_ARG,
                        "top_k %d is outside [-1, %d] (-1 and 0 turn top-k off)", (int)p->top_k,
                        (int)INT32_MAX);
    if (!(p->top_p > 0.0 && p->top_p <= 1.0))
        return out_of_range("top_p", p->top_p, "(0, 1] (1 turns top-p off)");
    if (!(p->min_p >= 0.0 && p->min_p <= 1.0))
        return out_of_range("min_p", p->min_p, "[0, 1] (0 turns min-p off)");
    if (!(p->repetition_penalty > 0.0 && isfinite(p->repetition_penalty)))
        return out_of_range("repetition_penalty", p->repetition_penalty,
                            "(0, inf) (1 turns it off)");
    if (!(p->presence_penalty >= -2.0 && p->presence_penalty <= 2.0))
        return out_of_range("presence_penalty", p->presence_penalty, "[-2, 2]");
    if (!(p->frequency_penalty >= -2.0 && p->frequency_penalty <= 2.0))
        return out_of_range("frequency_penalty", p->frequency_penalty, "[-2, 2]");
    if (p->logprobs < 0 || p->logprobs > TP_MAX_LOGPROBS)
        return tp_error(TP_ERR_INVALID_ARG, "logprobs %d is outside [0, %d]", (int)p->logprobs,
                        TP_MAX_LOGPROBS);
    return TP_OK;
}

/* ---- the random stream ----------------------------------------------------------------
 * FROZEN: a resumed run must redraw exactly what the first run drew, so any change here is
 * a format change (check_sampler.c pins the values). With SplitMix64's output function
 *     mix(x):  z = x + 0x9e3779b97f4a7c15;
 *              z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
 *              z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 *              return z ^ (z >> 31);          (all arithmetic mod 2^64)
 * and FNV-1a 64 over the bytes of the request id (offset 0xcbf29ce484222325, prime
 * 0x100000001b3; NULL is the empty string):
 *     request_seed = mix(mix(global_seed) ^ fnv1a64(request_id))
 *     bits(step)   = mix(seed + step * 0x9e3779b97f4a7c15)   -- SplitMix64's step-th output
 *     u(step)      = (bits >> 11) * 2^-53                     -- uniform in [0, 1)
 * Counter-based: step k's draw needs no earlier call, so batching and rank layout cannot
 * change it. Greedy steps use no draw, and later steps' draws are the same either way. */

#define GOLDEN 0x9e3779b97f4a7c15ULL

static uint64_t mix64(uint64_t x)
{
    uint64_t z = x + GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t tp_sampler_request_seed(uint64_t global_seed, const char *request_id)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *c = (const unsigned char *)(request_id ? request_id : ""); *c; c++) {
        h ^= *c;
        h *= 0x100000001b3ULL;
    }
    /* Mixing the global seed first keeps (seed, id) pairs from cancelling in the XOR. */
    return mix64(mix64(global_seed) ^ h);
}

static double stream_unit(uint64_t seed, uint64_t step)
{
    return (double)(mix64(seed + step * GOLDEN) >> 11) * 0x1.0p-53;
}

/* ---- create / destroy ------------------------------------------------------------------ */

tp_status tp_sampler_create(int32_t vocab_size, tp_sampler **out)
{
    *out = NULL;
    if (vocab_size < 1)
        return tp_error(TP_ERR_INVALID_ARG, "sampler vocabulary size %d must be at least 1",
                        (int)vocab_size);
    tp_sampler *s = calloc(1, sizeof *s);
    if (!s) return tp_error(TP_ERR_OOM, "out of memory creating a sampler");
    size_t n = (size_t)vocab_size;
    s->vocab = vocab_size;
    s->val = malloc(n * sizeof *s->val);
    s->w = malloc(n * sizeof *s->w);
    s->idx = malloc(n * sizeof *s->idx);
    s->tmp = malloc(n * sizeof *s->tmp);
    s->count = calloc(n, sizeof *s->count);
    s->seen = calloc(n, sizeof *s->seen);
    s->ban = calloc(n, sizeof *s->ban);
    s->bias = malloc(n * sizeof *s->bias);
    if (!s->val || !s->w || !s->idx || !s->tmp || !s->count || !s->seen || !s->ban || !s->bias) {
        tp_sampler_destroy(s);
        return tp_error(TP_ERR_OOM, "out of memory creating a sampler for %d tokens",
                        (int)vocab_size);
    }
    *out = s;
    return TP_OK;
}

void tp_sampler_destroy(tp_sampler *s)
{
    if (!s) return;
    free(s->val);
    free(s->w);
    free(s->idx);
    free(s->tmp);
    free(s->count);
    free(s->seen);
    free(s->ban);
    free(s->bias);
    free(s);
}

/* ---- selection in rank order --------------------------------------------------------------
 * Every rule ranks tokens by (penalized logit descending, id ascending): a strict total
 * order, so top-k ties at the boundary keep the lower ids and all results are deterministic. */

static inline int ranks_before(const double *val, int32_t a, int32_t b)
{
    return val[a] > val[b] || (val[a] == val[b] && a < b);
}

static inline void swap_ids(int32_t *a, int32_t *b)
{
    int32_t t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(const double *val, int32_t *idx, int32_t lo, int32_t hi)
{
    for (int32_t i = lo + 1; i < hi; i++) {
        int32_t t = idx[i], j = i;
        while (j > lo && ranks_before(val, t, idx[j - 1])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = t;
    }
}

/* Heap whose root ranks last, so popping roots to the back leaves the array in rank order. */
static void sift_down(const double *val, int32_t *a, int32_t i, int32_t n)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && ranks_before(val, a[c], a[c + 1])) c++;
        if (!ranks_before(val, a[i], a[c])) return;
        swap_ids(&a[i], &a[c]);
        i = c;
    }
}

/* Sort idx[lo, hi) in rank order: the fallback that bounds quickselect's worst case. */
static void sort_range(const double *val, int32_t *idx, int32_t lo, int32_t hi)
{
    int32_t n = hi - lo;
    if (n <= SMALL_RANGE) {
        insertion_sort(val, idx, lo, hi);
        return;
    }
    int32_t *a = idx + lo;
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(val, a, i, n);
    for (int32_t end = n - 1; end > 0; end--) {
        swap_ids(&a[0], &a[end]);
        sift_down(val, a, 0, end);
    }
}

/* Partition idx[lo, hi) (at least 3 entries) around a median-of-three pivot: afterwards
 * idx[lo, p) rank before idx[p] and idx(p, hi) after it. Returns p. */
static int32_t partition(const double *val, int32_t *idx, int32_t lo, int32_t hi)
{
    int32_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (ranks_before(val, idx[mid], idx[lo])) swap_ids(&idx[mid], &idx[lo]);
    if (ranks_before(val, idx[last], idx[lo])) swap_ids(&idx[last], &idx[lo]);
    if (ranks_before(val, idx[last], idx[mid])) swap_ids(&idx[last], &idx[mid]);
    swap_ids(&idx[mid], &idx[last]);
    int32_t pivot = idx[last], store = lo;
    for (int32_t i = lo; i < last; i++)
        if (ranks_before(val, idx[i], pivot)) swap_ids(&idx[i], &idx[store++]);
    swap_ids(&idx[store], &idx[last]);
    return store;
}

/* Quickselect gets this many partitions before falling back to a heap sort (introselect). */
static int depth_budget(int32_t n)
{
    int d = 8;
    while (n > 1) {
        n >>= 1;
        d += 2;
    }
    return d;
}

/* Rearrange idx[0, n) so that idx[0, k) are the k first-ranked tokens (0 < k < n). Small k:
 * a heap of the best k so far whose root ranks last, so most tokens cost one sequential
 * comparison. Large k: quickselect. */
static void select_first_k(const double *val, int32_t *idx, int32_t n, int32_t k)
{
    if (k <= n / 16) {
        for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(val, idx, i, k);
        for (int32_t i = k; i < n; i++) {
            if (ranks_before(val, idx[i], idx[0])) {
                swap_ids(&idx[0], &idx[i]);
                sift_down(val, idx, 0, k);
            }
        }
        return;
    }
    int32_t lo = 0, hi = n;
    int depth = depth_budget(n);
    while (hi - lo > SMALL_RANGE && depth-- > 0) {
        int32_t p = partition(val, idx, lo, hi);
        if (p > k) hi = p;
        else if (p + 1 < k) lo = p + 1;
        else return; /* p == k or p == k - 1: the boundary falls at the pivot */
    }
    sort_range(val, idx, lo, hi);
}

static inline int mass_reached(double cum, double target, int strict)
{
    return strict ? cum > target : cum >= target;
}

/* Walk the rank order of idx[lo, hi) without sorting it, given acc, the mass of idx[0, lo),
 * which all rank before: return the first rank position m whose running mass cum(m) (of
 * idx[0, m]) reaches target (cum >= target, or cum > target if strict). idx[lo, hi) is
 * rearranged so that idx[0, m] are the m + 1 first-ranked tokens and idx[m] the last of them.
 * If rounding leaves the target unreached, position hi - 1 is returned. */
static int32_t select_by_mass(const double *val, const double *w, int32_t *idx, int32_t lo,
                              int32_t hi, double acc, double target, int strict)
{
    int depth = depth_budget(hi - lo);
    while (hi - lo > SMALL_RANGE && depth-- > 0) {
        int32_t p = partition(val, idx, lo, hi);
        double a = acc;
        for (int32_t i = lo; i < p; i++) a += w[idx[i]];
        if (p > lo && mass_reached(a, target, strict)) {
            hi = p;
            continue;
        }
        a += w[idx[p]];
        if (mass_reached(a, target, strict) || p == hi - 1) return p;
        acc = a;
        lo = p + 1;
    }
    sort_range(val, idx, lo, hi);
    for (int32_t i = lo; i < hi; i++) {
        acc += w[idx[i]];
        if (mass_reached(acc, target, strict)) return i;
    }
    return hi - 1;
}

/* Exponent bucket of a weight in (0, 1]: 0 holds 1, b holds [2^-b, 2^(1-b)), the last one
 * everything smaller. Weights never grow along the rank order, so each bucket is a run of
 * consecutive ranks. */
static inline int bucket_of(double w)
{
    uint64_t bits;
    memcpy(&bits, &w, sizeof bits);
    int b = 1023 - (int)(bits >> 52);
    return b < BUCKETS - 1 ? b : BUCKETS - 1;
}

/* The candidates idx[0, n) grouped by weight bucket, in bucket (so rank) order, with the mass
 * of each: a query for a rank position by running mass then reads 64 sums and searches one
 * bucket, instead of the whole vocabulary. Small sets use one bucket and skip the regrouping. */
typedef struct mass_view {
    int nb;                     /* 1 or BUCKETS */
    int32_t start[BUCKETS + 1]; /* bucket b is idx[start[b], start[b + 1]) */
    double mass[BUCKETS];
} mass_view;

static inline int view_bucket(const mass_view *v, double w)
{
    return v->nb == 1 ? 0 : bucket_of(w);
}

static double range_mass(const double *w, const int32_t *idx, int32_t lo, int32_t hi)
{
    double z = 0.0;
    for (int32_t i = lo; i < hi; i++) z += w[idx[i]];
    return z;
}

static void view_build(tp_sampler *s, int32_t n, mass_view *v)
{
    if (n < BUCKET_MIN) {
        v->nb = 1;
        v->start[0] = 0;
        v->start[1] = n;
        v->mass[0] = range_mass(s->w, s->idx, 0, n);
        return;
    }
    int32_t count[BUCKETS] = {0};
    v->nb = BUCKETS;
    memset(v->mass, 0, sizeof v->mass);
    for (int32_t i = 0; i < n; i++) {
        int b = bucket_of(s->w[s->idx[i]]);
        count[b]++;
        v->mass[b] += s->w[s->idx[i]];
    }
    v->start[0] = 0;
    for (int b = 0; b < BUCKETS; b++) v->start[b + 1] = v->start[b] + count[b];
    int32_t fill[BUCKETS];
    memcpy(fill, v->start, sizeof fill);
    for (int32_t i = 0; i < n; i++) s->tmp[fill[bucket_of(s->w[s->idx[i]])]++] = s->idx[i];
    int32_t *t = s->idx; /* the regrouped copy becomes the candidate list */
    s->idx = s->tmp;
    s->tmp = t;
}

static int32_t view_size(const mass_view *v)
{
    return v->start[v->nb];
}

static double view_mass(const mass_view *v)
{
    double z = 0.0;
    for (int b = 0; b < v->nb; b++) z += v->mass[b];
    return z;
}

/* Keep the first n candidates (n >= 1; a cut inside a bucket keeps that bucket's first part). */
static void view_truncate(const tp_sampler *s, mass_view *v, int32_t n)
{
    for (int b = 0; b < v->nb; b++) {
        if (v->start[b + 1] <= n) continue;
        if (v->start[b] < n) v->mass[b] = range_mass(s->w, s->idx, v->start[b], n);
        else v->mass[b] = 0.0;
        v->start[b + 1] = n;
    }
}

/* The first rank position m whose running mass (of the m + 1 first-ranked candidates)
 * reaches target (>= target, or > target if strict); see select_by_mass. */
static int32_t view_find(const tp_sampler *s, const mass_view *v, double target, int strict)
{
    int pick = -1, last = 0;
    double acc = 0.0, before_last = 0.0;
    for (int b = 0; b < v->nb; b++) {
        if (v->start[b] == v->start[b + 1]) continue;
        if (mass_reached(acc + v->mass[b], target, strict)) {
            pick = b;
            break;
        }
        before_last = acc;
        last = b;
        acc += v->mass[b];
    }
    if (pick < 0) { /* rounding left the target unreached: the last candidate it is */
        pick = last;
        acc = before_last;
    }
    return select_by_mass(s->val, s->w, s->idx, v->start[pick], v->start[pick + 1], acc, target,
                          strict);
}

/* ---- sampling -------------------------------------------------------------------------- */

static tp_status check_tokens(const char *what, const int32_t *t, int32_t n, int32_t vocab)
{
    if (n < 0) return tp_error(TP_ERR_INVALID_ARG, "%s token count %d is negative", what, (int)n);
    if (n > 0 && !t)
        return tp_error(TP_ERR_INVALID_ARG, "%s has %d tokens but no token array", what, (int)n);
    for (int32_t i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= vocab)
            return tp_error(TP_ERR_INVALID_ARG,
                            "%s token %d at position %d is outside the vocabulary [0, %d)", what,
                            (int)t[i], (int)i, (int)vocab);
    return TP_OK;
}

static void mark_tokens(tp_sampler *s, const int32_t *prompt, int32_t n_prompt,
                        const int32_t *output, int32_t n_output, int on)
{
    for (int32_t i = 0; i < n_prompt; i++) s->seen[prompt[i]] = (uint8_t)on;
    for (int32_t i = 0; i < n_output; i++) {
        s->seen[output[i]] = (uint8_t)on;
        s->count[output[i]] = on ? s->count[output[i]] + 1 : 0;
    }
}

/* vLLM's apply_penalties: repetition (HF: once per distinct token of prompt + output), then
 * frequency and presence (OpenAI: output only). A finite logit stays finite, so a huge
 * repetition penalty cannot turn a live token into a -inf one. */
static double penalize(double x, const tp_sampling_params *p, int32_t count)
{
    double v = x > 0.0 ? x / p->repetition_penalty : x * p->repetition_penalty;
    v -= (double)count * p->frequency_penalty;
    if (count > 0) v -= p->presence_penalty;
    if (isinf(v) && isfinite(x)) v = copysign(DBL_MAX, v);
    return v;
}

/* Keep top[0, *n) as the best raw logits seen so far, best first; ids arrive in increasing
 * order, so an equal logit ranks after the ones already there (ties go to the lower id). */
static void insert_top(tp_token_logprob *top, int32_t *n, int32_t cap, int32_t id, float x)
{
    int32_t j = *n < cap ? (*n)++ : cap - 1;
    while (j > 0 && top[j - 1].logprob < x) {
        top[j] = top[j - 1];
        j--;
    }
    top[j].id = id;
    top[j].logprob = x;
}

/* The random path over the n live candidates in s->idx (penalized logits in s->val, their
 * maximum max): top-k, temperature, top-p, min-p, then an inverse-CDF draw in rank order.
 * Each filter keeps a rank prefix, so they all shorten one mass_view. *z_live gets the
 * weight of all live candidates (meaningful when top-k cut nothing). */
static int32_t draw_token(tp_sampler *s, const tp_sampling_params *p, uint64_t step, double max,
                          int32_t n, double *z_live)
{
    /* top-k ranks penalized logits, which temperature does not reorder: select before exp. */
    if (p->top_k > 0 && p->top_k < n) {
        select_first_k(s->val, s->idx, n, p->top_k);
        n = p->top_k;
    }
    /* The best token weighs exactly 1. Weights that underflow to 0 could never be drawn:
     * dropping them keeps "the last survivor" (rounding's fallback) a drawable token. */
    int32_t live = 0;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = s->idx[i];
        double w = exp((s->val[t] - max) / p->temperature);
        s->w[t] = w;
        if (w > 0.0) {
            s->idx[live++] = t;
            z += w;
        }
    }
    *z_live = z;
    mass_view v;
    view_build(s, live, &v);
    /* top-p: the smallest rank prefix whose mass (renormalized after top-k) is >= top_p. */
    if (p->top_p < 1.0 && view_size(&v) > 1)
        view_truncate(s, &v, view_find(s, &v, p->top_p * view_mass(&v), 0) + 1);
    /* min-p: prob < min_p * max_prob  <=>  w < min_p, as the best token (still here) weighs
     * 1. Buckets before min_p's all pass, those after all fail: filter only its bucket. */
    if (p->min_p > 0.0 && view_size(&v) > 1) {
        int b = view_bucket(&v, p->min_p);
        int32_t keep = v.start[b];
        for (int32_t i = v.start[b]; i < v.start[b + 1]; i++)
            if (s->w[s->idx[i]] >= p->min_p) swap_ids(&s->idx[keep++], &s->idx[i]);
        view_truncate(s, &v, keep);
    }
    if (view_size(&v) == 1) return s->idx[0];
    double u = stream_unit(p->seed, step);
    return s->idx[view_find(s, &v, u * view_mass(&v), 1)];
}

tp_status tp_sampler_sample(tp_sampler *s, const tp_sampling_params *params, uint64_t step,
                            const float *logits, const int32_t *prompt, int32_t n_prompt,
                            const int32_t *output, int32_t n_output, tp_sample_result *result)
{
    return tp_sampler_sample_edited(s, params, step, logits, NULL, prompt, n_prompt, output, n_output, result);
}

enum { EDIT_BANNED = 1, EDIT_ALLOWED = 2, EDIT_BIAS = 4 };

/* Mark (on) or clear the edits' ids in s->ban and s->bias. */
static void mark_edits(tp_sampler *s, const tp_logit_edits *e, int on)
{
    for (int32_t i = 0; i < e->n_allowed; i++) s->ban[e->allowed[i]] = on ? (uint8_t)(s->ban[e->allowed[i]] | EDIT_ALLOWED) : 0;
    for (int32_t i = 0; i < e->n_banned; i++) s->ban[e->banned[i]] = on ? (uint8_t)(s->ban[e->banned[i]] | EDIT_BANNED) : 0;
    for (int32_t i = 0; i < e->n_bias; i++) {
        s->ban[e->bias_ids[i]] = on ? (uint8_t)(s->ban[e->bias_ids[i]] | EDIT_BIAS) : 0;
        s->bias[e->bias_ids[i]] = e->bias[i];
    }
}

static tp_status check_edits(const tp_logit_edits *e, int32_t vocab)
{
    TP_CHECK(check_tokens("allowed", e->allowed, e->n_allowed, vocab));
    TP_CHECK(check_tokens("banned", e->banned, e->n_banned, vocab));
    TP_CHECK(check_tokens("logit_bias", e->bias_ids, e->n_bias, vocab));
    if (e->n_bias > 0 && !e->bias)
        return tp_error(TP_ERR_INVALID_ARG, "logit_bias has %d ids but no values", (int)e->n_bias);
    for (int32_t i = 0; i < e->n_bias; i++)
        if (!isfinite(e->bias[i]))
            return tp_error(TP_ERR_INVALID_ARG, "logit_bias of token %d is not finite", (int)e->bias_ids[i]);
    return TP_OK;
}

tp_status tp_sampler_sample_edited(tp_sampler *s, const tp_sampling_params *params, uint64_t step,
                                   const float *logits, const tp_logit_edits *edits, const int32_t *prompt,
                                   int32_t n_prompt, const int32_t *output, int32_t n_output,
                                   tp_sample_result *result)
{
    if (!s || !logits || !result)
        return tp_error(TP_ERR_INVALID_ARG,
                        "tp_sampler_sample needs a sampler, logits and a result");
    TP_CHECK(tp_sampling_params_validate(params));
    if (params->logprobs > 0 && !result->top)
        return tp_error(TP_ERR_INVALID_ARG, "logprobs %d requested but result->top is NULL",
                        (int)params->logprobs);
    const int32_t vocab = s->vocab;
    const tp_logit_edits none = {0};
    const tp_logit_edits *ed = edits ? edits : &none;
    const int edited = ed->n_allowed > 0 || ed->n_banned > 0 || ed->n_bias > 0;
    const int penalized = params->repetition_penalty != 1.0 || params->frequency_penalty != 0.0 ||
                          params->presence_penalty != 0.0;
    const int greedy = params->temperature < GREEDY_TEMPERATURE || params->top_k == 1;
    /* At temperature 1, without penalties, edits or top-k, the weights exp(raw - max) are the
     * very terms of the logprob normalizer: compute them once (exp dominates the cost). */
    const int shared_exp = !greedy && !penalized && !edited && params->temperature == 1.0 &&
                           !(params->top_k > 0 && params->top_k < vocab);
    /* no logprob wanted: no normalizer (an exp a column less) */
    const int want_lse = !params->logprob_off || params->logprobs > 0;
    if (edited) TP_CHECK(check_edits(ed, vocab));
    if (penalized) {
        /* The token lists are read only when a penalty is on, so they are checked only then. */
        TP_CHECK(check_tokens("prompt", prompt, n_prompt, vocab));
        TP_CHECK(check_tokens("output", output, n_output, vocab));
        mark_tokens(s, prompt, n_prompt, output, n_output, 1);
    }
    if (edited) mark_edits(s, ed, 1);
    const int allow_list = ed->n_allowed > 0;

    /* One pass: reject NaN/+Inf; online log-sum-exp and top-N of the raw logits (excluded ids
     * included, as vLLM's raw logprobs come before its edits); biased, then penalized logits
     * with the excluded at -inf, their argmax (the greedy answer, lowest id on ties)
     * and the live candidates. */
    const int32_t n_top = params->logprobs < vocab ? params->logprobs : vocab;
    tp_token_logprob *top = result->top; /* holds raw logits until the end */
    int32_t n_have = 0, n_live = 0, arg = 0, bad = -1;
    double m = -INFINITY, sum = 0.0, best = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) {
        float x = logits[i];
        const int f = edited ? s->ban[i] : 0;
        const int excluded = (f & EDIT_BANNED) || (allow_list && !(f & EDIT_ALLOWED));
        if (isnan(x) || x == INFINITY) {
            if (!excluded) {
                bad = i;
                break;
            }
            x = -INFINITY; /* an excluded column's NaN/+Inf is neither drawn nor counted */
        }
        const double r = x;
        if (shared_exp || !want_lse) {
            /* the normalizer comes from draw_token's weights, or is not wanted */
        } else if (r > m) {
            sum = sum * exp(m - r) + 1.0;
            m = r;
        } else if (r != -INFINITY) {
            sum += exp(r - m);
        }
        if (n_top > 0 && (n_have < n_top || x > top[n_top - 1].logprob))
            insert_top(top, &n_have, n_top, i, x);
        const double b = f & EDIT_BIAS ? r + (double)s->bias[i] : r;
        const double v = excluded ? -INFINITY : penalized && s->seen[i] ? penalize(b, params, s->count[i]) : b;
        if (v > best) {
            best = v;
            arg = i;
        }
        if (!greedy) {
            s->val[i] = v;
            if (v != -INFINITY) s->idx[n_live++] = i;
        }
    }
    if (penalized) mark_tokens(s, prompt, n_prompt, output, n_output, 0);
    if (edited) mark_edits(s, ed, 0);
    if (bad >= 0)
        return tp_error(TP_ERR_NUMERIC, "logits contain %s at token %d",
                        isnan(logits[bad]) ? "NaN" : "+Inf", (int)bad);

    /* All -inf: nothing is live, and the greedy rule (token 0) stands; no draw either. */
    if (greedy || n_live <= 1) {
        result->token = arg;
        if (shared_exp) sum = n_live; /* one live token weighs exp(0) = 1; none, nothing */
    } else {
        double z_live;
        result->token = draw_token(s, params, step, best, n_live, &z_live);
        if (shared_exp) sum = z_live;
    }
    if (shared_exp) m = best; /* unpenalized: the raw maximum */

    /* Raw logprobs, as vLLM's default logprobs_mode. All -inf has no softmax: report its limit
     * for equal logits, the uniform distribution. */
    const int none_live = m == -INFINITY;
    const double lse = none_live ? 0.0 : m + log(sum);
    const double uniform = -log((double)vocab);
    const float xt = logits[result->token];
    const double lp = none_live ? uniform : isnan(xt) || xt == INFINITY ? -INFINITY : (double)xt - lse;
    result->logprob = params->logprob_off ? 0.0f : (float)lp;
    for (int32_t i = 0; i < n_have; i++)
        top[i].logprob = (float)(none_live ? uniform : (double)top[i].logprob - lse);
    result->n_top = n_have;
    return TP_OK;
}
