/*
 * The row's sums: lanes of double accumulators, their fixed-order total,
 * the squares and the backward's dot product added into them, how far a
 * plain sum may be from exact, and inv_rms of rows whose squares leave
 * double's range. Part of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_SUMS_H
#define RMSNORM_KERNELS_ROW_SUMS_H

/* RMS_LANES running sums, each with the error terms of a compensated sum;
   and, where the sums note it, the least square summed. */
typedef struct {
    rms_vd sum[RMS_ACCUMULATORS], comp[RMS_ACCUMULATORS];
    rms_vd least_square;
} rms_lanes;

RMS_ALWAYS_INLINE void rms_lanes_clear(rms_lanes *lanes)
{
    RMS_UNROLL
    for (int k = 0; k < RMS_ACCUMULATORS; k++) {
        lanes->sum[k] = rms_vd_set(0.0);
        lanes->comp[k] = rms_vd_set(0.0);
    }
    lanes->least_square = rms_vd_set(INFINITY);
}

/* A copy of lanes made a vector at a time. Lanes copied whole, or passed
   by address, live in memory: a write loop's would be loaded and stored
   at every step (the 16-bit forward from memory took a third longer), and
   a reduction into lanes behind a pointer, which the row's own char
   pointers may alias, the same. */
RMS_ALWAYS_INLINE rms_lanes rms_lanes_copy(const rms_lanes *lanes)
{
    rms_lanes copy;
    RMS_UNROLL
    for (int k = 0; k < RMS_ACCUMULATORS; k++) {
        copy.sum[k] = lanes->sum[k];
        copy.comp[k] = lanes->comp[k];
    }
    copy.least_square = lanes->least_square;
    return copy;
}

/* The smallest lane of v, whose lanes are not NaN. */
RMS_ALWAYS_INLINE double rms_vd_smallest_lane(rms_vd v)
{
    double lanes[RMS_VD_WIDTH];
    rms_vd_store((char *)lanes, v, 0);
    double smallest = lanes[0];
    for (int k = 1; k < RMS_VD_WIDTH; k++) {
        smallest = lanes[k] < smallest ? lanes[k] : smallest;
    }
    return smallest;
}

/* The larger of two magnitudes, a NaN's left out. */
static inline double rms_larger(double largest, double v)
{
    return fabs(v) > largest ? fabs(v) : largest;
}

/* The largest magnitude of n float64 values (NaNs left out): the portable
   float64 forward's, once for a weight. Four maxima a step, each waiting
   on its own last only: with one, the pass took a tenth of the portable
   forward of a row of 4096. */
RMS_NOINLINE double rms_largest_magnitude(ptrdiff_t n, const char *v, ptrdiff_t vs)
{
    double a = 0.0, b = 0.0, c = 0.0, d = 0.0;
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a = rms_larger(a, rms_load_scalar(RMS_KIND_F64, rms_element(v, i, vs)));
        b = rms_larger(b, rms_load_scalar(RMS_KIND_F64, rms_element(v, i + 1, vs)));
        c = rms_larger(c, rms_load_scalar(RMS_KIND_F64, rms_element(v, i + 2, vs)));
        d = rms_larger(d, rms_load_scalar(RMS_KIND_F64, rms_element(v, i + 3, vs)));
    }
    for (; i < n; i++) {
        a = rms_larger(a, rms_load_scalar(RMS_KIND_F64, rms_element(v, i, vs)));
    }
    return rms_larger(rms_larger(a, b), rms_larger(c, d));
}

/* The least nonzero magnitude of n float64 values, +inf where all are 0
   (NaNs left out), out of line: the float64 forward's alone. Each vector
   of a step keeps a least of its own: with one, each comparison waited on
   the one before, and the forward of a row of 4096, which finds its
   weight's, took a quarter longer. */
