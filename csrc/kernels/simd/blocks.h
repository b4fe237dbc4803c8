/*
 * The vocabulary's moves of elements and blocks, in any kind, stride and
 * count: a block is RMS_VF_WIDTH consecutive elements of a row, loaded as
 * floats or as doubles and stored back in any kind, whole and contiguous
 * in one vector move, partial (a row's head or tail) by a masked move or
 * a packed copy. Built on each instruction set's vocabulary, as
 * vec_derived.h is, and included by row_kernels.h before the kernels.
 */
#ifndef RMSNORM_KERNELS_SIMD_BLOCKS_H
#define RMSNORM_KERNELS_SIMD_BLOCKS_H

/* Every value of the kind is a float, so products of two are exact in
   double and a sum of them needs no compensation. */
RMS_ALWAYS_INLINE int rms_kind_is_float_exact(rms_kind kind) { return kind != RMS_KIND_F64; }

RMS_ALWAYS_INLINE const char *rms_element(const char *base, ptrdiff_t i, ptrdiff_t stride)
{
    return base + i * stride;
}

RMS_ALWAYS_INLINE char *rms_element_out(char *base, ptrdiff_t i, ptrdiff_t stride)
{
    return base + i * stride;
}

/* The doubles of a block: RMS_VF_WIDTH consecutive elements of a row. */
typedef struct {
    rms_vd part[RMS_VD_PER_VF];
} rms_block;

/* Copies count elements, stride bytes apart, into a zeroed packed block. */
RMS_ALWAYS_INLINE void rms_gather(rms_kind kind, char *packed, const char *p, ptrdiff_t stride,
                                  ptrdiff_t count)
{
    const size_t size = (size_t)rms_kind_size(kind);
    memset(packed, 0, RMS_VF_WIDTH * size);
    for (ptrdiff_t k = 0; k < count; k++) {
        memcpy(packed + (size_t)k * size, p + k * stride, size);
    }
}

RMS_ALWAYS_INLINE void rms_scatter(rms_kind kind, char *p, ptrdiff_t stride, const char *packed,
                                   ptrdiff_t count)
{
    const size_t size = (size_t)rms_kind_size(kind);
    for (ptrdiff_t k = 0; k < count; k++) {
        memcpy(p + k * stride, packed + (size_t)k * size, size);
    }
}

/* A block of a 32- or 16-bit kind as floats. A block that is not whole and
   contiguous (a row's head or tail, a strided row) goes through a packed
   copy, zero where count ends, so that every element meets the same
   arithmetic in the same lane. */
RMS_ALWAYS_INLINE rms_vf rms_load_floats(rms_kind kind, const char *p, ptrdiff_t stride,
                                         ptrdiff_t count)
{
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        return rms_vf_load(kind, p);
    }
#if RMS_HAVE_MASKED
    if (stride == rms_kind_size(kind)) {
        return rms_vf_load_first(kind, p, count);
    }
#endif
    /* room for any kind: without forced inlining the compiler cannot see
       that kind is never float64 here, and warns */
    char packed[RMS_VF_WIDTH * 8];
    rms_gather(kind, packed, p, stride, count);
    return rms_vf_load(kind, packed);
}

RMS_ALWAYS_INLINE rms_block rms_load_doubles(rms_kind kind, const char *p, ptrdiff_t stride,
                                             ptrdiff_t count)
{
    rms_block block;
    if (kind == RMS_KIND_F64) {
#if RMS_HAVE_MASKED
        if (stride == 8) {
            RMS_UNROLL
            for (int h = 0; h < RMS_VD_PER_VF; h++) {
                const ptrdiff_t left = count - h * RMS_VD_WIDTH;
                block.part[h] = rms_vd_set(0.0);
                if (left >= RMS_VD_WIDTH) {
                    block.part[h] = rms_vd_load(p + h * RMS_VD_WIDTH * 8);
                }
                else if (left > 0) {
                    block.part[h] = rms_vd_load_first(p + h * RMS_VD_WIDTH * 8, left);
                }
            }
            return block;
        }
#endif
        char packed[RMS_VF_WIDTH * 8];
        const char *src = p;
        if (stride != 8 || count != RMS_VF_WIDTH) {
            rms_gather(kind, packed, p, stride, count);
            src = packed;
        }
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            block.part[h] = rms_vd_load(src + h * RMS_VD_WIDTH * 8);
        }
        return block;
    }
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        rms_vd_load_widened(kind, p, block.part); /* the cheapest way each vocabulary has */
        return block;
    }
    const rms_vf floats = rms_load_floats(kind, p, stride, count);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        block.part[h] = rms_vd_widen(floats, h);
    }
    return block;
}

