/*
 * libFuzzer harness for the RMSNorm row kernels (the C files of csrc/kernels, linked
 * directly: no Python, no NumPy).
 *
 * Each input decodes into one forward or backward problem: an element type
 * (every type of types.h: float16, bfloat16, float32 and float64 x, each with
 * its own weight kind, and float16 and bfloat16 with a float32 weight,
 * float32 with a float64 one), an instruction set, a row count and length,
 * element and row strides (negative, zero, padded), eps, and the values
 * themselves. Some problems take a weight offset (Gemma's 1 + weight:
 * one float64 per row, or one for all, in the forward), some a residual: the
 * forward normalises x + residual, written to residual_out (its own buffer,
 * or in place over x or the residual), the backward adds grad_residual_out.
 * The kernels' results are checked against a scalar reference in long
 * double written here (16-bit values are encoded, decoded and rounded here
 * too, not by the kernels' own conversions), and everything around the
 * outputs is checked too: inputs unchanged, gaps between strided output
 * elements unchanged, and (under ASan) no byte outside the buffers touched.
 * A rare "big" input runs a problem large enough for the thread pool, half
 * of them with rows longer than the backward's 4096-column tile, and checks
 * that 1 and k threads give the same bytes.
 *
 * Edge values, each in a share of the inputs (LLVMFuzzerTestOneInput):
 *   - 0, -0, +-inf and NaN among the elements of every operand: x and the
 *     residual, the weight (forward and backward), grad_output and
 *     grad_residual_out; in half of those inputs without NaN, so that rows
 *     with infinities alone are common, and in half 8 times rarer, so that
 *     rows with just one are;
 *   - float64 x of the whole range, rows of subnormals only (down to
 *     2^-1074 and its small multiples) and rows of 2^1022 to DBL_MAX;
 *     float64 grad_output subnormal, near 2^-1000 or near 2^1000;
 *   - eps (pick_eps): the usual ones, 0, 1e-300, subnormal, 1e300 (inf as
 *     a float), +inf, -inf, NaN, and a negative eps that cancels the row's
 *     mean(x^2) exactly (the rows are then made of few-bit values, whose
 *     sums of squares are exact).
 *
 * Accuracy checked:
 *   residual_out: x + residual rounded once (exactly; y is then checked as
 *                 the forward of residual_out)
 *   y:            the exact result rounded once to the output type (0.5 ULP),
 *                 for every type and instruction set, float64 rows near
 *                 either end of the range included: y must equal the long
 *                 double reference rounded to the type, except where the
 *                 reference (good to 2^-59, relative) is too close to a
 *                 rounding boundary to tell, where either neighbour passes.
 *                 For float64, plus the absolute error of subnormal
 *                 intermediates: x_hat = x * inv_rms (2^-1075 times the
 *                 weight; the kernels round x_hat first, in torch's order)
 *                 and u_lo * w (2^-1075). With an offset the factor is
 *                 offset + weight, exactly (to 2^-64 in long double).
 *   grad_input:   1 ULP (16- and 32-bit x), 3 ULP (float64 x), plus 8
 *                 roundings of the terms it is the difference of (it
 *                 cancels): double roundings, or float roundings for 16-bit x
 *                 (worked in float where fused multiply-adds exist); where
 *                 that error reaches past DBL_MAX (terms near 2^1024 that
 *                 cancel to far less), whatever it reaches, infinities too
 *   grad_weight:  the same ULPs, plus (rows + 2) double roundings of its sum
 * plus, in the backward, the absolute error of subnormal intermediates: of
 * a subnormal double (2^-1075) times what multiplies it afterwards (the
 * weight, grad_output, mean(g * x_hat), and inv_rms where the kernels'
 * vector path may take the row: float64 rows whose inv_rms and sum(g * x)
 * are well inside the range, see vector_path); for 16-bit x, of a
 * subnormal float (2^-150) likewise.
 *
 * Non-finite results follow torch.nn.functional.rms_norm and its autograd,
 * whose formulas the reference evaluates in long double where an input, or
 * 1 / rms, is not finite (where every input is, the exact result stands,
 * even where torch's float64 arithmetic would overflow). In the backward,
 * inv_rms is then taken as the kernels and torch hold it, in double (inf
 * past DBL_MAX):
 *   y           = (x * inv_rms) * w: NaN where inv_rms is (eps NaN or -inf,
 *                 a NaN in x, mean(x^2) + eps < 0), +-inf where inv_rms is
 *                 inf (mean(x^2) + eps = 0) or w is, NaN for inf * 0 (x
 *                 infinite and inv_rms 0, a zero x or w times an infinity,
 *                 and x_hat that rounds to 0 in double times an infinite w);
 *   grad_input  = g * inv_rms - x * (sum(g * x) * inv_rms^3 / n), torch's
 *                 composite gradient term by term, + grad_residual_out;
 *   grad_weight = sum over rows of grad_output * (x * inv_rms).
 * Each non-finite element must be NaN where that gives NaN and inf of the
 * same sign where it gives +-inf; where the reference cannot tell which,
 * the rule is wider, and says so where it is checked: NaN also passes where
 * a product the kernels round to double (x * inv_rms, grad_output * w) may
 * round to 0 and meet an infinity, and any non-finite value where the sign
 * of sum(g * x) is within its rounding of 0 (or its terms are below
 * 2^-1000) and inv_rms is inf, or where its finite terms pass DBL_MAX (the
 * kernels' double sum may overflow).
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/kernels/kernels.h"
#include "../../csrc/kernels/rms_norm.h"
#include "../../csrc/kernels/thread_pool.h"

/*
 * The float64 edge cases this harness found (a zero row with a subnormal
 * eps, mean(x^2) + eps past 2^990, a zero factor, eps dominating mean(x^2),
 * the per-element path's plain sum, eps = inf with sum(g * x) past DBL_MAX,
 * a row whose every g * x underflows) are fixed, each a case in
 * tests/test_float64_range.py, and checked here at the usual bounds.
 */

/* 4 * 2^-1075: a few roundings of a subnormal double, in absolute terms. */
#define SUBNORMAL_FLOOR 0x1p-1073L
/* The same for a subnormal float (4 * 2^-150). */
#define FLOAT_SUBNORMAL_FLOOR 0x1p-148L
/* How far the forward's long double reference may be from the exact
   result, relative: a compensated sum, and a few more roundings (2^-64
   each) for the squares of float64 x, the mean, eps, sqrt, 1 / and the two
   products. 32 of them is generous. */
#define REFERENCE_ERROR 0x1p-59L

/* ---- reading the fuzzer's bytes ------------------------------------------ */

typedef struct {
    const uint8_t *data;
    size_t left;
    uint64_t prng; /* continues the values once the bytes run out */
} input;

static unsigned take(input *in, int bytes)
{
    unsigned value = 0;
    for (int i = 0; i < bytes; i++) {
        value <<= 8;
        if (in->left) {
            value |= *in->data++;
            in->left--;
        }
    }
    return value;
}

static unsigned next_random(input *in)
{
    /* xorshift64*: fills big problems from a few bytes */
    in->prng ^= in->prng >> 12;
    in->prng ^= in->prng << 25;
    in->prng ^= in->prng >> 27;
    return (unsigned)((in->prng * 0x2545F4914F6CDD1DULL) >> 40); /* 24 bits */
}

