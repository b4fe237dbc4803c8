/*
 * The forward's rows: inv_rms of each and its write mode, the rare rows
 * (extreme float64 rows, rows written again from an exact sum), the weight
 * as the write passes read it, and the rows loop that the table's entry
 * calls. Part of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_FORWARD_ROWS_H
#define RMSNORM_KERNELS_ROW_FORWARD_ROWS_H

/*
 * y for a float64 row whose inv_rms leaves double's normal range (its
 * largest element past about 2^1000 or below 2^-1000, with eps too small
 * to matter): one element at a time, since such rows are rare, each
 * rounded once by rms_forward_element_scaled, with inv_rms = inv * 2^k.
 * Where x or w is 0, inf or NaN, y is x * w,
 * its sign and its inf or NaN as torch's, since inv_rms is positive and
 * finite. Returns the next row's sum of squares, as rms_forward_write
 * does.
 */
RMS_NOINLINE rms_row_sums rms_forward_row_extreme(rms_kind wk, int with_residual, ptrdiff_t n,
                                                  const char *x, ptrdiff_t xs,
                                                  const rms_row_weight *w, char *y, ptrdiff_t ys,
                                                  rms_scaled_inv inv, const rms_row_source *next)
{
    for (ptrdiff_t i = 0; i < n; i++) {
        const double xi = rms_load_scalar(RMS_KIND_F64, rms_element(x, i, xs));
        const double w_hi = w->lo != NULL ? w->hi[i]
                                          : rms_load_scalar(wk, rms_element(w->data, i, w->stride));
        double yi = xi * w_hi; /* the zeros, infs and NaNs; x * w itself may not fit */
        if (isfinite(xi) && isfinite(w_hi) && xi != 0.0 && w_hi != 0.0) {
            yi = rms_forward_element_scaled(xi, w_hi, w->lo != NULL ? w->lo[i] : 0.0, inv.inv,
                                            inv.exponent);
        }
        memcpy(rms_element_out(y, i, ys), &yi, sizeof yi);
    }
    return rms_reduce_row(RMS_KIND_F64, with_residual, n, next);
}

/* A remade row's residual_out, written before its write pass: for the
   rare rows whose inv_rms is worked out from the values again
   (rms_forward_row_plan). */
RMS_NOINLINE void rms_write_residual_out(rms_kind xk, ptrdiff_t n, const rms_row_source *row)
{
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        (void)rms_make_residual_out(
            xk, rms_element(row->x, i, row->x_stride), row->x_stride,
            rms_element(row->residual, i, row->residual_stride), row->residual_stride,
            rms_element_out(row->residual_out, i, row->residual_out_stride),
            row->residual_out_stride, count);
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
 * path is float32's alone. With an offset, float32 rows in that range take
 * it where the offset + weight's floats may be used (rms_offset_weight),
 * or, without fused multiply-adds, rms_forward_block_offset32, which needs
 * x * inv_rms.hi a normal double.
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
    else if (xk == RMS_KIND_F32 && w->with_offset && in_float_range &&
             (!RMS_HAVE_FMA || w->floats != NULL)) {
        return RMS_WRITE_OFFSET32;
    }
    else if (w->with_offset && in_float_range && rms_offset_in_floats(xk, wk, w->offset)) {
        return RMS_WRITE_OFFSET32_IN_BLOCKS;
    }
    else if (RMS_HAVE_FMA && xk == RMS_KIND_F32 && wk == RMS_KIND_F32 && !w->with_offset &&
             in_float_range) {
        return RMS_WRITE_FLOAT;
    }
    return w->with_offset || isinf(inv_rms.hi) ? RMS_WRITE_DOUBLE_OUT_OF_LINE : RMS_WRITE_DOUBLE;
}

/*
 * A row's plan from its sum of squares, where that needs no rescale. A
 * plain sum (of float32 or narrower) is within rms_sum_error of exact. The
 * fast writes take that into account: they widen their brackets by it,
 * and the double path that writes the blocks they are unsure of notes in
 * unsure those where an output may round otherwise than the exact one.
 * The caller then writes those again (rms_forward_row_exactly) from an
 * exact sum of the row's values, which are still in memory: x, or
 * residual_out, all written by the end of the write. Elsewhere the sum is
 * made exact first (*exact_first): where y is written over x, which
 * leaves nothing to sum again; where sum_error passes RMS_SUM_ERROR_LIMIT;
 * and where every block is written in double, for which a compensated
 * pass costs less than checking every block (the portable float32 forward
 * took twice as long).
 */
