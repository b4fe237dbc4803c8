/*
 * The vector vocabulary on x86-64 with AVX-512 (F, BW, DQ, VL) and F16C:
 * 16 floats or 8 doubles a vector. See vec_baseline.h for the contract that
 * every instruction set's vocabulary keeps; the row kernels use nothing else.
 */
#ifndef RMSNORM_KERNELS_SIMD_VEC_AVX512_H
#define RMSNORM_KERNELS_SIMD_VEC_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "../types.h"
#include "common.h"

#define RMS_VF_WIDTH 16
#define RMS_VD_WIDTH 8
#define RMS_VECTOR_BYTES 64
#define RMS_HAVE_FMA 1
#define RMS_HAVE_STREAM 1
#define RMS_HAVE_LOAD_WIDENED 1 /* rms_vd_load_widened says why */
#define RMS_HAVE_MASKED 1

typedef __m512 rms_vf;
typedef __m512d rms_vd;
typedef __m256i rms_vh;

RMS_ALWAYS_INLINE rms_vf rms_vf_set(float v) { return _mm512_set1_ps(v); }
RMS_ALWAYS_INLINE rms_vf rms_vf_add(rms_vf a, rms_vf b) { return _mm512_add_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_sub(rms_vf a, rms_vf b) { return _mm512_sub_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_mul(rms_vf a, rms_vf b) { return _mm512_mul_ps(a, b); }
RMS_ALWAYS_INLINE rms_vf rms_vf_fma(rms_vf a, rms_vf b, rms_vf c) { return _mm512_fmadd_ps(a, b, c); }
RMS_ALWAYS_INLINE rms_vf rms_vf_product_error(rms_vf a, rms_vf b, rms_vf p)
{
    return _mm512_fmsub_ps(a, b, p);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_set(double v) { return _mm512_set1_pd(v); }
RMS_ALWAYS_INLINE rms_vd rms_vd_add(rms_vd a, rms_vd b) { return _mm512_add_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_sub(rms_vd a, rms_vd b) { return _mm512_sub_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_mul(rms_vd a, rms_vd b) { return _mm512_mul_pd(a, b); }
RMS_ALWAYS_INLINE rms_vd rms_vd_muladd(rms_vd a, rms_vd b, rms_vd c) { return _mm512_fmadd_pd(a, b, c); }
RMS_ALWAYS_INLINE rms_vd rms_vd_product_error(rms_vd a, rms_vd b, rms_vd p)
{
    return _mm512_fmsub_pd(a, b, p);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_zero_where_inf(rms_vf value, rms_vf w)
{
    /* vfpclass categories: 0x08 +inf, 0x10 -inf */
    return _mm512_maskz_mov_ps(~_mm512_fpclass_ps_mask(w, 0x08 | 0x10), value);
}

RMS_ALWAYS_INLINE rms_vf rms_vf_abs(rms_vf v) { return _mm512_abs_ps(v); }

RMS_ALWAYS_INLINE rms_vf rms_vf_where_both_nonzero(rms_vf value, rms_vf a, rms_vf b)
{
    const rms_vf zero = _mm512_setzero_ps();
    const __mmask16 nonzero = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(a, zero, _CMP_NEQ_UQ), b,
                                                      zero, _CMP_NEQ_UQ);
    return _mm512_maskz_mov_ps(nonzero, value);
}

RMS_ALWAYS_INLINE int rms_vf_equal(rms_vf a, rms_vf b)
{
    return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ) == 0xffff;
}

RMS_ALWAYS_INLINE int rms_vf_same(rms_vf a, rms_vf b)
{
    return _mm512_cmpneq_epi32_mask(_mm512_castps_si512(a), _mm512_castps_si512(b)) == 0;
}

RMS_ALWAYS_INLINE rms_vd rms_vd_zero_where_inf(rms_vd value, rms_vd w)
{
    return _mm512_maskz_mov_pd(~_mm512_fpclass_pd_mask(w, 0x08 | 0x10), value);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_min(rms_vd a, rms_vd b) { return _mm512_min_pd(a, b); }

RMS_ALWAYS_INLINE rms_vd rms_vd_least_nonzero(rms_vd least, rms_vd v)
{
    /* vrangepd 0x0a: the operand of smaller magnitude, its sign cleared;
       only in the lanes where v is neither 0 nor NaN */
    const __mmask8 nonzero = _mm512_cmp_pd_mask(v, _mm512_setzero_pd(), _CMP_NEQ_OQ);
    return _mm512_mask_range_pd(least, nonzero, least, v, 0x0a);
}

RMS_ALWAYS_INLINE int rms_vd_any_below_where_both_nonzero(rms_vd u, rms_vd v, rms_vd bound,
                                                          rms_vd a, rms_vd b)
{
    const rms_vd zero = _mm512_setzero_pd();
    /* min gives its second operand where either is NaN: v's NaN is not below */
    const __mmask8 below = _mm512_cmp_pd_mask(
        _mm512_min_pd(_mm512_abs_pd(u), _mm512_abs_pd(v)), bound, _CMP_LT_OQ);
    return _mm512_mask_cmp_pd_mask(_mm512_mask_cmp_pd_mask(below, a, zero, _CMP_NEQ_UQ), b, zero,
                                   _CMP_NEQ_UQ) != 0;
}

/* 16 float16 or bfloat16 patterns widened to float (exact). A bfloat16
   pattern is the top half of its float's: one word permute puts each in
   the top half of its lane and zeroes the rest. A widening move and a
   shift take two operations, and the shift shares its pipes with the
   conversions and compares that bound the 16-bit kernels (the bfloat16
   forward took 4 to 8% longer). */
RMS_ALWAYS_INLINE rms_vf rms_vh_widen(rms_kind kind, rms_vh h)
{
    if (kind == RMS_KIND_F16) {
        return _mm512_cvtph_ps(h);
    }
    const __m512i to_top_halves = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0,
                                                   8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0,
                                                   0, 0);
    return _mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xaaaaaaaau, to_top_halves, _mm512_castsi256_si512(h)));
}

RMS_ALWAYS_INLINE rms_vf rms_vf_load_f32(const char *p)
{
    return _mm512_loadu_ps((const float *)(const void *)p);
}

RMS_ALWAYS_INLINE rms_vh rms_vh_load(const char *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* The first count lanes of a vector, 0 <= count <= its width. */
RMS_ALWAYS_INLINE __mmask16 rms_first_lanes(ptrdiff_t count)
{
    return (__mmask16)((1u << count) - 1u);
}

/* A block's head or tail, read and written in place with masked moves. A
   packed copy moves it element by element, and its narrow stores cannot
   be forwarded to the wide load that follows them; NumPy's 16-byte-aligned
   rows have two such blocks each, and on them the float32 forward and
   backward of 256-column rows took a fifth to a quarter longer. The
   masked-off lanes are zero, as in a packed copy, and never touched in
   memory. */
RMS_ALWAYS_INLINE rms_vf rms_vf_load_first_f32(const char *p, ptrdiff_t count)
{
    return _mm512_maskz_loadu_ps(rms_first_lanes(count), p);
}

RMS_ALWAYS_INLINE rms_vh rms_vh_load_first(const char *p, ptrdiff_t count)
{
    return _mm256_maskz_loadu_epi16(rms_first_lanes(count), p);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_load_first(const char *p, ptrdiff_t count)
{
    return _mm512_maskz_loadu_pd((__mmask8)rms_first_lanes(count), p);
}

/* The top halves of 16 32-bit lanes, packed in order. One word permute:
   a shift and vpmovdw take three times the shuffle work. */
RMS_ALWAYS_INLINE __m256i rms_top_halves(__m512i bits)
{
    const __m512i odd_words = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5,
                                               3, 1, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9,
                                               7, 5, 3, 1);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd_words, bits));
}

/* float to bfloat16, to nearest even, NaN kept quiet, in the top halves of
   the lanes (the low halves are what was rounded away, plus carries). Not
   AVX512-BF16's vcvtneps2bf16: it flushes subnormal inputs and outputs to
   zero. */
RMS_ALWAYS_INLINE __m512i rms_vf_bf16_in_top_halves(rms_vf v)
{
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
}

/* float to bfloat16 bits, as rms_vf_bf16_in_top_halves rounds. */
RMS_ALWAYS_INLINE rms_vh rms_vf_to_bfloat16(rms_vf v)
{
    return rms_top_halves(rms_vf_bf16_in_top_halves(v));
}

/* float to float16 bits, to nearest even. */
RMS_ALWAYS_INLINE rms_vh rms_vf_to_float16(rms_vf v)
{
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* The top 16 bits of each lane's bit pattern plus bias (no carry into the
   sign where v is finite). */
RMS_ALWAYS_INLINE rms_vh rms_vf_top16_biased(rms_vf v, int32_t bias)
{
    return rms_top_halves(_mm512_add_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(bias)));
}

