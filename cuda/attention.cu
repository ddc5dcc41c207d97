/*
 * attention.cu: causal grouped-query attention over the paged KV cache. Token i attends
 * to positions 0..pos[i] of sequence seq[i]; q head h reads KV head h / (q_heads /
 * kv_heads). Two kernels:
 *
 * flash (the fast path, flash-decoding): one block per (token, KV head, split) computes
 * all the q heads of that KV head (up to FA_MAX_GROUP; more are split over several
 * blocks), so each K and V row is read once per token and KV head, as 16-byte vectors.
 * Inside a block, lanes are grouped: LP lanes per position, each lane owning 16 bytes
 * (VPL of them for f32 head_dim 256) of the row, so a group's loads of a row are one
 * coalesced segment. Each group walks its own positions (every NG-th of the split, R = 4
 * at a time, 2 at 8 heads) with its own online softmax (running max m, sum l, acc[G][its dims] in f32
 * registers), with no block-wide synchronisation in the loop; q . k is a per-lane partial
 * dot summed over the group's lanes by xor shuffles, p . V is lanes over head dims. At
 * the end the groups of a warp merge by shuffles, the warps through shared memory. Scores
 * are in the log2 domain (q is prescaled by scale * log2 e; exp2f).
 * Split-KV: the host picks S splits from the launch's blocks against the SM count and
 * from max_pos (no split under FA_MIN_SPLIT positions); each token uses
 * se = min(S, (pos + 1) / FA_MIN_SPLIT) of them over its own context (so max_pos may be a
 * loose bound, as in CUDA graphs), split s covering [s*c, (s+1)*c), c = ceil((pos+1)/se).
 * With se > 1 the partials (m, l, acc) go to the scratch buffer and a second kernel
 * combines them; with se == 1 the block writes the output itself. Empty splits write
 * m = -inf; a split that met a bad block-table entry writes l = -1 (output zeros).
 *
 * simple (the fallback where the flash kernel does not go: head_dim over 256, or rows of
 * head_dim elements that are not a power of two of at least 16 bytes (e.g. 80, 96), or
 * caches not 16-byte aligned): one block per (token, q head), positions in chunks of
 * ATTN_CHUNK, one warp per position for the score.
 *
 * What only the device can check (sequence, position, block-table entries) is checked
 * here: a bad one is recorded as a fault, and the token's output is zeros.
 */
#include <math.h>
#include <stdlib.h>

#include <cuda_fp16.h>

#include "common.cuh"

#define ATTN_THREADS 128 /* simple kernel: 4 warps */
#define ATTN_CHUNK 64    /* positions per chunk; <= ATTN_THREADS */
#define ATTN_MAX_HEAD_DIM 4096

#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * WARP_SIZE)
#define FA_MAX_HEAD_DIM 256
#define FA_MAX_GROUP 8       /* q heads per block (registers: q and acc are [G][dims]) */
#define FA_MIN_SPLIT 32      /* positions: no split is shorter (TPINFER_ATTN_MIN_SPLIT) */
#define FA_MAX_SPLITS 1024
#define FA_BLOCKS_PER_SM 16  /* target blocks per SM when splitting (TPINFER_ATTN_BLOCKS_PER_SM): the
                              * loop over positions is latency-bound, more blocks hide it */
#define FA_COMBINE_THREADS 128

static int force_simple; /* tp_cuda_attention_force_simple(): benchmarks compare the two */

/* The split tuning, from the environment once (bench/gpu_attention sweeps it). */
static int env_int(const char *name, int fallback, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < lo || x > hi ? fallback : (int)x;
}

// ----------------------------------------------------------------------------
// shared by both kernels