RMS_ALWAYS_INLINE rms_row_plan rms_row_plan_of(rms_kind xk, rms_kind wk, int with_residual,
                                               ptrdiff_t n, const char *x, ptrdiff_t xs,
                                               const rms_row_weight *w, double eps,
                                               rms_dd sum_squares, const char *y, ptrdiff_t ys,
                                               int *exact_first)
{
    rms_row_plan plan = {.sum_error = 0.0};
    /* a plain sum's error counts in sum_error (below); float64's
       compensated one is exact enough unless eps cancels its mean */
    const int cancels = !rms_kind_is_float_exact(xk) && eps < 0.0 &&
                        rms_mean_cancels(sum_squares.hi, n, eps);
    plan.inv_rms = cancels ? rms_exact_inv_rms(xk, n, x, xs, eps)
                           : rms_inv_rms_from_sum(sum_squares, (double)n, eps);
    plan.mode = rms_write_mode_of(xk, wk, w, plan.inv_rms);
    *exact_first = 0;
    if (rms_kind_is_float_exact(xk)) {
        plan.sum_error = rms_sum_error(n, sum_squares.hi, eps);
        *exact_first = plan.sum_error > RMS_SUM_ERROR_LIMIT || !rms_mode_is_fast(plan.mode) ||
                       (!with_residual && rms_rows_overlap(x, xs, y, ys, n, rms_kind_size(xk)));
    }
    return plan;
}

/* Whether a float64 row's write may go near the edges of double's range:
   then its blocks are written out of line, each checked, and those that
   went there written again (rms_forward_block_scaled). The check, in
   every block of every row, took a tenth longer in cache.
   Underflow: the products x * inv_rms and x * w * inv_rms stay above
   RMS_NEAR_UNDERFLOW where the row's least nonzero value and weight keep
   them there, and every block's double write then rounds y once. The
   least value comes from the least square, or, where that is 0 (a zero,
   or a value below 2^-537), from one more pass over the row. An inv_rms
   of 0, inf or NaN leaves nothing to round.
   Overflow, without fused multiply-adds: rows whose y may reach 2^1022
   (|x * inv_rms| is at most sqrt(sum_squares) * inv_rms), and rows whose
   plain sum of squares needs a rescale, which bounds nothing: their
   product u_hi * w may round past DBL_MAX where y itself does not. */
RMS_ALWAYS_INLINE int rms_row_may_go_near_range_edge(rms_kind xk, ptrdiff_t n, const char *x,
                                                     ptrdiff_t xs, const rms_row_weight *w,
                                                     double least_square, double sum_squares,
                                                     double inv_rms)
{
    if (xk != RMS_KIND_F64 || !(inv_rms > 0.0) || isinf(inv_rms)) {
        return 0;
    }
    if (!RMS_HAVE_FMA && (rms_sum_needs_rescale(sum_squares) ||
                          !(sqrt(sum_squares) * inv_rms * w->largest < 0x1p1022))) {
        return 1;
    }
    const double least = least_square > 0.0 ? sqrt(least_square) : rms_least_nonzero(n, x, xs);
    return !(least * inv_rms * (w->least < 1.0 ? w->least : 1.0) >= RMS_NEAR_UNDERFLOW);
}

/* Whether a type's rows are commonly written in double, inlined: float64
   rows, and float32 rows without fused multiply-adds or with a float64
   weight; and float64's out of line too, for its rows with an offset.
   The other types' rows in double are rare, and go through
   rms_forward_row_in_double. */
RMS_ALWAYS_INLINE int rms_double_write_is_common(rms_kind xk, rms_kind wk, rms_write_mode mode)
{
    if (mode == RMS_WRITE_DOUBLE_OUT_OF_LINE) {
        return xk == RMS_KIND_F64;
    }
    return xk == RMS_KIND_F64 || (xk == RMS_KIND_F32 && (!RMS_HAVE_FMA || wk == RMS_KIND_F64));
}

/* A row written a block at a time in mode, then the next row's reduction
   pass, with no streaming and no reduction in the write. It serves the
   rows of a type written the fast way that go in double instead (a weight
   with no floats, an inv_rms outside float's range, a remade row), each
   block out of line: such rows are rare, and one plain loop serves them
   all, where a write loop inlined for each would double the type's
   machine code. A remade row has its residual_out written first, and
   read. */
RMS_ALWAYS_INLINE rms_row_sums rms_forward_row_plainly(rms_kind xk, rms_kind wk,
                                                      int with_residual, rms_write_mode mode,
                                                      ptrdiff_t n, const rms_row_source *row,
                                                      const rms_row_weight *w, char *y,
                                                      ptrdiff_t ys, rms_row_plan plan,
                                                      rms_unsure_blocks *unsure,
                                                      const rms_row_source *next)
{
    if (with_residual && row->remade) {
        rms_write_residual_out(xk, n, row);
    }
    /* local copies, as rms_forward_write takes them: read through the
       pointers, the offset and strides were loaded again at every block */
    rms_row_source known = rms_source_known(xk, row);
    known.remade = 0;
    const rms_row_weight w_known = RMS_STRIDED_ROWS ? *w : rms_weight_known(wk, w);
    const rms_inv_forms inv = rms_inv_forms_of(xk, wk, w->with_offset, w->offset, plan.inv_rms,
                                               plan.sum_error, 0, unsure, mode);
    if (!RMS_STRIDED_ROWS) {
        ys = rms_kind_size(xk);
    }
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        (void)rms_forward_block(xk, wk, mode, with_residual, &known, &w_known, i, y, ys, count,
                                &inv, 0, 0, 0);
    }
    return rms_reduce_row(xk, with_residual, n, next);
}

