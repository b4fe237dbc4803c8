/*
 * The backward: each row's reduction pass (its plan), then its write pass
 * of grad_input and grad_weight's terms, in double or float, and the rare
 * rows (an infinite inv_rms, extreme float64 rows); then the rows loops
 * that the table's entries call. Part of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_BACKWARD_H
#define RMSNORM_KERNELS_ROW_BACKWARD_H

/* A row of the backward's grad_residual_out, where add_residual, from the
   column where a write pass starts; left is how many of the row's
   columns are there from that one on, for the write loop's asks ahead. */
typedef struct {
    int add_residual;
    const char *data;
    ptrdiff_t stride, left;
} rms_grad_residual_out_row;

/* One backward row's operands from the column where its write pass
   starts: what the pass reads and writes, and the same row of the rows
   further on that a streamed pass asks for (ahead_*, NULL where there is
   none). w is the factor, offset + weight, as doubles; w_stored the stored
   weight, which the float path reads. Contiguous rows take the kind's
   size as every element stride, a constant the compiler folds. */
typedef struct {
    const char *grad_output, *x;
    char *grad_input;
    ptrdiff_t grad_output_stride, xs, grad_input_stride;
    rms_grad_residual_out_row gr;
    const double *w;
    const char *w_stored;
    ptrdiff_t ws;
    double *grad_weight;
    const char *ahead_grad_output, *ahead_x;
} rms_backward_row_operands;

/* The functions out of line take the operands by value: where their
   address reached one, the compiler kept a hot loop's operands in memory. */

/* A block's operands, `at` columns into the row's. */
RMS_ALWAYS_INLINE const char *rms_backward_grad_output_at(const rms_backward_row_operands *o,
                                                          ptrdiff_t at)
{
    return rms_element(o->grad_output, at, o->grad_output_stride);
}

RMS_ALWAYS_INLINE const char *rms_backward_x_at(const rms_backward_row_operands *o, ptrdiff_t at)
{
    return rms_element(o->x, at, o->xs);
}

RMS_ALWAYS_INLINE const char *rms_backward_grad_residual_out_at(const rms_backward_row_operands *o,
                                                            ptrdiff_t at)
{
    return rms_element(o->gr.data, at, o->gr.stride);
}

RMS_ALWAYS_INLINE char *rms_backward_grad_input_at(const rms_backward_row_operands *o,
                                                   ptrdiff_t at)
{
    return rms_element_out(o->grad_input, at, o->grad_input_stride);
}

/* The write pass's factors, the same for every block of a row: inv_rms
   and mean(g x_hat), in double, and in float for the float path. */
typedef struct {
    rms_vd inv_rms, mean;
    rms_vf inv_rms_float, minus_mean_float;
    int in_float;
} rms_backward_factors;

/*
 * grad_input = inv_rms * (g - x_hat * mean(g * x_hat)), g = grad_output * w,
 * for one block, in double; adds grad_output * x_hat into grad_weight.
 * This is inv_rms * g - inv_rms^3 / n * sum(g * x) * x rearranged so that no
 * intermediate leaves the range of x_hat and g: inv_rms^3 underflows for
 * rows near 1e160 while each factor here stays near 1. Where add_residual,
 * grad_residual_out (x's kind) is added before grad_input is rounded.
 */
