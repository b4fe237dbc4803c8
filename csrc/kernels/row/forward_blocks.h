/*
 * The forward's block writers, each with why its result is the exact y =
 * x * w * inv_rms rounded once: in float for float32, the fast 16-bit way,
 * and in double for every kind, the last also out of line for the blocks
 * the others are unsure of. Part of the row kernels (row_kernels.h).
 */
#ifndef RMSNORM_KERNELS_ROW_FORWARD_BLOCKS_H
#define RMSNORM_KERNELS_ROW_FORWARD_BLOCKS_H

/* The blocks of a row, by their first element, whose double write the
   sum's error left undecided: rms_forward_row_exactly writes them again
   from an exact sum, or the whole row where there are more than
   RMS_UNSURE_BLOCKS. */
#define RMS_UNSURE_BLOCKS 8
typedef struct {
    ptrdiff_t at[RMS_UNSURE_BLOCKS];
    int count;
} rms_unsure_blocks;

/* inv_rms in each form that a row's write pass uses, and how far it may be
   from the exact sum's (rms_sum_error). */
typedef struct {
    rms_dd dd;           /* the double path's: hi + lo */
    rms_vf hi, lo;       /* the float path's: hi, inv_rms rounded to float, and the rest */
    rms_vf float_error;  /* the float path's bound on its error, relative to |y| */
    rms_vf below, above; /* float16's fast path's: a little below and above inv_rms */
    rms_vd bracket_below, bracket_above; /* the offset path's: 1 -/+ its margin */
    rms_vf offset; /* the offset as floats, where the blocks add it to the weight
                      (RMS_WRITE_OFFSET32_IN_BLOCKS): once a row, as a loop's
                      broadcast of it was not always taken out of the loop */
    int product_error;   /* the fast path's, rms_fast16_product_error */
    double sum_error;    /* rms_sum_error, or 0 where the sum is exact */
    int near_range_edge; /* whether a float64 block's write may go near underflow, or
                            near overflow without fused multiply-adds */
    rms_unsure_blocks *unsure; /* the double path's, where sum_error leaves a block undecided */
} rms_inv_forms;

/* How a row's blocks are written: each in double, inlined or out of line
   (rows with a weight offset, which takes offset + weight as hi + lo
   doubles, and rows whose inv_rms is infinite), each in float, each the
   fast way for float32 with an offset, from offset + weight made for the
   call or made in each block (rms_offset_in_floats), or each the fast
   16-bit way; the fast ones where they are sure to be exact, else in
   double. */
typedef enum {
    RMS_WRITE_DOUBLE,
    RMS_WRITE_DOUBLE_OUT_OF_LINE,
    RMS_WRITE_FLOAT,
    RMS_WRITE_OFFSET32,
    RMS_WRITE_OFFSET32_IN_BLOCKS,
    RMS_WRITE_FAST16
} rms_write_mode;

/* Whether the type has the fast 16-bit write: float16 or bfloat16 x, with
   any weight, which it takes as floats. Every instruction set's kernels
   have it, the portable ones too: it needs plain float products only
   (there, it makes the 16-bit forward two to four times faster than the
   double path). */
RMS_ALWAYS_INLINE int rms_has_fast16(rms_kind xk) { return rms_kind_size(xk) == 2; }

/* How far the fast 16-bit write's product x * w may be from exact, in
   units of 2^-24 relative: 0 where x and w are both 16-bit (11 + 11 or
   8 + 8 significant bits fit a float), 1 where w is a float rounded once
   to nearest (a float32 weight, or offset + weight). */
RMS_ALWAYS_INLINE int rms_fast16_product_error(rms_kind xk, rms_kind wk, int with_offset)
{
    return wk == xk && !with_offset ? 0 : 1;
}

/* The largest float not above v, and the smallest not below: v positive,
   and inside float's normal range. */
static inline float rms_float_at_most(double v)
{
    const float f = (float)v;
    return (double)f > v ? rms_bits_float(rms_float_bits(f) - 1) : f;
}

static inline float rms_float_at_least(double v)
{
    const float f = (float)v;
    return (double)f < v ? rms_bits_float(rms_float_bits(f) + 1) : f;
}

/* The forms of inv_rms, which is within sum_error of the exact sum's
   (relative); unsure is where the double path notes the blocks for which
   that was not enough. */
