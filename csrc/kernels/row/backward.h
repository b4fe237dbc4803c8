/*
 * The backward: each row's reduction pass (its plan) and write pass, and
 * the table's two entries that run them over a few rows (kernels.h). Part
 * of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_BACKWARD_H
#define RMSNORM_KERNELS_ROW_BACKWARD_H

/* Whether a row's reduction pass sums g^2 (g = grad_output * w): every
   16-bit row's where its write may go in float, which sum bounds g
   (rms_16bit_row_fits_float). The other kinds have no float path. */
RMS_ALWAYS_INLINE int rms_row_sums_g_squares(rms_kind xk)
{
    return RMS_HAVE_FMA && rms_kind_size(xk) == 2;
}

/*
 * Whether a 16-bit row's gradient cancels too far for its write in float:
 * grad_input = inv_rms * c with c = g - x_hat * mean, and where c is far
 * smaller than g (a row along x, such as a constant one), float's
 * roundings of the terms, 2^-24 of them, can outweigh it. In norm,
 * x_hat * mean is q times g's projection on x_hat, with sum(x_hat^2) = n q
 * (q is 1 where eps is 0, and near 1 wherever a row is near the threshold
 * below), so the roundings come to about 2^-22 |g|; and sum(c^2) =
 * sum(g^2) - n mean^2 (2 - q) says how small c is. The float path keeps
 * the rows where |c| >= 2^-9 |g|, whose error is then about 2^-13 of |c|,
 * and the others go in double. The test is the row's, in norm: an element
 * that cancels alone, in a row that does not, keeps its float error, about
 * 2^-22 |g| / RMS (docs/accuracy.md). The difference's own rounding, and
 * the sums', a few 2^-53 of sum(g^2) (below n = 2^35), are far below the
 * threshold.
 */
RMS_ALWAYS_INLINE int rms_gradient_cancels_in_float(ptrdiff_t n, double inv_rms,
                                                     double sum_squares, double mean,
                                                     double sum_g_squares)
{
    const double q = inv_rms * inv_rms * sum_squares / (double)n;
    const double sum_c_squares = sum_g_squares - (double)n * mean * mean * (2.0 - q);
    return sum_c_squares < 0x1p-18 * sum_g_squares;
}

/*
 * Whether a bfloat16 row's write in float gives what its write in double
 * would, to well under an ulp, as far as float's subnormal range goes:
 * each rounding below 2^-126 is off by up to 2^-150 (where g, x_hat or
 * centred is that small), and the output carries those errors times
 * inv_rms, or inv_rms * |mean| for x_hat's: with inv_rms (2 + |mean|) <=
 * 2^12 they come to at most 2^-138, a thirty-second of bfloat16's least
 * ulp. The mean itself is rounded to a float, which must be 0 or normal: a
 * subnormal one's error, up to 2^-150, would reach the output times
 * inv_rms |x_hat|, which nothing above bounds (x = [8, 2^-40, 0, ...] with
 * eps just above -4 made a grad_input of -1.75 * 2^-126 come out 0). The
 * other rows go in double: rows of very small x (inv_rms past 2^11) or
 * very large gradients. float16's factors stay inside float's normal
 * range (2^-48 to 2^32 for g with a float16 weight, x * inv_rms above
 * 2^-124).
 */
RMS_ALWAYS_INLINE int rms_bfloat16_row_fits_float(double inv_rms, double mean)
{
    return inv_rms * (2.0 + fabs(mean)) <= 0x1p12 && (mean == 0.0 || fabs(mean) >= 0x1p-126);
}

/*
 * Whether a 16-bit row's write in float gives what its write in double
 * would, to well under an ulp: where g and x_hat * mean, and so centred
 * and the output, cannot pass float's range, and where its gradient does
 * not cancel. Bounding every |g| by 2^126 through their sum of squares
 * keeps centred = g - x_hat * mean below 2^126 + 2^116 (|x_hat| <=
 * sqrt(n) where eps >= 0, |mean| <= 2^100): bfloat16 and a float32 weight
 * have float's range, and their g could pass it.
 */
