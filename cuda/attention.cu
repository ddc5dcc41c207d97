/*
 * attention.cu: causal grouped-query attention over the paged KV cache. Token i attends
 * to positions 0..pos[i] of sequence seq[i], or with a sliding window (batch.window > 0) to
 * pos[i] - window + 1 .. pos[i]; q head h reads KV head h / (q_heads / kv_heads). Under a
 * window the split kernels take the keys from the window's first rounded down to a multiple
 * of WINDOW_ALIGN (their tiles stay aligned; the keys below the window are masked), the
 * prefill kernel starts at the run's first key tile and skips a warp's tiles below its rows'
 * windows. The kernels (the tensor-core decode kernel, which now does most of the flash
 * kernel's work, is the last):
 *
 * flash (flash-decoding on CUDA cores): one block per (token, KV head, split) computes
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
 * prefill (FlashAttention-2 on tensor cores, for steps of many tokens): the batch is cut
 * into tiles of PF_BM = 64 tokens at fixed places (token i is in tile i / 64), so that
 * every kernel can tell, from seq and pos alone, which tokens the prefill kernel takes: in
 * a tile, a run of consecutive tokens of one sequence at consecutive positions (a prefill
 * chunk, or the part of it in this tile), at least PF_MIN_RUN long, none of whose tokens
 * is faulty. One block per (tile, q head), 4 warps of 16 query rows; for each run of its
 * tile the block walks keys 0 .. the run's last position in tiles of PF_BN = 64 (so a
 * chunk's prefix already in the paged cache is read like its own keys), loaded from the
 * block table into shared memory by cp.async (each key's row looked up once a tile, a tile
 * ahead; 16 bytes a thread, zeros past the run and for bad blocks), double buffered, three
 * blocks an SM (PF_MIN_BLOCKS). Each warp computes S = Q K^T with mma.sync m16n8k16
 * (bf16 or f16 in, f32 out; q and K fragments by ldmatrix), masks the causal part,
 * updates its rows' online softmax in registers in the log2 domain, and adds P V with P
 * rounded to the cache dtype as the A operand straight from the S registers (V by
 * ldmatrix.trans); S is never stored. A warp skips key tiles past its last row's
 * position. Only bf16/f16 caches with q of the same dtype, head_dim 64 or 128; out in
 * any float dtype. The flash kernel (and its combine) then runs with pf_skip: its blocks
 * for tokens the prefill kernel took return at once, the rest (decode tokens, short
 * runs, faulty tokens) are computed as without it. Steps of fewer than PF_MIN_TOKENS
 * tokens, steps recorded into a CUDA graph (decode steps) and TPINFER_ATTN_PREFILL=0
 * keep the flash kernel alone.
 *
 * decode on tensor cores (attention_decode_tc_kernel): where the cache is bf16 or f16, q of
 * its dtype, head_dim 64 or 128 and at most 16 q heads per KV head (and TPINFER_ATTN_DECODE_TC
 * is not 0), it does the flash kernel's work under the same grid, splits, partials (the combine
 * kernel) and faults, including pf_skip's leftovers: the group's q heads are the rows of one
 * mma tile, so q . K and P . V run on tensor cores (the flash kernel was bound by its scalar
 * instructions, bench/RESULTS.md). The flash kernel keeps f32 caches and other shapes. Its
 * blocks have 1 warp (16-key tiles, 12 blocks per SM) where there are no splits, else 4
 * (64-key tiles; TPINFER_ATTN_DT_WARPS=1, 2 or 4 forces one). Under pf_skip a small kernel
 * (pf_list_kernel) first lists the tokens the prefill kernel left, and one wave of blocks
 * takes them in turn, instead of a block for every token of the step.
 *
 * What only the device can check (sequence, position, block-table entries) is checked
 * here: a bad one is recorded as a fault, and the token's output is zeros.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
#define FA_BLOCKS_PER_SM 4   /* split until the grid has this many blocks per SM (TPINFER_ATTN_BLOCKS_PER_SM):
                              * one wave of the 4 resident blocks; at batch 128 x 200 positions, 16 (3 splits
                              * and a combine) took 8.82 ms a step where 2 (no split) took 7.77 */
#define FA_COMBINE_THREADS 128

#define PF_BM 64         /* prefill: query tokens per tile and block (4 warps of 16 rows) */
#define PF_BN 64         /* keys per K/V tile in shared memory */
#define PF_WARPS 4
#define PF_THREADS (PF_WARPS * WARP_SIZE)
/* blocks an SM holds, by their registers (at most 168 a thread; ptxas, sm_90: at head_dim
 * 128 20 bytes of spills, touched once a key tile; at 64 none) and shared memory (69 KiB a
 * block at head_dim 128, the carveout at its largest): at two warps a scheduler the kernel
 * waited on its own latencies (ncu: the tensor pipe 28 % busy, 233 registers at head_dim
 * 128). Only head_dim 128 is timed (bench/gpu_attention). */
#define PF_MIN_BLOCKS 3
#define PF_MIN_RUN 16    /* a shorter run of a sequence in a tile goes to the flash kernel */
#define PF_MIN_TOKENS 64 /* fewer tokens in a step: the flash kernel alone (decode steps) */
#define PF_PAD 8         /* elements past each shared-memory row: ldmatrix's 8 rows in distinct banks */

static int force_simple;     /* tp_cuda_attention_force_simple(): benchmarks compare the two */
static int force_prefill = -1; /* tp_cuda_attention_force_prefill(): < 0 the default, 0 off, > 0 on */
static int force_warps;       /* tp_cuda_attention_force_warps(): 1, 2 or 4 warps a decode block; 0 the default */

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

#define TRACE_BLOCKS 65536 /* tp_cuda_attention_trace's records */

__device__ __forceinline__ unsigned long long globaltimer_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Element offset of position p's K/V row (KV head 0) in the paged cache: kv_row_in from its
 * logical block lb's entry blk, kv_row_at with that entry from the sequence's table bt (a shift where block_size is a power of two: bs_shift >= 0); -1 when
 * that entry is outside the cache (*blk keeps it for the fault record). */
__device__ __forceinline__ int64_t kv_row_in(int32_t blk, int lb, int p, int bs, int32_t n_blocks, int64_t width)
{
    if (blk < 0 || blk >= n_blocks) return -1;
    return ((int64_t)blk * bs + (p - lb * bs)) * width;
}

__device__ __forceinline__ int64_t kv_row_at(const int32_t *bt, int p, int bs, int bs_shift, int32_t n_blocks,
                                             int64_t width, int32_t *blk)
{
    const int lb = bs_shift >= 0 ? p >> bs_shift : p / bs;
    *blk = __ldg(bt + lb);
    return kv_row_in(*blk, lb, p, bs, n_blocks, width);
}

/* Bits [0, r) of a tile's 64 rows (r in 0..64). */
__device__ __forceinline__ uint64_t pf_below(int r) { return r >= 64 ? ~0ull : (1ull << r) - 1; }

/* The runs of the tile of cnt tokens from t0 (the prefill kernel's unit): bit r of the
 * result is set where row r (token t0 + r) starts a run (a sequence change, a position
 * that does not follow the previous row's, and every row past cnt); *ok: the rows whose
 * token passes token_fault. Called by a whole warp, the same answer in every lane; the
 * prefill kernel and the flash and combine kernels (pf_skip) call it alike, so they agree
 * on which tokens the prefill kernel takes. */
__device__ __forceinline__ uint64_t pf_tile_scan(const tp_attn_batch &batch, int64_t t0, int cnt, int bs,
                                                 uint64_t *ok)
{
    const int lane = threadIdx.x % WARP_SIZE;
    int32_t sq[2], ps[2];
    bool good[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = hf * WARP_SIZE + lane;
        sq[hf] = -1, ps[hf] = -1, good[hf] = false;
        if (r < cnt) {
            sq[hf] = __ldg(batch.seq + t0 + r);
            ps[hf] = __ldg(batch.pos + t0 + r);
            int32_t value, limit;
            good[hf] = token_fault(sq[hf], ps[hf], batch, bs, &value, &limit) == TP_CUDA_FAULT_NONE;
        }
    }
    /* the previous row's token: the lane below, or lane 31 of the first half */
    int32_t qs0 = __shfl_up_sync(0xffffffffu, sq[0], 1), qp0 = __shfl_up_sync(0xffffffffu, ps[0], 1);
    int32_t qs1 = __shfl_up_sync(0xffffffffu, sq[1], 1), qp1 = __shfl_up_sync(0xffffffffu, ps[1], 1);
    const int32_t ls = __shfl_sync(0xffffffffu, sq[0], WARP_SIZE - 1), lp = __shfl_sync(0xffffffffu, ps[0], WARP_SIZE - 1);
    if (lane == 0) qs1 = ls, qp1 = lp;
    const bool st0 = lane == 0 || lane >= cnt || sq[0] != qs0 || (int64_t)ps[0] != (int64_t)qp0 + 1;
    const bool st1 = WARP_SIZE + lane >= cnt || sq[1] != qs1 || (int64_t)ps[1] != (int64_t)qp1 + 1;
    *ok = (uint64_t)__ballot_sync(0xffffffffu, good[0]) | ((uint64_t)__ballot_sync(0xffffffffu, good[1]) << 32);
    return (uint64_t)__ballot_sync(0xffffffffu, st0) | ((uint64_t)__ballot_sync(0xffffffffu, st1) << 32);
}

