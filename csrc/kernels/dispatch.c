/* Picks, once, the widest instruction set that this CPU runs. */
#include <stdatomic.h>

#include "kernels.h"

extern const rms_kernels rms_kernels_baseline[RMS_NUM_TYPES];
extern const rms_kernels rms_kernels_strided[RMS_NUM_TYPES];
#if defined(__x86_64__) && defined(__GNUC__)
#define RMS_X86 1
extern const rms_kernels rms_kernels_avx2[RMS_NUM_TYPES];
extern const rms_kernels rms_kernels_avx512[RMS_NUM_TYPES];
#else
#define RMS_X86 0
#endif

static int always(void) { return 1; }

#if RMS_X86
#include <cpuid.h>

/* F16C from CPUID: clang before 19 has no "f16c" for __builtin_cpu_supports. */
static int cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           cpu_has_f16c();
}

static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma") && cpu_has_f16c();
}
#endif

/* One row per instruction set; a new SIMD variant is a row here. */
static const struct {
    const char *name;
    const rms_kernels *table;
    int (*supported)(void);
} isas[RMS_NUM_ISAS] = {
    [RMS_ISA_BASELINE] = {"baseline", rms_kernels_baseline, always},
#if RMS_X86
    [RMS_ISA_AVX2] = {"avx2", rms_kernels_avx2, cpu_has_avx2},
    [RMS_ISA_AVX512] = {"avx512", rms_kernels_avx512, cpu_has_avx512},
#else
    [RMS_ISA_AVX2] = {"avx2", NULL, NULL},
    [RMS_ISA_AVX512] = {"avx512", NULL, NULL},
#endif
};

static atomic_int active = RMS_ISA_BASELINE;

const char *rms_isa_name(rms_isa isa) { return isas[isa].name; }

int rms_isa_supported(rms_isa isa)
{
    return isa >= 0 && isa < RMS_NUM_ISAS && isas[isa].supported && isas[isa].supported();
}

int rms_force_isa(rms_isa isa)
{
    if (!rms_isa_supported(isa)) {
        return 0;
    }
    active = isa;
    return 1;
}

rms_isa rms_select_isa(void)
{
    rms_isa best = RMS_ISA_BASELINE;
    for (int isa = RMS_NUM_ISAS - 1; isa > RMS_ISA_BASELINE; isa--) {
        if (rms_isa_supported((rms_isa)isa)) {
            best = (rms_isa)isa;
            break;
        }
    }
    active = best; /* RMSNORM_ISA narrows it, read at import (rmsnorm/_environment.py) */
    return active;
}

rms_isa rms_active_isa(void) { return (rms_isa)atomic_load(&active); }

const rms_kernels *rms_kernels_for(rms_type type) { return &isas[atomic_load(&active)].table[type]; }

const rms_kernels *rms_strided_kernels_for(rms_type type) { return &rms_kernels_strided[type]; }
