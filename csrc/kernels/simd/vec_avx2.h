/*
 * The vector vocabulary on x86-64 with AVX2, FMA and F16C: 8 floats or 4
 * doubles a vector. See vec_baseline.h for the contract that every
 * instruction set's vocabulary keeps.
 */
#ifndef RMSNORM_KERNELS_SIMD_VEC_AVX2_H
#define RMSNORM_KERNELS_SIMD_VEC_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../types.h"
#include "common.h"

#define RMS_VF_WIDTH 8
#define RMS_VD_WIDTH 4
#define RMS_VECTOR_BYTES 32
#define RMS_HAVE_FMA 1
#define RMS_HAVE_STREAM 1
#define RMS_HAVE_LOAD_WIDENED 1 /* rms_vd_load_widened says why */
/* Heads and tails go through packed copies. AVX2 has no masked moves of
   16-bit elements; with its 32- and 64-bit ones (vmaskmov) for those
   kinds, the forward and backward of 256- to 4096-column rows on NumPy's
   16-byte-aligned arrays took the same time (AMD family 26, 1 thread). */
#define RMS_HAVE_MASKED 0

typedef __m256 rms_vf;
typedef __m256d rms_vd;
typedef __m128i rms_vh;

RMS_ALWAYS_INLINE rms_vf rms_vf_set(float v) { return _mm256_set1_ps(v); }
RMS_ALWAYS_INLINE rms_vf rms_vf_add(rms_vf a, rms_vf b) { return _mm256_add_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_sub(rms_vf a, rms_vf b) { return _mm256_sub_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_mul(rms_vf a, rms_vf b) { return _mm256_mul_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_fma(rms_vf a, rms_vf b, rms_vf c) { return _mm256_fmadd_ps(a, b, c); }
RMS_ALWAYS_INLINE rms_vf rms_vf_product_error(rms_vf a, rms_vf b, rms_vf p)
{
    return _mm256_fmsub_ps(a, b, p);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_set(double v) { return _mm256_set1_pd(v); }
RMS_ALWAYS_INLINE rms_vd rms_vd_add(rms_vd a, rms_vd b) { return _mm256_add_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_sub(rms_vd a, rms_vd b) { return _mm256_sub_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_mul(rms_vd a, rms_vd b) { return _mm256_mul_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_muladd(rms_vd a, rms_vd b, rms_vd c) { return _mm256_fmadd_pd(a, b, c); }
RMS_ALWAYS_INLINE rms_vd rms_vd_product_error(rms_vd a, rms_vd b, rms_vd p)
{
    return _mm256_fmsub_pd(a, b, p);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_zero_where_inf(rms_vf value, rms_vf w)
{
    const rms_vf magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), w);
    const rms_vf infinite = _mm256_cmp_ps(magnitude, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
    return _mm256_andnot_ps(infinite, value);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_abs(rms_vf v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

RMS_ALWAYS_INLINE rms_vf rms_vf_where_both_nonzero(rms_vf value, rms_vf a, rms_vf b)
{
    const rms_vf zero = _mm256_setzero_ps();
    const rms_vf nonzero = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_NEQ_UQ),
                                         _mm256_cmp_ps(b, zero, _CMP_NEQ_UQ));
    return _mm256_and_ps(nonzero, value);
}

RMS_ALWAYS_INLINE int rms_vf_equal(rms_vf a, rms_vf b)
{
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)) == 0xff;
}

RMS_ALWAYS_INLINE int rms_vf_same(rms_vf a, rms_vf b)
{
    const __m256i equal = _mm256_cmpeq_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b));
    return _mm256_movemask_epi8(equal) == -1;
}

RMS_ALWAYS_INLINE rms_vd rms_vd_zero_where_inf(rms_vd value, rms_vd w)
{
    const rms_vd magnitude = _mm256_andnot_pd(_mm256_set1_pd(-0.0), w);
    const rms_vd infinite = _mm256_cmp_pd(magnitude, _mm256_set1_pd(INFINITY), _CMP_EQ_OQ);
    return _mm256_andnot_pd(infinite, value);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_min(rms_vd a, rms_vd b) { return _mm256_min_pd(a, b); }

RMS_ALWAYS_INLINE rms_vd rms_vd_least_nonzero(rms_vd least, rms_vd v)
{
    const rms_vd zero = _mm256_setzero_pd();
    const rms_vd magnitude = _mm256_andnot_pd(_mm256_set1_pd(-0.0), v);
    /* zeros as +inf; min gives least where magnitude is NaN */
    const rms_vd nonzero = _mm256_blendv_pd(_mm256_set1_pd(INFINITY), magnitude,
                                            _mm256_cmp_pd(v, zero, _CMP_NEQ_UQ));
    return _mm256_min_pd(nonzero, least);
}

RMS_ALWAYS_INLINE int rms_vd_any_below_where_both_nonzero(rms_vd u, rms_vd v, rms_vd bound,
                                                          rms_vd a, rms_vd b)
{
    const rms_vd sign = _mm256_set1_pd(-0.0), zero = _mm256_setzero_pd();
    /* min gives its second operand where either is NaN: v's NaN is not below */
    const rms_vd smaller = _mm256_min_pd(_mm256_andnot_pd(sign, u), _mm256_andnot_pd(sign, v));
    const rms_vd nonzero =
        _mm256_and_pd(_mm256_cmp_pd(a, zero, _CMP_NEQ_UQ), _mm256_cmp_pd(b, zero, _CMP_NEQ_UQ));
    return _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(smaller, bound, _CMP_LT_OQ), nonzero)) !=
           0;
}

/* 8 float16 or bfloat16 patterns widened to float (exact). */
RMS_ALWAYS_INLINE rms_vf rms_vh_widen(rms_kind kind, rms_vh h)
{
    if (kind == RMS_KIND_F16) {
        return _mm256_cvtph_ps(h);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

RMS_ALWAYS_INLINE rms_vf rms_vf_load_f32(const char *p)
{
    return _mm256_loadu_ps((const float *)(const void *)p);
}

RMS_ALWAYS_INLINE rms_vh rms_vh_load(const char *p)
{
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

/* The top halves of 8 32-bit lanes, as unsigned 16-bit values, packed in
   order. */
RMS_ALWAYS_INLINE rms_vh rms_top_halves(__m256i bits)
{
    const __m256i shifted = _mm256_srli_epi32(bits, 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
}

/* float to bfloat16, to nearest even, NaN kept quiet, in the top halves of
   the lanes (the low halves are what was rounded away, plus carries). */
RMS_ALWAYS_INLINE __m256i rms_vf_bf16_in_top_halves(rms_vf v)
{
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* float to bfloat16 bits, as rms_vf_bf16_in_top_halves rounds. */
RMS_ALWAYS_INLINE rms_vh rms_vf_to_bfloat16(rms_vf v)
{
    return rms_top_halves(rms_vf_bf16_in_top_halves(v));
}

/* float to float16 bits, to nearest even. */
RMS_ALWAYS_INLINE rms_vh rms_vf_to_float16(rms_vf v)
{
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* The top 16 bits of each lane's bit pattern plus bias (no carry into the
   sign where v is finite). */
RMS_ALWAYS_INLINE rms_vh rms_vf_top16_biased(rms_vf v, int32_t bias)
{
    return rms_top_halves(_mm256_add_epi32(_mm256_castps_si256(v), _mm256_set1_epi32(bias)));
}

/* Whether rms_vf_top16_biased(v, a) and (v, b) agree in every lane: one
   test of the 32-bit sums, without narrowing both. */
RMS_ALWAYS_INLINE int rms_vf_top16_agree(rms_vf v, int32_t a, int32_t b)
{
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i differ = _mm256_xor_si256(_mm256_add_epi32(bits, _mm256_set1_epi32(a)),
                                            _mm256_add_epi32(bits, _mm256_set1_epi32(b)));
    return _mm256_testz_si256(differ, _mm256_set1_epi32((int32_t)0xffff0000u));
}

RMS_ALWAYS_INLINE int rms_vh_equal(rms_vh a, rms_vh b)
{
    const __m128i differ = _mm_xor_si128(a, b);
    return _mm_testz_si128(differ, differ);
}

/* Whether some lane is neither 0 nor a normal float: subnormal, infinite
   or NaN. As magnitudes, those are the bit patterns in (0, 0x800000) and
   from 0x7f800000 on (signed compares: the magnitude is never negative). */
RMS_ALWAYS_INLINE int rms_vf_any_abnormal(rms_vf v)
{
    const __m256i magnitude =
        _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    const __m256i zero = _mm256_setzero_si256();
    const __m256i subnormal = _mm256_andnot_si256(
        _mm256_cmpeq_epi32(magnitude, zero),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(0x800000), magnitude));
    const __m256i special = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f7fffff));
    const __m256i abnormal = _mm256_or_si256(subnormal, special);
    return !_mm256_testz_si256(abnormal, abnormal);
}

/* Stores 8 16-bit values; with stream, p is vector-aligned and the store
   bypasses the cache. */
RMS_ALWAYS_INLINE void rms_vh_store(char *p, rms_vh v, int stream)
{
    if (stream) {
        _mm_stream_si128((__m128i *)(void *)p, v);
    }
    else {
        _mm_storeu_si128((__m128i *)(void *)p, v);
    }
}

/* Stores 8 floats; with stream, p is vector-aligned and the store
   bypasses the cache. */
RMS_ALWAYS_INLINE void rms_vf_store_f32(char *p, rms_vf v, int stream)
{
    if (stream) {
        _mm256_stream_ps((float *)(void *)p, v);
    }
    else {
        _mm256_storeu_ps((float *)(void *)p, v);
    }
}

RMS_ALWAYS_INLINE rms_vd rms_vd_load(const char *p) { return _mm256_loadu_pd((const double *)(const void *)p); }

RMS_ALWAYS_INLINE void rms_vd_store(char *p, rms_vd v, int stream)
{
    if (stream) {
        _mm256_stream_pd((double *)(void *)p, v);
    }
    else {
        _mm256_storeu_pd((double *)(void *)p, v);
    }
}

/* Half `part` (0: lanes 0-3, 1: lanes 4-7) of v, widened to double. */
RMS_ALWAYS_INLINE rms_vd rms_vd_widen(rms_vf v, int part)
{
    __m128 half = part == 0 ? _mm256_castps256_ps128(v) : _mm256_extractf128_ps(v, 1);
    return _mm256_cvtps_pd(half);
}

/* 8 elements of a 32- or 16-bit kind, widened to double (exact): lanes
   0-3 in parts[0], 4-7 in parts[1]. Converted from memory, float32 halves
   need no shuffle; bfloat16 becomes floats by interleaving zeros below
   each element, which keeps the order within 128 bits; float16 does best
   as one load and rms_vd_widen. */
RMS_ALWAYS_INLINE void rms_vd_load_widened(rms_kind kind, const char *p, rms_vd *parts)
{
    switch (kind) {
    case RMS_KIND_F16: {
        const rms_vf floats = rms_vh_widen(kind, rms_vh_load(p));
        parts[0] = rms_vd_widen(floats, 0);
        parts[1] = rms_vd_widen(floats, 1);
        return;
    }
    case RMS_KIND_BF16: {
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        const __m128i zero = _mm_setzero_si128();
        parts[0] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(zero, v)));
        parts[1] = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(zero, v)));
        return;
    }
    default:
        parts[0] = _mm256_cvtps_pd(_mm_loadu_ps((const float *)(const void *)p));
        parts[1] = _mm256_cvtps_pd(_mm_loadu_ps((const float *)(const void *)p + 4));
        return;
    }
}