/* rms_forward_row_plainly out of line, for one mode:
   rms_forward_row_in_double for the rows above, and
   rms_forward_row_offset_in_blocks for float32 rows whose offset + weight
   their blocks make (rms_forward_block): a call of a few
   rows, or rows with weights or offsets of their own, where a pair made
   for the row would be read once. A write loop inlined for these too would
   add to the float32 kernels' machine code, and with the next row's
   reduction in it, spill registers (a call of 32 rows took a sixth
   longer than with the pair made for it). */
#define RMS_FORWARD_ROW_PLAINLY_IN(name, mode)                                                 \
    RMS_NOINLINE rms_row_sums rms_forward_row_##name(                                          \
        rms_kind xk, rms_kind wk, int with_residual, ptrdiff_t n, const rms_row_source *row,   \
        const rms_row_weight *w, char *y, ptrdiff_t ys, rms_row_plan plan,                     \
        rms_unsure_blocks *unsure, const rms_row_source *next)                                 \
    {                                                                                          \
        return rms_forward_row_plainly(xk, wk, with_residual, mode, n, row, w, y, ys, plan,    \
                                       unsure, next);                                          \
    }
RMS_FORWARD_ROW_PLAINLY_IN(in_double, RMS_WRITE_DOUBLE_OUT_OF_LINE)
RMS_FORWARD_ROW_PLAINLY_IN(offset_in_blocks, RMS_WRITE_OFFSET32_IN_BLOCKS)
#undef RMS_FORWARD_ROW_PLAINLY_IN

/* A remade row (float32 only: rms_remakes_residual_out) whose inv_rms is
   worked out again from its values: its residual_out is written first, for
   that to read, and its write reads it rather than make it again, since
   out= may have put it over x or the residual. */
RMS_ALWAYS_INLINE rms_row_sums rms_forward_remade_row_in_double(
    rms_kind xk, rms_kind wk, ptrdiff_t n, const rms_row_source *row, const rms_row_weight *w,
    double eps, char *y, ptrdiff_t ys, rms_dd sum_squares, rms_unsure_blocks *unsure,
    const rms_row_source *next)
{
    rms_write_residual_out(xk, n, row);
    rms_row_source written = *row;
    written.remade = 0;
    const char *x = written.residual_out;
    const ptrdiff_t xs = written.residual_out_stride;
    const rms_row_plan plan = {
        .inv_rms = rms_sum_needs_rescale(sum_squares.hi)
                       ? rms_scaled_inv_value(rms_inv_rms_scaled(xk, n, x, xs, eps, sum_squares))
                       : rms_exact_inv_rms(xk, n, x, xs, eps),
        .mode = RMS_WRITE_DOUBLE_OUT_OF_LINE};
    return rms_forward_row_in_double(xk, wk, 1, n, &written, w, y, ys, plan, unsure, next);
}

/* One row of the forward's plan: inv_rms from its sum of squares
   (rms_row_plan_of says how exact), the write mode, and whether a float64
   write may go near the edges of double's range; or the rare rows' own
   ways. */
RMS_ALWAYS_INLINE rms_row_plan rms_forward_row_plan(rms_kind xk, rms_kind wk, int with_residual,
                                                    ptrdiff_t n, const rms_row_source *row,
                                                    const rms_row_weight *w, double eps,
                                                    const char *y, ptrdiff_t ys,
                                                    rms_row_sums sums)
{
    /* the row's values in memory: x, or residual_out */
    const char *x = with_residual ? row->residual_out : row->x;
    const ptrdiff_t xs = with_residual ? row->residual_out_stride : row->x_stride;
    const int needs_rescale = rms_sum_needs_rescale(sums.squares.hi);
    /* rows of a plain kind that need a rescale have an infinity or a NaN,
       or are 0: no output of theirs is rounded, and their sum's error is
       left at 0 */
    rms_row_plan plan = {.mode = RMS_WRITE_DOUBLE};
    int exact_first = 0;
    if (!needs_rescale) {
        plan = rms_row_plan_of(xk, wk, with_residual, n, x, xs, w, eps, sums.squares, y, ys,
                               &exact_first);
    }
    if (with_residual && row->remade && (needs_rescale || exact_first)) {
        plan.remade_in_double = 1;
        return plan;
    }
    if (needs_rescale) {
        const rms_scaled_inv scaled = rms_inv_rms_scaled(xk, n, x, xs, eps, sums.squares);
        if (xk == RMS_KIND_F64 && !rms_scaled_inv_in_range(scaled)) {
            plan.extreme = 1;
            plan.scaled = rms_scaled_inv_normalised(scaled);
            return plan;
        }
        plan.inv_rms = rms_scaled_inv_value(scaled);
        plan.mode = rms_write_mode_of(xk, wk, w, plan.inv_rms);
    }
    else if (exact_first) {
        plan.inv_rms = rms_exact_inv_rms(xk, n, x, xs, eps);
        plan.mode = rms_write_mode_of(xk, wk, w, plan.inv_rms);
        plan.sum_error = 0.0;
    }
    plan.near_range_edge =
        rms_row_may_go_near_range_edge(xk, n, x, xs, w, sums.least_square,
                                      sums.squares.hi, plan.inv_rms.hi);
    if (plan.near_range_edge && plan.mode == RMS_WRITE_DOUBLE) {
        plan.mode = RMS_WRITE_DOUBLE_OUT_OF_LINE;
    }
    return plan;
}

