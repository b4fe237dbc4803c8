/*
 * The forward's write pass over one row, block by block in the row's write
 * mode, with the next row's reduction pass in the same loop, and a
 * residual's residual_out made on the way. Part of the row kernels
 * (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_FORWARD_WRITE_H
#define RMSNORM_KERNELS_ROW_FORWARD_WRITE_H

/* Asks for the bytes [p, p + bytes) to be brought into cache, without
   waiting for them. A streamed write pass works from cache and leaves the
   memory bus idle; asking for the next row meanwhile lets that row's
   reduction pass find it in cache. Under AddressSanitizer, which does not
   check prefetches, each line's first byte is read instead, so that the
   sanitizer build checks every address asked for. */
#if defined(__SANITIZE_ADDRESS__)
#define RMS_CHECK_PREFETCH 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RMS_CHECK_PREFETCH 1
#endif
#endif
static inline void rms_prefetch(const char *p, ptrdiff_t bytes)
{
    for (ptrdiff_t b = 0; b < bytes; b += 64) {
#if defined(RMS_CHECK_PREFETCH)
        (void)*(const volatile char *)(p + b);
#elif defined(__GNUC__)
        /* locality 2: not into L1, which holds the row at work, where the
           CPU honours the hint (prefetcht1) */
        __builtin_prefetch(p + b, 0, 2);
#else
        (void)p;
#endif
    }
}

/* How many elements of a row to write a block at a time before out
   reaches a vector's alignment: none for a strided row, or for one whose
   elements can never get there. NumPy aligns its buffers to 16 bytes only,
   and vector stores that straddle two cache lines cost a fifth of the
   float32 forward in cache. */
RMS_ALWAYS_INLINE ptrdiff_t rms_unaligned_head(const char *out, ptrdiff_t stride, ptrdiff_t size,
                                               ptrdiff_t n)
{
    size_t misalignment = (size_t)((uintptr_t)out % RMS_VECTOR_BYTES);
    if (stride != size || misalignment == 0 || misalignment % (size_t)size != 0) {
        return 0;
    }
    ptrdiff_t head = (ptrdiff_t)((RMS_VECTOR_BYTES - misalignment) / (size_t)size);
    return head < n ? head : n;
}

/* Whether whole blocks from out on can be streamed. */
RMS_ALWAYS_INLINE int rms_can_stream(int stream, const char *out, ptrdiff_t stride, ptrdiff_t size)
{
    return RMS_HAVE_STREAM && stream && stride == size &&
           (uintptr_t)out % RMS_VECTOR_BYTES == 0;
}

/* The weight as a row's write pass reads it: as stored, or with an offset
   as doubles hi + lo, offset + weight exactly; and as floats for the fast
   writes: for the 16-bit one, and for float32's with an offset, which
   takes offset + weight as floats + floats_lo. Where those two floats are
   exactly offset + weight (rms_offset_in_floats), the doubles are not made
   for the row, and its blocks in double make their own. */
typedef struct {
    const char *data; /* as stored */
    ptrdiff_t stride;
    int with_offset;
    double offset;
    const double *hi, *lo; /* with an offset, where made; else NULL */
    const float *floats;   /* NULL where the fast write from floats is not to be used */
    const float *floats_lo; /* float32 x with an offset; else NULL */
    double least; /* float64's: the least nonzero magnitude of the weight (of hi with an
                     offset), +inf where there is none (rms_forward_row_plan) */
    double largest; /* float64's without fused multiply-adds: the largest magnitude */
} rms_row_weight;

/* The weight as the loops of contiguous rows read it: a local copy, its
   stride the element's size, a constant (rms_source_known says why). */
RMS_ALWAYS_INLINE rms_row_weight rms_weight_known(rms_kind wk, const rms_row_weight *w)
{
    rms_row_weight known = *w;
    known.stride = rms_kind_size(wk);
    return known;
}

/* Whether a write mode is a fast path, which may be unsure of a block and
   leave it to the double write. */
RMS_ALWAYS_INLINE int rms_mode_is_fast(rms_write_mode mode)
{
    return mode == RMS_WRITE_FAST16 || mode == RMS_WRITE_FLOAT || mode == RMS_WRITE_OFFSET32 ||
           mode == RMS_WRITE_OFFSET32_IN_BLOCKS;
}

