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
 *   a matrix       (address, row stride, element stride), strides in bytes,
 *                  or the address alone for contiguous rows
 *   a vector       (address, element stride), or the address alone for a
 *                  contiguous one: the weight and grad_weight, shared by
 *                  every row
 *   None           for an optional matrix that is absent
 *
 * A bare address is the common case, and the cheapest to pass: a decoding
 * step's whole call costs a few microseconds, of which building tuples of
 * strides in Python was a tenth.
 */
#include "buffers.h"

#include <fenv.h>
#include <stdint.h>

#include "../kernels/rms_norm.h"
#include "gufuncs.h"

static int parse_address(PyObject *obj, char **address)
{
    void *pointer = PyLong_AsVoidPtr(obj);
    if (pointer == NULL && PyErr_Occurred()) {
        return -1;
    }
    *address = pointer;
    return 0;
}

/* A matrix of rows of n elements of item bytes. None gives data NULL (an
   absent operand, as the kernels read it) where optional. */
static int parse_matrix(PyObject *obj, Py_ssize_t n, Py_ssize_t item, int optional,
                        rms_matrix *matrix)
{
    if (optional && obj == Py_None) {
        *matrix = (rms_matrix){NULL, 0, 0};
        return 0;
    }
    if (PyLong_Check(obj)) {
        *matrix = (rms_matrix){NULL, n * item, item};
        return parse_address(obj, &matrix->data);
    }
    unsigned long long address;
    Py_ssize_t row_stride, stride;
    if (!PyArg_ParseTuple(obj, "Knn;a matrix is an address or (address, row stride, stride)",
                          &address, &row_stride, &stride)) {
        return -1;
    }
    *matrix = (rms_matrix){(char *)(uintptr_t)address, row_stride, stride};
    return 0;
}

/* A vector, as a matrix whose rows all start at the same place. */
static int parse_vector(PyObject *obj, Py_ssize_t item, rms_matrix *vector)
{
    if (PyLong_Check(obj)) {
        *vector = (rms_matrix){NULL, 0, item};
        return parse_address(obj, &vector->data);
    }
    unsigned long long address;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(obj, "Kn;a vector is an address or (address, stride)", &address,
                          &stride)) {
        return -1;
    }
    *vector = (rms_matrix){(char *)(uintptr_t)address, 0, stride};
    return 0;
}

/* eps as the kernels read it: float64 for float64 input, float32 for the rest. */
typedef union {
    float f;
    double d;
} eps_value;

static int check_problem(int type, Py_ssize_t rows, Py_ssize_t n, double eps, eps_value *value)
{
    /* sizes whose byte counts fit: the kernels multiply them out */
    if (type < 0 || type >= RMS_NUM_TYPES || rows < 0 || n < 1 || n > PY_SSIZE_T_MAX / 8 ||
        rows > PY_SSIZE_T_MAX / 8 / n) {
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

PyObject *rms_forward_buffers(PyObject *module, PyObject *args)
{
    (void)module;
    int type;
    Py_ssize_t rows, n;
    double eps, weight_offset;
    PyObject *x_obj, *weight_obj, *y_obj, *residual_obj, *residual_out_obj;
    if (!PyArg_ParseTuple(args, "innddOOOOO:_forward_buffers", &type, &rows, &n, &eps,
                          &weight_offset, &x_obj, &weight_obj, &y_obj, &residual_obj,
                          &residual_out_obj)) {
        return NULL;
    }
    eps_value eps_as_kind;
    if (check_problem(type, rows, n, eps, &eps_as_kind) < 0) {
        return NULL;
    }
    const Py_ssize_t item = rms_kind_size(rms_type_table[type].x);
    rms_matrix x, weight, y, residual, residual_out;
    if (parse_matrix(x_obj, n, item, 0, &x) < 0 ||
        parse_vector(weight_obj, rms_kind_size(rms_type_table[type].weight), &weight) < 0 ||
        parse_matrix(y_obj, n, item, 0, &y) < 0 ||
        parse_matrix(residual_obj, n, item, 1, &residual) < 0 ||
        parse_matrix(residual_out_obj, n, item, 1, &residual_out) < 0) {
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
        rms_raise_no_memory(failed_bytes, "the weight offset added to the weight", n);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *rms_backward_buffers(PyObject *module, PyObject *args)
{
    (void)module;
    int type;
    Py_ssize_t rows, n;
    double eps, weight_offset;
    PyObject *grad_output_obj, *x_obj, *weight_obj, *grad_input_obj, *grad_weight_obj,
        *grad_residual_out_obj;
    if (!PyArg_ParseTuple(args, "innddOOOOOO:_backward_buffers", &type, &rows, &n, &eps,
                          &weight_offset, &grad_output_obj, &x_obj, &weight_obj,
                          &grad_input_obj, &grad_weight_obj, &grad_residual_out_obj)) {
        return NULL;
    }
    eps_value eps_as_kind;
    if (check_problem(type, rows, n, eps, &eps_as_kind) < 0) {
        return NULL;
    }
    const Py_ssize_t item = rms_kind_size(rms_type_table[type].x),
                     weight_item = rms_kind_size(rms_type_table[type].weight);
    rms_matrix grad_output, x, weight, grad_input, grad_weight, grad_residual_out;
    if (parse_matrix(grad_output_obj, n, item, 0, &grad_output) < 0 ||
        parse_matrix(x_obj, n, item, 0, &x) < 0 ||
        parse_vector(weight_obj, weight_item, &weight) < 0 ||
        parse_matrix(grad_input_obj, n, item, 0, &grad_input) < 0 ||
        parse_vector(grad_weight_obj, weight_item, &grad_weight) < 0 ||
        parse_matrix(grad_residual_out_obj, n, item, 1, &grad_residual_out) < 0) {
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
        rms_raise_no_memory(failed_bytes, "the weight and grad_weight's sums as doubles", n);
        return NULL;
    }
    Py_RETURN_NONE;
}