RMS_ALWAYS_INLINE rms_inv_forms rms_inv_forms_of(rms_kind xk, rms_kind wk, int with_offset,
                                                 double offset, rms_dd inv_rms, double sum_error,
                                                 int near_range_edge, rms_unsure_blocks *unsure,
                                                 rms_write_mode mode)
{
    rms_inv_forms forms;
    forms.product_error = rms_fast16_product_error(xk, wk, with_offset);
    forms.dd = inv_rms;
    forms.sum_error = sum_error;
    forms.near_range_edge = near_range_edge;
    forms.unsure = unsure;
    const float hi = (float)inv_rms.hi;
    forms.hi = rms_vf_set(hi);
    forms.lo = rms_vf_set((float)((inv_rms.hi - (double)hi) + inv_rms.lo));
    /* rms_forward_block_float says why 2^-44, or 2^-43 with an offset;
       twice sum_error outweighs the rounding of the sum to float */
    forms.float_error = rms_vf_set((float)((with_offset ? 0x1p-43 : 0x1p-44) + 2.0 * sum_error));
    /* rms_forward_block_fast16 says why this margin */
    const double margin = 0x1p-23 * (1 + forms.product_error) + 2.0 * sum_error;
    const int fast = mode == RMS_WRITE_FAST16;
    forms.below = rms_vf_set(fast ? rms_float_at_most(inv_rms.hi * (1.0 - margin)) : 0.0f);
    forms.above = rms_vf_set(fast ? rms_float_at_least(inv_rms.hi * (1.0 + margin)) : 0.0f);
    /* rms_forward_block_offset32 says why this margin */
    const double bracket = mode == RMS_WRITE_OFFSET32
                               ? 0x1p-48 + sum_error + fabs(inv_rms.lo / inv_rms.hi)
                               : 0.0;
    forms.bracket_below = rms_vd_set(1.0 - bracket);
    forms.bracket_above = rms_vd_set(1.0 + bracket);
    forms.offset = rms_vf_set(mode == RMS_WRITE_OFFSET32_IN_BLOCKS ? (float)offset : 0.0f);
    return forms;
}

/*
 * y = x * inv_rms * weight for one block of float32, rounded once, from
 * the block's x and weight as floats, xv and wv; returns 0, having written
 * nothing, where it cannot be sure of that, and the caller writes the
 * block in double.
 *
 * Converting every element to double and back costs more than the
 * arithmetic, so where fused multiply-adds exist the block is worked in
 * float, with inv_rms split into two floats hi + lo (rms_write_mode_of says
 * for which rows): u = x * inv_rms as u_hi + u_lo, and S = u_hi * w + u_lo *
 * w with one rounding. S is not exact: lo, u_lo and u_lo * w are each
 * rounded once in float, which puts S within 3 * 2^-48 |y| of x * w *
 * inv_rms, plus 2^-149 (1 + |w|) where a term is subnormal; inv_rms is
 * within sum_error of the exact sum's. So S - e and S + e, with e = (2^-44 +
 * 2 sum_error) |u_hi w| + 2^-126 (1 + |w|), bracket the exact y, and
 * rounding to nearest is monotone: where both round to the same float, so
 * does y, and that float is written. They differ within e of a midpoint
 * (about 1 lane in 2^19 of ordinary data, every lane of results below
 * about 2^-100), and where a lane is infinite or NaN (an infinite weight,
 * an overflow).
 *
 * With a weight offset, the factor offset + weight is two floats w + w_lo
 * (rms_offset_weight), within 2^-48 (1 + 2^-20) of it, and S = u_hi * w +
 * (u_hi * w_lo + u_lo * w), the low part rounded twice, leaves u_lo * w_lo
 * out. Counted in units of 2^-48 |y|, and each to a factor 1 + 2^-20: lo
 * 1, u_lo 2, the split of the factor 1, u_lo * w_lo 2, u_lo * w 2, the
 * low part 3 (it is under 3 * 2^-24 |y|), and e -/+ low 3, 14 in all; e
 * takes 2^-43, twice the plain path's, so that the bracket holds with
 * room to spare. The terms that may be subnormal are five, each within
 * 2^-150 (1 + |w|): 2^-126 (1 + |w|) outweighs them as it does here.
 *
 * Where x or w is 0, e is 0 and S - e keeps the zero's sign: written
 * below, y = 0 carries sign(x) * sign(w), as x * inv_rms * w does in torch.
 */