RMS_ALWAYS_INLINE void rms_backward_block(rms_kind xk, const rms_backward_row_operands *o,
                                          ptrdiff_t at, ptrdiff_t count, rms_vd inv_rms,
                                          rms_vd mean_g_x_hat, int stream)
{
    const int add_residual = o->gr.add_residual;
    const rms_block grad_output_v =
        rms_load_doubles(xk, rms_backward_grad_output_at(o, at), o->grad_output_stride, count);
    const rms_block xv = rms_load_doubles(xk, rms_backward_x_at(o, at), o->xs, count);
    const rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)(o->w + at), 8, count);
    double *grad_weight = o->grad_weight + at;
    rms_block gw = rms_load_doubles(RMS_KIND_F64, (const char *)grad_weight, 8, count);
    rms_block out, residual_v;
    if (add_residual) {
        residual_v =
            rms_load_doubles(xk, rms_backward_grad_residual_out_at(o, at), o->gr.stride, count);
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
    rms_store_narrowed(xk, rms_backward_grad_input_at(o, at), o->grad_input_stride, count, &out,
                       stream);
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
RMS_ALWAYS_INLINE void rms_backward_block_float(rms_kind xk, rms_kind wk,
                                                const rms_backward_row_operands *o, ptrdiff_t at,
                                                ptrdiff_t count, rms_vf inv_rms,
                                                rms_vd inv_rms_double, rms_vf minus_mean_g_x_hat,
                                                int stream)
{
    const rms_vf grad_output_v =
        rms_load_floats(xk, rms_backward_grad_output_at(o, at), o->grad_output_stride, count);
    const rms_vf xv = rms_load_floats(xk, rms_backward_x_at(o, at), o->xs, count);
    const rms_vf wv = rms_load_floats(wk, rms_element(o->w_stored, at, o->ws), o->ws, count);
    const rms_vf x_hat = rms_vf_mul(xv, inv_rms);
    const rms_vf g = rms_vf_mul(grad_output_v, wv);
    const rms_vf centred = rms_vf_fma(x_hat, minus_mean_g_x_hat, g);
    const rms_vf out = o->gr.add_residual
                           ? rms_vf_fma(inv_rms, centred,
                                        rms_load_floats(xk, rms_backward_grad_residual_out_at(o, at),
                                                        o->gr.stride, count))
                           : rms_vf_mul(inv_rms, centred);
    const rms_vf grad_output_x = rms_vf_mul(grad_output_v, xv); /* exact for float16 */
    double *grad_weight = o->grad_weight + at;
    rms_block gw = rms_load_doubles(RMS_KIND_F64, (const char *)grad_weight, 8, count);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd product =
            xk == RMS_KIND_F16 ? rms_vd_widen(grad_output_x, h)
                               : rms_vd_mul(rms_vd_widen(grad_output_v, h), rms_vd_widen(xv, h));
        gw.part[h] = rms_vd_muladd(product, inv_rms_double, gw.part[h]);
    }
    rms_store_doubles((char *)grad_weight, 8, count, &gw, 0);
    rms_store_floats(xk, rms_backward_grad_input_at(o, at), o->grad_input_stride, count, out,
                     stream);
}

/* One block of the backward, `at` columns into the row, in float or in
   double. */
RMS_ALWAYS_INLINE void rms_backward_any_block(rms_kind xk, rms_kind wk,
                                              const rms_backward_factors *f,
                                              const rms_backward_row_operands *o, ptrdiff_t at,
                                              ptrdiff_t count, int stream)
{
    if (f->in_float) {
        rms_backward_block_float(xk, wk, o, at, count, f->inv_rms_float, f->inv_rms,
                                 f->minus_mean_float, stream);
    }
    else {
        rms_backward_block(xk, o, at, count, f->inv_rms, f->mean, stream);
    }
}

/*
 * The backward of a row whose inv_rms r is infinite (mean(x^2) + eps is
 * exactly 0, or 1 / rms passes DBL_MAX): torch's composite gradient taken term by term, g w r - (r^3 /
 * n) sum(g w x) x, each term inf or NaN, and NaN where the two oppose,
 * which no finite rearrangement of the usual formula gives. grad_weight
 * gains g x r. Rare enough to take the kinds at run time, out of line.
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

/* A backward row's reduction pass: sum(x^2) and sum(g w x), and from them
   the plan of its write pass. w_as_stored says whether o->w holds the stored
   weight as doubles, with no offset: only then may the float path read the
   stored weight instead. ask_for is a contiguous row of n elements that
   the pass asks for as it goes, or NULL: the row's grad_residual_out,
   which its write pass reads next (RMS_GRAD_RESIDUAL_AHEAD says why). */
