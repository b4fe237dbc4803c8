/* The row driver: deals rows to the thread pool in chunks. */
#include "kernels.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp_env.h"
#include "packed_rows.h"
#include "thread_pool.h"

/*
 * Rows are dealt in chunks of about this many elements: small enough that
 * two threads finish close together on a shared, noisy machine, large
 * enough that taking a chunk (one atomic add) and, in the backward,
 * committing its n doubles of grad_weight are noise. Measured on 2 CPUs:
 * with many, a problem of a few chunks (64x4096 makes 4) leaves cores
 * idle.
 */
#define RMS_CHUNK_ELEMENTS 65536
/*
 * The forward's chunks are made larger where that leaves each thread this
 * many, and one thread takes all rows as one chunk: a write pass reduces
 * the next row only within its chunk, so each chunk's first row (and,
 * where the output is streamed, its last) is reduced on its own, from
 * memory (docs/performance.md has the figures). A forward row's output
 * does not depend on its chunk; the backward's chunks fix the order in
 * which grad_weight is summed, and stay the same for any thread count.
 */
#define RMS_FORWARD_CHUNKS_PER_THREAD 8
/* A problem of fewer elements than two chunks stays on the calling thread;
   from there on, threads share it: the pool's workers wait busy for the
   next task (thread_pool.c), so that waking one costs far less than two
   chunks' work (docs/performance.md has the figures). */
#define RMS_PARALLEL_MIN_ELEMENTS (2 * RMS_CHUNK_ELEMENTS)
/* Outputs at least this large are written with non-temporal stores: they
   cannot stay in cache for the caller anyway, and skipping the read of each
   line before writing it saves a third of the traffic (2048x4096 float32 and
   up gain; 32x4096 loses). */
#define RMS_STREAM_MIN_BYTES ((ptrdiff_t)16 << 20)
/* The fewest rows for which float32's offset + weight, where the offset is
   a float, is made once for them (a pass over the weight, read back by
   every row) rather than in each block: below, each block's two-sum costs
   less (at 4096 columns, 2 rows took a seventh less time, 4 rows a tenth;
   at 8 rows both cost the same). */
#define RMS_OFFSET_PAIR_MIN_ROWS 8
/*
 * Where threads share a call, each makes the weight as the kernels read it
 * (the forward's prepare_forward_weight, the backward's backward_factor)
 * for itself, on its first chunk, up to this many columns (1.5 MiB at
 * most: 24 bytes a column, float32's offset + weight as doubles and
 * floats). Made by the calling thread alone, it sat in that
 * core's cache while the others waited, and every other core read it from
 * there: at 32x4096 on 2 threads, the float16 and bfloat16 forwards, and
 * float32's with an offset, took a fifth more time (docs/performance.md).
 * Wider weights are made once, for the memory's sake, and live in the
 * shared cache or in memory, where every core reads them alike.
 */
#define RMS_OWN_WEIGHT_MAX_COLUMNS 65536

/* A problem's rows, cut into chunks that threads take in increasing order. */
typedef struct {
    ptrdiff_t rows, rows_per_chunk, count;
    atomic_ptrdiff_t next;
} row_chunks;

static void row_chunks_init(row_chunks *chunks, ptrdiff_t rows, ptrdiff_t n,
                            ptrdiff_t chunk_elements)
{
    chunks->rows = rows > 0 ? rows : 0;
    chunks->rows_per_chunk = n >= chunk_elements ? 1 : chunk_elements / (n > 0 ? n : 1);
    chunks->count = (chunks->rows + chunks->rows_per_chunk - 1) / chunks->rows_per_chunk;
    atomic_init(&chunks->next, 0);
}

/* Chunks made larger, where that still leaves each thread per_thread of
   them (one thread: a single chunk). */
static void row_chunks_widen(row_chunks *chunks, int threads, ptrdiff_t per_thread)
{
    const ptrdiff_t parts = threads == 1 ? 1 : threads * per_thread;
    const ptrdiff_t rows_per_chunk = (chunks->rows + parts - 1) / parts;
    if (rows_per_chunk > chunks->rows_per_chunk) {
        chunks->rows_per_chunk = rows_per_chunk;
        chunks->count = (chunks->rows + rows_per_chunk - 1) / rows_per_chunk;
    }
}

