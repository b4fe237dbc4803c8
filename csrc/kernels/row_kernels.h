/*
 * The RMSNorm row kernels, written once against the vector vocabulary of
 * simd/vec_*.h and compiled by each isa_*.c into one table of kernels per
 * element type (types.h).
 *
 * Every function takes the storage kinds of x and of the weight as its
 * first arguments. They are constants wherever a table entry calls in, so
 * each type's kernels compile to straight-line code of their own: the
 * switch on a kind, and the choice between compensated and plain sums,
 * fold away.
 *
 * Every row is worked in two passes: one reduces, one writes, with the row
 * still in cache between them. While a contiguous row is written, the next
 * one is reduced in the same loop, and where the output is streamed to
 * memory the row after it is asked for: rms_forward_write says why. Sums go into
 * RMS_LANES double lanes, element i into lane i % RMS_LANES: it breaks the
 * add latency chain, and fixes the summation order, so results do not
 * depend on how rows are split among threads or whether a row is strided.
 *
 * The including file has defined RMS_LANES and included its vocabulary.
 */
#ifndef RMSNORM_KERNELS_ROW_KERNELS_H
#define RMSNORM_KERNELS_ROW_KERNELS_H

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dd_math.h"
#include "half.h"
#include "kernels.h"

#define RMS_VD_PER_VF (RMS_VF_WIDTH / RMS_VD_WIDTH)
/* Whether this table's kernels also take strided rows (kernels.h): only
   isa_strided.c's, for rows too long to pack; in every table the strided
   loops doubled the machine code, for rows the driver now packs. */
#ifndef RMS_STRIDED_ROWS
#define RMS_STRIDED_ROWS 0
#endif
/* Loops over a block's vectors or a row's accumulators have constant trip
   counts; unrolled whole, their accumulators can stay in registers. */
#if defined(__clang__)
#define RMS_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define RMS_UNROLL _Pragma("GCC unroll 64")
#else
#define RMS_UNROLL
#endif
#define RMS_ACCUMULATORS (RMS_LANES / RMS_VD_WIDTH)
/* The backward sums two things in one pass and gives each half the lanes:
   more would not fit in the registers. */
#define RMS_DOT_LANES (RMS_LANES / 2)

/* ---- elements and blocks ------------------------------------------------ */

/* Every value of the kind is a float, so products of two are exact in
   double and a sum of them needs no compensation. */
RMS_ALWAYS_INLINE int rms_kind_is_float_exact(rms_kind kind) { return kind != RMS_KIND_F64; }

RMS_ALWAYS_INLINE const char *rms_element(const char *base, ptrdiff_t i, ptrdiff_t stride)
{
    return base + i * stride;
}

RMS_ALWAYS_INLINE char *rms_element_out(char *base, ptrdiff_t i, ptrdiff_t stride)
{
    return base + i * stride;
}

/* One element as a double, for per-row and per-call scalar work. */
RMS_ALWAYS_INLINE double rms_load_scalar(rms_kind kind, const char *p)
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

/* The doubles of a block: RMS_VF_WIDTH consecutive elements of a row. */
typedef struct {
    rms_vd part[RMS_VD_PER_VF];
} rms_block;

/* Copies count elements, stride bytes apart, into a zeroed packed block. */
RMS_ALWAYS_INLINE void rms_gather(rms_kind kind, char *packed, const char *p, ptrdiff_t stride,
                                  ptrdiff_t count)
{
    const size_t size = (size_t)rms_kind_size(kind);
    memset(packed, 0, RMS_VF_WIDTH * size);
    for (ptrdiff_t k = 0; k < count; k++) {
        memcpy(packed + (size_t)k * size, p + k * stride, size);
    }
}

RMS_ALWAYS_INLINE void rms_scatter(rms_kind kind, char *p, ptrdiff_t stride, const char *packed,
                                   ptrdiff_t count)
{
    const size_t size = (size_t)rms_kind_size(kind);
    for (ptrdiff_t k = 0; k < count; k++) {
        memcpy(p + k * stride, packed + (size_t)k * size, size);
    }
}

/* A block of a 32- or 16-bit kind as floats. A block that is not whole and
   contiguous (a row's head or tail, a strided row) goes through a packed
   copy, zero where count ends, so that every element meets the same
   arithmetic in the same lane. */
RMS_ALWAYS_INLINE rms_vf rms_load_floats(rms_kind kind, const char *p, ptrdiff_t stride,
                                         ptrdiff_t count)
{
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        return rms_vf_load(kind, p);
    }
#if RMS_HAVE_MASKED
    if (stride == rms_kind_size(kind)) {
        return rms_vf_load_first(kind, p, count);
    }
#endif
    /* room for any kind: without forced inlining the compiler cannot see
       that kind is never float64 here, and warns */
    char packed[RMS_VF_WIDTH * 8];
    rms_gather(kind, packed, p, stride, count);
    return rms_vf_load(kind, packed);
}

RMS_ALWAYS_INLINE rms_block rms_load_doubles(rms_kind kind, const char *p, ptrdiff_t stride,
                                             ptrdiff_t count)
{
    rms_block block;
    if (kind == RMS_KIND_F64) {
#if RMS_HAVE_MASKED
        if (stride == 8) {
            RMS_UNROLL
            for (int h = 0; h < RMS_VD_PER_VF; h++) {
                const ptrdiff_t left = count - h * RMS_VD_WIDTH;
                block.part[h] = rms_vd_set(0.0);
                if (left >= RMS_VD_WIDTH) {
                    block.part[h] = rms_vd_load(p + h * RMS_VD_WIDTH * 8);
                }
                else if (left > 0) {
                    block.part[h] = rms_vd_load_first(p + h * RMS_VD_WIDTH * 8, left);
                }
            }
            return block;
        }
#endif
        char packed[RMS_VF_WIDTH * 8];
        const char *src = p;
        if (stride != 8 || count != RMS_VF_WIDTH) {
            rms_gather(kind, packed, p, stride, count);
            src = packed;
        }
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            block.part[h] = rms_vd_load(src + h * RMS_VD_WIDTH * 8);
        }
        return block;
    }
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        rms_vd_load_widened(kind, p, block.part); /* the cheapest way each vocabulary has */
        return block;
    }
    const rms_vf floats = rms_load_floats(kind, p, stride, count);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        block.part[h] = rms_vd_widen(floats, h);
    }
    return block;
}

RMS_ALWAYS_INLINE void rms_store_floats(rms_kind kind, char *p, ptrdiff_t stride, ptrdiff_t count,
                                        rms_vf v, int stream)
{
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        rms_vf_store(kind, p, v, stream);
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == rms_kind_size(kind)) {
        rms_vf_store_first(kind, p, v, count);
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 4];
    rms_vf_store(kind, packed, v, 0);
    rms_scatter(kind, p, stride, packed, count);
}

RMS_ALWAYS_INLINE void rms_store_halves(char *p, ptrdiff_t stride, ptrdiff_t count, rms_vh v,
                                        int stream)
{
    if (stride == 2 && count == RMS_VF_WIDTH) {
        rms_vh_store(p, v, stream);
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == 2) {
        rms_vh_store_first(p, v, count);
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 2];
    rms_vh_store(packed, v, 0);
    rms_scatter(RMS_KIND_F16, p, stride, packed, count);
}

RMS_ALWAYS_INLINE void rms_store_doubles(char *p, ptrdiff_t stride, ptrdiff_t count,
                                         const rms_block *block, int stream)
{
    if (stride == 8 && count == RMS_VF_WIDTH) {
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            rms_vd_store(p + h * RMS_VD_WIDTH * 8, block->part[h], stream);
        }
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == 8) {
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            const ptrdiff_t left = count - h * RMS_VD_WIDTH;
            if (left >= RMS_VD_WIDTH) {
                rms_vd_store(p + h * RMS_VD_WIDTH * 8, block->part[h], 0);
            }
            else if (left > 0) {
                rms_vd_store_first(p + h * RMS_VD_WIDTH * 8, block->part[h], left);
            }
        }
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 8];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        rms_vd_store(packed + h * RMS_VD_WIDTH * 8, block->part[h], 0);
    }
    rms_scatter(RMS_KIND_F64, p, stride, packed, count);
}

/* Doubles stored in kind, each rounded once: to nearest for float, and for
   16 bits to odd in float first, which then rounds to nearest as the
   doubles would directly. */
RMS_ALWAYS_INLINE void rms_store_narrowed(rms_kind kind, char *p, ptrdiff_t stride,
                                          ptrdiff_t count, const rms_block *values, int stream)
{
    if (kind == RMS_KIND_F64) {
        rms_store_doubles(p, stride, count, values, stream);
    }
    else if (kind == RMS_KIND_F32) {
        rms_store_floats(kind, p, stride, count, rms_vf_narrow(values->part), stream);
    }
    else {
        rms_store_floats(kind, p, stride, count, rms_vf_narrow_round_to_odd(values->part), stream);
    }
}

/* hi + err (a double-double, err within half an ulp of hi) stored in kind,
   rounded once: through a double rounded to odd where kind is narrower. */
RMS_ALWAYS_INLINE void rms_store_rounded(rms_kind kind, char *p, ptrdiff_t stride, ptrdiff_t count,
                                         const rms_block *hi, const rms_block *err, int stream)
{
    if (kind == RMS_KIND_F64) {
        rms_store_doubles(p, stride, count, hi, stream);
        return;
    }
    rms_block odd;
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        odd.part[h] = rms_vd_round_to_odd(hi->part[h], err->part[h]);
    }
    rms_store_narrowed(kind, p, stride, count, &odd, stream);
}

/* ---- reductions --------------------------------------------------------- */

/* RMS_LANES running sums, each with the error terms of a compensated sum. */
typedef struct {
    rms_vd sum[RMS_ACCUMULATORS], comp[RMS_ACCUMULATORS];
} rms_lanes;

RMS_ALWAYS_INLINE void rms_lanes_clear(rms_lanes *lanes)
{
    RMS_UNROLL
    for (int k = 0; k < RMS_ACCUMULATORS; k++) {
        lanes->sum[k] = rms_vd_set(0.0);
        lanes->comp[k] = rms_vd_set(0.0);
    }
}

/* s + err == a + b exactly, lane by lane: rms_two_sum a vector at a time. */
RMS_ALWAYS_INLINE rms_vd rms_vd_two_sum(rms_vd a, rms_vd b, rms_vd *err)
{
    const rms_vd s = rms_vd_add(a, b);
    const rms_vd b_virtual = rms_vd_sub(s, a);
    *err = rms_vd_add(rms_vd_sub(a, rms_vd_sub(s, b_virtual)), rms_vd_sub(b, b_virtual));
    return s;
}

/* The first `count` lanes summed in a fixed order: pairwise, as
   rms_dd_sum_lanes adds them, exactly where the lanes are compensated sums
   (float64's squares, or a product with one), else in plain double, whose
   lanes are rounded sums already: a row of 16-bit or float32 values gains
   a few roundings of 2^-53 on its sum, and saves the two-sums' latency on
   every row. The levels that add whole vectors, lane j of vector k to lane
   j of vector k + half, run here in registers, and the last vector's lanes
   go through memory. (All levels in memory cost a store and a load each,
   and the narrow ones waited on the wide ones' stores: about a third of a
   row's time at 256 columns.) */
RMS_ALWAYS_INLINE rms_dd rms_lanes_total(const rms_lanes *lanes, int count, int compensated)
{
    rms_vd sum[RMS_ACCUMULATORS], comp[RMS_ACCUMULATORS];
    RMS_UNROLL
    for (int k = 0; k < RMS_ACCUMULATORS; k++) {
        sum[k] = lanes->sum[k];
        comp[k] = lanes->comp[k];
    }
    /* from a constant, so that the trip count is one without inlining too */
    RMS_UNROLL
    for (int half = RMS_ACCUMULATORS / 2; half >= 1; half /= 2) {
        if (2 * half > count / RMS_VD_WIDTH) {
            continue; /* past the first count lanes */
        }
        RMS_UNROLL
        for (int k = 0; k < half; k++) {
            if (compensated) {
                rms_vd err;
                sum[k] = rms_vd_two_sum(sum[k], sum[k + half], &err);
                comp[k] = rms_vd_add(comp[k], rms_vd_add(comp[k + half], err));
            }
            else {
                sum[k] = rms_vd_add(sum[k], sum[k + half]);
            }
        }
    }
    double last_sum[RMS_VD_WIDTH], last_comp[RMS_VD_WIDTH];
    rms_vd_store((char *)last_sum, sum[0], 0);
    if (compensated) {
        rms_vd_store((char *)last_comp, comp[0], 0);
        return rms_dd_sum_lanes(RMS_VD_WIDTH, last_sum, last_comp);
    }
    RMS_UNROLL
    for (int half = RMS_VD_WIDTH / 2; half >= 1; half /= 2) {
        RMS_UNROLL
        for (int k = 0; k < half; k++) {
            last_sum[k] += last_sum[k + half];
        }
    }
    const rms_dd total = {last_sum[0], 0.0};
    return total;
}

/* Adds a * b to one accumulator: plain where the product is exact in
   double (float operands) and no compensation is asked for; else with the
   sum's rounding error in comp, and the product's own error too where it
   may have one (a float64 operand). */
RMS_ALWAYS_INLINE void rms_accumulate(int compensated, int product_exact, rms_vd *sum,
                                      rms_vd *comp, rms_vd a, rms_vd b)
{
    if (!compensated) {
        *sum = rms_vd_muladd(a, b, *sum); /* the product is exact: fused or not, one rounding */
        return;
    }
    const rms_vd p = rms_vd_mul(a, b);
    rms_vd s_err;
    *sum = rms_vd_two_sum(*sum, p, &s_err);
    *comp = product_exact ? rms_vd_add(*comp, s_err)
                          : rms_vd_add(*comp, rms_vd_add(s_err, rms_vd_product_error(a, b, p)));
}

/* Whether the forward sums the squares of kind in plain double: float32
   and narrower, whose squares are exact in double, the sum within
   rms_sum_error of exact; float64's sums are compensated. */
RMS_ALWAYS_INLINE int rms_squares_are_plain(rms_kind kind) { return rms_kind_is_float_exact(kind); }

/* Adds the squares of block b of RMS_LANES elements, times scale where
   scaled, into its lanes: compensated where the squares are not exact in
   double, or where asked for. */
RMS_ALWAYS_INLINE void rms_add_block_squares(rms_kind xk, int compensated, rms_lanes *lanes, int b,
                                             const rms_block *v, int scaled, double scale)
{
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd e = scaled ? rms_vd_mul(v->part[h], rms_vd_set(scale)) : v->part[h];
        const int k = b * RMS_VD_PER_VF + h;
        /* a scaled square need not be exact */
        rms_accumulate(compensated || !rms_squares_are_plain(xk),
                       rms_squares_are_plain(xk) && !scaled, &lanes->sum[k], &lanes->comp[k], e,
                       e);
    }
}

/* Adds the squares of x[i, i + count), count <= RMS_LANES, times scale
   where scaled, into lanes 0 to count - 1. */
RMS_ALWAYS_INLINE void rms_add_squares(rms_kind xk, int compensated, rms_lanes *lanes,
                                       const char *x, ptrdiff_t xs, ptrdiff_t i, ptrdiff_t count,
                                       int scaled, double scale)
{
    RMS_UNROLL
    for (int b = 0; b < RMS_LANES / RMS_VF_WIDTH; b++) {
        const ptrdiff_t offset = (ptrdiff_t)b * RMS_VF_WIDTH;
        if (offset >= count) {
            break;
        }
        const ptrdiff_t block_count = count - offset < RMS_VF_WIDTH ? count - offset : RMS_VF_WIDTH;
        const rms_block v = rms_load_doubles(xk, rms_element(x, i + offset, xs), xs, block_count);
        rms_add_block_squares(xk, compensated, lanes, b, &v, scaled, scale);
    }
}

/* sum(x^2) over a row, each square times scale where scaled: compensated
   where rms_add_block_squares says. */
RMS_ALWAYS_INLINE rms_dd rms_sum_squares(rms_kind xk, int compensated, ptrdiff_t n, const char *x,
                                         ptrdiff_t xs, int scaled, double scale)
{
    rms_lanes lanes;
    rms_lanes_clear(&lanes);
    ptrdiff_t i = 0;
    for (; i + RMS_LANES <= n; i += RMS_LANES) {
        rms_add_squares(xk, compensated, &lanes, x, xs, i, RMS_LANES, scaled, scale);
    }
    if (i < n) {
        rms_add_squares(xk, compensated, &lanes, x, xs, i, n - i, scaled, scale);
    }
    return rms_lanes_total(&lanes, RMS_LANES, compensated || !rms_squares_are_plain(xk));
}