RMS_ALWAYS_INLINE int rms_forward_block_float(rms_kind xk, rms_vf xv, rms_vf wv,
                                              const rms_vf *w_lo, char *y, ptrdiff_t ys,
                                              ptrdiff_t count, const rms_inv_forms *inv,
                                              int stream)
{
    const rms_vf u_hi = rms_vf_mul(xv, inv->hi);
    const rms_vf u_lo = rms_vf_fma(xv, inv->lo, rms_vf_product_error(xv, inv->hi, u_hi));
    rms_vf low = rms_vf_mul(u_lo, wv);
    if (w_lo != NULL) {
        low = rms_vf_fma(u_hi, *w_lo, low);
    }
    const rms_vf subnormal_error = rms_vf_where_both_nonzero(
        rms_vf_fma(rms_vf_abs(wv), rms_vf_set(0x1p-126f), rms_vf_set(0x1p-126f)), xv, wv);
    const rms_vf e = rms_vf_fma(rms_vf_abs(rms_vf_mul(u_hi, wv)), inv->float_error,
                                subnormal_error);
    /* -(e - low), not low - e: -0 where both are 0 */
    const rms_vf below = rms_vf_fma(u_hi, wv, rms_vf_sub(rms_vf_set(-0.0f), rms_vf_sub(e, low)));
    const rms_vf above = rms_vf_fma(u_hi, wv, rms_vf_add(low, e));
    if (!rms_vf_equal(below, above)) {
        return 0;
    }
    rms_store_floats(xk, y, ys, count, below, stream);
    return 1;
}

/* offset + weight for one block of the float32 weight, where the offset is
   a float: floats hi, returned, and *lo, whose sum is exactly it. */
RMS_ALWAYS_INLINE rms_vf rms_offset_weight_floats_block(const char *w, ptrdiff_t ws,
                                                        ptrdiff_t count, rms_vf offset,
                                                        rms_vf *lo)
{
    return rms_vf_two_sum(offset, rms_load_floats(RMS_KIND_F32, w, ws, count), lo);
}

/*
 * y = x * inv_rms * (offset + weight) for one block of float32 with a
 * weight offset, rounded once, without fused multiply-adds (with them,
 * rms_forward_block_float takes these rows); returns 0, having written
 * nothing, where it cannot be sure of that, and the caller writes the
 * block in double from offset + weight as hi + lo
 * (rms_forward_block_double).
 *
 * v = (x * inv_rms.hi) * hi, two products in double, rounds twice and
 * leaves out lo (under 2^-53 |hi|: hi is offset + weight rounded to
 * double, lo the rest), so v is within 3 * 2^-53 (1 + 2^-50) |v| of
 * x * inv_rms.hi * (offset + weight); inv_rms.hi is within |inv_rms.lo /
 * inv_rms.hi| of inv_rms, and inv_rms within sum_error of the exact sum's.
 * v (1 - m) and v (1 + m), with m = 2^-48 + sum_error + |inv_rms.lo /
 * inv_rms.hi| (their products and 1 -/+ m rounded: 2^-52 more), then
 * bracket y, with room to spare for the products of those errors, and
 * rounding to nearest is monotone: where both round to
 * the same float, so does y, and that float is written. They differ near a
 * midpoint (about 1 lane in 2^22 of ordinary data, more with a sum_error).
 * That holds where x * inv_rms.hi is a normal double, as inv_rms in
 * [2^-100, 2^100] (rms_write_mode_of) makes it for every finite float x;
 * where v underflows instead, |y| < 2^-1000 and y, v and the bracket all
 * round to a zero of the sign of x * hi. Where a lane is infinite or NaN
 * (an infinite hi, an overflow), the two floats' difference is NaN and the
 * block goes in double, as it did before this path.
 *
 * Without fused multiply-adds, each product's error costs Dekker's split,
 * which the double write takes twice here: the portable float32 forward
 * with an offset took half as long again as without. Written this way, and
 * with no exact sum to make first, it takes a quarter of the time of the
 * forward without an offset, which is still written in double.
 */
RMS_ALWAYS_INLINE int rms_forward_block_offset32(rms_kind xk, const char *x, ptrdiff_t xs,
                                                 const double *w_hi, char *y, ptrdiff_t ys,
                                                 ptrdiff_t count, const rms_inv_forms *inv,
                                                 int stream)
{
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(RMS_KIND_F64, (const char *)w_hi, 8, count);
    const rms_vd inv_hi = rms_vd_set(inv->dd.hi);
    rms_vd down[RMS_VD_PER_VF], up[RMS_VD_PER_VF];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd v = rms_vd_mul(rms_vd_mul(xv.part[h], inv_hi), wv.part[h]);
        down[h] = rms_vd_mul(v, inv->bracket_below);
        up[h] = rms_vd_mul(v, inv->bracket_above);
    }
    const rms_vf low = rms_vf_narrow(down), high = rms_vf_narrow(up);
    /* 0 where equal and finite; NaN where infinite or NaN */
    if (!rms_vf_equal(rms_vf_sub(high, low), rms_vf_set(0.0f))) {
        return 0;
    }
    rms_store_floats(xk, y, ys, count, low, stream);
    return 1;
}

