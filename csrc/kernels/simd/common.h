/* What every instruction set's vocabulary and the kernels over it share. */
#ifndef RMSNORM_KERNELS_SIMD_COMMON_H
#define RMSNORM_KERNELS_SIMD_COMMON_H

/* The kernels are written as small functions that each row loop inlines
   whole, so that the compiler sees every kind, stride and mode as a
   constant. Sanitizer builds (.ci/sanitize.sh, .ci/fuzz.sh) define
   RMS_NO_FORCED_INLINE: instrumented, the inlined row loops took gcc 14
   and clang 27 minutes to compile, and left to the compiler's own choice
   seconds. The same source runs either way; only its code layout differs. */
#if defined(__GNUC__) && !defined(RMS_NO_FORCED_INLINE)
#define RMS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define RMS_NOINLINE static __attribute__((noinline))
#else
#define RMS_ALWAYS_INLINE static inline
#define RMS_NOINLINE static
#endif

/* Loops over a block's vectors or a row's accumulators have constant trip
   counts; unrolled whole, their accumulators can stay in registers. */
#if defined(__clang__)
#define RMS_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define RMS_UNROLL _Pragma("GCC unroll 64")
#else
#define RMS_UNROLL
#endif

#endif