/* inv_rms of a row of float32 or narrower values from a compensated sum
   of squares, as close to exact as float64's, for the rows whose plain
   sum cannot settle every output (rms_forward_row). Out of line: inlined,
   it cost the write loops registers. */
RMS_NOINLINE rms_dd rms_exact_inv_rms(rms_kind xk, ptrdiff_t n, const char *x, ptrdiff_t xs,
                                      double eps)
{
    return rms_inv_rms_from_sum(rms_sum_squares(xk, 1, n, x, xs, 0, 1.0), (double)n, eps);
}

/*
 * How far, relative, inv_rms worked out from a plain sum of squares
 * (rms_squares_are_plain) may be from the exact sum's. The squares are
 * nonnegative, and each passes through at most ceil(n / RMS_LANES) adds in
 * its lane and log2(RMS_LANES) in the lanes' total, each a rounding of
 * 2^-53 relative to a partial sum: k such adds leave the sum within
 * k 2^-53 / (1 - k 2^-53) of exact. mean + eps carries that error times
 * mean / (mean + eps), which is at most 1 unless eps is negative, and the
 * square root halves it; the factor 1 + 2^-20 covers the second-order
 * terms and this bound's own roundings. Infinite where mean + eps is not
 * positive: the sum's error may decide its sign.
 */
static inline double rms_sum_error(ptrdiff_t n, double sum_squares, double eps)
{
    int depth = 0;
    for (int lanes = RMS_LANES; lanes > 1; lanes /= 2) {
        depth++;
    }
    const double adds = (double)((n + RMS_LANES - 1) / RMS_LANES + depth);
    const double sum_error = adds * 0x1p-53 / (1.0 - adds * 0x1p-53);
    const double mean = sum_squares / (double)n;
    const double mean_plus_eps = mean + eps;
    if (!(mean_plus_eps > 0.0)) {
        return INFINITY;
    }
    return 0.5 * sum_error * (mean / mean_plus_eps) * (1.0 + 0x1p-20);
}

/* Whether the backward's sum(g w x) carries its rounding errors: where x or
   w is float64. Of narrower operands it is a plain sum in double. */
RMS_ALWAYS_INLINE int rms_dot_is_compensated(rms_kind xk, rms_kind wk)
{
    return !(rms_kind_is_float_exact(xk) && rms_kind_is_float_exact(wk));
}

/* Adds x^2 and grad_output * weight * x over [i, i + count), count <=
   RMS_DOT_LANES, into the first RMS_DOT_LANES lanes of each. */
RMS_ALWAYS_INLINE void rms_add_squares_and_dot(rms_kind xk, rms_kind wk, rms_lanes *squares,
                                               rms_lanes *dot, const char *x, ptrdiff_t xs,
                                               const char *grad_output,
                                               ptrdiff_t grad_output_stride, const double *w,
                                               ptrdiff_t i, ptrdiff_t count)
{
    const int compensated_dot = rms_dot_is_compensated(xk, wk);
    RMS_UNROLL
    for (int b = 0; b < RMS_DOT_LANES / RMS_VF_WIDTH; b++) {
        const ptrdiff_t offset = (ptrdiff_t)b * RMS_VF_WIDTH;
        if (offset >= count) {
            break;
        }
        const ptrdiff_t block_count = count - offset < RMS_VF_WIDTH ? count - offset : RMS_VF_WIDTH;
        const ptrdiff_t at = i + offset;
        rms_block xv = rms_load_doubles(xk, rms_element(x, at, xs), xs, block_count);
        rms_block grad_output_v = rms_load_doubles(
            xk, rms_element(grad_output, at, grad_output_stride), grad_output_stride, block_count);
        rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)(w + at), 8, block_count);
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            const int k = b * RMS_VD_PER_VF + h;
            const rms_vd g = rms_vd_mul(grad_output_v.part[h], wv.part[h]);
            rms_accumulate(!rms_kind_is_float_exact(xk), 0, &squares->sum[k], &squares->comp[k],
                           xv.part[h], xv.part[h]);
            rms_accumulate(compensated_dot, 0, &dot->sum[k], &dot->comp[k], g, xv.part[h]);
        }
    }
}

/* inv_rms as inv * 2^exponent, for rows where inv_rms itself would leave
   double's normal range. */
typedef struct {
    rms_dd inv;
    int exponent;
} rms_scaled_inv;

/*
 * inv_rms of a row whose plain sum of squares left the safe range: scale
 * the row by a power of two (exact) so that its largest element is near 1,
 * and sum again; inv is the scaled row's, and the scale is the exponent.
 * This is what keeps float64 rows near 1e160 or 1e-170 exact where a naive
 * square overflows or underflows. Float32 and narrower rows never get
 * here: their squares are exact in double.
 */
static inline rms_scaled_inv rms_inv_rms_scaled(rms_kind xk, ptrdiff_t n, const char *x,
                                                ptrdiff_t xs, double eps, rms_dd unscaled)
{
    rms_scaled_inv result = {{0.0, 0.0}, 0};
    double amax = 0.0;
    for (ptrdiff_t i = 0; i < n; i++) {
        double a = fabs(rms_load_scalar(xk, rms_element(x, i, xs)));
        amax = (a > amax || isnan(a)) && !isnan(amax) ? a : amax; /* NaN sticks */
    }
    if (isnan(amax) || amax == 0.0) {
        result.inv = rms_inv_rms_from_sum(unscaled, (double)n, eps); /* NaN, or 1/sqrt(eps) */
        return result;
    }
    if (isinf(amax)) {
        /* mean(x^2) is inf, so inv_rms is 0 (NaN if eps is NaN or -inf), as in
           torch; the unscaled sum may hold NaN from its error terms instead. */
        rms_dd infinite = {INFINITY + eps, 0.0};
        result.inv = rms_dd_rsqrt(infinite);
        return result;
    }
    int exponent;
    frexp(amax, &exponent);
    if (exponent < -1021) {
        exponent = -1021; /* a subnormal amax: 2^-exponent would overflow */
    }
    double scaled_eps = ldexp(eps, -2 * exponent);
    if (isinf(scaled_eps)) {
        /* eps dwarfs mean(x^2) by more than 2^1000: only eps counts. */
        rms_dd zero = {0.0, 0.0};
        result.inv = rms_inv_rms_from_sum(zero, (double)n, eps);
        return result;
    }
    rms_dd scaled = rms_sum_squares(xk, 0, n, x, xs, 1, ldexp(1.0, -exponent));
    result.inv = rms_inv_rms_from_sum(scaled, (double)n, scaled_eps);
    result.exponent = -exponent;
    return result;
}

/* Whether inv_rms, unscaled, keeps the precision that the vector write
   passes need: a normal double whose low part is normal too, and whose
   products with the row's elements neither overflow nor underflow. A
   positive finite inv only: the others are the same unscaled. */
static inline int rms_scaled_inv_in_range(rms_scaled_inv s)
{
    if (s.exponent == 0 || !(s.inv.hi > 0.0) || isinf(s.inv.hi)) {
        return 1;
    }
    const int binade = ilogb(s.inv.hi) + s.exponent;
    return binade >= -960 && binade <= 960;
}

/* The same inv_rms with inv in [0.5, 1): where eps dominates mean(x^2),
   the scaled row's inv is far from 1, and its powers would overflow or
   underflow. inv positive and finite. */
static inline rms_scaled_inv rms_scaled_inv_normalised(rms_scaled_inv s)
{
    int binade;
    frexp(s.inv.hi, &binade);
    s.inv.hi = ldexp(s.inv.hi, -binade);
    s.inv.lo = ldexp(s.inv.lo, -binade);
    s.exponent += binade;
    return s;
}

static inline rms_dd rms_scaled_inv_value(rms_scaled_inv s)
{
    rms_dd value = {ldexp(s.inv.hi, s.exponent), ldexp(s.inv.lo, s.exponent)};
    return value;
}

/* ---- the forward -------------------------------------------------------- */

/* The blocks of a row, by their first element, whose double write the
   sum's error left undecided: rms_forward_row_exactly writes them again
   from an exact sum, or the whole row where there are more than
   RMS_UNSURE_BLOCKS. */
#define RMS_UNSURE_BLOCKS 8
typedef struct {
    ptrdiff_t at[RMS_UNSURE_BLOCKS];
    int count;
} rms_unsure_blocks;

/* inv_rms in each form that a row's write pass uses, and how far it may be
   from the exact sum's (rms_sum_error). */
typedef struct {
    rms_dd dd;           /* the double path's: hi + lo */
    rms_vf hi, lo;       /* the float path's: hi, inv_rms rounded to float, and the rest */
    rms_vf float_error;  /* the float path's bound on its error, relative to |y| */
    rms_vf below, above; /* float16's fast path's: a little below and above inv_rms */
    int product_error;   /* the fast path's, rms_fast16_product_error */
    double sum_error;    /* rms_sum_error, or 0 where the sum is exact */
    rms_unsure_blocks *unsure; /* the double path's, where sum_error leaves a block undecided */
} rms_inv_forms;

/* How a row's blocks are written: each in double, inlined or out of line
   (rows with a weight offset, which takes offset + weight as hi + lo
   doubles, and rows whose inv_rms is infinite), each in float, or each the
   fast 16-bit way where that is sure to be exact, else in double. */
typedef enum {
    RMS_WRITE_DOUBLE,
    RMS_WRITE_DOUBLE_OUT_OF_LINE,
    RMS_WRITE_FLOAT,
    RMS_WRITE_FAST16
} rms_write_mode;

/* Whether the type has the fast 16-bit write: float16 or bfloat16 x, with
   any weight, which it takes as floats. Every instruction set's kernels
   have it, the portable ones too: it needs plain float products only
   (there, it makes the 16-bit forward two to four times faster than the
   double path). */
RMS_ALWAYS_INLINE int rms_has_fast16(rms_kind xk) { return rms_kind_size(xk) == 2; }

/* How far the fast 16-bit write's product x * w may be from exact, in
   units of 2^-24 relative: 0 where x and w are both 16-bit (11 + 11 or
   8 + 8 significant bits fit a float), 1 where w is a float rounded once
   to nearest (a float32 weight, or offset + weight). */
RMS_ALWAYS_INLINE int rms_fast16_product_error(rms_kind xk, rms_kind wk, int with_offset)
{
    return wk == xk && !with_offset ? 0 : 1;
}

/* The largest float not above v, and the smallest not below: v positive,
   and inside float's normal range. */
static inline float rms_float_at_most(double v)
{
    const float f = (float)v;
    return (double)f > v ? rms_bits_float(rms_float_bits(f) - 1) : f;
}

static inline float rms_float_at_least(double v)
{
    const float f = (float)v;
    return (double)f < v ? rms_bits_float(rms_float_bits(f) + 1) : f;
}

/* The forms of inv_rms, which is within sum_error of the exact sum's
   (relative); unsure is where the double path notes the blocks for which
   that was not enough. */
RMS_ALWAYS_INLINE rms_inv_forms rms_inv_forms_of(rms_kind xk, rms_kind wk, int with_offset,
                                                 rms_dd inv_rms, double sum_error,
                                                 rms_unsure_blocks *unsure,
                                                 rms_write_mode mode)
{
    rms_inv_forms forms;
    forms.product_error = rms_fast16_product_error(xk, wk, with_offset);
    forms.dd = inv_rms;
    forms.sum_error = sum_error;
    forms.unsure = unsure;
    const float hi = (float)inv_rms.hi;
    forms.hi = rms_vf_set(hi);
    forms.lo = rms_vf_set((float)((inv_rms.hi - (double)hi) + inv_rms.lo));
    /* rms_forward_block_float says why 2^-44; twice sum_error outweighs the
       rounding of the sum to float */
    forms.float_error = rms_vf_set((float)(0x1p-44 + 2.0 * sum_error));
    /* rms_forward_block_fast16 says why this margin */
    const double margin = 0x1p-23 * (1 + forms.product_error) + 2.0 * sum_error;
    const int fast = mode == RMS_WRITE_FAST16;
    forms.below = rms_vf_set(fast ? rms_float_at_most(inv_rms.hi * (1.0 - margin)) : 0.0f);
    forms.above = rms_vf_set(fast ? rms_float_at_least(inv_rms.hi * (1.0 + margin)) : 0.0f);
    return forms;
}

/*
 * y = x * inv_rms * weight for one block of float32, rounded once; returns 0,
 * having written nothing, where it cannot be sure of that, and the caller
 * writes the block in double.
 *
 * Converting every element to double and back costs more than the
 * arithmetic, so where fused multiply-adds exist the block is worked in
 * float, with inv_rms split into two floats hi + lo (rms_write_mode_of says
 * for which rows): u = x * inv_rms as u_hi + u_lo, and S = u_hi * w + u_lo *
 * w with one rounding. S is not exact: lo, u_lo and u_lo * w are each
 * rounded once in float, which puts S within 3 * 2^-48 |y| of x * w *
 * inv_rms, plus 2^-149 (1 + |w|) where a term is subnormal; inv_rms is
 * within sum_error of the exact sum's. So S - e and S + e, with e = (2^-44 +
 * 2 sum_error) |u_hi w| + 2^-126 (1 + |w|), bracket the exact y, and
 * rounding to nearest is monotone: where both round to the same float, so
 * does y, and that float is written. They differ within e of a midpoint
 * (about 1 lane in 2^19 of ordinary data, every lane of results below
 * about 2^-100), and where a lane is infinite or NaN (an infinite weight,
 * an overflow).
 *
 * Where x or w is 0, e is 0 and S - e keeps the zero's sign: written
 * below, y = 0 carries sign(x) * sign(w), as x * inv_rms * w does in torch.
 */
RMS_ALWAYS_INLINE int rms_forward_block_float(rms_kind xk, rms_kind wk, const char *x,
                                              ptrdiff_t xs, const char *w, ptrdiff_t ws, char *y,
                                              ptrdiff_t ys, ptrdiff_t count,
                                              const rms_inv_forms *inv, int stream)
{
    const rms_vf xv = rms_load_floats(xk, x, xs, count);
    const rms_vf wv = rms_load_floats(wk, w, ws, count);
    const rms_vf u_hi = rms_vf_mul(xv, inv->hi);
    const rms_vf u_lo = rms_vf_fma(xv, inv->lo, rms_vf_product_error(xv, inv->hi, u_hi));
    const rms_vf low = rms_vf_mul(u_lo, wv);
    const rms_vf subnormal_error = rms_vf_where_both_nonzero(
        rms_vf_fma(rms_vf_abs(wv), rms_vf_set(0x1p-126f), rms_vf_set(0x1p-126f)), xv, wv);
    const rms_vf e = rms_vf_fma(rms_vf_abs(rms_vf_mul(u_hi, wv)), inv->float_error,
                                subnormal_error);
    /* -(e - low), not low - e: -0 where both are 0 */
    const rms_vf below = rms_vf_fma(u_hi, wv, rms_vf_sub(rms_vf_set(-0.0f), rms_vf_sub(e, low)));
    const rms_vf above = rms_vf_fma(u_hi, wv, rms_vf_add(low, e));
    if (!rms_vf_equal(below, above)) {
        return 0;
    }
    rms_store_floats(xk, y, ys, count, below, stream);
    return 1;
}

/* Whether every lane of v, moved by margin (relative) either way, rounds
   to the same value of kind, a 32- or 16-bit kind: then so does every
   value in between, since rounding to nearest is monotone. Alike means the
   same bits: a NaN is alike itself. */
RMS_ALWAYS_INLINE int rms_rounds_alike(rms_kind kind, const rms_block *v, double margin)
{
    rms_vd down[RMS_VD_PER_VF], up[RMS_VD_PER_VF];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        down[h] = rms_vd_mul(v->part[h], rms_vd_set(1.0 - margin));
        up[h] = rms_vd_mul(v->part[h], rms_vd_set(1.0 + margin));
    }
    if (kind == RMS_KIND_F32) {
        return rms_vf_same(rms_vf_narrow(down), rms_vf_narrow(up));
    }
    return rms_vh_equal(rms_vf_narrow16(kind, rms_vf_narrow_round_to_odd(down)),
                        rms_vf_narrow16(kind, rms_vf_narrow_round_to_odd(up)));
}

