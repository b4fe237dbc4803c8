/*
 * The gufuncs: a descriptor table (name, signature, doc, loop) and one loop
 * per gufunc that unpacks NumPy's dimensions and steps into a kernel
 * problem. The loops run with the GIL released and touch no Python object,
 * except to raise MemoryError (taking the GIL for it). They report no
 * floating-point flags: the kernels give the caller's back as they were
 * (kernels/fp_env.h says why), and special values show in the output, as
 * in torch.
 */
#include "gufuncs.h"

#include <string.h>

#include "../kernels/rms_norm.h"
#include "numpy_api.h"

/*
 * The loops come from the kernels' type list (kernels/types.h), in its
 * order: NumPy takes the first loop that the inputs cast to safely, and
 * the list puts each input's own weight kind before a wider one. Each
 * loop's data is its rms_type.
 */
static const rms_type all_types[RMS_NUM_TYPES] = {
#define RMS_TYPE_VALUE(name, x, weight) RMS_##name,
    RMS_FOR_EACH_TYPE(RMS_TYPE_VALUE)
#undef RMS_TYPE_VALUE
};

/* bfloat16 has no NumPy type number of its own: ml_dtypes registers it at
   run time, and its loops are added to the gufuncs then. -1 until then. */
static int bfloat16_type_num = -1;

/* The NumPy type number of a storage kind, or -1 (bfloat16 before
   ml_dtypes registers it). */
static int type_num_of(rms_kind kind)
{
    switch (kind) {
    case RMS_KIND_F16:
        return NPY_HALF;
    case RMS_KIND_F32:
        return NPY_FLOAT;
    case RMS_KIND_F64:
        return NPY_DOUBLE;
    default:
        return bfloat16_type_num;
    }
}

static int uses_bfloat16(rms_type type)
{
    return rms_type_table[type].x == RMS_KIND_BF16 || rms_type_table[type].weight == RMS_KIND_BF16;
}

/* A MemoryError that says how much the kernels asked for, and for what;
   from a loop too, which runs without the GIL. */
void rms_raise_no_memory(size_t bytes, const char *what, Py_ssize_t n)
{
    NPY_ALLOW_C_API_DEF
    NPY_ALLOW_C_API
    PyErr_Format(PyExc_MemoryError,
                 "rmsnorm could not allocate %zu bytes of scratch memory for %s, with rows "
                 "of %zd elements",
                 bytes, what, n);
    NPY_DISABLE_C_API
}

/*
 * Each gufunc is one of two families, forward or backward, with or without
 * a residual and a weight offset (the VARIANT_ flags). The variants add
 * operands to the family's, at fixed places:
 *
 *   forward:  x, [residual], weight, [weight_offset], eps -> y, [residual_out]
 *   backward: grad_output, [grad_residual_out], x, weight, [weight_offset], eps
 *             -> grad_input, grad_weight
 *
 * In the backward of the residual variant, x is residual_out.
 */
enum { VARIANT_RESIDUAL = 1, VARIANT_OFFSET = 2 };

/* A loop's data: its element type and its gufunc's variant. */
typedef struct {
    rms_type type;
    int variant;
} loop_params;

/* (n)...->(n)...: each operand's core stride follows the outer ones, in
   operand order, for the operands that have a core dimension. */
static void forward_loop(char **args, npy_intp const *dimensions, npy_intp const *steps,
                         void *data)
{
    const loop_params *params = data;
    const int residual = (params->variant & VARIANT_RESIDUAL) != 0;
    const int offset = (params->variant & VARIANT_OFFSET) != 0;
    const int nop = 4 + 2 * residual + offset;
    const int x = 0, r = 1, w = 1 + residual, o = w + 1, eps = w + 1 + offset, y = eps + 1,
              r_out = y + 1;
    /* the core strides, by operand: scalars (eps, weight_offset) have none */
    const npy_intp *core = steps + nop;
    const npy_intp x_core = core[0], r_core = core[residual ? 1 : 0],
                   w_core = core[1 + residual], y_core = core[2 + residual],
                   r_out_core = core[residual ? 4 : 0];
    rms_forward_problem problem = {
        .n = dimensions[1],
        .x = {args[x], steps[x], x_core},
        .weight = {args[w], steps[w], w_core},
        .eps = args[eps],
        .eps_stride = steps[eps],
        .y = {args[y], steps[y], y_core},
    };
    if (offset) {
        problem.weight_offset = args[o];
        problem.weight_offset_stride = steps[o];
    }
    if (residual) {
        problem.residual = (rms_matrix){args[r], steps[r], r_core};
        problem.residual_out = (rms_matrix){args[r_out], steps[r_out], r_out_core};
    }
    const size_t failed_bytes = rms_norm_forward(params->type, &problem, dimensions[0]);
    if (failed_bytes != 0) {
        rms_raise_no_memory(failed_bytes, RMS_FORWARD_SCRATCH, problem.n);
    }
}

