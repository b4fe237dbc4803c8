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

#include "../types.h"
#include "common.h"

#define RMS_VF_WIDTH 8
#define RMS_VD_WIDTH 4
#define RMS_VECTOR_BYTES 32
#define RMS_HAVE_FMA 1
#define RMS_HAVE_STREAM 1

typedef __m256 rms_vf;
typedef __m256d rms_vd;

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

RMS_ALWAYS_INLINE rms_vd rms_vd_zero_where_inf(rms_vd value, rms_vd w)
{
    const rms_vd magnitude = _mm256_andnot_pd(_mm256_set1_pd(-0.0), w);
    const rms_vd infinite = _mm256_cmp_pd(magnitude, _mm256_set1_pd(INFINITY), _CMP_EQ_OQ);
    return _mm256_andnot_pd(infinite, value);
}

/* Loads 8 elements of a 32- or 16-bit kind, widened to float (exact). */
RMS_ALWAYS_INLINE rms_vf rms_vf_load(rms_kind kind, const char *p)
{
    switch (kind) {
    case RMS_KIND_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    case RMS_KIND_BF16: {
        __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
    default:
        return _mm256_loadu_ps((const float *)(const void *)p);
    }
}

/* float to bfloat16 bits, to nearest even, NaN kept quiet. */
RMS_ALWAYS_INLINE __m128i rms_vf_to_bf16(rms_vf v)
{
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
    rounded = _mm256_blendv_epi8(rounded, quiet, nan);
    /* the top halves, as unsigned 16-bit values, packed in order */
    const __m256i shifted = _mm256_srli_epi32(rounded, 16);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
    return packed;
}

/* Stores 8 floats narrowed to a 32- or 16-bit kind, each rounded once to
   nearest, ties to even. With stream, p is vector-aligned and the stores
   bypass the cache. */
RMS_ALWAYS_INLINE void rms_vf_store(rms_kind kind, char *p, rms_vf v, int stream)
{
    __m128i narrow;
    switch (kind) {
    case RMS_KIND_F16:
        narrow = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        break;
    case RMS_KIND_BF16:
        narrow = rms_vf_to_bf16(v);
        break;
    default:
        if (stream) {
            _mm256_stream_ps((float *)(void *)p, v);
        }
        else {
            _mm256_storeu_ps((float *)(void *)p, v);
        }
        return;
    }
    if (stream) {
        _mm_stream_si128((__m128i *)(void *)p, narrow);
    }
    else {
        _mm_storeu_si128((__m128i *)(void *)p, narrow);
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

/* hi + err (err below half an ulp of hi) rounded to odd as a float: where
   err points toward zero, hi was rounded away from it and steps back one
   ulp; where err is not 0, the last bit is set. */
RMS_ALWAYS_INLINE rms_vf rms_vf_round_to_odd(rms_vf hi, rms_vf err)
{
    const __m256i bits = _mm256_castps_si256(hi);
    const __m256i inexact = _mm256_castps_si256(_mm256_cmp_ps(err, _mm256_setzero_ps(), _CMP_NEQ_OQ));
    const __m256i nonzero = _mm256_castps_si256(_mm256_cmp_ps(hi, _mm256_setzero_ps(), _CMP_NEQ_OQ));
    const __m256i toward_zero =
        _mm256_cmpgt_epi32(_mm256_setzero_si256(), _mm256_xor_si256(bits, _mm256_castps_si256(err)));
    const __m256i step = _mm256_and_si256(_mm256_and_si256(inexact, nonzero), toward_zero);
    const __m256i truncated = _mm256_add_epi32(bits, step); /* step: 0 or -1 */
    const __m256i sticky = _mm256_and_si256(inexact, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_or_si256(truncated, sticky));
}

/* The same for doubles. */
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

/* a * b + c rounded to odd: rounded to nearest, with its exact error from
   the product's error and a two-sum, then rounded to odd. */
RMS_ALWAYS_INLINE rms_vf rms_vf_fma_round_to_odd(rms_vf a, rms_vf b, rms_vf c)
{
    const rms_vf p = _mm256_mul_ps(a, b);
    const rms_vf p_err = _mm256_fmsub_ps(a, b, p);
    const rms_vf s = _mm256_add_ps(p, c);
    const rms_vf c_virtual = _mm256_sub_ps(s, p);
    const rms_vf s_err = _mm256_add_ps(_mm256_sub_ps(p, _mm256_sub_ps(s, c_virtual)),
                                       _mm256_sub_ps(c, c_virtual));
    return rms_vf_round_to_odd(s, _mm256_add_ps(s_err, p_err));
}

RMS_ALWAYS_INLINE void rms_stream_fence(void) { _mm_sfence(); }

#endif