/* The token's own indices; TP_CUDA_FAULT_NONE when they are usable. */
__device__ __forceinline__ int32_t token_fault(int32_t seq, int32_t pos, const tp_attn_batch &batch, int bs,
                                               int32_t *value, int32_t *limit)
{
    int32_t code = TP_CUDA_FAULT_NONE;
    if (seq < 0) code = TP_CUDA_FAULT_ATTN_SEQ, *value = seq, *limit = 0;
    else if (pos < 0 || pos >= batch.max_pos) code = TP_CUDA_FAULT_ATTN_POS, *value = pos, *limit = batch.max_pos;
    else if (pos / bs >= batch.max_blocks) code = TP_CUDA_FAULT_ATTN_TABLE, *value = pos, *limit = batch.max_blocks;
    return code;
}

/* q and out in any float dtype, chosen at run time (read once, written once per block) */
__device__ __forceinline__ float load_act(const void *p, int dt, int64_t idx)
{
    if (dt == TP_DTYPE_F32) return ((const float *)p)[idx];
    if (dt == TP_DTYPE_BF16) return to_f32(((const bf16_t *)p)[idx]);
    return to_f32(((const f16_t *)p)[idx]);
}

__device__ __forceinline__ void store_act(void *p, int dt, int64_t idx, float v)
{
    if (dt == TP_DTYPE_F32) ((float *)p)[idx] = v;
    else if (dt == TP_DTYPE_BF16) ((bf16_t *)p)[idx] = from_f32<bf16_t>(v);
    else ((f16_t *)p)[idx] = from_f32<f16_t>(v);
}

// ----------------------------------------------------------------------------
// the simple kernel: one block per (token, q head)

template <typename QT, typename CT, typename OT>
__global__ void __launch_bounds__(ATTN_THREADS)
    attention_simple_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads, float scale,
                            tp_tensor out, tp_cuda_fault *fault)
{
    extern __shared__ float smem[];
    __shared__ int64_t row_s[ATTN_CHUNK]; /* element offset of each position's K/V row; -1: bad */
    __shared__ int bad_s;
    const int hd = cache.head_dim, bs = cache.block_size;
    float *q_s = smem, *acc_s = smem + hd, *p_s = smem + 2 * hd; /* [hd], [hd], [ATTN_CHUNK] */

    const int64_t i = blockIdx.x / q_heads;
    const int h = (int)(blockIdx.x % q_heads), kh = h / (q_heads / cache.n_kv_heads);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    OT *o = row_of<OT>(out, i) + (int64_t)h * hd;

    /* the token's own indices: uniform over the block, so an early return is safe */
    const int32_t seq = batch.seq[i], pos = batch.pos[i];
    int32_t value = 0, limit = 0;
    const int32_t code = token_fault(seq, pos, batch, bs, &value, &limit);
    if (code != TP_CUDA_FAULT_NONE) {
        if (tid == 0) fault_record(fault, code, i, value, limit);
        for (int e = tid; e < hd; e += blockDim.x) o[e] = from_f32<OT>(0.0f);
        return;
    }

    const QT *qv = row_of<const QT>(q, i) + (int64_t)h * hd;
    for (int e = tid; e < hd; e += blockDim.x) {
        q_s[e] = to_f32(qv[e]);
        acc_s[e] = 0.0f;
    }
    if (tid == 0) bad_s = 0;
    __syncthreads();

    const int32_t *bt = batch.block_table + (int64_t)seq * batch.max_blocks;
    const int64_t width = (int64_t)cache.n_kv_heads * hd;
    const CT *kc = (const CT *)cache.k, *vc = (const CT *)cache.v;
    const int np = pos + 1;
    float m = -INFINITY, l = 0.0f; /* the same values in every thread */

    for (int p0 = 0; p0 < np; p0 += ATTN_CHUNK) {
        const int cnt = min(ATTN_CHUNK, np - p0);
        /* scores: one warp per position */
        for (int c = warp; c < cnt; c += nwarps) {
            const int p = p0 + c;
            const int32_t blk = bt[p / bs];
            if (blk < 0 || blk >= cache.n_blocks) { /* uniform over the warp */
                if (lane == 0) {
                    fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, i, blk, cache.n_blocks);
                    bad_s = 1;
                    row_s[c] = -1;
                    p_s[c] = -INFINITY;
                }
                continue;
            }
            const int64_t row = ((int64_t)blk * bs + p % bs) * width + (int64_t)kh * hd;
            const CT *kr = kc + row;
            float dot = 0.0f;
            for (int e = lane; e < hd; e += WARP_SIZE) dot += q_s[e] * to_f32(kr[e]);
            dot = warp_sum(dot);
            if (lane == 0) {
                row_s[c] = row;
                p_s[c] = scale * dot;
            }
        }
        __syncthreads();
        /* fold the chunk into the running softmax */
        float cmax = -INFINITY;
        for (int c = 0; c < cnt; c++) cmax = fmaxf(cmax, p_s[c]);
        const float m_new = fmaxf(m, cmax);
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        __syncthreads(); /* every thread has read the scores */
        if (tid < cnt) p_s[tid] = expf(p_s[tid] - m_new);
        __syncthreads();
        float csum = 0.0f;
        for (int c = 0; c < cnt; c++) csum += p_s[c];
        l = l * corr + csum;
        for (int e = tid; e < hd; e += blockDim.x) {
            float a = acc_s[e] * corr;
            for (int c = 0; c < cnt; c++)
                if (row_s[c] >= 0) a += p_s[c] * to_f32(vc[row_s[c] + e]);
            acc_s[e] = a;
        }
        m = m_new;
        __syncthreads(); /* before the next chunk overwrites p_s and row_s */
    }

    const bool bad = bad_s != 0;
    for (int e = tid; e < hd; e += blockDim.x) o[e] = from_f32<OT>(bad ? 0.0f : acc_s[e] / l);
}