/* The run [*r0, *r1) holding row r; whether the prefill kernel takes it. */
__device__ __forceinline__ bool pf_run(uint64_t starts, uint64_t ok, int r, int *r0, int *r1)
{
    *r0 = 63 - __clzll(starts & pf_below(r + 1)); /* row 0 always starts one */
    const uint64_t above = starts & ~pf_below(r + 1);
    *r1 = above ? __ffsll(above) - 1 : 64;
    const uint64_t rows = pf_below(*r1) & ~pf_below(*r0);
    return *r1 - *r0 >= PF_MIN_RUN && (ok & rows) == rows;
}

/* Whether the prefill kernel computed token i (flash and combine under pf_skip; every
 * warp of the block calls it, so a return on it is uniform). */
__device__ __forceinline__ bool pf_took(const tp_attn_batch &batch, int64_t i, int bs)
{
    const int64_t t0 = i / PF_BM * PF_BM;
    const int cnt = (int)min((int64_t)PF_BM, (int64_t)batch.n_tokens - t0);
    uint64_t ok;
    const uint64_t starts = pf_tile_scan(batch, t0, cnt, bs, &ok);
    int r0, r1;
    return pf_run(starts, ok, (int)(i - t0), &r0, &r1);
}

/* A sliding window (batch.window > 0): the first key a token at pos reads (tp_attn_first_key),
 * and where the split kernels start, that rounded down to a multiple of WINDOW_ALIGN keys so
 * that their tiles keep the alignment they have from 0 (the keys in between are masked).
 * Nothing reads below that: the scheduler gives the blocks there to other sequences. */
#define WINDOW_ALIGN TP_CUDA_WINDOW_ALIGN
static_assert(WINDOW_ALIGN % PF_BN == 0, "the prefill kernel's first key tile starts at or after window_base");
__device__ __forceinline__ int window_first(int pos, int window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }
__device__ __forceinline__ int window_base(int pos, int window) { return window_first(pos, window) & ~(WINDOW_ALIGN - 1); }

// ----------------------------------------------------------------------------
// the simple kernel: one block per (token, q head)

template <typename QT, typename CT, typename OT>
__global__ void __launch_bounds__(ATTN_THREADS)
    attention_simple_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads, float scale,
                            tp_tensor out, tp_cuda_fault *fault)
{
    pdl_begin(); /* inputs come from the previous kernel */
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

    for (int p0 = window_first(pos, batch.window); p0 < np; p0 += ATTN_CHUNK) {
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
                const float s = scale * dot;
                p_s[c] = batch.softcap > 0.0f ? batch.softcap * tanhf(s / batch.softcap) : s;
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

/* Gemma 2's soft cap in the log2 domain: with x = s log2(e) and C = cap log2(e),
 * C tanh(x / C) = log2(e) cap tanh(s / cap). cap 0: none (a uniform branch). */
__device__ __forceinline__ float log2_softcap(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }

/* The kernels' cap from the batch's softcap (0: none). */
static float log2_cap(float softcap) { return softcap > 0.0f ? softcap * 1.4426950408889634f : 0.0f; }

/* What the host decided, passed by value. */
struct fa_params {
    int32_t q_heads, group; /* q heads in all; per KV head */
    int32_t gb, nhg;        /* q heads per block; blocks per KV head (gb * nhg >= group) */
    int32_t splits;         /* S: gridDim.y */
    int32_t min_split;      /* positions: no split of a token is shorter */
    int32_t lp_log2;        /* lanes per position: 1 << lp_log2 */
    float qscale;           /* scale * log2(e): scores in the log2 domain */
    float cap;              /* > 0: scores soft-capped, cap = softcap * log2(e) (log2_softcap) */
    int32_t pf_skip;        /* the prefill kernel ran: skip the tokens it took (pf_took) */
    int32_t bs_shift;       /* log2(block_size) when it is a power of two, else -1 (a division) */
    int32_t tile_in_block;  /* the decode kernel may read a tile's rows from one block-table entry
                             * (TPINFER_ATTN_TILE_IN_BLOCK=0: per key, as the other kernels) */
    float *part_acc;        /* [n_tokens * q_heads * S, head_dim] unnormalised acc */
    float *part_m, *part_l; /* [n_tokens * q_heads * S] */
    unsigned long long *trace; /* the decode kernel's per-block timeline (tp_cuda_attention_trace) or NULL */
    int32_t *pf_list;       /* the tensor-core decode kernel under pf_skip: the tokens the prefill */
    int32_t *pf_count;      /* kernel left (pf_list_kernel), or NULL (a block per token, pf_took) */
    /* the tensor-core decode kernel with qk_rope_store's rope and store (tp_cuda_attention_rope);
     * rope_k.data NULL: q is roped and the step's rows are stored already */
    tp_tensor rope_k, rope_v; /* the k and v columns of q's qkv */
    const float *inv_freq;
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
/* at least 4 blocks per SM up to 4 heads a block (128 registers, no spills): the loop is latency-bound,
 * and 167 registers left 3 */
__global__ void __launch_bounds__(FA_THREADS, GMAX >= 8 ? 2 : 4)
    attention_flash_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, fa_params P, tp_tensor out,
                           tp_cuda_fault *fault)
{
    pdl_begin(); /* inputs come from the previous kernel */
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
    if (P.pf_skip && pf_took(batch, i, bs)) return; /* the prefill kernel wrote it */

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
    const int lo = window_first(pos, batch.window), base = window_base(pos, batch.window); /* the combine's too */
    const int np = pos + 1 - base, se = token_splits(np, S, P.min_split);
    if (s >= se) return; /* a split this token does not use: the combine reads se splits */
    const int c = CEIL_DIV(np, se), b0 = base + s * c, b1 = min(pos + 1, b0 + c);
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
            ok[r] = p < b1 && p >= lo;
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
        if (P.cap > 0.0f)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int g = 0; g < GMAX; g++) sc[r][g] = log2_softcap(sc[r][g], P.cap);
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
    pdl_begin(); /* inputs come from the previous kernel */
    const int64_t i = blockIdx.x / P.q_heads;
    const int h = (int)(blockIdx.x % P.q_heads), hd = head_dim, S = P.splits;
    const int64_t o = i * out.stride + (int64_t)h * hd;
    if (P.pf_skip && pf_took(batch, i, block_size)) return; /* the prefill kernel wrote it, no partials */
    int32_t value = 0, limit = 0;
    const int32_t pos = batch.pos[i];
    bool zero = token_fault(batch.seq[i], pos, batch, block_size, &value, &limit) != TP_CUDA_FAULT_NONE;
    int se = 0;
    const int64_t pbase = (i * P.q_heads + h) * S;
    float M = -INFINITY;
    if (!zero) {
        se = token_splits(pos + 1 - window_base(pos, batch.window), S, P.min_split);
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
// the prefill kernel (tensor cores)

/* What the host decided, passed by value. */
struct pf_params {
    int32_t group;    /* q heads per KV head */
    int32_t n_tiles;  /* gridDim.y: CEIL_DIV(n_tokens, PF_BM) */
    int32_t bs_shift; /* log2(block_size) when it is a power of two, else -1 (a division) */
    float qscale;     /* scale * log2(e): scores in the log2 domain */
    float cap;        /* > 0: scores soft-capped, cap = softcap * log2(e) (log2_softcap) */
};

/* 16 bytes global -> shared without the registers; src_bytes 0 writes zeros (src unread) */
__device__ __forceinline__ void pf_cp_async16(void *dst, const void *src, int src_bytes)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void pf_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void pf_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* four 8x8 b16 matrices; lanes 8m .. 8m+7 give matrix m's row addresses */
__device__ __forceinline__ void pf_ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ void pf_ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* d += a (16x16, row) * b (16x8, col), f32 accumulate; and two f32 packed as the element
 * type (lo in the low half), round to nearest even */
template <typename T> struct pf_mma;
template <> struct pf_mma<bf16_t> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        uint32_t r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct pf_mma<f16_t> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        uint32_t r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

/* The pieces both tensor-core kernels run on a warp's 16 rows (in mma's fragment layout: a
 * lane holds rows lane / 4 and + 8, and of each 8-key group keys 2 (lane % 4), + 1). */

/* The A fragments of a warp's 16 q rows over D = 16 KS dims: row a (lane / 4) at qa, row b
 * (+ 8) at qb, zeros where ha / hb are false; words: both rows 4-byte aligned (32-bit loads),
 * else 16-bit ones */
template <int KS>
__device__ __forceinline__ void fa_load_q(uint32_t (&qf)[KS][4], const uint16_t *qa, const uint16_t *qb, bool ha,
                                          bool hb, int tig, bool words)
{
    if (words) {
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const int c = k * 16 + 2 * tig;
            qf[k][0] = ha ? *(const uint32_t *)(qa + c) : 0u;
            qf[k][1] = hb ? *(const uint32_t *)(qb + c) : 0u;
            qf[k][2] = ha ? *(const uint32_t *)(qa + c + 8) : 0u;
            qf[k][3] = hb ? *(const uint32_t *)(qb + c + 8) : 0u;
        }
    } else {
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const int c = k * 16 + 2 * tig;
            qf[k][0] = ha ? (uint32_t)qa[c] | (uint32_t)qa[c + 1] << 16 : 0u;
            qf[k][1] = hb ? (uint32_t)qb[c] | (uint32_t)qb[c + 1] << 16 : 0u;
            qf[k][2] = ha ? (uint32_t)qa[c + 8] | (uint32_t)qa[c + 9] << 16 : 0u;
            qf[k][3] = hb ? (uint32_t)qb[c + 8] | (uint32_t)qb[c + 9] << 16 : 0u;
        }
    }
}

/* s += Q K^T for the 16 NG keys of k_rows (shared, pitch LD), s[2g] and s[2g + 1] the 8-key
 * tiles of keys 16g .. 16g + 15: two B fragments per ldmatrix.x4 (matrices: keys +0..7 dims
 * +0..7, +0..7 +8..15, +8..15 +0..7, +8..15 +8..15); the k steps outermost, so that the
 * groups' loads and products interleave */
template <typename T, int KS, int NG, int LD>
__device__ __forceinline__ void fa_qk(float (&s)[2 * NG][4], const uint32_t (&qf)[KS][4], const T *k_rows, int lane)
{
#pragma unroll
    for (int k = 0; k < KS; k++)
#pragma unroll
        for (int g = 0; g < NG; g++) {
            uint32_t b[4];
            pf_ldmatrix_x4(b, k_rows + (g * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + k * 16 +
                                  ((lane >> 3) & 1) * 8);
            pf_mma<T>::mma(s[2 * g], qf[k], b[0], b[1]);
            pf_mma<T>::mma(s[2 * g + 1], qf[k], b[2], b[3]);
        }
}

/* 2^x by the special-function unit alone (ex2.approx.ftz: relative error ~2^-22, results
 * under 2^-126 flushed to 0; -inf gives 0): exp2f adds range fix-ups around it for accuracy
 * that P, rounded to 16 bits before its product, cannot keep. */
__device__ __forceinline__ float fa_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* The maximum of m and a lane's scores of rows a and b (s[n][0..1] and s[n][2..3]), in four
 * chains of NS (not two of 2 NS dependent steps); the same value in any order. */
template <int NS> __device__ __forceinline__ void fa_row_max(const float (&s)[NS][4], const float (&m)[2], float (&mx)[2])
{
    float part[4] = {m[0], m[0], m[1], m[1]};
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[e] = fmaxf(part[e], s[n][e]);
    mx[0] = fmaxf(part[0], part[1]);
    mx[1] = fmaxf(part[2], part[3]);
}

/* One online-softmax step over new scores s (log2 domain, masked ones -inf), mx holding the
 * maximum of m and this lane's scores of each row: the row's maximum over the quad rescales
 * the running sum l (this lane's part; the quad's are added at the end) and the accumulator
 * o and becomes m; s turns into exp2(s - max) and adds to l. A row that has seen only -inf
 * keeps p = 0 (its max taken as 0); corr is 0 while m is -inf. */
template <int NS, int NT>
__device__ __forceinline__ void fa_softmax_step(float (&s)[NS][4], float (&mx)[2], float (&m)[2], float (&l)[2],
                                                float (&o)[NT][4])
{
    float corr[2], mref[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
        mref[e] = mx[e] == -INFINITY ? 0.0f : mx[e];
        corr[e] = fa_exp2(m[e] - mref[e]);
        m[e] = mx[e];
        l[e] *= corr[e];
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        o[n][0] *= corr[0], o[n][1] *= corr[0];
        o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four sums, not two chains of 2 NS dependent adds */
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] = fa_exp2(s[n][e] - mref[e >> 1]);
            part[e] += s[n][e];
        }
    l[0] += part[0] + part[1];
    l[1] += part[2] + part[3];
}

/* o += P V for 16 keys: P's A fragment is the two 8-key score tiles p0, p1 as they lie in the
 * registers, rounded to T; V's B fragments of v_rows (the 16 keys' rows in shared memory) by
 * ldmatrix.trans, two 8-dim tiles each (matrices: keys +0..7 dims +0..7, +8..15 +0..7, +0..7
 * +8..15, +8..15 +8..15) */
template <typename T, int NT, int LD>
__device__ __forceinline__ void fa_pv16(float (&o)[NT][4], const float (&p0)[4], const float (&p1)[4],
                                        const T *v_rows, int lane)
{
    const uint32_t a[4] = {pf_mma<T>::pack(p0[0], p0[1]), pf_mma<T>::pack(p0[2], p0[3]),
                           pf_mma<T>::pack(p1[0], p1[1]), pf_mma<T>::pack(p1[2], p1[3])};
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; n2++) {
        uint32_t b[4];
        pf_ldmatrix_x4_trans(b, v_rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (2 * n2 + (lane >> 4)) * 8);
        pf_mma<T>::mma(o[2 * n2], a, b[0], b[1]);
        pf_mma<T>::mma(o[2 * n2 + 1], a, b[2], b[3]);
    }
}

