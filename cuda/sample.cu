/*
 * sample.cu: tp_sampler_sample's rule on the GPU (src/sampler.c is the definition and
 * backend_cpu.c's sample op the reference), so that a sampling step downloads L small
 * results instead of L x V logits. A row goes to a team of blocks of 1024 threads: a
 * thread-block cluster of up to 8 on sm_90 when the rows are few (L x 2 x team <= SMs), each
 * block a share of the columns, one block a row when they are many (the grid, at most one
 * block per SM, walks the rows); vocabularies up to 2^22. A team's blocks merge what their
 * shares found through distributed shared memory (pass 1's sums, each select level's
 * histogram, a list's members into every block's list), so that every block holds the same
 * state and takes the same branches; the team's first block sets the flags and writes the
 * result.
 *
 * Per row, with every selection a prefix of the rank order (penalized value v descending,
 * id ascending), so a set of candidates is a boundary (key T, id c): key > T, or key == T
 * and id <= c, where key is an order-preserving 64-bit image of the double v (-0 as +0):
 *   0. the row's penalty ids and edits go into the block's flag array in device memory
 *      (banned, allowed, biased and seen bits, output count; the biases into the block's
 *      float array beside it), cleared again at the end of the row;
 *   1. one pass: NaN/+Inf (the lowest column is a fault, reported at synchronize()),
 *      where logprobs are wanted (n_logprobs >= 0) the log-sum-exp of the raw logits in
 *      double (excluded ids' too, as vLLM's raw logprobs; an excluded id's v is -inf), the
 *      argmax of v (lowest id on ties: the greedy answer and rank 1), the number of live
 *      (v != -inf) candidates and the least raw logit and value (the spread bins' ranges);
 *   2. top-N raw logprobs: a radix select of the N-th by (raw desc, id asc), then the N
 *      gathered into shared memory and sorted;
 *   3. unless greedy (temperature < 1e-5, top_k == 1, or at most one live): when the top-k
 *      set (or all live) has at most LIST_CAP candidates, it is gathered and sorted in
 *      shared memory and weights, top-p, min-p and the draw run on that list; otherwise on
 *      the whole row: top-k by a counting radix select, then top-p and the draw by radix
 *      selects on mass (per-digit counts and per-digit weight sums), min-p as the filter
 *      w >= min_p (a rank prefix too, as w never grows along the ranks); when top-p leaves
 *      at most LIST_CAP (a trained model's usual case), min-p and the draw run on their
 *      list instead (the same set, the same exact mass: the same token).
 * A radix select's first level bins the candidates by their distance from the row's
 * largest value in 2,048 even steps (spread_bin: monotone, so a bin is a run of ranks;
 * the key's top bits, sign and exponent, would put most of a row in a few bins, whose
 * shared-memory atomics serialize); then it walks 11-bit digits of the key from the top (6
 * digits at most) within the chosen bin, keeping the candidates whose key matches the
 * digits chosen so far. It stops when the chosen digit holds at most LIST_CAP candidates
 * (they are gathered, sorted and walked in rank order) or when the candidates left share
 * every lower bit (a tie group: equal v, equal weights; the answer is its j-th lowest id,
 * found by a scan in id order).
 *
 * Weights w = exp((v - max) / temperature) are doubles as on the CPU; their sums are exact:
 * each w is held as a 128-bit fixed-point number (2^-104 resolution; w <= 1 and V <= 2^22
 * keep sums below 2^62 units of 2^-40), added with integer atomics, so the order of the
 * threads never changes a sum and a row gives the same token on every run and in any
 * batch. Targets (top_p * mass, u * mass with mass rounded once to double) are compared
 * exactly against those sums. The CPU sums in double in its own order, and the device exp
 * may differ from glibc's in the last bit, so a draw (or a top-p / min-p cut) can differ
 * from the CPU's only when u * mass (top_p * mass, min_p) falls within rounding of a
 * boundary between two ranks. Ranks, top-k, top-N and greedy are exact (the penalties are
 * computed with sampler.c's operations, without FMA contraction).
 *
 * The log-sum-exp's rounding follows the team's shares, so a logprob (not a token) may
 * differ in its last bits between a call of few rows and one of many.
 *
 * Cost at V = 128256 (bench/gpu_sample, bench/RESULTS.md): a full pass reads the row once
 * (plus the flags when a penalty or edit is on); a select by mass is its first level (a
 * double exp and division a column) and usually one gather of its bin. At 128 rows on an
 * H200 (one block a row): greedy ~90 us, with logprobs 5 ~270 us (pass 1's double exp a
 * column), temperature ~0.35 ms, with top-p ~0.45-0.6 ms, with top-k 50 ~0.28 ms. One block
 * alone reads its row at a few GB/s (its loads in flight are few), hence the teams.
 */
#include <float.h>
#include <math.h>

#include <cooperative_groups.h>

#include "common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_TEAM_MAX 8 /* blocks that share a row: a portable cluster's most */
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP_SIZE)
#define RADIX_BITS 11
#define RADIX_BINS (1 << RADIX_BITS)
#define LIST_CAP 2048           /* candidates a select finishes in shared memory */
static_assert(RADIX_BINS % SAMPLE_THREADS == 0, "a team's histogram merge: the same bins in every thread");
#define GREEDY_TEMPERATURE 1e-5 /* sampler.c's */

#define F_BANNED 0x80000000u
#define F_SEEN 0x40000000u
#define F_ALLOWED 0x20000000u
#define F_BIAS 0x10000000u /* the column's bias is in the block's bias array */
#define F_COUNT 0x0fffffffu

typedef unsigned long long u64;

// ----------------------------------------------------------------------------
// the team: the blocks that share a row, a thread-block cluster (sm_90), whose blocks read
// each other's shared memory; elsewhere, and in a launch without clusters, the block alone.
// Every block of a team takes the same branches (they decide on merged, equal values), so
// team_sync is reached by all of them alike.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SAMPLE_CLUSTERS 1
#endif

struct team {
    int n, rank;
};

__device__ __forceinline__ team team_of()
{
    team t = {1, 0};
#ifdef SAMPLE_CLUSTERS
    const cooperative_groups::cluster_group c = cooperative_groups::this_cluster();
    t.n = (int)c.num_blocks();
    t.rank = (int)c.block_rank();
#endif
    return t;
}

/* every thread of the team's blocks; shared and global memory written before it is seen by
 * all of them after it */
__device__ __forceinline__ void team_sync(const team &t)
{
#ifdef SAMPLE_CLUSTERS
    if (t.n > 1) {
        cooperative_groups::this_cluster().sync();
        return;
    }
#endif
    __syncthreads();
}

/* the object at p (in this block's shared memory) in block rank's */
template <typename T> __device__ __forceinline__ T *team_at(const team &t, T *p, int rank)
{
#ifdef SAMPLE_CLUSTERS
    if (t.n > 1) return cooperative_groups::this_cluster().map_shared_rank(p, (unsigned int)rank);
#endif
    (void)t;
    (void)rank;
    return p;
}