/* Takes the next chunk: its index, and its rows [*begin, *end). Returns -1
   when none is left. */
static ptrdiff_t take_chunk(row_chunks *chunks, ptrdiff_t *begin, ptrdiff_t *end)
{
    ptrdiff_t chunk = atomic_fetch_add(&chunks->next, 1);
    if (chunk >= chunks->count) {
        return -1;
    }
    *begin = chunk * chunks->rows_per_chunk;
    *end = *begin + chunks->rows_per_chunk < chunks->rows ? *begin + chunks->rows_per_chunk
                                                          : chunks->rows;
    return chunk;
}

static int threads_for(const row_chunks *chunks, ptrdiff_t n)
{
    if (chunks->rows * n < RMS_PARALLEL_MIN_ELEMENTS) {
        return 1;
    }
    int allowed = rms_pool_get_num_threads();
    return chunks->count < allowed ? (int)chunks->count : allowed;
}

static int streams_output(ptrdiff_t rows, ptrdiff_t n, ptrdiff_t stride)
{
    return rows * n * (stride < 0 ? -stride : stride) >= RMS_STREAM_MIN_BYTES;
}

typedef struct {
    rms_type type;
    const rms_kernels *kernels;
    const rms_forward_problem *problem;
    row_chunks chunks;
    char *packed;              /* NULL, or packed_per_thread bytes for each thread */
    size_t packed_per_thread;
    ptrdiff_t rows_per_thread;  /* where each thread makes its own weight: its share */
    int own_weight;             /* each thread makes its own (RMS_OWN_WEIGHT_MAX_COLUMNS) */
    atomic_size_t failed_bytes; /* 0, or scratch a chunk could not have */
} forward_job;

/* Bytes for packed copies of a chunk's strided operands (packed_rows.h):
   0 where every operand is contiguous, SIZE_MAX where it cannot be had. */
static size_t forward_packed_bytes(rms_type type, const rms_forward_problem *p,
                                   ptrdiff_t rows)
{
    const ptrdiff_t es = rms_kind_size(rms_type_table[type].x);
    const ptrdiff_t ws = rms_kind_size(rms_type_table[type].weight);
    const rms_matrix *rows_of_x[] = {&p->x, &p->y, &p->residual, &p->residual_out};
    size_t bytes = 0;
    for (size_t k = 0; k < sizeof rows_of_x / sizeof rows_of_x[0]; k++) {
        if (rows_of_x[k]->data != NULL && rows_of_x[k]->stride != es) {
            const size_t more = rms_packed_bytes(rows, p->n, es);
            bytes = more > SIZE_MAX - bytes ? SIZE_MAX : bytes + more;
        }
    }
    if (p->weight.stride != ws) {
        const size_t more = rms_packed_bytes(p->weight.row_stride == 0 ? 1 : rows, p->n, ws);
        bytes = more > SIZE_MAX - bytes ? SIZE_MAX : bytes + more;
    }
    return bytes;
}

/* Rows [begin, end) of the forward, through packed copies of the strided
   operands where there are any (packed is not NULL). */
static size_t forward_chunk(const rms_kernels *kernels, const rms_forward_problem *p,
                            rms_kind x_kind, rms_kind weight_kind, ptrdiff_t begin,
                            ptrdiff_t end, char *packed)
{
    if (packed == NULL) {
        return kernels->forward_rows(p, begin, end);
    }
    const ptrdiff_t rows = end - begin, n = p->n;
    const ptrdiff_t es = rms_kind_size(x_kind);
    rms_forward_problem q = *p;
    q.x = rms_rows_packed(p->x, begin, rows, n, es, &packed, 1);
    q.y = rms_rows_packed(p->y, begin, rows, n, es, &packed, 0);
    if (p->residual.data != NULL) {
        q.residual = rms_rows_packed(p->residual, begin, rows, n, es, &packed, 1);
        q.residual_out = rms_rows_packed(p->residual_out, begin, rows, n, es, &packed, 0);
    }
    q.weight = rms_rows_packed(p->weight, begin, rows, n, rms_kind_size(weight_kind), &packed, 1);
    q.eps = p->eps + begin * p->eps_stride;
    if (p->weight_offset != NULL) {
        q.weight_offset = p->weight_offset + begin * p->weight_offset_stride;
    }
    q.stream_output = 0; /* a packed chunk is written in cache */
    const size_t failed_bytes = kernels->forward_rows(&q, 0, rows);
    if (failed_bytes == 0) {
        rms_rows_unpack(p->y, begin, q.y, rows, n, es);
        if (p->residual.data != NULL) {
            rms_rows_unpack(p->residual_out, begin, q.residual_out, rows, n, es);
        }
    }
    return failed_bytes;
}

