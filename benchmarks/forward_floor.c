/*
 * The float16 forward's arithmetic and nothing else, beside a copy: the
 * floor under the real kernel that no tuning of its loops can pass.
 * Built and run by forward_floor.py, which says what the figures mean.
 *
 * Each loop is written in the kernels' own AVX-512 vocabulary
 * (csrc/kernels/simd/vec_avx512.h), with the operations an exactly rounded
 * float16 output needs (csrc/kernels/row/forward_blocks.h says why
 * each is there):
 *
 *   reduce  sum(x^2) in double lanes: a widening to double and a fused
 *           multiply-add for every element;
 *   write   y = x * w * inv_rms, rounded to float16 twice, from just below
 *           and just above inv_rms, and stored where the two agree;
 *   forward both in one loop, the next row's reduction inside this row's
 *           write, as the kernel runs them;
 *   copy    memcpy of the same bytes, what np.copyto does.
 *
 * No calls, no row set-up, no unsure blocks, no heads or tails: n is a
 * multiple of 64, and the arrays are aligned.
 *
 * Usage: forward_floor ROWS N REPEATS; prints one line per loop, "name
 * seconds", the median of REPEATS timings of all ROWS rows.
 */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* built for AVX-512 (F, BW, DQ, VL), FMA and F16C: forward_floor.py's flags */
#include "../csrc/kernels/simd/vec_avx512.h"

#define LANES 64 /* the kernel's RMS_LANES on AVX-512: 8 vectors of doubles */

typedef struct {
    rms_vd sum[LANES / RMS_VD_WIDTH];
} lanes;

static inline void reduce_step(lanes *acc, const char *x)
{
    for (int b = 0; b < LANES / RMS_VF_WIDTH; b++) {
        rms_vd parts[2];
        rms_vd_load_widened(RMS_KIND_F16, x + 2 * RMS_VF_WIDTH * b, parts);
        for (int h = 0; h < 2; h++) {
            rms_vd *s = &acc->sum[2 * b + h];
            *s = rms_vd_muladd(parts[h], parts[h], *s);
        }
    }
}

static inline int write_step(const char *x, const float *w, char *y, rms_vf below,
                             rms_vf above)
{
    int unsure = 0;
    for (int b = 0; b < LANES / RMS_VF_WIDTH; b++) {
        const rms_vf xv = rms_vf_load(RMS_KIND_F16, x + 2 * RMS_VF_WIDTH * b);
        const rms_vf wv = rms_vf_load(RMS_KIND_F32, (const char *)(w + RMS_VF_WIDTH * b));
        const rms_vf p = rms_vf_mul(xv, wv);
        const rms_vh hi = rms_vf_to_float16(rms_vf_mul(p, above));
        if (!rms_vh_equal(rms_vf_to_float16(rms_vf_mul(p, below)), hi)) {
            unsure++;
            continue;
        }
        rms_vh_store(y + 2 * RMS_VF_WIDTH * b, hi, 0);
    }
    return unsure;
}

static double total(const lanes *acc)
{
    double out[RMS_VD_WIDTH], sum = 0.0;
    for (int k = 0; k < LANES / RMS_VD_WIDTH; k++) {
        rms_vd_store((char *)out, acc->sum[k], 0);
        for (int i = 0; i < RMS_VD_WIDTH; i++) {
            sum += out[i];
        }
    }
    return sum;
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    size_t rows, n;
    char *x, *y;
    float *w;
    double sink;
    long unsure;
} problem;

static void run_copy(problem *p) { memcpy(p->y, p->x, 2 * p->rows * p->n); }

static void run_reduce(problem *p)
{
    for (size_t r = 0; r < p->rows; r++) {
        lanes acc = {{{0}}};
        for (size_t i = 0; i < p->n; i += LANES) {
            reduce_step(&acc, p->x + 2 * (r * p->n + i));
        }
        p->sink += total(&acc);
    }
}

static void run_write(problem *p)
{
    const rms_vf below = rms_vf_set(0.99999994f), above = rms_vf_set(1.0000001f);
    for (size_t r = 0; r < p->rows; r++) {
        for (size_t i = 0; i < p->n; i += LANES) {
            const size_t at = 2 * (r * p->n + i);
            p->unsure += write_step(p->x + at, p->w + i, p->y + at, below, above);
        }
    }
}

static void run_forward(problem *p)
{
    const rms_vf below = rms_vf_set(0.99999994f), above = rms_vf_set(1.0000001f);
    for (size_t r = 0; r < p->rows; r++) {
        lanes next = {{{0}}};
        const size_t next_row = r + 1 < p->rows ? r + 1 : 0;
        for (size_t i = 0; i < p->n; i += LANES) {
            const size_t at = 2 * (r * p->n + i);
            p->unsure += write_step(p->x + at, p->w + i, p->y + at, below, above);
            reduce_step(&next, p->x + 2 * (next_row * p->n + i));
        }
        p->sink += total(&next);
    }
}

static int compare_doubles(const void *a, const void *b)
{
    const double u = *(const double *)a, v = *(const double *)b;
    return (u > v) - (u < v);
}

static double median_seconds(void (*loop)(problem *), problem *p, int repeats, double *times)
{
    loop(p); /* warm-up */
    for (int k = 0; k < repeats; k++) {
        const double start = seconds();
        loop(p);
        times[k] = seconds() - start;
    }
    qsort(times, (size_t)repeats, sizeof *times, compare_doubles);
    return times[repeats / 2];
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s ROWS N REPEATS\n", argv[0]);
        return 2;
    }
    problem p = {0};
    p.rows = (size_t)strtoul(argv[1], NULL, 10);
    p.n = (size_t)strtoul(argv[2], NULL, 10);
    const int repeats = atoi(argv[3]);
    if (p.rows == 0 || p.n == 0 || p.n % LANES != 0 || repeats <= 0) {
        fprintf(stderr, "ROWS and REPEATS must be positive, N a multiple of %d\n", LANES);
        return 2;
    }
    const size_t bytes = 2 * p.rows * p.n;
    double *times = malloc((size_t)repeats * sizeof *times);
    if (posix_memalign((void **)&p.x, 64, bytes) || posix_memalign((void **)&p.y, 64, bytes) ||
        posix_memalign((void **)&p.w, 64, 4 * p.n) || times == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    /* float16 values in [0.5, 2): every output a normal float16 */
    uint16_t *x = (uint16_t *)(void *)p.x;
    for (size_t i = 0; i < p.rows * p.n; i++) {
        x[i] = (uint16_t)(0x3800u + (uint16_t)((i * 2654435761u) % 0x800u));
    }
    for (size_t i = 0; i < p.n; i++) {
        p.w[i] = 0.5f + (float)(i % 97) / 97.0f;
    }
    memset(p.y, 0, bytes);
    printf("copy %.9f\n", median_seconds(run_copy, &p, repeats, times));
    printf("reduce %.9f\n", median_seconds(run_reduce, &p, repeats, times));
    printf("write %.9f\n", median_seconds(run_write, &p, repeats, times));
    printf("forward %.9f\n", median_seconds(run_forward, &p, repeats, times));
    /* what keeps the compiler from dropping the loops */
    fprintf(stderr, "checksum %g, unsure blocks %ld\n", p.sink, p.unsure);
    free(p.x);
    free(p.y);
    free(p.w);
    free(times);
    return 0;
}
