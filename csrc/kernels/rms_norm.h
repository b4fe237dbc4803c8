/*
 * RMSNorm over rows, in plain C: the driver's entry points.
 *
 * Nothing here knows about Python or NumPy. A problem is described by byte
 * strides, as NumPy hands them over; the driver (rms_norm.c) deals its rows
 * to the thread pool and runs the row kernels (kernels.h) on them.
 *
 *   forward:   inv_rms = 1 / sqrt(mean(x^2) + eps)
 *              y       = x * inv_rms * weight
 *   backward:  x_hat   = x * inv_rms,  g = grad_output * weight
 *              grad_input  = inv_rms * (g - x_hat * mean(g * x_hat))
 *              grad_weight = sum over rows of grad_output * x_hat
 *
 * Two variants ride on the same problems. With a residual, the forward
 * first forms residual_out = x + residual, rounded to x's kind, and
 * normalises that; the backward then adds grad_residual_out to grad_input
 * (x and residual share one gradient). With a weight offset, the factor is
 * weight_offset + weight, formed exactly: grad_weight is unchanged, as
 * d(offset + weight)/d(weight) = 1.
 */
#ifndef RMSNORM_KERNELS_RMS_NORM_H
#define RMSNORM_KERNELS_RMS_NORM_H

#include <stddef.h>

#include "types.h"

/* A strided 2-D operand: rows of `n` elements. */
typedef struct {
    char *data;
    ptrdiff_t row_stride; /* bytes from one row to the next (may be 0) */
    ptrdiff_t stride;     /* bytes from one element to the next in a row */
} rms_matrix;

typedef struct {
    ptrdiff_t n; /* row length: the gufunc's core dimension */
    rms_matrix x;
    rms_matrix weight; /* row_stride 0 when every row shares one weight */
    const char *eps;   /* one eps per row, in the type's eps kind */
    ptrdiff_t eps_stride;
    /* One float64 offset per row, added to the weight; NULL for none. */
    const char *weight_offset;
    ptrdiff_t weight_offset_stride;
    /* x + residual is what is normalised, and is written to residual_out,
       where residual.data is not NULL. residual_out may be residual itself
       (updated in place) or x; it must not overlap y. */
    rms_matrix residual, residual_out;
    rms_matrix y;
    /* Write y with non-temporal stores where the instruction set has them:
       set by the driver for outputs too large to stay in cache. */
    int stream_output;
    /* The weight as the write passes read it (prepare_forward_weight in
       kernels.h), made by the driver where every row shares the weight
       and the offset, once for the call or once for each thread that shares
       it; forward_rows makes its own, per chunk of rows, where
       weight_prepared is 0. */
    int weight_prepared;
    const double *weight_hi, *weight_lo; /* offset + weight; NULL without an offset, and
                                            where the floats alone hold it */
    const float *weight_floats;          /* NULL: no fast write from floats */
} rms_forward_problem;

typedef struct {
    ptrdiff_t n;
    rms_matrix grad_output;
    rms_matrix x;
    const char *weight; /* one weight vector shared by every row */
    ptrdiff_t weight_stride;
    const char *eps; /* one eps, in the type's eps kind */
    const char *weight_offset; /* one float64, or NULL for none */
    /* Added to grad_input where its data is not NULL: the gradient that
       reached residual_out directly. */
    rms_matrix grad_residual_out;
    rms_matrix grad_input;
    int stream_output; /* as in rms_forward_problem */
    /* A streamed row's write pass asks for a row further on (rms_norm.c's
       backward_rows and backward_chunk say which); rows before ahead_end
       may be asked for even past the end of the rows at hand. The driver
       sets it to the problem's row count when one thread takes every
       chunk, and to 0 otherwise, where the next chunk is likely another
       thread's. */
    ptrdiff_t ahead_end;
} rms_backward_problem;

/*
 * The entry points: a whole problem of `rows` rows, split among the thread
 * pool when it is large enough to pay. Results are the same bytes for any
 * thread count.
 */
/* Returns 0, or the bytes of scratch memory it could not have for a weight
   offset (2n doubles: once for the call or for each thread, or per chunk
   of rows where rows have weights or offsets of their own); the rows of y
   of a chunk that could not have it are left unwritten. */
size_t rms_norm_forward(rms_type type, const rms_forward_problem *p, ptrdiff_t rows);

/* Also writes grad_weight, the sum over rows, in the weight's kind.
   Returns 0, or the bytes of scratch memory it could not have (the weight
   and grad_weight's sum as doubles, and past one chunk of rows a counter
   per 4096 columns), having written nothing. */
size_t rms_norm_backward(rms_type type, const rms_backward_problem *p, ptrdiff_t rows,
                         char *grad_weight, ptrdiff_t grad_weight_stride);

#endif