/*
 * Where every row shares the weight and the offset, the weight as the
 * forward's write passes read it, made once for the call or for each
 * thread (RMS_OWN_WEIGHT_MAX_COLUMNS) rather than once per row (kernels.h,
 * prepare_forward_weight), for `rows` rows. Returns 0, or the bytes an
 * offset's doubles needed and could not have.
 */
static size_t prepare_forward_weight(rms_type type, const rms_kernels *kernels, ptrdiff_t rows,
                                     rms_forward_problem *p, rms_forward_weight_scratch *scratch)
{
    const int with_offset = p->weight_offset != NULL;
    double offset = 0.0;
    if (with_offset) {
        memcpy(&offset, p->weight_offset, sizeof offset);
    }
    const int in_floats = with_offset && kernels->offset_in_floats && rms_offset_is_float(offset);
    p->weight_prepared = 1;
    if (in_floats && rows < RMS_OFFSET_PAIR_MIN_ROWS) {
        return 0; /* nothing to make: the rows' blocks add the offset themselves */
    }
    const size_t failed_bytes = rms_forward_weight_scratch_alloc(
        scratch, p->n, rms_forward_weight_floats(rms_type_table[type].x, with_offset),
        with_offset && !in_floats);
    if (failed_bytes != 0) {
        return failed_bytes;
    }
    if (scratch->memory == NULL) {
        return 0; /* nothing to make: float32 or float64 without an offset */
    }
    const int made =
        kernels->prepare_forward_weight(p->n, p->weight.data, p->weight.stride,
                                        with_offset ? &offset : NULL, scratch->hi, scratch->lo,
                                        scratch->floats);
    p->weight_hi = made & RMS_MADE_DOUBLES ? scratch->hi : NULL;
    p->weight_lo = made & RMS_MADE_DOUBLES ? scratch->lo : NULL;
    p->weight_floats = made & RMS_MADE_FLOATS ? scratch->floats : NULL;
    return 0;
}

static void forward_task(void *context, int thread_index, int thread_count)
{
    forward_job *job = context;
    const rms_type_kinds kinds = rms_type_table[job->type];
    char *packed =
        job->packed != NULL ? job->packed + (size_t)thread_index * job->packed_per_thread : NULL;
    rms_forward_problem own = *job->problem;
    rms_forward_weight_scratch prepared = {NULL, NULL, NULL, NULL};
    int weight_ready = !job->own_weight;
    ptrdiff_t begin, end;
    (void)thread_count;
    while (take_chunk(&job->chunks, &begin, &end) >= 0) {
        size_t failed_bytes = 0;
        if (!weight_ready) {
            failed_bytes = prepare_forward_weight(job->type, job->kernels, job->rows_per_thread,
                                                  &own, &prepared);
            weight_ready = 1;
            if (failed_bytes != 0) {
                /* unprepared, as the problem was: the kernels then make
                   the weight for each chunk, or report that they could
                   not, having written nothing */
                own = *job->problem;
            }
        }
        if (failed_bytes == 0) {
            failed_bytes =
                forward_chunk(job->kernels, &own, kinds.x, kinds.weight, begin, end, packed);
        }
        if (failed_bytes != 0) {
            atomic_store(&job->failed_bytes, failed_bytes);
        }
    }
    free(prepared.memory);
}

/* Whether any of count weight offsets (float64s, stride bytes apart) is
   other than 0. Where none is, the weight is used as stored, by the
   kernels without an offset: forward and backward decide it here. */