/* Whether rms_vf_top16_biased(v, a) and (v, b) agree in every lane, for
   0 <= a < b < 2^16. The two sums differ above bit 16 only where adding b
   carries out of the low 16 bits and adding a does not: where the low 16
   bits of v + b fall below b - a. v + b is the sum that
   rms_vf_top16_biased(v, b) makes too, so the test costs two operations. */
RMS_ALWAYS_INLINE int rms_vf_top16_agree(rms_vf v, int32_t a, int32_t b)
{
    const __m512i low = _mm512_and_si512(
        _mm512_add_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(b)), _mm512_set1_epi32(0xffff));
    return _mm512_cmplt_epu32_mask(low, _mm512_set1_epi32(b - a)) == 0;
}

RMS_ALWAYS_INLINE int rms_vh_equal(rms_vh a, rms_vh b)
{
    return _mm256_cmpneq_epi16_mask(a, b) == 0;
}

/* Whether some lane is neither 0 nor a normal float: subnormal, infinite
   or NaN. */
RMS_ALWAYS_INLINE int rms_vf_any_abnormal(rms_vf v)
{
    /* vfpclass categories: 0x01 quiet NaN, 0x08 +inf, 0x10 -inf, 0x20
       subnormal, 0x80 signalling NaN */
    return _mm512_fpclass_ps_mask(v, 0x01 | 0x08 | 0x10 | 0x20 | 0x80) != 0;
}