/* parts[0] and parts[1] narrowed to float, rounded to nearest. */
RMS_ALWAYS_INLINE rms_vf rms_vf_narrow(const rms_vd *parts)
{
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(parts[0])),
                                _mm256_cvtpd_ps(parts[1]), 1);
}

/* Two vectors of 64-bit lane masks as one vector of 32-bit lane masks. */
RMS_ALWAYS_INLINE __m256i rms_masks_narrow(rms_vd low, rms_vd high)
{
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    __m256i low32 = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(low), even);
    __m256i high32 = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(high), even);
    return _mm256_blend_epi32(low32, high32, 0xf0);
}

/* parts narrowed to float, rounded to odd: truncated, with the last bit set
   where that lost anything. A second rounding to 16 bits then rounds as
   if from the doubles directly. Without embedded rounding, the truncation
   is the rounding to nearest stepped back one ulp where it went past. */
RMS_ALWAYS_INLINE rms_vf rms_vf_narrow_round_to_odd(const rms_vd *parts)
{
    const rms_vf nearest = rms_vf_narrow(parts);
    const rms_vd sign = _mm256_set1_pd(-0.0);
    rms_vd past[2], inexact[2];
    for (int h = 0; h < 2; h++) {
        const rms_vd back = rms_vd_widen(nearest, h);
        past[h] = _mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, parts[h]),
                                _CMP_GT_OQ);
        inexact[h] = _mm256_cmp_pd(back, parts[h], _CMP_NEQ_OQ);
    }
    const __m256i bits = _mm256_castps_si256(nearest);
    const __m256i truncated = _mm256_add_epi32(bits, rms_masks_narrow(past[0], past[1]));
    const __m256i sticky =
        _mm256_and_si256(rms_masks_narrow(inexact[0], inexact[1]), _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_or_si256(truncated, sticky));
}