/* The same in double, for every type: exact products where x and w are
   floats, and a compensated product where either is a double: for a
   float64 y, u_hi * w + low in one fused multiply-add where there is one;
   otherwise hi + err with the product's exact error, rounded once from
   there.
   That rounds x * w * inv_rms once. Where inv_rms is within sum_error of
   the exact sum's, not exact, the block's rounding is checked against
   that: where y moved by sum_error, and by 2^-50 for hi's own error and
   the check's roundings, may round otherwise, the block is written as it
   is and 0 returned, for it to be written again from an exact sum
   (rms_forward_row_exactly); else 1.
   w_lo, where not NULL, holds the part of the weight that w (doubles)
   leaves out: offset + weight is w + w_lo exactly. */
RMS_ALWAYS_INLINE int rms_forward_block_double(rms_kind xk, rms_kind wk, const char *x,
                                               ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                               const double *w_lo, char *y, ptrdiff_t ys,
                                               ptrdiff_t count, rms_dd inv_rms, double sum_error,
                                               int stream)
{
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(wk, w, ws, count);
    rms_block w_lo_v;
    if (w_lo != NULL) {
        w_lo_v = rms_load_doubles(RMS_KIND_F64, (const char *)w_lo, 8, count);
    }
    const rms_vd inv_hi = rms_vd_set(inv_rms.hi), inv_lo = rms_vd_set(inv_rms.lo);
    rms_block hi, err;
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd xh = xv.part[h], wh = wv.part[h];
        if (rms_kind_is_float_exact(xk) && rms_kind_is_float_exact(wk) && w_lo == NULL) {
            const rms_vd xw = rms_vd_mul(xh, wh); /* exact */
            const rms_vd p = rms_vd_mul(xw, inv_hi);
            const rms_vd tail = rms_vd_zero_where_inf(
                rms_vd_muladd(xw, inv_lo, rms_vd_product_error(xw, inv_hi, p)), wh);
            /* tail may pass half an ulp of p: renormalised, as round to odd
               needs, by a fast two-sum that keeps p's sign where both are
               zeros */
            hi.part[h] = rms_vd_sub(p, rms_vd_sub(rms_vd_set(0.0), tail));
            err.part[h] = rms_vd_zero_where_inf(
                rms_vd_sub(tail, rms_vd_sub(hi.part[h], p)), hi.part[h]);
            continue;
        }
        const rms_vd u_hi = rms_vd_mul(xh, inv_hi);
        const rms_vd u_lo =
            rms_vd_add(rms_vd_product_error(xh, inv_hi, u_hi), rms_vd_mul(xh, inv_lo));
        const rms_vd low = rms_vd_zero_where_inf(
            w_lo != NULL ? rms_vd_muladd(u_hi, w_lo_v.part[h], rms_vd_mul(u_lo, wh))
                         : rms_vd_mul(u_lo, wh),
            wh);
        if (xk == RMS_KIND_F64 && RMS_HAVE_FMA) {
            /* The output's one rounding. low's zeros go in as -0, which
               adds nothing: a +0 would turn the product's -0 (x = -1,
               w = 0) into +0, where torch keeps -0. */
            const rms_vd low_or_minus_zero =
                rms_vd_sub(rms_vd_set(-0.0), rms_vd_sub(rms_vd_set(0.0), low));
            hi.part[h] = rms_vd_muladd(u_hi, wh, low_or_minus_zero);
            err.part[h] = rms_vd_set(0.0);
            continue;
        }
        const rms_vd p = rms_vd_mul(u_hi, wh);
        const rms_vd tail =
            rms_vd_add(rms_vd_zero_where_inf(rms_vd_product_error(u_hi, wh, p), wh), low);
        /* p - (0 - tail) is p + tail, but keeps p's sign where both
           are zeros (x = 0 with a negative w gives -0, as in torch) */
        hi.part[h] = rms_vd_sub(p, rms_vd_sub(rms_vd_set(0.0), tail));
        err.part[h] = rms_vd_sub(tail, rms_vd_sub(hi.part[h], p));
    }
    const int sure = !rms_squares_are_plain(xk) || sum_error == 0.0 ||
                     rms_rounds_alike(xk, &hi, sum_error + 0x1p-50);
    rms_store_rounded(xk, y, ys, count, &hi, &err, stream);
    return sure;
}

/* y = x * w * inv_rms for a block of a row whose inv_rms is infinite
   (mean(x^2) + eps is exactly 0, eps negative, or an all-subnormal float64
   row with eps = 0, whose 1 / rms passes DBL_MAX): inf of the sign of x * w,
   or NaN where x or w is 0, as torch has it; nothing to round. With a
   weight offset, w is its hi part, which has the exact sum's sign. */
RMS_ALWAYS_INLINE void rms_forward_block_unbounded(rms_kind xk, rms_kind wk, const char *x,
                                                   ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                                   char *y, ptrdiff_t ys, ptrdiff_t count,
                                                   double inv_rms, int stream)
{
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(wk, w, ws, count);
    rms_block out;
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        /* torch's order: (x * inv_rms) * w, where x * w may underflow to 0 */
        out.part[h] = rms_vd_mul(rms_vd_mul(xv.part[h], rms_vd_set(inv_rms)), wv.part[h]);
    }
    rms_store_narrowed(xk, y, ys, count, &out, stream);
}

/* rms_forward_block_double out of line: one copy for each pair of kinds,
   for the blocks that take it rarely (a fast write's unsure ones) or off
   the beaten path (a weight offset's). The write loops then inline only
   their common case: inlined everywhere, it tripled the kernels' compile
   time. (One copy for all kinds, switching on them at run time, made the
   unsure blocks a twentieth of the 16-bit forward.) */
typedef int (*rms_block_double_fn)(const char *x, ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                   const double *w_lo, char *y, ptrdiff_t ys, ptrdiff_t count,
                                   rms_dd inv_rms, double sum_error, int stream);
#define RMS_BLOCK_DOUBLE_OF(x_kind, w_kind)                                                    \
    RMS_NOINLINE int rms_forward_block_double_##x_kind##_##w_kind(                             \
        const char *x, ptrdiff_t xs, const char *w, ptrdiff_t ws, const double *w_lo, char *y, \
        ptrdiff_t ys, ptrdiff_t count, rms_dd inv_rms, double sum_error, int stream)           \
    {                                                                                          \
        if (isinf(inv_rms.hi)) {                                                               \
            rms_forward_block_unbounded(RMS_KIND_##x_kind, RMS_KIND_##w_kind, x, xs, w, ws, y, \
                                        ys, count, inv_rms.hi, stream);                        \
            return 1;                                                                          \
        }                                                                                      \
        return rms_forward_block_double(RMS_KIND_##x_kind, RMS_KIND_##w_kind, x, xs, w, ws,    \
                                        w_lo, y, ys, count, inv_rms, sum_error, stream);       \
    }
#define RMS_BLOCK_DOUBLE_FOR_X(x_kind)                                                         \
    RMS_BLOCK_DOUBLE_OF(x_kind, F32)                                                           \
    RMS_BLOCK_DOUBLE_OF(x_kind, F64) RMS_BLOCK_DOUBLE_OF(x_kind, F16)                          \
    RMS_BLOCK_DOUBLE_OF(x_kind, BF16)
RMS_BLOCK_DOUBLE_FOR_X(F32)
RMS_BLOCK_DOUBLE_FOR_X(F64)
RMS_BLOCK_DOUBLE_FOR_X(F16)
RMS_BLOCK_DOUBLE_FOR_X(BF16)
#define RMS_BLOCK_DOUBLE_ROW(x_kind)                                                           \
    [RMS_KIND_##x_kind] = {                                                                    \
        [RMS_KIND_F32] = rms_forward_block_double_##x_kind##_F32,                              \
        [RMS_KIND_F64] = rms_forward_block_double_##x_kind##_F64,                              \
        [RMS_KIND_F16] = rms_forward_block_double_##x_kind##_F16,                              \
        [RMS_KIND_BF16] = rms_forward_block_double_##x_kind##_BF16,                            \
    },
/* By x's kind, then the weight's (types.h has four); indexed by constants,
   a direct call. */
static const rms_block_double_fn rms_forward_block_double_out_of_line[4][4] = {
    RMS_BLOCK_DOUBLE_ROW(F32) RMS_BLOCK_DOUBLE_ROW(F64) RMS_BLOCK_DOUBLE_ROW(F16)
        RMS_BLOCK_DOUBLE_ROW(BF16)};
#undef RMS_BLOCK_DOUBLE_ROW
#undef RMS_BLOCK_DOUBLE_FOR_X
#undef RMS_BLOCK_DOUBLE_OF

/*
 * y for one block of 16-bit x, the cheap way, where that is sure to round
 * as the exact y = x * w * inv_rms does (inv_rms the double-double hi +
 * lo); returns 0, having written nothing, where it is not sure, and the
 * caller writes the block in double. That is rare, about 1 lane in 2000
 * for float16 and 1 in 13000 for bfloat16 (a little more with a float32
 * weight): a lane within a few float ulps of a 16-bit rounding boundary, or
 * a bfloat16 product that is not a normal float. The float path, which
 * carries the product to twice float's precision and rounds it to odd,
 * costs three times the arithmetic.
 *
 * p = x * w is exact in float where w is 16-bit (11 + 11 or 8 + 8
 * significant bits), and within 2^-24 of x * w with a float32 weight or an
 * offset (w is then offset + weight rounded once to float), as
 * long as it is a normal float: a product of two float16 values always is,
 * other float16 ones need not be (below), bfloat16 ones are checked. From
 * it come two floats lo and hi with |lo| <= |y| <= |hi|, each rounded to 16
 * bits by a rounding that is monotone and goes no further than y's rounding
 * to nearest even would (down from lo, up from hi): where the two agree, y
 * rounds to the same 16 bits.
 *
 * float16: lo = p * below and hi = p * above, rounded to nearest, with below
 * <= inv_rms.hi (1 - m) and above >= inv_rms.hi (1 + m), m = 2^-23, or 2^-22
 * with a float32 weight. The margin outweighs the products' roundings
 * (2^-24 each) and inv_rms.lo (under 2^-50 inv_rms.hi), so |lo| < |y| < |hi|
 * where p is a normal float. Where it is not, |y| < 2^-26 (inv_rms is at
 * most 2^100 here): all three round to 0, or, past float's range, to inf.
 * Both are rounded to nearest even. Where inv_rms is within sum_error of
 * the exact sum's (rms_sum_error), m grows by twice that.
 *
 * bfloat16: one product, t = p * hi (inv_rms rounded to float). t is within
 * 1/2 ulp of p * hi, which is within 2^-24 (1 + 2^-26) |y| of y, one more
 * 2^-24 |y| with a float32 weight: 1.5 ulps and a hair (2.5), under 2 (3)
 * ulps of the smaller binade where t and y straddle a power of 2, and under
 * 1 ulp in float's subnormal range. So the floats k = 2 (3) below and above
 * t in bit pattern bracket y, and adding 0x7fff - k and 0x8000 + k to t's
 * bits rounds them to bfloat16 half down and half up, an add each (where
 * the magnitude's pattern is below k, to 0 by itself). Their half ulp of
 * slack, 2^-25 |y| at least, covers a sum_error up to RMS_SUM_ERROR_LIMIT.
 */
RMS_ALWAYS_INLINE int rms_forward_block_fast16(rms_kind xk, const char *x,
                                               ptrdiff_t xs, const float *w, char *y,
                                               ptrdiff_t ys, ptrdiff_t count,
                                               const rms_inv_forms *inv, int stream)
{
    const rms_vf xv = rms_load_floats(xk, x, xs, count);
    const rms_vf wv = rms_load_floats(RMS_KIND_F32, (const char *)w, 4, count);
    const rms_vf p = rms_vf_mul(xv, wv);
    rms_vh hi;
    int unsure;
    if (xk == RMS_KIND_F16) {
        hi = rms_vf_to_float16(rms_vf_mul(p, inv->above));
        unsure = !rms_vh_equal(rms_vf_to_float16(rms_vf_mul(p, inv->below)), hi);
    }
    else {
        const int k = 2 + inv->product_error;
        const rms_vf t = rms_vf_mul(p, inv->hi);
        hi = rms_vf_top16_biased(t, 0x8000 + k);
        /* | not ||: one branch on both tests */
        unsure = (!rms_vf_top16_agree(t, 0x7fff - k, 0x8000 + k)) | rms_vf_any_abnormal(p);
    }
    if (unsure) {
        return 0;
    }
    rms_store_halves(y, ys, count, hi, stream);
    return 1;
}

/* Asks for the bytes [p, p + bytes) to be brought into cache, without
   waiting for them. A streamed write pass works from cache and leaves the
   memory bus idle; asking for the next row meanwhile lets that row's
   reduction pass find it in cache. Under AddressSanitizer, which does not
   check prefetches, each line's first byte is read instead, so that the
   sanitizer build checks every address asked for. */
#if defined(__SANITIZE_ADDRESS__)
#define RMS_CHECK_PREFETCH 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RMS_CHECK_PREFETCH 1
#endif
#endif
static inline void rms_prefetch(const char *p, ptrdiff_t bytes)
{
    for (ptrdiff_t b = 0; b < bytes; b += 64) {
#if defined(RMS_CHECK_PREFETCH)
        (void)*(const volatile char *)(p + b);
#elif defined(__GNUC__)
        /* locality 2: not into L1, which holds the row at work, where the
           CPU honours the hint (prefetcht1) */
        __builtin_prefetch(p + b, 0, 2);
#else
        (void)p;
#endif
    }
}

/* How many elements of a row to write a block at a time before out
   reaches a vector's alignment: none for a strided row, or for one whose
   elements can never get there. NumPy aligns its buffers to 16 bytes only,
   and vector stores that straddle two cache lines cost a fifth of the
   float32 forward in cache. */
RMS_ALWAYS_INLINE ptrdiff_t rms_unaligned_head(const char *out, ptrdiff_t stride, ptrdiff_t size,
                                               ptrdiff_t n)
{
    size_t misalignment = (size_t)((uintptr_t)out % RMS_VECTOR_BYTES);
    if (stride != size || misalignment == 0 || misalignment % (size_t)size != 0) {
        return 0;
    }
    ptrdiff_t head = (ptrdiff_t)((RMS_VECTOR_BYTES - misalignment) / (size_t)size);
    return head < n ? head : n;
}

/* Whether whole blocks from out on can be streamed. */
RMS_ALWAYS_INLINE int rms_can_stream(int stream, const char *out, ptrdiff_t stride, ptrdiff_t size)
{
    return RMS_HAVE_STREAM && stream && stride == size &&
           (uintptr_t)out % RMS_VECTOR_BYTES == 0;
}

/* The weight as a row's write pass reads it: as stored, or with an offset
   as doubles hi + lo, offset + weight exactly; and as floats for the fast
   16-bit write. */
typedef struct {
    const char *data; /* as stored */
    ptrdiff_t stride;
    const double *hi, *lo; /* with an offset; else NULL */
    const float *floats;   /* NULL where the fast 16-bit write is not to be used */
} rms_row_weight;

/* Whether a write mode is a fast path, which may be unsure of a block and
   leave it to the double write. */
RMS_ALWAYS_INLINE int rms_mode_is_fast(rms_write_mode mode)
{
    return mode == RMS_WRITE_FAST16 || mode == RMS_WRITE_FLOAT;
}

/* Whether a write mode's unsure blocks can wait for the end of the step. */
RMS_ALWAYS_INLINE int rms_mode_may_defer(rms_write_mode mode)
{
    return mode == RMS_WRITE_FAST16;
}

/* One block of the forward, the way mode says. Returns 0, having written
   nothing, where the fast path was unsure of it and defer is set: the
   caller then writes it later, in double (rms_forward_write_loop). */
RMS_ALWAYS_INLINE int rms_forward_block(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                        const char *x, ptrdiff_t xs, const rms_row_weight *w,
                                        ptrdiff_t at, char *y, ptrdiff_t ys, ptrdiff_t count,
                                        const rms_inv_forms *inv, int stream, int defer)
{
    const char *w_at = rms_element(w->data, at, w->stride);
    if (mode == RMS_WRITE_FAST16 &&
        rms_forward_block_fast16(xk, x, xs, w->floats + at, y, ys, count, inv, stream)) {
        return 1;
    }
    if (mode == RMS_WRITE_FLOAT &&
        rms_forward_block_float(xk, wk, x, xs, w_at, w->stride, y, ys, count, inv, stream)) {
        return 1;
    }
    if (defer && rms_mode_may_defer(mode)) {
        return 0;
    }
    /* The plain double write inlines its blocks, and its loop has no call:
       a call costs a loop every vector register that lives across it. */
    int sure;
    if (mode == RMS_WRITE_DOUBLE) {
        /* a row written in double has an exact sum (rms_forward_row) */
        sure = rms_forward_block_double(xk, wk, x, xs, w_at, w->stride, NULL, y, ys, count,
                                        inv->dd, 0.0, stream);
    }
    else if (mode != RMS_WRITE_FLOAT && w->lo != NULL) { /* float rows have no offset */
        sure = rms_forward_block_double_out_of_line[xk][RMS_KIND_F64](
            x, xs, (const char *)(w->hi + at), 8, w->lo + at, y, ys, count, inv->dd,
            inv->sum_error, stream);
    }
    else {
        sure = rms_forward_block_double_out_of_line[xk][wk](
            x, xs, w_at, w->stride, NULL, y, ys, count, inv->dd, inv->sum_error, stream);
    }
    if (!sure) {
        rms_unsure_blocks *unsure = inv->unsure;
        if (unsure->count < RMS_UNSURE_BLOCKS) {
            unsure->at[unsure->count] = at;
        }
        unsure->count++;
    }
    return 1;
}

