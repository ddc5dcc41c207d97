/*
 * check_sampler.c: each sampling rule against a slow reference written here (full sort,
 * sequential filters, linear inverse CDF), checked draw by draw and by chi-square; pinned
 * values of the frozen random stream; raw logprobs; penalties; validation; NaN and -inf.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "status.h"

/* ---- reference implementation ---------------------------------------------------------- */

static uint64_t ref_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t ref_fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static uint64_t ref_bits(uint64_t seed, uint64_t step)
{
    return ref_mix(seed + step * 0x9e3779b97f4a7c15ULL);
}

static double ref_unit(uint64_t seed, uint64_t step)
{
    return ldexp((double)(ref_bits(seed, step) >> 11), -53);
}

typedef struct ranked {
    double v;
    int32_t id;
} ranked;

static int cmp_ranked(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The distribution a draw is made from: survivors in rank order and unnormalized weights. */
typedef struct ref_dist {
    int32_t n;
    int32_t *ids;
    double *w;
    double z;
} ref_dist;

static void ref_build(ref_dist *d, const float *logits, int32_t vocab, const tp_sampling_params *p,
                      const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                      int32_t n_output)
{
    int *seen = calloc((size_t)vocab, sizeof *seen), *count = calloc((size_t)vocab, sizeof *count);
    ranked *r = malloc((size_t)vocab * sizeof *r);
    d->ids = malloc((size_t)vocab * sizeof *d->ids);
    d->w = malloc((size_t)vocab * sizeof *d->w);
    ck_assert(seen && count && r && d->ids && d->w);
    for (int32_t i = 0; i < n_prompt; i++) seen[prompt[i]] = 1;
    for (int32_t i = 0; i < n_output; i++) seen[output[i]] = 1, count[output[i]]++;
    for (int32_t i = 0; i < vocab; i++) {
        double v = logits[i];
        if (seen[i]) v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
        v -= count[i] * p->frequency_penalty;
        if (count[i] > 0) v -= p->presence_penalty;
        r[i].v = v;
        r[i].id = i;
    }
    qsort(r, (size_t)vocab, sizeof *r, cmp_ranked);
    int32_t n = 0;
    while (n < vocab && r[n].v > -INFINITY) n++;
    if (p->temperature < 1e-5 || p->top_k == 1 || n == 0) {
        d->n = 1; /* argmax, lowest id on ties; token 0 when all are -inf */
        d->ids[0] = r[0].id;
        d->w[0] = d->z = 1.0;
    } else {
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        for (int32_t j = 0; j < n; j++) d->w[j] = exp((r[j].v - r[0].v) / p->temperature);
        while (d->w[n - 1] == 0.0) n--;
        double z = 0;
        for (int32_t j = 0; j < n; j++) z += d->w[j];
        if (p->top_p < 1.0) {
            double cum = 0;
            for (int32_t j = 0; j < n; j++) {
                cum += d->w[j];
                if (cum >= p->top_p * z) {
                    n = j + 1;
                    break;
                }
            }
        }
        int32_t kept = 0;
        for (int32_t j = 0; j < n; j++) {
            if (d->w[j] < p->min_p * d->w[0]) continue;
            d->w[kept] = d->w[j];
            d->ids[kept++] = r[j].id;
        }
        d->n = kept;
        d->z = 0;
        for (int32_t j = 0; j < kept; j++) d->z += d->w[j];
    }
    free(seen);
    free(count);
    free(r);
}

static int32_t ref_draw(const ref_dist *d, uint64_t seed, uint64_t step)
{
    if (d->n == 1) return d->ids[0];
    double target = ref_unit(seed, step) * d->z, cum = 0;
    for (int32_t j = 0; j < d->n; j++) {
        cum += d->w[j];
        if (cum > target) return d->ids[j];
    }
    return d->ids[d->n - 1];
}

static void ref_free(ref_dist *d)
{
    free(d->ids);
    free(d->w);
}

/* log_softmax in long double, the naive way (max subtraction only). */
static void ref_log_softmax(const float *logits, int32_t vocab, long double *out)
{
    long double m = -INFINITY, sum = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > m) m = logits[i];
    for (int32_t i = 0; i < vocab; i++) sum += expl((long double)logits[i] - m);
    for (int32_t i = 0; i < vocab; i++) out[i] = (long double)logits[i] - m - logl(sum);
}

/* ---- helpers --------------------------------------------------------------------------- */

static tp_sampler *make_sampler(int32_t vocab)
{
    tp_sampler *s = NULL;
    ck_assert_int_eq(tp_sampler_create(vocab, &s), TP_OK);
    ck_assert_ptr_nonnull(s);
    return s;
}

static tp_sampling_params params_t(double temperature)
{
    tp_sampling_params p;
    tp_sampling_params_default(&p);
    p.temperature = temperature;
    p.seed = tp_sampler_request_seed(1234, "check-sampler");
    return p;
}

static int32_t sample_full(tp_sampler *s, const tp_sampling_params *p, uint64_t step,
                           const float *logits, const int32_t *prompt, int32_t n_prompt,
                           const int32_t *output, int32_t n_output)
{
    tp_token_logprob top[20];
    tp_sample_result r = {.top = top};
    tp_error_clear();
    ck_assert_msg(tp_sampler_sample(s, p, step, logits, prompt, n_prompt, output, n_output, &r) ==
                      TP_OK,
                  "sample failed: %s", tp_error_message());
    return r.token;
}

static int32_t sample_one(tp_sampler *s, const tp_sampling_params *p, uint64_t step,
                          const float *logits)
{
    return sample_full(s, p, step, logits, NULL, 0, NULL, 0);
}

/* Step 0 with a cleared error message; the status, for tests of failures. */
static tp_status try_sample(tp_sampler *s, const tp_sampling_params *p, const float *logits,
                            const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                            int32_t n_output, tp_sample_result *r)
{
    tp_error_clear();
    return tp_sampler_sample(s, p, 0, logits, prompt, n_prompt, output, n_output, r);
}

/* Draw steps 0..n_steps-1, require each token to equal the reference's, and count them. */
static void run_vs_reference(const float *logits, int32_t vocab, const tp_sampling_params *p,
                             const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                             int32_t n_output, int n_steps, int32_t *counts, ref_dist *d)
{
    tp_sampler *s = make_sampler(vocab);
    ref_build(d, logits, vocab, p, prompt, n_prompt, output, n_output);
    if (counts) memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int k = 0; k < n_steps; k++) {
        int32_t t = sample_full(s, p, (uint64_t)k, logits, prompt, n_prompt, output, n_output);
        int32_t want = ref_draw(d, p->seed, (uint64_t)k);
        ck_assert_msg(t == want, "step %d: sampler chose %d, reference %d", k, (int)t, (int)want);
        if (counts) counts[t]++;
    }
    tp_sampler_destroy(s);
}

/* Pearson's statistic of the counts against the reference distribution; tokens outside the
 * survivors must never have been drawn. */
static double chi_square(const ref_dist *d, const int32_t *counts, int total)
{
    double chi = 0;
    long inside = 0;
    for (int32_t j = 0; j < d->n; j++) {
        double e = total * d->w[j] / d->z, o = counts[d->ids[j]];
        chi += (o - e) * (o - e) / e;
        inside += counts[d->ids[j]];
    }
    ck_assert_int_eq(inside, total);
    return chi;
}

/* Very loose (p < 1e-9 or so): the draws are deterministic, so this catches wrong
 * distributions, not bad luck. */
static double chi_bound(int dof)
{
    return dof + 10.0 * sqrt(2.0 * dof) + 10.0;
}

/* Check the set of drawn tokens is exactly `want` (n entries). */
static void expect_drawn_set(const int32_t *counts, int32_t vocab, const int32_t *want, int n)
{
    int in_want[64] = {0};
    for (int i = 0; i < n; i++) in_want[want[i]] = 1;
    for (int32_t t = 0; t < vocab; t++)
        ck_assert_msg((counts[t] > 0) == in_want[t], "token %d drawn %d times, expected %s",
                      (int)t, (int)counts[t], in_want[t] ? "some" : "none");
}

static void expect_ref_set(const ref_dist *d, const int32_t *want, int n)
{
    ck_assert_int_eq(d->n, n);
    for (int i = 0; i < n; i++) ck_assert_int_eq(d->ids[i], want[i]);
}

