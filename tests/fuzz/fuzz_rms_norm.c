/*
 * libFuzzer harness for the RMSNorm row kernels (the C files of csrc/kernels, linked
 * directly: no Python, no NumPy).
 *
 * Each input decodes into one forward or backward problem: an element type,
 * an instruction set, a row count and length, element and row strides
 * (negative, zero, padded), eps, and the values themselves. The kernels'
 * results are checked against a scalar reference in long double written
 * here, and everything around the outputs is checked too: inputs unchanged,
 * gaps between strided output elements unchanged, and (under ASan) no byte
 * outside the buffers touched. A rare "big" input runs a problem large
 * enough for the thread pool and checks that 1 and k threads give the same
 * bytes.
 *
 * Build and run: .ci/fuzz.sh. Reproduce a crash: ./fuzz_rms_norm crash-<hash>.
 *
 * Accuracy checked (ULPs of the element type, against the long double
 * reference rounded to it):
 *   y:            1 (float32 x), 3 (float64 x)
 *   grad_input:   the same, plus 8 double roundings of the terms it is the
 *                 difference of (it cancels)
 *   grad_weight:  the same, plus (rows + 2) double roundings of its sum
 * plus, for float64, the absolute error of a subnormal x_hat = x * inv_rms
 * (2^-1075) times what multiplies it afterwards (the weight, grad_output,
 * mean(g * x_hat)): the kernels round x_hat first, in torch's order.
 *
 * Three regimes are known to be off and are skipped unless compiled with
 * -DRMS_FUZZ_STRICT=1 (FUZZ_STRICT=1 .ci/fuzz.sh):
 *   - float32 x where x * inv_rms or y is below 2^-100: the float write pass
 *     loses its low part (tests/test_properties.py, xfail);
 *   - an infinite weight: y is NaN where torch gives +-inf, when the low
 *     part of x * inv_rms is 0 (0 * inf) (tests/test_odd_inputs.py, xfail);
 *   - float64 rows whose 1 / rms exceeds DBL_MAX (all-subnormal rows with
 *     eps = 0): inv_rms itself is not representable; and rows whose 1 / rms
 *     is below DBL_MIN (an RMS past 2^1022): inv_rms is subnormal and y a
 *     few ULP off (tests/test_odd_inputs.py, xfail);
 *   - float64 rows holding |x| > 2^996 on the baseline kernels (no FMA):
 *     Dekker's split of x overflows, y is NaN (tests/test_odd_inputs.py, xfail).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/kernels/kernels.h"
#include "../../csrc/kernels/thread_pool.h"

#ifndef RMS_FUZZ_STRICT
#define RMS_FUZZ_STRICT 0
#endif

/* 4 * 2^-1075: a few roundings of a subnormal double, in absolute terms. */
#define SUBNORMAL_FLOOR 0x1p-1073L

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

/* Value ranges, as binary exponents. */
typedef struct {
    int min_exponent, max_exponent;
    int specials; /* may give 0, -0, inf, -inf, NaN */
} value_class;

static const value_class MODERATE = {-30, 30, 0};
static const value_class FLOAT32_RANGE = {-150, 127, 0}; /* subnormals, overflow to inf */
static const value_class WIDE = {-600, 600, 0};
static const value_class EXTREME = {-1074, 1023, 0};

static double make_value(input *in, value_class range)
{
    unsigned bits = in->left >= 3 ? take(in, 3) : next_random(in);
    int negative = bits & 1;
    unsigned mantissa = (bits >> 1) & 0x7fff;
    unsigned exponent_index = bits >> 16;
    if (range.specials && exponent_index >= 250) {
        static const double specials[6] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0};
        return specials[exponent_index - 250];
    }
    if (exponent_index < 12) {
        return negative ? -0.0 : 0.0; /* zeros are common in real data */
    }
    long span = range.max_exponent - range.min_exponent;
    int exponent = range.min_exponent + (int)((long)(exponent_index - 12) * span / 243);
    double value = ldexp(1.0 + mantissa / 32768.0, exponent);
    return negative ? -value : value;
}

/* ---- element types ----------------------------------------------------------- */

typedef struct {
    rms_type type;
    const char *name;
    int x_size, weight_size, eps_size; /* bytes: 4 float, 8 double */
} fuzz_type;

