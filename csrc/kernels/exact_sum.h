/*
 * The exact sum of a row's squares plus n eps, for the rare rows whose
 * negative eps cancels most of mean(x^2): there the compensated sum's last
 * bits, a few 2^-106 of the mean, are no longer small beside mean + eps.
 * Compiled once, in portable C: only such rows call it.
 */
#ifndef RMSNORM_KERNELS_EXACT_SUM_H
#define RMSNORM_KERNELS_EXACT_SUM_H

#include <stddef.h>

#include "dd_math.h"
#include "types.h"

/* Both only read: said so, the row loops that call them need not assume
   that the call wrote memory and reload what they hold across it (unsaid,
   the kernels grew by 8 KB). */
#if defined(__GNUC__)
#define RMS_READS_ONLY __attribute__((pure))
#else
#define RMS_READS_ONLY
#endif

/* Whether a negative eps takes away more than half of mean(x^2), and may
   leave mean + eps of either sign: the sum's rounding, relative to the
   mean, then grows relative to mean + eps as the two cancel, and the sum
   is made exact (rms_inv_rms_exactly). Where eps passes -2 mean, mean +
   eps is negative beyond doubt. Out of line: the row plans, inlined into
   every rows loop, ask only where eps < 0. */
RMS_READS_ONLY int rms_mean_cancels(double sum_squares, ptrdiff_t n, double eps);

/* 1 / sqrt(mean((scale x)^2) + eps) as rms_inv_rms_from_sum makes it,
   from sum((scale x_i)^2) + n eps made exactly, then rounded to a
   double-double (within 2^-104 of it, relative): for n finite values of
   kind, stride xs bytes, scale a power of two, eps finite, and |n eps|
   below DBL_MAX. A square under 2^-969 (|scale x| under about 2^-484),
   or n eps under that, loses what its rounding error has below 2^-1074,
   and a sum under 2^-900 is divided by n at that scale: a row whose eps
   cancels its mean down there may still be off (docs/accuracy.md). */
RMS_READS_ONLY rms_dd rms_inv_rms_exactly(rms_kind kind, ptrdiff_t n, const char *x, ptrdiff_t xs,
                                          double scale, double eps);

#endif
