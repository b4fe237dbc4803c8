/*
 * The element types the kernels serve: each pairs a storage kind for x (and
 * y, grad_output and grad_input) with one for the weight (and grad_weight).
 * eps is float64 for float64 input and float32 otherwise, as torch rounds it.
 *
 * This list is the one source of the dtype table: the kernel tables, the
 * NumPy glue's loops and, through the module, rmsnorm._dtypes are built
 * from it. Adding a pair is a row here (NumPy tries loops in this order, so
 * an input's own weight kind comes before a wider one).
 */
#ifndef RMSNORM_KERNELS_TYPES_H
#define RMSNORM_KERNELS_TYPES_H

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

typedef struct {
    rms_kind x, weight, eps;
} rms_type_kinds;

#define RMS_TYPE_KINDS(name, x, weight)                                                    \
    [RMS_##name] = {RMS_KIND_##x, RMS_KIND_##weight,                                       \
                    RMS_KIND_##x == RMS_KIND_F64 ? RMS_KIND_F64 : RMS_KIND_F32},
static const rms_type_kinds rms_type_table[RMS_NUM_TYPES] = {RMS_FOR_EACH_TYPE(RMS_TYPE_KINDS)};
#undef RMS_TYPE_KINDS

#endif