RMS_ALWAYS_INLINE int rms_16bit_row_fits_float(rms_kind xk, ptrdiff_t n, double inv_rms,
                                               double sum_squares, double mean,
                                               double sum_g_squares)
{
    return sum_g_squares <= 0x1p252 &&
           !rms_gradient_cancels_in_float(n, inv_rms, sum_squares, mean, sum_g_squares) &&
           (xk != RMS_KIND_BF16 || rms_bfloat16_row_fits_float(inv_rms, mean));
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
    rms_lanes squares, dot, g_squares;
    rms_lanes_clear(&squares);
    rms_lanes_clear(&dot);
    rms_lanes_clear(&g_squares);
    /* a constant: the other kinds sum no g^2 */
    rms_lanes *const g_squares_if = rms_row_sums_g_squares(xk) ? &g_squares : NULL;
    const ptrdiff_t size = rms_kind_size(xk);
    ptrdiff_t i = 0;
    for (; i + RMS_DOT_LANES <= n; i += RMS_DOT_LANES) {
        if (ask_for != NULL) {
            rms_prefetch(rms_element(ask_for, i, size), RMS_DOT_LANES * size);
        }
        rms_add_squares_and_dot(xk, wk, &squares, &dot, g_squares_if, o->x, o->xs, o->grad_output,
                                o->grad_output_stride, o->w, i, RMS_DOT_LANES);
    }
    if (i < n) {
        rms_add_squares_and_dot(xk, wk, &squares, &dot, g_squares_if, o->x, o->xs, o->grad_output,
                                o->grad_output_stride, o->w, i, n - i);
    }
    const rms_dd sum_squares =
        rms_lanes_total(&squares, RMS_DOT_LANES, !rms_kind_is_float_exact(xk));
    const rms_dd sum_g_x = rms_lanes_total(&dot, RMS_DOT_LANES, rms_dot_is_compensated(xk, wk));
    rms_scaled_inv scaled = {{0.0, 0.0}, 0};
    if (rms_sum_needs_rescale(sum_squares.hi) ||
        (eps < 0.0 && rms_mean_cancels(sum_squares.hi, n, eps))) {
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
    if (plan.in_float) {
        const double sum_g_squares = rms_lanes_total(&g_squares, RMS_DOT_LANES, 0).hi;
        plan.in_float =
            rms_16bit_row_fits_float(xk, n, inv_rms, sum_squares.hi, plan.mean, sum_g_squares);
    }
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

/* Whether the contiguous rows loop takes the problem: every element
   stride is its kind's size, the weight's too (the driver packs a strided
   weight, so that it is unless memory ran out), or this build has no
   strided loop (RMS_STRIDED_ROWS). Where they are, the strides are
   constants, which the 16-bit write loop needs to keep no addresses of
   its own a step. */
RMS_ALWAYS_INLINE int rms_backward_rows_are_contiguous(rms_kind xk, rms_kind wk,
                                                       const rms_backward_problem *p)
{
    const ptrdiff_t es = rms_kind_size(xk);
    return !RMS_STRIDED_ROWS ||
           (p->grad_output.stride == es && p->x.stride == es && p->grad_input.stride == es &&
            p->weight_stride == rms_kind_size(wk) &&
            (p->grad_residual_out.data == NULL || p->grad_residual_out.stride == es));
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

/* The write passes of the planned rows [row_begin, row_end) over columns
   [column_begin, column_end), with grad_weight_partial at column_begin. A
   streamed row asks for the row `ahead` rows on, where that is before
   ahead_end. */
RMS_ALWAYS_INLINE void rms_write_backward_rows(
    rms_kind xk, rms_kind wk, int add_residual, int contiguous, const rms_backward_problem *p,
    ptrdiff_t row_begin, ptrdiff_t row_end, const rms_backward_plan *plans,
    ptrdiff_t column_begin, ptrdiff_t column_end, const double *weight, double *grad_weight_partial,
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
            o.grad_weight = grad_weight_partial + (c - column_begin);
            rms_backward_row_write(xk, wk, &plans[r - row_begin], count, &o, streamed);
        }
    }
}

/* The two steps of the backward, a table entry each for each type: out of
   line, so that the driver's two loops, over a few rows at a time and over
   a chunk's tiles, call one copy of each. Each runs the contiguous rows
   loop or the strided one, a constant each; the write's is with or without
   grad_residual_out (add_residual: a test per block, well predicted; a
   code path each would double the backward's compile time), and with
   fence, the fence that its streamed stores need. Plain static, not
   RMS_NOINLINE: only the table calls them, and gcc folds the ones that
   compile to the same code into one (a 16-bit x's plan reads the weight
   widened to doubles, so a float32 weight's is its own kind's), which it
   does not do for a noinline function: 50 KB less machine code. */
#define RMS_BACKWARD_STEPS(name, x, weight)                                                   \
    static void plan_backward_rows_##name(const rms_backward_problem *p,                      \
                                          ptrdiff_t row_begin, ptrdiff_t row_end,             \
                                          const double *w, rms_backward_plan *plans)          \
    {                                                                                         \
        const rms_kind xk = RMS_KIND_##x, wk = RMS_KIND_##weight;                             \
        if (rms_backward_rows_are_contiguous(xk, wk, p)) {                                    \
            rms_plan_backward_rows_of(xk, wk, 1, p, row_begin, row_end, w, plans);            \
        }                                                                                     \
        else {                                                                                \
            rms_plan_backward_rows_of(xk, wk, 0, p, row_begin, row_end, w, plans);            \
        }                                                                                     \
    }                                                                                         \
    static void write_backward_rows_##name(                                                   \
        const rms_backward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end,                \
        const rms_backward_plan *plans, ptrdiff_t column_begin, ptrdiff_t column_end,         \
        const double *w, double *grad_weight_partial, ptrdiff_t ahead, ptrdiff_t ahead_end,   \
        int fence)                                                                            \
    {                                                                                         \
        const rms_kind xk = RMS_KIND_##x, wk = RMS_KIND_##weight;                             \
        const int add_residual = p->grad_residual_out.data != NULL;                           \
        if (rms_backward_rows_are_contiguous(xk, wk, p)) {                                    \
            rms_write_backward_rows(xk, wk, add_residual, 1, p, row_begin, row_end, plans,    \
                                    column_begin, column_end, w, grad_weight_partial, ahead,  \
                                    ahead_end);                                               \
        }                                                                                     \
        else {                                                                                \
            rms_write_backward_rows(xk, wk, add_residual, 0, p, row_begin, row_end, plans,    \
                                    column_begin, column_end, w, grad_weight_partial, ahead,  \
                                    ahead_end);                                               \
        }                                                                                     \
        if (RMS_HAVE_STREAM && fence && p->stream_output) {                                   \
            rms_stream_fence();                                                               \
        }                                                                                     \
    }
RMS_FOR_EACH_TYPE(RMS_BACKWARD_STEPS)
#undef RMS_BACKWARD_STEPS

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