/* One row of the forward written as its plan says, and the sums of the
   next: rms_forward_write in the plan's mode, and whether it reduces the
   next row, constants at each call, so that each write loop is its own
   code; or the rare rows' ways, out of line. */
RMS_ALWAYS_INLINE rms_row_sums rms_forward_write_planned(
    rms_kind xk, rms_kind wk, int with_residual, ptrdiff_t n, const rms_row_source *row,
    const rms_row_weight *w, double eps, char *y, ptrdiff_t ys, int stream, rms_row_sums sums,
    rms_row_plan plan, rms_unsure_blocks *unsure, const rms_row_source *next)
{
    if (with_residual && plan.remade_in_double) {
        return rms_forward_remade_row_in_double(xk, wk, n, row, w, eps, y, ys, sums.squares,
                                                unsure, next);
    }
    if (xk == RMS_KIND_F64 && plan.extreme) {
        const char *x = with_residual ? row->residual_out : row->x;
        const ptrdiff_t xs = with_residual ? row->residual_out_stride : row->x_stride;
        return rms_forward_row_extreme(wk, with_residual, n, x, xs, w, y, ys, plan.scaled, next);
    }
    const ptrdiff_t size = rms_kind_size(xk);
    const ptrdiff_t head = rms_unaligned_head(y, ys, size, n);
    const int streamed = rms_can_stream(stream, rms_element_out(y, head, ys), ys, size);
    const int reduce = next->x != NULL && (!streamed || next->ahead_x != NULL);
#define RMS_WRITE_IN(mode)                                                                       \
    (reduce ? rms_forward_write(xk, wk, mode, with_residual, 1, n, row, w, y, ys, head, streamed, \
                                stream, plan.inv_rms, plan.sum_error, plan.near_range_edge,      \
                                unsure, next)                                                    \
            : rms_forward_write(xk, wk, mode, with_residual, 0, n, row, w, y, ys, head, streamed, \
                                stream, plan.inv_rms, plan.sum_error, plan.near_range_edge,      \
                                unsure, next))
    switch (plan.mode) {
    case RMS_WRITE_FAST16:
        return RMS_WRITE_IN(RMS_WRITE_FAST16);
    case RMS_WRITE_FLOAT:
        return RMS_WRITE_IN(RMS_WRITE_FLOAT);
    case RMS_WRITE_OFFSET32:
        return RMS_WRITE_IN(RMS_WRITE_OFFSET32);
    case RMS_WRITE_OFFSET32_IN_BLOCKS:
        if (RMS_OFFSET_IN_FLOATS(xk, wk)) {
            return rms_forward_row_offset_in_blocks(xk, wk, with_residual, n, row, w, y, ys,
                                                    plan, unsure, next);
        }
        break;
    case RMS_WRITE_DOUBLE_OUT_OF_LINE:
        if (rms_double_write_is_common(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE)) {
            return RMS_WRITE_IN(RMS_WRITE_DOUBLE_OUT_OF_LINE);
        }
        break;
    default:
        if (rms_double_write_is_common(xk, wk, RMS_WRITE_DOUBLE)) {
            return RMS_WRITE_IN(RMS_WRITE_DOUBLE);
        }
        break;
    }
#undef RMS_WRITE_IN
    return rms_forward_row_in_double(xk, wk, with_residual, n, row, w, y, ys, plan, unsure, next);
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

/* Whether the fast writes may take these floats of offset + weight (as
   rms_offset_weight says): none infinite or NaN, nor below 2^-96, which
   one test for abnormal lanes finds once they are scaled by 2^-30. */
RMS_ALWAYS_INLINE int rms_offset_floats_usable(rms_vf f)
{
    return !rms_vf_any_abnormal(rms_vf_mul(f, rms_vf_set(0x1p-30f)));
}

/*
 * offset + weight, exactly, as n doubles hi + lo (an error-free sum: lo is
 * what hi, the sum rounded to double, leaves out; 0 where hi is not
 * finite), and, where floats is not NULL, as floats: for 16-bit x, the
 * exact sum rounded once, through hi rounded to odd; for float32 x, hi
 * rounded to float, and in floats + n the rest, (hi - that) + lo rounded
 * to float. That pair is within 2^-48 (1 + 2^-20) of the sum where the
 * sum is 0 or at least 2^-96 (the rest's rounding, 2^-150 at least, is
 * then no more than 2^-54 of it): the float write's margin counts on that
 * (rms_forward_block_float). Returns whether the fast writes may take
 * those floats: not where one is infinite or NaN (a sum past float's range
 * makes 0 * inf of a zero x), nor, to keep the test to one vector
 * operation, below 2^-96 (those rows go in double).
 */
RMS_ALWAYS_INLINE int rms_offset_weight(rms_kind xk, rms_kind wk, ptrdiff_t n, const char *w,
                                        ptrdiff_t ws, double offset, double *hi, double *lo,
                                        float *floats)
{
    int floats_usable = 1;
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        rms_block sum, err, odd;
        rms_offset_weight_block(wk, rms_element(w, i, ws), ws, count, offset, &sum, &err);
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            odd.part[h] = rms_vd_round_to_odd(sum.part[h], err.part[h]);
        }
        rms_store_doubles((char *)(hi + i), 8, count, &sum, 0);
        rms_store_doubles((char *)(lo + i), 8, count, &err, 0);
        if (floats != NULL && xk == RMS_KIND_F32) {
            const rms_vf f = rms_vf_narrow(sum.part);
            rms_vd rest[RMS_VD_PER_VF];
            RMS_UNROLL
            for (int h = 0; h < RMS_VD_PER_VF; h++) {
                /* hi - f is exact: f is hi rounded to float */
                rest[h] = rms_vd_add(rms_vd_sub(sum.part[h], rms_vd_widen(f, h)), err.part[h]);
            }
            floats_usable &= rms_offset_floats_usable(f);
            rms_store_floats(RMS_KIND_F32, (char *)(floats + i), 4, count, f, 0);
            rms_store_floats(RMS_KIND_F32, (char *)(floats + n + i), 4, count, rms_vf_narrow(rest),
                             0);
        }
        else if (floats != NULL) {
            const rms_vf f = rms_vf_narrow(odd.part);
            floats_usable &= rms_offset_floats_usable(f);
            rms_store_floats(RMS_KIND_F32, (char *)(floats + i), 4, count, f, 0);
        }
    }
    return floats_usable;
}