/* Which special values a range gives, now and then, among its elements. */
typedef enum {
    SPECIALS_NONE,
    SPECIALS_ALL,   /* 0, -0, inf, -inf, NaN, 1 */
    SPECIALS_NO_NAN /* the same with inf for NaN: rows whose only non-finite
                       values are infinities */
} specials_kind;

/* Value ranges, as binary exponents. */
typedef struct {
    int min_exponent, max_exponent;
    specials_kind specials;
    /* specials 8 times rarer: rows with one, not several, are common */
    int rare;
    /* 4-bit significands: sums of squares of a few binades are exact */
    int coarse;
} value_class;

static const value_class MODERATE = {-30, 30, SPECIALS_NONE, 0, 0};
static const value_class FLOAT32_RANGE = {-150, 127, SPECIALS_NONE, 0, 0}; /* subnormals */
static const value_class WIDE = {-600, 600, SPECIALS_NONE, 0, 0};
static const value_class EXTREME = {-1074, 1023, SPECIALS_NONE, 0, 0};
/* float64 rows at either end of the range: subnormals only (2^-1074 and
   its small multiples at the bottom), and 2^1022 up to DBL_MAX itself */
static const value_class F64_SUBNORMAL = {-1074, -1023, SPECIALS_NONE, 0, 0};
static const value_class F64_HUGE = {1022, 1023, SPECIALS_NONE, 0, 0};
/* float64 grad_output near either end of the range */
static const value_class F64_NEAR_MIN = {-1010, -990, SPECIALS_NONE, 0, 0};
static const value_class F64_NEAR_MAX = {990, 1010, SPECIALS_NONE, 0, 0};
/* float16: moderate, and its whole range (subnormals, and overflow to inf
   at the top when the mantissa rounds up) */
static const value_class HALF_MODERATE = {-12, 12, SPECIALS_NONE, 0, 0};
static const value_class HALF_RANGE = {-25, 15, SPECIALS_NONE, 0, 0};

static double make_value(input *in, value_class range)
{
    unsigned bits = in->left >= 3 ? take(in, 3) : next_random(in);
    int negative = bits & 1;
    unsigned mantissa = (bits >> 1) & 0x7fff;
    unsigned exponent_index = bits >> 16;
    if (range.specials != SPECIALS_NONE && exponent_index >= 250 &&
        (!range.rare || (mantissa & 7) == 0)) {
        static const double specials[6] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0};
        const double special = specials[exponent_index - 250];
        return range.specials == SPECIALS_NO_NAN && isnan(special) ? INFINITY : special;
    }
    if (exponent_index >= 250) {
        exponent_index -= 238; /* an ordinary value after all */
    }
    if (exponent_index < 12) {
        return negative ? -0.0 : 0.0; /* zeros are common in real data */
    }
    if (range.coarse) {
        mantissa &= 0x7800;
    }
    /* each of the range's exponents for an equal share of the indices */
    long span = range.max_exponent - range.min_exponent;
    int exponent = range.min_exponent + (int)((long)(exponent_index - 12) * (span + 1) / 238);
    double value = ldexp(1.0 + mantissa / 32768.0, exponent);
    if (exponent == DBL_MAX_EXP - 1 && mantissa == 0x7fff) {
        value = DBL_MAX; /* the largest double among the ones just below it */
    }
    return negative ? -value : value;
}

/* ---- storage kinds: the harness's own encodings and roundings ---------------- */

typedef struct {
    const char *name;
    int size;      /* bytes */
    int precision; /* significand bits */
    int min_exponent, max_exponent; /* of normal numbers */
} format;

static const format FORMATS[] = {
    [RMS_KIND_F32] = {"float32", 4, 24, -126, 127},
    [RMS_KIND_F64] = {"float64", 8, 53, -1022, 1023},
    [RMS_KIND_F16] = {"float16", 2, 11, -14, 15},
    [RMS_KIND_BF16] = {"bfloat16", 2, 8, -126, 127},
};

static int kind_size(rms_kind kind) { return FORMATS[kind].size; }

/* value rounded once to the kind, to nearest, ties to even, with the kind's
   subnormals and overflow to inf. */
static long double round_to(rms_kind kind, long double value)
{
    const format *f = &FORMATS[kind];
    if (!isfinite(value) || value == 0) {
        return value;
    }
    int exponent = ilogbl(value);
    if (exponent < f->min_exponent) {
        exponent = f->min_exponent;
    }
    int quantum = exponent - (f->precision - 1);
    long double rounded = ldexpl(rintl(ldexpl(value, -quantum)), quantum);
    long double largest = ldexpl(2.0L - ldexpl(1.0L, 1 - f->precision), f->max_exponent);
    return fabsl(rounded) > largest ? copysignl(INFINITY, value) : rounded;
}

/* The spacing of the kind's values at |value| (value already rounded): the
   spacing above it, and at the largest finite value for inf. */
static long double ulp(rms_kind kind, long double value)
{
    const format *f = &FORMATS[kind];
    int exponent = f->max_exponent;
    if (isfinite(value)) {
        exponent = value == 0 ? f->min_exponent : ilogbl(value);
        exponent = exponent < f->min_exponent ? f->min_exponent : exponent;
    }
    return ldexpl(1.0L, exponent - (f->precision - 1));
}