/* ---- stream ------------------------------------------------------------------------------ */

START_TEST(stream_is_pinned)
{
    /* Published test vectors validate the reference itself. */
    ck_assert_uint_eq(ref_mix(0), 0xe220a8397b1dcdafULL);    /* SplitMix64, seed 0, 1st output */
    ck_assert_uint_eq(ref_fnv1a("a"), 0xaf63dc4c8601ec8cULL); /* FNV-1a 64 of "a" */
    /* Frozen values (computed independently in Python): resume depends on them. */
    uint64_t seed = tp_sampler_request_seed(42, "request-1");
    ck_assert_uint_eq(seed, 0xaf691654e88ee317ULL);
    ck_assert_uint_eq(seed, ref_mix(ref_mix(42) ^ ref_fnv1a("request-1")));
    ck_assert_uint_eq(tp_sampler_request_seed(0, ""), 0x5b21f68ffa77f14cULL);
    ck_assert_uint_eq(tp_sampler_request_seed(0, NULL), 0x5b21f68ffa77f14cULL);
    ck_assert_uint_eq(tp_sampler_request_seed(UINT64_MAX, "custom-\xc3\xa9"),
                      0xfa6a84d04f606346ULL);
    ck_assert_uint_eq(ref_bits(seed, 0), 0x2cacd9dbd5f1ad5bULL);
    ck_assert_uint_eq(ref_bits(seed, 7), 0xcedc393a10b899c2ULL);
    ck_assert_double_eq(ref_unit(seed, 7), 0.8080478445778873);
    ck_assert_uint_ne(tp_sampler_request_seed(42, "request-2"), seed);
    ck_assert_uint_ne(tp_sampler_request_seed(43, "request-1"), seed);

    /* The tokens themselves: hash, unit mapping and rank-order inverse CDF together. */
    static const float logits[8] = {1.0f, 0.5f, 0.25f, 0.0f, -0.5f, -1.0f, -2.0f, 0.75f};
    static const int32_t golden[24] = {0, 7, 0, 0, 1, 0, 4, 2, 0, 7, 4, 3,
                                       7, 7, 0, 7, 2, 7, 2, 0, 5, 3, 0, 7};
    tp_sampling_params p = params_t(0.8);
    p.seed = seed;
    tp_sampler *s = make_sampler(8);
    for (int k = 0; k < 24; k++)
        ck_assert_int_eq(sample_one(s, &p, (uint64_t)k, logits), golden[k]);
    tp_sampler_destroy(s);
}
END_TEST

START_TEST(stream_is_reproducible_and_independent)
{
    float logits[8] = {0};
    tp_sampling_params p = params_t(1.0);
    tp_sampler *a = make_sampler(8), *b = make_sampler(8);
    float other[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    tp_sampling_params q = params_t(0.7);
    q.seed = tp_sampler_request_seed(1234, "another-request");
    /* Same (seed, step) -> same token, whatever ran before on the sampler and in what order. */
    int32_t first[64];
    for (int k = 0; k < 64; k++) first[k] = sample_one(a, &p, (uint64_t)k, logits);
    for (int k = 63; k >= 0; k--) {
        (void)sample_one(b, &q, (uint64_t)(k * 7), other);
        ck_assert_int_eq(sample_one(b, &p, (uint64_t)k, logits), first[k]);
    }
    /* Another request id -> another sequence. */
    int same = 0;
    for (int k = 0; k < 64; k++) same += sample_one(a, &q, (uint64_t)k, logits) == first[k];
    ck_assert_int_lt(same, 32);

    /* Uniform over 8: marginal and consecutive-pair frequencies (independence of steps). */
    enum { N = 16000 };
    static int32_t tok[N];
    int32_t marg[8] = {0}, pairs[64] = {0};
    for (int k = 0; k < N; k++) {
        tok[k] = sample_one(a, &p, (uint64_t)k, logits);
        marg[tok[k]]++;
        if (k) pairs[tok[k - 1] * 8 + tok[k]]++;
    }
    double chi = 0, chi2 = 0;
    for (int i = 0; i < 8; i++) chi += (marg[i] - N / 8.0) * (marg[i] - N / 8.0) / (N / 8.0);
    double e2 = (N - 1) / 64.0;
    for (int i = 0; i < 64; i++) chi2 += (pairs[i] - e2) * (pairs[i] - e2) / e2;
    ck_assert_msg(chi < chi_bound(7), "marginal chi-square %g", chi);
    ck_assert_msg(chi2 < chi_bound(63), "pair chi-square %g", chi2);
    tp_sampler_destroy(a);
    tp_sampler_destroy(b);
}
END_TEST

/* ---- parameters ------------------------------------------------------------------------- */

static void expect_invalid(const tp_sampling_params *p, const char *text)
{
    tp_error_clear();
    ck_assert_int_eq(tp_sampling_params_validate(p), TP_ERR_INVALID_ARG);
    ck_assert_msg(strstr(tp_error_message(), text) != NULL, "message \"%s\" lacks \"%s\"",
                  tp_error_message(), text);
}

static void expect_valid(const tp_sampling_params *p)
{
    tp_error_clear();
    ck_assert_msg(tp_sampling_params_validate(p) == TP_OK, "rejected: %s", tp_error_message());
}

#define BAD(assign, text)                    \
    do {                                     \
        tp_sampling_params_default(&p);      \
        assign;                              \
        expect_invalid(&p, text);            \
    } while (0)
#define GOOD(assign)                         \
    do {                                     \
        tp_sampling_params_default(&p);      \
        assign;                              \
        expect_valid(&p);                    \
    } while (0)

START_TEST(params_default)
{
    tp_sampling_params p;
    memset(&p, 0x5a, sizeof p);
    tp_sampling_params_default(&p);
    ck_assert_double_eq(p.temperature, 0.0);
    ck_assert_int_le(p.top_k, 0);
    ck_assert_double_eq(p.top_p, 1.0);
    ck_assert_double_eq(p.min_p, 0.0);
    ck_assert_double_eq(p.repetition_penalty, 1.0);
    ck_assert_double_eq(p.presence_penalty, 0.0);
    ck_assert_double_eq(p.frequency_penalty, 0.0);
    ck_assert_int_eq(p.logprobs, 0);
    expect_valid(&p);
    tp_error_clear();
    ck_assert_int_eq(tp_sampling_params_validate(NULL), TP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(params_reject_each_field)
{
    tp_sampling_params p;
    BAD(p.temperature = -1, "temperature -1 is outside [0, inf)");
    BAD(p.temperature = -1e-300, "temperature -1e-300 is outside [0, inf)");
    BAD(p.temperature = NAN, "temperature nan is outside [0, inf)");
    BAD(p.temperature = INFINITY, "temperature inf is outside [0, inf)");
    BAD(p.temperature = -INFINITY, "temperature -inf is outside");
    BAD(p.top_k = -2, "top_k -2 is outside [-1, 2147483647]");
    BAD(p.top_k = INT32_MIN, "top_k -2147483648 is outside [-1, 2147483647]");
    BAD(p.top_p = 0, "top_p 0 is outside (0, 1]");
    BAD(p.top_p = -0.5, "top_p -0.5 is outside (0, 1]");
    BAD(p.top_p = 1.5, "top_p 1.5 is outside (0, 1]");
    BAD(p.top_p = nextafter(1.0, 2.0), "top_p 1.0000000000000002 is outside (0, 1]");
    BAD(p.top_p = 1e308, "top_p 1e+308 is outside (0, 1]");
    BAD(p.top_p = NAN, "top_p nan is outside (0, 1]");
    BAD(p.min_p = -0.01, "min_p -0.01 is outside [0, 1]");
    BAD(p.min_p = 1.5, "min_p 1.5 is outside [0, 1]");
    BAD(p.min_p = NAN, "min_p nan is outside [0, 1]");
    BAD(p.min_p = INFINITY, "min_p inf is outside [0, 1]");
    BAD(p.repetition_penalty = 0, "repetition_penalty 0 is outside (0, inf)");
    BAD(p.repetition_penalty = -1, "repetition_penalty -1 is outside (0, inf)");
    BAD(p.repetition_penalty = NAN, "repetition_penalty nan is outside (0, inf)");
    BAD(p.repetition_penalty = INFINITY, "repetition_penalty inf is outside (0, inf)");
    BAD(p.presence_penalty = 2.5, "presence_penalty 2.5 is outside [-2, 2]");
    BAD(p.presence_penalty = -2.0000001, "presence_penalty -2.0000001 is outside [-2, 2]");
    BAD(p.presence_penalty = 1e308, "presence_penalty 1e+308 is outside [-2, 2]");
    BAD(p.presence_penalty = -INFINITY, "presence_penalty -inf is outside [-2, 2]");
    BAD(p.presence_penalty = NAN, "presence_penalty nan is outside [-2, 2]");
    BAD(p.frequency_penalty = 3, "frequency_penalty 3 is outside [-2, 2]");
    BAD(p.frequency_penalty = -1e9, "frequency_penalty -1e+09 is outside [-2, 2]");
    BAD(p.frequency_penalty = INFINITY, "frequency_penalty inf is outside [-2, 2]");
    BAD(p.frequency_penalty = NAN, "frequency_penalty nan is outside [-2, 2]");
    BAD(p.logprobs = -1, "logprobs -1 is outside [0, 20]");
    BAD(p.logprobs = 21, "logprobs 21 is outside [0, 20]");
    BAD(p.logprobs = INT32_MAX, "logprobs 2147483647 is outside [0, 20]");
    BAD(p.logprobs = INT32_MIN, "logprobs -2147483648 is outside [0, 20]");

    GOOD(p.temperature = 1e300);
    GOOD(p.temperature = 1e-300);
    GOOD(p.top_k = -1);
    GOOD(p.top_k = 1);
    GOOD(p.top_k = INT32_MAX);
    GOOD(p.top_p = 1e-300);
    GOOD(p.min_p = 1);
    GOOD(p.repetition_penalty = 1e-300);
    GOOD(p.repetition_penalty = DBL_MAX);
    GOOD(p.presence_penalty = -2; p.frequency_penalty = 2);
    GOOD(p.logprobs = 20; p.seed = UINT64_MAX);
}
END_TEST

START_TEST(sample_rejects_bad_input)
{
    tp_sampler *s = NULL;
    tp_error_clear();
    ck_assert_int_eq(tp_sampler_create(0, &s), TP_ERR_INVALID_ARG);
    ck_assert_ptr_null(s);
    tp_error_clear();
    ck_assert_int_eq(tp_sampler_create(-7, &s), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "-7"));
    tp_sampler_destroy(NULL);

    s = make_sampler(4);
    const float logits[4] = {0, 1, 2, 3};
    tp_token_logprob top[21];
    for (int i = 0; i < 21; i++) top[i].id = -99;
    tp_sample_result r = {.top = top};
    tp_sampling_params p = params_t(1.0);

    p.logprobs = 21; /* one past the limit must not write past the caller's 20 */
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, NULL, 0, &r), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "logprobs 21"));
    for (int i = 0; i < 21; i++) ck_assert_int_eq(top[i].id, -99);

    p.logprobs = 2;
    r.top = NULL;
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, NULL, 0, &r), TP_ERR_INVALID_ARG);
    r.top = top;

    p.repetition_penalty = 1.2;
    const int32_t prompt[2] = {1, 4}, output[2] = {0, -1};
    ck_assert_int_eq(try_sample(s, &p, logits, prompt, 2, NULL, 0, &r), TP_ERR_INVALID_ARG);
    ck_assert_str_eq(tp_error_message(),
                     "prompt token 4 at position 1 is outside the vocabulary [0, 4)");
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, output, 2, &r), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "output token -1 at position 1"));
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, output, -3, &r), TP_ERR_INVALID_ARG);
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 5, NULL, 0, &r), TP_ERR_INVALID_ARG);
    ck_assert_int_eq(try_sample(s, &p, NULL, NULL, 0, NULL, 0, &r), TP_ERR_INVALID_ARG);
    p.top_p = 2;
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, NULL, 0, &r), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "top_p 2 is outside (0, 1]"));
    tp_sampler_destroy(s);
}
END_TEST

