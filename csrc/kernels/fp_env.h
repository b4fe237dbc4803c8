/*
 * The floating-point environment the kernels need, on the thread that runs
 * them: subnormals read and written as they are (no flush-to-zero, no
 * denormals-are-zero) and rounding to nearest. A caller may have changed
 * any of these (torch.set_flush_denormal, a library built with -ffast-math,
 * fesetround), and pool workers keep whatever they were started with; each
 * thread sets the mode for the kernels' run and restores its own after, so
 * results are the same bytes whatever the caller's mode and thread count.
 * rms_fp_flags_clear drops the exception flags a run raised, for callers
 * that report none (csrc/numpy/gufuncs.h says why).
 */
#ifndef RMSNORM_KERNELS_FP_ENV_H
#define RMSNORM_KERNELS_FP_ENV_H

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

typedef unsigned int rms_fp_env;

/* MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6) and the
   rounding control (bits 13 and 14, 0 for to nearest). */
#define RMS_MXCSR_CLEARED ((1u << 15) | (1u << 6) | (3u << 13))

static inline rms_fp_env rms_fp_env_enter(void)
{
    const rms_fp_env saved = _mm_getcsr();
    if (saved & RMS_MXCSR_CLEARED) {
        _mm_setcsr(saved & ~RMS_MXCSR_CLEARED);
    }
    return saved;
}

static inline void rms_fp_env_leave(rms_fp_env saved)
{
    if (saved & RMS_MXCSR_CLEARED) {
        _mm_setcsr(saved);
    }
}

/* The six exception flags, bits 0 to 5 of MXCSR: the kernels' arithmetic
   is SSE's alone, and clearing them there costs a quarter of
   feclearexcept, which saves and reloads the x87 environment too. */
static inline void rms_fp_flags_clear(void) { _mm_setcsr(_mm_getcsr() & ~0x3fu); }

#elif defined(__aarch64__) && defined(__GNUC__)

typedef unsigned long long rms_fp_env;

/* FPCR: flush-to-zero (FZ, bit 24; FZ16, bit 19) and the rounding mode
   (RMode, bits 22 and 23, 0 for to nearest). */
#define RMS_FPCR_CLEARED ((1ull << 24) | (1ull << 19) | (3ull << 22))

static inline rms_fp_env rms_fp_env_enter(void)
{
    rms_fp_env saved;
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved));
    if (saved & RMS_FPCR_CLEARED) {
        const rms_fp_env wanted = saved & ~RMS_FPCR_CLEARED;
        __asm__ volatile("msr fpcr, %0" : : "r"(wanted));
    }
    return saved;
}

static inline void rms_fp_env_leave(rms_fp_env saved)
{
    if (saved & RMS_FPCR_CLEARED) {
        __asm__ volatile("msr fpcr, %0" : : "r"(saved));
    }
}

#else /* elsewhere the kernels run in the caller's environment */

typedef int rms_fp_env;
static inline rms_fp_env rms_fp_env_enter(void) { return 0; }
static inline void rms_fp_env_leave(rms_fp_env saved) { (void)saved; }

#endif

#if !defined(__x86_64__) && !defined(_M_X64)
#include <fenv.h>

static inline void rms_fp_flags_clear(void) { feclearexcept(FE_ALL_EXCEPT); }
#endif

#endif
