/* The kernels with no instruction-set assumption: builds everywhere. */
#include "simd/vec_baseline.h"

#define RMS_LANES 16
#include "row_kernels.h"

const rms_kernels rms_kernels_baseline[RMS_NUM_TYPES] = {RMS_FOR_EACH_TYPE(RMS_TABLE_ENTRY)};