/* Whether every lane of v, moved by margin (relative) either way, rounds
   to the same value of kind, a 32- or 16-bit kind: then so does every
   value in between, since rounding to nearest is monotone. Alike means the
   same bits: a NaN is alike itself. */
RMS_ALWAYS_INLINE int rms_rounds_alike(rms_kind kind, const rms_block *v, double margin)
{
    rms_vd down[RMS_VD_PER_VF], up[RMS_VD_PER_VF];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        down[h] = rms_vd_mul(v->part[h], rms_vd_set(1.0 - margin));
        up[h] = rms_vd_mul(v->part[h], rms_vd_set(1.0 + margin));
    }
    if (kind == RMS_KIND_F32) {
        return rms_vf_same(rms_vf_narrow(down), rms_vf_narrow(up));
    }
    return rms_vh_equal(rms_vf_narrow16(kind, rms_vf_narrow_round_to_odd(down)),
                        rms_vf_narrow16(kind, rms_vf_narrow_round_to_odd(up)));
}

/*
 * y = x * (w_hi + w_lo) * inv * 2^exponent for one float64 element, x and
 * w_hi finite and nonzero, inv in [0.5, 1): rounded once, however far y is
 * from 1. The significands of x and w are multiplied in double-double, and
 * that by inv, their exponents and the scale summed apart, and the result
 * rounded once at the end (rms_dd_ldexp), to the subnormal grid where it
 * lies below the normal range: no step overflows, underflows, or rounds
 * before that one.
 */
static inline double rms_forward_element_scaled(double x, double w_hi, double w_lo, rms_dd inv,
                                                int exponent)
{
    int x_exponent, w_exponent;
    const double x_sig = frexp(x, &x_exponent), w_sig = frexp(w_hi, &w_exponent);
    const double w_lo_sig = ldexp(w_lo, -w_exponent);
    /* a = x_sig * (w_sig + w_lo_sig), then a * inv, each as hi + lo */
    const double a_hi = x_sig * w_sig;
    const double w_lo_part = x_sig * w_lo_sig;
    double a_lost;
    const double a_lo = rms_two_sum(fma(x_sig, w_sig, -a_hi), w_lo_part, &a_lost);
    /* what a_lo leaves out, w_lo's last bits: only its sign counts, at a tie */
    const double lost = (a_lost + fma(x_sig, w_lo_sig, -w_lo_part)) * inv.hi;
    const double b_hi = a_hi * inv.hi;
    const double b_lo = fma(a_hi, inv.hi, -b_hi) + (a_hi * inv.lo + a_lo * inv.hi);
    double err;
    const double sum = rms_tie_broken(rms_two_sum(b_hi, b_lo, &err), &err, lost);
    return rms_dd_ldexp(sum, err != 0.0 ? err : lost, x_exponent + w_exponent + exponent);
}

/* Where a float64 block's x * inv_rms or y falls below this, its double
   write may not round y once: the error of x * inv_rms, or of the low
   part of y, is then lost to underflow (up to 2^-1075 each), or y itself
   is rounded to the subnormal grid from an inexact sum. Above it, those
   errors stay below 2^-170 of y, like the write's own, and every product
   error is exact: an exact product of two doubles has at most 106
   significant bits, so its lowest is above 2^-1007. */
#define RMS_NEAR_UNDERFLOW 0x1p-900

/*
 * The float64 elements of a block whose double write went near underflow
 * (RMS_NEAR_UNDERFLOW), or, without fused multiply-adds, past DBL_MAX,
 * written again into y one at a time by rms_forward_element_scaled, which
 * rounds them once; out of line, as only rows with tiny or huge elements
 * or weights get here. Only finite nonzero x and w are, in rows whose
 * inv_rms is positive and finite: zeros, infinities and NaNs are as the
 * block wrote them.
 */