static int has_weight_offset(const char *offsets, ptrdiff_t stride, ptrdiff_t count)
{
    for (ptrdiff_t r = 0; offsets != NULL && r < (stride == 0 ? 1 : count); r++) {
        double offset;
        memcpy(&offset, offsets + r * stride, sizeof offset);
        if (offset != 0.0) {
            return 1;
        }
    }
    return 0;
}

/* Packed copies of strided rows (packed_rows.h) take at most this much
   memory a thread: a chunk's rows, a few MiB, unless a single row is
   longer than that. Such rows are read strided, by the portable kernels
   (rms_strided_kernels_for), in place of copies that may not fit in
   memory (a stride-0 broadcast row of 2^31 elements). */
#define RMS_PACKED_MAX_BYTES ((size_t)64 << 20)

/* Scratch for each of `threads` threads' packed rows, per_thread bytes
   each; NULL where per_thread is 0, or where it is more than
   RMS_PACKED_MAX_BYTES or cannot be had, and the kernels are then made
   the strided ones. */
static char *packed_scratch_alloc(size_t per_thread, int threads, rms_type type,
                                  const rms_kernels **kernels)
{
    char *memory = NULL;
    if (per_thread == 0) {
        return NULL;
    }
    if (per_thread <= RMS_PACKED_MAX_BYTES) {
        /* rms_packed_bytes are whole cache lines: every thread's rows and
           every packed row start on one */
        memory = aligned_alloc(64, per_thread * (size_t)threads);
    }
    if (memory == NULL) {
        *kernels = rms_strided_kernels_for(type);
    }
    return memory;
}

/*
 * The weight as the kernels read it, in *copy where it is copied (the
 * caller frees it). A shared weight that is not contiguous (a stride-0 row
 * of ones, which is how weight=None reaches the kernels, or a strided
 * view) is packed once for the call; where that copy is not to be had, as
 * for packed rows, the kernels are made the strided ones. A weight that an
 * output overlaps is copied whole whatever its strides: the kernels read
 * the weight while they write, and NumPy makes no copy of its own where an
 * output is the weight itself. Returns 0, or the bytes that copy needed
 * and could not have.
 */
static size_t weight_for_kernels(rms_type type, ptrdiff_t rows, ptrdiff_t n, rms_matrix *weight,
                                 int overwritten, const rms_kernels **kernels, char **copy)
{
    const ptrdiff_t size = rms_kind_size(rms_type_table[type].weight);
    *copy = NULL;
    if (n <= 0 || (!overwritten && (weight->row_stride != 0 || weight->stride == size))) {
        return 0;
    }
    const size_t bytes = rms_packed_bytes(weight->row_stride == 0 ? 1 : rows, n, size);
    if (overwritten) {
        *copy = bytes == SIZE_MAX ? NULL : aligned_alloc(64, bytes);
        if (*copy == NULL) {
            return bytes;
        }
    }
    else {
        *copy = packed_scratch_alloc(bytes, 1, type, kernels);
        if (*copy == NULL) {
            return 0; /* read strided */
        }
    }
    *weight = rms_rows_copy(*weight, rows, n, size, *copy);
    return 0;
}