// ----------------------------------------------------------------------------
// the frozen random stream: sampler.c's mix64 and stream_unit, bit for bit

#define GOLDEN 0x9e3779b97f4a7c15ULL

__device__ __forceinline__ u64 mix64(u64 x)
{
    u64 z = x + GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double stream_unit(u64 seed, u64 step)
{
    return __dmul_rn((double)(mix64(seed + step * GOLDEN) >> 11), 0x1.0p-53);
}

// ----------------------------------------------------------------------------
// keys: doubles as order-preserving unsigned integers (-0 and +0 share one)

__device__ __forceinline__ u64 key_of(double v)
{
    if (v == 0.0) v = 0.0;
    const u64 u = (u64)__double_as_longlong(v);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

__device__ __forceinline__ double value_of(u64 k)
{
    return __longlong_as_double((long long)((k >> 63) ? (k & 0x7fffffffffffffffULL) : ~k));
}

#define KEY_NEG_INF 0x000fffffffffffffULL /* key_of(-inf); every other value's key is larger */

// ----------------------------------------------------------------------------
// exact sums of weights: value = hi * 2^-40 + lo * 2^-104

struct fix128 {
    u64 hi, lo;
};

__device__ __forceinline__ fix128 fix_zero()
{
    fix128 r = {0, 0};
    return r;
}

/* w in [0, 1] (targets up to 2^22): exact down to 2^-104 */
__device__ __forceinline__ fix128 fix_of(double w)
{
    const double t = w * 0x1p40, h = floor(t);
    fix128 r;
    r.hi = (u64)h;
    r.lo = __double2ull_rz((t - h) * 0x1p64);
    return r;
}

__device__ __forceinline__ fix128 fix_add(fix128 a, fix128 b)
{
    fix128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1 : 0);
    return r;
}

__device__ __forceinline__ fix128 fix_sub(fix128 a, fix128 b)
{
    fix128 r;
    r.lo = a.lo - b.lo;
    r.hi = a.hi - b.hi - (a.lo < b.lo ? 1 : 0);
    return r;
}

__device__ __forceinline__ fix128 fix_mul(fix128 a, u64 j)
{
    fix128 r;
    r.lo = a.lo * j;
    r.hi = a.hi * j + __umul64hi(a.lo, j);
    return r;
}

__device__ __forceinline__ bool fix_ge(fix128 a, fix128 b) { return a.hi > b.hi || (a.hi == b.hi && a.lo >= b.lo); }
__device__ __forceinline__ bool fix_gt(fix128 a, fix128 b) { return a.hi > b.hi || (a.hi == b.hi && a.lo > b.lo); }

__device__ __forceinline__ double fix_double(fix128 a)
{
    return __dadd_rn(__dmul_rn((double)a.hi, 0x1p-40), __dmul_rn((double)a.lo, 0x1p-104));
}

__device__ __forceinline__ fix128 shfl_up_fix(fix128 a, int d)
{
    fix128 r;
    r.hi = __shfl_up_sync(0xffffffffu, a.hi, d);
    r.lo = __shfl_up_sync(0xffffffffu, a.lo, d);
    return r;
}

// ----------------------------------------------------------------------------
// shared memory: the digit histogram and the candidate list are never live together

/* Pass 1's summary of some columns of a row: the raw logits' log-sum-exp as (m, s), the
 * largest value and its column (the lower on ties), the live values' count, the first
 * NaN/+Inf column, the least finite raw logit and live value. add merges another's; lanes,
 * warps and a team's blocks all merge by it, each in a fixed order, so that the sums are the
 * same whatever the timing. */
struct row_sums {
    double m, s, best, xmin, vmin;
    int32_t arg, live, bad;

    __device__ static row_sums none()
    {
        return {-INFINITY, 0.0, -INFINITY, INFINITY, INFINITY, INT32_MAX, 0, INT32_MAX};
    }
    __device__ void add(const row_sums &o)
    {
        const double M = fmax(m, o.m);
        s = (m == -INFINITY ? 0.0 : s * exp(m - M)) + (o.m == -INFINITY ? 0.0 : o.s * exp(o.m - M));
        m = M;
        if (o.best > best || (o.best == best && o.arg < arg)) {
            best = o.best;
            arg = o.arg;
        }
        live += o.live;
        bad = min(bad, o.bad);
        xmin = fmin(xmin, o.xmin);
        vmin = fmin(vmin, o.vmin);
    }
    /* the same from lane l ^ o of the warp */
    __device__ row_sums from_lane(int o) const
    {
        return {__shfl_xor_sync(0xffffffffu, m, o),    __shfl_xor_sync(0xffffffffu, s, o),
                __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, xmin, o),
                __shfl_xor_sync(0xffffffffu, vmin, o), __shfl_xor_sync(0xffffffffu, arg, o),
                __shfl_xor_sync(0xffffffffu, live, o), __shfl_xor_sync(0xffffffffu, bad, o)};
    }
};

struct sample_smem {
    union {
        struct {
            unsigned int count[RADIX_BINS];
            u64 hi[RADIX_BINS], lo[RADIX_BINS];
        } h;
        struct {
            u64 key[LIST_CAP];
            double w[LIST_CAP];
            int32_t id[LIST_CAP];
        } l;
    } u;
    /* reductions and broadcasts */
    row_sums red[SAMPLE_WARPS];
    int32_t warp_count[SAMPLE_WARPS];
    /* this block's share of the row (its columns' pass 1, a histogram's low bits, the
     * flags' check on rank 0), which the team merges */
    row_sums blk;
    int32_t blk_any_low, blk_flags_bad;
    int32_t n_list;
    int32_t found;
    /* the select's state, written by warp 0 */
    u64 sel_key;
    int32_t sel_id, sel_pos, sel_digit, sel_bin_count, sel_done;
    int32_t sel_count_before;
    fix128 sel_mass_before, sel_target;
    /* the row's summary */
    double m, s, best, scale_raw, scale_v;
    int32_t arg, n_live, bad;
    int32_t top_id[TP_SAMPLE_MAX_LOGPROBS];
    float top_x[TP_SAMPLE_MAX_LOGPROBS];
};

// ----------------------------------------------------------------------------
// one row, and the candidate sets of its selections

struct row_ctx {
    const float *x;
    int32_t c0, c1; /* this block's columns of the row: [c0, c1) */
    const unsigned int *flags; /* NULL when the row has no penalty and no edits */
    const float *bias;         /* [V] where F_BIAS is set */
    int32_t V;
    bool pen, allow_list;
    double rep, freq, pres, temperature, best;
    /* spread bins (spread_bin): the largest raw logit, and the bins' scales for raw logits
     * and for values */
    double top_raw, scale_raw, scale_v;
};