/* ---- greedy and temperature ------------------------------------------------------------- */

START_TEST(greedy_argmax_and_ties)
{
    const float logits[5] = {1.0f, 5.0f, 5.0f, 2.0f, -INFINITY};
    tp_sampler *s = make_sampler(5);
    tp_sampling_params g = params_t(0.0);
    tp_sampling_params tiny = params_t(9e-6); /* below vLLM's 1e-5: greedy too */
    tp_sampling_params k1 = params_t(1.5);
    k1.top_k = 1;
    k1.top_p = 0.3;
    for (uint64_t k = 0; k < 50; k++) {
        g.seed = k * 977;
        ck_assert_int_eq(sample_one(s, &g, k, logits), 1);
        ck_assert_int_eq(sample_one(s, &tiny, k, logits), 1);
        ck_assert_int_eq(sample_one(s, &k1, k, logits), 1);
    }
    tp_sampler_destroy(s);

    /* A larger vocabulary against the reference, with penalties on. */
    enum { V = 1000 };
    static float big[V];
    for (int i = 0; i < V; i++) big[i] = (float)(sin(i * 0.731) * 4.0 + cos(i * 0.117));
    big[321] = big[654] = 6.0f;
    const int32_t prompt[3] = {321, 5, 5}, output[2] = {7, 321};
    tp_sampling_params pens = g;
    ref_dist d;
    run_vs_reference(big, V, &g, NULL, 0, NULL, 0, 3, NULL, &d);
    ck_assert_int_eq(d.ids[0], 321);
    ref_free(&d);
    pens.repetition_penalty = 1.5;
    run_vs_reference(big, V, &pens, prompt, 3, output, 2, 3, NULL, &d);
    ck_assert_int_eq(d.ids[0], 654);
    ref_free(&d);
}
END_TEST

START_TEST(temperature_distribution)
{
    const float logits[5] = {2.0f, 1.0f, 0.0f, -1.0f, -3.0f};
    const double temps[4] = {0.25, 1.0, 3.0, 1e300};
    enum { N = 20000 };
    int32_t counts[5];
    for (int ti = 0; ti < 4; ti++) {
        tp_sampling_params p = params_t(temps[ti]);
        ref_dist d;
        run_vs_reference(logits, 5, &p, NULL, 0, NULL, 0, N, counts, &d);
        /* The reference draws from softmax(logits / T). */
        double z = 0;
        for (int i = 0; i < 5; i++) z += exp(logits[i] / temps[ti]);
        ck_assert_int_eq(d.n, 5);
        for (int j = 0; j < d.n; j++)
            ck_assert_double_eq_tol(d.w[j] / d.z, exp(logits[d.ids[j]] / temps[ti]) / z, 1e-12);
        double chi = chi_square(&d, counts, N);
        ck_assert_msg(chi < chi_bound(4), "T=%g chi-square %g", temps[ti], chi);
        if (ti == 0) ck_assert_int_gt(counts[0], N * 9 / 10); /* p0 = 0.98 */
        if (ti == 3)
            for (int i = 0; i < 5; i++) ck_assert_int_gt(counts[i], N / 6); /* uniform */
        ref_free(&d);
    }
}
END_TEST

START_TEST(temperature_decides_survivors)
{
    /* min_p 0.01: w1 = exp(-0.5 / T); T = 0.1 gives 0.0067 (dropped), T = 1 gives 0.61. */
    const float logits[2] = {1.0f, 0.5f};
    tp_sampler *s = make_sampler(2);
    tp_sampling_params cold = params_t(0.1), warm = params_t(1.0);
    cold.min_p = warm.min_p = 0.01;
    int warm_ones = 0;
    for (uint64_t k = 0; k < 400; k++) {
        ck_assert_int_eq(sample_one(s, &cold, k, logits), 0);
        warm_ones += sample_one(s, &warm, k, logits);
    }
    ck_assert_int_gt(warm_ones, 100);
    tp_sampler_destroy(s);
}
END_TEST

/* ---- filters ---------------------------------------------------------------------------- */