/* The shared memory of one block: K and V tiles, two buffers each. */
template <int D> constexpr size_t pf_smem_bytes() { return (size_t)2 * 2 * PF_BN * (D + PF_PAD) * 2; }

/* dst[0], dst[1] = a, b in OT: one 32-bit store of both where wide (OT of 16 bits, dst
 * 4-byte aligned), else one each */
template <typename OT> __device__ __forceinline__ void store_pair(OT *dst, float a, float b, bool wide)
{
    const OT x = from_f32<OT>(a), y = from_f32<OT>(b);
    if constexpr (sizeof(OT) == 2) {
        if (wide) {
            uint16_t xy[2];
            memcpy(&xy[0], &x, 2), memcpy(&xy[1], &y, 2);
            *(uint32_t *)dst = (uint32_t)xy[0] | (uint32_t)xy[1] << 16;
            return;
        }
    }
    dst[0] = x, dst[1] = y;
}

/* Block (q head h, tile): grid (q_heads, n_tiles), PF_THREADS threads, pf_smem_bytes<D>()
 * dynamic shared memory: K and V [2 buffers][PF_BN keys][D + PF_PAD] of T. T: the cache's
 * and q's element type (bf16 or f16); D: head_dim (64 or 128); OT: out's element type.
 * Warp w owns the tile's rows 16w .. 16w + 15; in mma's fragment layout, lane owns rows
 * 16w + lane / 4 (a) and + 8 (b), and of each 8-column group columns 2 (lane % 4), + 1. */