/* offset + weight, float32's of rms_offset_in_floats, as n floats hi and in
   floats + n their rest, for the rows of a call to share. Returns whether
   the float write may take them, as rms_offset_weight does. */
RMS_ALWAYS_INLINE int rms_offset_weight_floats(ptrdiff_t n, const char *w, ptrdiff_t ws,
                                               float offset, float *floats)
{
    int floats_usable = 1;
    const rms_vf offset_v = rms_vf_set(offset);
    for (ptrdiff_t i = 0; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        rms_vf rest;
        const rms_vf sum =
            rms_offset_weight_floats_block(rms_element(w, i, ws), ws, count, offset_v, &rest);
        floats_usable &= rms_offset_floats_usable(sum);
        rms_store_floats(RMS_KIND_F32, (char *)(floats + i), 4, count, sum, 0);
        rms_store_floats(RMS_KIND_F32, (char *)(floats + n + i), 4, count, rest, 0);
    }
    return floats_usable;
}

/* The forward's weight as a row's write pass reads it (rms_row_weight),
   as prepare_forward_weight says (kernels.h); floats only for 16-bit x,
   and for float32 x with an offset where fused multiply-adds exist. */
RMS_ALWAYS_INLINE int rms_prepare_forward_weight(rms_kind xk, rms_kind wk, ptrdiff_t n,
                                                 const char *w, ptrdiff_t ws, const double *offset,
                                                 double *hi, double *lo, float *floats)
{
    if (!rms_has_fast16(xk) && !(RMS_HAVE_FMA && xk == RMS_KIND_F32)) {
        floats = NULL; /* a constant: the types without a fast write from floats compile none */
    }
    if (offset != NULL && rms_offset_in_floats(xk, wk, *offset)) {
        return floats != NULL && rms_offset_weight_floats(n, w, ws, (float)*offset, floats)
                   ? RMS_MADE_FLOATS
                   : 0;
    }
    if (offset != NULL) {
        const int usable = rms_offset_weight(xk, wk, n, w, ws, *offset, hi, lo, floats);
        return RMS_MADE_DOUBLES | (usable && floats != NULL ? RMS_MADE_FLOATS : 0);
    }
    if (floats != NULL && rms_has_fast16(xk)) {
        rms_weight_floats(wk, n, w, ws, floats);
    }
    return RMS_MADE_FLOATS;
}

/* rms_prepare_forward_weight of each type, out of line: the kernels'
   table (kernels.h) takes it, and so do rows with weights or offsets of
   their own, rather than inline it into every rows loop. */