/* (m,n)...->(m,n),(n): the (m,n) operands have two core strides each. */
static void backward_loop(char **args, npy_intp const *dimensions, npy_intp const *steps,
                          void *data)
{
    const loop_params *params = data;
    const int residual = (params->variant & VARIANT_RESIDUAL) != 0;
    const int offset = (params->variant & VARIANT_OFFSET) != 0;
    const int nop = 6 + residual + offset;
    const int grad_output = 0, grad_r = 1, x = 1 + residual, w = x + 1, o = w + 1,
              eps = w + 1 + offset, grad_input = eps + 1, grad_weight = eps + 2;
    const npy_intp outer = dimensions[0], m = dimensions[1], n = dimensions[2];
    const npy_intp *core = steps + nop;
    const npy_intp *grad_output_core = core, *grad_r_core = core + 2,
                   *x_core = core + 2 + 2 * residual, *w_core = x_core + 2,
                   *grad_input_core = w_core + 1, *grad_weight_core = w_core + 3;
    for (npy_intp i = 0; i < outer; i++) {
        rms_backward_problem problem = {
            .n = n,
            .grad_output = {args[grad_output] + i * steps[grad_output], grad_output_core[0],
                            grad_output_core[1]},
            .x = {args[x] + i * steps[x], x_core[0], x_core[1]},
            .weight = args[w] + i * steps[w],
            .weight_stride = w_core[0],
            .eps = args[eps] + i * steps[eps],
            .grad_input = {args[grad_input] + i * steps[grad_input], grad_input_core[0],
                           grad_input_core[1]},
        };
        if (offset) {
            problem.weight_offset = args[o] + i * steps[o];
        }
        if (residual) {
            problem.grad_residual_out =
                (rms_matrix){args[grad_r] + i * steps[grad_r], grad_r_core[0], grad_r_core[1]};
        }
        const size_t failed_bytes =
            rms_norm_backward(params->type, &problem, m,
                              args[grad_weight] + i * steps[grad_weight], grad_weight_core[0]);
        if (failed_bytes != 0) {
            rms_raise_no_memory(failed_bytes, RMS_BACKWARD_SCRATCH, n);
            break;
        }
    }
}

/* The type number of each operand, in signature order, for one type. */
static int operand_dtypes(int backward, int variant, rms_type type, int *types)
{
    const rms_type_kinds kinds = rms_type_table[type];
    const int x = type_num_of(kinds.x), weight = type_num_of(kinds.weight);
    const int residual = (variant & VARIANT_RESIDUAL) != 0, offset = (variant & VARIANT_OFFSET) != 0;
    int count = 0;
    types[count++] = x; /* x, or grad_output */
    if (residual) {
        types[count++] = x; /* residual, or grad_residual_out */
    }
    if (backward) {
        types[count++] = x;
    }
    types[count++] = weight;
    if (offset) {
        types[count++] = NPY_DOUBLE;
    }
    types[count++] = type_num_of(kinds.eps);
    types[count++] = x; /* y, or grad_input */
    types[count++] = backward ? weight : x; /* grad_weight, or residual_out */
    return backward || residual ? count : count - 1;
}

#define MAX_OPERANDS 8

/*
 * The loops as the docstrings list them, one line per input dtype, in
 * kernels/types.h's order (tests/test_docstrings.py checks the two agree).
 * forward.types cannot show the bfloat16 ones: they are registered for
 * ml_dtypes' type at run time, and NumPy lists built-in types only.
 */
