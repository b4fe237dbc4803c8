/*
 * The vector vocabulary with no instruction-set assumption: a "vector" is
 * one float or one double, in plain C, so it builds and runs everywhere.
 *
 * Every instruction set's vocabulary (vec_*.h) defines the same names, and
 * the row kernels (row_kernels.h) are written against them alone. A
 * vec_*.h defines the primitives, the entries its instructions make
 * directly; the derived entries are built from those once, in
 * vec_derived.h, which each vec_*.h includes last.
 *
 * Primitives:
 *
 *   RMS_VF_WIDTH, RMS_VD_WIDTH  floats and doubles a vector (VF = 2 * VD,
 *                               or both 1 here)
 *   RMS_VECTOR_BYTES            the alignment that full stores like
 *   RMS_HAVE_FMA                1 where a * b + c can be fused in one rounding
 *   RMS_HAVE_STREAM             1 where stores can bypass the cache
 *   RMS_HAVE_LOAD_WIDENED       1 where rms_vd_load_widened is a primitive
 *                               (some kinds convert from memory straight to
 *                               double), 0 where it is derived
 *   RMS_HAVE_MASKED             1 where the first count elements of a block
 *                               load and store as one masked vector, with:
 *     rms_vf_load_first_f32(p, count), rms_vh_load_first(p, count),
 *     rms_vd_load_first(p, count)       as rms_vf_load_f32, rms_vh_load and
 *                               rms_vd_load, zero from lane count on
 *                               (0 < count < the width); the lanes past
 *                               count are never read
 *     rms_vf_store_first_f32(p, v, count), rms_vh_store_first(p, v, count),
 *     rms_vd_store_first(p, v, count)   lanes 0 to count - 1 only
 *   rms_vf, rms_vd, rms_vh      the vector types (rms_vh: RMS_VF_WIDTH 16-bit
 *                               patterns, float16 or bfloat16)
 *   rms_vf_load_f32(p), rms_vf_store_f32(p, v, stream)  float32 elements;
 *                               with stream, p is vector-aligned and the
 *                               store bypasses the cache (where it can)
 *   rms_vh_load(p), rms_vh_store(p, v, stream)  16-bit patterns
 *   rms_vh_widen(kind, h)       float16 or bfloat16 patterns to floats (exact)
 *   rms_vf_to_float16(v)        floats to float16 bits, to nearest even
 *   rms_vf_to_bfloat16(v)       floats to bfloat16 bits, to nearest even, a
 *                               NaN kept a quiet NaN
 *   rms_vd_load(p), rms_vd_store(p, v, stream)    doubles
 *   rms_vd_widen(v, part)       floats to doubles, part of RMS_VF_WIDTH / RMS_VD_WIDTH
 *   rms_vd_load_widened(kind, p, parts)  where RMS_HAVE_LOAD_WIDENED; else
 *                               derived (below)
 *   rms_vf_narrow(parts)        doubles to floats, to nearest
 *   rms_vf_narrow_round_to_odd(parts)   doubles to floats, to odd
 *   rms_vd_round_to_odd(hi, err)        hi + err to odd
 *   set, add, sub, mul, fma (float), muladd (double: fused where it can be),
 *   product_error(a, b, p) (a * b - p, exact), zero_where_inf(value, w)
 *   rms_vf_abs(v)
 *   rms_vf_where_both_nonzero(value, a, b)  value where a and b are both
 *                               nonzero, else 0
 *   rms_vd_min(a, b)            lane by lane, the smaller; b where either
 *                               is NaN (as x86's min does)
 *   rms_vd_least_nonzero(least, v)  lane by lane, the smaller of least
 *                               and |v| where v is nonzero (and not NaN),
 *                               else least; least is not negative
 *   rms_vd_any_below_where_both_nonzero(u, v, bound, a, b)  whether some
 *                               lane where a and b are both nonzero has |u|
 *                               or |v| below bound (a NaN never is)
 *   rms_vf_equal(a, b)          whether every lane of a equals b's (a NaN
 *                               equals nothing)
 *   rms_vf_same(a, b)           whether every lane of a has b's bit pattern
 *   rms_stream_fence()          orders streamed stores before later reads
 *   rms_vf_top16_biased(v, bias)        the top 16 bits of each float's
 *                               pattern plus bias: bfloat16 bits rounded half
 *                               up (0x8000) or down (0x7fff), or off by ulps
 *   rms_vf_top16_agree(v, a, b)         whether those agree for biases a and b,
 *                               0 <= a < b < 2^16
 *   rms_vh_equal(a, b)
 *   rms_vf_any_abnormal(v)      whether some lane is subnormal, infinite or NaN
 *
 * Derived (vec_derived.h):
 *
 *   rms_vf_load(kind, p)        RMS_VF_WIDTH elements of a 32- or 16-bit kind
 *                               widened to float (exact)
 *   rms_vf_store(kind, p, v, stream)    narrowed, each rounded once to nearest
 *   rms_vf_narrow16(kind, v)    floats to float16 or bfloat16 patterns, as
 *                               rms_vf_store rounds them
 *   rms_vd_load_widened(kind, p, parts) RMS_VF_WIDTH elements of a 32- or 16-bit
 *                               kind as doubles (exact), in parts as rms_vd_widen
 *                               gives them (a primitive where
 *                               RMS_HAVE_LOAD_WIDENED)
 *   rms_vf_load_first(kind, p, count), rms_vf_store_first(kind, p, v, count)
 *                               where RMS_HAVE_MASKED: as rms_vf_load and
 *                               rms_vf_store, for the first count elements
 *   rms_vd_two_sum(a, b, &err), rms_vf_two_sum(a, b, &err)
 *                               a + b as s + err exactly (Knuth's two-sum)
 *   rms_vd_accumulate(compensated, product_exact, &sum, &comp, a, b)
 *                               a * b added to sum, its errors to comp where
 *                               compensated
 *   rms_vd_in_register(v)       v, which the code after it reads from a
 *                               register, not from memory again
 *
 * Rounding to odd is what lets a value be rounded twice, first to float and
 * then to 16 bits, as if once: the float keeps, in its last bit, whether
 * anything was lost, so a value just off a 16-bit tie is never taken for
 * the tie itself.
 */