START_TEST(top_k_survivors)
{
    enum { N = 4000 };
    int32_t counts[8];
    ref_dist d;
    const float distinct[8] = {0.5f, 3.0f, 1.0f, 2.5f, -1.0f, 2.0f, 0.0f, 1.5f};
    tp_sampling_params p = params_t(1.0);
    p.top_k = 3;
    const int32_t want3[3] = {1, 3, 5};
    run_vs_reference(distinct, 8, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want3, 3);
    expect_drawn_set(counts, 8, want3, 3);
    ck_assert_double_lt(chi_square(&d, counts, N), chi_bound(2));
    ref_free(&d);

    /* Ties at the boundary: rank by (logit desc, id asc) and keep exactly k. */
    const float ties[5] = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
    p.top_k = 2;
    const int32_t want2[2] = {1, 2};
    run_vs_reference(ties, 5, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want2, 2);
    expect_drawn_set(counts, 5, want2, 2);
    ref_free(&d);
    p.top_k = 4;
    const int32_t want4[4] = {1, 2, 3, 0};
    run_vs_reference(ties, 5, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want4, 4);
    expect_drawn_set(counts, 5, want4, 4);
    ref_free(&d);

    /* Off: -1, 0 and k >= vocab keep everything. */
    const int32_t all[8] = {1, 3, 5, 7, 2, 0, 6, 4};
    const int32_t offs[3] = {-1, 0, 8};
    for (int i = 0; i < 3; i++) {
        p.top_k = offs[i];
        run_vs_reference(distinct, 8, &p, NULL, 0, NULL, 0, N, counts, &d);
        expect_ref_set(&d, all, 8);
        expect_drawn_set(counts, 8, all, 8);
        ref_free(&d);
    }
}
END_TEST

