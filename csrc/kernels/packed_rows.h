/*
 * Rows whose elements are not adjacent in memory (a column slice, a
 * transposed or reversed view, a broadcast row) reach the row kernels as
 * packed copies. The kernels are compiled for contiguous rows only: a
 * strided variant of every loop doubled their machine code and compile
 * time, and ran slower than a copy in and out. The results are the same
 * bytes either way, since an element's arithmetic and its lane do not
 * depend on where the row lies.
 */
#ifndef RMSNORM_KERNELS_PACKED_ROWS_H
#define RMSNORM_KERNELS_PACKED_ROWS_H

#include <stddef.h>

#include "rms_norm.h"

/* Bytes of a packed copy of `rows` rows of n elements of size bytes, each
   row starting on a cache line (where the copy does); SIZE_MAX where that
   is more than there is to ask for. */
size_t rms_packed_bytes(ptrdiff_t rows, ptrdiff_t n, ptrdiff_t size);

/*
 * Rows [begin, begin + rows) of m as the kernels read them, element stride
 * `size`: m itself from row begin where its elements are adjacent already;
 * else the next rms_packed_bytes of *scratch, which is moved past them, as
 * a packed matrix, filled from m where copy_in is set (an input). A matrix
 * whose row stride is 0 (one row for all) stays one packed row.
 */
rms_matrix rms_rows_packed(rms_matrix m, ptrdiff_t begin, ptrdiff_t rows, ptrdiff_t n,
                           ptrdiff_t size, char **scratch, int copy_in);

/* A packed copy of rows [0, rows) of m (one row where m's row stride is
   0) at dst, which holds rms_packed_bytes of them. */
rms_matrix rms_rows_copy(rms_matrix m, ptrdiff_t rows, ptrdiff_t n, ptrdiff_t size, char *dst);

/* Whether rows [0, rows) of a and of b, n elements each of a_size and
   b_size bytes, may share a byte: whether their spans in memory meet. */
int rms_rows_overlap(rms_matrix a, ptrdiff_t a_size, rms_matrix b, ptrdiff_t b_size,
                     ptrdiff_t rows, ptrdiff_t n);

/* Copies rows written into `packed` (from rms_rows_packed) back to rows
   [begin, begin + rows) of m, where they are not m's own. */
void rms_rows_unpack(rms_matrix m, ptrdiff_t begin, rms_matrix packed, ptrdiff_t rows,
                     ptrdiff_t n, ptrdiff_t size);

#endif