RMS_NOINLINE void rms_forward_block_scaled(rms_kind wk, const char *x, ptrdiff_t xs,
                                           const char *w, ptrdiff_t ws, const double *w_lo,
                                           ptrdiff_t count, rms_dd inv_rms, rms_block *y)
{
    if (!(inv_rms.hi > 0.0) || isinf(inv_rms.hi)) {
        return;
    }
    double values[RMS_VF_WIDTH];
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        rms_vd_store((char *)(values + h * RMS_VD_WIDTH), y->part[h], 0);
    }
    int inv_exponent;
    rms_dd inv;
    inv.hi = frexp(inv_rms.hi, &inv_exponent);
    inv.lo = ldexp(inv_rms.lo, -inv_exponent);
    for (ptrdiff_t i = 0; i < count; i++) {
        const double xi = rms_load_scalar(RMS_KIND_F64, rms_element(x, i, xs));
        const double wi = rms_load_scalar(wk, rms_element(w, i, ws));
        if (isfinite(xi) && isfinite(wi) && xi != 0.0 && wi != 0.0) {
            values[i] = rms_forward_element_scaled(xi, wi, w_lo != NULL ? w_lo[i] : 0.0, inv,
                                                   inv_exponent);
        }
    }
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        y->part[h] = rms_vd_load((const char *)(values + h * RMS_VD_WIDTH));
    }
}

/* x * w * (inv_hi + inv_lo) as hi + *err, for x and w of kinds whose
   product is exact in double. */
RMS_ALWAYS_INLINE rms_vd rms_vd_float_product_times(rms_vd x, rms_vd w, rms_vd inv_hi,
                                                   rms_vd inv_lo, rms_vd *err)
{
    const rms_vd xw = rms_vd_mul(x, w); /* exact */
    const rms_vd p = rms_vd_mul(xw, inv_hi);
    const rms_vd tail =
        rms_vd_zero_where_inf(rms_vd_muladd(xw, inv_lo, rms_vd_product_error(xw, inv_hi, p)), w);
    /* tail may pass half an ulp of p: renormalised, as round to odd needs,
       by a fast two-sum that keeps p's sign where both are zeros */
    const rms_vd hi = rms_vd_sub(p, rms_vd_sub(rms_vd_set(0.0), tail));
    *err = rms_vd_zero_where_inf(rms_vd_sub(tail, rms_vd_sub(hi, p)), hi);
    return hi;
}

/* u_hi * w + low as hi + *err, with the product's exact error: the double
   write where there are no fused multiply-adds, and float32's from a
   float64 weight. Where u_hi * w overflowed (an infinite w, or a y near or
   past double's range: a float64 weight), its error is no number, and the
   product is y or, for float64, written again (rms_forward_block_double). */
RMS_ALWAYS_INLINE rms_vd rms_vd_product_plus(rms_vd u_hi, rms_vd w, rms_vd low, rms_vd *err)
{
    const rms_vd p = rms_vd_mul(u_hi, w);
    const rms_vd tail =
        rms_vd_add(rms_vd_zero_where_inf(rms_vd_product_error(u_hi, w, p), p), low);
    /* p - (0 - tail) is p + tail, but keeps p's sign where both are zeros
       (x = 0 with a negative w gives -0, as in torch) */
    const rms_vd hi = rms_vd_sub(p, rms_vd_sub(rms_vd_set(0.0), tail));
    *err = rms_vd_sub(tail, rms_vd_sub(hi, p));
    return hi;
}

/* Whether a lane of v where a and b are both nonzero is infinite: without
   fused multiply-adds, u_hi * w may round past DBL_MAX where y, a hair
   less, does not. */
RMS_ALWAYS_INLINE int rms_any_infinite_where_both_nonzero(rms_vd v, rms_vd a, rms_vd b)
{
    const rms_vd finite = rms_vd_zero_where_inf(rms_vd_set(1.0), v); /* 0 where v is inf */
    return rms_vd_any_below_where_both_nonzero(finite, finite, rms_vd_set(0.5), a, b);
}

/* The same in double, for every type: exact products where x and w are
   floats, and a compensated product where either is a double: for a
   float64 y, u_hi * w + low in one fused multiply-add where there is one;
   otherwise hi + err with the product's exact error, rounded once from
   there.
   That rounds x * w * inv_rms once. Where inv_rms is within sum_error of
   the exact sum's, not exact, the block's rounding is checked against
   that: where y moved by sum_error, and by 2^-50 for hi's own error and
   the check's roundings, may round otherwise, the block is written as it
   is and 0 returned, for it to be written again from an exact sum
   (rms_forward_row_exactly); else 1.
   w_lo, where not NULL, holds the part of the weight that w (doubles)
   leaves out: offset + weight is w + w_lo exactly. With check_range_edge
   (float64 rows that may go near underflow, or near overflow without fused
   multiply-adds: rms_forward_row_plan), a block with a lane of x * inv_rms
   or y below RMS_NEAR_UNDERFLOW, or there a y that came out infinite, is
   written again by rms_forward_block_scaled. */
