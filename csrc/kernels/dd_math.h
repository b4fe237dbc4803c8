/*
 * Double-double helpers for the per-row scalar work.
 *
 * A row's sum of squares is carried as hi + lo so that a float64 row keeps
 * the extra bits that rounding each output once needs; inv_rms is then
 * refined with one Newton step in double-double. All of this runs once per
 * row, so it costs nothing next to the memory traffic of the row itself.
 *
 * Included by every instruction-set build of the kernels, after its target
 * pragma, so fma() is a single instruction where the target has one.
 */
#ifndef RMSNORM_KERNELS_DD_MATH_H
#define RMSNORM_KERNELS_DD_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd/common.h"

typedef struct {
    double hi, lo;
} rms_dd;

/* s + err == a + b exactly (Knuth's branch-free two-sum). */
RMS_ALWAYS_INLINE double rms_two_sum(double a, double b, double *err)
{
    double s = a + b;
    double b_virtual = s - a;
    *err = (a - (s - b_virtual)) + (b - b_virtual);
    return s;
}

/* Sums `count` lane pairs (sum, comp), count a power of two, in a fixed
   order; the lanes are used up. Pairwise, level by level, so that each
   level is one vector operation rather than a chain of count dependent
   additions (a twentieth of the float32 forward at 32x4096). */
RMS_ALWAYS_INLINE rms_dd rms_dd_sum_lanes(int count, double *sum, double *comp)
{
    for (int half = count / 2; half >= 1; half /= 2) {
        for (int k = 0; k < half; k++) {
            double err;
            sum[k] = rms_two_sum(sum[k], sum[k + half], &err);
            comp[k] += comp[k + half] + err;
        }
    }
    rms_dd total;
    if (!isfinite(sum[0])) {
        /* inf or NaN: the error terms are NaN (inf - inf), and would turn
           an infinite sum into NaN */
        total.hi = sum[0];
        total.lo = 0.0;
        return total;
    }
    total.hi = rms_two_sum(sum[0], comp[0], &total.lo);
    return total;
}

/* 1 / sqrt(t.hi + t.lo) as hi + lo, good to well past double precision:
   the float64 write pass multiplies by both parts. A t outside [2^-900,
   2^900] is scaled by 2^-+1000 first (exact): the Newton step squares r,
   which overflows for t below 2^-1024 and goes subnormal, losing bits,
   for t above 2^990. Scaled without recursion, so that it inlines into
   every row's code: a call there makes the caller spill its vector
   registers. */
RMS_ALWAYS_INLINE rms_dd rms_dd_rsqrt(rms_dd t)
{
    double unscale = 1.0;
    if (t.hi > 0.0 && (t.hi < 0x1p-900 || (t.hi > 0x1p900 && !isinf(t.hi)))) {
        const int small = t.hi < 1.0;
        t.hi *= small ? 0x1p1000 : 0x1p-1000;
        t.lo *= small ? 0x1p1000 : 0x1p-1000;
        unscale = small ? 0x1p500 : 0x1p-500;
    }
    rms_dd r = {1.0 / sqrt(t.hi), 0.0};
    if (!(t.hi > 0.0) || !(r.hi > 0.0) || isinf(t.hi)) {
        return r; /* 0, negative, NaN or inf: nothing to refine */
    }
    /* Newton step r += r * (1 - t r^2) / 2, with t r^2 formed exactly. */
    double r2 = r.hi * r.hi;
    double r2_err = fma(r.hi, r.hi, -r2);
    double p = t.hi * r2;
    double p_err = fma(t.hi, r2, -p) + t.hi * r2_err + t.lo * r2;
    double residual = (1.0 - p) - p_err;
    r.lo = r.hi * (0.5 * residual);
    r.hi *= unscale;
    r.lo *= unscale;
    return r;
}

/* 1 / sqrt(sum_squares / n + eps), for a sum that neither overflows nor
   underflows. */
RMS_ALWAYS_INLINE rms_dd rms_inv_rms_from_sum(rms_dd sum_squares, double n, double eps)
{
    /* mean = sum / n in double-double: q + the exact remainder over n. */
    double q = sum_squares.hi / n;
    double remainder = fma(-q, n, sum_squares.hi) + sum_squares.lo;
    rms_dd t;
    double err;
    t.hi = rms_two_sum(q, eps, &err);
    if (!isfinite(t.hi)) {
        /* eps = inf gives inv_rms 0, as 1 / sqrt(inf) is 0 in torch; the
           error terms would be NaN (inf - inf) */
        t.lo = 0.0;
        return rms_dd_rsqrt(t);
    }
    t.lo = err + remainder / n;
    t.hi = rms_two_sum(t.hi, t.lo, &t.lo);
    return rms_dd_rsqrt(t);
}

/* (s + t) * 2^k rounded once to double, where s + t is a double-double
   with t within half an ulp of s (s is their sum rounded to nearest).
   Scaling s is exact unless the result is subnormal; there it rounds to
   the subnormal grid, and t decides the one case that rounding cannot see:
   s exactly halfway between two neighbours on that grid. Overflow to inf
   is right as it is: s rounds as the exact sum does. s is a normal double
   far from both ends of the range (its callers' are near 1). */
static inline double rms_dd_ldexp(double s, double t, int k)
{
    const double r = ldexp(s, k);
    if (!(fabs(r) <= 0x1p-1022) || t == 0.0) { /* DBL_MIN itself may be a tie's */
        return r;
    }
    const double off = s - ldexp(r, -k); /* exact: both on s's grid */
    const double half_step = ldexp(1.0, -1075 - k); /* half the grid's step, scaled back */
    if (fabs(off) == half_step && (off > 0.0) == (t > 0.0)) {
        return nextafter(r, off > 0.0 ? INFINITY : -INFINITY);
    }
    return r;
}

/* sum, the double nearest sum + *err (a two-sum's), made the one nearest
   sum + *err + lost, a far smaller part: they differ where sum + *err is
   halfway between sum and its neighbour toward *err and lost points there
   too (with an offset, 3 (w - 1) just under the tie of DBL_MAX and 2^1024
   rounded up to inf). *err becomes what the double returned leaves out. */
static inline double rms_tie_broken(double sum, double *err, double lost)
{
    if (lost == 0.0 || *err == 0.0 || (lost > 0.0) != (*err > 0.0)) {
        return sum;
    }
    const double toward = nextafter(sum, *err > 0.0 ? INFINITY : -INFINITY);
    if (2.0 * *err != toward - sum) { /* both exact: not a tie */
        return sum;
    }
    *err = -*err;
    return toward;
}

/* Sums of squares outside [2^-900, 2^900] (or NaN) are recomputed on a
   scaled row: squares of float64 values overflow or lose bits there. */
RMS_ALWAYS_INLINE int rms_sum_needs_rescale(double sum_squares)
{
    return !(sum_squares <= 0x1p900) || sum_squares < 0x1p-900;
}

#endif
