/*
 * The vocabulary entries that every instruction set builds the same way
 * from its primitives: what each storage kind means for a load or a store,
 * and the exact two-sum and the sums built on it, written once. Each
 * vec_*.h includes this file last, after its primitives (vec_baseline.h
 * lists which entries are which).
 *
 * Two flags leave entries out. Where a vocabulary's instructions do
 * rms_vd_load_widened better than its primitives can, it defines that
 * entry itself and RMS_HAVE_LOAD_WIDENED to 1. The partial-block entries
 * exist only where RMS_HAVE_MASKED is 1, with the masked primitives.
 */
#ifndef RMSNORM_KERNELS_SIMD_VEC_DERIVED_H
#define RMSNORM_KERNELS_SIMD_VEC_DERIVED_H

#include <stddef.h>

#include "../types.h"
#include "common.h"

/* v, which the code after it reads from a register. gcc's generic tuning
   otherwise folds v's load into every instruction that reads it, and on
   Intel cores an indexed memory operand of a three-operand instruction
   costs two micro-ops. The empty asm takes v in a vector register ("v":
   any of them, on x86) and gives it back; a double of the portable
   vocabulary needs nothing. */
RMS_ALWAYS_INLINE rms_vd rms_vd_in_register(rms_vd v)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && RMS_VD_WIDTH > 1
    __asm__("" : "+v"(v));
#endif
    return v;
}

/* RMS_VF_WIDTH floats to float16 or bfloat16 patterns, each rounded once
   to nearest, ties to even. */
RMS_ALWAYS_INLINE rms_vh rms_vf_narrow16(rms_kind kind, rms_vf v)
{
    return kind == RMS_KIND_F16 ? rms_vf_to_float16(v) : rms_vf_to_bfloat16(v);
}

/* Loads RMS_VF_WIDTH elements of a 32- or 16-bit kind, widened to float
   (exact). */
RMS_ALWAYS_INLINE rms_vf rms_vf_load(rms_kind kind, const char *p)
{
    if (kind == RMS_KIND_F32) {
        return rms_vf_load_f32(p);
    }
    return rms_vh_widen(kind, rms_vh_load(p));
}

/* Stores RMS_VF_WIDTH floats narrowed to a 32- or 16-bit kind, each
   rounded once to nearest, ties to even. With stream, p is vector-aligned
   and the stores bypass the cache where RMS_HAVE_STREAM. */
RMS_ALWAYS_INLINE void rms_vf_store(rms_kind kind, char *p, rms_vf v, int stream)
{
    if (kind != RMS_KIND_F32) {
        rms_vh_store(p, rms_vf_narrow16(kind, v), stream);
    }
    else {
        rms_vf_store_f32(p, v, stream);
    }
}

/* s + err == a + b exactly, lane by lane: Knuth's two-sum (dd_math.h's
   rms_two_sum) a vector at a time. */
RMS_ALWAYS_INLINE rms_vd rms_vd_two_sum(rms_vd a, rms_vd b, rms_vd *err)
{
    const rms_vd s = rms_vd_add(a, b);
    const rms_vd b_virtual = rms_vd_sub(s, a);
    *err = rms_vd_add(rms_vd_sub(a, rms_vd_sub(s, b_virtual)), rms_vd_sub(b, b_virtual));
    return s;
}

/* The same in float: exact where s is finite. */
RMS_ALWAYS_INLINE rms_vf rms_vf_two_sum(rms_vf a, rms_vf b, rms_vf *err)
{
    const rms_vf s = rms_vf_add(a, b);
    const rms_vf b_virtual = rms_vf_sub(s, a);
    *err = rms_vf_add(rms_vf_sub(a, rms_vf_sub(s, b_virtual)), rms_vf_sub(b, b_virtual));
    return s;
}

/* Adds a * b to one accumulator: plain where the product is exact in
   double (float operands) and no compensation is asked for; else with the
   sum's rounding error in comp, and the product's own error too where it
   may have one (a float64 operand). */
RMS_ALWAYS_INLINE void rms_vd_accumulate(int compensated, int product_exact, rms_vd *sum,
                                         rms_vd *comp, rms_vd a, rms_vd b)
{
    if (!compensated) {
        *sum = rms_vd_muladd(a, b, *sum); /* the product is exact: fused or not, one rounding */
        return;
    }
    const rms_vd p = rms_vd_mul(a, b);
    rms_vd s_err;
    *sum = rms_vd_two_sum(*sum, p, &s_err);
    *comp = product_exact ? rms_vd_add(*comp, s_err)
                          : rms_vd_add(*comp, rms_vd_add(s_err, rms_vd_product_error(a, b, p)));
}

#if !RMS_HAVE_LOAD_WIDENED
/* RMS_VF_WIDTH elements of a 32- or 16-bit kind, widened to double
   (exact), in parts as rms_vd_widen gives them: through floats. */
RMS_ALWAYS_INLINE void rms_vd_load_widened(rms_kind kind, const char *p, rms_vd *parts)
{
    const rms_vf floats = rms_vf_load(kind, p);
    for (int part = 0; part < RMS_VF_WIDTH / RMS_VD_WIDTH; part++) {
        parts[part] = rms_vd_widen(floats, part);
    }
}
#endif

#if RMS_HAVE_MASKED
/* The first count elements of a block, 0 < count < RMS_VF_WIDTH, as
   rms_vf_load and rms_vf_store move a whole one: zero from lane count on,
   and the elements past count never touched in memory. */
RMS_ALWAYS_INLINE rms_vf rms_vf_load_first(rms_kind kind, const char *p, ptrdiff_t count)
{
    if (kind == RMS_KIND_F32) {
        return rms_vf_load_first_f32(p, count);
    }
    return rms_vh_widen(kind, rms_vh_load_first(p, count));
}

RMS_ALWAYS_INLINE void rms_vf_store_first(rms_kind kind, char *p, rms_vf v, ptrdiff_t count)
{
    if (kind != RMS_KIND_F32) {
        rms_vh_store_first(p, rms_vf_narrow16(kind, v), count);
    }
    else {
        rms_vf_store_first_f32(p, v, count);
    }
}
#endif

#endif