template <typename T, int D, typename OT>
__global__ void __launch_bounds__(PF_THREADS, PF_MIN_BLOCKS)
    attention_prefill_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, pf_params P, tp_tensor out,
                             tp_cuda_fault *fault)
{
    pdl_begin(); /* inputs come from the previous kernel */
    constexpr int LD = D + PF_PAD;     /* shared row pitch (elements) */
    constexpr int CPR = D / 8;         /* 16-byte chunks per K or V row */
    constexpr int KS = D / 16;         /* k steps of Q K^T */
    constexpr int NT = D / 8;          /* 8-column tiles of the output */
    constexpr int NS = PF_BN / 8;      /* 8-key tiles of S */
    constexpr int LOADS = PF_BN * CPR / PF_THREADS; /* chunks per thread per K (or V) tile */
    static_assert(PF_BN * CPR % PF_THREADS == 0, "tile loads must divide over the threads");
    static_assert(PF_BN <= PF_THREADS, "entry() and place(): a thread a key");
    extern __shared__ __align__(16) unsigned char pf_smem[];
    T *kbuf = (T *)pf_smem, *vbuf = kbuf + 2 * PF_BN * LD;
    __shared__ int bad_from_s; /* the first position whose block-table entry is bad (INT32_MAX: none) */
    __shared__ int64_t rows_s[2][PF_BN]; /* the cache row (element offset) of each key of the tiles in flight */

    const int h = blockIdx.x, kh = h / P.group;
    const int64_t t0 = (int64_t)(P.n_tiles - 1 - (int)blockIdx.y) * PF_BM; /* the longest contexts first */
    const int cnt = (int)min((int64_t)PF_BM, (int64_t)batch.n_tokens - t0);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int g = lane >> 2, tig = lane & 3;
    const int ra = warp * 16 + g, rb = ra + 8;
    const int bs = cache.block_size;

    uint64_t ok;
    const uint64_t starts = pf_tile_scan(batch, t0, cnt, bs, &ok);
    uint64_t take = 0; /* the rows this kernel computes: uniform over the block */
    for (int r = 0, r0, r1; r < cnt; r = r1)
        if (pf_run(starts, ok, r, &r0, &r1)) take |= pf_below(r1) & ~pf_below(r0);
    if (!take) return; /* decode tokens, short runs: the flash kernel's */

    /* q fragments of the warp's rows (16-bit loads: q's rows need not be 4-byte aligned);
     * rows past the step are zeros */
    uint32_t qf[KS][4];
    fa_load_q<KS>(qf, (const uint16_t *)q.data + (t0 + ra) * q.stride + (int64_t)h * D,
                  (const uint16_t *)q.data + (t0 + rb) * q.stride + (int64_t)h * D, ra < cnt, rb < cnt, tig, false);

    const int64_t width = (int64_t)cache.n_kv_heads * D;
    const T *kc = (const T *)cache.k + (int64_t)kh * D, *vc = (const T *)cache.v + (int64_t)kh * D;
    for (int r = 0, r0, r1; r < cnt; r = r1) { /* each run the block takes (usually the whole tile) */
        if (!pf_run(starts, ok, r, &r0, &r1)) continue;
        const int32_t seq = __ldg(batch.seq + t0 + r0), pos0 = __ldg(batch.pos + t0 + r0);
        const int kend = pos0 + (r1 - r0); /* keys 0 .. kend - 1: the run's last position */
        const int nkt = CEIL_DIV(kend, PF_BN);
        const int pa = ra >= r0 && ra < r1 ? pos0 + ra - r0 : -1; /* -1: not in the run, every key masked */
        const int pb = rb >= r0 && rb < r1 ? pos0 + rb - r0 : -1;
        const int wlo = max(warp * 16, r0), whi = min(warp * 16 + 16, r1) - 1;
        const int wmax = wlo <= whi ? pos0 + whi - r0 : -1;       /* the warp's last position */
        const int wmin = wlo <= whi ? pos0 + wlo - r0 : INT32_MAX; /* its first */
        const int W = batch.window; /* > 0: a row at p reads keys p - W + 1 .. p */
        const int wfirst = wlo <= whi ? window_first(wmin, W) : 0; /* the warp's first key */
        const int kt0 = window_first(pos0, W) / PF_BN; /* the run's first key tile */
        const int32_t *bt = batch.block_table + (int64_t)seq * batch.max_blocks;

        __syncthreads(); /* the previous run is done with the buffers and bad_from_s */
        if (tid == 0) bad_from_s = INT32_MAX;
        __syncthreads();

        /* Each key's row in the cache, once a tile by one thread (not once a chunk, by 16):
         * entry(kt) is the block-table entry of key tid of tile kt (threads tid < PF_BN), read
         * a tile ahead so that its latency passes under the products; place() turns it into
         * rows_s[b][tid], -1 past kend or for a bad entry (recorded, and bad_from_s lowered) */
        auto entry = [&](int kt) -> int32_t {
            const int p = kt * PF_BN + tid;
            if (tid >= PF_BN || p >= kend) return 0;
            return __ldg(bt + (P.bs_shift >= 0 ? p >> P.bs_shift : p / bs));
        };
        auto place = [&](int kt, int b, int32_t blk) {
            if (tid >= PF_BN) return;
            const int p = kt * PF_BN + tid;
            int64_t row = -1;
            if (p < kend) {
                row = kv_row_in(blk, P.bs_shift >= 0 ? p >> P.bs_shift : p / bs, p, bs, cache.n_blocks, width);
                if (row < 0) { /* the run's first token that reads position p */
                    fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, t0 + r0 + max(0, p - pos0), blk, cache.n_blocks);
                    atomicMin(&bad_from_s, p);
                }
            }
            rows_s[b][tid] = row;
        };
        /* K and V rows of the tile placed in rows_s[b] into buffer b: thread tid takes chunk
         * column tid % CPR of keys tid / CPR + j * (PF_THREADS / CPR), so a row's chunks are
         * consecutive threads (coalesced); zeros where the row is -1 */
        auto load = [&](int b) {
            T *kd = kbuf + b * PF_BN * LD, *vd = vbuf + b * PF_BN * LD;
            const int col = tid % CPR;
#pragma unroll
            for (int j = 0; j < LOADS; j++) {
                const int key = tid / CPR + j * (PF_THREADS / CPR);
                const int64_t row = rows_s[b][key];
                const int64_t at = row < 0 ? 0 : row + col * 8;
                const int bytes = row < 0 ? 0 : 16;
                pf_cp_async16(kd + key * LD + col * 8, kc + at, bytes);
                pf_cp_async16(vd + key * LD + col * 8, vc + at, bytes);
            }
        };

        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

        place(kt0, kt0 & 1, entry(kt0));
        place(kt0 + 1, (kt0 + 1) & 1, entry(kt0 + 1));
        __syncthreads();
        load(kt0 & 1);
        pf_cp_async_commit();
        for (int kt = kt0; kt < nkt; kt++) {
            if (kt + 1 < nkt) load((kt + 1) & 1); /* the next tile travels while this one is used */
            pf_cp_async_commit();                 /* (an empty group at the end: the wait stays 1) */
            pf_cp_async_wait<1>();
            __syncthreads();
            const int32_t next = entry(kt + 2); /* in flight during the products */
            const int k0 = kt * PF_BN;
            if (k0 <= wmax && k0 + PF_BN > wfirst) { /* else every key of the tile is past the warp's rows
                                                      * or before their windows */
                const T *kt_s = kbuf + (kt & 1) * PF_BN * LD, *vt_s = vbuf + (kt & 1) * PF_BN * LD;
                /* S = Q K^T: 16 rows x PF_BN keys */
                float s[NS][4];
#pragma unroll
                for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                fa_qk<T, KS, NS / 2, LD>(s, qf, kt_s, lane);
                /* scale to the log2 domain; causal mask where a key may pass a row's position, the
                 * window's where one may be W or more before it */
                const bool mask = k0 + PF_BN - 1 > wmin, wmask = W > 0 && k0 < window_first(wmax, W);
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = log2_softcap(s[n][e] * P.qscale, P.cap);
                        const int key = k0 + n * 8 + 2 * tig + (e & 1), pr = e < 2 ? pa : pb;
                        if ((mask && key > pr) || (wmask && pr - key >= W)) x = -INFINITY;
                        s[n][e] = x;
                    }
                float mx[2];
                fa_row_max(s, m, mx);
                fa_softmax_step(s, mx, m, l, o); /* the 4 lanes of a row hold its 64 scores */
                /* O += P V: keys 16k .. 16k + 15 are S tiles 2k and 2k + 1 */
#pragma unroll
                for (int k = 0; k < PF_BN / 16; k++)
                    fa_pv16<T, NT, LD>(o, s[2 * k], s[2 * k + 1], vt_s + k * 16 * LD, lane);
            }
            place(kt + 2, kt & 1, next); /* rows_s[kt & 1]: load() read it before the last barrier */
            __syncthreads(); /* every warp is done with this buffer before it is refilled */
        }
        const int bad_from = bad_from_s; /* read before the next run's reset (its first __syncthreads) */

        /* out = O / l; rows from a bad block's first position on are zeros, as in the flash kernel */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            l[e] += __shfl_xor_sync(0xffffffffu, l[e], 1);
            l[e] += __shfl_xor_sync(0xffffffffu, l[e], 2);
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int pr = e ? pb : pa;
            if (pr < 0) continue; /* not in this run (another run's, the flash kernel's, or past the step) */
            const bool zero = pr >= bad_from;
            const float inv = 1.0f / l[e];
            const bool wide = (uintptr_t)out.data % 4 == 0 && out.stride % 2 == 0; /* store_pair's */
            OT *dst = row_of<OT>(out, t0 + (e ? rb : ra)) + (int64_t)h * D + 2 * tig;
#pragma unroll
            for (int n = 0; n < NT; n++)
                store_pair(dst + n * 8, zero ? 0.0f : o[n][2 * e] * inv, zero ? 0.0f : o[n][2 * e + 1] * inv, wide);
        }
    }
}

// ----------------------------------------------------------------------------
// the decode kernel on tensor cores

/* Item (token i, KV head kh, split s): the flash kernel's contract (partials for
 * the combine kernel when the token uses se > 1 splits, else its output), W warps (1, 2 or
 * 4), dt_smem_bytes<D, W, NB>() of dynamic shared memory. The group's q heads (up to 16) are
 * the rows of one m16 tile (padded rows are zeros and never written). Keys of the split
 * come in tiles of DT_BN = 16 W, K and V by cp.async into NB buffers (NB - 1 tiles travel
 * while one is used); warp w takes keys 16w .. 16w + 15 of each tile: S = Q K^T (16 x 16,
 * mma.sync m16n8k16, f32), online softmax in the log2 domain over its keys, O += P V with P
 * rounded to the cache dtype. At the end the warps' (m, l, O) merge through shared
 * memory. Against the flash kernel: the same bytes, a tenth of the instructions (that
 * kernel issues ~0.6 instructions a cycle per scheduler at batch 128, its limit). */
#define DT_MAX_GROUP 16

template <int D, int W, int NB> __host__ __device__ constexpr size_t dt_smem_bytes() { return (size_t)NB * 2 * 16 * W * (D + PF_PAD) * 2; }

/* The fused qk_rope_store's share of item (token i, KV head kh), by its block's W warps (q, k
 * and v from the step's qkv, so after the wait for the previous kernel): q heads h0 .. h0 +
 * gn - 1 rotated into q_s (rows of pitch D + PF_PAD: the q fragments' source); where store, k
 * head kh rotated and stored with v head kh at the token's slot (kv_store's rule: below zero is
 * padding, past the cache a fault). q and k in qkv are left as they were: splits of one item
 * read them at different times. cs: the cos [D / 2], then the sin, of pos. rope_rotate
 * without a norm, rounded as rope_pair rounds: qk_rope_store's bits. Few registers: the
 * kernel keeps ~170 a thread (12 blocks an SM), and arrays held across this spilled its loop. */