#define LOOPS_DOC                                                                          \
    "Loops, as (x, weight, eps) dtypes, in the order NumPy tries them (it\n"               \
    "takes the first that the operands cast to safely):\n"                                 \
    "\n"                                                                                   \
    "    float16 x: float16 or float32 weight, float32 eps\n"                              \
    "    float32 x: float32 or float64 weight, float32 eps\n"                              \
    "    float64 x: float64 weight, float64 eps\n"                                         \
    "    bfloat16 x: bfloat16 or float32 weight, float32 eps (with ml_dtypes)\n"           \
    "\n"                                                                                   \
    "forward.types and backward.types list NumPy's built-in dtypes only, so\n"             \
    "they never show the bfloat16 loops; rmsnorm._core.dtype_pairs lists all.\n"

/*
 * The weight-offset twin of a gufunc: one more operand, weight_offset, a
 * float64 scalar per row right after the weight, and the factor
 * weight_offset + weight in place of weight. The twin's name is the
 * gufunc's with "_offset" appended.
 */
#define OFFSET_GUFUNC(base, signature, nin, nout, backward, variant, operands_before)      \
    {base "_offset", signature, nin, nout, backward, (variant) | VARIANT_OFFSET,           \
     base "_offset(" operands_before ", weight_offset, eps, /, out=..., ...)\n"            \
     "\n"                                                                                  \
     "rmsnorm." base " with the weight offset: the factor is\n"                            \
     "weight_offset + weight, formed exactly, in place of weight, as Gemma's\n"            \
     "(1 + weight) is. weight_offset is a float64 scalar (per row where it\n"              \
     "broadcasts); grad_weight, where there is one, is the stored weight's\n"              \
     "gradient. An offset of 0 is " base " itself. Signature " signature ".\n"             \
     "\n"                                                                                  \
     "Examples\n"                                                                          \
     "--------\n"                                                                          \
     ">>> import numpy as np, rmsnorm\n"                                                   \
     ">>> rmsnorm.forward_offset(np.array([3.0, 4.0]), np.zeros(2), 1.0, 0.0)\n"           \
     "array([0.84852814, 1.13137085])\n"}

typedef struct {
    const char *name;
    const char *signature;
    int nin, nout;
    int backward; /* the family: 0 forward, 1 backward */
    int variant;  /* VARIANT_RESIDUAL and VARIANT_OFFSET, or'ed */
    const char *doc;
} gufunc_descriptor;