RMS_ALWAYS_INLINE void rms_store_floats(rms_kind kind, char *p, ptrdiff_t stride, ptrdiff_t count,
                                        rms_vf v, int stream)
{
    if (stride == rms_kind_size(kind) && count == RMS_VF_WIDTH) {
        rms_vf_store(kind, p, v, stream);
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == rms_kind_size(kind)) {
        rms_vf_store_first(kind, p, v, count);
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 4];
    rms_vf_store(kind, packed, v, 0);
    rms_scatter(kind, p, stride, packed, count);
}

RMS_ALWAYS_INLINE void rms_store_halves(char *p, ptrdiff_t stride, ptrdiff_t count, rms_vh v,
                                        int stream)
{
    if (stride == 2 && count == RMS_VF_WIDTH) {
        rms_vh_store(p, v, stream);
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == 2) {
        rms_vh_store_first(p, v, count);
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 2];
    rms_vh_store(packed, v, 0);
    rms_scatter(RMS_KIND_F16, p, stride, packed, count);
}

RMS_ALWAYS_INLINE void rms_store_doubles(char *p, ptrdiff_t stride, ptrdiff_t count,
                                         const rms_block *block, int stream)
{
    if (stride == 8 && count == RMS_VF_WIDTH) {
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            rms_vd_store(p + h * RMS_VD_WIDTH * 8, block->part[h], stream);
        }
        return;
    }
#if RMS_HAVE_MASKED
    if (stride == 8) {
        RMS_UNROLL
        for (int h = 0; h < RMS_VD_PER_VF; h++) {
            const ptrdiff_t left = count - h * RMS_VD_WIDTH;
            if (left >= RMS_VD_WIDTH) {
                rms_vd_store(p + h * RMS_VD_WIDTH * 8, block->part[h], 0);
            }
            else if (left > 0) {
                rms_vd_store_first(p + h * RMS_VD_WIDTH * 8, block->part[h], left);
            }
        }
        return;
    }
#endif
    char packed[RMS_VF_WIDTH * 8];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        rms_vd_store(packed + h * RMS_VD_WIDTH * 8, block->part[h], 0);
    }
    rms_scatter(RMS_KIND_F64, p, stride, packed, count);
}

/* Doubles stored in kind, each rounded once: to nearest for float, and for
   16 bits to odd in float first, which then rounds to nearest as the
   doubles would directly. */
RMS_ALWAYS_INLINE void rms_store_narrowed(rms_kind kind, char *p, ptrdiff_t stride,
                                          ptrdiff_t count, const rms_block *values, int stream)
{
    if (kind == RMS_KIND_F64) {
        rms_store_doubles(p, stride, count, values, stream);
    }
    else if (kind == RMS_KIND_F32) {
        rms_store_floats(kind, p, stride, count, rms_vf_narrow(values->part), stream);
    }
    else {
        rms_store_floats(kind, p, stride, count, rms_vf_narrow_round_to_odd(values->part), stream);
    }
}

/* hi + err (a double-double, err within half an ulp of hi) stored in kind,
   rounded once: through a double rounded to odd where kind is narrower. */
RMS_ALWAYS_INLINE void rms_store_rounded(rms_kind kind, char *p, ptrdiff_t stride, ptrdiff_t count,
                                         const rms_block *hi, const rms_block *err, int stream)
{
    if (kind == RMS_KIND_F64) {
        rms_store_doubles(p, stride, count, hi, stream);
        return;
    }
    rms_block odd;
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        odd.part[h] = rms_vd_round_to_odd(hi->part[h], err->part[h]);
    }
    rms_store_narrowed(kind, p, stride, count, &odd, stream);
}

#endif
