/* What every instruction set's vocabulary and the kernels over it share. */
#ifndef RMSNORM_KERNELS_SIMD_COMMON_H
#define RMSNORM_KERNELS_SIMD_COMMON_H

#if defined(__GNUC__)
#define RMS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define RMS_NOINLINE static __attribute__((noinline))
#else
#define RMS_ALWAYS_INLINE static inline
#define RMS_NOINLINE static
#endif

#endif