static const gufunc_descriptor gufuncs[] = {
    {"forward", "(n),(n),()->(n)", 3, 1, 0, 0,
     "forward(x, weight, eps, /, out=None, *, axes=None, dtype=None, casting='same_kind', ...)\n"
     "\n"
     "RMSNorm of each row of x, as a NumPy generalized ufunc.\n"
     "\n"
     "Signature (n),(n),()->(n): over the last axis (the core dimension n),\n"
     "\n"
     "    inv_rms = 1 / sqrt(mean(x**2) + eps)\n"
     "    y       = x * inv_rms * weight\n"
     "\n"
     "All other axes broadcast as in any ufunc, so weight and eps may also\n"
     "differ per row. Sums are taken in double and each output is the exact\n"
     "result rounded once. eps is not optional here: rmsnorm.rms_norm fills\n"
     "in torch's default (the machine epsilon of the compute type).\n"
     "\n"
     LOOPS_DOC
     "\n"
     "Parameters\n"
     "----------\n"
     "x : array_like, (..., n), float16, bfloat16, float32 or float64\n"
     "weight : array_like, (..., n), the gain (ones for plain normalisation)\n"
     "eps : array_like, (...), added to mean(x**2); float32 for float32 x\n"
     "\n"
     "Returns\n"
     "-------\n"
     "y : ndarray, (..., n), in x's dtype\n"
     "\n"
     "Examples\n"
     "--------\n"
     ">>> import numpy as np, rmsnorm\n"
     ">>> rmsnorm.forward(np.array([3.0, 4.0]), np.ones(2), 0.0)\n"
     "array([0.84852814, 1.13137085])\n"},
    {"backward", "(m,n),(m,n),(n),()->(m,n),(n)", 4, 2, 1, 0,
     "backward(grad_output, x, weight, eps, /, out=(None, None), *, axes=None, ...)\n"
     "\n"
     "Gradients of rmsnorm.forward, as a NumPy generalized ufunc.\n"
     "\n"
     "Signature (m,n),(m,n),(n),()->(m,n),(n): for m rows of length n that\n"
     "share one weight, with x_hat = x * inv_rms and g = grad_output * weight,\n"
     "\n"
     "    grad_input  = inv_rms * (g - x_hat * mean(g * x_hat))   per row\n"
     "    grad_weight = sum over the m rows of grad_output * x_hat\n"
     "\n"
     "grad_weight is summed inside the loop, never stored per row, and is the\n"
     "same bytes for any number of threads. grad_output and grad_input\n"
     "have x's dtype, grad_weight the weight's.\n"
     "\n"
     LOOPS_DOC
     "\n"
     "Returns\n"
     "-------\n"
     "grad_input : ndarray, (..., m, n), in x's dtype\n"
     "grad_weight : ndarray, (..., n), in weight's dtype\n"
     "\n"
     "Examples\n"
     "--------\n"
     ">>> import numpy as np, rmsnorm\n"
     ">>> x = np.array([[3.0, 4.0]])\n"
     ">>> grad_input, grad_weight = rmsnorm.backward(np.ones((1, 2)), x, np.ones(2), 0.0)\n"
     ">>> grad_weight\n"
     "array([0.84852814, 1.13137085])\n"},
    {"add_forward", "(n),(n),(n),()->(n),(n)", 4, 2, 0, VARIANT_RESIDUAL,
     "add_forward(x, residual, weight, eps, /, out=(None, None), *, axes=None, ...)\n"
     "\n"
     "The residual add and RMSNorm of a pre-norm block, fused, as a NumPy\n"
     "generalized ufunc.\n"
     "\n"
     "Signature (n),(n),(n),()->(n),(n): over the last axis,\n"
     "\n"
     "    residual_out = x + residual          rounded to x's dtype\n"
     "    y            = forward(residual_out, weight, eps)\n"
     "\n"
     "in one pass over memory: each row of residual_out is normalised while\n"
     "it is still in cache. Both outputs are the same bytes as np.add followed\n"
     "by rmsnorm.forward, a NaN's sign and payload aside. residual has x's\n"
     "dtype. out=(y, residual) updates the residual in place, with no\n"
     "temporary; y must not overlap residual_out.\n"
     "\n"
     LOOPS_DOC
     "\n"
     "Returns\n"
     "-------\n"
     "y : ndarray, (..., n), in x's dtype\n"
     "residual_out : ndarray, (..., n), in x's dtype\n"
     "\n"
     "Examples\n"
     "--------\n"
     ">>> import numpy as np, rmsnorm\n"
     ">>> y, h = rmsnorm.add_forward(np.array([1.0, 3.0]), np.array([2.0, 1.0]), np.ones(2), 0.0)\n"
     ">>> h\n"
     "array([3., 4.])\n"
     ">>> y\n"
     "array([0.84852814, 1.13137085])\n"},
    {"add_backward", "(m,n),(m,n),(m,n),(n),()->(m,n),(n)", 5, 2, 1, VARIANT_RESIDUAL,
     "add_backward(grad_output, grad_residual_out, residual_out, weight, eps, /, out=(None, None), ...)\n"
     "\n"
     "Gradients of rmsnorm.add_forward, as a NumPy generalized ufunc.\n"
     "\n"
     "Signature (m,n),(m,n),(m,n),(n),()->(m,n),(n). residual_out is the\n"
     "forward's second output, h = x + residual; grad_residual_out is the\n"
     "gradient that reached h directly (zeros where h is not used further).\n"
     "\n"
     "    grad_input  = backward(grad_output, h, ...)[0] + grad_residual_out\n"
     "    grad_weight = backward(grad_output, h, ...)[1]\n"
     "\n"
     "grad_input is the gradient of both x and residual. grad_weight is\n"
     "summed over rows as in rmsnorm.backward.\n"
     "\n"
     LOOPS_DOC
     "\n"
     "Returns\n"
     "-------\n"
     "grad_input : ndarray, (..., m, n), in x's dtype\n"
     "grad_weight : ndarray, (..., n), in weight's dtype\n"
     "\n"
     "Examples\n"
     "--------\n"
     ">>> import numpy as np, rmsnorm\n"
     ">>> h = np.array([[3.0, 4.0]])\n"
     ">>> grad_input, grad_weight = rmsnorm.add_backward(\n"
     "...     np.zeros((1, 2)), np.ones((1, 2)), h, np.ones(2), 0.0)\n"
     ">>> grad_input\n"
     "array([[1., 1.]])\n"},
    OFFSET_GUFUNC("forward", "(n),(n),(),()->(n)", 4, 1, 0, 0, "x, weight"),
    OFFSET_GUFUNC("backward", "(m,n),(m,n),(n),(),()->(m,n),(n)", 5, 2, 1, 0,
                  "grad_output, x, weight"),
    OFFSET_GUFUNC("add_forward", "(n),(n),(n),(),()->(n),(n)", 5, 2, 0, VARIANT_RESIDUAL,
                  "x, residual, weight"),
    OFFSET_GUFUNC("add_backward", "(m,n),(m,n),(m,n),(n),(),()->(m,n),(n)", 6, 2, 1,
                  VARIANT_RESIDUAL, "grad_output, grad_residual_out, residual_out, weight"),
};
#define NUM_GUFUNCS ((int)(sizeof(gufuncs) / sizeof(gufuncs[0])))

