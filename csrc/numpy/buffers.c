/*
 * The kernels on raw buffers (buffers.h): Python ints in, a kernel problem
 * out. The arguments, in order:
 *
 *   type           the index of the element type in kernels/types.h's list
 *                  (rmsnorm._core.dtype_pairs has the same order)
 *   rows, n        rows of n elements
 *   eps            a float, rounded to the type's eps kind here, as torch
 *                  rounds it to its compute type
 *   weight_offset  a float; 0 runs the kernels without an offset
 *   a matrix       (address, row stride, element stride), strides in bytes
 *   a vector       (address, element stride): the weight and grad_weight,
 *                  shared by every row
 *   None           for an optional matrix that is absent
 */
#include "buffers.h"

#include <fenv.h>
#include <stdint.h>

#include "../kernels/rms_norm.h"

static int matrix_converter(PyObject *obj, void *out)
{
    unsigned long long address;
    Py_ssize_t row_stride, stride;
    if (!PyArg_ParseTuple(obj, "Knn;a matrix is (address, row stride, stride)", &address,
                          &row_stride, &stride)) {
        return 0;
    }
    *(rms_matrix *)out = (rms_matrix){(char *)(uintptr_t)address, row_stride, stride};
    return 1;
}

/* A matrix, or None for an absent one (data NULL, as the kernels read it). */
static int optional_matrix_converter(PyObject *obj, void *out)
{
    if (obj == Py_None) {
        *(rms_matrix *)out = (rms_matrix){NULL, 0, 0};
        return 1;
    }
    return matrix_converter(obj, out);
}

/* A vector, as a matrix whose rows all start at the same place. */
static int vector_converter(PyObject *obj, void *out)
{
    unsigned long long address;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(obj, "Kn;a vector is (address, stride)", &address, &stride)) {
        return 0;
    }
    *(rms_matrix *)out = (rms_matrix){(char *)(uintptr_t)address, 0, stride};
    return 1;
}

/* eps as the kernels read it: float64 for float64 input, float32 for the rest. */
typedef union {
    float f;
    double d;
} eps_value;

static int check_problem(int type, Py_ssize_t rows, Py_ssize_t n, double eps, eps_value *value)
{
    if (type < 0 || type >= RMS_NUM_TYPES || rows < 0 || n < 1) {
        PyErr_Format(PyExc_ValueError, "no kernel problem: type %d, %zd rows of %zd", type,
                     rows, n);
        return -1;
    }
    if (rms_type_table[type].eps == RMS_KIND_F64) {
        value->d = eps;
    } else {
        value->f = (float)eps; /* past float32's range: inf, as torch's cast gives */
    }
    return 0;
}

static PyObject *no_memory(size_t bytes, const char *what, Py_ssize_t n)
{
    return PyErr_Format(PyExc_MemoryError,
                        "rmsnorm could not allocate %zu bytes of scratch memory for %s, with "
                        "rows of %zd elements",
                        bytes, what, n);
}

PyObject *rms_forward_buffers(PyObject *module, PyObject *args)
{
    (void)module;
    int type;
    Py_ssize_t rows, n;
    double eps, weight_offset;
    rms_matrix x, weight, y, residual, residual_out;
    if (!PyArg_ParseTuple(args, "innddO&O&O&O&O&:_forward_buffers", &type, &rows, &n, &eps,
                          &weight_offset, matrix_converter, &x, vector_converter, &weight,
                          matrix_converter, &y, optional_matrix_converter, &residual,
                          optional_matrix_converter, &residual_out)) {
        return NULL;
    }
    eps_value eps_as_kind;
    if (check_problem(type, rows, n, eps, &eps_as_kind) < 0) {
        return NULL;
    }
    rms_forward_problem problem = {
        .n = n,
        .x = x,
        .weight = weight,
        .eps = (const char *)&eps_as_kind,
        .eps_stride = 0,
        .weight_offset = weight_offset != 0 ? (const char *)&weight_offset : NULL,
        .weight_offset_stride = 0,
        .residual = residual,
        .residual_out = residual_out,
        .y = y,
    };
    size_t failed_bytes;
    Py_BEGIN_ALLOW_THREADS
    failed_bytes = rms_norm_forward((rms_type)type, &problem, rows);
    /* As the gufunc loops do: the flags of intermediate steps say nothing
       about the result. */
    feclearexcept(FE_ALL_EXCEPT);
    Py_END_ALLOW_THREADS
    if (failed_bytes != 0) {
        return no_memory(failed_bytes, "the weight offset added to the weight", n);
    }
    Py_RETURN_NONE;
}

PyObject *rms_backward_buffers(PyObject *module, PyObject *args)
{
    (void)module;
    int type;
    Py_ssize_t rows, n;
    double eps, weight_offset;
    rms_matrix grad_output, x, weight, grad_input, grad_weight, grad_residual_out;
    if (!PyArg_ParseTuple(args, "innddO&O&O&O&O&O&:_backward_buffers", &type, &rows, &n,
                          &eps, &weight_offset, matrix_converter, &grad_output,
                          matrix_converter, &x, vector_converter, &weight, matrix_converter,
                          &grad_input, vector_converter, &grad_weight,
                          optional_matrix_converter, &grad_residual_out)) {
        return NULL;
    }
    eps_value eps_as_kind;
    if (check_problem(type, rows, n, eps, &eps_as_kind) < 0) {
        return NULL;
    }
    rms_backward_problem problem = {
        .n = n,
        .grad_output = grad_output,
        .x = x,
        .weight = weight.data,
        .weight_stride = weight.stride,
        .eps = (const char *)&eps_as_kind,
        .weight_offset = weight_offset != 0 ? (const char *)&weight_offset : NULL,
        .grad_residual_out = grad_residual_out,
        .grad_input = grad_input,
    };
    size_t failed_bytes;
    Py_BEGIN_ALLOW_THREADS
    failed_bytes = rms_norm_backward((rms_type)type, &problem, rows, grad_weight.data,
                                     grad_weight.stride);
    feclearexcept(FE_ALL_EXCEPT);
    Py_END_ALLOW_THREADS
    if (failed_bytes != 0) {
        return no_memory(failed_bytes, "the weight and grad_weight's sums as doubles", n);
    }
    Py_RETURN_NONE;
}
