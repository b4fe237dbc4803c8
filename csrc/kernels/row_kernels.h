/*
 * The RMSNorm row kernels, written once against the vector vocabulary of
 * simd/vec_*.h, and its moves of blocks in any kind and stride
 * (simd/blocks.h), and compiled by each isa_*.c into one table of kernels
 * per element type (types.h). The kernels themselves are in row/, one idea
 * a file, each using the ones included before it:
 *
 *   sums.h              the lanes of sums, their total, inv_rms's range
 *   forward_blocks.h    one block of y, rounded once, and why it is exact
 *   forward_write.h     a row's write pass, with the next row's reduction
 *   forward_rows.h      each row's inv_rms and write mode, the rows loop
 *   backward_blocks.h   the backward's operands, one block of its write
 *   backward_extreme.h  its rare rows, out of line
 *   backward.h          each row's plan and write pass, their table entries
 *
 * Functions that depend on an element type take the storage kind of x
 * (xk), and of the weight (wk) where they need it, as arguments. They are
 * constants wherever a table entry calls in, so each type's kernels
 * compile to straight-line code of their own: the switch on a kind, and
 * the choice between compensated and plain sums, fold away.
 *
 * Every row is worked in two passes: one reduces, one writes, with the row
 * still in cache between them. While a row is written, the next one is
 * reduced in the same loop, and where the output is streamed to memory the
 * row after it is asked for: rms_forward_write says why. Sums go into
 * RMS_LANES double lanes, element i into lane i % RMS_LANES: it breaks the
 * add latency chain, and fixes the summation order, so results do not
 * depend on how rows are split among threads or whether a row was packed.
 *
 * The including file has defined RMS_LANES and included its vocabulary.
 */
#ifndef RMSNORM_KERNELS_ROW_KERNELS_H
#define RMSNORM_KERNELS_ROW_KERNELS_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dd_math.h"
#include "exact_sum.h"
#include "half.h"
#include "kernels.h"

#define RMS_VD_PER_VF (RMS_VF_WIDTH / RMS_VD_WIDTH)
/* Whether this table's kernels also take strided rows (kernels.h): only
   isa_strided.c's, for rows too long to pack; in every table the strided
   loops doubled the machine code, for rows the driver now packs. */
#ifndef RMS_STRIDED_ROWS
#define RMS_STRIDED_ROWS 0
#endif
/* Loops over a block's vectors or a row's accumulators have constant trip
   counts; unrolled whole, their accumulators can stay in registers. */
#if defined(__clang__)
#define RMS_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define RMS_UNROLL _Pragma("GCC unroll 64")
#else
#define RMS_UNROLL
#endif
#define RMS_ACCUMULATORS (RMS_LANES / RMS_VD_WIDTH)
/* The backward sums two things in one pass and gives each half the lanes:
   more would not fit in the registers. */
#define RMS_DOT_LANES (RMS_LANES / 2)

#include "simd/blocks.h"

/* In the order each needs the ones before it. */
#include "row/sums.h"
#include "row/forward_blocks.h"
#include "row/forward_write.h"
#include "row/forward_rows.h"
#include "row/backward_blocks.h"
#include "row/backward_extreme.h"
#include "row/backward.h"

/* ---- one table entry per type ------------------------------------------- */

/* The forward's entry runs one rows loop of three, without a residual,
   with one, or with one whose residual_out the write pass makes again
   (rms_remakes_residual_out): a constant each, since a test in the
   reduction pass costs the plain forward registers in its hottest loop. */

#define RMS_ROW_KERNELS(name, x, weight)                                                   \
    static size_t forward_rows_##name(const rms_forward_problem *p, ptrdiff_t row_begin,   \
                                      ptrdiff_t row_end)                                   \
    {                                                                                      \
        const rms_kind xk = RMS_KIND_##x, wk = RMS_KIND_##weight;                          \
        if (p->residual.data == NULL) {                                                    \
            return rms_forward_rows_of(xk, wk, 0, 0, p, row_begin, row_end);               \
        }                                                                                  \
        return rms_remakes_residual_out(xk, p)                                             \
                   ? rms_forward_rows_of(xk, wk, 1, 1, p, row_begin, row_end)              \
                   : rms_forward_rows_of(xk, wk, 1, 0, p, row_begin, row_end);             \
    }                                                                                      \
    static void widen_weight_##name(ptrdiff_t n, const char *src, ptrdiff_t src_stride,    \
                                    double *dst)                                           \
    {                                                                                      \
        rms_widen_weight(RMS_KIND_##weight, n, src, src_stride, dst);                      \
    }                                                                                      \
    static void store_weight_##name(ptrdiff_t n, const double *src, char *dst,             \
                                    ptrdiff_t dst_stride)                                  \
    {                                                                                      \
        rms_store_weight(RMS_KIND_##weight, n, src, dst, dst_stride);                      \
    }
RMS_FOR_EACH_TYPE(RMS_ROW_KERNELS)
#undef RMS_ROW_KERNELS

#define RMS_TABLE_ENTRY(name, x, weight)                                                   \
    [RMS_##name] = {forward_rows_##name,                                                   \
                    plan_backward_rows_##name, write_backward_rows_##name,                 \
                    rms_prepare_forward_weight_##name,                                     \
                    RMS_OFFSET_IN_FLOATS(RMS_KIND_##x, RMS_KIND_##weight),                 \
                    widen_weight_##name,       store_weight_##name},

#endif