template <typename T, int D, int W>
__device__ __forceinline__ void dt_rope(const tp_tensor &q, const fa_params &P, const tp_kv_layer &cache,
                                        const tp_attn_batch &batch, tp_cuda_fault *fault, int64_t i, int kh, int h0,
                                        int gn, const float *cs, T *q_s, bool store)
{
    constexpr int HALF = D / 2, THREADS = W * WARP_SIZE, LD = D + PF_PAD;
    const int tid = threadIdx.x;
    const T *qr = (const T *)q.data + i * q.stride + (int64_t)h0 * D;
#pragma unroll 8
    for (int p = tid; p < gn * HALF; p += THREADS) {
        const int h = p / HALF, j = p % HALF;
        float y1, y2;
        rope_rotate(to_f32(qr[h * D + j]), to_f32(qr[h * D + j + HALF]), cs[j], cs[HALF + j], &y1, &y2);
        q_s[h * LD + j] = from_f32<T>(y1);
        q_s[h * LD + j + HALF] = from_f32<T>(y2);
    }
    if (!store) return;
    const int64_t slot = batch.slot[i], slots = (int64_t)cache.n_blocks * cache.block_size;
    if (slot >= slots && kh == 0 && tid == 0) fault_record(fault, TP_CUDA_FAULT_KV_SLOT, i, slot, slots);
    if (slot < 0 || slot >= slots) return;
    const T *kr = (const T *)P.rope_k.data + i * P.rope_k.stride + (int64_t)kh * D;
    const T *vr = (const T *)P.rope_v.data + i * P.rope_v.stride + (int64_t)kh * D;
    const int64_t row = slot * cache.n_kv_heads * D + (int64_t)kh * D;
    T *kc = (T *)cache.k + row, *vc = (T *)cache.v + row;
#pragma unroll
    for (int j = tid; j < HALF; j += THREADS) {
        float y1, y2;
        const float v1 = to_f32(vr[j]), v2 = to_f32(vr[j + HALF]);
        rope_rotate(to_f32(kr[j]), to_f32(kr[j + HALF]), cs[j], cs[HALF + j], &y1, &y2);
        kc[j] = from_f32<T>(y1);
        kc[j + HALF] = from_f32<T>(y2);
        vc[j] = from_f32<T>(v1);
        vc[j + HALF] = from_f32<T>(v2);
    }
}

/* cos [D / 2], then sin, of pos into cs, by the block's threads */
template <int D>
__device__ __forceinline__ void dt_rope_angles(const float *inv_freq, int32_t pos, float *cs)
{
    for (int j = threadIdx.x; j < D / 2; j += blockDim.x) rope_angle(pos, __ldg(inv_freq + j), &cs[j], &cs[D / 2 + j]);
}

/* One item of the kernel below: token i (its seq and pos), KV head kh, split blockIdx.y;
 * NB tile buffers (NB - 1 tiles travel while one is used). pdl_pending: the kernel has not
 * waited for its predecessor yet (a decode step's, batch.one_per_seq): where the first NB - 1
 * tiles hold only keys before pos (earlier steps' rows), they are asked for before the wait
 * (a bad block among them is recorded after it, so an earlier kernel's fault comes first);
 * else all of them after. */
template <typename T, int D, int W, int NB>
__device__ __forceinline__ void decode_tc_item(const tp_tensor &q, const tp_kv_layer &cache, const tp_attn_batch &batch,
                                               const fa_params &P, const tp_tensor &out, tp_cuda_fault *fault,
                                               int64_t i, int kh, int32_t seq, int32_t pos, bool pdl_pending)
{
    constexpr int DT_WARPS = W, DT_BN = 16 * W, DT_THREADS = W * WARP_SIZE;
    constexpr int LD = D + PF_PAD;                  /* shared row pitch (elements) */
    constexpr int CPR = D / 8;                      /* 16-byte chunks per K or V row */
    constexpr int KS = D / 16;                      /* k steps of Q K^T */
    constexpr int NT = D / 8;                       /* 8-column tiles of the output */
    constexpr int LOADS = DT_BN * CPR / DT_THREADS; /* chunks per thread per K (or V) tile */
    static_assert(DT_BN == 16 * DT_WARPS, "a warp takes 16 keys of a tile");
    static_assert(DT_BN * CPR % DT_THREADS == 0, "tile loads must divide over the threads");
    static_assert(DT_WARPS * DT_MAX_GROUP * D * 4 <= dt_smem_bytes<D, W, NB>(), "the merge reuses the tile buffers");
    static_assert(DT_MAX_GROUP <= DT_BN && 2 * D <= DT_BN * LD, "the fused rope's q and cos/sin fit a tile buffer");
    extern __shared__ __align__(16) unsigned char dt_smem[];
    T *kbuf = (T *)dt_smem, *vbuf = kbuf + NB * DT_BN * LD;
    __shared__ float m_s[DT_WARPS][DT_MAX_GROUP], l_s[DT_WARPS][DT_MAX_GROUP];
    __shared__ int bad_s;
    __shared__ int32_t early_bad_blk_s; /* a bad block met before the wait (recorded after it) */

    const int kvh = cache.n_kv_heads, bs = cache.block_size;
    const int s = blockIdx.y, S = P.splits;
    const int h0 = kh * P.group, gn = P.group; /* q heads h0 .. h0 + gn - 1 */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int g = lane >> 2, tig = lane & 3;
    int32_t value = 0, limit = 0;
    /* the diagnostic timeline: [entry, first tile in, done, SM] per block */
    const int64_t trace_at = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
    unsigned long long *tr = P.trace && tid == 0 && trace_at < TRACE_BLOCKS ? P.trace + 4 * trace_at : NULL;
    if (tr) tr[0] = globaltimer_ns();
    const int32_t code = token_fault(seq, pos, batch, bs, &value, &limit);
    /* the fused rope's scratch (P.rope_k.data): tile buffer NB - 1, which no tile takes before
     * the main loop (the prologue fills buffers 0 .. NB - 2) */
    const bool rope = P.rope_k.data != nullptr;
    float *rope_cs = (float *)(vbuf + (NB - 1) * DT_BN * LD);
    T *rope_q = kbuf + (NB - 1) * DT_BN * LD;
    if (code != TP_CUDA_FAULT_NONE) {
        if (pdl_pending) pdl_wait(); /* out may still be read by an earlier kernel */
        if (rope && s == 0) { /* the store happens all the same (qk_rope_store's) */
            dt_rope_angles<D>(P.inv_freq, pos, rope_cs);
            __syncthreads();
            dt_rope<T, D, W>(q, P, cache, batch, fault, i, kh, h0, gn, rope_cs, rope_q, true);
        }
        if (tid == 0 && s == 0) fault_record(fault, code, i, value, limit);
        if (S == 1) /* no combine kernel to zero it */
            for (int e = tid; e < gn * D; e += DT_THREADS)
                store_act(out.data, out.dtype, i * out.stride + (int64_t)h0 * D + e, 0.0f);
        return;
    }
    const int lo = window_first(pos, batch.window), base = window_base(pos, batch.window); /* the combine's too */
    const int np = pos + 1 - base, se = token_splits(np, S, P.min_split);
    if (s >= se) return;
    const int c = CEIL_DIV(np, se), b0 = base + s * c, b1 = min(pos + 1, b0 + c);
    const int64_t pbase = (i * P.q_heads + h0) * S + s;
    if (tid == 0) bad_s = 0, early_bad_blk_s = INT32_MIN;
    __syncthreads(); /* before any load can set them */
    if (b0 >= b1) { /* an empty split (only with se > 1) */
        if (pdl_pending) pdl_wait();
        if (tid < gn) {
            P.part_m[pbase + (int64_t)tid * S] = -INFINITY;
            P.part_l[pbase + (int64_t)tid * S] = 0.0f;
        }
        return;
    }

    const int64_t width = (int64_t)kvh * D;
    const T *kc = (const T *)cache.k + (int64_t)kh * D, *vc = (const T *)cache.v + (int64_t)kh * D;
    const int32_t *bt = batch.block_table + (int64_t)seq * batch.max_blocks;
    const int nkt = CEIL_DIV(b1 - b0, DT_BN);

    /* K and V rows of keys b0 + kt * DT_BN .. + DT_BN - 1 into buffer b: a row's chunks are
     * consecutive threads; zeros past b1 and for a bad block (recorded, the output zeroed).
     * Where every tile lies in one cache block (a power-of-two block of >= DT_BN keys, tiles
     * starting at multiples of DT_BN), a tile takes one block-table entry and its rows follow
     * width apart (the per-key reads and 64-bit address sums were ~400 of the tile loop's ~960
     * instructions). */
    bool waited = !pdl_pending;
    const bool tile_in_block = P.tile_in_block && P.bs_shift >= 0 && bs >= DT_BN && b0 % DT_BN == 0;
    /* tile_in_block: the item's block-table entries 32 at a time, lane j holding entry bt_first + j,
     * and a tile's entry by a shuffle rather than a read in front of each tile's copies (the
     * tiles ask in increasing order) */
    const int lb_last = tile_in_block ? (b1 - 1) >> P.bs_shift : 0;
    int bt_first = INT32_MIN / 2;
    int32_t bt_lane = -1;
    auto bad_block = [&](int32_t blk) {
        if (waited) fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, i, blk, cache.n_blocks);
        else early_bad_blk_s = blk;
        bad_s = 1;
    };
    auto load = [&](int kt, int b) {
        T *kd = kbuf + b * DT_BN * LD, *vd = vbuf + b * DT_BN * LD;
        const int col = tid % CPR;
        if (tile_in_block) {
            const int p0 = b0 + kt * DT_BN; /* < b1: only tiles with keys are loaded */
            const int lb = p0 >> P.bs_shift;
            if (lb - bt_first >= WARP_SIZE) { /* the same in every lane: kt is */
                bt_first = lb;
                bt_lane = lb + lane <= lb_last ? __ldg(bt + lb + lane) : -1;
            }
            const int32_t blk = __shfl_sync(0xffffffffu, bt_lane, lb - bt_first);
            const int64_t row0 = kv_row_in(blk, lb, p0, bs, cache.n_blocks, width);
            if (row0 < 0 && tid == 0) bad_block(blk);
            /* keys below lim are read; a bad block's rows are zeros (pointers into block 0, unread) */
            const int lim = row0 < 0 ? 0 : b1 - p0;
            const int64_t at = (row0 < 0 ? 0 : row0) + (int64_t)(tid / CPR) * width + col * 8;
            const T *ks = kc + at, *vs = vc + at;
#pragma unroll
            for (int j = 0; j < LOADS; j++) {
                const int key = tid / CPR + j * (DT_THREADS / CPR), n = key < lim ? 16 : 0;
                pf_cp_async16(kd + key * LD + col * 8, ks + (int64_t)j * (DT_THREADS / CPR) * width, n);
                pf_cp_async16(vd + key * LD + col * 8, vs + (int64_t)j * (DT_THREADS / CPR) * width, n);
            }
            return;
        }
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int key = tid / CPR + j * (DT_THREADS / CPR), p = b0 + kt * DT_BN + key;
            const T *ksrc = kc, *vsrc = vc;
            int bytes = 0;
            if (p < b1 && p >= lo) {
                int32_t blk;
                const int64_t row = kv_row_at(bt, p, bs, P.bs_shift, cache.n_blocks, width, &blk);
                if (row < 0) {
                    if (col == 0) bad_block(blk);
                } else {
                    ksrc = kc + row + col * 8, vsrc = vc + row + col * 8, bytes = 16;
                }
            }
            pf_cp_async16(kd + key * LD + col * 8, ksrc, bytes);
            pf_cp_async16(vd + key * LD + col * 8, vsrc, bytes);
        }
    };

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    /* the first NB - 1 tiles, one commit group each (empty past the last): before the wait
     * for the previous kernel where all their keys are before pos */
    const bool early = pdl_pending && b0 + (NB - 1) * DT_BN <= pos;
    auto prologue = [&]() {
#pragma unroll
        for (int j = 0; j < NB - 1; j++) {
            if (j < nkt) load(j, j);
            pf_cp_async_commit();
        }
    };
    if (early) prologue();
    if (rope) dt_rope_angles<D>(P.inv_freq, pos, rope_cs); /* uploads: ahead of the wait */
    if (pdl_pending) {
        pdl_wait(); /* q and the step's own K/V rows come from earlier kernels */
        waited = true;
        __syncthreads(); /* early_bad_blk_s as the early loads left it */
        if (tid == 0 && early_bad_blk_s != INT32_MIN)
            fault_record(fault, TP_CUDA_FAULT_ATTN_BLOCK, i, early_bad_blk_s, cache.n_blocks);
    }
    /* q fragments: rows g and g + 8 are q heads h0 + g, h0 + g + 8 (zeros past the group) */
    uint32_t qf[KS][4];
    if (rope) {
        /* q rotated into rope_q; the split holding pos stores the step's K and V rows (the early
         * tiles end before pos), the barrier then ordering them before this block's copies */
        __syncthreads(); /* rope_cs */
        dt_rope<T, D, W>(q, P, cache, batch, fault, i, kh, h0, gn, rope_cs, rope_q, b0 <= pos && pos < b1);
        __syncthreads();
        const uint16_t *qa = (const uint16_t *)rope_q + g * LD;
        fa_load_q<KS>(qf, qa, qa + 8 * LD, g < gn, g + 8 < gn, tig, true);
        __syncthreads(); /* every warp holds its fragments before buffer NB - 1 takes a tile */
    } else {
        const uint16_t *qa = (const uint16_t *)q.data + i * q.stride + (int64_t)(h0 + g) * D;
        fa_load_q<KS>(qf, qa, qa + 8 * D, g < gn, g + 8 < gn, tig, ((uintptr_t)q.data & 3) == 0 && (q.stride & 1) == 0);
    }
    if (!early) prologue();
    for (int kt = 0; kt < nkt; kt++) {
        if (kt + NB - 1 < nkt) load(kt + NB - 1, (kt + NB - 1) % NB);
        pf_cp_async_commit();
        pf_cp_async_wait<NB - 1>(); /* tile kt is in */
        __syncthreads();
        if (tr && kt == 0) tr[1] = globaltimer_ns();
        const int k0 = b0 + kt * DT_BN + warp * 16; /* the warp's first key */
        if (k0 < b1) {
            const T *kt_s = kbuf + (kt % NB) * DT_BN * LD, *vt_s = vbuf + (kt % NB) * DT_BN * LD;
            /* S = Q K^T over the warp's 16 keys */
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            fa_qk<T, KS, 1, LD>(sc, qf, kt_s + warp * 16 * LD, lane);
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = log2_softcap(sc[n][e] * P.qscale, P.cap);
                    const int key = k0 + n * 8 + 2 * tig + (e & 1);
                    if (key >= b1 || key < lo) x = -INFINITY;
                    sc[n][e] = x;
                }
            float mx[2];
            fa_row_max(sc, m, mx);
            fa_softmax_step(sc, mx, m, l, o);
            fa_pv16<T, NT, LD>(o, sc[0], sc[1], vt_s + warp * 16 * LD, lane); /* O += P V */
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
    }

    /* merge the warps: rows' sums over the quad, then (m, l, O) of each warp through shared
     * memory (the tile buffers are free now) */
    pf_cp_async_wait<0>();
