/*
 * RMSNorm row kernels: the arithmetic, in plain C.
 *
 * Nothing here knows about Python or NumPy. A problem is described by byte
 * strides, as NumPy hands them over, and the kernels work on a range of rows
 * so that a caller (the NumPy glue, a thread pool) decides how rows are split.
 *
 *   forward:   inv_rms = 1 / sqrt(mean(x^2) + eps)
 *              y       = (x * inv_rms) * weight
 *   backward:  x_hat   = x * inv_rms,  g = grad_out * weight
 *              grad_in = inv_rms * (g - x_hat * mean(g * x_hat))
 *              grad_weight = sum over rows of grad_out * x_hat
 */
#ifndef RMSNORM_KERNELS_RMS_NORM_H
#define RMSNORM_KERNELS_RMS_NORM_H

#include <stddef.h>

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
    const char *eps;   /* one eps per row, in the type's eps dtype */
    ptrdiff_t eps_stride;
    rms_matrix y;
    /* Write y with non-temporal stores where the instruction set has them:
       set by the driver for outputs too large to stay in cache. */
    int stream_output;
} rms_forward_problem;

typedef struct {
    ptrdiff_t n;
    rms_matrix grad_out;
    rms_matrix x;
    const char *weight; /* one weight vector shared by every row */
    ptrdiff_t weight_stride;
    double eps;
    rms_matrix grad_in;
    int stream_output; /* as in rms_forward_problem */
    /* A streamed row's write pass asks for a row further on (backward_rows
       says which); rows before ahead_end may be asked for even past the
       end of the rows at hand. The driver sets it to the problem's row
       count when one thread takes every chunk, and to 0 otherwise, where
       the next chunk is likely another thread's. */
    ptrdiff_t ahead_end;
} rms_backward_problem;

/*
 * The kernels of one element type on one instruction set.
 *
 * backward_rows reads the weight as n doubles (from widen_row), and adds
 * each row's grad_out * x_hat into grad_weight_partial (n doubles), in row
 * order, so that the caller can sum partials in a fixed order and stay
 * bit-for-bit deterministic.
 */
typedef struct {
    void (*forward_rows)(const rms_forward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end);
    void (*backward_rows)(const rms_backward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end,
                          const double *weight, double *grad_weight_partial);
    /* Reads n weights of the element type as doubles: once per backward
       call, rather than converting them again on every row. */
    void (*widen_row)(ptrdiff_t n, const char *src, ptrdiff_t src_stride, double *dst);
    /* Rounds n doubles into the element type (for grad_weight). */
    void (*store_row)(ptrdiff_t n, const double *src, char *dst, ptrdiff_t dst_stride);
    /* Reads an eps value stored in the type's eps dtype. */
    double (*load_eps)(const char *eps);
} rms_kernels;

/* Element types, in the order of every per-type table. */
typedef enum {
    RMS_FLOAT32,
    RMS_FLOAT64,
    RMS_FLOAT16,
    RMS_BFLOAT16,
    RMS_FLOAT16_WEIGHT32,  /* float16 x, float32 weight */
    RMS_BFLOAT16_WEIGHT32, /* bfloat16 x, float32 weight */
    RMS_FLOAT32_WEIGHT64,  /* float32 x, float64 weight */
    RMS_NUM_TYPES
} rms_type;

/* Instruction sets, from the most portable to the widest. */
typedef enum {
    RMS_ISA_BASELINE,
    RMS_ISA_AVX2,
    RMS_ISA_AVX512,
    RMS_NUM_ISAS
} rms_isa;

/* The kernels of one type on the instruction set chosen at start-up. */
const rms_kernels *rms_kernels_for(rms_type type);

/*
 * Chooses the instruction set: the widest this CPU runs, unless the
 * environment variable RMSNORM_ISA names a narrower one ("baseline",
 * "avx2", "avx512"). Returns the one chosen. Call once before use.
 */
rms_isa rms_select_isa(void);
rms_isa rms_active_isa(void);
const char *rms_isa_name(rms_isa isa);
int rms_isa_supported(rms_isa isa);
/* Forces an instruction set (tests compare paths); returns 0 if unsupported. */
int rms_force_isa(rms_isa isa);

/*
 * The entry points: a whole problem of `rows` rows, split among the thread
 * pool when it is large enough to pay. Results are the same bytes for any
 * thread count.
 */
void rms_norm_forward(rms_type type, const rms_forward_problem *p, ptrdiff_t rows);

/* Also writes grad_weight, the sum over rows, in the weight's dtype.
   Returns 0, or -1 when scratch memory (a few rows of doubles per thread)
   cannot be had. */
int rms_norm_backward(rms_type type, const rms_backward_problem *p, ptrdiff_t rows,
                      char *grad_weight, ptrdiff_t grad_weight_stride);

#endif
