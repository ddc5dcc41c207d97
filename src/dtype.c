/*
 * dtype.c: element sizes and names, and the bf16/f16 <-> f32 conversions. Rounding is
 * to nearest, ties to even (what PyTorch and the safetensors writers do), NaN stays NaN
 * with its sign. tp_convert goes through a small aligned f32 chunk so that sources and
 * destinations inside an mmapped file may be unaligned.
 */
#include "dtype.h"

#include <math.h>
#include <string.h>

size_t tp_dtype_size(tp_dtype dt)
{
    static const size_t sizes[TP_DTYPE_COUNT] = {4, 2, 2, 4};
    return (unsigned)dt < TP_DTYPE_COUNT ? sizes[dt] : 0;
}

const char *tp_dtype_name(tp_dtype dt)
{
    static const char *const names[TP_DTYPE_COUNT] = {"float32", "float16", "bfloat16", "int32"};
    return (unsigned)dt < TP_DTYPE_COUNT ? names[dt] : "unknown";
}

int tp_dtype_from_name(const char *name, tp_dtype *out)
{
    static const struct {
        const char *name;
        tp_dtype dt;
    } names[] = {
        {"float32", TP_DTYPE_F32},  {"fp32", TP_DTYPE_F32},  {"float", TP_DTYPE_F32},
        {"float16", TP_DTYPE_F16},  {"fp16", TP_DTYPE_F16},  {"half", TP_DTYPE_F16},
        {"bfloat16", TP_DTYPE_BF16}, {"bf16", TP_DTYPE_BF16}, {"int32", TP_DTYPE_I32},
    };
    if (!name) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dt;
            return 1;
        }
    }
    return 0;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float tp_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t tp_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds ties to even; overflow gives Inf. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float tp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t tp_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
    if (x >= 0x38800000u) { /* normal in f16: rebias the exponent, round 13 bits away */
        x -= 0x38000000u;
        return (uint16_t)(sign | ((x + 0xfffu + ((x >> 13) & 1u)) >> 13));
    }
    if (x < 0x33000000u) return sign; /* below 2^-25: zero (2^-25 itself ties to 0 below) */
    /* Subnormal result: mantissa with its implicit bit, shifted to units of 2^-24. */
    uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e, r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

#define CHUNK 256

static void load_f32(float *out, const unsigned char *src, tp_dtype dt, size_t n)
{
    switch (dt) {
    case TP_DTYPE_F32:
        memcpy(out, src, n * 4);
        break;
    case TP_DTYPE_F16:
    case TP_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = dt == TP_DTYPE_F16 ? tp_f16_to_f32(h) : tp_bf16_to_f32(h);
        }
        break;
    case TP_DTYPE_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, src + 4 * i, 4);
            out[i] = (float)v;
        }
        break;
    default:
        memset(out, 0, n * sizeof *out);
    }
}

static int32_t f32_to_i32(float f)
{
    if (isnan(f)) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f < -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

static void store_f32(unsigned char *dst, tp_dtype dt, const float *in, size_t n)
{
    switch (dt) {
    case TP_DTYPE_F32:
        memcpy(dst, in, n * 4);
        break;
    case TP_DTYPE_F16:
    case TP_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = dt == TP_DTYPE_F16 ? tp_f32_to_f16(in[i]) : tp_f32_to_bf16(in[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    case TP_DTYPE_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v = f32_to_i32(in[i]);
            memcpy(dst + 4 * i, &v, 4);
        }
        break;
    default:
        break;
    }
}

void tp_convert(void *dst, tp_dtype dst_dt, const void *src, tp_dtype src_dt, size_t n)
{
    if ((unsigned)dst_dt >= TP_DTYPE_COUNT || (unsigned)src_dt >= TP_DTYPE_COUNT) return;
    if (dst_dt == src_dt) { /* also keeps int32 exact, which a float round trip would not */
        memmove(dst, src, n * tp_dtype_size(src_dt));
        return;
    }
    float buf[CHUNK];
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t ssz = tp_dtype_size(src_dt), dsz = tp_dtype_size(dst_dt);
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        load_f32(buf, s + i * ssz, src_dt, k);
        store_f32(d + i * dsz, dst_dt, buf, k);
    }
}