#pragma unroll
    for (int e = 0; e < 2; e++) {
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 1);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 2);
    }
    float *sacc = (float *)dt_smem; /* [DT_WARPS][DT_MAX_GROUP][D] */
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int r = g + 8 * e;
        if (r >= gn) continue;
        if (tig == 0) {
            m_s[warp][r] = m[e];
            l_s[warp][r] = l[e];
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            sacc[(warp * DT_MAX_GROUP + r) * D + n * 8 + 2 * tig] = o[n][2 * e];
            sacc[(warp * DT_MAX_GROUP + r) * D + n * 8 + 2 * tig + 1] = o[n][2 * e + 1];
        }
    }
    __syncthreads();
    const bool any_bad = bad_s != 0, direct = se == 1;
    for (int e = tid; e < gn * D; e += DT_THREADS) {
        const int r = e / D, d = e % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++) M = fmaxf(M, m_s[w][r]);
        const float mref = M == -INFINITY ? 0.0f : M;
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++) {
            const float cw = exp2f(m_s[w][r] - mref); /* 0 for a warp that saw no key */
            L += l_s[w][r] * cw;
            A += sacc[(w * DT_MAX_GROUP + r) * D + d] * cw;
        }
        if (direct) {
            store_act(out.data, out.dtype, i * out.stride + (int64_t)(h0 + r) * D + d, any_bad ? 0.0f : A / L);
        } else {
            const int64_t pi = pbase + (int64_t)r * S;
            P.part_acc[pi * D + d] = A;
            if (d == 0) {
                P.part_m[pi] = M;
                P.part_l[pi] = any_bad ? -1.0f : L;
            }
        }
    }
    if (tr) {
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        tr[2] = globaltimer_ns();
        tr[3] = sm;
    }
}

// ----------------------------------------------------------------------------
// launchers

/* log2(block_size) when it is a power of two (the kernels shift), else -1 (they divide) */
static int32_t block_shift(int bs)
{
    if (bs <= 0 || (bs & (bs - 1))) return -1;
    int32_t sh = 0;
    while ((1 << sh) < bs) sh++;
    return sh;
}

/* The decode kernel's per-block timeline, a diagnostic for bench/gpu_attention: while on,
 * each block of the tensor-core decode kernel writes [entry, first tile in, done] (%globaltimer
 * ns) and its SM into a device buffer of TRACE_BLOCKS blocks; the call after the one to
 * study copies it out. */
static int trace_on;
static unsigned long long *trace_dev;

extern "C" tp_status tp_cuda_attention_trace(int on, unsigned long long *host, int blocks)
{
    if (on && !trace_dev) {
        TP_CUDA_CHECK(cudaMalloc((void **)&trace_dev, (size_t)4 * TRACE_BLOCKS * sizeof *trace_dev));
        TP_CUDA_CHECK(cudaMemset(trace_dev, 0, (size_t)4 * TRACE_BLOCKS * sizeof *trace_dev));
        TP_CUDA_CHECK(cudaDeviceSynchronize()); /* the legacy stream's memset, before the backend's stream */
    }
    trace_on = on && trace_dev;
    if (host && trace_dev) {
        if (blocks > TRACE_BLOCKS) blocks = TRACE_BLOCKS;
        TP_CUDA_CHECK(cudaDeviceSynchronize());
        TP_CUDA_CHECK(cudaMemcpy(host, trace_dev, (size_t)4 * blocks * sizeof *host, cudaMemcpyDeviceToHost));
    }
    return TP_OK;
}

extern "C" void tp_cuda_attention_force_simple(int on) { force_simple = on; }

extern "C" void tp_cuda_attention_force_prefill(int mode) { force_prefill = mode < 0 ? -1 : mode > 0; }

extern "C" void tp_cuda_attention_force_warps(int w) { force_warps = w == 1 || w == 2 || w == 4 ? w : 0; }

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
    tp_launch(attention_flash_kernel<CT, GMAX, VPL>, grid, FA_THREADS, smem, stream, q, cache, batch, P, out, fault);
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

/* The tokens of tile blockIdx.x (PF_BM tokens) that the prefill kernel left (decode tokens,
 * short runs, faulty tokens), appended to list (in no set order) and counted in *count,
 * which the host zeroed. One warp per tile. */
