/* The kernels for x86-64 with AVX2 and FMA, chosen at run time. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "rms_norm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define RMS_ISA_SUFFIX avx2
#define RMS_ISA_TABLE rms_kernels_avx2
#define RMS_LANES 32
#define RMS_VECTOR_BYTES 32
#define RMS_HAVE_F16C 1
#define RMS_HAVE_FMA 1
#define RMS_STREAM_FLOATS 8
#define RMS_STREAM_STORE(dst, src) _mm256_stream_ps((float *)(void *)(dst), _mm256_loadu_ps(src))
#define RMS_STREAM_FENCE() _mm_sfence()
#include "types.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
