/* The row driver: deals rows to the thread pool in chunks. */
#include "rms_norm.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "thread_pool.h"

/*
 * Rows are dealt in chunks of about this many elements: large enough that
 * taking a chunk (one atomic add) is noise, small enough that two threads
 * finish close together on a shared, noisy machine.
 */
#define RMS_CHUNK_ELEMENTS 16384
/* Below this many elements a problem stays on the calling thread: waking a
   worker costs more than the work (measured with benchmarks/bench.py). */
#define RMS_PARALLEL_MIN_ELEMENTS 131072
/* Backward chunks are larger: each ends with a commit of n doubles into
   grad_weight. */
#define RMS_BACKWARD_CHUNK_ELEMENTS 65536

static ptrdiff_t rows_per_chunk(ptrdiff_t n, ptrdiff_t chunk_elements)
{
    return n >= chunk_elements ? 1 : chunk_elements / (n > 0 ? n : 1);
}

static int threads_for(ptrdiff_t rows, ptrdiff_t n, ptrdiff_t chunks)
{
    if (rows * n < RMS_PARALLEL_MIN_ELEMENTS) {
        return 1;
    }
    int allowed = rms_pool_get_num_threads();
    return chunks < allowed ? (int)chunks : allowed;
}

typedef struct {
    const rms_kernels *kernels;
    const rms_forward_problem *problem;
    ptrdiff_t rows, rows_per_chunk, chunks;
    atomic_ptrdiff_t next_chunk;
} forward_job;

static void forward_task(void *context, int thread_index, int thread_count)
{
    forward_job *job = context;
    (void)thread_index;
    (void)thread_count;
    for (;;) {
        ptrdiff_t chunk = atomic_fetch_add(&job->next_chunk, 1);
        if (chunk >= job->chunks) {
            return;
        }
        ptrdiff_t begin = chunk * job->rows_per_chunk;
        ptrdiff_t end = begin + job->rows_per_chunk < job->rows ? begin + job->rows_per_chunk
                                                                : job->rows;
        job->kernels->forward_rows(job->problem, begin, end);
    }
}

/* Outputs at least this large are written with non-temporal stores: they
   cannot stay in cache for the caller anyway, and skipping the read of each
   line before writing it saves a third of the traffic (measured with
   benchmarks/bench.py: 2048x4096 float32 and up gain, 32x4096 loses). */
#define RMS_STREAM_MIN_BYTES ((ptrdiff_t)16 << 20)

void rms_norm_forward(rms_type type, const rms_forward_problem *problem, ptrdiff_t rows)
{
    if (rows <= 0) {
        return;
    }
    rms_forward_problem p_copy = *problem;
    const rms_forward_problem *p = &p_copy;
    ptrdiff_t y_bytes = rows * p->n * (p->y.stride < 0 ? -p->y.stride : p->y.stride);
    p_copy.stream_output = y_bytes >= RMS_STREAM_MIN_BYTES;
    forward_job job = {
        .kernels = rms_kernels_for(type),
        .problem = p,
        .rows = rows,
        .rows_per_chunk = rows_per_chunk(p->n, RMS_CHUNK_ELEMENTS),
    };
    job.chunks = (rows + job.rows_per_chunk - 1) / job.rows_per_chunk;
    atomic_init(&job.next_chunk, 0);
    rms_pool_run(forward_task, &job, threads_for(rows, p->n, job.chunks));
}

/*
 * The backward's grad_weight is a sum over rows. To be the same bytes for
 * any thread count, each chunk's rows are summed into a per-thread partial,
 * and partials are added into the total strictly in chunk order: a thread
 * that finishes chunk c waits until chunk c - 1 has been added.
 */
typedef struct {
    const rms_kernels *kernels;
    const rms_backward_problem *problem;
    ptrdiff_t rows, rows_per_chunk, chunks;
    atomic_ptrdiff_t next_chunk;
    atomic_ptrdiff_t next_commit;
    double *total;    /* n doubles */
    double *partials; /* n doubles per thread */
} backward_job;

static void backward_task(void *context, int thread_index, int thread_count)
{
    backward_job *job = context;
    const ptrdiff_t n = job->problem->n;
    double *partial = job->partials + (ptrdiff_t)thread_index * n;
    (void)thread_count;
    for (;;) {
        ptrdiff_t chunk = atomic_fetch_add(&job->next_chunk, 1);
        if (chunk >= job->chunks) {
            return;
        }
        ptrdiff_t begin = chunk * job->rows_per_chunk;
        ptrdiff_t end = begin + job->rows_per_chunk < job->rows ? begin + job->rows_per_chunk
                                                                : job->rows;
        memset(partial, 0, (size_t)n * sizeof(double));
        job->kernels->backward_rows(job->problem, begin, end, partial);
        while (atomic_load_explicit(&job->next_commit, memory_order_acquire) != chunk) {
            sched_yield();
        }
        for (ptrdiff_t i = 0; i < n; i++) {
            job->total[i] += partial[i];
        }
        atomic_store_explicit(&job->next_commit, chunk + 1, memory_order_release);
    }
}

int rms_norm_backward(rms_type type, const rms_backward_problem *problem, ptrdiff_t rows,
                      char *grad_weight, ptrdiff_t grad_weight_stride)
{
    const rms_kernels *kernels = rms_kernels_for(type);
    const ptrdiff_t n = problem->n;
    rms_backward_problem p_copy = *problem;
    const rms_backward_problem *p = &p_copy;
    ptrdiff_t stride = p->grad_in.stride < 0 ? -p->grad_in.stride : p->grad_in.stride;
    p_copy.stream_output = rows * n * stride >= RMS_STREAM_MIN_BYTES;
    if (n <= 0) {
        return 0;
    }
    backward_job job = {
        .kernels = kernels,
        .problem = p,
        .rows = rows > 0 ? rows : 0,
        .rows_per_chunk = rows_per_chunk(n, RMS_BACKWARD_CHUNK_ELEMENTS),
    };
    job.chunks = (job.rows + job.rows_per_chunk - 1) / job.rows_per_chunk;
    int threads = threads_for(job.rows, n, job.chunks);
    double *scratch = calloc((size_t)n * ((size_t)threads + 1), sizeof(double));
    if (scratch == NULL) {
        return -1;
    }
    job.total = scratch;
    job.partials = scratch + n;
    atomic_init(&job.next_chunk, 0);
    atomic_init(&job.next_commit, 0);
    if (job.chunks > 0) {
        rms_pool_run(backward_task, &job, threads);
    }
    kernels->store_row(n, job.total, grad_weight, grad_weight_stride);
    free(scratch);
    return 0;
}