static long double load(rms_kind kind, const char *p)
{
    uint16_t h;
    uint32_t u;
    float f;
    double d;
    switch (kind) {
    case RMS_KIND_F16: {
        memcpy(&h, p, 2);
        int exponent = (h >> 10) & 0x1f;
        long double magnitude;
        if (exponent == 0x1f) {
            magnitude = (h & 0x3ff) ? NAN : INFINITY;
        }
        else if (exponent == 0) {
            magnitude = ldexpl(h & 0x3ff, -24);
        }
        else {
            magnitude = ldexpl(0x400 | (h & 0x3ff), exponent - 25);
        }
        return h & 0x8000 ? -magnitude : magnitude;
    }
    case RMS_KIND_BF16:
        memcpy(&h, p, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case RMS_KIND_F32:
        memcpy(&f, p, 4);
        return f;
    default:
        memcpy(&d, p, 8);
        return d;
    }
}

static void store(rms_kind kind, char *p, long double value)
{
    const long double rounded = round_to(kind, value);
    uint16_t h;
    uint32_t u;
    float f = (float)rounded; /* exact for every kind but float64 */
    double d = (double)rounded;
    switch (kind) {
    case RMS_KIND_F16: {
        const long double magnitude = fabsl(rounded);
        h = signbit(rounded) ? 0x8000 : 0;
        if (isnan(rounded)) {
            h = 0x7e00;
        }
        else if (isinf(rounded)) {
            h |= 0x7c00;
        }
        else if (magnitude < 0x1p-14L) {
            h |= (uint16_t)(magnitude * 0x1p24L);
        }
        else {
            int exponent = ilogbl(magnitude);
            h |= (uint16_t)((exponent + 15) << 10);
            h |= (uint16_t)((ldexpl(magnitude, -exponent) - 1) * 1024);
        }
        memcpy(p, &h, 2);
        return;
    }
    case RMS_KIND_BF16:
        memcpy(&u, &f, 4);
        h = isnan(f) ? 0x7fc0 : (uint16_t)(u >> 16);
        memcpy(p, &h, 2);
        return;
    case RMS_KIND_F32:
        memcpy(p, &f, 4);
        return;
    default:
        memcpy(p, &d, 8);
        return;
    }
}

/* ---- element types ----------------------------------------------------------- */

typedef struct {
    rms_type type;
    const char *name;
    rms_kind x, weight, eps;
} fuzz_type;

/* Every type of types.h, in its order. */
#define FUZZ_TYPE(name, x, weight)                                                         \
    {RMS_##name, #name, RMS_KIND_##x, RMS_KIND_##weight,                                   \
     RMS_KIND_##x == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32},
static const fuzz_type TYPES[] = {RMS_FOR_EACH_TYPE(FUZZ_TYPE)};
#undef FUZZ_TYPE
#define NUM_TYPES ((int)(sizeof(TYPES) / sizeof(TYPES[0])))

/* Kinds whose every value is a float: the kernels' float write serves a type
   whose x and weight both are. */

/* ---- strided buffers ------------------------------------------------------------ */

/* A (rows, n) operand inside one malloc'd block of exactly its span, so that
   ASan sees any access outside it. Strides are in elements. */
typedef struct {
    char *block, *base, *copy;
    size_t bytes;
    ptrdiff_t row_stride, stride; /* elements */
    rms_kind kind;
    int size;
} operand;

static void operand_init(operand *op, ptrdiff_t rows, ptrdiff_t n, ptrdiff_t row_stride,
                         ptrdiff_t stride, rms_kind kind)
{
    const int size = kind_size(kind);
    ptrdiff_t lo = 0, hi = 0;
    if (rows > 0 && n > 0) {
        ptrdiff_t corners[4] = {0, (rows - 1) * row_stride, (n - 1) * stride,
                                (rows - 1) * row_stride + (n - 1) * stride};
        for (int i = 0; i < 4; i++) {
            lo = corners[i] < lo ? corners[i] : lo;
            hi = corners[i] > hi ? corners[i] : hi;
        }
    }
    op->bytes = (size_t)(hi - lo + 1) * (size_t)size;
    op->block = malloc(op->bytes);
    op->copy = malloc(op->bytes);
    if (op->block == NULL || op->copy == NULL) {
        abort();
    }
    op->base = op->block - lo * size;
    op->row_stride = row_stride;
    op->stride = stride;
    op->kind = kind;
    op->size = size;
}

static char *at(const operand *op, ptrdiff_t row, ptrdiff_t i)
{
    return op->base + (row * op->row_stride + i * op->stride) * op->size;
}

static long double value_at(const operand *op, ptrdiff_t row, ptrdiff_t i)
{
    return load(op->kind, at(op, row, i));
}

/* The value before the kernels ran, for an operand they update in place. */
static long double original_at(const operand *op, ptrdiff_t row, ptrdiff_t i)
{
    return load(op->kind, op->copy + (at(op, row, i) - op->block));
}

static void fill_values(operand *op, input *in, value_class range)
{
    for (size_t offset = 0; offset < op->bytes; offset += (size_t)op->size) {
        store(op->kind, op->block + offset, make_value(in, range));
    }
    memcpy(op->copy, op->block, op->bytes);
}

static void fill_sentinel(operand *op)
{
    memset(op->block, 0x5a, op->bytes);
    memcpy(op->copy, op->block, op->bytes);
}

static rms_matrix matrix(const operand *op)
{
    return (rms_matrix){op->base, op->row_stride * op->size, op->stride * op->size};
}

static void operand_free(operand *op)
{
    free(op->block);
    free(op->copy);
}

/* ---- failures --------------------------------------------------------------------- */

static const char *problem_text = "";
/* The current problem's row inputs, printed with a failure. */
static const operand *failing_x, *failing_weight, *failing_grad_output;
static ptrdiff_t failing_n;

static void print_row(const char *name, const operand *op, ptrdiff_t row)
{
    if (op == NULL) {
        return;
    }
    fprintf(stderr, "  %s[%td] =", name, row);
    for (ptrdiff_t i = 0; i < failing_n && i < 64; i++) {
        fprintf(stderr, " %.17Lg", value_at(op, op->row_stride ? row : 0, i));
    }
    fprintf(stderr, failing_n > 64 ? " ...\n" : "\n");
}

static void print_rows(ptrdiff_t row)
{
    fprintf(stderr, "  problem: %s\n", problem_text);
    print_row("x", failing_x, row);
    print_row("weight", failing_weight, row);
    print_row("grad_output", failing_grad_output, row);
}

static void fail(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                 long double expected, long double allowed)
{
    fprintf(stderr,
            "rms_norm fuzz: %s wrong at row %td, element %td: got %.21Lg, expected %.21Lg "
            "(allowed error %.3Lg)\n",
            what, row, i, actual, expected, allowed);
    print_rows(row);
    abort();
}

/* actual within ulps ULPs of exact rounded to the kind, plus extra. Where
   that error reaches past the kind's largest finite value (grad_input's
   terms near DBL_MAX that cancel to far less, leaving the result
   undetermined within the range), the infinity on that side passes too,
   and so does a finite actual within it of an exact that rounds to inf. */
static void check_value(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                        long double exact, rms_kind kind, long double ulps, long double extra)
{
    long double expected = round_to(kind, exact);
    if (isnan(expected) || isnan(actual)) {
        if (!(isnan(expected) && isnan(actual))) {
            fail(what, row, i, actual, expected, 0);
        }
        return;
    }
    long double allowed = ulps * ulp(kind, expected) + extra;
    if (isinf(expected) || isinf(actual)) {
        long double largest = ldexpl(2.0L - ldexpl(1.0L, 1 - FORMATS[kind].precision),
                                     FORMATS[kind].max_exponent);
        /* the largest finite value and inf are the two sides of overflow */
        long double finite = isinf(actual) ? expected : actual;
        int passes = actual == expected ||
                     (signbit(actual) == signbit(expected) && fabsl(finite) == largest);
        if (!isinf(exact)) {
            passes |= isinf(actual)
                          ? (signbit(actual) ? allowed - exact : exact + allowed) >= largest
                          : fabsl(actual - exact) <= allowed;
        }
        if (!passes) {
            fail(what, row, i, actual, expected, allowed);
        }
        return;
    }
    if (fabsl(actual - expected) > allowed) {
        fail(what, row, i, actual, expected, allowed);
    }
}

/*
 * actual is reference rounded once to the kind: reference is within
 * reference_error of the exact result, and the kernel may be off by extra
 * (absolute) before its rounding, so any value rounded from within that
 * much of the reference passes. With extra = 0, that is the correctly
 * rounded result (0.5 ULP) wherever the reference decides it.
 */
static void check_rounded(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                          long double reference, long double reference_error, rms_kind kind,
                          long double extra, const long double detail[4])
{
    const long double expected = round_to(kind, reference);
    if (isnan(reference) || isinf(reference)) {
        if (!(isnan(reference) ? isnan(actual) : actual == reference)) {
            fail(what, row, i, actual, expected, 0);
        }
        return;
    }
    const long double spread = reference_error + extra;
    const long double lowest = round_to(kind, reference - spread);
    const long double highest = round_to(kind, reference + spread);
    if (isnan(actual) || actual < lowest || actual > highest) {
        fprintf(stderr,
                "rms_norm fuzz: %s wrong at row %td, element %td: got %.21Lg, expected %.21Lg "
                "(%.3Lg ULP off; allowed [%.21Lg, %.21Lg]; reference %.21Lg)\n",
                what, row, i, actual, expected, (actual - expected) / ulp(kind, expected), lowest,
                highest, reference);
        fprintf(stderr, "  x = %.21Lg, weight = %.21Lg, inv_rms = %.21Lg, eps = %.21Lg\n",
                detail[0], detail[1], detail[2], detail[3]);
        print_rows(row);
        abort();
    }
}

/* How a non-finite expectation is held to (the header's rules). */
typedef enum {
    EXACTLY,       /* NaN for NaN, inf of the same sign for inf */
    OR_NAN,        /* that, or NaN: a product the kernels round may be 0
                      before it meets an infinity */
    ANY_NON_FINITE /* inf of either sign or NaN: the sign of what makes it
                      infinite is within its rounding of 0 */
} non_finite_rule;

static void check_non_finite(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                             long double expected, non_finite_rule rule)
{
    int passes = isnan(expected) ? isnan(actual) : actual == expected;
    passes |= rule == OR_NAN && isnan(actual);
    passes |= rule == ANY_NON_FINITE && !isfinite(actual);
    if (!passes) {
        fail(what, row, i, actual, expected, 0);
    }
}

static void check_unchanged(const operand *op, const char *what)
{
    if (memcmp(op->block, op->copy, op->bytes) != 0) {
        fprintf(stderr, "rms_norm fuzz: %s was written to\n  problem: %s\n", what, problem_text);
        abort();
    }
}

/* The bytes of an output operand outside its elements must keep the sentinel. */
static void check_gaps(const operand *op, ptrdiff_t rows, ptrdiff_t n, const char *what)
{
    char *mask = calloc(op->bytes ? op->bytes : 1, 1);
    for (ptrdiff_t r = 0; r < rows; r++) {
        for (ptrdiff_t i = 0; i < n; i++) {
            memset(mask + (at(op, r, i) - op->block), 1, (size_t)op->size);
        }
    }
    for (size_t b = 0; b < op->bytes; b++) {
        if (!mask[b] && op->block[b] != op->copy[b]) {
            fprintf(stderr, "rms_norm fuzz: %s written outside its elements (byte %zu)\n"
                            "  problem: %s\n", what, b, problem_text);
            abort();
        }
    }
    free(mask);
}

/* ---- the problem's shape ------------------------------------------------------------ */

typedef struct {
    const fuzz_type *type;
    int isa, threads, big;
    ptrdiff_t rows, n;
    value_class x_range, weight_range, grad_range;
} shape;

static ptrdiff_t pick_stride(input *in, int allow_zero)
{
    static const ptrdiff_t choices[8] = {1, 1, 2, -1, 3, -2, 0, 1};
    ptrdiff_t stride = choices[take(in, 1) % 8];
    return stride == 0 && !allow_zero ? 1 : stride;
}

/* A row stride that keeps rows apart (or 0, when allowed: every row the same). */
static ptrdiff_t pick_row_stride(input *in, ptrdiff_t n, ptrdiff_t stride, int allow_zero)
{
    unsigned choice = take(in, 1);
    ptrdiff_t span = n > 0 ? (n - 1) * (stride < 0 ? -stride : stride) + 1 : 1;
    if (allow_zero && choice % 5 == 0) {
        return 0;
    }
    ptrdiff_t padded = span + (ptrdiff_t)((choice >> 3) % 3);
    return choice & 4 ? -padded : padded;
}

/* One eps, stored in the type's eps kind at out, which may round it (a
   float eps takes 1e-300 and the subnormals as 0, 1e300 as inf): the usual
   ones, a moderate one, and the ends of the range. Returns 1, having
   stored -0, where eps is to cancel a row's mean(x^2) (1 in 8):
   cancelling_eps sets it once the row is made. */
static int pick_eps(input *in, rms_kind kind, char *out)
{
    static const double table[14] = {0.0, 1e-12, 1e-6,     1e-5,      1e-3,      1.0, 3.0,
                                     0.0, 1e-300, 0x1p-1074, 1e300, INFINITY, -INFINITY, NAN};
    const unsigned choice = take(in, 1) % 16;
    double eps = choice < 14 ? table[choice] : -0.0;
    if (choice == 7) {
        eps = fabs(make_value(in, MODERATE));
    }
    else if (choice == 9) {
        eps = fabs(make_value(in, F64_SUBNORMAL)); /* or 0, now and then */
    }
    store(kind, out, eps);
    return choice >= 14;
}

/* A weight offset: Gemma's 1 and other round ones, 0 (the kernels then take
   none), or a value of either range (the forward's reach past float's,
   where offset + weight is finite in double only). */
static double pick_offset(input *in, value_class range, value_class other_range)
{
    static const double table[6] = {1.0, 1.0, -0.5, 0x1p-20, 0.0, -1.0};
    unsigned choice = take(in, 1) % 8;
    return choice < 6 ? table[choice] : make_value(in, choice == 6 ? range : other_range);
}

/* ---- forward -------------------------------------------------------------------------- */

/* sum(x^2) over a row, compensated (Neumaier): the squares of 16- and
   32-bit x are exact in long double, those of float64 x good to 2^-64.
   NaN if x holds a NaN, else inf if it holds an inf: found without
   arithmetic on them, which costs x87 a microcode assist (a hundred times
   the time) on every operation. */
static long double row_sum_squares(const operand *x, ptrdiff_t row, ptrdiff_t n)
{
    long double sum = 0, compensation = 0;
    int any_inf = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        long double v = value_at(x, row, i);
        if (!isfinite(v)) {
            if (isnan(v)) {
                return NAN;
            }
            any_inf = 1;
            continue;
        }
        long double square = v * v;
        long double t = sum + square;
        compensation += fabsl(sum) >= fabsl(square) ? (sum - t) + square : (square - t) + sum;
        sum = t;
    }
    return any_inf ? INFINITY : sum + compensation;
}

/* A row's values as the kernels normalise them: x, or x + residual
   rounded once to x's kind (float64's sum in double), from the inputs as
   they were before the kernels ran. */
typedef struct {
    const operand *x, *residual; /* residual NULL where there is none */
} row_values;

static long double normalised_value(const row_values *values, ptrdiff_t row, ptrdiff_t i)
{
    const long double a = original_at(values->x, row, i);
    if (values->residual == NULL) {
        return a;
    }
    const long double b = original_at(values->residual, row, i);
    /* exact in long double but for float64, whose own sum is rounded once */
    return values->x->kind == RMS_KIND_F64 ? (long double)((double)a + (double)b)
                                           : round_to(values->x->kind, a + b);
}

/* sum(x^2) over a row where every partial sum of its squares, in any
   order, is exact in double, as the kernels' lanes add them and the
   reference too: each square is a double, a multiple of 2^low, and their
   sum is below 2^(low + 53). NaN where that is not so. */
static long double exact_sum_squares(const row_values *values, ptrdiff_t row, ptrdiff_t n)
{
    long double sum = 0;
    int low = INT_MAX;
    for (ptrdiff_t i = 0; i < n; i++) {
        const long double v = normalised_value(values, row, i);
        const long double square = v * v;
        if (!isfinite(square) || fmal(v, v, -square) != 0 ||
            (long double)(double)square != square) {
            return NAN;
        }
        if (square == 0) {
            continue;
        }
        int exponent = ilogbl(square) - 63; /* square = m 2^exponent, m a 64-bit integer */
        uint64_t m = (uint64_t)ldexpl(square, -exponent);
        for (; (m & 1) == 0; m >>= 1) {
            exponent++;
        }
        low = exponent < low ? exponent : low;
        sum += square;
    }
    return sum == 0 || ilogbl(sum) < low + 53 ? sum : NAN;
}

/* The eps that cancels mean(x^2) of row `row` exactly, stored in kind at
   out: -mean(x^2), where that is a value of kind and the rows [first,
   end), which the same eps serves, all have exact sums of squares (a
   negative eps leaves each of them a difference of two means, that only
   exact sums keep). Else -0 (mean(x^2) + eps is then mean(x^2)). */
static void cancelling_eps(const row_values *values, ptrdiff_t row, ptrdiff_t first,
                           ptrdiff_t end, ptrdiff_t n, rms_kind kind, char *out)
{
    long double eps = -0.0L;
    const long double sum = exact_sum_squares(values, row, n);
    int exact = n > 0 && !isnan(sum);
    for (ptrdiff_t r = first; r < end && exact; r++) {
        exact = !isnan(exact_sum_squares(values, r, n));
    }
    if (exact) {
        const long double mean = sum / n;
        if (fmal(mean, (long double)n, -sum) == 0 && round_to(kind, mean) == mean) {
            eps = -mean;
        }
    }
    store(kind, out, eps);
}

static int clamp_exponent(int exponent, int lowest, int highest)
{
    return exponent < lowest ? lowest : exponent > highest ? highest : exponent;
}

/* x's range made coarse (few-bit values in a few binades, where their
   squares are exact) for rows that a negative eps is to cancel. */
static value_class coarse_range(input *in, value_class range)
{
    const int lowest = clamp_exponent(range.min_exponent, -60, 48);
    const int highest = clamp_exponent(range.max_exponent - 6, lowest, 48);
    range.min_exponent = lowest + (int)(take(in, 1) % (unsigned)(highest - lowest + 1));
    range.max_exponent = range.min_exponent + 6;
    range.coarse = 1;
    return range;
}

/* 1 / sqrt(mean(x^2) + eps) from a row's sum of squares: mean(x^2) + eps
   is rounded once where eps is negative, so that an eps that cancels the
   mean gives 0 (inv_rms inf), and one that nearly does keeps its digits. */
static long double reference_inv_rms(long double sum_squares, ptrdiff_t n, long double eps)
{
    if (eps < 0) {
        return 1.0L / sqrtl(fmal(eps, (long double)n, sum_squares) / n);
    }
    return 1.0L / sqrtl(sum_squares / n + eps);
}

static void run_forward(const shape *s, input *in)
{
    const fuzz_type *t = s->type;
    const ptrdiff_t rows = s->rows, n = s->n;
    ptrdiff_t xs = pick_stride(in, 1), ws = pick_stride(in, 1), ys = pick_stride(in, 0);
    operand x, w, y, eps, offsets, residual, residual_out;
    operand_init(&x, rows, n, pick_row_stride(in, n, xs, 1), xs, t->x);
    operand_init(&w, rows, n, pick_row_stride(in, n, ws, 1), ws, t->weight);
    operand_init(&y, rows, n, pick_row_stride(in, n, ys, 0), ys, t->x);
    unsigned variant = take(in, 1);
    int eps_per_row = variant & 1;
    operand_init(&eps, rows, 1, eps_per_row ? 1 : 0, 1, t->eps);
    /* eps: one per row (slot k is row k's), or one for all (slot 0) */
    const ptrdiff_t eps_slots = (ptrdiff_t)(eps.bytes / (size_t)eps.size);
    char *cancels = calloc((size_t)eps_slots, 1);
    int any_cancels = 0;
    for (ptrdiff_t k = 0; k < eps_slots; k++) {
        cancels[k] = (char)pick_eps(in, t->eps, eps.block + k * eps.size);
        any_cancels |= cancels[k];
    }
    const value_class x_range = any_cancels ? coarse_range(in, s->x_range) : s->x_range;
    fill_values(&x, in, x_range);
    fill_values(&w, in, s->weight_range);
    fill_sentinel(&y);
    /* A weight offset per row or one for all; a residual, and residual_out
       in its own buffer, or over x or the residual where their elements
       are apart (not in a big problem, which runs twice). */
    const int with_offset = (variant >> 1) & 1, with_residual = (variant >> 2) & 1;
    operand_init(&offsets, rows, 1, (variant >> 3) & 1, 1, RMS_KIND_F64);
    for (size_t offset = 0; offset < offsets.bytes; offset += 8) {
        store(RMS_KIND_F64, offsets.block + offset, pick_offset(in, MODERATE, WIDE));
    }
    memcpy(offsets.copy, offsets.block, offsets.bytes);
    ptrdiff_t rs = pick_stride(in, 1), hs = pick_stride(in, 0);
    operand_init(&residual, rows, n, pick_row_stride(in, n, rs, 1), rs, t->x);
    operand_init(&residual_out, rows, n, pick_row_stride(in, n, hs, 0), hs, t->x);
    fill_values(&residual, in, x_range);
    fill_sentinel(&residual_out);
    const row_values values = {&x, with_residual ? &residual : NULL};
    for (ptrdiff_t k = 0; k < eps_slots && k < rows; k++) {
        if (cancels[k]) {
            cancelling_eps(&values, k, eps_per_row ? k : 0, eps_per_row ? k + 1 : rows, n,
                           t->eps, eps.block + k * eps.size);
        }
    }
    memcpy(eps.copy, eps.block, eps.bytes);
    free(cancels);
    const operand *h = with_residual ? &residual_out : &x; /* what is normalised */
    /* 0: its own buffer, 1: over x, 2: over the residual */
    int in_place = s->big || !with_residual ? 0 : (variant >> 4) % 3;
    if (in_place == 1 && (x.stride == 0 || (x.row_stride == 0 && rows > 1))) {
        in_place = 0;
    }
    if (in_place == 2 && (residual.stride == 0 || (residual.row_stride == 0 && rows > 1))) {
        in_place = 0;
    }
    h = in_place == 1 ? &x : in_place == 2 ? &residual : h;

    rms_forward_problem problem = {
        .n = n,
        .x = matrix(&x),
        .weight = matrix(&w),
        .eps = eps.base,
        .eps_stride = eps.row_stride * eps.size,
        .weight_offset = with_offset ? offsets.base : NULL,
        .weight_offset_stride = offsets.row_stride * offsets.size,
        .residual = with_residual ? matrix(&residual) : (rms_matrix){0},
        .residual_out = with_residual ? matrix(h) : (rms_matrix){0},
        .y = matrix(&y),
    };
    char text[320];
    snprintf(text, sizeof text,
             "forward %s isa=%s threads=%d rows=%td n=%td strides x=(%td,%td) w=(%td,%td) "
             "y=(%td,%td) eps_per_row=%d offset=%d%s residual=%d (%td,%td) in_place=%d",
             t->name, rms_isa_name((rms_isa)s->isa), s->threads, rows, n, x.row_stride,
             x.stride, w.row_stride, w.stride, y.row_stride, y.stride, eps_per_row, with_offset,
             offsets.row_stride ? " per row" : "", with_residual, residual.row_stride,
             residual.stride, in_place);
    problem_text = text;
    failing_x = h;
    failing_weight = &w;
    failing_grad_output = NULL;
    failing_n = n;

    if (rms_norm_forward(t->type, &problem, rows) != 0) {
        abort(); /* a weight offset's 2n doubles could not be had: not at these sizes */
    }

    if (s->big) {
        /* The same bytes on one thread. */
        operand again;
        operand_init(&again, rows, n, y.row_stride, y.stride, y.kind);
        fill_sentinel(&again);
        rms_forward_problem single = problem;
        single.y = matrix(&again);
        rms_pool_set_num_threads(1);
        rms_norm_forward(t->type, &single, rows);
        rms_pool_set_num_threads(s->threads);
        if (memcmp(again.block, y.block, y.bytes) != 0) {
            fprintf(stderr, "rms_norm fuzz: 1 and %d threads differ\n  problem: %s\n",
                    s->threads, problem_text);
            abort();
        }
        operand_free(&again);
    }

    /* A big problem is there for the pool: every 16th row is checked. */
    const ptrdiff_t row_step = s->big ? 16 : 1;
    for (ptrdiff_t r = 0; r < rows && n > 0 && with_residual; r += row_step) {
        for (ptrdiff_t i = 0; i < n; i++) {
            check_value("residual_out", r, i, value_at(h, r, i), normalised_value(&values, r, i),
                        t->x, 0, 0);
        }
    }
    for (ptrdiff_t r = 0; r < rows && n > 0; r += row_step) {
        long double e = value_at(&eps, r, 0);
        long double offset = with_offset ? value_at(&offsets, r, 0) : 0;
        const long double sum_squares = row_sum_squares(h, r, n);
        long double inv_rms = reference_inv_rms(sum_squares, n, e);
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = value_at(h, r, i), w_i = offset + value_at(&w, r, i);
            long double reference = isnan(inv_rms) ? NAN : v * inv_rms * w_i;
            if (isinf(w_i)) {
                /* torch: x_hat, rounded (in double here), times +-inf */
                const long double x_hat = v * inv_rms;
                if (x_hat != 0 && fabsl(x_hat) <= 0x1p-1075L) {
                    /* torch's x_hat rounds to 0, and 0 * inf is NaN; the
                       exact x_hat, and the kernels' rows near the ends of
                       the range, give inf of its sign */
                    check_non_finite("y", r, i, value_at(&y, r, i), x_hat * w_i, OR_NAN);
                    continue;
                }
                reference = (long double)(double)x_hat * w_i;
            }
            long double extra = 0;
            if (t->x == RMS_KIND_F64) {
                extra = (fabsl(w_i) + 1) * SUBNORMAL_FLOOR;
            }
            const long double detail[4] = {v, w_i, inv_rms, e};
            check_rounded("y", r, i, value_at(&y, r, i), reference,
                          REFERENCE_ERROR * fabsl(reference), y.kind, extra, detail);
        }
    }
    if (h != &x) {
        check_unchanged(&x, "x");
    }
    if (h != &residual) {
        check_unchanged(&residual, "residual");
    }
    check_unchanged(&w, "weight");
    check_unchanged(&eps, "eps");
    check_unchanged(&offsets, "weight_offset");
    check_gaps(&y, rows, n, "y");
    check_gaps(h, rows, n, "residual_out");
    operand_free(&x);
    operand_free(&w);
    operand_free(&y);
    operand_free(&eps);
    operand_free(&offsets);
    operand_free(&residual);
    operand_free(&residual_out);
}