START_TEST(top_p_boundary)
{
    enum { N = 2000 };
    int32_t counts[8];
    ref_dist d;
    /* Four equal logits: each 1/4 exactly, so cumulative masses hit 0.25, 0.5, 0.75 exactly.
     * The -inf tokens carry no mass and must never appear. */
    const float flat[6] = {0.0f, -INFINITY, 0.0f, 0.0f, -INFINITY, 0.0f};
    const struct {
        double top_p;
        int n;
        int32_t ids[4];
    } cases[] = {
        {0.5, 2, {0, 2}},                     /* mass exactly 0.5 reaches 0.5: stop at 2 */
        {0x1.0000000000001p-1, 3, {0, 2, 3}}, /* just above 0.5 needs a third */
        {0.25, 1, {0}},
        {1e-9, 1, {0}}, /* at least one token */
        {0.75, 3, {0, 2, 3}},
        {0.76, 4, {0, 2, 3, 5}},
        {1.0, 4, {0, 2, 3, 5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tp_sampling_params p = params_t(0.9);
        p.top_p = cases[c].top_p;
        run_vs_reference(flat, 6, &p, NULL, 0, NULL, 0, N, counts, &d);
        expect_ref_set(&d, cases[c].ids, cases[c].n);
        expect_drawn_set(counts, 6, cases[c].ids, cases[c].n);
        ref_free(&d);
    }
    /* Unequal: 0.9 of exp(-i) over 6 tokens needs the first three (0.665, 0.910). */
    const float decay[6] = {0, -1, -2, -3, -4, -5};
    tp_sampling_params p = params_t(1.0);
    p.top_p = 0.9;
    const int32_t want[3] = {0, 1, 2};
    run_vs_reference(decay, 6, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want, 3);
    expect_drawn_set(counts, 6, want, 3);
    ck_assert_double_lt(chi_square(&d, counts, N), chi_bound(2));
    ref_free(&d);
}
END_TEST

START_TEST(min_p_rule)
{
    enum { N = 3000 };
    int32_t counts[6];
    ref_dist d;
    /* p_i / p_max = exp(-i); min_p = exp(-1.5) keeps tokens 0 and 1. */
    const float decay[4] = {0, -1, -2, -3};
    tp_sampling_params p = params_t(1.0);
    p.min_p = exp(-1.5);
    const int32_t want2[2] = {0, 1};
    run_vs_reference(decay, 4, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want2, 2);
    expect_drawn_set(counts, 4, want2, 2);
    ck_assert_double_lt(chi_square(&d, counts, N), chi_bound(1));
    ref_free(&d);
    /* min_p = 1 keeps exactly the tokens tied with the maximum (prob == min_p * max is kept). */
    const float ties[4] = {1.0f, 3.0f, 3.0f, 0.0f};
    p.min_p = 1.0;
    const int32_t want_ties[2] = {1, 2};
    run_vs_reference(ties, 4, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, want_ties, 2);
    expect_drawn_set(counts, 4, want_ties, 2);
    ref_free(&d);
    /* min_p = 0 is off. */
    p.min_p = 0.0;
    const int32_t all[4] = {1, 2, 0, 3};
    run_vs_reference(ties, 4, &p, NULL, 0, NULL, 0, N, counts, &d);
    expect_ref_set(&d, all, 4);
    ref_free(&d);
}
END_TEST

START_TEST(filters_combined)
{
    /* Penalized ranking (see the comment of each step, computed independently):
     * 7: 3/1.3 = 2.308; 0: 2.0; 1: 1.8; 2: 1.7; 6: 1.1; 8: 1.0; 9: 0.9;
     * 11: 2.2/1.3 - 2*0.3 - 0.2 = 0.892; 4: 1.75/1.3 - 0.3 - 0.2 = 0.846; 3: 0.308; ...
     * top-k 6 -> {7,0,1,2,6,8}; top-p 0.8 of those (T 0.8) -> {7,0,1,2} (0.32 0.22 0.17 0.15);
     * min-p 0.5 drops 2 (w = 0.468) -> {7,0,1}. */
    const float logits[12] = {2.0f, 1.8f, 1.7f, 0.4f, 1.75f, -0.2f, 1.1f, 3.0f, 1.0f, 0.9f, -1.5f,
                              2.2f};
    const int32_t prompt[2] = {7, 3}, output[3] = {11, 11, 4};
    tp_sampling_params p = params_t(0.8);
    p.top_k = 6;
    p.top_p = 0.8;
    p.min_p = 0.5;
    p.repetition_penalty = 1.3;
    p.frequency_penalty = 0.3;
    p.presence_penalty = 0.2;
    enum { N = 6000 };
    int32_t counts[12];
    ref_dist d;
    const int32_t want[3] = {7, 0, 1};
    run_vs_reference(logits, 12, &p, prompt, 2, output, 3, N, counts, &d);
    expect_ref_set(&d, want, 3);
    expect_drawn_set(counts, 12, want, 3);
    ck_assert_double_lt(chi_square(&d, counts, N), chi_bound(2));
    ref_free(&d);
}
END_TEST

START_TEST(top_p_applies_before_min_p)
{
    /* Weights 1, 0.8, 0.05, 0.05. HF order (top-p over all four, then min-p): mass of token 0
     * is 1/1.9 = 0.526 < 0.55, so top-p keeps {0, 1}; min-p 0.1 then drops nothing more.
     * vLLM V1 applies min-p first (mass 1/1.8 = 0.556 >= 0.55 would keep only {0}). */
    const float logits[4] = {0.0f, logf(0.8f), logf(0.05f), logf(0.05f)};
    tp_sampling_params p = params_t(1.0);
    p.top_p = 0.55;
    p.min_p = 0.1;
    int32_t counts[4];
    ref_dist d;
    const int32_t want[2] = {0, 1};
    run_vs_reference(logits, 4, &p, NULL, 0, NULL, 0, 2000, counts, &d);
    expect_ref_set(&d, want, 2);
    expect_drawn_set(counts, 4, want, 2);
    ref_free(&d);
}
END_TEST

/* ---- penalties (greedy, so each outcome is exact) ---------------------------------------- */

static int32_t greedy_pen(const float *logits, int32_t vocab, double rep, double freq, double pres,
                          const int32_t *prompt, int32_t n_prompt, const int32_t *output,
                          int32_t n_output)
{
    tp_sampler *s = make_sampler(vocab);
    tp_sampling_params p = params_t(0.0);
    p.repetition_penalty = rep;
    p.frequency_penalty = freq;
    p.presence_penalty = pres;
    int32_t t = sample_full(s, &p, 0, logits, prompt, n_prompt, output, n_output);
    tp_sampler_destroy(s);
    ref_dist d;
    ref_build(&d, logits, vocab, &p, prompt, n_prompt, output, n_output);
    ck_assert_int_eq(d.ids[0], t);
    ref_free(&d);
    return t;
}

START_TEST(repetition_penalty_rule)
{
    const int32_t zero[1] = {0}, zeros3[3] = {0, 0, 0};
    /* Positive logits are divided: 2.0 / 2 = 1.0 < 1.5. */
    const float pos[3] = {2.0f, 1.5f, 0.1f};
    ck_assert_int_eq(greedy_pen(pos, 3, 1.0, 0, 0, zero, 1, NULL, 0), 0);
    ck_assert_int_eq(greedy_pen(pos, 3, 2.0, 0, 0, zero, 1, NULL, 0), 1);
    ck_assert_int_eq(greedy_pen(pos, 3, 2.0, 0, 0, NULL, 0, zero, 1), 1); /* output counts too */
    /* Negative logits are multiplied: -1 * 2 = -2 < -1.5. */
    const float neg[3] = {-1.0f, -1.5f, -3.0f};
    ck_assert_int_eq(greedy_pen(neg, 3, 2.0, 0, 0, NULL, 0, zero, 1), 1);
    /* Once per distinct token: 4 / 2 = 2.0 > 1.9 (three times would be 0.5). */
    const float once[2] = {4.0f, 1.9f};
    ck_assert_int_eq(greedy_pen(once, 2, 2.0, 0, 0, zeros3, 3, zero, 1), 0);
    /* A penalty below 1 encourages: 1.0 / 0.5 = 2 > 1.5; -1.0 * 0.5 = -0.5 > -0.6. */
    const float enc[2] = {1.0f, 1.5f}, encneg[2] = {-1.0f, -0.6f};
    ck_assert_int_eq(greedy_pen(enc, 2, 0.5, 0, 0, zero, 1, NULL, 0), 0);
    ck_assert_int_eq(greedy_pen(encneg, 2, 0.5, 0, 0, zero, 1, NULL, 0), 0);
    /* Unseen tokens are untouched; zero stays zero. */
    const float zl[2] = {0.0f, -0.1f};
    ck_assert_int_eq(greedy_pen(zl, 2, 5.0, 0, 0, zero, 1, NULL, 0), 0);
    /* A huge penalty overflows -1 * DBL_MAX vs -2 * DBL_MAX: both stay finite, never below
     * the -inf token 2, which must not win. */
    const float huge[3] = {-1.0f, -2.0f, -INFINITY};
    const int32_t both[2] = {0, 1};
    tp_sampler *s = make_sampler(3);
    tp_sampling_params p = params_t(0.0);
    p.repetition_penalty = DBL_MAX;
    ck_assert_int_eq(sample_full(s, &p, 0, huge, both, 2, NULL, 0), 0);
    /* Even when every live logit overflows, the -inf token 0 must not win the tie. */
    const float first_dead[3] = {-INFINITY, -2.0f, -INFINITY};
    const int32_t one[1] = {1};
    ck_assert_int_eq(sample_full(s, &p, 0, first_dead, one, 1, NULL, 0), 1);
    p.temperature = 1.0;
    ck_assert_int_eq(sample_full(s, &p, 0, first_dead, one, 1, NULL, 0), 1);
    for (uint64_t k = 0; k < 200; k++)
        ck_assert_int_ne(sample_full(s, &p, k, huge, both, 2, NULL, 0), 2);
    tp_sampler_destroy(s);
}
END_TEST

START_TEST(frequency_and_presence_rules)
{
    const int32_t zero[1] = {0}, zeros2[2] = {0, 0}, zeros3[3] = {0, 0, 0},
                  zeros5[5] = {0, 0, 0, 0, 0};
    /* Frequency: count * f over the output. 3 - 2 * 0.6 = 1.8 < 2; 3 - 0.6 = 2.4 > 2. */
    const float f[2] = {3.0f, 2.0f};
    ck_assert_int_eq(greedy_pen(f, 2, 1.0, 0.6, 0, NULL, 0, zeros2, 2), 1);
    ck_assert_int_eq(greedy_pen(f, 2, 1.0, 0.6, 0, NULL, 0, zero, 1), 0);
    ck_assert_int_eq(greedy_pen(f, 2, 1.0, 0.6, 0, zeros5, 5, NULL, 0), 0); /* prompt: no */
    /* Negative frequency encourages: 1 + 3 * 0.5 = 2.5 > 2. */
    const float fneg[2] = {1.0f, 2.0f};
    ck_assert_int_eq(greedy_pen(fneg, 2, 1.0, -0.5, 0, NULL, 0, zeros3, 3), 0);
    /* Presence: once, whatever the count. 3 - 0.6 = 2.4 < 2.5; 3 - 0.4 = 2.6 > 2.5. */
    const float pr[2] = {3.0f, 2.5f};
    ck_assert_int_eq(greedy_pen(pr, 2, 1.0, 0, 0.6, NULL, 0, zeros5, 5), 1);
    ck_assert_int_eq(greedy_pen(pr, 2, 1.0, 0, 0.4, NULL, 0, zeros5, 5), 0);
    ck_assert_int_eq(greedy_pen(pr, 2, 1.0, 0, 2.0, zeros5, 5, NULL, 0), 0); /* prompt: no */
    /* Order: repetition before frequency. 2 / 2 - 0.2 = 0.8 < 0.9 (the other order gives
     * (2 - 0.2) / 2 = 0.9, a tie won by token 0). */
    const float ord[2] = {2.0f, 0.9f};
    ck_assert_int_eq(greedy_pen(ord, 2, 2.0, 0.2, 0, NULL, 0, zero, 1), 1);
    /* -inf stays -inf even when encouraged. */
    const float dead[2] = {-INFINITY, -5.0f};
    ck_assert_int_eq(greedy_pen(dead, 2, 0.5, -2, -2, zeros5, 5, zeros5, 5), 1);
}
END_TEST

START_TEST(penalties_shape_the_sampled_distribution)
{
    const float logits[6] = {1.0f, 0.8f, 0.6f, 0.4f, 0.2f, 0.0f};
    const int32_t prompt[3] = {1, 1, 2}, output[5] = {0, 0, 0, 3, 5};
    tp_sampling_params p = params_t(0.7);
    p.repetition_penalty = 1.4;
    p.frequency_penalty = 0.25;
    p.presence_penalty = -0.3;
    enum { N = 12000 };
    int32_t counts[6];
    ref_dist d;
    run_vs_reference(logits, 6, &p, prompt, 3, output, 5, N, counts, &d);
    ck_assert_int_eq(d.n, 6);
    ck_assert_double_lt(chi_square(&d, counts, N), chi_bound(5));
    ref_free(&d);
}
END_TEST

/* ---- logprobs ----------------------------------------------------------------------------- */

START_TEST(logprobs_are_raw_log_softmax)
{
    enum { V = 3000 };
    static float logits[V];
    static long double ref[V];
    /* Logprobs stay within [-16, 0], where a float holds them to better than 5e-7. */
    for (int i = 0; i < V; i++) logits[i] = (float)(1.5 * sin(i * 0.37) + 0.2 * (i % 7) - 40.0);
    logits[100] = logits[200] = logits[300] = -34.0f; /* ties at the top: ids ascending */
    logits[2999] = -34.5f;
    logits[5] = -INFINITY;
    ref_log_softmax(logits, V, ref);
    /* Reference top-N order: raw logit desc, id asc. */
    ranked *r = malloc(V * sizeof *r);
    for (int i = 0; i < V; i++) r[i] = (ranked){logits[i], i};
    qsort(r, V, sizeof *r, cmp_ranked);

    tp_sampler *s = make_sampler(V);
    tp_token_logprob top[20];
    tp_sample_result res = {.top = top};
    tp_sampling_params ps[5] = {params_t(0.0), params_t(0.3), params_t(1.0), params_t(1.0),
                                params_t(1.0)};
    ps[1].repetition_penalty = 1.5; /* penalties and temperature must not touch logprobs */
    ps[1].top_k = 40;
    ps[2].frequency_penalty = 2.0;
    ps[3].top_p = 0.9; /* temperature 1, no penalty: the weights double as the normalizer */
    ps[4].min_p = 0.2;
    const int32_t prompt[3] = {100, 200, 7}, output[2] = {300, 300};
    for (int c = 0; c < 5; c++) {
        for (int n = 0; n <= 20; n += 5) {
            ps[c].logprobs = n;
            for (uint64_t k = 0; k < 8; k++) {
                ck_assert_int_eq(
                    tp_sampler_sample(s, &ps[c], k, logits, prompt, 3, output, 2, &res), TP_OK);
                ck_assert_double_eq_tol(res.logprob, (double)ref[res.token], 1e-6);
                ck_assert_int_eq(res.n_top, n);
                for (int j = 0; j < n; j++) {
                    ck_assert_int_eq(top[j].id, r[j].id);
                    ck_assert_double_eq_tol(top[j].logprob, (double)ref[r[j].id], 1e-6);
                }
                /* the chosen token's logprob not wanted: 0, the same token and top entries */
                const int32_t token = res.token;
                tp_sampling_params off = ps[c];
                off.logprob_off = 1;
                ck_assert_int_eq(tp_sampler_sample(s, &off, k, logits, prompt, 3, output, 2, &res), TP_OK);
                ck_assert_int_eq(res.token, token);
                ck_assert(res.logprob == 0.0f);
                ck_assert_int_eq(res.n_top, n);
                for (int j = 0; j < n; j++) {
                    ck_assert_int_eq(top[j].id, r[j].id);
                    ck_assert_double_eq_tol(top[j].logprob, (double)ref[r[j].id], 1e-6);
                }
            }
        }
    }
    ck_assert_int_eq(top[0].id, 100);
    ck_assert_int_eq(top[1].id, 200);
    ck_assert_int_eq(top[2].id, 300);
    ck_assert_int_eq(top[3].id, 2999);
    free(r);
    tp_sampler_destroy(s);
}
END_TEST

/* min_tokens' end tokens are banned: never drawn, yet the logprobs are the raw distribution's
 * (vLLM computes raw logprobs before its min-tokens processor); a banned NaN/+Inf is no
 * error and counts as -inf; an unbanned one still is. */
START_TEST(banned_ids_stay_in_raw_logprobs)
{
    enum { V = 6 };
    const float logits[V] = {3.0f, 1.0f, 0.5f, NAN, -1.0f, INFINITY};
    const int32_t banned[3] = {0, 3, 5};
    /* raw log-softmax over the finite columns 0, 1, 2, 4 (the banned NaN and +Inf as -inf) */
    const double lse = log(exp(3.0) + exp(1.0) + exp(0.5) + exp(-1.0));
    tp_sampler *s = make_sampler(V);
    tp_token_logprob top[3];
    tp_sample_result res = {.top = top};
    tp_sampling_params ps[3] = {params_t(0.0), params_t(1.0), params_t(0.7)};
    ps[2].top_p = 0.9;
    ps[2].repetition_penalty = 1.2;
    const int32_t prompt[2] = {1, 2};
    const tp_logit_edits edits = {.banned = banned, .n_banned = 3};
    int drawn[V] = {0};
    for (int c = 0; c < 3; c++) {
        ps[c].logprobs = 3;
        for (uint64_t k = 0; k < 300; k++) {
            ck_assert_int_eq(tp_sampler_sample_edited(s, &ps[c], k, logits, &edits, prompt, 2, NULL, 0, &res), TP_OK);
            ck_assert_msg(res.token == 1 || res.token == 2 || res.token == 4, "drew banned or dead id %d", res.token);
            drawn[res.token]++;
            ck_assert_double_eq_tol(res.logprob, (double)logits[res.token] - lse, 1e-6);
            ck_assert_int_eq(res.n_top, 3);
            ck_assert_int_eq(top[0].id, 0); /* the banned EOS leads the raw distribution */
            ck_assert_double_eq_tol(top[0].logprob, 3.0 - lse, 1e-6);
            ck_assert_int_eq(top[1].id, 1);
            ck_assert_int_eq(top[2].id, 2);
        }
    }
    ck_assert_int_eq(drawn[1] + drawn[2] + drawn[4], 900);
    ck_assert_int_gt(drawn[2], 0); /* sampled, not only greedy */
    /* an unbanned NaN is still refused */
    ck_assert_int_eq(tp_sampler_sample_edited(s, &ps[1], 0, logits, &(tp_logit_edits){.banned = banned, .n_banned = 1}, NULL, 0, NULL, 0, &res),
                     TP_ERR_NUMERIC);
    tp_error_clear();
    /* a banned id outside the vocabulary is refused */
    const int32_t outside[1] = {V};
    ck_assert_int_eq(tp_sampler_sample_edited(s, &ps[1], 0, logits, &(tp_logit_edits){.banned = outside, .n_banned = 1}, NULL, 0, NULL, 0, &res),
                     TP_ERR_INVALID_ARG);
    tp_error_clear();
    tp_sampler_destroy(s);
}
END_TEST

/* logit_bias: added to the raw logits before the penalties (vLLM's order), steering greedy
 * and sampled draws alike, while the logprobs stay the raw distribution's. */
START_TEST(logit_bias_rule)
{
    enum { V = 5 };
    const float logits[V] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
    double lse = 0.0;
    for (int i = 0; i < V; i++) lse += exp((double)logits[i]);
    lse = log(lse);
    tp_sampler *s = make_sampler(V);
    tp_token_logprob top[2];
    tp_sample_result res = {.top = top};
    tp_sampling_params g = params_t(0.0);
    g.logprobs = 2;
    const int32_t up_ids[1] = {3}, down_ids[1] = {0};
    const float up[1] = {2.5f}, down[1] = {-1.5f};
    const tp_logit_edits lift = {.bias_ids = up_ids, .bias = up, .n_bias = 1};
    const tp_logit_edits sink = {.bias_ids = down_ids, .bias = down, .n_bias = 1};
    ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &lift, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 3); /* 0 + 2.5 > 2 */
    ck_assert_double_eq_tol(res.logprob, 0.0 - lse, 1e-6); /* raw */
    ck_assert_int_eq(top[0].id, 0);
    ck_assert_int_eq(top[1].id, 1);
    ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &sink, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 1); /* 2 - 1.5 < 1 */
    ck_assert_double_eq_tol(res.logprob, 1.0 - lse, 1e-6);
    /* nothing left over: the same sampler without edits is back to the plain argmax */
    ck_assert_int_eq(tp_sampler_sample(s, &g, 0, logits, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 0);

    /* the bias comes before the repetition penalty: (2 + 1) / 1.5 = 2 < 2.1 picks token 1,
     * where penalizing first would give 2 / 1.5 + 1 = 2.33 and token 0 */
    const float pair[2] = {2.0f, 2.1f};
    tp_sampler *s2 = make_sampler(2);
    tp_sampling_params rp = params_t(0.0);
    rp.repetition_penalty = 1.5;
    const int32_t zero[1] = {0};
    const float one[1] = {1.0f};
    const tp_logit_edits b0 = {.bias_ids = zero, .bias = one, .n_bias = 1};
    ck_assert_int_eq(tp_sampler_sample_edited(s2, &rp, 0, pair, &b0, zero, 1, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 1);
    rp.repetition_penalty = 1.0; /* without the penalty the bias wins: 3 > 2.1 */
    ck_assert_int_eq(tp_sampler_sample_edited(s2, &rp, 0, pair, &b0, zero, 1, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 0);
    tp_sampler_destroy(s2);

    /* sampled at temperature 1: the draws follow softmax(logits + bias) */
    tp_sampling_params t1 = params_t(1.0);
    const int32_t ids2[2] = {1, 4};
    const float b2[2] = {1.0f, 3.0f};
    const tp_logit_edits two = {.bias_ids = ids2, .bias = b2, .n_bias = 2};
    const double biased[V] = {2.0, 2.0, 0.5, 0.0, 2.0};
    double z = 0.0;
    for (int i = 0; i < V; i++) z += exp(biased[i]);
    int count[V] = {0};
    enum { N = 40000 };
    for (uint64_t k = 0; k < N; k++) {
        ck_assert_int_eq(tp_sampler_sample_edited(s, &t1, k, logits, &two, NULL, 0, NULL, 0, &res), TP_OK);
        count[res.token]++;
        ck_assert_double_eq_tol(res.logprob, (double)logits[res.token] - lse, 1e-6);
    }
    for (int i = 0; i < V; i++) {
        const double p = exp(biased[i]) / z, sd = sqrt(p * (1.0 - p) / N);
        ck_assert_msg(fabs(count[i] / (double)N - p) < 5.0 * sd, "token %d drawn %d of %d, expected p %.4f", i,
                      count[i], (int)N, p);
    }
    tp_sampler_destroy(s);
}
END_TEST

/* allowed_token_ids: only they are drawn; the logprobs stay raw; a NaN/+Inf elsewhere is no
 * error, one among them is. */
START_TEST(allowed_ids_rule)
{
    enum { V = 6 };
    float logits[V] = {3.0f, 1.0f, 0.5f, NAN, -1.0f, INFINITY};
    const double lse = log(exp(3.0) + exp(1.0) + exp(0.5) + exp(-1.0));
    tp_sampler *s = make_sampler(V);
    tp_token_logprob top[1];
    tp_sample_result res = {.top = top};
    const int32_t allowed[2] = {4, 2};
    const tp_logit_edits only = {.allowed = allowed, .n_allowed = 2};
    tp_sampling_params g = params_t(0.0);
    g.logprobs = 1;
    ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &only, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 2);
    ck_assert_double_eq_tol(res.logprob, 0.5 - lse, 1e-6);
    ck_assert_int_eq(top[0].id, 0); /* raw: the disallowed leader still leads */
    tp_sampling_params t1 = params_t(1.0);
    int count[V] = {0};
    enum { N = 20000 };
    for (uint64_t k = 0; k < N; k++) {
        ck_assert_int_eq(tp_sampler_sample_edited(s, &t1, k, logits, &only, NULL, 0, NULL, 0, &res), TP_OK);
        count[res.token]++;
    }
    ck_assert_int_eq(count[2] + count[4], N);
    const double p4 = exp(-1.0) / (exp(-1.0) + exp(0.5)), sd = sqrt(p4 * (1.0 - p4) / N);
    ck_assert_msg(fabs(count[4] / (double)N - p4) < 5.0 * sd, "token 4 drawn %d of %d", count[4], (int)N);
    /* with a bias on an allowed id, both apply */
    const int32_t bid[2] = {4, 0};
    const float bval[2] = {2.0f, 50.0f};
    const tp_logit_edits both = {.allowed = allowed, .n_allowed = 2, .bias_ids = bid, .bias = bval, .n_bias = 2};
    ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &both, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 4); /* -1 + 2 > 0.5; token 0's +50 cannot bring it back */
    /* a NaN among the allowed is the model's fault still */
    const int32_t with_nan[2] = {3, 2};
    const tp_logit_edits bad = {.allowed = with_nan, .n_allowed = 2};
    ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &bad, NULL, 0, NULL, 0, &res), TP_ERR_NUMERIC);
    tp_error_clear();
    tp_sampler_destroy(s);
}
END_TEST