size_t rms_norm_forward(rms_type type, const rms_forward_problem *problem, ptrdiff_t rows)
{
    rms_forward_problem p = *problem;
    p.stream_output = streams_output(rows, p.n, p.y.stride);
    p.weight_prepared = 0;
    p.weight_hi = p.weight_lo = NULL;
    p.weight_floats = NULL;
    if (!has_weight_offset(p.weight_offset, p.weight_offset_stride, rows)) {
        p.weight_offset = NULL;
    }
    forward_job job = {.type = type, .kernels = rms_kernels_for(type), .problem = &p};
    row_chunks_init(&job.chunks, rows, p.n, RMS_CHUNK_ELEMENTS);
    atomic_init(&job.failed_bytes, 0);
    if (job.chunks.count == 0) {
        return 0;
    }
    const ptrdiff_t es = rms_kind_size(rms_type_table[type].x);
    const ptrdiff_t ws = rms_kind_size(rms_type_table[type].weight);
    const int weight_overwritten =
        rms_rows_overlap(p.y, es, p.weight, ws, rows, p.n) ||
        (p.residual.data != NULL && rms_rows_overlap(p.residual_out, es, p.weight, ws, rows, p.n));
    char *weight_copy;
    size_t failed_bytes =
        weight_for_kernels(type, rows, p.n, &p.weight, weight_overwritten, &job.kernels,
                           &weight_copy);
    if (failed_bytes != 0) {
        return failed_bytes;
    }
    const int threads = threads_for(&job.chunks, p.n);
    if (forward_packed_bytes(type, &p, 1) == 0) { /* packed copies grow with the chunk */
        row_chunks_widen(&job.chunks, threads, RMS_FORWARD_CHUNKS_PER_THREAD);
    }
    job.packed_per_thread = forward_packed_bytes(type, &p, job.chunks.rows_per_chunk);
    job.packed = packed_scratch_alloc(job.packed_per_thread, threads, type, &job.kernels);
    const rms_fp_env saved = rms_fp_env_enter(); /* the workers set their own */
    rms_forward_weight_scratch prepared = {NULL, NULL, NULL, NULL};
    if (p.weight.row_stride == 0 && (p.weight_offset == NULL || p.weight_offset_stride == 0)) {
        job.own_weight = threads > 1 && p.n <= RMS_OWN_WEIGHT_MAX_COLUMNS;
        job.rows_per_thread = (rows + threads - 1) / threads;
        if (!job.own_weight) {
            failed_bytes = prepare_forward_weight(type, job.kernels, rows, &p, &prepared);
        }
    }
    if (failed_bytes == 0) {
        rms_pool_run(forward_task, &job, threads);
        failed_bytes = atomic_load(&job.failed_bytes);
    }
    rms_fp_env_leave(saved);
    free(prepared.memory);
    free(job.packed);
    free(weight_copy);
    return failed_bytes;
}

/*
 * The backward's grad_weight is a sum over rows. To be the same bytes for
 * any thread count, each chunk's rows are summed into a partial, and
 * partials are added into the total strictly in chunk order: a thread that
 * finishes chunk c waits until chunk c - 1 has been added. Threads take
 * chunks in increasing order, so the one that holds the next chunk to add
 * is always working, never waiting.
 *
 * A partial lives on its thread's stack, a tile of RMS_TILE_COLUMNS
 * columns at most, so that the scratch does not grow with the thread
 * count. Rows longer than a tile are reduced first, then written a tile at
 * a time (plan_backward_rows, then write_backward_rows), each tile added into
 * the total in chunk order with a counter of its own. Each column gains
 * the same terms in the same order at any tile size.
 */
#define RMS_TILE_COLUMNS 4096
/* Rows longer than a tile are read twice, by their reduction passes and
   then by their tiles' write passes, which also ask for the next chunk's
   rows: two chunks must fit in a core's cache (docs/performance.md). */
#define RMS_TILED_CHUNK_BYTES ((ptrdiff_t)256 << 10)
/* A chunk of rows longer than a tile holds fewer rows than this. */
#define RMS_TILED_ROWS_MAX (RMS_CHUNK_ELEMENTS / RMS_TILE_COLUMNS)

static ptrdiff_t backward_chunk_elements(rms_type type, ptrdiff_t n)
{
    if (n <= RMS_TILE_COLUMNS) {
        return RMS_CHUNK_ELEMENTS;
    }
    const ptrdiff_t fitting = RMS_TILED_CHUNK_BYTES / rms_kind_size(rms_type_table[type].x);
    return fitting < RMS_CHUNK_ELEMENTS ? fitting : RMS_CHUNK_ELEMENTS;
}

typedef struct {
    rms_kind x_kind;
    const rms_kernels *kernels;
    const rms_backward_problem *problem;
    row_chunks chunks;
    char *packed; /* NULL, or packed_per_thread bytes for each thread */
    size_t packed_per_thread;
    /* n doubles, the factor (offset + weight); where own_factor
       (RMS_OWN_WEIGHT_MAX_COLUMNS), n for each thread, which it makes */
    double *factors;
    int own_factor;
    double *total;                 /* n doubles */
    atomic_ptrdiff_t *next_commit; /* per tile: the next chunk to add */
} backward_job;

static ptrdiff_t tiles_of(ptrdiff_t n) { return (n + RMS_TILE_COLUMNS - 1) / RMS_TILE_COLUMNS; }

