/* The NumPy side: gufunc loops over the C kernels, and their registration. */
#ifndef RMSNORM_NUMPY_GUFUNCS_H
#define RMSNORM_NUMPY_GUFUNCS_H

#include <Python.h>

/* Creates the `forward` and `backward` gufuncs and adds them to `module`.
   Returns 0, or -1 with an exception set. */
int rms_add_gufuncs(PyObject *module);

/* Adds the bfloat16 loops for the type number that ml_dtypes gave
   bfloat16. Returns 0, or -1 with an exception set. */
int rms_register_bfloat16(PyObject *module, int type_num);

/* Sets a MemoryError saying how many bytes of scratch the kernels could not
   have and what for; takes the GIL where the caller does not hold it. */
void rms_raise_no_memory(size_t bytes, const char *what, Py_ssize_t n);

/* What the forward's and the backward's scratch holds, for that message. */
#define RMS_FORWARD_SCRATCH "the weight: a copy of it, or the offset added to it"
#define RMS_BACKWARD_SCRATCH "the weight (a copy, and as doubles) and grad_weight's sum"

/* The (x, weight, eps) dtype names of every loop, in the order NumPy tries
   them: a new reference, or NULL with an exception set. */
PyObject *rms_dtype_pairs(void);

/*
 * rms_norm's way past the ufunc machinery, which costs more than the
 * arithmetic of a decoding step (about 1.3 of 2.3 us at 1x4096): with x a
 * C-contiguous, aligned, native ndarray, weight a 1-D ndarray of its n in
 * the loop's dtype and eps a NumPy scalar of the loop's eps dtype, runs the
 * forward loop on every row and returns y. For anything else it returns
 * None, and the caller uses the gufunc, which takes every case: the same
 * loop either way, so the same bytes.
 */
PyObject *rms_forward_direct(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