// ----------------------------------------------------------------------------
// the flash kernels

/* What the host decided, passed by value. */
struct fa_params {
    int32_t q_heads, group; /* q heads in all; per KV head */
    int32_t gb, nhg;        /* q heads per block; blocks per KV head (gb * nhg >= group) */
    int32_t splits;         /* S: gridDim.y */
    int32_t min_split;      /* positions: no split of a token is shorter */
    int32_t lp_log2;        /* lanes per position: 1 << lp_log2 */
    float qscale;           /* scale * log2(e): scores in the log2 domain */
    float *part_acc;        /* [n_tokens * q_heads * S, head_dim] unnormalised acc */
    float *part_m, *part_l; /* [n_tokens * q_heads * S] */
};

/* 16 bytes of cache row as f32 */
template <typename CT> struct kv_vec;
template <> struct kv_vec<float> {
    static constexpr int VE = 4;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f)
    {
        f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
    }
};
template <> struct kv_vec<bf16_t> {
    static constexpr int VE = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f)
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) { /* little endian: the lower half is the even element */
            f[2 * k] = __uint_as_float(w[k] << 16);
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
};
template <> struct kv_vec<f16_t> {
    static constexpr int VE = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f)
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) { /* f16 -> f32 is exact: the hardware conversion is tp_convert's */
            f[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
            f[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
        }
    }
};

/* The splits a token of np positions uses: none shorter than FA_MIN_SPLIT (the host's S
 * is capped by max_pos, which may be a loose bound; this caps it by the token's length). */
__device__ __forceinline__ int token_splits(int np, int S, int min_split) { return max(1, min(S, np / min_split)); }

/* Block (token i, KV head kh, q-head group hg, split s): grid (n_tokens * kv_heads * nhg, S),
 * FA_THREADS threads, dynamic shared memory FA_WARPS * GMAX * (head_dim + 2) floats.
 * CT: cache element type; GMAX >= q heads per block (padded heads have q = 0 and are
 * not written); VPL: 16-byte vectors per lane (2 only for f32 at head_dim 256).
 * head_dim == (1 << lp_log2) * VPL * VE. */