RMS_ALWAYS_INLINE rms_backward_plan rms_backward_row_plan(rms_kind xk, rms_kind wk, ptrdiff_t n,
                                                          const rms_backward_row_operands *o,
                                                          int w_as_stored, double eps,
                                                          const char *ask_for)
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
        rms_add_squares_and_dot(xk, wk, &squares, &dot, o->x, o->xs, o->grad_output,
                                o->grad_output_stride, o->w, i, RMS_DOT_LANES);
    }
    if (i < n) {
        rms_add_squares_and_dot(xk, wk, &squares, &dot, o->x, o->xs, o->grad_output,
                                o->grad_output_stride, o->w, i, n - i);
    }
    const rms_dd sum_squares =
        rms_lanes_total(&squares, RMS_DOT_LANES, !rms_kind_is_float_exact(xk));
    const rms_dd sum_g_x = rms_lanes_total(&dot, RMS_DOT_LANES, rms_dot_is_compensated(xk, wk));
    rms_scaled_inv scaled = {{0.0, 0.0}, 0};
    if (rms_sum_needs_rescale(sum_squares.hi)) {
        scaled = rms_inv_rms_scaled(xk, n, o->x, o->xs, eps, sum_squares);
    }
    else {
        scaled.inv = rms_inv_rms_from_sum(sum_squares, (double)n, eps);
    }
    rms_backward_plan plan = {RMS_BACKWARD_VECTOR, 0, 0, 0, 0.0, 0.0};
    if (rms_backward_row_is_extreme(xk, n, o, scaled, sum_g_x) &&
        rms_backward_extreme_plan(xk, n, *o, scaled, &plan)) {
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
 * grad_residual_out in its write pass only, from memory: asked for a few
 * rows ahead only, as grad_output and x are, its loads still waited on
 * memory. The reduction pass asks for it too (docs/performance.md has the
 * figures).
 */
#define RMS_GRAD_RESIDUAL_AHEAD 512

/* A backward row's write pass over `count` elements, the whole row or one
   tile of it (every operand at the tile's first column). A streamed
   output's write loop also asks for the grad_output and x of a row further
   on (o->ahead_*), as rms_forward_write asks for the next row, and for
   grad_residual_out further on in its own row. */
RMS_ALWAYS_INLINE void rms_backward_row_write(rms_kind xk, rms_kind wk,
                                              const rms_backward_plan *plan, ptrdiff_t count,
                                              const rms_backward_row_operands *o, int stream)
{
    if (plan->path == RMS_BACKWARD_EXTREME || plan->path == RMS_BACKWARD_ZERO_INV) {
        rms_backward_extreme_write(xk, plan, count, *o);
        return;
    }
    if (plan->path == RMS_BACKWARD_UNBOUNDED) {
        rms_backward_row_unbounded(xk, count, *o, plan->mean);
        return;
    }
    /* the conditions that are constants fold the float path away for the
       types that never take it */
    const rms_backward_factors f = {
        rms_vd_set(plan->inv), rms_vd_set(plan->mean), rms_vf_set((float)plan->inv),
        rms_vf_set((float)-plan->mean), RMS_HAVE_FMA && rms_kind_size(xk) == 2 && plan->in_float};
    const ptrdiff_t size = rms_kind_size(xk);
    const ptrdiff_t head = rms_unaligned_head(o->grad_input, o->grad_input_stride, size, count);
    const int streamed =
        rms_can_stream(stream, rms_backward_grad_input_at(o, head), o->grad_input_stride, size);
    ptrdiff_t i;
    for (i = 0; i < head; i += RMS_VF_WIDTH) {
        rms_backward_any_block(xk, wk, &f, o, i, head - i < RMS_VF_WIDTH ? head - i : RMS_VF_WIDTH,
                               0);
    }
    for (i = head; i + RMS_LANES <= count; i += RMS_LANES) {
        if (streamed && o->ahead_x != NULL) {
            rms_prefetch(rms_element(o->ahead_grad_output, i, o->grad_output_stride),
                         RMS_LANES * o->grad_output_stride);
            rms_prefetch(rms_element(o->ahead_x, i, o->xs), RMS_LANES * o->xs);
        }
        if (streamed && o->gr.add_residual &&
            i + RMS_GRAD_RESIDUAL_AHEAD + RMS_LANES <= o->gr.left) {
            rms_prefetch(rms_backward_grad_residual_out_at(o, i + RMS_GRAD_RESIDUAL_AHEAD),
                         RMS_LANES * o->gr.stride);
        }
        for (ptrdiff_t b = 0; b < RMS_LANES; b += RMS_VF_WIDTH) {
            rms_backward_any_block(xk, wk, &f, o, i + b, RMS_VF_WIDTH, streamed);
        }
    }
    for (; i < count; i += RMS_VF_WIDTH) {
        rms_backward_any_block(xk, wk, &f, o, i,
                               count - i < RMS_VF_WIDTH ? count - i : RMS_VF_WIDTH, 0);
    }
}

/* Row r's operands from column `column` on, asking ahead `ahead` rows
   (0: none). The weight's fields are the caller's to fill. */
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
    o.w = NULL; /* the weight's, where a write pass needs them */
    o.w_stored = NULL;
    o.ws = 0;
    o.grad_weight = NULL;
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
   out). Where they are, the strides are constants, which the 16-bit write
   loop needs to keep no addresses of its own a step. */
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
        rms_backward_row_operands o = rms_backward_row_at(xk, add_residual, contiguous, p, r, 0, 0);
        o.w = weight;
        /* NULL a constant where nothing is asked for, so that the
           reduction loop tests nothing */
        plans[r - row_begin] =
            ask ? rms_backward_row_plan(xk, wk, p->n, &o, w_as_stored, eps, o.gr.data)
                : rms_backward_row_plan(xk, wk, p->n, &o, w_as_stored, eps, NULL);
    }
}

