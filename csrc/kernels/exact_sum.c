/* A long accumulator: the sum held as a fixed-point integer in base-2^32
   digits, each in an int64_t so that carries wait (exact_sum.h). */
#include "exact_sum.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"

/* Digit k weighs 2^(32 k + RMS_ACC_LOW): the lowest bit of a subnormal
   double, 2^-1074, lies in digit 1, and 2^1024 times 2^64 of headroom
   below the top digit. */
#define RMS_ACC_LOW (-1120)
#define RMS_ACC_DIGITS 72
/* Each element adds two terms, each under 2^33 to a digit: carried every
   2^27 elements, a digit stays under 2^62. */
#define RMS_ACC_ELEMENTS_BETWEEN_CARRIES ((ptrdiff_t)1 << 27)
#define RMS_ACC_DIGIT_MASK 0xffffffffu

typedef struct {
    int64_t digit[RMS_ACC_DIGITS];
} rms_accumulator;

/* Adds a finite double, its 53-bit significand shifted into three digits. */
static void rms_accumulate(rms_accumulator *acc, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    const int field = (int)((bits >> 52) & 0x7ff);
    uint64_t significand = bits & ((UINT64_C(1) << 52) - 1);
    if (field != 0) {
        significand |= UINT64_C(1) << 52;
    }
    if (significand == 0) {
        return;
    }
    /* v = significand * 2^(exponent), exponent >= -1074 */
    const int exponent = (field != 0 ? field : 1) - 1075;
    const int shift = exponent - RMS_ACC_LOW;
    const int k = shift / 32, r = shift % 32;
    const uint64_t low = (significand & RMS_ACC_DIGIT_MASK) << r; /* under 2^63 */
    const uint64_t high = (significand >> 32) << r;                /* under 2^52 */
    const int64_t sign = bits >> 63 ? -1 : 1;
    acc->digit[k] += sign * (int64_t)(low & RMS_ACC_DIGIT_MASK);
    acc->digit[k + 1] += sign * (int64_t)((low >> 32) + (high & RMS_ACC_DIGIT_MASK));
    acc->digit[k + 2] += sign * (int64_t)(high >> 32);
}

/* Every digit but the top one into [0, 2^32), the carries moved up. */
static void rms_carry(rms_accumulator *acc)
{
    for (int k = 0; k + 1 < RMS_ACC_DIGITS; k++) {
        const int64_t rest = acc->digit[k] & (int64_t)RMS_ACC_DIGIT_MASK;
        acc->digit[k + 1] += (acc->digit[k] - rest) / ((int64_t)1 << 32);
        acc->digit[k] = rest;
    }
}

/* The accumulated sum as a double-double: its top five digits, from the
   highest nonzero one, are 129 bits at least; those below change it by
   less than 2^-128 of it. */
static rms_dd rms_accumulator_value(rms_accumulator *acc)
{
    rms_carry(acc);
    const int negative = acc->digit[RMS_ACC_DIGITS - 1] < 0;
    if (negative) { /* a magnitude to read, so that no digit cancels another */
        for (int k = 0; k < RMS_ACC_DIGITS; k++) {
            acc->digit[k] = -acc->digit[k];
        }
        rms_carry(acc);
    }
    int top = RMS_ACC_DIGITS - 1;
    while (top > 0 && acc->digit[top] == 0) {
        top--;
    }
    rms_dd sum = {0.0, 0.0};
    for (int k = top >= 4 ? top - 4 : 0; k <= top; k++) {
        double err;
        sum.hi = rms_two_sum(sum.hi, ldexp((double)acc->digit[k], 32 * k + RMS_ACC_LOW), &err);
        sum.lo += err;
    }
    sum.hi = rms_two_sum(sum.hi, sum.lo, &sum.lo);
    if (negative) {
        sum.hi = -sum.hi;
        sum.lo = -sum.lo;
    }
    return sum;
}

int rms_mean_cancels(double sum_squares, ptrdiff_t n, double eps)
{
    const double mean = sum_squares / (double)n;
    return eps < 0.0 && mean + eps < 0.5 * mean && eps > -2.0 * mean && isfinite(mean);
}

rms_dd rms_inv_rms_exactly(rms_kind kind, ptrdiff_t n, const char *x, ptrdiff_t xs, double scale,
                           double eps)
{
    rms_accumulator acc;
    memset(&acc, 0, sizeof acc);
    for (ptrdiff_t i = 0; i < n; i++) {
        const double v = rms_load_scalar(kind, x + i * xs) * scale;
        const double square = v * v;
        rms_accumulate(&acc, square);
        rms_accumulate(&acc, fma(v, v, -square)); /* the square's rounding, exactly */
        if ((i + 1) % RMS_ACC_ELEMENTS_BETWEEN_CARRIES == 0) {
            rms_carry(&acc);
        }
    }
    const double n_eps = (double)n * eps;
    rms_accumulate(&acc, n_eps);
    rms_accumulate(&acc, fma((double)n, eps, -n_eps));
    return rms_inv_rms_from_sum(rms_accumulator_value(&acc), (double)n, 0.0);
}