template <typename CT, int GMAX, int VPL>
__global__ void __launch_bounds__(FA_THREADS)
    attention_flash_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, fa_params P, tp_tensor out,
                           tp_cuda_fault *fault)
{
    constexpr int VE = kv_vec<CT>::VE, D = VE * VPL; /* D: head dims per lane */
    constexpr int R = GMAX >= 8 ? 2 : 4;              /* positions per group per step (registers) */
    extern __shared__ float fa_smem[];
    const int hd = cache.head_dim, bs = cache.block_size;
    const int heads_x = cache.n_kv_heads * P.nhg;
    const int64_t i = blockIdx.x / heads_x;
    const int hx = (int)(blockIdx.x % heads_x), kh = hx / P.nhg, hg = hx % P.nhg;
    const int s = blockIdx.y, S = P.splits;
    const int h0 = kh * P.group + hg * P.gb, gn = min(P.gb, P.group - hg * P.gb); /* q heads h0 .. h0+gn-1 */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int LP = 1 << P.lp_log2, j = lane & (LP - 1);      /* lane j of its position group */
    const int PPW = WARP_SIZE >> P.lp_log2, NG = FA_WARPS * PPW; /* groups per warp, per block */
    const int grp = warp * PPW + (lane >> P.lp_log2);

    /* the token's own indices: uniform over the block, so an early return is safe */
    const int32_t seq = batch.seq[i], pos = batch.pos[i];
    int32_t value = 0, limit = 0;
    const int32_t code = token_fault(seq, pos, batch, bs, &value, &limit);
    if (code != TP_CUDA_FAULT_NONE) {
        if (tid == 0) fault_record(fault, code, i, value, limit);
        if (S == 1) /* no combine kernel: zero the output here */
            for (int e = tid; e < gn * hd; e += FA_THREADS)
                store_act(out.data, out.dtype, i * out.stride + (int64_t)h0 * hd + e, 0.0f);
        return;
    }
    const int np = pos + 1, se = token_splits(np, S, P.min_split);
    if (s >= se) return; /* a split this token does not use: the combine reads se splits */
    const int c = CEIL_DIV(np, se), b0 = s * c, b1 = min(np, b0 + c);
    const int64_t pbase = (i * P.q_heads + h0) * S + s; /* partial of head h0 + g: pbase + g * S */
    if (b0 >= b1) { /* an empty split (only with se > 1) */
        if (tid < gn) {
            P.part_m[pbase + (int64_t)tid * S] = -INFINITY;
            P.part_l[pbase + (int64_t)tid * S] = 0.0f;
        }
        return;
    }

    /* q of this lane's dims, prescaled; padded heads are zeros */
    float qf[GMAX][D];
#pragma unroll
    for (int g = 0; g < GMAX; g++)
#pragma unroll
        for (int u = 0; u < VPL; u++)
#pragma unroll
            for (int e = 0; e < VE; e++) {
                const int dim = (j + u * LP) * VE + e;
                qf[g][u * VE + e] =
                    g < gn ? P.qscale * load_act(q.data, q.dtype, i * q.stride + (int64_t)(h0 + g) * hd + dim) : 0.0f;
            }

    float m[GMAX], l[GMAX], acc[GMAX][D];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < D; d++) acc[g][d] = 0.0f;
    }
    bool bad = false;
    const int32_t *bt = batch.block_table + (int64_t)seq * batch.max_blocks;
    const int64_t width = (int64_t)cache.n_kv_heads * hd;
    const CT *kc = (const CT *)cache.k + (int64_t)kh * hd, *vc = (const CT *)cache.v + (int64_t)kh * hd;

    /* step: the block takes R * NG positions from t0; this group every NG-th from t0 + grp.
     * Block-table entries are read one step ahead, so that their latency hides behind the
     * step's K/V loads. */
    int32_t blk[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int p = b0 + r * NG + grp;
        blk[r] = p < b1 ? __ldg(bt + p / bs) : 0;
    }
    for (int t0 = b0; t0 < b1; t0 += R * NG) {
        int64_t row[R];
        bool ok[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int p = t0 + r * NG + grp;
            ok[r] = p < b1;
            row[r] = 0;
            if (ok[r]) { /* uniform over the group */
                if (blk[r] < 0 || blk[r] >= cache.n_blocks) {
                    if (j == 0) fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, i, blk[r], cache.n_blocks);
                    bad = true;
                    ok[r] = false;
                } else {
                    row[r] = ((int64_t)blk[r] * bs + p % bs) * width;
                }
            }
        }
        /* every load of the step first, K and V (V does not wait for the scores) */
        uint4 kraw[R][VPL], vraw[R][VPL];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < VPL; u++) {
                const int64_t at = row[r] + (int64_t)(j + u * LP) * VE;
                kraw[r][u] = ok[r] ? __ldg((const uint4 *)(kc + at)) : make_uint4(0, 0, 0, 0);
                vraw[r][u] = ok[r] ? __ldg((const uint4 *)(vc + at)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int r = 0; r < R; r++) { /* the next step's entries */
            const int p = t0 + (R + r) * NG + grp;
            blk[r] = p < b1 ? __ldg(bt + p / bs) : 0;
        }
        /* scores: this lane's partial dots, summed over the group's LP lanes */
        float sc[R][GMAX];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float kf[D];
#pragma unroll
            for (int u = 0; u < VPL; u++) kv_vec<CT>::unpack(kraw[r][u], kf + u * VE);
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < D; d++) dot = fmaf(qf[g][d], kf[d], dot);
                sc[r][g] = dot;
            }
        }
        for (int o = LP >> 1; o > 0; o >>= 1)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int g = 0; g < GMAX; g++) sc[r][g] += __shfl_xor_sync(0xffffffffu, sc[r][g], o);
        /* online softmax: sc becomes p = exp2(score - m_new) */
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            float mx = m[g];
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!ok[r]) sc[r][g] = -INFINITY;
                mx = fmaxf(mx, sc[r][g]);
            }
            const float mref = mx == -INFINITY ? 0.0f : mx; /* nothing seen yet: every p is 0 */
            const float corr = exp2f(m[g] - mref);           /* 0 while m is -inf */
            float psum = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                sc[r][g] = exp2f(sc[r][g] - mref);
                psum += sc[r][g];
            }
            l[g] = l[g] * corr + psum;
            m[g] = mx;
