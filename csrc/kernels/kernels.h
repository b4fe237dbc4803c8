/*
 * The kernel table: for each element type, the row kernels compiled for one
 * instruction set, and the choice among instruction sets at run time.
 *
 * The driver (rms_norm.c) looks kernels up here; each isa_*.c fills one
 * table by compiling row_kernels.h over its vector vocabulary (simd/).
 */
#ifndef RMSNORM_KERNELS_KERNELS_H
#define RMSNORM_KERNELS_KERNELS_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "rms_norm.h"

/*
 * How the backward writes one row, as the row's reduction pass decided:
 * what the write pass needs to go on from any column.
 */
typedef enum {
    RMS_BACKWARD_VECTOR,    /* block by block, in double or in float */
    RMS_BACKWARD_UNBOUNDED, /* inv_rms is infinite: torch's terms one by one */
    RMS_BACKWARD_EXTREME,   /* element by element, from significands */
    RMS_BACKWARD_ZERO_INV   /* eps = +inf: inv_rms is 0 */
} rms_backward_path;

typedef struct {
    rms_backward_path path;
    int in_float; /* VECTOR: a 16-bit row written in float */
    int exponent; /* EXTREME: inv_rms = inv * 2^exponent */
    int e_max;    /* EXTREME: the largest exponent of a g w x term (INT_MIN: none) */
    double inv;   /* VECTOR: inv_rms; EXTREME: its significand, in [0.5, 1) */
    double mean;  /* VECTOR: mean(g x_hat); EXTREME: the scaled S / n; UNBOUNDED: sum(g w x) */
} rms_backward_plan;

/*
 * The kernels of one element type on one instruction set.
 *
 * The backward goes in two steps, which rms_norm.c calls a few rows at a
 * time, or for a chunk's rows a tile of columns at a time:
 * plan_backward_rows runs each row's reduction pass, then
 * write_backward_rows each row's write pass over columns [column_begin,
 * column_end), adding its grad_output * x_hat into grad_weight_partial
 * (whose element 0 is column column_begin) in row order, so that the
 * caller can sum partials in a fixed order and stay bit-for-bit
 * deterministic. Both read the weight as n doubles (from widen_weight). A
 * streamed write pass asks for the row `ahead` rows on, where that is
 * before ahead_end; with fence set, its streamed stores are fenced before
 * it returns, since the caller then adds up or hands back what they wrote.
 */
typedef struct {
    /* Returns 0, or, for rows with weights or offsets of their own, the
       bytes of the weight's scratch (2n doubles for an offset, and n
       floats) it could not have, having written no row. */
    size_t (*forward_rows)(const rms_forward_problem *p, ptrdiff_t row_begin, ptrdiff_t row_end);
    void (*plan_backward_rows)(const rms_backward_problem *p, ptrdiff_t row_begin,
                               ptrdiff_t row_end, const double *weight, rms_backward_plan *plans);
    void (*write_backward_rows)(const rms_backward_problem *p, ptrdiff_t row_begin,
                                ptrdiff_t row_end, const rms_backward_plan *plans,
                                ptrdiff_t column_begin, ptrdiff_t column_end,
                                const double *weight, double *grad_weight_partial,
                                ptrdiff_t ahead, ptrdiff_t ahead_end, int fence);
    /* The forward's weight as its write passes read it: offset + weight
       as n doubles hi + lo where offset is not NULL, and as floats where
       floats is not NULL (rms_forward_weight_floats an element): n for
       16-bit x, and for float32 x with an offset n floats and n more
       (their rest). Returns what it made (rms_weight_made): the doubles
       are left out where the floats alone are offset + weight exactly, and
       the floats are not made where the fast writes may not take them. */
    int (*prepare_forward_weight)(ptrdiff_t n, const char *w, ptrdiff_t ws, const double *offset,
                                  double *hi, double *lo, float *floats);
    /* Whether prepare_forward_weight makes no doubles, and needs none,
       where the offset is a float (rms_offset_is_float). */
    int offset_in_floats;
    /* The backward's weight as n doubles, made once for the call (or for
       each thread that shares it: rms_norm.c) rather than converted again
       on every row. */
    void (*widen_weight)(ptrdiff_t n, const char *src, ptrdiff_t src_stride, double *dst);
    /* grad_weight, n doubles, rounded once into the weight's kind. */
    void (*store_weight)(ptrdiff_t n, const double *src, char *dst, ptrdiff_t dst_stride);
} rms_kernels;