/*
 * A row's values as its reduction pass makes them: x itself, or, with a
 * residual, x + residual, written to sum as the pass goes, or, where
 * remade, by the write pass (rms_remakes_sums). x is NULL for no row, the
 * last row's next, with the strides kept as they are: a NULL pointer to
 * the struct instead, or strides that differ, would cost the compiler
 * their constancy. ahead_x and ahead_residual are the row after this one,
 * for a streamed write pass to ask for while it reduces this one, or NULL.
 */
typedef struct {
    const char *x;
    const char *residual; /* with_residual only */
    char *sum;
    ptrdiff_t x_stride, residual_stride, sum_stride;
    const char *ahead_x, *ahead_residual;
    int remade;
} rms_row_source;

/* sum = x + residual for one block, rounded once to x's kind as NumPy's
   and torch's own add round it; written to sum unless that is NULL, and
   returned as doubles. 16-bit kinds add in float: the float sum is exact
   unless one addend is below 2^-13 of the other, too small to move the sum
   to a 16-bit midpoint, so its rounding to 16 bits is the exact sum's. */
RMS_ALWAYS_INLINE rms_block rms_make_sum(rms_kind xk, const char *x, ptrdiff_t xs, const char *r,
                                         ptrdiff_t rs, char *sum, ptrdiff_t sum_stride,
                                         ptrdiff_t count)
{
    rms_block sv;
    if (xk == RMS_KIND_F64) {
        const rms_block xv = rms_load_doubles(xk, x, xs, count);
        const rms_block rv = rms_load_doubles(xk, r, rs, count);
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            sv.part[h] = rms_vd_add(xv.part[h], rv.part[h]);
        }
        if (sum != NULL) {
            rms_store_doubles(sum, sum_stride, count, &sv, 0);
        }
        return sv;
    }
    /* 16-bit sums narrowed once, then stored and widened back */
    rms_vf rounded = rms_vf_add(rms_load_floats(xk, x, xs, count),
                                rms_load_floats(xk, r, rs, count));
    if (xk == RMS_KIND_F32) {
        if (sum != NULL) {
            rms_store_floats(xk, sum, sum_stride, count, rounded, 0);
        }
    }
    else {
        const rms_vh narrowed = rms_vf_narrow16(xk, rounded);
        if (sum != NULL) {
            rms_store_halves(sum, sum_stride, count, narrowed, 0);
        }
        rounded = rms_vh_widen(xk, narrowed);
    }
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        sv.part[h] = rms_vd_widen(rounded, h);
    }
    return sv;
}

/* The reduction pass over [i, i + count), count <= RMS_LANES, of a row
   with a residual: its sums, written to src->sum unless the write pass
   writes them (src->remade), and their squares into lanes. The squares are
   taken from the registers that hold the sums, not read back from
   src->sum: a load right after a store of another width waits for the
   store to reach the cache (the fused float32 forward took three times as
   long as the plain one on an AMD Zen 5). */
RMS_ALWAYS_INLINE void rms_add_residual_squares(rms_kind xk, rms_lanes *lanes,
                                                const rms_row_source *src, ptrdiff_t i,
                                                ptrdiff_t count)
{
    RMS_UNROLL
    for (int b = 0; b < RMS_LANES / RMS_VF_WIDTH; b++) {
        const ptrdiff_t offset = (ptrdiff_t)b * RMS_VF_WIDTH;
        if (offset >= count) {
            break;
        }
        const ptrdiff_t block_count = count - offset < RMS_VF_WIDTH ? count - offset : RMS_VF_WIDTH;
        const ptrdiff_t at = i + offset;
        const rms_block sv = rms_make_sum(
            xk, rms_element(src->x, at, src->x_stride), src->x_stride,
            rms_element(src->residual, at, src->residual_stride), src->residual_stride,
            src->remade ? NULL : rms_element_out(src->sum, at, src->sum_stride), src->sum_stride,
            block_count);
        rms_add_block_squares(xk, 0, lanes, b, &sv, 0, 1.0);
    }
}

/* The reduction pass over [i, i + count), count <= RMS_LANES: the squares
   of the row's values into lanes, making them first where they are a sum. */
RMS_ALWAYS_INLINE void rms_reduce_lanes(rms_kind xk, int with_residual, rms_lanes *lanes,
                                        const rms_row_source *src, ptrdiff_t i, ptrdiff_t count)
{
    if (with_residual) {
        rms_add_residual_squares(xk, lanes, src, i, count);
    }
    else {
        rms_add_squares(xk, 0, lanes, src->x, src->x_stride, i, count, 0, 1.0);
    }
}

/* The reduction pass from element done (a multiple of RMS_LANES, the part
   already in lanes) to the row's end: its sum of squares. */
RMS_ALWAYS_INLINE rms_dd rms_reduce_row(rms_kind xk, int with_residual, rms_lanes *lanes,
                                        ptrdiff_t done, ptrdiff_t n, const rms_row_source *src)
{
    ptrdiff_t i = done;
    for (; i + RMS_LANES <= n; i += RMS_LANES) {
        rms_reduce_lanes(xk, with_residual, lanes, src, i, RMS_LANES); /* a constant count */
    }
    if (i < n) {
        rms_reduce_lanes(xk, with_residual, lanes, src, i, n - i);
    }
    return rms_lanes_total(lanes, RMS_LANES, !rms_kind_is_float_exact(xk));
}

/* One block of a row's write pass: from the row's values as they are in
   memory, or, where the write pass makes the sums (row->remade), from the
   block's sums, made again and written to row->sum (streamed where
   sum_stream says). rms_forward_block reads its values through a pointer:
   here, a block on the stack, whose store and load stay in L1. */
RMS_ALWAYS_INLINE int rms_forward_block_of_row(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                               int with_residual, const rms_row_source *row,
                                               const rms_row_weight *w, ptrdiff_t at, char *y,
                                               ptrdiff_t ys, ptrdiff_t count,
                                               const rms_inv_forms *inv, int stream,
                                               int sum_stream, int defer)
{
    if (with_residual && row->remade) {
        const ptrdiff_t size = rms_kind_size(xk);
        _Alignas(RMS_VECTOR_BYTES) char made[RMS_VF_WIDTH * 8];
        (void)rms_make_sum(xk, rms_element(row->x, at, row->x_stride), row->x_stride,
                           rms_element(row->residual, at, row->residual_stride),
                           row->residual_stride, made, size, count);
        char *sum = rms_element_out(row->sum, at, row->sum_stride);
        if (xk == RMS_KIND_F64) {
            const rms_block h = rms_load_doubles(xk, made, size, count);
            rms_store_doubles(sum, row->sum_stride, count, &h, sum_stream);
        }
        else {
            rms_store_floats(xk, sum, row->sum_stride, count,
                             rms_load_floats(xk, made, size, count), sum_stream);
        }
        return rms_forward_block(xk, wk, mode, made, size, w, at, rms_element_out(y, at, ys), ys,
                                 count, inv, stream, defer);
    }
    const char *values = with_residual ? row->sum : row->x;
    const ptrdiff_t vs = with_residual ? row->sum_stride : row->x_stride;
    return rms_forward_block(xk, wk, mode, rms_element(values, at, vs), vs, w, at,
                             rms_element_out(y, at, ys), ys, count, inv, stream, defer);
}

/* The blocks of a row's write loop that the fast 16-bit path was unsure
   of, to be written in double once the loop has stopped: a call inside the
   loop, even on a path it rarely takes, made the compiler keep the loop's
   state in memory and spill its registers there (the bfloat16 forward took
   a seventh longer in cache). */
#define RMS_DEFERRED_BLOCKS 32
typedef struct {
    ptrdiff_t at[RMS_DEFERRED_BLOCKS];
    int count;
} rms_deferred;

/* Writes the deferred blocks in double, from the row's values in memory:
   x, or the sums, which the write pass has written where it makes them
   (so they are read, not made again: a copy of the row not remade). Their
   y is unwritten, so in place, x is still there. */
RMS_ALWAYS_INLINE void rms_write_deferred(rms_kind xk, rms_kind wk, int with_residual,
                                          const rms_row_source *row, const rms_row_weight *w,
                                          char *y, ptrdiff_t ys, const rms_inv_forms *inv,
                                          int stream, rms_deferred *deferred)
{
    rms_row_source written = *row;
    written.remade = 0;
    for (int k = 0; k < deferred->count; k++) {
        (void)rms_forward_block_of_row(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE, with_residual,
                                       &written, w, deferred->at[k], y, ys, RMS_VF_WIDTH, inv,
                                       stream, 0, 0);
    }
    deferred->count = 0;
}

/* The whole steps of RMS_LANES elements of rms_forward_write_loop, from
   element i on: until the row has no whole step left, or deferred holds
   more than limit blocks. Returns where it stopped. */
RMS_ALWAYS_INLINE ptrdiff_t rms_forward_write_steps(
    rms_kind xk, rms_kind wk, rms_write_mode mode, int with_residual, ptrdiff_t n,
    const rms_row_source *row, const rms_row_weight *w, char *y, ptrdiff_t ys, ptrdiff_t i,
    int streamed, int sum_streamed, const rms_inv_forms *inv, const rms_row_source *next,
    int reduce, rms_lanes *next_lanes, ptrdiff_t *next_done, rms_deferred *deferred, int limit)
{
    for (; i + RMS_LANES <= n && deferred->count <= limit; i += RMS_LANES) {
        if (reduce) {
            if (next->ahead_x != NULL) {
                rms_prefetch(rms_element(next->ahead_x, *next_done, next->x_stride),
                             RMS_LANES * next->x_stride);
                if (with_residual) {
                    rms_prefetch(
                        rms_element(next->ahead_residual, *next_done, next->residual_stride),
                        RMS_LANES * next->residual_stride);
                }
            }
            rms_reduce_lanes(xk, with_residual, next_lanes, next, *next_done, RMS_LANES);
            *next_done += RMS_LANES;
        }
        else if (next->x != NULL) {
            rms_prefetch(rms_element(next->x, i, next->x_stride), RMS_LANES * next->x_stride);
            if (with_residual) {
                rms_prefetch(rms_element(next->residual, i, next->residual_stride),
                             RMS_LANES * next->residual_stride);
            }
        }
        for (ptrdiff_t b = 0; b < RMS_LANES; b += RMS_VF_WIDTH) {
            const ptrdiff_t at = i + b;
            if (!rms_forward_block_of_row(xk, wk, mode, with_residual, row, w, at, y, ys,
                                          RMS_VF_WIDTH, inv, streamed, sum_streamed,
                                          rms_mode_may_defer(mode))) {
                deferred->at[deferred->count++] = at;
            }
        }
    }
    return i;
}

/* The write loop of rms_forward_write. reduce, a constant at each call,
   says whether it also runs the next row's reduction pass into next_lanes:
   decided inside the loop, the choice left the compiler keeping those sums
   in memory, loaded and stored at every step (a tenth of the in-cache
   16-bit forward). The unaligned head and the tail write their blocks at
   once, unsure or not; the whole steps defer theirs (rms_deferred). A
   streamed row writes its deferred blocks as soon as their step ends,
   streamed too. Written at the row's end with plain stores, each cost a
   read of its line from memory (the float16 forward from memory took a
   fifth longer); streamed at the row's end, they cost the same as here. */
RMS_ALWAYS_INLINE void rms_forward_write_loop(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                              int with_residual, ptrdiff_t n,
                                              const rms_row_source *row,
                                              const rms_row_weight *w, char *y,
                                              ptrdiff_t ys, ptrdiff_t head, int streamed,
                                              int sum_streamed,
                                              const rms_inv_forms *inv, const rms_row_source *next,
                                              int reduce, rms_lanes *next_lanes,
                                              ptrdiff_t *next_done)
{
    ptrdiff_t i = 0;
    for (; i < head; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = head - i < RMS_VF_WIDTH ? head - i : RMS_VF_WIDTH;
        (void)rms_forward_block_of_row(xk, wk, mode, with_residual, row, w, i, y, ys, count, inv,
                                       0, 0, 0);
    }
    rms_deferred deferred;
    deferred.count = 0;
    const int limit = streamed ? 0 : RMS_DEFERRED_BLOCKS - RMS_LANES / RMS_VF_WIDTH;
    for (i = head; i + RMS_LANES <= n;) {
        i = rms_forward_write_steps(xk, wk, mode, with_residual, n, row, w, y, ys, i, streamed,
                                    sum_streamed, inv, next, reduce, next_lanes, next_done,
                                    &deferred, limit);
        rms_write_deferred(xk, wk, with_residual, row, w, y, ys, inv, streamed, &deferred);
    }
    for (; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        (void)rms_forward_block_of_row(xk, wk, mode, with_residual, row, w, i, y, ys, count, inv,
                                       0, 0, 0);
    }
}

/*
 * Writes y for one row, given its inv_rms (within sum_error of the exact
 * sum's; the blocks that left undecided noted in unsure), and returns the
 * sum of squares of next, where that is a row (0 where it is not). The
 * same loop runs the
 * next row's reduction pass: it is bound by arithmetic and the write by
 * loads and stores, and one loop doing both lets the core overlap them.
 * Where the output is streamed, rows come from memory: the loop asks for
 * the row after next too, so that the bus brings it in while the core
 * works, and next's reduction finds it in cache. Where next has no row
 * after it in the chunk, the loop asks for next itself and reduces it
 * afterwards. (Asking for next only, and always reducing it afterwards,
 * left the bus idle during the reductions: the float64 forward at
 * 2048x4096 took a tenth longer.)
 */
RMS_ALWAYS_INLINE rms_dd rms_forward_write(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                           int with_residual, ptrdiff_t n,
                                           const rms_row_source *row, const rms_row_weight *w,
                                           char *y, ptrdiff_t ys, int stream, rms_dd inv_rms,
                                           double sum_error, rms_unsure_blocks *unsure,
                                           const rms_row_source *next)
{
    const rms_inv_forms inv =
        rms_inv_forms_of(xk, wk, w->lo != NULL, inv_rms, sum_error, unsure, mode);
    const ptrdiff_t size = rms_kind_size(xk);
    const ptrdiff_t head = rms_unaligned_head(y, ys, size, n);
    const int streamed = rms_can_stream(stream, rms_element_out(y, head, ys), ys, size);
    const int sum_streamed =
        with_residual && row->remade &&
        rms_can_stream(stream, rms_element_out(row->sum, head, row->sum_stride), row->sum_stride,
                       size);
    rms_lanes next_lanes;
    rms_lanes_clear(&next_lanes);
    ptrdiff_t next_done = 0;
    if (next->x != NULL && (!streamed || next->ahead_x != NULL)) {
        rms_forward_write_loop(xk, wk, mode, with_residual, n, row, w, y, ys, head, streamed,
                               sum_streamed, &inv, next, 1, &next_lanes, &next_done);
    }
    else {
        rms_forward_write_loop(xk, wk, mode, with_residual, n, row, w, y, ys, head, streamed,
                               sum_streamed, &inv, next, 0, &next_lanes, &next_done);
    }
    if (next->x == NULL) {
        rms_dd none = {0.0, 0.0};
        return none;
    }
    return rms_reduce_row(xk, with_residual, &next_lanes, next_done, n, next);
}

/*
 * y for a float64 row whose inv_rms leaves double's normal range (its
 * largest element past about 2^1000 or below 2^-1000, with eps too small
 * to matter): one element at a time, since such rows are rare. With
 * inv_rms = inv * 2^k, y = x * w * inv is formed from the significands of
 * x and w in double-double, their exponents and k summed apart, and
 * rounded once at the end (rms_dd_ldexp): no step overflows, underflows,
 * or rounds before that one. Where x or w is 0, inf or NaN, y is x * w,
 * its sign and its inf or NaN as torch's, since inv_rms is positive and
 * finite. Returns the next row's sum of squares, as rms_forward_write
 * does.
 */