RMS_NOINLINE double rms_least_nonzero(ptrdiff_t n, const char *v, ptrdiff_t vs)
{
    const rms_kind kind = RMS_KIND_F64;
    rms_vd least[RMS_ACCUMULATORS];
    RMS_UNROLL
    for (int k = 0; k < RMS_ACCUMULATORS; k++) {
        least[k] = rms_vd_set(INFINITY);
    }
    ptrdiff_t i = 0;
    for (; i + RMS_LANES <= n; i += RMS_LANES) {
        RMS_UNROLL
        for (int b = 0; b < RMS_LANES / RMS_VF_WIDTH; b++) {
            const rms_block block = rms_load_doubles(
                kind, rms_element(v, i + b * RMS_VF_WIDTH, vs), vs, RMS_VF_WIDTH);
            RMS_UNROLL
            for (int h = 0; h < RMS_VD_PER_VF; h++) {
                rms_vd *at = &least[b * RMS_VD_PER_VF + h];
                *at = rms_vd_least_nonzero(*at, block.part[h]);
            }
        }
    }
    for (; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block block = rms_load_doubles(kind, rms_element(v, i, vs), vs, count);
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            least[h] = rms_vd_least_nonzero(least[h], block.part[h]);
        }
    }
    RMS_UNROLL
    for (int k = 1; k < RMS_ACCUMULATORS; k++) {
        least[0] = rms_vd_least_nonzero(least[0], least[k]);
    }
    return rms_vd_smallest_lane(least[0]);
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

/* Adds the squares of block b of RMS_LANES elements, times scale where
   scaled, into its lanes: compensated where the squares are not exact in
   double, or where asked for; and notes the block's least square where
   least says (rms_forward_row_plan says why): 0 where a value is 0, or below
   2^-537. One minimum a vector, of a square the sum makes anyway: the
   least nonzero magnitude itself takes two or more operations (the float64
   forward took a twentieth longer in cache). */
RMS_ALWAYS_INLINE void rms_add_block_squares(rms_kind xk, int compensated, rms_lanes *lanes, int b,
                                             const rms_block *v, int scaled, double scale,
                                             int least)
{
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd e = scaled ? rms_vd_mul(v->part[h], rms_vd_set(scale)) : v->part[h];
        if (least) { /* the square is the sum's own, made once: a NaN's leaves least */
            lanes->least_square = rms_vd_min(rms_vd_mul(e, e), lanes->least_square);
        }
        const int k = b * RMS_VD_PER_VF + h;
        /* a scaled square need not be exact */
        rms_vd_accumulate(compensated || !rms_kind_is_float_exact(xk),
                          rms_kind_is_float_exact(xk) && !scaled, &lanes->sum[k], &lanes->comp[k],
                          e, e);
    }
}

/* Adds the squares of x[i, i + count), count <= RMS_LANES, times scale
   where scaled, into lanes 0 to count - 1. */
RMS_ALWAYS_INLINE void rms_add_squares(rms_kind xk, int compensated, rms_lanes *lanes,
                                       const char *x, ptrdiff_t xs, ptrdiff_t i, ptrdiff_t count,
                                       int scaled, double scale, int least)
{
    RMS_UNROLL
    for (int b = 0; b < RMS_LANES / RMS_VF_WIDTH; b++) {
        const ptrdiff_t offset = (ptrdiff_t)b * RMS_VF_WIDTH;
        if (offset >= count) {
            break;
        }
        const ptrdiff_t block_count = count - offset < RMS_VF_WIDTH ? count - offset : RMS_VF_WIDTH;
        const rms_block v = rms_load_doubles(xk, rms_element(x, i + offset, xs), xs, block_count);
        rms_add_block_squares(xk, compensated, lanes, b, &v, scaled, scale, least);
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
        rms_add_squares(xk, compensated, &lanes, x, xs, i, RMS_LANES, scaled, scale, 0);
    }
    if (i < n) {
        rms_add_squares(xk, compensated, &lanes, x, xs, i, n - i, scaled, scale, 0);
    }
    return rms_lanes_total(&lanes, RMS_LANES, compensated || !rms_kind_is_float_exact(xk));
}

/* inv_rms of a row from a compensated sum of squares, as close to exact as
   float64's, for the rows whose plain sum cannot settle every output
   (rms_forward_row_plan); or from the exact sum, where a negative eps
   cancels the mean (rms_mean_cancels), for those and for float64's. Out of
   line: inlined, it cost the write loops registers. */
