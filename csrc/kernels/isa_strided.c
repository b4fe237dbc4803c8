/* The portable kernels once more, taking strided rows too: for the rows
   the driver cannot pack, being too long (rms_strided_kernels_for). Such
   rows are rare, so this table is compiled for size, its functions left to
   the compiler to inline or not, and optimised for size where the compiler
   takes that per file: a twentieth of the portable table's machine code. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("Os")
#endif
#define RMS_NO_FORCED_INLINE 1
#include "simd/vec_baseline.h"

#define RMS_LANES 16
#define RMS_STRIDED_ROWS 1
#include "row_kernels.h"

const rms_kernels rms_kernels_strided[RMS_NUM_TYPES] = {RMS_FOR_EACH_TYPE(RMS_TABLE_ENTRY)};