#pragma unroll
            for (int d = 0; d < D; d++) acc[g][d] *= corr;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float vf[D];
#pragma unroll
            for (int u = 0; u < VPL; u++) kv_vec<CT>::unpack(vraw[r][u], vf + u * VE);
#pragma unroll
            for (int g = 0; g < GMAX; g++)
#pragma unroll
                for (int d = 0; d < D; d++) acc[g][d] = fmaf(sc[r][g], vf[d], acc[g][d]);
        }
    }

    /* merge the groups of the warp: lanes lane and lane ^ o own the same dims */
    for (int o = LP; o < WARP_SIZE; o <<= 1)
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mx = fmaxf(m[g], mo), mref = mx == -INFINITY ? 0.0f : mx;
            const float c1 = exp2f(m[g] - mref), c2 = exp2f(mo - mref);
            l[g] = l[g] * c1 + lo * c2;
            m[g] = mx;
#pragma unroll
            for (int d = 0; d < D; d++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][d], o);
                acc[g][d] = acc[g][d] * c1 + ao * c2;
            }
        }

    /* merge the warps through shared memory: acc [FA_WARPS][GMAX][hd], m and l [FA_WARPS][GMAX] */
    float *sacc = fa_smem, *sm = fa_smem + FA_WARPS * GMAX * hd, *sl = sm + FA_WARPS * GMAX;
    if (lane < LP) { /* the warp's first group */
#pragma unroll
        for (int g = 0; g < GMAX; g++)
#pragma unroll
            for (int u = 0; u < VPL; u++)
#pragma unroll
                for (int e = 0; e < VE; e++)
                    sacc[(warp * GMAX + g) * hd + (j + u * LP) * VE + e] = acc[g][u * VE + e];
        if (lane == 0)
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                sm[warp * GMAX + g] = m[g];
                sl[warp * GMAX + g] = l[g];
            }
    }
    const bool any_bad = __syncthreads_or(bad) != 0;
    const bool direct = se == 1;
    for (int e = tid; e < gn * hd; e += FA_THREADS) {
        const int g = e / hd, d = e % hd;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < FA_WARPS; w++) M = fmaxf(M, sm[w * GMAX + g]);
        const float mref = M == -INFINITY ? 0.0f : M;
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int w = 0; w < FA_WARPS; w++) {
            const float cw = exp2f(sm[w * GMAX + g] - mref); /* 0 for a warp that saw nothing */
            L += sl[w * GMAX + g] * cw;
            A += sacc[(w * GMAX + g) * hd + d] * cw;
        }
        if (direct) {
            store_act(out.data, out.dtype, i * out.stride + (int64_t)(h0 + g) * hd + d, any_bad ? 0.0f : A / L);
        } else {
            const int64_t pi = pbase + (int64_t)g * S;
            P.part_acc[pi * hd + d] = A;
            if (d == 0) {
                P.part_m[pi] = M;
                P.part_l[pi] = any_bad ? -1.0f : L;
            }
        }
    }
}