static PyUFuncGenericFunction loop_of(const gufunc_descriptor *d)
{
    return d->backward ? backward_loop : forward_loop;
}

/* NumPy keeps pointers to these for the life of the process. */
static PyUFuncGenericFunction loop_functions[NUM_GUFUNCS][RMS_NUM_TYPES];
static void *loop_data[NUM_GUFUNCS][RMS_NUM_TYPES];
static loop_params loop_params_of[NUM_GUFUNCS][RMS_NUM_TYPES];
static char loop_types[NUM_GUFUNCS][RMS_NUM_TYPES * MAX_OPERANDS];

/* The type whose loop takes x and weight of these type numbers, or -1. */
static int find_type(int x, int weight)
{
    for (int t = 0; t < RMS_NUM_TYPES; t++) {
        const rms_type_kinds kinds = rms_type_table[t];
        if (type_num_of(kinds.x) == x && type_num_of(kinds.weight) == weight && x != -1) {
            return t;
        }
    }
    return -1;
}

PyObject *rms_forward_direct(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        return PyErr_Format(PyExc_TypeError, "_forward_direct() takes x, weight and eps");
    }
    if (!PyArray_CheckExact(args[0]) || !PyArray_CheckExact(args[1]) ||
        !PyArray_IsScalar(args[2], Generic)) {
        Py_RETURN_NONE;
    }
    PyArrayObject *x = (PyArrayObject *)args[0], *weight = (PyArrayObject *)args[1];
    const int ndim = PyArray_NDIM(x);
    if (ndim < 1 || !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_ISALIGNED(x) ||
        !PyArray_ISNOTSWAPPED(x) || PyArray_NDIM(weight) != 1 || !PyArray_ISALIGNED(weight) ||
        !PyArray_ISNOTSWAPPED(weight)) {
        Py_RETURN_NONE;
    }
    const npy_intp n = PyArray_DIM(x, ndim - 1);
    const int type = find_type(PyArray_TYPE(x), PyArray_TYPE(weight));
    PyArray_Descr *eps_descr = PyArray_DescrFromScalar(args[2]);
    if (eps_descr == NULL) {
        return NULL;
    }
    const int eps_matches =
        type >= 0 && eps_descr->type_num == type_num_of(rms_type_table[type].eps);
    Py_DECREF(eps_descr);
    if (n == 0 || PyArray_DIM(weight, 0) != n || !eps_matches) {
        Py_RETURN_NONE;
    }
    union {
        float f;
        double d;
    } eps; /* the loop reads it as its eps type */
    PyArray_ScalarAsCtype(args[2], &eps);
    PyArrayObject *y = (PyArrayObject *)PyArray_NewLikeArray(x, NPY_CORDER, NULL, 0);
    if (y == NULL) {
        return NULL;
    }
    const npy_intp item = PyArray_ITEMSIZE(x);
    char *loop_args[] = {PyArray_BYTES(x), PyArray_BYTES(weight), (char *)&eps, PyArray_BYTES(y)};
    const npy_intp dimensions[] = {PyArray_SIZE(x) / n, n};
    /* outer strides of x, weight, eps, y; then the core strides of x, weight, y */
    const npy_intp steps[] = {n * item, 0, 0, n * item, item, PyArray_STRIDE(weight, 0), item};
    NPY_BEGIN_THREADS_DEF
    NPY_BEGIN_THREADS
    loop_params params = {(rms_type)type, 0};
    forward_loop(loop_args, dimensions, steps, &params);
    NPY_END_THREADS
    return (PyObject *)y;
}

