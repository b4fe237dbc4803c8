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

#endif
