/* Includes NumPy's C API the same way in every file of the extension: one
   file (module.c) defines RMS_IMPORTS_NUMPY and imports the API tables. */
#ifndef RMSNORM_NUMPY_NUMPY_API_H
#define RMSNORM_NUMPY_NUMPY_API_H

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
/* The oldest NumPy the extension imports into, whatever NumPy builds it
   (newer headers default to newer targets): pyproject.toml's numpy>=1.23. */
#define NPY_TARGET_VERSION NPY_1_23_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL rmsnorm_ARRAY_API
#define PY_UFUNC_UNIQUE_SYMBOL rmsnorm_UFUNC_API
#ifndef RMS_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#define NO_IMPORT_UFUNC
#endif

#include <Python.h>
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

#endif
