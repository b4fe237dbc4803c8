/*
 * The floating-point environment the kernels need, on the thread that runs
 * them: subnormals read and written as they are (no flush-to-zero, no
 * denormals-are-zero) and rounding to nearest. A caller may have changed
 * any of these (torch.set_flush_denormal, a library built with -ffast-math,
 * fesetround), and pool workers keep whatever they were started with; each
 * thread sets the mode for the kernels' run and restores its own after, so
 * results are the same bytes whatever the caller's mode and thread count.
 * The exception flags are given back as they were too: those that the
 * kernels' intermediate steps raise say nothing about the result (an error
 * term of an overflowing square, which the rescaled path then replaces),
 * and a worker's would never reach the caller anyway.
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

/* MXCSR holds the exception flags too (bits 0 to 5), and the kernels'
   arithmetic is SSE's alone: one write gives back mode and flags. (fenv's
   calls cost four times as much: they save and reload the x87 state too.) */
static inline void rms_fp_env_leave(rms_fp_env saved)
{
    if (_mm_getcsr() != saved) {
        _mm_setcsr(saved);
    }
}

#elif defined(__aarch64__) && defined(__GNUC__)

/* The control register (FPCR) and the status register with the flags
   (FPSR). */
typedef struct {
    unsigned long long fpcr, fpsr;
} rms_fp_env;

/* FPCR: flush-to-zero (FZ, bit 24; FZ16, bit 19) and the rounding mode
   (RMode, bits 22 and 23, 0 for to nearest). */
#define RMS_FPCR_CLEARED ((1ull << 24) | (1ull << 19) | (3ull << 22))

static inline rms_fp_env rms_fp_env_enter(void)
{
    rms_fp_env saved;
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved.fpcr));
    __asm__ volatile("mrs %0, fpsr" : "=r"(saved.fpsr));
    if (saved.fpcr & RMS_FPCR_CLEARED) {
        const unsigned long long wanted = saved.fpcr & ~RMS_FPCR_CLEARED;
        __asm__ volatile("msr fpcr, %0" : : "r"(wanted));
    }
    return saved;
}

static inline void rms_fp_env_leave(rms_fp_env saved)
{
    if (saved.fpcr & RMS_FPCR_CLEARED) {
        __asm__ volatile("msr fpcr, %0" : : "r"(saved.fpcr));
    }
    __asm__ volatile("msr fpsr, %0" : : "r"(saved.fpsr));
}

#else /* elsewhere the kernels run in the caller's mode; the flags are C's */
#include <fenv.h>

typedef fexcept_t rms_fp_env;

static inline rms_fp_env rms_fp_env_enter(void)
{
    rms_fp_env saved;
    fegetexceptflag(&saved, FE_ALL_EXCEPT);
    return saved;
}

static inline void rms_fp_env_leave(rms_fp_env saved) { fesetexceptflag(&saved, FE_ALL_EXCEPT); }

#endif

#endif