/* A rank prefix: key > T, or key == T and id <= c; raw: keys of the raw logits, else of
 * the penalized values; weights: also w > 0 and w >= wmin (w computed for mass); bin >= 0:
 * also in that spread bin. */
struct cand_set {
    u64 T;
    int32_t c;
    bool raw, weights;
    double wmin;
    int32_t bin;
};

/* The spread bin of value v (raw: of a raw logit): its distance from the row's largest in
 * RADIX_BINS even steps over the row's range, the last bin also for -inf. Rounded
 * subtraction and product keep it monotone, so a bin holds a run of ranks and a smaller
 * bin ranks first: a first select level whose bins hold similar counts, where the key's
 * top bits (sign and exponent) put most of a row in a few bins, whose atomics serialize. */
__device__ __forceinline__ int spread_bin(const row_ctx &r, bool raw, double v)
{
    const double t = raw ? __dmul_rn(__dsub_rn(r.top_raw, v), r.scale_raw) : __dmul_rn(__dsub_rn(r.best, v), r.scale_v);
    return t < (double)(RADIX_BINS - 1) ? (int)t : RADIX_BINS - 1; /* NaN (0 x inf): the last */
}

/* RADIX_BINS - 1 over a row's range of finite values (top - least): 0 where that is not
 * a positive finite number or the scale would not be (one bin then holds every value) */
__device__ __forceinline__ double spread_scale(double top, double least)
{
    const double range = __dsub_rn(top, least);
    const double scale = range > 0.0 && isfinite(range) ? __ddiv_rn((double)(RADIX_BINS - 1), range) : 0.0;
    return isfinite(scale) ? scale : 0.0;
}

/* sampler.c's penalize(), operation for operation (no contraction into FMA) */
__device__ __forceinline__ double penalize(double x, const row_ctx &r, unsigned int count)
{
    double v = x > 0.0 ? __ddiv_rn(x, r.rep) : __dmul_rn(x, r.rep);
    v = __dsub_rn(v, __dmul_rn((double)count, r.freq));
    if (count > 0) v = __dsub_rn(v, r.pres);
    if (isinf(v) && isfinite(x)) v = copysign(DBL_MAX, v);
    return v;
}

/* Never drawn: banned, or not among the allowed ids (when the row lists some) */
__device__ __forceinline__ bool excluded(const row_ctx &r, unsigned int f)
{
    return (f & F_BANNED) || (r.allow_list && !(f & F_ALLOWED));
}

/* A column's raw logit x as the logprobs count it (an excluded id's too, as vLLM's raw
 * logprobs come before its edits; an excluded NaN/+Inf counts as -inf), f its flags */
__device__ __forceinline__ float raw_of(const row_ctx &r, float x, unsigned int f)
{
    return excluded(r, f) && (isnan(x) || x == INFINITY) ? -INFINITY : x;
}

__device__ __forceinline__ float raw_at(const row_ctx &r, int32_t i, unsigned int &f)
{
    f = r.flags ? r.flags[i] : 0u;
    return raw_of(r, __ldg(r.x + i), f);
}

/* body(i, x, f) for each column i = c0 + threadIdx.x + k * blockDim.x of the block's share
 * of the row, in increasing i (each thread's sums in one order), its raw logit x and flags
 * f. The loads of COLUMNS_AHEAD columns go out before the first is used, so that a block
 * reading its columns does not wait on one load at a time. */
#define COLUMNS_AHEAD 4
template <typename Body> __device__ __forceinline__ void for_columns(const row_ctx &r, Body body)
{
    const int32_t stride = (int32_t)blockDim.x;
    for (int32_t base = r.c0 + (int32_t)threadIdx.x; base < r.c1; base += COLUMNS_AHEAD * stride) {
        float x[COLUMNS_AHEAD];
        unsigned int f[COLUMNS_AHEAD];
#pragma unroll
        for (int k = 0; k < COLUMNS_AHEAD; k++) {
            const int32_t i = base + k * stride;
            x[k] = i < r.c1 ? __ldg(r.x + i) : 0.0f;
            f[k] = r.flags && i < r.c1 ? r.flags[i] : 0u;
        }
#pragma unroll
        for (int k = 0; k < COLUMNS_AHEAD; k++) {
            const int32_t i = base + k * stride;
            if (i < r.c1) body(i, raw_of(r, x[k], f[k]), f[k]);
        }
    }
}

/* The value the draw ranks: biased, then penalized; an excluded id -inf */
__device__ __forceinline__ double value_at(const row_ctx &r, int32_t i, float x, unsigned int f)
{
    if (excluded(r, f)) return -INFINITY;
    const double b = (f & F_BIAS) ? __dadd_rn((double)x, (double)r.bias[i]) : (double)x;
    return r.pen && (f & F_SEEN) ? penalize(b, r, f & F_COUNT) : b;
}

__device__ __forceinline__ double weight_of(const row_ctx &r, double v)
{
    return exp(__ddiv_rn(__dsub_rn(v, r.best), r.temperature));
}

/* Whether column i (raw logit x, flags f) is in set s with (key & mask) == P; its value v,
 * key and (weights) w. */
__device__ __forceinline__ bool eval_of(const row_ctx &r, const cand_set &s, int32_t i, float x, unsigned int f,
                                        u64 mask, u64 P, double &v, u64 &key, double &w)
{
    v = s.raw ? (double)x : value_at(r, i, x, f);
    key = key_of(v);
    if (!(key > s.T || (key == s.T && i <= s.c)) || (key & mask) != P) return false;
    if (s.bin >= 0 && spread_bin(r, s.raw, v) != s.bin) return false;
    w = 0.0;
    if (s.weights) {
        w = weight_of(r, v);
        if (!(w > 0.0 && w >= s.wmin)) return false;
    }
    return true;
}

__device__ __forceinline__ bool eval(const row_ctx &r, const cand_set &s, int32_t i, u64 mask, u64 P, double &v,
                                     u64 &key, double &w)
{
    unsigned int f;
    const float x = raw_at(r, i, f);
    return eval_of(r, s, i, x, f, mask, P, v, key, w);
}

