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

#include <stdint.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

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

/* (address, stride...) with count strides, into address and strides. */
static int parse_strided(PyObject *obj, int count, const char *what, char **address,
                         Py_ssize_t *strides)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 1 + count) {
        PyErr_SetString(PyExc_TypeError, what);
        return -1;
    }
    if (parse_address(PyTuple_GET_ITEM(obj, 0), address) < 0) {
        return -1;
    }
    for (int i = 0; i < count; i++) {
        strides[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 1 + i));
        if (strides[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
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
    Py_ssize_t strides[2];
    if (parse_strided(obj, 2, "a matrix is an address or (address, row stride, stride)",
                      &matrix->data, strides) < 0) {
        return -1;
    }
    matrix->row_stride = strides[0];
    matrix->stride = strides[1];
    return 0;
}

/* A vector, as a matrix whose rows all start at the same place. */
static int parse_vector(PyObject *obj, Py_ssize_t item, rms_matrix *vector)
{
    *vector = (rms_matrix){NULL, 0, item};
    if (PyLong_Check(obj)) {
        return parse_address(obj, &vector->data);
    }
    return parse_strided(obj, 1, "a vector is an address or (address, stride)", &vector->data,
                         &vector->stride);
}

/* What both entry points take first: the type, the shape, eps as the
   kernels read it (float64 for float64 input, float32 for the rest) and
   the weight offset. */
typedef struct {
    rms_type type;
    Py_ssize_t rows, n;
    union {
        float f;
        double d;
    } eps;
    double weight_offset;
    Py_ssize_t item, weight_item; /* bytes of an element of x and of the weight */
} problem_head;

enum { HEAD_ARGS = 5 };

/* The head of a call of expected arguments in all, checked: sizes the
   kernels can multiply out, and a type they have. */
static int parse_head(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                      const char *name, problem_head *head)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected,
                     nargs);
        return -1;
    }
    long type;
    Py_ssize_t rows, n;
    double eps;
    /* each conversion returns -1 on an error, and may on success */
    if (((type = PyLong_AsLong(args[0])) == -1 && PyErr_Occurred()) ||
        ((rows = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) ||
        ((n = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) ||
        ((eps = PyFloat_AsDouble(args[3])) == -1 && PyErr_Occurred()) ||
        ((head->weight_offset = PyFloat_AsDouble(args[4])) == -1 && PyErr_Occurred())) {
        return -1;
    }
    /* sizes whose byte counts fit: the kernels multiply them out */
    if (type < 0 || type >= RMS_NUM_TYPES || rows < 0 || n < 1 || n > PY_SSIZE_T_MAX / 8 ||
        rows > PY_SSIZE_T_MAX / 8 / n) {
        PyErr_Format(PyExc_ValueError, "no kernel problem: type %ld, %zd rows of %zd", type,
                     rows, n);
        return -1;
    }
    head->type = (rms_type)type;
    head->rows = rows;
    head->n = n;
    if (rms_type_table[type].eps == RMS_KIND_F64) {
        head->eps.d = eps;
    }
    else {
        head->eps.f = (float)eps; /* past float32's range: inf, as torch's cast gives */
    }
    head->item = rms_kind_size(rms_type_table[type].x);
    head->weight_item = rms_kind_size(rms_type_table[type].weight);
    return 0;
}

PyObject *rms_forward_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    problem_head head;
    if (parse_head(args, nargs, HEAD_ARGS + 5, "_forward_buffers", &head) < 0) {
        return NULL;
    }
    PyObject *const *operands = args + HEAD_ARGS;
    const Py_ssize_t n = head.n, item = head.item;
    rms_matrix x, weight, y, residual, residual_out;
    if (parse_matrix(operands[0], n, item, 0, &x) < 0 ||
        parse_vector(operands[1], head.weight_item, &weight) < 0 ||
        parse_matrix(operands[2], n, item, 0, &y) < 0 ||
        parse_matrix(operands[3], n, item, 1, &residual) < 0 ||
        parse_matrix(operands[4], n, item, 1, &residual_out) < 0) {
        return NULL;
    }
    rms_forward_problem problem = {
        .n = n,
        .x = x,
        .weight = weight,
        .eps = (const char *)&head.eps,
        .eps_stride = 0,
        .weight_offset = head.weight_offset != 0 ? (const char *)&head.weight_offset : NULL,
        .weight_offset_stride = 0,
        .residual = residual,
        .residual_out = residual_out,
        .y = y,
    };
    size_t failed_bytes;
    Py_BEGIN_ALLOW_THREADS
    failed_bytes = rms_norm_forward(head.type, &problem, head.rows);
    Py_END_ALLOW_THREADS
    if (failed_bytes != 0) {
        rms_raise_no_memory(failed_bytes, RMS_FORWARD_SCRATCH, n);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *rms_backward_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    problem_head head;
    if (parse_head(args, nargs, HEAD_ARGS + 6, "_backward_buffers", &head) < 0) {
        return NULL;
    }
    PyObject *const *operands = args + HEAD_ARGS;
    const Py_ssize_t n = head.n, item = head.item;
    rms_matrix grad_output, x, weight, grad_input, grad_weight, grad_residual_out;
    if (parse_matrix(operands[0], n, item, 0, &grad_output) < 0 ||
        parse_matrix(operands[1], n, item, 0, &x) < 0 ||
        parse_vector(operands[2], head.weight_item, &weight) < 0 ||
        parse_matrix(operands[3], n, item, 0, &grad_input) < 0 ||
        parse_vector(operands[4], head.weight_item, &grad_weight) < 0 ||
        parse_matrix(operands[5], n, item, 1, &grad_residual_out) < 0) {
        return NULL;
    }
    rms_backward_problem problem = {
        .n = n,
        .grad_output = grad_output,
        .x = x,
        .weight = weight.data,
        .weight_stride = weight.stride,
        .eps = (const char *)&head.eps,
        .weight_offset = head.weight_offset != 0 ? (const char *)&head.weight_offset : NULL,
        .grad_residual_out = grad_residual_out,
        .grad_input = grad_input,
    };
    size_t failed_bytes;
    Py_BEGIN_ALLOW_THREADS
    failed_bytes = rms_norm_backward(head.type, &problem, head.rows, grad_weight.data,
                                     grad_weight.stride);
    Py_END_ALLOW_THREADS
    if (failed_bytes != 0) {
        rms_raise_no_memory(failed_bytes, RMS_BACKWARD_SCRATCH, n);
        return NULL;
    }
    Py_RETURN_NONE;
}

/*
 * Asks the OS for transparent huge pages over the whole pages of [address,
 * address + nbytes), as NumPy does for its arrays of 4 MiB and more: a
 * fresh output then faults in 2 MiB at a time, not 4 KiB (8192 faults for
 * 32 MiB cost as much as the kernel itself). A hint: where the OS has no
 * such advice, or refuses it, nothing changes.
 */
PyObject *rms_advise_huge_pages(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "_advise_huge_pages() takes 2 arguments (%zd given)",
                            nargs);
    }
    char *address;
    if (parse_address(args[0], &address) < 0) {
        return NULL;
    }
    const size_t nbytes = PyLong_AsSize_t(args[1]);
    if (nbytes == (size_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const long page = sysconf(_SC_PAGESIZE);
    if (page > 0) {
        const uintptr_t first = (uintptr_t)address, size = (uintptr_t)page;
        const uintptr_t start = first / size * size + (first % size != 0 ? size : 0);
        const uintptr_t end = (first + nbytes) / size * size;
        if (end > start) {
            (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
        }
    }
#else
    (void)address;
    (void)nbytes;
#endif
    Py_RETURN_NONE;
}