/* Adds a chunk's partial of columns [begin, end) into the total, after
   the chunk before it. */
static void commit_tile(backward_job *job, ptrdiff_t tile, ptrdiff_t chunk,
                        const double *partial, ptrdiff_t begin, ptrdiff_t end)
{
    while (atomic_load_explicit(&job->next_commit[tile], memory_order_acquire) != chunk) {
        sched_yield();
    }
    for (ptrdiff_t i = begin; i < end; i++) {
        job->total[i] += partial[i - begin];
    }
    atomic_store_explicit(&job->next_commit[tile], chunk + 1, memory_order_release);
}

/* The factor as the kernels read it, n doubles: offset + weight rounded
   once to double (the backward's own rounding errors are far larger than
   that one). */
static void backward_factor(const rms_kernels *kernels, const rms_backward_problem *p,
                            double *factor)
{
    kernels->widen_weight(p->n, p->weight, p->weight_stride, factor);
    if (p->weight_offset != NULL) {
        double offset;
        memcpy(&offset, p->weight_offset, sizeof offset);
        for (ptrdiff_t i = 0; i < p->n; i++) {
            factor[i] += offset;
        }
    }
}

/* Bytes for packed copies of a chunk's strided operands, as for the
   forward. */
static size_t backward_packed_bytes(rms_kind x_kind, const rms_backward_problem *p,
                                    ptrdiff_t rows)
{
    const ptrdiff_t es = rms_kind_size(x_kind);
    const rms_matrix *operands[] = {&p->grad_output, &p->x, &p->grad_residual_out,
                                    &p->grad_input};
    size_t bytes = 0;
    for (size_t k = 0; k < sizeof operands / sizeof operands[0]; k++) {
        if (operands[k]->data != NULL && operands[k]->stride != es) {
            const size_t more = rms_packed_bytes(rows, p->n, es);
            bytes = more > SIZE_MAX - bytes ? SIZE_MAX : bytes + more;
        }
    }
    return bytes;
}

/* A chunk's rows [begin, end) as a problem of their own, rows 0 to
   end - begin, with packed copies of the strided operands where packed is
   not NULL. */
static rms_backward_problem backward_chunk_problem(const rms_backward_problem *p,
                                                   rms_kind x_kind, ptrdiff_t begin,
                                                   ptrdiff_t end, char *packed)
{
    rms_backward_problem q = *p;
    if (packed == NULL) {
        return q;
    }
    const ptrdiff_t rows = end - begin, n = p->n, es = rms_kind_size(x_kind);
    q.grad_output = rms_rows_packed(p->grad_output, begin, rows, n, es, &packed, 1);
    q.x = rms_rows_packed(p->x, begin, rows, n, es, &packed, 1);
    if (p->grad_residual_out.data != NULL) {
        q.grad_residual_out = rms_rows_packed(p->grad_residual_out, begin, rows, n, es, &packed, 1);
    }
    q.grad_input = rms_rows_packed(p->grad_input, begin, rows, n, es, &packed, 0);
    q.stream_output = 0; /* a packed chunk is written in cache */
    q.ahead_end = 0;
    return q;
}

/* Rows [row_begin, row_end) written whole (rows no longer than a tile, or
   a call of one chunk), grad_weight's terms into partial: each row's two
   passes, a few rows at a time (rms_backward_rows_together), so that a row
   is written while still in cache. A write pass asks for the same row of
   the next rows written together, and a row written alone for the row two
   on: the next one is already on its way, and asked for only one row
   ahead, its last lines arrive after its reduction pass needs them. The
   call's own rows may always be asked for, past the problem's ahead_end. */
static void backward_rows(const backward_job *job, const rms_backward_problem *q,
                          const double *factor, ptrdiff_t row_begin, ptrdiff_t row_end,
                          double *partial)
{
    const ptrdiff_t together = rms_backward_rows_together(job->x_kind);
    const ptrdiff_t ahead = together > 1 ? together : 2;
    const ptrdiff_t ahead_end = q->ahead_end > row_end ? q->ahead_end : row_end;
    rms_backward_plan plans[RMS_BACKWARD_ROWS_TOGETHER];
    for (ptrdiff_t r = row_begin; r < row_end; r += together) {
        const ptrdiff_t end = row_end - r < together ? row_end : r + together;
        job->kernels->plan_backward_rows(q, r, end, factor, plans);
        job->kernels->write_backward_rows(q, r, end, plans, 0, q->n, factor, partial, ahead,
                                          ahead_end, end == row_end);
    }
}