__global__ void __launch_bounds__(WARP_SIZE) pf_list_kernel(tp_attn_batch batch, int bs, int32_t *list, int32_t *count)
{
    const int64_t t0 = (int64_t)blockIdx.x * PF_BM;
    const int cnt = (int)min((int64_t)PF_BM, (int64_t)batch.n_tokens - t0), lane = threadIdx.x;
    uint64_t ok;
    const uint64_t starts = pf_tile_scan(batch, t0, cnt, bs, &ok);
    pdl_wait(); /* nothing of the previous kernel is read; the count's memset came before the launch */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = hf * WARP_SIZE + lane;
        int r0, r1;
        const bool left = r < cnt && !pf_run(starts, ok, r, &r0, &r1);
        const unsigned mask = __ballot_sync(0xffffffffu, left);
        int at = 0;
        if (lane == 0 && mask) at = atomicAdd(count, __popc(mask));
        at = __shfl_sync(0xffffffffu, at, 0);
        if (left) list[at + __popc(mask & ((1u << lane) - 1))] = (int32_t)(t0 + r);
    }
    pdl_trigger();
}

/* Block (token i, KV head kh, split): grid (n_tokens * kv_heads, S). After the prefill kernel
 * (pf_skip) with a list: grid (a wave of blocks, S), block b taking items b, b + gridDim.x, ..
 * of (listed token, KV head): a prefill step's tokens are nearly all the prefill kernel's, and
 * a block per token only to find that out cost ~0.5 ms a layer at 8192 tokens (three resident
 * blocks per SM, each scanning its tile); without a list, a block per token (pf_took). */
template <typename T, int D, int W, int NB>
__global__ void __launch_bounds__(W * WARP_SIZE, 12 / W)
    attention_decode_tc_kernel(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, fa_params P, tp_tensor out,
                               tp_cuda_fault *fault)
{
    pdl_trigger();
    const int kvh = cache.n_kv_heads;
    const bool listed = P.pf_list != nullptr;
    int64_t k = blockIdx.x, end = k + 1, step = 1; /* items (token, KV head): one, or the list's */
    int32_t seq = 0, pos = 0;
    if (!listed) { /* the step's indices come from uploads: read them while the previous kernel runs */
        seq = __ldg(batch.seq + k / kvh);
        pos = __ldg(batch.pos + k / kvh);
    }
    /* a decode step's items wait inside, after asking for their first tiles */
    const bool pending = !listed && !P.pf_skip && batch.one_per_seq;
    if (!pending) pdl_wait(); /* q, the step's K/V rows and the list come from earlier kernels */
    if (listed) end = (int64_t)*P.pf_count * kvh, step = gridDim.x;
    for (; k < end; k += step) {
        const int64_t i = listed ? P.pf_list[k / kvh] : k / kvh;
        if (listed) {
            __syncthreads(); /* the last item is done with the shared memory */
            seq = __ldg(batch.seq + i);
            pos = __ldg(batch.pos + i);
        } else if (P.pf_skip && pf_took(batch, i, cache.block_size)) {
            return; /* the prefill kernel wrote it */
        }
        decode_tc_item<T, D, W, NB>(q, cache, batch, P, out, fault, i, (int)(k % kvh), seq, pos, pending);
    }
    if (pending) pdl_wait(); /* every path has waited before the kernel ends (custom_ar.cu relies on it) */
}

template <typename T, int D, int W, int NB>
static void launch_decode_tc(dim3 grid, int sms, tp_tensor q, tp_kv_layer cache, tp_attn_batch batch,
                             const fa_params &P, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    /* over 48 KiB of dynamic shared memory is asked for per device: at every launch (a host
     * call, no stream operation, so it may come inside a graph recording) */
    const size_t smem = dt_smem_bytes<D, W, NB>();
    (void)cudaFuncSetAttribute(attention_decode_tc_kernel<T, D, W, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)smem);
    if (P.pf_list) { /* one wave of resident blocks takes the list */
        static int per_sm = 0;
        if (!per_sm && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_decode_tc_kernel<T, D, W, NB>,
                                                                     W * WARP_SIZE, smem) != cudaSuccess ||
                        per_sm < 1)) {
            (void)cudaGetLastError();
            per_sm = 1;
        }
        const int64_t wave = (int64_t)per_sm * (sms > 0 ? sms : 1);
        if ((int64_t)grid.x > wave) grid.x = (unsigned)wave;
    }
    tp_launch(attention_decode_tc_kernel<T, D, W, NB>, grid, W * WARP_SIZE, smem, stream, q, cache, batch, P, out,
              fault);
}

/* w warps per block (1, 2 or 4); nb tile buffers for one warp (2 or 3), two otherwise */
template <typename T, int D>
static void launch_decode_tc_w(int w, int nb, dim3 grid, int sms, tp_tensor q, tp_kv_layer cache,
                               tp_attn_batch batch, const fa_params &P, tp_tensor out, tp_cuda_fault *fault,
                               cudaStream_t stream)
{
    if (w == 1 && nb == 2) launch_decode_tc<T, D, 1, 2>(grid, sms, q, cache, batch, P, out, fault, stream);
    else if (w == 1) launch_decode_tc<T, D, 1, 3>(grid, sms, q, cache, batch, P, out, fault, stream);
    else if (w == 2) launch_decode_tc<T, D, 2, 2>(grid, sms, q, cache, batch, P, out, fault, stream);
    else launch_decode_tc<T, D, 4, 2>(grid, sms, q, cache, batch, P, out, fault, stream);
}

/* Whether the decode kernel on tensor cores takes the flash kernel's work: a 16-bit cache
 * with q of its dtype, head_dim 64 or 128, at most DT_MAX_GROUP q heads per KV head, and
 * TPINFER_ATTN_DECODE_TC not 0 (the flash kernel, what bench/gpu_attention compares). */
static int decode_tc_wanted(const tp_tensor &q, const tp_kv_layer &cache, int group)
{
    static int env = -1;
    if (env < 0) env = env_int("TPINFER_ATTN_DECODE_TC", 1, 0, 1);
    if (!env || (cache.dtype != TP_DTYPE_BF16 && cache.dtype != TP_DTYPE_F16) || q.dtype != cache.dtype) return 0;
    return (cache.head_dim == 64 || cache.head_dim == 128) && group <= DT_MAX_GROUP;
}

/* rope_k (with rope_v and inv_freq): the tensor-core decode kernel ropes and stores the step's
 * rows too (tp_cuda_attention_rope; the caller made sure it takes the batch); else NULL. */