RMS_NOINLINE rms_dd rms_forward_row_extreme(rms_kind wk, int with_residual, ptrdiff_t n,
                                            const char *x, ptrdiff_t xs, const rms_row_weight *w,
                                            char *y, ptrdiff_t ys, rms_scaled_inv inv,
                                            const rms_row_source *next)
{
    for (ptrdiff_t i = 0; i < n; i++) {
        const double xi = rms_load_scalar(RMS_KIND_F64, rms_element(x, i, xs));
        const double w_hi = w->lo != NULL ? w->hi[i]
                                          : rms_load_scalar(wk, rms_element(w->data, i, w->stride));
        double yi = xi * w_hi; /* the zeros, infs and NaNs; x * w itself may not fit */
        if (isfinite(xi) && isfinite(w_hi) && xi != 0.0 && w_hi != 0.0) {
            int x_exponent, w_exponent;
            const double x_sig = frexp(xi, &x_exponent), w_sig = frexp(w_hi, &w_exponent);
            const double w_lo = w->lo != NULL ? ldexp(w->lo[i], -w_exponent) : 0.0;
            /* a = x_sig * (w_sig + w_lo), then a * inv, each as hi + lo */
            const double a_hi = x_sig * w_sig;
            const double a_lo = fma(x_sig, w_sig, -a_hi) + x_sig * w_lo;
            const double b_hi = a_hi * inv.inv.hi;
            const double b_lo = fma(a_hi, inv.inv.hi, -b_hi) + (a_hi * inv.inv.lo + a_lo * inv.inv.hi);
            double err;
            const double sum = rms_two_sum(b_hi, b_lo, &err);
            yi = rms_dd_ldexp(sum, err, x_exponent + w_exponent + inv.exponent);
        }
        memcpy(rms_element_out(y, i, ys), &yi, sizeof yi);
    }
    rms_dd none = {0.0, 0.0};
    if (next->x == NULL) {
        return none;
    }
    rms_lanes lanes;
    rms_lanes_clear(&lanes);
    return rms_reduce_row(RMS_KIND_F64, with_residual, &lanes, 0, n, next);
}

/* A remade row's sums, written before its write pass: for the rare rows
   whose inv_rms is worked out from the values again (rms_forward_row). */
RMS_NOINLINE void rms_write_sums(rms_kind xk, ptrdiff_t n, const rms_row_source *row)
{
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        (void)rms_make_sum(xk, rms_element(row->x, i, row->x_stride), row->x_stride,
                           rms_element(row->residual, i, row->residual_stride),
                           row->residual_stride, rms_element_out(row->sum, i, row->sum_stride),
                           row->sum_stride, count);
    }
}

/* Whether n elements from a, stride as, and n from b, stride bs, of size
   bytes each, share a byte. */
static inline int rms_rows_overlap(const char *a, ptrdiff_t as, const char *b, ptrdiff_t bs,
                                   ptrdiff_t n, ptrdiff_t size)
{
    const uintptr_t a0 = (uintptr_t)a, a1 = (uintptr_t)rms_element(a, n - 1, as);
    const uintptr_t b0 = (uintptr_t)b, b1 = (uintptr_t)rms_element(b, n - 1, bs);
    const uintptr_t a_low = a0 < a1 ? a0 : a1, a_high = (a0 < a1 ? a1 : a0) + (uintptr_t)size;
    const uintptr_t b_low = b0 < b1 ? b0 : b1, b_high = (b0 < b1 ? b1 : b0) + (uintptr_t)size;
    return a_low < b_high && b_low < a_high;
}

/* Past this, a row's sum of squares is made exact before its write:
   rms_forward_block_fast16's margins hold for a sum_error up to about
   2^-26, and the double write would find most blocks undecided long
   before. Only a negative eps that nearly cancels mean(x^2), or rows of
   2^27 elements, get here. */
#define RMS_SUM_ERROR_LIMIT 0x1p-32

/*
 * How a row with this inv_rms is written. The float write needs inv_rms's
 * low part inside float's normal range; so does the fast 16-bit one, and
 * for bfloat16 inv_rms <= 2^15 besides: then a product x * w that is 0 in
 * float (below 2^-150) makes |y| < 2^-134, which rounds to 0 too. 16-bit
 * rows outside that go in double, not in float: where the weight is below
 * about 2^-100, x * inv_rms.lo * w leaves float's range and the float
 * path's result is not the correctly rounded one near a tie. The float
 * path is float32's alone.
 */
RMS_ALWAYS_INLINE rms_write_mode rms_write_mode_of(rms_kind xk, rms_kind wk,
                                                   const rms_row_weight *w, rms_dd inv_rms)
{
    const int in_float_range = inv_rms.hi >= 0x1p-100 && inv_rms.hi <= 0x1p100;
    if (rms_has_fast16(xk)) {
        if (w->floats != NULL && in_float_range && (xk == RMS_KIND_F16 || inv_rms.hi <= 0x1p15)) {
            return RMS_WRITE_FAST16;
        }
    }
    else if (RMS_HAVE_FMA && xk == RMS_KIND_F32 && wk == RMS_KIND_F32 && w->lo == NULL &&
             in_float_range) {
        return RMS_WRITE_FLOAT;
    }
    return w->lo != NULL || isinf(inv_rms.hi) ? RMS_WRITE_DOUBLE_OUT_OF_LINE : RMS_WRITE_DOUBLE;
}

/*
 * One row of the forward: inv_rms from its sum of squares, then the write.
 *
 * A plain sum (rms_squares_are_plain) is within rms_sum_error of exact.
 * The fast writes take that into account: they widen their brackets by
 * it, and the double path that writes the blocks they are unsure of notes
 * in unsure those where an output may round otherwise than the exact one.
 * The caller then writes those again (rms_forward_row_exactly) from an
 * exact sum of the row's values, which are still in memory: x, or the
 * sums, all written by the end of the write.
 * Elsewhere the sum is made exact first: where y is written over x, which
 * leaves nothing to sum again; where sum_error passes RMS_SUM_ERROR_LIMIT;
 * and where every block is written in double, for which a compensated
 * pass costs less than checking every block (the portable float32 forward
 * took twice as long).
 */
RMS_ALWAYS_INLINE rms_dd rms_forward_row(rms_kind xk, rms_kind wk, int with_residual, ptrdiff_t n,
                                         const rms_row_source *row, const rms_row_weight *w,
                                         double eps, char *y, ptrdiff_t ys, int stream,
                                         rms_dd sum_squares, const rms_row_source *next,
                                         rms_unsure_blocks *unsure)
{
    /* the row's values in memory: x, or the sums */
    const char *x = with_residual ? row->sum : row->x;
    const ptrdiff_t xs = with_residual ? row->sum_stride : row->x_stride;
    const int needs_rescale = rms_sum_needs_rescale(sum_squares.hi);
    rms_dd inv_rms = {0.0, 0.0};
    rms_write_mode mode = RMS_WRITE_DOUBLE;
    double sum_error = 0.0;
    int exact_first = 0; /* whether the plain sum is made exact before the write */
    /* rows of a plain kind that need a rescale have an infinity or a NaN,
       or are 0: no output of theirs is rounded, and their sum's error is
       left at 0 */
    if (!needs_rescale) {
        inv_rms = rms_inv_rms_from_sum(sum_squares, (double)n, eps);
        mode = rms_write_mode_of(xk, wk, w, inv_rms);
        if (rms_squares_are_plain(xk)) {
            sum_error = rms_sum_error(n, sum_squares.hi, eps);
            exact_first =
                sum_error > RMS_SUM_ERROR_LIMIT || !rms_mode_is_fast(mode) ||
                (!with_residual && rms_rows_overlap(x, xs, y, ys, n, rms_kind_size(xk)));
        }
    }
    const rms_row_source *source = row;
    rms_row_source written;
    if (with_residual && row->remade && (needs_rescale || exact_first)) {
        /* A remade row whose inv_rms is worked out again from its values
           (float32 only): its sums are written first, for that pass to
           read, and its write pass reads them rather than make them again,
           since out= may have put them over x or the residual. In double,
           out of line, as such rows are rare. */
        rms_write_sums(xk, n, row);
        written = *row;
        written.remade = 0;
        source = &written;
        inv_rms = needs_rescale
                      ? rms_scaled_inv_value(rms_inv_rms_scaled(xk, n, x, xs, eps, sum_squares))
                      : rms_exact_inv_rms(xk, n, x, xs, eps);
        mode = RMS_WRITE_DOUBLE_OUT_OF_LINE;
        sum_error = 0.0;
    }
    else if (needs_rescale) {
        const rms_scaled_inv scaled = rms_inv_rms_scaled(xk, n, x, xs, eps, sum_squares);
        if (xk == RMS_KIND_F64 && !rms_scaled_inv_in_range(scaled)) {
            return rms_forward_row_extreme(wk, with_residual, n, x, xs, w, y, ys,
                                           rms_scaled_inv_normalised(scaled), next);
        }
        inv_rms = rms_scaled_inv_value(scaled);
        mode = rms_write_mode_of(xk, wk, w, inv_rms);
    }
    else if (exact_first) {
        inv_rms = rms_exact_inv_rms(xk, n, x, xs, eps);
        mode = rms_write_mode_of(xk, wk, w, inv_rms);
        sum_error = 0.0;
    }
    /* a constant mode at each call, so that each write loop is its own code */
    switch (mode) {
    case RMS_WRITE_FAST16:
        return rms_forward_write(xk, wk, RMS_WRITE_FAST16, with_residual, n, row, w, y, ys,
                                 stream, inv_rms, sum_error, unsure, next);
    case RMS_WRITE_FLOAT:
        return rms_forward_write(xk, wk, RMS_WRITE_FLOAT, with_residual, n, row, w, y, ys,
                                 stream, inv_rms, sum_error, unsure, next);
    case RMS_WRITE_DOUBLE_OUT_OF_LINE:
        return rms_forward_write(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE, with_residual, n, source,
                                 w, y, ys, stream, inv_rms, sum_error, unsure, next);
    default:
        return rms_forward_write(xk, wk, RMS_WRITE_DOUBLE, with_residual, n, row, w, y, ys,
                                 stream, inv_rms, sum_error, unsure, next);
    }
}

/* The weight as floats, for the fast 16-bit write. */
RMS_ALWAYS_INLINE void rms_weight_floats(rms_kind wk, ptrdiff_t n, const char *w, ptrdiff_t ws,
                                         float *dst)
{
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_vf v = rms_load_floats(wk, rms_element(w, i, ws), ws, count);
        rms_store_floats(RMS_KIND_F32, (char *)(dst + i), 4, count, v, 0);
    }
}

/*
 * offset + weight, exactly, as n doubles hi + lo (an error-free sum: lo is
 * what hi, the sum rounded to double, leaves out; 0 where hi is not
 * finite), and, where floats is not NULL, as floats: the exact sum rounded
 * once, through hi rounded to odd. Returns whether the fast 16-bit write
 * may take those floats: not where one is infinite or NaN (a sum past
 * float's range makes 0 * inf of a zero x), nor, to keep the test to one
 * vector operation, below 2^-96 (those rows go in double).
 */
RMS_ALWAYS_INLINE int rms_offset_weight(rms_kind wk, ptrdiff_t n, const char *w, ptrdiff_t ws,
                                        double offset, double *hi, double *lo, float *floats)
{
    int floats_usable = 1;
    const rms_vd o = rms_vd_set(offset);
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block wv = rms_load_doubles(wk, rms_element(w, i, ws), ws, count);
        rms_block sum, err, odd;
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            rms_vd e;
            const rms_vd s = rms_vd_two_sum(o, wv.part[h], &e);
            sum.part[h] = s;
            err.part[h] = rms_vd_zero_where_inf(e, s);
            odd.part[h] = rms_vd_round_to_odd(s, err.part[h]);
        }
        rms_store_doubles((char *)(hi + i), 8, count, &sum, 0);
        rms_store_doubles((char *)(lo + i), 8, count, &err, 0);
        if (floats != NULL) {
            const rms_vf f = rms_vf_narrow(odd.part);
            floats_usable &= !rms_vf_any_abnormal(rms_vf_mul(f, rms_vf_set(0x1p-30f)));
            rms_store_floats(RMS_KIND_F32, (char *)(floats + i), 4, count, f, 0);
        }
    }
    return floats_usable;
}

/* The forward's weight as a row's write pass reads it (rms_row_weight),
   as prepare_forward_weight says (kernels.h); floats only for 16-bit x. */
RMS_ALWAYS_INLINE int rms_prepare_forward_weight(rms_kind xk, rms_kind wk, ptrdiff_t n,
                                                 const char *w, ptrdiff_t ws, const double *offset,
                                                 double *hi, double *lo, float *floats)
{
    if (!rms_has_fast16(xk)) {
        floats = NULL; /* a constant: the types without the fast write compile no floats */
    }
    if (offset != NULL) {
        return rms_offset_weight(wk, n, w, ws, *offset, hi, lo, floats);
    }
    if (floats != NULL) {
        rms_weight_floats(wk, n, w, ws, floats);
    }
    return 1;
}

/* Row r's source, as rms_row_source says; with every stride unit_stride
   where that is not 0 (contiguous rows: a constant to the compiler). */
RMS_ALWAYS_INLINE rms_row_source rms_source_of(const rms_forward_problem *p, int with_residual,
                                               int remade, ptrdiff_t r, ptrdiff_t unit_stride)
{
    rms_row_source src = {rms_element(p->x.data, r, p->x.row_stride), NULL, NULL,
                          unit_stride ? unit_stride : p->x.stride, 0, 0, NULL, NULL, remade};
    if (with_residual) {
        src.residual = rms_element(p->residual.data, r, p->residual.row_stride);
        src.sum = rms_element_out(p->residual_out.data, r, p->residual_out.row_stride);
        src.residual_stride = unit_stride ? unit_stride : p->residual.stride;
        src.sum_stride = unit_stride ? unit_stride : p->residual_out.stride;
    }
    return src;
}

/* Writes the blocks of row r that unsure notes again, in double, from the
   exact sum of the row's values in memory: x, or the sums, all written by
   now; or the whole row, where unsure could not hold them all. For the
   rows whose plain sum left an output undecided (rms_forward_row); out of
   line, as they are rare: 11 in 4096 rows of 8192 normal float32 values,
   39 in 512 rows of 65536, none in 4096 rows of 4096 float16 or bfloat16
   ones. The rows loop calls it after the row's write, and it makes the
   row's source, y and eps again from p, and takes a copy of the weight:
   the write loop's own, kept for it, would have to live in memory, and
   their pointers be loaded at every block (the float32 forward in cache
   took a seventh longer). */
RMS_NOINLINE void rms_forward_row_exactly(rms_kind xk, rms_kind wk, int with_residual,
                                          const rms_forward_problem *p, ptrdiff_t r,
                                          ptrdiff_t unit_stride, rms_row_weight weight,
                                          const rms_unsure_blocks *unsure)
{
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence(); /* the first write's streamed stores land first */
    }
    const rms_row_source row = rms_source_of(p, with_residual, 0, r, unit_stride);
    const char *x = with_residual ? row.sum : row.x;
    const ptrdiff_t xs = with_residual ? row.sum_stride : row.x_stride;
    const ptrdiff_t n = p->n, ys = p->y.stride;
    char *y = rms_element_out(p->y.data, r, p->y.row_stride);
    const rms_kind eps_kind = xk == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32;
    const double eps = rms_load_scalar(eps_kind, rms_element(p->eps, r, p->eps_stride));
    const rms_inv_forms inv =
        rms_inv_forms_of(xk, wk, weight.lo != NULL, rms_exact_inv_rms(xk, n, x, xs, eps), 0.0,
                         NULL, RMS_WRITE_DOUBLE_OUT_OF_LINE);
    const int whole_row = unsure->count > RMS_UNSURE_BLOCKS;
    const ptrdiff_t blocks = whole_row ? (n + RMS_VF_WIDTH - 1) / RMS_VF_WIDTH : unsure->count;
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const ptrdiff_t at = whole_row ? b * RMS_VF_WIDTH : unsure->at[b];
        const ptrdiff_t count = n - at < RMS_VF_WIDTH ? n - at : RMS_VF_WIDTH;
        (void)rms_forward_block(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE, rms_element(x, at, xs), xs,
                                &weight, at, rms_element_out(y, at, ys), ys, count, &inv, 0, 0);
    }
}

