/* Packed copies of strided rows, for the contiguous row kernels. */
#include "packed_rows.h"

#include <stdint.h>
#include <string.h>

#define RMS_CACHE_LINE 64

/* Bytes from one packed row to the next: whole cache lines, so that every
   row starts aligned as the first does, and one line more, so that a
   power-of-two row length does not put a column's elements in one cache
   set: the copy of a transposed view writes down the columns. */
static size_t packed_row_stride(ptrdiff_t n, ptrdiff_t size)
{
    const size_t bytes = (size_t)n * (size_t)size;
    return (bytes + RMS_CACHE_LINE - 1) / RMS_CACHE_LINE * RMS_CACHE_LINE + RMS_CACHE_LINE;
}

size_t rms_packed_bytes(ptrdiff_t rows, ptrdiff_t n, ptrdiff_t size)
{
    if (rows <= 0 || n <= 0) {
        return 0;
    }
    if ((size_t)n > (SIZE_MAX / 4) / (size_t)size / (size_t)rows) {
        return SIZE_MAX;
    }
    return (size_t)rows * packed_row_stride(n, size);
}

/* count elements of `size` bytes, src_step and dst_step bytes apart. */
static inline void copy_elements(char *dst, ptrdiff_t dst_step, const char *src,
                                 ptrdiff_t src_step, ptrdiff_t count, size_t size)
{
    for (ptrdiff_t k = 0; k < count; k++) {
        memcpy(dst + k * dst_step, src + k * src_step, size);
    }
}

/* Whether a strided matrix is best read or written a column at a time:
   where its rows lie closer together than its elements (a transposed
   view), so that the inner loop uses every byte of a cache line. */
static int by_columns(rms_matrix strided, ptrdiff_t rows)
{
    const ptrdiff_t row_step = strided.row_stride < 0 ? -strided.row_stride : strided.row_stride;
    const ptrdiff_t step = strided.stride < 0 ? -strided.stride : strided.stride;
    return rows > 1 && row_step < step;
}

static inline void copy_matrix_of(rms_matrix dst, rms_matrix src, ptrdiff_t rows, ptrdiff_t n,
                                  size_t size, int columns)
{
    if (columns) {
        for (ptrdiff_t i = 0; i < n; i++) {
            copy_elements(dst.data + i * dst.stride, dst.row_stride, src.data + i * src.stride,
                          src.row_stride, rows, size);
        }
        return;
    }
    for (ptrdiff_t r = 0; r < rows; r++) {
        copy_elements(dst.data + r * dst.row_stride, dst.stride, src.data + r * src.row_stride,
                      src.stride, n, size);
    }
}

/* With the element size a constant in each call, each element's copy is a
   load and a store. */
static void copy_matrix(rms_matrix dst, rms_matrix src, ptrdiff_t rows, ptrdiff_t n,
                        ptrdiff_t size, int columns)
{
    switch (size) {
    case 8:
        copy_matrix_of(dst, src, rows, n, 8, columns);
        break;
    case 4:
        copy_matrix_of(dst, src, rows, n, 4, columns);
        break;
    default:
        copy_matrix_of(dst, src, rows, n, 2, columns);
    }
}

rms_matrix rms_rows_copy(rms_matrix m, ptrdiff_t rows, ptrdiff_t n, ptrdiff_t size, char *dst)
{
    const ptrdiff_t copied_rows = m.row_stride == 0 ? 1 : rows;
    const rms_matrix copy = {dst, m.row_stride == 0 ? 0 : (ptrdiff_t)packed_row_stride(n, size),
                             size};
    copy_matrix(copy, m, copied_rows, n, size, by_columns(m, copied_rows));
    return copy;
}

rms_matrix rms_rows_packed(rms_matrix m, ptrdiff_t begin, ptrdiff_t rows, ptrdiff_t n,
                           ptrdiff_t size, char **scratch, int copy_in)
{
    const rms_matrix at = {m.data + begin * m.row_stride, m.row_stride, m.stride};
    if (m.stride == size) {
        return at;
    }
    const ptrdiff_t packed_rows = m.row_stride == 0 ? 1 : rows;
    const rms_matrix packed = {*scratch,
                               m.row_stride == 0 ? 0 : (ptrdiff_t)packed_row_stride(n, size), size};
    *scratch += rms_packed_bytes(packed_rows, n, size);
    return copy_in ? rms_rows_copy(at, rows, n, size, packed.data) : packed;
}

/* The lowest and one past the highest byte of rows [0, rows) of m. */
static void extent(rms_matrix m, ptrdiff_t rows, ptrdiff_t n, ptrdiff_t size, uintptr_t *low,
                   uintptr_t *high)
{
    const ptrdiff_t row_span = (rows - 1) * m.row_stride, span = (n - 1) * m.stride;
    const uintptr_t base = (uintptr_t)m.data;
    *low = base - (uintptr_t)((row_span < 0 ? -row_span : 0) + (span < 0 ? -span : 0));
    *high = base + (uintptr_t)((row_span > 0 ? row_span : 0) + (span > 0 ? span : 0) + size);
}

int rms_rows_overlap(rms_matrix a, ptrdiff_t a_size, rms_matrix b, ptrdiff_t b_size,
                     ptrdiff_t rows, ptrdiff_t n)
{
    if (a.data == NULL || b.data == NULL || rows <= 0 || n <= 0) {
        return 0;
    }
    uintptr_t a_low, a_high, b_low, b_high;
    extent(a, rows, n, a_size, &a_low, &a_high);
    extent(b, rows, n, b_size, &b_low, &b_high);
    return a_low < b_high && b_low < a_high;
}

void rms_rows_unpack(rms_matrix m, ptrdiff_t begin, rms_matrix packed, ptrdiff_t rows,
                     ptrdiff_t n, ptrdiff_t size)
{
    if (m.stride == size) {
        return;
    }
    const rms_matrix at = {m.data + begin * m.row_stride, m.row_stride, m.stride};
    copy_matrix(at, packed, rows, n, size, by_columns(at, rows));
}
