/*
 * custom_ar.cu: a one-shot all-reduce over CUDA IPC for small messages (vLLM's custom
 * all-reduce idea). At batch 1 a decode step makes two all-reduces of 16 KiB per layer;
 * NCCL takes about 6.7 us for each on two H200s, this about half.
 *
 * Each rank owns one device allocation, mapped by every peer (cudaIpcGetMemHandle /
 * cudaIpcOpenMemHandle):
 *
 *     [ signal area, CAR_SIGNAL_BYTES ][ slot 0, max bytes ][ slot 1, max bytes ]
 *
 * The signal area holds flags[block][src] (written by rank src, remotely, and polled
 * here), and two words only this rank's kernel touches: calls (how many all-reduces this
 * communicator has completed) and done (blocks of the current call that finished).
 *
 * One call is one kernel of G blocks (G and the split of the message among blocks and
 * threads depend on the byte count only, so every rank launches the same grid and every
 * thread handles the same 16-byte pieces on every rank):
 *   1. pdl_begin(): nothing is touched before the previous kernel of the stream is
 *      complete (programmatic dependent launch, common.cuh).
 *   2. e = calls + 1 (the call's epoch; read from device memory, so graph replays keep
 *      counting); slot s = e & 1.
 *   3. Each thread copies its pieces of send into this rank's slot s.
 *   4. Barrier of block b with block b of every peer: __syncthreads(), then thread i < n
 *      stores e into rank i's flags[b][me] with st.release.sys (cumulative over the
 *      block's slot writes, which the bar.sync ordered before it), then spins until
 *      flags[b][i] here reaches e (relaxed loads, then fence.acq_rel.sys: an acquire),
 *      then __syncthreads().
 *   5. Each thread loads its pieces from slot s of ranks 0, 1, ..., n-1 IN THAT ORDER,
 *      sums in float32 and writes recv. Every rank adds the same values in the same order,
 *      so every rank gets the same bits (for two ranks, a + b: NCCL's bits too; 16-bit
 *      types are rounded once, from the f32 sum, as NCCL rounds a two-rank sum).
 *   6. The last block to finish (an atomic count) stores calls = e.
 *
 * Why one barrier per call is enough with two slots. Let calls be numbered e = 1, 2, ...
 * on every rank (every rank makes the same sequence of collectives on a communicator).
 *  - Peers read my slot s(e) only in call e, after the barrier of e; every block's
 *    barrier waits for my flag e, which I store after writing my pieces: what they read is
 *    what I wrote for e (release/acquire at system scope). Flags only grow, so a peer that
 *    already stored e + 1 (it finished e and entered e + 1) also lets me through, with its
 *    slot s(e) still intact (e + 1 writes the other slot).
 *  - I write slot s(e) again in call e + 2. That kernel starts after pdl_wait(), i.e.
 *    after my kernel e + 1 completed; it completed only after each of its blocks saw
 *    every peer's flag >= e + 1, which a peer stores after its own pdl_wait() in call
 *    e + 1, i.e. after its kernel e completed, reads of my slot s(e) included. So no peer
 *    still reads slot s(e) when I overwrite it. (The chain "kernel k + 1 complete =>
 *    kernel k complete" holds because every kernel launched with PDL in this program
 *    calls pdl_wait() before it ends, and a launch without PDL serializes fully.)
 *  - One barrier per block suffices for the data: block b reads only the pieces that
 *    block b of each rank wrote (same grid, same split); and the slot argument above needs
 *    only that some block of call e + 1 met every peer, which every block does.
 *  - The epoch is not a kernel argument: calls lives in device memory and the kernel
 *    advances it (6), so a captured graph replays correctly any number of times. It is
 *    read after pdl_wait(), when the previous call's last block has stored it; within a
 *    call every block reads it before adding itself to done, and the last of them writes
 *    it only after all have added themselves.
 *  - In place (send == recv): a thread reads its pieces of send in step 3 and writes the
 *    same pieces of recv in step 5, after the barrier; no other thread touches them, and
 *    the sum reads the slots, not send.
 *  - Flags are 64-bit: no wrap-around (at 10^5 calls a second, millions of years).
 *
 * Everything about the set-up is decided collectively (bootstrap all-gathers) so that
 * every rank of a group takes the same path for every call: a rank alone on NCCL while
 * its peers wait at the flag barrier would hang both. The per-call decision depends on the
 * byte count and dtype only (tp_car_takes); a send or recv that is not 16-byte aligned on
 * one rank changes only how that rank's threads load and store, not the protocol.
 *
 * A start-up probe (one all-reduce with a 20 s time-out, checked) proves the mappings
 * work; a wait that runs out, a wrong sum, or any CUDA error there leaves the group on
 * NCCL. The kernels of real calls wait without a time-out, as NCCL's do; an abort flag in
 * mapped host memory (tp_car_abort) lets them out on the fatal path.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.cuh"
#include "custom_ar.h"
#include "log.h"
#include "util.h"

#define CAR_MAX_RANKS 8
#define CAR_MAX_BLOCKS 36 /* vLLM's choice for 512 KiB; more blocks make the barrier dearer */
#define CAR_THREADS 512
#define CAR_SIGNAL_BYTES 4096
#define CAR_PROBE_OFFSET 3072 /* inside the signal area: the probe's 64 bytes (local only) */
#define CAR_DEFAULT_MAX (512 * 1024)           /* groups of 3 or more: a batch-1 decode step's messages */
#define CAR_DEFAULT_MAX_PAIR (4 * 1024 * 1024) /* two ranks: batch-128 decode's 2 MiB too (5.89 against 7.01 ms a
                                                * step at tp=2 on 2 x H200 with NCCL above 512 KiB, bench/RESULTS.md);
                                                * one-shot traffic grows with the ranks: larger groups not measured */