#ifndef RMSNORM_KERNELS_SIMD_VEC_BASELINE_H
#define RMSNORM_KERNELS_SIMD_VEC_BASELINE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../half.h"
#include "../types.h"
#include "common.h"

#define RMS_VF_WIDTH 1
#define RMS_VD_WIDTH 1
#define RMS_VECTOR_BYTES 1
#define RMS_HAVE_FMA 0
#define RMS_HAVE_STREAM 0
#define RMS_HAVE_LOAD_WIDENED 0 /* one float widened is all there is */
#define RMS_HAVE_MASKED 0 /* one-element vectors are never partial */

typedef float rms_vf;
typedef double rms_vd;
typedef uint16_t rms_vh;

RMS_ALWAYS_INLINE rms_vf rms_vf_set(float v) { return v; }
RMS_ALWAYS_INLINE rms_vf rms_vf_add(rms_vf a, rms_vf b) { return a + b; }
RMS_ALWAYS_INLINE rms_vf rms_vf_sub(rms_vf a, rms_vf b) { return a - b; }
RMS_ALWAYS_INLINE rms_vf rms_vf_mul(rms_vf a, rms_vf b) { return a * b; }
/* Correct but slow without the instruction: the kernels use the float
   fused forms only where RMS_HAVE_FMA is 1. */
RMS_ALWAYS_INLINE rms_vf rms_vf_fma(rms_vf a, rms_vf b, rms_vf c) { return fmaf(a, b, c); }
RMS_ALWAYS_INLINE rms_vf rms_vf_product_error(rms_vf a, rms_vf b, rms_vf p) { return fmaf(a, b, -p); }

RMS_ALWAYS_INLINE rms_vd rms_vd_set(double v) { return v; }
RMS_ALWAYS_INLINE rms_vd rms_vd_add(rms_vd a, rms_vd b) { return a + b; }
RMS_ALWAYS_INLINE rms_vd rms_vd_sub(rms_vd a, rms_vd b) { return a - b; }
RMS_ALWAYS_INLINE rms_vd rms_vd_mul(rms_vd a, rms_vd b) { return a * b; }
RMS_ALWAYS_INLINE rms_vd rms_vd_muladd(rms_vd a, rms_vd b, rms_vd c) { return a * b + c; }

/* Dekker's exact product error: fma() without the instruction is a slow
   library call. */
RMS_ALWAYS_INLINE double rms_dekker_product_error(double a, double b, double p)
{
    const double splitter = 134217729.0; /* 2^27 + 1 */
    double ta = splitter * a, a_hi = ta - (ta - a), a_lo = a - a_hi;
    double tb = splitter * b, b_hi = tb - (tb - b), b_lo = b - b_hi;
    return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo;
}

/* The split overflows for factors past 2^996 (float64 rows near the top
   of the range meet them): such a factor is scaled down by 2^64 first,
   which is exact and scales the error with it. */