RMS_ALWAYS_INLINE int rms_forward_block_double(rms_kind xk, rms_kind wk, const char *x,
                                               ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                               const double *w_lo, char *y, ptrdiff_t ys,
                                               ptrdiff_t count, rms_dd inv_rms, double sum_error,
                                               int check_range_edge, int stream)
{
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(wk, w, ws, count);
    rms_block w_lo_v;
    if (w_lo != NULL) {
        w_lo_v = rms_load_doubles(RMS_KIND_F64, (const char *)w_lo, 8, count);
    }
    const rms_vd inv_hi = rms_vd_set(inv_rms.hi), inv_lo = rms_vd_set(inv_rms.lo);
    rms_block hi, err;
    int rewrite = 0; /* where check_range_edge: rms_forward_block_scaled */
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        const rms_vd xh = rms_vd_in_register(xv.part[h]), wh = rms_vd_in_register(wv.part[h]);
        if (rms_kind_is_float_exact(xk) && rms_kind_is_float_exact(wk) && w_lo == NULL) {
            hi.part[h] = rms_vd_float_product_times(xh, wh, inv_hi, inv_lo, &err.part[h]);
            continue;
        }
        const rms_vd u_hi = rms_vd_mul(xh, inv_hi);
        const rms_vd u_lo =
            rms_vd_add(rms_vd_product_error(xh, inv_hi, u_hi), rms_vd_mul(xh, inv_lo));
        const rms_vd low = rms_vd_zero_where_inf(
            w_lo != NULL ? rms_vd_muladd(u_hi, w_lo_v.part[h], rms_vd_mul(u_lo, wh))
                         : rms_vd_mul(u_lo, wh),
            wh);
        if (xk == RMS_KIND_F64 && RMS_HAVE_FMA) {
            /* The output's one rounding. low's zeros go in as -0, which
               adds nothing: a +0 would turn the product's -0 (x = -1,
               w = 0) into +0, where torch keeps -0. */
            const rms_vd low_or_minus_zero =
                rms_vd_sub(rms_vd_set(-0.0), rms_vd_sub(rms_vd_set(0.0), low));
            hi.part[h] = rms_vd_muladd(u_hi, wh, low_or_minus_zero);
            err.part[h] = rms_vd_set(0.0);
        }
        else {
            hi.part[h] = rms_vd_product_plus(u_hi, wh, low, &err.part[h]);
        }
        if (xk == RMS_KIND_F64 && check_range_edge) {
            rewrite |= rms_vd_any_below_where_both_nonzero(
                u_hi, hi.part[h], rms_vd_set(RMS_NEAR_UNDERFLOW), xh, wh);
        }
        if (xk == RMS_KIND_F64 && check_range_edge && !RMS_HAVE_FMA) {
            rewrite |= rms_any_infinite_where_both_nonzero(hi.part[h], xh, wh);
        }
    }
    if (xk == RMS_KIND_F64 && check_range_edge && rewrite) {
        rms_forward_block_scaled(wk, x, xs, w, ws, w_lo, count, inv_rms, &hi);
    }
    const int sure = !rms_kind_is_float_exact(xk) || sum_error == 0.0 ||
                     rms_rounds_alike(xk, &hi, sum_error + 0x1p-50);
    rms_store_rounded(xk, y, ys, count, &hi, &err, stream);
    return sure;
}

/* y = x * w * inv_rms for a block of a row whose inv_rms is infinite
   (mean(x^2) + eps is exactly 0, eps negative, or an all-subnormal float64
   row with eps = 0, whose 1 / rms passes DBL_MAX): inf of the sign of x * w,
   or NaN where x or w is 0, as torch has it; nothing to round. With a
   weight offset, w is its hi part, which has the exact sum's sign. */
RMS_ALWAYS_INLINE void rms_forward_block_unbounded(rms_kind xk, rms_kind wk, const char *x,
                                                   ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                                   char *y, ptrdiff_t ys, ptrdiff_t count,
                                                   double inv_rms, int stream)
{
    const rms_block xv = rms_load_doubles(xk, x, xs, count);
    const rms_block wv = rms_load_doubles(wk, w, ws, count);
    rms_block out;
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        /* torch's order: (x * inv_rms) * w, where x * w may underflow to 0 */
        out.part[h] = rms_vd_mul(rms_vd_mul(xv.part[h], rms_vd_set(inv_rms)), wv.part[h]);
    }
    rms_store_narrowed(xk, y, ys, count, &out, stream);
}