static tp_status attention_flash(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                 float scale, tp_tensor out, tp_cuda_attn_scratch scratch, int lp_log2, int vpl,
                                 int pf_skip, tp_cuda_fault *fault, cudaStream_t stream,
                                 const tp_tensor *rope_k = NULL, const tp_tensor *rope_v = NULL,
                                 const float *inv_freq = NULL)
{
    const int64_t n = batch.n_tokens, kvh = cache.n_kv_heads, hd = cache.head_dim;
    const int group = q_heads / (int)kvh;
    const int tc = decode_tc_wanted(q, cache, group);
    /* q heads per block: the group, or an even share of it in blocks of at most FA_MAX_GROUP
     * (the tensor-core kernel: the group, up to DT_MAX_GROUP) */
    const int gb = tc ? group : CEIL_DIV(group, CEIL_DIV(group, FA_MAX_GROUP)), nhg = CEIL_DIV(group, gb);
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
    /* under pf_skip, the tensor-core kernel's list of the tokens the prefill kernel leaves
     * goes at the end of the scratch (the count, then one entry per token) */
    const size_t list_bytes = tc && pf_skip && scratch.data ? ((size_t)(n + 1) * sizeof(int32_t) + 255) / 256 * 256 : 0;
    const bool listed = list_bytes > 0 && list_bytes <= scratch.bytes / 2;
    if (listed) scratch.bytes -= list_bytes;
    int64_t S = 1;
    const int64_t target = (int64_t)blocks_per_sm * (scratch.sm_count > 0 ? scratch.sm_count : 1);
    if (scratch.data && base < target) {
        S = CEIL_DIV(target, base);
        /* keys a token reads at most: its context, or its window from a multiple of WINDOW_ALIGN */
        const int64_t reach = batch.window > 0 && batch.window + WINDOW_ALIGN < batch.max_pos
                                  ? batch.window + WINDOW_ALIGN : batch.max_pos;
        S = S < reach / min_split ? S : reach / min_split;
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
    P.cap = log2_cap(batch.softcap);
    P.pf_skip = pf_skip;
    P.bs_shift = block_shift(cache.block_size);
    static int tile_env = -1;
    if (tile_env < 0) tile_env = env_int("TPINFER_ATTN_TILE_IN_BLOCK", 1, 0, 1);
    P.tile_in_block = tile_env;
    P.part_acc = (float *)scratch.data;
    P.part_m = P.part_acc ? P.part_acc + n * q_heads * S * hd : NULL;
    P.part_l = P.part_m ? P.part_m + n * q_heads * S : NULL;
    P.trace = trace_on ? trace_dev : NULL;
    P.pf_count = listed ? (int32_t *)((char *)scratch.data + scratch.bytes) : NULL;
    P.pf_list = listed ? P.pf_count + 1 : NULL;
    memset(&P.rope_k, 0, sizeof P.rope_k);
    memset(&P.rope_v, 0, sizeof P.rope_v);
    P.inv_freq = inv_freq;
    if (rope_k) {
        if (!tc || listed) return tp_error(TP_ERR_INTERNAL, "attention: the fused rope needs the decode kernel alone");
        P.rope_k = *rope_k;
        P.rope_v = *rope_v;
    }
    static int early_env = -1; /* TPINFER_ATTN_EARLY_KV=0: a decode step's keys only after the wait */
    if (early_env < 0) early_env = env_int("TPINFER_ATTN_EARLY_KV", 1, 0, 1);
    if (!early_env) batch.one_per_seq = 0;

    const dim3 grid((unsigned)base, (unsigned)S);
    const size_t smem = (size_t)FA_WARPS * gmax * (hd + 2) * sizeof(float);
    if (tc) {
        static int w_env = -1;
        if (w_env < 0) w_env = env_int("TPINFER_ATTN_DT_WARPS", 0, 0, 4);
        /* one warp per item where there are many (no splits: 12 blocks per SM hide the short
         * contexts' per-item latencies best); four where splits make few long items */
        const int wf = force_warps ? force_warps : w_env;
        const int w = wf == 1 || wf == 2 || wf == 4 ? wf : S == 1 ? 1 : 4;
        static int nb_env = -1;
        if (nb_env < 0) nb_env = env_int("TPINFER_ATTN_DT_BUFFERS", 3, 2, 3);
        const int nb = nb_env;
        if (listed) { /* the count zeroed (a memset: the list kernel's launch waits for it) */
            TP_CUDA_CHECK(cudaMemsetAsync(P.pf_count, 0, sizeof(int32_t), stream));
            tp_launch(pf_list_kernel, (unsigned)CEIL_DIV(n, PF_BM), WARP_SIZE, 0, stream, batch, cache.block_size,
                      P.pf_list, P.pf_count);
            TP_CUDA_CHECK_LAUNCH();
        }
        const bool bf = cache.dtype == TP_DTYPE_BF16;
        if (hd == 64) {
            if (bf) launch_decode_tc_w<bf16_t, 64>(w, nb, grid, scratch.sm_count, q, cache, batch, P, out, fault, stream);
            else launch_decode_tc_w<f16_t, 64>(w, nb, grid, scratch.sm_count, q, cache, batch, P, out, fault, stream);
        } else {
            if (bf) launch_decode_tc_w<bf16_t, 128>(w, nb, grid, scratch.sm_count, q, cache, batch, P, out, fault, stream);
            else launch_decode_tc_w<f16_t, 128>(w, nb, grid, scratch.sm_count, q, cache, batch, P, out, fault, stream);
        }
    } else switch (cache.dtype) {
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
        tp_launch(attention_combine_kernel, (unsigned)(n * q_heads), FA_COMBINE_THREADS, 0, stream, batch,
                  cache.block_size, cache.head_dim, P, out);
        TP_CUDA_CHECK_LAUNCH();
    }
    return TP_OK;
}

template <typename T, int D, typename OT>
static tp_status launch_prefill(dim3 grid, tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, const pf_params &P,
                                tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    const size_t smem = pf_smem_bytes<D>();
    /* over 48 KiB of dynamic shared memory must be asked for, per device: every launch (prefill
     * steps are eager and long, the call is cheap) */
    TP_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<T, D, OT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
    /* PF_MIN_BLOCKS blocks' shared memory: at head_dim 128 more than the driver's own choice
     * gave (2 blocks, 164 KiB) */
    TP_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<T, D, OT>,
                                       cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    tp_launch(attention_prefill_kernel<T, D, OT>, grid, PF_THREADS, smem, stream, q, cache, batch, P, out, fault);
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

template <typename T, int D>
static tp_status launch_prefill_o(dim3 grid, tp_tensor q, tp_kv_layer cache, tp_attn_batch batch,
                                  const pf_params &P, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    switch (out.dtype) {
    case TP_DTYPE_F32: return launch_prefill<T, D, float>(grid, q, cache, batch, P, out, fault, stream);
    case TP_DTYPE_BF16: return launch_prefill<T, D, bf16_t>(grid, q, cache, batch, P, out, fault, stream);
    case TP_DTYPE_F16: return launch_prefill<T, D, f16_t>(grid, q, cache, batch, P, out, fault, stream);
    default: return TP_CUDA_BAD_DTYPE("attention");
    }
}

/* Whether the prefill kernel runs before the flash kernel (then with pf_skip): a 16-bit
 * cache with q of its dtype, head_dim 64 or 128, and (unless forced on) a step of at least
 * PF_MIN_TOKENS tokens that is not being recorded into a CUDA graph (graphs are decode steps,
 * one token per sequence: nothing for it to take) and TPINFER_ATTN_PREFILL not 0. */
static int prefill_wanted(const tp_tensor &q, const tp_kv_layer &cache, const tp_attn_batch &batch,
                          int32_t q_heads, cudaStream_t stream)
{
    if (force_prefill == 0) return 0;
    if (cache.dtype != TP_DTYPE_BF16 && cache.dtype != TP_DTYPE_F16) return 0; /* f32 keeps the flash kernel */
    if (q.dtype != cache.dtype || (cache.head_dim != 64 && cache.head_dim != 128)) return 0;
    if ((uintptr_t)cache.k % 16 != 0 || (uintptr_t)cache.v % 16 != 0) return 0; /* cp.async of 16 bytes */
    if (CEIL_DIV((int64_t)batch.n_tokens, PF_BM) > 65535 || q_heads > 65535) return 0; /* grid y, x */
    if (force_prefill > 0) return 1;
    static int env = -1;
    if (env < 0) env = env_int("TPINFER_ATTN_PREFILL", 1, 0, 1);
    if (!env || batch.n_tokens < PF_MIN_TOKENS) return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cs == cudaStreamCaptureStatusNone;
}

static tp_status attention_prefill(tp_tensor q, tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads,
                                   float scale, tp_tensor out, tp_cuda_fault *fault, cudaStream_t stream)
{
    pf_params P;
    P.group = q_heads / cache.n_kv_heads;
    P.n_tiles = (int32_t)CEIL_DIV((int64_t)batch.n_tokens, PF_BM);
    const int bs = cache.block_size;
    P.bs_shift = block_shift(bs);
    P.qscale = scale * 1.4426950408889634f; /* log2(e) */
    P.cap = log2_cap(batch.softcap);
    /* q heads fastest: the heads of one KV head run together and share its K/V through L2 */
    const dim3 grid((unsigned)q_heads, (unsigned)P.n_tiles);
    const bool bf = cache.dtype == TP_DTYPE_BF16;
    if (cache.head_dim == 64)
        return bf ? launch_prefill_o<bf16_t, 64>(grid, q, cache, batch, P, out, fault, stream)
                  : launch_prefill_o<f16_t, 64>(grid, q, cache, batch, P, out, fault, stream);
    return bf ? launch_prefill_o<bf16_t, 128>(grid, q, cache, batch, P, out, fault, stream)
              : launch_prefill_o<f16_t, 128>(grid, q, cache, batch, P, out, fault, stream);
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
                tp_launch(attention_simple_kernel<decltype(qt), decltype(ct), decltype(ot)>, (unsigned)tasks,
                          ATTN_THREADS, smem, stream, q, cache, batch, q_heads, scale, out, fault);
            });
        });
    });
    TP_CUDA_CHECK_LAUNCH();
    return TP_OK;
}

extern "C" int tp_cuda_attention_rope_fits(tp_tensor q, tp_tensor k, tp_tensor v, tp_kv_layer cache,
                                           tp_attn_batch batch, int32_t q_heads)
{
    static int env = -1;
    if (env < 0) env = env_int("TPINFER_ROPE_ATTENTION", 1, 0, 1);
    int vpl = 1;
    if (!env || !batch.one_per_seq || force_simple || flash_lanes_log2(cache, &vpl) < 0) return 0;
    if (k.dtype != cache.dtype || v.dtype != cache.dtype || q_heads % cache.n_kv_heads != 0) return 0;
    return decode_tc_wanted(q, cache, q_heads / cache.n_kv_heads);
}

extern "C" tp_status tp_cuda_attention_rope(tp_tensor q, tp_tensor k, tp_tensor v, const float *inv_freq,
                                            tp_kv_layer cache, tp_attn_batch batch, int32_t q_heads, float scale,
                                            tp_tensor out, tp_cuda_attn_scratch scratch, tp_cuda_fault *fault,
                                            cudaStream_t stream)
{
    if ((int64_t)batch.n_tokens * q_heads <= 0) return TP_OK;
    if (!tp_cuda_attention_rope_fits(q, k, v, cache, batch, q_heads))
        return tp_error(TP_ERR_INTERNAL, "attention: the fused rope does not take this batch");
    int vpl = 1;
    const int lp_log2 = flash_lanes_log2(cache, &vpl);
    /* one token per sequence: nothing for the prefill kernel */
    return attention_flash(q, cache, batch, q_heads, scale, out, scratch, lp_log2, vpl, 0, fault, stream, &k, &v,
                           inv_freq);
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
    if (lp_log2 < 0) return attention_simple(q, cache, batch, q_heads, scale, out, fault, stream);
    /* prefill chunks on tensor cores first; the flash kernel then does the tokens it left */
    const int pf = prefill_wanted(q, cache, batch, q_heads, stream);
    if (pf) TP_CHECK(attention_prefill(q, cache, batch, q_heads, scale, out, fault, stream));
    return attention_flash(q, cache, batch, q_heads, scale, out, scratch, lp_log2, vpl, pf, fault, stream);
}
