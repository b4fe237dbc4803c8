/* The kernels for x86-64 with AVX2, FMA and F16C, chosen at run time. */
#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include "simd/vec_avx2.h"

#define RMS_LANES 32
#include "row_kernels.h"

const rms_kernels rms_kernels_avx2[RMS_NUM_TYPES] = {RMS_FOR_EACH_TYPE(RMS_TABLE_ENTRY)};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