/* rms_forward_block_double out of line: one copy for each type and for
   each kind of x with an offset, for the blocks that take it rarely (a
   fast write's unsure ones) or off the beaten path (a weight offset's).
   The write loops then inline only their common case: inlined everywhere,
   it tripled the kernels' compile time. (One copy for all kinds, switching
   on them at run time, made the unsure blocks a twentieth of the 16-bit
   forward.) */
typedef int (*rms_block_double_fn)(const char *x, ptrdiff_t xs, const char *w, ptrdiff_t ws,
                                   const double *w_lo, char *y, ptrdiff_t ys, ptrdiff_t count,
                                   rms_dd inv_rms, double sum_error, int check_range_edge,
                                   int stream);
#define RMS_BLOCK_DOUBLE_OF(name, x_kind, w_kind)                                              \
    RMS_NOINLINE int rms_forward_block_double_##name(                                          \
        const char *x, ptrdiff_t xs, const char *w, ptrdiff_t ws, const double *w_lo, char *y, \
        ptrdiff_t ys, ptrdiff_t count, rms_dd inv_rms, double sum_error, int check_range_edge, \
        int stream)                                                                            \
    {                                                                                          \
        if (isinf(inv_rms.hi)) {                                                               \
            rms_forward_block_unbounded(RMS_KIND_##x_kind, RMS_KIND_##w_kind, x, xs, w, ws, y, \
                                        ys, count, inv_rms.hi, stream);                        \
            return 1;                                                                          \
        }                                                                                      \
        return rms_forward_block_double(RMS_KIND_##x_kind, RMS_KIND_##w_kind, x, xs, w, ws,    \
                                        w_lo, y, ys, count, inv_rms, sum_error,                \
                                        check_range_edge, stream);                             \
    }
/* One for each type (types.h), and for each kind of x with an offset,
   whose weight is offset + weight as doubles: float32's and float64's
   are their types with a float64 weight. */
