/*
 * The backward's rare rows, worked out of line with the kinds taken at
 * run time: a row whose inv_rms is infinite, and float64 rows whose sums
 * or means leave the range where the vector path is exact enough, worked
 * with scaled exponents. Part of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_BACKWARD_EXTREME_H
#define RMSNORM_KERNELS_ROW_BACKWARD_EXTREME_H

/*
 * The backward of a row whose inv_rms r is infinite (mean(x^2) + eps is
 * exactly 0, or 1 / rms passes DBL_MAX): torch's composite gradient taken
 * term by term, g w r - (r^3 / n) sum(g w x) x, each term inf or NaN, and
 * NaN where the two oppose, which no finite rearrangement of the usual
 * formula gives. grad_weight gains g x r. Rare enough to take the kinds at
 * run time, out of line.
 */
RMS_NOINLINE void rms_backward_row_unbounded(rms_kind xk, ptrdiff_t n,
                                             rms_backward_row_operands operands, double sum_g_x)
{
    const rms_backward_row_operands *o = &operands;
    const rms_vd r = rms_vd_set(INFINITY), minus_sum = rms_vd_set(-sum_g_x);
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        const rms_block go = rms_load_doubles(xk, rms_backward_grad_output_at(o, i),
                                              o->grad_output_stride, count);
        const rms_block xv = rms_load_doubles(xk, rms_backward_x_at(o, i), o->xs, count);
        const rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)(o->w + i), 8, count);
        rms_block gw =
            rms_load_doubles(RMS_KIND_F64, (const char *)(o->grad_weight + i), 8, count);
        rms_block residual, out;
        if (o->gr.add_residual) {
            residual =
                rms_load_doubles(xk, rms_backward_grad_residual_out_at(o, i), o->gr.stride, count);
        }
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            const rms_vd direct = rms_vd_mul(rms_vd_mul(go.part[h], wv.part[h]), r);
            const rms_vd through_r = rms_vd_mul(rms_vd_mul(minus_sum, r), xv.part[h]);
            out.part[h] = rms_vd_add(direct, through_r);
            if (o->gr.add_residual) {
                out.part[h] = rms_vd_add(out.part[h], residual.part[h]);
            }
            gw.part[h] = rms_vd_add(gw.part[h], rms_vd_mul(go.part[h], rms_vd_mul(xv.part[h], r)));
        }
        rms_store_doubles((char *)(o->grad_weight + i), 8, count, &gw, 0);
        rms_store_narrowed(xk, rms_backward_grad_input_at(o, i), o->grad_input_stride, count, &out,
                           0);
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
RMS_NOINLINE int rms_backward_extreme_plan(rms_kind xk, ptrdiff_t n,
                                           rms_backward_row_operands operands,
                                           rms_scaled_inv scaled, rms_backward_plan *plan)
{
    const rms_backward_row_operands *o = &operands;
    const double *w = o->w;
    for (ptrdiff_t j = 0; j < n; j++) {
        const double go = rms_load_scalar(xk, rms_backward_grad_output_at(o, j));
        const double xj = rms_load_scalar(xk, rms_backward_x_at(o, j));
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
            frexp(rms_load_scalar(xk, rms_backward_grad_output_at(o, j)), &e_go);
        const double term = go_sig * frexp(w[j], &e_w) *
                            frexp(rms_load_scalar(xk, rms_backward_x_at(o, j)), &e_x);
        if (term != 0.0 && e_go + e_w + e_x > e_max) {
            e_max = e_go + e_w + e_x;
        }
    }
    double sum = 0.0, sum_err = 0.0; /* compensated: n may be large */
    for (ptrdiff_t j = 0; e_max != INT_MIN && j < n; j++) {
        int e_go, e_w, e_x;
        const double go_sig =
            frexp(rms_load_scalar(xk, rms_backward_grad_output_at(o, j)), &e_go);
        const double term = go_sig * frexp(w[j], &e_w) *
                            frexp(rms_load_scalar(xk, rms_backward_x_at(o, j)), &e_x) * inv;
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
                                             ptrdiff_t count, rms_backward_row_operands operands)
{
    const rms_backward_row_operands *o = &operands;
    const double *w = o->w;
    if (plan->path == RMS_BACKWARD_ZERO_INV) {
        /* eps = +inf: inv_rms is 0, and so is every gradient's own term,
           however far sum(g w x) is past DBL_MAX (torch's 0 * inf is NaN) */
        for (ptrdiff_t i = 0; i < count; i++) {
            const double go = rms_load_scalar(xk, rms_backward_grad_output_at(o, i));
            double out = go * 0.0 * w[i]; /* 0 even where go * w would overflow */
            if (o->gr.add_residual) {
                out += rms_load_scalar(xk, rms_backward_grad_residual_out_at(o, i));
            }
            rms_store_scalar(xk, rms_backward_grad_input_at(o, i), out);
        }
        return;
    }
    const double inv = plan->inv, mean = plan->mean;
    const int k = plan->exponent, e_max = plan->e_max;
    for (ptrdiff_t i = 0; i < count; i++) {
        int e_go, e_w, e_x;
        const double go = rms_load_scalar(xk, rms_backward_grad_output_at(o, i));
        const double go_sig = frexp(go, &e_go), w_sig = frexp(w[i], &e_w);
        const double x_sig = frexp(rms_load_scalar(xk, rms_backward_x_at(o, i)), &e_x);
        /* inv g_i, less inv x_hat_i mean(g x_hat) (both 0 where sum is) */
        double out = rms_scaled_difference(inv * go_sig * w_sig, e_go + e_w + k,
                                           inv * inv * x_sig * mean,
                                           e_max == INT_MIN ? 0 : e_x + e_max + 3 * k);
        if (o->gr.add_residual) {
            out += rms_load_scalar(xk, rms_backward_grad_residual_out_at(o, i));
        }
        rms_store_scalar(xk, rms_backward_grad_input_at(o, i), out);
        o->grad_weight[i] += ldexp(go_sig * x_sig * inv, e_go + e_x + k);
    }
}

/* Whether some g_j w_j x_j of a float64 row is not 0: where their sum in
   double is 0, every product may have underflowed (grad_output near
   2^-1070) rather than cancelled, and mean(g x_hat) is then not the 0 the
   vector path would take. */
RMS_NOINLINE int rms_row_has_a_product(ptrdiff_t n, rms_backward_row_operands operands)
{
    const rms_backward_row_operands *o = &operands;
    for (ptrdiff_t j = 0; j < n; j++) {
        const double go = rms_load_scalar(RMS_KIND_F64, rms_backward_grad_output_at(o, j));
        const double xj = rms_load_scalar(RMS_KIND_F64, rms_backward_x_at(o, j));
        if (go != 0.0 && xj != 0.0 && o->w[j] != 0.0) {
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
                                                  const rms_backward_row_operands *o,
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
                rms_row_has_a_product(n, *o));
    }
    const int mean_binade = ilogb(dot) + ilogb(inv_rms.inv.hi) + inv_rms.exponent;
    return mean_binade < -960 || mean_binade > 960;
}

#endif
