/*
 * The kernel table: for each element type, the row kernels compiled for one
 * instruction set, and the choice among instruction sets at run time.
 *
 * The driver (rms_norm.c) looks kernels up here; each isa_*.c fills one
 * table by compiling row_kernels.h over its vector vocabulary (simd/).
 */
#ifndef RMSNORM_KERNELS_KERNELS_H
#define RMSNORM_KERNELS_KERNELS_H

#include <stddef.h>

#include "rms_norm.h"

/*
 * The kernels of one element type on one instruction set.
 *
 * backward_rows reads the weight as n doubles (from widen_weight), and adds
 * each row's grad_output * x_hat into grad_weight_partial (n doubles), in
 * row order, so that the caller can sum partials in a fixed order and stay
 * bit-for-bit deterministic.
 */
typedef struct {
    /* Returns 0, or the bytes of scratch memory (a weight offset's 2n
       doubles) it could not have, having written nothing. */
    size_t (*forward_rows)(const rms_forward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end);
    void (*backward_rows)(const rms_backward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end,
                          const double *weight, double *grad_weight_partial);
    /* The backward's weight as n doubles, read once per call rather than
       converted again on every row. */
    void (*widen_weight)(ptrdiff_t n, const char *src, ptrdiff_t src_stride, double *dst);
    /* grad_weight, n doubles, rounded once into the weight's kind. */
    void (*store_weight)(ptrdiff_t n, const double *src, char *dst, ptrdiff_t dst_stride);
} rms_kernels;

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
 * Chooses the instruction set: the widest this CPU runs (RMSNORM_ISA, read
 * at import by rmsnorm/_environment.py, may narrow it through
 * rms_force_isa). Returns the one chosen. Call once before use.
 */
rms_isa rms_select_isa(void);
rms_isa rms_active_isa(void);
const char *rms_isa_name(rms_isa isa);
int rms_isa_supported(rms_isa isa);
/* Forces an instruction set (tests compare paths); returns 0 if unsupported. */
int rms_force_isa(rms_isa isa);

#endif