/* hi + err (err below half an ulp of hi) rounded to odd as a double: where
   err points toward zero, hi was rounded away from it and steps back one
   ulp; where err is not 0, the last bit is set. */
RMS_ALWAYS_INLINE rms_vd rms_vd_round_to_odd(rms_vd hi, rms_vd err)
{
    const __m256i bits = _mm256_castpd_si256(hi);
    const __m256i inexact = _mm256_castpd_si256(_mm256_cmp_pd(err, _mm256_setzero_pd(), _CMP_NEQ_OQ));
    const __m256i nonzero = _mm256_castpd_si256(_mm256_cmp_pd(hi, _mm256_setzero_pd(), _CMP_NEQ_OQ));
    const __m256i toward_zero =
        _mm256_cmpgt_epi64(_mm256_setzero_si256(), _mm256_xor_si256(bits, _mm256_castpd_si256(err)));
    const __m256i step = _mm256_and_si256(_mm256_and_si256(inexact, nonzero), toward_zero);
    const __m256i truncated = _mm256_add_epi64(bits, step);
    const __m256i sticky = _mm256_and_si256(inexact, _mm256_set1_epi64x(1));
    return _mm256_castsi256_pd(_mm256_or_si256(truncated, sticky));
}

RMS_ALWAYS_INLINE void rms_stream_fence(void) { _mm_sfence(); }

#include "vec_derived.h"

#endif