static const fuzz_type TYPES[] = {
    {RMS_FLOAT32, "float32", 4, 4, 4},
    {RMS_FLOAT64, "float64", 8, 8, 8},
    {RMS_FLOAT32_WEIGHT64, "float32 x, float64 weight", 4, 8, 4},
};
#define NUM_TYPES ((int)(sizeof(TYPES) / sizeof(TYPES[0])))

static long double load(const char *p, int size)
{
    if (size == 4) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    double d;
    memcpy(&d, p, 8);
    return d;
}

static void store(char *p, int size, long double value)
{
    if (size == 4) {
        float f = (float)value;
        memcpy(p, &f, 4);
    }
    else {
        double d = (double)value;
        memcpy(p, &d, 8);
    }
}

static long double round_to(long double value, int size)
{
    return size == 4 ? (long double)(float)value : (long double)(double)value;
}

/* The spacing of `size`-byte floats at |value| (value already rounded). */
static long double ulp(long double value, int size)
{
    value = fabsl(value);
    if (size == 4) {
        float f = isinf(value) ? FLT_MAX : (float)value;
        float up = nextafterf(f, INFINITY);
        return isinf(up) ? (long double)f - nextafterf(f, 0.0f) : (long double)up - f;
    }
    double d = isinf(value) ? DBL_MAX : (double)value;
    double up = nextafter(d, INFINITY);
    return isinf(up) ? (long double)d - nextafter(d, 0.0) : (long double)up - d;
}

/* ---- strided buffers ------------------------------------------------------------ */

/* A (rows, n) operand inside one malloc'd block of exactly its span, so that
   ASan sees any access outside it. Strides are in elements. */
typedef struct {
    char *block, *base, *copy;
    size_t bytes;
    ptrdiff_t row_stride, stride; /* elements */
    int size;
} operand;

static void operand_init(operand *op, ptrdiff_t rows, ptrdiff_t n, ptrdiff_t row_stride,
                         ptrdiff_t stride, int size)
{
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
    op->size = size;
}

static char *at(const operand *op, ptrdiff_t row, ptrdiff_t i)
{
    return op->base + (row * op->row_stride + i * op->stride) * op->size;
}