/* out[i, head h] from the partials of the token's se splits: grid n_tokens * q_heads,
 * FA_COMBINE_THREADS threads. Tokens with se == 1 were written by the flash kernel; a bad
 * token (its fault already recorded) or a split that met a bad block gives zeros. */
__global__ void __launch_bounds__(FA_COMBINE_THREADS)
    attention_combine_kernel(tp_attn_batch batch, int32_t block_size, int32_t head_dim, fa_params P, tp_tensor out)
{
    const int64_t i = blockIdx.x / P.q_heads;
    const int h = (int)(blockIdx.x % P.q_heads), hd = head_dim, S = P.splits;
    const int64_t o = i * out.stride + (int64_t)h * hd;
    int32_t value = 0, limit = 0;
    const int32_t pos = batch.pos[i];
    bool zero = token_fault(batch.seq[i], pos, batch, block_size, &value, &limit) != TP_CUDA_FAULT_NONE;
    int se = 0;
    const int64_t pbase = (i * P.q_heads + h) * S;
    float M = -INFINITY;
    if (!zero) {
        se = token_splits(pos + 1, S, P.min_split);
        if (se == 1) return;
        for (int s = 0; s < se; s++) {
            if (P.part_l[pbase + s] < 0.0f) zero = true;
            M = fmaxf(M, P.part_m[pbase + s]);
        }
    }
    if (zero) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) store_act(out.data, out.dtype, o + d, 0.0f);
        return;
    }
    const float mref = M == -INFINITY ? 0.0f : M;
    float L = 0.0f;
    for (int s = 0; s < se; s++) {
        const float ms = P.part_m[pbase + s];
        if (ms != -INFINITY) L += P.part_l[pbase + s] * exp2f(ms - mref);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        for (int s = 0; s < se; s++) {
            const float ms = P.part_m[pbase + s];
            if (ms != -INFINITY) A += P.part_acc[(pbase + s) * hd + d] * exp2f(ms - mref); /* empty: acc unwritten */
        }
        store_act(out.data, out.dtype, o + d, A / L);
    }
}

// ----------------------------------------------------------------------------
// launchers

extern "C" void tp_cuda_attention_force_simple(int on) { force_simple = on; }

/* log2 of the lanes per position when the flash kernel takes this cache, else -1 (vpl:
 * 16-byte vectors per lane). */