/*
 * The forward's rows [row_begin, row_end). The fast 16-bit write takes the
 * weight as floats, and with an offset the write takes offset + weight as
 * doubles (rms_prepare_forward_weight): where the driver has not made them
 * once for the call, rows have weights or offsets of their own, and each
 * row's are made here. Where the floats' memory cannot be had, rows go in
 * double; returns 0, or, where an offset's 2n doubles cannot be had, the
 * bytes asked for, having written nothing.
 * Contiguous rows get the strides as constants, which lets each block be
 * one vector load or store, and the next row's reduction pass rides in the
 * current row's write.
 */
RMS_ALWAYS_INLINE size_t rms_forward_rows_of(rms_kind xk, rms_kind wk, int with_residual,
                                             int remade, const rms_forward_problem *p,
                                             ptrdiff_t row_begin,
                                             ptrdiff_t row_end)
{
    const ptrdiff_t n = p->n;
    if (n <= 0 || row_begin >= row_end) {
        return 0;
    }
    const int with_offset = p->weight_offset != NULL;
    rms_row_weight w = {NULL, p->weight.stride, p->weight_hi, p->weight_lo, p->weight_floats};
    rms_forward_weight_scratch scratch = {NULL, NULL, NULL, NULL};
    if (!p->weight_prepared) {
        const size_t failed_bytes =
            rms_forward_weight_scratch_alloc(&scratch, n, rms_has_fast16(xk), with_offset);
        if (failed_bytes != 0) {
            return failed_bytes;
        }
        w.hi = scratch.hi;
        w.lo = scratch.lo;
    }

    const ptrdiff_t es = rms_kind_size(xk), ws = rms_kind_size(wk);
    const rms_kind eps_kind = xk == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32;
    /* rows are contiguous (kernels.h), but where this table serves
       strided ones too */
    const int contiguous =
        !RMS_STRIDED_ROWS ||
        (p->x.stride == es && p->y.stride == es && p->weight.stride == ws &&
         (!with_residual || (p->residual.stride == es && p->residual_out.stride == es)));
    rms_dd sum_squares = {0.0, 0.0};
    if (contiguous) {
        rms_lanes lanes;
        rms_lanes_clear(&lanes);
        const rms_row_source first = rms_source_of(p, with_residual, remade, row_begin, es);
        sum_squares = rms_reduce_row(xk, with_residual, &lanes, 0, n, &first);
    }
    for (ptrdiff_t r = row_begin; r < row_end; r++) {
        w.data = rms_element(p->weight.data, r, p->weight.row_stride);
        char *y = rms_element_out(p->y.data, r, p->y.row_stride);
        const double eps = rms_load_scalar(eps_kind, rms_element(p->eps, r, p->eps_stride));
        if (!p->weight_prepared) { /* rows with weights or offsets of their own */
            double offset = 0.0;
            if (with_offset) {
                offset = rms_load_scalar(RMS_KIND_F64,
                                         rms_element(p->weight_offset, r, p->weight_offset_stride));
            }
            const int usable =
                rms_prepare_forward_weight(xk, wk, n, w.data, w.stride,
                                           with_offset ? &offset : NULL, scratch.hi, scratch.lo,
                                           scratch.floats);
            w.floats = usable ? scratch.floats : NULL;
        }
        if (RMS_STRIDED_ROWS && !contiguous) {
            const rms_row_source src = rms_source_of(p, with_residual, 0, r, 0);
            rms_row_source none = src;
            none.x = NULL;
            rms_lanes lanes;
            rms_lanes_clear(&lanes);
            rms_unsure_blocks unsure;
            unsure.count = 0;
            rms_forward_row(xk, wk, with_residual, n, &src, &w, eps, y, p->y.stride, 0,
                            rms_reduce_row(xk, with_residual, &lanes, 0, n, &src), &none,
                            &unsure);
            if (rms_squares_are_plain(xk) && unsure.count > 0) {
                rms_forward_row_exactly(xk, wk, with_residual, p, r, 0, w, &unsure);
            }
            continue;
        }
        const rms_row_source src = rms_source_of(p, with_residual, remade, r, es);
        /* strides as they are, but constants: each block one vector load */
        rms_row_source next =
            rms_source_of(p, with_residual, remade, r + 1 < row_end ? r + 1 : r, es);
        if (r + 1 == row_end) {
            next.x = NULL;
        }
        if (p->stream_output && r + 2 < row_end) {
            const rms_row_source after_next = rms_source_of(p, with_residual, remade, r + 2, es);
            next.ahead_x = after_next.x;
            next.ahead_residual = after_next.residual;
        }
        rms_row_weight unit_w = w;
        unit_w.stride = ws;
        rms_unsure_blocks unsure;
        unsure.count = 0;
        sum_squares = rms_forward_row(xk, wk, with_residual, n, &src, &unit_w, eps, y, es,
                                      p->stream_output, sum_squares, &next, &unsure);
        if (rms_squares_are_plain(xk) && unsure.count > 0) {
            rms_forward_row_exactly(xk, wk, with_residual, p, r, es, unit_w, &unsure);
        }
    }
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence(); /* streamed stores are seen before the caller reads y */
    }
    free(scratch.memory);
    return 0;
}

/* Whether a row's sums x + residual are made twice: in the reduction
   pass, for their squares, and again in the write pass, which writes them
   beside y, streamed where y is (rms_forward_block_of_row). Where the
   output is streamed, that spares the sums' lines a trip into the cache
   (a read before each is written, and a write back), for two more loads
   and an add a block: the float32 fused forward at 2048x4096 took a sixth
   less time. float64's took a tenth more, and the other kinds keep their
   sums written once, by the reduction pass. */
RMS_ALWAYS_INLINE int rms_remakes_sums(rms_kind xk, const rms_forward_problem *p)
{
    return RMS_HAVE_STREAM && xk == RMS_KIND_F32 && p->stream_output;
}

/* The forward's rows, with or without a residual: a code path each, since
   a test in the reduction pass costs the plain forward registers in its
   hottest loop. */
RMS_ALWAYS_INLINE size_t rms_forward_rows(rms_kind xk, rms_kind wk,
                                          const rms_forward_problem *p, ptrdiff_t row_begin,
                                          ptrdiff_t row_end)
{
    if (p->residual.data != NULL) {
        if (rms_remakes_sums(xk, p)) {
            return rms_forward_rows_of(xk, wk, 1, 1, p, row_begin, row_end);
        }
        return rms_forward_rows_of(xk, wk, 1, 0, p, row_begin, row_end);
    }
    return rms_forward_rows_of(xk, wk, 0, 0, p, row_begin, row_end);
}

/* ---- the backward ------------------------------------------------------- */

/*
 * grad_input = inv_rms * (g - x_hat * mean(g * x_hat)), g = grad_output * w,
 * for one block, in double; adds grad_output * x_hat into grad_weight.
 * This is inv_rms * g - inv_rms^3 / n * sum(g * x) * x rearranged so that no
 * intermediate leaves the range of x_hat and g: inv_rms^3 underflows for
 * rows near 1e160 while each factor here stays near 1. Where add_residual,
 * grad_residual_out (x's kind) is added before grad_input is rounded.
 */
RMS_ALWAYS_INLINE void rms_backward_block(rms_kind xk, const char *grad_output,
                                          ptrdiff_t grad_output_stride, const char *x, ptrdiff_t xs,
                                          const double *w, double *grad_weight, int add_residual,
                                          const char *grad_residual, ptrdiff_t grs,
                                          char *grad_input, ptrdiff_t grad_input_stride,
                                          ptrdiff_t count, rms_vd inv_rms, rms_vd mean_g_x_hat,
                                          int stream)
{
    const rms_block grad_output_v = rms_load_doubles(xk, grad_output, grad_output_stride, count);
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)w, 8, count);
    rms_block gw = rms_load_doubles(RMS_KIND_F64, (const char *)grad_weight, 8, count);
    rms_block out, residual_v;
    if (add_residual) {
        residual_v = rms_load_doubles(xk, grad_residual, grs, count);
    }
    /* Fused only for outputs narrower than double, which round the same
       either way: a float64 result would move by a rounding, and differ
       from the paths without fused multiply-adds by more than the 1 ULP
       they agree to. */
    const int fused = RMS_HAVE_FMA && rms_kind_is_float_exact(xk);
    const rms_vd minus_mean = rms_vd_sub(rms_vd_set(0.0), mean_g_x_hat);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd x_hat = rms_vd_mul(xv.part[h], inv_rms);
        const rms_vd g = rms_vd_mul(grad_output_v.part[h], wv.part[h]);
        if (fused) {
            gw.part[h] = rms_vd_muladd(grad_output_v.part[h], x_hat, gw.part[h]);
            const rms_vd centred = rms_vd_muladd(x_hat, minus_mean, g);
            out.part[h] = add_residual ? rms_vd_muladd(inv_rms, centred, residual_v.part[h])
                                       : rms_vd_mul(inv_rms, centred);
        }
        else {
            gw.part[h] = rms_vd_add(gw.part[h], rms_vd_mul(grad_output_v.part[h], x_hat));
            out.part[h] = rms_vd_mul(inv_rms, rms_vd_sub(g, rms_vd_mul(x_hat, mean_g_x_hat)));
            if (add_residual) {
                out.part[h] = rms_vd_add(out.part[h], residual_v.part[h]);
            }
        }
    }
    rms_store_doubles((char *)grad_weight, 8, count, &gw, 0);
    rms_store_narrowed(xk, grad_input, grad_input_stride, count, &out, stream);
}

/*
 * The same for 16-bit x, in float: the output keeps 11 bits at most, and
 * float's 24 leave the gradient's own rounding the only error of note (the
 * accuracy table's 16-bit rows are unchanged). Converting every element to
 * double and back would cost twice the arithmetic. grad_weight still sums
 * in double, where the rows add up, and inv_rms joins x * grad_output there.
 * That product is exact in float for float16 (2^-48 to 2^32 in magnitude);
 * bfloat16 has float's range, so two of them can overflow or underflow a
 * float, and their product is formed in double.
 */
RMS_ALWAYS_INLINE void rms_backward_block_float(rms_kind xk, rms_kind wk, const char *grad_output,
                                                ptrdiff_t grad_output_stride, const char *x,
                                                ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                                double *grad_weight, int add_residual,
                                                const char *grad_residual, ptrdiff_t grs,
                                                char *grad_input, ptrdiff_t grad_input_stride,
                                                ptrdiff_t count, rms_vf inv_rms,
                                                rms_vd inv_rms_double, rms_vf minus_mean_g_x_hat,
                                                int stream)
{
    const rms_vf grad_output_v = rms_load_floats(xk, grad_output, grad_output_stride, count);
    const rms_vf xv = rms_load_floats(xk, x, xs, count);
    const rms_vf wv = rms_load_floats(wk, w, ws, count);
    const rms_vf x_hat = rms_vf_mul(xv, inv_rms);
    const rms_vf g = rms_vf_mul(grad_output_v, wv);
    const rms_vf centred = rms_vf_fma(x_hat, minus_mean_g_x_hat, g);
    const rms_vf out =
        add_residual
            ? rms_vf_fma(inv_rms, centred, rms_load_floats(xk, grad_residual, grs, count))
            : rms_vf_mul(inv_rms, centred);
    const rms_vf grad_output_x = rms_vf_mul(grad_output_v, xv); /* exact for float16 */
    rms_block gw = rms_load_doubles(RMS_KIND_F64, (const char *)grad_weight, 8, count);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd product =
            xk == RMS_KIND_F16 ? rms_vd_widen(grad_output_x, h)
                               : rms_vd_mul(rms_vd_widen(grad_output_v, h), rms_vd_widen(xv, h));
        gw.part[h] = rms_vd_muladd(product, inv_rms_double, gw.part[h]);
    }
    rms_store_doubles((char *)grad_weight, 8, count, &gw, 0);
    rms_store_floats(xk, grad_input, grad_input_stride, count, out, stream);
}

/* One block of the backward, in float or in double. */
RMS_ALWAYS_INLINE void rms_backward_any_block(
    rms_kind xk, rms_kind wk, int in_float, const char *grad_output, ptrdiff_t grad_output_stride,
    const char *x, ptrdiff_t xs, const double *w_double, const char *w, ptrdiff_t ws,
    double *grad_weight, int add_residual, const char *grad_residual, ptrdiff_t grs,
    char *grad_input, ptrdiff_t grad_input_stride, ptrdiff_t count, rms_vd inv_rms, rms_vd mean,
    rms_vf inv_rms_float, rms_vf minus_mean_float, int stream)
{
    if (in_float) {
        rms_backward_block_float(xk, wk, grad_output, grad_output_stride, x, xs, w, ws, grad_weight,
                                 add_residual, grad_residual, grs, grad_input, grad_input_stride,
                                 count, inv_rms_float, inv_rms, minus_mean_float, stream);
    }
    else {
        rms_backward_block(xk, grad_output, grad_output_stride, x, xs, w_double, grad_weight,
                           add_residual, grad_residual, grs, grad_input, grad_input_stride, count,
                           inv_rms, mean, stream);
    }
}

/* A row of the backward's grad_residual_out, where add_residual, from the
   column where a write pass starts; left is how many of the row's
   columns are there from that one on, for the write loop's asks ahead. */
typedef struct {
    int add_residual;
    const char *data;
    ptrdiff_t stride, left;
} rms_grad_residual;

/*
 * The backward of a row whose inv_rms r is infinite (mean(x^2) + eps is
 * exactly 0, or 1 / rms passes DBL_MAX): torch's composite gradient taken term by term, g w r - (r^3 /
 * n) sum(g w x) x, each term inf or NaN, and NaN where the two oppose,
 * which no finite rearrangement of the usual formula gives. grad_weight
 * gains g x r. Rare enough to take the kinds at run time, out of line.
 */
RMS_NOINLINE void rms_backward_row_unbounded(rms_kind xk, ptrdiff_t n, const char *grad_output,
                                             ptrdiff_t grad_output_stride, const char *x,
                                             ptrdiff_t xs, const double *w, double sum_g_x,
                                             rms_grad_residual gr, char *grad_input,
                                             ptrdiff_t grad_input_stride, double *grad_weight)
{
    const rms_vd r = rms_vd_set(INFINITY), minus_sum = rms_vd_set(-sum_g_x);
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block go = rms_load_doubles(
            xk, rms_element(grad_output, i, grad_output_stride), grad_output_stride, count);
        const rms_block xv = rms_load_doubles(xk, rms_element(x, i, xs), xs, count);
        const rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)(w + i), 8, count);
        rms_block gw = rms_load_doubles(RMS_KIND_F64, (const char *)(grad_weight + i), 8, count);
        rms_block residual, out;
        if (gr.add_residual) {
            residual =
                rms_load_doubles(xk, rms_element(gr.data, i, gr.stride), gr.stride, count);
        }
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            const rms_vd direct = rms_vd_mul(rms_vd_mul(go.part[h], wv.part[h]), r);
            const rms_vd through_r = rms_vd_mul(rms_vd_mul(minus_sum, r), xv.part[h]);
            out.part[h] = rms_vd_add(direct, through_r);
            if (gr.add_residual) {
                out.part[h] = rms_vd_add(out.part[h], residual.part[h]);
            }
            gw.part[h] = rms_vd_add(gw.part[h], rms_vd_mul(go.part[h], rms_vd_mul(xv.part[h], r)));
        }
        rms_store_doubles((char *)(grad_weight + i), 8, count, &gw, 0);
        rms_store_narrowed(xk, rms_element_out(grad_input, i, grad_input_stride),
                           grad_input_stride, count, &out, 0);
    }
}

/* A double stored in kind, rounded once, for per-element scalar work. */
RMS_ALWAYS_INLINE void rms_store_scalar(rms_kind kind, char *p, double v)
{
    const rms_block block = rms_load_doubles(RMS_KIND_F64, (const char *)&v, 8, 1);
    rms_store_narrowed(kind, p, 0, 1, &block, 0);
}

/* a * 2^a_exponent - b * 2^b_exponent, rounded. A zero's exponent says
   nothing, and must not scale the other term away. */
static inline double rms_scaled_difference(double a, int a_exponent, double b, int b_exponent)
{
    if (a == 0.0 || b == 0.0) {
        return ldexp(a, a_exponent) - ldexp(b, b_exponent);
    }
    if (a_exponent >= b_exponent) {
        return ldexp(a - ldexp(b, b_exponent - a_exponent), a_exponent);
    }
    return ldexp(ldexp(a, a_exponent - b_exponent) - b, b_exponent);
}