#define CAR_LIMIT_MAX (256 * 1024 * 1024) /* TPINFER_CUSTOM_AR_MAX is clamped to this */
#define CAR_PROBE_TIMEOUT_NS 20000000000ull

struct car_signal {
    unsigned long long flags[CAR_MAX_BLOCKS][CAR_MAX_RANKS]; /* [block][src rank] */
    unsigned long long calls;                                /* this rank's, local */
    unsigned int done;                                       /* this rank's, local */
};
static_assert(sizeof(car_signal) <= CAR_PROBE_OFFSET, "the signal area holds the flags and the probe");
static_assert(CAR_PROBE_OFFSET + 64 <= CAR_SIGNAL_BYTES, "the probe fits the signal area");

/* What a kernel needs, passed by value (no device-side table to keep up to date). */
struct car_params {
    char *data[CAR_MAX_RANKS];        /* rank r's slot 0, as mapped in this process */
    car_signal *sig[CAR_MAX_RANKS];   /* rank r's signal area, as mapped here */
    char *mine;                       /* data[rank] */
    car_signal *mysig;                /* sig[rank] */
    volatile int *host_words;         /* mapped host memory: [0] abort, [1] a probe timed out */
    unsigned long long slot_bytes;    /* slot 1 = slot 0 + slot_bytes */
    unsigned long long timeout_ns;    /* 0: wait for ever (real calls); the probe's limit */
    int rank;
};

struct tp_car {
    int rank, size, device;
    size_t max_bytes;
    char *buf;                     /* this rank's allocation */
    char *peer[CAR_MAX_RANKS];     /* peers' allocations as opened here (NULL for self) */
    int *host_words;               /* pinned, mapped: [0] abort, [1] timed out */
    car_params params;
    char name[48];
};

// ----------------------------------------------------------------------------
// device side

__device__ __forceinline__ void st_release_sys(unsigned long long *p, unsigned long long v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
    __threadfence_system();
    *(volatile unsigned long long *)p = v;
#endif
}

__device__ __forceinline__ unsigned long long ld_relaxed_sys(const unsigned long long *p)
{
    unsigned long long v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile unsigned long long *)p;
#endif
    return v;
}

/* After a relaxed load saw the flag: makes it an acquire (the peer's slot writes that its
 * release covered are visible to this thread, and through the next bar.sync, the block). */
__device__ __forceinline__ void fence_acquire_sys()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
    __threadfence_system();
#endif
}

__device__ __forceinline__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* 16 bytes at p: one vector access when p is 16-byte aligned, else byte by byte (a
 * caller's odd buffer; correct, slow, never the model's case). */
__device__ __forceinline__ uint4 load16(const char *p, int aligned)
{
    if (aligned) return *(const uint4 *)p;
    union {
        uint4 v;
        unsigned char b[16];
    } u;
#pragma unroll
    for (int k = 0; k < 16; k++) u.b[k] = (unsigned char)p[k];
    return u.v;
}