/* ---- backward ------------------------------------------------------------------------- */

static void run_backward(const shape *s, input *in)
{
    const fuzz_type *t = s->type;
    const ptrdiff_t rows = s->rows, n = s->n;
    ptrdiff_t gs = pick_stride(in, 1), xs = pick_stride(in, 1), ws = pick_stride(in, 1);
    ptrdiff_t is = pick_stride(in, 0), gws = pick_stride(in, 0);
    operand grad_output, x, w, grad_input, grad_weight, grad_residual;
    operand_init(&grad_output, rows, n, pick_row_stride(in, n, gs, 1), gs, t->x);
    operand_init(&x, rows, n, pick_row_stride(in, n, xs, 1), xs, t->x);
    operand_init(&w, 1, n, 0, ws, t->weight);
    operand_init(&grad_input, rows, n, pick_row_stride(in, n, is, 0), is, t->x);
    operand_init(&grad_weight, 1, n, 0, gws, t->weight);
    char eps_bytes[8];
    const int eps_cancels = pick_eps(in, t->eps, eps_bytes);
    fill_values(&x, in, eps_cancels ? coarse_range(in, s->x_range) : s->x_range);
    fill_values(&grad_output, in, s->grad_range);
    fill_values(&w, in, s->weight_range);
    fill_sentinel(&grad_input);
    fill_sentinel(&grad_weight);
    /* A weight offset, and grad_residual_out, in some problems */
    unsigned variant = take(in, 1);
    /* the weight's range (keeps g * x within double), finite: the weight
       itself brings the infinities */
    value_class offset_range = s->weight_range;
    offset_range.specials = SPECIALS_NONE;
    const double offset = pick_offset(in, offset_range, offset_range);
    ptrdiff_t grs = pick_stride(in, 1);
    operand_init(&grad_residual, rows, n, pick_row_stride(in, n, grs, 1), grs, t->x);
    fill_values(&grad_residual, in, s->grad_range);
    const int with_offset = variant & 1, with_residual = (variant >> 1) & 1;
    if (eps_cancels && rows > 0) {
        const row_values values = {&x, NULL};
        cancelling_eps(&values, 0, 0, rows, n, t->eps, eps_bytes); /* row 0's, for every row */
    }
    const long double eps = load(t->eps, eps_bytes);

    rms_backward_problem problem = {
        .n = n,
        .grad_output = matrix(&grad_output),
        .x = matrix(&x),
        .weight = w.base,
        .weight_stride = w.stride * w.size,
        .eps = eps_bytes,
        .weight_offset = with_offset ? (const char *)&offset : NULL,
        .grad_residual_out = with_residual ? matrix(&grad_residual) : (rms_matrix){0},
        .grad_input = matrix(&grad_input),
    };
    char text[320];
    snprintf(text, sizeof text,
             "backward %s isa=%s threads=%d rows=%td n=%td strides grad_output=(%td,%td) "
             "x=(%td,%td) w=%td grad_input=(%td,%td) grad_weight=%td eps=%Lg offset=%s%.17g "
             "grad_residual_out=%d (%td,%td)",
             t->name, rms_isa_name((rms_isa)s->isa), s->threads, rows, n,
             grad_output.row_stride, grad_output.stride, x.row_stride, x.stride, w.stride,
             grad_input.row_stride, grad_input.stride, grad_weight.stride, eps,
             with_offset ? "" : "none, not ", offset, with_residual, grad_residual.row_stride,
             grad_residual.stride);
    problem_text = text;
    failing_x = &x;
    failing_weight = &w;
    failing_grad_output = &grad_output;
    failing_n = n;

    if (rms_norm_backward(t->type, &problem, rows, grad_weight.base,
                          grad_weight.stride * grad_weight.size) != 0) {
        abort(); /* a few rows of doubles could not be had: not at these sizes */
    }

    if (s->big) {
        operand again_in, again_weight;
        operand_init(&again_in, rows, n, grad_input.row_stride, grad_input.stride,
                     grad_input.kind);
        operand_init(&again_weight, 1, n, 0, grad_weight.stride, grad_weight.kind);
        fill_sentinel(&again_in);
        fill_sentinel(&again_weight);
        rms_backward_problem single = problem;
        single.grad_input = matrix(&again_in);
        rms_pool_set_num_threads(1);
        rms_norm_backward(t->type, &single, rows, again_weight.base,
                          again_weight.stride * again_weight.size);
        rms_pool_set_num_threads(s->threads);
        if (memcmp(again_in.block, grad_input.block, grad_input.bytes) != 0 ||
            memcmp(again_weight.block, grad_weight.block, grad_weight.bytes) != 0) {
            fprintf(stderr, "rms_norm fuzz: 1 and %d threads differ\n  problem: %s\n",
                    s->threads, problem_text);
            abort();
        }
        operand_free(&again_in);
        operand_free(&again_weight);
    }

    const long double ulps = t->x == RMS_KIND_F64 ? 3 : 1, unit = 0x1p-53L;
    /* 16-bit rows are worked in float where fused multiply-adds exist */
    const int half = kind_size(t->x) == 2;
    const long double input_unit = half ? 0x1p-24L : unit;
    const long double floor_unit = half ? FLOAT_SUBNORMAL_FLOOR : SUBNORMAL_FLOOR;
    const ptrdiff_t row_step = s->big ? 16 : 1; /* grad_input rows checked */
    /* grad_weight over the rows: the sum of its finite terms, and what its
       infinite and NaN ones make of it (GW_* flags) */
    long double *gw_sum = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    long double *gw_abs = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    long double *gw_floor = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    unsigned char *gw_non_finite = calloc((size_t)(n > 0 ? n : 1), 1);
    enum { GW_NAN = 1, GW_PLUS_INF = 2, GW_MINUS_INF = 4, GW_OR_NAN = 8 };
    const long double factor_offset = with_offset ? offset : 0;
    for (ptrdiff_t r = 0; r < rows && n > 0; r++) {
        /* sum(g * x) over the finite terms, and whether every input is finite */
        long double dot = 0, dot_abs = 0;
        int finite = isfinite(eps);
        for (ptrdiff_t i = 0; i < n; i++) {
            const long double v = value_at(&x, r, i);
            const long double g =
                value_at(&grad_output, r, i) * (factor_offset + value_at(&w, 0, i));
            if (!isfinite(v) || !isfinite(g)) {
                finite = 0;
                continue;
            }
            dot += g * v;
            dot_abs += fabsl(g * v);
        }
        const long double sum_squares = row_sum_squares(&x, r, n);
        const long double inv_rms = reference_inv_rms(sum_squares, n, eps);
        if (!finite || !isfinite(inv_rms) || inv_rms == 0) {
            /* torch's composite gradient, term by term (the header's),
               with inv_rms as the kernels and torch hold it, in double:
               inf past DBL_MAX */
            const long double inv = (long double)(double)inv_rms;
            long double sum_g_x = 0;
            for (ptrdiff_t j = 0; j < n; j++) {
                sum_g_x += value_at(&grad_output, r, j) * (factor_offset + value_at(&w, 0, j)) *
                           value_at(&x, r, j);
            }
            const long double through_inv = sum_g_x * (inv * inv * inv) / n;
            /* the kernels' sum(g * x) may differ in sign, or be 0: its
               terms cancel, or are near double's subnormal range */
            const int sign_unsure = isfinite(sum_g_x) && (fabsl(sum_g_x) <= 0x1p-50L * dot_abs ||
                                                          dot_abs < 0x1p-1000L);
            /* the kernels' own sum of the finite terms, in double, may
               overflow (to inf of either sign) where they pass DBL_MAX */
            const int sum_may_overflow = dot_abs >= 0x1p1023L;
            for (ptrdiff_t i = 0; i < n; i++) {
                const long double v = value_at(&x, r, i), dy = value_at(&grad_output, r, i);
                const long double g = dy * (factor_offset + value_at(&w, 0, i));
                const long double added = with_residual ? value_at(&grad_residual, r, i) : 0;
                const long double x_hat = v * inv, expected = g * inv - v * through_inv + added;
                /* products the kernels round to double, which may give 0
                   where the reference's do not: x * inv_rms, which then
                   meets mean(g * x_hat) or grad_output, and g, which meets
                   an infinite inv_rms */
                const int x_hat_may_vanish = x_hat != 0 && fabsl(x_hat) <= 0x1p-1075L;
                const int g_may_vanish = g != 0 && fabsl(g) <= 0x1p-1075L;
                if (r % row_step == 0) {
                    if (isfinite(expected)) {
                        /* inv_rms 0 (eps inf) and sum(g * x) finite: 0 + added */
                        check_value("grad_input", r, i, value_at(&grad_input, r, i), expected,
                                    grad_input.kind, 0, 0);
                    }
                    else {
                        non_finite_rule rule = EXACTLY;
                        if (x_hat_may_vanish || (isinf(inv) && g_may_vanish)) {
                            rule = OR_NAN;
                        }
                        if ((isinf(inv) && sign_unsure) || sum_may_overflow) {
                            rule = ANY_NON_FINITE;
                        }
                        check_non_finite("grad_input", r, i, value_at(&grad_input, r, i),
                                         expected, rule);
                    }
                }
                const long double term = dy * x_hat;
                if (isnan(term)) {
                    gw_non_finite[i] |= GW_NAN;
                }
                else if (isinf(term)) {
                    gw_non_finite[i] |= (term > 0 ? GW_PLUS_INF : GW_MINUS_INF) |
                                        (x_hat_may_vanish ? GW_OR_NAN : 0);
                }
                else {
                    gw_sum[i] += term;
                    gw_abs[i] += fabsl(term);
                    /* and inv_rms's own rounding in double, subnormal for
                       an RMS past 2^1022, times dy * x */
                    gw_floor[i] += (fabsl(dy) + 1 + (t->x == RMS_KIND_F64 ? 0 : inv)) *
                                       floor_unit +
                                   fabsl(dy * v) * SUBNORMAL_FLOOR;
                }
            }
            continue;
        }
        long double mean_g_x_hat = inv_rms * dot / n, mean_abs = inv_rms * dot_abs / n;
        /* The kernels' vector path has subnormal intermediates, which
           inv_rms multiplies; float64 rows whose inv_rms or sum(g * x)
           leaves 2^+-960 or 2^+-900 (here with a margin) go to a path that
           forms every product from significands and has none. */
        const int vector_path =
            t->x != RMS_KIND_F64 ||
            !(inv_rms >= 0x1p962L || inv_rms < 0x1p-961L || fabsl(dot) > 0x1p902L ||
              (dot != 0 && fabsl(dot) < 0x1p-902L));
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = value_at(&x, r, i), dy = value_at(&grad_output, r, i);
            long double g = dy * (factor_offset + value_at(&w, 0, i)), x_hat = v * inv_rms;
            long double added = with_residual ? value_at(&grad_residual, r, i) : 0;
            const long double gradient = inv_rms * (g - x_hat * mean_g_x_hat);
            long double exact = gradient + added;
            long double terms = inv_rms * (fabsl(g) + fabsl(x_hat) * mean_abs) + fabsl(added);
            long double floor =
                ((vector_path ? inv_rms : 0) * (fabsl(mean_g_x_hat) + 2) + 1) * floor_unit;
            if (r % row_step == 0 && isinf(added) && fabsl(gradient) > DBL_MAX) {
                /* an infinite grad_residual_out added to a gradient past
                   double's range: torch's gradient, in double, is inf,
                   and its sum NaN where the signs oppose */
                check_non_finite("grad_input", r, i, value_at(&grad_input, r, i), exact, OR_NAN);
            }
            else if (r % row_step == 0) {
                check_value("grad_input", r, i, value_at(&grad_input, r, i), exact,
                            grad_input.kind, ulps, 8 * input_unit * terms + floor);
            }
            gw_sum[i] += dy * x_hat;
            gw_abs[i] += fabsl(dy * x_hat);
            /* x_hat's, and dy * x_hat's (or, for 16- and 32-bit x, dy * x's
               in float, times inv_rms) */
            gw_floor[i] += (fabsl(dy) + 1 + (t->x == RMS_KIND_F64 ? 0 : inv_rms)) * floor_unit;
        }
    }
    for (ptrdiff_t i = 0; i < n; i++) {
        const unsigned flags = gw_non_finite[i];
        const long double actual = value_at(&grad_weight, 0, i);
        if ((flags & GW_NAN) || ((flags & GW_PLUS_INF) && (flags & GW_MINUS_INF))) {
            check_non_finite("grad_weight", 0, i, actual, NAN, EXACTLY);
        }
        else if (flags & (GW_PLUS_INF | GW_MINUS_INF)) {
            check_non_finite("grad_weight", 0, i, actual,
                             flags & GW_PLUS_INF ? INFINITY : -INFINITY,
                             flags & GW_OR_NAN ? OR_NAN : EXACTLY);
        }
        else {
            check_value("grad_weight", 0, i, actual, gw_sum[i], grad_weight.kind, ulps,
                        (rows + 2) * unit * gw_abs[i] + gw_floor[i]);
        }
    }
    free(gw_sum);
    free(gw_abs);
    free(gw_floor);
    free(gw_non_finite);
    check_unchanged(&grad_output, "grad_output");
    check_unchanged(&x, "x");
    check_unchanged(&w, "weight");
    check_unchanged(&grad_residual, "grad_residual_out");
    check_gaps(&grad_input, rows, n, "grad_input");
    check_gaps(&grad_weight, 1, n, "grad_weight");
    operand_free(&grad_output);
    operand_free(&x);
    operand_free(&w);
    operand_free(&grad_input);
    operand_free(&grad_weight);
    operand_free(&grad_residual);
}