RMS_FOR_EACH_TYPE(RMS_BLOCK_DOUBLE_OF)
RMS_BLOCK_DOUBLE_OF(F16_OFFSET, F16, F64)
RMS_BLOCK_DOUBLE_OF(BF16_OFFSET, BF16, F64)
#define RMS_BLOCK_DOUBLE_ENTRY(name, x, weight)                                                \
    [RMS_KIND_##x][RMS_KIND_##weight] = rms_forward_block_double_##name,
/* By x's kind, then the weight's; indexed by constants, a direct call. */
static const rms_block_double_fn rms_forward_block_double_out_of_line[4][4] = {
    RMS_FOR_EACH_TYPE(RMS_BLOCK_DOUBLE_ENTRY)};
static const rms_block_double_fn rms_forward_block_double_offset[4] = {
    [RMS_KIND_F32] = rms_forward_block_double_FLOAT32_WEIGHT64,
    [RMS_KIND_F64] = rms_forward_block_double_FLOAT64,
    [RMS_KIND_F16] = rms_forward_block_double_F16_OFFSET,
    [RMS_KIND_BF16] = rms_forward_block_double_BF16_OFFSET,
};
#undef RMS_BLOCK_DOUBLE_ENTRY
#undef RMS_BLOCK_DOUBLE_OF

/*
 * Whether offset + weight is taken as two floats hi + lo whose sum is
 * exactly it, made by a float two-sum: for float32 x and weight where
 * fused multiply-adds make the float write, and an offset that is a float
 * (Gemma's 1). Made once for many rows (rms_offset_weight_floats), for
 * the call or for each thread that shares it, else in each block
 * (rms_forward_block); offset + weight as doubles is then
 * not made at all, and the rare blocks written in double make their own
 * (rms_forward_block_double_offset_of). Making the doubles too, 24
 * bytes an element, took as long as the write of a row of 4096. The macro
 * is the part that is a constant of the kernels (kernels.h,
 * offset_in_floats).
 */
#define RMS_OFFSET_IN_FLOATS(xk, wk)                                                           \
    (RMS_HAVE_FMA && (xk) == RMS_KIND_F32 && (wk) == RMS_KIND_F32)
RMS_ALWAYS_INLINE int rms_offset_in_floats(rms_kind xk, rms_kind wk, double offset)
{
    return RMS_OFFSET_IN_FLOATS(xk, wk) && rms_offset_is_float(offset);
}

/* offset + weight for one block, exactly, as doubles hi + lo: lo is what
   hi, the sum rounded to double, leaves out, and 0 where hi is infinite. */
RMS_ALWAYS_INLINE void rms_offset_weight_block(rms_kind wk, const char *w, ptrdiff_t ws,
                                               ptrdiff_t count, double offset, rms_block *hi,
                                               rms_block *lo)
{
    const rms_block wv = rms_load_doubles(wk, w, ws, count);
    RMS_UNROLL
    for (int h = 0; h < RMS_VD_PER_VF; h++) {
        rms_vd err;
        hi->part[h] = rms_vd_two_sum(rms_vd_set(offset), wv.part[h], &err);
        lo->part[h] = rms_vd_zero_where_inf(err, hi->part[h]);
    }
}

/*
 * y for one block of 16-bit x, the cheap way, where that is sure to round
 * as the exact y = x * w * inv_rms does (inv_rms the double-double hi +
 * lo); returns 0, having written nothing, where it is not sure, and the
 * caller writes the block in double. That is rare, about 1 lane in 2000
 * for float16 and 1 in 13000 for bfloat16 (a little more with a float32
 * weight): a lane within a few float ulps of a 16-bit rounding boundary, or
 * a bfloat16 product that is not a normal float. The float path, which
 * carries the product to twice float's precision and rounds it to odd,
 * costs three times the arithmetic.
 *
 * p = x * w is exact in float where w is 16-bit (11 + 11 or 8 + 8
 * significant bits), and within 2^-24 of x * w with a float32 weight or an
 * offset (w is then offset + weight rounded once to float), as
 * long as it is a normal float: a product of two float16 values always is,
 * other float16 ones need not be (below), bfloat16 ones are checked. From
 * it come two floats lo and hi with |lo| <= |y| <= |hi|, each rounded to 16
 * bits by a rounding that is monotone and goes no further than y's rounding
 * to nearest even would (down from lo, up from hi): where the two agree, y
 * rounds to the same 16 bits.
 *
 * float16: lo = p * below and hi = p * above, rounded to nearest, with below
 * <= inv_rms.hi (1 - m) and above >= inv_rms.hi (1 + m), m = 2^-23, or 2^-22
 * with a float32 weight. The margin outweighs the products' roundings
 * (2^-24 each) and inv_rms.lo (under 2^-50 inv_rms.hi), so |lo| < |y| < |hi|
 * where p is a normal float. Where it is not, |y| < 2^-26 (inv_rms is at
 * most 2^100 here): all three round to 0, or, past float's range, to inf.
 * Both are rounded to nearest even. Where inv_rms is within sum_error of
 * the exact sum's (rms_sum_error), m grows by twice that.
 *
 * bfloat16: one product, t = p * hi (inv_rms rounded to float). t is within
 * 1/2 ulp of p * hi, which is within 2^-24 (1 + 2^-26) |y| of y, one more
 * 2^-24 |y| with a float32 weight: 1.5 ulps and a hair (2.5), under 2 (3)
 * ulps of the smaller binade where t and y straddle a power of 2, and under
 * 1 ulp in float's subnormal range. So the floats k = 2 (3) below and above
 * t in bit pattern bracket y, and adding 0x7fff - k and 0x8000 + k to t's
 * bits rounds them to bfloat16 half down and half up, an add each (where
 * the magnitude's pattern is below k, to 0 by itself). Their half ulp of
 * slack, 2^-25 |y| at least, covers a sum_error up to RMS_SUM_ERROR_LIMIT.
 */
RMS_ALWAYS_INLINE int rms_forward_block_fast16(rms_kind xk, const char *x,
                                               ptrdiff_t xs, const float *w, char *y,
                                               ptrdiff_t ys, ptrdiff_t count,
                                               const rms_inv_forms *inv, int stream)
{
    const rms_vf xv = rms_load_floats(xk, x, xs, count);
    const rms_vf wv = rms_load_floats(RMS_KIND_F32, (const char *)w, 4, count);
    const rms_vf p = rms_vf_mul(xv, wv);
    rms_vh hi;
    int unsure;
    if (xk == RMS_KIND_F16) {
        hi = rms_vf_to_float16(rms_vf_mul(p, inv->above));
        unsure = !rms_vh_equal(rms_vf_to_float16(rms_vf_mul(p, inv->below)), hi);
    }
    else {
        const int k = 2 + inv->product_error;
        const rms_vf t = rms_vf_mul(p, inv->hi);
        hi = rms_vf_top16_biased(t, 0x8000 + k);
        /* | not ||: one branch on both tests */
        unsure = (!rms_vf_top16_agree(t, 0x7fff - k, 0x8000 + k)) | rms_vf_any_abnormal(p);
    }
    if (unsure) {
        return 0;
    }
    rms_store_halves(y, ys, count, hi, stream);
    return 1;
}

#endif
