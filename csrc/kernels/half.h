/*
 * float16 and bfloat16 storage: conversions to and from float.
 *
 * Both are stored as 16-bit patterns. bfloat16 is the top half of a float, so
 * its conversions are shifts. float16 uses the hardware conversions where the
 * instruction set has them (F16C, through _Float16), and exact bit arithmetic
 * elsewhere, so the baseline build needs no compiler support for half types.
 * Every narrowing rounds to nearest, ties to even, as torch does.
 */
#ifndef RMSNORM_KERNELS_HALF_H
#define RMSNORM_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

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

#if RMS_HAVE_F16C && defined(__FLT16_MANT_DIG__)
static inline float rms_half_to_float(uint16_t h)
{
    _Float16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

static inline uint16_t rms_float_to_half(float f)
{
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, sizeof h);
    return h;
}
#else
static inline float rms_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) { /* inf or NaN */
        return rms_bits_float(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
        float magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    return rms_bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t rms_float_to_half(float f)
{
    uint32_t u = rms_float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (magnitude >= 0x477ff000u) { /* rounds past 65504: inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (magnitude < 0x38800000u) { /* below 2^-14: a subnormal half */
        /* f * 2^24 is exact, and converting it rounds to nearest even. */
        float scaled = rms_bits_float(magnitude) * 0x1p24f;
        uint32_t q = (uint32_t)scaled;
        float rest = scaled - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1u))) {
            q++;
        }
        return (uint16_t)(sign | q);
    }
    /* normal: drop 13 mantissa bits, rounding to nearest even */
    uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}
#endif

#endif