static int flash_lanes_log2(const tp_kv_layer &cache, int *vpl)
{
    const int hd = cache.head_dim, ve = 16 / (int)tp_dtype_size(cache.dtype);
    if (hd <= 0 || hd > FA_MAX_HEAD_DIM || hd % ve != 0) return -1;
    if ((uintptr_t)cache.k % 16 != 0 || (uintptr_t)cache.v % 16 != 0) return -1;
    int nv = hd / ve;
    *vpl = 1;
    if (nv > WARP_SIZE) {
        if (nv != 2 * WARP_SIZE) return -1;
        *vpl = 2, nv = WARP_SIZE;
    }
    if (nv & (nv - 1)) return -1; /* lanes per position must divide the warp */
    int lg = 0;
    while ((1 << lg) < nv) lg++;
    return lg;
}

template <typename CT, int GMAX, int VPL>
static void launch_flash(dim3 grid, size_t smem, tp_tensor q, tp_kv_layer cache, tp_attn_batch batch,
                         const fa_params &P, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    attention_flash_kernel<CT, GMAX, VPL><<<grid, FA_THREADS, smem, stream>>>(q, cache, batch, P, out, fault);
}

template <typename CT, int VPL>
static void launch_flash_g(int gmax, dim3 grid, size_t smem, tp_tensor q, tp_kv_layer cache, tp_attn_batch batch,
                           const fa_params &P, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    switch (gmax) {
    case 1: launch_flash<CT, 1, VPL>(grid, smem, q, cache, batch, P, out, fault, stream); break;
    case 2: launch_flash<CT, 2, VPL>(grid, smem, q, cache, batch, P, out, fault, stream); break;
    case 4: launch_flash<CT, 4, VPL>(grid, smem, q, cache, batch, P, out, fault, stream); break;
    default: launch_flash<CT, 8, VPL>(grid, smem, q, cache, batch, P, out, fault, stream); break;
    }
}

static tp_status attention_flash(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                 float scale, tp_tensor out, tp_cuda_attn_scratch scratch, int lp_log2, int vpl,
                                 tp_cuda_fault *fault, cudaStream_t stream)
{
    const int64_t n = batch.n_tokens, kvh = cache.n_kv_heads, hd = cache.head_dim;
    const int group = q_heads / (int)kvh;
    /* q heads per block: the group, or an even share of it in blocks of at most FA_MAX_GROUP */
    const int gb = CEIL_DIV(group, CEIL_DIV(group, FA_MAX_GROUP)), nhg = CEIL_DIV(group, gb);
    const int gmax = gb <= 1 ? 1 : gb <= 2 ? 2 : gb <= 4 ? 4 : 8;
    const int64_t base = n * kvh * nhg; /* blocks without splitting */
    if (base > INT32_MAX)
        return tp_error(TP_ERR_UNSUPPORTED, "attention: %lld (token, KV head) blocks is too many", (long long)base);

    /* splits: enough blocks for ~2 waves, none under FA_MIN_SPLIT positions, partials that fit */
    static int min_split = 0, blocks_per_sm = 0;
    if (!min_split) {
        min_split = env_int("TPINFER_ATTN_MIN_SPLIT", FA_MIN_SPLIT, 8, 1 << 20);
        blocks_per_sm = env_int("TPINFER_ATTN_BLOCKS_PER_SM", FA_BLOCKS_PER_SM, 1, 1024);
    }
    int64_t S = 1;
    const int64_t target = (int64_t)blocks_per_sm * (scratch.sm_count > 0 ? scratch.sm_count : 1);
    if (scratch.data && base < target) {
        S = CEIL_DIV(target, base);
        S = S < batch.max_pos / min_split ? S : batch.max_pos / min_split;
        S = S < FA_MAX_SPLITS ? S : FA_MAX_SPLITS;
        const int64_t per_split = n * q_heads * (hd + 2) * (int64_t)sizeof(float);
        const int64_t fit = (int64_t)(scratch.bytes / (size_t)per_split);
        S = S < fit ? S : fit;
        if (S < 1) S = 1;
    }

    fa_params P;
    P.q_heads = q_heads;
    P.group = group;
    P.gb = gb;
    P.nhg = nhg;
    P.splits = (int32_t)S;
    P.min_split = min_split;
    P.lp_log2 = lp_log2;
    P.qscale = scale * 1.4426950408889634f; /* log2(e) */
    P.part_acc = (float *)scratch.data;
    P.part_m = P.part_acc ? P.part_acc + n * q_heads * S * hd : NULL;
    P.part_l = P.part_m ? P.part_m + n * q_heads * S : NULL;

    const dim3 grid((unsigned)base, (unsigned)S);
    const size_t smem = (size_t)FA_WARPS * gmax * (hd + 2) * sizeof(float);
    switch (cache.dtype) {
    case TP_DTYPE_F32:
        if (vpl == 2) launch_flash_g<float, 2>(gmax, grid, smem, q, cache, batch, P, out, fault, stream);
        else launch_flash_g<float, 1>(gmax, grid, smem, q, cache, batch, P, out, fault, stream);
        break;
    case TP_DTYPE_BF16: launch_flash_g<bf16_t, 1>(gmax, grid, smem, q, cache, batch, P, out, fault, stream); break;
    case TP_DTYPE_F16: launch_flash_g<f16_t, 1>(gmax, grid, smem, q, cache, batch, P, out, fault, stream); break;
    default: return TP_CUDA_BAD_DTYPE("attention");
    }
    TP_CUDA_CHECK_LAUNCH();
    if (S > 1) {
        attention_combine_kernel<<<(unsigned)(n * q_heads), FA_COMBINE_THREADS, 0, stream>>>(
            batch, cache.block_size, cache.head_dim, P, out);
        TP_CUDA_CHECK_LAUNCH();
    }
    return TP_OK;
}