/* Whether a write mode's unsure blocks can wait for the end of the step:
   the fast writes that leave no state of their own to a block in double.
   float32 with an offset defers only where fused multiply-adds write it
   in float: deferring its portable write too took the built _core past
   1.5 MB of machine code. */
RMS_ALWAYS_INLINE int rms_mode_may_defer(rms_write_mode mode)
{
    return mode == RMS_WRITE_FAST16 || mode == RMS_WRITE_FLOAT ||
           (mode == RMS_WRITE_OFFSET32 && RMS_HAVE_FMA);
}

/* A block with an offset written in double, out of line: from the row's
   doubles hi + lo, or, for float32 x whose row has offset + weight as
   floats alone (rms_offset_in_floats), from doubles made here for this
   block. Its operands come by value: the address of the write loop's
   weight or inv_rms would keep them in memory, and their fields be loaded
   again at every block (the float64 forward at 4096x8192 took 8% longer). */
RMS_NOINLINE int rms_forward_block_double_offset_of(rms_kind xk, const char *x, ptrdiff_t xs,
                                                    const char *w, ptrdiff_t ws, double offset,
                                                    const double *hi, const double *lo,
                                                    char *y, ptrdiff_t ys, ptrdiff_t count,
                                                    rms_dd inv_rms, double sum_error,
                                                    int check_range_edge, int stream)
{
    double hi_made[RMS_VF_WIDTH], lo_made[RMS_VF_WIDTH];
    if (RMS_OFFSET_IN_FLOATS(xk, RMS_KIND_F32) && lo == NULL) {
        rms_block block_hi, block_lo;
        rms_offset_weight_block(RMS_KIND_F32, w, ws, count, offset, &block_hi, &block_lo);
        rms_store_doubles((char *)hi_made, 8, count, &block_hi, 0);
        rms_store_doubles((char *)lo_made, 8, count, &block_lo, 0);
        hi = hi_made;
        lo = lo_made;
    }
    return rms_forward_block_double_offset[xk](x, xs, (const char *)hi, 8, lo, y, ys, count,
                                               inv_rms, sum_error, check_range_edge, stream);
}

/*
 * A row's values as its reduction pass makes them: x itself, or, with a
 * residual, residual_out = x + residual, written as the pass goes, or, where
 * remade, by the write pass (rms_remakes_residual_out). x is NULL for no row, the
 * last row's next, with the strides kept as they are: a NULL pointer to
 * the struct instead, or strides that differ, would cost the compiler
 * their constancy. ahead_x and ahead_residual are the row after this one,
 * for a streamed write pass to ask for while it reduces this one, or NULL.
 */
typedef struct {
    const char *x;
    const char *residual; /* with_residual only */
    char *residual_out;
    ptrdiff_t x_stride, residual_stride, residual_out_stride;
    const char *ahead_x, *ahead_residual;
    int remade;
} rms_row_source;

/* A row's source as its loops read it: a local copy, with the strides
   their elements' sizes where the table takes contiguous rows only
   (RMS_STRIDED_ROWS). Read through a pointer whose struct a call may
   have seen, the strides would be loaded, not known: every block would
   test them, and carry a gather and a scatter it never takes. */
RMS_ALWAYS_INLINE rms_row_source rms_source_known(rms_kind xk, const rms_row_source *src)
{
    rms_row_source known = *src;
    if (!RMS_STRIDED_ROWS) {
        const ptrdiff_t size = rms_kind_size(xk);
        known.x_stride = size;
        known.residual_stride = size;
        known.residual_out_stride = size;
    }
    return known;
}

/* residual_out = x + residual for one block, rounded once to x's kind as
   NumPy's and torch's own add round it; written to out unless that is
   NULL, and returned as doubles. 16-bit kinds add in float: the float sum is exact
   unless one addend is below 2^-13 of the other, too small to move the sum
   to a 16-bit midpoint, so its rounding to 16 bits is the exact sum's. */