RMS_ALWAYS_INLINE rms_vd rms_vd_product_error(rms_vd a, rms_vd b, rms_vd p)
{
    if (fabs(a) > 0x1p995) {
        return rms_dekker_product_error(a * 0x1p-64, b, p * 0x1p-64) * 0x1p64;
    }
    if (fabs(b) > 0x1p995) {
        return rms_dekker_product_error(a, b * 0x1p-64, p * 0x1p-64) * 0x1p64;
    }
    return rms_dekker_product_error(a, b, p);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_zero_where_inf(rms_vf value, rms_vf w)
{
    return isinf(w) ? 0.0f : value;
}

RMS_ALWAYS_INLINE rms_vd rms_vd_zero_where_inf(rms_vd value, rms_vd w)
{
    return isinf(w) ? 0.0 : value;
}

RMS_ALWAYS_INLINE rms_vf rms_vf_abs(rms_vf v) { return fabsf(v); }

RMS_ALWAYS_INLINE rms_vd rms_vd_min(rms_vd a, rms_vd b) { return a < b ? a : b; }

RMS_ALWAYS_INLINE rms_vd rms_vd_least_nonzero(rms_vd least, rms_vd v)
{
    return v != 0.0 && fabs(v) < least ? fabs(v) : least;
}

RMS_ALWAYS_INLINE int rms_vd_any_below_where_both_nonzero(rms_vd u, rms_vd v, rms_vd bound,
                                                          rms_vd a, rms_vd b)
{
    return (fabs(u) < bound || fabs(v) < bound) && a != 0.0 && b != 0.0;
}

RMS_ALWAYS_INLINE rms_vf rms_vf_where_both_nonzero(rms_vf value, rms_vf a, rms_vf b)
{
    return a != 0.0f && b != 0.0f ? value : 0.0f;
}

RMS_ALWAYS_INLINE int rms_vf_equal(rms_vf a, rms_vf b) { return a == b; }

RMS_ALWAYS_INLINE int rms_vf_same(rms_vf a, rms_vf b)
{
    return rms_float_bits(a) == rms_float_bits(b);
}

RMS_ALWAYS_INLINE rms_vf rms_vh_widen(rms_kind kind, rms_vh h)
{
    return kind == RMS_KIND_F16 ? rms_half_to_float(h) : rms_bfloat16_to_float(h);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_load_f32(const char *p)
{
    float value;
    memcpy(&value, p, sizeof value);
    return value;
}

RMS_ALWAYS_INLINE rms_vh rms_vh_load(const char *p)
{
    rms_vh bits;
    memcpy(&bits, p, sizeof bits);
    return bits;
}

RMS_ALWAYS_INLINE rms_vh rms_vf_to_float16(rms_vf v) { return rms_float_to_half(v); }

RMS_ALWAYS_INLINE rms_vh rms_vf_to_bfloat16(rms_vf v) { return rms_float_to_bfloat16(v); }

RMS_ALWAYS_INLINE rms_vh rms_vf_top16_biased(rms_vf v, int32_t bias)
{
    return (uint16_t)((rms_float_bits(v) + (uint32_t)bias) >> 16);
}

RMS_ALWAYS_INLINE int rms_vf_top16_agree(rms_vf v, int32_t a, int32_t b)
{
    return rms_vf_top16_biased(v, a) == rms_vf_top16_biased(v, b);
}

RMS_ALWAYS_INLINE int rms_vh_equal(rms_vh a, rms_vh b) { return a == b; }

RMS_ALWAYS_INLINE int rms_vf_any_abnormal(rms_vf v) { return v != 0.0f && !isnormal(v); }

RMS_ALWAYS_INLINE void rms_vh_store(char *p, rms_vh v, int stream)
{
    (void)stream;
    memcpy(p, &v, sizeof v);
}

RMS_ALWAYS_INLINE void rms_vf_store_f32(char *p, rms_vf v, int stream)
{
    (void)stream;
    memcpy(p, &v, sizeof v);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_load(const char *p)
{
    double value;
    memcpy(&value, p, sizeof value);
    return value;
}

RMS_ALWAYS_INLINE void rms_vd_store(char *p, rms_vd v, int stream)
{
    (void)stream;
    memcpy(p, &v, sizeof v);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_widen(rms_vf v, int part)
{
    (void)part;
    return v;
}

RMS_ALWAYS_INLINE rms_vf rms_vf_narrow(const rms_vd *parts) { return (float)parts[0]; }

RMS_ALWAYS_INLINE rms_vf rms_vf_narrow_round_to_odd(const rms_vd *parts)
{
    return rms_float_round_to_odd(parts[0]);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_round_to_odd(rms_vd hi, rms_vd err)
{
    return rms_double_round_to_odd(hi, err);
}

RMS_ALWAYS_INLINE void rms_stream_fence(void) {}

#include "vec_derived.h"

#endif
