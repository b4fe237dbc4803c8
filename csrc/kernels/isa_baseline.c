/* The kernels with no instruction-set assumption: builds everywhere. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "rms_norm.h"

#define RMS_ISA_SUFFIX baseline
#define RMS_ISA_TABLE rms_kernels_baseline
#define RMS_LANES 16
#define RMS_VECTOR_BYTES 16
#define RMS_HAVE_F16C 0
#define RMS_HAVE_FMA 0
#include "types.inc"