/*
 * How many rows of float32 x the backward writes together (the driver's
 * loop), and in how many columns at a time (write_backward_rows). A row's write pass reads the
 * weight and reads and writes grad_weight, 24 bytes of doubles a column,
 * twice its own operands' 12; with those, past about 1700 columns (48 KiB
 * of L1) the doubles no longer stay in L1 from one row to the next. Rows
 * written together, a step of columns each in turn, find that step's
 * doubles in L1. The row order, and so every sum, is the same. Only
 * float32 gains: 16-bit rows are written in float, where the conversions,
 * not the doubles, set the pace, and float64 rows' own operands are as
 * wide as the doubles (docs/performance.md has the figures).
 */
#define RMS_BACKWARD_ROWS_TOGETHER 4
#define RMS_BACKWARD_COLUMNS_TOGETHER 1024

static inline ptrdiff_t rms_backward_rows_together(rms_kind x)
{
    return x == RMS_KIND_F32 ? RMS_BACKWARD_ROWS_TOGETHER : 1;
}

/* Whether an offset is a float, which float32 x and weight then add to the
   weight in float, exactly (RMS_OFFSET_IN_FLOATS). */
static inline int rms_offset_is_float(double offset)
{
    return fabs(offset) <= FLT_MAX && (double)(float)offset == offset;
}

/* What prepare_forward_weight made, as bits. */
typedef enum {
    RMS_MADE_FLOATS = 1,
    RMS_MADE_DOUBLES = 2
} rms_weight_made;

/* How many floats an element of the forward's weight takes as its fast
   writes read it (prepare_forward_weight): one for 16-bit x, the weight or
   offset + weight rounded once; two for float32 x with an offset, offset +
   weight as two floats hi + lo; none otherwise. */
static inline int rms_forward_weight_floats(rms_kind x, int with_offset)
{
    return rms_kind_size(x) == 2 ? 1 : x == RMS_KIND_F32 && with_offset ? 2 : 0;
}

/*
 * Memory for the forward's weight as its write passes read it
 * (prepare_forward_weight): offset + weight as n doubles hi and n doubles
 * lo with_doubles, and floats_per_element n floats; free memory when done.
 */
typedef struct {
    char *memory;
    double *hi, *lo; /* NULL without doubles */
    float *floats;   /* NULL without floats */
} rms_forward_weight_scratch;

/* Returns 0, having allocated what is asked for (none of it where only the
   floats cannot be had: rows then go in double), or the bytes an offset's
   doubles needed and could not have, having allocated nothing. */
static inline size_t rms_forward_weight_scratch_alloc(rms_forward_weight_scratch *scratch,
                                                      ptrdiff_t n, int floats_per_element,
                                                      int with_doubles)
{
    rms_forward_weight_scratch none = {NULL, NULL, NULL, NULL};
    *scratch = none;
    if ((size_t)n > SIZE_MAX / (2 * sizeof(double) + 2 * sizeof(float))) {
        return SIZE_MAX; /* more than there is to ask for (a stride-0 row) */
    }
    const size_t floats_bytes = (size_t)floats_per_element * (size_t)n * sizeof(float);
    const size_t offset_bytes = with_doubles ? 2 * (size_t)n * sizeof(double) : 0;
    if (floats_bytes + offset_bytes == 0) {
        return 0;
    }
    /* on a cache line: the fast writes load these a vector at a time, and
       a vector across two lines costs two loads (profiled, the pass that
       made them spent most of its time in such stores) */
    const size_t bytes = offset_bytes + floats_bytes;
    scratch->memory = aligned_alloc(64, bytes + (64 - bytes % 64) % 64);
    if (scratch->memory == NULL) {
        return offset_bytes > 0 ? offset_bytes + floats_bytes : 0;
    }
    if (with_doubles) {
        scratch->hi = (double *)(void *)scratch->memory; /* first: aligned for doubles */
        scratch->lo = scratch->hi + n;
    }
    if (floats_per_element > 0) {
        scratch->floats = (float *)(void *)(scratch->memory + offset_bytes);
    }
    return 0;
}

/* Instruction sets, from the most portable to the widest. */
typedef enum {
    RMS_ISA_BASELINE,
    RMS_ISA_AVX2,
    RMS_ISA_AVX512,
    RMS_NUM_ISAS
} rms_isa;

/* The kernels of one type on the instruction set chosen at start-up. They
   take contiguous rows only: every operand's element stride is its kind's
   size, the weight's included (the driver packs strided rows). */
const rms_kernels *rms_kernels_for(rms_type type);

/* The portable kernels of one type, which also take strided rows: for rows
   too long for the driver to pack. */
const rms_kernels *rms_strided_kernels_for(rms_type type);

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