/*
 * How many rows of float32 x the backward writes together, and in how
 * many columns at a time. A row's write pass reads the weight and reads and
 * writes grad_weight, 24 bytes of doubles a column, twice its own
 * operands' 12; with those, past about 1700 columns (48 KiB of L1) the
 * doubles no longer stay in L1 from one row to the next. Rows written
 * together, a step of columns each in turn, find that step's doubles in
 * L1. The row order, and so every sum, is the same. Only float32 gains:
 * 16-bit rows are written in float, where the conversions, not the
 * doubles, set the pace, and float64 rows' own operands are as wide as the
 * doubles (docs/performance.md has the figures).
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
            rms_backward_row_operands o = rms_backward_row_at(
                xk, add_residual, contiguous, p, r, c,
                streamed && r + ahead < ahead_end ? ahead : 0);
            o.w = weight + c;
            o.w_stored = rms_element(p->weight, c, ws);
            o.ws = ws;
            o.grad_weight = grad_weight_tile + (c - column_begin);
            rms_backward_row_write(xk, wk, &plans[r - row_begin], count, &o, streamed);
        }
    }
}

/* The reduction passes of rows [row_begin, row_end), contiguous or not. */
RMS_ALWAYS_INLINE void rms_plan_backward_rows(rms_kind xk, rms_kind wk,
                                              const rms_backward_problem *p, ptrdiff_t row_begin,
                                              ptrdiff_t row_end, const double *weight,
                                              rms_backward_plan *plans)
{
    const int add_residual = p->grad_residual_out.data != NULL;
    if (!RMS_STRIDED_ROWS || rms_backward_is_contiguous(xk, wk, add_residual, p)) {
        rms_plan_backward_rows_of(xk, wk, 1, p, row_begin, row_end, weight, plans);
    }
    else {
        rms_plan_backward_rows_of(xk, wk, 0, p, row_begin, row_end, weight, plans);
    }
}

/* rms_write_backward_rows, contiguous or not. */
RMS_ALWAYS_INLINE void rms_write_backward_rows_any(
    rms_kind xk, rms_kind wk, const rms_backward_problem *p, ptrdiff_t row_begin,
    ptrdiff_t row_end, const rms_backward_plan *plans, ptrdiff_t column_begin,
    ptrdiff_t column_end, const double *weight, double *grad_weight_tile, ptrdiff_t ahead,
    ptrdiff_t ahead_end)
{
    const int add_residual = p->grad_residual_out.data != NULL;
    if (!RMS_STRIDED_ROWS || rms_backward_is_contiguous(xk, wk, add_residual, p)) {
        rms_write_backward_rows(xk, wk, add_residual, 1, p, row_begin, row_end, plans,
                                column_begin, column_end, weight, grad_weight_tile, ahead,
                                ahead_end);
    }
    else {
        rms_write_backward_rows(xk, wk, add_residual, 0, p, row_begin, row_end, plans,
                                column_begin, column_end, weight, grad_weight_tile, ahead,
                                ahead_end);
    }
}

