/*
 * The kernels on raw buffers, for rmsnorm.torch: a tensor's memory reaches
 * the driver (kernels/rms_norm.h) without becoming an ndarray, so every
 * dtype works, bfloat16 without ml_dtypes too, and nothing is copied.
 *
 * A buffer is an address and byte strides, as Python ints. The caller
 * vouches for them: these are private entry points, and rmsnorm/torch.py,
 * which holds the tensors alive and checks their shapes, is their one
 * caller. Both run the kernels with the GIL released, as the gufuncs do.
 */
#ifndef RMSNORM_NUMPY_BUFFERS_H
#define RMSNORM_NUMPY_BUFFERS_H

#include <Python.h>

/* _forward_buffers(type, rows, n, eps, weight_offset, x, weight, y,
                    residual, residual_out) -> None */
PyObject *rms_forward_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _backward_buffers(type, rows, n, eps, weight_offset, grad_output, x,
                     weight, grad_input, grad_weight, grad_residual_out) -> None */
PyObject *rms_backward_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _advise_huge_pages(address, nbytes) -> None: a hint for a new output's
   memory, as NumPy gives its large arrays */
PyObject *rms_advise_huge_pages(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