/* Edits that name ids outside the vocabulary, or a bias that is not finite, are refused,
 * and leave nothing behind for the next call. */
START_TEST(bad_edits_refused)
{
    enum { V = 4 };
    const float logits[V] = {1.0f, 2.0f, 0.0f, -1.0f};
    tp_sampler *s = make_sampler(V);
    tp_sample_result res = {0};
    tp_sampling_params g = params_t(0.0);
    const int32_t outside[1] = {V}, ok_id[1] = {2};
    const float big[1] = {10.0f}, nan_bias[1] = {NAN};
    const tp_logit_edits cases[] = {{.allowed = outside, .n_allowed = 1},
                                    {.bias_ids = outside, .bias = big, .n_bias = 1},
                                    {.bias_ids = ok_id, .bias = nan_bias, .n_bias = 1},
                                    {.bias_ids = ok_id, .bias = NULL, .n_bias = 1}};
    const char *needles[] = {"allowed token 4", "logit_bias token 4", "not finite", "no values"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tp_error_clear();
        ck_assert_int_eq(tp_sampler_sample_edited(s, &g, 0, logits, &cases[c], NULL, 0, NULL, 0, &res),
                         TP_ERR_INVALID_ARG);
        ck_assert_msg(strstr(tp_error_message(), needles[c]), "case %zu: \"%s\"", c, tp_error_message());
    }
    tp_error_clear();
    ck_assert_int_eq(tp_sampler_sample(s, &g, 0, logits, NULL, 0, NULL, 0, &res), TP_OK);
    ck_assert_int_eq(res.token, 1);
    tp_sampler_destroy(s);
}
END_TEST