static tp_status attention_simple(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                  float scale, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    const int64_t tasks = (int64_t)batch.n_tokens * q_heads;
    if (cache.head_dim > ATTN_MAX_HEAD_DIM)
        return tp_error(TP_ERR_UNSUPPORTED, "attention: head_dim %d is more than the CUDA kernel's %d",
                        cache.head_dim, ATTN_MAX_HEAD_DIM);
    if (tasks > INT32_MAX)
        return tp_error(TP_ERR_UNSUPPORTED, "attention: %lld (token, head) pairs is too many", (long long)tasks);
    const size_t smem = (2 * (size_t)cache.head_dim + ATTN_CHUNK) * sizeof(float);
    dispatch_float(q.dtype, [&](auto qt) {
        dispatch_float(cache.dtype, [&](auto ct) {
            dispatch_float(out.dtype, [&](auto ot) {
                attention_simple_kernel<decltype(qt), decltype(ct), decltype(ot)>
                    <<<(unsigned)tasks, ATTN_THREADS, smem, stream>>>(q, cache, batch, q_heads, scale, out, fault);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

extern "C" tp_status tp_cuda_attention(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                       float scale, tp_tensor out, tp_cuda_attn_scratch scratch,
                                       tp_cuda_fault *fault, cudaStream_t stream)
{
    if ((int64_t)batch.n_tokens * q_heads <= 0) return TP_OK;
    if (!is_float_dtype(q.dtype) || !is_float_dtype(cache.dtype) || !is_float_dtype(out.dtype))
        return TP_CUDA_BAD_DTYPE("attention");
    int vpl = 1;
    const int lp_log2 = force_simple ? -1 : flash_lanes_log2(cache, &vpl);
    if (lp_log2 >= 0) return attention_flash(q, cache, batch, q_heads, scale, out, scratch, lp_log2, vpl, fault, stream);
    return attention_simple(q, cache, batch, q_heads, scale, out, fault, stream);
}
