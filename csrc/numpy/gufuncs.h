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

#endif