static void fill_values(operand *op, input *in, value_class range)
{
    for (size_t offset = 0; offset < op->bytes; offset += (size_t)op->size) {
        store(op->block + offset, op->size, make_value(in, range));
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
static const operand *failing_x, *failing_weight;
static ptrdiff_t failing_n;

static void print_row(const char *name, const operand *op, ptrdiff_t row)
{
    if (op == NULL) {
        return;
    }
    fprintf(stderr, "  %s[%td] =", name, row);
    for (ptrdiff_t i = 0; i < failing_n && i < 64; i++) {
        fprintf(stderr, " %.17Lg", load(at(op, op->row_stride ? row : 0, i), op->size));
    }
    fprintf(stderr, failing_n > 64 ? " ...\n" : "\n");
}

static void fail(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                 long double expected, long double allowed)
{
    fprintf(stderr,
            "rms_norm fuzz: %s wrong at row %td, element %td: got %.21Lg, expected %.21Lg "
            "(allowed error %.3Lg)\n  problem: %s\n",
            what, row, i, actual, expected, allowed, problem_text);
    print_row("x", failing_x, row);
    print_row("weight", failing_weight, row);
    abort();
}

static void check_value(const char *what, ptrdiff_t row, ptrdiff_t i, long double actual,
                        long double exact, int size, long double ulps, long double extra)
{
    long double expected = round_to(exact, size);
    if (isnan(expected) || isnan(actual)) {
        if (!(isnan(expected) && isnan(actual))) {
            fail(what, row, i, actual, expected, 0);
        }
        return;
    }
    if (isinf(expected) || isinf(actual)) {
        /* The largest finite value and inf are the two sides of overflow. */
        long double finite = isinf(actual) ? expected : actual;
        long double largest = size == 4 ? FLT_MAX : DBL_MAX;
        if (actual != expected &&
            !(signbit(actual) == signbit(expected) && fabsl(finite) == largest)) {
            fail(what, row, i, actual, expected, 0);
        }
        return;
    }
    long double allowed = ulps * ulp(expected, size) + extra;
    if (fabsl(actual - expected) > allowed) {
        fail(what, row, i, actual, expected, allowed);
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
    int isa, threads, big, specials;
    ptrdiff_t rows, n;
    value_class x_range, weight_range;
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

static long double pick_eps(input *in, int size, char *out)
{
    static const double table[8] = {0.0, 1e-12, 1e-6, 1e-5, 1e-3, 1.0, 3.0, 0.0};
    unsigned choice = take(in, 1);
    double eps = table[choice % 8];
    if (choice % 8 == 7) {
        eps = fabs(make_value(in, MODERATE));
    }
    store(out, size, eps);
    return load(out, size);
}

/* ---- forward -------------------------------------------------------------------------- */

static long double row_max_abs(const operand *op, ptrdiff_t row, ptrdiff_t n)
{
    long double largest = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        long double v = fabsl(load(at(op, row, i), op->size));
        largest = v > largest ? v : largest;
    }
    return largest;
}

static void run_forward(const shape *s, input *in)
{
    const fuzz_type *t = s->type;
    const ptrdiff_t rows = s->rows, n = s->n;
    ptrdiff_t xs = pick_stride(in, 1), ws = pick_stride(in, 1), ys = pick_stride(in, 0);
    operand x, w, y, eps;
    operand_init(&x, rows, n, pick_row_stride(in, n, xs, 1), xs, t->x_size);
    operand_init(&w, rows, n, pick_row_stride(in, n, ws, 1), ws, t->weight_size);
    operand_init(&y, rows, n, pick_row_stride(in, n, ys, 0), ys, t->x_size);
    int eps_per_row = take(in, 1) & 1;
    operand_init(&eps, rows, 1, eps_per_row ? 1 : 0, 1, t->eps_size);
    for (size_t offset = 0; offset < eps.bytes; offset += (size_t)eps.size) {
        pick_eps(in, eps.size, eps.block + offset);
    }
    memcpy(eps.copy, eps.block, eps.bytes);
    fill_values(&x, in, s->x_range);
    fill_values(&w, in, s->weight_range);
    fill_sentinel(&y);

    rms_forward_problem problem = {
        .n = n,
        .x = matrix(&x),
        .weight = matrix(&w),
        .eps = eps.base,
        .eps_stride = eps.row_stride * eps.size,
        .y = matrix(&y),
    };
    char text[256];
    snprintf(text, sizeof text,
             "forward %s isa=%s threads=%d rows=%td n=%td strides x=(%td,%td) w=(%td,%td) "
             "y=(%td,%td) eps_per_row=%d",
             t->name, rms_isa_name((rms_isa)s->isa), s->threads, rows, n, x.row_stride,
             x.stride, w.row_stride, w.stride, y.row_stride, y.stride, eps_per_row);
    problem_text = text;
    failing_x = &x;
    failing_weight = &w;
    failing_n = n;

    rms_norm_forward(t->type, &problem, rows);

    if (s->big) {
        /* The same bytes on one thread. */
        operand again;
        operand_init(&again, rows, n, y.row_stride, y.stride, y.size);
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

    const long double ulps = t->x_size == 4 ? 1 : 3;
    /* A big problem is there for the pool: every 16th row is checked. */
    const ptrdiff_t row_step = s->big ? 16 : 1;
    for (ptrdiff_t r = 0; r < rows && n > 0; r += row_step) {
        long double e = load(at(&eps, r, 0), eps.size);
        long double sum = 0;
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = load(at(&x, r, i), x.size);
            sum += v * v;
        }
        long double inv_rms = 1.0L / sqrtl(sum / n + e);
        if (!RMS_FUZZ_STRICT && t->x_size == 8 && (inv_rms > DBL_MAX || inv_rms < DBL_MIN)) {
            continue; /* known: inv_rms not representable, or subnormal, in double */
        }
        if (!RMS_FUZZ_STRICT && t->x_size == 8 && s->isa == RMS_ISA_BASELINE &&
            row_max_abs(&x, r, n) > 0x1p996L) {
            continue; /* known: Dekker's split overflows */
        }
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = load(at(&x, r, i), x.size);
            long double exact = v * inv_rms * load(at(&w, r, i), w.size);
            if (!RMS_FUZZ_STRICT && t->x_size == 4 &&
                ((v != 0 && fabsl(v * inv_rms) < 0x1p-100L) ||
                 (exact != 0 && fabsl(exact) < 0x1p-100L))) {
                continue; /* known: the float write pass below 2^-100 */
            }
            long double w_i = load(at(&w, r, i), w.size);
            if (!RMS_FUZZ_STRICT && isinf(w_i)) {
                continue; /* known: y is NaN for an infinite weight */
            }
            check_value("y", r, i, load(at(&y, r, i), y.size), exact, y.size, ulps,
                        fabsl(w_i) * SUBNORMAL_FLOOR);
        }
    }
    check_unchanged(&x, "x");
    check_unchanged(&w, "weight");
    check_unchanged(&eps, "eps");
    check_gaps(&y, rows, n, "y");
    operand_free(&x);
    operand_free(&w);
    operand_free(&y);
    operand_free(&eps);
}

/* ---- backward ------------------------------------------------------------------------- */

static void run_backward(const shape *s, input *in)
{
    const fuzz_type *t = s->type;
    const ptrdiff_t rows = s->rows, n = s->n;
    ptrdiff_t gs = pick_stride(in, 1), xs = pick_stride(in, 1), ws = pick_stride(in, 1);
    ptrdiff_t is = pick_stride(in, 0), gws = pick_stride(in, 0);
    operand grad, x, w, grad_in, grad_weight;
    operand_init(&grad, rows, n, pick_row_stride(in, n, gs, 1), gs, t->x_size);
    operand_init(&x, rows, n, pick_row_stride(in, n, xs, 1), xs, t->x_size);
    operand_init(&w, 1, n, 0, ws, t->weight_size);
    operand_init(&grad_in, rows, n, pick_row_stride(in, n, is, 0), is, t->x_size);
    operand_init(&grad_weight, 1, n, 0, gws, t->weight_size);
    char eps_bytes[8];
    long double eps = pick_eps(in, t->eps_size, eps_bytes);
    fill_values(&x, in, s->x_range);
    fill_values(&grad, in, MODERATE);
    fill_values(&w, in, s->weight_range);
    fill_sentinel(&grad_in);
    fill_sentinel(&grad_weight);

    rms_backward_problem problem = {
        .n = n,
        .grad_output = matrix(&grad),
        .x = matrix(&x),
        .weight = w.base,
        .weight_stride = w.stride * w.size,
        .eps = eps_bytes,
        .grad_input = matrix(&grad_in),
    };
    char text[256];
    snprintf(text, sizeof text,
             "backward %s isa=%s threads=%d rows=%td n=%td strides grad=(%td,%td) x=(%td,%td) "
             "w=%td grad_in=(%td,%td) grad_weight=%td eps=%Lg",
             t->name, rms_isa_name((rms_isa)s->isa), s->threads, rows, n, grad.row_stride,
             grad.stride, x.row_stride, x.stride, w.stride, grad_in.row_stride, grad_in.stride,
             grad_weight.stride, eps);
    problem_text = text;
    failing_x = &x;
    failing_weight = &w;
    failing_n = n;

    if (rms_norm_backward(t->type, &problem, rows, grad_weight.base,
                          grad_weight.stride * grad_weight.size) != 0) {
        abort(); /* a few rows of doubles could not be had: not at these sizes */
    }

    if (s->big) {
        operand again_in, again_weight;
        operand_init(&again_in, rows, n, grad_in.row_stride, grad_in.stride, grad_in.size);
        operand_init(&again_weight, 1, n, 0, grad_weight.stride, grad_weight.size);
        fill_sentinel(&again_in);
        fill_sentinel(&again_weight);
        rms_backward_problem single = problem;
        single.grad_input = matrix(&again_in);
        rms_pool_set_num_threads(1);
        rms_norm_backward(t->type, &single, rows, again_weight.base,
                          again_weight.stride * again_weight.size);
        rms_pool_set_num_threads(s->threads);
        if (memcmp(again_in.block, grad_in.block, grad_in.bytes) != 0 ||
            memcmp(again_weight.block, grad_weight.block, grad_weight.bytes) != 0) {
            fprintf(stderr, "rms_norm fuzz: 1 and %d threads differ\n  problem: %s\n",
                    s->threads, problem_text);
            abort();
        }
        operand_free(&again_in);
        operand_free(&again_weight);
    }

    const long double ulps = t->x_size == 4 ? 1 : 3, unit = 0x1p-53L;
    const ptrdiff_t row_step = s->big ? 16 : 1; /* grad_input rows checked */
    long double *gw_sum = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    long double *gw_abs = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    long double *gw_floor = calloc((size_t)(n > 0 ? n : 1), sizeof(long double));
    for (ptrdiff_t r = 0; r < rows && n > 0; r++) {
        long double sum = 0, dot = 0, dot_abs = 0;
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = load(at(&x, r, i), x.size);
            long double g = load(at(&grad, r, i), grad.size) * load(at(&w, 0, i), w.size);
            sum += v * v;
            dot += g * v;
            dot_abs += fabsl(g * v);
        }
        long double inv_rms = 1.0L / sqrtl(sum / n + eps);
        long double mean_g_x_hat = inv_rms * dot / n, mean_abs = inv_rms * dot_abs / n;
        for (ptrdiff_t i = 0; i < n; i++) {
            long double v = load(at(&x, r, i), x.size), dy = load(at(&grad, r, i), grad.size);
            long double g = dy * load(at(&w, 0, i), w.size), x_hat = v * inv_rms;
            long double exact = inv_rms * (g - x_hat * mean_g_x_hat);
            long double terms = inv_rms * (fabsl(g) + fabsl(x_hat) * mean_abs);
            long double floor = inv_rms * (fabsl(mean_g_x_hat) + 2) * SUBNORMAL_FLOOR;
            if (r % row_step == 0) {
                check_value("grad_input", r, i, load(at(&grad_in, r, i), grad_in.size), exact,
                            grad_in.size, ulps, 8 * unit * terms + floor);
            }
            gw_sum[i] += dy * x_hat;
            gw_abs[i] += fabsl(dy * x_hat);
            gw_floor[i] += (fabsl(dy) + 1) * SUBNORMAL_FLOOR; /* x_hat's, and dy * x_hat's */
        }
    }
    for (ptrdiff_t i = 0; i < n; i++) {
        check_value("grad_weight", 0, i, load(at(&grad_weight, 0, i), grad_weight.size), gw_sum[i],
                    grad_weight.size, ulps, (rows + 2) * unit * gw_abs[i] + gw_floor[i]);
    }
    free(gw_sum);
    free(gw_abs);
    free(gw_floor);
    check_unchanged(&grad, "grad_output");
    check_unchanged(&x, "x");
    check_unchanged(&w, "weight");
    check_gaps(&grad_in, rows, n, "grad_input");
    check_gaps(&grad_weight, 1, n, "grad_weight");
    operand_free(&grad);
    operand_free(&x);
    operand_free(&w);
    operand_free(&grad_in);
    operand_free(&grad_weight);
}

/* ---- the entry points --------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    rms_select_isa();
    return 0;
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
    s.specials = (header >> 9) & 1;
    s.big = ((header >> 10) & 0x3f) == 0x3f; /* 1 input in 64 */
    s.isa = (int)((header >> 16) & 0xff) % RMS_NUM_ISAS;
    s.threads = 1 + (int)((header >> 24) & 3);
    unsigned classes = take(&in, 1);
    if (!rms_isa_supported((rms_isa)s.isa)) {
        s.isa = RMS_ISA_BASELINE;
    }
    rms_force_isa((rms_isa)s.isa);
    rms_pool_set_num_threads(s.threads);

    if (s.big) {
        s.rows = 128;
        s.n = 2048 + (ptrdiff_t)(take(&in, 1) % 64); /* 128 x 2048: the pool's threshold */
        in.left = 0; /* values from the generator: a few bytes make the whole problem */
    }
    else {
        s.rows = (ptrdiff_t)(take(&in, 1) % 5);
        s.n = (ptrdiff_t)(take(&in, 2) % 300);
    }
    /* x: moderate, the type's full range, or (float64, forward) the extremes */
    switch (classes % 4) {
    case 0:
    case 1:
        s.x_range = MODERATE;
        break;
    case 2:
        s.x_range = s.type->x_size == 4 ? FLOAT32_RANGE : WIDE;
        break;
    default:
        s.x_range = s.type->x_size == 4 ? FLOAT32_RANGE : backward ? WIDE : EXTREME;
        break;
    }
    s.weight_range = (classes >> 2) & 1 ? (value_class){-126, 100, 0} : (value_class){-10, 10, 0};
    s.x_range.specials = s.weight_range.specials = s.specials;
    if (backward) {
        s.weight_range = (value_class){-10, 10, 0}; /* keeps g * x within double */
        run_backward(&s, &in);
    }
    else {
        run_forward(&s, &in);
    }
    return 0;
}