/* Stores 16 16-bit values; with stream, p is vector-aligned and the store
   bypasses the cache. */
RMS_ALWAYS_INLINE void rms_vh_store(char *p, rms_vh v, int stream)
{
    if (stream) {
        _mm256_stream_si256((__m256i *)(void *)p, v);
    }
    else {
        _mm256_storeu_si256((__m256i *)(void *)p, v);
    }
}

/* Stores 16 floats; with stream, p is vector-aligned and the store
   bypasses the cache. */
RMS_ALWAYS_INLINE void rms_vf_store_f32(char *p, rms_vf v, int stream)
{
    if (stream) {
        _mm512_stream_ps((float *)(void *)p, v);
    }
    else {
        _mm512_storeu_ps((float *)(void *)p, v);
    }
}

RMS_ALWAYS_INLINE void rms_vh_store_first(char *p, rms_vh v, ptrdiff_t count)
{
    _mm256_mask_storeu_epi16(p, rms_first_lanes(count), v);
}

RMS_ALWAYS_INLINE void rms_vf_store_first_f32(char *p, rms_vf v, ptrdiff_t count)
{
    _mm512_mask_storeu_ps(p, rms_first_lanes(count), v);
}

RMS_ALWAYS_INLINE void rms_vd_store_first(char *p, rms_vd v, ptrdiff_t count)
{
    _mm512_mask_storeu_pd(p, (__mmask8)rms_first_lanes(count), v);
}

RMS_ALWAYS_INLINE rms_vd rms_vd_load(const char *p) { return _mm512_loadu_pd((const double *)(const void *)p); }