START_TEST(logprobs_stable_for_large_logits)
{
    const float logits[5] = {1000.0f, 999.0f, -1000.0f, -INFINITY, 1000.0f};
    tp_sampler *s = make_sampler(5);
    tp_token_logprob top[20];
    tp_sample_result r = {.top = top};
    tp_sampling_params p = params_t(0.0);
    p.logprobs = 20; /* more than the vocabulary: all five come back */
    ck_assert_int_eq(tp_sampler_sample(s, &p, 0, logits, NULL, 0, NULL, 0, &r), TP_OK);
    double lse = 1000.0 + log(2.0 + exp(-1.0)); /* exp(-2000) vanishes in double */
    ck_assert_int_eq(r.token, 0);
    ck_assert_double_eq_tol(r.logprob, 1000.0 - lse, 1e-6);
    ck_assert_int_eq(r.n_top, 5);
    const int32_t order[5] = {0, 4, 1, 2, 3};
    for (int j = 0; j < 5; j++) ck_assert_int_eq(top[j].id, order[j]);
    ck_assert_double_eq_tol(top[1].logprob, 1000.0 - lse, 1e-6);
    ck_assert_double_eq_tol(top[2].logprob, 999.0 - lse, 1e-6);
    ck_assert_double_eq_tol(top[3].logprob, -1000.0 - lse, 1e-3);
    ck_assert(isinf(top[4].logprob) && top[4].logprob < 0);
    tp_sampler_destroy(s);
}
END_TEST

/* ---- edge cases -------------------------------------------------------------------------- */

START_TEST(vocab_of_one)
{
    tp_sampler *s = make_sampler(1);
    tp_token_logprob top[20];
    tp_sample_result r = {.top = top};
    const float one[1] = {-3.5f}, dead[1] = {-INFINITY};
    tp_sampling_params ps[2] = {params_t(0.0), params_t(1.3)};
    ps[1].top_k = 5;
    ps[1].top_p = 0.1;
    ps[1].min_p = 1.0;
    ps[1].repetition_penalty = 2.0;
    const int32_t output[2] = {0, 0};
    for (int c = 0; c < 2; c++) {
        ps[c].logprobs = 5;
        for (int d = 0; d < 2; d++) {
            const float *row = d ? dead : one;
            ck_assert_int_eq(tp_sampler_sample(s, &ps[c], 3, row, NULL, 0, output, 2, &r), TP_OK);
            ck_assert_int_eq(r.token, 0);
            ck_assert_double_eq_tol(r.logprob, 0.0, 1e-12);
            ck_assert_int_eq(r.n_top, 1);
            ck_assert_int_eq(top[0].id, 0);
            ck_assert_double_eq_tol(top[0].logprob, 0.0, 1e-12);
        }
    }
    tp_sampler_destroy(s);
}
END_TEST