/* a ranks before b: larger key, or the same key and the lower id */
__device__ __forceinline__ bool ranks_before(u64 ka, int32_t ia, u64 kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

// ----------------------------------------------------------------------------
// the candidate list in shared memory: gathered, sorted, walked

/* Gather the members of s with (key & mask) == P into the list (at most LIST_CAP; the
 * caller knows the count) and sort them in rank order: each block of the team puts its
 * columns' members into every block's list, and every block sorts the same list. */
__device__ void list_gather_sort(sample_smem &sm, const team &t, const row_ctx &r, const cand_set &s, u64 mask,
                                 u64 P)
{
    if (threadIdx.x == 0) sm.n_list = 0;
    team_sync(t); /* every list empty (and its block done with what the union held) */
    const int lane = threadIdx.x % WARP_SIZE;
    for_columns(r, [&](int32_t i, float x, unsigned int f) {
        u64 key;
        double v, w;
        const bool in = eval_of(r, s, i, x, f, mask, P, v, key, w);
        /* one atomic a warp and list: the lanes here take consecutive places */
        const unsigned int members = __ballot_sync(__activemask(), in);
        if (!in) return;
        const int first = __ffs(members) - 1, before = __popc(members & ((1u << lane) - 1));
        for (int q = 0; q < t.n; q++) {
            sample_smem *o = team_at(t, &sm, q);
            int32_t base = 0;
            if (lane == first) base = atomicAdd(&o->n_list, __popc(members));
            const int32_t at = __shfl_sync(members, base, first) + before;
            if (at < LIST_CAP) {
                o->u.l.key[at] = key;
                o->u.l.id[at] = i;
                o->u.l.w[at] = w;
            }
        }
    });
    team_sync(t); /* every member in every list */
    const int32_t n = min(sm.n_list, LIST_CAP);
    int32_t n2 = 1;
    while (n2 < n) n2 <<= 1;
    for (int32_t t = n + threadIdx.x; t < n2; t += blockDim.x) { /* padding ranks last */
        sm.u.l.key[t] = 0;
        sm.u.l.id[t] = INT32_MAX;
        sm.u.l.w[t] = 0.0;
    }
    __syncthreads();
    /* bitonic sort into rank order */
    for (int32_t k = 2; k <= n2; k <<= 1)
        for (int32_t j = k >> 1; j > 0; j >>= 1) {
            for (int32_t t = threadIdx.x; t < n2; t += blockDim.x) {
                const int32_t o = t ^ j;
                if (o <= t) continue;
                const bool up = (t & k) == 0;
                const u64 ka = sm.u.l.key[t], kb = sm.u.l.key[o];
                const int32_t ia = sm.u.l.id[t], ib = sm.u.l.id[o];
                if (up ? ranks_before(kb, ib, ka, ia) : ranks_before(ka, ia, kb, ib)) {
                    sm.u.l.key[t] = kb;
                    sm.u.l.key[o] = ka;
                    sm.u.l.id[t] = ib;
                    sm.u.l.id[o] = ia;
                    const double wt = sm.u.l.w[t];
                    sm.u.l.w[t] = sm.u.l.w[o];
                    sm.u.l.w[o] = wt;
                }
            }
            __syncthreads();
        }
    if (threadIdx.x == 0) sm.n_list = n;
    __syncthreads();
}

/* Warp 0: the first list position p < n whose running amount (before + the amounts of
 * positions 0..p; an amount is 1, or the fixed-point weight when by_mass) reaches target
 * (> when strict, else >=); n - 1 when none does. Returned to lane 0 of warp 0. */
__device__ int32_t list_find(const sample_smem &sm, int32_t n, fix128 before, fix128 target, bool by_mass,
                             bool strict)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int32_t per = (n + WARP_SIZE - 1) / WARP_SIZE, lo = lane * per, hi = min(n, lo + per);
    fix128 sum = fix_zero();
    for (int32_t p = lo; p < hi; p++) sum = fix_add(sum, by_mass ? fix_of(sm.u.l.w[p]) : fix128{0, 1});
    fix128 incl = sum; /* inclusive scan over the lanes (exact, so order-free) */
    for (int d = 1; d < WARP_SIZE; d <<= 1) {
        const fix128 o = shfl_up_fix(incl, d);
        if (lane >= d) incl = fix_add(incl, o);
    }
    const fix128 upto = fix_add(before, incl);
    const bool hit = hi > lo && (strict ? fix_gt(upto, target) : fix_ge(upto, target));
    const unsigned int ballot = __ballot_sync(0xffffffffu, hit);
    int32_t pos = n - 1;
    if (ballot) {
        const int first = __ffs(ballot) - 1;
        int32_t found = -1;
        if (lane == first) {
            fix128 acc = fix_add(before, fix_sub(incl, sum));
            for (int32_t p = lo; p < hi; p++) {
                acc = fix_add(acc, by_mass ? fix_of(sm.u.l.w[p]) : fix128{0, 1});
                if (strict ? fix_gt(acc, target) : fix_ge(acc, target)) {
                    found = p;
                    break;
                }
            }
            if (found < 0) found = hi - 1;
        }
        pos = __shfl_sync(0xffffffffu, found, first);
    }
    return pos;
}

/* Warp 0: the exact sum of the first n list weights, to every lane. */
__device__ fix128 list_mass(const sample_smem &sm, int32_t n)
{
    const int lane = threadIdx.x % WARP_SIZE;
    fix128 sum = fix_zero();
    for (int32_t p = lane; p < n; p += WARP_SIZE) sum = fix_add(sum, fix_of(sm.u.l.w[p]));
    for (int d = 1; d < WARP_SIZE; d <<= 1) {
        fix128 o = shfl_up_fix(sum, d);
        if (lane >= d) sum = fix_add(sum, o);
    }
    fix128 r;
    r.hi = __shfl_sync(0xffffffffu, sum.hi, WARP_SIZE - 1);
    r.lo = __shfl_sync(0xffffffffu, sum.lo, WARP_SIZE - 1);
    return r;
}

// ----------------------------------------------------------------------------
// ties: the j-th lowest id (1-based) among the members of s whose key is K

__device__ int32_t nth_id_with_key(sample_smem &sm, const row_ctx &r, const cand_set &s, u64 K, int32_t j)
{
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (threadIdx.x == 0) sm.found = -1;
    int32_t seen = 0; /* members before this chunk (same in every thread) */
    for (int32_t base = 0; base < r.V; base += blockDim.x) {
        const int32_t i = base + threadIdx.x;
        u64 key;
        double v, w;
        const bool in = i < r.V && eval(r, s, i, ~0ULL, K, v, key, w);
        const unsigned int ballot = __ballot_sync(0xffffffffu, in);
        if (lane == 0) sm.warp_count[warp] = __popc(ballot);
        __syncthreads();
        int32_t before = seen, total = 0;
        for (int q = 0; q < (int)(blockDim.x / WARP_SIZE); q++) {
            if (q < warp) before += sm.warp_count[q];
            total += sm.warp_count[q];
        }
        before += __popc(ballot & ((1u << lane) - 1));
        if (in && before + 1 == j) sm.found = i;
        seen += total;
        __syncthreads();
        if (sm.found >= 0) break;
    }
    return sm.found;
}

// ----------------------------------------------------------------------------
// radix select

struct sel_result {
    u64 key;
    int32_t id;
    int32_t pos; /* 1-based rank position in the set */
};

/* The first rank position of set s0 (non-empty) whose running amount reaches the target:
 * by count, position n (1 <= n <= |s0|); by mass, the first whose running weight reaches
 * frac * (the set's mass rounded to double), > when strict, else >=, and the last member
 * when rounding leaves it unreached. The first level's digits are spread bins, the later
 * levels' the key's bits within the chosen bin. Call from all threads; the result goes to
 * all. */