/* ---- the entry points --------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    rms_select_isa();
    return 0;
}

/* x's ranges by kind: moderate, and the kind's whole range; for float64,
   one of four wide ones (choice, 0 to 3): the whole range, rows of
   subnormals, rows near DBL_MAX, and a wide middle. */
static value_class moderate_for(rms_kind kind)
{
    return kind == RMS_KIND_F16 ? HALF_MODERATE : MODERATE;
}

static value_class full_range_for(rms_kind kind, unsigned choice)
{
    static const value_class *const FLOAT64_RANGES[4] = {&EXTREME, &F64_SUBNORMAL, &F64_HUGE,
                                                         &WIDE};
    switch (kind) {
    case RMS_KIND_F16:
        return HALF_RANGE;
    case RMS_KIND_F64:
        return *FLOAT64_RANGES[choice % 4];
    default:
        return FLOAT32_RANGE; /* float32 and bfloat16 */
    }
}

/* grad_output's and grad_residual_out's range: moderate, and for float64
   now and then (choice, 0 to 7) subnormal, near 2^-1000 or near 2^1000. */
static value_class grad_range_for(rms_kind kind, unsigned choice)
{
    if (kind != RMS_KIND_F64 || choice % 8 < 5) {
        return moderate_for(kind);
    }
    return choice % 8 == 5 ? F64_SUBNORMAL : choice % 8 == 6 ? F64_NEAR_MIN : F64_NEAR_MAX;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size, 0x9E3779B97F4A7C15ULL ^ size};
    for (size_t i = 0; i < size && i < 64; i++) {
        in.prng = (in.prng ^ data[i]) * 0x100000001B3ULL;
    }
    unsigned header = take(&in, 4);
    shape s = {0};
    s.type = &TYPES[(header & 0xff) % NUM_TYPES];
    int backward = (header >> 8) & 1;
    int x_specials = (header >> 9) & 1;
    s.big = ((header >> 10) & 0x3f) == 0x3f; /* 1 input in 64 */
    s.isa = (int)((header >> 16) & 0xff) % RMS_NUM_ISAS;
    s.threads = 1 + (int)((header >> 24) & 3);
    int weight_specials = (header >> 26) & 1;
    int grad_specials = (header >> 27) & 1;
    /* in half of the inputs with specials, infinities but no NaN; in half,
       specials 8 times rarer (1 element in 340) */
    const specials_kind specials = (header >> 28) & 1 ? SPECIALS_NO_NAN : SPECIALS_ALL;
    const int rare_specials = (header >> 29) & 1;
    unsigned classes = take(&in, 1);
    if (!rms_isa_supported((rms_isa)s.isa)) {
        s.isa = RMS_ISA_BASELINE;
    }
    rms_force_isa((rms_isa)s.isa);
    rms_pool_set_num_threads(s.threads);

    if (s.big) {
        /* 128 x 2048: four of the pool's chunks; rows past 4096 are written a
           tile at a time, in chunks of 8 to 15 rows (float32) */
        const unsigned length = take(&in, 1);
        s.rows = 128;
        s.n = length & 0x80 ? 4097 + (ptrdiff_t)(length & 0x7f) * 31
                            : 2048 + (ptrdiff_t)(length % 64);
        in.left = 0; /* values from the generator: a few bytes make the whole problem */
    }
    else {
        s.rows = (ptrdiff_t)(take(&in, 1) % 5);
        s.n = (ptrdiff_t)(take(&in, 2) % 300);
    }
    const rms_kind xk = s.type->x, wk = s.type->weight;
    /* x: moderate, or the type's full range (for float64, one of four) */
    s.x_range = classes % 4 < 2 ? moderate_for(xk) : full_range_for(xk, (classes >> 3) & 3);
    s.x_range.specials = x_specials ? specials : SPECIALS_NONE;
    s.x_range.rare = rare_specials;
    /* weight: small, or wide (float16's own range for a float16 weight);
       +-inf (and 0, NaN) among them with weight_specials */
    if ((classes >> 2) & 1) {
        s.weight_range =
            wk == RMS_KIND_F16 ? HALF_RANGE : (value_class){-126, 100, SPECIALS_NONE, 0, 0};
    }
    else {
        s.weight_range = (value_class){-10, 10, SPECIALS_NONE, 0, 0};
    }
    s.grad_range = grad_range_for(xk, classes >> 5);
    s.grad_range.specials = grad_specials ? specials : SPECIALS_NONE;
    s.grad_range.rare = rare_specials;
    if (backward) {
        /* keeps g * x within double */
        s.weight_range = (value_class){-10, 10, SPECIALS_NONE, 0, 0};
        s.weight_range.specials = weight_specials ? specials : SPECIALS_NONE;
        s.weight_range.rare = rare_specials;
        run_backward(&s, &in);
    }
    else {
        s.weight_range.specials = weight_specials ? specials : SPECIALS_NONE;
        s.weight_range.rare = rare_specials;
        run_forward(&s, &in);
    }
    return 0;
}