RMS_ALWAYS_INLINE rms_block rms_make_residual_out(rms_kind xk, const char *x, ptrdiff_t xs,
                                                  const char *r, ptrdiff_t rs, char *out,
                                                  ptrdiff_t out_stride, ptrdiff_t count)
{
    rms_block sv;
    if (xk == RMS_KIND_F64) {
        const rms_block xv = rms_load_doubles(xk, x, xs, count);
        const rms_block rv = rms_load_doubles(xk, r, rs, count);
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            sv.part[h] = rms_vd_add(xv.part[h], rv.part[h]);
        }
        if (out != NULL) {
            rms_store_doubles(out, out_stride, count, &sv, 0);
        }
        return sv;
    }
    /* 16-bit sums narrowed once, then stored and widened back */
    rms_vf rounded = rms_vf_add(rms_load_floats(xk, x, xs, count),
                                rms_load_floats(xk, r, rs, count));
    if (xk == RMS_KIND_F32) {
        if (out != NULL) {
            rms_store_floats(xk, out, out_stride, count, rounded, 0);
        }
    }
    else {
        const rms_vh narrowed = rms_vf_narrow16(xk, rounded);
        if (out != NULL) {
            rms_store_halves(out, out_stride, count, narrowed, 0);
        }
        rounded = rms_vh_widen(xk, narrowed);
    }
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        sv.part[h] = rms_vd_widen(rounded, h);
    }
    return sv;
}

/* The reduction pass over [i, i + count), count <= RMS_LANES: the squares
   of the row's values into lanes; with a residual, of its residual_out,
   made here, and written unless the write pass writes it (src->remade).
   Their squares are taken from the registers that hold residual_out, not
   read back from src->residual_out: a load right after a store of another
   width waits for the store to reach the cache (the fused float32 forward
   took three times as long as the plain one on an AMD Zen 5). */
RMS_ALWAYS_INLINE void rms_reduce_lanes(rms_kind xk, int with_residual, rms_lanes *lanes,
                                        const rms_row_source *src, ptrdiff_t i, ptrdiff_t count)
{
    RMS_UNROLL
    for (int b = 0; b < RMS_LANES / RMS_VF_WIDTH; b++) {
        const ptrdiff_t offset = (ptrdiff_t)b * RMS_VF_WIDTH;
        if (offset >= count) {
            break;
        }
        const ptrdiff_t block_count = count - offset < RMS_VF_WIDTH ? count - offset : RMS_VF_WIDTH;
        const ptrdiff_t at = i + offset;
        const char *x = rms_element(src->x, at, src->x_stride);
        const rms_block v =
            with_residual
                ? rms_make_residual_out(
                      xk, x, src->x_stride, rms_element(src->residual, at, src->residual_stride),
                      src->residual_stride,
                      src->remade
                          ? NULL
                          : rms_element_out(src->residual_out, at, src->residual_out_stride),
                      src->residual_out_stride, block_count)
                : rms_load_doubles(xk, x, src->x_stride, block_count);
        rms_add_block_squares(xk, 0, lanes, b, &v, 0, 1.0, xk == RMS_KIND_F64);
    }
}

/* What a row's reduction pass finds: its sum of squares, and, for float64
   rows, the least of the squares (+inf for the other kinds), which says
   whether its write may go near underflow (rms_forward_row_plan). */
typedef struct {
    rms_dd squares;
    double least_square;
} rms_row_sums;

/* The reduction pass from element done (a multiple of RMS_LANES, the part
   already in lanes) to the row's end, inlined where a write loop runs it. */
RMS_ALWAYS_INLINE rms_row_sums rms_reduce_row_from(rms_kind xk, int with_residual,
                                                   rms_lanes *lanes, ptrdiff_t done,
                                                   ptrdiff_t n, const rms_row_source *source)
{
    const rms_row_source known = rms_source_known(xk, source);
    const rms_row_source *src = &known;
    ptrdiff_t i = done;
    for (; i + RMS_LANES <= n; i += RMS_LANES) {
        rms_reduce_lanes(xk, with_residual, lanes, src, i, RMS_LANES); /* a constant count */
    }
    if (i < n) {
        rms_reduce_lanes(xk, with_residual, lanes, src, i, n - i);
    }
    rms_row_sums sums;
    sums.squares = rms_lanes_total(lanes, RMS_LANES, !rms_kind_is_float_exact(xk));
    sums.least_square =
        xk == RMS_KIND_F64 ? rms_vd_smallest_lane(lanes->least_square) : INFINITY;
    return sums;
}

/* A row's reduction pass from element done on, into lanes, a function
   for each kind, with and without a residual: outside a write loop it
   runs once a row (the first row of a chunk, the rest of a row that a
   write loop reduced in part, a rare row's next), and is compiled once. */
typedef rms_row_sums (*rms_reduce_row_fn)(const rms_lanes *lanes, ptrdiff_t done, ptrdiff_t n,
                                          const rms_row_source *src);