__device__ sel_result radix_select(sample_smem &sm, const team &t, const row_ctx &r, const cand_set &s0, bool by_mass,
                                   int32_t n, double frac, bool strict)
{
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (!by_mass) strict = false; /* position n: the first whose count is >= n */
    u64 P = 0, mask = 0;
    if (threadIdx.x == 0) {
        sm.sel_count_before = 0;
        sm.sel_mass_before = fix_zero();
        sm.sel_target = fix128{0, (u64)n}; /* by count: n units */
    }
    /* sel_mass_before holds the amount (count or mass) of the members ranked before the
     * current digit's candidates, sel_count_before their number */
    sel_result res;
    cand_set s = s0;
    for (int level = -1;; level++) {
        const bool spread = level < 0; /* digit: RADIX_BINS - 1 - the spread bin (rank order) */
        const int shift = spread ? 0 : level < 5 ? 53 - RADIX_BITS * level : 0;
        const int nb = spread ? RADIX_BINS : 1 << (level < 5 ? RADIX_BITS : 9);
        const u64 low = spread ? 0 : shift ? (1ULL << shift) - 1 : 0;
        for (int d = threadIdx.x; d < nb; d += blockDim.x) {
            sm.u.h.count[d] = 0;
            sm.u.h.hi[d] = 0;
            sm.u.h.lo[d] = 0;
        }
        __syncthreads();
        u64 low_or = 0;
        for_columns(r, [&](int32_t i, float x, unsigned int f) {
            u64 key;
            double v, w;
            if (!eval_of(r, s, i, x, f, mask, P, v, key, w)) return;
            const int d = spread ? RADIX_BINS - 1 - spread_bin(r, s.raw, v) : (int)((key >> shift) & (u64)(nb - 1));
            atomicAdd(&sm.u.h.count[d], 1u);
            if (by_mass) {
                const fix128 wf = fix_of(w);
                const u64 old = atomicAdd(&sm.u.h.lo[d], wf.lo);
                atomicAdd(&sm.u.h.hi[d], wf.hi + (old + wf.lo < old ? 1 : 0));
            }
            low_or |= key & low;
        });
        bool any_low = __syncthreads_or(low_or != 0) != 0;
        if (t.n > 1) { /* the team's histograms summed (exactly: integers), into every block's */
            if (threadIdx.x == 0) sm.blk_any_low = any_low;
            team_sync(t); /* every block's histogram done */
            unsigned int cnt[RADIX_BINS / SAMPLE_THREADS];
            fix128 wsum[RADIX_BINS / SAMPLE_THREADS];
            int low_any = 0;
#pragma unroll
            for (int k = 0; k < RADIX_BINS / SAMPLE_THREADS; k++) {
                cnt[k] = 0;
                wsum[k] = fix_zero();
            }
            for (int q = 0; q < t.n; q++) {
                const sample_smem *o = team_at(t, &sm, q);
                low_any |= o->blk_any_low;
#pragma unroll
                for (int k = 0; k < RADIX_BINS / SAMPLE_THREADS; k++) {
                    const int d = threadIdx.x + k * SAMPLE_THREADS;
                    if (d >= nb) continue;
                    cnt[k] += o->u.h.count[d];
                    if (by_mass) wsum[k] = fix_add(wsum[k], fix128{o->u.h.hi[d], o->u.h.lo[d]});
                }
            }
            team_sync(t); /* every block done reading the others' */
#pragma unroll
            for (int k = 0; k < RADIX_BINS / SAMPLE_THREADS; k++) {
                const int d = threadIdx.x + k * SAMPLE_THREADS;
                if (d >= nb) continue;
                sm.u.h.count[d] = cnt[k];
                sm.u.h.hi[d] = wsum[k].hi;
                sm.u.h.lo[d] = wsum[k].lo;
            }
            any_low = low_any != 0;
            __syncthreads();
        }
        if (warp == 0) {
            /* digits from the largest down; lane l takes rank-order bins [l per, (l+1) per) */
            const int per = nb / WARP_SIZE;
            fix128 sum = fix_zero();
            uint32_t cnt = 0;
            for (int q = lane * per; q < (lane + 1) * per; q++) {
                const int d = nb - 1 - q;
                cnt += sm.u.h.count[d];
                if (by_mass) sum = fix_add(sum, fix128{sm.u.h.hi[d], sm.u.h.lo[d]});
            }
            if (!by_mass) sum = fix128{0, cnt};
            fix128 incl = sum;
            uint32_t cincl = cnt;
            for (int d = 1; d < WARP_SIZE; d <<= 1) {
                const fix128 o = shfl_up_fix(incl, d);
                const uint32_t co = __shfl_up_sync(0xffffffffu, cincl, d);
                if (lane >= d) {
                    incl = fix_add(incl, o);
                    cincl += co;
                }
            }
            fix128 target = sm.sel_target;
            if (spread && by_mass) {
                const fix128 total = {__shfl_sync(0xffffffffu, incl.hi, WARP_SIZE - 1),
                                      __shfl_sync(0xffffffffu, incl.lo, WARP_SIZE - 1)};
                target = fix_of(__dmul_rn(frac, fix_double(total)));
            }
            const fix128 before = sm.sel_mass_before;
            const int32_t cbefore = sm.sel_count_before;
            const fix128 upto = fix_add(before, incl);
            const bool hit = cnt > 0 && (strict ? fix_gt(upto, target) : fix_ge(upto, target));
            const unsigned int reached = __ballot_sync(0xffffffffu, hit);
            const unsigned int nonempty = __ballot_sync(0xffffffffu, cnt > 0);
            /* the lane of the answer: the first that reaches; when rounding leaves the target
             * unreached, the lane of the last non-empty bin */
            const int who = reached ? __ffs(reached) - 1 : 31 - __clz(nonempty);
            __syncwarp(); /* every lane has read sm.sel_* above before lane who rewrites them */
            if (lane == who) {
                fix128 acc = fix_add(before, fix_sub(incl, sum)), acc_last = acc;
                int32_t cacc = cbefore + (int32_t)(cincl - cnt), cacc_last = cacc;
                int pick = -1, last = -1;
                for (int q = lane * per; q < (lane + 1) * per; q++) {
                    const int d = nb - 1 - q;
                    const uint32_t c = sm.u.h.count[d];
                    if (c == 0) continue;
                    const fix128 a2 = fix_add(acc, by_mass ? fix128{sm.u.h.hi[d], sm.u.h.lo[d]} : fix128{0, c});
                    if (reached && (strict ? fix_gt(a2, target) : fix_ge(a2, target))) {
                        pick = d;
                        break;
                    }
                    last = d;
                    acc_last = acc;
                    cacc_last = cacc;
                    acc = a2;
                    cacc += (int32_t)c;
                }
                if (pick < 0) {
                    pick = last;
                    acc = acc_last;
                    cacc = cacc_last;
                }
                sm.sel_digit = pick;
                sm.sel_bin_count = (int32_t)sm.u.h.count[pick];
                sm.sel_mass_before = acc;
                sm.sel_count_before = cacc;
                sm.sel_target = target;
            }
        }
        __syncthreads();
        const int32_t bin_count = sm.sel_bin_count;
        if (spread) s.bin = RADIX_BINS - 1 - sm.sel_digit;
        else {
            P |= (u64)sm.sel_digit << shift;
            mask |= (u64)(nb - 1) << shift;
        }
        if (bin_count <= LIST_CAP) { /* few enough: finish in shared memory, in rank order */
            list_gather_sort(sm, t, r, s, mask, P);
            if (warp == 0) {
                const int32_t p = list_find(sm, sm.n_list, sm.sel_mass_before, sm.sel_target, by_mass, strict);
                if (lane == 0) {
                    sm.sel_key = sm.u.l.key[p];
                    sm.sel_id = sm.u.l.id[p];
                    sm.sel_pos = sm.sel_count_before + p + 1;
                }
            }
            __syncthreads();
            res.key = sm.sel_key;
            res.id = sm.sel_id;
            res.pos = sm.sel_pos;
            __syncthreads();
            return res;
        }
        if (!spread && (!any_low || shift == 0)) { /* a tie group: every candidate left has key P */
            if (threadIdx.x == 0) {
                int32_t j = bin_count; /* the smallest j whose running amount reaches; the last if none */
                const fix128 unit = by_mass ? fix_of(weight_of(r, value_of(P))) : fix128{0, 1};
                int32_t lo = 1, hi = bin_count;
                while (lo < hi) {
                    const int32_t mid = lo + (hi - lo) / 2;
                    const fix128 a = fix_add(sm.sel_mass_before, fix_mul(unit, (u64)mid));
                    if (strict ? fix_gt(a, sm.sel_target) : fix_ge(a, sm.sel_target)) hi = mid;
                    else lo = mid + 1;
                }
                j = lo;
                sm.sel_pos = j;
            }
            __syncthreads();
            const int32_t j = sm.sel_pos;
            res.id = nth_id_with_key(sm, r, s, P, j);
            res.key = P;
            res.pos = sm.sel_count_before + j;
            __syncthreads();
            return res;
        }
    }
}

