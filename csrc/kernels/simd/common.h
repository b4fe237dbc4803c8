/* What every instruction set's vocabulary and the kernels over it share. */
#ifndef RMSNORM_KERNELS_SIMD_COMMON_H
#define RMSNORM_KERNELS_SIMD_COMMON_H

#if defined(__GNUC__)
#define RMS_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define RMS_ALWAYS_INLINE static inline
#endif

#endif
