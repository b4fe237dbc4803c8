/* The kernels for x86-64 with AVX-512 (F, BW, DQ, VL), chosen at run time. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "rms_norm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c"))), \
                             apply_to = function)
#else
/* GCC prefers 256-bit vectors even where 512 are allowed; ask for 512. */
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c,prefer-vector-width=512")
#endif

#define RMS_ISA_SUFFIX avx512
#define RMS_ISA_TABLE rms_kernels_avx512
#define RMS_LANES 64
#define RMS_VECTOR_BYTES 64
#define RMS_HAVE_F16C 1
#define RMS_HAVE_FMA 1
#define RMS_STREAM_FLOATS 16
#define RMS_STREAM_STORE(dst, src) _mm512_stream_ps((float *)(void *)(dst), _mm512_loadu_ps(src))
#define RMS_STREAM_FENCE() _mm_sfence()
#include "types.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