// ----------------------------------------------------------------------------
// CUDA kernel: block b samples rows b, b + gridDim.x, ...

/* The range checks of tp_sampling_params_validate, plus the row's own fields. */
__device__ __forceinline__ bool row_valid(const tp_sample_row &R, const int32_t *tokens)
{
    const bool ok = R.temperature >= 0.0 && isfinite(R.temperature) && R.top_k >= -1 && R.top_p > 0.0 &&
                    R.top_p <= 1.0 && R.min_p >= 0.0 && R.min_p <= 1.0 && R.repetition_penalty > 0.0 &&
                    isfinite(R.repetition_penalty) && R.presence_penalty >= -2.0 && R.presence_penalty <= 2.0 &&
                    R.frequency_penalty >= -2.0 && R.frequency_penalty <= 2.0 && R.n_logprobs >= -1 &&
                    R.n_logprobs <= TP_SAMPLE_MAX_LOGPROBS && R.tokens >= 0 && R.n_prompt >= 0 &&
                    R.n_output >= 0 && R.n_output <= (int32_t)F_COUNT && R.banned >= 0 && R.n_banned >= 0 && R.allowed >= 0 &&
                    R.n_allowed >= 0 && R.bias >= 0 && R.n_bias >= 0;
    return ok && (tokens || ((int64_t)R.n_prompt + R.n_output == 0 && R.n_banned == 0 && R.n_allowed == 0 &&
                             R.n_bias == 0));
}

/* Mark (on) or clear the row's penalty ids and edits in the flags (on: the biases into fb);
 * on: a token outside [0, V) or a bias that is not finite is a fault (and skipped). Returns,
 * to every thread, whether one was. */
__device__ bool row_flags(unsigned int *fl, float *fb, const tp_sample_row &R, const int32_t *tokens, bool pen,
                          int32_t V, bool on, int32_t row, tp_cuda_fault *fault)
{
    int bad = 0;
    const int32_t n_pen = pen ? R.n_prompt + R.n_output : 0;
    const int32_t e_ban = n_pen + R.n_banned, e_allow = e_ban + R.n_allowed, e_bias = e_allow + R.n_bias;
    for (int32_t k = threadIdx.x; k < e_bias; k += blockDim.x) {
        const int32_t t = k < n_pen     ? tokens[R.tokens + k]
                          : k < e_ban   ? tokens[R.banned + (k - n_pen)]
                          : k < e_allow ? tokens[R.allowed + (k - e_ban)]
                                        : tokens[R.bias + (k - e_allow)];
        if (t < 0 || t >= V) {
            if (on) fault_record(fault, TP_CUDA_FAULT_SAMPLE_TOKEN, row, t, V);
            bad = 1;
            continue;
        }
        if (!on) fl[t] = 0u;
        else if (k >= e_allow) {
            const float b = __int_as_float(tokens[R.bias + R.n_bias + (k - e_allow)]);
            if (!isfinite(b)) {
                fault_record(fault, TP_CUDA_FAULT_SAMPLE_PARAM, row, t, V);
                bad = 1;
                continue;
            }
            fb[t] = b; /* ids are distinct: one writer a column */
            atomicOr(&fl[t], F_BIAS);
        }
        else if (k >= e_ban) atomicOr(&fl[t], F_ALLOWED);
        else if (k >= n_pen) atomicOr(&fl[t], F_BANNED);
        else if (k >= R.n_prompt) {
            atomicAdd(&fl[t], 1u); /* the count never reaches the flag bits: n_output <= F_COUNT */
            atomicOr(&fl[t], F_SEEN);
        }
        else atomicOr(&fl[t], F_SEEN);
    }
    return __syncthreads_or(bad) != 0;
}