typedef int (*rms_prepare_forward_weight_fn)(ptrdiff_t n, const char *w, ptrdiff_t ws,
                                             const double *offset, double *hi, double *lo,
                                             float *floats);
#define RMS_PREPARE_FORWARD_WEIGHT_OF(name, x, weight)                                         \
    RMS_NOINLINE int rms_prepare_forward_weight_##name(ptrdiff_t n, const char *w,             \
                                                       ptrdiff_t ws, const double *offset,    \
                                                       double *hi, double *lo, float *floats) \
    {                                                                                          \
        return rms_prepare_forward_weight(RMS_KIND_##x, RMS_KIND_##weight, n, w, ws, offset,   \
                                          hi, lo, floats);                                     \
    }
RMS_FOR_EACH_TYPE(RMS_PREPARE_FORWARD_WEIGHT_OF)
#define RMS_PREPARE_FORWARD_WEIGHT_ENTRY(name, x, weight)                                      \
    [RMS_KIND_##x][RMS_KIND_##weight] = rms_prepare_forward_weight_##name,
/* By x's kind, then the weight's; indexed by constants, a direct call. */
static const rms_prepare_forward_weight_fn rms_prepare_forward_weight_of[4][4] = {
    RMS_FOR_EACH_TYPE(RMS_PREPARE_FORWARD_WEIGHT_ENTRY)};
#undef RMS_PREPARE_FORWARD_WEIGHT_ENTRY
#undef RMS_PREPARE_FORWARD_WEIGHT_OF

/* Row r's source, as rms_row_source says; with every stride unit_stride
   where that is not 0 (contiguous rows: a constant to the compiler). */
RMS_ALWAYS_INLINE rms_row_source rms_source_of(const rms_forward_problem *p, int with_residual,
                                               int remade, ptrdiff_t r, ptrdiff_t unit_stride)
{
    rms_row_source src = {rms_element(p->x.data, r, p->x.row_stride), NULL, NULL,
                          unit_stride ? unit_stride : p->x.stride, 0, 0, NULL, NULL, remade};
    if (with_residual) {
        src.residual = rms_element(p->residual.data, r, p->residual.row_stride);
        src.residual_out = rms_element_out(p->residual_out.data, r, p->residual_out.row_stride);
        src.residual_stride = unit_stride ? unit_stride : p->residual.stride;
        src.residual_out_stride = unit_stride ? unit_stride : p->residual_out.stride;
    }
    return src;
}

/* Writes the blocks of row r that unsure notes again, in double, from the
   exact sum of the row's values in memory: x, or residual_out, all written by
   now; or the whole row, where unsure could not hold them all. For the
   rows whose plain sum left an output undecided (rms_forward_row_plan); out of
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
    const char *x = with_residual ? row.residual_out : row.x;
    const ptrdiff_t xs = with_residual ? row.residual_out_stride : row.x_stride;
    const ptrdiff_t n = p->n, ys = unit_stride ? unit_stride : p->y.stride;
    char *y = rms_element_out(p->y.data, r, p->y.row_stride);
    const rms_kind eps_kind = xk == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32;
    const double eps = rms_load_scalar(eps_kind, rms_element(p->eps, r, p->eps_stride));
    const rms_inv_forms inv =
        rms_inv_forms_of(xk, wk, weight.with_offset, weight.offset,
                         rms_exact_inv_rms(xk, n, x, xs, eps), 0.0, 0, NULL,
                         RMS_WRITE_DOUBLE_OUT_OF_LINE);
    const int whole_row = unsure->count > RMS_UNSURE_BLOCKS;
    const ptrdiff_t blocks = whole_row ? (n + RMS_VF_WIDTH - 1) / RMS_VF_WIDTH : unsure->count;
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const ptrdiff_t at = whole_row ? b * RMS_VF_WIDTH : unsure->at[b];
        const ptrdiff_t count = n - at < RMS_VF_WIDTH ? n - at : RMS_VF_WIDTH;
        (void)rms_forward_block(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE, with_residual, &row,
                                &weight, at, y, ys, count, &inv, 0, 0, 0);
    }
}

/* Row r's weight, where rows have weights or offsets of their own: its
   offset + weight, and floats where the fast writes may take them, made
   into scratch (rms_prepare_forward_weight). */
RMS_ALWAYS_INLINE void rms_prepare_row_weight(rms_kind xk, rms_kind wk,
                                              const rms_forward_problem *p, ptrdiff_t r,
                                              const rms_forward_weight_scratch *scratch,
                                              rms_row_weight *w)
{
    const int with_offset = p->weight_offset != NULL;
    double offset = 0.0;
    if (with_offset) {
        const char *at = rms_element(p->weight_offset, r, p->weight_offset_stride);
        offset = rms_load_scalar(RMS_KIND_F64, at);
    }
    /* one row's pair is made in its blocks (rms_offset_in_floats); the
       stride is p's, w's own value but not a constant, or the compiler
       makes a second copy of the function for it */
    const int made = with_offset && rms_offset_in_floats(xk, wk, offset)
                         ? 0
                         : rms_prepare_forward_weight_of[xk][wk](
                               p->n, w->data, p->weight.stride, with_offset ? &offset : NULL,
                               scratch->hi, scratch->lo, scratch->floats);
    w->offset = offset;
    w->hi = made & RMS_MADE_DOUBLES ? scratch->hi : NULL;
    w->lo = made & RMS_MADE_DOUBLES ? scratch->lo : NULL;
    w->floats = made & RMS_MADE_FLOATS ? scratch->floats : NULL;
    w->floats_lo = xk == RMS_KIND_F32 && w->floats != NULL ? w->floats + p->n : NULL;
}

/* float64's w->least, and without fused multiply-adds w->largest
   (rms_row_may_go_near_range_edge): once for a weight that rows share, else
   for each row's; *least_of is the weight they were found for. */
RMS_ALWAYS_INLINE void rms_find_least_weight(const rms_forward_problem *p, rms_row_weight *w,
                                             const char **least_of)
{
    const int with_offset = p->weight_offset != NULL;
    const char *weight = with_offset ? (const char *)w->hi : w->data;
    if (weight != *least_of || (with_offset && !p->weight_prepared)) {
        /* a float64 weight: float64 x's only (types.h) */
        w->least = rms_least_nonzero(p->n, weight, with_offset ? 8 : w->stride);
        if (!RMS_HAVE_FMA) {
            w->largest = rms_largest_magnitude(p->n, weight, with_offset ? 8 : w->stride);
        }
        *least_of = weight;
    }
}

/* Row r of a table that takes strided rows (RMS_STRIDED_ROWS), with
   strides that are not its elements' sizes: reduced, then written, with
   no other row's reduction in its write. */
RMS_ALWAYS_INLINE void rms_forward_strided_row(rms_kind xk, rms_kind wk, int with_residual,
                                               const rms_forward_problem *p, ptrdiff_t r,
                                               const rms_row_weight *w, double eps, char *y)
{
    const rms_row_source src = rms_source_of(p, with_residual, 0, r, 0);
    rms_row_source none = src;
    none.x = NULL;
    rms_unsure_blocks unsure;
    unsure.count = 0;
    const rms_row_sums sums = rms_reduce_row(xk, with_residual, p->n, &src);
    const rms_row_plan plan =
        rms_forward_row_plan(xk, wk, with_residual, p->n, &src, w, eps, y, p->y.stride, sums);
    rms_forward_write_planned(xk, wk, with_residual, p->n, &src, w, eps, y, p->y.stride, 0, sums,
                              plan, &unsure, &none);
    if (rms_kind_is_float_exact(xk) && unsure.count > 0) {
        rms_forward_row_exactly(xk, wk, with_residual, p, r, 0, *w, &unsure);
    }
}

/* The row after row r of contiguous rows, as its write pass reduces it:
   no row (x NULL) after the chunk's last; where the output is streamed,
   with the row after it to ask for (rms_forward_write). */
RMS_ALWAYS_INLINE rms_row_source rms_next_source(const rms_forward_problem *p, int with_residual,
                                                 int remade, ptrdiff_t r, ptrdiff_t row_end,
                                                 ptrdiff_t es)
{
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
    return next;
}

/* Whether the rows' strides are their elements' sizes: always (kernels.h),
   but where this table serves strided rows too. */
RMS_ALWAYS_INLINE int rms_rows_are_contiguous(rms_kind xk, rms_kind wk, int with_residual,
                                              const rms_forward_problem *p)
{
    const ptrdiff_t es = rms_kind_size(xk), ws = rms_kind_size(wk);
    return !RMS_STRIDED_ROWS ||
           (p->x.stride == es && p->y.stride == es && p->weight.stride == ws &&
            (!with_residual || (p->residual.stride == es && p->residual_out.stride == es)));
}

/* The weight as the driver made it for the call, or for this thread
   (weight_prepared), less the row's data; else to be made for each row. */
RMS_ALWAYS_INLINE rms_row_weight rms_prepared_weight(rms_kind xk, const rms_forward_problem *p)
{
    const int with_offset = p->weight_offset != NULL;
    rms_row_weight w = {.stride = p->weight.stride,
                        .with_offset = with_offset,
                        .offset = with_offset && p->weight_prepared
                                      ? rms_load_scalar(RMS_KIND_F64, p->weight_offset)
                                      : 0.0,
                        .hi = p->weight_hi,
                        .lo = p->weight_lo,
                        .floats = p->weight_floats,
                        .least = INFINITY,
                        .largest = 0.0};
    if (xk == RMS_KIND_F32 && w.floats != NULL) {
        w.floats_lo = w.floats + p->n; /* the rest of offset + weight follows its floats */
    }
    return w;
}

/* Scratch for each row's weight (rms_prepare_row_weight), where the
   driver has not made it (weight_prepared): returns the bytes asked for
   where they cannot be had, else 0. */
RMS_ALWAYS_INLINE size_t rms_forward_rows_scratch(rms_kind xk, const rms_forward_problem *p,
                                                  rms_forward_weight_scratch *scratch)
{
    const int with_offset = p->weight_offset != NULL;
    return p->weight_prepared ? 0
                              : rms_forward_weight_scratch_alloc(
                                    scratch, p->n, rms_forward_weight_floats(xk, with_offset),
                                    with_offset);
}

/*
 * The forward's rows [row_begin, row_end). The fast 16-bit write takes the
 * weight as floats, and with an offset the write takes offset + weight as
 * doubles or floats (rms_prepare_forward_weight): where the driver has not
 * made them (weight_prepared), as where rows have weights or offsets of
 * their own, each row's are made here. Where the floats' memory cannot be had,
 * rows go in double; returns 0, or, where an offset's 2n doubles cannot be
 * had, the bytes asked for, having written nothing. Contiguous rows are
 * written with the next row's reduction in each write, and their strides
 * are the elements' sizes, constants: each block is one vector load or
 * store.
 */
RMS_ALWAYS_INLINE size_t rms_forward_rows_of(rms_kind xk, rms_kind wk, int with_residual,
                                             int remade, const rms_forward_problem *p,
                                             ptrdiff_t row_begin, ptrdiff_t row_end)
{
    const ptrdiff_t n = p->n, es = rms_kind_size(xk);
    rms_forward_weight_scratch scratch = {NULL, NULL, NULL, NULL};
    if (n <= 0 || row_begin >= row_end) {
        return 0;
    }
    const size_t failed_bytes = rms_forward_rows_scratch(xk, p, &scratch);
    if (failed_bytes != 0) {
        return failed_bytes;
    }
    const rms_kind eps_kind = xk == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32;
    const int contiguous = rms_rows_are_contiguous(xk, wk, with_residual, p);
    rms_row_weight w = rms_prepared_weight(xk, p);
    rms_row_sums sums = {{0.0, 0.0}, INFINITY};
    if (contiguous) {
        w = rms_weight_known(wk, &w);
        const rms_row_source first = rms_source_of(p, with_residual, remade, row_begin, es);
        sums = rms_reduce_row(xk, with_residual, n, &first);
    }
    const char *least_of = NULL;
    for (ptrdiff_t r = row_begin; r < row_end; r++) {
        w.data = rms_element(p->weight.data, r, p->weight.row_stride);
        char *y = rms_element_out(p->y.data, r, p->y.row_stride);
        const double eps = rms_load_scalar(eps_kind, rms_element(p->eps, r, p->eps_stride));
        if (!p->weight_prepared) {
            rms_prepare_row_weight(xk, wk, p, r, &scratch, &w);
        }
        if (xk == RMS_KIND_F64) {
            rms_find_least_weight(p, &w, &least_of);
        }
        if (RMS_STRIDED_ROWS && !contiguous) {
            rms_forward_strided_row(xk, wk, with_residual, p, r, &w, eps, y);
            continue;
        }
        const rms_row_source src = rms_source_of(p, with_residual, remade, r, es);
        const rms_row_source next = rms_next_source(p, with_residual, remade, r, row_end, es);
        /* a const copy a row, as well as w made known once above: through
           w itself, whose address the weight helpers take, gcc compiled
           the kernels 23 KB larger, and without the first 6 KB larger */
        const rms_row_weight unit_w = rms_weight_known(wk, &w);
        rms_unsure_blocks unsure;
        unsure.count = 0;
        const rms_row_plan plan =
            rms_forward_row_plan(xk, wk, with_residual, n, &src, &unit_w, eps, y, es, sums);
        sums = rms_forward_write_planned(xk, wk, with_residual, n, &src, &unit_w, eps, y, es,
                                         p->stream_output, sums, plan, &unsure, &next);
        if (rms_kind_is_float_exact(xk) && unsure.count > 0) {
            rms_forward_row_exactly(xk, wk, with_residual, p, r, es, unit_w, &unsure);
        }
    }
    if (RMS_HAVE_STREAM && p->stream_output) {
        rms_stream_fence(); /* streamed stores are seen before the caller reads y */
    }
    free(scratch.memory);
    return 0;
}

/* Whether a row's residual_out, x + residual, is made twice: in the reduction
   pass, for its squares, and again in the write pass, which writes it
   beside y, streamed where y is (rms_block_values). Where the
   output is streamed, that spares residual_out's lines a trip into the cache
   (a read before each is written, and a write back), for two more loads
   and an add a block: the float32 fused forward at 2048x4096 took a sixth
   less time. float64's took a tenth more, and the other kinds keep their
   residual_out written once, by the reduction pass. */
RMS_ALWAYS_INLINE int rms_remakes_residual_out(rms_kind xk, const rms_forward_problem *p)
{
    return RMS_HAVE_STREAM && xk == RMS_KIND_F32 && p->stream_output;
}

#endif