RMS_ALWAYS_INLINE void rms_vd_store(char *p, rms_vd v, int stream)
{
    if (stream) {
        _mm512_stream_pd((double *)(void *)p, v);
    }
    else {
        _mm512_storeu_pd((double *)(void *)p, v);
    }
}

/* Half `part` (0: lanes 0-7, 1: lanes 8-15) of v, widened to double. */
RMS_ALWAYS_INLINE rms_vd rms_vd_widen(rms_vf v, int part)
{
    __m256 half = part == 0 ? _mm512_castps512_ps256(v) : _mm512_extractf32x8_ps(v, 1);
    return _mm512_cvtps_pd(half);
}

/* 16 elements of a 32- or 16-bit kind, widened to double (exact): lanes
   0-7 in parts[0], 8-15 in parts[1]. Converted from memory, float32 and
   float16 halves need no shuffle (a float32 row's sum costs half as much);
   bfloat16 has no such conversion, and one load and rms_vd_widen do best. */
RMS_ALWAYS_INLINE void rms_vd_load_widened(rms_kind kind, const char *p, rms_vd *parts)
{
    switch (kind) {
    case RMS_KIND_F16:
        for (int h = 0; h < 2; h++) {
            const __m128i half = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * h));
            parts[h] = _mm512_cvtps_pd(_mm256_cvtph_ps(half));
        }
        return;
    case RMS_KIND_BF16: {
        const rms_vf floats = rms_vh_widen(kind, rms_vh_load(p));
        parts[0] = rms_vd_widen(floats, 0);
        parts[1] = rms_vd_widen(floats, 1);
        return;
    }
    default:
        parts[0] = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)p));
        parts[1] = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)p + 8));
        return;
    }
}

/* parts[0] and parts[1] narrowed to float, rounded to nearest. */
RMS_ALWAYS_INLINE rms_vf rms_vf_narrow(const rms_vd *parts)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(parts[0])),
                              _mm512_cvtpd_ps(parts[1]), 1);
}

/* parts narrowed to float, rounded to odd: truncated, with the last bit set
   where that lost anything. A second rounding to 16 bits then rounds as
   if from the doubles directly. */
RMS_ALWAYS_INLINE rms_vf rms_vf_narrow_round_to_odd(const rms_vd *parts)
{
    __m256 low = _mm512_cvt_roundpd_ps(parts[0], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 high = _mm512_cvt_roundpd_ps(parts[1], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask8 low_inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(low), parts[0], _CMP_NEQ_OQ);
    __mmask8 high_inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(high), parts[1], _CMP_NEQ_OQ);
    __m512i bits = _mm512_castps_si512(
        _mm512_insertf32x8(_mm512_castps256_ps512(low), high, 1));
    __mmask16 inexact = (__mmask16)(low_inexact | ((unsigned)high_inexact << 8));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(bits, inexact, bits, _mm512_set1_epi32(1)));
}

/* hi + err (err below half an ulp of hi) rounded to odd as a double. */
RMS_ALWAYS_INLINE rms_vd rms_vd_round_to_odd(rms_vd hi, rms_vd err)
{
    const __m512i bits = _mm512_castpd_si512(hi);
    const __m512i one = _mm512_set1_epi64(1);
    __mmask8 inexact = _mm512_cmp_pd_mask(err, _mm512_setzero_pd(), _CMP_NEQ_OQ);
    __mmask8 nonzero = _mm512_cmp_pd_mask(hi, _mm512_setzero_pd(), _CMP_NEQ_OQ);
    /* where err points toward zero, hi was rounded away from it: step back */
    __mmask8 toward_zero = _mm512_movepi64_mask(_mm512_xor_si512(bits, _mm512_castpd_si512(err)));
    __m512i truncated = _mm512_mask_sub_epi64(bits, inexact & nonzero & toward_zero, bits, one);
    return _mm512_castsi512_pd(_mm512_mask_or_epi64(truncated, inexact, truncated, one));
}

RMS_ALWAYS_INLINE void rms_stream_fence(void) { _mm_sfence(); }

#include "vec_derived.h"

#endif