__device__ __forceinline__ void write_failed(tp_sample_out *o, int32_t token)
{
    o->token = token;
    o->logprob = __int_as_float(0x7fc00000);
    o->n_top = 0;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(tp_tensor logits, int32_t L, const tp_sample_row *rows, const int32_t *tokens, tp_sample_out *out,
              unsigned int *flags, tp_cuda_fault *fault)
{
    __shared__ sample_smem sm;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    const int32_t V = (int32_t)logits.cols;
    const team tm = team_of();
    const bool lead = tm.rank == 0; /* the team's block that sets the flags and writes the result */
    const int32_t team_id = (int32_t)(blockIdx.x / tm.n), teams = (int32_t)(gridDim.x / tm.n);
    unsigned int *fl = flags + (size_t)team_id * 2 * (size_t)V; /* V flags, then V biases */
    float *fb = reinterpret_cast<float *>(fl + V);
    /* this block's columns: the row in tm.n shares of whole warps' width */
    const int32_t share = (int32_t)(((V + tm.n - 1) / tm.n + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE);
    const int32_t c0 = min(V, tm.rank * share), c1 = min(V, c0 + share);
    for (int32_t row = team_id; row < L; row += teams) {
        team_sync(tm); /* the previous row's shared memory and flags are done with */
        const tp_sample_row R = rows[row];
        if (!row_valid(R, tokens)) {
            if (lead && threadIdx.x == 0) {
                fault_record(fault, TP_CUDA_FAULT_SAMPLE_PARAM, row, 0, 0);
                write_failed(out + row, -1);
            }
            continue;
        }
        const bool pen = R.repetition_penalty != 1.0 || R.frequency_penalty != 0.0 || R.presence_penalty != 0.0;
        const bool use_flags = pen || R.n_banned > 0 || R.n_allowed > 0 || R.n_bias > 0;
        if (use_flags) { /* the lead sets them; a bad id or bias fails the row for the team */
            if (lead) {
                const bool bad_flags = row_flags(fl, fb, R, tokens, pen, V, true, row, fault);
                if (threadIdx.x == 0) sm.blk_flags_bad = bad_flags;
            }
            team_sync(tm); /* the flags set, for every block */
            if (team_at(tm, &sm, 0)->blk_flags_bad) {
                if (lead) {
                    row_flags(fl, fb, R, tokens, pen, V, false, row, fault);
                    if (threadIdx.x == 0) write_failed(out + row, -1);
                }
                continue;
            }
        }
        row_ctx rc;
        rc.x = row_of<const float>(logits, row);
        rc.c0 = c0;
        rc.c1 = c1;
        rc.flags = use_flags ? fl : NULL;
        rc.bias = fb;
        rc.allow_list = R.n_allowed > 0;
        rc.V = V;
        rc.pen = pen;
        rc.rep = R.repetition_penalty;
        rc.freq = R.frequency_penalty;
        rc.pres = R.presence_penalty;
        rc.temperature = R.temperature;
        rc.best = rc.top_raw = rc.scale_raw = rc.scale_v = 0.0;

        /* 1. NaN/+Inf, raw log-sum-exp (where logprobs are wanted: a double exp a column is
         * most of this pass), argmax of v, live count, the least finite raw logit and live
         * value (the spread bins' ranges): one pass */
        const bool want_lp = R.n_logprobs >= 0;
        row_sums mine = row_sums::none();
        for_columns(rc, [&](int32_t i, float x, unsigned int f) {
            if (isnan(x) || x == INFINITY) {
                if (mine.bad == INT32_MAX) mine.bad = i;
                return;
            }
            const double rr = x;
            if (!want_lp) mine.m = fmax(mine.m, rr);
            else if (rr > mine.m) {
                mine.s = mine.s * exp(mine.m - rr) + 1.0;
                mine.m = rr;
            } else if (rr != -INFINITY) {
                mine.s += exp(rr - mine.m);
            }
            if (rr != -INFINITY) mine.xmin = fmin(mine.xmin, rr);
            const double v = value_at(rc, i, x, f);
            if (v > mine.best) {
                mine.best = v;
                mine.arg = i;
            }
            if (v != -INFINITY) {
                mine.live++;
                mine.vmin = fmin(mine.vmin, v);
            }
        });
        for (int o = WARP_SIZE / 2; o > 0; o >>= 1) mine.add(mine.from_lane(o));
        if (lane == 0) sm.red[warp] = mine;
        __syncthreads();
        if (threadIdx.x == 0) { /* in warp order: the same sums whatever the timing */
            row_sums blk = row_sums::none();
            for (int q = 0; q < nw; q++) blk.add(sm.red[q]);
            sm.blk = blk;
        }
        team_sync(tm); /* every block's share summed */
        if (threadIdx.x == 0) { /* the team's, in rank order (every block the same) */
            row_sums row = row_sums::none();
            for (int q = 0; q < tm.n; q++) {
                const row_sums o = team_at(tm, &sm, q)->blk; /* its loads together, then the sums */
                row.add(o);
            }
            sm.m = row.m;
            sm.s = row.s;
            sm.best = row.best;
            sm.arg = row.arg == INT32_MAX ? 0 : row.arg; /* all -inf: token 0, as the sampler */
            sm.n_live = row.live;
            sm.bad = row.bad;
            sm.scale_raw = spread_scale(row.m, row.xmin);
            sm.scale_v = spread_scale(row.best, row.vmin);
        }
        __syncthreads();
        if (sm.bad != INT32_MAX) {
            if (lead) {
                if (threadIdx.x == 0) {
                    unsigned int f;
                    const float x = raw_at(rc, sm.bad, f);
                    fault_record(fault, isnan(x) ? TP_CUDA_FAULT_SAMPLE_NAN : TP_CUDA_FAULT_SAMPLE_INF, row, sm.bad, V);
                    write_failed(out + row, sm.bad);
                }
                if (use_flags) row_flags(fl, fb, R, tokens, pen, V, false, row, fault);
            }
            continue;
        }
        rc.best = sm.best;
        rc.top_raw = sm.m;
        rc.scale_raw = sm.scale_raw;
        rc.scale_v = sm.scale_v;
        const int32_t n_live = sm.n_live;

        /* 2. top-N raw logprobs: the N-th by (raw desc, id asc), then the N in rank order */
        const int32_t n_top = max(0, min(R.n_logprobs, V));
        if (n_top > 0) {
            const cand_set all_raw = {0, INT32_MAX, true, false, 0.0, -1};
            const sel_result t = radix_select(sm, tm, rc, all_raw, false, n_top, 0.0, false);
            const cand_set first = {t.key, t.id, true, false, 0.0, -1};
            list_gather_sort(sm, tm, rc, first, 0, 0);
            if (threadIdx.x < n_top) {
                sm.top_id[threadIdx.x] = sm.u.l.id[threadIdx.x];
                sm.top_x[threadIdx.x] = (float)value_of(sm.u.l.key[threadIdx.x]);
            }
            __syncthreads();
        }

        /* 3. the token */
        int32_t token = sm.arg;
        const bool greedy = R.temperature < GREEDY_TEMPERATURE || R.top_k == 1;
        if (!greedy && n_live > 1) {
            const cand_set live_set = {KEY_NEG_INF, -1, false, false, 0.0, -1};
            const bool cut = R.top_k > 0 && R.top_k < n_live;
            const int32_t nk = cut ? R.top_k : n_live;
            cand_set ks = live_set;
            if (cut) { /* top-k ranks v, which temperature does not reorder */
                const sel_result k = radix_select(sm, tm, rc, live_set, false, nk, 0.0, false);
                ks.T = k.key;
                ks.c = k.id;
            }
            const double u = stream_unit(R.seed, R.step);
            cand_set ls = ks;      /* the set the list holds, */
            int32_t n_list = nk;   /* its size */
            bool p_cut = false;    /* top-p already applied to it */
            if (nk > LIST_CAP) {   /* the whole row: selects by mass */
                cand_set ws = ks;
                ws.weights = true;
                if (R.top_p < 1.0) {
                    const sel_result t = radix_select(sm, tm, rc, ws, true, 0, R.top_p, false);
                    ws.T = t.key;
                    ws.c = t.id;
                    if (t.pos <= LIST_CAP) { /* few left (a trained model's usual top-p set): the list */
                        ls.T = t.key;
                        ls.c = t.id;
                        n_list = t.pos;
                        p_cut = true;
                    }
                }
                if (!p_cut) {
                    ws.wmin = R.min_p; /* the best weighs 1 >= min_p: never empties the set */
                    token = radix_select(sm, tm, rc, ws, true, 0, u, true).id;
                }
            }
            if (n_list <= LIST_CAP) { /* the rest on the sorted list */
                list_gather_sort(sm, tm, rc, ls, 0, 0);
                for (int32_t p = threadIdx.x; p < n_list; p += blockDim.x)
                    sm.u.l.w[p] = weight_of(rc, value_of(sm.u.l.key[p]));
                __syncthreads();
                if (warp == 0) {
                    int32_t keep = 0; /* weights never grow along the list: w > 0 is a prefix */
                    for (int32_t p = lane; p < n_list; p += WARP_SIZE) keep += sm.u.l.w[p] > 0.0;
                    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) keep += __shfl_xor_sync(0xffffffffu, keep, o);
                    if (R.top_p < 1.0 && !p_cut && keep > 1) {
                        const fix128 z = list_mass(sm, keep);
                        keep = list_find(sm, keep, fix_zero(), fix_of(__dmul_rn(R.top_p, fix_double(z))), true, false) + 1;
                    }
                    if (R.min_p > 0.0 && keep > 1) {
                        int32_t k2 = 0;
                        for (int32_t p = lane; p < keep; p += WARP_SIZE) k2 += sm.u.l.w[p] >= R.min_p;
                        for (int o = WARP_SIZE / 2; o > 0; o >>= 1) k2 += __shfl_xor_sync(0xffffffffu, k2, o);
                        keep = k2;
                    }
                    int32_t p = 0;
                    if (keep > 1) {
                        const fix128 z = list_mass(sm, keep);
                        p = list_find(sm, keep, fix_zero(), fix_of(__dmul_rn(u, fix_double(z))), true, true);
                    }
                    if (lane == 0) sm.sel_id = sm.u.l.id[p];
                }
                __syncthreads();
                token = sm.sel_id;
            }
        }

        /* 4. the result: raw logprobs, as vLLM's default logprobs_mode */
        if (lead && threadIdx.x == 0) {
            const bool none_live = sm.m == -INFINITY;
            const double lse = none_live ? 0.0 : sm.m + log(sm.s);
            const double uniform = -log((double)V);
            unsigned int f;
            const float xt = raw_at(rc, token, f);
            tp_sample_out *o = out + row;
            o->token = token;
            o->logprob = !want_lp ? 0.0f : (float)(none_live ? uniform : (double)xt - lse);
            o->n_top = n_top;
            for (int32_t k = 0; k < n_top; k++) {
                o->top_id[k] = sm.top_id[k];
                o->top_logprob[k] = (float)(none_live ? uniform : (double)sm.top_x[k] - lse);
            }
        }
        if (use_flags) {
            team_sync(tm); /* every block done reading the flags */
            if (lead) row_flags(fl, fb, R, tokens, pen, V, false, row, fault);
        }
    }
    team_sync(tm); /* no block leaves while another may read its shared memory */
}

// ----------------------------------------------------------------------------
// launcher

/* A launch of sample_kernel as clusters of n blocks (a config pointing into itself: not copied) */
struct team_launch {
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg;
    team_launch(int n, int grid, cudaStream_t stream) : cfg()
    {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned int)n;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned int)grid);
        cfg.blockDim = dim3(SAMPLE_THREADS);
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
};