START_TEST(negative_infinity_logits)
{
    const float some[5] = {-INFINITY, -INFINITY, 0.5f, -INFINITY, 0.25f};
    tp_sampler *s = make_sampler(5);
    tp_sampling_params g = params_t(0.0), t = params_t(2.0);
    ck_assert_int_eq(sample_one(s, &g, 0, some), 2);
    int32_t counts[5] = {0};
    for (uint64_t k = 0; k < 2000; k++) counts[sample_one(s, &t, k, some)]++;
    const int32_t live[2] = {2, 4};
    expect_drawn_set(counts, 5, live, 2);
    t.top_k = 4; /* more than the live tokens */
    t.top_p = 0.999999;
    for (uint64_t k = 0; k < 500; k++) {
        int32_t tok = sample_one(s, &t, k, some);
        ck_assert(tok == 2 || tok == 4);
    }
    tp_sampler_destroy(s);

    /* One live token: it is certain, at any temperature. */
    const float lone[3] = {-INFINITY, 0.3f, -INFINITY};
    tp_token_logprob lone_top[20];
    tp_sample_result lr = {.top = lone_top};
    s = make_sampler(3);
    for (int c = 0; c < 3; c++) {
        tp_sampling_params q = params_t(c == 0 ? 0.0 : c == 1 ? 1.0 : 0.5);
        q.logprobs = 3;
        ck_assert_int_eq(tp_sampler_sample(s, &q, 5, lone, NULL, 0, NULL, 0, &lr), TP_OK);
        ck_assert_int_eq(lr.token, 1);
        ck_assert_double_eq(lr.logprob, 0.0);
        ck_assert_int_eq(lone_top[0].id, 1);
        ck_assert_double_eq(lone_top[0].logprob, 0.0);
        ck_assert(isinf(lone_top[1].logprob) && lone_top[1].id == 0 && lone_top[2].id == 2);
    }
    tp_sampler_destroy(s);

    /* All -inf: token 0, no draw, and the uniform limit for logprobs. */
    const float dead[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    s = make_sampler(4);
    tp_token_logprob top[20];
    tp_sample_result r = {.top = top};
    t = params_t(1.0);
    t.logprobs = 2;
    for (uint64_t k = 0; k < 20; k++) {
        ck_assert_int_eq(tp_sampler_sample(s, &t, k, dead, NULL, 0, NULL, 0, &r), TP_OK);
        ck_assert_int_eq(r.token, 0);
        ck_assert_double_eq_tol(r.logprob, -log(4.0), 1e-6);
        ck_assert_int_eq(r.n_top, 2);
        ck_assert_int_eq(top[0].id, 0);
        ck_assert_int_eq(top[1].id, 1);
        ck_assert_double_eq_tol(top[1].logprob, -log(4.0), 1e-6);
    }
    tp_sampler_destroy(s);
}
END_TEST

START_TEST(nan_and_positive_infinity_rejected)
{
    float logits[6] = {0.1f, 0.2f, 0.3f, NAN, 0.5f, NAN};
    tp_sampler *s = make_sampler(6);
    tp_token_logprob top[20];
    tp_sample_result r = {.top = top};
    tp_sampling_params p = params_t(1.0);
    p.frequency_penalty = 2.0;
    p.logprobs = 3;
    const int32_t output[3] = {4, 4, 1};
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, output, 3, &r), TP_ERR_NUMERIC);
    ck_assert_str_eq(tp_error_message(), "logits contain NaN at token 3");
    p.temperature = 0;
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, output, 3, &r), TP_ERR_NUMERIC);
    ck_assert_str_eq(tp_error_message(), "logits contain NaN at token 3");
    logits[3] = 0.0f;
    logits[5] = INFINITY;
    logits[1] = INFINITY;
    ck_assert_int_eq(try_sample(s, &p, logits, NULL, 0, output, 3, &r), TP_ERR_NUMERIC);
    ck_assert_str_eq(tp_error_message(), "logits contain +Inf at token 1");
    /* The failed calls left no penalty state behind: with no output, token 4 wins. */
    logits[1] = 0.2f;
    logits[5] = 0.0f;
    ck_assert_int_eq(tp_sampler_sample(s, &p, 0, logits, NULL, 0, NULL, 0, &r), TP_OK);
    ck_assert_int_eq(r.token, 4);
    /* ...and the same sampler then penalizes correctly: 0.5 - 2 * 2 < 0.3. */
    ck_assert_int_eq(tp_sampler_sample(s, &p, 0, logits, NULL, 0, output, 2, &r), TP_OK);
    ck_assert_int_eq(r.token, 2);
    tp_sampler_destroy(s);
}
END_TEST

/* ---- large vocabularies: the selection paths against the full-sort reference ------------ */

static uint64_t lcg_next(uint64_t *x)
{
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 11;
}

START_TEST(large_vocab_matches_reference)
{
    enum { V = 256000 };
    float *logits = malloc(V * sizeof *logits);
    ck_assert_ptr_nonnull(logits);
    uint64_t x = 7;
    /* Roughly LLM-shaped: a Gaussian bulk, a few strong candidates, repeated values. */
    for (int i = 0; i < V; i++) {
        double u1 = (lcg_next(&x) + 1.0) * 0x1.0p-53, u2 = lcg_next(&x) * 0x1.0p-53;
        logits[i] = (float)(2.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    for (int i = 0; i < 40; i++) logits[lcg_next(&x) % V] = (float)(12.0 + (i % 10) * 0.5);
    int32_t prompt[500], output[200];
    for (int i = 0; i < 500; i++) prompt[i] = (int32_t)(lcg_next(&x) % V);
    for (int i = 0; i < 200; i++) output[i] = (int32_t)(lcg_next(&x) % 300);

    struct {
        double t;
        int32_t k;
        double top_p, min_p, rep, freq;
    } cfg[] = {
        {1.0, 0, 1.0, 0.0, 1.0, 0.0},     {0.7, 50, 1.0, 0.0, 1.0, 0.0},
        {1.0, 0, 0.9, 0.0, 1.0, 0.0},     {0.6, 0, 1.0, 0.05, 1.0, 0.0},
        {1.2, 1000, 0.95, 0.01, 1.2, 0.5}, {3.0, 0, 0.5, 0.0, 1.1, 0.1},
        {1.0, 100000, 0.999, 0.0, 1.0, 0.0}, {0.9, 0, 0.95, 0.02, 1.0, 0.0},
        {1.5, 0, 1.0, 1e-4, 1.0, 0.0},     {1.0, 0, 0.98, 1e-3, 1.3, 0.2},
        {2.0, 5000, 0.9, 0.0, 1.0, 0.0},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        tp_sampling_params p = params_t(cfg[c].t);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.repetition_penalty = cfg[c].rep;
        p.frequency_penalty = cfg[c].freq;
        ref_dist d;
        run_vs_reference(logits, V, &p, prompt, 500, output, 200, 25, NULL, &d);
        ref_free(&d);
    }

    /* Shapes that trouble naive quickselect: sorted both ways, and all equal. */
    enum { W = 100000 };
    for (int shape = 0; shape < 3; shape++) {
        for (int i = 0; i < W; i++)
            logits[i] = shape == 0 ? i * 1e-4f : shape == 1 ? -i * 1e-4f : 0.25f;
        tp_sampling_params p = params_t(1.0);
        ref_dist d;
        p.top_k = 100;
        run_vs_reference(logits, W, &p, NULL, 0, NULL, 0, 10, NULL, &d);
        ref_free(&d);
        p.top_k = 0;
        p.top_p = 0.5;
        run_vs_reference(logits, W, &p, NULL, 0, NULL, 0, 10, NULL, &d);
        if (shape == 2) ck_assert_int_eq(d.n, W / 2); /* equal masses: exactly half */
        ref_free(&d);
        p.top_p = 1.0;
        run_vs_reference(logits, W, &p, NULL, 0, NULL, 0, 10, NULL, &d);
        ref_free(&d);
    }
    free(logits);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stream_is_pinned);
    tcase_add_test(tc, stream_is_reproducible_and_independent);
    tcase_add_test(tc, params_default);
    tcase_add_test(tc, params_reject_each_field);
    tcase_add_test(tc, sample_rejects_bad_input);
    tcase_add_test(tc, greedy_argmax_and_ties);
    tcase_add_test(tc, temperature_distribution);
    tcase_add_test(tc, temperature_decides_survivors);
    tcase_add_test(tc, top_k_survivors);
    tcase_add_test(tc, top_p_boundary);
    tcase_add_test(tc, min_p_rule);
    tcase_add_test(tc, filters_combined);
    tcase_add_test(tc, top_p_applies_before_min_p);
    tcase_add_test(tc, repetition_penalty_rule);
    tcase_add_test(tc, frequency_and_presence_rules);
    tcase_add_test(tc, penalties_shape_the_sampled_distribution);
    tcase_add_test(tc, logprobs_are_raw_log_softmax);
    tcase_add_test(tc, banned_ids_stay_in_raw_logprobs);
    tcase_add_test(tc, logit_bias_rule);
    tcase_add_test(tc, allowed_ids_rule);
    tcase_add_test(tc, bad_edits_refused);
    tcase_add_test(tc, logprobs_stable_for_large_logits);
    tcase_add_test(tc, vocab_of_one);
    tcase_add_test(tc, negative_infinity_logits);
    tcase_add_test(tc, nan_and_positive_infinity_rejected);
    tcase_add_test(tc, large_vocab_matches_reference);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