int rms_register_bfloat16(PyObject *module, int type_num)
{
    if (bfloat16_type_num != -1) {
        return bfloat16_type_num == type_num ? 0 : -1;
    }
    bfloat16_type_num = type_num;
    for (int g = 0; g < NUM_GUFUNCS; g++) {
        const gufunc_descriptor *d = &gufuncs[g];
        PyObject *ufunc = PyObject_GetAttrString(module, d->name);
        if (ufunc == NULL) {
            return -1;
        }
        for (int t = 0; t < RMS_NUM_TYPES; t++) {
            int arg_types[MAX_OPERANDS];
            if (!uses_bfloat16(all_types[t])) {
                continue;
            }
            operand_dtypes(d->backward, d->variant, all_types[t], arg_types);
            loop_params_of[g][t] = (loop_params){all_types[t], d->variant};
            if (PyUFunc_RegisterLoopForType((PyUFuncObject *)ufunc, type_num, loop_of(d),
                                            arg_types, &loop_params_of[g][t]) < 0) {
                Py_DECREF(ufunc);
                return -1;
            }
        }
        Py_DECREF(ufunc);
    }
    return 0;
}

int rms_add_gufuncs(PyObject *module)
{
    for (int g = 0; g < NUM_GUFUNCS; g++) {
        const gufunc_descriptor *d = &gufuncs[g];
        const int operands = d->nin + d->nout;
        int loops = 0;
        for (int t = 0; t < RMS_NUM_TYPES; t++) {
            int types[MAX_OPERANDS];
            if (uses_bfloat16(all_types[t])) {
                continue; /* added by rms_register_bfloat16 */
            }
            operand_dtypes(d->backward, d->variant, all_types[t], types);
            for (int i = 0; i < operands; i++) {
                loop_types[g][loops * operands + i] = (char)types[i]; /* built-in type numbers */
            }
            loop_params_of[g][t] = (loop_params){all_types[t], d->variant};
            loop_functions[g][loops] = loop_of(d);
            loop_data[g][loops] = &loop_params_of[g][t];
            loops++;
        }
        PyObject *ufunc = PyUFunc_FromFuncAndDataAndSignature(
            loop_functions[g], loop_data[g], loop_types[g], loops, d->nin, d->nout,
            PyUFunc_None, d->name, d->doc, 0, d->signature);
        if (ufunc == NULL) {
            return -1;
        }
        if (PyModule_AddObject(module, d->name, ufunc) < 0) {
            Py_DECREF(ufunc);
            return -1;
        }
    }
    return 0;
}

/* The kind names, as rmsnorm._dtypes spells the dtypes. */
static const char *kind_name(rms_kind kind)
{
    switch (kind) {
    case RMS_KIND_F16:
        return "float16";
    case RMS_KIND_F32:
        return "float32";
    case RMS_KIND_F64:
        return "float64";
    default:
        return "bfloat16";
    }
}

PyObject *rms_dtype_pairs(void)
{
    PyObject *pairs = PyTuple_New(RMS_NUM_TYPES);
    if (pairs == NULL) {
        return NULL;
    }
    for (int t = 0; t < RMS_NUM_TYPES; t++) {
        const rms_type_kinds kinds = rms_type_table[t];
        PyObject *pair = Py_BuildValue("(sss)", kind_name(kinds.x), kind_name(kinds.weight),
                                       kind_name(kinds.eps));
        if (pair == NULL) {
            Py_DECREF(pairs);
            return NULL;
        }
        PyTuple_SET_ITEM(pairs, t, pair);
    }
    return pairs;
}