/* The most blocks a team may have on this device (a power of 2, 1 without clusters): the
 * kernel built for sm_90 or later, the device launching clusters, and a cluster of that
 * many of its blocks fitting at once. Asked once per device. */
static int team_most(void)
{
    static int most[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
    if (most[dev]) return most[dev];
    int m = 1, can = 0;
    bool failed = false;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, sample_kernel) != cudaSuccess ||
        cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev) != cudaSuccess)
        failed = true;
    else if (fa.binaryVersion >= 90 && can)
        for (int n = SAMPLE_TEAM_MAX; n > 1 && m == 1; n /= 2) {
            const team_launch t(n, n, 0);
            int clusters = 0;
            if (cudaOccupancyMaxActiveClusters(&clusters, sample_kernel, &t.cfg) != cudaSuccess) failed = true;
            else if (clusters > 0) m = n;
        }
    if (failed) (void)cudaGetLastError(); /* a query that failed leaves no error behind: one row a block */
    most[dev] = m;
    return m;
}

extern "C" tp_status tp_cuda_sample(tp_tensor logits, int32_t L, const tp_sample_row *rows, const int32_t *tokens,
                                    tp_sample_out *out, unsigned int *flags, int blocks, tp_cuda_fault *fault,
                                    cudaStream_t stream)
{
    if (L <= 0) return TP_OK;
    if (logits.dtype != TP_DTYPE_F32 || logits.cols <= 0 || logits.cols > TP_CUDA_SAMPLE_MAX_VOCAB || logits.rows < L ||
        blocks <= 0 || !flags)
        return tp_error(TP_ERR_INTERNAL, "sample: logits [%lld, %lld] of %s (%d rows, %d blocks) reached the CUDA kernel",
                        (long long)logits.rows, (long long)logits.cols, tp_dtype_name(logits.dtype), (int)L, blocks);
    /* few rows: each row to a team of blocks (a cluster), so that they use more SMs */
    int team = 1;
    const int most = team_most();
    while (team * 2 <= most && (int64_t)L * team * 2 <= blocks) team *= 2;
    const int grid = (L < blocks / team ? (int)L : blocks / team) * team;
    if (team == 1) {
        sample_kernel<<<grid, SAMPLE_THREADS, 0, stream>>>(logits, L, rows, tokens, out, flags, fault);
        TP_CUDA_CHECK_LAUNCH();
        return TP_OK;
    }
    const team_launch t(team, grid, stream);
    TP_CUDA_CHECK(cudaLaunchKernelEx(&t.cfg, sample_kernel, logits, L, rows, tokens, out, flags, fault));
    return TP_OK;
}