#define RMS_REDUCE_ROW_OF(kind, with_residual)                                                 \
    RMS_NOINLINE rms_row_sums rms_reduce_row_##kind##_##with_residual(                         \
        const rms_lanes *lanes, ptrdiff_t done, ptrdiff_t n, const rms_row_source *src)       \
    {                                                                                          \
        rms_lanes own = rms_lanes_copy(lanes);                                                 \
        return rms_reduce_row_from(RMS_KIND_##kind, with_residual, &own, done, n, src);         \
    }
#define RMS_REDUCE_ROW(kind) RMS_REDUCE_ROW_OF(kind, 0) RMS_REDUCE_ROW_OF(kind, 1)
RMS_REDUCE_ROW(F32)
RMS_REDUCE_ROW(F64)
RMS_REDUCE_ROW(F16)
RMS_REDUCE_ROW(BF16)
#define RMS_REDUCE_ROW_ENTRY(kind)                                                             \
    [RMS_KIND_##kind] = {rms_reduce_row_##kind##_0, rms_reduce_row_##kind##_1},
static const rms_reduce_row_fn rms_reduce_row_of[4][2] = {
    RMS_REDUCE_ROW_ENTRY(F32) RMS_REDUCE_ROW_ENTRY(F64) RMS_REDUCE_ROW_ENTRY(F16)
        RMS_REDUCE_ROW_ENTRY(BF16)};
#undef RMS_REDUCE_ROW_ENTRY
#undef RMS_REDUCE_ROW
#undef RMS_REDUCE_ROW_OF

/* The rest of a row's reduction pass, from element done on, out of line
   (rms_reduce_row_of), with lanes holding the part before it; none for no
   row (src->x NULL). The lanes go to the call as a copy, and the callee
   works on a copy of its own (rms_lanes_copy says why). */
RMS_ALWAYS_INLINE rms_row_sums rms_reduce_row_rest(rms_kind xk, int with_residual,
                                                   const rms_lanes *lanes, ptrdiff_t done,
                                                   ptrdiff_t n, const rms_row_source *src)
{
    if (src->x == NULL) {
        const rms_row_sums none = {{0.0, 0.0}, INFINITY};
        return none;
    }
    const rms_lanes copy = rms_lanes_copy(lanes);
    return rms_reduce_row_of[xk][with_residual](&copy, done, n, src);
}

/* A row's whole reduction pass, out of line. */
RMS_ALWAYS_INLINE rms_row_sums rms_reduce_row(rms_kind xk, int with_residual, ptrdiff_t n,
                                              const rms_row_source *src)
{
    rms_lanes lanes;
    rms_lanes_clear(&lanes);
    return rms_reduce_row_rest(xk, with_residual, &lanes, 0, n, src);
}

/* How a row is written (rms_forward_row_plan): its inv_rms, within
   sum_error of the one from the exact sum, its write mode, and whether a
   float64 row's write may go near the edges of double's range; or one of
   the rare rows' ways: a remade row whose inv_rms is made again from its
   values (rms_forward_remade_row_in_double), or a float64 row whose
   inv_rms leaves double's normal range, as scaled
   (rms_forward_row_extreme). */
typedef struct {
    rms_dd inv_rms;
    rms_write_mode mode;
    double sum_error;
    int near_range_edge;
    int remade_in_double;
    int extreme;
    rms_scaled_inv scaled;
} rms_row_plan;

/* A block in double, out of line, where the inlined double write
   (RMS_WRITE_DOUBLE) does not take it: one with an offset, one a fast
   write was unsure of, and each block of a row written out of line
   (RMS_WRITE_DOUBLE_OUT_OF_LINE). Where the sum's error leaves its
   rounding undecided, it is noted in inv->unsure. */
RMS_ALWAYS_INLINE void rms_forward_block_in_double(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                                   const char *x, ptrdiff_t xs,
                                                   const rms_row_weight *w, ptrdiff_t at,
                                                   char *y, ptrdiff_t ys, ptrdiff_t count,
                                                   const rms_inv_forms *inv, int stream)
{
    const char *w_at = rms_element(w->data, at, w->stride);
    int sure;
    if (mode != RMS_WRITE_FLOAT && w->with_offset) { /* float rows have no offset */
        sure = rms_forward_block_double_offset_of(
            xk, x, xs, w_at, w->stride, w->offset, w->lo != NULL ? w->hi + at : NULL,
            w->lo != NULL ? w->lo + at : NULL, y, ys, count, inv->dd, inv->sum_error,
            inv->near_range_edge, stream);
    }
    else {
        sure = rms_forward_block_double_out_of_line[xk][wk](
            x, xs, w_at, w->stride, NULL, y, ys, count, inv->dd, inv->sum_error,
            inv->near_range_edge, stream);
    }
    if (!sure) {
        rms_unsure_blocks *unsure = inv->unsure;
        if (unsure->count < RMS_UNSURE_BLOCKS) {
            unsure->at[unsure->count] = at;
        }
        unsure->count++;
    }
}

/* The stride of a row's values as its write reads them (rms_block_values):
   a made block's is its element's size. */
RMS_ALWAYS_INLINE ptrdiff_t rms_values_stride(rms_kind xk, int with_residual,
                                              const rms_row_source *row)
{
    if (with_residual && row->remade) {
        return rms_kind_size(xk);
    }
    return with_residual ? row->residual_out_stride : row->x_stride;
}

/* The values of a row's block from `at` on, as its write reads them
   (rms_values_stride apart): the row's in memory (x, or residual_out), or,
   where the write pass makes residual_out (row->remade), the block's
   residual_out made again into made and written (streamed where stream
   says). The write reads them through a pointer: made is a block on the
   stack, whose store and load stay in L1. */
RMS_ALWAYS_INLINE const char *rms_block_values(rms_kind xk, int with_residual,
                                               const rms_row_source *row, ptrdiff_t at,
                                               ptrdiff_t count, char *made, int stream)
{
    if (!with_residual || !row->remade) {
        return rms_element(with_residual ? row->residual_out : row->x, at,
                           rms_values_stride(xk, with_residual, row));
    }
    const ptrdiff_t size = rms_kind_size(xk);
    (void)rms_make_residual_out(xk, rms_element(row->x, at, row->x_stride), row->x_stride,
                                rms_element(row->residual, at, row->residual_stride),
                                row->residual_stride, made, size, count);
    char *out = rms_element_out(row->residual_out, at, row->residual_out_stride);
    if (xk == RMS_KIND_F64) {
        const rms_block h = rms_load_doubles(xk, made, size, count);
        rms_store_doubles(out, row->residual_out_stride, count, &h, stream);
    }
    else {
        rms_store_floats(xk, out, row->residual_out_stride, count,
                         rms_load_floats(xk, made, size, count), stream);
    }
    return made;
}

/* One block of a row's write, from `at` on, the way mode says: y's, and,
   where the write makes it, residual_out's (rms_block_values). Returns 0,
   having written no y, where the fast path was unsure of it and defer is
   set: the caller then writes it later, in double (rms_forward_write).
   For float32 with an offset that is a float, where no pair was made for
   the call (a call of a few rows, or rows with weights or offsets of their
   own), offset + weight is made here as a float two-sum, hi + lo exactly
   (rms_forward_block_float counts 2^-48 for a pair made with error); a
   hi that is not finite has NaN lanes, and the block goes in double.
   Making the pair, a pass over the weight, and reading it back cost a row
   of 4096 more than this does. */
RMS_ALWAYS_INLINE int rms_forward_block(rms_kind xk, rms_kind wk, rms_write_mode mode,
                                        int with_residual, const rms_row_source *row,
                                        const rms_row_weight *w, ptrdiff_t at, char *y,
                                        ptrdiff_t ys, ptrdiff_t count, const rms_inv_forms *inv,
                                        int stream, int residual_out_stream, int defer)
{
    _Alignas(RMS_VECTOR_BYTES) char made[RMS_VF_WIDTH * 8];
    const ptrdiff_t xs = rms_values_stride(xk, with_residual, row);
    const char *x = rms_block_values(xk, with_residual, row, at, count, made, residual_out_stream);
    const char *w_at = rms_element(w->data, at, w->stride);
    y = rms_element_out(y, at, ys);
    if (mode == RMS_WRITE_FAST16 &&
        rms_forward_block_fast16(xk, x, xs, w->floats + at, y, ys, count, inv, stream)) {
        return 1;
    }
    const int offset32_in_float = mode == RMS_WRITE_OFFSET32 && RMS_HAVE_FMA;
    const int offset_in_block =
        mode == RMS_WRITE_OFFSET32_IN_BLOCKS && RMS_OFFSET_IN_FLOATS(xk, wk);
    if (mode == RMS_WRITE_FLOAT || offset32_in_float || offset_in_block) {
        const rms_vf xv = rms_load_floats(xk, x, xs, count);
        rms_vf wv, w_lo = rms_vf_set(0.0f);
        if (mode == RMS_WRITE_FLOAT) {
            wv = rms_load_floats(wk, w_at, w->stride, count);
        }
        else if (offset32_in_float) {
            wv = rms_load_floats(RMS_KIND_F32, (const char *)(w->floats + at), 4, count);
            w_lo = rms_load_floats(RMS_KIND_F32, (const char *)(w->floats_lo + at), 4, count);
        }
        else {
            wv = rms_offset_weight_floats_block(w_at, w->stride, count, inv->offset, &w_lo);
        }
        if (rms_forward_block_float(xk, xv, wv, mode == RMS_WRITE_FLOAT ? NULL : &w_lo, y, ys,
                                    count, inv, stream)) {
            return 1;
        }
    }
    if (mode == RMS_WRITE_OFFSET32 && !RMS_HAVE_FMA &&
        rms_forward_block_offset32(xk, x, xs, w->hi + at, y, ys, count, inv, stream)) {
        return 1;
    }
    if (defer && rms_mode_may_defer(mode)) {
        return 0;
    }
    /* The plain double write inlines its blocks, and its loop has no call:
       a call costs a loop every vector register that lives across it. A
       row written in double has an exact sum (rms_forward_row_plan): no
       block of it is unsure. */
    if (mode == RMS_WRITE_DOUBLE) {
        (void)rms_forward_block_double(xk, wk, x, xs, w_at, w->stride, NULL, y, ys, count,
                                       inv->dd, 0.0, 0, stream);
    }
    else {
        rms_forward_block_in_double(xk, wk, mode, x, xs, w, at, y, ys, count, inv, stream);
    }
    return 1;
}

/* The blocks of a row's write loop that the fast 16-bit or float32 path
   was unsure of, to be written in double once the loop has stopped: a
   call inside the loop, even on a path it rarely takes, made the compiler
   keep the loop's state in memory and spill its registers there (the
   bfloat16 forward took a seventh longer in cache). */
#define RMS_DEFERRED_BLOCKS 32
typedef struct {
    ptrdiff_t at[RMS_DEFERRED_BLOCKS];
    int count;
} rms_deferred;

/* Writes the deferred blocks in double, from the row's values in memory:
   x, or residual_out, which the write pass has written where it makes it
   (so they are read, not made again: a copy of the row not remade). Their
   y is unwritten, so in place, x is still there. */
RMS_ALWAYS_INLINE void rms_write_deferred(rms_kind xk, rms_kind wk, int with_residual,
                                          const rms_row_source *row, const rms_row_weight *w,
                                          char *y, ptrdiff_t ys, const rms_inv_forms *inv,
                                          int stream, rms_deferred *deferred)
{
    rms_row_source written = *row;
    written.remade = 0;
    for (int k = 0; k < deferred->count; k++) {
        (void)rms_forward_block(xk, wk, RMS_WRITE_DOUBLE_OUT_OF_LINE, with_residual, &written, w,
                                deferred->at[k], y, ys, RMS_VF_WIDTH, inv, stream, 0, 0);
    }
    deferred->count = 0;
}

/* Where a step of the write loop, RMS_LANES elements from i, asks for
   rows ahead of it (rms_forward_write): where it reduces next, the row
   after next, from next_done on, where there is one; else next's own
   elements, to be reduced after the loop. */
RMS_ALWAYS_INLINE void rms_ask_ahead(int with_residual, int reduce, const rms_row_source *next,
                                     ptrdiff_t i, ptrdiff_t next_done)
{
    const char *x = reduce ? next->ahead_x : next->x;
    const char *residual = reduce ? next->ahead_residual : next->residual;
    const ptrdiff_t at = reduce ? next_done : i;
    if (x == NULL) {
        return;
    }
    rms_prefetch(rms_element(x, at, next->x_stride), RMS_LANES * next->x_stride);
    if (with_residual) {
        rms_prefetch(rms_element(residual, at, next->residual_stride),
                     RMS_LANES * next->residual_stride);
    }
}

/*
 * Writes y for one row in the plan's mode, and returns the sums of next,
 * where that is a row (0 where it is not). The same loop runs the next
 * row's reduction pass where reduce says, a constant at each call:
 * decided inside the loop, the choice left the compiler keeping those sums
 * in memory, loaded and stored at every step (a tenth of the in-cache
 * 16-bit forward). The reduction is bound by arithmetic and the write by
 * loads and stores, and one loop doing both lets the core overlap them.
 * Where the output is streamed, rows come from memory: the loop asks for
 * the row after next too, so that the bus brings it in while the core
 * works, and next's reduction finds it in cache. Where next has no row
 * after it in the chunk, the loop asks for next itself and reduces it
 * afterwards. (Asking for next only, and always reducing it afterwards,
 * left the bus idle during the reductions: the float64 forward at
 * 2048x4096 took a tenth longer.)
 *
 * The unaligned head (head elements) and the tail write their blocks at
 * once, unsure or not; the whole steps defer theirs (rms_deferred). A
 * streamed row writes its deferred blocks as soon as their step ends,
 * streamed too. Written at the row's end with plain stores, each cost a
 * read of its line from memory (the float16 forward from memory took a
 * fifth longer); streamed at the row's end, they cost the same as here.
 */
RMS_ALWAYS_INLINE rms_row_sums rms_forward_write(
    rms_kind xk, rms_kind wk, rms_write_mode mode, int with_residual, int reduce, ptrdiff_t n,
    const rms_row_source *row_source, const rms_row_weight *weight, char *y, ptrdiff_t ys,
    ptrdiff_t head, int streamed, int stream, rms_dd inv_rms, double sum_error,
    int near_range_edge, rms_unsure_blocks *unsure, const rms_row_source *next_source)
{
    const rms_row_source row_known = rms_source_known(xk, row_source);
    const rms_row_source next_known = rms_source_known(xk, next_source);
    const rms_row_source *row = &row_known, *next = &next_known;
    const rms_row_weight w_known = RMS_STRIDED_ROWS ? *weight : rms_weight_known(wk, weight);
    const rms_row_weight *w = &w_known;
    /* only the out-of-line double write checks for underflow */
    const rms_inv_forms inv = rms_inv_forms_of(
        xk, wk, w->with_offset, w->offset, inv_rms, sum_error,
        mode == RMS_WRITE_DOUBLE_OUT_OF_LINE && near_range_edge, unsure, mode);
    const ptrdiff_t size = rms_kind_size(xk);
    const int residual_out_streamed =
        with_residual && row->remade &&
        rms_can_stream(stream, rms_element_out(row->residual_out, head, row->residual_out_stride),
                       row->residual_out_stride, size);
    rms_lanes next_lanes;
    rms_lanes_clear(&next_lanes);
    ptrdiff_t next_done = 0, i = 0;
    for (; i < head; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = head - i < RMS_VF_WIDTH ? head - i : RMS_VF_WIDTH;
        (void)rms_forward_block(xk, wk, mode, with_residual, row, w, i, y, ys, count, &inv, 0, 0,
                                0);
    }
    i = head;
    rms_deferred deferred;
    deferred.count = 0;
    const int limit = streamed ? 0 : RMS_DEFERRED_BLOCKS - RMS_LANES / RMS_VF_WIDTH;
    while (i + RMS_LANES <= n) {
        for (; i + RMS_LANES <= n && deferred.count <= limit; i += RMS_LANES) {
            rms_ask_ahead(with_residual, reduce, next, i, next_done);
            if (reduce) {
                rms_reduce_lanes(xk, with_residual, &next_lanes, next, next_done, RMS_LANES);
                next_done += RMS_LANES;
            }
            for (ptrdiff_t b = 0; b < RMS_LANES; b += RMS_VF_WIDTH) {
                if (!rms_forward_block(xk, wk, mode, with_residual, row, w, i + b, y, ys,
                                       RMS_VF_WIDTH, &inv, streamed, residual_out_streamed,
                                       rms_mode_may_defer(mode))) {
                    deferred.at[deferred.count++] = i + b;
                }
            }
        }
        rms_write_deferred(xk, wk, with_residual, row, w, y, ys, &inv, streamed, &deferred);
    }
    for (; i < n; i += RMS_VF_WIDTH) {
        const ptrdiff_t count = n - i < RMS_VF_WIDTH ? n - i : RMS_VF_WIDTH;
        (void)rms_forward_block(xk, wk, mode, with_residual, row, w, i, y, ys, count, &inv, 0, 0,
                                0);
    }
    return rms_reduce_row_rest(xk, with_residual, &next_lanes, next_done, n, next);
}

#endif