/*
 * The backward of a row whose inv_rms leaves double's normal range, or
 * whose sum(g w x) overflowed or underflowed with every input finite
 * (grad_output near either end of the range, a row near 2^-1000 or
 * 2^1000): one element at a time, since such rows are rare. Every product
 * is formed from its factors' significands, with their exponents summed
 * apart, so nothing overflows or underflows until an output is rounded:
 *
 *   g_j x_hat_j    = (go_j w_j x_j inv) * 2^(E_j + k), summed as
 *                    S * 2^(E_max + k), S near 1,
 *   grad_input_i   = inv g_i - inv x_hat_i * S / n * 2^(E_max + k),
 *   grad_weight_i += go_i x_hat_i,
 *
 * where go, w, x and inv (inv_rms = inv * 2^k) stand for significands
 * and E_j is the sum of go_j's, w_j's and x_j's exponents. This is the
 * row's reduction pass, which fills the plan; rms_backward_extreme_write
 * is its write pass. Returns 0 where an input is not finite or inv_rms is
 * inf or NaN: the vector path gives torch's non-finite results there.
 */
RMS_NOINLINE int rms_backward_extreme_plan(rms_kind xk, ptrdiff_t n, const char *grad_output,
                                           ptrdiff_t grad_output_stride, const char *x,
                                           ptrdiff_t xs, const double *w, rms_scaled_inv scaled,
                                           rms_backward_plan *plan)
{
    for (ptrdiff_t j = 0; j < n; j++) {
        const double go = rms_load_scalar(xk, rms_element(grad_output, j, grad_output_stride));
        const double xj = rms_load_scalar(xk, rms_element(x, j, xs));
        if (!isfinite(go) || !isfinite(xj) || !isfinite(w[j])) {
            return 0;
        }
    }
    if (scaled.inv.hi == 0.0) {
        plan->path = RMS_BACKWARD_ZERO_INV;
        return 1;
    }
    if (!(scaled.inv.hi > 0.0) || isinf(scaled.inv.hi)) {
        return 0;
    }
    scaled = rms_scaled_inv_normalised(scaled);
    const double inv = scaled.inv.hi + scaled.inv.lo;
    /* E_max first, then S over the terms scaled by it, in index order */
    int e_max = INT_MIN;
    for (ptrdiff_t j = 0; j < n; j++) {
        int e_go, e_w, e_x;
        const double go_sig =
            frexp(rms_load_scalar(xk, rms_element(grad_output, j, grad_output_stride)), &e_go);
        const double term = go_sig * frexp(w[j], &e_w) *
                            frexp(rms_load_scalar(xk, rms_element(x, j, xs)), &e_x);
        if (term != 0.0 && e_go + e_w + e_x > e_max) {
            e_max = e_go + e_w + e_x;
        }
    }
    double sum = 0.0, sum_err = 0.0; /* compensated: n may be large */
    for (ptrdiff_t j = 0; e_max != INT_MIN && j < n; j++) {
        int e_go, e_w, e_x;
        const double go_sig =
            frexp(rms_load_scalar(xk, rms_element(grad_output, j, grad_output_stride)), &e_go);
        const double term = go_sig * frexp(w[j], &e_w) *
                            frexp(rms_load_scalar(xk, rms_element(x, j, xs)), &e_x) * inv;
        double err;
        sum = rms_two_sum(sum, ldexp(term, e_go + e_w + e_x - e_max), &err);
        sum_err += err;
    }
    plan->path = RMS_BACKWARD_EXTREME;
    plan->inv = inv;
    plan->exponent = scaled.exponent;
    plan->e_max = e_max;
    plan->mean = (sum + sum_err) / (double)n;
    return 1;
}

/* The write pass of a row that rms_backward_extreme_plan took, over
   `count` of its elements. */
RMS_NOINLINE void rms_backward_extreme_write(rms_kind xk, const rms_backward_plan *plan,
                                             ptrdiff_t count, const char *grad_output,
                                             ptrdiff_t grad_output_stride, const char *x,
                                             ptrdiff_t xs, const double *w, rms_grad_residual gr,
                                             char *grad_input, ptrdiff_t grad_input_stride,
                                             double *grad_weight)
{
    if (plan->path == RMS_BACKWARD_ZERO_INV) {
        /* eps = +inf: inv_rms is 0, and so is every gradient's own term,
           however far sum(g w x) is past DBL_MAX (torch's 0 * inf is NaN) */
        for (ptrdiff_t i = 0; i < count; i++) {
            const double go = rms_load_scalar(xk, rms_element(grad_output, i, grad_output_stride));
            double out = go * 0.0 * w[i]; /* 0 even where go * w would overflow */
            if (gr.add_residual) {
                out += rms_load_scalar(xk, rms_element(gr.data, i, gr.stride));
            }
            rms_store_scalar(xk, rms_element_out(grad_input, i, grad_input_stride), out);
        }
        return;
    }
    const double inv = plan->inv, mean = plan->mean;
    const int k = plan->exponent, e_max = plan->e_max;
    for (ptrdiff_t i = 0; i < count; i++) {
        int e_go, e_w, e_x;
        const double go = rms_load_scalar(xk, rms_element(grad_output, i, grad_output_stride));
        const double go_sig = frexp(go, &e_go), w_sig = frexp(w[i], &e_w);
        const double x_sig = frexp(rms_load_scalar(xk, rms_element(x, i, xs)), &e_x);
        /* inv g_i, less inv x_hat_i mean(g x_hat) (both 0 where sum is) */
        double out = rms_scaled_difference(inv * go_sig * w_sig, e_go + e_w + k,
                                           inv * inv * x_sig * mean,
                                           e_max == INT_MIN ? 0 : e_x + e_max + 3 * k);
        if (gr.add_residual) {
            out += rms_load_scalar(xk, rms_element(gr.data, i, gr.stride));
        }
        rms_store_scalar(xk, rms_element_out(grad_input, i, grad_input_stride), out);
        grad_weight[i] += ldexp(go_sig * x_sig * inv, e_go + e_x + k);
    }
}

/* Whether some g_j w_j x_j of a float64 row is not 0: where their sum in
   double is 0, every product may have underflowed (grad_output near
   2^-1070) rather than cancelled, and mean(g x_hat) is then not the 0 the
   vector path would take. */
RMS_NOINLINE int rms_row_has_a_product(ptrdiff_t n, const char *grad_output,
                                       ptrdiff_t grad_output_stride, const char *x, ptrdiff_t xs,
                                       const double *w)
{
    for (ptrdiff_t j = 0; j < n; j++) {
        const double go =
            rms_load_scalar(RMS_KIND_F64, rms_element(grad_output, j, grad_output_stride));
        const double xj = rms_load_scalar(RMS_KIND_F64, rms_element(x, j, xs));
        if (go != 0.0 && xj != 0.0 && w[j] != 0.0) {
            return 1;
        }
    }
    return 0;
}

/* Whether a backward row goes to rms_backward_extreme_plan: inv_rms left
   the range where the vector path is exact enough; sum(g w x) is past
   2^900 (inf and NaN included), or non-zero and below 2^-900; mean(g
   x_hat) = inv_rms * sum / n would leave 2^+-960, though each factor is in
   range; or the sum is 0 where that may be every product underflowing
   rather than a true 0: in a rescaled row (elements below about 2^-450),
   or in a float64 row with a product that is not 0. Narrower rows need no
   such test: what their products lose is far below their outputs' least
   subnormal. */
RMS_ALWAYS_INLINE int rms_backward_row_is_extreme(rms_kind xk, ptrdiff_t n,
                                                  const char *grad_output,
                                                  ptrdiff_t grad_output_stride, const char *x,
                                                  ptrdiff_t xs, const double *w,
                                                  rms_scaled_inv inv_rms, rms_dd sum_g_x)
{
    const double dot = fabs(sum_g_x.hi);
    if (!(dot <= 0x1p900) || (dot != 0.0 && dot < 0x1p-900) ||
        !rms_scaled_inv_in_range(inv_rms)) {
        return 1;
    }
    if (!(inv_rms.inv.hi > 0.0) || isinf(inv_rms.inv.hi)) {
        return 0; /* 0, inf or NaN: the vector path has torch's results */
    }
    if (dot == 0.0) {
        return inv_rms.exponent != 0 ||
               (xk == RMS_KIND_F64 &&
                rms_row_has_a_product(n, grad_output, grad_output_stride, x, xs, w));
    }
    const int mean_binade = ilogb(dot) + ilogb(inv_rms.inv.hi) + inv_rms.exponent;
    return mean_binade < -960 || mean_binade > 960;
}

/* A backward row's reduction pass: sum(x^2) and sum(g w x), and from them
   the plan of its write pass. w_as_stored says whether w holds the stored
   weight as doubles, with no offset: only then may the float path read the
   stored weight instead. ask_for is a contiguous row of n elements that
   the pass asks for as it goes, or NULL: the row's grad_residual_out,
   which its write pass reads next (RMS_GRAD_RESIDUAL_AHEAD says why). */
RMS_ALWAYS_INLINE rms_backward_plan rms_backward_row_plan(rms_kind xk, rms_kind wk, ptrdiff_t n,
                                                          const char *grad_output,
                                                          ptrdiff_t grad_output_stride,
                                                          const char *x, ptrdiff_t xs,
                                                          const double *w, int w_as_stored,
                                                          double eps, const char *ask_for)
{
    rms_lanes squares, dot;
    rms_lanes_clear(&squares);
    rms_lanes_clear(&dot);
    const ptrdiff_t size = rms_kind_size(xk);
    ptrdiff_t i = 0;
    for (; i + RMS_DOT_LANES <= n; i += RMS_DOT_LANES) {
        if (ask_for != NULL) {
            rms_prefetch(rms_element(ask_for, i, size), RMS_DOT_LANES * size);
        }
        rms_add_squares_and_dot(xk, wk, &squares, &dot, x, xs, grad_output, grad_output_stride, w,
                                i, RMS_DOT_LANES);
    }
    if (i < n) {
        rms_add_squares_and_dot(xk, wk, &squares, &dot, x, xs, grad_output, grad_output_stride, w,
                                i, n - i);
    }
    const rms_dd sum_squares =
        rms_lanes_total(&squares, RMS_DOT_LANES, !rms_kind_is_float_exact(xk));
    const rms_dd sum_g_x = rms_lanes_total(&dot, RMS_DOT_LANES, rms_dot_is_compensated(xk, wk));
    rms_scaled_inv scaled = {{0.0, 0.0}, 0};
    if (rms_sum_needs_rescale(sum_squares.hi)) {
        scaled = rms_inv_rms_scaled(xk, n, x, xs, eps, sum_squares);
    }
    else {
        scaled.inv = rms_inv_rms_from_sum(sum_squares, (double)n, eps);
    }
    rms_backward_plan plan = {RMS_BACKWARD_VECTOR, 0, 0, 0, 0.0, 0.0};
    if (rms_backward_row_is_extreme(xk, n, grad_output, grad_output_stride, x, xs, w, scaled,
                                    sum_g_x) &&
        rms_backward_extreme_plan(xk, n, grad_output, grad_output_stride, x, xs, w, scaled,
                                  &plan)) {
        return plan;
    }
    const rms_dd inv_rms_dd = rms_scaled_inv_value(scaled);
    const double inv_rms = inv_rms_dd.hi + inv_rms_dd.lo;
    if (isinf(inv_rms)) {
        plan.path = RMS_BACKWARD_UNBOUNDED;
        plan.mean = sum_g_x.hi + sum_g_x.lo;
        return plan;
    }
    plan.inv = inv_rms;
    plan.mean = inv_rms * (sum_g_x.hi + sum_g_x.lo) / (double)n;
    /* 16-bit rows go in float where fused multiply-adds exist, and where
       inv_rms and the mean stay well inside float's range. */
    plan.in_float = RMS_HAVE_FMA && rms_kind_size(xk) == 2 && w_as_stored &&
                    inv_rms >= 0x1p-100 && inv_rms <= 0x1p100 && fabs(plan.mean) <= 0x1p100;
    return plan;
}

/*
 * How far ahead in its own row a streamed write loop asks for
 * grad_residual_out, in elements. The fused backward reads
 * grad_residual_out in its write pass only, from memory. Asked for a few
 * rows ahead, as grad_output and x are, its loads still waited on memory
 * for a quarter of the float32 fused backward's time at 2048x4096 (perf),
 * which was then no faster than the backward followed by np.add. Asked
 * for by the row's reduction pass, beside the row's other operands, and
 * again this far ahead by the write pass, the float32 fused backward took
 * 4 to 10% less time at 2048x4096 and 13 to 14% less at 4096x8192, and
 * float64's 12 to 29% less; the 16-bit ones moved within noise
 * (benchmarks/compare_builds.py --fused, 1 thread, two runs).
 */
#define RMS_GRAD_RESIDUAL_AHEAD 512

/* A backward row's write pass over `count` elements, the whole row or one
   tile of it (every pointer at the tile's first column; w_stored is the
   stored weight, which the float path reads). A streamed output's write
   loop also asks for the grad_output and x of a row further on
   (ahead_grad_output and ahead_x, or NULL), as rms_forward_write asks for
   the next row, and for grad_residual_out further on in its own row. */
RMS_ALWAYS_INLINE void rms_backward_row_write(rms_kind xk, rms_kind wk,
                                              const rms_backward_plan *plan, ptrdiff_t count,
                                              const char *grad_output,
                                              ptrdiff_t grad_output_stride, const char *x,
                                              ptrdiff_t xs, const double *w,
                                              const char *w_stored, ptrdiff_t ws,
                                              rms_grad_residual gr, char *grad_input,
                                              ptrdiff_t grad_input_stride, double *grad_weight,
                                              int stream, const char *ahead_grad_output,
                                              const char *ahead_x)
{
    if (plan->path == RMS_BACKWARD_EXTREME || plan->path == RMS_BACKWARD_ZERO_INV) {
        rms_backward_extreme_write(xk, plan, count, grad_output, grad_output_stride, x, xs, w, gr,
                                   grad_input, grad_input_stride, grad_weight);
        return;
    }
    if (plan->path == RMS_BACKWARD_UNBOUNDED) {
        rms_backward_row_unbounded(xk, count, grad_output, grad_output_stride, x, xs, w,
                                   plan->mean, gr, grad_input, grad_input_stride, grad_weight);
        return;
    }
    /* the conditions that are constants fold the float path away for the
       types that never take it */
    const int in_float = RMS_HAVE_FMA && rms_kind_size(xk) == 2 && plan->in_float;
    const rms_vd inv = rms_vd_set(plan->inv);
    const rms_vd mean = rms_vd_set(plan->mean);
    const rms_vf inv_float = rms_vf_set((float)plan->inv);
    const rms_vf minus_mean_float = rms_vf_set((float)-plan->mean);

    const ptrdiff_t size = rms_kind_size(xk);
    const ptrdiff_t head = rms_unaligned_head(grad_input, grad_input_stride, size, count);
    const int streamed = rms_can_stream(
        stream, rms_element_out(grad_input, head, grad_input_stride), grad_input_stride, size);
#define RMS_BACKWARD_BLOCK_AT(at, block_count, stream_block)                                      \
    rms_backward_any_block(xk, wk, in_float, rms_element(grad_output, at, grad_output_stride),    \
                           grad_output_stride, rms_element(x, at, xs), xs, w + (at),              \
                           rms_element(w_stored, at, ws), ws, grad_weight + (at),                 \
                           gr.add_residual,                                                       \
                           gr.add_residual ? rms_element(gr.data, at, gr.stride) : NULL,          \
                           gr.stride,                                                             \
                           rms_element_out(grad_input, at, grad_input_stride), grad_input_stride, \
                           block_count, inv, mean, inv_float, minus_mean_float, stream_block)
    ptrdiff_t i;
    for (i = 0; i < head; i += RMS_VF_WIDTH) {
        RMS_BACKWARD_BLOCK_AT(i, head - i < RMS_VF_WIDTH ? head - i : RMS_VF_WIDTH, 0);
    }
    for (i = head; i + RMS_LANES <= count; i += RMS_LANES) {
        if (streamed && ahead_x != NULL) {
            rms_prefetch(rms_element(ahead_grad_output, i, grad_output_stride),
                         RMS_LANES * grad_output_stride);
            rms_prefetch(rms_element(ahead_x, i, xs), RMS_LANES * xs);
        }
        if (streamed && gr.add_residual && i + RMS_GRAD_RESIDUAL_AHEAD + RMS_LANES <= gr.left) {
            rms_prefetch(rms_element(gr.data, i + RMS_GRAD_RESIDUAL_AHEAD, gr.stride),
                         RMS_LANES * gr.stride);
        }
        for (ptrdiff_t b = 0; b < RMS_LANES; b += RMS_VF_WIDTH) {
            RMS_BACKWARD_BLOCK_AT(i + b, RMS_VF_WIDTH, streamed);
        }
    }
    for (; i < count; i += RMS_VF_WIDTH) {
        RMS_BACKWARD_BLOCK_AT(i, count - i < RMS_VF_WIDTH ? count - i : RMS_VF_WIDTH, 0);
    }
#undef RMS_BACKWARD_BLOCK_AT
}

