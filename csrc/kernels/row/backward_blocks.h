/*
 * The backward's operands and its write pass over one block: grad_input
 * and grad_weight's terms, in double or in float. Part of the row kernels
 * (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_BACKWARD_BLOCKS_H
#define RMSNORM_KERNELS_ROW_BACKWARD_BLOCKS_H
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
    const rms_vf out =
        o->gr.add_residual
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

#endif
