/*
 * Scalar conversions: float16 and bfloat16 to and from float, and the
 * roundings to odd that let a double reach 16 bits through float with one
 * rounding in effect.
 *
 * float16 and bfloat16 are stored as 16-bit patterns. bfloat16 is the top
 * half of a float, so its conversions are shifts; float16's are exact bit
 * arithmetic too, so no build needs compiler support for half types. Every
 * narrowing rounds to nearest, ties to even, as torch does. The vector
 * vocabularies of the wider instruction sets have their own conversions;
 * these serve the portable kernels and the once-per-call scalar work.
 */
#ifndef RMSNORM_KERNELS_HALF_H
#define RMSNORM_KERNELS_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "types.h"

static inline uint32_t rms_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float rms_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float rms_bfloat16_to_float(uint16_t h) { return rms_bits_float((uint32_t)h << 16); }

static inline uint16_t rms_float_to_bfloat16(float f)
{
    uint32_t u = rms_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/*
 * float16 by exact bit arithmetic, without branches, so that the compiler
 * vectorises it in every instruction set. (Going through _Float16 would
 * not: without AVX512-FP16 a half converts to double by a library call.)
 */
static inline float rms_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t magnitude = h & 0x7fffu;
    /* The 15 bits land in a float's exponent and mantissa; multiplying by
       2^112 re-biases the exponent, and normalises subnormal halves exactly. */
    float scaled = rms_bits_float(magnitude << 13) * 0x1p112f;
    uint32_t inf_or_nan = 0u - (uint32_t)(magnitude >= 0x7c00u);
    return rms_bits_float(rms_float_bits(scaled) | (0x7f800000u & inf_or_nan) | sign);
}

static inline uint16_t rms_float_to_half(float f)
{
    uint32_t u = rms_float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t magnitude = u & 0x7fffffffu;
    /* normal halves: re-bias the exponent, round to nearest even on the
       13 dropped bits */
    uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
    /* subnormal halves: adding 0.5 aligns the 10 kept bits at the bottom of
       the float, and the addition itself rounds to nearest even */
    const float magic = 0.5f;
    uint32_t subnormal = rms_float_bits(rms_bits_float(magnitude) + magic) - rms_float_bits(magic);
    /* Selections by mask, not ?:, which the compiler turns into branches
       that stop it vectorising. */
    uint32_t is_subnormal = 0u - (uint32_t)(magnitude < 0x38800000u);
    uint32_t is_inf = 0u - (uint32_t)(magnitude >= 0x477ff000u); /* past 65504 */
    uint32_t is_nan = 0u - (uint32_t)(magnitude > 0x7f800000u);
    uint32_t half = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    half = (0x7c00u & is_inf) | (half & ~is_inf);
    /* A NaN keeps its payload's top 10 bits, quieted, as the F16C and
       AVX512-FP16 conversions do: every instruction set gives its bytes. */
    uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
    half = (nan & is_nan) | (half & ~is_nan);
    return (uint16_t)(sign | half);
}

/* d narrowed to float, rounded to odd: truncated, with the last bit set
   where that lost anything. */
static inline float rms_float_round_to_odd(double d)
{
    float nearest = (float)d;
    uint32_t bits = rms_float_bits(nearest);
    double back = (double)nearest;
    if (fabs(back) > fabs(d)) {
        bits -= 1; /* rounded away from zero: step back to the truncation */
    }
    if (back != d && !isnan(d)) {
        bits |= 1u;
    }
    return rms_bits_float(bits);
}

/* hi + err, err below half an ulp of hi, rounded to odd as a double. */
static inline double rms_double_round_to_odd(double hi, double err)
{
    if (err == 0.0 || !isfinite(hi) || isnan(err)) {
        return hi; /* exact, or infinite or NaN: an infinite weight makes err
                      inf - inf, a NaN that may carry either sign */
    }
    uint64_t bits;
    memcpy(&bits, &hi, sizeof bits);
    if (hi != 0.0 && signbit(hi) != signbit(err)) {
        bits -= 1; /* hi is past hi + err: step back toward zero */
    }
    bits |= 1u;
    memcpy(&hi, &bits, sizeof hi);
    return hi;
}

/* One element as a double, for per-row and per-call scalar work. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline double rms_load_scalar(rms_kind kind, const char *p)
{
    uint16_t bits;
    float f;
    double d;
    switch (kind) {
    case RMS_KIND_F16:
        memcpy(&bits, p, sizeof bits);
        return rms_half_to_float(bits);
    case RMS_KIND_BF16:
        memcpy(&bits, p, sizeof bits);
        return rms_bfloat16_to_float(bits);
    case RMS_KIND_F32:
        memcpy(&f, p, sizeof f);
        return f;
    default:
        memcpy(&d, p, sizeof d);
        return d;
    }
}

#endif