/* The chunk's rows of the backward, grad_weight's terms into partial,
   which holds columns [0, n) where n is one tile or less; else each tile
   is committed as it is done. */
static void backward_chunk(backward_job *job, const double *factor, ptrdiff_t chunk,
                           ptrdiff_t begin, ptrdiff_t end, char *packed, double *partial,
                           rms_backward_plan *plans)
{
    const rms_backward_problem q =
        backward_chunk_problem(job->problem, job->x_kind, begin, end, packed);
    /* rows 0 to end - begin of a packed problem; else the problem's own */
    const ptrdiff_t first_row = packed != NULL ? 0 : begin;
    const ptrdiff_t last_row = first_row + (end - begin);
    const ptrdiff_t n = q.n;
    if (n <= RMS_TILE_COLUMNS) {
        memset(partial, 0, (size_t)n * sizeof(double));
        backward_rows(job, &q, factor, first_row, last_row, partial);
        commit_tile(job, 0, chunk, partial, 0, n);
    }
    else {
        job->kernels->plan_backward_rows(&q, first_row, last_row, factor, plans);
        for (ptrdiff_t tile = 0; tile < tiles_of(n); tile++) {
            const ptrdiff_t first = tile * RMS_TILE_COLUMNS;
            const ptrdiff_t last = n - first < RMS_TILE_COLUMNS ? n : first + RMS_TILE_COLUMNS;
            memset(partial, 0, (size_t)(last - first) * sizeof(double));
            /* a streamed tile asks for the same tile of the next chunk's
               rows, which their reduction passes will read next */
            job->kernels->write_backward_rows(&q, first_row, last_row, plans, first, last,
                                              factor, partial, last_row - first_row,
                                              q.ahead_end, 1);
            commit_tile(job, tile, chunk, partial, first, last);
        }
    }
    if (packed != NULL) {
        rms_rows_unpack(job->problem->grad_input, begin, q.grad_input, end - begin, n,
                        rms_kind_size(job->x_kind));
    }
}

static void backward_task(void *context, int thread_index, int thread_count)
{
    backward_job *job = context;
    _Alignas(64) double partial[RMS_TILE_COLUMNS]; /* whole lines for the widest vectors */
    rms_backward_plan plans[RMS_TILED_ROWS_MAX];
    char *packed =
        job->packed != NULL ? job->packed + (size_t)thread_index * job->packed_per_thread : NULL;
    double *factor = job->factors;
    int factor_ready = !job->own_factor;
    if (job->own_factor) {
        factor += (size_t)thread_index * (size_t)job->problem->n;
    }
    ptrdiff_t chunk, begin, end;
    (void)thread_count;
    while ((chunk = take_chunk(&job->chunks, &begin, &end)) >= 0) {
        if (!factor_ready) {
            backward_factor(job->kernels, job->problem, factor);
            factor_ready = 1;
        }
        backward_chunk(job, factor, chunk, begin, end, packed, partial, plans);
    }
}

/* The backward's doubles: the factor (offset + weight), once for the
   call or once for each of `factors` threads, and grad_weight's total, n
   each, then, where the rows make more than one chunk, a counter per
   tile. One chunk needs no partial: its sum, added to a zero total, is the
   total (a sum that starts at +0 is never -0). NULL, with *bytes the bytes
   asked for, where they cannot be had. */
static double *backward_scratch_alloc(ptrdiff_t n, int factors, int chunked, size_t *bytes)
{
    const size_t counters = chunked ? (size_t)tiles_of(n) : 0;
    const size_t doubles = (size_t)factors + 1; /* an element's */
    if ((size_t)n > (SIZE_MAX - counters * sizeof(atomic_ptrdiff_t)) / (doubles * sizeof(double))) {
        *bytes = SIZE_MAX; /* more than there is to ask for (a stride-0 row) */
        return NULL;
    }
    *bytes = (size_t)n * doubles * sizeof(double) + counters * sizeof(atomic_ptrdiff_t);
    return malloc(*bytes);
}

