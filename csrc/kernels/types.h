/*
 * The element types the kernels serve: each pairs a storage kind for x (and
 * y, grad_output and grad_input) with one for the weight (and grad_weight).
 * eps is float64 for float64 input and float32 otherwise, as torch rounds it.
 *
 * This list is the one source of the dtype table: the kernel tables
 * (isa_*.c), the NumPy glue's loops (numpy/gufuncs.c) and, through
 * rmsnorm._core.dtype_pairs, rmsnorm._dtypes are built from it. NumPy tries
 * loops in this order, so an input's own weight kind comes before a wider
 * one.
 *
 * Adding a pair of existing kinds: a row here; then name it where prose
 * and tests list the pairs (LOOPS_DOC, the gufuncs' loop table in
 * numpy/gufuncs.c, which a test checks against this list; the dtype
 * notes of docs/api.md and docs/torch.md; the dtype grids of
 * tests/test_parity_torch.py and benchmarks/accuracy.py). Adding a storage
 * kind: also a case in rms_vf_load, rms_vf_store and rms_vf_narrow16
 * (simd/vec_derived.h), in the conversions and rms_vd_load_widened of
 * every simd/vec_*.h, in rms_kind_size (below) and rms_load_scalar
 * (half.h), and in the glue's type_num_of and kind_name.
 */
#ifndef RMSNORM_KERNELS_TYPES_H
#define RMSNORM_KERNELS_TYPES_H

#include <stddef.h>

/* Storage kinds. float16 and bfloat16 are stored as their 16-bit patterns. */
typedef enum {
    RMS_KIND_F32,
    RMS_KIND_F64,
    RMS_KIND_F16,
    RMS_KIND_BF16,
} rms_kind;

/* RMS_TYPE(name, x kind, weight kind), once per type. */
#define RMS_FOR_EACH_TYPE(RMS_TYPE)                                                        \
    RMS_TYPE(FLOAT16, F16, F16)                                                            \
    RMS_TYPE(FLOAT16_WEIGHT32, F16, F32)                                                   \
    RMS_TYPE(FLOAT32, F32, F32)                                                            \
    RMS_TYPE(FLOAT32_WEIGHT64, F32, F64)                                                   \
    RMS_TYPE(FLOAT64, F64, F64)                                                            \
    RMS_TYPE(BFLOAT16, BF16, BF16)                                                         \
    RMS_TYPE(BFLOAT16_WEIGHT32, BF16, F32)

#define RMS_TYPE_ENUM(name, x, weight) RMS_##name,
typedef enum { RMS_FOR_EACH_TYPE(RMS_TYPE_ENUM) RMS_NUM_TYPES } rms_type;
#undef RMS_TYPE_ENUM

/* Bytes of one element. Always inlined: the kernels branch on it with
   constant kinds, and must see those branches fold. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline ptrdiff_t rms_kind_size(rms_kind kind)
{
    return kind == RMS_KIND_F64 ? 8 : kind == RMS_KIND_F32 ? 4 : 2;
}

typedef struct {
    rms_kind x, weight, eps;
} rms_type_kinds;

#define RMS_TYPE_KINDS(name, x, weight)                                                    \
    [RMS_##name] = {RMS_KIND_##x, RMS_KIND_##weight,                                       \
                    RMS_KIND_##x == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32},
static const rms_type_kinds rms_type_table[RMS_NUM_TYPES] = {RMS_FOR_EACH_TYPE(RMS_TYPE_KINDS)};
#undef RMS_TYPE_KINDS

#endif