__device__ __forceinline__ void store16(char *p, uint4 v, int aligned)
{
    if (aligned) {
        *(uint4 *)p = v;
        return;
    }
    union {
        uint4 v;
        unsigned char b[16];
    } u;
    u.v = v;
#pragma unroll
    for (int k = 0; k < 16; k++) p[k] = (char)u.b[k];
}

template <typename T> struct car_pack {
    static constexpr int n = 16 / sizeof(T);
    union u {
        uint4 v;
        T e[16 / sizeof(T)];
    };
};

template <typename T> __device__ __forceinline__ void unpack(uint4 v, float *out)
{
    typename car_pack<T>::u x;
    x.v = v;
#pragma unroll
    for (int k = 0; k < car_pack<T>::n; k++) out[k] = to_f32(x.e[k]);
}

template <typename T> __device__ __forceinline__ uint4 pack(const float *in)
{
    typename car_pack<T>::u x;
#pragma unroll
    for (int k = 0; k < car_pack<T>::n; k++) x.e[k] = from_f32<T>(in[k]);
    return x.v;
}

/* One all-reduce of nvec 16-byte pieces over N ranks; the protocol at the top of the file.
 * send and recv may be the same buffer; aligned: both are 16-byte aligned. */
template <typename T, int N>
__global__ void __launch_bounds__(CAR_THREADS)
    car_kernel(car_params p, const char *send, char *recv, long long nvec, int aligned)
{
    constexpr int E = car_pack<T>::n;
    pdl_begin();

    __shared__ unsigned long long s_epoch;
    if (threadIdx.x == 0) s_epoch = *(volatile unsigned long long *)&p.mysig->calls + 1;
    __syncthreads();
    const unsigned long long epoch = s_epoch;
    const unsigned long long slot_off = (epoch & 1) ? p.slot_bytes : 0;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;

    /* 3. this rank's pieces into its slot */
    uint4 *mine = (uint4 *)(p.mine + slot_off);
    for (long long i = first; i < nvec; i += stride) mine[i] = load16(send + 16 * i, aligned);

    /* 4. the barrier of block b */
    __syncthreads();
    const int t = threadIdx.x;
    if (t < N && t != p.rank) {
        st_release_sys(&p.sig[t]->flags[blockIdx.x][p.rank], epoch);
        const unsigned long long *f = &p.mysig->flags[blockIdx.x][t];
        unsigned int spins = 0;
        unsigned long long t0 = 0;
        if (p.timeout_ns) t0 = global_ns();
        while (ld_relaxed_sys(f) < epoch) {
            if ((++spins & 1023u) == 0) {
                if (p.host_words[0]) break; /* aborted: the results do not matter */
                if (p.timeout_ns && global_ns() - t0 > p.timeout_ns) {
                    p.host_words[1] = 1;
                    break;
                }
            }
        }
        fence_acquire_sys();
    }
    __syncthreads();

    /* 5. the sum, in rank order */
    for (long long i = first; i < nvec; i += stride) {
        uint4 v[N];
#pragma unroll
        for (int r = 0; r < N; r++) v[r] = __ldcg((const uint4 *)(p.data[r] + slot_off) + i);
        float acc[E], x[E];
        unpack<T>(v[0], acc);
#pragma unroll
        for (int r = 1; r < N; r++) {
            unpack<T>(v[r], x);
#pragma unroll
            for (int k = 0; k < E; k++) acc[k] += x[k];
        }
        store16(recv + 16 * i, pack<T>(acc), aligned);
    }

    /* 6. the last block out advances the call count */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned int before = atomicAdd(&p.mysig->done, 1u);
        if (before == gridDim.x - 1) {
            *(volatile unsigned int *)&p.mysig->done = 0;
            *(volatile unsigned long long *)&p.mysig->calls = epoch;
        }
    }
}

// ----------------------------------------------------------------------------
// host side: launch