/* Fills the scratch: the call's factor (backward_factor), where the
   threads do not make their own, a zero total, and the tiles' counters. */
static void backward_scratch_fill(backward_job *job, rms_backward_problem *p, int factors,
                                  double *scratch)
{
    if (!has_weight_offset(p->weight_offset, 0, 1)) {
        p->weight_offset = NULL;
    }
    job->factors = scratch;
    if (!job->own_factor) {
        backward_factor(job->kernels, p, scratch);
    }
    job->total = scratch + (size_t)factors * (size_t)p->n;
    memset(job->total, 0, (size_t)p->n * sizeof(double));
    if (job->chunks.count > 1) {
        job->next_commit = (atomic_ptrdiff_t *)(job->total + p->n);
        for (ptrdiff_t tile = 0; tile < tiles_of(p->n); tile++) {
            atomic_init(&job->next_commit[tile], 0);
        }
    }
}

/* Every chunk, on the pool where there are several, grad_weight's sum
   into job->total. */
static void backward_run(backward_job *job, const rms_backward_problem *p, ptrdiff_t rows,
                         int threads)
{
    if (job->chunks.count > 1) {
        rms_pool_run(backward_task, job, threads);
    }
    else if (job->chunks.count == 1) {
        const rms_backward_problem q = backward_chunk_problem(p, job->x_kind, 0, rows, job->packed);
        backward_rows(job, &q, job->factors, 0, rows, job->total);
        if (job->packed != NULL) {
            rms_rows_unpack(p->grad_input, 0, q.grad_input, rows, p->n,
                            rms_kind_size(job->x_kind));
        }
    }
}

size_t rms_norm_backward(rms_type type, const rms_backward_problem *problem, ptrdiff_t rows,
                         char *grad_weight, ptrdiff_t grad_weight_stride)
{
    rms_backward_problem p = *problem;
    if (p.n <= 0) {
        return 0;
    }
    p.stream_output = streams_output(rows, p.n, p.grad_input.stride);
    backward_job job = {
        .x_kind = rms_type_table[type].x, .kernels = rms_kernels_for(type), .problem = &p};
    row_chunks_init(&job.chunks, rows, p.n, backward_chunk_elements(type, p.n));
    const int threads = threads_for(&job.chunks, p.n);
    p.ahead_end = threads == 1 ? rows : 0;
    const int chunked = job.chunks.count > 1;
    job.own_factor = chunked && threads > 1 && p.n <= RMS_OWN_WEIGHT_MAX_COLUMNS;
    const int factors = job.own_factor ? threads : 1;
    size_t scratch_bytes;
    double *scratch = backward_scratch_alloc(p.n, factors, chunked, &scratch_bytes);
    if (scratch == NULL) {
        return scratch_bytes;
    }
    rms_matrix weight = {(char *)p.weight, 0, p.weight_stride};
    const int weight_overwritten =
        rms_rows_overlap(p.grad_input, rms_kind_size(job.x_kind), weight,
                         rms_kind_size(rms_type_table[type].weight), rows, p.n);
    char *weight_copy;
    const size_t failed_bytes = weight_for_kernels(type, rows, p.n, &weight, weight_overwritten,
                                                   &job.kernels, &weight_copy);
    if (failed_bytes != 0) {
        free(scratch);
        return failed_bytes;
    }
    p.weight = weight.data;
    p.weight_stride = weight.stride;
    job.packed_per_thread = backward_packed_bytes(job.x_kind, &p, job.chunks.rows_per_chunk);
    job.packed = packed_scratch_alloc(job.packed_per_thread, chunked ? threads : 1, type,
                                      &job.kernels);
    const rms_fp_env saved = rms_fp_env_enter(); /* the workers set their own */
    backward_scratch_fill(&job, &p, factors, scratch);
    backward_run(&job, &p, rows, threads);
    job.kernels->store_weight(p.n, job.total, grad_weight, grad_weight_stride);
    rms_fp_env_leave(saved);
    free(job.packed);
    free(weight_copy);
    free(scratch);
    return 0;
}