/* The two passes, a function each for each type: the untiled backward
   and the tiled one's two steps (kernels.h) call the same code, once a
   few rows, rather than each inline a copy. Indexed by constants, a
   direct call. */
typedef void (*rms_plan_backward_fn)(const rms_backward_problem *p, ptrdiff_t row_begin,
                                     ptrdiff_t row_end, const double *weight,
                                     rms_backward_plan *plans);
typedef void (*rms_write_backward_fn)(const rms_backward_problem *p, ptrdiff_t row_begin,
                                      ptrdiff_t row_end, const rms_backward_plan *plans,
                                      ptrdiff_t column_begin, ptrdiff_t column_end,
                                      const double *weight, double *grad_weight_tile,
                                      ptrdiff_t ahead, ptrdiff_t ahead_end);
#define RMS_BACKWARD_PASSES(name, x, weight)                                                  \
    RMS_NOINLINE void rms_plan_backward_##name(const rms_backward_problem *p,                  \
                                               ptrdiff_t row_begin, ptrdiff_t row_end,         \
                                               const double *w, rms_backward_plan *plans)      \
    {                                                                                         \
        rms_plan_backward_rows(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end, w,     \
                               plans);                                                        \
    }                                                                                         \
    RMS_NOINLINE void rms_write_backward_##name(                                              \
        const rms_backward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end,                \
        const rms_backward_plan *plans, ptrdiff_t column_begin, ptrdiff_t column_end,         \
        const double *w, double *grad_weight_tile, ptrdiff_t ahead, ptrdiff_t ahead_end)      \
    {                                                                                         \
        rms_write_backward_rows_any(RMS_KIND_##x, RMS_KIND_##weight, p, row_begin, row_end,   \
                                    plans, column_begin, column_end, w, grad_weight_tile,     \
                                    ahead, ahead_end);                                        \
    }
RMS_FOR_EACH_TYPE(RMS_BACKWARD_PASSES)
#undef RMS_BACKWARD_PASSES
#define RMS_PLAN_BACKWARD_ENTRY(name, x, weight)                                              \
    [RMS_KIND_##x][RMS_KIND_##weight] = rms_plan_backward_##name,
#define RMS_WRITE_BACKWARD_ENTRY(name, x, weight)                                             \
    [RMS_KIND_##x][RMS_KIND_##weight] = rms_write_backward_##name,
static const rms_plan_backward_fn rms_plan_backward[4][4] = {
    RMS_FOR_EACH_TYPE(RMS_PLAN_BACKWARD_ENTRY)};
static const rms_write_backward_fn rms_write_backward[4][4] = {
    RMS_FOR_EACH_TYPE(RMS_WRITE_BACKWARD_ENTRY)};
#undef RMS_PLAN_BACKWARD_ENTRY
#undef RMS_WRITE_BACKWARD_ENTRY

/* The backward's rows, reduced and then written while still in cache, a
   few together (rms_backward_rows_together), with or without
   grad_residual_out (add_residual: a test per block, well predicted; a
   code path each would double the backward's compile time). */
RMS_ALWAYS_INLINE void rms_backward_rows(rms_kind xk, rms_kind wk, const rms_backward_problem *p,
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
        rms_plan_backward[xk][wk](p, r, end, weight, plans);
        rms_write_backward[xk][wk](p, r, end, plans, 0, p->n, weight, grad_weight_partial, ahead,
                                   ahead_end);
    }
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence();
    }
}

/* The tiled backward's second step: the rows' write passes over one tile
   of columns. A streamed write pass asks for the same tile of the next
   chunk's rows, which the rows' reduction passes will read next. */
RMS_ALWAYS_INLINE void rms_write_backward_tile(rms_kind xk, rms_kind wk,
                                               const rms_backward_problem *p,
                                               ptrdiff_t row_begin, ptrdiff_t row_end,
                                               const rms_backward_plan *plans,
                                               ptrdiff_t column_begin, ptrdiff_t column_end,
                                               const double *weight, double *grad_weight_tile)
{
    rms_write_backward[xk][wk](p, row_begin, row_end, plans, column_begin, column_end, weight,
                               grad_weight_tile, row_end - row_begin, p->ahead_end);
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence();
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

#endif