RMS_NOINLINE rms_dd rms_exact_inv_rms(rms_kind xk, ptrdiff_t n, const char *x, ptrdiff_t xs,
                                      double eps)
{
    const rms_dd sum = rms_sum_squares(xk, 1, n, x, xs, 0, 1.0);
    if (eps < 0.0 && rms_mean_cancels(sum.hi, n, eps)) {
        return rms_inv_rms_exactly(xk, n, x, xs, 1.0, eps);
    }
    return rms_inv_rms_from_sum(sum, (double)n, eps);
}

/*
 * How far, relative, inv_rms worked out from a plain sum of squares may be
 * from the exact sum's: the forward sums float32 and narrower in plain
 * double (rms_kind_is_float_exact: their squares are exact there), and
 * float64 compensated. The squares are nonnegative, and each passes through
 * at most ceil(n / RMS_LANES) adds in its lane and log2(RMS_LANES) in the
 * lanes' total, each a rounding of 2^-53 relative to a partial sum: k such
 * adds leave the sum within k 2^-53 / (1 - k 2^-53) of exact. mean + eps
 * carries that error times mean / (mean + eps), which is at most 1 unless
 * eps is negative, and the square root halves it; the factor 1 + 2^-20
 * covers the second-order terms and this bound's own roundings. Infinite
 * where mean + eps is not positive: the sum's error may decide its sign.
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
   RMS_DOT_LANES, into the first RMS_DOT_LANES lanes of each; and, where
   g_squares is not NULL, (grad_output * weight)^2 into its lanes. */
RMS_ALWAYS_INLINE void rms_add_squares_and_dot(rms_kind xk, rms_kind wk, rms_lanes *squares,
                                               rms_lanes *dot, rms_lanes *g_squares,
                                               const char *x, ptrdiff_t xs,
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
            rms_vd_accumulate(!rms_kind_is_float_exact(xk), 0, &squares->sum[k],
                              &squares->comp[k], xv.part[h], xv.part[h]);
            rms_vd_accumulate(compensated_dot, 0, &dot->sum[k], &dot->comp[k], g, xv.part[h]);
            if (g_squares != NULL) {
                rms_vd_accumulate(0, 0, &g_squares->sum[k], &g_squares->comp[k], g, g);
            }
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
 * square overflows or underflows. Narrower rows get here only as rows of
 * zeros, infinities or NaN. Rare, so out of line: the
 * compiler's own choice to inline it depended on unrelated code, and
 * moved each float64 rows loop's size by tens of kilobytes. The backward's
 * plan sends here too its rows whose eps cancels the mean, whose sum needs
 * no rescale: their inv_rms comes from the exact sum.
 */
RMS_NOINLINE rms_scaled_inv rms_inv_rms_scaled(rms_kind xk, ptrdiff_t n, const char *x,
                                                ptrdiff_t xs, double eps, rms_dd unscaled)
{
    rms_scaled_inv result = {{0.0, 0.0}, 0};
    if (!rms_sum_needs_rescale(unscaled.hi)) {
        result.inv = rms_inv_rms_exactly(xk, n, x, xs, 1.0, eps);
        return result;
    }
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
    if (xk != RMS_KIND_F64) {
        /* not reached: narrower squares are exact in double, and their
           sums far inside the safe range. Summing float64 alone below
           keeps one copy of the sums here, not one for each kind. */
        result.inv = rms_inv_rms_from_sum(unscaled, (double)n, eps);
        return result;
    }
    double scaled_eps = ldexp(eps, -2 * exponent);
    if (isinf(scaled_eps)) {
        /* eps dwarfs mean(x^2) by more than 2^1000: only eps counts. */
        rms_dd zero = {0.0, 0.0};
        result.inv = rms_inv_rms_from_sum(zero, (double)n, eps);
        return result;
    }
    const double scale = ldexp(1.0, -exponent);
    const rms_dd scaled = rms_sum_squares(RMS_KIND_F64, 0, n, x, xs, 1, scale);
    result.inv = scaled_eps < 0.0 && rms_mean_cancels(scaled.hi, n, scaled_eps)
                     ? rms_inv_rms_exactly(RMS_KIND_F64, n, x, xs, scale, scaled_eps)
                     : rms_inv_rms_from_sum(scaled, (double)n, scaled_eps);
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

#endif