template <typename T>
static void launch_t(const tp_car *car, const car_params &p, dim3 grid, cudaStream_t stream, const char *send,
                     char *recv, long long nvec, int aligned)
{
    switch (car->size) {
    case 2: tp_launch(car_kernel<T, 2>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 3: tp_launch(car_kernel<T, 3>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 4: tp_launch(car_kernel<T, 4>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 5: tp_launch(car_kernel<T, 5>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 6: tp_launch(car_kernel<T, 6>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 7: tp_launch(car_kernel<T, 7>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    case 8: tp_launch(car_kernel<T, 8>, grid, dim3(CAR_THREADS), 0, stream, p, send, recv, nvec, aligned); break;
    default: break; /* tp_car_create made none */
    }
}

/* The launch; cudaSuccess or the launch error (no tp_error: the probe's failures are not
 * the run's). The caller checked tp_car_takes (or is the probe). */
static cudaError_t car_launch(const tp_car *car, const car_params &p, const void *send, void *recv, size_t count,
                              tp_dtype dt, cudaStream_t stream)
{
    const size_t bytes = count * tp_dtype_size(dt);
    const long long nvec = (long long)(bytes / 16);
    long long blocks = CEIL_DIV(nvec, (long long)CAR_THREADS);
    if (blocks > CAR_MAX_BLOCKS) blocks = CAR_MAX_BLOCKS;
    if (blocks < 1) blocks = 1;
    const int aligned = ((uintptr_t)send % 16 == 0) && ((uintptr_t)recv % 16 == 0);
    const dim3 grid((unsigned)blocks);
    const char *s = (const char *)send;
    char *r = (char *)recv;
    switch (dt) {
    case TP_DTYPE_F32: launch_t<float>(car, p, grid, stream, s, r, nvec, aligned); break;
    case TP_DTYPE_BF16: launch_t<bf16_t>(car, p, grid, stream, s, r, nvec, aligned); break;
    case TP_DTYPE_F16: launch_t<f16_t>(car, p, grid, stream, s, r, nvec, aligned); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" int tp_car_takes(const tp_car *car, size_t count, tp_dtype dt)
{
    if (!car || count == 0) return 0;
    if (dt != TP_DTYPE_F32 && dt != TP_DTYPE_BF16 && dt != TP_DTYPE_F16) return 0;
    const size_t es = tp_dtype_size(dt);
    if (count > car->max_bytes / es) return 0;
    return (count * es) % 16 == 0;
}

extern "C" tp_status tp_car_all_reduce(tp_car *car, const void *send, void *recv, size_t count, tp_dtype dt,
                                       void *stream)
{
    if (!tp_car_takes(car, count, dt))
        return tp_error(TP_ERR_INTERNAL, "custom all-reduce given a call it does not take");
    cudaError_t e = car_launch(car, car->params, send, recv, count, dt, (cudaStream_t)stream);
    if (e != cudaSuccess)
        return tp_error(TP_ERR_CUDA, "%s: the custom all-reduce kernel did not launch: %s", car->name,
                        cudaGetErrorString(e));
    return TP_OK;
}

extern "C" size_t tp_car_max_bytes(const tp_car *car) { return car ? car->max_bytes : 0; }

extern "C" void tp_car_abort(tp_car *car)
{
    if (car && car->host_words) ((volatile int *)car->host_words)[0] = 1;
}

// ----------------------------------------------------------------------------
// host side: set-up

/* What each rank says first, all-gathered as int32 words. */
struct car_hello {
    char host[64];
    char boot[40]; /* /proc/sys/kernel/random/boot_id: two hosts may share a host name */
    char pci[32];
    int32_t want;      /* TPINFER_CUSTOM_AR is not 0 */
    int32_t max_bytes; /* TPINFER_CUSTOM_AR_MAX, or the default */
};
static_assert(sizeof(car_hello) % 4 == 0, "car_hello travels as int32 words");

/* Then its allocation's handle, behind a status (0: ok, else a TP_CUSTOM_AR_ reason). */
struct car_offer {
    int32_t status;
    cudaIpcMemHandle_t handle;
};
static_assert(sizeof(cudaIpcMemHandle_t) % 4 == 0, "an IPC handle is whole int32 words");
static_assert(sizeof(car_offer) % 4 == 0, "car_offer travels as int32 words");

static int warned = 0; /* one warning per process */

static void warn_once(const char *fmt, const char *name, const char *detail)
{
    if (warned++) return;
    tp_log(TP_LOG_WARN, fmt, name, detail);
}

static int env_want(void)
{
    const char *v = getenv("TPINFER_CUSTOM_AR");
    return !(v && !strcmp(v, "0"));
}

static int32_t env_max(const char *name, int ranks)
{
    const int32_t fallback = ranks == 2 ? CAR_DEFAULT_MAX_PAIR : CAR_DEFAULT_MAX;
    const char *v = getenv("TPINFER_CUSTOM_AR_MAX");
    if (!v || !*v) return fallback;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (!end || *end || x < 16) {
        tp_log(TP_LOG_WARN, "%s: TPINFER_CUSTOM_AR_MAX='%s' is not a byte count of 16 or more; using %d", name, v,
               fallback);
        return fallback;
    }
    if (x > CAR_LIMIT_MAX) x = CAR_LIMIT_MAX;
    return (int32_t)(x / 16 * 16);
}

/* Any statuses in a gathered array that are not 0: the largest reason (SETUP over NO_P2P). */
static int worst(const int32_t *st, int n, size_t stride_words)
{
    int w = 0;
    for (int i = 0; i < n; i++) {
        int s = st[(size_t)i * stride_words];
        if (s > w) w = s;
    }
    return w;
}

/* Free what this rank made (peers' mappings closed first). */
static void car_free(tp_car *car)
{
    if (!car) return;
    (void)cudaSetDevice(car->device);
    (void)cudaDeviceSynchronize(); /* this rank's kernels are done with every mapping */
    for (int j = 0; j < CAR_MAX_RANKS; j++)
        if (car->peer[j]) (void)cudaIpcCloseMemHandle(car->peer[j]);
    if (car->buf) (void)cudaFree(car->buf);
    if (car->host_words) (void)cudaFreeHost(car->host_words);
    (void)cudaGetLastError();
    free(car);
}

/* This rank's peer access to every peer's GPU, by PCI bus id (ordinals differ between
 * processes when CUDA_VISIBLE_DEVICES does). 0 or TP_CUSTOM_AR_NO_P2P with a warning. */
static int check_p2p(tp_car *car, const car_hello *all)
{
    const car_hello *me = &all[car->rank];
    for (int j = 0; j < car->size; j++) {
        if (j == car->rank || !strcmp(all[j].pci, me->pci)) continue; /* same GPU: IPC works */
        int dev = -1, can = 0;
        char why[160];
        if (!me->pci[0] || !all[j].pci[0] || cudaDeviceGetByPCIBusId(&dev, all[j].pci) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "rank %d's GPU (%s) is not visible to rank %d", j, all[j].pci, car->rank);
            warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name, why);
            return TP_CUSTOM_AR_NO_P2P;
        }
        if (cudaDeviceCanAccessPeer(&can, car->device, dev) != cudaSuccess || !can) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "GPU %s (rank %d) has no peer access to GPU %s (rank %d)", me->pci, car->rank,
                     all[j].pci, j);
            warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name, why);
            return TP_CUSTOM_AR_NO_P2P;
        }
    }
    return 0;
}

#define CAR_TRY(call)                                                                                  \
    do {                                                                                               \
        cudaError_t car_e_ = (call);                                                                   \
        if (car_e_ != cudaSuccess) {                                                                   \
            (void)cudaGetLastError();                                                                  \
            char car_w_[200];                                                                          \
            snprintf(car_w_, sizeof car_w_, "%s failed: %s", #call, cudaGetErrorString(car_e_));       \
            warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name, car_w_);    \
            return TP_CUSTOM_AR_SETUP;                                                                 \
        }                                                                                              \
    } while (0)

/* This rank's allocation and its handle. 0 or TP_CUSTOM_AR_SETUP with a warning. */
static int make_buffer(tp_car *car, cudaIpcMemHandle_t *handle)
{
    const size_t total = CAR_SIGNAL_BYTES + 2 * car->max_bytes;
    CAR_TRY(cudaMalloc((void **)&car->buf, total));
    CAR_TRY(cudaMemset(car->buf, 0, total));
    CAR_TRY(cudaDeviceSynchronize()); /* zero before any peer can map it */
    CAR_TRY(cudaHostAlloc((void **)&car->host_words, 2 * sizeof(int), cudaHostAllocMapped));
    car->host_words[0] = car->host_words[1] = 0;
    void *dev_words = NULL;
    CAR_TRY(cudaHostGetDevicePointer(&dev_words, car->host_words, 0));
    car->params.host_words = (volatile int *)dev_words;
    CAR_TRY(cudaIpcGetMemHandle(handle, car->buf));
    return 0;
}

/* Map every peer's allocation. 0 or TP_CUSTOM_AR_SETUP with a warning. */
static int open_peers(tp_car *car, const car_offer *offers)
{
    for (int j = 0; j < car->size; j++) {
        if (j == car->rank) continue;
        cudaIpcMemHandle_t h = offers[j].handle;
        CAR_TRY(cudaIpcOpenMemHandle((void **)&car->peer[j], h, cudaIpcMemLazyEnablePeerAccess));
    }
    car_params &p = car->params;
    for (int j = 0; j < car->size; j++) {
        char *base = j == car->rank ? car->buf : car->peer[j];
        p.sig[j] = (car_signal *)base;
        p.data[j] = base + CAR_SIGNAL_BYTES;
    }
    p.mine = p.data[car->rank];
    p.mysig = p.sig[car->rank];
    p.slot_bytes = car->max_bytes;
    p.rank = car->rank;
    p.timeout_ns = 0;
    return 0;
}

/* One all-reduce of 16 floats (rank + 1 each) with a time-out, checked. 0 or
 * TP_CUSTOM_AR_SETUP with a warning. It is call 1 on every rank that gets here. */
static int probe(tp_car *car)
{
    enum { PN = 16 };
    float host[PN];
    for (int i = 0; i < PN; i++) host[i] = (float)(car->rank + 1);
    float *dev = (float *)(car->buf + CAR_PROBE_OFFSET);
    cudaStream_t s = NULL;
    CAR_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    car_params p = car->params;
    p.timeout_ns = CAR_PROBE_TIMEOUT_NS;
    cudaError_t e = cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = car_launch(car, p, dev, dev, PN, TP_DTYPE_F32, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char w[200];
        snprintf(w, sizeof w, "its start-up probe failed: %s", cudaGetErrorString(e));
        warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name, w);
        return TP_CUSTOM_AR_SETUP;
    }
    if (((volatile int *)car->host_words)[1]) {
        warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name,
                  "its start-up probe waited 20 s for a peer's flag (peer writes do not arrive?)");
        return TP_CUSTOM_AR_SETUP;
    }
    const float want = (float)((double)car->size * (car->size + 1) / 2.0);
    for (int i = 0; i < PN; i++)
        if (host[i] != want) {
            char w[120];
            snprintf(w, sizeof w, "its start-up probe summed to %g, not %g", (double)host[i], (double)want);
            warn_once("%s: no custom all-reduce: %s; all-reduces stay on NCCL", car->name, w);
            return TP_CUSTOM_AR_SETUP;
        }
    return 0;
}

/* Agree on a local status: every rank gets the worst (0 when all are 0). */
static tp_status agree(tp_comm *bootstrap, int32_t mine, int32_t *all, int *out)
{
    TP_CHECK(tp_comm_all_gather(bootstrap, &mine, all, 1, TP_DTYPE_I32, NULL));
    *out = worst(all, bootstrap->size, 1);
    return TP_OK;
}

extern "C" tp_status tp_car_create(tp_comm *bootstrap, int device, const char *name, tp_car **out, int *reason)
{
    *out = NULL;
    *reason = TP_CUSTOM_AR_NONE;
    const int n = bootstrap->size;
    if (n < 2 || n > CAR_MAX_RANKS) {
        *reason = TP_CUSTOM_AR_GROUP_SIZE;
        return TP_OK;
    }
    tp_status st = TP_OK;
    car_hello mine_h;
    car_hello *hello = (car_hello *)calloc((size_t)n, sizeof *hello);
    car_offer *offers = (car_offer *)calloc((size_t)n, sizeof *offers);
    int32_t *words = (int32_t *)calloc((size_t)n, sizeof *words);
    tp_car *car = (tp_car *)calloc(1, sizeof *car);
    int verdict = 0, mapping = 0;
    if (!hello || !offers || !words || !car) {
        st = tp_error(TP_ERR_OOM, "%s: out of memory", name);
        goto done;
    }
    car->rank = bootstrap->rank;
    car->size = n;
    car->device = device;
    snprintf(car->name, sizeof car->name, "%s", name);

    /* 1. who wants it, where everyone is */
    memset(&mine_h, 0, sizeof mine_h);
    if (gethostname(mine_h.host, sizeof mine_h.host - 1) != 0) snprintf(mine_h.host, sizeof mine_h.host, "?");
    mine_h.host[sizeof mine_h.host - 1] = '\0';
    {
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (f) {
            if (!fgets(mine_h.boot, sizeof mine_h.boot, f)) mine_h.boot[0] = '\0';
            fclose(f);
        }
        mine_h.boot[strcspn(mine_h.boot, "\n")] = '\0';
    }
    if (cudaDeviceGetPCIBusId(mine_h.pci, (int)sizeof mine_h.pci, device) != cudaSuccess) {
        (void)cudaGetLastError();
        mine_h.pci[0] = '\0';
    }
    mine_h.pci[sizeof mine_h.pci - 1] = '\0';
    mine_h.want = env_want();
    mine_h.max_bytes = env_max(name, n);
    TP_CHECK_GOTO(tp_comm_all_gather(bootstrap, &mine_h, hello, sizeof mine_h / 4, TP_DTYPE_I32, NULL), st, done);
    {
        int all_want = 1, one_host = 1;
        int32_t max = CAR_LIMIT_MAX;
        for (int i = 0; i < n; i++) {
            all_want &= hello[i].want != 0;
            one_host &= !strcmp(hello[i].host, hello[0].host) && !strcmp(hello[i].boot, hello[0].boot);
            if (hello[i].max_bytes < max) max = hello[i].max_bytes;
        }
        if (!all_want) {
            *reason = TP_CUSTOM_AR_OFF_ENV;
            goto done;
        }
        if (!one_host) {
            *reason = TP_CUSTOM_AR_HOSTS;
            goto done;
        }
        car->max_bytes = (size_t)max; /* the smallest any rank asked for: all agree */
    }

    /* 2. peer access, then the allocation and its handle */
    {
        car_offer mine_o;
        memset(&mine_o, 0, sizeof mine_o);
        mine_o.status = check_p2p(car, hello);
        if (mine_o.status == 0) mine_o.status = make_buffer(car, &mine_o.handle);
        TP_CHECK_GOTO(tp_comm_all_gather(bootstrap, &mine_o, offers, sizeof mine_o / 4, TP_DTYPE_I32, NULL), st,
                      done);
        verdict = worst(&offers[0].status, n, sizeof(car_offer) / 4);
        if (verdict) {
            *reason = verdict;
            goto done;
        }
    }

    /* 3. map the peers' buffers (from here on, a peer may hold a mapping of this rank's) */
    mapping = 1;
    TP_CHECK_GOTO(agree(bootstrap, open_peers(car, offers), words, &verdict), st, done);
    if (verdict) {
        *reason = verdict;
        goto done;
    }

    /* 4. prove it (a collective: call 1 of every rank) */
    TP_CHECK_GOTO(agree(bootstrap, probe(car), words, &verdict), st, done);
    if (verdict) {
        *reason = verdict;
        goto done;
    }

    *reason = TP_CUSTOM_AR_ON;
    *out = car;
    car = NULL;
    {
        char b[32];
        tp_format_bytes((int64_t)(*out)->max_bytes, b, sizeof b);
        tp_log_info0("%s: one-shot all-reduce over CUDA IPC for messages up to %s, NCCL above "
                     "(TPINFER_CUSTOM_AR=0 turns it off)", name, b);
    }

done:
    if (car) {
        /* Not taken. After step 3 began, peers may have mapped this rank's buffer (and run
         * the probe on it): every rank closes its mappings and finishes its kernels, and
         * only after a barrier frees its own buffer. Every rank takes the same branch here
         * (mapping is set at the same collective point); a failed bootstrap (st) skips the
         * barrier: the job is ending. */
        if (mapping && st == TP_OK) {
            (void)cudaDeviceSynchronize(); /* the probe, if it ran, is over */
            for (int j = 0; j < CAR_MAX_RANKS; j++) {
                if (car->peer[j]) (void)cudaIpcCloseMemHandle(car->peer[j]);
                car->peer[j] = NULL;
            }
            (void)cudaGetLastError();
            st = tp_comm_barrier(bootstrap);
        }
        car_free(car);
        if ((*reason == TP_CUSTOM_AR_SETUP || *reason == TP_CUSTOM_AR_NO_P2P) && bootstrap->rank == 0 && !warned++)
            tp_log(TP_LOG_WARN, "%s: no custom all-reduce: %s on a peer (see its warning); all-reduces stay "
                                "on NCCL", name, tp_comm_nccl_custom_ar_why(*reason));
    }
    free(words);
    free(offers);
    free(hello);
    return st;
}

extern "C" void tp_car_destroy(tp_car *car)
{
    car_free(car);
}
