/*
 * The gufuncs: a descriptor table (name, signature, doc, loop) and one loop
 * per gufunc that unpacks NumPy's dimensions and steps into a kernel
 * problem. The loops run with the GIL released and touch no Python object,
 * except to raise MemoryError (taking the GIL for it).
 */
#include "gufuncs.h"

#include <fenv.h>
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

/*
 * The kernels' intermediate steps may raise floating-point flags that say
 * nothing about the result (an error term of an overflowing square, which
 * the rescaled path then replaces), and worker threads' flags never reach
 * NumPy at all. So the loops report none: special values show in the
 * output, as in torch.
 */
static void discard_fp_flags(void) { feclearexcept(FE_ALL_EXCEPT); }

/* forward: (n),(n),()->(n) */
static void forward_loop(char **args, npy_intp const *dimensions, npy_intp const *steps,
                         void *data)
{
    const rms_type type = *(const rms_type *)data;
    rms_forward_problem problem = {
        .n = dimensions[1],
        .x = {args[0], steps[0], steps[4]},
        .weight = {args[1], steps[1], steps[5]},
        .eps = args[2],
        .eps_stride = steps[2],
        .y = {args[3], steps[3], steps[6]},
    };
    rms_norm_forward(type, &problem, dimensions[0]);
    discard_fp_flags();
}

/* backward: (m,n),(m,n),(n),()->(m,n),(n) */
static void backward_loop(char **args, npy_intp const *dimensions, npy_intp const *steps,
                          void *data)
{
    const rms_type type = *(const rms_type *)data;
    const npy_intp outer = dimensions[0], m = dimensions[1], n = dimensions[2];
    /* steps: 6 outer strides, then the core strides operand by operand */
    const npy_intp *core = steps + 6;
    for (npy_intp o = 0; o < outer; o++) {
        rms_backward_problem problem = {
            .n = n,
            .grad_output = {args[0] + o * steps[0], core[0], core[1]},
            .x = {args[1] + o * steps[1], core[2], core[3]},
            .weight = args[2] + o * steps[2],
            .weight_stride = core[4],
            .eps = args[3] + o * steps[3],
            .grad_input = {args[4] + o * steps[4], core[5], core[6]},
        };
        if (rms_norm_backward(type, &problem, m, args[5] + o * steps[5], core[7]) != 0) {
            NPY_ALLOW_C_API_DEF
            NPY_ALLOW_C_API
            PyErr_NoMemory();
            NPY_DISABLE_C_API
            break;
        }
    }
    discard_fp_flags();
}

/* The type number of each operand, in signature order, for one type. */
static int forward_dtypes(rms_type type, int *types)
{
    const rms_type_kinds kinds = rms_type_table[type];
    const int x = type_num_of(kinds.x), weight = type_num_of(kinds.weight);
    const int row[] = {x, weight, type_num_of(kinds.eps), x};
    memcpy(types, row, sizeof(row));
    return (int)(sizeof(row) / sizeof(row[0]));
}

static int backward_dtypes(rms_type type, int *types)
{
    const rms_type_kinds kinds = rms_type_table[type];
    const int x = type_num_of(kinds.x), weight = type_num_of(kinds.weight);
    const int row[] = {x, x, weight, type_num_of(kinds.eps), x, weight};
    memcpy(types, row, sizeof(row));
    return (int)(sizeof(row) / sizeof(row[0]));
}

#define MAX_OPERANDS 6

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

typedef struct {
    const char *name;
    const char *signature;
    int nin, nout;
    PyUFuncGenericFunction loop;
    int (*operand_dtypes)(rms_type type, int *types);
    const char *doc;
} gufunc_descriptor;

static const gufunc_descriptor gufuncs[] = {
    {"forward", "(n),(n),()->(n)", 3, 1, forward_loop, forward_dtypes,
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
    {"backward", "(m,n),(m,n),(n),()->(m,n),(n)", 4, 2, backward_loop, backward_dtypes,
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
};
#define NUM_GUFUNCS ((int)(sizeof(gufuncs) / sizeof(gufuncs[0])))

/* NumPy keeps pointers to these for the life of the process. */
static PyUFuncGenericFunction loop_functions[NUM_GUFUNCS][RMS_NUM_TYPES];
static void *loop_data[NUM_GUFUNCS][RMS_NUM_TYPES];
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
    forward_loop(loop_args, dimensions, steps, (void *)&all_types[type]);
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
            d->operand_dtypes(all_types[t], arg_types);
            if (PyUFunc_RegisterLoopForType((PyUFuncObject *)ufunc, type_num, d->loop, arg_types,
                                            (void *)&all_types[t]) < 0) {
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
            d->operand_dtypes(all_types[t], types);
            for (int i = 0; i < operands; i++) {
                loop_types[g][loops * operands + i] = (char)types[i]; /* built-in type numbers */
            }
            loop_functions[g][loops] = d->loop;
            loop_data[g][loops] = (void *)&all_types[t];
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