/* One backward row's operands, at column `column`, and the same row of
   the rows `ahead` further on that a streamed write pass asks for (NULL
   where there is none). Contiguous rows take the kind's size as every
   element stride, a constant the compiler folds. */
typedef struct {
    const char *grad_output, *x, *ahead_grad_output, *ahead_x;
    char *grad_input;
    ptrdiff_t grad_output_stride, xs, grad_input_stride;
    rms_grad_residual gr;
} rms_backward_row_operands;

RMS_ALWAYS_INLINE rms_backward_row_operands rms_backward_row_at(
    rms_kind xk, int add_residual, int contiguous, const rms_backward_problem *p, ptrdiff_t r,
    ptrdiff_t column, ptrdiff_t ahead)
{
    const ptrdiff_t es = rms_kind_size(xk);
    rms_backward_row_operands o;
    o.grad_output_stride = contiguous ? es : p->grad_output.stride;
    o.xs = contiguous ? es : p->x.stride;
    o.grad_input_stride = contiguous ? es : p->grad_input.stride;
    o.grad_output = rms_element(rms_element(p->grad_output.data, r, p->grad_output.row_stride),
                                column, o.grad_output_stride);
    o.x = rms_element(rms_element(p->x.data, r, p->x.row_stride), column, o.xs);
    o.grad_input = rms_element_out(
        rms_element_out(p->grad_input.data, r, p->grad_input.row_stride), column,
        o.grad_input_stride);
    o.ahead_grad_output = ahead ? rms_element(o.grad_output, ahead, p->grad_output.row_stride)
                                : NULL;
    o.ahead_x = ahead ? rms_element(o.x, ahead, p->x.row_stride) : NULL;
    o.gr.add_residual = add_residual;
    o.gr.data = NULL;
    o.gr.stride = 0;
    o.gr.left = p->n - column;
    if (add_residual) {
        o.gr.stride = contiguous ? es : p->grad_residual_out.stride;
        o.gr.data = rms_element(
            rms_element(p->grad_residual_out.data, r, p->grad_residual_out.row_stride), column,
            o.gr.stride);
    }
    return o;
}

/* Whether every element stride is its kind's size, the weight's too
   (the driver packs a strided weight, so that it is unless memory ran
   out). Where they are, the strides are constants: with the weight's a
   variable, the 16-bit write loop kept, for each step, the addresses that
   a strided weight's packed copy would read, and the float16 backward
   took a sixth longer. */
RMS_ALWAYS_INLINE int rms_backward_is_contiguous(rms_kind xk, rms_kind wk, int add_residual,
                                                 const rms_backward_problem *p)
{
    const ptrdiff_t es = rms_kind_size(xk);
    return p->grad_output.stride == es && p->x.stride == es && p->grad_input.stride == es &&
           p->weight_stride == rms_kind_size(wk) &&
           (!add_residual || p->grad_residual_out.stride == es);
}

RMS_ALWAYS_INLINE double rms_backward_eps(rms_kind xk, const rms_backward_problem *p)
{
    return rms_load_scalar(xk == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32, p->eps);
}

/* A row's reduction passes, one plan each, for rows [row_begin, row_end). */
RMS_ALWAYS_INLINE void rms_plan_backward_rows_of(rms_kind xk, rms_kind wk, int contiguous,
                                                 const rms_backward_problem *p,
                                                 ptrdiff_t row_begin, ptrdiff_t row_end,
                                                 const double *weight, rms_backward_plan *plans)
{
    const double eps = rms_backward_eps(xk, p);
    const int w_as_stored = p->weight_offset == NULL;
    const int add_residual = p->grad_residual_out.data != NULL;
    const int ask = add_residual && contiguous && p->stream_output;
    for (ptrdiff_t r = row_begin; r < row_end; r++) {
        const rms_backward_row_operands o =
            rms_backward_row_at(xk, add_residual, contiguous, p, r, 0, 0);
        /* NULL a constant where nothing is asked for: a test in the
           reduction loop made the plain 16-bit backward 5 to 13% slower */
        plans[r - row_begin] =
            ask ? rms_backward_row_plan(xk, wk, p->n, o.grad_output, o.grad_output_stride, o.x,
                                        o.xs, weight, w_as_stored, eps, o.gr.data)
                : rms_backward_row_plan(xk, wk, p->n, o.grad_output, o.grad_output_stride, o.x,
                                        o.xs, weight, w_as_stored, eps, NULL);
    }
}

/*
 * How many rows of float32 x the backward writes together, and in how
 * many columns at a time. A row's write pass reads the weight and reads and
 * writes grad_weight, 24 bytes of doubles a column, twice its own
 * operands' 12; with those, past about 1700 columns (48 KiB of L1) the
 * doubles no longer stay in L1 from one row to the next. Rows written
 * together, a step of columns each in turn, find that step's doubles in
 * L1. The row order, and so every sum, is the same. Measured on 1 thread
 * (benchmarks/compare_builds.py), float32's backward took a fifth to a
 * quarter less time at 2048x4096 and 4096x8192, and its fused backward
 * about a tenth less. The others are written a row at a time: 16-bit rows
 * are written in float, where the conversions, not the doubles, set the
 * pace (together they lost 4% to the extra steps), and float64 rows, whose
 * own operands are as wide as the doubles, lost 5% from memory.
 */
#define RMS_BACKWARD_ROWS_TOGETHER 4
#define RMS_BACKWARD_COLUMNS_TOGETHER 1024

RMS_ALWAYS_INLINE ptrdiff_t rms_backward_rows_together(rms_kind xk)
{
    return xk == RMS_KIND_F32 ? RMS_BACKWARD_ROWS_TOGETHER : 1;
}

/* The write passes of the planned rows [row_begin, row_end) over columns
   [column_begin, column_end), with grad_weight_tile at column_begin. A
   streamed row asks for the row `ahead` rows on, where that is before
   ahead_end. */
RMS_ALWAYS_INLINE void rms_write_backward_rows(
    rms_kind xk, rms_kind wk, int add_residual, int contiguous, const rms_backward_problem *p,
    ptrdiff_t row_begin, ptrdiff_t row_end, const rms_backward_plan *plans,
    ptrdiff_t column_begin, ptrdiff_t column_end, const double *weight, double *grad_weight_tile,
    ptrdiff_t ahead, ptrdiff_t ahead_end)
{
    const int streamed = contiguous && p->stream_output;
    const ptrdiff_t ws = contiguous ? rms_kind_size(wk) : p->weight_stride;
    ptrdiff_t step = column_end - column_begin, first_step = step;
    /* Together only where every row's grad_input has the same alignment:
       each step after the first starts where the stores are aligned, so
       that a row's first and last blocks are its only partial ones, as
       when it is written whole (a partial block costs more than a whole
       one: masked moves on AVX-512, a packed copy elsewhere; and NumPy
       aligns its buffers to 16 bytes only). */
    if (rms_backward_rows_together(xk) > 1 &&
        p->grad_input.row_stride % RMS_VECTOR_BYTES == 0) {
        const rms_backward_row_operands first =
            rms_backward_row_at(xk, 0, contiguous, p, row_begin, column_begin, 0);
        step = RMS_BACKWARD_COLUMNS_TOGETHER;
        first_step = step + rms_unaligned_head(first.grad_input, first.grad_input_stride,
                                               rms_kind_size(xk), column_end - column_begin);
    }
    for (ptrdiff_t c = column_begin, count = first_step; c < column_end; c += count, count = step) {
        if (count > column_end - c) {
            count = column_end - c;
        }
        for (ptrdiff_t r = row_begin; r < row_end; r++) {
            const rms_backward_row_operands o = rms_backward_row_at(
                xk, add_residual, contiguous, p, r, c,
                streamed && r + ahead < ahead_end ? ahead : 0);
            rms_backward_row_write(xk, wk, &plans[r - row_begin], count, o.grad_output,
                                   o.grad_output_stride, o.x, o.xs, weight + c,
                                   rms_element(p->weight, c, ws), ws, o.gr, o.grad_input,
                                   o.grad_input_stride, grad_weight_tile + (c - column_begin),
                                   streamed, o.ahead_grad_output, o.ahead_x);
        }
    }
}

/* The backward's rows, reduced and then written while still in cache, a
   few together (rms_backward_rows_together), with or without
   grad_residual_out (add_residual: a test per block, well predicted; a
   code path each would double the backward's compile time). */
RMS_ALWAYS_INLINE void rms_backward_rows_of(rms_kind xk, rms_kind wk, int add_residual,
                                            int contiguous, const rms_backward_problem *p,
                                            ptrdiff_t row_begin, ptrdiff_t row_end,
                                            const double *weight, double *grad_weight_partial)
{
    const ptrdiff_t together = rms_backward_rows_together(xk);
    /* A write pass asks for the same row of the next rows written
       together, and a row written alone for the row two on: the next one
       is already on its way, and asked for only one row ahead, its last
       lines arrive after its reduction pass needs them. */
    const ptrdiff_t ahead = together > 1 ? together : 2;
    const ptrdiff_t ahead_end = p->ahead_end > row_end ? p->ahead_end : row_end;
    rms_backward_plan plans[RMS_BACKWARD_ROWS_TOGETHER];
    for (ptrdiff_t r = row_begin; r < row_end; r += together) {
        const ptrdiff_t end = row_end - r < together ? row_end : r + together;
        rms_plan_backward_rows_of(xk, wk, contiguous, p, r, end, weight, plans);
        rms_write_backward_rows(xk, wk, add_residual, contiguous, p, r, end, plans, 0, p->n,
                                weight, grad_weight_partial, ahead, ahead_end);
    }
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence();
    }
}

RMS_ALWAYS_INLINE void rms_backward_rows(rms_kind xk, rms_kind wk, const rms_backward_problem *p,
                                         ptrdiff_t row_begin, ptrdiff_t row_end,
                                         const double *weight, double *grad_weight_partial)
{
    const int add_residual = p->grad_residual_out.data != NULL;
    if (!RMS_STRIDED_ROWS || rms_backward_is_contiguous(xk, wk, add_residual, p)) {
        rms_backward_rows_of(xk, wk, add_residual, 1, p, row_begin, row_end, weight,
                             grad_weight_partial);
    }
    else {
        rms_backward_rows_of(xk, wk, add_residual, 0, p, row_begin, row_end, weight,
                             grad_weight_partial);
    }
}

/* The tiled backward's two steps (kernels.h): every row's reduction pass,
   then the rows' write passes over one tile of columns. */
RMS_ALWAYS_INLINE void rms_plan_backward_rows(rms_kind xk, rms_kind wk,
                                              const rms_backward_problem *p, ptrdiff_t row_begin,
                                              ptrdiff_t row_end, const double *weight,
                                              rms_backward_plan *plans)
{
    if (!RMS_STRIDED_ROWS || rms_backward_is_contiguous(xk, wk, p->grad_residual_out.data != NULL, p)) {
        rms_plan_backward_rows_of(xk, wk, 1, p, row_begin, row_end, weight, plans);
    }
    else {
        rms_plan_backward_rows_of(xk, wk, 0, p, row_begin, row_end, weight, plans);
    }
}

RMS_ALWAYS_INLINE void rms_write_backward_tile_of(
    rms_kind xk, rms_kind wk, int add_residual, int contiguous, const rms_backward_problem *p,
    ptrdiff_t row_begin, ptrdiff_t row_end, const rms_backward_plan *plans,
    ptrdiff_t column_begin, ptrdiff_t column_end, const double *weight, double *grad_weight_tile)
{
    /* A streamed write pass asks for the same tile of the next chunk's
       rows, which the rows' reduction passes will read next. */
    rms_write_backward_rows(xk, wk, add_residual, contiguous, p, row_begin, row_end, plans,
                            column_begin, column_end, weight, grad_weight_tile,
                            row_end - row_begin, p->ahead_end);
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence();
    }
}

RMS_ALWAYS_INLINE void rms_write_backward_tile(rms_kind xk, rms_kind wk,
                                               const rms_backward_problem *p,
                                               ptrdiff_t row_begin, ptrdiff_t row_end,
                                               const rms_backward_plan *plans,
                                               ptrdiff_t column_begin, ptrdiff_t column_end,
                                               const double *weight, double *grad_weight_tile)
{
    const int add_residual = p->grad_residual_out.data != NULL;
    if (!RMS_STRIDED_ROWS || rms_backward_is_contiguous(xk, wk, add_residual, p)) {
        rms_write_backward_tile_of(xk, wk, add_residual, 1, p, row_begin, row_end, plans,
                                   column_begin, column_end, weight, grad_weight_tile);
    }
    else {
        rms_write_backward_tile_of(xk, wk, add_residual, 0, p, row_begin, row_end, plans,
                                   column_begin, column_end, weight, grad_weight_tile);
    }
}

/* The backward's weight as doubles, and grad_weight back into its kind. */
RMS_ALWAYS_INLINE void rms_widen_weight(rms_kind wk, ptrdiff_t n, const char *src,
                                        ptrdiff_t src_stride, double *dst)
{
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block v =
            rms_load_doubles(wk, rms_element(src, i, src_stride), src_stride, count);
        rms_store_doubles((char *)(dst + i), 8, count, &v, 0);
    }
}

RMS_ALWAYS_INLINE void rms_store_weight(rms_kind wk, ptrdiff_t n, const double *src, char *dst,
                                        ptrdiff_t dst_stride)
{
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block v = rms_load_doubles(RMS_KIND_F64, (const char *)(src + i), 8, count);
        rms_store_narrowed(wk, rms_element_out(dst, i, dst_stride), dst_stride, count, &v, 0);
    }
}

/* ---- one table entry per type ------------------------------------------- */

#define RMS_ROW_KERNELS(name, x, weight)                                                   \
    static size_t forward_rows_##name(const rms_forward_problem *p, ptrdiff_t row_begin,   \
                                      ptrdiff_t row_end)                                   \
    {                                                                                      \
        return rms_forward_rows(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end);   \
    }                                                                                      \
    static void backward_rows_##name(const rms_backward_problem *p, ptrdiff_t row_begin,   \
                                     ptrdiff_t row_end, const double *weight,              \
                                     double *grad_weight_partial)                          \
    {                                                                                      \
        rms_backward_rows(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end, weight,  \
                          grad_weight_partial);                                            \
    }                                                                                      \
    static void plan_backward_rows_##name(const rms_backward_problem *p,                   \
                                          ptrdiff_t row_begin, ptrdiff_t row_end,          \
                                          const double *weight, rms_backward_plan *plans)  \
    {                                                                                      \
        rms_plan_backward_rows(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end,     \
                               weight, plans);                                             \
    }                                                                                      \
    static void write_backward_tile_##name(                                                \
        const rms_backward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end,             \
        const rms_backward_plan *plans, ptrdiff_t column_begin, ptrdiff_t column_end,      \
        const double *weight, double *grad_weight_tile)                                    \
    {                                                                                      \
        rms_write_backward_tile(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end,    \
                                plans, column_begin, column_end, weight,                   \
                                grad_weight_tile);                                         \
    }                                                                                      \
    static int prepare_forward_weight_##name(ptrdiff_t n, const char *w, ptrdiff_t ws,     \
                                             const double *offset, double *hi, double *lo, \
                                             float *floats)                                \
    {                                                                                      \
        return rms_prepare_forward_weight(RMS_KIND_##x, RMS_KIND_##weight, n, w, ws,       \
                                          offset, hi, lo, floats);                         \
    }                                                                                      \
    static void widen_weight_##name(ptrdiff_t n, const char *src, ptrdiff_t src_stride,    \
                                    double *dst)                                           \
    {                                                                                      \
        rms_widen_weight(RMS_KIND_##weight, n, src, src_stride, dst);                      \
    }                                                                                      \
    static void store_weight_##name(ptrdiff_t n, const double *src, char *dst,             \
                                    ptrdiff_t dst_stride)                                  \
    {                                                                                      \
        rms_store_weight(RMS_KIND_##weight, n, src, dst, dst_stride);                      \
    }
RMS_FOR_EACH_TYPE(RMS_ROW_KERNELS)
#undef RMS_ROW_KERNELS

#define RMS_TABLE_ENTRY(name, x, weight)                                                   \
    [RMS_##name] = {forward_rows_##name,       backward_rows_##name,                       \
                    plan_backward_rows_##name, write_backward_tile_##name,                 \
                    prepare_forward_weight_##name,                                         \
                    widen_weight_##name,       store_weight_##name},

#endif
